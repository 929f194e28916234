//! `skyriver daemon --record` on a real two-daemon run (built-in directory, TCP fabric), and
//! `skyriver sim --replay` of each daemon's record: the core, fed the recorded inputs, gives
//! the outputs the daemon's node gave.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::DaemonProcess;
use skyriver_client::{Client, ObjectId};

const TOKEN: &str = "record-replay-test";

/// A daemon of node `node` recording to `record`, started with `membership` (head or join)
/// and `flags`.
fn daemon_with(
    dir: &Path,
    node: u32,
    membership: &[&str],
    record: &Path,
    flags: &[&str],
) -> DaemonProcess {
    let socket = dir.join(format!("node-{node}.sock"));
    let log = std::fs::File::create(dir.join(format!("node-{node}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args([
            "daemon",
            "--memory",
            "64MiB",
            "--no-prefault",
            "--log",
            "warn",
        ])
        .args(["--fabric", "tcp", "--listen", "127.0.0.1:0"])
        .args(["--eager-threshold", "64KiB"])
        .args(["--node-id", &node.to_string()])
        .args(membership)
        .arg("--record")
        .arg(record)
        .args(flags)
        .arg("--socket")
        .arg(&socket)
        .env("SKYRIVER_CLUSTER_TOKEN", TOKEN)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn skyriver daemon");
    common::eventually("the daemon serves its socket", || {
        Client::connect(&socket).is_ok()
    });
    DaemonProcess { child, socket }
}

/// Stops a daemon as an operator would (SIGTERM) and waits until it exited.
fn stop(daemon: &mut DaemonProcess) {
    let child: &mut Child = &mut daemon.child;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon did not stop"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Runs two daemons recording with `flags`, one object put on node 0 and fetched by node 1
/// for each of `objects` (seed, length); the records' paths, once both daemons stopped.
fn record_two_daemon_run(dir: &Path, flags: &[&str], objects: &[(u8, usize)]) -> Vec<PathBuf> {
    let port = skyriver::up::free_loopback_port().unwrap();
    let head = format!("127.0.0.1:{port}");
    let records: Vec<PathBuf> = (0..2).map(|n| dir.join(format!("node-{n}.rec"))).collect();
    let mut holder = daemon_with(dir, 0, &["--head", &head], &records[0], flags);
    let mut requester = daemon_with(dir, 1, &["--join", &head], &records[1], flags);
    common::eventually("both daemons are connected", || {
        [&holder.socket, &requester.socket].iter().all(|socket| {
            Client::connect(socket)
                .and_then(|c| c.nodes())
                .is_ok_and(|view| {
                    view.members.len() == 2 && view.members.iter().all(|m| m.connected)
                })
        })
    });
    {
        let put = Client::connect(&holder.socket).unwrap();
        let fetch = Client::connect(&requester.socket).unwrap();
        for &(n, len) in objects {
            let id = ObjectId::from_u64(n as u64);
            put.create_and_seal(id, &pattern(n, len), b"meta").unwrap();
            let copy = fetch.fetch_one(id, Some(Duration::from_secs(30))).unwrap();
            assert!(copy.data() == &pattern(n, len)[..]);
        }
    }
    stop(&mut requester);
    stop(&mut holder);
    records
}

/// Runs `skyriver sim --replay FILE --json`; its JSON document.
fn replay_command(record: &Path) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["sim", "--json", "--replay"])
        .arg(record)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let document: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
    assert!(output.status.success(), "{document:#}");
    document
}

