//! One node's whole sans-IO logic: its [`Store`], the fetch manager and both ends of the
//! transfer protocol. The daemon and the simulator drive this very type.
//!
//! The interface is narrow, in the style of quinn-proto and str0m:
//!
//! * inputs are `handle_*` calls, each carrying `now`: a client's fetch
//!   ([`Node::handle_fetch`]), a peer's message ([`Node::handle_peer_message`] or
//!   [`Node::handle_peer_bytes`]), a READ completion, a peer connected or lost, a directory reply
//!   or event, and timers ([`Node::handle_timeout`]);
//! * outputs are [`NodeOutput`] values drained with [`Node::poll_output`]; the next instant at
//!   which the node wants [`Node::handle_timeout`] is [`Node::poll_timeout`].
//!
//! **Driver contract.** After every input, drain `poll_output()` and carry out every output, in
//! order, before giving the node its next input. `SendEager` in particular names a region of
//! a sealed object whose bytes the driver gathers right then. Every posted READ gets exactly one
//! completion (success or error, also when the connection breaks), and the local region it writes
//! stays untouched by the core until then. Local clients use the store through
//! [`Node::store_mut`]; the node learns of seals and deletes from the store's events.

mod clients;
mod driver;
mod fetch;
mod locations;
pub mod threshold;
mod timers;
mod transfer;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::client_protocol::Response;
use crate::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use crate::error::StoreError;
use crate::ids::{ArenaId, ClientId, NodeId, ObjectId, RequestId, TransferId};
use crate::region::{LocalRegion, RemoteRegion};
use crate::store::{
    DurableChange, ObjectEvent, RecoveredObject, RecoveryReport, Store, StoreConfig, StoreOutput,
};
use crate::time::Instant;
use crate::wire::{self, EagerHeader, ObjectSizes, PeerMessage, WireError};

pub use clients::{ClusterMember, MAX_PARKED_CREATES};
pub use driver::NodeDriver;
use fetch::{FetchWaiter, FetchWaiterId, ObjectFetch};
use locations::LocationCache;
pub use threshold::{EagerThreshold, PathCosts, ThresholdPolicy, ThresholdSource};
use transfer::{Incoming, Lease};

/// The store client the node uses for objects it is fetching: it creates them, and seals or
/// aborts them. Drivers must not give a local client this id.
pub const FETCH_CLIENT: ClientId = ClientId(u64::MAX);

/// A READ posted by this node, echoed in its completion.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ReadOpId(pub u64);

impl fmt::Display for ReadOpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "read-{}", self.0)
    }
}

/// How the fabric names one arena for one-sided READs: the base address its registration starts
/// at and the key that grants access. The driver registers each arena once, at start, and gives
/// the node this table, so the core computes a [`RemoteRegion`] for any [`LocalRegion`] itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaKey {
    /// Address of the arena's first byte in the registration (verbs: virtual address).
    pub base_addr: u64,
    /// Remote key of the registration.
    pub rkey: u32,
}

/// What the driver knows about a peer when the connection is up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerParams {
    /// Queue pairs (lanes) to this peer; READs are spread over them. At least one.
    pub lanes: u16,
    /// Measured costs of the eager and READ paths to this peer.
    pub costs: PathCosts,
}

