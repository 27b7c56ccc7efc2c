//! Everything a node's score reads from its ledger, in one comparable value, so that nodes in
//! the same state are scored once per pod class instead of once each.
//!
//! A new pod class (or a new shape mix) finds no node's memo (`placement::memo`) and would cost
//! prioritize a full scoring of every candidate: about 1.4 µs of CPU per node, 7 ms for 5,000.
//! Clusters are made of few kinds of node and their states repeat: every empty node of a pool
//! looks alike, and so do the nodes holding the same replicas. `place` is a pure function of
//! the pod's class, the mix, the configuration and the inputs collected here, so two nodes with
//! equal `ScoreInputs` get bit-identical scores, and the second can take the first's.
//!
//! The index keeps one `ScoreInputs` per distinct state with one score memo each
//! (`placement::memo`), shared by every node in that state.
//!
//! What is *not* in here, and why that is safe: the node's name and GPU UUIDs (scoring never
//! reads them), observed use that stays under the reservations (only the free bytes it leaves
//! count, and those are in), and the report's time and condition: whether a node can take a pod
//! now moves with the clock, so callers check `fit::node_usable` for each node before sharing a
//! score, and only usable nodes share.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;

use super::ledger::NodeLedger;
use super::patterns::units;

/// A node's scoring inputs. Cheap to compare when unequal (a precomputed hash first).
#[derive(Clone, Debug)]
pub struct ScoreInputs {
    hash: u64,
    /// Free CPU (a flag word, then the value), the GPU count, then per GPU in index order: its
    /// size, free bytes, driver's reserve, model (an index into `models`), and the fill-pattern units of its
    /// reservations (`patterns::units` of each predicted share, sorted) after their count.
    words: Box<[u64]>,
    /// The node's distinct GPU models, in order of first appearance.
    models: SmallVec<[Arc<str>; 1]>,
}

impl ScoreInputs {
    pub fn of(node: &NodeLedger) -> Self {
        let mut words: Vec<u64> = Vec::with_capacity(3 + node.gpus.len() * 7);
        let mut models: SmallVec<[Arc<str>; 1]> = SmallVec::new();
        match node.cpu_free_milli() {
            Some(cpu) => words.extend([1, cpu]),
            None => words.extend([0, 0]),
        }
        words.push(node.gpus.len() as u64);
        let mut shares: SmallVec<[u16; 8]> = SmallVec::new();
        for gpu in &node.gpus {
            let model = models
                .iter()
                .position(|m| Arc::ptr_eq(m, &gpu.model) || **m == *gpu.model)
                .unwrap_or_else(|| {
                    models.push(gpu.model.clone());
                    models.len() - 1
                });
            shares.clear();
            shares.extend(
                gpu.reservations()
                    .values()
                    .filter(|r| r.predicted_bytes > 0)
                    .map(|r| units(r.predicted_bytes, gpu.total_bytes)),
            );
            shares.sort_unstable();
            // The driver's reserve beside the free bytes: a whole-GPU pod needs the size less
            // the reserve (`fit::need_on`), so two GPUs with equal free memory, one of them
            // short by the reserve and the other by unattributed use, take different pods.
            words.extend([
                gpu.total_bytes,
                gpu.free_bytes(),
                gpu.driver_reserved_bytes,
                model as u64,
                shares.len() as u64,
            ]);
            words.extend(shares.iter().map(|&u| u64::from(u)));
        }
        // The models' names hash by content: equal nodes whose ledgers hold different copies
        // of a model's name still meet.
        let mut h = foldhash::fast::FixedState::with_seed(0x9e37_79b9).build_hasher();
        words.hash(&mut h);
        for m in &models {
            m.hash(&mut h);
        }
        Self {
            hash: h.finish(),
            words: words.into_boxed_slice(),
            models,
        }
    }
}

impl PartialEq for ScoreInputs {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.words == other.words
            && self.models.len() == other.models.len()
            && self
                .models
                .iter()
                .zip(&other.models)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
    }
}

impl Eq for ScoreInputs {}

impl Hash for ScoreInputs {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::demand::{Demand, PodClass, PodShape};
    use crate::placement::fit::FitConfig;
    use crate::placement::frag::ShapeMix;
    use crate::placement::ledger::GpuLedger;
    use crate::placement::score::{ScoringPolicy, place_score};

    const GI: u64 = 1 << 30;

