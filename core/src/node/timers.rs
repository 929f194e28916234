//! The node's timers: due-order for firing, and an index by key so cancelling one is
//! O(log n) however many are pending (a restart may publish 100k objects at once, each with a
//! timer).

use std::collections::{BTreeMap, BTreeSet};

use crate::time::Instant;

/// Pending timers keyed by `K`; ties in time fire in key order, so runs are deterministic.
#[derive(Debug)]
pub(super) struct Timers<K: Ord + Copy> {
    by_due: BTreeSet<(Instant, K)>,
    by_key: BTreeMap<K, Vec<Instant>>,
}

impl<K: Ord + Copy> Default for Timers<K> {
    fn default() -> Self {
        Self {
            by_due: BTreeSet::new(),
            by_key: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Copy> Timers<K> {
    /// Arms `key` to fire at `at` (a key may be armed at several instants).
    pub(super) fn set(&mut self, at: Instant, key: K) {
        if self.by_due.insert((at, key)) {
            self.by_key.entry(key).or_default().push(at);
        }
    }

    /// Disarms every pending instance of `key`.
    pub(super) fn cancel(&mut self, key: K) {
        for at in self.by_key.remove(&key).unwrap_or_default() {
            self.by_due.remove(&(at, key));
        }
    }

    /// The earliest pending instant.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.by_due.first().map(|&(at, _)| at)
    }

    /// Removes and returns the earliest timer if it is due at `now`.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<K> {
        let &(at, key) = self.by_due.first().filter(|&&(at, _)| at <= now)?;
        self.by_due.pop_first();
        if let Some(instants) = self.by_key.get_mut(&key) {
            instants.retain(|&pending| pending != at);
            if instants.is_empty() {
                self.by_key.remove(&key);
            }
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_in_time_then_key_order_and_cancels_every_instance() {
        let mut timers = Timers::default();
        timers.set(Instant(20), 'b');
        timers.set(Instant(10), 'c');
        timers.set(Instant(20), 'a');
        timers.set(Instant(30), 'c');
        assert_eq!(timers.next_due(), Some(Instant(10)));
        timers.cancel('c');
        assert_eq!(
            timers.pop_due(Instant(15)),
            None,
            "c was cancelled, a and b are later"
        );
        assert_eq!(timers.pop_due(Instant(25)), Some('a'));
        assert_eq!(timers.pop_due(Instant(25)), Some('b'));
        assert_eq!(
            timers.pop_due(Instant(100)),
            None,
            "the second c went with the first"
        );
        assert_eq!(timers.next_due(), None);
    }
}
