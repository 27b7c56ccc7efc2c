//! peakfit: a Kubernetes scheduler extender that places GPU pods by their predicted peak VRAM.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cluster;
pub mod extender;
pub mod inventory;
pub mod metrics;
pub mod model;
pub mod placement;
pub mod shutdown;
pub mod sim;
pub mod telemetry;
pub mod webhook;
