//! The peak-memory model against the oracle grid (`tests/data/oracle-grid.csv`): the exact
//! `torch.cuda.max_memory_allocated` of hundreds of Hugging Face workloads, worked out without a
//! GPU by `tools/oracle` (transformers' own code on fake tensors; it matches all 20 H200 rows
//! within 0.23 %: `docs/oracle.md`). No torch here: CI checks the Rust model against the
//! committed rows; `scripts/oracle --check` regenerates a sample for whoever has the venv.
//!
//! Each row is estimated as an ML team would ask: the model's `config.json`
//! (`tests/data/oracle-configs/`, `peakfit estimate --model-config`) plus the workload's
//! annotations (`engine: hf`; `attention: eager` is `flash-attention: false`). Allocated bytes
//! against allocated bytes.
//!
//! The bars (issue 20): median |model − oracle| <= 4 %, p90 <= 10 %, and on every row
//! (inference, training, LoRA) the model never more than 5 % below the oracle
//! (under-prediction OOM-kills a neighbour).

mod model_rows;

use std::collections::BTreeMap;

use peakfit::model::estimate;
use peakfit::model::quantity::GIB;

/// Rows the model is known to miss, with what is missing: reported, not hidden (they are in
/// the median and p90 above and printed among the largest differences), and each one an issue
/// of its own rather than a term tuned to it. Empty since issue 20's hunt: Falcon's always-built
/// causal mask and SDPA's conversion of a boolean mask (`hf.rs`, "prefill, SDPA's mask") closed
/// Falcon at 32k (-28 %) and Mistral v0.1 eight windows long (-7.7 %).
const KNOWN_GAPS: &[(&str, &str)] = &[];

struct Row {
    id: String,
    workload: String,
    oracle: f64,
    model: f64,
    /// The model with `prompt-tokens` annotated, for a generation.
    with_prompt: Option<f64>,
}

impl Row {
    fn error(&self) -> f64 {
        (self.model - self.oracle) / self.oracle * 100.0
    }
}

fn rows() -> Vec<Row> {
    model_rows::oracle_grid()
        .into_iter()
        .map(|r| Row {
            model: estimate(&r.spec, 141 << 30).allocated_bytes as f64 / GIB,
            with_prompt: r
                .with_prompt
                .map(|s| estimate(&s, 141 << 30).allocated_bytes as f64 / GIB),
            oracle: r.oracle_gib,
            workload: r.workload,
            id: r.id,
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank =
        peakfit::convert::f64_to_usize((p * sorted.len() as f64).ceil()).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Median and p90 of |error|, median, lowest and highest signed error, in percent.
struct Bands {
    median: f64,
    p90: f64,
    signed: f64,
    min: f64,
    max: f64,
}

impl Bands {
    fn of(errors: &[f64]) -> Self {
        let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
        let mut signed = errors.to_vec();
        abs.sort_by(f64::total_cmp);
        signed.sort_by(f64::total_cmp);
        Self {
            median: percentile(&abs, 0.5),
            p90: percentile(&abs, 0.9),
            signed: percentile(&signed, 0.5),
            min: signed[0],
            max: signed[signed.len() - 1],
        }
    }
}

#[test]
fn estimate_matches_the_oracle_grid() {
    let rows = rows();
    assert!(rows.len() >= 400, "the grid has {} rows", rows.len());
    let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in &rows {
        by.entry(r.workload.as_str()).or_default().push(r.error());
        by.entry("all").or_default().push(r.error());
    }
    println!(
        "{:<10} {:>5} {:>8} {:>8} {:>8} {:>8}",
        "workload", "rows", "median", "p90", "signed", "min"
    );
    for (workload, errors) in &by {
        let b = Bands::of(errors);
        println!(
            "{workload:<10} {:>5} {:>7.1}% {:>7.1}% {:>+7.1}% {:>+7.1}%",
            errors.len(),
            b.median,
            b.p90,
            b.signed,
            b.min
        );
    }
    let mut worst: Vec<&Row> = rows.iter().collect();
    worst.sort_by(|a, b| b.error().abs().total_cmp(&a.error().abs()));
    println!("largest differences:");
    for r in worst.iter().take(40) {
        println!(
            "  {:<58} oracle {:>8.3} model {:>8.3} {:>+6.1}%",
            r.id,
            r.oracle,
            r.model,
            r.error()
        );
    }
    // Generations whose prompt is shorter than the context, with and without `prompt-tokens`
    // (the default sizes the prefill for the whole context).
    let prompted: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| {
            r.with_prompt
                .map(|m| (r.error(), (m - r.oracle) / r.oracle * 100.0))
        })
        .collect();
    for (label, pick) in [
        ("generate rows, prefill over the context", 0),
        ("generate rows, prompt-tokens annotated", 1),
    ] {
        let errors: Vec<f64> = prompted
            .iter()
            .map(|e| if pick == 0 { e.0 } else { e.1 })
            .collect();
        let b = Bands::of(&errors);
        println!(
            "{label}: {} rows, median {:.1}%, p90 {:.1}%, signed {:+.1}%, min {:+.1}%, max {:+.1}%",
            errors.len(),
            b.median,
            b.p90,
            b.signed,
            b.min,
            b.max
        );
        assert!(b.min >= -5.0, "{label}: a row {:.1}% low", b.min);
    }
    let mut abs: Vec<f64> = rows.iter().map(|r| r.error().abs()).collect();
    abs.sort_by(f64::total_cmp);
    let (median, p90) = (percentile(&abs, 0.5), percentile(&abs, 0.9));
    assert!(median <= 4.0, "median |model - oracle| {median:.1}% > 4%");
    assert!(p90 <= 10.0, "p90 |model - oracle| {p90:.1}% > 10%");
    for r in &rows {
        if KNOWN_GAPS
            .iter()
            .any(|(prefix, _)| r.id.starts_with(prefix))
        {
            continue;
        }
        assert!(
            r.error() >= -5.0,
            "{}: the model is {:.1}% below the oracle",
            r.id,
            r.error()
        );
    }
}
