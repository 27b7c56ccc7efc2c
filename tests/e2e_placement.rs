//! peakfit behind a real kube-scheduler and kube-apiserver: pods of every kind are bound where
//! the ledger says, with their annotations written; a pod described by a model-config ConfigMap
//! is sized from it; refusals (a missing ConfigMap included) reach the pods' events; a full node
//! makes the next pod wait and a deletion lets it bind.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use kube::ResourceExt;

const NS: &str = "ml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_placed_by_peak_vram_behind_the_real_scheduler() {
    let c = Cluster::up().await;
    // Regression (issue 10, item 8): schemars' uint formats made kubectl warn on 12 fields.
    assert!(
        !c.crd_warnings.contains("unrecognized format"),
        "{}",
        c.crd_warnings
    );
    c.namespace(NS).await;
    c.add_gpu_node("h100-tp", (0..4).map(|i| Gpu::h100("h100-tp", i)).collect())
        .await;
    c.add_gpu_node("h100-a", (0..2).map(|i| Gpu::h100("h100-a", i)).collect())
        .await;
    c.add_gpu_node("l4-a", vec![Gpu::l4("l4-a", 0)]).await;
    c.add_gpu_node(
        "a100-a",
        (0..2).map(|i| Gpu::a100_40("a100-a", i)).collect(),
    )
    .await;
    let ext = c.start_peakfit(&[]).await;

    Box::pin(annotated_pods_bind_where_the_ledger_says(&c)).await;
    Box::pin(model_config_pods_are_sized_from_their_configmap(&c)).await;
    refusals_reach_the_events(&c).await;
    a_full_cluster_makes_the_next_pod_wait_until_one_is_deleted(&c).await;
    pods_created_back_to_back_bind_without_cache_misses(&c, &ext).await;
    c.assert_no_overcommit().await;
}

async fn annotated_pods_bind_where_the_ledger_says(c: &Cluster) {
    let memory = c.gpu_memory();
    let t = Duration::from_secs(30);

    // vram: one GPU, at least what was asked reserved.
    c.create_pod(NS, "vram-20", &[("peakfit.io/vram", "20Gi")])
        .await;
    let p = c.wait_bound(NS, "vram-20", t).await;
    let (gpus, reserved, fraction) = assignment(&p);
    assert_eq!(gpus.len(), 1, "{:?}", p.annotations());
    assert!(reserved >= 20 * GIB, "{reserved}");
    assert!(fraction.is_none());
    assert!(c.gpus_of(&node_of(&p)).iter().any(|g| g.uuid == gpus[0]));

    // Tensor-parallel 70B on vLLM: 4 GPUs at ~75 GiB each, which only h100-tp has.
    c.create_pod(
        NS,
        "tp4",
        &[
            ("peakfit.io/model", "llama-3.1-70b"),
            ("peakfit.io/engine", "vllm"),
            ("peakfit.io/tensor-parallel", "4"),
            ("peakfit.io/gpus", "4"),
        ],
    )
    .await;
    let p = c.wait_bound(NS, "tp4", t).await;
    let (gpus, reserved, fraction) = assignment(&p);
    assert_eq!(node_of(&p), "h100-tp");
    assert_eq!(gpus.len(), 4, "{:?}", p.annotations());
    assert!(reserved > 60 * GIB && reserved <= 80 * GIB, "{reserved}");
    assert_eq!(
        fraction,
        Some(0.92),
        "vLLM's default utilization is written"
    );

    // vLLM with a fraction: the fraction is written as the engine was told.
    c.create_pod(
        NS,
        "vllm-frac",
        &[
            ("peakfit.io/model", "llama-3.1-8b"),
            ("peakfit.io/engine", "vllm"),
            ("peakfit.io/gpu-memory-utilization", "0.45"),
        ],
    )
    .await;
    let p = c.wait_bound(NS, "vllm-frac", t).await;
    let (gpus, reserved, fraction) = assignment(&p);
    assert_eq!(gpus.len(), 1);
    assert_eq!(fraction, Some(0.45));
    assert!(
        reserved as f64 >= 0.45 * memory[&gpus[0]] as f64,
        "a fraction engine reserves its share of the GPU it got: {reserved}"
    );

    // LoRA fine-tuning of an 8B model: ~20 GiB.
    c.create_pod(
        NS,
        "lora",
        &[
            ("peakfit.io/model", "llama-3.1-8b"),
            ("peakfit.io/workload", "lora"),
        ],
    )
    .await;
    let p = c.wait_bound(NS, "lora", t).await;
    let (gpus, reserved, _) = assignment(&p);
    assert_eq!(gpus.len(), 1);
    assert!(reserved > 15 * GIB && reserved < 30 * GIB, "{reserved}");

    // No annotations: not peakfit's to place; bound as the default binder would, nothing written.
    c.create_pod(NS, "plain", &[]).await;
    let p = c.wait_bound(NS, "plain", t).await;
    assert_eq!(assignment(&p), (vec![], 0, None));

    c.assert_no_overcommit().await;
}

