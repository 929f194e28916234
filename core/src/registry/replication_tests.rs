//! The registry's replication rules, driven by hand: placement, progress, repair and its rate,
//! target timeouts, losses and deletes. Each node `n` joins on connection `n`.

use std::time::Duration;

use super::session::SessionOutput;
use super::tests::{
    admit, at_ms, digest, drain, events_for, exchange, joined_session, member, registry, request,
    session_config, sizes, NONCE_KEY, TOKEN,
};
use super::*;
use crate::directory::{DirectoryNotice, DirectoryOpId};

/// A registry whose members stay alive for the whole test without heartbeats.
fn patient_registry() -> Registry {
    let mut config = RegistryConfig::new(TOKEN, NONCE_KEY);
    config.heartbeat_timeout = Duration::from_secs(3600);
    Registry::new(config)
}

fn join_in(registry: &mut Registry, now: Instant, node: u32, domain: &str) {
    let mut info = member(node, 1);
    info.failure_domain = domain.into();
    admit(registry, now, u64::from(node), info).expect("joins");
    drain(registry);
}

fn publish_replicated(
    registry: &mut Registry,
    now: Instant,
    node: u32,
    object: u64,
    bytes: u64,
    replicas: u8,
) -> Vec<(ConnId, FromRegistry)> {
    request(
        registry,
        now,
        u64::from(node),
        now.as_nanos(),
        DirectoryRequest::PublishReplicated {
            id: ObjectId::from_u64(object),
            sizes: sizes(bytes),
            digest: digest(bytes),
            replicas,
            free_bytes: 1 << 30,
        },
    )
}

/// The nodes told to replicate, in the order told.
fn replicate_targets(out: &[(ConnId, FromRegistry)]) -> Vec<u32> {
    out.iter()
        .filter_map(|(conn, m)| match m {
            FromRegistry::Event(DirectoryEvent::Replicate { .. }) => Some(conn.0 as u32),
            _ => None,
        })
        .collect()
}

fn copies_told(out: &[(ConnId, FromRegistry)], conn: u64) -> Vec<u32> {
    events_for(out, conn)
        .into_iter()
        .filter_map(|e| match e {
            DirectoryEvent::Copies { copies, .. } => Some(copies),
            _ => None,
        })
        .collect()
}

#[test]
fn a_put_places_its_copies_on_distinct_domains_and_its_origin_hears_each() {
    let mut r = registry();
    let t = at_ms(0);
    join_in(&mut r, t, 0, "rack-a");
    join_in(&mut r, t, 1, "rack-a");
    join_in(&mut r, t, 2, "rack-b");
    join_in(&mut r, t, 3, "rack-c");
    let out = publish_replicated(&mut r, t, 0, 7, 100, 3);
    let mut targets = replicate_targets(&out);
    targets.sort();
    assert_eq!(targets, vec![2, 3], "rack-a has the origin already");
    assert_eq!(copies_told(&out, 0), vec![1]);
    match &events_for(&out, 2)[0] {
        DirectoryEvent::Replicate {
            sources, replicas, ..
        } => {
            assert_eq!(sources, &vec![NodeId(0)]);
            assert_eq!(*replicas, 3);
        }
        other => panic!("expected Replicate, got {other}"),
    }
    let out = publish_replicated(&mut r, t, 2, 7, 100, 3);
    assert_eq!(copies_told(&out, 0), vec![2]);
    assert!(replicate_targets(&out).is_empty());
    let out = publish_replicated(&mut r, t, 3, 7, 100, 3);
    assert_eq!(copies_told(&out, 0), vec![3]);
    let stats = r.replication_stats();
    assert_eq!(stats.under_replicated_objects, 0);
    assert_eq!(stats.replicated_objects, 1);
    // Complete: further changes are not reported to the origin.
    let out = publish_replicated(&mut r, t, 1, 7, 100, 3);
    assert!(copies_told(&out, 0).is_empty());
}

