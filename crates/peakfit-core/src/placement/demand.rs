//! What a pod asks of each GPU it lands on.

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

/// Memory a pod needs on each of its GPUs.
///
/// A fixed part plus a fraction of the GPU's size, because serving engines (vLLM
/// `gpu-memory-utilization`, TGI, SGLang) size their budget by the device they land on: the same
/// pod needs 36 GiB on an 80 GiB card and 18 GiB on a 40 GiB one. The openb trace's `gpu_milli`
/// is the pure-fraction case, an explicit `peakfit.io/vram` the pure-fixed one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    pub fixed_bytes: u64,
    /// In `[0, 1]`.
    pub gpu_fraction: f64,
    /// The smallest GPU the pod can run on at all: an engine told to use 45 % of a 24 GiB card
    /// cannot fit 16 GiB of weights in that budget, however empty the card is. 0 = any size.
    #[serde(default)]
    pub min_gpu_total_bytes: u64,
    /// `fixed_bytes` is a peak the PyTorch caching allocator reaches by keeping freed blocks
    /// cached, and on a GPU too small for it (but at least `min_gpu_total_bytes`) the pod still
    /// runs, filling the GPU: when `cudaMalloc` fails the allocator frees every cached segment
    /// it can and tries again before raising out-of-memory (`c10/cuda/CUDACachingAllocator.cpp`,
    /// `malloc`: `release_available_cached_blocks`, then `release_cached_blocks` and a retry).
    /// There the pod takes the whole GPU: its cache grows into whatever a neighbour would use.
    /// Measured: Qwen3-0.6B generating 64 × (1,024 + 1,024) tokens allocates 15.4 GiB, and its
    /// cache filled an H200 to 139 GiB after one such retry (`tests/data/h200b`).
    #[serde(default)]
    pub fills_gpu: bool,
}

/// A GPU as the fit sizes a pod on it: its size, what the driver leaves of it, and the safety
/// margin kept free beside a pod's peak (`FitConfig::safety_margin_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuRoom {
    pub total_bytes: u64,
    /// `total_bytes` less the driver's reserve.
    pub usable_bytes: u64,
    pub margin_bytes: u64,
}

impl GpuRoom {
    /// A GPU known only by its size: no driver reserve, no margin.
    pub const fn bare(total_bytes: u64) -> Self {
        Self {
            total_bytes,
            usable_bytes: total_bytes,
            margin_bytes: 0,
        }
    }
}

impl Demand {
    pub const fn fixed(bytes: u64) -> Self {
        Self {
            fixed_bytes: bytes,
            gpu_fraction: 0.0,
            min_gpu_total_bytes: 0,
            fills_gpu: false,
        }
    }

    pub const fn fraction(fraction: f64) -> Self {
        Self {
            fixed_bytes: 0,
            gpu_fraction: fraction,
            min_gpu_total_bytes: 0,
            fills_gpu: false,
        }
    }

    /// A whole GPU (`peakfit.io/gpu-share: 1`, a converted `nvidia.com/gpu` request, openb's
    /// `gpu_milli: 1000`): the pod takes a GPU nobody else uses, as it is, so it needs what an
    /// empty GPU offers (its size less the driver's reserve) and no safety margin: there is no
    /// neighbour to keep it from. See `fit::need_on`.
    pub fn is_whole_gpu(&self) -> bool {
        self.fixed_bytes == 0 && self.gpu_fraction >= 1.0
    }

    /// Whether the pod takes all of `gpu`: a whole-GPU pod always; a [`Self::fills_gpu`] pod
    /// where its cached peak and the safety margin do not fit the GPU's usable memory and the
    /// GPU runs it ([`Self::runs_in`]).
    ///
    /// The margin counts here because a pod that shares needs its peak plus the margin
    /// (`fit::need_on`): a peak that fits only without it cannot share the GPU, so it takes the
    /// GPU whole as a larger peak does. Before, only a peak above the usable memory was taken
    /// whole, and a peak within the margin of it was refused by a GPU that took any larger
    /// peak; the refusal protected nobody (the margin is kept for neighbours, and a pod alone
    /// on its GPU has none), and whether the cache stops at its peak or fills the rest, the
    /// GPU is the pod's either way.
    pub fn whole_on(&self, gpu: GpuRoom) -> bool {
        self.is_whole_gpu()
            || (self.cache_floor().is_some()
                && self.fixed_bytes.saturating_add(gpu.margin_bytes) > gpu.usable_bytes
                && self.runs_in(gpu))
    }

    /// Whether `gpu` can host the pod at all, however empty: the one rule for the floor, which
    /// filter, bind, the scoring's fill patterns and the simulator all ask.
    ///
    /// An engine's floor is a GPU size (its budget is a share of the card's total). A
    /// [`Self::fills_gpu`] pod's floor is memory its tensors and process take once the cache is
    /// freed: it has to fit what the driver leaves of the GPU with the safety margin, the room
    /// a whole GPU gives it ([`Self::whole_on`]). Checked against the total instead, a floor
    /// between the two passed this check and was then refused as "not enough memory" naming a
    /// peak no GPU could hold, where the floor was what did not fit.
    pub fn runs_in(&self, gpu: GpuRoom) -> bool {
        match self.cache_floor() {
            Some(floor) => floor.saturating_add(gpu.margin_bytes) <= gpu.usable_bytes,
            None => gpu.total_bytes >= self.min_gpu_total_bytes,
        }
    }

