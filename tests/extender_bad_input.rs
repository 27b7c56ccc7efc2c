//! Bad input: malformed bodies get a 400 with a JSON body naming the problem, unknown paths a
//! 404, nothing makes the server panic, and a full-node request for 5,000 nodes is accepted.

mod extender_support;

use std::sync::Arc;

use extender_support::*;
use peakfit::cluster::index::Index;
use proptest::prelude::*;

const VERBS: [&str; 4] = ["/filter", "/prioritize", "/bind", "/preempt"];

fn nasty_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let deep = "[".repeat(100_000).into_bytes();
    vec![
        ("empty", vec![]),
        ("truncated", br#"{"Pod":{"metadata":"#.to_vec()),
        ("not json", b"hello".to_vec()),
        ("null", b"null".to_vec()),
        ("array", b"[]".to_vec()),
        (
            "wrong type",
            br#"{"Pod":5,"NodeNames":"gpu-a","PodName":[],"NodeNameToMetaVictims":7}"#.to_vec(),
        ),
        (
            "bad utf-8",
            vec![b'{', b'"', 0xff, 0xfe, b'"', b':', b'1', b'}'],
        ),
        ("deep nesting", deep),
        (
            "huge number",
            br#"{"Pod":{"spec":{"priority":1e999}}, "PodName": 1e999}"#.to_vec(),
        ),
    ]
}

#[tokio::test]
async fn malformed_bodies_get_a_400_naming_the_problem() {
    let h = harness(Arc::new(Index::new()));
    for verb in VERBS {
        for (what, body) in nasty_bodies() {
            let (status, reply) = call(&h.router, "POST", verb, body).await;
            assert_eq!(
                status,
                400,
                "{verb} {what}: {}",
                String::from_utf8_lossy(&reply)
            );
            let v = json(&reply);
            let err = v["error"].as_str().unwrap();
            assert!(err.contains("not a valid"), "{verb} {what}: {err}");
            assert_eq!(v["verb"], verb.trim_start_matches('/'));
        }
    }
}

#[tokio::test]
async fn well_formed_but_useless_requests_get_protocol_answers() {
    let h = harness(Arc::new(Index::new()));
    // No pod: filter answers Error (HAMi's route tests send exactly this).
    let (s, r) = call(
        &h.router,
        "POST",
        "/filter",
        br#"{"Pod":null,"NodeNames":["node1"]}"#.to_vec(),
    )
    .await;
    assert_eq!(s, 200);
    assert!(json(&r)["Error"].as_str().unwrap().contains("no Pod"));
    // Neither candidate field.
    let (_, r) = call(
        &h.router,
        "POST",
        "/filter",
        br#"{"Pod":{"metadata":{"name":"p"}}}"#.to_vec(),
    )
    .await;
    assert!(json(&r)["Error"].as_str().unwrap().contains("NodeNames"));
    // A node peakfit never heard of.
    let body = br#"{"Pod":{"metadata":{"name":"p","annotations":{"peakfit.io/vram":"1Gi"}}},"NodeNames":["ghost"]}"#;
    let (_, r) = call(&h.router, "POST", "/filter", body.to_vec()).await;
    let v = json(&r);
    assert_eq!(v["NodeNames"], serde_json::json!([]));
    assert!(
        v["FailedAndUnresolvableNodes"]["ghost"]
            .as_str()
            .unwrap()
            .contains("no GPU report")
    );
    // Bind lacking fields names them.
    let (_, r) = call(&h.router, "POST", "/bind", br#"{"PodName":"x"}"#.to_vec()).await;
    let e = json(&r)["Error"].as_str().unwrap().to_owned();
    assert!(e.contains("PodNamespace") && e.contains("Node"), "{e}");
    // Bind of a pod peakfit has never seen.
    let (_, r) = call(
        &h.router,
        "POST",
        "/bind",
        br#"{"PodName":"x","PodNamespace":"y","PodUID":"z","Node":"n"}"#.to_vec(),
    )
    .await;
    assert!(
        json(&r)["Error"]
            .as_str()
            .unwrap()
            .contains("not in peakfit's cache")
    );
    // Prioritize and preempt without a pod are refused as filter refuses it (their replies have
    // no error field, so with a 400 naming the field); they answered a silent 200 before.
    for verb in ["/prioritize", "/preempt"] {
        let (s, r) = call(
            &h.router,
            "POST",
            verb,
            br#"{"Pod":null,"NodeNames":["n"]}"#.to_vec(),
        )
        .await;
        assert_eq!(s, 400, "{verb}");
        let v = json(&r);
        assert!(
            v["error"].as_str().unwrap().contains("no Pod"),
            "{verb}: {v}"
        );
        assert_eq!(v["verb"], verb.trim_start_matches('/'));
    }
    // A node without a name in full-node mode is a 400 naming the field.
    let (s, r) = call(
        &h.router,
        "POST",
        "/filter",
        br#"{"Pod":{},"Nodes":{"items":[{"metadata":{}}]}}"#.to_vec(),
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        json(&r)["error"]
            .as_str()
            .unwrap()
            .contains("metadata.name")
    );
}

#[tokio::test]
async fn unknown_paths_and_methods() {
    let h = harness(Arc::new(Index::new()));
    for path in ["/", "/filterx", "/a/b/filter", "/peakfit/nope"] {
        let (s, r) = call(&h.router, "POST", path, b"{}".to_vec()).await;
        assert_eq!(s, 404, "{path}");
        assert!(json(&r)["error"].as_str().unwrap().contains(path));
    }
    // A wrong method is a JSON 405 too (axum's default was an empty body).
    for (method, path) in [
        ("GET", "/filter"),
        ("PUT", "/peakfit/bind"),
        ("POST", "/healthz"),
    ] {
        let (s, r) = call(&h.router, method, path, vec![]).await;
        assert_eq!(s, 405, "{method} {path}");
        assert!(
            json(&r)["error"].as_str().unwrap().contains(path),
            "{method} {path}"
        );
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (s, _) = call(&h.router, "GET", path, vec![]).await;
        assert_eq!(s, 200, "{path}");
    }
}

#[tokio::test]
async fn the_metrics_listener_serves_no_verbs() {
    let h = harness(Arc::new(Index::new()));
    let ops = peakfit::extender::routes::ops_router(h.ext.clone());
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (s, _) = call(&ops, "GET", path, vec![]).await;
        assert_eq!(s, 200, "{path}");
    }
    for path in ["/filter", "/bind", "/peakfit/preempt"] {
        let body = br#"{"Pod":null,"NodeNames":[]}"#.to_vec();
        let (s, _) = call(&ops, "POST", path, body).await;
        assert_eq!(s, 404, "{path}");
    }
}

