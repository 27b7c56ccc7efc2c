//! Prioritize remembers each node's score (`placement::memo`); these tests drive a scheduling
//! loop (filter, prioritize, bind, pods finishing, fresh GPU reports) and check after every
//! step that what prioritize answered is what scoring every node from scratch gives.

mod extender_support;

use std::sync::Arc;

use extender_support::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use peakfit::cluster::NodeGpuReport;
use peakfit::cluster::binding::MemoryBinder;
use peakfit::cluster::index::Index;
use peakfit::extender::Extender;
use peakfit::extender::wire::{ExtenderArgs, ExtenderBindingArgs};
use peakfit::inventory::GpuDevice;
use peakfit::metrics::extender::ExtenderMetrics;
use peakfit::placement::{
    FitConfig, PodClass, check_class, place_score, scores_0_to_10_unique, stable_name_hash,
    used_share,
};

const NODES: usize = 12;
const GPUS: usize = 4;
const TOTAL: u64 = 80 * GIB;

fn node_name(n: usize) -> String {
    format!("node-{n:02}")
}

fn report(n: usize, extra_used: u64) -> NodeGpuReport {
    let gpus = (0..GPUS)
        .map(|g| GpuDevice {
            name: "NVIDIA H100 80GB HBM3".into(),
            // A process of no pod, different on every GPU: nodes start unlike each other.
            ..mk_gpu(
                g,
                format!("GPU-{n:02}-{g}"),
                TOTAL,
                ((n * GPUS + g) % 7) as u64 * 5 * GIB + extra_used,
            )
        })
        .collect();
    mk_report(&node_name(n), "2026-11-21T00:00:00Z", gpus)
}

fn pod(name: &str, vram: &str, gpus: u32) -> Pod {
    mk_pod(
        name,
        &[
            ("peakfit.io/vram", vram),
            ("peakfit.io/gpus", &gpus.to_string()),
        ],
    )
}

fn args(pod: &Pod) -> ExtenderArgs {
    ExtenderArgs {
        pod: Some(pod.clone()),
        node_names: Some((0..NODES).map(node_name).collect()),
        ..Default::default()
    }
}

/// What prioritize must answer: every node scored from scratch with the extender's mix.
fn from_scratch(ext: &Extender, index: &Index, pod: &Pod) -> Vec<u8> {
    let req = peakfit::cluster::index::pod_request_of(pod)
        .unwrap()
        .unwrap();
    let class = PodClass::from(req.shape());
    let mix = ext.mix();
    let raw: Vec<f64> = (0..NODES)
        .map(|n| {
            let slot = index.node(&node_name(n)).unwrap();
            let st = slot.read();
            place_score(&st.ledger, &class, ext.scoring, &mix, &ext.fit, ext.now())
                .unwrap_or(f64::NAN)
        })
        .collect();
    // One node at 10: among the tied, the fuller, then the highest name hash.
    let key = |n: usize| {
        let slot = index.node(&node_name(n)).unwrap();
        let used = used_share(&slot.read().ledger);
        (used, stable_name_hash(&node_name(n)))
    };
    scores_0_to_10_unique(&raw, |a, b| {
        let (ka, kb) = (key(a), key(b));
        ka.0.total_cmp(&kb.0).then(ka.1.cmp(&kb.1))
    })
}

/// What filter must answer: the nodes that fit, and every other node's reason.
fn filter_from_scratch(
    ext: &Extender,
    index: &Index,
    pod: &Pod,
) -> (Vec<String>, std::collections::BTreeMap<String, String>) {
    let req = peakfit::cluster::index::pod_request_of(pod)
        .unwrap()
        .unwrap();
    let class = PodClass::from(req.shape());
    let (mut kept, mut refused) = (Vec::new(), std::collections::BTreeMap::new());
    for n in 0..NODES {
        let slot = index.node(&node_name(n)).unwrap();
        match check_class(&slot.read().ledger, &class, &ext.fit, ext.now()) {
            Ok(()) => kept.push(node_name(n)),
            Err(r) => {
                refused.insert(node_name(n), r.to_string());
            }
        }
    }
    (kept, refused)
}

fn cluster() -> Arc<Index> {
    let index = Arc::new(Index::new());
    for n in 0..NODES {
        index.apply_node(&mk_node(&node_name(n)));
        index.apply_report(&report(n, 0));
    }
    index
}

fn extender(index: &Arc<Index>) -> Extender {
    Extender::new(
        index.clone(),
        Arc::new(ExtenderMetrics::new()),
        Arc::new(MemoryBinder::default()),
    )
    .with_fit(FitConfig {
        max_report_age_secs: None,
        ..FitConfig::default()
    })
}

