//! Fill patterns: which pods should share a GPU so that the cluster's sharing pods, as the mix
//! expects them, fill GPUs with the least memory left over.
//!
//! FGD's fragmentation sees a GPU's free memory only as usable or not by each expected shape.
//! It cannot tell that a 0.32 share belongs next to a 0.65 one (0.03 left over) rather than next
//! to a 0.47 one (0.21 left, which only rare tiny pods can use). On the openb `default` trace
//! that blind spot is most of the gap between FGD-style online placement and an offline
//! optimum: 0.47 + 0.32, 0.65 + 0.23 and 0.55 + 0.32 pairs cost about 0.3 % of the cluster.
//!
//! So, once per mix and GPU size, the best way to cut GPUs into the mix's shares is solved as
//! the classic cutting-stock linear program (Gilmore–Gomory: minimise GPUs used so that every
//! share size is covered in proportion to its weight; new patterns priced by a knapsack over
//! the dual values). The patterns the optimum uses say which pods belong together. Placement
//! then prefers, in order: a share that completes a pattern on a GPU, one that joins a GPU
//! whose pods are still part of a pattern, one that opens a pattern on an empty GPU, and only
//! then anything else. On openb `default` that comes within noise of the offline optimum of the
//! same pods (`docs/tuning.md`, `docs/simulate.md`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use smallvec::SmallVec;

use super::demand::{GpuRoom, PodClass};

/// Shares are compared in thousandths of a GPU, the trace's own unit.
pub const UNITS_PER_GPU: u16 = 1000;

/// Shares below this many thousandths are left out of the patterns: they fit almost anywhere,
/// and each one multiplies the patterns the solver has to consider.
const MIN_UNITS: u16 = 20;

/// Column generation stops after this many patterns; the restricted problem's optimum is used as
/// it stands. Far above what the mixes measured need (`docs/tuning.md`).
const MAX_PATTERNS: usize = 400;

/// A sorted multiset of shares on one GPU, in thousandths.
pub type Contents = SmallVec<[u16; 8]>;

/// How a share placed on a GPU relates to the patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PatternFit {
    /// The GPU's pods with the new one are in no pattern (or a share the patterns do not know).
    Off = 0,
    /// The first share on an empty GPU, of a pattern.
    Opens = 1,
    /// Joins pods that, with it, are still part of a pattern.
    Joins = 2,
    /// Makes the GPU's pods exactly one of the patterns.
    Completes = 3,
}

/// Lookup sets hashed with foldhash: prioritize probes them for every candidate GPU of
/// thousands of nodes, and the keys are our own share sizes, not attacker-chosen.
type Set = HashSet<Contents, foldhash::fast::FixedState>;

/// The patterns of an optimal cut, as lookup sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FillPatterns {
    /// The share sizes the patterns hold, sorted: any other share is off the patterns without
    /// looking at the GPU.
    sizes: SmallVec<[u16; 16]>,
    /// Every non-empty sub-multiset of a used pattern.
    partial: Set,
    /// The used patterns themselves.
    complete: Set,
    /// The used patterns and how many GPUs of them the optimum cuts per unit of weight.
    used: Vec<(Contents, f64)>,
}