#[test]
fn a_lost_copy_is_repaired_at_a_bounded_rate() {
    let mut r = patient_registry();
    r.set_replication_limits(ReplicationLimits {
        repair_bytes_per_second: 1000,
        ..ReplicationLimits::default()
    });
    let t = at_ms(0);
    for node in 0..4 {
        join_in(&mut r, t, node, &format!("rack-{node}"));
    }
    // Three objects of 600 bytes with copies of record on 0 and where it placed them.
    for object in 0..3 {
        let out = publish_replicated(&mut r, t, 0, object, 600, 2);
        let target = replicate_targets(&out)[0];
        publish_replicated(&mut r, t, target, object, 600, 2);
    }
    assert_eq!(r.replication_stats().under_replicated_objects, 0);
    // Node 0 dies: three repairs of 600 bytes at 1000 bytes/s; the bucket (1000) was
    // spent by nothing yet, so one goes now, the next once 600 bytes of budget are back.
    r.handle_disconnect(at_ms(10), ConnId(0));
    let out = drain(&mut r);
    assert_eq!(replicate_targets(&out).len(), 1, "one repair at once");
    assert_eq!(r.replication_stats().under_replicated_objects, 3);
    let next = r.poll_timeout().expect("repairs are due later");
    assert!(
        next > at_ms(10) && next <= at_ms(10 + 200 + 1),
        "the second repair waits for 200 bytes of budget: {next}"
    );
    r.handle_timeout(at_ms(100));
    assert!(
        replicate_targets(&drain(&mut r)).is_empty(),
        "not before its budget"
    );
    r.handle_timeout(next);
    assert_eq!(replicate_targets(&drain(&mut r)).len(), 1);
    let last = r.poll_timeout().expect("one repair left");
    assert!(
        last >= next + Duration::from_millis(599),
        "{last} after {next}"
    );
    r.handle_timeout(last);
    assert_eq!(replicate_targets(&drain(&mut r)).len(), 1);
    let stats = r.replication_stats();
    assert_eq!(stats.repairs_started, 3);
    assert_eq!(stats.repair_bytes, 1800);
    assert_eq!(stats.repairs_queued, 0);
}

#[test]
fn repair_never_places_a_copy_on_a_node_that_holds_one() {
    let mut r = registry();
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    let out = publish_replicated(&mut r, t, 0, 1, 10, 2);
    let target = replicate_targets(&out)[0];
    publish_replicated(&mut r, t, target, 1, 10, 2);
    r.handle_disconnect(t, ConnId(0));
    let out = drain(&mut r);
    assert_eq!(
        replicate_targets(&out),
        vec![3 - target],
        "the only live node without a copy"
    );
}

#[test]
fn a_target_that_does_not_publish_in_time_is_replaced() {
    let mut r = registry();
    r.set_replication_limits(ReplicationLimits {
        target_timeout: Duration::from_millis(50),
        ..ReplicationLimits::default()
    });
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    let out = publish_replicated(&mut r, t, 0, 1, 10, 2);
    let first = replicate_targets(&out);
    assert_eq!(first.len(), 1);
    // Members keep heartbeating (the heartbeat timeout is 100 ms), the target stays silent
    // about the object.
    for node in 0..3 {
        r.handle_ping(at_ms(40), ConnId(node), 1).unwrap();
    }
    drain(&mut r);
    assert_eq!(r.poll_timeout(), Some(at_ms(50)), "the target's deadline");
    r.handle_timeout(at_ms(50));
    let out = drain(&mut r);
    let second = replicate_targets(&out);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first, "another node");
    assert_eq!(r.replication_stats().targets_timed_out, 1);
}

