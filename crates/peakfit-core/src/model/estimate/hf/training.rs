//! A training step's tensors: its numeric regime, what autograd saves per layer and after the
//! blocks, the loss's tensors, backward's transient and autocast's 16-bit weight copies.

use super::block::{Block, Mlp, Pass};
use crate::model::estimate::{Checkpointing, Dtype, Inputs, Optimizer};

/// Numeric regime of a training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Precision {
    /// Weights, activations and optimizer state in bf16/fp16.
    Pure16,
    /// fp32 weights under `torch.autocast` to 16 bits: linears in 16 bits, norms, residual
    /// stream and loss in fp32.
    Autocast,
    Fp32,
}

impl Precision {
    /// Width of the linears' outputs.
    pub(super) fn c(self) -> f64 {
        match self {
            Self::Pure16 | Self::Autocast => 2.0,
            Self::Fp32 => 4.0,
        }
    }

    /// Width of the residual stream (embedding output, residual adds, norm outputs).
    fn r(self) -> f64 {
        match self {
            Self::Pure16 => 2.0,
            Self::Autocast | Self::Fp32 => 4.0,
        }
    }
}

/// Who trains: every weight, or PEFT LoRA adapters of this rank on every linear layer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Trainable {
    All,
    Lora(f64),
}

/// Bytes a linear layer saves of an input of `width` bytes per element, per element: the
/// input itself when its weight trains (once per tensor, `shared`), else what the adapter's
/// `lora_A` saves. PEFT casts the input to the adapter's dtype first
/// (`LoraLayer._cast_input_dtype`), and the adapters are fp32 (`autocast_adapter_dtype=True`),
/// so a 16-bit input gets an fp32 copy per adapted layer; under autocast `lora_A` instead runs
/// in 16 bits on autocast's own cast. Autocast casts every linear's fp32 input separately
/// (activations are not cached, `cached_cast` caches only leaf weights).
fn consumer_saved(trainable: Trainable, prec: Precision, width: f64, consumers: f64) -> f64 {
    match (trainable, prec) {
        (Trainable::All, Precision::Autocast) if width > 2.0 => 2.0 * consumers,
        (Trainable::All, _) | (Trainable::Lora(_), Precision::Fp32) => width,
        (Trainable::Lora(_), Precision::Pure16) => 4.0 * consumers,
        (Trainable::Lora(_), Precision::Autocast) => 2.0 * consumers,
    }
}

/// Bytes one norm saves per element of its input, beyond what its consumers save.
/// `LlamaRMSNorm`: `pow(2)` and `* rsqrt` save the fp32 input (a new tensor unless the stream
/// is fp32 already), and `weight * x.to(input_dtype)` saves `x` when the weight trains
/// (Gemma's `output * (1.0 + weight.float())` saves the fp32 `output`).
/// `F.layer_norm` saves its input (autocast runs it in fp32).
fn norm_saved(block: &Block, trainable: Trainable, prec: Precision) -> f64 {
    if !block.rms() {
        return prec.r().max(if prec == Precision::Autocast {
            4.0
        } else {
            0.0
        });
    }
    4.0 + match trainable {
        Trainable::All if block.fp32_norm_weight() => 4.0,
        Trainable::All => prec.r(),
        Trainable::Lora(_) => 0.0,
    }
}

