//! Property tests over random clusters and random sequences of binds, releases and agent
//! observations: the promises filter and bind make to each other.

use proptest::prelude::*;

use super::*;
use crate::inventory::{GpuDevice, NodeGpuReportStatus, NvmlStatus};

const GI: u64 = 1 << 30;
const NOW: i64 = 1_000_000;

fn cfg() -> FitConfig {
    FitConfig {
        safety_margin_bytes: 256 << 20,
        max_report_age_secs: Some(120),
    }
}

fn arb_demand() -> impl Strategy<Value = Demand> {
    prop_oneof![
        (1u64..40).prop_map(|g| Demand::fixed(g * GI / 2)),
        // A PyTorch pod whose cached peak may outgrow the GPU and take it whole.
        (1u64..200, 1u64..40).prop_map(|(peak, floor)| Demand {
            min_gpu_total_bytes: floor.min(peak) * GI / 2,
            fills_gpu: true,
            ..Demand::fixed(peak * GI / 2)
        }),
        (1u32..=1000).prop_map(|m| Demand::fraction(f64::from(m) / 1000.0)),
        (
            0u64..8,
            1u32..=900,
            prop::sample::select(vec![0, 24, 40, 80])
        )
            .prop_map(|(fixed, m, min)| Demand {
                fixed_bytes: fixed * GI,
                gpu_fraction: f64::from(m) / 1000.0,
                min_gpu_total_bytes: min * GI,
                fills_gpu: false,
            }),
    ]
}

fn arb_class() -> impl Strategy<Value = PodClass> {
    (
        prop::sample::select(vec![0u32, 1, 1, 1, 2, 4, 8]),
        arb_demand(),
        prop::sample::select(vec![
            vec![],
            vec!["A100".to_string()],
            vec!["L4".to_string()],
        ]),
    )
        .prop_map(|(gpus, demand, gpu_models)| PodClass {
            shape: PodShape { gpus, demand },
            cpu_milli: 0,
            gpu_models,
        })
}

fn arb_policy() -> impl Strategy<Value = ScoringPolicy> {
    prop::sample::select(vec![
        ScoringPolicy::Peakfit,
        ScoringPolicy::Binpack,
        ScoringPolicy::Spread,
    ])
}

/// A node of 1 to 8 devices of mixed sizes and models.
fn arb_node() -> impl Strategy<Value = NodeLedger> {
    prop::collection::vec(
        prop::sample::select(vec![
            (24u64, "L4"),
            (40, "A100"),
            (80, "A100"),
            (80, "H100"),
        ]),
        1..=8,
    )
    .prop_map(|devs| {
        let mut n = NodeLedger::with_gpus(
            "n",
            devs.iter()
                .enumerate()
                .map(|(i, &(g, m))| GpuLedger::new(format!("GPU-{i}"), g * GI).with_model(m))
                .collect(),
        );
        n.observed_at_unix = Some(NOW);
        n
    })
}

#[derive(Clone, Debug)]
enum Op {
    Bind(PodClass, ScoringPolicy),
    Release(usize),
    /// Pod (by bind order), GPU slot, observed bytes as a share of the GPU, unattributed GiB.
    Observe(usize, usize, u32, u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (arb_class(), arb_policy()).prop_map(|(c, p)| Op::Bind(c, p)),
        2 => any::<usize>().prop_map(Op::Release),
        2 => (any::<usize>(), any::<usize>(), 0u32..=1200, 0u64..4)
            .prop_map(|(p, g, m, u)| Op::Observe(p, g, m, u)),
    ]
}

