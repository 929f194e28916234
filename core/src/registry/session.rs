//! A node's side of the directory, sans-IO: one [`DirectorySession`] per node, across every
//! connection it makes. Both directory backends drive it (the built-in one over TCP frames, the
//! Redis one through an adapter that answers [`ToRegistry`] from Redis), and so does the
//! simulator, so reconnecting, backoff, heartbeats and replay are one piece of code.
//!
//! What it does:
//! - **Connects with backoff**: while down it asks for a connection ([`SessionOutput::Connect`])
//!   at `reconnect_backoff_min`, doubling to `reconnect_backoff_max` after each failure.
//! - **Says hello**, answers the registry's challenge with its proof of the cluster token and
//!   waits for `Welcome`, whose proof must hold too (a refusal, or a registry that cannot prove
//!   the token, ends the attempt). See [`crate::registry`] for the handshake.
//! - **Replays** after every welcome what the registry may have lost (all of it after a head
//!   restart): a `Reclaim` of each object the node holds (a publication a restarted head judges
//!   during its grace period) and a `Lookup` with `subscribe` of each object it waits for; a
//!   replayed lookup that finds a holder fires the subscription locally, so a publication
//!   missed while away (or a push lost with a connection) still reaches the node exactly once.
//!   It also withdraws again each object the node withdrew (or deleted) without a registry's
//!   `Done`, or with one shortly before the connection was lost: a registry that kept its
//!   state across the break (the same daemon reconnecting before its heartbeat bound, a
//!   directory shard's promoted replica, which lacks its master's last writes) still lists the
//!   node as holding it, and would send fetches and repairs to a node that has no copy.
//!   A replayed publication the registry refuses (another content holds the id) is told to the
//!   node ([`DirectoryEvent::ReplayRefused`]), whose copy then stays local.
//! - **Heartbeats**: pings every `heartbeat_interval`; a registry not heard from within
//!   `heartbeat_timeout` is gone ([`SessionOutput::Disconnect`]).
//! - **Answers every request**: while down, or when a connection is lost with requests in
//!   flight, the driver gets `Unavailable` at once, never silence.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::auth::{self, Nonce, NonceSource, Role};
use crate::digest::ContentDigest;
use crate::directory::{
    DirectoryEvent, DirectoryNotice, DirectoryOpId, DirectoryReply, DirectoryRequest, MemberInfo,
    MemberList,
};
use crate::ids::ObjectId;
use crate::sorted_chunks::SortedChunks;
use crate::time::Instant;
use crate::wire::ObjectSizes;

use super::member_changes::apply_member_changes;
use super::wire::{self, FromRegistry, Hello, ToRegistry, WireOpId, HELLO_MAGIC, PROTOCOL_VERSION};

/// How a node's session behaves.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// A ping goes to the registry this often.
    pub heartbeat_interval: Duration,
    /// The registry is gone when not heard from for this long (also bounds the hello).
    pub heartbeat_timeout: Duration,
    /// First delay between connection attempts; doubles up to `reconnect_backoff_max`.
    pub reconnect_backoff_min: Duration,
    /// Longest delay between connection attempts.
    pub reconnect_backoff_max: Duration,
    /// Most objects the node may publish (what is replayed after reconnecting).
    pub max_publications: usize,
    /// Most pending subscriptions of the node.
    pub max_subscriptions: usize,
    /// Most requests in flight; more are answered `Unavailable` at once.
    pub max_in_flight: usize,
    /// Whether the driver is told the member list ([`DirectoryNotice::Members`]). A node needs
    /// it; a load generator standing in for thousands of nodes in one process does not keep
    /// one per session (it would hold N² members).
    pub member_lists: bool,
    /// Ask the registry for the first holder of every object another node publishes
    /// ([`DirectoryEvent::Located`]), to fill the node's location cache.
    pub learn_locations: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            max_publications: 1 << 24,
            max_subscriptions: 65_536,
            max_in_flight: 65_536,
            member_lists: true,
            learn_locations: false,
        }
    }
}

