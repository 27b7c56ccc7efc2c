//! The agent's Prometheus metrics (names agreed in the brief: the chart's alerts and dashboards
//! are built on them).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::inventory::NodeGpuReportStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    gpu: String,
    uuid: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    node: String,
    uuid: String,
    pod_uid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// Every metric handle shares its value with the registry, so clones update what is served.
#[derive(Clone)]
pub struct AgentMetrics {
    node: String,
    registry: Arc<Registry>,
    total: Family<GpuLabels, Gauge>,
    used: Family<GpuLabels, Gauge>,
    free: Family<GpuLabels, Gauge>,
    reserved: Family<GpuLabels, Gauge>,
    pod_used: Family<PodLabels, Gauge>,
    nvml_up: Family<NodeLabels, Gauge>,
    poll_duration: Histogram,
    publish_errors: Counter,
    last_publish: Gauge<f64, AtomicU64>,
    pod_resources_up: Family<NodeLabels, Gauge>,
    held_gpus: Family<NodeLabels, Gauge>,
    unmapped_devices: Family<NodeLabels, Gauge>,
    allocatable_gpus: Family<NodeLabels, Gauge>,
}

impl AgentMetrics {
    pub fn new(node: impl Into<String>) -> Self {
        let mut registry = Registry::default();
        let total = Family::<GpuLabels, Gauge>::default();
        let used = Family::<GpuLabels, Gauge>::default();
        let free = Family::<GpuLabels, Gauge>::default();
        let reserved = Family::<GpuLabels, Gauge>::default();
        let pod_used = Family::<PodLabels, Gauge>::default();
        let nvml_up = Family::<NodeLabels, Gauge>::default();
        // 0.5 ms .. 4 s: a healthy poll is a few ms, a hung driver call seconds.
        let poll_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let publish_errors = Counter::default();
        let last_publish = Gauge::<f64, AtomicU64>::default();
        let pod_resources_up = Family::<NodeLabels, Gauge>::default();
        let held_gpus = Family::<NodeLabels, Gauge>::default();
        let unmapped_devices = Family::<NodeLabels, Gauge>::default();
        let allocatable_gpus = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "peakfit_gpu_memory_total_bytes",
            "GPU memory of a schedulable device (whole GPU or MIG instance)",
            total.clone(),
        );
        registry.register(
            "peakfit_gpu_memory_used_bytes",
            "GPU memory in use (NVML memory_info v2, excludes driver-reserved memory)",
            used.clone(),
        );
        registry.register(
            "peakfit_gpu_memory_free_bytes",
            "GPU memory free",
            free.clone(),
        );
        registry.register(
            "peakfit_gpu_memory_reserved_bytes",
            "GPU memory the driver reserves for itself",
            reserved.clone(),
        );
        registry.register(
            "peakfit_pod_gpu_memory_used_bytes",
            "GPU memory used by a pod's processes on a device",
            pod_used.clone(),
        );
        registry.register(
            "peakfit_nvml_up",
            "1 when NVML answered the last poll",
            nvml_up.clone(),
        );
        registry.register(
            "peakfit_agent_poll_duration_seconds",
            "Time to read every GPU and map processes to pods",
            poll_duration.clone(),
        );
        registry.register(
            "peakfit_agent_publish_errors",
            "Failed writes of the NodeGpuReport",
            publish_errors.clone(),
        );
        registry.register(
            "peakfit_agent_last_publish_timestamp_seconds",
            "Unix time of the last successful NodeGpuReport write",
            last_publish.clone(),
        );
        registry.register(
            "peakfit_agent_pod_resources_up",
            "1 when the kubelet's PodResources API answered the last poll",
            pod_resources_up.clone(),
        );
        registry.register(
            "peakfit_agent_held_gpus",
            "Schedulable GPU devices the kubelet gave to a pod (device plugin or DRA); not shared",
            held_gpus.clone(),
        );
        registry.register(
            "peakfit_agent_pod_resources_unmapped_devices",
            "GPU allocations or allocatable ids from the kubelet that name no device NVML lists",
            unmapped_devices.clone(),
        );
        registry.register(
            "peakfit_agent_pod_resources_allocatable_gpus",
            "GPU device-plugin devices the kubelet can allocate (GetAllocatableResources)",
            allocatable_gpus.clone(),
        );
        Self {
            node: node.into(),
            registry: Arc::new(registry),
            total,
            used,
            free,
            reserved,
            pod_used,
            nvml_up,
            poll_duration,
            publish_errors,
            last_publish,
            pod_resources_up,
            held_gpus,
            unmapped_devices,
            allocatable_gpus,
        }
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Replaces the per-device and per-pod series with those of `status`, so devices and pods
    /// that went away stop being exported. MIG parents are left out: their instances carry the
    /// memory, and summing both would count it twice.
    pub fn record(&self, status: &NodeGpuReportStatus, poll: Duration) {
        self.poll_duration.observe(poll.as_secs_f64());
        self.nvml_up
            .get_or_create(&NodeLabels {
                node: self.node.clone(),
            })
            .set(i64::from(status.nvml.up));
        for family in [&self.total, &self.used, &self.free, &self.reserved] {
            family.clear();
        }
        self.pod_used.clear();
        for gpu in status.gpus.iter().filter(|g| g.is_schedulable()) {
            let labels = GpuLabels {
                node: self.node.clone(),
                gpu: gpu.index.to_string(),
                uuid: gpu.uuid.clone(),
                model: gpu.name.clone(),
            };
            let set = |f: &Family<GpuLabels, Gauge>, v: u64| {
                f.get_or_create(&labels).set(saturating_i64(v));
            };
            set(&self.total, gpu.memory_total_bytes);
            set(&self.used, gpu.memory_used_bytes);
            set(&self.free, gpu.memory_free_bytes);
            set(&self.reserved, gpu.memory_reserved_bytes);
            for p in &gpu.processes {
                if let (Some(pod_uid), Some(bytes)) = (&p.pod_uid, p.used_bytes) {
                    self.pod_used
                        .get_or_create(&PodLabels {
                            node: self.node.clone(),
                            uuid: gpu.uuid.clone(),
                            pod_uid: pod_uid.clone(),
                        })
                        .inc_by(saturating_i64(bytes));
                }
            }
        }
    }

