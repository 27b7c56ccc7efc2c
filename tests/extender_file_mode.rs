//! File mode on the example cluster in `deploy/examples/cluster.yaml`: loaded through the same
//! loader `peakfit extender --from-file` uses, then asked through the real router.

mod extender_support;

use std::path::Path;
use std::sync::Arc;

use extender_support::*;
use peakfit::cluster::index::{ASSIGNED_GPUS, GPU_MEMORY_FRACTION, Index, RESERVED_BYTES};
use peakfit::placement::FitConfig;

fn example() -> (Arc<Index>, usize) {
    let index = Arc::new(Index::new());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/cluster.yaml");
    let n = peakfit::cluster::file::load_into(&index, &path).unwrap();
    (index, n)
}

fn file_mode_harness(index: Arc<Index>) -> Harness {
    file_mode_harness_with(index, None)
}

/// The harness with the file's profiles, as `--from-file` loads them when it learns.
fn file_mode_harness_with(
    index: Arc<Index>,
    profiles: Option<Arc<peakfit::cluster::profile::store::ProfileStore>>,
) -> Harness {
    let binder = Arc::new(peakfit::cluster::binding::MemoryBinder::default());
    let metrics = Arc::new(peakfit::metrics::extender::ExtenderMetrics::new());
    // As `--from-file` does: a file is a snapshot, its reports' age is not checked.
    let mut ext =
        peakfit::extender::Extender::new(index, metrics, binder.clone()).with_fit(FitConfig {
            max_report_age_secs: None,
            ..FitConfig::default()
        });
    if let Some(p) = profiles {
        ext = ext.with_profiles(p);
    }
    let ext = Arc::new(ext);
    Harness {
        router: peakfit::extender::routes::router(ext.clone()),
        ext,
        binder,
    }
}

fn filter_body(name: &str, annotations: &serde_json::Value) -> Vec<u8> {
    filter_body_on(name, annotations, &["h100-0", "a100-0", "l4-0"])
}

/// A filter request for pod `name` in namespace `ml` over these nodes.
fn filter_body_on(name: &str, annotations: &serde_json::Value, nodes: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Pod": {"metadata": {"name": name, "namespace": "ml", "annotations": annotations}},
        "Nodes": null,
        "NodeNames": nodes,
    }))
    .unwrap()
}

#[tokio::test]
async fn the_example_cluster_loads_and_answers() {
    let (index, n) = example();
    assert_eq!(n, 10, "3 nodes, 3 reports, 4 pods");
    assert_eq!(index.pod_count(), 4);
    let h = file_mode_harness(index.clone());

    // The README's curl: 45 GiB per GPU.
    let (_, r) = call(
        &h.router,
        "POST",
        "/filter",
        filter_body("chat", &serde_json::json!({"peakfit.io/vram": "45Gi"})),
    )
    .await;
    let v = json(&r);
    assert_eq!(v["NodeNames"], serde_json::json!(["h100-0"]));
    let unres = &v["FailedAndUnresolvableNodes"];
    assert!(
        unres["a100-0"].as_str().unwrap().contains("45.2 GiB"),
        "{v}"
    );
    assert!(
        unres["l4-0"]
            .as_str()
            .unwrap()
            .contains("NVML_ERROR_DRIVER_NOT_LOADED"),
        "{v}"
    );

    // 8 GPUs of 20 GiB: the fine-tune holds half of h100-0 (evicting it would help).
    let (_, r) = call(
        &h.router,
        "POST",
        "/filter",
        filter_body(
            "eval",
            &serde_json::json!({"peakfit.io/vram": "20Gi", "peakfit.io/gpus": "8"}),
        ),
    )
    .await;
    let v = json(&r);
    assert_eq!(v["NodeNames"], serde_json::json!([]));
    assert!(
        v["FailedNodes"]["h100-0"]
            .as_str()
            .unwrap()
            .contains("only 4 of its 8 GPU(s)"),
        "{v}"
    );
    assert!(
        v["FailedAndUnresolvableNodes"]["a100-0"]
            .as_str()
            .unwrap()
            .contains("needs 8 GPU(s)"),
        "{v}"
    );

    // Bind the pending embedder: best fit is a100-0's GPU 0, beside the inference server.
    let (_, r) = call(
        &h.router,
        "POST",
        "/bind",
        br#"{"PodName":"embedder","PodNamespace":"ml","PodUID":"5b0c7f4e-1c1d-4c4e-9a0b-000000000003","Node":"a100-0"}"#.to_vec(),
    )
    .await;
    assert_eq!(json(&r)["Error"], "");
    let bindings = h.binder.bindings.lock().clone();
    assert_eq!(bindings.len(), 1);
    assert_eq!(
        bindings[0].1[ASSIGNED_GPUS],
        "GPU-4f2b9c31-0000-4000-8000-000000000000"
    );
    assert_eq!(bindings[0].1[RESERVED_BYTES], (6 * GIB).to_string());
    let l = index.node("a100-0").unwrap().read().ledger.clone();
    // 40 GiB - 0.5 reserved - 30 chat-serve - 6 embedder.
    assert_eq!(l.gpus[0].free_bytes(), 40 * GIB - GIB / 2 - 36 * GIB);
}