/// What the session asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum SessionOutput {
    /// Open a new connection to the registry, then call
    /// [`DirectorySession::handle_connected`] (or [`DirectorySession::handle_connect_failed`]).
    Connect,
    /// Send `message` on the current connection.
    Send(ToRegistry),
    /// Tell the node's core / daemon.
    Notice(DirectoryNotice),
    /// Close the current connection; the session already counts it as lost.
    Disconnect {
        /// Why, for logs.
        reason: String,
    },
}

/// Why the session dropped a message from the registry (the connection is then lost).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The registry refused this node.
    #[error("the directory refused this node: {reason}")]
    Refused {
        /// Why.
        reason: String,
        /// Trying again shortly may succeed.
        retryable: bool,
    },
    /// The registry broke the protocol.
    #[error("directory protocol violation: {0}")]
    Protocol(String),
    /// A message arrived with no connection up.
    #[error("a message arrived while not connected")]
    NotConnected,
    /// The welcome's proof does not hold: whoever answered does not know the cluster token.
    #[error(
        "the directory could not prove the cluster token: something other than this \
         cluster's head answers at its address, or the head has another token"
    )]
    Unproven,
}

/// Who a request on the wire is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The driver's request; `subscribe_to` is the object of a `Lookup` with `subscribe` (until
    /// an `Unsubscribe` for it is submitted).
    Driver {
        op: DirectoryOpId,
        subscribe_to: Option<ObjectId>,
        /// The object of a `Publish`.
        publishes: Option<ObjectId>,
        /// The object of a `Withdraw` or a `DeleteEverywhere` kept in
        /// [`ReplayState::withdrawals`].
        withdraws: Option<ObjectId>,
    },
    /// A publication re-sent after connecting.
    Republish(ObjectId),
    /// A withdrawal re-sent after connecting. Not part of the replay the driver's
    /// `Health(Ok)` waits for: it lists nothing, and whatever the node asks next goes after it
    /// on the same connection.
    Rewithdraw(ObjectId),
    /// A subscription re-registered after connecting.
    Resubscribe(ObjectId),
}

impl Origin {
    /// Whether it is part of the replay after connecting.
    fn is_replay(&self) -> bool {
        matches!(self, Origin::Republish(_) | Origin::Resubscribe(_))
    }
}

/// The connection's state, named for what it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// No connection; the next attempt is due at `retry_at`.
    Down { reason: String, retry_at: Instant },
    /// The driver is opening a connection.
    AwaitingConnection,
    /// Hello sent with `nonce`; the registry must challenge (and then welcome) by `deadline`.
    AwaitingChallenge { deadline: Instant, nonce: Nonce },
    /// Proof sent; the registry must welcome by `deadline`, proving the token over the same
    /// nonces.
    AwaitingWelcome {
        deadline: Instant,
        nonce: Nonce,
        registry_nonce: Nonce,
    },
    /// Registered.
    Up {
        last_heard: Instant,
        next_ping: Instant,
    },
}

/// What the node keeps so a registry that lost it can be told again: its publications and the
/// subscriptions it waits on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayState {
    /// What the node holds, as its core last said (one entry per object of the node, so in
    /// chunks that stay nearly full).
    pub publications: SortedChunks<ObjectId, (ObjectSizes, ContentDigest)>,
    /// Objects the node waits for (subscriptions the registry holds, or will after replay).
    pub subscriptions: BTreeSet<ObjectId>,
    /// Objects the node withdrew (or deleted) whose withdrawal no registry answered `Done`
    /// yet (asked while the registry was unreachable, or in flight when a connection was
    /// lost; or answered just before a connection was lost, see `DirectorySession::lost`),
    /// each with the request of its latest withdrawal in flight: only that one's `Done`
    /// settles it. At most [`SessionConfig::max_publications`]; beyond, a withdrawal is sent
    /// as usual but not withdrawn again after a reconnect.
    pub withdrawals: BTreeMap<ObjectId, Option<WireOpId>>,
}

