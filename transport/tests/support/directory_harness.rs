//! The implementations the directory conformance suite runs against: the core's `Registry`
//! in process (virtual time), the built-in head over loopback TCP, and Redis. Each is a
//! [`Harness`] that joins, crashes and waits out heartbeats, with [`Participant`] nodes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use skyriver_core::directory::{
    DirectoryEvent, DirectoryNotice, DirectoryOpId, DirectoryReply, DirectoryRequest, MemberInfo,
};
use skyriver_core::registry::session::{
    DirectorySession, SessionConfig, SessionError, SessionOutput,
};
use skyriver_core::registry::{ConnId, Registry, RegistryConfig, RegistryOutput};
use skyriver_core::{ContentDigest, Instant, NodeId, ObjectId, ObjectSizes};
use skyriver_transport::directory::builtin::{
    self, BuiltinDirectoryServer, ClientConfig, ServerConfig,
};
use skyriver_transport::directory::redis::{self, RedisConfig};
use skyriver_transport::directory::{
    notice_channel, Directory, DirectoryClient, DirectoryError, NoticeReceiver,
};
use tokio::net::TcpListener;

use super::redis_cluster::RedisCluster;
use super::redis_server::RedisServer;

/// The cluster token every harness uses.
pub const TOKEN: &str = "conformance-token";
/// Bound on every wait on a real backend.
const WAIT: Duration = Duration::from_secs(10);

/// Why a node of a harness did not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The in-process registry turned the session away; the reason is the registry's own text
    /// (it crosses to the session as a string, as over the wire).
    #[error("the directory refused this node: {0}")]
    Refused(String),
    /// The in-process session was neither welcomed nor refused.
    #[error("not welcomed")]
    NotWelcomed,
    /// A real backend did not let the node join.
    #[error(transparent)]
    Backend(#[from] DirectoryError),
}

impl JoinError {
    /// The directory's reason, when it refused the node (rather than being unreachable).
    pub fn refusal(&self) -> Option<&str> {
        match self {
            JoinError::Refused(reason) | JoinError::Backend(DirectoryError::Refused(reason)) => {
                Some(reason)
            }
            _ => None,
        }
    }
}

/// A directory under test.
pub trait Harness {
    type Node: Participant;
    /// Joins as `member` presenting `token`; `Err` with why not.
    async fn join_as(&mut self, member: MemberInfo, token: &str) -> Result<Self::Node, JoinError>;
    /// Joins as `member` with the cluster's token; panics when refused.
    async fn join(&mut self, member: MemberInfo) -> Self::Node {
        let node = member.node;
        match self.join_as(member, TOKEN).await {
            Ok(joined) => joined,
            Err(reason) => panic!("{node} was refused: {reason}"),
        }
    }
    /// Joins a node that never sends heartbeats.
    async fn join_silent(&mut self, member: MemberInfo) -> Self::Node;
    /// The node's process dies: no goodbye.
    async fn crash(&mut self, node: Self::Node);
    /// The node's daemon stops cleanly: it says goodbye, and the directory forgets it at once.
    async fn leave(&mut self, node: Self::Node);
    /// Lets the heartbeat bound pass (with margin) while `live` nodes keep heartbeating.
    async fn outlive_heartbeat_bound(&mut self, live: &mut [&mut Self::Node]);
}

