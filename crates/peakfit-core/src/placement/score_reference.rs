//! The scoring as it stood before its speed-ups (issue 12, item 7), frozen: the equivalence
//! test in `score.rs` checks that the fast path answers bit for bit what this one does, on many
//! random ledgers, classes and mixes, because the simulator's published results depend on every
//! score. Never edit this to follow a change of the scores: change the scores in `score.rs` and
//! the reference together, in one commit that says why.

use smallvec::SmallVec;

use super::demand::PodClass;
use super::fit::{FitConfig, GpuShares, Rejection, admissible};
use super::frag::{FragState, FragUnit, GpuChange, ShapeMix};
use super::ledger::NodeLedger;
use super::patterns::{Contents, PatternFit, PatternsRef, units};
use super::score::{ScoringPolicy, Tuning};

const GPU_TERM_WEIGHT: f64 = 1e-3;

/// The chosen (GPU, bytes) pairs, in the order chosen, and the placement's score.
pub(super) fn choose(
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
    let mut chosen_fit = PatternFit::Off;
    for _ in 0..class.shape.gpus {
        // (pattern fit, F after, free left, position)
        let mut best: Option<(PatternFit, f64, f64, usize)> = None;
        // GPUs of one kind (room and model: one group of `FragState`) with the same free memory
        // are interchangeable: try one (the first; a scan of the few earlier candidates is
        // cheaper than a list of tried kinds per node).
        for (pos, &(i, need)) in candidates.iter().enumerate() {
            let gpu = &node.gpus[i];
            let free = gpu.free_bytes();
            let kind = state.kind_of(i);
            let fit = fit_of(i, need);
            let tried = candidates[..pos].iter().any(|&(j, need_j)| {
                need_j == need
                    && state.kind_of(j) == kind
                    && node.gpus[j].free_bytes() == free
                    && fit_of(j, need_j) == fit
            });
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
