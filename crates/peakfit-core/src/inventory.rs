//! What the agent saw on a node's GPUs, in the shape both the agent (which writes it) and the
//! extender (which reads it) agree on. It is the `status` of the `NodeGpuReport` custom resource,
//! so every field here is part of a public API: add fields, never rename them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One schedulable memory domain: a whole GPU, or one MIG instance of a GPU in MIG mode.
///
/// MIG instances are listed as devices of their own because a pod pinned to a MIG instance can
/// only ever use that instance's memory; the parent of MIG instances carries `mig_enabled: true`
/// and is not itself schedulable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuDevice {
    /// NVML index of the physical GPU (MIG instances share their parent's index).
    pub index: u32,
    /// `GPU-…` for a physical GPU, `MIG-…` for a MIG instance; what `NVIDIA_VISIBLE_DEVICES` takes.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub memory_free_bytes: u64,
    /// Memory the driver keeps for itself (NVML `memory_info` v2 `reserved`); 0 where unknown.
    #[serde(default)]
    pub memory_reserved_bytes: u64,
    /// True on a physical GPU whose memory is split into MIG instances.
    #[serde(default)]
    pub mig_enabled: bool,
    /// For a MIG instance: the UUID of the physical GPU it lives on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_parent_uuid: Option<String>,
    /// For a MIG instance: its GPU instance id, which NVML reports on each process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_gpu_instance_id: Option<u32>,
    /// Compute processes running on this device.
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
    /// Fields the driver could not provide (e.g. `processes: NotSupported`); the rest is valid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<String>,
    /// The pods the kubelet gave this device to through a device plugin or a DRA claim, read
    /// from its `PodResources` API (issue 23). peakfit shares memory only on devices nobody else
    /// was given: the kubelet does not know peakfit's placements, and whoever allocates last on
    /// a shared device runs out of memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<DeviceHolder>,
}

/// How the kubelet handed a device to a container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HolderKind {
    /// A device plugin's extended resource (`nvidia.com/gpu`).
    #[default]
    DevicePlugin,
    /// A DRA `ResourceClaim` allocated by a driver (`gpu.nvidia.com`).
    Dra,
}

/// One container the kubelet gave a device to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceHolder {
    pub namespace: String,
    pub pod_name: String,
    #[serde(default)]
    pub container: String,
    pub kind: HolderKind,
    /// The device plugin's resource name (`nvidia.com/gpu`), or the DRA driver's name
    /// (`gpu.nvidia.com`).
    pub resource: String,
    /// For a DRA allocation: the claim, as `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

impl DeviceHolder {
    /// `ml/trainer-0 through nvidia.com/gpu` or `ml/trainer-0 through claim ml/gpus (gpu.nvidia.com)`:
    /// what a filter reason and an event name.
    pub fn describe(&self) -> String {
        match (&self.kind, &self.claim) {
            (HolderKind::Dra, Some(claim)) => format!(
                "{}/{} through claim {claim} ({})",
                self.namespace, self.pod_name, self.resource
            ),
            _ => format!(
                "{}/{} through {}",
                self.namespace, self.pod_name, self.resource
            ),
        }
    }
}

/// Whether the agent could read the kubelet's `PodResources` API, and if not why: without it the
/// agent cannot tell which devices the kubelet handed out (issue 23).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodResourcesStatus {
    pub up: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A process using GPU memory, attributed to a pod when its cgroup says which one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    /// Host PID.
    pub pid: u32,
    /// Memory the driver attributes to the process; `None` when the driver does not say
    /// (vGPU, some containers), which the ledger treats as unattributed use of the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// The pod's UID from the process's cgroup; `None` for processes of no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
}

/// Whether the agent could talk to NVML at all, and if not why, so an operator reading the report
/// (or the extender's filter reason) sees "driver not loaded" instead of an empty GPU list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvmlStatus {
    pub up: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Node-level summary the agent computes so operators and alerts need no arithmetic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMemorySummary {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// The most memory a single one-GPU pod could get on this node right now.
    pub largest_free_block_bytes: u64,
    /// Free memory on devices too small for the pods this node usually hosts.
    pub stranded_bytes: u64,
}

/// The `status` of a `NodeGpuReport`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpuReportStatus {
    /// When the agent read NVML (RFC 3339). The extender refuses reports older than its
    /// staleness limit, so a dead agent can never leave a node looking free.
    pub observed_at: String,
    #[serde(default)]
    pub nvml: NvmlStatus,
    #[serde(default)]
    pub gpus: Vec<GpuDevice>,
    #[serde(default)]
    pub summary: NodeMemorySummary,
    /// The agent's version, to spot mixed rollouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Each running pod's highest use of each GPU since it started there, as the agent saw it
    /// at every poll: a spike between two report writes is kept here, and the extender counts
    /// the pod at no less (issue 21). At most [`MAX_POD_PEAKS`] entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_peaks: Vec<PodPeak>,
    /// Whether the kubelet's `PodResources` API was read at this poll; `None` from an agent that
    /// does not read it (older, or `--pod-resources-socket ""`), where `held_by` means nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resources: Option<PodResourcesStatus>,
}

/// The most `pod_peaks` a report carries: the pods of one node are few (110 by the kubelet's
/// default `maxPods`), each on a few GPUs; 256 entries are about 40 KB of report.
pub const MAX_POD_PEAKS: usize = 256;

/// One pod's highest use of one GPU since it started on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPeak {
    pub pod_uid: String,
    pub gpu_uuid: String,
    /// Its processes' summed use at the poll that saw the most.
    pub peak_bytes: u64,
    /// When that poll was (RFC 3339).
    pub at: String,
}

impl GpuDevice {
    /// Whether pods can be placed on this device itself (a MIG parent cannot; its instances can).
    pub fn is_schedulable(&self) -> bool {
        !self.mig_enabled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_described_by_pod_and_resource_or_claim() {
        let mut h = DeviceHolder {
            namespace: "ml".into(),
            pod_name: "trainer-0".into(),
            container: "main".into(),
            kind: HolderKind::DevicePlugin,
            resource: "nvidia.com/gpu".into(),
            claim: None,
        };
        assert_eq!(h.describe(), "ml/trainer-0 through nvidia.com/gpu");
        h.kind = HolderKind::Dra;
        h.resource = "gpu.nvidia.com".into();
        h.claim = Some("ml/gpus".into());
        assert_eq!(
            h.describe(),
            "ml/trainer-0 through claim ml/gpus (gpu.nvidia.com)"
        );
    }

    #[test]
    fn a_report_without_holders_reads_as_before() {
        let d: GpuDevice = serde_json::from_str(
            r#"{"index":0,"uuid":"GPU-0","memoryTotalBytes":1,"memoryUsedBytes":0,"memoryFreeBytes":1}"#,
        )
        .unwrap();
        assert!(d.held_by.is_empty());
        assert!(!serde_json::to_string(&d).unwrap().contains("heldBy"));
    }
}
