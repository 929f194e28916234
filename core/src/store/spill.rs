//! The spill tier of a store: sealed objects nobody holds go to local disk instead of being
//! forgotten when memory is needed, and come back on `get`.
//!
//! States of a sealed object (see [`StorageTier`]):
//! * **memory**: in the table, as without a spill tier;
//! * **spilling**: a [`StoreOutput::Spill`] write of its bytes is out; the object stays in
//!   memory, readable, and pinned (neither evicted nor freed) until the driver reports the write
//!   with [`Store::handle_spill_done`]. Only then is its memory freed: a spilled object's bytes
//!   are always somewhere;
//! * **spilled**: its bytes are only in the driver's spill record; it is still present
//!   (`contains`, `list`, stat, locate; it stays published);
//! * **restoring**: a `get` (or a peer's fetch) asked for it; a block is allocated (spilling or
//!   evicting others as needed), a [`StoreOutput::Restore`] read is out, and the object is back
//!   in the table, unsealed and pinned, until [`Store::handle_restore_done`] seals it again.
//!   Concurrent gets share the one restore.
//!
//! A restored object keeps its record (objects never change): it is **in memory with a clean
//! record**, and when memory is needed again it goes back to spilled without a second write:
//! the store sends a `Spill` of the same record (same [`SpillOpId`]), which the driver
//! completes without writing, and frees the memory at that completion like any other (so an
//! output of the same pass that still reads the object, an eager send, is carried out first). The record is discarded when the object is deleted or evicted, or
//! when the tier needs its space for a write.
//!
//! Spilling runs ahead of demand: while free memory (with what spill writes in flight will
//! free) is below [`SPILL_AHEAD_FRACTION`] of the capacity, the least recently used unheld
//! objects are spilled (or dropped to their clean records) before anyone asks, so a `create` or
//! a restore finds memory free instead of waiting for a write. Spilling ahead never evicts.
//!
//! Rules: unheld copies of record ([`Store::hold_as_record`]) are spilled first, least recently
//! used first: they can never be evicted, so the tier's room goes to them before cache copies,
//! which can. Then the least recently used unheld sealed object is spilled; an object is
//! evicted (forgotten) only when the spill tier cannot take it (its limit reached, or the last
//! write failed for lack of space or an IO error, until space is given back), and a copy of
//! record never is: it stays in memory. A spilled copy of record is still held as one. A restore whose record
//! is damaged or missing reports the object lost (withdrawn like a delete), never other bytes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use serde::{Deserialize, Serialize};

use self::held_for_gets::HeldForGets;
use super::recovery::{RecoveredSpilled, RecoveryRefusal, RefusedSpilled, SpilledRecoveryReport};
use super::table::{Entry, Lru};
use super::{DurableChange, ObjectEvent, Store, StoreOutput};
use crate::digest::ContentDigest;
use crate::error::StoreError;
use crate::ids::ObjectId;
use crate::time::Instant;

/// Spill writes run ahead of demand while free memory is below capacity ÷ this (see the
/// module doc).
pub const SPILL_AHEAD_FRACTION: u64 = 8;

/// Objects a tier closed by a failed write evicts before it tries one write again (a failure
/// may be passing: an IO error, or space another program freed). Each failed try doubles the
/// count, up to [`REOPEN_AFTER_MAX_EVICTIONS`]; a write that succeeds sets it back.
pub const REOPEN_AFTER_EVICTIONS: u64 = 64;
/// The most a closed tier evicts between two tries.
pub const REOPEN_AFTER_MAX_EVICTIONS: u64 = 4096;

/// Reads a restore tries before an IO error loses its object: a read error may pass (a
/// transient device or controller error), a missing or damaged record does not.
pub const RESTORE_READ_TRIES: u32 = 3;

/// Entries of deleted objects the restore queue may keep beyond as many as it has waiting
/// ones (see `SpillTier::compact_restore_queue`).
const RESTORE_QUEUE_SLACK: usize = 64;

/// One spill write, named in its completion and, while the record lives, in the restores and
/// the discard of that record.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize, Default,
)]
pub struct SpillOpId(pub u64);

impl fmt::Display for SpillOpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spill-{}", self.0)
    }
}

/// Where a completed spill write put an object's record, in the driver's terms (a file and an
/// offset in it): what a persistent store's index records, so a restart finds the record again.
/// The core only carries it from [`Store::handle_spill_done`] to [`DurableChange::Spilled`] and
/// back from recovery; the driver gives it its meaning.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize, Default,
)]
pub struct SpillPlace {
    /// The file.
    pub file: u32,
    /// Where the record starts in it.
    pub offset: u64,
}

impl fmt::Display for SpillPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file {} at {}", self.file, self.offset)
    }
}

/// Where an object's bytes are.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, Default)]
pub enum StorageTier {
    /// In memory only.
    #[default]
    Memory,
    /// In memory, being written to the spill tier.
    Spilling,
    /// On disk only.
    Spilled,
    /// Being read back from disk into memory.
    Restoring,
}

impl StorageTier {
    /// The name `list` shows.
    pub fn name(self) -> &'static str {
        match self {
            StorageTier::Memory => "memory",
            StorageTier::Spilling => "spilling",
            StorageTier::Spilled => "spilled",
            StorageTier::Restoring => "restoring",
        }
    }
}

/// Why a spill write failed. The object stays in memory; the tier takes no more writes until
/// space is given back, so the store evicts instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SpillError {
    /// The disk (or the configured limit) is full (`ENOSPC`, `EDQUOT`).
    #[error("no space left for spilling")]
    NoSpace,
    /// Any other failure of the write (the syscall and its error).
    #[error("spill write failed: {reason}")]
    Io {
        /// What failed.
        reason: String,
    },
}

