//! Publishing through kube's tower-test mock API server: the agent's writes are server-side
//! applies of the `NodeGpuReport` and its status subresource, under the field manager
//! `peakfit-agent`, with ownership forced.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use peakfit::agent::publish::{FIELD_MANAGER, PublishError, Publisher};
use peakfit::inventory::{GpuDevice, NodeGpuReportStatus, NvmlStatus};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn mock_client() -> (kube::Client, ApiHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}

fn status() -> NodeGpuReportStatus {
    NodeGpuReportStatus {
        observed_at: "2026-11-21T18:00:00Z".into(),
        nvml: NvmlStatus {
            up: true,
            driver_version: Some("550.54.15".into()),
            reason: None,
        },
        gpus: vec![GpuDevice {
            uuid: "GPU-8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_bytes: 85_899_345_920,
            memory_free_bytes: 85_899_345_920,
            ..GpuDevice::default()
        }],
        ..NodeGpuReportStatus::default()
    }
}

/// The object the API server answers with (what a real one returns after an apply).
fn stored(node: &str, status: Option<&NodeGpuReportStatus>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "peakfit.io/v1alpha1",
        "kind": "NodeGpuReport",
        "metadata": { "name": node, "resourceVersion": "7" },
        "spec": { "nodeName": node },
        "status": status,
    }))
    .unwrap()
}

/// Waits for the next request and checks that it is a forced server-side apply to `path`.
async fn expect_apply(
    handle: &mut ApiHandle,
    path: &str,
) -> (Value, mock::SendResponse<Response<Body>>) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request for {path}"))
        .expect("the client hung up");
    assert_eq!(request.method(), Method::PATCH);
    assert_eq!(request.uri().path(), path);
    let query = request.uri().query().unwrap_or_default();
    assert!(
        query.contains(&format!("fieldManager={FIELD_MANAGER}")) && query.contains("force=true"),
        "query: {query}"
    );
    assert_eq!(
        request.headers().get(http::header::CONTENT_TYPE).unwrap(),
        "application/apply-patch+yaml"
    );
    let body = request.into_body().collect_bytes().await.unwrap();
    (serde_json::from_slice(&body).unwrap(), send)
}

const OBJECT: &str = "/apis/peakfit.io/v1alpha1/nodegpureports/gpu-node-1";
const STATUS: &str = "/apis/peakfit.io/v1alpha1/nodegpureports/gpu-node-1/status";

#[tokio::test]
async fn applies_the_object_once_then_only_the_status() {
    let (client, mut handle) = mock_client();
    let server = tokio::spawn(async move {
        let (body, send) = expect_apply(&mut handle, OBJECT).await;
        assert_eq!(
            body,
            json!({
                "apiVersion": "peakfit.io/v1alpha1",
                "kind": "NodeGpuReport",
                "metadata": { "name": "gpu-node-1" },
                "spec": { "nodeName": "gpu-node-1" },
            })
        );
        send.send_response(Response::new(Body::from(stored("gpu-node-1", None))));

        for _ in 0..2 {
            let (body, send) = expect_apply(&mut handle, STATUS).await;
            assert_eq!(body["apiVersion"], "peakfit.io/v1alpha1");
            assert_eq!(body["kind"], "NodeGpuReport");
            assert_eq!(body["status"], serde_json::to_value(status()).unwrap());
            assert!(body.get("spec").is_none(), "a status apply carries no spec");
            send.send_response(Response::new(Body::from(stored(
                "gpu-node-1",
                Some(&status()),
            ))));
        }
        handle
    });

    let mut publisher = Publisher::new(client, "gpu-node-1");
    publisher.publish(&status()).await.unwrap();
    publisher.publish(&status()).await.unwrap();
    let mut handle = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("mock API server finished")
        .expect("mock API server assertions");
    // Nothing else was sent.
    drop(publisher);
    assert!(handle.next_request().await.is_none());
}

#[tokio::test]
async fn a_deleted_object_is_applied_again_after_a_404() {
    let (client, mut handle) = mock_client();
    let not_found = || {
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "nodegpureports.peakfit.io \"gpu-node-1\" not found",
            "reason": "NotFound", "code": 404,
        });
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    };
    let server = tokio::spawn(async move {
        let (_, send) = expect_apply(&mut handle, OBJECT).await;
        send.send_response(Response::new(Body::from(stored("gpu-node-1", None))));
        let (_, send) = expect_apply(&mut handle, STATUS).await;
        send.send_response(not_found());
        // The next publish starts over with the object.
        let (_, send) = expect_apply(&mut handle, OBJECT).await;
        send.send_response(Response::new(Body::from(stored("gpu-node-1", None))));
        let (_, send) = expect_apply(&mut handle, STATUS).await;
        send.send_response(Response::new(Body::from(stored(
            "gpu-node-1",
            Some(&status()),
        ))));
    });

    let mut publisher = Publisher::new(client, "gpu-node-1");
    let err = publisher.publish(&status()).await.unwrap_err();
    assert!(matches!(err, PublishError::Status { .. }), "{err}");
    assert!(err.to_string().contains("gpu-node-1"), "{err}");
    publisher.publish(&status()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("mock API server finished")
        .expect("mock API server assertions");
}
