//! The `GpuWorkloadProfile` custom resource (issue 21, item 3): what one workload's pods were seen
//! to use, written by the extender's profile leader and read back by every extender, so that the
//! next replica of a Deployment, the next run of a Job, is sized from what the last ones used
//! rather than from the model alone, across extender restarts and failovers.
//!
//! One object per workload ([`crate::cluster::workload::WorkloadKey`]), in the workload's
//! namespace. The spec names the workload; the status holds the numbers. Kept small and bounded:
//! every running pod is listed (up to `store::MAX_LIVE_RECORDS`) and at most [`MAX_POD_RECORDS`]
//! in all once they stop; the rest live on in the lifetime figures.

pub mod leader;
pub mod store;
pub mod writer;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::workload::WorkloadKey;

/// Namespaced because a workload is; the name is [`profile_name`] of its key.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "peakfit.io",
    version = "v1alpha1",
    kind = "GpuWorkloadProfile",
    plural = "gpuworkloadprofiles",
    shortname = "gwp",
    namespaced,
    status = "GpuWorkloadProfileStatus",
    printcolumn = r#"{"name":"Predicted","type":"string","jsonPath":".status.summary.predicted","description":"the model's per-GPU peak"}"#,
    printcolumn = r#"{"name":"Observed","type":"string","jsonPath":".status.summary.observed","description":"highest per-GPU peak of any pod"}"#,
    printcolumn = r#"{"name":"Recommended","type":"string","jsonPath":".status.summary.recommended","description":"peakfit.io/vram to annotate"}"#,
    printcolumn = r#"{"name":"Pods","type":"integer","jsonPath":".status.podsSeen"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuWorkloadProfileSpec {
    /// What made the pods: `Deployment`, `CronJob`, `StatefulSet`, `LeaderWorkerSet`, `Job`,
    /// `ReplicaSet`, `Pod`, or `Workload` for `peakfit.io/workload-name`.
    pub workload_kind: String,
    pub workload_name: String,
    /// Hash of the pods' `peakfit.io/*` inputs: a changed input is another workload.
    pub inputs: String,
}

/// The numbers, per GPU. Lifetime figures (`podsSeen`, `observedPeakBytes`, `gpuHours`) outlive
/// the pods listed; p95 and the trusted counts are over the listed pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuWorkloadProfileStatus {
    /// The model's per-GPU peak for the newest pod (0 for a fraction engine).
    pub predicted_bytes: u64,
    /// Whether the pods state `peakfit.io/vram` themselves (then `--learn all` is needed to
    /// size them from what they used).
    #[serde(default)]
    pub explicit: bool,
    /// The highest per-GPU peak any pod of the workload reached.
    pub observed_peak_bytes: u64,
    /// The 95th percentile of the listed pods' per-GPU peaks.
    pub observed_p95_bytes: u64,
    /// Pods with at least one observation, over the profile's life.
    pub pods_seen: u32,
    /// GPU-hours the observed pods ran (their GPUs × the time they were seen running).
    pub gpu_hours: f64,
    /// RFC 3339.
    pub first_seen: String,
    pub last_seen: String,
    /// (observed peak − predicted) / predicted: how far the model was off (positive: it
    /// predicted too little). Absent with nothing predicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_error: Option<f64>,
    /// What to annotate as `peakfit.io/vram`: the observed peak × (1 + `--learn-margin`).
    pub recommended_bytes: u64,
    /// The human-readable figures `kubectl get` prints.
    pub summary: ProfileSummary,
    /// The most recent pods, at most [`MAX_POD_RECORDS`], newest last.
    #[serde(default)]
    pub pods: Vec<PodRecord>,
}

/// `kubectl get gpuworkloadprofiles`' columns, in GiB.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileSummary {
    pub predicted: String,
    pub observed: String,
    pub recommended: String,
}

/// One pod of the workload as it was seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub uid: String,
    pub name: String,
    /// Highest per-GPU peak of the pod (the agent's `podPeaks`).
    pub peak_bytes: u64,
    pub gpus: u32,
    /// When it started running (RFC 3339), and when it was last seen running.
    pub started: String,
    pub last_seen: String,
}

/// Pods listed per profile: enough for a p95 and the trusted counts; about 150 bytes each.
pub const MAX_POD_RECORDS: usize = 64;

/// The object name of a workload's profile: `<kind>-<name>-<inputs>`, lower-case, characters a
/// DNS subdomain does not allow replaced by `-`, the name cut so that the whole fits 253.
pub fn profile_name(key: &WorkloadKey) -> String {
    const MAX: usize = 253;
    let inputs: String = key
        .inputs
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect::<String>()
        .to_ascii_lowercase();
    let mut stem: String = format!("{}-{}", key.kind, key.name)
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    stem.truncate(MAX - inputs.len() - 1);
    let stem = stem.trim_matches(|c: char| c == '-' || c == '.');
    format!("{stem}-{inputs}")
}

/// `x.y GiB` as `kubectl get` and the texts print it.
pub fn gib(bytes: u64) -> String {
    format!("{:.1}Gi", bytes as f64 / f64::from(1u32 << 30))
}

impl GpuWorkloadProfile {
    /// The workload this profile describes.
    pub fn key(&self) -> WorkloadKey {
        WorkloadKey {
            namespace: self.metadata.namespace.clone().unwrap_or_default(),
            kind: self.spec.workload_kind.clone(),
            name: self.spec.workload_name.clone(),
            inputs: self.spec.inputs.clone(),
        }
    }
}

/// The CRD `peakfit crd` prints and the chart ships, with the formats Kubernetes does not know
/// stripped (see `report::crd`).
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    super::report::known_formats_only(&GpuWorkloadProfile::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, name: &str) -> WorkloadKey {
        WorkloadKey {
            namespace: "ml".into(),
            kind: kind.into(),
            name: name.into(),
            inputs: "0123456789abcdef".into(),
        }
    }

    #[test]
    fn a_profile_is_named_by_its_workload_within_an_object_names_rules() {
        assert_eq!(
            profile_name(&key("Deployment", "chat")),
            "deployment-chat-0123456789abcdef"
        );
        // An override may hold anything: still a valid name, and short enough.
        let odd = profile_name(&key("Workload", "Team A/eval_1"));
        assert_eq!(odd, "workload-team-a-eval-1-0123456789abcdef");
        let long = profile_name(&key("Workload", &"x".repeat(300)));
        assert_eq!(long.len(), 253);
        assert!(long.ends_with("-0123456789abcdef"));
    }

    #[test]
    fn the_crd_prints_the_columns_and_no_unknown_format() {
        let text = serde_json::to_string(&crd()).unwrap();
        assert!(!text.contains("uint"), "{text}");
        for column in ["Predicted", "Observed", "Recommended", "Pods", "Age"] {
            assert!(text.contains(&format!(r#""name":"{column}""#)), "{column}");
        }
        assert!(text.contains(r#""scope":"Namespaced""#));
    }
}
