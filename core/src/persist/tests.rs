use std::convert::Infallible;

use super::*;
use crate::{ArenaId, DurableChange, LocalRegion, ObjectId};

const ARENA_BYTES: u64 = 1 << 20;

fn sealed(n: u64, offset: u64, data_size: u64) -> DurableChange {
    DurableChange::Sealed {
        id: ObjectId::from_u64(n),
        block: LocalRegion {
            arena: ArenaId(0),
            offset,
            len: crate::alloc::block_len_for(data_size).unwrap(),
        },
        data_size,
        metadata_size: 0,
    }
}

fn formatted() -> MemoryStorage {
    let mut storage = MemoryStorage::new();
    let Ok(()) = SlotIndex::format(&mut storage, ARENA_BYTES);
    storage
}

fn open(storage: MemoryStorage) -> (SlotIndex<MemoryStorage>, ScanReport) {
    SlotIndex::open(storage).unwrap()
}

/// Opens, accepts every record, and returns the ids found, sorted, and the scan.
fn recover(storage: MemoryStorage) -> (SlotIndex<MemoryStorage>, Vec<u64>, ScanReport) {
    let (mut index, scan) = open(storage);
    let mut ids: Vec<u64> = index.found_records().map(|o| id_number(o.id)).collect();
    let Ok(_) = index.finish_recovery([]);
    ids.sort_unstable();
    (index, ids, scan)
}

fn id_number(id: ObjectId) -> u64 {
    u64::from_be_bytes(id.0[id.0.len() - 8..].try_into().expect("eight bytes"))
}

fn ok<T>(result: Result<T, Infallible>) -> T {
    let Ok(value) = result;
    value
}

#[test]
fn committed_records_survive_a_crash_and_removed_ones_stay_gone() {
    let (mut index, ids, scan) = recover(formatted());
    assert!(ids.is_empty());
    assert_eq!(scan.slots, INITIAL_SLOTS);
    index.stage(sealed(1, 0, 100));
    index.stage(sealed(2, 4096, 100));
    assert_eq!(ok(index.commit()).seals, 2);
    index.stage(DurableChange::Removed {
        id: ObjectId::from_u64(1),
    });
    assert_eq!(ok(index.commit()).removals, 1);
    let mut storage = index.into_storage();
    storage.crash(|_, _| unreachable!("everything was synced"));
    let (_, ids, scan) = recover(storage);
    assert_eq!(ids, [2]);
    assert_eq!(scan.corrupt_slots, 0);
}

#[test]
fn unsynced_records_are_lost_or_whole_never_half() {
    let (mut index, _, _) = recover(formatted());
    index.stage(sealed(1, 0, 100));
    ok(index.commit());
    index.stage(sealed(2, 4096, 100));
    index.stage(sealed(3, 8192, 100));
    index.stage(DurableChange::Removed {
        id: ObjectId::from_u64(1),
    });
    ok(index.write_staged());
    let writes: Vec<(u64, usize)> = index.storage().unsynced_writes().collect();
    assert_eq!(writes.len(), 3, "one removal and two seals, each one slot");
    let mut storage = index.into_storage();
    // The removal is lost, seal 2 lands torn, seal 3 lands whole.
    let mut fates = [
        WriteFate::Lost,
        WriteFate::Torn { landed_bytes: 20 },
        WriteFate::Landed,
    ]
    .into_iter();
    storage.crash(|_, _| fates.next().unwrap());
    let (_, ids, scan) = recover(storage);
    assert_eq!(ids, [1, 3], "the torn record of 2 is discarded");
    assert_eq!(scan.corrupt_slots, 1);
}

#[test]
fn a_torn_record_is_discarded_and_its_slot_cleared_and_reused() {
    // Past byte 49 the record of a 100-byte object without metadata is zero, as the empty
    // slot was: such a cut changes nothing.
    for landed_bytes in 1..49 {
        let (mut index, _, _) = recover(formatted());
        index.stage(sealed(7, 0, 100));
        ok(index.write_staged());
        let mut storage = index.into_storage();
        storage.crash(|_, _| WriteFate::Torn { landed_bytes });
        let (mut index, ids, scan) = recover(storage);
        assert!(ids.is_empty(), "a record torn after {landed_bytes} bytes");
        assert_eq!(scan.corrupt_slots, 1);
        // Cleared at recovery: a second scan finds nothing corrupt, and the slot is free.
        index.stage(sealed(8, 0, 100));
        ok(index.commit());
        let (_, ids, scan) = recover(index.into_storage());
        assert_eq!((ids, scan.corrupt_slots), (vec![8], 0));
    }
}

#[test]
fn a_zeroed_slot_is_not_reused_before_the_sync() {
    let (mut index, _, _) = recover(formatted());
    index.stage(sealed(1, 0, 100));
    ok(index.commit());
    index.stage(DurableChange::Removed {
        id: ObjectId::from_u64(1),
    });
    index.stage(sealed(2, 0, 100));
    ok(index.write_staged());
    let slots: Vec<u64> = index
        .storage()
        .unsynced_writes()
        .map(|(offset, _)| offset)
        .collect();
    assert_eq!(slots.len(), 2);
    assert_ne!(
        slots[0], slots[1],
        "a lost removal must not let a new record land in its slot"
    );
}

#[test]
fn the_index_grows_and_sequence_numbers_only_grow() {
    let (mut index, _, _) = recover(formatted());
    for n in 0..INITIAL_SLOTS + 5 {
        index.stage(sealed(n % 1000, n * 64, 1));
        if n % 1000 == 999 {
            ok(index.commit());
            for m in n - 999..=n {
                index.stage(DurableChange::Removed {
                    id: ObjectId::from_u64(m % 1000),
                });
            }
        }
    }
    ok(index.commit());
    let (index, ids, scan) = recover(index.into_storage());
    assert_eq!(scan.slots, 2 * INITIAL_SLOTS);
    assert_eq!(ids.len(), 29, "1029 seals, the first 1000 removed");
    let (reopened, _) = open(index.into_storage());
    let seqs: Vec<u64> = reopened.found().map(|f| f.record.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seqs:?}"
    );
}

#[test]
fn a_foreign_or_short_header_is_refused() {
    assert!(matches!(
        SlotIndex::open(MemoryStorage::new()),
        Err(OpenError::Header(HeaderError::BadMagic))
    ));
    let mut storage = formatted();
    ok(storage.write_at(20, &[0xff]));
    assert!(matches!(
        SlotIndex::open(storage),
        Err(OpenError::Header(HeaderError::Checksum))
    ));
}
