//! A checkpointed LoRA step's forward under autocast, replayed request by request through the
//! caching allocator, for the blocks it strands (issue 20).
//!
//! Under `torch.autocast` the weights and the residual stream are fp32, and gradient
//! checkpointing (`use_reentrant=False`) keeps only each layer's input: the embedding's output
//! and every layer's output, `4·T·h` each, alive until backward. Everything else a layer makes
//! is freed inside it, the largest being its MLP's: PEFT's fp32 copy of `down_proj`'s 16-bit
//! input (`4·T·ffn`, `_cast_input_dtype` to the adapter's dtype) and the 16-bit gate, up,
//! activation and product (`2·T·ffn`). The layer's output is allocated after those are freed,
//! into the smallest free block that holds it (`get_free_block`), which is one of them or of
//! an earlier layer's rests; it splits that block and stays there to the backward, so the
//! rest (`T·(4·ffn − 4·h)` or less) no longer holds the next layer's MLP tensors, which take
//! fresh segments. The H200's Qwen3-4B LoRA at 8 × 2,048 (`tests/data/h200d`) reserved 4.3 GiB
//! more than the count of two stranded tensors said, with the allocated peak exact; the oracle's
//! replay of the same run reserved the GPU's bytes to 2 MiB, and its event log shows one
//! such block per layer or two (`docs/oracle.md`, "The fifth lease"). How many layers strand,
//! and how much of each rest later blocks reuse, depends on every request before: this module
//! does not count it, it replays the forward on [`prefill_replay`]'s heap.
//!
//! The request sequence is transformers 5.17's Llama code (`models/llama/modeling_llama.py`;
//! Mistral runs the same, Qwen3 adds its per-head norms) under `torch.autocast(dtype=bf16)` with
//! fp32 weights, PEFT 0.21's LoRA on every linear layer (`peft/tuners/lora/layer.py`,
//! `Linear.forward`, `lora_dropout` 0) and SDPA's fused kernels, as the oracle's event logs of
//! two-layer Llama-3.2-1B, Qwen3-4B and Qwen2.5-1.5B show it (`tools/oracle/train_events.py`;
//! the fixtures beside this file; Qwen2's q, k and v biases are cast too, a few KiB each):
//!
//! | step | requests (`T = b·s`) | code |
//! |---|---|---|
//! | embedding | `4·T·h` (the fp32 table's rows; `embedding` is not on autocast's list), kept | `LlamaModel.forward` |
//! | rotary tables | the positions (`4·s`), cuBLAS's 32 MiB workspace, `inv_freq @ positions` (`4·s·head_dim/2`), `cat`, `cos`, `sin` and their scaled copies (`4·s·head_dim` each); the scaled copies are the tables (fp32: `cos.to(x.dtype)` of an fp32 `x`) | `LlamaRotaryEmbedding.forward` |
//! | `RMSNorm` of the fp32 stream | `pow(2)`, the normalised product, the weight's product (fp32: `.to(input_dtype)` is fp32) | `LlamaRMSNorm.forward` |
//! | a LoRA linear | the weight's 16-bit cast (`out·in·2`, not cached: the base weight needs no grad), the input's cast when it is fp32, the product, both freed; the input's fp32 copy when it is 16-bit; `lora_A`'s cast input and `T·r` output, `lora_B`'s `T·out`, `* scaling`, the sum with the base output (16-bit: autocast's `mm` outputs); the adapters' 16-bit weight casts are cached to the forward's end (they need grad) | `peft` `Linear.forward`, `aten/src/ATen/autocast_mode.cpp` |
//! | attention | q, k, v; Qwen3's per-head norms of the 16-bit projections (fp32 copy, `pow`, the normalised product, the cast back, the fp32 weight's product); `RoPE` (`q·cos` in fp32, `rotate_half`'s `neg` and `cat` in the input's dtype, `·sin`, the sum); SDPA's casts of q and k to bf16, its output and log-sum-exp (freed: nothing is saved); `o_proj`; the residual sum in fp32 | `LlamaAttention.forward`, `Qwen3Attention.forward` |
//! | MLP | `gate_proj`, `silu`, `up_proj`, their product, `down_proj`, the residual sum in fp32 (kept) | `LlamaMLP.forward` |
//! | head | the final norm; the head's 16-bit weight cast (`2·V·h`, saved: the head is not checkpointed) and its input's cast (`2·T·h`, freed after the logits' `mm`) | `LlamaForCausalLM.forward` |
//!
//! The replay stops before the logits, whose segments [`super::hf`] counts. Requests of a few
//! KiB at any shape (the norms' weights, Qwen2's bias casts, the position ids) are left out; the
//! adapters' weights and casts (`r·in`, `out·r`), the `T·r` adapter outputs and the norms'
//! per-row scalars are replayed, as they reach the large pool at high ranks and long contexts.

