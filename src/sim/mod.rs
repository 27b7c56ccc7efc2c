//! `peakfit simulate`: replays a cluster and a workload through the placement code under several
//! policies. With the Alibaba `openb` trace it reproduces the FGD paper's experiment; with no
//! arguments it runs a built-in mixed cluster and LLM workload (see `builtin`). It may not touch
//! Kubernetes or the extender: it drives the core's placement directly, as the extender does.

pub mod builtin;
pub mod cutstock;
pub mod dynamic;
pub mod expected;
pub mod frag;
pub mod load;
pub mod openb;
pub mod profiles;
pub mod real_peak;
pub mod replay;
pub mod svg;
pub mod via_extender;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use crate::learn::{LearnMode, LearnPolicy};

pub use replay::{CurvePoint, Policy, RunResult, run_deployed, run_one};

#[derive(Clone, Debug, clap::Args)]
pub struct SimulateArgs {
    /// openb node list (CSV: sn, `cpu_milli`, `memory_mib`, gpu, model). With --pods: replay the
    /// FGD paper's experiment instead of the built-in default.
    #[arg(long, env = "PEAKFIT_SIM_NODES")]
    pub nodes: Option<PathBuf>,
    /// One or several openb pod lists (comma separated or repeated).
    #[arg(long, env = "PEAKFIT_SIM_PODS", value_delimiter = ',', num_args = 1..)]
    pub pods: Vec<PathBuf>,
    /// A folder holding `openb_node_list_gpu_node.csv` and `openb_pod_list_*.csv`: every pod
    /// list in it (and the authors' `expected/` results, when present, for comparison).
    #[arg(long, env = "PEAKFIT_SIM_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// Seeds: a range `42..51` (inclusive) or a list `42,43`.
    #[arg(long, env = "PEAKFIT_SIM_SEEDS", default_value = "42..51", value_parser = parse_seeds)]
    pub seeds: Seeds,
    /// `all` or a comma-separated list of random, dotprod, clustering, packing, bestfit, fgd,
    /// peakfit.
    #[arg(long, env = "PEAKFIT_SIM_POLICIES", default_value = "all", value_parser = parse_policies)]
    pub policies: Policies,
    /// Worker threads (default: every core; more than the cores is clamped to them, since the
    /// runs are CPU-bound and a thread per job only costs memory).
    #[arg(long, env = "PEAKFIT_SIM_JOBS")]
    pub jobs: Option<usize>,
    /// Folder for the JSON report and the SVG charts.
    #[arg(long, env = "PEAKFIT_SIM_OUT", default_value = "peakfit-sim-out")]
    pub out: PathBuf,
    /// Print one JSON object per run on stdout (the table goes to stderr).
    #[arg(long, env = "PEAKFIT_SIM_JSON")]
    pub json: bool,
    /// Real GPU-memory curves (`pod_gpu_memory_used_bytes_anon.tar.gz` of Alibaba GenTD26) for
    /// the dynamic mode's serving pods; without it they follow generated curves.
    #[arg(long, env = "PEAKFIT_SIM_USAGE_PROFILES")]
    pub usage_profiles: Option<PathBuf>,
    /// kube-scheduler's profile for peakfit's pods (the peakfit policy): `chart`, the chart's,
    /// which turns off the scores of `NodeResourcesFit` and `NodeResourcesBalancedAllocation` so
    /// that the extender alone ranks; or `default-plugins`, a profile that keeps them. The
    /// environment variable also takes `off` (= chart) and `on` (= default-plugins).
    #[arg(
        long,
        env = "PEAKFIT_SIM_DEFAULT_PLUGINS",
        default_value = "chart",
        value_name = "PROFILE",
        value_parser = parse_scheduler_profile
    )]
    pub scheduler_profile: SchedulerProfile,
    /// Who schedules GPU-less pods in the peakfit policy: `peakfit` (they go through peakfit's
    /// profile, and the extender scores them by the GPUs their CPU strands, as in the trace,
    /// where one scheduler places every pod) or `default-scheduler` (the default profile's
    /// `LeastAllocated` + `BalancedAllocation`, as in a cluster where only annotated pods name
    /// peakfit's scheduler).
    #[arg(
        long,
        env = "PEAKFIT_SIM_GPULESS",
        default_value = "peakfit",
        value_name = "WHO",
        value_parser = parse_gpuless_pods
    )]
    pub gpuless_pods: GpulessPods,
    /// The built-in 24 h run, peakfit accounting: a pod that has waited this long and fits
    /// nowhere gets a hold, the node and GPUs it will get keeping its memory (others bind there
    /// only beside it) until it starts. `off` turns holds off (today's extender).
    #[arg(
        long,
        env = "PEAKFIT_SIM_RESERVE_AFTER",
        default_value = "30m",
        value_name = "DURATION|off",
        value_parser = parse_reserve_after
    )]
    pub reserve_after: ReserveAfter,
    /// How long a hold lasts before it is dropped (and may be made again, elsewhere if the
    /// cluster has changed).
    #[arg(long, env = "PEAKFIT_SIM_RESERVE_DEADLINE", default_value = "1h", value_parser = crate::flags::parse_nonzero_duration)]
    pub reserve_deadline: std::time::Duration,
    /// Holds at once, as a fraction of the nodes (rounded up, at least one). Each hold idles
    /// memory while its GPUs drain; on the built-in run more than 0.1 (two holds on its 20
    /// nodes) made every kind wait longer (docs/simulate.md).
    #[arg(long, env = "PEAKFIT_SIM_RESERVE_MAX", default_value = "0.1", value_parser = parse_node_fraction)]
    pub reserve_max: f64,
    /// The built-in 24 h run's `learned` accounting: which pods are sized from what their
    /// workload's earlier pods were seen to use: `off`, `predicted` (pods sized by the model) or
    /// `all` (explicit `peakfit.io/vram` too).
    #[arg(long, env = "PEAKFIT_SIM_LEARN", default_value = "predicted", value_parser = parse_learn_mode)]
    pub learn: LearnMode,
    /// Fraction added above a workload's highest observed peak (0.05 = 5 %).
    #[arg(long, env = "PEAKFIT_SIM_LEARN_MARGIN", default_value = "0.05", value_parser = parse_learn_margin)]
    pub learn_margin: f64,
    /// How long a pod must have run before its peak counts for sizing its workload *below* the
    /// prediction (two such pods are needed); serving pods grow for hours after they start.
    #[arg(long, env = "PEAKFIT_SIM_LEARN_MIN_RUNTIME", default_value = "6h", value_parser = crate::flags::parse_duration)]
    pub learn_min_runtime: std::time::Duration,
}