#[tokio::test]
async fn remembered_scores_always_equal_a_rescore() {
    let index = cluster();
    let ext = extender(&index);
    // Runs of one shape, as replicas come; three shapes, one of them two GPUs wide.
    let shapes = [("10Gi", 1), ("30Gi", 2), ("18Gi", 1)];
    let mut bound: Vec<Pod> = Vec::new();
    let mut changed_scores = 0;
    let mut last: Option<Vec<u8>> = None;
    let mut steps_with_refusals = 0;
    for step in 0..60 {
        let (vram, gpus) = shapes[(step / 4) % shapes.len()];
        let p = pod(&format!("p{step:02}"), vram, gpus);
        index.apply_pod(&p);
        let filtered = ext.filter(args(&p));
        // Filter works each verdict out once per node state: the same as node by node.
        let mut refused = filtered.failed_nodes.clone().unwrap_or_default();
        refused.extend(
            filtered
                .failed_and_unresolvable_nodes
                .clone()
                .unwrap_or_default(),
        );
        let kept = filtered.node_names.unwrap_or_default();
        if kept.len() < NODES {
            steps_with_refusals += 1;
        }
        assert_eq!(
            (kept.clone(), refused),
            filter_from_scratch(&ext, &index, &p),
            "step {step}: filter's answer differs from a check of every node"
        );
        let answered: Vec<u8> = ext
            .prioritize(args(&p))
            .iter()
            .map(|h| u8::try_from(h.score).expect("a score from 0 to 10"))
            .collect();
        assert_eq!(
            answered,
            from_scratch(&ext, &index, &p),
            "step {step}: prioritize's answer differs from a rescore"
        );
        // Asked again at once, every node answers from its memo: still the same.
        let again: Vec<u8> = ext
            .prioritize(args(&p))
            .iter()
            .map(|h| u8::try_from(h.score).expect("a score from 0 to 10"))
            .collect();
        assert_eq!(again, answered, "step {step}: a repeated request differs");
        if last.as_ref().is_some_and(|l| *l != answered) {
            changed_scores += 1;
        }
        last = Some(answered.clone());

        // Bind to the best node that fits: that node's ledger changes.
        let best = (0..NODES)
            .filter(|&n| kept.contains(&node_name(n)))
            .max_by_key(|&n| (answered[n], std::cmp::Reverse(n)));
        if let Some(n) = best {
            let r = ext
                .bind(ExtenderBindingArgs {
                    pod_name: p.metadata.name.clone().unwrap(),
                    pod_namespace: "ml".into(),
                    pod_uid: p.metadata.uid.clone().unwrap(),
                    node: node_name(n),
                })
                .await;
            assert!(r.error.is_empty(), "step {step}: {}", r.error);
            let mut p = p.clone();
            p.spec.as_mut().unwrap().node_name = Some(node_name(n));
            let slot = index.node(&node_name(n)).unwrap();
            assert!(
                slot.read()
                    .ledger
                    .gpus
                    .iter()
                    .any(|g| g.reservation(p.metadata.uid.as_deref().unwrap()).is_some()),
                "step {step}: bind recorded nothing"
            );
            bound.push(p);
        }
        // Every fifth step the oldest pod finishes, and a node's agent reports more use.
        if step % 5 == 4 && !bound.is_empty() {
            index.delete_pod(&bound.remove(0));
            index.apply_report(&report(step % NODES, 3 * GIB));
        }
        // The prescorer runs now and then between requests, as its thread does.
        if step % 3 == 0 {
            ext.prescore();
        }
    }
    // The loop exercised changing answers, not one answer sixty times.
    assert!(changed_scores >= 10, "only {changed_scores} steps changed");
    assert!(
        steps_with_refusals >= 10,
        "only {steps_with_refusals} steps refused a node"
    );
    assert!(!bound.is_empty());
}

