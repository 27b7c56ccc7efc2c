//! peakfit: a Kubernetes scheduler extender that places GPU pods by their predicted peak VRAM.
//!
//! This crate is the edges: Kubernetes, NVML, HTTP, files and command lines. The arithmetic they
//! all share (the peak-memory model and the placement) is the `peakfit-core` crate, re-exported
//! here under its own module names so that `peakfit::model` and `peakfit::placement` are the same
//! items the core defines.
#![forbid(unsafe_code)]

pub use peakfit_core::{convert, gpu_resources, inventory, learn, model, placement};

pub mod agent;
pub mod background;
pub mod cli;
pub mod clip;
pub mod cluster;
pub mod estimate;
pub mod extender;
pub mod flags;
pub mod metrics;
pub mod recommend;
pub mod serve;
pub mod shutdown;
pub mod sim;
pub mod stdout;
pub mod telemetry;
pub mod webhook;