/// One node of a directory under test.
pub trait Participant {
    /// Submits `request` without waiting.
    fn submit(&mut self, op: DirectoryOpId, request: DirectoryRequest);
    /// Submits `request` and waits for its reply.
    async fn ask(&mut self, request: DirectoryRequest) -> DirectoryReply;
    /// Waits for the next event.
    async fn next_event(&mut self) -> DirectoryEvent;
    /// Every event that reaches this node before a marker: it subscribes to `marker` (an id
    /// nobody published), `publisher` publishes it, and the events that come before the
    /// marker's are returned. The directory pushes to one node in the order it served the
    /// requests that caused the pushes, so a push owed for any request answered before this
    /// call comes before the marker: no quiet period to wait out.
    async fn events_before_marker(
        &mut self,
        publisher: &mut Self,
        marker: ObjectId,
    ) -> Vec<DirectoryEvent>
    where
        Self: Sized,
    {
        let sizes = ObjectSizes {
            data_size: 1,
            metadata_size: 0,
        };
        let digest = ContentDigest(0x6d61726b);
        let subscribed = self
            .ask(DirectoryRequest::Lookup {
                id: marker,
                subscribe: true,
            })
            .await;
        assert!(
            matches!(&subscribed, DirectoryReply::Located { holders, .. } if holders.is_empty()),
            "the marker {marker} is held already: {subscribed:?}"
        );
        let published = publisher
            .ask(DirectoryRequest::Publish {
                id: marker,
                sizes,
                digest,
            })
            .await;
        assert_eq!(
            published,
            DirectoryReply::Done,
            "publishing the marker {marker}"
        );
        let mut before = Vec::new();
        loop {
            match self.next_event().await {
                DirectoryEvent::Published { id, .. } if id == marker => return before,
                event => before.push(event),
            }
        }
    }
    /// Waits until the member list is exactly `want`.
    async fn wait_members(&mut self, want: &[MemberInfo]);
}

/// A directory whose connections can fail: the faults the differential test injects.
#[allow(dead_code)] // Used by the differential test, not by every binary sharing this file.
pub trait Faults: Harness {
    /// The node's connections to the directory are cut (the node's process lives on); returns
    /// once its session noticed, reconnected with the same incarnation and replayed (its
    /// `Health(Ok)`).
    async fn blip(&mut self, node: &mut Self::Node);
    /// The directory restarts and forgets everything; returns once every one of `nodes`
    /// reconnected and replayed.
    async fn restart_directory(&mut self, nodes: &mut [&mut Self::Node]);
}

/// Whether `notice` is a health notice.
fn is_health(notice: &DirectoryNotice) -> bool {
    matches!(notice, DirectoryNotice::Health(_))
}

// ---- The core registry, in process ----

struct CoreNode {
    node: NodeId,
    conn: ConnId,
    session: DirectorySession,
    silent: bool,
    notices: VecDeque<DirectoryNotice>,
    refusal: Option<String>,
    members: Vec<MemberInfo>,
}

struct CoreWorld {
    registry: Registry,
    config: RegistryConfig,
    now: Instant,
    next_conn: u64,
    nodes: BTreeMap<NodeId, CoreNode>,
}

impl CoreWorld {
    /// Carries messages between the sessions and the registry until both are quiet.
    fn pump(&mut self) {
        loop {
            let mut progressed = false;
            let now = self.now;
            for node in self.nodes.values_mut() {
                while let Some(output) = node.session.poll_output() {
                    progressed = true;
                    match output {
                        SessionOutput::Connect => {
                            self.next_conn += 1;
                            node.conn = ConnId(self.next_conn);
                            node.session.handle_connected(now);
                        }
                        SessionOutput::Send(message) => {
                            let _ = self.registry.handle_message(now, node.conn, message);
                        }
                        SessionOutput::Notice(notice) => {
                            if let DirectoryNotice::Members(members) = &notice {
                                node.members = members.to_vec();
                            }
                            node.notices.push_back(notice);
                        }
                        SessionOutput::Disconnect { .. } => {
                            self.registry.handle_disconnect(now, node.conn)
                        }
                    }
                }
            }
            while let Some(output) = self.registry.poll_output() {
                progressed = true;
                let mut deliver = |conn: ConnId, message| {
                    if let Some(node) = self.nodes.values_mut().find(|n| n.conn == conn) {
                        if let Err(SessionError::Refused { reason, .. }) =
                            node.session.handle_message(now, message)
                        {
                            node.refusal = Some(reason);
                        }
                    }
                };
                match output {
                    RegistryOutput::Send { conn, message } => deliver(conn, message),
                    RegistryOutput::SendMembers {
                        conns,
                        members,
                        epoch,
                    } => {
                        for conn in conns {
                            let members = members.clone();
                            deliver(
                                conn,
                                skyriver_core::registry::FromRegistry::Members { epoch, members },
                            );
                        }
                    }
                    RegistryOutput::Close { conn, reason } => {
                        if let Some(node) = self.nodes.values_mut().find(|n| n.conn == conn) {
                            node.session.handle_disconnected(now, &reason);
                        }
                    }
                }
            }
            self.registry.check_invariants();
            if !progressed {
                return;
            }
        }
    }

