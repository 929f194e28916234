//! The registry's per-object state: the content an object id names (its sizes and digest) and
//! which nodes hold it. One id names one content: a publication of other sizes or another
//! digest is refused while any holder is listed. The head keeps one entry for every object of
//! the cluster, so an entry is the object id and 24 bytes ([`Holders`]: the digest, and one
//! holder with the sizes inline, boxed only for the rare others), kept densely and found
//! through a hash index of positions ([`HolderIndex`], a [`DenseIndex`]): a lookup, most of
//! what the head does, is one probe of the index and one entry.

use std::num::NonZeroU32;

use crate::dense_index::{DenseIndex, Record};
use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId};
use crate::wire::ObjectSizes;

/// Every published object with its holders (see [`DenseIndex`]): 48 bytes per object with
/// one holder, and 5 per index bucket (at most 7/8 of them full).
#[derive(Debug, Default)]
pub(super) struct HolderIndex {
    objects: DenseIndex<Listed>,
}

/// One object of the index.
#[derive(Debug)]
struct Listed {
    id: ObjectId,
    holders: Holders,
}

impl Record for Listed {
    fn id(&self) -> ObjectId {
        self.id
    }
}

/// A publication the index refused: the id names this other content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ContentConflict {
    pub(super) sizes: ObjectSizes,
    pub(super) digest: ContentDigest,
}

impl HolderIndex {
    /// An empty index whose hashing is keyed by `seed` (secret in a head: ids come from the
    /// nodes' clients, so the index must not be floodable).
    pub(super) fn new(seed: u64) -> Self {
        Self {
            objects: DenseIndex::new(seed),
        }
    }

    /// Objects listed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.objects.len()
    }

    /// The holders of `id`.
    pub(super) fn get(&self, id: &ObjectId) -> Option<&Holders> {
        self.objects.get(id).map(|listed| &listed.holders)
    }

    /// Lists `node` as holding `id` with this content; refused when other nodes list `id`
    /// with another content. A node listed alone with another content (its withdrawal was
    /// lost, and it put the id again) is listed with the new one: a node holds one copy.
    pub(super) fn publish(
        &mut self,
        id: ObjectId,
        node: NodeId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) -> Result<(), ContentConflict> {
        match self.objects.get_mut(&id).map(|listed| &mut listed.holders) {
            Some(holders) => {
                let (listed_sizes, listed_digest) = holders.content();
                if holders.iter().all(|holder| holder == node) {
                    *holders = Holders::one(node, sizes, digest);
                    return Ok(());
                }
                if (listed_sizes, listed_digest) != (sizes, digest) {
                    return Err(ContentConflict {
                        sizes: listed_sizes,
                        digest: listed_digest,
                    });
                }
                holders.insert(node);
            }
            None => {
                self.objects.insert(Listed {
                    id,
                    holders: Holders::one(node, sizes, digest),
                });
            }
        }
        Ok(())
    }

    /// Takes `node` off the holders of `id`, and `id` off the index when none is left.
    /// Whether `node` was listed.
    pub(super) fn withdraw(&mut self, id: &ObjectId, node: NodeId) -> bool {
        let Some(at) = self.objects.position(id) else {
            return false;
        };
        let holders = &mut self.objects[at as usize].holders;
        if !holders.contains(node) {
            return false;
        }
        if !holders.remove(node) {
            let _ = self.objects.remove_at(at);
        }
        true
    }

    /// Takes `node` off every object's holders (one pass).
    pub(super) fn withdraw_everywhere(&mut self, node: NodeId) {
        self.objects.retain(|listed| listed.holders.remove(node));
    }

    /// Every object with its holders, in no particular order (but the same for the same
    /// history of publications and withdrawals).
    pub(super) fn iter(&self) -> impl Iterator<Item = (&ObjectId, &Holders)> + '_ {
        self.objects
            .iter()
            .map(|listed| (&listed.id, &listed.holders))
    }

    /// Asserts the index's own consistency (a bug if it fails).
    pub(super) fn check_invariants(&self) {
        self.objects.check_invariants();
    }
}

