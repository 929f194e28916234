//! `skyriver chaos` end to end: a short run on real daemons in namespaces passes the checker in
//! both persistence modes, and leaves nothing behind, also when interrupted. Needs root; skips
//! with a line elsewhere (after checking the refusal says what is needed), unless
//! `SKYRIVER_REQUIRE_NETNS` is set (CI), where it fails instead.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_skyriver")
}

fn namespaces_or_skip(test: &str) -> bool {
    match skyriver::netns::available() {
        Ok(()) => true,
        Err(reason) => {
            if reason == skyriver::netns::NetnsUnavailable::NotRoot {
                let output = Command::new(exe())
                    .args(["chaos", "--nodes", "3", "--seconds", "10", "--seed", "1"])
                    .output()
                    .unwrap();
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(!output.status.success());
                assert!(stderr.contains("needs root"), "{stderr}");
            }
            common::skip::skip(
                test,
                &common::skip::NETNS,
                &format!("network namespaces unavailable ({reason})"),
            );
            false
        }
    }
}

/// What a run whose $TMPDIR is `tmp` left behind: directories there, and mounts under it.
fn leftovers(tmp: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("skyriver-chaos-"))
        .collect();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let tmp = tmp.to_string_lossy();
    found.extend(
        mounts
            .lines()
            .filter(|line| line.contains(&*tmp))
            .map(str::to_string),
    );
    found
}

#[test]
fn a_short_run_in_both_modes_passes_the_checker_and_leaves_nothing() {
    if !namespaces_or_skip("a_short_run_in_both_modes_passes_the_checker") {
        return;
    }
    let dir = common::test_dir();
    let json = dir.path().join("verdict.json");
    let tmp = common::test_dir();
    let output = Command::new(exe())
        .env("TMPDIR", tmp.path())
        .args(["chaos", "--nodes", "3", "--seconds", "20", "--seed", "5"])
        .args(["--both", "--memory", "128MiB", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("chaos: 0 violations"), "{stdout}");
    // The summary says whether Python clients ran, and why not if they did not.
    assert!(stdout.contains("  python clients: "), "{stdout}");
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(verdict["passed"], true);
    let runs = verdict["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        assert!(run["verdict"]["violations"].as_array().unwrap().is_empty());
        // The workload did work, and the faults were injected.
        assert!(
            run["verdict"]["objects_checked"].as_u64().unwrap() > 10,
            "{run}"
        );
        assert!(!run["schedule"]["faults"].as_array().unwrap().is_empty());
        assert!(run["replay"].as_str().unwrap().contains("--seed 5"));
    }
    // The history: one JSON object a line, operations and faults.
    let history =
        std::fs::read_to_string(dir.path().join("verdict.persistent.history.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(records.iter().any(|r| r["record"] == "op"));
    assert!(records.iter().any(|r| r["record"] == "fault"));
    assert_eq!(leftovers(tmp.path()), Vec::<String>::new());
}

#[test]
fn an_interrupted_run_removes_what_it_made() {
    if !namespaces_or_skip("an_interrupted_run_removes_what_it_made") {
        return;
    }
    let tmp = common::test_dir();
    let mut child = Command::new(exe())
        .env("TMPDIR", tmp.path())
        .args(["chaos", "--nodes", "2", "--seconds", "60", "--seed", "2"])
        .arg("--persistent")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Faults start once the cluster is up and the workload runs.
    let started = Instant::now();
    loop {
        let line = lines.next().expect("chaos ended early").unwrap();
        if line.contains("inject") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no fault");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chaos did not stop at SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    assert_eq!(leftovers(tmp.path()), Vec::<String>::new());
}

/// Unmounts whatever a test's runs left mounted under `tmp`, also when the test fails.
struct UnmountOnDrop<'a>(&'a Path);

impl Drop for UnmountOnDrop<'_> {
    fn drop(&mut self) {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let tmp = self.0.to_string_lossy();
        for mount in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
            if mount.starts_with(&*tmp) {
                let _ = Command::new("umount").arg("-l").arg(mount).status();
            }
        }
    }
}

#[test]
fn a_run_removes_what_a_sigkilled_run_left() {
    if !namespaces_or_skip("a_run_removes_what_a_sigkilled_run_left") {
        return;
    }
    let tmp = common::test_dir();
    let _unmount = UnmountOnDrop(tmp.path());
    let mut child = Command::new(exe())
        .env("TMPDIR", tmp.path())
        .args(["chaos", "--nodes", "2", "--seconds", "60", "--seed", "4"])
        .args(["--persistent", "--python-clients", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = Instant::now();
    loop {
        let line = lines.next().expect("chaos ended early").unwrap();
        if line.contains("inject") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no fault");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Its directory and its stores' tmpfs mounts are left.
    let left = leftovers(tmp.path());
    assert!(left.iter().any(|l| l.contains("tmpfs")), "{left:?}");
    let output = Command::new(exe())
        .env("TMPDIR", tmp.path())
        .args(["chaos", "--nodes", "2", "--seconds", "10", "--seed", "4"])
        .args(["--python-clients", "off"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("left by a killed run"), "{stdout}");
    assert_eq!(leftovers(tmp.path()), Vec::<String>::new());
}

/// Whether `redis-server` 7 or later and `redis-cli` are there; skips (or, with
/// `SKYRIVER_REQUIRE_REDIS`, fails) otherwise.
fn redis_or_skip(test: &str) -> bool {
    let version = Command::new("redis-server").arg("--version").output();
    let major = version
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .and_then(|text| {
            text.split("v=")
                .nth(1)?
                .split('.')
                .next()?
                .parse::<u32>()
                .ok()
        });
    let cli = Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if major.is_some_and(|m| m >= 7) && cli {
        return true;
    }
    common::skip::skip(
        test,
        &common::skip::REDIS,
        "redis-server 7 or later and redis-cli are needed",
    );
    false
}

#[test]
fn a_run_on_its_own_redis_cluster_survives_a_master_kill() {
    let test = "a_run_on_its_own_redis_cluster_survives_a_master_kill";
    if !namespaces_or_skip(test) || !redis_or_skip(test) {
        return;
    }
    let dir = common::test_dir();
    let json = dir.path().join("verdict.json");
    let tmp = common::test_dir();
    // Seed 5's schedule (3 nodes, 30 s) kills a master first, at 2 s (checked by the
    // schedule's unit tests).
    let output = Command::new(exe())
        .env("TMPDIR", tmp.path())
        .args(["chaos", "--nodes", "3", "--seconds", "30", "--seed", "5"])
        .args(["--directory", "redis-cluster", "--memory", "128MiB"])
        .args(["--python-clients", "off", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("chaos: 0 violations"), "{stdout}");
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &verdict["runs"][0];
    // The master kill was carried out and healed (its replica took over, it rejoined).
    let history = std::fs::read_to_string(dir.path().join("verdict.memory.history.jsonl")).unwrap();
    let kills: Vec<serde_json::Value> = history
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["record"] == "fault" && r["kind"] == "redis_master_kill")
        .collect();
    assert!(!kills.is_empty(), "{run}");
    for kill in &kills {
        assert!(kill["error"].is_null(), "{kill}");
    }
    assert!(
        run["verdict"]["objects_checked"].as_u64().unwrap() > 10,
        "{run}"
    );
    assert!(run["replay"]
        .as_str()
        .unwrap()
        .contains("--directory redis-cluster"));
    assert_eq!(leftovers(tmp.path()), Vec::<String>::new());
}
