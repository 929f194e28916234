//! `skyriver up` through the real binary: it supervises its daemons (a daemon that exits is
//! reported at once and the others are stopped), names its directory, passes `--cluster`,
//! leaves nothing behind in $TMPDIR, and with Redis leaves no keys after a clean stop. One
//! `up` per directory (a second is refused without touching the first), its daemons die with
//! it, and it refuses a total memory the machine cannot give.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running `skyriver up`, killed (with its daemons) on drop if the test fails midway.
struct Up {
    child: Child,
    /// Lines of its stdout, as they come.
    stdout: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    seen: Vec<String>,
}

impl Up {
    fn spawn(tmp: &Path, args: &[&str], envs: &[(&str, &str)]) -> Up {
        Up::spawn_in(tmp, tmp, args, envs)
    }

    /// As [`Up::spawn`], in the working directory `cwd`.
    fn spawn_in(cwd: &Path, tmp: &Path, args: &[&str], envs: &[(&str, &str)]) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .current_dir(cwd)
            .arg("up")
            .args(args)
            .env("TMPDIR", tmp)
            .env_remove("SKYRIVER_CLUSTER_TOKEN")
            .env_remove("SKYRIVER_CLUSTER")
            .env_remove("SKYRIVER_MEMORY_AVAILABLE")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn skyriver up");
        let (tx, stdout) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = Some(std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        }));
        Up {
            child,
            stdout,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) until `up` says the cluster is up; returns its stdout so far.
    fn wait_up(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    let done = line.starts_with("Ctrl-C stops the cluster");
                    self.seen.push(line);
                    if done {
                        return self.seen.join("\n");
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let status = self.child.wait();
                    panic!(
                        "up did not come up ({status:?}); stdout: {:?}; stderr: {}",
                        self.seen,
                        self.stderr.take().unwrap().join().unwrap()
                    );
                }
            }
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits (bounded) for `up` to exit: (exit code, stderr, how long it took).
    fn wait_exit(&mut self, limit: Duration) -> (Option<i32>, String, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let stderr = self.stderr.take().unwrap().join().unwrap();
                return (status.code(), stderr, started.elapsed());
            }
            if started.elapsed() > limit {
                // Drop stops up and its daemons; their stderr is not awaited (they hold it).
                panic!("up did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // Its daemons are in their own process groups: stop them through up, and kill any
            // that outlive it (only if up failed to do its job).
            let daemons = children_of(self.pid());
            let _ = kill(self.pid(), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            for daemon in daemons {
                // Still the same process (pids are reused): a skyriver daemon.
                let cmdline = std::fs::read(format!("/proc/{daemon}/cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains("daemon") {
                    let _ = kill(daemon, Signal::SIGKILL);
                }
            }
        }
    }
}

/// The processes whose parent is `parent` (from /proc).
fn children_of(parent: Pid) -> Vec<Pid> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(parent.as_raw()) {
            children.push(Pid::from_raw(pid));
        }
    }
    children.sort();
    children
}

fn alive(pid: Pid) -> bool {
    kill(pid, None).is_ok()
}

/// Whether `pid` runs (a zombie whose parent has not reaped it yet does not).
fn running(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// Daemons SIGKILLed on drop if still running: for tests whose `up` can no longer stop them.
struct KillOnDrop(Vec<Pid>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &daemon in &self.0 {
            // Still the same process (pids are reused): a skyriver daemon.
            let cmdline = std::fs::read(format!("/proc/{daemon}/cmdline")).unwrap_or_default();
            if running(daemon) && String::from_utf8_lossy(&cmdline).contains("daemon") {
                let _ = kill(daemon, Signal::SIGKILL);
            }
        }
    }
}

/// Waits (bounded) until none of `pids` runs; false if some still do after `limit`.
fn all_gone(pids: &[Pid], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while pids.iter().any(|&pid| running(pid)) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    found.sort();
    found
}

