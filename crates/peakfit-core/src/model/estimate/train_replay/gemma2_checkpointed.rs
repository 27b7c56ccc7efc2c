//! Gemma-2's layer under gradient checkpointing (`gradient-checkpointing: full`: transformers'
//! `gradient_checkpointing_enable()`, `torch.utils.checkpoint` non-reentrant; issue 20).
//!
//! The count of a checkpointed step's segments ([`crate::model::estimate::hf`]'s
//! `counted_training_slack`) guesses which of the loss's segments the first step's state pins,
//! and on Gemma-2-2B that guess swings: one H200 reserved 8 % under it at 16 × 1,024 and 11 %
//! over it at 20 × 1,024 (`tests/data/h200e`), where the oracle's replay reserves what the GPU
//! did to the byte. So its layer is replayed, as the oracle's event log of a two-layer
//! Gemma-2-2B shows it request for request (`tools/oracle/train_events.py --grid --steps 2
//! gemma-2-2b-2l-training-bf16-b1-t1024-gcfull-adamw`, the fixture beside [`super`]):
//!
//! | step | requests | code |
//! |---|---|---|
//! | forward | each layer as without checkpointing, but every tensor freed once the next op has it (the checkpoint's pack hook keeps nothing); the layer's input kept by its frame | `checkpoint(..., use_reentrant=False)`, `_checkpoint_hook.pack_hook` |
//! | backward, per layer | the post-feedforward norm's first node (the fp32 copy of the output's gradient: it needs no saved tensor), then the recompute: the layer's forward with its tensors saved, stopped once the last saved tensor is packed (the post-feedforward norm's `x · rsqrt`; its `· (1 + w)` never runs), the recompute's other locals (`down_proj`'s output, the first residual sum) freed; then the layer's backward as without checkpointing, but each recomputed tensor freed as its node unpacks it, before the node's incoming gradient (`Run::node_end`) | `_recomputation_hook`, `_StopRecomputationError` |
//! | the frame's end | the layer's input (and the first layer's rotary tables, every frame's input) freed once the input norm's saved fp32 copy is | `_checkpoint_hook.unpack_hook` |
//!
//! The loss, the head and `optimizer.step()` are the run's without checkpointing.

use super::{Grads, Handle, Run};

impl Run<'_> {
    /// `Gemma2RMSNorm.forward` saving nothing: its 16-bit output (the fp32 copy and `rsqrt`
    /// freed once `x · rsqrt` exists, that product once the weight's).
    fn gemma_norm_unsaved(&mut self) -> Handle {
        let t = self.t();
        let (h, c) = (self.d.h, self.d.c);
        let n = self.gemma_norm_until_normed();
        self.f(n.rsqrt);
        self.f(n.fp32);
        let scaled = self.a(4.0 * t * h);
        self.f(n.normed);
        let out = self.a(t * h * c);
        self.f(scaled);
        out
    }

    /// One Gemma-2 layer's checkpointed forward: its output, nothing saved.
    pub(super) fn gemma_layer_unsaved(&mut self) -> Handle {
        let th = self.t() * self.d.h * self.d.c;
        let normed = self.gemma_norm_unsaved();
        let o = self.attention_unsaved(normed);
        let post_attention = self.gemma_norm_unsaved();
        self.f(o);
        let r1 = self.a(th);
        self.f(post_attention);
        let pre_feedforward = self.gemma_norm_unsaved();
        let down = self.mlp_unsaved(pre_feedforward);
        let post_feedforward = self.gemma_norm_unsaved();
        self.f(down);
        let r2 = self.a(th);
        self.f(post_feedforward);
        self.f(r1);
        r2
    }

    /// One checkpointed Gemma-2 layer's backward from its output's gradient (freed) and its
    /// kept `input` (freed at the frame's end): its input's gradient and its weights'.
    pub(super) fn gemma_layer_backward_checkpointed(
        &mut self,
        grad: Handle,
        input: Handle,
        first: bool,
    ) -> (Handle, Grads) {
        let up = self.a(4.0 * self.t() * self.d.h);
        let (_, s) = self.gemma_layer_saving(true);
        // The rotary tables are every frame's input, not the first `RoPE` backward's to free.
        let tables = if first {
            std::mem::take(&mut self.tables)
        } else {
            (None, None)
        };
        self.gemma_layer_backward_from(grad, &s, false, up, &[input, tables.0, tables.1])
    }
}
