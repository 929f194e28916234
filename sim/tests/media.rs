//! What the media under the core do wrong, run rather than modelled: READs whose serving
//! stalls while their lease is revoked (the core's grant table, as the TCP fabric runs it),
//! and index writes lost or torn at a crash (the core's slot index, as the daemon runs it).
//! Each protection is then removed (a planted flaw) to show that the checker catches what it
//! prevents — neither could be caught while the simulator kept its own grant table and an
//! idealised disk log.

use skyriver_sim::{run_seed, run_seed_with_flaws, Flaws, RunMode, SimReport};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

/// Seeds of the sweep's fixed list searched for runs where a fault did what a test needs.
const SEEDS: std::ops::Range<u64> = 0..200;

/// Flawed runs that caught their flaw before a test stops searching.
const ENOUGH: usize = 2;

fn flawed(seed: u64, flaws: Flaws) -> SimReport {
    run_seed_with_flaws(seed, None, MODE, flaws)
}

#[test]
fn a_revocation_waits_for_reads_being_served_and_would_unpin_under_them_without() {
    let mut waited_somewhere = false;
    let mut caught = Vec::new();
    for seed in SEEDS {
        let report = run_seed(seed, None, MODE);
        if report.stats.revocations_after_serving == 0 {
            continue;
        }
        waited_somewhere = true;
        assert!(report.passed(), "seed {seed}: {:?}", report.violations);
        let without = flawed(
            seed,
            Flaws {
                revoke_ignores_serving_reads: true,
                ..Flaws::default()
            },
        );
        if let Some(violation) = without
            .violations
            .iter()
            .find(|v| v.contains("which is not pinned"))
        {
            caught.push((seed, violation.clone()));
        }
        if caught.len() >= ENOUGH {
            break;
        }
    }
    assert!(
        waited_somewhere,
        "no seed of {SEEDS:?} revoked a lease while a READ under it was being served"
    );
    assert!(
        !caught.is_empty(),
        "no seed of {SEEDS:?} caught a fabric that completes revocations under serving READs"
    );
    println!("caught: {caught:?}");
}

#[test]
fn torn_and_lost_index_writes_are_discarded_and_would_lose_acknowledged_seals_if_unsynced() {
    let mut torn_somewhere = false;
    let mut caught = Vec::new();
    for seed in SEEDS {
        let report = run_seed(seed, None, MODE);
        let stats = &report.stats;
        if stats.unsynced_writes_lost + stats.unsynced_writes_torn == 0 {
            continue;
        }
        torn_somewhere |= stats.torn_records_discarded > 0;
        assert!(report.passed(), "seed {seed}: {:?}", report.violations);
        let without = flawed(
            seed,
            Flaws {
                persisted_before_sync: true,
                ..Flaws::default()
            },
        );
        if let Some(violation) = without
            .violations
            .iter()
            .find(|v| v.contains("was acknowledged but is lost"))
        {
            caught.push((seed, violation.clone()));
        }
        if caught.len() >= ENOUGH && torn_somewhere {
            break;
        }
    }
    assert!(
        torn_somewhere,
        "no seed of {SEEDS:?} tore an index record at a crash"
    );
    assert!(
        !caught.is_empty(),
        "no seed of {SEEDS:?} caught a disk that reports durability before its sync"
    );
    println!("caught: {caught:?}");
}
