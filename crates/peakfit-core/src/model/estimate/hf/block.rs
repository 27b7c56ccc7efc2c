//! The shapes HF's modeling code runs: a block as its modeling file builds it, one forward
//! pass over it, and how a pod's inputs build them. Every term family reads these.

use crate::model::estimate::framework::Framework;
use crate::model::estimate::{Checkpointing, Dtype, Inputs, Kind, ModelType, Offload, Workload};

/// The shape of a block as HF's modeling code builds it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub h: f64,
    pub q: f64,
    pub kv: f64,
    pub heads: f64,
    pub ffn: f64,
    pub vocab: f64,
    pub layers: f64,
    pub mlp: Mlp,
    pub family: ModelType,
    /// Experts per token of a mixture of experts; 0 for a dense MLP.
    pub experts_per_token: f64,
    /// Experts per layer of a mixture of experts (all resident); 0 for a dense MLP.
    pub experts: f64,
    /// Tokens a sliding-window layer sees; 0 for none.
    pub sliding_window: f64,
}

/// The MLP as the modeling file writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mlp {
    /// `down(act(gate(x)) * up(x))`: Llama, Qwen, Mistral, Gemma.
    Gated,
    /// `gate_up_proj` then `chunk(2)`: Phi-3.
    FusedGated,
    /// `fc2(act(fc1(x)))`: BERT, GPT-2, Whisper.
    Plain,
}

impl Block {
    /// One projection for q, k and v (`Phi3Attention.qkv_proj`, `FalconAttention.query_key_value`),
    /// split into views that keep the whole output alive.
    pub(super) fn fused_qkv(&self) -> bool {
        self.family.fused_qkv()
    }

    /// `FalconModel.forward` builds the causal mask even where SDPA could run `is_causal`
    /// (`create_causal_mask(..., allow_is_causal_skip=False)`, so that alibi can be added to it).
    pub(super) fn always_masks(&self) -> bool {
        self.family == ModelType::Falcon
    }

    /// Whether SDPA is handed fewer key/value heads than query heads without `enable_gqa`.
    /// `FalconAttention.forward` calls `F.scaled_dot_product_attention` itself, with no
    /// `enable_gqa`: under multi-query attention (`multi_query`, one kv head: `_split_heads`
    /// keeps `fused_qkv[..., [-2], :]`) k and v have one head for all of q's. Falcon's new
    /// decoder architecture (Falcon-40B, several kv heads) broadcasts k and v to every head
    /// first (`torch.broadcast_to`), and the other families go through
    /// `sdpa_attention_forward`, which passes `enable_gqa` or repeats k and v (`repeat_kv`).
    pub(super) fn unequal_heads_without_gqa(&self) -> bool {
        self.family == ModelType::Falcon && self.kv < self.q && self.kv * self.heads <= self.q
    }

    /// Whether SDPA is handed a boolean `b·1·s·s` mask (`masking_utils.sdpa_mask`): a sliding
    /// window shorter than the sequence, or a family that always builds one.
    pub(super) fn sdpa_mask(&self, p: &Pass) -> bool {
        p.sdpa && (self.windowed(p.s) || self.always_masks())
    }

    /// `Gemma2ForCausalLM.forward` soft-caps the logits (`final_logit_softcapping`, 30.0 by
    /// default in `Gemma2Config`; `None` in Gemma-3's): `tanh` saves its output for backward.
    pub(super) fn softcapped_logits(&self) -> bool {
        self.family == ModelType::Gemma2
    }

    /// Gemma-2's eager attention soft-caps its scores (`attn_logit_softcapping`, 50.0 by default
    /// in `Gemma2Config`; `None` in Gemma-3's): `eager_attention_forward` runs
    /// `tanh(w / softcap) * softcap`, and `tanh` saves its output for backward.
    pub(super) fn softcapped_scores(&self) -> bool {
        self.family == ModelType::Gemma2
    }

    /// `Gemma2RMSNorm` multiplies by `1 + weight` in fp32 and casts after; Llama's casts first.
    pub(super) fn fp32_norm_weight(&self) -> bool {
        matches!(self.family, ModelType::Gemma2 | ModelType::Gemma3)
    }

