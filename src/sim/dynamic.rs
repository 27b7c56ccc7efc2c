//! Memory that changes over time: pods arrive and leave, and each pod's real GPU memory use
//! follows a profile. The same arrivals are replayed under four accountings of what is free:
//!
//! - `declared`: the sum of declared requests (how HAMi, gpushare and KAI decide);
//! - `live-free`: the memory NVML shows free right now (a naive NVML scheduler);
//! - `peakfit`: the extender's ledger, each pod at max(predicted peak, observed use);
//! - `learned`: the same ledger, each new pod sized by `learn::size_pod` from what the earlier
//!   pods of its workload (`DynPod::kind`) were seen to use in this run, as the agent sees them:
//!   each run's peak so far and its time so far.
//!
//! All four place with the extender's own `placement::place` (peakfit scoring over the shapes
//! seen so far, fed to `ShapeStats` as the extender does) on a `NodeLedger`; only what the
//! ledger holds, and the demand it is asked for, differ. A GPU whose pods' real use exceeds its
//! memory at a sample is an OOM event: the youngest pod on it is killed and queued again. A pod
//! whose allocator frees its cache (`Demand::cache_floor`) alone on its GPU is the exception: it
//! runs in the whole GPU, and only its floor can exceed it. A pod
//! started on a GPU too small to hold it at all (`Demand::runs_on` false: a fraction-budget
//! engine whose share of that GPU cannot hold its weights) fails at once and is queued again;
//! only accountings that do not ask the model can put it there.
//!
//! Under the peakfit and learned accountings a pod that has waited `Reserve::after_min` and fits nowhere gets
//! a hold (`placement::hold`): the node and GPUs it will get keep its memory, other pods bind
//! there only beside it, and it starts there once the holders have left, or anywhere sooner.
//! Without it the ledger starves the pods that need whole GPUs (issue 22).
//!
//! "Placed" counts a pod once it has started, however its runs end: declared-only and live-free
//! start pods that are then OOM-killed and started again, so the counters also say how many
//! pods were never killed and how many ran to completion without a kill.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::nearest_rank;
use super::profiles::Profile;
use crate::learn::{self, LearnPolicy, PodObservation, WorkloadHistory};
use crate::placement::{
    self, Demand, FitConfig, GpuLedger, HoldConfig, Holds, NodeLedger, PodClass, PodShape,
    ScoringPolicy, ShapeStats,
};

/// Holds for starving pods under the peakfit accounting (`--reserve-*`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reserve {
    /// Minutes a pod waits, fitting nowhere, before it gets a hold.
    pub after_min: u64,
    /// Minutes a hold lasts before it is dropped (and may be made again).
    pub deadline_min: u64,
    /// Holds at once, as a fraction of the nodes (rounded up, at least one).
    pub per_node: f64,
}

impl Reserve {
    /// The core's settings for a cluster of `nodes` nodes.
    pub fn config(&self, nodes: usize) -> HoldConfig {
        HoldConfig {
            after_secs: min_to_secs(self.after_min),
            deadline_secs: min_to_secs(self.deadline_min),
            max_holds: crate::convert::f64_to_usize((self.per_node * nodes as f64).ceil()).max(1),
        }
    }
}

/// The simulator's minutes as the core's seconds (its holds keep Unix seconds, as the extender
/// will).
fn min_to_secs(min: u64) -> i64 {
    crate::convert::u64_to_i64(min.saturating_mul(60))
}

/// How the scheduler counts memory as taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Accounting {
    Declared,
    LiveFree,
    Peakfit,
    Learned,
}

impl Accounting {
    pub const ALL: [Accounting; 4] = [
        Accounting::Declared,
        Accounting::LiveFree,
        Accounting::Peakfit,
        Accounting::Learned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Accounting::Declared => "declared",
            Accounting::LiveFree => "live-free",
            Accounting::Peakfit => "peakfit",
            Accounting::Learned => "learned",
        }
    }

    /// The extender's ledger (with holds), whether or not it learns.
    pub fn is_ledger(self) -> bool {
        matches!(self, Accounting::Peakfit | Accounting::Learned)
    }
}

/// A node of the dynamic cluster: its GPUs' memory.
#[derive(Clone, Debug)]
pub struct DynNode {
    pub name: String,
    pub gpu_bytes: Vec<u64>,
}

/// One pod of the dynamic workload.
#[derive(Clone, Debug)]
pub struct DynPod {
    /// Its workload (a Deployment, a Job): the pods the learned accounting learns from.
    pub kind: String,
    pub arrival_min: u64,
    pub duration_min: u64,
    pub gpus: u32,
    /// The peak-memory model's demand (what peakfit reserves).
    pub predicted: Demand,
    /// What the user declared per GPU (what declared-only and live-free schedulers are told).
    pub declared_bytes: u64,
    /// The pod's real peak as a fraction of the predicted bytes on the GPU it lands on.
    pub true_peak_fraction: f64,
    pub profile: Profile,
    /// Its demand is its own `peakfit.io/vram`, not the model's (learned only under
    /// `--learn all`).
    pub explicit: bool,
}

/// A workload's second pod to run: what it was sized at and what it really peaked at, per GPU.
/// The first pod of a workload has only the model; the second is the first that can learn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondPod {
    pub kind: String,
    /// What the accounting reserved for it per GPU (declared: its request; live-free: nothing).
    pub sized_bytes: u64,
    /// The highest per-GPU use it reaches over its whole run (profile and duration).
    pub real_peak_bytes: u64,
}

impl SecondPod {
    /// |sized − real peak| / real peak.
    pub fn error(&self) -> f64 {
        (self.sized_bytes as f64 - self.real_peak_bytes as f64).abs()
            / (self.real_peak_bytes.max(1)) as f64
    }
}

/// One start of a pod: when, and the per-GPU bytes the accounting reserved for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Start {
    pub pod: usize,
    pub minute: u64,
    pub sized_bytes: u64,
}