/// Binds pod `name` (UID `uid-NAME`, namespace `ml`) to `a100-0` and returns the annotations the
/// Binding carried.
async fn bind_to_a100(h: &Harness, name: &str) -> std::collections::BTreeMap<String, String> {
    bind_to(h, name, "a100-0").await
}

/// Binds pod `name` (UID `uid-NAME`, namespace `ml`) to `node` and returns the annotations the
/// Binding carried.
async fn bind_to(
    h: &Harness,
    name: &str,
    node: &str,
) -> std::collections::BTreeMap<String, String> {
    let body = serde_json::json!({
        "PodName": name, "PodNamespace": "ml", "PodUID": format!("uid-{name}"), "Node": node,
    });
    let (_, r) = call(
        &h.router,
        "POST",
        "/bind",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(json(&r)["Error"], "", "{}", String::from_utf8_lossy(&r));
    let bindings = h.binder.bindings.lock().clone();
    bindings.last().unwrap().1.clone()
}

/// vLLM given `vram` instead of a model would otherwise take its default 0.9 of the card while
/// peakfit reserved only `vram`: bind tells it the share it was given.
#[tokio::test]
async fn a_fraction_engine_with_explicit_vram_is_told_its_share() {
    let (index, _) = example();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "small-vllm", "namespace": "ml", "uid": "uid-small-vllm",
                     "annotations": {"peakfit.io/vram": "8Gi", "peakfit.io/engine": "vllm"}},
        "spec": {"containers": [{"name": "c", "image": "vllm/vllm-openai"}]},
    }))
    .unwrap();
    index.apply_pod(&pod);
    let h = file_mode_harness(index.clone());
    let ann = &bind_to_a100(&h, "small-vllm").await;
    assert_eq!(ann[RESERVED_BYTES], (8 * GIB).to_string());
    // a100-0's GPUs are 40 GiB cards: 8 / 40 = 0.2, never rounded up past the reservation.
    let total = index.node("a100-0").unwrap().read().ledger.gpus[0].total_bytes;
    let want = ((8 * GIB) as f64 / total as f64 * 1e4).floor() / 1e4;
    assert_eq!(ann[GPU_MEMORY_FRACTION], format!("{want:.4}"));
    assert!(want <= 0.2 + 1e-9 && want > 0.19, "{want}");
}