/// Bytes autograd saves in one block during a training forward without recomputation, for `T`
/// tokens (`b` sequences of `s`). Per op (`torch/csrc/autograd/generated` formulas: a `mul`
/// saves the operand the other's gradient needs, `linear` its input for the weight gradient,
/// `silu`/`gelu` their input, SDPA's flash/efficient kernels q, k, v, output and log-sum-exp):
///
/// - each norm: [`norm_saved`]; its consumers: [`consumer_saved`] (q, k, v or the fused
///   `qkv_proj`; gate and up);
/// - q/k norms (Qwen3): the fp32 copies of q and k, and their 16-bit casts when trained;
/// - attention: SDPA's q (after `RoPE`), k, v, output (`c` each) and fp32 log-sum-exp per head and
///   token; with a fused `qkv_proj` v is a view that keeps the whole projection alive; eager:
///   q, the repeated k and v, the fp32 softmax and its 16-bit cast (`(4+c)·b·heads·s²`), or for
///   a softmax that keeps its input's dtype (BERT, GPT-2, Whisper, Falcon) its `c`-wide output,
///   the fp32 one and its cast again under autocast ([`Block::softmax_keeps_dtype`]);
/// - `o_proj`'s input (the contiguous transpose of the attention output): [`consumer_saved`];
/// - MLP, gated: `gate` (by `act`), `act(gate)` and `up` (by the product), the product (by
///   `down`, as [`consumer_saved`]); fused gate/up: the `2I` output (both chunks are views of
///   it) instead of gate and up; plain: `fc1`'s output (by `gelu`) and `fc2`'s input;
/// - LoRA: each adapter's `lora_A` output (rank wide, fp32 or autocast's 16 bits) saved by
///   `lora_B`.
fn saved_per_layer(block: &Block, p: &Pass, trainable: Trainable, prec: Precision) -> f64 {
    let t = p.t();
    let (c, r) = (prec.c(), prec.r());
    let norms = block.norms() * norm_saved(block, trainable, prec) * t * block.h;
    let attn_in = consumer_saved(trainable, prec, r, block.attention_inputs()) * t * block.h;
    let mlp_in = consumer_saved(trainable, prec, r, block.mlp_inputs()) * t * block.h;
    let qk_norm = if block.qk_norm() {
        let trained = if trainable == Trainable::All { c } else { 0.0 };
        (4.0 + trained) * t * (block.q + block.kv)
    } else {
        0.0
    };
    let v = if block.fused_qkv() {
        block.q + 2.0 * block.kv
    } else {
        block.kv
    };
    // The score path saves the fp32 softmax and, in 16 bits, its cast (`matmul` with v);
    // in fp32 they are one tensor. A softmax that keeps its input's dtype saves its 16-bit
    // output, except under autocast (see `Block::softmax_keeps_dtype`). SDPA's math kernel
    // saves its fp32 `_safe_softmax` output, for that op's backward and the `matmul` with v,
    // in every precision (its 16-bit cast of the probabilities is returned and dropped).
    let attention = if p.scores(block) {
        let per_score = if p.math_kernel(block) {
            4.0
        } else if block.softmax_keeps_dtype() && prec != Precision::Autocast {
            c
        } else {
            4.0 + if c < 4.0 { c } else { 0.0 }
        } + if block.softcapped_scores() { c } else { 0.0 };
        score_inputs_saved(block, p, c) + per_score * p.b * block.heads * p.s * p.s
    } else if block.windowed(p.s) {
        // A window shorter than the sequence hands SDPA a boolean mask, converted to the
        // query's dtype in every call (`convert_boolean_attn_mask`) and saved as the kernel's
        // `attn_bias` for backward; with a mask transformers passes no `enable_gqa`
        // (`use_gqa_in_sdpa`), so k and v are saved repeated to every head (`repeat_kv`).
        let (k, v) = if block.kv < block.q {
            (block.q, block.q)
        } else {
            (block.kv, v)
        };
        c * t * (2.0 * block.q + k + v) + 4.0 * t * block.heads + c * p.b * p.s * p.s
    } else {
        c * t * (2.0 * block.q + block.kv + v) + 4.0 * t * block.heads
    };
    let o_in = consumer_saved(trainable, prec, c, 1.0) * t * block.q;
    let mlp = match block.mlp {
        Mlp::Gated | Mlp::FusedGated => 3.0 * c * t * block.ffn,
        // NewGELU saves its input (`pow`), `tanh`'s output and the product's two operands
        // (`0.5 * x` and `1 + tanh`). Under autocast `pow` runs in fp32 (CUDA's fp32 list) on
        // an fp32 copy of its input, and the ops after it promote to fp32: three of the four
        // are 4 B wide; `0.5 * x` stays 16-bit.
        Mlp::Plain if block.composed_gelu() => {
            let wide = if prec == Precision::Autocast { 4.0 } else { c };
            (3.0 * wide + c) * t * block.ffn
        }
        Mlp::Plain => c * t * block.ffn,
    } + consumer_saved(trainable, prec, c, 1.0) * t * block.ffn;
    let lora = match trainable {
        Trainable::Lora(rank) => {
            let width = if prec == Precision::Autocast {
                2.0
            } else {
                4.0
            };
            block.linears() * width * t * rank + expert_weights_folded(block, prec)
        }
        Trainable::All => 0.0,
    };
    norms + attn_in + mlp_in + qk_norm + attention + o_in + mlp + lora
}

