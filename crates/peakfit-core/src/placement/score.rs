//! Which fit wastes least, and on which GPUs: the choice bind makes and the ranking prioritize
//! answers.
//!
//! Every policy gives a fine-grained score (`f64`, higher is better) used to choose GPUs and rank
//! nodes; kube-scheduler only takes integers 0..=10 from an extender, so `scores_0_to_10` maps a
//! batch of nodes onto that range with the best node(s), and only those, at 10.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::demand::PodClass;
use super::fit::{FitConfig, GpuShares, Placement, Rejection, admissible};
use super::frag::{FragState, FragUnit, GpuChange, ShapeMix};
use super::ledger::NodeLedger;
use super::patterns::{Contents, PatternFit, PatternsRef, units};

/// How prioritize ranks the nodes that fit, and how bind picks GPUs on the chosen one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoringPolicy {
    /// Fragmentation-aware: the placement that raises the node's expected fragmentation over
    /// recently seen pod shapes least (FGD), ties towards the fuller node and the tighter GPU.
    #[default]
    Peakfit,
    /// Fill the fullest nodes and the tightest GPUs first.
    Binpack,
    /// Fill the emptiest nodes and GPUs first.
    Spread,
}

impl ScoringPolicy {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: [ScoringPolicy; 3] = [Self::Peakfit, Self::Binpack, Self::Spread];

    /// The name a flag, an env var or a JSON report uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Peakfit => "peakfit",
            Self::Binpack => "binpack",
            Self::Spread => "spread",
        }
    }
}

impl std::fmt::Display for ScoringPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ScoringPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let allowed: Vec<_> = Self::ALL.iter().map(|p| p.as_str()).collect();
                format!("scoring policy {s:?} is not one of {}", allowed.join(", "))
            })
    }
}

/// Tie-breaker weight of Binpack and Spread's GPU term (their node term is in 0..1).
const GPU_TERM_WEIGHT: f64 = 1e-3;

/// Knobs of the peakfit policy, exposed so the simulator can show what each one buys.
///
/// Defaults tuned on the openb trace; what each term bought, and on which commit, is in
/// `docs/tuning.md`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuning {
    /// Weight of node packing (used share of the node's GPUs after the placement, 0..1) added to
    /// the fragmentation delta (in GPUs). Fine-grained deltas alone rarely tie, so without it
    /// nothing consolidates pods onto already busy nodes and whole nodes for 8-GPU pods vanish.
    pub packing_weight: f64,
    /// Weight of the change in GPUs stranded for lack of CPU: free GPUs beyond what the node's
    /// free CPU can feed at the mix's CPU-per-GPU ratio. FGD sees CPU only when it drops below
    /// one typical pod's need; this keeps CPU-poor nodes for CPU-light pods and sends GPU-less,
    /// CPU-heavy pods to CPU-rich nodes. Inactive where nodes do not track CPU (the extender
    /// before it has seen the Node's allocatable).
    pub cpu_balance_weight: f64,
    /// Share of `cpu_balance_weight` credited when a placement strands fewer GPUs than before
    /// (a CPU-light pod on a CPU-poor node). Crediting it in full spreads CPU-light pods over
    /// empty nodes and leaves none whole for 8-GPU pods (measured: `docs/tuning.md`).
    pub cpu_balance_relief: f64,
    /// Weight of the model-pressure cost an unrestricted pod pays per GPU it takes on a model
    /// that model-restricted pods will need (`ShapeMix::with_capacity`). FGD only sees this as a
    /// small bonus for using models other shapes cannot; on traces where restricted demand
    /// exceeds a model's capacity that is not enough. Inactive without capacity in the mix.
    pub model_pressure_weight: f64,
    /// Weight, per step of `PatternFit` (off, opens, joins, completes), of following the mix's
    /// fill patterns with a sharing pod (`placement::patterns`). Above FGD's fragmentation
    /// deltas (under one GPU) so that the patterns decide which pods share a GPU, and FGD
    /// decides among placements that follow them equally well.
    pub pattern_weight: f64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            packing_weight: 0.1,
            cpu_balance_weight: 1.0,
            cpu_balance_relief: 0.3,
            model_pressure_weight: 3.0,
            pattern_weight: 1.0,
        }
    }
}

/// A chosen placement and how good it is (higher is better; comparable across nodes for the
/// same pod, policy and mix).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    pub placement: Placement,
    pub score: f64,
}

