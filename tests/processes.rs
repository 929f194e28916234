//! A real `skyriver daemon` process driven by several client processes.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use skyriver_client::{Client, ObjectId};

/// When this variable is set, the test binary acts as a client process that creates an object,
/// writes half of it and then waits to be killed.
const CREATOR_ROLE: &str = "SKYRIVER_TEST_CREATOR_SOCKET";

#[test]
fn creator_role() {
    let Ok(socket) = std::env::var(CREATOR_ROLE) else {
        return; // Only meaningful as a child process.
    };
    let client = Client::connect(socket).unwrap();
    let mut writer = client.create(ObjectId::from_u64(99), 8 << 20, 0).unwrap();
    writer.data_mut()[..4 << 20].fill(7);
    client
        .create_and_seal(ObjectId::from_u64(100), b"sealed before the crash", b"")
        .unwrap();
    let _held = client.get_one(ObjectId::from_u64(100), None).unwrap();
    println!("ready");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_client_killed_mid_create_leaves_no_trace() {
    let dir = common::test_dir();
    let daemon = common::DaemonProcess::start(dir.path(), "32MiB");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "creator_role", "--nocapture", "--test-threads=1"])
        .env(CREATOR_ROLE, &daemon.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let observer = Client::connect(&daemon.socket).unwrap();
    common::eventually("the creator holds its objects", || {
        observer
            .list()
            .unwrap()
            .iter()
            .any(|o| o.info.id == ObjectId::from_u64(100) && o.ref_count == 1)
    });
    let unsealed = observer.list().unwrap();
    assert!(unsealed
        .iter()
        .any(|o| o.info.id == ObjectId::from_u64(99) && !o.sealed));

    child.kill().unwrap(); // SIGKILL: no chance to clean up.
    child.wait().unwrap();
    common::eventually("the daemon noticed the dead client", || {
        observer.stats().unwrap().client_count == 1
    });
    let objects = observer.list().unwrap();
    assert_eq!(
        objects.len(),
        1,
        "the unsealed object was aborted: {objects:?}"
    );
    assert_eq!(objects[0].info.id, ObjectId::from_u64(100));
    assert_eq!(
        objects[0].ref_count, 0,
        "the dead client's reference was released"
    );
    assert_eq!(
        observer.stats().unwrap().allocated_bytes,
        64,
        "the 8 MiB were freed"
    );
    let object = observer.get_one(ObjectId::from_u64(100), None).unwrap();
    assert_eq!(object.data(), b"sealed before the crash");
}

#[test]
fn cli_put_get_ls_rm_across_processes() {
    let dir = common::test_dir();
    let daemon = common::DaemonProcess::start(dir.path(), "64MiB");
    let input = dir.path().join("input.bin");
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&input, &payload).unwrap();

    let (ok, stdout, stderr) = common::cli(&daemon.socket, &["put", input.to_str().unwrap()], None);
    assert!(ok, "{stderr}");
    let id = String::from_utf8(stdout).unwrap().trim().to_string();
    assert_eq!(id.len(), 40);

    let output = dir.path().join("output.bin");
    let (ok, _, stderr) = common::cli(
        &daemon.socket,
        &["get", &id, "-o", output.to_str().unwrap()],
        None,
    );
    assert!(ok, "{stderr}");
    assert_eq!(std::fs::read(&output).unwrap(), payload);

    let chosen = "00112233445566778899aabbccddeeff00112233";
    let (ok, stdout, stderr) = common::cli(
        &daemon.socket,
        &["put", "--id", chosen, "-"],
        Some(b"from stdin"),
    );
    assert!(ok, "{stderr}");
    assert_eq!(String::from_utf8(stdout).unwrap().trim(), chosen);
    let (ok, stdout, _) = common::cli(&daemon.socket, &["get", chosen], None);
    assert!(ok);
    assert_eq!(stdout, b"from stdin");
    let (ok, _, stderr) = common::cli(
        &daemon.socket,
        &["put", "--id", chosen, "-"],
        Some(b"again"),
    );
    assert!(!ok);
    assert!(stderr.contains("already exists"), "{stderr}");

    let (ok, stdout, _) = common::cli(&daemon.socket, &["ls"], None);
    assert!(ok);
    let listing = String::from_utf8(stdout).unwrap();
    assert!(
        listing.contains(&id) && listing.contains(chosen),
        "{listing}"
    );
    assert!(listing.contains("2 objects"), "{listing}");

    let (ok, _, _) = common::cli(&daemon.socket, &["rm", &id, chosen], None);
    assert!(ok);
    let (ok, stdout, _) = common::cli(&daemon.socket, &["stat", "--json"], None);
    assert!(ok);
    let stats: serde_json::Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(stats["object_count"], 0);
    let (ok, _, stderr) = common::cli(&daemon.socket, &["get", &id], None);
    assert!(!ok);
    assert!(stderr.contains("not found"), "{stderr}");
}

#[test]
fn watch_prints_events_from_other_processes() {
    let dir = common::test_dir();
    let daemon = common::DaemonProcess::start(dir.path(), "16MiB");
    let watcher = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["watch", "--count", "2", "--socket"])
        .arg(&daemon.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let observer = Client::connect(&daemon.socket).unwrap();
    common::eventually("the watcher subscribed", || {
        observer.stats().unwrap().client_count >= 3
    });
    let id = "ffffffffffffffffffffffffffffffffffffffff";
    assert!(common::cli(&daemon.socket, &["put", "--id", id, "-"], Some(b"abc")).0);
    assert!(common::cli(&daemon.socket, &["rm", id], None).0);
    let output = watcher.wait_with_output().unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("sealed") && lines[0].contains(id),
        "{text}"
    );
    assert!(
        lines[1].starts_with("deleted") && lines[1].contains(id),
        "{text}"
    );
}

#[test]
fn the_daemon_stops_cleanly_on_sigterm_and_refuses_a_second_instance() {
    let dir = common::test_dir();
    let mut daemon = common::DaemonProcess::start(dir.path(), "16MiB");
    let second = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["daemon", "--memory", "16MiB", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("already listening"));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = daemon.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!daemon.socket.exists(), "the socket file is removed");
}

#[test]
fn the_daemon_takes_plasma_stores_flags() {
    let dir = common::test_dir();
    let socket = dir.path().join("plasma.sock");
    // As a script written for plasma_store would start it: -m in plain bytes, -s, -d.
    let child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["plasma_store", "-m", "20000000", "-d", "/dev/shm", "-s"])
        .arg(&socket)
        .args(["--", "--log", "warn"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut daemon = common::DaemonProcess {
        child,
        socket: socket.clone(),
    };
    let started = std::time::Instant::now();
    let client = loop {
        if let Ok(client) = Client::connect(&socket) {
            break client;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "daemon did not start"
        );
        assert!(daemon.child.try_wait().unwrap().is_none(), "daemon exited");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(client.stats().unwrap().capacity_bytes, 20_000_000);

    let skyriver = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args(args)
            .output()
            .unwrap()
    };
    // -h is plasma_store's huge pages flag there, and needs -d; `skyriver daemon -h` is help.
    let help = skyriver(&["daemon", "-h"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("-m, --memory"));
    let huge_pages_without_dir =
        skyriver(&["plasma_store", "-h", "-m", "1", "-s", "/nonexistent/x.sock"]);
    assert!(!huge_pages_without_dir.status.success());
    assert!(String::from_utf8_lossy(&huge_pages_without_dir.stderr).contains("-d <DIR>"));
}
