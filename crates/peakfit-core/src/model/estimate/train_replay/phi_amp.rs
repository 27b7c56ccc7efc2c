//! Phi's layer ([`super::phi`]) under `torch.autocast` (`dtype: fp16-amp`): fp32 weights,
//! gradients and AdamW state, 16-bit matmuls (issue 20).
//!
//! What autocast changes is [`super::amp`]'s for Llama's layer: the residual stream is fp32, so
//! `LayerNorm` (on autocast's fp32 list) outputs fp32 and each linear casts that output to 16
//! bits itself (q, k, v and `fc1` four times), its weight once per forward; each weight's
//! gradient is made in 16 bits and cast to the fp32 `.grad`, each cast input's gradient cast back
//! and summed. Phi's own: `RoPE` on the rotated part gives fp32 (the tables are fp32), so the
//! `cat` with the 16-bit pass-through part first casts that part to fp32, and SDPA casts the
//! fp32 q and k back; `dense`'s input (the kernel's output) is 16-bit already, so it casts only
//! its weight; the dropouts run on 16-bit outputs; the two 16-bit branches are summed before
//! the fp32 residual. In the GELU `pow` is on CUDA's fp32 list: its input is cast to fp32 (and
//! saved: `fc1`'s 16-bit output is freed), and every op after it is fp32 but `0.5·x`, so its
//! output is fp32 and `fc2` casts it. As the oracle's event log of a two-layer Phi-2 shows it
//! request for request (`tools/oracle/train_events.py --grid --steps 2
//! phi-2-2l-training-fp16-amp-b1-t1024-gcnone-adamw`; the fixture beside [`super`]):
//!
//! | step | requests (`T = b·s`, 16-bit `2·`, fp32 `4·`, `f` the MLP's width, `r` the rotated dims) | code |
//! |---|---|---|
//! | norm | `4·T·h` (freed at the layer's end) and the mean and rstd | `native_layer_norm` (fp32 list) |
//! | q, k, v | each its weight's cast, the input's cast (both saved), the product | `torch.autocast`, `addmm` |
//! | `RoPE` | fp32 `q·cos`, 16-bit `neg` and `cat`, fp32 `·sin` and sum ([`Run::rope_amp`]) | `apply_rotary_pos_emb` |
//! | `cat` | the pass-through part cast to fp32 (`4·T·heads·(d − r)`), the fp32 `cat` | `torch.cat` (type promotion) |
//! | kernel | q's and k's 16-bit casts (saved), the output and log-sum-exp, the contiguous copy, `dense`'s weight cast, `dense`; the `cat`s, rotated parts, q and k freed | SDPA (lower-precision list) |
//! | MLP | `fc1` (casts, product), `0.5·x` (16-bit, saved), `x`'s fp32 cast (saved), `pow`, `·0.044715`, `x +`, `·√(2/π)`, `tanh` (saved), `1 +` (saved), the fp32 product; `fc1`'s output freed; `fc2` (casts, product), the product freed | `NewGELUActivation` under CUDA's lists |
//! | backward | the head's and each layer's as above in reverse, every 16-bit gradient of an fp32 tensor cast to fp32 where it meets one ([`Run::linear_backward_amp`], [`Run::rope_backward_amp`]) | `ToCopyBackward`, `InputBuffer::accumulate` |

use super::phi::ROTARY_DIM;
use super::{Grads, Handle, Run};

/// What a linear's forward under autocast keeps: its weight's 16-bit cast and its input's.
type Casts = (Handle, Handle);

/// What one Phi layer's forward keeps for backward under autocast.
#[derive(Clone, Copy, Debug, Default)]
struct PhiAmpSaved {
    /// The layer's fp32 input: `LayerNorm`'s saved input.
    input: Handle,
    stats: (Handle, Handle),
    q: Casts,
    k: Casts,
    v: Casts,
    v_out: Handle,
    q16: Handle,
    k16: Handle,
    attn: Handle,
    lse: Handle,
    /// The kernel's output made contiguous (`dense`'s 16-bit input) and `dense`'s weight cast.
    dense: Casts,
    attn_mask: Handle,
    fc1: Casts,
    half: Handle,
    /// `fc1`'s output cast to fp32 for `pow`.
    x32: Handle,
    tanh: Handle,
    one_plus: Handle,
    fc2: Casts,
    mlp_mask: Handle,
}