/// Checks the fit and chooses the GPUs under `policy`, with the placement's score. Filter,
/// prioritize and bind all call this; on an unchanged ledger and mix it answers the same.
///
/// Cost: O(GPUs × shapes) for the node's fragmentation, plus O(distinct candidate GPUs × shapes)
/// per GPU chosen (GPUs of the same kind, `GpuLedger::same_kind`: room and model, and free
/// memory are tried once).
pub fn place(
    node: &NodeLedger,
    class: &PodClass,
    policy: ScoringPolicy,
    mix: &ShapeMix,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<Scored, Rejection> {
    place_tuned(node, class, policy, mix, cfg, now_unix, &Tuning::default())
}

/// `place` with explicit knobs for the peakfit policy.
pub fn place_tuned(
    node: &NodeLedger,
    class: &PodClass,
    policy: ScoringPolicy,
    mix: &ShapeMix,
    cfg: &FitConfig,
    now_unix: i64,
    tuning: &Tuning,
) -> Result<Scored, Rejection> {
    choose(node, class, policy, mix, cfg, now_unix, tuning).map(|(chosen, score)| Scored {
        placement: Placement::from_pairs(chosen.into_vec()),
        score,
    })
}

/// `place`'s score alone: prioritize ranks thousands of nodes per request and never looks at
/// the GPUs, so it skips building the `Placement`. Same value as `place(..).map(|s| s.score)`.
pub fn place_score(
    node: &NodeLedger,
    class: &PodClass,
    policy: ScoringPolicy,
    mix: &ShapeMix,
    cfg: &FitConfig,
    now_unix: i64,
) -> Result<f64, Rejection> {
    choose(node, class, policy, mix, cfg, now_unix, &Tuning::default()).map(|(_, score)| score)
}

/// The chosen (GPU, bytes) pairs, in the order chosen, and the placement's score.
fn choose(
    node: &NodeLedger,
    class: &PodClass,
    policy: ScoringPolicy,
    mix: &ShapeMix,
    cfg: &FitConfig,
    now_unix: i64,
    tuning: &Tuning,
) -> Result<(GpuShares, f64), Rejection> {
    let candidates = admissible(node, class, cfg, now_unix)?;
    Ok(match policy {
        ScoringPolicy::Peakfit if !mix.is_empty() => {
            peakfit(node, class, candidates, mix, cfg, tuning)
        }
        ScoringPolicy::Peakfit | ScoringPolicy::Binpack => by_free(node, class, candidates, true),
        ScoringPolicy::Spread => by_free(node, class, candidates, false),
    })
}

/// Used share of the node's GPUs (each GPU counting 1) if `placement` is committed.
fn packing_after(node: &NodeLedger, chosen: &[(usize, u64)]) -> f64 {
    if node.gpus.is_empty() {
        return 0.0;
    }
    let used: f64 = node
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let taken: u64 = chosen.iter().filter(|c| c.0 == i).map(|c| c.1).sum();
            1.0 - FragUnit::Gpus.weight(g) * g.free_bytes().saturating_sub(taken) as f64
        })
        .sum();
    used / node.gpus.len() as f64
}

/// Binpack (`tight`) and Spread: GPUs with the least (most) memory left, node by how full
/// (empty) it ends up, in GPUs.
fn by_free(
    node: &NodeLedger,
    class: &PodClass,
    mut candidates: GpuShares,
    tight: bool,
) -> (GpuShares, f64) {
    let left = |&(i, need): &(usize, u64)| {
        FragUnit::Gpus.weight(&node.gpus[i]) * (node.gpus[i].free_bytes() - need) as f64
    };
    candidates.sort_by(|a, b| {
        let (la, lb) = (left(a), left(b));
        let ord = if tight {
            la.total_cmp(&lb)
        } else {
            lb.total_cmp(&la)
        };
        ord.then(a.0.cmp(&b.0))
    });
    candidates.truncate(class.shape.gpus as usize);
    let packed = packing_after(node, &candidates);
    // Within a node, the tighter GPUs break ties between equally full nodes.
    let gpu_term: f64 = candidates.iter().map(left).sum::<f64>() / candidates.len().max(1) as f64;
    let score = if tight {
        packed - GPU_TERM_WEIGHT * gpu_term
    } else {
        (1.0 - packed) + GPU_TERM_WEIGHT * gpu_term
    };
    (candidates, score)
}