    /// The sessions of `nodes` lose their connections (`registry_knows`: the registry notices
    /// too; a restarted one never knew them); then time passes until each reconnected and
    /// replayed (bounded).
    fn cut(&mut self, nodes: &[NodeId], registry_knows: bool) {
        let now = self.now;
        for node in nodes {
            let n = self.nodes.get_mut(node).expect("a member");
            n.notices.retain(|n| !is_health(n));
            let conn = n.conn;
            n.session.handle_disconnected(now, "cut");
            if registry_knows {
                self.registry.handle_disconnect(now, conn);
            }
        }
        self.pump();
        let replayed = |world: &Self| {
            nodes.iter().all(|node| {
                world.nodes[node]
                    .notices
                    .iter()
                    .any(|n| matches!(n, DirectoryNotice::Health(Ok(()))))
            })
        };
        for _ in 0..1000 {
            if replayed(self) {
                break;
            }
            self.advance(Duration::from_millis(5));
        }
        assert!(replayed(self), "{nodes:?} did not reconnect in process");
        for node in nodes {
            let n = self.nodes.get_mut(node).expect("a member");
            n.notices.retain(|n| !is_health(n));
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now + by;
        let now = self.now;
        self.registry.handle_timeout(now);
        for node in self.nodes.values_mut().filter(|n| !n.silent) {
            node.session.handle_timeout(now);
        }
        self.pump();
    }
}

#[derive(Clone)]
pub struct CoreHarness {
    world: Rc<RefCell<CoreWorld>>,
}

impl CoreHarness {
    pub fn new() -> Self {
        Self::with_grace(None)
    }

    /// A registry with no grace period for returning nodes, as Redis (which keeps no state of
    /// its own to protect): one a node's session reconnects to judges its replay at once. (A
    /// young registry otherwise takes a returning node for a sign that it restarted and holds
    /// new ids' publications back; the in-process world stays young, its clock moves only when
    /// a step waits out time.)
    #[allow(dead_code)] // Used by the differential test, not by every binary sharing this file.
    pub fn without_grace() -> Self {
        Self::with_grace(Some(Duration::ZERO))
    }

    fn with_grace(grace: Option<Duration>) -> Self {
        let mut config = RegistryConfig::new(TOKEN, [1; 32]);
        config.heartbeat_timeout = Duration::from_millis(100);
        let mut registry = Registry::new(config.clone());
        if let Some(grace) = grace {
            registry.set_restart_grace(grace);
        }
        Self {
            world: Rc::new(RefCell::new(CoreWorld {
                registry,
                config,
                now: Instant(1),
                next_conn: 0,
                nodes: BTreeMap::new(),
            })),
        }
    }

    fn add(
        &mut self,
        me: MemberInfo,
        token: &str,
        silent: bool,
    ) -> Result<CoreParticipant, JoinError> {
        let config = SessionConfig {
            heartbeat_interval: Duration::from_millis(10),
            heartbeat_timeout: Duration::from_secs(3600),
            ..SessionConfig::default()
        };
        let mut world = self.world.borrow_mut();
        let now = world.now;
        let node = me.node;
        let mut session = DirectorySession::new(config, me, token.into(), [node.0 as u8; 32], now);
        session.handle_timeout(now);
        world.nodes.insert(
            node,
            CoreNode {
                node,
                conn: ConnId(0),
                session,
                silent,
                notices: VecDeque::new(),
                refusal: None,
                members: Vec::new(),
            },
        );
        world.pump();
        let joined = world.nodes[&node].session.is_up();
        if !joined {
            let removed = world.nodes.remove(&node).expect("just added");
            return Err(removed
                .refusal
                .map_or(JoinError::NotWelcomed, JoinError::Refused));
        }
        Ok(CoreParticipant {
            node,
            world: self.world.clone(),
            next_op: 0,
        })
    }
}

pub struct CoreParticipant {
    node: NodeId,
    world: Rc<RefCell<CoreWorld>>,
    next_op: u64,
}

impl CoreParticipant {
    /// The first notice `pick` accepts, taken out of the queue; the others stay, in order (more
    /// events than one can be queued: a later call takes the next).
    fn take(&mut self, pick: impl FnMut(&DirectoryNotice) -> bool) -> Option<DirectoryNotice> {
        let mut world = self.world.borrow_mut();
        world.pump();
        let node = world.nodes.get_mut(&self.node).expect("a member");
        let at = node.notices.iter().position(pick)?;
        node.notices.remove(at)
    }
}

impl Harness for CoreHarness {
    type Node = CoreParticipant;

