//! The ledger: what is committed on every GPU, and therefore what is free.
//!
//! `committed = Σ max(predicted, observed) over the GPU's pods + unattributed use + driver reserve`.
//! Counting each pod at the larger of its prediction and its use is what keeps a heavy inference
//! pod that has not grown yet (weights loading, KV cache filling) from being squeezed by a
//! neighbour placed on its current, low use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The pod's UID: stable across renames and unique across namespaces.
pub type PodKey = String;

/// One pod's claim on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// What bind reserved (the model's peak, or the explicit `peakfit.io/vram`).
    pub predicted_bytes: u64,
    /// What the agent last saw the pod's processes use on this GPU.
    pub observed_bytes: u64,
}

impl Reservation {
    pub fn charged_bytes(&self) -> u64 {
        self.predicted_bytes.max(self.observed_bytes)
    }
}

/// One schedulable device (a GPU or a MIG instance) on a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuLedger {
    pub uuid: String,
    pub total_bytes: u64,
    pub driver_reserved_bytes: u64,
    /// Use the agent saw that belongs to no pod we know (other schedulers, host processes).
    pub unattributed_bytes: u64,
    pub reservations: BTreeMap<PodKey, Reservation>,
}

impl GpuLedger {
    pub fn new(uuid: impl Into<String>, total_bytes: u64) -> Self {
        Self {
            uuid: uuid.into(),
            total_bytes,
            ..Default::default()
        }
    }

    pub fn committed_bytes(&self) -> u64 {
        self.reservations
            .values()
            .map(Reservation::charged_bytes)
            .fold(
                self.unattributed_bytes
                    .saturating_add(self.driver_reserved_bytes),
                u64::saturating_add,
            )
    }

    pub fn free_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.committed_bytes())
    }

    pub fn observed_bytes(&self) -> u64 {
        self.reservations
            .values()
            .map(|r| r.observed_bytes)
            .sum::<u64>()
            + self.unattributed_bytes
    }
}

/// Why a node cannot take any pod right now, independent of the pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeCondition {
    /// The agent's last report is recent and NVML answered.
    Ready,
    /// No `NodeGpuReport` for this node yet: the agent is not running there.
    NoReport,
    /// The agent reported, but NVML is down on the node.
    NvmlDown { reason: String },
}

/// A node's GPUs and their reservations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeLedger {
    pub name: String,
    pub gpus: Vec<GpuLedger>,
    /// When the agent last read this node's GPUs, in Unix seconds.
    pub observed_at_unix: Option<i64>,
    pub condition: NodeCondition,
}

impl NodeLedger {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            gpus: Vec::new(),
            observed_at_unix: None,
            condition: NodeCondition::NoReport,
        }
    }

    /// A node whose GPUs are known without an agent (simulation, tests).
    pub fn with_gpus(name: impl Into<String>, gpus: Vec<GpuLedger>) -> Self {
        Self {
            name: name.into(),
            gpus,
            observed_at_unix: None,
            condition: NodeCondition::Ready,
        }
    }

    /// Records a pod's per-GPU reservations (bind's commit). Replaces an earlier one of the pod.
    pub fn reserve(&mut self, pod: &str, gpu_indices: &[usize], per_gpu_bytes: &[u64]) {
        self.release(pod);
        for (&i, &bytes) in gpu_indices.iter().zip(per_gpu_bytes) {
            if let Some(gpu) = self.gpus.get_mut(i) {
                gpu.reservations.insert(
                    pod.to_owned(),
                    Reservation {
                        predicted_bytes: bytes,
                        observed_bytes: 0,
                    },
                );
            }
        }
    }

    /// Drops every reservation of a pod (it finished, was deleted or preempted).
    pub fn release(&mut self, pod: &str) -> bool {
        let mut found = false;
        for gpu in &mut self.gpus {
            found |= gpu.reservations.remove(pod).is_some();
        }
        found
    }

    pub fn free_bytes(&self) -> u64 {
        self.gpus.iter().map(GpuLedger::free_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_counts_at_the_larger_of_predicted_and_observed() {
        let mut gpu = GpuLedger::new("GPU-a", 80 << 30);
        gpu.driver_reserved_bytes = 1 << 30;
        gpu.unattributed_bytes = 2 << 30;
        gpu.reservations.insert(
            "p".into(),
            Reservation {
                predicted_bytes: 30 << 30,
                observed_bytes: 5 << 30,
            },
        );
        gpu.reservations.insert(
            "q".into(),
            Reservation {
                predicted_bytes: 10 << 30,
                observed_bytes: 12 << 30,
            },
        );
        assert_eq!(gpu.committed_bytes(), (1 + 2 + 30 + 12) << 30);
        assert_eq!(gpu.free_bytes(), 35 << 30);
    }
}
