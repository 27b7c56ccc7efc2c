//! What the extender remembers per node state: prioritize's score memo and filter's verdict
//! cache. The index only holds them (one per state, see `states`); `extender::filter` and
//! `extender::prioritize` read and write them.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::placement::Rejection;
use crate::placement::memo::ScoreMemo;

/// What the extender remembers of one node state, shared by every node in it: prioritize's
/// recent scores (`placement::memo`), and filter's verdict for the request that last asked.
/// Behind their own locks, so that a request holding a node's read lock can still write them.
#[derive(Debug, Default)]
pub struct StateScores {
    pub memo: Mutex<ScoreMemo>,
    /// (request id, verdict): a filter request works the verdict out for the first node in
    /// this state and the others read it (`extender::filter`). Another request's id means
    /// nothing is known for this one; two concurrent requests overwrite each other's and both
    /// merely work it out again.
    pub verdict: Mutex<(u64, Option<Verdict>)>,
}

/// Why filter refused a node in some state, and in what words.
pub type Verdict = Arc<(Rejection, String)>;
