//! `peakfit agent`: the `DaemonSet` process that reads the node's GPUs through NVML, maps their
//! processes to pods, and publishes the node's `NodeGpuReport`. It writes only its own node (the
//! report and, when asked, the node's advertised GPU memory) and may not read the extender's index.
//!
//! It must outlive a missing or broken driver: NVML failures become a report with zero GPUs and
//! the reason (`peakfit_nvml_up 0`), the agent keeps serving `/metrics` and `/healthz` and
//! retries, and only a signal (SIGTERM, SIGINT) or a port it cannot bind ends it.

pub mod metrics;
pub mod nvml;
pub mod pod_resources;
pub mod pods;
pub mod publish;
pub mod report;

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::routing::get;

use crate::cluster::{NodeGpuReport, NodeGpuReportSpec};
use crate::flags::{ClientArgs, parse_nonzero_duration};
use crate::inventory::NodeGpuReportStatus;

use self::metrics::AgentMetrics;
use self::nvml::{GpuSource, NvmlSource};
use self::pod_resources::PodResourcesReader;
use self::publish::{NodeCapacity, Publisher};
use self::report::{PodUsageHistory, PublishGate};

#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
    /// The node this agent runs on; the `NodeGpuReport`'s name (downward API `spec.nodeName`).
    /// Defaults to the hostname with `--print`.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Address for `/metrics` and `/healthz`.
    #[arg(long, env = "PEAKFIT_AGENT_LISTEN", default_value = "0.0.0.0:9400")]
    pub listen: SocketAddr,
    /// How often to read the GPUs (e.g. `5s`, `500ms`).
    #[arg(long, env = "PEAKFIT_POLL_INTERVAL", default_value = "5s", value_parser = parse_nonzero_duration)]
    pub poll_interval: Duration,
    /// Longest time between two writes of the report, even when nothing changed.
    #[arg(long, env = "PEAKFIT_HEARTBEAT", default_value = "30s", value_parser = parse_nonzero_duration)]
    pub heartbeat: Duration,
    /// The host's `/proc` (mounted into the pod), to find each GPU process's pod.
    #[arg(long, env = "PEAKFIT_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// NVML library: a file name searched like `dlopen` does, or a path.
    #[arg(long, env = "PEAKFIT_NVML_LIB", default_value = "libnvidia-ml.so.1")]
    pub nvml_lib: OsString,
    /// Read once, write (or print) the report, and exit.
    #[arg(long, env = "PEAKFIT_ONCE")]
    pub once: bool,
    /// Print the `NodeGpuReport` to stdout (YAML) instead of writing it to the API server.
    #[arg(long, env = "PEAKFIT_PRINT")]
    pub print: bool,
    /// With `--print`: JSON instead of YAML.
    #[arg(long, env = "PEAKFIT_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
    /// Extended resource to advertise the node's total GPU memory as, in MiB, on the Node's
    /// status, for kube-scheduler's own fit and preemption; the webhook's `--gpu-memory-resource`
    /// must name the same one. Empty: not advertised.
    #[arg(
        long,
        env = "PEAKFIT_GPU_MEMORY_RESOURCE",
        default_value = publish::DEFAULT_GPU_MEMORY_RESOURCE
    )]
    pub gpu_memory_resource: String,
    /// The `/metrics` listener's limits, the extender's and webhook's flags: a scraper that
    /// stalls mid-request or opens connections without end costs a bounded amount, and on
    /// SIGTERM the agent exits within `--shutdown-timeout` whatever is still open.
    #[command(flatten)]
    pub serve: crate::serve::ServeArgs,
    /// The kubelet's `PodResources` socket, to learn which GPUs it gave to pods through a device
    /// plugin or DRA (those are not shared, nor advertised). Empty: not read.
    #[arg(
        long,
        env = "PEAKFIT_POD_RESOURCES_SOCKET",
        default_value = DEFAULT_POD_RESOURCES_SOCKET
    )]
    pub pod_resources_socket: String,
    /// Longest wait for the kubelet's answer in one poll: a hung kubelet delays the report by
    /// this much, no more.
    #[arg(long, env = "PEAKFIT_POD_RESOURCES_TIMEOUT", default_value = "1s", value_parser = parse_nonzero_duration)]
    pub pod_resources_timeout: Duration,
    #[command(flatten)]
    pub gpu: crate::flags::GpuResourceArgs,
}

