//! The frameworks the model knows by name, and what each changes in the terms.
//!
//! A pod's `peakfit.io/engine` names either an engine that budgets a fraction of the GPU
//! ([`super::fraction`]) or a plain framework, whose memory follows the model except where its
//! own code changes a term. [`Framework::from_name`] is the one place a framework name (alias
//! included) is read; every exception is a method of [`Framework`], and all of them read one
//! exhaustive `match` (`Framework::rules`), so a new framework has to say there what it changes.
//! A name the model does not know is kept ([`Framework::Other`]) and changes nothing.
//!
//! | rule | frameworks | term | source |
//! |---|---|---|---|
//! | [`Framework::runs_peft_kbit_preparation`] | hf, hf-trainer, peft, trl, axolotl, ms-swift | fp32 upcast | peft `prepare_model_for_kbit_training` |
//! | [`Framework::skips_kbit_preparation_when_sharded`] | trl | fp32 upcast | TRL `sft_trainer.py` `is_sharded_qlora` |
//! | [`Framework::shards_with_fsdp`] | torchtitan, torchtune, litgpt | DeepSpeed buckets, FSDP root unit | their FSDP wrapping |
//! | [`Framework::is_ctranslate2`] | faster-whisper, ctranslate2, whisperx | quantisation, encoder-decoder cache | CTranslate2 `src/ops/quantize.cc`; faster-whisper README |
//! | [`Framework::logits_bytes_per_token_vocab`] | torchtune 4, ms-swift 30, unsloth/liger 0, else 10 | logits | see the constants |
//! | [`Framework::checkpoints_by_default`] | torchtune | activations | torchtune single-device recipes |
//! | [`Framework::steps_optimizer_in_backward_on_one_gpu`] | torchtune | gradients | `optimizer_in_bwd: True` |
//! | [`Framework::keeps_gathered_frozen_base`] | litgpt | weights | litgpt `tutorials/resource-tables.md` |
//! | [`Framework::default_lora_dropout`], [`Framework::adapts_fused_qkv_only`] | litgpt | LoRA dropout | `litgpt/finetune/lora.py`, `litgpt/lora.py` |
//! | [`Framework::keeps_sp_inputs_gathered`] | torchtitan | activations | torchtitan `parallelize_llama.py` `apply_tp` |
//! | [`Framework::generates_with_tuple_cache`] | hf | KV cache | `QwenLM/Qwen` `README.md` |
//! | [`Framework::allocates_through_pytorch`] | all but faster-whisper, ctranslate2, whisperx and unknown names | whole GPU when the cache outgrows it | `c10/cuda/CUDACachingAllocator.cpp` `malloc` |
//! | [`Framework::runs_hf_modules`] | hf, hf-trainer, peft, trl | activations, logits, slack (`hf`) | transformers' modeling files, `ForCausalLMLoss` |

/// Logits and cross-entropy per token per vocabulary entry: bf16 logits + fp32 upcast + fp32
/// softmax/grad ≈ 10 B in the HF default path (`ForCausalLMLoss` upcasts with `logits.float()`:
/// huggingface/transformers#38452, #30860).
pub const LOGITS_HF: f64 = 10.0;
/// Chunked cross-entropy (torchtune's `CEWithChunkedOutputLoss`) keeps 16-bit logits plus one
/// fp32 chunk: 2-4 B.
pub const LOGITS_CHUNKED: f64 = 4.0;
/// ms-swift's 2023 trainer: ~3x the HF path. Inferred, not read in its source: the trainer
/// passes labels (the model computes its loss) and computes its own loss and token accuracy
/// from the same logits, so the logits graph is held about three times over. Back-solved from
/// ms-swift's published batch slope (+15.4 GiB per 2048-token Qwen-7B-chat sample with
/// checkpointing on, where layers account for < 1 GiB: `modelscope/ms-swift`
/// `docs/source_en/LLM/Benchmark.md`): a calibration on that source.
pub const LOGITS_MS_SWIFT: f64 = 30.0;
/// litgpt's LoRA dropout when a pod does not state one: `lora_dropout: float = 0.05` in
/// `litgpt/finetune/lora.py` (with LoRA on the query and value of the fused QKV projection only).
pub const LITGPT_LORA_DROPOUT: f64 = 0.05;