/// What one accounting did with the arrivals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DynamicResult {
    pub accounting: String,
    pub pods: usize,
    /// Pods that started at least once, including pods later OOM-killed or failed at start.
    pub pods_placed: usize,
    /// Pods that started and were never OOM-killed and never failed at start.
    #[serde(default)]
    pub pods_placed_never_killed: usize,
    /// Pods that ran to their end (on their last start; earlier starts may have been killed).
    pub pods_completed: usize,
    /// Pods that ran to their end and were never OOM-killed or failed at start on the way.
    #[serde(default)]
    pub pods_completed_without_kill: usize,
    pub oom_events: usize,
    pub pods_oom_killed: usize,
    /// Starts on a GPU too small for the pod to run at all (it fails at once and is queued
    /// again).
    #[serde(default)]
    pub start_failures: usize,
    /// Pods that failed at start at least once.
    #[serde(default)]
    pub pods_failed_at_start: usize,
    /// GPU-hours of runs that ended in an OOM kill: work lost and redone.
    #[serde(default)]
    pub gpu_hours_lost: f64,
    /// Pods still waiting when the simulation ended.
    pub pods_pending_at_end: usize,
    /// Mean minutes from arrival to (last) start, over pods that started.
    pub mean_pending_min: f64,
    /// Mean over samples of the cluster's real GPU memory use, % of capacity.
    pub mean_memory_used_pct: f64,
    /// Mean over samples of memory the scheduler counts as taken, % of capacity.
    pub mean_memory_committed_pct: f64,
    /// 95th percentile (nearest rank) of the same waits as `mean_pending_min`.
    #[serde(default)]
    pub p95_pending_min: f64,
    /// Mean minutes waited over every start *and* every pod still queued at the end, the
    /// queued ones counted at their wait so far. The per-start figures leave out exactly the
    /// pods that waited longest (they have no start yet), so an accounting that never starts
    /// its hardest pods looks better there than one that starts them late; this one cannot be
    /// flattered that way. A lower bound: a queued pod waits at least this long.
    #[serde(default)]
    pub mean_wait_incl_queued_min: f64,
    /// 95th percentile (nearest rank) of the same waits as `mean_wait_incl_queued_min`.
    #[serde(default)]
    pub p95_wait_incl_queued_min: f64,
    /// Who waits: the same figures per pod kind, in the order the kinds first arrive.
    #[serde(default)]
    pub by_kind: Vec<KindWaits>,
    /// Holds made for starving pods (peakfit with `Reserve` only), re-made ones included.
    #[serde(default)]
    pub holds_made: usize,
    /// Holds dropped at their deadline before their pod started.
    #[serde(default)]
    pub holds_expired: usize,
    /// Each workload's second pod to run, in the order they ran.
    #[serde(default)]
    pub second_pods: Vec<SecondPod>,
    /// Every run's start and size, in order (for tests; not in the report).
    #[serde(skip)]
    pub starts: Vec<Start>,
}

/// The waits of one pod kind: each start's minutes from arrival (or from the kill that queued
/// it again) to the start, and the pods of the kind still queued when the run ends, which have
/// no start to count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KindWaits {
    pub kind: String,
    pub starts: usize,
    pub mean_pending_min: f64,
    pub p95_pending_min: f64,
    pub waiting_at_end: usize,
    /// p95 over the kind's starts and its pods still queued at their wait so far (see
    /// `DynamicResult::mean_wait_incl_queued_min`).
    #[serde(default)]
    pub p95_incl_queued_min: f64,
    /// Mean over the same waits.
    #[serde(default)]
    pub mean_incl_queued_min: f64,
}

/// The mean of some minutes, 0 for none (a kind or a run with nothing to wait for).
fn mean_of(minutes: &[u64]) -> f64 {
    if minutes.is_empty() {
        0.0
    } else {
        minutes.iter().sum::<u64>() as f64 / minutes.len() as f64
    }
}

/// Per kind (in first-arrival order), the waits of its starts and its pods still queued;
/// `queued` holds each queued pod with its wait so far.
fn waits_by_kind(
    pods: &[DynPod],
    order: &[usize],
    waits: &[(usize, u64)],
    queued: &[(usize, u64)],
) -> Vec<KindWaits> {
    let mut kinds: Vec<&str> = Vec::new();
    for &p in order {
        if !kinds.contains(&pods[p].kind.as_str()) {
            kinds.push(&pods[p].kind);
        }
    }
    kinds
        .into_iter()
        .map(|kind| {
            let mut w: Vec<u64> = waits
                .iter()
                .filter(|(p, _)| pods[*p].kind == kind)
                .map(|w| w.1)
                .collect();
            let mean = if w.is_empty() {
                0.0
            } else {
                w.iter().sum::<u64>() as f64 / w.len() as f64
            };
            let p95 = nearest_rank(&mut w, 0.95);
            let queued_waits: Vec<u64> = queued
                .iter()
                .filter(|(p, _)| pods[*p].kind == kind)
                .map(|q| q.1)
                .collect();
            let waiting_at_end = queued_waits.len();
            w.extend(queued_waits);
            KindWaits {
                kind: kind.to_owned(),
                starts: w.len() - waiting_at_end,
                mean_pending_min: mean,
                p95_pending_min: p95,
                waiting_at_end,
                mean_incl_queued_min: mean_of(&w),
                p95_incl_queued_min: nearest_rank(&mut w, 0.95),
            }
        })
        .collect()
}

#[derive(Clone, Debug)]
struct Running {
    pod: usize,
    node: usize,
    gpus: Vec<usize>,
    start_min: u64,
    /// Real peak bytes per GPU on the GPUs it runs on.
    peak_bytes: u64,
    /// For a pod whose allocator frees its cache and retries a failed `cudaMalloc`
    /// (`Demand::cache_floor`): the real memory per GPU it cannot do without, its predicted
    /// floor off by the same `true_peak_fraction` as its peak.
    floor_bytes: Option<u64>,
    key: String,
    /// Its entry in what the agent has seen of each run.
    seen: usize,
}

/// What the agent has seen of one run of a pod: the learned accounting's evidence.
#[derive(Clone, Copy, Debug)]
struct SeenRun {
    kind: usize,
    start_min: u64,
    end_min: Option<u64>,
    peak_bytes: u64,
    samples: u32,
}

