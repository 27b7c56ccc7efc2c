//! Holds for pods that starve (issue 22) through the real router: a four-GPU pod that waited past
//! `--reserve-after` and fits nowhere gets a hold from filter; small pods are then refused the
//! held memory with the hold named (pods of higher priority are not), the held pod alone fits
//! once the node drains, and bind places it there. And the hold's write on the wire: a JSON merge
//! patch with the pod's `resourceVersion`, answered 409 when another replica wrote first.

mod extender_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use extender_support::*;
use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use peakfit::cluster::binding::{BindError, BindTarget, BindingWriter, KubeBinder};
use peakfit::cluster::hold::{HOLD, HoldNote};
use peakfit::cluster::index::Index;
use peakfit::extender::Extender;
use peakfit::extender::holds::{HoldSettings, HoldWrite, WRITE_RETRIES, write_hold};
use peakfit::metrics::extender::ExtenderMetrics;
use peakfit::placement::PodKey;
use serde_json::{Value, json};

const NODE: &str = "gpu-a";

fn uuid(i: usize) -> String {
    format!("GPU-0000000{i}-aaaa-bbbb-cccc-000000000000")
}

/// One node of four 80 GiB GPUs, each with a bound 20 GiB filler pod.
fn cluster() -> Arc<Index> {
    let index = Arc::new(Index::new());
    index.apply_node(&mk_node(NODE));
    index.apply_report(&mk_report(
        NODE,
        "2026-11-21T17:48:20Z",
        (0..4).map(|i| mk_gpu(i, uuid(i), 80 * GIB, 0)).collect(),
    ));
    for i in 0..4 {
        let mut p = mk_pod(
            &format!("filler-{i}"),
            &[
                ("peakfit.io/vram", "20Gi"),
                ("peakfit.io/assigned-gpus", &uuid(i)),
                ("peakfit.io/reserved-bytes", &(20 * GIB).to_string()),
            ],
        );
        p.spec.as_mut().unwrap().node_name = Some(NODE.into());
        index.apply_pod(&p);
    }
    index
}

/// The four-GPU pod, created an hour before the capture clock, with a resourceVersion.
fn big() -> k8s_openapi::api::core::v1::Pod {
    let mut p = mk_pod(
        "big",
        &[("peakfit.io/vram", "70Gi"), ("peakfit.io/gpus", "4")],
    );
    p.metadata.creation_timestamp = Some(Time(
        jiff::Timestamp::from_second(capture_clock() - 3600).unwrap(),
    ));
    p.metadata.resource_version = Some("4242".into());
    p
}

fn small(name: &str, priority: i32) -> k8s_openapi::api::core::v1::Pod {
    let mut p = mk_pod(name, &[("peakfit.io/vram", "10Gi")]);
    p.spec.as_mut().unwrap().priority = Some(priority);
    p
}

/// Another pending pod like `big`, with a hold in force on one GPU of `node` for `secs` more.
fn other_holding(node: &str, gpu: &str, secs: i64) -> k8s_openapi::api::core::v1::Pod {
    let mut other = big();
    other.metadata.name = Some("other".into());
    other.metadata.uid = Some("uid-other".into());
    let note = HoldNote {
        node: node.into(),
        gpus: vec![gpu.to_owned()],
        bytes: vec![GIB],
        made_unix: capture_clock(),
        until_unix: capture_clock() + secs,
    };
    other
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(HOLD.into(), note.to_annotation());
    other
}

fn settings() -> HoldSettings {
    HoldSettings {
        after: Duration::from_secs(1800),
        deadline: Duration::from_secs(3600),
        per_node: 0.1,
    }
}

async fn filter(h: &Harness, pod: &k8s_openapi::api::core::v1::Pod) -> Value {
    let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": [NODE]})).unwrap();
    let (status, out) = call(&h.router, "POST", "/filter", body).await;
    assert_eq!(status, 200);
    json(&out)
}

fn passed(reply: &Value) -> bool {
    reply["NodeNames"]
        .as_array()
        .is_some_and(|n| n.iter().any(|n| n == NODE))
}

