//! Prioritize: among the nodes that fit, which wastes least (placement's scoring, 0-10).

use super::Extender;
use super::filter::Candidates;
use super::wire::{ExtenderArgs, HostPriority, HostPriorityList, MAX_EXTENDER_PRIORITY};
use crate::cluster::index::pod_request_of;
use crate::placement::fit::fit;
use crate::placement::score;

/// The score of every node for pods peakfit does not place: the same for all, so it changes
/// nothing in the scheduler's ranking.
pub const NEUTRAL_SCORE: i64 = 0;

impl Extender {
    /// Scores every candidate; a node the pod does not fit gets 0. A request without a pod or
    /// candidates gets an empty list (the scheduler ignores prioritize failures anyway).
    pub fn prioritize(&self, args: ExtenderArgs) -> HostPriorityList {
        let Ok((pod, candidates)) = Candidates::from_args(args) else {
            self.count("prioritize", "error");
            return Vec::new();
        };
        let neutral = || {
            candidates
                .names()
                .map(|n| HostPriority {
                    host: n.to_owned(),
                    score: NEUTRAL_SCORE,
                })
                .collect()
        };
        let Ok(Some(req)) = pod_request_of(&pod) else {
            self.count("prioritize", "pass_through");
            return neutral();
        };
        let shape = req.shape();
        let now = self.now();
        self.count("prioritize", "scored");
        candidates
            .names()
            .map(|name| {
                let score = self.index.node(name).map_or(0, |slot| {
                    let st = slot.read();
                    fit(&st.ledger, &shape, &self.fit, now).map_or(0, |p| {
                        i64::from(score(&st.ledger, &shape, &p, self.scoring))
                            .clamp(0, MAX_EXTENDER_PRIORITY)
                    })
                });
                HostPriority {
                    host: name.to_owned(),
                    score,
                }
            })
            .collect()
    }
}