impl FillPatterns {
    /// The optimal patterns for shares of these sizes (thousandths) and weights.
    pub fn solve(items: &[(u16, f64)]) -> Self {
        let mut merged: Vec<(u16, f64)> = Vec::new();
        for &(u, w) in items {
            if !((MIN_UNITS..UNITS_PER_GPU).contains(&u) && w > 0.0 && w.is_finite()) {
                continue;
            }
            match merged.iter_mut().find(|m| m.0 == u) {
                Some(m) => m.1 += w,
                None => merged.push((u, w)),
            }
        }
        merged.sort_by_key(|m| std::cmp::Reverse(m.0));
        if merged.is_empty() {
            return Self::default();
        }
        let sizes: Vec<u16> = merged.iter().map(|m| m.0).collect();
        let demand: Vec<f64> = merged.iter().map(|m| m.1).collect();
        let used = cutting_stock(&sizes, &demand);
        let mut out = Self::default();
        for (counts, x) in used {
            let mut pattern: Contents = SmallVec::new();
            for (i, &c) in counts.iter().enumerate() {
                pattern.extend(std::iter::repeat_n(sizes[i], usize::from(c)));
            }
            pattern.sort_unstable();
            for sub in sub_multisets(&pattern) {
                out.partial.insert(sub);
            }
            for &u in &pattern {
                if let Err(at) = out.sizes.binary_search(&u) {
                    out.sizes.insert(at, u);
                }
            }
            out.complete.insert(pattern.clone());
            out.used.push((pattern, x));
        }
        out.used
            .sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    pub fn is_empty(&self) -> bool {
        self.complete.is_empty()
    }

    /// The patterns the optimum uses, most used first, with GPUs cut per unit of mix weight.
    pub fn used(&self) -> &[(Contents, f64)] {
        &self.used
    }

    /// Whether a share of `item` thousandths is in any pattern.
    pub fn knows(&self, item: u16) -> bool {
        self.sizes.binary_search(&item).is_ok()
    }

    /// Where a share of `item` thousandths on a GPU already holding `contents` (sorted) stands.
    pub fn fit(&self, contents: &[u16], item: u16) -> PatternFit {
        if !self.knows(item) || contents.iter().any(|u| !self.knows(*u)) {
            return PatternFit::Off;
        }
        let mut after: Contents = SmallVec::from_slice(contents);
        let at = after.partition_point(|&u| u < item);
        after.insert(at, item);
        if self.complete.contains(&after) {
            PatternFit::Completes
        } else if !self.partial.contains(&after) {
            PatternFit::Off
        } else if contents.is_empty() {
            PatternFit::Opens
        } else {
            PatternFit::Joins
        }
    }
}

/// A share of `bytes` on a GPU of `total` bytes, in thousandths, rounded up (at most a whole GPU).
pub fn units(bytes: u64, total: u64) -> u16 {
    if total == 0 {
        return UNITS_PER_GPU;
    }
    let u = (u128::from(bytes) * u128::from(UNITS_PER_GPU)).div_ceil(u128::from(total));
    // At most UNITS_PER_GPU, a u16.
    u16::try_from(u.min(u128::from(UNITS_PER_GPU))).unwrap_or(UNITS_PER_GPU)
}

/// The sharing shares of a mix on a GPU of this room and model: single-GPU classes that run
/// there and take less than the whole GPU, in thousandths, with their weights. A pod placement
/// gives the whole GPU ([`crate::placement::Demand::whole_on`]: a PyTorch pod whose cached
/// peak and the safety margin outgrow what the driver leaves of it) is no share, however close
/// its peak is to the GPU's size: counted as one, it made room in the patterns for a share
/// nobody places.
pub fn mix_items(shapes: &[(PodClass, f64)], gpu: GpuRoom, model: &str) -> Vec<(u16, f64)> {
    let total = gpu.total_bytes;
    shapes
        .iter()
        .filter(|(c, _)| {
            let d = &c.shape.demand;
            c.shape.gpus == 1 && c.accepts_model(model) && d.runs_in(gpu) && !d.whole_on(gpu)
        })
        .filter_map(|(c, w)| {
            let bytes = c.shape.demand.bytes_on(total);
            (bytes < total).then(|| (units(bytes, total), *w))
        })
        .collect()
}

/// Per GPU kind (its room, [`GpuRoom`], and model), the patterns of one mix, solved the first time a GPU of that
/// kind is scored. Shared by every reader of the mix; a new mix starts empty. A list, not a
/// map: a cluster has a handful of GPU kinds, and a scan compares the shared model strings by
/// pointer without allocating a key.
///
/// The first `INLINE_KINDS` kinds are read without a lock and lent by reference: prioritize
/// looks the patterns up for every node of a request from every core at once, and a shared lock
/// and reference count per node (atomics every core writes) cost more than the scoring around
/// them. Slots fill in order, under `filling`, so a reader may stop at the first empty one.
#[derive(Debug)]
pub struct PatternCache {
    kinds: [OnceLock<(GpuRoom, Arc<str>, FillPatterns)>; INLINE_KINDS],
    filling: Mutex<()>,
    /// Kinds beyond the inline ones, behind a lock as before.
    more: RwLock<Vec<KindPatterns>>,
}

/// GPU kinds whose patterns are read without a lock; a cluster with more pays a lock for the rest.
const INLINE_KINDS: usize = 16;

impl Default for PatternCache {
    fn default() -> Self {
        Self {
            kinds: [const { OnceLock::new() }; INLINE_KINDS],
            filling: Mutex::new(()),
            more: RwLock::new(Vec::new()),
        }
    }
}

/// A GPU's room, its model, and the patterns for that kind.
type KindPatterns = (GpuRoom, Arc<str>, Arc<FillPatterns>);

/// The patterns of one GPU kind: lent from the cache's inline slots, or shared beyond them.
#[derive(Clone, Debug)]
pub enum PatternsRef<'a> {
    Lent(&'a FillPatterns),
    Shared(Arc<FillPatterns>),
}

impl std::ops::Deref for PatternsRef<'_> {
    type Target = FillPatterns;