fn refusal(reply: &Value) -> String {
    let words = reply["FailedNodes"][NODE]
        .as_str()
        .or(reply["FailedAndUnresolvableNodes"][NODE].as_str());
    words.unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_starving_pod_gets_a_hold_that_drains_its_node_to_it() {
    let index = cluster();
    let h = harness_with_holds(index.clone(), Some(settings()));
    let big = big();
    index.apply_pod(&big);
    let key: PodKey = "uid-big".into();

    // Fits nowhere, waited an hour: filter refuses it and writes a hold in the background.
    let reply = filter(&h, &big).await;
    assert!(!passed(&reply), "{reply}");
    let (target, value, event) = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(w) = h.binder.holds.lock().first().cloned() {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the hold is written");
    assert_eq!((target.name.as_str(), target.node.as_str()), ("big", NODE));
    let note = HoldNote::parse(&value).unwrap();
    assert_eq!(note.gpus, (0..4).map(uuid).collect::<Vec<_>>());
    assert_eq!(note.until_unix - note.made_unix, 3600);
    assert!(
        event.starts_with("holding GPUs 0-3 of node gpu-a until 18:48:30 UTC: the pod waited 60 min and fits nowhere"),
        "{event}"
    );
    // Recorded in the index at once (the watch would bring the same annotation).
    assert_eq!(index.hold_of(&key), Some(note.clone()));
    // Filtered again: no second hold.
    filter(&h, &big).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.binder.holds.lock().len(), 1);

    // A small pod of the same priority is kept off the held memory, the hold named.
    let reply = filter(&h, &small("chat", 0)).await;
    assert!(!passed(&reply), "{reply}");
    let words = refusal(&reply);
    assert!(
        words.contains("GPUs 0-3's memory is held for ml/big until 18:48:30 UTC (peakfit.io/hold"),
        "{words}"
    );
    // One of higher priority is not (as kube-scheduler treats nominated pods).
    assert!(passed(&filter(&h, &small("urgent", 1000)).await));

    // The fillers leave: the big pod fits on its held GPUs, and a small one still does not.
    for i in 0..4 {
        index.delete_pod_key(&format!("uid-filler-{i}"));
    }
    assert!(!passed(&filter(&h, &small("chat", 0)).await));
    assert!(passed(&filter(&h, &big).await));
    let body = serde_json::to_vec(&json!({
        "PodName": "big", "PodNamespace": "ml", "PodUID": "uid-big", "Node": NODE,
    }))
    .unwrap();
    let (status, out) = call(&h.router, "POST", "/bind", body).await;
    assert_eq!(status, 200);
    assert_eq!(json(&out)["Error"], "", "{}", String::from_utf8_lossy(&out));
    let bindings = h.binder.bindings.lock().clone();
    assert_eq!(bindings.len(), 1);
    assert_eq!(
        bindings[0].1["peakfit.io/assigned-gpus"].split(',').count(),
        4
    );
    // Bound: the hold is over, its memory is the pod's reservation now.
    assert_eq!(index.hold_of(&key), None);
    let slot = index.node(NODE).unwrap();
    assert!(slot.read().ledger.gpus.iter().all(|g| g.held_bytes() == 0));

    let (_, metrics) = call(&h.router, "GET", "/metrics", vec![]).await;
    let text = String::from_utf8(metrics).unwrap();
    assert!(text.contains("peakfit_holds_made_total 1"), "{text}");
    assert!(text.contains("peakfit_holds_active 0"), "{text}");
    assert!(
        text.contains(r#"peakfit_extender_rejections_total{reason="held_for_pod"} 2"#),
        "{text}"
    );
}

#[tokio::test]
async fn no_hold_before_the_wait_nor_beyond_the_cap_nor_when_off() {
    let index = cluster();
    let with = |s: Option<HoldSettings>| harness_with_holds(index.clone(), s);
    let mut young = big();
    young.metadata.creation_timestamp = Some(Time(
        jiff::Timestamp::from_second(capture_clock() - 60).unwrap(),
    ));
    index.apply_pod(&young);
    let h = with(Some(settings()));
    filter(&h, &young).await;
    let off = with(None);
    filter(&off, &big()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.binder.holds.lock().is_empty(), "waited a minute of 30");
    assert!(off.binder.holds.lock().is_empty(), "--reserve-after off");

    // One node: the cap is one hold. Another pod's hold in force leaves no room.
    index.apply_pod(&other_holding(NODE, &uuid(0), 60));
    filter(&h, &big()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.binder.holds.lock().is_empty(), "the cap is reached");
}

/// `--reserve-max` is a fraction of the GPU nodes: with two GPU nodes and a hold in force on the
/// other one, 0.1 allows no second hold, however many CPU-only nodes the cluster has (counting
/// all 22 nodes it would allow three, and `big` would get one on `NODE`).
#[tokio::test]
async fn the_cap_is_a_fraction_of_the_gpu_nodes_not_of_every_node() {
    let index = cluster();
    let second = "gpu-2";
    let second_uuid = |i: usize| format!("GPU-1000000{i}-aaaa-bbbb-cccc-000000000000");
    index.apply_node(&mk_node(second));
    index.apply_report(&mk_report(
        second,
        "2026-11-21T17:48:20Z",
        (0..4)
            .map(|i| mk_gpu(i, second_uuid(i), 80 * GIB, 0))
            .collect(),
    ));
    for i in 0..20 {
        index.apply_node(&mk_node(&format!("cpu-{i:02}")));
    }
    index.apply_pod(&other_holding(second, &second_uuid(0), 3600));
    let h = harness_with_holds(index.clone(), Some(settings()));
    filter(&h, &big()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        h.binder.holds.lock().is_empty(),
        "0.1 of 2 GPU nodes is one hold, and one is in force"
    );
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The hold's write as the API server gets it, and its 409 when the pod changed since.
#[tokio::test]
async fn the_hold_is_a_merge_patch_conditioned_on_the_resource_version() {
    let (svc, mut handle): (_, Handle) = tower_test::mock::pair();
    let binder = KubeBinder::new(kube::Client::new(svc, "default"));
    let target = BindTarget {
        namespace: "ml".into(),
        name: "big".into(),
        uid: Some("uid-big".into()),
        node: NODE.into(),
    };
    let api = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("the pod PATCH");
        let (parts, body) = req.into_parts();
        let body: Value = serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap();
        // What the API server answers a patch whose resourceVersion is stale.
        let conflict = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Operation cannot be fulfilled on pods \"big\": the object has been \
                        modified; please apply your changes to the latest version and try again",
            "reason": "Conflict", "details": {"name": "big", "kind": "pods"}, "code": 409,
        });
        send.send_response(
            Response::builder()
                .status(409)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&conflict).unwrap()))
                .unwrap(),
        );
        (parts, body)
    });
    let err = binder
        .hold(&target, "{\"node\":\"gpu-a\"}", Some("4242"), "holding")
        .await
        .unwrap_err();
    let (parts, body) = api.await.unwrap();
    assert_eq!(parts.method, Method::PATCH);
    assert_eq!(parts.uri.path(), "/api/v1/namespaces/ml/pods/big");
    assert_eq!(
        parts.headers["content-type"],
        "application/merge-patch+json"
    );
    assert_eq!(
        body,
        json!({"metadata": {
            "annotations": {"peakfit.io/hold": "{\"node\":\"gpu-a\"}"},
            "uid": "uid-big",
            "resourceVersion": "4242",
        }})
    );
    match err {
        BindError::Hold { source, .. } => {
            assert!(
                source.to_string().contains("409") || source.to_string().contains("Conflict"),
                "{source}"
            );
        }
        other => panic!("{other}"),
    }
}

