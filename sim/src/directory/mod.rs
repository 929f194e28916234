//! The real directory behind a simulated link: the core's [`Registry`] as the head, one core
//! [`DirectorySession`] per node, and a model of the connections between them.
//!
//! A connection carries messages in order with the directory latency. Faults: the head crashes
//! (its registry state is lost; nodes notice after the detection delay or, when the crash is
//! silent, by their heartbeat timeout, and re-register with backoff); a node is partitioned from
//! the head (messages both ways vanish, connection attempts fail; both sides find out by
//! heartbeat); a push is lost (its connection breaks with it; both sides notice after the
//! detection delay); a shard of a sharded directory fails over (its replica, which lacks the
//! master's last writes, answers after a while; see [`shard`]). The cluster turns [`Effect`]s
//! into scheduled events and hands [`DirEvent`]s back when they are due.
//!
//! Checks kept here, because only here both ends are visible:
//! - **no forgotten subscription**: a node whose fetch waits on a publication (its subscribing
//!   lookup found nobody, and neither the event nor an unsubscribe came since) must have that
//!   subscription known to its session, and, while the session is registered and done
//!   replaying on the connection the registry holds, known to the registry, unless the event
//!   is already on its way;
//! - **dead nodes vanish in time**: no member (and so none of its locations) is listed longer
//!   than the registry's heartbeat timeout after its connection was last heard from;
//! - **members converge** once faults stop: every live node registered with its current
//!   incarnation, its replay done, its member list equal to the registry's, and its
//!   publications listed.

mod checks;
mod link;
pub mod shard;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;

use skyriver_core::directory::{
    DirectoryEvent, DirectoryNotice, DirectoryOpId, DirectoryReply, DirectoryRequest, MemberInfo,
    MemberList,
};
use skyriver_core::ids::OBJECT_ID_LEN;
use skyriver_core::registry::session::{DirectorySession, SessionConfig, SessionOutput};
use skyriver_core::registry::{
    ConnId, FromRegistry, Registry, RegistryConfig, RegistryOutput, ToRegistry,
};
use skyriver_core::{Instant, NodeId, ObjectId};

/// How the simulated directory behaves, drawn from the seed.
#[derive(Debug, Clone)]
pub struct DirectoryParams {
    /// One-way latency between a node and the head, ns.
    pub latency_ns: u64,
    /// Time for a broken connection to be noticed (a reset), ns.
    pub detect_ns: u64,
    /// The registry's heartbeat timeout.
    pub registry_heartbeat_timeout: Duration,
    /// The nodes' session settings.
    pub session: SessionConfig,
    /// Probability (per million) that a pushed event is lost with its connection, while faults
    /// are on.
    pub lost_push_ppm: u32,
    /// The registry's replication limits.
    pub replication: skyriver_core::registry::ReplicationLimits,
    /// Each node's failure domain as its hello names it, by node (none: empty).
    pub failure_domains: Vec<String>,
    /// A shard of a sharded directory that fails over (see [`shard`]): how far its replica
    /// trails its master, ns, and how many failovers the run plans for it. `None`: the one
    /// head of an unsharded directory, or a shard that does not fail over.
    pub replica: Option<(u64, u32)>,
}

