//! Prioritize: among the nodes that fit, which wastes least (placement's scoring, 0-10).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Extender;

use super::filter::Candidates;
use super::wire::{ExtenderArgs, HostPriority, HostPriorityList, MAX_EXTENDER_PRIORITY};
use crate::cluster::index::{NodeSlot, pod_key};
use crate::cluster::resources::{host_claim_of, host_request_of};
use crate::placement::fit::node_usable;
use crate::placement::memo::MemoKey;
use crate::placement::{
    Demand, NodeLedger, PodClass, PodKey, PodShape, ShapeMix, place_score, scores_0_to_10_unique,
    stable_name_hash, used_share,
};

/// The score of every node for a pod whose annotations do not parse: the same for all, so it
/// changes nothing in the scheduler's ranking.
pub const NEUTRAL_SCORE: i64 = 0;

impl Extender {
    /// Scores every candidate; a node the pod does not fit gets 0. A pod without peakfit
    /// annotations (no GPU of peakfit's) is scored by its CPU alone, nodes without usable GPUs
    /// first. A request without a pod or candidates gets an empty list (the scheduler ignores
    /// prioritize failures anyway).
    #[tracing::instrument(skip_all, fields(verb = "prioritize", pod))]
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
        let (class, gpuless) = match self.index.request_of(&pod) {
            Ok(Some(req)) => {
                let req = self.sized_pod(&req, &pod).request;
                (self.class_of(&req, &host_request_of(&pod)), false)
            }
            // Not peakfit's to place on a GPU, but the CPU it takes on a GPU node can leave that
            // node's free GPUs without the CPU the pods that need them ask for. Its GPU
            // products are not read: they would not change the score.
            Ok(None) => (gpuless_class(host_claim_of(&pod).cpu_milli), true),
            Err(_) => {
                self.count("prioritize", "pass_through");
                return neutral(candidates);
            }
        };
        let mix = self.shapes.lock().mix();
        let class_id = self.class_ids.lock().id(&class);
        let now = self.now();
        self.count(
            "prioritize",
            if gpuless { "scored_gpuless" } else { "scored" },
        );
        let names: Vec<&str> = candidates.names().collect();
        let scoring = NodeScoring::request(
            &class,
            class_id,
            &mix,
            now,
            (!gpuless).then(|| {
                (
                    pod_key(&pod),
                    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
                )
            }),
        );
        let ints = self.rank(&names, &scoring, gpuless).ints;
        candidates
            .into_names()
            .into_iter()
            .zip(ints)
            .map(|(host, score)| HostPriority {
                host,
                score: i64::from(score).clamp(0, MAX_EXTENDER_PRIORITY),
            })
            .collect()
    }
}

/// The nodes of one request as prioritize ranks them: the 0-10 scores it answers, and the raw
/// placement scores they come from (NaN: the pod does not fit).
pub(crate) struct Ranking {
    pub ints: Vec<u8>,
    raw: Vec<f64>,
}

impl Extender {
    /// Scores `names` for `scoring`'s class (from the nodes' memos where they hold it) and
    /// ranks them as prioritize answers: the best gets 10, a node the pod does not fit 0.
    /// Exactly one node gets 10 (kube-scheduler would pick at random among equal totals and
    /// scatter pods over identical empty nodes): among equally good nodes the fuller, then the
    /// one whose name hashes highest.
    pub(crate) fn rank(&self, names: &[&str], scoring: &NodeScoring, gpuless: bool) -> Ranking {
        let (remembered, computed) = (AtomicU64::new(0), AtomicU64::new(0));
        // A node without usable GPUs (unknown to peakfit, no or a stale report, NVML down, no
        // GPUs at all): no GPU pod can be placed there now, so a GPU-less pod strands nothing
        // by taking its CPU. Marked here, ranked above every GPU node below.
        let no_gpus = if gpuless { f64::INFINITY } else { f64::NAN };
        let mut raw = self.index.map_slots(names, |slot| {
            let Some(slot) = slot else { return no_gpus };
            if gpuless && slot.read().ledger.gpus.is_empty() {
                return no_gpus;
            }
            match self.node_score(slot, scoring) {
                None => no_gpus,
                Some(Scored::Remembered(score)) => {
                    remembered.fetch_add(1, Ordering::Relaxed);
                    score
                }
                Some(Scored::Computed(score)) => {
                    computed.fetch_add(1, Ordering::Relaxed);
                    score
                }
            }
        });
        if gpuless {
            // Just above the best GPU node, so the GPU nodes keep their spread of 0-9.
            let best = raw
                .iter()
                .copied()
                .filter(|s| s.is_finite())
                .fold(f64::NEG_INFINITY, f64::max);
            let above = if best.is_finite() { best + 1e-3 } else { 0.0 };
            for s in raw.iter_mut().filter(|s| **s == f64::INFINITY) {
                *s = above;
            }
        }
        self.count_scores("computed", computed.into_inner());
        self.count_scores("memo", remembered.into_inner());
        let mut keys: Vec<Option<(f64, u64)>> = vec![None; names.len()];
        let mut key = |i: usize| {
            *keys[i].get_or_insert_with(|| {
                let used = self
                    .index
                    .node(names[i])
                    .map_or(0.0, |slot| used_share(&slot.read().ledger));
                (used, stable_name_hash(names[i]))
            })
        };
        let ints = scores_0_to_10_unique(&raw, |a, b| {
            let (ka, kb) = (key(a), key(b));
            ka.0.total_cmp(&kb.0).then(ka.1.cmp(&kb.1))
        });
        Ranking { ints, raw }
    }

