//! The cost of the extender, side by side, on the real kube-scheduler and kube-apiserver:
//! scheduling throughput and per-pod latency (create sent → `spec.nodeName` seen on a watch) of
//! (a) the default profile, plain `nvidia.com/gpu: 1` requests under a kube-scheduler with every
//! default, and (b) peakfit's profile from the chart (`helm template` of its scheduler
//! ConfigMap), `peakfit.io/vram` annotations, with the extender filtering, scoring and binding.
//!
//! Fairness. Both schedulers get the same API client rate, `PEAKFIT_BENCH_QPS` /
//! `PEAKFIT_BENCH_BURST` (default 500 / 1000): the plain one in its `clientConnection`, the
//! chart's through `--set scheduler.clientConnection.qps=…,burst=…` when it is rendered, so the
//! chart value is what is measured. At kube-scheduler's default 50 / 100 the default profile sat
//! at exactly 50 pods/s (its binder posts every Binding through that client) while peakfit's
//! extender binds with its own client, which kube-rs does not rate-limit (`peakfit extender` has
//! no QPS setting): the old table compared a throttled binder with an unthrottled one. 500 /
//! 1000 is well above what either profile reaches here (16 creators send a few hundred pods/s at
//! most), so neither side is held by a client-side limit; `50` / `100` reproduces the old run.
//! Both profiles see the same nodes and the same number of pods, sent by the same creators.
//!
//! Variants (`PEAKFIT_BENCH_VARIANTS`, default `spread,contention`):
//! - `spread`: every node 8 × H100 80GB (`nvidia.com/gpu: 8` and a report of 8 GPUs); (b) pods
//!   of 48-72 GiB, one per GPU. 5,000 pods take 5,000 of 8,000 or 40,000 GPUs: nothing contends.
//! - `contention`: each profile's pods fill 95 % of what it schedules by, so the last pods hunt
//!   for the last room. (b) pods of 15-19 GiB (a mean of 17 GiB, four or five to an 80 GB GPU)
//!   over `ceil(pods × 17 GiB / (0.95 × 80 GiB))` H100s in the reports (1,119 for 5,000 pods);
//!   (a) `nvidia.com/gpu: 1` pods over `ceil(pods / 0.95)` advertised GPUs (5,264). The two
//!   counts differ because a default-profile pod takes a whole GPU and a peakfit pod a fifth of
//!   one; each profile reads only its own (the default scheduler the Node's allocatable, the
//!   extender the report). Both sit on the same GPU nodes, `min(nodes, report GPUs)` of them,
//!   spread as evenly as they go and spread among the other nodes, CPU nodes (no
//!   `nvidia.com/gpu`, no report), so both profiles see the same nodes that could take a GPU
//!   pod. Afterwards no GPU may hold more than it has (`assert_no_overcommit`).
//!
//! Nodes have no agents (thousands of processes do not fit a CI machine): each node's
//! `NodeGpuReport` is written once by the same server-side apply the agent makes, and the
//! extender runs with `--max-report-age 1h` so the reports stay fresh for the run.
//!
//! ```sh
//! PEAKFIT_BENCH_NODES=1000,5000 PEAKFIT_BENCH_PODS=5000 cargo bench --bench scheduler_throughput
//! ```
//! Environment: `PEAKFIT_BENCH_NODES` (comma-separated node counts, default `1000,5000`),
//! `PEAKFIT_BENCH_PODS` (default 5000), `PEAKFIT_BENCH_CREATORS` (concurrent pod creators,
//! default 16), `PEAKFIT_BENCH_STALL_S` (a phase ends when nothing bound for this long, default
//! 30), `PEAKFIT_BENCH_QPS` / `PEAKFIT_BENCH_BURST` (both schedulers' client rate, default 500 /
//! 1000), `PEAKFIT_BENCH_VARIANTS` (default `spread,contention`).
//! The extender inherits the bench's environment, so its own settings apply to (b): e.g.
//! `PEAKFIT_FILTER_KEEP_BEST=16` measures `--filter-keep-best 16`, and
//! `PEAKFIT_FILTER_KEEP_BEST=0` (b) without the cut (unset: the default, 1, under which
//! kube-scheduler never calls prioritize: the bench's pods are bare, with no preference).

