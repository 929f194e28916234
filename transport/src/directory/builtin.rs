//! The built-in directory: a head daemon serves it over TCP, every daemon (the head included)
//! connects to it as a client. Zero setup: `skyriver daemon --head` serves, others `--join`.
//!
//! Protocol: length-prefixed postcard frames ([`super::frame`]). The node opens with a
//! versioned `Hello` carrying the cluster token and its [`MemberInfo`]; the head answers
//! `Welcome` (then the member list) or `Refused` with a reason. After that the node sends
//! requests tagged with connection-local op numbers and pings; the head sends replies, pushed
//! events (one-shot `Published` subscriptions) and `Members` at every membership change.
//!
//! Liveness: a node is a member while its connection is up and it is heard from (any frame,
//! pings at least) within the heartbeat timeout; the node likewise drops a head it has not heard
//! from. When a node goes, its publications and subscriptions go with it and the new member list
//! is pushed. A node that reconnects re-publishes what it holds and re-registers its pending
//! subscriptions, so a restarted head rebuilds its state from the nodes.
//!
//! Every request is served under one lock, so a `Lookup` with `subscribe` and a concurrent
//! `Publish` are ordered: either the lookup sees the holder, or the publish fires the
//! subscription. Replies and events for one node leave through one queue, in that order.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use skyriver_core::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::{NodeId, ObjectId, ObjectSizes};
use smallvec::SmallVec;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use super::frame;
use super::{
    remember_while_down, Directory, DirectoryError, DirectoryNotice, MemberInfo, RequestQueue,
};

/// Version of the built-in directory protocol, checked in the hello.
pub const PROTOCOL_VERSION: u16 = 1;
/// Opens every hello, so a stray client (or an old daemon) is told apart from a bad token.
const MAGIC: [u8; 8] = *b"skyrdir\0";
/// Most nodes one head serves.
pub const MAX_NODES: usize = 4096;
/// Most pending one-shot subscriptions of one node.
pub const MAX_SUBSCRIPTIONS_PER_NODE: usize = 65_536;
/// Most objects one node may publish.
pub const MAX_PUBLICATIONS_PER_NODE: usize = 1 << 24;
/// Most requests one node keeps in flight; more are answered `Unavailable` at once.
pub const MAX_IN_FLIGHT_PER_NODE: usize = 65_536;
/// Longest cluster token accepted.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Frames queued for one node; a node that lets this fill up is disconnected.
const NODE_QUEUE_FRAMES: usize = 4096;
/// Connections still in their hello, on top of [`MAX_NODES`].
const MAX_PENDING_HELLOS: usize = 64;

/// Node → head.
#[derive(Debug, Serialize, Deserialize)]
enum ToHead {
    /// First frame of a connection.
    Hello {
        magic: [u8; 8],
        version: u16,
        token: String,
        member: MemberInfo,
    },
    /// A directory request; `op` is chosen by the node, unique on this connection.
    Request { op: u64, request: DirectoryRequest },
    /// Liveness; answered with `Pong`.
    Ping { seq: u64 },
}

/// Head → node.
#[derive(Debug, Serialize, Deserialize)]
enum ToNode {
    /// The hello was accepted.
    Welcome { version: u16 },
    /// The node is not (or no longer) served; the connection closes after this frame.
    Refused {
        reason: String,
        /// Trying again shortly may succeed (the same node id is still registered).
        retryable: bool,
    },
    /// The answer to `Request { op, .. }`.
    Reply { op: u64, reply: DirectoryReply },
    /// A one-shot subscription fired.
    Event(DirectoryEvent),
    /// The live members, sorted by node id.
    Members(Vec<MemberInfo>),
    /// The answer to `Ping { seq }`.
    Pong { seq: u64 },
}

/// An encoded frame, shared when one frame goes to many nodes.
type Frame = Arc<[u8]>;

fn encode(message: &ToNode) -> Frame {
    frame::encode(message).into()
}

// ------------------------------------------------------------------------------------------
// Server
// ------------------------------------------------------------------------------------------

/// How the head serves the directory.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Nodes must present this token in their hello.
    pub cluster_token: String,
    /// A node not heard from for this long is dropped.
    pub heartbeat_timeout: Duration,
    /// A connection must say hello within this long.
    pub hello_timeout: Duration,
}

impl ServerConfig {
    /// Defaults (5 s heartbeat timeout, 5 s hello timeout) with `cluster_token`.
    pub fn new(cluster_token: impl Into<String>) -> Self {
        Self {
            cluster_token: cluster_token.into(),
            heartbeat_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(5),
        }
    }
}