    pub(super) fn qk_norm(&self) -> bool {
        matches!(self.family, ModelType::QkNorm | ModelType::Gemma3)
    }

    /// Norms per block: `Gemma2DecoderLayer` has four (pre/post attention, pre/post MLP).
    pub(super) fn norms(&self) -> f64 {
        if matches!(self.family, ModelType::Gemma2 | ModelType::Gemma3) {
            4.0
        } else {
            2.0
        }
    }

    /// `Gemma2Model.forward`: `hidden_states = inputs_embeds * normalizer`, a new tensor while
    /// `inputs_embeds` stays referenced.
    pub(super) fn scaled_embeddings(&self) -> bool {
        matches!(self.family, ModelType::Gemma2 | ModelType::Gemma3)
    }

    /// `RMSNorm` as `LlamaRMSNorm` writes it (fp32 upcast); `LayerNorm` is one fused op.
    pub(super) fn rms(&self) -> bool {
        !self.layer_norm()
    }

    /// The `LayerNorm` families (BERT, Whisper, T5, GPT-2, Falcon).
    pub(super) fn layer_norm(&self) -> bool {
        matches!(
            self.family,
            ModelType::LayerNorm | ModelType::Gpt2 | ModelType::Phi | ModelType::Falcon
        )
    }

    /// Rotary position embeddings (`apply_rotary_pos_emb`): the `RMSNorm` decoders and Falcon
    /// (`rotary` unless `alibi`); BERT, Whisper and GPT-2 add learned positions instead.
    pub(super) fn rotary(&self) -> bool {
        self.rms() || matches!(self.family, ModelType::Falcon | ModelType::Phi)
    }

    /// Whether a sequence of `s` tokens is longer than the sliding window.
    pub(super) fn windowed(&self, s: f64) -> bool {
        self.sliding_window > 0.0 && s > self.sliding_window
    }

    /// BERT's, GPT-2's and Whisper's eager attention call `softmax(w, dim=-1)` with no dtype, so
    /// in 16 bits its output is 16-bit. Under autocast it is fp32: `softmax` is on CUDA
    /// autocast's fp32 list (`autocast_mode.h`, `fp32_set_opt_dtype`: the call gets
    /// `dtype=float` unless it names one), and GPT-2's `attn_weights.type(value.dtype)` then casts it
    /// back for the `matmul` with v, which saves that cast too. Falcon's passes
    /// `dtype=hidden_states.dtype`, the residual stream's: 16-bit, fp32 under autocast. Llama's
    /// (and Phi's) pass `dtype=float32` in every precision.
    pub(super) fn softmax_keeps_dtype(&self) -> bool {
        matches!(
            self.family,
            ModelType::LayerNorm | ModelType::Gpt2 | ModelType::Falcon
        )
    }

    /// GPT-2's `NewGELUActivation`: eight elementwise ops, each a new `T·I` tensor.
    pub(super) fn composed_gelu(&self) -> bool {
        matches!(self.family, ModelType::Gpt2 | ModelType::Phi)
    }

    /// Linear layers fed by the attention norm's output: q, k, v, or one fused `qkv_proj`.
    pub(super) fn attention_inputs(&self) -> f64 {
        if self.fused_qkv() { 1.0 } else { 3.0 }
    }

    /// Linear layers fed by the MLP norm's output: gate and up, or one.
    pub(super) fn mlp_inputs(&self) -> f64 {
        match self.mlp {
            Mlp::Gated => 2.0,
            Mlp::FusedGated | Mlp::Plain => 1.0,
        }
    }

