//! Reading a pod's `peakfit.io/*` annotations. (Interim: explicit `vram` and `gpus` only; the
//! model-backed parser replaces this.)

use std::collections::BTreeMap;

use crate::placement::{Demand, PodShape};

pub const PREFIX: &str = "peakfit.io/";

/// A refused annotation: which one, what it said, and what would have been accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {PREFIX}{key}: {value:?} is not valid: {allowed}")]
pub struct AnnotationError {
    pub key: String,
    pub value: String,
    pub allowed: String,
}

/// What a pod asks of the scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct PodRequest {
    pub gpus: u32,
    pub demand: Demand,
    /// For engines that budget a fraction of the GPU: the fraction they should be told to use.
    pub engine_fraction: Option<f64>,
}

impl PodRequest {
    pub fn shape(&self) -> PodShape {
        PodShape {
            gpus: self.gpus,
            demand: self.demand,
        }
    }
}

/// `Ok(None)` for a pod with no peakfit input annotation: it passes through untouched.
pub fn pod_request(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<PodRequest>, AnnotationError> {
    let get = |k: &str| annotations.get(&format!("{PREFIX}{k}"));
    let Some(vram) = get("vram") else {
        return Ok(None);
    };
    let bytes = vram
        .trim_end_matches("Gi")
        .parse::<u64>()
        .map_err(|_| AnnotationError {
            key: "vram".into(),
            value: vram.clone(),
            allowed: "a Kubernetes quantity such as 20Gi".into(),
        })?
        << 30;
    let gpus = match get("gpus") {
        Some(v) => v.parse().map_err(|_| AnnotationError {
            key: "gpus".into(),
            value: v.clone(),
            allowed: "a whole number from 1 to 16".into(),
        })?,
        None => 1,
    };
    Ok(Some(PodRequest {
        gpus,
        demand: Demand::fixed(bytes),
        engine_fraction: None,
    }))
}
