//! The command line: `peakfit`'s subcommands and the global log flags. Parsing only: no
//! subcommand's work happens here. It sits above every command (it names their `Args`); the
//! vocabulary their flags share is [`crate::flags`], below them, so imports run one way.

use clap::{Parser, Subcommand};

use crate::{agent, estimate, extender, recommend, sim, telemetry, webhook};

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
    /// Per workload, what its pods were seen to use and the `peakfit.io/vram` to annotate, from
    /// the cluster's `GpuWorkloadProfiles` or a file of them.
    Recommend(recommend::RecommendArgs),
    /// Replay a cluster and a workload through the placement code under several policies.
    Simulate(sim::SimulateArgs),
    /// Print the `NodeGpuReport` and `GpuWorkloadProfile` `CustomResourceDefinitions` as YAML.
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
            Self::Estimate(_) | Self::Simulate(_) | Self::Recommend(_) | Self::Crd => "warn",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
