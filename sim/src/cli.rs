//! `skyriver sim`: run one seed (`--seed N`) or a sweep (`--seeds COUNT [--start-seed S]`), or
//! replay a daemon's record (`--replay FILE`, see [`crate::replay`]).
//!
//! A sweep shows its progress on stderr: a bar on a terminal, otherwise a line at every tenth
//! of the seeds and at least every [`PROGRESS_LINE_EVERY`]. `--json` prints one JSON document
//! on stdout instead of the text summary.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::{
    replay_command_with_modes, run_seed_with_modes, Flaws, RunMode, SimModes, SimReport, SimStats,
};

/// Longest wait between two progress lines when stderr is not a terminal.
pub const PROGRESS_LINE_EVERY: Duration = Duration::from_secs(10);

/// Arguments of `skyriver sim`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "The modes combine: --directory-shards K with --spill or with --replicas \
(say `--seeds 200 --directory-shards 3 --replicas`), each mode drawing its parameters from a \
stream of its own, so a seed in one mode alone runs as before; a failing seed's replay command \
names every mode it ran with. --spill with --replicas is refused: the replica checks do not \
follow a copy of record onto the spill disk yet."
)]
pub struct SimArgs {
    /// Run this one seed (prints its parameters first).
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Replay a record written by `skyriver daemon --record FILE`: its inputs go through the
    /// core again, whose outputs must be the recorded ones.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["seed", "seeds", "nodes", "trace", "verbose"])]
    pub replay: Option<std::path::PathBuf>,
    /// Run a sweep of this many seeds.
    #[arg(long)]
    pub seeds: Option<u64>,
    /// First seed of a sweep.
    #[arg(long, default_value_t = 0)]
    pub start_seed: u64,
    /// Number of nodes, at least 1 (default: drawn from the seed, 2 to 5).
    #[arg(long, value_parser = parse_nodes)]
    pub nodes: Option<usize>,
    /// Print every trace line of a single run.
    #[arg(long)]
    pub trace: bool,
    /// Print each seed's parameters and result during a sweep.
    #[arg(long, short)]
    pub verbose: bool,
    /// Print the result as one JSON document on stdout (progress stays on stderr).
    #[arg(long, conflicts_with_all = ["trace", "verbose"])]
    pub json: bool,
    /// Give every node a spill tier: a slow disk that fills up, fails writes and reads and
    /// damages records, its parameters drawn from the seed (see `cluster::spill`). Combines
    /// with --directory-shards.
    #[arg(long)]
    pub spill: bool,
    /// Puts ask for 2 or 3 copies (half of them waiting for the copies) on nodes in 2 or 3
    /// failure domains, with at least one crash: the replica checks of `cluster::replication`
    /// (what `cargo test -p skyriver-sim --test replicas` runs over 60 seeds). Combines with
    /// --directory-shards; not with --spill (the replica checks take a spilled copy of record
    /// for a lost one).
    #[arg(long, conflicts_with = "spill")]
    pub replicas: bool,
    /// Every node asks the directory for the first holder of every object others publish (the
    /// daemon's --learn-locations): first fetches go straight to the pushed holder, stale
    /// pushes cost a round trip. Combines with every other mode.
    #[arg(long)]
    pub learn_locations: bool,
    /// Shards of the simulated directory, a model of Redis Cluster: an object's records live
    /// in the shard owning its id's slot (CRC16 of the id in hex, mod 16,384; slots split into
    /// contiguous ranges), membership in shard 0. Each shard has its own latency, and each
    /// may fail over: its master dies, it answers nothing for a while, then its replica
    /// answers having lost the master's last few hundred microseconds of writes, and the nodes
    /// re-register and re-publish. 1 (the default) is the single head, the same runs as
    /// without the flag. Combines with --spill and --replicas (the replicas' directory
    /// operations go to the shard owning the object's slot, as its records do).
    #[arg(long, default_value_t = 1, value_parser = parse_shards, conflicts_with = "replay")]
    pub directory_shards: usize,
}

fn parse_shards(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("the directory needs at least 1 shard".into()),
        Ok(shards) if shards > 64 => Err(format!("{shards} shards: at most 64")),
        Ok(shards) => Ok(shards),
        Err(_) => Err(format!("{text:?} is not a number of shards")),
    }
}

