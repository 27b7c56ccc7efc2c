//! What training adds for the parameters that train: gradients, fp32 master weights and
//! optimizer state, sharded by ZeRO stage or offloaded, and the gradient bucket DeepSpeed's
//! ZeRO optimizers keep on the GPU.
//!
//! | term | formula | source |
//! |---|---|---|
//! | gradients | `/N` from ZeRO-2 (`shard-grad-op`); 16-bit only with `offload: optimizer`; torchtune's single-device full fine-tune: the largest parameter's only | ZeRO paper; ZeRO-Offload (Ren et al. 2021) §3; torchtune `optimizer_in_bwd: True` in `*_full_single_device.yaml` |
//! | master weights, optimizer | `/N` from ZeRO-1; 0 with `offload: optimizer` | ZeRO paper; ZeRO-Offload |
//! | DeepSpeed buckets | training under a DeepSpeed ZeRO stage 1-3 (numeric stage, not torchtitan/torchtune/litgpt), on one GPU too: `reduce_bucket_size` (default 5e8) elements at the parameters' width (4 B fp32, else 2 B), with or without offload | ZeRO-3: `deepspeed/runtime/zero/stage3.py` `__ipg_bucket_flat_buffer`; ZeRO-1/2: `DeepSpeedZeroOptimizer.backward` (`stage_1_and_2.py`) allocates `ipg_buffer` before every backward; `contiguous_gradients` default on |

use super::Inputs;
use super::framework::Framework;
use crate::model::annotations::{Dtype, ModelType, Optimizer, Workload};

/// DeepSpeed's `reduce_bucket_size` default (5e8 elements). ZeRO-3 allocates its contiguous
/// gradient bucket (`__ipg_bucket_flat_buffer` in `deepspeed/runtime/zero/stage3.py`) of this
/// many elements, in the parameters' dtype, on the GPU when `contiguous_gradients` is on (its
/// default), whatever share of the model trains and wherever the optimizer runs; ZeRO-1/2 allocate
/// their `ipg_buffer` of the same size (`DeepSpeedZeroOptimizer.backward`). accelerate's
/// DeepSpeed plugin leaves the key unset unless a config file says `auto`, so the default holds
/// for `accelerate launch` with a plugin config (PEFT's examples).
const DS_REDUCE_BUCKET: f64 = 5e8;

impl Inputs {
    /// LoRA adapters on every linear layer (the QLoRA paper's recipe, torchtune's and Qwen's
    /// `finetune.py` defaults; peft's q/v-only default trains fewer, so this errs high):
    /// `r·(d_in + d_out)` per adapted matrix (LoRA, Hu et al. 2021, arXiv:2106.09685). A fused
    /// projection (Phi-3's `qkv_proj` and `gate_up_proj`, Falcon's `query_key_value`) is one
    /// matrix to PEFT, adapted over its whole output.
    ///
    /// A mixture of experts in transformers 5 stacks its experts into 3-D parameters
    /// (`Qwen3MoeExperts.gate_up_proj` `(E, 2I, h)`, `down_proj` `(E, h, I)`); PEFT 0.21 maps
    /// `all-linear`'s expert targets onto them (`peft/utils/transformers_weight_conversion.py`:
    /// `gate_proj` + `up_proj` → `gate_up_proj` with `rank_pattern` `2r`) and adapts each
    /// expert through a `ParamWrapper` (`lora_A` `(E·r, d_in)`, `lora_B` `(d_out, E·r)`):
    /// `E·(2r·(h + 2I) + r·(I + h))` per layer, plus the router's linear `r·(h + E)`.
    pub(super) fn adapter_params(&self) -> f64 {
        let a = &self.arch;
        let h = f64::from(a.hidden_size);
        let q = f64::from(a.attention_heads * a.head_dim);
        let kv = f64::from(a.kv_heads * a.head_dim);
        let ffn = f64::from(a.intermediate_size);
        // A gated MLP (gate, up, down: `LlamaMLP`, `Gemma2MLP`, `Qwen3MLP`) has three linears
        // whatever its width; the model type says which it is, and only an unknown type falls
        // back to the shape's hint (a plain MLP is 4h wide), as `hf::Inputs::block` does.
        let gated = match self.family {
            ModelType::Llama
            | ModelType::QkNorm
            | ModelType::Gemma2
            | ModelType::Gemma3
            | ModelType::Phi3 => true,
            ModelType::Other => a.intermediate_size != 4 * a.hidden_size,
            _ => false,
        };
        // A fused projection is one adapted module, `r·(d_in + d_out)` over its whole output
        // (`qkv_proj` h → q + 2kv, `gate_up_proj` h → 2I): adapting it as three or two separate
        // linears would count `d_in` once per part.
        let attention = if self.family.fused_qkv() {
            (h + q + 2.0 * kv) + (q + h)
        } else {
            (h + q) * 2.0 + (h + kv) * 2.0
        };
        let mlp = if self.experts > 1.0 {
            let e = self.experts;
            let per_expert = if gated {
                2.0 * (h + 2.0 * ffn) + (ffn + h)
            } else {
                2.0 * (h + ffn)
            };
            e * per_expert + (h + e)
        } else if self.family.fused_gate_up() {
            (h + 2.0 * ffn) + (ffn + h)
        } else if gated {
            3.0 * (h + ffn)
        } else {
            2.0 * (h + ffn)
        };
        self.lora_rank * (attention + mlp) * f64::from(a.layers)
    }

