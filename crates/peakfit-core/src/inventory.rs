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