/// The history of workload `kind` at `minute`: every run of it sampled at least once, with its
/// peak so far and its time so far (to its end, for runs that ended).
fn history_of(seen: &[SeenRun], kind: usize, minute: u64, policy: &LearnPolicy) -> WorkloadHistory {
    WorkloadHistory::from_pods(
        seen.iter()
            .filter(|r| r.kind == kind && r.samples > 0)
            .map(|r| PodObservation {
                peak_bytes: r.peak_bytes,
                runtime_secs: r.end_min.unwrap_or(minute).saturating_sub(r.start_min) * 60,
            }),
        policy.min_runtime_secs,
    )
}

/// The learned accounting's demand for `pod`. An engine that takes a fraction of the GPU uses
/// that fraction whatever was seen (the model predicts exactly its budget), so it keeps its
/// prediction; a fixed-size pod is sized by the core's rule.
fn learned_demand(pod: &DynPod, history: &WorkloadHistory, policy: &LearnPolicy) -> Demand {
    if pod.predicted.gpu_fraction > 0.0 {
        return pod.predicted;
    }
    let sized = learn::size_pod(
        pod.predicted.fixed_bytes,
        pod.explicit,
        Some(history),
        policy,
    );
    learn::resized(pod.predicted, sized.bytes)
}

/// Replays `pods` on `nodes` for `horizon_min` minutes under one accounting; `reserve` gives
/// the ledger accountings holds for starving pods (the others ignore it), `learn` how the
/// learned accounting sizes pods from their workload's earlier ones.
pub fn simulate(
    nodes: &[DynNode],
    pods: &[DynPod],
    accounting: Accounting,
    horizon_min: u64,
    seed: u64,
    reserve: Option<&Reserve>,
    learn: &LearnPolicy,
) -> DynamicResult {
    let hold_cfg = reserve
        .filter(|_| accounting.is_ledger())
        .map(|r| r.config(nodes.len()));
    let mut holds = Holds::default();
    let cfg = FitConfig {
        safety_margin_bytes: FitConfig::default().safety_margin_bytes,
        max_report_age_secs: None,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut stats = ShapeStats::default();
    let mut ledgers: Vec<NodeLedger> = nodes
        .iter()
        .map(|n| {
            NodeLedger::with_gpus(
                n.name.clone(),
                n.gpu_bytes
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| GpuLedger::new(format!("{}-gpu{i}", n.name), b))
                    .collect(),
            )
        })
        .collect();
    let capacity: u64 = nodes.iter().flat_map(|n| n.gpu_bytes.iter()).sum();
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by_key(|&i| (pods[i].arrival_min, i));
    let mut next_arrival = 0;
    let mut pending: VecDeque<(usize, u64)> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut started = vec![false; pods.len()];
    let mut killed = vec![false; pods.len()];
    let mut failed_at_start = vec![false; pods.len()];
    let mut gpu_minutes_lost = 0u64;
    let mut out = DynamicResult {
        accounting: accounting.name().to_owned(),
        pods: pods.len(),
        ..Default::default()
    };
    let mut waits: Vec<(usize, u64)> = Vec::new();
    // Classes refused since every GPU last had the free memory recorded beside them.
    let mut refused: (Vec<PodClass>, Vec<u64>) = (Vec::new(), Vec::new());
    let pods_keys: Vec<String> = (0..pods.len()).map(|p| format!("pod-{p}")).collect();
    let mut used_sum = 0.0;
    let mut committed_sum = 0.0;
    let mut starts = 0u64;
    let mut kinds: Vec<&str> = Vec::new();
    let kind_of: Vec<usize> = pods
        .iter()
        .map(|p| {
            kinds.iter().position(|k| *k == p.kind).unwrap_or_else(|| {
                kinds.push(&p.kind);
                kinds.len() - 1
            })
        })
        .collect();
    let mut seen: Vec<SeenRun> = Vec::new();
    // Each workload's history, built at most once a minute: within the scheduling pass nothing
    // the agent sees changes (runs started in it have no sample yet).
    let mut histories: Vec<Option<WorkloadHistory>> = vec![None; kinds.len()];
    let mut ran = vec![false; pods.len()];
    let mut pods_run_per_kind = vec![0u32; kinds.len()];
    for minute in 0..horizon_min {
        let now = min_to_secs(minute);
        out.holds_expired += holds.expire(&mut ledgers, now).len();
        histories.fill(None);
        // Departures.
        running.retain(|r| {
            let done = minute >= r.start_min + pods[r.pod].duration_min;
            if done {
                seen[r.seen].end_min = Some(minute);
                ledgers[r.node].release(&r.key);
                out.pods_completed += 1;
                if !killed[r.pod] && !failed_at_start[r.pod] {
                    out.pods_completed_without_kill += 1;
                }
            }
            !done
        });
        // Arrivals.
        while next_arrival < order.len() && pods[order[next_arrival]].arrival_min <= minute {
            let p = order[next_arrival];
            pending.push_back((p, pods[p].arrival_min));
            next_arrival += 1;
        }
        // Scheduling, in arrival order; a pod that fits nowhere does not block the others.
        // The mix counts each pod once, however often it is tried, as the extender does. A
        // class that fitted nowhere fits nowhere while every GPU's free memory stays as it was
        // (the fit reads nothing else here, and a refusal draws nothing from the RNG), so it is
        // not tried again until then: most minutes change nothing for the queue.
        if refused.1 != free_now(&ledgers) {
            refused.0.clear();
        }
        let mut still = VecDeque::with_capacity(pending.len());
        while let Some((p, arrived)) = pending.pop_front() {
            let demand = match accounting {
                Accounting::Peakfit => pods[p].predicted,
                Accounting::Declared | Accounting::LiveFree => {
                    Demand::fixed(pods[p].declared_bytes)
                }
                Accounting::Learned => {
                    let k = kind_of[p];
                    let h =
                        *histories[k].get_or_insert_with(|| history_of(&seen, k, minute, learn));
                    learned_demand(&pods[p], &h, learn)
                }
            };
            let class = PodClass::from(PodShape {
                gpus: pods[p].gpus,
                demand,
            });
            stats.observe_pod(&pods_keys[p], &class);
            // A pod with a hold sees more memory than the others (its own hold is free to it),
            // so another pod's refusal says nothing about it.
            let holder = holds
                .get(&pods_keys[p])
                .is_some()
                .then_some(pods_keys[p].as_str());
            let placed = if holder.is_none() && refused.0.contains(&class) {
                None
            } else {
                place(&ledgers, &class, holder, &stats, &cfg, &mut rng)
            };
            match placed {
                Some((n, placement)) => {
                    if holder.is_some() {
                        holds.end(&pods_keys[p], &mut ledgers);
                    }
                    let pod = &pods[p];
                    let key = format!("pod-{p}-{starts}");
                    starts += 1;
                    let gpu_total = ledgers[n].gpus[placement.gpu_indices[0]].total_bytes;
                    if !started[p] {
                        started[p] = true;
                        out.pods_placed += 1;
                    }
                    if !pod.predicted.runs_on(gpu_total) {
                        // It cannot run here at all: it fails at once and is queued again.
                        out.start_failures += 1;
                        if !failed_at_start[p] {
                            failed_at_start[p] = true;
                            out.pods_failed_at_start += 1;
                        }
                        still.push_back((p, arrived));
                        continue;
                    }
                    let predicted = pod.predicted.bytes_on(gpu_total);
                    // The ledgers reserve what placement chose (`fit::need_on`: all of a GPU's
                    // usable memory for a pod that takes it whole), as bind does.
                    let per_gpu = match accounting {
                        Accounting::Declared => {
                            vec![pod.declared_bytes; placement.gpu_indices.len()]
                        }
                        Accounting::LiveFree => vec![0; placement.gpu_indices.len()],
                        Accounting::Peakfit | Accounting::Learned => {
                            placement.per_gpu_bytes.clone()
                        }
                    };
                    let reserve_bytes = per_gpu.iter().copied().max().unwrap_or(0);
                    ledgers[n].reserve(&key, &placement.gpu_indices, &per_gpu);
                    let truly = |bytes: u64| {
                        crate::convert::f64_to_u64(bytes as f64 * pod.true_peak_fraction)
                    };
                    let peak_bytes = truly(predicted);
                    out.starts.push(Start {
                        pod: p,
                        minute,
                        sized_bytes: reserve_bytes,
                    });
                    if !ran[p] {
                        ran[p] = true;
                        pods_run_per_kind[kind_of[p]] += 1;
                        if pods_run_per_kind[kind_of[p]] == 2 {
                            let whole_run = pod
                                .profile
                                .peak_within(crate::convert::u64_to_usize(pod.duration_min));
                            out.second_pods.push(SecondPod {
                                kind: pod.kind.clone(),
                                sized_bytes: reserve_bytes,
                                real_peak_bytes: crate::convert::f64_to_u64(
                                    peak_bytes as f64 * whole_run,
                                ),
                            });
                        }
                    }
                    seen.push(SeenRun {
                        kind: kind_of[p],
                        start_min: minute,
                        end_min: None,
                        peak_bytes: 0,
                        samples: 0,
                    });
                    running.push(Running {
                        pod: p,
                        node: n,
                        gpus: placement.gpu_indices,
                        start_min: minute,
                        peak_bytes,
                        floor_bytes: pod.predicted.cache_floor().map(truly),
                        key,
                        seen: seen.len() - 1,
                    });
                    waits.push((p, minute - arrived));
                    refused.0.clear();
                }
                None => {
                    if holder.is_none() {
                        if refused.0.is_empty() {
                            refused.1 = free_now(&ledgers);
                        }
                        if !refused.0.contains(&class) {
                            refused.0.push(class.clone());
                        }
                    }
                    if let Some(hc) = &hold_cfg
                        && holds.due(&pods_keys[p], min_to_secs(minute - arrived), hc)
                    {
                        // The holders' start times, as the extender sees pods' start times;
                        // never how long they will run.
                        let started_at: HashMap<&str, i64> = running
                            .iter()
                            .map(|r| (r.key.as_str(), min_to_secs(r.start_min)))
                            .collect();
                        let made = holds.make(
                            &pods_keys[p],
                            &class,
                            &mut ledgers,
                            &cfg,
                            hc,
                            |k| started_at.get(k).copied(),
                            now,
                        );
                        out.holds_made += usize::from(made.is_some());
                    }
                    still.push_back((p, arrived));
                }
            }
        }
        pending = still;
        // Real use; the agent reports it, and ledgers that look at it record it.
        let mut use_per_gpu: Vec<Vec<Vec<(&str, u64)>>> = nodes
            .iter()
            .map(|n| vec![Vec::new(); n.gpu_bytes.len()])
            .collect();
        let profile_now = |r: &Running| {
            pods[r.pod]
                .profile
                .at(crate::convert::u64_to_usize(minute - r.start_min))
        };
        for r in &running {
            let now = crate::convert::f64_to_u64(r.peak_bytes as f64 * profile_now(r));
            for &g in &r.gpus {
                use_per_gpu[r.node][g].push((r.key.as_str(), now));
            }
        }
        // Alone on a GPU its cache outgrows, a pod whose allocator frees its cache runs in the
        // whole GPU: its failed `cudaMalloc` releases the cache and is retried, and only its
        // floor can run it out of memory. Beside other pods its cache still counts in full: a
        // neighbour's failed allocation does not make it release anything.
        for r in &running {
            let Some(floor) = r.floor_bytes else {
                continue;
            };
            let floor_now = crate::convert::f64_to_u64(floor as f64 * profile_now(r));
            for &g in &r.gpus {
                let size = nodes[r.node].gpu_bytes[g];
                if let [(_, used)] = use_per_gpu[r.node][g].as_mut_slice()
                    && *used > size
                    && floor_now <= size
                {
                    *used = size;
                }
            }
        }
        // What the agent sees of each run: its use as its GPUs hold it. A run that filled its
        // GPU is a bound the GPU set, not its size: learning takes it as no less than the
        // prediction, as the extender's `Index::observations` does, so a workload is never sized
        // down onto a share of a larger GPU its cache would then fill.
        for r in &running {
            let now = r
                .gpus
                .iter()
                .flat_map(|&g| &use_per_gpu[r.node][g])
                .filter(|(key, _)| *key == r.key)
                .map(|e| e.1)
                .max()
                .unwrap_or_else(|| {
                    crate::convert::f64_to_u64(r.peak_bytes as f64 * profile_now(r))
                });
            let filled = pods[r.pod].predicted.fills_gpu
                && r.gpus.iter().any(|&g| now >= nodes[r.node].gpu_bytes[g]);
            let now = if filled {
                now.max(pods[r.pod].predicted.fixed_bytes)
            } else {
                now
            };
            let s = &mut seen[r.seen];
            s.peak_bytes = s.peak_bytes.max(now);
            s.samples += 1;
        }
        if accounting != Accounting::Declared {
            for (n, gpus) in use_per_gpu.iter().enumerate() {
                for (g, seen) in gpus.iter().enumerate() {
                    let total = nodes[n].gpu_bytes[g];
                    ledgers[n].gpus[g].observe(total, 0, seen.iter().copied(), 0);
                }
            }
        }
        let use_per_gpu: Vec<Vec<u64>> = use_per_gpu
            .iter()
            .map(|gpus| gpus.iter().map(|s| s.iter().map(|x| x.1).sum()).collect())
            .collect();
        used_sum += use_per_gpu.iter().flatten().sum::<u64>() as f64 / capacity as f64;
        committed_sum += ledgers
            .iter()
            .flat_map(|l| l.gpus.iter().map(GpuLedger::committed_bytes))
            .sum::<u64>() as f64
            / capacity as f64;
        // OOM: a GPU whose pods use more than it has. The youngest pod on it dies and retries.
        for (n, gpus) in use_per_gpu.iter().enumerate() {
            for (g, &used) in gpus.iter().enumerate() {
                if used <= nodes[n].gpu_bytes[g] {
                    continue;
                }
                out.oom_events += 1;
                let victim = running
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.node == n && r.gpus.contains(&g))
                    .max_by_key(|(_, r)| r.start_min)
                    .map(|(i, _)| i);
                if let Some(i) = victim {
                    let r = running.swap_remove(i);
                    seen[r.seen].end_min = Some(minute);
                    ledgers[r.node].release(&r.key);
                    gpu_minutes_lost += (minute - r.start_min + 1) * r.gpus.len() as u64;
                    if !killed[r.pod] {
                        killed[r.pod] = true;
                        out.pods_oom_killed += 1;
                    }
                    pending.push_back((r.pod, minute));
                }
            }
        }
    }
    out.pods_pending_at_end = pending.len();
    out.pods_placed_never_killed = (0..pods.len())
        .filter(|&p| started[p] && !killed[p] && !failed_at_start[p])
        .count();
    out.gpu_hours_lost = gpu_minutes_lost as f64 / 60.0;
    out.mean_pending_min = if waits.is_empty() {
        0.0
    } else {
        waits.iter().map(|w| w.1).sum::<u64>() as f64 / waits.len() as f64
    };
    out.p95_pending_min = nearest_rank(&mut waits.iter().map(|w| w.1).collect::<Vec<_>>(), 0.95);
    // A pod still queued has waited from its arrival (or kill) to the end of the run so far.
    let queued: Vec<(usize, u64)> = pending
        .iter()
        .map(|&(p, since)| (p, horizon_min.saturating_sub(since)))
        .collect();
    let mut all_waits: Vec<u64> = waits.iter().chain(&queued).map(|w| w.1).collect();
    out.mean_wait_incl_queued_min = mean_of(&all_waits);
    out.p95_wait_incl_queued_min = nearest_rank(&mut all_waits, 0.95);
    out.by_kind = waits_by_kind(pods, &order, &waits, &queued);
    out.mean_memory_used_pct = 100.0 * used_sum / horizon_min.max(1) as f64;
    out.mean_memory_committed_pct = 100.0 * committed_sum / horizon_min.max(1) as f64;
    out
}

