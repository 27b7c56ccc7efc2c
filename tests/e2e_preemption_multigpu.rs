//! Preemption for GPU memory on a multi-GPU node, behind the real kube-scheduler v1.36.2 (issue
//! 23, items 4 and 5): eight low-priority 70 GiB pods fill an 8×H100 (80 GB) node, one per GPU.
//! The node-level sum of `peakfit.io/gpu-memory-mib` (655,360 MiB advertised, 573,440 held)
//! still has 80 GiB, so the scheduler's preemption dry run sees room where no GPU has any:
//!
//! - a high-priority `gpus: 8` pod is offered seven victims (the sum fits without the eighth);
//!   `/preempt` adds the eighth, and the pod binds after exactly eight evictions;
//! - a high-priority one-GPU pod is offered none (the dry run needs no victim, and v1.36.2 drops
//!   such a node before asking the extender); the extender's self-preemption evicts exactly one
//!   pod through the Eviction API and nominates the node, and the pod binds there.
//!
//! Both check that no GPU is over-committed. There is no kubelet: the test finishes graceful
//! deletions (`finish_deletions`). Needs `../shared/tools/k8s` and the fake NVML library.

mod e2e_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e_support::*;

const NS: &str = "ml";
const NODE: &str = "h100-x8";
const LOW: [&str; 8] = [
    "low-0", "low-1", "low-2", "low-3", "low-4", "low-5", "low-6", "low-7",
];

/// A cluster with one 8×H100 node whose GPUs each hold one low-priority 70 GiB pod, the
/// extender (flags `extra`), the chart's scheduler and the webhook.
async fn full_node(extra: &[&str]) -> (Cluster, e2e_support::Extender) {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_gpu_node(NODE, (0..8).map(|i| Gpu::h100(NODE, i)).collect())
        .await;
    c.wait_reports().await;
    let ext = c.start_extender("extender", extra);
    c.start_scheduler("peakfit-scheduler", ext.port);
    c.start_webhook().await;
    c.wait_gpu_memory_requests(NS).await;
    assert_eq!(
        c.advertised_gpu_memory(NODE).await,
        "655360",
        "8 × 80 GiB in MiB"
    );
    c.priority_classes(&[("low", 100), ("high", 1_000_000)])
        .await;
    let mut gpus = BTreeSet::new();
    for name in LOW {
        create_prioritized(&c, NS, name, &[("peakfit.io/vram", "70Gi")], "low").await;
        let p = c.wait_bound(NS, name, Duration::from_secs(30)).await;
        let (assigned, _, _) = assignment(&p);
        assert_eq!(assigned.len(), 1, "{name}: {assigned:?}");
        gpus.extend(assigned);
    }
    assert_eq!(gpus.len(), 8, "one low pod per GPU: {gpus:?}");
    c.assert_no_overcommit().await;
    (c, ext)
}

/// Creates `name` (high priority) with `annotations`, plays the kubelet until it binds, and
/// returns the seconds it took, the low pods evicted and those whose deletion the test finished.
async fn preempt_for(
    c: &Cluster,
    name: &str,
    annotations: &[(&str, &str)],
) -> (f64, Vec<String>, BTreeSet<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = tokio::spawn(finish_deletions(c.pods(NS), stop.clone()));
    let started = Instant::now();
    create_prioritized(c, NS, name, annotations, "high").await;
    let bound = c.wait_bound(NS, name, Duration::from_secs(90)).await;
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let deleted = kubelet.await.unwrap();
    assert_eq!(node_of(&bound), NODE);
    let left = c.live_pods(NS).await;
    let evicted: Vec<String> = LOW
        .iter()
        .filter(|n| !left.contains(**n))
        .map(|n| (*n).to_owned())
        .collect();
    (elapsed, evicted, deleted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eight_gpu_pod_evicts_all_eight_one_per_gpu_pods_and_binds() {
    let (c, ext) = full_node(&[]).await;
    let (elapsed, evicted, deleted) = preempt_for(
        &c,
        "high-x8",
        &[("peakfit.io/vram", "70Gi"), ("peakfit.io/gpus", "8")],
    )
    .await;
    assert_eq!(evicted.len(), 8, "evicted {evicted:?}");
    for v in &evicted {
        assert!(
            deleted.contains(v),
            "{v} was not deleted gracefully: {deleted:?}"
        );
    }
    let high = c.pods(NS).get("high-x8").await.unwrap();
    let (gpus, reserved, _) = assignment(&high);
    assert_eq!(gpus.len(), 8, "{gpus:?}");
    assert!(reserved >= 70 * GIB, "{reserved}");
    c.assert_no_overcommit().await;
    let added = c.metric(
        &ext,
        "peakfit_extender_decisions_total",
        r#"verb="preempt",outcome="victims_added""#,
    );
    assert!(added >= 1.0, "/preempt never added a victim ({added})");
    println!(
        "multi-GPU preemption: gpus=8 pod bound {elapsed:.2} s after creation; evicted {} pods; \
         /preempt answers adding victims: {added}",
        evicted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_gpu_pod_on_a_full_eight_gpu_node_evicts_exactly_one_and_binds() {
    let (c, ext) = full_node(&["--self-preempt-after", "1s"]).await;
    let (elapsed, evicted, deleted) =
        preempt_for(&c, "high-x1", &[("peakfit.io/vram", "70Gi")]).await;
    assert_eq!(evicted.len(), 1, "evicted {evicted:?}");
    assert!(deleted.contains(&evicted[0]), "{deleted:?}");
    let high = c.pods(NS).get("high-x1").await.unwrap();
    let (gpus, _, _) = assignment(&high);
    assert_eq!(gpus.len(), 1, "{gpus:?}");
    // It took the GPU its victim freed.
    let sums = c.assert_no_overcommit().await;
    assert_eq!(sums.len(), 8, "{sums:?}");
    let evictions = c.metric(
        &ext,
        "peakfit_extender_decisions_total",
        r#"verb="self_preempt",outcome="evicted""#,
    );
    assert!(
        (evictions - 1.0).abs() < f64::EPSILON,
        "self-preemptions: {evictions}"
    );
    let events = c.event_messages(NS, &evicted[0]).await;
    assert!(
        events.iter().any(|e| e.contains("peakfit")),
        "{}: {events:?}",
        evicted[0]
    );
    // What kube-scheduler v1.36.2 did on its own: its dry run needed no victim, so it never
    // asked `/preempt` (upstream PR #135486 would send the node with an empty list).
    let asked = c.metric(
        &ext,
        "peakfit_extender_decisions_total",
        r#"verb="preempt""#,
    ) + 0.0; // a sum of no samples is -0.0
    let said = c
        .event_messages(NS, "high-x1")
        .await
        .into_iter()
        .find(|e| e.contains("expected at least one victim"));
    println!(
        "one-GPU preemption: pod bound {elapsed:.2} s after creation (self-preemption after 1 s); \
         evicted {evicted:?}; /preempt calls: {asked}; scheduler said: {said:?}"
    );
}
