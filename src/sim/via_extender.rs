//! The peakfit policy as a cluster runs it: the real `Extender` over an index built from the
//! trace's Node objects and GPU reports, asked by a model of kube-scheduler.
//!
//! Per arriving pod: the sim plays kube-scheduler's own filters (CPU, memory, GPU model by the
//! pod's node affinity) and hands the survivors to the extender's `filter`, then `prioritize`,
//! then picks the node as kube-scheduler does, then calls the extender's `bind` with the
//! in-memory binder. The extender learns the shape mix from the pods it filters and the GPU
//! models from its index; nothing of the trace reaches it but Nodes, reports and Pods.
//!
//! kube-scheduler's choice, as the chart deploys it: the chart's profile turns off the score of
//! `NodeResourcesFit` and `NodeResourcesBalancedAllocation` (`DISABLED_SCORE_PLUGINS`; tests/chart.rs
//! checks the rendered profile against it), so each node's total is the extender's 0-10 score ×
//! its weight (the chart's 5) × 10 (`MaxNodeScore` / `MaxExtenderPriority`) plus what the other
//! default plugins give, which is the same for every node of this experiment (no taints,
//! preferred affinities, spread constraints or images). `--scheduler-profile default-plugins` models
//! a profile that keeps the two resource plugins (`LeastAllocated` over CPU and memory, weight 1,
//! and `BalancedAllocation`, weight 1). Among the nodes with the highest total, `selectHost` keeps
//! one by reservoir sampling (each of k tied nodes with probability 1/k); here from a `ChaCha8`
//! RNG seeded by the run's seed, over the nodes in the order the sim's model of the parallel
//! filter lists them. Prioritize gives 10 to one node only, so with the resource plugins off
//! no tie is left to sample. `percentageOfNodesToScore` is taken as 100 (the chart README's
//! advice for large clusters), so every feasible node is scored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, NodeStatus, Pod, PodSpec as KPodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::openb::{NodeSpec, PodSpec};
use crate::cluster::binding::MemoryBinder;
use crate::cluster::index::Index;
use crate::cluster::resources::GPU_PRODUCT_LABEL;
use crate::cluster::{NodeGpuReport, NodeGpuReportSpec};
use crate::convert::{f64_to_i64, u64_to_i64};
use crate::extender::Extender;
use crate::extender::wire::{ExtenderArgs, ExtenderBindingArgs, MAX_EXTENDER_PRIORITY};
use crate::inventory::{GpuDevice, NodeGpuReportStatus, NvmlStatus};
use crate::metrics::extender::{ExtenderMetrics, ScoreSourceLabels};
use crate::placement::{FitConfig, ScoringPolicy};

/// The chart's `extender.weight`.
pub const EXTENDER_WEIGHT: i64 = 5;
/// The score plugins the chart's peakfit profile turns off (`scheduler.profile`).
pub const DISABLED_SCORE_PLUGINS: [&str; 2] =
    ["NodeResourcesFit", "NodeResourcesBalancedAllocation"];
/// kube-scheduler's `MaxNodeScore`.
const MAX_NODE_SCORE: i64 = 100;
/// The CPU and memory kube-scheduler's scoring assumes for a container that requests none
/// (`NonZeroRequested`: 100m, 200 MB).
const DEFAULT_CPU_MILLI: i64 = 100;
const DEFAULT_MEMORY_MIB: i64 = 200 * 1000 * 1000 / (1 << 20);

/// What the replay saw of the extender: how prioritize's node scores were answered, and
/// per-call latency of filter and prioritize.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderStats {
    pub scores_from_memo: u64,
    pub scores_computed: u64,
    pub filter_p99_ms: f64,
    pub prioritize_p99_ms: f64,
    pub filter_p50_ms: f64,
    pub prioritize_p50_ms: f64,
}

