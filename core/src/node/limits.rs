//! Caps on what waits in the core, with the typed refusal ([`StoreError::Busy`]) a client sees
//! when one is reached, counted per queue in [`NodeStats::busy_refusals`](super::NodeStats):
//! `get`s waiting for seals ([`NodeConfig::max_waiting_gets`](super::NodeConfig)), fetches in
//! progress (`max_pending_fetches`), objects waiting for admission (`max_queued_transfers`)
//! and requests waiting for the disk (`max_deferred_requests`, see `backpressure`). Replies
//! held until their changes are durable need no cap of their own: each owns at least one
//! change not yet durable, and those are bounded by the back-pressure.

use super::Node;
use crate::client_protocol::Request;
use crate::error::{StoreError, WaitQueue};
use crate::ids::ObjectId;

impl Node {
    /// Refuses a `get` that would wait while `max_waiting_gets` already do; one that is
    /// answered at once (every id here, or a zero timeout) always passes.
    pub(super) fn refuse_waiting_get(
        &mut self,
        ids: &[ObjectId],
        timeout_ms: Option<u64>,
    ) -> Option<StoreError> {
        let limit = self.config.max_waiting_gets;
        let polls = Request::timeout(timeout_ms).is_some_and(|t| t.is_zero());
        if polls
            || self.store.waiting_gets() < limit
            || ids.iter().all(|id| self.store.contains(id))
        {
            return None;
        }
        Some(self.busy(WaitQueue::Gets, limit as u64))
    }

    /// Whether another object may join the admission queue; a refusal when not.
    pub(super) fn refuse_queued_transfer(&mut self) -> Option<StoreError> {
        let limit = self.config.max_queued_transfers;
        (self.admission.len() >= limit).then(|| self.busy(WaitQueue::QueuedTransfers, limit as u64))
    }

    /// Whether another client fetch may start; a refusal when not.
    pub(super) fn refuse_fetch(&mut self) -> Option<StoreError> {
        let limit = self.config.max_pending_fetches;
        (self.waiters.len() >= limit).then(|| self.busy(WaitQueue::Fetches, limit as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_protocol::{RequestFrame, Response, PROTOCOL_VERSION};
    use crate::ids::{ClientId, NodeId, RequestId};
    use crate::node::{FetchError, NodeConfig, NodeOutput, TransferMode};
    use crate::time::Instant;

    const CLIENT: ClientId = ClientId(1);

    fn node(configure: impl FnOnce(&mut NodeConfig)) -> Node {
        let mut config = NodeConfig::new(NodeId(0), 1 << 20);
        configure(&mut config);
        let mut node = Node::new(config, Instant::ZERO);
        node.handle_client_connected(Instant::ZERO, CLIENT);
        ask(
            &mut node,
            0,
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name: "test".into(),
            },
        );
        replies(&mut node);
        node
    }

    fn ask(node: &mut Node, request: u64, body: Request) {
        let frame = RequestFrame {
            request: RequestId(request),
            body,
        };
        node.handle_client_request(Instant::ZERO, CLIENT, frame);
    }

    fn replies(node: &mut Node) -> Vec<(u64, Response)> {
        let mut replies = Vec::new();
        while let Some(output) = node.poll_output() {
            if let NodeOutput::Reply {
                request, response, ..
            } = output
            {
                replies.push((request.0, response));
            }
        }
        replies
    }

    fn get(id: u64, timeout_ms: Option<u64>) -> Request {
        Request::Get {
            ids: vec![ObjectId::from_u64(id)],
            timeout_ms,
        }
    }

    #[test]
    fn a_get_that_would_wait_past_the_cap_is_refused_as_busy() {
        let mut n = node(|c| c.max_waiting_gets = 2);
        ask(&mut n, 1, get(1, None));
        ask(&mut n, 2, get(2, Some(60_000)));
        assert!(replies(&mut n).is_empty(), "both wait");
        ask(&mut n, 3, get(3, None));
        let busy = StoreError::Busy {
            queue: WaitQueue::Gets,
            limit: 2,
        };
        assert_eq!(replies(&mut n), [(3, Response::Error(busy.clone()))]);
        assert!(busy.to_string().contains("retry later"), "{busy}");
        // A get that does not wait still passes.
        ask(&mut n, 4, get(3, Some(0)));
        assert!(matches!(&replies(&mut n)[..], [(4, Response::Got(_))]));
        assert_eq!(n.stats().busy_refusals.get(WaitQueue::Gets), 1);
    }

    #[test]
    fn fetches_past_the_cap_are_refused_as_busy() {
        let mut n = node(|c| c.max_pending_fetches = 1);
        let fetch = |id| Request::Fetch {
            ids: vec![ObjectId::from_u64(id)],
            timeout_ms: Some(1_000),
            mode: TransferMode::Auto,
            wait_for_publication: true,
        };
        ask(&mut n, 1, fetch(1));
        ask(&mut n, 2, fetch(2));
        let busy = FetchError::Store(StoreError::Busy {
            queue: WaitQueue::Fetches,
            limit: 1,
        });
        assert_eq!(replies(&mut n), [(2, Response::Fetched(vec![Err(busy)]))]);
        assert_eq!(n.metrics().counters.busy_refusals.fetches, 1);
    }
}
