//! Offset allocator over the store's arenas.
//!
//! Each arena keeps its free space as blocks indexed two ways: by offset (to coalesce a freed
//! block with its neighbours in O(log n)) and by (length, offset) (best fit in O(log n), ties to
//! the lowest offset so layouts are deterministic). Every block's offset and length is a multiple
//! of [`ALIGNMENT`], so every object starts on a cache line and RDMA READs of it are aligned.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::ArenaId;
use crate::region::LocalRegion;

/// Alignment of every allocation, in bytes (one cache line).
pub const ALIGNMENT: u64 = 64;

/// Rounds `len` up to a whole number of [`ALIGNMENT`] units, at least one unit.
/// `None` if that overflows.
pub fn block_len_for(len: u64) -> Option<u64> {
    let len = len.max(1);
    len.checked_add(ALIGNMENT - 1).map(|n| n & !(ALIGNMENT - 1))
}

/// Free-space bookkeeping for one arena.
#[derive(Debug, Clone)]
pub struct ArenaAllocator {
    size_bytes: u64,
    /// The size given, before rounding down to the alignment.
    given_bytes: u64,
    free_by_offset: BTreeMap<u64, u64>,
    free_by_len: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl ArenaAllocator {
    /// An allocator for an arena of `size_bytes` (rounded down to the alignment).
    pub fn new(given_bytes: u64) -> Self {
        let size_bytes = given_bytes & !(ALIGNMENT - 1);
        let mut allocator = Self {
            size_bytes,
            given_bytes,
            free_by_offset: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            free_bytes: 0,
        };
        if size_bytes > 0 {
            allocator.insert_free(0, size_bytes);
        }
        allocator
    }

    /// Usable size of the arena.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Size of the arena as given (what the store reports as its capacity), of which the
    /// bytes past the last whole [`ALIGNMENT`] unit hold no object.
    pub fn given_bytes(&self) -> u64 {
        self.given_bytes
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Length of the largest free block.
    pub fn largest_free_block(&self) -> u64 {
        self.free_by_len.last().map_or(0, |&(len, _)| len)
    }

    /// Number of free blocks (1 when nothing is allocated: free space fully coalesced).
    pub fn free_block_count(&self) -> usize {
        self.free_by_offset.len()
    }

    /// Allocates `block_len` bytes (a multiple of [`ALIGNMENT`]) by best fit; returns the
    /// offset, or `None` if no free block is large enough.
    pub fn allocate(&mut self, block_len: u64) -> Option<u64> {
        assert!(
            block_len > 0 && block_len % ALIGNMENT == 0,
            "unaligned block {block_len}"
        );
        let &(found_len, offset) = self.free_by_len.range((block_len, 0)..).next()?;
        self.remove_free(offset, found_len);
        if found_len > block_len {
            self.insert_free(offset + block_len, found_len - block_len);
        }
        Some(offset)
    }

    /// Returns `[offset, offset + block_len)` to the free space, merging it with free
    /// neighbours. Freeing space that is already free is a bug and panics.
    pub fn free(&mut self, offset: u64, block_len: u64) {
        assert!(
            offset % ALIGNMENT == 0 && block_len % ALIGNMENT == 0 && block_len > 0,
            "unaligned free {offset}+{block_len}"
        );
        assert!(
            offset + block_len <= self.size_bytes,
            "free past the arena end"
        );
        let mut start = offset;
        let mut len = block_len;
        if let Some((&prev_offset, &prev_len)) = self.free_by_offset.range(..offset).next_back() {
            assert!(prev_offset + prev_len <= offset, "double free at {offset}");
            if prev_offset + prev_len == offset {
                self.remove_free(prev_offset, prev_len);
                start = prev_offset;
                len += prev_len;
            }
        }
        if let Some((&next_offset, &next_len)) = self.free_by_offset.range(offset..).next() {
            assert!(offset + block_len <= next_offset, "double free at {offset}");
            if offset + block_len == next_offset {
                self.remove_free(next_offset, next_len);
                len += next_len;
            }
        }
        self.insert_free(start, len);
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.insert(offset, len);
        self.free_by_len.insert((len, offset));
        self.free_bytes += len;
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.remove(&offset);
        self.free_by_len.remove(&(len, offset));
        self.free_bytes -= len;
    }
}

/// The allocator over all arenas of a store: first arena that fits, in arena order.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    arenas: Vec<(ArenaId, ArenaAllocator)>,
}

impl Allocator {
    /// An allocator over arenas of the given ids and sizes.
    pub fn new(arenas: impl IntoIterator<Item = (ArenaId, u64)>) -> Self {
        Self {
            arenas: arenas
                .into_iter()
                .map(|(id, size)| (id, ArenaAllocator::new(size)))
                .collect(),
        }
    }

    /// Allocates a block for `len` bytes; the region's length is the aligned block length.
    pub fn allocate(&mut self, len: u64) -> Option<LocalRegion> {
        let block_len = block_len_for(len)?;
        self.arenas.iter_mut().find_map(|(arena, allocator)| {
            allocator.allocate(block_len).map(|offset| LocalRegion {
                arena: *arena,
                offset,
                len: block_len,
            })
        })
    }

    /// Frees a region returned by [`Allocator::allocate`].
    pub fn free(&mut self, region: LocalRegion) {
        let (_, allocator) = self
            .arenas
            .iter_mut()
            .find(|(arena, _)| *arena == region.arena)
            .unwrap_or_else(|| panic!("free of {region} in an unknown arena"));
        allocator.free(region.offset, region.len);
    }