/// Where the kubelet serves its `PodResources` API.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

impl AgentArgs {
    /// The `PodResources` reader the flags ask for; `None` with `--pod-resources-socket ""`.
    pub fn pod_resources(&self) -> anyhow::Result<Option<PodResourcesReader>> {
        if self.pod_resources_socket.trim().is_empty() {
            return Ok(None);
        }
        let filter = self.gpu.parse()?;
        Ok(Some(PodResourcesReader::new(
            self.pod_resources_socket.trim(),
            self.pod_resources_timeout,
            filter,
        )?))
    }
}

/// One poll: read the GPUs, ask the kubelet who holds them, attribute processes to pods, build
/// the status.
pub struct Poller<S> {
    source: S,
    proc_root: PathBuf,
    history: PodUsageHistory,
    pod_resources: Option<PodResourcesReader>,
}

impl<S: GpuSource> Poller<S> {
    pub fn new(source: S, proc_root: impl Into<PathBuf>) -> Self {
        Self {
            source,
            proc_root: proc_root.into(),
            history: PodUsageHistory::default(),
            pod_resources: None,
        }
    }

    /// Reads the kubelet's `PodResources` API at each poll too.
    #[must_use]
    pub fn with_pod_resources(mut self, reader: Option<PodResourcesReader>) -> Self {
        self.pod_resources = reader;
        self
    }

    /// What the last poll's `PodResources` read found; `None` when it is not read.
    pub fn pod_resources_stats(&self) -> Option<&pod_resources::Stats> {
        self.pod_resources.as_ref().map(PodResourcesReader::stats)
    }

    /// Blocks (NVML, and the kubelet up to its timeout): call it off the async workers.
    pub fn poll(&mut self) -> NodeGpuReportStatus {
        let mut reading = self.source.read();
        let pod_resources = self
            .pod_resources
            .as_mut()
            .map(|r| r.read(&mut reading.gpus, &reading.minor_numbers));
        // One read of a process's cgroup per poll, however many GPUs list it (a process on 8
        // GPUs was read 8 times; a poll reads a few, not one per process per GPU).
        let mut seen: std::collections::HashMap<u32, Option<pods::PodRef>> =
            std::collections::HashMap::new();
        for gpu in &mut reading.gpus {
            for p in &mut gpu.processes {
                let pod = seen
                    .entry(p.pid)
                    .or_insert_with(|| pods::lookup(&self.proc_root, p.pid))
                    .clone();
                if let Some(pod) = pod {
                    p.pod_uid = Some(pod.pod_uid);
                    p.container_id = pod.container_id;
                }
            }
        }
        let now = jiff::Timestamp::now();
        self.history.observe(&reading.gpus, now);
        let pod_peaks = self.history.running_peaks(&reading.gpus);
        let mut status = report::build(now, reading, self.history.typical());
        status.pod_peaks = pod_peaks;
        status.pod_resources = pod_resources;
        status
    }
}

