//! The agent reading the kubelet's `PodResources` API (issue 23), against a fake kubelet: the
//! kubelet's own v1 service, served by tonic on a unix socket.
//!
//! In-process: the agent's `Poller` with its real client (the real gRPC over the real socket) on a
//! fixed GPU reading, for what a kubelet can do (answer, hang, vanish, restart, lack
//! `GetAllocatableResources`). Out of process: the real `peakfit agent` binary on the fake NVML
//! library, printing its report.

mod pod_resources_support;
mod process_support;

use std::process::Command;
use std::time::{Duration, Instant};

use peakfit::agent::Poller;
use peakfit::agent::nvml::{GpuSource, Reading};
use peakfit::agent::pod_resources::{GpuResources, PodResourcesReader};
use peakfit::agent::publish::NodeCapacity;
use peakfit::cluster::NodeGpuReport;
use peakfit::inventory::{GpuDevice, HolderKind, NodeGpuReportStatus, NvmlStatus};
use pod_resources_support::{FakeKubelet, allocatable, device_plugin_pod, dra_pod, holders};
use process_support::fake_nvml_lib;

const GIB: u64 = 1 << 30;

fn uuid(i: usize) -> String {
    format!("GPU-00000000-0000-4000-8000-{i:012x}")
}

/// Four 80 GiB GPUs, always the same reading.
struct FourGpus;

impl GpuSource for FourGpus {
    fn read(&mut self) -> Reading {
        Reading {
            nvml: NvmlStatus {
                up: true,
                driver_version: Some("550.54.15".into()),
                reason: None,
            },
            gpus: (0..4)
                .map(|i| GpuDevice {
                    index: u32::try_from(i).unwrap(),
                    uuid: uuid(i),
                    memory_total_bytes: 80 * GIB,
                    memory_free_bytes: 80 * GIB,
                    ..GpuDevice::default()
                })
                .collect(),
            ..Reading::default()
        }
    }
}

fn filter() -> GpuResources {
    GpuResources::new(
        &["nvidia.com/gpu".into(), "nvidia.com/mig-*".into()],
        &["gpu.nvidia.com".into()],
    )
    .unwrap()
}

fn poller(socket: &std::path::Path, timeout: Duration) -> Poller<FourGpus> {
    Poller::new(FourGpus, "/nonexistent-proc").with_pod_resources(Some(
        PodResourcesReader::new(socket, timeout, filter()).unwrap(),
    ))
}

/// A trainer holding GPUs 0 and 1 through the device plugin, a claim holding GPU 2 through DRA,
/// and one allocation naming no GPU here.
fn allocate(kubelet: &FakeKubelet) {
    let (a, b) = (uuid(0), uuid(1));
    kubelet.set(
        vec![
            device_plugin_pod("ml", "trainer-0", "nvidia.com/gpu", &[&a, &b]),
            dra_pod("ml", "infer-0", "gpus", "gpu.nvidia.com", "gpu-2"),
            device_plugin_pod("ml", "ghost", "nvidia.com/gpu", &["GPU-not-here"]),
            device_plugin_pod("ml", "nic", "example.com/nic", &["eth1"]),
        ],
        vec![allocatable("nvidia.com/gpu", &[&a, &b, &uuid(2), &uuid(3)])],
    );
}

fn expected_holders() -> Vec<Vec<String>> {
    vec![
        vec!["ml/trainer-0 through nvidia.com/gpu".to_string()],
        vec!["ml/trainer-0 through nvidia.com/gpu".to_string()],
        vec!["ml/infer-0 through claim ml/gpus (gpu.nvidia.com)".to_string()],
        vec![],
    ]
}

