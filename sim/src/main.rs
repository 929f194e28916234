//! Stand-alone simulator runner; the same as `skyriver sim`.

use clap::Parser;

/// Deterministic simulation of a Skyriver cluster.
#[derive(Debug, Parser)]
#[command(name = "skyriver-sim")]
struct Cli {
    #[command(flatten)]
    args: skyriver_sim::cli::SimArgs,
}

fn main() -> std::process::ExitCode {
    skyriver_sim::cli::run(&Cli::parse().args)
}