    /// Marks `region` allocated (recovery of a persistent store). `false` if any of it is not
    /// free, in which case nothing changes.
    pub fn reserve(&mut self, region: LocalRegion) -> bool {
        let Some((_, allocator)) = self.arenas.iter_mut().find(|(a, _)| *a == region.arena) else {
            return false;
        };
        let Some((&free_offset, &free_len)) =
            allocator.free_by_offset.range(..=region.offset).next_back()
        else {
            return false;
        };
        if region.len == 0
            || region.len % ALIGNMENT != 0
            || region.offset % ALIGNMENT != 0
            || free_offset + free_len < region.end()
        {
            return false;
        }
        allocator.remove_free(free_offset, free_len);
        if free_offset < region.offset {
            allocator.insert_free(free_offset, region.offset - free_offset);
        }
        if region.end() < free_offset + free_len {
            allocator.insert_free(region.end(), free_offset + free_len - region.end());
        }
        true
    }

    /// Total usable bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.arenas.iter().map(|(_, a)| a.size_bytes()).sum()
    }

    /// Total bytes of the arenas as given ([`ArenaAllocator::given_bytes`]).
    pub fn given_bytes(&self) -> u64 {
        self.arenas.iter().map(|(_, a)| a.given_bytes()).sum()
    }

    /// Total free bytes (possibly fragmented).
    pub fn free_bytes(&self) -> u64 {
        self.arenas.iter().map(|(_, a)| a.free_bytes()).sum()
    }

    /// Whether a block for `len` bytes could be allocated right now.
    pub fn fits(&self, len: u64) -> bool {
        block_len_for(len).is_some_and(|block| {
            self.arenas
                .iter()
                .any(|(_, a)| a.largest_free_block() >= block)
        })
    }

    /// Per-arena allocators, in arena order.
    pub fn arenas(&self) -> impl Iterator<Item = (ArenaId, &ArenaAllocator)> {
        self.arenas.iter().map(|(id, a)| (*id, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut arena = ArenaAllocator::new(1024);
        let a = arena.allocate(128).unwrap();
        let b = arena.allocate(64).unwrap();
        let c = arena.allocate(256).unwrap();
        assert_eq!((a, b, c), (0, 128, 192));
        arena.free(b, 64);
        // Best fit: the 64-byte hole, not the tail.
        assert_eq!(arena.allocate(64), Some(128));
        arena.free(128, 64);
        arena.free(a, 128);
        arena.free(c, 256);
        assert_eq!(arena.free_block_count(), 1);
        assert_eq!(arena.free_bytes(), 1024);
    }

    #[test]
    fn an_arena_of_an_odd_size_reports_it_and_uses_whole_blocks() {
        let allocator = Allocator::new([(ArenaId(0), 10_000), (ArenaId(1), 640)]);
        assert_eq!(allocator.given_bytes(), 10_640);
        assert_eq!(allocator.capacity_bytes(), 9_984 + 640);
        assert_eq!(allocator.free_bytes(), allocator.capacity_bytes());
    }

    #[test]
    fn block_len_rounds_up_to_alignment() {
        assert_eq!(block_len_for(0), Some(64));
        assert_eq!(block_len_for(1), Some(64));
        assert_eq!(block_len_for(64), Some(64));
        assert_eq!(block_len_for(65), Some(128));
        assert_eq!(block_len_for(u64::MAX), None);
    }

    #[test]
    fn reserve_carves_a_free_block() {
        let mut allocator = Allocator::new([(ArenaId(0), 1024)]);
        let region = LocalRegion {
            arena: ArenaId(0),
            offset: 256,
            len: 128,
        };
        assert!(allocator.reserve(region));
        assert!(!allocator.reserve(region), "already taken");
        assert_eq!(allocator.free_bytes(), 1024 - 128);
        allocator.free(region);
        assert_eq!(allocator.arenas().next().unwrap().1.free_block_count(), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate(u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..5000).prop_map(Op::Allocate),
            any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        /// No two live blocks overlap, all are aligned and inside an arena, free bytes add up,
        /// and freeing everything coalesces each arena back into one block.
        #[test]
        fn allocator_never_overlaps_and_fully_coalesces(ops in prop::collection::vec(op(), 1..300)) {
            let sizes = [(ArenaId(0), 64 * 1024), (ArenaId(1), 16 * 1024)];
            let mut allocator = Allocator::new(sizes);
            let mut live: Vec<LocalRegion> = Vec::new();
            for op in ops {
                match op {
                    Op::Allocate(len) => {
                        if let Some(region) = allocator.allocate(len) {
                            prop_assert_eq!(region.offset % ALIGNMENT, 0);
                            prop_assert!(region.len >= len);
                            let arena_size = sizes.iter().find(|(a, _)| *a == region.arena).unwrap().1;
                            prop_assert!(region.end() <= arena_size);
                            for other in &live {
                                let disjoint = other.arena != region.arena
                                    || other.end() <= region.offset
                                    || region.end() <= other.offset;
                                prop_assert!(disjoint, "{} overlaps {}", region, other);
                            }
                            live.push(region);
                        } else {
                            prop_assert!(!allocator.fits(len));
                        }
                    }
                    Op::Free(index) => {
                        if !live.is_empty() {
                            let region = live.swap_remove(index % live.len());
                            allocator.free(region);
                        }
                    }
                }
                let used: u64 = live.iter().map(|r| r.len).sum();
                prop_assert_eq!(allocator.free_bytes() + used, allocator.capacity_bytes());
            }
            for region in live.drain(..) {
                allocator.free(region);
            }
            for (_, arena) in allocator.arenas() {
                prop_assert_eq!(arena.free_block_count(), 1);
            }
        }
    }
}
