//! Holds for pods that starve, as the index keeps them (`cluster::hold`): read from the pending
//! pods' `peakfit.io/hold` by the watch (`reconcile`), put in the held node's ledger
//! (`rebuild`), and ended here at their deadline.

use super::{Index, PodEntry};
use crate::cluster::hold::HoldNote;

/// A hold the sweep ended at its deadline: the pod it was for and the hold, so the sweeper can
/// remove exactly this annotation from exactly this pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredHold {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub note: HoldNote,
}

impl Index {
    /// The pod's `peakfit.io/hold` as the index has it (past its deadline or not); `None` when
    /// it has none or is bound.
    pub fn hold_of(&self, key: &str) -> Option<HoldNote> {
        self.pods
            .read()
            .by_key
            .get(key)
            .filter(|p| p.node.is_none())
            .and_then(|p| p.hold.clone())
    }

    /// Holds in force at `now`, over every node: what `--reserve-max` caps.
    pub fn holds_active(&self, now: i64) -> usize {
        let pods = self.pods.read();
        pods.held
            .iter()
            .filter_map(|k| pods.by_key.get(k))
            .filter(|p| p.hold.as_ref().is_some_and(|h| h.active_at(now)))
            .count()
    }

    /// Records a hold the extender just wrote, before the watch brings the annotation back (in
    /// file mode, and for the next filter of the pod).
    pub fn record_hold(&self, key: &str, note: HoldNote) {
        let mut entry = match self.pods.read().by_key.get(key) {
            Some(e) if e.node.is_none() => PodEntry::clone(e),
            _ => return,
        };
        entry.hold = Some(note);
        self.upsert(entry);
    }

    /// Ends the holds whose deadline has come by `now`: their memory is free again on their
    /// node, and the watch bringing the same annotation back does not restore them. Each is
    /// reported once, also one that was past its deadline when the watch first brought it.
    pub fn expire_holds(&self, now: i64) -> Vec<ExpiredHold> {
        let due: Vec<PodEntry> = {
            let pods = self.pods.read();
            pods.held
                .iter()
                .filter_map(|k| pods.by_key.get(k))
                .filter(|p| p.hold.as_ref().is_some_and(|h| !h.active_at(now)))
                .map(|p| PodEntry::clone(p))
                .collect()
        };
        let mut out = Vec::new();
        for mut entry in due {
            let Some(note) = entry.hold.take() else {
                continue;
            };
            self.pods
                .write()
                .expired
                .insert((entry.key.clone(), note.made_unix));
            out.push(ExpiredHold {
                namespace: entry.namespace.clone(),
                name: entry.name.clone(),
                uid: entry.uid().map(str::to_owned),
                note,
            });
            self.upsert(entry);
        }
        out
    }

