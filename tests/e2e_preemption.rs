//! Preemption for GPU memory behind the real kube-scheduler: the agents advertise each node's GPU
//! memory as the extended resource `peakfit.io/gpu-memory-mib`, the webhook requests each pod's
//! least GPU memory in it, so the scheduler's own fit and preemption dry run see node-level GPU
//! memory; `/preempt` keeps the fewest victims that free a GPU; the victims are deleted and the
//! high-priority pod binds. Also: bind's output on a bound pod cannot be overwritten.
//!
//! There is no kubelet: the scheduler deletes victims gracefully (their 30 s grace period), and a
//! bound pod being deleted stays, with a deletionTimestamp, until its kubelet confirms the
//! containers stopped. The test plays that kubelet: it deletes terminating pods with grace 0.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e_support::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const NS: &str = "ml";
const RESOURCE: &str = "peakfit.io/gpu-memory-mib";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_evicts_the_fewest_gpu_memory_holders_and_binds() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_gpu_node("a100-p", vec![Gpu::a100_40("a100-p", 0)])
        .await;
    c.wait_reports().await;
    let ext = c.start_extender("extender", &[]);
    c.start_scheduler("peakfit-scheduler", ext.port);
    c.start_webhook().await;
    c.wait_gpu_memory_requests(NS).await;

    // The agent advertised the GPU's 40 GiB on the Node.
    assert_eq!(c.advertised_gpu_memory("a100-p").await, "40960");
    c.priority_classes(&[("low", 100), ("high", 1_000_000)])
        .await;

    // Three low-priority pods hold 12 + 12 + 13 GiB of the GPU and nothing else of note.
    for (name, vram) in [("low-a", "12Gi"), ("low-b", "12Gi"), ("low-c", "13Gi")] {
        create(&c, name, vram, "low").await;
        c.wait_bound(NS, name, Duration::from_secs(30)).await;
    }
    let low = c.pods(NS).get("low-c").await.unwrap();
    let requested = &low.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[RESOURCE];
    assert_eq!(requested.0, "13312", "the webhook requests 13 GiB in MiB");

    // The kubelet's part of a graceful deletion.
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = tokio::spawn(finish_deletions(c.pods(NS), stop.clone()));

    // 21 GiB: any one victim frees at most 13 + 3 = 16 GiB of the GPU; two are needed.
    let started = Instant::now();
    create(&c, "high", "21Gi", "high").await;
    let high = c.wait_bound(NS, "high", Duration::from_secs(60)).await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let deleted = kubelet.await.unwrap();

    assert_eq!(node_of(&high), "a100-p");
    let left = c.live_pods(NS).await;
    let evicted: Vec<&str> = ["low-a", "low-b", "low-c"]
        .into_iter()
        .filter(|n| !left.contains(*n))
        .collect();
    assert_eq!(evicted.len(), 2, "evicted {evicted:?}, left {left:?}");
    for v in &evicted {
        assert!(
            deleted.contains(*v),
            "{v} was not deleted gracefully: {deleted:?}"
        );
        let events = c.event_messages(NS, v).await;
        assert!(
            events
                .iter()
                .any(|e| e.contains("Preempted") || e.contains("preempt")),
            "{v}: {events:?}"
        );
    }
    let (_, reserved, _) = assignment(&high);
    assert!(reserved >= 21 * GIB, "{reserved}");
    c.assert_no_overcommit().await;
    println!(
        "preemption: high-priority pod bound {:.2} s after creation; evicted {evicted:?}; preempt decisions: {}",
        elapsed.as_secs_f64(),
        c.metric(
            &ext,
            "peakfit_extender_decisions_total",
            r#"verb="preempt",outcome="nodes_kept""#
        )
    );

    bind_output_on_a_bound_pod_cannot_be_overwritten(&c, &high).await;
}

/// `kubectl annotate --overwrite peakfit.io/assigned-gpus=<other> peakfit.io/reserved-bytes=1`
/// is refused by the webhook, and the ledger still counts the pod where it runs.
async fn bind_output_on_a_bound_pod_cannot_be_overwritten(c: &Cluster, high: &Pod) {
    let before = c.assert_no_overcommit().await;
    let patch = json!({"metadata": {"annotations": {
        ASSIGNED_GPUS: "GPU-00000000-0000-0000-0000-000000000000",
        RESERVED_BYTES: "1",
    }}});
    let err = c
        .pods(NS)
        .patch(
            &high.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect_err("overwriting bind's output must be refused");
    let text = err.to_string();
    assert!(
        text.contains("peakfit.io/assigned-gpus from") && text.contains("only peakfit's bind"),
        "{text}"
    );
    let now = c.pods(NS).get(&high.name_any()).await.unwrap();
    assert_eq!(assignment(&now), assignment(high));
    assert_eq!(c.assert_no_overcommit().await, before);
}

async fn create(c: &Cluster, name: &str, vram: &str, class: &str) {
    create_prioritized(c, NS, name, &[("peakfit.io/vram", vram)], class).await;
}
