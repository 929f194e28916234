//! The slot table of the index: which slot holds which object's record, which slots are free,
//! what is staged for the next commit, and the recovery scan.

use std::collections::{BTreeMap, BTreeSet};

use super::record::{
    Header, HeaderError, Record, Slot, SpilledRecord, FORMAT_VERSION, HEADER_BYTES,
    HEADER_USED_BYTES,
};
use super::{Storage, RECORD_BYTES};
use crate::alloc::ALIGNMENT;
use crate::store::RecoveredSpilled;
use crate::{DurableChange, ObjectId, RecoveredObject};

/// Slots of a new index (it doubles when full).
pub const INITIAL_SLOTS: u64 = 1024;

/// Bytes read per call while scanning the index.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Why an index could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError<E: std::error::Error + 'static> {
    /// The medium failed.
    #[error(transparent)]
    Storage(E),
    /// The header was refused; nothing was written.
    #[error("index header refused: {0}")]
    Header(#[source] HeaderError),
}

/// A record found by the recovery scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundRecord {
    /// Its slot.
    pub slot: u64,
    /// The record.
    pub record: Record,
}

/// A spilled object's record found by the recovery scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundSpilled {
    /// Its slot.
    pub slot: u64,
    /// The record.
    pub record: SpilledRecord,
}

/// What the recovery scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// The files did not exist and were created empty (set by the driver that created them).
    pub created: bool,
    /// Size of the data file (the arena), from the header.
    pub data_bytes: u64,
    /// Slots in the index.
    pub slots: u64,
    /// Slots holding a record with a valid checksum.
    pub valid_records: u64,
    /// Slots holding anything else but zeros (torn or corrupt): discarded.
    pub corrupt_slots: u64,
}

/// What writing the staged changes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Seal records written.
    pub seals: u64,
    /// Records removed (slots zeroed).
    pub removals: u64,
}

/// The index over its medium: the in-memory slot table and the staged changes.
///
/// Rules (see the daemon's persistence module for why they make every valid record true):
/// a seal's record is written only after its data is durable (the caller flushes the data of
/// [`SlotIndex::staged_seals`] before [`SlotIndex::write_staged`]); a zeroed slot is reused
/// only after a [`SlotIndex::sync`]; sequence numbers only grow, across restarts too.
///
/// An object has one record, but moving between memory and the spill tier replaces it: the new
/// record goes to a free slot with a higher sequence number, and the old slot is zeroed only
/// after a sync made the new one durable (the newest record of an id wins at recovery). So a
/// crash finds the old record, the new one, or both, never neither; and the old one is durably
/// gone before the new one can be removed, so it never comes back alone.
#[derive(Debug)]
pub struct SlotIndex<S> {
    storage: S,
    header: Header,
    slot_count: u64,
    free_slots: BTreeSet<u64>,
    /// Slot of every object whose record is written.
    recorded: BTreeMap<ObjectId, u64>,
    /// Seals not written yet.
    staged_seals: BTreeMap<ObjectId, RecoveredObject>,
    /// Moves to the spill tier not written yet.
    staged_spilled: BTreeMap<ObjectId, RecoveredSpilled>,
    /// Slots of records replaced by newer ones written since the last sync: zeroed once those
    /// are durable.
    replaced_slots: Vec<u64>,
    /// Format version of the file as opened (rewritten as [`FORMAT_VERSION`] at
    /// [`SlotIndex::finish_recovery`]).
    version: u32,
    /// Slots to zero.
    staged_removals: Vec<u64>,
    /// Zeroed slots that become free once the index is synced.
    free_slots_after_sync: Vec<u64>,
    next_seq: u64,
    /// Valid records of the scan, newest first, until [`SlotIndex::finish_recovery`].
    found: Vec<FoundRecord>,
    /// Corrupt slots of the scan, until [`SlotIndex::finish_recovery`].
    corrupt: Vec<u64>,
    /// Valid spilled records of the scan, newest first, until [`SlotIndex::finish_recovery`].
    found_spilled: Vec<FoundSpilled>,
    /// Slots of records an id's newer record replaced (a crash came between the write of the
    /// new one and the zeroing of the old one): cleared at [`SlotIndex::finish_recovery`].
    superseded: Vec<u64>,
    /// Positions in [`SlotIndex::found_spilled`] the driver refused (see
    /// [`SlotIndex::refuse_spilled`]).
    refused_spilled: BTreeSet<usize>,
}

