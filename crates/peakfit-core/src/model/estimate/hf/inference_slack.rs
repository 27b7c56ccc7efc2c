//! The caching allocator's slack under HF's modules ([`slack`]): a decoder's `generate` (its
//! replay, or the stranded tensors and the decode's fresh segments) and an encoder's forward;
//! a training step and an encoder-decoder's `generate` are counted by their own modules.

use super::block::{Block, Mlp, Pass};
use super::forward::{decode_step, forward_peak, largest_tensor, stranding_tensor};
use super::replays::replayed_decoder;
use super::seq2seq::seq2seq_slack;
use super::training_slack::training_slack;
use crate::model::estimate::{HF_SLACK_INFERENCE_TENSORS, Inputs, Kind, allocator, prefill_replay};

/// The caching allocator's slack under transformers' own modules: for the decoders
/// [`prefill_replay`] follows, what its replay of the run leaves (reserved − the allocated
/// peak, plus the decode's fresh segments); a training step's segments ([`training_slack`]);
/// elsewhere `HF_SLACK_INFERENCE_TENSORS` stranded tensors and the decode terms. `allocated` is
/// the estimate's allocated peak.
pub(in crate::model::estimate) fn slack(inp: &Inputs, allocated: f64) -> f64 {
    let block = inp.block();
    if inp.workload.is_training() {
        return training_slack(inp, &block, allocated);
    }
    let pass = match inp.kind {
        Kind::EncoderDecoder {
            encoder_positions, ..
        } if encoder_positions > 0 => {
            return seq2seq_slack(inp, &block, f64::from(encoder_positions));
        }
        Kind::Encoder | Kind::EncoderDecoder { .. } => inp.pass(inp.batch, inp.context),
        _ => {
            let seqs = inp.batch * inp.beams;
            let prefill = inp.pass(seqs, inp.prompt);
            let largest = largest_tensor(&block, &prefill);
            let stranding = stranding_tensor(&block, &prefill);
            let decode = decode_step(&block, &inp.pass(seqs, inp.context), inp.kv_bytes);
            // A prompt shorter than the context states how far the decode runs; the default
            // (the prompt filling the context) does not.
            let end = (inp.prompt < inp.context).then_some(inp.context);
            // Llama-layout code the replay does not follow (Gemma v1, Cohere, Granite, a pod
            // stating no `model-type`, ...): neither the replay of the Llama layout nor the
            // analytic count is its code, so it gets the larger (`prefill_replay::follows`).
            let mut floor = 0.0;
            if let Some(d) = replayed_decoder(inp, &block, &prefill) {
                // The replay runs the decode until it stops making segments, short of the first
                // 2 MiB crossing; the growth after it is counted below.
                // The replay's decode segments depend on where each copy lands, which is not
                // monotone in the prompt (Qwen3-0.6B at 32 × 8,192 makes 17 × 510 MiB of them at
                // 8,128 and 8,192 tokens and none at 8,191): a pod's prompts vary up to the
                // stated one, so step 1 is never counted below the closed form's count
                // ([`cache_relocation_fresh`], the rule before the replay).
                let counted = cache_relocation_fresh(&block, &prefill, inp.kv_bytes, stranding);
                // The copies outgrow the prefill's room later in a long generation:
                // [`prefill_replay::Replayed::outgrown_fresh`] counts that from the replay's own
                // layout, up to the stated context, or one 2 MiB level of growth past the replay
                // without `prompt-tokens` (as [`cache_crossings_fresh`] counts one crossing).
                // Where step 1 made segments the later growth is the larger of that and two
                // segments per crossing ([`cache_crossings_fresh`], the 8k trace's count, whose
                // prefill's blocks hold every copy): a short prompt's blocks hold few of copies
                // that double (`tests/data/h200b`'s Qwen3-0.6B at 32 × 1,024 + 1,024).
                let replayed = |d: &prefill_replay::Decoder, r: prefill_replay::Replayed| {
                    // A sliding-window cache the prompt fills keeps `window - 1` tokens, so
                    // every decode step's copies (`window` tokens) fit where the last step's
                    // were (`DynamicSlidingWindowLayer.update`): nothing grows past the steps
                    // the replay ran.
                    // Step 1 is still never counted below the closed form: the pod's real
                    // prompts may be shorter than the window.
                    if d.window.is_some_and(|w| d.s >= w - 1.0) {
                        return r.prefill_slack
                            + r.decode_fresh.max(counted)
                            + eager_unreplayed_segment(d);
                    }
                    let step_one = r.decode_fresh.max(counted);
                    let per_token = d.b * d.kv * d.c;
                    let last =
                        end.map_or(r.tokens + allocator::ROUND_LARGE / per_token, |e| e - 1.0);
                    let outgrown = r.outgrown_fresh(d, last);
                    let later = if step_one > 0.0 {
                        cache_crossings_fresh(&block, &prefill, inp.kv_bytes, end, step_one)
                            .max(outgrown)
                    } else {
                        outgrown
                    };
                    // Falcon's math kernel copies k and v to every head in each decode step;
                    // those copies grow with the cache, `4·heads/c` times faster (142 in 16 bits).
                    let per_token = 4.0 * d.b * d.heads * d.head_dim;
                    let math_last =
                        end.map_or(r.tokens + allocator::ROUND_LARGE / per_token, |e| e - 1.0);
                    r.prefill_slack
                        + step_one
                        + later
                        + r.math_copies_fresh(d, math_last)
                        + eager_unreplayed_segment(d)
                };
                // The replay is exact for the prompt it is given, and not monotone in it: a
                // cache copy a token longer or shorter lands in another block. Without
                // `prompt-tokens` the prefill is sized over the whole context, a length no
                // real prompt has (`generate` makes at least one token), and whose tensors can
                // all be whole powers of two: Qwen2.5-0.5B at 1 × 32,768 strands 219 MiB
                // there, 411 MiB at 32,767 and at the oracle's prompt of 32,704, while
                // Qwen3-0.6B at 32 × 8,192 makes its decode segments at 8,192 and 8,128 and
                // not at 8,191. So the larger of the two ends is taken.
                // (Both replays start from one heap of weights: `prefill_replay::replay_pair`.)
                let replay = if inp.prompt < inp.context || d.s < 2.0 {
                    replayed(&d, prefill_replay::replay(&d))
                } else {
                    let longest = prefill_replay::Decoder { s: d.s - 1.0, ..d };
                    let (at_context, at_longest) = prefill_replay::replay_pair(&d, longest.s);
                    replayed(&d, at_context).max(replayed(&longest, at_longest))
                };
                if inp.replayed_code {
                    return replay;
                }
                floor = replay;
            }
            let relocation = if inp.legacy_cache {
                // The legacy cache is counted twice over already (`kv_cache`).
                0.0
            } else {
                let fresh = cache_relocation_fresh(&block, &prefill, inp.kv_bytes, stranding);
                fresh + cache_crossings_fresh(&block, &prefill, inp.kv_bytes, end, fresh)
            };
            return (HF_SLACK_INFERENCE_TENSORS * stranding
                + gathered_experts_fresh(&block, &prefill, seqs, decode, largest)
                + relocation)
                .max(floor);
        }
    };
    HF_SLACK_INFERENCE_TENSORS * stranding_tensor(&block, &pass)
}

