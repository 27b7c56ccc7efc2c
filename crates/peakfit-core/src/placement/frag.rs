//! Fragmentation as the FGD paper (Weng et al., USENIX ATC'23) measures it: free GPU memory that
//! the pods the cluster usually sees could not use.
//!
//! For a node and a pod shape m: if the node cannot host m at all (too few GPUs with a share of
//! m free, not enough CPU, a GPU-less m) all of its free memory is fragment for m; otherwise the
//! free memory on the GPUs that cannot take one share of m is. The node's fragmentation is the
//! expectation over the mix of typical shapes, `F = Σ_m p_m · frag(m)`. Placing a pod where it
//! raises `F` least keeps the cluster able to host what usually comes next.
//!
//! `FragState` holds, per shape, how many GPUs fit a share and the free memory on those that do
//! not, so the effect of taking memory from a few GPUs is O(changed GPUs × shapes) instead of a
//! rescan of the node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::demand::PodClass;
use super::fit::FitConfig;
use super::ledger::{GpuLedger, NodeLedger};
use super::patterns::{FillPatterns, PatternCache, PatternsRef};

/// A probability distribution over pod classes: what the cluster expects to be asked next.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShapeMix {
    /// Per GPU size, how the mix's sharing pods are best combined on a GPU (solved on first use).
    #[serde(skip)]
    patterns: PatternCache,
    shapes: Vec<(PodClass, f64)>,
    /// Per GPU model: how much of its capacity the expected model-restricted pods need, as a
    /// multiple of the average load (see `with_capacity`). Empty when no capacity is known.
    /// Hashed with foldhash: scoring looks a model up for every node of a request, and the keys
    /// are the cluster's own model names.
    #[serde(default)]
    model_pressure: HashMap<String, f64, foldhash::fast::FixedState>,
    /// Changes whenever the mix does, so callers can cache fragmentation per (node, mix).
    #[serde(skip)]
    generation: u64,
}

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl ShapeMix {
    /// From weighted classes (weights need not sum to 1; non-positive ones are dropped, equal
    /// classes merged).
    pub fn new(weighted: impl IntoIterator<Item = (PodClass, f64)>) -> Self {
        let mut merged: HashMap<PodClass, f64> = HashMap::new();
        let mut order: Vec<PodClass> = Vec::new();
        for (class, w) in weighted {
            if !(w > 0.0 && w.is_finite()) {
                continue;
            }
            let slot = merged.entry(class.clone()).or_insert_with(|| {
                order.push(class);
                0.0
            });
            *slot += w;
        }
        let sum: f64 = merged.values().sum();
        let shapes = order
            .into_iter()
            .map(|c| {
                let w = merged[&c] / sum;
                (c, w)
            })
            .collect();
        Self {
            patterns: PatternCache::default(),
            shapes,
            model_pressure: HashMap::default(),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Tells the mix how many GPUs of each model the cluster has, so it can say which models the
    /// model-restricted pods will need: pressure(X) = the restricted GPU demand expected on X
    /// (each restricted shape's demand spread over its allowed models by capacity), per GPU of
    /// X, relative to the cluster's average demand per GPU. 1.0 means restricted pods alone
    /// will fill X at the cluster's average load; unrestricted pods should stay off it.
    pub fn with_capacity(
        mut self,
        gpus_per_model: impl IntoIterator<Item = (String, f64)>,
    ) -> Self {
        let mut capacity: HashMap<String, f64> = HashMap::new();
        for (model, gpus) in gpus_per_model {
            *capacity.entry(model).or_default() += gpus;
        }
        let total: f64 = capacity.values().sum();
        let units = |c: &PodClass| f64::from(c.shape.gpus) * c.shape.demand.gpu_fraction.min(1.0);
        let demand: f64 = self.shapes.iter().map(|(c, p)| p * units(c)).sum();
        let mut restricted: HashMap<&str, f64> = HashMap::new();
        for (class, p) in &self.shapes {
            let allowed: f64 = class
                .gpu_models
                .iter()
                .filter_map(|m| capacity.get(m))
                .sum();
            if class.gpu_models.is_empty() || allowed <= 0.0 {
                continue;
            }
            for model in &class.gpu_models {
                if let Some(cap) = capacity.get(model) {
                    *restricted.entry(model).or_default() += p * units(class) * cap / allowed;
                }
            }
        }
        self.model_pressure = if demand > 0.0 && total > 0.0 {
            capacity
                .iter()
                .filter(|(_, cap)| **cap > 0.0)
                .map(|(m, cap)| {
                    let r = restricted.get(m.as_str()).copied().unwrap_or(0.0);
                    (m.clone(), r / cap * total / demand)
                })
                .collect()
        } else {
            HashMap::default()
        };
        self.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        self
    }

    /// `with_capacity` with the GPUs of these nodes (by `GpuLedger::model`).
    pub fn with_cluster<'n>(self, nodes: impl IntoIterator<Item = &'n NodeLedger>) -> Self {
        let gpus = nodes
            .into_iter()
            .flat_map(|n| n.gpus.iter().map(|g| (g.model.to_string(), 1.0)));
        self.with_capacity(gpus)
    }

    /// See `with_capacity`; 0 for unknown models.
    pub fn model_pressure(&self, model: &str) -> f64 {
        self.model_pressure.get(model).copied().unwrap_or(0.0)
    }

    /// FGD's "typical pods": the most frequent classes of `pods` that together cover at least
    /// `coverage` (e.g. 0.95) of them, frequencies renormalised.
    pub fn typical(pods: impl IntoIterator<Item = PodClass>, coverage: f64) -> Self {
        let mut counts: HashMap<PodClass, (u64, usize)> = HashMap::new();
        for (i, pod) in pods.into_iter().enumerate() {
            counts.entry(pod).or_insert((0, i)).0 += 1;
        }
        let mut counted: Vec<(PodClass, f64, usize)> = counts
            .into_iter()
            .map(|(c, (n, first))| (c, n as f64, first))
            .collect();
        Self::covering(&mut counted, coverage)
    }

    /// The heaviest entries covering `coverage` of the total weight; ties keep first-seen order.
    fn covering(counted: &mut [(PodClass, f64, usize)], coverage: f64) -> Self {
        counted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
        let total: f64 = counted.iter().map(|c| c.1).sum();
        let mut acc = 0.0;
        let mut kept = Vec::new();
        for (class, w, _) in counted.iter() {
            if acc >= coverage * total {
                break;
            }
            acc += w;
            kept.push((class.clone(), *w));
        }
        Self::new(kept)
    }

    pub fn shapes(&self) -> &[(PodClass, f64)] {
        &self.shapes
    }

    /// The fill patterns of this mix's sharing pods on a GPU of this room and model, a pod's
    /// peak kept `margin_bytes` from the rest (`FitConfig::safety_margin_bytes`).
    pub fn fill_patterns(&self, gpu: &GpuLedger, margin_bytes: u64) -> PatternsRef<'_> {
        let room = gpu.room(margin_bytes);
        self.patterns.get_or_solve(room, &gpu.model, || {
            FillPatterns::solve(&super::patterns::mix_items(&self.shapes, room, &gpu.model))
        })
    }

    /// No class's share further than `tolerance` from the other's (a class one mix lacks counts
    /// as share 0 there), and the same model pressure. An empty and a non-empty mix are never
    /// close.
    pub fn close_to(&self, other: &ShapeMix, tolerance: f64) -> bool {
        let share_in = |mix: &ShapeMix, class: &PodClass| {
            mix.shapes
                .iter()
                .find(|(c, _)| c == class)
                .map_or(0.0, |s| s.1)
        };
        self.is_empty() == other.is_empty()
            && self.model_pressure == other.model_pressure
            && self
                .shapes
                .iter()
                .all(|(c, p)| (p - share_in(other, c)).abs() <= tolerance)
            && other
                .shapes
                .iter()
                .all(|(c, p)| (p - share_in(self, c)).abs() <= tolerance)
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// CPU the expected pods ask per GPU they take (millicores per whole GPU), GPU-less pods'
    /// CPU included: the ratio at which a node's CPU and GPUs run out together. `None` when the
    /// mix asks for no CPU or no GPU. `cpu_per_gpu_on` with no GPU size: pods sized in bytes
    /// count no GPU.
    pub fn cpu_per_gpu(&self) -> Option<f64> {
        self.cpu_per_gpu_on(0)
    }

    /// `cpu_per_gpu` on GPUs of `gpu_total` bytes: a pod sized in bytes (`peakfit.io/vram`, a
    /// model's peak) takes that share of such a GPU, one sized as a fraction its fraction on any
    /// GPU. Without the sizes, a cluster of byte-sized pods had no ratio, and CPU balance never
    /// scored in a real cluster.
    pub fn cpu_per_gpu_on(&self, gpu_total: u64) -> Option<f64> {
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for (class, p) in &self.shapes {
            let d = &class.shape.demand;
            // Fractions exactly as given (bytes and back would move the last bits).
            let share = if d.fixed_bytes == 0 {
                d.gpu_fraction.min(1.0)
            } else if gpu_total == 0 {
                0.0
            } else {
                (d.bytes_on(gpu_total) as f64 / gpu_total as f64).min(1.0)
            };
            cpu += p * class.cpu_milli as f64;
            gpu += p * f64::from(class.shape.gpus) * share;
        }
        (cpu > 0.0 && gpu > 0.0).then(|| cpu / gpu)
    }
}

/// How many observations a staged mix waits for `ShapeStats::promote` before it replaces the
/// current one anyway: a few refreshes' worth, far longer than a prescore pass takes.
pub const MAX_STAGED_OBSERVATIONS: u32 = 256;

/// Tunables of the recent-shapes window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapeStatsConfig {
    /// After this many observations a pod's weight has halved: the window follows a workload
    /// that changes over hours without forgetting a burst of one shape at once.
    pub half_life_pods: f64,
    /// Share of recent pods the mix covers (FGD: 0.95); rarer shapes are left out.
    pub coverage: f64,
    /// Distinct classes remembered; the lightest is forgotten first.
    pub max_classes: usize,
    /// The mix is rebuilt after this many observations, so caches keyed on its generation stay
    /// useful between rebuilds.
    pub refresh_every: u32,
    /// A rebuilt mix none of whose shares moved by more than this (a class entering or leaving
    /// at the coverage edge moves by its share) replaces nothing: a steady workload keeps one
    /// mix, and every score remembered under it, instead of invalidating every node's memo each
    /// `refresh_every` pods. Below the share of a typical class of a mix of many: a class
    /// missing from the first pods seen must bring it in when it shows up, or the mix of the
    /// first `refresh_every` pods stays for good (`docs/tuning.md`).
    pub refresh_tolerance: f64,
    /// Pods remembered by key so that each counts once however often it is filtered (a pod in
    /// backoff is asked about again and again); the oldest key is forgotten first.
    pub remembered_pods: usize,
}

