//! Objects put with `replicas = 2` outlive the node they were put on: four daemons on loopback
//! (node 0 serves the directory), objects put on node 1 with two copies, node 1 killed with
//! SIGKILL; every object is still fetchable with its bytes, and repair brings each back to two
//! live copies. Namespaces are not needed: killing a daemon is the failure under test, and each
//! daemon is a process of its own.

mod common;

use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, NodeId, ObjectId, ReplicaPolicy, StoreError};

fn start(nodes: u32, extra: &[&str]) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "256MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.daemon_args = extra.iter().map(|s| s.to_string()).collect();
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Polls `condition` every 20 ms until it holds, failing after `limit` with `what`.
fn within(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !condition() {
        assert!(started.elapsed() < limit, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn copy_nodes(client: &Client, id: ObjectId) -> Vec<NodeId> {
    let mut nodes: Vec<NodeId> = client
        .locate_copies(id)
        .map(|c| c.copies.into_iter().map(|c| c.node).collect())
        .unwrap_or_default();
    nodes.sort();
    nodes
}

#[test]
fn objects_put_with_two_replicas_survive_their_node_and_are_repaired() {
    let (_dir, mut cluster) = start(4, &[]);
    // Inline puts and create/seal puts, small to a few MiB.
    let sizes = [1000usize, 64 << 10, 1 << 20, 3 << 20, 100, 200_000];
    let objects: Vec<(ObjectId, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| (ObjectId::from_u64(100 + i as u64), bytes(i as u8, len)))
        .collect();
    let node_a = Client::connect(&cluster.sockets[1]).unwrap();
    let two_and_wait = ReplicaPolicy {
        copies: 2,
        wait_ms: Some(30_000),
    };
    for (id, data) in &objects {
        node_a
            .put_replicated(*id, data, b"", two_and_wait)
            .expect("the put returns once both copies are sealed");
    }
    let observer = Client::connect(&cluster.sockets[0]).unwrap();
    for (id, _) in &objects {
        let nodes = copy_nodes(&observer, *id);
        assert_eq!(
            nodes.len(),
            2,
            "two copies of {id} at the put's return: {nodes:?}"
        );
        assert!(nodes.contains(&NodeId(1)));
    }
    drop(node_a);

    cluster.kill(1);

    // Repair: every object is back to two live copies, none on the dead node.
    within(
        Duration::from_secs(30),
        "every object has two copies again",
        || {
            objects.iter().all(|(id, _)| {
                let nodes = copy_nodes(&observer, *id);
                nodes.len() == 2 && !nodes.contains(&NodeId(1))
            })
        },
    );
    let copies_of_record: u64 = [0usize, 2, 3]
        .iter()
        .map(|&n| {
            Client::connect(&cluster.sockets[n])
                .unwrap()
                .metrics()
                .unwrap()
                .copies_of_record
        })
        .sum();
    assert_eq!(copies_of_record, 2 * objects.len() as u64);
    // And every object is fetchable, with its bytes, from every live node.
    for node in [0usize, 2, 3] {
        let client = Client::connect(&cluster.sockets[node]).unwrap();
        for (id, data) in &objects {
            let object = client
                .fetch_one(*id, Some(Duration::from_secs(30)))
                .unwrap_or_else(|e| panic!("fetch of {id} on node {node}: {e}"));
            assert!(object.data() == &data[..], "bytes of {id} on node {node}");
        }
    }
}

#[test]
fn a_put_that_waits_for_more_copies_than_nodes_fails_naming_the_copies_and_delete_reaches_all() {
    let (_dir, _cluster_guard) = start(2, &["--replicas", "2"]);
    let cluster = &_cluster_guard;
    let client = Client::connect(&cluster.sockets[1]).unwrap();
    let id = ObjectId::from_u64(7);
    let error = client
        .put_replicated(
            id,
            &bytes(1, 5000),
            b"",
            ReplicaPolicy {
                copies: 3,
                wait_ms: Some(500),
            },
        )
        .unwrap_err();
    match error {
        skyriver_client::ClientError::Store(StoreError::TooFewReplicas {
            copies: 2,
            wanted: 3,
            ..
        }) => {}
        other => panic!("expected TooFewReplicas with 2 of 3 copies, got {other}"),
    }
    // The daemon default (--replicas 2) applies to a put that names no count.
    let plain = ObjectId::from_u64(8);
    client
        .put_replicated(
            plain,
            &bytes(2, 5000),
            b"",
            ReplicaPolicy {
                copies: 0,
                wait_ms: Some(30_000),
            },
        )
        .unwrap();
    let head = Client::connect(&cluster.sockets[0]).unwrap();
    assert_eq!(copy_nodes(&head, plain), vec![NodeId(0), NodeId(1)]);
    // A delete on one node removes every copy.
    client.delete(&[id]).unwrap();
    within(Duration::from_secs(10), "the other copy is deleted", || {
        !head.contains(id).unwrap()
    });
    assert!(copy_nodes(&head, id).is_empty());
}
