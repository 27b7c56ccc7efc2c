//! The `NodeGpuReport` custom resource: one per node, named after the node, written by the agent.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::inventory::NodeGpuReportStatus;

/// Cluster-scoped because a node is; the name equals the node's name so the extender can join the
/// two without a label query.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "peakfit.io",
    version = "v1alpha1",
    kind = "NodeGpuReport",
    plural = "nodegpureports",
    shortname = "ngr",
    status = "NodeGpuReportStatus",
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.summary.totalBytes","description":"total GPU memory (bytes)"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.summary.freeBytes"}"#,
    printcolumn = r#"{"name":"NVML","type":"boolean","jsonPath":".status.nvml.up"}"#,
    printcolumn = r#"{"name":"Observed","type":"string","jsonPath":".status.observedAt"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpuReportSpec {
    /// The node this report describes (equal to `metadata.name`).
    pub node_name: String,
}