/// Greedy over the pod's GPUs: each next GPU is the one whose share raises fragmentation least,
/// ties to the one left with the least free memory, then the lowest index.
fn peakfit(
    node: &NodeLedger,
    class: &PodClass,
    mut candidates: GpuShares,
    mix: &ShapeMix,
    cfg: &FitConfig,
    tuning: &Tuning,
) -> (GpuShares, f64) {
    let mut state = FragState::new(node, mix, cfg, FragUnit::Gpus);
    let before = state.value();
    let free_gpus = state.free();
    state.apply(&[], class.cpu_milli);
    let mut chosen = GpuShares::new();
    // Sharing pods (one GPU, less than all of it) follow the mix's fill patterns first.
    let sharing = class.shape.gpus == 1
        && candidates
            .iter()
            .any(|&(i, need)| need < node.gpus[i].total_bytes);
    let patterns = (sharing && tuning.pattern_weight != 0.0)
        .then(|| PatternLookup::new(node, mix, cfg.safety_margin_bytes))
        .flatten();
    let fit_of = |i: usize, need: u64| {
        patterns
            .as_ref()
            .map_or(PatternFit::Off, |p| p.fit(node, i, need))
    };
    // Each candidate's pattern fit, free memory and kind, computed once: they do not change
    // while GPUs are chosen, and the scan below compares every candidate with the earlier ones.
    let mut facts: SmallVec<[(PatternFit, u64, u32); 8]> = candidates
        .iter()
        .map(|&(i, need)| (fit_of(i, need), node.gpus[i].free_bytes(), state.kind_of(i)))
        .collect();
    let mut chosen_fit = PatternFit::Off;
    for _ in 0..class.shape.gpus {
        // (pattern fit, F after, free left, position)
        let mut best: Option<(PatternFit, f64, f64, usize)> = None;
        // GPUs of one kind (room and model: one group of `FragState`) with the same free memory
        // are interchangeable: try one (the first; a scan of the few earlier candidates is
        // cheaper than a list of tried kinds per node).
        for (pos, (&(i, need), &(fit, free, kind))) in candidates.iter().zip(&facts).enumerate() {
            let gpu = &node.gpus[i];
            let tried = candidates[..pos]
                .iter()
                .zip(&facts[..pos])
                .any(|(&(_, need_j), &fact_j)| need_j == need && fact_j == (fit, free, kind));
            if tried {
                continue;
            }
            let f = state.value_after(&[change(i, free, need)], 0);
            let left = FragUnit::Gpus.weight(gpu) * (free - need) as f64;
            let better = match best {
                None => true,
                Some((bp, bf, bl, _)) => {
                    fit > bp || (fit == bp && (f < bf - 1e-12 || (f <= bf + 1e-12 && left < bl)))
                }
            };
            if better {
                best = Some((fit, f, left, pos));
            }
        }
        let (fit, _, _, pos) = best.expect("admissible returned at least `gpus` candidates");
        chosen_fit = fit;
        let (i, need) = candidates.remove(pos);
        facts.remove(pos);
        let gpu = &node.gpus[i];
        state.apply(&[change(i, gpu.free_bytes(), need)], 0);
        chosen.push((i, need));
    }
    let after = state.value();
    let mut score = (before - after) + tuning.packing_weight * packing_after(node, &chosen);
    if patterns.is_some() {
        // An unrestricted pod on a model that restricted pods will need should not be drawn
        // there by a good pattern: model pressure keeps it off, patterns only choose among
        // the GPUs it may take freely.
        let free_to_take = if class.gpu_models.is_empty() {
            chosen.first().map_or(1.0, |&(i, _)| {
                (1.0 - mix.model_pressure(&node.gpus[i].model)).clamp(0.0, 1.0)
            })
        } else {
            1.0
        };
        score += tuning.pattern_weight * free_to_take * f64::from(chosen_fit as u8);
    }
    if let (Some(cpu_free), Some(ratio)) = (
        node.cpu_free_milli(),
        mix.cpu_per_gpu_on(node.gpus.first().map_or(0, |g| g.total_bytes)),
    ) && tuning.cpu_balance_weight != 0.0
    {
        let taken: f64 = chosen
            .iter()
            .map(|&(i, b)| FragUnit::Gpus.weight(&node.gpus[i]) * b as f64)
            .sum();
        let stranded = |gpus: f64, cpu: f64| (gpus - cpu / ratio).max(0.0);
        let delta = stranded(
            free_gpus - taken,
            cpu_free.saturating_sub(class.cpu_milli) as f64,
        ) - stranded(free_gpus, cpu_free as f64);
        let delta = if delta < 0.0 {
            delta * tuning.cpu_balance_relief
        } else {
            delta
        };
        score -= tuning.cpu_balance_weight * delta;
    }
    if class.gpu_models.is_empty() && tuning.model_pressure_weight != 0.0 {
        let pressure: f64 = chosen
            .iter()
            .map(|&(i, b)| {
                let g = &node.gpus[i];
                mix.model_pressure(&g.model) * FragUnit::Gpus.weight(g) * b as f64
            })
            .sum();
        score -= tuning.model_pressure_weight * pressure;
    }
    (chosen, score)
}