/// A framework the model knows by name. Each variant is one framework whatever it is called
/// (aliases are read in [`Framework::from_name`] only); a name the model does not know is kept
/// as [`Framework::Other`] and follows no rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Framework {
    /// Hugging Face Transformers' own loops: `generate`, a hand-written training loop.
    Hf,
    /// The Transformers `Trainer`.
    HfTrainer,
    /// PEFT's own examples and scripts.
    Peft,
    /// TRL's trainers (`SFTTrainer`).
    Trl,
    Axolotl,
    /// `ModelScope`'s ms-swift, also named by its package and CLI, `swift`.
    MsSwift,
    Torchtune,
    Torchtitan,
    Litgpt,
    Unsloth,
    /// Liger Kernel's fused Triton kernels.
    Liger,
    /// faster-whisper, on CTranslate2.
    FasterWhisper,
    /// CTranslate2 itself.
    Ctranslate2,
    /// `WhisperX`, faster-whisper's batched pipeline with alignment on top.
    Whisperx,
    /// A framework the model has no rule for, kept by its (lowercased) name for display.
    Other(String),
}

impl Framework {
    /// The framework a lowercased `peakfit.io/engine` value names: the one place a framework is
    /// matched by string, aliases included.
    pub fn from_name(name: &str) -> Self {
        match name {
            "hf" | "transformers" => Self::Hf,
            "hf-trainer" => Self::HfTrainer,
            "peft" => Self::Peft,
            "trl" => Self::Trl,
            "axolotl" => Self::Axolotl,
            "ms-swift" | "swift" => Self::MsSwift,
            "torchtune" => Self::Torchtune,
            "torchtitan" => Self::Torchtitan,
            "litgpt" => Self::Litgpt,
            "unsloth" => Self::Unsloth,
            "liger" => Self::Liger,
            "faster-whisper" => Self::FasterWhisper,
            "ctranslate2" => Self::Ctranslate2,
            "whisperx" => Self::Whisperx,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The framework's name as a pod spells it (an alias reads as its canonical name).
    pub fn name(&self) -> &str {
        match self {
            Self::Hf => "hf",
            Self::HfTrainer => "hf-trainer",
            Self::Peft => "peft",
            Self::Trl => "trl",
            Self::Axolotl => "axolotl",
            Self::MsSwift => "ms-swift",
            Self::Torchtune => "torchtune",
            Self::Torchtitan => "torchtitan",
            Self::Litgpt => "litgpt",
            Self::Unsloth => "unsloth",
            Self::Liger => "liger",
            Self::FasterWhisper => "faster-whisper",
            Self::Ctranslate2 => "ctranslate2",
            Self::Whisperx => "whisperx",
            Self::Other(name) => name,
        }
    }

    /// What this framework changes: the one exhaustive `match` every rule below reads, so that
    /// a new framework has to say what it changes (or that it changes nothing) in one place.
    fn rules(&self) -> Rules {
        match self {
            Self::Hf => Rules {
                peft_kbit_preparation: true,
                generates_with_tuple_cache: true,
                runs_hf_modules: true,
                ..Rules::NONE
            },
            Self::HfTrainer | Self::Peft => Rules {
                peft_kbit_preparation: true,
                runs_hf_modules: true,
                ..Rules::NONE
            },
            Self::Axolotl => Rules {
                peft_kbit_preparation: true,
                ..Rules::NONE
            },
            Self::Trl => Rules {
                peft_kbit_preparation: true,
                skips_kbit_preparation_when_sharded: true,
                runs_hf_modules: true,
                ..Rules::NONE
            },
            Self::MsSwift => Rules {
                peft_kbit_preparation: true,
                logits_bytes_per_token_vocab: LOGITS_MS_SWIFT,
                ..Rules::NONE
            },
            Self::Torchtune => Rules {
                shards_with_fsdp: true,
                logits_bytes_per_token_vocab: LOGITS_CHUNKED,
                checkpoints_by_default: true,
                steps_optimizer_in_backward_on_one_gpu: true,
                ..Rules::NONE
            },
            Self::Torchtitan => Rules {
                shards_with_fsdp: true,
                keeps_sp_inputs_gathered: true,
                ..Rules::NONE
            },
            Self::Litgpt => Rules {
                shards_with_fsdp: true,
                keeps_gathered_frozen_base: true,
                default_lora_dropout: LITGPT_LORA_DROPOUT,
                adapts_fused_qkv_only: true,
                ..Rules::NONE
            },
            // Fused linear cross-entropy never materialises the logits.
            Self::Unsloth | Self::Liger => Rules {
                logits_bytes_per_token_vocab: 0.0,
                ..Rules::NONE
            },
            Self::FasterWhisper | Self::Ctranslate2 | Self::Whisperx => Rules {
                ctranslate2: true,
                ..Rules::NONE
            },
            Self::Other(_) => Rules::NONE,
        }
    }

    /// Whether its QLoRA path runs peft's `prepare_model_for_kbit_training`, which casts every
    /// non-quantised parameter (embeddings, head, norms) of a bitsandbytes model to fp32: the
    /// Transformers and PEFT scripts, and the trainers built on PEFT (TRL, axolotl, ms-swift).
    /// torchtune, litgpt and unsloth quantise and wrap the model their own way.
    pub fn runs_peft_kbit_preparation(&self) -> bool {
        self.rules().peft_kbit_preparation
    }

    /// Whether it skips the kbit preparation for sharded QLoRA: TRL's `SFTTrainer` ("one should
    /// never call `peft_module_casting_to_bf16` or `prepare_model_for_kbit_training` when doing
    /// QLoRA + FSDP / DS-Zero3": `is_sharded_qlora` in `trl/trainer/sft_trainer.py`).
    pub fn skips_kbit_preparation_when_sharded(&self) -> bool {
        self.rules().skips_kbit_preparation_when_sharded
    }

    /// Whether its sharding is PyTorch FSDP with its own wrapping even when a pod names it as
    /// ZeRO stage 3 (torchtitan, torchtune and litgpt apply FSDP themselves): no DeepSpeed
    /// buffers, and not accelerate's transformer-layer wrap whose root unit holds the
    /// embeddings.
    pub fn shards_with_fsdp(&self) -> bool {
        self.rules().shards_with_fsdp
    }

    /// Whether it runs on CTranslate2: its own int8 weights (one float scale per row, `Quantize`
    /// in `src/ops/quantize.cc`, no bitsandbytes) and one cross-attention cache per input.
    pub fn is_ctranslate2(&self) -> bool {
        self.rules().ctranslate2
    }

    /// Whether its tensors come from PyTorch's caching allocator, which frees its cache and
    /// retries a failed `cudaMalloc` before raising out-of-memory, so the pod runs on a GPU its
    /// cached peak outgrows ([`crate::placement::Demand::fills_gpu`]). Every PyTorch framework
    /// the model knows; not CTranslate2 (its own allocator), and not a name it does not know.
    pub fn allocates_through_pytorch(&self) -> bool {
        !matches!(self, Self::Other(_)) && !self.is_ctranslate2()
    }

    /// Training logits and loss per token per vocabulary entry: torchtune's chunked
    /// cross-entropy ([`LOGITS_CHUNKED`]), ms-swift's trainer ([`LOGITS_MS_SWIFT`]), none for the
    /// fused linear cross-entropy of unsloth and Liger (the logits are never materialised), the
    /// HF loss ([`LOGITS_HF`]) otherwise.
    pub fn logits_bytes_per_token_vocab(&self) -> f64 {
        self.rules().logits_bytes_per_token_vocab
    }

    /// Whether its recipes recompute activations unless told otherwise: torchtune's
    /// single-device recipes set `enable_activation_checkpointing: True`.
    pub fn checkpoints_by_default(&self) -> bool {
        self.rules().checkpoints_by_default
    }

    /// Whether its one-GPU full fine-tune steps the optimizer inside backward, so that at most
    /// the largest parameter's gradient exists: torchtune's `optimizer_in_bwd: True` in its
    /// `*_full_single_device.yaml` configs.
    pub fn steps_optimizer_in_backward_on_one_gpu(&self) -> bool {
        self.rules().steps_optimizer_in_backward_on_one_gpu
    }

    /// Whether its FSDP LoRA keeps the gathered frozen base next to its shard: litgpt's 2-GPU
    /// run measured 20.7 GiB per GPU against 19.8 on one (`Lightning-AI/litgpt`
    /// `tutorials/resource-tables.md`; Lightning's FSDP strategy does not reshard frozen
    /// parameters after forward).
    pub fn keeps_gathered_frozen_base(&self) -> bool {
        self.rules().keeps_gathered_frozen_base
    }

    /// LoRA dropout when a pod states none: litgpt's [`LITGPT_LORA_DROPOUT`], PEFT's 0 (an
    /// `nn.Identity`, no copies) elsewhere.
    pub fn default_lora_dropout(&self) -> f64 {
        self.rules().default_lora_dropout
    }

    /// Whether its default LoRA adapts only the fused QKV projection, whose one dropout sees the
    /// block input (litgpt `LoRAQKVLinear.forward`, `litgpt/lora.py`), rather than every linear.
    pub fn adapts_fused_qkv_only(&self) -> bool {
        self.rules().adapts_fused_qkv_only
    }

    /// Whether its sequence parallelism is `DTensor`'s, which all-gathers the attention and MLP
    /// inputs to `Replicate()` and saves them whole (torchtitan `parallelize_llama.py`
    /// `apply_tp`), where Megatron-LM saves the sequence-sharded input.
    pub fn keeps_sp_inputs_gathered(&self) -> bool {
        self.rules().keeps_sp_inputs_gathered
    }

    /// Whether its inference is HF `generate`, whose legacy tuple cache holds two copies of
    /// the KV cache while it grows (see `Inputs::kv_cache`).
    pub fn generates_with_tuple_cache(&self) -> bool {
        self.rules().generates_with_tuple_cache
    }

    /// Whether it runs transformers' own modeling code and loss as they are (`generate`, the
    /// `Trainer`, PEFT's and TRL's trainers on top of it), so that `hf` counts its activations.
    /// axolotl is left out: it patches attention and the loss (sample packing, Liger, cut
    /// cross-entropy) by configuration.
    pub fn runs_hf_modules(&self) -> bool {
        self.rules().runs_hf_modules
    }
}

/// One framework's answers to the rules, each read through the [`Framework`] method of the
/// same name (where its source is cited).
#[expect(
    clippy::struct_excessive_bools,
    reason = "one independent rule per field, each a framework behaviour, not a state machine"
)]
struct Rules {
    peft_kbit_preparation: bool,
    skips_kbit_preparation_when_sharded: bool,
    shards_with_fsdp: bool,
    ctranslate2: bool,
    logits_bytes_per_token_vocab: f64,
    checkpoints_by_default: bool,
    steps_optimizer_in_backward_on_one_gpu: bool,
    keeps_gathered_frozen_base: bool,
    default_lora_dropout: f64,
    adapts_fused_qkv_only: bool,
    keeps_sp_inputs_gathered: bool,
    generates_with_tuple_cache: bool,
    runs_hf_modules: bool,
}

