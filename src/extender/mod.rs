//! The scheduler extender: kube-scheduler's filter, prioritize, bind and preempt over HTTP,
//! answered from the index's per-node ledgers. It may not watch the cluster (`cluster` feeds the
//! index) nor write a Pod except through `cluster::binding`; bind records its own decision only.

pub mod bind;
pub mod conflicts;
pub mod filter;
pub mod holds;
pub mod nudge;
mod pending;
pub mod preempt;
pub mod prescore;
pub mod prioritize;
pub mod routes;
pub mod self_preempt;
pub mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;

use crate::cluster::binding::{BindingWriter, KubeBinder, MemoryBinder};
use crate::cluster::index::Index;
use crate::cluster::profile::store::ProfileStore;
pub use crate::cluster::watch::Readiness;
use crate::flags::{ClientArgs, parse_duration};
use crate::metrics::extender::{ExtenderMetrics, ReasonLabels};
use crate::model::estimate::Platform;
use crate::placement::memo::ClassIds;
use crate::placement::{FitConfig, PodClass, PodKey, ScoringPolicy, ShapeStats};
use peakfit_core::learn::{LearnMode, LearnPolicy};

#[derive(Clone, Debug, clap::Args)]
pub struct ExtenderArgs {
    /// Address to serve the extender verbs on (kube-scheduler calls it over loopback).
    #[arg(long, env = "PEAKFIT_LISTEN", default_value = "127.0.0.1:8888")]
    pub listen: SocketAddr,
    /// A second address serving only GET /metrics, /healthz and /readyz, for Prometheus and
    /// the kubelet's probes while the verbs stay on loopback (off unless set).
    #[arg(long, env = "PEAKFIT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub client: ClientArgs,
    /// Serve from a file of Node, Pod and `NodeGpuReport` objects (a `List` or multi-document
    /// YAML) instead of a cluster; bind then records in memory and logs.
    #[arg(long, env = "PEAKFIT_FROM_FILE")]
    pub from_file: Option<PathBuf>,
    /// Watch ConfigMaps labelled `peakfit.io/model-config: "true"` so that pods can name one
    /// in `peakfit.io/model-config` (`true`/`false`). `false` starts no such watch (the
    /// extender then needs no access to ConfigMaps) and refuses pods naming a ConfigMap with
    /// this flag named. Cluster mode only: `--from-file` reads the ConfigMaps in its file.
    #[arg(
        long,
        env = "PEAKFIT_MODEL_CONFIG_WATCH",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub model_config_watch: bool,
    /// Watch `resource.k8s.io/v1` `ResourceSlices` to learn which nodes a DRA GPU driver
    /// (`--gpu-dra-drivers`) publishes devices on, refusing them while their agent cannot read
    /// the kubelet's `PodResources` API (`true`/`false`). Off with `false`, with
    /// `--gpu-dra-drivers none`, or where the API server does not serve `resource.k8s.io/v1`
    /// (before Kubernetes 1.34): then only device-plugin nodes are refused. Cluster mode only.
    #[arg(
        long,
        env = "PEAKFIT_RESOURCE_SLICE_WATCH",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub resource_slice_watch: bool,
    /// How prioritize ranks the nodes that fit.
    #[arg(
        long,
        env = "PEAKFIT_SCORING",
        default_value_t = ScoringPolicy::Peakfit,
        value_parser = scoring_parser()
    )]
    pub scoring: ScoringPolicy,
    /// Kept free on every GPU on top of a pod's peak (Kubernetes quantity).
    #[arg(long, env = "PEAKFIT_SAFETY_MARGIN", default_value = "256Mi", value_parser = parse_bytes)]
    pub safety_margin: u64,
    /// NVML's memory for a process right after its first CUDA call on the nodes' driver and
    /// CUDA, counted in every modelled pod's peak (default: 0.598 GiB, measured on an H200 with
    /// driver 580 and CUDA 13; set the figure of your nodes' stack, e.g. `nvidia-smi` after
    /// `torch.zeros(1, device="cuda")`).
    #[arg(long, env = "PEAKFIT_CUDA_CONTEXT", value_parser = parse_cuda_context)]
    pub cuda_context: Option<u64>,
    /// A node whose GPU report is older than this is not schedulable (e.g. `120s`, `2m`).
    /// Ignored with --from-file: a file is a snapshot, and the age of its reports says nothing
    /// about live agents.
    #[arg(long, env = "PEAKFIT_MAX_REPORT_AGE", default_value = "120s", value_parser = parse_duration)]
    pub max_report_age: Duration,
    // A node whose allocatable advertises one of these resources, or that a listed DRA driver
    // publishes devices on, is refused while its agent reports the kubelet's `PodResources` API
    // unreadable: a GPU handed out then would look free.
    #[command(flatten)]
    pub gpu: crate::flags::GpuResourceArgs,
    /// How often a background thread scores the workload's usual pod classes on nodes that
    /// changed, so prioritize answers the first pod of a new run from memory (e.g. `100ms`;
    /// `0`: never). It runs at the lowest CPU priority, and while it runs a new shape mix is used
    /// only once it has scored the mix's usual classes everywhere.
    #[arg(long, env = "PEAKFIT_PRESCORE_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub prescore_interval: Duration,
    /// While pods wait, how often to look for nodes that gained GPU memory or turned usable again
    /// (a fresh report, NVML or `PodResources` read again) and annotate them
    /// (`peakfit.io/capacity-changed-at`) so kube-scheduler retries the waiting pods at once
    /// instead of after its 5-minute flush (`0`: never). Cluster mode only; needs `patch` on
    /// nodes.
    #[arg(long, env = "PEAKFIT_NUDGE_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub nudge_interval: Duration,
    /// How long a pod with priority must have waited, refused by filter on nodes where only
    /// peakfit refuses it, with no preemption by kube-scheduler reaching `/preempt` for it, before
    /// the extender evicts lower-priority pods for it itself (Eviction API, so `PodDisruptionBudgets`
    /// hold) and nominates the node (`0`: never). kube-scheduler v1.36 cannot preempt where its
    /// node-level count of GPU memory needs no victim (a one-GPU pod on a node whose GPUs are each
    /// too full). Cluster mode only; needs `create` on pods/eviction and events, `patch` on
    /// pods/status.
    #[arg(long, env = "PEAKFIT_SELF_PREEMPT_AFTER", default_value = "5s", value_parser = parse_duration)]
    pub self_preempt_after: Duration,
    /// The largest request body read (Kubernetes quantity). The largest real request, a
    /// full-node filter for 5,000 Nodes, is about 6 MiB; a larger body gets a 413.
    #[arg(long, env = "PEAKFIT_MAX_BODY_BYTES", default_value = "32Mi", value_parser = parse_bytes)]
    pub max_body_bytes: u64,
    /// Request bytes being read or answered at once, all requests together: a request waits
    /// (up to --body-timeout, then 503) for room, so memory stays bounded however many large
    /// requests arrive together. At least --max-body-bytes. A request without Content-Length
    /// counts as --max-body-bytes (kube-scheduler always sends one).
    #[arg(long, env = "PEAKFIT_MAX_BODY_BYTES_IN_FLIGHT", default_value = "64Mi", value_parser = parse_bytes)]
    pub max_body_bytes_in_flight: u64,
    /// Filter answers with only this many of the nodes a peakfit pod fits, the ones prioritize
    /// scores highest (`0`: every node that fits). kube-scheduler's scheduling cycle is serial
    /// and runs its score plugins, prioritize and both JSON payloads over every node filter
    /// passes (~420 of a 1,000-node cluster); with one node left it skips all three. Pods
    /// that fit nowhere, pods without peakfit annotations, pods with a preferred node
    /// affinity, pod affinity or anti-affinity term or a `ScheduleAnyway` spread constraint,
    /// and pods of a `ReplicaSet`, `StatefulSet` or `ReplicationController` without spread
    /// constraints of their own (kube-scheduler's default spread) get every node that fits:
    /// kube-scheduler's score plugins weigh those.
    #[arg(long, env = "PEAKFIT_FILTER_KEEP_BEST", default_value_t = DEFAULT_FILTER_KEEP_BEST)]
    pub filter_keep_best: usize,
    #[command(flatten)]
    pub learn: LearnArgs,
    #[command(flatten)]
    pub holds: holds::HoldArgs,
    #[command(flatten)]
    pub serve: crate::serve::ServeArgs,
}

