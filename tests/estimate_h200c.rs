//! The peak-memory model against the fourth lease's rows (`tests/data/h200c/`: 38 runs measured
//! for peakfit by `tools/measure/measure.py` on one NVIDIA H200, two calls of one lease; its
//! `SOURCES.md` says how and why these). No version of the model had seen them when they were
//! first scored (the commit that added them gives that scoring).
//!
//! Each row is estimated as `peakfit estimate --model-config configs/<id>.json` plus its
//! workload columns (each generate row's prompt stated), and each counter compared with its like
//! (`model_rows::scoring`). Both `expandable_segments` rows are scored with
//! `peakfit.io/expandable-segments: true`. AdamW rows are scored as `optimizer: adamw` whichever
//! implementation ran (`foreach`, torch's CUDA default and the model's reading, or the per-tensor
//! loop `fused=False` runs, which the shared rows ran: the notes' `path` says which).

mod model_rows;

use model_rows::scoring::{Annotations, COUNTERS, error, report, score};

/// Rows with all three counters.
const ROWS: usize = 38;

#[test]
fn estimate_matches_the_h200c_rows() {
    let rows = score(model_rows::h200c(), Annotations::WithPrompt);
    assert_eq!(rows.len(), ROWS);
    let summaries = report("H200c, with the stated prompt", &rows);
    for (name, (_, _, signed, _)) in COUNTERS.iter().zip(&summaries) {
        println!("{name}: signed median {signed:+.1}%");
    }
    let mut low = Vec::new();
    for r in &rows {
        for (i, name) in COUNTERS.iter().enumerate() {
            let e = error(r.counters[i]);
            if e < -10.0 {
                low.push(format!("{} {name} {e:+.1}%", r.id));
            }
        }
    }
    println!("low by more than 10 %: {low:?}");
}
