//! Preempt: of the nodes the scheduler would preempt on, keep those where evicting victims frees
//! the GPU(s) the pod needs, and answer each with the fewest victims that do.
//!
//! kube-scheduler's dry run (`SelectVictimsOnNode` in `pkg/scheduler/framework/preemption`,
//! v1.36) sees GPU memory only as the node-level sum of `peakfit.io/gpu-memory-mib`: it spares
//! (reprieves) every victim whose memory the *sum* does not need, however it is split across
//! GPUs. Eight 70 GiB pods on an 8×80 GB node leave 80 GiB free in total but not 70 GiB on any
//! GPU; a `gpus: 8` pod is offered seven victims (the sum fits without the eighth), and a one-GPU
//! pod none at all. So this verb may answer with pods the scheduler did not offer:
//!
//! - `HTTPExtender.ProcessPreemption` (`pkg/scheduler/extender.go`) always reads the reply's
//!   `NodeNameToMetaVictims` and turns it back into pods with `convertToVictims`, which looks each
//!   UID up among *all* the pods of that node in the cycle's snapshot (`convertPodUIDToPod`):
//!   any pod on the node works, offered or not; a UID it does not find there fails the whole
//!   preemption attempt with an error (retried with backoff). `callExtenders`
//!   (`preemption.go`) then only rejects a node answered with no victims ("expected at least
//!   one victim pod"), and neither checks the priority of added pods: this verb never adds one
//!   whose priority is not below the preemptor's. Read from upstream's source of those functions
//!   (a copy near v1.35/v1.36); the e2e suite confirms it on the v1.36.2 binaries.
//! - `pickOneNodeForPreemption` compares nodes by their first victim's priority (it assumes the
//!   list is ordered by decreasing priority), so each answer is sorted that way.
//! - Added victims are only pods the index places on that node with a UID; a pod deleted between
//!   the scheduler's snapshot and the reply can still fail one attempt (retried).
//!
//! Which victims: from the scheduler's offer when it frees enough, else from the offer and the
//! node's other lower-priority pods; the fewest whose eviction lets the pod fit per GPU; among
//! as few, the lowest priorities first, then the scheduler's own victims before added ones (the scheduler spares a
//! victim whose eviction would break a `PodDisruptionBudget` first, so an unoffered pod may be
//! one such), then the larger holders. Victims that hold no GPU memory here (offered for CPU or
//! ports) are always kept. PDBs: the extender watches none, so `NumPDBViolations` is the
//! scheduler's count for its own offer and added victims count none; the scheduler deletes
//! victims (it does not evict them), so a PDB does not stop it, as for its own victims.
//!
//! A node the scheduler offers with no victim at all never reaches this verb in v1.36.2: the
//! dry run drops it first ("expected at least one victim pod on node"; upstream PR #135486,
//! which would pass such nodes on with an empty list, was still in review in September 2026).
//! Should one arrive with an empty list, its victims are chosen here like added ones; today
//! the one-GPU case is handled by `self_preempt`.

use std::collections::{BTreeMap, BTreeSet};

use super::Extender;
use super::wire::{ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims};
use crate::cluster::index::pod_key;
use crate::placement::fit::{FitConfig, fit};
use crate::placement::{NodeLedger, PodShape};

/// One victim, offered or added: the UID to answer with, its ledger key and its priority.
#[derive(Clone, Debug)]
pub(crate) struct Victim {
    pub uid: String,
    pub key: String,
    pub priority: i32,
    /// Offered by the scheduler (else added here).
    pub offered: bool,
}

