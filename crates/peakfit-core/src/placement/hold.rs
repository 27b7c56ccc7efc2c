//! Holds: memory kept for a pod that has waited too long (issue 22, starvation).
//!
//! The ledger starts a pod only where its peak fits. A pod that needs four nearly whole GPUs of
//! one node therefore waits until four GPUs of a node are empty at the same time, and that
//! rarely happens while small pods take each piece of memory as it frees: the big pods starve.
//! A hold chooses the node and GPUs the starving pod will get and keeps its memory there. The
//! held bytes count as committed for every other pod, so others bind on those GPUs only beside
//! it (backfill), and the GPUs drain towards it; for the pod itself they are free
//! (`NodeLedger::seen_by`), so the fit and the scoring run unchanged for everyone.
//!
//! The choice uses only what the ledger knows, as the extender does: which pods hold the GPUs,
//! how much, and since when. It never reads how long a pod will run; nobody knows that.
//!
//! It is called a hold, not a reservation, because `Reservation` is already a pod's claim on a
//! GPU in the ledger, and that one counts for everyone.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::demand::PodClass;
use super::fit::{FitConfig, Placement, node_usable};
use super::ledger::{GpuLedger, NodeLedger, PodKey};

/// When holds are made and how long they last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldConfig {
    /// A pending pod that fits nowhere gets a hold once it has waited this long (seconds): long
    /// enough that pods which would have started soon anyway do not idle memory for it.
    pub after_secs: i64,
    /// A hold is dropped this long after it was made (seconds), started or not, so a choice made
    /// on a guess (the holders might run for days) is not kept forever; it may be made again.
    pub deadline_secs: i64,
    /// At most this many holds at once: every hold idles memory while it drains, and too many
    /// would starve the small pods instead.
    pub max_holds: usize,
}

/// One pod's hold: where it is and until when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub node: String,
    pub placement: Placement,
    pub made_unix: i64,
    pub until_unix: i64,
}

/// The holds of a cluster, by pod. The GPUs' share of each lives in the nodes' ledgers
/// (`GpuLedger::hold`), where the fit reads it; this book knows where to find them again and
/// when they end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holds {
    by_pod: BTreeMap<PodKey, Hold>,
}

impl Holds {
    pub fn len(&self) -> usize {
        self.by_pod.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }

    pub fn get(&self, pod: &str) -> Option<&Hold> {
        self.by_pod.get(pod)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PodKey, &Hold)> {
        self.by_pod.iter()
    }

    /// Whether `pod`, pending for `waited_secs` and fitting nowhere, should get a hold now: it
    /// has none, it has waited long enough, and the cap leaves room.
    pub fn due(&self, pod: &str, waited_secs: i64, cfg: &HoldConfig) -> bool {
        !self.by_pod.contains_key(pod)
            && waited_secs >= cfg.after_secs
            && self.by_pod.len() < cfg.max_holds
    }

    /// Chooses a node and GPUs for `pod` (`choose_hold`) and holds them; the index of the node
    /// in `nodes`, or `None` when no node could ever take it.
    #[allow(clippy::too_many_arguments)]
    pub fn make(
        &mut self,
        pod: &str,
        class: &PodClass,
        nodes: &mut [NodeLedger],
        fit: &FitConfig,
        cfg: &HoldConfig,
        started_at: impl Fn(&str) -> Option<i64>,
        now_unix: i64,
    ) -> Option<usize> {
        self.end(pod, nodes);
        let (n, placement) = choose_hold(nodes, pod, class, fit, started_at, now_unix)?;
        nodes[n]
            .hold(pod, &placement)
            .expect("choose_hold takes no GPU another pod holds");
        self.by_pod.insert(
            pod.to_owned(),
            Hold {
                node: nodes[n].name.clone(),
                placement,
                made_unix: now_unix,
                until_unix: now_unix.saturating_add(cfg.deadline_secs),
            },
        );
        Some(n)
    }