#[test]
fn an_object_whose_every_holder_died_is_lost_and_counted() {
    let mut r = registry();
    let t = at_ms(0);
    join_in(&mut r, t, 0, "");
    publish_replicated(&mut r, t, 0, 1, 10, 2);
    assert_eq!(r.replication_stats().under_replicated_objects, 1);
    r.handle_disconnect(t, ConnId(0));
    drain(&mut r);
    let stats = r.replication_stats();
    assert_eq!(stats.objects_lost, 1);
    assert_eq!(stats.replicated_objects, 0);
    // Once a node joins, nothing is placed: nobody holds it.
    join_in(&mut r, t, 1, "");
    assert_eq!(r.replication_stats().repairs_started, 0);
}

#[test]
fn a_put_waits_for_a_node_to_join_when_none_can_take_its_copy() {
    let mut r = registry();
    let t = at_ms(0);
    join_in(&mut r, t, 0, "");
    let out = publish_replicated(&mut r, t, 0, 1, 10, 2);
    assert!(replicate_targets(&out).is_empty());
    let mut info = member(1, 1);
    info.failure_domain = "b".into();
    admit(&mut r, t, 1, info).unwrap();
    let out = drain(&mut r);
    assert_eq!(replicate_targets(&out), vec![1]);
}

#[test]
fn a_repair_no_node_can_take_neither_spins_the_timer_nor_blocks_the_others() {
    let mut r = patient_registry();
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    // Object 1 wants three copies (all three nodes), object 2 two (nodes 0 and 1).
    let out = publish_replicated(&mut r, t, 0, 1, 10, 3);
    let mut first = replicate_targets(&out);
    first.sort();
    assert_eq!(first, vec![1, 2]);
    publish_replicated(&mut r, t, 1, 1, 10, 3);
    publish_replicated(&mut r, t, 2, 1, 10, 3);
    let out = publish_replicated(&mut r, t, 0, 2, 10, 2);
    let second = replicate_targets(&out);
    assert_eq!(second.len(), 1);
    publish_replicated(&mut r, t, second[0], 2, 10, 2);
    drain(&mut r);
    // Node 2 leaves: object 1 is below three copies with nobody left to take one.
    let t = at_ms(10);
    r.handle_disconnect(t, ConnId(2));
    drain(&mut r);
    let due = r.poll_timeout();
    assert!(
        due.is_none_or(|at| at > t),
        "an unplaceable repair is not due again at once: {due:?}"
    );
    // A node joins: the repair is placed on it.
    admit(&mut r, t, 3, member(3, 1)).expect("joins");
    let out = drain(&mut r);
    assert_eq!(replicate_targets(&out), vec![3]);
}

#[test]
fn delete_everywhere_tells_every_other_holder_and_ends_the_record() {
    let mut r = registry();
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    publish_replicated(&mut r, t, 0, 1, 10, 3);
    publish_replicated(&mut r, t, 1, 1, 10, 3);
    publish_replicated(&mut r, t, 2, 1, 10, 3);
    let out = request(
        &mut r,
        t,
        1,
        99,
        DirectoryRequest::DeleteEverywhere {
            id: ObjectId::from_u64(1),
        },
    );
    for (node, told) in [(0, true), (1, false), (2, true)] {
        let deletes = events_for(&out, node)
            .into_iter()
            .filter(|e| matches!(e, DirectoryEvent::Delete { .. }))
            .count();
        assert_eq!(deletes, usize::from(told), "node {node}");
    }
    assert!(r.holders_of(&ObjectId::from_u64(1)).is_empty());
    assert_eq!(r.replication_stats().replicated_objects, 0);
    // The withdrawals that follow change nothing.
    let out = request(
        &mut r,
        t,
        0,
        100,
        DirectoryRequest::Withdraw {
            id: ObjectId::from_u64(1),
        },
    );
    assert!(replicate_targets(&out).is_empty());
}

