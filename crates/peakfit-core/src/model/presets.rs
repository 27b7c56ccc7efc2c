//! Built-in architecture presets, selected with `peakfit.io/model`.
//!
//! Numbers are each model's `config.json` on the Hugging Face Hub (`huggingface.co/<org>/<model>`),
//! params computed from the shapes. Every field can be
//! overridden by its own annotation, so a fine-tune with a resized vocabulary needs only
//! `peakfit.io/vocab-size`.
//!
//! | preset | aliases | params | layers | hidden | heads | kv | head-dim | ffn | vocab | tied | experts |
//! |---|---|---|---|---|---|---|---|---|---|---|---|
//! | `llama-2-7b` | `llama2-7b` | 6.74B | 32 | 4096 | 32 | 32 | 128 | 11008 | 32000 | no | – |
//! | `llama-2-13b` | `llama2-13b` | 13.02B | 40 | 5120 | 40 | 40 | 128 | 13824 | 32000 | no | – |
//! | `llama-2-70b` | `llama2-70b` | 68.98B | 80 | 8192 | 64 | 8 | 128 | 28672 | 32000 | no | – |
//! | `llama-3.1-8b` | `llama-3-8b`, `llama3-8b`, `llama3.1-8b` | 8.03B | 32 | 4096 | 32 | 8 | 128 | 14336 | 128256 | no | – |
//! | `llama-3.1-70b` | `llama-3-70b`, `llama3-70b`, `llama3.1-70b`, `llama-3.3-70b` | 70.55B | 80 | 8192 | 64 | 8 | 128 | 28672 | 128256 | no | – |
//! | `llama-3.1-405b` | `llama3.1-405b` | 405.85B | 126 | 16384 | 128 | 8 | 128 | 53248 | 128256 | no | – |
//! | `llama-3.2-11b-vision` | `llama3.2-11b-vision` | 10.6B | 40 | 4096 | 32 | 8 | 128 | 14336 | 128256 | no | – |
//! | `mistral-7b` | `mistral-7b-v0.1` | 7.24B | 32 | 4096 | 32 | 8 | 128 | 14336 | 32000 | no | – |
//! | `mixtral-8x7b` | `mixtral-8x7b-v0.1` | 46.7B | 32 | 4096 | 32 | 8 | 128 | 14336 | 32000 | no | 8 (2 per token) |
//! | `qwen3-0.6b` |  | 600M | 28 | 1024 | 16 | 8 | 128 | 3072 | 151936 | yes | – |
//! | `qwen3-1.7b` |  | 1.72B | 28 | 2048 | 16 | 8 | 128 | 6144 | 151936 | yes | – |
//! | `qwen3-4b` |  | 4.02B | 36 | 2560 | 32 | 8 | 128 | 9728 | 151936 | yes | – |
//! | `qwen3-8b` |  | 8.19B | 36 | 4096 | 32 | 8 | 128 | 12288 | 151936 | no | – |
//! | `qwen3-14b` |  | 14.77B | 40 | 5120 | 40 | 8 | 128 | 17408 | 151936 | no | – |
//! | `qwen3-32b` |  | 32.76B | 64 | 5120 | 64 | 8 | 128 | 25600 | 151936 | no | – |
//! | `qwen3-30b-a3b` |  | 30.53B | 48 | 2048 | 32 | 4 | 128 | 768 | 151936 | no | 128 (8 per token) |
//! | `qwen2.5-7b` |  | 7.62B | 28 | 3584 | 28 | 4 | 128 | 18944 | 152064 | no | – |
//! | `qwen-1.8b-v1` | `qwen-1.8b` | 1.84B | 24 | 2048 | 16 | 16 | 128 | 5504 | 151936 | no | – |
//! | `qwen-7b-v1` | `qwen-7b` | 7.72B | 32 | 4096 | 32 | 32 | 128 | 11008 | 151936 | no | – |
//! | `qwen-14b-v1` | `qwen-14b` | 14.17B | 40 | 5120 | 40 | 40 | 128 | 13696 | 152064 | no | – |
//! | `qwen-72b-v1` | `qwen-72b` | 72.29B | 80 | 8192 | 64 | 64 | 128 | 24576 | 152064 | no | – |
//! | `falcon-7b` |  | 6.92B | 32 | 4544 | 71 | 1 | 64 | 18176 | 65024 | yes | – |
//! | `falcon-40b` |  | 41.8B | 60 | 8192 | 128 | 8 | 64 | 32768 | 65024 | no | – |
//! | `phi-1.5` | `phi-1_5` | 1.42B | 24 | 2048 | 32 | 32 | 64 | 8192 | 51200 | no | – |
//! | `stablelm-base-alpha-3b` | `stablelm-3b` | 3.6B | 16 | 4096 | 32 | 32 | 128 | 16384 | 50688 | no | – |
//! | `starcoder-15.5b` | `starcoder`, `octocoder`, `octocoder-15.5b` | 15.5B | 40 | 6144 | 48 | 1 | 128 | 24576 | 49152 | no | – |
//! | `codellama-34b` |  | 33.7B | 48 | 8192 | 64 | 8 | 128 | 22016 | 32000 | no | – |
//! | `bloomz-7b1` | `bloom-7b1` | 7.07B | 30 | 4096 | 32 | 32 | 128 | 16384 | 250880 | yes | – |
//! | `gpt2` | `gpt-2`, `gpt2-small` | 124M | 12 | 768 | 12 | 12 | 64 | 3072 | 50257 | yes | – |
//! | `bert-large` | `bert-large-uncased`, `bert-large-cased` | 335M | 24 | 1024 | 16 | 16 | 64 | 4096 | 30522 | yes | – |
//! | `bert-base` | `bert-base-uncased`, `bert-base-cased` | 110M | 12 | 768 | 12 | 12 | 64 | 3072 | 30522 | yes | – |
//! | `roberta-large` | `xlm-roberta-large` | 355M | 24 | 1024 | 16 | 16 | 64 | 4096 | 50265 | yes | – |
//! | `t0-3b` | `t0_3b`, `t5-v1.1-xl` | 2.85B | 48 | 2048 | 32 | 32 | 64 | 5120 | 32128 | no | – |
//! | `mt0-xxl` | `mt5-xxl` | 12.9B | 48 | 4096 | 64 | 64 | 64 | 10240 | 250112 | no | – |
//! | `whisper-large-v2` | `whisper-large`, `whisper-large-v3`, `whisper-large-v1` | 1.55B | 64 | 1280 | 20 | 20 | 64 | 5120 | 51865 | yes | – |
//! | `whisper-medium` |  | 769M | 48 | 1024 | 16 | 16 | 64 | 4096 | 51865 | yes | – |
//! | `sd-1.5` | `stable-diffusion-v1-5`, `stable-diffusion-1.5`, `sd1.5`, `sd-v1-5`, `stable-diffusion-v1-4` | 1.07B | – | – | – | – | – | – | – | – | – |
//! | `sdxl-base-1.0` | `sdxl`, `stable-diffusion-xl`, `stable-diffusion-xl-base-1.0` | 3.47B | – | – | – | – | – | – | – | – | – |
//! | `sd3-medium` | `stable-diffusion-3-medium`, `sd3` | 7.69B | – | – | – | – | – | – | – | – | – |
//! | `flux-dev` | `flux.1-dev`, `flux-1-dev`, `flux.1-schnell`, `flux-schnell`, `flux` | 16.87B | – | – | – | – | – | – | – | – | – |
//!
//! Encoder-decoder models (T5, mT0, Whisper) count encoder + decoder layers. Diffusion pipelines
//! (`sd-1.5`, `sdxl-base-1.0`, `sd3-medium`, `flux-dev`) have no single transformer shape: their
//! parameter count is text encoders + denoiser + VAE, and [`Diffusion`] lists the parts.

