//! A sorted map for millions of small entries that stays compact whatever order keys arrive in.
//!
//! A B-tree map leaves its nodes half full when keys arrive in increasing order (object ids
//! made from counters or timestamps), which doubles the memory per entry of a map that holds
//! one entry per object. [`SortedChunks`] keeps the entries in sorted chunks of up to
//! [`CHUNK_ENTRIES`], found through a B-tree of each chunk's first key. A key past the end of a
//! full chunk goes to the front of the next or starts a chunk of its own; a key inside a full
//! chunk splits it there, the part before complete and trimmed, the part after open for the
//! keys still missing (writers interleaved, one lagging behind). Chunks grow by a quarter, so
//! unused capacity stays small. Lookups are a B-tree search over the chunks and a binary
//! search in one.

use std::collections::BTreeMap;
use std::ops::Bound;

/// Most entries of one chunk.
pub const CHUNK_ENTRIES: usize = 512;

/// Fewest entries a chunk grows by when full of its capacity.
const GROWTH_MIN: usize = 16;

/// A chunk of one entry, with room for a few more.
fn new_chunk<K, V>(key: K, value: V) -> Vec<(K, V)> {
    let mut chunk = Vec::with_capacity(GROWTH_MIN);
    chunk.push((key, value));
    chunk
}

/// Room for one more entry: a quarter more (at least [`GROWTH_MIN`], at most up to
/// [`CHUNK_ENTRIES`]), so chunks carry little unused capacity.
fn grow_for_one<T>(chunk: &mut Vec<T>) {
    if chunk.len() == chunk.capacity() {
        let more = (chunk.len() / 4)
            .max(GROWTH_MIN)
            .min(CHUNK_ENTRIES.saturating_sub(chunk.len()))
            .max(1);
        chunk.reserve_exact(more);
    }
}

/// A sorted map of `K` to `V` in nearly full chunks. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortedChunks<K, V> {
    /// Each chunk under its first key; no chunk is empty.
    chunks: BTreeMap<K, Vec<(K, V)>>,
    len: usize,
}

impl<K, V> Default for SortedChunks<K, V> {
    fn default() -> Self {
        Self {
            chunks: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy, V> SortedChunks<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries in the map.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds or would hold `key`: the last starting at or before it, or the
    /// first.
    fn chunk_of(&self, key: &K) -> Option<K> {
        self.chunks
            .range(..=*key)
            .next_back()
            .or_else(|| self.chunks.iter().next())
            .map(|(first, _)| *first)
    }

    /// The value under `key`: one B-tree search (the last chunk starting at or before `key`,
    /// the only one that can hold it) and a binary search in that chunk. A lookup is most of
    /// what the head does per request, so it does not search the B-tree twice.
    pub fn get(&self, key: &K) -> Option<&V> {
        let (_, chunk) = self.chunks.range(..=*key).next_back()?;
        let at = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(&chunk[at].1)
    }

    /// The value under `key`, to change in place (searched as [`SortedChunks::get`] does).
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let (_, chunk) = self.chunks.range_mut(..=*key).next_back()?;
        let at = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(&mut chunk[at].1)
    }

    /// Whether `key` is in the map.
    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Puts `value` under `key`; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        if let Some(old) = self.get_mut(&key) {
            return Some(std::mem::replace(old, value));
        }
        self.len += 1;
        let Some(first) = self.chunk_of(&key) else {
            self.chunks.insert(key, new_chunk(key, value));
            return None;
        };
        let chunk = self.chunks.get(&first).expect("chunk_of names a chunk");
        let at = chunk
            .binary_search_by(|(k, _)| k.cmp(&key))
            .expect_err("not in the map yet");
        if chunk.len() < CHUNK_ENTRIES {
            let mut chunk = self.chunks.remove(&first).expect("chunk_of names a chunk");
            grow_for_one(&mut chunk);
            chunk.insert(at, (key, value));
            self.chunks.insert(chunk[0].0, chunk);
            return None;
        }
        if at == CHUNK_ENTRIES {
            // Past the end of a full chunk: the front of the next one, if it has room.
            let next = self
                .chunks
                .range((Bound::Excluded(first), Bound::Unbounded))
                .next()
                .filter(|(_, next)| next.len() < CHUNK_ENTRIES)
                .map(|(next_first, _)| *next_first);
            if let Some(next_first) = next {
                let mut next = self.chunks.remove(&next_first).expect("just found");
                grow_for_one(&mut next);
                next.insert(0, (key, value));
                self.chunks.insert(key, next);
                return None;
            }
        }
        if at == 0 || at == CHUNK_ENTRIES {
            // Before the first chunk or past a full one: a chunk of its own, which the keys
            // that follow fill.
            self.chunks.insert(key, new_chunk(key, value));
            return None;
        }
        // Full, and the key falls inside: split at the key. The part before it is complete
        // (it keeps no spare room); the key starts the part after it, which the keys still
        // missing between (a writer lagging behind others) fill.
        let mut left = self.chunks.remove(&first).expect("chunk_of names a chunk");
        let mut right = Vec::with_capacity(left.len() - at + 1 + GROWTH_MIN);
        right.push((key, value));
        right.extend(left.drain(at..));
        left.shrink_to_fit();
        self.chunks.insert(first, left);
        self.chunks.insert(key, right);
        None
    }