    /// Gradients, master weights and optimizer state of what trains, per GPU, by ZeRO stage
    /// (ZeRO, Rajbhandari et al. 2019, arXiv:1910.02054; DeepSpeed's 18 B/param for
    /// mixed-precision Adam: `estimate_zero3_model_states_mem_needs` in
    /// `deepspeed/runtime/zero/stage3.py`, docs `docs/code-docs/source/memory.rst`).
    pub(super) fn trainable_state(&self) -> (f64, f64, f64) {
        match self.workload {
            Workload::Inference => (0.0, 0.0, 0.0),
            Workload::Lora | Workload::Qlora => {
                // Adapters train in fp32 (peft upcasts them): fp32 grads and fp32 states.
                let p = self.adapter_params() * self.stage_share() / self.tp;
                let states = self.optimizer_bytes(4.0);
                let shard = |stage: u8| {
                    if self.zero_stage() >= stage {
                        self.shards()
                    } else {
                        1.0
                    }
                };
                if self.offload.optimizer() {
                    return (p * 4.0 / shard(2), 0.0, 0.0);
                }
                (
                    p * 4.0 / shard(2),
                    p * 4.0 / shard(1),
                    p * states / shard(1),
                )
            }
            Workload::Training => {
                let p = self.params * self.stage_share() / self.tp;
                let (grad, master, param_bytes) = match self.dtype {
                    Dtype::Fp32 => (4.0, 0.0, 4.0),
                    // Autocast under HF keeps fp32 weights and no separate master copy.
                    Dtype::Fp16Amp if self.hf_modules() => (4.0, 0.0, 4.0),
                    Dtype::Fp16Amp => (4.0, 4.0, 4.0),
                    _ => (2.0, 0.0, 2.0),
                };
                let states = self.optimizer_bytes(param_bytes);
                let dp = self.shards();
                let shard = |stage: u8| if self.zero_stage() >= stage { dp } else { 1.0 };
                // ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, §3): fp32 master weights,
                // optimizer state and the fp32 gradients live on the CPU, which runs the step;
                // the GPU keeps the 16-bit gradients of its partition until they are copied out.
                if self.offload.optimizer() {
                    return (p * 2.0 / shard(2), 0.0, 0.0);
                }
                let grads = if self.optimizer_in_backward() {
                    self.largest_parameter() * grad
                } else {
                    p * grad / shard(2)
                };
                (grads, p * master / shard(1), p * states / shard(1))
            }
        }
    }

    /// Optimizer state bytes per trainable parameter whose states live in `state_bytes` each.
    pub(super) fn optimizer_bytes(&self, state_bytes: f64) -> f64 {
        match self.optimizer {
            Optimizer::Adam => 2.0 * state_bytes,
            Optimizer::Momentum => state_bytes,
            Optimizer::Adafactor => 0.0,
            Optimizer::Adam8bit => 2.0,
        }
    }

