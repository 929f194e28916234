//! A 1,000-node cluster under its random workload and faults for a few simulated milliseconds:
//! it builds, forms, puts and fetches with no violation, and its bookkeeping stays linear in
//! the node count (a table per pair of nodes is allowed, nothing bigger).
//!
//! Under `cargo test` (the simulator and the core are optimised, assertions on) it passes in
//! about 30 s of CPU and 1.6 GB (80 s before the checks' cost per event stopped growing with
//! what nodes hold; about 13 s in a release build). It runs in every `cargo test` unless less
//! than [`MEMORY_NEEDED`] is available, when it says it was skipped. Member lists are shared,
//! one per membership change (before, each lost directory push sent N lists of N members, and
//! the run took 2.8 GB without reaching 2 simulated ms). A release run:
//! `cargo test -p skyriver-sim --release --test thousand_nodes -- --nocapture`.

use skyriver_core::Instant;
use skyriver_sim::{Cluster, RunMode};

#[path = "../../transport/tests/support/skip.rs"]
mod skip;

/// Available memory the run needs, with room to spare: it peaks at about 1.6 GB.
const MEMORY_NEEDED: u64 = 3 << 30;

const NODES: usize = 1_000;
/// Simulated time the test runs for.
const RUN_NS: u64 = 2_000_000;

/// `MemAvailable` of `/proc/meminfo`, in bytes (`None` where it cannot be read).
fn memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn a_thousand_node_seed_runs_a_few_milliseconds_without_violation() {
    match memory_available() {
        Some(available) if available >= MEMORY_NEEDED => {}
        available => {
            skip::skip(
                "a_thousand_node_seed_runs_a_few_milliseconds_without_violation",
                &skip::MEMORY,
                &format!(
                    "needs {} MiB of available memory, the machine has {}",
                    MEMORY_NEEDED >> 20,
                    available.map_or("an unknown amount".into(), |a| format!("{} MiB", a >> 20))
                ),
            );
            return;
        }
    }
    let mode = RunMode {
        workload: true,
        faults: true,
        keep_trace: false,
        echo_trace: false,
    };
    let mut cluster = Cluster::random(1, Some(NODES), mode);
    assert_eq!(cluster.params().nodes, NODES);
    cluster.run_until(Instant(RUN_NS));
    assert!(
        cluster.violations().is_empty(),
        "violations: {:#?}",
        cluster.violations()
    );
    let stats = cluster.stats();
    eprintln!(
        "{NODES} nodes, {} simulated ms: {} events, {} puts, {} fetch replies",
        RUN_NS as f64 / 1e6,
        stats.events,
        stats.puts,
        stats.fetch_replies
    );
    // Every node's clients work: about one put per client before the first op interval ends.
    assert!(
        stats.puts >= NODES as u64 / 2,
        "{} puts by {NODES} nodes in {} events",
        stats.puts,
        stats.events
    );
    assert!(stats.fetch_replies > 0, "no fetch answered: {stats:?}");
}
