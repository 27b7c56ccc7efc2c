//! A model described the way ML teams already have it: its Hugging Face `config.json`, read
//! into the `peakfit.io/*` annotations that size it. Pure: the caller reads the file (the CLI
//! with a size cap); this parses a string.
//!
//! | annotation | read from (first present) |
//! |---|---|
//! | `layers` | `num_hidden_layers` `n_layer` `num_layers`; encoder-decoder: `encoder_layers + decoder_layers`, T5 `num_layers + num_decoder_layers` |
//! | `hidden-size` | `hidden_size` `n_embd` `d_model` |
//! | `attention-heads` | `num_attention_heads` `n_head` `num_heads` `encoder_attention_heads` |
//! | `kv-heads` | 1 with `multi_query` (unless `new_decoder_architecture`), else `num_key_value_heads` `num_kv_heads`, else the heads; Falcon with `new_decoder_architecture` caches every head (`params` still counts `num_kv_heads` projections) |
//! | `head-dim` | `head_dim` `d_kv`, else hidden / heads |
//! | `vocab-size` | `vocab_size` (required) |
//! | `intermediate-size` | `intermediate_size` `n_inner` `d_ff` `ffn_dim` `encoder_ffn_dim` `ffn_hidden_size`, else 4 x hidden; per expert for mixture-of-experts (`moe_intermediate_size`) |
//! | `experts` | `num_local_experts` `num_experts` `n_routed_experts`, when above 1 |
//! | `tied-embeddings` | `tie_word_embeddings` (Hugging Face's default: true) |
//! | `residual-dropout` | `resid_pdrop` of a `gpt2` or `phi` config (the layers whose replay reads it), else its class's default (`GPT2Config` 0.1, `PhiConfig` 0) |
//! | `dtype` | `quantization_config` (`awq`, `gptq` 4/8 bits, `bitsandbytes` 4-bit with or without double quantisation / 8-bit, `fp8`), else `torch_dtype` / `dtype` |
//! | `architecture` | `is_encoder_decoder` or encoder and decoder layer counts: `encoder-decoder`; BERT-family `model_type`: `encoder`; else `decoder` |
//! | `params` | derived: attention (q, o by heads; k, v by kv heads) + MLP (3 matrices when gated, x experts, + router) per layer, embeddings (one when tied), a vision tower's layers (`vision_config`) and an encoder-decoder's cross-attention |
//!
//! Multimodal configs (`text_config` + `vision_config`, Llama 3.2 Vision, LLaVA) size the
//! language model from `text_config` and add the vision tower's parameters. All experts of a
//! mixture-of-experts model are resident, so they all count; experts per token
//! (`num_experts_per_tok`) and a `sliding_window` are reported in the notes, not used: the
//! KV cache is sized for the whole context (an upper bound for a rolling cache).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// A `config.json` that cannot be read: what is wrong and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not a JSON object: {0}")]
    NotJson(String),
    #[error("config.json lacks {field}: {why}")]
    Missing {
        field: &'static str,
        why: &'static str,
    },
    #[error("config.json field {field}: {value} is not valid: {allowed}")]
    Invalid {
        field: String,
        value: String,
        allowed: String,
    },
}

/// The annotations a config implies, without the `peakfit.io/` prefix, and notes for the reader.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FromConfig {
    pub annotations: BTreeMap<String, String>,
    pub notes: Vec<String>,
}

/// BERT-family model types: bidirectional encoders.
const ENCODERS: &[&str] = &[
    "bert",
    "roberta",
    "xlm-roberta",
    "deberta",
    "deberta-v2",
    "electra",
    "distilbert",
    "albert",
    "modernbert",
];

/// Model types whose MLP is gated (three matrices: gate, up, down).
const GATED: &[&str] = &[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo",
    "olmo2",
    "deepseek_v2",
    "deepseek_v3",
    "cohere",
    "granite",
    "internlm2",
    "yi",
    "mllama",
    "mllama_text_model",
    "starcoder2",
];