/// A transformer's shape: what the memory model needs to know about a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Architecture {
    pub params: u64,
    pub layers: u32,
    pub hidden_size: u32,
    pub attention_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub vocab_size: u32,
    pub intermediate_size: u32,
    pub tied_embeddings: bool,
}

/// A named architecture and the other names it answers to.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// `None` for non-transformer models, where only the parameter count is meaningful.
    pub shape: Option<Architecture>,
    pub params: u64,
    pub kind: Kind,
    /// The model's own (remote) modelling code keeps its KV cache as tuples grown by
    /// `torch.cat` whatever the attention kernel, so `generate` holds the previous step's cache
    /// next to the new one (see `Inputs::kv_cache` in `estimate/kv_cache.rs`).
    pub tuple_cache: bool,
    /// The `model_type` of the model's `config.json` where its transformers modeling code keeps
    /// other tensors alive than the Llama layout the estimate assumes for a preset without one
    /// (`qwen3`: q/k norms; `falcon`: fused qkv and a mask built every forward; `gpt2`: the
    /// composed GELU), so that `model: falcon-7b` is sized as `--model-config` would size it.
    pub hf_model_type: Option<&'static str>,
    /// A mixture of experts' routed experts per layer (`num_local_experts`, `num_experts`) and
    /// how many each token visits (`num_experts_per_tok`); 0 for a dense MLP. `experts` sizes
    /// PEFT's per-expert adapters under `all-linear` (`Inputs::adapter_params`), the per-token
    /// count the routed copies of each token in the MLP's activations (`hf::Block`), as
    /// `--model-config` does from the same `config.json` fields.
    pub experts: u32,
    pub experts_per_token: u32,
    /// `resid_pdrop` of the model's `config.json` where a replay reads it (GPT-2's and Phi's
    /// layers: `residual-dropout`) and it is not what an unstated one is taken to be (on):
    /// Phi-1.5's 0.
    pub residual_dropout: Option<f64>,
}