    /// torchtune's single-device full fine-tune recipe steps the optimizer inside backward
    /// (`optimizer_in_bwd: True` in its `*_full_single_device.yaml` configs): each gradient is
    /// applied and freed as soon as it is produced, so at most the largest parameter's gradient
    /// exists, never the whole set.
    pub(super) fn optimizer_in_backward(&self) -> bool {
        self.workload == Workload::Training
            && self.framework_is(Framework::steps_optimizer_in_backward_on_one_gpu)
            && !self.multi_gpu()
    }

    /// DeepSpeed's gradient bucket ([`DS_REDUCE_BUCKET`]) in a training job run the DeepSpeed
    /// way (a numeric stage, not an FSDP strategy or an FSDP-based engine), on one GPU too:
    /// ZeRO-3 keeps its flat bucket, and the ZeRO-1/2 optimizer allocates `ipg_buffer`, a
    /// `torch.empty(reduce_bucket_size)` in the parameters' dtype, at the start of every
    /// backward when `contiguous_gradients` is on (`DeepSpeedZeroOptimizer.backward`,
    /// `deepspeed/runtime/zero/stage_1_and_2.py`), so it sits beside every saved activation.
    /// A second one comes with `overlap_comm` ("Use double buffers to avoid data access
    /// conflict when `overlap_comm` is enabled", the same function), which defaults to off below
    /// stage 3 (`DeepSpeedZeroConfig.overlap_comm_valid`: `stage == 3`) and which many published
    /// ZeRO-2 configs turn on: `deepspeed-overlap-comm: "true"` says so. ZeRO-3's flat bucket is
    /// one buffer either way. Elements are the parameters' width: fp32 models keep fp32, mixed
    /// precision converts the model to 16 bits.
    pub(super) fn deepspeed_buckets(&self) -> f64 {
        if !self.deepspeed() {
            return 0.0;
        }
        let bytes = if self.dtype == Dtype::Fp32 { 4.0 } else { 2.0 };
        let buffers = if self.overlap_comm && self.zero < 3 {
            2.0
        } else {
            1.0
        };
        buffers * DS_REDUCE_BUCKET * bytes
    }
}

#[cfg(test)]
mod tests {
    use crate::model::estimate::SLACK_TRAINING;
    use crate::model::estimate::testing::{est, est_with, part};

    #[test]
    fn lora_adapts_every_expert_of_a_mixture_of_experts() {
        // Qwen3-30B-A3B's shape: 48 layers, h 2048, 32 x 128 query, 4 x 128 kv, 128 experts of
        // I = 768, rank 16.
        let base = [
            ("layers", "48"),
            ("hidden-size", "2048"),
            ("attention-heads", "32"),
            ("kv-heads", "4"),
            ("head-dim", "128"),
            ("intermediate-size", "768"),
            ("vocab-size", "151936"),
            ("params", "30.5e9"),
            ("experts-per-token", "8"),
            ("workload", "lora"),
            ("lora-rank", "16"),
            ("engine", "hf"),
        ];
        let (h, q, kv, i, e, r, l) = (2048.0, 4096.0, 512.0, 768.0, 128.0, 16.0, 48.0);
        let attention = 2.0 * (h + q) + 2.0 * (h + kv);
        let dense = r * l * (attention + 3.0 * (h + i));
        assert_eq!(part(&est(&base), "adapters"), 4.0 * dense);
        // gate_up (rank 2r, h -> 2I) and down (rank r, I -> h) per expert, and the router.
        let moe = r * l * (attention + e * (2.0 * (h + 2.0 * i) + (i + h)) + (h + e));
        assert_eq!(
            part(&est_with(&base, &[("experts", "128")]), "adapters"),
            4.0 * moe
        );
    }

