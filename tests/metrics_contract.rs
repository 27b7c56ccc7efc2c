//! The alerts and the dashboard are only as good as the metric names they query: a renamed metric
//! silently empties a panel and disarms an alert. Every `peakfit_*` series the chart refers to must
//! be one the agent or the extender exposes.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use peakfit::cluster::binding::MemoryBinder;
use peakfit::cluster::index::{Index, Observed};
use peakfit::cluster::profile::store::{ProfileStore, fold};
use peakfit::cluster::workload::WorkloadKey;
use peakfit::extender::{Extender, routes};
use peakfit::inventory::{GpuDevice, GpuProcess, NodeGpuReportStatus, NvmlStatus};
use peakfit::placement::FitConfig;
use tower::ServiceExt;

use peakfit::agent::metrics::AgentMetrics;
use peakfit::metrics::extender::ExtenderMetrics;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

/// Sample names a registry exposes, derived from its `# TYPE` lines (families with no series yet
/// still declare their type).
fn exposed(registry: &Registry, into: &mut BTreeSet<String>) {
    let mut text = String::new();
    encode(&mut text, registry).expect("registry encodes");
    names_in(&text, into);
}

fn names_in(text: &str, into: &mut BTreeSet<String>) {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                into.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    into.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                into.insert(name.to_owned());
            }
        }
    }
}

/// Every `peakfit_<name>` token in a text.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("peakfit_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let preceded_by_word = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !preceded_by_word {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

