//! The ledger: what is committed on every GPU, and therefore what is free.
//!
//! `committed = Σ max(predicted, observed) over the GPU's pods + unattributed use + driver reserve`.
//! Counting each pod at the larger of its prediction and its use is what keeps a heavy inference
//! pod that has not grown yet (weights loading, KV cache filling) from being squeezed by a
//! neighbour placed on its current, low use.
//!
//! The extender asks "what is free" for 40,000 devices per request, so every device keeps its
//! sums up to date as reservations and observations change: reading a device is O(1), reading a
//! node O(devices), and nothing rescans pods per request.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::inventory::{DeviceHolder, NodeGpuReportStatus};

use super::demand::{GpuRoom, PodClass};
use super::fit::Placement;

/// How the index names a pod: its UID when it has one (stable across renames, unique across
/// namespaces), `namespace/name` for objects without one (hand-written files; see `cluster::index::pod_key`).
pub type PodKey = String;

/// One pod's claim on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// What bind reserved (the model's peak, or the explicit `peakfit.io/vram`).
    pub predicted_bytes: u64,
    /// What the agent last saw the pod's processes use on this GPU.
    pub observed_bytes: u64,
}

/// Memory a GPU keeps for a pod that has starved (see `placement::hold`): committed for every
/// other pod, so they bind here only beside it, and not for the pod itself, which is why it is
/// an entry of its own kind and not a `Reservation` (those count for everyone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHold {
    pub pod: PodKey,
    /// What the held pod will reserve here (its share on this GPU, without the margin: a pod
    /// that binds beside it keeps its own margin free, which is the held pod's).
    pub bytes: u64,
}

/// A hold that cannot be placed as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HoldError {
    #[error("GPU {gpu} of node {node} already holds memory for pod {holder}")]
    Taken {
        node: String,
        gpu: usize,
        holder: PodKey,
    },
    #[error("node {node} has no GPU {gpu}")]
    NoSuchGpu { node: String, gpu: usize },
}

impl Reservation {
    pub fn charged_bytes(&self) -> u64 {
        self.predicted_bytes.max(self.observed_bytes)
    }
}

/// One schedulable device (a GPU or a MIG instance) on a node.
///
/// Reservations are private so that the cached sums cannot drift from them; the other fields
/// are read on every request and may be set freely.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuLedger {
    pub uuid: String,
    /// Product name (`NVIDIA H100 80GB HBM3`, or an openb model such as `G2`); pods may be
    /// restricted to some models. Shared: the GPUs of one node (and in the extender's index,
    /// every GPU of a model) point at one string, so telling GPU kinds apart is a pointer
    /// compare, not a trip to memory per GPU.
    #[serde(default)]
    pub model: Arc<str>,
    pub total_bytes: u64,
    pub driver_reserved_bytes: u64,
    /// Use the agent saw that belongs to no pod with a reservation here (other schedulers, host
    /// processes, processes whose memory the driver does not attribute).
    pub unattributed_bytes: u64,
    reservations: BTreeMap<PodKey, Reservation>,
    /// Σ charged bytes of `reservations`.
    charged_sum: u64,
    /// Σ observed bytes of `reservations`.
    observed_sum: u64,
    /// Memory kept for a starving pod; one at most, so that two starving pods never wait on
    /// the same departures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold: Option<GpuHold>,
    /// Set when the kubelet gave this device to a pod peakfit did not place (a device plugin's
    /// `nvidia.com/gpu`, a DRA claim): that pod may use all of it whenever it likes, so the
    /// device is committed in full to it and offered to no peakfit pod (issue 23). Boxed: most
    /// devices have none, and the index keeps tens of thousands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    granted: Option<Box<Grant>>,
}

/// Who the kubelet gave a device to, outside peakfit, and the device's NVML index: what a
/// filter reason and an event name ("GPU 3 (GPU-…) is held by ml/trainer-0 through
/// nvidia.com/gpu").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// NVML index of the physical GPU (a MIG instance shares its parent's).
    pub index: u32,
    /// At least one.
    pub holders: Vec<DeviceHolder>,
}

impl Grant {
    /// `GPU 3 (GPU-…) is held by ml/trainer-0 through nvidia.com/gpu` (holders joined by `and`).
    pub fn describe(&self, uuid: &str) -> String {
        let who: Vec<String> = self.holders.iter().map(DeviceHolder::describe).collect();
        format!(
            "GPU {} ({uuid}) is held by {}",
            self.index,
            who.join(" and ")
        )
    }
}

