//! Batches of large objects on links that READ data shares with messages, one thing at a
//! time: every transfer from one holder must progress while the others' READs are served,
//! so none runs out of its lease waiting behind them (`Node::pump_reads`), also when copies
//! relay the objects to each other.

use std::time::Duration;

use skyriver_sim::{Cluster, Flaws, SimParams};

const LEN: u64 = 128 * 1024; // 8 READ slices of 16 KiB

/// `nodes` nodes on 20 MB/s links (a slice takes 0.8 ms on the wire) with a lease of 20 ms:
/// a holder's link carries a batch of 8 objects in about 50 ms, several leases.
fn slow_cluster(nodes: usize) -> Cluster {
    let mut p = SimParams::scripted(nodes);
    p.arena_bytes = 8 << 20;
    p.max_bytes_in_flight = 4 << 20;
    p.bandwidth_bytes_per_sec = 20_000_000;
    p.reads_share_links = true;
    p.lease_us = 20_000;
    p.reply_timeout_us = 20_000;
    p.fetch_timeout_us = 2_000_000;
    Cluster::scripted_with(p, Flaws::default())
}

fn finish(c: &mut Cluster) {
    c.drive();
    c.check_quiescence();
    assert!(c.violations().is_empty(), "{:#?}", c.violations());
}

#[test]
fn a_batch_from_one_holder_on_a_slow_link_arrives_without_a_failed_transfer() {
    let mut c = slow_cluster(2);
    let objects: Vec<u64> = (1..=8).collect();
    for &n in &objects {
        c.put(0, n, LEN);
    }
    c.drive();
    c.fetch(1, &objects, Duration::from_secs(2));
    finish(&mut c);
    let stats = c.stats();
    assert_eq!(stats.fetched_ok, 8, "{stats:?}");
    assert_eq!(stats.transfers_failed, 0, "{stats:?}");
}

#[test]
fn a_batched_broadcast_on_slow_links_arrives_through_relays_without_a_failed_transfer() {
    let mut c = slow_cluster(5);
    let objects: Vec<u64> = (1..=4).collect();
    for &n in &objects {
        c.put(0, n, LEN);
    }
    c.drive();
    for node in 1..=4 {
        c.fetch(node, &objects, Duration::from_secs(2));
    }
    finish(&mut c);
    let stats = c.stats();
    assert_eq!(stats.fetched_ok, 16, "{stats:?}");
    assert_eq!(stats.transfers_failed, 0, "{stats:?}");
    assert!(stats.relay_redirects > 0, "{stats:?}");
}
