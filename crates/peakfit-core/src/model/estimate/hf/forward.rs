//! One forward pass without autograd (a prefill, an encoder's forward, a decode step): the
//! activations at its peak, and the largest and stranding tensors the slack terms size from.

use super::block::{Block, Mlp, Pass};
use crate::model::estimate::ModelType;

/// The transient MLP bytes of one forward without autograd (see the module table).
///
/// A mixture of experts (transformers' `grouped_mm_experts_forward`, `integrations/moe.py`, the
/// prefill's kernel) sorts the `S = T·k` routed copies of the tokens by expert: the gathered
/// inputs stay while the gate/up output and its `masked_fill` copy (`4·S·I·c`), then the down
/// output, its `masked_fill`, the weighted copy and its `inv_perm` reorder (`4·S·h·c`) live.
pub(super) fn mlp_transient(block: &Block, t: f64, c: f64) -> f64 {
    if block.experts_per_token > 0.0 {
        let s = t * block.experts_per_token;
        return s * c * (block.h + 4.0 * block.ffn).max(4.0 * block.h);
    }
    let live = match block.mlp {
        Mlp::Gated => 3.0,
        // NewGELU: the input, then two of its elementwise temporaries and the product.
        Mlp::Plain if block.composed_gelu() => 4.0,
        Mlp::FusedGated => 4.0,
        Mlp::Plain => 2.0,
    };
    live * t * block.ffn * c
}

/// Bytes torch's math SDPA kernel holds at its peak, inside `_safe_softmax`
/// (`_scaled_dot_product_attention_math`, `aten/src/ATen/native/transformers/attention.cpp`).
/// In 16 bits it first copies q, k and v to fp32 (`query_.to(at::kFloat)`:
/// `allowFP16BF16ReductionMathSDP` is off by default) and keeps the copies to its end; it
/// scales q into a new tensor (`query_acc * scaling_factor`); with `enable_gqa` it repeats k
/// and v to every head (`pre_process_group_query_attention_input`: `repeat_interleave`), while
/// without it `matmul` broadcasts k into a copy that is gone before the softmax. Then the fp32
/// scores (`attn`, the mask added in place) and `at::_safe_softmax(attn, -1)`: that op is
/// `CompositeExplicitAutograd`, so CUDA runs its C++ body, `out = at::softmax(self)` (fp32),
/// `masked = self.isneginf()` (a boolean per score, alive beside both) and
/// `where_out(out, all(masked), 0, out)` into the softmax's own storage: 9 bytes per score.
fn math_kernel_bytes(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let upcast = if p.c < 4.0 {
        4.0 * t * (block.q + 2.0 * block.kv)
    } else {
        0.0
    };
    let repeated = if block.unequal_heads_without_gqa() {
        0.0
    } else {
        8.0 * t * block.q
    };
    let scores = (4.0 + 4.0 + 1.0) * p.b * block.heads * p.s * p.s;
    upcast + 4.0 * t * block.q + repeated + scores
}