/// One segment of an eager prefill's largest score request (`4·b·heads·s²`, the fp32 softmax)
/// beyond what [`prefill_replay`] replays. The replay reproduces the oracle's allocator replay
/// of the same run to 0.02 MiB (SmolLM2-1.7B eager at 16 × 1,984: 6,500.71 MiB of slack against
/// 6,500.73), and the oracle is exact on both Phi-3-mini eager H100 rows, but on the H100 the
/// `SmolLM2` rows reserved one score segment more than that replay: 7,688 MiB (one `4·n` block) in
/// bf16 and 3,844 MiB (one `c·n` block) in fp16 (`docs/oracle.md`, "Eager attention's reserved
/// memory"). Which free segment the cache's copies and the MLP carve between layers decides
/// whether a later layer's scores need a fresh one, and the GPU's order differs from the fake
/// tensors' somewhere the oracle does not see; under-counting a segment of this size OOM-kills a
/// neighbour, so the larger of the two is counted. SDPA's fused kernels make no score matrix and
/// count nothing here.
fn eager_unreplayed_segment(d: &prefill_replay::Decoder) -> f64 {
    if d.eager.is_none() {
        return 0.0;
    }
    allocator::segment(allocator::block(4.0 * d.b * d.heads * d.s * d.s))
}

