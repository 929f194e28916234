//! `skyriver sim` through the real binary: refuses nonsense, shows progress on long sweeps and
//! prints a machine-readable summary with `--json`.

use std::process::Command;

#[test]
fn sim_refuses_zero_nodes() {
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["sim", "--seed", "1", "--nodes", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 1 node"), "{stderr}");
}

#[test]
fn sim_sweep_shows_progress_and_prints_json() {
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["sim", "--seeds", "10", "--start-seed", "5", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // Not a terminal: a line per tenth of the sweep on stderr.
    assert!(stderr.contains("sim: 5/10 seeds (50%)"), "{stderr}");
    assert!(stderr.contains("sim: 10/10 seeds (100%)"), "{stderr}");
    // stdout is one JSON document, nothing else.
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is JSON");
    assert_eq!(summary["start_seed"], 5);
    assert_eq!(summary["seeds_run"], 10);
    assert_eq!(summary["seeds_failed"], 0);
    assert_eq!(summary["passed"], true);
    assert!(summary["totals"]["events"].as_u64().unwrap() > 0);
    assert_eq!(summary["failures"].as_array().unwrap().len(), 0);
}