/// `off`, `predicted` or `all`.
pub fn parse_learn_mode(s: &str) -> Result<LearnMode, String> {
    s.trim()
        .parse()
        .map_err(|e| format!("--learn (or PEAKFIT_SIM_LEARN): {e}"))
}

/// A margin the core's `LearnPolicy::validate` accepts.
pub fn parse_learn_margin(s: &str) -> Result<f64, String> {
    let margin = s.trim().parse::<f64>().map_err(|_| {
        format!("--learn-margin (or PEAKFIT_SIM_LEARN_MARGIN) {s:?}: a fraction such as 0.05")
    })?;
    LearnPolicy {
        margin,
        ..LearnPolicy::default()
    }
    .validate()
    .map_err(|e| format!("--learn-margin (or PEAKFIT_SIM_LEARN_MARGIN): {e}"))?;
    Ok(margin)
}

/// `--reserve-after`: a wait, or `None` for no holds. A type of its own because clap reads an
/// `Option` field as an optional flag, not as a value that may say `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveAfter(pub Option<std::time::Duration>);

/// A duration, or `off` for no holds at all.
pub fn parse_reserve_after(s: &str) -> Result<ReserveAfter, String> {
    if s.trim() == "off" {
        return Ok(ReserveAfter(None));
    }
    crate::flags::parse_duration(s)
        .map(|d| ReserveAfter(Some(d)))
        .map_err(|e| format!("--reserve-after (or PEAKFIT_SIM_RESERVE_AFTER): {e}, or off"))
}

