//! Deterministic simulator of a Skyriver cluster.
//!
//! It runs N nodes of the real sans-IO core ([`skyriver_core::Node`]) in one thread, with
//! virtual time and one seeded RNG from which every parameter of a run is drawn. Messages travel
//! as real encoded bytes with latency and bandwidth, in order per connection; one-sided READs
//! are served from the holder's simulated arena without its core, under the core's grant table
//! (the TCP fabric's); a persistent node's disk is the core's slot index over a simulated
//! medium; faults (crashes with memory loss, partitions, QP errors, bad rkeys, damaged
//! transfers, slow nodes, directory outages, memory pressure, stalled READ serving, index writes
//! lost or torn at a crash) fly while a random workload runs (which now and then puts a known id again
//! with other bytes), and checkers outside the nodes verify safety throughout and
//! liveness once faults stop. A failing seed replays bit for bit.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod checker;
pub mod cli;
pub mod cluster;
pub mod directory;
pub mod expected_content;
pub mod network;
pub mod params;
pub mod rdma;
pub mod replay;
pub mod trace;
pub mod workload;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use cluster::{run_crowd_seed, Cluster, Flaws, RunMode, SimModes, SimStats};
pub use params::SimParams;

/// Events one random run may take before it is called a livelock.
pub const MAX_EVENTS_PER_RUN: u64 = 20_000_000;
/// Virtual time after the workload's end within which everything must settle, in µs.
pub const SETTLE_US: u64 = 1_000_000;

/// What one seed's run found.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Its parameters, as printed before the run.
    pub params: String,
    /// Hash of the whole trace (equal for equal seeds).
    pub trace_hash: u64,
    /// Counters.
    pub stats: SimStats,
    /// Virtual time at the end, ns.
    pub end_ns: u64,
    /// Invariant violations (empty: the seed passed).
    pub violations: Vec<String>,
}

impl SimReport {
    /// Whether the run found no violation.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The first violation whose text contains `what`.
    pub fn violation_containing(&self, what: &str) -> Option<&String> {
        self.violations.iter().find(|v| v.contains(what))
    }
}

/// Runs one random seed to the end: workload and faults, then liveness and quiescence checks.
/// A panic inside a node (a failed internal assertion) is reported as a violation.
pub fn run_seed(seed: u64, nodes: Option<usize>, mode: RunMode) -> SimReport {
    run_seed_with_flaws(seed, nodes, mode, Flaws::default())
}

/// [`run_seed`] with planted bugs: a test shows that the checker catches what a protection
/// prevents by removing it.
pub fn run_seed_with_flaws(
    seed: u64,
    nodes: Option<usize>,
    mode: RunMode,
    flaws: Flaws,
) -> SimReport {
    run_built(seed, || {
        Cluster::random_with_flaws(seed, nodes, mode, flaws)
    })
}

/// [`run_seed_with_flaws`] with a directory of `shards` shards, a model of Redis Cluster's
/// slots and failovers (see `directory::shard`); 1 shard is the default run.
pub fn run_seed_sharded(
    seed: u64,
    nodes: Option<usize>,
    mode: RunMode,
    flaws: Flaws,
    shards: usize,
) -> SimReport {
    run_seed_with_modes(seed, nodes, mode, flaws, SimModes::sharded(shards))
}

/// [`run_seed_with_flaws`] with a spill tier on every node (a disk with latency, `ENOSPC`,
/// IO errors, damaged records; see `cluster::spill`).
pub fn run_seed_spilling(
    seed: u64,
    nodes: Option<usize>,
    mode: RunMode,
    flaws: Flaws,
) -> SimReport {
    run_seed_with_modes(seed, nodes, mode, flaws, SimModes::spilling())
}

/// [`run_seed_with_flaws`] whose puts ask for replicas, with at least one crash (see
/// `cluster::replication`).
pub fn run_seed_replicating(
    seed: u64,
    nodes: Option<usize>,
    mode: RunMode,
    flaws: Flaws,
) -> SimReport {
    run_seed_with_modes(seed, nodes, mode, flaws, SimModes::replicating())
}

/// [`run_seed_with_flaws`] in the modes `modes`, which combine (a sharded directory with a
/// spill tier and replicated puts, say).
pub fn run_seed_with_modes(
    seed: u64,
    nodes: Option<usize>,
    mode: RunMode,
    flaws: Flaws,
    modes: SimModes,
) -> SimReport {
    run_built(seed, || {
        Cluster::random_with_modes(seed, nodes, mode, flaws, modes)
    })
}

fn run_built(seed: u64, build: impl FnOnce() -> Cluster) -> SimReport {
    let mut params = String::new();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut cluster = build();
        params = cluster.params().to_string();
        let until = skyriver_core::Instant((cluster.params().workload_us + SETTLE_US) * 1000);
        let mut violations = Vec::new();
        if let Err(pending) = cluster.drive_bounded(MAX_EVENTS_PER_RUN, until) {
            violations.push(format!("liveness: {}", pending[0]));
        }
        cluster.check_quiescence();
        violations.extend(cluster.violations().iter().cloned());
        (
            cluster.trace_hash(),
            cluster.stats(),
            cluster.now().as_nanos(),
            violations,
        )
    }));
    match outcome {
        Ok((trace_hash, stats, end_ns, violations)) => SimReport {
            seed,
            params,
            trace_hash,
            stats,
            end_ns,
            violations,
        },
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            SimReport {
                seed,
                params,
                trace_hash: 0,
                stats: SimStats::default(),
                end_ns: 0,
                violations: vec![format!("panic: {message}")],
            }
        }
    }
}

/// The command that replays `seed` exactly (a seed of the default run).
pub fn replay_command(seed: u64, nodes: Option<usize>) -> String {
    replay_command_with_modes(seed, nodes, SimModes::default())
}

/// The command that replays `seed` exactly, run in the modes `modes` (it names every one).
pub fn replay_command_with_modes(seed: u64, nodes: Option<usize>, modes: SimModes) -> String {
    let nodes = nodes.map(|n| format!(" --nodes {n}")).unwrap_or_default();
    let modes = modes.flags();
    format!("skyriver sim --seed {seed}{nodes}{modes} --trace   (or: cargo run --release -p skyriver-sim -- --seed {seed}{nodes}{modes} --trace)")
}

/// Seeds for CI: a fixed list plus `extra` derived from `commit` (e.g. `git rev-parse HEAD`).
pub fn ci_seeds(fixed: u64, extra: u64, commit: Option<&str>) -> Vec<u64> {
    let mut seeds: Vec<u64> = (0..fixed).collect();
    if let Some(commit) = commit {
        let mut hash = trace::Fnv::default();
        hash.write(commit.trim().as_bytes());
        let mut state = hash.finish();
        for _ in 0..extra {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            seeds.push(z ^ (z >> 31));
        }
    }
    seeds
}
