//! Where the fit is decided: can this node hold this pod, and on which GPUs.

use serde::{Deserialize, Serialize};

use super::demand::{Demand, GpuRoom, PodClass, PodShape};
use super::ledger::{Allocators, GpuLedger, NodeCondition, NodeLedger};

/// Tunables of the fit; the same values serve filter and bind so that what filter admits, bind
/// accepts on an unchanged ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FitConfig {
    /// Kept free on every GPU on top of the pod's peak, for fragmentation inside the allocator
    /// and the estimate's error.
    pub safety_margin_bytes: u64,
    /// Reports older than this make the node unschedulable (seconds); `None` disables the check
    /// (simulation).
    pub max_report_age_secs: Option<i64>,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            safety_margin_bytes: 256 << 20,
            max_report_age_secs: Some(120),
        }
    }
}

impl FitConfig {
    /// No margin, no staleness: the openb simulation, where shares of a GPU must add up to
    /// exactly one GPU as in the paper.
    pub fn simulation() -> Self {
        Self {
            safety_margin_bytes: 0,
            max_report_age_secs: None,
        }
    }
}

/// The GPUs chosen for a pod and what it reserves on each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Indices into `NodeLedger::gpus`, ascending.
    pub gpu_indices: Vec<usize>,
    pub per_gpu_bytes: Vec<u64>,
}

/// Why a node was refused, in words an ML engineer understands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("no GPU report from the peakfit agent on this node (is the agent running there?)")]
    NoReport,
    #[error("{}", stale(*age_secs, *limit_secs))]
    StaleReport {
        /// `None` when the report's time could not be read.
        age_secs: Option<i64>,
        limit_secs: i64,
    },
    #[error(
        "NVML is down on this node ({reason}): its GPUs cannot be seen, so nothing is placed there"
    )]
    NvmlDown { reason: String },
    #[error(
        "the agent cannot read the kubelet's PodResources API ({reason}) and {by}: a GPU {} hands out would look free, so nothing is placed here",
        if by.device_plugin.is_some() && by.dra_driver.is_some() { "either" } else { "it" }
    )]
    PodResourcesDown { reason: String, by: Allocators },
    #[error("{}", too_few(*needed, *have, models))]
    TooFewGpus {
        needed: u32,
        /// GPUs of an accepted model (all GPUs when the pod accepts any).
        have: u32,
        /// The models the pod accepts; empty = any.
        models: Vec<String>,
    },
    #[error(
        "{}",
        too_small(
            *min_gpu_total_bytes, *largest_gpu_total_bytes, *fills_gpu,
            *largest_gpu_usable_bytes, *margin_bytes
        )
    )]
    GpuTooSmall {
        min_gpu_total_bytes: u64,
        largest_gpu_total_bytes: u64,
        /// The floor is a PyTorch pod's tensors and process ([`Demand::fills_gpu`]), not an
        /// engine's budget: it is memory, checked against what the driver leaves of a GPU
        /// with the safety margin (`Demand::runs_in`), and the words say so.
        fills_gpu: bool,
        /// The largest GPU's size less the driver's reserve.
        #[serde(default)]
        largest_gpu_usable_bytes: u64,
        #[serde(default)]
        margin_bytes: u64,
    },
    #[error(
        "needs {} free per GPU on {needed_gpus} GPU(s) (peak {} + {} safety margin); {}; best free GPU has {} free of {}",
        gib(needed_per_gpu_bytes.saturating_add(*margin_bytes)), gib(*needed_per_gpu_bytes), gib(*margin_bytes),
        fitting(*fitting_gpus, *gpus), gib(*best_free_bytes), gib(*best_gpu_total_bytes)
    )]
    NotEnoughMemory {
        /// The pod's peak per GPU, on the GPU with the most free memory (demand can depend on
        /// the GPU's size).
        needed_per_gpu_bytes: u64,
        margin_bytes: u64,
        needed_gpus: u32,
        fitting_gpus: u32,
        gpus: u32,
        best_free_bytes: u64,
        best_gpu_total_bytes: u64,
    },
    #[error(
        "needs {:.1} CPU cores, node has {:.1} free",
        *needed_milli as f64 / 1000.0,
        *free_milli as f64 / 1000.0
    )]
    NotEnoughCpu { needed_milli: u64, free_milli: u64 },
}

