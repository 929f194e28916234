//! Broadcast through copies with real daemons (loopback, TCP fabric): many nodes fetching one
//! large object at once are sent to one another's partial copies, every copy has the
//! holder's bytes, and a relay killed mid-broadcast leaves its readers to finish from the
//! holder.

mod common;
use common::pattern;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ObjectId};

const OBJECT_BYTES: usize = 32 << 20;
/// Rounds tried before concluding relays never happen: whether a request arrives while the
/// holder still serves an earlier one depends on timing.
const MAX_ROUNDS: u64 = 6;

fn cluster(nodes: u32, extra: &[&str]) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "256MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.eager_threshold = "0".into();
    args.daemon_args = extra.iter().map(|s| s.to_string()).collect();
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

/// Relay counters summed over `nodes`: (leases over partial copies, transfers from relays).
fn relays(cluster: &LocalCluster, nodes: std::ops::Range<usize>) -> (u64, u64) {
    nodes
        .map(|n| {
            let c = Client::connect(&cluster.sockets[n])
                .unwrap()
                .metrics()
                .unwrap()
                .counters;
            (c.relay_leases, c.relayed_transfers)
        })
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
}

/// Every node but the holder (node 0) fetches object `id` at once; each thread returns
/// whether its copy has the bytes (`None`: the fetch failed).
fn broadcast(
    cluster: &LocalCluster,
    id: ObjectId,
    seed: u64,
) -> Vec<std::thread::JoinHandle<Option<bool>>> {
    let fetchers = cluster.sockets.len() - 1;
    let start = Arc::new(Barrier::new(fetchers));
    let expected = Arc::new(pattern(seed, OBJECT_BYTES));
    (1..=fetchers)
        .map(|n| {
            let socket = cluster.sockets[n].clone();
            let (start, expected) = (start.clone(), expected.clone());
            std::thread::spawn(move || {
                let client = Client::connect(&socket).unwrap();
                start.wait();
                let object = client.fetch_one(id, Some(Duration::from_secs(60))).ok()?;
                Some(object.data() == &expected[..])
            })
        })
        .collect()
}

#[test]
fn a_broadcast_flows_through_relays_and_every_copy_is_exact() {
    let (_dir, cluster) = cluster(4, &[]);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let served = || holder.metrics().unwrap().counters.bytes_served;
    let fetchers = cluster.sockets.len() as u64 - 1;
    for round in 0..MAX_ROUNDS {
        let id = ObjectId::from_u64(100 + round);
        holder
            .create_and_seal(id, &pattern(round, OBJECT_BYTES), b"")
            .unwrap();
        let served_before = served();
        for (n, fetch) in broadcast(&cluster, id, round).into_iter().enumerate() {
            assert_eq!(fetch.join().unwrap(), Some(true), "node {}'s copy", n + 1);
        }
        let holder_sent = served() - served_before;
        let (leases, relayed) = relays(&cluster, 1..cluster.sockets.len());
        eprintln!(
            "round {round}: holder sent {holder_sent} bytes, {leases} relay leases granted, \
             {relayed} relayed transfers"
        );
        // Through a relay, the holder's link carried fewer copies than there were fetchers.
        if leases > 0 && relayed > 0 && holder_sent < fetchers * OBJECT_BYTES as u64 {
            return;
        }
    }
    panic!("no fetch went through a relay in {MAX_ROUNDS} rounds of a 3-node broadcast");
}

#[test]
fn relays_off_every_requester_pulls_from_the_holder() {
    let (_dir, cluster) = cluster(4, &["--relay-min-bytes", "off"]);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    for round in 0..2 {
        let id = ObjectId::from_u64(200 + round);
        holder
            .create_and_seal(id, &pattern(round, OBJECT_BYTES), b"")
            .unwrap();
        for fetch in broadcast(&cluster, id, round) {
            assert_eq!(fetch.join().unwrap(), Some(true));
        }
    }
    assert_eq!(relays(&cluster, 0..cluster.sockets.len()), (0, 0));
}

#[test]
fn a_relay_killed_mid_broadcast_leaves_its_readers_to_finish_from_the_holder() {
    let (_dir, mut cluster) = cluster(5, &[]);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    for round in 0..MAX_ROUNDS {
        let id = ObjectId::from_u64(300 + round);
        holder
            .create_and_seal(id, &pattern(round, OBJECT_BYTES), b"")
            .unwrap();
        let fetches = broadcast(&cluster, id, round);
        // A node serving its partial copy while still receiving it, if one turns up.
        let mut victim = None;
        while victim.is_none() && !fetches.iter().all(|f| f.is_finished()) {
            victim = (1..cluster.sockets.len()).find(|&n| {
                Client::connect(&cluster.sockets[n])
                    .and_then(|c| c.metrics())
                    .is_ok_and(|m| m.counters.relay_leases > 0 && m.transfers_in_flight > 0)
            });
        }
        let Some(victim) = victim else {
            for fetch in fetches {
                assert_eq!(fetch.join().unwrap(), Some(true));
            }
            continue;
        };
        cluster.kill(victim);
        for (n, fetch) in fetches.into_iter().enumerate() {
            let result = fetch.join().unwrap();
            if n + 1 != victim {
                assert_eq!(result, Some(true), "node {}'s copy", n + 1);
            }
        }
        eprintln!("round {round}: relay node {victim} killed mid-broadcast");
        return;
    }
    panic!("no node relayed mid-transfer in {MAX_ROUNDS} rounds of a 4-node broadcast");
}