/// A fake API server that answers the requests it gets, in order, with `answers` (status and
/// JSON body), and gives back each request's method, path and JSON body (`Null` when empty),
/// and the handle for more.
fn api_answering(
    mut handle: Handle,
    answers: Vec<(u16, Value)>,
) -> tokio::task::JoinHandle<(Handle, Vec<Seen>)> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        for (status, answer) in answers {
            let Some((req, send)) = handle.next_request().await else {
                break;
            };
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            seen.push((parts.method, parts.uri.path().to_owned(), body));
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap(),
            );
        }
        (handle, seen)
    })
}

/// A request the fake API server answered: method, path, JSON body.
type Seen = (Method, String, Value);

/// The API server's 409 for a write whose `resourceVersion` is stale.
fn conflict() -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Operation cannot be fulfilled on pods \"big\": the object has been modified; \
                    please apply your changes to the latest version and try again",
        "reason": "Conflict", "details": {"name": "big", "kind": "pods"}, "code": 409,
    })
}

/// `big` as a GET returns it at `rv`, pending, with `hold` as its annotation.
fn big_at(rv: &str, hold: Option<&HoldNote>) -> Value {
    let mut p = big();
    p.metadata.resource_version = Some(rv.into());
    if let Some(h) = hold {
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(HOLD.into(), h.to_annotation());
    }
    serde_json::to_value(&p).unwrap()
}

fn target() -> BindTarget {
    BindTarget {
        namespace: "ml".into(),
        name: "big".into(),
        uid: Some("uid-big".into()),
        node: NODE.into(),
    }
}

fn hold_note(made: i64, secs: i64) -> HoldNote {
    HoldNote {
        node: NODE.into(),
        gpus: (0..4).map(uuid).collect(),
        bytes: vec![70 * GIB; 4],
        made_unix: made,
        until_unix: made + secs,
    }
}

fn metrics_text(m: &ExtenderMetrics) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &m.registry).unwrap();
    text
}

