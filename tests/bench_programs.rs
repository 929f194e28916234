//! The benchmark programs run end to end with tiny budgets and write what their READMEs
//! promise: every system and mode at every size, the auto-against-forced rows, a plot, and the
//! scale report. Nothing here is timed; the numbers only have to be there and be sane.

mod common;

use std::path::Path;
use std::process::Command;

fn skyriver(dir: &Path, args: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "skyriver {args:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let json = args
        .windows(2)
        .find(|w| w[0] == "--json")
        .map(|w| w[1])
        .expect("the test names its JSON file");
    serde_json::from_str(&std::fs::read_to_string(dir.join(json)).unwrap()).unwrap()
}

#[test]
fn bench_fetch_measures_every_mode_in_one_cluster_and_compares_auto_only_where_eager_exists() {
    let dir = common::test_dir();
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "fetch",
            "--sizes",
            "1KiB,300KiB",
            "--baselines",
            "tcp,tcp-tuned,uds-rtt,tcp-rtt",
            "--cpus",
            "pinned",
            "--millis-per-case",
            "30",
            "--max-iterations",
            "6",
            "--json",
            "fetch.json",
            "--plot",
            "fetch.svg",
        ],
    );
    let results = report["results"].as_array().unwrap();
    for mode in ["eager", "rendezvous", "auto"] {
        for size in [1024, 300 * 1024] {
            let row = results
                .iter()
                .find(|r| r["mode"] == mode && r["size_bytes"] == size)
                .unwrap_or_else(|| panic!("no {mode} row at {size} bytes"));
            assert!(row["mb_per_sec"].as_f64().unwrap() > 0.0);
            assert!(row["ratios"]["tcp"].as_f64().unwrap() > 0.0);
            assert!(row["ratios"]["tcp-tuned"].as_f64().unwrap() > 0.0);
        }
    }
    assert_eq!(report["cpus"], "pinned");
    let round_trips = report["round_trips"].as_array().unwrap();
    for name in ["uds-rtt", "tcp-rtt"] {
        let trip = round_trips
            .iter()
            .find(|r| r["operation"] == name)
            .unwrap_or_else(|| panic!("no {name} round trip"));
        assert!(trip["p50_us"].as_f64().unwrap() > 0.0);
    }
    let capacity = report["eager_capacity_bytes"].as_u64().unwrap();
    assert!(capacity > 1024 && capacity < 300 * 1024, "{capacity}");
    // Auto is compared with the forced modes only where eager exists: 1 KiB, not 300 KiB.
    let auto_rows = report["auto_vs_forced"].as_array().unwrap();
    assert_eq!(auto_rows.len(), 1);
    assert_eq!(auto_rows[0]["size_bytes"], 1024);
    assert!(auto_rows[0]["auto_over_best"].as_f64().unwrap() > 0.0);
    assert!(report["breakdown_1kib"]["fetch_p50_us"].as_f64().unwrap() > 0.0);
    let svg = std::fs::read_to_string(dir.path().join("fetch.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("skyriver-auto"));
}

#[test]
fn bench_local_measures_the_raw_round_trips_in_the_placement_asked_for() {
    let dir = common::test_dir();
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "local",
            "--sizes",
            "1KiB",
            "--cpus",
            "spread",
            "--millis-per-case",
            "20",
            "--max-iterations",
            "10",
            "--json",
            "local.json",
        ],
    );
    assert_eq!(report["cpus"], "spread");
    let results = report["results"].as_array().unwrap();
    assert!(results.iter().any(|r| r["operation"] == "put"));
    let round_trips = report["round_trips"].as_array().unwrap();
    let names: Vec<&str> = round_trips
        .iter()
        .map(|r| r["operation"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["uds-rtt", "tcp-rtt"]);
    assert!(round_trips
        .iter()
        .all(|r| r["p50_us"].as_f64().unwrap() > 0.0));
}