#[test]
fn the_prescorer_fills_every_memo_once_and_then_only_what_changed() {
    let index = cluster();
    let ext = extender(&index);
    assert_eq!(
        ext.prescore(),
        0,
        "no pod seen yet: no mix, nothing to score"
    );
    let shapes = [("10Gi", 1), ("30Gi", 2), ("18Gi", 1)];
    // The mix is rebuilt every 64 pods filter sees.
    for (i, (vram, gpus)) in shapes.iter().cycle().take(129).enumerate() {
        ext.filter(args(&pod(&format!("q{i}"), vram, *gpus)));
    }
    let classes = ext.mix().shapes().len();
    assert_eq!(classes, shapes.len());
    // Nodes alike share one memo (`placement::signature`): n and n + 7 start alike.
    let states = || {
        (0..NODES)
            .map(|n| Arc::as_ptr(index.node(&node_name(n)).unwrap().read().scores()) as usize)
            .collect::<std::collections::HashSet<usize>>()
            .len()
    };
    assert_eq!(states(), 7);
    assert_eq!(
        ext.prescore(),
        7 * classes,
        "one scoring per state and class"
    );
    assert_eq!(ext.prescore(), 0, "everything is warm");
    // One node's report changes into a state of its own: only its scores are computed.
    index.apply_report(&report(3, 7 * GIB));
    assert_eq!(states(), 8);
    assert_eq!(ext.prescore(), classes);
    // And back: node 10 is still in its old state, whose memo is warm.
    index.apply_report(&report(3, 0));
    assert_eq!(ext.prescore(), 0);
    index.apply_report(&report(3, 7 * GIB));
    assert_eq!(ext.prescore(), 0, "the state it left is still known");
    // And prioritize, answering from those memos, agrees with a rescore.
    for (vram, gpus) in shapes {
        let p = pod("check", vram, gpus);
        let answered: Vec<u8> = ext
            .prioritize(args(&p))
            .iter()
            .map(|h| u8::try_from(h.score).expect("a score from 0 to 10"))
            .collect();
        assert_eq!(answered, from_scratch(&ext, &index, &p));
    }
}

/// A pod without peakfit annotations takes no GPU memory, but the CPU it takes on a GPU node can
/// leave that node's free GPUs without the CPU the GPU pods ask for. Prioritize sends it where
/// that strands the fewest GPUs, and to a node without GPUs before any.
#[test]
fn a_gpuless_pod_goes_where_its_cpu_strands_fewest_gpus() {
    let index = Arc::new(Index::new());
    let with_cpu = |name: &str, cores: &str| Node {
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(std::collections::BTreeMap::from([(
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(cores.to_owned()),
            )])),
            ..Default::default()
        }),
        ..mk_node(name)
    };
    // Four GPUs each; 48 cores is what four typical pods below ask, 160 far more.
    index.apply_node(&with_cpu("node-00", "48"));
    index.apply_node(&with_cpu("node-01", "160"));
    index.apply_report(&report(0, 0));
    index.apply_report(&report(1, 0));
    let ext = extender(&index);
    let pod_of = |name: &str, cores: &str, annotations: serde_json::Value| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"cpu": cores}}}]},
        }))
        .unwrap()
    };
    let ask = |p: &Pod, nodes: &[&str]| -> Vec<i64> {
        ext.prioritize(ExtenderArgs {
            pod: Some(p.clone()),
            node_names: Some(nodes.iter().map(|n| (*n).to_owned()).collect()),
            ..Default::default()
        })
        .iter()
        .map(|h| h.score)
        .collect()
    };
    // The workload: whole-GPU pods of 12 cores each, learned by filter.
    for i in 0..4 {
        let p = pod_of(
            &format!("gpu-{i}"),
            "12",
            serde_json::json!({"peakfit.io/gpus": "1", "peakfit.io/gpu-share": "1"}),
        );
        index.apply_pod(&p);
        ext.filter(ExtenderArgs {
            pod: Some(p),
            node_names: Some(vec!["node-00".into(), "node-01".into()]),
            ..Default::default()
        });
    }
    let cpu_only = pod_of("cpu-only", "16", serde_json::json!({}));
    index.apply_pod(&cpu_only);
    // 16 of node-00's 48 cores leave its 4 free GPUs CPU for only 2 such pods.
    assert_eq!(ask(&cpu_only, &["node-00", "node-01"]), [0, 10]);
    assert_eq!(ask(&cpu_only, &["node-01", "node-00"]), [10, 0]);
    // A node peakfit sees no GPUs on (a CPU node without an agent) strands nothing at all.
    index.apply_node(&with_cpu("cpu-node", "32"));
    assert_eq!(
        ask(&cpu_only, &["node-00", "cpu-node", "node-01"]),
        [0, 10, 9]
    );
    // Only GPU-less pods prefer it: a GPU pod cannot go there.
    let gpu_pod = pod_of(
        "gpu-x",
        "12",
        serde_json::json!({"peakfit.io/gpus": "1", "peakfit.io/gpu-share": "1"}),
    );
    assert_eq!(ask(&gpu_pod, &["cpu-node"]), [0]);
}