/// A node's directory session. See the module documentation.
#[derive(Debug)]
pub struct DirectorySession {
    config: SessionConfig,
    me: MemberInfo,
    token: auth::ClusterToken,
    nonces: NonceSource,
    replay: ReplayState,
    link: Link,
    /// Whether the driver was told the directory is reachable (so a loss is reported once); set
    /// once the replay after a welcome is answered.
    reported_up: bool,
    /// The number of the member list this connection brought (`None` before its first): a
    /// change must start from it.
    members_epoch: Option<u64>,
    /// That list, when the driver is told lists; passed on after `Health(Ok)` if it came
    /// while the replay ran.
    members: Option<MemberList>,
    backoff: Duration,
    in_flight: BTreeMap<WireOpId, Origin>,
    /// How many of `in_flight` are replays (`Republish`, `Resubscribe`): whether the session
    /// replays is asked after every event of a simulation, and `in_flight` can be long.
    replays_in_flight: usize,
    next_wire_op: u64,
    ping_seq: u64,
    outputs: VecDeque<SessionOutput>,
    /// Whether a registry welcomed this session before: its hellos say it returns.
    registered_before: bool,
    /// Changes to the subscriptions so far (a checker re-examines them only after one).
    subscription_changes: u64,
    /// Withdrawals the registry answered `Done` lately, oldest first (see
    /// [`DirectorySession::lost`]); at most [`SessionConfig::max_publications`].
    recent_withdrawals: VecDeque<(Instant, ObjectId)>,
}

impl DirectorySession {
    /// A session for `me`, proving `token`, with nonces keyed by `nonce_key` (secret and
    /// random); it asks for its first connection at once.
    pub fn new(
        config: SessionConfig,
        me: MemberInfo,
        token: auth::ClusterToken,
        nonce_key: [u8; 32],
        now: Instant,
    ) -> Self {
        let backoff = config.reconnect_backoff_min;
        Self {
            config,
            me,
            token,
            nonces: NonceSource::new(nonce_key),
            replay: ReplayState::default(),
            link: Link::Down {
                reason: "not connected yet".into(),
                retry_at: now,
            },
            reported_up: false,
            members_epoch: None,
            members: None,
            backoff,
            in_flight: BTreeMap::new(),
            replays_in_flight: 0,
            next_wire_op: 0,
            ping_seq: 0,
            outputs: VecDeque::new(),
            registered_before: false,
            subscription_changes: 0,
            recent_withdrawals: VecDeque::new(),
        }
    }

    /// Who this node is.
    pub fn me(&self) -> &MemberInfo {
        &self.me
    }

    /// What would be replayed after a reconnect.
    pub fn replay_state(&self) -> &ReplayState {
        &self.replay
    }

    /// Whether the session is registered.
    pub fn is_up(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }

    /// Whether the session is down, waiting to try connecting again.
    pub fn is_down(&self) -> bool {
        matches!(self.link, Link::Down { .. })
    }

    /// Whether replayed requests of the current connection still await their replies.
    pub fn replaying(&self) -> bool {
        debug_assert_eq!(
            self.replays_in_flight,
            self.in_flight.values().filter(|o| o.is_replay()).count(),
            "replays in flight"
        );
        self.replays_in_flight > 0
    }

    /// The objects the session waits for to be published, in id order.
    pub fn waited_for(&self) -> impl ExactSizeIterator<Item = &ObjectId> {
        self.replay.subscriptions.iter()
    }

    /// How many times the subscriptions changed so far: equal counts, the same subscriptions.
    pub fn subscription_changes(&self) -> u64 {
        self.subscription_changes
    }

