//! Objects put with `replicas = 2` outlive the node they were put on: four daemons (node 0
//! serves the directory), objects put on node 1 with two copies, node 1 killed with SIGKILL;
//! every object is still fetchable with its bytes, and repair brings each back to two live
//! copies. Once on loopback (each daemon a process of its own: killing one is the failure
//! under test), once with every node in a network namespace of its own joined by shaped links
//! (needs root; skips with a line elsewhere, unless `SKYRIVER_REQUIRE_NETNS` is set).

mod common;

use std::time::Duration;

use common::within;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, NodeId, ObjectId, ReplicaPolicy, StoreError};

fn start(nodes: u32, extra: &[&str]) -> (tempfile::TempDir, LocalCluster) {
    start_on(nodes, extra, None)
}

/// `link`: every node in a namespace of its own, joined by links shaped so.
fn start_on(nodes: u32, extra: &[&str], link: Option<&str>) -> (tempfile::TempDir, LocalCluster) {
    start_with(nodes, extra, &[], link, None)
}

/// `each`: more flags for node N (entry N); `directory`: a Redis directory instead of the
/// built-in one.
fn start_with(
    nodes: u32,
    extra: &[&str],
    each: &[&[&str]],
    link: Option<&str>,
    directory: Option<String>,
) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        "256MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.daemon_args = extra.iter().map(|s| s.to_string()).collect();
    args.node_daemon_args = each
        .iter()
        .map(|flags| flags.iter().map(|s| s.to_string()).collect())
        .collect();
    args.directory = directory;
    args.metrics = true;
    if let Some(link) = link {
        args.netns = true;
        args.link = Some(link.parse().unwrap());
    }
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The body of `GET /metrics` at `addr`.
fn scrape(addr: std::net::SocketAddr) -> String {
    common::http_get(addr, "/metrics").expect("a scrape").1
}

/// `skyriver ARGS --socket SOCKET`: its standard output, after checking it succeeded.
fn cli(socket: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "skyriver {args:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
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
    survive_a_killed_node_and_repair(&mut cluster);
}

#[test]
fn in_four_namespaces_objects_put_with_two_replicas_survive_their_node_and_are_repaired() {
    if let Err(reason) = skyriver::netns::available() {
        common::skip::skip(
            "in_four_namespaces_objects_put_with_two_replicas_survive_their_node",
            &common::skip::NETNS,
            &format!("network namespaces unavailable ({reason})"),
        );
        return;
    }
    let (_dir, mut cluster) = start_on(4, &[], Some("2gbit,50us"));
    let netns = cluster.netns.as_ref().expect("a namespace cluster");
    // Each daemon in its own namespace, reached at the namespace's address.
    let view = Client::connect(&cluster.sockets[0])
        .unwrap()
        .nodes()
        .unwrap();
    assert_eq!(view.members.len(), 4);
    for member in &view.members {
        let host = &netns.hosts[member.node.0 as usize];
        assert!(
            member.address.starts_with(&format!("{}:", host.addr)),
            "{} is not in {}",
            member.address,
            host.addr
        );
    }
    let sent_before = netns.sent_bytes(1);
    survive_a_killed_node_and_repair(&mut cluster);
    // The second copies crossed node 1's link (more than the 4 MiB of objects put there).
    let netns = cluster.netns.as_ref().expect("a namespace cluster");
    assert!(netns.sent_bytes(1) - sent_before > 4 << 20);
}

