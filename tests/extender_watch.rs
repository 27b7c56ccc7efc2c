//! The extender's watches against kube's tower-test mock API server: the four initial lists
//! (Nodes, Pods, `NodeGpuReports`, labelled model-config ConfigMaps) open `/readyz`, and watch
//! events after that change the index one object at a time (a pod bound by another replica, a
//! pod deleted). The ConfigMap list and watch ask for the label only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use peakfit::cluster::index::Index;
use peakfit::extender::Readiness;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Pending = tower_test::mock::SendResponse<Response<Body>>;

const GIB: u64 = 1 << 30;

fn list(kind: &str, api_version: &str, items: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "kind": kind, "apiVersion": api_version,
        "metadata": {"resourceVersion": "100"},
        "items": items,
    }))
    .unwrap()
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "gpu-1", "resourceVersion": "10"}})
}

fn report() -> Value {
    json!({
        "apiVersion": "peakfit.io/v1alpha1", "kind": "NodeGpuReport",
        "metadata": {"name": "gpu-1", "resourceVersion": "11"},
        "spec": {"nodeName": "gpu-1"},
        "status": {
            "observedAt": jiff::Timestamp::now().to_string(),
            "nvml": {"up": true},
            "gpus": [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3",
                      "memoryTotalBytes": 80 * GIB, "memoryUsedBytes": 0,
                      "memoryFreeBytes": 80 * GIB}],
        },
    })
}

fn pod(name: &str, uid: &str, rv: &str, reserved: u64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": rv,
                     "annotations": {"peakfit.io/vram": "10Gi",
                                     "peakfit.io/assigned-gpus": "GPU-a",
                                     "peakfit.io/reserved-bytes": reserved.to_string()}},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "x"}]},
    })
}

fn respond(send: Pending, body: Vec<u8>) {
    send.send_response(
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap(),
    );
}

fn free_on_gpu_a(index: &Index) -> Option<u64> {
    let slot = index.node("gpu-1")?;
    let st = slot.read();
    st.ledger
        .gpus
        .first()
        .map(peakfit::placement::GpuLedger::free_bytes)
}

/// Answers the mock API server's requests: lists from `lists` by path, the pod watch with
/// `pod_events` once, every other watch never (held open, as a quiet API server does).
async fn serve(
    mut handle: Handle,
    lists: HashMap<&'static str, Vec<u8>>,
    pod_events: Vec<u8>,
    held: Arc<parking_lot::Mutex<Vec<Pending>>>,
    asked: Arc<parking_lot::Mutex<Vec<String>>>,
) {
    let mut pod_events = Some(pod_events);
    while let Some((req, send)) = handle.next_request().await {
        assert_eq!(req.method(), Method::GET, "the watches only read");
        let path = req.uri().path().to_owned();
        asked.lock().push(path.clone());
        if path == "/api/v1/configmaps" {
            let query = req.uri().query().unwrap_or_default();
            assert!(
                query.contains("labelSelector=peakfit.io%2Fmodel-config%3Dtrue"),
                "ConfigMaps are listed and watched by label only: {query}"
            );
        }
        let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
        match (watch, lists.get(path.as_str())) {
            (false, Some(body)) => respond(send, body.clone()),
            (true, _) if path == "/api/v1/pods" && pod_events.is_some() => {
                respond(send, pod_events.take().unwrap());
            }
            (true, _) => held.lock().push(send),
            (false, None) => panic!("unexpected request {}", req.uri()),
        }
    }
}

/// The mock API server's lists: one node with its report and pod a; the labelled ConfigMap
/// when `model_configs`.
fn lists(model_configs: bool) -> HashMap<&'static str, Vec<u8>> {
    let mut lists = HashMap::from([
        ("/api/v1/nodes", list("NodeList", "v1", &[node()])),
        (
            "/apis/peakfit.io/v1alpha1/nodegpureports",
            list("NodeGpuReportList", "peakfit.io/v1alpha1", &[report()]),
        ),
        (
            "/api/v1/pods",
            list("PodList", "v1", &[pod("a", "uid-a", "20", 10 * GIB)]),
        ),
    ]);
    if model_configs {
        lists.insert(
            "/api/v1/configmaps",
            list("ConfigMapList", "v1", &[model_config()]),
        );
    }
    lists
}