    /// A gated MLP four times the hidden size wide (SmolLM2-1.7B, Gemma-2-2B) still has three
    /// linears to adapt; a plain one of that width (GPT-2's `c_fc`, `c_proj`) two.
    #[test]
    fn a_gated_mlp_adapts_three_linears_whatever_its_width() {
        let shape = [
            ("layers", "24"),
            ("hidden-size", "2048"),
            ("attention-heads", "32"),
            ("kv-heads", "32"),
            ("head-dim", "64"),
            ("intermediate-size", "8192"),
            ("vocab-size", "49152"),
            ("workload", "lora"),
            ("lora-rank", "8"),
            ("engine", "hf"),
        ];
        let (h, i, r, l) = (2048.0, 8192.0, 8.0, 24.0);
        let attention = 4.0 * (h + h);
        let adapters = |mlp: f64| 4.0 * r * l * (attention + mlp * (h + i));
        assert_eq!(
            part(&est_with(&shape, &[("model-type", "llama")]), "adapters"),
            adapters(3.0)
        );
        assert_eq!(
            part(&est_with(&shape, &[("model-type", "gpt2")]), "adapters"),
            adapters(2.0)
        );
    }

    /// Phi-3's `qkv_proj` and `gate_up_proj` and Falcon's `query_key_value` are one module
    /// each under PEFT's `all-linear` (`Phi3Attention`, `Phi3MLP`, `FalconAttention`): one
    /// adapter over the fused output, not one per part.
    #[test]
    fn a_fused_projection_is_one_adapted_linear() {
        let shape = [
            ("layers", "32"),
            ("hidden-size", "3072"),
            ("attention-heads", "32"),
            ("kv-heads", "32"),
            ("head-dim", "96"),
            ("intermediate-size", "8192"),
            ("vocab-size", "32064"),
            ("workload", "lora"),
            ("lora-rank", "16"),
            ("engine", "hf"),
        ];
        let (h, i, r, l) = (3072.0, 8192.0, 16.0, 32.0);
        // Phi-3-mini: qkv_proj h -> 3h, o_proj, gate_up_proj h -> 2I, down_proj.
        let phi3 = (h + 3.0 * h) + (h + h) + (h + 2.0 * i) + (i + h);
        assert_eq!(
            part(&est_with(&shape, &[("model-type", "phi3")]), "adapters"),
            4.0 * r * l * phi3
        );
        // Falcon-7B's layout: 71 query heads, one kv head of 64, a plain 4h MLP.
        let falcon_shape = [
            ("layers", "32"),
            ("hidden-size", "4544"),
            ("attention-heads", "71"),
            ("kv-heads", "1"),
            ("head-dim", "64"),
            ("intermediate-size", "18176"),
            ("vocab-size", "65024"),
            ("workload", "lora"),
            ("lora-rank", "16"),
            ("engine", "hf"),
            ("model-type", "falcon"),
        ];
        let (h, kv, i) = (4544.0, 64.0, 18176.0);
        let falcon = (h + h + 2.0 * kv) + (h + h) + 2.0 * (h + i);
        assert_eq!(part(&est(&falcon_shape), "adapters"), 4.0 * r * l * falcon);
    }

