//! The extender's view of the cluster: one ledger per node, fed one object at a time.
//!
//! Watches (or a file) call `apply_*`/`delete_*` for Nodes, Pods and `NodeGpuReports`; each call
//! touches only the nodes that object concerns, so a request never rescans the cluster. A pod's
//! annotations are parsed once, when it is indexed, and a pod with a bad annotation is remembered
//! with its error without affecting any other pod.
//!
//! Locks: the pod table has one lock, every node its own. The order is always pod table, then
//! node. Filter and prioritize only take node read locks; bind serialises on the node's
//! `bind_lock` (async, held across the API calls) and writes the ledger only once the API said yes.
//!
//! One file per concern: `pod` (a pod's entry, parsed from its annotations), `report_view` (what
//! is kept of a GPU report), `slot` (the node slots and the pod table, the two lock levels),
//! `reconcile` (the watch's and bind's writes to the pod table), `observe` (running pods' peaks
//! by workload, for the profiles), `rebuild` (a node's ledger from
//! its report and pods), `states` and `scores` (what is remembered per node state), `reasons`
//! (the warnings' metric label), `holds` (holds for pods that starve: in force, made, ended),
//! `request_memo` (pods' requests kept by the model's inputs, so a pod asked about again does
//! not run the model again),
//! `resource_slices` (the nodes a DRA GPU driver publishes devices on).

mod holds;
mod observe;
mod pod;
mod reasons;
mod rebuild;
mod reconcile;
mod report_view;
mod request_memo;
mod resource_slices;
mod scores;
mod slot;
mod states;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::cluster::model_config::ModelConfigs;
use crate::model::estimate::Platform;

pub use holds::ExpiredHold;
pub use observe::Observed;
pub use pod::{
    ASSIGNED_GPUS, Assignment, GPU_MEMORY_FRACTION, MAX_RESERVED_BYTES, PodEntry, RESERVED_BYTES,
    SoftPreference, is_explicit, pod_key, pod_request_of, soft_preference,
};
pub use reasons::ReasonLabels;
pub use rebuild::free_outside_largest_gpu_ratio;
pub use report_view::MAX_GPU_BYTES;
pub use request_memo::RequestMemo;
pub use scores::{StateScores, Verdict};
pub use slot::{HeldFor, HolderConflict, NodeSlot, NodeState};

use slot::PodTable;
use states::States;

/// A request's nodes are decided on the calling thread, this many at a time, until the pace so
/// far says the rest would take longer than [`PARALLEL_AFTER`]; then the rest in parallel.
pub const SERIAL_STEP: usize = 64;

/// How long the rest of a request's nodes may take on the calling thread before they are spread
/// over the cores. Handing work to rayon's threads and waiting for them costs two thread
/// wake-ups, tens of microseconds on an idle machine and milliseconds where the CPU is busy (as
/// beside a kube-apiserver and kube-scheduler at full rate): kube-scheduler's usual 420-500
/// names with their verdicts and scores remembered take 0.1-0.2 ms in all, less than the
/// hand-off, while a new class scored on thousands of nodes still runs on every core.
pub const PARALLEL_AFTER: std::time::Duration = std::time::Duration::from_micros(200);

/// The index. Cheap to share: wrap it in an `Arc`.
#[derive(Default)]
pub struct Index {
    /// Hashed with foldhash: every request looks up thousands of names, and SipHash's defence
    /// against chosen keys buys nothing for node names the API server hands out.
    nodes: RwLock<HashMap<String, Arc<NodeSlot>, foldhash::fast::RandomState>>,
    pods: RwLock<PodTable>,
    /// Nodes whose ledger was rebuilt since the last `take_changed`, for the prescorer to
    /// rescore only those. `None` until someone asks (`track_changes`), so that without a
    /// consumer it does not grow.
    changed: Mutex<Option<HashSet<String>>>,
    /// GPUs per model over every node's ledger, and a counter bumped whenever it changes, so
    /// the shape mix's model pressure follows the cluster's capacity.
    gpu_capacity: Mutex<(u64, BTreeMap<String, u64>)>,
    /// Cluster objects refused or repaired, by reason; exported as
    /// `peakfit_index_warnings_total` (`metrics::extender::ExtenderMetrics::with_index`).
    warnings: Family<ReasonLabels, Counter>,
    /// The `peakfit.io/model-config` ConfigMaps the watch has seen, parsed.
    model_configs: ModelConfigs,
    /// The nodes' CUDA context (`--cuda-context`), counted in every modelled pod's demand.
    platform: Platform,
    /// Pod requests by the model's inputs (`request_memo`): filter, prioritize, preempt and the
    /// pod watch ask for the same pods' requests again and again, and a decoder's costs a
    /// replay of the caching allocator.
    request_memo: RequestMemo,
    /// GPU model names, one string each for every node's GPUs: scoring compares a GPU's model
    /// with the shape mix's (fill patterns, model pressure) for every node of a request, and a
    /// shared string answers by pointer where each node's own copy cost a cache miss (a tenth
    /// of prioritize's time for a new class). At most `MAX_SHARED_MODELS`.
    models: Mutex<Vec<Arc<str>>>,
    /// One score memo per distinct node state (`placement::signature`), shared by the nodes in
    /// that state.
    states: Mutex<States>,
    /// Which node's report first listed a GPU UUID: a UUID is one physical GPU, so a second
    /// node reporting it (a copied report, a misconfigured agent) is warned about and counted.
    gpu_owners: Mutex<HashMap<String, String>>,
    /// The device-plugin resources that are GPUs (`--gpu-resources`): a node advertising one
    /// is refused while its agent cannot read which of them the kubelet handed out.
    gpu_resources: crate::gpu_resources::GpuResources,
    /// The `ResourceSlices` of the DRA GPU drivers (`--gpu-dra-drivers`) that name nodes: a
    /// node they publish devices on is refused like one advertising a device-plugin GPU.
    resource_slices: Mutex<resource_slices::SliceTable>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("nodes", &self.nodes.read().len())
            .field("pods", &self.pods.read().by_key.len())
            .finish_non_exhaustive()
    }
}

