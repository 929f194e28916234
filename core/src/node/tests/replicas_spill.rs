//! Copies of record on a node with a spill tier: spilled when memory is needed, never evicted,
//! still copies of record while on disk, restored on `get`, and deleted from disk too.

use super::*;
use crate::client_protocol::ReplicaPolicy;
use crate::store::StorageTier;

/// Objects of 400 KiB: two fit in the 1 MiB arena.
const LEN: u64 = 400 * 1024;

fn spilling_world() -> World {
    World::new(2, |config| {
        config.store.spill_limit_bytes = Some(64 << 20);
    })
}

/// Object `n` put on node 0 with two copies wanted (created, written, then sealed): the
/// seal's reply.
fn put_with_copies(w: &mut World, n: u64) -> Option<Response> {
    let data = World::bytes_of(n, LEN);
    let created = w.request(
        0,
        Request::Create {
            id: id(n),
            data_size: LEN,
            metadata_size: 0,
        },
    );
    let Some(Response::Created(Ok(info))) = created else {
        panic!("create of {n}: {created:?}");
    };
    let region = info.region;
    w.arenas[0][region.offset as usize..region.end() as usize].copy_from_slice(&data);
    w.request(
        0,
        Request::SealReplicated {
            id: id(n),
            release: true,
            digest: ContentDigest::of(&data, &[]),
            replicas: ReplicaPolicy {
                copies: 2,
                wait_ms: None,
            },
        },
    )
}

/// Objects 1 to 3 put on node 0 as copies of record: the third needed the first's memory, so
/// the first is spilled.
fn three_copies_of_record_the_first_spilled() -> World {
    let mut w = spilling_world();
    for n in 1..=3 {
        assert_eq!(
            put_with_copies(&mut w, n),
            Some(Response::Done(Ok(()))),
            "{n}"
        );
    }
    assert_eq!(w.nodes[0].store().tier(&id(1)), Some(StorageTier::Spilled));
    w
}

#[test]
fn a_node_full_of_copies_of_record_spills_them_and_still_takes_puts() {
    // The third put needs the memory of a copy of record: it is spilled, not evicted.
    let mut w = three_copies_of_record_the_first_spilled();
    let node = &w.nodes[0];
    assert_eq!(
        node.store().stats().evicted_objects_total,
        0,
        "nothing forgotten"
    );
    for n in 1..=3 {
        assert!(node.is_copy_of_record(&id(n)), "{n} is a copy of record");
        assert!(node.store().is_record(&id(n)), "{n} is held as one");
    }
    assert_eq!(node.metrics().copies_of_record, 3);
    node.check_invariants();
    // Restored on get with its bytes, and still a copy of record.
    let reply = w.request(
        0,
        Request::Get {
            ids: vec![id(1)],
            timeout_ms: None,
        },
    );
    let Some(Response::Got(results)) = reply else {
        panic!("no get reply: {reply:?}");
    };
    let info = results[0].clone().expect("restored");
    assert_eq!(w.local_bytes(0, &info), World::bytes_of(1, LEN));
    w.release(0, 1);
    assert!(w.nodes[0].store().is_record(&id(1)));
    // An evict request spills copies of record again, and forgets none.
    let _ = w.request(0, Request::Evict { bytes: 1 << 30 });
    assert_eq!(w.nodes[0].store().stats().evicted_objects_total, 0);
    for n in 1..=3 {
        assert!(w.nodes[0].store().contains(&id(n)), "{n} is present");
    }
    w.nodes[0].check_invariants();
}

#[test]
fn a_spilled_copy_of_record_is_deleted_by_a_client_and_when_deleted_everywhere() {
    let mut w = three_copies_of_record_the_first_spilled();
    w.delete(0, 1);
    assert!(!w.nodes[0].store().contains(&id(1)), "deleted from disk");
    assert!(!w.nodes[0].is_copy_of_record(&id(1)));
    // The registry deletes object 2 everywhere once it is spilled here.
    let _ = w.request(0, Request::Evict { bytes: 1 << 30 });
    assert_eq!(w.nodes[0].store().tier(&id(2)), Some(StorageTier::Spilled));
    let event = DirectoryEvent::Delete { id: id(2) };
    w.feed(0, NodeInput::DirectoryEvent { event });
    w.pump();
    assert!(!w.nodes[0].store().contains(&id(2)), "deleted from disk");
    assert!(!w.nodes[0].is_copy_of_record(&id(2)));
    assert!(w.nodes[0].is_copy_of_record(&id(3)));
    w.nodes[0].check_invariants();
}

#[test]
fn a_copy_of_record_lost_with_its_damaged_spill_record_is_no_longer_one() {
    let mut w = three_copies_of_record_the_first_spilled();
    for bytes in w.spill_disk[0].values_mut() {
        bytes[7] ^= 1;
    }
    let reply = w.request(
        0,
        Request::Get {
            ids: vec![id(1)],
            timeout_ms: None,
        },
    );
    assert_eq!(
        reply,
        Some(Response::Got(vec![Err(StoreError::ObjectNotFound(id(1)))]))
    );
    let node = &w.nodes[0];
    assert!(!node.store().contains(&id(1)), "lost");
    // Not counted as a copy of record any more (it would be published as one again when the
    // directory comes back), and withdrawn, so the registry repairs it elsewhere.
    assert!(!node.is_copy_of_record(&id(1)));
    assert_eq!(node.metrics().copies_of_record, 2);
    assert!(w
        .locations
        .get(&id(1))
        .is_none_or(|(_, holders, _)| !holders.contains(&NodeId(0))));
    w.nodes[0].check_invariants();
}