impl GpuLedger {
    pub fn new(uuid: impl Into<String>, total_bytes: u64) -> Self {
        Self {
            uuid: uuid.into(),
            total_bytes,
            ..Default::default()
        }
    }

    pub fn with_model(mut self, model: impl Into<Arc<str>>) -> Self {
        self.model = model.into();
        self
    }

    pub fn reservations(&self) -> &BTreeMap<PodKey, Reservation> {
        &self.reservations
    }

    pub fn reservation(&self, pod: &str) -> Option<&Reservation> {
        self.reservations.get(pod)
    }

    /// Sets (or replaces) a pod's prediction on this device, keeping what was observed of it.
    pub fn reserve(&mut self, pod: &str, predicted_bytes: u64) {
        let old = self.reservations.get(pod).copied().unwrap_or_default();
        self.put(
            pod,
            Reservation {
                predicted_bytes,
                observed_bytes: old.observed_bytes,
            },
        );
    }

    /// Drops a pod's reservation; returns it if there was one.
    pub fn release(&mut self, pod: &str) -> Option<Reservation> {
        let old = self.reservations.remove(pod)?;
        self.adjust_sums(old, Reservation::default());
        Some(old)
    }

    /// Moves the cached sums from `old` to `new`. The sums saturate (a reservation read from an
    /// annotation may be as large as the parser allows); a saturated sum cannot be taken back
    /// step by step, so it is recomputed from the reservations instead.
    fn adjust_sums(&mut self, old: Reservation, new: Reservation) {
        let step = |sum: u64, old: u64, new: u64| {
            (sum != u64::MAX)
                .then(|| sum.checked_sub(old)?.checked_add(new))
                .flatten()
                .filter(|&s| s != u64::MAX)
        };
        match (
            step(self.charged_sum, old.charged_bytes(), new.charged_bytes()),
            step(self.observed_sum, old.observed_bytes, new.observed_bytes),
        ) {
            (Some(charged), Some(observed)) => {
                self.charged_sum = charged;
                self.observed_sum = observed;
            }
            _ => self.resum(),
        }
    }

    fn resum(&mut self) {
        let (mut charged, mut observed) = (0u64, 0u64);
        for r in self.reservations.values() {
            charged = charged.saturating_add(r.charged_bytes());
            observed = observed.saturating_add(r.observed_bytes);
        }
        self.charged_sum = charged;
        self.observed_sum = observed;
    }

    fn put(&mut self, pod: &str, new: Reservation) {
        let old = match self.reservations.get_mut(pod) {
            Some(slot) => std::mem::replace(slot, new),
            None => {
                self.reservations.insert(pod.to_owned(), new);
                Reservation::default()
            }
        };
        self.adjust_sums(old, new);
    }

    /// Applies what the agent saw on this device: its size, the driver's reserve, and the use of
    /// each pod's processes (`pods`, summed per pod by the caller or not: repeated keys add up).
    ///
    /// Reservations survive: a pod with a reservation is charged max(predicted, observed), a pod
    /// with a reservation that the agent did not see is charged its prediction (not started, or
    /// between processes). Use by pods without a reservation on this device is unattributed: it
    /// is on the device whoever owns it.
    pub fn observe<'a>(
        &mut self,
        total_bytes: u64,
        driver_reserved_bytes: u64,
        pods: impl IntoIterator<Item = (&'a str, u64)>,
        unattributed_bytes: u64,
    ) {
        self.total_bytes = total_bytes;
        self.driver_reserved_bytes = driver_reserved_bytes;
        let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
        let mut unattributed = unattributed_bytes;
        for (pod, bytes) in pods {
            if self.reservations.contains_key(pod) {
                let e = seen.entry(pod).or_default();
                *e = e.saturating_add(bytes);
            } else {
                unattributed = unattributed.saturating_add(bytes);
            }
        }
        self.unattributed_bytes = unattributed;
        for (pod, r) in &mut self.reservations {
            r.observed_bytes = seen.get(pod.as_str()).copied().unwrap_or(0);
        }
        self.resum();
    }

