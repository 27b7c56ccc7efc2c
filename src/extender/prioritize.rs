//! Prioritize: among the nodes that fit, which wastes least (placement's scoring, 0-10).

use super::Extender;
use rayon::prelude::*;

use super::filter::{Candidates, PARALLEL_FROM};
use super::wire::{ExtenderArgs, HostPriority, HostPriorityList, MAX_EXTENDER_PRIORITY};
use crate::cluster::index::NodeSlot;
use crate::cluster::index::pod_request_of;
use crate::placement::{PodClass, place_score, scores_0_to_10};

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
        let neutral = |candidates: Candidates| {
            candidates
                .into_names()
                .into_iter()
                .map(|host| HostPriority {
                    host,
                    score: NEUTRAL_SCORE,
                })
                .collect()
        };
        let Ok(Some(req)) = pod_request_of(&pod) else {
            self.count("prioritize", "pass_through");
            return neutral(candidates);
        };
        let class = PodClass::from(req.shape());
        let mix = self.shapes.lock().mix();
        let now = self.now();
        self.count("prioritize", "scored");
        let slots = self.index.slots(candidates.names());
        let raw_score = |slot: &Option<std::sync::Arc<NodeSlot>>| {
            slot.as_ref().map_or(f64::NAN, |slot| {
                let st = slot.read();
                place_score(&st.ledger, &class, self.scoring, &mix, &self.fit, now)
                    .unwrap_or(f64::NAN)
            })
        };
        let raw: Vec<f64> = if slots.len() >= PARALLEL_FROM {
            slots.par_iter().map(raw_score).collect()
        } else {
            slots.iter().map(raw_score).collect()
        };
        // Placement ranks the nodes against each other: the best gets 10, a node the pod does
        // not fit 0.
        candidates
            .into_names()
            .into_iter()
            .zip(scores_0_to_10(&raw))
            .map(|(host, score)| HostPriority {
                host,
                score: i64::from(score).clamp(0, MAX_EXTENDER_PRIORITY),
            })
            .collect()
    }
}
