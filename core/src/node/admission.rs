//! The admission queue: objects whose source is chosen, waiting for memory, for bytes in
//! flight, or for room at their source.
//!
//! **Room at a source.** A requester asks one source for at most
//! [`NodeConfig::max_source_bytes_in_flight`](super::NodeConfig) of objects at once (always for
//! one, however large). A holder serves one requester's READs in the order they come, over one
//! connection (the TCP fabric's socket, a queue pair), and every lease it grants starts at once.
//! A batch asking one holder for many large objects at once would have all their leases
//! running while their READs wait behind each other: on a link slow next to the batch (a
//! broadcast's source serving fifteen nodes over 1 Gbit), the last objects' leases end before
//! their first READ is served, and their fetches fail although both nodes are alive and busy.
//! So an object whose source has no room when it reaches the front of the queue is held, by
//! source and in order, without blocking objects of other sources behind it; each transfer
//! from that source that ends (or moves to a relay) lets held objects back in front, as many
//! as its room then takes.

use std::collections::{BTreeMap, VecDeque};

use crate::ids::{NodeId, ObjectId};

/// Objects waiting for admission, in order, and those held for room at their source.
#[derive(Debug, Default)]
pub(super) struct AdmissionQueue {
    /// In the order they are admitted.
    ready: VecDeque<ObjectId>,
    /// Objects whose source had no room when they reached the front, by source, in order.
    held: BTreeMap<NodeId, VecDeque<ObjectId>>,
    held_len: usize,
}

impl AdmissionQueue {
    /// Objects waiting, held ones included.
    pub(super) fn len(&self) -> usize {
        self.ready.len() + self.held_len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Objects held for room at their source.
    #[cfg(test)]
    pub(super) fn held_len(&self) -> usize {
        self.held_len
    }

    pub(super) fn push_back(&mut self, id: ObjectId) {
        self.ready.push_back(id);
    }

    /// The next object to admit.
    pub(super) fn front(&self) -> Option<ObjectId> {
        self.ready.front().copied()
    }

    pub(super) fn pop_front(&mut self) -> Option<ObjectId> {
        self.ready.pop_front()
    }

    /// Moves the front object to wait for room at `source`, behind those held for it already.
    pub(super) fn hold_front(&mut self, source: NodeId) {
        if let Some(id) = self.ready.pop_front() {
            self.held.entry(source).or_default().push_back(id);
            self.held_len += 1;
        }
    }

    /// The objects held for `source`, in order.
    pub(super) fn held_for(&self, source: NodeId) -> impl Iterator<Item = ObjectId> + '_ {
        self.held.get(&source).into_iter().flatten().copied()
    }

    /// Puts the first `count` objects held for `source` back at the front, in their order.
    pub(super) fn release(&mut self, source: NodeId, count: usize) {
        let Some(held) = self.held.get_mut(&source) else {
            return;
        };
        let count = count.min(held.len());
        for id in held.drain(..count).rev() {
            self.ready.push_front(id);
        }
        self.held_len -= count;
        if held.is_empty() {
            self.held.remove(&source);
        }
    }

    /// Forgets `id` (its fetch ended while it waited).
    pub(super) fn remove(&mut self, id: ObjectId) {
        self.ready.retain(|&queued| queued != id);
        let mut emptied = None;
        for (source, held) in &mut self.held {
            let before = held.len();
            held.retain(|&queued| queued != id);
            self.held_len -= before - held.len();
            if held.is_empty() {
                emptied = Some(*source);
            }
        }
        if let Some(source) = emptied {
            self.held.remove(&source);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> ObjectId {
        ObjectId::from_u64(n)
    }

    #[test]
    fn held_objects_come_back_in_front_in_their_order() {
        let (a, b) = (NodeId(1), NodeId(2));
        let mut queue = AdmissionQueue::default();
        for n in 1..=5 {
            queue.push_back(id(n));
        }
        queue.hold_front(a); // 1
        queue.hold_front(a); // 2
        queue.hold_front(b); // 3
        assert_eq!(queue.front(), Some(id(4)));
        assert_eq!((queue.len(), queue.held_len()), (5, 3));
        queue.release(a, 5);
        let order: Vec<_> = std::iter::from_fn(|| queue.pop_front()).collect();
        assert_eq!(order, vec![id(1), id(2), id(4), id(5)]);
        assert_eq!(queue.held_for(b).collect::<Vec<_>>(), vec![id(3)]);
        queue.remove(id(3));
        assert!(queue.is_empty());
        assert_eq!(queue.held_for(b).count(), 0);
    }

    #[test]
    fn a_release_takes_only_the_first_objects_held() {
        let a = NodeId(1);
        let mut queue = AdmissionQueue::default();
        for n in 1..=3 {
            queue.push_back(id(n));
            queue.hold_front(a);
        }
        queue.push_back(id(4));
        queue.release(a, 1);
        assert_eq!(queue.pop_front(), Some(id(1)));
        assert_eq!(queue.pop_front(), Some(id(4)));
        assert_eq!(queue.held_for(a).collect::<Vec<_>>(), vec![id(2), id(3)]);
        assert_eq!(queue.len(), 2);
    }
}