    /// Whether the session waits for `id` to be published.
    pub fn waits_for(&self, id: &ObjectId) -> bool {
        self.replay.subscriptions.contains(id)
    }

    // ---- Inputs ----

    /// The driver submits a request of the node's core.
    pub fn handle_submit(&mut self, now: Instant, op: DirectoryOpId, request: DirectoryRequest) {
        let _ = now;
        if let DirectoryRequest::Unsubscribe { id } = request {
            self.replay.subscriptions.remove(&id);
            self.subscription_changes += 1;
            for origin in self.in_flight.values_mut() {
                if let Origin::Driver { subscribe_to, .. } = origin {
                    if *subscribe_to == Some(id) {
                        *subscribe_to = None;
                    }
                }
            }
            if self.is_up() {
                self.send(None, request);
            }
            return;
        }
        let mut subscribe_to = None;
        let mut publishes = None;
        let mut withdraws = None;
        match request {
            DirectoryRequest::Lookup { id, subscribe } => subscribe_to = subscribe.then_some(id),
            DirectoryRequest::Publish { id, sizes, digest }
            | DirectoryRequest::PublishReplicated {
                id, sizes, digest, ..
            } => {
                if self.replay.publications.len() >= self.config.max_publications
                    && !self.replay.publications.contains_key(&id)
                {
                    let limit = self.config.max_publications;
                    return self.reply(
                        op,
                        DirectoryReply::Unavailable {
                            reason: format!(
                                "{limit} objects published, the most the directory keeps"
                            ),
                        },
                    );
                }
                self.replay.publications.insert(id, (sizes, digest));
                self.replay.withdrawals.remove(&id);
                publishes = Some(id);
            }
            DirectoryRequest::Withdraw { id } | DirectoryRequest::DeleteEverywhere { id } => {
                self.replay.publications.remove(&id);
                if self.replay.withdrawals.len() < self.config.max_publications
                    || self.replay.withdrawals.contains_key(&id)
                {
                    self.replay.withdrawals.insert(id, None);
                    withdraws = Some(id);
                }
            }
            DirectoryRequest::DeclineReplica { .. } | DirectoryRequest::LocateCopies { .. } => {}
            DirectoryRequest::Unsubscribe { .. } => unreachable!("handled above"),
        }
        if !self.is_up() {
            let reason = match &self.link {
                Link::Down { reason, .. } => reason.clone(),
                _ => "connecting to the directory".into(),
            };
            return self.reply(op, DirectoryReply::Unavailable { reason });
        }
        if self.in_flight.len() >= self.config.max_in_flight {
            let limit = self.config.max_in_flight;
            return self.reply(
                op,
                DirectoryReply::Unavailable {
                    reason: format!("{limit} directory requests in flight"),
                },
            );
        }
        let wire_op = self.send(
            Some(Origin::Driver {
                op,
                subscribe_to,
                publishes,
                withdraws,
            }),
            request,
        );
        if let Some(id) = withdraws {
            self.replay.withdrawals.insert(id, Some(wire_op));
        }
    }

    /// The connection the session asked for is open: the hello goes out.
    pub fn handle_connected(&mut self, now: Instant) {
        let nonce = self.nonces.next_nonce();
        self.link = Link::AwaitingChallenge {
            deadline: now + self.config.heartbeat_timeout,
            nonce,
        };
        self.outputs
            .push_back(SessionOutput::Send(self.hello(nonce)));
    }

    /// The connection the session asked for could not be opened.
    pub fn handle_connect_failed(&mut self, now: Instant, reason: &str) {
        self.lost(now, format!("directory unreachable: {reason}"));
    }

    /// The current connection closed or failed.
    pub fn handle_disconnected(&mut self, now: Instant, reason: &str) {
        if !matches!(self.link, Link::Down { .. }) {
            self.lost(now, format!("directory connection lost: {reason}"));
        }
    }