    async fn join_as(
        &mut self,
        member: MemberInfo,
        token: &str,
    ) -> Result<CoreParticipant, JoinError> {
        self.add(member, token, false)
    }

    async fn join_silent(&mut self, member: MemberInfo) -> CoreParticipant {
        self.add(member, TOKEN, true).expect("joins")
    }

    async fn crash(&mut self, node: CoreParticipant) {
        // Gone without a word: the registry hears nothing.
        self.world.borrow_mut().nodes.remove(&node.node);
    }

    async fn leave(&mut self, node: CoreParticipant) {
        let mut world = self.world.borrow_mut();
        let now = world.now;
        world
            .nodes
            .get_mut(&node.node)
            .expect("a member")
            .session
            .handle_leave(now);
        // The goodbye reaches the registry; then the process is gone.
        world.pump();
        world.nodes.remove(&node.node);
        world.pump();
    }

    async fn outlive_heartbeat_bound(&mut self, _live: &mut [&mut CoreParticipant]) {
        let mut world = self.world.borrow_mut();
        let bound = world.registry.config().heartbeat_timeout;
        let silent: Vec<NodeId> = world
            .nodes
            .values()
            .filter(|n| n.silent)
            .map(|n| n.node)
            .collect();
        // Step by step: the registry must have dropped the silent nodes by the bound, exactly.
        for _ in 0..bound.as_millis() / 5 {
            world.advance(Duration::from_millis(5));
        }
        for node in silent {
            assert!(
                world.registry.member(node).is_none(),
                "{node} outlived the heartbeat bound"
            );
        }
    }
}

impl Faults for CoreHarness {
    async fn blip(&mut self, node: &mut CoreParticipant) {
        // The registry sees the connection close (the member goes, as a crashed one would);
        // the session reconnects with the same incarnation and replays.
        self.world.borrow_mut().cut(&[node.node], true);
    }

    async fn restart_directory(&mut self, nodes: &mut [&mut CoreParticipant]) {
        let mut world = self.world.borrow_mut();
        // A registry that starts empty and judges every replay at once, as Redis restarted
        // without persistence does (no grace period: Redis takes a replay as a publication).
        let mut registry = Registry::new(world.config.clone());
        registry.set_restart_grace(Duration::ZERO);
        world.registry = registry;
        let nodes: Vec<NodeId> = nodes.iter().map(|n| n.node).collect();
        world.cut(&nodes, false);
    }
}

impl Participant for CoreParticipant {
    fn submit(&mut self, op: DirectoryOpId, request: DirectoryRequest) {
        let mut world = self.world.borrow_mut();
        let now = world.now;
        world
            .nodes
            .get_mut(&self.node)
            .expect("a member")
            .session
            .handle_submit(now, op, request);
        world.pump();
    }

    async fn ask(&mut self, request: DirectoryRequest) -> DirectoryReply {
        self.next_op += 1;
        let op = DirectoryOpId(self.next_op);
        self.submit(op, request);
        match self.take(|n| matches!(n, DirectoryNotice::Reply { op: o, .. } if *o == op)) {
            Some(DirectoryNotice::Reply { reply, .. }) => reply,
            other => panic!("no reply in process: {other:?}"),
        }
    }

