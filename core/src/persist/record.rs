//! Byte formats of the index file: its header and its 64-byte object records.
//!
//! All integers are little-endian. Both carry a CRC32C (Castagnoli) so a torn or corrupted
//! write is detected and never trusted.

use crate::ids::OBJECT_ID_LEN;
use crate::store::{RecoveredSpilled, SpillPlace};
use crate::{ArenaId, LocalRegion, ObjectId, RecoveredObject};

/// Identifies an index file: "SKYRIDX" and a NUL.
pub const INDEX_MAGIC: [u8; 8] = *b"SKYRIDX\0";

/// The on-disk format this build writes. Bump it on any change to the header, the record
/// layout or their meaning; newer files are then refused, not rewritten.
///
/// Version 2 added the spilled record (see [`SpilledRecord`]). A build of version 1 would take
/// one for a corrupt slot and clear it, losing the object, so an index is rewritten as version
/// 2 when it is opened (an older build then refuses it instead).
pub const FORMAT_VERSION: u32 = 2;

/// The oldest format this build reads: version 1 files hold only in-memory records, which
/// version 2 reads as they are.
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Bytes reserved for the header at the start of the index file (one page, so records start
/// page-aligned). Only the first [`HEADER_USED_BYTES`] are used.
pub const HEADER_BYTES: u64 = 4096;

/// Bytes of the header that carry fields; the rest of the page is zero.
pub const HEADER_USED_BYTES: usize = 64;

/// Bytes of one record: one cache line, so a record never straddles a sector or a page.
pub const RECORD_BYTES: usize = 64;

/// First four bytes of a used record slot ("SKYR" little-endian). An all-zero slot is empty.
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SKYR");

/// The index file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Size of the data file (the arena), in bytes.
    pub data_bytes: u64,
    /// Allocation alignment the records assume (the core's `ALIGNMENT`).
    pub alignment_bytes: u64,
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The magic is not ours (or the file is shorter than a header): not a Skyriver index.
    #[error("not a Skyriver index file")]
    BadMagic,
    /// Written by an incompatible version of the format.
    #[error(
        "index format version {found}; this build reads versions {OLDEST_READABLE_VERSION} to \
         {FORMAT_VERSION}"
    )]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The checksum does not match: the header is corrupt.
    #[error("checksum mismatch")]
    Checksum,
    /// Fields that this version cannot use (record size, header size).
    #[error("record or header size this build does not use")]
    Layout,
    /// The records assume another allocation alignment than this build's.
    #[error("allocation alignment differs from this build's")]
    Alignment,
}

impl Header {
    /// The header's bytes, checksum included.
    pub fn encode(&self) -> [u8; HEADER_USED_BYTES] {
        let mut bytes = [0u8; HEADER_USED_BYTES];
        bytes[0..8].copy_from_slice(&INDEX_MAGIC);
        bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
        bytes[16..24].copy_from_slice(&self.data_bytes.to_le_bytes());
        bytes[24..32].copy_from_slice(&HEADER_BYTES.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.alignment_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..60]);
        bytes[60..64].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Parses a header. The magic and the version are checked before the checksum, so a file
    /// of another format version is reported as such even if its header layout differs.
    pub fn decode(bytes: &[u8; HEADER_USED_BYTES]) -> Result<Self, HeaderError> {
        Self::decode_versioned(bytes).map(|(header, _)| header)
    }

    /// [`Header::decode`], with the format version the file was written in (one this build
    /// reads).
    pub fn decode_versioned(bytes: &[u8; HEADER_USED_BYTES]) -> Result<(Self, u32), HeaderError> {
        if bytes[0..8] != INDEX_MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let found = u32_at(bytes, 8);
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&found) {
            return Err(HeaderError::Version { found });
        }
        if crc32c::crc32c(&bytes[..60]) != u32_at(bytes, 60) {
            return Err(HeaderError::Checksum);
        }
        if u32_at(bytes, 12) as usize != RECORD_BYTES || u64_at(bytes, 24) != HEADER_BYTES {
            return Err(HeaderError::Layout);
        }
        let header = Self {
            data_bytes: u64_at(bytes, 16),
            alignment_bytes: u64_at(bytes, 32),
        };
        Ok((header, found))
    }
}

