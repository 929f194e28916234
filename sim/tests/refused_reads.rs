//! A requester's fabric that refuses to post a READ (its event channel full: the daemon feeds
//! the node `ReadError::Busy` at once) is a seeded fault of the random runs. The fetch must move
//! on by the core's rules: the run passes every check (exact copies, no stuck fetch, liveness
//! after the faults) with refusals on.

use skyriver_sim::{run_seed, RunMode};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

#[test]
fn reads_the_fabric_refuses_to_post_fail_their_transfer_and_the_fetch_moves_on() {
    let (mut refused, mut seeds_with_refusals, mut fetched_ok) = (0u64, 0u32, 0u64);
    for seed in 0..120u64 {
        let report = run_seed(seed, None, MODE);
        if report.stats.reads_refused_busy == 0 {
            continue;
        }
        assert!(report.passed(), "seed {seed}: {:?}", report.violations);
        refused += report.stats.reads_refused_busy;
        fetched_ok += report.stats.fetched_ok;
        seeds_with_refusals += 1;
        if seeds_with_refusals >= 6 {
            break;
        }
    }
    assert!(
        seeds_with_refusals >= 3,
        "only {seeds_with_refusals} of the seeds refused a READ; the fault is not drawn"
    );
    assert!(
        refused > 0 && fetched_ok > 0,
        "refused {refused}, fetched {fetched_ok}"
    );
}
