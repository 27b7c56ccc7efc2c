//! Logging set-up shared by every subcommand.

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
    /// Log filter in `RUST_LOG` syntax (e.g. `info,peakfit=debug`).
    #[arg(long, env = "PEAKFIT_LOG", default_value = "info", global = true)]
    pub log: String,
}

/// Logs go to stderr so that `--print`/`--json` output on stdout stays machine-readable.
pub fn init(args: &LogArgs) {
    let filter = EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("info"));
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
