//! Simulator cost, measured (issue 5 target: one openb run, ≈ 8,000 pods over 1,213 nodes, one
//! policy, one seed, ≤ 10 s in release).
//!
//! ```text
//! cargo bench --bench sim_openb                          # every policy, seed 42, `default`
//! PEAKFIT_BENCH_POLICIES=fgd,peakfit cargo bench --bench sim_openb
//! PEAKFIT_BENCH_POLICIES=random cargo bench --bench sim_openb   # mostly the cutting-stock line
//! ```
//!
//! It also times the offline cutting-stock reference every run prints (`sim::cutstock`), on
//! every pod list of the trace, seed 42: each run pays it once.
//!
//! Each run is timed on one thread, wall clock and this process's CPU time (the machine may be
//! shared: wall minus CPU is time spent waiting for a core).

use std::path::Path;
use std::time::Instant;

use peakfit::sim::{Policy, cutstock, openb, parse_policies, run_one};

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(11) + tick(12)) / 100.0
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/openb");
    if !dir.is_dir() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let policies = std::env::var("PEAKFIT_BENCH_POLICIES")
        .ok()
        .and_then(|s| parse_policies(&s).ok())
        .map_or(Policy::ALL.to_vec(), |p| p.0);
    let nodes = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = openb::load_pods(&dir.join("openb_pod_list_default.csv")).unwrap();
    println!("openb default, seed 42, one thread:");
    for policy in policies {
        let (wall, cpu) = (Instant::now(), cpu_seconds());
        let r = run_one("default", &nodes, &pods, policy, 42);
        println!(
            "  {policy:<11} {:>6.2} s wall {:>6.2} s cpu  ({} pods, {:.2} % unallocated at 100 %)",
            wall.elapsed().as_secs_f64(),
            cpu_seconds() - cpu,
            r.pods_arrived,
            r.unallocated_at_100.unwrap_or(f64::NAN)
        );
    }
    let capacity: u64 = nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    println!("cutting-stock reference, seed 42 (median of 21 solves, each list):");
    for list in openb::pod_lists_in(&dir).unwrap() {
        let pods = openb::load_pods(&list).unwrap();
        let arrivals = openb::arrival_order(&pods, capacity, 42, 1.3);
        let mut ms: Vec<f64> = (0..21)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(cutstock::reference_pct(&pods, &arrivals, capacity));
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "  {:<12} {:>7.3} ms  ({:.2} %)",
            openb::trace_name(&list),
            ms[10],
            cutstock::reference_pct(&pods, &arrivals, capacity)
        );
    }
}