    /// Takes `key` out of the map; returns its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let first = self.chunk_of(key)?;
        let chunk = self.chunks.get_mut(&first)?;
        let at = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        let (_, value) = chunk.remove(at);
        self.len -= 1;
        self.settle(first);
        Some(value)
    }

    /// Keeps only the entries `keep` says yes to (it may change their values), in one pass.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let firsts: Vec<K> = self.chunks.keys().copied().collect();
        for first in firsts {
            let chunk = self.chunks.get_mut(&first).expect("listed above");
            let before = chunk.len();
            chunk.retain_mut(|(k, v)| keep(k, v));
            self.len -= before - chunk.len();
            self.settle(first);
        }
    }

    /// After entries left the chunk under `first`: drops it when empty, files it under its new
    /// first key, and gives back memory when it shrank to a quarter of its capacity.
    fn settle(&mut self, first: K) {
        // Most often the chunk kept its first entry and its memory: nothing to re-file.
        if let Some(chunk) = self.chunks.get(&first) {
            let kept_first = chunk.first().is_some_and(|(k, _)| *k == first);
            if kept_first && chunk.len() >= chunk.capacity() / 4 {
                return;
            }
        }
        let Some(mut chunk) = self.chunks.remove(&first) else {
            return;
        };
        if let Some(&(new_first, _)) = chunk.first() {
            if chunk.len() < chunk.capacity() / 4 {
                chunk.shrink_to(chunk.len() * 2);
            }
            self.chunks.insert(new_first, chunk);
        }
    }

    /// Every entry, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.chunks
            .values()
            .flat_map(|chunk| chunk.iter().map(|(k, v)| (k, v)))
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// Chunks in use.
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Asserts the map's own consistency (a bug if it fails).
    pub fn check_invariants(&self) {
        let mut previous: Option<&K> = None;
        let mut count = 0;
        for (first, chunk) in &self.chunks {
            assert!(!chunk.is_empty(), "empty chunk");
            assert!(chunk[0].0 == *first, "chunk filed under its first key");
            assert!(chunk.len() <= CHUNK_ENTRIES);
            for (key, _) in chunk {
                assert!(previous < Some(key), "keys sorted and unique across chunks");
                previous = Some(key);
                count += 1;
            }
        }
        assert_eq!(count, self.len, "length");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_like_a_btree_map_under_any_order() {
        let mut map = SortedChunks::new();
        let mut model = BTreeMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for step in 0..30_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let key = seed % 4000;
            if (seed >> 40) % 3 == 0 {
                assert_eq!(map.remove(&key), model.remove(&key));
            } else {
                assert_eq!(map.insert(key, step), model.insert(key, step));
            }
            assert_eq!(map.get(&key), model.get(&key));
            if step % 2000 == 0 {
                map.check_invariants();
                assert!(map.iter().eq(model.iter()));
            }
        }
        map.retain(|k, v| {
            *v += 1;
            k % 2 == 0
        });
        model.retain(|k, v| {
            *v += 1;
            k % 2 == 0
        });
        map.check_invariants();
        assert!(map.iter().eq(model.iter()));
        assert_eq!((map.len(), map.is_empty()), (model.len(), model.is_empty()));
        assert!(map.keys().eq(model.keys()));
    }

    /// Entries the chunks have room for, in all.
    fn capacity<K, V>(map: &SortedChunks<K, V>) -> usize {
        map.chunks.values().map(Vec::capacity).sum()
    }

    #[test]
    fn interleaved_writers_one_lagging_leave_little_unused_room() {
        // Eight writers, each publishing ids `w, w + 8, w + 16, …`; writer 0 runs at half the
        // others' pace, so its ids land inside chunks the others already filled.
        let mut map = SortedChunks::new();
        let mut next = [0u64; 8];
        for round in 0..40_000u64 {
            for (w, n) in next.iter_mut().enumerate() {
                if w == 0 && round % 2 == 1 {
                    continue;
                }
                map.insert(*n * 8 + w as u64, ());
                *n += 1;
            }
        }
        map.check_invariants();
        let (len, room) = (map.len(), capacity(&map));
        assert!(room * 10 <= len * 13, "{room} slots for {len} entries");
    }

    #[test]
    fn keys_in_increasing_order_fill_chunks() {
        let mut map = SortedChunks::new();
        let n = 10 * CHUNK_ENTRIES as u64;
        for i in 0..n {
            map.insert(i, ());
        }
        map.check_invariants();
        // Nearly full chunks, not the half-full nodes a B-tree leaves.
        assert!(map.chunks() <= 11, "{} chunks", map.chunks());
        assert!(capacity(&map) * 10 <= map.len() * 11);
        // Nearly increasing (several writers interleaved) fills them too.
        let mut map = SortedChunks::new();
        for i in 0..n {
            map.insert(i ^ 7, ());
        }
        assert!(map.chunks() <= 11, "{} chunks", map.chunks());
        assert!(capacity(&map) * 10 <= map.len() * 11);
    }
}
