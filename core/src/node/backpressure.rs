//! Persistence back-pressure, a rule of the core: the disk sets the pace of requests that
//! change what is durable, and nothing in a driver ever waits for it.
//!
//! Two bounds, both [`NodeConfig::max_unpersisted_changes`](super::NodeConfig):
//! * **Outputs.** At most that many [`NodeOutput::Persist`] are out (emitted, not yet reported
//!   by [`Node::handle_persisted`]); later changes wait here, numbered, and go out as earlier
//!   ones are reported. A driver's queue to its disk with room for that many never fills, so
//!   handing a change over never blocks (a full one is a bug the driver asserts).
//! * **Requests.** While that many changes are not durable, a client request that may change
//!   what is durable (create, put, seal, delete, evict, release) is held back, in arrival
//!   order, and served once the disk catches up; so is every later request of the same client
//!   (which keeps each client's requests in order) but `get`s and fetches: they carry
//!   deadlines, and wait for what they name anyway. At most
//!   [`NodeConfig::max_deferred_requests`](super::NodeConfig) wait; beyond that a request is
//!   refused with [`StoreError::Busy`] (nothing done), except releases, which are bounded by
//!   the references their client holds.
//!
//! Changes not caused by a request being served (a fetched copy sealed, evictions for it) may
//! take the count of changes past the bound by what one step causes; they wait in the first
//! queue, which is why the outputs have a bound of their own.

use std::collections::VecDeque;

use super::{Node, NodeOutput, Timer};
use crate::client_protocol::{Request, Response};
use crate::error::{StoreError, WaitQueue};
use crate::ids::{ClientId, RequestId};
use crate::store::DurableChange;

/// Changes waiting to be handed out, and requests waiting for the disk.
#[derive(Debug, Default)]
pub(super) struct Backpressure {
    /// Recorded changes not handed to the driver yet: (number, change).
    unsent: VecDeque<(u64, DurableChange)>,
    /// Requests held back, in arrival order.
    deferred: VecDeque<(ClientId, RequestId, Request)>,
}

/// Whether serving `body` may record a durable change (so it waits while the disk is behind).
fn may_change_durable_state(body: &Request) -> bool {
    matches!(
        body,
        Request::Create { .. }
            | Request::Put { .. }
            | Request::PutReplicated { .. }
            | Request::Seal { .. }
            | Request::SealReplicated { .. }
            | Request::Delete { .. }
            | Request::Evict { .. }
            | Request::Release { .. }
            | Request::ReleaseUnanswered { .. }
    )
}

/// Whether `body` carries a deadline: never held back (a `get` after a held-back put waits for
/// the seal like any `get`; a fetch's copies are paced by the outputs' bound).
fn has_deadline(body: &Request) -> bool {
    matches!(
        body,
        Request::Get { .. } | Request::Fetch { .. } | Request::FetchFrom { .. }
    )
}

impl Node {
    /// Changes recorded but not reported durable.
    pub fn unpersisted_changes(&self) -> u64 {
        self.clients.persist_emitted - self.clients.persisted
    }

    /// Client requests held back until the disk catches up.
    pub fn deferred_requests(&self) -> usize {
        self.backpressure.deferred.len()
    }

    /// Numbers the store's new durable changes and hands out as many as the bound allows.
    pub(super) fn absorb_durable_changes(&mut self) {
        while let Some(change) = self.store.poll_durable_change() {
            self.clients.persist_emitted += 1;
            let seq = self.clients.persist_emitted;
            if matches!(change, DurableChange::Removed { .. }) {
                self.clients.last_removal = seq;
            }
            self.backpressure.unsent.push_back((seq, change));
        }
        self.emit_persists();
    }

    fn emit_persists(&mut self) {
        let window = self.config.max_unpersisted_changes.max(1);
        while let Some(&(seq, _)) = self.backpressure.unsent.front() {
            if seq > self.clients.persisted + window {
                break;
            }
            let (seq, change) = self
                .backpressure
                .unsent
                .pop_front()
                .expect("looked at the front");
            self.push(NodeOutput::Persist { seq, change });
        }
    }

    fn disk_behind(&self) -> bool {
        self.config.store.record_durable_changes
            && self.unpersisted_changes() >= self.config.max_unpersisted_changes
    }

