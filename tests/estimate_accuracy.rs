//! The peak-memory model against every public measurement in
//! `../shared/data/memory-validation.csv`, comparing like counters:
//!
//! | row counter | compared with |
//! |---|---|
//! | `max_allocated` | `allocated_bytes` (tensors only) |
//! | `max_reserved` | `reserved_bytes` (allocated + allocator slack) |
//! | `nvml` | `per_gpu_bytes` (adds CUDA context and NCCL) |
//! | `engine_log` | the engine budget, `gpu-memory-utilization x gpu_memory_total` |
//! | `unknown` | `reserved_bytes`: the sources (Qwen v1 README, PEFT README) print either PyTorch's allocated figure or nvidia-smi's, and reserved lies between the two |
//!
//! Each input column becomes the annotation `peakfit.io/<column with - for _>`; the GPU size
//! (`gpu_memory_total_gib`, 80 GiB when empty) is what `--gpu-memory` would be. `id`, `counter`,
//! `source`, `notes` and `measured_gib` are never inputs, and nothing is matched by row.
//!
//! Rows whose notes say "not expressible in columns" (CPU offload, context parallelism,
//! `expandable_segments`) are printed but not scored: the data set itself records that a
//! setting which changes memory is missing from the inputs, so no estimator could see it.
//!
//! Rows whose notes carry `CHECK:` are skipped: the data set flags them as contradicting the
//! rest (Qwen3-32B at input 1 is 248 MiB *below* its own bf16 weights plus final KV cache, a
//! physical floor, while the model's other contexts sit 35-48 MiB above it).

use std::collections::BTreeMap;
use std::path::Path;

use peakfit::model::quantity::GIB;
use peakfit::model::{Spec, estimate};

const NOT_INPUTS: &[&str] = &[
    "id",
    "measured_gib",
    "counter",
    "source",
    "notes",
    "gpu_memory_total_gib",
];

struct Row {
    id: String,
    /// The data set says a setting that changes memory has no column (CPU offload, context
    /// parallelism, `expandable_segments`): shown, but not held against the model.
    hidden_input: bool,
    counter: String,
    measured: f64,
    predicted: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // Nearest-rank percentile: the smallest value with at least p of the data at or below it.
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[test]
#[ignore = "needs ../shared/data"]
fn estimate_matches_public_measurements() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/memory-validation.csv");
    assert!(path.exists(), "{} not found", path.display());
    let mut reader = csv::Reader::from_path(&path).expect("readable CSV");
    let headers = reader.headers().expect("header row").clone();
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for record in reader.records() {
        let record = record.expect("well-formed CSV row");
        let field: BTreeMap<&str, &str> = headers.iter().zip(record.iter()).collect();
        let id = field["id"].to_string();
        if field["notes"].contains("CHECK:") {
            skipped.push(id);
            continue;
        }
        let hidden_input = field["notes"].contains("not expressible in columns");
        let annotations: BTreeMap<String, String> = field
            .iter()
            .filter(|(k, v)| !NOT_INPUTS.contains(k) && !v.trim().is_empty())
            .map(|(k, v)| (format!("peakfit.io/{}", k.replace('_', "-")), v.to_string()))
            .collect();
        let spec = Spec::parse(&annotations).unwrap_or_else(|e| panic!("{id}: {e}"));
        let gpu_total = match field["gpu_memory_total_gib"].trim() {
            "" => 80.0 * GIB,
            v => v.parse::<f64>().expect("gpu_memory_total_gib is a number") * GIB,
        };
        let e = estimate(&spec, gpu_total as u64);
        let counter = field["counter"].to_string();
        let predicted = match counter.as_str() {
            "max_allocated" => e.allocated_bytes,
            "max_reserved" | "unknown" => e.reserved_bytes,
            "nvml" => e.per_gpu_bytes,
            "engine_log" => e
                .engine_budget_bytes
                .unwrap_or_else(|| panic!("{id}: engine_log row without an engine budget")),
            other => panic!("{id}: unknown counter {other}"),
        } as f64
            / GIB;
        let measured: f64 = field["measured_gib"].parse().expect("measured_gib");
        rows.push(Row {
            id,
            hidden_input,
            counter,
            measured,
            predicted,
        });
    }
    assert!(
        rows.len() >= 100,
        "expected the full data set, got {} rows",
        rows.len()
    );

    println!(
        "{:<40} {:<13} {:>10} {:>10} {:>8}",
        "id", "counter", "measured", "predicted", "error"
    );
    let mut errors = Vec::new();
    let mut all = Vec::new();
    for r in &rows {
        let err = (r.predicted - r.measured) / r.measured * 100.0;
        all.push(err.abs());
        if !r.hidden_input {
            errors.push(err.abs());
        }
        println!(
            "{:<40} {:<13} {:>10.3} {:>10.3} {:>+7.1}%{}",
            r.id,
            r.counter,
            r.measured,
            r.predicted,
            err,
            if r.hidden_input {
                "  (input not expressible: not scored)"
            } else {
                ""
            }
        );
    }
    errors.sort_by(f64::total_cmp);
    all.sort_by(f64::total_cmp);
    let median = percentile(&errors, 0.5);
    let p90 = percentile(&errors, 0.9);
    println!(
        "all {} rows: median |error| {:.1}%, p90 |error| {:.1}%",
        all.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.9)
    );
    println!(
        "scored {} rows (skipped as CHECK: {:?}; not scored: {} with inputs not expressible): \
         median |error| {median:.1}%, p90 |error| {p90:.1}%",
        errors.len(),
        skipped,
        rows.len() - errors.len()
    );
    assert!(median <= 10.0, "median |error| {median:.1}% > 10%");
    assert!(p90 <= 25.0, "90th percentile |error| {p90:.1}% > 25%");
}
