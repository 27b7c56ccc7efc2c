//! The Measure section of issue 2: filter and prioritize for 5,000 nodes × 8 GPUs with 150,000
//! pods indexed, node-cache mode, in process and over loopback HTTP, plus the index's resident
//! memory. A bench binary (harness = false) that records every request's latency and prints
//! percentiles: criterion reports means and medians, the targets are p99s.
//!
//! `cargo bench --bench extender` (env `PEAKFIT_BENCH_ITERS`, default 2000 per measurement;
//! `PEAKFIT_BENCH_ONLY=repeat,model,http,stream,cold,mixchange,criterion,spread,unschedulable` to
//! run some of them; `model` repeats filter and prioritize for a pod the peak-memory model sizes
//! by replaying the caching allocator (see `model_request_body`), and times `Index::request_of`
//! for it alone; `criterion` adds criterion's estimates for the in-process calls;
//! `PEAKFIT_BENCH_CLUSTER=distinct` gives every node a state of its own, see `build`; `spread`
//! replays what kube-scheduler sends in `scheduler_throughput`'s spread variant, at
//! `PEAKFIT_BENCH_SPREAD_NODES`, default `1000,5000`; `unschedulable` times the nudger's
//! question over 50,000 pods, see `unschedulable`).
//!
//! Four workloads: one pod asked about again and again (every node's memo answers), a stream
//! of pods in runs of one shape with a bind and a finished pod per request (what a scheduler
//! sees: one or two nodes change per pod), a new class on every request (no memo answers), and
//! the first pods after the shape mix changed (no memo answers either, new fill patterns).
//! Nodes have allocatable CPU and pods request it, so CPU-aware scoring is on throughout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Node, NodeStatus, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use peakfit::cluster::binding::MemoryBinder;
use peakfit::cluster::index::{ASSIGNED_GPUS, Index, RESERVED_BYTES};
use peakfit::cluster::{NodeGpuReport, NodeGpuReportSpec};
use peakfit::extender::wire::{ExtenderArgs, ExtenderBindingArgs, to_go_json};
use peakfit::extender::{Extender, routes};
use peakfit::inventory::{GpuDevice, GpuProcess, NodeGpuReportStatus, NvmlStatus};
use peakfit::metrics::extender::{ExtenderMetrics, ScoreSourceLabels};

/// The allocator the `peakfit` binary uses (see `src/main.rs`), so the bench measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 5_000;
const GPUS: usize = 8;
const PODS: usize = 150_000;
const GIB: u64 = 1 << 30;
const H100: u64 = 81_559 << 20;
/// Allocatable CPU of every node; the indexed pods take 1-4 cores each (about 75 of them).
const NODE_CPU: &str = "128";

/// Resident set size in bytes, from /proc/self/statm (pages × page size).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn uuid(node: usize, gpu: usize) -> String {
    format!("GPU-{node:08x}-0000-4000-8000-{gpu:012x}")
}

fn pod_uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

