//! The peak-memory model against the H100 rows (`tests/data/h100/`, measured for peakfit by
//! `tools/measure/measure.py` on one NVIDIA H100 80GB HBM3; its `SOURCES.md` says how). They
//! were chosen for what the H200 rows lack (fp32 and fp16 `generate`, eager attention, sliding
//! windows, multi-query attention, SGD, pure-bf16 fine-tuning, LoRA under autocast, ...) and
//! first scored with the model as it stood, so they judge it as unseen rows would.
//!
//! Each row is estimated as `peakfit estimate --model-config configs/<id>.json` plus its
//! workload columns, and each counter is compared with its like (`model_rows::scoring`). One
//! row's reserved and NVML counters were cut by a neighbouring case (`SOURCES.md`); it is scored
//! on allocated alone.
//!
//! The bars: no row low by more than 10 % on any counter, every counter's signed median at or
//! above 0 (issue 20's bar for unseen rows), NVML median |error| within [`NVML_MEDIAN_BAR`] and
//! p90 within [`NVML_P90_BAR`] (today's, so that it cannot grow unseen; issue 20 asks for 10 %).
//! Each row's config is the one its model publishes (the repository's `oracle-configs`), as
//! the annotations read it. And the two cases that ran out of memory alone on the card must be
//! predicted not to fit it.

mod model_rows;

use model_rows::scoring::{Annotations, COUNTERS, error, report, score};
use peakfit::model::estimate;
use peakfit::model::quantity::GIB;

/// NVML median |error| over the rows (issue 20's bar for visible rows is 3 %).
const NVML_MEDIAN_BAR: f64 = 5.0;
/// NVML p90 |error| over the rows: 9.9 % with the workload columns and 13.5 % with each row's
/// prompt stated, over the 51 rows of both leases (13.0 % and 13.5 % before Whisper's phases and
/// the eager replay; `docs/oracle.md`). The prompt-stated figure was 10.6 % until the decode's
/// later growth took the larger of two segments per 2 MiB crossing and the copies the replay's
/// room does not hold (`hf::slack`): the third lease's Qwen3-0.6B at 32 × 1,024 + 1,024 read
/// −71 % with the two alone, and the Qwen3-0.6B rows at 8k here, whose prefill the replay lays
/// out with room for four copies fewer than the GPU did (`docs/oracle.md`, "Decode past the
/// first step"), now read up to +28 % with their prompts stated. Issue 20's goal is 10 %; what
/// holds the figure above it is over-prediction only.
const NVML_P90_BAR: f64 = 14.0;

fn check(annotations: Annotations, label: &str) {
    let rows = score(model_rows::h100(), annotations);
    assert_eq!(rows.len(), 52, "the 52 H100 rows with all three counters");
    let summaries = report(label, &rows);
    let (nvml_median, nvml_p90, ..) = summaries[2];
    assert!(
        nvml_median <= NVML_MEDIAN_BAR,
        "NVML median |error| {nvml_median:.1}% > {NVML_MEDIAN_BAR}%"
    );
    assert!(
        nvml_p90 <= NVML_P90_BAR,
        "NVML p90 |error| {nvml_p90:.1}% > {NVML_P90_BAR}%"
    );
    for (name, (_, _, signed, _)) in COUNTERS.iter().zip(&summaries) {
        assert!(
            *signed >= 0.0,
            "{name}: signed median {signed:+.1}% below 0"
        );
    }
    for r in &rows {
        for (i, name) in COUNTERS.iter().enumerate() {
            let e = error(r.counters[i]);
            assert!(e >= -10.0, "{}: {name} predicted {e:+.1}% low", r.id);
        }
    }
}

#[test]
fn estimate_matches_the_h100_rows_counter_by_counter() {
    check(
        Annotations::Default,
        "H100, workload columns only (prefill sized over the context)",
    );
}

