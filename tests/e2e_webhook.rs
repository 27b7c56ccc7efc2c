//! The mutating webhook behind a real API server, registered from the chart's own
//! `MutatingWebhookConfiguration` with the control plane's serving certificate: an opted-in pod
//! gets peakfit's scheduler, its GPUs through the downward API and `PEAKFIT_*` env, and forged
//! output annotations are stripped on CREATE; then it binds and the env resolves to its GPUs.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::time::Duration;

use e2e_support::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::json;

const NS: &str = "ml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_admits_an_opted_in_pod_and_strips_forged_annotations() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_gpu_node("h100-a", vec![Gpu::h100("h100-a", 0)]).await;
    let _ext = c.start_peakfit(&[]).await;
    c.start_webhook().await;

    // No schedulerName; forged output annotations copied from somewhere.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "opted-in", "annotations": {
            "peakfit.io/vram": "20Gi",
            ASSIGNED_GPUS: "GPU-forged",
            RESERVED_BYTES: "1",
            GPU_MEMORY_FRACTION: "0.9",
        }},
        "spec": { "containers": [{ "name": "main", "image": "vllm/vllm-openai:v0.6.3" }] },
    }))
    .unwrap();
    // The API server may need a moment to call a just-registered webhook.
    let created = eventually(
        Duration::from_secs(20),
        "the webhook mutates the pod",
        || {
            let pods = c.pods(NS);
            let pod = pod.clone();
            async move {
                let p = pods.create(&PostParams::default(), &pod).await.ok()?;
                if p.spec.as_ref()?.scheduler_name.as_deref() == Some(SCHEDULER_NAME) {
                    return Some(p);
                }
                // Created before the webhook was live: try again.
                let _ = pods
                    .delete(
                        "opted-in",
                        &kube::api::DeleteParams::default().grace_period(0),
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
        },
    )
    .await;
    for forged in [ASSIGNED_GPUS, RESERVED_BYTES, GPU_MEMORY_FRACTION] {
        assert!(
            !created.annotations().contains_key(forged),
            "{forged} stripped: {:?}",
            created.annotations()
        );
    }
    let env = created.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let field = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(
        field("NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("metadata.annotations['peakfit.io/assigned-gpus']"),
        "{env:?}"
    );
    assert_eq!(
        field("PEAKFIT_VRAM_BYTES").as_deref(),
        Some("metadata.annotations['peakfit.io/reserved-bytes']"),
        "{env:?}"
    );

    // Scheduled by peakfit's scheduler: the annotation the env points at is the real GPU.
    let p = c.wait_bound(NS, "opted-in", Duration::from_secs(30)).await;
    let (gpus, reserved, _) = assignment(&p);
    assert_eq!(gpus, [Gpu::h100("h100-a", 0).uuid]);
    assert!(reserved >= 20 * GIB);
    c.assert_no_overcommit().await;
}
