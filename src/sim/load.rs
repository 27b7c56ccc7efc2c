//! Whether the GPUs a run's pods can use hold the work asked of them: a necessary condition of
//! Hall's kind, measured on the pods a run really generates.
//!
//! For every set S of the cluster's GPU models, the pods that can run only on models of S must
//! do their work on S's GPUs. If the work that arrives in the run asks S for more than S's GPUs
//! hold over as long a time (load > 1, a rate), no scheduler that never over-commits a GPU can keep the queue
//! of those pods bounded, whatever order it starts them in; a load below 1 on every set leaves
//! the waits an ordering and packing problem. The condition ignores fragmentation, nodes and CPU, so a load
//! just under 1 does not say the pods can all be served.
//!
//! The load is a rate: the work of a day's arrivals, each pod's whole run time, against a day
//! of the GPUs. A run that starts on an empty cluster and stops at its horizon also has the
//! part of that work that would fall inside the run if every pod started on arrival: where it
//! exceeds what the GPUs offer in the run, waits must push the difference past the end, whatever
//! the order (a pod that waits w hours does at most w hours less of its work inside the run, so
//! the sum over pods of its GPUs × w is at least the difference in GPU-hours).
//!
//! Two measures, because neither alone is the whole truth: memory (a pod holds its ledger
//! demand per GPU for its run time) treats a GPU's memory as shareable down to the byte, a
//! strict bound; GPU time counts a GPU as taken whole by a pod that holds more than half of it
//! (no second such pod fits beside it, though a small one may: close, not strict), otherwise at
//! its share of the memory. Each pod is counted at the least
//! it can take on any model it can run on: the condition must hold for the best placement too.

use serde::Serialize;

use crate::placement::Demand;

const GIB: f64 = (1u64 << 30) as f64;

/// One GPU model of the cluster: how many GPUs of it, and each one's memory.
#[derive(Clone, Debug)]
pub struct GpuModel {
    pub name: String,
    pub gpus: u32,
    pub bytes: u64,
}

/// One pod's work as the load check counts it.
#[derive(Clone, Debug)]
pub struct PodWork {
    /// Its workload (a template of the scenario), for the break-down per kind.
    pub kind: String,
    /// The models it can run on, as indices into the cluster's models: the simulator's own
    /// rule, never re-derived here.
    pub models: Vec<usize>,
    pub gpus: u32,
    /// What the ledger reserves per GPU (`Demand::bytes_on` the GPU it lands on).
    pub demand: Demand,
    /// Its run time.
    pub hours: f64,
    /// When it arrives, in hours from the run's start.
    pub arrival_hours: f64,
}

impl PodWork {
    /// The least GiB and GPUs it can hold at once on any model it runs on.
    fn least(&self, models: &[GpuModel]) -> (f64, f64) {
        self.models
            .iter()
            .filter_map(|&m| models.get(m))
            .map(|m| {
                let bytes = self.demand.bytes_on(m.bytes);
                let share = if bytes.saturating_mul(2) > m.bytes {
                    1.0
                } else {
                    bytes as f64 / m.bytes as f64
                };
                let gpus = f64::from(self.gpus);
                (bytes as f64 / GIB * gpus, share * gpus)
            })
            .fold((f64::INFINITY, f64::INFINITY), |(b, g), (x, y)| {
                (b.min(x), g.min(y))
            })
    }

    /// Its models as a bit set.
    fn mask(&self) -> u64 {
        self.models
            .iter()
            .filter(|&&m| m < 64)
            .fold(0, |acc, &m| acc | (1 << m))
    }
}

/// The work of one pod kind within a set of models.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KindWork {
    pub kind: String,
    pub pods: usize,
    pub gib_hours: f64,
    pub gpu_hours: f64,
    /// The part of `gpu_hours` inside the run if every pod started on arrival.
    pub gpu_hours_in_run: f64,
}

/// One set of GPU models: the work the pods confined to it ask for, against what it offers.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SetLoad {
    pub models: Vec<String>,
    pub gpus: u32,
    /// Pods that can run only on models of this set.
    pub pods: usize,
    /// Whether the set is exactly the models its pods can use between them. Any other set has
    /// the same pods as the smaller set those models make, and more GPUs: a lower load that
    /// says nothing new.
    pub tight: bool,
    pub asked_gib_hours: f64,
    pub offered_gib_hours: f64,
    /// `asked_gib_hours / offered_gib_hours`.
    pub memory_load: f64,
    pub asked_gpu_hours: f64,
    pub offered_gpu_hours: f64,
    /// `asked_gpu_hours / offered_gpu_hours`.
    pub gpu_load: f64,
    /// The part of `asked_gib_hours` inside the run if every pod started on arrival (each
    /// pod's run time cut at the run's end).
    pub in_run_gib_hours: f64,
    /// `in_run_gib_hours / offered_gib_hours`: above 1, waits push the excess past the end.
    pub memory_load_in_run: f64,
    /// The part of `asked_gpu_hours` inside the run if every pod started on arrival.
    pub in_run_gpu_hours: f64,
    /// `in_run_gpu_hours / offered_gpu_hours`.
    pub gpu_load_in_run: f64,
    /// The asked work per pod kind, in the order the kinds first appear among the pods.
    pub by_kind: Vec<KindWork>,
}

