//! Serving prometheus-client registries over HTTP, shared by the agent and the extender.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;

/// The content type prometheus-client's text encoder writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encodes a registry as an HTTP response for `/metrics`.
pub fn render(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => ([(CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The extender's metrics. Ledger gauges are written when a node's ledger is rebuilt (an
/// incremental event), ages are written at scrape time: nothing here rescans the cluster.
pub mod extender {
    use std::sync::atomic::AtomicU64;

    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
    use prometheus_client::registry::Registry;

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

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct ReasonLabels {
        pub reason: &'static str,
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
        pub gpu_total: Family<GpuLabels, Gauge>,
        pub gpu_committed: Family<GpuLabels, Gauge>,
        pub gpu_observed: Family<GpuLabels, Gauge>,
        pub gpu_free: Family<GpuLabels, Gauge>,
        pub node_fragmentation: Family<NodeLabels, FloatGauge>,
        /// Index inputs refused or repaired (bad `reserved-bytes`, an assigned GPU missing from
        /// the node's report, a duplicate GPU UUID in a report), each also logged as a warning.
        pub index_warnings: Family<ReasonLabels, Counter>,
        pub node_report_age: Family<NodeLabels, FloatGauge>,
        pub node_report_age_limit: FloatGauge,
        pub pod_predicted: Family<PodGpuLabels, Gauge>,
        pub pod_observed: Family<PodGpuLabels, Gauge>,
        pub pending_pods: Family<ReasonLabels, Gauge>,
        pub pending_pod_oldest: Family<ReasonLabels, FloatGauge>,
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
                gpu_total: Family::default(),
                gpu_committed: Family::default(),
                gpu_observed: Family::default(),
                gpu_free: Family::default(),
                node_fragmentation: Family::default(),
                index_warnings: Family::default(),
                node_report_age: Family::default(),
                node_report_age_limit: FloatGauge::default(),
                pod_predicted: Family::default(),
                pod_observed: Family::default(),
                pending_pods: Family::default(),
                pending_pod_oldest: Family::default(),
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
                "Node scores prioritize used, by where they came from: the node's memo, computed \
                 for the request, or computed ahead by the prescorer",
                m.node_scores.clone(),
            );
            r.register(
                "extender_errors",
                "Extender calls answered with an error",
                m.errors.clone(),
            );
            r.register(
                "ledger_gpu_total_bytes",
                "GPU memory of the device",
                m.gpu_total.clone(),
            );
            r.register(
                "ledger_gpu_committed_bytes",
                "Committed: max(predicted, observed) per pod + unattributed + driver reserved",
                m.gpu_committed.clone(),
            );
            r.register(
                "ledger_gpu_observed_bytes",
                "Memory the agent saw in use on the device",
                m.gpu_observed.clone(),
            );
            r.register(
                "ledger_gpu_free_bytes",
                "Total minus committed",
                m.gpu_free.clone(),
            );
            r.register(
                "node_fragmentation_ratio",
                "Share of the node's free GPU memory outside its largest free GPU (0..1)",
                m.node_fragmentation.clone(),
            );
            r.register(
                "index_warnings",
                "Cluster objects the index refused or repaired, by reason (see the log)",
                m.index_warnings.clone(),
            );
            r.register(
                "node_report_age_seconds",
                "Age of the node's NodeGpuReport",
                m.node_report_age.clone(),
            );
            r.register(
                "node_report_age_limit_seconds",
                "The extender's staleness limit (--max-report-age): a node whose report is older \
                 gets no GPU pod; 0 in file mode, which does not check age",
                m.node_report_age_limit.clone(),
            );
            r.register(
                "pod_predicted_bytes",
                "What bind reserved for the pod on the GPU",
                m.pod_predicted.clone(),
            );
            r.register(
                "pod_observed_bytes",
                "What the pod's processes use on the GPU",
                m.pod_observed.clone(),
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
            Self { registry, ..m }
        }
    }
}