/// Something due at a time, handed back to [`SimDirectory::handle`].
#[derive(Debug)]
pub enum DirEvent {
    /// A message reaches the head.
    ToHead {
        /// The connection it came on.
        conn: ConnId,
        /// The head it was sent to (void if the head crashed since).
        head_epoch: u64,
        /// The message.
        message: ToRegistry,
    },
    /// A message reaches a node.
    ToNode {
        /// The node.
        node: NodeId,
        /// Its incarnation when it was sent.
        inc: u32,
        /// The connection it came on.
        conn: ConnId,
        /// The message.
        message: FromRegistry,
    },
    /// The head side of a connection finds it closed.
    HeadSeesClosed {
        /// The connection.
        conn: ConnId,
        /// The head that owned it.
        head_epoch: u64,
    },
    /// The node side of a connection finds it closed.
    NodeSeesClosed {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        inc: u32,
        /// The connection.
        conn: ConnId,
    },
    /// A connection attempt of a node completes.
    Connected {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        inc: u32,
        /// The new connection, `None` when the head was unreachable.
        conn: Option<ConnId>,
        /// The head it reached.
        head_epoch: u64,
    },
    /// A session's timer.
    SessionTimer {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        inc: u32,
    },
    /// The registry's timer.
    RegistryTimer {
        /// The head that set it.
        head_epoch: u64,
    },
    /// Fault: the head crashes or comes back (with an empty registry).
    Head {
        /// Back (`true`) or crashing.
        up: bool,
        /// A crash nodes learn of only by heartbeat (a host crash), not by a reset.
        silent: bool,
    },
    /// Fault: a shard's master dies (`up == false`), or its replica answers as master (see
    /// [`shard`]).
    Failover {
        /// Answering again.
        up: bool,
    },
    /// Fault: a node is cut off from the head, or reconnected.
    HeadPartition {
        /// The node.
        node: NodeId,
        /// Cut off (`true`) or healed.
        on: bool,
    },
}

/// What the cluster must do for the directory.
#[derive(Debug)]
pub enum Effect {
    /// Schedule an event.
    Schedule {
        /// When.
        at: Instant,
        /// What.
        event: DirEvent,
        /// Heartbeats: they do not keep a run going.
        background: bool,
    },
    /// Give a notice (a reply or an event) to a node's core now.
    Notice {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        inc: u32,
        /// The notice.
        notice: DirectoryNotice,
    },
    /// A trace line.
    Trace(String),
}

/// One node's end: its session and its current connection.
#[derive(Debug)]
struct NodeEnd {
    inc: u32,
    session: DirectorySession,
    conn: Option<ConnId>,
    /// Requests of the core held until the first welcome of this incarnation (a daemon serves
    /// only once registered).
    held: Vec<(DirectoryOpId, DirectoryRequest)>,
    welcomed_once: bool,
    timer_at: Option<Instant>,
    members: MemberList,
    /// Subscribing lookups of the core in flight: op → object.
    lookups: BTreeMap<DirectoryOpId, ObjectId>,
    /// Objects a fetch of the core waits to see published.
    relied: BTreeSet<ObjectId>,
    /// What the checks accounted for of the subscriptions of its session and of the registry.
    known: checks::SubscriptionsKnown,
}

/// What a violation is about, so each is reported once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ViolationKey {
    Outlived(NodeId, ConnId),
    SessionForgot(NodeId, ObjectId),
    RegistryForgot(NodeId, ObjectId, ConnId),
}

/// The head and every node's directory session.
#[derive(Debug)]
pub struct SimDirectory {
    /// Violations already reported.
    reported: BTreeSet<ViolationKey>,
    params: DirectoryParams,
    cluster_token: skyriver_core::auth::ClusterToken,
    registry: Option<Registry>,
    /// Changes at every head crash: messages and timers of an older head are void.
    head_epoch: u64,
    registry_timer_at: Option<Instant>,
    ends: BTreeMap<NodeId, NodeEnd>,
    next_conn: u64,
    /// Connections that are broken (one side closed or a push was lost with them).
    broken: BTreeSet<ConnId>,
    /// The owner of each connection.
    owners: BTreeMap<ConnId, (NodeId, u32)>,
    /// When the head last heard from each connection.
    last_heard: BTreeMap<ConnId, Instant>,
    /// What the checks look at again after each event (see `checks.rs`).
    watch: checks::CheckWatch,
    /// When the registry's own consistency is asserted next.
    registry_checks: checks::RegistryChecks,
    partitioned: BTreeSet<NodeId>,
    /// Published events on their way to a node's core, per (node, object).
    events_in_flight: BTreeMap<(NodeId, ObjectId), u32>,
    /// The copies of record the registry counted when it sent each `Surplus` on its way, per
    /// (node, object): what its decision rested on (a holder may expire before it arrives).
    surplus_counted: BTreeMap<(NodeId, ObjectId), Vec<NodeId>>,
    /// Counters for the summary.
    pub stats: DirectoryStats,
    /// The planted flaw `unguarded_head_restarts`: a restarted head keeps no grace period
    /// (it is not told it restarted, and hellos do not say a node returns), and a node never
    /// hears that its replayed publication was refused.
    pub unguarded_restarts: bool,
    /// The planted flaw `registry_forgets_subscriptions` (see `Flaws`).
    pub forgets_subscriptions: bool,
    /// A shard of a sharded directory: its replica, for failovers.
    shard: Option<shard::ShardState>,
}