/// Learning from what pods used (issue 21): the `GpuWorkloadProfiles` and the sizing from them.
#[derive(Clone, Debug, clap::Args)]
pub struct LearnArgs {
    /// Which pods are sized from what their workload's pods were seen to use: `off`,
    /// `predicted` (pods the model sizes) or `all` (also pods that set `peakfit.io/vram`).
    /// Anything but `off` watches `GpuWorkloadProfiles`, and the replica holding the profile
    /// Lease writes them.
    #[arg(long, env = "PEAKFIT_LEARN", default_value_t = LearnMode::Predicted, value_parser = learn_mode_parser())]
    pub learn: LearnMode,
    /// Fraction added above a workload's observed per-GPU peak when a pod is sized from it
    /// (0 to 10; 0.05 = 5 %).
    #[arg(long, env = "PEAKFIT_LEARN_MARGIN", default_value_t = LearnPolicy::DEFAULT_MARGIN)]
    pub learn_margin: f64,
    /// How long a pod must have run before its peak may size its workload below the prediction
    /// (default 6h: the usage profiles' pods took up to 311 min to come within 5 % of their
    /// peak).
    #[arg(long, env = "PEAKFIT_LEARN_MIN_RUNTIME", value_parser = parse_duration)]
    pub learn_min_runtime: Option<Duration>,
    /// A profile whose workload was not seen running for this long is deleted.
    #[arg(long, env = "PEAKFIT_PROFILE_TTL", default_value = "168h", value_parser = parse_duration)]
    pub profile_ttl: Duration,
    /// How often the profile leader folds the agents' observations into profiles.
    #[arg(long, env = "PEAKFIT_PROFILE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub profile_interval: Duration,
    /// Workloads exported per `peakfit_workload_*` metric, the largest observed peaks first;
    /// the others are counted in `peakfit_workload_series_dropped`.
    #[arg(long, env = "PEAKFIT_PROFILE_METRICS_TOP", default_value_t = 100)]
    pub profile_metrics_top: usize,
    /// Namespace of the profile Lease (`peakfit-profiles`); the chart sets the pod's own.
    #[arg(
        long,
        env = "PEAKFIT_PROFILE_LEASE_NAMESPACE",
        default_value = "peakfit"
    )]
    pub profile_lease_namespace: String,
    /// This replica's name on the profile Lease; the chart sets the pod's name (default: the
    /// host name and process id).
    #[arg(long, env = "PEAKFIT_PROFILE_LEASE_IDENTITY")]
    pub profile_lease_identity: Option<String>,
}