impl Default for ShapeStatsConfig {
    fn default() -> Self {
        Self {
            half_life_pods: 2000.0,
            coverage: 0.95,
            max_classes: 256,
            refresh_every: 64,
            refresh_tolerance: 0.01,
            remembered_pods: 1 << 17,
        }
    }
}

/// A bounded, decaying count of the pod classes the scheduler has been asked about, from which
/// the current `ShapeMix` is built. The extender feeds it on every filter.
#[derive(Clone, Debug)]
pub struct ShapeStats {
    cfg: ShapeStatsConfig,
    /// Weight of each class, in units of the current increment.
    weights: HashMap<PodClass, (f64, usize)>,
    /// Instead of decaying every weight on each observation, each new one counts a little more;
    /// everything is rescaled when the increment grows large.
    increment: f64,
    growth: f64,
    seen: usize,
    since_refresh: u32,
    mix: std::sync::Arc<ShapeMix>,
    /// GPUs per model, for the mix's model pressure (`ShapeMix::with_capacity`); empty when
    /// unknown. `capacity_generation` is the caller's counter it came with.
    capacity: Vec<(String, f64)>,
    capacity_generation: Option<u64>,
    seen_pods: std::collections::HashSet<String>,
    seen_order: std::collections::VecDeque<String>,
    /// With `stage_new_mixes`: a new mix waiting for the caller to warm its scores before it
    /// replaces `mix` (`promote`), and the observations it has waited.
    staged: Option<(std::sync::Arc<ShapeMix>, u32)>,
    stage_new_mixes: bool,
}

