//! The channel from a fabric to its driver: bounded, with push-back where a sender can wait.
//!
//! One FIFO (so the order a fabric emits in is the order the driver hears: no `PeerLost`
//! overtakes the messages before it) with [`EVENT_CHANNEL_CAPACITY`] places of room. Two ways
//! in:
//! - [`EventSender::send`] waits for a place. A fabric's tasks use it: a TCP connection whose
//!   reader waits here reads nothing more from its socket, so its receive window fills and the
//!   peer's sends wait (TCP flow control) instead of events piling up in the daemon.
//! - [`EventSender::send_unwaiting`] queues at once, taking a place if one is free and going
//!   over the capacity otherwise. It is for senders that must not wait on the driver: the
//!   driver's own calls into the fabric (a READ failed at once, a connection dropped because
//!   its peer stopped reading, a revocation), which run on the thread that drains this channel
//!   and would deadlock waiting for it; and threads that hold a lock the driver's calls take
//!   (the verbs poller holds a connection's state while it handles its completions). Each
//!   such call site states what bounds it: one event per call the driver made (a READ, a
//!   grant), a few per connection, or a receive slot per message.
//!
//! So the channel holds at most the capacity, plus what unwaiting senders add beyond it, each
//! bounded by construction. [`EventReceiver::len`] is the depth, for a metric.

use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::FabricEvent;

/// Places in a driver's event channel for senders that wait ([`EventSender::send`]): enough
/// to keep a busy driver fed between two of its turns, small enough that a flood waits in the
/// senders' sockets, not in memory.
pub const EVENT_CHANNEL_CAPACITY: usize = 1024;

/// The driver is gone (shutting down): the event was not queued.
#[derive(Debug, thiserror::Error)]
#[error("the fabric's driver stopped taking events")]
pub struct DriverGone(pub FabricEvent);

/// An event with the place it takes in the channel, given back when the driver takes it.
struct Queued {
    event: FabricEvent,
    _place: Option<OwnedSemaphorePermit>,
}

/// Where a fabric sends its [`FabricEvent`]s.
#[derive(Clone)]
pub struct EventSender {
    queue: mpsc::UnboundedSender<Queued>,
    room: Arc<Semaphore>,
}

/// Where the driver hears a fabric's [`FabricEvent`]s.
pub struct EventReceiver {
    queue: mpsc::UnboundedReceiver<Queued>,
    room: Arc<Semaphore>,
}

/// The channel from a fabric to its driver, with [`EVENT_CHANNEL_CAPACITY`] places.
pub fn event_channel() -> (EventSender, EventReceiver) {
    event_channel_with_capacity(EVENT_CHANNEL_CAPACITY)
}

/// [`event_channel`] with `capacity` places (at least one); small ones are for tests.
pub fn event_channel_with_capacity(capacity: usize) -> (EventSender, EventReceiver) {
    let (queue, received) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(capacity.max(1)));
    (
        EventSender {
            queue,
            room: room.clone(),
        },
        EventReceiver {
            queue: received,
            room,
        },
    )
}

impl EventSender {
    /// Waits for a place, then queues `event`.
    pub async fn send(&self, event: FabricEvent) -> Result<(), DriverGone> {
        // Closed only when the receiver is dropped.
        let Ok(place) = self.room.clone().acquire_owned().await else {
            return Err(DriverGone(event));
        };
        self.queue
            .send(Queued {
                event,
                _place: Some(place),
            })
            .map_err(|lost| DriverGone(lost.0.event))
    }

    /// Queues `event` at once, over the capacity if there is no place: for a sender that
    /// must not wait, whose caller states what bounds it (see the module documentation).
    pub fn send_unwaiting(&self, event: FabricEvent) -> Result<(), DriverGone> {
        let place = self.room.clone().try_acquire_owned().ok();
        self.queue
            .send(Queued {
                event,
                _place: place,
            })
            .map_err(|lost| DriverGone(lost.0.event))
    }
}

impl EventReceiver {
    /// The next event; `None` once every sender is gone and the channel is empty.
    pub async fn recv(&mut self) -> Option<FabricEvent> {
        self.queue.recv().await.map(|queued| queued.event)
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Result<FabricEvent, mpsc::error::TryRecvError> {
        self.queue.try_recv().map(|queued| queued.event)
    }

    /// Blocks this thread for the next event (not on a runtime's thread).
    pub fn blocking_recv(&mut self) -> Option<FabricEvent> {
        self.queue.blocking_recv().map(|queued| queued.event)
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        // Senders waiting for a place learn the driver is gone instead of waiting forever.
        self.room.close();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use skyriver_core::NodeId;

    use super::*;

    fn lost(n: u32) -> FabricEvent {
        FabricEvent::PeerLost {
            peer: NodeId(n),
            reason: String::new(),
        }
    }

    fn peer(event: FabricEvent) -> u32 {
        match event {
            FabricEvent::PeerLost { peer, .. } => peer.0,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_sender_waits_for_a_place_and_nothing_is_lost() {
        let (tx, mut rx) = event_channel_with_capacity(2);
        let producer = tokio::spawn(async move {
            for n in 0..10 {
                tx.send(lost(n)).await.unwrap();
            }
        });
        // The producer fills the two places and then waits: it cannot finish.
        while rx.len() < 2 {
            tokio::task::yield_now().await;
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(rx.len(), 2, "a waiting sender went over the capacity");
        assert!(!producer.is_finished());
        // Taking events makes room; all ten arrive, in order.
        let mut got = Vec::new();
        while got.len() < 10 {
            let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the producer resumes when there is room")
                .unwrap();
            got.push(peer(event));
            assert!(rx.len() <= 2);
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        producer.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_unwaiting_sender_goes_over_the_capacity_in_order() {
        let (tx, mut rx) = event_channel_with_capacity(1);
        tx.send(lost(0)).await.unwrap();
        // The driver's own call cannot wait for the driver: it queues anyway, behind.
        tx.send_unwaiting(lost(1)).unwrap();
        tx.send_unwaiting(lost(2)).unwrap();
        assert_eq!(rx.len(), 3);
        for n in 0..3 {
            assert_eq!(peer(rx.recv().await.unwrap()), n);
        }
        // Over-capacity events took no place: the one place is free again, and only one.
        assert_eq!(tx.room.available_permits(), 1);
        tx.send(lost(3)).await.unwrap();
        assert_eq!(tx.room.available_permits(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_sender_learns_the_driver_is_gone() {
        let (tx, rx) = event_channel_with_capacity(1);
        tx.send(lost(0)).await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(lost(1)).await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        let result = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("not left waiting")
            .unwrap();
        assert!(matches!(result, Err(DriverGone(_))));
    }
}
