//! Bind against kube's tower-test mock API server: one `POST …/pods/NAME/binding` carrying the
//! GPU annotations (the API server copies them onto the pod as it binds it), answered with the
//! Status the real API server sent; and the paths where bind must refuse (the fit no longer
//! holds, the API server says 409 or fails).

mod extender_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use extender_support::*;
use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::client::Body;
use peakfit::cluster::binding::{BindError, BindTarget, BindingWriter, KubeBinder, MemoryBinder};
use peakfit::cluster::index::Index;
use serde_json::Value;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn mock_client() -> (kube::Client, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(svc, "default"), handle)
}

const EMBEDDER_UID: &str = "319770bb-6c46-448d-83b5-26c60bbcc599";

fn bind_request(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join("node-cache/006-bind-request.json")).unwrap()
}

async fn body_json(req: Request<Body>) -> (http::request::Parts, Value) {
    let (parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    (parts, serde_json::from_slice(&bytes).unwrap())
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: u16, body: Vec<u8>) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap(),
    );
}

/// The binding POST; returns its body.
async fn expect_binding(
    handle: &mut Handle,
) -> (Value, tower_test::mock::SendResponse<Response<Body>>) {
    let (req, send) = handle.next_request().await.expect("the binding POST");
    let (parts, body) = body_json(req).await;
    assert_eq!(parts.method, Method::POST);
    assert_eq!(
        parts.uri.path(),
        "/api/v1/namespaces/default/pods/embedder/binding"
    );
    (body, send)
}

/// The read-back GET after a failed Binding, answered with the pod on `node` (unbound: `None`)
/// carrying `annotations`.
async fn answer_read_back(handle: &mut Handle, node: Option<&str>, annotations: &Value) {
    let (req, send) = handle.next_request().await.expect("the pod GET");
    assert_eq!(req.method(), Method::GET);
    assert_eq!(req.uri().path(), "/api/v1/namespaces/default/pods/embedder");
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "embedder", "namespace": "default", "uid": EMBEDDER_UID,
                     "annotations": annotations},
        "spec": {"containers": [], "nodeName": node},
    });
    respond(send, 200, serde_json::to_vec(&pod).unwrap());
}

/// Nothing more reaches the API server (a PATCH here would be a second write).
async fn expect_no_more_requests(handle: &mut Handle) {
    let seen = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
    assert!(!matches!(seen, Ok(Some(_))), "bind made another request");
}

/// One bind of the fixture's embedder pod to gpu-b through a `KubeBinder` on the mock API server,
/// which `api` plays; returns the index, the harness and bind's error (empty on success).
async fn bind_through<F, Fut>(api: F) -> (Arc<Index>, Harness, String)
where
    F: FnOnce(Handle) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    let (client, handle) = mock_client();
    let h = harness_with(
        index.clone(),
        Arc::new(KubeBinder::new(client)),
        Arc::new(MemoryBinder::default()),
    );
    let api = tokio::spawn(api(handle));
    let (code, reply) = call(&h.router, "POST", "/bind", bind_request(&dir)).await;
    assert_eq!(code, 200);
    tokio::time::timeout(Duration::from_secs(5), api)
        .await
        .expect("the API server saw what bind sent")
        .unwrap();
    let err = json(&reply)["Error"].as_str().unwrap().to_owned();
    (index, h, err)
}

