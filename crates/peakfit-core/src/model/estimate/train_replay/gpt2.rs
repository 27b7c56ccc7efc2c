//! GPT-2's layer in the same two steps (`models/gpt2/modeling_gpt2.py`, 16 bits; issue 20).
//!
//! `GPT2Block` is pre-norm like Llama's, with `LayerNorm` (which saves its input, so no
//! layer's input is freed before backward), one fused `c_attn` (`Conv1D`: `addmm` to
//! `T·3h`, split into q, k and v views that SDPA saves), learned positions (`wpe`) added to the
//! token embedding, Phi's composed GELU ([`super::phi`]'s [`Gelu`]) and a dropout after the
//! embedding, the attention and the MLP (`embd_pdrop`, `resid_pdrop`; `attn_pdrop` goes to SDPA's
//! kernel, which keeps no mask). The head is the token embedding (tied, unbiased). As the
//! oracle's event log of a two-layer GPT-2 shows it request for request
//! (`tools/oracle/train_events.py --grid --steps 2
//! gpt2-2l-training-bf16-b4-t1024-gcnone-adamw`, the config cut to two layers; the fixture beside
//! [`super`]):
//!
//! | step | requests (`T = b·s`, `c` the compute width, `f` the MLP's width) | code |
//! |---|---|---|
//! | embedding | `wte` (`T·h·c`) and `wpe` (`s·h·c`), both kept to the forward's end; their sum; its dropout (the mask and the output), the sum freed | `GPT2Model.forward` |
//! | attention | `ln_1` (output, fp32 mean and rstd); cuBLAS's workspace at the first matmul; `c_attn` (`T·3h·c`, saved); the flash kernel's output and log-sum-exp (saved); `c_proj`; its dropout; the residual sum | `GPT2Attention.forward`, `GPT2Block.forward` |
//! | MLP | `ln_2`; `c_fc` and the GELU ([`Gelu`]); `c_proj`; its dropout; the residual sum; both dropouts' outputs freed | `GPT2MLP.forward` |
//! | loss | `ln_f`; `wte`'s and `wpe`'s outputs freed; the head (`mm`), `float()`, `log_softmax` | `GPT2LMHeadModel.forward`, `ForCausalLMLoss` |
//! | backward | per layer the MLP (dropout, `c_proj`, the GELU, `c_fc`, `ln_2`), the residual's sum, the attention (dropout, `c_proj`, the kernel, `cat` of dq, dk and dv, `c_attn`, `ln_1`), the residual's sum; then the embedding's dropout, `wpe`'s (the batch summed first) and `wte`'s gradients, the tied sum | autograd over the ops above |
//!
//! The three dropouts run where `residual-dropout` (`resid_pdrop`, which `--model-config`
//! reads; `embd_pdrop` is taken to match, as in every published config) is above 0 or unstated
//! (their 0.1); at 0 there are no masks or copies and the embeddings' sum is the first layer's
//! input (the fixture without dropout). `n_positions` is assumed rather than read: 1,024, every
//! published GPT-2 checkpoint's (`wpe` is `1024·h`, its gradient and state large-pool blocks
//! above `h` 512), or the context where it is longer. So `hf::replays` takes the replay as a
//! floor under the count.

use super::phi::Gelu;
use super::{CUBLAS_WORKSPACE, Grads, Handle, Run};

/// `n_positions` of every published GPT-2 checkpoint: the rows of `wpe`.
pub(super) const POSITIONS: f64 = 1024.0;

/// What one GPT-2 layer's forward keeps for backward.
#[derive(Clone, Copy, Debug, Default)]
struct Gpt2Saved {
    /// The layer's input: `ln_1`'s saved input.
    input: Handle,
    ln_1: (Handle, (Handle, Handle)),
    /// `c_attn`'s output: q, k and v as SDPA saves them.
    qkv: Handle,
    attn: Handle,
    lse: Handle,
    attn_mask: Handle,
    /// The residual after the attention: `ln_2`'s saved input.
    mid: Handle,
    ln_2: (Handle, (Handle, Handle)),
    gelu: Gelu,
    mlp_mask: Handle,
}

