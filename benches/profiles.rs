//! Issue 21's goal for learning: profiles cost the extender less than 5 % more CPU at 5,000 nodes
//! × 8 GPUs with 50,000 pods. A bench binary (harness = false) printing what it measured.
//!
//! The cluster: 50,000 bound pods of 500 Deployments (100 replicas each, pods as the Deployment
//! controller makes them), every one with its peak in its node's report (`podPeaks`, 20 % above
//! what it asked). Two extenders over the same index: one with `--learn off` and no profiles
//! (before issue 21), one with `--learn all` and a profile per Deployment (so every request is
//! sized from one). Both answer the same stream of pending replicas (filter then prioritize over
//! every node), in alternating blocks so that machine noise falls on both alike; the process's
//! CPU time (utime + stime) is read around each block. The profile leader's pass (every pod's
//! peak joined with its workload, folded into 500 profiles; the API writes left out) is timed
//! too, and charged per `--profile-interval` (30 s).
//!
//! `cargo bench --bench profiles` (env `PEAKFIT_BENCH_ITERS`, default 400 requests per side).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use peakfit::cluster::binding::MemoryBinder;
use peakfit::cluster::index::{ASSIGNED_GPUS, Index, RESERVED_BYTES};
use peakfit::cluster::profile::store::{ProfileStore, fold};
use peakfit::cluster::{NodeGpuReport, NodeGpuReportSpec};
use peakfit::extender::Extender;
use peakfit::extender::wire::{ExtenderArgs, to_go_json};
use peakfit::inventory::{GpuDevice, NodeGpuReportStatus, NvmlStatus, PodPeak};
use peakfit::learn::{LearnMode, LearnPolicy};
use peakfit::metrics::extender::ExtenderMetrics;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 5_000;
const GPUS: usize = 8;
const PODS: usize = 50_000;
const WORKLOADS: usize = 500;
const GIB: u64 = 1 << 30;
const H100: u64 = 81_559 << 20;
const HASH: &str = "7d9f8c6b5";

fn uuid(node: usize, gpu: usize) -> String {
    format!("GPU-{node:08x}-0000-4000-8000-{gpu:012x}")
}

/// What a replica of workload `w` asks per GPU: 2 to 17 GiB.
fn want(w: usize) -> u64 {
    (2 + (w % 16) as u64) * GIB
}

fn replica(w: usize, name: &str, uid: &str, node: Option<(usize, usize)>) -> Pod {
    let mut ann = serde_json::json!({"peakfit.io/vram": format!("{}Gi", want(w) / GIB)});
    if let Some((n, g)) = node {
        ann[ASSIGNED_GPUS] = uuid(n, g).into();
        ann[RESERVED_BYTES] = want(w).to_string().into();
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name, "namespace": format!("team-{:02}", w % 40), "uid": uid,
            "labels": {"pod-template-hash": HASH},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("wl-{w:03}-{HASH}"), "uid": format!("rs-{w}"), "controller": true}],
            "annotations": ann,
        },
        "spec": {
            "nodeName": node.map(|(n, _)| format!("gpu-node-{n:05}")),
            "containers": [{"name": "c", "image": "x",
                            "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running", "startTime": "2026-11-26T00:00:00Z"},
    }))
    .unwrap()
}

fn build(index: &Index) {
    let per_node = PODS / NODES;
    for n in 0..NODES {
        let name = format!("gpu-node-{n:05}");
        let mut peaks = Vec::new();
        for k in 0..per_node {
            let i = k * NODES + n;
            peaks.push(PodPeak {
                pod_uid: format!("pod-{i:06}"),
                gpu_uuid: uuid(n, (i / NODES) % GPUS),
                peak_bytes: want(i % WORKLOADS) * 6 / 5,
                at: "2026-11-26T01:00:00Z".into(),
            });
        }
        let mut r = NodeGpuReport::new(
            &name,
            NodeGpuReportSpec {
                node_name: name.clone(),
            },
        );
        r.status = Some(NodeGpuReportStatus {
            observed_at: jiff::Timestamp::now().to_string(),
            nvml: NvmlStatus {
                up: true,
                ..Default::default()
            },
            gpus: (0..GPUS)
                .map(|g| GpuDevice {
                    index: peakfit::convert::usize_to_u32(g),
                    uuid: uuid(n, g),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_total_bytes: H100,
                    memory_free_bytes: H100,
                    ..Default::default()
                })
                .collect(),
            pod_peaks: peaks,
            ..Default::default()
        });
        index.apply_report(&r);
    }
    for i in 0..PODS {
        let n = i % NODES;
        let g = (i / NODES) % GPUS;
        index.apply_pod(&replica(
            i % WORKLOADS,
            &format!("wl-{:03}-{HASH}-{i:06}", i % WORKLOADS),
            &format!("pod-{i:06}"),
            Some((n, g)),
        ));
    }
}