/// A fraction of the nodes, more than 0 (1 = as many holds as nodes).
pub fn parse_node_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f.is_finite() => Ok(f),
        _ => Err(format!(
            "--reserve-max (or PEAKFIT_SIM_RESERVE_MAX) {s:?}: a fraction of the nodes above 0, \
             such as 0.25"
        )),
    }
}

/// kube-scheduler's profile for peakfit's pods (`--scheduler-profile`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulerProfile {
    /// The chart's: the resource score plugins off, the extender alone ranks.
    #[default]
    Chart,
    /// `NodeResourcesFit` (`LeastAllocated`) and `NodeResourcesBalancedAllocation` score too.
    DefaultPlugins,
}

/// Who schedules GPU-less pods (`--gpuless-pods`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpulessPods {
    /// peakfit's profile; the extender passes them through.
    #[default]
    Peakfit,
    /// The default scheduler's profile.
    DefaultScheduler,
}

/// How the peakfit policy is deployed: the two choices a cluster makes that the chart fixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deployment {
    pub profile: SchedulerProfile,
    pub gpuless: GpulessPods,
}

impl SimulateArgs {
    pub fn deployment(&self) -> Deployment {
        Deployment {
            profile: self.scheduler_profile,
            gpuless: self.gpuless_pods,
        }
    }

    /// How the built-in 24 h run's learned accounting sizes pods.
    pub fn learn_policy(&self) -> LearnPolicy {
        LearnPolicy {
            mode: self.learn,
            margin: self.learn_margin,
            min_runtime_secs: self.learn_min_runtime.as_secs(),
            ..LearnPolicy::default()
        }
    }

    /// The holds of the built-in 24 h run; `None` when `--reserve-after off`.
    pub fn reserve(&self) -> Option<dynamic::Reserve> {
        let minutes = |d: std::time::Duration| d.as_secs().div_ceil(60);
        self.reserve_after.0.map(|after| dynamic::Reserve {
            after_min: minutes(after),
            deadline_min: minutes(self.reserve_deadline).max(1),
            per_node: self.reserve_max,
        })
    }
}

/// `chart` or `default-plugins`; `off` and `on` too, the values `PEAKFIT_SIM_DEFAULT_PLUGINS`
/// took before the flag existed. A misspelt value would otherwise measure a profile silently.
pub fn parse_scheduler_profile(s: &str) -> Result<SchedulerProfile, String> {
    match s.trim() {
        "chart" | "off" => Ok(SchedulerProfile::Chart),
        "default-plugins" | "on" => Ok(SchedulerProfile::DefaultPlugins),
        other => Err(format!(
            "--scheduler-profile (or PEAKFIT_SIM_DEFAULT_PLUGINS) {other:?}: allowed values are \
             chart, default-plugins (the variable also takes off = chart, on = default-plugins)"
        )),
    }
}

/// `peakfit` or `default-scheduler`.
pub fn parse_gpuless_pods(s: &str) -> Result<GpulessPods, String> {
    match s.trim() {
        "peakfit" => Ok(GpulessPods::Peakfit),
        "default-scheduler" => Ok(GpulessPods::DefaultScheduler),
        other => Err(format!(
            "--gpuless-pods (or PEAKFIT_SIM_GPULESS) {other:?}: allowed values are peakfit, \
             default-scheduler"
        )),
    }
}

/// The seeds of a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seeds(pub Vec<u64>);

/// The policies of a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policies(pub Vec<Policy>);

