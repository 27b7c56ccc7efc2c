//! Shared by the extender's integration tests: the captured fixtures, an index built from their
//! YAMLs plus the GPU reports in `tests/data`, calling the real router without a socket, and the
//! builders of the Nodes, Pods and `NodeGpuReports` a test feeds the index itself (one copy, so
//! a change to those objects is made once).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use kube::api::ObjectMeta;
use peakfit::cluster::binding::{BindingWriter, MemoryBinder};
use peakfit::cluster::index::Index;
use peakfit::cluster::{NodeGpuReport, NodeGpuReportSpec};
use peakfit::extender::{Extender, routes};
use peakfit::inventory::{GpuDevice, NodeGpuReportStatus, NvmlStatus};
use peakfit::metrics::extender::ExtenderMetrics;
use tower::ServiceExt;

pub const GIB: u64 = 1 << 30;

/// The kube-scheduler v1.36 capture, shipped in `tests/fixtures` (its README says where it came from).
pub fn capture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kube-scheduler-v1.36")
}

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The capture's moment (its pods were created at 17:48:06-08): the made-up reports are 30 s old.
pub fn capture_clock() -> i64 {
    "2026-11-21T17:48:30Z"
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_second()
}

/// UIDs the capture's API servers gave the pods (the YAMLs have none). The node-cache preempt
/// request names one filler per node by UID; the full-nodes capture shows it is the `-1` one.
pub fn node_cache_uids() -> HashMap<&'static str, &'static str> {
    HashMap::from([
        ("llama3-8b-serve", "fddabb91-2a6c-4ddd-b86e-347d2ca9516a"),
        ("embedder", "319770bb-6c46-448d-83b5-26c60bbcc599"),
        ("urgent-serve", "bd8be4cc-c994-4878-8edd-3cbf04b54d75"),
        ("filler-gpu-a-1", "0e36fcac-1b10-451e-a805-3a71c1df3089"),
        ("filler-gpu-b-1", "02c819da-4c0a-4e67-a123-970372ad5037"),
        (
            "filler-gpu-c-full-1",
            "a4eebd95-2ac1-4e5a-adc4-6c31124b6d8e",
        ),
    ])
}

/// Pods of a fixture YAML (a `List` or several documents), other kinds skipped.
pub fn pods_of(path: &Path) -> Vec<Pod> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for doc in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
        let items = match doc.get("items") {
            Some(serde_json::Value::Array(items)) => items.clone(),
            _ => vec![doc],
        };
        for item in items {
            if item["kind"] == "Pod" {
                out.push(serde_json::from_value(item).unwrap());
            }
        }
    }
    out
}

/// The capture's cluster: its nodes (through file mode's loader), the made-up GPU reports, and
/// every fixture pod with the UID `uids` gives it (else `uid-<name>`).
pub fn fixture_index(dir: &Path, uids: &HashMap<&str, &str>) -> Arc<Index> {
    let index = Arc::new(Index::new());
    peakfit::cluster::file::load_into(&index, &dir.join("nodes.yaml")).unwrap();
    peakfit::cluster::file::load_into(&index, &data("fixture-gpu-reports.yaml")).unwrap();
    for file in ["pods.yaml", "fill.yaml", "hipod.yaml"] {
        for mut pod in pods_of(&dir.join(file)) {
            let name = pod.metadata.name.clone().unwrap();
            pod.metadata.uid = Some(
                uids.get(name.as_str())
                    .map_or(format!("uid-{name}"), std::string::ToString::to_string),
            );
            index.apply_pod(&pod);
        }
    }
    index
}

pub struct Harness {
    pub ext: Arc<Extender>,
    pub router: Router,
    pub binder: Arc<MemoryBinder>,
}

pub fn harness(index: Arc<Index>) -> Harness {
    let binder = Arc::new(MemoryBinder::default());
    harness_with(index, binder.clone(), binder)
}

pub fn harness_with(
    index: Arc<Index>,
    writer: Arc<dyn BindingWriter>,
    binder: Arc<MemoryBinder>,
) -> Harness {
    let metrics = Arc::new(ExtenderMetrics::with_index(index.clone(), capture_clock));
    let ext = Arc::new(Extender::new(index, metrics, writer).with_clock(capture_clock));
    Harness {
        router: routes::router(ext.clone()),
        ext,
        binder,
    }
}

/// [`harness`] with holds for starving pods (`--reserve-*`) made as `holds` says.
pub fn harness_with_holds(
    index: Arc<Index>,
    holds: Option<peakfit::extender::holds::HoldSettings>,
) -> Harness {
    let binder = Arc::new(MemoryBinder::default());
    let metrics = Arc::new(ExtenderMetrics::with_index(index.clone(), capture_clock));
    let ext = Arc::new(
        Extender::new(index, metrics, binder.clone())
            .with_clock(capture_clock)
            .with_holds(holds),
    );
    Harness {
        router: routes::router(ext.clone()),
        ext,
        binder,
    }
}

/// Sends one request through the real router; returns the status and the body bytes.
pub async fn call(
    router: &Router,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("user-agent", "Go-http-client/1.1")
        .body(Body::from(body))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

pub fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

/// A Node with nothing but its name.
pub fn mk_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A pending pod in namespace `ml` with UID `uid-<name>`, one container, and these annotations.
pub fn mk_pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("ml".into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("x".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// GPU number `index` of a report, `used` bytes of its `total` in use by no known pod.
pub fn mk_gpu(index: usize, uuid: impl Into<String>, total: u64, used: u64) -> GpuDevice {
    GpuDevice {
        index: peakfit::convert::usize_to_u32(index),
        uuid: uuid.into(),
        memory_total_bytes: total,
        memory_used_bytes: used,
        memory_free_bytes: total.saturating_sub(used),
        ..Default::default()
    }
}

/// The report of `node`'s agent, NVML up, as observed at `observed_at` (RFC 3339).
pub fn mk_report(node: &str, observed_at: &str, gpus: Vec<GpuDevice>) -> NodeGpuReport {
    let mut r = NodeGpuReport::new(
        node,
        NodeGpuReportSpec {
            node_name: node.to_owned(),
        },
    );
    r.status = Some(NodeGpuReportStatus {
        observed_at: observed_at.to_owned(),
        nvml: NvmlStatus {
            up: true,
            ..Default::default()
        },
        gpus,
        ..Default::default()
    });
    r
}
