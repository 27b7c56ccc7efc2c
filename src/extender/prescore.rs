//! Scores the workload's usual pod classes on every node ahead of the requests, so that
//! prioritize finds them in the nodes' memos (`placement::memo`) even on the first pod of a new
//! run of replicas.
//!
//! Without it, the first pod of each run pays for scoring every node (a few milliseconds for
//! 5,000 nodes) while the rest of the run is answered from the memos. The classes worth keeping
//! warm are the shape mix's heaviest ones, the same ones scoring already weighs fragmentation by.
//! A pass that finds everything warm costs one lock and a few compares per node; after a bind it
//! rescores one node, after a new mix every node once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Extender;
use super::prioritize::Scored;
use crate::placement::PodClass;
use crate::placement::memo::ScoreMemo;

impl Extender {
    /// Scores the mix's heaviest classes on every node whose memo lacks them; returns how many
    /// scores it computed. Runs on the calling thread, one node and class at a time, never
    /// holding a node longer than one scoring.
    pub fn prescore(&self) -> usize {
        let mix = self.mix();
        if mix.is_empty() {
            return 0;
        }
        let mut heaviest: Vec<&(PodClass, f64)> = mix.shapes().iter().collect();
        heaviest.sort_by(|a, b| b.1.total_cmp(&a.1));
        heaviest.truncate(ScoreMemo::PRESCORED);
        let classes: Vec<(&PodClass, u64)> = {
            let mut ids = self.class_ids.lock();
            heaviest.iter().map(|(c, _)| (c, ids.id(c))).collect()
        };
        let now = self.now();
        let mut computed = 0;
        for slot in self.index.all_slots() {
            for &(class, class_id) in &classes {
                match self.node_score(&slot, class, class_id, &mix, now) {
                    None => break, // the node takes no pod now: nothing to keep warm
                    Some(Scored::Computed(_)) => computed += 1,
                    Some(Scored::Remembered(_)) => {}
                }
            }
        }
        self.count_scores("prescored", computed as u64);
        computed
    }

    /// Runs `prescore` every `every` on a thread of its own (not the request threads' pool)
    /// until the extender is dropped.
    pub fn spawn_prescorer(self: &Arc<Self>, every: Duration) -> std::io::Result<()> {
        let ext: Weak<Extender> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("peakfit-prescore".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    let Some(ext) = ext.upgrade() else { return };
                    let n = ext.prescore();
                    if n > 0 {
                        tracing::trace!(scores = n, "prescored");
                    }
                }
            })
            .map(|_| ())
    }
}
