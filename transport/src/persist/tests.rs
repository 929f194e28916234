use std::collections::BTreeSet;

use skyriver_core::persist::slot_offset;
use skyriver_core::{ArenaId, LocalRegion, ObjectId};

use super::*;

const ARENA_BYTES: u64 = 1 << 20;

fn sealed(n: u64, offset: u64, data_size: u64) -> DurableChange {
    DurableChange::Sealed {
        id: ObjectId::from_u64(n),
        block: LocalRegion {
            arena: ArenaId(0),
            offset,
            len: skyriver_core::alloc::block_len_for(data_size).unwrap(),
        },
        data_size,
        metadata_size: 0,
    }
}

fn open(path: &Path) -> Opened {
    BackingFile::open(path, ARENA_BYTES).unwrap()
}

/// Opens, accepts every record, and returns the ids found.
fn reopen_ids(path: &Path) -> (Vec<ObjectId>, ScanReport) {
    let mut opened = open(path);
    let mut ids: Vec<ObjectId> = opened.backing.found_records().map(|o| o.id).collect();
    opened.backing.finish_recovery([]).unwrap();
    ids.sort_unstable();
    (ids, opened.scan)
}

fn id_of(n: u64) -> ObjectId {
    ObjectId::from_u64(n)
}

#[test]
fn sealed_objects_and_their_bytes_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let mut opened = open(&path);
        assert!(opened.scan.created);
        assert_eq!(opened.arena.size_bytes(), ARENA_BYTES);
        opened.backing.finish_recovery([]).unwrap();
        opened.arena.write(0, b"first object").unwrap();
        opened.arena.write(4096, b"second").unwrap();
        opened.backing.stage(sealed(1, 0, 12));
        opened.backing.stage(sealed(2, 4096, 6));
        let stats = opened.backing.commit().unwrap();
        assert_eq!(stats.seals, 2);
        assert_eq!(
            stats.data_flushes, 1,
            "adjacent pages are flushed in one call"
        );
    }
    let opened = open(&path);
    assert!(!opened.scan.created);
    assert_eq!(opened.scan.valid_records, 2);
    let mut found: Vec<RecoveredObject> = opened.backing.found_records().collect();
    found.sort_by_key(|o| o.block.offset);
    assert_eq!(
        found
            .iter()
            .map(|o| {
                let mut bytes = vec![0; o.data_size as usize];
                opened.arena.read(o.block.offset, &mut bytes).unwrap();
                bytes
            })
            .collect::<Vec<_>>(),
        vec![b"first object".to_vec(), b"second".to_vec()]
    );
}

#[test]
fn removed_objects_do_not_come_back_and_their_slots_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let mut opened = open(&path);
        let backing = &mut opened.backing;
        backing.finish_recovery([]).unwrap();
        for n in 0..10 {
            backing.stage(sealed(n, n * 64, 10));
        }
        backing.commit().unwrap();
        backing.stage(DurableChange::Removed {
            id: ObjectId::from_u64(3),
        });
        assert!(backing.has_staged_removals());
        assert_eq!(backing.commit_removals().unwrap(), 1);
        // Sealed and removed before any commit: never written at all.
        backing.stage(sealed(20, 2048, 10));
        backing.stage(DurableChange::Removed {
            id: ObjectId::from_u64(20),
        });
        assert_eq!(backing.staged_seal_count(), 0);
        backing.stage(sealed(21, 3 * 64, 10));
        backing.commit().unwrap();
        assert_eq!(backing.recorded_count(), 10);
    }
    let (ids, scan) = reopen_ids(&path);
    let mut expected: Vec<ObjectId> = (0..10).filter(|&n| n != 3).chain([21]).map(id_of).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);
    assert_eq!(scan.slots, INITIAL_SLOTS, "the freed slot was reused");
}

#[test]
fn the_index_grows_past_its_initial_slots() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let count = INITIAL_SLOTS * 2 + 5;
    {
        let mut opened = open(&path);
        opened.backing.finish_recovery([]).unwrap();
        for n in 0..count {
            opened.backing.stage(sealed(n, n * 64, 1));
        }
        assert_eq!(opened.backing.commit().unwrap().seals, count);
    }
    let (ids, scan) = reopen_ids(&path);
    assert_eq!(ids.len() as u64, count);
    assert_eq!(scan.slots, INITIAL_SLOTS * 4);
}

