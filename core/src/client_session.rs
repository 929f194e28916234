//! One client's side of the client protocol ([`crate::client_protocol`]), without IO: which
//! request ids were sent, which replies are awaited, what a reply hands over to its caller,
//! what is released when nobody waits for a reply any more, whether a `Flush` has releases to
//! report on, and whether the connection is a subscription carrying events.
//!
//! The Rust client keeps one [`ClientSession`] per connection behind its socket (a mutex and a
//! condvar around it, the socket beside), and the simulator one per simulated client: the
//! pairing that runs in production is the pairing the simulator checks.
//!
//! A session never panics on what the daemon sends: a reply to a request it does not await (an
//! id never sent, or answered twice) or an event on a connection that did not subscribe is a
//! [`ProtocolViolation`]; the session is then lost, and every later call reports why.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::client_protocol::{Request, RequestFrame, Response, ServerFrame};
use crate::ids::{ObjectId, RequestId};
use crate::store::ObjectEvent;

/// What the daemon sent that a session cannot pair with anything it sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    /// A reply to a request that is not awaited: never sent, answered already, or a release
    /// sent without a reply.
    #[error("unexpected frame from the daemon: a reply to {request}, which is not awaited: {response:?}")]
    UnknownReply {
        /// The request the reply names.
        request: RequestId,
        /// What it answered.
        response: Box<Response>,
    },
    /// An event on a connection that did not subscribe.
    #[error(
        "unexpected frame from the daemon: an event on a connection that did not subscribe: {0:?}"
    )]
    UnexpectedEvent(ObjectEvent),
    /// Bytes that are not a frame of the protocol.
    #[error(transparent)]
    Frame(#[from] crate::client_protocol::FrameError),
}

/// Why a session's connection is unusable; every later call reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionLost {
    /// The daemon closed the connection.
    #[error("the daemon closed the connection")]
    Closed,
    /// Reading or writing the connection failed.
    #[error("connection to the daemon failed: {message}")]
    Io {
        /// The failure's kind, as the OS reported it.
        kind: std::io::ErrorKind,
        /// The failure, as text (the error itself goes to the first caller only).
        message: String,
    },
    /// The daemon broke the protocol: the stream can no longer be trusted.
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolViolation),
}

/// Why a session refuses to send a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendRefused {
    /// The session was closed by its user: only releases still go out (the buffers handed out
    /// are still in use).
    #[error("the client was closed")]
    Closed,
    /// The connection is lost.
    #[error(transparent)]
    Lost(#[from] ConnectionLost),
    /// A subscribed connection carries events only.
    #[error("a subscribed connection carries no requests")]
    Subscribed,
}

/// A request sent whose reply is awaited.
#[derive(Debug)]
struct Awaited<T> {
    /// What the caller attached to it.
    tag: T,
    /// It is a `Subscribe`: its `Done(Ok)` turns the connection into a stream of events.
    subscribes: bool,
}

/// One client connection's requests and replies (see the module doc). `T` is what the caller
/// attaches to each request and gets back with its reply (the simulator: what to do with it;
/// the Rust client: nothing).
#[derive(Debug)]
pub struct ClientSession<T> {
    /// The id of the last request sent (0: none yet).
    last_request: u64,
    /// Requests sent whose replies have not come.
    awaited: BTreeMap<RequestId, Awaited<T>>,
    /// Replies come, not picked up yet.
    arrived: BTreeMap<RequestId, (T, Response)>,
    /// Requests whose callers stopped waiting: their replies are dropped when they come, and
    /// the references they hold released.
    abandoned: BTreeSet<RequestId>,
    /// References held by replies nobody waits for any more, to release.
    orphaned: Vec<ObjectId>,
    /// `ReleaseUnanswered` sent since the last `Flush`.
    unflushed_releases: u64,
    /// A `Subscribe` was accepted: the connection carries events now.
    subscribed: bool,
    /// Events come, not picked up yet.
    events: VecDeque<ObjectEvent>,
    /// Why the connection is unusable, once it is.
    lost: Option<ConnectionLost>,
    /// The user closed the session: calls are refused and waits end.
    closed: bool,
}

impl<T> Default for ClientSession<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ClientSession<T> {
    /// A session on a new connection: its first request (the `Hello`) gets id 1.
    pub fn new() -> Self {
        Self {
            last_request: 0,
            awaited: BTreeMap::new(),
            arrived: BTreeMap::new(),
            abandoned: BTreeSet::new(),
            orphaned: Vec::new(),
            unflushed_releases: 0,
            subscribed: false,
            events: VecDeque::new(),
            lost: None,
            closed: false,
        }
    }