#[test]
fn device_plugin_and_dra_holders_reach_the_report_and_leave_the_advertised_memory() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&dir.path().join("kubelet.sock"));
    allocate(&kubelet);
    let mut p = poller(&kubelet.socket, Duration::from_secs(2));
    let s = p.poll();

    assert_eq!(
        s.pod_resources,
        Some(peakfit::inventory::PodResourcesStatus {
            up: true,
            reason: None
        })
    );
    assert_eq!(holders(&s), expected_holders());
    let dra = &s.gpus[2].held_by[0];
    assert_eq!(dra.kind, HolderKind::Dra);
    assert_eq!(dra.claim.as_deref(), Some("ml/gpus"));
    assert_eq!(dra.container, "main");
    assert_eq!(s.gpus[0].held_by[0].kind, HolderKind::DevicePlugin);
    // One GPU of four is free: the Node advertises 80 GiB, the summary still counts all four.
    assert_eq!(NodeCapacity::mib(&s), 80 * 1024);
    assert_eq!(s.summary.total_bytes, 320 * GIB);

    let stats = p.pod_resources_stats().unwrap();
    assert!(stats.up);
    assert_eq!(stats.held_devices, 3);
    assert_eq!(
        stats.unmapped, 1,
        "ghost's GPU-not-here is reported, not dropped"
    );
    assert_eq!(stats.allocatable, Some(4));
    // GetAllocatableResources is asked once a minute, List at every poll; the last allocatable
    // answer still counts.
    let before = kubelet.calls();
    let again = p.poll();
    assert_eq!(kubelet.calls() - before, 1);
    assert_eq!(holders(&again), expected_holders());
    assert_eq!(p.pod_resources_stats().unwrap().allocatable, Some(4));
    assert_eq!(p.pod_resources_stats().unwrap().unmapped, 1);

    // The trainer ends: its GPUs are free at the next poll.
    kubelet.set(
        vec![dra_pod("ml", "infer-0", "gpus", "gpu.nvidia.com", "gpu-2")],
        vec![],
    );
    let s = p.poll();
    assert_eq!(
        holders(&s),
        [
            vec![],
            vec![],
            vec!["ml/infer-0 through claim ml/gpus (gpu.nvidia.com)".to_string()],
            vec![]
        ]
    );
    assert_eq!(NodeCapacity::mib(&s), 3 * 80 * 1024);
}

#[test]
fn a_hung_kubelet_costs_one_timeout_and_keeps_the_last_holders() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&dir.path().join("kubelet.sock"));
    allocate(&kubelet);
    let mut p = poller(&kubelet.socket, Duration::from_millis(300));
    assert_eq!(holders(&p.poll()), expected_holders());

    kubelet.set_delay(Duration::from_secs(30));
    let started = Instant::now();
    let s = p.poll();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "the poll waited {took:?}");
    let status = s.pod_resources.clone().unwrap();
    assert!(!status.up);
    let reason = status.reason.unwrap();
    assert!(reason.starts_with("timeout: "), "{reason}");
    assert!(reason.contains("300ms"), "{reason}");
    // NVML's reading stands, and the holders of the last read are kept (a GPU held a moment ago
    // is not offered as free because the kubelet was slow).
    assert!(s.nvml.up);
    assert_eq!(s.gpus.len(), 4);
    assert_eq!(holders(&s), expected_holders());
    assert!(!p.pod_resources_stats().unwrap().up);

    // The kubelet answers again.
    kubelet.set_delay(Duration::ZERO);
    let s = p.poll();
    assert!(s.pod_resources.unwrap().up);
}

#[test]
fn a_missing_socket_is_reported_and_a_restarted_kubelet_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let mut p = poller(&socket, Duration::from_secs(1));
    let s = p.poll();
    let status = s.pod_resources.clone().unwrap();
    assert!(!status.up);
    let reason = status.reason.unwrap();
    assert!(reason.starts_with("socket missing: "), "{reason}");
    assert!(reason.contains(&socket.display().to_string()), "{reason}");
    assert!(s.nvml.up && s.gpus.len() == 4, "NVML's reading is not lost");
    assert!(s.gpus.iter().all(|g| g.held_by.is_empty()));
    assert_eq!(NodeCapacity::mib(&s), 4 * 80 * 1024);

    // The kubelet starts (or restarts: a new socket at the same path): the next poll reads it.
    let kubelet = FakeKubelet::start(&socket);
    allocate(&kubelet);
    assert_eq!(holders(&p.poll()), expected_holders());
    drop(kubelet);
    let kubelet = FakeKubelet::start(&socket);
    kubelet.set(
        vec![device_plugin_pod(
            "ml",
            "other",
            "nvidia.com/gpu",
            &[&uuid(3)],
        )],
        vec![],
    );
    let s = eventually_up(&mut p);
    assert_eq!(
        holders(&s)[3],
        ["ml/other through nvidia.com/gpu".to_string()]
    );
}

/// Polls until the reader is up again (a restarted server may refuse the old connection once).
fn eventually_up(p: &mut Poller<FourGpus>) -> NodeGpuReportStatus {
    for _ in 0..20 {
        let s = p.poll();
        if s.pod_resources.as_ref().is_some_and(|r| r.up) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the reader never came back up");
}

#[test]
fn a_kubelet_without_get_allocatable_resources_is_read_through_list() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&dir.path().join("kubelet.sock"));
    allocate(&kubelet);
    kubelet.set_no_allocatable(true);
    let mut p = poller(&kubelet.socket, Duration::from_secs(2));
    let s = p.poll();
    assert!(s.pod_resources.as_ref().unwrap().up);
    assert_eq!(holders(&s), expected_holders());
    assert_eq!(p.pod_resources_stats().unwrap().allocatable, None);
    // Not asked again: one List per poll from now on.
    let before = kubelet.calls();
    p.poll();
    assert_eq!(kubelet.calls() - before, 1);
}

