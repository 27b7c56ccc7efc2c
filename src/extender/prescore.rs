//! Scores the workload's usual pod classes on every node ahead of the requests, so that
//! prioritize finds them in the nodes' memos (`placement::memo`) even on the first pod of a new
//! run of replicas.
//!
//! Without it, the first pod of each run pays for scoring every node (a few milliseconds for
//! 5,000 nodes) while the rest of the run is answered from the memos. The classes worth keeping
//! warm are the shape mix's heaviest ones, the same ones scoring already weighs fragmentation by.
//! After a bind a pass rescores that one node; after a new mix, every node once; with nothing
//! changed it does nothing (visiting every node on every pass cost tail latency: `docs/tuning.md`).

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Extender;
use super::prioritize::{NodeScoring, Scored};
use crate::cluster::index::{NodeSlot, StateScores};
use crate::placement::fit::node_usable;
use crate::placement::memo::ScoreMemo;
use crate::placement::{PodClass, ShapeMix};

/// What the last pass kept warm: while the mix and its classes stay the same, a pass only needs
/// the nodes that changed since.
#[derive(Debug, Default)]
pub struct Warmed {
    mix_generation: u64,
    class_ids: Vec<u64>,
    /// Passes since the last one over every node.
    partial_passes: u32,
}

/// Every this many passes, one goes over every node anyway: requests for classes outside the
/// warm set can push a warm score out of a memo that no ledger change would bring back.
const FULL_PASS_EVERY: u32 = 50;

impl Extender {
    /// Scores the mix's heaviest classes wherever a node's memo lacks them: when a new mix is
    /// staged (`ShapeStats::stage_new_mixes`), on every node under that mix, and then makes it
    /// the mix prioritize uses; else after the mix changed, on every node; else on the nodes
    /// whose ledger changed since the last pass. Returns how many scores it computed. Runs on
    /// the calling thread, one node and class at a time, never holding a node longer than one
    /// scoring.
    pub fn prescore(&self) -> usize {
        self.index.track_changes();
        let changed = self.index.take_changed();
        let (live, staged) = {
            let shapes = self.shapes.lock();
            (shapes.mix(), shapes.staged())
        };
        if let Some(staged) = staged {
            let computed = self.warm(&self.index.all_slots(), &staged, live.generation());
            let promoted = self.shapes.lock().promote(&staged);
            if promoted {
                // Every node was just scored under it: the next pass only needs what changes.
                *self.warmed.lock() = Warmed {
                    mix_generation: staged.generation(),
                    class_ids: self.heaviest(&staged).iter().map(|c| c.1).collect(),
                    partial_passes: 0,
                };
            }
            return computed;
        }
        if live.is_empty() {
            return 0;
        }
        let partial = {
            let class_ids: Vec<u64> = self.heaviest(&live).iter().map(|c| c.1).collect();
            let mut warmed = self.warmed.lock();
            let partial = warmed.mix_generation == live.generation()
                && warmed.class_ids == class_ids
                && warmed.partial_passes < FULL_PASS_EVERY;
            *warmed = Warmed {
                mix_generation: live.generation(),
                class_ids,
                partial_passes: if partial {
                    warmed.partial_passes + 1
                } else {
                    0
                },
            };
            partial
        };
        let slots = if partial {
            self.index.slots_named(&changed)
        } else {
            self.index.all_slots()
        };
        self.warm(&slots, &live, live.generation())
    }

    /// The mix's heaviest classes (at most `ScoreMemo::PRESCORED`) and their ids.
    fn heaviest<'m>(&self, mix: &'m ShapeMix) -> Vec<(&'m PodClass, u64)> {
        let mut heaviest: Vec<&(PodClass, f64)> = mix.shapes().iter().collect();
        heaviest.sort_by(|a, b| b.1.total_cmp(&a.1));
        heaviest.truncate(ScoreMemo::PRESCORED);
        let mut ids = self.class_ids.lock();
        heaviest.iter().map(|(c, _)| (c, ids.id(c))).collect()
    }

    /// Scores `mix`'s heaviest classes on `slots` where their memos lack them; `live_mix` is the
    /// generation of the mix prioritize uses now, whose scores the memos keep beside these.
    fn warm(&self, slots: &[Arc<NodeSlot>], mix: &ShapeMix, live_mix: u64) -> usize {
        if mix.is_empty() {
            return 0;
        }
        let classes = self.heaviest(mix);
        let now = self.now();
        let mut computed = 0;
        let batches: Vec<NodeScoring> = classes
            .iter()
            .map(|&(class, class_id)| NodeScoring {
                class,
                class_id,
                mix,
                live_mix,
                now,
                pod: None,
            })
            .collect();
        // Nodes alike share one memo: each state is warmed once, through its first usable node
        // (a pass over 5,000 nodes of a hundred states touches a hundred memos, not 5,000).
        // The states are held until the pass ends, so that an address is not reused.
        let mut warmed: Vec<Arc<StateScores>> = Vec::new();
        let mut seen: HashSet<usize, foldhash::fast::FixedState> = HashSet::default();
        for slot in slots {
            {
                let st = slot.read();
                if node_usable(&st.ledger, &self.fit, now).is_err()
                    || !seen.insert(Arc::as_ptr(st.scores()) as usize)
                {
                    continue;
                }
                warmed.push(st.scores().clone());
            }
            for batch in &batches {
                match self.node_score(slot, batch) {
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
        // New mixes now wait for a pass to warm them (see `prescore`).
        self.shapes.lock().stage_new_mixes();
        std::thread::Builder::new()
            .name("peakfit-prescore".into())
            .spawn(move || {
                crate::background::lower_priority(PRESCORE_NICE);
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

/// The prescorer's nice value, the lowest: what it computes is a head start, never worth a
/// request's time. A pass over a new mix solves its fill patterns and, where no two nodes are
/// alike, scores thousands of states (tens of milliseconds of CPU) while each request wants
/// every core for its parallel scan; at nice 19 it gets what the requests leave
/// (`docs/tuning.md`).
const PRESCORE_NICE: i32 = 19;
