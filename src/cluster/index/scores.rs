//! What the extender remembers per node state: prioritize's score memo and filter's verdict
//! cache. The index only holds them (one per state, see `states`); `extender::filter` and
//! `extender::prioritize` read and write them.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::placement::Rejection;
use crate::placement::memo::ScoreMemo;

/// What the extender remembers of one node state, shared by every node in it: prioritize's
/// recent scores (`placement::memo`), and filter's verdicts for the classes last asked about.
/// Behind their own locks, so that a request holding a node's read lock can still write them.
#[derive(Debug, Default)]
pub struct StateScores {
    pub memo: Mutex<ScoreMemo>,
    /// Filter works a class's verdict out for the first node it meets in this state, and every
    /// other node in the state, in this request and the next ones, reads it (`extender::filter`).
    pub verdict: Mutex<Verdicts>,
}

/// Why filter refused a node in some state, and in what words.
pub type Verdict = Arc<(Rejection, String)>;

/// Filter's verdicts in one state for the last [`Verdicts::KEPT`] classes (by `ClassIds` id),
/// `None` for a class that fits. A verdict depends only on the state and the class (a node's
/// usability moves with the clock and is checked per node, outside), so it holds for as long as
/// the state: a changed ledger is another state, with verdicts of its own. Kept across requests
/// because the words cost more than the decision (floating-point formatting of every refused
/// node's GiB), and replicas ask about the same class pod after pod.
#[derive(Debug, Default)]
pub struct Verdicts {
    entries: Vec<(u64, Option<Verdict>)>,
    /// The entry the next new class replaces once all are taken.
    next: usize,
}

impl Verdicts {
    /// Classes remembered per state: a workload's usual shapes (prescore keeps as many warm).
    pub const KEPT: usize = 8;

    /// The verdict for the class, if this state has one: `Some(&None)` means it fits.
    pub fn get(&self, class_id: u64) -> Option<&Option<Verdict>> {
        self.entries.iter().find(|e| e.0 == class_id).map(|e| &e.1)
    }

    pub fn put(&mut self, class_id: u64, verdict: Option<Verdict>) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == class_id) {
            e.1 = verdict;
        } else if self.entries.len() < Self::KEPT {
            self.entries.push((class_id, verdict));
        } else {
            self.entries[self.next] = (class_id, verdict);
            self.next = (self.next + 1) % Self::KEPT;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(words: &str) -> Verdict {
        Arc::new((Rejection::NoReport, words.to_owned()))
    }

    #[test]
    fn each_class_keeps_its_own_verdict_and_the_oldest_class_goes_first() {
        let mut v = Verdicts::default();
        assert!(v.get(1).is_none());
        v.put(1, None);
        v.put(2, Some(refused("two")));
        assert!(v.get(1).unwrap().is_none(), "class 1 fits");
        assert_eq!(v.get(2).unwrap().as_ref().unwrap().1, "two");
        v.put(2, Some(refused("two again")));
        assert_eq!(v.get(2).unwrap().as_ref().unwrap().1, "two again");
        for class in 3..=u64::try_from(Verdicts::KEPT).unwrap() + 1 {
            v.put(class, None);
        }
        assert!(v.get(1).is_none(), "the oldest class made room");
        assert_eq!(v.get(2).unwrap().as_ref().unwrap().1, "two again");
    }
}