/// q, k and v as a training step's score `bmm`s save them for backward: in the compute dtype
/// (`3·T·q·c`, k and v already repeated to every head), or, in SDPA's math kernel, the scaled
/// fp32 q and the fp32 k and v broadcast to every head (`12·T·q` in any precision: the kernel
/// upcasts 16-bit inputs, `_scaled_dot_product_attention_math`).
fn score_inputs_saved(block: &Block, p: &Pass, c: f64) -> f64 {
    let per = if p.math_kernel(block) { 12.0 } else { 3.0 * c };
    per * p.t() * block.q
}

/// PEFT adapts a mixture of experts' stacked 3-D expert parameters through `ParamWrapper`, a
/// `torch.nn.utils.parametrize` parametrization: every forward folds the adapter into a new
/// full-size weight (`_LoraFactorsProxy.forward`: `torch.baddbmm(W, lhs, rhs, alpha=scaling)`,
/// in `W`'s dtype with autocast off), and the experts' `grouped_mm` saves that weight for the
/// input's gradient. So each adapted layer keeps a copy of its `gate_up_proj` and `down_proj`
/// stacks, `E·3·I·h` in the frozen weights' width, until its backward.
fn expert_weights_folded(block: &Block, prec: Precision) -> f64 {
    if block.experts > 1.0 {
        block.experts * 3.0 * block.ffn * block.h * prec.r()
    } else {
        0.0
    }
}

/// Bytes LoRA's dropout adds per block when its probability is above 0: each adapted layer's
/// `lora_dropout` (`nn.Dropout`, not PEFT's `nn.Identity`) saves its boolean mask (1 B per
/// input element), and its output replaces the input copy `lora_A` saved; in fp32, where
/// `lora_A` saved the shared input itself, the dropped-out copy is new (4 B more).
/// (`peft/tuners/lora/layer.py`, `Linear.forward`: `lora_B(lora_A(dropout(x)))`.)
fn lora_dropout_saved(block: &Block, p: &Pass, prec: Precision) -> f64 {
    let per = 1.0 + if prec == Precision::Fp32 { 4.0 } else { 0.0 };
    let inputs =
        block.attention_inputs() * block.h + block.q + block.mlp_inputs() * block.h + block.ffn;
    per * p.t() * inputs
}

/// What stays saved after the blocks: the final norm and, when the head trains, its input.
fn head_saved(block: &Block, p: &Pass, trainable: Trainable, prec: Precision) -> f64 {
    let t = p.t();
    let head_in = if trainable == Trainable::All {
        consumer_saved(trainable, prec, prec.r(), 1.0)
    } else {
        0.0
    };
    (norm_saved(block, trainable, prec) + head_in) * t * block.h
}

/// The loss's peak at the start of backward: `ForCausalLMLoss` upcasts the logits
/// (`logits.float()`) and `cross_entropy` saves `log_softmax`'s fp32 output; backward then holds
/// the NLL gradient and `log_softmax`'s input gradient beside it: three fp32 `T·V` tensors. (At
/// the end of forward the 16-bit logits, their fp32 copy and the saved output are `(c+8)·T·V`,
/// never more than 12 for `c <= 4`.) Gemma-2's soft-capped logits add `tanh`'s saved output.
pub(super) fn loss_peak(block: &Block, tokens: f64, prec: Precision) -> f64 {
    (12.0 + softcap_saved(block, prec)) * tokens * block.vocab
}

/// The loss's tensors at the end of the forward, while `cross_entropy` runs: the model's
/// logits in the compute width (`lm_head`'s output, held by `LlamaForCausalLM.forward`), their
/// fp32 copy (`ForCausalLMLoss`: `logits.float()`) and `log_softmax`'s fp32 output, `(c+8)·T·V`;
/// Gemma-2's soft-capped logits add `tanh`'s saved output.
pub(super) fn loss_forward_end(block: &Block, tokens: f64, prec: Precision) -> f64 {
    (prec.c() + 8.0 + softcap_saved(block, prec)) * tokens * block.vocab
}

/// Bytes per logit `tanh` saves in Gemma-2's soft-capped logits (`final_logit_softcapping`).
fn softcap_saved(block: &Block, prec: Precision) -> f64 {
    if block.softcapped_logits() {
        prec.c()
    } else {
        0.0
    }
}

/// The loss's largest tensor: one fp32 `T·V` block.
pub(super) fn loss_tensor(block: &Block, tokens: f64) -> f64 {
    4.0 * tokens * block.vocab
}