/// Configuration of a node. Every queue and retry is bounded by one of these.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node.
    pub node: NodeId,
    /// Distinguishes this run of the node from earlier ones (a restart): the high half of every
    /// [`TransferId`] it chooses, so a holder never confuses a new transfer with an old lease.
    pub incarnation: u32,
    /// The local store.
    pub store: StoreConfig,
    /// Registration of each arena for one-sided READs.
    pub region_keys: BTreeMap<ArenaId, ArenaKey>,
    /// Size of each pre-posted receive slot, in bytes (header included).
    pub receive_slot_bytes: u32,
    /// Most `EagerData` messages for one object.
    pub max_eager_chunks: u32,
    /// Eager threshold policy.
    pub threshold: ThresholdPolicy,
    /// Size of one READ, in bytes.
    pub read_slice_bytes: u64,
    /// Most READs outstanding per transfer.
    pub max_outstanding_reads: u32,
    /// Bytes of objects being transferred in at once; a single larger object may go alone.
    pub max_bytes_in_flight: u64,
    /// Most client fetches waiting at once.
    pub max_pending_fetches: usize,
    /// Most objects this node keeps pinned for requesters at once (more get `Busy`).
    pub max_leases: usize,
    /// How long a holder keeps an object pinned without a `Finish`.
    pub lease: Duration,
    /// How long a requester waits for a holder's reply (and for all eager chunks).
    pub reply_timeout: Duration,
    /// How long a directory operation may take before it is retried.
    pub directory_timeout: Duration,
    /// Most tries of one directory operation (lookup, publish, withdraw).
    pub max_directory_attempts: u32,
    /// Rounds over an object's holders (each a lookup and a try of every holder) before a fetch
    /// gives up.
    pub max_source_rounds: u32,
    /// Pause before retrying after a failure; grows linearly with the attempt.
    pub retry_backoff: Duration,
    /// Objects whose holders the node remembers from the directory, so fetching one again
    /// skips the lookup (0: always ask the directory).
    pub location_cache_entries: usize,
    /// The node is in no cluster (no directory, no peers): fetches of objects not here fail at
    /// once with [`FetchError::NoCluster`].
    pub standalone: bool,
    /// How long a fetch that does not wait for a publication still waits when the directory
    /// lists no holder: covers a seal on another node whose publication is still on its way.
    pub publication_grace: Duration,
    /// Replies to requests that changed what is durable (seal, delete, eviction) wait until
    /// [`Node::handle_persisted`] says the change is (`--durability seal`).
    pub hold_replies_until_durable: bool,
    /// The fabric's name, for `nodes` replies (`none` without one).
    pub fabric_name: String,
    /// Where this node's fabric listens, for `nodes` replies (`-` without one).
    pub fabric_address: String,
    /// The directory, described without secrets, for `nodes` replies.
    pub directory_name: String,
}

impl NodeConfig {
    /// Defaults for a node with one arena of `capacity_bytes`.
    pub fn new(node: NodeId, capacity_bytes: u64) -> Self {
        Self {
            node,
            incarnation: 0,
            store: StoreConfig::single_arena(capacity_bytes),
            region_keys: BTreeMap::new(),
            receive_slot_bytes: 64 * 1024,
            max_eager_chunks: 4,
            threshold: ThresholdPolicy::default(),
            read_slice_bytes: 1 << 20,
            max_outstanding_reads: 16,
            max_bytes_in_flight: 1 << 30,
            max_pending_fetches: 4096,
            max_leases: 1024,
            lease: Duration::from_secs(10),
            reply_timeout: Duration::from_secs(5),
            directory_timeout: Duration::from_secs(2),
            max_directory_attempts: 8,
            max_source_rounds: 3,
            retry_backoff: Duration::from_millis(10),
            location_cache_entries: 65_536,
            standalone: false,
            publication_grace: Duration::from_millis(1500),
            hold_replies_until_durable: false,
            fabric_name: "none".into(),
            fabric_address: "-".into(),
            directory_name: "none (standalone)".into(),
        }
    }

    /// Payload bytes one `EagerData` carries in one receive slot.
    pub fn eager_chunk_bytes(&self) -> u64 {
        (self.receive_slot_bytes as u64)
            .saturating_sub((wire::HEADER_BYTES + wire::EAGER_FIXED_BYTES) as u64)
            .min((wire::MAX_MESSAGE_BYTES - wire::HEADER_BYTES - wire::EAGER_FIXED_BYTES) as u64)
    }

    /// Largest object the receive slots can take eagerly.
    pub fn eager_capacity_bytes(&self) -> u64 {
        self.eager_chunk_bytes() * self.max_eager_chunks as u64
    }
}

/// Why a READ failed, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The queue pair went to the error state (retry exceeded, flushed, ...).
    #[error("queue pair error: {0}")]
    QueuePair(String),
    /// The remote side refused access (bad rkey or range): the region is no longer exposed.
    #[error("remote access error (region not exposed or bad rkey)")]
    RemoteAccess,
    /// The connection to the peer is gone; the READ was flushed.
    #[error("connection lost")]
    ConnectionLost,
}