/// The built-in directory service, running on the current tokio runtime.
#[derive(Debug)]
pub struct BuiltinDirectoryServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl BuiltinDirectoryServer {
    /// Serves the directory on `listener` until [`shutdown`](Self::shutdown) or drop. Must be
    /// called from within a tokio runtime.
    pub fn spawn(listener: TcpListener, config: ServerConfig) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::default()),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        tracing::info!(%local_addr, "built-in directory serving");
        Ok(Self {
            local_addr,
            shared,
            shutdown,
            task: Some(task),
        })
    }

    /// Where the service listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The live members, sorted by node id.
    pub fn members(&self) -> Vec<MemberInfo> {
        self.shared.lock().members()
    }

    /// Stops accepting, closes every node's connection and waits for the accept loop to end.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for BuiltinDirectoryServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

#[derive(Debug)]
struct Shared {
    config: ServerConfig,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock except on a bug; a poisoned state is still
        // consistent enough to keep serving (every mutation completes before any push).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One connected node.
#[derive(Debug)]
struct Session {
    /// Tells this connection from an earlier one of the same node.
    id: u64,
    member: MemberInfo,
    queue: mpsc::Sender<Frame>,
    published: HashSet<ObjectId>,
    subscribed: HashSet<ObjectId>,
}

/// The nodes holding one object, sorted by node id, each with the sizes it published. Nearly
/// always a single node, kept inline: the head keeps one of these for every object of the
/// cluster, so it must stay small.
type Holders = SmallVec<[(NodeId, ObjectSizes); 1]>;

#[derive(Debug, Default)]
struct State {
    sessions: BTreeMap<NodeId, Session>,
    /// Every published object; never an empty list.
    holders: HashMap<ObjectId, Holders>,
    /// One-shot subscriptions to objects, by object; never an empty set. Few at a time, so
    /// kept apart from `holders`.
    subscribers: HashMap<ObjectId, BTreeSet<NodeId>>,
    next_session: u64,
}

/// Why a hello was turned down.
struct Refusal {
    reason: String,
    retryable: bool,
}

impl State {
    fn members(&self) -> Vec<MemberInfo> {
        self.sessions.values().map(|s| s.member.clone()).collect()
    }

    /// Registers a node whose hello checked out; queues `Welcome` and pushes the members.
    fn join(
        &mut self,
        member: MemberInfo,
        queue: mpsc::Sender<Frame>,
        heartbeat_timeout: Duration,
    ) -> Result<u64, Refusal> {
        let node = member.node;
        if let Some(old) = self.sessions.get(&node) {
            let same_daemon = old.member.incarnation == member.incarnation
                && old.member.fabric_addr == member.fabric_addr;
            if !same_daemon {
                return Err(Refusal {
                    reason: format!(
                        "{node} is already a member (incarnation {}, fabric at {}); a restarted \
                         daemon is accepted once the old connection closes or is silent for {} ms",
                        old.member.incarnation,
                        old.member.fabric_addr,
                        heartbeat_timeout.as_millis()
                    ),
                    retryable: true,
                });
            }
            // The same daemon reconnecting before its old connection was noticed dead.
            tracing::info!(%node, "node reconnected; replacing its old connection");
            self.remove_session(node);
        } else if self.sessions.len() >= MAX_NODES {
            return Err(Refusal {
                reason: format!("the directory serves at most {MAX_NODES} nodes"),
                retryable: false,
            });
        }
        let welcome = encode(&ToNode::Welcome {
            version: PROTOCOL_VERSION,
        });
        // A fresh queue has room.
        let _ = queue.try_send(welcome);
        self.next_session += 1;
        let id = self.next_session;
        tracing::info!(%node, fabric_addr = %member.fabric_addr, incarnation = member.incarnation, "node joined");
        self.sessions.insert(
            node,
            Session {
                id,
                member,
                queue,
                published: HashSet::new(),
                subscribed: HashSet::new(),
            },
        );
        self.settle(Vec::new(), true);
        Ok(id)
    }

    /// Removes `node`'s session if it is still `session`, and tells the others.
    fn depart(&mut self, node: NodeId, session: u64, reason: &str) {
        if self.sessions.get(&node).is_some_and(|s| s.id == session) {
            tracing::info!(%node, reason, "node left");
            self.remove_session(node);
            self.settle(Vec::new(), true);
        }
    }

    /// Drops a session with its publications and subscriptions; no push.
    fn remove_session(&mut self, node: NodeId) -> Option<Session> {
        let session = self.sessions.remove(&node)?;
        for id in &session.published {
            self.remove_holder(*id, node);
        }
        for id in &session.subscribed {
            self.remove_subscriber(*id, node);
        }
        Some(session)
    }

