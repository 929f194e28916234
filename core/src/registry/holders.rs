//! The registry's per-object state: which nodes hold an object, each with the sizes it
//! published. The head keeps one entry for every object of the cluster, so an entry is the
//! object id and 16 bytes ([`Holders`]: one holder inline, boxed only for the rare others), in
//! sorted chunks that stay nearly full ([`HolderIndex`]).

use std::num::NonZeroU32;

use crate::ids::{NodeId, ObjectId};
use crate::sorted_chunks::SortedChunks;
use crate::wire::ObjectSizes;

/// Every published object with its holders, sorted by object id, in chunks that stay nearly
/// full (see [`SortedChunks`]): about 36 bytes per object with one holder.
#[derive(Debug, Default)]
pub(super) struct HolderIndex {
    objects: SortedChunks<ObjectId, Holders>,
}

impl HolderIndex {
    /// Objects listed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.objects.len()
    }

    /// The holders of `id`.
    pub(super) fn get(&self, id: &ObjectId) -> Option<&Holders> {
        self.objects.get(id)
    }

    /// Lists `node` as holding `id` with `sizes` (replacing the sizes it published before).
    pub(super) fn publish(&mut self, id: ObjectId, node: NodeId, sizes: ObjectSizes) {
        match self.objects.get_mut(&id) {
            Some(holders) => holders.insert(node, sizes),
            None => {
                self.objects.insert(id, Holders::one(node, sizes));
            }
        }
    }

    /// Takes `node` off the holders of `id`, and `id` off the index when none is left.
    /// Whether `node` was listed.
    pub(super) fn withdraw(&mut self, id: &ObjectId, node: NodeId) -> bool {
        let Some(holders) = self.objects.get_mut(id) else {
            return false;
        };
        if !holders.contains(node) {
            return false;
        }
        if !holders.remove(node) {
            self.objects.remove(id);
        }
        true
    }

    /// Takes `node` off every object's holders (one pass).
    pub(super) fn withdraw_everywhere(&mut self, node: NodeId) {
        self.objects.retain(|_, holders| holders.remove(node));
    }

    /// Every object with its holders, by object id.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&ObjectId, &Holders)> + '_ {
        self.objects.iter()
    }

    /// Asserts the index's own consistency (a bug if it fails).
    pub(super) fn check_invariants(&self) {
        self.objects.check_invariants();
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
    use std::collections::BTreeMap;

    fn sizes(data: u64, metadata: u64) -> ObjectSizes {
        ObjectSizes {
            data_size: data,
            metadata_size: metadata,
        }
    }

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
