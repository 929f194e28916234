//! The spill tier through the node's interface: spill instead of evict, restore on `get` and on
//! a peer's fetch, memory freed only after the write, faults.

use super::*;
use crate::store::{RestoreError, SpillError, StorageTier};

/// Objects of 400 KiB: two fit in the 1 MiB arena.
const LEN: u64 = 400 * 1024;

fn spilling(limit_bytes: u64) -> impl Fn(&mut NodeConfig) {
    move |config: &mut NodeConfig| config.store.spill_limit_bytes = Some(limit_bytes)
}

fn get(w: &mut World, node: u32, ns: &[u64], timeout_ms: Option<u64>) -> Option<Response> {
    let ids = ns.iter().map(|&n| id(n)).collect();
    w.request(node, Request::Get { ids, timeout_ms })
}

/// The bytes of each object a `Got` reply names, or the error.
fn got(w: &World, node: u32, reply: Option<Response>) -> Vec<Result<Vec<u8>, StoreError>> {
    let Some(Response::Got(results)) = reply else {
        panic!("no get reply: {reply:?}");
    };
    results
        .iter()
        .map(|result| result.clone().map(|info| w.local_bytes(node, &info)))
        .collect()
}

fn tier(w: &World, node: u32, n: u64) -> Option<StorageTier> {
    w.nodes[node as usize].store().tier(&id(n))
}

/// Feeds the held spill and restore completions, replacing their results by `spill_result`
/// (for writes) when given.
fn complete_spill_io(w: &mut World, spill_result: Option<Result<(), SpillError>>) {
    while let Some((node, mut input)) = w.held_spill_io.pop_front() {
        if let (NodeInput::SpillDone { result, .. }, Some(Err(error))) = (&mut input, &spill_result)
        {
            *result = Err(error.clone());
        }
        w.feed(node.0, input);
        w.pump();
    }
}

#[test]
fn a_full_store_spills_instead_of_evicting_and_get_restores_the_bytes() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=6 {
        w.put(0, n, LEN);
    }
    let store = w.nodes[0].store();
    assert_eq!(store.stats().evicted_objects_total, 0, "nothing forgotten");
    assert_eq!(store.spill_stats().spilled_objects, 4);
    for n in 1..=6 {
        assert!(store.contains(&id(n)), "{n} is present");
    }
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    let listed: Vec<StorageTier> = store.list().iter().map(|s| s.tier).collect();
    assert_eq!(
        listed
            .iter()
            .filter(|t| **t == StorageTier::Spilled)
            .count(),
        4
    );
    // Every object comes back with its own bytes (each get spills another to make room).
    for n in 1..=6 {
        let reply = get(&mut w, 0, &[n], None);
        assert_eq!(
            got(&w, 0, reply),
            [Ok(World::bytes_of(n, LEN))],
            "object {n}"
        );
        w.release(0, n);
    }
    assert!(w.nodes[0].store().spill_stats().restores_total >= 4);
    assert_eq!(w.nodes[0].store().stats().evicted_objects_total, 0);
    w.assert_settled();
}

#[test]
fn memory_is_freed_only_once_the_spill_write_completed() {
    let mut w = World::new(1, spilling(64 << 20));
    w.manual_spill = true;
    w.put(0, 1, LEN);
    w.put(0, 2, LEN);
    // The third needs the space of the first, whose write is still out: the create waits.
    let created = w.request(
        0,
        Request::Create {
            id: id(3),
            data_size: LEN,
            metadata_size: 0,
        },
    );
    assert_eq!(created, None, "the create waits for the write");
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilling));
    assert!(
        w.nodes[0].store().sealed_info(&id(1)).is_some(),
        "still in memory"
    );
    // A get of the object being spilled is served from memory at once.
    let reply = get(&mut w, 0, &[1], None);
    assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(1, LEN))]);
    w.release(0, 1);
    complete_spill_io(&mut w, None);
    // The create that waited is answered now.
    let created = w.log.iter().any(|(_, o)| {
        matches!(o, NodeOutput::Reply {
            response: Response::Created(Ok(info)),
            ..
        } if info.id == id(3))
    });
    assert!(created, "the waiting create got its memory");
    assert!(w.nodes[0].store().contains(&id(1)));
    w.nodes[0].check_invariants();
}

