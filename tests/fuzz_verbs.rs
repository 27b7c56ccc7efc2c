//! Fuzzing on stable Rust, as a habit: every verb's decoder (the wire types the routes decode
//! with `serde_json`), the verbs themselves on what decodes, the annotation parser, the index's
//! reading of a bound pod (`assigned-gpus`, `reserved-bytes`), and the webhook's decoder and
//! decision (an `AdmissionReview` of a pod CREATE or UPDATE), over random bytes, random
//! protocol-shaped JSON and byte-mutated protocol requests. The property: nothing panics (the
//! test profile keeps overflow checks on), and no GPU shows more free than it has. Two more
//! targets (issue 24): the `config.json` reader (`model::hf_config::annotations`) on byte-mutated
//! real configs, and file mode (`cluster::file::load_str`) on byte-mutated copies of the example
//! cluster and YAML fragments with anchors, aliases and deep nesting.
//!
//! The extender, its index and a runtime are built once per thread, not per case, so a case costs
//! only its decoding and the verbs' work.
//!
//! CI runs a smoke of a few hundred cases (seconds). The long run raises the count:
//!
//! ```text
//! PEAKFIT_FUZZ_CASES=10000000 nice -n 19 cargo test --release -p peakfit --test fuzz_verbs -- --nocapture
//! PEAKFIT_FUZZ_CASES=10000000 nice -n 19 cargo test --release -p peakfit --test fuzz_verbs -- --nocapture --test-threads 1 config_json
//! ```
//!
//! and prints the cases run and their rate every 100,000 (release keeps overflow checks off, so
//! run the debug profile, slower, when hunting arithmetic overflow).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use peakfit::cluster::binding::MemoryBinder;
use peakfit::cluster::index::{ASSIGNED_GPUS, Index, RESERVED_BYTES, pod_request_of};
use peakfit::extender::Extender;
use peakfit::extender::wire::{ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs};
use peakfit::metrics::extender::ExtenderMetrics;
use peakfit::model::Spec;
use peakfit::webhook::{Mutator, OptIn};
use proptest::prelude::*;

fn cases() -> u32 {
    static CASES: OnceLock<u32> = OnceLock::new();
    *CASES.get_or_init(|| {
        std::env::var("PEAKFIT_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400)
    })
}

const NODES: [&str; 4] = ["h100-0", "a100-0", "l4-0", "ghost"];
const UIDS: [&str; 3] = [
    "5b0c7f4e-1c1d-4c4e-9a0b-000000000001",
    "5b0c7f4e-1c1d-4c4e-9a0b-000000000002",
    "nobody",
];
const GPU: &str = "GPU-8d1c0a5e-0000-4000-8000-00000000000";

fn extender() -> Extender {
    let index = Arc::new(Index::new());
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/cluster.yaml");
    peakfit::cluster::file::load_into(&index, &example).unwrap();
    Extender::new(
        index,
        Arc::new(ExtenderMetrics::new()),
        Arc::new(MemoryBinder::default()),
    )
    .with_fit(peakfit::placement::FitConfig {
        max_report_age_secs: None,
        ..Default::default()
    })
}

/// Annotation values built from the characters quantities, counts, lists and model names use,
/// plus the extremes the probe found (`u64::MAX`), so the parsers meet near-misses.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-zA-Z.,:=+eE_ -]{0,12}",
        Just(u64::MAX.to_string()),
        Just("1e999".to_owned()),
        (0u8..10).prop_map(|i| format!("{GPU}{i},{GPU}{i}")),
        (0u8..10).prop_map(|i| format!("{GPU}{i}")),
    ]
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        Just("peakfit.io/vram"),
        Just("peakfit.io/gpus"),
        Just("peakfit.io/model"),
        Just("peakfit.io/params"),
        Just("peakfit.io/dtype"),
        Just("peakfit.io/batch"),
        Just("peakfit.io/context"),
        Just("peakfit.io/mode"),
        Just(ASSIGNED_GPUS),
        Just(RESERVED_BYTES),
        Just("peakfit.io/gpu-memory-fraction"),
    ];
    prop::collection::btree_map(key.prop_map(str::to_owned), value(), 0..6)
}

fn pod_json(ann: &BTreeMap<String, String>, uid: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": uid, "annotations": ann},
        "spec": {"nodeName": node, "priority": 0, "containers": [{"name": "c"}]},
    })
}

