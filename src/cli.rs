//! The command line: `peakfit`'s subcommands and the vocabulary their flags share (the kube client,
//! durations, the log filter), so each is spelled and parsed once. Parsing only: no subcommand's
//! work happens here, and nothing here talks to a cluster until a command asks for a client.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::{agent, estimate, extender, sim, telemetry, webhook};

/// Places GPU pods by their predicted peak VRAM.
#[derive(Parser)]
#[command(name = "peakfit", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub log: telemetry::LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Read every GPU through NVML and publish this node's `NodeGpuReport`.
    Agent(agent::AgentArgs),
    /// Serve kube-scheduler's extender verbs (filter, prioritize, bind, preempt).
    Extender(extender::ExtenderArgs),
    /// Mutating admission webhook: opt pods in and pin them to their assigned GPUs.
    Webhook(webhook::WebhookArgs),
    /// Predict a pod's peak VRAM per GPU from its annotations.
    Estimate(estimate::EstimateArgs),
    /// Replay a cluster and a workload through the placement code under several policies.
    Simulate(sim::SimulateArgs),
    /// Print the `NodeGpuReport` `CustomResourceDefinition` as YAML.
    Crd,
}

impl Command {
    /// The log filter without `--log`: the servers log what they do (`info`), as an operator
    /// reading `kubectl logs` expects; a command a person runs logs only warnings, because one
    /// INFO line per simulated bind (13,319 on `simulate`'s built-in run) buried its tables
    /// (issue 22). Its progress shows as a bar on a terminal instead.
    pub fn default_log(&self) -> &'static str {
        match self {
            Self::Agent(_) | Self::Extender(_) | Self::Webhook(_) => "info",
            Self::Estimate(_) | Self::Simulate(_) | Self::Crd => "warn",
        }
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

    #[test]
    fn an_invalid_log_filter_is_an_error_naming_it() {
        let err = Cli::try_parse_from(["peakfit", "--log", "info,peakfit=loud", "crd"])
            .err()
            .expect("a bad filter is refused")
            .to_string();
        assert!(
            err.contains("info,peakfit=loud") && err.contains("--log"),
            "{err}"
        );
        let ok = Cli::try_parse_from(["peakfit", "--log", "info,peakfit=debug", "crd"]).unwrap();
        assert_eq!(ok.log.log.as_deref(), Some("info,peakfit=debug"));
    }

    #[test]
    fn the_model_config_watch_is_on_unless_turned_off_by_name() {
        let watch = |extra: &[&str]| {
            let cli = Cli::try_parse_from(["peakfit", "extender"].iter().chain(extra)).unwrap();
            let Command::Extender(args) = cli.command else {
                panic!("not the extender")
            };
            args.model_config_watch
        };
        assert!(watch(&[]));
        assert!(!watch(&["--model-config-watch", "false"]));
        let err = Cli::try_parse_from(["peakfit", "extender", "--model-config-watch", "off"])
            .err()
            .expect("only true or false")
            .to_string();
        assert!(
            err.contains("--model-config-watch") && err.contains("off"),
            "{err}"
        );
    }

    #[test]
    fn the_extender_takes_durations_with_units() {
        let cli = Cli::try_parse_from([
            "peakfit",
            "extender",
            "--prescore-interval",
            "250ms",
            "--max-report-age",
            "2m",
        ])
        .unwrap();
        let Command::Extender(args) = cli.command else {
            panic!("not the extender")
        };
        assert_eq!(args.prescore_interval, Duration::from_millis(250));
        assert_eq!(args.max_report_age, Duration::from_secs(120));
        let err = Cli::try_parse_from(["peakfit", "extender", "--prescore-interval", "100"])
            .err()
            .expect("a bare number has no unit")
            .to_string();
        assert!(err.contains("\"100\""), "{err}");
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