pub fn parse_seeds(s: &str) -> Result<Seeds, String> {
    let bad =
        || format!("--seeds {s:?} is not valid: use a range like 42..51 or a list like 42,43");
    let s = s.trim();
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().map_err(|_| bad())?;
        let b: u64 = b
            .trim()
            .trim_start_matches('=')
            .parse()
            .map_err(|_| bad())?;
        if b < a || b - a > 10_000 {
            return Err(bad());
        }
        return Ok(Seeds((a..=b).collect()));
    }
    let v: Result<Vec<u64>, _> = s.split(',').map(|x| x.trim().parse()).collect();
    match v {
        Ok(v) if !v.is_empty() => Ok(Seeds(v)),
        _ => Err(bad()),
    }
}

pub fn parse_policies(s: &str) -> Result<Policies, String> {
    if s.trim() == "all" {
        return Ok(Policies(Policy::ALL.to_vec()));
    }
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim) {
        let p = <Policy as clap::ValueEnum>::from_str(name, true).map_err(|_| {
            format!(
                "--policies: {name:?} is not a policy: use all, or a comma-separated list of {}",
                Policy::ALL.map(Policy::name).join(", ")
            )
        })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(Policies(out))
}

pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    if let Some(asked) = args.jobs {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let jobs = asked.clamp(1, cores);
        if jobs != asked {
            tracing::warn!(asked, cores, "--jobs clamped to the number of cores");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(jobs)
            .build_global()
            .context("--jobs: cannot start the worker threads")?;
    }
    if args.nodes.is_none() && args.pods.is_empty() && args.trace_dir.is_none() {
        return builtin::run(args);
    }
    run_openb(args)
}

/// A progress bar on a terminal, nothing otherwise (CI logs, pipes).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} runs, {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