/// Why a restore failed: the object is lost (reported as deleted), never served with other
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RestoreError {
    /// The spill record (or its file) is gone.
    #[error("spill record missing")]
    Missing,
    /// The bytes read do not match the record's checksum.
    #[error("spill record damaged (checksum mismatch)")]
    Damaged,
    /// The read failed (the syscall and its error).
    #[error("spill read failed: {reason}")]
    Io {
        /// What failed.
        reason: String,
    },
}

/// A sealed object whose bytes are on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SpilledObject {
    /// The write that made its record.
    pub(super) op: SpillOpId,
    /// Where the driver put the record.
    pub(super) place: SpillPlace,
    pub(super) data_size: u64,
    pub(super) metadata_size: u64,
    pub(super) digest: Option<ContentDigest>,
    pub(super) created_at: Instant,
    /// Held as a copy of record (see [`Store::hold_as_record`]).
    pub(super) record: bool,
}

impl SpilledObject {
    fn len(&self) -> u64 {
        self.data_size + self.metadata_size
    }
}

/// A spill write or a restore read the driver has not reported yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    /// A write; `clean` holds the record the object already has (a write of the same record
    /// the driver needs not repeat, sent only so the memory is freed at its completion, after
    /// whatever output still reads it has been carried out).
    Spill {
        id: ObjectId,
        len: u64,
        clean: Option<SpilledObject>,
    },
    Restore {
        id: ObjectId,
        /// Reads of this restore that failed with an IO error so far.
        failed_reads: u32,
    },
}

/// Counters of the spill tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpillStats {
    /// The tier's limit in bytes (0: no spill tier).
    pub limit_bytes: u64,
    /// Objects on disk only now.
    pub spilled_objects: u64,
    /// Their bytes (data + metadata).
    pub spilled_bytes: u64,
    /// Bytes being written now (still in memory).
    pub spilling_bytes: u64,
    /// Restores in progress now.
    pub restores_in_flight: u64,
    /// Restores waiting for memory now.
    pub restores_queued: u64,
    /// Spill writes completed since start.
    pub spills_total: u64,
    /// Bytes they wrote.
    pub spilled_bytes_total: u64,
    /// Restores completed since start.
    pub restores_total: u64,
    /// Bytes they read.
    pub restored_bytes_total: u64,
    /// Spill writes that failed for lack of space.
    pub spill_no_space_total: u64,
    /// Spill writes that failed otherwise.
    pub spill_errors_total: u64,
    /// Objects lost because their record was missing, damaged or unreadable.
    pub objects_lost_total: u64,
    /// Restore reads tried again after an IO error.
    pub restore_read_retries_total: u64,
    /// Objects evicted (forgotten) while a spill tier exists, because it could not take them.
    pub evicted_spill_full_total: u64,
    /// Whether the tier takes no writes now (after a failure, until space is given back or
    /// it tries again, see [`REOPEN_AFTER_EVICTIONS`]).
    pub full: bool,
    /// Writes tried again by a tier closed by a failure.
    pub reopen_tries_total: u64,
    /// Objects in memory whose record is still on disk (restored, unchanged).
    pub clean_records: u64,
    /// Their bytes on disk.
    pub clean_record_bytes: u64,
    /// Objects moved back to disk without a write (their record was clean) since start.
    pub reclaimed_clean_total: u64,
    /// Spilled objects a persistent store's index named at start whose record was missing,
    /// damaged or not taken back: lost before anyone asked (the driver counts them, see
    /// [`Store::count_spilled_lost_at_start`]).
    pub lost_at_start_total: u64,
}

/// The spill tier's bookkeeping.
#[derive(Debug, Default)]
pub(super) struct SpillTier {
    limit_bytes: u64,
    spilled: BTreeMap<ObjectId, SpilledObject>,
    spilled_bytes: u64,
    spilling_bytes: u64,
    /// Records of objects back in memory (restored, or taken while their write was out).
    clean: BTreeMap<ObjectId, SpilledObject>,
    clean_bytes: u64,
    in_flight: BTreeMap<SpillOpId, InFlight>,
    /// The operation in flight for each object.
    by_object: BTreeMap<ObjectId, SpillOpId>,
    /// Restores waiting for memory, oldest first, each with its place in line. An entry whose
    /// object is no longer in `queued_set` with that place (deleted meanwhile) is skipped
    /// when it comes to the front, so a delete does not search the line.
    queued: VecDeque<(u64, ObjectId)>,
    /// The objects waiting, with their place in `queued`.
    queued_set: BTreeMap<ObjectId, u64>,
    /// Places in line given so far.
    queued_total: u64,
    /// Objects pinned for the gets that wait for others (a batch completes only once all its
    /// objects are back; until then one in memory must not go back to disk).
    held_for_gets: HeldForGets,
    /// A write failed: take none until a record is given back, or until `reopen_after`
    /// evictions have been made for lack of it (then one write is tried again).
    full: bool,
    /// Evictions made since the tier closed.
    evictions_while_full: u64,
    /// Evictions to make before the next try (0 while no write failed since the last success).
    reopen_after: u64,
    /// Persistent mode: discards held until the durable changes queued before them are
    /// durable (by the sequence number of the last such change), so no durable record names a
    /// record that is gone.
    held_discards: VecDeque<(u64, SpillOpId, ObjectId)>,
    /// Persistent mode: the durable changes up to here are durable.
    durable_upto: u64,
    next_op: u64,
    stats: SpillStats,
}

impl SpillTier {
    pub(super) fn new(limit_bytes: u64) -> Self {
        Self {
            limit_bytes,
            ..Self::default()
        }
    }

    fn can_take(&self, len: u64) -> bool {
        !self.full
            && self.spilled_bytes + self.clean_bytes + self.spilling_bytes + len <= self.limit_bytes
    }

