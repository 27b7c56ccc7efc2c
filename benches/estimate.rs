//! `estimate` stays a pure function under 1 ms per call (issue 20's target): the model is
//! evaluated for every indexed pod and for `peakfit estimate`, so its cost is timed here, never
//! in a test.
//!
//! ```text
//! cargo bench --bench estimate                      # 200 rounds over every spec below
//! PEAKFIT_BENCH_ROUNDS=2000 cargo bench --bench estimate
//! PEAKFIT_BENCH_ONLY=qwen3-4b cargo bench --bench estimate   # the specs whose id contains it
//! PEAKFIT_BENCH_DUMP=est.txt cargo bench --bench estimate     # also writes every estimate
//! ```
//!
//! `PEAKFIT_BENCH_DUMP` writes each spec's id and its estimate as JSON, a line each, before
//! timing: a change made for speed must return the same bytes, so the file of the binary before
//! and after it are diffed (floats print in their shortest round-tripping form, so equal text
//! is equal bits).
//!
//! The specs are the rows the model is scored on against a measured peak: the H200 and H100
//! rows (`tests/data/h200`, `tests/data/h100`), the oracle grid (`tests/data/oracle-grid.csv`) and the oracle's reserved
//! samples (`tests/data/oracle-reserved*.csv`, the long generations among them): each a
//! `config.json` read into annotations plus a workload, parsed once; each round calls `estimate`
//! on every spec and times each call. Prints the median and p99 per call over all calls, the
//! same over the first round alone (the replays' memos empty: a shape's first estimate), and
//! the specs whose first call and whose own median are slowest (the replayed rows: their cost grows with
//! layers, batch and context, so a p99 over a grid says little about which workload pays it).

#[path = "../tests/model_rows/mod.rs"]
mod model_rows;

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant;

use peakfit::model::estimate;

fn specs() -> Vec<(String, peakfit::model::Spec)> {
    let rows = model_rows::h200()
        .into_iter()
        .chain(model_rows::h100())
        .map(|r| (r.id, r.spec));
    let grid = model_rows::oracle_grid()
        .into_iter()
        .chain(model_rows::oracle_reserved())
        .chain(model_rows::oracle_reserved_long())
        .map(|r| (r.id, r.spec));
    let only = std::env::var("PEAKFIT_BENCH_ONLY").unwrap_or_default();
    rows.chain(grid)
        .filter(|(id, _)| id.contains(&only))
        .collect()
}

fn main() {
    let specs = specs();
    if specs.is_empty() {
        eprintln!(
            "estimate: no spec's id contains PEAKFIT_BENCH_ONLY={:?}",
            std::env::var("PEAKFIT_BENCH_ONLY").unwrap_or_default()
        );
        std::process::exit(2);
    }
    if let Ok(path) = std::env::var("PEAKFIT_BENCH_DUMP") {
        let mut lines = String::new();
        for (id, spec) in &specs {
            let json = serde_json::to_string(&estimate(spec, 80 << 30))
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            writeln!(lines, "{id}\t{json}").expect("a String takes any text");
        }
        std::fs::write(&path, lines).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let rounds: usize = std::env::var("PEAKFIT_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut per_spec: Vec<Vec<u128>> = vec![Vec::with_capacity(rounds); specs.len()];
    for _ in 0..rounds {
        for ((_, spec), times) in specs.iter().zip(&mut per_spec) {
            let start = Instant::now();
            black_box(estimate(black_box(spec), 80 << 30));
            times.push(start.elapsed().as_nanos());
        }
    }
    // The first round runs with the replays' memos empty (no other call came before it unless
    // `PEAKFIT_BENCH_DUMP` ran): every replay is paid there, as for a shape the extender has
    // not seen.
    let mut first: Vec<u128> = per_spec.iter().filter_map(|t| t.first().copied()).collect();
    first.sort_unstable();
    let mut all: Vec<u128> = per_spec.iter().flatten().copied().collect();
    all.sort_unstable();
    let at = |sorted: &[u128], p: f64| {
        sorted[peakfit::convert::f64_to_usize(sorted.len() as f64 * p).min(sorted.len() - 1)] as f64
            / 1e3
    };
    println!(
        "estimate: {} specs x {rounds} rounds = {} calls; per call median {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        specs.len(),
        all.len(),
        at(&all, 0.5),
        at(&all, 0.99),
        at(&all, 1.0),
    );
    println!(
        "first round (the replays' memos empty): median {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        at(&first, 0.5),
        at(&first, 0.99),
        at(&first, 1.0),
    );
    // The first round's slowest calls: the shapes whose replays cost most when the extender
    // meets them first, which the 1 ms target is about.
    let mut cold: Vec<(u128, &str)> = per_spec
        .iter()
        .zip(&specs)
        .filter_map(|(times, (id, _))| times.first().map(|t| (*t, id.as_str())))
        .collect();
    cold.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
    println!("slowest first calls (µs):");
    for (t, id) in cold.iter().take(8) {
        println!("  {:>9.1}  {id}", *t as f64 / 1e3);
    }
    let mut medians: Vec<(f64, f64, &str)> = per_spec
        .iter_mut()
        .zip(&specs)
        .map(|(times, (id, _))| {
            times.sort_unstable();
            (at(times, 0.5), at(times, 0.99), id.as_str())
        })
        .collect();
    medians.sort_by(|a, b| b.0.total_cmp(&a.0));
    let over = medians.iter().filter(|m| m.0 > 1000.0).count();
    println!("specs whose median is over 1 ms: {over} of {}", specs.len());
    println!("slowest specs (median / p99 µs):");
    for (median, p99, id) in medians.iter().take(12) {
        println!("  {median:>9.1} {p99:>9.1}  {id}");
    }
}