    /// Ends `pod`'s hold (it started, anywhere, or is gone) and frees its GPUs for the others.
    pub fn end(&mut self, pod: &str, nodes: &mut [NodeLedger]) -> Option<Hold> {
        let hold = self.by_pod.remove(pod)?;
        if let Some(node) = nodes.iter_mut().find(|n| n.name == hold.node) {
            node.unhold(pod);
        }
        Some(hold)
    }

    /// Drops the holds whose deadline has come; the pods they were for.
    pub fn expire(&mut self, nodes: &mut [NodeLedger], now_unix: i64) -> Vec<PodKey> {
        let due: Vec<PodKey> = self
            .by_pod
            .iter()
            .filter(|(_, h)| h.until_unix <= now_unix)
            .map(|(p, _)| p.clone())
            .collect();
        for pod in &due {
            self.end(pod, nodes);
        }
        due
    }
}

/// What stands between a GPU and a pod: the pods that must leave before its share fits.
#[derive(Clone, Debug, Default)]
struct Blockers {
    pods: BTreeSet<PodKey>,
    bytes: u64,
    /// When the youngest of them started (Unix seconds; `now` when unknown, as if it had just
    /// started, the worst case).
    youngest_start: i64,
}

impl Blockers {
    /// Fewest pods first: the GPUs are free only when the last of them leaves, and each one
    /// more is another run that may last. Then the oldest youngest blocker: a pod that has run
    /// long is nearer its end whatever its kind (runs have bounded lengths). Then the fewest
    /// bytes. The ledger knows nothing else about when pods end.
    fn key(&self) -> (usize, i64, u64) {
        (self.pods.len(), self.youngest_start, self.bytes)
    }
}

/// The pods to wait for on `gpu` before `need` bytes (the margin included) are free: the
/// largest holders first, so that as few as possible must leave.
fn blockers_on(
    gpu: &GpuLedger,
    need: u64,
    started_at: &impl Fn(&str) -> Option<i64>,
    now_unix: i64,
) -> Blockers {
    // Free as the held pod sees it: a hold here is its own (others' are skipped earlier).
    let free = gpu
        .free_bytes()
        .saturating_add(gpu.held_bytes())
        .min(gpu.total_bytes);
    let mut deficit = need.saturating_sub(free);
    let mut holders: Vec<(&PodKey, u64)> = gpu
        .reservations()
        .iter()
        .map(|(p, r)| (p, r.charged_bytes()))
        .collect();
    holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut out = Blockers {
        youngest_start: i64::MIN,
        ..Blockers::default()
    };
    for (pod, bytes) in holders {
        if deficit == 0 {
            break;
        }
        deficit = deficit.saturating_sub(bytes);
        out.pods.insert(pod.clone());
        out.bytes = out.bytes.saturating_add(bytes);
        out.youngest_start = out.youngest_start.max(started_at(pod).unwrap_or(now_unix));
    }
    out
}

