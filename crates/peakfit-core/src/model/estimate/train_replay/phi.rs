//! Phi's layer in the same two steps (`models/phi/modeling_phi.py`: Phi-1, Phi-1.5, Phi-2; 16
//! bits; issue 20).
//!
//! `PhiDecoderLayer` runs the attention and the MLP side by side on one `LayerNorm`'s output and
//! adds both to the residual; `LayerNorm` saves its input, so no layer's input is freed before
//! backward (the embedding is the first layer's). q, k, v, `dense`, `fc1`, `fc2` and the head
//! are biased (`addmm`: the input's gradient is made before the weight's). Only the first
//! [`ROTARY_DIM`] dims of each head are rotated (Llama's `RoPE` on that part), then put back
//! beside the rest with `torch.cat`, whose output SDPA saves. The MLP is `fc2(gelu_new(fc1(x)))`,
//! `NewGELUActivation` composed of elementwise ops, each a tensor. `resid_dropout` follows the
//! attention and the MLP. As the oracle's event log of a two-layer Phi-2 shows it request for
//! request (`tools/oracle/train_events.py --grid --steps 2
//! phi-2-2l-training-bf16-b1-t1024-gcnone-adamw`, the config cut to two layers; the fixture
//! beside [`super`]):
//!
//! | step | requests (`T = b·s`, `c` the compute width, `f` the MLP's width) | code |
//! |---|---|---|
//! | embedding | `T·h·c`, kept to the first layer's `LayerNorm` backward; `embd_pdrop` 0 makes no copy | `PhiModel.forward` |
//! | norm | the output `T·h·c` (saved) and the fp32 mean and rstd (`4·T` each) | `native_layer_norm` |
//! | attention | q, k, v (v saved); `RoPE` on q's then k's rotated part (Llama's five requests at `T·heads·32·c`); `cat` of q and of k (saved); the kernel's output and log-sum-exp (saved); the `transpose(1, 2).contiguous()` copy (`dense`'s saved input); `dense`; q, k and their rotated parts freed on return | `PhiAttention.forward` |
//! | dropout | the mask (`T·h` bytes, saved), the output; its input freed | `resid_dropout`, `native_dropout` |
//! | MLP | `fc1` (saved), `0.5·x` (saved), `x³`, `·0.044715`, `x +`, `·√(2/π)`, `tanh` (saved), `1 +` (saved), the product (saved: `fc2`'s input), `fc2`, its dropout | `PhiMLP.forward`, `NewGELUActivation` |
//! | residual | the two branches' sum, then the residual's | `PhiDecoderLayer.forward` |
//! | loss | the final `LayerNorm`, the biased head, `float()`, `log_softmax` | `PhiForCausalLM.forward`, `ForCausalLMLoss` |
//! | backward | the MLP branch (dropout, `fc2`, GELU's eleven tensors, `fc1`), then the attention's (dropout, `dense`, the kernel, `RoPE` on k then q, the `cat`s' slices, v, k, q), their input gradients summed into `fc1`'s, the norm, the residual's sum | autograd over the ops above |
//!
//! The dropouts run where `residual-dropout` (`resid_pdrop`, which `--model-config` reads) is
//! above 0 or unstated (Phi-2's 0.1); at 0 (Phi-1, Phi-1.5) `F.dropout` returns its input, no
//! mask and no copy, and each branch's gradient goes to its linear itself (the fixtures without
//! dropout). The rotated width is assumed rather than read, since the annotations do not carry
//! it (`head_dim · partial_rotary_factor`, [`ROTARY_DIM`] in every published `phi`
//! checkpoint), which is one reason `hf::replays` takes the replay as a floor under the count,
//! not in its place.

use super::{Grads, Handle, Run};

/// The dims of each head that `PhiAttention` rotates: `head_dim · partial_rotary_factor`, 32 in
/// every published `phi` checkpoint (Phi-1 and Phi-1.5: 64 × 0.5; Phi-2: 80 × 0.4).
pub(super) const ROTARY_DIM: f64 = 32.0;

