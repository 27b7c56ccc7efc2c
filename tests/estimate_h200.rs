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
//! same model over-predicted by 10.0 % on slack alone while the training slack was one fp32 loss
//! block; with a training step's segments counted (`hf::training_slack`) it reads −1.0 %.

mod model_rows;

use model_rows::scoring::{Annotations, COUNTERS, Scored, error, report};

/// Issue 20's bar for one row, met by every generate row once its prompt is stated.
const GENERATE_NVML_BAR: f64 = 10.0;

/// Scores every row of the H200 file.
fn score(annotations: Annotations) -> Vec<Scored> {
    model_rows::scoring::score(model_rows::h200(), annotations)
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