    /// A write failed: the tier closes, for twice as many evictions as last time (writes
    /// that were in flight with it and fail too change nothing more).
    fn close(&mut self) {
        if self.full {
            return;
        }
        self.full = true;
        self.evictions_while_full = 0;
        self.reopen_after =
            (self.reopen_after * 2).clamp(REOPEN_AFTER_EVICTIONS, REOPEN_AFTER_MAX_EVICTIONS);
    }

    /// An object was evicted because the tier could not take it: a closed tier that has
    /// evicted enough opens for one more try.
    fn evicted_while_closed(&mut self) {
        self.stats.evicted_spill_full_total += 1;
        if !self.full {
            return;
        }
        self.evictions_while_full += 1;
        if self.evictions_while_full >= self.reopen_after {
            self.full = false;
            self.stats.reopen_tries_total += 1;
        }
    }

    /// Bytes the tier can take in new writes now.
    fn room_bytes(&self) -> u64 {
        if self.full {
            return 0;
        }
        self.limit_bytes
            .saturating_sub(self.spilled_bytes + self.clean_bytes + self.spilling_bytes)
    }

    fn give_back(&mut self, object: &SpilledObject) {
        self.spilled_bytes -= object.len();
        self.full = false;
    }

    /// Drops the entries of deleted objects from the restore queue once they outnumber the
    /// waiting ones (by a margin): the queue stays O(waiting) long at O(1) amortized a delete.
    fn compact_restore_queue(&mut self) {
        if self.queued.len() > 2 * self.queued_set.len() + RESTORE_QUEUE_SLACK {
            let waiting = &self.queued_set;
            self.queued
                .retain(|(place, id)| waiting.get(id) == Some(place));
        }
    }

    /// Takes the clean record of `id` (in memory), giving its space back.
    fn take_clean(&mut self, id: &ObjectId) -> Option<SpilledObject> {
        let record = self.clean.remove(id)?;
        self.clean_bytes -= record.len();
        self.full = false;
        Some(record)
    }
}

impl Store {
    /// Whether this store has a spill tier.
    pub fn spill_enabled(&self) -> bool {
        self.spill.is_some()
    }

    /// Bytes that will be free without evicting anything more: blocks of removals waiting to
    /// be durable, and objects being spilled. A `create` that fails while some are pending may
    /// wait for them rather than fail.
    pub fn pending_free_bytes(&self) -> u64 {
        self.quarantined_bytes + self.spilling_bytes()
    }

    pub(super) fn spilling_bytes(&self) -> u64 {
        self.spill.as_ref().map_or(0, |tier| tier.spilling_bytes)
    }

    /// Whether `id` is sealed and on disk only (restoring or not).
    pub fn is_spilled(&self, id: &ObjectId) -> bool {
        self.spill
            .as_ref()
            .is_some_and(|tier| tier.spilled.contains_key(id))
    }

    /// Where the bytes of a present object are, or `None` when it is not here.
    pub fn tier(&self, id: &ObjectId) -> Option<StorageTier> {
        let tier = self.spill.as_ref();
        let in_flight = tier
            .and_then(|t| t.by_object.get(id))
            .and_then(|op| tier?.in_flight.get(op).copied());
        match in_flight {
            Some(InFlight::Spill { .. }) => return Some(StorageTier::Spilling),
            Some(InFlight::Restore { .. }) => return Some(StorageTier::Restoring),
            None => {}
        }
        if self.is_spilled(id) {
            return Some(StorageTier::Spilled);
        }
        self.objects.contains(id).then_some(StorageTier::Memory)
    }

    /// The sizes and digest of a spilled object.
    pub fn spilled_sizes(&self, id: &ObjectId) -> Option<(u64, u64, Option<ContentDigest>)> {
        let object = self.spill.as_ref()?.spilled.get(id)?;
        Some((object.data_size, object.metadata_size, object.digest))
    }

    /// The spill tier's counters and gauges (all zero without one).
    pub fn spill_stats(&self) -> SpillStats {
        let Some(tier) = self.spill.as_ref() else {
            return SpillStats::default();
        };
        SpillStats {
            limit_bytes: tier.limit_bytes,
            spilled_objects: tier.spilled.len() as u64,
            spilled_bytes: tier.spilled_bytes,
            spilling_bytes: tier.spilling_bytes,
            restores_in_flight: tier
                .in_flight
                .values()
                .filter(|f| matches!(f, InFlight::Restore { .. }))
                .count() as u64,
            restores_queued: tier.queued_set.len() as u64,
            full: tier.full,
            clean_records: tier.clean.len() as u64,
            clean_record_bytes: tier.clean_bytes,
            ..tier.stats.clone()
        }
    }

    /// Frees memory held by an unheld object: spills the least recently used copy of record
    /// when the tier can take it, else the least recently used other object, which is evicted
    /// when the tier cannot take it either (the memory of a spilled one is freed when the write
    /// completes). `None` when nothing unheld can go.
    pub(super) fn reclaim_one(&mut self) -> Option<u64> {
        for list in [Lru::Record, Lru::Evictable] {
            if let Some(id) = self.objects.lru_front(list) {
                if let Some(block_len) = self.try_spill(id) {
                    return Some(block_len);
                }
            }
        }
        self.objects.lru_front(Lru::Evictable)?;
        if let Some(tier) = self.spill.as_mut() {
            tier.evicted_while_closed();
        }
        self.evict_one()
    }

    /// Sends `id` (unheld, in memory) to the spill tier: back to its clean record, or in a new
    /// write. Returns the block that frees, or `None` when the tier cannot take it.
    fn try_spill(&mut self, id: ObjectId) -> Option<u64> {
        let entry = self.objects.get(&id).expect("LRU entries are in the table");
        let len = entry.data_size + entry.metadata_size;
        let block_len = entry.block().len;
        if self.back_to_clean_record(id) {
            return Some(block_len);
        }
        self.make_room_for_write(len);
        let takes = self.spill.as_ref().is_some_and(|tier| tier.can_take(len));
        if !takes {
            return None;
        }
        self.start_spill(id);
        Some(block_len)
    }