/// Objects put on node 1 with two copies (waiting for them); node 1 killed; every object
/// fetched with its bytes from every other node, and back to two copies of record.
fn survive_a_killed_node_and_repair(cluster: &mut LocalCluster) {
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

    // Survival on its own, before waiting for any repair: each object is fetched once, with
    // its bytes, from the copy left on a live node.
    let survivor = Client::connect(&cluster.sockets[2]).unwrap();
    for (id, data) in &objects {
        let object = survivor
            .fetch_one(*id, Some(Duration::from_secs(30)))
            .unwrap_or_else(|e| panic!("fetch of {id} right after the kill: {e}"));
        assert!(object.data() == &data[..], "bytes of {id} after the kill");
    }
    drop(survivor);

    // Repair: every object is back to two live copies of record, none on the dead node (the
    // fetches above left cache copies on node 2, which locate lists too).
    let copies_of_record = || -> u64 {
        [0usize, 2, 3]
            .iter()
            .map(|&n| common::copies_of_record_at(&cluster.sockets[n]))
            .sum()
    };
    within(
        Duration::from_secs(30),
        "every object has two copies of record again",
        || copies_of_record() == 2 * objects.len() as u64,
    );
    for (id, _) in &objects {
        let nodes = copy_nodes(&observer, *id);
        assert!(
            nodes.len() >= 2 && !nodes.contains(&NodeId(1)),
            "copies of {id} after the repair: {nodes:?}"
        );
    }
    // The head's metrics show the repairs (refreshed every second).
    let repaired_bytes: u64 = sizes.iter().map(|&len| len as u64).sum();
    within(
        Duration::from_secs(10),
        "the head's metrics show every repair",
        || {
            let text = scrape(cluster.metrics[0]);
            let value = |name| common::metric_sample(&text, name).unwrap_or(-1.0);
            value("skyriver_head_replicated_objects") == objects.len() as f64
                && value("skyriver_head_under_replicated_objects") == 0.0
                && value("skyriver_head_repairs_queued") == 0.0
                && value("skyriver_head_copies_placed_total") == objects.len() as f64
                && value("skyriver_head_repairs_total") == objects.len() as f64
                && value("skyriver_head_repair_bytes_total") >= repaired_bytes as f64
        },
    );
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

/// `skyriver bench replicas`, tiny: every copy count next to the fetch at each size, the
/// ratio of waiting to one fetch, a repair after a kill that restored every object, and the
/// breakdown: the daemons' CPU per operation, and every milestone of a traced put seen in
/// the stamps of the origin, the head and the targets.
#[test]
fn bench_replicas_measures_puts_by_copies_next_to_a_fetch_and_times_a_repair() {
    if let Err(reason) = skyriver::netns::available() {
        common::skip::skip(
            "bench_replicas_measures_puts_by_copies_next_to_a_fetch_and_times_a_repair",
            &common::skip::NETNS,
            &format!("network namespaces unavailable ({reason})"),
        );
        return;
    }
    let dir = common::test_dir();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .current_dir(dir.path())
        .args([
            "bench",
            "replicas",
            "--sizes",
            "1KiB,1MiB",
            "--iterations",
            "2",
            "--repair-mib",
            "4",
            "--breakdown",
            "1",
            "--json",
            "replicas.json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench replicas failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("wait/fetch"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("replicas.json")).unwrap())
            .unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for row in results {
        let puts = row["puts"].as_array().unwrap();
        let names: Vec<&str> = puts
            .iter()
            .map(|p| p["operation"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["put k=1", "put k=2", "put k=3"]);
        for case in puts.iter().chain([&row["fetch"]]) {
            assert_eq!(case["iterations"], 2);
            assert!(case["p99_us"].as_f64().unwrap() >= case["p50_us"].as_f64().unwrap());
            assert!(case["p50_us"].as_f64().unwrap() > 0.0);
        }
        assert_eq!(row["wait_over_fetch"].as_array().unwrap().len(), 2);
    }
    let breakdown = &report["breakdown"];
    let costs: Vec<&str> = breakdown["cpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["operation"].as_str().unwrap())
        .collect();
    assert_eq!(costs, ["put k=1", "put k=2", "put k=3", "fetch"]);
    for cost in breakdown["cpu"].as_array().unwrap() {
        assert_eq!(cost["iterations"], 10);
        assert_eq!(cost["cpu_us_by_node"].as_array().unwrap().len(), 4);
        assert!(cost["cpu_us"].as_f64().unwrap() > 0.0, "{cost}");
    }
    let timelines = breakdown["timelines"].as_array().unwrap();
    assert_eq!(timelines.len(), 2, "k = 2 and 3");
    for timeline in timelines {
        let milestones = timeline["milestones"].as_array().unwrap();
        assert_eq!(milestones.len(), 11);
        for milestone in milestones {
            let at = milestone[1].as_f64();
            assert!(
                at.is_some_and(|at| at > 0.0),
                "{milestone} not seen: {timeline}"
            );
        }
    }
    let repair = &report["repair"];
    assert_eq!(repair["objects"], 4);
    assert_eq!(repair["all_fetchable"], true);
    assert!(repair["restored_ms"].as_f64().unwrap() > 0.0);
    assert!(repair["head_reports_ms"].as_f64().unwrap() > 0.0);
}

/// A daemon started with `--replicas 2` gives its default to puts that name no count: Rust's
/// `Client::put` (inline and create-then-seal) and `skyriver put FILE`, without a wait.
#[test]
fn the_daemon_default_of_two_copies_applies_to_plain_puts() {
    let (dir, cluster) = start(2, &["--replicas", "2"]);
    let client = Client::connect(&cluster.sockets[1]).unwrap();
    let inline = ObjectId::from_u64(21);
    client.put(inline, &bytes(3, 5000), b"").unwrap();
    let sealed = ObjectId::from_u64(22);
    client.put(sealed, &bytes(4, 1 << 20), b"").unwrap();
    let input = dir.path().join("input.bin");
    std::fs::write(&input, bytes(5, 3000)).unwrap();
    let printed = cli(&cluster.sockets[1], &["put", input.to_str().unwrap()]);
    let from_cli: ObjectId = printed.trim().parse().expect("put prints the id");
    let head = Client::connect(&cluster.sockets[0]).unwrap();
    within(
        Duration::from_secs(30),
        "every plain put has a copy on both nodes",
        || {
            [inline, sealed, from_cli]
                .iter()
                .all(|id| copy_nodes(&head, *id) == [NodeId(0), NodeId(1)])
        },
    );
    // Copies of record (pinned, placed by the registry), not cache copies.
    let on = |node: usize| common::copies_of_record_at(&cluster.sockets[node]);
    within(
        Duration::from_secs(10),
        "three copies of record on each node",
        || on(0) == 3 && on(1) == 3,
    );
}

/// Failure domains end to end: four daemons in domains a, a, b, b (`--failure-domain`); puts
/// with two copies on the `a` nodes, through `skyriver put --replicas 2 --wait` and Rust, keep
/// their other copy in `b`, and `skyriver locate` prints both copies with their domains.
#[test]
fn copies_go_to_another_failure_domain_and_locate_prints_the_domains() {
    let domains: [&[&str]; 4] = [
        &["--failure-domain", "a"],
        &["--failure-domain", "a"],
        &["--failure-domain", "b"],
        &["--failure-domain", "b"],
    ];
    let (dir, cluster) = start_with(4, &[], &domains, None, None);
    let input = dir.path().join("input.bin");
    std::fs::write(&input, bytes(6, 100_000)).unwrap();
    let printed = cli(
        &cluster.sockets[1],
        &["put", input.to_str().unwrap(), "--replicas", "2", "--wait"],
    );
    let from_cli: ObjectId = printed.trim().parse().expect("put prints the id");
    let mut ids = vec![(from_cli, 1)];
    // More puts, from both `a` nodes: one placement in `b` could be chance, six are not.
    let two_and_wait = ReplicaPolicy {
        copies: 2,
        wait_ms: Some(30_000),
    };
    for n in 0..6u64 {
        let node = (n % 2) as usize;
        let id = ObjectId::from_u64(300 + n);
        Client::connect(&cluster.sockets[node])
            .unwrap()
            .put_replicated(id, &bytes(n as u8, 4000), b"", two_and_wait)
            .unwrap();
        ids.push((id, node));
    }
    let observer = Client::connect(&cluster.sockets[3]).unwrap();
    for (id, origin) in &ids {
        let copies = observer.locate_copies(*id).unwrap().copies;
        let mut seen: Vec<(NodeId, &str)> = copies
            .iter()
            .map(|c| (c.node, c.failure_domain.as_str()))
            .collect();
        seen.sort();
        assert_eq!(seen.len(), 2, "two copies of {id}: {seen:?}");
        assert!(
            seen.contains(&(NodeId(*origin as u32), "a")),
            "{id} is on its origin, in a: {seen:?}"
        );
        assert!(
            seen.iter()
                .any(|(node, domain)| node.0 >= 2 && *domain == "b"),
            "the other copy of {id} is in b: {seen:?}"
        );
    }
    // Both copies are copies of record, one in each domain; the count comes from the registry.
    let located = cli(&cluster.sockets[1], &["locate", &from_cli.to_string()]);
    let copy_lines: Vec<&str> = located.lines().filter(|l| l.contains("domain ")).collect();
    assert_eq!(copy_lines.len(), 2, "{located}");
    assert!(
        copy_lines
            .iter()
            .any(|l| l.trim_end().ends_with("domain a  record")),
        "{located}"
    );
    assert!(
        copy_lines
            .iter()
            .any(|l| l.trim_end().ends_with("domain b  record")),
        "{located}"
    );
    assert!(located.contains("2 of 2 copies of record"), "{located}");
    // `skyriver nodes` shows each node's domain.
    let nodes: serde_json::Value =
        serde_json::from_str(&cli(&cluster.sockets[1], &["nodes", "--json"])).unwrap();
    let domains: Vec<(u64, &str)> = nodes["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["node"].as_u64().unwrap(),
                m["failure_domain"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(domains, [(0, "a"), (1, "a"), (2, "b"), (3, "b")]);
    let table = cli(&cluster.sockets[1], &["nodes"]);
    assert!(table.contains("DOMAIN"), "{table}");
}

/// Stops and resumes a daemon (SIGSTOP, SIGCONT); resumes it on drop, so a failed test leaves
/// no stopped process behind.
struct Stopped(nix::unistd::Pid);

impl Stopped {
    fn stop(pid: u32) -> Self {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A holder cut off beyond the heartbeat bound (its daemon stopped: it answers nothing, its
/// connections stay open) is repaired around: the head places new copies elsewhere. When it
/// comes back, its copies are surplus: they stay as plain (cache) copies, the registry keeps
/// counting the two that repair made, and nothing is lost or duplicated as a copy of record.
#[test]
fn a_holder_cut_off_past_the_heartbeat_bound_is_repaired_around_and_its_copies_are_surplus_on_return(
) {
    // Node 2 is the only node in domain b: every copy put on node 1 lands there.
    let domains: [&[&str]; 4] = [
        &["--failure-domain", "a"],
        &["--failure-domain", "a"],
        &["--failure-domain", "b"],
        &["--failure-domain", "a"],
    ];
    let (_dir, cluster) = start_with(4, &[], &domains, None, None);
    let two_and_wait = ReplicaPolicy {
        copies: 2,
        wait_ms: Some(30_000),
    };
    let objects: Vec<(ObjectId, Vec<u8>)> = [500usize, 70_000, 1 << 20]
        .iter()
        .enumerate()
        .map(|(i, &len)| (ObjectId::from_u64(700 + i as u64), bytes(i as u8 + 40, len)))
        .collect();
    let origin = Client::connect(&cluster.sockets[1]).unwrap();
    for (id, data) in &objects {
        origin.put_replicated(*id, data, b"", two_and_wait).unwrap();
        assert_eq!(copy_nodes(&origin, *id), [NodeId(1), NodeId(2)]);
    }
    let of_record_on = |node: usize| common::copies_of_record_at(&cluster.sockets[node]);
    assert_eq!(of_record_on(2), objects.len() as u64);

    let pid = cluster.pids()[2].expect("node 2 runs");
    let stopped = Stopped::stop(pid);
    // Past the heartbeat bound (5 s) the head counts node 2 gone and places the copies again,
    // on node 0 or 3 (domain a: no other domain is left).
    within(
        Duration::from_secs(30),
        "the head repairs every object on nodes 0 and 3",
        || of_record_on(0) + of_record_on(3) == objects.len() as u64,
    );
    for (id, _) in &objects {
        let copies = origin.locate_copies(*id).unwrap();
        let of_record = common::nodes_of_record(&copies);
        assert_eq!(of_record.len(), 2, "{id} while node 2 is away: {copies:?}");
        assert!(!of_record.contains(&NodeId(2)), "{copies:?}");
    }

    drop(stopped);
    // Back: node 2 publishes its copies of record again and is told they are surplus.
    within(
        Duration::from_secs(30),
        "node 2's returning copies are released as surplus",
        || of_record_on(2) == 0,
    );
    within(
        Duration::from_secs(10),
        "the head counts the surplus copies",
        || {
            let text = scrape(cluster.metrics[0]);
            common::metric_sample(&text, "skyriver_head_surplus_copies_total")
                == Some(objects.len() as f64)
                && common::metric_sample(&text, "skyriver_head_under_replicated_objects")
                    == Some(0.0)
        },
    );
    let back = Client::connect(&cluster.sockets[2]).unwrap();
    for (id, data) in &objects {
        let copies = origin.locate_copies(*id).unwrap();
        let marks: Vec<(NodeId, bool)> = copies
            .copies
            .iter()
            .map(|c| (c.node, c.of_record))
            .collect();
        assert_eq!(
            marks.iter().filter(|(_, of_record)| *of_record).count(),
            2,
            "{id} after node 2's return: {marks:?}"
        );
        assert!(marks.contains(&(NodeId(2), false)), "{id}: {marks:?}");
        // Its copy is still there, plain, with its bytes.
        let object = back.get_one(*id, Some(Duration::ZERO)).unwrap();
        assert!(object.data() == &data[..], "bytes of {id} on node 2");
    }
    assert_eq!(
        of_record_on(0) + of_record_on(1) + of_record_on(3),
        2 * objects.len() as u64
    );
}

/// With Redis as the directory nothing places copies: a daemon's `--replicas 2` and a put's
/// own count give plain objects (no copy of record pinned), and a put that waits for its
/// copies fails at once, its object stored, saying the directory does not make replicas.
#[test]
fn with_a_redis_directory_a_waiting_put_fails_at_once_and_nothing_is_pinned() {
    let Some(redis) = common::RedisServer::start("replicas_with_a_redis_directory") else {
        return;
    };
    let (_dir, cluster) = start_with(2, &["--replicas", "2"], &[], None, Some(redis.url()));
    let client = Client::connect(&cluster.sockets[1]).unwrap();
    client
        .put(ObjectId::from_u64(31), &bytes(1, 5000), b"")
        .unwrap();
    let waiting = ObjectId::from_u64(32);
    let started = std::time::Instant::now();
    let error = client
        .put_replicated(
            waiting,
            &bytes(2, 5000),
            b"",
            ReplicaPolicy {
                copies: 2,
                wait_ms: Some(60_000),
            },
        )
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed at once, not after its wait: {:?}",
        started.elapsed()
    );
    match &error {
        skyriver_client::ClientError::Store(StoreError::ReplicasUnsupported {
            id,
            wanted: 2,
            ..
        }) if *id == waiting => {}
        other => panic!("expected ReplicasUnsupported, got {other}"),
    }
    assert!(
        error.to_string().contains("does not make replicas"),
        "{error}"
    );
    assert!(client.contains(waiting).unwrap(), "the object is stored");
    assert_eq!(client.metrics().unwrap().copies_of_record, 0);
    // Nothing pinned: an eviction of everything takes both objects.
    let evicted = client.evict(1 << 30).unwrap();
    assert_eq!(evicted.objects, 2, "{evicted:?}");
}