#[test]
fn a_recorded_two_daemon_run_replays_to_the_same_outputs() {
    let dir = common::test_dir();
    // One object below the eager threshold, one above it (a rendezvous with READs).
    let objects = [(1u8, 4 << 10), (2u8, 1 << 20)];
    let records = record_two_daemon_run(dir.path(), &[], &objects);
    for (node, record) in records.iter().enumerate() {
        let report = skyriver_sim::replay::replay_file(record).unwrap();
        assert!(
            report.passed(),
            "node {node}: {:?} {:?}",
            report.divergence,
            report.violations
        );
        assert_eq!(report.node.0, node as u32);
        assert_eq!(report.dropped_entries, 0);
        assert!(report.output_count() > 0);
        assert_eq!(report.output_count(), report.recorded_outputs);
        let inputs = |kind: &str| report.inputs.get(kind).copied().unwrap_or(0);
        let outputs = |kind: &str| report.outputs.get(kind).copied().unwrap_or(0);
        assert!(inputs("client_request") >= 4, "{:?}", report.inputs);
        assert!(inputs("peer_bytes") >= 1, "{:?}", report.inputs);
        if node == 1 {
            // The requester read the large object and verified both copies.
            assert!(inputs("read_completion") >= 1, "{:?}", report.inputs);
            assert!(inputs("content_hashed") >= 2, "{:?}", report.inputs);
            assert!(outputs("post_read") >= 1, "{:?}", report.outputs);
        } else {
            // The holder sent the small object eagerly and granted READs of the large one.
            assert!(outputs("send_eager") >= 1, "{:?}", report.outputs);
            assert!(inputs("read_granted") >= 1, "{:?}", report.inputs);
        }
    }
    // The command says the same.
    let document = replay_command(&records[1]);
    assert_eq!(document["passed"], true, "{document:#}");
    assert_eq!(document["node"], 1);
    assert!(document["inputs"].as_u64().unwrap() > 0, "{document:#}");
}

#[test]
fn a_record_that_is_not_one_is_refused_by_the_replay() {
    let dir = common::test_dir();
    let file = dir.path().join("not-a-record");
    std::fs::write(&file, b"hello").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["sim", "--replay"])
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a skyriver record"), "{stderr}");
}

#[test]
fn a_rotated_record_replays_from_its_latest_segment_and_a_missing_segment_is_named() {
    let dir = common::test_dir();
    // Small files: the eager payloads alone fill several.
    let objects: Vec<(u8, usize)> = (1..=6).map(|n| (n, 6 << 10)).collect();
    let records = record_two_daemon_run(dir.path(), &["--record-max-bytes", "16KiB"], &objects);
    let holder = &records[0];
    let header_segment = |path: &Path| {
        let bytes = std::fs::read(path).unwrap();
        skyriver_core::node::recording::decode_record(&bytes)
            .unwrap()
            .header
            .segment
    };
    let last = header_segment(holder);
    assert!(
        last >= 2,
        "the holder's record did not rotate twice: segment {last}"
    );
    let segment = |n: u64| skyriver_core::node::recording::segment_path(holder, n);
    assert_eq!(header_segment(&segment(1)), 1);

    // The latest segment replays, with the chain before it, to the recorded outputs.
    let report = skyriver_sim::replay::replay_file(holder).unwrap();
    assert!(
        report.passed(),
        "{:?} {:?}",
        report.divergence,
        report.violations
    );
    assert_eq!(report.dropped_entries, 0);
    assert_eq!(report.output_count(), report.recorded_outputs);
    assert!(
        report.inputs.get("client_request").copied().unwrap_or(0) >= 6,
        "{:?}",
        report.inputs
    );
    // So does a middle one, named by its number (the chain up to it).
    let middle = skyriver_sim::replay::replay_file(&segment(1)).unwrap();
    assert!(
        middle.passed(),
        "{:?} {:?}",
        middle.divergence,
        middle.violations
    );
    assert!(middle.input_count() < report.input_count());

    // Without segment 0, the replay says which file it needs.
    std::fs::rename(segment(0), dir.path().join("elsewhere")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["sim", "--replay"])
        .arg(holder)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs segment 0"), "{stderr}");
    assert!(
        stderr.contains(&segment(0).display().to_string()),
        "{stderr}"
    );
}