    /// A message from the registry on the current connection. An error means the connection
    /// is done for (the session already counts it as lost; the driver closes it).
    pub fn handle_message(
        &mut self,
        now: Instant,
        message: FromRegistry,
    ) -> Result<(), SessionError> {
        let result = self.receive(now, message);
        if let Err(error) = &result {
            if !matches!(error, SessionError::NotConnected) {
                self.lost(now, error.to_string());
                if !matches!(error, SessionError::Refused { .. }) {
                    self.outputs.push_back(SessionOutput::Disconnect {
                        reason: error.to_string(),
                    });
                }
            }
        }
        result
    }

    fn receive(&mut self, now: Instant, message: FromRegistry) -> Result<(), SessionError> {
        match &mut self.link {
            Link::Down { .. } | Link::AwaitingConnection => return Err(SessionError::NotConnected),
            Link::AwaitingChallenge { deadline, nonce } => {
                return match message {
                    FromRegistry::Challenge {
                        nonce: registry_nonce,
                    } => {
                        let (deadline, nonce) = (*deadline, *nonce);
                        let identity = wire::member_identity(&self.me);
                        let transcript = wire::transcript(&nonce, &registry_nonce, &identity);
                        let proof =
                            auth::prove(self.token.expose_secret(), Role::Dialer, &transcript);
                        self.link = Link::AwaitingWelcome {
                            deadline,
                            nonce,
                            registry_nonce,
                        };
                        self.outputs
                            .push_back(SessionOutput::Send(ToRegistry::Proof(proof)));
                        Ok(())
                    }
                    FromRegistry::Refused { reason, retryable } => {
                        Err(SessionError::Refused { reason, retryable })
                    }
                    other => Err(SessionError::Protocol(format!(
                        "expected a challenge, got {other}"
                    ))),
                };
            }
            Link::AwaitingWelcome {
                nonce,
                registry_nonce,
                ..
            } => {
                return match message {
                    FromRegistry::Welcome { proof, .. } => {
                        let identity = wire::member_identity(&self.me);
                        let transcript = wire::transcript(nonce, registry_nonce, &identity);
                        if auth::verify(
                            self.token.expose_secret(),
                            Role::Acceptor,
                            &transcript,
                            &proof,
                        ) {
                            self.welcomed(now);
                            Ok(())
                        } else {
                            Err(SessionError::Unproven)
                        }
                    }
                    FromRegistry::Refused { reason, retryable } => {
                        Err(SessionError::Refused { reason, retryable })
                    }
                    other => Err(SessionError::Protocol(format!(
                        "expected a welcome, got {other}"
                    ))),
                };
            }
            Link::Up { last_heard, .. } => *last_heard = now,
        }
        match message {
            FromRegistry::Reply { op, reply } => match self.in_flight.remove(&op) {
                Some(origin) => {
                    self.replays_in_flight -= usize::from(origin.is_replay());
                    self.replied(now, op, origin, reply)
                }
                None => {
                    return Err(SessionError::Protocol(format!(
                        "the head answered unknown {op}"
                    )))
                }
            },
            FromRegistry::Event(event) => {
                // One-shot: an event for a subscription already fired (by a replayed lookup)
                // or dropped is not passed on twice. Replica events are not subscriptions.
                let passes = match &event {
                    DirectoryEvent::Published { id, .. } => {
                        self.subscription_changes += 1;
                        self.replay.subscriptions.remove(id)
                    }
                    _ => true,
                };
                if passes {
                    self.notice(DirectoryNotice::Event(event));
                }
            }
            FromRegistry::Members { epoch, members } => {
                self.members_epoch = Some(epoch);
                if self.config.member_lists {
                    self.members_changed(members);
                }
            }
            FromRegistry::MembersChanged { from, to, changes } => {
                if self.members_epoch != Some(from) {
                    return Err(SessionError::Protocol(format!(
                        "member changes from list {from}, but this node has {}",
                        self.members_epoch
                            .map_or("none".into(), |epoch| format!("list {epoch}"))
                    )));
                }
                self.members_epoch = Some(to);
                if self.config.member_lists {
                    let list = self.members.as_deref().unwrap_or_default();
                    let members = apply_member_changes(list, &changes);
                    self.members_changed(members);
                }
            }
            FromRegistry::Pong { .. } => {}
            FromRegistry::Refused { reason, retryable } => {
                return Err(SessionError::Refused { reason, retryable })
            }
            FromRegistry::Welcome { .. } => {
                return Err(SessionError::Protocol("a second welcome".into()))
            }
            FromRegistry::Challenge { .. } => {
                return Err(SessionError::Protocol(
                    "a challenge after the welcome".into(),
                ))
            }
        }
        Ok(())
    }