/// How a fetch moves an object's bytes, chosen per fetch by the client.
///
/// Coalesced fetches of one object share one transfer: the mode of the fetch that started it
/// applies.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum TransferMode {
    /// Eager up to the peer's threshold (cost model or `--eager-threshold`), rendezvous above.
    #[default]
    Auto,
    /// Eager whenever the receive slots can carry the object; rendezvous above that.
    Eager,
    /// Rendezvous (one-sided READ) for every object that has bytes.
    Rendezvous,
}

impl TransferMode {
    /// Every mode, in the order tools list them.
    pub const ALL: [TransferMode; 3] = [
        TransferMode::Eager,
        TransferMode::Rendezvous,
        TransferMode::Auto,
    ];

    /// The lowercase name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            TransferMode::Auto => "auto",
            TransferMode::Eager => "eager",
            TransferMode::Rendezvous => "rendezvous",
        }
    }
}

impl fmt::Display for TransferMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransferMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TransferMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown transfer mode {s:?}: expected auto, eager or rendezvous")
            })
    }
}

/// Why a fetch of one object failed. Reaches the client with a reason it can show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum FetchError {
    /// No live node holds the object (at once, or by the deadline when the fetch waited for a
    /// publication).
    #[error("object {id}: no live node holds it")]
    NotFound {
        /// The object.
        id: ObjectId,
    },
    /// The object is not here and this daemon is in no cluster, so nothing can bring it.
    #[error(
        "object {id} is not here, and this daemon is in no cluster to fetch it from (start it \
         with --head, --join or --directory)"
    )]
    NoCluster {
        /// The object.
        id: ObjectId,
    },
    /// The deadline passed while the object was on its way.
    #[error("object {id}: timed out while {stage}")]
    Timeout {
        /// The object.
        id: ObjectId,
        /// What the fetch was doing.
        stage: String,
    },
    /// Every holder failed, in every round.
    #[error("object {id}: all sources failed after {attempts} attempts; last: {last_error}")]
    SourcesFailed {
        /// The object.
        id: ObjectId,
        /// Transfers tried.
        attempts: u32,
        /// The last failure.
        last_error: String,
    },
    /// The directory did not answer, after every retry.
    #[error("object {id}: directory unavailable: {reason}")]
    DirectoryUnavailable {
        /// The object.
        id: ObjectId,
        /// Its last answer.
        reason: String,
    },
    /// The local store refused the object (out of memory, too large).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An effect for the driver to carry out.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum NodeOutput {
    /// Send a message to a peer.
    Send {
        /// The peer.
        peer: NodeId,
        /// The message; encode with [`wire::encode`].
        message: PeerMessage,
    },
    /// Send an `EagerData` chunk whose payload is `source` in this node's arena: gather the bytes
    /// now (before the next input) and encode with [`wire::encode_eager`].
    SendEager {
        /// The peer.
        peer: NodeId,
        /// Everything but the payload.
        header: EagerHeader,
        /// Where the payload lies.
        source: LocalRegion,
        /// The object sent (for logs and traces).
        object: ObjectId,
    },
    /// Post a one-sided READ of `remote` (on `peer`) into `local`, on lane `lane`.
    PostRead {
        /// The peer holding the data.
        peer: NodeId,
        /// Echoed in the completion.
        op: ReadOpId,
        /// Queue pair index, below the peer's lane count.
        lane: u16,
        /// Destination in this node's arena.
        local: LocalRegion,
        /// Source in the peer's registration.
        remote: RemoteRegion,
        /// The object being read (for logs and traces).
        object: ObjectId,
    },
    /// Copy these bytes (an eager chunk) into this node's arena.
    WriteLocal {
        /// Destination.
        region: LocalRegion,
        /// The bytes; `region.len == bytes.len()`.
        bytes: Vec<u8>,
        /// The object being written (for logs and traces).
        object: ObjectId,
    },
    /// Peers may now READ this region (it holds a pinned object).
    ExposeRegion {
        /// The object.
        object: ObjectId,
        /// Its region.
        region: LocalRegion,
    },
    /// Peers may no longer READ this region.
    UnexposeRegion {
        /// The object.
        object: ObjectId,
        /// Its region.
        region: LocalRegion,
    },
    /// Send a request to the directory; answer with [`Node::handle_directory_reply`]
    /// (`Unsubscribe` needs no answer).
    Directory {
        /// Echo in the reply.
        op: DirectoryOpId,
        /// The request.
        request: DirectoryRequest,
    },
    /// Answer a local client's request (a fetch's reply holds, per id, a reference the client
    /// must release, as for `get`). A [`Response::Welcome`] goes with the arenas' fds.
    Reply {
        /// The client.
        client: ClientId,
        /// Its request.
        request: RequestId,
        /// The answer.
        response: Response,
    },
    /// Tell a subscribed client what happened to an object.
    Event {
        /// The subscriber.
        client: ClientId,
        /// What happened.
        event: ObjectEvent,
    },
    /// Close a client's connection after the replies already output (a protocol violation).
    CloseClient {
        /// The client.
        client: ClientId,
        /// Why, for the log.
        reason: String,
    },
    /// Make this change durable, after every earlier one, then report it with
    /// [`Node::handle_persisted`]. Only with [`StoreConfig::record_durable_changes`].
    Persist {
        /// Its number: 1 for the first change, then one more each.
        seq: u64,
        /// The change.
        change: DurableChange,
    },
    /// An object was sealed here or left the store (for logs and traces).
    Local(ObjectEvent),
}

