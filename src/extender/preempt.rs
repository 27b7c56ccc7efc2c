//! Preempt: of the nodes the scheduler would preempt on, keep those where evicting the offered
//! victims frees enough GPU memory, and trim each victim list to the pods that must go.

use std::collections::BTreeMap;

use super::Extender;
use super::wire::{ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims};
use crate::placement::fit::{FitConfig, fit};
use crate::placement::{NodeLedger, PodShape};

/// One offered victim: the UID to answer with, its ledger key and its priority.
struct Victim {
    uid: String,
    key: String,
    priority: i32,
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
            Ok(Some(req)) => req.shape(),
        };
        let now = self.now();
        let mut kept = BTreeMap::new();
        for (node, (victims, pdb)) in offered {
            let Some(slot) = self.index.node(&node) else {
                continue;
            };
            let ledger = slot.read().ledger.clone();
            if let Some(needed) = victims_needed(&self.fit, &ledger, &shape, victims, now) {
                kept.insert(node, (needed, pdb));
            }
        }
        self.count(
            "preempt",
            if kept.is_empty() {
                "no_node"
            } else {
                "nodes_kept"
            },
        );
        answer(kept)
    }
}

/// What to evict on one node, or `None` to drop the node.
///
/// kube-scheduler rejects a node answered with no victims ("expected at least one victim"),
/// and it only offers a node because its own plugins (CPU, the GPU-memory extended resource,
/// ports) need victims gone there. So: when the pod fits the GPUs without evicting anyone,
/// the offer goes back unchanged; when evicting every offered victim still leaves no GPU(s)
/// with room, the node is dropped; otherwise the victims that hold GPU memory here are
/// trimmed to the fewest whose eviction lets the pod fit, and those holding none (offered
/// for the scheduler's own reasons) are kept.
fn victims_needed(
    cfg: &FitConfig,
    ledger: &NodeLedger,
    shape: &PodShape,
    victims: Vec<Victim>,
    now: i64,
) -> Option<Vec<Victim>> {
    if victims.is_empty() {
        return None;
    }
    let fits_without = |gone: &mut dyn Iterator<Item = &Victim>| {
        let mut l = ledger.clone();
        for v in gone {
            l.release(&v.key);
        }
        fit(&l, shape, cfg, now).is_ok()
    };
    if fits_without(&mut std::iter::empty()) {
        return Some(victims);
    }
    if !fits_without(&mut victims.iter()) {
        return None;
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
        victims.into_iter().partition(|v| held(v) > 0);
    // Lowest priority first, then the largest holder: the order both searches try them in.
    holders.sort_by_key(|v| (v.priority, std::cmp::Reverse(held(v))));
    let chosen = fewest(holders.len(), |set: &[usize]| {
        fits_without(&mut set.iter().map(|&i| &holders[i]))
    });
    let mut holders: Vec<Option<Victim>> = holders.into_iter().map(Some).collect();
    kept.extend(chosen.into_iter().filter_map(|i| holders[i].take()));
    Some(kept)
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

    /// Two 40 GiB GPUs; `held` is (pod, GPU index, GiB).
    fn node(held: &[(&str, usize, u64)]) -> NodeLedger {
        let mut n = NodeLedger::with_gpus(
            "n",
            vec![
                GpuLedger::new("GPU-0", 40 * GI),
                GpuLedger::new("GPU-1", 40 * GI),
            ],
        );
        n.observed_at_unix = Some(NOW - 1);
        for &(pod, gpu, gib) in held {
            n.reserve(pod, &[gpu], &[gib * GI]);
        }
        n
    }

    fn victim(key: &str, priority: i32) -> Victim {
        Victim {
            uid: format!("uid-{key}"),
            key: key.into(),
            priority,
        }
    }

    fn needed(n: &NodeLedger, gib: u64, victims: Vec<Victim>) -> Option<Vec<String>> {
        let shape = PodShape {
            gpus: 1,
            demand: Demand::fixed(gib * GI),
        };
        let cfg = FitConfig {
            safety_margin_bytes: 0,
            ..FitConfig::default()
        };
        victims_needed(&cfg, n, &shape, victims, NOW)
            .map(|v| v.into_iter().map(|v| v.key).collect())
    }

    #[test]
    fn a_pod_whose_gpu_memory_fits_gets_the_scheduler_offer_back_never_an_empty_list() {
        // The scheduler wants CPU freed; the GPU has room already.
        let n = node(&[("a", 0, 10)]);
        let got = needed(&n, 20, vec![victim("a", 0), victim("cpu-hog", 0)]);
        assert_eq!(got, Some(vec!["a".into(), "cpu-hog".into()]));
    }

    #[test]
    fn a_node_where_evicting_every_victim_frees_too_little_is_dropped() {
        let n = node(&[("a", 0, 20), ("b", 0, 20), ("c", 1, 20), ("d", 1, 20)]);
        assert_eq!(needed(&n, 40, vec![victim("b", 0), victim("d", 0)]), None);
        assert_eq!(needed(&n, 40, vec![]), None);
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
