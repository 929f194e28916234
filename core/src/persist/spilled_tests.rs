//! Spilled records in the slot index: a move between memory and the spill tier replaces an
//! object's record without a moment, at any crash, where the index names neither place.

use std::convert::Infallible;

use super::*;
use crate::store::SpillPlace;
use crate::{ArenaId, DurableChange, LocalRegion, ObjectId};

fn sealed(n: u64) -> DurableChange {
    DurableChange::Sealed {
        id: ObjectId::from_u64(n),
        block: LocalRegion {
            arena: ArenaId(0),
            offset: n * 4096,
            len: 128,
        },
        data_size: 100,
        metadata_size: 0,
    }
}

fn spilled(n: u64) -> DurableChange {
    DurableChange::Spilled {
        id: ObjectId::from_u64(n),
        place: SpillPlace {
            file: 3,
            offset: n * 64,
        },
        data_size: 100,
        metadata_size: 0,
    }
}

fn ok<T>(result: Result<T, Infallible>) -> T {
    let Ok(value) = result;
    value
}

fn fresh() -> SlotIndex<MemoryStorage> {
    let mut storage = MemoryStorage::new();
    ok(SlotIndex::format(&mut storage, 1 << 20));
    let (mut index, _) = SlotIndex::open(storage).unwrap();
    ok(index.finish_recovery([]));
    index
}

/// Where the index says object `n` is after a crash: in memory, spilled, or nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Memory,
    Spilled,
    Nowhere,
}

fn found_after(storage: MemoryStorage, n: u64) -> (Found, SlotIndex<MemoryStorage>) {
    let (mut index, _) = SlotIndex::open(storage).unwrap();
    let id = ObjectId::from_u64(n);
    let memory = index.found_records().filter(|o| o.id == id).count();
    let spilled = index.found_spilled().filter(|o| o.id == id).count();
    assert!(memory + spilled <= 1, "one record of an id is handed on");
    ok(index.finish_recovery([]));
    let found = match (memory, spilled) {
        (1, _) => Found::Memory,
        (_, 1) => Found::Spilled,
        _ => Found::Nowhere,
    };
    (found, index)
}

/// Every combination of fates of a commit's unsynced writes.
fn every_fate(writes: usize) -> Vec<Vec<WriteFate>> {
    let fates = [
        WriteFate::Lost,
        WriteFate::Landed,
        WriteFate::Torn { landed_bytes: 40 },
    ];
    let mut all = vec![Vec::new()];
    for _ in 0..writes {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                fates.iter().map(move |&fate| {
                    let mut next = prefix.clone();
                    next.push(fate);
                    next
                })
            })
            .collect();
    }
    all
}

/// Object 1 moves to the spill tier; a crash may come at any write of that commit, with each
/// unsynced write lost, landed or torn: the index names it in memory or spilled, never
/// nowhere. Once the commit returned, only the spilled record is left.
#[test]
fn a_move_to_the_spill_tier_is_never_lost_in_a_crash() {
    let mut base = fresh();
    base.stage(sealed(1));
    ok(base.commit());
    // The commit's writes, in order, each followed by a crash with any fates.
    let mut probe = fresh();
    probe.stage(sealed(1));
    ok(probe.commit());
    probe.stage(spilled(1));
    ok(probe.write_staged());
    let first_phase = probe.storage().unsynced_writes().count();
    assert_eq!(
        first_phase, 1,
        "the new record, nothing else before the barrier"
    );
    for fates in every_fate(first_phase) {
        let mut index = fresh();
        index.stage(sealed(1));
        ok(index.commit());
        index.stage(spilled(1));
        ok(index.write_staged());
        let mut storage = index.into_storage();
        let mut fates = fates.clone().into_iter();
        storage.crash(|_, _| fates.next().expect("a fate per write"));
        let (found, _) = found_after(storage, 1);
        assert_ne!(found, Found::Nowhere, "lost before the barrier");
    }
    // Both barriers passed: the in-memory record is durably gone.
    let mut index = fresh();
    index.stage(sealed(1));
    ok(index.commit());
    index.stage(spilled(1));
    ok(index.commit());
    assert_eq!(index.recorded_count(), 1);
    let mut storage = index.into_storage();
    storage.crash(|_, _| unreachable!("everything was synced"));
    let (found, reopened) = found_after(storage, 1);
    assert_eq!(found, Found::Spilled);
    // Then removing the spilled record cannot bring the in-memory one back.
    let mut index = reopened;
    index.stage(DurableChange::Removed {
        id: ObjectId::from_u64(1),
    });
    ok(index.write_staged());
    let writes = index.storage().unsynced_writes().count();
    for fates in every_fate(writes) {
        let mut storage = index.storage().clone();
        let mut fates = fates.into_iter();
        storage.crash(|_, _| fates.next().expect("a fate per write"));
        let (found, _) = found_after(storage, 1);
        assert_ne!(found, Found::Memory, "a replaced record came back");
    }
}

