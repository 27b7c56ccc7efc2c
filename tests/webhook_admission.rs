//! `peakfit webhook` over HTTP: `AdmissionReview` v1 JSON in, `AdmissionReview` out, with the JSON
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
        gpu_memory_resource: None,
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    })
}

/// An `AdmissionReview` as kube-apiserver sends it for a pod CREATE (after defaulting, so the pod
/// names default-scheduler).
fn review(annotations: &Value, containers: &Value, init_containers: &Value) -> Value {
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
        &json!({"peakfit.io/vram": "20Gi", "peakfit.io/gpus": "2"}),
        &json!([
            {"name": "server", "image": "vllm", "env": [{"name": "HF_HOME", "value": "/cache"}]},
            {"name": "sidecar", "image": "proxy"}
        ]),
        &json!([{"name": "fetch-weights", "image": "fetch"}]),
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

    let input = review(
        &annotations,
        &json!([{"name": "c", "image": "i"}]),
        &json!([]),
    );
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
        &json!({"prometheus.io/scrape": "true"}),
        &json!([{"name": "c", "image": "nginx"}]),
        &json!([]),
    );
    let (status, out) = post("/mutate", &input).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"].get("patch").is_none(), "{out}");
    assert!(out["response"].get("patchType").is_none(), "{out}");
}

#[tokio::test]
async fn namespace_opt_in_takes_a_pod_without_annotations() {
    let input = review(
        &json!({}),
        &json!([{"name": "c", "image": "i"}]),
        &json!([]),
    );
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

/// An UPDATE of a pod `kubectl annotate --overwrite` would send: `old` and `new` annotations,
/// `node` the pod's `spec.nodeName` (both objects; binding does not change with annotate).
fn update(old: Value, new: &Value, node: Option<&str>) -> Value {
    let mut r = review(new, &json!([{"name": "c", "image": "i"}]), &json!([]));
    let req = &mut r["request"];
    req["operation"] = "UPDATE".into();
    req["options"] = json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"});
    req["object"]["metadata"]["name"] = "llama-0".into();
    req["object"]["spec"]["schedulerName"] = "peakfit-scheduler".into();
    if let Some(n) = node {
        req["object"]["spec"]["nodeName"] = n.into();
    }
    let mut old_object = req["object"].clone();
    old_object["metadata"]["annotations"] = old;
    req["oldObject"] = old_object;
    r
}

#[tokio::test]
async fn bind_output_on_a_bound_pod_cannot_be_changed_or_removed() {
    let bound = json!({
        "peakfit.io/vram": "20Gi",
        "peakfit.io/assigned-gpus": "GPU-aaaa",
        "peakfit.io/reserved-bytes": "21474836480",
    });
    let mut moved = bound.clone();
    moved["peakfit.io/assigned-gpus"] = "GPU-bbbb".into();
    moved["peakfit.io/reserved-bytes"] = "1".into();
    let (status, out) = post("/mutate", &update(bound.clone(), &moved, Some("l4-0"))).await;
    assert_eq!(status, StatusCode::OK);
    let response = &out["response"];
    assert_eq!(response["allowed"], false, "{out}");
    assert_eq!(response["status"]["code"], 400);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(r#"peakfit.io/assigned-gpus from "GPU-aaaa" to "GPU-bbbb""#)
            && message.contains(r#"peakfit.io/reserved-bytes from "21474836480" to "1""#),
        "{message}"
    );
    // Removing them is a change too; so is adding a fraction.
    let mut removed = bound.clone();
    removed
        .as_object_mut()
        .unwrap()
        .remove("peakfit.io/assigned-gpus");
    let (_, out) = post(
        "/mutate/namespace",
        &update(bound.clone(), &removed, Some("l4-0")),
    )
    .await;
    assert_eq!(out["response"]["allowed"], false, "{out}");
    assert!(
        out["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("peakfit.io/assigned-gpus from \"GPU-aaaa\" to unset")
    );
}

#[tokio::test]
async fn other_updates_of_a_bound_pod_and_bind_on_a_pending_one_are_allowed() {
    let bound = json!({
        "peakfit.io/vram": "20Gi",
        "peakfit.io/assigned-gpus": "GPU-aaaa",
        "peakfit.io/reserved-bytes": "21474836480",
    });
    let mut relabelled = bound.clone();
    relabelled["example.com/owner"] = "team-a".into();
    let (_, out) = post("/mutate", &update(bound.clone(), &relabelled, Some("l4-0"))).await;
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert!(
        out["response"]["patch"].is_null(),
        "an UPDATE is never patched: {out}"
    );
    // Bind writes them on the pod before it creates the Binding.
    let pending = json!({"peakfit.io/vram": "20Gi"});
    let (_, out) = post("/mutate", &update(pending, &bound, None)).await;
    assert_eq!(out["response"]["allowed"], true, "{out}");
}

/// The pod as the API server would store it after the webhook's patch.
async fn admitted_with_resource(annotations: Value, containers: Value) -> (Value, Value) {
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
        gpu_memory_resource: Some("peakfit.io/gpu-memory-mib".into()),
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    });
    let body = review(&annotations, &containers, &json!([]));
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let out: Value = serde_json::from_slice(&bytes).unwrap();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::from(decoded_patch(&out))).unwrap();
    let mut pod = body["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    (pod, out)
}

