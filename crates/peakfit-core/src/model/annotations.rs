//! Reading a pod's `peakfit.io/*` annotations into a [`Spec`], and from it the [`PodRequest`] the
//! scheduler places.
//!
//! Strict on purpose: an unknown `peakfit.io/` key is refused with the list of known ones, so a
//! typo (`peakfit.io/gpu`) cannot silently schedule a pod on defaults. Each refusal names the
//! annotation, the value and what would have been accepted.
//!
//! A pod opts in with any input annotation below; the output ones written by bind
//! (`assigned-gpus`, `reserved-bytes`, `gpu-memory-fraction`) alone do not.
//!
//! | annotation (`peakfit.io/…`) | accepted values | default |
//! |---|---|---|
//! | `vram` | Kubernetes quantity per GPU, at most `1Ei` (`20Gi`, `20G`, `1.5Ti`, `1e9`); overrides the model | from the model |
//! | `gpu-share` | share of each GPU, 0.001 (a thousandth) up to 1 (`0.25`), as GPU-sharing schedulers count it (openb's `gpu_milli` / 1000); overrides `vram` and the model | none |
//! | `gpus` | 1–64 | `tensor-parallel`, else 1 |
//! | `model` | a built-in preset (see the preset table), case-insensitive, checkpoint suffixes like `-Chat`, `-Int4`, `(v1)` ignored; any other name (at most 253 characters) is a label and then needs `params` or `layers` + `hidden-size` | none |
//! | `model-config` | the name of a ConfigMap in the pod's namespace, labelled `peakfit.io/model-config: "true"`, whose key `config.json` (at most 1 MiB) holds the model's Hugging Face config: read by the extender into the shape annotations (the pod's own annotations override it); a missing or unreadable one fails the pod's scheduling with the ConfigMap and field named | none |
//! | `architecture` | `decoder encoder encoder-decoder diffusion`; `diffusion` needs a diffusion preset | the preset's; `decoder` |
//! | `params` | count: `8.03B`, `335M`, `1.1T`, `124000000` | the preset's |
//! | `layers` | 1–1024 | the preset's |
//! | `hidden-size` | 1–1048576 | the preset's |
//! | `attention-heads` | 1–4096 | the preset's |
//! | `kv-heads` | 1–4096, at most `attention-heads` | the preset's (= heads without a preset) |
//! | `head-dim` | 1–4096 | the preset's (hidden / heads without a preset) |
//! | `vocab-size` | 1–16777216 | the preset's |
//! | `intermediate-size` | per-branch FFN width, 1–4194304 | the preset's |
//! | `tied-embeddings` | `true` `false` | the preset's |
//! | `dtype` | `fp32 fp16 bf16 fp16-amp fp8 int8 int4-gptq int4-awq nf4 nf4-dq` | `bf16`; `fp16-amp` for training; `nf4` for qlora |
//! | `kv-dtype` | `fp32 fp16 bf16 fp8 int8` | 16-bit (fp32 for fp32 models) |
//! | `workload` | `inference training lora qlora` | `inference` |
//! | `batch` | sequences per GPU per step, 1–1048576 | 1 |
//! | `context-tokens` | tokens per sequence at the peak (`128K` allowed) | 256 inference, 256 training, 512 for a serving engine's smallest-GPU check |
//! | `prompt-tokens` | tokens of the prompt `generate` prefills, 1 up to `context-tokens` (`128K` allowed), inference only: transformers' prefill runs over the prompt and the new tokens come one at a time, so the prefill's activations are the prompt's, and the decode's cache grows from the prompt's length to the context's (the caching allocator's fresh segments at each 2 MiB of that growth are counted where the first decode step already left the copies in segments of their own; a short prompt whose copies outgrow the prefill's blocks only later in a long generation is counted from the allocator replay's layout where the replay runs, for Llama-layout decoders, and can read low for other architectures) | the whole context (the prefill sized as if the prompt filled it, never low for the prefill; the decode's growth counted for one 2 MiB crossing, which reads low for a longer generation whose copies live in segments of their own: a long generation should state its prompt) |
//! | `engine` | free-form; `vllm tgi sglang tensorrt-llm` budget a fraction of the GPU, anything else is a plain framework (`torchtune` and `ms-swift` (or `swift`) change the logits term; a one-GPU `torchtune` full fine-tune steps the optimizer in backward, so no full gradient set; `faster-whisper` with `batch` > 1 is its batched pipeline, whose decoder holds no previous-text prompt) | plain framework |
//! | `gpu-memory-utilization` | (0, 1], only with a fraction engine | vLLM 0.92, TGI 1.0, SGLang 0.88, TensorRT-LLM 0.9 |
//! | `tensor-parallel` | 1–64, a divisor of `gpus` | 1 |
//! | `sequence-parallel` | `true` `false`: with `tensor-parallel`, the activations TP leaves whole (norms, dropout) are split too | `false` |
//! | `pipeline-parallel` | stages, 1–256: a GPU holds its stage's layers and, under 1F1B, as many micro-batches in flight as there are stages | 1 |
//! | `context-parallel` | 1–256: the sequence is split over this many GPUs (ring attention) | 1 |
//! | `data-parallel` | 1–1048576 | 1 |
//! | `zero-stage` | `0`–`3`, or FSDP's `no-shard` (0) `shard-grad-op` (2) `full-shard` (3) `hybrid-shard` (3 within the pod's GPUs); a numeric `3` outside torchtitan/torchtune/litgpt is DeepSpeed, which adds its 5e8-element gradient bucket | 0 |
//! | `deepspeed-overlap-comm` | `true` `false`: DeepSpeed's `overlap_comm`, a second ZeRO-1/2 gradient bucket | `false` |
//! | `offload` | `none optimizer params optimizer+params activations sequential model`: what lives in CPU memory (ZeRO-Offload / FSDP `cpu_offload` / activation offloading / diffusers `enable_sequential_cpu_offload` / `enable_model_cpu_offload`) | `none` |
//! | `image-size` | diffusion only: image side in pixels, 64–16384 | the preset's (512 SD 1.5, 1024 others) |
//! | `images` | diffusion only: images per prompt, 1–1024 | 1 |
//! | `guidance` | diffusion only: `true` `false`, classifier-free guidance doubles the denoiser batch | the preset's (`false` for Flux) |
//! | `vae-decode` | diffusion only: `full slicing tiling slicing+tiling` | `full` |
//! | `beams` | encoder-decoder / decoder generation: beam width, 1–64 (each beam is a sequence) | 1 |
//! | `optimizer` | `adamw adam adamw-fused sgd lion adafactor adam-8bit adamw-8bit paged-adamw-8bit paged-adamw` | `adamw` |
//! | `gradient-checkpointing` | `none selective full` | `none` (`full` for torchtune) |
//! | `flash-attention` | `true` `false`: `false` is eager attention (the score matrix) | `true`: transformers' SDPA in every dtype (`false` for fp32 outside transformers) |
//! | `lora-rank` | 1–65536, only with lora/qlora | 8 (adapters on every linear layer) |
//! | `lora-dropout` | LoRA's dropout probability, 0 up to (not) 1, only with lora/qlora: above 0 each adapted layer saves a dropped-out copy of its input and the mask | 0 (PEFT's `LoraConfig` default); 0.05 with `engine: litgpt` (its `finetune/lora.py` default) |
//! | `residual-dropout` | the model's dropout probability after each attention and MLP block (`resid_pdrop`, set by `--model-config` for `gpt2` and `phi` configs), 0 up to (not) 1: a GPT-2 or Phi full fine-tune without checkpointing keeps each dropout's one-byte mask and its output (GPT-2's `embd_pdrop` is taken to match) | the preset's (`phi-1.5`: 0), else above 0 (the published GPT-2 and Phi-2 configs' 0.1) |
//! | `headroom` | extra fraction, 0–10, on the whole estimate (on the part outside a fraction engine's budget) | 0 |
//! | `model-type` | a Hugging Face `model_type` (`config.json`, set by `--model-config`): `qwen3`, `phi3`, `gemma2`, ... decide what transformers' modules keep alive (q/k norms, fused projections, four norms per block); `llama`, `mistral`, `qwen2` and `qwen3` (and the presets of those families, which carry it) also have `generate`'s reserved memory replayed request by request through the caching allocator, and so does `falcon` with one KV head under SDPA (Falcon-7B's layout, by its own layer; Falcon-40B's, multi-head and eager Falcons keep the analytic slack) and `phi3` under bf16 eager attention with a KV head per head (Phi-3-mini, its sliding window's mask and cache included; fp16 and fp32 eager, unchecked against the oracle, keep the analytic slack); other Llama-layout types get the larger of that replay and the analytic slack | the Llama layout (gated MLP unless 4 x hidden), its reserved the larger of the replay and the analytic slack |
//! | `expandable-segments` | `true` `false`: PyTorch's caching allocator maps one growing segment per pool instead of caching many (`expandable_segments:True` in `PYTORCH_ALLOC_CONF` or `PYTORCH_CUDA_ALLOC_CONF`; the webhook copies it from the first container that sets either), so blocks freed anywhere merge and the segment-stranding slack is the generic ratio at most | `false` (PyTorch's default) |
//! | `sliding-window` | tokens a sliding-window layer attends to, 1–67108864 (`sliding_window`, set by `--model-config` unless `use_sliding_window` is false): past it transformers builds the window's mask and repeats k and v to every head | none |
//! | `experts-per-token` | a mixture of experts' experts per token, 1–1024 (`num_experts_per_tok`, set by `--model-config`) | none (a dense MLP) |
//! | `experts` | a mixture of experts' experts per layer, 2–65536 (`num_local_experts` `num_experts` `n_routed_experts`, set by `--model-config`): LoRA on `all-linear` adapts each expert | none (a dense MLP) |
//! | `encoder-positions` | positions an encoder-decoder's encoder outputs per input, 1–1048576 (Whisper: 1500, `max_source_positions`) | the context |