impl Run<'_> {
    /// One GPT-2 layer's forward from its input `x` (saved by `ln_1`): its output and what it
    /// saved.
    fn gpt2_layer(&mut self, x: Handle) -> (Handle, Gpt2Saved) {
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let mut s = Gpt2Saved {
            input: x,
            ..Gpt2Saved::default()
        };
        s.ln_1 = self.layer_norm(c);
        if self.workspaces[0].is_none() {
            self.workspaces[0] = self.a(CUBLAS_WORKSPACE);
        }
        s.qkv = self.a(t * (d.q + 2.0 * d.kv) * c);
        s.attn = self.a(t * d.q * c);
        s.lse = self.a(d.b * d.heads * d.s * 4.0);
        let proj = self.a(th);
        let attn;
        (s.attn_mask, attn) = self.resid_dropout(proj);
        s.mid = self.a(th);
        s.ln_2 = self.layer_norm(c);
        s.gelu = self.fc1_gelu();
        let proj = self.a(th);
        let mlp;
        (s.mlp_mask, mlp) = self.resid_dropout(proj);
        let out = self.a(th);
        self.f(attn);
        self.f(mlp);
        (out, s)
    }

    /// One GPT-2 layer's backward from its output's gradient (`grad`, freed once the first
    /// residual sum is made): its input's gradient and its weights' (`c_attn` as `q`, the
    /// attention's `c_proj` as `o`, `c_fc` as `up`, the MLP's `c_proj` as `down`).
    fn gpt2_layer_backward(&mut self, grad: Handle, s: &Gpt2Saved) -> (Handle, Grads) {
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let mut g = Grads::default();
        // The MLP (`Conv1D`'s `addmm`s: the input's gradient first), then `ln_2`.
        let g_normed = self.gelu_mlp_backward(s.mlp_mask, &s.gelu, &mut g);
        self.f(s.ln_2.0);
        let g_ln_2 = self.layer_norm_backward(g_normed, s.ln_2.1, s.mid, c);
        let g_mid = self.a(th);
        self.f(grad);
        self.f(g_ln_2);
        // The attention: its dropout, `c_proj`, the kernel, `c_attn`, `ln_1`.
        let dropped = self.dropout_backward(s.attn_mask, th);
        let g_attn = self.a(t * d.q * c);
        g.o = self.a(d.q * d.h * c);
        self.f(dropped);
        let dq = self.a(t * d.q * c);
        let dk = self.a(t * d.kv * c);
        let dv = self.a(t * d.kv * c);
        for h in [g_attn, s.qkv, s.lse, s.attn] {
            self.f(h);
        }
        let g_qkv = self.a(t * (d.q + 2.0 * d.kv) * c);
        for h in [dq, dk, dv] {
            self.f(h);
        }
        let g_normed = self.a(th);
        g.q = self.a(d.h * (d.q + 2.0 * d.kv) * c);
        self.f(g_qkv);
        self.f(s.ln_1.0);
        let g_ln_1 = self.layer_norm_backward(g_normed, s.ln_1.1, s.input, c);
        let g_input = self.a(th);
        self.f(g_mid);
        self.f(g_ln_1);
        (g_input, g)
    }

    /// One GPT-2 training step: forward, the loss, backward, `optimizer.step()`, `zero_grad`.
    pub(super) fn gpt2_train_step(&mut self) {
        debug_assert!(
            self.precision == super::Weights::Compute,
            "GPT-2 is replayed in 16 bits only"
        );
        let d = *self.d;
        let t = self.t();
        let th = t * d.h * d.c;
        // Forward: the embeddings, the layers, `ln_f`, the head and the loss.
        let tokens = self.a(th);
        let positions = self.a(d.s * d.h * d.c);
        let sum = self.a(th);
        let (embedding_mask, embedded) = self.resid_dropout(sum);
        let mut saved = Vec::with_capacity(d.layers);
        let mut x = embedded;
        for _ in 0..d.layers {
            let (out, s) = self.gpt2_layer(x);
            saved.push(s);
            x = out;
        }
        let ln_f = self.layer_norm(d.c);
        self.f(tokens);
        self.f(positions);
        let log_probs = self.head_and_log_softmax();
        // Backward: the loss, the head (`mm`: the weight's gradient first), `ln_f`.
        let g_logits = self.loss_backward(log_probs);
        let (g_hidden, head) = self.head_backward(g_logits, ln_f.0, false);
        let mut grad = self.layer_norm_backward(g_hidden, ln_f.1, x, d.c);
        let mut layers = Vec::with_capacity(d.layers);
        for s in saved.iter().rev() {
            let (g_input, g) = self.gpt2_layer_backward(grad, s);
            layers.push(g);
            grad = g_input;
        }
        layers.reverse();
        // The embedding's dropout; `wpe`'s gradient (the batch's sum of the broadcast
        // positions first, none for one sequence); `wte`'s.
        let g_sum = if self.step.dropout {
            let g_sum = self.a(th);
            self.f(grad);
            self.f(embedding_mask);
            g_sum
        } else {
            grad
        };
        let summed = if d.b > 1.0 {
            self.a(d.s * d.h * d.c)
        } else {
            None
        };
        let wpe = self.a(POSITIONS.max(d.s) * d.h * d.c);
        self.f(summed);
        let wte = self.a(d.vocab * d.h * d.c);
        self.f(g_sum);
        let mut grads = self.embedding_and_layer_grads(wte, head, layers);
        grads.insert(1, wpe);
        self.step();
        for g in grads {
            self.f(g);
        }
    }
}
