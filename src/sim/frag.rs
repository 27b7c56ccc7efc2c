//! FGD's fragmentation measure (Weng et al., ATC'23), as the authors' simulator computes it.
//!
//! For a "typical" pod shape m and a node: if m is CPU-only, or its GPU type excludes the node,
//! or it does not fit (GPU count or CPU), all idle GPU milli of the node is fragment; otherwise
//! the fragment is the free milli on GPUs whose free milli is below m's per-GPU request.
//! `F_n = Σ_m p_m · frag_n(m)`. Each node keeps, per shape, the two numbers the formula needs
//! (`fitting` GPUs and `small_free` milli), so the effect of a placement is O(shapes).

use std::collections::HashMap;

use super::openb::PodSpec;

/// The requests the shapes are keyed on (the authors' `PodResource`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShapeKey {
    /// Non-zero CPU request: kube-scheduler counts a pod without one as 100 millicores.
    pub cpu_milli: i64,
    pub gpu_milli: u32,
    pub num_gpu: u32,
    pub gpu_spec: String,
}

impl ShapeKey {
    pub fn of(pod: &PodSpec) -> Self {
        Self {
            cpu_milli: nonzero_cpu(pod.cpu_milli),
            gpu_milli: pod.gpu_milli,
            num_gpu: pod.num_gpu,
            gpu_spec: pod.gpu_spec.clone(),
        }
    }
}

pub fn nonzero_cpu(cpu_milli: u64) -> i64 {
    if cpu_milli == 0 {
        100
    } else {
        crate::convert::u64_to_i64(cpu_milli)
    }
}

/// A typical shape with its renormalised frequency and, per GPU model index, whether it may
/// run there.
#[derive(Clone, Debug)]
pub struct Shape {
    pub key: ShapeKey,
    pub p: f64,
    pub allowed_models: Vec<bool>,
}

/// The most frequent shapes covering `coverage` of the pods (taken one at a time, the artifact's
/// `--pod-increase-step` default), with frequencies renormalised to sum to 1.
pub fn typical_shapes<'a>(
    pods: impl IntoIterator<Item = &'a PodSpec>,
    models: &[String],
    coverage: f64,
) -> Vec<Shape> {
    let mut counts: HashMap<ShapeKey, (f64, &'a PodSpec)> = HashMap::new();
    let mut total = 0.0;
    for pod in pods {
        counts.entry(ShapeKey::of(pod)).or_insert((0.0, pod)).0 += 1.0;
        total += 1.0;
    }
    let mut list: Vec<(ShapeKey, f64, &PodSpec)> =
        counts.into_iter().map(|(k, (c, p))| (k, c, p)).collect();
    // Decreasing count; equal counts by decreasing (cpu, gpu milli, gpu count, type).
    list.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let mut taken = 0;
    let mut cum = 0.0;
    while cum < coverage * total && taken < list.len() {
        let stop = taken + 1;
        cum += list[taken..stop].iter().map(|s| s.1).sum::<f64>();
        taken = stop;
    }
    list.truncate(taken);
    list.into_iter()
        .map(|(key, count, pod)| Shape {
            p: count / cum,
            allowed_models: models.iter().map(|m| pod.allows_model(m)).collect(),
            key,
        })
        .collect()
}

/// Per node and shape: how many GPUs have at least the shape's per-GPU request free, and the
/// free milli on the GPUs that have less.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShapeStat {
    pub fitting: u32,
    pub small_free: u64,
}

/// A change of one GPU's free milli.
#[derive(Clone, Copy, Debug)]
pub struct GpuChange {
    pub before: u32,
    pub after: u32,
}

pub fn stats_of(gpu_free: &[u32], shapes: &[Shape]) -> Vec<ShapeStat> {
    shapes
        .iter()
        .map(|s| {
            let r = s.key.gpu_milli;
            let mut st = ShapeStat::default();
            for &f in gpu_free {
                if f >= r {
                    st.fitting += 1;
                } else {
                    st.small_free += u64::from(f);
                }
            }
            st
        })
        .collect()
}

