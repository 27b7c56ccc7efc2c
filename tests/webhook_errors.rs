//! The webhook's replies to requests that are not `AdmissionReviews`: each a JSON `{"error"}` with
//! the status axum used to give as plain text or an empty body; and a pod with 5,000 containers
//! answered with a base64 patch.

mod webhook_support;

use axum::body::Body;
use base64::Engine as _;
use http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use peakfit::webhook::{Mutator, router};
use serde_json::Value;
use tower::ServiceExt as _;

async fn send(method: &str, path: &str, content_type: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
        gpu_memory_resource: None,
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    });
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: {status} reply is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, v)
}

#[tokio::test]
async fn every_error_reply_is_json() {
    let json_ct = "application/json";
    let cases: [(&str, &str, &str, &[u8], u16); 6] = [
        ("POST", "/mutate", json_ct, b"{not json", 400),
        ("POST", "/mutate", "text/plain", b"{}", 415),
        ("POST", "/mutate", json_ct, br#"{"request": 5}"#, 422),
        ("POST", "/nope", json_ct, b"{}", 404),
        ("GET", "/mutate", json_ct, b"", 405),
        ("POST", "/mutate/namespace", json_ct, b"", 400),
    ];
    for (method, path, ct, body, want) in cases {
        let (status, v) = send(method, path, ct, body.to_vec()).await;
        assert_eq!(status.as_u16(), want, "{method} {path}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
    let (status, v) = send(
        "POST",
        "/mutate",
        json_ct,
        vec![b' '; peakfit::webhook::MAX_REVIEW_BYTES + 1],
    )
    .await;
    assert_eq!(status, 413, "{v}");
}

/// The probe's pod with 5,000 containers: answered, with the patch as base64 (serialising it as
/// a JSON array of numbers first is what took 132 MiB).
#[tokio::test]
async fn a_pod_with_5000_containers_gets_a_base64_patch() {
    let review = webhook_support::big_pod_review(5000);
    let (status, v) = send(
        "POST",
        "/mutate",
        "application/json",
        serde_json::to_vec(&review).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["response"]["allowed"], true, "{v}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(v["response"]["patch"].as_str().expect("patch is a string"))
        .unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch).unwrap();
    // schedulerName plus one env op per container.
    assert_eq!(ops.len(), 5001);
}
