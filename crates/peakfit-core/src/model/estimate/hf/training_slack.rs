//! What a training step reserves beyond its allocated peak: the loss's segments, the layers'
//! stranded blocks, where the optimizer state lands, and a LoRA step's small pool.

use super::block::{Block, Mlp, Pass};
use super::forward::{forward_peak, largest_tensor, stranding_tensor};
use super::replays::{replayed_lora_forward, replayed_training};
use super::training::{Precision, loss_tensor};
use crate::model::estimate::{
    Checkpointing, HF_SLACK_INFERENCE_TENSORS, Inputs, Optimizer, Workload, allocator,
    prefill_replay,
};

/// The loss's 16-bit segments: `lm_head`'s logits (`c·T·V`) and, under Gemma-2's soft-capping,
/// the division's output beside them (`logits / cap`; `tanh` and `* cap` reuse their blocks).
/// Nothing the loss allocates later is as small (its fp32 tensors are `4·T·V`), so backward
/// finds them free and cannot use them. None in fp32, where `logits.float()` is the logits
/// themselves (`ForCausalLMLoss`).
fn logits_segments(block: &Block, tokens: f64, prec: Precision) -> f64 {
    if prec == Precision::Fp32 {
        return 0.0;
    }
    let copies = if block.softcapped_logits() { 2.0 } else { 1.0 };
    copies * prec.c() * tokens * block.vocab
}

/// The blocks a training step's layers strand: `HF_SLACK_INFERENCE_TENSORS` of the forward's
/// stranding tensor ([`stranding_tensor`]: no fp32 score matrix, whose blocks come back whole),
/// or, for LoRA on 16-bit weights, one of each fp32 tensor PEFT's expression makes at the
/// widest adapted linear, `T·out·4` each: `lora_B`'s output (PEFT casts the input to the fp32
/// adapter), its `* scaling`, and the sum with the 16-bit base output, which promotes to fp32
/// before `.to(torch_result_dtype)` (`peft/tuners/lora/layer.py`, `Linear.forward`); each
/// recomputed layer's 16-bit tensors split the previous layer's. The count of three is what the
/// oracle's replay of the H200 rows of Phi-2, Phi-3-mini and Mistral-7B LoRA finds free at the
/// peak (3.0, 3.4 and 3.1 such blocks), not derived: the expression alone has at most two of them
/// alive at once (`lora_B`'s output is freed before the sum is made), so the third comes from
/// blocks the layers' recompute leaves that this count does not follow.
///
/// LoRA under autocast with checkpointing strands more in its forward than a forward's count:
/// each layer's fp32 output, kept as the next layer's checkpoint, splits a block the layer's
/// MLP freed, so the next layer's MLP takes fresh segments, up to a block per layer. Where
/// [`lora_replay`] follows the code ([`replayed_lora_forward`]) its replay of the forward adds
/// what it strands (Qwen3-4B at 8 × 2,048: 4.39 GiB, the oracle's 4.39) to the count. The
/// oracle's walk of those steps makes no large segment in backward past the loss's; the small
/// pool's segments are [`adapter_small_pool_slack`]'s. Without the count the steps read a little
/// under the oracle (Qwen3-4B at 8 × 2,048: 59.00 GiB for 59.26, at 4 × 2,048 37.68 for 37.87;
/// Llama-3.2-1B 8 × 2,048 36.00 for 36.13), from placements of the second step neither
/// follows, so it is kept, on the safe side: with it the whole step reads +0.1 to +2.6 % of
/// what the GPU or the oracle reserved on the thirteen workloads of the test
/// `autocast_loras_checkpointed_layers_strand_what_the_replay_finds`.
///
/// [`lora_replay`]: crate::model::estimate::lora_replay
fn training_stranded(inp: &Inputs, block: &Block, pass: &Pass) -> f64 {
    let layers = HF_SLACK_INFERENCE_TENSORS * stranding_tensor(block, pass);
    if let Some(forward) = replayed_lora_forward(inp, block, pass) {
        return layers + forward;
    }
    if !(inp.workload.is_adapter() && inp.precision() == Precision::Pure16) {
        return layers;
    }
    let gate_up = if block.mlp == Mlp::FusedGated {
        2.0 * block.ffn
    } else {
        block.ffn
    };
    let qkv = if block.fused_qkv() {
        block.q + 2.0 * block.kv
    } else {
        block.q
    };
    layers.max(3.0 * 4.0 * pass.t() * gate_up.max(qkv).max(block.h))
}

/// The largest gradient or optimizer-state tensor a training step's first `optimizer.step()`
/// places after the first: `AdamW._init_group` creates each parameter's `exp_avg` and
/// `exp_avg_sq` (a tensor each) in parameter order, the embedding's first. So the tensors that
/// fill the loss's segments behind it are the layers' matrices (the MLP's `ffn·h`, the
/// attention's projections) and, last, an untied head's `V·h`; an adapter's are `r` by its
/// widest side. Each at the larger of the gradient's and one moment's bytes per element.
/// `grads` and `state` are the step's gradient and optimizer-state bytes
/// (`Inputs::trainable_state`), which the caller already holds.
fn largest_state_tensor(inp: &Inputs, block: &Block, grads: f64, state: f64) -> f64 {
    let layer_matrix = (block.ffn * block.h).max((block.q + 2.0 * block.kv) * block.h);
    let (params, widest) = if inp.workload.is_adapter() {
        let side = block.ffn.max(block.h).max(block.q + 2.0 * block.kv);
        (inp.adapter_params(), inp.lora_rank * side)
    } else if inp.arch.tied_embeddings {
        (inp.params, layer_matrix)
    } else {
        (inp.params, (block.vocab * block.h).max(layer_matrix))
    };
    if params <= 0.0 {
        return 0.0;
    }
    let moments = match inp.optimizer {
        Optimizer::Adam | Optimizer::Adam8bit => 2.0,
        Optimizer::Momentum => 1.0,
        Optimizer::Adafactor => 0.0,
    };
    let grad_bytes = grads / params;
    let moment_bytes = if moments > 0.0 && !inp.optimizer_paged {
        state / params / moments
    } else {
        0.0
    };
    widest * grad_bytes.max(moment_bytes)
}