/// A deterministic mixed cluster of `pods` pods (a multiple of `NODES`): pod i sits on node
/// i % NODES, GPU (i / NODES) % GPUS, asks 2-17 GiB, and its processes use 60-100 % of that;
/// every 7th GPU runs a process of no pod.
/// Node n's pods follow n % 16 and its stray processes n % 7, so the nodes fall into 112 states
/// (what scoring reads of them: `placement::signature`), as nodes of a real pool repeat. With
/// `distinct`, GPU 0 of node n also runs a stray process of n + 1 MiB: 5,000 states, no two
/// nodes alike, the worst case for sharing scores between equal nodes.
fn build(index: &Index, distinct: bool, pods: usize) {
    for n in 0..NODES {
        let name = format!("gpu-node-{n:05}");
        // Allocatable CPU and memory: the ledgers track CPU, so scoring's CPU balance is on.
        index.apply_node(&node(&name, NODE_CPU, "1Ti"));
    }
    let per_node = pods / NODES;
    for n in 0..NODES {
        let name = format!("gpu-node-{n:05}");
        let mut gpus: Vec<GpuDevice> = (0..GPUS)
            .map(|g| GpuDevice {
                index: peakfit::convert::usize_to_u32(g),
                uuid: uuid(n, g),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: H100,
                memory_reserved_bytes: 512 << 20,
                ..Default::default()
            })
            .collect();
        for k in 0..per_node {
            let i = k * NODES + n;
            let g = (i / NODES) % GPUS;
            let want = (2 + (i % 16) as u64) * GIB;
            let used = want * (60 + (i % 41) as u64) / 100;
            gpus[g].memory_used_bytes += used;
            gpus[g].processes.push(GpuProcess {
                pid: 1000 + peakfit::convert::usize_to_u32(k),
                used_bytes: Some(used),
                pod_uid: Some(pod_uid(i)),
                container_id: None,
            });
        }
        if distinct {
            let stray = (n as u64 + 1) << 20;
            gpus[0].memory_used_bytes += stray;
            gpus[0].processes.push(GpuProcess {
                pid: 98,
                used_bytes: Some(stray),
                ..Default::default()
            });
        }
        for (g, gpu) in gpus.iter_mut().enumerate() {
            if (n * GPUS + g).is_multiple_of(7) {
                gpu.memory_used_bytes += GIB;
                gpu.processes.push(GpuProcess {
                    pid: 99,
                    used_bytes: Some(GIB),
                    ..Default::default()
                });
            }
            gpu.memory_free_bytes = H100 - gpu.memory_used_bytes - gpu.memory_reserved_bytes;
        }
        index.apply_report(&fresh_report(&name, gpus));
    }
    for i in 0..pods {
        let n = i % NODES;
        let g = (i / NODES) % GPUS;
        let want = (2 + (i % 16) as u64) * GIB;
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("job-{i:06}-worker")),
                namespace: Some(format!("team-{:02}", i % 40)),
                uid: Some(pod_uid(i)),
                annotations: Some(
                    [
                        ("peakfit.io/vram".to_owned(), format!("{}Gi", want / GIB)),
                        (ASSIGNED_GPUS.to_owned(), uuid(n, g)),
                        (RESERVED_BYTES.to_owned(), want.to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(format!("gpu-node-{n:05}")),
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            [("cpu".to_owned(), Quantity(format!("{}", 1 + i % 4)))].into(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        index.apply_pod(&pod);
    }
}

/// A Node with this allocatable CPU and memory.
fn node(name: &str, cpu: &str, memory: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            allocatable: Some(
                [
                    ("cpu".to_owned(), Quantity(cpu.into())),
                    ("memory".to_owned(), Quantity(memory.into())),
                ]
                .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A report of `gpus` for node `name`, NVML up, observed now.
fn fresh_report(name: &str, gpus: Vec<GpuDevice>) -> NodeGpuReport {
    let mut r = NodeGpuReport::new(
        name,
        NodeGpuReportSpec {
            node_name: name.to_owned(),
        },
    );
    r.status = Some(NodeGpuReportStatus {
        observed_at: jiff::Timestamp::now().to_string(),
        nvml: NvmlStatus {
            up: true,
            ..Default::default()
        },
        gpus,
        ..Default::default()
    });
    r
}

/// A node-cache-mode request for `pod` over every node.
fn request_for(pod: &serde_json::Value) -> Vec<u8> {
    let names: Vec<String> = (0..NODES).map(|n| format!("gpu-node-{n:05}")).collect();
    serde_json::to_vec(&serde_json::json!({"Pod": pod, "Nodes": null, "NodeNames": names})).unwrap()
}

/// A pod asking 4 cores per GPU (`peakfit.io/gpus`, else 1), so CPU balance scores it.
fn pod_json(name: &str, uid: &str, annotations: &serde_json::Value) -> serde_json::Value {
    let gpus: u32 = annotations["peakfit.io/gpus"]
        .as_str()
        .map_or(1, |g| g.parse().unwrap());
    serde_json::json!({
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations},
        "spec": {
            "containers": [{
                "name": "c",
                "image": "x",
                "resources": {"requests": {"cpu": format!("{}", 4 * gpus)}},
            }],
            "schedulerName": "peakfit-scheduler",
        },
    })
}

fn request_body() -> Vec<u8> {
    request_for(&pod_json(
        "chat",
        "bench-pod",
        &serde_json::json!({"peakfit.io/vram": "24Gi"}),
    ))
}

/// A pod the model sizes rather than states its bytes: Qwen3-8B (Llama's code with q/k norms)
/// serving 8 × 8,192 tokens through transformers, which `model::estimate::hf` sizes by
/// replaying the prefill through the caching allocator (`prefill_replay`), the model's most
/// expensive path.
fn model_pod() -> serde_json::Value {
    pod_json(
        "qwen",
        "bench-model-pod",
        &serde_json::json!({
            "peakfit.io/model": "qwen3-8b",
            "peakfit.io/workload": "inference",
            "peakfit.io/batch": "8",
            "peakfit.io/context-tokens": "8192",
        }),
    )
}

/// The shapes of the workload stream: (per-GPU VRAM, GPUs, relative frequency).
const STREAM_SHAPES: [(&str, u32, u32); 8] = [
    ("4Gi", 1, 6),
    ("8Gi", 1, 5),
    ("12Gi", 1, 4),
    ("16Gi", 1, 4),
    ("24Gi", 1, 3),
    ("40Gi", 1, 2),
    ("30Gi", 2, 1),
    ("20Gi", 4, 1),
];

/// How many stream pods stay bound before the oldest finishes (is deleted): keeps the cluster
/// at a steady fill while every bind and finish changes a node.
const STREAM_RESIDENT: usize = 400;

/// The scheduling loop kube-scheduler runs, in process: a pod is created (the watch indexes
/// it), filtered, prioritized and bound to the best node; pods come in runs of one shape
/// (replicas), and the oldest stream pod finishes as each new one binds. Returns filter and
/// prioritize latencies.
fn workload_stream(
    ext: &Arc<Extender>,
    rt: &tokio::runtime::Runtime,
    iters: usize,
) -> (Stats, Stats) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let total: u32 = STREAM_SHAPES.iter().map(|s| s.2).sum();
    let mut shape = 0usize;
    let mut run_left = 0u32;
    let mut resident: std::collections::VecDeque<String> = std::collections::VecDeque::default();
    let (mut f, mut p) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    let warmup = iters / 10;
    // An extender that has served this workload for a while: its shape mix reflects it (filter
    // is what teaches the mix). The mix moving to a new workload is a transient this excludes.
    let pick_shape = |rng: &mut rand_chacha::ChaCha8Rng| {
        let mut pick = rng.random_range(0..total);
        STREAM_SHAPES
            .iter()
            .position(|s| {
                let hit = pick < s.2;
                pick = pick.saturating_sub(s.2);
                hit
            })
            .unwrap()
    };
    for i in 0..3000 {
        let (vram, gpus, _) = STREAM_SHAPES[pick_shape(&mut rng)];
        let annotations =
            serde_json::json!({"peakfit.io/vram": vram, "peakfit.io/gpus": gpus.to_string()});
        let args: ExtenderArgs = serde_json::from_slice(&request_for(&pod_json(
            "teach",
            &format!("teach-{i}"),
            &annotations,
        )))
        .unwrap();
        ext.filter(args);
    }
    for i in 0..warmup + iters {
        if run_left == 0 {
            shape = pick_shape(&mut rng);
            run_left = rng.random_range(1..=16);
        }
        run_left -= 1;
        let (vram, gpus, _) = STREAM_SHAPES[shape];
        let name = format!("stream-{i:06}");
        let uid = format!("00000000-0000-4000-9000-{i:012x}");
        let annotations =
            serde_json::json!({"peakfit.io/vram": vram, "peakfit.io/gpus": gpus.to_string()});
        let pod_value = pod_json(&name, &uid, &annotations);
        ext.index
            .apply_pod(&serde_json::from_value::<Pod>(pod_value.clone()).unwrap());
        let body = request_for(&pod_value);
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        let kept = ext.filter(args);
        std::hint::black_box(to_go_json(&kept).unwrap());
        let tf = t.elapsed();
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        let scores = ext.prioritize(args);
        std::hint::black_box(to_go_json(&scores).unwrap());
        let tp = t.elapsed();
        if i >= warmup {
            f.push(tf);
            p.push(tp);
        }
        let fits: std::collections::HashSet<String> =
            kept.node_names.unwrap_or_default().into_iter().collect();
        let best = scores
            .iter()
            .filter(|h| fits.contains(&h.host))
            .max_by_key(|h| h.score);
        if let Some(best) = best {
            let r = rt.block_on(ext.bind(ExtenderBindingArgs {
                pod_name: name,
                pod_namespace: "ml".into(),
                pod_uid: uid.clone(),
                node: best.host.clone(),
            }));
            assert!(r.error.is_empty(), "bind: {}", r.error);
            resident.push_back(uid);
        } else {
            ext.index.delete_pod_key(&uid);
        }
        if resident.len() > STREAM_RESIDENT {
            ext.index.delete_pod_key(&resident.pop_front().unwrap());
        }
    }
    (Stats(f), Stats(p))
}

/// Pods timed from each shape mix change on: the one whose filter changed it and the next ones.
const AFTER_CHANGE: usize = 3;

/// Pods of one weighting of the stream's shapes before the workload moves to the next (the
/// weights rotate by one shape).
const PHASE_PODS: usize = 512;

/// The first pods after the shape mix changed: no memo holds a score under a new mix, and its
/// fill patterns are solved on first use. The workload drifts from one weighting of the
/// stream's shapes to the next; filter learns each pod (as it does in a cluster). With the
/// prescorer running, a new mix is first staged by the filter that learns it and replaces the
/// live one once the prescorer has warmed it (`ShapeStats::stage_new_mixes`); without it, that
/// filter makes it live at once. Timed: the filter that staged or changed the mix, prioritize of
/// its pod and of the next `AFTER_CHANGE - 1` pods, and after the prescorer switched to it,
/// prioritize of the pod whose filter the switch happened during and both verbs of the next
/// `AFTER_CHANGE - 1` pods. (That filter is not timed: it did nothing for the switch, and
/// picking the filter that happened to be running when it came would favour slow filters, which
/// are the likelier to be running at any instant.)
/// Returns filter and prioritize latencies and how many mix changes they cover.
fn mix_change(ext: &Extender, iters: usize) -> (Stats, Stats, usize) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let total: u32 = STREAM_SHAPES.iter().map(|s| s.2).sum();
    let (mut f, mut p) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    // A new mix is staged by the filter that learns it, and replaces the live one when the
    // prescorer has warmed it: either is a change, and is timed.
    let generations = || {
        (
            ext.mix().generation(),
            ext.staged_mix().map(|m| m.generation()),
        )
    };
    let mut generation = generations();
    let (mut left, mut changes, mut skip_filter) = (0usize, 0usize, false);
    let warmup = iters / 10;
    let mut i = 0usize;
    while p.len() < warmup + iters {
        let phase = i / PHASE_PODS;
        let mut pick = rng.random_range(0..total);
        let shape = (0..STREAM_SHAPES.len())
            .find(|k| {
                let w = STREAM_SHAPES[(k + phase) % STREAM_SHAPES.len()].2;
                let hit = pick < w;
                pick = pick.saturating_sub(w);
                hit
            })
            .unwrap();
        let (vram, gpus, _) = STREAM_SHAPES[shape];
        let annotations =
            serde_json::json!({"peakfit.io/vram": vram, "peakfit.io/gpus": gpus.to_string()});
        let body = request_for(&pod_json(
            &format!("drift-{i:06}"),
            &format!("00000000-0000-4000-a000-{i:012x}"),
            &annotations,
        ));
        i += 1;
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        std::hint::black_box(to_go_json(&ext.filter(args)).unwrap());
        let tf = t.elapsed();
        let now = generations();
        let staged_here = now.1.is_some() && now.1 != generation.1 && now.0 == generation.0;
        let switched = now.0 != generation.0;
        if staged_here || switched {
            left = AFTER_CHANGE;
            changes += 1;
            // The prescorer switched while this filter ran (a staged mix was live before it
            // ended): not this filter's doing. Without staging, the filter made the change.
            skip_filter = switched && generation.1.is_some();
        }
        generation = now;
        if left == 0 {
            continue;
        }
        left -= 1;
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        std::hint::black_box(to_go_json(&ext.prioritize(args)).unwrap());
        p.push(t.elapsed());
        if !std::mem::take(&mut skip_filter) {
            f.push(tf);
        }
    }
    let skip = |v: Vec<Duration>| Stats(v[warmup..].to_vec());
    (skip(f), skip(p), changes)
}

/// Every request a class no request had before: no node's memo can answer, the worst case.
fn cold(ext: &Extender, iters: usize) -> Stats {
    let mut k = 0u64;
    measure(iters, || {
        k += 1;
        let body = request_for(&pod_json(
            "cold",
            "bench-cold",
            &serde_json::json!({"peakfit.io/vram": format!("{}Mi", 10_240 + k)}),
        ));
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        std::hint::black_box(to_go_json(&ext.prioritize(args)).unwrap());
        t.elapsed()
    })
}

struct Stats(Vec<Duration>);

impl Stats {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[peakfit::convert::f64_to_usize(((v.len() as f64 - 1.0) * p).round())]
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what:<44} n={:<5} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
            self.0.len(),
            self.pct(0.50).as_secs_f64() * 1e3,
            self.pct(0.99).as_secs_f64() * 1e3,
            self.pct(1.0).as_secs_f64() * 1e3,
        )
    }
}