    /// Sets or clears the copy-of-record hold of a spilled object (and, while it is being
    /// restored, of its entry). False when `id` is not spilled.
    pub(super) fn hold_spilled_as_record(&mut self, id: ObjectId, record: bool) -> bool {
        let Some(object) = self
            .spill
            .as_mut()
            .and_then(|tier| tier.spilled.get_mut(&id))
        else {
            return false;
        };
        object.record = record;
        if let Some(entry) = self.objects.get_mut(&id) {
            // Restoring: unsealed and pinned, in no LRU list until it is back.
            entry.record = record;
        }
        true
    }

    /// Whether `id` is spilled and held as a copy of record.
    pub(super) fn is_spilled_record(&self, id: &ObjectId) -> bool {
        self.spill
            .as_ref()
            .and_then(|tier| tier.spilled.get(id))
            .is_some_and(|object| object.record)
    }

    /// Bytes of unheld copies of record in memory that spilling could free now (at most what
    /// the tier has room for, or holds as clean records); none without a spill tier.
    pub fn spillable_record_bytes(&self) -> u64 {
        let Some(tier) = self.spill.as_ref() else {
            return 0;
        };
        self.record_lru_bytes
            .min(tier.room_bytes().saturating_add(tier.clean_bytes))
    }

    /// The blocks of unheld copies of record in memory the tier could take now (those with a
    /// clean record need no room), for [`Store::could_hold`]; none without a spill tier.
    pub(super) fn spillable_record_blocks(&self) -> Vec<crate::region::LocalRegion> {
        let Some(tier) = self.spill.as_ref() else {
            return Vec::new();
        };
        if self.record_lru_bytes == 0 {
            return Vec::new();
        }
        let mut room = tier.room_bytes();
        let mut blocks = Vec::new();
        for entry in self.objects.iter() {
            if entry.lru() != Some(Lru::Record) {
                continue;
            }
            let len = entry.data_size + entry.metadata_size;
            if tier.clean.contains_key(&entry.id) {
                blocks.push(entry.block());
            } else if len <= room {
                room -= len;
                blocks.push(entry.block());
            }
        }
        blocks
    }

    /// Sends `id` (unheld, in memory) back to its clean record: a `Spill` of that record, which
    /// the driver completes without a write. False when it has no clean record.
    fn back_to_clean_record(&mut self, id: ObjectId) -> bool {
        let Some(record) = self.spill.as_mut().and_then(|tier| tier.take_clean(&id)) else {
            return false;
        };
        let block_len = self
            .objects
            .get(&id)
            .expect("reclaimed from the table")
            .block()
            .len;
        let tier = self.spill.as_mut().expect("the record came from the tier");
        // In flight it counts its block, a few bytes more than its record: past the limit, the
        // record goes and the object is written (or evicted) as one without.
        if tier.spilled_bytes + tier.clean_bytes + tier.spilling_bytes + block_len
            > tier.limit_bytes
        {
            self.discard_record(record.op, id);
            return false;
        }
        tier.stats.reclaimed_clean_total += 1;
        self.start_spill_as(id, record.op, Some(record));
        true
    }

    /// Discards clean records (their objects stay in memory) until a write of `len` bytes fits
    /// the limit, or none is left.
    fn make_room_for_write(&mut self, len: u64) {
        loop {
            let Some(tier) = self.spill.as_mut() else {
                return;
            };
            if tier.full
                || tier.spilled_bytes + tier.clean_bytes + tier.spilling_bytes + len
                    <= tier.limit_bytes
            {
                return;
            }
            let Some(&id) = tier.clean.keys().next() else {
                return;
            };
            let record = tier.take_clean(&id).expect("just found");
            self.discard_record(record.op, id);
        }
    }

    /// An object leaves memory for good (deleted or evicted): its clean record, if any, goes.
    pub(super) fn forget_clean_record(&mut self, id: ObjectId) {
        if let Some(record) = self.spill.as_mut().and_then(|tier| tier.take_clean(&id)) {
            self.discard_record(record.op, id);
        }
    }

    /// Spills (or drops to clean records) the least recently used unheld objects while free
    /// memory, with what spill writes in flight will free, is below the spill-ahead mark; never
    /// evicts.
    fn spill_ahead(&mut self) {
        let Some(tier) = self.spill.as_ref() else {
            return;
        };
        if tier.limit_bytes == 0 {
            return;
        }
        let mark = self.allocator.capacity_bytes() / SPILL_AHEAD_FRACTION;
        while self.allocator.free_bytes() + self.pending_free_bytes() < mark {
            let spilled = [Lru::Record, Lru::Evictable].into_iter().any(|list| {
                self.objects
                    .lru_front(list)
                    .is_some_and(|id| self.try_spill(id).is_some())
            });
            if !spilled {
                return;
            }
        }
    }

    fn start_spill(&mut self, id: ObjectId) {
        let tier = self.spill.as_mut().expect("spilling needs a tier");
        tier.next_op += 1;
        let op = SpillOpId(tier.next_op);
        self.start_spill_as(id, op, None);
    }

    fn start_spill_as(&mut self, id: ObjectId, op: SpillOpId, clean: Option<SpilledObject>) {
        let entry = self.objects.get_mut(&id).expect("spilled from the table");
        // The write reads the object's memory: pinned until it completes.
        entry.pin_count += 1;
        let info = entry.info();
        let digest = entry.digest();
        let tier = self.spill.as_mut().expect("spilling needs a tier");
        tier.spilling_bytes += info.region.len;
        tier.in_flight.insert(
            op,
            InFlight::Spill {
                id,
                len: info.region.len,
                clean,
            },
        );
        tier.by_object.insert(id, op);
        self.settle(id);
        self.outputs.push_back(StoreOutput::Spill {
            op,
            id,
            region: info.region,
            digest,
        });
    }