impl ShapeStats {
    pub fn new(cfg: ShapeStatsConfig) -> Self {
        let growth = 2f64.powf(1.0 / cfg.half_life_pods.max(1.0));
        Self {
            cfg,
            weights: HashMap::new(),
            increment: 1.0,
            growth,
            seen: 0,
            since_refresh: 0,
            mix: std::sync::Arc::new(ShapeMix::default()),
            capacity: Vec::new(),
            capacity_generation: None,
            seen_pods: std::collections::HashSet::default(),
            seen_order: std::collections::VecDeque::default(),
            staged: None,
            stage_new_mixes: false,
        }
    }

    /// From now on a new mix is staged (`staged`) instead of replacing the current one at once,
    /// until `promote`: the extender's prescorer scores the new mix's usual classes on every
    /// node first, so that no request pays for a cluster's worth of scoring when the mix
    /// changes. A staged mix left waiting for `MAX_STAGED_OBSERVATIONS` observations (the
    /// prescorer stopped) replaces the current one anyway.
    pub fn stage_new_mixes(&mut self) {
        self.stage_new_mixes = true;
    }

    /// The mix waiting to replace the current one, if any.
    pub fn staged(&self) -> Option<std::sync::Arc<ShapeMix>> {
        self.staged.as_ref().map(|s| s.0.clone())
    }

    /// Makes `warmed` the current mix, if it is still the staged one (a newer one stays staged,
    /// to be warmed next). Returns whether it did.
    pub fn promote(&mut self, warmed: &std::sync::Arc<ShapeMix>) -> bool {
        match &self.staged {
            Some((staged, _)) if std::sync::Arc::ptr_eq(staged, warmed) => {
                self.mix = warmed.clone();
                self.staged = None;
                true
            }
            _ => false,
        }
    }

    /// `observe`, once per pod: a key seen before (among the last `remembered_pods`) counts
    /// nothing. Returns whether it counted.
    pub fn observe_pod(&mut self, key: &str, class: &PodClass) -> bool {
        if self.seen_pods.contains(key) {
            return false;
        }
        if self.seen_order.len() >= self.cfg.remembered_pods.max(1)
            && let Some(old) = self.seen_order.pop_front()
        {
            self.seen_pods.remove(&old);
        }
        self.seen_pods.insert(key.to_owned());
        self.seen_order.push_back(key.to_owned());
        self.observe(class);
        true
    }

    /// The cluster's GPUs per model, tagged with the caller's counter: the mix is rebuilt with
    /// the new capacity only when the counter moved (`fetch` is not called otherwise).
    pub fn sync_capacity<I>(&mut self, generation: u64, fetch: impl FnOnce() -> I)
    where
        I: IntoIterator<Item = (String, f64)>,
    {
        if self.capacity_generation == Some(generation) {
            return;
        }
        self.capacity_generation = Some(generation);
        let capacity: Vec<(String, f64)> = fetch().into_iter().collect();
        if capacity != self.capacity {
            self.capacity = capacity;
            if !self.weights.is_empty() {
                self.refresh();
            }
        }
    }