/// `F_n` of a node in milli-GPU, after `changes` to its GPUs and with `cpu_left` CPU free.
pub fn node_frag(
    shapes: &[Shape],
    stats: &[ShapeStat],
    model: usize,
    cpu_left: i64,
    total_free: u64,
    changes: &[GpuChange],
) -> f64 {
    let mut frag = 0.0;
    for (s, st) in shapes.iter().zip(stats) {
        let k = &s.key;
        let whole = if k.gpu_milli == 0 || !s.allowed_models[model] || cpu_left < k.cpu_milli {
            true
        } else {
            let r = k.gpu_milli;
            let mut fitting = st.fitting;
            let mut small = st.small_free;
            for c in changes {
                if c.before >= r {
                    fitting -= 1;
                } else {
                    small -= u64::from(c.before);
                }
                if c.after >= r {
                    fitting += 1;
                } else {
                    small += u64::from(c.after);
                }
            }
            if fitting >= k.num_gpu {
                frag += s.p * small as f64;
                false
            } else {
                true
            }
        };
        if whole {
            frag += s.p * total_free as f64;
        }
    }
    frag
}

/// Applies `changes` to cached stats.
pub fn apply_changes(stats: &mut [ShapeStat], shapes: &[Shape], changes: &[GpuChange]) {
    for (s, st) in shapes.iter().zip(stats) {
        let r = s.key.gpu_milli;
        for c in changes {
            if c.before >= r {
                st.fitting -= 1;
            } else {
                st.small_free -= u64::from(c.before);
            }
            if c.after >= r {
                st.fitting += 1;
            } else {
                st.small_free += u64::from(c.after);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(cpu: i64, milli: u32, n: u32, p: f64) -> Shape {
        Shape {
            key: ShapeKey {
                cpu_milli: cpu,
                gpu_milli: milli,
                num_gpu: n,
                gpu_spec: String::new(),
            },
            p,
            allowed_models: vec![true],
        }
    }

    #[test]
    fn fragment_follows_the_papers_cases() {
        let shapes = vec![shape(1000, 500, 1, 0.5), shape(1000, 1000, 2, 0.5)];
        let free = [300, 1000, 600, 0];
        let stats = stats_of(&free, &shapes);
        // Half-GPU pods fit: the 300 is fragment. Two-GPU pods do not fit: all 1900 is.
        let f = node_frag(&shapes, &stats, 0, 8000, 1900, &[]);
        assert!((f - (0.5 * 300.0 + 0.5 * 1900.0)).abs() < 1e-9);
        // Too little CPU: everything is fragment for both.
        let f = node_frag(&shapes, &stats, 0, 500, 1900, &[]);
        assert!((f - 1900.0).abs() < 1e-9);
        // Placing 500 on the 600 GPU leaves 100: the incremental answer equals a recount.
        let change = [GpuChange {
            before: 600,
            after: 100,
        }];
        let inc = node_frag(&shapes, &stats, 0, 8000, 1400, &change);
        let fresh = stats_of(&[300, 1000, 100, 0], &shapes);
        let full = node_frag(&shapes, &fresh, 0, 8000, 1400, &[]);
        assert!((inc - full).abs() < 1e-9);
        let mut st = stats;
        apply_changes(&mut st, &shapes, &change);
        assert_eq!(st, fresh);
    }

    #[test]
    fn typical_shapes_cover_the_share_and_renormalise() {
        let mk = |cpu: u64, milli: u32| PodSpec {
            name: String::new(),
            cpu_milli: cpu,
            memory_mib: 0,
            num_gpu: u32::from(milli > 0),
            gpu_milli: milli,
            gpu_spec: String::new(),
        };
        let mut pods = Vec::new();
        for i in 0..30u64 {
            for _ in 0..(30 - i) {
                pods.push(mk(1000 * (i + 1), 500));
            }
        }
        let shapes = typical_shapes(&pods, &["T4".into()], 0.95);
        // 30 shapes with counts 30, 29, ...: the first k cover 95 % of 465 pods at k = 24.
        assert_eq!(shapes.len(), 24);
        let sum: f64 = shapes.iter().map(|s| s.p).sum();
        assert!((sum - 1.0).abs() < 1e-9);
        assert!(shapes[0].p >= shapes[1].p);
    }
}
