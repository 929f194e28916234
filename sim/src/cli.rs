//! `skyriver sim`: run one seed (`--seed N`) or a sweep (`--seeds COUNT [--start-seed S]`).

use std::process::ExitCode;

use crate::{replay_command, run_seed, RunMode, SimReport};

/// Arguments of `skyriver sim`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Run this one seed (prints its parameters first).
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Run a sweep of this many seeds.
    #[arg(long)]
    pub seeds: Option<u64>,
    /// First seed of a sweep.
    #[arg(long, default_value_t = 0)]
    pub start_seed: u64,
    /// Number of nodes (default: drawn from the seed, 2 to 5).
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Print every trace line of a single run.
    #[arg(long)]
    pub trace: bool,
    /// Print each seed's parameters and result during a sweep.
    #[arg(long, short)]
    pub verbose: bool,
}

/// Runs the simulator as the arguments say; failure if any seed found a violation.
pub fn run(args: &SimArgs) -> ExitCode {
    match args.seed {
        Some(seed) => run_one(seed, args),
        None => sweep(args.start_seed, args.seeds.unwrap_or(100), args),
    }
}

fn mode(echo: bool) -> RunMode {
    RunMode {
        workload: true,
        faults: true,
        keep_trace: false,
        echo_trace: echo,
    }
}

fn run_one(seed: u64, args: &SimArgs) -> ExitCode {
    // Parameters first, so they are on screen even if the run dies.
    let params = crate::Cluster::random(seed, args.nodes, mode(false))
        .params()
        .to_string();
    println!("{params}");
    let report = run_seed(seed, args.nodes, mode(args.trace));
    print_result(&report);
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        print_failure(&report, args.nodes);
        ExitCode::FAILURE
    }
}

fn sweep(start: u64, count: u64, args: &SimArgs) -> ExitCode {
    println!("sweep of {count} seeds from {start}");
    let mut failed: Vec<SimReport> = Vec::new();
    let mut totals = crate::SimStats::default();
    for seed in start..start.saturating_add(count) {
        let report = run_seed(seed, args.nodes, mode(false));
        if args.verbose {
            println!("{}", report.params);
            print_result(&report);
        }
        let s = &report.stats;
        totals.events += s.events;
        totals.puts += s.puts;
        totals.fetch_replies += s.fetch_replies;
        totals.fetched_ok += s.fetched_ok;
        totals.fetched_err += s.fetched_err;
        totals.transfers_ok += s.transfers_ok;
        totals.transfers_failed += s.transfers_failed;
        totals.served_eager += s.served_eager;
        totals.served_rendezvous += s.served_rendezvous;
        totals.leases_expired += s.leases_expired;
        totals.reads += s.reads;
        totals.crashes += s.crashes;
        if !report.passed() {
            print_failure(&report, args.nodes);
            failed.push(report);
        }
    }
    println!();
    println!("{:<28} {:>14}", "seeds run", count);
    println!("{:<28} {:>14}", "seeds failed", failed.len());
    println!("{:<28} {:>14}", "events", totals.events);
    println!("{:<28} {:>14}", "objects put", totals.puts);
    println!("{:<28} {:>14}", "fetch replies", totals.fetch_replies);
    println!("{:<28} {:>14}", "ids fetched ok", totals.fetched_ok);
    println!(
        "{:<28} {:>14}",
        "ids failed (clean errors)", totals.fetched_err
    );
    println!("{:<28} {:>14}", "transfers ok", totals.transfers_ok);
    println!(
        "{:<28} {:>14}",
        "transfers failed+retried", totals.transfers_failed
    );
    println!("{:<28} {:>14}", "served eager", totals.served_eager);
    println!(
        "{:<28} {:>14}",
        "served rendezvous", totals.served_rendezvous
    );
    println!("{:<28} {:>14}", "leases expired", totals.leases_expired);
    println!("{:<28} {:>14}", "READs posted", totals.reads);
    println!("{:<28} {:>14}", "node crashes", totals.crashes);
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!(
            "failing seeds: {:?}",
            failed.iter().map(|r| r.seed).collect::<Vec<_>>()
        );
        ExitCode::FAILURE
    }
}

fn print_result(report: &SimReport) {
    let s = &report.stats;
    println!(
        "seed {}: {} — {} events, virtual {:.3} ms, {} puts, {} fetched ok, {} fetch errors, {} transfers ({} failed), trace {:016x}",
        report.seed,
        if report.passed() { "ok" } else { "VIOLATION" },
        s.events,
        report.end_ns as f64 / 1e6,
        s.puts,
        s.fetched_ok,
        s.fetched_err,
        s.transfers_ok,
        s.transfers_failed,
        report.trace_hash
    );
}

fn print_failure(report: &SimReport, nodes: Option<usize>) {
    println!("seed {} FAILED ({})", report.seed, report.params);
    for violation in report.violations.iter().take(10) {
        println!("  {violation}");
    }
    if report.violations.len() > 10 {
        println!("  ... and {} more", report.violations.len() - 10);
    }
    println!("  replay: {}", replay_command(report.seed, nodes));
}
