//! What a simulated pod really peaks at, against the model's prediction, drawn from measurements
//! rather than chosen: the model's error on the pod's workload (one draw per workload and seed,
//! shared by every pod of it, since a model that is wrong on a workload is wrong the same way on
//! each replica) times the pod's own share of its workload's highest peak (serving pods under
//! different traffic peak at different levels).
//!
//! Both tables are numbers derived from data outside this crate; the tests that hold them to it
//! are `tests/estimate_h200.rs` (the errors, against today's model) and an ignored test here (the
//! spread, against the GenTD26 tarball in `../shared/data/usage-profiles`).

use rand::Rng;

/// Measured NVML peak ÷ the model's per-GPU prediction for every H200 row in `tests/data/h200`
/// (a copy of `../shared/data/gpu-measurements`), by the row's `workload` column. Above 1 the
/// model is low on that row. These are in-sample: issue 20 fitted the model to these rows, so a
/// workload the model has not seen is likely further off; they are the only NVML peaks measured
/// against a known configuration that this project has.
pub const H200_NVML_RATIOS: [(&str, &str, f64); 20] = [
    ("h200-llama31-8b-b1-4k", "inference", 0.9979),
    ("h200-llama31-8b-b16-2k", "inference", 0.9826),
    ("h200-qwen25-7b-b4-8k", "inference", 0.9987),
    ("h200-mistral-7b-b8-4k", "inference", 0.9881),
    ("h200-gemma2-9b-b2-4k", "inference", 0.9824),
    ("h200-phi3-mini-b4-4k", "inference", 0.9780),
    ("h200-qwen3-1.7b-b32-2k", "inference", 0.9346),
    ("h200-llama32-3b-b1-32k", "inference", 0.9976),
    ("h200-qwen3-8b-b8-4k", "inference", 0.9911),
    ("h200-bert-large-b256-512", "inference", 0.9433),
    ("h200-whisper-large-v3-b16", "inference", 1.0036),
    ("h200-qwen25-0.5b-ft-b8-1k", "training", 0.9994),
    ("h200-qwen25-0.5b-ft-b8-1k-gc", "training", 1.0396),
    ("h200-llama32-1b-ft-bf16-b4-2k-gc", "training", 1.0000),
    ("h200-qwen3-1.7b-ft-b4-2k-gc", "training", 1.0055),
    ("h200-llama31-8b-lora16-b4-2k-gc", "lora", 1.0055),
    ("h200-qwen25-7b-lora16-b2-4k", "lora", 1.0020),
    ("h200-mistral-7b-lora64-b8-1k-gc", "lora", 0.9814),
    ("h200-qwen3-30b-a3b-b2-2k", "inference", 0.9970),
    ("h200-llama32-1b-b128-1k", "inference", 0.9560),
];

/// A serving pod's trace peak ÷ the highest of the trace, at 0 %, 5 %, … 100 % (nearest rank),
/// over the 110 GenTD26 pods with at least 600 one-minute samples (10 h: long enough to have met
/// the day's load; shorter-lived pods' peaks understate theirs), as `profiles::load_tarball_peaks`
/// reads them. The trace's pods are anonymised,
/// so this treats them as replicas of one service: 107 of the 110 peak at 31–47 GiB, three at
/// 17–19 GiB.
pub const SERVING_PEAK_SPREAD: [f64; 21] = [
    0.368, 0.667, 0.691, 0.710, 0.732, 0.735, 0.744, 0.765, 0.784, 0.789, 0.810, 0.831, 0.837,
    0.854, 0.868, 0.885, 0.914, 0.930, 0.956, 0.982, 1.0,
];

/// One workload's model error (measured ÷ predicted) drawn from the H200 rows of its `workload`
/// annotation (`inference`, `training`, `lora`); 1 where no row measures that kind of workload
/// (a serving engine takes the budget it is told, which is what the model predicts).
pub fn draw_workload_error(workload: &str, rng: &mut impl Rng) -> f64 {
    let rows: Vec<f64> = H200_NVML_RATIOS
        .iter()
        .filter(|r| r.1 == workload)
        .map(|r| r.2)
        .collect();
    if rows.is_empty() {
        return 1.0;
    }
    rows[rng.random_range(0..rows.len())]
}

/// A serving pod's peak as a share of its workload's highest, at quantile `u` in `[0, 1)` of
/// `SERVING_PEAK_SPREAD` (linear between its points).
pub fn serving_spread(u: f64) -> f64 {
    let steps = (SERVING_PEAK_SPREAD.len() - 1) as f64;
    let x = u.clamp(0.0, 1.0) * steps;
    let i = crate::convert::f64_to_usize(x.floor()).min(SERVING_PEAK_SPREAD.len() - 2);
    let t = x - i as f64;
    SERVING_PEAK_SPREAD[i] + t * (SERVING_PEAK_SPREAD[i + 1] - SERVING_PEAK_SPREAD[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn errors_are_drawn_from_the_rows_of_the_workload_only() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let lora: Vec<f64> = H200_NVML_RATIOS
            .iter()
            .filter(|r| r.1 == "lora")
            .map(|r| r.2)
            .collect();
        for _ in 0..50 {
            assert!(lora.contains(&draw_workload_error("lora", &mut rng)));
        }
        assert_eq!(draw_workload_error("vllm-engine", &mut rng), 1.0);
        // Both directions exist among the rows.
        assert!(H200_NVML_RATIOS.iter().any(|r| r.2 > 1.0));
        assert!(H200_NVML_RATIOS.iter().any(|r| r.2 < 1.0));
    }

    #[test]
    fn the_spread_interpolates_its_quantiles() {
        assert_eq!(serving_spread(0.0), 0.368);
        assert_eq!(serving_spread(1.0), 1.0);
        assert!((serving_spread(0.5) - 0.810).abs() < 1e-12);
        assert!((serving_spread(0.525) - 0.8205).abs() < 1e-9);
        assert!(
            SERVING_PEAK_SPREAD.windows(2).all(|w| w[0] <= w[1]),
            "quantiles ascend"
        );
    }

    #[test]
    #[ignore = "needs ../shared/data"]
    fn the_spread_is_the_tarballs() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/data/usage-profiles/pod_gpu_memory_used_bytes_anon.tar.gz");
        assert!(path.is_file(), "{} not found", path.display());
        let mut peaks: Vec<f64> = super::super::profiles::load_tarball_peaks(&path, 600)
            .unwrap()
            .into_iter()
            .map(|(_, peak)| peak)
            .collect();
        peaks.sort_by(f64::total_cmp);
        assert_eq!(peaks.len(), 110);
        let top = peaks[peaks.len() - 1];
        let got: Vec<f64> = (0..SERVING_PEAK_SPREAD.len())
            .map(|i| {
                let p = i as f64 / 20.0;
                let rank = crate::convert::f64_to_usize((p * peaks.len() as f64).ceil())
                    .clamp(1, peaks.len());
                peaks[rank - 1] / top
            })
            .collect();
        let text: Vec<String> = got.iter().map(|g| format!("{g:.3}")).collect();
        for (g, q) in got.iter().zip(SERVING_PEAK_SPREAD) {
            assert!(
                (g - q).abs() < 0.0005,
                "the tarball's: [{}]",
                text.join(", ")
            );
        }
    }
}
