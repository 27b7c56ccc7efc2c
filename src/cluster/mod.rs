//! Kubernetes glue: the CRD type, the index the extender answers from, the watches (or the file)
//! that feed it with their readiness gate, and the binding writer. It may not use the extender:
//! the extender reads the index, never the other way round.

pub mod binding;
pub mod events;
pub mod file;
pub mod hold;
pub mod index;
pub mod model_config;
pub mod profile;
pub mod report;
pub mod resources;
#[cfg(test)]
pub(crate) mod test_support;
pub mod watch;
pub mod workload;

pub use profile::{GpuWorkloadProfile, GpuWorkloadProfileSpec};
pub use report::{NodeGpuReport, NodeGpuReportSpec};

/// The `NodeGpuReport` CRD as YAML, as the Helm chart ships it (checked in sync by CI).
pub fn crd_yaml() -> anyhow::Result<String> {
    Ok(serde_saphyr::to_string(&report::crd())?)
}

/// The `GpuWorkloadProfile` CRD as YAML, as the Helm chart ships it.
pub fn profile_crd_yaml() -> anyhow::Result<String> {
    Ok(serde_saphyr::to_string(&profile::crd())?)
}

/// Every CRD, what `peakfit crd` prints: one YAML document each.
pub fn all_crds_yaml() -> anyhow::Result<String> {
    Ok(format!("{}---\n{}", crd_yaml()?, profile_crd_yaml()?))
}
