//! Turning a reading into the `NodeGpuReport` status, and deciding when it is worth writing.
//!
//! The API server should see a write only when the extender would decide differently: memory moved
//! by more than max(1 % of the GPU, 256 MiB), a process or pod came or went, NVML or the kubelet's
//! `PodResources` API went up or down, the kubelet gave a device to a pod or took it back — and at
//! least once per heartbeat, so the extender can tell a quiet node from a dead agent.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::inventory::{GpuDevice, NodeGpuReportStatus, NodeMemorySummary};

use super::nvml::Reading;

const MIB: u64 = 1 << 20;
/// The smallest memory change worth a write, whatever the GPU's size.
pub const MIN_CHANGE_BYTES: u64 = 256 * MIB;

/// Builds the status for `reading`, observed at `observed_at`. `typical_pod_bytes` is what
/// counts as "the pods this node usually hosts" for the stranded-memory figure.
pub fn build(
    observed_at: jiff::Timestamp,
    reading: Reading,
    typical_pod_bytes: Option<u64>,
) -> NodeGpuReportStatus {
    let summary = summarize(&reading.gpus, typical_pod_bytes);
    NodeGpuReportStatus {
        observed_at: observed_at.to_string(),
        nvml: reading.nvml,
        gpus: reading.gpus,
        summary,
        agent_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        pod_peaks: Vec::new(),
        pod_resources: None,
    }
}

/// Totals over schedulable devices (whole GPUs and MIG instances, never a MIG parent, whose
/// memory its instances already count).
///
/// `stranded_bytes` is the free memory on devices whose free memory is smaller than a typical pod
/// of this node: memory no usual pod can use, the node's fragmentation. Without a typical size
/// (no pod seen yet) nothing is called stranded.
pub fn summarize(gpus: &[GpuDevice], typical_pod_bytes: Option<u64>) -> NodeMemorySummary {
    let schedulable = || gpus.iter().filter(|g| g.is_schedulable());
    NodeMemorySummary {
        total_bytes: schedulable().map(|g| g.memory_total_bytes).sum(),
        free_bytes: schedulable().map(|g| g.memory_free_bytes).sum(),
        largest_free_block_bytes: schedulable()
            .map(|g| g.memory_free_bytes)
            .max()
            .unwrap_or(0),
        stranded_bytes: typical_pod_bytes.map_or(0, |typical| {
            schedulable()
                .map(|g| g.memory_free_bytes)
                .filter(|&free| free < typical)
                .sum()
        }),
    }
}

/// Each pod's summed use of `gpu` (processes tied to no pod are left out).
fn per_pod(gpu: &GpuDevice) -> BTreeMap<&str, u64> {
    let mut per_pod: BTreeMap<&str, u64> = BTreeMap::new();
    for p in &gpu.processes {
        if let (Some(uid), Some(bytes)) = (&p.pod_uid, p.used_bytes) {
            let b = per_pod.entry(uid).or_default();
            *b = b.saturating_add(bytes);
        }
    }
    per_pod
}

/// What a typical pod of this node uses per GPU: the median, over the most recent (pod, device)
/// pairs seen on the node, of the most memory that pod's processes used on that device.
///
/// Bounded to `capacity` pairs (oldest forgotten first) so the agent's memory stays flat and the
/// figure follows the node's current workload.
#[derive(Debug)]
pub struct PodUsageHistory {
    /// Per (pod UID, GPU UUID): the highest use seen and when.
    peaks: BTreeMap<(String, String), (u64, jiff::Timestamp)>,
    order: VecDeque<(String, String)>,
    capacity: usize,
}

impl Default for PodUsageHistory {
    fn default() -> Self {
        Self::with_capacity(256)
    }
}

impl PodUsageHistory {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            peaks: BTreeMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records the per-pod use on each device of a reading taken at `at`.
    pub fn observe(&mut self, gpus: &[GpuDevice], at: jiff::Timestamp) {
        for gpu in gpus {
            for (uid, bytes) in per_pod(gpu) {
                let key = (uid.to_string(), gpu.uuid.clone());
                match self.peaks.get_mut(&key) {
                    Some(peak) => {
                        if bytes > peak.0 {
                            *peak = (bytes, at);
                        }
                    }
                    None => {
                        if self.order.len() == self.capacity
                            && let Some(old) = self.order.pop_front()
                        {
                            self.peaks.remove(&old);
                        }
                        self.order.push_back(key.clone());
                        self.peaks.insert(key, (bytes, at));
                    }
                }
            }
        }
    }