/// The transient attention bytes of one forward without autograd, beyond the cache copies.
fn attention_transient(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let projections = t * p.c * (block.q + 2.0 * block.kv);
    let position = if block.rotary() {
        // RoPE's three q-sized temporaries; q/k norms' two fp32 copies of q.
        let rope = 3.0 * t * block.q * p.c;
        if block.qk_norm() {
            rope.max(8.0 * t * block.q)
        } else {
            rope
        }
    } else {
        // BERT/Whisper: the SDPA output and its contiguous transpose.
        2.0 * t * block.q * p.c
    };
    // SDPA converts a boolean mask to the query's dtype in every call
    // (`convert_boolean_attn_mask`: `where(mask.logical_not(), -inf, 0)`): the `logical_not`
    // (1 B) and the float mask (`c`) are alive together.
    let conversion = if block.sdpa_mask(p) {
        (p.c + 1.0) * p.b * p.s * p.s
    } else {
        0.0
    };
    // A fused projection stays alive through its views beside the rotated q and k.
    let fused = if block.fused_qkv() {
        t * (block.q + block.kv) * p.c
    } else {
        0.0
    };
    if p.math_kernel(block) {
        // RoPE's temporaries are gone (q and k rebound to their rotated copies); the mask's
        // `logical_not` died with its conversion, the converted mask (`c`) is the kernel's.
        // Without a mask handed in the kernel is causal and builds its own: `ones(L, S, bool)
        // .tril()` converted to the scores' fp32 (`4·s²`), alive at the softmax.
        let mask = if block.sdpa_mask(p) {
            p.c * p.b * p.s * p.s
        } else if p.s > 1.0 {
            4.0 * p.s * p.s
        } else {
            0.0
        };
        return t * block.h * p.c + projections + fused + mask + math_kernel_bytes(block, p);
    }
    if p.scores(block) {
        // Eager: the score matrix (`Block::score_bytes` per score) and k and v repeated to
        // every head (`repeat_kv`), beside RoPE's outputs.
        return t * block.h * p.c
            + projections
            + position
            + 2.0 * t * block.q * p.c
            + block.score_bytes(p) * p.b * block.heads * p.s * p.s
            + conversion;
    }
    // With a window's mask SDPA gets no `enable_gqa` (`use_gqa_in_sdpa`): k and v are
    // repeated.
    let repeat = if block.windowed(p.s) && block.kv < block.q {
        2.0 * t * block.q * p.c
    } else {
        0.0
    };
    // RoPE's temporaries are freed (q and k rebound to their rotated copies) before SDPA runs.
    t * block.h * p.c + projections + position.max(repeat + fused + conversion)
}

/// Activation bytes at the peak of one forward pass without autograd (a prefill, or an
/// encoder's forward), beyond the weights and the KV cache.
pub(super) fn forward_peak(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let hidden = t * block.h * p.c;
    let held = if block.scaled_embeddings() {
        3.0 * hidden
    } else {
        2.0 * hidden
    };
    // A pre-norm block holds the residual sum and the normed input through its MLP; BERT's
    // post-LN block feeds the MLP the attention output itself.
    let mlp_inputs = if block.family == ModelType::LayerNorm && block.mlp == Mlp::Plain {
        hidden
    } else {
        2.0 * hidden
    };
    let mlp = mlp_inputs + mlp_transient(block, t, p.c);
    let norm = if block.rms() {
        8.0 * t * block.h
    } else {
        hidden
    };
    // The eager mask is built once per forward and lives through every layer (a decoder's
    // causal mask, `masking_utils.eager_mask`; an encoder without padding gets none). SDPA's
    // causal mask is skipped (`_ignore_causal_mask_sdpa`), but not a sliding window's once
    // the sequence is longer than the window, nor Falcon's: a boolean `b·s·s` (`sdpa_mask`).
    let mask = if !p.sdpa && (!block.layer_norm() || block.always_masks()) {
        p.b * p.s * p.s * p.c
    } else if block.sdpa_mask(p) {
        p.b * p.s * p.s
    } else {
        0.0
    };
    held + mask + mlp.max(attention_transient(block, p)).max(norm)
}

/// The largest single tensor of a forward pass: an MLP intermediate (the fused gate/up output
/// is two wide), an fp32 copy in a norm, or eager attention's fp32 softmax.
pub(super) fn largest_tensor(block: &Block, p: &Pass) -> f64 {
    let scores = if p.scores(block) {
        4.0 * p.b * block.heads * p.s * p.s
    } else {
        0.0
    };
    largest_outside_attention(block, p).max(scores)
}

/// The largest tensor of a forward pass outside a materialised score matrix.
fn largest_outside_attention(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let mlp = if block.experts_per_token > 0.0 {
        t * block.experts_per_token * p.c * (2.0 * block.ffn).max(block.h)
    } else {
        t * block.ffn
            * p.c
            * if block.mlp == Mlp::FusedGated {
                2.0
            } else {
                1.0
            }
    };
    let norm = if block.rms() { 4.0 * t * block.h } else { 0.0 };
    mlp.max(norm)
}

