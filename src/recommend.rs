//! `peakfit recommend`: per workload, what its pods were seen to use and what to annotate, read
//! from the `GpuWorkloadProfiles` of the cluster or of a file (`kubectl get gpuworkloadprofiles
//! -A -o yaml`). The answer an ML team acts on: "predicted 31.0Gi, peaked at 22.3Gi over 14
//! pods; annotate peakfit.io/vram: 23.5Gi".

use std::path::PathBuf;

use anyhow::Context as _;

use crate::cluster::profile::store::{display_name, quantity};
use crate::cluster::profile::{GpuWorkloadProfile, gib};
use crate::flags::ClientArgs;

#[derive(Clone, Debug, clap::Args)]
pub struct RecommendArgs {
    /// Read the profiles from this file (YAML or JSON; a `List` as `kubectl get -o yaml`
    /// prints it, or documents) instead of the cluster.
    #[arg(long, env = "PEAKFIT_RECOMMEND_FROM_FILE")]
    pub from_file: Option<PathBuf>,
    /// Only this namespace's workloads (default: every namespace).
    #[arg(long, short = 'n', env = "PEAKFIT_RECOMMEND_NAMESPACE")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub fn run(args: &RecommendArgs) -> anyhow::Result<()> {
    let mut profiles = match &args.from_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            profiles_in(&text).with_context(|| format!("reading {}", path.display()))?
        }
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(from_cluster(args))?,
    };
    if let Some(ns) = &args.namespace {
        profiles.retain(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()));
    }
    Ok(crate::stdout::emit(&render(&profiles))?)
}

async fn from_cluster(args: &RecommendArgs) -> anyhow::Result<Vec<GpuWorkloadProfile>> {
    let client = args.client.client().await?;
    let api: kube::Api<GpuWorkloadProfile> = match &args.namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    };
    Ok(api
        .list(&kube::api::ListParams::default())
        .await
        .context("listing GpuWorkloadProfiles")?
        .items)
}

/// The `GpuWorkloadProfile` objects of a file's text; other kinds are skipped (the same reader
/// the extender's `--from-file` uses).
pub fn profiles_in(text: &str) -> anyhow::Result<Vec<GpuWorkloadProfile>> {
    Ok(crate::cluster::file::profiles(text, "the file")?)
}

/// One line per workload with an observed peak, sorted by namespace and name, then the
/// annotation to write.
pub fn render(profiles: &[GpuWorkloadProfile]) -> String {
    let mut rows: Vec<(String, &GpuWorkloadProfile)> = profiles
        .iter()
        .filter(|p| p.status.as_ref().is_some_and(|s| s.observed_peak_bytes > 0))
        .map(|p| (display_name(&p.key()), p))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    if rows.is_empty() {
        return "no workload has been observed yet (no GpuWorkloadProfile with a peak)\n".into();
    }
    let mut out = String::new();
    for (name, p) in rows {
        let Some(s) = &p.status else { continue };
        let asked = if s.explicit { "declared" } else { "predicted" };
        let days = days_between(&s.first_seen, &s.last_seen);
        let direction = match s.recommended_bytes.cmp(&s.predicted_bytes) {
            _ if s.predicted_bytes == 0 => "",
            std::cmp::Ordering::Less => " (less than asked: frees GPU memory)",
            std::cmp::Ordering::Greater => " (more than asked: its pods outgrow the prediction)",
            std::cmp::Ordering::Equal => "",
        };
        out.push_str(&format!(
            "{name}: {asked} {}, peaked at {} per GPU (p95 {}) over {days} and {} pods, {:.1} \
             GPU-hours\n    annotate peakfit.io/vram: \"{}\"{direction}\n",
            gib(s.predicted_bytes),
            gib(s.observed_peak_bytes),
            gib(s.observed_p95_bytes),
            s.pods_seen,
            s.gpu_hours,
            quantity(s.recommended_bytes),
        ));
    }
    out
}

/// "3 days", "5 hours", "12 minutes" between two RFC 3339 times.
fn days_between(first: &str, last: &str) -> String {
    let t = |s: &str| {
        s.parse::<jiff::Timestamp>()
            .map_or(0, jiff::Timestamp::as_second)
    };
    let secs = (t(last) - t(first)).max(0);
    match secs {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3600 => format!("{} hours", s / 3600),
        s => format!("{} minutes", s / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"apiVersion: v1
kind: List
items:
  - apiVersion: peakfit.io/v1alpha1
    kind: GpuWorkloadProfile
    metadata: {name: deployment-chat-0123456789abcdef, namespace: ml}
    spec: {workloadKind: Deployment, workloadName: chat, inputs: 0123456789abcdef}
    status:
      predictedBytes: 33285996544
      observedPeakBytes: 23944227635
      observedP95Bytes: 23622320128
      podsSeen: 14
      gpuHours: 310.5
      firstSeen: "2026-11-19T08:00:00Z"
      lastSeen: "2026-11-26T08:00:00Z"
      recommendedBytes: 25769803776
      summary: {predicted: 31.0Gi, observed: 22.3Gi, recommended: 24Gi}
  - apiVersion: peakfit.io/v1alpha1
    kind: GpuWorkloadProfile
    metadata: {name: job-idle-0123456789abcdef, namespace: ml}
    spec: {workloadKind: Job, workloadName: idle, inputs: 0123456789abcdef}
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: other}
"#;

    #[test]
    fn a_file_of_profiles_says_what_to_annotate() {
        let profiles = profiles_in(FILE).unwrap();
        assert_eq!(profiles.len(), 2);
        let text = render(&profiles);
        assert_eq!(
            text,
            "deployment ml/chat: predicted 31.0Gi, peaked at 22.3Gi per GPU (p95 22.0Gi) over 7 \
             days and 14 pods, 310.5 GPU-hours\n    annotate peakfit.io/vram: \"24Gi\" (less than \
             asked: frees GPU memory)\n"
        );
        assert!(render(&[]).starts_with("no workload"));
    }

    #[test]
    fn a_profile_peakfit_did_not_write_is_named() {
        let bad = "kind: GpuWorkloadProfile\nmetadata: {name: x}\nspec: {workloadKind: 3}\n";
        let e = format!("{:#}", profiles_in(bad).unwrap_err());
        assert!(e.contains("\"x\""), "{e}");
    }
}
