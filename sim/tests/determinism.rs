//! A run is a function of its seed: the same seed twice gives the same trace, bit for bit.

use skyriver_sim::{run_seed, Cluster, RunMode};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

#[test]
fn same_seed_same_trace_hash() {
    for seed in [1, 7, 42, 1234, 987_654_321] {
        let first = run_seed(seed, None, MODE);
        let second = run_seed(seed, None, MODE);
        assert!(
            first.stats.events > 100,
            "seed {seed} ran only {} events",
            first.stats.events
        );
        assert_eq!(
            first.trace_hash, second.trace_hash,
            "seed {seed} is not deterministic"
        );
        assert_eq!(first.stats, second.stats, "seed {seed}");
        assert_eq!(first.params, second.params, "seed {seed}");
    }
}

#[test]
fn different_seeds_differ() {
    let a = run_seed(1, None, MODE);
    let b = run_seed(2, None, MODE);
    assert_ne!(a.trace_hash, b.trace_hash);
    assert_ne!(a.params, b.params);
}

#[test]
fn kept_trace_text_replays_identically() {
    let mode = RunMode {
        keep_trace: true,
        ..MODE
    };
    let mut first = Cluster::random(5, Some(3), mode);
    let mut second = Cluster::random(5, Some(3), mode);
    first.drive();
    second.drive();
    assert_eq!(first.trace_text(), second.trace_text());
    assert_eq!(first.trace_hash(), second.trace_hash());
}