    /// Indices of `names` (ranked by `rank`), best first: by prioritize's 0-10 score, then the
    /// raw score under it, then prioritize's tie-break (the fuller node, then the higher name
    /// hash). Filter's `--filter-keep-best` cuts by this order, so the nodes it keeps are the
    /// ones prioritize scores highest, and the name hash makes the cut independent of the
    /// order kube-scheduler lists the candidates in.
    pub(crate) fn best_first(&self, names: &[&str], ranking: &Ranking) -> Vec<usize> {
        let raw = |i: usize| {
            let r = ranking.raw[i];
            if r.is_nan() { f64::NEG_INFINITY } else { r }
        };
        let keys: Vec<(f64, u64)> = names
            .iter()
            .map(|name| {
                let used = self
                    .index
                    .node(name)
                    .map_or(0.0, |slot| used_share(&slot.read().ledger));
                (used, stable_name_hash(name))
            })
            .collect();
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_unstable_by(|&a, &b| {
            ranking.ints[b]
                .cmp(&ranking.ints[a])
                .then(raw(b).total_cmp(&raw(a)))
                .then(keys[b].0.total_cmp(&keys[a].0))
                .then(keys[b].1.cmp(&keys[a].1))
        });
        order
    }
}

/// The class of a pod peakfit reserves no GPU memory for: only its CPU counts (placement's CPU
/// balance and fragmentation terms). Not learned into the shape mix: such pods strand no GPU
/// memory themselves, and counting them in the mix made openb placements worse (issue 12).
fn gpuless_class(cpu_milli: u64) -> PodClass {
    PodClass {
        shape: PodShape {
            gpus: 0,
            demand: Demand::default(),
        },
        cpu_milli,
        gpu_models: Vec::new(),
    }
}

/// One class scored over many nodes (a request, or one class of a prescore pass): what the
/// scores depend on besides the nodes.
pub(crate) struct NodeScoring<'a> {
    pub class: &'a PodClass,
    pub class_id: u64,
    pub mix: &'a ShapeMix,
    /// The generation of the mix prioritize scores with now (the oldest whose memo entries are
    /// still read); `mix` is newer while the prescorer warms a staged mix.
    pub live_mix: u64,
    pub now: i64,
    /// The pod scored (its key and priority), whose view of a node with holds is its own
    /// (`NodeState::seen_by`); `None` for the prescorer's classes, which holds in force bind.
    pub pod: Option<(PodKey, i32)>,
}

impl<'a> NodeScoring<'a> {
    /// A request's scoring: its pod's class under the mix prioritize uses now, seen by `pod`
    /// (its key and priority; `None` for a GPU-less pod). Filter's `--filter-keep-best` and
    /// prioritize build it here, so both rank alike.
    pub fn request(
        class: &'a PodClass,
        class_id: u64,
        mix: &'a ShapeMix,
        now: i64,
        pod: Option<(PodKey, i32)>,
    ) -> Self {
        Self {
            class,
            class_id,
            mix,
            live_mix: mix.generation(),
            now,
            pod,
        }
    }
}

/// Where a node's score came from.
pub(crate) enum Scored {
    /// The memo of the node's state: scored before, for this node or one in the same state.
    Remembered(f64),
    Computed(f64),
}

impl Extender {
    /// The node's score for the batch's class (NaN when the pod does not fit): from the memo of
    /// the node's state, else computed and remembered there. `None` when the node takes no pod
    /// now (no fresh report, NVML down). Report age moves with the clock, not with the ledger,
    /// so it is checked every time and the memos only ever hold scores of usable nodes.
    pub(crate) fn node_score(&self, slot: &NodeSlot, batch: &NodeScoring) -> Option<Scored> {
        let st = slot.read();
        node_usable(&st.ledger, &self.fit, batch.now).ok()?;
        let (pod, priority) = batch
            .pod
            .as_ref()
            .map_or((None, i32::MIN), |(k, p)| (Some(k.as_str()), *p));
        let score_on = |l: &NodeLedger| {
            place_score(
                l,
                batch.class,
                self.scoring,
                batch.mix,
                &self.fit,
                batch.now,
            )
            .unwrap_or(f64::NAN)
        };
        if let Cow::Owned(own) = st.seen_by(pod, priority, batch.now) {
            // A view of this pod's alone: scored, never remembered for the state.
            return Some(Scored::Computed(score_on(&own)));
        }
        let key = MemoKey {
            mix_generation: batch.mix.generation(),
            class_id: batch.class_id,
        };
        let memo = &st.scores().memo;
        if let Some(score) = memo.lock().get(&key) {
            return Some(Scored::Remembered(score));
        }
        // Two threads may score one state at once (two nodes alike); both get the same score.
        let score = score_on(&st.ledger);
        memo.lock().put(key, score, batch.live_mix);
        Some(Scored::Computed(score))
    }
}
