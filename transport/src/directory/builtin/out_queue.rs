//! The frames the head has decided to send one node, waiting for that node's writer task.
//!
//! Bounded: a node that lets [`NODE_QUEUE_FRAMES`](super::server) pile up is disconnected (the
//! caller's decision, on [`Full`]). Member lists coalesce: a member list queued right behind
//! another one that is still waiting replaces it, since a node only needs the latest. Without
//! that, a cluster of N nodes forming one join at a time sends every node about N lists of up
//! to N members — O(N³) bytes in all, which at 10,000 nodes neither the head's sockets nor a
//! node's memory hold. Only a list directly behind a list is replaced, so every other frame
//! keeps its place relative to the lists: a node sees each reply and event after exactly the
//! lists it followed before.
//!
//! One producer (the head's task) and one consumer (the connection's writer task).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// An encoded frame, shared by every connection it goes to.
pub(super) type Frame = Arc<[u8]>;

/// The queue is full: the node stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full;

#[derive(Debug)]
enum Queued {
    Frame(Frame),
    Members(Frame),
}

#[derive(Debug, Default)]
struct State {
    queued: VecDeque<Queued>,
    /// The head dropped its end: the writer sends what is queued, then closes.
    closed: bool,
    /// Member lists replaced by a newer one before they were written.
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
        },
        QueueReceiver { shared },
    )
}

impl QueueSender {
    /// Queues a frame behind everything queued.
    pub(super) fn send(&self, frame: Frame) -> Result<(), Full> {
        self.push(Queued::Frame(frame))
    }

    /// Queues a member list; it replaces a member list still waiting right in front of it.
    pub(super) fn send_members(&self, frame: Frame) -> Result<(), Full> {
        {
            let mut state = self.shared.lock();
            if let Some(Queued::Members(waiting)) = state.queued.back_mut() {
                *waiting = frame;
                state.coalesced += 1;
                return Ok(());
            }
        }
        self.push(Queued::Members(frame))
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
                        Queued::Frame(frame) | Queued::Members(frame) => frame,
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

    #[tokio::test]
    async fn a_member_list_right_behind_another_replaces_it_and_nothing_else_moves() {
        let (sender, mut receiver) = out_queue(16);
        sender.send(frame(1)).unwrap();
        sender.send_members(frame(10)).unwrap();
        sender.send_members(frame(11)).unwrap();
        sender.send(frame(2)).unwrap();
        sender.send_members(frame(12)).unwrap();
        sender.send(frame(3)).unwrap();
        sender.send_members(frame(13)).unwrap();
        sender.send_members(frame(14)).unwrap();
        sender.send_members(frame(15)).unwrap();
        // Lists 10, 13 and 14 were replaced; replies and events keep their places.
        assert_eq!(drained(&mut receiver).await, vec![1, 11, 2, 12, 3, 15]);
        assert_eq!(sender.coalesced(), 3);
        // A list already taken by the writer is not replaced: the next one is queued.
        sender.send_members(frame(16)).unwrap();
        assert_eq!(drained(&mut receiver).await, vec![16]);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_coalescing_lists_never_fill_it() {
        let (sender, mut receiver) = out_queue(2);
        sender.send(frame(1)).unwrap();
        for list in 0..100 {
            sender.send_members(frame(100 + list)).unwrap();
        }
        assert_eq!(sender.send(frame(2)), Err(Full));
        assert_eq!(drained(&mut receiver).await, vec![1, 199]);
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
