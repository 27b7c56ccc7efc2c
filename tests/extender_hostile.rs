//! Issue 24: what one pod can make the extender say and hold. Through the real router, on the
//! capture's cluster, with the probe's inputs scaled down to run in a second.

mod extender_support;

use std::sync::Arc;

use axum::body::Body;
use extender_support::*;
use http::Request;
use http_body_util::BodyExt;
use peakfit::clip::{MAX_MESSAGE_BYTES, MAX_USER_BYTES};
use peakfit::extender::BodyLimits;
use tower::ServiceExt;

fn node_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gpu-node-{i:05}")).collect()
}

/// A filter (node-cache mode) of a pod with these annotations and spec over `nodes`.
fn filter_body(
    annotations: &serde_json::Value,
    spec: &serde_json::Value,
    nodes: &[String],
) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Pod": {
            "metadata": {"name": "hostile", "namespace": "ml", "uid": "u-hostile",
                         "annotations": annotations},
            "spec": spec,
        },
        "Nodes": null,
        "NodeNames": nodes,
    }))
    .unwrap()
}

/// An invalid annotation does not depend on the node: one reason, on the first candidate, with
/// the value cut to 256 bytes (before: 5,000 copies of the whole value, 1.31 GB for 256 KiB).
#[tokio::test]
async fn an_invalid_annotation_is_said_once_with_its_value_cut() {
    let h = harness(fixture_index(&capture_dir(), &node_cache_uids()));
    let nodes = node_names(5_000);
    let value = "m".repeat(256 << 10);
    let body = filter_body(
        &serde_json::json!({"peakfit.io/model": value}),
        &serde_json::json!({"containers": [{"name": "c"}]}),
        &nodes,
    );
    let (status, reply) = call(&h.router, "POST", "/filter", body).await;
    assert_eq!(status, 200);
    assert!(reply.len() < 2 * MAX_MESSAGE_BYTES, "{} bytes", reply.len());
    let v = json(&reply);
    assert_eq!(v["NodeNames"], serde_json::json!([]));
    assert!(v["FailedNodes"].as_object().unwrap().is_empty());
    let unres = v["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(unres.len(), 1, "{v}");
    let reason = unres["gpu-node-00000"].as_str().unwrap();
    assert!(reason.contains("peakfit.io/model"), "{reason}");
    assert!(
        reason.contains(&format!("{} more bytes", (256 << 10) - MAX_USER_BYTES)),
        "{reason}"
    );
    assert!(reason.contains("all 5000 candidate nodes"), "{reason}");
}

/// A valid pod asking for 64 GPUs of any of 100,000 products: each node's reason names one
/// product, cut (before: the whole list per node, 201 MB for 200 nodes at 1 MB of products).
#[tokio::test]
async fn a_long_product_list_is_not_repeated_per_node() {
    let h = harness(fixture_index(&capture_dir(), &node_cache_uids()));
    let products: Vec<String> = (0..100_000)
        .map(|i| format!("gpu-product-{i:06}"))
        .collect();
    let spec = serde_json::json!({
        "containers": [{"name": "c"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": "nvidia.com/gpu.product", "operator": "In", "values": products,
            }]}],
        }}},
    });
    let nodes: Vec<String> = ["gpu-a", "gpu-b", "gpu-c-full"].map(str::to_owned).into();
    let body = filter_body(
        &serde_json::json!({"peakfit.io/vram": "10Gi", "peakfit.io/gpus": "64"}),
        &spec,
        &nodes,
    );
    let (status, reply) = call(&h.router, "POST", "/filter", body).await;
    assert_eq!(status, 200);
    let v = json(&reply);
    let refused = v["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(refused.len(), 3, "{v}");
    for reason in refused.values() {
        let reason = reason.as_str().unwrap();
        assert!(
            reason.len() < MAX_MESSAGE_BYTES,
            "{} bytes: {reason}",
            reason.len()
        );
        assert!(reason.contains("gpu-product-000000"), "{reason}");
    }
}

/// A reply holds its share of the bytes-in-flight budget until its body is written: a client
/// that does not read keeps it (before, it went back when the handler returned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_holds_its_share_of_the_budget_until_read() {
    let index = fixture_index(&capture_dir(), &node_cache_uids());
    let metrics = Arc::new(peakfit::metrics::extender::ExtenderMetrics::new());
    let binder = Arc::new(peakfit::cluster::binding::MemoryBinder::default());
    let ext = Arc::new(
        peakfit::extender::Extender::new(index, metrics, binder)
            .with_clock(capture_clock)
            .with_body_limits(BodyLimits::new(
                4 << 20,
                16 << 20,
                std::time::Duration::from_secs(5),
            )),
    );
    let router = peakfit::extender::routes::router(ext.clone());
    let full = ext.body.available_bytes();
    // A pod peakfit does not place passes every node; 20,000 names make a ~0.36 MB reply.
    let nodes = node_names(20_000);
    let body = filter_body(&serde_json::json!({}), &serde_json::json!({}), &nodes);
    let req = Request::post("/filter")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let reply = router.oneshot(req).await.unwrap();
    assert_eq!(reply.status(), 200);
    let held = full - ext.body.available_bytes();
    // Its size is still known, so hyper writes a Content-Length, not chunks.
    let size = http_body::Body::size_hint(reply.body()).exact();
    let bytes = reply.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.len() > 300_000, "{} bytes", bytes.len());
    assert!(
        held >= bytes.len(),
        "held {held} bytes while the reply is unread"
    );
    assert_eq!(size, Some(bytes.len() as u64));
    assert_eq!(ext.body.available_bytes(), full);
}

/// `/metrics` is rendered at most once per max age (a second in the binary) and served from that
/// render: a change within it shows at the next render, not at every scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_rendered_once_per_max_age() {
    let make = |max_age| {
        let index = fixture_index(&capture_dir(), &node_cache_uids());
        let metrics = Arc::new(peakfit::metrics::extender::ExtenderMetrics::with_index(
            index.clone(),
            capture_clock,
        ));
        let binder = Arc::new(peakfit::cluster::binding::MemoryBinder::default());
        let ext = Arc::new(
            peakfit::extender::Extender::new(index, metrics, binder)
                .with_clock(capture_clock)
                .with_scrape_max_age(max_age),
        );
        peakfit::extender::routes::router(ext)
    };
    let body = filter_body(
        &serde_json::json!({"peakfit.io/vram": "1Gi"}),
        &serde_json::json!({}),
        &["gpu-a".to_owned()],
    );
    for (max_age, cached) in [
        (std::time::Duration::from_secs(3600), true),
        (std::time::Duration::ZERO, false),
    ] {
        let router = make(max_age);
        let (_, before) = call(&router, "GET", "/metrics", vec![]).await;
        let (status, _) = call(&router, "POST", "/filter", body.clone()).await;
        assert_eq!(status, 200);
        let (_, after) = call(&router, "GET", "/metrics", vec![]).await;
        assert_eq!(before == after, cached, "max age {max_age:?}");
    }
}
