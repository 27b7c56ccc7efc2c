//! The real `peakfit agent` binary against the fake NVML library (tests/fake-nvml): the real
//! dlopen, the real nvml-wrapper calls, the real output.
//!
//! The fake is a workspace cdylib, which `cargo test` does not build: run `cargo build -p fake-nvml`
//! first (scripts/test does). Without it these tests fail, naming that command.

mod process_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use peakfit::cluster::NodeGpuReport;
use peakfit::inventory::NodeGpuReportStatus;
use process_support::{Running, fake_nvml_lib, free_port, request};

const GIB: u64 = 1 << 30;
const POD_A: &str = "8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01";
const POD_B: &str = "0c7e3b9a-51d2-4f6e-8a0b-2d4c6e8f0a1b";
const CID: &str = "4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e";

/// A scratch directory with the fake's config and a fake host `/proc`.
struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new(config: &str) -> Self {
        let scene = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(scene.proc_root()).unwrap();
        scene.set_config(config);
        scene
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("nvml.yaml")
    }

    fn proc_root(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    /// Replaces the config atomically (new inode), so the fake sees the change even when the
    /// file system's timestamps are coarse.
    fn set_config(&self, text: &str) {
        let tmp = self.dir.path().join("nvml.yaml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.config()).unwrap();
    }

    fn process(&self, pid: u32, cgroup: &str) {
        let dir = self.proc_root().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    fn agent(&self, lib: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_peakfit"));
        cmd.arg("agent")
            .arg("--nvml-lib")
            .arg(lib)
            .arg("--proc-root")
            .arg(self.proc_root())
            .args(["--node-name", "gpu-node-1"])
            .env("FAKE_NVML_CONFIG", self.config())
            .env_remove("KUBECONFIG")
            .env_remove("NODE_NAME")
            .env("PEAKFIT_LOG", "warn");
        cmd
    }

    /// `peakfit agent --once --print --json`, which must exit 0.
    fn read_once(&self, lib: &Path) -> NodeGpuReport {
        let out = self
            .agent(lib)
            .args(["--once", "--print", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "agent failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not a NodeGpuReport ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

fn status(report: &NodeGpuReport) -> &NodeGpuReportStatus {
    report.status.as_ref().expect("report has a status")
}

const TWO_GPUS: &str = r#"
driverVersion: "550.54.15"
devices:
  - name: NVIDIA H100 80GB HBM3
    uuid: GPU-8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01
    pciBusId: "00000000:17:00.0"
    memory: { total: 85899345920, reserved: 536870912, used: 21474836480 }
    processes:
      - { pid: 4242, usedBytes: 17179869184 }
      - { pid: 4243, usedBytes: 2147483648 }
      - { pid: 777, usedBytes: 1073741824 }
      - { pid: 778 }
  - name: NVIDIA A100-SXM4-40GB
    uuid: GPU-3e1c2a4b-5d6f-4a8b-9c0d-1e2f3a4b5c6d
    pciBusId: "00000000:65:00.0"
    memory: { total: 42949672960, used: 0 }
    maxMigDevices: 7
    mig:
      - uuid: MIG-6c1f9a5e-2b3d-5e4f-8a7b-9c0d1e2f3a4b
        name: NVIDIA A100-SXM4-40GB MIG 3g.20gb
        gpuInstanceId: 1
        memory: { total: 20937965568, used: 5368709120 }
        processes: [ { pid: 5000, usedBytes: 5368709120 } ]
      - uuid: MIG-7d2a0b6f-3c4e-5f6a-9b8c-0d1e2f3a4b5c
        name: NVIDIA A100-SXM4-40GB MIG 3g.20gb
        gpuInstanceId: 2
        memory: { total: 20937965568, used: 0 }
"#;

#[test]
fn reports_memory_pci_and_mig_instances_as_devices() {
    let lib = fake_nvml_lib();
    let scene = Scene::new(TWO_GPUS);
    let report = scene.read_once(&lib);
    assert_eq!(report.metadata.name.as_deref(), Some("gpu-node-1"));
    assert_eq!(report.spec.node_name, "gpu-node-1");
    let s = status(&report);
    assert!(s.nvml.up);
    assert_eq!(s.nvml.driver_version.as_deref(), Some("550.54.15"));
    let observed: jiff::Timestamp = s.observed_at.parse().expect("observedAt is RFC 3339");
    assert!(jiff::Timestamp::now().duration_since(observed).as_secs() < 60);

    let uuids: Vec<&str> = s.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        [
            "GPU-8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01",
            "GPU-3e1c2a4b-5d6f-4a8b-9c0d-1e2f3a4b5c6d",
            "MIG-6c1f9a5e-2b3d-5e4f-8a7b-9c0d1e2f3a4b",
            "MIG-7d2a0b6f-3c4e-5f6a-9b8c-0d1e2f3a4b5c",
        ],
        "empty MIG slots (maxMigDevices 7, 2 used) are skipped"
    );
    let h100 = &s.gpus[0];
    assert_eq!(h100.index, 0);
    assert_eq!(h100.name, "NVIDIA H100 80GB HBM3");
    assert_eq!(h100.pci_bus_id.as_deref(), Some("00000000:17:00.0"));
    assert_eq!(h100.memory_total_bytes, 80 * GIB);
    assert_eq!(h100.memory_used_bytes, 20 * GIB);
    assert_eq!(h100.memory_reserved_bytes, GIB / 2);
    assert_eq!(h100.memory_free_bytes, 80 * GIB - 20 * GIB - GIB / 2);
    assert!(!h100.mig_enabled && h100.degraded.is_empty());
    assert_eq!(h100.processes.len(), 4);
    assert_eq!(
        h100.processes[3].used_bytes, None,
        "NVML_VALUE_NOT_AVAILABLE is no number"
    );

    let a100 = &s.gpus[1];
    assert!(a100.mig_enabled && !a100.is_schedulable());
    assert!(a100.processes.is_empty());
    for (mig, instance_id) in s.gpus[2..].iter().zip([Some(1), None]) {
        assert_eq!(mig.index, 1);
        assert_eq!(mig.mig_parent_uuid.as_deref(), Some(a100.uuid.as_str()));
        assert_eq!(mig.memory_total_bytes, 20_937_965_568);
        assert_eq!(mig.name, "NVIDIA A100-SXM4-40GB MIG 3g.20gb");
        assert_eq!(
            mig.mig_gpu_instance_id, instance_id,
            "known from the instance's processes"
        );
    }
    assert_eq!(s.gpus[2].processes[0].pid, 5000);
    assert_eq!(s.gpus[2].memory_used_bytes, 5 * GIB);

    // Summary over schedulable devices: the H100 and the two MIG instances, not the A100 parent.
    assert_eq!(
        s.summary.total_bytes,
        80 * GIB + 2 * 20_937_965_568,
        "{:?}",
        s.summary
    );
    assert_eq!(s.summary.largest_free_block_bytes, h100.memory_free_bytes);
    assert_eq!(
        s.summary.free_bytes,
        h100.memory_free_bytes + (20_937_965_568 - 5 * GIB) + 20_937_965_568
    );
}

#[test]
fn maps_processes_to_pods_through_the_proc_root() {
    let lib = fake_nvml_lib();
    let scene = Scene::new(TWO_GPUS);
    let pod_a_systemd = POD_A.replace('-', "_");
    scene.process(
        4242,
        &format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_a_systemd}.slice/cri-containerd-{CID}.scope\n"
        ),
    );
    scene.process(
        4243,
        &format!("12:memory:/kubepods/besteffort/pod{POD_B}/{CID}\n0::/\n"),
    );
    scene.process(777, "0::/system.slice/nvidia-persistenced.service\n");
    // 778 has no /proc entry (exited between NVML's answer and the lookup); 5000 is CRI-O.
    scene.process(
        5000,
        &format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-{CID}.scope\n",
            POD_B.replace('-', "_")
        ),
    );

    let report = scene.read_once(&lib);
    let s = status(&report);
    let pods: Vec<(u32, Option<&str>, Option<&str>)> = s
        .gpus
        .iter()
        .flat_map(|g| &g.processes)
        .map(|p| (p.pid, p.pod_uid.as_deref(), p.container_id.as_deref()))
        .collect();
    assert_eq!(
        pods,
        [
            (4242, Some(POD_A), Some(CID)),
            (4243, Some(POD_B), Some(CID)),
            (777, None, None),
            (778, None, None),
            (5000, Some(POD_B), Some(CID)),
        ]
    );
}

#[test]
fn init_failures_report_zero_gpus_with_the_reason_and_exit_zero() {
    let lib = fake_nvml_lib();
    for (code, expect) in [
        ("DriverNotLoaded", "DriverNotLoaded"),
        ("NoPermission", "NoPermission"),
        ("LibRmVersionMismatch", "LibRmVersionMismatch"),
    ] {
        let scene = Scene::new(&format!("errors: {{ nvmlInit_v2: {code} }}\n{TWO_GPUS}"));
        let report = scene.read_once(&lib);
        let s = status(&report);
        assert!(!s.nvml.up, "{code}");
        assert!(s.gpus.is_empty(), "{code}");
        let reason = s.nvml.reason.as_deref().unwrap_or_default();
        assert!(reason.contains(expect), "{code}: {reason}");
        assert_eq!(s.summary.total_bytes, 0);
    }

    let scene = Scene::new(TWO_GPUS);
    let report = scene.read_once(Path::new("/nonexistent/libnvidia-ml.so.1"));
    let reason = status(&report).nvml.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("could not be loaded") && reason.contains("/nonexistent"),
        "{reason}"
    );
}

#[test]
fn unsupported_fields_degrade_the_device_not_the_report() {
    let lib = fake_nvml_lib();
    let scene = Scene::new(
        r"
devices:
  - name: NVIDIA T4
    uuid: GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d
    memory: { total: 16106127360, used: 1073741824 }
    processes: [ { pid: 1, usedBytes: 1073741824 } ]
    errors:
      nvmlDeviceGetComputeRunningProcesses_v3: NotSupported
      nvmlDeviceGetPciInfo_v3: NotSupported
      nvmlDeviceGetMigMode: NotSupported
  - name: NVIDIA L4
    uuid: GPU-1a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d
    memory: { total: 24159191040 }
    errors: { nvmlDeviceGetMemoryInfo_v2: GpuIsLost }
",
    );
    let report = scene.read_once(&lib);
    let s = status(&report);
    assert!(s.nvml.up);
    assert_eq!(s.gpus.len(), 2);
    let t4 = &s.gpus[0];
    assert_eq!(t4.memory_used_bytes, GIB, "memory still read");
    assert!(t4.processes.is_empty());
    assert_eq!(
        t4.degraded,
        ["pciBusId: NotSupported", "processes: NotSupported"],
        "a GPU without MIG support is not degraded"
    );
    let l4 = &s.gpus[1];
    assert_eq!(l4.name, "NVIDIA L4");
    assert_eq!(l4.memory_total_bytes, 0);
    assert!(
        l4.degraded.iter().any(|d| d == "memory: GpuLost"),
        "{:?}",
        l4.degraded
    );
}

#[test]
fn a_memory_change_shows_in_the_next_read() {
    let lib = fake_nvml_lib();
    let scene = Scene::new(TWO_GPUS);
    let before = scene.read_once(&lib);
    scene.set_config(&TWO_GPUS.replace("used: 21474836480", "used: 42949672960"));
    let after = scene.read_once(&lib);
    assert_eq!(status(&before).gpus[0].memory_used_bytes, 20 * GIB);
    assert_eq!(status(&after).gpus[0].memory_used_bytes, 40 * GIB);
}

#[test]
fn prints_yaml_by_default_and_needs_a_node_name_without_print() {
    let lib = fake_nvml_lib();
    let scene = Scene::new(TWO_GPUS);
    let out = scene
        .agent(&lib)
        .args(["--once", "--print"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    let report: NodeGpuReport = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(status(&report).gpus.len(), 4);

    let out = Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .args(["agent", "--once"])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--node-name"), "{stderr}");
}

fn http_get(port: u16, path: &str) -> Option<String> {
    request(port, "GET", path, "").map(|(code, body)| format!("{code}\n{body}"))
}

/// Scrapes until `want` is in the body, for up to 20 s.
fn scrape_until(port: u16, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = http_get(port, "/metrics").unwrap_or_default();
        if body.contains(want) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "never saw {want:?} in /metrics; last body:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serves_metrics_follows_memory_and_stops_on_sigterm() {
    let lib = fake_nvml_lib();
    let scene = Scene::new(TWO_GPUS);
    scene.process(4242, &format!("0::/kubepods/burstable/pod{POD_A}/{CID}\n"));
    let port = free_port();
    let child = scene
        .agent(&lib)
        .args(["--print", "--json", "--poll-interval", "100ms"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut agent = Running(child);

    let h100 = r#"node="gpu-node-1",gpu="0",uuid="GPU-8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01",model="NVIDIA H100 80GB HBM3""#;
    let body = scrape_until(
        port,
        &format!("peakfit_gpu_memory_used_bytes{{{h100}}} 21474836480"),
    );
    for want in [
        format!("peakfit_gpu_memory_total_bytes{{{h100}}} 85899345920"),
        format!("peakfit_gpu_memory_reserved_bytes{{{h100}}} 536870912"),
        format!(
            r#"peakfit_pod_gpu_memory_used_bytes{{node="gpu-node-1",uuid="GPU-8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01",pod_uid="{POD_A}"}} 17179869184"#
        ),
        r#"peakfit_nvml_up{node="gpu-node-1"} 1"#.to_string(),
        "peakfit_agent_poll_duration_seconds_count".to_string(),
        "peakfit_agent_publish_errors_total 0".to_string(),
        "peakfit_agent_last_publish_timestamp_seconds".to_string(),
    ] {
        assert!(body.contains(&want), "missing {want}\n{body}");
    }
    assert!(
        !body.contains(r#"uuid="GPU-3e1c2a4b-5d6f-4a8b-9c0d-1e2f3a4b5c6d""#),
        "a MIG parent is not exported (its instances are)\n{body}"
    );
    let health = http_get(port, "/healthz").unwrap();
    assert_eq!(health, "200\nok");

    // The same running agent sees memory move (the fake re-reads its config).
    scene.set_config(&TWO_GPUS.replace("used: 21474836480", "used: 64424509440"));
    scrape_until(
        port,
        &format!("peakfit_gpu_memory_used_bytes{{{h100}}} 64424509440"),
    );
    // And the driver going away.
    scene.set_config(&format!(
        "errors: {{ nvmlDeviceGetCount_v2: DriverNotLoaded }}\n{TWO_GPUS}"
    ));
    let body = scrape_until(port, r#"peakfit_nvml_up{node="gpu-node-1"} 0"#);
    assert!(!body.contains("peakfit_gpu_memory_used_bytes{"), "{body}");

    let pid = agent.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = agent.0.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "agent ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "SIGTERM is a clean exit: {exit}");

    // --print in the loop wrote one report per significant change: first read, +40 GiB, NVML down.
    let mut stdout = String::new();
    agent
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let reports: Vec<NodeGpuReport> = serde_json::Deserializer::from_str(&stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    let used: Vec<Option<u64>> = reports
        .iter()
        .map(|r| status(r).gpus.first().map(|g| g.memory_used_bytes))
        .collect();
    assert_eq!(used, [Some(20 * GIB), Some(60 * GIB), None], "{stdout}");
}