/// A crash between the new record's barrier and the old one's zeroing leaves both: the newest
/// wins, the other's slot is cleared, and a restore back into memory replaces it again.
#[test]
fn the_newest_record_of_an_id_wins_and_the_older_is_cleared() {
    let mut index = fresh();
    index.stage(sealed(1));
    index.stage(sealed(2));
    ok(index.commit());
    index.stage(spilled(1));
    ok(index.write_staged());
    // The first barrier only (the driver crashed before the old slot was zeroed).
    ok(index.storage_mut().sync());
    let storage = index.into_storage();
    let (mut reopened, scan) = SlotIndex::open(storage).unwrap();
    assert_eq!(scan.valid_records, 3);
    let memory: Vec<ObjectId> = reopened.found_records().map(|o| o.id).collect();
    let spilled_ids: Vec<ObjectId> = reopened.found_spilled().map(|o| o.id).collect();
    assert_eq!(memory, vec![ObjectId::from_u64(2)]);
    assert_eq!(spilled_ids, vec![ObjectId::from_u64(1)]);
    assert_eq!(
        ok(reopened.finish_recovery([])),
        1,
        "the older record cleared"
    );
    // Restored into memory: the spilled record is replaced by an in-memory one.
    reopened.stage(sealed(1));
    ok(reopened.commit());
    let (found, index) = found_after(reopened.into_storage(), 1);
    assert_eq!(found, Found::Memory);
    assert_eq!(index.recorded_count(), 2);
}

/// Spilled records the driver refuses (their file is gone) are cleared at recovery.
#[test]
fn refused_spilled_records_are_cleared() {
    let mut index = fresh();
    index.stage(spilled(1));
    index.stage(spilled(2));
    ok(index.commit());
    let (mut reopened, _) = SlotIndex::open(index.into_storage()).unwrap();
    let positions: Vec<usize> = reopened
        .found_spilled()
        .enumerate()
        .filter(|(_, o)| o.id == ObjectId::from_u64(2))
        .map(|(position, _)| position)
        .collect();
    reopened.refuse_spilled(positions);
    assert_eq!(ok(reopened.finish_recovery([])), 1);
    let (again, _) = SlotIndex::open(reopened.into_storage()).unwrap();
    let ids: Vec<ObjectId> = again.found_spilled().map(|o| o.id).collect();
    assert_eq!(ids, vec![ObjectId::from_u64(1)]);
}

/// An index of format version 1 opens with its records, and is rewritten as the current
/// version (an older build then refuses it rather than clear the spilled records it cannot
/// read).
#[test]
fn a_version_one_index_opens_and_is_upgraded() {
    let mut index = fresh();
    index.stage(sealed(1));
    ok(index.commit());
    let mut storage = index.into_storage();
    let mut header = [0u8; HEADER_USED_BYTES];
    ok(storage.read_at(0, &mut header));
    header[8..12].copy_from_slice(&1u32.to_le_bytes());
    header[60..64].fill(0);
    let crc = crc32c::crc32c(&header[..60]);
    header[60..64].copy_from_slice(&crc.to_le_bytes());
    ok(storage.write_at(0, &header));
    ok(storage.sync());
    let (mut old, _) = SlotIndex::open(storage).unwrap();
    assert_eq!(old.opened_version(), 1);
    let ids: Vec<ObjectId> = old.found_records().map(|o| o.id).collect();
    assert_eq!(ids, vec![ObjectId::from_u64(1)]);
    ok(old.finish_recovery([]));
    let (upgraded, _) = SlotIndex::open(old.into_storage()).unwrap();
    assert_eq!(upgraded.opened_version(), FORMAT_VERSION);
    assert_eq!(upgraded.found_records().count(), 1);
}