#[test]
fn bench_breakdown_times_every_hop_of_a_fetch_next_to_the_ping_pongs() {
    let dir = common::test_dir();
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "breakdown",
            "--poll-us",
            "0,20",
            "--iterations",
            "20",
            "--paused-iterations",
            "3",
            "--idle-secs",
            "0",
            "--json",
            "breakdown.json",
        ],
    );
    assert_eq!(report["cpus"], "spread");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let rows = run["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 10, "5 cases, back to back and after a pause");
        assert!(rows.iter().all(|r| r["p50_us"].as_f64().unwrap() > 0.0));
        let hops = run["hops"].as_array().unwrap();
        assert_eq!(hops.len(), 13);
        for hop in hops {
            // Every stamp was taken (a missing one makes the median NaN, null in JSON).
            assert!(hop["p50_us"].as_f64().is_some(), "{hop}");
        }
        assert_eq!(run["traced_fetches"], 20);
        assert_eq!(run["targets"].as_array().unwrap().len(), 6);
    }
}

#[test]
fn bench_scale_reports_metadata_per_object_without_errors() {
    let dir = common::test_dir();
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "scale",
            "--objects",
            "20000",
            "--clients",
            "4",
            "--fill-clients",
            "2",
            "--millis",
            "200",
            "--json",
            "scale.json",
        ],
    );
    let report = &report["results"];
    assert_eq!(report["objects"], 20000);
    assert_eq!(report["errors"], 0);
    let per_object = report["metadata_bytes_per_object"].as_f64().unwrap();
    // An object's record alone is tens of bytes; a kilobyte would mean a leak per object.
    assert!(per_object > 0.0 && per_object < 1024.0, "{per_object}");
    assert!(report["mixed_ops_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_fetch_leaves_no_temporary_directories_also_when_it_fails() {
    let dir = common::test_dir();
    let tmp = common::test_dir();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .current_dir(dir.path())
            .env("TMPDIR", tmp.path())
            .args(["bench", "fetch", "--sizes", "1KiB", "--baselines", "tcp"])
            .args(["--millis-per-case", "20", "--max-iterations", "3"])
            .args(["--json", "fetch.json", "--plot", "fetch.svg"])
            .args(extra)
            .output()
            .unwrap()
    };
    let left = || std::fs::read_dir(tmp.path()).unwrap().count();
    let output = run(&[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(left(), 0, "bench fetch left something in $TMPDIR");
    // Daemons that cannot start (no such RDMA device): the error, and still nothing left.
    let output = run(&["--fabric", "verbs", "--devices", "no-such-device"]);
    assert!(!output.status.success());
    assert_eq!(left(), 0, "a failed bench fetch left something in $TMPDIR");
}

#[test]
fn bench_cluster_runs_every_pattern_next_to_its_baselines_in_namespaces() {
    if !common::namespaces_or_skip(
        "bench_cluster_runs_every_pattern_next_to_its_baselines_in_namespaces",
    ) {
        return;
    }
    let dir = common::test_dir();
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "cluster",
            "--nodes",
            "3",
            "--sizes",
            "1KiB,1MiB",
            "--link",
            "1gbit",
            "--baselines",
            "tcp",
            "--millis-per-case",
            "20",
            "--min-rounds",
            "2",
            "--json",
            "cluster.json",
            "--plot",
            "cluster.svg",
        ],
    );
    assert_eq!(report["nodes"], 3);
    assert_eq!(
        report["link_applied"]["rate_bits_per_sec"],
        1_000_000_000u64
    );
    let results = report["results"].as_array().unwrap();
    for pattern in ["broadcast", "all-to-all", "incast"] {
        for size in [1024, 1 << 20] {
            for system in ["skyriver", "tcp"] {
                let row = results
                    .iter()
                    .find(|r| {
                        r["pattern"] == pattern && r["size_bytes"] == size && r["system"] == system
                    })
                    .unwrap_or_else(|| panic!("no {system} {pattern} row at {size} bytes"));
                assert!(row["rounds"].as_u64().unwrap() >= 2);
                assert!(row["aggregate_mb_per_sec"].as_f64().unwrap() > 0.0);
                assert!(row["p99_us"].as_f64().unwrap() >= row["p50_us"].as_f64().unwrap());
            }
        }
    }
    let skyriver_row = results.iter().find(|r| r["system"] == "skyriver").unwrap();
    assert!(skyriver_row["ratios"]["tcp"].as_f64().unwrap() > 0.0);
    let svg = std::fs::read_to_string(dir.path().join("cluster.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("skyriver incast"));
    // Nothing of the cluster is left.
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let addresses = report["addresses"].as_array().unwrap();
    let slot = addresses[0]
        .as_str()
        .unwrap()
        .split('.')
        .nth(2)
        .unwrap()
        .to_string();
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains(&format!("skyriver-{slot}-")),
        "namespaces left behind"
    );
}

#[test]
fn bench_cluster_refuses_sizes_whose_stores_and_baseline_buffers_do_not_fit() {
    if !common::namespaces_or_skip(
        "bench_cluster_refuses_sizes_whose_stores_and_baseline_buffers_do_not_fit",
    ) {
        return;
    }
    let dir = common::test_dir();
    // 4 stores of 4 × 256 MiB fit in 5 GiB; the TCP baseline's 4 × 3 buffers of 256 MiB do
    // not. Refused before anything starts, saying what would fit.
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .current_dir(dir.path())
        .env("SKYRIVER_MEMORY_AVAILABLE", "5GiB")
        .args([
            "bench",
            "cluster",
            "--nodes",
            "4",
            "--patterns",
            "all-to-all",
        ])
        .args(["--sizes", "1KiB,256MiB", "--baselines", "tcp"])
        .args(["--json", "cluster.json", "--plot", "cluster.svg"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("the baselines' buffers") && stderr.contains("5.0 GiB available"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("starting"),
        "daemons were started: {stderr}"
    );
    assert!(!dir.path().join("cluster.json").exists());
}

#[test]
fn bench_cluster_that_fails_names_where_the_daemons_logs_are() {
    if !common::namespaces_or_skip("bench_cluster_that_fails_names_where_the_daemons_logs_are") {
        return;
    }
    let dir = common::test_dir();
    // Daemons that refuse their flags: the run fails at start-up, and says where their logs
    // are (inside TMPDIR, removed with the test's directory).
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .current_dir(dir.path())
        .env("TMPDIR", dir.path())
        .args([
            "bench",
            "cluster",
            "--nodes",
            "3",
            "--patterns",
            "broadcast",
        ])
        .args([
            "--sizes",
            "1KiB",
            "--baselines",
            "",
            "--relay-min-bytes",
            "bogus",
        ])
        .args(["--json", "cluster.json", "--plot", "cluster.svg"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let kept = stderr
        .lines()
        .find_map(|l| l.strip_prefix("bench cluster: the daemons' logs are kept in "))
        .and_then(|rest| rest.split(" (").next())
        .unwrap_or_else(|| panic!("no kept directory named in\n{stderr}"));
    assert!(Path::new(kept).join("node-0.log").exists(), "{kept}");
    assert!(kept.starts_with(dir.path().to_str().unwrap()), "{kept}");
}

#[test]
fn bench_spill_writes_four_times_the_memory_and_compares_with_the_raw_disk() {
    let dir = common::test_dir();
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "spill",
            "--memory",
            "4MiB",
            "--sizes",
            "64KiB,1MiB",
            "--spill-dir",
            dir.path().to_str().unwrap(),
            "--json",
            "spill.json",
        ],
    );
    assert_eq!(report["memory_bytes"], 4 << 20);
    let raw = &report["raw_disk"];
    assert!(raw["write_mib_per_sec"].as_f64().unwrap() > 0.0);
    assert!(raw["read_mib_per_sec"].as_f64().unwrap() > 0.0);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for (row, size) in results.iter().zip([64u64 << 10, 1 << 20]) {
        assert_eq!(row["size_bytes"], size);
        assert_eq!(row["working_set_bytes"], 16u64 << 20);
        assert!(row["spilled_objects"].as_u64().unwrap() > 0, "{row}");
        assert!(row["restores"].as_u64().unwrap() > 0, "{row}");
        for phase in ["write", "get_sequential", "get_random"] {
            assert_eq!(row[phase]["objects"], (16u64 << 20) / size);
            assert!(row[phase]["mib_per_sec"].as_f64().unwrap() > 0.0);
        }
        for ratio in [
            "write_over_raw",
            "restore_over_raw",
            "random_restore_over_raw",
        ] {
            assert!(row[ratio].as_f64().unwrap() > 0.0);
        }
    }
    assert!(report["ray"].is_string());
    // The temporary spill directory is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("skyriver-bench-spill-")
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn bench_spill_refuses_sizes_the_memory_cannot_hold() {
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args([
            "bench",
            "spill",
            "--memory",
            "4MiB",
            "--sizes",
            "4MiB",
            "--json",
            "/dev/null",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("half of --memory"), "{stderr}");
}

#[test]
fn bench_spill_refuses_to_start_without_the_disk_space_it_needs() {
    let dir = common::test_dir();
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["bench", "spill", "--memory", "64TiB", "--sizes", "4KiB"])
        .arg("--spill-dir")
        .arg(dir.path())
        .args(["--json", "/dev/null"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("free; bench spill needs"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}

#[test]
fn bench_directory_drives_every_backend_through_every_phase_and_marks_its_targets() {
    let dir = common::test_dir();
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !redis {
        common::skip::skip(
            "bench_directory_drives_every_backend_through_every_phase_and_marks_its_targets",
            &common::skip::REDIS,
            "redis-server is not installed",
        );
        return;
    }
    let report = skyriver(
        dir.path(),
        &[
            "bench",
            "directory",
            "--sessions",
            "40",
            "--redis-sessions",
            "8",
            "--objects",
            "2000",
            "--in-flight",
            "64",
            "--millis",
            "200",
            "--waiters",
            "20",
            "--json",
            "directory.json",
        ],
    );
    let backends = report["backends"].as_array().unwrap();
    assert_eq!(
        backends.len(),
        3,
        "head, Redis and Redis Cluster: {backends:?}"
    );
    for backend in backends {
        for phase in ["connect", "publish", "lookup", "wake", "withdraw"] {
            let ops = backend[phase]["operations"].as_u64().unwrap();
            assert!(ops > 0, "no {phase} in {backend}");
        }
        assert!(backend["bytes_per_object"].as_f64().unwrap().is_finite());
    }
    // The head answers everything: no request of a small run is refused.
    let head = &backends[0];
    assert_eq!(head["backend"], "head");
    for phase in ["connect", "publish", "lookup", "wake", "withdraw"] {
        assert_eq!(
            head[phase]["errors"], 0,
            "{phase} errors at the head: {head}"
        );
    }
    assert_eq!(head["sessions"], 40);
    // Every target is listed: met or missed, or null where this run could not measure it.
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 4, "{targets:?}");
    let verdict = |what: &str| {
        let target = targets
            .iter()
            .find(|t| t[0].as_str().unwrap().starts_with(what))
            .unwrap_or_else(|| panic!("no target {what}: {targets:?}"));
        target[1].clone()
    };
    assert!(verdict("head holds 10,000").is_boolean());
    assert!(verdict("head ≥ 200k lookups/s").is_boolean());
    // Three masters and the generator scale only with 4 CPUs or more.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cluster = verdict("Redis Cluster (3 masters)");
    assert_eq!(cluster.is_boolean(), cpus >= 4, "{cluster} on {cpus} CPUs");
    assert_eq!(cluster.is_null(), cpus < 4, "{cluster} on {cpus} CPUs");
    let memory = verdict("head ≤ 200 B per object");
    assert!(memory.is_boolean() || memory.is_null(), "{memory}");
}