    pub fn observe(&mut self, class: &PodClass) {
        self.seen += 1;
        let seen = self.seen;
        match self.weights.get_mut(class) {
            Some(w) => w.0 += self.increment,
            None => {
                if self.weights.len() >= self.cfg.max_classes {
                    self.forget_lightest();
                }
                self.weights.insert(class.clone(), (self.increment, seen));
            }
        }
        self.increment *= self.growth;
        if self.increment > 1e100 {
            for w in self.weights.values_mut() {
                w.0 /= self.increment;
            }
            self.increment = 1.0;
        }
        self.since_refresh += 1;
        if let Some((staged, waited)) = &mut self.staged {
            *waited += 1;
            if *waited >= MAX_STAGED_OBSERVATIONS {
                self.mix = staged.clone();
                self.staged = None;
            }
        }
        // Until `refresh_every` pods are seen, the mix is rebuilt each time the evidence has
        // doubled (after 1, 2, 4, ... pods): otherwise the first pod's class alone is the mix
        // for the next `refresh_every - 1` pods, and on an empty cluster those are the
        // placements everything later packs around (the built-in packing run lost to FGD on 4
        // of 10 seeds for exactly that, `docs/simulate.md`). At most log2(`refresh_every`)
        // rebuilds, all while the memos are nearly empty.
        let warming = self.seen < self.cfg.refresh_every as usize && self.seen.is_power_of_two();
        if self.since_refresh >= self.cfg.refresh_every || self.mix.is_empty() || warming {
            self.refresh();
        }
    }

    fn forget_lightest(&mut self) {
        if let Some(lightest) = self
            .weights
            .iter()
            .min_by(|a, b| a.1.0.total_cmp(&b.1.0))
            .map(|(c, _)| c.clone())
        {
            self.weights.remove(&lightest);
        }
    }

    /// Rebuilds the mix now (also done every `refresh_every` observations).
    pub fn refresh(&mut self) {
        let mut counted: Vec<(PodClass, f64, usize)> = self
            .weights
            .iter()
            .map(|(c, &(w, first))| (c.clone(), w, first))
            .collect();
        let mut mix = ShapeMix::covering(&mut counted, self.cfg.coverage);
        if !self.capacity.is_empty() {
            mix = mix.with_capacity(self.capacity.iter().cloned());
        }
        let latest = self.staged.as_ref().map_or(&self.mix, |s| &s.0);
        if !mix.close_to(latest, self.cfg.refresh_tolerance) {
            let mix = std::sync::Arc::new(mix);
            // Nothing to keep warm under an empty mix (scoring without one is cheap packing).
            if self.stage_new_mixes && !self.mix.is_empty() {
                let waited = self.staged.as_ref().map_or(0, |s| s.1);
                self.staged = Some((mix, waited));
            } else {
                self.mix = mix;
                self.staged = None;
            }
        }
        self.since_refresh = 0;
    }

    /// The current mix (what scoring uses; a staged one is not, until promoted); cheap to clone
    /// and hand to scoring outside any lock.
    pub fn mix(&self) -> std::sync::Arc<ShapeMix> {
        self.mix.clone()
    }
}

impl Default for ShapeStats {
    fn default() -> Self {
        Self::new(ShapeStatsConfig::default())
    }
}

/// How a GPU's free memory is counted in fragmentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FragUnit {
    /// In GPUs: each GPU's free memory as a fraction of its size, FGD's milli-GPU / 1000.
    /// What scoring uses, because what a cluster loses to fragmentation is GPUs nobody can use.
    #[default]
    Gpus,
    /// In bytes: what the `peakfit_node_fragmentation_ratio` metric reports.
    Bytes,
}

impl FragUnit {
    pub(crate) fn weight(self, gpu: &GpuLedger) -> f64 {
        match self {
            FragUnit::Bytes => 1.0,
            FragUnit::Gpus if gpu.total_bytes == 0 => 0.0,
            FragUnit::Gpus => 1.0 / gpu.total_bytes as f64,
        }
    }
}

/// Per shape: GPUs that can take a share, and weighted free memory on those that cannot.
#[derive(Clone, Copy, Debug, Default)]
struct ShapeAgg {
    fitting: u32,
    stranded: f64,
}

/// A node's fragmentation broken down so that small changes are cheap to evaluate.
#[derive(Clone, Debug)]
pub struct FragState<'a> {
    mix: &'a ShapeMix,
    /// Weighted free memory of the whole node.
    all: f64,
    cpu_free: Option<u64>,
    shapes: SmallVec<[ShapeAgg; 16]>,
    /// Per GPU of the node, its row in `needs`: GPUs of one kind (`GpuLedger::same_kind`: room
    /// and model) share a row, so a node of identical GPUs computes each shape's need once. By
    /// size alone, a GPU whose driver keeps more than its group's first was judged by that
    /// GPU's need (a whole GPU's usable memory), unlike the fill patterns, keyed by the room.
    group_of: SmallVec<[u32; 8]>,
    /// Row-major, one row of `mix.shapes.len()` per group: the free bytes a GPU of the group
    /// needs to take one share of the shape (margin included); `u64::MAX` = never.
    needs: SmallVec<[u64; 32]>,
    /// Per group: the weight of one free byte in `unit`.
    weights: SmallVec<[f64; 2]>,
}

/// One GPU's change, by its index in `NodeLedger::gpus`: its free bytes before and after.
#[derive(Clone, Copy, Debug)]
pub struct GpuChange {
    pub gpu: usize,
    pub free_before: u64,
    pub free_after: u64,
}

fn share_need(class: &PodClass, gpu: &GpuLedger, margin: u64) -> u64 {
    let d = &class.shape.demand;
    if class.shape.gpus == 0 || !d.runs_in(gpu.room(margin)) || !class.accepts_model(&gpu.model) {
        return u64::MAX;
    }
    super::fit::need_on(d, gpu, margin).1
}