fn run_openb(args: &SimulateArgs) -> anyhow::Result<()> {
    let (nodes_path, pod_paths, expected_path) = openb_inputs(args)?;
    let nodes = openb::load_nodes(&nodes_path)?;
    let mut traces = Vec::new();
    for p in &pod_paths {
        traces.push((openb::trace_name(p), openb::load_pods(p)?));
    }
    let jobs: Vec<(usize, Policy, u64)> = (0..traces.len())
        .flat_map(|t| {
            args.policies
                .0
                .iter()
                .flat_map(move |&p| args.seeds.0.iter().map(move |&s| (t, p, s)))
        })
        .collect();
    let bar = progress(jobs.len() as u64, "openb");
    let started = std::time::Instant::now();
    let deployment = args.deployment();
    let results: Vec<RunResult> = jobs
        .par_iter()
        .map(|&(t, policy, seed)| {
            let r = run_deployed(&traces[t].0, &nodes, &traces[t].1, policy, seed, deployment);
            bar.inc(1);
            r
        })
        .collect();
    bar.finish_and_clear();
    tracing::info!(
        runs = results.len(),
        seconds = started.elapsed().as_secs_f64(),
        "openb sweep done"
    );
    let expected = match expected_path {
        Some(p) if p.is_file() => Some(expected::Expected::load(&p)?),
        _ => None,
    };
    let table = openb_table(&results, &args.seeds.0, expected.as_ref());
    write_openb_report(&args.out, &results)?;
    let mut text = String::new();
    if args.json {
        for r in &results {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        eprint!("{table}");
    } else {
        text.push_str(&table);
        text.push_str(&format!("report: {}\n", args.out.display()));
    }
    Ok(crate::stdout::emit(&text)?)
}

fn openb_inputs(args: &SimulateArgs) -> anyhow::Result<(PathBuf, Vec<PathBuf>, Option<PathBuf>)> {
    let dir = args.trace_dir.as_deref();
    let nodes = match (&args.nodes, dir) {
        (Some(n), _) => n.clone(),
        (None, Some(d)) => d.join("openb_node_list_gpu_node.csv"),
        (None, None) => anyhow::bail!("--pods needs --nodes (or --trace-dir) for the node list"),
    };
    let pods = if !args.pods.is_empty() {
        args.pods.clone()
    } else if let Some(d) = dir {
        let all = openb::pod_lists_in(d)?;
        anyhow::ensure!(
            !all.is_empty(),
            "--trace-dir {}: no openb_pod_list_*.csv in it",
            d.display()
        );
        all
    } else {
        anyhow::bail!("--nodes needs --pods (or --trace-dir) for the pod lists")
    };
    let expected = dir
        .map(Path::to_path_buf)
        .or_else(|| nodes.parent().map(Path::to_path_buf))
        .map(|d| d.join("expected/analysis_allo_discrete.csv"));
    Ok((nodes, pods, expected))
}

/// Mean unallocated % at arrived = 100 % per trace and policy, the paper's mean beside it.
pub fn openb_table(
    results: &[RunResult],
    seeds: &[u64],
    expected: Option<&expected::Expected>,
) -> String {
    let mut by: BTreeMap<(&str, Policy), Vec<f64>> = BTreeMap::new();
    for r in results {
        if let Some(u) = r.unallocated_at_100 {
            by.entry((&r.trace, r.policy)).or_default().push(u);
        }
    }
    let mut policies: Vec<Policy> = results.iter().map(|r| r.policy).collect();
    policies.sort();
    policies.dedup();
    let mut traces: Vec<&str> = results.iter().map(|r| r.trace.as_str()).collect();
    traces.sort_unstable();
    traces.dedup();
    let mut cut: BTreeMap<&str, BTreeMap<u64, f64>> = BTreeMap::new();
    for r in results {
        if let Some(c) = r.cutting_stock_pct {
            cut.entry(&r.trace).or_default().insert(r.seed, c);
        }
    }
    let mut out = format!(
        "unallocated GPU % at arrived = 100 % (mean over {} seed(s); paper's mean in brackets)\n\
         {CUT_STOCK_LEGEND}\n{:<14}",
        seeds.len(),
        "trace"
    );
    for p in &policies {
        out.push_str(&format!("{:>17}", p.name()));
    }
    out.push_str(&format!("{:>17}\n", "cut-stock ref"));
    for t in traces {
        out.push_str(&format!("{t:<14}"));
        for &p in &policies {
            let ours = by
                .get(&(t, p))
                .map(|v| v.iter().sum::<f64>() / v.len() as f64);
            let paper = expected
                .zip(p.paper_name())
                .and_then(|(e, name)| e.unallocated_at_100(t, name, seeds));
            let cell = match (ours, paper) {
                (Some(o), Some(x)) => format!("{o:.2} [{x:.2}]"),
                (Some(o), None) => format!("{o:.2}"),
                _ => "-".to_owned(),
            };
            out.push_str(&format!("{cell:>17}"));
        }
        let reference = cut
            .get(t)
            .map_or(f64::NAN, |by_seed| mean(by_seed.values().copied()));
        out.push_str(&format!("{reference:>17.2}\n"));
    }
    out
}

/// What the `cut-stock ref` column is, printed above every table that has it.
pub const CUT_STOCK_LEGEND: &str = "cut-stock ref = GPU % an offline cutting-stock LP leaves \
     unused when it cuts the sharing pods arrived by 100 % into GPUs: a reference, not a strict \
     bound (it knows every pod in advance and ignores nodes, CPU, memory and GPU models; \
     docs/simulate.md)";

/// The nearest-rank percentile `q` (0..=1) of `v` (sorted here), 0 for none.
pub fn nearest_rank(v: &mut [u64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = crate::convert::f64_to_usize((v.len() as f64 * q).ceil()).clamp(1, v.len()) - 1;
    v[i] as f64
}

/// The mean, NaN for none.
pub fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { f64::NAN } else { s / n as f64 }
}

fn write_openb_report(out: &Path, results: &[RunResult]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
    std::fs::write(
        out.join("openb-runs.json"),
        serde_json::to_vec_pretty(results)?,
    )?;
    let mut traces: Vec<&str> = results.iter().map(|r| r.trace.as_str()).collect();
    traces.sort_unstable();
    traces.dedup();
    for t in traces {
        let series = mean_unallocated_series(results.iter().filter(|r| r.trace == t));
        let svg = svg::line_chart(
            &format!("openb {t}: unallocated GPU vs arrived load"),
            "arrived GPU load (% of capacity)",
            "unallocated GPU (% of capacity)",
            (0.0, 130.0),
            &series,
        );
        std::fs::write(out.join(format!("openb-{t}-unallocated.svg")), svg)?;
    }
    Ok(())
}

/// Per policy, mean over seeds of `arrived − allocated` (GPU that arrived but found no place),
/// the paper's "unallocated" once arrived load reaches 100 %.
pub fn mean_unallocated_series<'a>(
    runs: impl Iterator<Item = &'a RunResult>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut acc: BTreeMap<Policy, BTreeMap<u32, (f64, u32)>> = BTreeMap::new();
    for r in runs {
        for c in &r.curve {
            let e = acc
                .entry(r.policy)
                .or_default()
                .entry(c.arrived_pct)
                .or_insert((0.0, 0));
            e.0 += f64::from(c.arrived_pct).min(100.0) - c.allocated_pct;
            e.1 += 1;
        }
    }
    acc.into_iter()
        .map(|(p, pts)| {
            (
                p.name().to_owned(),
                pts.into_iter()
                    .map(|(a, (s, n))| (f64::from(a), (s / f64::from(n)).max(0.0)))
                    .collect(),
            )
        })
        .collect()
}

