//! Interning of node states: nodes whose ledgers score alike (`placement::signature`) share one
//! [`StateScores`], so that a pod class is scored once per state rather than once per node.

use std::collections::HashMap;
use std::sync::Arc;

use super::scores::StateScores;
use crate::placement::ScoreInputs;

/// The node states, and the size at which states no node holds any more are dropped.
#[derive(Default)]
pub(super) struct States {
    by_inputs: HashMap<ScoreInputs, Arc<StateScores>, foldhash::fast::RandomState>,
    prune_at: usize,
}

impl States {
    pub(super) fn of(&mut self, inputs: ScoreInputs) -> Arc<StateScores> {
        if let Some(known) = self.by_inputs.get(&inputs) {
            return known.clone();
        }
        if self.by_inputs.len() >= self.prune_at {
            self.by_inputs.retain(|_, s| Arc::strong_count(s) > 1);
            self.prune_at = (2 * self.by_inputs.len()).max(1024);
        }
        let scores = Arc::new(StateScores::default());
        self.by_inputs.insert(inputs, scores.clone());
        scores
    }
}
