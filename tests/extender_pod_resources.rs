//! Issue 23 through the real router: a node whose agent cannot read the kubelet's
//! `PodResources` API is refused by filter, in words naming the read's error and the GPU
//! resource its device plugin advertises, while a dedicated node (no such resource) in the same
//! state still takes the pod.

mod extender_support;

use std::sync::Arc;

use extender_support::*;
use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use peakfit::cluster::index::Index;
use peakfit::inventory::PodResourcesStatus;
use serde_json::{Value, json};

/// A Node whose allocatable lists these resources.
fn node(name: &str, allocatable: &[(&str, &str)]) -> k8s_openapi::api::core::v1::Node {
    let mut n = mk_node(name);
    n.status = Some(NodeStatus {
        allocatable: Some(
            allocatable
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect(),
        ),
        ..Default::default()
    });
    n
}

/// One 80 GiB GPU, with the agent unable to read the kubelet's `PodResources` socket.
fn report_down(name: &str) -> peakfit::cluster::NodeGpuReport {
    let mut r = mk_report(
        name,
        "2026-11-21T17:48:20Z",
        vec![mk_gpu(0, format!("GPU-{name}"), 80 * GIB, 0)],
    );
    r.status.as_mut().unwrap().pod_resources = Some(PodResourcesStatus {
        up: false,
        reason: Some("connection refused".into()),
    });
    r
}

#[tokio::test]
async fn a_mixed_node_whose_kubelet_allocations_cannot_be_read_is_refused() {
    let index = Arc::new(Index::new());
    index.apply_node(&node("mixed", &[("cpu", "32"), ("nvidia.com/gpu", "1")]));
    index.apply_report(&report_down("mixed"));
    index.apply_node(&node("dedicated", &[("cpu", "32")]));
    index.apply_report(&report_down("dedicated"));
    let h = harness(index);

    let pod = mk_pod("chat", &[("peakfit.io/vram", "10Gi")]);
    let body =
        serde_json::to_vec(&json!({"Pod": pod, "NodeNames": ["mixed", "dedicated"]})).unwrap();
    let (status, out) = call(&h.router, "POST", "/filter", body).await;
    assert_eq!(status, 200);
    let reply: Value = json(&out);
    assert_eq!(reply["NodeNames"], json!(["dedicated"]), "{reply}");
    let words = reply["FailedAndUnresolvableNodes"]["mixed"]
        .as_str()
        .or(reply["FailedNodes"]["mixed"].as_str())
        .unwrap_or_else(|| panic!("mixed is not refused: {reply}"));
    assert!(
        words.contains(
            "the agent cannot read the kubelet's PodResources API (connection refused) and the \
             node's device plugin advertises nvidia.com/gpu: a GPU it hands out would look free"
        ),
        "{words}"
    );
    // Preemption frees no GPU here: the node is unresolvable, not merely full.
    assert!(
        reply["FailedAndUnresolvableNodes"]["mixed"].is_string(),
        "{reply}"
    );
}