impl<'a> FragState<'a> {
    /// O(GPUs × shapes) compares, plus O(distinct GPU kinds × shapes) needs.
    pub fn new(node: &NodeLedger, mix: &'a ShapeMix, cfg: &FitConfig, unit: FragUnit) -> Self {
        // Inline storage throughout: thousands of nodes per request, no allocation per node
        // for up to 8 GPUs, 2 kinds and 16 shapes.
        let m = mix.shapes.len();
        let mut reps: SmallVec<[usize; 2]> = SmallVec::new();
        let mut needs: SmallVec<[u64; 32]> = SmallVec::new();
        let mut weights: SmallVec<[f64; 2]> = SmallVec::new();
        let mut group_of: SmallVec<[u32; 8]> = SmallVec::new();
        for (i, gpu) in node.gpus.iter().enumerate() {
            let found = reps.iter().position(|&r| node.gpus[r].same_kind(gpu));
            let g = found.unwrap_or_else(|| {
                reps.push(i);
                weights.push(unit.weight(gpu));
                needs.extend(
                    mix.shapes
                        .iter()
                        .map(|(class, _)| share_need(class, gpu, cfg.safety_margin_bytes)),
                );
                reps.len() - 1
            });
            group_of.push(crate::convert::usize_to_u32(g));
        }
        let mut state = Self {
            mix,
            all: 0.0,
            cpu_free: node.cpu_free_milli(),
            shapes: smallvec::smallvec![ShapeAgg::default(); m],
            group_of,
            needs,
            weights,
        };
        for (i, gpu) in node.gpus.iter().enumerate() {
            let free = gpu.free_bytes();
            let g = state.group_of[i] as usize;
            let wf = state.weights[g] * free as f64;
            state.all += wf;
            let row = &state.needs[g * m..(g + 1) * m];
            if free == 0 {
                continue;
            }
            for (agg, &need) in state.shapes.iter_mut().zip(row) {
                if free >= need {
                    agg.fitting += 1;
                } else {
                    agg.stranded += wf;
                }
            }
        }
        state
    }

    /// `F = Σ_m p_m · frag(m)`.
    pub fn value(&self) -> f64 {
        self.mix
            .shapes
            .iter()
            .zip(&self.shapes)
            .map(|((class, p), &agg)| p * Self::frag_of(class, agg, self.all, self.cpu_free))
            .sum()
    }

    /// Which kind (room and model, `GpuLedger::same_kind`) GPU `gpu` is: equal kinds are
    /// interchangeable.
    pub fn kind_of(&self, gpu: usize) -> u32 {
        self.group_of[gpu]
    }

    /// Weighted free memory of the node.
    pub fn free(&self) -> f64 {
        self.all
    }

    /// Applies GPU changes (and CPU taken) for good; O(changes × shapes).
    pub fn apply(&mut self, changes: &[GpuChange], cpu_taken: u64) {
        for m in 0..self.shapes.len() {
            self.shapes[m] = self.shape_after(m, self.shapes[m], changes);
        }
        self.all = self.all_after(changes);
        self.cpu_free = self.cpu_free.map(|c| c.saturating_sub(cpu_taken));
    }

    /// `F` after the changes, without keeping them; O(changes × shapes), no allocation.
    pub fn value_after(&self, changes: &[GpuChange], cpu_taken: u64) -> f64 {
        let all = self.all_after(changes);
        let cpu_free = self.cpu_free.map(|c| c.saturating_sub(cpu_taken));
        let mut f = 0.0;
        for (m, ((class, p), &agg)) in self.mix.shapes.iter().zip(&self.shapes).enumerate() {
            let agg = self.shape_after(m, agg, changes);
            f += p * Self::frag_of(class, agg, all, cpu_free);
        }
        f
    }

    fn frag_of(class: &PodClass, agg: ShapeAgg, all: f64, cpu_free: Option<u64>) -> f64 {
        let hosts = class.shape.gpus > 0
            && agg.fitting >= class.shape.gpus
            && cpu_free.is_none_or(|c| c >= class.cpu_milli);
        if hosts { agg.stranded } else { all }
    }

    fn all_after(&self, changes: &[GpuChange]) -> f64 {
        changes.iter().fold(self.all, |all, ch| {
            let w = self.weights[self.group_of[ch.gpu] as usize];
            all + w * ch.free_after as f64 - w * ch.free_before as f64
        })
    }

    fn shape_after(&self, m: usize, mut agg: ShapeAgg, changes: &[GpuChange]) -> ShapeAgg {
        let width = self.shapes.len();
        for ch in changes {
            let g = self.group_of[ch.gpu] as usize;
            let w = self.weights[g];
            let need = self.needs[g * width + m];
            // A GPU with nothing free was never counted (see `new`).
            if ch.free_before > 0 {
                if ch.free_before >= need {
                    agg.fitting -= 1;
                } else {
                    agg.stranded -= w * ch.free_before as f64;
                }
            }
            if ch.free_after > 0 {
                if ch.free_after >= need {
                    agg.fitting += 1;
                } else {
                    agg.stranded += w * ch.free_after as f64;
                }
            }
        }
        agg
    }
}

