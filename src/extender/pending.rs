//! The pods filter refused on every node it was asked about: what the nudger, the pending-pod
//! gauges and self-preemption read.
//!
//! A refusal is recorded from the filter request itself (the pod's key: its UID, or
//! `namespace/name`), not looked up in the index: kube-scheduler may ask about a pod before the
//! Pod watch has shown it to the extender, and a nudger tick that lands in between must still
//! know that the pod waits (issue 23), or a node that improves then frees nothing for it until
//! kube-scheduler's 5-minute flush. So an entry for a pod the index has not shown stays, for at
//! most [`UNSEEN_FOR`]: a pod deleted before the watch showed it is never shown, and a request
//! may name a pod that never existed. Once the index has shown the pod, the entry goes when the
//! pod is bound (by this extender or by anyone else) or deleted.
//!
//! Bounded: pods the index has shown are bounded by the cluster's, and entries for pods it has
//! not are at most [`UNSEEN_MAX`]. Beyond that a refusal of an unseen pod is not recorded: the
//! watch shows the pod within moments, and kube-scheduler's `Unschedulable` mark on it still
//! makes the nudger act (`Index::any_pod_left_unschedulable`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::placement::PodKey;

/// How long an entry for a pod the index has never shown is kept: the Pod watch shows a new
/// pod within milliseconds, and within seconds even after it reconnects and lists again; one
/// still unseen after this was deleted before the watch saw it, or never existed.
pub const UNSEEN_FOR: Duration = Duration::from_secs(60);

/// The most entries kept for pods the index has not shown (see the module's words on bounds).
pub const UNSEEN_MAX: usize = 1024;

/// One refused pod.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    pub(super) since_unix: i64,
    pub(super) reason: &'static str,
    /// When filter first refused it everywhere (`since_unix` follows the test clock).
    pub(super) since: Instant,
    /// Nodes that passed every kube-scheduler plugin and only filter refused, where evicting
    /// pods could make room (the resolvable refusals of its last filter, at most
    /// `PREEMPTIBLE_NODES_KEPT`): where `self_preempt` may look for victims.
    pub(super) preemptible: Vec<String>,
    /// Whether the index has shown the pod since its refusal was recorded.
    seen: bool,
    /// The latest refusal: an unseen entry is kept [`UNSEEN_FOR`] from this, not from `since`,
    /// so a Pod watch that lags longer (a relist on a large cluster) does not drop a pod that
    /// is still being refused and restart its age (`since`, which self-preemption reads).
    last_refused: Instant,
}

/// Where the index has a pod now (`Index::pod_bound`: `None` when it has none).
pub(super) type Bound = Option<bool>;

/// The refused pods, by key, and how many of them the index has not shown.
#[derive(Debug, Default)]
pub(super) struct PendingPods {
    pods: HashMap<PodKey, Pending>,
    unseen: usize,
    /// When `sweep` last ran: at [`UNSEEN_MAX`], a refusal sweeps first, at most once a second.
    last_sweep: Option<Instant>,
}

impl PendingPods {
    /// Records that filter refused pod `key` everywhere (or updates its record): `shown`
    /// whether the index has the pod now. Returns whether it is recorded: a new pod the index
    /// has not shown is not, while [`UNSEEN_MAX`] such entries are kept.
    pub(super) fn refused(
        &mut self,
        key: &str,
        reason: &'static str,
        preemptible: Vec<String>,
        shown: bool,
        (now_unix, now): (i64, Instant),
    ) -> bool {
        if let Some(e) = self.pods.get_mut(key) {
            e.reason = reason;
            e.preemptible = preemptible;
            e.last_refused = now;
            if shown && !e.seen {
                e.seen = true;
                self.unseen -= 1;
            }
            return true;
        }
        if !shown {
            if self.unseen >= UNSEEN_MAX {
                return false;
            }
            self.unseen += 1;
        }
        self.pods.insert(
            key.to_owned(),
            Pending {
                since_unix: now_unix,
                reason,
                since: now,
                preemptible,
                seen: shown,
                last_refused: now,
            },
        );
        true
    }