use std::collections::BTreeMap;

use super::estimate::{Defaults, Framework, Platform, estimate_on};
use super::presets::{self, Preset};
use super::quantity::{parse_bytes, parse_count};
use crate::placement::{Demand, PodShape};

pub const PREFIX: &str = "peakfit.io/";

/// Input annotations; the README's annotation reference documents each (`tests/readme_docs.rs`).
pub const INPUT_KEYS: &[&str] = &[
    "vram",
    "gpu-share",
    "gpus",
    "model",
    "model-config",
    "params",
    "layers",
    "hidden-size",
    "attention-heads",
    "kv-heads",
    "head-dim",
    "vocab-size",
    "intermediate-size",
    "tied-embeddings",
    "dtype",
    "kv-dtype",
    "workload",
    "batch",
    "context-tokens",
    "prompt-tokens",
    "engine",
    "gpu-memory-utilization",
    "architecture",
    "tensor-parallel",
    "sequence-parallel",
    "pipeline-parallel",
    "context-parallel",
    "data-parallel",
    "zero-stage",
    "deepspeed-overlap-comm",
    "offload",
    "image-size",
    "images",
    "guidance",
    "vae-decode",
    "beams",
    "optimizer",
    "gradient-checkpointing",
    "flash-attention",
    "lora-rank",
    "lora-dropout",
    "residual-dropout",
    "headroom",
    "model-type",
    "encoder-positions",
    "experts-per-token",
    "experts",
    "sliding-window",
    "expandable-segments",
];

/// The smallest `gpu-share`: a thousandth of a GPU, openb's `gpu_milli` unit.
const MIN_GPU_SHARE: f64 = 0.001;

/// The largest `vram` accepted (1Ei). No GPU comes near it, and with the largest headroom (10x
/// more) a request stays far below 2^64, so the scheduler's sums over it cannot overflow.
const MAX_VRAM: u64 = 1 << 60;

/// Written on the pod by the extender's bind: the GPUs (UUIDs, comma separated). The one definition
/// of the output keys; the extender, the index and the webhook use these constants.
pub const ASSIGNED_GPUS: &str = "peakfit.io/assigned-gpus";
/// Written by bind: bytes reserved on each assigned GPU.
pub const RESERVED_BYTES: &str = "peakfit.io/reserved-bytes";
/// Written by bind for fraction-budget engines: the share of the GPU to tell the engine.
pub const GPU_MEMORY_FRACTION: &str = "peakfit.io/gpu-memory-fraction";
/// Names the pod's workload (whose observed peaks size its next pods, issue 21) over its
/// controller chain. Not an input of the model: it neither opts a pod in nor changes its size,
/// and is not refused. (`peakfit.io/workload` was taken: inference, training, LoRA.)
pub const WORKLOAD_NAME: &str = "peakfit.io/workload-name";
/// Written by the extender on a pending pod that starved (issue 22): the node and GPUs kept
/// for it until a deadline, as JSON. On the pod itself so that every replica's pod watch sees
/// it and a restarted extender finds it again.
pub const HOLD: &str = "peakfit.io/hold";
/// Written by the extender (bind's output and holds); reading them back must neither opt a pod
/// in nor be refused.
pub const OUTPUT_KEYS: &[&str] = &[ASSIGNED_GPUS, RESERVED_BYTES, GPU_MEMORY_FRACTION, HOLD];

/// Whether [`Spec::parse`] reads this annotation (full key): every key under [`PREFIX`] but the
/// extender's outputs ([`OUTPUT_KEYS`]) and [`WORKLOAD_NAME`], which it steps over. A pod's
/// request is a function of these annotations and the platform alone, which is what lets the
/// extender memoise it keyed by them (`cluster::index::request_memo`).
pub fn is_model_input(key: &str) -> bool {
    key.strip_prefix(PREFIX).is_some_and(|k| !skipped(k))
}

/// The `peakfit.io/` keys (prefix stripped) the parser steps over without reading.
fn skipped(key: &str) -> bool {
    OUTPUT_KEYS
        .iter()
        .chain([&WORKLOAD_NAME])
        .any(|o| o.strip_prefix(PREFIX) == Some(key))
}

/// A refused annotation: which one, what it said, and what would have been accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {PREFIX}{key}: {value:?} is not valid: {allowed}")]
pub struct AnnotationError {
    pub key: String,
    pub value: String,
    pub allowed: String,
}

impl AnnotationError {
    pub fn new(key: &str, value: &str, allowed: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            allowed: allowed.into(),
        }
    }
}

/// Weight precision. `Fp16Amp` is 16-bit compute with fp32 master weights (torch AMP, DeepSpeed
/// bf16, FSDP mixed precision).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Fp32,
    Fp16,
    Bf16,
    Fp16Amp,
    Fp8,
    Int8,
    Int4Gptq,
    Int4Awq,
    Nf4,
    Nf4Dq,
}

impl Dtype {
    pub const NAMES: &str = "fp32 fp16 bf16 fp16-amp fp8 int8 int4-gptq int4-awq nf4 nf4-dq";

    fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "fp32" | "float32" => Self::Fp32,
            "fp16" | "float16" => Self::Fp16,
            "bf16" | "bfloat16" => Self::Bf16,
            "fp16-amp" | "amp" => Self::Fp16Amp,
            "fp8" => Self::Fp8,
            "int8" => Self::Int8,
            "int4-gptq" | "gptq" => Self::Int4Gptq,
            "int4-awq" | "awq" => Self::Int4Awq,
            "nf4" => Self::Nf4,
            "nf4-dq" => Self::Nf4Dq,
            _ => {
                return Err(AnnotationError::new(
                    key,
                    value,
                    format!("one of {}", Self::NAMES),
                ));
            }
        })
    }

    /// Whether the weights are stored quantised (frozen: only adapters can train over them).
    pub fn is_quantised(self) -> bool {
        matches!(
            self,
            Self::Fp8 | Self::Int8 | Self::Int4Gptq | Self::Int4Awq | Self::Nf4 | Self::Nf4Dq
        )
    }

    /// bitsandbytes formats, which peft's `prepare_model_for_kbit_training` treats specially.
    pub fn is_bitsandbytes(self) -> bool {
        matches!(self, Self::Int8 | Self::Nf4 | Self::Nf4Dq)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
            Self::Fp16Amp => "fp16-amp",
            Self::Fp8 => "fp8",
            Self::Int8 => "int8",
            Self::Int4Gptq => "int4-gptq",
            Self::Int4Awq => "int4-awq",
            Self::Nf4 => "nf4",
            Self::Nf4Dq => "nf4-dq",
        }
    }
}

/// Precision of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    Fp32,
    Fp16,
    Fp8,
}

impl KvDtype {
    fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "fp32" | "float32" => Self::Fp32,
            "fp16" | "bf16" | "float16" | "bfloat16" | "auto" => Self::Fp16,
            "fp8" | "fp8-e4m3" | "fp8-e5m2" | "int8" => Self::Fp8,
            _ => {
                return Err(AnnotationError::new(
                    key,
                    value,
                    "one of fp32 fp16 bf16 fp8 int8 (auto = the compute dtype)",
                ));
            }
        })
    }

    pub fn bytes(self) -> u64 {
        match self {
            Self::Fp32 => 4,
            Self::Fp16 => 2,
            Self::Fp8 => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Inference,
    Training,
    Lora,
    Qlora,
}

impl Workload {
    pub fn is_training(self) -> bool {
        !matches!(self, Self::Inference)
    }

    pub fn is_adapter(self) -> bool {
        matches!(self, Self::Lora | Self::Qlora)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Inference => "inference",
            Self::Training => "training",
            Self::Lora => "lora",
            Self::Qlora => "qlora",
        }
    }
}

