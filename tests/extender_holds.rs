//! Holds for pods that starve (issue 22) through the real router: a four-GPU pod that waited past
//! `--reserve-after` and fits nowhere gets a hold from filter; small pods are then refused the
//! held memory with the hold named (pods of higher priority are not), the held pod alone fits
//! once the node drains, and bind places it there. And the hold's write on the wire: a JSON merge
//! patch with the pod's `resourceVersion`, answered 409 when another replica wrote first.

mod extender_support;

use std::sync::Arc;
use std::time::Duration;

use extender_support::*;
use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use peakfit::cluster::binding::{BindError, BindTarget, BindingWriter, KubeBinder};
use peakfit::cluster::hold::{HOLD, HoldNote};
use peakfit::cluster::index::Index;
use peakfit::extender::holds::HoldSettings;
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
