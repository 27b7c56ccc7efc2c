//! What the forward pass keeps: training activations saved for backward (by recomputation
//! policy, tensor/sequence/context parallelism and offload), LoRA's dropout copies, the
//! attention scores of an eager prefill at inference, and the logits with their loss.
//!
//! | term | formula | source |
//! |---|---|---|
//! | activations | `s/c` tokens per sequence; TP shards 24 of the 34 `sbh` bytes, sequence parallel all 34 (`34·sbh/t`); torchtitan's DTensor sequence parallelism keeps the gathered attention and MLP inputs (4 of them) whole in every layer holding its full working set | Korthikanti et al. 2022, Table 2 and §4.2.2; torchtitan `parallelize_llama.py` `apply_tp` (`PrepareModuleInput(..., desired_input_layouts=Replicate())`) |
//! | LoRA dropout | with `lora-dropout` > 0 (litgpt: 0.05 unless stated) each adapted linear's dropped-out input (activation width) and mask (1 B) per token, in every layer without recomputation, in the recomputed one with it; all linears (q, k, v, o, MLP), litgpt its fused QKV input only | peft `lora.Linear.forward`; litgpt `LoRAQKVLinear.forward`, `finetune/lora.py` defaults |
//! | activation offload | two layers' saved activations stay, the rest is on the CPU | torchtune activation offloading |
//! | logits | `s·b·V/t` (tokens `/c`) at the framework's bytes per entry ([`Framework::logits_bytes_per_token_vocab`]); inference keeps the last token's | huggingface/transformers#38452; ring attention |

use super::Inputs;
use super::framework::{Framework, LOGITS_HF};
use crate::model::annotations::{Checkpointing, Dtype, Offload};
use crate::model::presets::Kind;

/// Korthikanti et al. activation bytes per token per hidden unit per layer, 16-bit, no
/// recomputation, attention scores excluded (flash attention): `34 s b h` (Korthikanti et al.
/// 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
/// Table 2; a Llama block's tensors count 32-34).
pub const ACT_NONE: f64 = 34.0;
/// Selective recomputation as torchtitan's op policy does it: back-solved ~23 s b h per layer
/// including allocator slack from torchtitan's Llama-3.1-8B runs on 8 and 128 H100s
/// (`pytorch/torchtitan` `benchmarks/llama3_h100_202412_torchtitan.md`), i.e. ~20 before the
/// training slack above.
pub const ACT_SELECTIVE: f64 = 20.0;
/// Full recomputation keeps each layer's input (`2 s b h`, Korthikanti et al. 2022, Table 2) ...
pub const ACT_FULL: f64 = 2.0;
/// ... plus one layer's full working set during its recomputation.
pub const ACT_FULL_WORKING_LAYERS: f64 = 1.0;
/// Attention scores under torch autocast (fp16 AMP) without a fused kernel, per Korthikanti's
/// `a·s²·b` unit: `QKᵀ` in fp16 (2 B), the softmax autocast runs in fp32 (4 B), the dropout
/// mask (1 B) and the dropped-out probabilities in fp16 (2 B) = 9, against 5 for pure 16-bit
/// (Korthikanti et al. 2022's `5as²b` term, re-derived for autocast's fp32 softmax; not fitted).
pub const SCORES_AMP: f64 = 9.0;

impl Inputs {
    /// Bytes per `s·b·h` per layer that PyTorch's `DTensor` sequence parallelism keeps whole where
    /// Korthikanti's sequence-parallel row (`34/t`) shards them. Megatron-LM saves only the
    /// sequence-sharded input of its column-parallel linears and all-gathers it again in
    /// backward (Korthikanti et al. 2022, §4.2.2); torchtitan's plan instead all-gathers the
    /// attention and feed-forward inputs to `Replicate()` at the module boundary
    /// (`PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())` before
    /// the `ColwiseParallel` wq/wk/wv and w1/w3, `torchtitan/models/llama/parallelize_llama.py`
    /// `apply_tp`), and autograd saves that gathered tensor for the weight gradients: two
    /// 16-bit `s·b·h` inputs, 4 bytes, of which the `34/t` row already counts `4/t`.
    pub(super) fn dtensor_sp_gathered(&self) -> f64 {
        if self.sp && self.tp > 1.0 && self.framework_is(Framework::keeps_sp_inputs_gathered) {
            4.0 * (1.0 - 1.0 / self.tp)
        } else {
            0.0
        }
    }

