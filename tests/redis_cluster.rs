//! Daemons (the real binary) with Redis Cluster as their directory: six private
//! `redis-server`s (three masters, three replicas) on loopback ports. Objects of every size
//! class are fetched across three daemons, and fetches go on when a master is killed and its
//! replica takes over.
//!
//! Without `redis-server` 7 and `redis-cli` the tests print a skip line and pass, unless
//! `SKYRIVER_REQUIRE_REDIS` is set (CI sets it), in which case they fail.

mod common;
use common::pattern;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::skip;
use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, NodeId, ObjectId};

#[path = "../transport/tests/support/redis_cluster.rs"]
mod redis_cluster;
use redis_cluster::RedisCluster;

fn start(nodes: u32, redis: &RedisCluster) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "192MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.directory = Some(redis.url());
    args.cluster = Some("rc".into());
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

/// One object of each size class: inline, eager, chunked, large.
const SIZES: [usize; 6] = [1 << 10, 60 << 10, 256 << 10, 1 << 20, 8 << 20, 64 << 20];

#[test]
fn three_daemons_on_redis_cluster_fetch_objects_of_every_size() {
    let Some(redis) = RedisCluster::start("three_daemons_on_redis_cluster") else {
        return;
    };
    let (_dir, cluster) = start(3, &redis);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    for (n, &size) in SIZES.iter().enumerate() {
        let id = ObjectId::from_u64(5000 + n as u64);
        let data = pattern(n as u64, size);
        holder.create_and_seal(id, &data, b"meta").unwrap();
        // The second fetcher may get it from either holder.
        for (fetcher, holders) in [(1, 2), (2, 3)] {
            let client = Client::connect(&cluster.sockets[fetcher]).unwrap();
            let object = client.fetch_one(id, Some(Duration::from_secs(60))).unwrap();
            assert!(
                object.data() == &data[..],
                "bytes of the {size}-byte object differ on node {fetcher}"
            );
            assert_eq!(object.metadata(), b"meta");
            drop(object);
            common::eventually("the new copy is published", || {
                client.locate(id).unwrap().holders.len() == holders
            });
        }
    }
    let mut holders = Client::connect(&cluster.sockets[2])
        .unwrap()
        .locate(ObjectId::from_u64(5000))
        .unwrap()
        .holders;
    holders.sort();
    assert_eq!(holders, [NodeId(0), NodeId(1), NodeId(2)]);
}

#[test]
fn fetches_go_on_when_a_redis_cluster_master_is_killed() {
    let Some(mut redis) = RedisCluster::start("fetches_go_on_when_a_master_is_killed") else {
        return;
    };
    let (_dir, cluster) = start(2, &redis);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let ids: Vec<ObjectId> = (0..60).map(|n| ObjectId::from_u64(7000 + n)).collect();
    for (n, &id) in ids.iter().enumerate() {
        holder
            .create_and_seal(id, &pattern(n as u64, 4096), b"")
            .unwrap();
    }
    // The membership's master: every node's record and the token live there.
    let victim = redis.master_of("skyriver:{rc}:token");
    let socket = cluster.sockets[1].clone();
    let fetched = Arc::new(AtomicUsize::new(0));
    let fetched_by_thread = fetched.clone();
    let fetcher = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let mut failed_attempts = 0;
        for (n, &id) in ids.iter().enumerate() {
            let started = Instant::now();
            loop {
                match client.fetch_one(id, Some(Duration::from_secs(5))) {
                    Ok(object) => {
                        assert!(object.data() == &pattern(n as u64, 4096)[..]);
                        fetched_by_thread.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(error) => {
                        failed_attempts += 1;
                        assert!(
                            started.elapsed() < Duration::from_secs(45),
                            "{id} not fetched 45 s on: {error}"
                        );
                    }
                }
            }
            // Spread the fetches over the failover.
            std::thread::sleep(Duration::from_millis(50));
        }
        failed_attempts
    });
    // The kill lands while fetches are under way: some done, most still to come.
    common::eventually("the first fetches are done", || {
        fetched.load(Ordering::Relaxed) >= 5 || fetcher.is_finished()
    });
    let killed = Instant::now();
    redis.kill(victim);
    let failed_attempts = fetcher.join().expect("every object is fetched");
    eprintln!(
        "all fetched {} ms after the kill ({failed_attempts} failed attempts on the way)",
        killed.elapsed().as_millis()
    );
    // The directory is whole again: both daemons healthy, new objects found.
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    let fresh = ObjectId::from_u64(7999);
    holder.create_and_seal(fresh, b"after", b"").unwrap();
    let started = Instant::now();
    loop {
        match requester.fetch_one(fresh, Some(Duration::from_secs(5))) {
            Ok(object) => {
                assert_eq!(object.data(), b"after");
                break;
            }
            Err(error) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "a new object is not fetched after the failover: {error}"
            ),
        }
    }
}
