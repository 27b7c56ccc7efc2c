//! The peak-memory model: from a pod's `peakfit.io/*` annotations to the VRAM it needs per GPU.
//! Pure: no Kubernetes, no I/O.

pub mod annotations;
pub mod cli;
pub mod estimate;
pub mod presets;
pub mod quantity;

pub use annotations::{AnnotationError, PREFIX, PodRequest, Spec, pod_request};
pub use estimate::{Estimate, estimate};