/// How a model's layers are arranged, which decides its activation and cache terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Causal decoder-only LM: KV cache grows with the context.
    Decoder,
    /// Bidirectional encoder (BERT, RoBERTa): no KV cache, one pass over the sequence.
    Encoder,
    /// Encoder + decoder (T5, mT0, Whisper): `layers` counts both stacks, half each; the decoder
    /// keeps a self-attention cache and a cross-attention cache over the encoder's output.
    EncoderDecoder {
        /// Encoder positions the decoder attends to: Whisper's 1500 audio frames per 30 s
        /// window; 0 when it is the input sequence itself (T5).
        encoder_positions: u32,
        /// Longest decoder output: Whisper's `n_text_ctx` 448.
        decoder_positions: u32,
    },
    /// Latent diffusion pipeline: text encoders, a denoiser and a VAE.
    Diffusion(Diffusion),
}

impl Kind {
    pub const NAMES: &str = "decoder encoder encoder-decoder diffusion";

    pub fn name(self) -> &'static str {
        match self {
            Self::Decoder => "decoder",
            Self::Encoder => "encoder",
            Self::EncoderDecoder { .. } => "encoder-decoder",
            Self::Diffusion(_) => "diffusion",
        }
    }
}

/// The parts of a latent-diffusion pipeline (parameter counts from the diffusers model cards'
/// component `config.json`s and safetensors sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Diffusion {
    /// UNet or DiT parameters.
    pub denoiser_params: u64,
    /// All text encoders together (CLIP-L, OpenCLIP-bigG, T5-XXL as the pipeline has them).
    pub text_encoder_params: u64,
    /// The largest single text encoder (what model offload holds at once).
    pub largest_text_encoder_params: u64,
    pub vae_params: u64,
    /// DiT hidden width and depth; 0 for a UNet.
    pub dit_hidden: u32,
    /// Pixels per latent token along one side: 8 for a UNet over an 8x VAE, 16 for a DiT
    /// that patchifies 2x2 latents.
    pub pixels_per_token: u32,
    /// The VAE decodes in fp32 whatever the pipeline dtype (SDXL's `force_upcast`).
    pub vae_upcast: bool,
    /// The pipeline's default image side.
    pub default_image: u32,
    /// Classifier-free guidance by default (doubles the denoiser batch); Flux-dev's guidance is
    /// distilled into the model and does not.
    pub guidance: bool,
}

impl Diffusion {
    pub fn params(&self) -> u64 {
        self.denoiser_params + self.text_encoder_params + self.vae_params
    }
}

/// Presets are identified by name.
impl PartialEq for Preset {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

const M: u64 = 1_000_000;

#[allow(clippy::too_many_arguments)]
const fn arch(
    params: u64,
    layers: u32,
    hidden_size: u32,
    attention_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    intermediate_size: u32,
    vocab_size: u32,
    tied_embeddings: bool,
) -> Architecture {
    Architecture {
        params,
        layers,
        hidden_size,
        attention_heads,
        kv_heads,
        head_dim,
        vocab_size,
        intermediate_size,
        tied_embeddings,
    }
}

const fn transformer(
    name: &'static str,
    aliases: &'static [&'static str],
    shape: Architecture,
) -> Preset {
    Preset {
        name,
        aliases,
        shape: Some(shape),
        params: shape.params,
        kind: Kind::Decoder,
        tuple_cache: false,
        hf_model_type: None,
        experts: 0,
        experts_per_token: 0,
        residual_dropout: None,
    }
}

