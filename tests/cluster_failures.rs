//! What happens to fetches when daemons die, the directory goes away, peers misbehave or the
//! requester's store is full. Each failure has a defined outcome, and no sealed object is lost.

mod common;

use std::time::{Duration, Instant};

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ClientError, FetchError, ObjectId, StoreError};

fn start(
    nodes: u32,
    memory: &str,
    extra: &[&str],
    directory: Option<String>,
) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        memory.parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.daemon_args = extra.iter().map(|s| s.to_string()).collect();
    args.directory = directory;
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Waits until the fetching node has a transfer under way (or the fetch already ended, which
/// a fast machine may manage): the kill that follows lands mid-transfer, not before it.
fn transfer_started<T>(fetching_node: &std::path::Path, fetcher: &std::thread::JoinHandle<T>) {
    let client = Client::connect(fetching_node).unwrap();
    common::eventually("the transfer starts", || {
        fetcher.is_finished() || client.metrics().unwrap().transfers_in_flight > 0
    });
}

#[test]
fn holder_killed_mid_transfer_the_fetch_completes_from_another_holder() {
    // Node 0 is the head (directory); nodes 1 and 2 hold the object; node 3 fetches it.
    let (_dir, mut cluster) = start(4, "512MiB", &[], None);
    let id = ObjectId::from_u64(1);
    let data = bytes(7, 256 << 20);
    Client::connect(&cluster.sockets[1])
        .unwrap()
        .create_and_seal(id, &data, b"")
        .unwrap();
    drop(
        Client::connect(&cluster.sockets[2])
            .unwrap()
            .fetch_one(id, Some(Duration::from_secs(60)))
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
            .fetch_one(id, Some(Duration::from_secs(60)))
            .map(|o| o.data() == &bytes(7, 256 << 20)[..]);
        (result, started.elapsed())
    });
    // Kill one holder while the transfer runs (whichever one it picked, a copy remains).
    transfer_started(&cluster.sockets[3], &fetcher);
    cluster.kill(1);
    let (result, took) = fetcher.join().unwrap();
    assert!(result.unwrap(), "bytes intact");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn only_holder_killed_mid_transfer_the_fetch_fails_cleanly_before_its_deadline() {
    // Node 0 is the head; node 1 is the only holder; node 2 fetches.
    let (_dir, mut cluster) = start(3, "512MiB", &[], None);
    let id = ObjectId::from_u64(2);
    Client::connect(&cluster.sockets[1])
        .unwrap()
        .create_and_seal(id, &bytes(3, 256 << 20), b"")
        .unwrap();
    let socket = cluster.sockets[2].clone();
    let fetcher = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let started = Instant::now();
        let result = client
            .fetch_one(id, Some(Duration::from_secs(8)))
            .map(|o| o.data().len());
        (result, started.elapsed())
    });
    transfer_started(&cluster.sockets[2], &fetcher);
    cluster.kill(1);
    let (result, took) = fetcher.join().unwrap();
    // Either the copy made it before the kill, or the fetch reports why it could not.
    match result {
        Ok(len) => assert_eq!(len, 256 << 20),
        Err(ClientError::Fetch(error)) => {
            assert!(
                took <= Duration::from_secs(9),
                "failed after its deadline: {took:?}"
            );
            eprintln!("fetch failed as expected: {error}");
            let requester = Client::connect(&cluster.sockets[2]).unwrap();
            assert!(
                requester.list().unwrap().is_empty(),
                "no partial object is left behind"
            );
            assert_eq!(requester.stats().unwrap().allocated_bytes, 0);
        }
        Err(other) => panic!("{other}"),
    }
}

#[test]
fn requester_killed_the_holder_lease_expires_and_unpins() {
    let (_dir, mut cluster) = start(3, "512MiB", &["--lease-ms=1500"], None);
    let id = ObjectId::from_u64(3);
    let holder = Client::connect(&cluster.sockets[1]).unwrap();
    holder
        .create_and_seal(id, &bytes(1, 256 << 20), b"")
        .unwrap();
    let socket = cluster.sockets[2].clone();
    std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let _ = client.fetch_one(id, Some(Duration::from_secs(30)));
    });
    common::eventually("the holder pinned the object for the transfer", || {
        holder
            .list()
            .unwrap()
            .iter()
            .any(|o| o.info.id == id && o.pin_count > 0)
    });
    cluster.kill(2);
    let started = Instant::now();
    common::eventually("the lease expired", || {
        holder.list().unwrap()[0].pin_count == 0
    });
    assert!(started.elapsed() < Duration::from_secs(8));
    // Unpinned: it can be deleted at once.
    assert_eq!(holder.delete(&[id]).unwrap(), vec![Ok(())]);
}

#[test]
fn a_requester_without_room_fails_with_out_of_memory_and_writes_nothing() {
    let (_dir, cluster) = start(2, "64MiB", &[], None);
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    let big = ObjectId::from_u64(4);
    holder
        .create_and_seal(big, &bytes(2, 40 << 20), b"")
        .unwrap();
    // The requester's memory is held by its own client.
    requester
        .create_and_seal(ObjectId::from_u64(5), &bytes(9, 40 << 20), b"")
        .unwrap();
    let _held = requester.get_one(ObjectId::from_u64(5), None).unwrap();
    let error = requester
        .fetch_one(big, Some(Duration::from_secs(5)))
        .unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Fetch(FetchError::Store(StoreError::OutOfMemory { .. }))
        ),
        "{error}"
    );
    let objects = requester.list().unwrap();
    assert_eq!(objects.len(), 1, "no partial copy: {objects:?}");
}