/// Where a starving pod should wait: the node whose GPUs would free its share soonest, judged
/// from the ledger alone (see `Blockers::key`), and on it the GPUs it would then get. Skips
/// GPUs held for another pod (no GPU carries two holds), GPUs of a model the pod refuses or too
/// small for it, and GPUs whose memory would not hold its share even with every pod gone
/// (driver reserve, unattributed use). `None` for a pod without GPUs or one no node could take.
pub fn choose_hold(
    nodes: &[NodeLedger],
    pod: &str,
    class: &PodClass,
    fit: &FitConfig,
    started_at: impl Fn(&str) -> Option<i64>,
    now_unix: i64,
) -> Option<(usize, Placement)> {
    let wanted = crate::convert::u64_to_usize(u64::from(class.shape.gpus));
    if wanted == 0 {
        return None;
    }
    let demand = &class.shape.demand;
    let mut best: Option<((usize, i64, u64), usize, Placement)> = None;
    for (n, node) in nodes.iter().enumerate() {
        if node_usable(node, fit, now_unix).is_err()
            || node.cpu_capacity_milli.is_some_and(|c| c < class.cpu_milli)
        {
            continue;
        }
        let mut gpus: Vec<(usize, u64, Blockers)> = node
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                g.hold().is_none_or(|h| h.pod == pod)
                    && class.accepts_model(&g.model)
                    && demand.runs_in(g.room(fit.safety_margin_bytes))
            })
            .filter_map(|(i, g)| {
                let (share, need) =
                    crate::placement::fit::need_on(demand, g, fit.safety_margin_bytes);
                (g.room_without_pods() >= need)
                    .then(|| (i, share, blockers_on(g, need, &started_at, now_unix)))
            })
            .collect();
        if gpus.len() < wanted {
            continue;
        }
        gpus.sort_by_key(|(i, _, b)| (b.key(), *i));
        gpus.truncate(wanted);
        // The node is ready when every chosen GPU is: one pod on several of them leaves once.
        let mut all = Blockers {
            youngest_start: i64::MIN,
            ..Blockers::default()
        };
        for (_, _, b) in &gpus {
            all.pods.extend(b.pods.iter().cloned());
            all.bytes = all.bytes.saturating_add(b.bytes);
            all.youngest_start = all.youngest_start.max(b.youngest_start);
        }
        let key = all.key();
        if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
            let pairs = gpus.iter().map(|&(i, share, _)| (i, share)).collect();
            best = Some((key, n, Placement::from_pairs(pairs)));
        }
    }
    best.map(|(_, n, p)| (n, p))
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::placement::fit::fit_class;
    use crate::placement::test_support::{node, share};
    use crate::placement::{HoldError, ScoringPolicy, ShapeMix, place};

    const NOW: i64 = 1_000_000;

    fn cfg() -> FitConfig {
        FitConfig::simulation()
    }

    fn fits(n: &NodeLedger, class: &PodClass) -> bool {
        fit_class(n, class, &cfg(), NOW).is_ok()
    }

    fn held(free: &[u64], pod: &str, gpu: usize, bytes: u64) -> NodeLedger {
        let mut n = node(free);
        n.hold(
            pod,
            &Placement {
                gpu_indices: vec![gpu],
                per_gpu_bytes: vec![bytes],
            },
        )
        .unwrap();
        n
    }

    #[test]
    fn a_hold_keeps_a_small_pod_off_the_memory_it_keeps() {
        // 400 free now, 700 held for `big`: a 300 pod would take what `big` waits for.
        let n = held(&[400], "big", 0, 700);
        assert!(fits(&node(&[400]), &share(300, 1)));
        assert!(!fits(&n, &share(300, 1)));
        assert_eq!(n.gpus[0].free_bytes(), 0);
    }

    #[test]
    fn a_pod_that_fits_beside_the_hold_still_binds_there() {
        let n = held(&[1000], "big", 0, 700);
        assert!(fits(&n, &share(300, 1)), "backfill beside the hold");
        assert!(!fits(&n, &share(301, 1)));
        // The scoring policies read the same free memory.
        let scored = place(
            &n,
            &share(300, 1),
            ScoringPolicy::Peakfit,
            &ShapeMix::default(),
            &cfg(),
            NOW,
        );
        assert!(scored.is_ok(), "{scored:?}");
    }

    #[test]
    fn the_held_pod_is_not_blocked_by_its_own_hold() {
        let n = held(&[1000], "big", 0, 700);
        assert!(!fits(&n, &share(700, 1)), "anyone else is kept out");
        let own = n.seen_by("big");
        assert!(matches!(own, Cow::Owned(_)));
        assert!(fits(&own, &share(700, 1)));
        assert!(matches!(n.seen_by("other"), Cow::Borrowed(_)));
    }

    #[test]
    fn no_gpu_carries_two_holds() {
        let mut n = held(&[1000, 1000], "big", 0, 700);
        let on = |gpu| Placement {
            gpu_indices: vec![gpu],
            per_gpu_bytes: vec![100],
        };
        assert!(matches!(
            n.hold("other", &on(0)),
            Err(HoldError::Taken { gpu: 0, .. })
        ));
        assert_eq!(n.gpus[0].held_bytes(), 700);
        // The choice skips the held GPU: `other` gets the second one.
        let (_, p) = choose_hold(
            std::slice::from_ref(&n),
            "other",
            &share(700, 1),
            &cfg(),
            |_| None,
            NOW,
        )
        .unwrap();
        assert_eq!(p.gpu_indices, [1]);
        n.hold("other", &p).unwrap();
        assert_eq!(
            choose_hold(&[n], "third", &share(700, 1), &cfg(), |_| None, NOW),
            None
        );
    }

    /// A node whose one GPU holds `pods` (key, bytes).
    fn busy(name: &str, pods: &[(&str, u64)]) -> NodeLedger {
        let mut n = node(&[1000]);
        n.name = name.into();
        for (p, b) in pods {
            n.reserve(p, &[0], &[*b]);
        }
        n
    }

    #[test]
    fn the_hold_goes_where_the_fewest_pods_must_leave() {
        // Both have 400 free and 700 is needed: on `many` two 200 pods must leave, on `one`
        // its single 600 pod. Fewer pods beat fewer bytes.
        let nodes = [
            busy("many", &[("a", 200), ("b", 200), ("c", 200)]),
            busy("one", &[("d", 600)]),
        ];
        let (n, p) =
            choose_hold(&nodes, "big", &share(700, 1), &cfg(), |_| Some(NOW), NOW).unwrap();
        assert_eq!((nodes[n].name.as_str(), p.per_gpu_bytes[0]), ("one", 700));
    }

    #[test]
    fn among_as_many_pods_the_oldest_leave_first() {
        let nodes = [busy("young", &[("y", 600)]), busy("old", &[("o", 600)])];
        let started = |p: &str| Some(if p == "o" { NOW - 3600 } else { NOW - 60 });
        let (n, _) = choose_hold(&nodes, "big", &share(700, 1), &cfg(), started, NOW).unwrap();
        assert_eq!(nodes[n].name, "old");
        // And with ages alike, the fewest bytes.
        let nodes = [busy("big", &[("y", 600)]), busy("small", &[("o", 400)])];
        let (n, _) =
            choose_hold(&nodes, "big", &share(700, 1), &cfg(), |_| Some(NOW), NOW).unwrap();
        assert_eq!(nodes[n].name, "small");
    }

    #[test]
    fn a_hold_ends_at_its_deadline_or_when_the_pod_starts() {
        let hold = HoldConfig {
            after_secs: 1800,
            deadline_secs: 600,
            max_holds: 1,
        };
        let mut nodes = vec![busy("n", &[("d", 600)])];
        let mut holds = Holds::default();
        assert!(!holds.due("big", 1799, &hold), "not waited long enough");
        assert!(holds.due("big", 1800, &hold));
        let class = share(700, 1);
        let made = holds.make("big", &class, &mut nodes, &cfg(), &hold, |_| None, NOW);
        assert_eq!(made, Some(0));
        assert!(!holds.due("other", 3600, &hold), "the cap is reached");
        assert!(!fits(&nodes[0], &share(300, 1)));
        assert!(holds.expire(&mut nodes, NOW + 599).is_empty());
        assert_eq!(holds.expire(&mut nodes, NOW + 600), ["big"]);
        assert!(holds.is_empty());
        assert!(fits(&nodes[0], &share(300, 1)), "the memory is free again");
        // Made again, and ended by the pod's start.
        holds.make(
            "big",
            &class,
            &mut nodes,
            &cfg(),
            &hold,
            |_| None,
            NOW + 600,
        );
        assert_eq!(holds.get("big").unwrap().until_unix, NOW + 1200);
        assert!(holds.end("big", &mut nodes).is_some());
        assert_eq!(nodes[0].gpus[0].held_bytes(), 0);
    }
}