    /// Gives `body` the next request id and, unless it is a `ReleaseUnanswered` (which gets no
    /// reply), awaits its reply with `tag`. The caller writes the frame, or calls
    /// [`ClientSession::withdraw`] if it cannot.
    pub fn send(&mut self, body: Request, tag: T) -> Result<RequestFrame, SendRefused> {
        if let Some(lost) = &self.lost {
            return Err(SendRefused::Lost(lost.clone()));
        }
        let unanswered = matches!(body, Request::ReleaseUnanswered { .. });
        if self.closed && !unanswered {
            return Err(SendRefused::Closed);
        }
        if self.subscribed {
            return Err(SendRefused::Subscribed);
        }
        self.last_request += 1;
        let request = RequestId(self.last_request);
        match &body {
            Request::ReleaseUnanswered { .. } => self.unflushed_releases += 1,
            // The flush reports on every release before it.
            Request::Flush => self.unflushed_releases = 0,
            _ => {}
        }
        if !unanswered {
            let subscribes = matches!(body, Request::Subscribe);
            self.awaited.insert(request, Awaited { tag, subscribes });
        }
        Ok(RequestFrame { request, body })
    }

    /// Forgets a request [`ClientSession::send`] numbered but that was never written (it was
    /// over the daemon's size limit): no reply is awaited. Returns its tag.
    pub fn withdraw(&mut self, request: RequestId) -> Option<T> {
        self.awaited.remove(&request).map(|awaited| awaited.tag)
    }

    /// Takes in a frame read from the connection: a reply is filed for its caller (or, if the
    /// caller gave up, its references are marked for release); an event is queued on a
    /// subscribed connection. Anything else loses the connection, with the violation.
    pub fn receive(&mut self, frame: ServerFrame) -> Result<(), ProtocolViolation> {
        let violation = match frame {
            ServerFrame::Reply { request, response } => {
                if let Some(awaited) = self.awaited.remove(&request) {
                    if awaited.subscribes && response == Response::Done(Ok(())) {
                        self.subscribed = true;
                    }
                    self.arrived.insert(request, (awaited.tag, response));
                    return Ok(());
                }
                if self.abandoned.remove(&request) {
                    self.orphaned.extend(references_in(&response));
                    return Ok(());
                }
                ProtocolViolation::UnknownReply {
                    request,
                    response: Box::new(response),
                }
            }
            ServerFrame::Event(event) if self.subscribed => {
                self.events.push_back(event);
                return Ok(());
            }
            ServerFrame::Event(event) => ProtocolViolation::UnexpectedEvent(event),
        };
        self.lost
            .get_or_insert_with(|| ConnectionLost::Protocol(violation.clone()));
        Err(violation)
    }

    /// The reply to `request` with its tag, once it came (and only once).
    pub fn take_reply(&mut self, request: RequestId) -> Option<(T, Response)> {
        self.arrived.remove(&request)
    }

    /// The reply that came to the oldest request, with its id and tag.
    pub fn poll_reply(&mut self) -> Option<(RequestId, T, Response)> {
        self.arrived
            .pop_first()
            .map(|(request, (tag, response))| (request, tag, response))
    }

    /// The next event of a subscribed connection.
    pub fn poll_event(&mut self) -> Option<ObjectEvent> {
        self.events.pop_front()
    }

    /// Stops waiting for `request`'s reply: dropped when it comes, its references released.
    /// Returns the references to release now, if it came already.
    pub fn abandon(&mut self, request: RequestId) -> Vec<ObjectId> {
        if let Some((_, response)) = self.arrived.remove(&request) {
            return references_in(&response);
        }
        // On a lost connection nothing more comes, and the daemon drops its references itself.
        if self.awaited.remove(&request).is_some() && self.lost.is_none() {
            self.abandoned.insert(request);
        }
        Vec::new()
    }

    /// References of replies nobody waited for any more: the caller releases them.
    pub fn take_orphaned(&mut self) -> Vec<ObjectId> {
        std::mem::take(&mut self.orphaned)
    }

    /// Whether replies of abandoned requests left references to release.
    pub fn has_orphaned(&self) -> bool {
        !self.orphaned.is_empty()
    }

    /// Marks the connection lost (the first reason stays); no awaited reply will come.
    pub fn fail(&mut self, lost: ConnectionLost) {
        self.lost.get_or_insert(lost);
    }