    /// The peaks of the (pod, GPU) pairs `gpus` shows running now, at most
    /// [`crate::inventory::MAX_POD_PEAKS`]: what the report publishes, so the extender counts
    /// each pod at no less than the most it has used (a spike between two writes included).
    pub fn running_peaks(&self, gpus: &[GpuDevice]) -> Vec<crate::inventory::PodPeak> {
        let mut out = Vec::new();
        for gpu in gpus {
            for (uid, _) in per_pod(gpu) {
                if out.len() == crate::inventory::MAX_POD_PEAKS {
                    return out;
                }
                if let Some((bytes, at)) = self.peaks.get(&(uid.to_owned(), gpu.uuid.clone())) {
                    out.push(crate::inventory::PodPeak {
                        pod_uid: uid.to_owned(),
                        gpu_uuid: gpu.uuid.clone(),
                        peak_bytes: *bytes,
                        at: at.to_string(),
                    });
                }
            }
        }
        out
    }

    /// The median peak (the lower middle one for an even count); `None` before any pod was seen.
    pub fn typical(&self) -> Option<u64> {
        let mut v: Vec<u64> = self.peaks.values().map(|p| p.0).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        Some(v[(v.len() - 1) / 2])
    }
}

/// Whether `next` differs from `prev` in a way the extender would care about.
pub fn significant_change(prev: &NodeGpuReportStatus, next: &NodeGpuReportStatus) -> bool {
    if prev.nvml != next.nvml
        || prev.pod_resources != next.pod_resources
        || prev.gpus.len() != next.gpus.len()
    {
        return true;
    }
    prev.gpus.iter().zip(&next.gpus).any(|(a, b)| {
        let threshold = (b.memory_total_bytes / 100).max(MIN_CHANGE_BYTES);
        a.uuid != b.uuid
            || a.memory_total_bytes != b.memory_total_bytes
            || a.mig_enabled != b.mig_enabled
            || a.degraded != b.degraded
            // A device handed to a pod (or freed) changes where peakfit may place at once.
            || a.held_by != b.held_by
            || a.memory_used_bytes.abs_diff(b.memory_used_bytes) > threshold
            || a.memory_reserved_bytes.abs_diff(b.memory_reserved_bytes) > threshold
            || process_keys(a) != process_keys(b)
            || pod_bytes(a)
                .iter()
                .zip(pod_bytes(b).iter())
                .any(|(x, y)| x.1.abs_diff(*y.1) > threshold)
    })
}

fn process_keys(g: &GpuDevice) -> BTreeSet<(u32, Option<&str>)> {
    g.processes
        .iter()
        .map(|p| (p.pid, p.pod_uid.as_deref()))
        .collect()
}

/// Memory per pod on a device (processes of no pod under `None`), in pod order.
fn pod_bytes(g: &GpuDevice) -> BTreeMap<Option<&str>, u64> {
    let mut m = BTreeMap::new();
    for p in &g.processes {
        *m.entry(p.pod_uid.as_deref()).or_default() += p.used_bytes.unwrap_or(0);
    }
    m
}

/// Remembers the last status written and when, to decide whether the next one goes out.
#[derive(Debug)]
pub struct PublishGate {
    heartbeat: Duration,
    last: Option<(NodeGpuReportStatus, Instant)>,
}

impl PublishGate {
    pub fn new(heartbeat: Duration) -> Self {
        Self {
            heartbeat,
            last: None,
        }
    }

    /// True for the first status, after a significant change, or when the heartbeat is due.
    pub fn due(&self, next: &NodeGpuReportStatus, now: Instant) -> bool {
        match &self.last {
            None => true,
            Some((prev, at)) => {
                now.duration_since(*at) >= self.heartbeat || significant_change(prev, next)
            }
        }
    }