impl Rules {
    /// A framework that changes nothing: the HF loss, PEFT's dropout default, DeepSpeed or
    /// accelerate-style sharding.
    const NONE: Self = Self {
        peft_kbit_preparation: false,
        skips_kbit_preparation_when_sharded: false,
        shards_with_fsdp: false,
        ctranslate2: false,
        logits_bytes_per_token_vocab: LOGITS_HF,
        checkpoints_by_default: false,
        steps_optimizer_in_backward_on_one_gpu: false,
        keeps_gathered_frozen_base: false,
        default_lora_dropout: 0.0,
        adapts_fused_qkv_only: false,
        keeps_sp_inputs_gathered: false,
        generates_with_tuple_cache: false,
        runs_hf_modules: false,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name (aliases included) the model knows, with the framework it must parse to.
    const NAMES: &[(&str, Framework)] = &[
        ("hf", Framework::Hf),
        ("transformers", Framework::Hf),
        ("hf-trainer", Framework::HfTrainer),
        ("peft", Framework::Peft),
        ("trl", Framework::Trl),
        ("axolotl", Framework::Axolotl),
        ("ms-swift", Framework::MsSwift),
        ("swift", Framework::MsSwift),
        ("torchtune", Framework::Torchtune),
        ("torchtitan", Framework::Torchtitan),
        ("litgpt", Framework::Litgpt),
        ("unsloth", Framework::Unsloth),
        ("liger", Framework::Liger),
        ("faster-whisper", Framework::FasterWhisper),
        ("ctranslate2", Framework::Ctranslate2),
        ("whisperx", Framework::Whisperx),
    ];

    /// The names, aliases included, for which `rule` holds: a rule test lists the names it
    /// must hold for, so dropping an alias (or a framework) from the parser fails it.
    fn names_where(rule: impl Fn(&Framework) -> bool) -> Vec<&'static str> {
        let mut names: Vec<&str> = NAMES
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| rule(&Framework::from_name(name)))
            .collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn every_name_parses_to_its_framework_and_unknown_names_are_kept() {
        for (name, framework) in NAMES {
            assert_eq!(&Framework::from_name(name), framework, "{name}");
            // The canonical name reads back as the same framework.
            assert_eq!(&Framework::from_name(framework.name()), framework);
        }
        assert_eq!(Framework::from_name("swift").name(), "ms-swift");
        let other = Framework::from_name("megatron");
        assert_eq!(other, Framework::Other("megatron".into()));
        assert_eq!(other.name(), "megatron");
    }

