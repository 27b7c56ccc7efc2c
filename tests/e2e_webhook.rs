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

/// Creates `pod` in [`NS`] once the webhook mutates it (the API server may need a moment to call
/// a just-registered webhook; a pod created before that is deleted and made again).
async fn create_through_webhook(c: &Cluster, pod: &Pod) -> Pod {
    let name = pod.name_any();
    eventually(
        Duration::from_secs(20),
        "the webhook mutates the pod",
        || {
            let pods = c.pods(NS);
            let pod = pod.clone();
            let name = name.clone();
            async move {
                let p = pods.create(&PostParams::default(), &pod).await.ok()?;
                if p.spec.as_ref()?.scheduler_name.as_deref() == Some(SCHEDULER_NAME) {
                    return Some(p);
                }
                // Created before the webhook was live: try again.
                let _ = pods
                    .delete(&name, &kube::api::DeleteParams::default().grace_period(0))
                    .await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
        },
    )
    .await
}

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
    let created = create_through_webhook(&c, &pod).await;
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

/// A long generation (Qwen3-0.6B, 64 × (1,024 + 1,024) tokens: 15.4 GiB of tensors, a cache that
/// filled a 141 GiB H200 on the real GPU) behind the real scheduler: without the allocator
/// setting it binds alone to a whole H100; with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
/// in its env the webhook writes `peakfit.io/expandable-segments`, and the same pod is sized by
/// its tensors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_cache_takes_a_whole_gpu_unless_its_env_makes_segments_expandable() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_gpu_node(
        "h100-a",
        vec![Gpu::h100("h100-a", 0), Gpu::h100("h100-a", 1)],
    )
    .await;
    let _ext = c.start_peakfit(&[]).await;
    c.start_webhook().await;
    let pod = |name: &str, env: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": {
                "peakfit.io/model": "qwen3-0.6b", "peakfit.io/workload": "inference",
                "peakfit.io/batch": "64", "peakfit.io/context-tokens": "2048",
                "peakfit.io/prompt-tokens": "1024",
            }},
            "spec": { "containers": [{ "name": "gen", "image": "pytorch/pytorch", "env": env }] },
        }))
        .unwrap()
    };

    let plain = create_through_webhook(&c, &pod("cached", json!([]))).await;
    assert!(
        !plain
            .annotations()
            .contains_key("peakfit.io/expandable-segments")
    );
    let p = c.wait_bound(NS, "cached", Duration::from_secs(30)).await;
    let (gpus, whole, _) = assignment(&p);
    assert_eq!(gpus.len(), 1);
    assert!(
        whole > 79 * GIB && whole <= 80 * GIB,
        "a whole H100: {whole}"
    );

    let env = json!([{ "name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True" }]);
    let expandable = create_through_webhook(&c, &pod("expandable", env)).await;
    assert_eq!(
        expandable
            .annotations()
            .get("peakfit.io/expandable-segments")
            .map(String::as_str),
        Some("true")
    );
    let p = c
        .wait_bound(NS, "expandable", Duration::from_secs(30))
        .await;
    let (other, reserved, _) = assignment(&p);
    assert_ne!(other, gpus, "the whole GPU is not shared");
    assert!(
        reserved > 15 * GIB && reserved < 25 * GIB,
        "sized by its tensors: {reserved}"
    );
    c.assert_no_overcommit().await;
}