#[tokio::test]
async fn bind_posts_one_binding_that_carries_the_annotations() {
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    let (client, mut handle) = mock_client();
    let h = harness_with(
        index.clone(),
        Arc::new(KubeBinder::new(client)),
        Arc::new(MemoryBinder::default()),
    );
    let status = std::fs::read(dir.join("node-cache/apiserver-binding-response.json")).unwrap();
    let api = tokio::spawn(async move {
        let (binding, send) = expect_binding(&mut handle).await;
        respond(send, 201, status);
        expect_no_more_requests(&mut handle).await;
        binding
    });
    let (code, reply) = call(&h.router, "POST", "/peakfit/bind", bind_request(&dir)).await;
    assert_eq!(code, 200);
    assert_eq!(json(&reply), serde_json::json!({"Error": ""}));
    let binding = tokio::time::timeout(Duration::from_secs(5), api)
        .await
        .expect("the API server saw the binding")
        .unwrap();
    // One write: the Binding carries the GPUs and the bytes, and the pod's UID (a precondition).
    assert_eq!(binding["kind"], "Binding");
    assert_eq!(binding["metadata"]["name"], "embedder");
    assert_eq!(binding["metadata"]["uid"], EMBEDDER_UID);
    assert_eq!(
        binding["metadata"]["annotations"],
        serde_json::json!({
            "peakfit.io/assigned-gpus": "GPU-00000000-aaaa-bbbb-cccc-00000000000",
            "peakfit.io/reserved-bytes": (6 * GIB).to_string(),
        })
    );
    assert_eq!(binding["target"]["kind"], "Node");
    assert_eq!(binding["target"]["name"], "gpu-b");
    // Only now is the reservation in the ledger.
    let l = index.node("gpu-b").unwrap().read().ledger.clone();
    assert_eq!(
        l.gpus[0].reservations()[EMBEDDER_UID].predicted_bytes,
        6 * GIB
    );
}

/// Whether any GPU of gpu-b holds a reservation of the embedder pod.
fn reserved_on_gpu_b(index: &Index) -> bool {
    let l = index.node("gpu-b").unwrap().read().ledger.clone();
    l.gpus
        .iter()
        .any(|g| g.reservations().contains_key(EMBEDDER_UID))
}

/// Fills every GPU of gpu-b with memory of no known pod, as a newer agent report would.
fn fill_gpu_b(index: &Index) {
    let gpus = (0..4)
        .map(|i| {
            let uuid = format!("GPU-0000000{i}-aaaa-bbbb-cccc-0000000000{i}");
            mk_gpu(i, uuid, 40960 << 20, 38 * GIB)
        })
        .collect();
    index.apply_report(&mk_report("gpu-b", "2026-11-21T17:48:20Z", gpus));
}

#[tokio::test]
async fn when_the_fit_no_longer_holds_bind_errs_and_writes_nothing() {
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    fill_gpu_b(&index);
    let (client, mut handle) = mock_client();
    let h = harness_with(
        index.clone(),
        Arc::new(KubeBinder::new(client)),
        Arc::new(MemoryBinder::default()),
    );
    let (code, reply) = call(&h.router, "POST", "/bind", bind_request(&dir)).await;
    assert_eq!(code, 200);
    let err = json(&reply)["Error"].as_str().unwrap().to_owned();
    assert!(err.contains("no longer fits on gpu-b"), "{err}");
    let seen = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
    assert!(
        !matches!(seen, Ok(Some(_))),
        "nothing may be written when the fit fails"
    );
    assert!(!reserved_on_gpu_b(&index));
}

#[tokio::test]
async fn a_409_from_the_api_server_is_an_error_and_reserves_nothing() {
    let (index, h, err) = bind_through(|mut handle| async move {
        let (_, send) = expect_binding(&mut handle).await;
        respond(
            send,
            409,
            br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on pods/binding \"embedder\": pod embedder is already assigned to node \"gpu-a\"","reason":"Conflict","details":{"name":"embedder","kind":"pods/binding"},"code":409}"#.to_vec(),
        );
        // bind reads the pod back: on another node, so the Binding was not ours.
        answer_read_back(&mut handle, Some("gpu-a"), &serde_json::json!({})).await;
        expect_no_more_requests(&mut handle).await;
    })
    .await;
    assert!(err.contains("already assigned"), "{err}");
    assert!(!reserved_on_gpu_b(&index));
    let (_, metrics) = call(&h.router, "GET", "/metrics", vec![]).await;
    let text = String::from_utf8(metrics).unwrap();
    assert!(
        text.contains(r#"peakfit_extender_decisions_total{verb="bind",outcome="api_error"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"peakfit_extender_errors_total{verb="bind"} 1"#),
        "{text}"
    );
}