// The real binary.

const TWO_GPUS: &str = r#"
driverVersion: "550.54.15"
devices:
  - name: NVIDIA H100 80GB HBM3
    uuid: GPU-00000000-0000-4000-8000-000000000000
    minor: 1
    memory: { total: 85899345920, used: 0 }
  - name: NVIDIA H100 80GB HBM3
    uuid: GPU-00000000-0000-4000-8000-000000000001
    minor: 0
    memory: { total: 85899345920, used: 0 }
"#;

fn agent(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let config = dir.join("nvml.yaml");
    std::fs::write(&config, TWO_GPUS).unwrap();
    Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .arg("agent")
        .arg("--nvml-lib")
        .arg(fake_nvml_lib())
        .args([
            "--proc-root",
            "/nonexistent-proc",
            "--node-name",
            "gpu-node-1",
        ])
        .args(["--once", "--print", "--json"])
        .args(extra)
        .env("FAKE_NVML_CONFIG", &config)
        .env_remove("KUBECONFIG")
        .env_remove("NODE_NAME")
        .env_remove("PEAKFIT_POD_RESOURCES_SOCKET")
        .env("PEAKFIT_LOG", "warn")
        .output()
        .unwrap()
}

fn printed(out: &std::process::Output) -> NodeGpuReportStatus {
    assert!(
        out.status.success(),
        "agent failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: NodeGpuReport = serde_json::from_slice(&out.stdout).unwrap();
    report.status.unwrap()
}

#[test]
fn the_agent_binary_prints_holders_with_dra_names_by_minor_number() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(&dir.path().join("kubelet.sock"));
    // gpu-0 is the device whose minor number is 0: the second GPU NVML lists.
    kubelet.set(
        vec![dra_pod("ml", "infer-0", "gpus", "gpu.nvidia.com", "gpu-0")],
        vec![],
    );
    let socket = kubelet.socket.display().to_string();
    let s = printed(&agent(dir.path(), &["--pod-resources-socket", &socket]));
    assert!(
        s.pod_resources.as_ref().unwrap().up,
        "{:?}",
        s.pod_resources
    );
    assert!(s.gpus[0].held_by.is_empty());
    assert_eq!(
        s.gpus[1]
            .held_by
            .iter()
            .map(peakfit::inventory::DeviceHolder::describe)
            .collect::<Vec<_>>(),
        ["ml/infer-0 through claim ml/gpus (gpu.nvidia.com)"]
    );

    // An operator's own resource names and drivers.
    kubelet.set(
        vec![
            device_plugin_pod(
                "ml",
                "shared",
                "example.com/gpu",
                &["GPU-00000000-0000-4000-8000-000000000000"],
            ),
            dra_pod("ml", "infer-0", "gpus", "gpu.nvidia.com", "gpu-0"),
        ],
        vec![],
    );
    let s = printed(&agent(
        dir.path(),
        &[
            "--pod-resources-socket",
            &socket,
            "--gpu-resources",
            "example.com/gpu",
            "--gpu-dra-drivers",
            "dra.example.com",
        ],
    ));
    assert_eq!(s.gpus[0].held_by.len(), 1);
    assert_eq!(s.gpus[0].held_by[0].resource, "example.com/gpu");
    assert!(
        s.gpus[1].held_by.is_empty(),
        "gpu.nvidia.com is not a GPU driver now"
    );
}

#[test]
fn the_agent_binary_without_a_socket_reports_why_and_with_an_empty_flag_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such.sock");
    let s = printed(&agent(
        dir.path(),
        &["--pod-resources-socket", &missing.display().to_string()],
    ));
    let r = s.pod_resources.unwrap();
    assert!(!r.up);
    assert!(r.reason.unwrap().starts_with("socket missing: "));
    assert_eq!(s.gpus.len(), 2, "NVML's reading is intact");

    let out = agent(dir.path(), &["--pod-resources-socket", ""]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("podResources"));
    assert_eq!(printed(&out).pod_resources, None);
}

#[test]
fn a_bad_gpu_resources_flag_is_refused_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let out = agent(
        dir.path(),
        &[
            "--pod-resources-socket",
            "/x.sock",
            "--gpu-resources",
            "nvidia.com/gpu,*",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"--gpu-resources: entry "*" is not allowed"#),
        "{err}"
    );
}
