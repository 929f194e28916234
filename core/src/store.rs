//! The local object store: the object table, reference counts, waiting gets, subscriptions and
//! LRU eviction of one node. Sans-IO: every input carries `now`, every effect that is not the
//! direct answer to a call (a get that completes later, a notification) is queued as a
//! [`StoreOutput`] for the driver to drain with [`Store::poll_output`].
//!
//! Lifecycle of an object: `create` (unsealed, the creator holds one reference and may write
//! it) → `seal` (immutable, visible to `get`) → `release`d by everyone → evictable (LRU) or
//! `delete`d. A delete of an object in use is deferred until the last reference goes (Plasma's
//! rule); an object pinned by a transfer is never evicted or freed. A copy of record
//! ([`Store::hold_as_record`]) is never evicted either, but unlike a pinned object it may be
//! spilled (see [`spill`]); only a delete ends it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::alloc::Allocator;
use crate::digest::ContentDigest;
use crate::error::StoreError;
use crate::ids::{ArenaId, ClientId, ObjectId};
use crate::region::LocalRegion;
use crate::time::Instant;

use table::{Entry, Lru, ObjectTable};
pub use types::{
    DeleteResult, EvictOutcome, ObjectEvent, ObjectInfo, ObjectSummary, StoreOutput, StoreStats,
};
use waiters::{Waiter, WaiterId};

impl Entry {
    fn info(&self) -> ObjectInfo {
        ObjectInfo {
            id: self.id,
            region: self.block().slice(0, self.data_size + self.metadata_size),
            data_size: self.data_size,
            metadata_size: self.metadata_size,
        }
    }

    fn summary(&self) -> ObjectSummary {
        ObjectSummary {
            info: self.info(),
            sealed: self.sealed,
            ref_count: self.ref_count,
            pin_count: self.pin_count,
            delete_pending: self.delete_pending,
            created_at: self.created_at,
            tier: spill::StorageTier::Memory,
        }
    }

    /// Sealed, and nobody holds, pins or deletes it.
    fn unheld(&self) -> bool {
        self.sealed && self.ref_count == 0 && self.pin_count == 0 && !self.delete_pending
    }

    /// The LRU list the object belongs in: evictable, or (an unheld copy of record) spillable
    /// only.
    fn wanted_lru(&self) -> Option<Lru> {
        match (self.unheld(), self.record) {
            (false, _) => None,
            (true, false) => Some(Lru::Evictable),
            (true, true) => Some(Lru::Record),
        }
    }
}

#[derive(Debug, Default)]
struct ClientState {
    /// References this client holds, by object.
    held: BTreeMap<ObjectId, u32>,
    /// Unsealed objects this client created.
    creating: BTreeSet<ObjectId>,
    subscribed: bool,
}

/// Limits of a store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreConfig {
    /// Arenas and their sizes in bytes.
    pub arenas: Vec<(ArenaId, u64)>,
    /// Most ids in one get or delete.
    pub max_batch_len: usize,
    /// Queue a [`DurableChange`] for every seal and every removal of a sealed object, for a
    /// driver that keeps the object index on persistent storage (see [`recovery`]).
    pub record_durable_changes: bool,
    /// Key of the object index's hash. A daemon draws it at random; the simulator and tests
    /// derive it from their seed, so runs replay.
    pub hash_seed: u64,
    /// Bytes the spill tier may hold (see [`spill`]); `None`: no spill tier, a full store
    /// evicts.
    #[serde(default)]
    pub spill_limit_bytes: Option<u64>,
}

impl StoreConfig {
    /// One arena of `capacity_bytes`.
    pub fn single_arena(capacity_bytes: u64) -> Self {
        Self {
            arenas: vec![(ArenaId(0), capacity_bytes)],
            max_batch_len: 65_536,
            record_durable_changes: false,
            hash_seed: 0,
            spill_limit_bytes: None,
        }
    }
}

