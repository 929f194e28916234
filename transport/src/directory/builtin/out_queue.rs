//! The frames the head has decided to send one node, waiting for that node's writer task.
//!
//! Bounded: a node that lets [`NODE_QUEUE_FRAMES`](super::server) pile up is disconnected (the
//! caller's decision, on [`Full`]). The queue remembers which member list its node was last
//! given, so the node gets the changes from it when it can (see [`super::member_lists`]), and
//! member lists coalesce: a list queued right behind another one still waiting takes its
//! place, carrying the node from the list it had before both (whole, unless one step
//! remains), since a node only needs the latest. Without that, a node that falls
//! behind while a cluster forms one join at a time would receive a message per join, and its
//! queue would fill. Only a list directly behind a list is merged, so every other frame keeps
//! its place relative to the lists: a node sees each reply and event after exactly the lists
//! it followed before.
//!
//! One producer (the head's task) and one consumer (the connection's writer task).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::member_lists::{MemberLists, QueuedList};

/// An encoded frame, shared by every connection it goes to.
pub(super) type Frame = Arc<[u8]>;

/// The queue is full: the node stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full;

#[derive(Debug)]
enum Queued {
    Frame(Frame),
    Members(QueuedList),
}

#[derive(Debug, Default)]
struct State {
    queued: VecDeque<Queued>,
    /// The head dropped its end: the writer sends what is queued, then closes.
    closed: bool,
    /// Member lists merged with a newer one before they were written.
    coalesced: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the writer (one waiter: a permit is kept if it is not waiting yet).
    ready: Notify,
    capacity: usize,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The head's end. Dropping it closes the queue: the writer sends what is queued, then ends.
#[derive(Debug)]
pub(super) struct QueueSender {
    shared: Arc<Shared>,
    /// The member list the node was last given (queued, whether written yet or not).
    members_epoch: Option<u64>,
}

/// The writer task's end.
#[derive(Debug)]
pub(super) struct QueueReceiver {
    shared: Arc<Shared>,
}

/// A queue of at most `capacity` frames.
pub(super) fn out_queue(capacity: usize) -> (QueueSender, QueueReceiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        ready: Notify::new(),
        capacity,
    });
    (
        QueueSender {
            shared: shared.clone(),
            members_epoch: None,
        },
        QueueReceiver { shared },
    )
}

impl QueueSender {
    /// Queues a frame behind everything queued.
    pub(super) fn send(&self, frame: Frame) -> Result<(), Full> {
        self.push(Queued::Frame(frame))
    }

    /// Queues the latest member list of `lists`, as changes from the list the node was last
    /// given if it can; it merges with a member list still waiting right in front of it.
    pub(super) fn send_members(&mut self, lists: &MemberLists) -> Result<(), Full> {
        let list = lists.for_node(self.members_epoch);
        self.members_epoch = Some(list.epoch());
        {
            let mut state = self.shared.lock();
            if let Some(Queued::Members(waiting)) = state.queued.back_mut() {
                waiting.absorb(list);
                state.coalesced += 1;
                return Ok(());
            }
        }
        self.push(Queued::Members(list))
    }

    fn push(&self, queued: Queued) -> Result<(), Full> {
        {
            let mut state = self.shared.lock();
            if state.queued.len() >= self.shared.capacity {
                return Err(Full);
            }
            state.queued.push_back(queued);
        }
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Member lists replaced before they were written, so far.
    #[cfg(test)]
    fn coalesced(&self) -> u64 {
        self.shared.lock().coalesced
    }
}

impl Drop for QueueSender {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_one();
    }
}

