//! Copies of record on real daemons. `skyriver locate` tells them from cache copies: with the
//! built-in directory each copy is marked `record` or `cache` and the count wanted comes from
//! the registry; with Redis, which keeps no records, it says so and marks none. And a node
//! with a spill directory spills copies of record (never evicts them) to take more puts than
//! its memory holds.

mod common;

use common::{skip, within};

use std::process::Command;
use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, NodeId, ObjectId, ReplicaPolicy};

#[path = "../transport/tests/support/redis_server.rs"]
mod redis_server;
use redis_server::RedisServer;

fn start(nodes: u32, directory: Option<String>) -> (tempfile::TempDir, LocalCluster) {
    start_with(nodes, "64MiB", |args| args.directory = directory)
}

fn start_with(
    nodes: u32,
    memory: &str,
    tweak: impl FnOnce(&mut UpArgs),
) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        memory.parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    tweak(&mut args);
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

/// `skyriver locate [--json] id` on `socket`: its standard output.
fn locate(socket: &std::path::Path, id: ObjectId, json: bool) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_skyriver"));
    command
        .arg("locate")
        .arg("--socket")
        .arg(socket)
        .arg(id.to_string());
    if json {
        command.arg("--json");
    }
    let output = command.output().expect("runs");
    assert!(
        output.status.success(),
        "locate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[test]
fn locate_marks_copies_of_record_and_a_fetched_cache_copy() {
    let (_dir, cluster) = start(3, None);
    let origin = Client::connect(&cluster.sockets[1]).unwrap();
    let id = ObjectId::from_u64(0x51);
    let policy = ReplicaPolicy {
        copies: 2,
        wait_ms: Some(30_000),
    };
    origin
        .put_replicated(id, &common::pattern(1, 5000), b"", policy)
        .unwrap();
    let copies = origin.locate_copies(id).unwrap();
    let of_record = common::nodes_of_record(&copies);
    assert_eq!(of_record.len(), 2, "{copies:?}");
    // The node without a copy fetches one: a cache copy.
    let other = (0..3u32)
        .find(|&n| !of_record.contains(&NodeId(n)))
        .expect("three nodes, two copies");
    let reader = Client::connect(&cluster.sockets[other as usize]).unwrap();
    drop(reader.fetch_one(id, Some(Duration::from_secs(30))).unwrap());
    within(
        Duration::from_secs(20),
        "the cache copy is published",
        || reader.locate_copies(id).is_ok_and(|c| c.copies.len() == 3),
    );
    let text = locate(&cluster.sockets[other as usize], id, false);
    assert!(text.contains("2 of 2 copies of record"), "{text}");
    assert_eq!(text.matches("  record").count(), 2, "{text}");
    let cache_line = format!("  {}  domain -  cache", NodeId(other));
    assert!(text.contains(&cache_line), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&locate(&cluster.sockets[0], id, true)).expect("JSON");
    assert_eq!(json["wanted"], 2, "{json}");
    assert_eq!(json["copies_of_record"], 2, "{json}");
    assert_eq!(json["records_known"], true, "{json}");
    let cache: Vec<&serde_json::Value> = json["copies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["of_record"] == false)
        .collect();
    assert_eq!(cache.len(), 1, "{json}");
    assert_eq!(cache[0]["node"], other, "{json}");
}

#[test]
fn with_redis_locate_says_it_keeps_no_copies_of_record() {
    let Some(redis) = RedisServer::start("copies_of_record with_redis") else {
        return;
    };
    let (_dir, cluster) = start(2, Some(redis.url()));
    let client = Client::connect(&cluster.sockets[0]).unwrap();
    let id = ObjectId::from_u64(0x52);
    let policy = ReplicaPolicy {
        copies: 2,
        wait_ms: None,
    };
    client
        .put_replicated(id, &common::pattern(2, 5000), b"", policy)
        .unwrap();
    let text = locate(&cluster.sockets[0], id, false);
    // Nothing would make the other copy: the count is not kept as wanted.
    assert!(!text.contains("wants"), "{text}");
    assert!(text.contains("the directory is Redis"), "{text}");
    let copy_line = format!("  {}  domain -", NodeId(0));
    assert_eq!(text.lines().nth(1), Some(&copy_line[..]), "no mark: {text}");
    let json: serde_json::Value =
        serde_json::from_str(&locate(&cluster.sockets[0], id, true)).expect("JSON");
    assert_eq!(json["records_known"], false, "{json}");
    assert!(json["copies"][0]["of_record"].is_null(), "{json}");
}

#[test]
fn a_node_full_of_copies_of_record_spills_them_and_takes_more_puts() {
    let spill = common::test_dir();
    let spill_dir = spill.path().to_path_buf();
    let (_dir, cluster) = start_with(2, "16MiB", |args| args.spill_dir = Some(spill_dir));
    let client = Client::connect(&cluster.sockets[1]).unwrap();
    let policy = ReplicaPolicy {
        copies: 2,
        wait_ms: Some(30_000),
    };
    // Five objects of 6 MiB, each a copy of record on both nodes: 30 MiB, in 16 MiB of memory.
    let objects: Vec<(ObjectId, Vec<u8>)> = (0..5u64)
        .map(|n| (ObjectId::from_u64(0x60 + n), common::pattern(n, 6 << 20)))
        .collect();
    for (id, data) in &objects {
        client
            .put_replicated(*id, data, b"", policy)
            .unwrap_or_else(|e| panic!("put of {id}: {e}"));
    }
    for node in [0usize, 1] {
        let client = Client::connect(&cluster.sockets[node]).unwrap();
        let stats = client.stats().unwrap();
        assert!(stats.spill.spilled_objects > 0, "node {node}: {stats:?}");
        assert_eq!(
            stats.evicted_objects_total, 0,
            "node {node}: nothing forgotten"
        );
        for (id, data) in &objects {
            let object = client
                .get_one(*id, Some(Duration::from_secs(30)))
                .unwrap_or_else(|e| panic!("get of {id} on node {node}: {e}"));
            assert!(object.data() == &data[..], "bytes of {id} on node {node}");
        }
    }
    let copies = client.locate_copies(objects[0].0).unwrap();
    assert_eq!(copies.copies.iter().filter(|c| c.of_record).count(), 2);
}
