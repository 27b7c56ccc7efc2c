//! `peakfit webhook` over HTTP: AdmissionReview v1 JSON in, AdmissionReview out, with the JSON
//! patch decoded from base64 and applied to the pod to check what the API server would store.

use axum::body::Body;
use base64::Engine as _;
use http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use peakfit::webhook::{Mutator, router};
use serde_json::{Value, json};
use tower::ServiceExt as _;

fn app() -> axum::Router {
    router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
    })
}

/// An AdmissionReview as kube-apiserver sends it for a pod CREATE (after defaulting, so the pod
/// names default-scheduler).
fn review(annotations: Value, containers: Value, init_containers: Value) -> Value {
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:ml:deployer", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "llama-", "namespace": "ml", "annotations": annotations},
                "spec": {
                    "schedulerName": "default-scheduler",
                    "restartPolicy": "Always",
                    "containers": containers,
                    "initContainers": init_containers,
                },
            },
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    })
}

async fn post(path: &str, body: &Value) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    let response = app().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The patch as the API server reads it: a base64 string holding a JSON array of operations.
fn decoded_patch(review: &Value) -> Vec<Value> {
    let response = &review["response"];
    assert_eq!(response["patchType"], "JSONPatch", "{review}");
    let encoded = response["patch"]
        .as_str()
        .unwrap_or_else(|| panic!("patch is not a base64 string: {review}"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("patch is base64");
    serde_json::from_slice(&raw).expect("patch is a JSON array")
}

fn downward(name: &str, annotation: &str) -> Value {
    json!({
        "name": name,
        "valueFrom": {"fieldRef": {"fieldPath": format!("metadata.annotations['{annotation}']")}}
    })
}

#[tokio::test]
async fn opted_in_pod_gets_scheduler_and_downward_env_in_every_container() {
    let input = review(
        json!({"peakfit.io/vram": "20Gi", "peakfit.io/gpus": "2"}),
        json!([
            {"name": "server", "image": "vllm", "env": [{"name": "HF_HOME", "value": "/cache"}]},
            {"name": "sidecar", "image": "proxy"}
        ]),
        json!([{"name": "fetch-weights", "image": "fetch"}]),
    );
    let (status, out) = post("/mutate", &input).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(
        out["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(out["response"]["allowed"], true);

    let ops = decoded_patch(&out);
    let gpus = downward("NVIDIA_VISIBLE_DEVICES", "peakfit.io/assigned-gpus");
    let bytes = downward("PEAKFIT_VRAM_BYTES", "peakfit.io/reserved-bytes");
    assert_eq!(
        ops,
        vec![
            json!({"op": "replace", "path": "/spec/schedulerName", "value": "peakfit-scheduler"}),
            // A container with env gets entries appended; one without gets the whole list.
            json!({"op": "add", "path": "/spec/containers/0/env/-", "value": gpus}),
            json!({"op": "add", "path": "/spec/containers/0/env/-", "value": bytes}),
            json!({"op": "add", "path": "/spec/containers/1/env", "value": [gpus, bytes]}),
            json!({"op": "add", "path": "/spec/initContainers/0/env", "value": [gpus, bytes]}),
        ]
    );
    // No fraction for an explicit-vram pod: only fraction-budget engines get one.
    assert!(
        !out.to_string().contains("PEAKFIT_GPU_MEMORY_FRACTION"),
        "{out}"
    );

    // Applied to the pod, the patch gives what the kubelet will resolve.
    let mut pod = input["request"]["object"].clone();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
    json_patch::patch(&mut pod, &patch.0).expect("patch applies to the pod it was made for");
    assert_eq!(pod["spec"]["schedulerName"], "peakfit-scheduler");
    assert_eq!(
        pod["spec"]["containers"][0]["env"],
        json!([{"name": "HF_HOME", "value": "/cache"}, gpus, bytes])
    );
}

#[tokio::test]
async fn invalid_annotation_is_refused_with_the_models_message() {
    let annotations = json!({"peakfit.io/vram": "twenty gigs"});
    let expected =
        peakfit::model::pod_request(&serde_json::from_value(annotations.clone()).unwrap())
            .expect_err("the model refuses this value")
            .to_string();
    assert!(
        expected.contains("vram") && expected.contains("twenty gigs"),
        "{expected}"
    );

    let input = review(annotations, json!([{"name": "c", "image": "i"}]), json!([]));
    let (status, out) = post("/mutate", &input).await;
    assert_eq!(status, StatusCode::OK);
    let response = &out["response"];
    assert_eq!(response["allowed"], false, "{out}");
    assert_eq!(response["status"]["message"], expected.as_str());
    assert_eq!(response["status"]["code"], 400);
    assert!(response.get("patch").is_none(), "{out}");
}

#[tokio::test]
async fn pod_without_peakfit_annotations_passes_through_untouched() {
    let input = review(
        json!({"prometheus.io/scrape": "true"}),
        json!([{"name": "c", "image": "nginx"}]),
        json!([]),
    );
    let (status, out) = post("/mutate", &input).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"].get("patch").is_none(), "{out}");
    assert!(out["response"].get("patchType").is_none(), "{out}");
}

#[tokio::test]
async fn namespace_opt_in_takes_a_pod_without_annotations() {
    let input = review(json!({}), json!([{"name": "c", "image": "i"}]), json!([]));
    let (_, out) = post("/mutate/namespace", &input).await;
    assert_eq!(out["response"]["allowed"], true);
    assert_eq!(
        decoded_patch(&out),
        vec![json!({"op": "replace", "path": "/spec/schedulerName", "value": "peakfit-scheduler"})]
    );
}

#[tokio::test]
async fn garbage_is_rejected_at_http_level_and_healthz_answers() {
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from("{not json"))
        .unwrap();
    let response = app().oneshot(request).await.unwrap();
    assert!(response.status().is_client_error(), "{}", response.status());

    let response = app()
        .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
