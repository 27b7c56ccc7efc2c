//! End to end without a cluster: `peakfit agent --once --print` on fake GPUs, fed with Nodes and
//! Pods to `peakfit extender --from-file`, gives the filter and bind decisions those GPUs imply.
//!
//! Needs the fake NVML (`cargo build -p fake-nvml`); without it the test fails, naming that command.

mod process_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use process_support::{Running, fake_nvml_lib, free_port, request};
use serde_json::{Value, json};

/// `peakfit agent --once --print` (YAML) for `node` with the fake configured by `config`.
fn agent_report(lib: &Path, dir: &Path, node: &str, config: &str) -> String {
    let path = dir.join(format!("{node}.nvml.yaml"));
    std::fs::write(&path, config).unwrap();
    let empty_proc = dir.join("proc");
    std::fs::create_dir_all(&empty_proc).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .args(["agent", "--once", "--print", "--node-name", node])
        .arg("--nvml-lib")
        .arg(lib)
        .arg("--proc-root")
        .arg(&empty_proc)
        .env("FAKE_NVML_CONFIG", &path)
        .env("PEAKFIT_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn pod(name: &str, uid: &str, vram: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "ml", "uid": uid,
            "annotations": { "peakfit.io/vram": vram },
        },
        "spec": {
            "schedulerName": "peakfit-scheduler",
            "containers": [{ "name": "main", "image": "vllm/vllm-openai:v0.6.3" }],
        },
        "status": { "phase": "Pending" },
    })
}

fn node(name: &str) -> String {
    format!("---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n")
}

fn post(port: u16, path: &str, body: &Value) -> Value {
    let (code, text) = request(port, "POST", path, &body.to_string()).expect("extender answers");
    assert_eq!(code, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

/// The nodes that fit, and the reason each other node failed (resolvable by preemption or not).
fn filter(port: u16, pod: &Value) -> (Vec<String>, serde_json::Map<String, Value>) {
    let mut pod = pod.clone();
    let obj = pod.as_object_mut().unwrap();
    obj.remove("apiVersion");
    obj.remove("kind");
    let result = post(
        port,
        "/filter",
        &json!({ "Pod": pod, "Nodes": null, "NodeNames": ["gpu-node-1", "gpu-node-2", "gpu-node-3"] }),
    );
    let names = result["NodeNames"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    let mut failed = serde_json::Map::new();
    for key in ["FailedNodes", "FailedAndUnresolvableNodes"] {
        if let Some(m) = result[key].as_object() {
            failed.extend(m.clone());
        }
    }
    (names, failed)
}

const GIB: u64 = 1 << 30;

#[test]
fn agent_reports_drive_the_extenders_filter_and_bind() {
    let lib = fake_nvml_lib();
    let dir = tempfile::tempdir().unwrap();
    // gpu-node-1: two 80 GiB GPUs, one nearly full with a process of no pod.
    let node1 = agent_report(
        &lib,
        dir.path(),
        "gpu-node-1",
        &format!(
            "devices:\n\
             - {{ name: NVIDIA H100 80GB HBM3, uuid: GPU-aaaaaaaa-0000-4000-8000-000000000001, memory: {{ total: {t}, used: {u} }}, processes: [ {{ pid: 900, usedBytes: {u} }} ] }}\n\
             - {{ name: NVIDIA H100 80GB HBM3, uuid: GPU-aaaaaaaa-0000-4000-8000-000000000002, memory: {{ total: {t}, used: 0 }} }}\n",
            t = 80 * GIB,
            u = 70 * GIB
        ),
    );
    // gpu-node-2: one 24 GiB GPU.
    let node2 = agent_report(
        &lib,
        dir.path(),
        "gpu-node-2",
        &format!(
            "devices:\n- {{ name: NVIDIA L4, uuid: GPU-bbbbbbbb-0000-4000-8000-000000000001, memory: {{ total: {} }} }}\n",
            24 * GIB
        ),
    );
    // gpu-node-3: the driver is not loaded.
    let node3 = agent_report(
        &lib,
        dir.path(),
        "gpu-node-3",
        "errors: { nvmlInit_v2: DriverNotLoaded }\ndevices: []\n",
    );
    assert!(node3.contains("DriverNotLoaded"), "{node3}");

    let big = pod("big", "11111111-2222-4333-8444-555555555555", "40Gi");
    let second = pod("second", "21111111-2222-4333-8444-555555555555", "40Gi");
    let small = pod("small", "31111111-2222-4333-8444-555555555555", "20Gi");
    let mut file = String::new();
    for n in ["gpu-node-1", "gpu-node-2", "gpu-node-3"] {
        file += &node(n);
    }
    file += &node1;
    file += &node2;
    file += &node3;
    for p in [&big, &second, &small] {
        file += "---\n";
        file += &serde_json::to_string(p).unwrap();
        file += "\n";
    }
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(&cluster, &file).unwrap();

    let port = free_port();
    let _extender = Running(
        Command::new(env!("CARGO_BIN_EXE_peakfit"))
            .args(["extender", "--listen", &format!("127.0.0.1:{port}")])
            // Every node that fits, not only the best: the test reads each node's verdict.
            .args(["--filter-keep-best", "0"])
            .arg("--from-file")
            .arg(&cluster)
            .env_remove("KUBECONFIG")
            .env("PEAKFIT_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while request(port, "GET", "/readyz", "").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "extender never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }

    // 40 GiB: only gpu-node-1's empty GPU can hold it; the L4 is too small, node 3 has no NVML.
    let (fits, failed) = filter(port, &big);
    assert_eq!(fits, ["gpu-node-1"], "{failed:?}");
    let reason = |n: &str| {
        failed
            .get(n)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    assert!(!reason("gpu-node-2").is_empty(), "{failed:?}");
    assert!(
        reason("gpu-node-3").to_lowercase().contains("nvml")
            || reason("gpu-node-3").contains("DriverNotLoaded"),
        "node 3 fails for its driver: {failed:?}"
    );

    let bound = post(
        port,
        "/bind",
        &json!({ "PodName": "big", "PodNamespace": "ml", "PodUID": big["metadata"]["uid"], "Node": "gpu-node-1" }),
    );
    assert_eq!(bound["Error"].as_str().unwrap_or_default(), "", "{bound}");

    // The empty GPU now holds `big`; a second 40 GiB pod fits nowhere (40 GiB + margin > 40 GiB).
    let (fits, failed) = filter(port, &second);
    assert!(fits.is_empty(), "{fits:?} {failed:?}");
    // 20 GiB still fits beside `big`, and on the L4.
    let (fits, failed) = filter(port, &small);
    assert_eq!(fits, ["gpu-node-1", "gpu-node-2"], "{failed:?}");
}