/// The blocks a prefill leaves free for the decode, at least: one layer's MLP intermediates
/// and its `RMSNorm`'s two fp32 copies, each alive beside the others of its phase and so each a
/// block of its own, freed at the end of every layer (the attention phase's smaller tensors
/// may be carved out of these, so they are not counted again). A mixture of experts' routed
/// copies are left out: fewer blocks is the safe side of [`cache_relocation_fresh`].
fn prefill_free_blocks(block: &Block, p: &Pass) -> Vec<f64> {
    let t = p.t();
    let i = t * block.ffn * p.c;
    let mut blocks = match block.mlp {
        _ if block.experts_per_token > 0.0 => Vec::new(),
        Mlp::Gated => vec![i; 3],
        // The `2I` output, whose chunks are views, beside `act(gate)` and the product.
        Mlp::FusedGated => vec![2.0 * i, i, i],
        Mlp::Plain if block.composed_gelu() => vec![i; 4],
        Mlp::Plain => vec![i; 2],
    };
    if block.rms() {
        blocks.extend([4.0 * t * block.h; 2]);
    }
    blocks
}

/// Fresh segments at the first decode step of `generate`, when every layer's key and value
/// outgrow the blocks they were built in. `DynamicLayer.update` (transformers
/// `cache_utils.py`) replaces each layer's key, then its value, by `torch.cat([old, new],
/// dim=-2)`: a request one token (`b·kv·c`) larger than the block it replaces, made while that
/// block is still live. The caching allocator (`allocator`) serves it from the smallest
/// free block that holds it (`get_free_block`); the old block, freed after, is too small by
/// that token for the next one. A layer's key and value were built back to back in the prefill,
/// so they sit side by side; once both are freed they merge (`try_merge_blocks`) into one
/// block that holds the next layer's key. That leaves one request per layer (its value) to the
/// blocks the prefill freed (`prefill_free_blocks`, each holding as many as whole requests
/// fit: a block of exactly three old keys holds two new ones) and the rest to fresh segments
/// of its size rounded up to 2 MiB (`get_allocation_size`). Those segments sit on top of the
/// prefill's reserved memory, which nothing else in the decode needs.
///
/// Traced on the allocator replay (`docs/oracle.md`, "Why the model reads low on three rows"):
/// Qwen3-0.6B at batch 32 × 8,128 put 30 of step 1's 56 copies in merged old blocks, 11 in the
/// prefill's free blocks and the rest in 510 MiB segments, +12.0 GiB over the decode; the H100
/// measured +10.0 GiB, and an H200 trace of the same shape at 7,936 + 256 made 14 segments of
/// 498 MiB at step 1 (`tools/measure/decode-trace`). Later steps outgrow the 2 MiB rounding
/// again (every `2 MiB / (b·kv·c)` steps): [`cache_crossings_fresh`].
fn cache_relocation_fresh(block: &Block, prefill: &Pass, kv_bytes: f64, stranding: f64) -> f64 {
    let token = prefill.b * block.kv * kv_bytes;
    let grown = allocator::block(prefill.b * prefill.s * block.kv * kv_bytes + token);
    if allocator::small(grown) {
        // Small-pool copies (`get_pool`: at most 1 MiB; the large pool's blocks never serve
        // them): a layer's key and value share a 2 MiB segment, and once both are freed it is
        // whole again (`try_merge_blocks`) and holds the next layer's two copies, so only the
        // first layer's need a segment of their own. The replays of SmolLM2-135M and
        // Llama-3.1-8B at 1 × 448 + 64 new tokens made one small segment in decode, and
        // Llama two more once its copies reached 1 MiB.
        return allocator::fresh(1.0, grown);
    }
    // The prefill's own slack, `HF_SLACK_INFERENCE_TENSORS` blocks of its
    // [`stranding_tensor`], is free room too.
    let stranded = HF_SLACK_INFERENCE_TENSORS * allocator::fits(allocator::block(stranding), grown);
    let slots: f64 = prefill_free_blocks(block, prefill)
        .into_iter()
        .map(|b| allocator::fits(allocator::block(b), grown))
        .sum::<f64>()
        + stranded;
    allocator::fresh(block.layers - slots, grown)
}

