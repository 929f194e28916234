//! Failures that may pass do not change the tier for good: a tier closed by a failed write
//! tries again after a number of evictions (doubled at each failed try), and a restore read
//! that failed with an IO error is tried again before its object is given up.

use super::test_support::{A as WRITER, LEN};
use super::*;
use crate::ids::{ClientId, RequestId};
use crate::store::StoreConfig;

/// The spill writes the store asked for since the last call (its other outputs dropped).
fn spill_writes(store: &mut Store) -> Vec<SpillOpId> {
    std::iter::from_fn(|| store.poll_output())
        .filter_map(|output| match output {
            StoreOutput::Spill { op, .. } => Some(op),
            _ => None,
        })
        .collect()
}

fn write_done(store: &mut Store, op: SpillOpId) {
    let place = SpillPlace {
        file: 0,
        offset: op.0,
    };
    store.handle_spill_done(op, Ok(place));
}

/// Puts `id`, completing every spill write asked for on the way (a create that waits for
/// writes in flight is tried again once they completed); returns how many it completed.
fn put_with_writes_done(store: &mut Store, id: ObjectId) -> u64 {
    let mut completed = 0;
    loop {
        let created = store.create(Instant(0), WRITER, id, LEN, 0);
        for op in spill_writes(store) {
            completed += 1;
            write_done(store, op);
        }
        if created.is_ok() {
            break;
        }
    }
    store.seal(WRITER, id, true).expect("the creator seals");
    completed
}

/// Puts objects one after the other into a full store whose spill writes all fail, until the
/// tier has closed `writes` times; returns the objects evicted between two closings.
fn evictions_between_failed_writes(store: &mut Store, next: &mut u64, writes: usize) -> Vec<u64> {
    let mut between = Vec::new();
    let mut evicted_at_last_write = store.spill_stats().evicted_spill_full_total;
    let mut fail_writes = |store: &mut Store, between: &mut Vec<u64>| {
        for op in spill_writes(store) {
            let stats = store.spill_stats();
            let (evicted, closed) = (stats.evicted_spill_full_total, stats.full);
            let error = SpillError::Io {
                reason: "EIO".into(),
            };
            store.handle_spill_done(op, Err(error));
            // Writes in flight together fail together: the first closes the tier.
            if !closed {
                between.push(evicted - evicted_at_last_write);
                evicted_at_last_write = evicted;
            }
        }
    };
    while between.len() < writes {
        *next += 1;
        let id = ObjectId::from_u64(*next);
        // A create that waits for spill writes in flight is tried again once they failed.
        while let Err(error) = store.create(Instant(0), WRITER, id, LEN, 0) {
            assert!(
                matches!(error, StoreError::OutOfMemory { .. }) && store.pending_free_bytes() > 0,
                "{error:?} with nothing being spilled"
            );
            fail_writes(store, &mut between);
        }
        store.seal(WRITER, id, true).expect("the creator seals");
        fail_writes(store, &mut between);
        assert!(*next < 100_000, "no spill write was tried in {next} puts");
    }
    between
}

#[test]
fn a_tier_closed_by_a_failed_write_tries_again_after_more_and_more_evictions() {
    let mut config = StoreConfig::single_arena(8 * LEN);
    config.spill_limit_bytes = Some(1 << 30);
    let mut store = Store::new(config);
    store.connect(WRITER);
    let mut next = 0;
    let between = evictions_between_failed_writes(&mut store, &mut next, 5);
    // The first write fails before any eviction; each try after it comes after twice as many.
    assert_eq!(
        between,
        [
            0,
            REOPEN_AFTER_EVICTIONS,
            2 * REOPEN_AFTER_EVICTIONS,
            4 * REOPEN_AFTER_EVICTIONS,
            8 * REOPEN_AFTER_EVICTIONS
        ]
    );
    assert_eq!(store.spill_stats().reopen_tries_total, 4);
    assert!(store.spill_stats().full);

    // The next try succeeds: the tier is open, and a later failure closes it for the first
    // count again.
    let mut succeeded = 0;
    while succeeded == 0 {
        next += 1;
        succeeded += put_with_writes_done(&mut store, ObjectId::from_u64(next));
    }
    assert!(!store.spill_stats().full);
    // The first write after fails at once (the tier was open); the try after it comes after
    // the first count, not the doubled one.
    let between = evictions_between_failed_writes(&mut store, &mut next, 2);
    assert_eq!(between, [0, REOPEN_AFTER_EVICTIONS]);
}

