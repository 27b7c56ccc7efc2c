//! Builders shared by the unit tests of `cluster` (and of `metrics`, which reads the index):
//! one copy of what a Node, a Pod and a `NodeGpuReport` look like to the index, so that a change
//! to those objects is made once and not in every test module that feeds the index.

use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

use crate::cluster::index::{Index, ReasonLabels};
use crate::cluster::{NodeGpuReport, NodeGpuReportSpec};
use crate::inventory::{GpuDevice, GpuProcess, NodeGpuReportStatus, NvmlStatus};
use crate::placement::NodeLedger;

pub const GIB: u64 = 1 << 30;

pub fn mk_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A Node whose `status.allocatable` lists these resources (a device plugin's GPUs among them).
pub fn mk_node_allocatable(name: &str, allocatable: &[(&str, &str)]) -> Node {
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

pub fn mk_pod(uid: &str, node: Option<&str>, ann: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{uid}")),
            namespace: Some("ml".into()),
            uid: Some(uid.into()),
            annotations: Some(
                ann.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(Into::into),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One GPU: `(uuid, total, used, processes as (pod uid or "", bytes))`.
pub type MkGpu<'a> = (&'a str, u64, u64, &'a [(&'a str, u64)]);

pub fn mk_report(node: &str, gpus: &[MkGpu<'_>]) -> NodeGpuReport {
    let mut r = NodeGpuReport::new(
        node,
        NodeGpuReportSpec {
            node_name: node.into(),
        },
    );
    r.status = Some(NodeGpuReportStatus {
        observed_at: jiff::Timestamp::now().to_string(),
        nvml: NvmlStatus {
            up: true,
            ..Default::default()
        },
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, (uuid, total, used, procs))| GpuDevice {
                index: crate::convert::usize_to_u32(i),
                uuid: (*uuid).into(),
                memory_total_bytes: *total,
                memory_used_bytes: *used,
                memory_free_bytes: total - used,
                processes: procs
                    .iter()
                    .enumerate()
                    .map(|(pid, (uid, b))| GpuProcess {
                        pid: crate::convert::usize_to_u32(pid) + 100,
                        used_bytes: Some(*b),
                        pod_uid: (!uid.is_empty()).then(|| (*uid).into()),
                        container_id: None,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    r
}

/// A copy of the node's ledger as the index has it now.
pub fn ledger(index: &Index, node: &str) -> NodeLedger {
    index.node(node).unwrap().read().ledger.clone()
}

/// How often the index counted `reason` in `peakfit_index_warnings_total`.
pub fn warnings(index: &Index, reason: &'static str) -> u64 {
    index
        .warnings()
        .get_or_create(&ReasonLabels { reason })
        .get()
}