/// Fresh segments at the later 2 MiB crossings of a long generation: every
/// `2 MiB / (b·kv·c)` decode steps each layer's key and value outgrow the segments made for the
/// previous size (`get_allocation_size` rounds a request of 10 MiB or more up to 2 MiB, and one
/// that fits no cached block gets a segment of its own). Segments never merge and every later
/// copy is larger, so the outgrown ones are stranded: reserved grows by the new segments at
/// each crossing and never shrinks. Only a cache that did not fit the prefill's blocks at step 1
/// (`step_one` > 0 from [`cache_relocation_fresh`]) has copies living alone in such segments;
/// the copies inside the prefill's large blocks move into each other's merged holes
/// (`try_merge_blocks`) and need none.
///
/// Per crossing, one layer's key and value take segments of the new size: the copies in the
/// prefill's large blocks hold `floor(B / S)` of them (a 1,984 MiB block three of 496–661 MiB)
/// with no whole free copy left over, and `DynamicLayer.update` re-concatenates the pair while
/// its old blocks are live, exact-size holes that hold no larger copy until a neighbour is
/// freed. Traced on an H200 (2026-11-27, `torch.cuda.memory_snapshot()` per decode step,
/// `docs/oracle.md`, "Decode past the first step"): Qwen3-0.6B bf16 at batch 32 × 7,936 + 256
/// new tokens made 3 segments of 500 MiB at step 33, then exactly 2 at each crossing after
/// (502, 504, … 512 MiB at steps 65, 97, … 225); at batch 16 × 7,680 + 512 new, 3 of 244 MiB,
/// then 2 of 246 … 256 MiB. Two is the count for a prefill whose segments hold every copy (the
/// GPU's: sixteen 1,984, three 1,488 and two 992 MiB segments, 56 copies of 498–661 MiB for 28
/// layers); the oracle's replay leaves ten 1,984 and ten 1,488 MiB ones, room for 52, and makes
/// `2 + (56 − 52)` = 6 per crossing. The segment counts of a prefill are not in the model.
///
/// With a stated prompt the crossings counted are its cache growing to the context's
/// (`end − 1` tokens at the last forward, `end` the context). The default annotations state no
/// generation length (`end` is `None`: the prompt fills the context), and a generation of more
/// than `2 MiB / (b·kv·c)` tokens (32 at batch 32 of Qwen3-0.6B) reaches the first crossing, so
/// one is counted: a pod that generates longer should state its prompt, and reads low without it.
/// Copies under 10 MiB share 20 MiB segments (`kLargeBuffer`) and are not followed.
///
/// Copies that outgrow the prefill's freed blocks in a long generation are not this term's:
/// where the replay runs, its own layout counts them ([`prefill_replay::Replayed::outgrown_fresh`];
/// Llama-3.1-8B at batch 4 × 2,048 + 6,144 new tokens makes 19.3 GiB of segments past step 1 when
/// every step is replayed), and [`slack`] takes the larger of the two. Not counted yet, and low
/// where it happens: the same on models the replay does not follow, whose prefills' blocks may
/// hold fewer copies than all `2L` after step 1 and then make more than two segments per
/// crossing.
fn cache_crossings_fresh(
    block: &Block,
    prefill: &Pass,
    kv_bytes: f64,
    end: Option<f64>,
    step_one: f64,
) -> f64 {
    let per_token = prefill.b * block.kv * kv_bytes;
    let first = allocator::block(prefill.s * per_token + per_token);
    if step_one <= 0.0 || !allocator::rounded_alone(first) {
        return 0.0;
    }
    let from = allocator::segment(first);
    let crossings = match end {
        Some(end) => {
            let last = allocator::block((end - 1.0).max(prefill.s + 1.0) * per_token);
            ((allocator::segment(last) - from) / allocator::ROUND_LARGE)
                .round()
                .max(0.0)
        }
        None => 1.0,
    };
    // Two segments per crossing, of `from + 2 MiB`, `from + 4 MiB`, … `from + crossings·2 MiB`.
    2.0 * (crossings * from + allocator::ROUND_LARGE * crossings * (crossings + 1.0) / 2.0)
}