impl Rejection {
    /// A stable label for metrics (`peakfit_extender_rejections_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::NoReport => "no_report",
            Rejection::StaleReport {
                age_secs: Some(age),
                ..
            } if *age < 0 => "report_from_future",
            Rejection::StaleReport { .. } => "stale_report",
            Rejection::NvmlDown { .. } => "nvml_down",
            Rejection::PodResourcesDown { .. } => "pod_resources_down",
            Rejection::TooFewGpus { .. } => "too_few_gpus",
            Rejection::GpuTooSmall { .. } | Rejection::NotEnoughMemory { .. } => {
                "not_enough_memory"
            }
            Rejection::NotEnoughCpu { .. } => "not_enough_cpu",
        }
    }

    /// The words without the figures that differ from node to node (the best free GPU's
    /// memory, the free CPU), for a refusal among many: kube-scheduler's `FitError` message
    /// (the pod's `PodScheduled` condition and its `FailedScheduling` event) lists each
    /// distinct reason once with the count of nodes that gave it, so per-node figures make one
    /// entry per node (~420 on a 1,000-node cluster, tens of KiB written to the pod's status on
    /// every retry) where these make one per cause and a few per node shape (how many of its
    /// GPUs have the room still varies, within a node's GPU count). A stale report leaves out
    /// its age. Other refusals are their own words: they differ only by node shape.
    pub fn grouped_words(&self) -> String {
        match self {
            Rejection::NotEnoughMemory {
                needed_per_gpu_bytes,
                margin_bytes,
                needed_gpus,
                fitting_gpus,
                gpus,
                ..
            } => format!(
                "needs {} free per GPU on {needed_gpus} GPU(s) (peak {} + {} safety margin); {}",
                gib(needed_per_gpu_bytes.saturating_add(*margin_bytes)),
                gib(*needed_per_gpu_bytes),
                gib(*margin_bytes),
                fitting(*fitting_gpus, *gpus)
            ),
            Rejection::NotEnoughCpu { needed_milli, .. } => format!(
                "needs {:.1} CPU cores, more than the node has free",
                *needed_milli as f64 / 1000.0
            ),
            // The age differs on every node of a cluster-wide agent outage.
            Rejection::StaleReport {
                age_secs: Some(age),
                ..
            } if *age < 0 => format!(
                "GPU report is dated in the future (more clock skew than {MAX_CLOCK_SKEW_SECS}s allows): treating it as stale until the node's clock and the extender's agree"
            ),
            Rejection::StaleReport {
                age_secs: Some(_),
                limit_secs,
            } => format!(
                "GPU report is older than the {limit_secs}s limit: the peakfit agent on this node has stopped reporting"
            ),
            other => other.to_string(),
        }
    }

    /// Whether the node cannot take any pod now, whatever its size (the report is missing,
    /// stale or blind): worth telling apart from "this pod is too big here".
    pub fn is_node_wide(&self) -> bool {
        matches!(
            self,
            Rejection::NoReport
                | Rejection::StaleReport { .. }
                | Rejection::NvmlDown { .. }
                | Rejection::PodResourcesDown { .. }
        )
    }
}

/// How far in the future a report's `observedAt` may be (the agent's and the extender's clocks
/// disagree) before the report is treated as stale; with no bound a clock set ahead on one node
/// would keep its last report fresh forever.
pub const MAX_CLOCK_SKEW_SECS: i64 = 60;

fn stale(age: Option<i64>, limit: i64) -> String {
    match age {
        Some(age) if age < 0 => format!(
            "GPU report is dated {}s in the future (more clock skew than {MAX_CLOCK_SKEW_SECS}s allows): treating it as stale until the node's clock and the extender's agree",
            age.unsigned_abs()
        ),
        Some(age) => format!(
            "GPU report is {age}s old (limit {limit}s): the peakfit agent on this node has stopped reporting"
        ),
        None => format!(
            "GPU report has no readable time (limit {limit}s): treating it as stale until the peakfit agent reports again"
        ),
    }
}

fn too_few(needed: u32, have: u32, models: &[String]) -> String {
    if models.is_empty() {
        format!("needs {needed} GPU(s), node has {have}")
    } else {
        format!(
            "needs {needed} GPU(s) of model {}, node has {have}",
            models.join(" or ")
        )
    }
}

fn too_small(
    floor: u64,
    largest_total: u64,
    fills_gpu: bool,
    largest_usable: u64,
    margin: u64,
) -> String {
    if fills_gpu {
        format!(
            "needs a GPU with {} usable: its tensors and process, with the allocator's cache freed, take {} (+ {} safety margin) and do not fit a smaller one; largest GPU here has {} usable of {}",
            gib(floor.saturating_add(margin)),
            gib(floor),
            gib(margin),
            gib(largest_usable),
            gib(largest_total)
        )
    } else {
        format!(
            "needs a GPU of at least {}: the engine's share of a smaller one cannot hold its weights, activations and the KV cache of the declared batch x context-tokens; largest GPU here has {}",
            gib(floor),
            gib(largest_total)
        )
    }
}

fn fitting(fitting: u32, gpus: u32) -> String {
    match fitting {
        0 => format!("none of its {gpus} GPU(s) has that free"),
        n => format!("only {n} of its {gpus} GPU(s) have that free"),
    }
}

