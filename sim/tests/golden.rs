//! Golden traces of each protocol path, reviewed like code when they change
//! (`cargo insta review`). Scripted clusters: fixed parameters, no random workload or faults,
//! relative virtual time, stable ids.

use std::time::Duration;

use skyriver_sim::Cluster;

const OBJ: u64 = 1;

fn finish(mut cluster: Cluster) -> String {
    cluster.drive();
    cluster.check_quiescence();
    assert!(
        cluster.violations().is_empty(),
        "violations: {:#?}",
        cluster.violations()
    );
    cluster.trace_text()
}

#[test]
fn eager_fetch() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 1_000);
    c.drive();
    c.note("node-1 fetches a 1000-byte object: below the 6 KiB threshold, one EagerData");
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn eager_fetch_in_several_chunks() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 5_000);
    c.drive();
    c.note("5000 bytes with ~4 KiB receive slots: two EagerData chunks");
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn rendezvous_fetch() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 40_000);
    c.drive();
    c.note("40000 bytes: Rendezvous, 16 KiB READs, window 2, over 2 lanes, then Finish");
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn concurrent_fetches_coalesce() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 40_000);
    c.drive();
    c.note("two fetches of one object on node-1: one lookup, one transfer, two replies");
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn fetch_of_missing_object() {
    let mut c = Cluster::scripted(2);
    c.note("nobody holds obj#1: the lookup subscribes, the deadline answers not-found");
    c.fetch(1, &[OBJ], Duration::from_millis(1));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn fetch_without_waiting_fails_after_the_grace() {
    let mut c = Cluster::scripted(2);
    c.note("nobody holds obj#1 and the fetch does not wait: not-found after the 1 ms grace, well before the 50 ms deadline");
    c.fetch_without_waiting(1, &[OBJ], Duration::from_millis(50));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn fetch_waits_for_publication() {
    let mut c = Cluster::scripted(2);
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    c.drive_until(|c| c.now().as_nanos() >= 200_000);
    c.note("node-0 creates obj#1 while node-1 waits: the subscription delivers it");
    c.put(0, OBJ, 1_000);
    insta::assert_snapshot!(finish(c));
}

#[test]
fn holder_crash_during_reads() {
    let mut c = Cluster::scripted(3);
    c.put(0, OBJ, 64_000);
    c.drive();
    c.fetch(1, &[OBJ], Duration::from_millis(8));
    assert!(c.drive_until(|c| c.reads_in_flight() > 0));
    c.note("a second copy appears on node-2, then the holder node-0 crashes mid-READ");
    c.put(2, OBJ, 64_000);
    c.crash(0);
    insta::assert_snapshot!(finish(c));
}

#[test]
fn persistent_holder_restarts_and_serves_again() {
    let mut c = Cluster::scripted(2);
    c.set_persistent(true);
    c.put(0, OBJ, 20_000);
    c.drive();
    c.note("node-0 crashes and restarts with its arena intact: it recovers and re-publishes obj#1");
    c.crash(0);
    c.drive();
    c.restart(0);
    c.drive();
    c.fetch(1, &[OBJ], Duration::from_millis(8));
    let text = finish(c);
    assert!(text.contains("recovering 1 objects"), "{text}");
    assert!(
        text.contains("node-1 sealed obj#1"),
        "the recovered copy is fetched:\n{text}"
    );
    insta::assert_snapshot!(text);
}

#[test]
fn requester_crash_lease_expires() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 64_000);
    c.drive();
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    assert!(c.drive_until(|c| c.reads_in_flight() > 0));
    c.note("the requester node-1 crashes mid-READ: node-0 unpins when the lease expires");
    c.crash(1);
    let text = finish(c);
    assert!(
        text.contains("node-0 revoked node-1 xfer-1"),
        "the lease must end:\n{text}"
    );
    insta::assert_snapshot!(text);
}

#[test]
fn qp_error_then_retry_from_another_holder() {
    let mut c = Cluster::scripted(3);
    c.put(0, OBJ, 40_000);
    c.put(2, OBJ, 40_000);
    c.drive();
    c.note(
        "node-1's first READ fails with a QP error: drain, abort, Finish, retry the other holder",
    );
    c.fail_next_reads(1, 1);
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn requester_store_full() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 200_000);
    c.put_and_hold(1, 2, 900_000, Duration::from_millis(10));
    c.drive_until(|c| c.now().as_nanos() >= 100_000);
    c.note("node-1 holds 900 KB of its 1 MiB: the fetch fails out-of-memory at admission");
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}

#[test]
fn inline_put_then_eager_fetch() {
    let mut c = Cluster::scripted(2);
    c.note("a 1000-byte put in one request: created, written and sealed by node-0");
    c.put_inline(0, OBJ, 1_000);
    c.drive();
    c.note("node-1 fetches it: the bytes it gets are the ones the put carried");
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    insta::assert_snapshot!(finish(c));
}
