//! Gemma-2's layer in the same two steps (`models/gemma2/modeling_gemma2.py`, 16 bits; issue 20).
//!
//! `Gemma2DecoderLayer` wraps both blocks in two norms each (`input_layernorm` and
//! `post_attention_layernorm` around the attention, `pre_feedforward_layernorm` and
//! `post_feedforward_layernorm` around the MLP), and `Gemma2RMSNorm` computes in fp32 before it
//! casts: the fp32 copy, `x · rsqrt` and the per-row `rsqrt` are saved, `· (1 + weight)` is an
//! fp32 temporary and the 16-bit cast is the output. The embedding is scaled into a new tensor
//! (`Gemma2TextScaledWordEmbedding`), the MLP is gated by a tanh GELU (requested as `silu`
//! is), and the logits are soft-capped (`final_logit_softcapping`: `/ cap`, `tanh` saved for
//! backward, `· cap`) before the loss's `float()`. The attention (SDPA's fused kernels, `RoPE`,
//! v, k and q) and the MLP's backward are Llama's ([`Run::attention_backward`],
//! [`Run::mlp_backward`]). As the oracle's event log of a two-layer Gemma-2-2B shows it
//! request for request (`tools/oracle/train_events.py --grid --steps 2`, the fixture beside
//! [`super`]):
//!
//! | step | requests (`T = b·s`, `c` the compute width) | code |
//! |---|---|---|
//! | embedding | `T·h·c`, then its scaled copy (kept to the forward's end), the first freed | `Gemma2TextScaledWordEmbedding.forward` |
//! | norm | fp32 copy, `pow(2)`, `mean`, `+ eps` (the mean freed), `rsqrt`, `x · rsqrt`, `· (1 + w)` (fp32, freed), the cast (the output) | `Gemma2RMSNorm.forward` |
//! | layer | norm, q/k/v, `RoPE`, kernel, `o_proj`, its norm (`o_proj`'s output freed), the residual sum (the norm's output freed); norm, MLP, its norm, the residual sum; the first sum freed | `Gemma2DecoderLayer.forward` |
//! | loss | the final norm, `lm_head`, `/ cap`, `tanh` (saved), `· cap`, `float()`, `log_softmax` | `Gemma2ForCausalLM.forward`, `ForCausalLMLoss` |
//! | backward | the norm's: the gradient's fp32 copy, the weight's and `normed`'s branches, `rsqrt`'s, the sum, the cast back; a post-norm's input gradient is also the residual's, so it is kept | autograd over the ops above |

use super::{Grads, Handle, Run, Saved};

/// What `Gemma2RMSNorm` keeps for backward.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GemmaNorm {
    pub(super) fp32: Handle,
    pub(super) rsqrt: Handle,
    pub(super) normed: Handle,
}

/// One Gemma-2 layer's saved tensors: Llama's attention and MLP tensors ([`Saved`]: its
/// norms unused) and the four norms.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GemmaSaved {
    pub(super) blocks: Saved,
    pub(super) input: GemmaNorm,
    pub(super) post_attention: GemmaNorm,
    pub(super) pre_feedforward: GemmaNorm,
    pub(super) post_feedforward: GemmaNorm,
}