    fn deref(&self) -> &FillPatterns {
        match self {
            Self::Lent(p) => p,
            Self::Shared(p) => p,
        }
    }
}

impl PatternCache {
    pub fn get_or_solve(
        &self,
        room: GpuRoom,
        model: &Arc<str>,
        solve: impl FnOnce() -> FillPatterns,
    ) -> PatternsRef<'_> {
        let same = |r: GpuRoom, m: &Arc<str>| r == room && (Arc::ptr_eq(m, model) || m == model);
        let inline = || {
            self.kinds
                .iter()
                .map_while(OnceLock::get)
                .find(|(t, m, _)| same(*t, m))
                .map(|k| PatternsRef::Lent(&k.2))
        };
        let more = |kinds: &[KindPatterns]| {
            kinds
                .iter()
                .find(|(t, m, _)| same(*t, m))
                .map(|k| PatternsRef::Shared(k.2.clone()))
        };
        let read_more = || {
            more(
                &self
                    .more
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            )
        };
        if let Some(p) = inline().or_else(read_more) {
            return p;
        }
        // Solved outside the lock: two first readers may both solve; the answer is the same.
        let solved = solve();
        // Operators asking why two pods share a GPU (`--log info,peakfit::placement=debug`).
        tracing::debug!(
            gpu_total_bytes = room.total_bytes,
            gpu_usable_bytes = room.usable_bytes,
            model = %model,
            patterns = ?solved
                .used()
                .iter()
                .map(|(p, x)| (p.as_slice(), (x * 1000.0).round() / 1000.0))
                .collect::<Vec<_>>(),
            "fill patterns (shares in thousandths of the GPU, GPUs per unit of mix weight)"
        );
        let _filling = self
            .filling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = inline().or_else(read_more) {
            return p;
        }
        if let Some(slot) = self.kinds.iter().find(|k| k.get().is_none()) {
            let (_, _, p) = slot.get_or_init(|| (room, model.clone(), solved));
            return PatternsRef::Lent(p);
        }
        let solved = Arc::new(solved);
        self.more
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((room, model.clone(), solved.clone()));
        PatternsRef::Shared(solved)
    }
}

