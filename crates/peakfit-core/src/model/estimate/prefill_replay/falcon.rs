//! Falcon-7B's layer in the replayed prefill (issue 20): `modeling_falcon.py` with one kv head
//! (`multi_query`, not `new_decoder_architecture`), attention beside the MLP (`parallel_attn`)
//! and rotary positions (no `alibi`), as transformers 5.17 runs it under SDPA.
//!
//! `FalconAttention.forward` hands `F.scaled_dot_product_attention` 71 query heads, one kv head,
//! no `enable_gqa` and always a mask, so neither cuDNN, flash nor the memory-efficient kernel
//! takes the call and torch's math kernel runs (`docs/oracle.md`, "The math kernel: Falcon and
//! fp32 on grouped heads"): its fp32 score blocks are the run's largest, and which free block
//! each lands in decides the reserved memory (`docs/oracle.md`, "Falcon in the prefill replay").
//! The requests, per layer and in this order, as the oracle's event log of Falcon-7B shows them
//! tensor for tensor (`T = b·s` new tokens, `S = past + s` keys, `n = b·heads·s·S` scores, `c`
//! the compute width, one kv head of `d` values):
//!
//! | step | requests | code |
//! |---|---|---|
//! | `input_layernorm` | the output `T·h·c`, kept to the layer's end (the MLP reads it too), and the fp32 mean and rstd (`4·T` each, freed at once) | `FalconDecoderLayer.forward`; `layer_norm_cuda` (`aten/src/ATen/native/cuda/layer_norm_kernel.cu`) |
//! | fused projection | `T·(q + 2d)·c`, kept to `dense`: q is a view of it | `FalconAttention.query_key_value` (`FalconLinear`: `input @ weight.T`) |
//! | k and v | `fused_qkv[..., [-2], :]` and `[[-1]]`: advanced indexing copies each, `T·d·c` | `FalconAttention._split_heads` |
//! | `RoPE` | on q, then k, as Llama's (`q·cos`, `-x2`, `cat`, `·sin`, the sum); the unrotated k freed | `apply_rotary_pos_emb` |
//! | cache | the key's and value's `torch.cat` copies; the rotated k and the value freed | `DynamicLayer.update` |
//! | the mask's conversion | `logical_not` (`b·s·S` booleans, freed) and the `c`-wide float mask, alive through the kernel | `convert_boolean_attn_mask` (`attention.cpp`) |
//! | math kernel | fp32 copies of q (`4·T·q`), k and v (`4·b·S·d` each; none in fp32: `to` returns its input); q and kᵀ scaled (`4·T·q`, `4·b·S·d`); at batch > 1 `matmul`'s copies of q (prompt only) and of k broadcast to every head (`4·b·heads·S·d`); the scores `4·n`; `+ mask` (`4·n`); `_safe_softmax`'s output (`4·n`), its `isneginf` boolean (`n`) and `all` over each row (`b·heads·s`); the probabilities in `c` (`c·n`, dropped at return); at batch > 1 v broadcast to every head; `probs · v` (`4·T·q`) and its cast to `c` | `_scaled_dot_product_attention_math`, `_safe_softmax` (`attention.cpp`), `_matmul_impl` (`LinearAlgebra.cpp`) |
//! | heads merged | `permute(0, 2, 1, 3).reshape`: a copy `T·q·c` when `s > 1` (a view at one token) | `FalconAttention.forward` |
//! | `dense` | `T·h·c`; the fused projection and the rotated q freed | `FalconAttention.dense` |
//! | MLP | `dense_h_to_4h` (`T·ffn·c`), GELU (`T·ffn·c`, the first freed), `dense_4h_to_h` (`T·h·c`), added to the attention's output in place | `FalconMLP.forward`, `FalconDecoderLayer.forward` (`mlp_output += attention_output`) |
//! | residual | `residual + mlp_output` (`T·h·c`; dropout in eval returns its input); the norm's output, `dense`'s and the MLP's freed | `dropout_add` |
//!
//! Once per forward, after the embeddings: `create_causal_mask(allow_is_causal_skip=False)`
//! (`sdpa_mask`) builds the `b·s·S` boolean mask every layer converts, kept to the forward's
//! end; the final `ln_f` is a `LayerNorm`. The rotary tables, the head and `generate`'s inputs
//! are Llama's ([`super`]).

