//! The object table: one compact record per object, with the LRU lists threaded through it.
//!
//! A store may hold millions of small objects, so the bytes kept per object matter as much as
//! the objects' own bytes. The records live densely in a [`DenseIndex`] (segments of records,
//! a removal moves the last record into the hole, and a hash index of `u32` positions finds a
//! record by its id, stored once, in the record). Each LRU list ([`Lru`]: evictable objects, and unheld copies of
//! record, which may be spilled but never evicted) is an intrusive doubly linked list of
//! positions through the records; a record is in at most one, so one pair of links serves both.
//! Being evictable costs no allocation and eviction, touch and removal are O(1). About 80 bytes per record plus 5 per index bucket (the index is at most 7/8 full
//! and grows by doubling).
//!
//! Iteration goes over the records in their `Vec` order, which depends only on the sequence of
//! inserts and removals, never on hashing.

use crate::alloc::block_len_for;
use crate::dense_index::{DenseIndex, Record, MAX_RECORDS};
use crate::digest::ContentDigest;
use crate::ids::{ArenaId, ObjectId};
use crate::region::LocalRegion;
use crate::time::Instant;

/// Most objects one table holds: positions are `u32`, and [`NIL`] is not a position.
pub(super) const MAX_OBJECTS: usize = MAX_RECORDS;

/// No record: the end of the LRU list.
const NIL: u32 = u32::MAX;

/// The LRU lists of a table; a record is in at most one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lru {
    /// Sealed objects nobody holds: evicted (or, with a spill tier, spilled) when memory is
    /// needed.
    Evictable,
    /// Copies of record nobody holds: spilled when memory is needed, never evicted.
    Record,
}

impl Lru {
    const ALL: [Lru; 2] = [Lru::Evictable, Lru::Record];

    fn at(self) -> usize {
        match self {
            Lru::Evictable => 0,
            Lru::Record => 1,
        }
    }
}

/// The ends and length of one LRU list.
#[derive(Debug, Clone, Copy)]
struct ListEnds {
    /// Least recently used end.
    head: u32,
    /// Most recently used end.
    tail: u32,
    len: usize,
}

impl Default for ListEnds {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// One object's record.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) id: ObjectId,
    /// Where the allocated block starts; its length follows from the sizes (see
    /// [`Entry::block`]).
    arena: ArenaId,
    offset: u64,
    pub(super) data_size: u64,
    pub(super) metadata_size: u64,
    pub(super) created_at: Instant,
    pub(super) ref_count: u32,
    pub(super) pin_count: u32,
    pub(super) sealed: bool,
    pub(super) delete_pending: bool,
    /// A copy of record: never evicted (it may be spilled), only deleted.
    pub(super) record: bool,
    /// The digest of its bytes, once sealed and `has_digest` (set by the node).
    digest: u64,
    has_digest: bool,
    /// The LRU list it is in; `lru_prev`/`lru_next` are meaningful only then. Owned by the
    /// table.
    lru: Option<Lru>,
    lru_prev: u32,
    lru_next: u32,
}

impl Record for Entry {
    fn id(&self) -> ObjectId {
        self.id
    }
}

impl Entry {
    /// A record for an object in `block`, which must be the block allocated for
    /// `data_size + metadata_size` bytes (asserted: anything else is a bug).
    pub(super) fn new(
        id: ObjectId,
        block: LocalRegion,
        data_size: u64,
        metadata_size: u64,
        sealed: bool,
        created_at: Instant,
    ) -> Self {
        let entry = Self {
            id,
            arena: block.arena,
            offset: block.offset,
            data_size,
            metadata_size,
            created_at,
            ref_count: 0,
            pin_count: 0,
            sealed,
            delete_pending: false,
            record: false,
            digest: 0,
            has_digest: false,
            lru: None,
            lru_prev: NIL,
            lru_next: NIL,
        };
        assert_eq!(
            entry.block(),
            block,
            "block of {id} does not match its sizes"
        );
        entry
    }

