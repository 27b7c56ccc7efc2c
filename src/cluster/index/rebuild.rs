//! A node's ledger, rebuilt from its report and its pods whenever either changes: the arithmetic
//! in [`ledger_of`], a pure function of plain data, and around it in `Index::rebuild` what the
//! index does with the result (warnings, the capacity per model, state interning, the changed
//! set).

use std::collections::HashMap;

use super::report_view::ReportView;
use super::slot::NodeState;
use super::{Assignment, HeldFor, Index, PodEntry};
use crate::inventory::DeviceHolder;
use crate::placement::{
    Allocators, GpuLedger, Grant, NodeCondition, NodeLedger, Placement, PodKey, ScoreInputs,
};

/// A node's ledger as [`ledger_of`] works it out, and the pods it had to charge elsewhere.
#[derive(Debug)]
pub(super) struct Rebuilt<'a> {
    pub ledger: NodeLedger,
    /// Pods with assigned GPUs the report does not list, and how many of those GPUs; their
    /// memory was charged to the node's largest GPUs instead.
    pub unreported: Vec<(&'a PodEntry, usize)>,
}

/// The ledger of node `name` from its allocatable (CPU millicores, memory bytes), what can hand
/// its GPUs out without peakfit (`by`: the first GPU resource its device plugin advertises, the
/// DRA GPU driver publishing devices there), its report and the pods bound to it, in the order
/// given: O(pods × GPUs). No locks, no side effects, so that what the ledger holds can be tested
/// row by row.
///
/// Every pod reserves its CPU and memory. With a report, a pod with an assignment reserves on
/// each assigned GPU its `reserved-bytes`, or else what its request needs on a GPU of that size;
/// each assigned GPU the report lacks is charged to the largest GPU the pod does not hold yet.
/// Then the report's use is applied: a pod's processes on a GPU it reserved are its own (charged
/// max(reserved, used)), and everything else the GPU uses is unattributed.
pub(super) fn ledger_of<'a>(
    name: &str,
    allocatable: (Option<u64>, Option<u64>),
    by: &Allocators,
    report: Option<&ReportView>,
    pods: impl Iterator<Item = &'a PodEntry> + Clone,
) -> Rebuilt<'a> {
    let mut ledger = NodeLedger::new(name);
    ledger.cpu_capacity_milli = allocatable.0;
    ledger.memory_capacity_bytes = allocatable.1;
    for pod in pods.clone() {
        ledger.reserve_host(&pod.key, pod.host.cpu_milli, pod.host.memory_bytes);
    }
    let mut unreported = Vec::new();
    let Some(report) = report else {
        return Rebuilt { ledger, unreported };
    };
    ledger.observed_at_unix = report.observed_at_unix;
    // Unread allocations matter only where a device plugin or a DRA driver can make them: on a
    // node neither hands GPUs out on, peakfit places every GPU pod and the report's GPUs are
    // the truth.
    ledger.condition = match (&report.nvml_down, &report.pod_resources_down) {
        (Some(reason), _) => NodeCondition::NvmlDown {
            reason: reason.clone(),
        },
        (None, Some(reason)) if by.any() => NodeCondition::PodResourcesDown {
            reason: reason.clone(),
            by: by.clone(),
        },
        _ => NodeCondition::Ready,
    };
    ledger.gpus = report
        .gpus
        .iter()
        .map(|g| GpuLedger::new(g.uuid.clone(), g.total).with_model(g.model.clone()))
        .collect();
    let pods_for_grants = pods.clone();
    for pod in pods {
        let Some(a) = &pod.assignment else { continue };
        let key = pod.key.as_str();
        let mut missing = 0;
        for uuid in &a.gpu_uuids {
            match ledger.gpus.iter().position(|g| &g.uuid == uuid) {
                Some(i) => reserve_for(&mut ledger.gpus[i], key, pod, a),
                None => missing += 1,
            }
        }
        // The pod runs here on GPUs the report does not list (a GPU fell out of the report, or
        // the annotation was edited): its memory is still in use, so charge it to the node's
        // largest GPUs it does not hold already, rather than call the node emptier than it is.
        // Refusing the whole node instead would let one bad pod block every other pod there.
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
            unreported.push((pod, missing));
        }
    }
    grant_devices(&mut ledger, report, pods_for_grants);
    // Placement's rule: use by pods with a reservation on the device is theirs, everything else
    // the device uses is unattributed.
    // A pod is observed at the most it has used (the agent's `podPeaks`: a spike between two
    // report writes stays counted), never less than now; the unattributed rest is what the GPU
    // uses now beyond its pods' use now.
    for (gpu, seen) in ledger.gpus.iter_mut().zip(&report.gpus) {
        let by_pods: u64 = seen.by_pod.iter().map(|(_, b)| *b).sum();
        // Only pods placed here have their peak counted; a stranger's use is unattributed use
        // now, and observed_bytes stays what the GPU uses now.
        let placed = |uid: &str| gpu.reservations().contains_key(uid);
        let peak_of = |uid: &str| {
            seen.peak_by_pod
                .iter()
                .find(|(u, _)| u == uid && placed(u))
                .map_or(0, |(_, b)| *b)
        };
        let mut observed: Vec<(&str, u64)> = seen
            .by_pod
            .iter()
            .map(|(u, b)| (u.as_str(), (*b).max(peak_of(u))))
            .collect();
        // A pod idle at this poll (no process on the GPU now) still has its peak.
        for (u, b) in &seen.peak_by_pod {
            if placed(u) && !observed.iter().any(|(o, _)| o == u) {
                observed.push((u.as_str(), *b));
            }
        }
        gpu.observe(
            seen.total,
            seen.driver_reserved,
            observed,
            seen.used.saturating_sub(by_pods),
        );
    }
    Rebuilt { ledger, unreported }
}

