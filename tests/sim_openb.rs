//! Reproduction of the FGD paper's experiment on the Alibaba `openb` trace: each baseline's
//! unallocated GPU % at arrived = 100 % on `default` must be within ±0.5 points of the authors'
//! own mean over seeds 42–51 (`../shared/data/openb/expected/`).
//!
//! The trace is large and lives outside the repository, so these tests are ignored by default;
//! `scripts/test` runs them when `../shared/data` is there (`cargo nextest run --run-ignored only`).
//! They run seeds 42–44 (debug builds are slow); `PEAKFIT_SIM_TEST_SEEDS=42..51` runs all ten.

use std::path::{Path, PathBuf};

use peakfit::sim::openb::{NodeSpec, PodSpec};
use peakfit::sim::{Policy, expected::Expected, openb, parse_seeds, run_one};
use rayon::prelude::*;

/// The trace folder, `default`'s nodes and pods, and the seeds to run.
struct DefaultTrace {
    dir: PathBuf,
    nodes: Vec<NodeSpec>,
    pods: Vec<PodSpec>,
    seeds: Vec<u64>,
}

/// Panics, naming the file, when `../shared/data` is absent.
fn default_trace() -> DefaultTrace {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/openb");
    let expected = dir.join("expected/analysis_allo_discrete.csv");
    assert!(expected.is_file(), "{} not found", expected.display());
    let seeds = parse_seeds(
        &std::env::var("PEAKFIT_SIM_TEST_SEEDS").unwrap_or_else(|_| "42..44".to_owned()),
    )
    .unwrap()
    .0;
    let nodes = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = openb::load_pods(&dir.join("openb_pod_list_default.csv")).unwrap();
    DefaultTrace {
        dir,
        nodes,
        pods,
        seeds,
    }
}

/// Unallocated % at arrived = 100 % of each (policy, seed), run in parallel.
fn unallocated(
    nodes: &[NodeSpec],
    pods: &[PodSpec],
    policies: &[Policy],
    seeds: &[u64],
) -> Vec<(Policy, f64)> {
    let jobs: Vec<(Policy, u64)> = policies
        .iter()
        .flat_map(|&p| seeds.iter().map(move |&s| (p, s)))
        .collect();
    jobs.par_iter()
        .map(|&(p, s)| {
            let r = run_one("default", nodes, pods, p, s);
            (p, r.unallocated_at_100.expect("a point at arrived = 100 %"))
        })
        .collect()
}

#[test]
#[ignore = "needs ../shared/data"]
fn baselines_reproduce_the_authors_results_on_default() {
    let DefaultTrace {
        dir,
        nodes,
        pods,
        seeds,
    } = default_trace();
    let expected = Expected::load(&dir.join("expected/analysis_allo_discrete.csv")).unwrap();
    let paper_seeds: Vec<u64> = (42..=51).collect();
    let baselines = [
        Policy::Random,
        Policy::Dotprod,
        Policy::Clustering,
        Policy::Packing,
        Policy::Bestfit,
        Policy::Fgd,
    ];
    let results = unallocated(&nodes, &pods, &baselines, &seeds);
    let mut failures = Vec::new();
    for p in baselines {
        let ours: Vec<f64> = results.iter().filter(|r| r.0 == p).map(|r| r.1).collect();
        let ours = ours.iter().sum::<f64>() / ours.len() as f64;
        let paper = expected
            .unallocated_at_100("default", p.paper_name().unwrap(), &paper_seeds)
            .unwrap();
        eprintln!("{p:<10} ours {ours:.2}  paper {paper:.2}");
        if (ours - paper).abs() > 0.5 {
            failures.push(format!("{p}: ours {ours:.2}, paper {paper:.2}"));
        }
    }
    assert!(
        failures.is_empty(),
        "off by more than 0.5 points: {failures:?}"
    );
}

/// peakfit as deployed (the real Extender, learning its mix online, asked by the model of
/// kube-scheduler with the chart's profile: resource score plugins off, one node at 10) on
/// `default`. Measured (release, seeds 42-51): 3.92 % against FGD's 4.77 % (seeds 42-44: 3.92,
/// 3.96, 3.96 against 5.03, 4.72, 4.78), once GPU-less pods were scored by the GPUs their CPU
/// strands and the learned mix stopped keeping its first 64 pods' classes (issue 12's goal:
/// below FGD, at most 4.0 %).
#[test]
#[ignore = "needs ../shared/data"]
fn peakfit_through_the_extender_on_default_beats_fgd() {
    let DefaultTrace {
        nodes, pods, seeds, ..
    } = default_trace();
    let results = unallocated(&nodes, &pods, &[Policy::Peakfit, Policy::Fgd], &seeds);
    let mean = |p: Policy| {
        let v: Vec<f64> = results.iter().filter(|r| r.0 == p).map(|r| r.1).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (ours, fgd) = (mean(Policy::Peakfit), mean(Policy::Fgd));
    eprintln!("peakfit {ours:.2}  fgd {fgd:.2} (seeds {seeds:?})");
    assert!(ours <= 4.1, "peakfit leaves {ours:.2} % unallocated");
    assert!(
        ours < fgd - 0.5,
        "peakfit {ours:.2} % is not clearly below FGD's {fgd:.2} %"
    );
}
