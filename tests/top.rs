//! `skyriver top` on a running two-node cluster: driven in tmux (it shows both nodes and quits
//! on `q`), and `--once --json` parses; `--once` shows a spilling node's spill tier. Without tmux the tmux test prints a SKIPPED line,
//! unless `SKYRIVER_REQUIRE_PROMETHEUS` is set (CI installs tmux with prometheus).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ObjectId};

fn cluster() -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let args = UpArgs::new(2, "64MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

/// A tmux server of the test's own (its own socket name), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn command(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("tmux runs")
    }

    fn capture(&self) -> String {
        String::from_utf8_lossy(&self.command(&["capture-pane", "-p", "-t", "top"]).stdout)
            .into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}

#[test]
fn top_in_tmux_shows_both_nodes_and_quits_on_q() {
    let test = "top_in_tmux_shows_both_nodes_and_quits_on_q";
    if Command::new("tmux").arg("-V").output().is_err() {
        common::skip::skip(test, &common::skip::PROMETHEUS, "tmux is not installed");
        return;
    }
    let (_dir, cluster) = cluster();
    let client = Client::connect(&cluster.sockets[0]).unwrap();
    client
        .create_and_seal(ObjectId::from_u64(7), &[1; 4096], b"")
        .unwrap();
    let tmux = Tmux {
        socket: format!("skyriver-top-test-{}", std::process::id()),
    };
    let command = format!(
        "{} top --interval-ms 200 -s {} -s {}",
        env!("CARGO_BIN_EXE_skyriver"),
        cluster.sockets[0].display(),
        cluster.sockets[1].display()
    );
    let started = tmux.command(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "50",
        &command,
    ]);
    assert!(started.status.success(), "{started:?}");
    let begun = Instant::now();
    let mut screen = String::new();
    while begun.elapsed() < Duration::from_secs(20) {
        screen = tmux.capture();
        if screen.contains("2 of 2 daemons answering")
            && screen.contains("node 0 ")
            && screen.contains("node 1 ")
            && screen.contains("memory [")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        screen.contains("2 of 2 daemons answering") && screen.contains("node 1 "),
        "top did not show both nodes; the screen:\n{screen}"
    );
    // Each node lists the other as a connected peer.
    assert!(screen.contains("peer"), "{screen}");
    let sent = tmux.command(&["send-keys", "-t", "top", "q"]);
    assert!(sent.status.success(), "{sent:?}");
    let begun = Instant::now();
    while tmux.command(&["has-session", "-t", "top"]).status.success() {
        assert!(
            begun.elapsed() < Duration::from_secs(10),
            "top did not quit on q; the screen:\n{}",
            tmux.capture()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn top_once_json_is_one_document_with_both_nodes() {
    let (_dir, cluster) = cluster();
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["top", "--once", "--json", "--interval-ms", "200"])
        .arg("-s")
        .arg(&cluster.sockets[0])
        .arg("-s")
        .arg(&cluster.sockets[1])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let nodes = json["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    for (n, node) in nodes.iter().enumerate() {
        assert_eq!(node["metrics"]["node"], n as u64, "{node}");
        assert!(node["error"].is_null());
        let peers = node["peers"].as_array().unwrap();
        assert_eq!(peers.len(), 1, "each node sees the other: {node}");
        assert_eq!(peers[0]["node"], (1 - n) as u64);
    }
    // --once as text, and a socket nobody serves is an error, not a hang.
    let dir = common::test_dir();
    let (ok, _, stderr) = common::cli(
        &dir.path().join("nobody.sock"),
        &["top", "--once", "--interval-ms", "100"],
        None,
    );
    assert!(!ok);
    assert!(stderr.contains("no daemon answered"), "{stderr}");
}

#[test]
fn top_once_shows_the_spill_tier_of_a_spilling_node() {
    let dir = common::test_dir();
    let spill_dir = dir.path().join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let mut args = UpArgs::new(1, "16MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.spill_dir = Some(spill_dir);
    args.spill_limit = Some("1GiB".parse().unwrap());
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    let client = Client::connect(&cluster.sockets[0]).unwrap();
    // 32 MiB into 16 MiB: some objects go to disk.
    for n in 0..16u64 {
        client
            .put(ObjectId::from_u64(n), &vec![n as u8; 2 << 20], b"")
            .unwrap();
    }
    assert!(client.stats().unwrap().spill.spilled_objects > 0);
    let (ok, stdout, stderr) = common::cli(
        &cluster.sockets[0],
        &["top", "--once", "--interval-ms", "100"],
        None,
    );
    assert!(ok, "{stderr}");
    let screen = String::from_utf8(stdout).unwrap();
    let spill_line = screen
        .lines()
        .find(|line| line.trim_start().starts_with("spill "))
        .unwrap_or_else(|| panic!("no spill line:\n{screen}"));
    assert!(spill_line.contains("of 1.0 GiB on disk"), "{screen}");
    assert!(!spill_line.contains("(0 objects)"), "{screen}");
    for needle in [
        "spills/s",
        "restores/s",
        "spill failures: 0 no space, 0 io, 0 lost",
    ] {
        assert!(screen.contains(needle), "{needle:?} missing:\n{screen}");
    }
    // A node without a tier shows none.
    let plain = common::test_dir();
    let daemon = common::start_daemon(plain.path(), 16 << 20);
    let (ok, stdout, stderr) = common::cli(
        daemon.socket_path(),
        &["top", "--once", "--interval-ms", "100"],
        None,
    );
    assert!(ok, "{stderr}");
    let screen = String::from_utf8(stdout).unwrap();
    assert!(!screen.contains("spill"), "{screen}");
}

#[test]
fn nodes_and_logs_do_not_name_the_local_node_as_the_directory() {
    let dir = common::test_dir();
    let mut args = UpArgs::new(2, "64MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.log = "info".into();
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    let directory = |node: usize| {
        let (ok, out, err) = common::cli(&cluster.sockets[node], &["nodes", "--json"], None);
        assert!(ok, "{err}");
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        json["directory"].as_str().unwrap().to_string()
    };
    let head = directory(0);
    assert!(head.starts_with("built-in directory at"), "{head}");
    assert!(head.contains("served by this node"), "{head}");
    let joined = directory(1);
    assert!(joined.starts_with("built-in directory at"), "{joined}");
    assert!(
        !joined.contains("node-1"),
        "node-1 is not the head: {joined}"
    );
    assert!(!joined.contains("this node"), "{joined}");
    let log = std::fs::read_to_string(dir.path().join("node-1.log")).unwrap();
    assert!(log.contains("joined the cluster"), "{log}");
    assert!(!log.contains("(node-1)"), "{log}");
}

#[test]
fn top_once_says_why_it_could_not_connect() {
    let dir = common::test_dir();
    let (ok, _, stderr) = common::cli(
        &dir.path().join("missing.sock"),
        &["top", "--once", "--interval-ms", "100"],
        None,
    );
    assert!(!ok);
    assert!(stderr.contains("missing.sock"), "{stderr}");
    assert!(stderr.contains("No such file or directory"), "{stderr}");
}
