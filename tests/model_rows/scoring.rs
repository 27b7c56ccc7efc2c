//! Scoring real-GPU rows counter by counter (`tests/estimate_h200.rs`, `tests/estimate_h100.rs`,
//! `tests/estimate_h200b.rs`, `tests/estimate_h200c.rs`, `tests/estimate_h200d.rs`):
//! each row's three counters against the model's like quantity, and the per-counter summary.
//!
//! | counter | compared with |
//! |---|---|
//! | `max_allocated_gib` | `allocated_bytes` (tensors) |
//! | `max_reserved_gib` | `reserved_bytes` (tensors + the caching allocator's slack) |
//! | `nvml_gib` | `per_gpu_bytes` (+ CUDA context and loaded kernels: what runs out) |

use peakfit::model::estimate;
use peakfit::model::quantity::GIB;

use super::{H200Row, percentile};

/// One row's three counters, measured and predicted, in GiB.
#[derive(Clone)]
pub struct Scored {
    pub id: String,
    pub workload: String,
    /// (measured, predicted) for allocated, reserved, NVML.
    pub counters: [(f64, f64); 3],
}

pub const COUNTERS: [&str; 3] = ["allocated", "reserved", "nvml"];

/// Which annotations a row is estimated with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Annotations {
    /// The workload columns only: a generate row's prefill is sized over its whole context.
    Default,
    /// Plus `prompt-tokens` where the row's notes state the prompt (every generate row).
    WithPrompt,
}

/// Scores rows as an ML team would ask: `--model-config` plus the row's workload annotations.
pub fn score(rows: Vec<H200Row>, annotations: Annotations) -> Vec<Scored> {
    let gib = |b: u64| b as f64 / GIB;
    rows.into_iter()
        .map(|r| {
            let spec = match (annotations, &r.with_prompt) {
                (Annotations::WithPrompt, Some(with_prompt)) => with_prompt,
                _ => &r.spec,
            };
            let e = estimate(spec, peakfit::convert::f64_to_u64(r.gpu_total_gib * GIB));
            Scored {
                id: r.id,
                workload: r.workload,
                counters: [
                    (r.max_allocated, gib(e.allocated_bytes)),
                    (r.max_reserved, gib(e.reserved_bytes)),
                    (r.nvml, gib(e.per_gpu_bytes)),
                ],
            }
        })
        .collect()
}

/// Signed error in percent of the measurement.
pub fn error((measured, predicted): (f64, f64)) -> f64 {
    (predicted - measured) / measured * 100.0
}

/// `(median |error|, p90 |error|, signed median, rows low by more than 10 %)`.
pub fn summary(errors: &[f64]) -> (f64, f64, f64, usize) {
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    let mut signed = errors.to_vec();
    abs.sort_by(f64::total_cmp);
    signed.sort_by(f64::total_cmp);
    (
        percentile(&abs, 0.5),
        percentile(&abs, 0.9),
        percentile(&signed, 0.5),
        errors.iter().filter(|e| **e < -10.0).count(),
    )
}

/// Prints every row's three counters and the per-counter summary; returns the summaries.
pub fn report(label: &str, rows: &[Scored]) -> Vec<(f64, f64, f64, usize)> {
    println!("\n== {label}");
    println!(
        "{:<36} {:<9} {:>17} {:>17} {:>17}",
        "id", "workload", "allocated m/p %", "reserved m/p %", "nvml m/p %"
    );
    for r in rows {
        let cell = |i: usize| {
            let (m, p) = r.counters[i];
            format!("{m:.2}/{p:.2} {:+.1}", error(r.counters[i]))
        };
        println!(
            "{:<36} {:<9} {:>17} {:>17} {:>17}",
            r.id,
            r.workload,
            cell(0),
            cell(1),
            cell(2)
        );
    }
    println!(
        "{:<10} {:>8} {:>8} {:>8} {:>10}",
        "counter", "median", "p90", "signed", "low >10%"
    );
    let mut summaries = Vec::new();
    for (i, name) in COUNTERS.iter().enumerate() {
        let errors: Vec<f64> = rows.iter().map(|r| error(r.counters[i])).collect();
        let (median, p90, signed, low) = summary(&errors);
        println!("{name:<10} {median:>7.1}% {p90:>7.1}% {signed:>+7.1}% {low:>10}");
        summaries.push((median, p90, signed, low));
    }
    summaries
}

/// The bars a lease's rows are held to (`summaries` from [`report`], one per counter in
/// [`COUNTERS`] order): each signed median at or above its floor (`allocated_floor` for the
/// allocated peak, which is exact to a tenth of a percent either way on most rows, so it may sit
/// a hair under zero; 0 for reserved and NVML, the counters that decide an OOM), and NVML's
/// median |error| at most `nvml_median_bar`.
pub fn assert_lease_bars(
    summaries: &[(f64, f64, f64, usize)],
    allocated_floor: f64,
    nvml_median_bar: f64,
) {
    for (name, (_, _, signed, _)) in COUNTERS.iter().zip(summaries) {
        let floor = if *name == COUNTERS[0] {
            allocated_floor
        } else {
            0.0
        };
        assert!(*signed >= floor, "{name} signed median {signed:+.1}%");
    }
    let (nvml_median, ..) = summaries[2];
    assert!(
        nvml_median <= nvml_median_bar,
        "NVML median |error| {nvml_median:.1}% > {nvml_median_bar}%"
    );
}

/// The ids of the rows that read more than 10 % low on reserved or NVML (printed); panics on a
/// row whose allocated counter does, which no measured folder's test lets pass.
pub fn low_rows(rows: &[Scored]) -> Vec<&str> {
    let mut low = Vec::new();
    for r in rows {
        let allocated = error(r.counters[0]);
        assert!(
            allocated >= -10.0,
            "{}: allocated {allocated:+.1}% low",
            r.id
        );
        if (1..COUNTERS.len()).any(|i| error(r.counters[i]) < -10.0) {
            low.push(r.id.as_str());
        }
    }
    println!("low by more than 10 % on reserved or NVML: {low:?}");
    low
}