#[test]
fn garbage_on_a_fabric_port_leaves_the_daemon_unharmed() {
    use std::io::{Read, Write};
    let (_dir, cluster) = start(2, "64MiB", &[], None);
    let client = Client::connect(&cluster.sockets[0]).unwrap();
    let view = client.nodes().unwrap();
    let address = &view
        .members
        .iter()
        .find(|m| m.node == view.node)
        .unwrap()
        .address;
    for garbage in [
        &[0xffu8; 64][..],
        &[200, 0, 0, 0, 1, 2, 3][..],
        b"GET / HTTP/1.1\r\n\r\n",
    ] {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(garbage).unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    }
    let id = ObjectId::from_u64(6);
    client.create_and_seal(id, b"fine", b"").unwrap();
    let other = Client::connect(&cluster.sockets[1]).unwrap();
    assert_eq!(
        other
            .fetch_one(id, Some(Duration::from_secs(10)))
            .unwrap()
            .data(),
        b"fine"
    );
}

#[test]
fn redis_directory_cluster_fetches_and_survives_a_redis_outage() {
    let Some(mut redis) = common::RedisServer::start("redis_directory_cluster") else {
        return;
    };
    let (_dir, cluster) = start(2, "128MiB", &[], Some(redis.url()));
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    for (n, size) in [(10u64, 1000usize), (11, 4 << 20)] {
        holder
            .create_and_seal(ObjectId::from_u64(n), &bytes(n as u8, size), b"")
            .unwrap();
        let object = requester
            .fetch_one(ObjectId::from_u64(n), Some(Duration::from_secs(30)))
            .unwrap();
        assert!(object.data() == &bytes(n as u8, size)[..]);
    }
    redis.stop();
    // Local objects are still served, and the daemons say the directory is gone.
    holder
        .create_and_seal(ObjectId::from_u64(12), b"local", b"")
        .unwrap();
    assert_eq!(
        holder.get_one(ObjectId::from_u64(12), None).unwrap().data(),
        b"local"
    );
    common::eventually("the outage is reported", || {
        !requester.nodes().unwrap().directory_healthy
    });
    let started = Instant::now();
    let error = requester
        .fetch_one(ObjectId::from_u64(12), Some(Duration::from_secs(10)))
        .unwrap_err();
    assert!(matches!(error, ClientError::Fetch(_)), "{error}");
    assert!(started.elapsed() < Duration::from_secs(11));
}

#[test]
fn redis_a_cleanly_stopped_node_is_gone_from_the_directory_at_once() {
    let Some(redis) = common::RedisServer::start("redis_cleanly_stopped_node") else {
        return;
    };
    let (_dir, mut cluster) = start(3, "64MiB", &[], Some(redis.url()));
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let id = ObjectId::from_u64(7);
    holder.create_and_seal(id, b"held twice", b"").unwrap();
    let copy = Client::connect(&cluster.sockets[1]).unwrap();
    drop(copy.fetch_one(id, Some(Duration::from_secs(30))).unwrap());
    let third = Client::connect(&cluster.sockets[2]).unwrap();
    let holders = |client: &Client| {
        let mut holders = client.locate(id).unwrap().holders;
        holders.sort();
        holders
    };
    // The fetched copy is published after the fetch's reply, on its way to Redis.
    common::eventually("node-1's copy is published", || {
        holders(&third) == vec![skyriver_client::NodeId(0), skyriver_client::NodeId(1)]
    });
    drop(copy);
    // Well within the node record's TTL (5 s): only a clean leave explains its absence.
    let stopped = Instant::now();
    cluster.stop_node(1);
    assert_eq!(holders(&third), vec![skyriver_client::NodeId(0)]);
    assert!(stopped.elapsed() < Duration::from_secs(4));
    let fetched = third.fetch_one(id, Some(Duration::from_secs(10))).unwrap();
    assert_eq!(fetched.data(), b"held twice");
}

#[test]
fn a_duplicate_node_id_waits_with_one_log_line_not_one_per_retry() {
    let dir = common::test_dir();
    let port = skyriver::up::free_loopback_port().unwrap();
    let head_addr = format!("127.0.0.1:{port}");
    let daemon = |name: &str, role: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args([
                "daemon",
                "--memory",
                "32MiB",
                "--no-prefault",
                "--fabric",
                "tcp",
            ])
            .args(["--listen", "127.0.0.1:0", "--node-id", "0", "--log", "info"])
            .arg("--socket")
            .arg(dir.path().join(name))
            .args(role)
            .env("SKYRIVER_CLUSTER_TOKEN", "duplicate-test")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _head = Reaped(daemon("head.sock", &["--head", &head_addr]));
    let head_socket = dir.path().join("head.sock");
    common::eventually("the head is up", || Client::connect(&head_socket).is_ok());
    let twin = daemon("twin.sock", &["--join", &head_addr]);
    // The twin is refused for its node id for the whole join timeout, then gives up.
    let output = twin.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("already a member"), "{stderr}");
    let waiting = stderr
        .lines()
        .filter(|l| l.contains("refused this node for now"))
        .count();
    assert_eq!(waiting, 1, "{stderr}");
}