/// An `AdmissionReview` of the pod, as the API server sends it to the webhook.
fn review_json(pod: &serde_json::Value, update: bool) -> serde_json::Value {
    let mut request = serde_json::json!({
        "uid": "u", "operation": if update { "UPDATE" } else { "CREATE" },
        "namespace": "ml", "name": "p",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": {}, "object": pod,
    });
    if update {
        request["oldObject"] = pod.clone();
    }
    serde_json::json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

/// A protocol-shaped request for any verb: the fields of all four, so each decoder finds its own;
/// or an `AdmissionReview` for the webhook.
fn shaped() -> impl Strategy<Value = Vec<u8>> {
    (
        annotations(),
        prop::sample::select(&UIDS[..]),
        prop::sample::select(&NODES[..]),
        prop::collection::vec(prop::sample::select(&NODES[..]), 0..5),
        any::<bool>(),
        0u8..8,
    )
        .prop_map(|(ann, uid, node, names, full, kind)| {
            let pod = pod_json(&ann, uid, node);
            if kind < 2 {
                return serde_json::to_vec(&review_json(&pod, kind == 1)).unwrap();
            }
            let nodes = names
                .iter()
                .map(|n| serde_json::json!({"metadata": {"name": n}}))
                .collect::<Vec<_>>();
            let mut req = serde_json::json!({
                "Pod": pod,
                "NodeNameToMetaVictims": {node: {"Pods": [{"UID": uid}], "NumPDBViolations": 0}},
                "PodName": "p", "PodNamespace": "ml", "PodUID": uid, "Node": node,
            });
            if full {
                req["Nodes"] = serde_json::json!({ "items": nodes });
            } else {
                req["NodeNames"] = serde_json::json!(names);
            }
            serde_json::to_vec(&req).unwrap()
        })
}

/// A shaped request with a few bytes overwritten, cut short or repeated.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        shaped(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(mut bytes, flips, cut, truncate)| {
            flip_and_cut(&mut bytes, flips, cut, truncate);
            bytes
        })
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..128),
        shaped(),
        mutated(),
    ]
}

/// Decodes `bytes` with every verb's decoder and runs the verbs on what decodes; parses the
/// pod's annotations and applies it to the index as a bound pod; and answers it as the webhook.
fn exercise(ext: &Extender, rt: &tokio::runtime::Runtime, bytes: &[u8]) {
    // filter and prioritize decode the same type: decoded once, run on a copy.
    if let Ok(args) = serde_json::from_slice::<ExtenderArgs>(bytes) {
        if let Some(pod) = &args.pod {
            if let Some(annotations) = &pod.metadata.annotations {
                let _ = Spec::parse(annotations);
            }
            let _ = pod_request_of(pod);
            ext.index.apply_pod(pod);
        }
        let _ = ext.filter(args.clone());
        let _ = ext.prioritize(args);
    }
    if let Ok(args) = serde_json::from_slice::<ExtenderPreemptionArgs>(bytes) {
        let _ = ext.preempt(args);
    }
    if let Ok(args) = serde_json::from_slice::<ExtenderBindingArgs>(bytes) {
        let _ = rt.block_on(ext.bind(args));
    }
    if let Ok(pod) = serde_json::from_slice::<Pod>(bytes) {
        ext.index.apply_pod(&pod);
    }
    if let Ok(review) = serde_json::from_slice::<peakfit::webhook::mutate::Review>(bytes) {
        for opt_in in [OptIn::Annotation, OptIn::Namespace] {
            let _ = webhook().review(review.clone(), opt_in);
        }
    }
}

fn webhook() -> &'static Mutator {
    static MUTATOR: OnceLock<Mutator> = OnceLock::new();
    MUTATOR.get_or_init(|| Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: Some("nvidia".into()),
        gpu_memory_resource: Some("peakfit.io/gpu-memory-mib".into()),
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    })
}

static RUN: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_input_panics_a_decoder_a_verb_or_the_index(bytes in input()) {
        thread_local! {
            static STATE: (Extender, tokio::runtime::Runtime, Instant) = (
                extender(),
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap(),
                Instant::now(),
            );
        }
        STATE.with(|(ext, rt, start)| {
            exercise(ext, rt, &bytes);
            let n = RUN.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(100_000) || u64::from(cases()) == n {
                let secs = start.elapsed().as_secs_f64();
                eprintln!("fuzz_verbs: {n} cases in {secs:.1} s ({:.0}/s)", n as f64 / secs);
            }
            // However the index was fed, the ledgers' sums do not overflow, and what is free
            // never exceeds what the GPU has.
            for slot in ext.index.all_slots() {
                for gpu in &slot.read().ledger.gpus {
                    let _ = gpu.committed_bytes();
                    prop_assert!(gpu.free_bytes() <= gpu.total_bytes);
                }
            }
            Ok(())
        })?;
    }


    /// The `config.json` reader never panics, whatever the file says. Its first run found
    /// `"hidden_size": 18446744073709551615` overflowing `4 * hidden` in `model::hf_config` (and
    /// `heads * head_dim`), a panic in debug builds and a wrapped size in release: every size is
    /// now bounded by the annotation it becomes and refused naming its field.
    #[test]
    fn config_json_never_panics_the_reader(text in config_json()) {
        let _ = peakfit::model::hf_config::annotations(&text);
        counted("config_json", &CONFIG_RUN, started());
    }

    /// File mode never panics, and a GPU never shows more free than it has.
    #[test]
    fn file_mode_never_panics(text in cluster_file()) {
        let index = Index::new();
        let _ = peakfit::cluster::file::load_str(&index, &text, "fuzz.yaml");
        for slot in index.all_slots() {
            for gpu in &slot.read().ledger.gpus {
                prop_assert!(gpu.free_bytes() <= gpu.total_bytes);
            }
        }
        counted("file_mode", &FILE_RUN, started());
    }
}