/// Bytes a layer's backward allocates beside its saved tensors: the gradients of the MLP's
/// product, `act(gate)` and `up` alive together (`MulBackward0`), or, where attention
/// materialised its scores (eager, the math kernel), what the softmax's backward holds beside
/// the saved probabilities. On CUDA `_softmax_backward_data` (`softmax_backward_cuda_out`,
/// `aten/src/ATen/native/cuda/SoftMax.cu`) first makes `Tensor tmp = grad * output`, a
/// temporary the size of the probabilities, then writes the input gradient: the probabilities'
/// gradient, `tmp` and the input gradient are alive together. Per score:
/// - SDPA's math kernel (fp32 scores in every precision): 4 + 4 + 4;
/// - a softmax that keeps the compute dtype (GPT-2, BERT, Whisper, Falcon eager; not under
///   autocast, whose fp32 list takes `softmax`): `3c`;
/// - `softmax(dtype=float32)` (the Llama code, Phi): the fp32 gradient (`ToCopyBackward` of the
///   cast back to `q`'s dtype; the 16-bit gradient and the saved 16-bit probabilities are freed
///   by then, with that node and the `matmul`'s), `tmp` and the input gradient, fp32, or for
///   `Half` in 16 bits (its `half_to_float` kernel writes it in the input's dtype; not under
///   autocast, whose scores reach softmax in fp32): `12 − c` in 16 bits (10 for bf16 and
///   autocast, 8 for fp16), 12 in fp32.
///
/// The allocator histories on an H200 (`tests/data/h200c/traces`) show each: Falcon-7B's LoRA
/// holds four fp32 score blocks at its peak with the saved probabilities (the oracle's CPU run has
/// no `tmp` and holds three); eager Mistral-7B and Phi-2 in bf16 hold the saved fp32
/// probabilities, their fp32 gradient, the fp32 input gradient (the structured kernel's output,
/// allocated first) and `tmp`, 16 B per score, with the 16-bit probabilities freed; in fp16 the
/// input gradient is 16-bit, 14. (An adapter's fp32 input gradient comes when that input's saved
/// copy is released.)
pub(super) fn backward_transient(block: &Block, p: &Pass, prec: Precision) -> f64 {
    let mlp = 3.0 * prec.c() * p.t() * block.ffn;
    if !p.scores(block) {
        return mlp;
    }
    let per_score = if p.math_kernel(block) {
        12.0
    } else if block.softmax_keeps_dtype() && prec != Precision::Autocast {
        3.0 * p.c
    } else if p.c < 4.0 {
        // `half_to_float` takes a `Half` input only; under autocast the scores reach softmax in
        // fp32 (their add with the mask, which `masking_utils` builds in the fp32 embeddings'
        // dtype, promotes them), so the input gradient is fp32 there whatever the 16-bit type.
        let input_gradient = if p.half && prec == Precision::Pure16 {
            p.c
        } else {
            4.0
        };
        8.0 + input_gradient - p.c
    } else {
        12.0
    };
    mlp.max(per_score * p.b * block.heads * p.s * p.s)
}

/// Gradient checkpointing the HF way (`gradient_checkpointing_enable`, non-reentrant
/// `torch.utils.checkpoint` around each decoder layer): each layer keeps its input (the
/// residual stream, `r·T·h`), and backward recomputes one layer at a time.
fn checkpointed_per_layer(block: &Block, p: &Pass, prec: Precision) -> f64 {
    prec.r() * p.t() * block.h
}

/// What a training step's forward leaves saved for backward.
pub(super) struct Saved {
    /// One layer's saved tensors (with LoRA's dropout masks).
    pub layer: f64,
    /// Every layer's, through the step: all of them, or under checkpointing their inputs.
    pub kept: f64,
    /// What stays saved after the blocks ([`head_saved`]).
    pub head: f64,
}

impl Inputs {
    fn trainable(&self) -> Trainable {
        if self.workload.is_adapter() {
            Trainable::Lora(self.lora_rank)
        } else {
            Trainable::All
        }
    }

    /// The tensors a training step's forward saves ([`Saved`]).
    pub(super) fn saved(&self, block: &Block, pass: &Pass) -> Saved {
        let trainable = self.trainable();
        let prec = self.precision();
        let dropout = if self.workload.is_adapter() && self.lora_dropout > 0.0 {
            lora_dropout_saved(block, pass, prec)
        } else {
            0.0
        };
        let layer = saved_per_layer(block, pass, trainable, prec) + dropout;
        let kept = if self.checkpointing == Checkpointing::Full {
            block.layers * checkpointed_per_layer(block, pass, prec)
        } else {
            block.layers * layer
        };
        Saved {
            layer,
            kept,
            head: head_saved(block, pass, trainable, prec),
        }
    }

