//! Records of objects kept densely and found by id through a hash index of their positions:
//! the shape of every table that holds one record per object (a store's object table, the
//! directory's holder index).
//!
//! A table may hold millions of small records, so the bytes kept per record matter. The
//! records live densely in segments of [`SEGMENT_RECORDS`] (a removal moves the last record
//! into the hole; growing never copies more than one segment, so a table of millions has no
//! pause or transient doubling of its records when it grows), and a hash index of `u32`
//! positions finds a record by its id: the id is stored once, in the record, and the index
//! costs 5 bytes a bucket (it is at most 7/8 full and grows by doubling). A lookup is one probe
//! of the index and one record: a sorted layout needed a binary search whose steps each miss
//! the cache once the table outgrows it (175 ns a lookup among 200,000 records, 650 ns among a
//! million, against 20–70 ns here, on the machines the README's numbers come from).
//!
//! The index is keyed by a seed its owner passes in: drivers draw it at random (ids come from
//! clients, so the index must not be floodable), the simulator from its run seed (so runs
//! replay). Iteration goes over the records in their storage order, which depends only on the
//! sequence of inserts and removals, never on hashing.

use std::hash::BuildHasher;

use foldhash::quality::FixedState;
use hashbrown::HashTable;

use crate::ids::ObjectId;

/// Most records one index holds: positions are `u32`, and `u32::MAX` is kept free (a table may
/// use it as "no record").
pub const MAX_RECORDS: usize = u32::MAX as usize;

/// Records per segment.
pub(crate) const SEGMENT_RECORDS: usize = 1 << 16;

/// A record of a [`DenseIndex`]: it names its object.
pub trait Record {
    /// The object the record is about; it never changes while the record is indexed.
    fn id(&self) -> ObjectId;
}

/// A vector of records in fixed-size segments: indexing is two steps, and a push copies at
/// most the last segment as it grows, never the whole table.
#[derive(Debug)]
struct Segments<T> {
    segments: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Segments<T> {
    fn default() -> Self {
        Self {
            segments: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Segments<T> {
    fn push(&mut self, record: T) {
        if self.len % SEGMENT_RECORDS == 0 {
            self.segments.push(Vec::new());
        }
        self.segments
            .last_mut()
            .expect("a segment with room was just ensured")
            .push(record);
        self.len += 1;
    }

    /// Removes the record at `at`, moving the last record into its place.
    fn swap_remove(&mut self, at: usize) -> T {
        assert!(at < self.len, "record {at} of {}", self.len);
        let last_segment = self.segments.last_mut().expect("not empty");
        let last = last_segment.pop().expect("segments are never left empty");
        if last_segment.is_empty() {
            self.segments.pop();
        }
        self.len -= 1;
        if at == self.len {
            last
        } else {
            std::mem::replace(&mut self[at], last)
        }
    }
}

impl<T> std::ops::Index<usize> for Segments<T> {
    type Output = T;

    fn index(&self, at: usize) -> &T {
        &self.segments[at / SEGMENT_RECORDS][at % SEGMENT_RECORDS]
    }
}

impl<T> std::ops::IndexMut<usize> for Segments<T> {
    fn index_mut(&mut self, at: usize) -> &mut T {
        &mut self.segments[at / SEGMENT_RECORDS][at % SEGMENT_RECORDS]
    }
}

/// Records by object id, densely. See the module documentation.
#[derive(Debug)]
pub struct DenseIndex<T> {
    records: Segments<T>,
    /// Positions in `records`, hashed by the id of the record they point to.
    index: HashTable<u32>,
    hasher: FixedState,
}

impl<T> Default for DenseIndex<T> {
    /// Keyed by seed 0: for tests and tables whose ids nobody outside chooses.
    fn default() -> Self {
        Self::new(0)
    }
}

impl<T> DenseIndex<T> {
    /// An empty index whose hashing is keyed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            records: Segments::default(),
            index: HashTable::new(),
            hasher: FixedState::with_seed(seed),
        }
    }
}

impl<T: Record> DenseIndex<T> {
    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.records.len == 0
    }

    /// Every record, in storage order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.records.segments.iter().flatten()
    }

    /// Where the record of `id` is.
    pub fn position(&self, id: &ObjectId) -> Option<u32> {
        let hash = self.hasher.hash_one(id);
        self.index
            .find(hash, |&at| self.records[at as usize].id() == *id)
            .copied()
    }

    /// The record of `id`.
    pub fn get(&self, id: &ObjectId) -> Option<&T> {
        self.position(id).map(|at| &self.records[at as usize])
    }

    /// The record of `id`, to change (never its id).
    pub fn get_mut(&mut self, id: &ObjectId) -> Option<&mut T> {
        self.position(id).map(|at| &mut self.records[at as usize])
    }

    /// Adds a record whose id is not indexed yet; returns its position. The caller keeps the
    /// index below [`MAX_RECORDS`]; both are asserted.
    pub fn insert(&mut self, record: T) -> u32 {
        assert!(self.len() < MAX_RECORDS, "index full");
        let id = record.id();
        assert!(self.position(&id).is_none(), "{id} inserted twice");
        // Below MAX_RECORDS, checked above.
        let at = self.len() as u32;
        self.records.push(record);
        let (records, hasher) = (&self.records, &self.hasher);
        self.index.insert_unique(hasher.hash_one(id), at, |&other| {
            hasher.hash_one(records[other as usize].id())
        });
        at
    }