#[test]
fn concurrent_gets_of_a_spilled_object_share_one_restore() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=3 {
        w.put(0, n, LEN);
    }
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    w.delete(0, 3); // room for the restore
    w.manual_spill = true;
    let ids = vec![id(1)];
    let first = w.hand_request(
        0,
        CLIENT,
        Request::Get {
            ids: ids.clone(),
            timeout_ms: None,
        },
    );
    let second = w.hand_request(
        0,
        CLIENT,
        Request::Get {
            ids,
            timeout_ms: None,
        },
    );
    w.pump();
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Restoring));
    let restores = |w: &World| w.count(0, |o| matches!(o, NodeOutput::Restore { .. }));
    assert_eq!(restores(&w), 1, "one restore for both gets");
    assert_eq!(w.reply_to(0, CLIENT, first), None, "a blocking get waits");
    complete_spill_io(&mut w, None);
    for request in [first, second] {
        let reply = w.reply_to(0, CLIENT, request);
        assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(1, LEN))]);
    }
    assert_eq!(restores(&w), 1);
    w.nodes[0].check_invariants();
}

#[test]
fn a_failed_spill_write_falls_back_to_evicting_and_loses_no_spilled_object() {
    let mut w = World::new(1, spilling(64 << 20));
    w.put(0, 1, LEN);
    w.put(0, 2, LEN);
    w.put(0, 3, LEN); // object 1 spilled
    w.manual_spill = true;
    w.hand_request(
        0,
        CLIENT,
        Request::Create {
            id: id(4),
            data_size: LEN,
            metadata_size: 0,
        },
    );
    w.pump();
    assert_eq!(tier(&w, 0, 2), Some(StorageTier::Spilling));
    // The disk is full: object 2 stays in memory, the tier stops taking writes, and the
    // waiting create evicts instead.
    complete_spill_io(&mut w, Some(Err(SpillError::NoSpace)));
    let store = w.nodes[0].store();
    let stats = store.spill_stats();
    assert_eq!(stats.spill_no_space_total, 1);
    assert!(stats.full);
    assert_eq!(
        store.stats().evicted_objects_total,
        1,
        "one object forgotten"
    );
    assert_eq!(stats.evicted_spill_full_total, 1);
    assert_eq!(
        [2, 3].iter().filter(|&&n| store.contains(&id(n))).count(),
        1,
        "one of 2 and 3 was evicted"
    );
    assert!(
        store.unsealed_sizes(&id(4)).is_some(),
        "the create got its memory"
    );
    // The object spilled before the failure is still there, with its bytes.
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    w.manual_spill = false;
    w.request(0, Request::Abort { id: id(4) });
    let reply = get(&mut w, 0, &[1], None);
    assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(1, LEN))]);
    w.nodes[0].check_invariants();
}

#[test]
fn a_damaged_record_reports_the_object_lost_not_other_bytes() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=3 {
        w.put(0, n, LEN);
    }
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    for bytes in w.spill_disk[0].values_mut() {
        bytes[7] ^= 1;
    }
    let reply = get(&mut w, 0, &[1], None);
    assert_eq!(got(&w, 0, reply), [Err(StoreError::ObjectNotFound(id(1)))]);
    let store = w.nodes[0].store();
    assert!(!store.contains(&id(1)), "lost");
    assert_eq!(store.spill_stats().objects_lost_total, 1);
    // Withdrawn from the directory like a delete.
    assert!(w
        .locations
        .get(&id(1))
        .is_none_or(|(_, holders, _)| holders.is_empty()));
    w.nodes[0].check_invariants();
}