    /// Records a successful write; a failed one is not recorded, so the next poll retries.
    pub fn published(&mut self, status: NodeGpuReportStatus, now: Instant) {
        self.last = Some((status, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuProcess, NvmlStatus};

    const GIB: u64 = 1 << 30;

    fn gpu(uuid: &str, total: u64, used: u64) -> GpuDevice {
        GpuDevice {
            uuid: uuid.into(),
            memory_total_bytes: total,
            memory_used_bytes: used,
            memory_free_bytes: total - used,
            ..GpuDevice::default()
        }
    }

    fn proc(pid: u32, pod: Option<&str>, bytes: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_bytes: Some(bytes),
            pod_uid: pod.map(str::to_string),
            container_id: None,
        }
    }

    fn status(gpus: Vec<GpuDevice>) -> NodeGpuReportStatus {
        build(
            jiff::Timestamp::UNIX_EPOCH,
            Reading {
                nvml: NvmlStatus {
                    up: true,
                    ..NvmlStatus::default()
                },
                gpus,
                ..Reading::default()
            },
            None,
        )
    }

    #[test]
    fn summary_skips_mig_parents_and_counts_stranded_memory() {
        let mut parent = gpu("GPU-a", 80 * GIB, 0);
        parent.mig_enabled = true;
        let gpus = vec![
            parent,
            gpu("MIG-1", 40 * GIB, 30 * GIB), // 10 GiB free: stranded for a 20 GiB pod
            gpu("MIG-2", 40 * GIB, 5 * GIB),  // 35 GiB free
            gpu("GPU-b", 80 * GIB, 66 * GIB), // 14 GiB free: stranded
        ];
        let s = summarize(&gpus, Some(20 * GIB));
        assert_eq!(s.total_bytes, 160 * GIB);
        assert_eq!(s.free_bytes, 59 * GIB);
        assert_eq!(s.largest_free_block_bytes, 35 * GIB);
        assert_eq!(s.stranded_bytes, 24 * GIB);
        assert_eq!(summarize(&gpus, None).stranded_bytes, 0);
        assert_eq!(summarize(&[], Some(GIB)), NodeMemorySummary::default());
    }

    #[test]
    fn typical_pod_is_the_median_peak_per_pod_and_gpu() {
        let mut h = PodUsageHistory::with_capacity(3);
        assert_eq!(h.typical(), None);
        let mut g = gpu("GPU-a", 80 * GIB, 0);
        g.processes = vec![
            proc(1, Some("pod-a"), 4 * GIB),
            proc(2, Some("pod-a"), 2 * GIB), // same pod: 6 GiB together
            proc(3, Some("pod-b"), 10 * GIB),
            proc(4, None, 50 * GIB), // no pod: not a pod's size
        ];
        h.observe(std::slice::from_ref(&g), jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(h.typical(), Some(6 * GIB));
        // pod-a grows: its peak is kept, not its latest value.
        g.processes = vec![proc(1, Some("pod-a"), 12 * GIB)];
        h.observe(std::slice::from_ref(&g), jiff::Timestamp::UNIX_EPOCH);
        g.processes = vec![proc(1, Some("pod-a"), GIB)];
        h.observe(std::slice::from_ref(&g), jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(h.typical(), Some(10 * GIB));
        // Capacity 3: a fourth and fifth pair push out the oldest (pod-a, then pod-b).
        g.processes = vec![proc(5, Some("pod-c"), GIB), proc(6, Some("pod-d"), GIB)];
        h.observe(std::slice::from_ref(&g), jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(h.peaks.len(), 3);
        assert_eq!(h.typical(), Some(GIB));
    }

    /// Issue 21: a spike between two report writes was lost (the report carried only the use
    /// at its poll). Each running pod's highest use per GPU is published, with when.
    #[test]
    fn running_pods_peaks_are_published_with_when_and_gone_pods_are_not() {
        let mut h = PodUsageHistory::with_capacity(8);
        let t = |s: i64| jiff::Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut g = gpu("GPU-a", 80 * GIB, 0);
        g.processes = vec![proc(1, Some("pod-a"), 4 * GIB), proc(2, Some("pod-b"), GIB)];
        h.observe(std::slice::from_ref(&g), t(0));
        g.processes = vec![
            proc(1, Some("pod-a"), 30 * GIB),
            proc(2, Some("pod-b"), GIB),
        ];
        h.observe(std::slice::from_ref(&g), t(5));
        // Back down, and pod-b gone.
        g.processes = vec![proc(1, Some("pod-a"), 6 * GIB)];
        h.observe(std::slice::from_ref(&g), t(10));
        let peaks = h.running_peaks(std::slice::from_ref(&g));
        assert_eq!(
            peaks,
            [crate::inventory::PodPeak {
                pod_uid: "pod-a".into(),
                gpu_uuid: "GPU-a".into(),
                peak_bytes: 30 * GIB,
                at: t(5).to_string(),
            }]
        );
    }

    #[test]
    fn small_changes_wait_for_the_heartbeat_and_big_ones_do_not() {
        let t0 = Instant::now();
        let base = status(vec![gpu("GPU-a", 80 * GIB, 10 * GIB)]);
        let mut gate = PublishGate::new(Duration::from_secs(30));
        assert!(gate.due(&base, t0), "first report always goes out");
        gate.published(base.clone(), t0);

        let within = |used| status(vec![gpu("GPU-a", 80 * GIB, used)]);
        let t1 = t0 + Duration::from_secs(5);
        // 1 % of 80 GiB is 819 MiB > 256 MiB, so 800 MiB is noise and 900 MiB is news.
        assert!(!gate.due(&within(10 * GIB + 800 * MIB), t1));
        assert!(gate.due(&within(10 * GIB + 900 * MIB), t1));
        assert!(gate.due(&within(10 * GIB), t0 + Duration::from_secs(30)));

        // On a small device the 256 MiB floor applies.
        let small = |used| status(vec![gpu("MIG-x", 5 * GIB, used)]);
        let mut gate = PublishGate::new(Duration::from_secs(30));
        gate.published(small(GIB), t0);
        assert!(!gate.due(&small(GIB + 200 * MIB), t1));
        assert!(gate.due(&small(GIB + 300 * MIB), t1));
    }

    #[test]
    fn processes_pods_and_nvml_state_are_always_news() {
        let mut g = gpu("GPU-a", 80 * GIB, 10 * GIB);
        g.processes = vec![proc(1, Some("pod-a"), GIB)];
        let prev = status(vec![g.clone()]);

        let mut next = g.clone();
        next.processes.push(proc(2, None, 0));
        assert!(significant_change(&prev, &status(vec![next])));

        let mut moved = g.clone();
        moved.processes[0].pod_uid = Some("pod-b".into());
        assert!(significant_change(&prev, &status(vec![moved])));

        let mut down = status(vec![]);
        down.nvml.up = false;
        assert!(significant_change(&prev, &down));

        let mut grown = g.clone();
        grown.processes[0].used_bytes = Some(3 * GIB);
        assert!(significant_change(&prev, &status(vec![grown])));

        let mut same = status(vec![g.clone()]);
        same.observed_at = "2030-01-01T00:00:00Z".into();
        assert!(!significant_change(&prev, &same), "time alone is no change");
    }

    /// Issue 23: a device the kubelet hands to a pod (or takes back) must reach the extender at
    /// once, not at the next heartbeat, and so must the kubelet's socket going away.
    #[test]
    fn holders_and_the_kubelets_socket_are_news() {
        use crate::inventory::{DeviceHolder, HolderKind, PodResourcesStatus};
        let g = gpu("GPU-a", 80 * GIB, 10 * GIB);
        let mut prev = status(vec![g.clone()]);
        prev.pod_resources = Some(PodResourcesStatus {
            up: true,
            reason: None,
        });

        let mut held = prev.clone();
        held.gpus[0].held_by = vec![DeviceHolder {
            namespace: "ml".into(),
            pod_name: "trainer-0".into(),
            container: "main".into(),
            kind: HolderKind::DevicePlugin,
            resource: "nvidia.com/gpu".into(),
            claim: None,
        }];
        assert!(significant_change(&prev, &held));
        assert!(significant_change(&held, &prev), "freed is news too");

        let mut other = held.clone();
        other.gpus[0].held_by[0].pod_name = "trainer-1".into();
        assert!(significant_change(&held, &other));

        let mut down = prev.clone();
        down.pod_resources = Some(PodResourcesStatus {
            up: false,
            reason: Some("timeout".into()),
        });
        assert!(significant_change(&prev, &down));
        assert!(!significant_change(&held, &held.clone()));
    }
}