    /// What every pod but the holder sees as taken: reservations, unattributed use, the
    /// driver's reserve, and the hold. A device the kubelet granted to someone else counts in
    /// full for that holder (its use and the driver's reserve are within it), plus whatever
    /// peakfit pods reserve on it too: a conflict then reads as more committed than the device
    /// has, which is the truth.
    pub fn committed_bytes(&self) -> u64 {
        let base = if self.granted.is_some() {
            self.total_bytes
        } else {
            self.unattributed_bytes
                .saturating_add(self.driver_reserved_bytes)
        };
        base.saturating_add(self.charged_sum)
            .saturating_add(self.held_bytes())
    }

    /// The pods outside peakfit the kubelet gave this device to, if any.
    pub fn granted(&self) -> Option<&Grant> {
        self.granted.as_deref()
    }

    /// Records who outside peakfit the kubelet gave this device to; `None` or no holders clears it.
    pub fn set_granted(&mut self, grant: Option<Grant>) {
        self.granted = grant.filter(|g| !g.holders.is_empty()).map(Box::new);
    }

    /// What peakfit pods could have of this device with every peakfit pod gone: nothing on a
    /// device granted to someone else, else its size less the driver's reserve and the use no
    /// eviction frees. What preemption and holds may hope for.
    pub fn room_without_pods(&self) -> u64 {
        if self.granted.is_some() {
            return 0;
        }
        self.total_bytes
            .saturating_sub(self.driver_reserved_bytes)
            .saturating_sub(self.unattributed_bytes)
    }

    /// The memory kept for a starving pod (0 without a hold).
    pub fn held_bytes(&self) -> u64 {
        self.hold.as_ref().map_or(0, |h| h.bytes)
    }

    pub fn hold(&self) -> Option<&GpuHold> {
        self.hold.as_ref()
    }

    /// Keeps `bytes` for `pod`, replacing a hold of the same pod; `Err` with the holder when
    /// another pod holds this GPU.
    pub fn set_hold(&mut self, pod: &str, bytes: u64) -> Result<(), PodKey> {
        match &self.hold {
            Some(h) if h.pod != pod => Err(h.pod.clone()),
            _ => {
                self.hold = Some(GpuHold {
                    pod: pod.to_owned(),
                    bytes,
                });
                Ok(())
            }
        }
    }

    /// Drops `pod`'s hold; whether there was one.
    pub fn clear_hold(&mut self, pod: &str) -> bool {
        if self.hold.as_ref().is_some_and(|h| h.pod == pod) {
            self.hold = None;
            true
        } else {
            false
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.committed_bytes())
    }

    /// This GPU as the fit sizes a pod on it, keeping `margin_bytes` beside the pod's peak.
    pub fn room(&self, margin_bytes: u64) -> GpuRoom {
        GpuRoom {
            total_bytes: self.total_bytes,
            usable_bytes: self.total_bytes.saturating_sub(self.driver_reserved_bytes),
            margin_bytes,
        }
    }

    /// Whether placement sizes every pod alike on this GPU and `other`: the same room (size and
    /// what the driver leaves of it: usable memory decides whether a pod shares a GPU or takes
    /// it whole, `fit::need_on`) and model. The one key of a GPU kind: fragmentation's groups
    /// (`FragState`) and the fill patterns (`PatternCache`, per room and model) both follow it,
    /// so two GPUs are never one kind to one and two to the other. The models of one node's
    /// GPUs are usually one shared string, so the pointer compare answers without reading it.
    pub fn same_kind(&self, other: &GpuLedger) -> bool {
        self.room(0) == other.room(0)
            && (Arc::ptr_eq(&self.model, &other.model) || self.model == other.model)
    }

    /// What is actually in use now (pods' processes plus unattributed; without the driver's
    /// reserve), to compare with what is committed.
    pub fn observed_bytes(&self) -> u64 {
        self.observed_sum.saturating_add(self.unattributed_bytes)
    }
}

/// `name` as one of `seen`, added if new: the GPUs of a node share their model strings (see
/// `GpuLedger::model`).
pub fn shared_model(seen: &mut Vec<Arc<str>>, name: &str) -> Arc<str> {
    if let Some(m) = seen.iter().find(|m| ***m == *name) {
        return m.clone();
    }
    let m: Arc<str> = name.into();
    seen.push(m.clone());
    m
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
    /// The agent cannot read the kubelet's `PodResources` API while something on the node can
    /// hand GPUs out without peakfit (`by`): a GPU handed out now would look free. Set by the
    /// extender, which sees the Node and the DRA `ResourceSlices`; a report alone never says it.
    PodResourcesDown { reason: String, by: Allocators },
}