/// Counters of a node, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Client fetch requests.
    pub fetch_requests: u64,
    /// Transfers started as requester.
    pub transfers_started: u64,
    /// Transfers that ended with a sealed object.
    pub transfers_succeeded: u64,
    /// Transfers that failed (each may be retried elsewhere).
    pub transfers_failed: u64,
    /// Objects sent eagerly as holder.
    pub served_eager: u64,
    /// Objects served by rendezvous (leases granted).
    pub served_rendezvous: u64,
    /// Requests answered `NotFound`, `Busy` or `Error`.
    pub served_refused: u64,
    /// Leases that ended without a `Finish`.
    pub leases_expired: u64,
    /// READs posted.
    pub reads_posted: u64,
    /// READs that failed.
    pub reads_failed: u64,
    /// Bytes brought in by completed transfers.
    pub bytes_fetched: u64,
    /// Peer messages that failed to decode.
    pub malformed_messages: u64,
    /// Directory publications abandoned after every retry.
    pub publications_dropped: u64,
    /// Object fetches that went straight to remembered holders, skipping the lookup.
    pub location_cache_hits: u64,
    /// Remembered locations that proved wrong (the fetch then asked the directory).
    pub stale_locations: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Seal a transfer whose bytes are all written out (one step after the last write).
    Seal(TransferId),
    FetchDeadline(FetchWaiterId),
    TransferDeadline(TransferId),
    Lease(NodeId, TransferId),
    DirectoryOp(DirectoryOpId),
    ObjectRetry(ObjectId),
    Publication(ObjectId),
    /// End of the grace an object nobody holds gets before a fetch that does not wait for a
    /// publication fails.
    PublicationGrace(ObjectId),
}