/// What one Phi layer's forward keeps for backward.
#[derive(Clone, Copy, Debug, Default)]
struct PhiSaved {
    /// The layer's input: `LayerNorm`'s saved input.
    input: Handle,
    /// `LayerNorm`'s output: q's, k's, v's and `fc1`'s input.
    normed: Handle,
    /// `LayerNorm`'s mean and rstd.
    stats: (Handle, Handle),
    v: Handle,
    q_cat: Handle,
    k_cat: Handle,
    attn: Handle,
    lse: Handle,
    /// The attention's output made contiguous: `dense`'s input.
    contiguous: Handle,
    attn_mask: Handle,
    gelu: Gelu,
    mlp_mask: Handle,
}

/// What `fc1` and `NewGELUActivation` keep for backward (GPT-2's `c_fc` too): `fc1`'s output
/// (`pow`'s input), `0.5·x`, `tanh`'s output, `1 + tanh` and the product (`fc2`'s input).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Gelu {
    input: Handle,
    half: Handle,
    tanh: Handle,
    one_plus: Handle,
    pub(super) out: Handle,
}

impl Run<'_> {
    /// `resid_dropout` on a branch's output `x` (`T·h·c`, freed): the saved mask and the
    /// output. At probability 0 (`!self.step.dropout`) `F.dropout` returns `x` itself: no mask.
    pub(super) fn resid_dropout(&mut self, x: Handle) -> (Handle, Handle) {
        if !self.step.dropout {
            return (None, x);
        }
        let t = self.t();
        let mask = self.a(t * self.d.h * self.dropout_mask);
        let out = self.a(t * self.d.h * self.d.c);
        self.f(x);
        (mask, out)
    }

    /// A dropout's backward (`native_dropout_backward`: the gradient times the mask, `bytes`,
    /// the mask freed): the branch's gradient, or `None` without dropout, where the branch
    /// takes the block's gradient itself (its owner frees it).
    pub(super) fn dropout_backward(&mut self, mask: Handle, bytes: f64) -> Handle {
        if !self.step.dropout {
            return None;
        }
        let dropped = self.a(bytes);
        self.f(mask);
        dropped
    }

    /// `native_layer_norm` over the `h` columns of an input `width` bytes an element (the
    /// compute width, or autocast's fp32 stream's 4): its output and its saved fp32 mean and
    /// rstd.
    pub(super) fn layer_norm(&mut self, width: f64) -> (Handle, (Handle, Handle)) {
        let t = self.t();
        let out = self.a(t * self.d.h * width);
        (out, (self.a(4.0 * t), self.a(4.0 * t)))
    }

    /// `LayerNorm`'s backward ([`Run::layer_norm`]'s `width`) from its output's gradient
    /// (`grad`, freed), its saved mean and rstd and its saved input (freed): the input's
    /// gradient.
    pub(super) fn layer_norm_backward(
        &mut self,
        grad: Handle,
        stats: (Handle, Handle),
        input: Handle,
        width: f64,
    ) -> Handle {
        let back = self.a(self.t() * self.d.h * width);
        for h in [grad, input, stats.0, stats.1] {
            self.f(h);
        }
        back
    }

    /// One Phi layer's forward from its input `x` (saved by its `LayerNorm`): its output and
    /// what it saved.
    fn phi_layer(&mut self, x: Handle) -> (Handle, PhiSaved) {
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let mut s = PhiSaved {
            input: x,
            ..PhiSaved::default()
        };
        (s.normed, s.stats) = self.layer_norm(c);
        let q = self.a(t * d.q * c);
        let k = self.a(t * d.kv * c);
        s.v = self.a(t * d.kv * c);
        let q_rot = self.rope(d.heads * ROTARY_DIM);
        let k_rot = self.rope(d.kv / d.head_dim * ROTARY_DIM);
        s.q_cat = self.a(t * d.q * c);
        s.k_cat = self.a(t * d.kv * c);
        s.attn = self.a(t * d.q * c);
        s.lse = self.a(d.b * d.heads * d.s * 4.0);
        s.contiguous = self.a(t * d.q * c);
        let dense = self.a(th);
        for h in [q_rot, q, k_rot, k] {
            self.f(h);
        }
        let attn;
        (s.attn_mask, attn) = self.resid_dropout(dense);
        s.gelu = self.fc1_gelu();
        let fc2 = self.a(th);
        let mlp;
        (s.mlp_mask, mlp) = self.resid_dropout(fc2);
        let branches = self.a(th);
        let out = self.a(th);
        for h in [branches, attn, mlp] {
            self.f(h);
        }
        (out, s)
    }

    /// `fc1`'s output (`T·f·c`) and `NewGELUActivation` on it: `0.5·x`, `x³`, `·0.044715`,
    /// `x +`, `·√(2/π)`, `tanh`, `1 +` and the product, each a tensor; what it saves.
    pub(super) fn fc1_gelu(&mut self) -> Gelu {
        let tf = self.t() * self.d.ffn * self.d.c;
        let input = self.a(tf);
        let half = self.a(tf);
        let cube = self.a(tf);
        let scaled = self.a(tf);
        self.f(cube);
        let inner = self.a(tf);
        self.f(scaled);
        let by_root = self.a(tf);
        self.f(inner);
        let tanh = self.a(tf);
        self.f(by_root);
        let one_plus = self.a(tf);
        let out = self.a(tf);
        Gelu {
            input,
            half,
            tanh,
            one_plus,
            out,
        }
    }

    /// `NewGELUActivation`'s backward from `fc2`'s input gradient (`grad`, freed): `fc1`'s
    /// output gradient. The product's two operands, `tanh`'s, `√(2/π)·`, the cube's
    /// (`0.044715·`, `pow(x, 2)`, `3·`) and `0.5·`, each path summed in.
    pub(super) fn gelu_backward(&mut self, grad: Handle, s: &Gelu) -> Handle {
        let tf = self.t() * self.d.ffn * self.d.c;
        let by_one_plus = self.a(tf);
        let by_half = self.a(tf);
        self.f(grad);
        self.f(s.one_plus);
        self.f(s.half);
        let tanh = self.a(tf);
        self.f(by_one_plus);
        self.f(s.tanh);
        let root = self.a(tf);
        self.f(tanh);
        let scaled = self.a(tf);
        let square = self.a(tf);
        let three = self.a(tf);
        let cube = self.a(tf);
        for h in [three, square, scaled, s.input] {
            self.f(h);
        }
        let inner = self.a(tf);
        self.f(root);
        self.f(cube);
        let half = self.a(tf);
        self.f(by_half);
        let sum = self.a(tf);
        self.f(inner);
        self.f(half);
        sum
    }

    /// A block's MLP backward from its output's gradient as the block's dropout sees it (the
    /// dropout's `mask`, freed): the dropout, the second linear (`fc2`, GPT-2's `c_proj`:
    /// `addmm`, the input's gradient first; its saved input, the GELU's output, freed), the
    /// GELU ([`Run::gelu_backward`]) and the first linear (`fc1`, `c_fc`). Returns the MLP
    /// input's gradient (`T·h·c`); the weights' into `g` (`down`, `up`).
    pub(super) fn gelu_mlp_backward(&mut self, mask: Handle, gelu: &Gelu, g: &mut Grads) -> Handle {
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let dropped = self.dropout_backward(mask, th);
        let g_gelu = self.a(t * d.ffn * c);
        g.down = self.a(d.h * d.ffn * c);
        self.f(dropped);
        self.f(gelu.out);
        let g_fc1 = self.gelu_backward(g_gelu, gelu);
        let input = self.a(th);
        g.up = self.a(d.ffn * d.h * c);
        self.f(g_fc1);
        input
    }

    /// The attention's backward from the layer's output gradient as the attention branch's
    /// dropout sees it: `dense`, the kernel, `RoPE` on k then q (the first layer's q frees the
    /// rotary tables: `first`), the `cat`s' slices put back into full-width gradients.
    /// Returns the gradients of q, k and v (`T·q·c`, `T·kv·c`, `T·kv·c`); `dense`'s weight's
    /// into `g`.
    fn phi_attention_backward(
        &mut self,
        s: &PhiSaved,
        first: bool,
        g: &mut Grads,
    ) -> (Handle, Handle, Handle) {
        let d = *self.d;
        let t = self.t();
        let c = d.c;
        let dropped = self.dropout_backward(s.attn_mask, t * d.h * c);
        let g_out = self.a(t * d.q * c);
        g.o = self.a(d.h * d.q * c);
        self.f(dropped);
        self.f(s.contiguous);
        let dq = self.a(t * d.q * c);
        let dk = self.a(t * d.kv * c);
        let dv = self.a(t * d.kv * c);
        for h in [g_out, s.k_cat, s.q_cat, s.v, s.lse, s.attn] {
            self.f(h);
        }
        let k_rot = self.rope_backward(None, d.kv / d.head_dim * ROTARY_DIM, false);
        let q_rot = self.rope_backward(None, d.heads * ROTARY_DIM, first);
        // `cat`'s backward hands slices of the kernel's gradients to `RoPE` and the pass-through
        // part; `slice_backward` writes each back at full width and the two are summed.
        let mut whole = |grad: Handle, rot: Handle, width: f64| {
            let pass = self.a(t * width * c);
            self.f(grad);
            let rotated = self.a(t * width * c);
            self.f(rot);
            let sum = self.a(t * width * c);
            self.f(pass);
            self.f(rotated);
            sum
        };
        let gk = whole(dk, k_rot, d.kv);
        let gq = whole(dq, q_rot, d.q);
        (gq, gk, dv)
    }

    /// One Phi layer's backward from its output's gradient (`grad`, freed once the residual's
    /// sum is made): its input's gradient and its weights'.
    fn phi_layer_backward(&mut self, grad: Handle, s: &PhiSaved, first: bool) -> (Handle, Grads) {
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let mut g = Grads::default();
        let normed_grad = self.gelu_mlp_backward(s.mlp_mask, &s.gelu, &mut g);
        // The attention's branch; its q, k and v input gradients summed into `fc1`'s.
        let (gq, gk, dv) = self.phi_attention_backward(s, first, &mut g);
        let from_v = self.a(th);
        g.v = self.a(d.kv * d.h * c);
        self.f(dv);
        let sum = self.a(th);
        self.f(normed_grad);
        self.f(from_v);
        let mut linear = |sum: Handle, grad: Handle, width: f64, last: bool| {
            let contiguous = self.a(t * width * c);
            self.f(grad);
            let input = self.a(th);
            let weight = self.a(width * d.h * c);
            self.f(contiguous);
            if last {
                self.f(s.normed);
            }
            let next = self.a(th);
            self.f(sum);
            self.f(input);
            (next, weight)
        };
        let (sum, k) = linear(sum, gk, d.kv, false);
        let (sum, q) = linear(sum, gq, d.q, true);
        (g.k, g.q) = (k, q);
        // `LayerNorm`'s backward, then the residual's sum.
        let normed = self.layer_norm_backward(sum, s.stats, s.input, c);
        let input = self.a(th);
        self.f(grad);
        self.f(normed);
        (input, g)
    }

    /// One Phi training step: forward, the loss, backward, `optimizer.step()`, `zero_grad`.
    pub(super) fn phi_train_step(&mut self) {
        debug_assert!(
            self.precision == super::Weights::Compute,
            "Phi is replayed in 16 bits only"
        );
        let d = *self.d;
        let t = self.t();
        let th = t * d.h * d.c;
        // Forward.
        let embedded = self.a(th);
        self.rotary_tables_of(ROTARY_DIM);
        let mut saved = Vec::with_capacity(d.layers);
        let mut x = embedded;
        for _ in 0..d.layers {
            let (out, s) = self.phi_layer(x);
            saved.push(s);
            x = out;
        }
        let (final_out, stats) = self.layer_norm(d.c);
        let log_probs = self.head_and_log_softmax();
        // Backward: the loss, the biased head (the input's gradient first), the final norm.
        let g_logits = self.loss_backward(log_probs);
        let (g_hidden, head) = self.head_backward(g_logits, final_out, true);
        let mut grad = self.layer_norm_backward(g_hidden, stats, x, d.c);
        let mut layers = Vec::with_capacity(d.layers);
        for (i, s) in saved.iter().enumerate().rev() {
            let (g_input, g) = self.phi_layer_backward(grad, s, i == 0);
            layers.push(g);
            grad = g_input;
        }
        layers.reverse();
        let table = self.a(d.vocab * d.h * d.c);
        self.f(grad);
        let grads = self.embedding_and_layer_grads(table, head, layers);
        self.step();
        for g in grads {
            self.f(g);
        }
    }
}
