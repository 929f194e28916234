//! Entries by object that end at an instant, bounded in number: the registry's tombstones and
//! its lost records (see [`super::replication`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::ObjectId;
use crate::time::Instant;

/// Entries by object, each ending at its instant, the earliest ending first.
#[derive(Debug, Clone)]
pub(super) struct Expiring<V> {
    entries: BTreeMap<ObjectId, (V, Instant)>,
    ends: BTreeSet<(Instant, ObjectId)>,
}

impl<V> Default for Expiring<V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            ends: BTreeSet::new(),
        }
    }
}

impl<V> Expiring<V> {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn get(&self, id: &ObjectId) -> Option<&V> {
        self.entries.get(id).map(|(value, _)| value)
    }

    pub(super) fn get_mut(&mut self, id: &ObjectId) -> Option<&mut V> {
        self.entries.get_mut(id).map(|(value, _)| value)
    }

    /// Drops the entries ended by `now`.
    pub(super) fn end(&mut self, now: Instant) {
        while let Some(&(until, id)) = self.ends.first() {
            if until > now {
                break;
            }
            self.ends.remove(&(until, id));
            self.entries.remove(&id);
        }
    }

    /// Removes `id`'s entry, returning its value.
    pub(super) fn remove(&mut self, id: &ObjectId) -> Option<V> {
        let (value, until) = self.entries.remove(id)?;
        self.ends.remove(&(until, *id));
        Some(value)
    }

    /// Keeps `value` for `id` until `until` (replacing an entry of `id`), with at most `max`
    /// entries: the one ending first goes to make room. Returns how many went (the new one
    /// too, when `max` is 0).
    pub(super) fn insert_bounded(
        &mut self,
        id: ObjectId,
        value: V,
        until: Instant,
        max: usize,
    ) -> u64 {
        self.remove(&id);
        if max == 0 {
            return 1;
        }
        let mut dropped = 0;
        while self.entries.len() >= max {
            let Some(&(_, oldest)) = self.ends.first() else {
                break;
            };
            self.remove(&oldest);
            dropped += 1;
        }
        self.entries.insert(id, (value, until));
        self.ends.insert((until, id));
        dropped
    }

    /// Asserts one end per entry, at the entry's instant (a bug if it fails).
    pub(super) fn check_invariants(&self) {
        assert_eq!(self.ends.len(), self.entries.len(), "one end per entry");
        for (id, (_, until)) in &self.entries {
            assert!(self.ends.contains(&(*until, *id)));
        }
    }
}