    /// The digest of its bytes, once the node set one.
    pub(super) fn digest(&self) -> Option<ContentDigest> {
        self.has_digest.then_some(ContentDigest(self.digest))
    }

    pub(super) fn set_digest(&mut self, digest: ContentDigest) {
        self.digest = digest.0;
        self.has_digest = true;
    }

    /// The allocated block (aligned length, may exceed data + metadata).
    pub(super) fn block(&self) -> LocalRegion {
        // `Entry::new` checked that these sizes allocate a block, so neither the sum nor the
        // rounding overflows.
        let len = block_len_for(self.data_size + self.metadata_size)
            .expect("the sizes of a stored object fit a block");
        LocalRegion {
            arena: self.arena,
            offset: self.offset,
            len,
        }
    }

    /// Whether the object is in the evictable LRU list.
    pub(super) fn in_lru(&self) -> bool {
        self.lru == Some(Lru::Evictable)
    }

    /// The LRU list the object is in, if any.
    pub(super) fn lru(&self) -> Option<Lru> {
        self.lru
    }
}

/// The objects of a store by id, and the LRU order of the unheld ones (evictable, and copies
/// of record).
#[derive(Debug, Default)]
pub(super) struct ObjectTable {
    /// The records, by id; the index is keyed by the seed the driver passes in
    /// ([`super::StoreConfig::hash_seed`]): a daemon draws it at random (ids come from
    /// clients, so the index must not be floodable), the simulator from its run seed (so runs
    /// replay).
    entries: DenseIndex<Entry>,
    /// The LRU lists, by [`Lru::at`].
    lists: [ListEnds; 2],
}