fn mix() -> ShapeMix {
    ShapeMix::new([
        (
            PodClass::from(PodShape {
                gpus: 1,
                demand: Demand::fraction(0.5),
            }),
            2.0,
        ),
        (
            PodClass::from(PodShape {
                gpus: 1,
                demand: Demand::fixed(20 * GI),
            }),
            1.0,
        ),
        (
            PodClass::from(PodShape {
                gpus: 2,
                demand: Demand::fraction(1.0),
            }),
            1.0,
        ),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Filter admits, bind re-checks on the unchanged ledger and gets the same GPUs; the commit
    /// never takes a device past its size minus the margin; k-GPU pods get k distinct GPUs,
    /// of an accepted model and big enough, each charged what the demand takes on it; release
    /// gives every byte back.
    #[test]
    fn binds_never_overcommit_and_bind_agrees_with_filter(
        mut node in arb_node(),
        ops in prop::collection::vec(arb_op(), 1..60),
    ) {
        let cfg = cfg();
        let mix = mix();
        let mut bound: Vec<String> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Bind(class, policy) => {
                    let filtered = place(&node, &class, policy, &mix, &cfg, NOW);
                    let fitted = fit_class(&node, &class, &cfg, NOW);
                    prop_assert_eq!(filtered.is_ok(), fitted.is_ok());
                    let Ok(filtered) = filtered else { continue };
                    let rebound = place(&node, &class, policy, &mix, &cfg, NOW).unwrap();
                    prop_assert_eq!(&filtered, &rebound);
                    prop_assert_eq!(fitted.clone().unwrap(), fit_class(&node, &class, &cfg, NOW).unwrap());

                    let p = &filtered.placement;
                    prop_assert_eq!(p.gpu_indices.len(), class.shape.gpus as usize);
                    prop_assert!(p.gpu_indices.windows(2).all(|w| w[0] < w[1]), "{:?}", p);
                    for (&i, &b) in p.gpu_indices.iter().zip(&p.per_gpu_bytes) {
                        let g = &node.gpus[i];
                        prop_assert!(class.accepts_model(&g.model));
                        prop_assert!(class.shape.demand.runs_in(g.room(cfg.safety_margin_bytes)));
                        // A whole GPU takes what the empty GPU offers; any other share its bytes.
                        let (share, _) = crate::placement::fit::need_on(&class.shape.demand, g, cfg.safety_margin_bytes);
                        prop_assert_eq!(b, share);
                    }
                    let before: Vec<u64> = node.gpus.iter().map(GpuLedger::free_bytes).collect();
                    let pod = format!("pod-{n}");
                    node.reserve(&pod, &p.gpu_indices, &p.per_gpu_bytes);
                    for &i in &p.gpu_indices {
                        let g = &node.gpus[i];
                        // No margin beside a whole-GPU pod: nobody else is there.
                        let whole = class.shape.demand.whole_on(g.room(cfg.safety_margin_bytes));
                        let margin = if whole { 0 } else { cfg.safety_margin_bytes };
                        prop_assert!(
                            g.committed_bytes() + margin <= g.total_bytes,
                            "GPU {} over-committed: {} of {}", i, g.committed_bytes(), g.total_bytes
                        );
                    }
                    // Release right away and re-reserve: every byte comes back.
                    node.release(&pod);
                    let after: Vec<u64> = node.gpus.iter().map(GpuLedger::free_bytes).collect();
                    prop_assert_eq!(&before, &after);
                    node.reserve(&pod, &p.gpu_indices, &p.per_gpu_bytes);
                    bound.push(pod);
                }
                Op::Release(k) if !bound.is_empty() => {
                    let pod = bound.remove(k % bound.len());
                    prop_assert!(node.release(&pod) || !node.gpus.iter().any(|g| g.reservation(&pod).is_some()));
                    prop_assert!(node.gpus.iter().all(|g| g.reservation(&pod).is_none()));
                }
                Op::Observe(k, slot, milli, unattributed) if !bound.is_empty() => {
                    let pod = bound[k % bound.len()].clone();
                    let i = slot % node.gpus.len();
                    let g = &mut node.gpus[i];
                    let used = g.total_bytes / 1000 * u64::from(milli);
                    let (total, reserved) = (g.total_bytes, g.driver_reserved_bytes);
                    let ours = g.reservation(&pod).is_some();
                    g.observe(total, reserved, [(pod.as_str(), used)], unattributed * GI);
                    // Use by a pod with no reservation on the GPU is nobody's here.
                    let stranger = if ours { 0 } else { used };
                    prop_assert_eq!(g.unattributed_bytes, unattributed * GI + stranger);
                    // The cached sums agree with the reservations.
                    let charged: u64 = g.reservations().values().map(Reservation::charged_bytes).sum();
                    prop_assert_eq!(g.committed_bytes(), charged + g.unattributed_bytes + reserved);
                    if ours {
                        prop_assert_eq!(g.reservation(&pod).unwrap().observed_bytes, used);
                    }
                }
                _ => {}
            }
        }
        // Releasing everything leaves only what no pod accounts for.
        for pod in &bound {
            node.release(pod);
        }
        for g in &node.gpus {
            prop_assert_eq!(g.committed_bytes(), g.unattributed_bytes + g.driver_reserved_bytes);
        }
    }

    /// Taking memory from GPUs updates the fragmentation exactly as a rescan would.
    #[test]
    fn incremental_fragmentation_matches_a_rescan(
        mut node in arb_node(),
        takes in prop::collection::vec((any::<usize>(), 0u32..=1000), 1..4),
        cpu in prop::option::of(0u64..64_000),
        cpu_taken in 0u64..16_000,
    ) {
        let cfg = FitConfig::simulation();
        let mut weighted: Vec<(PodClass, f64)> = mix().shapes().to_vec();
        weighted.push((PodClass { cpu_milli: 8000, ..weighted[0].0.clone() }, 1.0));
        weighted.push((PodClass::from(PodShape { gpus: 0, demand: Demand::default() }), 0.5));
        let mix = ShapeMix::new(weighted);
        node.cpu_capacity_milli = cpu;
        let state = FragState::new(&node, &mix, &cfg, FragUnit::Gpus);
        let mut slots: Vec<usize> = takes.iter().map(|&(s, _)| s % node.gpus.len()).collect();
        slots.dedup();
        let changes: Vec<(usize, u64)> = slots
            .iter()
            .zip(&takes)
            .map(|(&i, &(_, m))| (i, node.gpus[i].total_bytes / 1000 * u64::from(m)))
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        let changes: Vec<(usize, u64)> = changes.into_iter().filter(|c| seen.insert(c.0)).collect();
        let gpu_changes: Vec<_> = changes
            .iter()
            .map(|&(i, b)| frag::GpuChange {
                gpu: i,
                free_before: node.gpus[i].free_bytes(),
                free_after: node.gpus[i].free_bytes() - b,
            })
            .collect();
        let incremental = state.value_after(&gpu_changes, cpu_taken);
        let mut applied = state.clone();
        applied.apply(&gpu_changes, cpu_taken);
        prop_assert!((applied.value() - incremental).abs() < 1e-9);
        let class = PodClass { cpu_milli: cpu_taken, ..Default::default() };
        let (idx, bytes): (Vec<usize>, Vec<u64>) = changes.iter().copied().unzip();
        node.reserve_placement("probe", &Placement { gpu_indices: idx, per_gpu_bytes: bytes }, &class);
        let rescan = node_fragmentation(&node, &mix, &cfg, FragUnit::Gpus);
        prop_assert!((incremental - rescan).abs() < 1e-9, "{} vs {}", incremental, rescan);
    }

    /// The best node, and only nodes that good, get 10; the order of the others is kept.
    #[test]
    fn the_0_to_10_scale_keeps_the_order(scores in prop::collection::vec(-1e6f64..1e6, 1..50)) {
        let ints = scores_0_to_10(&scores);
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for (s, i) in scores.iter().zip(&ints) {
            prop_assert_eq!(*i == 10, *s >= max - 1e-9 * max.abs().max(1.0));
        }
        for (a, ia) in scores.iter().zip(&ints) {
            for (b, ib) in scores.iter().zip(&ints) {
                if a < b {
                    prop_assert!(ia <= ib);
                }
            }
        }
    }

    /// With a tie-break, exactly one node gets 10 (when any score is finite), it is one of the
    /// best, and a better node never gets less than a worse one.
    #[test]
    fn one_node_at_10_and_the_order_kept(
        scores in prop::collection::vec(prop::sample::select(vec![-2.0f64, 0.0, 0.5, 1.0, f64::NAN]), 1..40),
    ) {
        let ints = scores_0_to_10_unique(&scores, |a, b| b.cmp(&a));
        let finite = scores.iter().any(|s| s.is_finite());
        let tens: usize = ints.iter().map(|&i| usize::from(i == 10)).sum();
        prop_assert_eq!(tens, usize::from(finite));
        let plain = scores_0_to_10(&scores);
        for (i, (&u, &p)) in ints.iter().zip(&plain).enumerate() {
            prop_assert!(u == p || (p == 10 && u == 9), "{} {} {}", i, u, p);
        }
        // The lowest index among the tied wins (`prefer` orders later indices first).
        if let Some(w) = ints.iter().position(|&i| i == 10) {
            prop_assert_eq!(plain.iter().position(|&i| i == 10), Some(w));
        }
        for (a, ia) in scores.iter().zip(&ints) {
            for (b, ib) in scores.iter().zip(&ints) {
                if a < b {
                    prop_assert!(ia <= ib);
                }
            }
        }
    }

    /// MIG parents come from the agent's report but are never offered to pods.
    #[test]
    fn mig_parents_are_never_chosen(
        instances in prop::collection::vec(prop::sample::select(vec![10u64, 20, 40]), 0..7),
        wholes in 0usize..3,
        class in arb_class(),
        policy in arb_policy(),
    ) {
        let mut gpus = vec![GpuDevice {
            uuid: "GPU-parent".into(),
            name: "A100".into(),
            memory_total_bytes: 80 * GI,
            memory_free_bytes: 80 * GI,
            mig_enabled: true,
            ..Default::default()
        }];
        for (i, &g) in instances.iter().enumerate() {
            gpus.push(GpuDevice {
                uuid: format!("MIG-{i}"),
                name: "A100".into(),
                memory_total_bytes: g * GI,
                memory_free_bytes: g * GI,
                mig_parent_uuid: Some("GPU-parent".into()),
                ..Default::default()
            });
        }
        for i in 0..wholes {
            gpus.push(GpuDevice {
                uuid: format!("GPU-{i}"),
                name: "A100".into(),
                memory_total_bytes: 80 * GI,
                memory_free_bytes: 80 * GI,
                ..Default::default()
            });
        }
        let mut node = NodeLedger::new("n");
        node.apply_report(&NodeGpuReportStatus {
            observed_at: "1970-01-12T13:46:40Z".into(),
            nvml: NvmlStatus { up: true, ..Default::default() },
            gpus,
            ..Default::default()
        }).unwrap();
        prop_assert!(node.gpus.iter().all(|g| g.uuid != "GPU-parent"));
        if let Ok(s) = place(&node, &class, policy, &mix(), &cfg(), NOW) {
            for &i in &s.placement.gpu_indices {
                prop_assert_ne!(node.gpus[i].uuid.as_str(), "GPU-parent");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The allocation-free verdicts filter and prioritize use on every node answer exactly as
    /// `fit_class` and `place` do, on partly used nodes of mixed GPUs.
    #[test]
    fn fast_verdicts_match_fit_and_place(
        mut node in arb_node(),
        taken in prop::collection::vec((any::<usize>(), 0u32..=1000), 0..8),
        class in arb_class(),
        policy in arb_policy(),
        with_mix in any::<bool>(),
    ) {
        for (k, &(s, m)) in taken.iter().enumerate() {
            let i = s % node.gpus.len();
            let bytes = node.gpus[i].free_bytes() / 1000 * u64::from(m);
            let p = Placement { gpu_indices: vec![i], per_gpu_bytes: vec![bytes] };
            node.reserve_placement(&format!("p{k}"), &p, &PodClass::default());
        }
        let cfg = cfg();
        let mix = if with_mix { mix() } else { ShapeMix::default() };
        prop_assert_eq!(
            check_class(&node, &class, &cfg, NOW),
            fit_class(&node, &class, &cfg, NOW).map(|_| ())
        );
        let full = place(&node, &class, policy, &mix, &cfg, NOW).map(|s| s.score.to_bits());
        let fast = place_score(&node, &class, policy, &mix, &cfg, NOW).map(f64::to_bits);
        prop_assert_eq!(fast, full);
    }
}
