//! The nodes' and the registry's own consistency checks scale: a node holding many objects, a
//! registry of many members, is not scanned whole after every input or change (the cost of an
//! event would grow with the cluster and what it holds), yet whatever changed is checked by the
//! end of a run.

use skyriver_core::Instant;
use skyriver_sim::{Cluster, RunMode};

#[test]
fn nodes_holding_many_objects_are_checked_every_few_inputs_and_at_the_end() {
    let mode = RunMode {
        workload: true,
        faults: true,
        keep_trace: false,
        echo_trace: false,
    };
    let mut cluster = Cluster::random(1, Some(50), mode);
    cluster.run_until(Instant(30_000_000));
    assert!(
        cluster.violations().is_empty(),
        "{:#?}",
        cluster.violations()
    );
    let events = cluster.stats().events;
    let checks = cluster.node_invariant_checks();
    eprintln!("{events} events, {checks} node checks");
    // Most events are inputs to a node; a check after each would make about as many.
    assert!(checks > 0, "no node was checked in {events} events");
    assert!(
        checks * 3 < events,
        "{checks} node checks in {events} events: every input scans its node"
    );
    // The end of the run checked what was left unchecked; events run one by one leave some.
    assert_eq!(cluster.nodes_unchecked(), 0, "left unchecked at the end");
    for _ in 0..1_000 {
        cluster.step();
    }
    assert!(
        cluster.nodes_unchecked() > 0,
        "every node checked at every input"
    );
    let before = cluster.node_invariant_checks();
    cluster.run_until(cluster.now());
    assert_eq!(cluster.nodes_unchecked(), 0, "left unchecked at the end");
    assert!(cluster.node_invariant_checks() > before);
}

#[test]
fn a_registry_of_many_members_is_checked_every_few_changes_and_at_the_end() {
    let mode = RunMode {
        workload: true,
        faults: false,
        keep_trace: false,
        echo_trace: false,
    };
    // More members than are checked after every change.
    let mut cluster = Cluster::random(2, Some(80), mode);
    let mut left_unchecked = false;
    for _ in 0..20_000 {
        cluster.step();
        left_unchecked |= cluster.directory().registry_changes_unchecked() > 0;
    }
    assert!(
        left_unchecked,
        "the registry was checked after every change"
    );
    cluster.run_until(cluster.now());
    assert_eq!(
        cluster.directory().registry_changes_unchecked(),
        0,
        "registry changes left unchecked at the end of the run"
    );
    assert!(
        cluster.violations().is_empty(),
        "{:#?}",
        cluster.violations()
    );
}