/// The process's CPU time so far (user + system), from /proc/self/stat (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}

fn request(i: usize) -> Vec<u8> {
    let w = i % WORKLOADS;
    let pod = replica(
        w,
        &format!("pending-{i:06}"),
        &format!("pending-{i:06}"),
        None,
    );
    let names: Vec<String> = (0..NODES).map(|n| format!("gpu-node-{n:05}")).collect();
    serde_json::to_vec(&serde_json::json!({"Pod": pod, "Nodes": null, "NodeNames": names})).unwrap()
}

/// Filter and prioritize of one pending replica; its wall time.
fn answer(ext: &Extender, body: &[u8]) -> Duration {
    let t = Instant::now();
    let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
    std::hint::black_box(to_go_json(&ext.filter(args)).unwrap());
    let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
    std::hint::black_box(to_go_json(&ext.prioritize(args)).unwrap());
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let iters: usize = std::env::var("PEAKFIT_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let t = Instant::now();
    let index = Arc::new(Index::new());
    build(&index);
    println!(
        "built {NODES} nodes x {GPUS} GPUs, {} pods of {WORKLOADS} deployments in {:.1?}",
        index.pod_count(),
        t.elapsed()
    );

    // The leader's pass, as `writer::pass` does it less the API calls.
    let learned = Arc::new(ProfileStore::default());
    learned.set_policy(LearnPolicy {
        mode: LearnMode::All,
        ..LearnPolicy::default()
    });
    let mut passes = Vec::new();
    for round in 0..5 {
        let t = Instant::now();
        let now = 1_795_000_000 + round * 30;
        for (key, seen) in index.observations() {
            let previous = learned.get(&key);
            let status = fold(previous.as_ref().map(|k| &k.status), &seen, now, 0.05);
            learned.set(key, status);
        }
        passes.push(t.elapsed());
    }
    assert_eq!(learned.len(), WORKLOADS);
    let pass = median(passes);
    println!(
        "profile pass (observations + fold of {WORKLOADS} profiles): median {pass:.1?}, i.e. {:.3} % of one core at --profile-interval 30s",
        pass.as_secs_f64() / 30.0 * 100.0
    );

    let without = Arc::new(ProfileStore::default());
    without.set_policy(LearnPolicy {
        mode: LearnMode::Off,
        ..LearnPolicy::default()
    });
    let make = |store: Arc<ProfileStore>| {
        Extender::new(
            index.clone(),
            Arc::new(ExtenderMetrics::new()),
            Arc::new(MemoryBinder::default()),
        )
        .with_profiles(store)
    };
    let (off, on) = (make(without), make(learned));
    // Sized from the profile indeed: 20 % above the request plus the margin.
    let probe = request(3);
    let args: ExtenderArgs = serde_json::from_slice(&probe).unwrap();
    let sized = on.profiles.size(
        &peakfit::cluster::index::pod_request_of(args.pod.as_ref().unwrap())
            .unwrap()
            .unwrap(),
        || {
            Some(peakfit::cluster::workload::workload_of(
                args.pod.as_ref().unwrap(),
            ))
        },
        true,
    );
    assert!(sized.note.is_some(), "{sized:?}");
    println!("a request is {}", sized.note.unwrap());

    let bodies: Vec<Vec<u8>> = (0..iters).map(request).collect();
    // Warm both (shape mix, memo, allocator).
    for b in bodies.iter().take(50) {
        answer(&off, b);
        answer(&on, b);
    }
    let block = 50;
    let (mut wall_off, mut wall_on) = (Vec::new(), Vec::new());
    let (mut cpu_off, mut cpu_on) = (Duration::ZERO, Duration::ZERO);
    for chunk in bodies.chunks(block) {
        for (ext, wall, cpu) in [
            (&off, &mut wall_off, &mut cpu_off),
            (&on, &mut wall_on, &mut cpu_on),
        ] {
            let c = cpu_time();
            for b in chunk {
                wall.push(answer(ext, b));
            }
            *cpu += cpu_time().saturating_sub(c);
        }
    }
    let (m_off, m_on) = (median(wall_off), median(wall_on));
    println!(
        "filter+prioritize over {NODES} nodes, {iters} pending replicas each: without profiles median {m_off:.2?}, CPU {cpu_off:.2?}; with profiles median {m_on:.2?}, CPU {cpu_on:.2?}"
    );
    println!(
        "ratio with/without: median {:.3}, CPU {:.3}",
        m_on.as_secs_f64() / m_off.as_secs_f64(),
        cpu_on.as_secs_f64() / cpu_off.as_secs_f64()
    );
}