    /// The request, when it is to be served now; `None` when it was held back or refused.
    pub(super) fn defer_until_persisted(
        &mut self,
        client: ClientId,
        request: RequestId,
        body: Request,
    ) -> Option<Request> {
        let queued_before = self
            .backpressure
            .deferred
            .iter()
            .any(|(c, _, _)| *c == client);
        let behind = may_change_durable_state(&body) && self.disk_behind();
        if has_deadline(&body) || !(queued_before || behind) {
            return Some(body);
        }
        let release = matches!(
            body,
            Request::Release { .. } | Request::ReleaseUnanswered { .. }
        );
        if self.backpressure.deferred.len() >= self.config.max_deferred_requests && !release {
            let limit = self.config.max_deferred_requests as u64;
            let error = self.busy(WaitQueue::Durability, limit);
            self.reply(client, request, Response::Error(error));
            return None;
        }
        self.backpressure
            .deferred
            .push_back((client, request, body));
        None
    }

    /// Serves the next held-back request when the disk is not behind (or it cannot change
    /// what is durable), and arms a timer for the one after: one request per step, as if it
    /// had just arrived, so what it set for right after itself (a put's seal) happens before
    /// the next is served.
    pub(super) fn serve_deferred(&mut self) {
        self.emit_persists();
        self.cancel_timer(Timer::ServeDeferred);
        let Some((_, _, body)) = self.backpressure.deferred.front() else {
            return;
        };
        if may_change_durable_state(body) && self.disk_behind() {
            return; // `handle_persisted` calls again
        }
        let (client, request, body) = self
            .backpressure
            .deferred
            .pop_front()
            .expect("looked at the front");
        if self.clients.sessions.contains_key(&client) {
            self.serve_welcomed(client, request, body);
        }
        if !self.backpressure.deferred.is_empty() {
            self.set_timer(self.now, Timer::ServeDeferred);
        }
    }

    /// A client left: its held-back requests go with it.
    pub(super) fn drop_deferred_of(&mut self, client: ClientId) {
        self.backpressure.deferred.retain(|(c, _, _)| *c != client);
    }

    pub(super) fn pending_deferred_work(&self, lines: &mut Vec<String>) {
        for (client, request, body) in &self.backpressure.deferred {
            lines.push(format!(
                "{body:?} of {client} {request} waits for the disk ({} changes not durable)",
                self.unpersisted_changes()
            ));
        }
        if let Some(&(seq, _)) = self.backpressure.unsent.front() {
            lines.push(format!(
                "durable changes from {seq} wait to be handed out (durable: {})",
                self.clients.persisted
            ));
        }
    }