    /// Bytes per attention score alive at once when the matrix is materialised. Llama's
    /// `eager_attention_forward` runs `softmax(w, dtype=float32).to(query.dtype)`, and `ATen`'s
    /// `softmax(input, dim, dtype)` (`aten/src/ATen/native/SoftMax.cpp`) takes two roads in 16
    /// bits. A CUDA `Half` input with `dtype=Float` goes straight to `_softmax(input, dim,
    /// half_to_float=true)`, whose kernel reads fp16 and writes fp32: the masked scores (2), the
    /// fp32 output (4) and then its `to(float16)` (2) are alive together, 8 bytes. Every other
    /// 16-bit input (`BFloat16`, or any input on the CPU) is first copied whole,
    /// `input.toType(float)`, and `_softmax` runs on the copy: the scores (2), that copy (4) and
    /// the output (4), 10 bytes ([`Pass::half`]). The H100 measured the difference:
    /// SmolLM2-1.7B eager at 16 × 2,048 allocated 24.66 GiB in fp16 and 28.41 in bf16, 3.75 GiB
    /// apart, 2 bytes per score of its 16 × 32 × 1,984² (`tests/data/h100`). In fp32 the copy
    /// and the final cast are no-ops, scores and softmax 8 (torch's math kernel likewise);
    /// Phi's `eager_attention_forward` is Llama's. BERT's, GPT-2's and Whisper's
    /// `softmax` keeps the input's dtype: scores and probabilities, `2c`. Falcon's
    /// (`FalconAttention.forward`, no alibi) keeps the dtype too but holds four `c`-wide
    /// matrices: the scores, their sum with the mask, the softmax, and the previous layer's
    /// probabilities, which the attention returns and its decoder layer's output tuple keeps
    /// until the next layer's output replaces it.
    pub(super) fn score_bytes(&self, p: &Pass) -> f64 {
        let c = p.c;
        if self.family == ModelType::Falcon {
            4.0 * c
        } else if self.layer_norm() && self.family != ModelType::Phi {
            2.0 * c
        } else if c < 4.0 && p.half {
            8.0
        } else if c < 4.0 {
            10.0
        } else {
            8.0
        }
    }

    /// Adapted linear layers per block under PEFT's `all-linear`.
    pub(super) fn linears(&self) -> f64 {
        self.attention_inputs() + 1.0 + self.mlp_inputs() + 1.0
    }
}

/// One forward pass over `b` sequences of `s` tokens.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pass {
    pub b: f64,
    pub s: f64,
    /// Compute width in bytes.
    pub c: f64,
    /// SDPA (flash or memory-efficient kernel: no score matrix) rather than eager attention.
    pub sdpa: bool,
    /// The 16-bit type is IEEE half (fp16, and fp16 autocast), CUDA's `Half`, rather than
    /// `BFloat16`: `ATen`'s `softmax(x, dim, dtype=float32)` converts a `Half` input inside its
    /// kernel and copies any other first ([`Block::score_bytes`]).
    pub half: bool,
}

impl Pass {
    pub(super) fn t(&self) -> f64 {
        self.b * self.s
    }

    /// Whether attention materialises the `b·heads·s·s` score matrix: eager attention always;
    /// SDPA when it runs its math kernel.
    pub(super) fn scores(&self, block: &Block) -> bool {
        !self.sdpa || self.math_kernel(block)
    }

    /// Whether SDPA falls back to torch's math kernel, which computes `softmax(q·kᵀ)` whole. On
    /// sm90 torch 2.11 tries cuDNN, flash, then memory-efficient attention, then the math
    /// kernel (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`). cuDNN and flash take
    /// 16-bit inputs only, and fewer kv heads than heads only with `enable_gqa`: both run
    /// `check_batch_size_and_num_heads_dense<true, ...>` (`sdp_utils_cpp.h`), which takes the
    /// grouped-query path `if (params.enable_gqa && supports_gqa)` and otherwise requires equal
    /// heads. The memory-efficient kernel takes fp32 but never unequal heads
    /// (`check_batch_size_and_num_heads_dense<false>`). So the math kernel runs for fp32 with
    /// fewer kv heads (transformers passes `enable_gqa` when there is no mask:
    /// `integrations/sdpa_attention.py` `use_gqa_in_sdpa`), and in any precision for heads
    /// handed over unequal without `enable_gqa` ([`Block::unequal_heads_without_gqa`]).
    pub(super) fn math_kernel(&self, block: &Block) -> bool {
        self.sdpa && block.kv < block.q && (self.c >= 4.0 || block.unequal_heads_without_gqa())
    }
}