#[derive(Debug)]
struct PeerState {
    params: PeerParams,
    threshold: EagerThreshold,
    connected: bool,
    /// Transfers from this peer in progress (for spreading load).
    active: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirectoryPurpose {
    Lookup(ObjectId),
    Publication(ObjectId),
    /// A client's `locate`.
    Locate(ClientId, RequestId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Publish(ObjectSizes),
    Withdraw,
}

/// The directory should learn that this node holds (or no longer holds) an object.
#[derive(Debug)]
struct Publication {
    want: Want,
    op: Option<DirectoryOpId>,
    attempts: u32,
}

/// One node's sans-IO logic. See the module documentation for the driver contract.
#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    now: Instant,
    store: Store,
    peers: BTreeMap<NodeId, PeerState>,
    // Fetch manager.
    waiters: BTreeMap<FetchWaiterId, FetchWaiter>,
    objects: BTreeMap<ObjectId, ObjectFetch>,
    admission: VecDeque<ObjectId>,
    bytes_in_flight: u64,
    locations: LocationCache,
    // Requester side of transfers.
    transfers: BTreeMap<TransferId, Incoming>,
    reads: BTreeMap<ReadOpId, (TransferId, u64)>,
    // Holder side.
    leases: BTreeMap<(NodeId, TransferId), Lease>,
    exposed: BTreeMap<ObjectId, (LocalRegion, u32)>,
    // Directory.
    directory_ops: BTreeMap<DirectoryOpId, DirectoryPurpose>,
    publications: BTreeMap<ObjectId, Publication>,
    timers: timers::Timers<Timer>,
    outputs: VecDeque<NodeOutput>,
    next_waiter: u64,
    next_transfer: u32,
    next_read: u64,
    next_directory_op: u64,
    // Local clients.
    clients: clients::Clients,
    stats: NodeStats,
}

impl Node {
    /// A node with an empty store, at `now`.
    pub fn new(config: NodeConfig, now: Instant) -> Self {
        let mut store = Store::new(config.store.clone());
        store.connect(FETCH_CLIENT);
        let locations = LocationCache::new(config.location_cache_entries);
        Self {
            store,
            config,
            now,
            peers: BTreeMap::new(),
            waiters: BTreeMap::new(),
            objects: BTreeMap::new(),
            admission: VecDeque::new(),
            bytes_in_flight: 0,
            locations,
            transfers: BTreeMap::new(),
            reads: BTreeMap::new(),
            leases: BTreeMap::new(),
            exposed: BTreeMap::new(),
            directory_ops: BTreeMap::new(),
            publications: BTreeMap::new(),
            timers: timers::Timers::default(),
            outputs: VecDeque::new(),
            next_waiter: 0,
            next_transfer: 0,
            next_read: 0,
            next_directory_op: 0,
            clients: clients::Clients::default(),
            stats: NodeStats::default(),
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.config.node
    }

    /// The configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The local store, to read.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Restores objects a persistent store found on restart (see [`Store::recover`]); drain
    /// the outputs afterwards, which publish them.
    pub fn handle_recovered(
        &mut self,
        now: Instant,
        objects: Vec<RecoveredObject>,
    ) -> RecoveryReport {
        self.advance(now);
        let report = self.store.recover(now, objects);
        self.absorb_store();
        report
    }

    /// Counters.
    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// Bytes of objects being transferred in now.
    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    /// The eager threshold chosen for `peer`, once connected (for the daemon to print).
    pub fn eager_threshold(&self, peer: NodeId) -> Option<EagerThreshold> {
        self.peers.get(&peer).map(|p| p.threshold)
    }

    /// The connection to `peer` is up (again), with its lanes and measured costs.
    pub fn handle_peer_connected(&mut self, now: Instant, peer: NodeId, params: PeerParams) {
        self.advance(now);
        let threshold = threshold::choose(
            self.config.threshold,
            &params.costs,
            self.config.eager_chunk_bytes(),
            self.config.eager_capacity_bytes(),
        );
        let params = PeerParams {
            lanes: params.lanes.max(1),
            ..params
        };
        let active = self.peers.get(&peer).map_or(0, |p| p.active);
        self.peers.insert(
            peer,
            PeerState {
                params,
                threshold,
                connected: true,
                active,
            },
        );
        self.pump_admission();
        self.absorb_store();
    }

    /// The connection to `peer` is gone. Transfers from it fail over (after their posted READs
    /// complete); leases granted to it run out on their own, since a READ may still be in flight.
    pub fn handle_peer_lost(&mut self, now: Instant, peer: NodeId) {
        self.advance(now);
        if let Some(state) = self.peers.get_mut(&peer) {
            state.connected = false;
        }
        let from_peer: Vec<TransferId> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.source == peer)
            .map(|(&tid, _)| tid)
            .collect();
        for tid in from_peer {
            self.fail_transfer(tid, format!("connection to {peer} lost"));
        }
        self.absorb_store();
    }

    /// A message arrived from `peer` as bytes: decodes and handles it. A malformed message is
    /// counted and returned as an error (the driver logs it and may drop the connection); the
    /// node's state is unchanged.
    pub fn handle_peer_bytes(
        &mut self,
        now: Instant,
        peer: NodeId,
        bytes: &[u8],
    ) -> Result<(), WireError> {
        match wire::decode(bytes) {
            Ok(message) => {
                self.handle_peer_message(now, peer, message);
                Ok(())
            }
            Err(error) => {
                self.advance(now);
                self.stats.malformed_messages += 1;
                Err(error)
            }
        }
    }

