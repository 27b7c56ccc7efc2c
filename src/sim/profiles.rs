//! How a pod's GPU memory use moves over its life, as a fraction of its peak.
//!
//! Real curves come from Alibaba GenTD26 (`pod_gpu_memory_used_bytes_anon`: 144 Stable Diffusion
//! serving pods, one sample a minute for about 23 hours): use ramps up after start and bursts,
//! the peak a median 1.55 × the median. Generated curves stand in for LLM serving (an engine that
//! reserves its budget at start, or a plain framework whose KV cache grows) and training (fast
//! ramp to a steady level with periodic spikes at the peak).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use rand::Rng;

use super::openb::TraceError;

/// A use curve sampled once a minute, each value a fraction of the pod's peak (max = 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub minutes: Vec<f64>,
}

impl Profile {
    /// Fraction of the peak in use `minute` minutes after start (the last value holds after the
    /// curve ends).
    pub fn at(&self, minute: usize) -> f64 {
        self.minutes
            .get(minute)
            .or(self.minutes.last())
            .copied()
            .unwrap_or(1.0)
    }

    /// The highest fraction reached in the first `minutes` minutes (a pod that runs shorter
    /// than its curve never meets the rest of it).
    pub fn peak_within(&self, minutes: usize) -> f64 {
        if self.minutes.is_empty() {
            return 1.0;
        }
        self.minutes
            .iter()
            .take(minutes.max(1))
            .copied()
            .fold(0.0, f64::max)
    }

    /// The median of the curve (what a dashboard shows as "typical use").
    pub fn median(&self) -> f64 {
        let mut v = self.minutes.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(1.0)
    }

    fn normalised(values: Vec<f64>) -> Option<Self> {
        let peak = values.iter().copied().fold(0.0, f64::max);
        (peak > 0.0).then(|| Self {
            minutes: values.into_iter().map(|v| v / peak).collect(),
        })
    }
}

/// Reads every pod's curve from the GenTD26 tarball (one CSV inside: `timestamp_anon, value,
/// container_ip`). Pods with fewer than `min_samples` samples are dropped; gaps are bridged by
/// holding the last value.
pub fn load_tarball(path: &Path, min_samples: usize) -> Result<Vec<Profile>, TraceError> {
    Ok(load_tarball_peaks(path, min_samples)?
        .into_iter()
        .map(|(p, _)| p)
        .collect())
}

/// `load_tarball`, each curve with its peak in bytes (what the fractions are of).
pub fn load_tarball_peaks(
    path: &Path,
    min_samples: usize,
) -> Result<Vec<(Profile, f64)>, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut text = String::new();
    for entry in archive.entries().map_err(io)? {
        let mut entry = entry.map_err(io)?;
        let is_csv = entry
            .path()
            .is_ok_and(|p| p.extension().is_some_and(|e| e == "csv"));
        if is_csv {
            entry.read_to_string(&mut text).map_err(io)?;
            break;
        }
    }
    parse_csv(path, text.as_bytes(), min_samples)
}

fn parse_csv(
    path: &Path,
    bytes: &[u8],
    min_samples: usize,
) -> Result<Vec<(Profile, f64)>, TraceError> {
    let mut rdr = csv::Reader::from_reader(bytes);
    let mut by_pod: HashMap<String, Vec<(f64, f64)>> = HashMap::new();
    for row in rdr.records() {
        let row = row.map_err(|source| TraceError::Csv {
            path: path.to_owned(),
            source,
        })?;
        let (Some(t), Some(v), Some(pod)) = (
            row.get(0).and_then(|x| x.parse::<f64>().ok()),
            row.get(1).and_then(|x| x.parse::<f64>().ok()),
            row.get(2),
        ) else {
            continue;
        };
        by_pod.entry(pod.to_owned()).or_default().push((t, v));
    }
    let mut pods: Vec<(String, Vec<(f64, f64)>)> = by_pod.into_iter().collect();
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (_, mut samples) in pods {
        if samples.len() < min_samples {
            continue;
        }
        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
        let start = samples[0].0;
        let mut minutes: Vec<f64> = Vec::new();
        for (t, v) in samples {
            let m = crate::convert::f64_to_usize(((t - start) / 60.0).round());
            while minutes.len() < m {
                let last = minutes.last().copied().unwrap_or(v);
                minutes.push(last);
            }
            if minutes.len() == m {
                minutes.push(v);
            }
        }
        let peak = minutes.iter().copied().fold(0.0, f64::max);
        if let Some(p) = Profile::normalised(minutes) {
            out.push((p, peak));
        }
    }
    Ok(out)
}