/// Reserved bytes a mixture of experts adds at its first decode step beyond what the allocated
/// peak already counts: the gathered gate/up (`b·k·2·I·h·c`) and down (`b·k·I·h·c`) weights of
/// `batched_mm_experts_forward` ([`decode_step`]) that are larger than any block the prefill
/// freed (at most its largest tensor) get segments of their own. The caching allocator serves
/// a request from the smallest cached block that holds it and makes a new segment when none
/// does (`CUDACachingAllocator.cpp`: `get_free_block`, then `alloc_block`), and it never
/// releases the prefill's segments, so those gathers sit on top of the prefill's reserved
/// memory: reserved = weights + cache + prefill activations `P` + the prefill's slack + fresh,
/// while allocated counts `max(P, D)` (`D` the decode step's activations). The difference
/// beyond the prefill's slack is `P + fresh − max(P, D)`, never below 0; a dense model gathers
/// nothing. Traced on the allocator replay: Qwen3-30B-A3B at batch 256 × 512 made 12,288 and
/// 6,144 MiB segments in decode step 1, where the prefill's largest block was 3,840 MiB
/// (`docs/oracle.md`, "Why the model reads low on three rows").
fn gathered_experts_fresh(
    block: &Block,
    prefill: &Pass,
    seqs: f64,
    decode: f64,
    largest: f64,
) -> f64 {
    if block.experts_per_token <= 0.0 {
        return 0.0;
    }
    let down = seqs * block.experts_per_token * block.ffn * block.h * prefill.c;
    let fresh: f64 = [2.0 * down, down].iter().filter(|&&g| g > largest).sum();
    let p = forward_peak(block, prefill);
    (p + fresh - p.max(decode)).max(0.0)
}

/// What a decoder's `generate` without `prompt-tokens` assumes about its decode, for
/// `estimate`'s "assumed" lines: a prompt that fills the context, so the prefill is sized over
/// all of it and the decode runs one step (at most one 2 MiB level of the cache's growth is
/// counted past it). A shorter prompt and a longer generation can reserve more: each
/// `DynamicLayer.update` copy grows by `b·kv·c` bytes a step, so every `2 MiB / (b·kv·c)` steps it
/// outgrows the segment `get_allocation_size` rounded it into (`kRoundLarge`), and the caching
/// allocator keeps the outgrown segments (segments never merge or shrink), without bound until
/// `cudaMalloc` fails (the H200's Qwen3-0.6B at 32 × 1,024 + 1,024 reserved 59.4 GiB for 8.3
/// allocated; `tests/data/h200b`). The pod can state its prompt (the decode is then counted to
/// the context) or map its segments expandable (then nothing is stranded: said by
/// `expandable-segments`, and this line is not printed). A sliding-window cache shorter than the context
/// stops growing at the window (`DynamicSlidingWindowLayer`): nothing to say there.
pub(in crate::model::estimate) fn unstated_generation(inp: &Inputs) -> Option<String> {
    let decoder_generate = inp.kind == Kind::Decoder
        && !inp.workload.is_training()
        && inp.prompt >= inp.context
        && inp.hf_modules()
        && !inp.expandable_segments;
    if !decoder_generate || inp.block().windowed(inp.context) {
        return None;
    }
    Some(format!(
        "prompt-tokens unstated: a prompt of all {:.0} context tokens (the prefill sized over \
         it, the decode one step); a shorter prompt and a longer generation can reserve more, \
         each further {:.0} generated tokens growing every cache copy past another 2 MiB \
         segment size: state prompt-tokens, or run with \
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the webhook then sets \
         peakfit.io/expandable-segments)",
        inp.context,
        tokens_per_level(inp)
    ))
}

