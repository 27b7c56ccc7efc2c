//! The `peakfit` binary: parses the command line, sets up logging and runs one subcommand. Every
//! behaviour lives in the library (`src/lib.rs`); nothing here but dispatch and the exit code.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: a filter or prioritize request decodes and frees thousands
/// of node names, and glibc then spends a third of the request consolidating its free lists
/// (measured with `perf` on `cargo bench --bench extender`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use peakfit::cli::{Cli, Command};
use peakfit::{agent, estimate, extender, recommend, sim, telemetry, webhook};

/// Errors print as one readable line (`error: …: cause`), never as a Debug dump or backtrace: the
/// people reading them are ML engineers running `peakfit estimate` and operators reading pod logs.
fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(&cli.log, cli.command.default_log());
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by `: `, each cause once: an error that already names its
/// source in its message (thiserror's `{source}`) would otherwise print it twice
/// ("… (os error 2): No such file or directory (os error 2)").
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Agent(args) => serve(agent::run(args)),
        Command::Extender(args) => serve(extender::run(args)),
        Command::Webhook(args) => serve(webhook::run(args)),
        Command::Estimate(args) => estimate::run(&args),
        Command::Simulate(args) => sim::run(&args),
        Command::Recommend(args) => recommend::run(&args),
        Command::Crd => Ok(peakfit::stdout::emit(&peakfit::cluster::all_crds_yaml()?)?),
    }
}

/// Runs a server to completion, then exits without waiting for what it abandoned: after the
/// shutdown deadline a connection still reading a half-sent body, or a verb still computing on
/// the blocking pool, must not keep the process alive (dropping a runtime waits for its blocking
/// tasks).
fn serve(server: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(server);
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    result
}