/// Where slot `slot` starts.
pub fn slot_offset(slot: u64) -> u64 {
    HEADER_BYTES + slot * RECORD_BYTES as u64
}

impl<S: Storage> SlotIndex<S> {
    /// Writes an empty index for a `data_bytes` arena onto `storage` and syncs it.
    pub fn format(storage: &mut S, data_bytes: u64) -> Result<(), S::Error> {
        storage.set_len(slot_offset(INITIAL_SLOTS))?;
        let header = Header {
            data_bytes,
            alignment_bytes: ALIGNMENT,
        };
        storage.write_at(0, &header.encode())?;
        storage.sync()
    }

    /// Opens the index on `storage`: checks its header and scans every slot. Valid records
    /// wait (newest first) in [`SlotIndex::found_records`] for the store's verdict, handed
    /// back with [`SlotIndex::finish_recovery`].
    pub fn open(mut storage: S) -> Result<(Self, ScanReport), OpenError<S::Error>> {
        let len_bytes = storage.len_bytes().map_err(OpenError::Storage)?;
        if len_bytes < HEADER_USED_BYTES as u64 {
            return Err(OpenError::Header(HeaderError::BadMagic));
        }
        let mut bytes = [0u8; HEADER_USED_BYTES];
        storage.read_at(0, &mut bytes).map_err(OpenError::Storage)?;
        let (header, version) = Header::decode_versioned(&bytes).map_err(OpenError::Header)?;
        if header.alignment_bytes != ALIGNMENT {
            return Err(OpenError::Header(HeaderError::Alignment));
        }
        let mut index = Self {
            storage,
            header,
            slot_count: 0,
            free_slots: BTreeSet::new(),
            recorded: BTreeMap::new(),
            staged_seals: BTreeMap::new(),
            staged_removals: Vec::new(),
            free_slots_after_sync: Vec::new(),
            next_seq: 1,
            found: Vec::new(),
            corrupt: Vec::new(),
            staged_spilled: BTreeMap::new(),
            replaced_slots: Vec::new(),
            version,
            found_spilled: Vec::new(),
            superseded: Vec::new(),
            refused_spilled: BTreeSet::new(),
        };
        let report = index.scan(len_bytes).map_err(OpenError::Storage)?;
        Ok((index, report))
    }

    /// Reads every slot: valid records are kept (newest first) for the store, corrupt ones
    /// remembered to be zeroed, empty ones become free.
    fn scan(&mut self, len_bytes: u64) -> Result<ScanReport, S::Error> {
        // A partly written last slot (a crash while growing) is ignored and cut off.
        self.slot_count = len_bytes.saturating_sub(HEADER_BYTES) / RECORD_BYTES as u64;
        let mut buf = vec![0u8; SCAN_CHUNK_BYTES];
        let mut slot = 0;
        while slot < self.slot_count {
            let count = (self.slot_count - slot).min((SCAN_CHUNK_BYTES / RECORD_BYTES) as u64);
            let chunk = &mut buf[..count as usize * RECORD_BYTES];
            self.storage.read_at(slot_offset(slot), chunk)?;
            for bytes in chunk.chunks_exact(RECORD_BYTES) {
                let bytes: &[u8; RECORD_BYTES] = bytes.try_into().expect("exact chunks");
                match Slot::decode(bytes) {
                    Slot::Empty => {
                        self.free_slots.insert(slot);
                    }
                    Slot::Valid(record) => self.found.push(FoundRecord { slot, record }),
                    Slot::Corrupt => self.corrupt.push(slot),
                    Slot::Spilled(record) => {
                        self.found_spilled.push(FoundSpilled { slot, record });
                    }
                }
                slot += 1;
            }
        }
        let valid_records = (self.found.len() + self.found_spilled.len()) as u64;
        self.keep_newest_record_of_each_id();
        Ok(ScanReport {
            created: false,
            data_bytes: self.header.data_bytes,
            slots: self.slot_count,
            valid_records,
            corrupt_slots: self.corrupt.len() as u64,
        })
    }