/// What a training step reserves beyond its allocated peak `allocated`, from the caching
/// allocator's rules applied to the step's largest blocks (the oracle's replay of the measured
/// rows, docs/oracle.md "A training step's segments"):
/// 1. The first step's loss takes a segment per tensor, none fitting another's freed block:
///    the 16-bit logits ([`logits_segments`]), their fp32 copy, `log_softmax`'s output and,
///    in backward, `_log_softmax_backward_data`'s (the NLL gradient takes the copy's block).
///    The logits' segments stay free beside the fp32 ones; the layers strand blocks as a
///    forward does ([`training_stranded`]). The first step holds no optimizer state: its reserve is
///    `allocated − state + logits + stranded`.
/// 2. The first `optimizer.step()` creates the state while the gradients live, each tensor in
///    the smallest free block that holds it (`get_free_block`): first the layers' freed
///    segments (the checkpointed inputs or saved tensors, the head's, one layer's forward and
///    the stranded blocks), then the logits' segments, then the three fp32 `4·T·V` segments;
///    the embedding's and an untied head's gradient and state tensors (`V·h` each), larger
///    than any block the layers free, go straight to the loss's.
///    What the logits' segments hold of it is no longer slack at the later steps' peak. Every
///    fp32 segment that takes part of the state no longer holds a `4·T·V` block, so from the
///    second step the loss takes that many fresh segments (`ceil(spill / 4·T·V)`, at most
///    three; with all three taken, the logits' too), on top of the first step's reserve or of
///    the optimizer step's own peak (weights, gradients, state and foreach AdamW's temporary
///    list), whichever is larger.
/// 3. Under Gemma-2's soft-capping the saved `tanh` output (`c·T·V`) lives through the loss's
///    backward beside the three fp32 tensors. Where the state is more than one of its two logits
///    segments holds, neither is whole at step 2, so its logits split a whole fp32 segment and
///    the loss takes one fresh segment more (still at most three).
///
/// Where [`train_replay`] follows the run ([`replayed_training`]), its replay of the first two
/// steps replaces that count for the `model_type`s whose code it is
/// ([`prefill_replay::follows`]: the replay's large pool matches the oracle's allocator replay
/// of the same steps request for request, its reserve to within the small pool's few 2 MiB
/// segments, and the count misses which segments the first step's state pins), and for
/// Gemma-2's checkpointed layer (`train_replay::gemma2_checkpointed`), in transformers' own loop
/// or its `Trainer`; types that only share the layout, Gemma-2's own layer without
/// checkpointing (whose H200 row reserved 3.7 % over the oracle at 4 × 1,024), Llama's
/// checkpointed layer (a Qwen3-8B row reserved 2.8 % over the oracle), Phi's and GPT-2's, and
/// TRL's runs get the larger of the two.
///
/// [`train_replay`]: crate::model::estimate::train_replay
pub(super) fn training_slack(inp: &Inputs, block: &Block, allocated: f64) -> f64 {
    let large = match replayed_training(inp, block) {
        Some(r) if r.exact => (r.reserved - allocated).max(0.0),
        Some(r) => counted_training_slack(inp, block, allocated).max(r.reserved - allocated),
        None => counted_training_slack(inp, block, allocated),
    };
    large + adapter_small_pool_slack(inp, block)
}

/// One layer's LoRA-adapted linears as (`in`, `out`) with PEFT's `all-linear` targets: the
/// attention's projections (one fused `qkv_proj` or `query_key_value` where the code fuses
/// them) and the MLP's (one fused `gate_up_proj` for Phi-3). Empty for a mixture of experts,
/// whose experts' adapters [`adapter_small_pool_slack`] does not follow.
fn adapted_linears(block: &Block) -> Vec<(f64, f64)> {
    if block.experts_per_token > 0.0 {
        return Vec::new();
    }
    let (h, q, kv, ffn) = (block.h, block.q, block.kv, block.ffn);
    let mut linears = if block.fused_qkv() {
        vec![(h, q + 2.0 * kv), (q, h)]
    } else {
        vec![(h, q), (h, kv), (h, kv), (q, h)]
    };
    linears.extend(match block.mlp {
        Mlp::FusedGated => vec![(h, 2.0 * ffn), (ffn, h)],
        Mlp::Gated => vec![(h, ffn), (h, ffn), (ffn, h)],
        Mlp::Plain => vec![(h, ffn), (ffn, h)],
    });
    linears
}

/// The small pool's segments a LoRA step leaves free at the next step's peak. PEFT keeps the
/// adapters in fp32 (`autocast_adapter_dtype`), so at ordinary ranks their `r·in` and `out·r`
/// matrices, gradients, AdamW moments and foreach's square roots are tensors of 1 MiB or less,
/// which the caching allocator serves from 2 MiB small-pool segments that no large request
/// uses and that are never released (`CUDACachingAllocator.cpp`, `kSmallSize`, `kSmallBuffer`).
/// Each generation comes while the earlier one lives, so each takes segments of its own:
/// backward's gradients (layers in reverse, `lora_B`'s before `lora_A`'s), the first
/// `optimizer.step()`'s moments (`exp_avg` then `exp_avg_sq` per parameter, `_init_group`) and,
/// for foreach AdamW, the list of square roots (`_foreach_sqrt`, freed after the step). At the
/// next step's peak, the loss's backward, only the moments live there; under autocast the
/// adapters' 16-bit casts, which autocast caches through each forward, come first and are
/// freed when the forward's autocast region ends, so the gradients reuse their blocks. The
/// rest of those segments is slack, less the small tensors a step without checkpointing saves
/// there ([`small_saved`]). `adamw` is torch's AdamW as it defaults on CUDA (foreach, with its
/// roots); HF Trainer's own default in transformers 5 is the fused kernel (`adamw_torch_fused`),
/// which a pod states as `optimizer: adamw-fused`. The oracle's walk of Llama-3.1-8B
/// LoRA rank 16 in bf16 at 4 × 2,048: the small pool grows 162 → 326 MiB in backward and to
/// 802 MiB in the optimizer step (gradients 160 MiB, moments 320, roots 160), none of it in
/// the count of the large pool's blocks. Replayed on the allocator's small pool
/// ([`prefill_replay`]'s heap) in that order; tensors over 1 MiB (high ranks on wide layers)
/// go to the large pool and are left out.
fn adapter_small_pool_slack(inp: &Inputs, block: &Block) -> f64 {
    static REPLAYS: prefill_replay::Memo<SmallPoolKey, f64> = std::sync::Mutex::new(Vec::new());
    if inp.workload != Workload::Lora || inp.optimizer != Optimizer::Adam || inp.optimizer_paged {
        return 0.0;
    }
    let key = SmallPoolKey {
        layers: crate::convert::f64_to_usize(block.layers),
        rank: inp.lora_rank.to_bits(),
        linears: adapted_linears(block)
            .into_iter()
            .map(|(i, o)| (i.to_bits(), o.to_bits()))
            .collect(),
        autocast: inp.precision() == Precision::Autocast,
        roots: !inp.optimizer_fused,
    };
    let free = prefill_replay::memoized(&REPLAYS, key.clone(), || small_pool_replay(&key));
    (free - small_saved(inp, block)).max(0.0)
}