/// Optimizers by the state they keep per trainable parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    /// Two moments (Adam, AdamW).
    Adam,
    /// One momentum buffer (SGD with momentum, Lion).
    Momentum,
    /// Factored second moment only: O(rows + cols), negligible per parameter.
    Adafactor,
    /// bitsandbytes 8-bit Adam: two 1-byte moments.
    Adam8bit,
}

impl Optimizer {
    pub const NAMES: &str = "adamw adam adamw-fused sgd lion adafactor adam-8bit adamw-8bit \
         paged-adamw-8bit paged-adamw";

    fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "adamw" | "adam" | "adamw-fused" | "adamw-torch" | "paged-adamw"
            | "paged-adamw-32bit" => Self::Adam,
            "sgd" | "sgd-momentum" | "lion" => Self::Momentum,
            "adafactor" => Self::Adafactor,
            "adam-8bit" | "adamw-8bit" | "paged-adamw-8bit" | "paged-adam-8bit"
            | "adamw-bnb-8bit" => Self::Adam8bit,
            _ => {
                return Err(AnnotationError::new(
                    key,
                    value,
                    format!("one of {}", Self::NAMES),
                ));
            }
        })
    }
}

/// What a job keeps in CPU memory instead of on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    None,
    /// ZeRO-Offload / FSDP optimizer offload: fp32 master weights and optimizer state (and
    /// DeepSpeed's fp32 gradients) live on the CPU, which runs the step.
    Optimizer,
    /// ZeRO-Infinity `offload_param`: weights live on the CPU and are gathered a layer at a time.
    Params,
    /// Both: FSDP `CPUOffload(offload_params=True)`, DeepSpeed offload of both.
    OptimizerParams,
    /// Saved activations copied to CPU between forward and backward (torchtune/torchtitan
    /// activation offloading).
    Activations,
    /// Layer streaming: only the submodule running is on the GPU (diffusers
    /// `enable_sequential_cpu_offload`, accelerate `device_map` with CPU offload).
    Sequential,
    /// Whole sub-models in turn: only the pipeline component running is on the GPU (diffusers
    /// `enable_model_cpu_offload`).
    Model,
}

impl Offload {
    pub const NAMES: &str = "none optimizer params optimizer+params activations sequential model";

    fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "none" | "false" => Self::None,
            "optimizer" => Self::Optimizer,
            "params" | "parameters" => Self::Params,
            "optimizer+params" | "params+optimizer" | "optimizer,params" | "params,optimizer" => {
                Self::OptimizerParams
            }
            "activations" => Self::Activations,
            "sequential" => Self::Sequential,
            "model" => Self::Model,
            _ => {
                return Err(AnnotationError::new(
                    key,
                    value,
                    format!("one of {}", Self::NAMES),
                ));
            }
        })
    }

    pub fn optimizer(self) -> bool {
        matches!(self, Self::Optimizer | Self::OptimizerParams)
    }

    pub fn params(self) -> bool {
        matches!(self, Self::Params | Self::OptimizerParams)
    }
}

/// How a diffusion pipeline's VAE decodes the final latents (diffusers `enable_vae_slicing`,
/// `enable_vae_tiling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaeDecode {
    Full,
    /// One image at a time.
    Slicing,
    /// Overlapping tiles of the VAE's native size.
    Tiling,
    SlicingTiling,
}

impl VaeDecode {
    fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "full" | "none" => Self::Full,
            "slicing" => Self::Slicing,
            "tiling" => Self::Tiling,
            "slicing+tiling" | "tiling+slicing" => Self::SlicingTiling,
            _ => {
                return Err(AnnotationError::new(
                    key,
                    value,
                    "one of full slicing tiling slicing+tiling",
                ));
            }
        })
    }

    pub fn slicing(self) -> bool {
        matches!(self, Self::Slicing | Self::SlicingTiling)
    }

    pub fn tiling(self) -> bool {
        matches!(self, Self::Tiling | Self::SlicingTiling)
    }
}

/// The longest model label accepted (a DNS subdomain's length: names are copied into events).
const MAX_MODEL_LABEL: usize = 253;

/// A Kubernetes object name of the DNS-subdomain kind (RFC 1123), as `ConfigMap` names are.
pub fn is_dns_subdomain(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.starts_with(ok)
        && name.ends_with(ok)
        && name.chars().all(|c| ok(c) || c == '-' || c == '.')
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpointing {
    None,
    Selective,
    Full,
}

/// How a serving engine sizes itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Budgets a fraction of the whole GPU (`gpu-memory-utilization` / `mem-fraction-static` /
    /// `cuda-memory-fraction`).
    Fraction(FractionEngine),
    /// A plain framework: memory follows the model, except for the rules its [`Framework`]
    /// carries (chunked cross-entropy, fp32 upcasts, ...).
    Framework(Framework),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FractionEngine {
    Vllm,
    Sglang,
    Tgi,
    TensorrtLlm,
}

impl FractionEngine {
    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Tgi => "tgi",
            Self::TensorrtLlm => "tensorrt-llm",
        }
    }
}

impl Engine {
    fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        let name = value.trim().to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            return Err(AnnotationError::new(
                key,
                value,
                "an engine name (letters, digits, - _ .; at most 63): vllm tgi sglang \
                 tensorrt-llm budget a fraction of the GPU, anything else (hf litgpt torchtune \
                 torchtitan deepspeed ...) is a plain framework",
            ));
        }
        Ok(match name.as_str() {
            "vllm" => Self::Fraction(FractionEngine::Vllm),
            "sglang" => Self::Fraction(FractionEngine::Sglang),
            "tgi" | "text-generation-inference" => Self::Fraction(FractionEngine::Tgi),
            "tensorrt-llm" | "tensorrt_llm" | "trtllm" | "trt-llm" => {
                Self::Fraction(FractionEngine::TensorrtLlm)
            }
            _ => Self::Framework(Framework::from_name(&name)),
        })
    }

    pub fn name(&self) -> &str {
        match self {
            Self::Fraction(e) => e.name(),
            Self::Framework(framework) => framework.name(),
        }
    }

    /// The framework, when the engine is one (not a fraction engine).
    pub fn framework(&self) -> Option<&Framework> {
        match self {
            Self::Fraction(_) => None,
            Self::Framework(framework) => Some(framework),
        }
    }
}

