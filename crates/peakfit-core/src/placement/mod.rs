//! Pure placement: the ledger, the fit and the scoring. The extender and the simulator call the
//! same functions, so what the simulator proves is what the scheduler does. It may not read
//! annotations (it takes the model's `PodRequest`) or do any I/O.

pub mod demand;
pub mod fit;
pub mod frag;
pub mod hold;
pub mod ledger;
pub mod memo;
pub mod patterns;
pub mod score;
pub mod signature;

pub use demand::{Demand, GpuRoom, PodClass, PodShape};
pub use fit::{FitConfig, Placement, Rejection, check, check_class, fit, fit_class, gib};
pub use frag::{
    FragState, FragUnit, ShapeMix, ShapeStats, ShapeStatsConfig, fragmentation_ratio,
    node_fragmentation,
};
pub use hold::{Hold, HoldConfig, Holds, choose_hold};
pub use ledger::{
    Allocators, GpuHold, GpuLedger, Grant, HoldError, NodeCondition, NodeLedger, NodeSummary,
    PodKey, ReportError, Reservation,
};
pub use score::{
    Scored, ScoringPolicy, Tuning, place, place_score, place_tuned, score, scores_0_to_10,
    scores_0_to_10_unique, stable_name_hash, used_share,
};
pub use signature::ScoreInputs;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod score_reference;
#[cfg(test)]
mod test_support;