/// The small tensors the next step's forward saves for backward without checkpointing, alive
/// at its peak in the gradients' and roots' freed small blocks (already counted as allocated):
/// each adapted linear's `lora_A` output (`T·r`, fp32 on 16-bit weights, the compute width
/// under autocast) and, under autocast, the adapters' 16-bit casts, which backward needs too.
/// With checkpointing the peak, the loss's backward, comes before any layer is recomputed.
fn small_saved(inp: &Inputs, block: &Block) -> f64 {
    if inp.checkpointing != Checkpointing::None {
        return 0.0;
    }
    let prec = inp.precision();
    let width = if prec == Precision::Autocast {
        prec.c()
    } else {
        4.0
    };
    let a_out = width * inp.tokens() * inp.lora_rank;
    let linears = adapted_linears(block);
    let mut saved = 0.0;
    if allocator::small(allocator::block(a_out)) {
        saved += a_out * linears.len() as f64 * block.layers;
    }
    if prec == Precision::Autocast {
        let r = inp.lora_rank;
        let casts: f64 = linears
            .iter()
            .flat_map(|&(i, o)| [2.0 * r * i, 2.0 * o * r])
            .filter(|&b| allocator::small(allocator::block(b)))
            .sum();
        saved += casts * block.layers;
    }
    saved
}

/// The shape [`adapter_small_pool_slack`] replays, as its memo's key.
#[derive(Clone, Debug, PartialEq)]
struct SmallPoolKey {
    layers: usize,
    /// `f64::to_bits` of the rank, and of each adapted linear's `in` and `out`.
    rank: u64,
    linears: Vec<(u64, u64)>,
    autocast: bool,
    /// Foreach AdamW's square roots (not the fused kernel).
    roots: bool,
}

fn small_pool_replay(key: &SmallPoolKey) -> f64 {
    let r = f64::from_bits(key.rank);
    let layers = key.layers;
    let linears: Vec<(f64, f64)> = key
        .linears
        .iter()
        .map(|&(i, o)| (f64::from_bits(i), f64::from_bits(o)))
        .collect();
    // Every adapter matrix in `parameters()` order, elements: `lora_A` (`r·in`), `lora_B`
    // (`out·r`).
    let params: Vec<f64> = (0..layers)
        .flat_map(|_| linears.iter().flat_map(|&(i, o)| [r * i, o * r]))
        .collect();
    let small = |bytes: f64| allocator::small(allocator::block(bytes));
    let mut heap = prefill_replay::Heap::<prefill_replay::SizeClasses>::default();
    let mut live = 0.0;
    if key.autocast {
        let casts: Vec<_> = params
            .iter()
            .filter(|&&n| small(2.0 * n))
            .map(|&n| heap.malloc(2.0 * n))
            .collect();
        for c in casts {
            heap.free(c);
        }
    }
    let grads: Vec<_> = params
        .iter()
        .rev()
        .filter(|&&n| small(4.0 * n))
        .map(|&n| heap.malloc(4.0 * n))
        .collect();
    for &n in params.iter().filter(|&&n| small(4.0 * n)) {
        heap.malloc(4.0 * n);
        heap.malloc(4.0 * n);
        live += 8.0 * n;
    }
    if key.roots {
        let roots: Vec<_> = params
            .iter()
            .filter(|&&n| small(4.0 * n))
            .map(|&n| heap.malloc(4.0 * n))
            .collect();
        for h in roots.into_iter().rev() {
            heap.free(h);
        }
    }
    for g in grads {
        heap.free(g);
    }
    (heap.reserved() - live).max(0.0)
}

