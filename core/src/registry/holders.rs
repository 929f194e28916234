//! The registry's per-object state: which nodes hold an object, each with the sizes it
//! published. The head keeps one entry for every object of the cluster, so an entry is the
//! object id and 16 bytes ([`Holders`]: one holder inline, boxed only for the rare others), in
//! sorted chunks that stay nearly full ([`HolderIndex`]).

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use crate::ids::{NodeId, ObjectId};
use crate::wire::ObjectSizes;

/// Most entries of one chunk of a [`HolderIndex`].
const CHUNK_ENTRIES: usize = 512;

/// Every published object with its holders, sorted by object id.
///
/// A B-tree map leaves its nodes half full when keys arrive in increasing order (ids made
/// from counters or timestamps), which doubles the head's memory per object. This index keeps
/// the entries in sorted chunks of up to [`CHUNK_ENTRIES`], found through a map from each
/// chunk's first id; a full chunk splits at the insertion point (never below half), so ids
/// arriving in order fill chunks to the brim and random ones leave them at least half full.
#[derive(Debug, Default)]
pub(super) struct HolderIndex {
    /// Each chunk under its first id; no chunk is empty.
    chunks: BTreeMap<ObjectId, Vec<(ObjectId, Holders)>>,
    len: usize,
}

impl HolderIndex {
    /// The chunk that would hold `id`: the last one starting at or before it (or the first).
    fn chunk_key(&self, id: &ObjectId) -> Option<ObjectId> {
        self.chunks
            .range(..=*id)
            .next_back()
            .or_else(|| self.chunks.iter().next())
            .map(|(first, _)| *first)
    }

    /// Objects listed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// The holders of `id`.
    pub(super) fn get(&self, id: &ObjectId) -> Option<&Holders> {
        let chunk = self.chunks.get(&self.chunk_key(id)?)?;
        let at = chunk.binary_search_by(|(k, _)| k.cmp(id)).ok()?;
        Some(&chunk[at].1)
    }

    /// The holders of `id`, to change (never to leave empty: see [`Holders::remove`]).
    fn get_mut(&mut self, id: &ObjectId) -> Option<&mut Holders> {
        let key = self.chunk_key(id)?;
        let chunk = self.chunks.get_mut(&key)?;
        let at = chunk.binary_search_by(|(k, _)| k.cmp(id)).ok()?;
        Some(&mut chunk[at].1)
    }

    /// Lists `node` as holding `id` with `sizes` (replacing the sizes it published before).
    pub(super) fn publish(&mut self, id: ObjectId, node: NodeId, sizes: ObjectSizes) {
        if let Some(holders) = self.get_mut(&id) {
            holders.insert(node, sizes);
            return;
        }
        self.len += 1;
        let entry = (id, Holders::one(node, sizes));
        let Some(key) = self.chunk_key(&id) else {
            let mut chunk = Vec::with_capacity(CHUNK_ENTRIES);
            chunk.push(entry);
            self.chunks.insert(id, chunk);
            return;
        };
        let mut chunk = self.chunks.remove(&key).expect("chunk_key names a chunk");
        let at = chunk
            .binary_search_by(|(k, _)| k.cmp(&id))
            .expect_err("not listed yet");
        if chunk.len() < CHUNK_ENTRIES {
            chunk.insert(at, entry);
            self.chunks.insert(chunk[0].0, chunk);
            return;
        }
        // Full: split at the insertion point, but never leave the left part under half.
        let split = at.max(CHUNK_ENTRIES / 2);
        let mut right = Vec::with_capacity(CHUNK_ENTRIES);
        right.extend(chunk.drain(split..));
        if at < split {
            chunk.insert(at, entry);
        } else {
            right.insert(at - split, entry);
        }
        for part in [chunk, right] {
            if let Some(&(first, _)) = part.first() {
                self.chunks.insert(first, part);
            }
        }
    }

    /// Takes `node` off the holders of `id`, and `id` off the index when none is left.
    /// Whether `node` was listed.
    pub(super) fn withdraw(&mut self, id: &ObjectId, node: NodeId) -> bool {
        let Some(key) = self.chunk_key(id) else {
            return false;
        };
        let chunk = self.chunks.get_mut(&key).expect("chunk_key names a chunk");
        let Ok(at) = chunk.binary_search_by(|(k, _)| k.cmp(id)) else {
            return false;
        };
        if !chunk[at].1.contains(node) {
            return false;
        }
        if !chunk[at].1.remove(node) {
            chunk.remove(at);
            self.len -= 1;
            self.settle(key);
        }
        true
    }

    /// Takes `node` off every object's holders (one pass).
    pub(super) fn withdraw_everywhere(&mut self, node: NodeId) {
        let keys: Vec<ObjectId> = self.chunks.keys().copied().collect();
        for key in keys {
            let chunk = self.chunks.get_mut(&key).expect("listed above");
            let before = chunk.len();
            chunk.retain_mut(|(_, holders)| holders.remove(node));
            self.len -= before - chunk.len();
            self.settle(key);
        }
    }

