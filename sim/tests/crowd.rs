//! Many nodes fetch a few small objects from one holder at once: the holder answers the
//! requests of one instant in one coalesced pass, every requester gets its own object's bytes
//! and none is skipped. Each way a coalesced pass could go wrong is then planted to show that
//! the checker catches it.

use skyriver_sim::{run_crowd_seed, Flaws, SimReport};

const SEEDS: std::ops::Range<u64> = 0..24;

fn run(seed: u64, flaws: Flaws) -> SimReport {
    run_crowd_seed(seed, flaws)
}

#[test]
fn every_requester_of_a_crowd_gets_its_object_in_one_coalesced_pass() {
    for seed in SEEDS {
        let report = run(seed, Flaws::default());
        assert!(
            report.passed(),
            "seed {seed} ({}): {:?}\nreplay: cargo test -p skyriver-sim --test crowd",
            report.params,
            report.violations
        );
        assert_eq!(report.stats.fetched_err, 0, "seed {seed}");
        assert!(
            report.stats.fetched_ok >= 3,
            "seed {seed}: {:?}",
            report.stats
        );
        assert!(
            report.stats.served_eager >= report.stats.fetched_ok,
            "seed {seed}: every copy went eagerly: {:?}",
            report.stats
        );
    }
}

#[test]
fn a_crowd_run_is_deterministic() {
    let a = run(7, Flaws::default());
    let b = run(7, Flaws::default());
    assert_eq!(a.trace_hash, b.trace_hash);
}

fn caught(flaws: Flaws, expect: &str) {
    let mut found = None;
    for seed in SEEDS {
        let report = run(seed, flaws);
        if let Some(v) = report.violations.iter().find(|v| v.contains(expect)) {
            found = Some(v.clone());
            break;
        }
    }
    assert!(
        found.is_some(),
        "no seed of {SEEDS:?} showed the planted flaw {flaws:?} ({expect})"
    );
}

#[test]
fn a_pass_that_skips_a_requester_is_caught() {
    caught(
        Flaws {
            coalesced_pass_skips_requester: true,
            ..Flaws::default()
        },
        "unanswered",
    );
}

#[test]
fn a_pass_that_sends_another_objects_bytes_is_caught() {
    caught(
        Flaws {
            coalesced_pass_mixes_payloads: true,
            ..Flaws::default()
        },
        "outside that object",
    );
}
