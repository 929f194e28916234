//! Replicas under the simulator: random workloads whose puts ask for 2 or 3 copies (half of
//! them waiting for the copies) on nodes in 2 or 3 failure domains, with crashes (sometimes of
//! a whole domain), partitions and head faults. Every run must pass its checks (an
//! acknowledged object survives k − 1 losses of its holders and its copies span the domains
//! they can; repair converges once faults stop; a delete stays deleted), and five planted bugs
//! must be caught.

use skyriver_sim::{run_seed_replicating, Flaws, RunMode, SimReport};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

/// About 20 s in a debug build. Seeds 5 6 7 15 17 20 33 52 once ended with a repair short of
/// its copies (repair kept asking one node without room, or none because of old free-memory
/// reports; seed 52's object is larger than one lease carries): keep them in the range.
const SEEDS: std::ops::Range<u64> = 0..60;

/// Seeds of the wider sweep (`skyriver-sim --replicas --seeds 540 --start-seed 60`) that once
/// never went idle after faults stopped: 160 and 263 with a repair short of its copies (a full
/// node's placed copies started their transfers as their fetches' deadlines passed, were
/// sealed as plain copies and evicted at once, every placement again), 347 and 512 with a
/// node still fetching a copy it had no free range for (offered again every target timeout,
/// it evicted its cache and waited for the removals before declining). The node tests
/// `a_placed_copy_whose_deadline_passed_mid_transfer_is_still_taken_as_a_copy_of_record` and
/// `a_copy_no_free_range_could_hold_is_declined_at_once_and_the_cache_stays` pin each cause;
/// a seed's run shifts with any change to the core.
///
/// From `--seeds 1500 --start-seed 600`: 892 and 1095, a copy of record of deleted bytes kept
/// for good by a node that missed the delete, whose replay the registry then refused (the id
/// was put again with other bytes); 1318, a put waiting for copies of bytes so refused, whose
/// wait a second put of the id replaced (`a_copy_of_record_whose_replay_is_refused_is_released_
/// and_evictable`, `a_waiting_put_whose_copy_is_refused_fails_as_a_refused_seal`,
/// `a_second_waiting_put_of_an_id_ends_the_first_wait`); 915, the checker judging a `Surplus`
/// by the registry's count when it arrived rather than when it was sent.
///
/// From wider sweeps (`--start-seed 17000000100000` and on): 17000000300231, a delete while
/// the only holder of record was cut off left no tombstone, and the holder's return copied the
/// object again (`a_delete_while_every_holder_of_record_is_away_still_stays_deleted`);
/// 17000000200811, 17000000300054 and 17000000300986, the checker following copies of an
/// object a client deleted or put again with other bytes.
const REGRESSIONS: [u64; 12] = [
    160,
    263,
    347,
    512,
    892,
    915,
    1095,
    1318,
    17000000200811,
    17000000300054,
    17000000300231,
    17000000300986,
];

fn caught(flaws: Flaws, what: &str) -> Option<(u64, String)> {
    SEEDS.into_iter().find_map(|seed| {
        run_seed_replicating(seed, None, MODE, flaws)
            .violation_containing(what)
            .map(|v| (seed, v.clone()))
    })
}

#[test]
fn random_runs_with_replicas_pass_their_checks() {
    let mut total = skyriver_sim::cluster::ReplicationRunStats::default();
    let mut failures = Vec::new();
    for seed in SEEDS.chain(REGRESSIONS) {
        let report: SimReport = run_seed_replicating(seed, None, MODE, Flaws::default());
        if !report.passed() {
            failures.push(format!(
                "seed {seed} ({}): {:?}",
                report.params, report.violations
            ));
        }
        let r = &report.stats.replication;
        total.replicated_puts += r.replicated_puts;
        total.acked += r.acked;
        total.too_few += r.too_few;
        total.survived_losses += r.survived_losses;
        total.records_converged += r.records_converged;
        total.repairs_started += r.repairs_started;
        total.domain_checks += r.domain_checks;
        total.deletes_checked += r.deletes_checked;
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed (each listed with its parameters):\n{}\nrerun the sweep: cargo \
         test -p skyriver-sim --test replicas random_runs_with_replicas_pass_their_checks",
        failures.len(),
        SEEDS.end - SEEDS.start + REGRESSIONS.len() as u64,
        failures.join("\n")
    );
    println!("{total:?}");
    assert!(total.acked > 100, "too few acknowledged puts: {total:?}");
    assert!(
        total.survived_losses > 0,
        "no acknowledged object lost a holder: {total:?}"
    );
    assert!(total.repairs_started > 0, "no repair ran: {total:?}");
    assert!(total.records_converged > 0, "no record checked: {total:?}");
    assert!(total.domain_checks > 0, "no placement checked: {total:?}");
    assert!(total.deletes_checked > 0, "no delete checked: {total:?}");
}

