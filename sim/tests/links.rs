//! Connections under simulation come from the cores' own dialing rule: the directory's
//! membership and health reach every core, the higher id of each pair dials the lower
//! (`NodeOutput::Connect`), and a dial that fails backs off until the peer is reachable again.

use std::time::Duration;

use skyriver_sim::cluster::Cluster;

fn connected(c: &Cluster, node: u32, peer: u32) -> bool {
    c.node(node)
        .expect("alive")
        .metrics()
        .peers
        .iter()
        .any(|p| p.node.0 == peer && p.connected)
}

#[test]
fn a_restarted_node_is_dialed_by_the_higher_ids_once_the_membership_lists_it() {
    let mut c = Cluster::scripted(3);
    c.drive();
    c.crash(0);
    c.drive();
    assert!(!connected(&c, 1, 0) && !connected(&c, 2, 0));
    c.restart(0);
    c.drive();
    let text = c.trace_text();
    assert!(text.contains("node-1 dials node-0"), "{text}");
    assert!(text.contains("node-2 dials node-0"), "{text}");
    assert!(
        !text.contains("node-0 dials"),
        "the lower id never dials:\n{text}"
    );
    for (node, peer) in [(0, 1), (0, 2), (1, 0), (2, 0), (1, 2)] {
        assert!(connected(&c, node, peer), "{node} to {peer}:\n{text}");
    }
    // The restarted node fetches across its new connections.
    let id = c.put(1, 7, 4_000);
    c.drive();
    c.fetch(0, &[7], Duration::from_millis(8));
    c.drive();
    assert!(c.trace_text().contains("node-0 sealed obj#7"), "{id}");
    assert!(c.violations().is_empty(), "{:?}", c.violations());
}

#[test]
fn a_healed_partition_is_redialed_after_failed_dials_back_off() {
    let mut c = Cluster::scripted(2);
    c.drive();
    c.partition(0, 1, true);
    let cut = c.now();
    c.run_until(skyriver_core::Instant(cut.0 + 5_000_000));
    let text = c.trace_text();
    let failed = text.matches("node-1 dials node-0: unreachable").count();
    assert!(failed >= 2, "dials go on while cut off:\n{text}");
    assert!(failed <= 6, "but back off:\n{text}");
    assert!(!connected(&c, 1, 0));
    c.partition(0, 1, false);
    c.drive();
    assert!(
        connected(&c, 1, 0) && connected(&c, 0, 1),
        "{}",
        c.trace_text()
    );
    assert!(c.violations().is_empty(), "{:?}", c.violations());
}

/// Runs events (heartbeats included) until `holds`, for at most `limit` of virtual time.
fn run_until_holds(c: &mut Cluster, limit: Duration, holds: impl Fn(&Cluster) -> bool) -> bool {
    let end = c.now().0 + limit.as_nanos() as u64;
    while !holds(c) {
        if c.now().0 > end || !c.step() {
            return false;
        }
    }
    true
}

#[test]
fn the_directory_health_reaches_the_core() {
    let mut c = Cluster::scripted(2);
    c.drive();
    let healthy = |c: &Cluster| c.node(1).expect("alive").directory_healthy();
    assert!(healthy(&c));
    c.partition_from_head(1, true);
    assert!(run_until_holds(&mut c, Duration::from_secs(1), |c| {
        !healthy(c)
    }));
    c.partition_from_head(1, false);
    assert!(run_until_holds(&mut c, Duration::from_secs(1), healthy));
}