    /// A decoded message arrived from `peer`.
    pub fn handle_peer_message(&mut self, now: Instant, peer: NodeId, message: PeerMessage) {
        self.advance(now);
        match message {
            PeerMessage::FetchRequest {
                req,
                id,
                eager_limit,
                max_chunk_bytes,
            } => self.serve_fetch_request(peer, req, id, eager_limit, max_chunk_bytes),
            PeerMessage::Finish { req } => self.handle_finish(peer, req),
            reply => self.handle_transfer_reply(peer, reply),
        }
        self.absorb_store();
    }

    /// A READ posted with [`NodeOutput::PostRead`] completed. On success its bytes are in the
    /// local region.
    pub fn handle_read_completion(
        &mut self,
        now: Instant,
        op: ReadOpId,
        result: Result<(), ReadError>,
    ) {
        self.advance(now);
        self.read_completed(op, result);
        self.absorb_store();
    }

    /// The directory answered operation `op`.
    pub fn handle_directory_reply(
        &mut self,
        now: Instant,
        op: DirectoryOpId,
        reply: DirectoryReply,
    ) {
        self.advance(now);
        match self.directory_ops.remove(&op) {
            Some(DirectoryPurpose::Lookup(id)) => {
                self.cancel_timer(Timer::DirectoryOp(op));
                self.lookup_answered(id, op, reply);
            }
            Some(DirectoryPurpose::Publication(id)) => {
                self.cancel_timer(Timer::DirectoryOp(op));
                self.publication_answered(id, op, reply);
            }
            Some(DirectoryPurpose::Locate(client, request)) => {
                self.locate_answered(client, request, op, reply)
            }
            // A reply after the op timed out: the retry owns the outcome.
            None => {}
        }
        self.absorb_store();
    }

    /// The directory told this node something it subscribed to.
    pub fn handle_directory_event(&mut self, now: Instant, event: DirectoryEvent) {
        self.advance(now);
        match event {
            DirectoryEvent::Published { id, holder, sizes } => {
                self.object_published(id, holder, sizes)
            }
        }
        self.absorb_store();
    }

    /// A client asks for objects from anywhere in the cluster: each is looked up, transferred
    /// and sealed here unless already present. Completes with [`NodeOutput::FetchReply`] when
    /// every id is here or failed, and at `now + timeout` at the latest (`None`: no deadline).
    ///
    /// An object no live node holds fails at once with [`FetchError::NotFound`], unless
    /// `wait_for_publication`: then the fetch waits (until its timeout) for a node to publish it.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_fetch(
        &mut self,
        now: Instant,
        client: ClientId,
        request: RequestId,
        ids: Vec<ObjectId>,
        timeout: Option<Duration>,
        mode: TransferMode,
        wait_for_publication: bool,
    ) {
        self.advance(now);
        self.start_fetch(client, request, ids, timeout, mode, wait_for_publication);
        self.absorb_store();
    }