use super::{Decoder, FreeBlocks, Handle, Run};

/// `ln_f`'s weight and bias.
pub(super) const FINAL_NORM_PARAMETERS: usize = 2;

/// One `FalconDecoderLayer`'s parameters in `model.parameters()` order, in values:
/// `query_key_value`, `dense`, `dense_h_to_4h`, `dense_4h_to_h`, then `input_layernorm`'s weight
/// and bias (no biases on the linears: Falcon-7B's `bias` is false).
pub(super) fn layer_parameters(d: &Decoder) -> Vec<f64> {
    vec![
        (d.q + 2.0 * d.kv) * d.h,
        d.h * d.q,
        d.ffn * d.h,
        d.h * d.ffn,
        d.h,
        d.h,
    ]
}

impl<P: FreeBlocks> Run<'_, P> {
    /// `create_causal_mask` as `FalconModel.forward` calls it (`allow_is_causal_skip=False`),
    /// over `s` new tokens with `past` cached: `attention_mask.to(bool)` (`b·S`), the query's
    /// and the keys' positions (`arange` and `+ offset`, `8·s` and `8·S`), the causal `le`
    /// and its `&` (`s·S` each), the padding mask's `index` (`b·S`) and the batch's `&`
    /// (`b·s·S`, returned: it lives to the forward's end).
    pub(super) fn falcon_mask(&mut self, s: f64, past: f64) -> Handle {
        let d = *self.d;
        let keys = past + s;
        let flags = self.heap.malloc(d.b * keys);
        let at = self.heap.malloc(8.0 * s);
        let q_positions = self.heap.malloc(8.0 * s);
        self.heap.free(at);
        let at = self.heap.malloc(8.0 * keys);
        let kv_positions = self.heap.malloc(8.0 * keys);
        self.heap.free(at);
        let mask = self.causal_mask(s, past, d.b * keys);
        for h in [q_positions, kv_positions, flags] {
            self.heap.free(h);
        }
        mask
    }

    /// A `LayerNorm` over `n` rows of `h`: the output, and the fp32 mean and rstd that
    /// `layer_norm_cuda` makes after it and `F.layer_norm` drops.
    pub(super) fn layer_norm(&mut self, n: f64) -> Handle {
        let out = self.heap.malloc(n * self.d.h * self.d.c);
        let mean = self.heap.malloc(4.0 * n);
        let rstd = self.heap.malloc(4.0 * n);
        self.heap.free(mean);
        self.heap.free(rstd);
        out
    }

    /// `FalconDecoderLayer.forward` over `s` new tokens with `past` cached: returns its output.
    pub(super) fn falcon_layer(&mut self, i: usize, s: f64, past: f64) -> Handle {
        let d = *self.d;
        let (t, c) = (d.b * s, d.c);
        let normed = self.layer_norm(t);
        let fused = self.heap.malloc(t * (d.q + 2.0 * d.kv) * c);
        let k = self.heap.malloc(t * d.kv * c);
        let v = self.heap.malloc(t * d.kv * c);
        let qe = self.rope(t, d.q);
        let ke = self.rope(t, d.kv);
        self.heap.free(k);
        self.cache_update(i, s, past);
        self.heap.free(ke);
        self.heap.free(v);
        let out = self.math_attention(s, past);
        let merged = if s > 1.0 {
            self.heap.malloc(t * d.q * c)
        } else {
            None
        };
        self.heap.free(out);
        let attn = self.heap.malloc(t * d.h * c);
        self.heap.free(merged);
        self.heap.free(fused);
        self.heap.free(qe);
        let up = self.heap.malloc(t * d.ffn * c);
        let act = self.heap.malloc(t * d.ffn * c);
        self.heap.free(up);
        let down = self.heap.malloc(t * d.h * c);
        self.heap.free(act);
        let sum = self.heap.malloc(t * d.h * c);
        for h in [normed, attn, down] {
            self.heap.free(h);
        }
        sum
    }

    /// `F.scaled_dot_product_attention` with Falcon's boolean mask, run by the math kernel over
    /// `s` new tokens and `past + s` keys of one kv head: returns its output in `c`
    /// (`4·T·q` in fp32, where the cast back is the tensor itself).
    fn math_attention(&mut self, s: f64, past: f64) -> Handle {
        let d = *self.d;
        let (t, c, keys) = (d.b * s, d.c, past + s);
        let n = d.b * d.heads * s * keys;
        // `convert_boolean_attn_mask`: `where(mask.logical_not(), -inf, 0)` in the query's dtype.
        let not = self.heap.malloc(d.b * s * keys);
        let mask = self.heap.malloc(c * d.b * s * keys);
        self.heap.free(not);
        // `query_.to(at::kFloat)`, k's, v's and the casts back: copies unless the model is
        // fp32 (`Tensor.to` returns the tensor itself).
        let cast = |run: &mut Self, bytes: f64| {
            if c == 4.0 {
                None
            } else {
                run.heap.malloc(bytes)
            }
        };
        let qf = cast(self, 4.0 * t * d.q);
        let kf = cast(self, 4.0 * d.b * keys * d.kv);
        let vf = cast(self, 4.0 * d.b * keys * d.kv);
        let qs = self.heap.malloc(4.0 * t * d.q);
        let ks = self.heap.malloc(4.0 * d.b * keys * d.kv);
        // `matmul` folds q's and k's batch and head dimensions into one: a view at batch 1, a
        // copy beyond it (q keeps the fused projection's token-major layout through RoPE, k is
        // broadcast from one head).
        let batched = d.b > 1.0;
        let qc = if batched && s > 1.0 {
            self.heap.malloc(4.0 * t * d.q)
        } else {
            None
        };
        let kc = if batched {
            self.heap.malloc(4.0 * d.b * d.heads * keys * d.head_dim)
        } else {
            None
        };
        let scores = self.heap.malloc(4.0 * n);
        self.heap.free(kc);
        self.heap.free(qc);
        self.heap.free(ks);
        let masked = self.heap.malloc(4.0 * n);
        self.heap.free(scores);
        // `_safe_softmax`: the softmax, `isneginf`, `all` over the last dimension.
        let probs = self.heap.malloc(4.0 * n);
        let neginf = self.heap.malloc(n);
        let rows = self.heap.malloc(d.b * d.heads * s);
        self.heap.free(rows);
        self.heap.free(neginf);
        self.heap.free(masked);
        let narrow = cast(self, c * n);
        let vc = if batched {
            self.heap.malloc(4.0 * d.b * d.heads * keys * d.head_dim)
        } else {
            None
        };
        let wide = self.heap.malloc(4.0 * t * d.q);
        self.heap.free(vc);
        let out = if c == 4.0 {
            wide
        } else {
            let out = self.heap.malloc(t * d.q * c);
            self.heap.free(wide);
            out
        };
        for h in [probs, qs, vf, kf, qf, narrow, mask] {
            self.heap.free(h);
        }
        out
    }
}

