//! The spill tier of a persistent store: what it records, when it frees memory, and what a
//! restart gets back.

use super::test_support::{id, put, spilling_store, LEN};
use super::*;
use crate::store::{RecoveredSpilled, RecoveryRefusal};

fn persistent_spilling_store(spill: Option<u64>) -> Store {
    spilling_store(spill, true)
}

fn changes(store: &mut Store) -> Vec<DurableChange> {
    std::iter::from_fn(|| store.poll_durable_change()).collect()
}

fn outputs(store: &mut Store) -> Vec<StoreOutput> {
    std::iter::from_fn(|| store.poll_output()).collect()
}

fn spill_ops(outputs: &[StoreOutput]) -> Vec<(SpillOpId, ObjectId)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            StoreOutput::Spill { op, id, .. } => Some((*op, *id)),
            _ => None,
        })
        .collect()
}

fn place(n: u64) -> SpillPlace {
    SpillPlace {
        file: 7,
        offset: n * 4096,
    }
}

/// The move to disk replaces the object's record, and its memory is free only once that is
/// durable: a crash before finds the object in memory (its block untouched), after it finds it
/// in the spill file.
#[test]
fn a_spilled_object_is_recorded_at_its_place_and_its_memory_freed_once_that_is_durable() {
    let mut store = persistent_spilling_store(Some(1 << 20));
    put(&mut store, 1);
    let _ = changes(&mut store);
    store.handle_durable(store.durable_changes_queued());
    store.evict(1);
    let spills = spill_ops(&outputs(&mut store));
    assert_eq!(spills.len(), 1);
    let (op, spilled) = spills[0];
    assert_eq!(spilled, id(1));
    let free_before = store.allocator.free_bytes();
    store.handle_spill_done(op, Ok(place(1)));
    assert_eq!(
        changes(&mut store),
        vec![DurableChange::Spilled {
            id: id(1),
            place: place(1),
            data_size: LEN,
            metadata_size: 0,
        }]
    );
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Spilled));
    assert_eq!(
        store.allocator.free_bytes(),
        free_before,
        "the block waits for the record"
    );
    assert!(store.quarantined_bytes() > 0);
    store.check_invariants();
    store.handle_durable(store.durable_changes_queued());
    assert_eq!(store.quarantined_bytes(), 0);
    assert!(store.allocator.free_bytes() > free_before);
    store.check_invariants();
}

/// A restored object gets an in-memory record again; a delete of a spilled one removes its
/// record; and a spill record is discarded only once no durable record names it.
#[test]
fn restores_and_deletes_are_recorded_and_discards_wait_for_them() {
    let mut store = persistent_spilling_store(Some(1 << 20));
    put(&mut store, 1);
    put(&mut store, 2);
    store.evict(u64::MAX);
    for (op, object) in spill_ops(&outputs(&mut store)) {
        store.handle_spill_done(op, Ok(place(object.as_bytes()[19] as u64)));
    }
    let _ = changes(&mut store);
    store.handle_durable(store.durable_changes_queued());
    store.request_restore(id(1));
    let restore = outputs(&mut store)
        .into_iter()
        .find_map(|o| match o {
            StoreOutput::Restore { op, .. } => Some(op),
            _ => None,
        })
        .expect("a restore read");
    store.handle_restore_done(restore, Ok(()));
    let recorded = changes(&mut store);
    assert!(
        matches!(recorded[..], [DurableChange::Sealed { id: sealed, .. }] if sealed == id(1)),
        "{recorded:?}"
    );
    // Deleting the restored object before its in-memory record is durable: the spill record
    // the index still names stays until the removal is durable.
    let _ = store.delete(&[id(1)]);
    assert_eq!(
        changes(&mut store),
        vec![DurableChange::Removed { id: id(1) }]
    );
    let discarded = |outputs: &[StoreOutput]| {
        outputs
            .iter()
            .filter(|o| matches!(o, StoreOutput::DiscardSpilled { .. }))
            .count()
    };
    assert_eq!(discarded(&outputs(&mut store)), 0, "held until durable");
    store.handle_durable(store.durable_changes_queued());
    assert_eq!(discarded(&outputs(&mut store)), 1);
    // A spilled object's delete removes its record.
    let _ = store.delete(&[id(2)]);
    assert_eq!(
        changes(&mut store),
        vec![DurableChange::Removed { id: id(2) }]
    );
    assert_eq!(discarded(&outputs(&mut store)), 0);
    store.handle_durable(store.durable_changes_queued());
    assert_eq!(discarded(&outputs(&mut store)), 1);
    store.check_invariants();
}