#[tokio::test]
async fn readyz_waits_for_every_watch() {
    let readiness = peakfit::extender::Readiness::waiting_for(3);
    let ext = peakfit::extender::Extender::new(
        Arc::new(Index::new()),
        Arc::new(peakfit::metrics::extender::ExtenderMetrics::new()),
        Arc::new(peakfit::cluster::binding::MemoryBinder::default()),
    )
    .with_readiness(readiness.clone());
    let router = peakfit::extender::routes::router(Arc::new(ext));
    let (s, _) = call(&router, "GET", "/readyz", vec![]).await;
    assert_eq!(s, 503);
    let body = br#"{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n"]}"#.to_vec();
    let (s, r) = call(&router, "POST", "/filter", body.clone()).await;
    assert_eq!(s, 200);
    assert!(json(&r)["Error"].as_str().unwrap().contains("not synced"));
    for _ in 0..3 {
        readiness.synced();
    }
    let (s, _) = call(&router, "GET", "/readyz", vec![]).await;
    assert_eq!(s, 200);
    let (_, r) = call(&router, "POST", "/filter", body).await;
    assert_eq!(json(&r)["Error"], "");
}

/// A body over --max-body-bytes is a JSON 413 (axum's was plain text), whether its length is
/// declared or it simply keeps coming.
#[tokio::test]
async fn a_body_over_the_limit_gets_a_json_413() {
    let metrics = Arc::new(peakfit::metrics::extender::ExtenderMetrics::new());
    let ext = peakfit::extender::Extender::new(
        Arc::new(Index::new()),
        metrics,
        Arc::new(peakfit::cluster::binding::MemoryBinder::default()),
    )
    .with_body_limits(peakfit::extender::BodyLimits::new(
        1024,
        4096,
        std::time::Duration::from_secs(5),
    ));
    let router = peakfit::extender::routes::router(Arc::new(ext));
    let (s, r) = call(&router, "POST", "/filter", vec![b' '; 2048]).await;
    assert_eq!(s, 413);
    let v = json(&r);
    assert!(
        v["error"].as_str().unwrap().contains("--max-body-bytes"),
        "{v}"
    );
    assert_eq!(v["verb"], "filter");
    // Without Content-Length (a stream): cut off at the limit.
    let stream = futures::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 600]))),
    );
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/bind")
        .body(axum::body::Body::from_stream(stream))
        .unwrap();
    let resp = tower::ServiceExt::oneshot(router, req).await.unwrap();
    assert_eq!(resp.status(), 413);
}

