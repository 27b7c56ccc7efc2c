//! What the index keeps of a `NodeGpuReport`: its schedulable GPUs, with implausible ones and
//! duplicates refused, and GPU model names interned so that every node's GPUs of one model share
//! one string.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Index;
use crate::cluster::NodeGpuReport;

/// The parts of a `NodeGpuReport` the ledger needs, per schedulable device.
#[derive(Clone, Debug, Default)]
pub(super) struct ReportView {
    pub(super) observed_at_unix: Option<i64>,
    pub(super) nvml_down: Option<String>,
    /// The agent's reason when it reads the kubelet's `PodResources` API and that read fails;
    /// `None` when it reads it, or does not try (`--pod-resources-socket ""`).
    pub(super) pod_resources_down: Option<String>,
    pub(super) gpus: Vec<ReportGpu>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct ReportGpu {
    pub(super) uuid: String,
    /// One string for all GPUs of a model in the index (`Index::models`).
    pub(super) model: Arc<str>,
    pub(super) total: u64,
    pub(super) used: u64,
    pub(super) driver_reserved: u64,
    /// Memory of processes the agent tied to a pod UID.
    pub(super) by_pod: Vec<(String, u64)>,
    /// The most each running pod has used of this GPU (the report's `podPeaks`), at most the
    /// GPU's total: the pod is counted at no less.
    pub(super) peak_by_pod: Vec<(String, u64)>,
    /// NVML index, for the words about holders.
    pub(super) index: u32,
    /// Who the kubelet gave this device to (`heldBy`), at most [`MAX_HOLDERS`]; which of them
    /// are peakfit's own pods is decided in `rebuild`, which knows the pods.
    pub(super) holders: Vec<crate::inventory::DeviceHolder>,
}

/// The most holders kept per device: a device plugin gives a GPU to one container (time-slicing
/// replicas to a few); more is a broken report, and a few names say enough.
pub(super) const MAX_HOLDERS: usize = 8;

impl ReportView {
    /// `models`: the index's model names, so that the GPUs of one model share one string.
    fn from_report(r: &NodeGpuReport, models: &mut Vec<Arc<str>>) -> Self {
        let Some(status) = &r.status else {
            return Self {
                observed_at_unix: None,
                nvml_down: Some("the agent has not published a status yet".into()),
                pod_resources_down: None,
                gpus: Vec::new(),
            };
        };
        let observed_at_unix = status
            .observed_at
            .parse::<jiff::Timestamp>()
            .ok()
            .map(jiff::Timestamp::as_second);
        let nvml_down = (!status.nvml.up).then(|| {
            status
                .nvml
                .reason
                .clone()
                .unwrap_or_else(|| "no reason given".into())
        });
        let pod_resources_down = status
            .pod_resources
            .as_ref()
            .filter(|p| !p.up)
            .map(|p| p.reason.clone().unwrap_or_else(|| "no reason given".into()));
        let mut uuids = std::collections::HashSet::new();
        let gpus = status
            .gpus
            .iter()
            .filter(|g| g.is_schedulable())
            // Two entries for one GPU would let the node offer its memory twice: the first
            // stands, the rest are dropped (and warned about by `apply_report`).
            .filter(|g| uuids.insert(g.uuid.as_str()))
            .map(|g| {
                let mut by_pod: Vec<(String, u64)> = Vec::new();
                for p in &g.processes {
                    if let (Some(uid), Some(bytes)) = (&p.pod_uid, p.used_bytes) {
                        match by_pod.iter_mut().find(|(u, _)| u == uid) {
                            Some((_, b)) => *b = b.saturating_add(bytes),
                            None => by_pod.push((uid.clone(), bytes)),
                        }
                    }
                }
                ReportGpu {
                    uuid: g.uuid.clone(),
                    model: models
                        .iter()
                        .find(|m| ***m == *g.name)
                        .cloned()
                        .unwrap_or_else(|| {
                            let m: Arc<str> = g.name.as_str().into();
                            if models.len() < MAX_SHARED_MODELS {
                                models.push(m.clone());
                            }
                            m
                        }),
                    total: g.memory_total_bytes,
                    // Never more than the GPU has: a report is believed only within itself.
                    used: g.memory_used_bytes.min(g.memory_total_bytes),
                    driver_reserved: g.memory_reserved_bytes.min(g.memory_total_bytes),
                    // Bounded before it is searched: a report longer than the agent writes is
                    // read no further than the agent's bound.
                    peak_by_pod: status
                        .pod_peaks
                        .iter()
                        .take(crate::inventory::MAX_POD_PEAKS)
                        .filter(|p| p.gpu_uuid == g.uuid)
                        .map(|p| (p.pod_uid.clone(), p.peak_bytes.min(g.memory_total_bytes)))
                        .collect(),
                    by_pod,
                    index: g.index,
                    holders: g.held_by.iter().take(MAX_HOLDERS).cloned().collect(),
                }
            })
            .collect();
        Self {
            observed_at_unix,
            nvml_down,
            pod_resources_down,
            gpus,
        }
    }
}

/// Model names shared (`Index::models`); a report naming more distinct models (a broken agent)
/// gets its own strings, so the list stays small.
const MAX_SHARED_MODELS: usize = 256;

/// The most memory one GPU (or MIG instance) is believed to have: 1 TiB. The largest GPUs sold
/// have 288 GB (B300); an NVML total of 2^64-1 was published and then a 1 EiB pod accepted
/// (issue 24).
pub const MAX_GPU_BYTES: u64 = 1 << 40;

/// Why a reported GPU is not offered: each a warning and a count of
/// `peakfit_index_warnings_total{reason}`.
fn implausible(
    g: &crate::inventory::GpuDevice,
    parents: &HashMap<&str, u64>,
) -> Option<&'static str> {
    if g.memory_total_bytes > MAX_GPU_BYTES {
        return Some("gpu_memory_implausible");
    }
    match g.mig_parent_uuid.as_deref().map(|p| parents.get(p)) {
        Some(Some(&parent)) if g.memory_total_bytes > parent => Some("mig_instance_outside_parent"),
        _ => None,
    }
}