    /// Sorts the records newest first and keeps only the newest of each id: an older one was
    /// replaced (the object moved to or from the spill tier, or was sealed again) and a crash
    /// came before its slot was zeroed. Its slot is cleared at recovery.
    fn keep_newest_record_of_each_id(&mut self) {
        self.found
            .sort_by_key(|found| std::cmp::Reverse(found.record.seq));
        self.found_spilled
            .sort_by_key(|found| std::cmp::Reverse(found.record.seq));
        let newest = self
            .found
            .first()
            .map(|f| f.record.seq)
            .max(self.found_spilled.first().map(|f| f.record.seq));
        self.next_seq = newest.map_or(1, |seq| seq + 1);
        let mut seqs: BTreeMap<ObjectId, u64> = BTreeMap::new();
        let all = self
            .found
            .iter()
            .map(|f| (f.record.object.id, f.record.seq))
            .chain(
                self.found_spilled
                    .iter()
                    .map(|f| (f.record.object.id, f.record.seq)),
            );
        for (id, seq) in all {
            let newest = seqs.entry(id).or_insert(seq);
            *newest = (*newest).max(seq);
        }
        let superseded = &mut self.superseded;
        self.found.retain(|f| {
            let keep = seqs[&f.record.object.id] == f.record.seq;
            if !keep {
                superseded.push(f.slot);
            }
            keep
        });
        self.found_spilled.retain(|f| {
            let keep = seqs[&f.record.object.id] == f.record.seq;
            if !keep {
                superseded.push(f.slot);
            }
            keep
        });
    }

