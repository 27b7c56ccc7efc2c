//! The two levels of locks: the pod table (one lock) and a slot per node (its state behind its
//! own lock, and the async lock bind holds across its API calls). The order is always pod
//! table, then node.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use parking_lot::{RwLock, RwLockReadGuard};

use super::report_view::ReportView;
use super::scores::StateScores;
use super::{Index, PARALLEL_AFTER, PodEntry, SERIAL_STEP};
use crate::cluster::resources::{advertised_gpu, allocatable_of};
use crate::placement::{NodeLedger, PodKey};

/// Everything the index knows about one node.
#[derive(Debug)]
pub struct NodeState {
    pub node_known: bool,
    /// The Node's allocatable (CPU millicores, memory bytes), once its object was seen.
    pub(super) allocatable: (Option<u64>, Option<u64>),
    /// The first GPU resource (`--gpu-resources`) the Node's allocatable advertises non-zero:
    /// a device plugin there can hand out GPUs peakfit learns of only through the agent's
    /// `PodResources` read.
    pub(super) device_plugin_gpu: Option<String>,
    /// The DRA GPU driver (`--gpu-dra-drivers`) with a `ResourceSlice` of devices on this node:
    /// its devices are not in allocatable, and a claim it allocates is likewise seen only
    /// through the agent's `PodResources` read.
    pub(super) dra_gpu_driver: Option<String>,
    pub(super) report: Option<ReportView>,
    pub(super) pods: BTreeSet<PodKey>,
    pub ledger: NodeLedger,
    /// The score memo of the ledger's state, rebuilt with it: shared by every node in the same
    /// state (`placement::signature`), so that they are scored once per pod class between them.
    pub(super) scores: Arc<StateScores>,
    /// Pods whose assigned GPUs the report lacks, already warned about (warn once per pod, not
    /// on every rebuild).
    pub(super) unreported_assignments: BTreeSet<PodKey>,
    /// Pending pods whose `peakfit.io/hold` names this node (in force or not).
    pub(super) held: BTreeSet<PodKey>,
    /// The holds the ledger carries (`GpuLedger::hold`), with what deciding who they bind
    /// needs: the held pod's priority and the deadline.
    pub holds: Vec<HeldFor>,
}

/// A hold in a node's ledger, as filter, prioritize and bind weigh it for another pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldFor {
    pub pod: PodKey,
    pub namespace: String,
    pub name: String,
    pub priority: i32,
    pub until_unix: i64,
    /// The held GPUs' indices in the ledger.
    pub gpus: Vec<usize>,
}

impl HeldFor {
    /// Whether the hold keeps its memory from `pod` (of `priority`) at `now`. Like the nominated
    /// pods of kube-scheduler, a hold binds only pods of lower or equal priority: a pod of
    /// higher priority would preempt the held pod's future peers anyway, so it sees the memory
    /// as free (and the held pod waits on, or is moved by the next hold). Not the pod's own.
    pub fn binds(&self, pod: Option<&str>, priority: i32, now: i64) -> bool {
        self.until_unix > now && pod != Some(self.pod.as_str()) && priority <= self.priority
    }
}

/// One node: its state, and the lock bind holds across the API calls.
#[derive(Debug)]
pub struct NodeSlot {
    pub bind_lock: tokio::sync::Mutex<()>,
    pub(super) state: RwLock<NodeState>,
}

impl NodeSlot {
    fn new(name: &str, dra_gpu_driver: Option<String>) -> Self {
        Self {
            bind_lock: tokio::sync::Mutex::new(()),
            state: RwLock::new(NodeState {
                node_known: false,
                allocatable: (None, None),
                device_plugin_gpu: None,
                dra_gpu_driver,
                report: None,
                pods: BTreeSet::new(),
                ledger: NodeLedger::new(name),
                scores: Arc::default(),
                unreported_assignments: BTreeSet::new(),
                held: BTreeSet::new(),
                holds: Vec::new(),
            }),
        }
    }

    pub fn read(&self) -> RwLockReadGuard<'_, NodeState> {
        self.state.read()
    }
}

