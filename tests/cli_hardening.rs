//! Bad input through the real `skyriver` binary never costs data or the host: each test is one
//! way a new user got it wrong, and the clear refusal (or the right result) it now gets.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{cli, test_dir, DaemonProcess};
use skyriver_client::{Client, ObjectId, StoreError};

fn skyriver(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skyriver"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("SKYRIVER_MEMORY")
        .env_remove("SKYRIVER_SOCKET")
        .stdin(Stdio::null());
    cmd
}

/// Runs a daemon command that must refuse to start; returns its output.
fn refused_daemon(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "must fail");
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn daemon_args<'a>(socket: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["daemon", "--socket", socket];
    args.extend_from_slice(extra);
    args
}

#[test]
fn memory_beyond_what_the_machine_can_give_is_refused_with_an_override() {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let socket = socket.to_str().unwrap();
    // What "available" means is overridden, so no test ever needs (or risks) a real 10 TiB.
    let mut cmd = skyriver(&daemon_args(socket, &["--memory", "2GiB", "--no-prefault"]));
    cmd.env("SKYRIVER_MEMORY_AVAILABLE", "1GiB");
    let text = stderr(&refused_daemon(cmd));
    for needle in [
        "2.0 GiB",
        "1.0 GiB available",
        "--allow-overcommit",
        "--memory",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
    assert!(!Path::new(socket).exists());
    // The explicit override starts it (small for real: 16 MiB against 1 MiB "available").
    let mut cmd = skyriver(&daemon_args(
        socket,
        &["--memory", "16MiB", "--no-prefault", "--allow-overcommit"],
    ));
    cmd.env("SKYRIVER_MEMORY_AVAILABLE", "1MiB");
    let mut child = cmd.stderr(Stdio::null()).spawn().unwrap();
    common::eventually("the overcommitted daemon answers", || {
        Client::connect(socket).is_ok()
    });
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn zero_tiny_and_ambiguous_memory_sizes_are_refused() {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let socket = socket.to_str().unwrap();
    for (memory, needle) in [
        ("0", "too small"),
        ("1", "too small"),
        ("1gb", "ambiguous"),
        ("10TB", "ambiguous"),
    ] {
        let text = stderr(&refused_daemon(skyriver(&daemon_args(
            socket,
            &["--memory", memory],
        ))));
        assert!(text.contains(needle), "--memory {memory}: {text}");
    }
}

#[test]
fn a_socket_path_that_is_a_regular_file_is_never_replaced() {
    let dir = test_dir();
    let precious = dir.path().join("notes.txt");
    std::fs::write(&precious, b"do not delete").unwrap();
    let text = stderr(&refused_daemon(skyriver(&daemon_args(
        precious.to_str().unwrap(),
        &["--memory", "16MiB"],
    ))));
    assert!(text.contains("not a socket"), "{text}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"do not delete");
    let text = stderr(&refused_daemon(skyriver(&daemon_args(
        dir.path().to_str().unwrap(),
        &["--memory", "16MiB"],
    ))));
    assert!(text.contains("is a directory, not a socket"), "{text}");
}

#[test]
fn misspelt_log_levels_are_refused_instead_of_silencing_the_daemon() {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let socket = socket.to_str().unwrap();
    for (level, hint) in [("inf", "info"), ("warning", "warn"), ("bogus", "")] {
        let text = stderr(&refused_daemon(skyriver(&daemon_args(
            socket,
            &["--memory", "16MiB", "--log", level],
        ))));
        assert!(text.contains("unknown log level"), "{level}: {text}");
        assert!(text.contains(hint), "{level}: {text}");
    }
    let mut cmd = skyriver(&daemon_args(socket, &["--memory", "16MiB"]));
    cmd.env("RUST_LOG", "inf");
    let text = stderr(&refused_daemon(cmd));
    assert!(text.contains("RUST_LOG"), "{text}");
}

#[test]
fn flags_that_would_be_ignored_are_refused() {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let socket = socket.to_str().unwrap();
    for (flags, needle) in [
        (vec!["--node-id", "3"], "--head"),
        (vec!["--listen", "127.0.0.1:7000"], "--head"),
        (vec!["--fabric", "tcp"], "--head"),
        (vec!["--durability", "async"], "--backing-file"),
        (vec!["--hugepages", "/tmp"], "not a hugetlbfs mount"),
    ] {
        let mut args = vec!["--memory", "16MiB"];
        args.extend(flags.iter().copied());
        let text = stderr(&refused_daemon(skyriver(&daemon_args(socket, &args))));
        assert!(text.contains(needle), "{flags:?}: {text}");
    }
    let mut cmd = skyriver(&daemon_args(
        socket,
        &["--memory", "16MiB", "--directory", "redis://127.0.0.1:1"],
    ));
    cmd.env("SLURM_NODEID", "abc");
    let text = stderr(&refused_daemon(cmd));
    assert!(text.contains("SLURM_NODEID"), "{text}");
    // A directory given as --backing-file gets advice that loses nothing.
    let text = stderr(&refused_daemon(skyriver(&daemon_args(
        socket,
        &[
            "--memory",
            "16MiB",
            "--backing-file",
            dir.path().to_str().unwrap(),
        ],
    ))));
    assert!(text.contains("is a directory"), "{text}");
    assert!(!text.contains("remove it"), "{text}");
}

#[test]
fn put_from_a_pipe_stores_every_byte() {
    let dir = test_dir();
    let daemon = DaemonProcess::start(dir.path(), "64MiB");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    // /dev/stdin fed by a pipe: a file with no size of its own.
    let mut child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["put", "/dev/stdin", "--socket"])
        .arg(&daemon.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&payload).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (ok, data, err) = cli(&daemon.socket, &["get", &id], None);
    assert!(ok, "{err}");
    assert_eq!(data.len(), payload.len(), "no silent empty object");
    assert!(data == payload);
    // A FIFO, as `<(cmd)` gives.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, b"hi\n").unwrap())
    };
    let (ok, out, err) = cli(&daemon.socket, &["put", fifo.to_str().unwrap()], None);
    writer.join().unwrap();
    assert!(ok, "{err}");
    let id = String::from_utf8(out).unwrap().trim().to_string();
    let (ok, data, _) = cli(&daemon.socket, &["get", &id], None);
    assert!(ok);
    assert_eq!(data, b"hi\n");
}

#[test]
fn watch_fails_when_the_daemon_dies_and_evict_fails_when_nothing_frees() {
    let dir = test_dir();
    let mut daemon = DaemonProcess::start(dir.path(), "64MiB");
    let client = Client::connect(&daemon.socket).unwrap();
    client
        .create_and_seal(ObjectId::from_u64(1), &[7u8; 1000], b"")
        .unwrap();
    let _held = client.get_one(ObjectId::from_u64(1), None).unwrap();
    let (ok, _, err) = cli(&daemon.socket, &["evict", "1MiB"], None);
    assert!(!ok, "nothing could be evicted, yet evict succeeded");
    assert!(err.contains("freed 0 B of the 1.0 MiB asked"), "{err}");

    let mut watcher = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["watch", "--socket"])
        .arg(&daemon.socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `watch` says so on stderr once its subscription is in place.
    let mut watcher_stderr = std::io::BufReader::new(watcher.stderr.take().unwrap());
    let mut first_line = String::new();
    std::io::BufRead::read_line(&mut watcher_stderr, &mut first_line).unwrap();
    assert!(first_line.starts_with("watching "), "{first_line}");
    let _ = daemon.child.kill();
    let _ = daemon.child.wait();
    let rest = std::io::read_to_string(watcher_stderr).unwrap();
    let status = watcher.wait().unwrap();
    assert!(!status.success(), "watch exited 0 after the daemon died");
    assert!(rest.contains("closed the connection"), "{rest}");
}

#[test]
fn a_get_waiting_for_an_aborted_put_hears_it_at_once() {
    let dir = test_dir();
    let daemon = DaemonProcess::start(dir.path(), "64MiB");
    let creator = Client::connect(&daemon.socket).unwrap();
    let writer = creator.create(ObjectId::from_u64(5), 1 << 20, 0).unwrap();
    let socket = daemon.socket.clone();
    let getter = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let started = Instant::now();
        let result = client.get(&[ObjectId::from_u64(5)], Some(Duration::from_secs(30)));
        (result, started.elapsed())
    });
    common::eventually("the get waits in the daemon", || {
        creator.stats().unwrap().waiting_gets == 1
    });
    writer.abort().unwrap();
    let (result, took) = getter.join().unwrap();
    let results = result.unwrap();
    assert!(
        matches!(results[0], Err(StoreError::Aborted(_))),
        "{:?}",
        results[0].as_ref().err()
    );
    assert!(took < Duration::from_secs(10), "waited {took:?}");
}