/// A generation whose cache outgrows every GPU (Qwen3-0.6B, 64 × (1,024 + 1,024) tokens: 15.4
/// GiB allocated, and the cache filled an H200 on the real GPU) runs on any GPU its tensors fit,
/// filling it: filter offers the nodes with an empty GPU, bind reserves that GPU whole, and a
/// second such pod does not get it. With `expandable-segments` the same pod shares.
#[tokio::test]
async fn a_pod_whose_cache_outgrows_the_gpus_gets_an_empty_one_whole() {
    let (index, _) = example();
    let annotations = long_generation(&index);
    let h = file_mode_harness(index.clone());
    let (_, r) = call(
        &h.router,
        "POST",
        "/filter",
        filter_body("long-gen", &annotations),
    )
    .await;
    let v = json(&r);
    // h100-0 has four empty GPUs, a100-0 two; l4-0's NVML is down.
    assert_eq!(
        v["NodeNames"],
        serde_json::json!(["h100-0", "a100-0"]),
        "{v}"
    );
    let ann = &bind_to_a100(&h, "long-gen").await;
    let l = index.node("a100-0").unwrap().read().ledger.clone();
    let gpu = l
        .gpus
        .iter()
        .position(|g| ann[ASSIGNED_GPUS] == g.uuid)
        .unwrap();
    // The whole GPU: its size less the driver's reserve.
    let whole = l.gpus[gpu].total_bytes - l.gpus[gpu].driver_reserved_bytes;
    assert_eq!(ann[RESERVED_BYTES], whole.to_string());
    assert_eq!(l.gpus[gpu].free_bytes(), 0);

    // Its twin under expandable segments is sized by its tensors and shares.
    let mut expandable = annotations.clone();
    expandable["peakfit.io/expandable-segments"] = "true".into();
    let (_, r) = call(
        &h.router,
        "POST",
        "/filter",
        filter_body("long-gen-2", &expandable),
    )
    .await;
    let v = json(&r);
    assert!(
        v["NodeNames"]
            .as_array()
            .unwrap()
            .contains(&"a100-0".into()),
        "{v}"
    );

    // A GPU whose size holds the pod's floor (its tensors and process) but whose usable memory
    // (less the driver's reserve) with the margin does not: refused naming the floor, not the
    // cached peak it never needs there.
    let floor = demand_of(&annotations).min_gpu_total_bytes;
    let mut gpu = mk_gpu(0, "GPU-tight", floor + (256 << 20), 0);
    gpu.memory_reserved_bytes = 512 << 20;
    gpu.memory_free_bytes -= gpu.memory_reserved_bytes;
    index.apply_report(&mk_report("tight-0", "2026-11-21T12:00:00Z", vec![gpu]));
    let body = filter_body_on("long-gen-3", &annotations, &["tight-0"]);
    let (_, r) = call(&h.router, "POST", "/filter", body).await;
    let v = json(&r);
    let words = v["FailedAndUnresolvableNodes"]["tight-0"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let gib = peakfit::placement::gib;
    assert!(
        words.starts_with(&format!(
            "needs a GPU with {} usable: its tensors and process, with the allocator's cache \
             freed, take {} (+ 256 MiB safety margin)",
            gib(floor + (256 << 20)),
            gib(floor)
        )),
        "{words}"
    );
    assert!(
        words.contains(&format!(
            "largest GPU here has {} usable of {}",
            gib(floor - (256 << 20)),
            gib(floor + (256 << 20))
        )),
        "{words}"
    );
}

/// The annotations of a generation whose cache outgrows every GPU (Qwen3-0.6B, 64 × (1,024 +
/// 1,024) tokens), its pod `long-gen` applied to the index.
fn long_generation(index: &Index) -> serde_json::Value {
    let annotations = serde_json::json!({
        "peakfit.io/model": "qwen3-0.6b", "peakfit.io/workload": "inference",
        "peakfit.io/batch": "64", "peakfit.io/context-tokens": "2048",
        "peakfit.io/prompt-tokens": "1024",
    });
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "long-gen", "namespace": "ml", "uid": "uid-long-gen",
                     "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    index.apply_pod(&pod);
    annotations
}

/// The model's demand for these annotations.
fn demand_of(annotations: &serde_json::Value) -> peakfit::placement::Demand {
    let annotation_map = annotations
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    peakfit::model::pod_request(&annotation_map)
        .unwrap()
        .unwrap()
        .demand
}

/// A GPU whose usable memory (its size less the driver's reserve) holds the pod's cached peak
/// but not the safety margin beside it: the pod cannot share it, so filter offers it and bind
/// takes it whole, as for a GPU the peak outgrows. The old rule (whole only above the usable
/// memory) refused this node while it took any GPU the peak outgrew.
#[tokio::test]
async fn a_cached_peak_within_the_margin_of_a_gpu_takes_it_whole() {
    let (index, _) = example();
    let annotations = long_generation(&index);
    let peak = demand_of(&annotations).fixed_bytes;
    let reserve = 512 << 20;
    let usable = peak + (128 << 20);
    let mut gpu = mk_gpu(0, "GPU-edge", usable + reserve, 0);
    gpu.memory_reserved_bytes = reserve;
    gpu.memory_free_bytes -= reserve;
    index.apply_report(&mk_report("edge-0", "2026-11-21T12:00:00Z", vec![gpu]));
    let h = file_mode_harness(index.clone());
    let (_, r) = call(
        &h.router,
        "POST",
        "/filter",
        filter_body_on("long-gen", &annotations, &["edge-0"]),
    )
    .await;
    let v = json(&r);
    assert_eq!(v["NodeNames"], serde_json::json!(["edge-0"]), "{v}");
    let ann = bind_to(&h, "long-gen", "edge-0").await;
    assert_eq!(ann[ASSIGNED_GPUS], "GPU-edge");
    assert_eq!(ann[RESERVED_BYTES], usable.to_string());
    let l = index.node("edge-0").unwrap().read().ledger.clone();
    assert_eq!(l.gpus[0].free_bytes(), 0);
}

/// A cluster of `nodes` nodes with 8 GPUs each, as a multi-document YAML or as one `List`.
fn big_cluster_yaml(nodes: usize, as_list: bool) -> String {
    let mut docs = Vec::with_capacity(2 * nodes);
    for i in 0..nodes {
        docs.push(format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-{i}}}\n"
        ));
        let gpus = (0..8)
            .map(|g| {
                format!(
                    "  - {{index: {g}, uuid: GPU-{i}-{g}, name: NVIDIA H100 80GB HBM3, memoryTotalBytes: 85520809984, memoryUsedBytes: 0, memoryFreeBytes: 85520809984, memoryReservedBytes: 536870912, processes: []}}\n"
                )
            })
            .collect::<Vec<_>>()
            .concat();
        docs.push(format!(
            "apiVersion: peakfit.io/v1alpha1\nkind: NodeGpuReport\nmetadata: {{name: node-{i}}}\nspec: {{nodeName: node-{i}}}\nstatus:\n  observedAt: \"2026-11-21T17:48:00Z\"\n  nvml: {{up: true}}\n  gpus:\n{gpus}"
        ));
    }
    if as_list {
        let indent = |d: &str| {
            let mut out = String::new();
            for (j, line) in d.lines().enumerate() {
                out.push_str(if j == 0 { "- " } else { "  " });
                out.push_str(line);
                out.push('\n');
            }
            out
        };
        format!(
            "apiVersion: v1\nkind: List\nitems:\n{}",
            docs.iter().map(|d| indent(d)).collect::<String>()
        )
    } else {
        docs.join("---\n")
    }
}