/// A run with only what the tables read: unallocated % and the cutting-stock reference.
#[cfg(test)]
pub(crate) fn table_run(trace: &str, policy: Policy, seed: u64, u: f64, cut: f64) -> RunResult {
    RunResult {
        trace: trace.into(),
        policy,
        seed,
        unallocated_at_100: Some(u),
        curve: Vec::new(),
        pods_arrived: 10,
        pods_placed: 9,
        cutting_stock_pct: Some(cut),
        extender: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_as_inclusive_ranges_or_lists() {
        assert_eq!(parse_seeds("42..51").unwrap().0.len(), 10);
        assert_eq!(parse_seeds("42..=43").unwrap().0, vec![42, 43]);
        assert_eq!(parse_seeds("1,5").unwrap().0, vec![1, 5]);
        let e = parse_seeds("x").unwrap_err();
        assert!(e.contains("\"x\"") && e.contains("42..51"), "{e}");
    }

    #[test]
    fn the_openb_table_has_the_cutting_stock_reference_per_trace() {
        let run = |policy, seed, u, cut| table_run("default", policy, seed, u, cut);
        let results = [
            run(Policy::Fgd, 1, 5.0, 3.0),
            run(Policy::Peakfit, 1, 4.0, 3.0),
            run(Policy::Fgd, 2, 6.0, 3.5),
            run(Policy::Peakfit, 2, 4.5, 3.5),
        ];
        let table = openb_table(&results, &[1, 2], None);
        assert!(table.contains(CUT_STOCK_LEGEND), "{table}");
        assert!(table.contains("not a strict"), "{table}");
        let header = table.lines().nth(2).unwrap();
        assert!(header.trim_end().ends_with("cut-stock ref"), "{table}");
        let row: Vec<&str> = table.lines().nth(3).unwrap().split_whitespace().collect();
        // The reference is per seed (every policy of a seed sees the same pods): the mean of
        // the two seeds, beside each policy's mean.
        assert_eq!(row, ["default", "5.50", "4.25", "3.25"], "{table}");
    }

    #[test]
    fn policies_parse_all_or_a_list() {
        assert_eq!(parse_policies("all").unwrap().0.len(), 7);
        assert_eq!(
            parse_policies("fgd,peakfit").unwrap().0,
            vec![Policy::Fgd, Policy::Peakfit]
        );
        let e = parse_policies("fgd,tetris").unwrap_err();
        assert!(e.contains("tetris") && e.contains("bestfit"), "{e}");
    }
}
