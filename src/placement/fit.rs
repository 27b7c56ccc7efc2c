//! Where the fit is decided: can this node hold this pod, and on which GPUs.

use serde::{Deserialize, Serialize};

use super::demand::PodShape;
use super::ledger::{NodeCondition, NodeLedger};

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

/// The GPUs chosen for a pod and what it reserves on each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Indices into `NodeLedger::gpus`.
    pub gpu_indices: Vec<usize>,
    pub per_gpu_bytes: Vec<u64>,
}

/// Why a node was refused, in words an ML engineer understands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("no GPU report from the peakfit agent on this node (is the agent running there?)")]
    NoReport,
    #[error(
        "GPU report is {age_secs}s old (limit {limit_secs}s): the peakfit agent on this node is not reporting"
    )]
    StaleReport { age_secs: i64, limit_secs: i64 },
    #[error("NVML is down on this node: {reason}")]
    NvmlDown { reason: String },
    #[error("needs {needed} GPUs, node has {have}")]
    TooFewGpus { needed: u32, have: u32 },
    #[error(
        "needs {} per GPU on {needed_gpus} GPU(s); only {fitting_gpus} GPU(s) have that free, best free GPU has {}",
        gib(*needed_per_gpu_bytes), gib(*best_free_bytes)
    )]
    NotEnoughMemory {
        needed_per_gpu_bytes: u64,
        needed_gpus: u32,
        fitting_gpus: u32,
        best_free_bytes: u64,
    },
}

/// Bytes as GiB with one decimal, the unit ML engineers size models in.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
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
    }
    if let (Some(limit), Some(at)) = (cfg.max_report_age_secs, node.observed_at_unix) {
        let age = now_unix - at;
        if age > limit {
            return Err(Rejection::StaleReport {
                age_secs: age,
                limit_secs: limit,
            });
        }
    }
    Ok(())
}

/// Every GPU of the node that could take one share of the pod, with the bytes it would reserve.
pub fn candidate_gpus(node: &NodeLedger, shape: &PodShape, cfg: &FitConfig) -> Vec<(usize, u64)> {
    node.gpus
        .iter()
        .enumerate()
        .filter_map(|(i, gpu)| {
            let need = shape.demand.bytes_on(gpu.total_bytes);
            (shape.demand.runs_on(gpu.total_bytes)
                && gpu.free_bytes() >= need.saturating_add(cfg.safety_margin_bytes))
            .then_some((i, need))
        })
        .collect()
}

/// Decides whether `shape` fits on `node` and picks the GPUs: among the GPUs that fit, the ones
/// left with the least free memory (best fit), so large holes stay whole for large pods.
pub fn fit(
    node: &NodeLedger,
    shape: &PodShape,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<Placement, Rejection> {
    node_usable(node, cfg, now_unix)?;
    let needed = shape.gpus.max(1);
    if (node.gpus.len() as u32) < needed {
        return Err(Rejection::TooFewGpus {
            needed,
            have: node.gpus.len() as u32,
        });
    }
    let mut candidates = candidate_gpus(node, shape, cfg);
    if (candidates.len() as u32) < needed {
        let best = node.gpus.iter().map(|g| g.free_bytes()).max().unwrap_or(0);
        let largest_total = node.gpus.iter().map(|g| g.total_bytes).max().unwrap_or(0);
        return Err(Rejection::NotEnoughMemory {
            needed_per_gpu_bytes: shape.demand.bytes_on(largest_total) + cfg.safety_margin_bytes,
            needed_gpus: needed,
            fitting_gpus: candidates.len() as u32,
            best_free_bytes: best,
        });
    }
    candidates.sort_by_key(|&(i, need)| (node.gpus[i].free_bytes() - need, i));
    candidates.truncate(needed as usize);
    candidates.sort_by_key(|&(i, _)| i);
    Ok(Placement {
        gpu_indices: candidates.iter().map(|&(i, _)| i).collect(),
        per_gpu_bytes: candidates.iter().map(|&(_, b)| b).collect(),
    })
}