fn chart_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/peakfit")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Drives the real extender over the example cluster (a fit, refusals for memory and for NVML,
/// an invalid annotation, prioritize, a bind, a bind that cannot fit, a malformed request) and feeds
/// the agent's metrics a real report, then reads both expositions: prometheus-client only prints a
/// family once it has a series, so the names come from use, as Prometheus would see them.
async fn all_exposed() -> BTreeSet<String> {
    // Wired as `peakfit extender` wires them: the index keeps the ledger gauges current.
    let index = Arc::new(Index::new());
    let now = || jiff::Timestamp::now().as_second();
    // One workload profile, as the profile watch would hold it, for the peakfit_workload_*
    // gauges.
    let profiles = Arc::new(ProfileStore::default());
    let seen = Observed {
        uid: "u-chat".into(),
        name: "chat-0".into(),
        predicted_bytes: 20 << 30,
        explicit: false,
        gpus: 1,
        started_unix: now() - 600,
        peak_bytes: 23 << 30,
    };
    profiles.set(
        WorkloadKey {
            namespace: "ml".into(),
            kind: "Deployment".into(),
            name: "chat".into(),
            inputs: "0123456789abcdef".into(),
        },
        fold(None, &[seen], now(), 0.05),
    );
    let metrics =
        Arc::new(ExtenderMetrics::with_index(index.clone(), now).with_profiles(profiles, 100, now));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/cluster.yaml");
    peakfit::cluster::file::load_into(&index, &path).expect("example cluster loads");
    let ext = Arc::new(
        Extender::new(index, metrics.clone(), Arc::new(MemoryBinder::default())).with_fit(
            FitConfig {
                max_report_age_secs: None,
                ..FitConfig::default()
            },
        ),
    );
    let router = routes::router(ext.clone());
    let filter = |uid: &str, annotations: serde_json::Value| {
        serde_json::to_vec(&serde_json::json!({
            "Pod": {"metadata": {"name": uid, "namespace": "ml", "uid": uid, "annotations": annotations}},
            "Nodes": null,
            "NodeNames": ["h100-0", "a100-0", "l4-0"],
        }))
        .unwrap()
    };
    let bind = |pod: &str, uid: &str| {
        serde_json::to_vec(&serde_json::json!({
            "PodName": pod, "PodNamespace": "ml", "PodUID": uid, "Node": "a100-0",
        }))
        .unwrap()
    };
    for (path, body) in [
        (
            "/filter",
            filter("fits", serde_json::json!({"peakfit.io/vram": "45Gi"})),
        ),
        (
            "/filter",
            filter("too-big", serde_json::json!({"peakfit.io/vram": "500Gi"})),
        ),
        (
            "/filter",
            filter("invalid", serde_json::json!({"peakfit.io/dtype": "fp13"})),
        ),
        (
            "/prioritize",
            filter("fits", serde_json::json!({"peakfit.io/vram": "20Gi"})),
        ),
        (
            "/bind",
            bind("embedder", "5b0c7f4e-1c1d-4c4e-9a0b-000000000003"),
        ),
        (
            "/bind",
            bind("eval-8gpu", "5b0c7f4e-1c1d-4c4e-9a0b-000000000004"),
        ),
        // The example's pending 8-GPU pod: no node has 8 free GPUs, so it stays pending.
        (
            "/filter",
            filter(
                "5b0c7f4e-1c1d-4c4e-9a0b-000000000004",
                serde_json::json!({"peakfit.io/vram": "20Gi", "peakfit.io/gpus": "8"}),
            ),
        ),
        ("/filter", b"{not json".to_vec()),
    ] {
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        router.clone().oneshot(req).await.expect("router answers");
    }
    // Scraped as Prometheus scrapes it (ages are written at scrape time).
    let scrape = Request::get("/metrics").body(Body::empty()).unwrap();
    let response = routes::ops_router(ext)
        .oneshot(scrape)
        .await
        .expect("/metrics answers");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let mut names = BTreeSet::new();
    names_in(&String::from_utf8_lossy(&bytes), &mut names);

    let agent = AgentMetrics::new("node-a");
    let status = NodeGpuReportStatus {
        observed_at: "2026-11-21T12:00:00Z".into(),
        nvml: NvmlStatus {
            up: true,
            ..Default::default()
        },
        gpus: vec![GpuDevice {
            uuid: "GPU-a".into(),
            memory_total_bytes: 80 << 30,
            memory_used_bytes: 10 << 30,
            memory_free_bytes: 70 << 30,
            processes: vec![GpuProcess {
                pid: 7,
                used_bytes: Some(10 << 30),
                pod_uid: Some("u-1".into()),
                container_id: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    agent.record(&status, Duration::from_millis(2));
    agent.record_pod_resources(&peakfit::agent::pod_resources::Stats {
        up: true,
        held_devices: 1,
        unmapped: 0,
        allocatable: Some(1),
    });
    agent.publish_failed();
    agent.published(jiff::Timestamp::now());
    exposed(&agent.registry(), &mut names);
    names
}

#[tokio::test]
async fn alerts_and_their_tests_query_only_metrics_that_exist() {
    let exposed = all_exposed().await;
    for file in ["files/alerts.yaml", "tests/alerts_test.yaml"] {
        let used = referenced(&chart_file(file));
        assert!(
            !used.is_empty(),
            "{file} refers to no peakfit metric at all"
        );
        let unknown: Vec<_> = used.difference(&exposed).collect();
        assert!(
            unknown.is_empty(),
            "{file} refers to metrics nothing exposes: {unknown:?}\nexposed: {exposed:?}"
        );
    }
}

#[tokio::test]
async fn the_dashboard_queries_only_metrics_that_exist() {
    let exposed = all_exposed().await;
    let used = referenced(&chart_file("files/dashboards/peakfit.json"));
    assert!(
        !used.is_empty(),
        "the dashboard refers to no peakfit metric at all"
    );
    let unknown: Vec<_> = used.difference(&exposed).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard refers to metrics nothing exposes: {unknown:?}\nexposed: {exposed:?}"
    );
}

#[test]
fn the_scanner_finds_names_and_ignores_longer_words() {
    let got = referenced(
        r#"sum(peakfit_ledger_gpu_free_bytes{node="a"}) / x_peakfit_fake + peakfit_nvml_up"#,
    );
    assert_eq!(
        got,
        BTreeSet::from([
            "peakfit_ledger_gpu_free_bytes".to_owned(),
            "peakfit_nvml_up".to_owned()
        ])
    );
}
