//! Logging set-up shared by every subcommand: the `--log` filter (checked when parsed) and format.
//! It may not decide what is logged; each module's `tracing` calls and spans do.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, for log pipelines.
    Json,
}

#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "PEAKFIT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,
    /// Log filter in `RUST_LOG` syntax (e.g. `info,peakfit=debug`); an invalid one is an error.
    /// Default: `info` for the servers (agent, extender, webhook), `warn` for the commands a
    /// person runs (`simulate`, `estimate`, `crd`), whose output is their tables.
    #[arg(long, env = "PEAKFIT_LOG", global = true, value_parser = parse_filter)]
    pub log: Option<String>,
}

/// Checks a filter at parse time, so a typo is an error naming it rather than a silent `info`.
fn parse_filter(s: &str) -> Result<String, String> {
    EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("{s:?} is not a log filter such as info or info,peakfit=debug: {e}"))
}

/// Logs go to stderr so that `--print`/`--json` output on stdout stays machine-readable.
/// `default` is the filter when `--log` is not given (see [`LogArgs::log`]).
pub fn init(args: &LogArgs, default: &str) {
    // Checked by `parse_filter`; a `LogArgs` built by hand with a bad filter logs at `default`.
    let filter = EnvFilter::try_new(args.log.as_deref().unwrap_or(default))
        .unwrap_or_else(|_| EnvFilter::new(default));
    // Colour only on a terminal: escape codes in `kubectl logs` or a log pipeline are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match args.log_format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
