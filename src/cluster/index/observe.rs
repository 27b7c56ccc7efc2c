//! What the agents saw of each running pod peakfit placed, joined with its workload: the input of
//! the profile writer (`cluster::profile::writer`).

use std::collections::HashMap;

use super::Index;
use crate::cluster::workload::WorkloadKey;

/// One running pod of a workload as the index sees it now.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub uid: String,
    pub name: String,
    /// Its request's per-GPU bytes (0 for a fraction engine, whose bytes depend on the GPU).
    pub predicted_bytes: u64,
    pub explicit: bool,
    pub gpus: u32,
    pub started_unix: i64,
    /// Its highest per-GPU peak so far (the agent's `podPeaks`).
    pub peak_bytes: u64,
}

impl Index {
    /// Every bound pod peakfit placed that its node's report has a peak for, by workload. One
    /// pass over the nodes, each under its read lock after the pod table's (the order every
    /// writer takes them in); no request waits on more than one node at a time.
    pub fn observations(&self) -> HashMap<WorkloadKey, Vec<Observed>> {
        let mut out: HashMap<WorkloadKey, Vec<Observed>> = HashMap::new();
        for slot in self.all_slots() {
            let pods = self.pods.read();
            let st = slot.state.read();
            let Some(report) = &st.report else {
                continue;
            };
            for key in &st.pods {
                let Some(entry) = pods.by_key.get(key) else {
                    continue;
                };
                let (Some(workload), Some(uid), Ok(Some(request))) =
                    (&entry.workload, entry.uid(), &entry.request)
                else {
                    continue;
                };
                // The highest per-GPU peak over the pod's GPUs on this node.
                let peak = report
                    .gpus
                    .iter()
                    .flat_map(|g| g.peak_by_pod.iter())
                    .filter(|(u, _)| u == uid)
                    .map(|&(_, b)| b)
                    .max();
                let Some(peak_bytes) = peak else {
                    continue;
                };
                out.entry((**workload).clone()).or_default().push(Observed {
                    uid: uid.to_owned(),
                    name: entry.name.clone(),
                    predicted_bytes: if request.demand.gpu_fraction > 0.0 {
                        0
                    } else {
                        request.demand.fixed_bytes
                    },
                    explicit: entry.explicit,
                    gpus: request.gpus.max(1),
                    started_unix: entry
                        .started_unix
                        .unwrap_or_else(|| report.observed_at_unix.unwrap_or_default()),
                    peak_bytes,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::index::{ASSIGNED_GPUS, Index};
    use crate::cluster::test_support::{GIB, mk_pod, mk_report};

    #[test]
    fn a_bound_pods_peak_is_seen_under_its_workload() {
        let index = Index::new();
        let mut report = mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]);
        report
            .status
            .as_mut()
            .unwrap()
            .pod_peaks
            .push(crate::inventory::PodPeak {
                pod_uid: "u1".into(),
                gpu_uuid: "GPU-a".into(),
                peak_bytes: 13 * GIB,
                at: "2027-01-15T08:00:00Z".into(),
            });
        index.apply_report(&report);
        let ann = [("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")];
        index.apply_pod(&mk_pod("u1", Some("n1"), &ann));
        // Bound, but no peak published yet; and a pod peakfit does not place.
        index.apply_pod(&mk_pod("u2", Some("n1"), &ann));
        index.apply_pod(&mk_pod("u3", Some("n1"), &[]));
        let seen = index.observations();
        assert_eq!(seen.len(), 1);
        let (key, pods) = seen.into_iter().next().unwrap();
        assert_eq!(key.kind, "Pod");
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].uid, "u1");
        assert_eq!(pods[0].peak_bytes, 13 * GIB);
        assert_eq!(pods[0].predicted_bytes, 10 * GIB);
        assert!(pods[0].explicit);
    }
}