impl Index {
    pub fn new() -> Self {
        Self::default()
    }

    /// An index whose modelled pods count this platform's CUDA context (the extender's
    /// `--cuda-context`; [`Platform::default`] is the measured reference).
    pub fn with_platform(platform: Platform) -> Self {
        Self {
            platform,
            ..Self::default()
        }
    }

    /// The device-plugin resources and DRA drivers that are GPUs (the extender's
    /// `--gpu-resources` and `--gpu-dra-drivers`); the default is the flags'.
    #[must_use]
    pub fn with_gpu_resources(mut self, gpu_resources: crate::gpu_resources::GpuResources) -> Self {
        self.gpu_resources = gpu_resources;
        self
    }

    /// The memo of pod requests, for its counters (`peakfit_request_memo_{hits,misses}_total`).
    pub fn request_memo(&self) -> &RequestMemo {
        &self.request_memo
    }

    /// The labelled model-config ConfigMaps (fed by the ConfigMap watch).
    pub fn model_configs(&self) -> &ModelConfigs {
        &self.model_configs
    }

    /// From now on, remember which nodes change (see `take_changed`).
    pub fn track_changes(&self) {
        self.changed.lock().get_or_insert_with(HashSet::new);
    }

    /// The nodes whose ledger changed since the last call (and since `track_changes`), by name.
    pub fn take_changed(&self) -> Vec<String> {
        self.changed
            .lock()
            .as_mut()
            .map(|c| c.drain().collect())
            .unwrap_or_default()
    }

    pub fn contains_pod(&self, key: &str) -> bool {
        self.pods.read().by_key.contains_key(key)
    }

    /// Whether pod `key` is bound to a node (or bound by our own bind in flight); `None` when
    /// the index does not have it.
    pub fn pod_bound(&self, key: &str) -> Option<bool> {
        self.pods.read().by_key.get(key).map(|p| p.node.is_some())
    }

    /// Whether kube-scheduler left some pod peakfit places unschedulable (`PodEntry::
    /// unschedulable`). A scan of the pod table: the nudger asks only when a node improved and
    /// its own record of refused pods is empty, at most once a tick, and the pass is cheap
    /// enough for that (a median 0.11 ms at 50,000 pods, 0.56 ms with cold caches: `cargo bench
    /// --bench extender`, `unschedulable`), so no count is kept up with every pod write.
    pub fn any_pod_left_unschedulable(&self) -> bool {
        self.pods.read().by_key.values().any(|p| p.unschedulable)
    }

    /// Nodes the index has a slot for (known, reported, or named by a pod).
    pub fn node_count(&self) -> usize {
        self.nodes.read().len()
    }

    /// Nodes whose ledger has at least one GPU (a report with GPUs). What `--reserve-max` is a
    /// fraction of: the simulation that chose its default had GPU nodes only, and a cluster's
    /// CPU-only nodes would otherwise raise the cap on held GPU memory.
    pub fn gpu_node_count(&self) -> usize {
        self.all_slots()
            .iter()
            .filter(|s| !s.read().ledger.gpus.is_empty())
            .count()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.read().by_key.len()
    }

    /// GPUs per model in the cluster (by `GpuLedger::model`) and the counter that changes with
    /// them.
    pub fn gpu_capacity(&self) -> (u64, BTreeMap<String, u64>) {
        self.gpu_capacity.lock().clone()
    }

    /// The counter of `gpu_capacity` alone, cheap enough for every request.
    pub fn gpu_capacity_generation(&self) -> u64 {
        self.gpu_capacity.lock().0
    }
}
