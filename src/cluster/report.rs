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

/// The CRD `peakfit crd` prints and the chart ships: schemars' schema, less the `format`s
/// Kubernetes does not know (`uint64`, `uint32`, …, from Rust's unsigned integers), which make
/// `kubectl apply` warn `unrecognized format` on every field. The type (`integer`) stays.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    known_formats_only(&NodeGpuReport::crd())
}

/// `crd` less the `format`s Kubernetes does not know (shared with the profile CRD).
pub(crate) fn known_formats_only(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let mut value = serde_json::to_value(crd).expect("a CRD serialises to JSON");
    strip_unknown_formats(&mut value);
    serde_json::from_value(value).expect("stripping formats keeps a valid CRD")
}

/// The formats the API server's `OpenAPI` validation knows for integers and numbers.
const KNOWN_NUMBER_FORMATS: &[&str] = &["int32", "int64", "float", "double"];

fn strip_unknown_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            let numeric = matches!(
                m.get("type").and_then(|t| t.as_str()),
                Some("integer" | "number")
            );
            if numeric
                && m.get("format")
                    .and_then(|f| f.as_str())
                    .is_some_and(|f| !KNOWN_NUMBER_FORMATS.contains(&f))
            {
                m.remove("format");
            }
            m.values_mut().for_each(strip_unknown_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_unknown_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_crd_has_no_format_kubernetes_does_not_know() {
        let text = serde_json::to_string(&super::crd()).unwrap();
        assert!(!text.contains("uint"), "{text}");
        // The integer fields are still integers.
        assert!(text.contains(r#""type":"integer""#));
    }
}