impl NodeState {
    /// The score memo of the ledger's state (`placement::memo`), shared with every node in the
    /// same state.
    pub fn scores(&self) -> &Arc<StateScores> {
        &self.scores
    }

    /// The ledger as `pod` (`None`: any pod, as the prescorer scores) of `priority` sees it at
    /// `now`: the holds that do not bind it (its own, those of lower priority, those past their
    /// deadline) are free memory. Borrowed, so the memo of the node's state applies, unless a
    /// hold is dropped: then the copy is this pod's alone and must be decided without the memo.
    pub fn seen_by(&self, pod: Option<&str>, priority: i32, now: i64) -> Cow<'_, NodeLedger> {
        let mut view = Cow::Borrowed(&self.ledger);
        for h in self.holds.iter().filter(|h| !h.binds(pod, priority, now)) {
            view.to_mut().unhold(&h.pod);
        }
        view
    }

    /// The holds that keep memory from `pod` here now.
    pub fn holds_binding(
        &self,
        pod: Option<&str>,
        priority: i32,
        now: i64,
    ) -> impl Iterator<Item = &HeldFor> {
        self.holds
            .iter()
            .filter(move |h| h.binds(pod, priority, now))
    }
}

/// A peakfit pod and a holder the kubelet gave the same GPU to: whoever allocates last there
/// runs out of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderConflict {
    pub node: String,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// The peakfit pod: (namespace, name).
    pub pod: (String, String),
    /// Its UID, when the index keys it by one.
    pub pod_uid: Option<String>,
    pub holder: crate::inventory::DeviceHolder,
}

impl HolderConflict {
    /// One string per conflict, the same in every replica and after a restart: the events'
    /// names are made from it, so that the API server keeps one event per conflict.
    pub fn key(&self) -> String {
        format!(
            "{}|{}|{}/{}|{}/{}|{}",
            self.node,
            self.gpu_uuid,
            self.pod.0,
            self.pod.1,
            self.holder.namespace,
            self.holder.pod_name,
            self.holder
                .claim
                .as_deref()
                .unwrap_or(&self.holder.resource)
        )
    }
}

#[derive(Default)]
pub(super) struct PodTable {
    /// Boxed: a map of 150,000 pods keeps ~40 % of its buckets empty, and an empty bucket
    /// costs the size of its value.
    pub(super) by_key: HashMap<PodKey, Box<PodEntry>>,
    pub(super) by_name: HashMap<(String, String), PodKey>,
    /// Pending pods with a `peakfit.io/hold` (in force or not): what the cap counts and the
    /// sweep looks at, without a pass over every pod.
    pub(super) held: BTreeSet<PodKey>,
    /// Holds the sweep ended at their deadline, by pod and the time they were made: the
    /// annotation stays on the pod until a new hold replaces it, and a watch event carrying it
    /// again must not bring it back.
    pub(super) expired: HashSet<(PodKey, i64)>,
}

impl Index {
    /// The slots of these nodes that the index still has.
    pub fn slots_named(&self, names: &[String]) -> Vec<Arc<NodeSlot>> {
        let nodes = self.nodes.read();
        names.iter().filter_map(|n| nodes.get(n).cloned()).collect()
    }

    /// Reads every node's state, one node at a time, with a lookup from a reserved pod's key to
    /// its (namespace, name): what the metrics collector (`metrics::extender::IndexCollector`)
    /// reads at scrape time, so no series outlives the node, GPU or pod it describes.
    pub fn visit_nodes(
        &self,
        mut f: impl FnMut(&NodeState, &dyn Fn(&str) -> Option<(String, String)>),
    ) {
        for slot in self.all_slots() {
            // The order every writer takes them in (`rebuild`): the pods, then the node.
            let pods = self.pods.read();
            let st = slot.state.read();
            f(&st, &|key| {
                pods.by_key
                    .get(key)
                    .map(|p| (p.namespace.clone(), p.name.clone()))
            });
        }
    }

