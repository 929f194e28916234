//! How the daemon picks its fabric on a machine without libibverbs (simulated on any machine by
//! pointing `SKYRIVER_IBVERBS_LIB` at a library that does not exist): `--fabric verbs` refuses
//! to start with a message that says what to install, `--fabric auto` says so in one line and
//! uses TCP.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::test_dir;
use skyriver_client::Client;

const MISSING_LIBRARY: &str = "/nonexistent/libibverbs.so.1";

fn daemon(dir: &std::path::Path, fabric: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skyriver"));
    cmd.args([
        "daemon",
        "--log",
        "info",
        "--memory",
        "16MiB",
        "--no-prefault",
    ])
    .arg("--socket")
    .arg(dir.join("daemon.sock"))
    .args([
        "--head",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--fabric",
        fabric,
    ])
    .env("SKYRIVER_IBVERBS_LIB", MISSING_LIBRARY)
    .env_remove("RUST_LOG")
    .stdin(Stdio::null());
    cmd
}

#[test]
fn fabric_verbs_without_libibverbs_refuses_to_start_and_says_what_to_install() {
    let dir = test_dir();
    let mut child = daemon(dir.path(), "verbs")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn skyriver daemon");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon did not exit without libibverbs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(!status.success(), "must fail; stderr: {stderr}");
    for needle in [MISSING_LIBRARY, "libibverbs1", "rdma-core", "--fabric tcp"] {
        assert!(stderr.contains(needle), "{needle:?} missing from: {stderr}");
    }
    assert!(!dir.path().join("daemon.sock").exists(), "no socket left");
}

#[test]
fn fabric_auto_without_libibverbs_logs_one_line_and_uses_tcp() {
    let dir = test_dir();
    let log = dir.path().join("daemon.log");
    let child = daemon(dir.path(), "auto")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn skyriver daemon");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _guard = Kill(child);
    let socket = dir.path().join("daemon.sock");
    let started = Instant::now();
    let view = loop {
        if let Ok(client) = Client::connect(&socket) {
            if let Ok(view) = client.nodes() {
                break view;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "daemon did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("fabric auto")).collect();
    assert_eq!(lines.len(), 1, "one line about the choice: {text}");
    assert!(
        lines[0].contains("using TCP") && lines[0].contains(MISSING_LIBRARY),
        "{}",
        lines[0]
    );
    assert_eq!(view.fabric, "tcp", "{view:?}");
    assert_eq!(view.members.len(), 1, "{view:?}");
}