/// A restart's spilled records are back in the tier: present, listed as spilled, restored
/// on demand under a new op; records the tier cannot take are refused with a reason.
#[test]
fn recovered_spilled_objects_are_present_and_restore_under_their_new_op() {
    let record = |n: u64| RecoveredSpilled {
        id: id(n),
        place: place(n),
        data_size: LEN,
        metadata_size: 3,
    };
    let digest = Some(ContentDigest(42));
    let mut store = persistent_spilling_store(Some(2500));
    let report = store.recover_spilled(
        Instant(5),
        [
            (record(1), digest),
            (record(1), digest),
            (record(2), digest),
            (record(3), digest),
        ],
    );
    let refused: Vec<(usize, RecoveryRefusal)> =
        report.refused.iter().map(|r| (r.index, r.reason)).collect();
    assert_eq!(
        refused,
        vec![
            (1, RecoveryRefusal::DuplicateId),
            (3, RecoveryRefusal::SpillLimit)
        ]
    );
    assert_eq!(report.recovered_objects, 2);
    assert_eq!(report.adopted.len(), 2);
    assert!(store.contains(&id(1)) && store.contains(&id(2)));
    assert_eq!(store.tier(&id(2)), Some(StorageTier::Spilled));
    assert_eq!(store.digest(&id(2)), digest);
    let listed: Vec<StorageTier> = store.list().iter().map(|s| s.tier).collect();
    assert_eq!(listed, vec![StorageTier::Spilled; 2]);
    assert!(changes(&mut store).is_empty(), "recovered, not re-recorded");
    let announced = outputs(&mut store)
        .into_iter()
        .filter(|o| matches!(o, StoreOutput::Local(ObjectEvent::Sealed { .. })))
        .count();
    assert_eq!(announced, 2);
    let (op, _) = report.adopted[1];
    store.request_restore(id(2));
    let restore = outputs(&mut store).into_iter().find_map(|o| match o {
        StoreOutput::Restore { op, id, digest, .. } => Some((op, id, digest)),
        _ => None,
    });
    assert_eq!(restore, Some((op, id(2), digest)));
    store.check_invariants();

    let mut without_tier = persistent_spilling_store(None);
    let report = without_tier.recover_spilled(Instant(0), [(record(1), None)]);
    assert_eq!(report.refused[0].reason, RecoveryRefusal::NoSpillTier);
    assert!(!without_tier.contains(&id(1)));
}

/// An object being restored is still a sealed object with its sizes and digest (what a node
/// publishes again when the directory comes back), not an unsealed one.
#[test]
fn an_object_being_restored_keeps_its_sizes_and_digest() {
    let mut store = persistent_spilling_store(Some(1 << 20));
    put(&mut store, 1);
    let sealed = store.sealed_sizes_and_digest(&id(1));
    assert!(sealed.is_some());
    store.evict(u64::MAX);
    for (op, object) in spill_ops(&outputs(&mut store)) {
        store.handle_spill_done(op, Ok(place(object.as_bytes()[19] as u64)));
    }
    let _ = changes(&mut store);
    store.handle_durable(store.durable_changes_queued());
    assert_eq!(store.sealed_sizes_and_digest(&id(1)), sealed, "spilled");
    store.request_restore(id(1));
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Restoring));
    assert_eq!(
        store.sealed_sizes_and_digest(&id(1)),
        sealed,
        "being restored"
    );
    store.check_invariants();
}