    /// A small deterministic generator (xorshift): the core takes no `rand`.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            crate::convert::u64_to_usize(self.0 % n as u64)
        }
    }

    /// A node built from a small random recipe: few enough choices that many nodes repeat.
    fn node(rng: &mut Rng, name: &str, model: &str) -> NodeLedger {
        let gpus = 1 + rng.below(4);
        let mut n = NodeLedger::with_gpus(
            name,
            (0..gpus)
                .map(|g| GpuLedger::new(format!("{name}-gpu-{g}"), 80 * GI).with_model(model))
                .collect(),
        );
        n.cpu_capacity_milli = Some(64_000);
        n.reserve_host(&format!("{name}/host"), rng.below(3) as u64 * 8_000, 0);
        for p in 0..rng.below(4) {
            let g = rng.below(gpus);
            let gib = [10, 20, 40][rng.below(3)];
            n.reserve(&format!("{name}/pod-{p}"), &[g], &[gib * GI]);
        }
        n
    }

    fn classes() -> Vec<PodClass> {
        let mut out = Vec::new();
        for (gpus, gib) in [(1, 5), (1, 20), (1, 41), (2, 30), (4, 70)] {
            for cpu in [0, 4_000, 40_000] {
                out.push(PodClass {
                    shape: PodShape {
                        gpus,
                        demand: Demand::fixed(gib * GI),
                    },
                    cpu_milli: cpu,
                    gpu_models: Vec::new(),
                });
            }
        }
        out
    }

    /// The contract sharing relies on: equal inputs, bit-identical scores, under every policy
    /// and with a mix that follows fill patterns and CPU balance. Nodes are random (models as
    /// separate copies of one name, so pointer equality is not what makes them equal), and the
    /// test checks that enough of them do repeat for it to prove something.
    #[test]
    fn equal_inputs_score_alike() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let nodes: Vec<NodeLedger> = (0..300)
            .map(|i| node(&mut rng, &format!("n{i}"), &String::from("H100")))
            .collect();
        let inputs: Vec<ScoreInputs> = nodes.iter().map(ScoreInputs::of).collect();
        let cfg = FitConfig::simulation();
        let mix = ShapeMix::new(classes().into_iter().map(|c| (c, 1.0)));
        let mut equal_pairs = 0;
        for a in 0..nodes.len() {
            for b in a + 1..nodes.len() {
                if inputs[a] != inputs[b] {
                    continue;
                }
                equal_pairs += 1;
                for class in classes() {
                    for policy in ScoringPolicy::ALL {
                        let sa = place_score(&nodes[a], &class, policy, &mix, &cfg, 0);
                        let sb = place_score(&nodes[b], &class, policy, &mix, &cfg, 0);
                        match (sa, sb) {
                            (Ok(x), Ok(y)) => assert_eq!(x.to_bits(), y.to_bits(), "{a} {b}"),
                            (Err(x), Err(y)) => assert_eq!(x, y),
                            other => panic!("{a} {b}: {other:?}"),
                        }
                    }
                }
            }
        }
        assert!(equal_pairs > 100, "only {equal_pairs} equal pairs");
    }

    /// Each input the score reads makes nodes unequal when it differs.
    #[test]
    fn every_input_counts() {
        let base = || {
            let mut n = NodeLedger::with_gpus(
                "a",
                vec![
                    GpuLedger::new("a-0", 80 * GI).with_model("H100"),
                    GpuLedger::new("a-1", 80 * GI).with_model("H100"),
                ],
            );
            n.cpu_capacity_milli = Some(64_000);
            n.reserve("a/p", &[0], &[20 * GI]);
            n
        };
        let same = ScoreInputs::of(&base());
        // Names, UUIDs and pod keys are not inputs.
        let mut renamed = NodeLedger::with_gpus(
            "b",
            vec![
                GpuLedger::new("b-0", 80 * GI).with_model("H100"),
                GpuLedger::new("b-1", 80 * GI).with_model("H100"),
            ],
        );
        renamed.cpu_capacity_milli = Some(64_000);
        renamed.reserve("b/q", &[0], &[20 * GI]);
        assert_eq!(ScoreInputs::of(&renamed), same);

        let mut more_free = base();
        more_free.release("a/p");
        more_free.reserve("a/p", &[0], &[19 * GI]);
        let mut other_gpu = base();
        other_gpu.release("a/p");
        other_gpu.reserve("a/p", &[1], &[20 * GI]);
        let mut cpu = base();
        cpu.reserve_host("a/h", 1_000, 0);
        let mut no_cpu = base();
        no_cpu.cpu_capacity_milli = None;
        let mut model = base();
        model.gpus[1] = GpuLedger::new("a-1", 80 * GI).with_model("A100");
        // The same free memory split over two pods: the fill patterns see it differently.
        let mut split = base();
        split.release("a/p");
        split.reserve("a/p", &[0], &[10 * GI]);
        split.reserve("a/r", &[0], &[10 * GI]);
        // The same free memory, short by the driver's reserve on one node and by a process
        // peakfit did not place on the other: a whole GPU fits only the first.
        let mut reserve = base();
        reserve.gpus[1].observe(80 * GI, GI, [], 0);
        let mut unattributed = base();
        unattributed.gpus[1].observe(80 * GI, 0, [], GI);
        assert_eq!(
            reserve.gpus[1].free_bytes(),
            unattributed.gpus[1].free_bytes()
        );
        let whole = PodClass {
            shape: PodShape {
                gpus: 1,
                demand: Demand::fraction(1.0),
            },
            cpu_milli: 0,
            gpu_models: Vec::new(),
        };
        let (cfg, mix) = (FitConfig::simulation(), ShapeMix::default());
        let fits = |n: &NodeLedger| {
            place_score(n, &whole, ScoringPolicy::Binpack, &mix, &cfg, 0)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(fits(&reserve).is_ok());
        assert!(fits(&unattributed).is_err());
        assert_ne!(ScoreInputs::of(&reserve), ScoreInputs::of(&unattributed));
        for (what, n) in [
            ("driver reserve", reserve),
            ("free bytes", more_free),
            ("which GPU", other_gpu),
            ("free CPU", cpu),
            ("CPU tracked", no_cpu),
            ("model", model),
            ("shares", split),
        ] {
            assert_ne!(ScoreInputs::of(&n), same, "{what}");
        }
    }
}