/// Falcon-7B (`tiiuae/falcon-7b`'s config: 71 heads of 64, one kv head, tied head) at `b × s`.
#[cfg(test)]
pub(in crate::model::estimate) fn falcon7b(b: f64, s: f64) -> Decoder {
    Decoder {
        b,
        s,
        c: 2.0,
        h: 4544.0,
        q: 4544.0,
        kv: 64.0,
        heads: 71.0,
        head_dim: 64.0,
        ffn: 18176.0,
        vocab: 65024.0,
        layers: 32,
        qk_norm: false,
        tied: true,
        eager: None,
        layer: super::Layer::Falcon,
        window: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Decoder, large_pool, oracle_log, replay, two_token_log};
    use super::falcon7b;

    const MIB: f64 = 1_048_576.0;

    /// Request for request: the oracle's event log of a 2-layer Falcon-7B bf16 `generate` at
    /// 4 × 2,100 with 2 new tokens (`tools/oracle/events.py --config
    /// tests/data/h100/configs/h100-falcon-7b-b1-8k.json --layers 2 --batch 4 --context-tokens
    /// 2102 --new-tokens 2 --large`: `_run_case(..., decode="all")`'s `_events` from the weights'
    /// `empty_cache()` to the end, allocations as their 512-byte blocks and frees negative, the
    /// large pool's only), in `oracle-falcon7b-2-layers.txt`:
    /// the prefill, the decode step and the cache freed at the end, 223 blocks, are the replay's
    /// in the same order (the mask, the fused projection's k and v copies, the math kernel's fp32
    /// copies, `matmul`'s broadcast copies at batch 4, `_safe_softmax`'s boolean, the merged
    /// heads' copy in the prefill and none at one token). Frees in a row are compared as a set:
    /// the allocator's state after them is the same in any order (`try_merge_blocks` joins the
    /// same neighbours), and `FalconModel.forward`'s locals (the last layer's output, held by
    /// its `outputs` tuple, the embeddings, the mask) die in Python's order at its return.
    #[test]
    fn falcons_layers_request_the_oracles_blocks_in_its_order() {
        let oracle = oracle_log(include_str!("oracle-falcon7b-2-layers.txt"));
        let d = Decoder {
            layers: 2,
            ..falcon7b(4.0, 2100.0)
        };
        let replayed = two_token_log(&d);
        assert_eq!(replayed.len(), 223);
        assert_eq!(frees_as_sets(&replayed), frees_as_sets(&oracle));
    }

    /// A log with each run of frees sorted.
    fn frees_as_sets(log: &[i64]) -> Vec<i64> {
        let mut out = log.to_vec();
        for run in out.chunk_by_mut(|a, b| (*a < 0) == (*b < 0)) {
            if run[0] < 0 {
                run.sort_unstable();
            }
        }
        out
    }

    /// The oracle's allocator replay of Falcon-7B `generate`s (`tools/oracle` `_run_case` with
    /// `decode="synth"` on `tests/data/h100/configs/h100-falcon-7b-b1-8k.json`, 2026-11-27:
    /// `reserved_breakdown_bytes.large_pool`), the two H100 rows' shapes and seven it was not
    /// measured on (other batches and prompts, fp16, fp32), against the replay's heap after the
    /// weights, the prefill and every decode step: the same large pool to the byte. The second
    /// 4,474 MiB `isneginf` segment of the 1 × 8,192 row (`docs/oracle.md`, "Three H100 rows
    /// the model read low") is in it.
    #[test]
    fn the_replay_reserves_the_oracles_large_pool_on_falcon_shapes() {
        for (b, context, new, c, oracle) in [
            (1.0, 8192.0, 64_u32, 2.0, 61_914_218_496.0),
            (4.0, 2048.0, 64, 2.0, 25_142_755_328.0),
            (1.0, 2048.0, 64, 2.0, 16_710_107_136.0),
            (2.0, 4096.0, 64, 2.0, 35_894_853_632.0),
            (8.0, 1024.0, 64, 2.0, 19_742_588_928.0),
            (16.0, 512.0, 32, 2.0, 17_387_487_232.0),
            // fp16: the same upcasts as bf16.
            (1.0, 4096.0, 64, 2.0, 25_952_256_000.0),
            // fp32: no upcasts, no casts back.
            (2.0, 2048.0, 64, 4.0, 33_468_448_768.0),
            (3.0, 3000.0, 100, 2.0, 31_310_479_360.0),
        ] {
            let d = Decoder {
                c,
                ..falcon7b(b, context - f64::from(new))
            };
            assert_eq!(large_pool(&d, new), oracle, "{b} × {context}, {c} bytes");
        }
    }

    /// The H100 rows' slack as the model takes it ([`replay`]: reserved after the decode steps
    /// − the prefill's allocated peak) against the oracle's (`peak_reserved_bytes −
    /// allocated_blocks`, as above): 4,906,713,600 B at 1 × 8,128 (prompt) and 461,139,968 B
    /// at 4 × 1,984. The replay is 4 and 6 MiB short: the small pool's 2 MiB segments of
    /// `generate`'s few-KiB requests, which it leaves out. The model's analytic count (two MLP
    /// blocks, 564 MiB at 1 × 8k) read the first row 5.9 % low.
    #[test]
    fn the_h100_rows_slack_is_the_oracles() {
        for (b, s, oracle) in [(1.0, 8128.0, 4_906_713_600.0), (4.0, 1984.0, 461_139_968.0)] {
            let r = replay(&falcon7b(b, s));
            let slack = r.prefill_slack + r.decode_fresh;
            assert!(
                (0.0..=8.0 * MIB).contains(&(oracle - slack)),
                "{b} × {s}: {}",
                slack / MIB
            );
        }
    }
}
