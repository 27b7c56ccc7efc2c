//! The same two steps under `torch.autocast` (`dtype: fp16-amp`): fp32 weights, gradients and
//! AdamW state, 16-bit matmuls (issue 20).
//!
//! Autocast changes nearly every request of the step, which is why it has its own sequence
//! rather than a width: the residual stream stays fp32 (the embedding and every residual add
//! promote to fp32), so `LlamaRMSNorm` makes no fp32 copy and saves its input itself; every
//! linear casts its input to 16 bits on its own (`q_proj`, `k_proj` and `v_proj` each cast the
//! same normed input: autocast caches only leaf tensors' casts) and its weight once per forward
//! (`autocast`'s weight cache, saved by the `mm`); `RoPE` multiplies 16-bit q and k by the fp32
//! tables, so the rotated q and k are fp32 and SDPA (on autocast's lower-precision list) casts
//! them back; backward makes each weight's gradient in 16 bits and then casts it to the fp32
//! `.grad` (`ToCopyBackward`), and each input's gradient back to fp32 where the input was cast.
//! As the oracle's event logs of two-layer Llama-3.2-1B, `SmolLM2`-135M, Mistral-7B and
//! Qwen2.5-1.5B (whose biased `addmm` orders its backward) show it request for request (`tools/oracle/train_events.py --grid --steps 2`, fixtures beside
//! [`super`]; CUDA's autocast op lists applied on the CPU by the oracle's `CudaAutocastPolicy`):
//!
//! | step | requests (`T = b·s`, 16-bit products `2·`, fp32 `4·`) | code |
//! |---|---|---|
//! | embedding | `4·T·h`, saved by the first layer's norm | `LlamaModel.forward` (`embedding` is not on autocast's lists) |
//! | rotary tables | as in 16 bits, but the fp32 `cos` and `sin` are the tables (`x.dtype` is fp32 in `LlamaRotaryEmbedding.forward`) | `LlamaRotaryEmbedding.forward` |
//! | `RMSNorm` | `pow(2)`, the per-row scalars, `x · rsqrt` (saved) and the weight's product, all fp32; the input saved | `LlamaRMSNorm.forward` (`to(float32)` of an fp32 input makes nothing) |
//! | a linear | its weight's 16-bit cast (cached to the forward's end, saved), its input's cast (saved; none for a 16-bit input: `o_proj`, `down_proj`), the product | `torch.autocast` (`linear` on the lower-precision list; `cached_cast` for leaves) |
//! | `RoPE` | `q·cos` fp32, `rotate_half`'s `neg` and `cat` in 16 bits, `·sin` fp32, their sum fp32; SDPA casts both rotated tensors to 16 bits (saved) | `apply_rotary_pos_emb`; `scaled_dot_product_attention` on the lower-precision list |
//! | loss | the head's weight cast and input cast, the 16-bit logits, `float()`, `log_softmax`; the final norm's output freed with the logits | `LlamaForCausalLM.forward`, `ForCausalLMLoss` |
//! | backward | per linear the output gradient's 16-bit cast where the output was added to the fp32 stream, the weight's 16-bit gradient, the input's, the input's fp32 cast (summed with the other branches' as autograd accumulates), the weight's fp32 gradient | `ToCopyBackward`, `mm_mat2_backward`, `mm_mat1_backward`, `InputBuffer::accumulate` |
//! | optimizer | AdamW's moments and foreach's square roots in fp32 | `torch/optim/adam.py` |

use super::{Handle, Run};

/// What an autocast `RMSNorm` keeps for backward besides its input.
#[derive(Clone, Copy, Debug, Default)]
struct AmpNorm {
    rsqrt: Handle,
    normed: Handle,
}

/// One layer's tensors that its forward keeps for backward under autocast.
#[derive(Clone, Copy, Debug, Default)]
struct AmpSaved {
    input: Handle,
    norm1: AmpNorm,
    /// Each projection's weight cast and input cast.
    q: (Handle, Handle),
    k: (Handle, Handle),
    v: (Handle, Handle),
    v_out: Handle,
    q16: Handle,
    k16: Handle,
    attn: Handle,
    lse: Handle,
    o_weight: Handle,
    r1: Handle,
    norm2: AmpNorm,
    gate: (Handle, Handle),
    up: (Handle, Handle),
    gate_out: Handle,
    act: Handle,
    up_out: Handle,
    product: Handle,
    down_weight: Handle,
}

/// A layer's weight gradients in `parameters()` order.
type Grads = [Handle; 7];