/// Everything a pod's annotations say, validated, before defaults are applied. The estimator
/// fills the gaps (see [`mod@super::estimate`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent annotations (hybrid shard, FSDP naming, paged and fused optimizers), \
              not a state machine"
)]
pub struct Spec {
    /// The input keys present, without the prefix: a spec with none means "not a peakfit pod".
    pub keys: Vec<&'static str>,
    pub vram: Option<u64>,
    pub gpu_share: Option<f64>,
    pub gpus: Option<u32>,
    pub model: Option<&'static Preset>,
    /// A `model` value that names no preset: a label only, the shape annotations describe it.
    pub model_label: Option<String>,
    /// `model-config`: the `ConfigMap` (pod's namespace, key `config.json`) the extender reads
    /// the model's shape from. Only the extender resolves it; everywhere else it is a name.
    pub model_config: Option<String>,
    pub architecture: Option<presets::Kind>,
    pub params: Option<u64>,
    pub layers: Option<u32>,
    pub hidden_size: Option<u32>,
    pub attention_heads: Option<u32>,
    pub kv_heads: Option<u32>,
    pub head_dim: Option<u32>,
    pub vocab_size: Option<u32>,
    pub intermediate_size: Option<u32>,
    pub tied_embeddings: Option<bool>,
    pub dtype: Option<Dtype>,
    pub kv_dtype: Option<KvDtype>,
    pub workload: Option<Workload>,
    pub batch: Option<u32>,
    pub context_tokens: Option<u64>,
    /// Tokens of the prompt `generate` prefills (the rest of the context is generated one
    /// token at a time); unset, the prefill is sized for the whole context.
    pub prompt_tokens: Option<u64>,
    pub engine: Option<Engine>,
    pub gpu_memory_utilization: Option<f64>,
    pub tensor_parallel: Option<u32>,
    pub sequence_parallel: Option<bool>,
    pub pipeline_parallel: Option<u32>,
    pub context_parallel: Option<u32>,
    pub data_parallel: Option<u32>,
    pub zero_stage: Option<u8>,
    /// DeepSpeed's `overlap_comm` (ZeRO-1/2: a second gradient bucket; DeepSpeed's default is
    /// off below stage 3).
    pub overlap_comm: Option<bool>,
    /// FSDP `HYBRID_SHARD`: sharded within the pod's GPUs, replicated across pods.
    pub hybrid_shard: bool,
    /// The stage was named the FSDP way (`full-shard` ...), not as a DeepSpeed stage number:
    /// the two gather offloaded parameters differently.
    pub fsdp: bool,
    pub offload: Option<Offload>,
    pub image_size: Option<u32>,
    pub images: Option<u32>,
    pub guidance: Option<bool>,
    pub vae_decode: Option<VaeDecode>,
    pub beams: Option<u32>,
    pub optimizer: Option<Optimizer>,
    /// A `paged-*` optimizer: its state lives in CUDA unified memory, outside PyTorch's allocator.
    pub optimizer_paged: bool,
    /// `adamw-fused`: torch's fused kernel (`torch._fused_adamw_`) updates in place; the default
    /// `foreach` path allocates a temporary the size of one moment (`_foreach_sqrt`).
    pub optimizer_fused: bool,
    pub gradient_checkpointing: Option<Checkpointing>,
    pub flash_attention: Option<bool>,
    /// PyTorch's `expandable_segments` allocator setting.
    pub expandable_segments: Option<bool>,
    pub lora_rank: Option<u32>,
    /// LoRA's dropout probability on each adapter's input.
    pub lora_dropout: Option<f64>,
    /// The model's dropout probability after each block (`resid_pdrop`).
    pub residual_dropout: Option<f64>,
    pub headroom: Option<f64>,
    /// The Hugging Face `model_type` (`config.json`): how the modeling code builds a block
    /// (fused projections, q/k norms, sandwich norms), which decides what it keeps alive.
    pub model_type: Option<ModelType>,
    /// The `model-type` as given, lower case with `-` as `_`. [`ModelType`] groups the types
    /// whose blocks keep the same tensors alive; a term that follows one modeling file request
    /// by request (the prefill replay) needs the type itself, since the group's members differ
    /// in what they allocate (Gemma v1's scaled embeddings, Granite's multipliers, ...).
    pub model_type_name: Option<String>,
    /// Positions the encoder of an encoder-decoder outputs per input (Whisper: 1500 audio
    /// frames per 30 s window, `max_source_positions`); the decoder's cross-attention caches them.
    pub encoder_positions: Option<u32>,
    /// A mixture of experts' experts per token (`num_experts_per_tok`): how many copies of
    /// each token its expert layers route.
    pub experts_per_token: Option<u32>,
    /// A mixture of experts' experts per layer (`num_local_experts`): PEFT adapts each.
    pub experts: Option<u32>,
    /// Tokens a sliding-window attention layer sees (`sliding_window` in `config.json`).
    pub sliding_window: Option<u64>,
}

/// Model families whose Hugging Face modeling code differs in what a block keeps alive; the
/// `model_type` of a `config.json`. Anything else builds its block the Llama way (separate q, k,
/// v and gate/up projections, `RMSNorm` in fp32) with a plain MLP when it is 4h wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    /// `llama`, `mistral`, `mixtral`, `qwen2`, `qwen2_moe` and the other gated-MLP decoders
    /// (`hf_config`'s list): gated MLP whatever its width.
    Llama,
    /// A type not known here: built the Llama way, its MLP gated unless it is 4x the hidden
    /// size (GPT-NeoX, StarCoder keep a plain 4h MLP).
    Other,
    /// `qwen3`, `qwen3_moe`, `olmo2`: an `RMSNorm` over each head of q and k
    /// (`Qwen3Attention.q_norm`/`k_norm`).
    QkNorm,
    /// `phi3`: fused `qkv_proj` and `gate_up_proj` (`Phi3Attention`, `Phi3MLP`).
    Phi3,
    /// `gpt2`, `gptj`, `codegen`: `LayerNorm` and a GELU composed of elementwise ops
    /// (`NewGELUActivation`, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`), each a new tensor.
    Gpt2,
    /// `phi` (Phi-1.5, Phi-2: `models/phi/modeling_phi.py`): GPT-2's `LayerNorm` and composed
    /// GELU (`PhiMLP` is `fc2(activation_fn(fc1(x)))`, `hidden_act` `gelu_new`, which `ACT2FN`
    /// maps to `NewGELUActivation`), with rotary embeddings (`partial_rotary_factor`: the rotated
    /// part is `torch.cat` back beside the rest) and Llama's eager attention (its
    /// `eager_attention_forward` runs `softmax(w, dtype=float32)`).
    Phi,
    /// `gemma2`, `gemma3_text`: four norms per block (`pre_feedforward_layernorm`,
    /// `post_feedforward_layernorm`, ...) and embeddings scaled by `sqrt(hidden)` into a new
    /// tensor (`Gemma2Model.forward`); gemma3 adds q/k norms.
    Gemma2,
    Gemma3,
    /// Encoders and encoder-decoders with `LayerNorm` (BERT family, Whisper, T5).
    LayerNorm,
    /// `falcon`: one fused `query_key_value`, `LayerNorm`, a plain 4h MLP, and a causal mask
    /// built on every forward (`FalconModel.forward` calls `create_causal_mask` with
    /// `allow_is_causal_skip=False`), so its own `scaled_dot_product_attention` call always
    /// gets a mask.
    Falcon,
}

impl ModelType {
    /// One linear projects q, k and v together (`Phi3Attention.qkv_proj`,
    /// `FalconAttention.query_key_value`): one output split into views, and one module for
    /// PEFT to adapt where Llama's code has three.
    pub fn fused_qkv(self) -> bool {
        matches!(self, Self::Phi3 | Self::Falcon)
    }

    /// One linear projects the MLP's gate and up halves together (`Phi3MLP.gate_up_proj`, then
    /// `chunk(2)`): one output, and one module for PEFT to adapt where Llama's code has two.
    pub fn fused_gate_up(self) -> bool {
        self == Self::Phi3
    }

    /// Reads a `model_type`; unknown types are built the Llama way.
    pub fn from_model_type(name: &str) -> Self {
        match name.to_ascii_lowercase().replace('-', "_").as_str() {
            "qwen3" | "qwen3_moe" | "olmo2" => Self::QkNorm,
            "phi3" => Self::Phi3,
            "gemma2" => Self::Gemma2,
            "gemma3" | "gemma3_text" => Self::Gemma3,
            "bert" | "roberta" | "xlm_roberta" | "deberta" | "deberta_v2" | "electra"
            | "distilbert" | "albert" | "whisper" | "t5" | "mt5" | "bart" => Self::LayerNorm,
            "gpt2" | "gptj" | "codegen" => Self::Gpt2,
            "phi" => Self::Phi,
            "falcon" | "refinedweb" | "refinedwebmodel" => Self::Falcon,
            "llama" | "mistral" | "mixtral" | "qwen2" | "qwen2_moe" | "gemma" | "olmo"
            | "deepseek_v2" | "deepseek_v3" | "cohere" | "granite" | "internlm2" | "yi"
            | "mllama" | "mllama_text_model" => Self::Llama,
            _ => Self::Other,
        }
    }
}

/// A dropout probability: from 0 up to, not including, 1 (at 1 it drops every `what`); any
/// other value is refused with that range.
fn dropout(key: &str, value: &str, what: &str) -> Result<f64, AnnotationError> {
    fraction(key, value, false, 1.0)
        .ok()
        .filter(|p| *p < 1.0)
        .ok_or_else(|| {
            AnnotationError::new(
                key,
                value,
                format!("a probability from 0 up to, not including, 1 (1 drops every {what})"),
            )
        })
}

fn int<T: TryFrom<u64>>(key: &str, value: &str, min: u64, max: u64) -> Result<T, AnnotationError> {
    let err = || AnnotationError::new(key, value, format!("a whole number from {min} to {max}"));
    let n: u64 = value.trim().parse().map_err(|_| err())?;
    if !(min..=max).contains(&n) {
        return Err(err());
    }
    T::try_from(n).map_err(|_| err())
}