/// A mixture of experts: `intermediate_size` in its `arch` is one expert's width
/// (`moe_intermediate_size` where the config has both), `params` counts every expert.
const fn moe(experts: u32, experts_per_token: u32, p: Preset) -> Preset {
    Preset {
        experts,
        experts_per_token,
        ..p
    }
}

/// A preset with its `config.json` `model_type`: one whose modeling code is not the Llama layout
/// (see [`Preset::hf_model_type`]), or one whose code the allocator replay follows
/// (`prefill_replay::follows`: `llama`, `mistral`, `qwen2`), so `model: llama-3.1-8b` is
/// replayed as its `--model-config` would be.
const fn typed(model_type: &'static str, p: Preset) -> Preset {
    Preset {
        hf_model_type: Some(model_type),
        ..p
    }
}

/// Qwen v1 runs on its remote `modeling_qwen.py`, which concatenates `layer_past` tuples
/// (`key = torch.cat((past_key, key), dim=1)`, `present = (key, value)` in
/// `QWenAttention.forward`) on the flash-attention path too.
const fn qwen_v1(p: Preset) -> Preset {
    Preset {
        tuple_cache: true,
        ..p
    }
}

const fn with_kind(p: Preset, kind: Kind) -> Preset {
    Preset { kind, ..p }
}