    /// Time passed: heartbeats, the hello's deadline, the next connection attempt. Calling
    /// early is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.link {
            Link::Down { retry_at, .. } if *retry_at <= now => {
                self.link = Link::AwaitingConnection;
                self.outputs.push_back(SessionOutput::Connect);
            }
            Link::AwaitingChallenge { deadline, .. } | Link::AwaitingWelcome { deadline, .. }
                if *deadline <= now =>
            {
                let reason = format!(
                    "no welcome within {} ms",
                    self.config.heartbeat_timeout.as_millis()
                );
                self.lost(now, reason.clone());
                self.outputs.push_back(SessionOutput::Disconnect { reason });
            }
            Link::Up {
                last_heard,
                next_ping,
            } => {
                if now.saturating_since(*last_heard) >= self.config.heartbeat_timeout {
                    let reason = format!(
                        "the directory was silent for {} ms",
                        self.config.heartbeat_timeout.as_millis()
                    );
                    self.lost(now, reason.clone());
                    self.outputs.push_back(SessionOutput::Disconnect { reason });
                } else if *next_ping <= now {
                    *next_ping = now + self.config.heartbeat_interval;
                    self.ping_seq += 1;
                    let seq = self.ping_seq;
                    self.outputs
                        .push_back(SessionOutput::Send(ToRegistry::Ping { seq }));
                }
            }
            _ => {}
        }
    }

    /// The driver stops: a clean goodbye if registered.
    pub fn handle_leave(&mut self, now: Instant) {
        if self.is_up() {
            self.outputs
                .push_back(SessionOutput::Send(ToRegistry::Goodbye));
        }
        self.link = Link::Down {
            reason: "the node left the cluster".into(),
            retry_at: Instant::NEVER,
        };
        let _ = now;
    }

    // ---- Outputs ----

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<SessionOutput> {
        self.outputs.pop_front()
    }

    /// When [`DirectorySession::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.link {
            Link::Down { retry_at, .. } => (*retry_at != Instant::NEVER).then_some(*retry_at),
            Link::AwaitingConnection => None,
            Link::AwaitingChallenge { deadline, .. } | Link::AwaitingWelcome { deadline, .. } => {
                Some(*deadline)
            }
            Link::Up {
                last_heard,
                next_ping,
            } => Some((*next_ping).min(*last_heard + self.config.heartbeat_timeout)),
        }
    }

    // ---- Internals ----

    fn hello(&self, nonce: Nonce) -> ToRegistry {
        ToRegistry::Hello(Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            legacy_token: String::new(),
            member: self.me.clone(),
            nonce,
            returning: self.registered_before,
            learns_locations: self.config.learn_locations,
        })
    }

    fn welcomed(&mut self, now: Instant) {
        self.link = Link::Up {
            last_heard: now,
            next_ping: now + self.config.heartbeat_interval,
        };
        self.backoff = self.config.reconnect_backoff_min;
        self.registered_before = true;
        // Re-register what the registry may not know (all of it after a head restart).
        let republish: Vec<(ObjectId, (ObjectSizes, ContentDigest))> = self
            .replay
            .publications
            .iter()
            .map(|(i, s)| (*i, *s))
            .collect();
        for (id, (sizes, digest)) in republish {
            let op = self.next_op(Origin::Republish(id));
            self.outputs
                .push_back(SessionOutput::Send(ToRegistry::Reclaim {
                    op,
                    id,
                    sizes,
                    digest,
                }));
        }
        let withdraw_again: Vec<ObjectId> = self.replay.withdrawals.keys().copied().collect();
        for id in withdraw_again {
            let op = self.send(
                Some(Origin::Rewithdraw(id)),
                DirectoryRequest::Withdraw { id },
            );
            self.replay.withdrawals.insert(id, Some(op));
        }
        let resubscribe: Vec<ObjectId> = self.replay.subscriptions.iter().copied().collect();
        for id in resubscribe {
            self.send(
                Some(Origin::Resubscribe(id)),
                DirectoryRequest::Lookup {
                    id,
                    subscribe: true,
                },
            );
        }
        self.report_up_once_replayed();
    }

    /// The member list is now `members`: the driver is told at once, or after `Health(Ok)`
    /// while the replay runs.
    fn members_changed(&mut self, members: MemberList) {
        self.members = Some(members.clone());
        if self.reported_up {
            self.notice(DirectoryNotice::Members(members));
        }
    }

    /// Health(Ok) once the registry knows everything again (the replay is answered), so a
    /// driver that sees it can count on the node's publications being listed.
    fn report_up_once_replayed(&mut self) {
        if self.is_up() && !self.reported_up && !self.replaying() {
            self.reported_up = true;
            self.notice(DirectoryNotice::Health(Ok(())));
            if let Some(members) = self.members.clone() {
                self.notice(DirectoryNotice::Members(members));
            }
        }
    }

    /// The connection is gone: in-flight requests of the driver are answered `Unavailable`, a
    /// loss is reported once, and the next attempt is scheduled with backoff.
    ///
    /// Withdrawals the registry answered within the last two heartbeat timeouts are made
    /// again after the next welcome, as those it never answered are: a directory whose state
    /// is replicated asynchronously (a Redis Cluster shard) loses, when it fails over, the
    /// writes of its last moments, and a withdrawal lost so leaves the node listed as holding
    /// what it dropped. A session notices a dead master within its heartbeat timeout, so two
    /// cover every write of a replica trailing its master by less than one.
    fn lost(&mut self, now: Instant, reason: String) {
        self.forget_withdrawals_before(now);
        for (_, id) in std::mem::take(&mut self.recent_withdrawals) {
            let published_since = self.replay.publications.contains_key(&id);
            let room = self.replay.withdrawals.len() < self.config.max_publications;
            if !published_since && room {
                self.replay.withdrawals.insert(id, None);
            }
        }
        self.replays_in_flight = 0;
        for origin in std::mem::take(&mut self.in_flight).into_values() {
            if let Origin::Driver { op, .. } = origin {
                self.reply(
                    op,
                    DirectoryReply::Unavailable {
                        reason: reason.clone(),
                    },
                );
            }
        }
        if self.reported_up {
            self.reported_up = false;
            self.notice(DirectoryNotice::Health(Err(reason.clone())));
        }
        self.members_epoch = None;
        self.members = None;
        let retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(self.config.reconnect_backoff_max);
        self.link = Link::Down { reason, retry_at };
    }

    fn replied(&mut self, now: Instant, wire_op: WireOpId, origin: Origin, reply: DirectoryReply) {
        match origin {
            Origin::Driver {
                op,
                subscribe_to,
                publishes,
                withdraws,
            } => {
                if let (Some(id), DirectoryReply::Located { holders, .. }) = (subscribe_to, &reply)
                {
                    if holders.is_empty() {
                        self.replay.subscriptions.insert(id);
                        self.subscription_changes += 1;
                    }
                }
                if let (Some(id), DirectoryReply::Conflict { .. }) = (publishes, &reply) {
                    // Refused: nothing to tell a registry that loses its state.
                    self.replay.publications.remove(&id);
                }
                if let (Some(id), DirectoryReply::Done) = (withdraws, &reply) {
                    self.withdrawal_done(now, id, wire_op);
                }
                self.reply(op, reply);
            }
            Origin::Rewithdraw(id) => {
                if reply == DirectoryReply::Done {
                    self.withdrawal_done(now, id, wire_op);
                }
            }
            Origin::Resubscribe(id) => {
                // Published while this node was away: the subscription fires now.
                if let DirectoryReply::Located {
                    holders,
                    sizes: Some(sizes),
                    digest: Some(digest),
                } = &reply
                {
                    if let Some(holder) = holders.first() {
                        self.subscription_changes += 1;
                        if self.replay.subscriptions.remove(&id) {
                            self.notice(DirectoryNotice::Event(DirectoryEvent::Published {
                                id,
                                holder: *holder,
                                sizes: *sizes,
                                digest: *digest,
                            }));
                        }
                    }
                }
            }
            Origin::Republish(id) => {
                // Another node published another content under this id while the registry
                // did not know this node's: the id stays theirs, this copy unpublished, and the
                // node must know, or it would serve its bytes to hinted fetches.
                if let DirectoryReply::Conflict { sizes, digest } = reply {
                    self.replay.publications.remove(&id);
                    self.notice(DirectoryNotice::Event(DirectoryEvent::ReplayRefused {
                        id,
                        sizes,
                        digest,
                    }));
                }
            }
        }
        self.report_up_once_replayed();
    }

    /// A fresh wire op for a request of `origin`, in flight from now.
    fn next_op(&mut self, origin: Origin) -> WireOpId {
        let op = WireOpId(self.next_wire_op);
        self.next_wire_op += 1;
        self.replays_in_flight += usize::from(origin.is_replay());
        self.in_flight.insert(op, origin);
        op
    }

    /// The registry answered `Done` to the withdrawal of `id` sent as `wire_op`: settled, unless a
    /// later withdrawal of the object is in flight or it was published again since.
    fn withdrawal_done(&mut self, now: Instant, id: ObjectId, wire_op: WireOpId) {
        if self.replay.withdrawals.get(&id) == Some(&Some(wire_op)) {
            self.replay.withdrawals.remove(&id);
            if self.recent_withdrawals.len() >= self.config.max_publications {
                self.recent_withdrawals.pop_front();
            }
            self.recent_withdrawals.push_back((now, id));
            self.forget_withdrawals_before(now);
        }
    }

    /// How long a withdrawal the registry answered is made again after a lost connection.
    fn recent_withdrawal_window(&self) -> Duration {
        self.config.heartbeat_timeout * 2
    }

    /// Drops the withdrawals answered longer than the window ago.
    fn forget_withdrawals_before(&mut self, now: Instant) {
        let window = self.recent_withdrawal_window();
        while let Some(&(at, _)) = self.recent_withdrawals.front() {
            if now.saturating_since(at) <= window {
                break;
            }
            self.recent_withdrawals.pop_front();
        }
    }

    /// Sends `request` as a fresh wire op (in flight for `origin`, if any), and returns the op.
    fn send(&mut self, origin: Option<Origin>, request: DirectoryRequest) -> WireOpId {
        let op = match origin {
            Some(origin) => self.next_op(origin),
            None => {
                let op = WireOpId(self.next_wire_op);
                self.next_wire_op += 1;
                op
            }
        };
        self.outputs
            .push_back(SessionOutput::Send(ToRegistry::Request { op, request }));
        op
    }

    fn reply(&mut self, op: DirectoryOpId, reply: DirectoryReply) {
        self.notice(DirectoryNotice::Reply { op, reply });
    }

    fn notice(&mut self, notice: DirectoryNotice) {
        self.outputs.push_back(SessionOutput::Notice(notice));
    }
}
