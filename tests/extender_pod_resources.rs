//! Issue 23 through the real router: a node whose agent cannot read the kubelet's
//! `PodResources` API is refused by filter, in words naming the read's error and the GPU
//! resource its device plugin advertises, while a dedicated node (no such resource) in the same
//! state still takes the pod. The same for a node a DRA GPU driver publishes devices on (its
//! `ResourceSlice`), whose GPUs allocatable never shows.

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

/// A `resource.k8s.io/v1` `ResourceSlice` of `driver` publishing one device on `node`, as the
/// API server serves it to the extender's watch.
fn slice(name: &str, driver: &str, node: &str) -> k8s_openapi::api::resource::v1::ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": { "name": name },
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "gpu-0" }],
        },
    }))
    .unwrap()
}

/// DRA devices are not in allocatable: a node NVIDIA's DRA driver publishes GPUs on is refused
/// while its agent cannot read `PodResources`, in words naming the driver; a slice of another
/// driver refuses nothing, and once the GPU driver's slice is gone the node takes the pod.
#[tokio::test]
async fn a_node_a_dra_gpu_driver_publishes_on_is_refused_while_pod_resources_is_down() {
    let index = Arc::new(Index::new());
    for name in ["dra", "nic"] {
        index.apply_node(&node(name, &[("cpu", "32")]));
        index.apply_report(&report_down(name));
    }
    index.apply_resource_slice(&slice("dra-gpu", "gpu.nvidia.com", "dra"));
    index.apply_resource_slice(&slice("nic-net", "dra.net", "nic"));
    let h = harness(index.clone());

    let pod = mk_pod("chat", &[("peakfit.io/vram", "10Gi")]);
    let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": ["dra", "nic"]})).unwrap();
    let (status, out) = call(&h.router, "POST", "/filter", body.clone()).await;
    assert_eq!(status, 200);
    let reply: Value = json(&out);
    assert_eq!(reply["NodeNames"], json!(["nic"]), "{reply}");
    let words = reply["FailedAndUnresolvableNodes"]["dra"]
        .as_str()
        .unwrap_or_else(|| panic!("dra is not refused as unresolvable: {reply}"));
    assert_eq!(
        words,
        "the agent cannot read the kubelet's PodResources API (connection refused) and DRA \
         driver gpu.nvidia.com publishes GPUs on this node: a GPU it hands out would look free, \
         so nothing is placed here",
    );

    index.delete_resource_slice("dra-gpu");
    let (status, out) = call(&h.router, "POST", "/filter", body).await;
    assert_eq!(status, 200);
    let reply: Value = json(&out);
    assert_eq!(reply["NodeNames"], json!(["dra", "nic"]), "{reply}");
}