    /// Refuses with [`StoreError::Busy`], counted.
    pub(super) fn busy(&mut self, queue: WaitQueue, limit: u64) -> StoreError {
        self.stats.busy_refusals.count(queue);
        StoreError::Busy { queue, limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_protocol::{RequestFrame, PROTOCOL_VERSION};
    use crate::ids::{NodeId, ObjectId};
    use crate::node::NodeConfig;
    use crate::time::Instant;

    const CLIENT: ClientId = ClientId(1);
    const OTHER: ClientId = ClientId(2);
    const WINDOW: u64 = 2;

    fn node(max_deferred: usize) -> Node {
        let mut config = NodeConfig::new(NodeId(0), 1 << 20);
        config.standalone = true;
        config.store.record_durable_changes = true;
        config.max_unpersisted_changes = WINDOW;
        config.max_deferred_requests = max_deferred;
        let mut node = Node::new(config, Instant::ZERO);
        for client in [CLIENT, OTHER] {
            node.handle_client_connected(Instant::ZERO, client);
            ask(
                &mut node,
                client,
                0,
                Request::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    client_name: "test".into(),
                },
            );
        }
        outputs(&mut node);
        node
    }

    fn ask(node: &mut Node, client: ClientId, request: u64, body: Request) {
        let frame = RequestFrame {
            request: RequestId(request),
            body,
        };
        node.handle_client_request(Instant::ZERO, client, frame);
    }

    fn put(node: &mut Node, client: ClientId, request: u64, id: u64) {
        let body = Request::Put {
            id: ObjectId::from_u64(id),
            data: vec![7; 100],
            metadata: Vec::new(),
        };
        ask(node, client, request, body);
        // A put seals right after its bytes are written (a timer due now).
        node.handle_timeout(Instant::ZERO);
    }

    /// Drains the outputs: (replies by request number, persist numbers).
    fn outputs(node: &mut Node) -> (Vec<(u64, Response)>, Vec<u64>) {
        let (mut replies, mut persists) = (Vec::new(), Vec::new());
        while let Some(output) = node.poll_output() {
            match output {
                NodeOutput::Reply {
                    request, response, ..
                } => replies.push((request.0, response)),
                NodeOutput::Persist { seq, .. } => persists.push(seq),
                _ => {}
            }
        }
        (replies, persists)
    }

    fn numbers(replies: &[(u64, Response)]) -> Vec<u64> {
        replies.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn requests_that_change_durable_state_wait_while_the_disk_is_behind_and_keep_their_order() {
        let mut n = node(16);
        put(&mut n, CLIENT, 1, 1);
        put(&mut n, CLIENT, 2, 2);
        let (replies, persists) = outputs(&mut n);
        assert_eq!((numbers(&replies), persists), (vec![1, 2], vec![1, 2]));
        assert_eq!(n.unpersisted_changes(), WINDOW);
        // The disk is behind: the next put waits, and so does a `contains` behind it from the
        // same client; another client's `contains` does not.
        put(&mut n, CLIENT, 3, 3);
        let contains = |id| Request::Contains {
            id: ObjectId::from_u64(id),
        };
        ask(&mut n, CLIENT, 4, contains(3));
        ask(&mut n, OTHER, 5, contains(1));
        let (replies, persists) = outputs(&mut n);
        assert_eq!((numbers(&replies), persists), (vec![5], vec![]));
        assert_eq!(n.deferred_requests(), 2);
        // The disk catches up: both are served, in order, and the put's object is there.
        n.handle_persisted(Instant::ZERO, 2);
        while n.poll_timeout().is_some_and(|at| at <= Instant::ZERO) {
            n.handle_timeout(Instant::ZERO);
        }
        let (replies, persists) = outputs(&mut n);
        assert_eq!(numbers(&replies), [3, 4]);
        assert_eq!(replies[1].1, Response::Contains(true));
        assert_eq!(persists, [3]);
        assert_eq!(n.deferred_requests(), 0);
    }

    #[test]
    fn no_more_persist_outputs_than_the_window_are_out_at_once() {
        let mut n = node(16);
        // One delete removes three objects: three changes in one step.
        for id in 1..=3 {
            put(&mut n, OTHER, id, id);
            n.handle_persisted(Instant::ZERO, id);
        }
        outputs(&mut n);
        let ids = (1..=3).map(ObjectId::from_u64).collect();
        ask(&mut n, CLIENT, 10, Request::Delete { ids });
        let (replies, persists) = outputs(&mut n);
        assert_eq!(persists, [4, 5], "two out, the third waits in the core");
        assert!(
            replies.is_empty(),
            "a delete's reply waits until it is durable"
        );
        n.handle_persisted(Instant::ZERO, 4);
        assert_eq!(outputs(&mut n).1, [6]);
        n.handle_persisted(Instant::ZERO, 6);
        assert_eq!(numbers(&outputs(&mut n).0), [10]);
    }

    #[test]
    fn past_the_cap_a_request_is_refused_as_busy_and_a_release_still_waits() {
        let mut n = node(1);
        put(&mut n, CLIENT, 1, 1);
        put(&mut n, CLIENT, 2, 2);
        outputs(&mut n);
        put(&mut n, CLIENT, 3, 3);
        put(&mut n, CLIENT, 4, 4);
        let release = Request::Release {
            id: ObjectId::from_u64(1),
        };
        ask(&mut n, CLIENT, 5, release);
        let (replies, _) = outputs(&mut n);
        assert_eq!(
            replies,
            [(
                4,
                Response::Error(StoreError::Busy {
                    queue: WaitQueue::Durability,
                    limit: 1
                })
            )]
        );
        assert_eq!(n.deferred_requests(), 2, "the first put and the release");
        assert_eq!(n.stats().busy_refusals.durability, 1);
        assert!(!n.is_quiescent());
        // A client that leaves takes its held-back requests with it.
        n.handle_client_disconnected(Instant::ZERO, CLIENT);
        assert_eq!(n.deferred_requests(), 0);
    }
}
