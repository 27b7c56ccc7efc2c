//! What kube-scheduler sends in `scheduler_throughput`'s spread variant, replayed in process: the
//! chart's `nodeCacheCapable: true`, so names, not nodes; the whole pod as the API server
//! defaulted it (the shape of the v1.36 capture in `../shared/fixtures`); per pod, a filter over
//! the scheduler's window of feasible nodes (the adaptive `percentageOfNodesToScore`: 420 of
//! 1,000 nodes, 500 of 5,000, the window moving on by as many each pod), a prioritize over the
//! nodes filter kept, and a bind to the best of them. Nodes start empty, 8 × H100 80GB; pods ask
//! 48, 56, 64 and 72 GiB in turn, one GPU each, as `scheduler_throughput` creates them.
//!
//! The throughput bench's difference between the two profiles is about these two calls (its
//! README section), so each call's phases are timed apart: decoding the request, the verb's
//! decision and encoding the reply.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use peakfit::cluster::binding::MemoryBinder;
use peakfit::cluster::index::Index;
use peakfit::extender::Extender;
use peakfit::extender::wire::{ExtenderArgs, ExtenderBindingArgs, to_go_json};
use peakfit::inventory::GpuDevice;
use peakfit::metrics::extender::ExtenderMetrics;

use super::{GPUS, H100, Stats};

/// Pods per run, as `scheduler_throughput` creates by default.
pub const PODS: usize = 5_000;

/// `scheduler_throughput`'s spread sizes, in turn.
const SIZES: [&str; 4] = ["48Gi", "56Gi", "64Gi", "72Gi"];

/// kube-scheduler's `numFeasibleNodesToFind` with `percentageOfNodesToScore` unset (the chart
/// sets none): 50 % less 1 % per 125 nodes, at least 5 % and 100 nodes.
pub fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < 100 {
        return nodes;
    }
    let percentage = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percentage / 100).max(100)
}