    /// Queues `frame` for `node`; a node whose queue is full goes on `overflowed`.
    fn push(&self, node: NodeId, frame: Frame, overflowed: &mut Vec<NodeId>) {
        if let Some(session) = self.sessions.get(&node) {
            if let Err(mpsc::error::TrySendError::Full(_)) = session.queue.try_send(frame) {
                overflowed.push(node);
            }
        }
    }

    /// Disconnects nodes that stopped reading and pushes the member list while it changes.
    /// Ends: every round that pushes again removed at least one session.
    fn settle(&mut self, mut overflowed: Vec<NodeId>, mut members_changed: bool) {
        loop {
            for node in overflowed.drain(..) {
                if self.remove_session(node).is_some() {
                    tracing::warn!(%node, "node disconnected: it stopped reading its queue");
                    members_changed = true;
                }
            }
            if !members_changed {
                return;
            }
            members_changed = false;
            let frame = encode(&ToNode::Members(self.members()));
            let nodes: Vec<NodeId> = self.sessions.keys().copied().collect();
            for node in nodes {
                self.push(node, frame.clone(), &mut overflowed);
            }
        }
    }

    /// Serves one request of `node`; the reply (if any) goes through `permit`, after any event
    /// the request fired for the node itself.
    fn serve(
        &mut self,
        node: NodeId,
        session: u64,
        op: u64,
        request: DirectoryRequest,
        permit: mpsc::Permit<'_, Frame>,
    ) {
        if self.sessions.get(&node).is_none_or(|s| s.id != session) {
            return;
        }
        let mut overflowed = Vec::new();
        let reply = match request {
            DirectoryRequest::Lookup { id, subscribe } => self.lookup(node, id, subscribe),
            DirectoryRequest::Publish { id, sizes } => {
                self.publish(node, id, sizes, &mut overflowed)
            }
            DirectoryRequest::Withdraw { id } => {
                self.withdraw(node, id);
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Unsubscribe { id } => {
                self.unsubscribe(node, id);
                None
            }
        };
        if let Some(reply) = reply {
            permit.send(encode(&ToNode::Reply { op, reply }));
        }
        self.settle(overflowed, false);
    }

    fn lookup(&mut self, node: NodeId, id: ObjectId, subscribe: bool) -> Option<DirectoryReply> {
        let (holders, sizes) = match self.holders.get(&id) {
            Some(holders) => (
                holders
                    .iter()
                    .map(|&(holder, _)| holder)
                    .collect::<Vec<_>>(),
                holders.first().map(|&(_, sizes)| sizes),
            ),
            None => (Vec::new(), None),
        };
        if holders.is_empty() && subscribe {
            // The session exists: `serve` checked it.
            let session = self.sessions.get_mut(&node)?;
            if !session.subscribed.contains(&id)
                && session.subscribed.len() >= MAX_SUBSCRIPTIONS_PER_NODE
            {
                return Some(DirectoryReply::Unavailable {
                    reason: format!(
                        "{node} has {MAX_SUBSCRIPTIONS_PER_NODE} pending subscriptions, the most \
                         the directory keeps"
                    ),
                });
            }
            session.subscribed.insert(id);
            self.subscribers.entry(id).or_default().insert(node);
        }
        Some(DirectoryReply::Located { holders, sizes })
    }

    fn publish(
        &mut self,
        node: NodeId,
        id: ObjectId,
        sizes: ObjectSizes,
        overflowed: &mut Vec<NodeId>,
    ) -> Option<DirectoryReply> {
        let session = self.sessions.get_mut(&node)?;
        if !session.published.contains(&id) && session.published.len() >= MAX_PUBLICATIONS_PER_NODE
        {
            return Some(DirectoryReply::Unavailable {
                reason: format!("{node} published {MAX_PUBLICATIONS_PER_NODE} objects, the most the directory keeps"),
            });
        }
        session.published.insert(id);
        let holders = self.holders.entry(id).or_default();
        match holders.binary_search_by_key(&node, |&(holder, _)| holder) {
            Ok(at) => holders[at].1 = sizes,
            Err(at) => holders.insert(at, (node, sizes)),
        }
        if let Some(subscribers) = self.subscribers.remove(&id) {
            let event = encode(&ToNode::Event(DirectoryEvent::Published {
                id,
                holder: node,
                sizes,
            }));
            for subscriber in subscribers {
                if let Some(s) = self.sessions.get_mut(&subscriber) {
                    s.subscribed.remove(&id);
                }
                self.push(subscriber, event.clone(), overflowed);
            }
        }
        Some(DirectoryReply::Done)
    }

    fn withdraw(&mut self, node: NodeId, id: ObjectId) {
        if let Some(session) = self.sessions.get_mut(&node) {
            session.published.remove(&id);
        }
        self.remove_holder(id, node);
    }

    fn unsubscribe(&mut self, node: NodeId, id: ObjectId) {
        if let Some(session) = self.sessions.get_mut(&node) {
            session.subscribed.remove(&id);
        }
        self.remove_subscriber(id, node);
    }

    fn remove_holder(&mut self, id: ObjectId, node: NodeId) {
        if let Some(holders) = self.holders.get_mut(&id) {
            holders.retain(|&mut (holder, _)| holder != node);
            if holders.is_empty() {
                self.holders.remove(&id);
            }
        }
    }

    fn remove_subscriber(&mut self, id: ObjectId, node: NodeId) {
        if let Some(subscribers) = self.subscribers.get_mut(&id) {
            subscribers.remove(&node);
            if subscribers.is_empty() {
                self.subscribers.remove(&id);
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connections = Arc::new(Semaphore::new(MAX_NODES + MAX_PENDING_HELLOS));
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = connections.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "directory connection refused: too many connections");
                        continue;
                    };
                    let shared = shared.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        serve_connection(shared, stream, peer, shutdown).await;
                        drop(slot);
                    });
                }
                Err(error) => {
                    // Out of fds or similar: back off briefly instead of spinning.
                    tracing::warn!(%error, "directory accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    tracing::info!("built-in directory stopped");
}

fn check_hello(config: &ServerConfig, hello: ToHead) -> Result<MemberInfo, Refusal> {
    let refuse = |reason: String| Refusal {
        reason,
        retryable: false,
    };
    let ToHead::Hello {
        magic,
        version,
        token,
        member,
    } = hello
    else {
        return Err(refuse("the first frame must be a hello".into()));
    };
    if magic != MAGIC {
        return Err(refuse("not a Skyriver directory hello".into()));
    }
    if version != PROTOCOL_VERSION {
        return Err(refuse(format!(
            "directory protocol version {version} is not supported (this head speaks {PROTOCOL_VERSION})"
        )));
    }
    if token.len() > MAX_TOKEN_BYTES || !crate::token::tokens_match(&token, &config.cluster_token) {
        return Err(refuse(
            "wrong cluster token: this node's token does not match the head's".into(),
        ));
    }
    Ok(member)
}

async fn refuse(writer: &mut OwnedWriteHalf, refusal: Refusal) {
    let frame = frame::encode(&ToNode::Refused {
        reason: refusal.reason,
        retryable: refusal.retryable,
    });
    let _ = timeout(Duration::from_secs(1), async {
        writer.write_all(&frame).await?;
        writer.shutdown().await
    })
    .await;
}

async fn serve_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = Vec::new();
    let hello = match timeout(
        shared.config.hello_timeout,
        frame::read::<ToHead, _>(&mut reader, &mut buf),
    )
    .await
    {
        Ok(Ok(Some(hello))) => hello,
        Ok(Ok(None)) => return,
        Ok(Err(error)) => {
            let reason = format!(
                "malformed hello ({error}); is this a Skyriver daemon of the same version?"
            );
            tracing::warn!(%peer, %reason, "directory hello refused");
            refuse(
                &mut writer,
                Refusal {
                    reason,
                    retryable: false,
                },
            )
            .await;
            return;
        }
        Err(_) => {
            let reason = format!(
                "no hello within {} ms",
                shared.config.hello_timeout.as_millis()
            );
            refuse(
                &mut writer,
                Refusal {
                    reason,
                    retryable: false,
                },
            )
            .await;
            return;
        }
    };
    let member = match check_hello(&shared.config, hello) {
        Ok(member) => member,
        Err(refusal) => {
            tracing::warn!(%peer, reason = %refusal.reason, "directory hello refused");
            refuse(&mut writer, refusal).await;
            return;
        }
    };
    let node = member.node;
    let (queue, frames) = mpsc::channel::<Frame>(NODE_QUEUE_FRAMES);
    let own_queue = queue.downgrade();
    let joined = shared
        .lock()
        .join(member, queue, shared.config.heartbeat_timeout);
    let session = match joined {
        Ok(session) => session,
        Err(refusal) => {
            tracing::warn!(%peer, %node, reason = %refusal.reason, "directory hello refused");
            refuse(&mut writer, refusal).await;
            return;
        }
    };
    let reason = tokio::select! {
        reason = read_requests(&shared, &mut reader, node, session, own_queue) => reason,
        reason = write_frames(writer, frames) => reason,
        _ = shutdown.changed() => "the head is shutting down".to_string(),
    };
    shared.lock().depart(node, session, &reason);
}

async fn read_requests(
    shared: &Shared,
    reader: &mut OwnedReadHalf,
    node: NodeId,
    session: u64,
    own_queue: mpsc::WeakSender<Frame>,
) -> String {
    let heartbeat_timeout = shared.config.heartbeat_timeout;
    let mut buf = Vec::new();
    loop {
        let message = match timeout(
            heartbeat_timeout,
            frame::read::<ToHead, _>(reader, &mut buf),
        )
        .await
        {
            Ok(Ok(Some(message))) => message,
            Ok(Ok(None)) => return "connection closed".into(),
            Ok(Err(error)) => return error.to_string(),
            Err(_) => return format!("not heard from for {} ms", heartbeat_timeout.as_millis()),
        };
        // The state drops the strong sender when the session ends.
        let Some(queue) = own_queue.upgrade() else {
            return "session ended".into();
        };
        // Wait for room outside the lock (backpressure on this node only), then serve under
        // the lock so the reply is queued in order with the events the request fires.
        let Ok(permit) = queue.reserve().await else {
            return "session ended".into();
        };
        match message {
            ToHead::Hello { .. } => return "a second hello".into(),
            ToHead::Ping { seq } => permit.send(encode(&ToNode::Pong { seq })),
            ToHead::Request { op, request } => {
                shared.lock().serve(node, session, op, request, permit)
            }
        }
    }
}

async fn write_frames(writer: OwnedWriteHalf, mut frames: mpsc::Receiver<Frame>) -> String {
    let mut writer = BufWriter::new(writer);
    while let Some(frame) = frames.recv().await {
        if let Err(error) = writer.write_all(&frame).await {
            return format!("write failed: {error}");
        }
        if frames.is_empty() {
            if let Err(error) = writer.flush().await {
                return format!("write failed: {error}");
            }
        }
    }
    let _ = writer.shutdown().await;
    "session ended".into()
}

// ------------------------------------------------------------------------------------------
// Client
// ------------------------------------------------------------------------------------------

/// How a node talks to the head.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// A ping goes to the head this often.
    pub heartbeat_interval: Duration,
    /// The head is considered gone when not heard from for this long.
    pub heartbeat_timeout: Duration,
    /// Bound on one connection attempt (TCP connect plus hello).
    pub connect_timeout: Duration,
    /// How long the first connection keeps retrying a retryable refusal (the same node id is
    /// still registered from a daemon that just restarted).
    pub join_timeout: Duration,
    /// First delay between reconnection attempts; doubles up to `reconnect_backoff_max`.
    pub reconnect_backoff_min: Duration,
    /// Longest delay between reconnection attempts.
    pub reconnect_backoff_max: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            join_timeout: Duration::from_secs(8),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
        }
    }
}