    /// What the poll's `PodResources` read found (not called when it is not read, so an agent
    /// with `--pod-resources-socket ""` exports none of these series).
    pub fn record_pod_resources(&self, stats: &crate::agent::pod_resources::Stats) {
        let labels = NodeLabels {
            node: self.node.clone(),
        };
        self.pod_resources_up
            .get_or_create(&labels)
            .set(i64::from(stats.up));
        self.held_gpus
            .get_or_create(&labels)
            .set(count(stats.held_devices));
        self.unmapped_devices
            .get_or_create(&labels)
            .set(count(stats.unmapped));
        if let Some(n) = stats.allocatable {
            self.allocatable_gpus.get_or_create(&labels).set(count(n));
        } else {
            self.allocatable_gpus.remove(&labels);
        }
    }

    pub fn publish_failed(&self) {
        self.publish_errors.inc();
    }

    pub fn published(&self, at: jiff::Timestamp) {
        self.last_publish.set(at.as_millisecond() as f64 / 1000.0);
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuDevice, GpuProcess, NvmlStatus};

    #[test]
    fn series_follow_the_latest_status() {
        let m = AgentMetrics::new("node-a");
        let proc = |pid, pod: &str| GpuProcess {
            pid,
            used_bytes: Some(100),
            pod_uid: Some(pod.into()),
            container_id: None,
        };
        let mut status = NodeGpuReportStatus {
            nvml: NvmlStatus {
                up: true,
                ..NvmlStatus::default()
            },
            gpus: vec![GpuDevice {
                uuid: "GPU-a".into(),
                name: "NVIDIA L4".into(),
                memory_total_bytes: 1000,
                memory_used_bytes: 300,
                memory_free_bytes: 700,
                processes: vec![proc(1, "pod-1"), proc(2, "pod-1")],
                ..GpuDevice::default()
            }],
            ..NodeGpuReportStatus::default()
        };
        m.record(&status, Duration::from_millis(2));
        let text = render(&m);
        assert!(text.contains(
            r#"peakfit_gpu_memory_total_bytes{node="node-a",gpu="0",uuid="GPU-a",model="NVIDIA L4"} 1000"#
        ), "{text}");
        assert!(text.contains(
            r#"peakfit_pod_gpu_memory_used_bytes{node="node-a",uuid="GPU-a",pod_uid="pod-1"} 200"#
        ), "{text}");
        assert!(
            text.contains(r#"peakfit_nvml_up{node="node-a"} 1"#),
            "{text}"
        );

        status.gpus.clear();
        status.nvml.up = false;
        m.record(&status, Duration::from_millis(2));
        m.publish_failed();
        let text = render(&m);
        assert!(!text.contains("GPU-a"), "{text}");
        assert!(
            text.contains(r#"peakfit_nvml_up{node="node-a"} 0"#),
            "{text}"
        );
        assert!(
            text.contains("peakfit_agent_publish_errors_total 1"),
            "{text}"
        );
        assert!(
            text.contains("peakfit_agent_poll_duration_seconds_count 2"),
            "{text}"
        );
        assert!(!text.contains("peakfit_agent_pod_resources_up{"), "{text}");

        m.record_pod_resources(&crate::agent::pod_resources::Stats {
            up: true,
            held_devices: 3,
            unmapped: 1,
            allocatable: Some(8),
        });
        let text = render(&m);
        for line in [
            r#"peakfit_agent_pod_resources_up{node="node-a"} 1"#,
            r#"peakfit_agent_held_gpus{node="node-a"} 3"#,
            r#"peakfit_agent_pod_resources_unmapped_devices{node="node-a"} 1"#,
            r#"peakfit_agent_pod_resources_allocatable_gpus{node="node-a"} 8"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        m.record_pod_resources(&crate::agent::pod_resources::Stats::default());
        let text = render(&m);
        assert!(
            text.contains(r#"peakfit_agent_pod_resources_up{node="node-a"} 0"#),
            "{text}"
        );
        assert!(
            !text.contains("peakfit_agent_pod_resources_allocatable_gpus{"),
            "{text}"
        );
    }

    fn render(m: &AgentMetrics) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &m.registry()).unwrap();
        s
    }
}