/// Marks the devices the kubelet gave to pods peakfit did not place there (issue 23): such a
/// device is committed in full to its holder and offered to no peakfit pod.
///
/// "Placed there by peakfit" means: a pod bound to this node whose `peakfit.io/assigned-gpus`
/// names this device. Only bind writes that annotation, and the pod's UID-keyed reservation is
/// on the device already, so its memory is counted; any other holder (a pod of the default
/// scheduler with `nvidia.com/gpu`, a DRA claim, a peakfit pod given a *different* GPU by a
/// device plugin) owns the device as far as the kubelet is concerned and may fill it at any time.
fn grant_devices<'a>(
    ledger: &mut NodeLedger,
    report: &ReportView,
    pods: impl Iterator<Item = &'a PodEntry>,
) {
    if report.gpus.iter().all(|g| g.holders.is_empty()) {
        return;
    }
    let placed: Vec<(&str, &str, &[String])> = pods
        .filter_map(|p| {
            let a = p.assignment.as_ref()?;
            Some((
                p.namespace.as_str(),
                p.name.as_str(),
                a.gpu_uuids.as_slice(),
            ))
        })
        .collect();
    for (gpu, seen) in ledger.gpus.iter_mut().zip(&report.gpus) {
        let holders: Vec<DeviceHolder> = seen
            .holders
            .iter()
            .filter(|h| {
                !placed.iter().any(|(ns, name, uuids)| {
                    *ns == h.namespace && *name == h.pod_name && uuids.contains(&gpu.uuid)
                })
            })
            .cloned()
            .collect();
        gpu.set_granted(Some(Grant {
            index: seen.index,
            holders,
        }));
    }
}