#[test]
fn a_returning_copy_of_record_counts_again_while_short_and_a_later_one_is_surplus() {
    let mut r = patient_registry();
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    let out = publish_replicated(&mut r, t, 0, 1, 10, 2);
    let target = replicate_targets(&out)[0];
    publish_replicated(&mut r, t, target, 1, 10, 2);
    // Node 0 is cut off past the heartbeat bound: repair places a copy on the third node.
    r.handle_disconnect(t, ConnId(0));
    let repairer = 3 - target;
    assert_eq!(replicate_targets(&drain(&mut r)), vec![repairer]);
    // Node 0 comes back (on a new connection) before the repair is done, and publishes its
    // copy of record again: the object is short, so it counts again.
    admit(&mut r, t, 10, member(0, 1)).expect("rejoins");
    drain(&mut r);
    let republish = DirectoryRequest::PublishReplicated {
        id: ObjectId::from_u64(1),
        sizes: sizes(10),
        digest: digest(10),
        replicas: 2,
        free_bytes: 1 << 30,
    };
    let out = request(&mut r, t, 10, 99, republish);
    assert!(events_for(&out, 10).is_empty(), "counted: {out:?}");
    let mut expected = vec![NodeId(0), NodeId(target)];
    expected.sort();
    assert_eq!(
        r.copies_of_record(&ObjectId::from_u64(1)),
        Some((2, expected.clone()))
    );
    // The repair's copy arrives with two copies of record counted already: surplus.
    let out = publish_replicated(&mut r, t, repairer, 1, 10, 2);
    assert_eq!(
        events_for(&out, u64::from(repairer)),
        vec![DirectoryEvent::Surplus {
            id: ObjectId::from_u64(1)
        }]
    );
    assert_eq!(
        r.copies_of_record(&ObjectId::from_u64(1)),
        Some((2, expected))
    );
    let stats = r.replication_stats();
    assert_eq!(stats.surplus_copies, 1);
    assert_eq!(stats.under_replicated_objects, 0);
    // Its copy stays listed (a plain one), so fetches may use it.
    assert_eq!(r.holders_of(&ObjectId::from_u64(1)).len(), 3);
}

#[test]
fn a_copy_goes_to_a_node_whose_old_report_said_too_little_when_no_other_can_take_it() {
    let mut r = patient_registry();
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    // Nodes 1 and 2 last reported 5 free bytes, at a publication of their own (they may have
    // freed memory since: deletes, evictable copies).
    for node in 1..3u32 {
        request(
            &mut r,
            t,
            u64::from(node),
            u64::from(node),
            DirectoryRequest::PublishReplicated {
                id: ObjectId::from_u64(100 + u64::from(node)),
                sizes: sizes(10),
                digest: digest(10),
                replicas: 1,
                free_bytes: 5,
            },
        );
    }
    let out = publish_replicated(&mut r, t, 0, 1, 10, 2);
    let targets = replicate_targets(&out);
    assert_eq!(targets.len(), 1, "asked despite the old report: {out:?}");
    assert!(targets[0] == 1 || targets[0] == 2);
}

#[test]
fn retries_go_round_the_nodes_given_up_on_rather_than_back_to_one() {
    let mut r = patient_registry();
    r.set_replication_limits(ReplicationLimits {
        target_timeout: Duration::from_millis(50),
        ..ReplicationLimits::default()
    });
    let t = at_ms(0);
    for node in 0..4 {
        join_in(&mut r, t, node, "");
    }
    let mut asked = replicate_targets(&publish_replicated(&mut r, t, 0, 1, 10, 2));
    // No target ever publishes (say none has one free block large enough): each is given up
    // on at its deadline and another asked.
    for round in 1..=5 {
        let at = at_ms(50 * round);
        assert_eq!(r.poll_timeout(), Some(at), "the target's deadline");
        r.handle_timeout(at);
        asked.extend(replicate_targets(&drain(&mut r)));
    }
    assert_eq!(asked.len(), 6, "one target at a time: {asked:?}");
    let mut first = asked[..3].to_vec();
    first.sort();
    assert_eq!(first, vec![1, 2, 3], "every other node once: {asked:?}");
    assert_eq!(
        asked[3..],
        asked[..3],
        "then again, the one given up on longest ago first"
    );
}