const fn diffusion(name: &'static str, aliases: &'static [&'static str], d: Diffusion) -> Preset {
    Preset {
        name,
        aliases,
        shape: None,
        params: d.denoiser_params + d.text_encoder_params + d.vae_params,
        kind: Kind::Diffusion(d),
        tuple_cache: false,
        hf_model_type: None,
        experts: 0,
        experts_per_token: 0,
        residual_dropout: None,
    }
}

/// Whisper: 30 s windows of 1500 encoder frames, at most 448 decoder tokens (`n_audio_ctx`,
/// `n_text_ctx` of openai/whisper's `ModelDimensions`).
const WHISPER: Kind = Kind::EncoderDecoder {
    encoder_positions: 1500,
    decoder_positions: 448,
};
/// T5-family: the decoder attends to the input sequence.
const T5: Kind = Kind::EncoderDecoder {
    encoder_positions: 0,
    decoder_positions: 0,
};
/// Stable Diffusion's VAE (`AutoencoderKL`, 83.7M parameters in every SD 1.x/2.x/XL/3/Flux
/// pipeline: only the latent channels differ).
const SD_VAE: u64 = 84 * M;
/// CLIP ViT-L/14 text tower (SD 1.5, SDXL, SD3 and Flux all carry it).
const CLIP_L: u64 = 123 * M;
/// OpenCLIP ViT-bigG/14 text tower with projection (SDXL, SD3).
const CLIP_G: u64 = 695 * M;
/// T5-v1.1-XXL encoder (SD3, Flux).
const T5_XXL: u64 = 4_762 * M;

pub static PRESETS: &[Preset] = &[
    typed(
        "llama",
        transformer(
            "llama-2-7b",
            &["llama2-7b"],
            arch(6_740 * M, 32, 4096, 32, 32, 128, 11008, 32000, false),
        ),
    ),
    typed(
        "llama",
        transformer(
            "llama-2-13b",
            &["llama2-13b"],
            arch(13_020 * M, 40, 5120, 40, 40, 128, 13824, 32000, false),
        ),
    ),
    typed(
        "llama",
        transformer(
            "llama-2-70b",
            &["llama2-70b"],
            arch(68_980 * M, 80, 8192, 64, 8, 128, 28672, 32000, false),
        ),
    ),
    typed(
        "llama",
        transformer(
            "llama-3.1-8b",
            &["llama-3-8b", "llama3-8b", "llama3.1-8b"],
            arch(8_030 * M, 32, 4096, 32, 8, 128, 14336, 128_256, false),
        ),
    ),
    typed(
        "llama",
        transformer(
            "llama-3.1-70b",
            &["llama-3-70b", "llama3-70b", "llama3.1-70b", "llama-3.3-70b"],
            arch(70_550 * M, 80, 8192, 64, 8, 128, 28672, 128_256, false),
        ),
    ),
    typed(
        "llama",
        transformer(
            "llama-3.1-405b",
            &["llama3.1-405b"],
            arch(405_850 * M, 126, 16384, 128, 8, 128, 53248, 128_256, false),
        ),
    ),
    transformer(
        "llama-3.2-11b-vision",
        &["llama3.2-11b-vision"],
        arch(10_600 * M, 40, 4096, 32, 8, 128, 14336, 128_256, false),
    ),
    typed(
        "mistral",
        transformer(
            "mistral-7b",
            &["mistral-7b-v0.1"],
            arch(7_240 * M, 32, 4096, 32, 8, 128, 14336, 32000, false),
        ),
    ),
    // huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json: `num_local_experts` 8,
    // `num_experts_per_tok` 2, `intermediate_size` 14336 per expert.
    moe(
        8,
        2,
        typed(
            "mixtral",
            transformer(
                "mixtral-8x7b",
                &["mixtral-8x7b-v0.1"],
                arch(46_700 * M, 32, 4096, 32, 8, 128, 14336, 32000, false),
            ),
        ),
    ),
    typed(
        "qwen3",
        transformer(
            "qwen3-0.6b",
            &[],
            arch(600 * M, 28, 1024, 16, 8, 128, 3072, 151_936, true),
        ),
    ),
    typed(
        "qwen3",
        transformer(
            "qwen3-1.7b",
            &[],
            arch(1_720 * M, 28, 2048, 16, 8, 128, 6144, 151_936, true),
        ),
    ),
    typed(
        "qwen3",
        transformer(
            "qwen3-4b",
            &[],
            arch(4_020 * M, 36, 2560, 32, 8, 128, 9728, 151_936, true),
        ),
    ),
    typed(
        "qwen3",
        transformer(
            "qwen3-8b",
            &[],
            arch(8_190 * M, 36, 4096, 32, 8, 128, 12288, 151_936, false),
        ),
    ),
    typed(
        "qwen3",
        transformer(
            "qwen3-14b",
            &[],
            arch(14_770 * M, 40, 5120, 40, 8, 128, 17408, 151_936, false),
        ),
    ),
    typed(
        "qwen3",
        transformer(
            "qwen3-32b",
            &[],
            arch(32_760 * M, 64, 5120, 64, 8, 128, 25600, 151_936, false),
        ),
    ),
    // huggingface.co/Qwen/Qwen3-30B-A3B config.json: `num_experts` 128, `num_experts_per_tok`
    // 8, `moe_intermediate_size` 768 (its dense `intermediate_size` 6144 is unused: no
    // `mlp_only_layers`, `decoder_sparse_step` 1).
    moe(
        128,
        8,
        typed(
            "qwen3_moe",
            transformer(
                "qwen3-30b-a3b",
                &[],
                arch(30_530 * M, 48, 2048, 32, 4, 128, 768, 151_936, false),
            ),
        ),
    ),
    typed(
        "qwen2",
        transformer(
            "qwen2.5-7b",
            &[],
            arch(7_620 * M, 28, 3584, 28, 4, 128, 18944, 152_064, false),
        ),
    ),
    qwen_v1(transformer(
        "qwen-1.8b-v1",
        &["qwen-1.8b"],
        arch(1_840 * M, 24, 2048, 16, 16, 128, 5504, 151_936, false),
    )),
    qwen_v1(transformer(
        "qwen-7b-v1",
        &["qwen-7b"],
        arch(7_720 * M, 32, 4096, 32, 32, 128, 11008, 151_936, false),
    )),
    qwen_v1(transformer(
        "qwen-14b-v1",
        &["qwen-14b"],
        arch(14_170 * M, 40, 5120, 40, 40, 128, 13696, 152_064, false),
    )),
    qwen_v1(transformer(
        "qwen-72b-v1",
        &["qwen-72b"],
        arch(72_290 * M, 80, 8192, 64, 64, 128, 24576, 152_064, false),
    )),
    typed(
        "falcon",
        transformer(
            "falcon-7b",
            &[],
            arch(6_920 * M, 32, 4544, 71, 1, 64, 18176, 65024, true),
        ),
    ),
    typed(
        "falcon",
        transformer(
            "falcon-40b",
            &[],
            arch(41_800 * M, 60, 8192, 128, 8, 64, 32768, 65024, false),
        ),
    ),
    // huggingface.co/microsoft/phi-1_5 config.json: `model_type` `phi`, `resid_pdrop` 0.0.
    Preset {
        residual_dropout: Some(0.0),
        ..typed(
            "phi",
            transformer(
                "phi-1.5",
                &["phi-1_5"],
                arch(1_420 * M, 24, 2048, 32, 32, 64, 8192, 51200, false),
            ),
        )
    },
    transformer(
        "stablelm-base-alpha-3b",
        &["stablelm-3b"],
        arch(3_600 * M, 16, 4096, 32, 32, 128, 16384, 50688, false),
    ),
    transformer(
        "starcoder-15.5b",
        &["starcoder", "octocoder", "octocoder-15.5b"],
        arch(15_500 * M, 40, 6144, 48, 1, 128, 24576, 49152, false),
    ),
    typed(
        "llama",
        transformer(
            "codellama-34b",
            &[],
            arch(33_700 * M, 48, 8192, 64, 8, 128, 22016, 32000, false),
        ),
    ),
    transformer(
        "bloomz-7b1",
        &["bloom-7b1"],
        arch(7_070 * M, 30, 4096, 32, 32, 128, 16384, 250_880, true),
    ),
    typed(
        "gpt2",
        transformer(
            "gpt2",
            &["gpt-2", "gpt2-small"],
            arch(124 * M, 12, 768, 12, 12, 64, 3072, 50257, true),
        ),
    ),
    with_kind(
        transformer(
            "bert-large",
            &["bert-large-uncased", "bert-large-cased"],
            arch(335 * M, 24, 1024, 16, 16, 64, 4096, 30522, true),
        ),
        Kind::Encoder,
    ),
    with_kind(
        transformer(
            "bert-base",
            &["bert-base-uncased", "bert-base-cased"],
            arch(110 * M, 12, 768, 12, 12, 64, 3072, 30522, true),
        ),
        Kind::Encoder,
    ),
    with_kind(
        transformer(
            "roberta-large",
            &["xlm-roberta-large"],
            arch(355 * M, 24, 1024, 16, 16, 64, 4096, 50265, true),
        ),
        Kind::Encoder,
    ),
    with_kind(
        transformer(
            "t0-3b",
            &["t0_3b", "t5-v1.1-xl"],
            arch(2_850 * M, 48, 2048, 32, 32, 64, 5120, 32128, false),
        ),
        T5,
    ),
    with_kind(
        transformer(
            "mt0-xxl",
            &["mt5-xxl"],
            arch(12_900 * M, 48, 4096, 64, 64, 64, 10240, 250_112, false),
        ),
        T5,
    ),
    with_kind(
        transformer(
            "whisper-large-v2",
            &["whisper-large", "whisper-large-v3", "whisper-large-v1"],
            arch(1_550 * M, 64, 1280, 20, 20, 64, 5120, 51865, true),
        ),
        WHISPER,
    ),
    with_kind(
        transformer(
            "whisper-medium",
            &[],
            arch(769 * M, 48, 1024, 16, 16, 64, 4096, 51865, true),
        ),
        WHISPER,
    ),
    diffusion(
        "sd-1.5",
        &[
            "stable-diffusion-v1-5",
            "stable-diffusion-1.5",
            "sd1.5",
            "sd-v1-5",
            "stable-diffusion-v1-4",
        ],
        Diffusion {
            denoiser_params: 860 * M,
            text_encoder_params: CLIP_L,
            largest_text_encoder_params: CLIP_L,
            vae_params: SD_VAE,
            dit_hidden: 0,
            pixels_per_token: 8,
            vae_upcast: false,
            default_image: 512,
            guidance: true,
        },
    ),
    diffusion(
        "sdxl-base-1.0",
        &[
            "sdxl",
            "stable-diffusion-xl",
            "stable-diffusion-xl-base-1.0",
        ],
        Diffusion {
            denoiser_params: 2_567 * M,
            text_encoder_params: CLIP_L + CLIP_G,
            largest_text_encoder_params: CLIP_G,
            vae_params: SD_VAE,
            dit_hidden: 0,
            pixels_per_token: 8,
            vae_upcast: true,
            default_image: 1024,
            guidance: true,
        },
    ),
    diffusion(
        "sd3-medium",
        &["stable-diffusion-3-medium", "sd3"],
        Diffusion {
            denoiser_params: 2_028 * M,
            text_encoder_params: CLIP_L + CLIP_G + T5_XXL,
            largest_text_encoder_params: T5_XXL,
            vae_params: SD_VAE,
            dit_hidden: 1536,
            pixels_per_token: 16,
            vae_upcast: false,
            default_image: 1024,
            guidance: true,
        },
    ),
    diffusion(
        "flux-dev",
        &[
            "flux.1-dev",
            "flux-1-dev",
            "flux.1-schnell",
            "flux-schnell",
            "flux",
        ],
        Diffusion {
            denoiser_params: 11_900 * M,
            text_encoder_params: CLIP_L + T5_XXL,
            largest_text_encoder_params: T5_XXL,
            vae_params: SD_VAE,
            dit_hidden: 3072,
            pixels_per_token: 16,
            vae_upcast: false,
            default_image: 1024,
            guidance: false,
        },
    ),
];

/// Words that name a checkpoint variant, not an architecture: `Qwen-7B-Chat-Int4 (v1)` has the
/// shape of `qwen-7b-v1`, `Llama-2-7b-hf` that of `llama-2-7b`.
const VARIANT_WORDS: &[&str] = &[
    "chat", "instruct", "it", "hf", "base", "int4", "int8", "fp8", "awq", "gptq", "bnb", "4bit",
    "8bit",
];

/// Lower-case, words separated by `-`, variant words dropped. A parenthesised part is kept only
/// when it is a version (`(v1)`), since `BERT-large (bert-large-uncased)` repeats the name.
pub fn normalise(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let mut kept = String::new();
    let mut rest = lower.as_str();
    while let Some(open) = rest.find('(') {
        kept.push_str(&rest[..open]);
        let close = rest[open..].find(')').map_or(rest.len(), |c| open + c);
        let inner = rest[open + 1..close].trim();
        if inner.len() <= 3 && inner.starts_with('v') {
            kept.push('-');
            kept.push_str(inner);
        }
        rest = rest.get(close + 1..).unwrap_or("");
    }
    kept.push_str(rest);
    kept.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
        .filter(|w| !w.is_empty() && !VARIANT_WORDS.contains(w))
        .collect::<Vec<_>>()
        .join("-")
}

/// The preset a `peakfit.io/model` value names, case-insensitively, by name or alias.
pub fn find(name: &str) -> Option<&'static Preset> {
    let wanted = normalise(name);
    PRESETS
        .iter()
        .find(|p| normalise(p.name) == wanted || p.aliases.iter().any(|a| normalise(a) == wanted))
}

