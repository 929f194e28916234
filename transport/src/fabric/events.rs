//! The channel from a fabric to its driver: one bounded FIFO that nothing goes over.
//!
//! One queue (so the order a fabric emits in is the order the driver hears: no `PeerLost`
//! overtakes the messages before it) of [`EVENT_CHANNEL_CAPACITY`] places, a tokio bounded
//! channel: it never holds more. Three ways in:
//! - [`EventSender::send`] waits for a place. A fabric's tasks use it: a TCP connection's
//!   reader waits here and meanwhile reads nothing more from its socket, so its receive window
//!   fills and the peer's sends wait (TCP flow control) instead of events piling up in the
//!   daemon; a connection's set-up and tear-down wait here too.
//! - [`EventSender::reserve_now`] takes a place at once, or refuses with [`EventsFull`]. It is
//!   for the driver's own calls that start something answered later (a READ: its
//!   `ReadCompleted`), which run on the thread that drains this channel and so must not wait
//!   for it. The fabric keeps the [`EventPlace`] with the work and answers through it without
//!   waiting; a full channel refuses the call, and the driver tells its node, which fails
//!   that one operation instead of queueing it.
//! - [`EventSender::try_send`] queues at once if there is a place and hands the event back
//!   otherwise. A sender that can neither wait nor refuse (the verbs poller, which emits under
//!   a connection's lock the driver's calls take) keeps what did not fit in an
//!   [`EventBacklog`] of its own, bounded by what each held event holds (a receive slot per
//!   message, so the peer meets receiver-not-ready), and moves it on as room appears.
//!
//! [`EventReceiver::len`] is the depth, for a metric; it never exceeds the capacity.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::mpsc;

use super::FabricEvent;

/// Places in a driver's event channel: enough to keep a busy driver fed between two of its
/// turns, small enough that a flood waits in the senders' sockets, not in memory.
pub const EVENT_CHANNEL_CAPACITY: usize = 1024;

/// The driver is gone (shutting down): the event was not queued.
#[derive(Debug, thiserror::Error)]
#[error("the fabric's driver stopped taking events")]
pub struct DriverGone(pub FabricEvent);

/// No place is free in the driver's event channel (or the driver is gone): the call that
/// needed one did nothing. The driver frees places by taking events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the driver's event channel is full ({capacity} events wait)")]
pub struct EventsFull {
    /// The channel's capacity, all of it taken.
    pub capacity: usize,
}

/// Why [`EventSender::try_send`] did not queue an event; it is handed back.
#[derive(Debug, thiserror::Error)]
pub enum TrySendError {
    /// No place is free.
    #[error("the driver's event channel is full")]
    Full(FabricEvent),
    /// The driver is gone.
    #[error(transparent)]
    Gone(#[from] DriverGone),
}

/// Where a fabric sends its [`FabricEvent`]s.
#[derive(Clone)]
pub struct EventSender {
    queue: mpsc::Sender<FabricEvent>,
}

/// Where the driver hears a fabric's [`FabricEvent`]s.
pub struct EventReceiver {
    queue: mpsc::Receiver<FabricEvent>,
}

/// A place taken in the driver's event channel for one event to come: sending through it
/// never waits. Dropped unused, the place is free again.
#[derive(Debug)]
pub struct EventPlace(mpsc::OwnedPermit<FabricEvent>);

/// The channel from a fabric to its driver, with [`EVENT_CHANNEL_CAPACITY`] places.
pub fn event_channel() -> (EventSender, EventReceiver) {
    event_channel_with_capacity(EVENT_CHANNEL_CAPACITY)
}

/// [`event_channel`] with `capacity` places (at least one); small ones are for tests.
pub fn event_channel_with_capacity(capacity: usize) -> (EventSender, EventReceiver) {
    let (queue, received) = mpsc::channel(capacity.max(1));
    (EventSender { queue }, EventReceiver { queue: received })
}

impl EventSender {
    /// Waits for a place, then queues `event`.
    pub async fn send(&self, event: FabricEvent) -> Result<(), DriverGone> {
        self.queue
            .send(event)
            .await
            .map_err(|lost| DriverGone(lost.0))
    }

    /// Waits for a place and keeps it for an event to come.
    pub async fn reserve(&self) -> Result<EventPlace, EventsFull> {
        self.queue
            .clone()
            .reserve_owned()
            .await
            .map(EventPlace)
            .map_err(|_| self.full())
    }

    /// Takes a place at once for an event to come, or refuses (see the module
    /// documentation): for calls that must not wait.
    pub fn reserve_now(&self) -> Result<EventPlace, EventsFull> {
        self.queue
            .clone()
            .try_reserve_owned()
            .map(EventPlace)
            .map_err(|_| self.full())
    }

