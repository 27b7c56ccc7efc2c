//! The example workloads in deploy/examples go through the real webhook and model: each must be
//! admitted and opted in, and only the fraction-budget engine gets `PEAKFIT_GPU_MEMORY_FRACTION`.

use std::path::Path;

use axum::body::Body;
use base64::Engine as _;
use http::Request;
use http_body_util::BodyExt as _;
use peakfit::webhook::{Mutator, router};
use serde_json::{Value, json};
use tower::ServiceExt as _;

/// The pod (or pod template, as a pod) of an example manifest.
fn example_pod(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/examples")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let object: Value = serde_saphyr::from_str(&text).expect("example parses as YAML");
    match object["kind"].as_str() {
        Some("Pod") => object,
        Some("Deployment" | "Job") => json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": object["spec"]["template"]["metadata"],
            "spec": object["spec"]["template"]["spec"],
        }),
        other => panic!("{name}: unexpected kind {other:?}"),
    }
}

/// What the webhook answers for the pod's CREATE: (allowed, decoded patch operations).
async fn admit(mut pod: Value) -> (Value, Vec<Value>) {
    // The API server defaults schedulerName before admission webhooks run.
    if pod["spec"]["schedulerName"].is_null() {
        pod["spec"]["schedulerName"] = "default-scheduler".into();
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "example", "operation": "CREATE", "namespace": "ml",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "example"}, "object": pod,
        }
    });
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
        gpu_memory_resource: None,
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    });
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from(review.to_string()))
        .unwrap();
    let body = app
        .oneshot(request)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let out: Value = serde_json::from_slice(&body).unwrap();
    let response = out["response"].clone();
    let ops = match response["patch"].as_str() {
        Some(b64) => serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap(),
        None => Vec::new(),
    };
    (response, ops)
}

fn env_names(ops: &[Value]) -> Vec<String> {
    ops.iter()
        .filter(|op| op["path"].as_str().is_some_and(|p| p.contains("/env")))
        .flat_map(|op| match &op["value"] {
            Value::Array(items) => items.clone(),
            one => vec![one.clone()],
        })
        .filter_map(|env| env["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn vllm_example_is_opted_in_with_the_engine_fraction() {
    let (response, ops) = admit(example_pod("vllm-server.yaml")).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        env_names(&ops),
        [
            "NVIDIA_VISIBLE_DEVICES",
            "PEAKFIT_VRAM_BYTES",
            "PEAKFIT_GPU_MEMORY_FRACTION"
        ],
        "{ops:?}"
    );
}

#[tokio::test]
async fn lora_and_explicit_examples_are_opted_in_without_a_fraction() {
    for name in ["lora-finetune.yaml", "explicit-vram.yaml"] {
        let (response, ops) = admit(example_pod(name)).await;
        assert_eq!(response["allowed"], true, "{name}: {response}");
        assert_eq!(
            env_names(&ops),
            ["NVIDIA_VISIBLE_DEVICES", "PEAKFIT_VRAM_BYTES"],
            "{name}: {ops:?}"
        );
    }
}

#[tokio::test]
async fn a_model_typo_in_an_example_would_be_refused() {
    let mut pod = example_pod("vllm-server.yaml");
    pod["metadata"]["annotations"]["peakfit.io/dtype"] = "bf17".into();
    let (response, _) = admit(pod).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("peakfit.io/dtype") && message.contains("bf17"),
        "{message}"
    );
}