fn decline(
    registry: &mut Registry,
    now: Instant,
    node: u32,
    object: u64,
) -> Vec<(ConnId, FromRegistry)> {
    request(
        registry,
        now,
        u64::from(node),
        now.as_nanos() + 1,
        DirectoryRequest::DeclineReplica {
            id: ObjectId::from_u64(object),
        },
    )
}

#[test]
fn a_target_that_declines_is_replaced_at_once_not_at_its_deadline() {
    let mut r = patient_registry();
    let t = at_ms(0);
    for node in 0..4 {
        join_in(&mut r, t, node, "");
    }
    let first = replicate_targets(&publish_replicated(&mut r, t, 0, 1, 10, 2));
    assert_eq!(first.len(), 1);
    // The target cannot take the copy (no room): it says so 1 ms later.
    let out = decline(&mut r, at_ms(1), first[0], 1);
    assert!(
        out.iter().any(|(conn, m)| conn.0 == u64::from(first[0])
            && matches!(
                m,
                FromRegistry::Reply {
                    reply: DirectoryReply::Done,
                    ..
                }
            )),
        "answered: {out:?}"
    );
    let second = replicate_targets(&out);
    assert_eq!(second.len(), 1, "another node asked at once: {out:?}");
    assert_ne!(second, first);
    let stats = r.replication_stats();
    assert_eq!(stats.targets_declined, 1);
    assert_eq!(stats.targets_timed_out, 0);
    // The replacement publishes: the put has its two copies, well before any target timeout.
    let out = publish_replicated(&mut r, at_ms(2), second[0], 1, 10, 2);
    assert_eq!(copies_told(&out, 0), vec![2]);
    assert_eq!(r.replication_stats().under_replicated_objects, 0);
    r.check_invariants();
}

#[test]
fn a_node_that_declined_is_asked_again_only_after_a_target_timeout() {
    let mut r = patient_registry();
    r.set_replication_limits(ReplicationLimits {
        target_timeout: Duration::from_millis(50),
        ..ReplicationLimits::default()
    });
    let t = at_ms(0);
    for node in 0..2 {
        join_in(&mut r, t, node, "");
    }
    let first = replicate_targets(&publish_replicated(&mut r, t, 0, 1, 10, 2));
    assert_eq!(first, vec![1]);
    // The only other node declines: nobody is asked (no loop of instant refusals) until its
    // decline has aged a target timeout.
    let out = decline(&mut r, at_ms(10), 1, 1);
    assert!(replicate_targets(&out).is_empty(), "{out:?}");
    assert_eq!(r.poll_timeout(), Some(at_ms(60)), "asked again then");
    r.handle_timeout(at_ms(59));
    assert!(replicate_targets(&drain(&mut r)).is_empty());
    r.handle_timeout(at_ms(60));
    assert_eq!(replicate_targets(&drain(&mut r)), vec![1], "asked again");
    // A decline of a node not (or no longer) asked changes nothing.
    let out = decline(&mut r, at_ms(61), 0, 1);
    assert!(replicate_targets(&out).is_empty());
    assert_eq!(r.replication_stats().targets_declined, 1);
    r.check_invariants();
}

/// Objects 1 and 2 put with two copies by node 0 and placed on another node; node 0 is cut
/// off past the heartbeat bound (its copies repaired onto the third node), then object 1 is
/// deleted on a live holder. Returns the registry and the node that deleted.
fn deleted_while_cut_off(limits: ReplicationLimits) -> (Registry, u32) {
    let mut r = patient_registry();
    r.set_replication_limits(limits);
    let t = at_ms(0);
    for node in 0..3 {
        join_in(&mut r, t, node, "");
    }
    let out = publish_replicated(&mut r, t, 0, 1, 10, 2);
    let target = replicate_targets(&out)[0];
    publish_replicated(&mut r, t, target, 1, 10, 2);
    r.handle_disconnect(at_ms(1), ConnId(0));
    let repairer = 3 - target;
    assert_eq!(replicate_targets(&drain(&mut r)), vec![repairer]);
    publish_replicated(&mut r, at_ms(2), repairer, 1, 10, 2);
    let out = request(
        &mut r,
        at_ms(3),
        u64::from(target),
        99,
        DirectoryRequest::DeleteEverywhere {
            id: ObjectId::from_u64(1),
        },
    );
    assert_eq!(
        events_for(&out, u64::from(repairer)),
        vec![DirectoryEvent::Delete {
            id: ObjectId::from_u64(1)
        }]
    );
    // Node 0 comes back on a new connection; it never heard of the delete.
    admit(&mut r, at_ms(4), 10, member(0, 1)).expect("rejoins");
    drain(&mut r);
    (r, target)
}