    /// Removes the record at `at` (a position this index gave). The last record moves into
    /// its place: the second value says so (the moved record is now at `at`), so a table that
    /// links records by position can repoint its links.
    pub fn remove_at(&mut self, at: u32) -> (T, bool) {
        let id = self.records[at as usize].id();
        let removed = self
            .index
            .find_entry(self.hasher.hash_one(id), |&other| other == at)
            .map(|slot| slot.remove())
            .is_ok();
        assert!(removed, "record {at} is indexed");
        let last = (self.len() - 1) as u32;
        let moved = at != last;
        if moved {
            let moved_hash = self.hasher.hash_one(self.records[last as usize].id());
            let slot = self
                .index
                .find_mut(moved_hash, |&other| other == last)
                .expect("every record is indexed");
            *slot = at;
        }
        (self.records.swap_remove(at as usize), moved)
    }

    /// Removes the record of `id`.
    pub fn remove(&mut self, id: &ObjectId) -> Option<T> {
        let at = self.position(id)?;
        Some(self.remove_at(at).0)
    }

    /// Keeps only the records `keep` says yes to (it may change them, never their ids), in one
    /// pass.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        let mut at = 0;
        while at < self.len() {
            if keep(&mut self.records[at]) {
                at += 1;
            } else {
                // The last record moves here; it is looked at next.
                let _ = self.remove_at(at as u32);
            }
        }
    }

    /// Segments in use (each holds [`SEGMENT_RECORDS`] records but the last).
    #[cfg(test)]
    pub(crate) fn segments(&self) -> usize {
        self.records.segments.len()
    }

    /// Asserts that the index finds every record where it is (a bug if it fails).
    pub fn check_invariants(&self) {
        assert_eq!(self.index.len(), self.len(), "index size");
        for (at, record) in self.iter().enumerate() {
            assert_eq!(
                self.position(&record.id()),
                Some(at as u32),
                "index of {}",
                record.id()
            );
        }
    }
}

impl<T> std::ops::Index<usize> for DenseIndex<T> {
    type Output = T;

    fn index(&self, at: usize) -> &T {
        &self.records[at]
    }
}

impl<T> std::ops::IndexMut<usize> for DenseIndex<T> {
    /// The record at `at`, to change (never its id: the index would no longer find it).
    fn index_mut(&mut self, at: usize) -> &mut T {
        &mut self.records[at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq)]
    struct Named(ObjectId, u64);

    impl Record for Named {
        fn id(&self) -> ObjectId {
            self.0
        }
    }

    fn id(n: u64) -> ObjectId {
        ObjectId::from_u64(n)
    }

    #[test]
    fn finds_what_it_holds_across_segments_and_removals() {
        let mut index = DenseIndex::new(7);
        let total = 2 * SEGMENT_RECORDS as u64 + 10;
        for n in 0..total {
            assert_eq!(index.insert(Named(id(n), n)), n as u32);
        }
        // Remove from the front, the middle and the end: the last record moves into each hole.
        for n in [0, SEGMENT_RECORDS as u64, total - 1, 5] {
            assert_eq!(index.remove(&id(n)), Some(Named(id(n), n)));
            assert!(index.get(&id(n)).is_none());
        }
        assert_eq!(index.len(), total as usize - 4);
        index.check_invariants();
        for n in (1..total - 1).filter(|n| ![5, SEGMENT_RECORDS as u64].contains(n)) {
            assert_eq!(index.get(&id(n)).map(|r| r.1), Some(n), "{n}");
        }
    }

    #[test]
    fn remove_at_says_whether_the_last_record_moved_into_the_hole() {
        let mut index = DenseIndex::new(1);
        for n in 0..3 {
            index.insert(Named(id(n), n));
        }
        let (removed, moved) = index.remove_at(0);
        assert_eq!((removed.1, moved), (0, true));
        assert_eq!(index[0].1, 2, "the last record moved to position 0");
        assert_eq!(index.position(&id(2)), Some(0));
        let (removed, moved) = index.remove_at(1);
        assert_eq!((removed.1, moved), (1, false), "the last record itself");
        index.check_invariants();
    }

    #[test]
    fn retain_matches_a_sorted_map_model() {
        let mut index = DenseIndex::new(3);
        let mut model = BTreeMap::new();
        for n in 0..5_000u64 {
            index.insert(Named(id(n * 7 % 5_003), n));
            model.insert(id(n * 7 % 5_003), n);
        }
        index.retain(|r| {
            r.1 += 1;
            r.1 % 3 != 0
        });
        model.retain(|_, v| {
            *v += 1;
            *v % 3 != 0
        });
        index.check_invariants();
        let mut held: Vec<(ObjectId, u64)> = index.iter().map(|r| (r.0, r.1)).collect();
        held.sort();
        let expected: Vec<(ObjectId, u64)> = model.into_iter().collect();
        assert_eq!(held, expected);
    }

    #[test]
    #[should_panic(expected = "inserted twice")]
    fn an_id_is_indexed_once() {
        let mut index = DenseIndex::new(0);
        index.insert(Named(id(1), 1));
        index.insert(Named(id(1), 2));
    }
}