    /// The spilled records the scan found, newest first (the newest record of their ids): the
    /// input of the store's `recover_spilled`.
    pub fn found_spilled(&self) -> impl Iterator<Item = RecoveredSpilled> + '_ {
        self.found_spilled.iter().map(|found| found.record.object)
    }

    /// The driver refuses the spilled records at these positions of
    /// [`SlotIndex::found_spilled`] (their spill record is missing or damaged, or the store
    /// refused them): [`SlotIndex::finish_recovery`] clears them with the others.
    pub fn refuse_spilled(&mut self, refused: impl IntoIterator<Item = usize>) {
        self.refused_spilled.extend(refused);
    }

    /// The format version the file had when opened.
    pub fn opened_version(&self) -> u32 {
        self.version
    }

    /// The header read at open.
    pub fn header(&self) -> Header {
        self.header
    }

    /// The records the scan found and their slots, newest first.
    pub fn found(&self) -> impl Iterator<Item = &FoundRecord> {
        self.found.iter()
    }

    /// The records the scan found, newest first: the input of the store's `recover`.
    pub fn found_records(&self) -> impl Iterator<Item = RecoveredObject> + '_ {
        self.found.iter().map(|found| found.record.object)
    }

    /// Takes the store's verdict on [`SlotIndex::found_records`]: `refused` are positions in
    /// that sequence. Refused and corrupt slots are zeroed (and synced); the accepted records
    /// are the index from now on. Returns how many slots were zeroed.
    pub fn finish_recovery(
        &mut self,
        refused: impl IntoIterator<Item = usize>,
    ) -> Result<u64, S::Error> {
        let refused: BTreeSet<usize> = refused.into_iter().collect();
        let mut cleared = std::mem::take(&mut self.corrupt);
        cleared.append(&mut self.superseded);
        let refused_spilled = std::mem::take(&mut self.refused_spilled);
        for (position, found) in std::mem::take(&mut self.found_spilled)
            .into_iter()
            .enumerate()
        {
            if refused_spilled.contains(&position) {
                cleared.push(found.slot);
            } else {
                self.recorded.insert(found.record.object.id, found.slot);
            }
        }
        for (position, found) in std::mem::take(&mut self.found).into_iter().enumerate() {
            if refused.contains(&position) {
                cleared.push(found.slot);
            } else {
                let previous = self.recorded.insert(found.record.object.id, found.slot);
                assert!(
                    previous.is_none(),
                    "the store accepted {} twice",
                    found.record.object.id
                );
            }
        }
        for &slot in &cleared {
            self.write_slot(slot, &[0; RECORD_BYTES])?;
        }
        if self.version < FORMAT_VERSION {
            // From now on it may hold records an older build would clear: it refuses the file.
            self.storage.write_at(0, &self.header.encode())?;
            self.version = FORMAT_VERSION;
            self.storage.sync()?;
        } else if !cleared.is_empty() {
            self.storage.sync()?;
        }
        self.free_slots.extend(cleared.iter().copied());
        Ok(cleared.len() as u64)
    }

    /// Takes one change from the store, to be written by the next commit.
    ///
    /// A seal or a move to the spill tier of an object with a record replaces that record (see
    /// the type's doc); a newer staged change of an object replaces the one staged before.
    pub fn stage(&mut self, change: DurableChange) {
        let id = change.id();
        // Staged and changed again before written: only the newest counts.
        self.staged_seals.remove(&id);
        self.staged_spilled.remove(&id);
        if let Some(object) = change.sealed_object() {
            self.staged_seals.insert(id, object);
        } else if let Some(object) = change.spilled_object() {
            self.staged_spilled.insert(id, object);
        } else if let Some(slot) = self.recorded.remove(&id) {
            self.staged_removals.push(slot);
        }
    }

    /// Seals staged and not written yet, by id: their data must be durable before
    /// [`SlotIndex::write_staged`].
    pub fn staged_seals(&self) -> impl Iterator<Item = &RecoveredObject> {
        self.staged_seals.values()
    }

    /// Seals staged and not written yet.
    pub fn staged_seal_count(&self) -> usize {
        self.staged_seals.len()
    }

    /// Object bytes of the seals staged and not written yet.
    pub fn staged_seal_bytes(&self) -> u64 {
        self.staged_seals
            .values()
            .map(|o| o.data_size + o.metadata_size)
            .sum()
    }

    /// Whether removals or moves to the spill tier are staged (they must be committed before
    /// the freed space is reused, and memory waits for them).
    pub fn has_staged_removals(&self) -> bool {
        !self.staged_removals.is_empty() || !self.staged_spilled.is_empty()
    }

    /// Whether anything is staged.
    pub fn has_staged(&self) -> bool {
        !self.staged_seals.is_empty()
            || !self.staged_removals.is_empty()
            || !self.staged_spilled.is_empty()
    }

    /// Objects with a written record.
    pub fn recorded_count(&self) -> usize {
        self.recorded.len()
    }

    /// Writes every staged change, not synced: the removals' slots are zeroed, each staged
    /// seal gets a record in a free slot. Durable only after [`SlotIndex::sync`].
    pub fn write_staged(&mut self) -> Result<WriteStats, S::Error> {
        self.reserve_for_staged()?;
        let removals = self.write_removals()?;
        let seals = std::mem::take(&mut self.staged_seals);
        let spilled = std::mem::take(&mut self.staged_spilled);
        let mut stats = WriteStats { seals: 0, removals };
        for object in seals.into_values() {
            let record = Record {
                seq: self.next_seq,
                object,
            };
            self.write_record(object.id, &record.encode())?;
            stats.seals += 1;
        }
        for object in spilled.into_values() {
            let record = SpilledRecord {
                seq: self.next_seq,
                object,
            };
            self.write_record(object.id, &record.encode())?;
            stats.seals += 1;
        }
        Ok(stats)
    }

    /// Writes the next record of `id` to a free slot; the slot of its record before, if any,
    /// is zeroed once this one is durable.
    fn write_record(&mut self, id: ObjectId, bytes: &[u8; RECORD_BYTES]) -> Result<(), S::Error> {
        let slot = self.take_free_slot()?;
        self.next_seq += 1;
        self.write_slot(slot, bytes)?;
        if let Some(old) = self.recorded.insert(id, slot) {
            self.replaced_slots.push(old);
        }
        Ok(())
    }

    /// Grows the index until every staged seal has a free slot, before anything is written:
    /// when the medium cannot grow (a full file system), the error leaves the index and what
    /// is staged as they were, and the commit can be tried again once there is room.
    pub fn reserve_for_staged(&mut self) -> Result<(), S::Error> {
        let staged = (self.staged_seals.len() + self.staged_spilled.len()) as u64;
        let missing = staged.saturating_sub(self.free_slots.len() as u64);
        if missing > 0 {
            self.grow_by_at_least(missing)?;
        }
        Ok(())
    }

    /// Doubles the slot table (as often as needed) until it has `slots` more slots. On an
    /// error nothing changed.
    fn grow_by_at_least(&mut self, slots: u64) -> Result<(), S::Error> {
        let mut grown = (self.slot_count * 2).max(INITIAL_SLOTS);
        while grown - self.slot_count < slots {
            grown *= 2;
        }
        self.storage.set_len(slot_offset(grown))?;
        self.free_slots.extend(self.slot_count..grown);
        self.slot_count = grown;
        Ok(())
    }

    /// The barrier: everything written is durable; zeroed slots become free. Records replaced
    /// by what was written are zeroed after it, with a second barrier.
    pub fn sync(&mut self) -> Result<(), S::Error> {
        self.storage.sync()?;
        let freed = std::mem::take(&mut self.free_slots_after_sync);
        self.free_slots.extend(freed);
        if self.replaced_slots.is_empty() {
            return Ok(());
        }
        let replaced = std::mem::take(&mut self.replaced_slots);
        for &slot in &replaced {
            self.write_slot(slot, &[0; RECORD_BYTES])?;
        }
        self.free_slots_after_sync.extend(replaced);
        self.sync()
    }

    /// Writes and syncs every staged change (the caller flushed the staged seals' data).
    pub fn commit(&mut self) -> Result<WriteStats, S::Error> {
        if !self.has_staged() {
            return Ok(WriteStats::default());
        }
        let stats = self.write_staged()?;
        self.sync()?;
        Ok(stats)
    }

    /// Makes only the staged removals durable (before the freed space is reused).
    pub fn commit_removals(&mut self) -> Result<u64, S::Error> {
        let removals = self.write_removals()?;
        if removals > 0 {
            self.sync()?;
        }
        Ok(removals)
    }

    /// The medium.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The medium, for drivers that model it (the simulator's crash).
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Gives the medium back (the in-memory state is dropped, as in a crash).
    pub fn into_storage(self) -> S {
        self.storage
    }

    /// Zeroes the staged removals' slots (not yet synced). The slots stay out of the free set
    /// until the sync: a slot is reused only once its removal is durable.
    fn write_removals(&mut self) -> Result<u64, S::Error> {
        let slots = std::mem::take(&mut self.staged_removals);
        for &slot in &slots {
            self.write_slot(slot, &[0; RECORD_BYTES])?;
        }
        self.free_slots_after_sync.extend(slots.iter().copied());
        Ok(slots.len() as u64)
    }

    fn take_free_slot(&mut self) -> Result<u64, S::Error> {
        loop {
            if let Some(slot) = self.free_slots.pop_first() {
                return Ok(slot);
            }
            // Not reached after `reserve_for_staged`; kept so the table stays whole regardless.
            self.grow_by_at_least(1)?;
        }
    }

    fn write_slot(&mut self, slot: u64, bytes: &[u8; RECORD_BYTES]) -> Result<(), S::Error> {
        self.storage.write_at(slot_offset(slot), bytes)
    }
}
