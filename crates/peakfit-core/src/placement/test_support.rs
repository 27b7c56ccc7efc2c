//! Small builders shared by the placement tests: GPUs of 1000 bytes, so a share in thousandths (the
//! openb trace's `gpu_milli`) is also a byte count and the arithmetic in assertions stays readable.

use super::{Demand, GpuLedger, NodeLedger, PodClass, PodShape};

/// A pod asking `milli`/1000 of each of `gpus` GPUs.
pub fn share(milli: u32, gpus: u32) -> PodClass {
    PodClass::from(PodShape {
        gpus,
        demand: Demand::fraction(f64::from(milli) / 1000.0),
    })
}

/// A node of 1000-byte GPUs with the given free bytes (a full-free GPU holds no reservation).
pub fn node(free: &[u64]) -> NodeLedger {
    let mut n = NodeLedger::with_gpus(
        "n",
        (0..free.len())
            .map(|i| GpuLedger::new(format!("g{i}"), 1000))
            .collect(),
    );
    for (i, &f) in free.iter().enumerate() {
        if f < 1000 {
            n.reserve(&format!("p{i}"), &[i], &[1000 - f]);
        }
    }
    n
}