/// A node's connection to the built-in directory. Dropping it leaves the cluster.
#[derive(Debug)]
pub struct BuiltinDirectory {
    queue: RequestQueue,
    description: String,
}

impl Directory for BuiltinDirectory {
    fn submit(&self, op: DirectoryOpId, request: DirectoryRequest) {
        self.queue.submit(op, request);
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

/// Why one connection attempt failed.
enum HandshakeError {
    Unreachable(String),
    Refused { reason: String, retryable: bool },
}

struct Connection {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
}

/// What a connection attempt needs; cloned into each attempt.
#[derive(Clone)]
struct Params {
    addr: String,
    me: MemberInfo,
    token: String,
    config: ClientConfig,
}

async fn handshake(params: &Params) -> Result<Connection, HandshakeError> {
    let attempt = async {
        let stream = TcpStream::connect(&params.addr)
            .await
            .map_err(|e| HandshakeError::Unreachable(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (mut reader, mut writer) = stream.into_split();
        let hello = frame::encode(&ToHead::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            token: params.token.clone(),
            member: params.me.clone(),
        });
        writer
            .write_all(&hello)
            .await
            .map_err(|e| HandshakeError::Unreachable(e.to_string()))?;
        let mut buf = Vec::new();
        match frame::read::<ToNode, _>(&mut reader, &mut buf).await {
            Ok(Some(ToNode::Welcome { .. })) => Ok(Connection { reader, writer }),
            Ok(Some(ToNode::Refused { reason, retryable })) => {
                Err(HandshakeError::Refused { reason, retryable })
            }
            Ok(Some(other)) => Err(HandshakeError::Unreachable(format!(
                "unexpected first frame from the head: {other:?}"
            ))),
            Ok(None) => Err(HandshakeError::Unreachable(
                "the head closed the connection during the hello".into(),
            )),
            Err(error) => Err(HandshakeError::Unreachable(format!(
                "bad hello answer: {error}"
            ))),
        }
    };
    match timeout(params.config.connect_timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(HandshakeError::Unreachable(format!(
            "no answer within {} ms",
            params.config.connect_timeout.as_millis()
        ))),
    }
}

/// Joins the built-in directory served at `addr` (`HOST:PORT` of the head daemon). Fails if
/// the head cannot be reached or refuses this node; afterwards the connection is kept up in
/// the background (reconnecting with backoff) and reported through `notices`.
pub async fn connect(
    addr: &str,
    me: MemberInfo,
    token: &str,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
    config: ClientConfig,
) -> Result<BuiltinDirectory, DirectoryError> {
    let params = Params {
        addr: addr.to_string(),
        me,
        token: token.to_string(),
        config,
    };
    let deadline = Instant::now() + params.config.join_timeout;
    let mut waiting_logged = false;
    let connection = loop {
        match handshake(&params).await {
            Ok(connection) => break connection,
            Err(HandshakeError::Unreachable(reason)) => {
                return Err(DirectoryError::Unreachable {
                    addr: addr.to_string(),
                    reason,
                })
            }
            Err(HandshakeError::Refused { reason, retryable }) => {
                if !retryable || Instant::now() >= deadline {
                    return Err(DirectoryError::Refused(reason));
                }
                // Once, not at every retry: the outcome comes when the wait ends.
                if !waiting_logged {
                    waiting_logged = true;
                    tracing::info!(
                        %reason,
                        "the head refused this node for now; retrying for up to {} ms",
                        params.config.join_timeout.as_millis()
                    );
                }
                tokio::time::sleep(params.config.reconnect_backoff_min).await;
            }
        }
    };
    let _ = notices.send(DirectoryNotice::Health(Ok(())));
    let description = format!("built-in directory at {addr} ({})", params.me.node);
    let (commands, command_rx) = mpsc::channel(MAX_IN_FLIGHT_PER_NODE);
    let client = Client {
        params,
        notices: notices.clone(),
        publications: HashMap::new(),
        subscriptions: HashSet::new(),
        in_flight: HashMap::new(),
        next_wire_op: 0,
    };
    tokio::spawn(client.run(connection, command_rx));
    Ok(BuiltinDirectory {
        queue: RequestQueue { commands, notices },
        description,
    })
}

/// Who a request on the wire is for.
enum Origin {
    /// The driver's request; `subscribe_to` is the object of a `Lookup` with `subscribe` (until
    /// an `Unsubscribe` for it is submitted).
    Driver {
        op: DirectoryOpId,
        subscribe_to: Option<ObjectId>,
    },
    /// A publication re-sent after reconnecting.
    Republish,
    /// A subscription re-registered after reconnecting.
    Resubscribe(ObjectId),
}

/// Why a connection's session ended.
enum Ended {
    /// The driver dropped the directory.
    Closed,
    /// The connection was lost; reconnect.
    Lost(String),
}

/// The background task of one node's directory client.
struct Client {
    params: Params,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
    /// What this node holds, as the driver last said: re-published after reconnecting.
    publications: HashMap<ObjectId, ObjectSizes>,
    /// Subscriptions the head holds for this node (or will, after reconnecting).
    subscriptions: HashSet<ObjectId>,
    in_flight: HashMap<u64, Origin>,
    next_wire_op: u64,
}

impl Client {
    fn notice(&self, notice: DirectoryNotice) {
        // The driver stopped listening: nothing to do, the task ends with its commands.
        let _ = self.notices.send(notice);
    }

    fn reply(&self, op: DirectoryOpId, reply: DirectoryReply) {
        self.notice(DirectoryNotice::Reply { op, reply });
    }

    async fn run(
        mut self,
        connection: Connection,
        mut commands: mpsc::Receiver<(DirectoryOpId, DirectoryRequest)>,
    ) {
        let mut connection = Some(connection);
        let mut backoff = self.params.config.reconnect_backoff_min;
        let mut down_reason = String::new();
        loop {
            if let Some(c) = connection.take() {
                match self.serve(c, &mut commands).await {
                    Ended::Closed => return,
                    Ended::Lost(reason) => {
                        tracing::warn!(%reason, "lost the built-in directory");
                        down_reason = format!("directory connection lost: {reason}");
                        for origin in std::mem::take(&mut self.in_flight).into_values() {
                            if let Origin::Driver { op, .. } = origin {
                                self.reply(
                                    op,
                                    DirectoryReply::Unavailable {
                                        reason: down_reason.clone(),
                                    },
                                );
                            }
                        }
                        self.notice(DirectoryNotice::Health(Err(down_reason.clone())));
                        backoff = self.params.config.reconnect_backoff_min;
                    }
                }
            }
            let params = self.params.clone();
            let wait = backoff;
            let attempt = async move {
                tokio::time::sleep(wait).await;
                handshake(&params).await
            };
            tokio::pin!(attempt);
            loop {
                tokio::select! {
                    result = &mut attempt => {
                        match result {
                            Ok(c) => {
                                tracing::info!("reconnected to the built-in directory");
                                self.notice(DirectoryNotice::Health(Ok(())));
                                connection = Some(c);
                            }
                            Err(HandshakeError::Unreachable(reason))
                            | Err(HandshakeError::Refused { reason, .. }) => {
                                tracing::debug!(%reason, "directory reconnection failed");
                                down_reason = format!("directory unreachable: {reason}");
                                backoff = (backoff * 2).min(self.params.config.reconnect_backoff_max);
                            }
                        }
                        break;
                    }
                    command = commands.recv() => match command {
                        None => return,
                        Some((op, request)) => self.submit_while_down(op, request, &down_reason),
                    },
                }
            }
        }
    }

    fn submit_while_down(&mut self, op: DirectoryOpId, request: DirectoryRequest, reason: &str) {
        let needs_reply = remember_while_down(
            &mut self.publications,
            &mut self.subscriptions,
            request,
            MAX_PUBLICATIONS_PER_NODE,
        );
        if needs_reply {
            self.reply(
                op,
                DirectoryReply::Unavailable {
                    reason: reason.to_string(),
                },
            );
        }
    }

    /// Serves one connection until it is lost or the driver goes away.
    async fn serve(
        &mut self,
        connection: Connection,
        commands: &mut mpsc::Receiver<(DirectoryOpId, DirectoryRequest)>,
    ) -> Ended {
        // Both queues hold at most what this node has in flight (requests are capped) plus
        // pushed events and member lists, so they need no bound of their own.
        let (out, out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let (in_tx, mut incoming) = mpsc::unbounded_channel::<Result<ToNode, String>>();
        let writer = tokio::spawn(write_to_head(connection.writer, out_rx));
        let reader = tokio::spawn(read_from_head(connection.reader, in_tx));
        let _stop_reader = AbortOnDrop(reader);

        // Re-register what the head may not know (all of it after a head restart).
        let republish: Vec<(ObjectId, ObjectSizes)> =
            self.publications.iter().map(|(i, s)| (*i, *s)).collect();
        for (id, sizes) in republish {
            self.send(
                &out,
                Some(Origin::Republish),
                DirectoryRequest::Publish { id, sizes },
            );
        }
        let resubscribe: Vec<ObjectId> = self.subscriptions.iter().copied().collect();
        for id in resubscribe {
            self.send(
                &out,
                Some(Origin::Resubscribe(id)),
                DirectoryRequest::Lookup {
                    id,
                    subscribe: true,
                },
            );
        }

        let heartbeat_timeout = self.params.config.heartbeat_timeout;
        let mut ticker = tokio::time::interval(self.params.config.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        let mut ping_seq = 0u64;
        let ended = loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None => break Ended::Closed,
                    Some((op, request)) => self.submit(&out, op, request),
                },
                message = incoming.recv() => match message {
                    None => break Ended::Lost("the reader stopped".into()),
                    Some(Err(reason)) => break Ended::Lost(reason),
                    Some(Ok(message)) => {
                        last_heard = Instant::now();
                        if let Err(reason) = self.receive(message) {
                            break Ended::Lost(reason);
                        }
                    }
                },
                _ = ticker.tick() => {
                    if last_heard.elapsed() > heartbeat_timeout {
                        break Ended::Lost(format!(
                            "the head was silent for {} ms",
                            heartbeat_timeout.as_millis()
                        ));
                    }
                    ping_seq += 1;
                    let _ = out.send(frame::encode(&ToHead::Ping { seq: ping_seq }));
                }
            }
        };
        drop(out);
        match ended {
            // Let the writer flush and close, so the head sees this node leave at once.
            Ended::Closed => {
                let _ = timeout(Duration::from_secs(1), writer).await;
            }
            Ended::Lost(_) => writer.abort(),
        }
        ended
    }

    /// Sends `request`; `origin` is where its reply goes (`None` for `Unsubscribe`, which has
    /// no reply).
    fn send(
        &mut self,
        out: &mpsc::UnboundedSender<Vec<u8>>,
        origin: Option<Origin>,
        request: DirectoryRequest,
    ) {
        let op = self.next_wire_op;
        self.next_wire_op += 1;
        if let Some(origin) = origin {
            self.in_flight.insert(op, origin);
        }
        // A closed writer shows up as a lost connection through the reader.
        let _ = out.send(frame::encode(&ToHead::Request { op, request }));
    }

    fn submit(
        &mut self,
        out: &mpsc::UnboundedSender<Vec<u8>>,
        op: DirectoryOpId,
        request: DirectoryRequest,
    ) {
        if let DirectoryRequest::Unsubscribe { id } = request {
            self.subscriptions.remove(&id);
            for origin in self.in_flight.values_mut() {
                if let Origin::Driver { subscribe_to, .. } = origin {
                    if *subscribe_to == Some(id) {
                        *subscribe_to = None;
                    }
                }
            }
            self.send(out, None, request);
            return;
        }
        if self.in_flight.len() >= MAX_IN_FLIGHT_PER_NODE {
            self.reply(
                op,
                DirectoryReply::Unavailable {
                    reason: format!("{MAX_IN_FLIGHT_PER_NODE} directory requests in flight"),
                },
            );
            return;
        }
        let mut subscribe_to = None;
        match request {
            DirectoryRequest::Lookup { id, subscribe } => {
                subscribe_to = subscribe.then_some(id);
            }
            DirectoryRequest::Publish { id, sizes } => {
                if self.publications.len() >= MAX_PUBLICATIONS_PER_NODE
                    && !self.publications.contains_key(&id)
                {
                    self.reply(
                        op,
                        DirectoryReply::Unavailable {
                            reason: format!("{MAX_PUBLICATIONS_PER_NODE} objects published, the most the directory keeps"),
                        },
                    );
                    return;
                }
                self.publications.insert(id, sizes);
            }
            DirectoryRequest::Withdraw { id } => {
                self.publications.remove(&id);
            }
            DirectoryRequest::Unsubscribe { .. } => {}
        }
        self.send(out, Some(Origin::Driver { op, subscribe_to }), request);
    }

    /// Handles one frame from the head; `Err` ends the connection.
    fn receive(&mut self, message: ToNode) -> Result<(), String> {
        match message {
            ToNode::Reply { op, reply } => match self.in_flight.remove(&op) {
                Some(Origin::Driver { op, subscribe_to }) => {
                    if let (Some(id), DirectoryReply::Located { holders, .. }) =
                        (subscribe_to, &reply)
                    {
                        if holders.is_empty() {
                            self.subscriptions.insert(id);
                        }
                    }
                    self.reply(op, reply);
                }
                Some(Origin::Resubscribe(id)) => {
                    let found = match &reply {
                        DirectoryReply::Located {
                            holders,
                            sizes: Some(sizes),
                        } => holders.first().map(|holder| (*holder, *sizes)),
                        DirectoryReply::Unavailable { reason } => {
                            tracing::warn!(%id, %reason, "could not re-register a subscription");
                            None
                        }
                        _ => None,
                    };
                    // Published while this node was away: the subscription fires now.
                    if let Some((holder, sizes)) = found {
                        if self.subscriptions.remove(&id) {
                            self.notice(DirectoryNotice::Event(DirectoryEvent::Published {
                                id,
                                holder,
                                sizes,
                            }));
                        }
                    }
                }
                Some(Origin::Republish) => {
                    if let DirectoryReply::Unavailable { reason } = reply {
                        tracing::warn!(%reason, "could not re-publish an object");
                    }
                }
                None => return Err(format!("the head answered unknown op {op}")),
            },
            ToNode::Event(event) => {
                let DirectoryEvent::Published { id, .. } = &event;
                self.subscriptions.remove(id);
                self.notice(DirectoryNotice::Event(event));
            }
            ToNode::Members(members) => self.notice(DirectoryNotice::Members(members)),
            ToNode::Pong { .. } => {}
            ToNode::Refused { reason, .. } => {
                return Err(format!("the head dropped this node: {reason}"))
            }
            ToNode::Welcome { .. } => return Err("a second welcome from the head".into()),
        }
        Ok(())
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn write_to_head(writer: OwnedWriteHalf, mut frames: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut writer = BufWriter::new(writer);
    while let Some(frame) = frames.recv().await {
        if writer.write_all(&frame).await.is_err() {
            return;
        }
        if frames.is_empty() && writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_from_head(
    mut reader: OwnedReadHalf,
    incoming: mpsc::UnboundedSender<Result<ToNode, String>>,
) {
    let mut buf = Vec::new();
    loop {
        let result = match frame::read::<ToNode, _>(&mut reader, &mut buf).await {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err("the head closed the connection".to_string()),
            Err(error) => Err(error.to_string()),
        };
        let last = result.is_err();
        if incoming.send(result).is_err() || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_is_kept_inline() {
        let mut holders = Holders::new();
        holders.push((
            NodeId(3),
            ObjectSizes {
                data_size: 1,
                metadata_size: 0,
            },
        ));
        assert!(!holders.spilled());
        // Key and holders of one object in the head's table.
        assert!(std::mem::size_of::<(ObjectId, Holders)>() <= 56);
    }
}
