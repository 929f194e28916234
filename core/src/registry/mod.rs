//! The directory registry: the head's rules, sans-IO. The built-in directory's server is a thin
//! tokio driver of it, the simulator runs the very same code behind a simulated link, and
//! [`session::DirectorySession`] is the node's side of the same conversation.
//!
//! Inputs carry `now` and name the connection they came on ([`ConnId`], chosen by the driver):
//! [`Registry::handle_hello`], [`Registry::handle_request`], [`Registry::handle_ping`],
//! [`Registry::handle_goodbye`], [`Registry::handle_disconnect`], [`Registry::handle_timeout`].
//! Outputs are values drained with [`Registry::poll_output`]: messages to connections and
//! connections to close. [`Registry::poll_timeout`] says when the next heartbeat expires.
//!
//! Rules:
//! - **Join**: a hello must carry the magic and the protocol version; the registry answers
//!   with a fresh nonce ([`FromRegistry::Challenge`]), the node proves the cluster token with
//!   an HMAC over both nonces and its identity ([`ToRegistry::Proof`], see [`crate::auth`]),
//!   and only then does the registry judge the hello and, admitting it, prove the token in
//!   turn in its `Welcome`. The token never travels, a recorded handshake fails against the
//!   next nonce, and a caller without the token learns no proof. A node id already registered
//!   by a live daemon is refused
//!   (retryably: it may be about to expire), unless the hello is that same daemon (same
//!   incarnation and fabric address) reconnecting, which takes over the registration, or a
//!   restart of it (same fabric address, higher incarnation): then the old incarnation's
//!   locations and subscriptions are dropped at once and the new one joins.
//! - **Liveness**: a member not heard from (any message counts) within the heartbeat timeout is
//!   dead; so is one whose connection closed. Its locations and subscriptions vanish and the new
//!   member list goes to every member.
//! - **Lookup with subscribe** is one atomic step: either the lookup sees a holder, or the
//!   subscription is registered before any later publish, which then fires it (exactly once:
//!   subscriptions are one-shot).
//! - Output for one connection leaves in the order it was decided; a publish's reply is queued
//!   before the events it fires.
//! - **Grace after a restart**: a restarted head judges at once only replayed publications and
//!   those of ids it lists; the others wait for the end of its grace period (see [`grace`]).

mod expiring;
mod grace;
#[cfg(test)]
mod grace_tests;
mod holders;
#[cfg(test)]
mod learn_tests;
#[cfg(test)]
mod locate_tests;
pub mod member_changes;
pub mod placement;
pub mod replication;
#[cfg(test)]
mod replication_tests;
pub mod session;
#[cfg(test)]
mod tests;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use holders::HolderIndex;

use crate::auth::{self, Nonce, NonceSource, Proof, Role};
use crate::digest::ContentDigest;
use crate::directory::{
    CopiesOfRecord, DirectoryEvent, DirectoryReply, DirectoryRequest, MemberInfo, MemberList,
};
use crate::ids::{NodeId, ObjectId};
use crate::time::Instant;
use crate::wire::ObjectSizes;

pub use grace::MAX_DEFERRED_REQUESTS;
pub use replication::{ReplicationLimits, ReplicationStats, MAX_REPLICAS};
pub use wire::{FromRegistry, Hello, ToRegistry, WireOpId, HELLO_MAGIC, PROTOCOL_VERSION};

/// One connection to the registry, named by the driver; never reused while the registry knows it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn-{}", self.0)
    }
}

/// Limits of one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryLimits {
    /// Most members at once.
    pub max_nodes: usize,
    /// Most pending one-shot subscriptions of one node.
    pub max_subscriptions_per_node: usize,
    /// Most objects one node may publish.
    pub max_publications_per_node: usize,
    /// Most hellos waiting for their proof at once.
    pub max_handshakes: usize,
}

impl Default for RegistryLimits {
    fn default() -> Self {
        Self {
            max_nodes: 4096,
            max_subscriptions_per_node: 65_536,
            max_publications_per_node: 1 << 24,
            max_handshakes: 1024,
        }
    }
}

/// How a registry serves. Its `Debug` output leaves out the token and the nonce key.
#[derive(Clone)]
pub struct RegistryConfig {
    /// Nodes must prove this token.
    pub cluster_token: auth::ClusterToken,
    /// Keys the registry's nonces: secret and random (the driver draws it from the operating
    /// system, the simulator from its seed).
    pub nonce_key: [u8; 32],
    /// A member not heard from for this long is dead.
    pub heartbeat_timeout: Duration,
    /// Limits.
    pub limits: RegistryLimits,
}