/// A writer that takes its time, so two binds overlap.
#[derive(Default)]
struct SlowBinder(MemoryBinder);

impl BindingWriter for SlowBinder {
    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.0.bind(target, annotations).await
        })
    }

    fn hold<'a>(
        &'a self,
        target: &'a BindTarget,
        value: &'a str,
        resource_version: Option<&'a str>,
        event: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        self.0.hold(target, value, resource_version, event)
    }

    fn clear_hold<'a>(
        &'a self,
        target: &'a BindTarget,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        self.0.clear_hold(target, resource_version)
    }
}

/// Two pods that each fit gpu-b's best GPU but not both: the node's lock makes the second bind
/// re-check against the first and choose another GPU.
#[tokio::test]
async fn concurrent_binds_to_one_node_never_double_book_a_gpu() {
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    // gpu-b now reports a single, empty 40 GiB GPU.
    let gpu = mk_gpu(0, "GPU-00000000-aaaa-bbbb-cccc-00000000000", 40960 << 20, 0);
    index.apply_report(&mk_report("gpu-b", "2026-11-21T17:48:20Z", vec![gpu]));
    // The fillers' GPUs 1-3 are gone from the report; the index would charge their 10 GiB to
    // the remaining GPU (a pod's memory does not vanish with its GPU's entry), so they go too.
    for n in 1..=3 {
        index.delete_pod_key(&format!("uid-filler-gpu-b-{n}"));
    }
    for name in ["a", "b"] {
        let pod = mk_pod(name, &[("peakfit.io/vram", "24Gi")]);
        index.apply_pod(&pod);
    }
    let writer = Arc::new(SlowBinder::default());
    let h = harness_with(
        index.clone(),
        writer.clone(),
        Arc::new(MemoryBinder::default()),
    );
    let req = |name: &str| {
        serde_json::to_vec(&serde_json::json!({
            "PodName": name, "PodNamespace": "ml", "PodUID": format!("uid-{name}"), "Node": "gpu-b"
        }))
        .unwrap()
    };
    let (a, b) = tokio::join!(
        call(&h.router, "POST", "/bind", req("a")),
        call(&h.router, "POST", "/bind", req("b"))
    );
    let errors: Vec<String> = [a, b]
        .iter()
        .map(|(_, r)| json(r)["Error"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        errors.iter().filter(|e| e.is_empty()).count(),
        1,
        "exactly one of two 24 GiB pods fits one 40 GiB GPU: {errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("no longer fits")),
        "{errors:?}"
    );
    assert_eq!(writer.0.bindings.lock().len(), 1);
    let l = index.node("gpu-b").unwrap().read().ledger.clone();
    let ours = ["uid-a", "uid-b"]
        .iter()
        .filter(|k| l.gpus[0].reservation(k).is_some())
        .count();
    assert_eq!(ours, 1, "{:?}", l.gpus[0].reservations());
}

const TIMED_OUT: &[u8] = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcdserver: request timed out","code":500}"#;

/// Issue 11: the Binding failed and the pod is still unbound: bind errs, writes nothing more
/// (the annotations travel with the Binding, so there is nothing to take back) and reserves
/// nothing.
#[tokio::test]
async fn a_failed_binding_writes_nothing_and_reserves_nothing() {
    let (index, _h, err) = bind_through(|mut handle| async move {
        let (_, send) = expect_binding(&mut handle).await;
        respond(send, 500, TIMED_OUT.to_vec());
        answer_read_back(&mut handle, None, &serde_json::json!({})).await;
        expect_no_more_requests(&mut handle).await;
    })
    .await;
    assert!(err.contains("request timed out"), "{err}");
    assert!(!reserved_on_gpu_b(&index));
}

/// A Binding answered with an error that went through anyway (a retried request): the pod reads
/// back bound to the node asked, with bind's annotations, and that is a success. Bound there
/// without them (someone else's Binding) it is not.
#[tokio::test]
async fn a_binding_that_went_through_despite_an_error_counts_only_with_its_annotations() {
    for (annotated, ok) in [(true, true), (false, false)] {
        let (index, _h, err) = bind_through(move |mut handle| async move {
            let (binding, send) = expect_binding(&mut handle).await;
            respond(send, 500, TIMED_OUT.to_vec());
            let on_pod = if annotated {
                binding["metadata"]["annotations"].clone()
            } else {
                serde_json::json!({})
            };
            answer_read_back(&mut handle, Some("gpu-b"), &on_pod).await;
        })
        .await;
        assert_eq!(err.is_empty(), ok, "annotated {annotated}: {err:?}");
        assert_eq!(reserved_on_gpu_b(&index), ok, "annotated {annotated}");
    }
}

/// Issue 11: kube-scheduler retries binds. A repeat to the same node is a success that writes
/// nothing; to another node an error that writes nothing and keeps the first reservation.
#[tokio::test]
async fn a_repeated_bind_is_idempotent_and_another_node_is_refused() {
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    let binder = Arc::new(MemoryBinder::default());
    let h = harness_with(index.clone(), binder.clone(), binder.clone());
    let request = bind_request(&dir);
    for _ in 0..3 {
        let (code, reply) = call(&h.router, "POST", "/bind", request.clone()).await;
        assert_eq!(code, 200);
        assert_eq!(json(&reply), serde_json::json!({"Error": ""}));
    }
    assert_eq!(binder.bindings.lock().len(), 1, "written once");
    let mut elsewhere: Value = serde_json::from_slice(&request).unwrap();
    elsewhere["Node"] = "gpu-a".into();
    let (_, reply) = call(
        &h.router,
        "POST",
        "/bind",
        serde_json::to_vec(&elsewhere).unwrap(),
    )
    .await;
    let err = json(&reply)["Error"].as_str().unwrap().to_owned();
    assert!(err.contains("already bound to node gpu-b"), "{err}");
    assert_eq!(binder.bindings.lock().len(), 1, "nothing written");
    assert!(reserved_on_gpu_b(&index));
    let (_, metrics) = call(&h.router, "GET", "/metrics", vec![]).await;
    let text = String::from_utf8(metrics).unwrap();
    for line in [
        r#"peakfit_extender_decisions_total{verb="bind",outcome="bound"} 1"#,
        r#"peakfit_extender_decisions_total{verb="bind",outcome="already_bound"} 2"#,
        r#"peakfit_extender_decisions_total{verb="bind",outcome="bound_elsewhere"} 1"#,
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// The probe's reproduction: 32 concurrent binds of one pod, half to each of two nodes. Before
/// the fix all 32 succeeded and the reservation moved; now the pod is bound once, every bind to
/// that node answers success (the first binds, the rest are idempotent repeats), and every bind
/// to the other node is refused (before: a conflict if it did not fit; after: bound elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_binds_of_one_pod_to_two_nodes_bind_it_once() {
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    let binder = Arc::new(MemoryBinder::default());
    let h = harness_with(index.clone(), binder.clone(), binder.clone());
    let request: Value = serde_json::from_slice(&bind_request(&dir)).unwrap();
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let mut r = request.clone();
            let node = if i % 2 == 0 { "gpu-a" } else { "gpu-b" };
            r["Node"] = node.into();
            let router = h.router.clone();
            tokio::spawn(async move {
                let (code, reply) =
                    call(&router, "POST", "/bind", serde_json::to_vec(&r).unwrap()).await;
                assert_eq!(code, 200);
                let error = json(&reply)["Error"].as_str().unwrap().to_owned();
                (node, error)
            })
        })
        .collect();
    let mut replies = Vec::new();
    for c in calls {
        replies.push(c.await.unwrap());
    }
    let bindings = binder.bindings.lock();
    assert_eq!(bindings.len(), 1, "bound once: {:?}", bindings.len());
    let winner = bindings[0].0.node.clone();
    drop(bindings);
    for (node, error) in &replies {
        if *node == winner {
            assert_eq!(error, "", "a bind to {node}, where the pod is bound");
        } else {
            assert!(!error.is_empty(), "a bind to {node} succeeded too");
        }
    }
}
