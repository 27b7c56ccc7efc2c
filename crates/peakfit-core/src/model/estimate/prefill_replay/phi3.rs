//! Phi-3's layer in the replayed prefill under eager attention (issue 20): transformers 5.17's
//! `models/phi3/modeling_phi3.py`, Llama's layer ([`super`], [`super::eager`]) but for four
//! things, as the oracle's event log of Phi-3-mini-4k (bf16, eager, 2 × 2,100) shows them tensor
//! for tensor (`T = b·s`, `K` the keys attended to, `c` the compute width):
//!
//! | step | requests | code |
//! |---|---|---|
//! | fused projection | one `T·(q + 2kv)·c` output, kept to `o_proj`: q, k and v are views of it | `Phi3Attention.forward` (`qkv_proj`, slices, `view`, `transpose`) |
//! | `RoPE` | Llama's sequence on q, then `torch.cat([rotated, q_pass])` (`T·q·c`, the rotated freed; `q_pass` is empty at `partial_rotary_factor` 1); the same on k. The cat's output is contiguous, so `matmul` makes no q copy | `apply_rotary_pos_emb` |
//! | cache | `DynamicSlidingWindowLayer.update`: `torch.cat` of the kept `window - 1` tokens (a view of the last full copy) and the new ones; the rotated k freed after | `cache_utils.py` |
//! | MLP | `gate_up_proj` (`T·2I·c`, kept by `chunk`'s views to the MLP's end), `act(gate)` (`T·I·c`), `up · act` (`T·I·c`, `act` freed), `down_proj` (`T·h·c`) | `Phi3MLP.forward` |
//!
//! Once per forward, `create_sliding_window_causal_mask` (Phi-3-mini's `sliding_window` is
//! 2,047, so every forward builds it): the window's `gt` and its `&`, the causal `le` and its
//! `&`, their `&` (`s·K` booleans each), the batch's `&` (`b·s·K`), then eager's `c`-wide float
//! mask; `K` is `min(past, window - 1) + s` (`get_mask_sizes`).

use super::{Decoder, FreeBlocks, Handle, Run, Softmax};

/// One `Phi3DecoderLayer`'s parameters in `model.parameters()` order, in values: `o_proj`
/// (built first in `Phi3Attention.__init__`), `qkv_proj`, `gate_up_proj`, `down_proj`, the two
/// `RMSNorm`s' weights.
pub(super) fn layer_parameters(d: &Decoder) -> Vec<f64> {
    vec![
        d.h * d.q,
        (d.q + 2.0 * d.kv) * d.h,
        2.0 * d.ffn * d.h,
        d.h * d.ffn,
        d.h,
        d.h,
    ]
}

impl<P: FreeBlocks> Run<'_, P> {
    /// `sliding_window_causal_mask_function`'s boolean over `s` new tokens with `past` seen:
    /// the window's `gt` and `&`, the causal `le` and `&`, their `&` (`s·K` each), then the
    /// batch's `&` (`b·s·K`), returned. The padding mask's `index` (`b·K` booleans) and the
    /// positions are a few KiB, left out as in [`Run::causal_mask`].
    pub(super) fn sliding_window_mask(&mut self, s: f64, past: f64) -> Handle {
        let d = *self.d;
        let square = s * self.keys(s, past);
        let gt = self.heap.malloc(square);
        let window = self.heap.malloc(square);
        self.heap.free(gt);
        let le = self.heap.malloc(square);
        let causal = self.heap.malloc(square);
        self.heap.free(le);
        self.heap.free(window);
        let both = self.heap.malloc(square);
        self.heap.free(causal);
        let batch = self.heap.malloc(d.b * square);
        self.heap.free(both);
        batch
    }

    /// `apply_rotary_pos_emb` on `width` values a token, ending in Phi-3's `cat`.
    fn phi3_rope(&mut self, t: f64, width: f64) -> Handle {
        let rotated = self.rope(t, width);
        let cat = self.heap.malloc(t * width * self.d.c);
        self.heap.free(rotated);
        cat
    }

    /// `Phi3DecoderLayer.forward` under eager attention over `s` new tokens with `past` seen:
    /// returns its output. Phi-3 is replayed under eager attention only
    /// (`hf::replayed_decoder`); a decoder without a softmax road takes bf16's.
    pub(super) fn phi3_layer(&mut self, i: usize, s: f64, past: f64) -> Handle {
        let d = *self.d;
        debug_assert!(d.eager.is_some(), "Phi-3 is replayed under eager attention");
        let (t, c) = (d.b * s, d.c);
        let normed = self.norm(t, d.h);
        let qkv = self.heap.malloc(t * (d.q + 2.0 * d.kv) * c);
        let qe = self.phi3_rope(t, d.q);
        let ke = self.phi3_rope(t, d.kv);
        self.cache_update(i, s, past);
        self.heap.free(ke);
        let (o, probs) = self.eager_attention(d.eager.unwrap_or(Softmax::Copy), s, past);
        for h in [qkv, qe, normed] {
            self.heap.free(h);
        }
        let sum = self.heap.malloc(t * d.h * c);
        self.heap.free(o);
        let m = self.norm(t, d.h);
        let gate_up = self.heap.malloc(t * 2.0 * d.ffn * c);
        let act = self.heap.malloc(t * d.ffn * c);
        let prod = self.heap.malloc(t * d.ffn * c);
        self.heap.free(act);
        let down = self.heap.malloc(t * d.h * c);
        for h in [prod, gate_up, m] {
            self.heap.free(h);
        }
        let out = self.heap.malloc(t * d.h * c);
        for h in [down, sum, probs] {
            self.heap.free(h);
        }
        out
    }
}