    /// The driver finished the spill write `op`. On success the object's memory is freed (it
    /// is spilled) unless someone took it meanwhile (then the record is discarded and it stays
    /// in memory); on failure it stays in memory and the tier takes no more writes until space
    /// is given back.
    ///
    /// In persistent mode ([`StoreConfig::record_durable_changes`](super::StoreConfig)) the
    /// spilled object's record becomes [`DurableChange::Spilled`] at `place`, and its block is
    /// freed only once that change is durable: after a crash the index names the object either
    /// in memory (its block untouched) or in the spill file (written before this completion).
    pub fn handle_spill_done(&mut self, op: SpillOpId, result: Result<SpillPlace, SpillError>) {
        let Some(tier) = self.spill.as_mut() else {
            return;
        };
        let Some(InFlight::Spill { id, len, clean }) = tier.in_flight.get(&op).copied() else {
            return; // not a spill of ours: a driver bug, but nothing to undo
        };
        tier.in_flight.remove(&op);
        tier.by_object.remove(&id);
        tier.spilling_bytes -= len;
        match (&result, clean) {
            (Err(_), Some(record)) => {
                // The record on disk is as it was: the object stays in memory, clean.
                tier.clean_bytes += record.len();
                tier.clean.insert(id, record);
            }
            (Ok(_), Some(_)) => {}
            (Ok(_), None) => {
                tier.stats.spills_total += 1;
                tier.stats.spilled_bytes_total += len;
                tier.reopen_after = 0;
            }
            (Err(SpillError::NoSpace), None) => {
                tier.stats.spill_no_space_total += 1;
                tier.close();
            }
            (Err(SpillError::Io { .. }), None) => {
                tier.stats.spill_errors_total += 1;
                tier.close();
            }
        }
        let entry = self
            .objects
            .get_mut(&id)
            .expect("a spilling object is pinned in the table");
        assert!(entry.pin_count > 0, "spilling {id} is pinned");
        entry.pin_count -= 1;
        let unheld = entry.ref_count == 0 && entry.pin_count == 0 && !entry.delete_pending;
        let place = match (result, clean) {
            (Err(_), _) => {
                self.settle(id);
                return;
            }
            // The record written before: where it was.
            (Ok(_), Some(record)) => record.place,
            (Ok(place), None) => place,
        };
        let spilled = SpilledObject {
            op,
            place,
            data_size: entry.data_size,
            metadata_size: entry.metadata_size,
            digest: entry.digest(),
            created_at: entry.created_at,
            record: entry.record,
        };
        if !unheld {
            // Taken (or deleted) meanwhile: it stays in memory, its record kept clean for the
            // next time memory is needed (discarded when it is being deleted).
            if entry.delete_pending {
                self.discard_record(op, id);
            } else {
                let tier = self.spill.as_mut().expect("checked above");
                tier.clean_bytes += spilled.len();
                tier.clean.insert(id, spilled);
            }
            self.settle(id);
            return;
        }
        // Out of memory, still present: no notification, it stays published.
        self.remove_spilled_from_memory(id, &spilled);
        let tier = self.spill.as_mut().expect("checked above");
        tier.spilled_bytes += spilled.len();
        tier.spilled.insert(id, spilled);
    }

    /// Frees the memory of `id`, spilled as `spilled`. In persistent mode its record becomes
    /// the spilled one, and the block waits (as a removed object's does) until that is durable.
    fn remove_spilled_from_memory(&mut self, id: ObjectId, spilled: &SpilledObject) {
        if !self.config.record_durable_changes {
            self.remove_object(id, false);
            return;
        }
        let change = DurableChange::Spilled {
            id,
            place: spilled.place,
            data_size: spilled.data_size,
            metadata_size: spilled.metadata_size,
        };
        self.remove_object_recording(id, false, change);
    }

    /// Discards record `op` of `id`; in persistent mode only once every durable change queued
    /// so far is durable (one of them may be what stops the index naming the record).
    fn discard_record(&mut self, op: SpillOpId, id: ObjectId) {
        let queued = self.durable_changes_queued;
        let persistent = self.config.record_durable_changes;
        let tier = self.spill.as_mut().expect("records belong to the tier");
        if persistent && queued > tier.durable_upto {
            tier.held_discards.push_back((queued, op, id));
        } else {
            self.outputs
                .push_back(StoreOutput::DiscardSpilled { op, id });
        }
    }

    /// Durable changes up to `upto` are durable: discards that waited for them go out.
    pub(super) fn release_held_discards(&mut self, upto: u64) {
        let Some(tier) = self.spill.as_mut() else {
            return;
        };
        tier.durable_upto = tier.durable_upto.max(upto);
        while let Some(&(seq, op, id)) = tier.held_discards.front() {
            if seq > upto {
                break;
            }
            tier.held_discards.pop_front();
            self.outputs
                .push_back(StoreOutput::DiscardSpilled { op, id });
        }
    }

    /// Spilled objects a persistent store's index named at restart go back into the tier, as
    /// spilled (their bytes stay in the driver's files until a `get` restores them). Each gets
    /// a new [`SpillOpId`] that names its record from now on: the driver maps it to the
    /// record's place with [`SpilledRecoveryReport::adopted`]. Announced like recovered
    /// objects (`Local(Sealed)`, so the node publishes them), no durable change queued.
    pub fn recover_spilled(
        &mut self,
        now: Instant,
        records: impl IntoIterator<Item = (RecoveredSpilled, Option<ContentDigest>)>,
    ) -> SpilledRecoveryReport {
        let mut report = SpilledRecoveryReport::default();
        for (index, (record, digest)) in records.into_iter().enumerate() {
            match self.recover_spilled_one(now, record, digest) {
                Ok(op) => {
                    report.recovered_objects += 1;
                    report.recovered_bytes += record.data_size + record.metadata_size;
                    report.adopted.push((op, record));
                }
                Err(reason) => report.refused.push(RefusedSpilled {
                    index,
                    record,
                    reason,
                }),
            }
        }
        report
    }