/// The extender and its cluster for one run.
pub struct ExtenderPath {
    ext: Extender,
    metrics: Arc<ExtenderMetrics>,
    names: Vec<String>,
    rng: ChaCha8Rng,
    /// kube-scheduler's resource score plugins on in peakfit's profile (the chart turns them
    /// off).
    pub default_plugins: bool,
    /// GPU-less pods go through peakfit's profile (the extender scores them by the GPUs their
    /// CPU strands), as in the trace, where one scheduler places every pod.
    /// `--gpuless-pods default-scheduler`
    /// leaves them to the default scheduler's profile instead (`LeastAllocated` +
    /// `BalancedAllocation`), as in a cluster where only annotated pods name peakfit's scheduler.
    pub gpuless_via_peakfit: bool,
    filter_ns: Vec<u64>,
    prioritize_ns: Vec<u64>,
    allocatable: Vec<(i64, i64)>,
}

const OBSERVED_AT: &str = "2026-01-01T00:00:00Z";

fn fixed_clock() -> i64 {
    1_767_225_600
}

impl ExtenderPath {
    /// `gpu_bytes(model)`: each GPU's memory, as its agent would report it.
    pub fn new(nodes: &[NodeSpec], gpu_bytes: impl Fn(&str) -> u64, seed: u64) -> Self {
        let metrics = Arc::new(ExtenderMetrics::new());
        let index = Arc::new(Index::new());
        for spec in nodes {
            index.apply_node(&node_object(spec));
            index.apply_report(&report_object(spec, gpu_bytes(&spec.model)));
        }
        let ext = Extender::new(index, metrics.clone(), Arc::new(MemoryBinder::default()))
            // No safety margin: openb shares that add up to exactly one GPU must fit, as in
            // the paper. Reports never age in a replay.
            .with_fit(FitConfig::simulation())
            .with_scoring(ScoringPolicy::Peakfit)
            .with_clock(fixed_clock);
        Self {
            ext,
            metrics,
            names: nodes.iter().map(|n| n.name.clone()).collect(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x005e_1ec7_4057),
            // The chart's profile until `Replay::deployed` says otherwise.
            default_plugins: false,
            gpuless_via_peakfit: true,
            filter_ns: Vec::new(),
            prioritize_ns: Vec::new(),
            allocatable: nodes
                .iter()
                .map(|n| (u64_to_i64(n.cpu_milli), u64_to_i64(n.memory_mib)))
                .collect(),
        }
    }

    /// Schedules pod number `k` (`spec`) among `feasible`, the nodes kube-scheduler's own
    /// filters passed, in its list order, with `left[n]` each node's free (CPU milli, memory
    /// `MiB`). Returns the node and the GPU indices bind chose, or `None` when no node took it.
    pub fn schedule(
        &mut self,
        k: usize,
        spec: &PodSpec,
        feasible: &[usize],
        left: impl Fn(usize) -> (i64, i64),
    ) -> Option<(usize, Vec<usize>)> {
        if feasible.is_empty() {
            return None;
        }
        let mut pod = pod_object(k, spec);
        if spec.num_gpu == 0 && !self.gpuless_via_peakfit {
            // No peakfit annotation: the webhook leaves the pod to the default scheduler, and the
            // extender learns of it from the watch once it is bound.
            let n = self.pick(spec, feasible, &BTreeMap::new(), true, &left)?;
            if let Some(s) = pod.spec.as_mut() {
                s.node_name = Some(self.names[n].clone());
            }
            self.ext.index.apply_pod(&pod);
            return Some((n, Vec::new()));
        }
        self.ext.index.apply_pod(&pod);
        let names: Vec<String> = feasible.iter().map(|&n| self.names[n].clone()).collect();
        let t = Instant::now();
        let filtered = self.ext.filter(ExtenderArgs {
            pod: Some(pod.clone()),
            nodes: None,
            node_names: Some(names),
        });
        self.filter_ns
            .push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let passed: Vec<String> = filtered.node_names.unwrap_or_default();
        if passed.is_empty() {
            self.ext.index.delete_pod(&pod);
            return None;
        }
        let t = Instant::now();
        let scores = self.ext.prioritize(ExtenderArgs {
            pod: Some(pod.clone()),
            nodes: None,
            node_names: Some(passed.clone()),
        });
        self.prioritize_ns
            .push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let ext_score: BTreeMap<&str, i64> =
            scores.iter().map(|h| (h.host.as_str(), h.score)).collect();
        // The filter keeps the request's order: `passed` is `feasible` minus refusals.
        let mut it = passed.iter().peekable();
        let passed_idx: Vec<usize> = feasible
            .iter()
            .copied()
            .filter(|&n| {
                let keep = it.peek().map(|s| s.as_str()) == Some(self.names[n].as_str());
                if keep {
                    it.next();
                }
                keep
            })
            .collect();
        let n = self.pick(spec, &passed_idx, &ext_score, self.default_plugins, &left)?;
        let bound = futures::executor::block_on(self.ext.bind(ExtenderBindingArgs {
            pod_name: pod.metadata.name.clone().unwrap_or_default(),
            pod_namespace: "openb".into(),
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            node: self.names[n].clone(),
        }));
        if !bound.error.is_empty() {
            tracing::warn!(error = %bound.error, "bind refused in the replay");
            self.ext.index.delete_pod(&pod);
            return None;
        }
        let entry = self.ext.index.find_pod(
            pod.metadata.uid.as_deref().unwrap_or_default(),
            "openb",
            "",
        )?;
        let gpus = entry
            .assignment
            .map(|a| {
                a.gpu_uuids
                    .iter()
                    .filter_map(|u| u.rsplit_once("-gpu").and_then(|(_, i)| i.parse().ok()))
                    .collect()
            })
            .unwrap_or_default();
        Some((n, gpus))
    }