    /// Whether a refusal of a new, unseen pod would find the table full, and a sweep may make
    /// room (none ran in the last second).
    pub(super) fn sweep_due(&self, now: Instant) -> bool {
        self.unseen >= UNSEEN_MAX
            && self
                .last_sweep
                .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1))
    }

    /// Forgets pod `key` (bound, or no longer refused everywhere).
    pub(super) fn remove(&mut self, key: &str) {
        if let Some(e) = self.pods.remove(key)
            && !e.seen
        {
            self.unseen -= 1;
        }
    }

    /// Forgets the pods `bound` says are bound, those the index showed and no longer has
    /// (deleted), and those it has not shown and filter has not refused for [`UNSEEN_FOR`]; marks
    /// the others it has as seen.
    pub(super) fn sweep(&mut self, now: Instant, bound: impl Fn(&str) -> Bound) {
        self.last_sweep = Some(now);
        let unseen = &mut self.unseen;
        self.pods.retain(|key, e| {
            let keep = match bound(key) {
                Some(true) => false,
                Some(false) => {
                    if !e.seen {
                        e.seen = true;
                        *unseen -= 1;
                    }
                    return true;
                }
                None => !e.seen && now.saturating_duration_since(e.last_refused) < UNSEEN_FOR,
            };
            if !keep && !e.seen {
                *unseen -= 1;
            }
            keep
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&PodKey, &Pending)> {
        self.pods.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: Instant) -> (i64, Instant) {
        (0, t)
    }

    /// A refusal recorded before the index shows the pod stays until it is shown, then goes
    /// when the pod binds or is deleted; one never shown goes after `UNSEEN_FOR`.
    #[test]
    fn an_unseen_refusal_waits_for_the_index_then_follows_it() {
        let t0 = Instant::now();
        let mut p = PendingPods::default();
        assert!(p.refused("a", "not_enough_memory", Vec::new(), false, at(t0)));
        assert!(p.refused("b", "not_enough_memory", Vec::new(), false, at(t0)));
        assert!(p.refused("c", "not_enough_memory", Vec::new(), true, at(t0)));
        assert_eq!((p.pods.len(), p.unseen), (3, 2));

        // Nothing shown yet: all kept, within `UNSEEN_FOR`.
        p.sweep(t0 + Duration::from_secs(1), |k| (k == "c").then_some(false));
        assert_eq!((p.pods.len(), p.unseen), (3, 2));
        // `a` shown waiting, `b` still unseen.
        p.sweep(t0 + Duration::from_secs(2), |k| (k != "b").then_some(false));
        assert_eq!((p.pods.len(), p.unseen), (3, 1));
        // `a` deleted, `c` bound: both go; `b` goes once `UNSEEN_FOR` has passed.
        p.sweep(t0 + Duration::from_secs(3), |_| None);
        assert_eq!(p.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["b"]);
        p.sweep(t0 + UNSEEN_FOR, |_| None);
        assert!(p.is_empty());
        assert_eq!(p.unseen, 0);

        // A pod shown waiting stays however long it waits; a bound one goes.
        assert!(p.refused("d", "gpu_too_small", Vec::new(), true, at(t0)));
        p.sweep(t0 + UNSEEN_FOR * 10, |_| Some(false));
        assert_eq!(p.pods.len(), 1);
        p.sweep(t0 + UNSEEN_FOR * 10, |_| Some(true));
        assert!(p.is_empty());
    }

    /// A pod still refused while the Pod watch lags past `UNSEEN_FOR` stays, with the age of
    /// its first refusal: the window runs from the latest refusal.
    #[test]
    fn an_unseen_pod_refused_again_keeps_its_entry_and_age() {
        let t0 = Instant::now();
        let mut p = PendingPods::default();
        assert!(p.refused("a", "r", Vec::new(), false, at(t0)));
        let again = t0 + UNSEEN_FOR / 2;
        assert!(p.refused("a", "r", Vec::new(), false, at(again)));
        p.sweep(t0 + UNSEEN_FOR + UNSEEN_FOR / 4, |_| None);
        let kept: Vec<_> = p.iter().map(|(k, e)| (k.as_str(), e.since)).collect();
        assert_eq!(kept, [("a", t0)]);
        p.sweep(again + UNSEEN_FOR, |_| None);
        assert!(p.is_empty());
        assert_eq!(p.unseen, 0);
    }

    /// At most `UNSEEN_MAX` unseen pods are kept; pods the index shows are always recorded,
    /// a later refusal of an unseen one once shown counts it as seen, and removing frees room.
    #[test]
    fn unseen_refusals_are_bounded() {
        let t0 = Instant::now();
        let mut p = PendingPods::default();
        for i in 0..UNSEEN_MAX {
            assert!(p.refused(&format!("u{i}"), "r", Vec::new(), false, at(t0)));
        }
        assert!(p.sweep_due(t0));
        assert!(!p.refused("one-more", "r", Vec::new(), false, at(t0)));
        assert!(p.refused("shown", "r", Vec::new(), true, at(t0)));
        assert_eq!((p.pods.len(), p.unseen), (UNSEEN_MAX + 1, UNSEEN_MAX));
        assert!(p.refused("u0", "r", Vec::new(), true, at(t0)));
        p.remove("u1");
        assert_eq!(p.unseen, UNSEEN_MAX - 2);
        assert!(p.refused("one-more", "r", Vec::new(), false, at(t0)));
        assert!(!p.sweep_due(t0));
        p.sweep(t0, |_| Some(false));
        assert_eq!(p.unseen, 0);
        assert!(!p.sweep_due(t0));
    }
}
