//! Fetches with a location hint on real daemons (built-in directory, TCP fabric): the named
//! holder is asked first; a wrong name costs a round trip, then the directory finds the object.

mod common;

use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ObjectId};

fn cluster(nodes: u32) -> (tempfile::TempDir, LocalCluster) {
    cluster_with(nodes, &[])
}

fn cluster_with(nodes: u32, daemon_args: &[&str]) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "64MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.daemon_args = daemon_args.iter().map(|a| a.to_string()).collect();
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// (hinted fetches, wrong hints) of the node behind `client`.
fn hint_counters(client: &Client) -> (u64, u64) {
    let counters = client.metrics().unwrap().counters;
    (counters.hinted_fetches, counters.wrong_hints)
}

#[test]
fn fetch_from_the_holder_and_from_a_wrong_node() {
    let (_dir, cluster) = cluster(3);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[2]).unwrap();
    let holder_node = holder.nodes().unwrap().node;
    let other_node = Client::connect(&cluster.sockets[1])
        .unwrap()
        .nodes()
        .unwrap()
        .node;
    // Small (eager) and large (rendezvous) objects.
    let (small, large) = (ObjectId::from_u64(8101), ObjectId::from_u64(8102));
    let (small_bytes, large_bytes) = (bytes(1, 1000), bytes(2, 3 << 20));
    holder.create_and_seal(small, &small_bytes, b"").unwrap();
    holder.create_and_seal(large, &large_bytes, b"").unwrap();

    // The CLI, hinted at the holder, as `skyriver nodes` names it.
    let from = holder_node.to_string();
    let (ok, stdout, stderr) = common::cli(
        &cluster.sockets[2],
        &["fetch", "--from", &from, "-o", "-", &small.to_string()],
        None,
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, small_bytes);
    assert_eq!(
        hint_counters(&requester),
        (1, 0),
        "asked the holder directly"
    );

    // The client library, hinted at a node without the object: still the right bytes.
    let timeout = Some(Duration::from_secs(30));
    let mut results = requester.fetch_from(&[large], timeout, other_node).unwrap();
    let object = results.pop().unwrap().unwrap();
    assert!(object.data() == &large_bytes[..]);
    assert_eq!(
        hint_counters(&requester),
        (2, 1),
        "the wrong hint was noticed"
    );
    drop(object);

    // A bare number works too; a bad one is refused before anything is asked.
    let (ok, _, stderr) = common::cli(
        &cluster.sockets[1],
        &[
            "fetch",
            "--from",
            &holder_node.0.to_string(),
            &large.to_string(),
        ],
        None,
    );
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = common::cli(
        &cluster.sockets[1],
        &["fetch", "--from", "node-x", &large.to_string()],
        None,
    );
    assert!(!ok);
    assert!(stderr.contains("is not a node"), "{stderr}");
}

/// An id a client draws for a put (`new_object_id`, what `skyriver put` and Python's `put`
/// without an id use) names its node, so another node fetches it from there at once.
#[test]
fn an_id_drawn_for_a_put_leads_other_nodes_to_its_node() {
    let (_dir, cluster) = cluster(3);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[2]).unwrap();
    let id = holder.new_object_id();
    assert_eq!(id.owner(), Some(holder.node()));
    let data = bytes(3, 1000);
    holder.create_and_seal(id, &data, b"").unwrap();
    let timeout = Some(Duration::from_secs(30));
    let object = requester.fetch_one(id, timeout).unwrap();
    assert!(object.data() == &data[..]);
    assert_eq!(hint_counters(&requester), (1, 0), "asked the id's node");
    drop(object);

    // `skyriver put` without an id prints one that names the node it put on.
    let input = common::test_dir();
    let file = input.path().join("payload");
    std::fs::write(&file, bytes(4, 5000)).unwrap();
    let (ok, stdout, stderr) =
        common::cli(&cluster.sockets[1], &["put", file.to_str().unwrap()], None);
    assert!(ok, "{stderr}");
    let printed: ObjectId = String::from_utf8(stdout).unwrap().trim().parse().unwrap();
    let putter = Client::connect(&cluster.sockets[1]).unwrap();
    assert_eq!(printed.owner(), Some(putter.node()));
    let object = requester.fetch_one(printed, timeout).unwrap();
    assert!(object.data() == &bytes(4, 5000)[..]);
    assert_eq!(hint_counters(&requester), (2, 0));
}

/// With `--learn-locations` the head tells every node where each object put elsewhere is, so
/// the first fetch of an id that names no node goes straight to its holder.
#[test]
fn learned_locations_send_a_first_fetch_of_any_id_to_its_holder() {
    let (_dir, cluster) = cluster_with(3, &["--learn-locations"]);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[2]).unwrap();
    // Ids of the program's own making: they name no node.
    let (small, large) = (ObjectId::from_u64(8301), ObjectId::from_u64(8302));
    assert_eq!(small.owner(), None);
    let (small_bytes, large_bytes) = (bytes(5, 1000), bytes(6, 3 << 20));
    holder.create_and_seal(small, &small_bytes, b"").unwrap();
    holder.create_and_seal(large, &large_bytes, b"").unwrap();
    let counters = |client: &Client| client.metrics().unwrap().counters;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while counters(&requester).locations_learned < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the head never pushed the locations"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let timeout = Some(Duration::from_secs(30));
    for (id, data) in [(small, &small_bytes), (large, &large_bytes)] {
        let object = requester.fetch_one(id, timeout).unwrap();
        assert!(object.data() == &data[..]);
    }
    let after = counters(&requester);
    assert_eq!(
        (after.location_cache_hits, after.stale_locations),
        (2, 0),
        "both went straight to the holder"
    );
    assert_eq!(
        counters(&holder).locations_learned,
        0,
        "nobody else put anything"
    );

    // Not without a cluster, and not with Redis (which pushes no locations).
    let dir = common::test_dir();
    for extra in [
        &[][..],
        &["--directory", "redis://127.0.0.1:1", "--node-id", "1"][..],
    ] {
        let socket = dir.path().join("refused.sock");
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args(["daemon", "--memory", "16MiB", "--socket"])
            .arg(&socket)
            .arg("--learn-locations")
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains("--learn-locations needs the built-in directory"),
            "{stderr}"
        );
    }
}