    /// Whether a GPU of this size, all of it usable and no margin kept, can host the pod at
    /// all ([`Self::runs_in`] on [`GpuRoom::bare`]): what the estimate and the simulator ask of
    /// a GPU they know only the size of.
    pub fn runs_on(&self, gpu_total: u64) -> bool {
        self.runs_in(GpuRoom::bare(gpu_total))
    }

    /// The memory a [`Self::fills_gpu`] pod sized in bytes needs once its allocator has freed
    /// its cache (`min_gpu_total_bytes`, memory rather than a GPU size); `None` for any other
    /// pod, whose need is its peak.
    pub fn cache_floor(&self) -> Option<u64> {
        (self.fills_gpu && self.gpu_fraction <= 0.0).then_some(self.min_gpu_total_bytes)
    }

    /// Bytes this demand takes on a GPU of `gpu_total` bytes.
    ///
    /// The fractional share is rounded down: the byte it might lose is far below the safety
    /// margin, while rounding up would make shares that add up to exactly one GPU (0.3 + 0.7,
    /// two halves of an odd size) miss the GPU by one byte.
    pub fn bytes_on(&self, gpu_total: u64) -> u64 {
        if self.gpu_fraction <= 0.0 {
            return if self.fills_gpu {
                self.fixed_bytes.min(gpu_total)
            } else {
                self.fixed_bytes
            };
        }
        let share =
            crate::convert::f64_to_u64((self.gpu_fraction.min(1.0) * gpu_total as f64).floor());
        self.fixed_bytes.saturating_add(share.min(gpu_total))
    }

    /// Bits of every field, so demands can key hash maps (`f64` is not `Eq`).
    fn key(&self) -> (u64, u64, u64, bool) {
        (
            self.fixed_bytes,
            self.gpu_fraction.to_bits(),
            self.min_gpu_total_bytes,
            self.fills_gpu,
        )
    }
}

/// A pod as placement sees it: how many GPUs, and what on each.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodShape {
    pub gpus: u32,
    pub demand: Demand,
}

/// A pod shape plus what else decides which nodes can take it.
///
/// The extender leaves `cpu_milli` at 0 and `gpu_models` empty: kube-scheduler checks CPU
/// itself. The openb simulation fills both, because on that trace CPU runs out before GPUs on
/// many nodes and FGD counts a node that cannot give a shape its CPU, or has the wrong GPU model
/// for it, as all fragment. Scoring the same way is what lets peakfit be compared with FGD.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodClass {
    pub shape: PodShape,
    #[serde(default)]
    pub cpu_milli: u64,
    /// GPU models the pod accepts (matched against `GpuLedger::model`); empty = any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
}

impl Default for PodShape {
    fn default() -> Self {
        Self {
            gpus: 1,
            demand: Demand::default(),
        }
    }
}

impl PodClass {
    pub fn accepts_model(&self, model: &str) -> bool {
        self.gpu_models.is_empty() || self.gpu_models.iter().any(|m| m == model)
    }
}

impl From<PodShape> for PodClass {
    fn from(shape: PodShape) -> Self {
        Self {
            shape,
            cpu_milli: 0,
            gpu_models: Vec::new(),
        }
    }
}

impl Eq for PodClass {}

impl Hash for PodClass {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.shape.gpus.hash(state);
        self.shape.demand.key().hash(state);
        self.cpu_milli.hash(state);
        self.gpu_models.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_scales_with_gpu_size() {
        let d = Demand {
            fixed_bytes: 1 << 30,
            gpu_fraction: 0.5,
            min_gpu_total_bytes: 0,
            fills_gpu: false,
        };
        assert_eq!(d.bytes_on(80 << 30), 41 << 30);
        assert_eq!(d.bytes_on(40 << 30), 21 << 30);
    }

    /// A GPU of `total` GiB whose driver keeps `reserved` GiB, with a margin of `margin` GiB.
    fn room(total: u64, reserved: u64, margin: u64) -> GpuRoom {
        const GI: u64 = 1 << 30;
        GpuRoom {
            total_bytes: total * GI,
            usable_bytes: (total - reserved) * GI,
            margin_bytes: margin * GI,
        }
    }

    /// A PyTorch pod whose cache would reach 250 GiB, on 19 GiB of tensors and process.
    fn outgrowing() -> Demand {
        const GI: u64 = 1 << 30;
        Demand {
            fixed_bytes: 250 * GI,
            gpu_fraction: 0.0,
            min_gpu_total_bytes: 19 * GI,
            fills_gpu: true,
        }
    }