    fn recover_spilled_one(
        &mut self,
        now: Instant,
        record: RecoveredSpilled,
        digest: Option<ContentDigest>,
    ) -> Result<SpillOpId, RecoveryRefusal> {
        let RecoveredSpilled {
            id,
            place,
            data_size,
            metadata_size,
        } = record;
        if self.objects.contains(&id) || self.is_spilled(&id) {
            return Err(RecoveryRefusal::DuplicateId);
        }
        let Some(len) = data_size
            .checked_add(metadata_size)
            .filter(|&len| crate::alloc::block_len_for(len).is_some())
        else {
            return Err(RecoveryRefusal::SizeMismatch);
        };
        let Some(tier) = self.spill.as_mut() else {
            return Err(RecoveryRefusal::NoSpillTier);
        };
        if tier.spilled_bytes + tier.clean_bytes + tier.spilling_bytes + len > tier.limit_bytes {
            return Err(RecoveryRefusal::SpillLimit);
        }
        tier.next_op += 1;
        let op = SpillOpId(tier.next_op);
        tier.spilled_bytes += len;
        tier.spilled.insert(
            id,
            SpilledObject {
                op,
                place,
                data_size,
                metadata_size,
                digest,
                created_at: now,
                record: false,
            },
        );
        self.notify(ObjectEvent::Sealed {
            id,
            data_size,
            metadata_size,
        });
        Ok(op)
    }

    /// The driver found `objects` spilled objects of a persistent store's index lost at start
    /// (their records missing or damaged, or refused by [`Store::recover_spilled`]); counted in
    /// [`SpillStats::lost_at_start_total`]. Nothing else changes: they never came back.
    pub fn count_spilled_lost_at_start(&mut self, objects: u64) {
        if let Some(tier) = self.spill.as_mut() {
            tier.stats.lost_at_start_total += objects;
        }
    }

    /// Asks for a spilled object to be brought back (for a `get` or a peer's fetch); several
    /// asks share one restore. Nothing happens for an object not spilled.
    pub fn request_restore(&mut self, id: ObjectId) {
        let Some(tier) = self.spill.as_ref() else {
            return;
        };
        if !tier.spilled.contains_key(&id)
            || tier.by_object.contains_key(&id)
            || tier.queued_set.contains_key(&id)
        {
            return;
        }
        if !self.start_restore(id) {
            let tier = self.spill.as_mut().expect("checked above");
            tier.queued_total += 1;
            tier.queued.push_back((tier.queued_total, id));
            tier.queued_set.insert(id, tier.queued_total);
        }
    }

    /// Starts restores waiting for memory, oldest first, while memory can be found, then spills
    /// ahead of demand (see the module doc). Call after anything that may free or take memory
    /// (the node does after every input).
    pub fn retry_restores(&mut self) {
        self.release_held_for_gets();
        while let Some(&(place, id)) = self.spill.as_ref().and_then(|tier| tier.queued.front()) {
            let tier = self.spill.as_mut().expect("a queue needs a tier");
            if tier.queued_set.get(&id) != Some(&place) {
                // Deleted while it waited.
                tier.queued.pop_front();
                continue;
            }
            if !self.start_restore(id) {
                break;
            }
            let tier = self.spill.as_mut().expect("a queue needs a tier");
            tier.queued.pop_front();
            tier.queued_set.remove(&id);
            tier.compact_restore_queue();
        }
        self.spill_ahead();
    }

    /// The objects of a get that are in memory now, to hold while it waits for the others
    /// (none without a spill tier: nothing then takes them away but an eviction, as before).
    pub(super) fn objects_to_hold_for_get(
        &self,
        ids: &[ObjectId],
        unsealed: &BTreeSet<ObjectId>,
    ) -> Vec<ObjectId> {
        if self.spill.is_none() {
            return Vec::new();
        }
        ids.iter()
            .copied()
            .filter(|id| !unsealed.contains(id))
            .collect()
    }

    /// A get waits for some of its objects: those it found in memory are pinned until it
    /// completes, so the restores it waits for do not push them back to disk (it answers only
    /// once all are here, and would find them gone).
    pub(super) fn hold_for_get(&mut self, waiter: super::waiters::WaiterId, ids: Vec<ObjectId>) {
        for id in ids {
            self.hold_for(id, waiter);
        }
    }

    /// Pins `id` (once, however many gets hold it) for `waiter`.
    fn hold_for(&mut self, id: ObjectId, waiter: super::waiters::WaiterId) {
        let Some(tier) = self.spill.as_mut() else {
            return;
        };
        let Some(entry) = self.objects.get_mut(&id) else {
            return;
        };
        if !entry.sealed {
            return;
        }
        if tier.held_for_gets.hold(id, waiter) {
            entry.pin_count += 1;
        }
        self.settle(id);
    }

    /// A get completed or went: what it held is released at the next
    /// [`Store::retry_restores`] if no other get holds it.
    pub(super) fn waiter_gone(&mut self, waiter: super::waiters::WaiterId) {
        if let Some(tier) = self.spill.as_mut() {
            tier.held_for_gets.waiter_gone(waiter);
        }
    }

    /// Unpins objects held for gets that have all completed (or gone), in id order.
    fn release_held_for_gets(&mut self) {
        let Some(tier) = self.spill.as_mut() else {
            return;
        };
        let waiters = &self.waiters;
        let released = tier
            .held_for_gets
            .take_released(|waiter| waiters.contains_key(waiter));
        for id in released {
            if let Some(entry) = self.objects.get_mut(&id) {
                assert!(entry.pin_count > 0, "{id} held for gets is pinned");
                entry.pin_count -= 1;
                self.settle(id);
            }
        }
    }