/// One object's content and holders (sorted by node id; never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holders {
    digest: ContentDigest,
    nodes: HolderNodes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HolderNodes {
    /// One holder whose metadata size fits in 32 bits: nearly every object. The node id is
    /// stored plus one, so a zero there tells this variant from `Many` without a tag (the
    /// enum stays 16 bytes).
    One {
        node_plus_one: NonZeroU32,
        metadata_size: u32,
        data_size: u64,
    },
    /// Any other set: two or more holders, or one that does not fit `One`. Sorted by node id.
    /// Boxed so a thin pointer keeps the enum at 16 bytes.
    Many(Box<(ObjectSizes, Vec<NodeId>)>),
}

impl Holders {
    /// A single holder.
    pub(super) fn one(node: NodeId, sizes: ObjectSizes, digest: ContentDigest) -> Self {
        Self {
            digest,
            nodes: HolderNodes::from_sorted(sizes, vec![node]).expect("one node"),
        }
    }

    /// The sizes and digest the object's id names.
    pub(super) fn content(&self) -> (ObjectSizes, ContentDigest) {
        let sizes = match &self.nodes {
            HolderNodes::One {
                metadata_size,
                data_size,
                ..
            } => ObjectSizes {
                data_size: *data_size,
                metadata_size: u64::from(*metadata_size),
            },
            HolderNodes::Many(many) => many.0,
        };
        (sizes, self.digest)
    }

    /// The holders, by node id.
    pub(super) fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        let (single, many) = match &self.nodes {
            HolderNodes::One { node_plus_one, .. } => {
                (Some(NodeId(node_plus_one.get() - 1)), &[][..])
            }
            HolderNodes::Many(many) => (None, many.1.as_slice()),
        };
        single.into_iter().chain(many.iter().copied())
    }

    /// Whether `node` is listed.
    pub(super) fn contains(&self, node: NodeId) -> bool {
        self.iter().any(|holder| holder == node)
    }

    /// Lists `node` (the content is the object's already).
    fn insert(&mut self, node: NodeId) {
        let mut list: Vec<NodeId> = self.iter().collect();
        if let Err(at) = list.binary_search(&node) {
            list.insert(at, node);
        }
        let (sizes, _) = self.content();
        self.nodes = HolderNodes::from_sorted(sizes, list).expect("at least the node just listed");
    }

    /// Removes `node`; `false` when no holder is left (the caller drops the entry).
    #[must_use]
    fn remove(&mut self, node: NodeId) -> bool {
        if !self.contains(node) {
            return true;
        }
        let list: Vec<NodeId> = self.iter().filter(|&holder| holder != node).collect();
        let (sizes, _) = self.content();
        match HolderNodes::from_sorted(sizes, list) {
            Some(rest) => {
                self.nodes = rest;
                true
            }
            None => false,
        }
    }
}