/// A pod as kube-scheduler sends it to the extender: what the API server's defaulting and the
/// service-account admission add to `scheduler_throughput`'s pod (`e2e_support::gpu_pod`).
fn pod_json(i: usize, vram: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "name": format!("b-{i:05}"),
            "namespace": "default",
            "uid": format!("7d3c2a10-0000-4000-8000-{i:012x}"),
            "resourceVersion": format!("{}", 10_000 + i),
            "generation": 1,
            "creationTimestamp": "2026-11-26T17:48:06Z",
            "annotations": {"peakfit.io/vram": vram},
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-gbzd6", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ], "defaultMode": 420}}],
            "containers": [{
                "name": "main",
                "image": "vllm/vllm-openai:v0.6.3",
                "resources": {"requests": {"cpu": "100m"}},
                "volumeMounts": [{"name": "kube-api-access-gbzd6", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "peakfit-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    })
}

/// `nodes` empty nodes of 8 × H100 80GB with fresh reports.
fn build(index: &Index, nodes: usize) -> Vec<String> {
    let names: Vec<String> = (0..nodes).map(|n| format!("node-{n:05}")).collect();
    for name in &names {
        index.apply_node(&super::node(name, "64", "512Gi"));
        let gpus = (0..GPUS)
            .map(|g| GpuDevice {
                index: peakfit::convert::usize_to_u32(g),
                uuid: format!("GPU-{name}-{g}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: H100,
                memory_reserved_bytes: 512 << 20,
                memory_free_bytes: H100 - (512 << 20),
                ..Default::default()
            })
            .collect();
        index.apply_report(&super::fresh_report(name, gpus));
    }
    names
}

/// The per-pod times of one verb, by phase.
#[derive(Default)]
struct Phases {
    decode: Vec<Duration>,
    decide: Vec<Duration>,
    encode: Vec<Duration>,
    total: Vec<Duration>,
}

impl Phases {
    /// Decodes `body`, answers it with `verb` and encodes the answer as the server does,
    /// timing each phase (kept when `record`); returns the answer and the reply's length.
    fn call<T: serde::Serialize>(
        &mut self,
        record: bool,
        body: &[u8],
        verb: impl FnOnce(ExtenderArgs) -> T,
    ) -> (T, usize) {
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
        let decode = t.elapsed();
        let t = Instant::now();
        let answer = verb(args);
        let decide = t.elapsed();
        let t = Instant::now();
        let reply = std::hint::black_box(to_go_json(&answer).unwrap());
        let encode = t.elapsed();
        if record {
            self.decode.push(decode);
            self.decide.push(decide);
            self.encode.push(encode);
            self.total.push(decode + decide + encode);
        }
        (answer, reply.len())
    }

    fn print(self, verb: &str) {
        for (phase, v) in [
            ("decode", self.decode),
            ("decide", self.decide),
            ("encode", self.encode),
            ("total", self.total),
        ] {
            let mean = v.iter().sum::<Duration>().as_secs_f64() / v.len().max(1) as f64;
            println!(
                "{}  mean={:>8.3} ms",
                Stats(v).line(&format!("  {verb} {phase}")),
                mean * 1e3
            );
        }
    }
}

/// Schedules `pods` pods over `nodes` nodes (the first tenth untimed: the extender learns the
/// mix) and prints each verb's phases.
pub fn run(nodes: usize, pods: usize) {
    let index = Arc::new(Index::new());
    let metrics = Arc::new(ExtenderMetrics::with_index(index.clone(), || {
        jiff::Timestamp::now().as_second()
    }));
    let names = build(&index, nodes);
    let ext = Arc::new(Extender::new(
        index,
        metrics,
        Arc::new(MemoryBinder::default()),
    ));
    // As `peakfit extender` runs by default (`--prescore-interval 100ms`).
    ext.spawn_prescorer(Duration::from_millis(100)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let window = feasible_nodes_to_find(nodes);
    println!(
        "spread, as kube-scheduler asks (node-cache mode): {nodes} nodes x {GPUS} H100, {window} names per filter, {pods} pods of {}",
        SIZES.join("/")
    );
    let warmup = pods / 10;
    let timed = pods - warmup;
    let (mut f, mut p) = (Phases::default(), Phases::default());
    let (mut start, mut kept_sum, mut bytes) = (0usize, 0usize, (0usize, 0usize));
    for i in 0..pods {
        let pod_value = pod_json(i, SIZES[i % SIZES.len()]);
        let pod: Pod = serde_json::from_value(pod_value.clone()).unwrap();
        ext.index.apply_pod(&pod);
        let candidates: Vec<&str> = (0..window)
            .map(|k| names[(start + k) % nodes].as_str())
            .collect();
        start = (start + window) % nodes;
        let request = |names: &[&str]| {
            serde_json::to_vec(&serde_json::json!({
                "Pod": pod_value, "Nodes": null, "NodeNames": names,
            }))
            .unwrap()
        };
        let timed = i >= warmup;
        let body = request(&candidates);
        let (kept, reply) = f.call(timed, &body, |args| ext.filter(args));
        let fits = kept.node_names.unwrap_or_default();
        let pbody = request(&fits.iter().map(String::as_str).collect::<Vec<_>>());
        let (scores, preply) = p.call(timed, &pbody, |args| ext.prioritize(args));
        if timed {
            kept_sum += fits.len();
            bytes.0 += body.len() + reply;
            bytes.1 += pbody.len() + preply;
        }
        // The scheduler's other score plugins tie here: the extender's best node wins.
        let Some(best) = scores.iter().max_by_key(|h| h.score) else {
            ext.index.delete_pod_key(&pod.metadata.uid.clone().unwrap());
            continue;
        };
        let r = rt.block_on(ext.bind(ExtenderBindingArgs {
            pod_name: pod.metadata.name.clone().unwrap(),
            pod_namespace: "default".into(),
            pod_uid: pod.metadata.uid.clone().unwrap(),
            node: best.host.clone(),
        }));
        assert!(r.error.is_empty(), "bind: {}", r.error);
    }
    println!(
        "  {:.0} of {window} nodes kept per filter on average; request+reply {:.1} KiB (filter), {:.1} KiB (prioritize)",
        kept_sum as f64 / timed as f64,
        bytes.0 as f64 / timed as f64 / 1024.0,
        bytes.1 as f64 / timed as f64 / 1024.0
    );
    f.print("filter");
    p.print("prioritize");
}