/// Decode steps per 2 MiB of growth of one cache copy (`b·kv·c` bytes a step).
fn tokens_per_level(inp: &Inputs) -> f64 {
    let a = &inp.arch;
    let per_step =
        inp.batch * inp.beams * f64::from(a.kv_heads) * f64::from(a.head_dim) * inp.kv_bytes;
    (allocator::ROUND_LARGE / per_step).ceil().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{GIB, llama_1b, pass, phi3_mini_4k};
    use super::*;
    use crate::model::estimate::ModelType;

    /// SmolLM2-1.7B eager at 16 × 1,984: one segment of the fp32 softmax, 2 × 16 × 32 × 1,984²
    /// × 2 B = 7,688 MiB (already a whole 2 MiB multiple), on top of the replay; SDPA nothing.
    #[test]
    fn an_eager_prefill_counts_one_score_segment_beyond_its_replay() {
        let d = prefill_replay::smollm2(2.0, Some(prefill_replay::Softmax::Copy));
        assert_eq!(eager_unreplayed_segment(&d) / 1_048_576.0, 7688.0);
        let sdpa = prefill_replay::Decoder { eager: None, ..d };
        assert!(eager_unreplayed_segment(&sdpa).abs() < f64::EPSILON);
    }

    /// Qwen3-0.6B's shape: every prefill block is a whole number of cache blocks, so none holds
    /// as many copies one token longer.
    fn qwen3_06b() -> Block {
        Block {
            h: 1024.0,
            q: 2048.0,
            kv: 1024.0,
            heads: 16.0,
            ffn: 3072.0,
            vocab: 151_936.0,
            layers: 28.0,
            mlp: Mlp::Gated,
            family: ModelType::QkNorm,
            experts_per_token: 0.0,
            experts: 0.0,
            sliding_window: 0.0,
        }
    }

    /// The first decode step's key and value copies, one token longer than the prefill's
    /// blocks: one per layer goes to the blocks the prefill freed, the rest to fresh 2 MiB-rounded
    /// segments.
    #[test]
    fn cache_copies_a_token_longer_than_the_prefill_blocks_take_fresh_segments() {
        let (block, p) = (qwen3_06b(), pass(32.0, 8128.0));
        let mib = 1_048_576.0;
        let largest = largest_tensor(&block, &p);
        // An MLP intermediate, 1,524 MiB, is the largest tensor.
        assert_eq!(largest, p.t() * 3072.0 * 2.0);
        // Slots for a 508.06 MiB copy: the MLP's three 1,524 MiB blocks and the two stranded
        // ones two each, the norm's two 1,016 MiB fp32 copies one each.
        let slots = 5.0 * 2.0 + 2.0;
        assert_eq!(
            cache_relocation_fresh(&block, &p, 2.0, largest),
            (28.0 - slots) * 510.0 * mib
        );
        // Llama-3.1-8B at batch 16 × 1,984: 62 MiB copies, hundreds of slots in 868 MiB MLP
        // blocks, nothing fresh.
        let llama = Block {
            h: 4096.0,
            q: 4096.0,
            kv: 1024.0,
            ffn: 14_336.0,
            layers: 32.0,
            ..llama_1b()
        };
        let p = pass(16.0, 1984.0);
        let largest = largest_tensor(&llama, &p);
        assert_eq!(cache_relocation_fresh(&llama, &p, 2.0, largest), 0.0);
    }

    /// Copies of at most 1 MiB come from the small pool, where each layer's freed pair leaves a
    /// whole 2 MiB segment for the next layer's: only the first layer's take a new one.
    #[test]
    fn small_cache_copies_take_one_small_segment() {
        let (block, p) = (qwen3_06b(), pass(1.0, 256.0));
        // 256 tokens × 1,024 × 2 B = 512 KiB, one token more rounds to 514 KiB.
        let fresh = cache_relocation_fresh(&block, &p, 2.0, largest_tensor(&block, &p));
        assert_eq!(fresh, 2.0 * 1_048_576.0);
    }

    /// Past step 1, each 2 MiB crossing of the copies' size makes two segments of the new size
    /// (one layer's key and value), which every later copy outgrows: Qwen3-0.6B at batch 32 ×
    /// 7,936 + 256 new tokens crosses from its 498 MiB segments to 512 MiB in seven steps of
    /// 2 MiB (the H200 trace: 1,500, 1,004, 1,008, … 1,024 MiB at steps 33, 65, … 225).
    #[test]
    fn each_later_crossing_of_the_cache_size_takes_two_fresh_segments() {
        let (block, p) = (qwen3_06b(), pass(32.0, 7936.0));
        let mib = 1_048_576.0;
        let step_one = cache_relocation_fresh(&block, &p, 2.0, largest_tensor(&block, &p));
        assert!(step_one > 0.0);
        let sizes: f64 = (1..=7).map(|i| 498.0 + 2.0 * f64::from(i)).sum();
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, Some(8192.0), step_one),
            2.0 * sizes * mib
        );
        // Within one segment's 2 MiB (32 steps at 64 KiB a token) nothing is made.
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, Some(7936.0 + 32.0), step_one),
            0.0
        );
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, Some(7936.0 + 34.0), step_one),
            2.0 * 500.0 * mib
        );
    }

    /// The default annotations size the prefill over the whole context and state no
    /// generation length: the first crossing past step 1 is counted, two segments of the size
    /// after the 514 MiB ones of step 1.
    #[test]
    fn an_unstated_generation_counts_its_first_crossing() {
        let (block, p) = (qwen3_06b(), pass(32.0, 8192.0));
        let step_one = cache_relocation_fresh(&block, &p, 2.0, largest_tensor(&block, &p));
        assert!(step_one > 0.0);
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, None, step_one),
            2.0 * 516.0 * 1_048_576.0
        );
    }

    /// Copies that all fit the prefill's blocks at step 1 live there and grow into each other's
    /// merged holes; copies under 10 MiB share 20 MiB segments. Neither makes a segment per
    /// crossing.
    #[test]
    fn crossings_make_segments_only_for_copies_alone_in_their_own() {
        let (block, p) = (qwen3_06b(), pass(32.0, 7936.0));
        assert_eq!(cache_crossings_fresh(&block, &p, 2.0, None, 0.0), 0.0);
        // Batch 1 × 2,048: 4 MiB copies, in the 20 MiB segments' pool, even on their way to
        // 64 MiB at 32k.
        let short = pass(1.0, 2048.0);
        assert_eq!(
            cache_crossings_fresh(&block, &short, 2.0, Some(32_768.0), 2.0 * 1_048_576.0),
            0.0
        );
    }

    /// A mixture of experts decoding at wide batch gathers expert weights larger than any block
    /// its prefill freed: those segments come on top of the prefill's; a narrow batch, or a
    /// dense model, adds nothing.
    #[test]
    fn gathered_expert_weights_larger_than_the_prefill_blocks_get_fresh_segments() {
        let mut block = llama_1b();
        (block.ffn, block.experts_per_token) = (768.0, 8.0);
        let p = pass(256.0, 512.0);
        let largest = largest_tensor(&block, &p);
        let down = 256.0 * 8.0 * 768.0 * 2048.0 * 2.0;
        assert!(
            down > largest,
            "both gathers exceed the prefill's largest block"
        );
        let decode = decode_step(&block, &pass(256.0, 544.0), 2.0);
        let prefill = forward_peak(&block, &p);
        assert_eq!(
            gathered_experts_fresh(&block, &p, 256.0, decode, largest),
            prefill + 3.0 * down - prefill.max(decode)
        );
        let narrow = pass(2.0, 2048.0);
        let d2 = decode_step(&block, &pass(2.0, 2048.0), 2.0);
        let l2 = largest_tensor(&block, &narrow);
        assert_eq!(gathered_experts_fresh(&block, &narrow, 2.0, d2, l2), 0.0);
        let dense = llama_1b();
        assert_eq!(
            gathered_experts_fresh(&dense, &p, 256.0, decode, largest),
            0.0
        );
    }

    fn llama8b_generate(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("model", "llama-3.1-8b"),
                ("model-type", "llama"),
                ("engine", "hf"),
                ("workload", "inference"),
                ("dtype", "bf16"),
            ],
            extra,
        )
    }

    /// Issue 20's dangerous case: Llama-3.1-8B bf16 at batch 4, a stated prompt of 2,048 tokens
    /// and 6,144 new ones. The heap of [`prefill_replay`] run through every decode step
    /// (`prefill_replay`'s ignored `every_decode_step_of_a_long_generation`) reserves 36.721 GiB
    /// at the end: 17.428 after the prefill, and 19.293 more as the copies (16 MiB at the prompt,
    /// 64 MiB at the end) outgrow the prefill's freed blocks, from about 32 MiB on. Step 1 fits
    /// (the replay makes no segment there), so the crossings term did not count any of it, and
    /// the estimate read about 21 GiB.
    #[test]
    fn a_short_prompt_and_a_long_generation_reserve_what_every_decode_step_makes() {
        let e = llama8b_generate(&[
            ("batch", "4"),
            ("context-tokens", "8192"),
            ("prompt-tokens", "2048"),
        ]);
        let reserved = e.reserved_bytes as f64 / GIB;
        assert!(reserved >= 36.721, "{reserved}");
        assert!(reserved < 36.721 * 1.25, "{reserved}");
    }

    /// Qwen3-0.6B bf16 `generate` at batch 32 with `extra` (the context among them).
    fn qwen3_06b_generate(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("model-type", "qwen3"),
                ("layers", "28"),
                ("hidden-size", "1024"),
                ("attention-heads", "16"),
                ("kv-heads", "8"),
                ("head-dim", "128"),
                ("intermediate-size", "3072"),
                ("vocab-size", "151936"),
                ("tied-embeddings", "true"),
                ("engine", "hf"),
                ("workload", "inference"),
                ("dtype", "bf16"),
                ("batch", "32"),
            ],
            extra,
        )
    }

    /// Where step 1 already makes segments, the later growth is the larger of two per crossing
    /// (the 8k trace, whose prefill's blocks hold every copy) and the copies the replay's room
    /// does not hold at each 2 MiB level. Qwen3-0.6B at 32 × 1,024 + 1,024: the copies grow from
    /// 64 to 128 MiB, past every block the 1,024-token prefill freed, so nearly all 58 copies
    /// take a segment at each of the 32 levels. One H200 reserved 59.38 GiB for 8.29 allocated
    /// (`tests/data/h200b`, `h200b-qwen3-0.6b-b32-2k-n1024`, the card to itself); the heap
    /// replayed step by step ends at 69.54. Two per crossing alone read 16.59.
    #[test]
    fn copies_that_outgrow_the_prefills_room_are_counted_after_a_first_step_that_made_segments() {
        let e = qwen3_06b_generate(&[("context-tokens", "2048"), ("prompt-tokens", "1024")]);
        let reserved = e.reserved_bytes as f64 / GIB;
        assert!(reserved >= 59.38, "{reserved}");
        assert!(reserved < 69.54 * 1.1, "{reserved}");
    }

    /// Without `prompt-tokens` the decode is counted one 2 MiB level past the prefill, and the
    /// estimate says so, with the tokens per level (2 MiB over 32 × 8 × 128 × 2 bytes a step).
    #[test]
    fn an_unstated_prompt_is_an_assumption_that_names_the_growth() {
        let e = qwen3_06b_generate(&[("context-tokens", "2048")]);
        assert!(
            e.assumed
                .iter()
                .any(|a| a.starts_with("prompt-tokens unstated") && a.contains("further 32 ")),
            "{:?}",
            e.assumed
        );
        let stated = qwen3_06b_generate(&[("context-tokens", "2048"), ("prompt-tokens", "2000")]);
        assert!(!stated.assumed.iter().any(|a| a.contains("prompt-tokens")));
    }

    /// A sliding-window cache the prompt fills keeps its copies at `window` tokens
    /// (`DynamicSlidingWindowLayer.update`): Phi-3-mini eager at 2 × 4,032 + 12,352 takes the
    /// replay's prefill and decode steps and the eager score segment as its slack, and none of
    /// the growth to 16,383 tokens that a growing cache's terms count.
    #[test]
    fn a_filled_sliding_window_cache_grows_no_further() {
        let inp = phi3_mini_4k(&[
            ("flash-attention", "false"),
            ("context-tokens", "16384"),
            ("prompt-tokens", "4032"),
        ]);
        let block = inp.block();
        let prefill = inp.pass(inp.batch, inp.prompt);
        let d = replayed_decoder(&inp, &block, &prefill).expect("Phi-3 eager is replayed");
        let r = prefill_replay::replay(&d);
        assert_eq!(
            slack(&inp, 0.0),
            r.prefill_slack + r.decode_fresh + eager_unreplayed_segment(&d)
        );
        // What a growing cache's terms would add: the copies grown to 16,383 tokens.
        let growth = if r.decode_fresh > 0.0 {
            cache_crossings_fresh(
                &block,
                &prefill,
                inp.kv_bytes,
                Some(16384.0),
                r.decode_fresh,
            )
        } else {
            r.outgrown_fresh(&d, 16383.0)
        };
        assert!(growth > 0.0);
    }
}