/// A real `config.json` (one of `tests/data/model-configs`) with bytes overwritten, cut short or
/// a value replaced by an extreme one.
fn config_json() -> impl Strategy<Value = String> {
    static CONFIGS: OnceLock<Vec<String>> = OnceLock::new();
    let configs = CONFIGS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/model-configs");
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                (p.extension()? == "json").then(|| std::fs::read_to_string(p).ok())?
            })
            .collect();
        out.sort();
        out
    });
    (
        prop::sample::select(configs.clone()),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        any::<prop::sample::Index>(),
        prop::sample::select(vec![
            "18446744073709551615",
            "-1",
            "1e308",
            "0",
            "\"float64\"",
            "[1,2,3]",
            "null",
            "{}",
        ]),
        any::<bool>(),
    )
        .prop_map(|(text, flips, at, extreme, truncate)| {
            let mut bytes = text.into_bytes();
            // Replace the number after one `": ` with an extreme value.
            let colons: Vec<usize> = bytes
                .windows(2)
                .enumerate()
                .filter(|(_, w)| w == b": ")
                .map(|(i, _)| i)
                .collect();
            if !colons.is_empty() {
                let i = colons[at.index(colons.len())] + 2;
                let end = bytes[i..]
                    .iter()
                    .position(|b| matches!(b, b',' | b'\n' | b'}'))
                    .map_or(bytes.len(), |e| i + e);
                bytes.splice(i..end, extreme.bytes());
            }
            flip_and_cut(&mut bytes, flips, at, truncate);
            String::from_utf8_lossy(&bytes).into_owned()
        })
}

/// Overwrites the bytes `flips` names, then cuts at `cut` when `truncate`.
fn flip_and_cut(
    bytes: &mut Vec<u8>,
    flips: Vec<(prop::sample::Index, u8)>,
    cut: prop::sample::Index,
    truncate: bool,
) {
    for (at, b) in flips {
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
    }
    if truncate {
        bytes.truncate(cut.index(bytes.len() + 1));
    }
}

/// File mode's input: the example cluster with bytes overwritten or cut, or a small YAML
/// document built from anchors, aliases, nesting and Kubernetes kinds.
fn cluster_file() -> impl Strategy<Value = String> {
    static EXAMPLE: OnceLock<String> = OnceLock::new();
    let example = EXAMPLE
        .get_or_init(|| {
            std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/cluster.yaml"),
            )
            .unwrap()
        })
        .clone();
    let piece = prop::sample::select(vec![
        "kind: Pod\n",
        "kind: Node\n",
        "kind: NodeGpuReport\n",
        "kind: List\nitems:\n",
        "metadata: {name: a, uid: u}\n",
        "a: &x [1, 2]\n",
        "b: *x\n",
        "- *x\n",
        "---\n",
        "[[[[[[[[",
        "{",
        "status: {gpus: [{uuid: G, memoryTotalBytes: 18446744073709551615}]}\n",
        "spec: {nodeName: n, containers: [{name: c}]}\n",
        "  - ",
        "\t",
        "\"",
    ]);
    prop_oneof![
        (
            Just(example),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            any::<prop::sample::Index>(),
            any::<bool>(),
        )
            .prop_map(|(text, flips, cut, truncate)| {
                let mut bytes = text.into_bytes();
                flip_and_cut(&mut bytes, flips, cut, truncate);
                String::from_utf8_lossy(&bytes).into_owned()
            }),
        prop::collection::vec(piece, 0..24).prop_map(|p| p.concat()),
    ]
}

static CONFIG_RUN: AtomicU64 = AtomicU64::new(0);
static FILE_RUN: AtomicU64 = AtomicU64::new(0);

/// Counts a target's cases and prints them every 100,000 and at the end.
fn counted(target: &str, run: &AtomicU64, start: Instant) {
    let n = run.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_multiple_of(100_000) || u64::from(cases()) == n {
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{target}: {n} cases in {secs:.1} s ({:.0}/s)",
            n as f64 / secs
        );
    }
}

fn started() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}
