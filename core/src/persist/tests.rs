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

/// A medium on a file system that may be full: growing fails while `full`.
struct FillableStorage {
    inner: MemoryStorage,
    full: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("no space left on the medium")]
struct NoSpace;

impl Storage for FillableStorage {
    type Error = NoSpace;

    fn len_bytes(&mut self) -> Result<u64, NoSpace> {
        Ok(ok(self.inner.len_bytes()))
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), NoSpace> {
        ok(self.inner.read_at(offset, buf));
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), NoSpace> {
        ok(self.inner.write_at(offset, bytes));
        Ok(())
    }

    fn set_len(&mut self, len_bytes: u64) -> Result<(), NoSpace> {
        if self.full && len_bytes > ok(self.inner.len_bytes()) {
            return Err(NoSpace);
        }
        ok(self.inner.set_len(len_bytes));
        Ok(())
    }

    fn sync(&mut self) -> Result<(), NoSpace> {
        ok(self.inner.sync());
        Ok(())
    }
}

/// A commit that needs the index to grow on a full medium fails with nothing written and
/// nothing staged dropped, so the same commit succeeds once there is room: every object is
/// recorded, none twice (a full disk must be waited out, not lose seals).
#[test]
fn a_commit_that_cannot_grow_the_index_changes_nothing_and_succeeds_once_there_is_room() {
    let storage = FillableStorage {
        inner: formatted(),
        full: false,
    };
    let (mut index, _) = SlotIndex::open(storage).unwrap();
    index.finish_recovery([]).unwrap();
    // Fill the initial slots, then one removal and more seals than the free slots.
    for n in 0..INITIAL_SLOTS {
        index.stage(sealed(n, n * 64, 1));
    }
    index.commit().unwrap();
    index.stage(DurableChange::Removed {
        id: ObjectId::from_u64(0),
    });
    let extra = 10;
    for n in INITIAL_SLOTS..INITIAL_SLOTS + extra {
        index.stage(sealed(n, n * 64, 1));
    }
    index.storage_mut().full = true;
    let written_before = index.storage().inner.unsynced_writes().count();
    assert!(index.commit().is_err(), "the index cannot grow");
    assert_eq!(
        index.storage().inner.unsynced_writes().count(),
        written_before,
        "nothing was written"
    );
    assert_eq!(
        index.staged_seal_count() as u64,
        extra,
        "nothing staged was dropped"
    );
    assert!(index.has_staged_removals());
    assert!(index.commit().is_err(), "still full: still nothing");

    index.storage_mut().full = false;
    let stats = index.commit().unwrap();
    assert_eq!((stats.seals, stats.removals), (extra, 1));
    let (_, ids, scan) = recover(index.into_storage().inner);
    assert_eq!(ids, (1..INITIAL_SLOTS + extra).collect::<Vec<_>>());
    assert_eq!(scan.slots, INITIAL_SLOTS * 2);
}

#[test]
fn a_sync_makes_every_write_durable_even_one_a_shrink_cut_short() {
    let mut storage = MemoryStorage::new();
    ok(storage.set_len(64));
    ok(storage.write_at(0, &[1; 8]));
    ok(storage.sync());
    ok(storage.write_at(8, &[2; 8]));
    ok(storage.write_at(40, &[3; 16]));
    // Cuts the second write: its first 8 bytes stay where reads see them.
    ok(storage.set_len(48));
    ok(storage.sync());
    ok(storage.write_at(16, &[4; 8]));
    storage.crash(|_, _| WriteFate::Lost);
    let mut image = [0; 48];
    ok(storage.read_at(0, &mut image));
    let mut expected = [0; 48];
    expected[..8].fill(1);
    expected[8..16].fill(2);
    expected[40..48].fill(3);
    assert_eq!(image, expected);
}
