//! The persistent slot index: a crash-consistent record of a store's sealed objects, kept on a
//! [`Storage`] (the index file beside a persistent daemon's data file; the simulator's disk).
//!
//! The index is a 4 KiB header (magic, format version, record size, data-file size,
//! allocation alignment, CRC32C) followed by 64-byte slots, each all zero (empty) or one
//! checksummed record of a sealed object (layout in [`record`]). Every change is one slot
//! written with one aligned 64-byte write, so after a crash a slot holds the old contents, the
//! new ones, or a mix that its checksum refuses; the recovery scan discards such torn slots.
//! Why the valid records are then all true is in the daemon's persistence module (data before
//! record, removal before reuse); [`SlotIndex`] keeps the slot-side half of those rules.
//!
//! No IO here: the driver gives a [`Storage`] and flushes the data file itself.

pub mod memory;
pub mod record;
mod slot_index;
mod storage;

pub use memory::{MemoryStorage, WriteFate};
pub use record::{
    Header, HeaderError, Record, Slot, SpilledRecord, FORMAT_VERSION, HEADER_BYTES,
    HEADER_USED_BYTES, INDEX_MAGIC, OLDEST_READABLE_VERSION, RECORD_BYTES,
};
pub use slot_index::{
    slot_offset, FoundRecord, FoundSpilled, OpenError, ScanReport, SlotIndex, WriteStats,
    INITIAL_SLOTS,
};
pub use storage::Storage;

#[cfg(test)]
mod spilled_tests;
#[cfg(test)]
mod tests;