/// The tensor whose blocks a forward pass strands, in [`slack`]'s count of them. In fp32 every
/// tensor of a materialised score matrix (the scores, the softmax, its `to(float32)`, which is
/// the same tensor; torch's math kernel likewise) is `4·b·heads·s²`: each layer asks for the
/// same sizes the previous layer freed, the caching allocator's best fit hands back those very
/// blocks (`get_free_block`), and the layer's other requests take the smaller free blocks
/// first, so the score blocks are never split and strand nothing; the largest tensor outside
/// attention counts instead. SDPA's math kernel upcasts 16-bit inputs, so its scores are fp32 in
/// any precision (Falcon-7B's bf16 `generate`: the H100 row's replay strands no score block).
/// Two cases keep the scores counted:
/// - 16 bits outside the math kernel: the scores (`c` per score) and softmax's fp32 copy (4) differ in size, a 16-bit
///   request takes half of a freed fp32 block when no 16-bit one is free, and the next fp32
///   request finds none whole;
/// - SDPA's math kernel builds its float mask in every call (`_scaled_dot_product_attention_math`:
///   `ones(L, S, bool).tril()` under `is_causal`, then `convert_boolean_attn_mask`), `4·s²`
///   (`4·b·s²` for a mask handed in): when that is larger than every block outside attention,
///   the only free block that holds it is a freed score block, which it splits, and the next
///   score request takes a fresh segment (the oracle's replay of Qwen2.5-0.5B fp32 at 1 × 16,352
///   made a third 14,282 MiB segment right after its 1,020 MiB mask).
///
/// [`slack`]: super::slack
pub(super) fn stranding_tensor(block: &Block, p: &Pass) -> f64 {
    let outside = largest_outside_attention(block, p);
    let math_mask = if p.sdpa {
        4.0 * p.s * p.s * if block.sdpa_mask(p) { p.b } else { 1.0 }
    } else {
        0.0
    };
    // The math kernel computes in fp32 whatever its inputs (`_scaled_dot_product_attention_math`
    // upcasts 16-bit q, k and v while `allowFP16BF16ReductionMathSDP` is off): Falcon's bf16
    // multi-query attention has fp32 scores too.
    let fp32_scores = p.c >= 4.0 || p.math_kernel(block);
    if fp32_scores && math_mask <= outside {
        outside
    } else {
        largest_tensor(block, p)
    }
}

/// Extra bytes of one decode step of `generate`: one layer's key (or value) block while
/// `torch.cat` builds its successor.
pub(super) fn decode_step(block: &Block, p: &Pass, kv_bytes: f64) -> f64 {
    let (b, s, c) = (p.b, p.s, p.c);
    // A mixture of experts decodes with `batched_mm_experts_forward`: each of the `b·k` routed
    // tokens gathers its expert's gate/up and down matrices (`self.gate_up_proj[expert_ids]`),
    // both alive at the down projection: `b·k·3·I·h·c`.
    let experts = b * block.experts_per_token * 3.0 * block.ffn * block.h * c;
    (b * s * block.kv * kv_bytes)
        .max(experts)
        .max(math_kernel_decode(block, p))
}

/// Bytes SDPA's math kernel holds in one decode step, one query token against the whole cache
/// (`_scaled_dot_product_attention_math`): the scores are one row per head, but the keys and
/// values are not. Without `enable_gqa` (Falcon's one KV head), `matmul` broadcasts k to every
/// head into a contiguous fp32 copy (`4·b·s·q`; v's comes after k's is gone), beside the fp32
/// copies of the 16-bit k and v (`query_.to(at::kFloat)`, `8·b·s·kv`). With `enable_gqa` in
/// fp32, `repeat_interleave` copies k and v to every head and the kernel scales k into a third
/// (`12·b·s·q`). Zero where a fused kernel runs.
pub(super) fn math_kernel_decode(block: &Block, p: &Pass) -> f64 {
    if !p.math_kernel(block) {
        return 0.0;
    }
    let (b, s) = (p.b, p.s);
    if block.unequal_heads_without_gqa() {
        let upcast = if p.c < 4.0 {
            8.0 * b * s * block.kv
        } else {
            0.0
        };
        4.0 * b * s * block.q + upcast
    } else {
        12.0 * b * s * block.q
    }
}