/// Runs `f` `iters` times after a tenth as many warm-up runs; `f` returns what it timed.
fn measure(iters: usize, mut f: impl FnMut() -> Duration) -> Stats {
    for _ in 0..iters / 10 {
        f();
    }
    Stats((0..iters).map(|_| f()).collect())
}

/// `measure` timing the whole of `f`.
fn timed(iters: usize, mut f: impl FnMut()) -> Stats {
    measure(iters, || {
        let t = Instant::now();
        f();
        t.elapsed()
    })
}

/// One keep-alive HTTP/1.1 POST; returns the body.
fn post(conn: &mut BufReader<TcpStream>, path: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let s = conn.get_mut();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut out = vec![0; len];
    conn.read_exact(&mut out).unwrap();
    out
}

fn main() {
    let iters: usize = std::env::var("PEAKFIT_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let only = std::env::var("PEAKFIT_BENCH_ONLY").unwrap_or_default();
    let wanted = |scenario: &str| only.is_empty() || only.split(',').any(|s| s == scenario);
    if wanted("spread") {
        let sizes =
            std::env::var("PEAKFIT_BENCH_SPREAD_NODES").unwrap_or_else(|_| "1000,5000".into());
        for nodes in sizes.split(',') {
            let nodes: usize = nodes
                .trim()
                .parse()
                .expect("PEAKFIT_BENCH_SPREAD_NODES: node counts");
            spread::run(nodes, spread::PODS);
        }
        if only == "spread" {
            return;
        }
    }
    if wanted("unschedulable") {
        unschedulable(iters);
        if only == "unschedulable" {
            return;
        }
    }
    let body = request_body();
    let distinct = match std::env::var("PEAKFIT_BENCH_CLUSTER").as_deref() {
        Ok("distinct") => true,
        Ok("" | "regular") | Err(_) => false,
        Ok(other) => panic!("PEAKFIT_BENCH_CLUSTER={other:?}: expected regular or distinct"),
    };

    // Memory: the index alone, then as the server holds it (with its per-GPU and per-pod gauges).
    let before = rss_bytes();
    let t = Instant::now();
    let bare = Index::new();
    build(&bare, distinct, PODS);
    let bare_rss = rss_bytes().saturating_sub(before);
    println!(
        "index without metrics: {NODES} nodes x {GPUS} GPUs, {} pods, built in {:.1} s, RSS +{:.1} MiB",
        bare.pod_count(),
        t.elapsed().as_secs_f64(),
        bare_rss as f64 / f64::from(1 << 20)
    );
    drop(bare);
    let before = rss_bytes();
    let t = Instant::now();
    let index = Arc::new(Index::new());
    let metrics = Arc::new(ExtenderMetrics::with_index(index.clone(), || {
        jiff::Timestamp::now().as_second()
    }));
    build(&index, distinct, PODS);
    println!(
        "index again (ledger gauges are read at scrape, nothing kept): built in {:.1} s, RSS +{:.1} MiB (RSS now {:.1} MiB; freed pages of the first build may be reused)",
        t.elapsed().as_secs_f64(),
        rss_bytes().saturating_sub(before) as f64 / f64::from(1 << 20),
        rss_bytes() as f64 / f64::from(1 << 20)
    );

    let ext = Arc::new(Extender::new(
        index,
        metrics,
        Arc::new(MemoryBinder::default()),
    ));
    // As `peakfit extender` runs it (`--prescore-interval`, same env and parser, default 100ms;
    // 0: off).
    let prescore = std::env::var("PEAKFIT_PRESCORE_INTERVAL")
        .ok()
        .map_or(Duration::from_millis(100), |v| {
            peakfit::flags::parse_duration(&v).expect("PEAKFIT_PRESCORE_INTERVAL")
        });
    if !prescore.is_zero() {
        ext.spawn_prescorer(prescore).unwrap();
    }
    println!("prescorer: every {prescore:?} (0: off)");
    let states: std::collections::HashSet<_> = ext
        .index
        .all_slots()
        .iter()
        .map(|s| Arc::as_ptr(s.read().scores()) as usize)
        .collect();
    println!(
        "cluster: {} ({} distinct node states)",
        if distinct { "distinct" } else { "regular" },
        states.len()
    );
    // Sanity: the decision is a real one.
    let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
    let r = ext.filter(args);
    let kept = r.node_names.as_ref().map_or(0, Vec::len);
    let refused = r
        .failed_nodes
        .as_ref()
        .map_or(0, std::collections::BTreeMap::len)
        + r.failed_and_unresolvable_nodes
            .as_ref()
            .map_or(0, std::collections::BTreeMap::len);
    println!("filter of a 24Gi pod: {kept} nodes fit, {refused} refused");
    assert_eq!(kept + refused, NODES);

    println!(
        "request body: {} bytes (node-cache mode, {NODES} names)",
        body.len()
    );
    if wanted("repeat") {
        let (f, p) = repeat_verbs(&ext, &body, iters);
        println!("{}", f.line("filter, in process (decode+decide+encode)"));
        println!("{}", p.line("prioritize, in process"));
    }

    if wanted("model") {
        let pod_value = model_pod();
        let body = request_for(&pod_value);
        let pod: Pod = serde_json::from_value(pod_value).unwrap();
        let r = ext
            .index
            .request_of(&pod)
            .expect("the model sizes the bench pod");
        println!("model pod (qwen3-8b, 8 x 8192 tokens): request {r:?}");
        let m = timed(iters, || {
            std::hint::black_box(ext.index.request_of(std::hint::black_box(&pod)).unwrap());
        });
        println!("{}", m.line("model pod: Index::request_of alone"));
        let (f, p) = repeat_verbs(&ext, &body, iters);
        println!("{}", f.line("model pod: filter, in process"));
        println!("{}", p.line("model pod: prioritize, in process"));
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let router = routes::router(ext.clone());
    rt.spawn(async move { axum::serve(listener, router).await });
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut conn = BufReader::new(stream);
    let first = post(&mut conn, "/filter", &body);
    assert!(first.starts_with(b"{\"Nodes\":null,\"NodeNames\":["));
    if wanted("http") {
        let hf = timed(iters, || {
            std::hint::black_box(post(&mut conn, "/filter", &body));
        });
        println!("{}", hf.line("filter, loopback HTTP (keep-alive)"));
        let hp = timed(iters, || {
            std::hint::black_box(post(&mut conn, "/prioritize", &body));
        });
        println!("{}", hp.line("prioritize, loopback HTTP (keep-alive)"));
    }
    if wanted("stream") {
        println!(
            "workload stream (filter, prioritize, bind; runs of 1-16 pods of {} shapes, {STREAM_RESIDENT} stay bound):",
            STREAM_SHAPES.len()
        );
        let sources = || {
            ["memo", "computed", "prescored"].map(|source| {
                ext.metrics
                    .node_scores
                    .get_or_create(&ScoreSourceLabels { source })
                    .get()
            })
        };
        let before = sources();
        let (sf, sp) = workload_stream(&ext, &rt, iters);
        let after = sources();
        println!("{}", sf.line("  filter, in process"));
        println!("{}", sp.line("  prioritize, in process"));
        let [memo, computed, prescored] = [0, 1, 2].map(|i| after[i] - before[i]);
        println!(
            "  node scores prioritize used: {:.1} % from memos, {computed} computed in requests; {prescored} prescored",
            100.0 * memo as f64 / (memo + computed).max(1) as f64
        );
    }
    if wanted("cold") {
        let c = cold(&ext, iters);
        println!("{}", c.line("prioritize, a new class every request"));
    }
    if wanted("mixchange") {
        let (f, p, changes) = mix_change(&ext, iters);
        println!(
            "after a shape mix change ({changes} staged or switched to; the filter that staged it, and the next {} pods after each):",
            AFTER_CHANGE - 1
        );
        println!("{}", f.line("  filter, in process"));
        println!("{}", p.line("  prioritize, in process"));
    }
    if wanted("criterion") {
        criterion_estimates(&ext, &body);
    }
}

/// Filter, then prioritize, of one request body asked again and again, in process (decode,
/// decide, encode).
fn repeat_verbs(ext: &Extender, body: &[u8], iters: usize) -> (Stats, Stats) {
    let f = timed(iters, || {
        let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
        std::hint::black_box(to_go_json(&ext.filter(args)).unwrap());
    });
    let p = timed(iters, || {
        let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
        std::hint::black_box(to_go_json(&ext.prioritize(args)).unwrap());
    });
    (f, p)
}

/// Pods in the nudger's cluster (issue 23): what `Index::any_pod_left_unschedulable` is asked
/// over.
const NUDGE_PODS: usize = 50_000;

/// The nudger's question when a node improved and its filter's record of refused pods is
/// empty: does kube-scheduler leave some pod peakfit places unschedulable? Asked of 5,000 nodes
/// × 8 GPUs with 50,000 bound pods and none waiting, the answer that costs the most where it
/// is worked out by a pass over the pod table.
fn unschedulable(iters: usize) {
    let index = Index::new();
    let t = Instant::now();
    build(&index, false, NUDGE_PODS);
    println!(
        "index for the nudger: {NODES} nodes x {GPUS} GPUs, {} pods, built in {:.1} s",
        index.pod_count(),
        t.elapsed().as_secs_f64()
    );
    assert!(!index.any_pod_left_unschedulable());
    let s = timed(iters, || {
        std::hint::black_box(index.any_pod_left_unschedulable());
    });
    println!(
        "{}",
        s.line(&format!("any_pod_left_unschedulable, {NUDGE_PODS} pods"))
    );
    // The nudger asks at most once a tick (1 s), after the requests have had the caches: each
    // call after walking a buffer larger than the last-level cache.
    let mut flush = vec![0u8; 64 << 20];
    let cold = measure(iters.div_ceil(10), || {
        for i in (0..flush.len()).step_by(64) {
            flush[i] = flush[i].wrapping_add(1);
        }
        std::hint::black_box(&flush);
        let t = Instant::now();
        std::hint::black_box(index.any_pod_left_unschedulable());
        t.elapsed()
    });
    println!(
        "{}",
        cold.line("  the same, caches flushed before each call")
    );
}

#[path = "extender/spread.rs"]
mod spread;

/// Criterion's estimates (the mean time per call and its confidence interval) for the same
/// in-process calls, as a cross-check of the percentiles above that is robust to a few slow
/// outliers. `PEAKFIT_BENCH_ONLY=criterion` runs only these.
fn criterion_estimates(ext: &Extender, body: &[u8]) {
    let mut c = criterion::Criterion::default()
        .measurement_time(Duration::from_secs(5))
        .sample_size(50)
        .configure_from_args();
    let mut g = c.benchmark_group("extender_5000_nodes");
    g.bench_function("filter_in_process", |b| {
        b.iter(|| {
            let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
            to_go_json(&ext.filter(args)).unwrap()
        });
    });
    g.bench_function("prioritize_in_process", |b| {
        b.iter(|| {
            let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
            to_go_json(&ext.prioritize(args)).unwrap()
        });
    });
    let mut k = 1_000_000u64;
    g.bench_function("prioritize_new_class", |b| {
        b.iter_batched(
            || {
                k += 1;
                request_for(&pod_json(
                    "cold",
                    "bench-cold",
                    &serde_json::json!({"peakfit.io/vram": format!("{k}Ki")}),
                ))
            },
            |body| {
                let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
                to_go_json(&ext.prioritize(args)).unwrap()
            },
            criterion::BatchSize::LargeInput,
        );
    });
    g.finish();
    c.final_summary();
}