#[test]
fn a_missing_record_is_lost_too_and_the_node_goes_on() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=3 {
        w.put(0, n, LEN);
    }
    w.spill_disk[0].clear();
    w.delete(0, 3); // room for the restore
    w.manual_spill = true;
    let request = w.hand_request(
        0,
        CLIENT,
        Request::Get {
            ids: vec![id(1)],
            timeout_ms: None,
        },
    );
    w.pump();
    let (node, input) = w.held_spill_io.pop_front().expect("a restore");
    assert!(matches!(
        input,
        NodeInput::RestoreDone {
            result: Err(RestoreError::Missing),
            ..
        }
    ));
    w.feed(node.0, input);
    w.pump();
    let reply = w.reply_to(0, CLIENT, request);
    assert_eq!(got(&w, 0, reply), [Err(StoreError::ObjectNotFound(id(1)))]);
    w.manual_spill = false;
    let reply = get(&mut w, 0, &[2], None);
    assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(2, LEN))]);
}

#[test]
fn a_peer_fetching_a_spilled_object_gets_its_bytes_after_a_restore_on_the_holder() {
    let mut w = World::new(2, spilling(64 << 20));
    for n in 1..=3 {
        w.put(0, n, LEN);
    }
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    w.fetch(1, &[1], Duration::from_secs(1));
    let replies = w.replies(1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, LEN));
    assert_eq!(w.nodes[0].store().spill_stats().restores_total, 1);
    w.nodes[0].check_invariants();
}

#[test]
fn beyond_the_spill_limit_objects_are_evicted() {
    // Room on disk for one object only.
    let mut w = World::new(1, spilling(LEN + 1));
    for n in 1..=4 {
        w.put(0, n, LEN);
    }
    let store = w.nodes[0].store();
    assert_eq!(store.spill_stats().spilled_objects, 1);
    assert_eq!(store.stats().evicted_objects_total, 1);
    assert_eq!(store.spill_stats().evicted_spill_full_total, 1);
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    assert!(
        !store.contains(&id(2)),
        "the second went when the tier was full"
    );
    // Deleting the spilled object gives its space back: the next spills again.
    w.delete(0, 1);
    assert!(w.spill_disk[0].is_empty(), "its record is discarded");
    w.put(0, 5, LEN);
    assert_eq!(tier(&w, 0, 3), Some(StorageTier::Spilled));
    w.nodes[0].check_invariants();
}

#[test]
fn a_poll_of_a_spilled_object_starts_its_restore_and_keeps_its_deadline() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=3 {
        w.put(0, n, LEN);
    }
    w.delete(0, 3); // room for the restore
    w.manual_spill = true;
    let reply = get(&mut w, 0, &[1], Some(0));
    assert_eq!(got(&w, 0, reply), [Err(StoreError::Timeout(id(1)))]);
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Restoring));
    complete_spill_io(&mut w, None);
    w.manual_spill = false;
    let reply = get(&mut w, 0, &[1], Some(0));
    assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(1, LEN))]);
}

/// Records written for object `n`: its `Spill` outputs' distinct ops (a spill of a clean
/// record names the record it has).
fn spill_writes_of(w: &World, n: u64) -> usize {
    let ops: std::collections::BTreeSet<_> = w
        .log
        .iter()
        .filter_map(|(_, o)| match o {
            NodeOutput::Spill { op, object, .. } if *object == id(n) => Some(*op),
            _ => None,
        })
        .collect();
    ops.len()
}