/// serde-saphyr's default budget stopped multi-document YAML at 1,024 documents and a `List` at
/// ~1,185 nodes × 8 GPUs; file mode raises it for the operator's own file.
#[test]
fn a_5000_node_cluster_of_8_gpus_each_loads_as_documents_and_as_a_list() {
    for as_list in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.yaml");
        std::fs::write(&path, big_cluster_yaml(5000, as_list)).unwrap();
        let index = Index::new();
        let n = peakfit::cluster::file::load_into(&index, &path)
            .unwrap_or_else(|e| panic!("as_list {as_list}: {e}"));
        assert_eq!(n, 10_000, "as_list {as_list}");
        let last = index.node("node-4999").unwrap();
        assert_eq!(last.read().ledger.gpus.len(), 8);
    }
}

#[test]
fn an_empty_file_loads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.yaml");
    std::fs::write(&path, "").unwrap();
    assert_eq!(
        peakfit::cluster::file::load_into(&Index::new(), &path).unwrap(),
        0
    );
}

/// Issue 24: two pods with one UID in a file were charged once, without a word. They are now
/// warned about and counted (`peakfit_index_warnings_total{reason="duplicate_pod_uid"}`).
#[test]
fn two_pods_with_one_uid_in_a_file_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dup.yaml");
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ml, uid: same}}\n\
             spec: {{containers: [{{name: c}}]}}\n"
        )
    };
    std::fs::write(&path, format!("{}---\n{}", pod("a"), pod("b"))).unwrap();
    let index = Index::new();
    peakfit::cluster::file::load_into(&index, &path).unwrap();
    let reason = peakfit::metrics::extender::ReasonLabels {
        reason: "duplicate_pod_uid",
    };
    assert_eq!(index.warnings().get_or_create(&reason).get(), 1);
}