impl Inputs {
    /// The block as HF's modeling code builds it (per tensor-parallel rank: HF's path runs on
    /// one GPU here).
    pub(super) fn block(&self) -> Block {
        let a = &self.arch;
        let mlp = match self.family {
            family if family.fused_gate_up() => Mlp::FusedGated,
            ModelType::LayerNorm | ModelType::Gpt2 | ModelType::Phi | ModelType::Falcon => {
                Mlp::Plain
            }
            // The shape's own hint, as `params_of` reads it.
            ModelType::Other if a.intermediate_size == 4 * a.hidden_size => Mlp::Plain,
            // Llama, Qwen3's q/k norms, Gemma 2 and 3, and any other type: gate, up and down.
            ModelType::Llama
            | ModelType::QkNorm
            | ModelType::Gemma2
            | ModelType::Gemma3
            | ModelType::Phi3
            | ModelType::Other => Mlp::Gated,
        };
        Block {
            h: f64::from(a.hidden_size),
            q: f64::from(a.attention_heads) * f64::from(a.head_dim),
            kv: f64::from(a.kv_heads) * f64::from(a.head_dim),
            heads: f64::from(a.attention_heads),
            ffn: f64::from(a.intermediate_size),
            vocab: f64::from(a.vocab_size),
            layers: f64::from(a.layers),
            mlp,
            family: self.family,
            experts_per_token: self.experts_per_token,
            experts: self.experts,
            sliding_window: self.sliding_window,
        }
    }

    /// Whether transformers' own modules run this pod on one GPU, so [`hf`] counts its
    /// activations: an HF engine (or none named), no parallelism or sharding, no offload; for
    /// training full fine-tuning or LoRA in 16 bits, fp32 or autocast, without or with full
    /// checkpointing (QLoRA runs bitsandbytes' kernels and PEFT's k-bit preparation, selective
    /// recomputation is not HF's).
    pub(in crate::model::estimate) fn hf_modules(&self) -> bool {
        let single = !self.multi_gpu() && self.zero == 0 && self.offload == Offload::None;
        // A pod that names no engine is taken to run transformers' modules: the most common
        // stack, and the one that holds the most.
        let framework = match &self.engine {
            None => true,
            Some(e) => e.framework().is_some_and(Framework::runs_hf_modules),
        };
        let training_ok = match self.workload {
            Workload::Inference => true,
            // The causal-LM loss and decoder blocks only: an encoder's head (classification,
            // masked LM) and an encoder-decoder's two stacks are left to the general terms.
            Workload::Training | Workload::Lora => {
                matches!(
                    self.dtype,
                    Dtype::Bf16 | Dtype::Fp16 | Dtype::Fp32 | Dtype::Fp16Amp
                ) && self.checkpointing != Checkpointing::Selective
                    && self.kind == Kind::Decoder
            }
            Workload::Qlora => false,
        };
        single && framework && training_ok && !matches!(self.kind, Kind::Diffusion(_))
    }

    /// Compute width of activations: 16-bit for every dtype but fp32 (quantised weights are
    /// dequantised to 16 bits for their matmuls).
    pub(super) fn compute_bytes(&self) -> f64 {
        if self.dtype == Dtype::Fp32 { 4.0 } else { 2.0 }
    }

    pub(super) fn pass(&self, b: f64, s: f64) -> Pass {
        Pass {
            b,
            s,
            c: self.compute_bytes(),
            sdpa: self.sdpa,
            half: matches!(self.dtype, Dtype::Fp16 | Dtype::Fp16Amp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{falcon_7b, pass};
    use super::*;

    #[test]
    fn falcons_eager_attention_holds_four_score_matrices() {
        let block = falcon_7b();
        let p = pass(4.0, 2048.0);
        assert_eq!(block.score_bytes(&p), 8.0);
        let gpt2 = Block {
            family: ModelType::Gpt2,
            ..block
        };
        assert_eq!(gpt2.score_bytes(&p), 4.0);
    }
}