/// The preset table as Markdown, one row per preset, as the module documentation (and the
/// README's annotation reference) shows it.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| preset | aliases | params | layers | hidden | heads | kv | head-dim | ffn | vocab | tied | experts |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in PRESETS {
        let aliases = p
            .aliases
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let params = if p.params >= 1_000_000_000 {
            format!("{}B", trim(p.params as f64 / 1e9))
        } else {
            format!("{}M", trim(p.params as f64 / 1e6))
        };
        let shape = match p.shape {
            Some(a) => format!(
                "{} | {} | {} | {} | {} | {} | {} | {}",
                a.layers,
                a.hidden_size,
                a.attention_heads,
                a.kv_heads,
                a.head_dim,
                a.intermediate_size,
                a.vocab_size,
                if a.tied_embeddings { "yes" } else { "no" }
            ),
            None => ["–"; 8].join(" | "),
        };
        let experts = if p.experts > 0 {
            format!("{} ({} per token)", p.experts, p.experts_per_token)
        } else {
            "–".into()
        };
        out.push_str(&format!(
            "| `{}` | {aliases} | {params} | {shape} | {experts} |\n",
            p.name
        ));
    }
    out
}

/// `8.030` -> `8.03`, `7.000` -> `7`.
fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Stands in for "diffusion" in a parsed `peakfit.io/architecture` until the preset supplies
/// the real parts (the parser refuses the annotation without a diffusion preset).
pub const PLACEHOLDER_DIFFUSION: Diffusion = Diffusion {
    denoiser_params: 0,
    text_encoder_params: 0,
    largest_text_encoder_params: 0,
    vae_params: 0,
    dit_hidden: 0,
    pixels_per_token: 8,
    vae_upcast: false,
    default_image: 512,
    guidance: true,
};

