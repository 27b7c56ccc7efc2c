//! `estimate` stays a pure function under 1 ms per call (issue 20's target): the model is
//! evaluated for every indexed pod and for `peakfit estimate`, so its cost is timed here, never
//! in a test.
//!
//! ```text
//! cargo bench --bench estimate                      # 200 rounds over every spec below
//! PEAKFIT_BENCH_ROUNDS=2000 cargo bench --bench estimate
//! ```
//!
//! The specs are the H200 rows (`tests/data/h200`) and the oracle grid's
//! (`tests/data/oracle-grid.csv`): each a `config.json` read into annotations plus a workload,
//! parsed once; each round calls `estimate` on every spec and times each call. Prints the
//! median and p99 per call and the slowest spec.

#[path = "../tests/model_rows/mod.rs"]
mod model_rows;

use std::hint::black_box;
use std::time::Instant;

use peakfit::model::estimate;

fn specs() -> Vec<(String, peakfit::model::Spec)> {
    model_rows::oracle_grid()
        .into_iter()
        .map(|r| (r.id, r.spec))
        .collect()
}

fn main() {
    let specs = specs();
    let rounds: usize = std::env::var("PEAKFIT_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut samples = Vec::with_capacity(rounds * specs.len());
    let mut slowest = (0u128, String::new());
    for _ in 0..rounds {
        for (id, spec) in &specs {
            let start = Instant::now();
            black_box(estimate(black_box(spec), 80 << 30));
            let ns = start.elapsed().as_nanos();
            if ns > slowest.0 {
                slowest = (ns, id.clone());
            }
            samples.push(ns);
        }
    }
    samples.sort_unstable();
    let at = |p: f64| {
        samples[peakfit::convert::f64_to_usize(samples.len() as f64 * p).min(samples.len() - 1)]
    };
    println!(
        "estimate: {} specs x {rounds} rounds = {} calls; per call median {:.1} µs, p99 {:.1} µs, max {:.1} µs ({})",
        specs.len(),
        samples.len(),
        at(0.5) as f64 / 1e3,
        at(0.99) as f64 / 1e3,
        slowest.0 as f64 / 1e3,
        slowest.1
    );
}
