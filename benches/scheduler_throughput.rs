//! The cost of the extender, side by side, on the real kube-scheduler and kube-apiserver:
//! scheduling throughput and per-pod latency (create sent → `spec.nodeName` seen on a watch) of
//! (a) the default profile, plain `nvidia.com/gpu: 1` requests, and (b) peakfit's profile from
//! the chart, `peakfit.io/vram` annotations, over the same fake nodes (8 × H100 80GB each).
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
//! default 16), `PEAKFIT_BENCH_STALL_S` (a phase ends when nothing bound for this long, default 30).

#[path = "../tests/e2e_support/mod.rs"]
mod e2e_support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e_support::{Cluster, Gpu, eventually, gpu_pod, http_get, metric_value, node_of};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

const GPUS_PER_NODE: usize = 8;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v:?} is not a valid number")),
        Err(_) => default,
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

struct Row {
    nodes: usize,
    a: Phase,
    b: Phase,
    conflicts: f64,
    bind_errors: f64,
    bind_outcomes: String,
    load: String,
}

async fn run(nodes: usize, pods: usize, creators: usize, stall: Duration) -> Row {
    let c = Cluster::up().await;
    let t = Instant::now();
    futures::stream::iter(0..nodes)
        .for_each_concurrent(32, |n| {
            let c = &c;
            async move {
                let name = format!("node-{n:05}");
                let gpus = (0..GPUS_PER_NODE).map(|i| Gpu::h100(&name, i)).collect();
                c.add_reported_node(&name, gpus).await;
            }
        })
        .await;
    eprintln!(
        "bench: {nodes} nodes with reports in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // (a) the default scheduler alone.
    c.start_plain_scheduler("default-scheduler");
    let a = run_phase(&c, "bench-a", pods, creators, stall, |i| {
        plain_gpu_pod(&format!("a-{i:05}"))
    })
    .await;
    eprintln!("bench: (a) {} of {} bound", a.bound, a.pods);
    c.kill_scheduler("default-scheduler");
    clear(&c, "bench-a").await;

    // (b) the chart's scheduler and the extender; each pod needs most of one H100.
    let ext = c.start_peakfit(&["--max-report-age", "1h"]).await;
    let sizes = ["48Gi", "56Gi", "64Gi", "72Gi"];
    let b = run_phase(&c, "bench-b", pods, creators, stall, |i| {
        gpu_pod(
            &format!("b-{i:05}"),
            &[("peakfit.io/vram", sizes[i % sizes.len()])],
        )
    })
    .await;
    eprintln!("bench: (b) {} of {} bound", b.bound, b.pods);
    let (_, text) = http_get(ext.port, "/metrics").expect("extender serves /metrics");
    let bind_outcomes = text
        .lines()
        .filter(|l| l.starts_with(r#"peakfit_extender_decisions_total{verb="bind""#))
        .map(|l| l.trim_start_matches("peakfit_extender_decisions_total"))
        .collect::<Vec<_>>()
        .join(" ");
    c.assert_no_overcommit().await;
    Row {
        nodes,
        conflicts: metric_value(&text, "peakfit_extender_bind_conflicts_total", ""),
        bind_errors: metric_value(&text, "peakfit_extender_errors_total", r#"verb="bind""#),
        bind_outcomes,
        load: uptime(),
        a,
        b,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter this binary has none of.
    let nodes: Vec<usize> = std::env::var("PEAKFIT_BENCH_NODES")
        .unwrap_or_else(|_| "1000,5000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("PEAKFIT_BENCH_NODES: {s:?} is not a node count"))
        })
        .collect();
    let pods = env_or("PEAKFIT_BENCH_PODS", 5000usize);
    let creators = env_or("PEAKFIT_BENCH_CREATORS", 16usize);
    let stall = Duration::from_secs(env_or("PEAKFIT_BENCH_STALL_S", 30u64));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for n in nodes {
        eprintln!("bench: load before {n} nodes: {}", uptime());
        rows.push(rt.block_on(run(n, pods, creators, stall)));
    }
    println!(
        "\nscheduler_throughput: {pods} pods, {creators} creators, {GPUS_PER_NODE} x H100 80GB per node"
    );
    println!(
        "{:>6} {:>3} {:>7} {:>7} {:>8} {:>8} {:>8} {:>11} {:>8} {:>6} {:>9} {:>6}  load (1/5/15 min)",
        "nodes",
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
    for r in &rows {
        for (tag, p) in [("a", &r.a), ("b", &r.b)] {
            let b = tag == "b";
            println!(
                "{:>6} {:>3} {:>7} {:>7.1} {:>8.1} {:>8.0} {:>8.0} {:>11} {:>8.0} {:>6} {:>9} {:>6}  {}",
                r.nodes,
                tag,
                format!("{}/{}", p.bound, p.pods),
                p.pods_per_s(),
                p.create_s,
                p.p50_ms,
                p.p99_ms,
                p.retried,
                p.retried_p50_ms,
                if b {
                    format!("{:.2}", r.b.pods_per_s() / r.a.pods_per_s())
                } else {
                    String::new()
                },
                if b {
                    format!("{:.0}", r.conflicts.abs())
                } else {
                    String::new()
                },
                if b {
                    format!("{:.0}", r.bind_errors.abs())
                } else {
                    String::new()
                },
                r.load
            );
        }
        println!(
            "{:>6}     extender bind outcomes: {}",
            r.nodes, r.bind_outcomes
        );
    }
}