    async fn next_event(&mut self) -> DirectoryEvent {
        match self.take(|n| matches!(n, DirectoryNotice::Event(_))) {
            Some(DirectoryNotice::Event(event)) => event,
            other => panic!("no event in process: {other:?}"),
        }
    }

    async fn wait_members(&mut self, want: &[MemberInfo]) {
        let mut world = self.world.borrow_mut();
        world.pump();
        assert_eq!(world.nodes[&self.node].members, want);
    }
}

// ---- Real backends: the shared client over TCP or Redis ----

pub struct ClientNode {
    node: NodeId,
    dir: DirectoryClient,
    notices: NoticeReceiver,
    next_op: u64,
    /// Notices received while waiting for something else.
    backlog: VecDeque<DirectoryNotice>,
}

impl ClientNode {
    fn new(node: NodeId, dir: DirectoryClient, notices: NoticeReceiver) -> Self {
        Self {
            node,
            dir,
            notices,
            next_op: 0,
            backlog: VecDeque::new(),
        }
    }

    /// Forgets the health notices heard so far (before a fault).
    fn forget_health(&mut self) {
        while let Ok(notice) = self.notices.try_recv() {
            self.backlog.push_back(notice);
        }
        self.backlog.retain(|n| !is_health(n));
    }

    /// Waits until the session lost its connection, reconnected and replayed.
    async fn wait_reconnected(&mut self) {
        let node = self.node;
        self.wait_for(&format!("{node} losing the directory"), |n| match n {
            DirectoryNotice::Health(Err(_)) => Some(()),
            _ => None,
        })
        .await;
        self.wait_for(&format!("{node} reconnected and replayed"), |n| match n {
            DirectoryNotice::Health(Ok(())) => Some(()),
            _ => None,
        })
        .await;
        self.backlog.retain(|n| !is_health(n));
    }

    /// Waits until the latest member list this node heard satisfies `want`; that list stays
    /// the latest one in the backlog (older ones are dropped on the way).
    async fn wait_latest_members(&mut self, what: &str, want: impl Fn(&[MemberInfo]) -> bool) {
        let is_members = |n: &DirectoryNotice| matches!(n, DirectoryNotice::Members(_));
        let latest = self
            .backlog
            .iter()
            .rposition(is_members)
            .and_then(|at| self.backlog.remove(at));
        self.backlog.retain(|n| !is_members(n));
        let found = match latest {
            Some(DirectoryNotice::Members(m)) if want(&m) => m,
            _ => {
                self.wait_for(what, |n| match n {
                    DirectoryNotice::Members(m) if want(m) => Some(m.clone()),
                    _ => None,
                })
                .await
            }
        };
        self.backlog.retain(|n| !is_members(n));
        self.backlog.push_back(DirectoryNotice::Members(found));
    }

    async fn wait_for<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&DirectoryNotice) -> Option<T>,
    ) -> T {
        if let Some(at) = self.backlog.iter().position(|n| pick(n).is_some()) {
            let notice = self.backlog.remove(at).expect("found");
            return pick(&notice).expect("picked");
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.notices.recv()).await {
                Ok(Some(notice)) => match pick(&notice) {
                    Some(found) => return found,
                    None => self.backlog.push_back(notice),
                },
                Ok(None) => panic!("notices closed waiting for {what}"),
                Err(_) => panic!("timed out waiting for {what}; got {:?}", self.backlog),
            }
        }
    }
}

impl Participant for ClientNode {
    fn submit(&mut self, op: DirectoryOpId, request: DirectoryRequest) {
        self.dir.submit(op, request).expect("queued");
    }

    async fn ask(&mut self, request: DirectoryRequest) -> DirectoryReply {
        self.next_op += 1;
        let op = DirectoryOpId(self.next_op);
        self.dir.submit(op, request.clone()).expect("queued");
        self.wait_for(&format!("the reply to {request}"), |n| match n {
            DirectoryNotice::Reply { op: o, reply } if *o == op => Some(reply.clone()),
            _ => None,
        })
        .await
    }