#[test]
fn the_index_has_its_blocks_reserved_so_a_full_disk_cannot_fail_a_record() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut opened = open(&path);
    opened.backing.finish_recovery([]).unwrap();
    // Grow past the initial slots: the grown part is reserved too.
    for n in 0..INITIAL_SLOTS + 1 {
        opened.backing.stage(sealed(n, n * 64, 1));
    }
    opened.backing.commit().unwrap();
    let index = std::fs::metadata(opened.backing.index_path()).unwrap();
    let probe = dir.path().join("probe");
    std::fs::write(&probe, b"x").unwrap();
    // A file system that cannot reserve blocks (no fallocate) keeps sparse files: skip there.
    let supported = nix::fcntl::fallocate(
        std::os::fd::AsRawFd::as_raw_fd(
            &std::fs::File::options().write(true).open(&probe).unwrap(),
        ),
        nix::fcntl::FallocateFlags::empty(),
        0,
        1 << 20,
    )
    .is_ok();
    if supported {
        assert!(
            index.blocks() * 512 >= slot_offset(INITIAL_SLOTS * 2),
            "{} bytes reserved of {}",
            index.blocks() * 512,
            index.len()
        );
    }
}

/// Flips bytes in the index region and checks that every record touched is refused (never
/// handed to the store), every other record is intact, and the damage is cleaned up.
#[test]
fn corrupt_records_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let count = 200u64;
    {
        let mut opened = open(&path);
        opened.backing.finish_recovery([]).unwrap();
        for n in 0..count {
            opened.backing.stage(sealed(n, n * 64, 33));
        }
        opened.backing.commit().unwrap();
    }
    let index_path = index_path_for(&path);
    let index = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&index_path)
        .unwrap();
    // A small deterministic generator: which slot, which byte, which bits.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut damaged = BTreeSet::new();
    for _ in 0..40 {
        let slot = next() % count;
        let byte = next() % RECORD_BYTES as u64;
        let mask = (next() % 255 + 1) as u8;
        let offset = slot_offset(slot) + byte;
        let mut b = [0u8];
        index.read_exact_at(&mut b, offset).unwrap();
        b[0] ^= mask;
        index.write_all_at(&b, offset).unwrap();
        damaged.insert(slot);
    }
    // Flips can cancel out; a slot counts as damaged only if its bytes changed.
    let mut truly_damaged = 0;
    let mut intact_ids = Vec::new();
    for slot in 0..count {
        let mut bytes = [0u8; RECORD_BYTES];
        index.read_exact_at(&mut bytes, slot_offset(slot)).unwrap();
        match Slot::decode(&bytes) {
            Slot::Valid(record) => {
                intact_ids.push(record.object.id);
                assert_eq!(record.object.data_size, 33);
            }
            Slot::Corrupt => truly_damaged += 1,
            Slot::Empty => panic!("a flip cannot zero a whole record"),
            Slot::Spilled(record) => panic!("no spilled record was written: {record:?}"),
        }
    }
    assert!(truly_damaged > 20, "{truly_damaged} damaged slots");
    assert!(damaged.len() >= truly_damaged);
    drop(index);

    let mut opened = open(&path);
    assert_eq!(opened.scan.corrupt_slots, truly_damaged as u64);
    let mut found: Vec<ObjectId> = opened.backing.found_records().map(|o| o.id).collect();
    found.sort_unstable();
    intact_ids.sort_unstable();
    assert_eq!(
        found, intact_ids,
        "exactly the undamaged records are handed out"
    );
    for object in opened.backing.found_records() {
        assert_eq!(object.data_size, 33);
        assert_eq!(object.block.len, 64);
    }
    assert_eq!(
        opened.backing.finish_recovery([]).unwrap(),
        truly_damaged as u64
    );
    drop(opened);
    let (ids, scan) = reopen_ids(&path);
    assert_eq!(scan.corrupt_slots, 0, "corrupt slots were zeroed");
    assert_eq!(ids.len(), intact_ids.len());
}