/// The node's expected fragmentation over the mix (in `unit`).
pub fn node_fragmentation(
    node: &NodeLedger,
    mix: &ShapeMix,
    cfg: &FitConfig,
    unit: FragUnit,
) -> f64 {
    FragState::new(node, mix, cfg, unit).value()
}

/// Fragmented share of the node's free memory, 0..1 (0 when nothing is free), for
/// `peakfit_node_fragmentation_ratio`.
pub fn fragmentation_ratio(node: &NodeLedger, mix: &ShapeMix, cfg: &FitConfig) -> f64 {
    let state = FragState::new(node, mix, cfg, FragUnit::Bytes);
    if state.free() <= 0.0 || mix.is_empty() {
        return 0.0;
    }
    (state.value() / state.free()).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::placement::demand::{Demand, PodShape};
    use crate::placement::test_support::{node, share};

    #[test]
    fn fragmentation_follows_fgd_definition() {
        let cfg = FitConfig::simulation();
        let mix = ShapeMix::new([
            (share(500, 1), 0.5),
            (share(1000, 1), 0.25),
            (share(0, 0), 0.25),
        ]);
        // Free: 1000, 300, 600 (GPU units: 1.0, 0.3, 0.6).
        let n = node(&[1000, 300, 600]);
        let f = node_fragmentation(&n, &mix, &cfg, FragUnit::Gpus);
        // half GPU: only the 0.3 is stranded; whole GPU: 0.3 + 0.6; GPU-less: all 1.9.
        let want = 0.5 * 0.3 + 0.25 * 0.9 + 0.25 * 1.9;
        assert!((f - want).abs() < 1e-9, "{f} vs {want}");
        // A whole-GPU pod on a node with no whole GPU free: everything is fragment for it.
        let n = node(&[300, 600]);
        let f = node_fragmentation(&n, &mix, &cfg, FragUnit::Gpus);
        let want = 0.5 * 0.3 + 0.25 * 0.9 + 0.25 * 0.9;
        assert!((f - want).abs() < 1e-9, "{f} vs {want}");
        assert!((fragmentation_ratio(&n, &mix, &cfg) - want / 0.9).abs() < 1e-9);
    }

    /// Two GPUs of one size whose drivers keep different amounts are two kinds, as they are to
    /// the fill patterns (keyed by the room): a whole-GPU pod needs each one's own usable
    /// memory. Grouped by size, the second GPU was judged by the first's need (990 bytes here)
    /// and its 950 free counted as stranded for a pod the fit places there.
    #[test]
    fn same_size_gpus_with_different_driver_reserves_are_two_kinds() {
        let cfg = FitConfig::simulation();
        let whole = share(1000, 1);
        let mix = ShapeMix::new([(whole.clone(), 1.0)]);
        for reserves in [[10, 50], [50, 10]] {
            let mut n = node(&[1000, 1000]);
            for (g, r) in n.gpus.iter_mut().zip(reserves) {
                g.driver_reserved_bytes = r;
            }
            for g in &n.gpus {
                assert!(crate::placement::fit::share_on(g, &whole, &cfg).is_some());
            }
            let state = FragState::new(&n, &mix, &cfg, FragUnit::Gpus);
            let f = state.value();
            assert!(f.abs() < 1e-12, "{reserves:?}: {f}");
            assert_ne!(state.kind_of(0), state.kind_of(1), "{reserves:?}");
        }
        // The same reserve: one kind.
        let n = node(&[1000, 1000]);
        let state = FragState::new(&n, &mix, &cfg, FragUnit::Gpus);
        assert_eq!(state.kind_of(0), state.kind_of(1));
    }

    #[test]
    fn cpu_that_runs_out_makes_everything_fragment() {
        let cfg = FitConfig::simulation();
        let mut class = share(500, 1);
        class.cpu_milli = 4000;
        let mix = ShapeMix::new([(class, 1.0)]);
        let n = node(&[1000, 300]).with_cpu_milli(6000);
        let state = FragState::new(&n, &mix, &cfg, FragUnit::Gpus);
        assert!((state.value() - 0.3).abs() < 1e-9);
        // Taking 3 cores leaves 3: the half-GPU shape no longer fits anywhere on the node.
        assert!((state.value_after(&[], 3000) - 1.3).abs() < 1e-9);
    }

    #[test]
    fn incremental_changes_match_a_rescan() {
        let cfg = FitConfig::simulation();
        let mix = ShapeMix::new([
            (share(250, 1), 1.0),
            (share(700, 1), 2.0),
            (share(1000, 2), 1.0),
        ]);
        let mut n = node(&[1000, 1000, 800, 100]);
        let state = FragState::new(&n, &mix, &cfg, FragUnit::Gpus);
        let changes = [
            GpuChange {
                gpu: 0,
                free_before: 1000,
                free_after: 300,
            },
            GpuChange {
                gpu: 3,
                free_before: 100,
                free_after: 0,
            },
        ];
        let after = state.value_after(&changes, 0);
        n.reserve("new", &[0, 3], &[700, 100]);
        let rescan = node_fragmentation(&n, &mix, &cfg, FragUnit::Gpus);
        assert!((after - rescan).abs() < 1e-9, "{after} vs {rescan}");
    }

    #[test]
    fn typical_shapes_cover_the_requested_share() {
        let pods = std::iter::repeat_n(share(500, 1), 60)
            .chain(std::iter::repeat_n(share(1000, 1), 35))
            .chain(std::iter::repeat_n(share(100, 1), 5));
        let mix = ShapeMix::typical(pods, 0.95);
        assert_eq!(mix.shapes().len(), 2);
        assert!((mix.shapes()[0].1 - 60.0 / 95.0).abs() < 1e-12);
    }

    #[test]
    fn a_steady_workload_keeps_its_mix() {
        let mut stats = ShapeStats::new(ShapeStatsConfig {
            refresh_every: 4,
            ..Default::default()
        });
        for _ in 0..100 {
            stats.observe(&share(500, 1));
            stats.observe(&share(1000, 1));
        }
        let settled = stats.mix();
        for _ in 0..100 {
            stats.observe(&share(500, 1));
            stats.observe(&share(1000, 1));
        }
        assert_eq!(stats.mix().generation(), settled.generation());
        // A new shape is a new mix once it is common enough to be covered.
        for _ in 0..40 {
            stats.observe(&share(250, 2));
        }
        assert_ne!(stats.mix().generation(), settled.generation());
        assert_eq!(stats.mix().shapes().len(), 3);
        // So is a share that drifts beyond the tolerance.
        let three = stats.mix();
        for _ in 0..400 {
            stats.observe(&share(1000, 1));
        }
        assert_ne!(stats.mix().generation(), three.generation());
    }

    /// An extender that has just started (a fresh cluster, a restart) knows its mix from the
    /// few pods it has seen; the first pod's class alone must not stand for the workload until
    /// `refresh_every` pods have passed.
    #[test]
    fn the_first_pods_rebuild_the_mix_as_the_evidence_doubles() {
        let mut stats = ShapeStats::default();
        stats.observe(&share(1000, 1));
        assert_eq!(stats.mix().shapes().len(), 1);
        for _ in 0..3 {
            stats.observe(&share(250, 1));
        }
        // 4 pods seen: rebuilt, with the second class at three quarters.
        let mix = stats.mix();
        let quarter = mix.shapes().iter().find(|s| s.0 == share(250, 1));
        assert!(
            quarter.is_some_and(|s| (s.1 - 0.75).abs() < 1e-3),
            "mix after 4 pods: {:?}",
            mix.shapes()
        );
        // Between doublings nothing is rebuilt (5, 6, 7 pods), at 8 it is again.
        let at_four = mix.generation();
        for _ in 0..3 {
            stats.observe(&share(500, 1));
        }
        assert_eq!(stats.mix().generation(), at_four);
        stats.observe(&share(500, 1));
        assert_ne!(stats.mix().generation(), at_four);
        assert_eq!(stats.mix().shapes().len(), 3);
    }

    /// A workload of 40 equally common classes whose first 64 pods show only 32 of them: no
    /// class's share ever moves by much (1/32 to 1/40, 0 to 1/40), yet the 8 missing classes are
    /// a fifth of the workload and must enter the mix.
    #[test]
    fn classes_missing_from_the_first_pods_enter_the_mix() {
        let class = |k: u32| share(100 + 20 * k, 1);
        let mut stats = ShapeStats::default();
        for i in 0..64u32 {
            stats.observe(&class(i % 32));
        }
        for i in 0..2_000u32 {
            stats.observe(&class(i % 40));
        }
        let mix = stats.mix();
        let missing: Vec<u32> = (32..40)
            .filter(|&k| !mix.shapes().iter().any(|s| s.0 == class(k)))
            .collect();
        assert!(
            missing.len() <= 2,
            "classes {missing:?} are still outside the mix ({} classes)",
            mix.shapes().len()
        );
    }

    #[test]
    fn stats_forget_old_shapes() {
        let mut stats = ShapeStats::new(ShapeStatsConfig {
            half_life_pods: 100.0,
            refresh_every: 1,
            ..Default::default()
        });
        for _ in 0..1000 {
            stats.observe(&share(500, 1));
        }
        assert_eq!(stats.mix().shapes().len(), 1);
        for _ in 0..1000 {
            stats.observe(&share(1000, 1));
        }
        // 1000 observations = 10 half-lives: the old shape weighs ~1/1000 and falls out.
        let mix = stats.mix();
        assert_eq!(mix.shapes().len(), 1);
        assert_eq!(mix.shapes()[0].0, share(1000, 1));
    }

    #[test]
    fn a_pod_filtered_again_counts_once() {
        let mut stats = ShapeStats::default();
        for _ in 0..50 {
            stats.observe_pod("uid-a", &share(500, 1));
        }
        assert!(stats.observe_pod("uid-b", &share(1000, 1)));
        assert!(!stats.observe_pod("uid-b", &share(1000, 1)));
        stats.refresh();
        let shares: Vec<f64> = stats.mix().shapes().iter().map(|s| s.1).collect();
        assert_eq!(shares.len(), 2);
        assert!(shares.iter().all(|p| (p - 0.5).abs() < 1e-3), "{shares:?}");
    }

    /// How fast the default mix follows a workload that changes all at once: after a long run
    /// of one class, count the pods of a new class until the published mix gives it the
    /// larger share, and until the old class leaves the mix (below the 5 % coverage edge).
    /// With a half-life of 2,000 pods: about 2,000 and about 8,600 (2,000 × log2(20)).
    #[test]
    fn the_default_mix_follows_a_changed_workload_within_a_half_life() {
        let mut stats = ShapeStats::default();
        for i in 0..20_000 {
            stats.observe_pod(&format!("old-{i}"), &share(500, 1));
        }
        let (mut majority, mut gone) = (None, None);
        for n in 1..=20_000u32 {
            stats.observe_pod(&format!("new-{n}"), &share(250, 1));
            let mix = stats.mix();
            let share_of =
                |c: &PodClass| mix.shapes().iter().find(|s| &s.0 == c).map_or(0.0, |s| s.1);
            if majority.is_none() && share_of(&share(250, 1)) > 0.5 {
                majority = Some(n);
            }
            if gone.is_none() && share_of(&share(500, 1)) == 0.0 {
                gone = Some(n);
                break;
            }
        }
        let (majority, gone) = (majority.unwrap(), gone.unwrap());
        assert!(
            (1_900..=2_400).contains(&majority),
            "majority after {majority} pods"
        );
        assert!(
            (8_000..=9_200).contains(&gone),
            "old class gone after {gone} pods"
        );
    }

    /// A staged mix waits for `promote`; a newer one replaces it while it waits; one nobody
    /// promotes takes over after `MAX_STAGED_OBSERVATIONS`. The first mix is never staged.
    #[test]
    fn staged_mixes_wait_for_promotion() {
        let mut stats = ShapeStats::default();
        stats.stage_new_mixes();
        stats.observe_pod("first", &share(500, 1));
        let first = stats.mix();
        assert!(!first.is_empty() && stats.staged().is_none());
        // A workload that moves on every refresh: a class of its own per 64 pods.
        let mut n = 0u32;
        let mut next = |stats: &mut ShapeStats| {
            n += 1;
            stats.observe_pod(&format!("pod-{n}"), &share(100 + n / 64, 1));
            n
        };
        while stats.staged().is_none() {
            next(&mut stats);
        }
        assert!(
            Arc::ptr_eq(&stats.mix(), &first),
            "scoring keeps the old mix"
        );
        let staged = stats.staged().unwrap();
        // A newer mix replaces the staged one; promoting the one that was warmed then does
        // nothing.
        while stats.staged().is_some_and(|s| Arc::ptr_eq(&s, &staged)) {
            next(&mut stats);
        }
        assert!(!stats.promote(&staged));
        assert!(Arc::ptr_eq(&stats.mix(), &first));
        let newer = stats.staged().expect("replaced, not promoted");
        assert!(stats.promote(&newer));
        assert!(Arc::ptr_eq(&stats.mix(), &newer) && stats.staged().is_none());
        // Nobody promotes: a staged mix takes over on its own, however often it is replaced.
        while stats.staged().is_none() {
            next(&mut stats);
        }
        let (current, from) = (stats.mix(), next(&mut stats));
        let mut to = from;
        while Arc::ptr_eq(&stats.mix(), &current) {
            to = next(&mut stats);
        }
        assert!(
            to - from <= MAX_STAGED_OBSERVATIONS,
            "{} observations",
            to - from
        );
    }

    /// Pods sized in bytes count the share of the node's GPUs they take; fractions count as
    /// given, whatever the GPU size (the openb replay's ratio is unchanged).
    #[test]
    fn cpu_per_gpu_counts_byte_sized_pods_on_the_gpus_at_hand() {
        let with_cpu = |mut c: PodClass, cpu: u64| {
            c.cpu_milli = cpu;
            c
        };
        let bytes = |b: u64, gpus: u32| {
            PodClass::from(PodShape {
                gpus,
                demand: Demand::fixed(b),
            })
        };
        let mix = ShapeMix::new([
            (with_cpu(bytes(20, 1), 8_000), 1.0),
            (with_cpu(bytes(80, 2), 32_000), 1.0),
        ]);
        assert_eq!(mix.cpu_per_gpu(), None, "no size, no GPUs");
        // On 80-byte GPUs: 0.25 + 2 GPUs for 40 cores, 16 cores per GPU.
        assert_eq!(mix.cpu_per_gpu_on(80), Some(40_000.0 / 2.25));
        // On 40-byte GPUs the 80-byte pod takes whole GPUs (at most one each).
        assert_eq!(mix.cpu_per_gpu_on(40), Some(40_000.0 / 2.5));
        let fractions = ShapeMix::new([(with_cpu(share(300, 1), 3_000), 1.0)]);
        let exact = fractions.cpu_per_gpu().unwrap();
        for size in [0, 1000, 81_559 << 20] {
            assert_eq!(
                fractions.cpu_per_gpu_on(size).unwrap().to_bits(),
                exact.to_bits()
            );
        }
    }

    #[test]
    fn capacity_gives_the_learned_mix_model_pressure() {
        let mut stats = ShapeStats::default();
        let mut t4_only = share(500, 1);
        t4_only.gpu_models = vec!["T4".into()];
        stats.observe_pod("a", &t4_only);
        stats.observe_pod("b", &share(500, 1));
        assert_eq!(stats.mix().model_pressure("T4"), 0.0);
        stats.sync_capacity(1, || [("T4".to_owned(), 10.0), ("V100".to_owned(), 90.0)]);
        assert!(stats.mix().model_pressure("T4") > 1.0);
        // The same counter again: nothing fetched.
        stats.sync_capacity(1, || -> Vec<(String, f64)> { unreachable!() });
    }
}