    async fn next_event(&mut self) -> DirectoryEvent {
        self.wait_for("an event", |n| match n {
            DirectoryNotice::Event(e) => Some(e.clone()),
            _ => None,
        })
        .await
    }

    async fn wait_members(&mut self, want: &[MemberInfo]) {
        self.wait_latest_members(&format!("members {want:?}"), |m| m == want)
            .await;
    }
}

pub struct BuiltinHarness {
    server: BuiltinDirectoryServer,
}

impl BuiltinHarness {
    /// A head with a 300 ms heartbeat timeout on a loopback port.
    pub async fn new() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut config = ServerConfig::new(TOKEN);
        config.heartbeat_timeout = Duration::from_millis(300);
        let server = BuiltinDirectoryServer::spawn(listener, config).unwrap();
        Self { server }
    }

    fn client_config(silent: bool) -> ClientConfig {
        ClientConfig {
            heartbeat_interval: if silent {
                Duration::from_secs(3600)
            } else {
                Duration::from_millis(50)
            },
            heartbeat_timeout: if silent {
                Duration::from_secs(3600)
            } else {
                Duration::from_secs(1)
            },
            connect_timeout: Duration::from_secs(2),
            join_timeout: Duration::from_millis(200),
            // Once dropped by the head, a silent node stays away: it stands for a dead one.
            reconnect_backoff_min: if silent {
                Duration::from_secs(3600)
            } else {
                Duration::from_millis(20)
            },
            reconnect_backoff_max: if silent {
                Duration::from_secs(3600)
            } else {
                Duration::from_millis(200)
            },
            member_lists: true,
            learn_locations: false,
        }
    }

    async fn open(
        &self,
        me: MemberInfo,
        token: &str,
        silent: bool,
    ) -> Result<ClientNode, JoinError> {
        let node = me.node;
        let (tx, rx) = notice_channel();
        let addr = self.server.local_addr().to_string();
        let dir =
            builtin::connect(&addr, me, &token.into(), tx, Self::client_config(silent)).await?;
        Ok(ClientNode::new(node, dir, rx))
    }
}

impl Harness for BuiltinHarness {
    type Node = ClientNode;

    async fn join_as(&mut self, member: MemberInfo, token: &str) -> Result<ClientNode, JoinError> {
        self.open(member, token, false).await
    }

    async fn join_silent(&mut self, member: MemberInfo) -> ClientNode {
        self.open(member, TOKEN, true).await.expect("joins")
    }

    async fn crash(&mut self, node: ClientNode) {
        node.dir.abandon().await;
    }

    async fn leave(&mut self, node: ClientNode) {
        node.dir.leave().await;
    }

    async fn outlive_heartbeat_bound(&mut self, live: &mut [&mut ClientNode]) {
        see_only_each_other(live).await;
    }
}

pub struct RedisHarness {
    /// The private Redis.
    pub server: RedisServer,
}

impl RedisHarness {
    fn config(&self, silent: bool) -> RedisConfig {
        redis_config(self.server.url(), silent)
    }

    async fn open(
        &self,
        me: MemberInfo,
        token: &str,
        silent: bool,
    ) -> Result<ClientNode, JoinError> {
        open_redis(self.config(silent), me, token).await
    }
}

/// The conformance settings of a Redis node (a silent one stands for a dead node).
fn redis_config(url: String, silent: bool) -> RedisConfig {
    redis_config_named(url, "conformance", silent)
}

/// [`redis_config`] for the Skyriver cluster `name`.
fn redis_config_named(url: String, name: &str, silent: bool) -> RedisConfig {
    {
        let mut config = RedisConfig::new(url, name);
        config.request_timeout = Duration::from_millis(500);
        config.connect_timeout = Duration::from_millis(500);
        config.heartbeat_interval = if silent {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(100)
        };
        config.node_ttl = if silent {
            SILENT_TTL
        } else {
            Duration::from_millis(1000)
        };
        config.member_refresh_interval = Duration::from_millis(100);
        config.join_timeout = Duration::from_millis(300);
        config.reconnect_backoff_min = Duration::from_millis(20);
        config.reconnect_backoff_max = Duration::from_millis(200);
        config
    }
}

