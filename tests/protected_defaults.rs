//! Safe defaults seen from another host: a daemon without a cluster token cannot be reached
//! from a non-loopback address, one with a token can and publishes a concrete fabric address.
//! Each host is a network namespace; needs root and `ip`, skips with a line elsewhere unless
//! `SKYRIVER_REQUIRE_NETNS` is set (CI), where it fails instead.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use skyriver::netns::NetnsCluster;
use skyriver_client::Client;

/// A daemon process, killed and reaped when dropped (also when the test fails).
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a head daemon in node 0's namespace with `extra` flags, its log in `dir`.
fn head(netns: &NetnsCluster, dir: &Path, extra: &[&str]) -> (Daemon, std::path::PathBuf) {
    let socket = dir.join("head.sock");
    let log = std::fs::File::create(dir.join("head.log")).unwrap();
    let child = netns
        .command(0, env!("CARGO_BIN_EXE_skyriver"))
        .args([
            "daemon",
            "--fabric",
            "tcp",
            "--memory",
            "64MiB",
            "--no-prefault",
        ])
        .args(["--log", "info", "--socket"])
        .arg(&socket)
        .args(extra)
        .env_remove("SKYRIVER_CLUSTER_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let mut daemon = Daemon(child);
    let started = Instant::now();
    while Client::connect(&socket).is_err() {
        if let Some(status) = daemon.0.try_wait().unwrap() {
            panic!(
                "the daemon exited ({status}): {}",
                std::fs::read_to_string(dir.join("head.log")).unwrap_or_default()
            );
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no daemon");
        std::thread::sleep(Duration::from_millis(20));
    }
    (daemon, socket)
}

fn reachable_from(netns: &NetnsCluster, node: usize, addr: SocketAddr) -> bool {
    netns
        .in_namespace(node, || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        })
        .unwrap()
}

#[test]
fn a_daemon_without_a_token_is_unreachable_from_another_host() {
    if !common::namespaces_or_skip("a_daemon_without_a_token_is_unreachable_from_another_host") {
        return;
    }
    let netns = NetnsCluster::create(2, None).unwrap();
    let dir = common::test_dir();
    // The defaults a new user gets: `--head` alone (all addresses, port 7390).
    let (_daemon, socket) = head(&netns, dir.path(), &["--head"]);
    let host0 = netns.hosts[0].addr;
    assert!(
        !reachable_from(&netns, 1, SocketAddr::from((host0, 7390))),
        "the directory of a daemon without a token answered another host"
    );
    assert!(reachable_from(
        &netns,
        0,
        SocketAddr::from(([127, 0, 0, 1], 7390))
    ));
    let view = Client::connect(&socket).unwrap().nodes().unwrap();
    let me = view.members.iter().find(|m| m.node == view.node).unwrap();
    let fabric: SocketAddr = me.address.parse().unwrap();
    assert!(fabric.ip().is_loopback(), "fabric published at {fabric}");
    assert!(
        !reachable_from(&netns, 1, SocketAddr::new(host0.into(), fabric.port())),
        "the fabric of a daemon without a token answered another host"
    );
    let log = std::fs::read_to_string(dir.path().join("head.log")).unwrap();
    assert!(log.contains("loopback only"), "{log}");
}

#[test]
fn a_daemon_without_a_token_refuses_a_public_address() {
    if !common::namespaces_or_skip("a_daemon_without_a_token_refuses_a_public_address") {
        return;
    }
    let netns = NetnsCluster::create(1, None).unwrap();
    let dir = common::test_dir();
    let head_addr = format!("{}:7390", netns.hosts[0].addr);
    let output = netns
        .command(0, env!("CARGO_BIN_EXE_skyriver"))
        .args([
            "daemon",
            "--fabric",
            "tcp",
            "--memory",
            "64MiB",
            "--no-prefault",
        ])
        .args(["--head", &head_addr, "--socket"])
        .arg(dir.path().join("refused.sock"))
        .env_remove("SKYRIVER_CLUSTER_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("--token-file") && stderr.contains("--insecure"),
        "{stderr}"
    );
}

#[test]
fn a_daemon_with_a_token_file_is_reachable_and_publishes_a_concrete_address() {
    if !common::namespaces_or_skip("a_daemon_with_a_token_file_is_reachable") {
        return;
    }
    let netns = NetnsCluster::create(2, None).unwrap();
    let dir = common::test_dir();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, skyriver_daemon::security::random_token()).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let host0 = netns.hosts[0].addr;
    let head_addr = format!("{host0}:7390");
    let (_daemon, socket) = head(
        &netns,
        dir.path(),
        &[
            "--head",
            &head_addr,
            "--listen",
            "0.0.0.0:0",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(reachable_from(&netns, 1, SocketAddr::from((host0, 7390))));
    let view = Client::connect(&socket).unwrap().nodes().unwrap();
    let me = view.members.iter().find(|m| m.node == view.node).unwrap();
    let fabric: SocketAddr = me.address.parse().unwrap();
    assert_eq!(
        fabric.ip(),
        std::net::IpAddr::from(host0),
        "published {fabric}"
    );
    assert!(reachable_from(&netns, 1, fabric));
}
