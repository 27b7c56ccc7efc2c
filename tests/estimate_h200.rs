//! The peak-memory model against real-GPU rows: Hugging Face workloads measured on one NVIDIA
//! H200 (`tests/data/h200/`, a copy of `../shared/data/gpu-measurements/`: see its
//! `SOURCES.md`). Each row is estimated the way an ML team would ask: the model's own
//! `config.json` (`peakfit estimate --model-config`) plus the workload annotations of the row
//! (workload, dtype, batch, context, optimizer, checkpointing, LoRA rank, attention, engine).
//! The row's shape columns are not inputs: the config is.
//!
//! Every row carries all three counters, and each is compared with its like:
//!
//! | counter | compared with |
//! |---|---|
//! | `max_allocated_gib` | `allocated_bytes` (tensors) |
//! | `max_reserved_gib` | `reserved_bytes` (tensors + the caching allocator's slack) |
//! | `nvml_gib` | `per_gpu_bytes` (+ CUDA context and loaded kernels: what runs out) |
//!
//! Each row is scored twice: with the workload columns only (a generate row's prefill then
//! sized over its whole context, as for a pod that does not say its prompt), and with
//! `prompt-tokens` added where the row's notes state the prompt (`measure.py` prefills
//! `context_tokens − new` random ids; every generate row's notes say `prompt N + M new
//! tokens`), as a user who knows the prompt would annotate the pod.
//!
//! The bars: no row low by more than 10 % on any counter (under-prediction OOM-kills a
//! neighbour), NVML median |error| <= 3 %, and every row within 12 % on NVML; with the prompt
//! stated, every generate row within issue 20's 10 %. Without it llama-3.2-1b at batch 128
//! over-predicts by 11.2 % (the prefill sized for 1,024 tokens, not 992); with it, 9.0 %, the
//! rest being allocator slack (allocated +1.3 %, reserved +9.2 %). The bf16 fine-tune of the
//! same model over-predicts by 10.0 % on slack alone (allocated −0.1 %): the training slack
//! is one fp32 loss block (`HF_SLACK_TRAINING_TENSORS`) and this row strands 0.44 of one. The
//! safe side, kept visible here rather than tuned away.

mod model_rows;

use model_rows::percentile;
use peakfit::model::estimate;
use peakfit::model::quantity::GIB;

/// One row's three counters, measured and predicted, in GiB.
struct Scored {
    id: String,
    workload: String,
    /// (measured, predicted) for allocated, reserved, NVML.
    counters: [(f64, f64); 3],
}

const COUNTERS: [&str; 3] = ["allocated", "reserved", "nvml"];
/// Issue 20's bar for one row, met by every generate row once its prompt is stated.
const GENERATE_NVML_BAR: f64 = 10.0;

/// Which annotations a row is estimated with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Annotations {
    /// The workload columns only: a generate row's prefill is sized over its whole context.
    Default,
    /// Plus `prompt-tokens` where the row's notes state the prompt (every generate row).
    WithPrompt,
}

/// Scores every row of the H200 file.
fn score(annotations: Annotations) -> Vec<Scored> {
    let gib = |b: u64| b as f64 / GIB;
    model_rows::h200()
        .into_iter()
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

fn error((measured, predicted): (f64, f64)) -> f64 {
    (predicted - measured) / measured * 100.0
}

/// `(median |error|, p90 |error|, signed median, rows low by more than 10 %)`.
fn summary(errors: &[f64]) -> (f64, f64, f64, usize) {
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
fn report(label: &str, rows: &[Scored]) -> Vec<(f64, f64, f64, usize)> {
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

/// The bars every scoring must meet: NVML median |error| <= 3 %, every row within
/// `nvml_bar` on NVML, none low by more than 10 % on any counter.
fn assert_bars(rows: &[Scored], summaries: &[(f64, f64, f64, usize)], nvml_bar: f64) {
    let (nvml_median, ..) = summaries[2];
    assert!(
        nvml_median <= 3.0,
        "NVML median |error| {nvml_median:.1}% > 3%"
    );
    for r in rows {
        let nvml = error(r.counters[2]);
        assert!(
            nvml.abs() <= nvml_bar,
            "{}: NVML error {nvml:+.1}% beyond {nvml_bar}%",
            r.id
        );
        for (i, name) in COUNTERS.iter().enumerate() {
            let e = error(r.counters[i]);
            assert!(e >= -10.0, "{}: {name} predicted {e:+.1}% low", r.id);
        }
    }
}

#[test]
fn estimate_matches_the_h200_rows_counter_by_counter() {
    let rows = score(Annotations::Default);
    assert_eq!(rows.len(), 20, "the 20 visible H200 rows");
    let summaries = report(
        "workload columns only (prefill sized over the context)",
        &rows,
    );
    assert_bars(&rows, &summaries, 12.0);
}

/// A user who knows the prompt states it (`peakfit.io/prompt-tokens`): the prefill is then
/// the prompt's, and the generate rows move toward their measurement without going low.
#[test]
fn estimate_with_the_stated_prompt_matches_the_h200_rows() {
    let rows = score(Annotations::WithPrompt);
    let prompted: Vec<bool> = model_rows::h200()
        .iter()
        .map(|r| r.with_prompt.is_some())
        .collect();
    assert_eq!(
        prompted.iter().filter(|p| **p).count(),
        11,
        "every generate row states its prompt"
    );
    let summaries = report("with prompt-tokens from each generate row's notes", &rows);
    assert_bars(&rows, &summaries, 12.0);
    let default = score(Annotations::Default);
    for ((with, without), prompted) in rows.iter().zip(&default).zip(prompted) {
        assert!(
            with.counters[2].1 <= without.counters[2].1,
            "{}: the stated prompt raised the estimate",
            with.id
        );
        let nvml = error(with.counters[2]);
        assert!(
            !prompted || nvml.abs() <= GENERATE_NVML_BAR,
            "{}: NVML error {nvml:+.1}% beyond {GENERATE_NVML_BAR}% with its prompt stated",
            with.id
        );
    }
}

/// The simulator draws its pods' model errors from these rows (`sim::real_peak`): its table must
/// be today's model on them, or the 24 h run measures a model that no longer exists.
#[test]
fn the_simulators_model_errors_are_todays() {
    let rows = score(Annotations::Default);
    let table = peakfit::sim::real_peak::H200_NVML_RATIOS;
    let mut wanted = String::new();
    for r in &rows {
        let (measured, predicted) = r.counters[2];
        wanted.push_str(&format!(
            "    ({:?}, {:?}, {:.4}),\n",
            r.id,
            r.workload,
            measured / predicted
        ));
    }
    assert_eq!(table.len(), rows.len(), "update the table to:\n{wanted}");
    for (r, (id, workload, ratio)) in rows.iter().zip(table) {
        let (measured, predicted) = r.counters[2];
        assert_eq!((r.id.as_str(), r.workload.as_str()), (id, workload));
        assert!(
            (measured / predicted - ratio).abs() < 0.0001,
            "{id}: {:.4} against {ratio}; update the table to:\n{wanted}",
            measured / predicted
        );
    }
}