/// The race CI found: kube-scheduler's own status update lands between filter's read and the
/// hold's write, which gets 409. The writer reads the pod again and writes on its new version,
/// and the event follows the write that went through.
#[tokio::test]
async fn a_conflict_with_the_schedulers_status_update_is_retried_on_the_new_version() {
    let (svc, handle): (_, Handle) = tower_test::mock::pair();
    let binder = KubeBinder::new(kube::Client::new(svc, "default"));
    let metrics = ExtenderMetrics::new();
    let note = hold_note(capture_clock(), 3600);
    let value = note.to_annotation();
    let api = api_answering(
        handle,
        vec![
            (409, conflict()),
            (200, big_at("4243", None)),
            (200, big_at("4244", Some(&note))),
            (
                201,
                json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": "big.1"}}),
            ),
        ],
    );
    let written = write_hold(
        &binder,
        &metrics,
        (&target(), &value, "holding"),
        Some("4242".into()),
        capture_clock(),
    )
    .await;
    assert_eq!(written, HoldWrite::Written { conflicts: 1 });
    let (_, seen) = api.await.unwrap();
    let calls: Vec<(&Method, &str)> = seen.iter().map(|(m, p, _)| (m, p.as_str())).collect();
    assert_eq!(
        calls,
        [
            (&Method::PATCH, "/api/v1/namespaces/ml/pods/big"),
            (&Method::GET, "/api/v1/namespaces/ml/pods/big"),
            (&Method::PATCH, "/api/v1/namespaces/ml/pods/big"),
            (&Method::POST, "/api/v1/namespaces/ml/events"),
        ]
    );
    assert_eq!(seen[0].2["metadata"]["resourceVersion"], "4242");
    assert_eq!(
        seen[2].2,
        json!({"metadata": {
            "annotations": {HOLD: value},
            "uid": "uid-big",
            "resourceVersion": "4243",
        }})
    );
    assert!(
        metrics_text(&metrics)
            .contains(r#"peakfit_holds_write_conflicts_total{outcome="retried"} 1"#),
        "{}",
        metrics_text(&metrics)
    );
}

/// Another replica wrote its hold first: the re-read finds it in force, and it is adopted, not
/// overwritten. A pod that changes under every write is given up after `WRITE_RETRIES`, and one
/// that bound meanwhile at once.
#[tokio::test]
async fn after_a_conflict_another_replicas_hold_is_adopted_and_a_bound_pod_given_up() {
    let theirs = hold_note(capture_clock() - 5, 3600);
    let ours = hold_note(capture_clock(), 3600).to_annotation();
    let metrics = ExtenderMetrics::new();
    let write = |answers: Vec<(u16, Value)>| {
        let (svc, handle): (_, Handle) = tower_test::mock::pair();
        let binder = KubeBinder::new(kube::Client::new(svc, "default"));
        let api = api_answering(handle, answers);
        let (metrics, ours) = (&metrics, &ours);
        async move {
            let out = write_hold(
                &binder,
                metrics,
                (&target(), ours, "holding"),
                Some("4242".into()),
                capture_clock(),
            )
            .await;
            (out, api.await.unwrap().1)
        }
    };

    let (out, seen) = write(vec![
        (409, conflict()),
        (200, big_at("4243", Some(&theirs))),
    ])
    .await;
    assert_eq!(out, HoldWrite::Adopted(theirs.clone()));
    assert_eq!(seen.len(), 2, "no second write");

    let mut bound: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(big_at("4250", None)).unwrap();
    bound.spec.as_mut().unwrap().node_name = Some("gpu-b".into());
    let (out, seen) = write(vec![
        (409, conflict()),
        (200, serde_json::to_value(&bound).unwrap()),
    ])
    .await;
    assert!(
        matches!(&out, HoldWrite::NotWritten(why) if why.contains("the pod is bound")),
        "{out:?}"
    );
    assert_eq!(seen.len(), 2);

    // Changed under every write: 1 + WRITE_RETRIES writes, then given up.
    let mut answers = Vec::new();
    for i in 0..WRITE_RETRIES {
        answers.push((409, conflict()));
        answers.push((200, big_at(&format!("43{i}"), None)));
    }
    answers.push((409, conflict()));
    let (out, seen) = write(answers).await;
    assert!(
        matches!(&out, HoldWrite::NotWritten(why) if why.contains("4 conflicts in a row")),
        "{out:?}"
    );
    let patches = seen.iter().filter(|(m, ..)| m == Method::PATCH).count();
    assert_eq!(patches, WRITE_RETRIES + 1);

    let text = metrics_text(&metrics);
    for (outcome, n) in [("adopted", 1), ("given_up", 2), ("retried", 3)] {
        assert!(
            text.contains(&format!(
                "peakfit_holds_write_conflicts_total{{outcome=\"{outcome}\"}} {n}"
            )),
            "{outcome}: {text}"
        );
    }
}

static SWEEP_CLOCK: AtomicI64 = AtomicI64::new(0);

fn sweep_clock() -> i64 {
    SWEEP_CLOCK.load(Ordering::Relaxed)
}

/// Waits until the fake API server has answered everything it was given.
async fn answered(api: tokio::task::JoinHandle<(Handle, Vec<Seen>)>) -> (Handle, Vec<Seen>) {
    tokio::time::timeout(Duration::from_secs(5), api)
        .await
        .expect("the sweep's requests")
        .unwrap()
}

/// The sweep removes an expired hold from its pod: it reads the pod, and removes the annotation
/// (JSON merge patch with `null`) on the version read, only while it is the very hold that
/// expired. A hold that expires while the extender runs is counted in
/// `peakfit_holds_expired_total`; one already past its deadline when the watch first brings it
/// (after a restart) is removed but not counted again. When another replica removed it first
/// (409, then the annotation is gone), nothing more is written.
#[tokio::test]
async fn the_sweep_removes_an_expired_hold_from_its_pod_once() {
    let t0 = capture_clock();
    SWEEP_CLOCK.store(t0, Ordering::Relaxed);
    let index = cluster();
    let (svc, handle): (_, Handle) = tower_test::mock::pair();
    let binder = Arc::new(KubeBinder::new(kube::Client::new(svc, "default")));
    let metrics = Arc::new(ExtenderMetrics::with_index(index.clone(), sweep_clock));
    let ext = Extender::new(index.clone(), metrics.clone(), binder)
        .with_clock(sweep_clock)
        .with_holds(Some(settings()));

    // Past its deadline before this extender started: removed, not counted.
    let stale = hold_note(t0 - 7200, 3600);
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(big_at("100", Some(&stale))).unwrap();
    index.apply_pod(&pod);
    let api = api_answering(
        handle,
        vec![
            (200, big_at("100", Some(&stale))),
            (200, big_at("101", None)),
        ],
    );
    ext.sweep_holds();
    let (handle, seen) = answered(api).await;
    assert_eq!(seen[0].0, Method::GET);
    assert_eq!(seen[1].0, Method::PATCH);
    assert_eq!(seen[1].1, "/api/v1/namespaces/ml/pods/big");
    assert_eq!(
        seen[1].2,
        json!({"metadata": {
            "annotations": {HOLD: null},
            "uid": "uid-big",
            "resourceVersion": "100",
        }})
    );
    let text = eventually_text(&metrics, "peakfit_holds_cleared_total 1").await;
    assert!(text.contains("peakfit_holds_expired_total 0"), "{text}");
    // Swept once: the watch bringing the annotation back changes nothing.
    index.apply_pod(&pod);
    ext.sweep_holds();
    assert_eq!(index.holds_active(t0), 0);

    // A new hold made while the extender runs expires: counted; another replica removed it
    // first (409, then gone), so nothing more is written.
    let fresh = hold_note(t0 + 10, 60);
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(big_at("200", Some(&fresh))).unwrap();
    index.apply_pod(&pod);
    SWEEP_CLOCK.store(t0 + 69, Ordering::Relaxed);
    ext.sweep_holds();
    assert_eq!(index.holds_active(t0 + 69), 1, "not yet");
    let api = api_answering(
        handle,
        vec![
            (200, big_at("200", Some(&fresh))),
            (409, conflict()),
            (200, big_at("201", None)),
        ],
    );
    SWEEP_CLOCK.store(t0 + 70, Ordering::Relaxed);
    ext.sweep_holds();
    let (_, seen) = answered(api).await;
    let calls: Vec<&Method> = seen.iter().map(|(m, ..)| m).collect();
    assert_eq!(calls, [&Method::GET, &Method::PATCH, &Method::GET]);
    let text = eventually_text(&metrics, "peakfit_holds_expired_total 1").await;
    assert!(text.contains("peakfit_holds_cleared_total 1"), "{text}");
    assert!(text.contains("peakfit_holds_active 0"), "{text}");
}

/// The metrics once `want` is in them (the removal runs in the background).
async fn eventually_text(metrics: &ExtenderMetrics, want: &str) -> String {
    for _ in 0..200 {
        let text = metrics_text(metrics);
        if text.contains(want) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{want} never came: {}", metrics_text(metrics));
}
