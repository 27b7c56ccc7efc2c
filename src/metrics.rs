//! Serving prometheus-client registries over HTTP, shared by the agent and the extender, and the
//! extender's metrics. It reads the index (at scrape) but may not change it.

use std::time::Duration;

use tokio::time::Instant;

use axum::body::Bytes;
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;

/// The content type prometheus-client's text encoder writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The text exposition of `registry`.
pub fn encode(registry: &Registry) -> Result<Bytes, String> {
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, registry)
        .map(|()| Bytes::from(body))
        .map_err(|e| e.to_string())
}

fn reply(body: Result<Bytes, String>, gzip: bool) -> Response {
    match body {
        Ok(body) if gzip => (
            [(CONTENT_TYPE, OPENMETRICS), (CONTENT_ENCODING, "gzip")],
            body,
        )
            .into_response(),
        Ok(body) => ([(CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

/// Whether the scraper takes a gzip body. Prometheus sends `Accept-Encoding: gzip` on every
/// scrape; a `q=0` refusal is honoured, other weights are not weighed (gzip is the only coding
/// offered).
pub fn accepts_gzip(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// `body` gzipped at the fastest level: metrics text shrinks about tenfold even there, and the
/// render it follows costs more.
fn gzipped(body: &Bytes) -> Result<Bytes, String> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    gz.write_all(body)
        .and_then(|()| gz.finish())
        .map(Bytes::from)
        .map_err(|e| format!("compressing the metrics failed: {e}"))
}

/// How long a rendered `/metrics` is served again: the binaries render at most once a second.
pub const SCRAPE_MAX_AGE: Duration = Duration::from_secs(1);

/// One render: when, the text (or why it failed), and its gzip once a scraper asked for it.
struct Render {
    /// Counts renders, so a peer that was served this one is known to have it.
    generation: u64,
    at: Instant,
    body: Result<Bytes, String>,
    gzip: Option<Result<Bytes, String>>,
}

/// `/metrics` as last rendered, served again to every scrape within `max_age` of it. At 5,000
/// nodes a render is 14 MB and tens of milliseconds of CPU; eight scrapers rendering each their
/// own took prioritize's p50 from 2.5 ms to 291 ms (issue 24). One scrape renders, on
/// a thread of lower priority (`crate::background`, nice 10), while the others wait for its
/// result instead of rendering again: on a busy machine the verbs get the cores first.
///
/// A scraper that accepts gzip (Prometheus does) gets the render compressed, once per render:
/// copying 14 MB into a socket per scrape was what was left of the scrapers' cost (eight of
/// them still took prioritize's p50 ×2.84 with the cached render; `cargo bench --bench
/// hardening`, `PEAKFIT_BENCH_ONLY=scrape`).
///
/// And a peer asking again for the render it already has waits for the next one: eight
/// scrapers on one machine asking back to back still took prioritize's p50 ×1.90 with gzip (the
/// kernel copying and the clients reading 1.1 MB 700 times a second, on a 2-core machine), and a
/// repeat within the second carries nothing new. No scraper at a sane interval ever waits.
pub struct RenderCache {
    max_age: Duration,
    last: tokio::sync::Mutex<Option<Render>>,
    /// The render each peer address was last served, for the current render only (cleared at
    /// each new one, so it holds at most the peers of one `max_age`).
    seen: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, u64>>,
}

impl RenderCache {
    /// `Duration::ZERO` renders every scrape (the library's default, for tests that read a
    /// change at once).
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            last: tokio::sync::Mutex::new(None),
            seen: parking_lot::Mutex::default(),
        }
    }

    /// The last render if younger than `max_age`, else a new one by `render` (an [`encode`],
    /// after refreshing what is written at scrape time); gzipped when `gzip`. `peer`, when
    /// known, waits for the next render if it was served this one.
    pub async fn serve(
        &self,
        gzip: bool,
        peer: Option<std::net::IpAddr>,
        render: impl FnOnce() -> Result<Bytes, String> + Send + 'static,
    ) -> Response {
        if let Some(ip) = peer {
            let wait = {
                let last = self.last.lock().await;
                last.as_ref()
                    .filter(|r| self.seen.lock().get(&ip) == Some(&r.generation))
                    .map_or(Duration::ZERO, |r| {
                        self.max_age.saturating_sub(r.at.elapsed())
                    })
            };
            tokio::time::sleep(wait).await;
        }
        let mut last = self.last.lock().await;
        let fresh = last
            .as_ref()
            .filter(|r| r.at.elapsed() < self.max_age)
            .map(|r| (r.body.clone(), r.gzip.clone()));
        let (body, gz) = match fresh {
            Some((body, gz)) if !gzip || gz.is_some() || body.is_err() => (body, gz),
            Some((body, None)) => {
                let text = body.clone();
                let gz = Some(
                    crate::background::run(
                        "metrics-gzip",
                        crate::background::RENDER_NICE,
                        move || match &text {
                            Ok(text) => gzipped(text),
                            Err(e) => Err(e.clone()),
                        },
                    )
                    .await
                    .unwrap_or_else(|e| Err(format!("compressing the metrics failed: {e}"))),
                );
                if let Some(r) = last.as_mut() {
                    r.gzip.clone_from(&gz);
                }
                (body, gz)
            }
            _ => {
                let (body, gz) = crate::background::run(
                    "metrics-render",
                    crate::background::RENDER_NICE,
                    move || {
                        let body = render();
                        let gz =
                            gzip.then(|| body.as_ref().map_or_else(|e| Err(e.clone()), gzipped));
                        (body, gz)
                    },
                )
                .await
                .unwrap_or_else(|e| (Err(format!("rendering the metrics failed: {e}")), None));
                let generation = last.as_ref().map_or(0, |r| r.generation + 1);
                self.seen.lock().clear();
                *last = Some(Render {
                    generation,
                    at: Instant::now(),
                    body: body.clone(),
                    gzip: gz.clone(),
                });
                (body, gz)
            }
        };
        if let (Some(ip), Some(r)) = (peer, last.as_ref())
            && !self.max_age.is_zero()
        {
            self.seen.lock().insert(ip, r.generation);
        }
        match gz {
            Some(Ok(gz)) if gzip => reply(Ok(gz), true),
            _ => reply(body, false),
        }
    }
}

/// The extender's metrics. Per-request counters and histograms are written as requests are
/// answered; the ledger gauges (per GPU, node and reserved pod) are read from the index at scrape
/// time by [`extender::IndexCollector`], as linkerd's index metrics are, so a series exists
/// exactly as long as what it describes and nothing is forgotten by hand.
pub mod extender {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};

    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
    use prometheus_client::registry::Registry;

    use crate::cluster::index::{Index, free_outside_largest_gpu_ratio};
    use crate::cluster::profile::store::ProfileStore;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct VerbLabels {
        pub verb: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct ScoreSourceLabels {
        /// `memo` (prioritize found it), `computed` (prioritize scored the node), `prescored`
        /// (the background pass scored it ahead of the request).
        pub source: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct DecisionLabels {
        pub verb: &'static str,
        pub outcome: &'static str,
    }

    /// Defined beside the index, which counts its warnings with it; re-exported here with the
    /// extender's other label sets.
    pub use crate::cluster::index::ReasonLabels;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct PreferenceLabels {
        /// `SoftPreference::label`: four values.
        pub preference: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct OutcomeLabels {
        pub outcome: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct GpuLabels {
        pub node: String,
        pub uuid: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct NodeLabels {
        pub node: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct PodGpuLabels {
        pub namespace: String,
        pub pod: String,
        pub node: String,
        pub uuid: String,
    }

    type FloatGauge = Gauge<f64, AtomicU64>;
    type HistogramFamily = Family<VerbLabels, Histogram, fn() -> Histogram>;

    pub struct ExtenderMetrics {
        pub registry: Registry,
        pub request_duration: HistogramFamily,
        pub decisions: Family<DecisionLabels, Counter>,
        pub rejections: Family<ReasonLabels, Counter>,
        pub node_scores: Family<ScoreSourceLabels, Counter>,
        pub errors: Family<VerbLabels, Counter>,
        pub bind_conflicts: Counter,
        pub node_nudges: Counter,
        /// Fitting nodes filter left out of its answer under `--filter-keep-best`.
        pub filter_ranked_out: Counter,
        /// Filter calls answered with every fitting node although `--filter-keep-best` would
        /// have cut them, because the pod asks kube-scheduler to weigh a preference, by which.
        pub filter_keep_best_skipped: Family<PreferenceLabels, Counter>,
        pub node_report_age_limit: FloatGauge,
        pub pending_pods: Family<ReasonLabels, Gauge>,
        pub pending_pod_oldest: Family<ReasonLabels, FloatGauge>,
        /// Holds for starving pods in force (issue 22), as this replica's index has them.
        pub holds_active: Gauge,
        /// Holds this replica wrote.
        pub holds_made: Counter,
        /// Holds this replica saw reach their deadline before their pod bound (not those
        /// already past it when this replica started, which another process counted).
        pub holds_expired: Counter,
        /// Hold writes refused with a conflict, by what the pod read back led to: `retried`,
        /// `adopted` (another replica's hold), `given_up`.
        pub holds_write_conflicts: Family<OutcomeLabels, Counter>,
        /// Expired holds this replica removed from their pods.
        pub holds_cleared: Counter,
    }

    fn latency_histogram() -> Histogram {
        // 50 µs .. ~1.6 s: filter on a large cluster sits in the sub-millisecond buckets, and the
        // scheduler's 5 s timeout is past the top.
        Histogram::new(exponential_buckets(50e-6, 2.0, 16))
    }

    impl Default for ExtenderMetrics {
        fn default() -> Self {
            Self::new()
        }
    }

    impl ExtenderMetrics {
        pub fn new() -> Self {
            let mut registry = Registry::with_prefix("peakfit");
            let m = Self {
                registry: Registry::default(),
                request_duration: Family::new_with_constructor(latency_histogram),
                decisions: Family::default(),
                rejections: Family::default(),
                node_scores: Family::default(),
                errors: Family::default(),
                bind_conflicts: Counter::default(),
                node_nudges: Counter::default(),
                filter_ranked_out: Counter::default(),
                filter_keep_best_skipped: Family::default(),
                node_report_age_limit: FloatGauge::default(),
                pending_pods: Family::default(),
                pending_pod_oldest: Family::default(),
                holds_active: Gauge::default(),
                holds_made: Counter::default(),
                holds_expired: Counter::default(),
                holds_write_conflicts: Family::default(),
                holds_cleared: Counter::default(),
            };
            let r = &mut registry;
            r.register(
                "extender_request_duration_seconds",
                "Time to answer one extender call",
                m.request_duration.clone(),
            );
            r.register(
                "extender_decisions",
                "Extender calls by verb and outcome",
                m.decisions.clone(),
            );
            r.register(
                "extender_rejections",
                "Nodes refused by filter, by reason",
                m.rejections.clone(),
            );
            r.register(
                "extender_node_scores",
                "Node scores prioritize used (and filter, ranking the fitting nodes under \
                 --filter-keep-best), by where they came from: the memo of the node's state \
                 (shared by nodes alike), computed for the request, or computed ahead by the \
                 prescorer",
                m.node_scores.clone(),
            );
            r.register(
                "extender_errors",
                "Extender calls answered with an error",
                m.errors.clone(),
            );
            r.register(
                "extender_bind_conflicts",
                "Binds refused because the node's ledger changed since filter (another pod took the \
                 memory first); the scheduler retries them. Normal under contention, not an error",
                m.bind_conflicts.clone(),
            );
            r.register(
                "extender_node_nudges",
                "Node annotation bumps made so that kube-scheduler retries pods waiting for GPU \
                 memory or a fresh report once a node has them",
                m.node_nudges.clone(),
            );
            r.register(
                "extender_filter_ranked_out_nodes",
                "Nodes the pod fits that filter left out of its answer because prioritize ranks \
                 them below the best --filter-keep-best (not refusals: they are in no failed list)",
                m.filter_ranked_out.clone(),
            );
            r.register(
                "extender_filter_keep_best_skipped",
                "Filter calls that passed every fitting node although there were more than \
                 --filter-keep-best, because the pod has a preference kube-scheduler's score \
                 plugins weigh (preferred node affinity, pod affinity or anti-affinity, or \
                 ScheduleAnyway topology spread), by the first one found",
                m.filter_keep_best_skipped.clone(),
            );
            r.register(
                "node_report_age_limit_seconds",
                "The extender's staleness limit (--max-report-age): a node whose report is older \
                 gets no GPU pod; 0 in file mode, which does not check age",
                m.node_report_age_limit.clone(),
            );
            r.register(
                "pending_pods",
                "Pods whose last filter found no node, by reason",
                m.pending_pods.clone(),
            );
            r.register(
                "pending_pod_oldest_seconds",
                "How long the oldest pending pod has found no node, by the reason most nodes gave",
                m.pending_pod_oldest.clone(),
            );
            r.register(
                "holds_active",
                "Holds for pods that waited too long (peakfit.io/hold) in force now",
                m.holds_active.clone(),
            );
            r.register(
                "holds_made",
                "Holds this replica wrote on pods that waited too long and fit nowhere",
                m.holds_made.clone(),
            );
            r.register(
                "holds_expired",
                "Holds that reached their deadline before their pod bound while this replica ran",
                m.holds_expired.clone(),
            );
            r.register(
                "holds_write_conflicts",
                "Hold writes refused because the pod changed since filter read it (usually \
                 kube-scheduler's own status update), by what re-reading the pod led to: retried \
                 on its new version, adopted another replica's hold, or given up",
                m.holds_write_conflicts.clone(),
            );
            r.register(
                "holds_cleared",
                "Expired holds (peakfit.io/hold) this replica removed from their pending pods",
                m.holds_cleared.clone(),
            );
            Self { registry, ..m }
        }

        /// The metrics of an extender answering from `index`: [`ExtenderMetrics::new`] plus
        /// the ledger gauges, read from the index at each scrape with `clock` giving the time
        /// report ages are measured against.
        pub fn with_index(index: Arc<Index>, clock: fn() -> i64) -> Self {
            let mut m = Self::new();
            m.registry.register(
                "index_warnings",
                "Cluster objects the index refused or repaired, by reason (see the log)",
                index.warnings().clone(),
            );
            m.registry.register(
                "request_memo_hits",
                "Pod requests (the peak-memory model's answer for a pod) filter, prioritize, \
                 preempt and the pod watch found in the memo of requests, keyed by the model's \
                 inputs",
                index.request_memo().hits().clone(),
            );
            m.registry.register(
                "request_memo_misses",
                "Pod requests the extender worked out by running the model: a pod whose model \
                 inputs (annotations, its model-config ConfigMap) were not in the memo",
                index.request_memo().misses().clone(),
            );
            m.registry
                .register_collector(Box::new(IndexCollector { index, clock }));
            m
        }
    }

    impl ExtenderMetrics {
        /// Adds the per-workload gauges of `profiles` (at most `top` workloads).
        pub fn with_profiles(
            mut self,
            profiles: Arc<ProfileStore>,
            top: usize,
            clock: fn() -> i64,
        ) -> Self {
            self.registry.register_collector(Box::new(ProfileCollector {
                profiles,
                top,
                clock,
            }));
            self
        }
    }

    /// The ledger gauges, read from the index at scrape time.
    pub struct IndexCollector {
        index: Arc<Index>,
        clock: fn() -> i64,
    }

    impl std::fmt::Debug for IndexCollector {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("IndexCollector").finish_non_exhaustive()
        }
    }

    /// What one scrape read from the index, in the shape prometheus-client encodes.
    #[derive(Default)]
    struct Snapshot {
        gpu_total: Family<GpuLabels, Gauge>,
        gpu_committed: Family<GpuLabels, Gauge>,
        gpu_observed: Family<GpuLabels, Gauge>,
        gpu_free: Family<GpuLabels, Gauge>,
        node_fragmentation: Family<NodeLabels, FloatGauge>,
        node_report_age: Family<NodeLabels, FloatGauge>,
        gpu_held: Family<GpuLabels, Gauge>,
        node_holder_conflicts: Family<NodeLabels, Gauge>,
        pod_predicted: Family<PodGpuLabels, Gauge>,
        pod_observed: Family<PodGpuLabels, Gauge>,
        gpus: usize,
        nodes: usize,
        aged: usize,
        pods: usize,
    }

    /// Bytes as a gauge value (an i64; no GPU comes near 2^63 bytes).
    fn bytes(b: u64) -> i64 {
        i64::try_from(b).unwrap_or(i64::MAX)
    }

    impl IndexCollector {
        fn snapshot(&self) -> Snapshot {
            let now = (self.clock)();
            let mut s = Snapshot::default();
            self.index.visit_nodes(|st, pod_name| {
                let node = st.ledger.name.clone();
                for g in &st.ledger.gpus {
                    let l = GpuLabels {
                        node: node.clone(),
                        uuid: g.uuid.clone(),
                    };
                    s.gpu_total.get_or_create(&l).set(bytes(g.total_bytes));
                    s.gpu_committed
                        .get_or_create(&l)
                        .set(bytes(g.committed_bytes()));
                    s.gpu_observed
                        .get_or_create(&l)
                        .set(bytes(g.observed_bytes()));
                    s.gpu_free.get_or_create(&l).set(bytes(g.free_bytes()));
                    s.gpu_held
                        .get_or_create(&l)
                        .set(i64::from(g.granted().is_some()));
                    s.gpus += 1;
                    for (key, r) in g.reservations() {
                        let Some((namespace, pod)) = pod_name(key) else {
                            continue;
                        };
                        let l = PodGpuLabels {
                            namespace,
                            pod,
                            node: node.clone(),
                            uuid: g.uuid.clone(),
                        };
                        s.pod_predicted
                            .get_or_create(&l)
                            .set(bytes(r.predicted_bytes));
                        s.pod_observed
                            .get_or_create(&l)
                            .set(bytes(r.observed_bytes));
                        s.pods += 1;
                    }
                }
                let labels = NodeLabels { node };
                if let Some(at) = st.ledger.observed_at_unix {
                    s.node_report_age
                        .get_or_create(&labels)
                        .set((now - at) as f64);
                    s.aged += 1;
                }
                if !st.ledger.gpus.is_empty() || st.ledger.observed_at_unix.is_some() {
                    s.node_fragmentation
                        .get_or_create(&labels)
                        .set(free_outside_largest_gpu_ratio(&st.ledger));
                    // Per node, every node with a report (0 included), so an alert can tell
                    // "resolved" from "not reported": one series per node, as fragmentation.
                    let conflicts = st
                        .ledger
                        .gpus
                        .iter()
                        .filter(|g| g.granted().is_some() && !g.reservations().is_empty())
                        .count();
                    s.node_holder_conflicts
                        .get_or_create(&labels)
                        .set(i64::try_from(conflicts).unwrap_or(i64::MAX));
                    s.nodes += 1;
                }
            });
            s
        }
    }

    /// Writes one family, or nothing when it has no series (as the registry's own families).
    fn family(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        series: usize,
        metric: &dyn EncodeMetric,
    ) -> Result<(), std::fmt::Error> {
        if series == 0 {
            return Ok(());
        }
        metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct WorkloadLabels {
        pub namespace: String,
        pub kind: String,
        pub workload: String,
        /// The hash of the pods' `peakfit.io/*` inputs: two workloads of one name with other
        /// inputs are two profiles.
        pub inputs: String,
    }

    /// A workload is exported while it was seen running within this long: `lastSeen` moves at
    /// least every `cluster::profile::writer::REFRESH` (10 min) while its pods run, and a workload
    /// that stopped should neither keep an alert firing nor hold a series.
    pub const WORKLOAD_LIVE_SECS: i64 = 15 * 60;

    /// The per-workload gauges, read from the profile store at scrape time. Bounded: at most
    /// `top` workloads (the largest observed peaks first), the rest counted in
    /// `peakfit_workload_series_dropped`; three series each.
    pub struct ProfileCollector {
        profiles: Arc<ProfileStore>,
        top: usize,
        clock: fn() -> i64,
    }

    impl std::fmt::Debug for ProfileCollector {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ProfileCollector")
                .field("top", &self.top)
                .finish_non_exhaustive()
        }
    }

    impl Collector for ProfileCollector {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            let now = (self.clock)();
            let mut live: Vec<_> = self
                .profiles
                .all()
                .into_iter()
                .filter(|(_, k)| {
                    k.status
                        .last_seen
                        .parse::<jiff::Timestamp>()
                        .is_ok_and(|t| now - t.as_second() <= WORKLOAD_LIVE_SECS)
                })
                .collect();
            live.sort_by(|a, b| {
                b.1.status
                    .observed_peak_bytes
                    .cmp(&a.1.status.observed_peak_bytes)
                    .then_with(|| a.0.cmp(&b.0))
            });
            let dropped = live.len().saturating_sub(self.top);
            live.truncate(self.top);
            let predicted = Family::<WorkloadLabels, Gauge>::default();
            let observed = Family::<WorkloadLabels, Gauge>::default();
            let recommended = Family::<WorkloadLabels, Gauge>::default();
            for (key, known) in &live {
                let l = WorkloadLabels {
                    namespace: key.namespace.clone(),
                    kind: key.kind.clone(),
                    workload: key.name.clone(),
                    inputs: key.inputs.clone(),
                };
                let s = &known.status;
                predicted.get_or_create(&l).set(bytes(s.predicted_bytes));
                observed.get_or_create(&l).set(bytes(s.observed_peak_bytes));
                recommended
                    .get_or_create(&l)
                    .set(bytes(s.recommended_bytes));
            }
            let e = &mut encoder;
            family(
                e,
                "workload_predicted_bytes",
                "The model's per-GPU peak for the workload's newest pod (GpuWorkloadProfile)",
                live.len(),
                &predicted,
            )?;
            family(
                e,
                "workload_observed_peak_bytes",
                "The highest per-GPU peak any pod of the workload reached",
                live.len(),
                &observed,
            )?;
            family(
                e,
                "workload_recommended_bytes",
                "The peakfit.io/vram to annotate: the observed peak plus --learn-margin",
                live.len(),
                &recommended,
            )?;
            let d = Gauge::<i64>::default();
            d.set(i64::try_from(dropped).unwrap_or(i64::MAX));
            family(
                e,
                "workload_series_dropped",
                "Running workloads left out of the peakfit_workload_* series (beyond \
                 --profile-metrics-top)",
                1,
                &d,
            )
        }
    }

    impl Collector for IndexCollector {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            let s = self.snapshot();
            let e = &mut encoder;
            family(
                e,
                "ledger_gpu_total_bytes",
                "GPU memory of the device",
                s.gpus,
                &s.gpu_total,
            )?;
            family(
                e,
                "ledger_gpu_committed_bytes",
                "Committed: max(predicted, observed) per pod + unattributed + driver reserved",
                s.gpus,
                &s.gpu_committed,
            )?;
            family(
                e,
                "ledger_gpu_observed_bytes",
                "Memory the agent saw in use on the device",
                s.gpus,
                &s.gpu_observed,
            )?;
            family(
                e,
                "ledger_gpu_free_bytes",
                "Total minus committed",
                s.gpus,
                &s.gpu_free,
            )?;
            family(
                e,
                "ledger_gpu_held",
                "1 when the kubelet gave the GPU to a pod peakfit did not place (device plugin or DRA): committed in full, offered to no peakfit pod",
                s.gpus,
                &s.gpu_held,
            )?;
            family(
                e,
                "node_fragmentation_ratio",
                "Share of the node's free GPU memory outside its largest free GPU (0..1)",
                s.nodes,
                &s.node_fragmentation,
            )?;
            family(
                e,
                "node_report_age_seconds",
                "Age of the node's NodeGpuReport",
                s.aged,
                &s.node_report_age,
            )?;
            family(
                e,
                "gpu_holder_conflicts",
                "GPUs the kubelet gave to a pod peakfit did not place while peakfit pods are assigned to them (whoever allocates last runs out of memory)",
                s.nodes,
                &s.node_holder_conflicts,
            )?;
            family(
                e,
                "pod_predicted_bytes",
                "What bind reserved for the pod on the GPU",
                s.pods,
                &s.pod_predicted,
            )?;
            family(
                e,
                "pod_observed_bytes",
                "What the pod's processes use on the GPU",
                s.pods,
                &s.pod_observed,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::cluster::index::{ASSIGNED_GPUS, Index};
    use crate::cluster::test_support::{GIB, mk_pod, mk_report};

    fn headers(accept: &[&str]) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        for a in accept {
            h.append(
                axum::http::header::ACCEPT_ENCODING,
                a.parse().expect("a header value"),
            );
        }
        h
    }

    #[test]
    fn gzip_is_taken_as_prometheus_and_browsers_offer_it() {
        assert!(accepts_gzip(&headers(&["gzip"])));
        assert!(accepts_gzip(&headers(&["deflate, GZIP;q=0.5"])));
        assert!(accepts_gzip(&headers(&["br", "gzip"])));
        assert!(accepts_gzip(&headers(&["*"])));
        assert!(!accepts_gzip(&headers(&[])));
        assert!(!accepts_gzip(&headers(&["identity"])));
        assert!(!accepts_gzip(&headers(&["gzip;q=0"])));
        assert!(!accepts_gzip(&headers(&["x-gzip2"])));
    }

    async fn body_of(r: Response) -> (Option<String>, Vec<u8>) {
        let encoding = r
            .headers()
            .get(CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        (encoding, bytes.to_vec())
    }

    /// One render serves both codings within its second; the gzip body is that render.
    #[tokio::test]
    async fn a_render_is_served_plain_and_gzipped_and_made_once() {
        let cache = RenderCache::new(Duration::from_secs(3600));
        let renders = Arc::new(AtomicUsize::new(0));
        let text = "peakfit_x 1\n".repeat(10_000);
        let render = || {
            let (renders, text) = (renders.clone(), text.clone());
            move || {
                renders.fetch_add(1, Ordering::SeqCst);
                Ok(Bytes::from(text))
            }
        };
        let (enc, plain) = body_of(cache.serve(false, None, render()).await).await;
        assert_eq!((enc, plain.as_slice()), (None, text.as_bytes()));
        let (enc, gz) = body_of(cache.serve(true, None, render()).await).await;
        assert_eq!(enc.as_deref(), Some("gzip"));
        assert!(gz.len() * 10 < text.len(), "{} bytes gzipped", gz.len());
        let mut unzipped = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut unzipped)
            .unwrap();
        assert_eq!(unzipped, text);
        let (_, again) = body_of(cache.serve(true, None, render()).await).await;
        assert_eq!(again, gz);
        assert_eq!(renders.load(Ordering::SeqCst), 1);
    }

    /// A failed render is a 500 with its reason, whichever coding was asked for.
    #[tokio::test]
    async fn a_failed_render_is_a_500_in_either_coding() {
        for gzip in [false, true] {
            let r = RenderCache::new(Duration::ZERO)
                .serve(gzip, None, || Err("broken".to_owned()))
                .await;
            assert_eq!(r.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(body_of(r).await, (None, b"broken".to_vec()));
        }
    }

    // What the index's collector (`extender::IndexCollector`) exports.

    /// A total above `i64::MAX` once went negative in the gauges; above 1 TiB a GPU is now
    /// neither offered nor exported at all.
    #[test]
    fn a_gpu_above_a_tebibyte_is_neither_offered_nor_exported() {
        let index = Arc::new(Index::new());
        let m = extender::ExtenderMetrics::with_index(index.clone(), || 0);
        index.apply_report(&mk_report("n1", &[("GPU-a", u64::MAX, 0, &[])]));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).unwrap();
        assert!(!text.contains(r#"uuid="GPU-a""#), "{text}");
    }

    #[test]
    fn metrics_follow_the_ledger() {
        let index = Arc::new(Index::new());
        let m = extender::ExtenderMetrics::with_index(index.clone(), || 0);
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]));
        let p = mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")],
        );
        index.apply_pod(&p);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).unwrap();
        assert!(
            text.contains(r#"peakfit_ledger_gpu_free_bytes{node="n1",uuid="GPU-a"} 75161927680"#),
            "{text}"
        );
        assert!(text.contains(r#"peakfit_pod_predicted_bytes{namespace="ml",pod="pod-u1",node="n1",uuid="GPU-a"} 10737418240"#), "{text}");
        index.delete_pod(&p);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).unwrap();
        assert!(!text.contains("pod-u1"), "{text}");
    }

    /// A peer asking again within the render it was served waits for the next render; another
    /// peer is served at once. On tokio's paused clock, so a loaded machine's pace cannot decide
    /// it: the clock moves only when every task waits on a timer.
    #[tokio::test(start_paused = true)]
    async fn a_peer_asking_again_waits_for_the_next_render() {
        let age = Duration::from_millis(300);
        let cache = RenderCache::new(age);
        let renders = Arc::new(AtomicUsize::new(0));
        let render = || {
            let renders = renders.clone();
            move || {
                let n = renders.fetch_add(1, Ordering::SeqCst);
                Ok(Bytes::from(format!("peakfit_render {n}\n")))
            }
        };
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        let (_, first) = body_of(cache.serve(false, Some(a), render()).await).await;
        assert_eq!(first, b"peakfit_render 0\n");
        // Another peer: the same render, at once.
        let (_, other) = body_of(cache.serve(false, Some(b), render()).await).await;
        assert_eq!(other, first);
        assert!(t0.elapsed() < age / 2, "{:?}", t0.elapsed());
        // The first again: after the second is up, a new render.
        let (_, again) = body_of(cache.serve(false, Some(a), render()).await).await;
        assert_eq!(again, b"peakfit_render 1\n");
        assert!(t0.elapsed() >= age, "{:?}", t0.elapsed());
        // No peer known (a test's client): never held.
        let t1 = Instant::now();
        let _ = cache.serve(false, None, render()).await;
        assert!(t1.elapsed() < age / 2, "{:?}", t1.elapsed());
    }
}