impl RegistryConfig {
    /// Default limits, a 5 s heartbeat timeout, `cluster_token` and `nonce_key`.
    pub fn new(cluster_token: impl Into<auth::ClusterToken>, nonce_key: [u8; 32]) -> Self {
        Self {
            cluster_token: cluster_token.into(),
            nonce_key,
            heartbeat_timeout: Duration::from_secs(5),
            limits: RegistryLimits::default(),
        }
    }
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// What the registry asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum RegistryOutput {
    /// Send `message` on `conn`.
    Send {
        /// The connection.
        conn: ConnId,
        /// The message.
        message: FromRegistry,
    },
    /// Send the member list to each of `conns` (one encoding serves them all, one shared list
    /// every message). Output at every membership change, so it also tells drivers the
    /// current list.
    SendMembers {
        /// The connections, in node id order.
        conns: Vec<ConnId>,
        /// The live members, sorted by node id.
        members: MemberList,
        /// The list's number (see [`member_changes`]): one more at each membership change;
        /// a list sent again unchanged (to a reconnected node) keeps its number.
        epoch: u64,
    },
    /// Close `conn` after what was queued for it; the registry has forgotten it.
    Close {
        /// The connection.
        conn: ConnId,
        /// Why, for logs.
        reason: String,
    },
}

/// Why a hello was turned down (also sent to the node as [`FromRegistry::Refused`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloRefused {
    /// The hello does not open with [`HELLO_MAGIC`].
    #[error("not a Skyriver directory hello")]
    NotAHello,
    /// The node speaks another protocol version.
    #[error("directory protocol version {version} is not supported (this head speaks {PROTOCOL_VERSION})")]
    Version {
        /// The node's version.
        version: u16,
    },
    /// The node's proof does not hold for the head's token.
    #[error("wrong cluster token: this node's token does not match the head's")]
    WrongToken,
    /// Too many hellos wait for their proofs.
    #[error("the directory is busy with {max_handshakes} handshakes; try again")]
    Busy {
        /// The limit.
        max_handshakes: usize,
    },
    /// A proof came on a connection that sent no hello (or was already admitted).
    #[error("a proof without a pending hello")]
    UnexpectedProof,
    /// Another live daemon holds this node id.
    #[error(
        "{node} is already a member (incarnation {incarnation}, fabric at {fabric_addr}); a \
         restarted daemon is accepted once the old connection closes or is silent for \
         {heartbeat_timeout_ms} ms"
    )]
    DuplicateNode {
        /// The node id.
        node: NodeId,
        /// The live member's incarnation.
        incarnation: u32,
        /// The live member's fabric address.
        fabric_addr: std::net::SocketAddr,
        /// The heartbeat timeout.
        heartbeat_timeout_ms: u128,
    },
    /// A daemon older than the registered one.
    #[error(
        "{node} is registered with the newer incarnation {registered}; this daemon has {offered}"
    )]
    StaleIncarnation {
        /// The node id.
        node: NodeId,
        /// The registered incarnation.
        registered: u32,
        /// The hello's incarnation.
        offered: u32,
    },
    /// The registry is full.
    #[error("the directory serves at most {max_nodes} nodes")]
    Full {
        /// The limit.
        max_nodes: usize,
    },
    /// The connection already said hello.
    #[error("a second hello on one connection")]
    SecondHello,
}

impl HelloRefused {
    /// Whether trying again shortly may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            HelloRefused::DuplicateNode { .. } | HelloRefused::Busy { .. }
        )
    }
}

/// Why a message from a connection was not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The connection has no member (no hello yet, or it was dropped): the driver closes it.
    #[error("{conn} is not a member's connection (no hello, or its registration ended)")]
    NotAMember {
        /// The connection.
        conn: ConnId,
    },
}

/// A hello waiting for its proof.
#[derive(Debug)]
struct Handshake {
    hello: Hello,
    /// The registry's nonce, sent in the challenge.
    nonce: Nonce,
}

/// How far behind a member's real heartbeat deadline its filed one may fall, as a fraction of
/// the timeout (1/16: 312 ms of 5 s). Every message moves the real deadline (a field); moving
/// the filed one is two B-tree operations, which at every message took a few percent of the
/// head's time under load. A filed deadline that comes due for a member heard from since is
/// filed again under the real one, so a member still expires exactly a timeout after it was
/// last heard from; the head only wakes once early for a member that falls silent (a member
/// heard from at intervals of a sixteenth of the timeout or more, as an idle node's pings are,
/// is filed again at every message).
const EXPIRY_INDEX_STEP: u32 = 16;

/// One registered node.
#[derive(Debug)]
struct Member {
    info: MemberInfo,
    conn: ConnId,
    /// The member is dead unless heard from again by this time.
    expires_at: Instant,
    /// Its key in [`Registry::expiry`]: at or before `expires_at` (see [`EXPIRY_INDEX_STEP`]).
    indexed_expiry: Instant,
    /// Objects it is listed as holding (the list itself is `Registry::holders`: a second,
    /// per-member index would cost the head as much again per object).
    published: usize,
    subscribed: BTreeSet<ObjectId>,
    /// The registry's [`Registry::subscription_changes`] at the last change of `subscribed`
    /// (or the member's arrival).
    subscribed_stamp: u64,
}