    /// Autocast's 16-bit weight copies alive at the end of the forward, inside the
    /// `torch.autocast` region where `ForCausalLMLoss` runs. `cached_cast` keeps the cast of every
    /// trainable leaf weight in autocast's cache until the outermost region exits
    /// (`torch.autocast.__exit__` calls `torch.clear_autocast_cache()`), whatever autograd saved:
    /// in full fine-tuning with checkpointing every linear's copy is still cached while the loss
    /// is computed, and only once the region exits are the layers' copies dropped (backward then
    /// holds the head's, [`Self::autocast_weight_copies`]). A frozen weight (LoRA) is not cached,
    /// so with recomputation its cast dies with its layer's forward.
    pub(super) fn autocast_copies_at_forward_end(&self, checkpointed: bool) -> f64 {
        let checkpointed_adapter = checkpointed && self.workload.is_adapter();
        let cached_adapters = if checkpointed_adapter {
            self.autocast_adapter_copies()
        } else {
            0.0
        };
        self.autocast_weight_copies(checkpointed_adapter) + cached_adapters
    }

    /// Autocast's 16-bit copies of the LoRA factors. PEFT keeps `lora_A` and `lora_B` in fp32
    /// (`autocast_adapter_dtype`) and they require grad, so `cached_cast`
    /// (`aten/src/ATen/autocast_mode.cpp`) caches each one's cast for the whole autocast
    /// region, and without recomputation each linear node also saves it for its input's
    /// gradient into backward; with checkpointing the recomputed layers cast their own.
    fn autocast_adapter_copies(&self) -> f64 {
        if self.dtype != Dtype::Fp16Amp || !self.workload.is_adapter() {
            return 0.0;
        }
        2.0 * self.adapter_params() * self.stage_share() / self.tp
    }

    /// Autocast's 16-bit copies of fp32 linear weights that backward still holds when it
    /// starts. Autocast caches the cast of every trainable leaf weight for the whole autocast
    /// region (`cached_cast` in `aten/src/ATen/autocast_mode.cpp`) and a frozen weight's cast is
    /// saved by its linear node for the input's gradient, so without recomputation every
    /// linear's copy is held into backward; with checkpointing the layers' copies are dropped
    /// at the end of forward and only the LM head's (saved outside any checkpoint) stays.
    pub(super) fn autocast_weight_copies(&self, checkpointed: bool) -> f64 {
        if self.dtype != Dtype::Fp16Amp {
            return 0.0;
        }
        let head = f64::from(self.arch.vocab_size) * f64::from(self.arch.hidden_size);
        if checkpointed {
            return 2.0 * head;
        }
        // The input embedding is a lookup, not a linear: cast only when it is the tied head.
        let embedding = if self.arch.tied_embeddings { 0.0 } else { head };
        2.0 * (self.params - embedding).max(0.0) + self.autocast_adapter_copies()
    }

    /// The optimizer step's temporary: torch's `foreach` AdamW (`_multi_tensor_adamw`, the
    /// default on CUDA) takes `_foreach_sqrt` of every second moment into new tensors, one
    /// moment's worth; the fused kernel (`_fused_adamw_`) and SGD's momentum update in place.
    pub(super) fn optimizer_step_temporary(&self) -> f64 {
        if self.optimizer != Optimizer::Adam || self.optimizer_fused {
            return 0.0;
        }
        let (_, _, states) = self.trainable_state();
        states / 2.0
    }

