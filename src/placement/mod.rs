//! Pure placement: the ledger, the fit and the scoring. The extender and the simulator call the
//! same functions, so what the simulator proves is what the scheduler does.

pub mod demand;
pub mod fit;
pub mod ledger;
pub mod score;

pub use demand::{Demand, PodShape};
pub use fit::{FitConfig, Placement, Rejection, fit};
pub use ledger::{GpuLedger, NodeCondition, NodeLedger, PodKey, Reservation};
pub use score::{ScoringPolicy, score};