impl Extender {
    #[tracing::instrument(skip_all, fields(verb = "preempt", pod))]
    pub fn preempt(&self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
        let Some(pod) = args.pod else {
            self.count("preempt", "error");
            return ExtenderPreemptionResult {
                node_name_to_meta_victims: Some(BTreeMap::new()),
            };
        };
        super::record_pod(&pod);
        let offered: BTreeMap<String, (Vec<Victim>, i64)> =
            match (args.node_name_to_meta_victims, args.node_name_to_victims) {
                (Some(meta), _) => meta
                    .into_iter()
                    .map(|(node, v)| {
                        let victims = v
                            .pods
                            .unwrap_or_default()
                            .into_iter()
                            .map(|m| {
                                let entry = self.index.find_pod(&m.uid, "", "");
                                Victim {
                                    key: entry.as_ref().map_or(m.uid.clone(), |e| e.key.clone()),
                                    priority: entry.map_or(0, |e| e.priority),
                                    uid: m.uid,
                                    offered: true,
                                }
                            })
                            .collect();
                        (node, (victims, v.num_pdb_violations))
                    })
                    .collect(),
                (None, Some(full)) => full
                    .into_iter()
                    .map(|(node, v)| {
                        let victims = v
                            .pods
                            .unwrap_or_default()
                            .into_iter()
                            .map(|p| {
                                let uid = p.metadata.uid.clone().unwrap_or_default();
                                let entry = self.index.find_pod(
                                    &uid,
                                    p.metadata.namespace.as_deref().unwrap_or("default"),
                                    p.metadata.name.as_deref().unwrap_or_default(),
                                );
                                Victim {
                                    key: entry.as_ref().map_or(uid.clone(), |e| e.key.clone()),
                                    priority: p
                                        .spec
                                        .as_ref()
                                        .and_then(|s| s.priority)
                                        .or(entry.map(|e| e.priority))
                                        .unwrap_or(0),
                                    uid,
                                    offered: true,
                                }
                            })
                            .collect();
                        (node, (victims, v.num_pdb_violations))
                    })
                    .collect(),
                (None, None) => BTreeMap::new(),
            };
        let answer =
            |node_victims: BTreeMap<String, (Vec<Victim>, i64)>| ExtenderPreemptionResult {
                node_name_to_meta_victims: Some(
                    node_victims
                        .into_iter()
                        .map(|(node, (v, pdb))| {
                            (
                                node,
                                MetaVictims {
                                    pods: Some(
                                        v.into_iter().map(|v| MetaPod { uid: v.uid }).collect(),
                                    ),
                                    num_pdb_violations: pdb,
                                },
                            )
                        })
                        .collect(),
                ),
            };
        let shape = match self.index.request_of(&pod) {
            Ok(None) => {
                self.count("preempt", "pass_through");
                return answer(offered);
            }
            Err(_) => {
                self.count("preempt", "invalid_annotation");
                return answer(BTreeMap::new());
            }
            Ok(Some(req)) => self.sized_pod(&req, &pod).request.shape(),
        };
        self.note_preempt_call(&pod_key(&pod));
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let me = pod_key(&pod);
        let now = self.now();
        let mut kept = BTreeMap::new();
        let mut added = false;
        for (node, (victims, pdb)) in offered {
            let Some(slot) = self.index.node(&node) else {
                continue;
            };
            // As filter sees the node for this pod: holds of lower priority are free memory.
            let ledger = slot.read().seen_by(Some(&me), priority, now).into_owned();
            let extra = self.lower_priority_pods(&node, priority, &me, &victims);
            if let Some(needed) = victims_needed(&self.fit, &ledger, &shape, victims, extra, now) {
                added |= needed.iter().any(|v| !v.offered);
                kept.insert(node, (needed, pdb));
            }
        }
        self.count(
            "preempt",
            match (kept.is_empty(), added) {
                (true, _) => "no_node",
                (false, true) => "victims_added",
                (false, false) => "nodes_kept",
            },
        );
        answer(kept)
    }