/// Phi-3-mini-4k (`microsoft/Phi-3-mini-4k-instruct`'s config: 32 heads of 96, a kv head per
/// head, `sliding_window` 2,047, untied head) at `b × s` under bf16 eager attention.
#[cfg(test)]
pub(in crate::model::estimate) fn phi3_mini(b: f64, s: f64) -> Decoder {
    Decoder {
        b,
        s,
        c: 2.0,
        h: 3072.0,
        q: 3072.0,
        kv: 3072.0,
        heads: 32.0,
        head_dim: 96.0,
        ffn: 8192.0,
        vocab: 32064.0,
        layers: 32,
        qk_norm: false,
        tied: false,
        eager: Some(Softmax::Copy),
        layer: super::Layer::Phi3,
        window: Some(2047.0),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Decoder, large_pool, oracle_log, replay, two_token_log};
    use super::phi3_mini;

    /// Request for request: the oracle's event log of a 2-layer Phi-3-mini-4k bf16 eager
    /// `generate` at 2 × 2,100 with 2 new tokens (`tools/oracle/events.py --config
    /// tests/data/h100/configs/h100-phi3-mini-eager-b2-4k.json --layers 2 --batch 2
    /// --context-tokens 2102 --new-tokens 2 --attention eager --large`: `_run_case`'s `_events`
    /// from the weights' `empty_cache()` to the end, 512-byte blocks, frees negative, the large
    /// pool's only), in
    /// `oracle-phi3-mini-eager-2-layers.txt`: the prefill past the window, the decode step and
    /// the cache freed at the end, 205 blocks, are the replay's in the same order (the window's
    /// five `s·K` booleans, the fused `qkv_proj` kept to `o_proj`, `RoPE`'s `cat`s, no q copy, the
    /// fused `gate_up_proj`, the decode's `window`-token copies made before the old ones go).
    #[test]
    fn phi3s_layers_request_the_oracles_blocks_in_its_order() {
        let oracle = oracle_log(include_str!("oracle-phi3-mini-eager-2-layers.txt"));
        let d = Decoder {
            layers: 2,
            ..phi3_mini(2.0, 2100.0)
        };
        let replayed = two_token_log(&d);
        assert_eq!(replayed.len(), 205);
        assert_eq!(replayed, oracle);
    }

    /// The oracle's allocator replay of Phi-3-mini-4k bf16 eager `generate`s (`_run_case` with
    /// `decode="synth"`, 2026-11-27: `reserved_breakdown_bytes.large_pool`), the two H100 eager
    /// rows' shapes (prompt 4,032 + 64) and two it was not measured on (1 × 960 + 64, inside
    /// the window; 3 × 2,900 + 100), against the replay's heap after every decode step: the same
    /// large pool to the byte.
    #[test]
    fn the_replay_reserves_the_oracles_large_pool_on_phi3_shapes() {
        for (b, prompt, new, oracle) in [
            (2.0, 4032.0, 64_u32, 24_947_720_192.0),
            (4.0, 4032.0, 64, 42_186_309_632.0),
            (1.0, 960.0, 64, 8_587_837_440.0),
            (3.0, 2900.0, 100, 24_429_723_648.0),
        ] {
            assert_eq!(
                large_pool(&phi3_mini(b, prompt), new),
                oracle,
                "{b} × {prompt}"
            );
        }
    }

    /// The H100 eager rows' slack as the model takes it ([`replay`]) against the oracle's
    /// (`peak_reserved_bytes − allocated_blocks`, as above): 3,280,612,352 B at 2 × 4,032 and
    /// 6,533,856,256 B at 4 × 4,032, the measured rows' to 0.01 GiB (`docs/oracle.md`, "Eager
    /// attention's reserved memory"). The model counted two fp32 score blocks (8.0 and 16.0 GiB).
    #[test]
    fn the_h100_eager_rows_slack_is_the_oracles() {
        for (b, oracle) in [(2.0, 3_280_612_352.0), (4.0, 6_533_856_256.0)] {
            let r = replay(&phi3_mini(b, 4032.0));
            let slack = r.prefill_slack + r.decode_fresh;
            assert!(
                (slack - oracle).abs() <= 4.0 * 1_048_576.0,
                "{b}: {}",
                slack / 1_048_576.0
            );
        }
    }
}
