//! Daemons on real RDMA devices: `skyriver daemon --fabric verbs` processes on the devices
//! named in `SKYRIVER_RDMA_DEVICES` (`"rxe0 rxe1"` inside `ci/softroce/run-in-vm.sh`; node i
//! uses device i mod n) fetch objects of every size class from each other, eager, rendezvous
//! and by the cost model, survive a holder killed in the middle of a READ, and pass a
//! broadcast through one another's partial copies (relays). Without that variable every test
//! prints a skip line and passes:
//!
//! ```text
//! CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/ci/softroce/run-in-vm.sh \
//!     cargo test --test verbs_cluster -- --test-threads=1
//! ```
//!
//! `SKYRIVER_RDMA_GID_INDEX` picks the GID index on hardware that needs one. Every wait has a
//! deadline; assertions are on bytes and outcomes, never speed. Sizes stay small (at most
//! 16 MiB) because SoftRoCE under an emulated CPU moves a few tens of MB/s.

mod common;

use std::time::{Duration, Instant};

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ClientError, ObjectId};

/// Every size class: inline-small, one eager chunk, several chunks, around the automatic
/// threshold, and clearly rendezvous.
const SIZES: [usize; 7] = [1, 1 << 10, 60 << 10, 256 << 10, 1 << 20, 8 << 20, 16 << 20];
const FETCH_DEADLINE: Duration = Duration::from_secs(120);

/// The device names to use, or `None` (after reporting a skip).
fn devices(test: &str) -> Option<Vec<String>> {
    let list = std::env::var("SKYRIVER_RDMA_DEVICES").unwrap_or_default();
    let names: Vec<String> = list.split_whitespace().map(str::to_string).collect();
    if names.is_empty() {
        common::skip::skip(
            test,
            &common::skip::RDMA_DEVICES,
            "SKYRIVER_RDMA_DEVICES is not set",
        );
        return None;
    }
    Some(names)
}

/// The daemons' directory (their logs `node-N.log`). When a test fails, its drop prints each
/// log's warnings and errors and its last lines: the guest's directories go with the VM.
struct ClusterDir {
    dir: tempfile::TempDir,
    nodes: u32,
}