    /// A pod whose cached peak outgrows a GPU but whose tensors fit it takes that GPU whole;
    /// on a GPU its cached peak fits, it takes that peak; below its floor it does not run.
    #[test]
    fn a_cache_that_outgrows_the_gpu_takes_it_whole() {
        const GI: u64 = 1 << 30;
        let d = outgrowing();
        assert_eq!(d.bytes_on(80 * GI), 80 * GI);
        assert!(d.whole_on(room(80, 1, 1)));
        assert!(
            !d.whole_on(room(19, 0, 1)),
            "the floor needs its margin too"
        );
        assert!(
            !d.whole_on(room(18, 0, 0)),
            "below the floor it does not run"
        );
        let fits = Demand {
            fixed_bytes: 40 * GI,
            ..d
        };
        assert_eq!(fits.bytes_on(80 * GI), 40 * GI);
        assert!(!fits.whole_on(room(80, 1, 1)));
        // Its peak and margin fit exactly: it shares.
        assert!(!fits.whole_on(room(42, 1, 1)));
        // Without the flag the cached peak is the need, as for any fixed demand.
        let plain = Demand {
            fills_gpu: false,
            ..d
        };
        assert_eq!(plain.bytes_on(80 * GI), 250 * GI);
        assert!(!plain.whole_on(room(80, 1, 1)));
    }

    /// Whole or shared, never refused for a peak smaller than one the GPU takes whole: a peak
    /// within the margin of the usable memory cannot share the GPU (it needs the margin beside
    /// it), so it takes the GPU whole as a peak above the usable memory does. The old rule
    /// (`fixed_bytes > usable_bytes`) left it neither whole nor fitting.
    #[test]
    fn a_peak_within_the_margin_takes_the_gpu_whole() {
        const GI: u64 = 1 << 30;
        const MI: u64 = 1 << 20;
        let gpu = room(80, 1, 1);
        let with_peak = |fixed| Demand {
            fixed_bytes: fixed,
            ..outgrowing()
        };
        let usable = gpu.usable_bytes;
        for fixed in [
            usable - GI + 1,
            usable - 512 * MI,
            usable,
            usable + 1,
            250 * GI,
        ] {
            let d = with_peak(fixed);
            assert!(d.whole_on(gpu), "{fixed}");
        }
        for fixed in [usable - GI, usable - 2 * GI, 40 * GI] {
            let d = with_peak(fixed);
            assert!(!d.whole_on(gpu), "{fixed}");
            assert!(d.bytes_on(gpu.total_bytes) + gpu.margin_bytes <= usable);
        }
        // Without a margin the boundary is the usable memory itself.
        let bare = GpuRoom::bare(80 * GI);
        assert!(!with_peak(80 * GI).whole_on(bare));
        assert!(with_peak(80 * GI + 1).whole_on(bare));
        // Below its floor a GPU is not taken, however the peak stands.
        assert!(!with_peak(18 * GI + 1).whole_on(room(19, 0, 1)));
    }

    /// One rule for a floor: a PyTorch pod's floor is memory, held against what the driver
    /// leaves with the margin, both where the GPU is asked whether it runs the pod and where it
    /// is asked whether the pod takes it whole; an engine's floor is a GPU size.
    #[test]
    fn a_floor_runs_where_the_gpu_is_taken_whole() {
        const GI: u64 = 1 << 30;
        let d = outgrowing();
        for gpu in [
            room(20, 1, 1),
            room(19, 0, 1),
            room(20, 2, 0),
            room(19, 0, 0),
            room(80, 0, 0),
        ] {
            assert_eq!(d.runs_in(gpu), d.whole_on(gpu), "{gpu:?}");
        }
        // 20 GiB, 1 reserved, 1 margin: the floor fits the total, not the usable with margin.
        assert!(!d.runs_in(room(20, 1, 1)));
        assert!(d.runs_in(room(20, 1, 0)));
        assert!(
            d.runs_on(19 * GI),
            "a bare GPU: all of it usable, no margin"
        );
        // An engine's floor is the card's size, whatever the driver keeps.
        let engine = Demand {
            min_gpu_total_bytes: 40 * GI,
            ..Demand::fraction(0.9)
        };
        assert!(engine.runs_in(room(40, 1, 1)));
        assert!(!engine.runs_in(room(39, 0, 0)));
    }

    #[test]
    fn complementary_shares_fill_a_gpu_exactly() {
        // 15,109 MiB (a T4): 0.3 and 0.7 of it are not whole bytes.
        let total = 15_109u64 << 20;
        for milli in 1..1000u32 {
            let a = Demand::fraction(f64::from(milli) / 1000.0).bytes_on(total);
            let b = Demand::fraction(f64::from(1000 - milli) / 1000.0).bytes_on(total);
            assert!(a + b <= total, "{milli}: {a} + {b} > {total}");
        }
        assert_eq!(Demand::fraction(1.0).bytes_on(total), total);
    }

    #[test]
    fn a_class_hashes_by_value() {
        use std::collections::HashSet;
        let a = PodClass::from(PodShape {
            gpus: 1,
            demand: Demand::fraction(0.5),
        });
        let mut b = a.clone();
        let set: HashSet<_> = [a.clone(), b.clone()].into_iter().collect();
        assert_eq!(set.len(), 1);
        b.cpu_milli = 4000;
        assert_ne!(a, b);
    }
}