/// A store with objects 1..=12 put, the first ones spilled (their writes completed).
fn store_with_spilled_objects() -> Store {
    let mut config = StoreConfig::single_arena(4 * 1024);
    config.spill_limit_bytes = Some(1 << 30);
    let mut store = Store::new(config);
    store.connect(WRITER);
    for n in 1..=12 {
        put_with_writes_done(&mut store, ObjectId::from_u64(n));
    }
    assert!(store.is_spilled(&ObjectId::from_u64(1)));
    store
}

/// The store's outputs, its spill writes completed (successfully) as they come, and the
/// restores waiting for memory retried, as the node does after every input.
fn outputs_with_writes_done(store: &mut Store) -> Vec<StoreOutput> {
    let mut outputs = Vec::new();
    loop {
        store.retry_restores();
        let mut wrote = false;
        while let Some(output) = store.poll_output() {
            match output {
                StoreOutput::Spill { op, .. } => {
                    wrote = true;
                    write_done(store, op);
                }
                other => outputs.push(other),
            }
        }
        if !wrote {
            return outputs;
        }
    }
}

/// Gets object 1 (spilled) and fails its restore reads with `failures` in turn; returns the
/// store's outputs after the last.
fn get_with_failed_reads(failures: &[RestoreError]) -> (Store, Vec<StoreOutput>) {
    let mut store = store_with_spilled_objects();
    let reader = ClientId(2);
    store.connect(reader);
    let id = ObjectId::from_u64(1);
    store.get(Instant(0), reader, RequestId(1), vec![id], None);
    let mut outputs = outputs_with_writes_done(&mut store);
    for failure in failures {
        let op = outputs
            .iter()
            .find_map(|o| match o {
                StoreOutput::Restore { op, id: of, .. } if *of == id => Some(*op),
                _ => None,
            })
            .expect("a restore read of the object");
        store.handle_restore_done(op, Err(failure.clone()));
        store.check_invariants();
        outputs = outputs_with_writes_done(&mut store);
    }
    (store, outputs)
}

fn io_error() -> RestoreError {
    RestoreError::Io {
        reason: "EIO".into(),
    }
}

#[test]
fn a_restore_read_that_failed_with_an_io_error_is_tried_again() {
    let id = ObjectId::from_u64(1);
    let (mut store, outputs) = get_with_failed_reads(&[io_error(), io_error()]);
    let op = outputs
        .iter()
        .find_map(|o| match o {
            StoreOutput::Restore { op, id: of, .. } if *of == id => Some(*op),
            _ => None,
        })
        .expect("a third read after two IO errors");
    assert_eq!(store.spill_stats().restore_read_retries_total, 2);
    assert_eq!(store.spill_stats().objects_lost_total, 0);
    store.handle_restore_done(op, Ok(()));
    let outputs = outputs_with_writes_done(&mut store);
    assert!(
        outputs
            .iter()
            .any(|o| matches!(o, StoreOutput::Restored { id: of } if *of == id)),
        "{outputs:?}"
    );
}

#[test]
fn a_restore_whose_every_read_fails_or_whose_record_is_damaged_loses_its_object() {
    let id = ObjectId::from_u64(1);
    let lost = |outputs: &[StoreOutput]| {
        outputs
            .iter()
            .any(|o| matches!(o, StoreOutput::RestoreFailed { id: of } if *of == id))
    };
    let tries = RESTORE_READ_TRIES as usize;
    let (store, outputs) = get_with_failed_reads(&vec![io_error(); tries]);
    assert!(lost(&outputs), "{outputs:?}");
    assert_eq!(store.spill_stats().objects_lost_total, 1);
    // A damaged record is not read again.
    let (store, outputs) = get_with_failed_reads(&[RestoreError::Damaged]);
    assert!(lost(&outputs), "{outputs:?}");
    assert_eq!(store.spill_stats().restore_read_retries_total, 0);
}
