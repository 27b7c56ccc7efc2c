//! peakfit's pure core: what a pod needs (the peak-memory model, corrected by what its workload
//! was seen to use: `learn`) and where it fits (the placement).
//!
//! Everything here is a function of its arguments. It may not touch Kubernetes (no kube,
//! k8s-openapi), async runtimes (tokio), command lines (clap), HTTP (axum) or files: the
//! `peakfit` crate owns all of that and calls in here. Cargo enforces the first four through this
//! crate's dependency list, so the extender, the simulator and `peakfit estimate` provably run the
//! same arithmetic on the same inputs.
#![forbid(unsafe_code)]

pub mod convert;
pub mod gpu_resources;
pub mod inventory;
pub mod learn;
pub mod model;
pub mod placement;
