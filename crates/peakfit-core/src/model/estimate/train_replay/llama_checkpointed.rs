//! Llama's layer under gradient checkpointing (`gradient-checkpointing: full`: transformers'
//! `gradient_checkpointing_enable()`, `torch.utils.checkpoint` non-reentrant; issue 20), as the
//! oracle's event log of a two-layer Llama-3.2-1B shows it request for request
//! (`tools/oracle/train_events.py --grid --steps 2 --large
//! llama-3.2-1b-2l-training-bf16-b2-t1024-gcfull-adamw`, the fixture beside [`super`]).
//! What checkpointing changes is [`super::gemma2_checkpointed`]'s, on Llama's layer:
//!
//! | step | requests | code |
//! |---|---|---|
//! | forward | each layer as without checkpointing, every tensor freed once the next op has it (the norm's fp32 copy after `x · rsqrt`, its normalised product after the cast's weight product); the layer's input kept by its frame | `checkpoint(..., use_reentrant=False)`, `_checkpoint_hook.pack_hook` |
//! | backward, per layer | the recompute first (the layer's last op, the residual sum, needs no saved tensor): the layer's forward with its tensors saved, stopped once `down_proj` packs its input (the MLP's product), the first residual sum freed; then the layer's backward, each recomputed tensor freed as its node unpacks it, before the node's incoming gradient (`Run::node_end`) | `_recomputation_hook`, `_StopRecomputationError` |
//! | the frame's end | the layer's input (and the first layer's rotary tables, every frame's input) freed once the input norm's saved fp32 copy is | `_checkpoint_hook.unpack_hook` |
//!
//! The loss, the head and `optimizer.step()` are the run's without checkpointing.

use super::{Grads, Handle, Run};

impl Run<'_> {
    /// `LlamaRMSNorm.forward` over `width` columns saving nothing: its output.
    fn norm_unsaved(&mut self, width: f64, dim: f64) -> Handle {
        let t = self.t();
        let c = self.d.c;
        let [fp32, mean, rsqrt, normed] = self.norm_until_normed(width, dim);
        self.f(rsqrt);
        self.f(fp32);
        let cast = self.a(t * width * c);
        let out = self.a(t * width * c);
        self.f(cast);
        self.f(normed);
        self.f(mean);
        out
    }

    /// The attention of a checkpointed layer from its norm's output (`normed`, freed with the
    /// kernel's inputs once `o_proj` has run): `o_proj`'s output. Qwen3's per-head norms free
    /// each projection once their output exists. Llama's layer and Gemma-2's run it alike.
    pub(super) fn attention_unsaved(&mut self, normed: Handle) -> Handle {
        let d = *self.d;
        let t = self.t();
        let c = d.c;
        let (q, k, v) = if d.qk_norm {
            let q = self.a(t * d.q * c);
            let qn = self.norm_unsaved(d.q, d.head_dim);
            self.f(q);
            let k = self.a(t * d.kv * c);
            let kn = self.norm_unsaved(d.kv, d.head_dim);
            self.f(k);
            (qn, kn, self.a(t * d.kv * c))
        } else {
            (
                self.a(t * d.q * c),
                self.a(t * d.kv * c),
                self.a(t * d.kv * c),
            )
        };
        let q_rope = self.rope(d.q);
        let k_rope = self.rope(d.kv);
        self.f(q);
        self.f(k);
        let attn = self.a(t * d.q * c);
        let lse = self.a(d.b * d.heads * d.s * 4.0);
        let o = self.a(t * d.h * c);
        for x in [attn, lse, q_rope, k_rope, v, normed] {
            self.f(x);
        }
        o
    }

    /// The gated MLP of a checkpointed layer from its norm's output (`normed`, freed once
    /// `down_proj` has run): `down_proj`'s output. `silu` and Gemma-2's tanh GELU alike.
    pub(super) fn mlp_unsaved(&mut self, normed: Handle) -> Handle {
        let d = *self.d;
        let tf = self.t() * d.ffn * d.c;
        let gate = self.a(tf);
        let act = self.a(tf);
        self.f(gate);
        let up = self.a(tf);
        let product = self.a(tf);
        self.f(act);
        self.f(up);
        let down = self.a(self.t() * d.h * d.c);
        self.f(product);
        self.f(normed);
        down
    }

    /// One decoder layer's checkpointed forward: its output, nothing saved.
    pub(super) fn layer_unsaved(&mut self) -> Handle {
        let d = *self.d;
        let th = self.t() * d.h * d.c;
        let normed = self.norm_unsaved(d.h, d.h);
        let o = self.attention_unsaved(normed);
        let r1 = self.a(th);
        self.f(o);
        let normed = self.norm_unsaved(d.h, d.h);
        let down = self.mlp_unsaved(normed);
        let r2 = self.a(th);
        self.f(down);
        self.f(r1);
        r2
    }

    /// One checkpointed layer's backward from its output's gradient (freed by the caller's
    /// residual sum) and its kept `input` (freed at the frame's end): its input's gradient and
    /// its weights'.
    pub(super) fn layer_backward_checkpointed(
        &mut self,
        grad: Handle,
        input: Handle,
        first: bool,
    ) -> (Handle, Grads) {
        let (_, s) = self.layer_saving(true);
        // The rotary tables are every frame's input, not the first `RoPE` backward's to free.
        let tables = if first {
            std::mem::take(&mut self.tables)
        } else {
            (None, None)
        };
        self.layer_backward_then(grad, &s, false, &[input, tables.0, tables.1])
    }
}