/// The object store of one node.
#[derive(Debug)]
pub struct Store {
    config: StoreConfig,
    allocator: Allocator,
    /// Every object, and the LRU order of the evictable ones and of unheld copies of record.
    objects: ObjectTable,
    evictable_bytes: u64,
    /// Blocks of the unheld copies of record in memory (what spilling could free of them).
    record_lru_bytes: u64,
    clients: BTreeMap<ClientId, ClientState>,
    waiters: BTreeMap<WaiterId, Waiter>,
    /// The gets waiting for each object, oldest first (ids only grow).
    waiters_by_object: BTreeMap<ObjectId, BTreeSet<WaiterId>>,
    deadlines: BTreeSet<(Instant, WaiterId)>,
    next_waiter: u64,
    outputs: VecDeque<StoreOutput>,
    /// Seals and removals the driver has not made durable yet (empty unless
    /// [`StoreConfig::record_durable_changes`]).
    durable_changes: VecDeque<DurableChange>,
    /// Durable changes queued so far; the n-th one (from 1) has sequence number n.
    durable_changes_queued: u64,
    /// Blocks of removed sealed objects, by the sequence number of their removal: free only
    /// once the removal is durable ([`Store::handle_durable`]), so a recovered record never
    /// points at space another object has overwritten.
    quarantine: VecDeque<(u64, LocalRegion)>,
    quarantined_bytes: u64,
    stats: StoreStats,
    /// The spill tier, when configured.
    spill: Option<spill::SpillTier>,
}

impl Store {
    /// An empty store over the configured arenas.
    pub fn new(config: StoreConfig) -> Self {
        let allocator = Allocator::new(config.arenas.iter().copied());
        let hash_seed = config.hash_seed;
        let spill = config.spill_limit_bytes.map(spill::SpillTier::new);
        Self {
            spill,
            config,
            allocator,
            objects: ObjectTable::new(hash_seed),
            evictable_bytes: 0,
            record_lru_bytes: 0,
            clients: BTreeMap::new(),
            waiters: BTreeMap::new(),
            waiters_by_object: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            next_waiter: 0,
            outputs: VecDeque::new(),
            durable_changes: VecDeque::new(),
            durable_changes_queued: 0,
            quarantine: VecDeque::new(),
            quarantined_bytes: 0,
            stats: StoreStats::default(),
        }
    }

    /// The store's limits.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// A client connected. Idempotent.
    pub fn connect(&mut self, client: ClientId) {
        self.clients.entry(client).or_default();
    }

    /// A client went away: its references are released, its unsealed objects aborted, its
    /// waiting gets dropped and its subscription ended.
    pub fn disconnect(&mut self, client: ClientId) {
        let Some(state) = self.clients.remove(&client) else {
            return;
        };
        let dropped: Vec<WaiterId> = self
            .waiters
            .iter()
            .filter(|(_, waiter)| waiter.client == client)
            .map(|(&waiter_id, _)| waiter_id)
            .collect();
        for waiter_id in dropped {
            self.drop_waiter(waiter_id);
        }
        for id in state.creating {
            // Its creator reference is in `held` too; drop the object outright.
            if let Some(entry) = self.objects.get_mut(&id) {
                entry.ref_count = 0;
            }
            self.remove_object(id, false);
            self.abort_waiters(id);
        }
        for (id, count) in state.held {
            if let Some(entry) = self.objects.get_mut(&id) {
                entry.ref_count -= count;
                self.settle(id);
            }
        }
    }

