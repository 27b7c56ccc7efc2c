//! The vocabulary the commands' flags share (the kube client, the one duration syntax), so each
//! is spelled and parsed once. Below every command: `agent`, `extender`, `serve` and the rest
//! import it, and it imports none of them (issue 23: when this lived in `cli.rs`, which names
//! every command's `Args`, nine files sat in one import circle).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

/// `--gpu-resources` and `--gpu-dra-drivers`, flattened into the agent and the extender: the
/// chart gives both the same values, and they must read them alike (the agent to map the
/// kubelet's allocations onto GPUs, the extender to tell which nodes a device plugin or a DRA
/// driver hands GPUs out on).
#[derive(Clone, Debug, clap::Args)]
pub struct GpuResourceArgs {
    /// Device-plugin resources whose devices are GPUs: names, or prefixes ending in `*`. The
    /// agent reports who holds them; the extender refuses a node whose allocatable advertises one
    /// while its agent cannot read the kubelet's `PodResources` API.
    #[arg(
        long,
        env = "PEAKFIT_GPU_RESOURCES",
        value_delimiter = ',',
        default_value = crate::gpu_resources::DEFAULT_GPU_RESOURCES
    )]
    pub gpu_resources: Vec<String>,
    /// DRA drivers whose devices are GPUs (`none`: DRA is not used for GPUs). The agent reports
    /// which claim holds each of their devices; the extender watches their `ResourceSlices`
    /// and refuses a node they publish devices on while its agent cannot read the kubelet's
    /// `PodResources` API.
    #[arg(
        long,
        env = "PEAKFIT_GPU_DRA_DRIVERS",
        value_delimiter = ',',
        default_value = crate::gpu_resources::DEFAULT_GPU_DRA_DRIVERS
    )]
    pub gpu_dra_drivers: Vec<String>,
}

impl GpuResourceArgs {
    /// The one matcher both flags make, or the first entry that cannot be used.
    pub fn parse(
        &self,
    ) -> Result<crate::gpu_resources::GpuResources, crate::gpu_resources::FilterError> {
        crate::gpu_resources::GpuResources::new(&self.gpu_resources, &self.gpu_dra_drivers)
    }
}

/// How a command reaches the API server; flattened into every command that needs a client.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ClientArgs {
    /// Kubeconfig file; the in-cluster configuration (or the kubeconfig defaults) otherwise.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

impl ClientArgs {
    /// A client from `--kubeconfig`, or the in-cluster configuration (then the defaults).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(
                    kc,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await?
            }
            None => kube::Config::infer().await?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

/// The one duration syntax of every flag: `5s`, `500ms`, `1m30s`, `2h` or ISO 8601 (`PT5S`);
/// `0` alone means zero. Negative durations are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let d: jiff::SignedDuration = s
        .parse()
        .map_err(|e| format!("{s:?} is not a duration like 5s, 500ms or 2m: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?}: a duration must not be negative"))
}

/// [`parse_duration`] for intervals that cannot be zero (a poll every 0 s would spin).
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: a duration must be more than zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_friendly_format() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("PT5S"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        let err = parse_duration("fast").unwrap_err();
        assert!(err.contains("\"fast\"") && err.contains("5s"), "{err}");
        assert!(parse_duration("-5s").unwrap_err().contains("negative"));
        assert!(
            parse_nonzero_duration("0s")
                .unwrap_err()
                .contains("more than zero")
        );
        assert_eq!(parse_nonzero_duration("5s"), Ok(Duration::from_secs(5)));
    }
}
