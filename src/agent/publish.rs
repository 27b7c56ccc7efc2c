//! Writing this node's `NodeGpuReport` by server-side apply.
//!
//! The agent owns the object's `spec.nodeName` and its whole `status` under the field manager
//! `peakfit-agent`, forcing ownership so a stale manager (an older agent, a `kubectl edit`) can
//! never pin old numbers. The object is applied once (it may not exist yet: a status patch on a
//! missing object is a 404), then only the status subresource is written.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::NodeGpuReport;
use crate::inventory::NodeGpuReportStatus;

/// The field manager of every write the agent makes.
pub const FIELD_MANAGER: &str = "peakfit-agent";

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("applying NodeGpuReport {name}")]
    Object {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("applying the status of NodeGpuReport {name}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("advertising {resource} on the status of Node {name}")]
    Capacity {
        name: String,
        resource: String,
        #[source]
        source: kube::Error,
    },
}

/// The extended resource the chart advertises node-level GPU memory as, in MiB.
pub const DEFAULT_GPU_MEMORY_RESOURCE: &str = "peakfit.io/gpu-memory-mib";

/// Advertised again this often even when unchanged: a kubelet that re-registers its Node
/// (a node object deleted and recreated) starts without it. Not every report: one Node write per
/// node per heartbeat would wake every Node watcher in the cluster.
const READVERTISE: Duration = Duration::from_secs(600);

/// The node's GPU memory as an extended resource on the Node's status (capacity and
/// allocatable; the kubelet keeps extended resources it does not manage), so that kube-scheduler's
/// `NodeResourcesFit` and its preemption dry run see node-level GPU memory against what the webhook
/// adds to each pod's requests. The extender still decides per GPU.
pub struct NodeCapacity {
    api: Api<Node>,
    node: String,
    resource: String,
    advertised: Option<(u64, Instant)>,
}

impl NodeCapacity {
    pub fn new(client: Client, node: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            api: Api::all(client),
            node: node.into(),
            resource: resource.into(),
            advertised: None,
        }
    }

    /// Whole MiB of the node's schedulable GPU memory (MIG parents excluded), rounded down so the
    /// scheduler never sees more than the extender will place. Devices the kubelet gave to a pod
    /// (`held_by`, issue 23) are left out: their memory is that pod's, and counting it would let
    /// kube-scheduler fit peakfit pods into it.
    pub fn mib(status: &NodeGpuReportStatus) -> u64 {
        let bytes: u64 = status
            .gpus
            .iter()
            .filter(|g| g.is_schedulable() && g.held_by.is_empty())
            .map(|g| g.memory_total_bytes)
            .fold(0, u64::saturating_add);
        bytes >> 20
    }

    /// Patches the Node when the amount changed (or `READVERTISE` passed). A node whose NVML is
    /// down (or lists no GPU) keeps what it advertised: the extender refuses it anyway, and a
    /// driver hiccup should not make the scheduler see the node's pods as over its capacity. A
    /// node whose every GPU is held advertises 0.
    pub async fn advertise(&mut self, status: &NodeGpuReportStatus) -> Result<(), PublishError> {
        let mib = Self::mib(status);
        if !status.nvml.up || status.summary.total_bytes == 0 {
            return Ok(());
        }
        if let Some((was, at)) = self.advertised
            && was == mib
            && at.elapsed() < READVERTISE
        {
            return Ok(());
        }
        let value = mib.to_string();
        let patch = json!({"status": {
            "capacity": { &self.resource: value },
            "allocatable": { &self.resource: value },
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        self.api
            .patch_status(&self.node, &params, &Patch::Merge(&patch))
            .await
            .map_err(|source| PublishError::Capacity {
                name: self.node.clone(),
                resource: self.resource.clone(),
                source,
            })?;
        tracing::info!(node = %self.node, resource = %self.resource, mib, "advertised GPU memory on the Node");
        self.advertised = Some((mib, Instant::now()));
        Ok(())
    }
}

pub struct Publisher {
    api: Api<NodeGpuReport>,
    node: String,
    object_applied: bool,
}

impl Publisher {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        Self {
            api: Api::all(client),
            node: node.into(),
            object_applied: false,
        }
    }

    fn params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Writes `status`, creating the object first when this agent has not yet done so.
    pub async fn publish(&mut self, status: &NodeGpuReportStatus) -> Result<(), PublishError> {
        if !self.object_applied {
            let object = json!({
                "apiVersion": "peakfit.io/v1alpha1",
                "kind": "NodeGpuReport",
                "metadata": { "name": self.node },
                "spec": { "nodeName": self.node },
            });
            self.api
                .patch(&self.node, &Self::params(), &Patch::Apply(&object))
                .await
                .map_err(|source| PublishError::Object {
                    name: self.node.clone(),
                    source,
                })?;
            self.object_applied = true;
        }
        let patch = json!({
            "apiVersion": "peakfit.io/v1alpha1",
            "kind": "NodeGpuReport",
            "status": status,
        });
        match self
            .api
            .patch_status(&self.node, &Self::params(), &Patch::Apply(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(source) => {
                // Someone deleted the object: apply it again on the next attempt.
                if matches!(&source, kube::Error::Api(s) if s.code == 404) {
                    self.object_applied = false;
                }
                Err(PublishError::Status {
                    name: self.node.clone(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{DeviceHolder, GpuDevice, HolderKind};

    const GIB: u64 = 1 << 30;

    fn gpu(uuid: &str, total: u64) -> GpuDevice {
        GpuDevice {
            uuid: uuid.into(),
            memory_total_bytes: total,
            memory_free_bytes: total,
            ..GpuDevice::default()
        }
    }

    /// Issue 23: a GPU the kubelet handed out is not peakfit's to offer kube-scheduler.
    #[test]
    fn advertised_memory_leaves_out_held_devices_and_mig_parents() {
        let mut parent = gpu("GPU-c", 40 * GIB);
        parent.mig_enabled = true;
        let mut held = gpu("GPU-b", 80 * GIB);
        held.held_by = vec![DeviceHolder {
            namespace: "ml".into(),
            pod_name: "trainer-0".into(),
            container: "main".into(),
            kind: HolderKind::Dra,
            resource: "gpu.nvidia.com".into(),
            claim: Some("ml/gpus".into()),
        }];
        let mut mig = gpu("MIG-c1", 20 * GIB);
        mig.mig_parent_uuid = Some("GPU-c".into());
        let status = NodeGpuReportStatus {
            gpus: vec![gpu("GPU-a", 80 * GIB), held, parent, mig],
            ..NodeGpuReportStatus::default()
        };
        assert_eq!(NodeCapacity::mib(&status), 100 * 1024);
        // Nothing held: every schedulable device counts (what `summary.totalBytes` says).
        let mut free = status.clone();
        free.gpus[1].held_by.clear();
        assert_eq!(NodeCapacity::mib(&free), 180 * 1024);
    }
}