/// Every GPU's free memory as the fit sees it.
fn free_now(ledgers: &[NodeLedger]) -> Vec<u64> {
    ledgers
        .iter()
        .flat_map(|l| l.gpus.iter().map(GpuLedger::free_bytes))
        .collect()
}

/// The extender's filter and prioritize over every node; ties broken at random. `holder`: the
/// pod's key when it has a hold, which it sees as free (`NodeLedger::seen_by`).
fn place(
    ledgers: &[NodeLedger],
    class: &PodClass,
    holder: Option<&str>,
    stats: &ShapeStats,
    cfg: &FitConfig,
    rng: &mut ChaCha8Rng,
) -> Option<(usize, placement::Placement)> {
    let mix = stats.mix();
    let mut best: Option<(f64, usize, placement::Placement)> = None;
    let mut ties = 0u32;
    for (n, ledger) in ledgers.iter().enumerate() {
        let seen = match holder {
            Some(pod) => ledger.seen_by(pod),
            None => std::borrow::Cow::Borrowed(ledger),
        };
        let Ok(scored) = placement::place(&seen, class, ScoringPolicy::Peakfit, &mix, cfg, 0)
        else {
            continue;
        };
        let s = scored.score;
        match &best {
            Some((b, _, _)) if s < *b - 1e-12 => {}
            Some((b, _, _)) if s <= *b + 1e-12 => {
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = Some((s, n, scored.placement));
                }
            }
            _ => {
                ties = 1;
                best = Some((s, n, scored.placement));
            }
        }
    }
    best.map(|(_, n, p)| (n, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn growing_pod(arrival: u64) -> DynPod {
        // Starts at a third of its 30 GiB peak and reaches it after ten minutes.
        let minutes = (0..60).map(|m| if m < 10 { 0.34 } else { 1.0 }).collect();
        DynPod {
            kind: "serving".into(),
            arrival_min: arrival,
            duration_min: 60,
            gpus: 1,
            predicted: Demand::fixed(30 * GI),
            declared_bytes: 12 * GI,
            true_peak_fraction: 1.0,
            profile: Profile { minutes },
            explicit: false,
        }
    }

    #[test]
    fn only_the_ledger_keeps_growing_pods_apart() {
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![40 * GI],
        }];
        let pods: Vec<_> = (0..3).map(growing_pod).collect();
        let declared = simulate(
            &nodes,
            &pods,
            Accounting::Declared,
            120,
            1,
            None,
            &LearnPolicy::default(),
        );
        let live = simulate(
            &nodes,
            &pods,
            Accounting::LiveFree,
            120,
            1,
            None,
            &LearnPolicy::default(),
        );
        let peak = simulate(
            &nodes,
            &pods,
            Accounting::Peakfit,
            120,
            1,
            None,
            &LearnPolicy::default(),
        );
        assert!(declared.oom_events > 0, "{declared:?}");
        assert!(live.oom_events > 0, "{live:?}");
        assert_eq!(peak.oom_events, 0, "{peak:?}");
        // peakfit runs them one after another instead.
        assert_eq!(peak.pods_completed, 1);
        assert_eq!(peak.pods_placed, 2);
        assert!(peak.mean_pending_min > 0.0);
        // Every run the others start ends in a kill, and the counters say so.
        assert_eq!(declared.pods_placed, 3);
        assert!(declared.pods_placed_never_killed < 3, "{declared:?}");
        assert!(declared.gpu_hours_lost > 0.0, "{declared:?}");
        assert_eq!(peak.pods_placed_never_killed, peak.pods_placed);
        assert_eq!(peak.pods_completed_without_kill, peak.pods_completed);
        assert_eq!(peak.gpu_hours_lost, 0.0);
    }

    #[test]
    fn waits_per_kind_count_each_start_and_the_pods_left_queued() {
        // One 40 GiB GPU, 30 GiB pods of 10 minutes that never grow, all arriving at 0: they run
        // one after another in arrival order, so the waits are 0, 10, 20, ... minutes.
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![40 * GI],
        }];
        let pod = |kind: &str| DynPod {
            kind: kind.into(),
            duration_min: 10,
            profile: Profile {
                minutes: vec![1.0; 10],
            },
            ..growing_pod(0)
        };
        // a, a, b, a, b, then three more a that cannot start within 55 minutes.
        let kinds = ["a", "a", "b", "a", "b", "a", "a", "a"];
        let pods: Vec<DynPod> = kinds.iter().map(|k| pod(k)).collect();
        let r = simulate(
            &nodes,
            &pods,
            Accounting::Peakfit,
            55,
            1,
            None,
            &LearnPolicy::default(),
        );
        // Starts at 0, 10, 20, 30, 40, 50: a waits 0, 10, 30, 50; b waits 20, 40.
        assert_eq!(r.pods_placed, 6, "{r:?}");
        assert_eq!(r.mean_pending_min, 25.0);
        assert_eq!(r.p95_pending_min, 50.0);
        let a = &r.by_kind[0];
        let b = &r.by_kind[1];
        assert_eq!((a.kind.as_str(), b.kind.as_str()), ("a", "b"));
        assert_eq!(
            (a.starts, a.mean_pending_min, a.p95_pending_min),
            (4, 22.5, 50.0)
        );
        assert_eq!(
            (b.starts, b.mean_pending_min, b.p95_pending_min),
            (2, 30.0, 40.0)
        );
        assert_eq!((a.waiting_at_end, b.waiting_at_end), (2, 0));
        assert_eq!(r.pods_pending_at_end, 2);
        // The two a pods still queued at minute 55 have waited 55 minutes each: counted, they
        // raise a's figures (and the run's) above the per-start ones, which leave them out.
        assert_eq!(
            (a.mean_incl_queued_min, a.p95_incl_queued_min),
            ((0.0 + 10.0 + 30.0 + 50.0 + 55.0 + 55.0) / 6.0, 55.0)
        );
        assert_eq!(
            (b.mean_incl_queued_min, b.p95_incl_queued_min),
            (30.0, 40.0)
        );
        assert_eq!(
            (r.mean_wait_incl_queued_min, r.p95_wait_incl_queued_min),
            (260.0 / 8.0, 55.0)
        );
    }

    #[test]
    fn a_hold_lets_a_pod_needing_whole_gpus_start_through_a_stream_of_small_ones() {
        // Two 40 GiB GPUs; a 15 GiB pod arrives every 10 minutes and runs 30, so three are
        // always running and the two GPUs are never empty together. The 2 x 30 GiB pod that
        // arrives at minute 5 starves without a hold; with one (made after 30 minutes) the
        // small pods stop binding beside it and it starts once those running have left.
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![40 * GI, 40 * GI],
        }];
        let small = |arrival| DynPod {
            kind: "small".into(),
            duration_min: 30,
            predicted: Demand::fixed(15 * GI),
            profile: Profile {
                minutes: vec![1.0; 30],
            },
            ..growing_pod(arrival)
        };
        let mut pods: Vec<DynPod> = (0..40).map(|i| small(i * 10)).collect();
        pods.push(DynPod {
            kind: "big".into(),
            gpus: 2,
            duration_min: 20,
            profile: Profile {
                minutes: vec![1.0; 20],
            },
            ..growing_pod(5)
        });
        let reserve = Reserve {
            after_min: 30,
            deadline_min: 120,
            per_node: 1.0,
        };
        let big = |r: &DynamicResult| r.by_kind.iter().find(|k| k.kind == "big").cloned();
        let off = simulate(
            &nodes,
            &pods,
            Accounting::Peakfit,
            400,
            1,
            None,
            &LearnPolicy::default(),
        );
        assert_eq!(big(&off).unwrap().starts, 0, "{off:?}");
        let on = simulate(
            &nodes,
            &pods,
            Accounting::Peakfit,
            400,
            1,
            Some(&reserve),
            &LearnPolicy::default(),
        );
        let b = big(&on).unwrap();
        assert_eq!(b.starts, 1, "{on:?}");
        // Held at 35, started once the small pods running then have ended.
        assert!(
            b.mean_pending_min >= 30.0 && b.mean_pending_min <= 65.0,
            "{on:?}"
        );
        // The small pods queued behind the hold wait 30 minutes too and may get one after.
        assert!(on.holds_made >= 1, "{on:?}");
        assert_eq!((on.oom_events, on.holds_expired), (0, 0), "{on:?}");
        // Only the peakfit accounting holds.
        let declared = simulate(
            &nodes,
            &pods,
            Accounting::Declared,
            400,
            1,
            Some(&reserve),
            &LearnPolicy::default(),
        );
        assert_eq!(declared.holds_made, 0);
    }

    /// A 36 GiB GPU; pods the model sizes at 10 GiB really peak at 13 (30 % over), starting
    /// at 30 % of it and reaching it after 30 minutes. The first runs alone for an hour; three
    /// more arrive at 60-62.
    fn under_predicted() -> (Vec<DynNode>, Vec<DynPod>) {
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![36 * GI],
        }];
        let minutes: Vec<f64> = (0..600).map(|m| if m < 30 { 0.3 } else { 1.0 }).collect();
        let pod = |arrival| DynPod {
            kind: "chat".into(),
            arrival_min: arrival,
            duration_min: 600,
            predicted: Demand::fixed(10 * GI),
            true_peak_fraction: 1.3,
            profile: Profile {
                minutes: minutes.clone(),
            },
            ..growing_pod(arrival)
        };
        (nodes, vec![pod(0), pod(60), pod(61), pod(62)])
    }

    #[test]
    fn a_workload_under_predicted_by_30_percent_oom_kills_without_learning_only() {
        let (nodes, pods) = under_predicted();
        let learn = LearnPolicy::default();
        let run = |a, l: &LearnPolicy| simulate(&nodes, &pods, a, 700, 1, None, l);
        // The ledger sees the first pod at 13 GiB, but the next two look like 10 GiB each while
        // they ramp: three fit (13 + 10 + 10 + margin <= 36) and at their peak they need 39.
        let peak = run(Accounting::Peakfit, &learn);
        assert!(peak.oom_events > 0, "{peak:?}");
        assert!(peak.pods_oom_killed > 0, "{peak:?}");
        // Learning sizes every later pod at 13 × 1.05: two fit, the others wait their turn.
        let learned = run(Accounting::Learned, &learn);
        assert_eq!(learned.oom_events, 0, "{learned:?}");
        let real = crate::convert::f64_to_u64((10 * GI) as f64 * 1.3);
        let sized: Vec<u64> = learned.starts.iter().map(|s| s.sized_bytes).collect();
        assert_eq!(sized[0], 10 * GI);
        assert!(sized.len() >= 3, "{sized:?}");
        assert!(
            sized[1..].iter().all(|&b| b == learn.with_margin(real)),
            "{sized:?}"
        );
        assert_eq!(
            learned.second_pods,
            vec![SecondPod {
                kind: "chat".into(),
                sized_bytes: learn.with_margin(real),
                real_peak_bytes: real,
            }]
        );
        // `--learn off` is the peakfit column.
        let off = LearnPolicy {
            mode: crate::learn::LearnMode::Off,
            ..learn
        };
        let learned_off = run(Accounting::Learned, &off);
        assert_eq!(learned_off.oom_events, peak.oom_events);
        assert_eq!(learned_off.starts, peak.starts);
    }

    #[test]
    fn an_over_sized_workload_is_sized_down_only_after_two_pods_ran_the_minimum() {
        // 40 GiB predicted, 20 used from the first minute, one hour to trust. Pods start as
        // they arrive (the GPU holds all of them).
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![400 * GI],
        }];
        let pod = |arrival| DynPod {
            kind: "batch".into(),
            arrival_min: arrival,
            duration_min: 300,
            predicted: Demand::fixed(40 * GI),
            true_peak_fraction: 0.5,
            profile: Profile {
                minutes: vec![1.0; 300],
            },
            ..growing_pod(arrival)
        };
        let arrivals = [0, 10, 30, 65, 75];
        let pods: Vec<DynPod> = arrivals.iter().map(|&a| pod(a)).collect();
        let learn = LearnPolicy {
            min_runtime_secs: 3600,
            ..LearnPolicy::default()
        };
        let r = simulate(&nodes, &pods, Accounting::Learned, 200, 1, None, &learn);
        let sized: Vec<(u64, u64)> = r.starts.iter().map(|s| (s.minute, s.sized_bytes)).collect();
        // At 65 only the first has run an hour; at 75 the second has too.
        let down = learn.with_margin(20 * GI);
        assert_eq!(
            sized,
            vec![
                (0, 40 * GI),
                (10, 40 * GI),
                (30, 40 * GI),
                (65, 40 * GI),
                (75, down)
            ]
        );
        assert_eq!(r.oom_events, 0);
        // Sizing down never goes below what any pod was seen at: a fourth pod of the same
        // workload at 30 GiB, seen for a minute, lifts the floor at once.
        let mut pods = pods;
        pods.push(DynPod {
            true_peak_fraction: 0.75,
            ..pod(73)
        });
        let r = simulate(&nodes, &pods, Accounting::Learned, 200, 1, None, &learn);
        let last = r.starts.last().unwrap();
        assert_eq!(
            (last.minute, last.sized_bytes),
            (75, learn.with_margin(30 * GI))
        );
    }

    #[test]
    fn nearest_rank_takes_the_ceiling_rank() {
        let mut v: Vec<u64> = (1..=20).rev().collect();
        assert_eq!(super::nearest_rank(&mut v, 0.95), 19.0);
        assert_eq!(super::nearest_rank(&mut v, 1.0), 20.0);
        assert_eq!(super::nearest_rank(&mut [7], 0.95), 7.0);
        assert_eq!(super::nearest_rank(&mut [], 0.95), 0.0);
    }

    #[test]
    fn an_engine_on_a_gpu_too_small_for_it_fails_at_start() {
        // An engine told to take 45 % of any GPU needs a 38 GiB GPU for its weights; asked for
        // its declared 10 GiB, a declared-only scheduler puts it on the 24 GiB GPU, where it
        // cannot start. peakfit waits for the big GPU.
        let nodes = vec![
            DynNode {
                name: "small".into(),
                gpu_bytes: vec![24 * GI],
            },
            DynNode {
                name: "big".into(),
                gpu_bytes: vec![80 * GI],
            },
        ];
        let mut engine = growing_pod(0);
        engine.predicted = Demand {
            fixed_bytes: GI,
            gpu_fraction: 0.45,
            min_gpu_total_bytes: 38 * GI,
            fills_gpu: false,
        };
        engine.declared_bytes = 10 * GI;
        engine.profile = Profile {
            minutes: vec![1.0; 60],
        };
        let mut hog = growing_pod(0);
        hog.predicted = Demand::fixed(70 * GI);
        hog.declared_bytes = 70 * GI;
        hog.duration_min = 30;
        let pods = vec![hog, engine];
        let declared = simulate(
            &nodes,
            &pods,
            Accounting::Declared,
            200,
            1,
            None,
            &LearnPolicy::default(),
        );
        assert!(declared.start_failures > 0, "{declared:?}");
        assert_eq!(declared.pods_failed_at_start, 1, "{declared:?}");
        assert!(declared.pods_completed_without_kill <= 1, "{declared:?}");
        let peak = simulate(
            &nodes,
            &pods,
            Accounting::Peakfit,
            200,
            1,
            None,
            &LearnPolicy::default(),
        );
        assert_eq!(peak.start_failures, 0, "{peak:?}");
        assert_eq!(peak.pods_completed_without_kill, 2, "{peak:?}");
    }

    /// A PyTorch pod whose cache outgrows its GPU (`Demand::fills_gpu`) and whose real peak is
    /// above its prediction runs in the whole GPU: the allocator frees its cache and retries,
    /// so only a floor the GPU cannot hold runs it out of memory. The ledger reserves what
    /// placement chose for it, the GPU's usable memory.
    #[test]
    fn a_pod_whose_cache_outgrows_its_gpu_fails_only_on_its_floor() {
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![40 * GI],
        }];
        let fills = |floor_gib: u64| {
            let mut pod = growing_pod(0);
            pod.predicted = Demand {
                min_gpu_total_bytes: floor_gib * GI,
                fills_gpu: true,
                ..Demand::fixed(100 * GI)
            };
            pod.true_peak_fraction = 1.1;
            pod.profile = Profile {
                minutes: vec![1.0; 60],
            };
            pod
        };
        let run = |pod: DynPod| {
            simulate(
                &nodes,
                &[pod],
                Accounting::Peakfit,
                120,
                1,
                None,
                &LearnPolicy::default(),
            )
        };
        // Tensors and process 20 GiB, 22 really: the GPU holds them, the cache gives way.
        let ran = run(fills(20));
        assert_eq!(ran.oom_events, 0, "{ran:?}");
        assert_eq!(ran.pods_completed_without_kill, 1, "{ran:?}");
        assert_eq!(ran.starts[0].sized_bytes, 40 * GI);
        // 38 GiB predicted, 41.8 really: more than the GPU, whatever the cache does.
        let died = run(fills(38));
        assert!(died.oom_events > 0, "{died:?}");
        assert_eq!(died.pods_oom_killed, 1, "{died:?}");
    }

    /// The ledgers reserve what placement chose, not the pod's bytes on the GPU: a fills pod
    /// whose peak is within the safety margin (256 MiB here) of its GPU cannot share it and is
    /// taken whole (`Demand::whole_on`), so it reserves the whole 40 GiB, not its 39.875 GiB
    /// peak. The only case the two differ in: simulated GPUs have no driver reserve, so a GPU
    /// a larger peak outgrows is reserved at its size by either rule.
    #[test]
    fn a_fills_pod_taken_whole_reserves_the_gpu_not_its_peak() {
        let nodes = vec![DynNode {
            name: "n".into(),
            gpu_bytes: vec![40 * GI],
        }];
        let peak = 40 * GI - (128 << 20);
        let mut pod = growing_pod(0);
        pod.predicted = Demand {
            min_gpu_total_bytes: 20 * GI,
            fills_gpu: true,
            ..Demand::fixed(peak)
        };
        pod.true_peak_fraction = 1.0;
        assert_eq!(pod.predicted.bytes_on(40 * GI), peak);
        for accounting in [Accounting::Peakfit, Accounting::Learned] {
            let r = simulate(
                &nodes,
                std::slice::from_ref(&pod),
                accounting,
                120,
                1,
                None,
                &LearnPolicy::default(),
            );
            assert_eq!(r.starts.len(), 1, "{accounting:?}: {r:?}");
            assert_eq!(r.starts[0].sized_bytes, 40 * GI, "{accounting:?}");
            assert_eq!(r.oom_events, 0, "{accounting:?}: {r:?}");
        }
    }

    /// A run that filled its GPU alone reads at the GPU's size, a bound the GPU set: learning
    /// must not size its workload down to it. Fills pods predicted at 100 GiB (floor 20 GiB) run
    /// on a 40 GiB GPU while an 80 GiB one is busy; sized down to what those GPUs held, the next
    /// would share the 80 GiB GPU with a 30 GiB pod and its cache would fill it. Peakfit's
    /// accounting and the learned one both keep it whole, with no OOM.
    #[test]
    fn learning_reads_a_run_that_filled_its_gpu_as_no_less_than_its_prediction() {
        let nodes = vec![
            DynNode {
                name: "n40".into(),
                gpu_bytes: vec![40 * GI],
            },
            DynNode {
                name: "n80".into(),
                gpu_bytes: vec![80 * GI],
            },
        ];
        let pod = |kind: &str, predicted: Demand, arrival: u64, duration: u64| DynPod {
            kind: kind.into(),
            arrival_min: arrival,
            duration_min: duration,
            gpus: 1,
            declared_bytes: predicted.fixed_bytes.min(40 * GI),
            predicted,
            true_peak_fraction: 1.0,
            profile: Profile {
                minutes: (0..duration)
                    .map(|m| if m < 10 { 0.3 } else { 1.0 })
                    .collect(),
            },
            explicit: false,
        };
        let fills = Demand {
            min_gpu_total_bytes: 20 * GI,
            fills_gpu: true,
            ..Demand::fixed(100 * GI)
        };
        let pods = vec![
            pod("busy", Demand::fixed(50 * GI), 0, 230),
            pod("fills", fills, 1, 70),
            pod("fills", fills, 80, 70),
            pod("fills", fills, 160, 300),
            pod("fills", fills, 240, 100),
            pod("small", Demand::fixed(30 * GI), 243, 100),
        ];
        let policy = LearnPolicy {
            mode: learn::LearnMode::Predicted,
            margin: 0.05,
            min_runtime_secs: 3600,
            min_pods_down: 2,
        };
        for accounting in [Accounting::Peakfit, Accounting::Learned] {
            let r = simulate(&nodes, &pods, accounting, 600, 1, None, &policy);
            assert_eq!(r.oom_events, 0, "{accounting:?}: {r:?}");
            let fourth = r
                .starts
                .iter()
                .find(|s| s.pod == 4)
                .expect("the fourth fills pod");
            assert!(fourth.sized_bytes >= 80 * GI, "{accounting:?}: {fourth:?}");
        }
    }
}