impl Clone for PatternCache {
    /// A clone starts empty: the patterns follow from the mix and are solved again on demand.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for PatternCache {
    /// A cache is derived data: two mixes are equal whatever their caches hold.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Every non-empty sub-multiset of a sorted multiset, each sorted.
fn sub_multisets(sorted: &[u16]) -> Vec<Contents> {
    // Distinct values with counts, then every choice of count per value.
    let mut values: Vec<(u16, usize)> = Vec::new();
    for &u in sorted {
        match values.last_mut() {
            Some(v) if v.0 == u => v.1 += 1,
            _ => values.push((u, 1)),
        }
    }
    let mut out: Vec<Contents> = vec![SmallVec::new()];
    for &(u, n) in &values {
        let mut next = Vec::with_capacity(out.len() * (n + 1));
        for base in &out {
            for k in 0..=n {
                let mut s = base.clone();
                s.extend(std::iter::repeat_n(u, k));
                next.push(s);
            }
        }
        out = next;
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Gilmore–Gomory column generation for `min Σ x_p` subject to `Σ_p a_ip x_p ≥ d_i`, `x ≥ 0`, with
/// `sizes` sorted descending. Returns the patterns with x > 0 (counts per size) and their x.
fn cutting_stock(sizes: &[u16], demand: &[f64]) -> Vec<(Vec<u16>, f64)> {
    let n = sizes.len();
    // Start from one pattern per size: as many of it as fit.
    let mut patterns: Vec<Vec<u16>> = (0..n)
        .map(|i| {
            let mut p = vec![0u16; n];
            p[i] = UNITS_PER_GPU / sizes[i];
            p
        })
        .collect();
    loop {
        let (y, x) = solve_master(&patterns, demand);
        let priced = patterns.len() >= MAX_PATTERNS;
        let candidate = (!priced)
            .then(|| best_pattern(sizes, &y))
            .flatten()
            .filter(|p| !patterns.contains(p));
        match candidate {
            Some(p) => patterns.push(p),
            None => {
                return patterns
                    .into_iter()
                    .zip(x)
                    .filter(|(_, x)| *x > 1e-9)
                    .collect();
            }
        }
    }
}

/// The pattern of greatest dual value (an unbounded knapsack over one GPU), if that value
/// exceeds one GPU's cost: a pattern that would lower the optimum.
fn best_pattern(sizes: &[u16], y: &[f64]) -> Option<Vec<u16>> {
    let cap = usize::from(UNITS_PER_GPU);
    let mut value = vec![0.0f64; cap + 1];
    let mut last: Vec<Option<usize>> = vec![None; cap + 1];
    for c in 1..=cap {
        value[c] = value[c - 1];
        last[c] = None;
        for (i, &s) in sizes.iter().enumerate() {
            let s = usize::from(s);
            if s <= c && value[c - s] + y[i] > value[c] + 1e-12 {
                value[c] = value[c - s] + y[i];
                last[c] = Some(i);
            }
        }
    }
    if value[cap] <= 1.0 + 1e-9 {
        return None;
    }
    let mut counts = vec![0u16; sizes.len()];
    let mut c = cap;
    while c > 0 {
        match last[c] {
            Some(i) => {
                counts[i] += 1;
                c -= usize::from(sizes[i]);
            }
            None => c -= 1,
        }
    }
    Some(counts)
}

/// The restricted master problem through its dual, `max d·y` subject to `Σ_i a_ip y_i ≤ 1` for each
/// pattern p, y ≥ 0, whose slack basis is feasible from the start. Dense tableau, Bland's rule
/// (no cycling; the problems have tens of rows). Returns the duals y and the primal x (the
/// objective row under each pattern's slack).
fn solve_master(patterns: &[Vec<u16>], demand: &[f64]) -> (Vec<f64>, Vec<f64>) {
    const EPS: f64 = 1e-10;
    let n = demand.len();
    let m = patterns.len();
    let cols = n + m + 1; // y, slacks, right-hand side
    let mut t = vec![0.0f64; (m + 1) * cols];
    for (r, p) in patterns.iter().enumerate() {
        for (i, &a) in p.iter().enumerate() {
            t[r * cols + i] = f64::from(a);
        }
        t[r * cols + n + r] = 1.0;
        t[r * cols + cols - 1] = 1.0;
    }
    for (i, &d) in demand.iter().enumerate() {
        t[m * cols + i] = -d;
    }
    let mut basis: Vec<usize> = (n..n + m).collect();
    for _ in 0..10_000 {
        let Some(enter) = (0..cols - 1).find(|&j| t[m * cols + j] < -EPS) else {
            break;
        };
        let mut leave: Option<(usize, f64)> = None;
        for r in 0..m {
            let a = t[r * cols + enter];
            if a > EPS {
                let ratio = t[r * cols + cols - 1] / a;
                let better = match leave {
                    None => true,
                    Some((lr, lratio)) => {
                        ratio < lratio - EPS || (ratio <= lratio + EPS && basis[r] < basis[lr])
                    }
                };
                if better {
                    leave = Some((r, ratio));
                }
            }
        }
        // Unbounded cannot happen: every size has its own pattern bounding y_i.
        let Some((pr, _)) = leave else { break };
        let pivot = t[pr * cols + enter];
        for j in 0..cols {
            t[pr * cols + j] /= pivot;
        }
        for r in 0..=m {
            if r == pr {
                continue;
            }
            let f = t[r * cols + enter];
            if f.abs() > 0.0 {
                for j in 0..cols {
                    t[r * cols + j] -= f * t[pr * cols + j];
                }
            }
        }
        basis[pr] = enter;
    }
    let mut y = vec![0.0; n];
    for (r, &b) in basis.iter().enumerate() {
        if b < n {
            y[b] = t[r * cols + cols - 1];
        }
    }
    let x = (0..m).map(|p| t[m * cols + n + p].max(0.0)).collect();
    (y, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[u16]) -> Contents {
        let mut c: Contents = SmallVec::from_slice(items);
        c.sort_unstable();
        c
    }

    #[test]
    fn the_cache_answers_each_kind_with_its_own_patterns_beyond_the_inline_slots() {
        // Kind k: GPUs of k + 1 bytes and model "m{k % 3}"; its patterns are solved from a share
        // that depends on k, so a lookup answered with another kind's patterns shows.
        let cache = PatternCache::default();
        let models: Vec<Arc<str>> = (0..3).map(|m| format!("m{m}").into()).collect();
        let solve_for = |k: u64| FillPatterns::solve(&[(100 + u16::try_from(k).unwrap(), 1.0)]);
        let kinds = 2 * INLINE_KINDS as u64 + 3;
        let mut solves = 0;
        for round in 0..2 {
            for k in 0..kinds {
                // The second round asks with another Arc of the same model name.
                let name = &models[usize::try_from(k % 3).unwrap()];
                let model: Arc<str> = if round == 0 {
                    name.clone()
                } else {
                    (**name).into()
                };
                let got = cache.get_or_solve(GpuRoom::bare(k + 1), &model, || {
                    solves += 1;
                    solve_for(k)
                });
                assert_eq!(*got, solve_for(k), "kind {k}, round {round}");
                assert_eq!(
                    matches!(got, PatternsRef::Lent(_)),
                    k < INLINE_KINDS as u64,
                    "kind {k}"
                );
            }
        }
        assert_eq!(solves, kinds, "each kind solved once");
    }

    #[test]
    fn complementary_shares_pair_up() {
        // Equal numbers of 0.65 and 0.32 pods, and 0.47 pods: the optimum cuts 0.65 + 0.32
        // and 0.47 + 0.47, never 0.47 + 0.32 (0.21 left over).
        let p = FillPatterns::solve(&[(650, 1.0), (320, 1.0), (470, 2.0)]);
        let used: Vec<&Contents> = p.used().iter().map(|u| &u.0).collect();
        assert!(used.contains(&&set(&[320, 650])), "{used:?}");
        assert!(used.contains(&&set(&[470, 470])), "{used:?}");
        assert_eq!(p.fit(&[470], 320), PatternFit::Off);
        assert_eq!(p.fit(&[650], 320), PatternFit::Completes);
        assert_eq!(p.fit(&[470], 470), PatternFit::Completes);
        assert_eq!(p.fit(&[], 320), PatternFit::Opens);
    }

    #[test]
    fn the_optimum_uses_as_few_gpus_as_the_known_answer() {
        // 0.5, 0.3 and 0.2 in equal numbers pack perfectly (0.5 + 0.3 + 0.2, or 0.5 × 2 with
        // 0.3 × 2 + 0.2 × 2): one GPU per unit of weight, and every pattern used is full.
        let p = FillPatterns::solve(&[(500, 1.0), (300, 1.0), (200, 1.0)]);
        let gpus: f64 = p.used().iter().map(|u| u.1).sum();
        assert!((gpus - 1.0).abs() < 1e-6, "{:?}", p.used());
        for (pattern, _) in p.used() {
            assert_eq!(pattern.iter().map(|&u| u32::from(u)).sum::<u32>(), 1000);
            let (last, rest) = pattern.split_last().unwrap();
            assert_eq!(p.fit(rest, *last), PatternFit::Completes, "{pattern:?}");
        }
        assert_eq!(p.fit(&[300, 300], 300), PatternFit::Off);
    }

    #[test]
    fn the_lp_bound_matches_a_hand_solved_cut() {
        // Sizes 0.45 and 0.35, demand 2 : 1. Patterns: 0.45×2 (0.1 left), 0.35×2 (0.3 left),
        // 0.45 + 0.35 (0.2 left). The dual y = (0.5, 0.5) bounds the optimum at 2·0.5 + 0.5 =
        // 1.5 GPUs, which 0.45×2 once and 0.35×2 half a time reach.
        let p = FillPatterns::solve(&[(450, 2.0), (350, 1.0)]);
        let gpus: f64 = p.used().iter().map(|u| u.1).sum();
        assert!((gpus - 1.5).abs() < 1e-6, "{:?}", p.used());
    }

    #[test]
    fn shares_outside_the_patterns_and_empty_mixes_are_off() {
        let p = FillPatterns::solve(&[(810, 1.0)]);
        assert_eq!(p.fit(&[], 810), PatternFit::Completes);
        assert_eq!(p.fit(&[810], 160), PatternFit::Off);
        assert_eq!(p.fit(&[], 333), PatternFit::Off);
        let none = FillPatterns::solve(&[]);
        assert!(none.is_empty());
        assert_eq!(none.fit(&[], 500), PatternFit::Off);
        // Whole GPUs and specks are not shares the patterns consider.
        assert!(FillPatterns::solve(&[(1000, 1.0), (5, 1.0)]).is_empty());
    }

    /// A PyTorch pod whose cached peak and margin outgrow what the driver leaves of a GPU is
    /// placed there whole ([`crate::placement::Demand::whole_on`]), however close the peak is
    /// to the GPU's size: the patterns count it as no share, as placement does. On a GPU its
    /// peak fits, it shares.
    #[test]
    fn a_pod_that_takes_the_gpu_whole_is_no_share() {
        use crate::placement::{Demand, PodShape};
        const GI: u64 = 1 << 30;
        let class = |demand| (PodClass::from(PodShape { gpus: 1, demand }), 1.0);
        let fills = Demand {
            min_gpu_total_bytes: 19 * GI,
            fills_gpu: true,
            ..Demand::fixed(80 * GI - GI / 4)
        };
        let shapes = [class(fills), class(Demand::fixed(40 * GI))];
        let h100 = GpuRoom {
            total_bytes: 80 * GI,
            usable_bytes: 80 * GI - GI / 2,
            margin_bytes: 256 << 20,
        };
        assert!(fills.whole_on(h100));
        assert_eq!(mix_items(&shapes, h100, "H100"), [(500, 1.0)]);
        assert_eq!(
            mix_items(&shapes, GpuRoom::bare(80 * GI), "H100"),
            [(997, 1.0), (500, 1.0)]
        );
        // A peak within the margin of the usable memory: whole too, so no share either.
        let tight = Demand {
            fixed_bytes: h100.usable_bytes - (128 << 20),
            ..fills
        };
        let shapes = [class(tight), class(Demand::fixed(40 * GI))];
        assert_eq!(mix_items(&shapes, h100, "H100"), [(500, 1.0)]);
    }

    #[test]
    fn units_round_up_and_cap_at_one_gpu() {
        assert_eq!(units(810, 1000), 810);
        let t = 15_842_934_784u64;
        assert_eq!(
            units(crate::convert::f64_to_u64((0.81 * t as f64).floor()), t),
            810
        );
        assert_eq!(units(1, 3), 334);
        assert_eq!(units(5, 3), 1000);
        assert_eq!(units(5, 0), 1000);
    }

    #[test]
    fn sub_multisets_are_all_non_empty_choices() {
        let subs = sub_multisets(&[1, 1, 2]);
        assert_eq!(subs.len(), 5); // {1}, {1,1}, {2}, {1,2}, {1,1,2}
        assert!(subs.contains(&set(&[1, 1, 2])));
        assert!(!subs.iter().any(smallvec::SmallVec::is_empty));
    }
}