impl HolderNodes {
    /// From a list sorted by node id; `None` when it is empty.
    fn from_sorted(sizes: ObjectSizes, list: Vec<NodeId>) -> Option<Self> {
        match list.as_slice() {
            [] => None,
            [node] => {
                let inline = node
                    .0
                    .checked_add(1)
                    .and_then(NonZeroU32::new)
                    .zip(u32::try_from(sizes.metadata_size).ok());
                Some(match inline {
                    Some((node_plus_one, metadata_size)) => HolderNodes::One {
                        node_plus_one,
                        metadata_size,
                        data_size: sizes.data_size,
                    },
                    None => HolderNodes::Many(Box::new((sizes, list))),
                })
            }
            _ => Some(HolderNodes::Many(Box::new((sizes, list)))),
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

    /// The content an id names in these tests: a function of the id, so every publication of
    /// it agrees.
    fn content_of(object: ObjectId) -> (ObjectSizes, ContentDigest) {
        let n = u64::from_be_bytes(object.0[12..].try_into().expect("8 bytes"));
        (sizes(n * 3, n % 5), ContentDigest(n.wrapping_mul(0x9e37)))
    }

    type Model = BTreeMap<ObjectId, Vec<NodeId>>;

    /// A model to compare with: the index must answer as a sorted map would.
    fn check_against(index: &HolderIndex, model: &Model) {
        index.check_invariants();
        assert_eq!(index.len(), model.len());
        let mut listed: Vec<(ObjectId, Vec<NodeId>)> = index
            .iter()
            .map(|(id, h)| {
                assert_eq!(h.content(), content_of(*id));
                (*id, h.iter().collect())
            })
            .collect();
        listed.sort();
        let expected: Vec<(ObjectId, Vec<NodeId>)> =
            model.iter().map(|(id, h)| (*id, h.clone())).collect();
        assert_eq!(listed, expected);
    }

    #[test]
    fn the_index_answers_like_a_map_under_any_order() {
        let mut index = HolderIndex::default();
        let mut model = Model::new();
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
                let was = model.get(&object).is_some_and(|h| h.contains(&node));
                assert_eq!(index.withdraw(&object, node), was);
                if let Some(h) = model.get_mut(&object) {
                    h.retain(|n| *n != node);
                    if h.is_empty() {
                        model.remove(&object);
                    }
                }
            } else {
                let (s, d) = content_of(object);
                assert_eq!(index.publish(object, node, s, d), Ok(()));
                let h = model.entry(object).or_default();
                if let Err(at) = h.binary_search(&node) {
                    h.insert(at, node);
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
            h.retain(|n| *n != NodeId(1));
        }
        model.retain(|_, h| !h.is_empty());
        check_against(&index, &model);
    }

    #[test]
    fn another_content_is_refused_while_a_holder_is_listed() {
        let mut index = HolderIndex::default();
        let (a, b) = (ContentDigest(1), ContentDigest(2));
        assert_eq!(index.publish(id(1), NodeId(0), sizes(4, 0), a), Ok(()));
        let conflict = ContentConflict {
            sizes: sizes(4, 0),
            digest: a,
        };
        assert_eq!(
            index.publish(id(1), NodeId(1), sizes(4, 0), b),
            Err(conflict)
        );
        assert_eq!(
            index.publish(id(1), NodeId(2), sizes(6, 0), a),
            Err(conflict),
            "other sizes are another content too"
        );
        assert_eq!(index.publish(id(1), NodeId(1), sizes(4, 0), a), Ok(()));
        assert_eq!(
            index.get(&id(1)).map(|h| h.iter().collect::<Vec<_>>()),
            Some(vec![NodeId(0), NodeId(1)])
        );
        assert!(index.withdraw(&id(1), NodeId(0)));
        assert!(index.withdraw(&id(1), NodeId(1)));
        assert_eq!(
            index.publish(id(1), NodeId(1), sizes(6, 0), b),
            Ok(()),
            "once nobody holds the id, it may name a new content"
        );
        // A node listed alone (its withdrawal lost) that puts the id again with other bytes
        // is listed with them.
        assert_eq!(index.publish(id(1), NodeId(1), sizes(8, 1), a), Ok(()));
        assert_eq!(
            index.get(&id(1)).map(Holders::content),
            Some((sizes(8, 1), a))
        );
    }

    #[test]
    fn one_holder_is_twenty_four_bytes_inline() {
        assert_eq!(std::mem::size_of::<Holders>(), 24);
        let h = Holders::one(NodeId(0), sizes(64, 3), ContentDigest(9));
        assert!(matches!(h.nodes, HolderNodes::One { .. }));
        assert_eq!(h.iter().collect::<Vec<_>>(), vec![NodeId(0)]);
        assert_eq!(h.content(), (sizes(64, 3), ContentDigest(9)));
    }

    #[test]
    fn what_does_not_fit_inline_is_kept_exactly() {
        for (node, s) in [
            (NodeId(u32::MAX), sizes(1, 2)),
            (NodeId(7), sizes(u64::MAX, u64::from(u32::MAX) + 1)),
        ] {
            let h = Holders::one(node, s, ContentDigest(3));
            assert!(matches!(h.nodes, HolderNodes::Many(_)));
            assert_eq!(h.iter().collect::<Vec<_>>(), vec![node]);
            assert_eq!(h.content(), (s, ContentDigest(3)));
        }
    }

    #[test]
    fn holders_stay_sorted_and_shrink_back_inline() {
        let (s, d) = (sizes(10, 0), ContentDigest(5));
        let mut h = Holders::one(NodeId(5), s, d);
        h.insert(NodeId(2));
        h.insert(NodeId(9));
        h.insert(NodeId(5));
        let nodes: Vec<u32> = h.iter().map(|n| n.0).collect();
        assert_eq!(nodes, vec![2, 5, 9]);
        assert!(h.remove(NodeId(2)));
        assert!(h.remove(NodeId(4)), "an unlisted node changes nothing");
        assert!(h.remove(NodeId(9)));
        assert_eq!(h, Holders::one(NodeId(5), s, d));
        assert!(!h.remove(NodeId(5)), "the last holder leaves nothing");
    }
}