/// The largest value a field may hold: the range of the annotation it becomes (so an error names
/// the config field, not an annotation the user never wrote), and small enough that the
/// parameter arithmetic below cannot overflow (`heads · head_dim`, `4 · hidden`, the layer sums).
fn max_for(name: &str) -> u64 {
    match name {
        "num_hidden_layers"
        | "n_layer"
        | "num_layers"
        | "depth"
        | "layers"
        | "num_global_layers"
        | "num_experts_per_tok"
        | "moe_topk" => 1024,
        "encoder_layers" | "decoder_layers" | "num_decoder_layers" => 512,
        "num_attention_heads"
        | "n_head"
        | "num_heads"
        | "encoder_attention_heads"
        | "num_key_value_heads"
        | "num_kv_heads"
        | "head_dim"
        | "d_kv" => 4096,
        "hidden_size" | "n_embd" | "d_model" | "embed_dim" | "width" | "max_source_positions" => {
            1 << 20
        }
        "intermediate_size"
        | "n_inner"
        | "d_ff"
        | "ffn_dim"
        | "encoder_ffn_dim"
        | "ffn_hidden_size"
        | "moe_intermediate_size" => 1 << 22,
        "num_local_experts" | "num_experts" | "n_routed_experts" => 1 << 16,
        "sliding_window" => 1 << 26,
        _ => 1 << 24,
    }
}

fn uint(obj: &Map<String, Value>, names: &[&str]) -> Result<Option<u64>, ConfigError> {
    for name in names {
        match obj.get(*name) {
            None | Some(Value::Null) => {}
            Some(v) => {
                let max = max_for(name);
                return v
                    .as_u64()
                    .filter(|n| (1..=max).contains(n))
                    .map(Some)
                    .ok_or_else(|| ConfigError::Invalid {
                        field: (*name).to_string(),
                        value: clip(&v.to_string()),
                        allowed: format!("a whole number from 1 to {max}"),
                    });
            }
        }
    }
    Ok(None)
}

/// A config value as an error quotes it: at most 256 bytes (a hostile file cannot make an error
/// message as large as itself).
fn clip(value: &str) -> String {
    const MAX: usize = 256;
    if value.len() <= MAX {
        return value.to_owned();
    }
    let mut end = MAX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[{} more bytes]", &value[..end], value.len() - end)
}

fn text(obj: &Map<String, Value>, name: &str) -> Option<String> {
    obj.get(name)
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
}

fn flag(obj: &Map<String, Value>, name: &str) -> Option<bool> {
    obj.get(name).and_then(Value::as_bool)
}