/// The Llama-3.1-8B config.json fields that size it (tests/data/model-configs).
fn llama_config() -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/model-configs/llama-3.1-8b.json"),
    )
    .unwrap()
}

async fn model_config_pods_are_sized_from_their_configmap(c: &Cluster) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    let t = Duration::from_secs(30);
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), NS);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "llama-8b", "labels": {"peakfit.io/model-config": "true"}},
        "data": {"config.json": llama_config()},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    // The same estimate `peakfit estimate --model-config` gives, with the pod's annotations on top.
    let pod_annotations = [
        ("peakfit.io/model-config", "llama-8b"),
        ("peakfit.io/workload", "lora"),
    ];
    let mut expected = peakfit::model::hf_config::annotations(&llama_config())
        .unwrap()
        .annotations
        .into_iter()
        .map(|(k, v)| (format!("peakfit.io/{k}"), v))
        .collect::<std::collections::BTreeMap<_, _>>();
    expected.insert("peakfit.io/workload".into(), "lora".into());
    let want = peakfit::model::pod_request(&expected)
        .unwrap()
        .unwrap()
        .demand
        .fixed_bytes;
    // The watch may see the ConfigMap a moment after it is created: a pod created before is
    // refused until then, and kube-scheduler retries it.
    c.create_pod(NS, "from-config", &pod_annotations).await;
    let p = c
        .wait_bound(NS, "from-config", Duration::from_secs(90))
        .await;
    let (gpus, reserved, _) = assignment(&p);
    assert_eq!(gpus.len(), 1, "{:?}", p.annotations());
    assert_eq!(reserved, want, "sized from the ConfigMap's config.json");

    // A ConfigMap that does not exist: this pod waits with the reason, the others are placed.
    c.create_pod(
        NS,
        "no-config",
        &[("peakfit.io/model-config", "missing-config")],
    )
    .await;
    let m = c.wait_event(NS, "no-config", "FailedScheduling", t).await;
    assert!(
        m.contains("peakfit.io/model-config") && m.contains("ml/missing-config"),
        "the event names the annotation and the ConfigMap: {m}"
    );
    c.create_pod(NS, "beside-it", &[("peakfit.io/vram", "1Gi")])
        .await;
    c.wait_bound(NS, "beside-it", t).await;
    for pod in ["from-config", "no-config", "beside-it"] {
        c.delete_pod(NS, pod).await;
    }
}

