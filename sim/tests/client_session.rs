//! Simulated clients speak through the Rust client's session: their releases go out without a
//! reply, as a dropped buffer's do, and a `Flush` reports a failed one.

use std::time::Duration;

use skyriver_sim::{run_seed, Cluster, RunMode};

const OBJ: u64 = 1;

#[test]
fn releases_of_held_objects_flush_clean() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 1_000);
    c.drive();
    // Each fetch's reference is released (unanswered) once the client is done with it; the
    // fourth release brings a flush.
    for _ in 0..4 {
        c.fetch(1, &[OBJ], Duration::from_millis(5));
        c.drive();
    }
    c.check_quiescence();
    assert!(c.violations().is_empty(), "{:#?}", c.violations());
    assert_eq!(c.stats().flushes, 1);
    assert!(c.trace_text().contains("flushed 4 releases"));
}

#[test]
fn a_failed_release_is_reported_by_the_next_flush() {
    let mut c = Cluster::scripted(1);
    c.put(0, OBJ, 1_000);
    c.drive();
    // Not held: the node keeps the failure for the client's next flush.
    c.release(0, OBJ);
    c.drive();
    assert!(c.violations().is_empty(), "{:#?}", c.violations());
    c.flush(0);
    c.drive();
    assert!(
        c.violations()
            .iter()
            .any(|v| v.contains("one of 1 releases failed")),
        "{:#?}",
        c.violations()
    );
}

#[test]
fn workload_clients_flush_their_releases() {
    let report = run_seed(
        7,
        None,
        RunMode {
            workload: true,
            faults: false,
            keep_trace: false,
            echo_trace: false,
        },
    );
    assert!(report.passed(), "{:#?}", report.violations);
    assert!(report.stats.flushes > 0, "{:?}", report.stats);
}