/// A node's GPUs against the mix's fill patterns, fetched once per GPU kind of the node.
struct PatternLookup<'m> {
    /// Per GPU: its kind's row.
    row_of: SmallVec<[u8; 8]>,
    rows: SmallVec<[PatternsRef<'m>; 2]>,
}

impl<'m> PatternLookup<'m> {
    /// `None` when no GPU of the node has patterns to follow.
    fn new(node: &NodeLedger, mix: &'m ShapeMix, margin: u64) -> Option<Self> {
        let mut reps: SmallVec<[usize; 2]> = SmallVec::new();
        let mut row_of: SmallVec<[u8; 8]> = SmallVec::new();
        let mut rows: SmallVec<[PatternsRef<'m>; 2]> = SmallVec::new();
        for (i, g) in node.gpus.iter().enumerate() {
            let row = reps.iter().position(|&r| node.gpus[r].same_kind(g));
            let row = row.unwrap_or_else(|| {
                reps.push(i);
                rows.push(mix.fill_patterns(g, margin));
                rows.len() - 1
            });
            row_of.push(u8::try_from(row).unwrap_or(u8::MAX));
        }
        rows.iter()
            .any(|p| !p.is_empty())
            .then_some(Self { row_of, rows })
    }

    /// How `need` bytes on GPU `i` stand against the patterns of its kind. The pods already
    /// there count at what bind reserved for them (their class's share), not at observed use.
    fn fit(&self, node: &NodeLedger, i: usize, need: u64) -> PatternFit {
        let gpu = &node.gpus[i];
        let Some(patterns) = self.rows.get(usize::from(self.row_of[i])) else {
            return PatternFit::Off;
        };
        let total = gpu.total_bytes;
        let item = units(need, total);
        if need >= total || !patterns.knows(item) {
            return PatternFit::Off;
        }
        let mut contents: Contents = gpu
            .reservations()
            .values()
            .filter(|r| r.predicted_bytes > 0)
            .map(|r| units(r.predicted_bytes, total))
            .collect();
        contents.sort_unstable();
        patterns.fit(&contents, item)
    }
}

fn change(gpu: usize, free: u64, need: u64) -> GpuChange {
    GpuChange {
        gpu,
        free_before: free,
        free_after: free - need,
    }
}

/// The first version's absolute score, 0 (worst) to 10 (best), of a given placement, without a
/// shape mix: how full the chosen GPUs end up (Binpack, and Peakfit for lack of a mix) or how
/// empty (Spread). Kept so early callers build; `place` + `scores_0_to_10` rank better.
pub fn score(
    node: &NodeLedger,
    shape: &super::demand::PodShape,
    placement: &Placement,
    policy: ScoringPolicy,
) -> u8 {
    let _ = shape;
    let (total, free_after) = placement
        .gpu_indices
        .iter()
        .zip(&placement.per_gpu_bytes)
        .map(|(&i, &b)| {
            let g = &node.gpus[i];
            (g.total_bytes, g.free_bytes().saturating_sub(b))
        })
        .fold((0u64, 0u64), |(t, f), (gt, gf)| (t + gt, f + gf));
    if total == 0 {
        return 0;
    }
    let used = 1.0 - free_after as f64 / total as f64;
    let s = match policy {
        ScoringPolicy::Peakfit | ScoringPolicy::Binpack => used,
        ScoringPolicy::Spread => 1.0 - used,
    };
    crate::convert::f64_to_u8((s * 10.0).round().clamp(0.0, 10.0))
}

/// Maps a batch of fine-grained scores (one per node, higher better) to kube-scheduler's
/// 0..=10: the best node(s) get 10, the others 0..=9 by where they fall between the worst and
/// the best, so the scheduler's coarse integers still pick the best node. NaN scores get 0.
pub fn scores_0_to_10(scores: &[f64]) -> Vec<u8> {
    let finite = scores.iter().copied().filter(|s| s.is_finite());
    let max = finite.clone().fold(f64::NEG_INFINITY, f64::max);
    let min = finite.fold(f64::INFINITY, f64::min);
    let tie = 1e-9 * max.abs().max(1.0);
    scores
        .iter()
        .map(|&s| {
            if !s.is_finite() {
                0
            } else if s >= max - tie {
                10
            } else {
                crate::convert::f64_to_u8(((s - min) / (max - min) * 10.0).floor().clamp(0.0, 9.0))
            }
        })
        .collect()
}

/// `scores_0_to_10` with exactly one node at 10: among the nodes tied at the top, the one
/// `prefer` orders last (the greatest); the other tied nodes get 9, so the ranking of the rest
/// is kept.
///
/// kube-scheduler picks uniformly at random among the nodes with the highest total. Early in
/// a run and on uniform clusters, dozens of identical empty nodes tie; a random pick among them
/// puts each pod on another empty node and scatters the workload. One winner, chosen from the
/// nodes' state, makes the next equal pod follow the first onto the same node.
pub fn scores_0_to_10_unique(
    scores: &[f64],
    mut prefer: impl FnMut(usize, usize) -> std::cmp::Ordering,
) -> Vec<u8> {
    let mut ints = scores_0_to_10(scores);
    let mut best: Option<usize> = None;
    for i in 0..ints.len() {
        if ints[i] != 10 {
            continue;
        }
        match best {
            Some(b) if prefer(i, b).is_le() => ints[i] = 9,
            Some(b) => {
                ints[b] = 9;
                best = Some(i);
            }
            None => best = Some(i),
        }
    }
    ints
}

/// Used share of a node's GPUs (each GPU counting 1), the first tie-break among nodes equally
/// good for a pod: the fuller node takes it.
pub fn used_share(node: &NodeLedger) -> f64 {
    packing_after(node, &[])
}

/// A hash of a node's name that is the same in every process and release (FNV-1a), the last
/// tie-break among equally good, equally full nodes.
pub fn stable_name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::test_support::{node, share};
    use crate::placement::{Demand, PodShape};