use std::sync::Mutex;

use super::prefill_replay::{self, CUBLAS_WORKSPACE, Decoder, Handle, Heap, Memo};

/// A checkpointed forward's heap at the end of its layers, final norm and the head's weight
/// cast, before the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Forward {
    /// Bytes of segments after the weights (`max_memory_reserved` there).
    pub weights_reserved: f64,
    /// Bytes of blocks the weights hold.
    pub weights_allocated: f64,
    /// Bytes of segments before the logits.
    pub reserved: f64,
    /// Bytes of live blocks there.
    pub allocated: f64,
}

impl Forward {
    /// What the forward leaves free in its segments beyond what the weights left: the blocks
    /// its layers stranded.
    pub(super) fn stranded(&self) -> f64 {
        ((self.reserved - self.allocated) - (self.weights_reserved - self.weights_allocated))
            .max(0.0)
    }
}

struct Run<'a> {
    heap: Heap,
    d: &'a Decoder,
    /// The adapters' rank.
    r: f64,
}

impl<'a> Run<'a> {
    fn new(d: &'a Decoder, r: f64) -> Self {
        Run {
            heap: Heap::default(),
            d,
            r,
        }
    }

    fn t(&self) -> f64 {
        self.d.b * self.d.s
    }

    fn a(&mut self, bytes: f64) -> Handle {
        self.heap.malloc(bytes)
    }

    fn f(&mut self, h: Handle) {
        self.heap.free(h);
    }

    /// The fp32 weights in `parameters()` order, each adapted linear's base weight followed by
    /// its `lora_A` (`r·in`) and `lora_B` (`out·r`): the embedding, each layer's seven
    /// linears, an untied head (not adapted: PEFT's `all-linear` leaves the output layer out).
    fn weights(&mut self) {
        let d = self.d;
        let r = self.r;
        self.a(4.0 * d.vocab * d.h);
        for _ in 0..d.layers {
            for (out, inp) in [
                (d.q, d.h),
                (d.kv, d.h),
                (d.kv, d.h),
                (d.h, d.q),
                (d.ffn, d.h),
                (d.ffn, d.h),
                (d.h, d.ffn),
            ] {
                self.a(4.0 * out * inp);
                self.a(4.0 * r * inp);
                self.a(4.0 * out * r);
            }
        }
        if !d.tied {
            self.a(4.0 * d.vocab * d.h);
        }
    }

    /// `LlamaRotaryEmbedding.forward` under autocast (it disables autocast for its matmul):
    /// the scaled fp32 `cos` and `sin` are the tables, kept.
    fn rotary_tables(&mut self) {
        let (s, hd) = (self.d.s, self.d.head_dim);
        let positions = self.a(4.0 * s);
        self.a(CUBLAS_WORKSPACE);
        let freqs = self.a(4.0 * s * hd / 2.0);
        let emb = self.a(4.0 * s * hd);
        let cos = self.a(4.0 * s * hd);
        self.a(4.0 * s * hd);
        self.f(cos);
        let sin = self.a(4.0 * s * hd);
        self.a(4.0 * s * hd);
        self.f(sin);
        for h in [positions, freqs, emb] {
            self.f(h);
        }
    }

    /// `LlamaRMSNorm.forward` of the fp32 stream (`width` columns, one row per token): its
    /// output, fp32.
    fn norm(&mut self, width: f64) -> Handle {
        let t = self.t();
        let pow = self.a(4.0 * t * width);
        let mean = self.a(4.0 * t);
        self.f(pow);
        let eps = self.a(4.0 * t);
        let rsqrt = self.a(4.0 * t);
        self.f(eps);
        let normed = self.a(4.0 * t * width);
        self.f(rsqrt);
        let out = self.a(4.0 * t * width);
        self.f(normed);
        self.f(mean);
        out
    }