/// Sizes that may be written as counts (`128K` context tokens, `152064` vocab).
fn count<T: TryFrom<u64>>(
    key: &str,
    value: &str,
    min: u64,
    max: u64,
) -> Result<T, AnnotationError> {
    let err = || {
        AnnotationError::new(
            key,
            value,
            format!("a whole number from {min} to {max} (K and M suffixes allowed)"),
        )
    };
    let n = parse_count(value).map_err(|_| err())?;
    if !(min..=max).contains(&n) {
        return Err(err());
    }
    T::try_from(n).map_err(|_| err())
}

fn boolean(key: &str, value: &str) -> Result<bool, AnnotationError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(AnnotationError::new(key, value, "true or false")),
    }
}

fn fraction(key: &str, value: &str, min_exclusive: bool, max: f64) -> Result<f64, AnnotationError> {
    let lower = if min_exclusive { "above 0" } else { "from 0" };
    let err = || AnnotationError::new(key, value, format!("a decimal {lower} up to {max}"));
    let f: f64 = value.trim().parse().map_err(|_| err())?;
    if !f.is_finite() || f < 0.0 || (min_exclusive && f == 0.0) || f > max {
        return Err(err());
    }
    Ok(f)
}

impl Spec {
    /// Parses every `peakfit.io/` annotation. Keys outside the prefix are not ours and ignored.
    pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Self, AnnotationError> {
        let mut spec = Spec::default();
        for (full_key, value) in annotations {
            let Some(key) = full_key.strip_prefix(PREFIX) else {
                continue;
            };
            spec.set(key, value)?;
            if let Some(known) = INPUT_KEYS.iter().find(|k| **k == key) {
                spec.keys.push(known);
            }
        }
        spec.check()?;
        Ok(spec)
    }

