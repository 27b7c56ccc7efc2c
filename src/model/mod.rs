//! The peak-memory model: from a pod's `peakfit.io/*` annotations to the VRAM it needs per GPU.
//! Pure: no Kubernetes, no I/O.

pub mod annotations;
pub mod cli;

pub use annotations::{AnnotationError, PREFIX, PodRequest, pod_request};
