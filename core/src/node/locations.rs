//! Where objects were last seen: a bounded cache of directory answers, so a fetch of an object
//! located recently goes straight to a holder instead of asking the directory first.
//!
//! Objects are immutable but not eternal: a holder may have deleted or evicted its copy since.
//! A cached location is therefore only a first guess. The fetch manager drops the entry and
//! asks the directory as soon as a holder it names fails (not found, content differs, busy,
//! disconnected), so a stale entry costs one round trip, never a failed fetch.

use std::collections::BTreeMap;

use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId};
use crate::wire::ObjectSizes;

/// A directory answer worth remembering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Location {
    pub(super) holders: Vec<NodeId>,
    pub(super) sizes: ObjectSizes,
    pub(super) digest: ContentDigest,
}

#[derive(Debug)]
struct Entry {
    location: Location,
    stamp: u64,
}

/// Least recently used entries go first when the cache is full.
#[derive(Debug)]
pub(super) struct LocationCache {
    capacity: usize,
    entries: BTreeMap<ObjectId, Entry>,
    by_age: BTreeMap<u64, ObjectId>,
    next_stamp: u64,
}

impl LocationCache {
    /// A cache of at most `capacity` objects (0 turns it off).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: BTreeMap::new(),
            by_age: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    /// The remembered location of `id`, which becomes the most recently used.
    pub(super) fn get(&mut self, id: &ObjectId) -> Option<Location> {
        let entry = self.entries.get_mut(id)?;
        self.by_age.remove(&entry.stamp);
        entry.stamp = self.next_stamp;
        self.next_stamp += 1;
        self.by_age.insert(entry.stamp, *id);
        Some(entry.location.clone())
    }

    /// Remembers that `holders` (never empty) hold `id` with `sizes`.
    pub(super) fn insert(&mut self, id: ObjectId, location: Location) {
        if self.capacity == 0 || location.holders.is_empty() {
            return;
        }
        self.remove(&id);
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.by_age.insert(stamp, id);
        self.entries.insert(id, Entry { location, stamp });
    }

    /// Remembers that `holder` holds `id` with this content, next to the holders already known
    /// for the same content (an entry for other content is replaced).
    pub(super) fn add_holder(
        &mut self,
        id: ObjectId,
        holder: NodeId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) {
        let mut holders = match self.get(&id) {
            Some(known) if known.sizes == sizes && known.digest == digest => known.holders,
            _ => Vec::new(),
        };
        if !holders.contains(&holder) {
            holders.push(holder);
        }
        self.insert(
            id,
            Location {
                holders,
                sizes,
                digest,
            },
        );
    }

    /// Forgets that `holder` holds `id` (it failed to serve it); an entry left without holders
    /// goes.
    pub(super) fn forget_holder(&mut self, id: &ObjectId, holder: NodeId) {
        let Some(entry) = self.entries.get_mut(id) else {
            return;
        };
        entry.location.holders.retain(|&h| h != holder);
        if entry.location.holders.is_empty() {
            self.remove(id);
        }
    }

    /// Forgets `id` (its location proved wrong).
    pub(super) fn remove(&mut self, id: &ObjectId) {
        if let Some(entry) = self.entries.remove(id) {
            self.by_age.remove(&entry.stamp);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn check_invariants(&self) {
        assert!(
            self.entries.len() <= self.capacity,
            "location cache over capacity"
        );
        assert_eq!(
            self.entries.len(),
            self.by_age.len(),
            "location cache age index"
        );
        for (stamp, id) in &self.by_age {
            assert_eq!(
                self.entries.get(id).map(|e| e.stamp),
                Some(*stamp),
                "location cache age index names {id}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(holder: u32, size: u64) -> Location {
        Location {
            holders: vec![NodeId(holder)],
            sizes: ObjectSizes {
                data_size: size,
                metadata_size: 0,
            },
            digest: ContentDigest(size),
        }
    }

    #[test]
    fn least_recently_used_goes_first() {
        let mut cache = LocationCache::new(2);
        let (a, b, c) = (
            ObjectId::from_u64(1),
            ObjectId::from_u64(2),
            ObjectId::from_u64(3),
        );
        cache.insert(a, location(1, 10));
        cache.insert(b, location(2, 20));
        assert_eq!(cache.get(&a), Some(location(1, 10)));
        cache.insert(c, location(3, 30));
        cache.check_invariants();
        assert_eq!(cache.get(&b), None, "b was the least recently used");
        assert_eq!(cache.get(&a), Some(location(1, 10)));
        assert_eq!(cache.get(&c), Some(location(3, 30)));
    }

    #[test]
    fn insert_replaces_and_remove_forgets() {
        let mut cache = LocationCache::new(4);
        let a = ObjectId::from_u64(1);
        cache.insert(a, location(1, 10));
        cache.insert(a, location(2, 10));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get(&a), Some(location(2, 10)));
        cache.remove(&a);
        assert_eq!(cache.get(&a), None);
        cache.check_invariants();
    }

    #[test]
    fn a_failed_holder_is_forgotten_and_an_empty_entry_goes() {
        let mut cache = LocationCache::new(4);
        let a = ObjectId::from_u64(1);
        let mut both = location(1, 10);
        both.holders.push(NodeId(2));
        cache.insert(a, both);
        cache.forget_holder(&a, NodeId(1));
        assert_eq!(cache.get(&a), Some(location(2, 10)));
        cache.forget_holder(&a, NodeId(2));
        assert_eq!(cache.get(&a), None);
        assert_eq!(cache.len(), 0);
        cache.check_invariants();
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut cache = LocationCache::new(0);
        let a = ObjectId::from_u64(1);
        cache.insert(a, location(1, 10));
        assert_eq!(cache.get(&a), None);
        cache.check_invariants();
    }
}