/// The dtype annotation for a config's quantisation or storage type.
fn dtype(
    root: &Map<String, Value>,
    text_cfg: &Map<String, Value>,
) -> Result<Option<&'static str>, ConfigError> {
    match root.get("quantization_config") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(other) => {
            return Err(ConfigError::Invalid {
                field: "quantization_config".into(),
                value: clip(&other.to_string()),
                allowed: "an object with quant_method (awq, gptq, bitsandbytes, fp8)".into(),
            });
        }
    }
    if let Some(q) = root.get("quantization_config").and_then(Value::as_object) {
        let method = text(q, "quant_method").unwrap_or_default();
        let bits = q.get("bits").and_then(Value::as_u64);
        let invalid = |allowed: &str| ConfigError::Invalid {
            field: "quantization_config.quant_method".into(),
            value: format!("{method:?} (bits {bits:?})"),
            allowed: allowed.into(),
        };
        return Ok(Some(match method.as_str() {
            "awq" => "int4-awq",
            "gptq" => match bits {
                Some(8) => "int8",
                Some(4) | None => "int4-gptq",
                _ => return Err(invalid("gptq with 4 or 8 bits")),
            },
            "bitsandbytes" => {
                if flag(q, "load_in_4bit") == Some(true) {
                    if flag(q, "bnb_4bit_use_double_quant") == Some(true) {
                        "nf4-dq"
                    } else {
                        "nf4"
                    }
                } else if flag(q, "load_in_8bit") == Some(true) {
                    "int8"
                } else {
                    return Err(invalid("bitsandbytes with load_in_4bit or load_in_8bit"));
                }
            }
            "fp8" | "fbgemm_fp8" => "fp8",
            _ => {
                return Err(invalid(
                    "one of awq gptq bitsandbytes fp8 (or give peakfit.io/dtype)",
                ));
            }
        }));
    }
    let field = ["torch_dtype", "dtype"]
        .into_iter()
        .find(|f| root.get(*f).is_some_and(|v| !v.is_null()))
        .map(|f| (f, root))
        .or_else(|| {
            text_cfg
                .get("torch_dtype")
                .filter(|v| !v.is_null())
                .map(|_| ("text_config.torch_dtype", text_cfg))
        });
    let Some((name, obj)) = field else {
        return Ok(None);
    };
    let key = name.rsplit('.').next().unwrap_or(name);
    let value = obj.get(key).cloned().unwrap_or(Value::Null);
    // An unknown storage type is refused, not sized as 16 bits: float64 is four times bf16.
    Ok(Some(
        match value.as_str().map(str::to_ascii_lowercase).as_deref() {
            Some("float32" | "fp32") => "fp32",
            Some("float16" | "fp16" | "half") => "fp16",
            Some("bfloat16" | "bf16") => "bf16",
            // "auto" means the checkpoint's own type, which the file does not say.
            Some("auto") => return Ok(None),
            _ => {
                return Err(ConfigError::Invalid {
                    field: name.into(),
                    value: clip(&value.to_string()),
                    allowed: "float32, float16 or bfloat16 (or give peakfit.io/dtype)".into(),
                });
            }
        },
    ))
}