    /// Every peakfit pod assigned to a GPU that the kubelet gave to a pod peakfit did not place
    /// (issue 23), one entry per (pod, GPU, holder): what the conflict events are written for.
    pub fn holder_conflicts(&self) -> Vec<HolderConflict> {
        let mut out = Vec::new();
        self.visit_nodes(|st, pod_name| {
            for g in &st.ledger.gpus {
                let Some(grant) = g.granted() else { continue };
                for key in g.reservations().keys() {
                    let Some(pod) = pod_name(key) else { continue };
                    for holder in &grant.holders {
                        out.push(HolderConflict {
                            node: st.ledger.name.clone(),
                            gpu_uuid: g.uuid.clone(),
                            gpu_index: grant.index,
                            pod: pod.clone(),
                            pod_uid: (key.as_str() != format!("{}/{}", pod.0, pod.1))
                                .then(|| key.clone()),
                            holder: holder.clone(),
                        });
                    }
                }
            }
        });
        out
    }

    pub fn node(&self, name: &str) -> Option<Arc<NodeSlot>> {
        self.nodes.read().get(name).cloned()
    }

    /// The slots of `names` under one lock acquisition (a request asks for thousands).
    /// `f` of every named node's slot (`None` for a node the index does not know), in order:
    /// on the calling thread while the rest would take less than [`PARALLEL_AFTER`] at the pace
    /// so far, then the rest spread over the cores (lookups too: for thousands of names they
    /// cost as much as the decisions). Deciding by the time taken, not by how many names, keeps
    /// cheap requests off rayon's threads, whose hand-off cost more than the work on a busy
    /// machine, and expensive ones (a new class on thousands of nodes) on every core.
    pub fn map_slots<T: Send>(
        &self,
        names: &[&str],
        f: impl Fn(Option<&NodeSlot>) -> T + Sync,
    ) -> Vec<T> {
        let started = std::time::Instant::now();
        self.map_slots_paced(names, f, || started.elapsed())
    }

    /// [`Self::map_slots`] with the clock given: `elapsed` says how long the calling thread has
    /// worked so far (a test's clock decides the switch without depending on the machine's pace).
    fn map_slots_paced<T: Send>(
        &self,
        names: &[&str],
        f: impl Fn(Option<&NodeSlot>) -> T + Sync,
        elapsed: impl Fn() -> std::time::Duration,
    ) -> Vec<T> {
        use rayon::prelude::*;
        // Recursive: a rayon worker waiting inside this call may run another request's part,
        // which takes this lock again; an ordinary read would wait behind a queued writer.
        let nodes = self.nodes.read_recursive();
        let one = |n: &&str| f(nodes.get(*n).map(|s| &**s));
        let mut out = Vec::with_capacity(names.len());
        while out.len() < names.len() {
            let done = out.len();
            let step = &names[done..(done + SERIAL_STEP).min(names.len())];
            out.extend(step.iter().map(one));
            let (done, left) = (out.len(), names.len() - out.len());
            if left > 0 && rest_is_slow(elapsed(), done, left) {
                out.par_extend(names[done..].par_iter().map(one));
            }
        }
        out
    }

    /// Every node's slot, for a pass over the whole cluster that must not hold the node map
    /// while it works.
    pub fn all_slots(&self) -> Vec<Arc<NodeSlot>> {
        self.nodes.read().values().cloned().collect()
    }

    pub fn node_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.nodes.read().keys().cloned().collect();
        v.sort();
        v
    }

    pub(super) fn slot(&self, name: &str) -> Arc<NodeSlot> {
        if let Some(s) = self.nodes.read().get(name) {
            return s.clone();
        }
        self.nodes
            .write()
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(NodeSlot::new(name, self.dra_gpu_driver_of(name))))
            .clone()
    }

    pub fn apply_node(&self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else {
            return;
        };
        let slot = self.slot(name);
        let allocatable = allocatable_of(node);
        let device_plugin_gpu = advertised_gpu(node, &self.gpu_resources);
        let pods = self.pods.read();
        let mut st = slot.state.write();
        st.node_known = true;
        if st.allocatable != allocatable || st.device_plugin_gpu != device_plugin_gpu {
            st.allocatable = allocatable;
            st.device_plugin_gpu = device_plugin_gpu;
            self.rebuild(&mut st, &pods.by_key);
        }
    }

    pub fn delete_node(&self, name: &str) {
        let Some(slot) = self.node(name) else { return };
        let empty = {
            let mut st = slot.state.write();
            st.node_known = false;
            st.report.is_none() && st.pods.is_empty()
        };
        if empty {
            self.nodes.write().remove(name);
        }
    }
}