    /// Bytes per `s·b·h` per layer that LoRA's dropout saves besides the layer's own
    /// activations. With a dropout above 0 each adapted linear runs its input through its own
    /// dropout before `lora_A` (PEFT `lora.Linear.forward`: `lora_B(lora_A(dropout(x)))`, one
    /// `nn.Dropout` per adapted module; `nn.Identity` at 0, PEFT's default), and backward keeps
    /// the dropped-out copy (for `lora_A`'s weight gradient, at the activations' width) and
    /// dropout's boolean mask (1 B). With adapters on every linear layer (the assumption of
    /// [`Inputs::adapter_params`]) the inputs are q, k and v's (`3h`), o's (heads x head dim),
    /// the MLP's first one or two (`h` each) and its down projection's (the FFN width); litgpt's
    /// default adapts only the fused QKV projection, whose one dropout sees the block input
    /// (`LoRAQKVLinear.forward`: `F.linear(self.lora_dropout(x), self.lora_A)`, `litgpt/lora.py`).
    /// The probability itself does not change the bytes, only whether the copy exists.
    pub(super) fn lora_dropout_saved(&self) -> f64 {
        if !(self.workload.is_adapter() && self.lora_dropout > 0.0) {
            return 0.0;
        }
        let a = &self.arch;
        let h = f64::from(a.hidden_size);
        let inputs = if self.framework_is(Framework::adapts_fused_qkv_only) {
            h
        } else {
            let mlp_first = if a.intermediate_size == 4 * a.hidden_size {
                h
            } else {
                2.0 * h
            };
            3.0 * h
                + f64::from(a.attention_heads * a.head_dim)
                + mlp_first
                + f64::from(a.intermediate_size)
        };
        let width = if self.dtype == Dtype::Fp32 { 4.0 } else { 2.0 };
        (width + 1.0) * inputs / h
    }