    #[test]
    fn unknown_frameworks_follow_no_rule() {
        let other = Framework::from_name("megatron");
        assert!(!other.runs_peft_kbit_preparation());
        assert!(!other.skips_kbit_preparation_when_sharded());
        assert!(!other.shards_with_fsdp());
        assert!(!other.is_ctranslate2());
        assert_eq!(other.logits_bytes_per_token_vocab(), LOGITS_HF);
        assert!(!other.checkpoints_by_default());
        assert!(!other.steps_optimizer_in_backward_on_one_gpu());
        assert!(!other.keeps_gathered_frozen_base());
        assert_eq!(other.default_lora_dropout(), 0.0);
        assert!(!other.adapts_fused_qkv_only());
        assert!(!other.keeps_sp_inputs_gathered());
        assert!(!other.generates_with_tuple_cache());
        assert!(!other.runs_hf_modules());
    }

    #[test]
    fn peft_kbit_preparation_runs_in_the_peft_based_trainers() {
        assert_eq!(
            names_where(Framework::runs_peft_kbit_preparation),
            [
                "axolotl",
                "hf",
                "hf-trainer",
                "ms-swift",
                "peft",
                "swift",
                "transformers",
                "trl"
            ]
        );
    }

    #[test]
    fn only_trl_skips_kbit_preparation_when_sharded() {
        assert_eq!(
            names_where(Framework::skips_kbit_preparation_when_sharded),
            ["trl"]
        );
    }