    /// Queues `event` if a place is free; hands it back otherwise.
    pub fn try_send(&self, event: FabricEvent) -> Result<(), TrySendError> {
        self.queue.try_send(event).map_err(|error| match error {
            mpsc::error::TrySendError::Full(event) => TrySendError::Full(event),
            mpsc::error::TrySendError::Closed(event) => DriverGone(event).into(),
        })
    }

    /// Places free now.
    pub fn free_places(&self) -> usize {
        self.queue.capacity()
    }

    fn full(&self) -> EventsFull {
        EventsFull {
            capacity: self.queue.max_capacity(),
        }
    }
}

impl EventPlace {
    /// Queues `event` in the place taken for it.
    pub fn send(self, event: FabricEvent) {
        // A permit outlives a dropped receiver harmlessly: the event is then dropped too.
        self.0.send(event);
    }
}

impl EventReceiver {
    /// The next event; `None` once every sender is gone and the channel is empty.
    pub async fn recv(&mut self) -> Option<FabricEvent> {
        self.queue.recv().await
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Result<FabricEvent, mpsc::error::TryRecvError> {
        self.queue.try_recv()
    }

    /// Blocks this thread for the next event (not on a runtime's thread).
    pub fn blocking_recv(&mut self) -> Option<FabricEvent> {
        self.queue.blocking_recv()
    }

    /// Events waiting (at most the capacity).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Events a sender that can neither wait nor refuse could not queue, held in order until the
/// channel has room (see the module documentation). Its owner bounds it: each event held
/// here holds what it stands for (a message its receive slot, a READ's completion the READ's
/// destination), and the owner calls [`EventBacklog::move_on`] whenever it runs.
pub struct EventBacklog {
    events: EventSender,
    held: Mutex<VecDeque<FabricEvent>>,
}

impl EventBacklog {
    /// A backlog in front of `events`.
    pub fn new(events: EventSender) -> Self {
        Self {
            events,
            held: Mutex::new(VecDeque::new()),
        }
    }

    /// Queues `event` now if nothing is held and a place is free, otherwise holds it behind
    /// the events held before it (then `true`: whoever calls [`EventBacklog::move_on`] must
    /// run again). Dropped if the driver is gone (shutting down).
    pub fn send(&self, event: FabricEvent) -> bool {
        let mut held = lock(&self.held);
        if held.is_empty() {
            match self.events.try_send(event) {
                Err(TrySendError::Full(event)) => held.push_back(event),
                Ok(()) | Err(TrySendError::Gone(_)) => return false,
            }
        } else {
            held.push_back(event);
        }
        true
    }

    /// Queues as many held events as there are places, in order; how many are still held.
    pub fn move_on(&self) -> usize {
        let mut held = lock(&self.held);
        while let Some(event) = held.pop_front() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Gone(_)) => held.clear(),
                Err(TrySendError::Full(event)) => {
                    held.push_front(event);
                    break;
                }
            }
        }
        held.len()
    }

    /// Events held.
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    /// Whether no event is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sender behind the backlog, for what may wait or take a place (see
    /// [`EventSender::reserve_now`]).
    pub fn sender(&self) -> &EventSender {
        &self.events
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The queue stays consistent between statements; a panic elsewhere is already a bug.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
    async fn a_place_taken_at_once_is_refused_when_full_and_kept_for_its_event() {
        let (tx, mut rx) = event_channel_with_capacity(2);
        let place = tx.reserve_now().unwrap();
        tx.send(lost(0)).await.unwrap();
        // Both places are taken (one by an event, one kept): nothing more goes in at once.
        assert_eq!(tx.reserve_now().unwrap_err(), EventsFull { capacity: 2 });
        assert!(matches!(tx.try_send(lost(9)), Err(TrySendError::Full(_))));
        assert_eq!(tx.free_places(), 0);
        // The kept place takes its event without waiting, behind what came before.
        place.send(lost(1));
        assert_eq!(rx.len(), 2);
        assert_eq!(peer(rx.recv().await.unwrap()), 0);
        assert_eq!(peer(rx.recv().await.unwrap()), 1);
        // A place dropped unused is free again.
        drop(tx.reserve_now().unwrap());
        assert_eq!(tx.free_places(), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_backlog_holds_what_did_not_fit_in_order_and_moves_it_on() {
        let (tx, mut rx) = event_channel_with_capacity(1);
        let backlog = EventBacklog::new(tx);
        let held: Vec<bool> = (0..4).map(|n| backlog.send(lost(n))).collect();
        assert_eq!(held, vec![false, true, true, true]);
        assert_eq!((rx.len(), backlog.len()), (1, 3), "the channel went over");
        let mut got = vec![peer(rx.recv().await.unwrap())];
        while got.len() < 4 {
            backlog.move_on();
            assert!(rx.len() <= 1);
            got.push(peer(rx.try_recv().unwrap()));
        }
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert!(backlog.is_empty());
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
