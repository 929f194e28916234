//! The spill tier under the simulator: random workloads with a spill disk that is slow, fills
//! up (`ENOSPC`), fails writes and damages records, with crashes; every run must pass its
//! checks, and a disk that reports a write complete before it ran must be caught.

use skyriver_sim::{run_seed_spilling, Flaws, RunMode, SimReport};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

const SEEDS: std::ops::Range<u64> = 0..60;

fn spilled_in(report: &SimReport) -> bool {
    report.stats.spill_writes > 0
}

#[test]
fn random_runs_with_a_faulty_spill_disk_pass_their_checks() {
    let mut spilling_runs = 0;
    let mut restored = 0;
    for seed in SEEDS {
        let report = run_seed_spilling(seed, None, MODE, Flaws::default());
        assert!(
            report.passed(),
            "seed {seed} ({}): {:?}\nreplay: cargo test -p skyriver-sim --test spill",
            report.params,
            report.violations
        );
        if spilled_in(&report) {
            spilling_runs += 1;
            restored += report.stats.spill_restores;
        }
    }
    assert!(
        spilling_runs >= 5,
        "only {spilling_runs} runs of {SEEDS:?} spilled"
    );
    assert!(restored > 0, "no run restored a spilled object");
}

#[test]
fn a_disk_that_acknowledges_a_write_before_it_ran_is_caught() {
    let caught = SEEDS.into_iter().find_map(|seed| {
        let report = run_seed_spilling(
            seed,
            None,
            MODE,
            Flaws {
                spill_acked_before_write: true,
                ..Flaws::default()
            },
        );
        report
            .violations
            .iter()
            .find(|v| v.contains("read bytes other than the object's"))
            .map(|v| (seed, v.clone()))
    });
    assert!(
        caught.is_some(),
        "no seed of {SEEDS:?} caught the planted flaw"
    );
}

#[test]
fn a_persistent_disk_that_drops_spilled_records_is_caught() {
    let caught = SEEDS.into_iter().find_map(|seed| {
        let report = run_seed_spilling(
            seed,
            None,
            MODE,
            Flaws {
                spilled_record_dropped: true,
                ..Flaws::default()
            },
        );
        report
            .violations
            .iter()
            .find(|v| v.contains("was acknowledged but is lost in a crash"))
            .map(|v| (seed, v.clone()))
    });
    assert!(
        caught.is_some(),
        "no seed of {SEEDS:?} caught a persistent disk that forgets spilled objects"
    );
}