impl Run<'_> {
    /// `Gemma2RMSNorm.forward` over the `h` columns of a 16-bit input: what it saves and its
    /// 16-bit output.
    pub(super) fn gemma_norm(&mut self) -> (GemmaNorm, Handle) {
        let t = self.t();
        let (h, c) = (self.d.h, self.d.c);
        let n = self.gemma_norm_until_normed();
        let scaled = self.a(4.0 * t * h);
        let out = self.a(t * h * c);
        self.f(scaled);
        (n, out)
    }

    /// `Gemma2RMSNorm.forward` up to `x · rsqrt`, the last tensor it saves (where a
    /// checkpointed layer's recompute stops): the fp32 copy, `pow(2)`, `mean`, `+ eps` (the
    /// mean freed), `rsqrt`, the product.
    pub(super) fn gemma_norm_until_normed(&mut self) -> GemmaNorm {
        let t = self.t();
        let h = self.d.h;
        let fp32 = self.a(4.0 * t * h);
        let pow = self.a(4.0 * t * h);
        let mean = self.a(4.0 * t);
        self.f(pow);
        let eps = self.a(4.0 * t);
        self.f(mean);
        let rsqrt = self.a(4.0 * t);
        self.f(eps);
        let normed = self.a(4.0 * t * h);
        GemmaNorm {
            fp32,
            rsqrt,
            normed,
        }
    }

    /// `Gemma2RMSNorm`'s backward from the 16-bit gradient of its output (`grad`, freed once
    /// its fp32 copy exists; `None` where the caller frees it: a post-norm's output gradient is
    /// its block's residual gradient too): its input's 16-bit gradient.
    pub(super) fn gemma_norm_backward(&mut self, grad: Handle, n: GemmaNorm) -> Handle {
        let up = self.a(4.0 * self.t() * self.d.h);
        self.gemma_norm_backward_from(up, grad, n, &[])
    }

    /// [`Run::gemma_norm_backward`] from the fp32 copy of the output's gradient (`up`, made
    /// before a checkpointed layer's recompute where this norm's backward runs first), freeing
    /// `then` once the saved input's last use is done: a checkpointed layer's input (and the
    /// first layer's rotary tables), which its frame holds until its last recomputed tensor is
    /// unpacked.
    pub(super) fn gemma_norm_backward_from(
        &mut self,
        up: Handle,
        grad: Handle,
        n: GemmaNorm,
        then: &[Handle],
    ) -> Handle {
        let t = self.t();
        let (h, c) = (self.d.h, self.d.c);
        self.f(grad);
        let by_weight = self.a(4.0 * t * h);
        let by_normed = self.a(4.0 * t * h);
        self.f(by_weight);
        self.f(up);
        self.f(n.normed);
        let m1 = self.a(4.0 * t * h);
        let by_rsqrt = self.a(4.0 * t * h);
        let sum = self.a(4.0 * t);
        self.f(m1);
        self.f(by_normed);
        let prod = self.mean_square_backward(sum, n.rsqrt, n.fp32, (4.0 * t, h));
        for &x in then {
            self.f(x);
        }
        let total = self.a(4.0 * t * h);
        self.f(by_rsqrt);
        self.f(prod);
        let back = self.a(t * h * c);
        self.f(total);
        back
    }

    /// One Gemma-2 layer's forward from its input (kept by the caller): its output and what
    /// it saved.
    fn gemma_layer(&mut self) -> (Handle, GemmaSaved) {
        self.gemma_layer_saving(false)
    }

    /// [`Run::gemma_layer`], or (`recompute`) a checkpointed layer's recompute in backward:
    /// the same requests up to the post-feedforward norm's `x · rsqrt`, then the recompute's
    /// locals (`down_proj`'s output, the first residual sum) freed and no output.
    pub(super) fn gemma_layer_saving(&mut self, recompute: bool) -> (Handle, GemmaSaved) {
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let mut s = GemmaSaved::default();
        (s.input, s.blocks.norm1_out) = self.gemma_norm();
        let q = self.a(t * d.q * c);
        let k = self.a(t * d.kv * c);
        s.blocks.v = self.a(t * d.kv * c);
        s.blocks.q_rope = self.rope(d.q);
        s.blocks.k_rope = self.rope(d.kv);
        self.f(q);
        self.f(k);
        s.blocks.attn = self.a(t * d.q * c);
        s.blocks.lse = self.a(d.b * d.heads * d.s * 4.0);
        let o = self.a(th);
        let post_attention;
        (s.post_attention, post_attention) = self.gemma_norm();
        self.f(o);
        let r1 = self.a(th);
        self.f(post_attention);
        (s.pre_feedforward, s.blocks.norm2_out) = self.gemma_norm();
        s.blocks.gate = self.a(t * d.ffn * c);
        s.blocks.act = self.a(t * d.ffn * c);
        s.blocks.up = self.a(t * d.ffn * c);
        s.blocks.product = self.a(t * d.ffn * c);
        let down = self.a(th);
        if recompute {
            s.post_feedforward = self.gemma_norm_until_normed();
            self.f(down);
            self.f(r1);
            return (None, s);
        }
        let post_feedforward;
        (s.post_feedforward, post_feedforward) = self.gemma_norm();
        self.f(down);
        let r2 = self.a(th);
        self.f(post_feedforward);
        self.f(r1);
        (r2, s)
    }

    /// One Gemma-2 layer's backward from its output's gradient (freed): its input's gradient
    /// and its weights'.
    fn gemma_layer_backward(
        &mut self,
        grad: Handle,
        s: &GemmaSaved,
        first: bool,
    ) -> (Handle, Grads) {
        let up = self.a(4.0 * self.t() * self.d.h);
        self.gemma_layer_backward_from(grad, s, first, up, &[])
    }

    /// [`Run::gemma_layer_backward`] from the fp32 copy of the output's gradient its first node
    /// made (`up`: a checkpointed layer makes it before the recompute), freeing `frame` with
    /// the input norm's saved fp32 copy (a checkpointed layer's input and the tables its
    /// frame holds; [`Run::gemma_norm_backward_from`]). `first` frees the rotary tables at
    /// the first `RoPE` backward, as autograd does without checkpointing.
    pub(super) fn gemma_layer_backward_from(
        &mut self,
        grad: Handle,
        s: &GemmaSaved,
        first: bool,
        up: Handle,
        frame: &[Handle],
    ) -> (Handle, Grads) {
        let d = *self.d;
        let th = self.t() * d.h * d.c;
        let mut g = Grads::default();
        let post_feedforward = self.gemma_norm_backward_from(up, None, s.post_feedforward, &[]);
        let mlp_in = self.mlp_backward(post_feedforward, &s.blocks, &mut g);
        let pre_feedforward = self.gemma_norm_backward(mlp_in, s.pre_feedforward);
        let g_r1 = self.a(th);
        self.f(grad);
        self.f(pre_feedforward);
        let post_attention = self.gemma_norm_backward(None, s.post_attention);
        let attn_in = self.attention_backward(post_attention, &s.blocks, first, &mut g);
        let up = self.a(4.0 * self.t() * d.h);
        let input = self.gemma_norm_backward_from(up, attn_in, s.input, frame);
        let g_input = self.a(th);
        self.f(g_r1);
        self.f(input);
        (g_input, g)
    }

    /// One Gemma-2 training step: forward, the soft-capped loss, backward,
    /// `optimizer.step()`, `zero_grad`.
    pub(super) fn gemma_train_step(&mut self) {
        debug_assert!(
            self.precision == super::Weights::Compute,
            "Gemma-2 is replayed in 16 bits only"
        );
        let d = *self.d;
        let t = self.t();
        let (c, th) = (d.c, t * d.h * d.c);
        let logits = t * d.vocab * c;
        // Forward.
        let embedding = self.a(th);
        let embedded = self.a(th);
        self.f(embedding);
        self.rotary_tables();
        let mut saved = Vec::with_capacity(d.layers);
        // Under checkpointing each layer's input, which its frame keeps for the recompute.
        let mut inputs = Vec::with_capacity(d.layers);
        let mut x = embedded;
        for _ in 0..d.layers {
            if self.step.checkpointed {
                inputs.push(x);
                x = self.gemma_layer_unsaved();
                continue;
            }
            let (out, s) = self.gemma_layer();
            saved.push(s);
            if x != embedded {
                self.f(x);
            }
            x = out;
        }
        let (final_norm, out) = self.gemma_norm();
        self.f(x);
        if !self.step.checkpointed {
            self.f(embedded);
        }
        let product = self.a(logits);
        let divided = self.a(logits);
        self.f(product);
        let tanh = self.a(logits);
        self.f(divided);
        let capped = self.a(logits);
        let upcast = self.a(4.0 * t * d.vocab);
        let log_probs = self.a(4.0 * t * d.vocab);
        self.f(upcast);
        self.f(capped);
        // Backward: the loss, the soft-cap, the head.
        let g_capped = self.loss_backward(log_probs);
        let g_tanh = self.a(logits);
        self.f(g_capped);
        let g_divided = self.a(logits);
        self.f(g_tanh);
        self.f(tanh);
        let g_logits = self.a(logits);
        self.f(g_divided);
        let (g_hidden, head) = self.head_backward(g_logits, out, false);
        let mut grad = self.gemma_norm_backward(g_hidden, final_norm);
        let mut layers = Vec::with_capacity(d.layers);
        if self.step.checkpointed {
            for (i, &input) in inputs.iter().enumerate().rev() {
                let (g_input, g) = self.gemma_layer_backward_checkpointed(grad, input, i == 0);
                layers.push(g);
                grad = g_input;
            }
        }
        for (i, s) in saved.iter().enumerate().rev() {
            let (g_input, g) = self.gemma_layer_backward(grad, s, i == 0);
            layers.push(g);
            grad = g_input;
        }
        layers.reverse();
        // The scaled embedding's gradient, then the table's.
        let scaled = self.a(th);
        self.f(grad);
        let table = self.a(d.vocab * d.h * c);
        self.f(scaled);
        let grads = self.embedding_and_layer_grads(table, head, layers);
        self.step();
        for g in grads {
            self.f(g);
        }
    }
}