#[test]
fn up_reports_a_daemon_killed_later_at_once_and_stops_the_others() {
    let tmp = common::test_dir();
    let dir = common::test_dir();
    let cluster_dir = dir.path().join("sky");
    let mut up = Up::spawn(
        tmp.path(),
        &[
            "--nodes",
            "2",
            "--memory",
            "64MiB",
            "--dir",
            cluster_dir.to_str().unwrap(),
        ],
        &[],
    );
    up.wait_up();
    let daemons = children_of(up.pid());
    assert_eq!(daemons.len(), 2, "{daemons:?}");
    // The daemon with the higher pid is node-1 (they start in order).
    kill(daemons[1], Signal::SIGKILL).unwrap();
    let (code, stderr, took) = up.wait_exit(Duration::from_secs(20));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(took < Duration::from_secs(5), "noticed after {took:?}");
    assert!(stderr.contains("node-1"), "{stderr}");
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    assert!(
        stderr.contains("skyriver daemon ready"),
        "no log lines: {stderr}"
    );
    // The other daemon was stopped and reaped, its socket removed; the logs stay in --dir.
    assert!(!alive(daemons[0]), "node-0 still runs");
    let left = entries(&cluster_dir);
    assert!(
        left.iter()
            .all(|p| p.extension().is_some_and(|e| e == "log")),
        "{left:?}"
    );
    assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
}

#[test]
fn up_reports_a_daemon_that_fails_at_start_up_at_once_and_leaves_nothing_behind() {
    let tmp = common::test_dir();
    let mut up = Up::spawn(
        tmp.path(),
        &["--nodes", "2", "--daemon-arg=--lease-ms=soon"],
        &[],
    );
    let (code, stderr, took) = up.wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(took < Duration::from_secs(10), "reported after {took:?}");
    assert!(stderr.contains("during start-up"), "{stderr}");
    // The daemon's own words, from its log.
    assert!(stderr.contains("invalid value 'soon'"), "{stderr}");
    assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
}

