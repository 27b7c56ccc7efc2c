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
        let batch = if d.window.is_some() {
            self.sliding_window_mask(s, past)
        } else {
            self.causal_mask(s, past, 0.0)
        };
        let mask = self.heap.malloc(d.c * d.b * s * self.keys(s, past));
        self.heap.free(batch);
        mask
    }

    /// `sdpa_mask`'s boolean over `s` new tokens with `past` cached: the causal `le` and its
    /// `&` (`s·S` booleans each), then the padding mask's `index` (`index` bytes; the eager
    /// replay leaves its few KiB out) and the batch's `&` (`b·s·S`), returned.
    pub(super) fn causal_mask(&mut self, s: f64, past: f64, index: f64) -> Handle {
        let d = *self.d;
        let keys = past + s;
        let a = self.heap.malloc(s * keys);
        let b = self.heap.malloc(s * keys);
        self.heap.free(a);
        let padding = self.heap.malloc(index);
        let batch = self.heap.malloc(d.b * s * keys);
        self.heap.free(padding);
        self.heap.free(b);
        batch
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
        let n = d.b * d.heads * s * self.keys(s, past);
        // Phi-3's rotated q is a `cat`'s output, contiguous already.
        let q = if s > 1.0 && d.layer != super::Layer::Phi3 {
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
        layer: super::Layer::Llama,
        window: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Decoder, Heap, Run, ScannedBlocks, oracle_log, replay};
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

    /// Short prompts, where the probabilities kept through the MLP and the q copy are the size
    /// of the MLP's blocks: the oracle's runs (as above) reserve 3,762,290,688 B at
    /// 3,649,920,000 B allocated (bf16, 1 × 512) and 4,565,499,904 at 4,229,683,712 (4 × 510).
    /// The replay leaves 107.16 and 318.26 MiB, the oracle 107.16 and 320.26: at 4 × 510 the
    /// oracle's small pool holds one 2 MiB segment more, of the few-KiB requests the replay
    /// leaves out.
    #[test]
    fn short_eager_prefills_strand_what_the_oracles_replay_strands() {
        for (b, s, oracle) in [(1.0, 512.0, 112_370_688.0), (4.0, 510.0, 335_816_192.0)] {
            let d = Decoder {
                b,
                s,
                ..smollm2(2.0, Some(Softmax::Copy))
            };
            let r = replay(&d);
            let slack = r.prefill_slack + r.decode_fresh;
            assert!(
                (slack - oracle).abs() <= 2.0 * MIB,
                "{b} × {s}: {}",
                slack / MIB
            );
        }
    }

    /// Request for request: the oracle's event log of a 2-layer SmolLM2-1.7B bf16 prefill at
    /// 16 × 1,984 (`oracle._run_case(..., new_tokens=2, attention="eager", decode="all")`, its
    /// `_events` from the weights' `empty_cache()` to the first decode call, allocations as
    /// their 512-byte blocks and frees negative, the large pool's only), in
    /// `oracle-smollm2-eager-2-layers.txt`: the replay's forward logs 204 blocks, and its first
    /// 203 are the oracle's first 203 in the same order (the mask's four, the q copy before the
    /// scores, the probabilities freed after the layer's residual sum and the contiguous output
    /// included); the last, the 1.5 MiB logits freed, comes in the oracle after `generate`'s
    /// 3 MiB fp32 logits processing, which the replay leaves out.
    #[test]
    fn the_eager_layers_request_the_oracles_blocks_in_its_order() {
        let oracle = oracle_log(include_str!("oracle-smollm2-eager-2-layers.txt"));
        let d = Decoder {
            layers: 2,
            ..smollm2(2.0, Some(Softmax::Copy))
        };
        let mut run = Run::<ScannedBlocks> {
            heap: Heap::default(),
            d: &d,
            cache: vec![(None, None); d.layers],
            cublas: None,
        };
        run.weights();
        let from = run.heap.log.len();
        let _ = run.forward(d.s, 0.0);
        let large = |x: &&i64| x.unsigned_abs() > 1_048_576;
        let replayed: Vec<i64> = run.heap.log[from..].iter().filter(large).copied().collect();
        assert_eq!(replayed.len(), 204);
        assert_eq!(replayed[..203], oracle[..203]);
    }

    /// The score-sized requests one layer's eager attention makes, in order, per softmax road
    /// (`aten/src/ATen/native/SoftMax.cpp`): `q·kᵀ`, `· scaling` and `+ mask` at `c·n` each, then
    /// fp32 (`toType` and `to` return their input): one `4·n` output; fp16 (`half_to_float`):
    /// the fp32 output, then the `c·n` cast back; bf16: the fp32 copy and the fp32 output, then
    /// the cast back. Beside them the q copy, `probs · v`, its contiguous copy and `o_proj`, four
    /// smaller requests whatever the road. The whole forward makes the layer's count once per
    /// layer: so fp32 never holds two fp32 blocks at once, and strands less than bf16.
    #[test]
    fn fp32_softmax_makes_one_block_where_bf16_makes_two() {
        // At 16 × 512 a score block (`b·heads·s²`) is eight times `T·q` and twice `T·I`: no
        // other request of the forward has its size.
        let s = 512.0;
        let n: i64 = 16 * 32 * 512 * 512;
        let requests = |softmax: Softmax, (c, width): (f64, i64), layers: Option<usize>| {
            let d = Decoder {
                s,
                layers: layers.unwrap_or(1),
                ..smollm2(c, Some(softmax))
            };
            let mut run = Run::<ScannedBlocks> {
                heap: Heap::default(),
                d: &d,
                cache: vec![(None, None); d.layers],
                cublas: None,
            };
            if layers.is_some() {
                let _ = run.forward(s, 0.0);
            } else {
                let _ = run.eager_attention(softmax, s, 0.0);
            }
            let all: Vec<i64> = run.heap.log.iter().filter(|&&x| x > 0).copied().collect();
            let scores: Vec<i64> = all
                .iter()
                .filter(|&&x| x == width * n || x == 4 * n)
                .map(|&x| x / n)
                .collect();
            (all.len(), scores)
        };
        for (softmax, width, expected) in [
            (Softmax::Fp32, (4.0, 4), vec![4, 4, 4, 4]),
            (Softmax::HalfToFloat, (2.0, 2), vec![2, 2, 2, 4, 2]),
            (Softmax::Copy, (2.0, 2), vec![2, 2, 2, 4, 4, 2]),
        ] {
            let (all, scores) = requests(softmax, width, None);
            assert_eq!(scores, expected, "{softmax:?}");
            assert_eq!(all, expected.len() + 4, "{softmax:?}");
            // The forward makes them once per layer, and nothing else of their sizes.
            for layers in [1, 2] {
                let (_, forward) = requests(softmax, width, Some(layers));
                assert_eq!(forward, expected.repeat(layers), "{softmax:?} × {layers}");
            }
        }
        let fp32 = replay(&smollm2(4.0, Some(Softmax::Fp32)));
        let bf16 = replay(&smollm2(2.0, Some(Softmax::Copy)));
        assert!(fp32.prefill_slack < bf16.prefill_slack);
    }
}
