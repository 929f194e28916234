//! The event queue: a heap with four children a node instead of two.
//!
//! Every event goes through the queue, and a 1,000-node run keeps tens of thousands queued
//! (timers, heartbeats, messages in flight): the standard binary heap's pop, fourteen levels of
//! scattered entries, took about 5% of such a run. Four children a node halve the levels, and
//! the children of a node sit side by side. Entries are unique (a time and a sequence number),
//! so the order in which they leave is the same whatever the heap's shape: traces do not change.

/// A max-heap (as [`std::collections::BinaryHeap`]: wrap entries in [`std::cmp::Reverse`] for
/// the least first) with the few operations the cluster uses.
#[derive(Debug)]
pub(super) struct QuadHeap<T> {
    items: Vec<T>,
}

/// Children a node.
const ARITY: usize = 4;

impl<T: Ord> QuadHeap<T> {
    pub(super) fn new() -> Self {
        QuadHeap { items: Vec::new() }
    }

    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// The greatest entry.
    pub(super) fn peek(&self) -> Option<&T> {
        self.items.first()
    }

    /// Every entry, in no particular order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    pub(super) fn push(&mut self, item: T) {
        self.items.push(item);
        let mut at = self.items.len() - 1;
        while at > 0 {
            let parent = (at - 1) / ARITY;
            if self.items[at] <= self.items[parent] {
                break;
            }
            self.items.swap(at, parent);
            at = parent;
        }
    }

    /// Takes the greatest entry out.
    pub(super) fn pop(&mut self) -> Option<T> {
        let last = self.items.pop()?;
        if self.items.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.items[0], last);
        let len = self.items.len();
        let mut at = 0;
        loop {
            let first = ARITY * at + 1;
            if first >= len {
                break;
            }
            let mut greatest = first;
            for child in first + 1..(first + ARITY).min(len) {
                if self.items[child] > self.items[greatest] {
                    greatest = child;
                }
            }
            if self.items[greatest] <= self.items[at] {
                break;
            }
            self.items.swap(at, greatest);
            at = greatest;
        }
        Some(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    #[test]
    fn entries_leave_as_from_the_standard_heap() {
        let mut quad = QuadHeap::new();
        let mut binary = BinaryHeap::new();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..2_000u64 {
            // Pushes and pops interleaved, the heap growing and shrinking; equal times happen.
            for seq in 0..next() % 5 {
                let entry = Reverse((next() % 500, round * 8 + seq));
                quad.push(entry);
                binary.push(entry);
            }
            for _ in 0..next() % 4 {
                assert_eq!(quad.peek(), binary.peek());
                assert_eq!(quad.pop(), binary.pop());
            }
            assert_eq!(quad.len(), binary.len());
        }
        while let Some(entry) = binary.pop() {
            assert_eq!(quad.pop(), Some(entry));
        }
        assert_eq!(quad.pop(), None);
        assert!(quad.iter().next().is_none());
    }
}
