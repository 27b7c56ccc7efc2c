//! Preempt: of the nodes the scheduler would preempt on, keep those where evicting the offered
//! victims frees enough GPU memory, and trim each victim list to the pods that must go.

use std::collections::BTreeMap;

use super::Extender;
use super::wire::{ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims};
use crate::cluster::index::pod_request_of;
use crate::placement::fit::fit;
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
        let shape = match pod_request_of(&pod) {
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
            if let Some(needed) = self.victims_needed(&ledger, &shape, victims, now) {
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

    /// The fewest victims (lowest priority first) whose eviction lets the pod fit, or `None`
    /// when evicting them all would not free enough.
    fn victims_needed(
        &self,
        ledger: &NodeLedger,
        shape: &PodShape,
        mut victims: Vec<Victim>,
        now: i64,
    ) -> Option<Vec<Victim>> {
        let fits_without = |gone: &[&Victim]| {
            let mut l = ledger.clone();
            for v in gone {
                l.release(&v.key);
            }
            fit(&l, shape, &self.fit, now).is_ok()
        };
        if !fits_without(&victims.iter().collect::<Vec<_>>()) {
            return None;
        }
        let held = |v: &Victim| -> u64 {
            ledger
                .gpus
                .iter()
                .filter_map(|g| g.reservation(&v.key))
                .map(|r| r.charged_bytes())
                .sum()
        };
        victims.sort_by_key(|v| (v.priority, std::cmp::Reverse(held(v))));
        // Evict the lowest-priority pods until the pod fits...
        let mut chosen: Vec<Victim> = Vec::new();
        for v in victims {
            if fits_without(&chosen.iter().collect::<Vec<_>>()) {
                break;
            }
            chosen.push(v);
        }
        // ...then spare, highest priority first, every one the fit does not need after all.
        let mut i = chosen.len();
        while i > 0 {
            i -= 1;
            let rest: Vec<&Victim> = chosen
                .iter()
                .enumerate()
                .filter_map(|(j, v)| (j != i).then_some(v))
                .collect();
            if fits_without(&rest) {
                chosen.remove(i);
            }
        }
        Some(chosen)
    }
}