/// Directory fault and traffic counters of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    /// Head crashes.
    pub head_crashes: u64,
    /// Partitions between a node and the head.
    pub head_partitions: u64,
    /// Pushed events lost (with their connection).
    pub lost_pushes: u64,
    /// Members the registry dropped for silence.
    pub heartbeat_expiries: u64,
    /// Sessions that re-registered after losing the head.
    pub reconnects: u64,
    /// Failovers of a shard of a sharded directory.
    pub failovers: u64,
}

impl DirectoryStats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &DirectoryStats) {
        self.head_crashes += other.head_crashes;
        self.head_partitions += other.head_partitions;
        self.lost_pushes += other.lost_pushes;
        self.heartbeat_expiries += other.heartbeat_expiries;
        self.reconnects += other.reconnects;
        self.failovers += other.failovers;
    }
}

/// Where a simulated node's fabric listens (what the directory lists, and where peers dial).
pub(crate) fn fabric_addr(node: NodeId) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([10, 0, (node.0 >> 8) as u8, node.0 as u8], 7000))
}

fn member_info(node: NodeId, inc: u32, failure_domain: String) -> MemberInfo {
    MemberInfo {
        node,
        fabric_addr: fabric_addr(node),
        fabric: "sim".into(),
        incarnation: inc,
        failure_domain,
    }
}

/// A head's registry with the run's replication limits.
pub(super) fn new_registry(
    config: RegistryConfig,
    replication: skyriver_core::registry::ReplicationLimits,
) -> Registry {
    let mut registry = Registry::new(config);
    registry.set_replication_limits(replication);
    registry
}

/// How long a restarted head's grace period lasts: a returning node notices the lost head
/// within its session timeout, tries again within its longest backoff (twice, should the
/// first try meet a head still down), and replays after a handshake of a few trips.
pub(super) fn restart_grace(params: &DirectoryParams) -> Duration {
    params.session.heartbeat_timeout
        + params.session.reconnect_backoff_max * 2
        + Duration::from_nanos(params.latency_ns * 10)
}

/// A nonce key per head epoch or node incarnation: fixed, so runs replay exactly, and distinct,
/// so no two parties' nonces coincide.
fn sim_nonce_key(party: u8, id: u64, incarnation: u32) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[0] = party;
    key[1..9].copy_from_slice(&id.to_le_bytes());
    key[9..13].copy_from_slice(&incarnation.to_le_bytes());
    key
}

impl SimDirectory {
    /// One-way latency between a node and this head, ns: a reply a node hears at `t` left
    /// the registry at `t` minus it.
    pub fn latency_ns(&self) -> u64 {
        self.params.latency_ns
    }