/// The directory registry. See the module documentation for its rules.
#[derive(Debug)]
pub struct Registry {
    config: RegistryConfig,
    members: BTreeMap<NodeId, Member>,
    /// Looked up at every message (never iterated): hashed. Connection ids are the driver's,
    /// not chosen from outside, so a fixed hash key serves.
    by_conn: hashbrown::HashMap<ConnId, NodeId, foldhash::fast::FixedState>,
    /// Heartbeat deadlines, earliest first, each at or before the member's own (see
    /// [`EXPIRY_INDEX_STEP`]).
    expiry: BTreeSet<(Instant, NodeId)>,
    /// Every published object with its holders.
    holders: HolderIndex,
    /// One-shot subscriptions by object; never an empty set.
    subscribers: BTreeMap<ObjectId, BTreeSet<NodeId>>,
    /// Members that asked to learn the first holder of every object (the hello's
    /// `learns_locations`).
    learners: BTreeSet<NodeId>,
    /// Hellos waiting for their proofs, by connection; never a member's connection.
    handshakes: BTreeMap<ConnId, Handshake>,
    /// Changes to the members' subscriptions (and arrivals of members) so far: stamps them, so
    /// a checker re-examines a member's subscriptions only once they changed.
    subscription_changes: u64,
    /// The member list's number: one more at each change (see [`member_changes`]).
    members_epoch: u64,
    nonces: NonceSource,
    outputs: VecDeque<RegistryOutput>,
    /// Replica records, placement and repair (see [`replication`]).
    replication: replication::Replication,
    /// The latest `now` of any input.
    now: Instant,
    /// The grace period after a restart (see [`grace`]).
    grace: grace::Grace,
}

impl Registry {
    /// An empty registry.
    pub fn new(config: RegistryConfig) -> Self {
        let index_seed = auth::seed_from_key(&config.nonce_key, "holder-index");
        Self {
            nonces: NonceSource::new(config.nonce_key),
            handshakes: BTreeMap::new(),
            subscription_changes: 0,
            members_epoch: 0,
            config,
            members: BTreeMap::new(),
            by_conn: hashbrown::HashMap::default(),
            expiry: BTreeSet::new(),
            holders: HolderIndex::new(index_seed),
            subscribers: BTreeMap::new(),
            learners: BTreeSet::new(),
            outputs: VecDeque::new(),
            replication: replication::Replication::new(ReplicationLimits::default()),
            now: Instant::ZERO,
            grace: grace::Grace::default(),
        }
    }

    /// Replaces the replication limits (before any replicated object is published).
    pub fn set_replication_limits(&mut self, limits: ReplicationLimits) {
        self.replication = replication::Replication::new(limits);
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        self.note_start(now);
    }

    /// Its configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    // ---- Inputs ----

    /// A connection said hello. Well-formed: a `Challenge` goes to it, and the hello waits
    /// for the node's proof ([`Registry::handle_proof`]). Refused: `Refused` goes to it and it
    /// is closed; the reason is also returned, for the driver's logs.
    pub fn handle_hello(
        &mut self,
        now: Instant,
        conn: ConnId,
        hello: Hello,
    ) -> Result<(), HelloRefused> {
        self.advance(now);
        let result = self.challenge(conn, hello);
        self.refuse_on_error(conn, &result);
        result
    }

    fn challenge(&mut self, conn: ConnId, hello: Hello) -> Result<(), HelloRefused> {
        if self.by_conn.contains_key(&conn) || self.handshakes.contains_key(&conn) {
            return Err(HelloRefused::SecondHello);
        }
        if hello.magic != HELLO_MAGIC {
            return Err(HelloRefused::NotAHello);
        }
        if hello.version != PROTOCOL_VERSION {
            return Err(HelloRefused::Version {
                version: hello.version,
            });
        }
        if self.handshakes.len() >= self.config.limits.max_handshakes {
            return Err(HelloRefused::Busy {
                max_handshakes: self.config.limits.max_handshakes,
            });
        }
        let nonce = self.nonces.next_nonce();
        self.handshakes.insert(conn, Handshake { hello, nonce });
        self.outputs.push_back(RegistryOutput::Send {
            conn,
            message: FromRegistry::Challenge { nonce },
        });
        Ok(())
    }