    #[test]
    fn fsdp_engines_are_torchtitan_torchtune_and_litgpt() {
        assert_eq!(
            names_where(Framework::shards_with_fsdp),
            ["litgpt", "torchtitan", "torchtune"]
        );
    }

    #[test]
    fn ctranslate2_engines() {
        assert_eq!(
            names_where(Framework::is_ctranslate2),
            ["ctranslate2", "faster-whisper", "whisperx"]
        );
    }

    #[test]
    fn logits_bytes_by_framework() {
        let per = |bytes: f64| names_where(|f| f.logits_bytes_per_token_vocab() == bytes);
        assert_eq!(per(LOGITS_CHUNKED), ["torchtune"]);
        assert_eq!(per(LOGITS_MS_SWIFT), ["ms-swift", "swift"]);
        assert_eq!(per(0.0), ["liger", "unsloth"]);
        assert_eq!(per(LOGITS_HF).len(), NAMES.len() - 5);
    }

    #[test]
    fn torchtune_checkpoints_by_default_and_steps_in_backward() {
        assert_eq!(
            names_where(Framework::checkpoints_by_default),
            ["torchtune"]
        );
        assert_eq!(
            names_where(Framework::steps_optimizer_in_backward_on_one_gpu),
            ["torchtune"]
        );
    }

    #[test]
    fn litgpt_rules() {
        assert_eq!(
            names_where(Framework::keeps_gathered_frozen_base),
            ["litgpt"]
        );
        assert_eq!(names_where(Framework::adapts_fused_qkv_only), ["litgpt"]);
        assert_eq!(
            names_where(|f| f.default_lora_dropout() == LITGPT_LORA_DROPOUT),
            ["litgpt"]
        );
        assert_eq!(
            names_where(|f| f.default_lora_dropout() == 0.0).len(),
            NAMES.len() - 1
        );
    }

    #[test]
    fn only_torchtitan_keeps_sequence_parallel_inputs_gathered() {
        assert_eq!(
            names_where(Framework::keeps_sp_inputs_gathered),
            ["torchtitan"]
        );
    }

    #[test]
    fn only_hf_generates_with_a_tuple_cache() {
        assert_eq!(
            names_where(Framework::generates_with_tuple_cache),
            ["hf", "transformers"]
        );
    }

    #[test]
    fn transformers_modules_run_in_its_own_loops_and_trainers() {
        assert_eq!(
            names_where(Framework::runs_hf_modules),
            ["hf", "hf-trainer", "peft", "transformers", "trl"]
        );
    }
}