    pub(super) fn precision(&self) -> Precision {
        match self.dtype {
            Dtype::Fp16Amp => Precision::Autocast,
            Dtype::Fp32 => Precision::Fp32,
            _ => Precision::Pure16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::forward::{decode_step, math_kernel_decode, mlp_transient};
    use super::super::test_support::{falcon_7b, llama_1b, pass};
    use super::*;
    use crate::model::estimate::ModelType;

    #[test]
    fn lora_copies_each_adapted_input_to_fp32() {
        let (block, p) = (llama_1b(), pass(2.0, 4096.0));
        let lora = saved_per_layer(&block, &p, Trainable::Lora(0.0), Precision::Pure16);
        let full = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let t = p.t();
        // LoRA: norms save only their fp32 input (4+4 per h); five fp32 input copies (q, k, v,
        // gate, up: 20 per h); o_proj's and down's inputs in fp32 (4 per q, 4 per I).
        // Full: norms 2x(4+2), q/k/v and gate/up share one 16-bit input each (2+2), o and down
        // their own 16-bit input.
        let diff =
            (8.0 + 20.0 - 12.0 - 4.0) * t * block.h + 2.0 * t * block.q + 2.0 * t * block.ffn;
        assert_eq!(lora - full, diff);
    }

    #[test]
    fn autocast_casts_each_linear_input_separately() {
        let (block, p) = (llama_1b(), pass(2.0, 1024.0));
        let amp = saved_per_layer(&block, &p, Trainable::All, Precision::Autocast);
        let pure = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let t = p.t();
        // Norms: fp32 input (4) + fp32 normed (4) against 4 + 2; consumers 3 + 2 casts of 2 B
        // against two shared 16-bit inputs.
        assert_eq!(amp - pure, (2.0 * 2.0 + (10.0 - 4.0)) * t * block.h);
    }

    #[test]
    fn lora_dropout_saves_a_mask_per_adapted_input() {
        let (block, p) = (llama_1b(), pass(2.0, 1000.0));
        // q, k, v and gate, up see the hidden size, o the attention width, down the MLP's.
        let inputs = 5.0 * 2048.0 + 2048.0 + 8192.0;
        assert_eq!(
            lora_dropout_saved(&block, &p, Precision::Pure16),
            p.t() * inputs
        );
        assert_eq!(
            lora_dropout_saved(&block, &p, Precision::Fp32),
            5.0 * p.t() * inputs
        );
    }

    /// SDPA's math kernel copies the cache's keys to every head in a decode step (Falcon's
    /// broadcast `matmul`, beside the fp32 copies of its 16-bit k and v; fp32 grouped-query
    /// attention's `repeat_interleave` of k and v and the scaled k), and a training step's score
    /// `bmm`s save fp32 q, k and v per head; a fused kernel does neither.
    #[test]
    fn the_math_kernel_copies_keys_per_head_in_decode_and_saves_fp32_inputs_in_training() {
        let falcon = falcon_7b();
        let bf16 = pass(4.0, 2048.0);
        let (b, s) = (4.0, 2048.0);
        assert_eq!(
            math_kernel_decode(&falcon, &bf16),
            4.0 * b * s * falcon.q + 8.0 * b * s * falcon.kv
        );
        assert!(decode_step(&falcon, &bf16, 2.0) >= math_kernel_decode(&falcon, &bf16));
        assert_eq!(
            score_inputs_saved(&falcon, &bf16, 2.0),
            12.0 * bf16.t() * falcon.q
        );
        let llama = llama_1b();
        let fp32 = Pass {
            c: 4.0,
            ..pass(4.0, 2048.0)
        };
        assert_eq!(math_kernel_decode(&llama, &fp32), 12.0 * b * s * llama.q);
        assert_eq!(math_kernel_decode(&llama, &bf16), 0.0);
        assert_eq!(
            score_inputs_saved(&llama, &bf16, 2.0),
            6.0 * bf16.t() * llama.q
        );
    }

    #[test]
    fn a_window_shorter_than_the_sequence_saves_its_mask_and_repeated_kv() {
        let (mut block, p) = (llama_1b(), pass(1.0, 16384.0));
        let plain = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        block.sliding_window = 4096.0;
        let windowed = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        // The float mask (`attn_bias`) and k and v repeated from kv to q width.
        assert_eq!(
            windowed - plain,
            2.0 * p.s * p.s + 2.0 * 2.0 * p.t() * (block.q - block.kv)
        );
        block.sliding_window = 32768.0;
        assert_eq!(
            saved_per_layer(&block, &p, Trainable::All, Precision::Pure16),
            plain
        );
    }

    #[test]
    fn lora_on_experts_keeps_each_layers_folded_expert_weights() {
        // Qwen3-30B-A3B's layer: 128 experts of I = 768 over h = 2048.
        let block = Block {
            ffn: 768.0,
            experts_per_token: 8.0,
            experts: 128.0,
            ..llama_1b()
        };
        let p = pass(1.0, 1024.0);
        let dense = Block {
            experts: 0.0,
            ..block
        };
        let lora = |b: &Block, prec| saved_per_layer(b, &p, Trainable::Lora(16.0), prec);
        assert_eq!(
            lora(&block, Precision::Pure16) - lora(&dense, Precision::Pure16),
            128.0 * 3.0 * 768.0 * 2048.0 * 2.0
        );
        // Under autocast the frozen weights, and so their folded copies, are fp32.
        assert_eq!(
            lora(&block, Precision::Autocast) - lora(&dense, Precision::Autocast),
            128.0 * 3.0 * 768.0 * 2048.0 * 4.0
        );
        // Full fine-tuning trains the experts' own weights: nothing is folded.
        assert_eq!(
            saved_per_layer(&block, &p, Trainable::All, Precision::Pure16),
            saved_per_layer(&dense, &p, Trainable::All, Precision::Pure16)
        );
    }

    #[test]
    fn gemma2s_eager_training_saves_its_soft_capped_scores() {
        let eager = |family| {
            let block = Block {
                family,
                ..llama_1b()
            };
            let p = Pass {
                sdpa: false,
                ..pass(1.0, 4096.0)
            };
            let sdpa = Pass { sdpa: true, ..p };
            saved_per_layer(&block, &p, Trainable::All, Precision::Autocast)
                - saved_per_layer(&block, &sdpa, Trainable::All, Precision::Autocast)
        };
        // `tanh`'s 16-bit output, one per score, beside Llama's fp32 softmax and its cast.
        let scores = llama_1b().heads * 4096.0 * 4096.0;
        assert_eq!(
            eager(ModelType::Gemma2) - eager(ModelType::Llama),
            2.0 * scores
        );
    }

    #[test]
    fn autocast_runs_gpt2s_eager_softmax_in_fp32() {
        // Eager attention in training: the score path is what differs.
        let block = Block {
            family: ModelType::Gpt2,
            mlp: Mlp::Plain,
            ..llama_1b()
        };
        let p = Pass {
            sdpa: false,
            ..pass(2.0, 1024.0)
        };
        let scores = p.b * block.heads * p.s * p.s;
        let pure = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let amp = saved_per_layer(&block, &p, Trainable::All, Precision::Autocast);
        let eager = |prec| {
            let sdpa = Pass { sdpa: true, ..p };
            saved_per_layer(&block, &p, Trainable::All, prec)
                - saved_per_layer(&block, &sdpa, Trainable::All, prec)
        };
        // 16-bit: the 16-bit softmax output; autocast: its fp32 output and the 16-bit cast.
        assert!(amp > pure);
        assert_eq!(
            eager(Precision::Autocast) - eager(Precision::Pure16),
            4.0 * scores
        );
    }

    #[test]
    fn gpt2s_composed_gelu_keeps_four_intermediates() {
        let (mut block, p) = (llama_1b(), pass(4.0, 1024.0));
        (block.family, block.mlp) = (ModelType::LayerNorm, Mlp::Plain);
        let plain = mlp_transient(&block, p.t(), 2.0);
        block.family = ModelType::Gpt2;
        assert_eq!(mlp_transient(&block, p.t(), 2.0), 2.0 * plain);
        let saved = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let amp = saved_per_layer(&block, &p, Trainable::All, Precision::Autocast);
        block.family = ModelType::LayerNorm;
        assert_eq!(
            saved - saved_per_layer(&block, &p, Trainable::All, Precision::Pure16),
            3.0 * 2.0 * p.t() * block.ffn
        );
        // Under autocast `pow`'s fp32 input copy, `tanh`'s output and `1 + tanh` are fp32.
        assert_eq!(
            amp - saved_per_layer(&block, &p, Trainable::All, Precision::Autocast),
            (3.0 * 4.0 + 2.0 - 2.0) * p.t() * block.ffn
        );
    }

    #[test]
    fn gemma2_saves_its_soft_capped_logits() {
        let mut block = llama_1b();
        let plain = loss_peak(&block, 10.0, Precision::Pure16);
        block.family = ModelType::Gemma2;
        assert_eq!(
            loss_peak(&block, 10.0, Precision::Pure16) - plain,
            2.0 * 10.0 * block.vocab
        );
        assert_eq!(
            loss_peak(&block, 10.0, Precision::Fp32) - plain,
            4.0 * 10.0 * block.vocab
        );
    }

    #[test]
    fn gemma_norms_save_their_fp32_output_when_the_weight_trains() {
        let mut block = llama_1b();
        assert_eq!(norm_saved(&block, Trainable::All, Precision::Pure16), 6.0);
        block.family = ModelType::Gemma2;
        assert_eq!(norm_saved(&block, Trainable::All, Precision::Pure16), 8.0);
        assert_eq!(
            norm_saved(&block, Trainable::Lora(16.0), Precision::Pure16),
            4.0
        );
    }

    #[test]
    fn attention_backward_holds_the_score_gradients_and_cudas_product_where_scores_exist() {
        let llama = llama_1b();
        let mut phi = llama_1b();
        phi.family = ModelType::Phi;
        let mut gpt2 = llama_1b();
        gpt2.family = ModelType::Gpt2;
        let mut falcon = llama_1b();
        falcon.family = ModelType::Falcon;
        falcon.kv = falcon.h / falcon.heads;
        assert!(falcon.unequal_heads_without_gqa());
        let sdpa16 = pass(1.0, 4096.0);
        let sdpa32 = Pass { c: 4.0, ..sdpa16 };
        let eager = Pass {
            sdpa: false,
            ..sdpa16
        };
        let half = Pass {
            half: true,
            ..eager
        };
        let eager32 = Pass { c: 4.0, ..eager };
        // (what, block, pass, precision, bytes per score beside the saved tensors)
        let cases = [
            // The math kernel: the probabilities' gradient, CUDA's `grad * output` and the
            // scores' gradient, fp32 each, in fp32 on grouped-query attention and in 16 bits for
            // Falcon's multi-query heads handed over without `enable_gqa`.
            ("math fp32", &llama, sdpa32, Precision::Fp32, 12.0),
            ("math falcon bf16", &falcon, sdpa16, Precision::Pure16, 12.0),
            // An fp32 softmax: the same three, less the saved 16-bit probabilities freed by
            // then; for fp16 the input gradient is 16-bit (`half_to_float`), not under autocast,
            // whose scores reach softmax in fp32.
            ("eager bf16", &llama, eager, Precision::Pure16, 10.0),
            ("eager fp16", &llama, half, Precision::Pure16, 8.0),
            (
                "eager fp16 autocast",
                &llama,
                half,
                Precision::Autocast,
                10.0,
            ),
            ("eager fp32", &llama, eager32, Precision::Fp32, 12.0),
            // Phi passes `dtype=float32` too, though its blocks use LayerNorm.
            ("phi bf16", &phi, eager, Precision::Pure16, 10.0),
            // A softmax that keeps the compute dtype: three tensors of it; under autocast its
            // fp32 list runs the softmax in fp32, which then goes as Llama's does.
            ("gpt2 bf16", &gpt2, eager, Precision::Pure16, 6.0),
            ("gpt2 fp32", &gpt2, eager32, Precision::Fp32, 12.0),
            ("gpt2 autocast", &gpt2, eager, Precision::Autocast, 10.0),
            ("gpt2 fp16 autocast", &gpt2, half, Precision::Autocast, 10.0),
            // Falcon eager passes the residual stream's dtype: it keeps 16 bits.
            ("falcon eager bf16", &falcon, eager, Precision::Pure16, 6.0),
        ];
        for (what, block, p, prec, per_score) in cases {
            let scores = block.heads * 4096.0 * 4096.0;
            assert_eq!(
                backward_transient(block, &p, prec),
                per_score * scores,
                "{what}"
            );
        }
        // SDPA's fused kernels keep no scores: the MLP's three gradients.
        assert_eq!(
            backward_transient(&llama, &sdpa16, Precision::Pure16),
            3.0 * 2.0 * 4096.0 * 8192.0
        );
    }

    #[test]
    fn loss_holds_three_fp32_logit_tensors() {
        assert_eq!(
            loss_peak(&llama_1b(), 10.0, Precision::Pure16),
            120.0 * 128_256.0
        );
    }

    #[test]
    fn qk_norms_save_fp32_copies_of_q_and_k() {
        let (mut block, p) = (llama_1b(), pass(1.0, 512.0));
        let plain = saved_per_layer(&block, &p, Trainable::Lora(8.0), Precision::Pure16);
        block.family = ModelType::QkNorm;
        let normed = saved_per_layer(&block, &p, Trainable::Lora(8.0), Precision::Pure16);
        assert_eq!(normed - plain, 4.0 * p.t() * (block.q + block.kv));
    }
}