    /// Allocates the object's block and sends the read; false when it must wait for memory.
    /// With no memory to wait for, the restore fails: its gets hear `OutOfMemory`.
    fn start_restore(&mut self, id: ObjectId) -> bool {
        let tier = self.spill.as_ref().expect("restoring needs a tier");
        let object = *tier.spilled.get(&id).expect("restoring a spilled object");
        let total = object.len();
        let block_len = crate::alloc::block_len_for(total).expect("a stored object fits a block");
        let block = match self.allocate_evicting(id, total, block_len) {
            Ok(block) => block,
            Err(_) if self.pending_free_bytes() > 0 => return false,
            Err(error) => {
                // Nothing can be freed for it now: whoever waits hears so (it stays spilled).
                self.fail_waiters(id, error);
                self.outputs.push_back(StoreOutput::RestoreFailed { id });
                return true;
            }
        };
        let mut entry = Entry::new(
            id,
            block,
            object.data_size,
            object.metadata_size,
            false,
            object.created_at,
        );
        if let Some(digest) = object.digest {
            entry.set_digest(digest);
        }
        entry.record = object.record;
        // Pinned while the read writes its block; unsealed, so nobody reads it yet.
        entry.pin_count = 1;
        let region = entry.info().region;
        self.objects.insert(entry);
        let tier = self.spill.as_mut().expect("checked above");
        tier.in_flight.insert(
            object.op,
            InFlight::Restore {
                id,
                failed_reads: 0,
            },
        );
        tier.by_object.insert(id, object.op);
        self.outputs.push_back(StoreOutput::Restore {
            op: object.op,
            id,
            region,
            digest: object.digest,
        });
        true
    }

    /// The driver finished the restore read of record `op`. On success the object is sealed in
    /// memory again, its record kept clean, and its gets answered. A read that failed with an
    /// IO error is tried again, up to [`RESTORE_READ_TRIES`] reads. On any other failure, or
    /// the last read's, it is lost: removed and withdrawn like a delete, its gets answered
    /// `ObjectNotFound`.
    pub fn handle_restore_done(&mut self, op: SpillOpId, result: Result<(), RestoreError>) {
        let Some(tier) = self.spill.as_mut() else {
            return;
        };
        let Some(InFlight::Restore { id, failed_reads }) = tier.in_flight.get(&op).copied() else {
            return;
        };
        if matches!(result, Err(RestoreError::Io { .. })) && failed_reads + 1 < RESTORE_READ_TRIES {
            tier.stats.restore_read_retries_total += 1;
            tier.in_flight.insert(
                op,
                InFlight::Restore {
                    id,
                    failed_reads: failed_reads + 1,
                },
            );
            let digest = tier.spilled.get(&id).and_then(|object| object.digest);
            let region = self
                .objects
                .get(&id)
                .expect("a restoring object is in the table")
                .info()
                .region;
            self.outputs.push_back(StoreOutput::Restore {
                op,
                id,
                region,
                digest,
            });
            return;
        }
        tier.in_flight.remove(&op);
        tier.by_object.remove(&id);
        let object = tier
            .spilled
            .remove(&id)
            .expect("a restoring object is spilled");
        tier.give_back(&object);
        if result.is_ok() {
            // Back in memory, and still on disk: clean until the object goes.
            tier.clean_bytes += object.len();
            tier.clean.insert(id, object);
        } else {
            self.discard_record(op, id);
        }
        let entry = self
            .objects
            .get_mut(&id)
            .expect("a restoring object is in the table");
        entry.pin_count -= 1;
        match result {
            Ok(()) => {
                let tier = self.spill.as_mut().expect("checked above");
                tier.stats.restores_total += 1;
                tier.stats.restored_bytes_total += object.len();
                entry.sealed = true;
                let block = entry.block();
                // Held until the gets that wait for it have taken it: a get of several objects
                // answers only once all are back, and this one must not go back to disk
                // meanwhile.
                let waiting = self.waiters_by_object.get(&id).cloned().unwrap_or_default();
                for waiter in waiting {
                    self.hold_for(id, waiter);
                }
                if self.config.record_durable_changes {
                    self.queue_durable(DurableChange::Sealed {
                        id,
                        block,
                        data_size: object.data_size,
                        metadata_size: object.metadata_size,
                    });
                }
                self.outputs.push_back(StoreOutput::Restored { id });
                self.wake_waiters(id);
                self.settle(id);
            }
            Err(_) => {
                let tier = self.spill.as_mut().expect("checked above");
                tier.stats.objects_lost_total += 1;
                // Unsealed and unpinned: removed without a durable change of its block; its
                // spilled record goes.
                self.remove_object(id, false);
                if self.config.record_durable_changes {
                    self.queue_durable(DurableChange::Removed { id });
                }
                self.notify(ObjectEvent::Deleted { id });
                self.outputs.push_back(StoreOutput::RestoreFailed { id });
                self.fail_waiters(id, StoreError::ObjectNotFound(id));
            }
        }
    }

    /// Deletes a spilled object that is not being restored: its record is discarded. `None`
    /// when `id` is not such an object.
    pub(super) fn delete_spilled(&mut self, id: ObjectId) -> Option<Result<(), StoreError>> {
        let tier = self.spill.as_mut()?;
        if let Some(op) = tier.by_object.get(&id) {
            let spilling = matches!(tier.in_flight.get(op), Some(InFlight::Spill { .. }));
            let entry = self.objects.get_mut(&id)?;
            entry.delete_pending = true;
            // Being spilled (written ahead of need) and held by nobody: deleted once the write
            // completes, which nobody waits for, so the delete succeeds now.
            if spilling && entry.ref_count == 0 && entry.pin_count == 1 {
                return Some(Ok(()));
            }
            // Restoring (or held): deleted once it is back and released.
            return Some(Err(StoreError::ObjectInUse(id)));
        }
        let object = tier.spilled.remove(&id)?;
        tier.give_back(&object);
        if tier.queued_set.remove(&id).is_some() {
            tier.compact_restore_queue();
        }
        if self.config.record_durable_changes {
            self.queue_durable(DurableChange::Removed { id });
        }
        self.discard_record(object.op, id);
        self.outputs.push_back(StoreOutput::RestoreFailed { id });
        self.notify(ObjectEvent::Deleted { id });
        self.fail_waiters(id, StoreError::ObjectNotFound(id));
        Some(Ok(()))
    }