#[test]
fn a_restored_object_goes_back_to_disk_without_a_second_write() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=6 {
        w.put(0, n, LEN);
    }
    let reply = get(&mut w, 0, &[1], None);
    assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(1, LEN))]);
    w.release(0, 1);
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Memory));
    assert_eq!(w.nodes[0].store().spill_stats().clean_records, 1);
    // Memory is needed again: 1 goes back to its record, without a write.
    for n in 7..=9 {
        w.put(0, n, LEN);
    }
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    assert_eq!(spill_writes_of(&w, 1), 1, "one write of object 1");
    let stats = w.nodes[0].store().spill_stats();
    assert!(stats.reclaimed_clean_total >= 1, "{stats:?}");
    let reply = get(&mut w, 0, &[1], None);
    assert_eq!(got(&w, 0, reply), [Ok(World::bytes_of(1, LEN))]);
    w.release(0, 1);
    // A delete of an object in memory discards its clean record too.
    assert!(w.nodes[0].store().spill_stats().clean_records >= 1);
    w.request(0, Request::Delete { ids: vec![id(1)] });
    let discarded = w
        .log
        .iter()
        .any(|(_, o)| matches!(o, NodeOutput::DiscardSpilled { object, .. } if *object == id(1)));
    assert!(discarded, "the record of a deleted object is discarded");
    assert_eq!(tier(&w, 0, 1), None);
    assert_eq!(w.nodes[0].store().stats().evicted_objects_total, 0);
    w.nodes[0].check_invariants();
}

#[test]
fn spill_writes_start_ahead_of_demand_and_never_evict() {
    const SMALL: u64 = 100 * 1024;
    for (limit, spills) in [(64 << 20, true), (50 * 1024, false)] {
        let mut w = World::new(1, spilling(limit));
        w.manual_spill = true;
        for n in 1..=8 {
            w.put(0, n, SMALL);
        }
        assert_eq!(
            tier(&w, 0, 1),
            Some(StorageTier::Memory),
            "free above the mark"
        );
        // The ninth leaves less than an eighth of the memory free: the oldest goes out now,
        // before any create needs its memory.
        w.put(0, 9, SMALL);
        let expected = if spills {
            StorageTier::Spilling
        } else {
            StorageTier::Memory
        };
        assert_eq!(tier(&w, 0, 1), Some(expected), "limit {limit}");
        assert_eq!(w.nodes[0].store().stats().evicted_objects_total, 0);
        complete_spill_io(&mut w, None);
        let expected = if spills {
            StorageTier::Spilled
        } else {
            StorageTier::Memory
        };
        assert_eq!(tier(&w, 0, 1), Some(expected), "limit {limit}");
        w.nodes[0].check_invariants();
    }
}

#[test]
fn a_batch_get_keeps_its_objects_in_memory_while_it_waits_for_restores() {
    let mut w = World::new(1, spilling(64 << 20));
    for n in 1..=4 {
        w.put(0, n, LEN);
    }
    assert_eq!(tier(&w, 0, 3), Some(StorageTier::Memory));
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    // 3 is here, 1 must be restored, which needs the memory of 3 or 4: the get holds 3, so 4
    // goes, and the get answers both (not Timeout for a 3 pushed back to disk meanwhile).
    w.manual_spill = true;
    let reply = get(&mut w, 0, &[3, 1], None);
    assert_eq!(reply, None, "waits for the restore");
    while !w.held_spill_io.is_empty() {
        complete_spill_io(&mut w, None);
    }
    let reply = w.log.iter().rev().find_map(|(_, o)| match o {
        NodeOutput::Reply {
            response: response @ Response::Got(_),
            ..
        } => Some(response.clone()),
        _ => None,
    });
    assert_eq!(
        got(&w, 0, reply),
        [Ok(World::bytes_of(3, LEN)), Ok(World::bytes_of(1, LEN))]
    );
    assert_eq!(tier(&w, 0, 4), Some(StorageTier::Spilled));
    w.release(0, 3);
    w.release(0, 1);
    w.nodes[0].check_invariants();
}

/// Two nodes: object 1 spilled on node 0 with room to restore it, restores held for the test,
/// leases as long as the default (a restore can outlast the tests' 10 ms lease).
fn spilled_on_a_holder(tweak: impl Fn(&mut NodeConfig)) -> World {
    let mut w = World::new(2, |config| {
        spilling(64 << 20)(config);
        config.lease = Duration::from_secs(10);
        tweak(config);
    });
    for n in 1..=3 {
        w.put(0, n, LEN);
    }
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Spilled));
    w.delete(0, 3); // room for the restore
    w.manual_spill = true;
    w
}