#[test]
fn an_empty_skyriver_socket_means_the_default() {
    let out = skyriver(&["stat"])
        .env("SKYRIVER_SOCKET", "")
        .env("TMPDIR", "/nonexistent")
        .output()
        .unwrap();
    let text = stderr(&out);
    assert!(!out.status.success());
    assert!(text.contains("/tmp/skyriver-"), "{text}");
    assert!(!text.contains("at : "), "{text}");
}

#[test]
fn out_of_memory_errors_use_human_sizes() {
    let dir = test_dir();
    let daemon = DaemonProcess::start(dir.path(), "16MiB");
    let client = Client::connect(&daemon.socket).unwrap();
    let _writer = client.create(ObjectId::from_u64(1), 12 << 20, 0).unwrap();
    let error = client
        .create(ObjectId::from_u64(2), 8 << 20, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("8.0 MiB"), "{error}");
    assert!(error.contains("16.0 MiB"), "{error}");
}

#[test]
fn a_large_arena_reports_progress_and_clients_hear_starting_meanwhile() {
    // A 3 GiB pre-faulted arena takes seconds to create: long enough to connect during it.
    const ARENA: u64 = 3 << 30;
    let available = skyriver_daemon::host_memory::available(None).map_or(0, |a| a.bytes);
    if available < 3 * ARENA {
        common::skip::skip(
            "a_large_arena_reports_progress_and_clients_hear_starting_meanwhile",
            &common::skip::MEMORY,
            &format!(
                "needs {} available for a 3 GiB arena, the machine has {}",
                skyriver_daemon::size::format_bytes(3 * ARENA),
                skyriver_daemon::size::format_bytes(available)
            ),
        );
        return;
    }
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let log = dir.path().join("d.log");
    let mut child = skyriver(&["daemon", "--memory", "3GiB", "--log", "info", "--socket"])
        .arg(&socket)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(&mut child);
    // The socket is there at once, and answers "starting" with how far it got.
    common::eventually("the socket is bound", || socket.exists());
    let early = Client::connect(&socket).err();
    let Some(skyriver_client::ClientError::Store(StoreError::Starting(status))) = early else {
        panic!("a client during start-up got {early:?}, not Starting");
    };
    assert!(status.contains("arena"), "{status}");
    // The CLI waits for it, says so, and then works.
    let (ok, stdout, stderr) = cli(&socket, &["ls", "--json"], None);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("is starting"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&stdout).trim(), "[]");
    drop(guard);
    let text = std::fs::read_to_string(&log).unwrap();
    for needle in [
        "creating the arena: reserving 1.0 GiB of 3.0 GiB (33%)",
        "creating the arena: pre-faulting 3.0 GiB of 3.0 GiB (100%)",
    ] {
        assert!(
            text.contains(needle),
            "{needle:?} missing from the log: {text}"
        );
    }
}

