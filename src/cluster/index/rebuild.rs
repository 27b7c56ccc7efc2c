//! A node's ledger, rebuilt from its report and its pods whenever either changes.

use std::collections::{BTreeSet, HashMap};

use super::slot::NodeState;
use super::{Assignment, Index, PodEntry};
use crate::placement::{GpuLedger, NodeCondition, NodeLedger, PodKey, ScoreInputs};

impl Index {
    /// Rebuilds one node's ledger from its report and its pods: O(pods on the node × GPUs).
    pub(super) fn rebuild(&self, st: &mut NodeState, pods: &HashMap<PodKey, Box<PodEntry>>) {
        let name = st.ledger.name.clone();
        let mut ledger = NodeLedger::new(name.clone());
        ledger.cpu_capacity_milli = st.allocatable.0;
        ledger.memory_capacity_bytes = st.allocatable.1;
        for key in &st.pods {
            if let Some(pod) = pods.get(key) {
                ledger.reserve_host(key, pod.host.cpu_milli, pod.host.memory_bytes);
            }
        }
        if let Some(report) = &st.report {
            ledger.observed_at_unix = report.observed_at_unix;
            ledger.condition = match &report.nvml_down {
                Some(reason) => NodeCondition::NvmlDown {
                    reason: reason.clone(),
                },
                None => NodeCondition::Ready,
            };
            ledger.gpus = report
                .gpus
                .iter()
                .map(|g| GpuLedger::new(g.uuid.clone(), g.total).with_model(g.model.clone()))
                .collect();
            let mut unreported = BTreeSet::new();
            for key in &st.pods {
                let Some(pod) = pods.get(key) else { continue };
                let Some(a) = &pod.assignment else { continue };
                let mut missing = 0;
                for uuid in &a.gpu_uuids {
                    match ledger.gpus.iter().position(|g| &g.uuid == uuid) {
                        Some(i) => reserve_for(&mut ledger.gpus[i], key, pod, a),
                        None => missing += 1,
                    }
                }
                // The pod runs here on GPUs the report does not list (a GPU fell out of the
                // report, or the annotation was edited): its memory is still in use, so charge it
                // to the node's largest GPUs it does not hold already, rather than call the node
                // emptier than it is. Refusing the whole node instead would let one bad pod
                // block every other pod there.
                for _ in 0..missing {
                    let spare = ledger
                        .gpus
                        .iter()
                        .enumerate()
                        .filter(|(_, g)| g.reservation(key).is_none())
                        .max_by_key(|(_, g)| (g.total_bytes, g.free_bytes()))
                        .map(|(i, _)| i);
                    if let Some(i) = spare {
                        reserve_for(&mut ledger.gpus[i], key, pod, a);
                    }
                }
                if missing > 0 {
                    unreported.insert(key.clone());
                    if !st.unreported_assignments.contains(key) {
                        tracing::warn!(
                            node = %name, pod = %pod.name, namespace = %pod.namespace, missing,
                            assigned = %crate::clip::clip(&a.gpu_uuids.join(",")),
                            "the pod's assigned GPUs are not in the node's report; charged to the node's largest GPUs"
                        );
                        self.warn_metric("assigned_gpu_not_reported");
                    }
                }
            }
            st.unreported_assignments = unreported;
            // Placement's rule: use by pods with a reservation on the device is theirs,
            // everything else the device uses is unattributed.
            for (gpu, seen) in ledger.gpus.iter_mut().zip(&report.gpus) {
                let by_pods: u64 = seen.by_pod.iter().map(|(_, b)| *b).sum();
                gpu.observe(
                    seen.total,
                    seen.driver_reserved,
                    seen.by_pod.iter().map(|(u, b)| (u.as_str(), *b)),
                    seen.used.saturating_sub(by_pods),
                );
            }
        }
        if gpu_models_of(&st.ledger) != gpu_models_of(&ledger) {
            let mut cap = self.gpu_capacity.lock();
            for g in &st.ledger.gpus {
                if let Some(n) = cap.1.get_mut(&*g.model) {
                    *n = n.saturating_sub(1);
                }
            }
            for g in &ledger.gpus {
                *cap.1.entry(g.model.to_string()).or_default() += 1;
            }
            cap.1.retain(|_, n| *n > 0);
            cap.0 += 1;
        }
        st.scores = self.states.lock().of(ScoreInputs::of(&ledger));
        st.ledger = ledger;
        if let Some(changed) = self.changed.lock().as_mut() {
            changed.insert(name);
        }
    }
}