fn restoring_notices(w: &World, node: u32) -> usize {
    w.count(node, |o| {
        matches!(
            o,
            NodeOutput::Send {
                message: PeerMessage::Restoring { .. },
                ..
            }
        )
    })
}

#[test]
fn a_restore_slower_than_the_reply_timeout_still_serves_the_fetch() {
    let mut w = spilled_on_a_holder(|_| {});
    let reply_timeout = w.nodes[1].config().reply_timeout;
    w.hand_fetch(1, &[1], Duration::from_secs(120), TransferMode::Auto);
    w.pump();
    assert_eq!(tier(&w, 0, 1), Some(StorageTier::Restoring));
    // The disk read takes four reply timeouts: the holder keeps saying it is restoring.
    let step = Duration::from_millis(500);
    while w.now < Instant::ZERO + reply_timeout * 4 {
        w.advance(step);
    }
    assert!(w.replies(1).is_empty(), "still waiting");
    assert_eq!(w.nodes[1].stats().transfers_failed, 0, "nobody gave up");
    assert!(
        restoring_notices(&w, 0) >= 8,
        "a notice every half reply timeout"
    );
    complete_spill_io(&mut w, None);
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, LEN));
    assert_eq!(w.nodes[1].stats().transfers_failed, 0);
    assert_eq!(
        w.count(1, |o| matches!(
            o,
            NodeOutput::Send {
                message: PeerMessage::FetchRequest { .. },
                ..
            }
        )),
        1,
        "one request, answered"
    );
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn a_holder_restoring_past_the_requesters_bound_is_given_up_on() {
    let limit = Duration::from_secs(12);
    let mut w = spilled_on_a_holder(|config| {
        config.restore_wait_limit = limit;
        config.max_source_rounds = 1;
    });
    w.hand_fetch(1, &[1], Duration::from_secs(120), TransferMode::Auto);
    w.pump();
    let step = Duration::from_millis(500);
    while w.now + step < Instant::ZERO + limit {
        w.advance(step);
    }
    assert!(
        w.replies(1).is_empty(),
        "within the bound the requester waits"
    );
    while w.now < Instant::ZERO + limit + step {
        w.advance(step);
    }
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1, "given up on once past the bound");
    let Err(FetchError::SourcesFailed { last_error, .. }) = &replies[0][0] else {
        panic!("{:?}", replies[0][0]);
    };
    let SourceFailure::Holder {
        failure: TransferFailure::RestoreTooSlow { waited_ms },
        ..
    } = **last_error
    else {
        panic!("{last_error:?}");
    };
    assert!(waited_ms >= limit.as_millis() as u64, "{waited_ms}");
    // The restore completes late: the holder's answer to the abandoned transfer is released.
    complete_spill_io(&mut w, None);
    w.assert_settled();
}

#[test]
fn a_hinted_fetch_waits_for_a_slow_restore_on_the_hinted_node() {
    let mut w = spilled_on_a_holder(|_| {});
    let reply_timeout = w.nodes[1].config().reply_timeout;
    let body = Request::FetchFrom {
        ids: vec![id(1)],
        timeout_ms: Some(120_000),
        mode: TransferMode::Auto,
        wait_for_publication: false,
        hint: NodeId(0),
    };
    w.hand_request(1, CLIENT, body);
    w.pump();
    let step = Duration::from_millis(500);
    while w.now < Instant::ZERO + reply_timeout * 3 {
        w.advance(step);
    }
    complete_spill_io(&mut w, None);
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, LEN));
    let stats = w.nodes[1].stats();
    assert_eq!((stats.hinted_fetches, stats.wrong_hints), (1, 0));
    assert_eq!(w.lookups(1), 0, "the hinted node served it");
    w.release(1, 1);
    w.assert_settled();
}