    /// Whether `id` is an unsealed object being restored (it has no creator).
    pub(super) fn is_restoring(&self, id: &ObjectId) -> bool {
        self.tier(id) == Some(StorageTier::Restoring)
    }

    /// Summaries of the objects on disk only, for `list`.
    pub(super) fn spilled_summaries(&self) -> Vec<super::ObjectSummary> {
        let Some(tier) = self.spill.as_ref() else {
            return Vec::new();
        };
        tier.spilled
            .iter()
            .filter(|(id, _)| !tier.by_object.contains_key(id))
            .map(|(&id, object)| super::ObjectSummary {
                info: super::ObjectInfo {
                    id,
                    // No memory: an empty region of the object's length.
                    region: crate::region::LocalRegion {
                        arena: crate::ids::ArenaId(0),
                        offset: 0,
                        len: object.len(),
                    },
                    data_size: object.data_size,
                    metadata_size: object.metadata_size,
                },
                sealed: true,
                ref_count: 0,
                pin_count: 0,
                delete_pending: false,
                created_at: object.created_at,
                tier: StorageTier::Spilled,
            })
            .collect()
    }

    /// Starts spill writes of least recently used unheld objects until `bytes` are on their
    /// way out (an `evict` request with a spill tier); the rest, once the tier is full, is
    /// evicted. Returns (objects, bytes).
    pub(super) fn spill_or_evict(&mut self, bytes: u64) -> (u64, u64) {
        let (mut objects, mut freed) = (0, 0);
        while freed < bytes {
            let Some(len) = self.reclaim_one() else { break };
            objects += 1;
            freed += len;
        }
        (objects, freed)
    }

    /// Checks the spill tier against the table; panics on the first inconsistency.
    pub(super) fn check_spill_invariants(&self) {
        let Some(tier) = self.spill.as_ref() else {
            return;
        };
        let mut spilling = 0;
        for (op, in_flight) in &tier.in_flight {
            match *in_flight {
                InFlight::Spill { id, len, .. } => {
                    let entry = self
                        .objects
                        .get(&id)
                        .expect("a spilling object is in memory");
                    assert!(entry.sealed && entry.pin_count > 0, "spilling {id} pinned");
                    assert!(!tier.spilled.contains_key(&id), "{id} spilling and spilled");
                    spilling += len;
                }
                InFlight::Restore { id, failed_reads } => {
                    assert!(failed_reads < RESTORE_READ_TRIES, "{id} read too often");
                    let entry = self
                        .objects
                        .get(&id)
                        .expect("a restoring object is in memory");
                    assert!(!entry.sealed && entry.pin_count == 1, "restoring {id}");
                    assert_eq!(
                        tier.spilled.get(&id).map(|o| o.op),
                        Some(*op),
                        "record of {id}"
                    );
                }
            }
        }
        assert_eq!(tier.by_object.len(), tier.in_flight.len(), "ops by object");
        assert_eq!(spilling, tier.spilling_bytes, "spilling bytes");
        let spilled: u64 = tier.spilled.values().map(SpilledObject::len).sum();
        assert_eq!(spilled, tier.spilled_bytes, "spilled bytes");
        let clean: u64 = tier.clean.values().map(SpilledObject::len).sum();
        assert_eq!(clean, tier.clean_bytes, "clean record bytes");
        for id in tier.clean.keys() {
            let entry = self
                .objects
                .get(id)
                .expect("a clean record's object is in memory");
            assert!(entry.sealed, "{id} with a clean record is sealed");
            assert!(!tier.spilled.contains_key(id), "{id} clean and spilled");
            assert!(!tier.by_object.contains_key(id), "{id} clean and in flight");
        }
        for (id, object) in &tier.spilled {
            let restoring = tier.by_object.get(id) == Some(&object.op);
            assert!(
                restoring || !self.objects.contains(id),
                "spilled {id} is in memory without a restore"
            );
        }
        assert!(
            tier.spilled_bytes + tier.clean_bytes + tier.spilling_bytes <= tier.limit_bytes,
            "spill tier over its limit"
        );
        let in_line = tier
            .queued
            .iter()
            .filter(|(place, id)| tier.queued_set.get(id) == Some(place))
            .count();
        assert_eq!(in_line, tier.queued_set.len(), "restore queue");
        assert!(
            tier.queued.len() <= 2 * tier.queued_set.len() + RESTORE_QUEUE_SLACK,
            "restore queue holds few deleted entries"
        );
        tier.held_for_gets
            .check_invariants(|waiter| self.waiters.contains_key(waiter));
        for id in tier.held_for_gets.objects() {
            let entry = self
                .objects
                .get(id)
                .expect("an object held for gets is in memory");
            assert!(entry.pin_count > 0, "{id} held for gets is pinned");
        }
    }

    fn fail_waiters(&mut self, id: ObjectId, error: StoreError) {
        self.fail_waiters_with(id, error);
    }
}

#[cfg(test)]
mod failure_tests;
mod held_for_gets;
#[cfg(test)]
mod held_tests;
#[cfg(test)]
mod persistent_tests;
#[cfg(test)]
mod record_tests;
#[cfg(test)]
mod test_support;