    /// After entries left the chunk under `key`: drops it when empty, files it under its new
    /// first id, and gives back memory when it shrank to a quarter.
    fn settle(&mut self, key: ObjectId) {
        let Some(mut chunk) = self.chunks.remove(&key) else {
            return;
        };
        if let Some(&(first, _)) = chunk.first() {
            if chunk.len() < chunk.capacity() / 4 {
                chunk.shrink_to(chunk.len() * 2);
            }
            self.chunks.insert(first, chunk);
        }
    }

    /// Every object with its holders, by object id.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&ObjectId, &Holders)> + '_ {
        self.chunks
            .values()
            .flat_map(|chunk| chunk.iter().map(|(id, holders)| (id, holders)))
    }

    /// Asserts the index's own consistency (a bug if it fails).
    pub(super) fn check_invariants(&self) {
        let mut previous: Option<ObjectId> = None;
        let mut count = 0;
        for (first, chunk) in &self.chunks {
            assert!(!chunk.is_empty(), "empty chunk under {first}");
            assert_eq!(chunk[0].0, *first, "chunk filed under its first id");
            assert!(chunk.len() <= CHUNK_ENTRIES);
            for (id, _) in chunk {
                assert!(previous < Some(*id), "ids sorted and unique across chunks");
                previous = Some(*id);
                count += 1;
            }
        }
        assert_eq!(count, self.len, "length");
    }
}

/// The holders of one object, sorted by node id; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Holders {
    /// One holder whose metadata size fits in 32 bits: nearly every object. The node id is
    /// stored plus one, so a zero there tells this variant from `Many` without a tag (the
    /// enum stays 16 bytes).
    One {
        node_plus_one: NonZeroU32,
        metadata_size: u32,
        data_size: u64,
    },
    /// Any other set: two or more holders, or one that does not fit `One`. Sorted by node id.
    /// Boxed twice on purpose: a thin pointer keeps the enum at 16 bytes.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<(NodeId, ObjectSizes)>>),
}

impl Holders {
    /// A single holder.
    pub(super) fn one(node: NodeId, sizes: ObjectSizes) -> Self {
        let inline = node
            .0
            .checked_add(1)
            .and_then(NonZeroU32::new)
            .zip(u32::try_from(sizes.metadata_size).ok());
        match inline {
            Some((node_plus_one, metadata_size)) => Holders::One {
                node_plus_one,
                metadata_size,
                data_size: sizes.data_size,
            },
            None => Holders::Many(Box::new(vec![(node, sizes)])),
        }
    }

    /// From a list sorted by node id; `None` when it is empty.
    fn from_sorted(list: Vec<(NodeId, ObjectSizes)>) -> Option<Self> {
        match list.as_slice() {
            [] => None,
            [(node, sizes)] => Some(Self::one(*node, *sizes)),
            _ => Some(Holders::Many(Box::new(list))),
        }
    }

