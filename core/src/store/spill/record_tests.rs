//! Copies of record and the spill tier: never evicted, spilled when memory is needed (before
//! cache copies), still copies of record while spilled and once restored.

use super::test_support::{id, put, spilling_store, A, LEN};
use super::*;
use crate::store::EvictOutcome;

fn store(spill: Option<u64>) -> Store {
    spilling_store(spill, false)
}

fn put_record(store: &mut Store, n: u64) {
    put(store, n);
    store.hold_as_record(id(n)).unwrap();
}

/// Carries out the store's spill writes and restores (successfully); returns the ids written.
fn complete_io(store: &mut Store) -> Vec<ObjectId> {
    let mut written = Vec::new();
    while let Some(output) = store.poll_output() {
        match output {
            StoreOutput::Spill { op, id, .. } => {
                written.push(id);
                store.handle_spill_done(op, Ok(SpillPlace::default()));
            }
            StoreOutput::Restore { op, .. } => store.handle_restore_done(op, Ok(())),
            _ => {}
        }
    }
    written
}

#[test]
fn without_a_spill_tier_a_copy_of_record_is_never_evicted() {
    let mut store = store(None);
    for n in 1..=3 {
        put_record(&mut store, n);
    }
    put(&mut store, 4);
    assert_eq!(
        store.evict(1 << 20),
        EvictOutcome {
            objects: 1,
            bytes: 1024
        },
        "only the cache copy goes"
    );
    put_record(&mut store, 5);
    assert!(!store.could_hold(LEN), "memory is all copies of record");
    assert!(matches!(
        store.create(Instant(0), A, id(6), LEN, 0),
        Err(StoreError::OutOfMemory { .. })
    ));
    for n in [1, 2, 3, 5] {
        assert!(store.contains(&id(n)) && store.is_record(&id(n)), "{n}");
    }
    store.check_invariants();
}

#[test]
fn a_store_full_of_copies_of_record_spills_one_for_a_new_object() {
    let mut store = store(Some(1 << 20));
    for n in 1..=4 {
        put_record(&mut store, n);
    }
    let _ = complete_io(&mut store);
    assert!(
        store.could_hold(LEN),
        "copies of record the tier can take are reclaimable"
    );
    // The oldest copy of record is written out; its memory is free once the write completes.
    let spilled = loop {
        if store.create(Instant(0), A, id(5), LEN, 0).is_ok() {
            break store.spill_stats().spilled_objects;
        }
        assert!(
            !complete_io(&mut store).is_empty(),
            "a spill write frees memory"
        );
    };
    assert!(spilled >= 1);
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Spilled));
    assert_eq!(store.stats().evicted_objects_total, 0, "nothing forgotten");
    for n in 1..=4 {
        assert!(store.contains(&id(n)), "{n} is present");
        assert!(store.is_record(&id(n)), "{n} is still a copy of record");
    }
    store.check_invariants();
}

#[test]
fn a_spilled_copy_of_record_is_restored_as_one_and_never_evicted() {
    let mut store = store(Some(1 << 20));
    put_record(&mut store, 1);
    let _ = store.evict(1 << 20);
    assert_eq!(complete_io(&mut store), [id(1)]);
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Spilled));
    assert!(store.is_record(&id(1)));
    store.request_restore(id(1));
    let _ = complete_io(&mut store);
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Memory));
    assert!(store.is_record(&id(1)), "restored as a copy of record");
    assert!(store.get_now(A, id(1)).is_ok());
    store.release(A, id(1)).unwrap();
    // Memory needed again: back to its clean record, not evicted.
    let _ = store.evict(1 << 20);
    let _ = complete_io(&mut store);
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Spilled));
    assert_eq!(store.stats().evicted_objects_total, 0);
    // Released while spilled, it is an ordinary spilled object; a delete takes it.
    store.release_record(id(1));
    assert!(!store.is_record(&id(1)));
    assert_eq!(store.delete(&[id(1)]), [Ok(())]);
    assert!(!store.contains(&id(1)));
    store.check_invariants();
}

#[test]
fn copies_of_record_are_spilled_before_cache_copies() {
    let mut store = store(Some(1 << 20));
    put(&mut store, 1);
    put_record(&mut store, 2);
    let _ = store.evict(1);
    assert_eq!(
        complete_io(&mut store),
        [id(2)],
        "the copy of record goes first"
    );
    assert_eq!(store.tier(&id(1)), Some(StorageTier::Memory));
    store.check_invariants();
}

#[test]
fn when_the_tier_is_full_cache_copies_are_evicted_and_copies_of_record_stay() {
    // Room on disk for one object.
    let mut store = store(Some(LEN));
    put_record(&mut store, 1);
    put_record(&mut store, 2);
    put(&mut store, 3);
    let _ = store.evict(1 << 20);
    let written = complete_io(&mut store);
    assert_eq!(written, [id(1)]);
    assert!(!store.contains(&id(3)), "the cache copy was evicted");
    assert_eq!(
        store.tier(&id(2)),
        Some(StorageTier::Memory),
        "kept in memory"
    );
    assert!(store.is_record(&id(1)) && store.is_record(&id(2)));
    assert_eq!(store.spillable_record_bytes(), 0, "the tier takes no more");
    store.check_invariants();
}