#[test]
fn up_refuses_zero_nodes() {
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["up", "--nodes", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 1 node"), "{stderr}");
}

fn redis_keys(port: u16, pattern: &str) -> Vec<String> {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--raw", "KEYS", pattern])
        .output()
        .expect("redis-cli runs");
    assert!(output.status.success());
    let mut keys: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

#[test]
fn up_with_redis_names_it_passes_the_cluster_name_and_leaves_no_keys_when_stopped() {
    let Some(redis) = common::RedisServer::start("up_with_redis") else {
        return;
    };
    let tmp = common::test_dir();
    let args = [
        "--nodes",
        "2",
        "--memory",
        "64MiB",
        "--directory",
        &redis.url(),
        "--cluster",
        "blue",
    ];
    let mut up = Up::spawn(tmp.path(), &args, &[]);
    let banner = up.wait_up();
    assert!(
        banner.contains(&format!("Redis directory at {}", redis.url())),
        "{banner}"
    );
    assert!(!banner.contains("built-in"), "{banner}");
    let keys = redis_keys(redis.port, "*");
    assert!(
        keys.contains(&"skyriver:{blue}:node:1".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.iter().all(|k| k.starts_with("skyriver:{blue}:")),
        "{keys:?}"
    );

    kill(up.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr, _) = up.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{stderr}");
    // A clean stop leaves nothing: no node records, no locations, no token.
    assert_eq!(redis_keys(redis.port, "*"), Vec::<String>::new());
    assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());

    // So the name starts again at once, here with another token.
    let mut again = Up::spawn(
        tmp.path(),
        &args,
        &[("SKYRIVER_CLUSTER_TOKEN", "a-new-token")],
    );
    again.wait_up();
}

#[test]
fn cluster_reset_frees_the_name_of_a_crashed_redis_cluster() {
    let Some(redis) = common::RedisServer::start("cluster_reset") else {
        return;
    };
    let tmp = common::test_dir();
    let args = [
        "--nodes",
        "1",
        "--memory",
        "64MiB",
        "--directory",
        &redis.url(),
        "--cluster",
        "green",
    ];
    let mut crashed = Up::spawn(tmp.path(), &args, &[("SKYRIVER_CLUSTER_TOKEN", "first")]);
    crashed.wait_up();
    for daemon in children_of(crashed.pid()) {
        kill(daemon, Signal::SIGKILL).unwrap();
    }
    let (code, _, _) = crashed.wait_exit(Duration::from_secs(20));
    assert_eq!(code, Some(1));
    assert!(redis_keys(redis.port, "skyriver:{green}:token").len() == 1);

    // Another token is refused, and the error says what to do.
    let mut refused = Up::spawn(tmp.path(), &args, &[("SKYRIVER_CLUSTER_TOKEN", "second")]);
    let (code, stderr, _) = refused.wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{stderr}");
    let reset = format!(
        "skyriver cluster reset --directory {} --cluster green",
        redis.url()
    );
    assert!(stderr.contains(&reset), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["cluster", "reset", "--directory", &redis.url()])
        .args(["--cluster", "green", "--force"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("reset"), "{stdout}");
    assert_eq!(redis_keys(redis.port, "*"), Vec::<String>::new());
    let mut fresh = Up::spawn(tmp.path(), &args, &[("SKYRIVER_CLUSTER_TOKEN", "second")]);
    fresh.wait_up();
}

#[test]
fn a_second_up_in_the_same_dir_is_refused_and_leaves_the_first_cluster_intact() {
    let tmp = common::test_dir();
    let dir = common::test_dir();
    let cluster_dir = dir.path().join("sky");
    let args = [
        "--nodes",
        "2",
        "--memory",
        "64MiB",
        "--dir",
        cluster_dir.to_str().unwrap(),
    ];
    let mut first = Up::spawn(tmp.path(), &args, &[]);
    first.wait_up();
    let logs = [
        cluster_dir.join("node-0.log"),
        cluster_dir.join("node-1.log"),
    ];
    let log_lengths: Vec<u64> = logs
        .iter()
        .map(|log| std::fs::metadata(log).unwrap().len())
        .collect();
    assert!(log_lengths.iter().all(|&l| l > 0), "{log_lengths:?}");

    let mut second = Up::spawn(tmp.path(), &args, &[]);
    let (code, stderr, _) = second.wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!(
        "a cluster is already running in {}, pid {}",
        std::fs::canonicalize(&cluster_dir).unwrap().display(),
        first.pid()
    );
    assert!(stderr.contains(&expected), "{stderr}");

    // The first cluster's sockets answer, its daemons still see each other, its logs are whole.
    for node in 0..2 {
        let socket = cluster_dir.join(format!("node-{node}.sock"));
        let view = skyriver_client::Client::connect(&socket)
            .and_then(|client| client.nodes())
            .unwrap_or_else(|e| panic!("{} does not answer: {e}", socket.display()));
        assert_eq!(view.members.len(), 2);
        assert!(view.members.iter().all(|m| m.connected), "{view:?}");
    }
    for (log, &before) in logs.iter().zip(&log_lengths) {
        let now = std::fs::metadata(log).unwrap().len();
        assert!(
            now >= before,
            "{} shrank from {before} to {now}",
            log.display()
        );
    }
    assert!(alive(first.pid()));
    kill(first.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr, _) = first.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_killed_up_takes_its_daemons_with_it_and_the_next_up_in_its_dir_starts_cleanly() {
    let tmp = common::test_dir();
    let dir = common::test_dir();
    let cluster_dir = dir.path().join("sky");
    let args = [
        "--nodes",
        "2",
        "--memory",
        "64MiB",
        "--dir",
        cluster_dir.to_str().unwrap(),
    ];
    let mut killed = Up::spawn(tmp.path(), &args, &[]);
    killed.wait_up();
    let daemons = children_of(killed.pid());
    assert_eq!(daemons.len(), 2, "{daemons:?}");
    let _cleanup = KillOnDrop(daemons.clone());
    kill(killed.pid(), Signal::SIGKILL).unwrap();
    let _ = killed.child.wait();
    assert!(
        all_gone(&daemons, Duration::from_secs(20)),
        "the daemons of a killed up still run: {daemons:?}"
    );

    let mut next = Up::spawn(tmp.path(), &args, &[]);
    let banner = next.wait_up();
    assert!(banner.contains("2 nodes"), "{banner}");
    kill(next.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr, _) = next.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", killed.pid())),
        "the leftovers of the killed up are not reported: {stderr}"
    );
}

#[test]
fn up_refuses_a_total_memory_the_machine_cannot_give_before_starting_anything() {
    let available = skyriver_daemon::host_memory::available(None)
        .expect("/proc/meminfo is readable here")
        .bytes;
    // Each daemon fits on its own; the two together do not.
    let each = ((available / 10 * 6) >> 20) << 20;
    let tmp = common::test_dir();
    let dir = common::test_dir();
    let cluster_dir = dir.path().join("sky");
    let memory = format!("{}MiB", each >> 20);
    let mut up = Up::spawn(
        tmp.path(),
        &[
            "--nodes",
            "2",
            "--memory",
            &memory,
            "--dir",
            cluster_dir.to_str().unwrap(),
        ],
        &[],
    );
    let (code, stderr, _) = up.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{stderr}");
    let total = skyriver_daemon::size::format_bytes(2 * each);
    assert!(stderr.contains(&total), "no total {total}: {stderr}");
    assert!(stderr.contains("available"), "{stderr}");
    assert!(stderr.contains("--allow-overcommit"), "{stderr}");
    assert!(!cluster_dir.exists(), "up made {}", cluster_dir.display());
}

#[test]
fn up_prints_absolute_socket_paths_for_a_relative_dir() {
    let tmp = common::test_dir();
    let cwd = common::test_dir();
    let mut up = Up::spawn_in(
        cwd.path(),
        tmp.path(),
        &["--nodes", "1", "--memory", "64MiB", "--dir", "relsky"],
        &[],
    );
    let banner = up.wait_up();
    let absolute = std::fs::canonicalize(cwd.path()).unwrap().join("relsky");
    let export = format!(
        "export SKYRIVER_SOCKET={}",
        absolute.join("node-0.sock").display()
    );
    assert!(banner.contains(&export), "{banner}");
    assert!(
        banner.contains(&format!("logs: {}/node-N.log", absolute.display())),
        "{banner}"
    );
}

#[test]
fn the_directory_of_a_killed_up_under_tmpdir_is_removed_by_the_next_up() {
    let tmp = common::test_dir();
    let args = ["--nodes", "1", "--memory", "64MiB"];
    let mut killed = Up::spawn(tmp.path(), &args, &[]);
    killed.wait_up();
    let daemons = children_of(killed.pid());
    let _cleanup = KillOnDrop(daemons.clone());
    kill(killed.pid(), Signal::SIGKILL).unwrap();
    let _ = killed.child.wait();
    assert!(
        all_gone(&daemons, Duration::from_secs(20)),
        "the daemons of a killed up still run: {daemons:?}"
    );
    let left = entries(tmp.path());
    assert_eq!(left.len(), 1, "{left:?}");

    let mut next = Up::spawn(tmp.path(), &args, &[]);
    next.wait_up();
    let now = entries(tmp.path());
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], left[0], "the killed up's directory is still there");
    kill(next.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr, _) = next.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
}

/// Shared memory `pid` holds resident (`RssShmem` of /proc/PID/status), in bytes.
fn resident_shared_bytes(pid: Pid) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no RssShmem in /proc/{pid}/status: {status}"));
    kib * 1024
}

#[test]
fn up_prefaults_its_daemons_stores_only_when_asked() {
    const MEMORY: u64 = 64 << 20;
    for prefault in [false, true] {
        let tmp = common::test_dir();
        let mut args = vec!["--nodes", "2", "--memory", "64MiB"];
        if prefault {
            args.push("--prefault");
        }
        let mut up = Up::spawn(tmp.path(), &args, &[]);
        up.wait_up();
        let daemons = children_of(up.pid());
        assert_eq!(daemons.len(), 2, "{daemons:?}");
        for daemon in daemons {
            let resident = resident_shared_bytes(daemon);
            if prefault {
                assert!(
                    resident >= MEMORY,
                    "prefaulted daemon {daemon}: {resident} B"
                );
            } else {
                assert!(
                    resident < MEMORY / 2,
                    "daemon {daemon}: {resident} B resident"
                );
            }
        }
    }
}