/// Whether `out` tells the node on `conn` to delete something.
fn told_delete(out: &[(ConnId, FromRegistry)], conn: u64) -> bool {
    events_for(out, conn)
        .iter()
        .any(|e| matches!(e, DirectoryEvent::Delete { .. }))
}

fn republish(r: &mut Registry, now: Instant, conn: u64, op: u64) -> Vec<(ConnId, FromRegistry)> {
    request(
        r,
        now,
        conn,
        op,
        DirectoryRequest::PublishReplicated {
            id: ObjectId::from_u64(1),
            sizes: sizes(10),
            digest: digest(10),
            replicas: 2,
            free_bytes: 1 << 30,
        },
    )
}

#[test]
fn a_copy_of_record_that_missed_its_delete_is_told_again_when_it_returns_and_not_copied() {
    let (mut r, deleter) = deleted_while_cut_off(ReplicationLimits::default());
    let id = ObjectId::from_u64(1);
    let delete = vec![DirectoryEvent::Delete { id }];
    // Its replay lists what it holds as plain copies: the deleted content is not listed.
    let out = request(
        &mut r,
        at_ms(5),
        10,
        100,
        DirectoryRequest::Publish {
            id,
            sizes: sizes(10),
            digest: digest(10),
        },
    );
    assert_eq!(events_for(&out, 10), delete);
    assert!(r.holders_of(&id).is_empty());
    // Then it publishes its copy of record again: a Delete, no record, no copy placed.
    let out = republish(&mut r, at_ms(6), 10, 101);
    assert_eq!(events_for(&out, 10), delete, "{out:?}");
    assert!(replicate_targets(&out).is_empty(), "{out:?}");
    assert!(
        out.iter().any(|(conn, m)| *conn == ConnId(10)
            && matches!(
                m,
                FromRegistry::Reply {
                    op: WireOpId(101),
                    reply: DirectoryReply::Done
                }
            )),
        "answered: {out:?}"
    );
    assert_eq!(r.copies_of_record(&id), None);
    assert!(r.holders_of(&id).is_empty());
    let stats = r.replication_stats();
    assert_eq!((stats.deletes_repeated, stats.tombstones), (2, 1));
    // The holder told at the delete publishes the content without having withdrawn it (say
    // its fetch of it sealed before the delete and published after): deleted again too.
    let told = u64::from(3 - deleter);
    let out = republish(&mut r, at_ms(7), told, 102);
    assert_eq!(events_for(&out, told), delete, "{out:?}");
    // Node 0 drops its copy (withdraws): a new put of the same bytes there is an ordinary one.
    request(&mut r, at_ms(8), 10, 103, DirectoryRequest::Withdraw { id });
    let out = republish(&mut r, at_ms(9), 10, 104);
    assert!(!told_delete(&out, 10), "{out:?}");
    assert_eq!(replicate_targets(&out).len(), 1, "{out:?}");
    assert_eq!(r.replication_stats().tombstones, 0);
    r.check_invariants();
}

#[test]
fn a_new_put_of_deleted_content_by_a_node_that_heard_the_delete_ends_the_tombstone() {
    let (mut r, deleter) = deleted_while_cut_off(ReplicationLimits::default());
    let out = republish(&mut r, at_ms(5), u64::from(deleter), 100);
    assert_eq!(replicate_targets(&out).len(), 1, "a put like any: {out:?}");
    assert_eq!(r.replication_stats().tombstones, 0);
    // The returning copy is of the same bytes, now live again: counted (or surplus).
    let out = republish(&mut r, at_ms(6), 10, 101);
    assert!(events_for(&out, 10).is_empty(), "{out:?}");
}