#[tokio::test]
async fn the_least_gpu_memory_is_requested_as_an_extended_resource_on_the_first_container() {
    let two = json!([{"name": "a", "image": "i", "resources": {"requests": {"cpu": "1"}}},
                     {"name": "b", "image": "i"}]);
    let (pod, _) = admitted_with_resource(
        json!({"peakfit.io/vram": "20Gi", "peakfit.io/gpus": "2"}),
        two,
    )
    .await;
    let res = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(
        res["requests"]["peakfit.io/gpu-memory-mib"], "40960",
        "{res}"
    );
    assert_eq!(res["limits"]["peakfit.io/gpu-memory-mib"], "40960", "{res}");
    assert_eq!(res["requests"]["cpu"], "1");
    assert!(pod["spec"]["containers"][1].get("resources").is_none());
    // A vLLM pod: its share of the smallest GPU it can run on (weights + activations + the
    // declared KV cache, over 0.45), plus what lies outside the budget.
    let (pod, _) = admitted_with_resource(
        json!({"peakfit.io/model": "llama-3.1-8b", "peakfit.io/engine": "vllm",
               "peakfit.io/gpu-memory-utilization": "0.45", "peakfit.io/context-tokens": "8192",
               "peakfit.io/batch": "16"}),
        json!([{"name": "c", "image": "i"}]),
    )
    .await;
    let mib: u64 =
        pod["spec"]["containers"][0]["resources"]["requests"]["peakfit.io/gpu-memory-mib"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    assert!((33_000..34_500).contains(&mib), "{mib} MiB");
    // A count the pod set itself is replaced, with a warning.
    let (pod, out) = admitted_with_resource(
        json!({"peakfit.io/vram": "1Gi"}),
        json!([{"name": "c", "image": "i", "resources": {
            "requests": {"peakfit.io/gpu-memory-mib": "1"}, "limits": {"peakfit.io/gpu-memory-mib": "1"}}}]),
    )
    .await;
    let res = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(
        res["requests"]["peakfit.io/gpu-memory-mib"], "1024",
        "{res}"
    );
    assert_eq!(res["limits"]["peakfit.io/gpu-memory-mib"], "1024", "{res}");
    assert!(
        out["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("1024"),
        "{out}"
    );
}

/// Posts a pod CREATE to a webhook running under `policy`; returns the `AdmissionReview` reply.
async fn admit_under(policy: peakfit::webhook::RequireVram, annotations: Value) -> Value {
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
        gpu_memory_resource: None,
        require_vram: policy,
        convert_device_plugin_requests: false,
    });
    let body = review(
        &annotations,
        &json!([{"name": "c", "image": "i"}]),
        &json!([]),
    );
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn require_vram_refuses_kinds_below_the_class_and_names_the_annotation_and_why() {
    use peakfit::model::confidence::{MEASURED, class};
    use peakfit::webhook::RequireVram;
    let qlora = json!({"peakfit.io/model": "llama-3.1-8b", "peakfit.io/workload": "qlora"});
    let band = MEASURED.iter().find(|b| b.kind == "qlora").unwrap();
    assert_ne!(
        class(band),
        "good",
        "the test needs a kind below good: {band:?}"
    );

    let out = admit_under(RequireVram::Fair, qlora.clone()).await;
    let response = &out["response"];
    assert_eq!(response["allowed"], false, "{out}");
    assert_eq!(response["status"]["code"], 400);
    let message = response["status"]["message"].as_str().unwrap();
    for needle in [
        "peakfit.io/vram",
        "qlora",
        "--require-vram fair",
        &format!("p90 {:.1}%", band.p90),
        &format!("over {} rows", band.rows),
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from {message}"
        );
    }

    // The same pod giving its own figure, a kind the model sizes well, and a laxer policy pass.
    let mut given = qlora.clone();
    given["peakfit.io/vram"] = json!("12Gi");
    for (policy, annotations) in [
        (RequireVram::Fair, given),
        (
            RequireVram::Fair,
            json!({"peakfit.io/model": "bert-large", "peakfit.io/workload": "inference"}),
        ),
        (RequireVram::Off, qlora.clone()),
    ] {
        let out = admit_under(policy, annotations).await;
        assert_eq!(out["response"]["allowed"], true, "{policy:?}: {out}");
    }
    // `poor` refuses only kinds whose class is poor.
    let out = admit_under(RequireVram::Poor, qlora).await;
    assert_eq!(out["response"]["allowed"], class(band) != "poor", "{out}");
}