fn parse_nodes(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("the simulator needs at least 1 node".into()),
        Ok(nodes) => Ok(nodes),
        Err(_) => Err(format!("{text:?} is not a number of nodes")),
    }
}

/// Runs the simulator as the arguments say; failure if any seed found a violation.
pub fn run(args: &SimArgs) -> ExitCode {
    if let Some(path) = &args.replay {
        return run_replay(path, args.json);
    }
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

impl SimArgs {
    /// The modes the arguments ask for; they combine.
    pub fn modes(&self) -> SimModes {
        SimModes {
            directory_shards: (self.directory_shards > 1).then_some(self.directory_shards),
            spill: self.spill,
            replicas: self.replicas,
            learn_locations: self.learn_locations,
        }
    }
}

/// Runs `seed` as the arguments say (a sharded directory under `--directory-shards K`, a spill
/// tier under `--spill`, replicated puts under `--replicas`, in any combination).
fn run_seed_as(seed: u64, args: &SimArgs, mode: RunMode) -> SimReport {
    run_seed_with_modes(seed, args.nodes, mode, Flaws::default(), args.modes())
}

/// The command that replays `seed` as the arguments ran it (naming every mode).
fn replay(seed: u64, args: &SimArgs) -> String {
    replay_command_with_modes(seed, args.nodes, args.modes())
}

fn run_one(seed: u64, args: &SimArgs) -> ExitCode {
    // Parameters first, so they are on screen even if the run dies.
    // Drawn as the run draws them, without building a cluster (which costs a run's start).
    let mut params = crate::SimParams::draw(
        seed,
        &mut <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed),
        args.nodes,
    );
    let modes = SimModes {
        directory_shards: Some(args.directory_shards),
        ..args.modes()
    };
    modes.apply(seed, &mut params);
    let spill = params.spill;
    let params = params.to_string();
    if args.json {
        eprintln!("{params}");
    } else {
        println!("{params}");
    }
    if let Some(spill) = spill {
        if args.json {
            eprintln!("spill: {spill:?}");
        } else {
            println!("spill: {spill:?}");
        }
    }
    let report = run_seed_as(seed, args, mode(args.trace));
    if args.json {
        let mut document = report_json(&report, args);
        document["trace_hash"] = json!(format!("{:016x}", report.trace_hash));
        document["directory_shards"] = json!(args.directory_shards);
        document["virtual_ms"] = json!(report.end_ns as f64 / 1e6);
        document["stats"] = stats_json(&report.stats);
        println!("{document:#}");
    } else {
        print_result(&report);
        if args.directory_shards > 1 {
            println!(
                "directory: {} shards, {} failovers",
                args.directory_shards, report.stats.directory.failovers
            );
        }
        if !report.passed() {
            print_failure(&report, args);
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_replay(path: &std::path::Path, json: bool) -> ExitCode {
    let report = match crate::replay::replay_file(path) {
        Ok(report) => report,
        Err(error) => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("skyriver sim --replay: {text}");
            return ExitCode::FAILURE;
        }
    };
    if json {
        let document = json!({
            "record": path.display().to_string(),
            "node": report.node.0,
            "passed": report.passed(),
            "inputs": report.input_count(),
            "inputs_by_kind": report.inputs,
            "outputs": report.output_count(),
            "outputs_by_kind": report.outputs,
            "recorded_outputs": report.recorded_outputs,
            "malformed_messages": report.malformed_messages,
            "dropped_entries": report.dropped_entries,
            "truncated": report.truncated,
            "divergence": report.divergence,
            "violations": report.violations,
            "virtual_ms": report.end_ns as f64 / 1e6,
        });
        println!("{document:#}");
    } else {
        println!(
            "replayed {} of node {}: {} inputs, {} outputs ({} recorded) over {:.3} ms",
            path.display(),
            report.node,
            report.input_count(),
            report.output_count(),
            report.recorded_outputs,
            report.end_ns as f64 / 1e6
        );
        let list = |counts: &std::collections::BTreeMap<&str, u64>| {
            counts
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!("  inputs:  {}", list(&report.inputs));
        println!("  outputs: {}", list(&report.outputs));
        if report.malformed_messages > 0 {
            println!("  malformed peer messages: {}", report.malformed_messages);
        }
        if report.dropped_entries > 0 {
            println!(
                "  the recorder dropped {} entries: replayed up to there",
                report.dropped_entries
            );
        }
        if report.truncated {
            println!("  the record ends inside an entry (cut short): replayed up to there");
        }
        match &report.divergence {
            None => println!("  outputs: the same as recorded"),
            Some(divergence) => println!("  DIVERGED: {divergence}"),
        }
        for violation in &report.violations {
            println!("  VIOLATION: {violation}");
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A sweep's progress on stderr: a bar on a terminal, lines otherwise.
struct Progress {
    bar: ProgressBar,
    terminal: bool,
    count: u64,
    /// Elapsed time at the last line printed.
    last_line: Duration,
    /// Tenths of the sweep already announced.
    tenths_shown: u64,
}

impl Progress {
    fn new(count: u64) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = ProgressBar::new(count);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} seeds, {msg} [{elapsed_precise}, about {eta} left]",
                )
                // The template is a constant known to parse.
                .expect("valid progress template"),
            );
            bar.set_message("0 failed");
            bar
        } else {
            // Hidden, but it keeps the clock for the lines.
            ProgressBar::hidden()
        };
        Self {
            bar,
            terminal,
            count,
            last_line: Duration::ZERO,
            tenths_shown: 0,
        }
    }

    /// Prints `line` on stdout without tearing the bar.
    fn println(&self, line: &str) {
        self.bar.suspend(|| println!("{line}"));
    }

    fn seed_done(&mut self, done: u64, failed: usize) {
        if self.terminal {
            self.bar.set_position(done);
            self.bar.set_message(format!("{failed} failed"));
            return;
        }
        let elapsed = self.bar.elapsed();
        let tenths = done * 10 / self.count.max(1);
        if tenths > self.tenths_shown || elapsed >= self.last_line + PROGRESS_LINE_EVERY {
            self.tenths_shown = tenths;
            self.last_line = elapsed;
            let left = if done == 0 {
                String::new()
            } else {
                let per_seed = elapsed.as_secs_f64() / done as f64;
                format!(
                    ", about {:.0} s left",
                    per_seed * self.count.saturating_sub(done) as f64
                )
            };
            eprintln!(
                "sim: {done}/{} seeds ({}%), {failed} failed, {:.1} s{left}",
                self.count,
                done * 100 / self.count.max(1),
                elapsed.as_secs_f64()
            );
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn sweep(start: u64, count: u64, args: &SimArgs) -> ExitCode {
    if !args.json {
        println!("sweep of {count} seeds from {start}");
    }
    let mut failed: Vec<SimReport> = Vec::new();
    let mut totals = crate::SimStats::default();
    let mut progress = Progress::new(count);
    for (done, seed) in (1u64..).zip(start..start.saturating_add(count)) {
        let report = run_seed_as(seed, args, mode(false));
        if args.verbose {
            progress.println(&report.params);
            progress.bar.suspend(|| print_result(&report));
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
        totals.locations_learned += s.locations_learned;
        totals.location_cache_hits += s.location_cache_hits;
        totals.stale_locations += s.stale_locations;
        totals.leases_expired += s.leases_expired;
        totals.reads += s.reads;
        totals.crashes += s.crashes;
        totals.misuses_refused += s.misuses_refused;
        totals.durable_commits += s.durable_commits;
        totals.directory.add(&s.directory);
        totals.spill_writes += s.spill_writes;
        totals.spill_write_failures += s.spill_write_failures;
        totals.spill_restores += s.spill_restores;
        totals.spill_lost += s.spill_lost;
        totals.spill_read_errors += s.spill_read_errors;
        totals.spill_evictions += s.spill_evictions;
        if !report.passed() {
            if args.json {
                // The JSON carries the details; a line on stderr says it happened.
                progress.bar.suspend(|| {
                    eprintln!(
                        "seed {} FAILED; replay: {}",
                        report.seed,
                        replay(report.seed, args)
                    )
                });
            } else {
                progress.bar.suspend(|| print_failure(&report, args));
            }
            failed.push(report);
        }
        progress.seed_done(done, failed.len());
    }
    progress.finish();
    if args.json {
        let document = json!({
            "start_seed": start,
            "seeds_run": count,
            "seeds_failed": failed.len(),
            "passed": failed.is_empty(),
            "nodes": args.nodes,
            "directory_shards": args.directory_shards,
            "totals": stats_json(&totals),
            "failures": failed.iter().map(|r| report_json(r, args)).collect::<Vec<_>>(),
        });
        println!("{document:#}");
        return if failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
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
    if args.learn_locations {
        println!(
            "{:<28} {:>14}",
            "locations learned", totals.locations_learned
        );
        println!(
            "{:<28} {:>14}",
            "fetches from a known holder", totals.location_cache_hits
        );
        println!(
            "{:<28} {:>14}",
            "known holders gone", totals.stale_locations
        );
    }
    println!("{:<28} {:>14}", "READs posted", totals.reads);
    println!("{:<28} {:>14}", "node crashes", totals.crashes);
    println!(
        "{:<28} {:>14}",
        "client misuses refused", totals.misuses_refused
    );
    println!("{:<28} {:>14}", "disk commits", totals.durable_commits);
    let d = &totals.directory;
    println!("{:<28} {:>14}", "directory head crashes", d.head_crashes);
    println!(
        "{:<28} {:>14}",
        "partitions from the head", d.head_partitions
    );
    println!("{:<28} {:>14}", "directory pushes lost", d.lost_pushes);
    println!("{:<28} {:>14}", "heartbeat expiries", d.heartbeat_expiries);
    println!("{:<28} {:>14}", "directory re-registrations", d.reconnects);
    println!("{:<28} {:>14}", "directory shards", args.directory_shards);
    if args.directory_shards > 1 {
        println!("{:<28} {:>14}", "directory shard failovers", d.failovers);
    }
    if args.spill {
        println!("{:<28} {:>14}", "spill writes", totals.spill_writes);
        println!(
            "{:<28} {:>14}",
            "spill writes failed", totals.spill_write_failures
        );
        println!("{:<28} {:>14}", "restores", totals.spill_restores);
        println!(
            "{:<28} {:>14}",
            "restores lost (read errors)",
            format!("{} ({})", totals.spill_lost, totals.spill_read_errors)
        );
        println!(
            "{:<28} {:>14}",
            "evictions with a tier", totals.spill_evictions
        );
    }
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

/// A seed's outcome as JSON: seed, parameters, whether it passed, violations, replay command.
fn report_json(report: &SimReport, args: &SimArgs) -> serde_json::Value {
    json!({
        "seed": report.seed,
        "params": report.params,
        "passed": report.passed(),
        "violations": report.violations,
        "replay": replay(report.seed, args),
    })
}

fn stats_json(s: &SimStats) -> serde_json::Value {
    json!({
        "events": s.events,
        "puts": s.puts,
        "fetch_replies": s.fetch_replies,
        "fetched_ok": s.fetched_ok,
        "fetched_err": s.fetched_err,
        "transfers_ok": s.transfers_ok,
        "transfers_failed": s.transfers_failed,
        "served_eager": s.served_eager,
        "served_rendezvous": s.served_rendezvous,
        "locations_learned": s.locations_learned,
        "location_cache_hits": s.location_cache_hits,
        "stale_locations": s.stale_locations,
        "leases_expired": s.leases_expired,
        "reads": s.reads,
        "crashes": s.crashes,
        "misuses_refused": s.misuses_refused,
        "durable_commits": s.durable_commits,
        "directory_head_crashes": s.directory.head_crashes,
        "directory_head_partitions": s.directory.head_partitions,
        "directory_lost_pushes": s.directory.lost_pushes,
        "directory_heartbeat_expiries": s.directory.heartbeat_expiries,
        "directory_reregistrations": s.directory.reconnects,
        "directory_shard_failovers": s.directory.failovers,
        "spill_writes": s.spill_writes,
        "spill_write_failures": s.spill_write_failures,
        "spill_restores": s.spill_restores,
        "spill_lost": s.spill_lost,
        "spill_read_errors": s.spill_read_errors,
        "spill_evictions": s.spill_evictions,
    })
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

fn print_failure(report: &SimReport, args: &SimArgs) {
    println!("seed {} FAILED ({})", report.seed, report.params);
    for violation in report.violations.iter().take(10) {
        println!("  {violation}");
    }
    if report.violations.len() > 10 {
        println!("  ... and {} more", report.violations.len() - 10);
    }
    println!("  replay: {}", replay(report.seed, args));
}