/// `peakfit_node_fragmentation_ratio`: the share of a node's free GPU memory that lies outside
/// its largest free GPU (0 when all free memory is in one place, towards 1 when it is scattered
/// in slivers). Unlike placement's mix-weighted fragmentation it needs no pod mix, so it can be
/// written whenever the node changes.
pub fn free_outside_largest_gpu_ratio(ledger: &NodeLedger) -> f64 {
    let (sum, max) = ledger
        .gpus
        .iter()
        .map(GpuLedger::free_bytes)
        .fold((0u64, 0u64), |(s, m), f| (s + f, m.max(f)));
    if sum == 0 {
        0.0
    } else {
        1.0 - max as f64 / sum as f64
    }
}

/// A reservation of `pod` on `gpu`: its recorded `reserved-bytes`, or what its request needs on
/// a GPU of that size.
fn reserve_for(gpu: &mut GpuLedger, key: &str, pod: &PodEntry, a: &Assignment) {
    let predicted = a.reserved_bytes.unwrap_or_else(|| match &pod.request {
        Ok(Some(r)) => r.demand.bytes_on(gpu.total_bytes),
        _ => 0,
    });
    gpu.reserve(key, predicted);
}

/// A ledger's GPU models, sorted: the capacity per model changes only when these do.
fn gpu_models_of(l: &NodeLedger) -> Vec<&str> {
    let mut m: Vec<&str> = l.gpus.iter().map(|g| &*g.model).collect();
    m.sort_unstable();
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::index::{ASSIGNED_GPUS, RESERVED_BYTES};
    use crate::cluster::test_support::{GIB, ledger, mk_node, mk_pod, mk_report, warnings};
    use std::collections::BTreeMap;

    #[test]
    fn assigned_gpus_missing_from_the_report_are_charged_to_the_largest_gpus() {
        let index = Index::new();
        index.apply_report(&mk_report(
            "n1",
            &[
                ("GPU-small", 24 * GIB, 0, &[]),
                ("GPU-big", 80 * GIB, 0, &[]),
                ("GPU-held", 80 * GIB, 0, &[]),
            ],
        ));
        let pod = mk_pod(
            "u1",
            Some("n1"),
            &[
                (ASSIGNED_GPUS, "GPU-held,GPU-gone"),
                (RESERVED_BYTES, &(30 * GIB).to_string()),
            ],
        );
        index.apply_pod(&pod);
        let l = ledger(&index, "n1");
        // GPU-held has its own share; GPU-gone's share lands on the largest other GPU.
        let free: Vec<u64> = l.gpus.iter().map(|g| g.free_bytes() / GIB).collect();
        assert_eq!(free, [24, 50, 50]);
        assert_eq!(warnings(&index, "assigned_gpu_not_reported"), 1);
        // Rebuilt by a new report: still charged, warned once.
        index.apply_report(&mk_report(
            "n1",
            &[
                ("GPU-small", 24 * GIB, 0, &[]),
                ("GPU-big", 80 * GIB, 0, &[]),
                ("GPU-held", 80 * GIB, 0, &[]),
            ],
        ));
        assert_eq!(ledger(&index, "n1").gpus[1].free_bytes(), 50 * GIB);
        assert_eq!(warnings(&index, "assigned_gpu_not_reported"), 1);
        index.delete_pod(&pod);
        assert!(
            ledger(&index, "n1")
                .gpus
                .iter()
                .all(|g| g.committed_bytes() == 0)
        );
    }

    #[test]
    fn without_reserved_bytes_the_request_decides() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 40 * GIB, 0, &[])]));
        index.apply_pod(&mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")],
        ));
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 30 * GIB);
    }

    #[test]
    fn observed_use_counts_when_larger_and_strangers_are_unattributed() {
        let index = Index::new();
        // 30 GiB used: 25 by our pod (predicted 10), 3 by an unknown pod, 2 by no pod.
        index.apply_report(&mk_report(
            "n1",
            &[(
                "GPU-a",
                80 * GIB,
                30 * GIB,
                &[("u1", 25 * GIB), ("stranger", 3 * GIB), ("", 2 * GIB)],
            )],
        ));
        index.apply_pod(&mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")],
        ));
        let l = ledger(&index, "n1");
        let g = &l.gpus[0];
        assert_eq!(g.unattributed_bytes, 5 * GIB);
        assert_eq!(g.reservations()["u1"].observed_bytes, 25 * GIB);
        assert_eq!(g.free_bytes(), 50 * GIB);
    }

    #[test]
    fn unattributed_use_is_never_negative() {
        let index = Index::new();
        // The report's device total lags its processes (different NVML calls).
        index.apply_report(&mk_report(
            "n1",
            &[("GPU-a", 80 * GIB, GIB, &[("u1", 4 * GIB)])],
        ));
        index.apply_pod(&mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "2Gi"), (ASSIGNED_GPUS, "GPU-a")],
        ));
        assert_eq!(ledger(&index, "n1").gpus[0].unattributed_bytes, 0);
    }

    #[test]
    fn a_pod_bound_after_the_report_takes_its_use_out_of_unattributed() {
        let index = Index::new();
        index.apply_report(&mk_report(
            "n1",
            &[("GPU-a", 80 * GIB, 8 * GIB, &[("u1", 8 * GIB)])],
        ));
        assert_eq!(ledger(&index, "n1").gpus[0].unattributed_bytes, 8 * GIB);
        index.apply_pod(&mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "6Gi"), (ASSIGNED_GPUS, "GPU-a")],
        ));
        let l = ledger(&index, "n1");
        assert_eq!(l.gpus[0].unattributed_bytes, 0);
        // Charged at its use (8 GiB), larger than its prediction (6 GiB).
        assert_eq!(l.gpus[0].committed_bytes(), 8 * GIB);
    }

    #[test]
    fn node_allocatable_and_every_bound_pods_requests_fill_the_cpu_ledger() {
        use k8s_openapi::api::core::v1::{Container, NodeStatus, ResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let index = Index::new();
        let mut node = mk_node("n1");
        node.status = Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".into(), Quantity("16".into())),
                ("memory".into(), Quantity("64Gi".into())),
            ])),
            ..Default::default()
        });
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 << 30, 0, &[])]));
        index.apply_node(&node);
        let with_cpu = |uid: &str, cpu: &str, ann: &[(&str, &str)]| {
            let mut p = mk_pod(uid, Some("n1"), ann);
            p.spec.as_mut().unwrap().containers = vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".into(), Quantity(cpu.into())),
                        ("memory".into(), Quantity("1Gi".into())),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            }];
            p
        };
        // A GPU pod and a pod peakfit does not place: kube-scheduler counts both.
        index.apply_pod(&with_cpu("g", "4", &[("peakfit.io/vram", "20Gi")]));
        index.apply_pod(&with_cpu("plain", "1500m", &[]));
        let l = ledger(&index, "n1");
        assert_eq!(l.cpu_free_milli(), Some(16_000 - 5_500));
        assert_eq!(l.memory_free_bytes(), Some(62 << 30));
        assert_eq!(index.gpu_capacity().1.values().sum::<u64>(), 1);
        index.delete_pod_key("plain");
        assert_eq!(ledger(&index, "n1").cpu_free_milli(), Some(12_000));
    }
}