    /// Training activations (Korthikanti et al. 2022, arXiv:2205.05198, Table 2), per GPU.
    pub(super) fn activations(&self) -> f64 {
        let a = &self.arch;
        let (h, l) = (f64::from(a.hidden_size), f64::from(a.layers));
        // Context parallelism splits every sequence over `cp` GPUs (ring attention keeps the
        // local queries against streamed keys/values: scores stay local too).
        let (mut s, b) = (self.context / self.cp, self.batch);
        if let Kind::EncoderDecoder {
            encoder_positions, ..
        } = self.kind
            && encoder_positions > 0
            && !self.workload.is_training()
        {
            s = f64::from(encoder_positions);
        }
        if !self.workload.is_training() {
            // Inference saves nothing for backward. Without flash attention one layer's scores
            // (16-bit) and fp32 softmax exist at once during prefill.
            if self.flash {
                return 0.0;
            }
            let heads = (f64::from(a.attention_heads) / self.tp).max(1.0);
            return heads * s * s * b * 6.0;
        }
        // Tensor parallel shards all but 10 of the 34 (Korthikanti et al. 2022, Table 2, the
        // tensor-parallel row); sequence parallelism splits those 10 (layer norms, dropout) along
        // the sequence too: `34/t` (the sequence-parallel row).
        let sharded = |c: f64| {
            if self.sp {
                c / self.tp
            } else {
                10.0f64.min(c) + (c - 10.0f64.min(c)) / self.tp
            }
        };
        let per_score = if self.dtype == Dtype::Fp16Amp {
            SCORES_AMP
        } else {
            5.0
        };
        let scores = per_score * f64::from(a.attention_heads) * s / h / self.tp;
        let per_layer = |c: f64, with_scores: bool| {
            s * b * h * (sharded(c) + if with_scores { scores } else { 0.0 })
        };
        // Pipeline parallel: the busiest (first) stage holds `l/pp` layers for each of the `pp`
        // micro-batches 1F1B keeps in flight (Narayanan et al. 2021, §2.2; Korthikanti §4.2.3):
        // `l` layers' worth, whatever pp. The layer count below is therefore unchanged.
        let saved = |c: f64| match self.offload {
            // Activation offloading copies what is saved to the CPU as it is produced; two
            // layers' worth stay (the one being copied and the next), torchtune's design.
            Offload::Activations => 2.0 * per_layer(c, false),
            _ => l * per_layer(c, false),
        };
        // A layer's whole working set, with what DTensor sequence parallelism keeps unsharded.
        let working = |with_scores: bool| {
            per_layer(ACT_NONE, with_scores) + s * b * h * self.dtensor_sp_gathered()
        };
        let bytes = match self.checkpointing {
            Checkpointing::None if self.offload == Offload::Activations => {
                saved(ACT_NONE) + ACT_FULL_WORKING_LAYERS * working(!self.flash)
            }
            Checkpointing::None => l * working(!self.flash),
            // Selective recomputation drops the attention scores by definition.
            Checkpointing::Selective => saved(ACT_SELECTIVE),
            Checkpointing::Full => saved(ACT_FULL) + ACT_FULL_WORKING_LAYERS * working(!self.flash),
        };
        // LoRA's dropout copies live as long as the layer's other saved tensors: in every
        // layer without recomputation, in the one being recomputed with it.
        let dropout_layers = match self.checkpointing {
            Checkpointing::Full => ACT_FULL_WORKING_LAYERS,
            _ if self.offload == Offload::Activations => 2.0 + ACT_FULL_WORKING_LAYERS,
            _ => l,
        };
        let dropout = dropout_layers * s * b * h * self.lora_dropout_saved();
        // fp32 training keeps fp32 activations: ~1.9x the 16-bit bytes (checked against
        // BERT-large's fp32 rows, nvml, in HF Transformers'
        // `docs/source/en/perf_train_gpu_one.md`).
        if self.dtype == Dtype::Fp32 {
            bytes * 1.9 + dropout
        } else {
            bytes + dropout
        }
    }

    /// Logits: training materialises `s·b·V` with an fp32 upcast
    /// (huggingface/transformers#38452); inference keeps only the
    /// last token's (`logits_to_keep`).
    pub(super) fn logits(&self) -> f64 {
        let v = f64::from(self.arch.vocab_size) / self.tp;
        if !self.workload.is_training() {
            return self.batch * self.beams * v * 4.0;
        }
        let per = self
            .framework()
            .map_or(LOGITS_HF, Framework::logits_bytes_per_token_vocab);
        self.tokens() * v * per
    }
}

#[cfg(test)]
mod tests {
    use crate::model::estimate::testing::{est, est_with, part};
    use crate::model::quantity::{GIB, MIB};

    #[test]
    fn activations_by_checkpointing_and_flash_attention() {
        let run = |gc: &'static str, fa: &'static str| {
            part(
                &est(&[
                    ("model", "qwen-7b-v1"),
                    ("workload", "lora"),
                    ("engine", "ms-swift"),
                    ("context-tokens", "2048"),
                    ("gradient-checkpointing", gc),
                    ("flash-attention", fa),
                ]),
                "activations",
            )
        };
        let (s, h, l, a) = (2048.0, 4096.0, 32.0, 32.0);
        assert_eq!(run("none", "true"), 34.0 * s * h * l);
        // The flash-attention term is 5·a·s²·b per layer: ms-swift measured 19.97 GiB for it.
        let fa_term = run("none", "false") - run("none", "true");
        assert_eq!(fa_term, 5.0 * a * s * s * l);
        assert!((fa_term / GIB - 19.97).abs() < 0.1);
        assert!(run("full", "true") < run("selective", "true"));
        assert!(run("selective", "true") < run("none", "true"));
        assert_eq!(run("full", "true"), 2.0 * s * h * l + 34.0 * s * h);
    }