    /// A mixture-of-experts preset carries its expert counts, so `model: <preset>` sizes a
    /// LoRA over every expert (and the routed tokens of a prefill) as `--model-config` does
    /// from the same `config.json`.
    #[test]
    fn a_mixture_of_experts_preset_sizes_like_its_config() {
        // The fields `hf_config` reads, as in huggingface.co/mistralai/Mixtral-8x7B-v0.1 and
        // huggingface.co/Qwen/Qwen3-30B-A3B.
        let configs = [
            (
                "mixtral-8x7b",
                r#"{"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                    "tie_word_embeddings": false}"#,
            ),
            (
                "qwen3-30b-a3b",
                r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                    "moe_intermediate_size": 768, "num_hidden_layers": 48,
                    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
                    "tie_word_embeddings": false}"#,
            ),
        ];
        let workloads: [&[(&str, &str)]; 2] = [
            &[("workload", "lora"), ("lora-rank", "16"), ("batch", "2")],
            &[
                ("workload", "inference"),
                ("batch", "64"),
                ("context-tokens", "2048"),
            ],
        ];
        for (preset, json) in configs {
            let from_config = crate::model::hf_config::annotations(json)
                .unwrap()
                .annotations;
            for workload in workloads {
                let with = |model: &[(String, String)]| {
                    let mut map: std::collections::BTreeMap<String, String> = model
                        .iter()
                        .map(|(k, v)| (format!("peakfit.io/{k}"), v.clone()))
                        .collect();
                    for (k, v) in workload.iter().chain(&[("engine", "hf")]) {
                        map.insert(format!("peakfit.io/{k}"), (*v).to_string());
                    }
                    let spec = crate::model::Spec::parse(&map).unwrap();
                    crate::model::estimate(&spec, crate::model::estimate::Defaults::GPU_TOTAL)
                };
                let config = with(&from_config.clone().into_iter().collect::<Vec<_>>());
                let named = with(&[("model".into(), preset.into())]);
                for name in ["adapters", "activations"] {
                    let (c, n) = (part(&config, name), part(&named, name));
                    assert!(
                        (n - c).abs() <= 0.005 * c,
                        "{preset} {workload:?}: {name} {n} by preset, {c} by config"
                    );
                }
                let (c, n) = (config.per_gpu_bytes as f64, named.per_gpu_bytes as f64);
                assert!(
                    (n - c).abs() <= 0.005 * c,
                    "{preset} {workload:?}: {n} by preset, {c} by config"
                );
            }
        }
    }

    #[test]
    fn training_state_by_optimizer_and_zero_stage() {
        let base = [
            ("model", "llama-3.1-8b"),
            ("workload", "training"),
            ("engine", "deepspeed"),
            ("dtype", "fp16-amp"),
        ];
        let p = 8.03e9;
        let e = est(&base);
        assert_eq!(part(&e, "gradients"), p * 4.0);
        assert_eq!(part(&e, "master-weights"), p * 4.0);
        assert_eq!(part(&e, "optimizer"), p * 8.0);
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            est(&v)
        };
        let sgd = with(&[("optimizer", "sgd")]);
        assert_eq!(part(&sgd, "optimizer"), p * 4.0);
        let eight = with(&[("optimizer", "adam-8bit")]);
        assert_eq!(part(&eight, "optimizer"), p * 2.0);
        let paged = with(&[("optimizer", "paged-adamw-8bit")]);
        assert_eq!(part(&paged, "optimizer"), 0.0);
        assert_eq!(part(&paged, "optimizer-paged"), p * 2.0);
        // NVML sees it either way, without the caching allocator's slack on it.
        let slack_on_state = crate::convert::f64_to_u64(p * 2.0 * (SLACK_TRAINING - 1.0));
        assert!((paged.per_gpu_bytes + slack_on_state).abs_diff(eight.per_gpu_bytes) < 16);
        assert!(paged.reserved_bytes < eight.reserved_bytes);
        let z1 = with(&[("zero-stage", "1"), ("data-parallel", "8")]);
        assert_eq!(part(&z1, "optimizer"), p);
        assert_eq!(part(&z1, "gradients"), p * 4.0);
        let z2 = with(&[("zero-stage", "2"), ("data-parallel", "8")]);
        assert_eq!(part(&z2, "gradients"), p * 0.5);
        let z3 = with(&[("zero-stage", "3"), ("data-parallel", "8")]);
        assert_eq!(part(&z3, "weights"), p * 2.0 / 8.0);
        assert!(part(&z3, "zero3-live-params") > 0.0);
        assert!(z3.per_gpu_bytes < z2.per_gpu_bytes && z2.per_gpu_bytes < z1.per_gpu_bytes);
        // Pure bf16 keeps bf16 grads and states.
        let bf16 = est(&[
            ("model", "llama-3.1-8b"),
            ("workload", "training"),
            ("dtype", "bf16"),
        ]);
        assert_eq!(part(&bf16, "optimizer"), p * 4.0);
        assert_eq!(part(&bf16, "master-weights"), 0.0);
    }

    #[test]
    fn lora_trains_only_adapters() {
        let e = est(&[
            ("model", "llama-2-7b"),
            ("workload", "lora"),
            ("engine", "deepspeed"),
            ("lora-rank", "8"),
        ]);
        // r=8 on every linear: q,k,v,o (4 x (4096 + 4096)) and the gated MLP
        // (3 x (4096 + 11008)), 32 layers: 20.0M params, fp32 with Adam = 16 B each.
        let adapters = 8.0 * (4.0 * 8192.0 + 3.0 * 15104.0) * 32.0;
        assert_eq!(part(&e, "optimizer"), adapters * 8.0);
        assert_eq!(part(&e, "gradients"), adapters * 4.0);
        let q = est(&[("model", "llama-2-7b"), ("workload", "qlora")]);
        assert!(part(&q, "weights") < part(&e, "weights") / 3.0);
        // bnb QLoRA through peft upcasts the embeddings; litgpt does not.
        let upcast = |engine| {
            let e = est(&[
                ("model", "llama-2-7b"),
                ("workload", "qlora"),
                ("engine", engine),
            ]);
            part(&e, "fp32-upcast")
        };
        assert_eq!(upcast("hf"), 2.0 * 32000.0 * 4096.0 * 2.0);
        assert_eq!(upcast("litgpt"), 0.0);
    }

    #[test]
    fn deepspeed_keeps_its_reduce_bucket_fsdp_does_not() {
        let with = |extra: &[(&'static str, &'static str)]| {
            est_with(
                &[
                    ("model", "bloomz-7b1"),
                    ("workload", "lora"),
                    ("dtype", "fp32"),
                    ("offload", "optimizer+params"),
                ],
                extra,
            )
        };
        // 5e8 fp32 elements, on one GPU too (ZeRO-Offload).
        assert_eq!(
            part(&with(&[("zero-stage", "3")]), "deepspeed-buckets"),
            2e9
        );
        // ZeRO-1/2 allocate their `ipg_buffer` of the same size before every backward, and a
        // second one with `overlap_comm`; ZeRO-3's flat bucket stays one.
        for stage in ["1", "2"] {
            assert_eq!(
                part(&with(&[("zero-stage", stage)]), "deepspeed-buckets"),
                2e9
            );
            assert_eq!(
                part(
                    &with(&[("zero-stage", stage), ("deepspeed-overlap-comm", "true")]),
                    "deepspeed-buckets"
                ),
                4e9
            );
        }
        assert_eq!(
            part(
                &with(&[("zero-stage", "3"), ("deepspeed-overlap-comm", "true")]),
                "deepspeed-buckets"
            ),
            2e9
        );
        assert_eq!(
            part(&with(&[("zero-stage", "0")]), "deepspeed-buckets"),
            0.0
        );
        assert_eq!(
            part(&with(&[("zero-stage", "full-shard")]), "deepspeed-buckets"),
            0.0
        );
        assert_eq!(
            part(
                &with(&[("zero-stage", "3"), ("engine", "torchtitan")]),
                "deepspeed-buckets"
            ),
            0.0
        );
        // Mixed precision: the model is 16-bit under DeepSpeed, and so is the bucket.
        let amp = est(&[
            ("model", "llama-2-70b"),
            ("workload", "lora"),
            ("dtype", "fp16-amp"),
            ("zero-stage", "3"),
            ("data-parallel", "8"),
        ]);
        assert_eq!(part(&amp, "deepspeed-buckets"), 1e9);
    }

    #[test]
    fn torchtune_single_device_full_finetune_steps_in_backward() {
        let base = [
            ("model", "llama-3.1-8b"),
            ("workload", "training"),
            ("dtype", "bf16"),
            ("batch", "2"),
            ("context-tokens", "2048"),
        ];
        let mut ds = base.to_vec();
        ds.push(("engine", "deepspeed"));
        let hf = est(&ds);
        assert_eq!(part(&hf, "gradients"), 8.03e9 * 2.0);
        let mut tt = base.to_vec();
        tt.push(("engine", "torchtune"));
        // Only the largest parameter's gradient: the 128256 x 4096 embedding, bf16.
        assert_eq!(part(&est(&tt), "gradients"), 128_256.0 * 4096.0 * 2.0);
        // Its distributed recipe keeps whole gradients (FSDP shards them).
        tt.push(("data-parallel", "2"));
        assert!(part(&est(&tt), "gradients") > 8e9);
    }
}