impl LearnArgs {
    /// The policy the flags say, checked.
    pub fn policy(&self) -> anyhow::Result<LearnPolicy> {
        let policy = LearnPolicy {
            mode: self.learn,
            margin: self.learn_margin,
            min_runtime_secs: self
                .learn_min_runtime
                .map_or(LearnPolicy::DEFAULT_MIN_RUNTIME_SECS, |d| d.as_secs()),
            min_pods_down: LearnPolicy::DEFAULT_MIN_PODS_DOWN,
        };
        policy.validate().context("--learn-margin")?;
        Ok(policy)
    }
}

fn learn_mode_parser() -> impl clap::builder::TypedValueParser<Value = LearnMode> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(LearnMode::ALL.map(LearnMode::as_str)).map(|s| {
        s.parse()
            .expect("the possible values are the modes' own names")
    })
}

pub use crate::serve::BodyLimits;

/// A byte quantity in Kubernetes syntax (`256Mi`, `1G`, `1073741824`).
/// `--scoring` takes the core's policy names; the core has no clap, so the possible values (which
/// `--help` lists and clap checks) are built here from `ScoringPolicy::ALL`.
fn scoring_parser() -> impl clap::builder::TypedValueParser<Value = ScoringPolicy> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(ScoringPolicy::ALL.map(ScoringPolicy::as_str)).map(
        |s| {
            s.parse()
                .expect("the possible values are the policies' own names")
        },
    )
}

/// A CUDA context size: a quantity of at most 16 GiB (no context comes near; a larger value is
/// a unit mistake).
fn parse_cuda_context(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if bytes > 16 << 30 {
        return Err(format!(
            "{s:?}: at most 16Gi (a CUDA context is about 0.3-1 GiB)"
        ));
    }
    Ok(bytes)
}

pub fn parse_bytes(s: &str) -> Result<u64, String> {
    crate::model::quantity::parse_bytes(s).map_err(|e| e.to_string())
}