    /// The daemon closed the connection (or the client is gone): returns the tags of the
    /// requests that will never be answered, oldest first, and loses the session.
    pub fn disconnect(&mut self, lost: ConnectionLost) -> Vec<(RequestId, T)> {
        self.fail(lost);
        self.abandoned.clear();
        std::mem::take(&mut self.awaited)
            .into_iter()
            .map(|(request, awaited)| (request, awaited.tag))
            .collect()
    }

    /// Why the connection is unusable, once it is.
    pub fn lost(&self) -> Option<&ConnectionLost> {
        self.lost.as_ref()
    }

    /// Closes the session for calls: later sends are refused (releases excepted), and callers
    /// waiting give up.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Whether [`ClientSession::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether a `Subscribe` was accepted.
    pub fn is_subscribed(&self) -> bool {
        self.subscribed
    }

    /// `ReleaseUnanswered` sent since the last `Flush`: a `Flush` now would report on them.
    pub fn unflushed_releases(&self) -> u64 {
        self.unflushed_releases
    }

    /// The tags of the requests whose replies are awaited, oldest first.
    pub fn awaited(&self) -> impl Iterator<Item = (RequestId, &T)> {
        self.awaited
            .iter()
            .map(|(request, awaited)| (*request, &awaited.tag))
    }
}