/// Bytes as GiB with one decimal, the unit ML engineers size models in (MiB below 1 GiB, where
/// one decimal of a GiB says too little).
pub fn gib(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

/// Checks the node as a whole (report present, fresh, NVML up).
pub fn node_usable(node: &NodeLedger, cfg: &FitConfig, now_unix: i64) -> Result<(), Rejection> {
    match &node.condition {
        NodeCondition::Ready => {}
        NodeCondition::NoReport => return Err(Rejection::NoReport),
        NodeCondition::NvmlDown { reason } => {
            return Err(Rejection::NvmlDown {
                reason: reason.clone(),
            });
        }
        NodeCondition::PodResourcesDown { reason, by } => {
            return Err(Rejection::PodResourcesDown {
                reason: reason.clone(),
                by: by.clone(),
            });
        }
    }
    if let Some(limit) = cfg.max_report_age_secs {
        match node.observed_at_unix.map(|at| now_unix.saturating_sub(at)) {
            // A report from the future would otherwise stay fresh forever.
            Some(age) if age > limit || age < -MAX_CLOCK_SKEW_SECS => {
                return Err(Rejection::StaleReport {
                    age_secs: Some(age),
                    limit_secs: limit,
                });
            }
            Some(_) => {}
            None => {
                return Err(Rejection::StaleReport {
                    age_secs: None,
                    limit_secs: limit,
                });
            }
        }
    }
    Ok(())
}

/// (bytes one share of `demand` reserves on `gpu`, free bytes it needs there): its share plus
/// the margin, or for a whole GPU ([`Demand::is_whole_gpu`]) what an empty GPU offers, no
/// margin, so that a whole-GPU pod fits exactly an empty GPU (before, `gpu-share: 1` asked the
/// GPU's size plus the margin and fitted nowhere with a margin or a driver reserve). A pod
/// whose cached peak with the margin outgrows this GPU but whose tensors fit it
/// ([`Demand::fills_gpu`], [`Demand::whole_on`]) takes it whole the same way: it cannot share
/// the GPU, and its allocator would fill it.
pub fn need_on(demand: &Demand, gpu: &GpuLedger, margin_bytes: u64) -> (u64, u64) {
    let room = gpu.room(margin_bytes);
    if demand.whole_on(room) {
        return (room.usable_bytes, room.usable_bytes);
    }
    let share = demand.bytes_on(gpu.total_bytes);
    (share, share.saturating_add(margin_bytes))
}

/// The bytes one share of `class` takes on `gpu`, if the GPU can take it now (accepted model,
/// big enough, free memory for the share plus the margin).
pub fn share_on(gpu: &GpuLedger, class: &PodClass, cfg: &FitConfig) -> Option<u64> {
    let demand = &class.shape.demand;
    if !demand.runs_in(gpu.room(cfg.safety_margin_bytes)) || !class.accepts_model(&gpu.model) {
        return None;
    }
    let (share, need) = need_on(demand, gpu, cfg.safety_margin_bytes);
    (gpu.free_bytes() >= need).then_some(share)
}

/// (GPU index, bytes) pairs: candidate GPUs, or the GPUs chosen. Inline up to a whole node of
/// eight, because prioritize builds several per node for thousands of nodes per request and
/// the allocator was half of its time.
pub type GpuShares = smallvec::SmallVec<[(usize, u64); 8]>;

/// Every GPU of the node that could take one share of the pod, with the bytes it would reserve.
pub fn candidate_gpus(node: &NodeLedger, class: &PodClass, cfg: &FitConfig) -> GpuShares {
    node.gpus
        .iter()
        .enumerate()
        .filter_map(|(i, gpu)| share_on(gpu, class, cfg).map(|need| (i, need)))
        .collect()
}

/// Checks everything but the choice of GPUs, and returns the candidate GPUs (at least
/// `class.shape.gpus` of them). Shared by `fit` and the scoring policies' `place`.
pub(crate) fn admissible(
    node: &NodeLedger,
    class: &PodClass,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<GpuShares, Rejection> {
    check_class(node, class, cfg, now_unix)?;
    if class.shape.gpus == 0 {
        return Ok(GpuShares::new());
    }
    Ok(candidate_gpus(node, class, cfg))
}

/// `fit`'s verdict without choosing GPUs. Filter only needs yes or why not for thousands of
/// nodes per request; this skips the candidate list and the placement (allocations and a sort
/// per node) and answers exactly as `fit` does.
pub fn check(
    node: &NodeLedger,
    shape: &PodShape,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<(), Rejection> {
    check_class(node, &PodClass::from(*shape), cfg, now_unix)
}

/// `check` for a pod with CPU or GPU-model constraints (`fit_class`'s verdict).
pub fn check_class(
    node: &NodeLedger,
    class: &PodClass,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<(), Rejection> {
    node_usable(node, cfg, now_unix)?;
    if let Some(free) = node.cpu_free_milli()
        && free < class.cpu_milli
    {
        return Err(Rejection::NotEnoughCpu {
            needed_milli: class.cpu_milli,
            free_milli: free,
        });
    }
    let needed = class.shape.gpus;
    if needed == 0 {
        return Ok(());
    }
    let eligible = node
        .gpus
        .iter()
        .filter(|g| class.accepts_model(&g.model))
        .count();
    let eligible = crate::convert::usize_to_u32(eligible);
    if eligible < needed {
        return Err(Rejection::TooFewGpus {
            needed,
            have: eligible,
            models: class.gpu_models.clone(),
        });
    }
    let demand = &class.shape.demand;
    let margin = cfg.safety_margin_bytes;
    let accepted = || node.gpus.iter().filter(|g| class.accepts_model(&g.model));
    if !accepted().any(|g| demand.runs_in(g.room(margin))) {
        // The largest by what the floor is checked against: usable memory for a PyTorch
        // floor, the size for an engine's.
        let floor_is_memory = demand.cache_floor().is_some();
        let largest = accepted()
            .map(|g| g.room(margin))
            .max_by_key(|r| {
                if floor_is_memory {
                    (r.usable_bytes, r.total_bytes)
                } else {
                    (r.total_bytes, r.usable_bytes)
                }
            })
            .unwrap_or(GpuRoom::bare(0));
        return Err(Rejection::GpuTooSmall {
            min_gpu_total_bytes: demand.min_gpu_total_bytes,
            largest_gpu_total_bytes: largest.total_bytes,
            fills_gpu: floor_is_memory,
            largest_gpu_usable_bytes: largest.usable_bytes,
            margin_bytes: margin,
        });
    }
    let fitting = node
        .gpus
        .iter()
        .filter(|g| share_on(g, class, cfg).is_some())
        .count();
    let fitting = crate::convert::usize_to_u32(fitting);
    if fitting < needed {
        let usable: Vec<&GpuLedger> = node
            .gpus
            .iter()
            .filter(|g| class.accepts_model(&g.model) && demand.runs_in(g.room(margin)))
            .collect();
        let best = usable
            .iter()
            .max_by_key(|g| g.free_bytes())
            .expect("a GPU big enough exists: checked above");
        let (share, need) = need_on(demand, best, margin);
        return Err(Rejection::NotEnoughMemory {
            needed_per_gpu_bytes: share,
            margin_bytes: need - share,
            needed_gpus: needed,
            fitting_gpus: fitting,
            gpus: crate::convert::usize_to_u32(usable.len()),
            best_free_bytes: best.free_bytes(),
            best_gpu_total_bytes: best.total_bytes,
        });
    }
    Ok(())
}

/// Decides whether `shape` fits on `node` and picks the GPUs: among the GPUs that fit, the ones
/// left with the least free memory (best fit), so large holes stay whole for large pods.
pub fn fit(
    node: &NodeLedger,
    shape: &PodShape,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<Placement, Rejection> {
    fit_class(node, &PodClass::from(*shape), cfg, now_unix)
}

/// `fit` for a pod with CPU or GPU-model constraints.
pub fn fit_class(
    node: &NodeLedger,
    class: &PodClass,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<Placement, Rejection> {
    let mut candidates = admissible(node, class, cfg, now_unix)?;
    candidates.sort_by_key(|&(i, need)| (node.gpus[i].free_bytes() - need, i));
    candidates.truncate(class.shape.gpus as usize);
    Ok(Placement::from_pairs(candidates.into_vec()))
}

impl Placement {
    /// From (GPU index, bytes) pairs in any order.
    pub fn from_pairs(mut pairs: Vec<(usize, u64)>) -> Self {
        pairs.sort_unstable_by_key(|&(i, _)| i);
        Self {
            gpu_indices: pairs.iter().map(|&(i, _)| i).collect(),
            per_gpu_bytes: pairs.iter().map(|&(_, b)| b).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Demand;

    const GI: u64 = 1 << 30;
    const NOW: i64 = 1_000_000;

    fn node(totals: &[u64]) -> NodeLedger {
        let mut n = NodeLedger::with_gpus(
            "n",
            totals
                .iter()
                .enumerate()
                .map(|(i, &t)| GpuLedger::new(format!("GPU-{i}"), t).with_model("H100"))
                .collect(),
        );
        n.observed_at_unix = Some(NOW - 10);
        n
    }

    fn shape(gpus: u32, bytes: u64) -> PodShape {
        PodShape {
            gpus,
            demand: Demand::fixed(bytes),
        }
    }

    /// A PyTorch pod whose cache fills its GPU, with a cached peak of `fixed` bytes on 19 GiB
    /// of tensors and process.
    fn fills(fixed: u64) -> PodShape {
        PodShape {
            gpus: 1,
            demand: Demand {
                min_gpu_total_bytes: 19 * GI,
                fills_gpu: true,
                ..Demand::fixed(fixed)
            },
        }
    }

    fn reject(n: &NodeLedger, s: PodShape) -> Rejection {
        fit(n, &s, &FitConfig::default(), NOW).unwrap_err()
    }

    #[test]
    fn best_fit_picks_the_fullest_gpus_that_fit() {
        let mut n = node(&[80 * GI, 80 * GI, 80 * GI]);
        n.reserve("a", &[1], &[50 * GI]);
        let p = fit(&n, &shape(1, 20 * GI), &FitConfig::default(), NOW).unwrap();
        assert_eq!(p.gpu_indices, [1]);
        let p = fit(&n, &shape(2, 40 * GI), &FitConfig::default(), NOW).unwrap();
        assert_eq!(p.gpu_indices, [0, 2]);
        assert_eq!(p.per_gpu_bytes, [40 * GI, 40 * GI]);
    }

    #[test]
    fn a_gpuless_pod_fits_any_usable_node_on_no_gpu() {
        let n = node(&[]);
        let p = fit(&n, &shape(0, 0), &FitConfig::default(), NOW).unwrap();
        assert!(p.gpu_indices.is_empty());
    }

    #[test]
    fn no_report_says_so() {
        let mut n = node(&[80 * GI]);
        n.condition = NodeCondition::NoReport;
        let r = reject(&n, shape(1, GI));
        assert_eq!(r.reason(), "no_report");
        assert!(r.is_node_wide());
        assert_eq!(
            r.to_string(),
            "no GPU report from the peakfit agent on this node (is the agent running there?)"
        );
    }

    #[test]
    fn stale_report_says_how_old() {
        let mut n = node(&[80 * GI]);
        n.observed_at_unix = Some(NOW - 300);
        let r = reject(&n, shape(1, GI));
        assert_eq!(r.reason(), "stale_report");
        assert_eq!(
            r.to_string(),
            "GPU report is 300s old (limit 120s): the peakfit agent on this node has stopped reporting"
        );
        n.observed_at_unix = None;
        let r = reject(&n, shape(1, GI));
        assert_eq!(r.reason(), "stale_report");
        assert_eq!(
            r.to_string(),
            "GPU report has no readable time (limit 120s): treating it as stale until the peakfit agent reports again"
        );
        // A report dated in the future (clock skew) within the bound is fresh, beyond it stale,
        // with its own reason.
        n.observed_at_unix = Some(NOW + MAX_CLOCK_SKEW_SECS);
        assert!(fit(&n, &shape(1, GI), &FitConfig::default(), NOW).is_ok());
        n.observed_at_unix = Some(NOW + 3600);
        let r = reject(&n, shape(1, GI));
        assert_eq!(r.reason(), "report_from_future");
        assert!(r.is_node_wide());
        assert!(r.to_string().contains("3600s in the future"), "{r}");
        // Without a limit (simulation) age does not matter.
        let cfg = FitConfig::simulation();
        assert!(fit(&n, &shape(1, GI), &cfg, NOW).is_ok());
    }

    #[test]
    fn nvml_down_names_the_driver_error() {
        let mut n = node(&[80 * GI]);
        n.condition = NodeCondition::NvmlDown {
            reason: "NVML_ERROR_DRIVER_NOT_LOADED".into(),
        };
        let r = reject(&n, shape(1, GI));
        assert_eq!(r.reason(), "nvml_down");
        assert_eq!(
            r.to_string(),
            "NVML is down on this node (NVML_ERROR_DRIVER_NOT_LOADED): its GPUs cannot be seen, so nothing is placed there"
        );
    }

    /// Issue 23: a mixed node whose kubelet allocations cannot be read is refused whole, in
    /// words naming the read's error and what hands GPUs out there: the advertised resource,
    /// the DRA driver publishing devices, or both.
    #[test]
    fn pod_resources_down_names_the_error_and_the_resource() {
        let n = node(&[80 * GI]);
        let down = |device_plugin: Option<&str>, dra_driver: Option<&str>| {
            let mut n = n.clone();
            n.condition = NodeCondition::PodResourcesDown {
                reason: "connection refused".into(),
                by: Allocators {
                    device_plugin: device_plugin.map(str::to_owned),
                    dra_driver: dra_driver.map(str::to_owned),
                },
            };
            reject(&n, shape(1, GI))
        };
        let r = down(Some("nvidia.com/gpu"), None);
        assert_eq!(r.reason(), "pod_resources_down");
        assert!(r.is_node_wide());
        assert_eq!(
            r.to_string(),
            "the agent cannot read the kubelet's PodResources API (connection refused) and the node's device plugin advertises nvidia.com/gpu: a GPU it hands out would look free, so nothing is placed here"
        );
        // A DRA driver's devices are not in allocatable: its `ResourceSlice` is what is named.
        assert_eq!(
            down(None, Some("gpu.nvidia.com")).to_string(),
            "the agent cannot read the kubelet's PodResources API (connection refused) and DRA driver gpu.nvidia.com publishes GPUs on this node: a GPU it hands out would look free, so nothing is placed here"
        );
        assert_eq!(
            down(Some("nvidia.com/gpu"), Some("gpu.nvidia.com")).to_string(),
            "the agent cannot read the kubelet's PodResources API (connection refused) and the node's device plugin advertises nvidia.com/gpu and DRA driver gpu.nvidia.com publishes GPUs on this node: a GPU either hands out would look free, so nothing is placed here"
        );
    }

    #[test]
    fn too_few_gpus_counts_them() {
        let n = node(&[80 * GI, 80 * GI]);
        let r = reject(&n, shape(4, GI));
        assert_eq!(r.reason(), "too_few_gpus");
        assert_eq!(r.to_string(), "needs 4 GPU(s), node has 2");
        let class = PodClass {
            shape: shape(1, GI),
            gpu_models: vec!["A100".into(), "L4".into()],
            ..Default::default()
        };
        let r = fit_class(&n, &class, &FitConfig::default(), NOW).unwrap_err();
        assert_eq!(r.reason(), "too_few_gpus");
        assert_eq!(
            r.to_string(),
            "needs 1 GPU(s) of model A100 or L4, node has 0"
        );
    }

    #[test]
    fn not_enough_memory_names_need_and_best_gpu() {
        let mut n = node(&[80 * GI, 80 * GI]);
        n.reserve("a", &[0], &[70 * GI]);
        n.reserve("b", &[1], &[60 * GI]);
        let r = reject(&n, shape(1, 30 * GI));
        assert_eq!(r.reason(), "not_enough_memory");
        assert_eq!(
            r.to_string(),
            "needs 30.2 GiB free per GPU on 1 GPU(s) (peak 30.0 GiB + 256 MiB safety margin); \
             none of its 2 GPU(s) has that free; best free GPU has 20.0 GiB free of 80.0 GiB"
        );
        let r = reject(&n, shape(2, 15 * GI));
        assert_eq!(
            r.to_string(),
            "needs 15.2 GiB free per GPU on 2 GPU(s) (peak 15.0 GiB + 256 MiB safety margin); \
             only 1 of its 2 GPU(s) have that free; best free GPU has 20.0 GiB free of 80.0 GiB"
        );
    }

    /// Among many nodes, two that refuse a pod for the same cause and have the same shape give
    /// the same words, whatever each has free, so kube-scheduler's message counts them as one
    /// reason; what differs by shape (how many of its GPUs fit) stays.
    #[test]
    fn grouped_words_drop_only_the_per_node_figures() {
        let mut a = node(&[80 * GI, 80 * GI]);
        a.reserve("a", &[0], &[70 * GI]);
        a.reserve("b", &[1], &[60 * GI]);
        let mut b = node(&[80 * GI, 80 * GI]);
        b.reserve("c", &[0], &[55 * GI]);
        b.reserve("d", &[1], &[75 * GI]);
        let (ra, rb) = (reject(&a, shape(1, 30 * GI)), reject(&b, shape(1, 30 * GI)));
        assert_ne!(ra.to_string(), rb.to_string());
        assert_eq!(ra.grouped_words(), rb.grouped_words());
        assert_eq!(
            ra.grouped_words(),
            "needs 30.2 GiB free per GPU on 1 GPU(s) (peak 30.0 GiB + 256 MiB safety margin); \
             none of its 2 GPU(s) has that free"
        );
        assert_eq!(
            reject(&a, shape(2, 15 * GI)).grouped_words(),
            "needs 15.2 GiB free per GPU on 2 GPU(s) (peak 15.0 GiB + 256 MiB safety margin); \
             only 1 of its 2 GPU(s) have that free"
        );
        let cpu = Rejection::NotEnoughCpu {
            needed_milli: 4_000,
            free_milli: 1_500,
        };
        assert_eq!(
            cpu.grouped_words(),
            "needs 4.0 CPU cores, more than the node has free"
        );
        // Stale reports lose their age, which differs on every node of an agent outage.
        let stale = |age| Rejection::StaleReport {
            age_secs: Some(age),
            limit_secs: 120,
        };
        assert_eq!(stale(301).grouped_words(), stale(457).grouped_words());
        assert_eq!(
            stale(301).grouped_words(),
            "GPU report is older than the 120s limit: the peakfit agent on this node has stopped \
             reporting"
        );
        assert_eq!(stale(-90).grouped_words(), stale(-300).grouped_words());
        // Refusals that differ only by node shape keep every word.
        let few = Rejection::TooFewGpus {
            needed: 4,
            have: 2,
            models: Vec::new(),
        };
        assert_eq!(few.grouped_words(), few.to_string());
    }

    #[test]
    fn a_fraction_demand_is_sized_by_the_gpu_it_lands_on() {
        let mut n = node(&[24 * GI, 80 * GI]);
        n.reserve("a", &[1], &[60 * GI]);
        // vLLM at 0.9: 21.6 GiB on the L4 (free), 72 GiB on the H100 (20 GiB free).
        let s = PodShape {
            gpus: 1,
            demand: Demand::fraction(0.9),
        };
        let p = fit(&n, &s, &FitConfig::default(), NOW).unwrap();
        assert_eq!(p.gpu_indices, [0]);
        // Too small a GPU for the engine's budget.
        let s = PodShape {
            gpus: 1,
            demand: Demand {
                min_gpu_total_bytes: 40 * GI,
                fills_gpu: false,
                ..Demand::fraction(0.9)
            },
        };
        let r = reject(&n, s);
        assert_eq!(r.reason(), "not_enough_memory");
        assert_eq!(
            r.to_string(),
            "needs 72.2 GiB free per GPU on 1 GPU(s) (peak 72.0 GiB + 256 MiB safety margin); \
             none of its 1 GPU(s) has that free; best free GPU has 20.0 GiB free of 80.0 GiB"
        );
        let small = node(&[24 * GI]);
        let r = reject(&small, s);
        assert_eq!(r.reason(), "not_enough_memory");
        assert_eq!(
            r.to_string(),
            "needs a GPU of at least 40.0 GiB: the engine's share of a smaller one cannot hold \
             its weights, activations and the KV cache of the declared batch x context-tokens; \
             largest GPU here has 24.0 GiB"
        );
    }

    /// A whole-GPU pod (`gpu-share: 1`, a converted `nvidia.com/gpu: N`) fits an empty GPU
    /// exactly, driver reserve and margin notwithstanding, and no GPU anything else uses or the
    /// kubelet gave away.
    #[test]
    fn a_whole_gpu_pod_takes_only_empty_gpus_that_nobody_holds() {
        let mut n = node(&[24 * GI, 24 * GI, 24 * GI]);
        for g in &mut n.gpus {
            g.driver_reserved_bytes = 400 << 20;
        }
        let whole = |gpus| PodShape {
            gpus,
            demand: Demand::fraction(1.0),
        };
        let cfg = FitConfig::default();
        assert!(cfg.safety_margin_bytes > 0);
        let p = fit(&n, &whole(3), &cfg, NOW).unwrap();
        assert_eq!(p.per_gpu_bytes, vec![24 * GI - (400 << 20); 3]);
        // One GPU with a little use, one given to a device-plugin pod: one GPU left.
        n.gpus[0].unattributed_bytes = 1 << 20;
        n.gpus[1].set_granted(Some(crate::placement::Grant {
            index: 1,
            holders: vec![crate::inventory::DeviceHolder::default()],
        }));
        assert_eq!(fit(&n, &whole(1), &cfg, NOW).unwrap().gpu_indices, vec![2]);
        let r = fit(&n, &whole(2), &cfg, NOW).unwrap_err();
        assert!(matches!(
            r,
            Rejection::NotEnoughMemory {
                fitting_gpus: 1,
                margin_bytes: 0,
                ..
            }
        ));
        // Placed: the GPU is full.
        let mut placed = n.clone();
        placed.reserve("w", &[2], &[24 * GI - (400 << 20)]);
        assert_eq!(placed.gpus[2].free_bytes(), 0);
        assert!(fit(&placed, &whole(1), &cfg, NOW).is_err());
    }

    /// A pod whose cached peak outgrows the GPUs ([`Demand::fills_gpu`]) takes an empty one
    /// whole, never one beside another pod, and is refused below its floor naming it.
    #[test]
    fn a_pod_whose_cache_outgrows_the_gpu_takes_an_empty_one_whole() {
        let mut n = node(&[80 * GI, 80 * GI]);
        for g in &mut n.gpus {
            g.driver_reserved_bytes = 400 << 20;
        }
        n.reserve("small", &[0], &[2 * GI]);
        let cfg = FitConfig::default();
        let p = fit(&n, &fills(250 * GI), &cfg, NOW).unwrap();
        assert_eq!(p.gpu_indices, [1]);
        assert_eq!(p.per_gpu_bytes, [80 * GI - (400 << 20)]);
        // A peak that fits beside the other pod shares as any pod does.
        let p = fit(&n, &fills(40 * GI), &cfg, NOW).unwrap();
        assert_eq!(p.per_gpu_bytes, [40 * GI]);
        // Both GPUs used: the big one waits.
        n.reserve("other", &[1], &[GI]);
        assert_eq!(
            fit(&n, &fills(250 * GI), &cfg, NOW).unwrap_err().reason(),
            "not_enough_memory"
        );
        let r = reject(&node(&[16 * GI]), fills(250 * GI));
        assert_eq!(
            r.to_string(),
            "needs a GPU with 19.2 GiB usable: its tensors and process, with the allocator's \
             cache freed, take 19.0 GiB (+ 256 MiB safety margin) and do not fit a smaller one; \
             largest GPU here has 16.0 GiB usable of 16.0 GiB"
        );
    }

    /// A peak that fits what the driver leaves of a GPU only without the margin cannot share
    /// it, so the GPU is taken whole, as for any larger peak; under the old rule (whole only
    /// above the usable memory) the node refused it while it took a pod with a larger peak.
    #[test]
    fn a_peak_within_the_margin_of_an_empty_gpu_takes_it_whole() {
        const MI: u64 = 1 << 20;
        let reserve = 400 * MI;
        let usable = 80 * GI - reserve;
        let mut n = node(&[80 * GI]);
        n.gpus[0].driver_reserved_bytes = reserve;
        let cfg = FitConfig::default();
        for fixed in [usable - 128 * MI, usable, usable + 128 * MI, 250 * GI] {
            let p = fit(&n, &fills(fixed), &cfg, NOW).unwrap();
            assert_eq!(p.per_gpu_bytes, [usable], "{fixed}");
            assert!(check(&n, &fills(fixed), &cfg, NOW).is_ok(), "{fixed}");
        }
        // A peak with its margin fits: it shares, at its peak.
        let p = fit(&n, &fills(usable - 256 * MI), &cfg, NOW).unwrap();
        assert_eq!(p.per_gpu_bytes, [usable - 256 * MI]);
        // Taken whole only while nobody else is there.
        n.reserve("small", &[0], &[MI]);
        let r = fit(&n, &fills(usable - 128 * MI), &cfg, NOW).unwrap_err();
        assert!(
            matches!(
                r,
                Rejection::NotEnoughMemory {
                    margin_bytes: 0,
                    ..
                }
            ),
            "{r:?}"
        );
    }

    /// A floor above what the driver leaves with the margin, though below the GPU's size, is
    /// refused naming the floor, not as "not enough memory" for a peak no GPU holds; a GPU
    /// that holds it is taken whole.
    #[test]
    fn a_floor_between_usable_and_total_is_refused_naming_it() {
        let fills = fills(250 * GI);
        let mut n = node(&[19 * GI + GI / 2, 19 * GI + GI / 2]);
        n.gpus[0].driver_reserved_bytes = GI;
        n.gpus[1].driver_reserved_bytes = GI / 2;
        let r = reject(&n, fills);
        assert_eq!(r.reason(), "not_enough_memory");
        assert!(!r.is_node_wide());
        assert_eq!(
            r.to_string(),
            "needs a GPU with 19.2 GiB usable: its tensors and process, with the allocator's \
             cache freed, take 19.0 GiB (+ 256 MiB safety margin) and do not fit a smaller one; \
             largest GPU here has 19.0 GiB usable of 19.5 GiB"
        );
        assert!(matches!(
            r,
            Rejection::GpuTooSmall {
                largest_gpu_usable_bytes,
                ..
            } if largest_gpu_usable_bytes == 19 * GI
        ));
        // A smaller reserve: the floor and its margin fit, and the pod takes the GPU whole.
        n.gpus[1].driver_reserved_bytes = 200 << 20;
        let p = fit(&n, &fills, &FitConfig::default(), NOW).unwrap();
        assert_eq!(p.gpu_indices, [1]);
        assert_eq!(p.per_gpu_bytes, [19 * GI + GI / 2 - (200 << 20)]);
    }

    #[test]
    fn not_enough_cpu_in_cores() {
        let n = node(&[16 * GI]).with_cpu_milli(8000);
        let class = PodClass {
            shape: shape(1, GI),
            cpu_milli: 12_500,
            ..Default::default()
        };
        let r = fit_class(&n, &class, &FitConfig::default(), NOW).unwrap_err();
        assert_eq!(r.reason(), "not_enough_cpu");
        assert_eq!(r.to_string(), "needs 12.5 CPU cores, node has 8.0 free");
    }
}