    /// kube-scheduler's choice among `nodes` (in its list order): the highest total of the
    /// extender's score × weight × 10 and, with `resource_plugins`, `LeastAllocated` +
    /// `BalancedAllocation`; ties by `selectHost`'s reservoir sampling.
    fn pick(
        &mut self,
        spec: &PodSpec,
        nodes: &[usize],
        ext_score: &BTreeMap<&str, i64>,
        resource_plugins: bool,
        left: impl Fn(usize) -> (i64, i64),
    ) -> Option<usize> {
        let nonzero = |v: u64, default: i64| if v == 0 { default } else { u64_to_i64(v) };
        let pod_cpu = nonzero(spec.cpu_milli, DEFAULT_CPU_MILLI);
        let pod_mem = nonzero(spec.memory_mib, DEFAULT_MEMORY_MIB);
        let mut best: Option<(i64, usize)> = None;
        let mut ties = 0u32;
        for &n in nodes {
            let ext = ext_score.get(self.names[n].as_str()).copied().unwrap_or(0);
            let mut total = ext.clamp(0, MAX_EXTENDER_PRIORITY)
                * EXTENDER_WEIGHT
                * (MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY);
            if resource_plugins {
                let (cpu_left, mem_left) = left(n);
                let (cpu_alloc, mem_alloc) = self.allocatable[n];
                total += resource_scores(
                    (cpu_alloc - cpu_left + pod_cpu, cpu_alloc),
                    (mem_alloc - mem_left + pod_mem, mem_alloc),
                );
            }
            match best {
                Some((b, _)) if total < b => {}
                Some((b, _)) if total == b => {
                    ties += 1;
                    if self.rng.random_range(0..ties) == 0 {
                        best = Some((total, n));
                    }
                }
                _ => {
                    best = Some((total, n));
                    ties = 1;
                }
            }
        }
        best.map(|(_, n)| n)
    }

    /// Node `n`'s ledger as the extender's index holds it.
    pub fn ledger(&self, n: usize) -> crate::placement::NodeLedger {
        self.ext.index.node(&self.names[n]).map_or_else(
            || crate::placement::NodeLedger::new(&self.names[n]),
            |s| s.read().ledger.clone(),
        )
    }

    pub fn stats(&self) -> ExtenderStats {
        let count = |source| {
            self.metrics
                .node_scores
                .get_or_create(&ScoreSourceLabels { source })
                .get()
        };
        ExtenderStats {
            scores_from_memo: count("memo"),
            scores_computed: count("computed"),
            filter_p99_ms: percentile(&self.filter_ns, 0.99),
            prioritize_p99_ms: percentile(&self.prioritize_ns, 0.99),
            filter_p50_ms: percentile(&self.filter_ns, 0.5),
            prioritize_p50_ms: percentile(&self.prioritize_ns, 0.5),
        }
    }
}

