//! Shapes and specs the child modules' tests share.

use super::block::{Block, Mlp, Pass};
use crate::model::estimate::{Inputs, ModelType};

pub(super) fn llama_1b() -> Block {
    Block {
        h: 2048.0,
        q: 2048.0,
        kv: 512.0,
        heads: 32.0,
        ffn: 8192.0,
        vocab: 128_256.0,
        layers: 16.0,
        mlp: Mlp::Gated,
        family: ModelType::Llama,
        experts_per_token: 0.0,
        experts: 0.0,
        sliding_window: 0.0,
    }
}

pub(super) fn pass(b: f64, s: f64) -> Pass {
    Pass {
        b,
        s,
        c: 2.0,
        sdpa: true,
        half: false,
    }
}

pub(super) fn falcon_7b() -> Block {
    Block {
        h: 4544.0,
        q: 4544.0,
        kv: 64.0,
        heads: 71.0,
        ffn: 18176.0,
        vocab: 65024.0,
        layers: 32.0,
        mlp: Mlp::Plain,
        family: ModelType::Falcon,
        experts_per_token: 0.0,
        experts: 0.0,
        sliding_window: 0.0,
    }
}

pub(super) const GIB: f64 = 1_073_741_824.0;

/// Phi-3-mini-4k's `config.json` as annotations (`sliding_window` 2,047), a bf16 `generate`
/// at batch 2 with `extra` (the context among them).
pub(super) fn phi3_mini_4k(extra: &[(&str, &str)]) -> Inputs {
    let mut pairs = vec![
        ("layers", "32"),
        ("hidden-size", "3072"),
        ("attention-heads", "32"),
        ("kv-heads", "32"),
        ("head-dim", "96"),
        ("intermediate-size", "8192"),
        ("vocab-size", "32064"),
        ("tied-embeddings", "false"),
        ("params", "3821079552"),
        ("dtype", "bf16"),
        ("model-type", "phi3"),
        ("sliding-window", "2047"),
        ("engine", "hf"),
        ("workload", "inference"),
        ("batch", "2"),
    ];
    pairs.extend(extra);
    super::super::resolve(
        &crate::model::estimate::testing::spec(&pairs),
        &mut Vec::new(),
    )
}