/// A sealed object as recorded: which object, where, how large, and when (a sequence number
/// that only grows, across restarts too; the newest record wins if two disagree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Order of writing.
    pub seq: u64,
    /// The object.
    pub object: RecoveredObject,
}

/// A sealed object in the spill tier as recorded: its bytes are in the driver's spill record
/// at [`RecoveredSpilled::place`] (format version 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpilledRecord {
    /// Order of writing (shared with [`Record`]: the newest record of an id wins).
    pub seq: u64,
    /// The object.
    pub object: RecoveredSpilled,
}

/// What a record slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// All zero: never used, or the object was removed.
    Empty,
    /// A record whose checksum matches.
    Valid(Record),
    /// Anything else: a torn or corrupted write. Never trusted.
    Corrupt,
    /// A spilled object's record whose checksum matches.
    Spilled(SpilledRecord),
}

// Record layout (64 bytes):
//   0..4   magic "SKYR"
//   4..8   CRC32C of the record with these four bytes zero
//   8..16  sequence number
//   16..36 object id
//   36..40 arena id
//   40..48 block offset in the arena
//   48..56 data size
//   56..64 metadata size
// The block length is not stored: it is the aligned data + metadata size, and the store
// refuses a record whose sizes and block disagree.
//
// Spilled record layout (64 bytes, version 2): as above, with magic "SKYS", and the spill
// file in place of the arena id and the offset in it in place of the block offset:
//   36..40 spill file
//   40..48 offset of the spill record in that file

/// First four bytes of a spilled record's slot ("SKYS" little-endian).
const SPILLED_MAGIC: u32 = u32::from_le_bytes(*b"SKYS");

impl SpilledRecord {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut bytes = [0u8; RECORD_BYTES];
        bytes[0..4].copy_from_slice(&SPILLED_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.seq.to_le_bytes());
        bytes[16..36].copy_from_slice(&self.object.id.0);
        bytes[36..40].copy_from_slice(&self.object.place.file.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.object.place.offset.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.object.data_size.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.object.metadata_size.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes
    }
}

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut bytes = [0u8; RECORD_BYTES];
        bytes[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.seq.to_le_bytes());
        bytes[16..36].copy_from_slice(&self.object.id.0);
        bytes[36..40].copy_from_slice(&self.object.block.arena.0.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.object.block.offset.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.object.data_size.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.object.metadata_size.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes
    }
}