impl QueueReceiver {
    /// Moves every queued frame into `batch`, in order, waiting while none is queued; `false`
    /// once the sender is gone and nothing is left.
    pub(super) async fn next_batch(&mut self, batch: &mut Vec<Frame>) -> bool {
        loop {
            {
                let mut state = self.shared.lock();
                if !state.queued.is_empty() {
                    batch.extend(state.queued.drain(..).map(|queued| match queued {
                        Queued::Frame(frame) => frame,
                        Queued::Members(list) => list.frame(),
                    }));
                    return true;
                }
                if state.closed {
                    return false;
                }
            }
            self.shared.ready.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(byte: u8) -> Frame {
        Arc::from(vec![byte])
    }

    async fn drained(receiver: &mut QueueReceiver) -> Vec<u8> {
        let mut batch = Vec::new();
        assert!(receiver.next_batch(&mut batch).await);
        batch.iter().map(|f| f[0]).collect()
    }

    /// The frames queued, named: `3` for a one-byte frame, `L4` for list 4 whole, `C2-3` for
    /// the changes from list 2 to list 3.
    async fn named(receiver: &mut QueueReceiver) -> Vec<String> {
        use skyriver_core::registry::FromRegistry;
        let mut batch = Vec::new();
        assert!(receiver.next_batch(&mut batch).await);
        batch
            .iter()
            .map(|f| match f.len() {
                1 => f[0].to_string(),
                _ => match postcard::from_bytes(&f[4..]).unwrap() {
                    FromRegistry::Members { epoch, .. } => format!("L{epoch}"),
                    FromRegistry::MembersChanged { from, to, .. } => format!("C{from}-{to}"),
                    other => panic!("unexpected {other}"),
                },
            })
            .collect()
    }

    /// Member lists 1, 2, … of a cluster whose node `n` joins as list `n`.
    fn lists_up_to(lists: &mut MemberLists, epoch: u64) {
        use skyriver_core::directory::MemberInfo;
        let members: skyriver_core::directory::MemberList = (0..epoch as u32)
            .map(|node| MemberInfo {
                node: skyriver_core::NodeId(node),
                fabric_addr: "127.0.0.1:7000".parse().unwrap(),
                fabric: "tcp".into(),
                incarnation: 1,
                failure_domain: String::new(),
            })
            .collect();
        lists.update(epoch, members);
    }

    #[tokio::test]
    async fn a_member_list_right_behind_another_merges_with_it_and_nothing_else_moves() {
        let (mut sender, mut receiver) = out_queue(16);
        let mut lists = MemberLists::default();
        sender.send(frame(1)).unwrap();
        for epoch in 1..=2 {
            lists_up_to(&mut lists, epoch);
            sender.send_members(&lists).unwrap();
        }
        sender.send(frame(2)).unwrap();
        lists_up_to(&mut lists, 3);
        sender.send_members(&lists).unwrap();
        sender.send(frame(3)).unwrap();
        for epoch in 4..=9 {
            lists_up_to(&mut lists, epoch);
            sender.send_members(&lists).unwrap();
        }
        // The first list goes whole (the node had none) and absorbs the second; then the
        // changes to list 3; the last six lists piled up and go as their changes merged;
        // replies keep their places.
        assert_eq!(
            named(&mut receiver).await,
            vec!["1", "L2", "2", "C2-3", "3", "C3-9"]
        );
        assert_eq!(sender.coalesced(), 6);
        // A list already taken by the writer is not merged: the next one is queued.
        lists_up_to(&mut lists, 10);
        sender.send_members(&lists).unwrap();
        assert_eq!(named(&mut receiver).await, vec!["C9-10"]);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_merging_lists_never_fill_it() {
        let (mut sender, mut receiver) = out_queue(2);
        let mut lists = MemberLists::default();
        sender.send(frame(1)).unwrap();
        for epoch in 1..=100 {
            lists_up_to(&mut lists, epoch);
            sender.send_members(&lists).unwrap();
        }
        assert_eq!(sender.send(frame(2)), Err(Full));
        assert_eq!(named(&mut receiver).await, vec!["1", "L100"]);
        sender.send(frame(3)).unwrap();
        assert_eq!(drained(&mut receiver).await, vec![3]);
    }

    #[tokio::test]
    async fn the_writer_waits_for_frames_and_ends_after_the_last_once_the_head_lets_go() {
        let (sender, mut receiver) = out_queue(8);
        let writer = tokio::spawn(async move {
            let mut written = Vec::new();
            let mut batch = Vec::new();
            while receiver.next_batch(&mut batch).await {
                written.extend(batch.drain(..).map(|f| f[0]));
            }
            written
        });
        for byte in 1..=5 {
            sender.send(frame(byte)).unwrap();
            tokio::task::yield_now().await;
        }
        drop(sender);
        let written = tokio::time::timeout(std::time::Duration::from_secs(10), writer)
            .await
            .expect("the writer ends once the sender is gone")
            .unwrap();
        assert_eq!(written, vec![1, 2, 3, 4, 5]);
    }
}