/// What can hand a node's GPUs to pods peakfit does not place, as the extender sees it from
/// outside the node: at least one is named wherever it is used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocators {
    /// The first GPU resource (`--gpu-resources`) the Node's allocatable advertises non-zero.
    pub device_plugin: Option<String>,
    /// A DRA driver (`--gpu-dra-drivers`) with a `ResourceSlice` of devices for this node: DRA
    /// devices never show in allocatable, so the slices are the only sign of them.
    pub dra_driver: Option<String>,
}

impl Allocators {
    /// Whether anything can hand GPUs out here.
    pub fn any(&self) -> bool {
        self.device_plugin.is_some() || self.dra_driver.is_some()
    }
}

/// "the node's device plugin advertises R", "DRA driver D publishes GPUs on this node", or both
/// joined by "and": the words of the refusal, naming what an operator would look at.
impl std::fmt::Display for Allocators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(r) = &self.device_plugin {
            write!(f, "the node's device plugin advertises {r}")?;
            if self.dra_driver.is_some() {
                f.write_str(" and ")?;
            }
        }
        if let Some(d) = &self.dra_driver {
            write!(f, "DRA driver {d} publishes GPUs on this node")?;
        }
        Ok(())
    }
}

/// A node's GPUs and their reservations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeLedger {
    pub name: String,
    /// Schedulable devices only: whole GPUs and MIG instances, never MIG parents.
    pub gpus: Vec<GpuLedger>,
    /// When the agent last read this node's GPUs, in Unix seconds; `None` when unknown (a
    /// report whose time did not parse), which a fit with a staleness limit treats as stale.
    pub observed_at_unix: Option<i64>,
    pub condition: NodeCondition,
    /// CPU the node can give pods (the Node's `status.allocatable` in the extender, the trace's
    /// node in the openb simulation); `None` when unknown, and then CPU is not accounted.
    pub cpu_capacity_milli: Option<u64>,
    /// Host memory the node can give pods, as `cpu_capacity_milli`. Tracked so the ledger holds
    /// what kube-scheduler's `NodeResourcesFit` sees; placement does not score it.
    #[serde(default)]
    pub memory_capacity_bytes: Option<u64>,
    cpu_used_milli: u64,
    #[serde(default)]
    memory_used_bytes: u64,
    /// Per pod: (CPU millicores, memory bytes) it requested on this node.
    cpu_by_pod: BTreeMap<PodKey, (u64, u64)>,
}

/// One node at a glance, for metrics and the filter's words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub total_bytes: u64,
    pub committed_bytes: u64,
    pub observed_bytes: u64,
    pub free_bytes: u64,
    /// The most a one-GPU pod could get on this node now.
    pub largest_free_block_bytes: u64,
}

/// A report the ledger could not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("observedAt {value:?} is not an RFC 3339 time: {reason}")]
    ObservedAt { value: String, reason: String },
}