/// A pending pod of namespace `ml` naming the `llama-8b` ConfigMap.
fn naming_the_configmap() -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml",
                     "annotations": {"peakfit.io/model-config": "llama-8b",
                                     "peakfit.io/batch": "2"}},
    }))
    .unwrap()
}

async fn until_ready(readiness: &Readiness) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !readiness.is_ready() {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn lists_open_readiness_and_watch_events_change_the_index() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let index = Arc::new(Index::new());
    let readiness = Readiness::waiting_for(peakfit::cluster::watch::watches(true, false, false));
    let lists = lists(true);
    // After the lists: pod b is bound to the same GPU by another scheduler replica, then pod
    // a finishes and is deleted.
    let mut events = Vec::new();
    for (kind, object) in [
        ("ADDED", pod("b", "uid-b", "21", 30 * GIB)),
        ("DELETED", pod("a", "uid-a", "22", 10 * GIB)),
    ] {
        events.extend(serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap());
        events.push(b'\n');
    }
    let held = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let asked = Arc::new(parking_lot::Mutex::new(Vec::new()));
    tokio::spawn(serve(handle, lists, events, held.clone(), asked));

    peakfit::cluster::watch::spawn(client, index.clone(), readiness.clone(), true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Ready once all four lists arrived, and the listed pod holds its 10 GiB.
    until_ready(&readiness).await;
    // Then the watch events: b's 30 GiB in, a's 10 GiB out.
    loop {
        if index.contains_pod("uid-b") && !index.contains_pod("uid-a") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch events not applied: free {:?}, pods {}",
            free_on_gpu_a(&index),
            index.pod_count()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(index.pod_count(), 1);
    assert_eq!(free_on_gpu_a(&index), Some(80 * GIB - 30 * GIB));

    // The listed ConfigMap sizes a pod that names it, as `--model-config` would.
    assert_eq!(index.model_configs().len(), 1);
    let from_map = index.request_of(&naming_the_configmap()).unwrap().unwrap();
    let mut by_hand = peakfit::model::hf_config::annotations(LLAMA)
        .unwrap()
        .annotations
        .into_iter()
        .map(|(k, v)| (format!("peakfit.io/{k}"), v))
        .collect::<std::collections::BTreeMap<_, _>>();
    by_hand.insert("peakfit.io/batch".into(), "2".into());
    assert_eq!(
        from_map,
        peakfit::model::pod_request(&by_hand).unwrap().unwrap()
    );
}

/// `--model-config-watch false`: no ConfigMap is listed or watched, readiness opens after the
/// other three lists, and a pod naming a ConfigMap is refused naming the switch.
#[tokio::test]
async fn without_the_configmap_watch_no_configmap_is_asked_for() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let index = Arc::new(Index::new());
    let readiness = Readiness::waiting_for(peakfit::cluster::watch::watches(false, false, false));
    let held = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let asked = Arc::new(parking_lot::Mutex::new(Vec::new()));
    tokio::spawn(serve(handle, lists(false), Vec::new(), held, asked.clone()));
    peakfit::cluster::watch::spawn(client, index.clone(), readiness.clone(), false);
    until_ready(&readiness).await;
    assert!(index.contains_pod("uid-a"));
    let asked = asked.lock().clone();
    assert!(
        !asked.iter().any(|p| p.contains("configmaps")),
        "no ConfigMap request: {asked:?}"
    );
    let e = index.request_of(&naming_the_configmap()).unwrap_err();
    assert_eq!(e.key, "model-config");
    assert!(e.allowed.contains("--model-config-watch"), "{e}");
}

const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;

fn model_config() -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "llama-8b", "namespace": "ml", "resourceVersion": "12",
                     "labels": {"peakfit.io/model-config": "true"}},
        "data": {"config.json": LLAMA},
    })
}