    /// Creates an unsealed object of `data_size + metadata_size` bytes for `client` to write,
    /// evicting least-recently-used objects if needed. The creator holds one reference.
    pub fn create(
        &mut self,
        now: Instant,
        client: ClientId,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
    ) -> Result<ObjectInfo, StoreError> {
        if self.objects.contains(&id) || self.is_spilled(&id) {
            return Err(StoreError::ObjectExists(id));
        }
        let largest_arena_bytes = self
            .config
            .arenas
            .iter()
            .map(|(_, s)| *s)
            .max()
            .unwrap_or(0);
        let total = data_size.checked_add(metadata_size);
        let block_len = total.and_then(crate::alloc::block_len_for);
        let (Some(total), Some(block_len)) = (total, block_len) else {
            return Err(StoreError::ObjectTooLarge {
                id,
                requested_bytes: u64::MAX,
                largest_arena_bytes,
            });
        };
        if block_len > largest_arena_bytes {
            return Err(StoreError::ObjectTooLarge {
                id,
                requested_bytes: total,
                largest_arena_bytes,
            });
        }
        let block = match self.allocate_evicting(id, total, block_len) {
            Ok(block) => block,
            Err(error) => {
                if matches!(error, StoreError::OutOfMemory { .. }) {
                    self.stats.out_of_memory_total += 1;
                }
                return Err(error);
            }
        };
        self.stats.created_objects_total += 1;
        let mut entry = Entry::new(id, block, data_size, metadata_size, false, now);
        entry.ref_count = 1;
        let info = entry.info();
        self.objects.insert(entry);
        let state = self.clients.entry(client).or_default();
        state.creating.insert(id);
        *state.held.entry(id).or_default() += 1;
        Ok(info)
    }

    /// Seals an object its creator has written; it becomes visible to `get` and immutable.
    /// With `release`, the creator's reference is dropped in the same step.
    pub fn seal(
        &mut self,
        client: ClientId,
        id: ObjectId,
        release: bool,
    ) -> Result<ObjectInfo, StoreError> {
        self.check_creator(client, id)?;
        let entry = self
            .objects
            .get_mut(&id)
            .expect("check_creator found the object");
        entry.sealed = true;
        let info = entry.info();
        let block = entry.block();
        if self.config.record_durable_changes {
            self.queue_durable(DurableChange::Sealed {
                id,
                block,
                data_size: info.data_size,
                metadata_size: info.metadata_size,
            });
        }
        if let Some(state) = self.clients.get_mut(&client) {
            state.creating.remove(&id);
        }
        self.stats.sealed_objects_total += 1;
        let event = ObjectEvent::Sealed {
            id,
            data_size: info.data_size,
            metadata_size: info.metadata_size,
        };
        self.notify(event);
        self.wake_waiters(id);
        if release {
            self.release(client, id)?;
        } else {
            self.settle(id);
        }
        Ok(info)
    }

    /// Drops an unsealed object its creator no longer wants.
    pub fn abort(&mut self, client: ClientId, id: ObjectId) -> Result<(), StoreError> {
        self.check_creator(client, id)?;
        if let Some(state) = self.clients.get_mut(&client) {
            state.creating.remove(&id);
            state.held.remove(&id);
        }
        self.remove_object(id, false);
        self.abort_waiters(id);
        Ok(())
    }