    /// Time passed: fires every timer due at or before `now`. Early calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        self.store.handle_timeout(now);
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::Seal(tid) => self.seal_written(tid),
                Timer::FetchDeadline(waiter) => self.fetch_deadline(waiter),
                Timer::TransferDeadline(tid) => self.transfer_deadline(tid),
                Timer::Lease(peer, req) => self.lease_expired(peer, req),
                Timer::DirectoryOp(op) => self.directory_op_timed_out(op),
                Timer::ObjectRetry(id) => self.retry_object(id),
                Timer::Publication(id) => self.send_publication(id),
                Timer::PublicationGrace(id) => self.publication_grace_over(id),
            }
        }
        self.absorb_store();
    }

    /// The next effect to carry out, if any.
    pub fn poll_output(&mut self) -> Option<NodeOutput> {
        if self.outputs.is_empty() {
            self.absorb_store();
        }
        self.outputs.pop_front()
    }

    /// When the node next wants [`Node::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        let own = self.timers.next_due();
        match (own, self.store.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether nothing is in progress: no fetch, transfer, lease or directory work.
    pub fn is_quiescent(&self) -> bool {
        self.pending_work().is_empty()
    }

    /// Everything in progress, one line each, saying what it waits for. Empty when quiescent.
    pub fn pending_work(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (waiter_id, waiter) in &self.waiters {
            lines.push(format!(
                "fetch {waiter_id:?} of {} for {} {} waits ({} ids left) until {}",
                waiter.ids.len(),
                waiter.client,
                waiter.request,
                waiter.remaining,
                waiter.deadline
            ));
        }
        for (id, object) in &self.objects {
            lines.push(format!("object {id}: {}", object.describe()));
        }
        for (tid, transfer) in &self.transfers {
            lines.push(format!(
                "transfer {tid} of {} from {}: {}",
                transfer.id,
                transfer.source,
                transfer.describe()
            ));
        }
        for ((peer, req), lease) in &self.leases {
            lines.push(format!(
                "lease of {} to {peer} for {req} until {}",
                lease.id, lease.expires
            ));
        }
        for (op, purpose) in &self.directory_ops {
            lines.push(format!("directory {op} for {purpose:?} awaits a reply"));
        }
        for (id, publication) in &self.publications {
            lines.push(format!(
                "directory must learn {:?} for {id} (attempt {})",
                publication.want, publication.attempts
            ));
        }
        self.pending_client_work(&mut lines);
        lines
    }

    /// Checks the node's bookkeeping against itself and the store; panics on the first
    /// inconsistency. For tests and the simulator.
    pub fn check_invariants(&self) {
        self.store.check_invariants();
        self.locations.check_invariants();
        let in_flight: u64 = self.transfers.values().map(|t| t.block_len).sum();
        assert_eq!(in_flight, self.bytes_in_flight, "bytes in flight");
        let mut reads_by_transfer: BTreeMap<TransferId, u32> = BTreeMap::new();
        for (tid, _) in self.reads.values() {
            assert!(
                self.transfers.contains_key(tid),
                "READ of a finished transfer {tid}"
            );
            *reads_by_transfer.entry(*tid).or_default() += 1;
        }
        for (tid, transfer) in &self.transfers {
            assert_eq!(
                transfer.outstanding_reads(),
                reads_by_transfer.get(tid).copied().unwrap_or(0),
                "outstanding READs of {tid}"
            );
            let object = self.objects.get(&transfer.id);
            assert!(
                object.is_none_or(|o| o.transferring() == Some(*tid)),
                "object {} does not point at {tid}",
                transfer.id
            );
        }
        let mut leases_by_object: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for lease in self.leases.values() {
            *leases_by_object.entry(lease.id).or_default() += 1;
            assert!(
                self.store.is_pinned(&lease.id),
                "leased {} is not pinned",
                lease.id
            );
        }
        for (id, (_, count)) in &self.exposed {
            assert_eq!(
                leases_by_object.get(id).copied().unwrap_or(0),
                *count,
                "exposures of {id}"
            );
        }
        assert_eq!(
            leases_by_object.len(),
            self.exposed.len(),
            "exposed objects"
        );
    }

    fn advance(&mut self, now: Instant) {
        // Inputs may arrive with equal times; time never goes back.
        self.now = self.now.max(now);
    }

    fn push(&mut self, output: NodeOutput) {
        self.outputs.push_back(output);
    }

    fn send(&mut self, peer: NodeId, message: PeerMessage) {
        self.push(NodeOutput::Send { peer, message });
    }

    fn set_timer(&mut self, at: Instant, timer: Timer) {
        self.timers.set(at, timer);
    }

    fn cancel_timer(&mut self, timer: Timer) {
        self.timers.cancel(timer);
    }

    fn new_transfer_id(&mut self) -> TransferId {
        self.next_transfer = self.next_transfer.wrapping_add(1);
        TransferId(((self.config.incarnation as u64) << 32) | self.next_transfer as u64)
    }

    fn directory(
        &mut self,
        request: DirectoryRequest,
        purpose: Option<DirectoryPurpose>,
    ) -> DirectoryOpId {
        self.next_directory_op += 1;
        let op = DirectoryOpId(self.next_directory_op);
        if let Some(purpose) = purpose {
            self.directory_ops.insert(op, purpose);
            self.set_timer(
                self.now + self.config.directory_timeout,
                Timer::DirectoryOp(op),
            );
        }
        self.push(NodeOutput::Directory { op, request });
        op
    }

    fn directory_op_timed_out(&mut self, op: DirectoryOpId) {
        let reason = DirectoryReply::Unavailable {
            reason: "no reply before the timeout".into(),
        };
        match self.directory_ops.remove(&op) {
            Some(DirectoryPurpose::Lookup(id)) => self.lookup_answered(id, op, reason),
            Some(DirectoryPurpose::Publication(id)) => self.publication_answered(id, op, reason),
            Some(DirectoryPurpose::Locate(client, request)) => {
                self.locate_answered(client, request, op, reason)
            }
            None => {}
        }
    }

    /// Moves the store's outputs to the node's, reacting to seals and deletes on the way.
    fn absorb_store(&mut self) {
        while let Some(output) = self.store.poll_output() {
            match output {
                StoreOutput::Local(ObjectEvent::Sealed {
                    id,
                    data_size,
                    metadata_size,
                }) => {
                    self.want_publication(
                        id,
                        Want::Publish(ObjectSizes {
                            data_size,
                            metadata_size,
                        }),
                    );
                    self.sealed_locally(id);
                }
                StoreOutput::Local(ObjectEvent::Deleted { id }) => {
                    self.want_publication(id, Want::Withdraw)
                }
                _ => {}
            }
            self.outputs.push_back(match output {
                StoreOutput::GetReply {
                    client,
                    request,
                    results,
                } => NodeOutput::Reply {
                    client,
                    request,
                    response: Response::Got(results),
                },
                StoreOutput::Notify { client, event } => NodeOutput::Event { client, event },
                StoreOutput::Local(event) => NodeOutput::Local(event),
            });
        }
        while let Some(change) = self.store.poll_durable_change() {
            self.clients.persist_emitted += 1;
            let seq = self.clients.persist_emitted;
            self.outputs.push_back(NodeOutput::Persist { seq, change });
        }
    }

    fn want_publication(&mut self, id: ObjectId, want: Want) {
        if self.config.standalone {
            // No directory to tell.
            return;
        }
        let publication = self.publications.entry(id).or_insert(Publication {
            want,
            op: None,
            attempts: 0,
        });
        publication.want = want;
        publication.attempts = 0;
        self.cancel_timer(Timer::Publication(id));
        self.send_publication(id);
    }

    fn send_publication(&mut self, id: ObjectId) {
        let Some(publication) = self.publications.get(&id) else {
            return;
        };
        let request = match publication.want {
            Want::Publish(sizes) => DirectoryRequest::Publish { id, sizes },
            Want::Withdraw => DirectoryRequest::Withdraw { id },
        };
        if let Some(old) = publication.op {
            self.directory_ops.remove(&old);
            self.cancel_timer(Timer::DirectoryOp(old));
        }
        let op = self.directory(request, Some(DirectoryPurpose::Publication(id)));
        let publication = self.publications.get_mut(&id).expect("looked up above");
        publication.op = Some(op);
        publication.attempts += 1;
    }

    fn publication_answered(&mut self, id: ObjectId, op: DirectoryOpId, reply: DirectoryReply) {
        let Some(publication) = self.publications.get_mut(&id) else {
            return;
        };
        if publication.op != Some(op) {
            return;
        }
        publication.op = None;
        match reply {
            DirectoryReply::Done | DirectoryReply::Located { .. } => {
                self.publications.remove(&id);
            }
            DirectoryReply::Unavailable { .. } => {
                if publication.attempts >= self.config.max_directory_attempts {
                    self.publications.remove(&id);
                    self.stats.publications_dropped += 1;
                } else {
                    let at = self.now + self.config.retry_backoff * publication.attempts;
                    self.set_timer(at, Timer::Publication(id));
                }
            }
        }
    }
}

/// A stable mix of an object and a node, to spread objects over holders without randomness.
fn spread_key(id: &ObjectId, node: NodeId) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.as_bytes().iter().chain(node.0.to_le_bytes().iter()) {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}