    /// A head serving `nodes` (each at incarnation 0), registered before time starts, as a
    /// cluster whose daemons all joined before the workload.
    pub fn formed(params: DirectoryParams, nodes: usize, now: Instant) -> (Self, Vec<Effect>) {
        let cluster_token = skyriver_core::auth::ClusterToken::new("sim-cluster-token");
        let config = RegistryConfig {
            cluster_token: cluster_token.clone(),
            nonce_key: sim_nonce_key(b'h', 0, 0),
            heartbeat_timeout: params.registry_heartbeat_timeout,
            limits: Default::default(),
        };
        let mut directory = SimDirectory {
            reported: BTreeSet::new(),
            shard: params
                .replica
                .map(|(lag, failovers)| shard::ShardState::new(lag, failovers, config.clone())),
            registry: Some(new_registry(config, params.replication)),
            params,
            cluster_token,
            head_epoch: 0,
            registry_timer_at: None,
            ends: BTreeMap::new(),
            next_conn: 0,
            broken: BTreeSet::new(),
            owners: BTreeMap::new(),
            last_heard: BTreeMap::new(),
            watch: checks::CheckWatch::default(),
            registry_checks: checks::RegistryChecks::default(),
            partitioned: BTreeSet::new(),
            events_in_flight: BTreeMap::new(),
            surplus_counted: BTreeMap::new(),
            stats: DirectoryStats::default(),
            unguarded_restarts: false,
            forgets_subscriptions: false,
        };
        for n in 0..nodes as u32 {
            directory.add_end(NodeId(n), 0, now);
        }
        // Instant hand-over: every session connects and the registry answers at once.
        loop {
            let mut progressed = false;
            for n in 0..nodes as u32 {
                let node = NodeId(n);
                let end = directory.ends.get_mut(&node).expect("added");
                while let Some(output) = end.session.poll_output() {
                    progressed = true;
                    match output {
                        SessionOutput::Connect => {
                            directory.next_conn += 1;
                            let conn = ConnId(directory.next_conn);
                            end.conn = Some(conn);
                            directory.owners.insert(conn, (node, 0));
                            end.session.handle_connected(now);
                        }
                        SessionOutput::Send(message) => {
                            let conn = end.conn.expect("connected");
                            directory.last_heard.insert(conn, now);
                            let input = shard::RegistryInput::Message(conn, message);
                            if let Some(shard) = directory.shard.as_mut() {
                                shard.log(now, &input);
                            }
                            let registry = directory.registry.as_mut().expect("up");
                            input.apply(registry, now);
                        }
                        SessionOutput::Notice(DirectoryNotice::Members(members)) => {
                            end.members = members
                        }
                        SessionOutput::Notice(_) => {}
                        SessionOutput::Disconnect { reason } => {
                            panic!("{node} could not join the simulated head: {reason}")
                        }
                    }
                }
            }
            let registry = directory.registry.as_mut().expect("up");
            // Only the last member list of a round reaches the sessions: while nodes only
            // join, it lists everyone the earlier ones did, to every connection they went to
            // (delivering each would cost N lists of N members per join).
            let mut last_members = None;
            let mut deliver = |conn: ConnId, message: FromRegistry| {
                let (node, _) = directory.owners[&conn];
                let end = directory.ends.get_mut(&node).expect("owner");
                end.session
                    .handle_message(now, message)
                    .expect("a fresh registry welcomes every node");
            };
            while let Some(output) = registry.poll_output() {
                progressed = true;
                match output {
                    RegistryOutput::Send { conn, message } => deliver(conn, message),
                    RegistryOutput::SendMembers {
                        conns,
                        members,
                        epoch,
                    } => {
                        last_members = Some((conns, members, epoch));
                    }
                    RegistryOutput::Close { reason, .. } => {
                        panic!("the simulated head closed a joining node: {reason}")
                    }
                }
            }
            if let Some((conns, members, epoch)) = last_members {
                for conn in conns {
                    let members = members.clone();
                    deliver(conn, FromRegistry::Members { epoch, members });
                }
            }
            if !progressed {
                break;
            }
        }
        directory.watch_every_connection();
        let mut effects = Vec::new();
        for n in 0..nodes as u32 {
            let end = directory.ends.get_mut(&NodeId(n)).expect("added");
            end.welcomed_once = true;
            // The cores hear what their sessions learnt while joining.
            for notice in [
                DirectoryNotice::Health(Ok(())),
                DirectoryNotice::Members(end.members.clone()),
            ] {
                effects.push(Effect::Notice {
                    node: NodeId(n),
                    inc: 0,
                    notice,
                });
            }
            directory.reschedule_session(now, NodeId(n), &mut effects);
        }
        directory.reschedule_registry(&mut effects);
        (directory, effects)
    }

