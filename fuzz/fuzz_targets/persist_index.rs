//! Recovery of a persistent store from an index file it did not write: a header (valid, with
//! arbitrary fields, or raw bytes) and slots (empty, raw bytes, records with a valid checksum
//! and arbitrary fields, bit flips and torn writes of those), opened by `BackingFile::open` on
//! tmpfs and handed to the store as the daemon does. Checks:
//! - a header the format writes opens; every slot decodes to what its bytes say, and a valid
//!   record re-encodes to exactly its bytes; the scan counts every slot once;
//! - the store takes or refuses each record and keeps its invariants; recovery then zeroes
//!   every refused and corrupt slot, so opening the files again finds no corrupt slot, and a
//!   second recovery refuses nothing and restores exactly the same objects.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use skyriver_core::alloc::{block_len_for, ALIGNMENT};
use skyriver_core::store::{Store, StoreConfig};
use skyriver_core::{ArenaId, Instant, LocalRegion, ObjectId, RecoveredObject};
use skyriver_transport::persist::{
    index_path_for, BackingFile, Header, Record, Slot, HEADER_BYTES, RECORD_BYTES,
};

/// Largest data file the target writes (a larger header size opens as a size mismatch).
const MAX_DATA_BYTES: u64 = 1 << 20;
const MAX_SLOTS: usize = 512;