#[test]
fn a_torn_write_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let mut opened = open(&path);
        opened.backing.finish_recovery([]).unwrap();
        opened.backing.stage(sealed(1, 0, 10));
        opened.backing.commit().unwrap();
    }
    // Half of a record landed in the next slot before the crash.
    let record = Record {
        seq: 99,
        object: match sealed(2, 64, 10) {
            DurableChange::Sealed {
                id,
                block,
                data_size,
                metadata_size,
            } => RecoveredObject {
                id,
                block,
                data_size,
                metadata_size,
            },
            DurableChange::Removed { .. } | DurableChange::Spilled { .. } => unreachable!(),
        },
    }
    .encode();
    let index = OpenOptions::new()
        .write(true)
        .open(index_path_for(&path))
        .unwrap();
    index.write_all_at(&record[..32], slot_offset(1)).unwrap();
    drop(index);
    let (ids, scan) = reopen_ids(&path);
    assert_eq!(ids, vec![id_of(1)]);
    assert_eq!(scan.corrupt_slots, 1);
}

#[test]
fn refused_records_are_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let mut opened = open(&path);
        opened.backing.finish_recovery([]).unwrap();
        opened.backing.stage(sealed(1, 0, 10));
        opened.backing.stage(sealed(2, 64, 10));
        opened.backing.commit().unwrap();
    }
    {
        let mut opened = open(&path);
        assert_eq!(opened.backing.found_records().count(), 2);
        assert_eq!(opened.backing.finish_recovery([0]).unwrap(), 1);
        assert_eq!(opened.backing.recorded_count(), 1);
    }
    let (ids, _) = reopen_ids(&path);
    assert_eq!(ids.len(), 1);
}

#[test]
fn files_of_another_version_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    drop(open(&path));
    let index_path = index_path_for(&path);
    let mut bytes = std::fs::read(&index_path).unwrap();
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&index_path, &bytes).unwrap();
    let error = BackingFile::open(&path, ARENA_BYTES).unwrap_err();
    assert!(
        matches!(error, PersistError::IncompatibleVersion { found, .. } if found == FORMAT_VERSION + 1),
        "{error}"
    );
    assert!(error.to_string().contains("Refusing to open"), "{error}");
    assert_eq!(std::fs::read(&index_path).unwrap(), bytes, "not modified");
}

#[test]
fn a_corrupt_header_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    drop(open(&path));
    let index_path = index_path_for(&path);
    let mut bytes = std::fs::read(&index_path).unwrap();
    bytes[17] ^= 0x01; // the data size
    std::fs::write(&index_path, &bytes).unwrap();
    assert!(matches!(
        BackingFile::open(&path, ARENA_BYTES),
        Err(PersistError::CorruptHeader { .. })
    ));
    assert_eq!(std::fs::read(&index_path).unwrap(), bytes);
    std::fs::write(&index_path, b"something else entirely").unwrap();
    assert!(matches!(
        BackingFile::open(&path, ARENA_BYTES),
        Err(PersistError::NotAnIndex { .. })
    ));
}

#[test]
fn a_data_file_without_index_is_not_reformatted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("precious");
    std::fs::write(&path, b"somebody's data").unwrap();
    let error = BackingFile::open(&path, ARENA_BYTES).unwrap_err();
    assert!(
        matches!(error, PersistError::MissingIndex { .. }),
        "{error}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"somebody's data");
}

#[test]
fn a_resized_data_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    drop(open(&path));
    let data = OpenOptions::new().write(true).open(&path).unwrap();
    data.set_len(ARENA_BYTES / 2).unwrap();
    assert!(matches!(
        BackingFile::open(&path, ARENA_BYTES),
        Err(PersistError::DataSizeMismatch { .. })
    ));
}

#[test]
fn two_daemons_cannot_open_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let _first = open(&path);
    assert!(matches!(
        BackingFile::open(&path, ARENA_BYTES),
        Err(PersistError::Locked { .. })
    ));
}

#[test]
fn an_existing_store_keeps_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    drop(open(&path));
    let opened = BackingFile::open(&path, ARENA_BYTES * 4).unwrap();
    assert_eq!(opened.arena.size_bytes(), ARENA_BYTES);
}
