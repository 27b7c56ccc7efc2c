#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: a filter or prioritize request decodes and frees thousands
/// of node names, and glibc then spends a third of the request consolidating its free lists
/// (measured with `perf` on `cargo bench --bench extender`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use peakfit::cli::{Cli, Command};
use peakfit::{agent, estimate, extender, sim, telemetry, webhook};

/// Errors print as one readable line (`error: …: cause`), never as a Debug dump or backtrace: the
/// people reading them are ML engineers running `peakfit estimate` and operators reading pod logs.
fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(&cli.log);
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Agent(args) => runtime()?.block_on(agent::run(args)),
        Command::Extender(args) => runtime()?.block_on(extender::run(args)),
        Command::Webhook(args) => runtime()?.block_on(webhook::run(args)),
        Command::Estimate(args) => estimate::run(args),
        Command::Simulate(args) => sim::run(args),
        Command::Crd => {
            print!("{}", peakfit::cluster::crd_yaml()?);
            Ok(())
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