/// Issue 24: a scalar anchored once and repeated by alias grew a 1 MiB file to 5.5 GB, the size
/// budgets being lifted for the operator's file. Aliases are refused, saying so. (Scaled down:
/// 4 KiB repeated 2,000 times would be 8 MB; the old code expanded it.)
#[test]
fn a_yaml_alias_bomb_is_refused_naming_aliases() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.yaml");
    let mut text = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: bomb}}\ndata:\n  a: &big {}\n  list:\n",
        "x".repeat(4096)
    );
    for _ in 0..2_000 {
        text.push_str("  - *big\n");
    }
    std::fs::write(&path, text).unwrap();
    let e = peakfit::cluster::file::load_into(&Index::new(), &path).unwrap_err();
    assert!(
        e.to_string()
            .contains("YAML aliases (*name) are not accepted"),
        "{e}"
    );
}

/// A file taken from a cluster with `kubectl get ... -o yaml` carries its `GpuWorkloadProfiles`
/// too: `--from-file` sizes a pod from what its workload used, as the cluster's extender would.
/// Without the profile the same pod fits an A100; with one that saw its workload peak at 42 GiB
/// it is sized at 42 × 1.05 and the A100's 40 GB cards refuse it, saying so.
#[tokio::test]
async fn a_file_s_profiles_size_its_pods_as_the_cluster_would() {
    use peakfit::cluster::profile::store::ProfileStore;
    let annotations = serde_json::json!({
        "peakfit.io/model": "llama-3.1-8b",
        "peakfit.io/workload-name": "chat",
    });
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "chat-1", "namespace": "ml", "annotations": annotations},
    }))
    .unwrap();
    let key = peakfit::cluster::workload::workload_of(&pod);
    let profile = format!(
        r"---
apiVersion: peakfit.io/v1alpha1
kind: GpuWorkloadProfile
metadata: {{name: workload-chat, namespace: ml}}
spec: {{workloadKind: {kind}, workloadName: chat, inputs: '{inputs}'}}
status:
  predictedBytes: {predicted}
  observedPeakBytes: {peak}
  observedP95Bytes: {peak}
  podsSeen: 1
  gpuHours: 2.0
  firstSeen: '2026-11-21T08:00:00Z'
  lastSeen: '2026-11-21T10:00:00Z'
  recommendedBytes: {peak}
  summary: {{predicted: 15.8Gi, observed: 42.0Gi, recommended: 44.1Gi}}
",
        kind = key.kind,
        inputs = key.inputs,
        predicted = 16 * GIB,
        peak = 42 * GIB,
    );
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/cluster.yaml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, std::fs::read_to_string(&example).unwrap() + &profile).unwrap();

    let ask = |profiles: Option<Arc<ProfileStore>>| {
        let path = path.clone();
        let annotations = annotations.clone();
        async move {
            let index = Arc::new(Index::new());
            peakfit::cluster::file::load_into(&index, &path).unwrap();
            let h = file_mode_harness_with(index, profiles);
            let (_, r) = call(
                &h.router,
                "POST",
                "/filter",
                filter_body("chat-1", &annotations),
            )
            .await;
            json(&r)
        }
    };
    let without = ask(None).await;
    assert!(
        without["NodeNames"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("a100-0")),
        "{without}"
    );

    let store = Arc::new(ProfileStore::default());
    assert_eq!(
        peakfit::cluster::file::load_profiles_into(&store, &path).unwrap(),
        1
    );
    let with = ask(Some(store)).await;
    let a100 = with["FailedAndUnresolvableNodes"]["a100-0"]
        .as_str()
        .or_else(|| with["FailedNodes"]["a100-0"].as_str())
        .unwrap_or_else(|| panic!("a100-0 refused: {with}"));
    assert!(a100.contains("from 1 observed pod"), "{a100}");
    assert!(a100.contains("44.10 GiB"), "{a100}");
}