    #[test]
    fn logits_matter_for_large_vocabularies_in_training_only() {
        let t = est(&[
            ("model", "llama-3.1-8b"),
            ("workload", "lora"),
            ("context-tokens", "8192"),
        ]);
        // No engine named: transformers' loss, three fp32 logit tensors at backward's start.
        assert_eq!(part(&t, "logits"), 8192.0 * 128_256.0 * 12.0);
        let tune = est(&[
            ("model", "llama-3.1-8b"),
            ("workload", "lora"),
            ("context-tokens", "8192"),
            ("engine", "torchtune"),
        ]);
        assert!(part(&tune, "logits") < part(&t, "logits") / 2.0);
        let i = est(&[("model", "llama-3.1-8b"), ("context-tokens", "8192")]);
        assert!(part(&i, "logits") < 1.0 * MIB);
    }

    #[test]
    fn lora_dropout_saves_a_copy_of_every_adapted_input() {
        let activations = |extra: &[(&'static str, &'static str)]| {
            part(
                &est_with(
                    &[
                        ("model", "llama-3.1-8b"),
                        ("workload", "lora"),
                        ("engine", "deepspeed"),
                        ("dtype", "bf16"),
                        ("batch", "2"),
                        ("context-tokens", "1000"),
                        ("gradient-checkpointing", "none"),
                    ],
                    extra,
                ),
                "activations",
            )
        };
        let base = activations(&[]);
        assert_eq!(activations(&[("lora-dropout", "0")]), base);
        // Per layer and token: q, k, v (3 x 4096), o (32 x 128), gate and up (2 x 4096), down
        // (14336) inputs, each a bf16 copy plus a 1-byte mask.
        let inputs = 3.0 * 4096.0 + 4096.0 + 2.0 * 4096.0 + 14_336.0;
        let per_layer = 2.0 * 1000.0 * inputs * 3.0;
        assert!((activations(&[("lora-dropout", "0.1")]) - base - 32.0 * per_layer).abs() <= 2.0);
        // Recomputed layers keep nothing; the one being recomputed does.
        let full = |extra: &[(&'static str, &'static str)]| {
            let mut v = vec![("gradient-checkpointing", "full")];
            v.extend_from_slice(extra);
            activations(&v)
        };
        assert!((full(&[("lora-dropout", "0.05")]) - full(&[]) - per_layer).abs() <= 2.0);
        // litgpt drops out only the fused QKV input, by default (0.05).
        let litgpt = |extra: &[(&'static str, &'static str)]| {
            let mut v = vec![("engine", "litgpt")];
            v.extend_from_slice(extra);
            activations(&v)
        };
        let qkv_input = 32.0 * 2.0 * 1000.0 * 4096.0 * 3.0;
        assert!((litgpt(&[]) - litgpt(&[("lora-dropout", "0")]) - qkv_input).abs() <= 2.0);
    }

    #[test]
    fn torchtitan_sequence_parallel_keeps_the_gathered_linear_inputs_whole() {
        let run = |engine: &'static str, sp: &'static str| {
            part(
                &est(&[
                    ("model", "llama-3.1-70b"),
                    ("workload", "training"),
                    ("dtype", "fp16-amp"),
                    ("engine", engine),
                    ("tensor-parallel", "8"),
                    ("data-parallel", "32"),
                    ("zero-stage", "3"),
                    ("gradient-checkpointing", "full"),
                    ("sequence-parallel", sp),
                    ("batch", "16"),
                    ("context-tokens", "8192"),
                ]),
                "activations",
            )
        };
        // One layer being recomputed: its attention and MLP inputs, 2 B each, whole instead of
        // an eighth.
        let gathered = 16.0 * 8192.0 * 8192.0 * 4.0 * (1.0 - 1.0 / 8.0);
        assert!((run("torchtitan", "true") - run("megatron", "true") - gathered).abs() <= 2.0);
        assert_eq!(run("torchtitan", "false"), run("megatron", "false"));
    }
}