#[test]
fn without_tombstones_a_copy_that_missed_its_delete_brings_the_object_back() {
    let (mut r, _) = deleted_while_cut_off(ReplicationLimits {
        max_tombstones: 0,
        ..ReplicationLimits::default()
    });
    let out = republish(&mut r, at_ms(5), 10, 100);
    assert!(!told_delete(&out, 10), "{out:?}");
    assert_eq!(replicate_targets(&out).len(), 1, "copied again: {out:?}");
    assert_eq!(r.replication_stats().tombstones_dropped, 1);
}

#[test]
fn tombstones_are_bounded_in_number_and_time() {
    let mut r = patient_registry();
    r.set_replication_limits(ReplicationLimits {
        max_tombstones: 2,
        tombstone_lifetime: Duration::ZERO,
        ..ReplicationLimits::default()
    });
    let t = at_ms(0);
    for node in 0..2 {
        join_in(&mut r, t, node, "");
    }
    for object in 1..=3 {
        publish_replicated(&mut r, t, 0, object, 10, 2);
        publish_replicated(&mut r, t, 1, object, 10, 2);
        request(
            &mut r,
            t,
            0,
            100 + object,
            DirectoryRequest::DeleteEverywhere {
                id: ObjectId::from_u64(object),
            },
        );
    }
    let stats = r.replication_stats();
    assert_eq!((stats.tombstones, stats.tombstones_dropped), (2, 1));
    // A lifetime never shorter than a target timeout and the heartbeat bound.
    let bound = ReplicationLimits::default().target_timeout + Duration::from_secs(3600);
    request(
        &mut r,
        t + (bound - Duration::from_millis(1)),
        1,
        200,
        DirectoryRequest::Withdraw {
            id: ObjectId::from_u64(9),
        },
    );
    assert_eq!(r.replication_stats().tombstones, 2);
    // Past it, the next delete finds them ended.
    publish_replicated(&mut r, t + bound, 0, 4, 10, 2);
    publish_replicated(&mut r, t + bound, 1, 4, 10, 2);
    request(
        &mut r,
        t + bound,
        0,
        300,
        DirectoryRequest::DeleteEverywhere {
            id: ObjectId::from_u64(4),
        },
    );
    let stats = r.replication_stats();
    assert_eq!((stats.tombstones, stats.tombstones_dropped), (1, 1));
}

/// Every holder of record cut off (its record lost: no holder is listed), then a delete: the
/// tombstone names the lost record's content, so the holder that returns with it is told to
/// delete it, and no copy is placed. Without the delete, its return makes a record again.
#[test]
fn a_delete_while_every_holder_of_record_is_away_still_stays_deleted() {
    let setup = || {
        let mut r = patient_registry();
        let t = at_ms(0);
        for node in 0..3 {
            join_in(&mut r, t, node, "");
        }
        // Node 0 holds the only copy of record (its target never fetched one).
        publish_replicated(&mut r, t, 0, 1, 10, 2);
        r.handle_disconnect(at_ms(1), ConnId(0));
        drain(&mut r);
        assert_eq!(r.copies_of_record(&ObjectId::from_u64(1)), None, "lost");
        assert_eq!(r.replication_stats().objects_lost, 1);
        r
    };
    let id = ObjectId::from_u64(1);

    let mut r = setup();
    request(
        &mut r,
        at_ms(2),
        1,
        99,
        DirectoryRequest::DeleteEverywhere { id },
    );
    assert_eq!(r.replication_stats().tombstones, 1);
    admit(&mut r, at_ms(4), 10, member(0, 1)).expect("rejoins");
    drain(&mut r);
    let out = republish(&mut r, at_ms(5), 10, 100);
    assert_eq!(events_for(&out, 10), vec![DirectoryEvent::Delete { id }]);
    assert!(replicate_targets(&out).is_empty(), "{out:?}");
    assert_eq!(r.copies_of_record(&id), None);
    r.check_invariants();

    let mut r = setup();
    admit(&mut r, at_ms(4), 10, member(0, 1)).expect("rejoins");
    drain(&mut r);
    let out = republish(&mut r, at_ms(5), 10, 100);
    assert!(!told_delete(&out, 10), "{out:?}");
    assert_eq!(replicate_targets(&out).len(), 1, "{out:?}");
    // A later delete ends this record as any other (the lost content was forgotten).
    request(
        &mut r,
        at_ms(6),
        1,
        101,
        DirectoryRequest::DeleteEverywhere { id },
    );
    assert_eq!(r.replication_stats().tombstones, 1);
    r.check_invariants();
}