#[path = "../tests/e2e_support/mod.rs"]
mod e2e_support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e_support::{Cluster, GIB, Gpu, eventually, gpu_pod, http_get, metric_value, node_of};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

/// GPUs per node in the spread variant.
const SPREAD_GPUS: usize = 8;
/// The share of its GPUs (a) or GPU memory (b) each profile's pods fill in the contention variant.
const FILL: f64 = 0.95;
/// Contention pods of peakfit's profile: 15-19 GiB in turn, a mean of 17.
const CONTENTION_GIB: [u64; 5] = [15, 16, 17, 18, 19];
const H100_GIB: u64 = 80;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v:?} is not a valid number")),
        Err(_) => default,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Spread,
    Contention,
}

impl Variant {
    fn parse(s: &str) -> Self {
        match s.trim() {
            "spread" => Self::Spread,
            "contention" => Self::Contention,
            other => panic!(
                "PEAKFIT_BENCH_VARIANTS: {other:?} is not a variant; allowed: spread, contention"
            ),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Spread => "spread",
            Self::Contention => "contention",
        }
    }
}

/// Which node gets what: per GPU node (the first ones), the `nvidia.com/gpu` it advertises to
/// the default profile and the H100s its report gives peakfit's.
struct Layout {
    plugin_gpus: Vec<usize>,
    report_gpus: Vec<usize>,
}

/// `total` spread over `slots` as evenly as it goes (the first ones get one more).
fn spread_evenly(total: usize, slots: usize) -> Vec<usize> {
    (0..slots)
        .map(|i| total / slots + usize::from(i < total % slots))
        .collect()
}

impl Layout {
    fn new(variant: Variant, nodes: usize, pods: usize) -> Self {
        match variant {
            Variant::Spread => Self {
                plugin_gpus: vec![SPREAD_GPUS; nodes],
                report_gpus: vec![SPREAD_GPUS; nodes],
            },
            Variant::Contention => {
                let demand_gib: u64 = (0..pods)
                    .map(|i| CONTENTION_GIB[i % CONTENTION_GIB.len()])
                    .sum();
                let report_total = peakfit::convert::f64_to_usize(
                    (demand_gib as f64 / (FILL * H100_GIB as f64)).ceil(),
                );
                let plugin_total = peakfit::convert::f64_to_usize((pods as f64 / FILL).ceil());
                let gpu_nodes = nodes.min(report_total);
                Self {
                    plugin_gpus: spread_evenly(plugin_total, gpu_nodes),
                    report_gpus: spread_evenly(report_total, gpu_nodes),
                }
            }
        }
    }

    fn describe(&self, nodes: usize) -> String {
        let gpu_nodes = self.report_gpus.len();
        format!(
            "{gpu_nodes} GPU nodes + {} CPU nodes; (a) {} nvidia.com/gpu, (b) {} H100 80GB in reports",
            nodes - gpu_nodes,
            self.plugin_gpus.iter().sum::<usize>(),
            self.report_gpus.iter().sum::<usize>()
        )
    }
}

/// What one profile did with the pods.
struct Phase {
    pods: usize,
    bound: usize,
    create_s: f64,
    drain_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Pods with at least one `FailedScheduling` event, and their median latency.
    retried: usize,
    retried_p50_ms: f64,
}

impl Phase {
    fn pods_per_s(&self) -> f64 {
        self.bound as f64 / self.drain_s
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i =
        peakfit::convert::f64_to_usize((p * sorted.len() as f64).ceil()).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// A pod of the default profile asking NVIDIA's device plugin for one GPU.
fn plain_gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "containers": [{ "name": "main", "image": "vllm/vllm-openai:v0.6.3",
                             "resources": { "requests": { "cpu": "100m" },
                                            "limits": { "nvidia.com/gpu": "1" } } }],
        },
    }))
    .unwrap()
}

/// Pod `i` of peakfit's profile in `variant`.
fn peakfit_pod(variant: Variant, i: usize) -> Pod {
    let vram = match variant {
        Variant::Spread => ["48Gi", "56Gi", "64Gi", "72Gi"][i % 4].to_owned(),
        Variant::Contention => format!("{}Gi", CONTENTION_GIB[i % CONTENTION_GIB.len()]),
    };
    gpu_pod(&format!("b-{i:05}"), &[("peakfit.io/vram", &vram)])
}