/// The diffusion presets, for error messages.
pub fn diffusion_names() -> String {
    PRESETS
        .iter()
        .filter(|p| matches!(p.kind, Kind::Diffusion(_)))
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The names `peakfit.io/model` accepts, for error messages.
pub fn names() -> String {
    PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_presets_by_name_alias_and_checkpoint_name() {
        assert_eq!(find("llama-3.1-8b").unwrap().name, "llama-3.1-8b");
        assert_eq!(find("Llama-3-8B").unwrap().name, "llama-3.1-8b");
        assert_eq!(find("Qwen-7B-Chat (v1)").unwrap().name, "qwen-7b-v1");
        assert_eq!(find("Qwen-72B-Chat-Int4 (v1)").unwrap().name, "qwen-72b-v1");
        assert_eq!(
            find("BERT-large (bert-large-uncased)").unwrap().name,
            "bert-large"
        );
        assert_eq!(find("OctoCoder-15.5B").unwrap().name, "starcoder-15.5b");
        assert_eq!(find("SDXL-base-1.0").unwrap().name, "sdxl-base-1.0");
        assert_eq!(find("Llama-2-7b-hf").unwrap().name, "llama-2-7b");
        assert!(find("llama-9-1t").is_none());
    }

    #[test]
    fn every_model_in_the_validation_data_has_a_preset() {
        for model in [
            "Llama-2-7B",
            "Llama-2-70B",
            "Falcon-40B",
            "Phi-1.5",
            "StableLM-Base-Alpha-3B",
            "OctoCoder-15.5B",
            "Qwen3-0.6B",
            "Qwen3-4B",
            "Qwen3-8B",
            "Qwen3-32B",
            "Qwen-7B-Chat (v1)",
            "Qwen-72B-Chat (v1)",
            "Whisper-large-v2",
            "SDXL-base-1.0",
            "BERT-large (bert-large-uncased)",
            "Llama-3.2-11B-Vision",
            "Llama-3.1-8B",
            "Llama-3-8B",
            "Qwen-7B (v1)",
            "Qwen-7B-Chat-Int4 (v1)",
            "Qwen-1.8B (v1)",
            "Qwen-72B-Chat-Int4 (v1)",
            "mt0-xxl",
            "bloomz-7b1",
        ] {
            assert!(find(model).is_some(), "no preset for {model}");
        }
    }

    #[test]
    fn module_doc_table_matches_the_presets() {
        let source = include_str!("presets.rs");
        let doc: String = source
            .lines()
            .filter_map(|l| l.strip_prefix("//! "))
            .collect::<Vec<_>>()
            .join("\n");
        for row in markdown_table().lines() {
            assert!(
                doc.contains(row),
                "module doc lacks the row\n{row}\nexpected table:\n{}",
                markdown_table()
            );
        }
    }

    #[test]
    fn names_are_unique_after_normalising() {
        let mut seen = std::collections::BTreeSet::new();
        for p in PRESETS {
            for n in std::iter::once(p.name).chain(p.aliases.iter().copied()) {
                assert!(seen.insert(normalise(n)), "{n} is ambiguous");
            }
        }
    }

    #[test]
    fn preset_params_match_their_shapes() {
        // A preset's parameter count should be what its shape implies (within 12 %: the shape
        // formula ignores biases, norms and vision towers), or a typo slipped in.
        for p in PRESETS {
            let Some(a) = p.shape else { continue };
            let (h, l, v) = (
                f64::from(a.hidden_size),
                f64::from(a.layers),
                f64::from(a.vocab_size),
            );
            let attn = h * f64::from(a.attention_heads * a.head_dim) * 2.0
                + h * f64::from(a.kv_heads * a.head_dim) * 2.0;
            // Gated (SwiGLU) models list the per-branch width, which is not 4h.
            let gated = a.intermediate_size != 4 * a.hidden_size;
            let ffn = h * f64::from(a.intermediate_size) * if gated { 3.0 } else { 2.0 };
            // A mixture of experts holds every expert and a router per layer.
            let ffn = if p.experts > 0 {
                f64::from(p.experts) * (ffn + h)
            } else {
                ffn
            };
            let emb = v * h * if a.tied_embeddings { 1.0 } else { 2.0 };
            let implied = l * (attn + ffn) + emb;
            let ratio = implied / p.params as f64;
            if [
                "t0-3b",
                "mt0-xxl",
                "whisper-large-v2",
                "whisper-medium",
                "falcon-40b",
                "falcon-7b",
            ]
            .contains(&p.name)
            {
                continue; // encoder-decoder / parallel-attention layouts: not this formula
            }
            assert!(
                (0.88..1.12).contains(&ratio),
                "{}: implied {implied:e} vs {}",
                p.name,
                p.params
            );
        }
    }
}