impl Index {
    /// Rebuilds one node's ledger from its report and its pods ([`ledger_of`]), warns once per
    /// pod about assigned GPUs the report lacks, and keeps the capacity per model, the node's
    /// shared state and the changed set in step with the new ledger.
    pub(super) fn rebuild(&self, st: &mut NodeState, pods: &HashMap<PodKey, Box<PodEntry>>) {
        let name = st.ledger.name.clone();
        let on_node = st.pods.iter().filter_map(|key| pods.get(key).map(|p| &**p));
        let Rebuilt {
            mut ledger,
            unreported,
        } = ledger_of(
            &name,
            st.allocatable,
            &Allocators {
                device_plugin: st.device_plugin_gpu.clone(),
                dra_driver: st.dra_gpu_driver.clone(),
            },
            st.report.as_ref(),
            on_node,
        );
        let held = st.held.iter().filter_map(|key| pods.get(key).map(|p| &**p));
        let (holds, refused) = hold_on(&mut ledger, held);
        for (pod, why) in refused {
            tracing::warn!(
                node = %name, pod = %pod.name, namespace = %pod.namespace, %why,
                "the pod's hold is not kept: {}", crate::cluster::hold::HOLD
            );
            self.warn_metric("hold_not_kept");
        }
        st.holds = holds;
        if st.report.is_some() {
            for (pod, missing) in &unreported {
                if !st.unreported_assignments.contains(&pod.key) {
                    let assigned = pod
                        .assignment
                        .as_ref()
                        .map(|a| a.gpu_uuids.join(","))
                        .unwrap_or_default();
                    tracing::warn!(
                        node = %name, pod = %pod.name, namespace = %pod.namespace, missing,
                        assigned = %crate::clip::clip(&assigned),
                        "the pod's assigned GPUs are not in the node's report; charged to the node's largest GPUs"
                    );
                    self.warn_metric("assigned_gpu_not_reported");
                }
            }
            st.unreported_assignments = unreported.iter().map(|(p, _)| p.key.clone()).collect();
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

/// Puts the holds of `held` (pending pods whose `peakfit.io/hold` names the node) in the
/// ledger, in the order given; the holds kept, and the pods whose hold could not be, with why:
/// a GPU the report lacks (the node changed since), or a GPU another pod holds already (two
/// replicas chose at once from views a moment apart; the first in key order keeps it). A hold
/// not kept costs only its own pod its wait.
fn hold_on<'a>(
    ledger: &mut NodeLedger,
    held: impl Iterator<Item = &'a PodEntry>,
) -> (Vec<HeldFor>, Vec<(&'a PodEntry, String)>) {
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    for pod in held {
        let Some(note) = pod.hold.as_ref().filter(|_| pod.node.is_none()) else {
            continue;
        };
        let indices: Option<Vec<usize>> = note
            .gpus
            .iter()
            .map(|u| ledger.gpus.iter().position(|g| &g.uuid == u))
            .collect();
        let Some(indices) = indices else {
            refused.push((
                pod,
                "it names a GPU the node's report does not list".to_owned(),
            ));
            continue;
        };
        let placement = Placement {
            gpu_indices: indices.clone(),
            per_gpu_bytes: note.bytes.clone(),
        };
        match ledger.hold(&pod.key, &placement) {
            Ok(()) => kept.push(HeldFor {
                pod: pod.key.clone(),
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                priority: pod.priority,
                until_unix: note.until_unix,
                gpus: indices,
            }),
            Err(e) => refused.push((pod, e.to_string())),
        }
    }
    (kept, refused)
}

/// A reservation of `pod` on `gpu`: its recorded `reserved-bytes`, or what its request needs on
/// a GPU of that size.
fn reserve_for(gpu: &mut GpuLedger, key: &str, pod: &PodEntry, a: &Assignment) {
    let predicted = a.reserved_bytes.unwrap_or_else(|| match &pod.request {
        // What bind reserves there, a whole GPU's bytes or else the share, as near as the
        // index knows: it keeps no safety margin (nor, yet, the driver's reserve), so a PyTorch
        // pod bind took whole because its peak fits the GPU only without the margin
        // (`Demand::whole_on`) is charged its peak, which leaves less than a margin free: room
        // no share with its margin, nor a whole-GPU pod, fits.
        Ok(Some(r)) => crate::placement::fit::need_on(&r.demand, gpu, 0).0,
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
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::cluster::index::report_view::ReportGpu;
    use crate::cluster::index::{ASSIGNED_GPUS, RESERVED_BYTES};
    use crate::cluster::resources::HostRequest;
    use crate::cluster::test_support::{GIB, ledger, mk_node, mk_pod, mk_report, warnings};

    /// One GPU of a report: `(uuid, total, used, driver reserve, use by pod uid)`.
    type Gpu = (&'static str, u64, u64, u64, &'static [(&'static str, u64)]);

    /// A pod bound to the node: `(key, CPU millicores, memory bytes, assigned GPUs,
    /// reserved-bytes, peakfit.io/vram)`.
    type Pod = (
        &'static str,
        u64,
        u64,
        &'static [&'static str],
        Option<u64>,
        Option<&'static str>,
    );

    /// One case of [`ledger_of`]: what the node has and holds, and what its ledger must say.
    struct Row {
        name: &'static str,
        allocatable: (Option<u64>, Option<u64>),
        /// `None`: no report yet.
        report: Option<&'static [Gpu]>,
        nvml_down: Option<&'static str>,
        pods: &'static [Pod],
        /// Per GPU of the report, in its order.
        committed: &'static [u64],
        unattributed: &'static [u64],
        cpu_free: Option<u64>,
        memory_free: Option<u64>,
        condition: NodeCondition,
        /// Pods charged elsewhere for assigned GPUs the report lacks, with how many.
        unreported: &'static [(&'static str, usize)],
    }

    const fn row(name: &'static str) -> Row {
        Row {
            name,
            allocatable: (None, None),
            report: Some(&[]),
            nvml_down: None,
            pods: &[],
            committed: &[],
            unattributed: &[],
            cpu_free: None,
            memory_free: None,
            condition: NodeCondition::Ready,
            unreported: &[],
        }
    }

    fn entry(&(key, cpu_milli, memory_bytes, gpus, reserved_bytes, vram): &Pod) -> PodEntry {
        PodEntry {
            key: key.into(),
            namespace: "ml".into(),
            name: format!("pod-{key}"),
            has_uid: true,
            node: Some("n".into()),
            priority: 0,
            request: vram.map_or(Ok(None), |v| {
                crate::model::pod_request(&BTreeMap::from([("peakfit.io/vram".into(), v.into())]))
            }),
            assignment: (!gpus.is_empty()).then(|| Assignment {
                gpu_uuids: gpus.iter().map(|g| (*g).to_owned()).collect(),
                reserved_bytes,
            }),
            bound_here: false,
            host: HostRequest {
                cpu_milli,
                memory_bytes,
                gpu_products: Vec::new(),
            },
            model_config: None,
            workload: None,
            explicit: vram.is_some(),
            started_unix: None,
            hold: None,
            unschedulable: false,
        }
    }

    fn view(gpus: &[Gpu], nvml_down: Option<&str>) -> ReportView {
        ReportView {
            observed_at_unix: Some(1_800_000_000),
            nvml_down: nvml_down.map(str::to_owned),
            pod_resources_down: None,
            gpus: gpus
                .iter()
                .map(|&(uuid, total, used, driver_reserved, by_pod)| ReportGpu {
                    uuid: uuid.into(),
                    model: Arc::from("NVIDIA H100 80GB HBM3"),
                    total,
                    used,
                    driver_reserved,
                    by_pod: by_pod.iter().map(|&(u, b)| (u.to_owned(), b)).collect(),
                    peak_by_pod: Vec::new(),
                    index: 0,
                    holders: Vec::new(),
                })
                .collect(),
        }
    }

    /// What `rebuild` computes, row by row: host requests, reservations by `reserved-bytes` or
    /// by request, observed use against predictions, unattributed use, assigned GPUs missing
    /// from the report, and the node's condition.
    #[test]
    fn ledger_of_computes_each_row() {
        const G: u64 = GIB;
        let rows = [
            Row {
                allocatable: (Some(16_000), Some(64 * G)),
                report: None,
                pods: &[
                    ("a", 4_000, G, &["GPU-a"], Some(10 * G), None),
                    ("b", 1_500, G, &[], None, None),
                ],
                cpu_free: Some(10_500),
                memory_free: Some(62 * G),
                condition: NodeCondition::NoReport,
                ..row("without a report only the host requests count")
            },
            Row {
                report: Some(&[("GPU-a", 80 * G, 0, 0, &[]), ("GPU-b", 80 * G, 0, 0, &[])]),
                pods: &[("u1", 0, 0, &["GPU-b"], Some(21 * G), Some("20Gi"))],
                committed: &[0, 21 * G],
                unattributed: &[0, 0],
                ..row("reserved-bytes is what the assigned GPU holds")
            },
            Row {
                report: Some(&[("GPU-a", 40 * G, 0, 0, &[])]),
                pods: &[("u1", 0, 0, &["GPU-a"], None, Some("10Gi"))],
                committed: &[10 * G],
                unattributed: &[0],
                ..row("without reserved-bytes the request decides")
            },
            Row {
                report: Some(&[("GPU-a", 80 * G, 0, 0, &[])]),
                pods: &[("u1", 0, 0, &[], None, Some("10Gi"))],
                committed: &[0],
                unattributed: &[0],
                ..row("a pod without an assignment holds no GPU")
            },
            Row {
                report: Some(&[("GPU-a", 80 * G, 0, 0, &[]), ("GPU-b", 80 * G, 0, 0, &[])]),
                pods: &[
                    ("u1", 0, 0, &["GPU-a", "GPU-b"], Some(20 * G), None),
                    ("u2", 0, 0, &["GPU-b"], Some(5 * G), None),
                ],
                committed: &[20 * G, 25 * G],
                unattributed: &[0, 0],
                ..row("a pod on two GPUs reserves on each")
            },
            Row {
                // 30 GiB used: 25 by u1 (reserved 10), 3 by a pod with no reservation, 2 by no
                // pod at all.
                report: Some(&[(
                    "GPU-a",
                    80 * G,
                    30 * G,
                    0,
                    &[("u1", 25 * G), ("stranger", 3 * G)],
                )]),
                pods: &[("u1", 0, 0, &["GPU-a"], Some(10 * G), None)],
                committed: &[30 * G],
                unattributed: &[5 * G],
                ..row("use above the prediction counts; strangers are unattributed")
            },
            Row {
                report: Some(&[("GPU-a", 80 * G, 3 * G, 0, &[("u1", 3 * G)])]),
                pods: &[("u1", 0, 0, &["GPU-a"], Some(10 * G), None)],
                committed: &[10 * G],
                unattributed: &[0],
                ..row("use below the prediction: the prediction stands")
            },
            Row {
                // The device total lags its processes (different NVML calls).
                report: Some(&[("GPU-a", 80 * G, G, 0, &[("u1", 4 * G)])]),
                pods: &[("u1", 0, 0, &["GPU-a"], Some(2 * G), None)],
                committed: &[4 * G],
                unattributed: &[0],
                ..row("unattributed use is never negative")
            },
            Row {
                report: Some(&[("GPU-a", 80 * G, 0, G, &[])]),
                committed: &[G],
                unattributed: &[0],
                ..row("the driver's reserve is committed")
            },
            Row {
                report: Some(&[
                    ("GPU-small", 24 * G, 0, 0, &[]),
                    ("GPU-big", 80 * G, 0, 0, &[]),
                    ("GPU-held", 80 * G, 0, 0, &[]),
                ]),
                pods: &[("u1", 0, 0, &["GPU-held", "GPU-gone"], Some(30 * G), None)],
                committed: &[0, 30 * G, 30 * G],
                unattributed: &[0, 0, 0],
                unreported: &[("u1", 1)],
                ..row("an assigned GPU the report lacks is charged to the largest other GPU")
            },
            Row {
                report: Some(&[("GPU-a", 80 * G, 0, 0, &[])]),
                nvml_down: Some("driver gone"),
                pods: &[("u1", 0, 0, &["GPU-a"], Some(8 * G), None)],
                committed: &[8 * G],
                unattributed: &[0],
                condition: NodeCondition::NvmlDown {
                    reason: "driver gone".into(),
                },
                ..row("NVML down: the node's condition says so, the ledger is kept")
            },
        ];
        for r in rows {
            let pods: Vec<PodEntry> = r.pods.iter().map(entry).collect();
            let report = r.report.map(|g| view(g, r.nvml_down));
            let Rebuilt { ledger, unreported } = ledger_of(
                "n",
                r.allocatable,
                &Allocators::default(),
                report.as_ref(),
                pods.iter(),
            );
            let committed: Vec<u64> = ledger.gpus.iter().map(GpuLedger::committed_bytes).collect();
            let unattributed: Vec<u64> = ledger.gpus.iter().map(|g| g.unattributed_bytes).collect();
            let unreported: Vec<(&str, usize)> = unreported
                .iter()
                .map(|(p, n)| (p.key.as_str(), *n))
                .collect();
            assert_eq!(committed, r.committed, "{}: committed", r.name);
            assert_eq!(unattributed, r.unattributed, "{}: unattributed", r.name);
            assert_eq!(ledger.cpu_free_milli(), r.cpu_free, "{}: CPU", r.name);
            assert_eq!(
                ledger.memory_free_bytes(),
                r.memory_free,
                "{}: memory",
                r.name
            );
            assert_eq!(ledger.condition, r.condition, "{}: condition", r.name);
            assert_eq!(unreported, r.unreported, "{}: unreported", r.name);
            assert_eq!(
                ledger.observed_at_unix,
                report.and_then(|v| v.observed_at_unix),
                "{}",
                r.name
            );
        }
    }

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

    fn holder(pod: &str, kind: crate::inventory::HolderKind) -> crate::inventory::DeviceHolder {
        crate::inventory::DeviceHolder {
            namespace: "ml".into(),
            pod_name: pod.into(),
            container: "main".into(),
            kind,
            resource: "nvidia.com/gpu".into(),
            claim: None,
        }
    }

    /// Issue 23: a GPU the kubelet gave to a pod peakfit did not place is committed in full and
    /// names its holder; one it gave to the peakfit pod assigned to it is that pod's, counted
    /// by its reservation; a peakfit pod given a *different* GPU by a device plugin holds that
    /// one like a stranger; a conflict (a peakfit pod on a granted GPU) counts both.
    #[test]
    fn granted_gpus_are_committed_to_holders_peakfit_did_not_place() {
        use crate::inventory::HolderKind::{DevicePlugin, Dra};
        let index = Index::new();
        index.apply_pod(&mk_pod(
            "u1",
            Some("n1"),
            &[
                ("peakfit.io/vram", "4Gi"),
                (ASSIGNED_GPUS, "GPU-0"),
                (RESERVED_BYTES, &(4 * GIB).to_string()),
            ],
        ));
        // The kubelet's view: u1 (pod-u1) holds GPU-0 (its own) and GPU-1 (not assigned to
        // it); trainer-0 holds GPU-2 through a DRA claim; GPU-3 is free.
        let mut r = mk_report(
            "n1",
            &[
                ("GPU-0", 24 * GIB, 0, &[]),
                ("GPU-1", 24 * GIB, 0, &[]),
                ("GPU-2", 24 * GIB, 2 * GIB, &[]),
                ("GPU-3", 24 * GIB, 0, &[]),
            ],
        );
        let gpus = &mut r.status.as_mut().unwrap().gpus;
        gpus[0].held_by = vec![holder("pod-u1", DevicePlugin)];
        gpus[1].held_by = vec![holder("pod-u1", DevicePlugin)];
        gpus[2].held_by = vec![holder("trainer-0", Dra)];
        index.apply_report(&r);
        let l = ledger(&index, "n1");
        let held: Vec<bool> = l.gpus.iter().map(|g| g.granted().is_some()).collect();
        assert_eq!(held, [false, true, true, false]);
        let committed: Vec<u64> = l.gpus.iter().map(|g| g.committed_bytes() / GIB).collect();
        assert_eq!(committed, [4, 24, 24, 0]);
        assert_eq!(
            l.gpus[2].granted().unwrap().describe("GPU-2"),
            "GPU 2 (GPU-2) is held by ml/trainer-0 through nvidia.com/gpu"
        );
        assert!(index.holder_conflicts().is_empty());

        // A report giving GPU-0 to trainer-0 as well: a conflict, counted at once.
        let mut r2 = r.clone();
        r2.status.as_mut().unwrap().gpus[0]
            .held_by
            .push(holder("trainer-0", DevicePlugin));
        index.apply_report(&r2);
        assert_eq!(ledger(&index, "n1").gpus[0].committed_bytes(), 28 * GIB);
        let c = index.holder_conflicts();
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].node.as_str(), c[0].gpu_uuid.as_str(), c[0].gpu_index),
            ("n1", "GPU-0", 0)
        );
        assert_eq!(
            (c[0].pod.1.as_str(), c[0].pod_uid.as_deref()),
            ("pod-u1", Some("u1"))
        );
        assert_eq!(c[0].holder.pod_name, "trainer-0");
        // The holder gone: the conflict and the grant with it.
        index.apply_report(&r);
        assert!(index.holder_conflicts().is_empty());
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

    /// Issue 21: a pod's spike between two report writes was forgotten at the next write; the
    /// agent's `podPeaks` keep it, and the ledger counts the pod at its peak (used now: 12 GiB;
    /// peak 30; predicted 10), also while it has no process on the GPU, and never a stranger's
    /// peak.
    #[test]
    fn a_pod_is_counted_at_its_published_peak() {
        let index = Index::new();
        index.apply_pod(&mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")],
        ));
        let mut r = mk_report("n1", &[("GPU-a", 80 * GIB, 12 * GIB, &[("u1", 12 * GIB)])]);
        let peak = |uid: &str, bytes: u64| crate::inventory::PodPeak {
            pod_uid: uid.into(),
            gpu_uuid: "GPU-a".into(),
            peak_bytes: bytes,
            at: "2027-01-15T00:00:00Z".into(),
        };
        r.status.as_mut().unwrap().pod_peaks =
            vec![peak("u1", 30 * GIB), peak("stranger", 40 * GIB)];
        index.apply_report(&r);
        let g = &ledger(&index, "n1").gpus[0];
        assert_eq!(g.reservations()["u1"].observed_bytes, 30 * GIB);
        assert_eq!(g.free_bytes(), 50 * GIB);
        // No process now: still its peak.
        let mut idle = mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]);
        idle.status.as_mut().unwrap().pod_peaks = vec![peak("u1", 30 * GIB)];
        index.apply_report(&idle);
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 50 * GIB);
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
