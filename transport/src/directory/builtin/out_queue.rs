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
//! Replies and events are encoded as they are queued, back to back in one buffer per run of
//! them, so the writer sends all that piled up while it wrote the last batch in one write, and
//! the emptied buffer is reused for the next ones (nothing is allocated per reply).
//!
//! One producer (the head's task) and one consumer (the connection's writer task).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use skyriver_core::registry::FromRegistry;
use tokio::sync::Notify;

use super::super::frame;
use super::member_lists::{MemberLists, QueuedList};

/// An encoded frame, shared by every connection it goes to.
pub(super) type Frame = Arc<[u8]>;

/// The most bytes of an emptied buffer of encoded frames a queue keeps for the next ones (so
/// steady traffic allocates nothing, and an idle node holds little).
const SPARE_BYTES_KEPT: usize = 4096;

/// The queue is full: the node stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full;

#[derive(Debug)]
enum Queued {
    /// Frames encoded for this node, back to back.
    Encoded(Vec<u8>),
    Members(QueuedList),
}

/// What the writer writes, in order.
#[derive(Debug)]
pub(super) enum Chunk {
    /// Frames encoded for this node, back to back.
    Encoded(Vec<u8>),
    /// A frame shared with other nodes (a member list).
    Shared(Frame),
}

impl Chunk {
    /// Its bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Chunk::Encoded(bytes) => bytes,
            Chunk::Shared(frame) => frame,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    queued: VecDeque<Queued>,
    /// Frames queued (a list that absorbed another counts once).
    frames: usize,
    /// The head dropped its end: the writer sends what is queued, then closes.
    closed: bool,
    /// Member lists merged with a newer one before they were written.
    coalesced: u64,
    /// An emptied buffer for the next encoded frames.
    spare: Vec<u8>,
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
    /// Queues `message` behind everything queued, encoded right behind the frames encoded for
    /// this node still waiting (one buffer, one write for all of them).
    pub(super) fn send(&self, message: &FromRegistry) -> Result<(), Full> {
        self.send_within(message, self.shared.capacity)
    }

    /// Queues `message`, a hint the node can do without, only while fewer than a quarter of
    /// the queue's frames wait: hints never fill a queue, so they never cost a slow node its
    /// connection. Whether it was queued.
    pub(super) fn send_hint(&self, message: &FromRegistry) -> bool {
        self.send_within(message, self.shared.capacity / 4).is_ok()
    }

    fn send_within(&self, message: &FromRegistry, limit: usize) -> Result<(), Full> {
        let was_empty = {
            let mut guard = self.shared.lock();
            let state = &mut *guard;
            if state.frames >= limit {
                return Err(Full);
            }
            let was_empty = state.queued.is_empty();
            match state.queued.back_mut() {
                Some(Queued::Encoded(bytes)) => frame::encode_into(message, bytes),
                _ => {
                    let mut bytes = std::mem::take(&mut state.spare);
                    frame::encode_into(message, &mut bytes);
                    state.queued.push_back(Queued::Encoded(bytes));
                }
            }
            state.frames += 1;
            was_empty
        };
        self.wake_if(was_empty);
        Ok(())
    }

    /// Queues the latest member list of `lists`, as changes from the list the node was last
    /// given if it can; it merges with a member list still waiting right in front of it.
    pub(super) fn send_members(&mut self, lists: &MemberLists) -> Result<(), Full> {
        let list = lists.for_node(self.members_epoch);
        self.members_epoch = Some(list.epoch());
        let was_empty = {
            let mut state = self.shared.lock();
            if let Some(Queued::Members(waiting)) = state.queued.back_mut() {
                waiting.absorb(list);
                state.coalesced += 1;
                return Ok(());
            }
            if state.frames >= self.shared.capacity {
                return Err(Full);
            }
            let was_empty = state.queued.is_empty();
            state.queued.push_back(Queued::Members(list));
            state.frames += 1;
            was_empty
        };
        self.wake_if(was_empty);
        Ok(())
    }