impl Index {
    pub fn apply_report(&self, report: &NodeGpuReport) {
        let name = match report.metadata.name.as_deref() {
            Some(n) if !n.is_empty() => n,
            _ => report.spec.node_name.as_str(),
        };
        if name.is_empty() {
            return;
        }
        let refused = self.refused_gpus(name, report);
        let mut view = ReportView::from_report(report, &mut self.models.lock());
        view.gpus.retain(|g| !refused.contains(&g.uuid));
        let listed = report.status.as_ref().map_or(0, |s| {
            s.gpus
                .iter()
                .filter(|g| g.is_schedulable() && !refused.contains(&g.uuid))
                .count()
        });
        if listed > view.gpus.len() {
            tracing::warn!(
                node = %name, duplicates = listed - view.gpus.len(),
                "the GPU report lists a GPU UUID more than once; only its first entry is used"
            );
            self.warn_metric("duplicate_gpu_uuid");
        }
        let slot = self.slot(name);
        let pods = self.pods.read();
        let mut st = slot.state.write();
        st.report = Some(view);
        self.rebuild(&mut st, &pods.by_key);
    }

    /// The report's GPUs not to offer, each warned about and counted: a total above
    /// [`MAX_GPU_BYTES`], or a MIG instance larger than its parent (or past what the parent's
    /// other instances leave). A UUID another node's report already holds is warned about and
    /// counted too, but still offered: which of the two nodes really has the GPU cannot be told
    /// from the reports, and refusing the later one would let any writer of a report take a
    /// real node's GPU away. Books the UUIDs to `node`, and frees those it no longer reports.
    fn refused_gpus(&self, node: &str, report: &NodeGpuReport) -> HashSet<String> {
        let mut refused = HashSet::new();
        let Some(status) = &report.status else {
            self.gpu_owners.lock().retain(|_, n| n != node);
            return refused;
        };
        let parents: HashMap<&str, u64> = status
            .gpus
            .iter()
            .filter(|g| g.mig_enabled)
            .map(|g| (g.uuid.as_str(), g.memory_total_bytes))
            .collect();
        let mut left = parents.clone();
        let mut owners = self.gpu_owners.lock();
        owners.retain(|uuid, n| n != node || status.gpus.iter().any(|g| &g.uuid == uuid));
        for g in &status.gpus {
            let mut why = implausible(g, &parents);
            if why.is_none()
                && let Some(room) = g.mig_parent_uuid.as_deref().and_then(|p| left.get_mut(p))
            {
                match room.checked_sub(g.memory_total_bytes) {
                    Some(rest) => *room = rest,
                    None => why = Some("mig_instance_outside_parent"),
                }
            }
            if why.is_none() {
                match owners.get(&g.uuid) {
                    Some(other) if other != node => {
                        tracing::warn!(
                            node = %crate::clip::clip(node), uuid = %crate::clip::clip(&g.uuid),
                            other = %crate::clip::clip(other),
                            "two nodes report one GPU UUID; both offer it"
                        );
                        self.warn_metric("gpu_uuid_on_two_nodes");
                    }
                    Some(_) => {}
                    None => {
                        owners.insert(g.uuid.clone(), node.to_owned());
                    }
                }
            }
            if let Some(reason) = why {
                tracing::warn!(
                    node = %crate::clip::clip(node), uuid = %crate::clip::clip(&g.uuid),
                    total_bytes = g.memory_total_bytes, reason, "a reported GPU is not offered"
                );
                self.warn_metric(reason);
                refused.insert(g.uuid.clone());
            }
        }
        refused
    }