impl NodeLedger {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            gpus: Vec::new(),
            observed_at_unix: None,
            condition: NodeCondition::NoReport,
            cpu_capacity_milli: None,
            memory_capacity_bytes: None,
            cpu_used_milli: 0,
            memory_used_bytes: 0,
            cpu_by_pod: BTreeMap::new(),
        }
    }

    /// A node whose GPUs are known without an agent (simulation, tests).
    pub fn with_gpus(name: impl Into<String>, gpus: Vec<GpuLedger>) -> Self {
        Self {
            gpus,
            condition: NodeCondition::Ready,
            ..Self::new(name)
        }
    }

    pub fn with_cpu_milli(mut self, capacity: u64) -> Self {
        self.cpu_capacity_milli = Some(capacity);
        self
    }

    /// Records a pod's per-GPU reservations (bind's commit). Replaces an earlier one of the pod,
    /// keeping what was observed of it on GPUs it keeps.
    pub fn reserve(&mut self, pod: &str, gpu_indices: &[usize], per_gpu_bytes: &[u64]) {
        for (i, gpu) in self.gpus.iter_mut().enumerate() {
            match gpu_indices.iter().position(|&j| j == i) {
                Some(k) => gpu.reserve(pod, per_gpu_bytes.get(k).copied().unwrap_or(0)),
                None => {
                    gpu.release(pod);
                }
            }
        }
    }

    pub fn with_memory_bytes(mut self, capacity: u64) -> Self {
        self.memory_capacity_bytes = Some(capacity);
        self
    }

    /// Bind's commit for a pod class: its GPUs, and its CPU where the node tracks CPU.
    pub fn reserve_placement(&mut self, pod: &str, placement: &Placement, class: &PodClass) {
        self.reserve(pod, &placement.gpu_indices, &placement.per_gpu_bytes);
        self.reserve_host(pod, class.cpu_milli, 0);
    }

    /// Records what a pod requested of the node's CPU and host memory (any pod bound there,
    /// with or without GPUs: kube-scheduler counts them all). Replaces an earlier record of it.
    /// Nothing is kept for a node that tracks neither.
    pub fn reserve_host(&mut self, pod: &str, cpu_milli: u64, memory_bytes: u64) {
        self.release_cpu(pod);
        let tracked = self.cpu_capacity_milli.is_some() || self.memory_capacity_bytes.is_some();
        if tracked && (cpu_milli > 0 || memory_bytes > 0) {
            self.cpu_used_milli = self.cpu_used_milli.saturating_add(cpu_milli);
            self.memory_used_bytes = self.memory_used_bytes.saturating_add(memory_bytes);
            self.cpu_by_pod
                .insert(pod.to_owned(), (cpu_milli, memory_bytes));
        }
    }

    fn release_cpu(&mut self, pod: &str) -> bool {
        match self.cpu_by_pod.remove(pod) {
            Some((c, m)) => {
                self.cpu_used_milli = self.cpu_used_milli.saturating_sub(c);
                self.memory_used_bytes = self.memory_used_bytes.saturating_sub(m);
                true
            }
            None => false,
        }
    }

    /// Drops every reservation of a pod (it finished, was deleted or preempted).
    pub fn release(&mut self, pod: &str) -> bool {
        let mut found = self.release_cpu(pod);
        for gpu in &mut self.gpus {
            found |= gpu.release(pod).is_some();
        }
        found
    }

    /// Keeps the placement's bytes on its GPUs for `pod` (a starving pod's hold), replacing an
    /// earlier hold of the pod on this node. Nothing changes when a GPU is missing or held for
    /// another pod.
    pub fn hold(&mut self, pod: &str, placement: &Placement) -> Result<(), HoldError> {
        for &gpu in &placement.gpu_indices {
            match self.gpus.get(gpu).and_then(GpuLedger::hold) {
                None if gpu >= self.gpus.len() => {
                    return Err(HoldError::NoSuchGpu {
                        node: self.name.clone(),
                        gpu,
                    });
                }
                Some(h) if h.pod != pod => {
                    return Err(HoldError::Taken {
                        node: self.name.clone(),
                        gpu,
                        holder: h.pod.clone(),
                    });
                }
                _ => {}
            }
        }
        self.unhold(pod);
        for (&gpu, &bytes) in placement.gpu_indices.iter().zip(&placement.per_gpu_bytes) {
            self.gpus[gpu]
                .set_hold(pod, bytes)
                .expect("checked above: no other pod holds it");
        }
        Ok(())
    }

    /// Drops every hold of `pod` on this node; whether there was one.
    pub fn unhold(&mut self, pod: &str) -> bool {
        let mut found = false;
        for gpu in &mut self.gpus {
            found |= gpu.clear_hold(pod);
        }
        found
    }

    /// The node as `pod` sees it: its own hold is memory kept for it, not taken from it. Borrowed
    /// (no copy) unless the pod holds GPUs here, so the fit and scoring code run unchanged on
    /// what this returns.
    pub fn seen_by(&self, pod: &str) -> Cow<'_, NodeLedger> {
        if self
            .gpus
            .iter()
            .any(|g| g.hold.as_ref().is_some_and(|h| h.pod == pod))
        {
            let mut own = self.clone();
            own.unhold(pod);
            Cow::Owned(own)
        } else {
            Cow::Borrowed(self)
        }
    }

    /// CPU still free for pods; `None` when the node does not track CPU.
    pub fn cpu_free_milli(&self) -> Option<u64> {
        self.cpu_capacity_milli
            .map(|c| c.saturating_sub(self.cpu_used_milli))
    }

    /// Host memory still free for pods; `None` when the node does not track it.
    pub fn memory_free_bytes(&self) -> Option<u64> {
        self.memory_capacity_bytes
            .map(|c| c.saturating_sub(self.memory_used_bytes))
    }

    pub fn free_bytes(&self) -> u64 {
        self.gpus.iter().map(GpuLedger::free_bytes).sum()
    }

    pub fn summary(&self) -> NodeSummary {
        let mut s = NodeSummary::default();
        for g in &self.gpus {
            let free = g.free_bytes();
            s.total_bytes += g.total_bytes;
            s.committed_bytes += g.committed_bytes().min(g.total_bytes);
            s.observed_bytes += g.observed_bytes();
            s.free_bytes += free;
            s.largest_free_block_bytes = s.largest_free_block_bytes.max(free);
        }
        s
    }

    /// Applies an agent report: devices are matched by UUID and keep their reservations; MIG
    /// parents are skipped (their instances are the devices); processes are charged to the pods
    /// that hold a reservation on their device, everything else the device uses is unattributed.
    ///
    /// Returns the pods whose reservations were on devices that are gone from the report (MIG
    /// reconfigured, GPU fell off the bus), so the caller can say so. On an unreadable
    /// `observedAt` the GPUs are still applied and the time left unknown (a stale node).
    pub fn apply_report(
        &mut self,
        status: &NodeGpuReportStatus,
    ) -> Result<Vec<PodKey>, ReportError> {
        let mut old: BTreeMap<String, GpuLedger> =
            self.gpus.drain(..).map(|g| (g.uuid.clone(), g)).collect();
        let mut models: Vec<Arc<str>> = Vec::new();
        for dev in status.gpus.iter().filter(|d| d.is_schedulable()) {
            let mut gpu = old
                .remove(&dev.uuid)
                .unwrap_or_else(|| GpuLedger::new(dev.uuid.clone(), dev.memory_total_bytes));
            gpu.model = shared_model(&mut models, &dev.name);
            // Every holder is recorded: this ledger keys pods by UID and cannot tell whether a
            // holder (named by namespace and name) is a pod of its own; the extender's index,
            // which can, drops those before it builds its ledgers (`cluster::index::rebuild`).
            gpu.set_granted(Some(Grant {
                index: dev.index,
                holders: dev.held_by.clone(),
            }));
            let attributed: Vec<(&str, u64)> = dev
                .processes
                .iter()
                .filter_map(|p| {
                    let pod = p.pod_uid.as_deref()?;
                    let used = p.used_bytes?;
                    gpu.reservations.contains_key(pod).then_some((pod, used))
                })
                .collect();
            let attributed_sum: u64 = attributed.iter().map(|&(_, b)| b).sum();
            let unattributed = dev.memory_used_bytes.saturating_sub(attributed_sum);
            gpu.observe(
                dev.memory_total_bytes,
                dev.memory_reserved_bytes,
                attributed,
                unattributed,
            );
            self.gpus.push(gpu);
        }
        let lost: Vec<PodKey> = old
            .into_values()
            .flat_map(|g| g.reservations.into_keys())
            .collect();
        self.condition = if status.nvml.up {
            NodeCondition::Ready
        } else {
            NodeCondition::NvmlDown {
                reason: status
                    .nvml
                    .reason
                    .clone()
                    .unwrap_or_else(|| "the agent gave no reason".into()),
            }
        };
        match status.observed_at.parse::<jiff::Timestamp>() {
            Ok(t) => {
                self.observed_at_unix = Some(t.as_second());
                Ok(lost)
            }
            Err(e) => {
                self.observed_at_unix = None;
                Err(ReportError::ObservedAt {
                    value: status.observed_at.clone(),
                    reason: e.to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuDevice, GpuProcess, NvmlStatus};

    const GI: u64 = 1 << 30;

    /// The probe's two pods with `reserved-bytes: 18446744073709551615` overflowed the sum.
    #[test]
    fn huge_reservations_saturate_and_release_exactly() {
        let mut g = GpuLedger::new("GPU-0", 80 * GI);
        g.reserve("a", u64::MAX);
        g.reserve("b", u64::MAX);
        g.reserve("c", GI);
        assert_eq!(g.committed_bytes(), u64::MAX);
        assert_eq!(g.free_bytes(), 0);
        g.observe(80 * GI, 0, [("a", u64::MAX), ("a", 5)], u64::MAX);
        assert_eq!(g.observed_bytes(), u64::MAX);
        g.observe(80 * GI, 0, [], 0);
        g.release("a");
        assert_eq!(g.committed_bytes(), u64::MAX);
        g.release("b");
        assert_eq!(g.committed_bytes(), GI);
        g.reserve("c", 2 * GI);
        assert_eq!(g.committed_bytes(), 2 * GI);
        g.release("c");
        assert_eq!((g.committed_bytes(), g.free_bytes()), (0, 80 * GI));
    }

    #[test]
    fn a_pod_counts_at_the_larger_of_predicted_and_observed() {
        let mut gpu = GpuLedger::new("GPU-a", 80 * GI);
        gpu.reserve("p", 30 * GI);
        gpu.reserve("q", 10 * GI);
        gpu.observe(80 * GI, GI, [("p", 5 * GI), ("q", 12 * GI)], 2 * GI);
        assert_eq!(gpu.committed_bytes(), (1 + 2 + 30 + 12) * GI);
        assert_eq!(gpu.free_bytes(), 35 * GI);
        assert_eq!(gpu.observed_bytes(), (5 + 12 + 2) * GI);
    }

    #[test]
    fn an_observation_keeps_reservations_and_charges_strangers_as_unattributed() {
        let mut gpu = GpuLedger::new("GPU-a", 80 * GI);
        gpu.reserve("p", 30 * GI);
        gpu.observe(80 * GI, 0, [("stranger", 4 * GI)], GI);
        assert_eq!(gpu.reservation("p").unwrap().predicted_bytes, 30 * GI);
        assert_eq!(gpu.unattributed_bytes, 5 * GI);
        assert_eq!(gpu.committed_bytes(), 35 * GI);
        // A re-reservation (bind after restart) keeps what was observed.
        gpu.observe(80 * GI, 0, [("p", 40 * GI)], 0);
        gpu.reserve("p", 20 * GI);
        assert_eq!(gpu.committed_bytes(), 40 * GI);
        assert_eq!(gpu.release("p").unwrap().observed_bytes, 40 * GI);
        assert_eq!(gpu.committed_bytes(), 0);
    }

    #[test]
    fn reserve_then_release_restores_every_device() {
        let mut node = NodeLedger::with_gpus(
            "n",
            vec![GpuLedger::new("a", 40 * GI), GpuLedger::new("b", 40 * GI)],
        );
        node.reserve("p", &[0, 1], &[10 * GI, 12 * GI]);
        assert_eq!(node.free_bytes(), 58 * GI);
        // A second reserve of the same pod replaces the first.
        node.reserve("p", &[1], &[5 * GI]);
        assert_eq!(node.free_bytes(), 75 * GI);
        assert!(node.release("p"));
        assert!(!node.release("p"));
        assert_eq!(node.free_bytes(), 80 * GI);
    }

    #[test]
    fn cpu_is_reserved_and_released_with_the_pod() {
        let mut node =
            NodeLedger::with_gpus("n", vec![GpuLedger::new("a", 16 * GI)]).with_cpu_milli(8000);
        let class = PodClass {
            cpu_milli: 3000,
            ..Default::default()
        };
        let placement = Placement {
            gpu_indices: vec![0],
            per_gpu_bytes: vec![GI],
        };
        node.reserve_placement("p", &placement, &class);
        assert_eq!(node.cpu_free_milli(), Some(5000));
        node.release("p");
        assert_eq!(node.cpu_free_milli(), Some(8000));
    }

    fn device(uuid: &str, total: u64, used: u64) -> GpuDevice {
        GpuDevice {
            uuid: uuid.into(),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total_bytes: total,
            memory_used_bytes: used,
            memory_free_bytes: total - used,
            ..Default::default()
        }
    }

    fn status(gpus: Vec<GpuDevice>) -> NodeGpuReportStatus {
        NodeGpuReportStatus {
            observed_at: "2026-11-21T18:00:00Z".into(),
            nvml: NvmlStatus {
                up: true,
                ..Default::default()
            },
            gpus,
            ..Default::default()
        }
    }

    #[test]
    fn a_report_feeds_the_ledger_and_skips_mig_parents() {
        let mut node = NodeLedger::new("n");
        let mut parent = device("GPU-p", 80 * GI, 0);
        parent.mig_enabled = true;
        let mut mig = device("MIG-1", 20 * GI, 0);
        mig.mig_parent_uuid = Some("GPU-p".into());
        let whole = device("GPU-w", 80 * GI, 0);
        node.apply_report(&status(vec![parent, mig, whole]))
            .unwrap();
        assert_eq!(node.condition, NodeCondition::Ready);
        assert_eq!(node.observed_at_unix, Some(1_795_284_000));
        let uuids: Vec<_> = node.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["MIG-1", "GPU-w"]);

        node.reserve("pod-a", &[1], &[30 * GI]);
        let mut whole = device("GPU-w", 80 * GI, 45 * GI);
        whole.memory_reserved_bytes = GI;
        whole.processes = vec![
            GpuProcess {
                pid: 1,
                used_bytes: Some(35 * GI),
                pod_uid: Some("pod-a".into()),
                container_id: None,
            },
            GpuProcess {
                pid: 2,
                used_bytes: None,
                pod_uid: Some("pod-a".into()),
                container_id: None,
            },
        ];
        let lost = node.apply_report(&status(vec![whole])).unwrap();
        assert!(lost.is_empty());
        let g = &node.gpus[0];
        assert_eq!(g.reservation("pod-a").unwrap().observed_bytes, 35 * GI);
        // 45 used - 35 attributed = 10 unattributed (the process with no byte count among it).
        assert_eq!(g.unattributed_bytes, 10 * GI);
        assert_eq!(g.committed_bytes(), (35 + 10 + 1) * GI);
        let s = node.summary();
        assert_eq!(s.free_bytes, 34 * GI);
        assert_eq!(s.largest_free_block_bytes, 34 * GI);
    }

    fn holder(pod: &str) -> DeviceHolder {
        DeviceHolder {
            namespace: "ml".into(),
            pod_name: pod.into(),
            container: "main".into(),
            kind: crate::inventory::HolderKind::DevicePlugin,
            resource: "nvidia.com/gpu".into(),
            claim: None,
        }
    }

    /// Issue 23: a GPU the kubelet gave to a pod peakfit did not place is committed in full at
    /// once, whatever NVML says of its use; a peakfit pod on it too reads as over-committed.
    #[test]
    fn a_granted_gpu_is_committed_in_full_and_a_conflict_over_it() {
        let mut node = NodeLedger::new("n");
        let mut held = device("GPU-h", 24 * GI, 0);
        held.index = 3;
        held.held_by = vec![holder("trainer-0")];
        node.apply_report(&status(vec![device("GPU-f", 24 * GI, 0), held]))
            .unwrap();
        let g = &node.gpus[1];
        assert_eq!(
            g.granted().unwrap().describe(&g.uuid),
            "GPU 3 (GPU-h) is held by ml/trainer-0 through nvidia.com/gpu"
        );
        assert_eq!((g.committed_bytes(), g.free_bytes()), (24 * GI, 0));
        assert_eq!(g.room_without_pods(), 0);
        assert_eq!(node.summary().free_bytes, 24 * GI);
        // A peakfit pod assigned to it as well: both count.
        node.reserve("p", &[1], &[20 * GI]);
        assert_eq!(node.gpus[1].committed_bytes(), 44 * GI);
        assert_eq!(node.summary().committed_bytes, 24 * GI);
        // The holder leaves: the next report frees the GPU, the pod's reservation stays.
        node.apply_report(&status(vec![
            device("GPU-f", 24 * GI, 0),
            device("GPU-h", 24 * GI, 0),
        ]))
        .unwrap();
        let g = &node.gpus[1];
        assert!(g.granted().is_none());
        assert_eq!(
            (g.committed_bytes(), g.room_without_pods()),
            (20 * GI, 24 * GI)
        );
    }

    #[test]
    fn a_report_reports_lost_devices_nvml_down_and_bad_times() {
        let mut node = NodeLedger::new("n");
        node.apply_report(&status(vec![device("GPU-a", 80 * GI, 0)]))
            .unwrap();
        node.reserve("pod-a", &[0], &[GI]);
        let mut s = status(vec![]);
        s.nvml = NvmlStatus {
            up: false,
            driver_version: None,
            reason: Some("NVML_ERROR_DRIVER_NOT_LOADED".into()),
        };
        assert_eq!(node.apply_report(&s).unwrap(), vec!["pod-a".to_string()]);
        assert_eq!(
            node.condition,
            NodeCondition::NvmlDown {
                reason: "NVML_ERROR_DRIVER_NOT_LOADED".into()
            }
        );
        s.observed_at = "yesterday".into();
        let err = node.apply_report(&s).unwrap_err();
        assert!(err.to_string().contains("\"yesterday\""), "{err}");
        assert_eq!(node.observed_at_unix, None);
    }
}