impl Run<'_> {
    /// `LlamaRMSNorm.forward` on the fp32 residual stream (`h` columns): what it saves besides
    /// its input, and its output. (Qwen3's per-head norms of a 16-bit projection would start
    /// with an fp32 copy; they are not replayed under autocast.)
    fn norm_amp(&mut self) -> (AmpNorm, Handle) {
        let t = self.t();
        let width = self.d.h;
        let rows = 4.0 * t;
        let pow = self.a(4.0 * t * width);
        let mean = self.a(rows);
        self.f(pow);
        let eps = self.a(rows);
        let rsqrt = self.a(rows);
        self.f(eps);
        let normed = self.a(4.0 * t * width);
        let out = self.a(4.0 * t * width);
        self.f(mean);
        (AmpNorm { rsqrt, normed }, out)
    }

    /// A linear under autocast whose input is fp32: its weight's cast, its input's cast and
    /// the 16-bit product (`out` columns, `inp` rows of the weight).
    pub(super) fn linear_amp(&mut self, out: f64, inp: f64) -> ((Handle, Handle), Handle) {
        let t = self.t();
        let weight = self.a(out * inp * 2.0);
        let input = self.a(2.0 * t * inp);
        let product = self.a(2.0 * t * out);
        ((weight, input), product)
    }

    /// `apply_rotary_pos_emb` on one 16-bit projection of `width` columns with fp32 tables:
    /// the fp32 rotated tensor.
    pub(super) fn rope_amp(&mut self, width: f64) -> Handle {
        let n = self.t() * width;
        let by_cos = self.a(4.0 * n);
        let neg = self.a(n);
        let cat = self.a(2.0 * n);
        self.f(neg);
        let by_sin = self.a(4.0 * n);
        self.f(cat);
        let sum = self.a(4.0 * n);
        self.f(by_cos);
        self.f(by_sin);
        sum
    }

    /// One decoder layer's forward under autocast from its fp32 input `x` (kept: its norm
    /// saves it): its output and what it saved.
    fn layer_amp(&mut self, x: Handle) -> (Handle, AmpSaved) {
        let d = *self.d;
        let t = self.t();
        let mut s = AmpSaved {
            input: x,
            ..AmpSaved::default()
        };
        let out1;
        (s.norm1, out1) = self.norm_amp();
        let (q, k);
        (s.q, q) = self.linear_amp(d.q, d.h);
        (s.k, k) = self.linear_amp(d.kv, d.h);
        (s.v, s.v_out) = self.linear_amp(d.kv, d.h);
        let q_rope = self.rope_amp(d.q);
        let k_rope = self.rope_amp(d.kv);
        self.f(q);
        self.f(k);
        s.q16 = self.a(2.0 * t * d.q);
        s.k16 = self.a(2.0 * t * d.kv);
        s.attn = self.a(2.0 * t * d.q);
        s.lse = self.a(d.b * d.heads * d.s * 4.0);
        s.o_weight = self.a(d.h * d.q * 2.0);
        let o = self.a(2.0 * t * d.h);
        self.f(q_rope);
        self.f(k_rope);
        self.f(out1);
        s.r1 = self.a(4.0 * t * d.h);
        self.f(o);
        let out2;
        (s.norm2, out2) = self.norm_amp();
        (s.gate, s.gate_out) = self.linear_amp(d.ffn, d.h);
        s.act = self.a(2.0 * t * d.ffn);
        (s.up, s.up_out) = self.linear_amp(d.ffn, d.h);
        s.product = self.a(2.0 * t * d.ffn);
        s.down_weight = self.a(d.h * d.ffn * 2.0);
        let down = self.a(2.0 * t * d.h);
        self.f(out2);
        let r2 = self.a(4.0 * t * d.h);
        self.f(down);
        (r2, s)
    }

    /// The forward and the loss up to `log_softmax` under autocast: the layers' saved
    /// tensors, the final norm's, its input, the head's casts and the log-probabilities.
    fn forward_amp(&mut self) -> (Vec<AmpSaved>, (AmpNorm, Handle), (Handle, Handle), Handle) {
        let d = *self.d;
        let t = self.t();
        let embedded = self.a(4.0 * t * d.h);
        self.rotary_tables();
        let mut saved = Vec::with_capacity(d.layers);
        let mut x = embedded;
        for _ in 0..d.layers {
            let (out, s) = self.layer_amp(x);
            saved.push(s);
            x = out;
        }
        let (final_norm, out) = self.norm_amp();
        let (head, logits) = self.linear_amp(d.vocab, d.h);
        let upcast = self.a(4.0 * t * d.vocab);
        let log_probs = self.a(4.0 * t * d.vocab);
        self.f(upcast);
        self.f(out);
        self.f(logits);
        (saved, (final_norm, x), head, log_probs)
    }

    /// `LlamaRMSNorm`'s backward under autocast from `grad` (fp32, freed) over the residual
    /// stream's `h` columns, its input `x` (freed), and `residual`, the gradient the residual
    /// branch already gave `x` (freed): `x`'s whole gradient. Autograd sums each
    /// branch's gradient of `x` into one buffer as it arrives: the residual's, then
    /// `x · rsqrt`'s, then `pow`'s.
    fn norm_backward_amp(
        &mut self,
        grad: Handle,
        n: AmpNorm,
        x: Handle,
        residual: Handle,
    ) -> Handle {
        let t = self.t();
        let width = self.d.h;
        let rows = 4.0 * t;
        let by_weight = self.a(4.0 * t * width);
        let for_weight = self.a(4.0 * t * width);
        self.f(for_weight);
        self.f(grad);
        self.f(n.normed);
        let m1 = self.a(4.0 * t * width);
        let by_rsqrt = self.a(4.0 * t * width);
        let sum = self.a(rows);
        self.f(m1);
        self.f(by_weight);
        let acc = if residual.is_some() {
            let acc = self.a(4.0 * t * width);
            self.f(residual);
            self.f(by_rsqrt);
            acc
        } else {
            by_rsqrt
        };
        let prod = self.mean_square_backward(sum, n.rsqrt, x, (rows, width));
        let back = self.a(4.0 * t * width);
        self.f(acc);
        self.f(prod);
        back
    }

    /// A linear's backward under autocast from `grad` (its output's 16-bit gradient, freed)
    /// and what its forward saved (`saved`: the weight's cast and the input, freed): the
    /// input's gradient and the weight's fp32 gradient. Where the input was cast
    /// (`cast_input`) its gradient is cast back to fp32 and summed into `acc` when another
    /// branch gave the input one already (freed); otherwise it stays 16-bit. `mm`'s backward
    /// makes the weight's gradient first; a biased projection's `addmm` makes the input's
    /// first and frees its saved input before its weight.
    pub(super) fn linear_backward_amp(
        &mut self,
        grad: Handle,
        (out, inp): (f64, f64),
        (weight, input): (Handle, Handle),
        cast_input: bool,
        acc: Handle,
        biased: bool,
    ) -> (Handle, Handle) {
        let t = self.t();
        let (weight16, input16) = if biased {
            let input16 = self.a(2.0 * t * inp);
            (self.a(out * inp * 2.0), input16)
        } else {
            let weight16 = self.a(out * inp * 2.0);
            (weight16, self.a(2.0 * t * inp))
        };
        self.f(grad);
        if biased {
            self.f(input);
            self.f(weight);
        } else {
            self.f(weight);
            self.f(input);
        }
        let input_grad = if cast_input {
            let fp32 = self.a(4.0 * t * inp);
            self.f(input16);
            if acc.is_some() {
                let sum = self.a(4.0 * t * inp);
                self.f(acc);
                self.f(fp32);
                sum
            } else {
                fp32
            }
        } else {
            input16
        };
        let weight32 = self.a(out * inp * 4.0);
        self.f(weight16);
        (input_grad, weight32)
    }

    /// `RoPE`'s backward under autocast for one projection of `width` columns from the fp32
    /// gradient `grad` (freed): the 16-bit gradient of the projection. The first layer's q is
    /// the last use of the tables (`last`).
    pub(super) fn rope_backward_amp(&mut self, grad: Handle, width: f64, last: bool) -> Handle {
        let n = self.t() * width;
        let by_sin = self.a(4.0 * n);
        let by_sin16 = self.a(2.0 * n);
        self.f(by_sin);
        if last {
            self.f(self.tables.1);
        }
        let neg = self.a(n);
        let s1 = self.a(2.0 * n);
        self.f(neg);
        let s2 = self.a(2.0 * n);
        self.f(by_sin16);
        let add = self.a(2.0 * n);
        self.f(s1);
        self.f(s2);
        let by_cos = self.a(4.0 * n);
        let by_cos16 = self.a(2.0 * n);
        self.f(by_cos);
        self.f(grad);
        if last {
            self.f(self.tables.0);
            self.tables = (None, None);
        }
        let sum = self.a(2.0 * n);
        self.f(add);
        self.f(by_cos16);
        sum
    }

    /// One layer's backward under autocast from the fp32 gradient of its output (freed):
    /// its input's gradient and its weights'.
    fn layer_backward_amp(&mut self, grad: Handle, s: &AmpSaved, first: bool) -> (Handle, Grads) {
        let d = *self.d;
        let t = self.t();
        let tf = 2.0 * t * d.ffn;
        // The MLP: `down_proj`'s output was added to the fp32 stream.
        let g16 = self.a(2.0 * t * d.h);
        let (g_product, down) = self.linear_backward_amp(
            g16,
            (d.h, d.ffn),
            (s.down_weight, s.product),
            false,
            None,
            false,
        );
        let g_up = self.a(tf);
        let g_act = self.a(tf);
        self.f(g_product);
        self.f(s.up_out);
        self.f(s.act);
        let (gi_up, up) = self.linear_backward_amp(g_up, (d.ffn, d.h), s.up, true, None, false);
        let g_silu = self.a(tf);
        self.f(g_act);
        self.f(s.gate_out);
        let (mlp_in, gate) =
            self.linear_backward_amp(g_silu, (d.ffn, d.h), s.gate, true, gi_up, false);
        let g_r1 = self.norm_backward_amp(mlp_in, s.norm2, s.r1, grad);
        // Attention: `o_proj`'s output was added to the fp32 stream.
        let g16 = self.a(2.0 * t * d.h);
        let weight16 = self.a(d.h * d.q * 2.0);
        let g_attn = self.a(2.0 * t * d.q);
        self.f(g16);
        self.f(s.o_weight);
        let o = self.a(d.h * d.q * 4.0);
        self.f(weight16);
        let dq = self.a(2.0 * t * d.q);
        let dk = self.a(2.0 * t * d.kv);
        let dv = self.a(2.0 * t * d.kv);
        for h in [g_attn, s.k16, s.q16, s.v_out, s.lse, s.attn] {
            self.f(h);
        }
        let dk32 = self.a(4.0 * t * d.kv);
        self.f(dk);
        let dq32 = self.a(4.0 * t * d.q);
        self.f(dq);
        let gk = self.rope_backward_amp(dk32, d.kv, false);
        let gq = self.rope_backward_amp(dq32, d.q, first);
        let bias = self.step.qkv_bias;
        let (gi_v, v) = self.linear_backward_amp(dv, (d.kv, d.h), s.v, true, None, bias);
        let k_contiguous = self.a(2.0 * t * d.kv);
        self.f(gk);
        let (gi_k, k) = self.linear_backward_amp(k_contiguous, (d.kv, d.h), s.k, true, gi_v, bias);
        let q_contiguous = self.a(2.0 * t * d.q);
        self.f(gq);
        let (attn_in, q) =
            self.linear_backward_amp(q_contiguous, (d.q, d.h), s.q, true, gi_k, bias);
        let g_input = self.norm_backward_amp(attn_in, s.norm1, s.input, g_r1);
        (g_input, [q, k, v, o, gate, up, down])
    }

    /// The loss's backward and every layer's under autocast: the fp32 gradients in
    /// `parameters()` order.
    fn backward_amp(
        &mut self,
        saved: &[AmpSaved],
        (final_norm, x): (AmpNorm, Handle),
        head: (Handle, Handle),
        log_probs: Handle,
    ) -> Vec<Handle> {
        let d = *self.d;
        let g_logits = self.loss_backward(log_probs);
        self.autograd_workspace();
        let (g_hidden, head) =
            self.linear_backward_amp(g_logits, (d.vocab, d.h), head, true, None, false);
        let mut grad = self.norm_backward_amp(g_hidden, final_norm, x, None);
        let mut layers = Vec::with_capacity(d.layers);
        for (i, s) in saved.iter().enumerate().rev() {
            let (g_input, g) = self.layer_backward_amp(grad, s, i == 0);
            layers.push(g);
            grad = g_input;
        }
        layers.reverse();
        let embedding = self.a(d.vocab * d.h * 4.0);
        self.f(grad);
        let (embedding, head) = if d.tied {
            let sum = self.a(d.vocab * d.h * 4.0);
            self.f(head);
            self.f(embedding);
            (sum, None)
        } else {
            (embedding, head)
        };
        let mut grads = vec![embedding];
        for g in layers {
            grads.extend(g);
        }
        if !d.tied {
            grads.push(head);
        }
        grads
    }

    /// One training step under autocast: forward, backward, `optimizer.step()` on the fp32
    /// weights, `zero_grad`.
    pub(super) fn train_step_amp(&mut self) {
        debug_assert!(
            !self.d.qk_norm,
            "per-head norms are not replayed under autocast"
        );
        let (saved, final_norm, head, log_probs) = self.forward_amp();
        let grads = self.backward_amp(&saved, final_norm, head, log_probs);
        self.step();
        for g in grads {
            self.f(g);
        }
    }
}