impl Slot {
    /// Reads one slot.
    pub fn decode(bytes: &[u8; RECORD_BYTES]) -> Self {
        if bytes.iter().all(|&b| b == 0) {
            return Slot::Empty;
        }
        let magic = u32_at(bytes, 0);
        if magic != RECORD_MAGIC && magic != SPILLED_MAGIC {
            return Slot::Corrupt;
        }
        let mut zeroed = *bytes;
        zeroed[4..8].fill(0);
        if crc32c::crc32c(&zeroed) != u32_at(bytes, 4) {
            return Slot::Corrupt;
        }
        let data_size = u64_at(bytes, 48);
        let metadata_size = u64_at(bytes, 56);
        let Some(block_len) = data_size
            .checked_add(metadata_size)
            .and_then(crate::alloc::block_len_for)
        else {
            return Slot::Corrupt;
        };
        let mut id = [0u8; OBJECT_ID_LEN];
        id.copy_from_slice(&bytes[16..36]);
        if magic == SPILLED_MAGIC {
            return Slot::Spilled(SpilledRecord {
                seq: u64_at(bytes, 8),
                object: RecoveredSpilled {
                    id: ObjectId(id),
                    place: SpillPlace {
                        file: u32_at(bytes, 36),
                        offset: u64_at(bytes, 40),
                    },
                    data_size,
                    metadata_size,
                },
            });
        }
        Slot::Valid(Record {
            seq: u64_at(bytes, 8),
            object: RecoveredObject {
                id: ObjectId(id),
                block: LocalRegion {
                    arena: ArenaId(u32_at(bytes, 36)),
                    offset: u64_at(bytes, 40),
                    len: block_len,
                },
                data_size,
                metadata_size,
            },
        })
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            seq: 7,
            object: RecoveredObject {
                id: ObjectId::from_u64(0xfeed),
                block: LocalRegion {
                    arena: ArenaId(0),
                    offset: 4096,
                    len: 192,
                },
                data_size: 150,
                metadata_size: 3,
            },
        }
    }

    fn spilled() -> SpilledRecord {
        SpilledRecord {
            seq: 9,
            object: RecoveredSpilled {
                id: ObjectId::from_u64(0xbeef),
                place: SpillPlace {
                    file: 0x8000_0003,
                    offset: 1 << 40,
                },
                data_size: 5 << 20,
                metadata_size: 7,
            },
        }
    }

    #[test]
    fn a_spilled_record_round_trips_and_every_bit_flip_is_detected() {
        let good = spilled().encode();
        assert_eq!(Slot::decode(&good), Slot::Spilled(spilled()));
        for byte in 0..RECORD_BYTES {
            for bit in 0..8 {
                let mut bad = good;
                bad[byte] ^= 1 << bit;
                assert_eq!(Slot::decode(&bad), Slot::Corrupt, "byte {byte} bit {bit}");
            }
        }
    }

    /// A version 1 header (written before spilled records existed) is read, with its version.
    #[test]
    fn a_version_one_header_is_read() {
        let header = Header {
            data_bytes: 1 << 20,
            alignment_bytes: 64,
        };
        let mut old = header.encode();
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&old[..60]);
        old[60..64].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Header::decode_versioned(&old), Ok((header, 1)));
        assert_eq!(Header::decode_versioned(&header.encode()), Ok((header, 2)));
    }

    #[test]
    fn a_record_round_trips() {
        assert_eq!(Slot::decode(&record().encode()), Slot::Valid(record()));
        assert_eq!(Slot::decode(&[0; RECORD_BYTES]), Slot::Empty);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let good = record().encode();
        for byte in 0..RECORD_BYTES {
            for bit in 0..8 {
                let mut bad = good;
                bad[byte] ^= 1 << bit;
                assert_eq!(Slot::decode(&bad), Slot::Corrupt, "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn a_torn_record_is_detected() {
        // A write that stopped part-way: the new record's head over an old record's tail, or
        // over an empty slot.
        let old = Record {
            seq: 3,
            object: RecoveredObject {
                id: ObjectId::from_u64(1),
                ..record().object
            },
        }
        .encode();
        let new = record().encode();
        for base in [old, [0; RECORD_BYTES]] {
            for cut in 1..RECORD_BYTES {
                let mut torn = base;
                torn[..cut].copy_from_slice(&new[..cut]);
                // Bytes the two writes agree on are not torn: skip cuts that change nothing.
                if torn != new && torn != base {
                    assert_eq!(Slot::decode(&torn), Slot::Corrupt, "cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn headers_of_other_versions_and_corrupt_headers_are_refused() {
        let header = Header {
            data_bytes: 1 << 30,
            alignment_bytes: 64,
        };
        let good = header.encode();
        assert_eq!(Header::decode(&good), Ok(header));
        let mut other_version = good;
        other_version[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            Header::decode(&other_version),
            Err(HeaderError::Version {
                found: FORMAT_VERSION + 1
            })
        );
        let mut flipped = good;
        flipped[20] ^= 0x10;
        assert_eq!(Header::decode(&flipped), Err(HeaderError::Checksum));
        assert_eq!(
            Header::decode(&[0; HEADER_USED_BYTES]),
            Err(HeaderError::BadMagic)
        );
    }
}
