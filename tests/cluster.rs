//! Several daemons on this machine form a cluster (built-in directory, TCP fabric) and fetch
//! objects of every size class from each other.

mod common;
use common::pattern;

use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ClientError, FetchError, NodeId, ObjectId, TransferMode};

fn cluster(nodes: u32, eager_threshold: &str) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "192MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.eager_threshold = eager_threshold.into();
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

const SIZES: [usize; 6] = [1 << 10, 60 << 10, 256 << 10, 1 << 20, 8 << 20, 64 << 20];

fn fetch_every_size(threshold: &str) {
    let (_dir, cluster) = cluster(2, threshold);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    for (n, &size) in SIZES.iter().enumerate() {
        let id = ObjectId::from_u64(1000 + n as u64);
        let data = pattern(n as u64, size);
        holder.create_and_seal(id, &data, b"meta").unwrap();
        let object = requester
            .fetch_one(id, Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(object.data().len(), size);
        assert!(
            object.data() == &data[..],
            "bytes of {size}-byte object differ"
        );
        assert_eq!(object.metadata(), b"meta");
        drop(object);
        // The copy is now local: an ordinary get sees it, and the directory lists both nodes.
        assert!(requester.contains(id).unwrap());
        common::eventually("the new copy is published", || {
            requester.locate(id).unwrap().holders.len() == 2
        });
    }
}

#[test]
fn fetch_every_size_with_the_automatic_threshold() {
    fetch_every_size("auto");
}

#[test]
fn fetch_every_size_all_eager_as_far_as_slots_allow() {
    fetch_every_size("1GiB");
}

#[test]
fn fetch_every_size_all_rendezvous() {
    fetch_every_size("0");
}

#[test]
fn concurrent_fetches_of_the_same_and_different_objects() {
    let (_dir, cluster) = cluster(3, "auto");
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let ids: Vec<ObjectId> = (0..12).map(|n| ObjectId::from_u64(5000 + n)).collect();
    for (n, id) in ids.iter().enumerate() {
        holder
            .create_and_seal(*id, &pattern(n as u64, 100_000 * (n + 1)), b"")
            .unwrap();
    }
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let socket = cluster.sockets[1 + t % 2].clone();
            let ids = ids.clone();
            std::thread::spawn(move || {
                let client = Client::connect(&socket).unwrap();
                // Every thread asks for all objects, in a different order.
                let mut order = ids.clone();
                order.rotate_left(t * 2);
                for id in order {
                    let n = ids.iter().position(|x| *x == id).unwrap();
                    let object = client.fetch_one(id, Some(Duration::from_secs(60))).unwrap();
                    assert!(object.data() == &pattern(n as u64, 100_000 * (n + 1))[..]);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    assert_eq!(
        requester.list().unwrap().len(),
        ids.len(),
        "one copy each, fetches coalesced"
    );
}

#[test]
fn fetch_of_a_missing_object_fails_at_once_not_at_its_deadline() {
    let (_dir, cluster) = cluster(2, "auto");
    let client = Client::connect(&cluster.sockets[1]).unwrap();
    let started = std::time::Instant::now();
    let error = client
        .fetch_one(ObjectId::from_u64(404), Some(Duration::from_secs(30)))
        .unwrap_err();
    assert!(
        matches!(error, ClientError::Fetch(FetchError::NotFound { .. })),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?} of a 30 s deadline",
        started.elapsed()
    );
    // Asked to wait for a publication, it waits until its deadline instead.
    let started = std::time::Instant::now();
    let results = client
        .fetch_waiting(&[ObjectId::from_u64(405)], Some(Duration::from_millis(700)))
        .unwrap();
    assert!(
        matches!(results[0], Err(FetchError::NotFound { .. })),
        "{:?}",
        results[0].as_ref().err()
    );
    assert!(started.elapsed() >= Duration::from_millis(700));
}

#[test]
fn fetch_on_a_daemon_in_no_cluster_says_so_at_once() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    client
        .create_and_seal(ObjectId::from_u64(1), b"here", b"")
        .unwrap();
    let started = std::time::Instant::now();
    let results = client
        .fetch(
            &[ObjectId::from_u64(1), ObjectId::from_u64(2)],
            Some(Duration::from_secs(30)),
        )
        .unwrap();
    assert_eq!(results[0].as_ref().unwrap().data(), b"here");
    let error = results[1].as_ref().unwrap_err();
    assert!(matches!(error, FetchError::NoCluster { .. }), "{error}");
    assert!(error.to_string().contains("--head"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_fetch_waits_for_an_object_sealed_later_elsewhere() {
    let (_dir, cluster) = cluster(2, "auto");
    let socket = cluster.sockets[1].clone();
    let waiter = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        client
            .fetch_waiting(&[ObjectId::from_u64(77)], Some(Duration::from_secs(30)))
            .unwrap()
            .pop()
            .unwrap()
            .map(|o| o.data().to_vec())
    });
    // Node 1 holds the fetch before anyone has the object: the seal on node 0 answers it.
    let fetcher = Client::connect(&cluster.sockets[1]).unwrap();
    common::eventually("the fetch waits on node 1", || {
        fetcher.metrics().unwrap().fetches_waiting == 1
    });
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    holder
        .create_and_seal(ObjectId::from_u64(77), b"published later", b"")
        .unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"published later");
}

#[test]
fn nodes_lists_every_member_connected() {
    let (_dir, cluster) = cluster(3, "auto");
    let view = Client::connect(&cluster.sockets[2])
        .unwrap()
        .nodes()
        .unwrap();
    assert_eq!(view.node, NodeId(2));
    assert_eq!(view.fabric, "tcp");
    let nodes: Vec<u32> = view.members.iter().map(|m| m.node.0).collect();
    assert_eq!(nodes, vec![0, 1, 2]);
    assert!(view.members.iter().all(|m| m.connected));
    let (ok, stdout, _) = common::cli(&cluster.sockets[0], &["nodes"], None);
    assert!(ok);
    let text = String::from_utf8(stdout).unwrap();
    assert!(
        text.contains("node-2") && text.contains("eager threshold"),
        "{text}"
    );
}

#[test]
fn every_forced_mode_moves_the_exact_bytes() {
    let (_dir, cluster) = cluster(2, "auto");
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    // Below the TCP threshold (about 100 KiB), above it but within the receive slots, and
    // beyond what the slots carry.
    for (n, size) in [(1u64, 1000usize), (2, 200 << 10), (3, 3 << 20)] {
        let id = ObjectId::from_u64(3000 + n);
        let data = pattern(n, size);
        holder.create_and_seal(id, &data, b"m").unwrap();
        for mode in TransferMode::ALL {
            let mut results = requester
                .fetch_in_mode(&[id], Some(Duration::from_secs(30)), mode)
                .unwrap();
            let object = results.pop().unwrap().unwrap();
            assert!(object.data() == &data[..], "{size} bytes in {mode} mode");
            assert_eq!(object.metadata(), b"m");
            drop(object);
            requester.flush().unwrap();
            requester.delete(&[id]).unwrap();
        }
    }
    let id = ObjectId::from_u64(3001).to_string();
    let (ok, stdout, _) = common::cli(
        &cluster.sockets[1],
        &["fetch", "--mode", "rendezvous", &id],
        None,
    );
    assert!(ok);
    assert!(String::from_utf8(stdout).unwrap().contains(&id));
    let (ok, _, stderr) = common::cli(&cluster.sockets[1], &["fetch", "--mode", "fast", &id], None);
    assert!(!ok);
    assert!(
        stderr.contains("expected auto, eager or rendezvous"),
        "{stderr}"
    );
}

#[test]
fn a_remembered_location_of_a_replaced_object_is_not_trusted() {
    let (_dir, cluster) = cluster(2, "auto");
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    let id = ObjectId::from_u64(4000);
    holder.create_and_seal(id, b"first version", b"").unwrap();
    let object = requester
        .fetch_one(id, Some(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(object.data(), b"first version");
    drop(object);
    requester.flush().unwrap();
    requester.delete(&[id]).unwrap();
    // The holder replaces the object with one of another size: the requester's remembered
    // sizes are wrong now, and the fetch must still bring the new bytes.
    holder.delete(&[id]).unwrap();
    let replacement = pattern(9, 300 << 10);
    holder.create_and_seal(id, &replacement, b"").unwrap();
    let object = requester
        .fetch_one(id, Some(Duration::from_secs(30)))
        .unwrap();
    assert!(object.data() == &replacement[..]);
}
