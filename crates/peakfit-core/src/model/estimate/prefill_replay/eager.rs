//! Eager attention's requests in the replayed prefill (issue 20): the score matrix a layer
//! materialises, its fp32 softmax, and the causal mask the forward builds for it.
//!
//! `eager_attention_forward` (transformers 5.17 `models/llama/modeling_llama.py`; `SmolLM2` runs
//! Llama's code) makes, per layer and in this order, as the oracle's event log of SmolLM2-1.7B at
//! 16 × 1,984 shows it tensor for tensor (`docs/oracle.md`, "Eager attention's reserved memory"):
//!
//! | step | request (`n = b·heads·s·(past+s)` scores) | code |
//! |---|---|---|
//! | q made contiguous | `T·q·c`, freed after the product (none at one token: the view folds) | `torch.matmul` (`_matmul_impl`'s `reshape` of the rotated q, which keeps `q_proj`'s `b·s·heads·d` layout) |
//! | `q·kᵀ`, `· scaling`, `+ mask` | `c·n` each, each freeing the one before | `eager_attention_forward` |
//! | softmax in fp32, back to `c` | bf16: the fp32 copy and the fp32 output (the copy freed), then `c·n`; fp16: the fp32 output (`half_to_float`), then `c·n`; fp32: one `4·n` (`to` is a no-op); the masked scores freed last | `softmax` in `aten/src/ATen/native/SoftMax.cpp` |
//! | `probs · v` and its `transpose(1, 2).contiguous()` | `T·q·c` each, the first freed after the second | `eager_attention_forward` |
//! | the probabilities | kept until the decoder layer returns: `LlamaDecoderLayer.forward` binds them to `_` | `LlamaDecoderLayer.forward` |
//! | the mask, once per forward | `s·S` booleans twice, `b·s·S` booleans, then the `c·b·s·S` float mask, kept to the end of the forward | `masking_utils.eager_mask` (`sdpa_mask`, `torch.where(mask, 0, min)`) |
//!
//! These blocks are the largest of the run by far, freed between layers; the cache's copies and
//! the MLP's blocks carve the freed ones, and later layers' scores take fresh segments. Which ones
//! depends on every request before, which is why this is replayed and not counted.

#[cfg(test)]
use super::Decoder;
use super::{Handle, Run};
use crate::model::estimate::prefill_replay::FreeBlocks;

/// How `softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)` allocates on CUDA
/// (`aten/src/ATen/native/SoftMax.cpp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::model::estimate) enum Softmax {
    /// fp32 scores: `toType` and `to` return their input; one `4·n` output.
    Fp32,
    /// A CUDA `Half` input goes to `_softmax(half_to_float=true)`: the fp32 output only.
    HalfToFloat,
    /// Every other 16-bit input (`BFloat16`) is copied to fp32 first, then softmaxed.
    Copy,
}