impl ObjectTable {
    pub(super) fn new(hash_seed: u64) -> Self {
        Self {
            entries: DenseIndex::new(hash_seed),
            lists: Default::default(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    fn position(&self, id: &ObjectId) -> Option<u32> {
        self.entries.position(id)
    }

    pub(super) fn contains(&self, id: &ObjectId) -> bool {
        self.position(id).is_some()
    }

    pub(super) fn get(&self, id: &ObjectId) -> Option<&Entry> {
        self.entries.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &ObjectId) -> Option<&mut Entry> {
        self.entries.get_mut(id)
    }

    /// Adds a record whose id is not in the table yet, outside the LRU. The caller keeps the
    /// table below [`MAX_OBJECTS`]; both are asserted.
    pub(super) fn insert(&mut self, mut entry: Entry) {
        assert!(self.entries.len() < MAX_OBJECTS, "object table full");
        entry.lru = None;
        self.entries.insert(entry);
    }

    /// Removes the record of `id`, unlinking it from its LRU list, and returns it (its
    /// [`Entry::lru`] still says which list it was in).
    pub(super) fn remove(&mut self, id: &ObjectId) -> Option<Entry> {
        let at = self.position(id)?;
        let was_in = self.lru_unlink(at);
        let (mut entry, moved) = self.entries.remove_at(at);
        if moved {
            // The last record moved into the hole: repoint its LRU neighbours.
            let moved = &self.entries[at as usize];
            if let Some(list) = moved.lru {
                let (prev, next) = (moved.lru_prev, moved.lru_next);
                self.set_next(list, prev, at);
                self.set_prev(list, next, at);
            }
        }
        entry.lru = was_in;
        Some(entry)
    }

    /// Appends `id` at the most recently used end of `list`. It must be in the table and in
    /// no LRU list yet.
    pub(super) fn lru_push_back(&mut self, list: Lru, id: &ObjectId) {
        let at = self.position(id).expect("only stored objects join the LRU");
        let tail = self.lists[list.at()].tail;
        let entry = &mut self.entries[at as usize];
        assert!(entry.lru.is_none(), "{id} is in an LRU list already");
        entry.lru = Some(list);
        entry.lru_prev = tail;
        entry.lru_next = NIL;
        self.set_next(list, tail, at);
        let ends = &mut self.lists[list.at()];
        ends.tail = at;
        ends.len += 1;
    }

    /// Takes `id` out of its LRU list if it is in one.
    pub(super) fn lru_remove(&mut self, id: &ObjectId) {
        if let Some(at) = self.position(id) {
            let _ = self.lru_unlink(at);
        }
    }

    /// The least recently used object of `list`, if any.
    pub(super) fn lru_front(&self, list: Lru) -> Option<ObjectId> {
        let head = self.lists[list.at()].head;
        (head != NIL).then(|| self.entries[head as usize].id)
    }

    /// Takes the record at `at` out of its LRU list; returns the list it was in.
    fn lru_unlink(&mut self, at: u32) -> Option<Lru> {
        let entry = &mut self.entries[at as usize];
        let list = entry.lru.take()?;
        let (prev, next) = (entry.lru_prev, entry.lru_next);
        entry.lru_prev = NIL;
        entry.lru_next = NIL;
        self.set_next(list, prev, next);
        self.set_prev(list, next, prev);
        self.lists[list.at()].len -= 1;
        Some(list)
    }

    /// Points `at`'s successor link (or `list`'s head, for [`NIL`]) to `next`.
    fn set_next(&mut self, list: Lru, at: u32, next: u32) {
        match at {
            NIL => self.lists[list.at()].head = next,
            at => self.entries[at as usize].lru_next = next,
        }
    }

    /// Points `at`'s predecessor link (or `list`'s tail, for [`NIL`]) to `prev`.
    fn set_prev(&mut self, list: Lru, at: u32, prev: u32) {
        match at {
            NIL => self.lists[list.at()].tail = prev,
            at => self.entries[at as usize].lru_prev = prev,
        }
    }

    /// Checks the index and the LRU lists against the records; panics on the first
    /// inconsistency. Returns the ids of the evictable list in LRU order.
    pub(super) fn check_invariants(&self) -> Vec<ObjectId> {
        self.entries.check_invariants();
        let mut orders = Lru::ALL.map(|list| self.check_list(list));
        std::mem::take(&mut orders[Lru::Evictable.at()])
    }

    /// Checks one LRU list against the records; returns its ids in LRU order.
    fn check_list(&self, list: Lru) -> Vec<ObjectId> {
        let ends = self.lists[list.at()];
        let mut order = Vec::with_capacity(ends.len);
        let (mut prev, mut at) = (NIL, ends.head);
        while at != NIL {
            assert!(
                order.len() < ends.len,
                "{list:?} list longer than its count"
            );
            let entry = &self.entries[at as usize];
            assert_eq!(
                entry.lru,
                Some(list),
                "{} linked but not marked in the {list:?} list",
                entry.id
            );
            assert_eq!(entry.lru_prev, prev, "LRU back link of {}", entry.id);
            order.push(entry.id);
            (prev, at) = (at, entry.lru_next);
        }
        assert_eq!(ends.tail, prev, "{list:?} list tail");
        assert_eq!(order.len(), ends.len, "{list:?} list count");
        assert_eq!(
            self.entries.iter().filter(|e| e.lru == Some(list)).count(),
            ends.len,
            "records marked in the {list:?} list"
        );
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense_index::SEGMENT_RECORDS;

    fn entry(n: u64) -> Entry {
        let block = LocalRegion {
            arena: ArenaId(0),
            offset: n * 64,
            len: 64,
        };
        Entry::new(ObjectId::from_u64(n), block, 10, 0, true, Instant::ZERO)
    }

    fn lru(table: &ObjectTable) -> Vec<u64> {
        table
            .check_invariants()
            .iter()
            .map(|id| u64::from_be_bytes(id.0[12..].try_into().unwrap()))
            .collect()
    }

    #[test]
    fn record_is_compact() {
        // 80 bytes before the content digest (8 more, and a flag among the others).
        assert!(std::mem::size_of::<Entry>() <= 88);
    }

    #[test]
    fn records_span_segments_and_removals_refill_holes() {
        let total = 2 * SEGMENT_RECORDS as u64 + 10;
        let mut table = ObjectTable::new(7);
        for n in 0..total {
            table.insert(entry(n));
        }
        for n in (0..total).step_by(1000) {
            table.lru_push_back(Lru::Evictable, &ObjectId::from_u64(n));
        }
        assert_eq!(table.entries.segments(), 3);
        // A record of the first segment goes: the last record (in the third) moves into it.
        table.remove(&ObjectId::from_u64(5));
        assert_eq!(
            table.entries[5].id,
            ObjectId::from_u64(total - 1),
            "the last record fills the hole"
        );
        // Emptying the third segment drops it.
        for n in (2 * SEGMENT_RECORDS as u64)..(total - 1) {
            table.remove(&ObjectId::from_u64(n));
        }
        assert_eq!(table.entries.segments(), 2);
        assert_eq!(table.len(), 2 * SEGMENT_RECORDS);
        let expected: Vec<u64> = (0..2 * SEGMENT_RECORDS as u64).step_by(1000).collect();
        assert_eq!(lru(&table), expected);
        assert!(table.get(&ObjectId::from_u64(total - 1)).is_some());
        assert!(table.get(&ObjectId::from_u64(5)).is_none());
        assert_eq!(table.iter().count(), table.len());
    }

    #[test]
    fn removal_keeps_index_and_lru_consistent() {
        let mut table = ObjectTable::new(7);
        for n in 0..6 {
            table.insert(entry(n));
        }
        for n in [3, 0, 5, 1] {
            table.lru_push_back(Lru::Evictable, &ObjectId::from_u64(n));
        }
        assert_eq!(lru(&table), vec![3, 0, 5, 1]);
        // Removing 0 moves the last record (5, in the LRU) into its place.
        let removed = table.remove(&ObjectId::from_u64(0)).unwrap();
        assert_eq!(removed.id, ObjectId::from_u64(0));
        assert!(removed.in_lru(), "it was in the LRU");
        assert_eq!(lru(&table), vec![3, 5, 1]);
        table.lru_remove(&ObjectId::from_u64(3));
        assert_eq!(lru(&table), vec![5, 1]);
        assert_eq!(table.lru_front(Lru::Evictable), Some(ObjectId::from_u64(5)));
        table.remove(&ObjectId::from_u64(1));
        table.remove(&ObjectId::from_u64(5));
        assert_eq!(lru(&table), Vec::<u64>::new());
        assert_eq!(table.lru_front(Lru::Evictable), None);
        assert_eq!(table.len(), 3);
        assert!(table.get(&ObjectId::from_u64(4)).is_some());
        assert!(table.remove(&ObjectId::from_u64(5)).is_none());
    }

    #[test]
    fn the_evictable_and_record_lists_are_kept_apart() {
        let id = ObjectId::from_u64;
        let mut table = ObjectTable::new(7);
        for n in 0..5 {
            table.insert(entry(n));
        }
        table.lru_push_back(Lru::Evictable, &id(0));
        table.lru_push_back(Lru::Record, &id(4));
        table.lru_push_back(Lru::Record, &id(1));
        table.lru_push_back(Lru::Evictable, &id(2));
        // Removing 0 moves the last record (4, in the record list) into its place.
        let removed = table.remove(&id(0)).unwrap();
        assert_eq!(removed.lru(), Some(Lru::Evictable));
        assert_eq!(lru(&table), vec![2]);
        assert_eq!(table.lru_front(Lru::Record), Some(id(4)));
        table.lru_remove(&id(4));
        assert_eq!(table.lru_front(Lru::Record), Some(id(1)));
        assert_eq!(table.get(&id(1)).unwrap().lru(), Some(Lru::Record));
        assert!(!table.get(&id(1)).unwrap().in_lru(), "not evictable");
        table.remove(&id(1));
        assert_eq!(table.lru_front(Lru::Record), None);
        assert_eq!(table.lru_front(Lru::Evictable), Some(id(2)));
        table.check_invariants();
    }
}
