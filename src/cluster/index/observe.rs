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

/// Whether a peak of `peak` bytes filled a GPU of `usable` bytes (its size less the driver's
/// reserve): within [`FILLED_GPU_BYTES`] of it, what the caching allocator leaves when
/// `cudaMalloc` fails and it frees its cache.
fn filled_the_gpu(peak: u64, usable: u64) -> bool {
    peak.saturating_add(FILLED_GPU_BYTES) >= usable
}

/// How close to a GPU's usable memory a peak counts as having filled it: the CUDA context's
/// share of NVML's reading is inside the peak, and what a failed `cudaMalloc` leaves unmapped is
/// at most one 20 MiB large segment per stream; 1 GiB leaves room for both on any GPU.
const FILLED_GPU_BYTES: u64 = 1 << 30;

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
                // The highest per-GPU peak over the pod's GPUs on this node, and whether the
                // pod filled one of them.
                let mut peak: Option<u64> = None;
                let mut filled = false;
                for g in &report.gpus {
                    for &(_, b) in g.peak_by_pod.iter().filter(|(u, _)| u == uid) {
                        peak = peak.max(Some(b));
                        filled |= filled_the_gpu(b, g.total.saturating_sub(g.driver_reserved));
                    }
                }
                let Some(mut peak_bytes) = peak else {
                    continue;
                };
                // A PyTorch pod whose cache filled its GPU was stopped by the GPU, not by its
                // need: the reading is a lower bound of its cached peak, so it may raise the
                // pod's size but not lower it below the prediction (which would let its next
                // pod share a larger GPU its cache then fills).
                if filled && request.demand.fills_gpu {
                    peak_bytes = peak_bytes.max(request.demand.fixed_bytes);
                }
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

    /// Node `n1`'s report: one empty 80 GiB GPU, `GPU-a`, on which pod `u1` peaked at `peak`.
    fn report_with_peak(peak: u64) -> crate::cluster::NodeGpuReport {
        let mut report = mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]);
        report
            .status
            .as_mut()
            .unwrap()
            .pod_peaks
            .push(crate::inventory::PodPeak {
                pod_uid: "u1".into(),
                gpu_uuid: "GPU-a".into(),
                peak_bytes: peak,
                at: "2027-01-15T08:00:00Z".into(),
            });
        report
    }

    #[test]
    fn a_bound_pods_peak_is_seen_under_its_workload() {
        let index = Index::new();
        index.apply_report(&report_with_peak(13 * GIB));
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

    /// A PyTorch pod whose cache filled its GPU is seen at the GPU's size: that reading may not
    /// size its workload below the prediction; a reading below the GPU's size is what it is.
    #[test]
    fn a_pod_that_filled_its_gpu_is_seen_at_no_less_than_its_prediction() {
        let seen_at = |peak: u64| {
            let index = Index::new();
            index.apply_report(&report_with_peak(peak));
            // Qwen3-0.6B generating 64 x (1,024 + 1,024): its cache outgrows any GPU.
            let ann = [
                ("peakfit.io/model", "qwen3-0.6b"),
                ("peakfit.io/batch", "64"),
                ("peakfit.io/context-tokens", "2048"),
                ("peakfit.io/prompt-tokens", "1024"),
                (ASSIGNED_GPUS, "GPU-a"),
            ];
            index.apply_pod(&mk_pod("u1", Some("n1"), &ann));
            let pods = index.observations().into_values().next().unwrap();
            (pods[0].peak_bytes, pods[0].predicted_bytes)
        };
        let (filled, predicted) = seen_at(80 * GIB - GIB / 2);
        assert!(predicted > 141 * GIB, "{predicted}");
        assert_eq!(filled, predicted);
        assert_eq!(seen_at(40 * GIB).0, 40 * GIB);
    }
}