    fn placed(n: &NodeLedger, c: &PodClass, policy: ScoringPolicy, mix: &ShapeMix) -> Scored {
        place(n, c, policy, mix, &FitConfig::simulation(), 0).unwrap()
    }

    mod same_as_reference {
        //! The fast path against the frozen reference (`score_reference`): bit-identical scores
        //! and the same GPUs, on random ledgers, classes and mixes. Shares are in thousandths of
        //! 1000-byte GPUs and reservations are drawn from the same sizes as the mix's classes, so
        //! fill patterns open, join and complete as they do on a real trace.

        use std::sync::Arc;

        use proptest::prelude::*;

        use super::super::*;
        use crate::placement::score_reference;
        use crate::placement::{Demand, GpuLedger, PodShape};

        const MILLIS: [u32; 10] = [100, 250, 300, 320, 470, 500, 530, 650, 1000, 150];

        fn arb_class() -> impl Strategy<Value = PodClass> {
            (
                prop::sample::select(vec![0u32, 1, 1, 1, 1, 2, 4, 8]),
                prop::sample::select(MILLIS.to_vec()),
                prop::sample::select(vec![0u64, 0, 2_000, 8_000, 32_000]),
                prop::sample::select(vec![vec![], vec![], vec!["T4".to_string()]]),
            )
                .prop_map(|(gpus, milli, cpu_milli, gpu_models)| PodClass {
                    shape: PodShape {
                        gpus,
                        demand: Demand::fraction(f64::from(milli) / 1000.0),
                    },
                    cpu_milli,
                    gpu_models,
                })
        }

        fn arb_mix() -> impl Strategy<Value = ShapeMix> {
            (
                prop::collection::vec((arb_class(), 1u32..20), 0..10),
                any::<bool>(),
            )
                .prop_map(|(classes, capacity)| {
                    let mix = ShapeMix::new(classes.into_iter().map(|(c, w)| (c, f64::from(w))));
                    if capacity {
                        mix.with_capacity([("T4".to_string(), 8.0), ("G2".to_string(), 24.0)])
                    } else {
                        mix
                    }
                })
        }

        /// 1-8 GPUs of 1000 bytes (one or two models, the models shared as the index shares
        /// them), each holding 0-3 pods of the mix's sizes; CPU tracked or not.
        fn arb_node() -> impl Strategy<Value = NodeLedger> {
            (
                prop::collection::vec(
                    (
                        any::<bool>(),
                        prop::collection::vec(prop::sample::select(MILLIS.to_vec()), 0..4),
                    ),
                    1..=8,
                ),
                prop::option::of((0u64..64).prop_map(|c| c * 1000)),
                0u64..48_000,
            )
                .prop_map(|(gpus, cpu, cpu_used)| {
                    let (t4, g2): (Arc<str>, Arc<str>) = ("T4".into(), "G2".into());
                    let mut n = NodeLedger::with_gpus(
                        "n",
                        gpus.iter()
                            .enumerate()
                            .map(|(i, (is_t4, _))| {
                                let model = if *is_t4 { t4.clone() } else { g2.clone() };
                                GpuLedger::new(format!("g{i}"), 1000).with_model(model)
                            })
                            .collect(),
                    );
                    for (i, (_, pods)) in gpus.iter().enumerate() {
                        let mut left = 1000u64;
                        for (k, &m) in pods.iter().enumerate() {
                            if u64::from(m) <= left {
                                left -= u64::from(m);
                                n.reserve(&format!("p{i}-{k}"), &[i], &[u64::from(m)]);
                            }
                        }
                    }
                    if let Some(cpu) = cpu {
                        n = n.with_cpu_milli(cpu);
                        n.reserve_host("host", cpu_used.min(cpu), 0);
                    }
                    n
                })
        }

