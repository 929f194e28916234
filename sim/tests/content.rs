//! One id, one content, under the random workload and faults: damaged transfers are never
//! sealed and an id put again with other bytes is refused while its first content is held.
//! Each protection is then removed (a planted flaw) to show that the checker catches what it
//! prevents.

use skyriver_sim::{
    run_seed, run_seed_replicating, run_seed_with_flaws, Flaws, RunMode, SimReport,
};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

/// Seeds of the sweep's fixed list searched for runs where a fault or the workload did what a
/// test needs.
const SEEDS: std::ops::Range<u64> = 0..120;

fn flawed(seed: u64, flaws: Flaws) -> SimReport {
    run_seed_with_flaws(seed, None, MODE, flaws)
}

#[test]
fn damaged_transfers_are_caught_and_would_be_sealed_without_verification() {
    let mut caught = Vec::new();
    for seed in SEEDS {
        let report = run_seed(seed, None, MODE);
        if report.stats.digest_mismatches == 0 {
            continue;
        }
        assert!(report.passed(), "seed {seed}: {:?}", report.violations);
        let without = flawed(
            seed,
            Flaws {
                skip_verification: true,
                ..Flaws::default()
            },
        );
        if !without.passed() {
            caught.push((seed, without.violations[0].clone()));
        }
        if caught.len() >= 3 {
            break;
        }
    }
    assert!(
        !caught.is_empty(),
        "no seed of {SEEDS:?} damaged a transfer that a driver skipping verification sealed"
    );
    for (seed, violation) in &caught {
        assert!(
            violation.contains("wrong bytes") || violation.contains("never named"),
            "seed {seed}: {violation}"
        );
    }
}

#[test]
fn reused_ids_are_refused_and_would_be_accepted_twice_by_a_directory_blind_to_content() {
    let mut refused_somewhere = false;
    let mut caught = Vec::new();
    for seed in SEEDS {
        let report = run_seed(seed, None, MODE);
        if report.stats.reused_ids_refused == 0 {
            continue;
        }
        refused_somewhere = true;
        assert!(report.passed(), "seed {seed}: {:?}", report.violations);
        let without = flawed(
            seed,
            Flaws {
                directory_ignores_content: true,
                ..Flaws::default()
            },
        );
        if let Some(violation) = without
            .violations
            .iter()
            .find(|v| v.contains("with content") || v.contains("different contents"))
        {
            caught.push((seed, violation.clone()));
        }
        if caught.len() >= 3 {
            break;
        }
    }
    assert!(
        refused_somewhere,
        "no seed of {SEEDS:?} put a held id again"
    );
    assert!(
        !caught.is_empty(),
        "no seed of {SEEDS:?} showed an id accepted with two contents under the flaw"
    );
}

/// Once faults stop, a sample of the sealed copies is fetched from other live nodes
/// (`cluster::liveness`); holders that deny some ids they hold are caught there.
#[test]
fn holders_that_deny_copies_they_hold_are_caught_by_the_liveness_fetches() {
    let flaws = Flaws {
        holders_deny_some_ids: true,
        ..Flaws::default()
    };
    let caught = SEEDS.take(20).find_map(|seed| {
        let report = flawed(seed, flaws);
        report
            .violations
            .iter()
            .find(|v| v.contains("is not fetchable by a live node"))
            .map(|v| (seed, v.clone()))
    });
    assert!(caught.is_some(), "no seed of 0..20 caught the planted flaw");
}

/// The directory's per-event check finds a fetch that waits on a subscription the head forgot
/// (a planted flaw: the head drops a quarter of the subscriptions it takes), although the
/// check skips a node whose subscriptions, session and registration did not change since it
/// last examined them.
#[test]
fn subscriptions_the_head_forgets_are_caught() {
    let flaws = Flaws {
        registry_forgets_subscriptions: true,
        ..Flaws::default()
    };
    let caught = SEEDS.take(20).find_map(|seed| {
        let report = flawed(seed, flaws);
        report
            .violations
            .iter()
            .find(|v| v.contains("the directory forgot the subscription"))
            .map(|v| (seed, v.clone()))
    });
    let (seed, violation) = caught.expect("no seed of 0..20 caught the planted flaw");
    assert!(
        run_seed(seed, None, MODE).passed(),
        "seed {seed} fails without the flaw too"
    );
    eprintln!("seed {seed}: {violation}");
}

/// A restarted head keeps a grace period for the returning holders' replays, and a holder
/// whose replay is refused stops serving its copy. Without either (a planted flaw), an id
/// names two contents after a head restart, and the liveness fetches or the content checks
/// catch it.
#[test]
fn unguarded_head_restarts_are_caught() {
    let flaws = Flaws {
        unguarded_head_restarts: true,
        ..Flaws::default()
    };
    // Seeds where a returning holder's replay lost the id to another content, found by sweeps
    // (the last after fetches began to wait for their holders' links); then a range to search
    // should the runs drift.
    let caught = [7_000_000_002_339, 7_000_000_003_195, 7_000_000_000_179]
        .into_iter()
        .chain(150..170)
        .chain(SEEDS)
        .find_map(|seed| {
            let report = flawed(seed, flaws);
            report
                .violations
                .iter()
                .find(|v| v.contains("is not fetchable") || v.contains("content"))
                .map(|v| (seed, v.clone()))
        });
    let (seed, violation) = caught.expect("no seed caught the planted flaw");
    assert!(
        run_seed(seed, None, MODE).passed(),
        "seed {seed} fails without the flaw too"
    );
    eprintln!("seed {seed}: {violation}");
}

/// Node 1, cut off from the directory, drops its accepted copy of an id and seals another
/// content under it; its withdrawal and publication wait for the partition to heal, so the
/// directory still lists it for the first content when node 0's seal of that content is
/// answered. Node 1's new copy is not accepted (and served to no peer): one id still has one
/// accepted content, and the run passes.
#[test]
fn a_listed_node_whose_withdrawal_waits_out_a_partition_holds_no_second_accepted_content() {
    let report = run_seed_replicating(17_000_000_900_795, None, MODE, Flaws::default());
    assert!(report.passed(), "{:?}", report.violations);
}
