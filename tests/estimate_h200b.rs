//! The peak-memory model against the third lease's rows (`tests/data/h200b/`, 43 runs measured
//! for peakfit by `tools/measure/measure.py` on one NVIDIA H200; its `SOURCES.md` says how).

mod model_rows;

use model_rows::scoring::{Annotations, report, score};

#[test]
fn estimate_against_the_h200b_rows() {
    let rows = score(model_rows::h200b(), Annotations::Default);
    report("H200b, workload columns only", &rows);
    let rows = score(model_rows::h200b(), Annotations::WithPrompt);
    report("H200b, with the stated prompt", &rows);
    let rows = score(model_rows::h200b_allocated(), Annotations::WithPrompt);
    report("H200b, every row (allocated)", &rows);
}