async fn open_redis(
    config: RedisConfig,
    me: MemberInfo,
    token: &str,
) -> Result<ClientNode, JoinError> {
    let node = me.node;
    // A connection the server reset or refused is tried again for a while, as a daemon's
    // --join-timeout does: a Redis just restarted by the previous sequence, on a loaded
    // machine, can drop a first connection. Refusals (credentials, token) end at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (tx, rx) = notice_channel();
        match redis::connect(config.clone(), me.clone(), &token.into(), tx).await {
            Ok(dir) => return Ok(ClientNode::new(node, dir, rx)),
            Err(DirectoryError::Unreachable { source, .. })
                if !source.is_redis_auth() && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

impl Harness for RedisHarness {
    type Node = ClientNode;

    async fn join_as(&mut self, member: MemberInfo, token: &str) -> Result<ClientNode, JoinError> {
        self.open(member, token, false).await
    }

    async fn join_silent(&mut self, member: MemberInfo) -> ClientNode {
        self.open(member, TOKEN, true).await.expect("joins")
    }

    async fn crash(&mut self, node: ClientNode) {
        node.dir.abandon().await;
    }

    async fn leave(&mut self, node: ClientNode) {
        node.dir.leave().await;
    }

    async fn outlive_heartbeat_bound(&mut self, live: &mut [&mut ClientNode]) {
        // The silent node's TTL, then a member refresh of the observers.
        see_only_each_other(live).await;
    }
}

/// Redis Cluster (three masters, three replicas) as the directory.
pub struct RedisClusterHarness {
    /// The private cluster.
    pub cluster: RedisCluster,
}

impl Harness for RedisClusterHarness {
    type Node = ClientNode;

    async fn join_as(&mut self, member: MemberInfo, token: &str) -> Result<ClientNode, JoinError> {
        open_redis(redis_config(self.cluster.url(), false), member, token).await
    }

    async fn join_silent(&mut self, member: MemberInfo) -> ClientNode {
        open_redis(redis_config(self.cluster.url(), true), member, TOKEN)
            .await
            .expect("joins")
    }

    async fn crash(&mut self, node: ClientNode) {
        node.dir.abandon().await;
    }

    async fn leave(&mut self, node: ClientNode) {
        node.dir.leave().await;
    }

    async fn outlive_heartbeat_bound(&mut self, live: &mut [&mut ClientNode]) {
        // The silent node's TTL, then a member refresh of the observers.
        see_only_each_other(live).await;
    }
}

/// Redis (one server or a Redis Cluster: its URL) as the directory of the Skyriver cluster
/// `name`: each name has its own keys and channels, so many directories can share one Redis
/// (started once) without flushing it in between. The token record is made at
/// [`redis::KdfCost::TESTING`]: a join costs no Argon2 time worth counting.
///
/// Node N connects as the ACL user [`node_user`]`(N)` (see [`node_users_config`]), so that a
/// blip can cut exactly its connections: `CLIENT KILL USER` on every server.
#[allow(dead_code)] // Used by the differential test, not by every binary sharing this file.
pub struct NamedRedisHarness<'a> {
    /// The directory's URL, without credentials.
    pub url: String,
    pub name: String,
    /// Every server's port (a blip cuts the node's connections on each).
    pub ports: Vec<u16>,
    /// The one server, which [`Faults::restart_directory`] restarts (`None`: Redis Cluster,
    /// which has no such fault here).
    pub server: Option<&'a mut RedisServer>,
}

/// The password of every [`node_user`].
const NODE_PASSWORD: &str = "blip";

/// The ACL user node `node` connects as.
pub fn node_user(node: NodeId) -> String {
    format!("node{}", node.0)
}

/// `redis-server` command-line configuration making the users of nodes 1 to `nodes` (every
/// key, channel and command allowed).
#[allow(dead_code)]
pub fn node_users_config(nodes: u32) -> Vec<String> {
    (1..=nodes)
        .flat_map(|n| {
            [
                "--user".to_string(),
                node_user(NodeId(n)),
                "on".into(),
                format!(">{NODE_PASSWORD}"),
                "~*".into(),
                "&*".into(),
                "+@all".into(),
            ]
        })
        .collect()
}

/// Makes the users of nodes 1 to `nodes` on the running server at `port` (as the default
/// user).
#[allow(dead_code)]
pub fn make_node_users(port: u16, nodes: u32) {
    for n in 1..=nodes {
        let user = node_user(NodeId(n));
        let password = format!(">{NODE_PASSWORD}");
        let reply = redis_cli(
            port,
            &[
                "ACL", "SETUSER", &user, "on", &password, "~*", "&*", "+@all",
            ],
        );
        assert_eq!(reply.trim(), "OK", "ACL SETUSER {user} on port {port}");
    }
}

/// `redis-cli -p PORT ARGS…`'s output; panics when it fails.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("redis-cli runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && !text.starts_with("Could not connect"),
        "redis-cli -p {port} {args:?}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[allow(dead_code)]
impl NamedRedisHarness<'_> {
    fn config(&self, node: NodeId, silent: bool) -> RedisConfig {
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let url = format!("{scheme}://{}:{NODE_PASSWORD}@{rest}", node_user(node));
        let mut config = redis_config_named(url, &self.name, silent);
        config.token_kdf = redis::KdfCost::TESTING;
        config
    }
}