#[derive(Arbitrary, Debug)]
enum HeaderInput {
    /// What the format writes, for a data file of this many pages.
    Valid { pages: u8 },
    /// A well-formed header with arbitrary sizes.
    Fields {
        data_bytes: u64,
        alignment_bytes: u64,
    },
    /// Anything.
    Raw([u8; 64]),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct RecordInput {
    seq: u16,
    id: u8,
    arena: u8,
    /// In units of the allocation alignment.
    block: u16,
    data_size: u16,
    metadata_size: u8,
}

impl RecordInput {
    fn encode(self) -> [u8; RECORD_BYTES] {
        let (data_size, metadata_size) = (u64::from(self.data_size), u64::from(self.metadata_size));
        Record {
            seq: u64::from(self.seq),
            object: RecoveredObject {
                id: ObjectId::from_u64(u64::from(self.id % 32)),
                block: LocalRegion {
                    arena: ArenaId(u32::from(self.arena % 4 / 3)),
                    offset: u64::from(self.block) * ALIGNMENT,
                    len: block_len_for(data_size + metadata_size).unwrap_or(0),
                },
                data_size,
                metadata_size,
            },
        }
        .encode()
    }
}

#[derive(Arbitrary, Debug)]
enum SlotInput {
    Empty,
    Record(RecordInput),
    /// A record with one bit flipped.
    Flipped(RecordInput, u16),
    /// A write of `new` over `old` that stopped after `cut` bytes.
    Torn {
        old: RecordInput,
        new: RecordInput,
        cut: u8,
    },
    Raw([u8; 64]),
}

impl SlotInput {
    fn bytes(&self) -> [u8; RECORD_BYTES] {
        match *self {
            SlotInput::Empty => [0; RECORD_BYTES],
            SlotInput::Record(record) => record.encode(),
            SlotInput::Flipped(record, bit) => {
                let mut bytes = record.encode();
                let bit = usize::from(bit) % (RECORD_BYTES * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
                bytes
            }
            SlotInput::Torn { old, new, cut } => {
                let mut bytes = old.encode();
                let cut = usize::from(cut) % RECORD_BYTES;
                bytes[..cut].copy_from_slice(&new.encode()[..cut]);
                bytes
            }
            SlotInput::Raw(bytes) => bytes,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    header: HeaderInput,
    slots: Vec<SlotInput>,
    /// Bytes of a slot cut short at the end of the file (a crash while growing).
    partial_slot: Vec<u8>,
}

/// This process's directory on tmpfs, emptied on every run.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("skyriver-fuzz-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz directory");
        dir
    })
}

/// What the store holds, comparable across stores.
fn objects(store: &Store) -> Vec<(ObjectId, LocalRegion, u64, u64)> {
    store
        .list()
        .iter()
        .map(|s| {
            assert!(s.sealed, "a recovered object is sealed");
            (
                s.info.id,
                s.info.region,
                s.info.data_size,
                s.info.metadata_size,
            )
        })
        .collect()
}

/// Opens the files and recovers them into a fresh store, as the daemon does.
fn recover(data_path: &std::path::Path) -> Option<(Store, u64, usize)> {
    let mut opened = BackingFile::open(data_path, 0).ok()?;
    let mut store = Store::new(StoreConfig {
        record_durable_changes: true,
        ..StoreConfig::single_arena(opened.scan.data_bytes)
    });
    let report = store.recover(Instant::ZERO, opened.backing.found_records());
    store.check_invariants();
    assert!(
        store.poll_durable_change().is_none(),
        "recovery is durable already"
    );
    let refused: Vec<usize> = report.refused.iter().map(|r| r.index).collect();
    opened
        .backing
        .finish_recovery(refused.iter().copied())
        .expect("zeroing slots on tmpfs");
    Some((store, opened.scan.corrupt_slots, refused.len()))
}

fuzz_target!(|input: Input| {
    let dir = dir();
    let data_path = dir.join("data");
    let index_path = index_path_for(&data_path);
    let _ = std::fs::remove_file(&data_path);
    let _ = std::fs::remove_file(&index_path);

    let (header, data_bytes, expect_open) = match input.header {
        HeaderInput::Valid { pages } => {
            let data_bytes = (u64::from(pages) % 64 + 1) * 4096;
            let header = Header {
                data_bytes,
                alignment_bytes: ALIGNMENT,
            };
            (header.encode(), data_bytes, true)
        }
        HeaderInput::Fields {
            data_bytes,
            alignment_bytes,
        } => {
            let header = Header {
                data_bytes,
                alignment_bytes,
            };
            (header.encode(), data_bytes.min(MAX_DATA_BYTES), false)
        }
        HeaderInput::Raw(bytes) => (bytes, 4096, false),
    };
    if let Ok(decoded) = Header::decode(&header) {
        assert_eq!(Header::decode(&decoded.encode()), Ok(decoded));
    }
    let slots: Vec<[u8; RECORD_BYTES]> = input
        .slots
        .iter()
        .take(MAX_SLOTS)
        .map(SlotInput::bytes)
        .collect();
    let mut index = vec![0u8; HEADER_BYTES as usize];
    index[..header.len()].copy_from_slice(&header);
    for slot in &slots {
        index.extend_from_slice(slot);
    }
    index.extend(input.partial_slot.iter().take(RECORD_BYTES - 1));
    std::fs::write(&index_path, &index).expect("write the index");
    std::fs::File::create(&data_path)
        .and_then(|file| file.set_len(data_bytes))
        .expect("write the data file");

    let (mut valid, mut corrupt) = (0, 0);
    for bytes in &slots {
        match Slot::decode(bytes) {
            Slot::Empty => assert_eq!(bytes, &[0; RECORD_BYTES]),
            Slot::Valid(record) => {
                assert_eq!(
                    &record.encode(),
                    bytes,
                    "a valid record re-encodes to its bytes"
                );
                valid += 1;
            }
            Slot::Corrupt => corrupt += 1,
            Slot::Spilled(record) => {
                assert_eq!(
                    &record.encode(),
                    bytes,
                    "a valid spilled record re-encodes to its bytes"
                );
                valid += 1;
            }
        }
    }

    let Ok(opened) = BackingFile::open(&data_path, 0) else {
        assert!(!expect_open, "a header the format writes did not open");
        return;
    };
    assert_eq!(opened.scan.slots, slots.len() as u64, "slots scanned");
    assert_eq!(opened.scan.valid_records, valid);
    assert_eq!(opened.scan.corrupt_slots, corrupt);
    drop(opened);

    let (first, corrupt_slots, _) = recover(&data_path).expect("opened once, opens again");
    assert_eq!(corrupt_slots, corrupt);
    let (second, corrupt_slots, refused) = recover(&data_path).expect("reopens after recovery");
    assert_eq!(corrupt_slots, 0, "recovery zeroed every corrupt slot");
    assert_eq!(refused, 0, "recovery zeroed every refused record");
    assert_eq!(
        objects(&second),
        objects(&first),
        "a second recovery restores the same"
    );
});