async fn refusals_reach_the_events(c: &Cluster) {
    let t = Duration::from_secs(30);
    c.create_pod(
        NS,
        "bad-dtype",
        &[
            ("peakfit.io/model", "llama-3.1-8b"),
            ("peakfit.io/dtype", "fp13"),
        ],
    )
    .await;
    let m = c.wait_event(NS, "bad-dtype", "FailedScheduling", t).await;
    assert!(
        m.contains("peakfit.io/dtype"),
        "the event names the annotation: {m}"
    );
    assert!(m.contains("fp13"), "{m}");

    c.create_pod(NS, "huge", &[("peakfit.io/vram", "100Gi")])
        .await;
    let m = c.wait_event(NS, "huge", "FailedScheduling", t).await;
    assert!(
        m.contains("needs 100.2 GiB free per GPU"),
        "the event says why: {m}"
    );
    // Each node with its own reason (the scheduler groups equal reasons): every GPU size is named.
    assert!(
        m.starts_with("FailedScheduling: 0/4 nodes are available"),
        "{m}"
    );
    for size in ["free of 24.0 GiB", "free of 40.0 GiB", "free of 80.0 GiB"] {
        assert!(m.contains(size), "{size}: {m}");
    }
    for pod in ["bad-dtype", "huge"] {
        let p = c.pods(NS).get(pod).await.unwrap();
        assert_eq!(node_of(&p), "", "{pod} must not bind");
    }
    c.delete_pod(NS, "bad-dtype").await;
    c.delete_pod(NS, "huge").await;
}

async fn a_full_cluster_makes_the_next_pod_wait_until_one_is_deleted(c: &Cluster) {
    // 36 GiB pods fit H100s (2 per GPU) and A100-40s (none beside another pod): create them
    // until one waits.
    let mut bound = Vec::new();
    let waiting = loop {
        let name = format!("fill-{}", bound.len());
        c.create_pod(NS, &name, &[("peakfit.io/vram", "36Gi")])
            .await;
        let pods = c.pods(NS);
        let got = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                let p = pods.get(&name).await.unwrap();
                if !node_of(&p).is_empty() {
                    return p;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        match got {
            Ok(_) => bound.push(name),
            Err(_) => break name,
        }
        assert!(bound.len() < 12, "the cluster never filled up");
    };
    assert!(!bound.is_empty());
    let m = c
        .wait_event(NS, &waiting, "free per GPU", Duration::from_secs(20))
        .await;
    assert!(
        m.contains("needs 36.2 GiB free per GPU"),
        "a memory reason: {m}"
    );
    c.assert_no_overcommit().await;

    let start = Instant::now();
    c.delete_pod(NS, &bound[0]).await;
    let p = c.wait_bound(NS, &waiting, Duration::from_secs(60)).await;
    println!(
        "e2e: waiting pod bound {:.2} s after a 36 GiB pod was deleted (node {})",
        start.elapsed().as_secs_f64(),
        node_of(&p)
    );
    for name in bound.iter().skip(1).chain([&waiting]) {
        c.delete_pod(NS, name).await;
    }
}

/// Regression (issue 10, item 4): bind used to fail for a pod the extender's watch had not
/// delivered yet; now it reads the pod from the API server.
async fn pods_created_back_to_back_bind_without_cache_misses(c: &Cluster, ext: &Extender) {
    let before = c.metric(
        ext,
        "peakfit_extender_decisions_total",
        r#"verb="bind",outcome="error""#,
    );
    let names: Vec<String> = (0..20).map(|i| format!("race-{i}")).collect();
    for n in &names {
        c.create_pod(NS, n, &[("peakfit.io/vram", "1Gi")]).await;
    }
    for n in &names {
        c.wait_bound(NS, n, Duration::from_secs(60)).await;
    }
    let after = c.metric(
        ext,
        "peakfit_extender_decisions_total",
        r#"verb="bind",outcome="error""#,
    );
    assert_eq!(
        after - before,
        0.0,
        "no bind errors:\n{}",
        c.log_tail("extender", 30)
    );
    for n in &names {
        let m = c.event_messages(NS, n).await;
        assert!(
            !m.iter().any(|m| m.contains("not in peakfit's cache")),
            "{n}: {m:?}"
        );
        c.delete_pod(NS, n).await;
    }
}
