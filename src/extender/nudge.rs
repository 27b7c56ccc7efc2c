//! Telling kube-scheduler that a node can take waiting pods again.
//!
//! kube-scheduler does not watch `NodeGpuReports`, and a pod the extender refused waits in its
//! unschedulable queue until a Pod or Node event moves it, or its 5-minute flush: a node whose
//! report turned fresh again, or whose memory freed (a pod deleted while the scheduler's retry
//! raced the extender's watch, or memory freed only in a report), would leave its pods waiting
//! for minutes. So while pods wait, each tick compares every node's usability and free memory
//! per GPU with the last tick and, where they improved, bumps an annotation on the Node
//! (field manager `peakfit-extender`): an annotation change is a Node update event, which moves
//! the pods the extender refused back to the scheduler's active queue.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use super::Extender;
use crate::cluster::binding::FIELD_MANAGER;
use crate::placement::fit::node_usable;

/// The Node annotation bumped (RFC 3339 time of the change).
pub const CAPACITY_CHANGED_AT: &str = "peakfit.io/capacity-changed-at";

/// What a node offers now: whether it is usable, and the free bytes of each GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Offer {
    usable: bool,
    free: Vec<u64>,
}

impl Offer {
    /// More than `before`: usable again, or usable with some GPU freer (a changed GPU set
    /// counts as more).
    fn improves_on(&self, before: &Offer) -> bool {
        self.usable
            && (!before.usable
                || self.free.len() != before.free.len()
                || self.free.iter().zip(&before.free).any(|(a, b)| a > b))
    }
}

impl Extender {
    /// The nodes that offer more than at the last call (all nodes' offers are remembered).
    fn improved_nodes(&self, last: &mut HashMap<String, Offer>) -> Vec<String> {
        let now = self.now();
        let mut improved = Vec::new();
        let mut seen = HashMap::with_capacity(last.len());
        for slot in self.index.all_slots() {
            let st = slot.read();
            let offer = Offer {
                usable: node_usable(&st.ledger, &self.fit, now).is_ok(),
                free: st
                    .ledger
                    .gpus
                    .iter()
                    .map(peakfit_core::placement::GpuLedger::free_bytes)
                    .collect(),
            };
            let name = st.ledger.name.clone();
            if last.get(&name).is_some_and(|b| offer.improves_on(b)) {
                improved.push(name.clone());
            }
            seen.insert(name, offer);
        }
        *last = seen;
        improved
    }

    /// Whether any pod that still exists waits after filter refused it everywhere.
    fn pods_wait(&self) -> bool {
        let mut p = self.pending.lock();
        p.retain(|key, _| self.index.contains_pod(key));
        !p.is_empty()
    }
}

/// Runs the nudger every `every` until the process ends.
pub fn spawn(ext: Arc<Extender>, client: kube::Client, every: Duration) {
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let mut last = HashMap::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let improved = ext.improved_nodes(&mut last);
            if improved.is_empty() || !ext.pods_wait() {
                continue;
            }
            let at = jiff::Timestamp::now().to_string();
            let patch =
                serde_json::json!({ "metadata": { "annotations": { CAPACITY_CHANGED_AT: at } } });
            for name in improved {
                match nodes.patch(&name, &params, &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        ext.metrics.node_nudges.inc();
                        tracing::debug!(node = %name, "node can take waiting pods: nudged the scheduler");
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, error = %e, "could not annotate the node to retry waiting pods");
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::Offer;

    #[test]
    fn more_free_memory_or_usable_again_is_an_improvement() {
        let o = |usable, free: &[u64]| Offer {
            usable,
            free: free.to_vec(),
        };
        assert!(o(true, &[10, 5]).improves_on(&o(true, &[10, 4])));
        assert!(o(true, &[1]).improves_on(&o(false, &[1])));
        assert!(!o(true, &[10, 4]).improves_on(&o(true, &[10, 5])));
        assert!(!o(true, &[10]).improves_on(&o(true, &[10])));
        assert!(!o(false, &[20]).improves_on(&o(true, &[10])));
    }
}