    /// The holders with their sizes, by node id.
    pub(super) fn iter(&self) -> impl Iterator<Item = (NodeId, ObjectSizes)> + '_ {
        let (single, many) = match self {
            Holders::One {
                node_plus_one,
                metadata_size,
                data_size,
            } => (
                Some((
                    NodeId(node_plus_one.get() - 1),
                    ObjectSizes {
                        data_size: *data_size,
                        metadata_size: u64::from(*metadata_size),
                    },
                )),
                &[][..],
            ),
            Holders::Many(list) => (None, list.as_slice()),
        };
        single.into_iter().chain(many.iter().copied())
    }

    /// Whether `node` is listed.
    pub(super) fn contains(&self, node: NodeId) -> bool {
        self.iter().any(|(holder, _)| holder == node)
    }

    /// Lists `node` with `sizes`, replacing the sizes it published before.
    pub(super) fn insert(&mut self, node: NodeId, sizes: ObjectSizes) {
        let mut list: Vec<(NodeId, ObjectSizes)> = self.iter().collect();
        match list.binary_search_by_key(&node, |&(holder, _)| holder) {
            Ok(at) => list[at].1 = sizes,
            Err(at) => list.insert(at, (node, sizes)),
        }
        *self = Self::from_sorted(list).expect("at least the node just listed");
    }

    /// Removes `node`; `false` when no holder is left (the caller drops the entry).
    #[must_use]
    pub(super) fn remove(&mut self, node: NodeId) -> bool {
        if !self.contains(node) {
            return true;
        }
        let list: Vec<(NodeId, ObjectSizes)> =
            self.iter().filter(|&(holder, _)| holder != node).collect();
        match Self::from_sorted(list) {
            Some(rest) => {
                *self = rest;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> ObjectId {
        ObjectId::from_u64(n)
    }

    /// A model to compare with: the index must answer as a sorted map would.
    fn check_against(index: &HolderIndex, model: &BTreeMap<ObjectId, Vec<(NodeId, ObjectSizes)>>) {
        index.check_invariants();
        assert_eq!(index.len(), model.len());
        let listed: Vec<(ObjectId, Vec<(NodeId, ObjectSizes)>)> = index
            .iter()
            .map(|(id, h)| (*id, h.iter().collect()))
            .collect();
        let expected: Vec<(ObjectId, Vec<(NodeId, ObjectSizes)>)> =
            model.iter().map(|(id, h)| (*id, h.clone())).collect();
        assert_eq!(listed, expected);
    }

    #[test]
    fn the_index_answers_like_a_sorted_map_under_any_order() {
        let mut index = HolderIndex::default();
        let mut model: BTreeMap<ObjectId, Vec<(NodeId, ObjectSizes)>> = BTreeMap::new();
        // A fixed pseudo-random sequence of publishes and withdrawals over few ids and nodes,
        // so chunks split, empty and refill.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for step in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let object = id(seed % 3000);
            let node = NodeId((seed >> 20) as u32 % 3);
            if (seed >> 40) % 3 == 0 {
                let was = model
                    .get(&object)
                    .is_some_and(|h| h.iter().any(|(n, _)| *n == node));
                assert_eq!(index.withdraw(&object, node), was);
                if let Some(h) = model.get_mut(&object) {
                    h.retain(|(n, _)| *n != node);
                    if h.is_empty() {
                        model.remove(&object);
                    }
                }
            } else {
                let s = sizes(step, step % 5);
                index.publish(object, node, s);
                let h = model.entry(object).or_default();
                match h.binary_search_by_key(&node, |(n, _)| *n) {
                    Ok(at) => h[at].1 = s,
                    Err(at) => h.insert(at, (node, s)),
                }
            }
            if step % 1000 == 0 {
                check_against(&index, &model);
            }
            assert_eq!(
                index.get(&object).map(|h| h.iter().collect::<Vec<_>>()),
                model.get(&object).cloned()
            );
        }
        check_against(&index, &model);
        index.withdraw_everywhere(NodeId(1));
        for h in model.values_mut() {
            h.retain(|(n, _)| *n != NodeId(1));
        }
        model.retain(|_, h| !h.is_empty());
        check_against(&index, &model);
    }

    #[test]
    fn ids_in_increasing_order_fill_chunks() {
        let mut index = HolderIndex::default();
        let n = 10 * CHUNK_ENTRIES as u64;
        for i in 0..n {
            index.publish(id(i), NodeId(0), sizes(64, 0));
        }
        index.check_invariants();
        // Nearly full chunks, not the half-full nodes a B-tree would leave.
        assert!(index.chunks.len() <= 11, "{} chunks", index.chunks.len());
    }

    fn sizes(data: u64, metadata: u64) -> ObjectSizes {
        ObjectSizes {
            data_size: data,
            metadata_size: metadata,
        }
    }

    #[test]
    fn one_holder_is_sixteen_bytes_inline() {
        assert_eq!(std::mem::size_of::<Holders>(), 16);
        let h = Holders::one(NodeId(0), sizes(64, 3));
        assert!(matches!(h, Holders::One { .. }));
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            vec![(NodeId(0), sizes(64, 3))]
        );
    }

    #[test]
    fn what_does_not_fit_inline_is_kept_exactly() {
        for (node, s) in [
            (NodeId(u32::MAX), sizes(1, 2)),
            (NodeId(7), sizes(u64::MAX, u64::from(u32::MAX) + 1)),
        ] {
            let h = Holders::one(node, s);
            assert!(matches!(h, Holders::Many(_)));
            assert_eq!(h.iter().collect::<Vec<_>>(), vec![(node, s)]);
        }
    }

    #[test]
    fn holders_stay_sorted_and_shrink_back_inline() {
        let mut h = Holders::one(NodeId(5), sizes(10, 0));
        h.insert(NodeId(2), sizes(11, 0));
        h.insert(NodeId(9), sizes(12, 0));
        h.insert(NodeId(5), sizes(13, 1));
        let nodes: Vec<u32> = h.iter().map(|(n, _)| n.0).collect();
        assert_eq!(nodes, vec![2, 5, 9]);
        assert_eq!(h.iter().nth(1), Some((NodeId(5), sizes(13, 1))));
        assert!(h.remove(NodeId(2)));
        assert!(h.remove(NodeId(4)), "an unlisted node changes nothing");
        assert!(h.remove(NodeId(9)));
        assert_eq!(h, Holders::one(NodeId(5), sizes(13, 1)));
        assert!(!h.remove(NodeId(5)), "the last holder leaves nothing");
    }
}