    /// When the pod's containers started, if the index knows: how `choose_hold` guesses which
    /// holders leave first.
    pub fn started_of(&self, key: &str) -> Option<i64> {
        self.pods
            .read()
            .by_key
            .get(key)
            .and_then(|p| p.started_unix)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::cluster::hold::HOLD;
    use crate::cluster::test_support::{GIB, ledger, mk_pod, mk_report, warnings};

    const NOW: i64 = 1_000_000;

    fn note(node: &str, gpus: &[&str], until: i64) -> HoldNote {
        HoldNote {
            node: node.into(),
            gpus: gpus.iter().map(|g| (*g).to_owned()).collect(),
            bytes: vec![60 * GIB; gpus.len()],
            made_unix: NOW - 10,
            until_unix: until,
        }
    }

    /// A pending peakfit pod with a hold annotation `value` and a priority.
    fn held_pod(uid: &str, value: &str, priority: i32) -> Pod {
        let mut p = mk_pod(uid, None, &[("peakfit.io/vram", "60Gi"), (HOLD, value)]);
        p.spec.as_mut().unwrap().priority = Some(priority);
        p
    }

    fn index() -> Index {
        let index = Index::new();
        index.apply_report(&mk_report(
            "n",
            &[("GPU-a", 80 * GIB, 0, &[]), ("GPU-b", 80 * GIB, 0, &[])],
        ));
        index
    }

    #[test]
    fn a_pending_pods_hold_is_committed_for_others_and_free_for_it() {
        let index = index();
        let value = note("n", &["GPU-b"], NOW + 600).to_annotation();
        index.apply_pod(&held_pod("big", &value, 10));
        let l = ledger(&index, "n");
        assert_eq!(l.gpus[1].held_bytes(), 60 * GIB);
        assert_eq!(l.gpus[0].held_bytes(), 0);
        assert_eq!(index.holds_active(NOW), 1);
        let slot = index.node("n").unwrap();
        let st = slot.read();
        assert_eq!(st.holds.len(), 1);
        assert_eq!(st.holds[0].gpus, [1]);
        // Its own view, one of higher priority and one past the deadline drop it; others keep it.
        let free = |v: &crate::placement::NodeLedger| v.gpus[1].free_bytes();
        assert_eq!(free(&st.seen_by(Some("big"), 10, NOW)), 80 * GIB);
        assert_eq!(free(&st.seen_by(Some("urgent"), 11, NOW)), 80 * GIB);
        assert_eq!(free(&st.seen_by(Some("small"), 10, NOW)), 20 * GIB);
        assert_eq!(free(&st.seen_by(Some("small"), 0, NOW)), 20 * GIB);
        assert_eq!(free(&st.seen_by(None, i32::MIN, NOW + 600)), 80 * GIB);
        assert!(matches!(
            st.seen_by(Some("small"), 0, NOW),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_hold_ends_when_its_pod_binds_or_goes() {
        let index = index();
        let value = note("n", &["GPU-a", "GPU-b"], NOW + 600).to_annotation();
        index.apply_pod(&held_pod("big", &value, 0));
        assert_eq!(ledger(&index, "n").gpus[0].held_bytes(), 60 * GIB);
        // Bound (anywhere): the annotation stays on the pod but holds nothing.
        let mut bound = held_pod("big", &value, 0);
        bound.spec.as_mut().unwrap().node_name = Some("other".into());
        index.apply_pod(&bound);
        assert!(ledger(&index, "n").gpus.iter().all(|g| g.held_bytes() == 0));
        assert_eq!(index.holds_active(NOW), 0);
        assert_eq!(index.hold_of("big"), None);
        // Pending again with a hold, then deleted.
        index.apply_pod(&held_pod("big2", &value, 0));
        assert_eq!(ledger(&index, "n").gpus[1].held_bytes(), 60 * GIB);
        index.delete_pod_key("big2");
        assert!(ledger(&index, "n").gpus.iter().all(|g| g.held_bytes() == 0));
        assert_eq!(index.holds_active(NOW), 0);
    }

    #[test]
    fn an_expired_hold_is_swept_once_and_not_brought_back_by_the_watch() {
        let index = index();
        let value = note("n", &["GPU-a"], NOW + 60).to_annotation();
        let pod = held_pod("big", &value, 0);
        index.apply_pod(&pod);
        assert!(index.expire_holds(NOW + 59).is_empty());
        let ended = index.expire_holds(NOW + 60);
        assert_eq!(ended.len(), 1);
        assert_eq!(
            (ended[0].namespace.as_str(), ended[0].name.as_str()),
            ("ml", "pod-big")
        );
        assert_eq!(ended[0].uid.as_deref(), Some("big"));
        assert_eq!(ended[0].note.until_unix, NOW + 60);
        assert_eq!(ledger(&index, "n").gpus[0].held_bytes(), 0);
        index.apply_pod(&pod);
        assert_eq!(ledger(&index, "n").gpus[0].held_bytes(), 0, "not restored");
        assert!(index.expire_holds(NOW + 120).is_empty(), "reported once");
        // A new hold (another made time) on the same pod stands.
        let mut again = note("n", &["GPU-a"], NOW + 3_000);
        again.made_unix = NOW + 60;
        index.record_hold("big", again.clone());
        assert_eq!(index.hold_of("big"), Some(again));
        assert_eq!(ledger(&index, "n").gpus[0].held_bytes(), 60 * GIB);
        // The pod goes: so does its mark, also for a hold that expired (and left `held`).
        index.expire_holds(NOW + 3_000);
        assert!(!index.pods.read().expired.is_empty());
        index.delete_pod_key("big");
        assert!(
            index.pods.read().expired.is_empty(),
            "no mark outlives its pod"
        );
    }

    #[test]
    fn a_malformed_or_conflicting_hold_is_ignored_and_blocks_nobody() {
        let index = index();
        index.apply_pod(&held_pod("bad", "{\"node\":\"n\"}", 0));
        assert_eq!(warnings(&index, "hold_invalid"), 1);
        assert_eq!(index.hold_of("bad"), None);
        let entry = index.find_pod("bad", "", "").unwrap();
        assert!(
            matches!(entry.request, Ok(Some(_))),
            "the pod itself is fine"
        );
        // A GPU the report lacks, and a GPU another pod holds: not kept, the first stands.
        let missing = note("n", &["GPU-z"], NOW + 600).to_annotation();
        index.apply_pod(&held_pod("lost", &missing, 0));
        assert_eq!(warnings(&index, "hold_not_kept"), 1);
        let first = note("n", &["GPU-a"], NOW + 600).to_annotation();
        index.apply_pod(&held_pod("a-first", &first, 0));
        index.apply_pod(&held_pod("b-second", &first, 0));
        let l = ledger(&index, "n");
        assert_eq!(l.gpus[0].hold().unwrap().pod, "a-first");
        assert!(warnings(&index, "hold_not_kept") >= 2);
        // Neither blocks the node's other GPU.
        assert_eq!(l.gpus[1].free_bytes(), 80 * GIB);
    }
}
