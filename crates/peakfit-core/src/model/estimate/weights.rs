//! The model's own parameters on the GPU: the weights (whole, sharded, quantised or offloaded),
//! what quantisation adds at run time, the tensors ZeRO-3 / FSDP gather for compute, and the
//! embedding upcast peft's kbit preparation makes.
//!
//! | term | formula | source |
//! |---|---|---|
//! | weights | `W/(t·p)`, `/N` more under ZeRO-3 / FSDP full-shard, frozen LoRA/QLoRA bases included; 0 with `offload: params`, `optimizer+params`, `sequential`; an fp32-loaded LoRA base under `fp16-amp` stays fp32 (FSDP, autocast) but is 16-bit under DeepSpeed | ZeRO paper §5 (Rajbhandari et al. 2019); FSDP `ShardingStrategy`; Megatron-LM places `1/p` of the layers per stage plus one embedding matrix; DeepSpeed `_configure_distributed_model` (`module.half()` / `module.bfloat16()`) |
//! | bitsandbytes quant state | nf4 / nf4-dq under ZeRO-3 / FSDP full-shard or parameter offload: the absmax blocks (`weight bits - 4` per linear weight) whole on every GPU, not sharded or offloaded | AnswerDotAI/fsdp_qlora#4 (state not synced: not a parameter or buffer); bitsandbytes `fix_4bit_weight_quant_state_from_module` |
//! | fp32 upcast | peft's `prepare_model_for_kbit_training` casts the 16-bit embeddings/head of a bnb model to fp32 (`2·V·h` more), skipped by TRL for sharded QLoRA | peft `prepare_model_for_kbit_training`; TRL `sft_trainer.py` `is_sharded_qlora` |
//! | quantisation | bitsandbytes (int8, nf4): `BNB_STAGING` + two 16-bit copies of the largest linear being dequantised; none for CTranslate2's own int8 (faster-whisper) | litgpt `tutorials/resource-tables.md`; CTranslate2 `src/ops/quantize.cc` (per-row int8 scales) |
//! | gathered parameters | ZeRO-3/FSDP training: `4·largest layer` (DeepSpeed `largest_layer_memory`); frozen or offloaded: two blocks (running + prefetch) at compute width; DeepSpeed param offload: `max(2 blocks, min(1e9, W))` | DeepSpeed `estimate_zero3_model_states_mem_needs`, `stage3_max_live_parameters` default 1e9 |
//! | FSDP root unit | FSDP full-/hybrid-shard with accelerate's transformer-layer wrap: embedding + head gathered at compute width (`/t`) from forward through backward, offloaded or not | FSDP1 `_post_forward_reshard` (root not resharded), FSDP2 `fully_shard` `reshard_after_forward` docs |

use super::Inputs;
use super::framework::Framework;
use crate::model::annotations::{Dtype, Offload, Workload};
use crate::model::quantity::GIB;

/// bitsandbytes quantise-on-load staging: the fixed ~0.6 GB litgpt's NF4 runs show over the
/// bits x params arithmetic (Llama-2-7B nf4 4.57 GB measured against 3.98 computed:
/// `Lightning-AI/litgpt` `tutorials/resource-tables.md`).
pub const BNB_STAGING: f64 = 0.35 * GIB;

/// DeepSpeed's `stage3_max_live_parameters` default: gathered parameters kept resident.
const DS_MAX_LIVE_PARAMETERS: f64 = 1e9;

impl Inputs {
    /// The largest single parameter tensor: the embedding (or head) or an MLP projection.
    pub(super) fn largest_parameter(&self) -> f64 {
        let a = &self.arch;
        let h = f64::from(a.hidden_size);
        (f64::from(a.vocab_size) * h).max(h * f64::from(a.intermediate_size)) / self.tp
    }

    /// Embedding + LM-head parameters (one matrix when tied).
    pub(super) fn embedding_params(&self) -> f64 {
        let one = f64::from(self.arch.vocab_size) * f64::from(self.arch.hidden_size);
        let both = if self.arch.tied_embeddings {
            one
        } else {
            2.0 * one
        };
        both.min(self.params * 0.5)
    }

