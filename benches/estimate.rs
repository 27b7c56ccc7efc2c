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

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use peakfit::model::{Spec, estimate, hf_config};

fn annotations(config: &str, workload: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut a: BTreeMap<String, String> = hf_config::annotations(config)
        .expect("config")
        .annotations
        .into_iter()
        .map(|(k, v)| (format!("peakfit.io/{k}"), v))
        .collect();
    for (k, v) in workload {
        if !v.is_empty() {
            a.insert(format!("peakfit.io/{k}"), (*v).to_string());
        }
    }
    a
}

fn specs() -> Vec<(String, Spec)> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let text = std::fs::read_to_string(data.join("oracle-grid.csv")).expect("oracle grid");
    let body = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut reader = csv::Reader::from_reader(body.as_bytes());
    let headers = reader.headers().expect("headers").clone();
    let mut out = Vec::new();
    for record in reader.records() {
        let record = record.expect("row");
        let f: BTreeMap<&str, &str> = headers.iter().zip(record.iter()).collect();
        let config =
            std::fs::read_to_string(data.join("oracle-configs").join(f["config"])).expect("config");
        let flash = if f["attention"] == "eager" {
            "false"
        } else {
            "true"
        };
        let a = annotations(
            &config,
            &[
                ("engine", "hf"),
                ("workload", f["workload"]),
                ("dtype", f["dtype"]),
                ("batch", f["batch"]),
                ("context-tokens", f["context_tokens"]),
                ("gradient-checkpointing", f["gradient_checkpointing"]),
                ("optimizer", f["optimizer"]),
                ("lora-rank", f["lora_rank"]),
                ("flash-attention", flash),
            ],
        );
        out.push((f["id"].to_string(), Spec::parse(&a).expect("spec")));
    }
    out
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
