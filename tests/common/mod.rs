//! Shared helpers of the integration tests: daemons on private sockets.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyriver_client::{Client, NodeId, ObjectCopies};
use skyriver_daemon::{DaemonConfig, DaemonHandle};

/// Skips that show (`SKIPPED: …` lines, `ci/test.sh` lists them); shared with the transport
/// crate's tests.
#[path = "../../transport/tests/support/skip.rs"]
pub mod skip;

/// Whether network namespaces can be made here (root); a skip line for `test` when not.
pub fn namespaces_or_skip(test: &str) -> bool {
    match skyriver::netns::available() {
        Ok(()) => true,
        Err(reason) => {
            skip::skip(
                test,
                &skip::NETNS,
                &format!("network namespaces unavailable ({reason})"),
            );
            false
        }
    }
}

/// `len` bytes that differ with `seed` (xorshift), for objects whose bytes a test checks.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A temporary directory for one test's sockets and files.
pub fn test_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("skyriver-test")
        .tempdir()
        .expect("temp dir")
}

/// A daemon running on a thread of this test process.
pub fn start_daemon(dir: &Path, memory_bytes: u64) -> DaemonHandle {
    let mut config = DaemonConfig::new(dir.join("daemon.sock"), memory_bytes);
    config.prefault = false;
    DaemonHandle::start(config).expect("daemon starts")
}

/// A daemon running as a separate `skyriver daemon` process.
pub struct DaemonProcess {
    pub child: Child,
    pub socket: PathBuf,
}

impl DaemonProcess {
    pub fn start(dir: &Path, memory: &str) -> Self {
        let socket = dir.join("daemon.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args(["daemon", "--log", "warn", "--memory", memory, "--socket"])
            .arg(&socket)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn skyriver daemon");
        let started = Instant::now();
        while Client::connect(&socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, socket }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the `skyriver` CLI against `socket`; returns (status ok, stdout, stderr).
pub fn cli(socket: &Path, args: &[&str], stdin: Option<&[u8]>) -> (bool, Vec<u8>, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skyriver");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.success(),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `GET path` over HTTP/1.1 (a daemon's `/metrics` or `/healthz`): the status code and body.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("read: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no header end in {response:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// The value of one sample of exposition `text` (`name` or `name{labels}`, exactly as
/// exposed).
pub fn metric_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Polls `condition` for up to 10 s.
pub fn eventually(what: &str, condition: impl FnMut() -> bool) {
    within(Duration::from_secs(10), what, condition);
}

/// Polls `condition` until it holds, failing after `limit` with `what`.
pub fn within(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < limit, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `redis-server` on a free loopback port, stopped on drop. `None` (after reporting a skip)
/// when redis-server is not installed, unless `SKYRIVER_REQUIRE_REDIS` is set.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start(test: &str) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            skip::skip(test, &skip::REDIS, "redis-server is not installed");
            return None;
        }
        let dir = test_dir();
        let port = skyriver::up::free_loopback_port().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Self {
            child: Some(child),
            port,
            _dir: dir,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The copies of record the daemon at `socket` holds (its `copies_of_record` metric).
pub fn copies_of_record_at(socket: &Path) -> u64 {
    Client::connect(socket)
        .unwrap()
        .metrics()
        .unwrap()
        .copies_of_record
}

/// The nodes `locate_copies` marks as holding a copy of record.
pub fn nodes_of_record(copies: &ObjectCopies) -> Vec<NodeId> {
    copies
        .copies
        .iter()
        .filter(|c| c.of_record)
        .map(|c| c.node)
        .collect()
}