    /// The pods on `node` that may be added as victims: priority below `priority`, known by
    /// UID (the scheduler looks victims up by UID), not the preemptor, not already in `offered`.
    pub(crate) fn lower_priority_pods(
        &self,
        node: &str,
        priority: i32,
        preemptor: &str,
        offered: &[Victim],
    ) -> Vec<Victim> {
        let taken: BTreeSet<&str> = offered.iter().map(|v| v.key.as_str()).collect();
        self.index
            .pods_on(node)
            .into_iter()
            .filter(|e| e.priority < priority && e.key != preemptor)
            .filter(|e| !taken.contains(e.key.as_str()))
            .filter_map(|e| {
                Some(Victim {
                    uid: e.uid()?.to_owned(),
                    key: e.key,
                    priority: e.priority,
                    offered: false,
                })
            })
            .collect()
    }
}

/// What to evict on one node, or `None` to drop the node.
///
/// kube-scheduler rejects a node answered with no victims ("expected at least one victim"). So:
/// when the pod fits the GPUs without evicting anyone, the offer goes back unchanged (the
/// scheduler wants them gone for its own reasons), or the node is dropped if there is no offer.
/// Otherwise the GPU-memory holders of the offer are narrowed to the fewest whose eviction lets
/// the pod fit; when the whole offer cannot free enough, `extra` (lower-priority pods of the
/// node the scheduler spared) joins it first, and the node is dropped if even evicting all of
/// them leaves no GPU(s) with room. Offered victims holding no GPU memory here are kept. The answer is ordered by decreasing priority, as the
/// scheduler's node choice expects.
pub(crate) fn victims_needed(
    cfg: &FitConfig,
    ledger: &NodeLedger,
    shape: &PodShape,
    offered: Vec<Victim>,
    extra: Vec<Victim>,
    now: i64,
) -> Option<Vec<Victim>> {
    let fits_without = |gone: &mut dyn Iterator<Item = &Victim>| {
        let mut l = ledger.clone();
        for v in gone {
            l.release(&v.key);
        }
        fit(&l, shape, cfg, now).is_ok()
    };
    if fits_without(&mut std::iter::empty()) {
        return (!offered.is_empty()).then_some(offered);
    }
    let held = |v: &Victim| -> u64 {
        ledger
            .gpus
            .iter()
            .filter_map(|g| g.reservation(&v.key))
            .map(peakfit_core::placement::Reservation::charged_bytes)
            .sum()
    };
    let (mut holders, mut kept): (Vec<Victim>, Vec<Victim>) =
        offered.into_iter().partition(|v| held(v) > 0);
    // Pods the scheduler did not offer only when its offer cannot free enough.
    if !fits_without(&mut holders.iter()) {
        holders.extend(extra.into_iter().filter(|v| held(v) > 0));
        if !fits_without(&mut holders.iter()) {
            return None;
        }
    }
    // Lowest priority first, the scheduler's own before added ones, then the largest holder:
    // the order both searches try them in.
    holders.sort_by_key(|v| (v.priority, !v.offered, std::cmp::Reverse(held(v))));
    let chosen = fewest(holders.len(), |set: &[usize]| {
        fits_without(&mut set.iter().map(|&i| &holders[i]))
    });
    let mut holders: Vec<Option<Victim>> = holders.into_iter().map(Some).collect();
    kept.extend(chosen.into_iter().filter_map(|i| holders[i].take()));
    kept.sort_by_key(|v| std::cmp::Reverse(v.priority));
    (!kept.is_empty()).then_some(kept)
}

/// Up to this many GPU-holding victims on a node, the fewest are found by trying every set of
/// each size in turn (at most 2^12 fits of a node's ledger, well under a millisecond each);
/// above it, greedily.
const EXACT_SEARCH_MAX: usize = 12;