/// Creates `count` pods with `creators` concurrent creators and waits until all are bound or
/// nothing bound for `stall`; latencies from this process's own send time to the watch event.
async fn run_phase(
    c: &Cluster,
    ns: &str,
    count: usize,
    creators: usize,
    stall: Duration,
    make: impl Fn(usize) -> Pod,
) -> Phase {
    c.namespace(ns).await;
    let api = c.pods(ns);
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let bound: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let bound = bound.clone();
        let api = api.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(e) = events.next().await {
                let pods = match e {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => vec![p],
                    _ => continue,
                };
                let now = Instant::now();
                let mut b = bound.lock().unwrap();
                for p in pods {
                    if !node_of(&p).is_empty() {
                        b.entry(p.metadata.name.unwrap_or_default()).or_insert(now);
                    }
                }
            }
        })
    };
    // Let the watch start before the first pod exists.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let start = Instant::now();
    futures::stream::iter(0..count)
        .for_each_concurrent(creators, |i| {
            let api = &api;
            let sent = &sent;
            let pod = make(i);
            async move {
                let name = pod.metadata.name.clone().unwrap();
                sent.lock().unwrap().insert(name.clone(), Instant::now());
                api.create(&PostParams::default(), &pod)
                    .await
                    .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"));
            }
        })
        .await;
    let create_s = start.elapsed().as_secs_f64();

    let mut last = (0, Instant::now());
    loop {
        let n = bound.lock().unwrap().len();
        if n != last.0 {
            last = (n, Instant::now());
        }
        if n >= count || last.1.elapsed() > stall {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();

    let sent = sent.lock().unwrap().clone();
    let bound = bound.lock().unwrap().clone();
    let latency = |name: &str| -> Option<f64> {
        Some(
            bound
                .get(name)?
                .duration_since(*sent.get(name)?)
                .as_secs_f64()
                * 1e3,
        )
    };
    let mut all: Vec<f64> = bound.keys().filter_map(|n| latency(n)).collect();
    all.sort_by(f64::total_cmp);
    let last_bind = bound.values().max().copied().unwrap_or(start);

    // Which pods the scheduler had to retry, from its FailedScheduling events.
    let events: Api<Event> = Api::namespaced(c.client.clone(), ns);
    let retried_names: HashSet<String> = events
        .list(&ListParams::default().fields("reason=FailedScheduling"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.involved_object.name)
        .collect();
    let mut retried: Vec<f64> = retried_names.iter().filter_map(|n| latency(n)).collect();
    retried.sort_by(f64::total_cmp);

    Phase {
        pods: count,
        bound: bound.len(),
        create_s,
        drain_s: last_bind.duration_since(start).as_secs_f64(),
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
        retried: retried_names.len(),
        retried_p50_ms: percentile(&retried, 0.50),
    }
}

/// Deletes every pod of a namespace (grace 0: no kubelet) and waits until they are gone.
async fn clear(c: &Cluster, ns: &str) {
    let api = c.pods(ns);
    let _ = api
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await;
    eventually(Duration::from_secs(120), "pods deleted", || {
        let api = api.clone();
        async move {
            let l = api.list(&ListParams::default().limit(1)).await.ok()?;
            l.items.is_empty().then_some(())
        }
    })
    .await;
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The client rate both schedulers get.
#[derive(Clone, Copy)]
struct Rate {
    qps: f64,
    burst: u32,
}

struct Row {
    nodes: usize,
    variant: Variant,
    layout: String,
    a: Phase,
    b: Phase,
    conflicts: f64,
    bind_errors: f64,
    bind_outcomes: String,
    /// The extender's mean time per request, by verb.
    verb_means: String,
    load_a: String,
    load_b: String,
}

/// Mean milliseconds of the extender's requests of each verb, from its histogram's sum and count.
fn verb_means(text: &str) -> String {
    ["filter", "prioritize", "bind"]
        .iter()
        .map(|verb| {
            let labels = format!(r#"verb="{verb}""#);
            let sum = metric_value(
                text,
                "peakfit_extender_request_duration_seconds_sum",
                &labels,
            );
            let count = metric_value(
                text,
                "peakfit_extender_request_duration_seconds_count",
                &labels,
            );
            // Under `--filter-keep-best 1` kube-scheduler never calls prioritize: no series.
            if count > 0.0 {
                format!("{verb} {:.2} ms x {count:.0}", sum / count * 1e3)
            } else {
                format!("{verb} not called")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The nodes of `layout`: its GPU nodes (a report and `nvidia.com/gpu`) spread evenly among
/// the CPU nodes. Spread, not first: kube-scheduler looks at nodes in turn from a rotating start
/// and stops at `percentageOfNodesToScore` feasible ones (10 % of 5,000) before the extender
/// sees them, and the extender's profile passes CPU nodes up to it (its pods ask for no
/// `nvidia.com/gpu`); a block of GPU nodes would hand the extender windows of CPU nodes only.
async fn add_nodes(c: &Cluster, nodes: usize, layout: &Layout) {
    let gpu_nodes = layout.report_gpus.len();
    futures::stream::iter(0..nodes)
        .for_each_concurrent(32, |n| async move {
            let name = format!("node-{n:05}");
            // Node n is the GPU node `slot` when the slot changes at n: `gpu_nodes` of them.
            let slot = n * gpu_nodes / nodes;
            let is_gpu_node = n == 0 || (n - 1) * gpu_nodes / nodes != slot;
            if is_gpu_node {
                let gpus = (0..layout.report_gpus[slot])
                    .map(|i| Gpu::h100(&name, i))
                    .collect();
                c.add_reported_node_advertising(&name, gpus, layout.plugin_gpus[slot])
                    .await;
            } else {
                c.create_ready_node(&name, None).await;
            }
        })
        .await;
}

async fn run(
    variant: Variant,
    nodes: usize,
    pods: usize,
    creators: usize,
    stall: Duration,
    rate: Rate,
) -> Row {
    let c = Cluster::up().await;
    let layout = Layout::new(variant, nodes, pods);
    let t = Instant::now();
    add_nodes(&c, nodes, &layout).await;
    eprintln!(
        "bench: {} {nodes} nodes ({}) in {:.1} s",
        variant.name(),
        layout.describe(nodes),
        t.elapsed().as_secs_f64()
    );

    // (a) the default scheduler alone.
    c.start_plain_scheduler("default-scheduler", rate.qps, rate.burst);
    let a = run_phase(&c, "bench-a", pods, creators, stall, |i| {
        plain_gpu_pod(&format!("a-{i:05}"))
    })
    .await;
    let load_a = uptime();
    eprintln!("bench: (a) {} of {} bound, load {load_a}", a.bound, a.pods);
    c.kill_scheduler("default-scheduler");
    clear(&c, "bench-a").await;

    // (b) the chart's scheduler, rendered with the same rate, and the extender.
    c.wait_reports().await;
    let ext = c.start_extender("extender", &["--max-report-age", "1h"]);
    let qps = format!("scheduler.clientConnection.qps={}", rate.qps);
    let burst = format!("scheduler.clientConnection.burst={}", rate.burst);
    c.start_scheduler_with("peakfit-scheduler", ext.port, &[&qps, &burst]);
    let b = run_phase(&c, "bench-b", pods, creators, stall, |i| {
        peakfit_pod(variant, i)
    })
    .await;
    let load_b = uptime();
    eprintln!("bench: (b) {} of {} bound, load {load_b}", b.bound, b.pods);
    let (_, text) = http_get(ext.port, "/metrics").expect("extender serves /metrics");
    let bind_outcomes = text
        .lines()
        .filter(|l| l.starts_with(r#"peakfit_extender_decisions_total{verb="bind""#))
        .map(|l| l.trim_start_matches("peakfit_extender_decisions_total"))
        .collect::<Vec<_>>()
        .join(" ");
    let reserved = c.assert_no_overcommit().await;
    let used: u64 = reserved.values().sum();
    let total: u64 = c.gpu_memory().values().sum();
    eprintln!(
        "bench: (b) reserved {:.0} of {:.0} GiB ({:.1} %), no GPU over-committed",
        used as f64 / GIB as f64,
        total as f64 / GIB as f64,
        used as f64 * 100.0 / total as f64
    );
    Row {
        nodes,
        variant,
        layout: layout.describe(nodes),
        conflicts: metric_value(&text, "peakfit_extender_bind_conflicts_total", ""),
        bind_errors: metric_value(&text, "peakfit_extender_errors_total", r#"verb="bind""#),
        bind_outcomes,
        verb_means: verb_means(&text),
        load_a,
        load_b,
        a,
        b,
    }
}

/// A comma-separated environment list, `default` when unset.
fn list<T>(key: &str, default: &str, parse: impl Fn(&str) -> T) -> Vec<T> {
    std::env::var(key)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(parse)
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter this binary has none of.
    let nodes = list("PEAKFIT_BENCH_NODES", "1000,5000", |s| {
        s.trim()
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("PEAKFIT_BENCH_NODES: {s:?} is not a node count"))
    });
    let variants = list(
        "PEAKFIT_BENCH_VARIANTS",
        "spread,contention",
        Variant::parse,
    );
    let pods = env_or("PEAKFIT_BENCH_PODS", 5000usize);
    let creators = env_or("PEAKFIT_BENCH_CREATORS", 16usize);
    let stall = Duration::from_secs(env_or("PEAKFIT_BENCH_STALL_S", 30u64));
    let rate = Rate {
        qps: env_or("PEAKFIT_BENCH_QPS", 500.0),
        burst: env_or("PEAKFIT_BENCH_BURST", 1000),
    };
    assert!(
        rate.qps > 0.0 && rate.burst >= 1,
        "PEAKFIT_BENCH_QPS must be above 0 and PEAKFIT_BENCH_BURST at least 1, got {} and {}",
        rate.qps,
        rate.burst
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for &n in &nodes {
        for &v in &variants {
            eprintln!("bench: load before {} {n} nodes: {}", v.name(), uptime());
            rows.push(rt.block_on(run(v, n, pods, creators, stall, rate)));
        }
    }
    print_table(&rows, pods, creators, rate);
}

fn print_table(rows: &[Row], pods: usize, creators: usize, rate: Rate) {
    println!(
        "\nscheduler_throughput: {pods} pods, {creators} creators, both schedulers at qps {} burst {}",
        rate.qps, rate.burst
    );
    println!(
        "{:>6} {:>10} {:>3} {:>9} {:>7} {:>8} {:>8} {:>8} {:>7} {:>8} {:>5} {:>9} {:>6}  load (1/5/15 min)",
        "nodes",
        "variant",
        "",
        "bound",
        "pods/s",
        "create s",
        "p50 ms",
        "p99 ms",
        "retried",
        "retr p50",
        "b/a",
        "conflicts",
        "errors"
    );
    for r in rows {
        for (tag, p, load) in [("a", &r.a, &r.load_a), ("b", &r.b, &r.load_b)] {
            let only_b = |s: String| if tag == "b" { s } else { String::new() };
            println!(
                "{:>6} {:>10} {:>3} {:>9} {:>7.1} {:>8.1} {:>8.0} {:>8.0} {:>7} {:>8.0} {:>5} {:>9} {:>6}  {load}",
                r.nodes,
                r.variant.name(),
                tag,
                format!("{}/{}", p.bound, p.pods),
                p.pods_per_s(),
                p.create_s,
                p.p50_ms,
                p.p99_ms,
                p.retried,
                p.retried_p50_ms,
                only_b(format!("{:.2}", r.b.pods_per_s() / r.a.pods_per_s())),
                only_b(format!("{:.0}", r.conflicts.abs())),
                only_b(format!("{:.0}", r.bind_errors.abs())),
            );
        }
        println!(
            "{:>6} {:>10}     nodes: {}",
            r.nodes,
            r.variant.name(),
            r.layout
        );
        println!(
            "{:>6} {:>10}     extender bind outcomes: {}; mean {}",
            r.nodes,
            r.variant.name(),
            r.bind_outcomes,
            r.verb_means
        );
    }
}
