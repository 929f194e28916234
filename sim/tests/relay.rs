//! Broadcast through copies: many nodes fetching one large object at once pull it through each
//! other's partial copies. Relays crash, the source crashes, a node without memory for its copy
//! takes no part; every copy sealed is the object's, and a relay whose readers are told it holds
//! more than it does is caught by the checker.

use std::time::Duration;

use skyriver_sim::{run_seed, run_seed_with_flaws, Cluster, Flaws, RunMode};

const OBJ: u64 = 1;
/// Many 16 KiB READ slices: relayed (the scripted nodes relay from 32 KiB).
const LEN: u64 = 200_000;
const TIMEOUT: Duration = Duration::from_millis(20);

fn broadcast(c: &mut Cluster, readers: std::ops::RangeInclusive<u32>) {
    c.put(0, OBJ, LEN);
    c.drive();
    for node in readers {
        c.fetch_without_waiting(node, &[OBJ], TIMEOUT);
    }
}

fn holds(c: &Cluster, node: u32) -> bool {
    c.node(node).is_some_and(|n| {
        n.store()
            .sealed_info(&skyriver_core::ObjectId::from_u64(OBJ))
            .is_some()
    })
}

fn finish(c: &mut Cluster) {
    c.drive();
    c.check_quiescence();
    assert!(c.violations().is_empty(), "{:#?}", c.violations());
}

#[test]
fn a_broadcast_flows_through_the_readers_copies() {
    let mut c = Cluster::scripted(6);
    broadcast(&mut c, 1..=5);
    finish(&mut c);
    for node in 1..=5 {
        assert!(holds(&c, node), "node {node} has its copy");
    }
    let stats = c.stats();
    assert!(stats.relay_redirects >= 3, "{stats:?}");
    assert!(stats.relayed_reads > 0, "{stats:?}");
}

#[test]
fn a_relay_crashing_mid_stream_is_replaced_by_the_source() {
    let mut c = Cluster::scripted(5);
    broadcast(&mut c, 1..=4);
    assert!(c.drive_until(|c| c.stats().relayed_reads >= 3));
    c.crash(1); // the first relay: the others pulled through it
    finish(&mut c);
    for node in 2..=4 {
        assert!(holds(&c, node), "node {node} has its copy");
    }
}

#[test]
fn the_source_crashing_mid_broadcast_leaves_only_verified_copies() {
    let mut c = Cluster::scripted(5);
    broadcast(&mut c, 1..=4);
    assert!(c.drive_until(|c| c.stats().relayed_reads >= 3));
    c.crash(0);
    // Fetches end (with the object or an error), no partial copy is sealed, nothing hangs.
    finish(&mut c);
}

#[test]
fn a_node_without_memory_for_its_copy_relays_nothing() {
    let mut c = Cluster::scripted(5);
    // Node 2's memory is held by its own object until the broadcast is under way.
    c.put_and_hold(2, 9, 900_000, Duration::from_millis(2));
    broadcast(&mut c, 1..=4);
    finish(&mut c);
    // Node 2 had no room (its fetch fails with OutOfMemory); the others pulled past it.
    for node in [1, 3, 4] {
        assert!(holds(&c, node), "node {node} has its copy");
    }
    assert!(c.stats().relayed_reads > 0);
}

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

/// Seeds of the random sweep that relay (some with hinted fetches reaching a relay, which
/// must then read only the prefix it announces).
const SEEDS: std::ops::Range<u64> = 0..40;

#[test]
fn random_runs_that_relay_pass_their_checks_and_catch_a_relay_running_ahead() {
    let flaws = Flaws {
        relay_progress_runs_ahead: true,
        ..Flaws::default()
    };
    let (mut relaying, mut caught) = (0, 0);
    for seed in SEEDS {
        let report = run_seed(seed, None, MODE);
        assert!(
            report.passed(),
            "seed {seed} ({}): {:?}\nreplay: cargo test -p skyriver-sim --test relay",
            report.params,
            report.violations
        );
        if report.stats.relayed_reads == 0 {
            continue;
        }
        relaying += 1;
        let flawed = run_seed_with_flaws(seed, None, MODE, flaws);
        if flawed
            .violations
            .iter()
            .any(|v| v.contains("that it has not received"))
        {
            caught += 1;
        }
    }
    assert!(relaying >= 5, "only {relaying} runs of {SEEDS:?} relayed");
    assert!(caught > 0, "no run of {SEEDS:?} caught the planted flaw");
}

/// Virtual time from the fetches of nodes `1..=readers` (all at once) to the moment every one
/// of them holds the object.
fn broadcast_time(readers: u32) -> Duration {
    let mut c = Cluster::scripted(readers as usize + 1);
    c.put(0, OBJ, LEN);
    c.drive();
    let start = c.now();
    for node in 1..=readers {
        c.fetch_without_waiting(node, &[OBJ], TIMEOUT);
    }
    assert!(c.drive_until(|c| (1..=readers).all(|n| holds(c, n))));
    let took = c.now().saturating_since(start);
    finish(&mut c);
    took
}

/// The chain is cut-through, not store-and-forward: each reader trails its relay by about one
/// READ slice and the messages that announce it, however long the object. So each node added
/// to a broadcast adds at most a hop's lag (two slices on the wire and four link latencies,
/// of which one READ's round trip and one announcement are what a hop costs), not another
/// whole transfer. A relay announcing its prefix less often (every few READs), or only once
/// its copy is whole, makes its readers trail by more and fails this.
#[test]
fn each_relay_in_a_chain_adds_about_one_slice_not_a_transfer() {
    let p = skyriver_sim::SimParams::scripted(2);
    let slice_ns = p.read_slice_bytes * 1_000_000_000 / p.bandwidth_bytes_per_sec;
    let hop = Duration::from_nanos(2 * slice_ns + 4 * p.latency_ns.1);
    let alone = broadcast_time(1);
    assert!(
        hop * 3 < alone,
        "a hop's lag {hop:?} is small next to a transfer {alone:?}"
    );
    for readers in [3, 7] {
        let took = broadcast_time(readers);
        let bound = alone + hop * (readers - 1);
        assert!(
            took <= bound,
            "{readers} readers took {took:?}, more than one transfer ({alone:?}) and {} hops of \
             {hop:?}",
            readers - 1
        );
    }
}
