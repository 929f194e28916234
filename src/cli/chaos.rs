//! `skyriver chaos`: faults on real daemons under load, with a checker (see `crate::chaos`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use skyriver_daemon::size::ByteSize;

use crate::chaos::{self, ChaosConfig};

/// Options of `skyriver chaos`.
#[derive(Args, Debug, Clone)]
pub struct ChaosArgs {
    /// Daemons, each in its own network namespace.
    #[arg(long, short = 'n', default_value_t = 5)]
    pub nodes: u32,
    /// Length of the workload; faults stop 4 s before its end, then come the final checks.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Seed of the fault schedule and the workload [default: a random one, printed]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Persistent daemons (--backing-file on a small tmpfs of their own).
    #[arg(long, conflicts_with = "both")]
    pub persistent: bool,
    /// One run in memory, then one persistent, with the same seed.
    #[arg(long)]
    pub both: bool,
    /// Shared memory of each daemon.
    #[arg(long, short = 'm', default_value = "256MiB")]
    pub memory: ByteSize,
    /// Write the verdict (and the schedule) as JSON here; the history goes to FILE with
    /// `.history.jsonl` in place of its extension.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The directory: builtin (on node 0, which head kills then hit), redis://HOST:PORT, or
    /// redis-cluster (a Redis Cluster of the run's own, 3 masters and 3 replicas, whose
    /// masters the nemesis kills; needs redis-server 7 and redis-cli).
    #[arg(long, default_value = "builtin")]
    pub directory: String,
    /// Copy the daemons' logs here at the end of each run (a subdirectory per run).
    #[arg(long, value_name = "DIR")]
    pub keep_logs: Option<PathBuf>,
    /// A Python client per node (the `skyriver` package `python3` imports, or this source
    /// tree's build): auto runs them when it imports and says why not otherwise.
    #[arg(long, value_enum, default_value_t = PythonClientsArg::Auto)]
    pub python_clients: PythonClientsArg,
    /// A third of the faults get a second one at the same time on another node (never node 0,
    /// never a wipe, full disk or client kill).
    #[arg(long)]
    pub overlap: bool,
    /// Fabric between the daemons: tcp, or verbs (RDMA; on Debian 12's kernel only in the
    /// SoftRoCE guest: ci/softroce/chaos.sh). On verbs the RDMA devices sit outside the
    /// namespaces (SoftRoCE carries RoCE only in the initial one), so the link faults
    /// (link_down, one_way_cut, throttle), which act on a namespace's link, are left out.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "verbs"])]
    pub fabric: String,
    /// RDMA devices for --fabric verbs, given to the nodes in turn [default:
    /// SKYRIVER_RDMA_DEVICES, else every device of the machine]
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Multiply the checker's real-time bounds (5 s past a timeout, 10 s to re-publish after
    /// a fault, 1 s to publish a put) by N [default: 1]; only where the CPU is emulated
    /// (ci/softroce/chaos.sh under TCG), and the summary then says so.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub slowdown: Option<u32>,
}

/// `--python-clients`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonClientsArg {
    /// When the package imports.
    Auto,
    /// Always (fail without the package).
    On,
    /// Never.
    Off,
}

/// Why `skyriver chaos` failed: bad arguments, a run that could not be carried out, or
/// violations found.
#[derive(Debug, thiserror::Error)]
pub enum ChaosCommandError {
    /// `--nodes` out of range.
    #[error("--nodes {given}: chaos needs 2 to {max} nodes")]
    Nodes {
        /// What was given.
        given: u32,
        /// The most nodes a namespace cluster holds.
        max: u32,
    },
    /// `--seconds` too short for a schedule.
    #[error("--seconds {0}: at least 10")]
    Seconds(u64),
    /// `--directory` names nothing chaos can start.
    #[error("--directory {0}: builtin, redis://HOST:PORT or redis-cluster")]
    Directory(String),
    /// The signal watcher could not start.
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
    /// A run could not be carried out.
    #[error(transparent)]
    Run(#[from] chaos::ChaosError),
    /// The JSON verdict could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The `--json` file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// `--fabric verbs` has no device to run on.
    #[error(transparent)]
    Fabric(#[from] chaos::fabric::FabricError),
    /// The checker found violations.
    #[error("chaos found violations (seed {seed}); replay with: {replay}")]
    Violations {
        /// The run's seed.
        seed: u64,
        /// The command(s) that replay the failing schedule(s).
        replay: String,
    },
}

/// Runs `skyriver chaos`; fails when a run could not be carried out or found violations.
pub fn run_chaos(args: &ChaosArgs) -> Result<(), ChaosCommandError> {
    if args.nodes < 2 || args.nodes > crate::netns::MAX_NODES {
        return Err(ChaosCommandError::Nodes {
            given: args.nodes,
            max: crate::netns::MAX_NODES,
        });
    }
    if args.seconds < 10 {
        return Err(ChaosCommandError::Seconds(args.seconds));
    }
    let redis_cluster = args.directory == "redis-cluster";
    let directory = match args.directory.as_str() {
        "builtin" | "redis-cluster" => None,
        url if url.starts_with("redis://") || url.starts_with("rediss://") => Some(url.to_string()),
        other => return Err(ChaosCommandError::Directory(other.to_string())),
    };
    let fabric = match args.fabric.as_str() {
        "verbs" => chaos::fabric::ChaosFabric::verbs(&args.devices)?,
        _ => chaos::fabric::ChaosFabric::Tcp,
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let modes: &[bool] = match (args.both, args.persistent) {
        (true, _) => &[false, true],
        (false, persistent) => {
            if persistent {
                &[true]
            } else {
                &[false]
            }
        }
    };
    let stop = chaos::stop_on_signals().map_err(ChaosCommandError::Signals)?;
    let mut reports = Vec::new();
    for &persistent in modes {
        let mode = if persistent { "persistent" } else { "memory" };
        let history = args.json.as_ref().map(|json| {
            let stem = json.with_extension("");
            PathBuf::from(format!("{}.{mode}.history.jsonl", stem.display()))
        });
        let config = ChaosConfig {
            nodes: args.nodes,
            seconds: args.seconds,
            seed,
            persistent,
            memory_bytes: args.memory.0,
            directory: directory.clone(),
            history,
            keep_logs: args.keep_logs.as_ref().map(|dir| dir.join(mode)),
            python_clients: match args.python_clients {
                PythonClientsArg::Auto => chaos::PythonClients::Auto,
                PythonClientsArg::On => chaos::PythonClients::On,
                PythonClientsArg::Off => chaos::PythonClients::Off,
            },
            overlap: args.overlap,
            redis_cluster,
            fabric: fabric.clone(),
            slowdown: args.slowdown,
        };
        println!(
            "chaos: seed {seed}, {} nodes, {} s, {mode}",
            args.nodes, args.seconds
        );
        let report = chaos::run(&config, &stop)?;
        print!("{}", chaos::summary(&report));
        reports.push(report);
    }
    let passed = reports.iter().all(|r| r.verdict.passed());
    if let Some(path) = &args.json {
        let document = serde_json::json!({
            "seed": seed,
            "passed": passed,
            "runs": reports,
        });
        let text = serde_json::to_string_pretty(&document).expect("a JSON value serializes");
        std::fs::write(path, text).map_err(|source| ChaosCommandError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if passed {
        println!("chaos: 0 violations");
        Ok(())
    } else {
        let replays: Vec<&str> = reports
            .iter()
            .filter(|r| !r.verdict.passed())
            .map(|r| r.replay.as_str())
            .collect();
        Err(ChaosCommandError::Violations {
            seed,
            replay: replays.join("  /  "),
        })
    }
}