/// Names the pod (`namespace/name`) on the verb's span, once the request is decoded.
pub(crate) fn record_pod(pod: &k8s_openapi::api::core::v1::Pod) {
    let m = &pod.metadata;
    let pod = format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    );
    tracing::Span::current().record("pod", crate::clip::clip(&pod).as_ref());
}

/// The GPU models (as the agents name them) that a pod's product selector allows, each once,
/// in the order the pod lists them. Linear in the list: each product is looked up by its dashed
/// form. Products no reported GPU carries are left out (they match no GPU), but when none
/// matches, the first one, cut to [`crate::clip::MAX_USER_BYTES`], stays, so that the class still
/// refuses every GPU and says which model it wanted: a pod listing 242,234 products (issue 24)
/// neither costs seconds per request nor carries them into the class, the shape mix and the reply.
fn gpu_models_of<'a>(
    products: &[String],
    models: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    use crate::cluster::resources::product_matches;
    let dashed = |s: &str| s.replace(' ', "-");
    let mut by_label: HashMap<String, Vec<&String>> = HashMap::new();
    for m in models {
        by_label.entry(dashed(m)).or_default().push(m);
    }
    let mut taken: std::collections::HashSet<&String> = std::collections::HashSet::new();
    let mut out = Vec::new();
    for p in products {
        if let Some(m) = by_label
            .get(&dashed(p))
            .and_then(|ms| ms.iter().find(|m| product_matches(p, m)))
            && taken.insert(m)
        {
            out.push((*m).clone());
        }
    }
    if out.is_empty()
        && let Some(first) = products.first()
    {
        out.push(crate::clip::clip(first).into_owned());
    }
    out
}

/// How many resolvable nodes a waiting pod keeps for `self_preempt`.
pub const PREEMPTIBLE_NODES_KEPT: usize = 64;

/// `--filter-keep-best`'s default (the chart's `extender.filterKeepBest` must equal it;
/// tests/chart.rs checks): one node. kube-scheduler takes a lone feasible node without scoring
/// (`schedulePod`, "When only one node after predicate, just use it"), so its serial cycle
/// skips its score plugins over ~420-500 nodes and the prioritize call with both JSON
/// payloads; with the chart's profile (the resource score plugins off) the node it then gets
/// is the one prioritize gives 10, which its scores would have chosen for a pod no other
/// plugin weighs, and the pods other plugins do weigh (`index::soft_preference`, kube-
/// scheduler's default spread of a controller's pods among them) get every node. Measured
/// (`benches/scheduler_throughput.rs`, README "One node: the default"), with refusals that
/// group (`filter::NODE_FIGURES_UP_TO`): peakfit's rate over the default profile's, b/a, 0.84-0.87
/// at 1,000 nodes and a median of 0.91 at 5,000 (spread), 0.95 and 2.48-2.56 under contention,
/// where the cut off gave 0.57-0.79; N = 8-32 left the scoring and the prioritize call in the
/// cycle and bought no clear throughput.
pub const DEFAULT_FILTER_KEEP_BEST: usize = 1;