/// Parses a `config.json` text into annotations.
pub fn annotations(json: &str) -> Result<FromConfig, ConfigError> {
    let value: Value =
        serde_json::from_str(json).map_err(|e| ConfigError::NotJson(e.to_string()))?;
    let root = value
        .as_object()
        .ok_or_else(|| ConfigError::NotJson("the top level is not an object".into()))?;
    let model_type = text(root, "model_type").unwrap_or_default();
    let cfg = match root.get("text_config") {
        None | Some(Value::Null) => root,
        Some(Value::Object(t)) => t,
        Some(other) => {
            return Err(ConfigError::Invalid {
                field: "text_config".into(),
                value: clip(&other.to_string()),
                allowed: "an object (the language model's own config)".into(),
            });
        }
    };
    let inner_type = text(cfg, "model_type").unwrap_or_else(|| model_type.clone());
    let mut notes = Vec::new();

    let hidden = uint(cfg, &["hidden_size", "n_embd", "d_model"])?.ok_or(ConfigError::Missing {
        field: "hidden_size",
        why: "also read as n_embd or d_model",
    })?;
    let vocab = uint(cfg, &["vocab_size"])?.ok_or(ConfigError::Missing {
        field: "vocab_size",
        why: "needed for the embeddings and logits",
    })?;
    let heads = uint(
        cfg,
        &[
            "num_attention_heads",
            "n_head",
            "num_heads",
            "encoder_attention_heads",
        ],
    )?
    .ok_or(ConfigError::Missing {
        field: "num_attention_heads",
        why: "also read as n_head, num_heads or encoder_attention_heads",
    })?;
    let enc = uint(cfg, &["encoder_layers"])?;
    let dec = uint(cfg, &["decoder_layers", "num_decoder_layers"])?;
    let plain = uint(cfg, &["num_hidden_layers", "n_layer", "num_layers"])?;
    let encoder_decoder = flag(root, "is_encoder_decoder") == Some(true)
        || enc.is_some()
        || (dec.is_some() && plain.is_some());
    let (layers, decoder_layers) = match (enc, dec, plain) {
        (Some(e), Some(d), _) => (e + d, d),
        (None, d, Some(n)) if encoder_decoder => (n + d.unwrap_or(n), d.unwrap_or(n)),
        (_, _, Some(n)) => (n, 0),
        _ => {
            return Err(ConfigError::Missing {
                field: "num_hidden_layers",
                why: "also read as n_layer, num_layers, or encoder_layers + decoder_layers",
            });
        }
    };
    // Multi-query attention has one kv head whatever `num_kv_heads` says: transformers'
    // `FalconConfig` fills `num_kv_heads` with the heads when unset (so a `save_pretrained`
    // config carries 71 for Falcon-7B), and `FalconAttention` takes
    // `config.num_kv_heads if (new_decoder_architecture or not multi_query) else 1`.
    let multi_query = flag(cfg, "multi_query") == Some(true)
        && flag(cfg, "new_decoder_architecture") != Some(true);
    let kv = match uint(cfg, &["num_key_value_heads", "num_kv_heads"])? {
        _ if multi_query => 1,
        Some(kv) => kv,
        None => heads,
    };
    let head_dim = uint(cfg, &["head_dim", "d_kv"])?.unwrap_or((hidden / heads).max(1));
    let experts = uint(
        cfg,
        &["num_local_experts", "num_experts", "n_routed_experts"],
    )?
    .unwrap_or(1);
    let ffn = if experts > 1 {
        uint(cfg, &["moe_intermediate_size", "intermediate_size"])?
    } else {
        uint(
            cfg,
            &[
                "intermediate_size",
                "n_inner",
                "d_ff",
                "ffn_dim",
                "encoder_ffn_dim",
                "ffn_hidden_size",
            ],
        )?
    }
    .unwrap_or(4 * hidden);
    let mut experts_per_token = None;
    if experts > 1 {
        let per_token = uint(cfg, &["num_experts_per_tok", "moe_topk"])?;
        experts_per_token = per_token;
        notes.push(format!(
            "mixture of experts: {experts} experts resident (all counted), {} per token",
            per_token.map_or("?".into(), |n| n.to_string())
        ));
    }
    let sliding =
        uint(cfg, &["sliding_window"])?.filter(|_| flag(cfg, "use_sliding_window") != Some(false));
    if let Some(w) = sliding {
        notes.push(format!(
            "sliding_window {w}: its mask counts past {w} tokens; the KV cache is sized for the whole context (an \
             upper bound for a rolling cache)"
        ));
    }
    let tied = flag(root, "tie_word_embeddings")
        .or_else(|| flag(cfg, "tie_word_embeddings"))
        .unwrap_or(true);
    let gated = GATED.contains(&inner_type.as_str())
        || text(cfg, "feed_forward_proj").is_some_and(|p| p.starts_with("gated"));

    let (h, ffn_f) = (hidden as f64, ffn as f64);
    let q = (heads * head_dim) as f64;
    let kvd = (kv * head_dim) as f64;
    let attn = 2.0 * h * q + 2.0 * h * kvd;
    let mlp = if gated { 3.0 } else { 2.0 } * h * ffn_f * experts as f64
        + if experts > 1 { h * experts as f64 } else { 0.0 };
    // Decoder layers of an encoder-decoder also attend to the encoder: one more attention.
    let cross = decoder_layers as f64 * (2.0 * h * q + 2.0 * h * kvd);
    let emb = vocab as f64 * h * if tied { 1.0 } else { 2.0 };
    let mut params = layers as f64 * (attn + mlp) + cross + emb;
    let vision = match root.get("vision_config") {
        None | Some(Value::Null) => None,
        Some(Value::Object(v)) => Some(v),
        Some(other) => {
            return Err(ConfigError::Invalid {
                field: "vision_config".into(),
                value: clip(&other.to_string()),
                allowed: "an object (the vision tower's own config)".into(),
            });
        }
    };
    if let Some(vision) = vision {
        let hv = uint(vision, &["hidden_size", "embed_dim", "width"])?.unwrap_or(0) as f64;
        let lv = uint(vision, &["num_hidden_layers", "depth", "layers"])?.unwrap_or(0)
            + uint(vision, &["num_global_layers"])?.unwrap_or(0);
        let fv = uint(vision, &["intermediate_size"])?.map_or(4.0 * hv, |f| f as f64);
        let tower = lv as f64 * (4.0 * hv * hv + 2.0 * hv * fv);
        notes.push(format!(
            "vision tower: {lv} layers of {hv} ({:.2}B parameters) counted in params",
            tower / 1e9
        ));
        params += tower;
    }

    let architecture = if encoder_decoder {
        "encoder-decoder"
    } else if ENCODERS.contains(&model_type.as_str()) {
        "encoder"
    } else {
        "decoder"
    };
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        a.insert(k.to_string(), v);
    };
    put("architecture", architecture.into());
    put("layers", layers.to_string());
    put("hidden-size", hidden.to_string());
    put("attention-heads", heads.to_string());
    // Falcon's new decoder architecture (Falcon-40B, -180B) projects `num_kv_heads` keys and
    // values (the `params` above count those) but broadcasts them to every head before the
    // cache and SDPA (`FalconAttention.forward`: `expand` and `reshape` to `num_heads` when
    // `new_decoder_architecture`), so the cache and attention hold all the heads.
    let cached_kv = if cfg.get("model_type").and_then(Value::as_str) == Some("falcon")
        && flag(cfg, "new_decoder_architecture") == Some(true)
    {
        heads
    } else {
        kv
    };
    put("kv-heads", cached_kv.to_string());
    put("head-dim", head_dim.to_string());
    put("vocab-size", vocab.to_string());
    put("intermediate-size", ffn.to_string());
    put("tied-embeddings", tied.to_string());
    put(
        "params",
        format!("{}", crate::convert::f64_to_u64(params.round())),
    );
    if let Some(d) = dtype(root, cfg)? {
        put("dtype", d.into());
    }
    if !inner_type.is_empty()
        && inner_type.len() <= 63
        && inner_type
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    {
        put("model-type", inner_type.clone());
    }
    // Whisper's encoder outputs `max_source_positions` frames per 30 s window (1500), whatever
    // the decoder's context: the cross-attention caches are that long.
    if encoder_decoder && let Some(n) = uint(cfg, &["max_source_positions"])? {
        put("encoder-positions", n.to_string());
    }
    if let Some(k) = experts_per_token {
        put("experts-per-token", k.to_string());
    }
    if experts > 1 {
        put("experts", experts.to_string());
    }
    if let Some(w) = sliding {
        put("sliding-window", w.to_string());
    }
    // GPT-2's and Phi's dropout after each block, for the only layers whose replay reads it
    // (other types' `resid_pdrop`, Phi-3's say, would be noise on the pod). A config without it
    // has its class's default, which transformers fills in: `GPT2Config` 0.1, `PhiConfig` 0.0.
    let config_default = match inner_type.as_str() {
        "gpt2" => Some(0.1),
        "phi" => Some(0.0),
        _ => None,
    };
    if let Some(default) = config_default {
        let p = match cfg.get("resid_pdrop") {
            None | Some(Value::Null) => default,
            Some(v) => v
                .as_f64()
                .filter(|p| (0.0..1.0).contains(p))
                .ok_or_else(|| ConfigError::Invalid {
                    field: "resid_pdrop".into(),
                    value: clip(&v.to_string()),
                    allowed: "a probability from 0 up to, not including, 1".into(),
                })?,
        };
        put("residual-dropout", p.to_string());
    }
    Ok(FromConfig {
        annotations: a,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::annotations;

    fn base(extra: &str) -> String {
        format!(
            r#"{{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "vocab_size": 32000{extra}}}"#
        )
    }

    /// `resid_pdrop` becomes `residual-dropout` (GPT-2's and Phi's replays read it); a config
    /// without it says nothing.
    #[test]
    fn resid_pdrop_is_the_residual_dropout() {
        let read = |model_type: &str, extra: &str| {
            annotations(&base(extra).replace("\"llama\"", &format!("\"{model_type}\"")))
                .map(|c| c.annotations.get("residual-dropout").cloned())
        };
        assert_eq!(
            read("gpt2", r#","resid_pdrop":0.1"#),
            Ok(Some("0.1".into()))
        );
        assert_eq!(read("phi", r#","resid_pdrop":0.0"#), Ok(Some("0".into())));
        // Unset, each config class's own default.
        assert_eq!(read("gpt2", ""), Ok(Some("0.1".into())));
        assert_eq!(read("phi", ""), Ok(Some("0".into())));
        // Other layers' `resid_pdrop` (Phi-3's) is not read.
        assert_eq!(read("llama", r#","resid_pdrop":0.1"#), Ok(None));
        for bad in [r#""0.1""#, "1.0", "-0.1"] {
            let e = read("phi", &format!(r#","resid_pdrop":{bad}"#)).unwrap_err();
            assert!(
                matches!(&e, super::ConfigError::Invalid { field, .. } if field == "resid_pdrop"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn unknown_dtypes_and_quantisations_are_refused_naming_the_field() {
        let e = annotations(&base(r#", "torch_dtype": "float64""#)).unwrap_err();
        assert!(
            e.to_string().contains("torch_dtype") && e.to_string().contains("float64"),
            "{e}"
        );
        let e = annotations(&base(r#", "quantization_config": "awq""#)).unwrap_err();
        assert!(e.to_string().contains("quantization_config"), "{e}");
        let e = annotations(&base(r#", "vision_config": [1, 2, 3]"#)).unwrap_err();
        assert!(e.to_string().contains("vision_config"), "{e}");
        let e = annotations(&base(r#", "text_config": "x""#)).unwrap_err();
        assert!(e.to_string().contains("text_config"), "{e}");
        // "auto" is the checkpoint's own type: no dtype annotation, no error.
        assert!(annotations(&base(r#", "torch_dtype": "auto""#)).is_ok());
    }

    #[test]
    fn multi_query_has_one_kv_head_whatever_num_kv_heads_says() {
        // Falcon-7B's config as `save_pretrained` writes it: `num_kv_heads` filled with the heads.
        let falcon = r#"{"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
            "num_attention_heads": 71, "num_kv_heads": 71, "multi_query": true,
            "new_decoder_architecture": false, "vocab_size": 65024}"#;
        assert_eq!(annotations(falcon).unwrap().annotations["kv-heads"], "1");
        // Falcon-40B's new decoder architecture projects 8 KV heads but caches them broadcast
        // to all 128.
        let falcon_40b = r#"{"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60,
            "num_attention_heads": 128, "num_kv_heads": 8, "multi_query": true,
            "new_decoder_architecture": true, "vocab_size": 65024}"#;
        assert_eq!(
            annotations(falcon_40b).unwrap().annotations["kv-heads"],
            "128"
        );
    }

    #[test]
    fn huge_sizes_are_refused_not_wrapped() {
        let e = annotations(
            r#"{"model_type": "whisper", "d_model": 1280, "encoder_layers": 18446744073709551606,
            "decoder_layers": 32, "encoder_attention_heads": 20, "vocab_size": 51866}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("encoder_layers"), "{e}");
        let e = annotations(
            r#"{"hidden_size": 18446744073709551615, "num_hidden_layers": 2,
            "num_attention_heads": 2, "vocab_size": 10}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("hidden_size"), "{e}");
        let e = annotations(&base(r#", "num_experts": 1000000000"#)).unwrap_err();
        assert!(e.to_string().contains("num_experts"), "{e}");
    }
}
