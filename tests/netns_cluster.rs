//! A cluster whose nodes are network namespaces joined by shaped veth links: fetches cross a
//! real network stack with a real bandwidth limit. Needs root; skips with a line elsewhere,
//! unless `SKYRIVER_REQUIRE_NETNS` is set (CI), where it fails instead.

mod common;

use std::time::{Duration, Instant};

use skyriver::netns::NetnsCluster;
use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ObjectId, TransferMode};

fn start(link: &str, extra: &[&str]) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(3, "256MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.netns = true;
    args.link = Some(link.parse().unwrap());
    args.daemon_args = extra.iter().map(|s| s.to_string()).collect();
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(seed) >> 7) as u8)
        .collect()
}

fn namespaces_of(slot: u16) -> Vec<String> {
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("skyriver-{slot}-")))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_size_class_crosses_shaped_links_byte_exact_and_nothing_is_left() {
    if !common::namespaces_or_skip("every_size_class_crosses_shaped_links_byte_exact") {
        return;
    }
    let (dir, cluster) = start("2gbit,50us", &[]);
    let netns = cluster.netns.as_ref().unwrap();
    let slot = netns.slot();
    assert_eq!(namespaces_of(slot).len(), 3);
    // The daemons' fabric addresses are the namespaces' own.
    let view = Client::connect(&cluster.sockets[1])
        .unwrap()
        .nodes()
        .unwrap();
    for member in &view.members {
        let host = &netns.hosts[member.node.0 as usize];
        assert!(
            member.address.starts_with(&format!("{}:", host.addr)),
            "{} is not in {}",
            member.address,
            host.addr
        );
        assert!(member.connected, "{} not connected", member.node);
    }
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let sizes = [
        1usize,
        1000,
        4 << 10,
        64 << 10,
        200 << 10,
        1 << 20,
        16 << 20,
    ];
    for (index, &size) in sizes.iter().enumerate() {
        let data = pattern(index as u64, size);
        let id = ObjectId::from_u64(100 + index as u64);
        holder.create_and_seal(id, &data, b"m").unwrap();
        for (requester, mode) in [(1, TransferMode::Auto), (2, TransferMode::Rendezvous)] {
            let client = Client::connect(&cluster.sockets[requester]).unwrap();
            let object = client
                .fetch_one_in_mode(id, Some(Duration::from_secs(30)), mode)
                .unwrap_or_else(|e| {
                    panic!("fetch of {size} bytes ({mode:?}) on node {requester}: {e}")
                });
            assert!(
                object.data() == data.as_slice(),
                "{size} bytes differ ({mode:?})"
            );
            assert_eq!(object.metadata(), b"m");
        }
    }
    // The bytes crossed node 0's link: at least the two 16 MiB copies.
    assert!(netns.sent_bytes(0) > 32 << 20, "{}", netns.sent_bytes(0));
    drop(cluster);
    assert!(namespaces_of(slot).is_empty(), "namespaces left behind");
    assert!(
        !std::path::Path::new(&format!("/sys/class/net/skyrbr{slot}")).exists(),
        "bridge left behind"
    );
    drop(dir);
}