impl Harness for NamedRedisHarness<'_> {
    type Node = ClientNode;

    async fn join_as(&mut self, member: MemberInfo, token: &str) -> Result<ClientNode, JoinError> {
        open_redis(self.config(member.node, false), member, token).await
    }

    async fn join_silent(&mut self, member: MemberInfo) -> ClientNode {
        open_redis(self.config(member.node, true), member, TOKEN)
            .await
            .expect("joins")
    }

    async fn crash(&mut self, node: ClientNode) {
        node.dir.abandon().await;
    }

    async fn leave(&mut self, node: ClientNode) {
        node.dir.leave().await;
    }

    async fn outlive_heartbeat_bound(&mut self, live: &mut [&mut ClientNode]) {
        // The silent node's TTL, then a member refresh of the observers.
        see_only_each_other(live).await;
    }
}

impl Faults for NamedRedisHarness<'_> {
    async fn blip(&mut self, node: &mut ClientNode) {
        node.forget_health();
        let user = node_user(node.node);
        let killed: u64 = self
            .ports
            .iter()
            .map(|&port| {
                let reply = redis_cli(port, &["CLIENT", "KILL", "USER", &user]);
                reply
                    .trim()
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("CLIENT KILL USER {user}: {reply}"))
            })
            .sum();
        assert!(killed > 0, "{user} had no connection to cut");
        node.wait_reconnected().await;
    }

    async fn restart_directory(&mut self, nodes: &mut [&mut ClientNode]) {
        for node in nodes.iter_mut() {
            node.forget_health();
        }
        let server = self.server.as_mut().expect("a restartable Redis server");
        server.stop();
        server.restart();
        for node in nodes.iter_mut() {
            node.wait_reconnected().await;
        }
    }
}

/// Waits (bounded by [`WAIT`]) until each of the `live` nodes lists exactly the `live` nodes
/// as members: every other node, the silent ones, outlived the heartbeat bound.
async fn see_only_each_other(live: &mut [&mut ClientNode]) {
    let nodes: BTreeSet<NodeId> = live.iter().map(|n| n.node).collect();
    for observer in live.iter_mut() {
        observer
            .wait_latest_members(&format!("members {nodes:?} alone"), |m| {
                m.iter().map(|m| m.node).collect::<BTreeSet<_>>() == nodes
            })
            .await;
    }
}

/// The node TTL of a silent node on Redis: long enough that a loaded machine (the Redis
/// Cluster cases start six servers each, several at once) does not expire it mid-scenario.
const SILENT_TTL: Duration = Duration::from_millis(1500);