    fn add_end(&mut self, node: NodeId, inc: u32, now: Instant) {
        let mut session = DirectorySession::new(
            self.params.session.clone(),
            member_info(
                node,
                inc,
                self.params
                    .failure_domains
                    .get(node.0 as usize)
                    .cloned()
                    .unwrap_or_default(),
            ),
            self.cluster_token.clone(),
            sim_nonce_key(b'n', node.0 as u64, inc),
            now,
        );
        session.handle_timeout(now);
        self.watch.new_end(node);
        let known = checks::SubscriptionsKnown::of(&session);
        self.ends.insert(
            node,
            NodeEnd {
                inc,
                session,
                conn: None,
                held: Vec::new(),
                welcomed_once: false,
                timer_at: None,
                members: MemberList::default(),
                lookups: BTreeMap::new(),
                relied: BTreeSet::new(),
                known,
            },
        );
    }

    // ---- Hooks of the cluster ----

    /// `node` restarted as incarnation `inc`: a fresh session starts joining.
    pub fn node_started(&mut self, now: Instant, node: NodeId, inc: u32) -> Vec<Effect> {
        self.watch.touch(node);
        self.add_end(node, inc, now);
        let mut effects = Vec::new();
        self.pump_session(now, node, &mut effects);
        effects
    }

    /// `node` crashed. Unless `silent`, the head sees its connection reset after the
    /// detection delay; otherwise only its heartbeat timeout tells.
    pub fn node_crashed(&mut self, now: Instant, node: NodeId, silent: bool) -> Vec<Effect> {
        self.watch.touch(node);
        let mut effects = Vec::new();
        let Some(end) = self.ends.remove(&node) else {
            return effects;
        };
        self.events_in_flight.retain(|(n, _), _| *n != node);
        if let Some(conn) = end.conn {
            if !silent && !self.partitioned.contains(&node) && self.broken.insert(conn) {
                effects.push(Effect::Schedule {
                    at: Instant(now.0 + self.params.detect_ns),
                    event: DirEvent::HeadSeesClosed {
                        conn,
                        head_epoch: self.head_epoch,
                    },
                    background: false,
                });
            }
            self.broken.insert(conn);
        }
        effects
    }

    /// The core of `node` asks the directory something.
    pub fn submit(
        &mut self,
        now: Instant,
        node: NodeId,
        op: DirectoryOpId,
        request: DirectoryRequest,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.watch.touch(node);
        let Some(end) = self.ends.get_mut(&node) else {
            return effects;
        };
        match &request {
            DirectoryRequest::Lookup {
                id,
                subscribe: true,
            } => {
                end.lookups.insert(op, *id);
            }
            DirectoryRequest::Unsubscribe { id } => {
                // As the session does: a subscribing lookup still in flight no longer counts.
                end.relied.remove(id);
                end.known.session_hint = Some(*id);
                self.watch.changed(node, *id);
                end.lookups.retain(|_, object| object != id);
            }
            _ => {}
        }
        if !end.welcomed_once {
            end.held.push((op, request));
            return effects;
        }
        end.session.handle_submit(now, op, request);
        self.pump_session(now, node, &mut effects);
        effects
    }

    /// A notice is about to reach `node`'s core: keeps what the checks need.
    pub fn delivering(&mut self, node: NodeId, notice: &DirectoryNotice) {
        self.watch.touch(node);
        let Some(end) = self.ends.get_mut(&node) else {
            return;
        };
        match notice {
            DirectoryNotice::Reply { op, reply } => {
                if let Some(id) = end.lookups.remove(op) {
                    if matches!(reply, DirectoryReply::Located { holders, .. } if holders.is_empty())
                    {
                        end.relied.insert(id);
                        self.watch.changed(node, id);
                    }
                }
            }
            DirectoryNotice::Event(DirectoryEvent::Published { id, .. }) => {
                end.relied.remove(id);
                self.watch.changed(node, *id);
                if let Some(count) = self.events_in_flight.get_mut(&(node, *id)) {
                    *count -= 1;
                    if *count == 0 {
                        self.events_in_flight.remove(&(node, *id));
                    }
                }
            }
            _ => {}
        }
    }