    /// Wakes the writer for what was just queued if the queue was empty before: otherwise it
    /// was woken when the queue stopped being empty, and takes everything queued by then.
    fn wake_if(&self, was_empty: bool) {
        if was_empty {
            self.shared.ready.notify_one();
        }
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
    /// Replaces `batch` (what the writer wrote last, whose buffers it reuses) with everything
    /// queued, in order, waiting while nothing is queued; `false` once the sender is gone and
    /// nothing is left.
    pub(super) async fn next_batch(&mut self, batch: &mut Vec<Chunk>) -> bool {
        loop {
            {
                let mut guard = self.shared.lock();
                let state = &mut *guard;
                for chunk in batch.drain(..) {
                    if let Chunk::Encoded(mut bytes) = chunk {
                        if state.spare.capacity() == 0 && bytes.capacity() <= SPARE_BYTES_KEPT {
                            bytes.clear();
                            state.spare = bytes;
                        }
                    }
                }
                if !state.queued.is_empty() {
                    batch.extend(state.queued.drain(..).map(|queued| match queued {
                        Queued::Encoded(bytes) => Chunk::Encoded(bytes),
                        Queued::Members(list) => Chunk::Shared(list.frame()),
                    }));
                    state.frames = 0;
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

    /// A reply, named `seq` by [`names`].
    fn frame(seq: u64) -> FromRegistry {
        FromRegistry::Pong { seq }
    }

    /// The frames in `bytes`, named: `3` for `Pong { seq: 3 }`, `L4` for list 4 whole, `C2-3`
    /// for the changes from list 2 to list 3.
    fn names(mut bytes: &[u8]) -> Vec<String> {
        let mut names = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            names.push(match postcard::from_bytes(&bytes[4..4 + len]).unwrap() {
                FromRegistry::Pong { seq } => seq.to_string(),
                FromRegistry::Members { epoch, .. } => format!("L{epoch}"),
                FromRegistry::MembersChanged { from, to, .. } => format!("C{from}-{to}"),
                other => panic!("unexpected {other}"),
            });
            bytes = &bytes[4 + len..];
        }
        names
    }

    /// The frames of the next batch, named (see [`names`]).
    async fn named(receiver: &mut QueueReceiver) -> Vec<String> {
        let mut batch = Vec::new();
        assert!(receiver.next_batch(&mut batch).await);
        batch
            .iter()
            .flat_map(|chunk| names(chunk.bytes()))
            .collect()
    }

    async fn drained(receiver: &mut QueueReceiver) -> Vec<u64> {
        named(receiver)
            .await
            .iter()
            .map(|name| name.parse().unwrap())
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
        sender.send(&frame(1)).unwrap();
        for epoch in 1..=2 {
            lists_up_to(&mut lists, epoch);
            sender.send_members(&lists).unwrap();
        }
        sender.send(&frame(2)).unwrap();
        lists_up_to(&mut lists, 3);
        sender.send_members(&lists).unwrap();
        sender.send(&frame(3)).unwrap();
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
        sender.send(&frame(1)).unwrap();
        for epoch in 1..=100 {
            lists_up_to(&mut lists, epoch);
            sender.send_members(&lists).unwrap();
        }
        assert_eq!(sender.send(&frame(2)), Err(Full));
        assert_eq!(named(&mut receiver).await, vec!["1", "L100"]);
        sender.send(&frame(3)).unwrap();
        assert_eq!(drained(&mut receiver).await, vec![3]);
    }

    #[tokio::test]
    async fn hints_stop_at_a_quarter_of_the_queue_and_leave_the_rest_to_the_other_frames() {
        let (sender, mut receiver) = out_queue(8);
        assert!(sender.send_hint(&frame(1)));
        assert!(sender.send_hint(&frame(2)));
        assert!(!sender.send_hint(&frame(3)), "two of eight frames wait");
        for seq in 4..=9 {
            sender.send(&frame(seq)).unwrap();
        }
        assert_eq!(sender.send(&frame(10)), Err(Full));
        assert_eq!(drained(&mut receiver).await, vec![1, 2, 4, 5, 6, 7, 8, 9]);
        assert!(sender.send_hint(&frame(11)), "room again once written");
    }

    #[tokio::test]
    async fn the_writer_waits_for_frames_and_ends_after_the_last_once_the_head_lets_go() {
        let (sender, mut receiver) = out_queue(8);
        let writer = tokio::spawn(async move {
            let mut written = Vec::new();
            let mut batch = Vec::new();
            while receiver.next_batch(&mut batch).await {
                written.extend(batch.iter().flat_map(|chunk| names(chunk.bytes())));
            }
            written
        });
        for seq in 1..=5 {
            sender.send(&frame(seq)).unwrap();
            tokio::task::yield_now().await;
        }
        drop(sender);
        let written = tokio::time::timeout(std::time::Duration::from_secs(10), writer)
            .await
            .expect("the writer ends once the sender is gone")
            .unwrap();
        assert_eq!(written, ["1", "2", "3", "4", "5"]);
    }

    /// Replies queued while the writer is busy go in one buffer, in order; the writer's
    /// emptied buffer is reused for the next ones, and a large one is let go.
    #[tokio::test]
    async fn replies_queued_together_go_as_one_buffer_in_order_and_buffers_are_reused() {
        let (sender, mut receiver) = out_queue(1000);
        for seq in 0..100 {
            sender.send(&frame(seq)).unwrap();
        }
        let mut batch = Vec::new();
        assert!(receiver.next_batch(&mut batch).await);
        assert!(matches!(batch.as_slice(), [Chunk::Encoded(_)]));
        let expected: Vec<String> = (0..100).map(|seq: u64| seq.to_string()).collect();
        assert_eq!(names(batch[0].bytes()), expected);
        let used = batch[0].bytes().as_ptr();
        // Written: the writer comes back for more, and waits.
        assert!(poll_once(receiver.next_batch(&mut batch)).is_none());
        sender.send(&frame(7)).unwrap();
        assert!(receiver.next_batch(&mut batch).await);
        assert_eq!(names(batch[0].bytes()), ["7"]);
        // The frame went into the buffer written before (small enough to keep).
        assert_eq!(batch[0].bytes().as_ptr(), used);
        // A buffer above what is kept is not reused.
        for seq in 0..1000 {
            sender.send(&frame(seq)).unwrap();
        }
        assert!(receiver.next_batch(&mut batch).await);
        assert_eq!(names(batch[0].bytes()).len(), 1000);
        assert!(batch[0].bytes().len() > SPARE_BYTES_KEPT);
        let large = batch[0].bytes().as_ptr();
        assert!(poll_once(receiver.next_batch(&mut batch)).is_none());
        sender.send(&frame(8)).unwrap();
        assert!(receiver.next_batch(&mut batch).await);
        assert_eq!(names(batch[0].bytes()), ["8"]);
        assert_ne!(batch[0].bytes().as_ptr(), large);
        assert!(sender.shared.lock().spare.capacity() <= SPARE_BYTES_KEPT);
    }

    /// Polls `future` once.
    fn poll_once<F: std::future::Future>(future: F) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        }
    }
}