/// Above this many models, [`loads`] weighs only the sets some pod is confined to exactly and
/// the whole cluster, not every subset (2^12 − 1 sets is already 4,095 rows).
pub const ALL_SETS_UP_TO: usize = 12;

/// The load on every non-empty set of `models` (fewest models first, then in the models'
/// order) of `pods` over a run of `hours`. Exponential in the models, so beyond
/// [`ALL_SETS_UP_TO`] models only the sets the pods' models make and the whole cluster (models
/// beyond the 63rd are left out).
pub fn loads(models: &[GpuModel], pods: &[PodWork], hours: f64) -> Vec<SetLoad> {
    let n = models.len().min(63);
    let all = (1u64 << n) - 1;
    let mut sets: Vec<u64> = if n <= ALL_SETS_UP_TO {
        (1..=all).collect()
    } else {
        let mut s: Vec<u64> = pods
            .iter()
            .map(|p| p.mask() & all)
            .filter(|m| *m != 0)
            .chain([all])
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    sets.sort_by_key(|s| (s.count_ones(), std::cmp::Reverse(s.reverse_bits())));
    // Per pod: its models, its least GiB and GPUs at once, its hours and its hours in the run.
    let work: Vec<(u64, (f64, f64), f64, f64)> = pods
        .iter()
        .map(|p| {
            let in_run = p.hours.min(hours - p.arrival_hours).max(0.0);
            (p.mask(), p.least(models), p.hours, in_run)
        })
        .collect();
    sets.into_iter()
        .map(|set| {
            let members: Vec<&GpuModel> = (0..n)
                .filter(|m| set & (1 << m) != 0)
                .map(|m| &models[m])
                .collect();
            let gpus: u32 = members.iter().map(|m| m.gpus).sum();
            let offered_gib_hours: f64 = members
                .iter()
                .map(|m| f64::from(m.gpus) * m.bytes as f64 / GIB * hours)
                .sum();
            let offered_gpu_hours = f64::from(gpus) * hours;
            let mut out = SetLoad {
                models: members.iter().map(|m| m.name.clone()).collect(),
                gpus,
                offered_gib_hours,
                offered_gpu_hours,
                ..SetLoad::default()
            };
            let mut used = 0u64;
            for (p, &(mask, (b, g), h, in_run)) in pods.iter().zip(&work) {
                if mask == 0 || mask & !set != 0 {
                    continue;
                }
                used |= mask;
                out.pods += 1;
                out.asked_gib_hours += b * h;
                out.asked_gpu_hours += g * h;
                out.in_run_gib_hours += b * in_run;
                out.in_run_gpu_hours += g * in_run;
                let k = match out.by_kind.iter().position(|k| k.kind == p.kind) {
                    Some(k) => k,
                    None => {
                        out.by_kind.push(KindWork {
                            kind: p.kind.clone(),
                            ..KindWork::default()
                        });
                        out.by_kind.len() - 1
                    }
                };
                let kind = &mut out.by_kind[k];
                kind.pods += 1;
                kind.gib_hours += b * h;
                kind.gpu_hours += g * h;
                kind.gpu_hours_in_run += g * in_run;
            }
            out.tight = out.pods > 0 && used == set;
            out.memory_load = out.asked_gib_hours / offered_gib_hours;
            out.gpu_load = out.asked_gpu_hours / offered_gpu_hours;
            out.memory_load_in_run = out.in_run_gib_hours / offered_gib_hours;
            out.gpu_load_in_run = out.in_run_gpu_hours / offered_gpu_hours;
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Two models (2 × 80 GiB "big", 4 × 20 GiB "small") for 10 h, three pods counted by hand.
    #[test]
    fn each_set_gets_the_work_of_the_pods_confined_to_it() {
        let models = [
            GpuModel {
                name: "big".into(),
                gpus: 2,
                bytes: 80 * GI,
            },
            GpuModel {
                name: "small".into(),
                gpus: 4,
                bytes: 20 * GI,
            },
        ];
        let pod = |kind: &str, models: Vec<usize>, gpus, demand, hours| PodWork {
            kind: kind.into(),
            models,
            gpus,
            demand,
            hours,
            arrival_hours: 8.0,
        };
        // Every pod arrives at hour 8, 2 h before the end: in the run a, b and c do 2 h each.
        let pods = [
            // Big only, 60 GiB of 80 (over half: a whole GPU) for 5 h: 300 GiB-h, 5 GPU-h.
            pod("a", vec![0], 1, Demand::fixed(60 * GI), 5.0),
            // A quarter of whichever GPU, on two, for 4 h: least on small, 2 × 5 GiB × 4 h =
            // 40 GiB-h; a quarter either way, 2 × 0.25 × 4 = 2 GPU-h.
            pod("b", vec![0, 1], 2, Demand::fraction(0.25), 4.0),
            // 12 GiB for 10 h: 120 GiB-h anywhere; over half of a small GPU (a whole one) but
            // 0.15 of a big one: 1.5 GPU-h.
            pod("c", vec![0, 1], 1, Demand::fixed(12 * GI), 10.0),
        ];
        let sets = loads(&models, &pods, 10.0);
        let names: Vec<Vec<String>> = sets.iter().map(|s| s.models.clone()).collect();
        assert_eq!(names, [vec!["big"], vec!["small"], vec!["big", "small"]]);
        let (big, small, both) = (&sets[0], &sets[1], &sets[2]);

        assert_eq!((big.pods, big.gpus, big.tight), (1, 2, true));
        assert!(close(big.asked_gib_hours, 300.0), "{big:?}");
        assert!(close(big.offered_gib_hours, 1600.0), "{big:?}");
        assert!(close(big.memory_load, 300.0 / 1600.0), "{big:?}");
        assert!(close(big.asked_gpu_hours, 5.0), "{big:?}");
        assert!(close(big.gpu_load, 5.0 / 20.0), "{big:?}");
        assert!(close(big.in_run_gib_hours, 120.0), "{big:?}");
        assert!(close(big.memory_load_in_run, 120.0 / 1600.0), "{big:?}");
        assert!(close(big.in_run_gpu_hours, 2.0), "{big:?}");
        assert!(close(big.gpu_load_in_run, 0.1), "{big:?}");

        // No pod is confined to the small GPUs alone.
        assert_eq!((small.pods, small.tight), (0, false));
        assert!(close(small.offered_gib_hours, 800.0) && close(small.gpu_load, 0.0));

        assert_eq!((both.pods, both.gpus, both.tight), (3, 6, true));
        assert!(close(both.asked_gib_hours, 460.0), "{both:?}");
        assert!(close(both.memory_load, 460.0 / 2400.0), "{both:?}");
        assert!(close(both.asked_gpu_hours, 8.5), "{both:?}");
        assert!(close(both.gpu_load, 8.5 / 60.0), "{both:?}");
        // In the run: a 2 × 60, b 2 × 2 × 5, c 2 × 12 GiB-h; 2 × 1, 2 × 2 × 0.25, 2 × 0.15 GPU-h.
        assert!(close(both.in_run_gib_hours, 164.0), "{both:?}");
        assert!(close(both.memory_load_in_run, 164.0 / 2400.0), "{both:?}");
        assert!(close(both.in_run_gpu_hours, 3.3), "{both:?}");
        assert!(close(both.gpu_load_in_run, 3.3 / 60.0), "{both:?}");
        let kinds: Vec<(&str, usize, f64)> = both
            .by_kind
            .iter()
            .map(|k| (k.kind.as_str(), k.pods, k.gpu_hours))
            .collect();
        assert_eq!(kinds, [("a", 1, 5.0), ("b", 1, 2.0), ("c", 1, 1.5)]);
    }

    /// A set wider than its pods' models is not tight: it has their work and more GPUs.
    #[test]
    fn a_set_beyond_its_pods_models_is_not_tight() {
        let models: Vec<GpuModel> = ["x", "y", "z"]
            .into_iter()
            .map(|name| GpuModel {
                name: name.into(),
                gpus: 1,
                bytes: 10 * GI,
            })
            .collect();
        let pods = [PodWork {
            kind: "k".into(),
            models: vec![2],
            gpus: 1,
            demand: Demand::fixed(GI),
            hours: 1.0,
            arrival_hours: 0.0,
        }];
        let sets = loads(&models, &pods, 1.0);
        assert_eq!(sets.len(), 7);
        let tight: Vec<&Vec<String>> = sets.iter().filter(|s| s.tight).map(|s| &s.models).collect();
        assert_eq!(tight, [&vec!["z".to_owned()]]);
        let confining = sets.iter().filter(|s| s.pods == 1).count();
        assert_eq!(confining, 4, "{sets:?}");
        // 1 GiB of 10 for an hour on the one GPU of z: a tenth either way.
        assert!(close(sets[2].memory_load, 0.1) && close(sets[2].gpu_load, 0.1));
    }

    /// Beyond `ALL_SETS_UP_TO` models only the pods' own sets and the whole cluster are weighed,
    /// not 2^n − 1 of them.
    #[test]
    fn many_models_weigh_the_pods_sets_and_the_cluster_only() {
        let models: Vec<GpuModel> = (0..ALL_SETS_UP_TO + 2)
            .map(|i| GpuModel {
                name: format!("m{i}"),
                gpus: 1,
                bytes: 10 * GI,
            })
            .collect();
        let pod = |kind: &str, models: Vec<usize>| PodWork {
            kind: kind.into(),
            models,
            gpus: 1,
            demand: Demand::fixed(GI),
            hours: 1.0,
            arrival_hours: 0.0,
        };
        let pods = [pod("a", vec![0]), pod("b", vec![1, 2]), pod("c", vec![0])];
        let sets = loads(&models, &pods, 1.0);
        let names: Vec<usize> = sets.iter().map(|s| s.models.len()).collect();
        assert_eq!(names, [1, 2, ALL_SETS_UP_TO + 2], "{sets:?}");
        assert_eq!(sets[0].pods, 2);
        assert_eq!(sets[2].pods, 3);
    }
}