impl<P: FreeBlocks> Run<'_, P> {
    /// The eager mask of a forward over `s` new tokens with `past` cached: returns the float
    /// mask, which lives until the forward ends.
    pub(super) fn eager_mask(&mut self, s: f64, past: f64) -> Handle {
        let d = *self.d;
        let keys = past + s;
        let a = self.heap.malloc(s * keys);
        let b = self.heap.malloc(s * keys);
        self.heap.free(a);
        let batch = self.heap.malloc(d.b * s * keys);
        self.heap.free(b);
        let mask = self.heap.malloc(d.c * d.b * s * keys);
        self.heap.free(batch);
        mask
    }

    /// Eager attention over `s` new tokens with `past` cached, after the cache's copies: returns
    /// `o_proj`'s output and the probabilities the layer keeps until it returns.
    pub(super) fn eager_attention(
        &mut self,
        softmax: Softmax,
        s: f64,
        past: f64,
    ) -> (Handle, Handle) {
        let d = *self.d;
        let (t, c) = (d.b * s, d.c);
        let n = d.b * d.heads * s * (past + s);
        let q = if s > 1.0 {
            self.heap.malloc(t * d.q * c)
        } else {
            None
        };
        let product = self.heap.malloc(c * n);
        self.heap.free(q);
        let scaled = self.heap.malloc(c * n);
        self.heap.free(product);
        let masked = self.heap.malloc(c * n);
        self.heap.free(scaled);
        let probs = match softmax {
            Softmax::Fp32 => self.heap.malloc(4.0 * n),
            Softmax::HalfToFloat => {
                let wide = self.heap.malloc(4.0 * n);
                let probs = self.heap.malloc(c * n);
                self.heap.free(wide);
                probs
            }
            Softmax::Copy => {
                let copy = self.heap.malloc(4.0 * n);
                let wide = self.heap.malloc(4.0 * n);
                self.heap.free(copy);
                let probs = self.heap.malloc(c * n);
                self.heap.free(wide);
                probs
            }
        };
        self.heap.free(masked);
        let out = self.heap.malloc(t * d.q * c);
        let contiguous = self.heap.malloc(t * d.q * c);
        self.heap.free(out);
        let o = self.heap.malloc(t * d.h * c);
        self.heap.free(contiguous);
        (o, probs)
    }
}

/// SmolLM2-1.7B (Llama's code, 32 heads of 64, tied head) at 16 × 1,984: the H100's eager
/// rows' prefill, for the tests here and in `hf`.
#[cfg(test)]
pub(in crate::model::estimate) fn smollm2(c: f64, eager: Option<Softmax>) -> Decoder {
    Decoder {
        b: 16.0,
        s: 1984.0,
        c,
        h: 2048.0,
        q: 2048.0,
        kv: 2048.0,
        heads: 32.0,
        head_dim: 64.0,
        ffn: 8192.0,
        vocab: 49_152.0,
        layers: 24,
        qk_norm: false,
        tied: true,
        eager,
    }
}

#[cfg(test)]
mod tests {
    use super::super::replay;
    use super::{Softmax, smollm2};

    const MIB: f64 = 1_048_576.0;

    /// The oracle's run of these shapes (`tools/oracle`, `_run_case` with 2 new tokens and every
    /// decode step, 2026-11-27) reserves 37,323,014,144 B at 30,506,523,648 B of allocated blocks
    /// in bf16 and 33,292,288,000 at 26,475,797,504 in fp16: 6,816,490,496 B of slack in both
    /// (the fp16 prefill holds one fp32 block fewer at its peak and reserves one fewer). The
    /// replay, weights first, leaves the same to 0.02 MiB (the small pool's requests it leaves
    /// out); SDPA's sequence on the same shape leaves 1,421 MiB.
    #[test]
    fn the_eager_prefill_strands_what_the_oracles_replay_strands() {
        let oracle = 6_816_490_496.0;
        for softmax in [Softmax::Copy, Softmax::HalfToFloat] {
            let r = replay(&smollm2(2.0, Some(softmax)));
            let slack = r.prefill_slack + r.decode_fresh;
            assert!((slack - oracle).abs() < MIB, "{softmax:?}: {}", slack / MIB);
        }
        let sdpa = replay(&smollm2(2.0, None));
        assert!(sdpa.prefill_slack + sdpa.decode_fresh < oracle / 4.0);
    }

    /// fp32 eager: `softmax` and `to(float32)` return their input, so each layer asks for three
    /// `4·n` blocks and one more (the output), never two fp32 copies at once: its prefill
    /// strands less than bf16's, whose copy and output are both alive.
    #[test]
    fn fp32_softmax_makes_one_block_where_bf16_makes_two() {
        let fp32 = replay(&smollm2(4.0, Some(Softmax::Fp32)));
        let bf16 = replay(&smollm2(2.0, Some(Softmax::Copy)));
        let n = 16.0 * 32.0 * 1984.0 * 1984.0;
        assert!(fp32.prefill_slack < bf16.prefill_slack + 4.0 * n);
        assert!(fp32.prefill_slack >= 0.0);
    }
}