/// A node's link to the registry breaks while the registry keeps its registration (the same
/// daemon comes back before its heartbeat bound; a directory shard's promoted replica knows
/// every member), and the node withdraws its copy meanwhile: the withdrawal is answered
/// `Unavailable` and never reaches the registry. Once the daemon is back on a new connection,
/// its session withdraws the copy again, so when the copies of record go the object is lost
/// (every holder gone), rather than repaired for ever from a node without a copy.
#[test]
fn a_withdrawal_the_registry_missed_is_made_again_when_the_same_daemon_reconnects() {
    let mut r = patient_registry();
    let t = at_ms(0);
    let (mut s, _) = joined_session(session_config(), &mut r, t);
    join_in(&mut r, t, 2, "rack-a");
    join_in(&mut r, t, 3, "rack-b");
    let x = ObjectId::from_u64(8);
    publish_replicated(&mut r, t, 2, 8, 100, 2);
    publish_replicated(&mut r, t, 3, 8, 100, 2);
    // Node 1 holds a plain copy (fetched, or recovered after a restart).
    s.handle_submit(
        t,
        DirectoryOpId(1),
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(100),
            digest: digest(100),
        },
    );
    exchange(&mut s, &mut r, 1, t);
    assert_eq!(r.holders_of(&x), vec![NodeId(1), NodeId(2), NodeId(3)]);

    // Node 1's link breaks; the registry does not notice. Node 1 drops its copy.
    let t1 = at_ms(1);
    s.handle_disconnected(t1, "connection reset");
    s.handle_submit(t1, DirectoryOpId(2), DirectoryRequest::Withdraw { id: x });
    let outputs: Vec<SessionOutput> = std::iter::from_fn(|| s.poll_output()).collect();
    assert!(
        outputs.iter().any(|o| matches!(
            o,
            SessionOutput::Notice(DirectoryNotice::Reply {
                reply: DirectoryReply::Unavailable { .. },
                ..
            })
        )),
        "{outputs:?}"
    );

    // The same daemon reconnects on connection 4: its registration moves over.
    let retry = s.poll_timeout().expect("a retry is scheduled");
    s.handle_timeout(retry);
    exchange(&mut s, &mut r, 4, retry);
    assert_eq!(r.connection_of(NodeId(1)), Some(ConnId(4)));
    assert_eq!(
        r.holders_of(&x),
        vec![NodeId(2), NodeId(3)],
        "the withdrawal is made again after the reconnect"
    );

    // Both copies of record go: nothing holds x, nothing is asked to copy it.
    let t2 = retry + Duration::from_millis(1);
    r.handle_disconnect(t2, ConnId(2));
    r.handle_disconnect(t2, ConnId(3));
    r.handle_timeout(t2);
    let out = drain(&mut r);
    assert!(
        replicate_targets(&out).is_empty(),
        "no repair from a node without a copy: {out:?}"
    );
    assert_eq!(r.copies_of_record(&x), None);
    assert_eq!(r.replication_stats().objects_lost, 1);
}