/// The whole object, as the API server would hold it, so `--print` output can be fed to
/// `peakfit extender --from-file`.
pub fn report_object(node: &str, status: NodeGpuReportStatus) -> NodeGpuReport {
    let mut object = NodeGpuReport::new(
        node,
        NodeGpuReportSpec {
            node_name: node.to_string(),
        },
    );
    object.status = Some(status);
    object
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

enum Sink {
    Print { json: bool },
    Cluster(Box<Publisher>, Box<Option<NodeCapacity>>),
}

impl Sink {
    async fn write(&mut self, node: &str, status: &NodeGpuReportStatus) -> anyhow::Result<()> {
        match self {
            Sink::Print { json } => {
                let object = report_object(node, status.clone());
                let text = if *json {
                    serde_json::to_string_pretty(&object)? + "\n"
                } else {
                    format!("---\n{}", serde_saphyr::to_string(&object)?)
                };
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
                Ok(())
            }
            Sink::Cluster(publisher, capacity) => {
                publisher.publish(status).await?;
                if let Some(capacity) = capacity.as_mut()
                    && let Err(e) = capacity.advertise(status).await
                {
                    // The report is out; the extender places by it. Only preemption for GPU
                    // memory waits for the next try.
                    tracing::warn!("{:#}", anyhow::Error::from(e));
                }
                Ok(())
            }
        }
    }
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let node = match (&args.node_name, args.print) {
        (Some(n), _) => n.clone(),
        (None, true) => hostname(),
        (None, false) => anyhow::bail!(
            "--node-name (or NODE_NAME) is required unless --print is given; \
             set it from the downward API (spec.nodeName)"
        ),
    };
    let mut sink = if args.print {
        Sink::Print { json: args.json }
    } else {
        let client = args.client.client().await?;
        let capacity = Some(args.gpu_memory_resource.trim())
            .filter(|r| !r.is_empty())
            .map(|r| NodeCapacity::new(client.clone(), &node, r));
        Sink::Cluster(Box::new(Publisher::new(client, &node)), Box::new(capacity))
    };
    let mut poller = Poller::new(NvmlSource::new(&args.nvml_lib), &args.proc_root)
        .with_pod_resources(args.pod_resources()?);

    if args.once {
        // The PodResources client blocks on its own runtime, which an async worker may not do.
        let status = tokio::task::spawn_blocking(move || poller.poll())
            .await
            .context("the GPU poll panicked")?;
        return sink.write(&node, &status).await;
    }

    let metrics = AgentMetrics::new(&node);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    tracing::info!(
        %node,
        listen = %listener.local_addr()?,
        poll_interval = ?args.poll_interval,
        heartbeat = ?args.heartbeat,
        "peakfit agent started"
    );
    let stop = crate::shutdown::Stop::on_signal();
    let probes =
        crate::serve::spawn_probes(&args.serve, crate::serve::liveness_router(), stop.stopped())
            .await?;
    let server = {
        let (router, args, stopped) = (router(&metrics), args.serve.clone(), stop.stopped());
        tokio::spawn(async move {
            crate::serve::serve(listener, crate::serve::plain, router, &args, stopped).await;
        })
    };

    let mut gate = PublishGate::new(args.heartbeat);
    loop {
        let started = Instant::now();
        // NVML calls block (a driver can take milliseconds, more when a GPU is in trouble), so
        // they run off the async workers that serve /metrics.
        let (returned, status) = tokio::task::spawn_blocking(move || {
            let status = poller.poll();
            (poller, status)
        })
        .await
        .context("the GPU poll panicked")?;
        poller = returned;
        metrics.record(&status, started.elapsed());
        if let Some(stats) = poller.pod_resources_stats() {
            metrics.record_pod_resources(stats);
        }
        let now = Instant::now();
        if gate.due(&status, now) {
            match sink.write(&node, &status).await {
                Ok(()) => {
                    metrics.published(jiff::Timestamp::now());
                    gate.published(status, now);
                }
                Err(e) => {
                    metrics.publish_failed();
                    tracing::warn!("publishing the report failed, retrying next poll: {e:#}");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(args.poll_interval.saturating_sub(started.elapsed())) => {}
            () = stop.stopped() => break,
        }
    }
    tracing::info!("stopping");
    server.await?;
    if let Some(probes) = probes {
        probes.await?;
    }
    Ok(())
}

fn router(metrics: &AgentMetrics) -> Router {
    let registry = metrics.registry();
    let cache = std::sync::Arc::new(crate::metrics::RenderCache::new(
        crate::metrics::SCRAPE_MAX_AGE,
    ));
    Router::new()
        .route(
            "/metrics",
            get(
                move |peer: Option<axum::Extension<crate::serve::Peer>>,
                      headers: axum::http::HeaderMap| {
                    let (registry, cache) = (registry.clone(), cache.clone());
                    async move {
                        cache
                            .serve(
                                crate::metrics::accepts_gzip(&headers),
                                peer.map(|p| p.0.0.ip()),
                                move || crate::metrics::encode(&registry),
                            )
                            .await
                    }
                },
            ),
        )
        // Liveness only: a node without a working driver is healthy for the agent (it reports
        // that), and restarting would not fix the driver.
        .merge(crate::serve::liveness_router())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_object_is_a_whole_node_gpu_report() {
        let object = report_object("gpu-node-1", NodeGpuReportStatus::default());
        let v = serde_json::to_value(&object).unwrap();
        assert_eq!(v["apiVersion"], "peakfit.io/v1alpha1");
        assert_eq!(v["kind"], "NodeGpuReport");
        assert_eq!(v["metadata"]["name"], "gpu-node-1");
        assert_eq!(v["spec"]["nodeName"], "gpu-node-1");
        assert!(v["status"].is_object());
    }
}