    /// Bits per linear-layer weight, scales included: NF4 with double quantisation 4.127 and
    /// plain NF4 4.5 (QLoRA, Dettmers et al. 2023, arXiv:2305.14314); GPTQ/AWQ int4 with
    /// 128-wide groups 4 + (16 + 4)/128 (an fp16 scale and a 4-bit zero per group).
    pub(super) fn weight_bits(&self) -> f64 {
        match self.dtype {
            Dtype::Fp32 => 32.0,
            // Autocast / FSDP mixed precision over an fp32-loaded base: LoRA's frozen weights
            // stay fp32 in storage and are cast to 16 bits as each layer runs (PEFT's
            // examples/sft/train.py loads `torch_dtype=float32` without quantisation).
            // DeepSpeed instead casts the whole module to 16 bits when fp16 or bf16 is enabled
            // (`module.half()` / `module.bfloat16()` in `DeepSpeedEngine._configure_distributed_model`,
            // `deepspeed/runtime/engine.py`), frozen base included; fp32 master copies exist only
            // for what trains.
            Dtype::Fp16Amp if self.workload.is_adapter() && !self.deepspeed() => 32.0,
            // torch autocast over fp32 weights (the HF Trainer's `--bf16`/`--fp16` on a model
            // loaded in fp32): the weights stay fp32 and are themselves the master copy.
            Dtype::Fp16Amp if self.hf_modules() => 32.0,
            Dtype::Fp16 | Dtype::Bf16 | Dtype::Fp16Amp => 16.0,
            // e4m3 with per-tensor or 128x128 block scales: scales negligible.
            Dtype::Fp8 => 8.0,
            // int8 with a 16-bit scale and 8-bit zero per 128 weights (GPTQ-int8 g128).
            Dtype::Int8 => 8.0 + 24.0 / 128.0,
            // int4 g128: 16-bit scale + 4-bit zero per group.
            Dtype::Int4Gptq | Dtype::Int4Awq => 4.0 + 20.0 / 128.0,
            // NF4 block 64 with an fp32 absmax per block (QLoRA paper).
            Dtype::Nf4 => 4.5,
            // + double quantisation of the absmax: 8/64 + 32/(64*256).
            Dtype::Nf4Dq => 4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0),
        }
    }

    /// Quantised loaders keep embeddings and head in 16 bits (StarCoder's GPTQ-4bit checkpoint is
    /// 30 % of bf16, not 26 %: `mayank-mishra/starcoder-GPTQ-8bit-128g`'s model card); fp32 models
    /// keep them fp32.
    pub(super) fn embedding_bytes(&self) -> f64 {
        self.weight_bits().clamp(16.0, 32.0) / 8.0
    }

    /// Shards of the frozen or compute copy of the weights: tensor parallel, and the data
    /// parallel ranks under ZeRO-3 / FSDP full-shard.
    pub(super) fn weight_shards(&self) -> f64 {
        self.tp * if self.zero3() { self.shards() } else { 1.0 }
    }

    pub(super) fn weights(&self) -> f64 {
        // Weights in CPU memory (ZeRO-Infinity / FSDP param offload, layer streaming) are
        // only on the GPU a block at a time: see `live_params`.
        if self.offload.params() || self.offload == Offload::Sequential {
            return 0.0;
        }
        let whole = self.replicated_quant_state();
        let sharded = (self.weight_bytes() - whole).max(0.0) / self.weight_shards();
        // litgpt's FSDP LoRA keeps the gathered frozen base next to its shard: its 2-GPU run
        // measured 20.7 GiB per GPU against 19.8 on one GPU (`Lightning-AI/litgpt`
        // `tutorials/resource-tables.md`; Lightning's FSDP
        // strategy there does not reshard frozen parameters after forward). A framework
        // behaviour, so kept to that framework.
        if self.workload.is_adapter()
            && self.zero3()
            && self.framework_is(Framework::keeps_gathered_frozen_base)
        {
            sharded + self.weight_bytes() / self.tp
        } else {
            sharded
        }
    }

    /// bitsandbytes' 4-bit quantisation state (each 64-weight block's absmax, double-quantised
    /// or not, with its code tables) of one tensor-parallel rank's linear weights, when ZeRO-3 /
    /// FSDP shard the weights or offload them: then it is held whole on every GPU. The state is
    /// an attribute of `Params4bit` / `Linear4bit`, not a parameter or buffer, so neither
    /// framework partitions or offloads it: FSDP's `sync_module_states` "only supports syncing
    /// parameters and buffers" and the state stays "attached to all rank's `Linear4bit` layers"
    /// (`AnswerDotAI/fsdp_qlora#4`), bitsandbytes recovers it from the module after FSDP converts
    /// the parameter (`fix_4bit_weight_quant_state_from_module`, `bitsandbytes/nn/modules.py`),
    /// and `Params4bit.to` moves it with the module to the GPU. Its size is what
    /// [`Inputs::weight_bits`] adds over the 4-bit codes.
    pub(super) fn replicated_quant_state(&self) -> f64 {
        let sharded_or_offloaded =
            self.zero3() || (self.workload.is_training() && self.offload.params());
        if !(sharded_or_offloaded && matches!(self.dtype, Dtype::Nf4 | Dtype::Nf4Dq)) {
            return 0.0;
        }
        let linear = (self.params - self.embedding_params()).max(0.0) * self.stage_share();
        linear * (self.weight_bits() - 4.0) / 8.0
    }

    /// All the weights of one tensor-parallel rank, unsharded.
    /// One pipeline stage's weights: `1/pp` of the blocks plus, on the first or last stage,
    /// one embedding matrix (Megatron-LM places the embedding on the first stage and the head
    /// on the last).
    pub(super) fn weight_bytes(&self) -> f64 {
        let mut emb = self.embedding_params();
        if self.pp > 1.0 {
            emb = emb.min(f64::from(self.arch.vocab_size) * f64::from(self.arch.hidden_size));
        }
        let linear = (self.params - self.embedding_params()).max(0.0) * self.stage_share();
        let mut bytes = linear * self.weight_bits() / 8.0 + emb * self.embedding_bytes();
        // The FP8 loader un-ties a tied LM head: Qwen3-4B FP8 measured one embedding copy over
        // (742 MiB over weights + KV: `QwenLM/Qwen2.5`
        // `docs/source/getting_started/speed_benchmark.md`).
        if self.dtype == Dtype::Fp8 && self.arch.tied_embeddings {
            bytes += f64::from(self.arch.vocab_size) * f64::from(self.arch.hidden_size) * 2.0;
        }
        bytes
    }

    /// bitsandbytes runtime: staging plus two bf16 copies of the largest linear being
    /// dequantised for its matmul (fits litgpt's NF4 rows in `tutorials/resource-tables.md`, which
    /// grow with h x ffn).
    pub(super) fn quantisation_overhead(&self) -> f64 {
        // CTranslate2 quantises int8 weights itself, one float scale per row (`Quantize`,
        // `src/ops/quantize.cc`), and runs int8 GEMMs on them: no bitsandbytes, so no staging
        // and no dequantised copies.
        if !self.dtype.is_bitsandbytes() || self.framework_is(Framework::is_ctranslate2) {
            return 0.0;
        }
        let largest = f64::from(self.arch.hidden_size) * f64::from(self.arch.intermediate_size);
        BNB_STAGING + 2.0 * largest * 2.0 / self.tp
    }

    /// peft's kbit preparation upcasts the 16-bit embeddings/head of bnb models to fp32. TRL's
    /// `SFTTrainer` skips it for sharded QLoRA ("one should never call
    /// `peft_module_casting_to_bf16` or `prepare_model_for_kbit_training` when doing QLoRA + FSDP /
    /// DS-Zero3": `is_sharded_qlora` in `trl/trainer/sft_trainer.py`), so under ZeRO-3 / FSDP
    /// full-shard the embeddings stay in their 16-bit storage.
    pub(super) fn kbit_upcast(&self) -> f64 {
        let trl_sharded =
            self.framework_is(Framework::skips_kbit_preparation_when_sharded) && self.zero3();
        let applies = self.workload == Workload::Qlora
            && self.dtype.is_bitsandbytes()
            && self.framework_is(Framework::runs_peft_kbit_preparation)
            && !trl_sharded;
        if applies {
            self.embedding_params() * 2.0 / self.tp
        } else {
            0.0
        }
    }

    /// ZeRO-3 gathers a layer at a time: DeepSpeed's `largest_layer_memory = 4·largest_layer`
    /// (`estimate_zero3_model_states_mem_needs`, `deepspeed/runtime/zero/stage3.py`), the largest
    /// layer being a transformer block or the embedding.
    /// For adapters and for offloaded weights the gathered block is frozen: two of them (the
    /// one running and FSDP's prefetch) at the weights' own width.
    pub(super) fn zero3_live_params(&self) -> f64 {
        let offloaded = self.offload.params() || self.offload == Offload::Sequential;
        if !(self.zero3() || offloaded) {
            return 0.0;
        }
        let layers = f64::from(self.arch.layers.max(1));
        let block = (self.params - self.embedding_params()).max(0.0) / layers;
        let emb = f64::from(self.arch.vocab_size) * f64::from(self.arch.hidden_size);
        if self.workload == Workload::Training && !offloaded {
            4.0 * block.max(emb) / self.tp
        } else if offloaded && !self.fsdp {
            // DeepSpeed keeps up to `stage3_max_live_parameters` (default 1e9) gathered
            // parameters resident before releasing any (DeepSpeed ZeRO-3 config reference),
            // and never less than the two largest modules it fetches.
            let live = DS_MAX_LIVE_PARAMETERS
                .min(self.params / self.tp)
                .max(2.0 * block.max(emb) / self.tp);
            live * self.weight_bits().max(16.0) / 8.0
        } else {
            // Gathered at the compute width: 16-bit under mixed precision.
            let bits = if self.dtype == Dtype::Fp16Amp {
                16.0
            } else {
                self.weight_bits().max(16.0)
            };
            2.0 * block.max(emb) * bits / 8.0 / self.tp
        }
    }

    /// FSDP does not reshard the root unit after forward, as its parameters are needed again at
    /// once in backward: FSDP1 `_post_forward_reshard` frees only non-root handles
    /// (`torch/distributed/fsdp/_runtime_utils.py`), FSDP2 `fully_shard` documents that "the root
    /// FSDP state has its value specially set to False" for `reshard_after_forward`. With
    /// accelerate's transformer-layer auto-wrap (the decoder blocks are the units) the root holds
    /// the embedding and head, so they stay gathered at the compute width from forward through
    /// backward, with CPU offload too (offloading moves only the shard). torchtitan, torchtune
    /// and litgpt wrap differently and are left to their own terms.
    pub(super) fn fsdp_root_params(&self) -> f64 {
        if !(self.fsdp && self.zero3()) || self.framework_is(Framework::shards_with_fsdp) {
            return 0.0;
        }
        let bytes = if self.dtype == Dtype::Fp32 { 4.0 } else { 2.0 };
        self.embedding_params() * bytes / self.tp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::estimate::testing::{est, est_with, llama70b, part};

    #[test]
    fn bf16_weights_are_two_bytes_per_param() {
        let e = est(&[("model", "llama-2-7b")]);
        assert_eq!(part(&e, "weights"), 6.74e9 * 2.0);
    }

    #[test]
    fn quantisation_shrinks_weights_in_order() {
        let w = |d| part(&est(&[("model", "llama-2-7b"), ("dtype", d)]), "weights");
        let order = ["fp32", "bf16", "int8", "fp8", "int4-gptq", "nf4", "nf4-dq"];
        let sizes: Vec<f64> = order.iter().map(|d| w(d)).collect();
        assert!(sizes[0] == 2.0 * sizes[1]);
        assert!(sizes[2] > sizes[3], "int8 carries scales over fp8");
        assert!(
            sizes[3] > sizes[5] && sizes[5] > sizes[4] && sizes[4] > sizes[6],
            "{sizes:?}"
        );
        // Embeddings stay 16-bit: int4 weights are well above a quarter of bf16.
        assert!(sizes[4] > 0.27 * sizes[1] && sizes[4] < 0.33 * sizes[1]);
        // bitsandbytes pays a runtime overhead, GPTQ does not.
        let q = |d| {
            part(
                &est(&[("model", "llama-2-7b"), ("dtype", d)]),
                "quantisation",
            )
        };
        assert!(q("nf4") > 0.3 * GIB && q("int4-gptq") == 0.0);
    }

    #[test]
    fn deepspeed_casts_a_frozen_fp32_base_to_16_bits_fsdp_keeps_it_fp32() {
        let run = |zero: &'static str| {
            est(&[
                ("model", "llama-2-70b"),
                ("workload", "lora"),
                ("dtype", "fp16-amp"),
                ("data-parallel", "8"),
                ("zero-stage", zero),
            ])
        };
        let (emb, linear) = llama70b();
        let all = emb + linear;
        // DeepSpeed (a numeric stage): `module.bfloat16()`, 2 B, sharded over 8.
        assert_eq!(part(&run("3"), "weights"), (all * 2.0 / 8.0).ceil());
        // FSDP mixed precision keeps the fp32-loaded storage, 4 B.
        assert_eq!(
            part(&run("full-shard"), "weights"),
            (all * 4.0 / 8.0).ceil()
        );
    }

    #[test]
    fn bitsandbytes_quant_state_stays_whole_when_weights_are_sharded_or_offloaded() {
        let with = |extra: &[(&'static str, &'static str)]| {
            est_with(
                &[
                    ("model", "llama-2-70b"),
                    ("workload", "qlora"),
                    ("dtype", "nf4-dq"),
                    ("engine", "peft"),
                ],
                extra,
            )
        };
        let (emb, linear) = llama70b();
        // nf4-dq: an 8-bit absmax per 64 weights, an fp32 one per 256 of those.
        let state = linear * (8.0 / 64.0 + 32.0 / (64.0 * 256.0)) / 8.0;
        let codes = linear * 4.0 / 8.0 + emb * 2.0;
        let sharded = with(&[("data-parallel", "2"), ("zero-stage", "full-shard")]);
        assert_eq!(part(&sharded, "quant-state"), state.ceil());
        assert_eq!(part(&sharded, "weights"), (codes / 2.0).ceil());
        let deepspeed = with(&[("data-parallel", "2"), ("zero-stage", "3")]);
        assert_eq!(part(&deepspeed, "quant-state"), state.ceil());
        let offloaded = with(&[
            ("data-parallel", "2"),
            ("zero-stage", "full-shard"),
            ("offload", "optimizer+params"),
        ]);
        assert_eq!(part(&offloaded, "quant-state"), state.ceil());
        assert_eq!(part(&offloaded, "weights"), 0.0);
        // On one GPU the state is part of the whole weights.
        let single = with(&[]);
        assert_eq!(part(&single, "quant-state"), 0.0);
        assert_eq!(part(&single, "weights"), (codes + state).ceil());
    }

    #[test]
    fn trl_skips_the_fp32_upcast_for_sharded_qlora_only() {
        let run = |engine: &'static str, extra: &[(&'static str, &'static str)]| {
            let mut v = vec![
                ("model", "llama-2-70b"),
                ("workload", "qlora"),
                ("dtype", "nf4-dq"),
                ("engine", engine),
            ];
            v.extend_from_slice(extra);
            part(&est(&v), "fp32-upcast")
        };
        let (emb, _) = llama70b();
        let sharded = [("data-parallel", "2"), ("zero-stage", "full-shard")];
        assert_eq!(run("trl", &[]), emb * 2.0);
        assert_eq!(run("trl", &sharded), 0.0);
        assert_eq!(
            run("trl", &[("data-parallel", "2"), ("zero-stage", "3")]),
            0.0
        );
        // ZeRO-2 leaves the parameters whole on every GPU: TRL prepares them.
        assert_eq!(
            run("trl", &[("data-parallel", "2"), ("zero-stage", "2")]),
            emb * 2.0
        );
        // Other peft-based trainers prepare the model whatever the sharding.
        assert_eq!(run("peft", &sharded), emb * 2.0);
    }

    #[test]
    fn fsdp_keeps_its_root_unit_gathered_deepspeed_and_torchtitan_do_not() {
        let with = |extra: &[(&'static str, &'static str)]| {
            est_with(
                &[
                    ("model", "llama-2-70b"),
                    ("workload", "qlora"),
                    ("dtype", "nf4-dq"),
                    ("data-parallel", "2"),
                ],
                extra,
            )
        };
        // Embedding + untied head (2 x 32000 x 8192) at bf16, unsharded, offloaded or not.
        let root = 2.0 * 32_000.0 * 8192.0 * 2.0;
        let fsdp = with(&[("zero-stage", "full-shard")]);
        assert_eq!(part(&fsdp, "fsdp-root-params"), root);
        let offloaded = with(&[
            ("zero-stage", "full-shard"),
            ("offload", "optimizer+params"),
        ]);
        assert_eq!(part(&offloaded, "fsdp-root-params"), root);
        assert_eq!(part(&offloaded, "weights"), 0.0);
        for other in [
            with(&[("zero-stage", "3")]),
            with(&[("zero-stage", "shard-grad-op")]),
            with(&[("zero-stage", "full-shard"), ("engine", "torchtitan")]),
        ] {
            assert_eq!(part(&other, "fsdp-root-params"), 0.0);
        }
    }

    #[test]
    fn ctranslate2_int8_carries_no_bitsandbytes_overhead() {
        let run = |engine: &'static str| {
            part(
                &est(&[
                    ("model", "whisper-large-v2"),
                    ("dtype", "int8"),
                    ("engine", engine),
                ]),
                "quantisation",
            )
        };
        assert_eq!(run("faster-whisper"), 0.0);
        assert!(run("hf") > BNB_STAGING);
    }
}
