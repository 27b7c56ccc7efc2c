//! Kubernetes glue: the CRD type, the index the extender answers from, the watches (or the file)
//! that feed it with their readiness gate, and the binding writer. It may not use the extender:
//! the extender reads the index, never the other way round.

pub mod binding;
pub mod file;
pub mod index;
pub mod model_config;
pub mod report;
pub mod resources;
#[cfg(test)]
pub(crate) mod test_support;
pub mod watch;
pub mod workload;

pub use report::{NodeGpuReport, NodeGpuReportSpec};

/// The CRD as YAML, what `peakfit crd` prints and the Helm chart ships (checked in sync by CI).
pub fn crd_yaml() -> anyhow::Result<String> {
    Ok(serde_saphyr::to_string(&report::crd())?)
}