    /// Qwen3's per-head `q_norm` or `k_norm` of a 16-bit projection of `width` columns: the
    /// fp32 copy, `pow(2)`, the per-row scalars (`4·T·width/head_dim`), the normalised
    /// product, the cast back to bf16 and the fp32 weight's product (its output, fp32).
    fn head_norm(&mut self, width: f64) -> Handle {
        let t = self.t();
        let rows = 4.0 * t * width / self.d.head_dim;
        let fp32 = self.a(4.0 * t * width);
        let pow = self.a(4.0 * t * width);
        let mean = self.a(rows);
        self.f(pow);
        let eps = self.a(rows);
        let rsqrt = self.a(rows);
        self.f(eps);
        let normed = self.a(4.0 * t * width);
        self.f(rsqrt);
        self.f(fp32);
        let cast = self.a(2.0 * t * width);
        let out = self.a(4.0 * t * width);
        self.f(cast);
        self.f(normed);
        self.f(mean);
        out
    }

    /// A LoRA linear (`in` → `out` columns) under autocast on an input that is fp32
    /// (`fp32_input`) or bf16: returns its bf16 output.
    fn linear(&mut self, fp32_input: bool, inp: f64, out: f64) -> Handle {
        let (t, r) = (self.t(), self.r);
        let weight = self.a(2.0 * out * inp);
        let cast = if fp32_input {
            self.a(2.0 * t * inp)
        } else {
            None
        };
        let base = self.a(2.0 * t * out);
        self.f(cast);
        self.f(weight);
        // PEFT casts the input to the adapter's dtype (fp32) before `lora_A`.
        let copy = if fp32_input {
            None
        } else {
            self.a(4.0 * t * inp)
        };
        // The adapters' 16-bit weight casts stay in autocast's cache to the forward's end,
        // past where the replay stops: never freed here.
        self.a(2.0 * r * inp);
        let a_input = self.a(2.0 * t * inp);
        let a_out = self.a(2.0 * t * r);
        self.f(a_input);
        self.a(2.0 * out * r);
        let b_out = self.a(2.0 * t * out);
        self.f(a_out);
        let scaled = self.a(2.0 * t * out);
        self.f(b_out);
        let sum = self.a(2.0 * t * out);
        self.f(scaled);
        self.f(base);
        self.f(copy);
        sum
    }

    /// `apply_rotary_pos_emb` on one projection of `width` columns whose elements are `x`
    /// bytes (bf16, or fp32 after Qwen3's norm): the fp32 rotated tensor.
    fn rope(&mut self, width: f64, x: f64) -> Handle {
        let t = self.t();
        let by_cos = self.a(4.0 * t * width);
        let neg = self.a(x * t * width / 2.0);
        let cat = self.a(x * t * width);
        self.f(neg);
        let by_sin = self.a(4.0 * t * width);
        self.f(cat);
        let sum = self.a(4.0 * t * width);
        self.f(by_cos);
        self.f(by_sin);
        sum
    }

    /// One checkpointed decoder layer on the fp32 stream `x` (kept by the caller): its output.
    fn layer(&mut self) -> Handle {
        let d = *self.d;
        let t = self.t();
        let n1 = self.norm(d.h);
        let (q, k, width_bytes) = if d.qk_norm {
            let q = self.linear(true, d.h, d.q);
            let qn = self.head_norm(d.q);
            self.f(q);
            let k = self.linear(true, d.h, d.kv);
            let kn = self.head_norm(d.kv);
            self.f(k);
            (qn, kn, 4.0)
        } else {
            let q = self.linear(true, d.h, d.q);
            let k = self.linear(true, d.h, d.kv);
            (q, k, 2.0)
        };
        let v = self.linear(true, d.h, d.kv);
        let q_rope = self.rope(d.q, width_bytes);
        let k_rope = self.rope(d.kv, width_bytes);
        self.f(q);
        self.f(k);
        // SDPA is on autocast's lower-precision list: q and k (fp32 after `RoPE`) are cast.
        let q_cast = self.a(2.0 * t * d.q);
        let k_cast = self.a(2.0 * t * d.kv);
        let attn = self.a(2.0 * t * d.q);
        let lse = self.a(4.0 * d.b * d.heads * d.s);
        self.f(lse);
        self.f(q_cast);
        self.f(k_cast);
        let o = self.linear(false, d.q, d.h);
        for h in [attn, q_rope, k_rope, v, n1] {
            self.f(h);
        }
        let r1 = self.a(4.0 * t * d.h);
        self.f(o);
        let n2 = self.norm(d.h);
        let gate = self.linear(true, d.h, d.ffn);
        let act = self.a(2.0 * t * d.ffn);
        self.f(gate);
        let up = self.linear(true, d.h, d.ffn);
        let product = self.a(2.0 * t * d.ffn);
        self.f(act);
        self.f(up);
        let down = self.linear(false, d.ffn, d.h);
        self.f(product);
        self.f(n2);
        let r2 = self.a(4.0 * t * d.h);
        self.f(down);
        self.f(r1);
        r2
    }