#[test]
fn estimate_with_the_stated_prompt_matches_the_h100_rows() {
    check(
        Annotations::WithPrompt,
        "H100, with prompt-tokens from each generate row's notes",
    );
}

/// Each row's config is `config.to_dict()` of the model transformers built, which writes
/// fields the published `config.json` lacks (Falcon's `num_kv_heads: 71` beside `multi_query`):
/// the annotations read from it must be the published file's, or the rows test a model no
/// user would describe.
#[test]
fn every_rows_config_reads_as_its_published_config() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut reader =
        csv::Reader::from_path(data.join("h100/h100-2026-11.csv")).expect("readable CSV");
    let headers = reader.headers().expect("header row").clone();
    let (id_at, model_at) = (
        headers.iter().position(|h| h == "id").expect("id"),
        headers.iter().position(|h| h == "model").expect("model"),
    );
    let read = |path: std::path::PathBuf| {
        let json = std::fs::read_to_string(&path).expect("config");
        peakfit::model::hf_config::annotations(&json)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .annotations
    };
    let mut n = 0;
    for record in reader.records() {
        let record = record.expect("row");
        let (id, model) = (&record[id_at], &record[model_at]);
        assert_eq!(
            read(data.join(format!("h100/configs/{id}.json"))),
            read(data.join(format!("oracle-configs/{model}.json"))),
            "{id}: its dumped config reads differently from {model}'s published one"
        );
        n += 1;
    }
    assert_eq!(n, 53);
}

/// The allocated counter alone, over every row (the cut one too).
#[test]
fn allocated_over_every_h100_row() {
    let rows = score(model_rows::h100_allocated(), Annotations::Default);
    assert_eq!(rows.len(), 53);
    let allocated_only: Vec<_> = rows.iter().filter(|r| r.counters[1].0.is_nan()).collect();
    assert_eq!(
        allocated_only.len(),
        1,
        "the row whose reserve was cut (the one with expandable segments is scored on all three, \
         with peakfit.io/expandable-segments)"
    );
    for r in &rows {
        let e = error(r.counters[0]);
        assert!(e >= -10.0, "{}: allocated {e:+.1}% low", r.id);
    }
    for r in allocated_only {
        println!("{}: allocated {:+.1}%", r.id, error(r.counters[0]));
    }
}

/// A pod that ran out of memory alone on an 80 GB card must not be told it fits one; and its
/// allocated estimate is held to the bar of every measured row (not more than 10 % low) against
/// what was allocated when it failed plus the failing request, a lower bound on its peak. The
/// oracle puts the two peaks at 79.20 GiB (the Llama run failed at its peak request; the model
/// says 79.18) and 82.18 GiB (`scripts/oracle case --config tests/data/oracle-configs/llama-3.2-1b.json
/// --workload training --dtype fp32 --batch 4 --context-tokens 2048 --optimizer sgd`).
#[test]
fn the_cases_that_ran_out_of_memory_are_predicted_not_to_fit() {
    let rows = model_rows::h100_oom();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let gpu = peakfit::convert::f64_to_u64(r.gpu_total_gib * GIB);
        let e = estimate(&r.spec, gpu);
        let allocated = e.allocated_bytes as f64 / GIB;
        let per_gpu = e.per_gpu_bytes as f64 / GIB;
        println!(
            "{}: allocated {allocated:.2} GiB (at least {:.2} measured), per GPU {per_gpu:.2} on a {:.2} GiB card",
            r.id, r.min_peak_allocated_gib, r.gpu_total_gib
        );
        assert!(
            allocated >= r.min_peak_allocated_gib * 0.9,
            "{}: allocated {allocated:.2} GiB more than 10 % below the {:.2} it had reached when it ran out",
            r.id,
            r.min_peak_allocated_gib
        );
        assert!(
            per_gpu > r.gpu_total_gib,
            "{}: predicted {per_gpu:.2} GiB fits the {:.2} GiB card it ran out of",
            r.id,
            r.gpu_total_gib
        );
    }
}
