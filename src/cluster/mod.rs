//! Kubernetes glue: the CRD type, watches that feed the extender's index, and the binding writer.

pub mod report;

pub use report::{NodeGpuReport, NodeGpuReportSpec};

/// The CRD as YAML, what `peakfit crd` prints and the Helm chart ships (checked in sync by CI).
pub fn crd_yaml() -> anyhow::Result<String> {
    use kube::CustomResourceExt;
    Ok(serde_saphyr::to_string(&NodeGpuReport::crd())?)
}