/// Kills and reaps a child when the test ends, also on failure.
struct KillOnDrop<'a>(&'a mut std::process::Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_closed_standard_output_ends_commands_quietly() {
    let dir = test_dir();
    let daemon = DaemonProcess::start(dir.path(), "64MiB");
    let client = Client::connect(&daemon.socket).unwrap();
    // More listing than a pipe holds (64 KiB), so `ls` still writes after the reader left.
    for i in 0..2_000 {
        client
            .create_and_seal(ObjectId::from_u64(i), b"x", b"")
            .unwrap();
    }
    client
        .create_and_seal(ObjectId::from_u64(9_999), &vec![5u8; 1 << 20], b"")
        .unwrap();
    let big = ObjectId::from_u64(9_999).to_string();
    for args in [vec!["ls"], vec!["ls", "--json"], vec!["get", big.as_str()]] {
        // As `skyriver ls | head -1`: the reader takes one line and closes the pipe.
        let mut child = skyriver(&args)
            .arg("--socket")
            .arg(&daemon.socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = Vec::new();
        std::io::BufRead::read_until(&mut stdout, b'\n', &mut line).unwrap();
        assert!(!line.is_empty(), "{args:?} printed nothing");
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let text = stderr(&out);
        assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {text}");
        assert!(text.is_empty(), "{args:?} was not quiet: {text}");
    }
}

#[test]
fn daemon_dash_h_prints_help_and_plasma_store_keeps_plasmas_flags() {
    let out = skyriver(&["daemon", "-h"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: skyriver daemon"), "{help}");
    assert!(help.contains("--memory"), "{help}");
    // plasma_store's -h (huge pages) needs its -d there.
    let out = skyriver(&[
        "plasma_store",
        "-h",
        "-m",
        "20000000",
        "-s",
        "/nonexistent/x.sock",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-d <DIR>"), "{}", stderr(&out));
    // Through a link named plasma_store, as scripts written for Plasma start it.
    let dir = test_dir();
    let link = dir.path().join("plasma_store");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_skyriver"), &link).unwrap();
    let socket = dir.path().join("plasma.sock");
    let child = Command::new(&link)
        .args(["-m", "20000000", "-d", "/dev/shm", "-s"])
        .arg(&socket)
        .args(["--", "--log", "warn", "--no-prefault"])
        .env_remove("SKYRIVER_MEMORY")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut daemon = DaemonProcess {
        child,
        socket: socket.clone(),
    };
    let started = Instant::now();
    let client = loop {
        if let Ok(client) = Client::connect(&socket) {
            break client;
        }
        assert!(
            daemon.child.try_wait().unwrap().is_none(),
            "plasma_store exited"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "no daemon");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(client.stats().unwrap().capacity_bytes, 20_000_000);
    let help = Command::new(&link).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage: plasma_store"));
}

#[test]
fn numeric_daemon_flags_outside_their_range_are_refused_with_the_range_and_why() {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let socket = socket.to_str().unwrap();
    for (flag, value, needles) in [
        ("--lease-ms", "0", ["1000 to 3600000", "rendezvous"]),
        ("--poll-us", "100000000", ["0 to 10000", "CPU"]),
        ("--poll-max-us", "100000000", ["0 to 10000", "CPU"]),
        ("--location-cache", "99999999", ["0 to 16777216", "memory"]),
        ("--ib-port", "0", ["1 to 255", "numbered from 1"]),
        ("--gid-index", "256", ["0 to 255", "one byte"]),
        ("--socket-mode", "1666", ["beyond 777", "permission bits"]),
        ("--socket-mode", "066", ["owner", "600"]),
    ] {
        let text = stderr(&refused_daemon(skyriver(&daemon_args(
            socket,
            &["--memory", "16MiB", flag, value],
        ))));
        for needle in needles {
            assert!(
                text.contains(needle),
                "{flag} {value}: {needle:?} missing: {text}"
            );
        }
    }
    assert!(!Path::new(socket).exists());
}

#[test]
fn evict_on_an_empty_store_succeeds_and_says_nothing_was_there() {
    let dir = test_dir();
    let daemon = DaemonProcess::start(dir.path(), "64MiB");
    let (ok, out, err) = cli(&daemon.socket, &["evict", "1GiB"], None);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "evict on an empty store failed: {err}");
    assert!(out.contains("evicted 0 objects, 0 B"), "{out}");
    assert!(out.contains("the store is empty"), "{out}");
}

/// Starts a daemon with `extra` flags, waits until it answers "starting", sends SIGTERM and
/// checks that it stops cleanly: status 0, a log line, the socket removed.
fn sigterm_during_start_up(extra: &[&str]) {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let log = dir.path().join("d.log");
    let mut args = vec![
        "daemon",
        "--log",
        "info",
        "--socket",
        socket.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut child = skyriver(&args)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(&mut child);
    common::eventually("the daemon answers \"starting\"", || {
        matches!(
            Client::connect(&socket),
            Err(skyriver_client::ClientError::Store(StoreError::Starting(_)))
        )
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(guard.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the daemon did not stop within 10 s of SIGTERM during start-up"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{status}: {text}");
    assert!(text.contains("SIGTERM during start-up"), "{text}");
    assert!(!socket.exists(), "the socket was left behind");
}

#[test]
fn sigterm_while_joining_a_silent_directory_stops_cleanly() {
    // A directory that accepts connections and never answers: the join waits.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let head = silent.local_addr().unwrap().to_string();
    sigterm_during_start_up(&[
        "--memory",
        "16MiB",
        "--no-prefault",
        "--fabric",
        "tcp",
        "--node-id",
        "1",
        "--join",
        &head,
    ]);
}

#[test]
fn sigterm_while_creating_a_large_arena_stops_cleanly() {
    // A 2 GiB pre-faulted arena takes seconds to create: long enough to signal during it.
    const ARENA: u64 = 2 << 30;
    let available = skyriver_daemon::host_memory::available(None).map_or(0, |a| a.bytes);
    if available < 3 * ARENA {
        common::skip::skip(
            "sigterm_while_creating_a_large_arena_stops_cleanly",
            &common::skip::MEMORY,
            &format!(
                "needs {} available for a 2 GiB arena, the machine has {}",
                skyriver_daemon::size::format_bytes(3 * ARENA),
                skyriver_daemon::size::format_bytes(available)
            ),
        );
        return;
    }
    sigterm_during_start_up(&["--memory", "2GiB"]);
}

#[test]
fn an_unreachable_peer_is_warned_about_once_not_on_every_dial() {
    let dir = test_dir();
    let port = skyriver::up::free_loopback_port().unwrap();
    let head = format!("127.0.0.1:{port}");
    let token = "unreachable-peer-test";
    let daemon = |node: &str, membership: &[&str], log: &str| {
        let socket = dir.path().join(format!("node-{node}.sock"));
        let mut args = vec!["daemon", "--memory", "16MiB", "--no-prefault", "--log", log];
        args.extend_from_slice(&[
            "--fabric",
            "tcp",
            "--listen",
            "127.0.0.1:0",
            "--node-id",
            node,
        ]);
        args.extend_from_slice(membership);
        let mut cmd = skyriver(&args);
        cmd.arg("--socket")
            .arg(&socket)
            .env("SKYRIVER_CLUSTER_TOKEN", token)
            .stderr(std::fs::File::create(dir.path().join(format!("node-{node}.log"))).unwrap());
        let child = cmd.spawn().unwrap();
        (
            DaemonProcess { child, socket },
            dir.path().join(format!("node-{node}.log")),
        )
    };
    let (_head, _) = daemon("0", &["--head", &head], "warn");
    common::eventually("the head serves the directory", || {
        std::net::TcpStream::connect(&head).is_ok()
    });
    // A member whose fabric nobody serves (port 1 refuses at once): a node that the directory
    // still lists but no one can reach, for as long as this test keeps its session.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (notices, _keep) = skyriver_transport::directory::notice_channel();
    let ghost = runtime
        .block_on(skyriver_transport::directory::connect(
            &skyriver_transport::directory::DirectorySpec::Builtin { addr: head.clone() },
            skyriver_transport::directory::MemberInfo {
                node: skyriver_core::NodeId(1),
                fabric_addr: "127.0.0.1:1".parse().unwrap(),
                fabric: "tcp".into(),
                incarnation: 1,
                failure_domain: String::new(),
            },
            "default",
            &token.into(),
            notices,
            skyriver_transport::directory::JoinOptions::default(),
        ))
        .unwrap();
    // Node 2 dials node 1 (the higher id dials); debug shows every failed dial.
    let (_node2, log) = daemon("2", &["--join", &head], "debug");
    let dials = |text: &str| {
        text.lines()
            .filter(|l| l.contains("cannot connect to peer") && l.contains("node-1"))
            .count()
    };
    let started = Instant::now();
    while dials(&std::fs::read_to_string(&log).unwrap()) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node-2 did not dial node-1 three times"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("node-1"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("back-off"), "{}", warnings[0]);
    let repeats = text
        .lines()
        .filter(|l| l.contains("peer still unreachable") && l.contains("node-1"))
        .count();
    assert!(repeats >= 2, "{text}");
    drop(ghost);
}

#[test]
fn a_socket_path_taken_by_another_users_daemon_names_the_owner() {
    let dir = test_dir();
    let socket = dir.path().join("taken.sock");
    // Someone listens there (the kernel accepts into the backlog: it answers).
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // Root's daemon meets another user's socket; others meet their own.
    let (uid, name) = match nix::unistd::geteuid().is_root() {
        true => {
            std::os::unix::fs::chown(&socket, Some(65534), None).unwrap();
            (65534, nix::unistd::User::from_uid(65534.into()).unwrap())
        }
        false => {
            let me = nix::unistd::geteuid();
            (me.as_raw(), nix::unistd::User::from_uid(me).unwrap())
        }
    };
    let text = stderr(&refused_daemon(skyriver(&daemon_args(
        socket.to_str().unwrap(),
        &["--memory", "16MiB", "--no-prefault"],
    ))));
    assert!(text.contains("already listening"), "{text}");
    assert!(text.contains(&format!("uid {uid}")), "{text}");
    if let Some(user) = name {
        assert!(text.contains(&format!("user {}", user.name)), "{text}");
    }
    assert!(socket.exists(), "another daemon's socket is never removed");
}

#[test]
fn fabric_auto_without_verbs_says_why_once() {
    let dir = test_dir();
    let socket = dir.path().join("d.sock");
    let log = dir.path().join("d.log");
    let mut child = skyriver(&[
        "daemon",
        "--memory",
        "16MiB",
        "--no-prefault",
        "--log",
        "info",
    ])
    .args(["--head", "127.0.0.1:0", "--socket"])
    .arg(&socket)
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let _guard = KillOnDrop(&mut child);
    common::eventually("the daemon joined its own cluster", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("joined the cluster")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let Some(line) = text.lines().find(|l| l.contains("fabric auto:")) else {
        common::skip::skip(
            "fabric_auto_without_verbs_says_why_once",
            &common::skip::NO_VERBS,
            "this machine has RDMA verbs, so fabric auto did not fall back",
        );
        return;
    };
    if line.contains("RDMA verbs unavailable") {
        assert_eq!(line.matches("RDMA verbs unavailable").count(), 1, "{line}");
    }
    assert!(line.contains("using TCP"), "{line}");
}