    /// The node's proof of the token, answering the challenge. Holds: the hello is judged;
    /// admitted, `Welcome` (with the registry's proof) and the member list go to it and the new
    /// list to every member. Otherwise `Refused` goes to it and it is closed.
    pub fn handle_proof(
        &mut self,
        now: Instant,
        conn: ConnId,
        proof: Proof,
    ) -> Result<(), HelloRefused> {
        self.advance(now);
        let result = match self.handshakes.remove(&conn) {
            None => Err(HelloRefused::UnexpectedProof),
            Some(Handshake { hello, nonce }) => {
                let node_identity = wire::member_identity(&hello.member);
                let transcript = wire::transcript(&hello.nonce, &nonce, &node_identity);
                let token = self.config.cluster_token.expose_secret();
                if auth::verify(token, Role::Dialer, &transcript, &proof) {
                    let own_proof = auth::prove(token, Role::Acceptor, &transcript);
                    self.admit(now, conn, hello, own_proof)
                } else {
                    Err(HelloRefused::WrongToken)
                }
            }
        };
        self.refuse_on_error(conn, &result);
        result
    }

    /// A refused hello or proof: `Refused` to the connection, which is closed.
    fn refuse_on_error(&mut self, conn: ConnId, result: &Result<(), HelloRefused>) {
        if let Err(refusal) = result {
            self.outputs.push_back(RegistryOutput::Send {
                conn,
                message: FromRegistry::Refused {
                    reason: refusal.to_string(),
                    retryable: refusal.retryable(),
                },
            });
            // A second hello comes from a member: drop it with its connection.
            if let Some(node) = self.by_conn.get(&conn).copied() {
                self.remove_member(node);
                self.push_members();
            }
            self.outputs.push_back(RegistryOutput::Close {
                conn,
                reason: refusal.to_string(),
            });
        }
    }

    fn admit(
        &mut self,
        now: Instant,
        conn: ConnId,
        hello: Hello,
        proof: Proof,
    ) -> Result<(), HelloRefused> {
        let returning = hello.returning;
        let learns_locations = hello.learns_locations;
        let member = hello.member;
        let node = member.node;
        if let Some(old) = self.members.get(&node) {
            let same_address = old.info.fabric_addr == member.fabric_addr;
            if same_address && old.info.incarnation == member.incarnation {
                // The same daemon on a new connection (it noticed a broken link before the
                // registry did): the registration moves over; the node replays its state.
                let old_conn = old.conn;
                self.by_conn.remove(&old_conn);
                self.by_conn.insert(conn, node);
                let expires_at = now + self.config.heartbeat_timeout;
                let member_entry = self.members.get_mut(&node).expect("checked above");
                member_entry.conn = conn;
                self.expiry.remove(&(member_entry.indexed_expiry, node));
                member_entry.expires_at = expires_at;
                member_entry.indexed_expiry = expires_at;
                self.expiry.insert((expires_at, node));
                self.outputs.push_back(RegistryOutput::Close {
                    conn: old_conn,
                    reason: format!("{node} reconnected on {conn}"),
                });
                self.welcome(conn, proof);
                self.outputs.push_back(RegistryOutput::SendMembers {
                    conns: vec![conn],
                    members: self.member_list(),
                    epoch: self.members_epoch,
                });
                return Ok(());
            }
            if same_address && member.incarnation > old.info.incarnation {
                // A restart: the old daemon is gone (its fabric address is the new one's), and
                // so is everything it held or waited for.
                let old_conn = old.conn;
                self.remove_member(node);
                self.outputs.push_back(RegistryOutput::Close {
                    conn: old_conn,
                    reason: format!("{node} restarted as incarnation {}", member.incarnation),
                });
            } else if same_address {
                return Err(HelloRefused::StaleIncarnation {
                    node,
                    registered: old.info.incarnation,
                    offered: member.incarnation,
                });
            } else {
                return Err(HelloRefused::DuplicateNode {
                    node,
                    incarnation: old.info.incarnation,
                    fabric_addr: old.info.fabric_addr,
                    heartbeat_timeout_ms: self.config.heartbeat_timeout.as_millis(),
                });
            }
        } else if self.members.len() >= self.config.limits.max_nodes {
            return Err(HelloRefused::Full {
                max_nodes: self.config.limits.max_nodes,
            });
        }
        let expires_at = now + self.config.heartbeat_timeout;
        self.subscription_changes += 1;
        self.members.insert(
            node,
            Member {
                info: member,
                conn,
                expires_at,
                indexed_expiry: expires_at,
                published: 0,
                subscribed: BTreeSet::new(),
                subscribed_stamp: self.subscription_changes,
            },
        );
        self.by_conn.insert(conn, node);
        self.expiry.insert((expires_at, node));
        if learns_locations {
            self.learners.insert(node);
        }
        self.welcome(conn, proof);
        self.push_members();
        self.replicas_member_joined(now);
        if returning {
            self.returning_member_admitted(now);
        }
        Ok(())
    }

    /// A request from a member's connection. Replies (and any events it fires) are queued.
    pub fn handle_request(
        &mut self,
        now: Instant,
        conn: ConnId,
        op: WireOpId,
        request: DirectoryRequest,
    ) -> Result<(), RegistryError> {
        self.advance(now);
        let node = self.heard_from(now, conn)?;
        if let Err(request) = self.defer_in_grace(now, conn, node, op, request) {
            self.serve_request(now, conn, node, op, request);
        }
        Ok(())
    }