/// `NodeResourcesFit` (`LeastAllocated`) + `NodeResourcesBalancedAllocation` over (requested with
/// the pod, allocatable) of CPU and memory, each 0..=100 with weight 1, integer as
/// kube-scheduler computes them.
fn resource_scores(cpu: (i64, i64), mem: (i64, i64)) -> i64 {
    let least = |(req, alloc): (i64, i64)| {
        if alloc <= 0 || req > alloc {
            0
        } else {
            (alloc - req) * MAX_NODE_SCORE / alloc
        }
    };
    let fit = i64::midpoint(least(cpu), least(mem));
    let frac = |(req, alloc): (i64, i64)| {
        if alloc <= 0 {
            0.0
        } else {
            (req as f64 / alloc as f64).min(1.0)
        }
    };
    let std = (frac(cpu) - frac(mem)).abs() / 2.0;
    let balanced = f64_to_i64((1.0 - std) * MAX_NODE_SCORE as f64);
    fit + balanced
}

fn percentile(ns: &[u64], q: f64) -> f64 {
    super::nearest_rank(&mut ns.to_vec(), q) / 1e6
}

/// A Node's allocatable or a container's requests, as the trace gives both: CPU and memory.
fn cpu_and_memory(cpu_milli: u64, memory_mib: u64) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".into(), Quantity(format!("{cpu_milli}m"))),
        ("memory".into(), Quantity(format!("{memory_mib}Mi"))),
    ])
}

fn node_object(spec: &NodeSpec) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(BTreeMap::from([(
                GPU_PRODUCT_LABEL.to_owned(),
                spec.model.clone(),
            )])),
            ..Default::default()
        },
        status: Some(NodeStatus {
            allocatable: Some(cpu_and_memory(spec.cpu_milli, spec.memory_mib)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn report_object(spec: &NodeSpec, total: u64) -> NodeGpuReport {
    let mut r = NodeGpuReport::new(
        &spec.name,
        NodeGpuReportSpec {
            node_name: spec.name.clone(),
        },
    );
    r.status = Some(NodeGpuReportStatus {
        observed_at: OBSERVED_AT.into(),
        nvml: NvmlStatus {
            up: true,
            ..Default::default()
        },
        gpus: (0..spec.gpus)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("{}-gpu{i}", spec.name),
                name: spec.model.clone(),
                memory_total_bytes: total,
                memory_free_bytes: total,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    r
}

/// An openb pod as its owner would submit it: CPU and memory requests, the GPU models of its
/// `gpu_spec` as a required node affinity on the GPU product label, and its GPUs as peakfit
/// annotations (`gpus`, and `gpu-share` = `gpu_milli` / 1000). A GPU-less pod has no
/// peakfit annotation: the extender's filter passes it through and prioritize scores its CPU.
fn pod_object(k: usize, spec: &PodSpec) -> Pod {
    let mut annotations = BTreeMap::new();
    if spec.num_gpu > 0 {
        annotations.insert("peakfit.io/gpus".to_owned(), spec.num_gpu.to_string());
        annotations.insert(
            "peakfit.io/gpu-share".to_owned(),
            format!("{}", f64::from(spec.gpu_milli) / 1000.0),
        );
    }
    let models: Vec<String> = spec
        .gpu_spec
        .split('|')
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect();
    let affinity = (spec.num_gpu > 0 && !models.is_empty()).then(|| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: GPU_PRODUCT_LABEL.into(),
                        operator: "In".into(),
                        values: Some(models),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{k}")),
            namespace: Some("openb".into()),
            uid: Some(format!("uid-{k}")),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(KPodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(cpu_and_memory(spec.cpu_milli, spec.memory_mib)),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            affinity,
            ..Default::default()
        }),
        ..Default::default()
    }
}
