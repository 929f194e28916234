//! The registry's per-object state: which nodes hold an object, each with the sizes it
//! published. The head keeps one of these for every object of the cluster, so it is 16 bytes
//! for the common case (one holder) and boxed only for the rare others.

use std::num::NonZeroU32;

use crate::ids::NodeId;
use crate::wire::ObjectSizes;

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
