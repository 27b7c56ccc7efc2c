//! What a pod asks of each GPU it lands on.

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
}

impl Demand {
    pub const fn fixed(bytes: u64) -> Self {
        Self {
            fixed_bytes: bytes,
            gpu_fraction: 0.0,
            min_gpu_total_bytes: 0,
        }
    }

    pub const fn fraction(fraction: f64) -> Self {
        Self {
            fixed_bytes: 0,
            gpu_fraction: fraction,
            min_gpu_total_bytes: 0,
        }
    }

    /// Whether a GPU of this size can host the pod at all.
    pub fn runs_on(&self, gpu_total: u64) -> bool {
        gpu_total >= self.min_gpu_total_bytes
    }

    /// Bytes this demand takes on a GPU of `gpu_total` bytes (rounded up: never under-reserve).
    pub fn bytes_on(&self, gpu_total: u64) -> u64 {
        let share = (self.gpu_fraction * gpu_total as f64).ceil() as u64;
        self.fixed_bytes.saturating_add(share)
    }
}

/// A pod as placement sees it: how many GPUs, and what on each.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodShape {
    pub gpus: u32,
    pub demand: Demand,
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
        };
        assert_eq!(d.bytes_on(80 << 30), 41 << 30);
        assert_eq!(d.bytes_on(40 << 30), 21 << 30);
    }
}