/// Indices (into candidates `0..n`, ordered by preference) of the smallest set for which
/// `enough` holds, given that the whole set is enough. Among sets of the smallest size the first
/// in lexicographic order wins, so lower-priority, larger victims go first.
fn fewest(n: usize, enough: impl Fn(&[usize]) -> bool) -> Vec<usize> {
    if n <= EXACT_SEARCH_MAX {
        for size in 1..n {
            let mut set: Vec<usize> = (0..size).collect();
            loop {
                if enough(&set) {
                    return set;
                }
                // Next combination of `size` out of `n`, in lexicographic order.
                let Some(i) = (0..size).rev().find(|&i| set[i] < n - size + i) else {
                    break;
                };
                set[i] += 1;
                for j in i + 1..size {
                    set[j] = set[j - 1] + 1;
                }
            }
        }
        return (0..n).collect();
    }
    // Take victims in order until enough, then spare every one (latest first) not needed.
    let mut chosen: Vec<usize> = Vec::new();
    for i in 0..n {
        if enough(&chosen) {
            break;
        }
        chosen.push(i);
    }
    let mut k = chosen.len();
    while k > 0 {
        k -= 1;
        let rest: Vec<usize> = chosen
            .iter()
            .enumerate()
            .filter_map(|(j, &v)| (j != k).then_some(v))
            .collect();
        if enough(&rest) {
            chosen.remove(k);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Demand, GpuLedger};

    const GI: u64 = 1 << 30;
    const NOW: i64 = 1_000_000;

    /// `n` GPUs of `gib` GiB; `held` is (pod, GPU index, GiB).
    fn gpus(n: usize, gib: u64, held: &[(&str, usize, u64)]) -> NodeLedger {
        let mut node = NodeLedger::with_gpus(
            "n",
            (0..n)
                .map(|i| GpuLedger::new(format!("GPU-{i}"), gib * GI))
                .collect(),
        );
        node.observed_at_unix = Some(NOW - 1);
        for &(pod, gpu, gib) in held {
            node.reserve(pod, &[gpu], &[gib * GI]);
        }
        node
    }

    /// Two 40 GiB GPUs.
    fn node(held: &[(&str, usize, u64)]) -> NodeLedger {
        gpus(2, 40, held)
    }

    fn victim(key: &str, priority: i32) -> Victim {
        Victim {
            uid: format!("uid-{key}"),
            key: key.into(),
            priority,
            offered: true,
        }
    }

    fn spared(key: &str, priority: i32) -> Victim {
        Victim {
            offered: false,
            ..victim(key, priority)
        }
    }

    fn choose(
        n: &NodeLedger,
        gpus: u32,
        gib: u64,
        offer: Vec<Victim>,
        extra: Vec<Victim>,
    ) -> Option<Vec<String>> {
        let shape = PodShape {
            gpus,
            demand: Demand::fixed(gib * GI),
        };
        let cfg = FitConfig {
            safety_margin_bytes: 0,
            ..FitConfig::default()
        };
        victims_needed(&cfg, n, &shape, offer, extra, NOW)
            .map(|v| v.into_iter().map(|v| v.key).collect())
    }

    fn needed(n: &NodeLedger, gib: u64, victims: Vec<Victim>) -> Option<Vec<String>> {
        choose(n, 1, gib, victims, Vec::new())
    }

    /// Eight H100s (80 GiB), each held by one 70 GiB pod `p0`..`p7`.
    fn full_h100x8() -> NodeLedger {
        let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
        let held: Vec<(&str, usize, u64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i, 70))
            .collect();
        gpus(8, 80, &held)
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn a_pod_whose_gpu_memory_fits_gets_the_scheduler_offer_back_never_an_empty_list() {
        // The scheduler wants CPU freed; the GPU has room already.
        let n = node(&[("a", 0, 10)]);
        let got = needed(&n, 20, vec![victim("a", 0), victim("cpu-hog", 0)]);
        assert_eq!(got, Some(vec!["a".into(), "cpu-hog".into()]));
        // No offer and nothing to free: the node goes (an empty list is refused upstream).
        assert_eq!(choose(&n, 1, 20, vec![], vec![spared("a", 0)]), None);
    }

    #[test]
    fn a_node_where_evicting_every_lower_priority_pod_frees_too_little_is_dropped() {
        let n = node(&[("a", 0, 20), ("b", 0, 20), ("c", 1, 20), ("d", 1, 20)]);
        assert_eq!(needed(&n, 40, vec![victim("b", 0), victim("d", 0)]), None);
        assert_eq!(needed(&n, 40, vec![]), None);
        // `a` and `c` are of the preemptor's priority or above: the caller leaves them out.
        assert_eq!(choose(&n, 2, 30, vec![victim("b", 0)], vec![]), None);
    }

    #[test]
    fn the_fewest_victims_that_free_one_gpu_are_chosen() {
        // Greedy by priority would take a, b (GPU 0 empty); one eviction, d, frees GPU 1 enough.
        let n = node(&[("a", 0, 15), ("b", 0, 15), ("c", 1, 5), ("d", 1, 30)]);
        let offer = vec![
            victim("a", 0),
            victim("b", 0),
            victim("c", 1),
            victim("d", 1),
        ];
        assert_eq!(needed(&n, 30, offer), Some(vec!["d".into()]));
    }

    #[test]
    fn among_equally_few_the_lowest_priority_goes() {
        let n = node(&[("hi", 0, 30), ("lo", 1, 30)]);
        let offer = vec![victim("hi", 5), victim("lo", 1)];
        assert_eq!(needed(&n, 30, offer), Some(vec!["lo".into()]));
    }

    #[test]
    fn victims_holding_no_gpu_memory_are_kept_for_the_scheduler() {
        let n = node(&[("a", 0, 35), ("b", 1, 35)]);
        let offer = vec![victim("cpu-hog", 0), victim("a", 0), victim("b", 0)];
        assert_eq!(
            needed(&n, 30, offer),
            Some(vec!["cpu-hog".into(), "a".into()])
        );
    }

    #[test]
    fn eight_gpus_each_full_the_spared_eighth_pod_is_added_to_the_seven_offered() {
        // The scheduler's node-level sum (640 GiB, 560 held, 560 wanted) spares one pod.
        let n = full_h100x8();
        let offer: Vec<Victim> = (0..7).map(|i| victim(&format!("p{i}"), 100)).collect();
        let extra = vec![spared("p7", 100)];
        let got = choose(&n, 8, 70, offer, extra).expect("the node is kept");
        assert_eq!(
            sorted(got),
            (0..8).map(|i| format!("p{i}")).collect::<Vec<_>>()
        );
        // Without the extra pod the node cannot be answered.
        let offer: Vec<Victim> = (0..7).map(|i| victim(&format!("p{i}"), 100)).collect();
        assert_eq!(choose(&n, 8, 70, offer, vec![]), None);
    }

    #[test]
    fn a_one_gpu_pod_on_a_full_node_offered_nothing_takes_the_lowest_priority_pod_alone() {
        // What an empty offer (upstream PR #135486) would bring: one victim, the cheapest.
        let n = full_h100x8();
        let extra: Vec<Victim> = (0..8)
            .map(|i| spared(&format!("p{i}"), [50, 10, 30, 10, 70, 90, 20, 60][i]))
            .collect();
        let got = choose(&n, 1, 70, vec![], extra).unwrap();
        // Two pods of priority 10: the larger holder, then the first in order.
        assert_eq!(got, vec!["p1".to_owned()]);
    }

    #[test]
    fn mixed_priorities_fewest_first_then_lowest_then_offered_before_added() {
        // Four 80 GiB GPUs: GPU 0 has two 30 GiB pods of priority 1, GPU 1 one 70 GiB pod of
        // priority 5, GPU 2 one of priority 5 the scheduler spared, GPU 3 one of priority 9.
        let n = gpus(
            4,
            80,
            &[
                ("lo-a", 0, 30),
                ("lo-b", 0, 30),
                ("mid", 1, 70),
                ("mid-spared", 2, 70),
                ("top", 3, 70),
            ],
        );
        let all = || {
            (
                vec![
                    victim("lo-a", 1),
                    victim("lo-b", 1),
                    victim("mid", 5),
                    victim("top", 9),
                ],
                vec![spared("mid-spared", 5)],
            )
        };
        // 60 GiB on one GPU: GPU 0 needs both priority-1 pods gone (one leaves 50 GiB free), so
        // the fewest is one 70 GiB pod of priority 5, the offered one before the spared one.
        let (o, e) = all();
        assert_eq!(choose(&n, 1, 60, o, e), Some(vec!["mid".to_owned()]));
        // 50 GiB: one priority-1 pod frees enough.
        let (o, e) = all();
        assert_eq!(choose(&n, 1, 50, o, e), Some(vec!["lo-a".to_owned()]));
        // Three GPUs of 60 GiB: the offer frees GPUs 0, 1 and 3 (four victims) and is kept to,
        // though adding `mid-spared` would take three; ordered by decreasing priority.
        let (o, e) = all();
        assert_eq!(
            choose(&n, 3, 60, o, e),
            Some(vec![
                "top".to_owned(),
                "mid".to_owned(),
                "lo-a".to_owned(),
                "lo-b".to_owned()
            ])
        );
        // Without `top` in the offer it frees two GPUs only: spared pods join, and the fewest
        // of all is three victims.
        let offer = vec![victim("lo-a", 1), victim("lo-b", 1), victim("mid", 5)];
        let extra = vec![spared("mid-spared", 5), spared("top", 9)];
        assert_eq!(
            choose(&n, 3, 60, offer, extra),
            Some(vec![
                "top".to_owned(),
                "mid".to_owned(),
                "mid-spared".to_owned()
            ])
        );
    }

    #[test]
    fn partial_fits_evict_only_what_the_pod_s_gpus_need() {
        // Eight 80 GiB GPUs with 40 GiB pods: GPUs 0-3 hold one each (40 free), GPUs 4-7 two
        // each (full). A 2-GPU pod of 40 GiB fits already; of 50 GiB it needs two one-pod GPUs
        // emptied, never a two-pod one.
        let mut held = Vec::new();
        let names: Vec<String> = (0..12).map(|i| format!("q{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let gpu = if i < 4 { i } else { 4 + (i - 4) / 2 };
            held.push((name.as_str(), gpu, 40));
        }
        let n = gpus(8, 80, &held);
        let extra = || names.iter().map(|k| spared(k, 0)).collect::<Vec<_>>();
        assert_eq!(
            choose(&n, 2, 40, vec![victim("q0", 0)], extra()),
            Some(vec!["q0".to_owned()])
        );
        let got = choose(&n, 2, 50, vec![], extra()).unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|k| names[..4].contains(k)), "{got:?}");
        // Five GPUs of 50 GiB: the four one-pod GPUs and one two-pod GPU: six victims.
        let got = choose(&n, 5, 50, vec![], extra()).unwrap();
        assert_eq!(got.len(), 6, "{got:?}");
    }

    #[test]
    fn fewest_is_exact_up_to_the_limit_and_minimal_above_it() {
        // Enough = the chosen sizes add up to 10; sizes favour a pair at the end.
        let sizes = [3u32, 3, 3, 3, 6, 4];
        let enough = |set: &[usize]| set.iter().map(|&i| sizes[i]).sum::<u32>() >= 10;
        assert_eq!(fewest(sizes.len(), enough), vec![4, 5]);
        let many: Vec<u32> = (0..20).map(|i| if i < 18 { 1 } else { 9 }).collect();
        let enough = |set: &[usize]| set.iter().map(|&i| many[i]).sum::<u32>() >= 10;
        let got = fewest(many.len(), enough);
        assert!(enough(&got), "{got:?}");
        for k in 0..got.len() {
            let mut rest = got.clone();
            rest.remove(k);
            assert!(!enough(&rest), "{got:?} minus {k} is still enough");
        }
    }
}
