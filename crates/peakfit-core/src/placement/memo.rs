//! Scores a node state has already answered, so prioritize does not redo the fragmentation
//! scoring of a node that has not changed, nor of a node in the same state as one it scored.
//!
//! kube-scheduler asks prioritize about every candidate for every pod, and between two pods
//! usually one node changes (the one the last pod was bound to) while the pods themselves come
//! in runs of one shape (the replicas of a Deployment, the workers of a Job). A node's score
//! depends only on its scoring inputs (`placement::signature`), the pod's class, the shape mix
//! and the extender's fixed policy. The index hands every node in the same state one shared
//! memo, which remembers scores under (mix generation, class id): a node whose ledger changes
//! moves to another state's memo, any other change is a different key, so a stale score can
//! never be read, and nodes alike (every empty node of a pool) are scored once between them.
//! Report age is the only input that moves with time; callers check it before looking here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::demand::PodClass;

/// Fresh identifiers for classes (and the extender's filter requests): unique in the process,
/// never 0, so a default (empty) entry matches nothing and two extenders never share a class id.
static IDS: AtomicU64 = AtomicU64::new(1);

/// A number never handed out before.
pub fn fresh_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// What a remembered score was computed from, besides the node state whose memo holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoKey {
    /// `ShapeMix::generation` of the mix the score was computed with.
    pub mix_generation: u64,
    /// From a `ClassIds` that belongs to one scorer (one policy and fit configuration).
    pub class_id: u64,
}

/// The few most recent scores of one node state: room for the classes the prescorer keeps warm
/// (`PRESCORED`) under two mixes at once (the one prioritize scores with and the next one, which
/// the prescorer warms before prioritize switches to it), and four more for whatever else the
/// queue brings; 584 bytes. Keys and scores in separate arrays: a lookup scans the class ids
/// (three cache lines) and reads the rest of an entry only where its class matches.
#[derive(Clone, Debug)]
pub struct ScoreMemo {
    classes: [u64; Self::WAYS],
    mixes: [u64; Self::WAYS],
    scores: [f64; Self::WAYS],
    next: usize,
}

impl Default for ScoreMemo {
    fn default() -> Self {
        Self {
            classes: [0; Self::WAYS],
            mixes: [0; Self::WAYS],
            scores: [0.0; Self::WAYS],
            next: 0,
        }
    }
}

impl ScoreMemo {
    pub const WAYS: usize = 24;
    /// How many of the mix's classes the prescorer keeps in every node's memo.
    pub const PRESCORED: usize = 10;

    /// The score remembered under `key` (NaN when the pod did not fit).
    pub fn get(&self, key: &MemoKey) -> Option<f64> {
        if key.class_id == 0 {
            return None;
        }
        (0..Self::WAYS)
            .find(|&i| self.classes[i] == key.class_id && self.mixes[i] == key.mix_generation)
            .map(|i| self.scores[i])
    }

    /// Remembers a score in place of, first, an empty entry or the same key's, then a score
    /// that can never be read again (of a mix older than `live_mix`, the oldest one still
    /// scored with; generations only grow), and only then the oldest of the current ones.
    pub fn put(&mut self, key: MemoKey, score: f64, live_mix: u64) {
        let i = (0..Self::WAYS)
            .find(|&i| {
                self.classes[i] == 0
                    || (self.classes[i] == key.class_id && self.mixes[i] == key.mix_generation)
            })
            .or_else(|| (0..Self::WAYS).find(|&i| self.mixes[i] < live_mix))
            .unwrap_or_else(|| {
                let i = self.next;
                self.next = (i + 1) % Self::WAYS;
                i
            });
        self.classes[i] = key.class_id;
        self.mixes[i] = key.mix_generation;
        self.scores[i] = score;
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

    fn key(mix_generation: u64, class_id: u64) -> MemoKey {
        MemoKey {
            mix_generation,
            class_id,
        }
    }

    #[test]
    fn any_changed_input_misses() {
        let mut memo = ScoreMemo::default();
        memo.put(key(7, 9), 1.5, 0);
        assert_eq!(memo.get(&key(7, 9)), Some(1.5));
        assert_eq!(memo.get(&key(8, 9)), None);
        assert_eq!(memo.get(&key(7, 10)), None);
        // An empty memo answers nothing, not even for the all-zero key.
        assert_eq!(ScoreMemo::default().get(&MemoKey::default()), None);
    }

    #[test]
    fn keeps_the_most_recent_entries() {
        let mut memo = ScoreMemo::default();
        for c in 1..=ScoreMemo::WAYS as u64 + 1 {
            memo.put(key(1, c), c as f64, 1);
        }
        assert_eq!(memo.get(&key(1, 1)), None, "the oldest was replaced");
        for c in 2..=ScoreMemo::WAYS as u64 + 1 {
            assert_eq!(memo.get(&key(1, c)), Some(c as f64));
        }
        // NaN (did not fit) is remembered like any score; a key scored again replaces itself.
        memo.put(key(1, 5), f64::NAN, 1);
        assert!(memo.get(&key(1, 5)).is_some_and(f64::is_nan));
        assert_eq!(memo.get(&key(1, 6)), Some(6.0));
    }

    /// While the prescorer warms the next mix, the current mix's scores of the same classes
    /// stay; once the next one is live, the old one's go first.
    #[test]
    fn two_mixes_live_side_by_side() {
        let mut memo = ScoreMemo::default();
        let classes = ScoreMemo::PRESCORED as u64;
        for c in 1..=classes {
            memo.put(key(10, c), c as f64, 10);
        }
        for c in 1..=classes {
            memo.put(key(11, c), -(c as f64), 10);
        }
        for c in 1..=classes {
            assert_eq!(memo.get(&key(10, c)), Some(c as f64));
            assert_eq!(memo.get(&key(11, c)), Some(-(c as f64)));
        }
        // Mix 11 is live, then mix 12 is warmed: mix 10's entries make the room.
        for c in 1..=classes {
            memo.put(key(12, c), 0.5, 11);
        }
        for c in 1..=classes {
            assert_eq!(memo.get(&key(11, c)), Some(-(c as f64)));
            assert_eq!(memo.get(&key(12, c)), Some(0.5));
        }
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