    /// The forward's layers, final norm and the head's casts: every layer's input is kept (the
    /// checkpoints), and so is the head's 16-bit weight (`2·V·h`, saved for backward: the head
    /// is not checkpointed); the normed output's cast (`2·T·h`) is freed once the logits'
    /// `mm` is made, which is where the replay stops.
    fn forward(&mut self) {
        let d = *self.d;
        let t = self.t();
        self.a(4.0 * t * d.h);
        self.rotary_tables();
        for _ in 0..d.layers {
            self.layer();
        }
        self.norm(d.h);
        self.a(2.0 * d.vocab * d.h);
        let cast = self.a(2.0 * t * d.h);
        self.f(cast);
    }
}

/// Replays `d`'s fp32 weights with rank-`r` adapters on every linear and a checkpointed
/// forward under autocast up to the logits (the final norm and the head's casts made). Answered from a memo for a shape already
/// replayed ([`prefill_replay::memoized`]).
pub(super) fn replay(d: &Decoder, r: f64) -> Forward {
    static REPLAYS: Memo<(Decoder, u64), Forward> = Mutex::new(Vec::new());
    prefill_replay::memoized(&REPLAYS, (*d, r.to_bits()), || replay_uncached(d, r))
}

fn replay_uncached(d: &Decoder, r: f64) -> Forward {
    let mut run = Run::new(d, r);
    run.weights();
    let weights_reserved = run.heap.reserved();
    let weights_allocated = run.heap.allocated();
    run.forward();
    Forward {
        weights_reserved,
        weights_allocated,
        reserved: run.heap.reserved(),
        allocated: run.heap.allocated(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::estimate::prefill_replay::{Layer, assert_same_log, oracle_log};

    fn llama32_1b(layers: usize, b: f64, s: f64) -> Decoder {
        Decoder {
            b,
            s,
            c: 2.0,
            h: 2048.0,
            q: 2048.0,
            kv: 512.0,
            heads: 32.0,
            head_dim: 64.0,
            ffn: 8192.0,
            vocab: 128_256.0,
            layers,
            qk_norm: false,
            tied: true,
            eager: None,
            layer: Layer::Llama,
            window: None,
        }
    }

    fn qwen3_4b(layers: usize, b: f64, s: f64) -> Decoder {
        Decoder {
            h: 2560.0,
            q: 4096.0,
            kv: 1024.0,
            heads: 32.0,
            head_dim: 128.0,
            ffn: 9728.0,
            vocab: 151_936.0,
            qk_norm: true,
            ..llama32_1b(layers, b, s)
        }
    }

    /// The large pool's log after the weights, as the oracle's fixtures keep it.
    fn large_log(d: &Decoder, r: f64) -> Vec<i64> {
        let mut run = Run::new(d, r);
        run.weights();
        let from = run.heap.log.len();
        run.forward();
        let large = |x: &&i64| x.unsigned_abs() > 1_048_576;
        run.heap.log[from..].iter().filter(large).copied().collect()
    }

    fn same_log(oracle: &str, d: &Decoder, r: f64) {
        let mut ours = large_log(d, r);
        // The head's input cast is freed after the logits' `mm`, before which the oracle's log
        // is cut.
        assert!(ours.pop().is_some_and(|x| x < 0));
        assert_same_log(&oracle_log(oracle), &ours);
    }

    /// The oracle's event log of a two-layer Llama-3.2-1B, LoRA rank 16 on every linear,
    /// `fp16-amp` (fp32 weights under bf16 autocast), 1 × 1,024, checkpointed
    /// (`tools/oracle/train_events.py --grid --steps 2`, the config cut to two layers; the large
    /// pool's blocks after the weights, up to the logits' `mm`): every request and free.
    #[test]
    fn llama_forward_requests_what_the_oracles_log_requests() {
        same_log(
            include_str!("lora_replay/oracle-llama32-1b-2-layers-b1-1k-amp-r16.txt"),
            &llama32_1b(2, 1.0, 1024.0),
            16.0,
        );
    }

    /// Qwen3's per-head norms make the rotated q and k fp32 (Qwen3-4B, two layers, the same
    /// settings).
    #[test]
    fn qwen3_forward_requests_what_the_oracles_log_requests() {
        same_log(
            include_str!("lora_replay/oracle-qwen3-4b-2-layers-b1-1k-amp-r16.txt"),
            &qwen3_4b(2, 1.0, 1024.0),
            16.0,
        );
    }

    fn qwen25_15b(layers: usize, b: f64, s: f64) -> Decoder {
        Decoder {
            h: 1536.0,
            q: 1536.0,
            kv: 256.0,
            heads: 12.0,
            head_dim: 128.0,
            ffn: 8960.0,
            vocab: 151_936.0,
            ..llama32_1b(layers, b, s)
        }
    }

    /// Qwen2's q, k and v biases (Qwen2.5-1.5B, two layers, the same settings): autocast casts
    /// each bias too, a few KiB, so the large pool's requests are Llama's.
    #[test]
    fn biased_forward_requests_what_the_oracles_log_requests() {
        same_log(
            include_str!("lora_replay/oracle-qwen25-1.5b-2-layers-b1-1k-amp-r16.txt"),
            &qwen25_15b(2, 1.0, 1024.0),
            16.0,
        );
    }

    /// The oracle's allocator replays of whole models, rank 16 under `fp16-amp`, checkpointed
    /// (`tools/oracle/train_events.py --grid --steps 2 ID`, its allocator walked to the logits'
    /// `mm`, the head's input cast counted free; the head's weight cast takes a block the layers
    /// left free on three of them, a fresh segment on the others): the replay reserves what the
    /// oracle reserves there, less at most two 2 MiB
    /// small-pool segments (the requests of a few KiB it leaves out), and leaves free what the
    /// oracle leaves free to 0.1 %. Qwen3-4B at 8 × 2,048 is the H200 row
    /// `h200d-qwen3-4b-lora16-amp-b8-2k-gc` (`tests/data/h200d`), whose GPU reserved the
    /// oracle's 59.26 GiB over the whole step.
    #[test]
    fn whole_models_strand_what_the_oracles_replays_strand() {
        let mistral_7b = |b, s| Decoder {
            h: 4096.0,
            q: 4096.0,
            kv: 1024.0,
            heads: 32.0,
            head_dim: 128.0,
            ffn: 14_336.0,
            vocab: 32_768.0,
            tied: false,
            ..llama32_1b(32, b, s)
        };
        let llama32_3b = |b, s| Decoder {
            h: 3072.0,
            q: 3072.0,
            kv: 1024.0,
            heads: 24.0,
            head_dim: 128.0,
            ..llama32_1b(28, b, s)
        };
        // (shape, the oracle's reserved and allocated bytes before the logits' `mm`)
        let cases = [
            (
                qwen3_4b(36, 8.0, 2048.0),
                28_309_454_848.0,
                23_590_812_672.0,
            ),
            (
                qwen3_4b(36, 4.0, 2048.0),
                22_764_584_960.0,
                20_403_043_328.0,
            ),
            (mistral_7b(4.0, 2048.0), 36_796_628_992.0, 34_111_357_952.0),
            (
                llama32_1b(16, 8.0, 2048.0),
                9_221_177_344.0,
                7_986_963_456.0,
            ),
            (llama32_3b(4.0, 4096.0), 23_307_747_328.0, 19_864_237_056.0),
            (
                qwen25_15b(28, 8.0, 2048.0),
                12_419_334_144.0,
                9_808_944_128.0,
            ),
        ];
        for (d, reserved, allocated) in cases {
            let f = replay(&d, 16.0);
            let short = (reserved - f.reserved) / 1_048_576.0;
            assert!(
                (0.0..=4.0).contains(&short),
                "{d:?}: reserved {short} MiB short"
            );
            let free = reserved - allocated;
            let ours = f.reserved - f.allocated;
            assert!(
                (ours / free - 1.0).abs() < 1e-3,
                "{d:?}: free {ours} against {free}"
            );
        }
    }
}