/// The objects a reply holds a reference to, on its caller's behalf.
pub fn references_in(response: &Response) -> Vec<ObjectId> {
    match response {
        Response::Got(results) => results.iter().flatten().map(|info| info.id).collect(),
        Response::Fetched(results) => results.iter().flatten().map(|info| info.id).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    fn id(n: u64) -> ObjectId {
        ObjectId::from_u64(n)
    }

    fn reply(request: u64, response: Response) -> ServerFrame {
        ServerFrame::Reply {
            request: RequestId(request),
            response,
        }
    }

    fn got(ids: &[u64]) -> Response {
        use crate::region::LocalRegion;
        use crate::ArenaId;
        Response::Got(
            ids.iter()
                .map(|&n| {
                    Ok(crate::ObjectInfo {
                        id: id(n),
                        data_size: 1,
                        metadata_size: 0,
                        region: LocalRegion {
                            arena: ArenaId(0),
                            offset: 0,
                            len: 1,
                        },
                    })
                })
                .chain([Err(StoreError::ObjectNotFound(id(99)))])
                .collect(),
        )
    }

    #[test]
    fn replies_pair_with_their_requests_in_any_order() {
        let mut session = ClientSession::new();
        let first = session.send(Request::List, "list").unwrap().request;
        let second = session.send(Request::Stats, "stats").unwrap().request;
        assert_eq!((first, second), (RequestId(1), RequestId(2)));
        session.receive(reply(2, Response::Contains(true))).unwrap();
        assert_eq!(session.take_reply(first), None);
        session
            .receive(reply(1, Response::Contains(false)))
            .unwrap();
        assert_eq!(
            session.take_reply(first),
            Some(("list", Response::Contains(false)))
        );
        assert_eq!(
            session.poll_reply(),
            Some((second, "stats", Response::Contains(true)))
        );
        assert_eq!(session.poll_reply(), None);
    }

    #[test]
    fn a_reply_to_nothing_awaited_loses_the_session_without_a_panic() {
        for stray in [0, 1, 7] {
            let mut session = ClientSession::new();
            session.send(Request::List, ()).unwrap();
            session
                .receive(reply(1, Response::Listed(Vec::new())))
                .unwrap();
            // 0: an undecodable request's answer; 1: answered twice; 7: never sent.
            let violation = session.receive(reply(stray, Response::Contains(true)));
            assert!(
                matches!(violation, Err(ProtocolViolation::UnknownReply { request, .. }) if request == RequestId(stray)),
                "{violation:?}"
            );
            assert!(matches!(session.lost(), Some(ConnectionLost::Protocol(_))));
            assert!(matches!(
                session.send(Request::Stats, ()),
                Err(SendRefused::Lost(ConnectionLost::Protocol(_)))
            ));
        }
    }

    #[test]
    fn events_come_only_on_a_subscribed_connection() {
        let event = ObjectEvent::Deleted { id: id(1) };
        let mut session = ClientSession::<()>::new();
        assert!(matches!(
            session.receive(ServerFrame::Event(event)),
            Err(ProtocolViolation::UnexpectedEvent(_))
        ));

        let mut session = ClientSession::new();
        let subscribe = session.send(Request::Subscribe, ()).unwrap().request;
        session.receive(reply(1, Response::Done(Ok(())))).unwrap();
        assert_eq!(
            session.take_reply(subscribe),
            Some(((), Response::Done(Ok(()))))
        );
        assert!(session.is_subscribed());
        session.receive(ServerFrame::Event(event)).unwrap();
        assert_eq!(session.poll_event(), Some(event));
        assert_eq!(
            session.send(Request::List, ()),
            Err(SendRefused::Subscribed)
        );
        // A reply on the stream of events pairs with nothing.
        assert!(session.receive(reply(2, Response::Contains(true))).is_err());
    }

    #[test]
    fn a_refused_subscription_stays_a_request_connection() {
        let mut session = ClientSession::new();
        session.send(Request::Subscribe, ()).unwrap();
        let refused = Response::Done(Err(StoreError::BadRequest("no".into())));
        session.receive(reply(1, refused)).unwrap();
        assert!(!session.is_subscribed());
        assert!(session.send(Request::List, ()).is_ok());
    }

    #[test]
    fn releases_get_no_reply_and_a_flush_reports_on_them() {
        let mut session = ClientSession::new();
        let release = session
            .send(Request::ReleaseUnanswered { id: id(1) }, ())
            .unwrap();
        session
            .send(Request::ReleaseUnanswered { id: id(2) }, ())
            .unwrap();
        assert_eq!(session.unflushed_releases(), 2);
        assert_eq!(session.awaited().count(), 0);
        // A reply to a release is one the daemon must not send.
        let mut strict = ClientSession::<()>::new();
        strict
            .send(Request::ReleaseUnanswered { id: id(1) }, ())
            .unwrap();
        assert!(strict
            .receive(reply(release.request.0, Response::Done(Ok(()))))
            .is_err());

        let flush = session.send(Request::Flush, ()).unwrap().request;
        assert_eq!(flush, RequestId(3));
        assert_eq!(session.unflushed_releases(), 0);
        let failed = Response::Done(Err(StoreError::NotHeld(id(2))));
        session.receive(reply(3, failed.clone())).unwrap();
        assert_eq!(session.take_reply(flush), Some(((), failed)));
    }

    #[test]
    fn an_abandoned_reply_is_dropped_and_its_references_released() {
        let mut session = ClientSession::new();
        let early = session.send(Request::List, ()).unwrap().request;
        let late = session.send(Request::List, ()).unwrap().request;
        // Came before its caller gave up: released at once.
        session.receive(reply(early.0, got(&[1]))).unwrap();
        assert_eq!(session.abandon(early), vec![id(1)]);
        // Comes after: released when it comes, and only its `Ok`s.
        assert_eq!(session.abandon(late), Vec::new());
        assert!(!session.has_orphaned());
        session.receive(reply(late.0, got(&[2, 3]))).unwrap();
        assert_eq!(session.take_orphaned(), vec![id(2), id(3)]);
        assert_eq!(session.take_reply(late), None);
        // Only once.
        assert!(session.receive(reply(late.0, got(&[2]))).is_err());
    }

    #[test]
    fn a_closed_session_sends_only_releases() {
        let mut session = ClientSession::new();
        session.close();
        assert_eq!(session.send(Request::List, ()), Err(SendRefused::Closed));
        assert!(session
            .send(Request::ReleaseUnanswered { id: id(1) }, ())
            .is_ok());
    }

    #[test]
    fn a_disconnect_hands_back_what_is_unanswered() {
        let mut session = ClientSession::new();
        session.send(Request::List, "a").unwrap();
        let b = session.send(Request::Stats, "b").unwrap().request;
        session.abandon(b);
        session.send(Request::Nodes, "c").unwrap();
        let unanswered = session.disconnect(ConnectionLost::Closed);
        assert_eq!(unanswered, vec![(RequestId(1), "a"), (RequestId(3), "c")]);
        assert_eq!(session.lost(), Some(&ConnectionLost::Closed));
        assert_eq!(
            session.send(Request::List, "d"),
            Err(SendRefused::Lost(ConnectionLost::Closed))
        );
    }

    #[test]
    fn a_withdrawn_request_awaits_nothing() {
        let mut session = ClientSession::new();
        let request = session.send(Request::List, 5).unwrap().request;
        assert_eq!(session.withdraw(request), Some(5));
        assert!(session
            .receive(reply(1, Response::Listed(Vec::new())))
            .is_err());
    }
}
