//! The agent behind a real API server: it writes its `NodeGpuReport` by server-side apply (field
//! manager `peakfit-agent`); when it stops, the extender excludes its node with the stale reason
//! within one staleness window, and when it resumes a waiting pod binds within seconds (the
//! extender nudges the scheduler; kube-scheduler does not watch reports).
//!
//! Issue 23: an agent reading its kubelet's `PodResources` API (a fake kubelet on a unix socket)
//! publishes which pods hold which GPUs, and advertises only the GPUs nobody holds.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;
mod pod_resources_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use kube::Api;
use kube::ResourceExt;
use peakfit::cluster::NodeGpuReport;
use peakfit::inventory::HolderKind;
use pod_resources_support::{FakeKubelet, allocatable, device_plugin_pod, dra_pod, holders};

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
    // The GPU annotations came with the extender's Binding (one write: the API server copies a
    // Binding's annotations onto the pod and records no field manager for them), so nobody
    // else, `unknown` included, owns them.
    assert!(p.annotations().contains_key("peakfit.io/assigned-gpus"));
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
    assert!(
        owner.iter().all(|m| m == "peakfit-extender"),
        "{:?}",
        p.managed_fields()
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_the_kubelet_handed_out_are_published_and_not_advertised() {
    let c = Cluster::up().await;
    let gpus: Vec<Gpu> = (0..4).map(|i| Gpu::h100("dp-a", i)).collect();
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    // A trainer holds two GPUs through NVIDIA's device plugin, a claim holds one through DRA
    // (NVIDIA's driver names it after the GPU's minor number, which the fake NVML makes the
    // index), one is free.
    let kubelet = FakeKubelet::start(&c.path("dp-a.kubelet.sock"));
    kubelet.set(
        vec![
            device_plugin_pod(NS, "trainer-0", "nvidia.com/gpu", &uuids[..2]),
            dra_pod(NS, "infer-0", "gpus", "gpu.nvidia.com", "gpu-2"),
        ],
        vec![allocatable("nvidia.com/gpu", &uuids)],
    );
    c.add_gpu_node_with_kubelet("dp-a", gpus.clone(), Some(&kubelet.socket))
        .await;
    c.wait_reports().await;

    let reports: Api<NodeGpuReport> = Api::all(c.client.clone());
    let status = reports.get("dp-a").await.unwrap().status.unwrap();
    assert_eq!(
        status.pod_resources.as_ref().map(|p| p.up),
        Some(true),
        "{:?}",
        status.pod_resources
    );
    assert_eq!(
        holders(&status),
        [
            vec![format!("{NS}/trainer-0 through nvidia.com/gpu")],
            vec![format!("{NS}/trainer-0 through nvidia.com/gpu")],
            vec![format!(
                "{NS}/infer-0 through claim {NS}/gpus (gpu.nvidia.com)"
            )],
            vec![],
        ]
    );
    assert_eq!(status.gpus[2].held_by[0].kind, HolderKind::Dra);
    // One free H100: 80 GiB advertised, not 320.
    assert_eq!(
        c.advertised_gpu_memory("dp-a").await,
        (80 * 1024).to_string()
    );

    // The trainer ends: within a few polls (500 ms each) the report frees its GPUs and the Node
    // advertises them again.
    kubelet.set(
        vec![dra_pod(NS, "infer-0", "gpus", "gpu.nvidia.com", "gpu-2")],
        vec![allocatable("nvidia.com/gpu", &uuids)],
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    eventually(
        Duration::from_secs(30),
        "the freed GPUs published and advertised",
        || async {
            let s = reports.get("dp-a").await.ok()?.status?;
            let held: Vec<usize> = s.gpus.iter().map(|g| g.held_by.len()).collect();
            let a = nodes.get("dp-a").await.ok()?.status?.allocatable?;
            let mib = a.get("peakfit.io/gpu-memory-mib")?.0.clone();
            (held == [0, 0, 1, 0] && mib == (3 * 80 * 1024).to_string()).then_some(())
        },
    )
    .await;
}
