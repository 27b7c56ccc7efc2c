//! Scores a node has already answered, so prioritize does not redo the fragmentation scoring of
//! a node that has not changed.
//!
//! kube-scheduler asks prioritize about every candidate for every pod, and between two pods
//! usually one node changes (the one the last pod was bound to) while the pods themselves come
//! in runs of one shape (the replicas of a Deployment, the workers of a Job). A node's score
//! depends only on its ledger, the pod's class, the shape mix and the extender's fixed policy,
//! so it is remembered under (ledger version, mix generation, class id): any change to any of
//! them is a different key, and a stale score can never be read. Report age is the only input
//! that moves with time; callers check it before looking here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::demand::PodClass;

/// Fresh identifiers for ledger versions and classes: unique in the process, never 0, so a
/// default (empty) entry matches nothing and two extenders never share a class id.
static IDS: AtomicU64 = AtomicU64::new(1);

/// A number never handed out before.
pub fn fresh_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// What a remembered score was computed from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoKey {
    /// Changes whenever the node's ledger does.
    pub ledger_version: u64,
    /// `ShapeMix::generation` of the mix the score was computed with.
    pub mix_generation: u64,
    /// From a `ClassIds` that belongs to one scorer (one policy and fit configuration).
    pub class_id: u64,
}

/// The few most recent scores of one node: room for the classes the prescorer keeps warm
/// (`PRESCORED`) and two more for whatever else the queue brings, in 384 bytes per node.
#[derive(Clone, Debug, Default)]
pub struct ScoreMemo {
    entries: [(MemoKey, f64); Self::WAYS],
    next: usize,
}

impl ScoreMemo {
    pub const WAYS: usize = 12;
    /// How many of the mix's classes the prescorer keeps in every node's memo.
    pub const PRESCORED: usize = Self::WAYS - 2;

    /// The score remembered under `key` (NaN when the pod did not fit).
    pub fn get(&self, key: &MemoKey) -> Option<f64> {
        self.entries
            .iter()
            .find(|(k, _)| k == key && k.class_id != 0)
            .map(|&(_, s)| s)
    }

    /// Remembers a score in place of, first, the same class's older score or an empty entry,
    /// then a score of an older ledger or mix (it can never be read again), and only then the
    /// oldest of the current ones.
    pub fn put(&mut self, key: MemoKey, score: f64) {
        let i = self
            .entries
            .iter()
            .position(|(k, _)| k.class_id == key.class_id || k.class_id == 0)
            .or_else(|| {
                self.entries.iter().position(|(k, _)| {
                    k.ledger_version != key.ledger_version || k.mix_generation != key.mix_generation
                })
            })
            .unwrap_or_else(|| {
                let i = self.next;
                self.next = (i + 1) % Self::WAYS;
                i
            });
        self.entries[i] = (key, score);
    }
}

/// Small numbers for pod classes, so a memo compares three integers instead of two classes.
#[derive(Debug, Default)]
pub struct ClassIds {
    ids: HashMap<PodClass, u64>,
}

impl ClassIds {
    /// Classes remembered before the table starts over; a class seen again after that gets a
    /// new id, which only costs its nodes one recomputation.
    const LIMIT: usize = 4096;

    pub fn id(&mut self, class: &PodClass) -> u64 {
        if let Some(&id) = self.ids.get(class) {
            return id;
        }
        if self.ids.len() >= Self::LIMIT {
            self.ids.clear();
        }
        let id = fresh_id();
        self.ids.insert(class.clone(), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::test_support::share;

    fn key(ledger_version: u64, mix_generation: u64, class_id: u64) -> MemoKey {
        MemoKey {
            ledger_version,
            mix_generation,
            class_id,
        }
    }

    #[test]
    fn any_changed_input_misses() {
        let mut memo = ScoreMemo::default();
        memo.put(key(5, 7, 9), 1.5);
        assert_eq!(memo.get(&key(5, 7, 9)), Some(1.5));
        assert_eq!(memo.get(&key(6, 7, 9)), None);
        assert_eq!(memo.get(&key(5, 8, 9)), None);
        assert_eq!(memo.get(&key(5, 7, 10)), None);
        // An empty memo answers nothing, not even for the all-zero key.
        assert_eq!(ScoreMemo::default().get(&MemoKey::default()), None);
    }

    #[test]
    fn keeps_the_most_recent_entries() {
        let mut memo = ScoreMemo::default();
        for c in 1..=ScoreMemo::WAYS as u64 + 1 {
            memo.put(key(1, 1, c), c as f64);
        }
        assert_eq!(memo.get(&key(1, 1, 1)), None, "the oldest was replaced");
        for c in 2..=ScoreMemo::WAYS as u64 + 1 {
            assert_eq!(memo.get(&key(1, 1, c)), Some(c as f64));
        }
        // NaN (did not fit) is remembered like any score.
        memo.put(key(2, 1, 1), f64::NAN);
        assert!(memo.get(&key(2, 1, 1)).is_some_and(f64::is_nan));
    }

    #[test]
    fn unreadable_entries_go_first() {
        let mut memo = ScoreMemo::default();
        for c in 1..=ScoreMemo::WAYS as u64 {
            memo.put(key(1, 1, c), c as f64);
        }
        // The ledger moved on: new scores replace the old ledger's, not each other.
        for c in 1..=ScoreMemo::WAYS as u64 {
            memo.put(key(2, 1, 100 + c), c as f64);
        }
        for c in 1..=ScoreMemo::WAYS as u64 {
            assert_eq!(memo.get(&key(2, 1, 100 + c)), Some(c as f64));
        }
        // A class scored again replaces its own older score.
        memo.put(key(3, 1, 101), 0.5);
        memo.put(key(3, 1, 102), 0.25);
        assert_eq!(memo.get(&key(3, 1, 101)), Some(0.5));
        assert_eq!(memo.get(&key(2, 1, 103)), Some(3.0));
    }

    #[test]
    fn equal_classes_share_an_id_and_others_do_not() {
        let mut ids = ClassIds::default();
        let a = ids.id(&share(500, 1));
        assert_eq!(ids.id(&share(500, 1)), a);
        assert_ne!(ids.id(&share(500, 2)), a);
        assert_ne!(ClassIds::default().id(&share(500, 1)), a);
    }
}
