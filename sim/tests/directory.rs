//! The real directory (the core's registry and sessions) in scripted clusters: the head's
//! crash, a node cut off from the head, and the checks that watch them. Golden traces are
//! reviewed like code (`cargo insta review`).

use std::time::Duration;

use skyriver_core::{Instant, NodeId, ObjectId};
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

fn later(cluster: &Cluster, us: u64) -> Instant {
    Instant(cluster.now().as_nanos() + us * 1000)
}

#[test]
fn a_waiting_fetch_survives_a_head_crash() {
    let mut c = Cluster::scripted(2);
    c.fetch(1, &[OBJ], Duration::from_millis(30));
    c.run_until(later(&c, 100));
    assert!(c
        .directory()
        .registry()
        .unwrap()
        .is_subscribed(NodeId(1), &ObjectId::from_u64(OBJ)));
    c.note("the head crashes with node-1's subscription; it comes back empty 2 ms later");
    c.crash_head(false);
    c.run_until(later(&c, 2_000));
    assert!(c.directory().registry().is_none());
    c.restart_head();
    c.run_until(later(&c, 4_000));
    assert!(
        c.directory()
            .registry()
            .unwrap()
            .is_subscribed(NodeId(1), &ObjectId::from_u64(OBJ)),
        "the session re-registered the subscription"
    );
    c.note("node-0 creates obj#1: the re-registered subscription delivers it");
    c.put(0, OBJ, 1_000);
    let text = finish(c);
    assert!(
        text.lines()
            .any(|l| l.contains("client-1@node-1 fetch") && l.contains("-> [obj#1 ok")),
        "{text}"
    );
    insta::assert_snapshot!(text);
}

#[test]
fn a_silent_head_crash_is_found_by_heartbeat() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 1_000);
    c.drive();
    c.note("the head dies without a reset: sessions notice by their 5 ms heartbeat timeout");
    c.crash_head(true);
    c.run_until(later(&c, 1_000));
    c.restart_head();
    c.run_until(later(&c, 6_000));
    assert!(c.directory().is_registered(NodeId(0)));
    assert_eq!(
        c.directory()
            .registry()
            .unwrap()
            .holders_of(&ObjectId::from_u64(OBJ)),
        vec![NodeId(0)],
        "node-0 re-published what it holds"
    );
    c.fetch(1, &[OBJ], Duration::from_millis(5));
    let text = finish(c);
    assert!(text.contains("node-1 sealed obj#1"), "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn a_node_cut_off_from_the_head_vanishes_within_the_bound_and_returns() {
    let mut c = Cluster::scripted(2);
    c.put(0, OBJ, 1_000);
    c.drive();
    c.note("node-0 is cut off from the head: the registry drops it at its 5 ms heartbeat bound");
    c.partition_from_head(0, true);
    let cut_at = c.now();
    c.run_until(later(&c, 4_000));
    let id = ObjectId::from_u64(OBJ);
    assert_eq!(
        c.directory().registry().unwrap().holders_of(&id),
        vec![NodeId(0)],
        "still within the bound"
    );
    c.run_until(Instant(cut_at.as_nanos() + 7_000_000));
    assert!(
        c.directory().registry().unwrap().holders_of(&id).is_empty(),
        "past the bound its locations are gone"
    );
    c.note("the cut heals: node-0 re-registers and re-publishes");
    c.partition_from_head(0, false);
    c.run_until(later(&c, 10_000));
    assert_eq!(
        c.directory().registry().unwrap().holders_of(&id),
        vec![NodeId(0)]
    );
    let text = finish(c);
    insta::assert_snapshot!(text);
}