    /// A replayed publication from a member's connection ([`ToRegistry::Reclaim`]): judged at
    /// once, also during a grace period.
    pub fn handle_reclaim(
        &mut self,
        now: Instant,
        conn: ConnId,
        op: WireOpId,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) -> Result<(), RegistryError> {
        self.advance(now);
        let node = self.heard_from(now, conn)?;
        self.serve_request(
            now,
            conn,
            node,
            op,
            DirectoryRequest::Publish { id, sizes, digest },
        );
        Ok(())
    }

    /// Serves a request of `node`'s connection; the reply (and any events it fires) is queued.
    fn serve_request(
        &mut self,
        now: Instant,
        conn: ConnId,
        node: NodeId,
        op: WireOpId,
        request: DirectoryRequest,
    ) {
        let mut fired = Vec::new();
        if let DirectoryRequest::Publish { id, digest, .. }
        | DirectoryRequest::PublishReplicated { id, digest, .. } = &request
        {
            if self.answered_as_deleted(now, conn, op, node, *id, *digest) {
                return;
            }
        }
        let reply = match request {
            DirectoryRequest::Lookup { id, subscribe } => self.lookup(node, id, subscribe),
            DirectoryRequest::Publish { id, sizes, digest } => {
                self.publish(node, id, sizes, digest, &mut fired)
            }
            DirectoryRequest::Withdraw { id } => {
                self.withdraw(node, id);
                self.tombstone_withdrawn(node, id);
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Unsubscribe { id } => {
                self.unsubscribe(node, id);
                None
            }
            DirectoryRequest::PublishReplicated {
                id,
                sizes,
                digest,
                replicas,
                free_bytes,
            } => {
                let reply = self.publish(node, id, sizes, digest, &mut fired);
                if reply == Some(DirectoryReply::Done) {
                    // The reply and the events the publication fired go first.
                    self.outputs.push_back(RegistryOutput::Send {
                        conn,
                        message: FromRegistry::Reply {
                            op,
                            reply: DirectoryReply::Done,
                        },
                    });
                    self.outputs.extend(fired);
                    let bytes = sizes.total().unwrap_or(u64::MAX);
                    self.copy_of_record_published(
                        now,
                        node,
                        id,
                        (bytes, digest),
                        replicas,
                        free_bytes,
                    );
                    return;
                }
                reply
            }
            DirectoryRequest::DeleteEverywhere { id } => {
                self.delete_everywhere(node, id);
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::DeclineReplica { id } => {
                self.replica_declined(now, node, id);
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::LocateCopies { id } => Some(self.locate_copies(node, id)),
        };
        if let Some(reply) = reply {
            self.outputs.push_back(RegistryOutput::Send {
                conn,
                message: FromRegistry::Reply { op, reply },
            });
        }
        self.outputs.extend(fired);
    }

    /// A heartbeat from a member's connection; answered with `Pong`.
    pub fn handle_ping(
        &mut self,
        now: Instant,
        conn: ConnId,
        seq: u64,
    ) -> Result<(), RegistryError> {
        self.advance(now);
        self.heard_from(now, conn)?;
        self.outputs.push_back(RegistryOutput::Send {
            conn,
            message: FromRegistry::Pong { seq },
        });
        Ok(())
    }

    /// A member leaves cleanly: it is forgotten at once, its connection closed.
    pub fn handle_goodbye(&mut self, now: Instant, conn: ConnId) -> Result<(), RegistryError> {
        self.advance(now);
        let node = *self
            .by_conn
            .get(&conn)
            .ok_or(RegistryError::NotAMember { conn })?;
        self.remove_member(node);
        self.outputs.push_back(RegistryOutput::Close {
            conn,
            reason: format!("{node} left"),
        });
        self.push_members();
        Ok(())
    }

    /// Any message from a connection, dispatched to the `handle_*` above.
    pub fn handle_message(
        &mut self,
        now: Instant,
        conn: ConnId,
        message: ToRegistry,
    ) -> Result<(), RegistryMessageError> {
        match message {
            ToRegistry::Hello(hello) => self.handle_hello(now, conn, hello)?,
            ToRegistry::Request { op, request } => self.handle_request(now, conn, op, request)?,
            ToRegistry::Ping { seq } => self.handle_ping(now, conn, seq)?,
            ToRegistry::Goodbye => self.handle_goodbye(now, conn)?,
            ToRegistry::Proof(proof) => self.handle_proof(now, conn, proof)?,
            ToRegistry::Reclaim {
                op,
                id,
                sizes,
                digest,
            } => self.handle_reclaim(now, conn, op, id, sizes, digest)?,
        }
        Ok(())
    }

    /// `conn` closed (or the driver gave up on it). Its member, if any, is dead.
    pub fn handle_disconnect(&mut self, now: Instant, conn: ConnId) {
        self.advance(now);
        self.handshakes.remove(&conn);
        if let Some(node) = self.by_conn.get(&conn).copied() {
            self.remove_member(node);
            self.push_members();
        }
    }

    /// Time passed: members not heard from within the heartbeat timeout are dead. Calling early
    /// is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        let mut changed = false;
        while let Some(&(at, node)) = self.expiry.first() {
            if at > now {
                break;
            }
            if let Some(member) = self.members.get_mut(&node) {
                if member.expires_at > now {
                    // Heard from since this deadline was filed: file it under its own.
                    self.expiry.remove(&(at, node));
                    member.indexed_expiry = member.expires_at;
                    self.expiry.insert((member.expires_at, node));
                    continue;
                }
            }
            let conn = self.members.get(&node).map(|m| m.conn);
            self.remove_member(node);
            if let Some(conn) = conn {
                self.outputs.push_back(RegistryOutput::Close {
                    conn,
                    reason: format!(
                        "{node} not heard from for {} ms",
                        self.config.heartbeat_timeout.as_millis()
                    ),
                });
            }
            changed = true;
        }
        if changed {
            self.push_members();
        }
        self.grace_timeout(now);
        self.replication_timeout(now);
    }

    // ---- Outputs ----

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<RegistryOutput> {
        self.outputs.pop_front()
    }

    /// When [`Registry::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let expiry = self.expiry.first().map(|&(at, _)| at);
        [
            expiry,
            self.replication.poll_timeout(),
            self.grace_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---- Queries ----

    /// The live members, sorted by node id.
    pub fn members(&self) -> Vec<MemberInfo> {
        self.members.values().map(|m| m.info.clone()).collect()
    }

    /// How many members are live.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// The live members, sorted by node id, as one list to share.
    pub fn member_list(&self) -> MemberList {
        self.members.values().map(|m| m.info.clone()).collect()
    }

    /// Each member's node, incarnation and connection, by node id (no allocation).
    pub fn registrations(&self) -> impl Iterator<Item = (NodeId, u32, ConnId)> + '_ {
        self.members
            .iter()
            .map(|(node, m)| (*node, m.info.incarnation, m.conn))
    }

    /// The member registered as `node`.
    pub fn member(&self, node: NodeId) -> Option<&MemberInfo> {
        self.members.get(&node).map(|m| &m.info)
    }

    /// The connection `node` is registered on.
    pub fn connection_of(&self, node: NodeId) -> Option<ConnId> {
        self.members.get(&node).map(|m| m.conn)
    }

    /// The member registered on `conn`.
    pub fn member_on(&self, conn: ConnId) -> Option<NodeId> {
        self.by_conn.get(&conn).copied()
    }

    /// The nodes listed as holding `id`.
    pub fn holders_of(&self, id: &ObjectId) -> Vec<NodeId> {
        self.holders
            .get(id)
            .map(|h| h.iter().collect())
            .unwrap_or_default()
    }

    /// The digest of the content `id` names while any holder is listed.
    pub fn content_of(&self, id: &ObjectId) -> Option<ContentDigest> {
        self.holders.get(id).map(|h| h.content().1)
    }

    /// Whether `node` has a pending subscription to `id`.
    pub fn is_subscribed(&self, node: NodeId, id: &ObjectId) -> bool {
        self.members
            .get(&node)
            .is_some_and(|m| m.subscribed.contains(id))
    }

    /// When `node`'s subscriptions last changed (or it arrived), if it is a member: equal
    /// stamps of one registry, the same subscriptions.
    pub fn subscriptions_stamp(&self, node: NodeId) -> Option<u64> {
        self.members.get(&node).map(|m| m.subscribed_stamp)
    }

    /// The objects `node` has pending subscriptions to, in id order (empty if not a member).
    pub fn subscriptions_of(&self, node: NodeId) -> impl ExactSizeIterator<Item = &ObjectId> {
        self.members
            .get(&node)
            .map(|m| m.subscribed.iter())
            .unwrap_or_default()
    }

    /// Every (holder, object) pair, for checkers.
    pub fn locations(&self) -> impl Iterator<Item = (NodeId, ObjectId)> + '_ {
        self.holders
            .iter()
            .flat_map(|(id, h)| h.iter().map(move |node| (node, *id)))
    }

    /// How many entries [`Registry::check_invariants`] visits: members, their locations and
    /// subscriptions, held-back requests and replication records (a checker that wants a
    /// change to cost the same whatever the registry holds checks once every so many
    /// changes). Counted from per-member counts: linear in the members, not the objects.
    pub fn invariant_scan_size(&self) -> usize {
        let per_member: usize = (self.members.values())
            .map(|m| 1 + m.published + m.subscribed.len())
            .sum();
        per_member + self.subscribers.len() + self.grace_scan_size() + self.replication_scan_size()
    }

    /// Asserts the registry's internal consistency (a bug if it fails).
    pub fn check_invariants(&self) {
        let mut published: BTreeMap<NodeId, usize> = BTreeMap::new();
        self.holders.check_invariants();
        for (id, holders) in self.holders.iter() {
            let mut previous = None;
            for node in holders.iter() {
                assert!(
                    self.members.contains_key(&node),
                    "{node} holding {id} is a member"
                );
                assert!(
                    previous < Some(node),
                    "holders of {id} sorted, no duplicates"
                );
                previous = Some(node);
                *published.entry(node).or_default() += 1;
            }
            assert!(previous.is_some(), "empty holder list of {id}");
        }
        for node in &self.learners {
            assert!(
                self.members.contains_key(node),
                "learner {node} is a member"
            );
        }
        for (id, subscribers) in &self.subscribers {
            assert!(!subscribers.is_empty(), "empty subscriber set of {id}");
            for node in subscribers {
                let member = self.members.get(node).expect("subscribers are members");
                assert!(
                    member.subscribed.contains(id),
                    "{node} subscription to {id}"
                );
            }
        }
        for (node, member) in &self.members {
            assert_eq!(
                self.by_conn.get(&member.conn),
                Some(node),
                "{node}'s connection"
            );
            assert!(self.expiry.contains(&(member.indexed_expiry, *node)));
            assert!(
                member.indexed_expiry <= member.expires_at,
                "{node}'s filed deadline"
            );
            assert_eq!(
                member.published,
                published.get(node).copied().unwrap_or(0),
                "{node}'s publication count"
            );
            assert!(member.published <= self.config.limits.max_publications_per_node);
            assert!(member.subscribed.len() <= self.config.limits.max_subscriptions_per_node);
        }
        assert_eq!(self.by_conn.len(), self.members.len());
        assert!(self.handshakes.len() <= self.config.limits.max_handshakes);
        assert!(
            self.handshakes
                .keys()
                .all(|c| !self.by_conn.contains_key(c)),
            "a member's connection waits for a proof"
        );
        assert_eq!(self.expiry.len(), self.members.len());
        self.check_replication_invariants();
        self.check_grace_invariants();
    }

    // ---- Rules ----

    fn welcome(&mut self, conn: ConnId, proof: Proof) {
        self.outputs.push_back(RegistryOutput::Send {
            conn,
            message: FromRegistry::Welcome {
                version: PROTOCOL_VERSION,
                proof,
            },
        });
    }

    /// The member list changed: it goes to every member (an empty list to nobody, still
    /// output so drivers can follow the membership from outputs alone).
    fn push_members(&mut self) {
        let conns: Vec<ConnId> = self.members.values().map(|m| m.conn).collect();
        self.members_epoch += 1;
        self.outputs.push_back(RegistryOutput::SendMembers {
            conns,
            members: self.member_list(),
            epoch: self.members_epoch,
        });
    }

    /// The member on `conn`, whose heartbeat deadline moves on. Its filed deadline (the
    /// expiry index) moves only when it fell [`EXPIRY_INDEX_STEP`] behind.
    fn heard_from(&mut self, now: Instant, conn: ConnId) -> Result<NodeId, RegistryError> {
        let node = *self
            .by_conn
            .get(&conn)
            .ok_or(RegistryError::NotAMember { conn })?;
        let member = self.members.get_mut(&node).expect("by_conn names members");
        let expires_at = (now + self.config.heartbeat_timeout).max(member.expires_at);
        member.expires_at = expires_at;
        let step = self.config.heartbeat_timeout / EXPIRY_INDEX_STEP;
        if expires_at.saturating_since(member.indexed_expiry) >= step {
            self.expiry.remove(&(member.indexed_expiry, node));
            member.indexed_expiry = expires_at;
            self.expiry.insert((expires_at, node));
        }
        Ok(node)
    }

    /// Drops a member with its locations and subscriptions; no push.
    fn remove_member(&mut self, node: NodeId) {
        let Some(member) = self.members.remove(&node) else {
            return;
        };
        self.by_conn.remove(&member.conn);
        self.expiry.remove(&(member.indexed_expiry, node));
        self.learners.remove(&node);
        // Its locations: one pass over the objects (members leave seldom; a per-member index
        // of them would double the head's memory per object).
        if member.published > 0 {
            self.holders.withdraw_everywhere(node);
        }
        for id in &member.subscribed {
            self.remove_subscriber(*id, node);
        }
        self.replicas_member_lost(self.now, node);
    }

    fn lookup(&mut self, node: NodeId, id: ObjectId, subscribe: bool) -> Option<DirectoryReply> {
        let (holders, content) = match self.holders.get(&id) {
            Some(holders) => (holders.iter().collect(), Some(holders.content())),
            None => (Vec::new(), None),
        };
        if holders.is_empty() && subscribe {
            let limit = self.config.limits.max_subscriptions_per_node;
            let member = self
                .members
                .get_mut(&node)
                .expect("requests come from members");
            if !member.subscribed.contains(&id) && member.subscribed.len() >= limit {
                return Some(DirectoryReply::Unavailable {
                    reason: format!(
                        "{node} has {limit} pending subscriptions, the most the directory keeps"
                    ),
                });
            }
            member.subscribed.insert(id);
            self.subscription_changes += 1;
            member.subscribed_stamp = self.subscription_changes;
            self.subscribers.entry(id).or_default().insert(node);
        }
        Some(DirectoryReply::Located {
            holders,
            sizes: content.map(|(sizes, _)| sizes),
            digest: content.map(|(_, digest)| digest),
        })
    }

    /// A `LocateCopies`: the holders, as a lookup finds them, and the copies of record.
    fn locate_copies(&mut self, node: NodeId, id: ObjectId) -> DirectoryReply {
        let Some(DirectoryReply::Located {
            holders,
            sizes,
            digest,
        }) = self.lookup(node, id, false)
        else {
            unreachable!("a lookup without a subscription is answered Located");
        };
        let of_record = self
            .copies_of_record(&id)
            .map(|(wanted, holders)| CopiesOfRecord { wanted, holders });
        DirectoryReply::CopiesLocated {
            holders,
            sizes,
            digest,
            of_record,
        }
    }

    fn publish(
        &mut self,
        node: NodeId,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
        fired: &mut Vec<RegistryOutput>,
    ) -> Option<DirectoryReply> {
        let limit = self.config.limits.max_publications_per_node;
        let member = self
            .members
            .get_mut(&node)
            .expect("requests come from members");
        let known = self.holders.get(&id);
        let listed = known.is_some_and(|h| h.contains(node));
        let first_holder = known.is_none();
        if !listed && member.published >= limit {
            return Some(DirectoryReply::Unavailable {
                reason: format!("{node} published {limit} objects, the most the directory keeps"),
            });
        }
        if let Err(conflict) = self.holders.publish(id, node, sizes, digest) {
            if listed {
                // Listed with the id's content, it now holds another: its copy of that
                // content is gone (a withdrawal lost while it was cut off), so it is a holder
                // no more, or lookups would keep sending requesters to a node that refuses.
                self.withdraw(node, id);
            }
            return Some(DirectoryReply::Conflict {
                sizes: conflict.sizes,
                digest: conflict.digest,
            });
        }
        if !listed {
            member.published += 1;
        }
        let subscribers = self.subscribers.remove(&id).unwrap_or_default();
        if !subscribers.is_empty() {
            let event = DirectoryEvent::Published {
                id,
                holder: node,
                sizes,
                digest,
            };
            for &subscriber in &subscribers {
                if let Some(member) = self.members.get_mut(&subscriber) {
                    member.subscribed.remove(&id);
                    self.subscription_changes += 1;
                    member.subscribed_stamp = self.subscription_changes;
                    fired.push(RegistryOutput::Send {
                        conn: member.conn,
                        message: FromRegistry::Event(event.clone()),
                    });
                }
            }
        }
        if first_holder {
            self.tell_learners(node, id, sizes, digest, &subscribers, fired);
        }
        Some(DirectoryReply::Done)
    }

    /// The first holder of `id`: every member that learns locations hears of it, except the
    /// holder and the subscribers just told. Later holders (copies fetched from it) are not
    /// pushed: a first fetch needs one holder, and a broadcast's copies would cost the head a
    /// message per copy and learner; lookups and relays find the copies.
    fn tell_learners(
        &self,
        holder: NodeId,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
        told: &BTreeSet<NodeId>,
        fired: &mut Vec<RegistryOutput>,
    ) {
        for learner in &self.learners {
            if *learner == holder || told.contains(learner) {
                continue;
            }
            if let Some(member) = self.members.get(learner) {
                fired.push(RegistryOutput::Send {
                    conn: member.conn,
                    message: FromRegistry::Event(DirectoryEvent::Located {
                        id,
                        holder,
                        sizes,
                        digest,
                    }),
                });
            }
        }
    }

    fn withdraw(&mut self, node: NodeId, id: ObjectId) {
        if self.holders.withdraw(&id, node) {
            if let Some(member) = self.members.get_mut(&node) {
                member.published -= 1;
            }
        }
        self.replica_withdrawn(self.now, node, id);
    }

    fn unsubscribe(&mut self, node: NodeId, id: ObjectId) {
        if let Some(member) = self.members.get_mut(&node) {
            member.subscribed.remove(&id);
            self.subscription_changes += 1;
            member.subscribed_stamp = self.subscription_changes;
        }
        self.remove_subscriber(id, node);
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

/// Why [`Registry::handle_message`] did not serve a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryMessageError {
    /// A hello was refused.
    #[error("hello refused: {0}")]
    Refused(#[from] HelloRefused),
    /// A message from a connection that is not a member's.
    #[error(transparent)]
    NotAMember(#[from] RegistryError),
}