/// Everything a request needs; shared by every handler.
pub struct Extender {
    pub index: Arc<Index>,
    /// The workload profiles and the `--learn` policy: pending pods are sized from them.
    pub profiles: Arc<ProfileStore>,
    /// Set with `with_fit` (and `scoring` with `with_scoring`): prioritize's memo assumes
    /// they do not change under it.
    pub fit: FitConfig,
    pub scoring: ScoringPolicy,
    pub binder: Arc<dyn BindingWriter>,
    pub metrics: Arc<ExtenderMetrics>,
    pub readiness: Readiness,
    /// The pod shapes filter has seen lately: peakfit scoring weighs fragmentation by them.
    shapes: Mutex<ShapeStats>,
    /// Ids for the classes prioritize scores, the third part of a node's memo key; one table
    /// per extender, because the memo also depends on its policy and fit configuration.
    class_ids: Mutex<ClassIds>,
    /// What the prescorer's last pass kept warm.
    warmed: Mutex<prescore::Warmed>,
    /// Pods filter refused on every node (`pending`): recorded from the request, before the
    /// Pod watch may have shown them.
    pending: Mutex<pending::PendingPods>,
    /// Nodes filter refused as a whole (report missing or stale, NVML or `PodResources` down)
    /// since the nudger last looked: it counts them as having offered nothing then, so one that
    /// recovered within a tick is still nudged (`nudge`).
    refused_whole: Mutex<std::collections::HashSet<String>>,
    /// Whether a nudger runs (`nudge::spawn`): without one nobody takes `refused_whole`, so
    /// filter notes nothing there.
    nudging: std::sync::atomic::AtomicBool,
    /// When `/preempt` last named each pod peakfit places: the scheduler's own preemption
    /// reached the extender for it, so `self_preempt` leaves it to the scheduler.
    preempt_calls: Mutex<HashMap<PodKey, std::time::Instant>>,
    /// One bind at a time per pod.
    bind_locks: bind::PodLocks,
    /// Holds for pods that starve (`--reserve-*`); `None`: none are made.
    holds: Option<holds::HoldSettings>,
    hold_writes: holds::InFlight,
    /// When holds were turned on (Unix seconds): holds past their deadline by then expired
    /// before this replica watched them, and `sweep_holds` does not count them.
    holds_since: i64,
    clock: fn() -> i64,
    /// `--filter-keep-best` (0: off).
    filter_keep_best: usize,
    /// Request body limits (see `routes::receive`).
    pub body: BodyLimits,
    /// `/metrics` as last rendered (`with_scrape_max_age`; the binary's is a second).
    pub scrape: crate::metrics::RenderCache,
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl Extender {
    pub fn new(
        index: Arc<Index>,
        metrics: Arc<ExtenderMetrics>,
        binder: Arc<dyn BindingWriter>,
    ) -> Self {
        Self {
            index,
            profiles: Arc::default(),
            fit: FitConfig::default(),
            scoring: ScoringPolicy::default(),
            binder,
            metrics,
            readiness: Readiness::default(),
            shapes: Mutex::new(ShapeStats::default()),
            class_ids: Mutex::new(ClassIds::default()),
            warmed: Mutex::new(prescore::Warmed::default()),
            pending: Mutex::default(),
            refused_whole: Mutex::default(),
            nudging: std::sync::atomic::AtomicBool::new(false),
            preempt_calls: Mutex::new(HashMap::new()),
            bind_locks: bind::PodLocks::default(),
            holds: None,
            hold_writes: holds::InFlight::default(),
            holds_since: 0,
            clock: now_unix,
            filter_keep_best: 0,
            body: BodyLimits::default(),
            scrape: crate::metrics::RenderCache::new(Duration::ZERO),
        }
    }

    /// Serves a rendered `/metrics` again for `max_age` (zero: render every scrape).
    pub fn with_scrape_max_age(mut self, max_age: Duration) -> Self {
        self.scrape = crate::metrics::RenderCache::new(max_age);
        self
    }

    /// Filter answers with only the `n` fitting nodes prioritize scores highest (0: all).
    pub fn with_filter_keep_best(mut self, n: usize) -> Self {
        self.filter_keep_best = n;
        self
    }

    pub fn with_body_limits(mut self, body: BodyLimits) -> Self {
        self.body = body;
        self
    }

    /// Also starts a new class table, so no score remembered under the old configuration is
    /// read under the new one.
    pub fn with_fit(mut self, fit: FitConfig) -> Self {
        self.fit = fit;
        self.class_ids = Mutex::new(ClassIds::default());
        self
    }

    /// Also starts a new class table (see `with_fit`).
    pub fn with_scoring(mut self, scoring: ScoringPolicy) -> Self {
        self.scoring = scoring;
        self.class_ids = Mutex::new(ClassIds::default());
        self
    }

    /// Sizes pending pods from these profiles (the store's policy says how).
    pub fn with_profiles(mut self, profiles: Arc<ProfileStore>) -> Self {
        self.profiles = profiles;
        self
    }

    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// A fixed clock, for tests that need reports of a known age.
    pub fn with_clock(mut self, clock: fn() -> i64) -> Self {
        self.clock = clock;
        self
    }

    /// The shape mix prioritize scores with now (learned from the pods filter has seen).
    pub fn mix(&self) -> Arc<crate::placement::ShapeMix> {
        self.shapes.lock().mix()
    }

    /// A new mix waiting for the prescorer to warm it before prioritize switches to it
    /// (`ShapeStats::stage_new_mixes`, on while the prescorer runs).
    pub fn staged_mix(&self) -> Option<Arc<crate::placement::ShapeMix>> {
        self.shapes.lock().staged()
    }

    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    /// The class placement sees for a pod: its GPU shape, the CPU kube-scheduler counts for it
    /// (so CPU balance scores as in the simulation), and the GPU models its product selector
    /// allows, named as the agents report them. Filter, prioritize and bind all build it here,
    /// so the three agree and the memo's class ids are stable.
    pub(crate) fn class_of(
        &self,
        req: &crate::model::PodRequest,
        host: &crate::cluster::resources::HostRequest,
    ) -> PodClass {
        let mut class = PodClass::from(req.shape());
        class.cpu_milli = host.cpu_milli;
        if !host.gpu_products.is_empty() {
            let (_, models) = self.index.gpu_capacity();
            class.gpu_models = gpu_models_of(&host.gpu_products, models.keys());
        }
        class
    }

    /// The request a pending pod is placed with: its own, sized from its workload's profile
    /// under `--learn` (issue 21, item 4). Filter, prioritize, bind and preempt all size here,
    /// so the four agree; a changed profile changes the size, hence the class, so no memoised
    /// score of the old size is read for it.
    pub(crate) fn sized(
        &self,
        request: &crate::model::PodRequest,
        workload: impl FnOnce() -> Option<crate::cluster::workload::WorkloadKey>,
        explicit: bool,
    ) -> crate::cluster::profile::store::Sizing {
        self.profiles.size(request, workload, explicit)
    }

    /// [`Extender::sized`] for a pod object.
    pub(crate) fn sized_pod(
        &self,
        request: &crate::model::PodRequest,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> crate::cluster::profile::store::Sizing {
        self.sized(
            request,
            || Some(crate::cluster::workload::workload_of(pod)),
            crate::cluster::index::is_explicit(pod),
        )
    }

    /// Counts a pod in the shape mix once (by its key, however often it is filtered), after
    /// telling the mix the cluster's GPUs per model if they changed.
    pub(crate) fn learn(&self, key: &str, class: &PodClass) {
        let generation = self.index.gpu_capacity_generation();
        let mut shapes = self.shapes.lock();
        shapes.sync_capacity(generation, || {
            self.index
                .gpu_capacity()
                .1
                .into_iter()
                .map(|(m, n)| (m, n as f64))
        });
        shapes.observe_pod(key, class);
    }

    /// Records that kube-scheduler's preemption asked about this pod (see `preempt_calls`).
    pub(crate) fn note_preempt_call(&self, key: &str) {
        let mut calls = self.preempt_calls.lock();
        // Bounded by the pods that exist: forget the others whenever it grows.
        if calls.len() >= 1024 {
            calls.retain(|k, _| self.index.contains_pod(k));
        }
        calls.insert(key.to_owned(), std::time::Instant::now());
    }

    /// When `/preempt` last named this pod, if it did.
    pub(crate) fn last_preempt_call(&self, key: &str) -> Option<std::time::Instant> {
        self.preempt_calls.lock().get(key).copied()
    }

    /// Records that filter refused pod `key` everywhere for `reason` (`None`: it did not, or
    /// the pod is bound), whether or not the index has shown the pod yet (`pending`).
    fn set_pending(&self, key: &str, reason: Option<&'static str>, preemptible: Vec<String>) {
        let Some(reason) = reason else {
            self.pending.lock().remove(key);
            return;
        };
        // Asked before the table's lock is taken; the sweep takes them the other way round.
        let shown = self.index.contains_pod(key);
        let now = std::time::Instant::now();
        let mut p = self.pending.lock();
        if !shown && p.sweep_due(now) {
            p.sweep(now, |k| self.index.pod_bound(k));
        }
        if !p.refused(key, reason, preemptible, shown, (self.now(), now)) {
            tracing::debug!(pod = %key, "too many refused pods the Pod watch has not shown; not recorded");
        }
    }

    /// The refused pods after forgetting those bound, deleted, or never shown by the Pod watch
    /// (`pending`), locked.
    fn pending_swept(&self) -> parking_lot::MutexGuard<'_, pending::PendingPods> {
        let mut p = self.pending.lock();
        p.sweep(std::time::Instant::now(), |k| self.index.pod_bound(k));
        p
    }

    /// Writes the pending-pod gauges (scrape time), first forgetting pods that no longer exist
    /// (deleted while pending: no later filter would have cleared them) or are bound
    /// (`pending_swept`).
    pub fn refresh_pending_gauges(&self) {
        self.sweep_holds();
        let now = self.now();
        let p = self.pending_swept();
        // Per reason: how many pods wait, and for how long the oldest has.
        let mut by_reason: HashMap<&'static str, (i64, i64)> = HashMap::new();
        for (_, e) in p.iter() {
            let r = by_reason.entry(e.reason).or_default();
            r.0 += 1;
            r.1 = r.1.max(now - e.since_unix);
        }
        self.metrics.pending_pods.clear();
        self.metrics.pending_pod_oldest.clear();
        for (reason, (n, oldest)) in by_reason {
            let labels = ReasonLabels { reason };
            self.metrics.pending_pods.get_or_create(&labels).set(n);
            self.metrics
                .pending_pod_oldest
                .get_or_create(&labels)
                .set(oldest as f64);
        }
    }
}

/// The profile leader's loop, on a Lease in `--profile-lease-namespace` held for three intervals
/// (at least 15 s), so a replica that stops renewing hands over within that.
fn spawn_profile_writer(
    client: &kube::Client,
    index: &Arc<Index>,
    profiles: &Arc<ProfileStore>,
    learn: &LearnArgs,
) {
    use crate::cluster::profile::{leader, writer};
    let identity = learn.profile_lease_identity.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "peakfit-extender".into()),
            std::process::id()
        )
    });
    let lease = leader::ProfileLease::new(
        kube::Api::namespaced(client.clone(), &learn.profile_lease_namespace),
        identity,
        (learn.profile_interval * 3).max(Duration::from_secs(15)),
    );
    writer::spawn(
        client.clone(),
        index.clone(),
        profiles.clone(),
        lease,
        writer::WriterConfig {
            interval: learn.profile_interval,
            ttl: learn.profile_ttl,
        },
    );
}