#[test]
fn a_holder_whose_link_is_cut_mid_transfer_is_replaced_and_rejoins_when_restored() {
    if !common::namespaces_or_skip("a_holder_whose_link_is_cut_mid_transfer") {
        return;
    }
    // Slow links (300 Mbit/s: 32 MiB take about a second) and a short lease, so the cut lands
    // mid-transfer and the requester gives up on the silent holder within 3 s.
    let (_dir, cluster) = start("300mbit,50us", &["--lease-ms=4000"]);
    let netns = cluster.netns.as_ref().unwrap();
    let size = 32 << 20;
    let data = pattern(7, size);
    let id = ObjectId::from_u64(1);
    // Node 0 (the head) will fetch; nodes 1 and 2 hold copies.
    Client::connect(&cluster.sockets[1])
        .unwrap()
        .create_and_seal(id, &data, b"")
        .unwrap();
    drop(
        Client::connect(&cluster.sockets[2])
            .unwrap()
            .fetch_one(id, Some(Duration::from_secs(30)))
            .unwrap(),
    );
    let requester = Client::connect(&cluster.sockets[0]).unwrap();
    common::eventually("both copies are published", || {
        requester.locate(id).unwrap().holders.len() == 2
    });

    let before = [netns.sent_bytes(1), netns.sent_bytes(2)];
    let timeout = Duration::from_secs(20);
    let socket = cluster.sockets[0].clone();
    let started = Instant::now();
    let fetch = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let result = client
            .fetch_one_in_mode(id, Some(timeout), TransferMode::Rendezvous)
            .map(|object| object.data() == data.as_slice());
        (result.map_err(|e| e.to_string()), started.elapsed())
    });
    // The serving holder is the one whose link starts carrying bytes.
    let serving = loop {
        let sent = [
            netns.sent_bytes(1) - before[0],
            netns.sent_bytes(2) - before[1],
        ];
        if let Some(holder) = (0..2).find(|&h| sent[h] > 4 << 20) {
            break holder + 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no holder started sending: {sent:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    netns.set_link(serving, false).unwrap();
    eprintln!(
        "cut node {serving}'s link after {:?} ({} bytes sent)",
        started.elapsed(),
        netns.sent_bytes(serving) - before[serving - 1]
    );
    let (result, elapsed) = fetch.join().unwrap();
    eprintln!("fetch ended after {elapsed:?}: {result:?}");
    match result {
        Ok(intact) => assert!(intact, "the copy fetched after the cut differs"),
        // Another holder was live, so failing is only acceptable if clear and on time.
        Err(reason) => panic!(
            "fetch failed although node {} held a copy: {reason}",
            3 - serving
        ),
    }
    assert!(
        elapsed < timeout,
        "fetch took {elapsed:?}, past its {timeout:?} deadline"
    );

    // Restored, the node is a member again: it serves and fetches.
    netns.set_link(serving, true).unwrap();
    let restored = Instant::now();
    let rejoined = || {
        let view = requester.nodes().unwrap();
        view.members
            .iter()
            .any(|m| m.node.0 == serving as u32 && m.connected)
    };
    while !rejoined() {
        assert!(
            restored.elapsed() < Duration::from_secs(60),
            "node {serving} did not rejoin within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let fresh = ObjectId::from_u64(2);
    let fresh_data = pattern(9, 3 << 20);
    let cut = Client::connect(&cluster.sockets[serving]).unwrap();
    cut.create_and_seal(fresh, &fresh_data, b"").unwrap();
    let back = requester
        .fetch_one(fresh, Some(Duration::from_secs(30)))
        .unwrap();
    assert!(back.data() == fresh_data.as_slice());
    let other = ObjectId::from_u64(3);
    let other_data = pattern(11, 1 << 20);
    requester.create_and_seal(other, &other_data, b"").unwrap();
    assert!(
        cut.fetch_one(other, Some(Duration::from_secs(30)))
            .unwrap()
            .data()
            == other_data.as_slice()
    );
    eprintln!(
        "node {serving} rejoined {:?} after its link came back",
        restored.elapsed()
    );
}

#[test]
fn leftovers_of_a_killed_run_are_removed_at_the_next_start() {
    if !common::namespaces_or_skip("leftovers_of_a_killed_run_are_removed") {
        return;
    }
    // What a SIGKILLed run leaves: a namespace with a process in it and a bridge, in a slot
    // whose lock nobody holds.
    let slot = 251;
    let namespace = format!("skyriver-{slot}-0");
    let bridge = format!("skyrbr{slot}");
    let ip = |args: &[&str]| {
        assert!(std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap()
            .success())
    };
    ip(&["netns", "add", &namespace]);
    ip(&["link", "add", &bridge, "type", "bridge"]);
    let mut sleeper = std::process::Command::new("ip")
        .args(["netns", "exec", &namespace, "sleep", "600"])
        .spawn()
        .unwrap();
    let cluster = NetnsCluster::create(1, None).unwrap();
    assert_ne!(cluster.slot(), slot);
    assert!(namespaces_of(slot).is_empty(), "stale namespace kept");
    assert!(!std::path::Path::new(&format!("/sys/class/net/{bridge}")).exists());
    let waited = sleeper.wait().unwrap();
    assert!(!waited.success(), "the stale process was not killed");
    drop(cluster);
}

/// The answer to `GET path` at `addr` (HTTP/1.0, the connection closes after it).
fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

#[test]
fn metrics_of_a_namespace_cluster_answer_from_the_host() {
    if !common::namespaces_or_skip("metrics_of_a_namespace_cluster_answer_from_the_host") {
        return;
    }
    let dir = common::test_dir();
    let mut args = UpArgs::new(2, "64MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.netns = true;
    args.metrics = true;
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    assert_eq!(cluster.metrics.len(), 2);
    let netns = cluster.netns.as_ref().unwrap();
    for (node, &addr) in cluster.metrics.iter().enumerate() {
        assert_eq!(addr.ip(), std::net::IpAddr::V4(netns.hosts[node].addr));
        // From this process, in the host's namespace.
        let deadline = Instant::now() + Duration::from_secs(20);
        let answer = loop {
            match http_get(addr, "/metrics") {
                Ok(answer) => break answer,
                Err(error) => assert!(
                    Instant::now() < deadline,
                    "node-{node}'s metrics at {addr} do not answer from the host: {error}"
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let status = answer.lines().next().unwrap_or_default();
        assert!(
            status.starts_with("HTTP/1.") && status.split_whitespace().nth(1) == Some("200"),
            "{status}"
        );
        assert!(answer.contains("# EOF"), "not OpenMetrics: {answer}");
    }
}