/// The last position's logits and `generate`'s fp32 copy of them.
pub(super) fn generate_logits(block: &Block, sequences: f64, c: f64) -> f64 {
    sequences * block.vocab * (c + 4.0)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{falcon_7b, llama_1b, pass};
    use super::*;

    #[test]
    fn prefill_holds_three_mlp_tensors_and_two_hidden_copies_beside_the_mlp_input() {
        let (block, p) = (llama_1b(), pass(128.0, 992.0));
        let t = p.t();
        // inputs_embeds + layer input + residual sum + normed input, then act, up, product.
        let expected = 4.0 * t * 2048.0 * 2.0 + 3.0 * t * 8192.0 * 2.0;
        assert_eq!(forward_peak(&block, &p), expected);
    }

    #[test]
    fn phi3_keeps_the_fused_gate_up_output_through_its_chunks() {
        let (mut block, p) = (llama_1b(), pass(4.0, 4000.0));
        let gated = forward_peak(&block, &p);
        block.family = ModelType::Phi3;
        block.mlp = Mlp::FusedGated;
        assert_eq!(
            forward_peak(&block, &p) - gated,
            p.t() * block.ffn * 2.0,
            "one more T x I tensor"
        );
    }

    #[test]
    fn gemma_scales_its_embeddings_into_a_new_tensor() {
        let (mut block, p) = (llama_1b(), pass(2.0, 4096.0));
        let plain = forward_peak(&block, &p);
        block.family = ModelType::Gemma2;
        assert_eq!(forward_peak(&block, &p) - plain, p.t() * block.h * 2.0);
    }

    #[test]
    fn eager_attention_materialises_scores_and_mask() {
        let block = llama_1b();
        let sdpa = pass(1.0, 8192.0);
        let eager = Pass {
            sdpa: false,
            ..sdpa
        };
        // At 8k tokens the fp32 softmax dwarfs the MLP: the attention phase decides.
        // 10 bytes per score in 16 bits (the scores, softmax's fp32 copy, its output), less the
        // MLP phase it replaces as the peak.
        assert!(
            forward_peak(&block, &eager)
                > forward_peak(&block, &sdpa) + 32.0 * 8192.0 * 8192.0 * 9.5
        );
    }

    #[test]
    fn fp16_eager_softmax_converts_inside_its_kernel_and_bf16_copies_first() {
        // SmolLM2-1.7B eager at 16 x 2,048 (1,984 prompt tokens): the H100 allocated 3.75 GiB
        // less in fp16 than in bf16, 2 bytes per score (`SoftMax.cpp`: CUDA `Half` with
        // `dtype=Float` runs `_softmax(half_to_float=true)`, `BFloat16` is copied to fp32 first).
        let block = llama_1b();
        let bf16 = Pass {
            sdpa: false,
            ..pass(16.0, 1984.0)
        };
        let fp16 = Pass { half: true, ..bf16 };
        assert_eq!(block.score_bytes(&bf16), 10.0);
        assert_eq!(block.score_bytes(&fp16), 8.0);
        let scores = bf16.b * block.heads * bf16.s * bf16.s;
        assert_eq!(
            attention_transient(&block, &bf16) - attention_transient(&block, &fp16),
            2.0 * scores
        );
        // fp32 has no copy to skip; GPT-2's and Falcon's softmax keep the input's dtype.
        let fp32 = Pass { c: 4.0, ..fp16 };
        assert_eq!(block.score_bytes(&fp32), 8.0);
        let gpt2 = Block {
            family: ModelType::Gpt2,
            ..block
        };
        assert_eq!(gpt2.score_bytes(&fp16), gpt2.score_bytes(&bf16));
    }

    #[test]
    fn fp32_sdpa_on_grouped_query_attention_runs_the_math_kernel() {
        let block = llama_1b();
        let bf16 = pass(1.0, 8192.0);
        let fp32 = Pass { c: 4.0, ..bf16 };
        let scores = 8.0 * 32.0 * 8192.0 * 8192.0;
        assert!(forward_peak(&block, &fp32) > scores);
        assert!(forward_peak(&block, &bf16) < scores / 4.0);
        // Multi-head attention in fp32 goes to the memory-efficient kernel: no scores.
        let mha = Block {
            kv: block.q,
            ..block
        };
        assert!(forward_peak(&mha, &fp32) < scores / 4.0);
    }

    #[test]
    fn rms_norm_upcasts_twice_when_the_mlp_is_narrow() {
        // With a narrow MLP the norm's two fp32 copies (8 B per hidden unit) are the peak.
        let mut block = llama_1b();
        (block.ffn, block.q, block.kv) = (256.0, 256.0, 256.0);
        let p = pass(1.0, 1024.0);
        assert_eq!(
            forward_peak(&block, &p),
            2.0 * p.t() * block.h * 2.0 + 8.0 * p.t() * block.h
        );
    }

    #[test]
    fn bert_feeds_its_mlp_the_attention_output_itself() {
        let block = Block {
            h: 1024.0,
            q: 1024.0,
            kv: 1024.0,
            heads: 16.0,
            ffn: 4096.0,
            vocab: 30522.0,
            layers: 24.0,
            mlp: Mlp::Plain,
            family: ModelType::LayerNorm,
            experts_per_token: 0.0,
            experts: 0.0,
            sliding_window: 0.0,
        };
        let p = pass(256.0, 512.0);
        let t = p.t();
        assert_eq!(
            forward_peak(&block, &p),
            3.0 * t * 1024.0 * 2.0 + 2.0 * t * 4096.0 * 2.0
        );
    }

    #[test]
    fn a_mixture_of_experts_routes_k_copies_of_each_token() {
        let (mut block, p) = (llama_1b(), pass(8.0, 32768.0));
        (block.ffn, block.experts_per_token) = (768.0, 8.0);
        let t = p.t();
        // Prefill: four `S·h` tensors of the k routed copies beside the held hidden states.
        assert_eq!(
            forward_peak(&block, &p),
            4.0 * t * 2048.0 * 2.0 + t * 8.0 * 2.0 * 4.0 * 2048.0
        );
        // Decode: each routed token gathers its expert's three matrices.
        assert_eq!(
            decode_step(&block, &pass(32.0, 1.0), 2.0),
            32.0 * 8.0 * 3.0 * 768.0 * 2048.0 * 2.0
        );
    }

    /// fp32 score matrices are one size per layer and come back whole; 16-bit ones sit beside
    /// softmax's fp32 copy, and the math kernel's per-call float mask may outgrow every other
    /// block: those keep the scores as the stranded tensor.
    #[test]
    fn fp32_scores_strand_nothing_unless_something_else_splits_them() {
        let block = llama_1b();
        // Grouped-query attention in fp32: SDPA's math kernel, 16 GiB of scores at 8 × 4,096.
        let fp32 = Pass {
            c: 4.0,
            ..pass(8.0, 4096.0)
        };
        let mlp = fp32.t() * block.ffn * 4.0;
        assert_eq!(
            largest_tensor(&block, &fp32),
            4.0 * 8.0 * 32.0 * 4096.0 * 4096.0
        );
        assert_eq!(stranding_tensor(&block, &fp32), mlp);
        // Eager in bf16: the fp32 softmax copy beside 16-bit scores.
        let eager = Pass {
            sdpa: false,
            ..pass(8.0, 4096.0)
        };
        assert_eq!(
            stranding_tensor(&block, &eager),
            largest_tensor(&block, &eager)
        );
        // One sequence of 16,384 in fp32: the math kernel's 1 GiB float causal mask outgrows the
        // 512 MiB MLP blocks and splits a freed score block.
        let long = Pass {
            c: 4.0,
            ..pass(1.0, 16_384.0)
        };
        assert!(4.0 * 16_384.0 * 16_384.0 > long.t() * block.ffn * 4.0);
        assert_eq!(
            stranding_tensor(&block, &long),
            largest_tensor(&block, &long)
        );
        // Falcon-7B in bf16: one KV head without `enable_gqa`, so the math kernel, whose scores
        // are fp32 although the inputs are 16-bit: nothing stranded there either.
        let falcon = falcon_7b();
        let bf16 = pass(4.0, 1984.0);
        assert!(bf16.math_kernel(&falcon));
        assert_eq!(
            stranding_tensor(&falcon, &bf16),
            largest_outside_attention(&falcon, &bf16)
        );
        assert!(largest_tensor(&falcon, &bf16) > largest_outside_attention(&falcon, &bf16));
    }

    /// Without a mask handed in, the math kernel is causal and builds its own fp32 mask in
    /// every call (`ones(L, S).tril()`, converted): `4·s²` more than with the mask given.
    #[test]
    fn the_causal_math_kernel_builds_its_own_fp32_mask() {
        let llama = llama_1b();
        let fp32 = Pass {
            c: 4.0,
            ..pass(1.0, 16_384.0)
        };
        assert!(fp32.math_kernel(&llama) && !llama.sdpa_mask(&fp32) && !llama.fused_qkv());
        let t = fp32.t();
        let hidden_and_projections = t * llama.h * 4.0 + t * 4.0 * (llama.q + 2.0 * llama.kv);
        assert_eq!(
            attention_transient(&llama, &fp32),
            hidden_and_projections + 4.0 * 16_384.0 * 16_384.0 + math_kernel_bytes(&llama, &fp32)
        );
    }

    #[test]
    fn phi_has_gpt2s_mlp_and_norms_and_llamas_attention() {
        // `PhiMLP` runs `NewGELUActivation` over `fc1`'s output and `PhiDecoderLayer` normalises
        // with `LayerNorm` (not fp32 `RMSNorm` copies and one fused GELU, the Llama layout);
        // `PhiAttention` rotates q and k and its eager softmax runs in fp32 (not GPT-2's 16-bit
        // scores and probabilities).
        let family = ModelType::from_model_type("phi");
        let block = Block {
            family,
            mlp: Mlp::Plain,
            ..llama_1b()
        };
        assert!(block.composed_gelu() && block.layer_norm() && block.rotary());
        let p = pass(4.0, 2048.0);
        assert_eq!(block.score_bytes(&p), 10.0);
        let gpt2 = Block {
            family: ModelType::Gpt2,
            ..block
        };
        assert_eq!(gpt2.score_bytes(&p), 4.0);
        assert!(!gpt2.rotary());
        let p = pass(4.0, 2048.0);
        assert_eq!(
            mlp_transient(&block, p.t(), 2.0),
            mlp_transient(&gpt2, p.t(), 2.0)
        );
    }

    #[test]
    fn a_sliding_window_past_its_length_builds_a_mask_and_repeats_k_and_v() {
        let (mut block, p) = (llama_1b(), pass(8.0, 32768.0));
        let full = forward_peak(&block, &p);
        block.sliding_window = 4096.0;
        let mask = 8.0 * 32768.0 * 32768.0;
        assert!(forward_peak(&block, &p) >= full + mask);
        // Within the window nothing changes.
        block.sliding_window = 65536.0;
        assert_eq!(forward_peak(&block, &p), full);
    }

    #[test]
    fn falcon_builds_its_causal_mask_and_sdpa_converts_it_in_every_layer() {
        // Multi-head Falcon (`multi_query` false): equal heads, so a fused kernel takes the mask.
        let block = Block {
            kv: 4544.0,
            ..falcon_7b()
        };
        let p = pass(8.0, 32768.0);
        let (t, c, bss) = (p.t(), p.c, p.b * p.s * p.s);
        // Held: `inputs_embeds`, the layer input and the boolean mask; in attention: the normed
        // input, the fused qkv output kept by its views, the rotated q and k, and the mask's
        // `logical_not` beside its float conversion.
        let attention = t * block.h * c
            + t * (block.q + 2.0 * block.kv) * c
            + t * (block.q + block.kv) * c
            + (c + 1.0) * bss;
        assert_eq!(
            forward_peak(&block, &p),
            2.0 * t * block.h * c + bss + attention
        );
        // Without a mask (SDPA with `is_causal`), the MLP phase would be the peak.
        let unmasked = Block {
            family: ModelType::LayerNorm,
            ..block
        };
        assert!(forward_peak(&block, &p) > forward_peak(&unmasked, &p) + 2.0 * bss);
    }

    #[test]
    fn falcons_multi_query_attention_runs_the_math_kernel() {
        // Falcon-7B hands SDPA 71 query heads and one kv head without `enable_gqa`: cuDNN and
        // flash refuse unequal heads without it, the efficient kernel always. 16 bits too.
        let (block, p) = (falcon_7b(), pass(4.0, 2048.0));
        let scores = 9.0 * p.b * block.heads * p.s * p.s;
        assert!(p.math_kernel(&block));
        assert!(forward_peak(&block, &p) > scores);
        // Multi-head Falcon, and the new decoder architecture (Falcon-40B: 8 kv heads of 64,
        // broadcast to every head before SDPA), run a fused kernel: no scores.
        for kv in [block.q, 8.0 * 64.0] {
            let fused = Block { kv, ..block };
            assert!(!p.math_kernel(&fused));
            assert!(forward_peak(&fused, &p) < scores / 4.0);
        }
        // Llama's grouped-query attention gets `enable_gqa`: cuDNN in 16 bits.
        assert!(!p.math_kernel(&llama_1b()));
    }

    #[test]
    fn the_math_kernel_holds_fp32_scores_their_softmax_and_a_boolean_per_score() {
        // fp32 grouped-query attention: the scaled q, k and v repeated to every head, and per
        // score the fp32 scores, `_safe_softmax`'s output and its `isneginf` boolean.
        let block = llama_1b();
        let p = Pass {
            c: 4.0,
            ..pass(8.0, 4096.0)
        };
        let (t, bhss) = (p.t(), p.b * block.heads * p.s * p.s);
        assert_eq!(
            math_kernel_bytes(&block, &p),
            4.0 * t * block.q + 8.0 * t * block.q + 9.0 * bhss
        );
        // Falcon in bf16: fp32 copies of q, k and v and the scaled q; k stays one head.
        let (falcon, p) = (falcon_7b(), pass(4.0, 2048.0));
        let (t, bhss) = (p.t(), p.b * falcon.heads * p.s * p.s);
        assert_eq!(
            math_kernel_bytes(&falcon, &p),
            4.0 * t * (falcon.q + 2.0 * falcon.kv) + 4.0 * t * falcon.q + 9.0 * bhss
        );
    }

    #[test]
    fn sdpa_converts_a_windows_boolean_mask_to_the_query_dtype() {
        let (mut block, p) = (llama_1b(), pass(8.0, 32768.0));
        block.sliding_window = 4096.0;
        let (t, c, bss) = (p.t(), p.c, p.b * p.s * p.s);
        // Normed input, q, k, v, then k and v repeated beside the mask's two conversions
        // (RoPE's temporaries are gone by then).
        assert_eq!(
            attention_transient(&block, &p),
            t * block.h * c
                + t * c * (block.q + 2.0 * block.kv)
                + 2.0 * t * block.q * c
                + 3.0 * bss
        );
    }
}