        fn arb_tuning() -> impl Strategy<Value = Tuning> {
            prop::sample::select(vec![
                Tuning::default(),
                Tuning {
                    pattern_weight: 0.0,
                    ..Tuning::default()
                },
                Tuning {
                    cpu_balance_weight: 0.0,
                    model_pressure_weight: 0.0,
                    ..Tuning::default()
                },
            ])
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4000))]
            #[test]
            fn bit_identical(
                node in arb_node(),
                class in arb_class(),
                mix in arb_mix(),
                tuning in arb_tuning(),
                policy in prop::sample::select(ScoringPolicy::ALL.to_vec()),
                margin in prop::sample::select(vec![0u64, 10]),
            ) {
                let cfg = FitConfig {
                    safety_margin_bytes: margin,
                    ..FitConfig::simulation()
                };
                let fast = choose(&node, &class, policy, &mix, &cfg, 0, &tuning);
                let slow = score_reference::choose(&node, &class, policy, &mix, &cfg, 0, &tuning);
                match (fast, slow) {
                    (Ok((a, sa)), Ok((b, sb))) => {
                        prop_assert_eq!(a, b);
                        prop_assert_eq!(sa.to_bits(), sb.to_bits());
                    }
                    (Err(a), Err(b)) => prop_assert_eq!(a, b),
                    (a, b) => prop_assert!(false, "fast {:?}, reference {:?}", a, b),
                }
            }
        }
    }

    #[test]
    fn peakfit_keeps_whole_gpus_whole() {
        // Half-GPU pods and whole-GPU pods are common: a 0.5 pod goes on the half-used GPU,
        // not on a free one (which best fit would also do), and not on the 0.6 one, which would
        // strand 0.1.
        let mix = ShapeMix::new([(share(500, 1), 1.0), (share(1000, 1), 1.0)]);
        let n = node(&[1000, 500, 600]);
        let s = placed(&n, &share(500, 1), ScoringPolicy::Peakfit, &mix);
        assert_eq!(s.placement.gpu_indices, [1]);
        assert_eq!(s.placement.per_gpu_bytes, [500]);
    }

    #[test]
    fn peakfit_avoids_stranding_memory_best_fit_would_strand() {
        // Typical pods take 0.4 of a GPU. A 0.3 pod: best fit picks the 0.5 GPU (leaving 0.2,
        // useless); peakfit takes it from the 0.7 one, leaving 0.4 for the next typical pod.
        let mix = ShapeMix::new([(share(400, 1), 1.0)]);
        let n = node(&[700, 500]);
        let bf = placed(&n, &share(300, 1), ScoringPolicy::Binpack, &mix);
        assert_eq!(bf.placement.gpu_indices, [1]);
        let pf = placed(&n, &share(300, 1), ScoringPolicy::Peakfit, &mix);
        assert_eq!(pf.placement.gpu_indices, [0]);
    }

    #[test]
    fn peakfit_pairs_sharing_pods_by_the_mix_fill_patterns() {
        // Whole-GPU pods are half the mix; 0.65 and 0.32 pods come equally often, 0.47 pods
        // twice as often: the best cut pairs 0.32 with 0.65 and 0.47 with 0.47. A 0.32 pod
        // facing a GPU with a 0.47 pod and an empty one: FGD's delta alone puts it beside the
        // 0.47 (an empty GPU cut to 0.68 is lost to whole-GPU pods; the 0.21 left beside the
        // 0.47 looks cheaper), although nothing in the mix will ever use those 0.21. The
        // patterns open the empty GPU instead, for a 0.65 to complete later.
        let mix = ShapeMix::new([
            (share(1000, 1), 4.0),
            (share(650, 1), 1.0),
            (share(320, 1), 1.0),
            (share(470, 1), 2.0),
        ]);
        let pod = share(320, 1);
        let n = node(&[530, 1000]);
        let cfg = FitConfig::simulation();
        let fgd_only = Tuning {
            pattern_weight: 0.0,
            ..Tuning::default()
        };
        let without = place_tuned(&n, &pod, ScoringPolicy::Peakfit, &mix, &cfg, 0, &fgd_only);
        assert_eq!(without.unwrap().placement.gpu_indices, [0]);
        assert_eq!(
            placed(&n, &pod, ScoringPolicy::Peakfit, &mix)
                .placement
                .gpu_indices,
            [1]
        );
        // Beside a 0.65 pod it completes a pattern, the best place of all, on any node.
        let with_650 = node(&[530, 350, 1000]);
        let s = placed(&with_650, &pod, ScoringPolicy::Peakfit, &mix);
        assert_eq!(s.placement.gpu_indices, [1]);
        let opening = placed(&n, &pod, ScoringPolicy::Peakfit, &mix);
        assert!(s.score > opening.score, "{} vs {}", s.score, opening.score);
    }

    #[test]
    fn peakfit_ranks_nodes_by_fragmentation_added() {
        let mix = ShapeMix::new([(share(1000, 1), 1.0)]);
        let pod = share(500, 1);
        // Taking half of a half-used GPU adds nothing; halving a whole GPU strands 0.5.
        let good = placed(&node(&[500, 1000]), &pod, ScoringPolicy::Peakfit, &mix);
        let bad = placed(&node(&[1000, 1000]), &pod, ScoringPolicy::Peakfit, &mix);
        assert!(good.score > bad.score, "{} vs {}", good.score, bad.score);
        assert_eq!(scores_0_to_10(&[good.score, bad.score]), [10, 0]);
    }

    /// A mix of `typical` alone, two nodes of two free 1000-byte GPUs with 24 and 64 free
    /// cores, and a GPU-less 8-core pod, which must score higher on the node with more CPU.
    fn cpu_poor_and_rich(typical: PodClass) -> (ShapeMix, NodeLedger, NodeLedger, PodClass) {
        let pod = PodClass {
            shape: PodShape {
                gpus: 0,
                demand: Demand::default(),
            },
            cpu_milli: 8_000,
            gpu_models: Vec::new(),
        };
        let mix = ShapeMix::new([(typical, 1.0)]);
        let poor = node(&[1000, 1000]).with_cpu_milli(24_000);
        let rich = node(&[1000, 1000]).with_cpu_milli(64_000);
        let on_poor = placed(&poor, &pod, ScoringPolicy::Peakfit, &mix);
        let on_rich = placed(&rich, &pod, ScoringPolicy::Peakfit, &mix);
        assert!(
            on_rich.score > on_poor.score,
            "{} vs {}",
            on_rich.score,
            on_poor.score
        );
        (mix, poor, rich, pod)
    }

    #[test]
    fn cpu_heavy_pods_go_where_cpu_is_spare() {
        // Typical pods want 10 cores per GPU. A GPU-less 8-core pod on the node with 24 cores
        // for 2 free GPUs leaves 16: enough for one typical pod (FGD sees nothing wrong) but not
        // for two, so 0.4 GPU is stranded; on the node with 64 cores nothing is.
        let mut typical = share(1000, 1);
        typical.cpu_milli = 10_000;
        let (mix, poor, rich, pod) = cpu_poor_and_rich(typical);
        // Without CPU balance both are the same to fragmentation and packing.
        let off = Tuning {
            cpu_balance_weight: 0.0,
            ..Tuning::default()
        };
        let cfg = FitConfig::simulation();
        let a = place_tuned(&poor, &pod, ScoringPolicy::Peakfit, &mix, &cfg, 0, &off).unwrap();
        let b = place_tuned(&rich, &pod, ScoringPolicy::Peakfit, &mix, &cfg, 0, &off).unwrap();
        assert_eq!(a.score, b.score);
    }

    /// The same with pods sized in bytes (`peakfit.io/vram`), the extender's usual case: the
    /// mix's CPU per GPU is taken on the node's GPUs, so CPU balance scores here too (it had no
    /// ratio for such a mix, and both nodes scored alike).
    #[test]
    fn cpu_balance_scores_pods_sized_in_bytes() {
        let mut typical = PodClass::from(PodShape {
            gpus: 1,
            demand: Demand::fixed(1000),
        });
        typical.cpu_milli = 10_000;
        let (mix, ..) = cpu_poor_and_rich(typical);
        assert_eq!(mix.cpu_per_gpu(), None, "scored without the mix-wide ratio");
    }

    #[test]
    fn unrestricted_pods_stay_off_models_restricted_pods_need() {
        let any = share(1000, 1);
        let t4_only = PodClass {
            gpu_models: vec!["T4".into()],
            ..share(1000, 1)
        };
        let mix = ShapeMix::new([(any.clone(), 1.0), (t4_only.clone(), 1.0)])
            .with_capacity([("T4".to_string(), 2.0), ("G2".to_string(), 8.0)]);
        let cluster: Vec<NodeLedger> = [("T4", 2), ("G2", 8)]
            .iter()
            .map(|&(m, k)| {
                let mut n = node(&vec![1000; k]);
                n.gpus.iter_mut().for_each(|g| g.model = m.into());
                n
            })
            .collect();
        let same =
            ShapeMix::new([(any.clone(), 1.0), (t4_only.clone(), 1.0)]).with_cluster(&cluster);
        assert_eq!(same.model_pressure("T4"), mix.model_pressure("T4"));
        // T4-only pods bring half the demand onto a fifth of the GPUs: 2.5x the average load.
        assert!((mix.model_pressure("T4") - 2.5).abs() < 1e-12);
        assert_eq!(mix.model_pressure("G2"), 0.0);
        let on = |model: &str| {
            let mut n = node(&[1000, 1000]);
            for g in &mut n.gpus {
                g.model = model.into();
            }
            n
        };
        let t4 = placed(&on("T4"), &any, ScoringPolicy::Peakfit, &mix);
        let g2 = placed(&on("G2"), &any, ScoringPolicy::Peakfit, &mix);
        assert!(g2.score > t4.score, "{} vs {}", g2.score, t4.score);
        // The restricted pod pays nothing for going where it must.
        let t4_for_t4 = placed(&on("T4"), &t4_only, ScoringPolicy::Peakfit, &mix);
        assert!(t4_for_t4.score > t4.score);
    }

    #[test]
    fn a_k_gpu_pod_gets_distinct_gpus() {
        let mix = ShapeMix::new([(share(500, 1), 1.0)]);
        let n = node(&[1000, 1000, 1000, 600]);
        for policy in [
            ScoringPolicy::Peakfit,
            ScoringPolicy::Binpack,
            ScoringPolicy::Spread,
        ] {
            let s = placed(&n, &share(500, 3), policy, &mix);
            let mut g = s.placement.gpu_indices.clone();
            g.dedup();
            assert_eq!(g.len(), 3, "{policy:?}: {:?}", s.placement);
        }
    }

    #[test]
    fn spread_picks_the_emptiest() {
        let mix = ShapeMix::default();
        let n = node(&[400, 900, 700]);
        let s = placed(&n, &share(300, 1), ScoringPolicy::Spread, &mix);
        assert_eq!(s.placement.gpu_indices, [1]);
        let fuller = placed(
            &node(&[400, 400]),
            &share(300, 1),
            ScoringPolicy::Spread,
            &mix,
        );
        assert!(s.score > fuller.score);
    }

    #[test]
    fn the_0_to_10_scale_gives_10_to_the_best_only() {
        assert_eq!(scores_0_to_10(&[]), Vec::<u8>::new());
        assert_eq!(scores_0_to_10(&[0.5]), [10]);
        assert_eq!(scores_0_to_10(&[-1.0, -1.0]), [10, 10]);
        assert_eq!(scores_0_to_10(&[0.0, 0.999, 1.0, f64::NAN]), [0, 9, 10, 0]);
        assert_eq!(scores_0_to_10(&[-3.0, -2.0, -1.0]), [0, 5, 10]);
    }

    #[test]
    fn one_node_at_10_chosen_by_the_tie_break() {
        let by_key = |keys: &'static [u64]| move |a: usize, b: usize| keys[a].cmp(&keys[b]);
        assert_eq!(
            scores_0_to_10_unique(&[1.0, 1.0, 0.0, 1.0], by_key(&[3, 7, 9, 5])),
            [9, 10, 0, 9]
        );
        assert_eq!(
            scores_0_to_10_unique(&[-1.0, -1.0], by_key(&[2, 1])),
            [10, 9]
        );
        assert_eq!(
            scores_0_to_10_unique(&[f64::NAN, 0.2], by_key(&[9, 0])),
            [0, 10]
        );
        assert_eq!(scores_0_to_10_unique(&[], by_key(&[])), Vec::<u8>::new());
        assert_eq!(stable_name_hash("node-1"), stable_name_hash("node-1"));
        assert_ne!(stable_name_hash("node-1"), stable_name_hash("node-2"));
    }
}