    /// Something due now.
    pub fn handle(
        &mut self,
        now: Instant,
        event: DirEvent,
        rng: &mut ChaCha8Rng,
        faults_on: bool,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.touch_event(&event);
        match event {
            DirEvent::ToHead {
                conn,
                head_epoch,
                message,
            } => {
                if head_epoch != self.head_epoch || self.broken.contains(&conn) {
                    return effects;
                }
                if let Some((node, _)) = self.owners.get(&conn) {
                    if self.partitioned.contains(node) {
                        self.broken.insert(conn);
                        return effects;
                    }
                }
                if self.registry.is_none() {
                    self.held_by_failover(conn, &message);
                    return effects;
                }
                self.heard(conn, now);
                let forgotten = match &message {
                    ToRegistry::Request {
                        op,
                        request:
                            DirectoryRequest::Lookup {
                                id,
                                subscribe: true,
                            },
                    } if self.forgets_subscriptions && id.0[OBJECT_ID_LEN - 1] % 4 == 0 => {
                        Some(ToRegistry::Request {
                            op: *op,
                            request: DirectoryRequest::Unsubscribe { id: *id },
                        })
                    }
                    _ => None,
                };
                // A subscription of the sender that changes is accounted for by its object.
                let subscription = match &message {
                    ToRegistry::Request {
                        request:
                            DirectoryRequest::Lookup {
                                id,
                                subscribe: true,
                            }
                            | DirectoryRequest::Unsubscribe { id },
                        ..
                    } => self.owners.get(&conn).map(|&(node, _)| (node, *id)),
                    _ => None,
                };
                let registry = self.registry.as_ref().expect("up");
                let stamp_before =
                    subscription.and_then(|(node, _)| registry.subscriptions_stamp(node));
                self.registry_input(now, shard::RegistryInput::Message(conn, message));
                if let Some(unsubscribe) = forgotten {
                    self.registry_input(now, shard::RegistryInput::Message(conn, unsubscribe));
                }
                if let Some((node, id)) = subscription {
                    self.account_registry_change(node, id, stamp_before);
                }
                self.pump_registry(now, rng, faults_on, &mut effects);
            }
            DirEvent::ToNode {
                node,
                inc,
                conn,
                message,
            } => {
                let event_id = match &message {
                    FromRegistry::Event(DirectoryEvent::Published { id, .. }) => Some(*id),
                    _ => None,
                };
                if self.partitioned.contains(&node) {
                    self.broken.insert(conn);
                }
                let delivered = self.ends.get(&node).is_some_and(|end| {
                    end.inc == inc && end.conn == Some(conn) && !self.broken.contains(&conn)
                });
                if let Some(id) = event_id {
                    self.event_landed(node, id);
                }
                if !delivered {
                    return effects;
                }
                let end = self.ends.get_mut(&node).expect("checked");
                end.known.session_hint = event_id;
                if let Err(error) = end.session.handle_message(now, message) {
                    effects.push(Effect::Trace(format!("{node}: directory session: {error}")));
                }
                self.pump_session(now, node, &mut effects);
            }
            DirEvent::HeadSeesClosed { conn, head_epoch } => {
                if head_epoch == self.head_epoch {
                    if let Some(registry) = self.registry.as_mut() {
                        if let Some(&(node, _)) = self.owners.get(&conn) {
                            if registry.connection_of(node) == Some(conn) {
                                effects.push(Effect::Trace(format!(
                                    "directory: session of {node} expired"
                                )));
                            }
                        }
                        self.registry_input(now, shard::RegistryInput::Disconnect(conn));
                        self.pump_registry(now, rng, faults_on, &mut effects);
                    }
                }
            }
            DirEvent::NodeSeesClosed { node, inc, conn } => {
                let Some(end) = self.ends.get_mut(&node) else {
                    return effects;
                };
                if end.inc == inc && end.conn == Some(conn) {
                    end.conn = None;
                    end.session.handle_disconnected(now, "connection reset");
                    self.pump_session(now, node, &mut effects);
                }
            }
            DirEvent::Connected {
                node,
                inc,
                conn,
                head_epoch,
            } => {
                let Some(end) = self.ends.get_mut(&node) else {
                    return effects;
                };
                if end.inc != inc {
                    return effects;
                }
                let usable = head_epoch == self.head_epoch
                    && self.registry.is_some()
                    && !self.partitioned.contains(&node);
                match conn {
                    Some(conn) if usable => {
                        end.conn = Some(conn);
                        end.session.handle_connected(now);
                    }
                    _ => end
                        .session
                        .handle_connect_failed(now, "the head is unreachable"),
                }
                self.pump_session(now, node, &mut effects);
            }
            DirEvent::SessionTimer { node, inc } => {
                let Some(end) = self.ends.get_mut(&node) else {
                    return effects;
                };
                if end.inc != inc {
                    return effects;
                }
                if end.timer_at.is_some_and(|at| at <= now) {
                    end.timer_at = None;
                }
                end.session.handle_timeout(now);
                self.pump_session(now, node, &mut effects);
            }
            DirEvent::RegistryTimer { head_epoch } => {
                if head_epoch != self.head_epoch {
                    return effects;
                }
                if self.registry_timer_at.is_some_and(|at| at <= now) {
                    self.registry_timer_at = None;
                }
                if let Some(registry) = self.registry.as_ref() {
                    let before = registry.member_count();
                    self.registry_input(now, shard::RegistryInput::Timeout);
                    let after = self.registry.as_ref().expect("up").member_count();
                    self.stats.heartbeat_expiries += (before - after) as u64;
                    self.pump_registry(now, rng, faults_on, &mut effects);
                }
            }
            DirEvent::Head { up: false, silent } => {
                let Some(registry) = self.registry.take() else {
                    return effects;
                };
                self.registry_checks.settle(&registry);
                self.stats.head_crashes += 1;
                self.head_epoch += 1;
                self.registry_timer_at = None;
                effects.push(Effect::Trace(format!(
                    "FAULT directory head crashes{}, its registry lost",
                    if silent { " silently" } else { "" }
                )));
                let ends: Vec<(NodeId, u32, Option<ConnId>)> =
                    self.ends.iter().map(|(n, e)| (*n, e.inc, e.conn)).collect();
                for (node, inc, conn) in ends {
                    let Some(conn) = conn else { continue };
                    self.broken.insert(conn);
                    if !silent && !self.partitioned.contains(&node) {
                        effects.push(Effect::Schedule {
                            at: Instant(now.0 + self.params.detect_ns),
                            event: DirEvent::NodeSeesClosed { node, inc, conn },
                            background: false,
                        });
                    }
                }
            }
            DirEvent::Head { up: true, .. } => {
                if self.registry.is_none() {
                    // The head crashed while its shard failed over (the master already dead,
                    // so the crash found no registry to take): the replica being promoted is
                    // lost too, and the shard comes back empty. A restart like any other,
                    // counted as one (what forgets records).
                    if self.shard.as_ref().is_some_and(|s| s.failing_over()) {
                        self.stats.head_crashes += 1;
                    }
                    effects.push(Effect::Trace(
                        "FAULT directory head back, with an empty registry".into(),
                    ));
                    let config = RegistryConfig {
                        cluster_token: self.cluster_token.clone(),
                        nonce_key: sim_nonce_key(b'h', self.head_epoch, 0),
                        heartbeat_timeout: self.params.registry_heartbeat_timeout,
                        limits: Default::default(),
                    };
                    if let Some(shard) = self.shard.as_mut() {
                        shard.restarted(config.clone());
                    }
                    self.registry = Some(new_registry(config, self.params.replication));
                    if !self.unguarded_restarts {
                        // The simulated operator knows the head restarted (see
                        // `registry::grace`).
                        let grace = restart_grace(&self.params);
                        self.registry_input(now, shard::RegistryInput::Grace(grace));
                    }
                }
            }
            DirEvent::Failover { up } => {
                self.failover(now, up, rng, faults_on, &mut effects);
            }
            DirEvent::HeadPartition { node, on } => {
                if on {
                    self.stats.head_partitions += 1;
                    self.partitioned.insert(node);
                    effects.push(Effect::Trace(format!("FAULT partition {node} / head")));
                } else {
                    self.partitioned.remove(&node);
                    effects.push(Effect::Trace(format!(
                        "FAULT healed partition {node} / head"
                    )));
                    // A connection the head closed meanwhile is reset at the node's next send;
                    // the node learns it by its heartbeat timeout at the latest.
                }
            }
        }
        effects
    }
}