/// [`training_slack`]'s count from the step's largest blocks, for every training step the
/// replay does not follow.
fn counted_training_slack(inp: &Inputs, block: &Block, allocated: f64) -> f64 {
    let prec = inp.precision();
    let pass = inp.pass(inp.batch, inp.context);
    let tokens = inp.tokens();
    let fp32 = loss_tensor(block, tokens);
    let logits = logits_segments(block, tokens, prec);
    let stranded = training_stranded(inp, block, &pass);
    let (grads, _, state) = inp.trainable_state();
    // A paged optimizer's state lives in unified memory outside the caching allocator
    // (`cudaMallocManaged`): it is not in `allocated`, takes no freed block and no segment.
    let state = if inp.optimizer_paged { 0.0 } else { state };
    let first = allocated - state + logits + stranded;
    let saved = inp.saved(block, &pass);
    let room = saved.kept + saved.head + forward_peak(block, &pass) + stranded;
    // The vocabulary matrices' gradients and state, each tensor larger than any block the
    // layers free, fit nowhere but the loss's segments.
    let vocab_gradient = block.vocab * block.h * grads / inp.params;
    let vocab_share = if inp.workload.is_adapter() || vocab_gradient <= largest_tensor(block, &pass)
    {
        0.0
    } else {
        (grads + state) * inp.embedding_params() / inp.params
    };
    let spill = (grads + state - room).max(vocab_share);
    // Fp32 segments the state takes, or, where the first step's reserve is short of the later
    // steps' peak, the loss's tensors (the last it allocates) take fresh in `4·T·V` blocks.
    // The state comes tensor by tensor, each into the smallest free block that holds it
    // (`get_free_block`): a segment the next tensor does not fit has less than that tensor
    // left free, so each segment holds at least its size less the largest such tensor
    // ([`largest_state_tensor`]). Counting at that fill, not a perfect one, keeps the count
    // from falling a whole segment short where the state nearly fills the segments.
    let one = largest_state_tensor(inp, block, grads, state);
    let displaced = if spill > (logits - one).max(0.0) {
        let held = fp32 - one;
        if held <= 0.0 {
            3.0
        } else {
            ((spill - (logits - one).max(0.0)) / held).ceil()
        }
    } else {
        0.0
    };
    let short = ((allocated + stranded - first) / fp32).ceil().max(0.0);
    let pinned = displaced.max(short).min(3.0);
    // Gemma-2's soft-capped logits save `tanh`'s output (`c·T·V`, one of its two logits segments)
    // for backward, where it is alive beside the loss's three fp32 tensors (`log_softmax`'s output,
    // the NLL gradient and `_log_softmax_backward_data`'s). Where the first step's state is more
    // than one logits segment holds, both hold some, and step 2's forward finds neither whole: its
    // two 16-bit logits split a whole fp32 segment, and the saved one keeps it through backward, so
    // the loss's fp32 tensors take one more fresh segment, whether the others went to the state or
    // to a first step's reserve short of the later peak (`short`). Never past three: with every
    // fp32 segment taken the logits take fresh ones of their own (`logits_again`) and this block
    // goes with them. Other decoders' 16-bit logits are freed before backward, so the block they
    // borrow in forward is the NLL gradient's again.
    // One of Gemma-2's two logits segments ([`logits_segments`]): `lm_head`'s output or
    // `logits / cap`, each `c·T·V`.
    let one_logits_segment = prec.c() * tokens * block.vocab;
    let saved_logits_moved = if block.softcapped_logits()
        && spill > (one_logits_segment - one).max(0.0)
        && pinned < 3.0
        && logits > 0.0
    {
        1.0
    } else {
        0.0
    };
    let taken = (pinned + saved_logits_moved).min(3.0);
    let reserved = if taken > 0.0 {
        let temporary = if inp.optimizer_paged {
            0.0
        } else {
            inp.optimizer_step_temporary()
        };
        let step = inp.weights() + grads + state + temporary;
        let logits_again = if pinned >= 3.0 { logits } else { 0.0 };
        (first.max(step) + taken * fp32 + logits_again).max(allocated + stranded)
    } else {
        // The state fits before the fp32 segments: the logits' segments hold the part of it
        // the layers' blocks did not, and stay free for the rest.
        first.max(allocated + logits + stranded - spill.max(0.0))
    };
    (reserved - allocated).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{GIB, llama_1b};
    use super::*;
    use crate::model::estimate::ModelType;

    /// Gemma-2-2B's full fine-tunes: where step 1's state is more than one logits segment holds,
    /// step 2's `tanh` output (saved for backward) splits a whole fp32 segment and the loss takes
    /// one fresh segment more. One H200 reserved 53.51–53.57 GiB at 4 × 2,048, 8 × 1,024 and
    /// 2 × 4,096 checkpointed (the oracle's replay the same to the byte; the history in
    /// `tests/data/h200d/traces`), 86.36 at 2 × 8,192 checkpointed and 51.47 at 4 × 1,024
    /// without checkpointing; without the moved block the count reads 49.25, 78.09 and 47.69.
    /// Llama-3.2-1B's logits, freed before backward, borrow no segment: its 8 × 2,048 keeps one
    /// fresh segment per pinned one.
    /// A model's `config.json` from `tests/data/oracle-configs` (public configs the oracle and
    /// the real-GPU rows ran).
    fn oracle_config(name: &str) -> String {
        let path = format!(
            "{}/../../tests/data/oracle-configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The reserved GiB `estimate` gives a model's `config.json` with `engine: hf` and
    /// `annotations` (without the `peakfit.io/` prefix) on top.
    fn hf_reserved_gib(json: &str, annotations: &[(&str, &str)]) -> f64 {
        let spec = hf_spec(json, annotations);
        let e = crate::model::estimate(&spec, crate::model::estimate::Defaults::GPU_TOTAL);
        e.reserved_bytes as f64 / GIB
    }

    /// The pod spec of a model's `config.json` (`--model-config`'s annotations) with
    /// `engine: hf` and `annotations` on top.
    fn hf_spec(json: &str, annotations: &[(&str, &str)]) -> crate::model::Spec {
        let mut map: std::collections::BTreeMap<String, String> =
            crate::model::hf_config::annotations(json)
                .unwrap()
                .annotations
                .into_iter()
                .map(|(k, v)| (format!("peakfit.io/{k}"), v))
                .collect();
        for (k, v) in [("engine", "hf")].iter().chain(annotations) {
            map.insert(format!("peakfit.io/{k}"), (*v).to_string());
        }
        crate::model::Spec::parse(&map).unwrap()
    }

    /// Gemma-2's full fine-tune without checkpointing reaches `train_replay`'s Gemma-2 layer,
    /// as a floor: the oracle reserves 36.86 GiB at 1 × 2,048 (bf16, foreach), which the count
    /// alone read 12.8 % low (32.16).
    #[test]
    fn gemma2s_fine_tune_without_checkpointing_is_floored_by_its_replay() {
        let gemma = include_str!("../../../../../../tests/data/oracle-configs/gemma-2-2b.json");
        let bf16 = hf_reserved_gib(
            gemma,
            &[
                ("workload", "training"),
                ("dtype", "bf16"),
                ("optimizer", "adamw"),
                ("batch", "1"),
                ("context-tokens", "2048"),
                ("gradient-checkpointing", "none"),
            ],
        );
        let oracle = 39_577_452_544.0 / GIB;
        assert!(
            (oracle - 0.01..oracle * 1.05).contains(&bf16),
            "{bf16:.2} GiB"
        );
    }

    /// Phi-2's full fine-tune without checkpointing reaches `train_replay`'s Phi layer, as a
    /// floor: the oracle reserves 29.45 GiB at 2 × 1,024 and 40.91 at 4 × 1,024 in bf16, 59.77
    /// at 2 × 1,024 under autocast (foreach), which the count alone read 7.5 %, 11.4 % and
    /// 11.1 % low (27.25, 36.25, 53.13). The replay keeps CUDA's one-byte dropout masks where
    /// the oracle's CPU path keeps two-byte noise; at these three shapes that reads under the
    /// oracle by the masks' byte a token per hidden unit (two dropouts a layer: 0.31 GiB at
    /// 2 × 1,024) and the small pool's few segments the replay leaves out. (Elsewhere the masks'
    /// width moves placements further: 1.96 GiB under at 3 × 1,024 under autocast,
    /// `docs/oracle.md`.) Never under the count, which it floors.
    #[test]
    fn phi2s_fine_tune_without_checkpointing_is_floored_by_its_replay() {
        let phi = include_str!("../../../../../../tests/data/oracle-configs/phi-2.json");
        let reserved = |batch: &str, dtype: &str| {
            hf_reserved_gib(
                phi,
                &[
                    ("workload", "training"),
                    ("dtype", dtype),
                    ("optimizer", "adamw"),
                    ("batch", batch),
                    ("context-tokens", "1024"),
                    ("gradient-checkpointing", "none"),
                ],
            )
        };
        for (batch, dtype, oracle) in [
            ("2", "bf16", 31_625_052_160.0),
            ("4", "bf16", 43_922_751_488.0),
            ("2", "fp16-amp", 64_181_239_808.0),
        ] {
            let oracle = oracle / GIB;
            let masks =
                32.0 * 2.0 * batch.parse::<f64>().unwrap() * 1024.0 * 2560.0 / GIB + 16.0 / 1024.0;
            let got = reserved(batch, dtype);
            assert!(
                (oracle - masks..oracle * 1.05).contains(&got),
                "{batch} {dtype}: {got:.2} GiB"
            );
        }
    }

    /// GPT-2's full fine-tune without checkpointing in bf16 reaches `train_replay`'s GPT-2
    /// layer, as a floor: the oracle reserves 11.47 GiB at 8 × 1,024 and 22.66 at 16 × 1,024
    /// (foreach), which the count alone read 12.1 % and 12.3 % low (10.08, 19.87). As for
    /// Phi-2, CUDA's one-byte dropout masks (two a layer, the embedding's one more) keep the
    /// replay a little under the oracle's two-byte noise. The config's `resid_pdrop` 0
    /// (`gpt2-no-dropout.json`) makes no masks: the oracle's 22.07 GiB at 16 × 1,024. A `gptj` config (the same
    /// [`ModelType::Gpt2`] family, its own modeling code) gets no replay.
    ///
    /// [`ModelType::Gpt2`]: crate::model::ModelType::Gpt2
    #[test]
    fn gpt2s_fine_tune_without_checkpointing_is_floored_by_its_replay() {
        let gpt2 = include_str!("../../../../../../tests/data/oracle-configs/gpt2.json");
        let reserved = |json: &str, batch: &str| {
            hf_reserved_gib(
                json,
                &[
                    ("workload", "training"),
                    ("dtype", "bf16"),
                    ("optimizer", "adamw"),
                    ("batch", batch),
                    ("context-tokens", "1024"),
                    ("gradient-checkpointing", "none"),
                ],
            )
        };
        for (batch, oracle) in [("8", 12_318_670_848.0), ("16", 24_326_963_200.0)] {
            let oracle = oracle / GIB;
            let tokens = batch.parse::<f64>().unwrap() * 1024.0;
            let masks = (2.0 * 12.0 + 1.0) * tokens * 768.0 / GIB + 8.0 / 1024.0;
            let bf16 = reserved(gpt2, batch);
            assert!(
                (oracle - masks..oracle * 1.05).contains(&bf16),
                "{batch}: {bf16:.2} GiB"
            );
        }
        // Without dropout the replay reserves what the oracle does, less the small pool.
        let quiet =
            include_str!("../../../../../../tests/data/oracle-configs/gpt2-no-dropout.json");
        let oracle = 23_697_817_600.0 / GIB;
        let got = reserved(quiet, "16");
        assert!(
            (oracle - 8.0 / 1024.0..=oracle).contains(&got),
            "{got:.3} GiB"
        );
        // GPT-J's `model_type` (the same family, its own code) is not replayed; GPT-2's is.
        let gptj = gpt2.replace("\"model_type\": \"gpt2\"", "\"model_type\": \"gptj\"");
        assert_ne!(gptj, gpt2);
        let replayed = |json: &str| {
            let spec = hf_spec(
                json,
                &[
                    ("workload", "training"),
                    ("dtype", "bf16"),
                    ("batch", "16"),
                    ("context-tokens", "1024"),
                    ("gradient-checkpointing", "none"),
                ],
            );
            let inp = crate::model::estimate::resolve(&spec, &mut Vec::new());
            replayed_training(&inp, &inp.block()).is_some()
        };
        assert!(replayed(gpt2));
        assert!(!replayed(&gptj));
    }

    /// Gemma-2's checkpointed full fine-tune in 16 bits is replayed and replaces the count
    /// (`train_replay::gemma2_checkpointed`): not once the context reaches the sliding window
    /// (the mask it then makes), not under autocast, not for LoRA; under TRL it only floors it.
    #[test]
    fn gemma2s_checkpointed_fine_tune_is_replayed_inside_its_window() {
        let gemma = oracle_config("gemma-2-2b");
        let replay_in = |engine: &str, workload: &str, dtype: &str, batch: &str, context: &str| {
            let spec = hf_spec(
                &gemma,
                &[
                    ("engine", engine),
                    ("workload", workload),
                    ("dtype", dtype),
                    ("batch", batch),
                    ("context-tokens", context),
                    ("gradient-checkpointing", "full"),
                ],
            );
            let inp = crate::model::estimate::resolve(&spec, &mut Vec::new());
            replayed_training(&inp, &inp.block())
        };
        let replay = |workload: &str, dtype: &str, batch: &str, context: &str| {
            replay_in("hf", workload, dtype, batch, context)
        };
        let r = replay("training", "bf16", "4", "2048").expect("replayed");
        assert!(r.exact);
        let trl = replay_in("trl", "training", "bf16", "4", "2048").expect("replayed");
        assert!(!trl.exact);
        assert!(replay("training", "bf16", "2", "4096").is_none());
        assert!(replay("training", "fp16-amp", "4", "2048").is_none());
        assert!(replay("lora", "bf16", "4", "2048").is_none());
    }

    #[test]
    fn gemma2s_saved_logits_leave_the_state_pinned_segments_for_an_fp32_one() {
        fn reserved_gib(json: &str, shape: &[(&str, &str)]) -> f64 {
            let full: Vec<(&str, &str)> = [
                ("workload", "training"),
                ("dtype", "bf16"),
                ("optimizer", "adamw"),
            ]
            .iter()
            .chain(shape)
            .copied()
            .collect();
            hf_reserved_gib(json, &full)
        }
        let gemma = include_str!("../../../../../../tests/data/oracle-configs/gemma-2-2b.json");
        // The count where the context reaches the window (the sliding-window mask, which no
        // replay follows) and the floor under the replay without checkpointing.
        for (batch, context, checkpointing, measured) in [
            ("2", "4096", "full", 53.51),
            ("2", "8192", "full", 86.36),
            ("4", "1024", "none", 51.47),
        ] {
            let shape = [
                ("batch", batch),
                ("context-tokens", context),
                ("gradient-checkpointing", checkpointing),
            ];
            let r = reserved_gib(gemma, &shape);
            assert!(
                (measured..measured * 1.1).contains(&r),
                "{shape:?}: {r:.2} GiB, measured {measured}"
            );
        }
        // Checkpointed inside the window the replay answers
        // (`train_replay::gemma2_checkpointed`): what the H200 reserved, less the small pool's
        // few 2 MiB segments it leaves out.
        for (batch, context, measured) in [("4", "2048", 53.57), ("8", "1024", 53.57)] {
            let shape = [
                ("batch", batch),
                ("context-tokens", context),
                ("gradient-checkpointing", "full"),
            ];
            let r = reserved_gib(gemma, &shape);
            assert!(
                (measured - 0.02..=measured).contains(&r),
                "{shape:?}: {r:.3} GiB, measured {measured}"
            );
        }
        let llama = include_str!("../../../../../../tests/data/oracle-configs/llama-3.2-1b.json");
        let shape = [
            ("batch", "8"),
            ("context-tokens", "2048"),
            ("gradient-checkpointing", "full"),
        ];
        let r = reserved_gib(llama, &shape);
        // Measured 39.75 GiB (`tests/data/h200c`, foreach); a moved block would read 47.1.
        assert!(
            (39.0..40.0).contains(&r),
            "Llama-3.2-1B 8 x 2,048: {r:.2} GiB"
        );
    }

    /// A LoRA step's small pool: the adapters' gradients, AdamW moments and foreach's square
    /// roots take 2 MiB segments of their own, and at the next step's peak only the moments
    /// live there. The oracle's allocator walks (`tools/oracle/train_events.py --grid --steps 2`,
    /// the small pool's segments from the weights to the end of step 2, less the moments'
    /// bytes): Llama-3.1-8B rank 16 in bf16 at 4 × 2,048, 802 − 162 MiB of segments, 320 MiB of
    /// moments; Qwen3-4B rank 16 under autocast at 8 × 2,048, 644 − 128 MiB, 252 MiB of moments
    /// (its 16-bit casts come first and are freed before the gradients, which reuse them). The
    /// step's own small tensors (the rotary tables at 2,048 positions, the norms' per-row
    /// scalars) take a few more segments, which the term leaves out: 8 MiB of Qwen3-4B's.
    /// Fused AdamW makes no roots; SGD and other optimizers are not followed (nothing counted).
    #[test]
    fn lora_adapters_small_pool_segments_outlive_their_gradients_and_roots() {
        fn slack_mib(json: &str, extra: &[(&str, &str)]) -> f64 {
            let mut pairs: Vec<(String, String)> = crate::model::hf_config::annotations(json)
                .unwrap()
                .annotations
                .into_iter()
                .collect();
            pairs.extend(
                [
                    ("engine", "hf"),
                    ("workload", "lora"),
                    ("gradient-checkpointing", "full"),
                    ("lora-rank", "16"),
                    ("batch", "4"),
                    ("context-tokens", "2048"),
                ]
                .iter()
                .chain(extra)
                .map(|(k, v)| ((*k).to_string(), (*v).to_string())),
            );
            // A later pair of the same key replaces an earlier one.
            let pairs: std::collections::BTreeMap<&str, &str> = pairs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let pairs: Vec<(&str, &str)> = pairs.into_iter().collect();
            let inp = crate::model::estimate::resolve(
                &crate::model::estimate::testing::spec(&pairs),
                &mut Vec::new(),
            );
            adapter_small_pool_slack(&inp, &inp.block()) / 1_048_576.0
        }
        let llama = &oracle_config("llama-3.1-8b");
        let qwen3 = &oracle_config("qwen3-4b");
        let bf16 = slack_mib(llama, &[("dtype", "bf16"), ("optimizer", "adamw")]);
        assert!((bf16 - (802.0 - 162.0 - 320.0)).abs() <= 4.0, "{bf16} MiB");
        let amp = slack_mib(qwen3, &[("dtype", "fp16-amp"), ("optimizer", "adamw")]);
        assert!((amp - (644.0 - 128.0 - 252.0)).abs() <= 8.0, "{amp} MiB");
        // Fused: the gradients' segments only.
        let fused = slack_mib(llama, &[("dtype", "bf16"), ("optimizer", "adamw-fused")]);
        assert!((fused - 160.0).abs() <= 4.0, "{fused} MiB");
        let sgd = slack_mib(llama, &[("dtype", "bf16"), ("optimizer", "sgd")]);
        assert!(sgd.abs() < 1e-9, "{sgd} MiB");
        // Without checkpointing each adapted linear's fp32 `lora_A` output (4 · 8,192 · 16 B,
        // small) is saved into those blocks: 7 linears × 32 layers × 0.5 MiB fewer.
        let saved = slack_mib(
            llama,
            &[
                ("dtype", "bf16"),
                ("optimizer", "adamw"),
                ("gradient-checkpointing", "none"),
            ],
        );
        assert!((bf16 - saved - 112.0).abs() < 1e-6, "{bf16} {saved} MiB");
    }

    /// LoRA under autocast with checkpointing: the forward's layers strand what
    /// [`lora_replay`] finds (each layer's fp32 output kept in a block its MLP freed). Reserved
    /// peaks measured on an H200 (Qwen3-4B `tests/data/h200d`, Mistral-7B v0.3 rank 32
    /// `h200d`, Qwen2.5-7B `h200b`) and the oracle's allocator replays of ten more
    /// (`scripts/oracle case ... --workload lora --dtype fp16-amp --gradient-checkpointing
    /// full`, `peak_reserved_bytes`; the last six were run after the replay was written, to
    /// judge it): each within [measured, +3 %), with the small pool's segments
    /// ([`adapter_small_pool_slack`]) and the layers' count on top. Without the replay the count
    /// read the first seven low (the GPU rows by 3.6–7.3 %, Qwen3-4B 8 × 2,048 at 54.95 GiB for
    /// the GPU's 59.26; the oracle's four by at least 2.4 %).
    #[test]
    fn autocast_loras_checkpointed_layers_strand_what_the_replay_finds() {
        // (config, batch, context, rank, reserved GiB: the GPU's for the first three, else the
        // oracle's replay)
        for (name, batch, context, rank, measured) in [
            ("qwen3-4b", "8", "2048", "16", 59.26),
            ("mistral-7b-v0.3", "8", "1024", "32", 38.45),
            ("qwen2.5-7b", "2", "4096", "16", 51.73),
            ("qwen3-4b", "4", "2048", "16", 37.87),
            ("qwen2.5-1.5b", "8", "2048", "16", 44.27),
            ("llama-3.2-1b", "8", "2048", "16", 36.13),
            ("llama-3.2-3b", "4", "4096", "16", 49.43),
            ("qwen3-8b", "2", "4096", "64", 56.33),
            ("llama-3.1-8b", "1", "16384", "16", 73.60),
            ("qwen2.5-3b", "4", "2048", "32", 32.87),
            ("mistral-nemo-12b", "2", "2048", "16", 60.48),
            ("smollm2-1.7b", "16", "1024", "8", 21.89),
            ("qwen2.5-14b", "1", "4096", "16", 71.83),
        ] {
            let r = hf_reserved_gib(
                &oracle_config(name),
                &[
                    ("workload", "lora"),
                    ("dtype", "fp16-amp"),
                    ("optimizer", "adamw"),
                    ("gradient-checkpointing", "full"),
                    ("batch", batch),
                    ("context-tokens", context),
                    ("lora-rank", rank),
                ],
            );
            assert!(
                (measured..measured * 1.03).contains(&r),
                "{name} {batch} x {context} r{rank}: {r:.2} GiB, measured {measured}"
            );
        }
    }

    /// Qwen2.5-1.5B full fine-tunes in bf16 without checkpointing, AdamW, with `extra`.
    fn qwen25_15b_training(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("model-type", "qwen2"),
                ("layers", "28"),
                ("hidden-size", "1536"),
                ("attention-heads", "12"),
                ("kv-heads", "2"),
                ("head-dim", "128"),
                ("intermediate-size", "8960"),
                ("vocab-size", "151936"),
                ("tied-embeddings", "true"),
                ("engine", "hf"),
                ("workload", "training"),
                ("dtype", "bf16"),
                ("gradient-checkpointing", "none"),
                ("flash-attention", "true"),
                ("context-tokens", "1024"),
            ],
            extra,
        )
    }

    /// A full fine-tune without checkpointing reserves what [`train_replay`] replays of its
    /// first two steps: the first step's state pins the layers' activation blocks it lands in,
    /// and the second step's forward takes fresh segments for them. One H200 reserved 18.92,
    /// 22.94 and 30.68 GiB at 1, 2 and 4 × 1,024 under foreach AdamW (`tests/data/h200c`);
    /// the segment count alone read 16.40, 18.43 and 27.23; the replay reads 18.92, 22.45 and
    /// 29.51 (the oracle's allocator replay of the same steps, less its small pool). With the fused
    /// kernel (no `_foreach_sqrt` list) 2 × 1,024 reserved 20.58; the replay reads 20.09.
    #[test]
    fn a_full_fine_tune_without_checkpointing_reserves_what_its_two_steps_replay() {
        for (batch, optimizer, replayed) in [
            ("1", "adamw", 20_313_014_272_u64),
            ("2", "adamw", 24_100_470_784),
            ("4", "adamw", 31_690_063_872),
            ("2", "adamw-fused", 21_567_111_168),
        ] {
            let e = qwen25_15b_training(&[("batch", batch), ("optimizer", optimizer)]);
            assert_eq!(
                e.reserved_bytes,
                replayed.max(e.allocated_bytes),
                "{batch} {optimizer}"
            );
        }
    }

    /// A training row's spec, its resolved inputs and the estimate's allocated peak and slack.
    fn training_case(pairs: &[(&str, &str)]) -> (Inputs, f64, f64) {
        use crate::model::estimate::testing::{part, spec};
        let spec = spec(pairs);
        let e =
            crate::model::estimate::estimate(&spec, crate::model::estimate::Defaults::GPU_TOTAL);
        let allocated: f64 = e
            .components
            .iter()
            .filter(|c| c.counter == crate::model::estimate::Counter::Allocated)
            .map(|c| c.bytes as f64)
            .sum();
        let inp = crate::model::estimate::resolve(&spec, &mut Vec::new());
        (inp, allocated, part(&e, "allocator-slack"))
    }

    /// Llama-3.2-1B as `tests/data/h200b`'s config builds it, fully fine-tuned in bf16 with
    /// checkpointing and foreach AdamW, as `measure.py` runs it.
    fn llama32_1b_training(batch: &'static str) -> Vec<(&'static str, &'static str)> {
        vec![
            ("layers", "16"),
            ("hidden-size", "2048"),
            ("attention-heads", "32"),
            ("kv-heads", "8"),
            ("head-dim", "64"),
            ("intermediate-size", "8192"),
            ("vocab-size", "128256"),
            ("tied-embeddings", "true"),
            ("params", "1235814400"),
            ("dtype", "bf16"),
            ("model-type", "llama"),
            ("engine", "hf"),
            ("workload", "training"),
            ("optimizer", "adamw"),
            ("gradient-checkpointing", "full"),
            ("batch", batch),
            ("context-tokens", "2048"),
        ]
    }

    /// A paged optimizer's state is in unified memory (`cudaMallocManaged`), outside the
    /// caching allocator: it takes no freed block and displaces no loss segment, so the step's
    /// slack is a stateless optimizer's. Subtracting it from an allocated peak that never held
    /// it read 1.60 GiB for Llama-3.2-1B at 4 × 4,864 where the stateless step leaves 5.24.
    #[test]
    fn a_paged_optimizers_state_takes_no_segment() {
        let with = |optimizer: &'static str| {
            let mut pairs = llama32_1b_training("4");
            pairs.extend([("optimizer", optimizer), ("context-tokens", "4864")]);
            training_case(&pairs).2
        };
        let paged = with("paged-adamw");
        assert!((paged - with("adafactor")).abs() < 1.0, "{paged}");
        assert!(paged > 5.0 * 1_073_741_824.0, "{paged}");
    }

    /// `AdamW._init_group` makes each parameter's two moments in parameter order, the
    /// embedding's first: behind it the loss's segments are filled by the layers' matrices
    /// (tied embeddings) or, last, an untied head's `V·h`, whose size a segment may be left
    /// short by. An adapter's tensors are its rank by its widest side.
    #[test]
    fn the_state_tensors_that_fill_the_loss_segments_are_sized_by_parameter_order() {
        let case = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = llama32_1b_training("4");
            pairs.extend(extra);
            let (inp, _, _) = training_case(&pairs);
            let (grads, _, state) = inp.trainable_state();
            largest_state_tensor(&inp, &inp.block(), grads, state)
        };
        // bf16 AdamW: 2 bytes per gradient and per moment.
        assert!((case(&[]) - 2.0 * 8192.0 * 2048.0).abs() < 1.0);
        assert!((case(&[("tied-embeddings", "false")]) - 2.0 * 128_256.0 * 2048.0).abs() < 1.0);
        // LoRA: fp32 adapters, rank 16 by the MLP's 8,192.
        assert!(
            (case(&[("workload", "lora"), ("lora-rank", "16")]) - 4.0 * 16.0 * 8192.0).abs() < 1.0
        );
    }

    /// The first step's loss leaves `lm_head`'s 16-bit logits segment free beside its fp32
    /// segments, and LoRA's state is too small to displace anything: a LoRA step's slack is that
    /// segment plus the layers' stranded blocks, here one of each of the three fp32 tensors
    /// PEFT's expression makes at `gate_proj`/`up_proj` (`T·I·4`), larger than any 16-bit
    /// activation, plus the small pool's segments the adapters' gradients and roots leave
    /// ([`adapter_small_pool_slack`], tested on its own).
    #[test]
    fn a_lora_step_strands_the_logits_segment_and_the_adapters_fp32_outputs() {
        let mut pairs = llama32_1b_training("4");
        pairs.extend([("workload", "lora"), ("lora-rank", "16")]);
        let (inp, _, slack) = training_case(&pairs);
        let t = 4.0 * 2048.0;
        let logits = 2.0 * t * 128_256.0;
        let adapter_output = 4.0 * t * 8192.0;
        let block = inp.block();
        let small_pool = adapter_small_pool_slack(&inp, &block);
        assert!(small_pool > 0.0);
        assert!(
            (slack - (logits + 3.0 * adapter_output + small_pool)).abs() < 2.0,
            "{slack}"
        );
        let pass = inp.pass(inp.batch, inp.context);
        assert!((training_stranded(&inp, &block, &pass) - 3.0 * adapter_output).abs() < 1.0);
    }

    /// h200-llama32-1b-ft-bf16-b4-2k-gc: the first `optimizer.step()` puts 4.6 GiB of AdamW
    /// state beside 2.3 GiB of gradients; what the layers' freed blocks and the logits'
    /// segment do not hold breaks one fp32 `4·T·V` segment (4,008 MiB), which the second step's
    /// loss takes fresh (the oracle's replay: one 4,008 MiB segment at step 2, reserved 21.045
    /// GiB, measured 21.045).
    #[test]
    fn the_first_optimizer_step_costs_the_loss_one_fresh_fp32_segment() {
        let (inp, allocated, replayed) = training_case(&llama32_1b_training("4"));
        // The estimate follows the replay now (`train_replay::llama_checkpointed`): the
        // oracle's 22,596,812,800 bytes, less at most its 4 MiB small pool; the count below is
        // 215 MiB under it.
        let short = 22_596_812_800.0 - (allocated + replayed);
        assert!((0.0..=4_194_304.0).contains(&short), "{short}");
        let slack = counted_training_slack(&inp, &inp.block(), allocated);
        let (_, _, state) = inp.trainable_state();
        let t = 4.0 * 2048.0;
        let fp32 = 4.0 * t * 128_256.0;
        let logits = 2.0 * t * 128_256.0;
        let stranded = HF_SLACK_INFERENCE_TENSORS * 2.0 * t * 8192.0;
        let first = allocated - state + logits + stranded;
        assert!(
            (allocated + slack - (first + fp32)).abs() < 2.0,
            "{} {}",
            allocated + slack,
            first + fp32
        );
    }

    /// Llama-3.2-3B at 4 × 2k: 12 GiB of state and 6 GiB of gradients break all three fp32
    /// segments, so the second step's loss takes all three and its logits' segment fresh, on
    /// top of the optimizer step's own peak (weights, gradients, state and foreach AdamW's
    /// `_foreach_sqrt` list): the replay's step 2 makes 2,004 + 3 × 4,008 MiB.
    #[test]
    fn a_state_past_every_fp32_segment_takes_the_whole_loss_again() {
        let pairs: Vec<(&str, &str)> = vec![
            ("layers", "28"),
            ("hidden-size", "3072"),
            ("attention-heads", "24"),
            ("kv-heads", "8"),
            ("head-dim", "128"),
            ("intermediate-size", "8192"),
            ("vocab-size", "128256"),
            ("tied-embeddings", "true"),
            ("params", "3212749824"),
            ("dtype", "bf16"),
            ("model-type", "llama"),
            ("engine", "hf"),
            ("workload", "training"),
            ("optimizer", "adamw"),
            ("gradient-checkpointing", "full"),
            ("batch", "4"),
            ("context-tokens", "2048"),
        ];
        let (inp, allocated, _) = training_case(&pairs);
        let slack = counted_training_slack(&inp, &inp.block(), allocated);
        let (grads, _, state) = inp.trainable_state();
        let tv = 4.0 * 2048.0 * 128_256.0;
        let step = inp.weights() + grads + state + state / 2.0;
        assert!(
            (allocated + slack - (step + 12.0 * tv + 2.0 * tv)).abs() < 2.0,
            "{} {}",
            allocated + slack,
            step + 14.0 * tv
        );
    }

    /// Gemma-2's soft-capped logits leave two 16-bit segments, the logits and `logits / cap`;
    /// in fp32 `logits.float()` is the logits themselves and leaves none.
    #[test]
    fn the_logits_segments_follow_the_soft_cap_and_the_precision() {
        let mut gemma = llama_1b();
        gemma.family = ModelType::Gemma2;
        let one = 2.0 * 100.0 * 128_256.0;
        assert!((logits_segments(&llama_1b(), 100.0, Precision::Pure16) - one).abs() < 1.0);
        assert!((logits_segments(&gemma, 100.0, Precision::Autocast) - 2.0 * one).abs() < 1.0);
        assert!(logits_segments(&llama_1b(), 100.0, Precision::Fp32).abs() < 1.0);
    }
}