/// 5,000 full Nodes (the capture's, renamed) come to ~20 MB: well past axum's 2 MB default.
#[tokio::test]
async fn a_full_node_request_for_5000_nodes_is_accepted() {
    let dir = capture_dir();
    let mut req = json(&std::fs::read(dir.join("full-nodes/001-filter-request.json")).unwrap());
    let template = req["Nodes"]["items"][0].clone();
    let items: Vec<serde_json::Value> = (0..5000)
        .map(|i| {
            let mut n = template.clone();
            n["metadata"]["name"] = format!("node-{i:04}").into();
            n
        })
        .collect();
    req["Nodes"]["items"] = items.into();
    let body = serde_json::to_vec(&req).unwrap();
    assert!(body.len() > 2 << 20, "{} bytes", body.len());
    let h = harness(Arc::new(Index::new()));
    let (s, r) = call(&h.router, "POST", "/filter", body).await;
    assert_eq!(s, 200);
    let v = json(&r);
    // An empty index knows none of them: every one of the 5,000 is refused, and named.
    let kept = v["Nodes"]["items"].as_array().map_or(0, Vec::len);
    let refused = v["FailedNodes"].as_object().unwrap().len()
        + v["FailedAndUnresolvableNodes"].as_object().unwrap().len();
    assert_eq!((kept, refused), (0, 5000));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random bytes, and random JSON shaped like the protocol, never get a 5xx or a panic.
    #[test]
    fn no_input_makes_the_server_fail(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        names in prop::collection::vec("[a-z<>&\u{2028}-]{0,8}", 0..4),
        vram in "[0-9a-zA-Z.]{0,6}",
        gpus in "[0-9-]{0,3}",
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let h = harness(Arc::new(Index::new()));
            let shaped = serde_json::to_vec(&serde_json::json!({
                "Pod": {"metadata": {"name": "p", "uid": "u", "annotations": {
                    "peakfit.io/vram": vram, "peakfit.io/gpus": gpus}}},
                "NodeNames": names,
                "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "u"}], "NumPDBViolations": 0}},
                "PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n",
            })).unwrap();
            for verb in VERBS {
                for body in [bytes.clone(), shaped.clone()] {
                    let (s, _) = call(&h.router, "POST", verb, body).await;
                    assert!(s == 200 || s == 400, "{verb}: {s}");
                }
            }
        });
    }
}

/// Requests wait for room in `--max-body-bytes-in-flight`, up to the body timeout, then get a
/// JSON 503: 8 concurrent 250 MiB bodies once took the extender to 2.2 GB.
#[tokio::test]
async fn a_request_without_room_in_the_bytes_in_flight_budget_gets_a_json_503() {
    let ext = Arc::new(
        peakfit::extender::Extender::new(
            Arc::new(Index::new()),
            Arc::new(peakfit::metrics::extender::ExtenderMetrics::new()),
            Arc::new(peakfit::cluster::binding::MemoryBinder::default()),
        )
        .with_body_limits(peakfit::extender::BodyLimits::new(
            1024,
            1024,
            std::time::Duration::from_millis(300),
        )),
    );
    let router = peakfit::extender::routes::router(ext.clone());
    let held = ext.body.reserve(1024).await;
    let (s, r) = call(&router, "POST", "/filter", b"{}".to_vec()).await;
    assert_eq!(s, 503);
    let v = json(&r);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("--max-body-bytes-in-flight"),
        "{v}"
    );
    assert_eq!(v["verb"], "filter");
    // Room again: the same request is read and answered.
    drop(held);
    let (s, _) = call(&router, "POST", "/filter", b"{}".to_vec()).await;
    assert_eq!(s, 200);
}

/// The filter's work is held here until the test opens it (the extender reads its clock while
/// it decides), so the test can see which thread it blocks.
static GATE: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

fn gated_clock() -> i64 {
    let (open, cv) = &GATE;
    let mut open = open.lock().unwrap();
    while !*open {
        open = cv.wait(open).unwrap();
    }
    capture_clock()
}

/// Decoding and filter's work run on the blocking pool: with the runtime's only async worker
/// free, `/healthz` answers while a filter is stuck mid-decision. Run on that worker (before
/// the fix), the filter held it, and `/healthz` (and bind) waited behind every filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn healthz_answers_while_a_filter_is_busy() {
    let dir = capture_dir();
    let index = fixture_index(&dir, &node_cache_uids());
    let ext = Arc::new(
        peakfit::extender::Extender::new(
            index,
            Arc::new(peakfit::metrics::extender::ExtenderMetrics::new()),
            Arc::new(peakfit::cluster::binding::MemoryBinder::default()),
        )
        .with_clock(gated_clock),
    );
    let router = peakfit::extender::routes::router(ext);
    let body = std::fs::read(dir.join("node-cache/001-filter-request.json")).unwrap();
    let filter = tokio::spawn({
        let router = router.clone();
        async move { call(&router, "POST", "/filter", body).await }
    });
    // Let the filter reach the gate.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (tx, rx) = std::sync::mpsc::channel();
    tokio::spawn(async move {
        let _ = tx.send(call(&router, "GET", "/healthz", vec![]).await.0);
    });
    // A blocking wait on this (non-worker) thread: if the worker is stuck, nothing answers.
    let healthz = rx.recv_timeout(std::time::Duration::from_secs(20));
    let (open, cv) = &GATE;
    *open.lock().unwrap() = true;
    cv.notify_all();
    assert_eq!(
        healthz.ok().map(|s| s.as_u16()),
        Some(200),
        "/healthz did not answer while a filter was busy"
    );
    let (s, _) = filter.await.unwrap();
    assert_eq!(s, 200);
}