    /// Whether any input annotation was given (output ones alone do not opt a pod in).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), AnnotationError> {
        let v = value.trim();
        match key {
            "vram" => {
                let bytes =
                    parse_bytes(v).map_err(|e| AnnotationError::new(key, value, e.to_string()))?;
                if bytes == 0 || bytes > MAX_VRAM {
                    return Err(AnnotationError::new(
                        key,
                        value,
                        "a quantity above zero and at most 1Ei, such as 20Gi",
                    ));
                }
                self.vram = Some(bytes);
            }
            "gpu-share" => {
                let share = fraction(key, v, true, 1.0)?;
                // openb counts shares in thousandths of a GPU (`gpu_milli`); a smaller share
                // rounds to no memory at all (1e-300 reserved 0 bytes).
                if share < MIN_GPU_SHARE {
                    return Err(AnnotationError::new(
                        key,
                        value,
                        format!("a decimal from {MIN_GPU_SHARE} (a thousandth of a GPU) up to 1"),
                    ));
                }
                self.gpu_share = Some(share);
            }
            "gpus" => self.gpus = Some(int(key, v, 1, 64)?),
            "model-config" => {
                if !is_dns_subdomain(v) {
                    return Err(AnnotationError::new(
                        key,
                        value,
                        "the name of a ConfigMap in the pod's namespace (a DNS subdomain: \
                         lowercase letters, digits, '-' and '.', at most 253 characters)",
                    ));
                }
                self.model_config = Some(v.to_owned());
            }
            "model" => match presets::find(v) {
                Some(p) => self.model = Some(p),
                None => {
                    // Any other name is a label: the check after parsing demands the fields
                    // that describe it.
                    if v.is_empty() || v.len() > MAX_MODEL_LABEL || v.chars().any(char::is_control)
                    {
                        return Err(AnnotationError::new(
                            key,
                            value,
                            format!(
                                "a built-in preset (case-insensitive: {}) or any other name of \
                                 1 to {MAX_MODEL_LABEL} printable characters",
                                presets::names()
                            ),
                        ));
                    }
                    self.model_label = Some(v.to_string());
                }
            },
            "architecture" => {
                self.architecture = Some(match v.to_ascii_lowercase().as_str() {
                    "decoder" | "decoder-only" | "causal-lm" => presets::Kind::Decoder,
                    "encoder" | "encoder-only" => presets::Kind::Encoder,
                    "encoder-decoder" | "seq2seq" => presets::Kind::EncoderDecoder {
                        encoder_positions: 0,
                        decoder_positions: 0,
                    },
                    // Resolved against the preset in `check`.
                    "diffusion" => presets::Kind::Diffusion(presets::PLACEHOLDER_DIFFUSION),
                    _ => {
                        return Err(AnnotationError::new(
                            key,
                            value,
                            format!("one of {}", presets::Kind::NAMES),
                        ));
                    }
                });
            }
            "params" => {
                let n =
                    parse_count(v).map_err(|e| AnnotationError::new(key, value, e.to_string()))?;
                if n == 0 {
                    return Err(AnnotationError::new(
                        key,
                        value,
                        "a count above zero such as 8.03B",
                    ));
                }
                self.params = Some(n);
            }
            "layers" => self.layers = Some(int(key, v, 1, 1024)?),
            "hidden-size" => self.hidden_size = Some(count(key, v, 1, 1 << 20)?),
            "attention-heads" => self.attention_heads = Some(int(key, v, 1, 4096)?),
            "kv-heads" => self.kv_heads = Some(int(key, v, 1, 4096)?),
            "head-dim" => self.head_dim = Some(int(key, v, 1, 4096)?),
            "vocab-size" => self.vocab_size = Some(count(key, v, 1, 1 << 24)?),
            "intermediate-size" => self.intermediate_size = Some(count(key, v, 1, 1 << 22)?),
            "tied-embeddings" => self.tied_embeddings = Some(boolean(key, v)?),
            "dtype" => self.dtype = Some(Dtype::parse(key, v)?),
            "kv-dtype" => self.kv_dtype = Some(KvDtype::parse(key, v)?),
            "workload" => {
                self.workload = Some(match v.to_ascii_lowercase().as_str() {
                    "inference" | "serving" => Workload::Inference,
                    "training" | "full" | "pretraining" => Workload::Training,
                    "lora" => Workload::Lora,
                    "qlora" => Workload::Qlora,
                    _ => {
                        return Err(AnnotationError::new(
                            key,
                            value,
                            "one of inference training lora qlora",
                        ));
                    }
                });
            }
            "batch" => self.batch = Some(int(key, v, 1, 1 << 20)?),
            "model-type" => {
                let valid = !v.is_empty()
                    && v.len() <= 63
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
                if !valid {
                    return Err(AnnotationError::new(
                        key,
                        value,
                        "a Hugging Face model_type (letters, digits, _ and -, at most 63), such \
                         as llama, qwen3, phi3, gemma2, bert, whisper",
                    ));
                }
                self.model_type = Some(ModelType::from_model_type(v));
                self.model_type_name = Some(v.to_ascii_lowercase().replace('-', "_"));
            }
            "encoder-positions" => self.encoder_positions = Some(int(key, v, 1, 1 << 20)?),
            "experts-per-token" => self.experts_per_token = Some(int(key, v, 1, 1024)?),
            "experts" => self.experts = Some(int(key, v, 2, 1 << 16)?),
            "sliding-window" => self.sliding_window = Some(count(key, v, 1, 1 << 26)?),
            "context-tokens" => self.context_tokens = Some(count(key, v, 1, 1 << 26)?),
            "prompt-tokens" => self.prompt_tokens = Some(count(key, v, 1, 1 << 26)?),
            "engine" => self.engine = Some(Engine::parse(key, v)?),
            "gpu-memory-utilization" => {
                self.gpu_memory_utilization = Some(fraction(key, v, true, 1.0)?);
            }
            "tensor-parallel" => self.tensor_parallel = Some(int(key, v, 1, 64)?),
            "sequence-parallel" => self.sequence_parallel = Some(boolean(key, v)?),
            "pipeline-parallel" => self.pipeline_parallel = Some(int(key, v, 1, 256)?),
            "context-parallel" => self.context_parallel = Some(int(key, v, 1, 256)?),
            "data-parallel" => self.data_parallel = Some(int(key, v, 1, 1 << 20)?),
            "zero-stage" => {
                let name = v.to_ascii_lowercase().replace('_', "-");
                self.fsdp = matches!(
                    name.as_str(),
                    "no-shard" | "shard-grad-op" | "full-shard" | "hybrid-shard"
                );
                let (stage, hybrid) = match name.as_str() {
                    "no-shard" => (0, false),
                    "shard-grad-op" => (2, false),
                    "full-shard" => (3, false),
                    "hybrid-shard" => (3, true),
                    _ => (
                        int(key, v, 0, 3).map_err(|_| {
                            AnnotationError::new(
                                key,
                                value,
                                "a whole number from 0 to 3 (DeepSpeed ZeRO stages) or FSDP's no-shard \
                                 shard-grad-op full-shard hybrid-shard",
                            )
                        })?,
                        false,
                    ),
                };
                self.zero_stage = Some(stage);
                self.hybrid_shard = hybrid;
            }
            "deepspeed-overlap-comm" => self.overlap_comm = Some(boolean(key, v)?),
            "offload" => self.offload = Some(Offload::parse(key, v)?),
            "image-size" => self.image_size = Some(int(key, v, 64, 16384)?),
            "images" => self.images = Some(int(key, v, 1, 1024)?),
            "guidance" => self.guidance = Some(boolean(key, v)?),
            "vae-decode" => self.vae_decode = Some(VaeDecode::parse(key, v)?),
            "beams" => self.beams = Some(int(key, v, 1, 64)?),
            "optimizer" => {
                self.optimizer = Some(Optimizer::parse(key, v)?);
                self.optimizer_paged = v.to_ascii_lowercase().starts_with("paged-");
                self.optimizer_fused = v.to_ascii_lowercase().ends_with("-fused");
            }
            "gradient-checkpointing" => {
                self.gradient_checkpointing = Some(match v.to_ascii_lowercase().as_str() {
                    "none" | "false" => Checkpointing::None,
                    "selective" => Checkpointing::Selective,
                    "full" | "true" => Checkpointing::Full,
                    _ => {
                        return Err(AnnotationError::new(
                            key,
                            value,
                            "one of none selective full",
                        ));
                    }
                });
            }
            "flash-attention" => self.flash_attention = Some(boolean(key, v)?),
            "expandable-segments" => self.expandable_segments = Some(boolean(key, v)?),
            "lora-rank" => self.lora_rank = Some(int(key, v, 1, 65536)?),
            "lora-dropout" => self.lora_dropout = Some(dropout(key, v, "input")?),
            "residual-dropout" => self.residual_dropout = Some(dropout(key, v, "output")?),
            "headroom" => self.headroom = Some(fraction(key, v, false, 10.0)?),
            k if skipped(k) => {}
            _ => {
                return Err(AnnotationError::new(
                    key,
                    value,
                    format!(
                        "not a peakfit annotation; known keys are {} (and, written by the extender, {})",
                        INPUT_KEYS.join(" "),
                        OUTPUT_KEYS
                            .iter()
                            .map(|o| &o[PREFIX.len()..])
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks between annotations, after all are read.
    fn check(&mut self) -> Result<(), AnnotationError> {
        let show = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_default();
        if let Some(label) = &self.model_label
            && self.params.is_none()
            && self.model_config.is_none()
        {
            // A name that is no preset says nothing about size: the fields must.
            let missing = match (self.layers, self.hidden_size) {
                (None, _) => "layers",
                (Some(_), None) => "hidden-size",
                _ => "",
            };
            if !missing.is_empty() {
                return Err(AnnotationError::new(
                    missing,
                    "",
                    format!(
                        "required: model {label:?} is not a built-in preset ({}), so give \
                         peakfit.io/params or peakfit.io/layers and peakfit.io/hidden-size \
                         (or peakfit.io/vram)",
                        presets::names()
                    ),
                ));
            }
        }
        if let Some(presets::Kind::Diffusion(_)) = self.architecture {
            match self.model.map(|p| p.kind) {
                Some(kind @ presets::Kind::Diffusion(_)) => self.architecture = Some(kind),
                _ => {
                    return Err(AnnotationError::new(
                        "model",
                        self.model
                            .map(|p| p.name)
                            .or(self.model_label.as_deref())
                            .unwrap_or(""),
                        format!(
                            "a diffusion preset for architecture diffusion: {}",
                            presets::diffusion_names()
                        ),
                    ));
                }
            }
        }
        let diffusion = matches!(self.kind(), presets::Kind::Diffusion(_));
        for (key, given) in [
            ("image-size", self.image_size.is_some()),
            ("images", self.images.is_some()),
            ("guidance", self.guidance.is_some()),
            ("vae-decode", self.vae_decode.is_some()),
        ] {
            if given && !diffusion {
                return Err(AnnotationError::new(
                    key,
                    "",
                    format!(
                        "only for a diffusion pipeline (peakfit.io/model one of {})",
                        presets::diffusion_names()
                    ),
                ));
            }
        }
        if diffusion && self.workload.is_some_and(Workload::is_training) {
            return Err(AnnotationError::new(
                "workload",
                self.workload.map_or("", Workload::name),
                "inference for a diffusion pipeline (its training terms are not modelled: give \
                 peakfit.io/vram)",
            ));
        }
        if let (Some(kv), Some(heads)) = (self.kv_heads, self.attention_heads())
            && kv > heads
        {
            return Err(AnnotationError::new(
                "kv-heads",
                &kv.to_string(),
                format!("at most attention-heads ({heads})"),
            ));
        }
        if let (Some(tp), Some(gpus)) = (self.tensor_parallel, self.gpus)
            && gpus % tp != 0
        {
            return Err(AnnotationError::new(
                "tensor-parallel",
                &tp.to_string(),
                format!(
                    "a divisor of peakfit.io/gpus ({gpus}): each tensor-parallel group needs its own GPUs"
                ),
            ));
        }
        if self.lora_rank.is_some() && !self.workload.is_some_and(Workload::is_adapter) {
            return Err(AnnotationError::new(
                "lora-rank",
                &show(self.lora_rank),
                "only with peakfit.io/workload lora or qlora",
            ));
        }
        if let Some(prompt) = self.prompt_tokens {
            if self.workload.is_some_and(Workload::is_training) {
                return Err(AnnotationError::new(
                    "prompt-tokens",
                    &prompt.to_string(),
                    "only with peakfit.io/workload inference (a training step has no prompt)",
                ));
            }
            if let Some(context) = self.context_tokens
                && prompt > context
            {
                return Err(AnnotationError::new(
                    "prompt-tokens",
                    &prompt.to_string(),
                    format!(
                        "at most peakfit.io/context-tokens ({context}): the prompt is part of the context"
                    ),
                ));
            }
        }
        if self.lora_dropout.is_some() && !self.workload.is_some_and(Workload::is_adapter) {
            return Err(AnnotationError::new(
                "lora-dropout",
                &self.lora_dropout.map(|p| p.to_string()).unwrap_or_default(),
                "only with peakfit.io/workload lora or qlora",
            ));
        }
        if self.workload == Some(Workload::Qlora) && self.dtype.is_some_and(|d| !d.is_quantised()) {
            return Err(AnnotationError::new(
                "dtype",
                self.dtype.map_or("", Dtype::name),
                "a quantised dtype for workload qlora: fp8 int8 int4-gptq int4-awq nf4 nf4-dq",
            ));
        }
        if self.workload == Some(Workload::Training) && self.dtype.is_some_and(Dtype::is_quantised)
        {
            return Err(AnnotationError::new(
                "workload",
                "training",
                format!(
                    "lora or qlora over {} weights (quantised weights are frozen: full training \
                     needs fp32 bf16 fp16 or fp16-amp)",
                    self.dtype.map_or("", Dtype::name)
                ),
            ));
        }
        if self.gpu_memory_utilization.is_some()
            && !matches!(self.engine, Some(Engine::Fraction(_)))
        {
            return Err(AnnotationError::new(
                "gpu-memory-utilization",
                &self.gpu_memory_utilization.unwrap_or_default().to_string(),
                "only with peakfit.io/engine vllm sglang tgi or tensorrt-llm (engines that budget a fraction of the GPU)",
            ));
        }
        Ok(())
    }

    /// The architecture kind: the annotation, else the preset's, else a decoder.
    pub fn kind(&self) -> presets::Kind {
        let kind = self
            .architecture
            .or(self.model.map(|p| p.kind))
            .unwrap_or(presets::Kind::Decoder);
        match (kind, self.encoder_positions) {
            (
                presets::Kind::EncoderDecoder {
                    decoder_positions, ..
                },
                Some(encoder_positions),
            ) => presets::Kind::EncoderDecoder {
                encoder_positions,
                decoder_positions,
            },
            _ => kind,
        }
    }

    fn attention_heads(&self) -> Option<u32> {
        self.attention_heads
            .or_else(|| self.model.and_then(|p| p.shape).map(|a| a.attention_heads))
    }

    /// Whether the model side says enough to estimate: a preset, a parameter count, or an engine
    /// whose budget is a fraction of the GPU anyway.
    pub fn describes_model(&self) -> bool {
        self.model.is_some()
            || self.params.is_some()
            || (self.layers.is_some() && self.hidden_size.is_some())
            || matches!(self.engine, Some(Engine::Fraction(_)))
    }
}

/// What a pod asks of the scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct PodRequest {
    pub gpus: u32,
    pub demand: Demand,
    /// For engines that budget a fraction of the GPU: the fraction they should be told to use,
    /// when the model decides it. `None` with `fraction_engine` when `vram` fixes the bytes:
    /// bind then derives the fraction from the GPUs it picks.
    pub engine_fraction: Option<f64>,
    /// The engine budgets a fraction of the GPU (vLLM, TGI, SGLang, TensorRT-LLM) and must be
    /// told which one, or it takes its default share of the card whatever peakfit reserved.
    pub fraction_engine: bool,
}

impl PodRequest {
    pub fn shape(&self) -> PodShape {
        PodShape {
            gpus: self.gpus,
            demand: self.demand,
        }
    }
}

/// `Ok(None)` for a pod with no peakfit input annotation: it passes through untouched.
pub fn pod_request(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<PodRequest>, AnnotationError> {
    pod_request_on(annotations, Platform::default())
}

/// [`pod_request`] on a given platform (the extender's `--cuda-context`).
pub fn pod_request_on(
    annotations: &BTreeMap<String, String>,
    platform: Platform,
) -> Result<Option<PodRequest>, AnnotationError> {
    let spec = Spec::parse(annotations)?;
    if spec.is_empty() {
        return Ok(None);
    }
    request_on(&spec, platform).map(Some)
}

/// The request for an already parsed, non-empty spec.
pub fn request(spec: &Spec) -> Result<PodRequest, AnnotationError> {
    request_on(spec, Platform::default())
}

/// [`request`] on a given platform (its CUDA context: `--cuda-context`).
pub fn request_on(spec: &Spec, platform: Platform) -> Result<PodRequest, AnnotationError> {
    if let Some(share) = spec.gpu_share {
        // A share of whatever GPU the pod lands on, nothing fixed: the openb trace's pods.
        return Ok(PodRequest {
            gpus: spec.gpus.or(spec.tensor_parallel).unwrap_or(1),
            demand: Demand::fraction(share),
            engine_fraction: None,
            fraction_engine: false,
        });
    }
    if let Some(vram) = spec.vram {
        // An explicit per-GPU figure overrides the model; headroom still applies, and the GPU
        // count defaults as it does for a modelled pod (a tensor-parallel job spans its group).
        let bytes =
            crate::convert::f64_to_u64((vram as f64 * (1.0 + spec.headroom.unwrap_or(0.0))).ceil());
        return Ok(PodRequest {
            gpus: spec.gpus.or(spec.tensor_parallel).unwrap_or(1),
            demand: Demand::fixed(bytes),
            engine_fraction: None,
            fraction_engine: matches!(spec.engine, Some(Engine::Fraction(_))),
        });
    }
    if let Some(name) = &spec.model_config {
        // Whoever resolves the ConfigMap (the extender) merges its config.json into the
        // annotations and drops this key; reaching here means nobody did.
        return Err(AnnotationError::new(
            "model-config",
            name,
            "a ConfigMap only the extender reads, in a cluster; here describe the model with \
             the other annotations (peakfit estimate: --model-config config.json) or give \
             peakfit.io/vram",
        ));
    }
    if !spec.describes_model() {
        let given = &spec.keys;
        return Err(AnnotationError::new(
            "vram",
            "",
            format!(
                "a per-GPU quantity such as 20Gi, or a model description (peakfit.io/model \
                 or peakfit.io/params) so that {} can be turned into memory",
                given
                    .iter()
                    .map(|k| format!("{PREFIX}{k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    // The demand does not depend on the GPU size (only the displayed split does), so any size
    // will do. The breakdown is not kept: the extender indexes one request per pod.
    let e = estimate_on(spec, Defaults::GPU_TOTAL, platform);
    Ok(PodRequest {
        gpus: e.gpus,
        demand: e.demand,
        engine_fraction: e.engine_fraction,
        fraction_engine: matches!(spec.engine, Some(Engine::Fraction(_))),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_gpu_share_below_a_thousandth_is_refused() {
        let e = pod_request(&ann(&[("gpu-share", "1e-300")])).unwrap_err();
        assert!(e.to_string().contains("0.001"), "{e}");
        assert!(pod_request(&ann(&[("gpu-share", "0.001")])).is_ok());
    }
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
            .collect()
    }

    fn err(pairs: &[(&str, &str)]) -> AnnotationError {
        pod_request(&ann(pairs)).unwrap_err()
    }

    #[test]
    fn module_doc_lists_every_input_annotation() {
        let doc = include_str!("annotations.rs");
        for key in INPUT_KEYS {
            assert!(
                doc.contains(&format!("//! | `{key}` |")),
                "{key} missing from the doc table"
            );
        }
    }

    #[test]
    fn no_input_annotation_passes_through() {
        assert_eq!(pod_request(&BTreeMap::new()), Ok(None));
        let mut other = BTreeMap::new();
        other.insert("example.com/vram".into(), "garbage".into());
        assert_eq!(pod_request(&other), Ok(None));
        let outputs = ann(&[
            ("assigned-gpus", "GPU-1,GPU-2"),
            ("reserved-bytes", "123"),
            ("gpu-memory-fraction", "0.4500"),
        ]);
        assert_eq!(pod_request(&outputs), Ok(None));
        // A workload's name alone opts nothing in, and beside inputs changes nothing.
        assert_eq!(pod_request(&ann(&[("workload-name", "ml/chat")])), Ok(None));
        assert_eq!(
            pod_request(&ann(&[("vram", "20Gi"), ("workload-name", "ml/chat")])),
            pod_request(&ann(&[("vram", "20Gi")]))
        );
    }

    /// The keys `is_model_input` leaves out change no request, whatever they say: a modelled
    /// pod's request is the same with them (any value) as without, so a memo keyed by the
    /// inputs alone cannot serve another pod's result.
    #[test]
    fn the_keys_that_are_not_model_inputs_change_no_request() {
        let inputs = [
            ("model", "qwen3-0.6b"),
            ("workload", "inference"),
            ("batch", "2"),
            ("context-tokens", "1024"),
        ];
        let alone = pod_request(&ann(&inputs));
        assert!(matches!(alone, Ok(Some(_))), "{alone:?}");
        let skipped: Vec<&str> = OUTPUT_KEYS.iter().copied().chain([WORKLOAD_NAME]).collect();
        for key in &skipped {
            assert!(!is_model_input(key), "{key}");
            let mut with = ann(&inputs);
            with.insert(
                (*key).to_owned(),
                "\u{0}not a value of any input".to_owned(),
            );
            assert_eq!(pod_request(&with), alone, "{key}");
        }
        for key in INPUT_KEYS {
            assert!(is_model_input(&format!("{PREFIX}{key}")), "{key}");
        }
        // An unknown key under the prefix is read (and refused), one elsewhere is not ours.
        assert!(is_model_input("peakfit.io/vrma"));
        assert!(!is_model_input("example.com/vram"));
    }

    #[test]
    fn explicit_vram_overrides_the_model() {
        let r = pod_request(&ann(&[("vram", "20Gi"), ("model", "llama-3.1-8b")]))
            .unwrap()
            .unwrap();
        assert_eq!(r.gpus, 1);
        assert_eq!(r.demand, Demand::fixed(20 << 30));
        assert_eq!(r.shape().gpus, 1);
        let r = pod_request(&ann(&[
            ("vram", "10Gi"),
            ("gpus", "2"),
            ("headroom", "0.1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(r.gpus, 2);
        assert_eq!(r.demand.fixed_bytes, 11 << 30);
        // As documented, `gpus` defaults to `tensor-parallel` for an explicit figure too.
        let r = pod_request(&ann(&[("vram", "10Gi"), ("tensor-parallel", "4")]))
            .unwrap()
            .unwrap();
        assert_eq!(r.gpus, 4);
    }

    #[test]
    fn model_pods_default_gpus_to_tensor_parallel() {
        let r = pod_request(&ann(&[
            ("model", "llama-3.1-70b"),
            ("tensor-parallel", "4"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(r.gpus, 4);
        assert!(
            r.demand.fixed_bytes > 35 << 30,
            "70B bf16 over 4 GPUs: > 35 GiB each"
        );
    }

    #[test]
    fn a_prompt_is_part_of_an_inference_context() {
        let e = err(&[("context-tokens", "1024"), ("prompt-tokens", "2048")]);
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("prompt-tokens", "2048")
        );
        assert!(
            e.allowed
                .contains("at most peakfit.io/context-tokens (1024)"),
            "{e}"
        );
        let e = err(&[("workload", "training"), ("prompt-tokens", "512")]);
        assert_eq!(e.key, "prompt-tokens");
        assert!(e.allowed.contains("inference"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused_with_the_known_ones() {
        let e = err(&[("vram", "20Gi"), ("gpu", "2")]);
        assert_eq!(e.key, "gpu");
        assert!(
            e.allowed.contains("gpus") && e.allowed.contains("kv-heads"),
            "{e}"
        );
        assert!(e.to_string().contains("peakfit.io/gpu"), "{e}");
    }

    #[test]
    fn each_annotation_names_itself_the_value_and_what_is_allowed() {
        let cases: &[(&str, &str, &str)] = &[
            ("vram", "20GB", "20Gi"),
            ("vram", "-1Gi", "negative"),
            ("vram", "0", "above zero"),
            ("vram", "2Ei", "at most 1Ei"),
            ("gpus", "0", "from 1 to 64"),
            ("gpus", "two", "from 1 to 64"),
            ("params", "8.03Q", "8.03B"),
            ("params", "0", "above zero"),
            ("layers", "0", "from 1"),
            ("hidden-size", "big", "whole number"),
            ("attention-heads", "-1", "whole number"),
            ("kv-heads", "x", "whole number"),
            ("head-dim", "1.5", "whole number"),
            ("vocab-size", "lots", "whole number"),
            ("intermediate-size", "-4", "whole number"),
            ("tied-embeddings", "yes", "true or false"),
            ("dtype", "int3", "nf4-dq"),
            ("kv-dtype", "int3", "fp8"),
            ("workload", "pretrain-ish", "inference training lora qlora"),
            ("batch", "0", "from 1"),
            ("context-tokens", "0", "whole number"),
            ("engine", "v llm!", "tensorrt-llm"),
            ("tensor-parallel", "0", "from 1"),
            ("data-parallel", "0", "from 1"),
            ("zero-stage", "4", "from 0 to 3"),
            ("deepspeed-overlap-comm", "on", "true or false"),
            ("optimizer", "adamq", "paged-adamw-8bit"),
            ("gradient-checkpointing", "some", "none selective full"),
            ("flash-attention", "maybe", "true or false"),
            ("expandable-segments", "True:yes", "true or false"),
            ("headroom", "-0.1", "decimal"),
        ];
        for (key, value, hint) in cases {
            let e = err(&[("model", "llama-3.1-8b"), (key, value)]);
            assert_eq!(&e.key, key, "{e}");
            assert_eq!(&e.value, value, "{e}");
            assert!(e.allowed.contains(hint), "{key}={value}: {e}");
            let shown = e.to_string();
            assert!(shown.contains(&format!("peakfit.io/{key}")) && shown.contains(value));
        }
        // A name that is no preset is a label: without fields it names the first one missing.
        let e = err(&[("model", "llama-9")]);
        assert_eq!(e.key, "layers", "{e}");
        assert!(e.allowed.contains("llama-3.1-8b") && e.allowed.contains("params"));
        let e = err(&[("model", "llama-9"), ("layers", "32")]);
        assert_eq!(e.key, "hidden-size", "{e}");
        let e = err(&[("model", "x\u{7}y")]);
        assert_eq!(e.key, "model", "{e}");
        let e = err(&[("engine", "vllm"), ("gpu-memory-utilization", "1.5")]);
        assert_eq!(e.key, "gpu-memory-utilization");
        assert!(e.allowed.contains("up to 1"), "{e}");
        let e = err(&[
            ("model", "llama-3.1-8b"),
            ("workload", "lora"),
            ("lora-rank", "0"),
        ]);
        assert_eq!(e.key, "lora-rank");
    }

    #[test]
    fn cross_field_checks() {
        let e = err(&[("model", "llama-3.1-8b"), ("kv-heads", "64")]);
        assert_eq!((e.key.as_str(), e.value.as_str()), ("kv-heads", "64"));
        assert!(e.allowed.contains("32"), "{e}");
        let e = err(&[
            ("model", "llama-3.1-8b"),
            ("gpus", "3"),
            ("tensor-parallel", "2"),
        ]);
        assert_eq!(e.key, "tensor-parallel");
        let e = err(&[("model", "llama-3.1-8b"), ("lora-rank", "8")]);
        assert_eq!(e.key, "lora-rank");
        let e = err(&[
            ("model", "llama-3.1-8b"),
            ("workload", "qlora"),
            ("dtype", "bf16"),
        ]);
        assert_eq!(e.key, "dtype");
        let e = err(&[
            ("model", "llama-3.1-8b"),
            ("workload", "training"),
            ("dtype", "nf4"),
        ]);
        assert_eq!(e.key, "workload");
        let e = err(&[("model", "llama-3.1-8b"), ("gpu-memory-utilization", "0.5")]);
        assert_eq!(e.key, "gpu-memory-utilization");
    }

    #[test]
    fn workload_without_a_model_asks_for_vram_or_a_model() {
        let e = err(&[("batch", "4"), ("workload", "training")]);
        assert_eq!(e.key, "vram");
        assert!(e.allowed.contains("peakfit.io/batch"), "{e}");
    }

    #[test]
    fn a_gpu_share_is_a_pure_fraction_of_each_gpu() {
        let r = pod_request(&ann(&[("gpu-share", "0.35"), ("gpus", "2")]))
            .unwrap()
            .unwrap();
        assert_eq!(r.gpus, 2);
        assert_eq!(r.demand, Demand::fraction(0.35));
        assert_eq!(err(&[("gpu-share", "0")]).key, "gpu-share");
        assert_eq!(err(&[("gpu-share", "1.5")]).key, "gpu-share");
    }

    #[test]
    fn fraction_engine_without_a_model_is_a_pure_fraction() {
        let r = pod_request(&ann(&[
            ("engine", "vllm"),
            ("gpu-memory-utilization", "0.5"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(r.engine_fraction, Some(0.5));
        assert_eq!(r.demand.gpu_fraction, 0.5);
        assert_eq!(r.demand.min_gpu_total_bytes, 0);
    }

    #[test]
    fn values_are_case_and_space_tolerant() {
        let spec = Spec::parse(&ann(&[
            ("model", " Llama-3.1-8B "),
            ("dtype", "BF16"),
            ("flash-attention", "TRUE"),
            ("engine", "vLLM"),
            ("context-tokens", "128K"),
        ]))
        .unwrap();
        assert_eq!(spec.model.unwrap().name, "llama-3.1-8b");
        assert_eq!(spec.dtype, Some(Dtype::Bf16));
        assert_eq!(spec.flash_attention, Some(true));
        assert_eq!(spec.engine, Some(Engine::Fraction(FractionEngine::Vllm)));
        assert_eq!(spec.context_tokens, Some(128_000));
    }

    /// `residual-dropout` is a probability below 1 for any workload (`--model-config` writes it
    /// from `resid_pdrop` for inference pods too); out of range it names the field.
    #[test]
    fn residual_dropout_is_a_probability() {
        let spec =
            |v: &'static str| Spec::parse(&ann(&[("model", "gpt2"), ("residual-dropout", v)]));
        assert_eq!(spec("0.1").unwrap().residual_dropout, Some(0.1));
        assert_eq!(spec("0").unwrap().residual_dropout, Some(0.0));
        for bad in ["1", "1.5", "-0.1", "often"] {
            let e = spec(bad).unwrap_err();
            assert_eq!(e.key, "residual-dropout", "{bad}");
            assert_eq!(e.value, bad);
            assert!(e.to_string().contains("not including, 1"), "{e}");
        }
    }

    #[test]
    fn lora_dropout_is_a_probability_for_adapters_only() {
        let lora = [("model", "llama-3.1-8b"), ("workload", "lora")];
        let spec = |extra: (&'static str, &'static str)| {
            let mut v = lora.to_vec();
            v.push(extra);
            Spec::parse(&ann(&v))
        };
        assert_eq!(
            spec(("lora-dropout", "0.05")).unwrap().lora_dropout,
            Some(0.05)
        );
        assert_eq!(spec(("lora-dropout", "0")).unwrap().lora_dropout, Some(0.0));
        for bad in ["1", "1.5", "-0.1", "often"] {
            let e = spec(("lora-dropout", bad)).unwrap_err();
            assert_eq!(
                (e.key.as_str(), e.value.as_str()),
                ("lora-dropout", bad),
                "{e}"
            );
        }
        let e = err(&[("model", "llama-3.1-8b"), ("lora-dropout", "0.1")]);
        assert_eq!(e.key, "lora-dropout");
        assert!(e.allowed.contains("lora or qlora"), "{e}");
    }
}