    /// Only the creator of an unsealed object may seal or abort it. An unsealed object is in
    /// its creator's `creating` set, and in no other.
    pub fn check_creator(&self, client: ClientId, id: ObjectId) -> Result<(), StoreError> {
        let entry = self
            .objects
            .get(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        if entry.sealed {
            return Err(StoreError::AlreadySealed(id));
        }
        let created = self
            .clients
            .get(&client)
            .is_some_and(|state| state.creating.contains(&id));
        if !created {
            return Err(StoreError::NotCreator(id));
        }
        Ok(())
    }

    /// Takes a reference on a sealed object for `client` at once, or says why not.
    /// The non-waiting single-object form of `get`.
    pub fn get_now(&mut self, client: ClientId, id: ObjectId) -> Result<ObjectInfo, StoreError> {
        let entry = self
            .objects
            .get_mut(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        if !entry.sealed {
            return Err(StoreError::ObjectNotSealed(id));
        }
        entry.ref_count += 1;
        let info = entry.info();
        *self
            .clients
            .entry(client)
            .or_default()
            .held
            .entry(id)
            .or_default() += 1;
        self.settle(id);
        Ok(info)
    }

    /// Drops one reference `client` holds on `id`.
    /// The creator of an unsealed object cannot release it: it seals or aborts it.
    pub fn release(&mut self, client: ClientId, id: ObjectId) -> Result<(), StoreError> {
        let state = self
            .clients
            .get_mut(&client)
            .ok_or(StoreError::NotHeld(id))?;
        let count = state.held.get_mut(&id).ok_or(StoreError::NotHeld(id))?;
        if state.creating.contains(&id) {
            return Err(StoreError::ObjectNotSealed(id));
        }
        *count -= 1;
        if *count == 0 {
            state.held.remove(&id);
        }
        // A held object is always in the table: removal waits for references to go.
        let entry = self
            .objects
            .get_mut(&id)
            .expect("a held object stays in the table");
        entry.ref_count -= 1;
        self.settle(id);
        Ok(())
    }

    /// Whether a sealed object with this id is here.
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.is_sealed(id) || self.is_spilled(id)
    }

    /// The sizes of an object that is not sealed yet.
    pub fn unsealed_sizes(&self, id: &ObjectId) -> Option<crate::wire::ObjectSizes> {
        let entry = self.objects.get(id).filter(|entry| !entry.sealed)?;
        Some(crate::wire::ObjectSizes {
            data_size: entry.data_size,
            metadata_size: entry.metadata_size,
        })
    }

    /// A sealed object's sizes, in memory or spilled (being restored too: its unsealed block
    /// is the restore's, the object stays sealed), and its digest when known.
    pub fn sealed_sizes_and_digest(
        &self,
        id: &ObjectId,
    ) -> Option<(crate::wire::ObjectSizes, Option<ContentDigest>)> {
        let (data_size, metadata_size, digest) = match self.objects.get(id) {
            Some(entry) if entry.sealed => (entry.data_size, entry.metadata_size, entry.digest()),
            Some(_) if !self.is_spilled(id) => return None,
            _ => self.spilled_sizes(id)?,
        };
        let sizes = crate::wire::ObjectSizes {
            data_size,
            metadata_size,
        };
        Some((sizes, digest))
    }

    /// The digest of a sealed object's bytes, when known.
    pub fn digest(&self, id: &ObjectId) -> Option<ContentDigest> {
        match self.objects.get(id).filter(|entry| entry.sealed) {
            Some(entry) => entry.digest(),
            None => self.spilled_sizes(id)?.2,
        }
    }

    /// Records the digest of a sealed object's bytes (computed by whoever knows them: the
    /// client that wrote it, the node that verified a fetched copy, the driver that recovered
    /// it). Ignored for an object that is not sealed here.
    pub fn set_digest(&mut self, id: &ObjectId, digest: ContentDigest) {
        if let Some(entry) = self.objects.get_mut(id).filter(|entry| entry.sealed) {
            entry.set_digest(digest);
        }
    }

    /// Information about a sealed object without taking a reference.
    pub fn sealed_info(&self, id: &ObjectId) -> Option<ObjectInfo> {
        self.objects
            .get(id)
            .filter(|entry| entry.sealed)
            .map(Entry::info)
    }

    /// Deletes objects: at once if nobody holds them, otherwise when the last reference goes
    /// (reported as [`StoreError::ObjectInUse`]). Unsealed objects cannot be deleted.
    pub fn delete(&mut self, ids: &[ObjectId]) -> Vec<DeleteResult> {
        if ids.len() > self.config.max_batch_len {
            let error = StoreError::BadRequest(format!(
                "a delete names {} ids; the limit is {}",
                ids.len(),
                self.config.max_batch_len
            ));
            return vec![Err(error); ids.len()];
        }
        ids.iter().map(|&id| self.delete_one(id)).collect()
    }

    fn delete_one(&mut self, id: ObjectId) -> DeleteResult {
        if let Some(result) = self.delete_spilled(id) {
            return result;
        }
        let entry = self
            .objects
            .get_mut(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        if !entry.sealed {
            return Err(StoreError::ObjectNotSealed(id));
        }
        if entry.ref_count > 0 || entry.pin_count > 0 {
            entry.delete_pending = true;
            self.settle(id);
            return Err(StoreError::ObjectInUse(id));
        }
        self.remove_object(id, true);
        Ok(())
    }

    /// Every object, sorted by id.
    pub fn list(&self) -> Vec<ObjectSummary> {
        let mut summaries: Vec<ObjectSummary> = self.objects.iter().map(Entry::summary).collect();
        if self.spill.is_some() {
            for summary in &mut summaries {
                summary.tier = self.tier(&summary.info.id).unwrap_or_default();
            }
            summaries.extend(self.spilled_summaries());
        }
        summaries.sort_by_key(|s| s.info.id);
        summaries
    }

    /// The `list()` line of one object, sealed or not.
    pub fn summary(&self, id: &ObjectId) -> Option<ObjectSummary> {
        match self.objects.get(id) {
            Some(entry) => Some(ObjectSummary {
                tier: self.tier(id).unwrap_or_default(),
                ..entry.summary()
            }),
            None => self
                .spilled_summaries()
                .into_iter()
                .find(|summary| summary.info.id == *id),
        }
    }

    /// Evicts least-recently-used objects nobody holds until at least `bytes` are freed or
    /// nothing evictable is left.
    pub fn evict(&mut self, bytes: u64) -> EvictOutcome {
        if self.spill.is_some() {
            // With a spill tier, "evict" moves objects to disk (and forgets only what the
            // tier cannot take); the memory is free once the writes complete.
            let (objects, bytes) = self.spill_or_evict(bytes);
            return EvictOutcome { objects, bytes };
        }
        let mut outcome = EvictOutcome::default();
        while outcome.bytes < bytes {
            let Some(freed) = self.evict_one() else { break };
            outcome.objects += 1;
            outcome.bytes += freed;
        }
        outcome
    }

    /// Starts sending `client` a notification for every seal and delete.
    pub fn subscribe(&mut self, client: ClientId) {
        self.clients.entry(client).or_default().subscribed = true;
    }

    /// The entry of `id` when it is sealed in memory and not being deleted.
    fn sealed_entry_mut(&mut self, id: ObjectId) -> Result<&mut Entry, StoreError> {
        let entry = self
            .objects
            .get_mut(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        if !entry.sealed {
            return Err(StoreError::ObjectNotSealed(id));
        }
        if entry.delete_pending {
            return Err(StoreError::ObjectNotFound(id));
        }
        Ok(entry)
    }

    /// Pins a sealed object for a transfer that reads it: it is neither evicted nor freed
    /// until every pin is gone.
    pub fn pin(&mut self, id: ObjectId) -> Result<ObjectInfo, StoreError> {
        let entry = self.sealed_entry_mut(id)?;
        entry.pin_count += 1;
        let info = entry.info();
        self.settle(id);
        Ok(info)
    }

    /// Drops a pin taken by [`Store::pin`]. Unpinning an object that is not pinned is a bug.
    pub fn unpin(&mut self, id: ObjectId) {
        let entry = self
            .objects
            .get_mut(&id)
            .expect("a pinned object stays in the table");
        assert!(entry.pin_count > 0, "unpin of {id} that is not pinned");
        entry.pin_count -= 1;
        self.settle(id);
    }

    /// Whether any transfer has `id` pinned.
    pub fn is_pinned(&self, id: &ObjectId) -> bool {
        self.objects.get(id).is_some_and(|e| e.pin_count > 0)
    }

    /// Whether a `create` of an object of `bytes` (data and metadata) could find its block now,
    /// after evicting everything evictable: free space and evictable objects' blocks together,
    /// as contiguous blocks (fragmentation counts). Read-only.
    pub fn could_hold(&self, bytes: u64) -> bool {
        self.fits_once_freed(bytes, false)
    }

    /// Whether a `create` of `bytes` could ever find its block without a delete or a release:
    /// as [`Store::could_hold`], with the blocks of removals waiting to be durable free too.
    /// True while objects are being spilled (their blocks are freed as each write ends).
    /// Read-only.
    pub fn could_hold_once_freed(&self, bytes: u64) -> bool {
        self.spilling_bytes() > 0 || self.fits_once_freed(bytes, true)
    }

    /// Whether `bytes` fit the arena once every evictable object and every copy of record the
    /// spill tier could take (copies of record are never evicted) are gone, and with
    /// `quarantined` the blocks of removals waiting to be durable too.
    fn fits_once_freed(&self, bytes: u64, quarantined: bool) -> bool {
        let mut allocator = self.allocator.clone();
        for entry in self.objects.iter().filter(|entry| entry.in_lru()) {
            allocator.free(entry.block());
        }
        for block in self.spillable_record_blocks() {
            allocator.free(block);
        }
        if quarantined {
            for &(_, block) in &self.quarantine {
                allocator.free(block);
            }
        }
        allocator.fits(bytes)
    }

    /// `get`s waiting for objects now.
    pub fn waiting_gets(&self) -> usize {
        self.waiters.len()
    }

    /// Counts requests the node layer handles for clients (`get`, `delete`), per id.
    pub fn count_requests(&mut self, gets: u64, deletes: u64) {
        self.stats.get_requests_total += gets;
        self.stats.delete_requests_total += deletes;
    }

    /// Current counters and gauges.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            // The memory as given (plasma_store's `-m` exactly), not rounded to whole blocks.
            capacity_bytes: self.allocator.given_bytes(),
            // Blocks waiting for their removal to be durable hold no object.
            allocated_bytes: self.allocator.capacity_bytes()
                - self.allocator.free_bytes()
                - self.quarantined_bytes,
            object_count: self.objects.len() as u64,
            sealed_count: self.objects.iter().filter(|e| e.sealed).count() as u64,
            evictable_bytes: self.evictable_bytes,
            pinned_bytes: self
                .objects
                .iter()
                .filter(|e| e.pin_count > 0)
                .map(|e| e.block().len)
                .sum(),
            client_count: self.clients.len() as u64,
            waiting_gets: self.waiters.len() as u64,
            spill: Box::new(self.spill_stats()),
            ..self.stats.clone()
        }
    }

    /// Objects and bytes (their blocks) evicted since start, as in [`Store::stats`] but without
    /// its scan of the table: cheap enough to read after every input.
    pub fn evicted_totals(&self) -> (u64, u64) {
        (
            self.stats.evicted_objects_total,
            self.stats.evicted_bytes_total,
        )
    }

    /// Bytes that could be freed: free space, everything evictable, copies of record the
    /// spill tier could take, and removed objects' blocks waiting for their removal to be
    /// durable.
    pub fn reclaimable_bytes(&self) -> u64 {
        self.allocator.free_bytes()
            + self.evictable_bytes
            + self.spillable_record_bytes()
            + self.quarantined_bytes
            + self.spilling_bytes()
    }

    /// Keeps a sealed object (in memory or spilled) as a copy of record: never evicted, but
    /// spilled like any unheld object when memory is needed, and restored on `get` or fetch.
    /// The hold ends with [`Store::release_record`] or a delete. Idempotent.
    pub fn hold_as_record(&mut self, id: ObjectId) -> Result<(), StoreError> {
        if self.hold_spilled_as_record(id, true) {
            return Ok(());
        }
        let entry = self.sealed_entry_mut(id)?;
        entry.record = true;
        self.settle(id);
        Ok(())
    }

    /// Ends the hold of [`Store::hold_as_record`]: the object is an ordinary (evictable) one
    /// again. Nothing happens for an object not held so, or not here.
    pub fn release_record(&mut self, id: ObjectId) {
        if self.hold_spilled_as_record(id, false) {
            return;
        }
        if let Some(entry) = self.objects.get_mut(&id) {
            entry.record = false;
            self.settle(id);
        }
    }

    /// Whether `id` is here (in memory or spilled) held as a copy of record.
    pub fn is_record(&self, id: &ObjectId) -> bool {
        match self.objects.get(id) {
            Some(entry) => entry.record,
            None => self.is_spilled_record(id),
        }
    }

    /// The next effect to carry out.
    pub fn poll_output(&mut self) -> Option<StoreOutput> {
        self.outputs.pop_front()
    }

    /// The next change the driver must make durable, in the order they happened. Always
    /// `None` unless [`StoreConfig::record_durable_changes`]. A driver drains these after
    /// every input and, for a seal to be durable when its reply is sent, makes them durable
    /// before writing any reply; a [`DurableChange::Removed`] must be durable before the
    /// freed space is handed out again (that is, before the reply to the input that freed it).
    pub fn poll_durable_change(&mut self) -> Option<DurableChange> {
        self.durable_changes.pop_front()
    }

    /// Every durable change up to sequence number `upto` (the n-th change queued has number
    /// n, from 1) is durable now: blocks of removals up to there become free space.
    pub fn handle_durable(&mut self, upto: u64) {
        while let Some(&(seq, block)) = self.quarantine.front() {
            if seq > upto {
                break;
            }
            self.quarantine.pop_front();
            self.quarantined_bytes -= block.len;
            self.allocator.free(block);
        }
        self.release_held_discards(upto);
    }

    /// Durable changes queued since the store was made (the last one's sequence number).
    pub fn durable_changes_queued(&self) -> u64 {
        self.durable_changes_queued
    }

    /// Bytes of removed objects whose removal is not durable yet (see
    /// [`Store::handle_durable`]): they become free when it is.
    pub fn quarantined_bytes(&self) -> u64 {
        self.quarantined_bytes
    }

    fn queue_durable(&mut self, change: DurableChange) {
        self.durable_changes_queued += 1;
        self.durable_changes.push_back(change);
    }

    fn is_sealed(&self, id: &ObjectId) -> bool {
        self.objects.get(id).is_some_and(|e| e.sealed)
    }

    fn allocate_evicting(
        &mut self,
        id: ObjectId,
        total: u64,
        block_len: u64,
    ) -> Result<LocalRegion, StoreError> {
        if self.reclaimable_bytes() < block_len {
            return Err(self.out_of_memory(id, total));
        }
        // The table indexes at most MAX_OBJECTS objects; a full one is full memory too.
        while self.objects.len() >= table::MAX_OBJECTS {
            if self.evict_one().is_none() {
                return Err(self.out_of_memory(id, total));
            }
        }
        loop {
            if let Some(block) = self.allocator.allocate(total) {
                return Ok(block);
            }
            // Evicted blocks wait for their removal to be durable, spilled ones for their
            // write, before they are free; once enough wait, evicting or spilling more only
            // loses objects or time (the caller retries when they are free).
            if self.pending_free_bytes() >= block_len || self.reclaim_one().is_none() {
                return Err(self.out_of_memory(id, total));
            }
        }
    }

    fn out_of_memory(&self, id: ObjectId, total: u64) -> StoreError {
        StoreError::OutOfMemory {
            id,
            requested_bytes: total,
            free_bytes: self.allocator.free_bytes(),
            capacity_bytes: self.allocator.capacity_bytes(),
        }
    }

    /// Evicts the least recently used evictable object (never a copy of record); returns the
    /// bytes freed.
    fn evict_one(&mut self) -> Option<u64> {
        let id = self.objects.lru_front(Lru::Evictable)?;
        let freed = self
            .objects
            .get(&id)
            .expect("LRU entries are in the table")
            .block()
            .len;
        self.stats.evicted_objects_total += 1;
        self.stats.evicted_bytes_total += freed;
        self.remove_object(id, true);
        Some(freed)
    }

    /// Brings an object's LRU membership and deferred deletion up to date after a change.
    fn settle(&mut self, id: ObjectId) {
        let Some(entry) = self.objects.get_mut(&id) else {
            return;
        };
        if entry.delete_pending && entry.ref_count == 0 && entry.pin_count == 0 {
            self.remove_object(id, true);
            return;
        }
        let (wanted, now_in) = (entry.wanted_lru(), entry.lru());
        if wanted == now_in {
            return;
        }
        let len = entry.block().len;
        match now_in {
            Some(Lru::Evictable) => self.evictable_bytes -= len,
            Some(Lru::Record) => self.record_lru_bytes -= len,
            None => {}
        }
        if now_in.is_some() {
            self.objects.lru_remove(&id);
        }
        if let Some(list) = wanted {
            match list {
                Lru::Evictable => self.evictable_bytes += len,
                Lru::Record => self.record_lru_bytes += len,
            }
            self.objects.lru_push_back(list, &id);
        }
    }

    /// Removes an object from the table and frees its block. Callers make sure no reference
    /// or pin is left.
    fn remove_object(&mut self, id: ObjectId, notify: bool) {
        self.remove_object_recording(id, notify, DurableChange::Removed { id });
    }

    /// [`Store::remove_object`] that records `change` (the removal, or the move to the spill
    /// tier) for a sealed object in persistent mode.
    fn remove_object_recording(&mut self, id: ObjectId, notify: bool, change: DurableChange) {
        let Some(entry) = self.objects.remove(&id) else {
            return;
        };
        self.forget_clean_record(id);
        assert_eq!(entry.pin_count, 0, "removing pinned object {id}");
        let block = entry.block();
        match entry.lru() {
            Some(Lru::Evictable) => self.evictable_bytes -= block.len,
            Some(Lru::Record) => self.record_lru_bytes -= block.len,
            None => {}
        }
        if self.config.record_durable_changes && entry.sealed {
            self.queue_durable(change);
            self.quarantine
                .push_back((self.durable_changes_queued, block));
            self.quarantined_bytes += block.len;
        } else {
            self.allocator.free(block);
        }
        if notify && entry.sealed {
            self.notify(ObjectEvent::Deleted { id });
        }
    }

    fn notify(&mut self, event: ObjectEvent) {
        for (&client, state) in &self.clients {
            if state.subscribed {
                self.outputs
                    .push_back(StoreOutput::Notify { client, event });
            }
        }
        self.outputs.push_back(StoreOutput::Local(event));
    }

    /// How many objects the store holds, sealed or not, in memory or spilled (what
    /// [`Store::check_invariants`] scans).
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// Checks the store's internal bookkeeping; panics with a description on the first
    /// inconsistency. For tests and the simulator.
    pub fn check_invariants(&self) {
        let mut refs_by_object: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for state in self.clients.values() {
            for (&id, &count) in &state.held {
                assert!(count > 0, "zero count kept for {id}");
                *refs_by_object.entry(id).or_default() += count;
            }
        }
        let mut creators: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for state in self.clients.values() {
            for &id in &state.creating {
                *creators.entry(id).or_default() += 1;
            }
        }
        self.objects.check_invariants();
        let mut allocated = 0;
        let mut evictable = 0;
        let mut record_lru = 0;
        for entry in self.objects.iter() {
            let id = entry.id;
            let held = refs_by_object.get(&id).copied().unwrap_or(0);
            assert_eq!(entry.ref_count, held, "ref count of {id}");
            let expected_creators = u32::from(!entry.sealed && !self.is_restoring(&id));
            assert_eq!(
                creators.get(&id).copied().unwrap_or(0),
                expected_creators,
                "clients creating {id}"
            );
            assert_eq!(entry.lru(), entry.wanted_lru(), "LRU membership of {id}");
            match entry.lru() {
                Some(Lru::Evictable) => evictable += entry.block().len,
                Some(Lru::Record) => record_lru += entry.block().len,
                None => {}
            }
            assert!(
                !(entry.delete_pending && entry.ref_count == 0 && entry.pin_count == 0),
                "{id} should have been deleted"
            );
            allocated += entry.block().len;
        }
        for id in refs_by_object.keys().chain(creators.keys()) {
            assert!(self.objects.contains(id), "reference to missing {id}");
        }
        assert_eq!(evictable, self.evictable_bytes, "evictable bytes");
        assert_eq!(record_lru, self.record_lru_bytes, "unheld copies of record");
        self.check_spill_invariants();
        let quarantined: u64 = self.quarantine.iter().map(|(_, block)| block.len).sum();
        assert_eq!(quarantined, self.quarantined_bytes, "quarantined bytes");
        assert_eq!(
            allocated + quarantined + self.allocator.free_bytes(),
            self.allocator.capacity_bytes(),
            "allocated + quarantined + free = capacity"
        );
    }
}

pub mod recovery;
pub mod spill;
mod table;
mod types;
mod waiters;

pub use recovery::{
    DurableChange, RecoveredObject, RecoveredSpilled, RecoveryRefusal, RecoveryReport,
    RefusedRecord, RefusedSpilled, SpilledRecoveryReport,
};
pub use spill::{RestoreError, SpillError, SpillOpId, SpillPlace, SpillStats, StorageTier};

#[cfg(test)]
mod tests;