pub async fn run(args: ExtenderArgs) -> anyhow::Result<()> {
    let platform = args
        .cuda_context
        .map_or_else(Platform::default, |cuda_context| Platform { cuda_context });
    let gpu_resources = args.gpu.parse()?;
    let dra_drivers = !gpu_resources.dra_drivers().is_empty();
    let index = Arc::new(Index::with_platform(platform).with_gpu_resources(gpu_resources));
    let policy = args.learn.policy()?;
    let profiles = Arc::new(ProfileStore::default());
    profiles.set_policy(policy);
    let metrics = Arc::new(
        ExtenderMetrics::with_index(index.clone(), now_unix).with_profiles(
            profiles.clone(),
            args.learn.profile_metrics_top,
            now_unix,
        ),
    );
    let fit = FitConfig {
        safety_margin_bytes: args.safety_margin,
        // A file is a snapshot: the age of its reports says nothing about live agents.
        max_report_age_secs: args
            .from_file
            .is_none()
            .then(|| i64::try_from(args.max_report_age.as_secs()).unwrap_or(i64::MAX)),
    };
    // The stale-report alert compares each node's report age with this, so it follows the flag.
    metrics
        .node_report_age_limit
        .set(fit.max_report_age_secs.unwrap_or(0) as f64);
    let learning = policy.mode != LearnMode::Off;
    let mut nudge_client = None;
    let (binder, readiness): (Arc<dyn BindingWriter>, Readiness) = match &args.from_file {
        Some(path) => {
            let n = crate::cluster::file::load_into(&index, path)
                .with_context(|| format!("loading {}", path.display()))?;
            // The file's profiles size its pods as the cluster's would (`--learn off` ignores them).
            let learned = if learning {
                crate::cluster::file::load_profiles_into(&profiles, path)
                    .with_context(|| format!("loading the profiles of {}", path.display()))?
            } else {
                0
            };
            tracing::info!(path = %path.display(), objects = n, profiles = learned, "serving from a file; bind records in memory");
            (Arc::new(MemoryBinder::default()), Readiness::default())
        }
        None => {
            let client = args.client.client().await?;
            // Whether the API server serves them is asked in the watch's task (until it
            // answers), not here: the probes and the other watches need not wait for it.
            let resource_slices = args.resource_slice_watch && dra_drivers;
            let readiness = Readiness::waiting_for(crate::cluster::watch::watches(
                args.model_config_watch,
                learning,
                resource_slices,
            ));
            if resource_slices {
                crate::cluster::watch::spawn_resource_slices(
                    client.clone(),
                    index.clone(),
                    readiness.clone(),
                );
            }
            crate::cluster::watch::spawn(
                client.clone(),
                index.clone(),
                readiness.clone(),
                args.model_config_watch,
            );
            if learning {
                crate::cluster::watch::spawn_profiles(
                    client.clone(),
                    profiles.clone(),
                    readiness.clone(),
                );
                spawn_profile_writer(&client, &index, &profiles, &args.learn);
            }
            nudge_client = Some(client.clone());
            (Arc::new(KubeBinder::new(client)), readiness)
        }
    };
    let ext = Arc::new(
        Extender::new(index, metrics, binder)
            .with_profiles(profiles)
            .with_fit(fit)
            .with_scoring(args.scoring)
            .with_filter_keep_best(args.filter_keep_best)
            .with_holds(args.holds.settings())
            .with_readiness(readiness)
            .with_scrape_max_age(crate::metrics::SCRAPE_MAX_AGE)
            .with_body_limits(BodyLimits::new(
                args.max_body_bytes,
                args.max_body_bytes_in_flight,
                args.serve.body_timeout,
            )),
    );
    if !args.prescore_interval.is_zero() {
        ext.spawn_prescorer(args.prescore_interval)
            .context("starting the prescore thread")?;
    }
    if let Some(client) = &nudge_client
        && !args.self_preempt_after.is_zero()
    {
        self_preempt::spawn(ext.clone(), client.clone(), args.self_preempt_after);
    }
    if let Some(client) = &nudge_client {
        conflicts::spawn(ext.clone(), client.clone(), conflicts::INTERVAL);
    }
    if ext.holds.is_some() {
        holds::spawn_sweeper(ext.clone());
    }
    if let Some(client) = nudge_client
        && !args.nudge_interval.is_zero()
    {
        nudge::spawn(ext.clone(), client, args.nudge_interval);
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let stop = crate::shutdown::Stop::on_signal();
    let ops = match args.metrics_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr} (metrics)"))?;
            tracing::info!(listen = %addr, "serving /metrics, /healthz, /readyz");
            let (app, serve_args, stop) = (
                routes::ops_router(ext.clone()),
                args.serve.clone(),
                stop.clone(),
            );
            Some(tokio::spawn(async move {
                crate::serve::serve(l, crate::serve::plain, app, &serve_args, stop.stopped()).await;
            }))
        }
        None => None,
    };
    let probes = crate::serve::spawn_probes(
        &args.serve,
        routes::probe_router(ext.clone()),
        stop.stopped(),
    )
    .await?;
    tracing::info!(listen = %args.listen, scoring = ?args.scoring, "peakfit extender serving");
    crate::serve::serve(
        listener,
        crate::serve::plain,
        routes::router(ext),
        &args.serve,
        stop.stopped(),
    )
    .await;
    if let Some(ops) = ops {
        ops.await?;
    }
    if let Some(probes) = probes {
        probes.await?;
    }
    tracing::info!("peakfit extender stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_models_are_the_reported_ones_each_once_in_the_pod_s_order() {
        let models = ["NVIDIA L4".to_owned(), "NVIDIA A100-SXM4-40GB".to_owned()];
        let products: Vec<String> = [
            "NVIDIA-A100-SXM4-40GB",
            "not-a-gpu",
            "NVIDIA-L4",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA-L4",
        ]
        .map(str::to_owned)
        .into();
        assert_eq!(
            gpu_models_of(&products, &models),
            ["NVIDIA A100-SXM4-40GB", "NVIDIA L4"]
        );
        // None reported: the first product stays (cut), so the class still refuses every GPU.
        let unknown = vec!["H".repeat(100_000), "B200".to_owned()];
        let only = gpu_models_of(&unknown, &models);
        assert_eq!(only.len(), 1);
        assert!(only[0].len() < crate::clip::MAX_USER_BYTES + 32);
        // A long list of distinct products is one class of the reported models (before: the
        // whole list, carried into the class, the shape mix and the reply's words).
        let many: Vec<String> = (0..50_000)
            .map(|i| format!("gpu-{i}"))
            .chain(["NVIDIA-L4".to_owned()])
            .collect();
        assert_eq!(gpu_models_of(&many, &models), ["NVIDIA L4"]);
    }

    #[test]
    fn quantities_and_durations() {
        assert_eq!(parse_bytes("256Mi"), Ok(256 << 20));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert!(parse_bytes("12 bananas").is_err());
        assert!(parse_bytes("-1Gi").is_err());
    }
}