/// Which generated curve a pod follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A serving engine that takes its whole budget at start (vLLM, TGI, SGLang).
    EngineServing,
    /// Plain-framework serving: weights, then a KV cache that grows with traffic and bursts.
    Serving,
    /// Training or fine-tuning: a ramp over the first steps, then steady with spikes at the peak.
    Training,
}

/// A generated curve of `minutes` length; serving curves are shaped so that the peak is about
/// 1.3–2 × the median, as in the real serving trace.
pub fn generate(kind: Kind, minutes: usize, rng: &mut impl Rng) -> Profile {
    let minutes = minutes.max(1);
    let mut v = Vec::with_capacity(minutes);
    match kind {
        Kind::EngineServing => {
            let load = rng.random_range(1..4);
            for m in 0..minutes {
                v.push(if m < load {
                    0.3
                } else {
                    rng.random_range(0.97..1.0)
                });
            }
        }
        Kind::Serving => {
            let base = rng.random_range(0.35..0.55);
            let ramp = f64::from(rng.random_range(5..60));
            for m in 0..minutes {
                let grow = (m as f64 / ramp).min(1.0);
                let level = base + (0.62 - base) * grow;
                let burst = if rng.random_bool(0.04) {
                    rng.random_range(0.2..0.4)
                } else {
                    0.0
                };
                v.push((level + rng.random_range(-0.03..0.03) + burst).clamp(0.05, 1.0));
            }
        }
        Kind::Training => {
            let steady = rng.random_range(0.85..0.95);
            for m in 0..minutes {
                let ramp = ((m + 1) as f64 / 3.0).min(1.0);
                let spike = if m % 10 == 9 { 1.0 } else { steady };
                v.push((spike * ramp).max(0.1));
            }
        }
    }
    // Every curve reaches its peak at least once.
    if let Some(last) = v.last_mut() {
        if kind == Kind::EngineServing {
            *last = last.max(0.97);
        } else {
            let i = minutes / 2;
            v[i] = 1.0;
        }
    }
    Profile::normalised(v).unwrap_or(Profile { minutes: vec![1.0] })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn csv_curves_are_per_pod_fractions_of_the_peak() {
        let csv = "timestamp_anon,value,container_ip\n0,10,a\n60,20,a\n180,40,a\n0,5,b\n";
        let p = parse_csv(Path::new("x"), csv.as_bytes(), 2).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0.minutes, vec![0.25, 0.5, 0.5, 1.0]);
        assert_eq!(p[0].0.at(99), 1.0);
        assert_eq!(p[0].1, 40.0);
        assert_eq!(p[0].0.peak_within(2), 0.5);
        assert_eq!(p[0].0.peak_within(9), 1.0);
    }

    #[test]
    fn generated_serving_curves_peak_well_above_their_median() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let p = generate(Kind::Serving, 600, &mut rng);
        let ratio = 1.0 / p.median();
        assert!((1.3..2.2).contains(&ratio), "peak/median {ratio}");
        let t = generate(Kind::Training, 60, &mut rng);
        assert!(t.minutes.iter().all(|&x| x <= 1.0));
        assert_eq!(t.minutes.iter().copied().fold(0.0, f64::max), 1.0);
    }

    #[test]
    #[ignore = "needs ../shared/data"]
    fn the_real_tarball_has_serving_pods_that_grow() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/data/usage-profiles/pod_gpu_memory_used_bytes_anon.tar.gz");
        assert!(path.is_file(), "{} not found", path.display());
        let profiles = load_tarball(&path, 60).unwrap();
        assert!(profiles.len() > 100, "{}", profiles.len());
        let mut ratios: Vec<f64> = profiles.iter().map(|p| 1.0 / p.median()).collect();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        assert!((1.3..1.8).contains(&median), "median peak/median {median}");
    }
}
