//! The peak-memory model: from a pod's `peakfit.io/*` annotations to the VRAM it needs per GPU.
//! Pure: no Kubernetes, no I/O (the crate cannot depend on either). `peakfit estimate`, the CLI
//! around it, lives in the `peakfit` crate (`src/estimate.rs`).

pub mod annotations;
pub mod confidence;
pub mod estimate;
pub mod hf_config;
pub mod presets;
pub mod quantity;

pub use annotations::{AnnotationError, PREFIX, PodRequest, Spec, pod_request};
pub use estimate::{Estimate, estimate};
