//! How far to trust an estimate: the workload kind a pod belongs to and the error the model
//! showed on real-GPU measurements of that kind (`tests/estimate_accuracy.rs` over
//! `../shared/data/memory-validation.csv`, `tests/data/memory-measurements.csv` and the rows
//! measured for peakfit in `tests/data/h200`, `h100`, `h200b`, `h200c`, `h200d` and `h200e` (of
//! the last two, the rows not planned from their Gemma-2 results), which checks this table against what it measures). The oracle
//! grid (`tests/data/oracle-grid.csv`) is exact for allocated tensors but is no GPU: it is
//! reported beside these (README, "Accuracy"), not counted in them.

use serde::Serialize;

use super::annotations::{Engine, Offload, Spec, Workload};
use super::presets::Kind;

/// The error band measured for one workload kind, in percent of the measured peak.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Band {
    pub kind: &'static str,
    pub rows: usize,
    /// Median |error|.
    pub median: f64,
    /// 90th percentile |error|.
    pub p90: f64,
    /// Median signed error: negative means the model predicts less than was used.
    pub signed_median: f64,
}

/// Measured with `cargo test -p peakfit --test estimate_accuracy -- --include-ignored
/// --nocapture` (the "every real-GPU row" table).
pub const MEASURED: &[Band] = &[
    band("diffusion", 12, 5.3, 29.4, -4.9),
    band("encoder", 18, 4.6, 8.6, 3.1),
    band("encoder-decoder", 20, 1.9, 18.7, 1.8),
    band("fraction-engine", 4, 0.0, 1.1, 0.0),
    band("inference", 145, 4.2, 20.2, 3.3),
    band("lora", 65, 1.9, 10.3, 0.0),
    band("offload", 2, 3.9, 4.2, -4.2),
    band("qlora", 14, 12.9, 51.0, -0.5),
    band("sharded-training", 22, 4.9, 16.1, 3.0),
    band("training", 89, 1.7, 10.8, 0.1),
];

const fn band(kind: &'static str, rows: usize, median: f64, p90: f64, signed: f64) -> Band {
    Band {
        kind,
        rows,
        median,
        p90,
        signed_median: signed,
    }
}

/// The workload kind of a spec; the first that applies wins, so a sharded LoRA run is
/// `sharded-training` and an offloaded one `offload`.
pub fn workload_kind(spec: &Spec) -> &'static str {
    let more_than_one = |n: Option<u32>| n.is_some_and(|n| n > 1);
    let training = spec.workload.is_some_and(Workload::is_training);
    match spec.kind() {
        Kind::Diffusion(_) => "diffusion",
        _ if spec.offload.is_some_and(|o| o != Offload::None) => "offload",
        Kind::EncoderDecoder { .. } => "encoder-decoder",
        Kind::Encoder => "encoder",
        _ if matches!(spec.engine, Some(Engine::Fraction(_))) => "fraction-engine",
        _ if training
            && (more_than_one(spec.data_parallel)
                || more_than_one(spec.tensor_parallel)
                || more_than_one(spec.pipeline_parallel)
                || more_than_one(spec.context_parallel)) =>
        {
            "sharded-training"
        }
        Kind::Decoder => spec.workload.unwrap_or(Workload::Inference).name(),
    }
}

/// `good`: median <= 10 % and p90 <= 10 % over real-GPU rows; `fair`: median <= 25 %; else
/// `poor` (give `peakfit.io/vram`). Under-prediction is the dangerous side, so a kind biased low
/// by more than 10 % is never `good`.
pub fn class(b: &Band) -> &'static str {
    if b.median <= 10.0 && b.p90 <= 10.0 && b.signed_median >= -10.0 {
        "good"
    } else if b.median <= 25.0 {
        "fair"
    } else {
        "poor"
    }
}

/// The measured band for a spec's workload kind, if any row of that kind was measured.
pub fn band_for(spec: &Spec) -> Option<&'static Band> {
    let kind = workload_kind(spec);
    MEASURED.iter().find(|b| b.kind == kind)
}