impl Run<'_> {
    /// One Phi layer's forward under autocast from its fp32 input `x` (saved by its
    /// `LayerNorm`): its fp32 output and what it saved.
    fn phi_layer_amp(&mut self, x: Handle) -> (Handle, PhiAmpSaved) {
        let d = *self.d;
        let t = self.t();
        let kv_heads = d.kv / d.head_dim;
        let mut s = PhiAmpSaved {
            input: x,
            ..PhiAmpSaved::default()
        };
        let normed;
        (normed, s.stats) = self.layer_norm(4.0);
        let (q, k);
        (s.q, q) = self.linear_amp(d.q, d.h);
        (s.k, k) = self.linear_amp(d.kv, d.h);
        (s.v, s.v_out) = self.linear_amp(d.kv, d.h);
        let q_rot = self.rope_amp(d.heads * ROTARY_DIM);
        let k_rot = self.rope_amp(kv_heads * ROTARY_DIM);
        let pass = self.a(4.0 * t * (d.q - d.heads * ROTARY_DIM));
        let q_cat = self.a(4.0 * t * d.q);
        self.f(pass);
        let pass = self.a(4.0 * t * (d.kv - kv_heads * ROTARY_DIM));
        let k_cat = self.a(4.0 * t * d.kv);
        self.f(pass);
        s.q16 = self.a(2.0 * t * d.q);
        s.k16 = self.a(2.0 * t * d.kv);
        s.attn = self.a(2.0 * t * d.q);
        s.lse = self.a(d.b * d.heads * d.s * 4.0);
        let contiguous = self.a(2.0 * t * d.q);
        s.dense = (self.a(d.h * d.q * 2.0), contiguous);
        let dense = self.a(2.0 * t * d.h);
        for h in [q_cat, k_cat, q_rot, q, k_rot, k] {
            self.f(h);
        }
        let attn;
        (s.attn_mask, attn) = self.resid_dropout(dense);
        let fc1;
        (s.fc1, fc1) = self.linear_amp(d.ffn, d.h);
        let tf = t * d.ffn;
        s.half = self.a(2.0 * tf);
        s.x32 = self.a(4.0 * tf);
        let cube = self.a(4.0 * tf);
        let scaled = self.a(4.0 * tf);
        self.f(cube);
        let inner = self.a(4.0 * tf);
        self.f(scaled);
        let by_root = self.a(4.0 * tf);
        self.f(inner);
        s.tanh = self.a(4.0 * tf);
        self.f(by_root);
        s.one_plus = self.a(4.0 * tf);
        let gelu = self.a(4.0 * tf);
        self.f(fc1);
        let fc2;
        (s.fc2, fc2) = self.linear_amp(d.h, d.ffn);
        self.f(gelu);
        let mlp;
        (s.mlp_mask, mlp) = self.resid_dropout(fc2);
        let branches = self.a(2.0 * t * d.h);
        let out = self.a(4.0 * t * d.h);
        for h in [branches, normed, attn, mlp] {
            self.f(h);
        }
        (out, s)
    }

    /// The GELU's backward under autocast from its fp32 output's gradient (`grad`, freed):
    /// the 16-bit gradient of `fc1`'s output. The product's fp32 operand (`1 + tanh`) and its
    /// 16-bit one (`0.5·x`, whose gradient is cast down), `tanh`'s, `√(2/π)·` (its gradient of
    /// the 16-bit `x` cast down), the cube's through the fp32 cast of `x` (cast down), and
    /// `0.5·`, summed in 16 bits.
    fn gelu_backward_amp(&mut self, grad: Handle, s: &PhiAmpSaved) -> Handle {
        let tf = self.t() * self.d.ffn;
        let by_one_plus = self.a(4.0 * tf);
        let by_half = self.a(4.0 * tf);
        let half16 = self.a(2.0 * tf);
        self.f(by_half);
        self.f(grad);
        self.f(s.one_plus);
        self.f(s.half);
        let tanh = self.a(4.0 * tf);
        self.f(by_one_plus);
        self.f(s.tanh);
        let root = self.a(4.0 * tf);
        self.f(tanh);
        let x16 = self.a(2.0 * tf);
        let scaled = self.a(4.0 * tf);
        self.f(root);
        let square = self.a(4.0 * tf);
        let three = self.a(4.0 * tf);
        let cube = self.a(4.0 * tf);
        for h in [three, square, scaled, s.x32] {
            self.f(h);
        }
        let cube16 = self.a(2.0 * tf);
        self.f(cube);
        let inner = self.a(2.0 * tf);
        self.f(x16);
        self.f(cube16);
        let half = self.a(2.0 * tf);
        self.f(half16);
        let sum = self.a(2.0 * tf);
        self.f(inner);
        self.f(half);
        sum
    }

    /// One Phi layer's backward under autocast from its output's fp32 gradient (`grad`, freed
    /// once the residual's sum is made): its input's fp32 gradient and its weights' fp32 ones.
    fn phi_layer_backward_amp(
        &mut self,
        grad: Handle,
        s: &PhiAmpSaved,
        first: bool,
    ) -> (Handle, Grads) {
        let d = *self.d;
        let t = self.t();
        let kv_heads = d.kv / d.head_dim;
        let mut g = Grads::default();
        // The two 16-bit branches' sum met the fp32 residual: its gradient cast down.
        let g16 = self.a(2.0 * t * d.h);
        // The MLP: its dropout, `fc2` (its input cast from the fp32 GELU), the GELU, `fc1`.
        let dropped = self.dropout_backward(s.mlp_mask, 2.0 * t * d.h);
        let g_gelu;
        (g_gelu, g.down) = self.linear_backward_amp(dropped, (d.h, d.ffn), s.fc2, true, None, true);
        let g_fc1 = self.gelu_backward_amp(g_gelu, s);
        let normed_grad;
        (normed_grad, g.up) =
            self.linear_backward_amp(g_fc1, (d.ffn, d.h), s.fc1, true, None, true);
        // The attention: its dropout, `dense` (a 16-bit input), the kernel, q's and k's fp32
        // gradients, the pass-through parts' casts back, `RoPE`, the `cat`s' slices.
        // Without dropout `dense` takes the cast gradient itself and frees it.
        let dropped = if self.step.dropout {
            let dropped = self.a(2.0 * t * d.h);
            self.f(g16);
            self.f(s.attn_mask);
            dropped
        } else {
            g16
        };
        let g_out;
        (g_out, g.o) = self.linear_backward_amp(dropped, (d.h, d.q), s.dense, false, None, true);
        let dq = self.a(2.0 * t * d.q);
        let dk = self.a(2.0 * t * d.kv);
        let dv = self.a(2.0 * t * d.kv);
        for h in [g_out, s.k16, s.q16, s.v_out, s.lse, s.attn] {
            self.f(h);
        }
        let dk32 = self.a(4.0 * t * d.kv);
        self.f(dk);
        let dq32 = self.a(4.0 * t * d.q);
        self.f(dq);
        let k_pass = self.a(2.0 * t * (d.kv - kv_heads * ROTARY_DIM));
        let q_pass = self.a(2.0 * t * (d.q - d.heads * ROTARY_DIM));
        let k_rot = self.rope_backward_amp(dk32, kv_heads * ROTARY_DIM, false);
        let q_rot = self.rope_backward_amp(dq32, d.heads * ROTARY_DIM, first);
        let mut whole = |pass: Handle, rot: Handle, width: f64| {
            let from_pass = self.a(2.0 * t * width);
            self.f(pass);
            let from_rot = self.a(2.0 * t * width);
            self.f(rot);
            let sum = self.a(2.0 * t * width);
            self.f(from_pass);
            self.f(from_rot);
            sum
        };
        let gk = whole(k_pass, k_rot, d.kv);
        let gq = whole(q_pass, q_rot, d.q);
        // v, k and q, each input's gradient cast to fp32 and summed into `fc1`'s.
        let (acc, v) = self.linear_backward_amp(dv, (d.kv, d.h), s.v, true, normed_grad, true);
        g.v = v;
        let contiguous = self.a(2.0 * t * d.kv);
        self.f(gk);
        let (acc, k) = self.linear_backward_amp(contiguous, (d.kv, d.h), s.k, true, acc, true);
        g.k = k;
        let contiguous = self.a(2.0 * t * d.q);
        self.f(gq);
        let (acc, q) = self.linear_backward_amp(contiguous, (d.q, d.h), s.q, true, acc, true);
        g.q = q;
        // `LayerNorm`'s backward, then the residual's sum.
        let normed = self.layer_norm_backward(acc, s.stats, s.input, 4.0);
        let input = self.a(4.0 * t * d.h);
        self.f(grad);
        self.f(normed);
        (input, g)
    }

    /// One Phi training step under autocast: forward, the loss, backward,
    /// `optimizer.step()`, `zero_grad`.
    pub(super) fn phi_train_step_amp(&mut self) {
        let d = *self.d;
        let t = self.t();
        let th = 4.0 * t * d.h;
        // Forward: the fp32 embedding, the layers, the final norm, the biased head.
        let embedded = self.a(th);
        self.rotary_tables_of(ROTARY_DIM);
        let mut saved = Vec::with_capacity(d.layers);
        let mut x = embedded;
        for _ in 0..d.layers {
            let (out, s) = self.phi_layer_amp(x);
            saved.push(s);
            x = out;
        }
        let (final_out, stats) = self.layer_norm(4.0);
        let (head, logits) = self.linear_amp(d.vocab, d.h);
        let upcast = self.a(4.0 * t * d.vocab);
        let log_probs = self.a(4.0 * t * d.vocab);
        self.f(upcast);
        self.f(final_out);
        self.f(logits);
        // Backward.
        let g_logits = self.loss_backward(log_probs);
        self.autograd_workspace();
        let (g_hidden, head) =
            self.linear_backward_amp(g_logits, (d.vocab, d.h), head, true, None, true);
        let mut grad = self.layer_norm_backward(g_hidden, stats, x, 4.0);
        let mut layers = Vec::with_capacity(d.layers);
        for (i, s) in saved.iter().enumerate().rev() {
            let (g_input, g) = self.phi_layer_backward_amp(grad, s, i == 0);
            layers.push(g);
            grad = g_input;
        }
        layers.reverse();
        let table = self.a(d.vocab * d.h * 4.0);
        self.f(grad);
        let grads = self.embedding_and_layer_grads(table, head, layers);
        self.step();
        for g in grads {
            self.f(g);
        }
    }
}
