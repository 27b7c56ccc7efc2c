//! `config.json` files of thirteen public model families (tests/data/model-configs, sources in
//! SOURCES.md there) read into annotations: the derived parameter count matches the published
//! one, the fields that change memory are read, and the result estimates.

use std::collections::BTreeMap;
use std::path::Path;

use peakfit::model::hf_config::{ConfigError, annotations};
use peakfit::model::{Spec, estimate};

fn config(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/model-configs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read(name: &str) -> BTreeMap<String, String> {
    annotations(&config(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .annotations
}

#[test]
fn derived_parameter_counts_match_the_published_ones() {
    for (file, published, tolerance) in [
        ("llama-3.1-8b.json", 8.03e9, 0.01),
        ("mistral-7b-v0.1.json", 7.24e9, 0.01),
        ("qwen2.5-7b.json", 7.61e9, 0.01),
        ("qwen2.5-7b-instruct-awq.json", 7.61e9, 0.01),
        ("gemma-2-9b.json", 9.24e9, 0.01),
        ("phi-3-mini-4k-instruct.json", 3.82e9, 0.01),
        ("falcon-7b.json", 6.92e9, 0.02),
        ("mixtral-8x7b-v0.1.json", 46.7e9, 0.01),
        ("gpt2.json", 124e6, 0.02),
        // Position and token-type embeddings and the pooler are not counted: 1.5 % low.
        ("bert-base-uncased.json", 110e6, 0.03),
        ("t5-base.json", 223e6, 0.02),
        ("whisper-large-v3.json", 1.55e9, 0.03),
        ("llama-3.2-11b-vision.json", 10.6e9, 0.05),
    ] {
        let a = read(file);
        let params: f64 = a["params"].parse().unwrap();
        assert!(
            (params / published - 1.0).abs() < tolerance,
            "{file}: derived {params:e}, published {published:e}"
        );
        // Every result is a valid, estimable pod description.
        let prefixed: BTreeMap<String, String> = a
            .iter()
            .map(|(k, v)| (format!("peakfit.io/{k}"), v.clone()))
            .collect();
        let spec = Spec::parse(&prefixed).unwrap_or_else(|e| panic!("{file}: {e}"));
        let e = estimate(&spec, 80 << 30);
        // At least half a byte per parameter (4-bit weights) and more than the context.
        assert!(e.per_gpu_bytes as f64 > 0.5 * params, "{file}");
    }
}

#[test]
fn memory_relevant_fields_are_read() {
    let llama = read("llama-3.1-8b.json");
    assert_eq!(llama["kv-heads"], "8");
    assert_eq!(llama["dtype"], "bf16");
    assert_eq!(llama["tied-embeddings"], "false");
    assert_eq!(llama["architecture"], "decoder");
    assert_eq!(read("gemma-2-9b.json")["head-dim"], "256");
    assert_eq!(read("gemma-2-9b.json")["tied-embeddings"], "true");
    assert_eq!(read("gemma-2-9b.json")["dtype"], "fp32");
    assert_eq!(read("falcon-7b.json")["kv-heads"], "1");
    assert_eq!(read("falcon-7b.json")["intermediate-size"], "18176");
    assert_eq!(read("gpt2.json")["tied-embeddings"], "true");
    assert_eq!(read("qwen2.5-7b-instruct-awq.json")["dtype"], "int4-awq");
    assert_eq!(read("bert-base-uncased.json")["architecture"], "encoder");
    let whisper = read("whisper-large-v3.json");
    assert_eq!(whisper["architecture"], "encoder-decoder");
    assert_eq!(whisper["layers"], "64");
    assert_eq!(read("t5-base.json")["layers"], "24");
    let mixtral = annotations(&config("mixtral-8x7b-v0.1.json")).unwrap();
    assert!(
        mixtral
            .notes
            .iter()
            .any(|n| n.contains("8 experts") && n.contains("2 per token"))
    );
    let mistral = annotations(&config("mistral-7b-v0.1.json")).unwrap();
    assert!(
        mistral
            .notes
            .iter()
            .any(|n| n.contains("sliding_window 4096"))
    );
    let vision = annotations(&config("llama-3.2-11b-vision.json")).unwrap();
    assert!(vision.notes.iter().any(|n| n.contains("vision tower")));
    assert_eq!(vision.annotations["layers"], "40");
}

#[test]
fn a_config_that_cannot_size_the_model_is_refused_naming_the_field() {
    assert!(matches!(
        annotations("[1, 2]"),
        Err(ConfigError::NotJson(_))
    ));
    assert!(matches!(annotations("{"), Err(ConfigError::NotJson(_))));
    let e = annotations(r#"{"hidden_size": 4096, "num_attention_heads": 32}"#).unwrap_err();
    assert!(e.to_string().contains("vocab_size"), "{e}");
    let e = annotations(r#"{"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 10}"#)
        .unwrap_err();
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    let e = annotations(r#"{"hidden_size": -1}"#).unwrap_err();
    assert!(
        e.to_string().contains("hidden_size") && e.to_string().contains("-1"),
        "{e}"
    );
    let e = annotations(
        r#"{"hidden_size": 8, "num_attention_heads": 1, "vocab_size": 8, "num_hidden_layers": 1,
            "quantization_config": {"quant_method": "hqq"}}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("quant_method") && e.to_string().contains("hqq"),
        "{e}"
    );
}