#[test]
fn a_registry_that_ignores_failure_domains_is_caught() {
    let flaws = Flaws {
        placement_ignores_domains: true,
        ..Flaws::default()
    };
    assert!(
        caught(flaws, "spans the failure domains").is_some(),
        "no seed of {SEEDS:?} caught the planted flaw"
    );
}

#[test]
fn an_unpinned_copy_of_record_is_caught() {
    let flaws = Flaws {
        copies_of_record_unpinned: true,
        ..Flaws::default()
    };
    assert!(
        caught(flaws, "left the store without a delete").is_some(),
        "no seed of {SEEDS:?} caught the planted flaw"
    );
}

#[test]
fn a_registry_without_tombstones_is_caught() {
    let flaws = Flaws {
        no_tombstones: true,
        ..Flaws::default()
    };
    assert!(
        caught(flaws, "hold copies of record of the deleted content").is_some(),
        "no seed of {SEEDS:?} caught the planted flaw"
    );
}

#[test]
fn an_origin_told_of_copies_before_they_exist_is_caught() {
    let flaws = Flaws {
        copies_overcounted: true,
        ..Flaws::default()
    };
    assert!(
        caught(flaws, "nodes published a copy of record").is_some(),
        "no seed of {SEEDS:?} caught the planted flaw"
    );
}

#[test]
fn nodes_that_ignore_placements_are_caught() {
    let flaws = Flaws {
        replica_placement_ignored: true,
        ..Flaws::default()
    };
    assert!(
        caught(flaws, "repair did not converge").is_some(),
        "no seed of {SEEDS:?} caught the planted flaw"
    );
}

/// The `k − 1` copies of a put are pulled at once and in parallel: waiting for three copies
/// costs about what waiting for two does (the slower of two parallel fetches, relayed here), far
/// less than a second fetch on top. Were the second target asked only once the first copy was
/// published, the wait for three would be about twice the wait for two.
#[test]
fn a_put_waits_for_its_copies_in_parallel() {
    use skyriver_sim::Cluster;
    use std::time::Duration;
    /// Relayed (the scripted nodes relay from 32 KiB), and long on the wire next to the
    /// latencies.
    const LEN: u64 = 300_000;
    let mut c = Cluster::scripted(4);
    let put = |c: &mut Cluster, n: u64, k: u8| {
        let took = c.put_replicated(1, n, LEN, k, (k > 1).then_some(1_000));
        c.drive();
        took
    };
    let one = put(&mut c, 1, 1);
    let two = put(&mut c, 2, 2) - one;
    let three = put(&mut c, 3, 3) - one;
    c.put(1, 4, LEN);
    c.drive();
    let started = c.now();
    c.fetch(2, &[4], Duration::from_millis(100));
    let id = skyriver_core::ObjectId::from_u64(4);
    assert!(c.drive_until(|c| c
        .node(2)
        .is_some_and(|n| n.store().sealed_info(&id).is_some())));
    let fetch = c.now().saturating_since(started);
    assert!(c.violations().is_empty(), "{:#?}", c.violations());
    println!("wait for 2 copies {two:?}, for 3 {three:?}; one fetch {fetch:?}");
    assert!(two > Duration::ZERO && two < fetch, "{two:?} vs {fetch:?}");
    assert!(
        three < two + fetch / 4,
        "3 copies {three:?}, 2 copies {two:?}: the copies were not made in parallel \
         (one fetch {fetch:?})"
    );
}