impl ClusterDir {
    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for ClusterDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        const LAST_LINES: usize = 15;
        for n in 0..self.nodes {
            let Ok(log) = std::fs::read_to_string(self.path().join(format!("node-{n}.log"))) else {
                continue;
            };
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines.len().saturating_sub(LAST_LINES);
            // SKYRIVER_TEST_FULL_LOGS=1 prints every line.
            let full = std::env::var_os("SKYRIVER_TEST_FULL_LOGS").is_some();
            eprintln!("--- node-{n}.log: warnings, errors and its last {LAST_LINES} lines");
            for (i, line) in lines.iter().enumerate() {
                if full || i >= tail || line.contains("WARN") || line.contains("ERROR") {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// `nodes` verbs daemons (node 0 is the directory head) with this eager threshold.
fn cluster(
    test: &str,
    nodes: u32,
    eager_threshold: &str,
    extra: &[&str],
) -> Option<(ClusterDir, LocalCluster)> {
    let devices = devices(test)?;
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "96MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.fabric = "verbs".into();
    args.devices = devices;
    args.eager_threshold = eager_threshold.into();
    args.daemon_args = extra.iter().map(|s| s.to_string()).collect();
    // The start-up lines (which fabric, memory windows or not) are at info;
    // SKYRIVER_TEST_DAEMON_LOG sets another filter (e.g. `skyriver_transport=debug,info`).
    args.log = std::env::var("SKYRIVER_TEST_DAEMON_LOG").unwrap_or_else(|_| "info".into());
    if let Ok(gid) = std::env::var("SKYRIVER_RDMA_GID_INDEX") {
        args.daemon_args.push(format!("--gid-index={gid}"));
    }
    let started = Instant::now();
    let cluster = LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver")))
        .unwrap_or_else(|e| panic!("{test}: verbs cluster did not start: {e}"));
    eprintln!(
        "{test}: {nodes} verbs daemons on {} connected in {:?}",
        args.devices.join(","),
        started.elapsed()
    );
    Some((ClusterDir { dir, nodes }, cluster))
}

/// Seeded pseudo-random bytes, 8 at a time (the suite runs unoptimized on an emulated CPU).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// Where two byte strings first differ, for a readable failure.
fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    if got == want {
        return None;
    }
    Some(
        got.iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len())),
    )
}

fn fetch_every_size(test: &str, threshold: &str) {
    fetch_every_size_with(test, threshold, &[]);
}

fn fetch_every_size_with(test: &str, threshold: &str, daemon_args: &[&str]) {
    let Some((dir, cluster)) = cluster(test, 2, threshold, daemon_args) else {
        return;
    };
    // rxe has memory windows: unless told otherwise, every rendezvous below READs through
    // windows of its own.
    let windows = !daemon_args.contains(&"--no-memory-windows");
    let log = std::fs::read_to_string(dir.path().join("node-0.log")).unwrap();
    assert_eq!(
        log.contains("memory windows: each lease's READs reach only its object"),
        windows,
        "{test}: memory windows should be {}:\n{log}",
        if windows { "on" } else { "off" }
    );
    assert_eq!(
        log.contains("a connected peer can READ any arena byte"),
        !windows,
        "{test}: the daemon must warn when windows are off:\n{log}"
    );
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    let view = requester.nodes().unwrap();
    assert_eq!(view.fabric, "verbs");
    let link = &view
        .members
        .iter()
        .find(|m| m.node != view.node)
        .unwrap()
        .link;
    eprintln!("{test}: link {link}");
    for (n, &size) in SIZES.iter().enumerate() {
        let id = ObjectId::from_u64(1000 + n as u64);
        let data = pattern(n as u64 + 1, size);
        holder.create_and_seal(id, &data, b"meta").unwrap();
        let started = Instant::now();
        let object = requester.fetch_one(id, Some(FETCH_DEADLINE)).unwrap();
        let took = started.elapsed();
        assert_eq!(
            first_difference(object.data(), &data),
            None,
            "{test}: bytes of the {size}-byte object differ"
        );
        assert_eq!(object.metadata(), b"meta");
        drop(object);
        eprintln!("{test}: {size} bytes fetched and checked ({took:?})");
        assert!(requester.contains(id).unwrap());
        common::eventually("the new copy is published", || {
            requester.locate(id).unwrap().holders.len() == 2
        });
    }
    // And back: the requester's copies serve the holder after the holder deletes its own.
    let id = ObjectId::from_u64(1000 + SIZES.len() as u64 - 2);
    holder.delete(&[id]).unwrap();
    common::eventually("the holder's copy is gone", || {
        !holder.contains(id).unwrap()
    });
    let object = holder.fetch_one(id, Some(FETCH_DEADLINE)).unwrap();
    assert_eq!(
        first_difference(object.data(), &pattern(SIZES.len() as u64 - 1, 8 << 20)),
        None
    );
}

#[test]
fn fetch_every_size_with_the_automatic_threshold() {
    fetch_every_size("fetch_every_size_with_the_automatic_threshold", "auto");
}

#[test]
fn fetch_every_size_all_eager_as_far_as_slots_allow() {
    fetch_every_size("fetch_every_size_all_eager_as_far_as_slots_allow", "1GiB");
}

#[test]
fn fetch_every_size_all_rendezvous() {
    fetch_every_size("fetch_every_size_all_rendezvous", "0");
}

/// The fallback where a device has no memory windows: peers READ with the arenas' keys.
#[test]
fn fetch_every_size_all_rendezvous_without_memory_windows() {
    fetch_every_size_with(
        "fetch_every_size_all_rendezvous_without_memory_windows",
        "0",
        &["--no-memory-windows"],
    );
}

/// Many fetches at once from two requesters: many READs outstanding on several QPs, and
/// eager chunks interleaved with them.
#[test]
fn concurrent_fetches_across_three_daemons() {
    let test = "concurrent_fetches_across_three_daemons";
    let Some((_dir, cluster)) = cluster(test, 3, "auto", &[]) else {
        return;
    };
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let size_of = |n: usize| 37_000 * (n + 1) * (n + 1);
    let ids: Vec<ObjectId> = (0..10).map(|n| ObjectId::from_u64(5000 + n)).collect();
    for (n, id) in ids.iter().enumerate() {
        holder
            .create_and_seal(*id, &pattern(n as u64, size_of(n)), b"")
            .unwrap();
    }
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let socket = cluster.sockets[1 + t % 2].clone();
            let ids = ids.clone();
            std::thread::spawn(move || {
                let client = Client::connect(&socket).unwrap();
                let mut order: Vec<usize> = (0..ids.len()).collect();
                order.rotate_left(t * 3);
                for n in order {
                    let object = client.fetch_one(ids[n], Some(FETCH_DEADLINE)).unwrap();
                    assert_eq!(
                        first_difference(object.data(), &pattern(n as u64, size_of(n))),
                        None
                    );
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    for socket in &cluster.sockets[1..] {
        let requester = Client::connect(socket).unwrap();
        assert_eq!(
            requester.list().unwrap().len(),
            ids.len(),
            "one copy each, fetches coalesced"
        );
    }
}

/// Waits (bounded) until one of `holders` has pinned `id` for a transfer; returns its index.
fn wait_for_the_serving_holder(
    cluster: &LocalCluster,
    holders: &[usize],
    id: ObjectId,
) -> Option<usize> {
    let started = Instant::now();
    let clients: Vec<Client> = holders
        .iter()
        .map(|&n| Client::connect(&cluster.sockets[n]).unwrap())
        .collect();
    while started.elapsed() < Duration::from_secs(30) {
        for (client, &node) in clients.iter().zip(holders) {
            if client
                .list()
                .unwrap()
                .iter()
                .any(|o| o.info.id == id && o.pin_count > 0)
            {
                return Some(node);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Node 0 is the head; nodes 1 and 2 hold the object; node 3 fetches it by READs (rendezvous)
/// and the holder it reads from is SIGKILLed while the READs run.
#[test]
fn holder_killed_mid_read_the_fetch_completes_from_another_holder() {
    let test = "holder_killed_mid_read_the_fetch_completes_from_another_holder";
    let Some((_dir, mut cluster)) = cluster(test, 4, "0", &[]) else {
        return;
    };
    let id = ObjectId::from_u64(1);
    let size = 16 << 20;
    let data = pattern(7, size);
    Client::connect(&cluster.sockets[1])
        .unwrap()
        .create_and_seal(id, &data, b"")
        .unwrap();
    drop(
        Client::connect(&cluster.sockets[2])
            .unwrap()
            .fetch_one(id, Some(FETCH_DEADLINE))
            .unwrap(),
    );
    common::eventually("both copies are published", || {
        Client::connect(&cluster.sockets[3])
            .unwrap()
            .locate(id)
            .unwrap()
            .holders
            .len()
            == 2
    });
    let socket = cluster.sockets[3].clone();
    let fetcher = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let started = Instant::now();
        let result = client
            .fetch_one(id, Some(FETCH_DEADLINE))
            .map(|o| first_difference(o.data(), &data));
        (result, started.elapsed())
    });
    match wait_for_the_serving_holder(&cluster, &[1, 2], id) {
        Some(node) => {
            eprintln!("{test}: killing node {node}, which serves the READs");
            cluster.kill(node);
        }
        None => eprintln!("{test}: no holder pinned the object in time (finished already?)"),
    }
    let (result, took) = fetcher.join().unwrap();
    assert_eq!(result.unwrap(), None, "bytes intact");
    eprintln!("{test}: fetch completed in {took:?}");
}

/// Node 1 is the only holder and is SIGKILLed mid-READ: the fetch fails with a reason before
/// its deadline and leaves nothing behind, or (had it finished first) returns exact bytes.
#[test]
fn only_holder_killed_mid_read_the_fetch_fails_cleanly() {
    let test = "only_holder_killed_mid_read_the_fetch_fails_cleanly";
    let Some((_dir, mut cluster)) = cluster(test, 3, "0", &[]) else {
        return;
    };
    let id = ObjectId::from_u64(2);
    let size = 16 << 20;
    let data = pattern(3, size);
    Client::connect(&cluster.sockets[1])
        .unwrap()
        .create_and_seal(id, &data, b"")
        .unwrap();
    let deadline = Duration::from_secs(20);
    let socket = cluster.sockets[2].clone();
    let fetcher = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let started = Instant::now();
        let result = client
            .fetch_one(id, Some(deadline))
            .map(|o| first_difference(o.data(), &data));
        (result, started.elapsed())
    });
    if wait_for_the_serving_holder(&cluster, &[1], id).is_some() {
        cluster.kill(1);
    }
    let (result, took) = fetcher.join().unwrap();
    match result {
        Ok(difference) => assert_eq!(difference, None, "bytes intact"),
        Err(ClientError::Fetch(error)) => {
            assert!(
                took <= deadline + Duration::from_secs(1),
                "failed after its deadline: {took:?}"
            );
            eprintln!("{test}: fetch failed as expected after {took:?}: {error}");
            let requester = Client::connect(&cluster.sockets[2]).unwrap();
            assert!(
                requester.list().unwrap().is_empty(),
                "no partial object is left behind"
            );
            assert_eq!(requester.stats().unwrap().allocated_bytes, 0);
            // The requester still works: a fresh object from the head arrives intact.
            let other = ObjectId::from_u64(3);
            Client::connect(&cluster.sockets[0])
                .unwrap()
                .create_and_seal(other, &pattern(4, 3 << 20), b"")
                .unwrap();
            let object = requester.fetch_one(other, Some(FETCH_DEADLINE)).unwrap();
            assert_eq!(first_difference(object.data(), &pattern(4, 3 << 20)), None);
        }
        Err(other) => panic!("{other}"),
    }
}

/// Relay counters of node `n`: (leases it granted over its partial copy, transfers it pulled
/// from a relay).
fn relay_counters(cluster: &LocalCluster, n: usize) -> (u64, u64) {
    let counters = Client::connect(&cluster.sockets[n])
        .unwrap()
        .metrics()
        .unwrap()
        .counters;
    (counters.relay_leases, counters.relayed_transfers)
}

/// What one fetcher of a broadcast got: where its copy differs (`None`: exact), or why the
/// fetch failed, and when.
type BroadcastFetch = std::thread::JoinHandle<(Result<Option<usize>, ClientError>, Duration)>;

/// Nodes `fetchers` fetch `id` (whose bytes are `data`) at once.
fn broadcast(
    cluster: &LocalCluster,
    fetchers: std::ops::Range<usize>,
    id: ObjectId,
    data: &std::sync::Arc<Vec<u8>>,
) -> Vec<BroadcastFetch> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(fetchers.len()));
    fetchers
        .map(|n| {
            let socket = cluster.sockets[n].clone();
            let (start, data) = (start.clone(), data.clone());
            std::thread::spawn(move || {
                let client = Client::connect(&socket).unwrap();
                start.wait();
                let started = Instant::now();
                let result = client
                    .fetch_one(id, Some(FETCH_DEADLINE))
                    .map(|object| first_difference(object.data(), &data));
                (result, started.elapsed())
            })
        })
        .collect()
}

/// Broadcast through copies on verbs: node 1 holds a 16 MiB object and nodes 2–4 fetch it at
/// once. While the holder serves one of them, it sends the next to a requester still
/// receiving the object, whose fabric serves READs of its partial copy through memory windows.
/// Every copy is exact; some round goes through a relay (whether a request arrives while the
/// holder is busy depends on timing, so a few rounds are tried).
#[test]
fn a_broadcast_flows_through_relays_partial_copies() {
    const OBJECT_BYTES: usize = 16 << 20;
    const MAX_ROUNDS: u64 = 6;
    let test = "a_broadcast_flows_through_relays_partial_copies";
    let Some((_dir, cluster)) = cluster(test, 5, "0", &[]) else {
        return;
    };
    let holder = Client::connect(&cluster.sockets[1]).unwrap();
    let fetchers = 2..cluster.sockets.len();
    let served = || holder.metrics().unwrap().counters.bytes_served;
    for round in 0..MAX_ROUNDS {
        let id = ObjectId::from_u64(2600 + round);
        let data = std::sync::Arc::new(pattern(26 + round, OBJECT_BYTES));
        holder.create_and_seal(id, &data, b"").unwrap();
        let served_before = served();
        let before: Vec<(u64, u64)> = fetchers
            .clone()
            .map(|n| relay_counters(&cluster, n))
            .collect();
        let started = Instant::now();
        let fetches = broadcast(&cluster, fetchers.clone(), id, &data);
        for (n, fetch) in fetchers.clone().zip(fetches) {
            let (result, took) = fetch.join().unwrap();
            assert_eq!(result.unwrap(), None, "{test}: node {n}'s copy differs");
            eprintln!("{test}: round {round}: node {n} has its exact copy after {took:?}");
        }
        let holder_sent = served() - served_before;
        let (mut leases, mut relayed) = (0, 0);
        for (n, (leases_before, relayed_before)) in fetchers.clone().zip(before) {
            let (l, r) = relay_counters(&cluster, n);
            leases += l - leases_before;
            relayed += r - relayed_before;
        }
        eprintln!(
            "{test}: round {round}: {:?} in all; holder sent {holder_sent} bytes for {} \
             fetchers; {leases} relay leases granted, {relayed} transfers pulled from a relay",
            started.elapsed(),
            fetchers.len()
        );
        let fetcher_count = fetchers.len() as u64;
        if leases > 0 && relayed > 0 && holder_sent < fetcher_count * OBJECT_BYTES as u64 {
            return;
        }
    }
    panic!("{test}: no fetch went through a relay in {MAX_ROUNDS} rounds of a 3-node broadcast");
}

/// A relay SIGKILLed while it serves its partial copy over verbs: its readers' READs fail with
/// its connection, they fetch from the holder instead, and every other copy is exact (the
/// holder, whose READer died, goes on serving: see
/// `a_holder_whose_reader_dies_mid_read_goes_on_serving`).
#[test]
fn a_relay_killed_mid_broadcast_leaves_its_readers_to_the_holder() {
    const OBJECT_BYTES: usize = 16 << 20;
    const MAX_ROUNDS: u64 = 6;
    let test = "a_relay_killed_mid_broadcast_leaves_its_readers_to_the_holder";
    let Some((_dir, mut cluster)) = cluster(test, 6, "0", &[]) else {
        return;
    };
    let holder = Client::connect(&cluster.sockets[1]).unwrap();
    let fetchers = 2..cluster.sockets.len();
    for round in 0..MAX_ROUNDS {
        let id = ObjectId::from_u64(2700 + round);
        let data = std::sync::Arc::new(pattern(27 + round, OBJECT_BYTES));
        holder.create_and_seal(id, &data, b"").unwrap();
        let leases_before: Vec<u64> = fetchers
            .clone()
            .map(|n| relay_counters(&cluster, n).0)
            .collect();
        let fetches = broadcast(&cluster, fetchers.clone(), id, &data);
        // A node serving its partial copy (a lease granted this round) while still receiving
        // it, if one turns up.
        let mut victim = None;
        while victim.is_none() && !fetches.iter().all(|f| f.is_finished()) {
            victim = fetchers
                .clone()
                .zip(&leases_before)
                .find_map(|(n, &before)| {
                    let metrics = Client::connect(&cluster.sockets[n]).and_then(|c| c.metrics());
                    metrics
                        .is_ok_and(|m| {
                            m.counters.relay_leases > before && m.transfers_in_flight > 0
                        })
                        .then_some(n)
                });
        }
        let Some(victim) = victim else {
            for fetch in fetches {
                assert_eq!(fetch.join().unwrap().0.unwrap(), None);
            }
            eprintln!("{test}: round {round}: no relay caught mid-transfer");
            continue;
        };
        cluster.kill(victim);
        eprintln!("{test}: round {round}: relay node {victim} killed mid-broadcast");
        for (n, fetch) in fetchers.clone().zip(fetches) {
            let (result, took) = fetch.join().unwrap();
            if n != victim {
                assert_eq!(result.unwrap(), None, "{test}: node {n}'s copy differs");
                eprintln!("{test}: node {n} has its exact copy after {took:?}");
            }
        }
        return;
    }
    panic!("{test}: no node relayed mid-transfer in {MAX_ROUNDS} rounds of a 4-node broadcast");
}

/// A holder whose reader is SIGKILLed in the middle of its READs goes on serving: the next
/// fetch of the object from it completes with exact bytes, well within the time the daemons
/// give a request.
///
/// With memory windows, the holder's teardown of the dead reader's connection once destroyed
/// its queue pairs while the lease's type 2 windows were still bound to them; rxe then waits
/// about 100 s in `ibv_destroy_qp`, the verbs poller with it, and this fetch failed with
/// `NoReplyInTime`.
#[test]
fn a_holder_whose_reader_dies_mid_read_goes_on_serving() {
    let test = "a_holder_whose_reader_dies_mid_read_goes_on_serving";
    let Some((_dir, mut cluster)) = cluster(test, 3, "0", &[]) else {
        return;
    };
    let id = ObjectId::from_u64(9);
    let data = pattern(9, 16 << 20);
    Client::connect(&cluster.sockets[1])
        .unwrap()
        .create_and_seal(id, &data, b"")
        .unwrap();
    let socket = cluster.sockets[2].clone();
    let reader = std::thread::spawn(move || {
        // Killed below: its fetch fails (or had finished).
        let _ = Client::connect(&socket)
            .unwrap()
            .fetch_one(id, Some(FETCH_DEADLINE));
    });
    if wait_for_the_serving_holder(&cluster, &[1], id).is_some() {
        eprintln!("{test}: killing the reader mid-READ");
    }
    cluster.kill(2);
    reader.join().unwrap();
    let started = Instant::now();
    let object = Client::connect(&cluster.sockets[0])
        .unwrap()
        .fetch_one(id, Some(FETCH_DEADLINE))
        .unwrap();
    assert_eq!(first_difference(object.data(), &data), None);
    eprintln!(
        "{test}: fetched from the holder {:?} after its reader died",
        started.elapsed()
    );
}