    pub fn delete_report(&self, name: &str) {
        self.gpu_owners.lock().retain(|_, n| n != name);
        let Some(slot) = self.node(name) else { return };
        let pods = self.pods.read();
        let mut st = slot.state.write();
        st.report = None;
        self.rebuild(&mut st, &pods.by_key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::{GIB, ledger, mk_node_allocatable, mk_report, warnings};
    use crate::inventory::PodResourcesStatus;
    use crate::placement::NodeCondition;

    /// Issue 23: while the agent cannot read the kubelet's `PodResources` API, a GPU the device
    /// plugin hands out looks free; a node is refused only where a device plugin advertises a
    /// GPU (`--gpu-resources`, non-zero), and a report that does not read the API is trusted.
    #[test]
    fn pod_resources_down_refuses_only_nodes_a_device_plugin_hands_gpus_out_on() {
        let node = mk_node_allocatable;
        let report = |name: &str, pod_resources: Option<PodResourcesStatus>| {
            let mut r = mk_report(name, &[("GPU-a", 80 * GIB, 0, &[])]);
            r.status.as_mut().unwrap().pod_resources = pod_resources;
            r
        };
        let down = || {
            Some(PodResourcesStatus {
                up: false,
                reason: Some("connection refused".into()),
            })
        };
        let index = Index::new();
        let cases = [
            (
                "down, device plugin advertises a GPU",
                node("n1", &[("cpu", "8"), ("nvidia.com/gpu", "4")]),
                down(),
                NodeCondition::PodResourcesDown {
                    reason: "connection refused".into(),
                    by: crate::placement::Allocators {
                        device_plugin: Some("nvidia.com/gpu".into()),
                        dra_driver: None,
                    },
                },
            ),
            (
                "down, a MIG resource by prefix",
                node("n2", &[("nvidia.com/mig-1g.10gb", "7")]),
                down(),
                NodeCondition::PodResourcesDown {
                    reason: "connection refused".into(),
                    by: crate::placement::Allocators {
                        device_plugin: Some("nvidia.com/mig-1g.10gb".into()),
                        dra_driver: None,
                    },
                },
            ),
            (
                "down, dedicated node: no GPU resource",
                node("n3", &[("cpu", "8")]),
                down(),
                NodeCondition::Ready,
            ),
            (
                "down, the resource advertised at zero",
                node("n4", &[("nvidia.com/gpu", "0")]),
                down(),
                NodeCondition::Ready,
            ),
            (
                "not read by the agent",
                node("n5", &[("nvidia.com/gpu", "4")]),
                None,
                NodeCondition::Ready,
            ),
            (
                "up",
                node("n6", &[("nvidia.com/gpu", "4")]),
                Some(PodResourcesStatus {
                    up: true,
                    reason: None,
                }),
                NodeCondition::Ready,
            ),
        ];
        for (what, n, pod_resources, want) in cases {
            let name = n.metadata.name.clone().unwrap();
            index.apply_node(&n);
            index.apply_report(&report(&name, pod_resources));
            assert_eq!(ledger(&index, &name).condition, want, "{what}");
        }

        // Either order: the Node arriving after the report, or its allocatable changing, rebuilds.
        let late = Index::new();
        late.apply_report(&report("n", down()));
        assert_eq!(ledger(&late, "n").condition, NodeCondition::Ready);
        late.apply_node(&node("n", &[("nvidia.com/gpu", "1")]));
        assert!(matches!(
            ledger(&late, "n").condition,
            NodeCondition::PodResourcesDown { .. }
        ));
        late.apply_node(&node("n", &[("nvidia.com/gpu", "0")]));
        assert_eq!(ledger(&late, "n").condition, NodeCondition::Ready);

        // `--gpu-resources` decides what is a GPU.
        let custom = Index::new().with_gpu_resources(
            crate::gpu_resources::GpuResources::new(&["example.com/gpu".into()], &[]).unwrap(),
        );
        custom.apply_node(&node(
            "n",
            &[("nvidia.com/gpu", "4"), ("example.com/gpu", "2")],
        ));
        custom.apply_report(&report("n", down()));
        assert!(matches!(
            ledger(&custom, "n").condition,
            NodeCondition::PodResourcesDown { by, .. }
                if by.device_plugin.as_deref() == Some("example.com/gpu")
        ));
    }

    #[test]
    fn a_report_listing_a_gpu_twice_offers_it_once() {
        let index = Index::new();
        index.apply_report(&mk_report(
            "n1",
            &[
                ("GPU-a", 80 * GIB, 0, &[]),
                ("GPU-a", 80 * GIB, 0, &[]),
                ("GPU-b", 80 * GIB, 0, &[]),
            ],
        ));
        let uuids: Vec<String> = ledger(&index, "n1")
            .gpus
            .into_iter()
            .map(|g| g.uuid)
            .collect();
        assert_eq!(uuids, ["GPU-a", "GPU-b"]);
        assert_eq!(warnings(&index, "duplicate_gpu_uuid"), 1);
    }

    /// Issue 24: an NVML total of 2^64-1 was published and a 1 EiB pod then accepted; MIG
    /// instances larger than their parent were offered; one GPU UUID on two nodes was booked
    /// twice without a word. The first two are not offered now; all three are warned about and
    /// counted.
    #[test]
    fn implausible_and_duplicated_gpus_are_not_offered() {
        let index = Index::new();
        index.apply_report(&mk_report(
            "n1",
            &[("GPU-huge", u64::MAX, 0, &[]), ("GPU-ok", 80 * GIB, 0, &[])],
        ));
        let uuids = |node: &str| -> Vec<String> {
            ledger(&index, node)
                .gpus
                .iter()
                .map(|g| g.uuid.clone())
                .collect()
        };
        assert_eq!(uuids("n1"), ["GPU-ok"]);
        assert_eq!(warnings(&index, "gpu_memory_implausible"), 1);

        // The same UUID on a second node: warned and counted, once per report.
        let n2 = mk_report(
            "n2",
            &[("GPU-ok", 80 * GIB, 0, &[]), ("GPU-b", 80 * GIB, 0, &[])],
        );
        index.apply_report(&n2);
        assert_eq!(warnings(&index, "gpu_uuid_on_two_nodes"), 1);
        // Once n1 no longer reports it, it is n2's alone.
        index.delete_report("n1");
        index.apply_report(&n2);
        assert_eq!(warnings(&index, "gpu_uuid_on_two_nodes"), 1);
        assert_eq!(uuids("n2"), ["GPU-ok", "GPU-b"]);

        // MIG: a 40 GiB parent with instances of 20, 30 (past what is left) and 80 GiB.
        let mut r = mk_report(
            "n3",
            &[
                ("GPU-p", 40 * GIB, 0, &[]),
                ("MIG-1", 20 * GIB, 0, &[]),
                ("MIG-2", 30 * GIB, 0, &[]),
                ("MIG-3", 80 * GIB, 0, &[]),
            ],
        );
        let gpus = &mut r.status.as_mut().unwrap().gpus;
        gpus[0].mig_enabled = true;
        for g in &mut gpus[1..] {
            g.mig_parent_uuid = Some("GPU-p".into());
        }
        index.apply_report(&r);
        assert_eq!(uuids("n3"), ["MIG-1"]);
        assert_eq!(warnings(&index, "mig_instance_outside_parent"), 2);
    }
}
