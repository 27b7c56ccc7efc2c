//! The agent behind a real API server: it writes its `NodeGpuReport` by server-side apply (field
//! manager `peakfit-agent`); when it stops, the extender excludes its node with the stale reason
//! within one staleness window, and when it resumes a waiting pod binds within seconds (the
//! extender nudges the scheduler; kube-scheduler does not watch reports).
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use kube::Api;
use kube::ResourceExt;
use peakfit::cluster::NodeGpuReport;

const NS: &str = "ml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_makes_its_node_stale_and_a_resumed_one_brings_it_back() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_gpu_node("h100-a", vec![Gpu::h100("h100-a", 0)]).await;
    c.add_gpu_node("l4-a", vec![Gpu::l4("l4-a", 0)]).await;
    let ext = c.start_peakfit(&["--max-report-age", "4s"]).await;

    // Server-side apply by peakfit-agent, status included.
    let reports: Api<NodeGpuReport> = Api::all(c.client.clone());
    let r = reports.get("h100-a").await.unwrap();
    let managers: Vec<(String, String, String)> = r
        .managed_fields()
        .iter()
        .map(|f| {
            (
                f.manager.clone().unwrap_or_default(),
                f.operation.clone().unwrap_or_default(),
                f.subresource.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("peakfit-agent".into(), "Apply".into(), "status".into())),
        "{managers:?}"
    );
    assert!(
        managers.iter().all(|m| m.0 == "peakfit-agent"),
        "{managers:?}"
    );

    // A pod only the H100 holds binds; the extender's writes carry its field manager.
    c.create_pod(NS, "first", &[("peakfit.io/vram", "30Gi")])
        .await;
    let p = c.wait_bound(NS, "first", Duration::from_secs(30)).await;
    assert_eq!(node_of(&p), "h100-a");
    // The GPU annotations are owned by the extender's field manager, not `unknown`.
    let owner: Vec<String> = p
        .managed_fields()
        .iter()
        .filter(|f| {
            f.fields_v1
                .as_ref()
                .is_some_and(|v| v.0.to_string().contains("peakfit.io/assigned-gpus"))
        })
        .filter_map(|f| f.manager.clone())
        .collect();
    assert_eq!(owner, ["peakfit-extender"], "{:?}", p.managed_fields());
    c.delete_pod(NS, "first").await;

    // Stop the agent: within one window (4 s) plus a poll, the node is stale.
    let stopped = Instant::now();
    c.stop_agent("h100-a");
    tokio::time::sleep(Duration::from_secs(5)).await;
    c.create_pod(NS, "waits", &[("peakfit.io/vram", "30Gi")])
        .await;
    let m = c
        .wait_event(NS, "waits", "FailedScheduling", Duration::from_secs(30))
        .await;
    assert!(m.contains("GPU report is"), "the stale reason: {m}");
    println!(
        "e2e: node stale and refused {:.1} s after its agent stopped (--max-report-age 4s)",
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(node_of(&c.pods(NS).get("waits").await.unwrap()), "");

    // Resume: the waiting pod binds within seconds, not after the scheduler's 5-minute flush.
    let resumed = Instant::now();
    c.resume_agent("h100-a");
    let p = c.wait_bound(NS, "waits", Duration::from_secs(60)).await;
    assert_eq!(node_of(&p), "h100-a");
    let delay = resumed.elapsed();
    println!(
        "e2e recovery: waiting pod bound {:.2} s after the agent resumed; nudges {}",
        delay.as_secs_f64(),
        c.metric(&ext, "peakfit_extender_node_nudges_total", "")
    );
    c.assert_no_overcommit().await;
}