/// A profile peakfit did not write is refused naming it, not half-read.
#[test]
fn a_malformed_profile_in_a_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        "kind: GpuWorkloadProfile\nmetadata: {name: broken, namespace: ml}\nspec: {workloadKind: 3}\n",
    )
    .unwrap();
    let store = peakfit::cluster::profile::store::ProfileStore::default();
    let e = peakfit::cluster::file::load_profiles_into(&store, &path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"broken\"") && e.contains("GpuWorkloadProfile"),
        "{e}"
    );
    assert!(store.is_empty());
}

/// A `kubectl get -o yaml` of a DRA cluster carries its `ResourceSlices`: in a file they mark
/// nodes as the watch's do (issue 23 follow-up), so a node whose agent cannot read `PodResources`
/// and that NVIDIA's DRA driver publishes devices on is refused; a slice of an older version
/// than the watch reads is skipped, not an error.
#[test]
fn a_file_s_resource_slices_mark_their_nodes() {
    let report = |node: &str| {
        let mut r = mk_report(
            node,
            "2026-11-21T17:48:20Z",
            vec![mk_gpu(0, format!("GPU-{node}"), 80 * GIB, 0)],
        );
        r.status.as_mut().unwrap().pod_resources = Some(peakfit::inventory::PodResourcesStatus {
            up: false,
            reason: Some("connection refused".into()),
        });
        serde_json::to_value(r).unwrap()
    };
    let slice = |version: &str, node: &str| {
        serde_json::json!({
            "apiVersion": format!("resource.k8s.io/{version}"),
            "kind": "ResourceSlice",
            "metadata": { "name": format!("{node}-gpu") },
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
                "devices": [{ "name": "gpu-0" }],
            },
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dra.json");
    let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": [
        slice("v1", "dra"), report("dra"), report("beta"), slice("v1beta1", "beta"),
    ] });
    std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
    let index = Index::new();
    assert_eq!(
        peakfit::cluster::file::load_into(&index, &path).unwrap(),
        3,
        "two reports and the v1 slice"
    );
    let condition = |node: &str| index.node(node).unwrap().read().ledger.condition.clone();
    assert!(
        matches!(
            condition("dra"),
            peakfit::placement::NodeCondition::PodResourcesDown { by, .. }
                if by.dra_driver.as_deref() == Some("gpu.nvidia.com")
        ),
        "{:?}",
        condition("dra")
    );
    assert_eq!(condition("beta"), peakfit::placement::NodeCondition::Ready);
}