/// Whether `left` more items, at the pace of `done` in `elapsed`, would take longer than
/// [`PARALLEL_AFTER`] on one thread (elapsed × left ÷ done, without the division).
fn rest_is_slow(elapsed: std::time::Duration, done: usize, left: usize) -> bool {
    done > 0 && elapsed.as_nanos() * left as u128 > PARALLEL_AFTER.as_nanos() * done as u128
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::{ledger, mk_node};
    use crate::placement::NodeCondition;

    #[test]
    fn moving_and_missing_nodes() {
        let index = Index::new();
        index.apply_node(&mk_node("n1"));
        assert_eq!(ledger(&index, "n1").condition, NodeCondition::NoReport);
        index.delete_node("n1");
        assert!(index.node("n1").is_none());
    }

    /// Cheap work stays on the calling thread; work whose rest would take longer than
    /// `PARALLEL_AFTER` there moves to rayon's threads. Either way every name is answered once,
    /// in order, unknown names with `None`. The clock is the test's, so the machine's pace (a
    /// loaded CI runner) cannot move the switch.
    #[test]
    fn map_slots_goes_parallel_only_when_the_rest_is_slow() {
        use std::time::Duration;
        let index = Index::new();
        let names: Vec<String> = (0..200).map(|i| format!("n{i:03}")).collect();
        for n in names.iter().step_by(2) {
            index.apply_node(&mk_node(n));
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let caller = std::thread::current().id();
        let expected: Vec<Option<String>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (i % 2 == 0).then(|| (*n).to_owned()))
            .collect();
        // Per item on the caller's clock: 0 (cheap), 1 µs (the rest 136 µs: still serial),
        // PARALLEL_AFTER / 8 (the rest 136 × 25 µs: parallel after the first step).
        for (per_item, parallel) in [
            (Duration::ZERO, false),
            (Duration::from_micros(1), false),
            (PARALLEL_AFTER / 8, true),
        ] {
            let worked = std::sync::atomic::AtomicU64::new(0);
            let out = index.map_slots_paced(
                &names,
                |slot| {
                    let here = std::thread::current().id() == caller;
                    if here {
                        worked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    (slot.map(|s| s.read().ledger.name.clone()), here)
                },
                || {
                    per_item
                        * u32::try_from(worked.load(std::sync::atomic::Ordering::Relaxed)).unwrap()
                },
            );
            assert_eq!(
                out.iter().map(|o| o.0.clone()).collect::<Vec<_>>(),
                expected
            );
            let on_caller = out.iter().filter(|o| o.1).count();
            if parallel {
                assert!(
                    on_caller < names.len(),
                    "slow work stayed on the calling thread"
                );
                assert!(on_caller >= SERIAL_STEP);
            } else {
                assert_eq!(on_caller, names.len(), "cheap work left the calling thread");
            }
        }
    }

    #[test]
    fn the_rest_is_slow_when_its_pace_says_longer_than_parallel_after() {
        use std::time::Duration;
        assert!(!rest_is_slow(Duration::ZERO, 64, 136));
        // 64 in 64 µs: 136 more take 136 µs < 200 µs.
        assert!(!rest_is_slow(Duration::from_micros(64), 64, 136));
        // 64 in 128 µs: 136 more take 272 µs.
        assert!(rest_is_slow(Duration::from_micros(128), 64, 136));
        assert!(!rest_is_slow(Duration::from_secs(1), 64, 0));
        assert!(!rest_is_slow(Duration::from_secs(1), 0, 10));
    }
}
