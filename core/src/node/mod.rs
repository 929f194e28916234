//! One node's whole sans-IO logic: its [`Store`], the fetch manager and both ends of the
//! transfer protocol. The daemon and the simulator drive this very type.
//!
//! The interface is narrow, in the style of quinn-proto and str0m:
//!
//! * every input is a [`NodeInput`] value handed to [`Node::handle`] with its `now`: a client
//!   connected or asked, a peer's message, a READ completion, a peer connected or lost, a
//!   directory reply or event, the disk's progress, and time passing ([`NodeInput::Timeout`]);
//! * outputs are [`NodeOutput`] values drained with [`Node::poll_output`]; the next instant at
//!   which the node wants [`NodeInput::Timeout`] is [`Node::poll_timeout`];
//! * [`drive_host`] is the one loop between the two that every driver runs after an input: it
//!   carries out every output, feeds back the driver's immediate answers, fires due timers and
//!   returns the next deadline. Inputs are values, so a driver can record them and a replay
//!   can feed them again ([`recording`]).
//!
//! **Driver contract.** After every input, drain `poll_output()` and carry out every output, in
//! order, before giving the node its next input ([`drive_host`] does); the one exception: while
//! [`Node::outputs_queued`] is false, the next input may come first (the fetch requests held
//! meanwhile are answered together at the next `poll_output`, see `coalesce`). `SendEager` in particular names
//! a region of a sealed object whose bytes the driver gathers right then. Every posted READ gets
//! exactly one completion (success or error, also when the connection breaks), and the local
//! region it writes stays untouched by the core until then. Local clients use the store
//! through their requests; the node learns of seals and deletes from the store's events.

mod backpressure;
mod clients;
mod coalesce;
mod config;
pub mod drive;
mod driver;
mod errors;
mod fetch;
mod hints;
mod input;
mod limits;
mod links;
mod locations;
mod metrics;
mod output;
mod publications;
pub mod recording;
mod relay;
mod replicas;
mod sealing;
mod spill;
pub mod threshold;
mod timers;
mod transfer;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use crate::client_protocol::Response;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use crate::ids::{ClientId, NodeId, ObjectId, RequestId, TransferId};
use crate::store::{ObjectEvent, RecoveredObject, RecoveryReport, Store, StoreOutput};
use crate::time::Instant;
use crate::wire::{self, DecodedMessage, ObjectSizes, PeerMessage, WireError};

pub use clients::{ClusterMember, MAX_PARKED_CREATES};
pub use config::{ArenaKey, NodeConfig, PeerParams, ReadGrant};
pub use drive::{drive, drive_host, DriveHost};
pub use driver::NodeDriver;
pub use errors::{FetchError, GrantError, ReadError, SourceFailure, TransferFailure, TransferMode};
use fetch::{FetchWaiter, FetchWaiterId, ObjectFetch};
pub use input::{Handled, NodeInput};
pub use links::{DialPolicy, PeerLink, Unreachable};
use locations::LocationCache;
pub use metrics::{
    BusyRefusals, FetchResults, LatencyHistogram, NodeMetrics, PeerCounters, PeerMetrics,
    SizeClass, TransferOutcomes, TransferPath, LATENCY_BUCKETS_NANOS,
};
pub use output::{NodeOutput, NodeStats};
use publications::{Publication, Want};
pub use relay::RelayPace;
pub use threshold::{
    EagerThreshold, PathCosts, RoundTripBatch, RoundTripEstimate, ThresholdPolicy, ThresholdSource,
};
use transfer::{Incoming, Lease};

/// The store client the node uses for objects it is fetching: it creates them, and seals or
/// aborts them. Drivers must not give a local client this id.
pub const FETCH_CLIENT: ClientId = ClientId(u64::MAX);

/// A READ posted by this node, echoed in its completion.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct ReadOpId(pub u64);

impl fmt::Display for ReadOpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "read-{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Seal a transfer whose bytes are all written out (one step after the last write).
    Seal(TransferId),
    /// Seal a put's object once its bytes are written out (one step after the writes).
    SealPut(ClientId, RequestId),
    FetchDeadline(FetchWaiterId),
    TransferDeadline(TransferId),
    Lease(NodeId, TransferId),
    DirectoryOp(DirectoryOpId),
    ObjectRetry(ObjectId),
    Publication(ObjectId),
    /// End of the grace an object nobody holds gets before a fetch that does not wait for a
    /// publication fails.
    PublicationGrace(ObjectId),
    /// Dial the peers still missing (see `links`).
    Dial,
    /// A put's wait for its copies runs out (see `replicas`).
    ReplicaWait(ObjectId),
    /// Serve the next request held back for the disk (see `backpressure`); last, so what the
    /// request before it set for the same instant (a put's seal) fires first.
    ServeDeferred,
    /// Tell the peers whose fetches of this object wait for its restore that it still comes
    /// (see `spill`).
    RestoringNotice(ObjectId),
}

#[derive(Debug)]
struct PeerState {
    params: PeerParams,
    threshold: EagerThreshold,
    connected: bool,
    /// Transfers from this peer in progress (for spreading load).
    active: u32,
    /// READs posted to this peer and not completed, of all its transfers: at most
    /// `max_outstanding_reads` (see [`Node::pump_reads`]).
    reads_outstanding: u32,
    /// This peer's transfers that have READs to post, in turn: each posts one READ per turn.
    read_turns: VecDeque<TransferId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirectoryPurpose {
    Lookup(ObjectId),
    Publication(ObjectId),
    /// A client's `locate`.
    Locate(ClientId, RequestId),
    /// A client's `locate` of every copy of an object.
    LocateCopies(ObjectId, ClientId, RequestId),
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
    /// Fetch requests sent to a caller's hinted node, before the object's sizes are known.
    hinted: BTreeMap<TransferId, hints::HintedRequest>,
    /// READs in flight: their transfer, and where in the object and how long they are.
    reads: BTreeMap<ReadOpId, (TransferId, u64, u64)>,
    // Holder side.
    leases: BTreeMap<(NodeId, TransferId), Lease>,
    // Directory.
    directory_ops: BTreeMap<DirectoryOpId, DirectoryPurpose>,
    publications: BTreeMap<ObjectId, Publication>,
    /// Copies a transfer sealed whose seal the node has not absorbed yet (their publication is
    /// deferred).
    sealed_copies: BTreeSet<ObjectId>,
    /// Client seals waiting for the directory's verdict on their publication.
    pending_seals: BTreeMap<ObjectId, sealing::PendingSeal>,
    /// Objects whose publication was accepted before their seal, which the node has not
    /// absorbed yet (not to be published again).
    published_at_seal: BTreeSet<ObjectId>,
    /// Objects sealed here without the directory's acceptance of their content (it was down or
    /// did not answer in time): not served to peers until it accepts them, since a hinted fetch
    /// has no directory digest to check them against (see `sealing`).
    unvouched: BTreeSet<ObjectId>,
    /// Of those, the copies whose publication the directory refused for another content under
    /// the id: they stay local and unpublished (README "One id, one content").
    refused_publications: BTreeSet<ObjectId>,
    timers: timers::Timers<Timer>,
    outputs: VecDeque<NodeOutput>,
    next_waiter: u64,
    next_transfer: u32,
    next_read: u64,
    next_directory_op: u64,
    // Local clients.
    clients: clients::Clients,
    stats: NodeStats,
    histograms: metrics::Histograms,
    peer_counters: BTreeMap<NodeId, PeerCounters>,
    /// When each answered directory request was sent (for its latency).
    directory_sent: BTreeMap<DirectoryOpId, Instant>,
    links: links::Links,
    backpressure: backpressure::Backpressure,
    /// Peer fetches waiting for restores (see `spill`).
    spill_waits: spill::SpillWaits,
    replicas: replicas::Replicas,
    relays: relay::Relays,
    /// Fetch requests of the current drive pass, answered together (see `coalesce`).
    coalesced: coalesce::Coalesced,
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
            hinted: BTreeMap::new(),
            reads: BTreeMap::new(),
            leases: BTreeMap::new(),
            directory_ops: BTreeMap::new(),
            publications: BTreeMap::new(),
            sealed_copies: BTreeSet::new(),
            pending_seals: BTreeMap::new(),
            published_at_seal: BTreeSet::new(),
            unvouched: BTreeSet::new(),
            refused_publications: BTreeSet::new(),
            timers: timers::Timers::default(),
            outputs: VecDeque::new(),
            next_waiter: 0,
            next_transfer: 0,
            next_read: 0,
            next_directory_op: 0,
            clients: clients::Clients::default(),
            stats: NodeStats::default(),
            histograms: metrics::Histograms::default(),
            peer_counters: BTreeMap::new(),
            directory_sent: BTreeMap::new(),
            links: links::Links::default(),
            backpressure: backpressure::Backpressure::default(),
            spill_waits: spill::SpillWaits::default(),
            replicas: replicas::Replicas::default(),
            relays: relay::Relays::default(),
            coalesced: coalesce::Coalesced::default(),
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

    /// Restores objects a persistent store found on restart (see [`Store::recover`]), each
    /// with the digest of its bytes as the driver found them; drain the outputs afterwards,
    /// which publish them.
    fn handle_recovered(
        &mut self,
        now: Instant,
        objects: Vec<(RecoveredObject, ContentDigest)>,
    ) -> RecoveryReport {
        self.advance(now);
        let (objects, digests): (Vec<RecoveredObject>, Vec<(ObjectId, ContentDigest)>) = objects
            .into_iter()
            .map(|(object, digest)| (object, (object.id, digest)))
            .unzip();
        let report = self.store.recover(now, objects);
        for (id, digest) in digests {
            self.store.set_digest(&id, digest);
            if !self.config.standalone {
                // Served to peers once the directory accepts its publication again: another
                // node may have put the id with other bytes while this one was down.
                self.unvouched.insert(id);
            }
        }
        self.absorb_store();
        report
    }

    /// Counters.
    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// Every counter and gauge, at the node's current time: cheap enough to take each second.
    pub fn metrics(&self) -> NodeMetrics {
        let mut store = self.store.stats();
        // The store also counts the node's own fetch client; report connections.
        store.client_count = self.clients.sessions.len() as u64;
        let mut peers: BTreeMap<NodeId, PeerMetrics> = BTreeMap::new();
        for (&node, state) in &self.peers {
            peers.insert(
                node,
                PeerMetrics {
                    node,
                    connected: state.connected,
                    eager_threshold_bytes: Some(state.threshold.bytes),
                    transfers_in_flight: state.active,
                    counters: PeerCounters::default(),
                },
            );
        }
        for (&node, counters) in &self.peer_counters {
            peers
                .entry(node)
                .or_insert(PeerMetrics {
                    node,
                    connected: false,
                    eager_threshold_bytes: None,
                    transfers_in_flight: 0,
                    counters: PeerCounters::default(),
                })
                .counters = counters.clone();
        }
        NodeMetrics {
            node: self.config.node,
            at_nanos: self.now.as_nanos(),
            store,
            counters: self.stats.clone(),
            transfers_in_flight: self.transfers.len() as u64,
            reads_in_flight: self.reads.len() as u64,
            bytes_in_flight: self.bytes_in_flight,
            leases_held: self.leases.len() as u64,
            fetches_waiting: self.waiters.len() as u64,
            transfers_queued: self.admission.len() as u64,
            requests_deferred: self.deferred_requests() as u64,
            changes_unpersisted: self.unpersisted_changes(),
            directory_healthy: self.directory_healthy(),
            standalone: self.config.standalone,
            fetch_latency: SizeClass::ALL
                .iter()
                .zip(self.histograms.fetch_latency.iter())
                .map(|(&class, h)| (class, h.clone()))
                .collect(),
            directory_latency: self.histograms.directory_latency.clone(),
            peers: peers.into_values().collect(),
            copies_of_record: self.replicas.of_record_count() as u64,
        }
    }

    fn peer_counters(&mut self, peer: NodeId) -> &mut PeerCounters {
        self.peer_counters.entry(peer).or_default()
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
    fn handle_peer_connected(&mut self, now: Instant, peer: NodeId, params: PeerParams) {
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
        let previous = self.peers.remove(&peer);
        let (active, reads_outstanding, read_turns) = previous.map_or_else(Default::default, |p| {
            (p.active, p.reads_outstanding, p.read_turns)
        });
        self.peers.insert(
            peer,
            PeerState {
                params,
                threshold,
                connected: true,
                active,
                reads_outstanding,
                read_turns,
            },
        );
        self.links_up(peer);
        self.wake_fetches_waiting_for(peer);
        self.pump_admission();
        self.absorb_store();
    }

    /// The connection to `peer` is gone. Transfers from it fail over (after their posted READs
    /// complete); leases granted to it run out on their own, since a READ may still be in flight.
    fn handle_peer_lost(&mut self, now: Instant, peer: NodeId) {
        self.advance(now);
        if let Some(state) = self.peers.get_mut(&peer) {
            if state.connected {
                self.peer_counters.entry(peer).or_default().connections_lost += 1;
            }
            state.connected = false;
        }
        self.links_lost(peer);
        let from_peer: Vec<TransferId> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.source == peer)
            .map(|(&tid, _)| tid)
            .collect();
        for tid in from_peer {
            self.fail_transfer(tid, TransferFailure::ConnectionLost { holder: peer });
        }
        self.hints_lost(peer);
        self.absorb_store();
    }

    /// A message arrived from `peer` as bytes: decodes and handles it. A malformed message is
    /// counted and returned as an error (the driver logs it and may drop the connection); the
    /// node's state is unchanged. Keep `bytes` until the outputs are carried out: an eager
    /// chunk's [`NodeOutput::WriteLocal`] names its payload in them (copied once, from there).
    fn handle_peer_bytes(
        &mut self,
        now: Instant,
        peer: NodeId,
        bytes: &[u8],
    ) -> Result<(), WireError> {
        self.advance(now);
        match wire::decode_in_place(bytes) {
            Ok(DecodedMessage::Eager { header, payload }) => {
                self.handle_eager_chunk(peer, header, payload);
                self.absorb_store();
                Ok(())
            }
            Ok(DecodedMessage::Message(message)) => {
                self.handle_peer_message(now, peer, message);
                Ok(())
            }
            Err(error) => {
                self.stats.malformed_messages += 1;
                self.peer_counters(peer).malformed_messages += 1;
                Err(error)
            }
        }
    }

    /// A decoded message other than `EagerData` (whose payload must come as bytes, through
    /// [`NodeInput::PeerBytes`]).
    fn handle_peer_message(&mut self, now: Instant, peer: NodeId, message: PeerMessage) {
        self.advance(now);
        match message {
            PeerMessage::FetchRequest {
                req,
                id,
                eager_limit,
                max_chunk_bytes,
            } => self.ask_fetch(peer, req, id, eager_limit, max_chunk_bytes),
            PeerMessage::Finish { req } => self.handle_finish(peer, req),
            PeerMessage::ExtendLease { req } => self.handle_extend_lease(peer, req),
            PeerMessage::EagerData { header, .. } => {
                // Nowhere to copy the payload from: the transfer fails, and is retried.
                if self
                    .transfers
                    .get(&header.req)
                    .is_some_and(|t| t.source == peer)
                {
                    self.fail_transfer(header.req, TransferFailure::EagerWithoutBytes);
                }
            }
            reply => self.handle_transfer_reply(peer, reply),
        }
        self.absorb_store();
    }

    /// The fabric's answer to [`NodeOutput::GrantRead`]: the keys `peer` reads the lease's
    /// object with, or why it cannot (the fetch is refused with that reason).
    fn handle_read_granted(
        &mut self,
        now: Instant,
        peer: NodeId,
        req: TransferId,
        result: Result<ReadGrant, GrantError>,
    ) {
        self.advance(now);
        self.read_granted(peer, req, result);
        self.absorb_store();
    }

    /// The driver's answer to [`NodeOutput::VerifyContent`]: what the copy's bytes hash to.
    fn handle_content_hashed(&mut self, now: Instant, transfer: TransferId, actual: ContentDigest) {
        self.advance(now);
        self.content_hashed(transfer, actual);
        self.absorb_store();
    }

    /// The fabric's answer to [`NodeOutput::RevokeRead`]: the lease's keys reach nothing any
    /// more, so its object is unpinned.
    fn handle_read_revoked(&mut self, now: Instant, peer: NodeId, req: TransferId) {
        self.advance(now);
        self.read_revoked(peer, req);
        self.absorb_store();
    }

    /// A READ posted with [`NodeOutput::PostRead`] completed. On success its bytes are in the
    /// local region.
    fn handle_read_completion(
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
    fn handle_directory_reply(&mut self, now: Instant, op: DirectoryOpId, reply: DirectoryReply) {
        self.advance(now);
        if let Some(sent) = self.directory_sent.remove(&op) {
            self.histograms
                .directory_latency
                .observe(self.now.saturating_since(sent));
        }
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
            Some(DirectoryPurpose::LocateCopies(id, client, request)) => {
                self.cancel_timer(Timer::DirectoryOp(op));
                let response = self.copies_answer(&id, reply);
                self.reply(client, request, response);
            }
            // A reply after the op timed out: the retry owns the outcome.
            None => {}
        }
        self.absorb_store();
    }

    /// The directory told this node something it subscribed to.
    fn handle_directory_event(&mut self, now: Instant, event: DirectoryEvent) {
        self.advance(now);
        match event {
            DirectoryEvent::Published {
                id,
                holder,
                sizes,
                digest,
            } => self.object_published(id, holder, sizes, digest),
            DirectoryEvent::Replicate {
                id,
                sizes,
                digest,
                sources,
                replicas,
            } => self.replicate_here(id, sizes, digest, sources, replicas),
            DirectoryEvent::Copies { id, copies } => self.copies_reported(id, copies),
            DirectoryEvent::Delete { id } => self.deleted_everywhere(id),
            DirectoryEvent::Surplus { id } => self.surplus_copy(id),
            DirectoryEvent::ReplayRefused { id, .. } => self.replay_refused(id),
            DirectoryEvent::Located {
                id,
                holder,
                sizes,
                digest,
            } => self.location_learned(id, holder, sizes, digest),
        }
        self.absorb_store();
    }

    /// Time passed: fires every timer due at or before `now`. Early calls are harmless.
    fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        self.store.handle_timeout(now);
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::Seal(tid) => self.seal_written(tid),
                Timer::SealPut(client, request) => self.seal_put(client, request),
                Timer::FetchDeadline(waiter) => self.fetch_deadline(waiter),
                Timer::TransferDeadline(tid) => self.transfer_deadline(tid),
                Timer::Lease(peer, req) => self.lease_expired(peer, req),
                Timer::DirectoryOp(op) => self.directory_op_timed_out(op),
                Timer::ObjectRetry(id) => self.retry_object(id),
                Timer::Publication(id) => self.send_publication(id),
                Timer::PublicationGrace(id) => self.publication_grace_over(id),
                Timer::Dial => self.dial_missing(),
                Timer::ReplicaWait(id) => self.replica_wait_expired(id),
                Timer::ServeDeferred => {
                    // The request's outputs are carried out before its own timers (a put's
                    // seal, due now) fire, at the driver's next call, as for any request.
                    self.serve_deferred();
                    break;
                }
                Timer::RestoringNotice(id) => self.notify_restoring(id),
            }
        }
        self.absorb_store();
    }

    /// The next effect to carry out, if any.
    pub fn poll_output(&mut self) -> Option<NodeOutput> {
        if !self.coalesced.is_empty() {
            self.serve_coalesced();
        }
        if self.outputs.is_empty() {
            self.absorb_store();
        }
        self.outputs.pop_front()
    }

    /// When the node next wants [`NodeInput::Timeout`].
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
        for (id, pending) in &self.pending_seals {
            lines.push(format!(
                "seal of {id} by {} waits for the directory's verdict on its publication",
                pending.client()
            ));
        }
        for (tid, transfer) in &self.transfers {
            lines.push(format!(
                "transfer {tid} of {} from {}: {}",
                transfer.id,
                transfer.source,
                transfer.describe()
            ));
        }
        for (tid, hinted) in &self.hinted {
            lines.push(format!(
                "hinted request {tid} of {} to {} awaits its reply",
                hinted.id, hinted.source
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
        self.pending_spill_work(&mut lines);
        self.pending_replica_work(&mut lines);
        self.relays.describe(&mut lines);
        lines
    }

    /// Checks the node's bookkeeping against itself and the store; panics on the first
    /// inconsistency. For tests and the simulator.
    pub fn check_invariants(&self) {
        self.store.check_invariants();
        self.locations.check_invariants();
        // O(members) per call, and the simulator calls this after every input: debug builds
        // (every test) check it, the release simulator measuring large clusters does not.
        if cfg!(debug_assertions) {
            self.check_links_invariants();
        }
        let in_flight: u64 = self.transfers.values().map(|t| t.block_len).sum();
        assert_eq!(in_flight, self.bytes_in_flight, "bytes in flight");
        for (id, pending) in &self.pending_seals {
            assert!(
                self.store.check_creator(pending.client(), *id).is_ok(),
                "a pending seal's object {id} is unsealed and its client's"
            );
        }
        let mut reads_by_transfer: BTreeMap<TransferId, u32> = BTreeMap::new();
        let mut reads_by_peer: BTreeMap<NodeId, u32> = BTreeMap::new();
        for (tid, _, _) in self.reads.values() {
            let Some(transfer) = self.transfers.get(tid) else {
                panic!("READ of a finished transfer {tid}");
            };
            *reads_by_transfer.entry(*tid).or_default() += 1;
            *reads_by_peer.entry(transfer.source).or_default() += 1;
        }
        for (peer, state) in &self.peers {
            let reads = reads_by_peer.get(peer).copied().unwrap_or(0);
            assert_eq!(
                state.reads_outstanding, reads,
                "READs outstanding to {peer}"
            );
            assert!(
                reads <= self.config.max_outstanding_reads.max(1),
                "{reads} READs outstanding to {peer}"
            );
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
        for (tid, hinted) in &self.hinted {
            assert!(
                !self.transfers.contains_key(tid),
                "hinted request {tid} is also a transfer"
            );
            let object = self.objects.get(&hinted.id);
            assert!(
                object.is_none_or(|o| o.is_hinted(*tid)),
                "object {} does not point at its hinted request {tid}",
                hinted.id
            );
        }
        for lease in self.leases.values() {
            if lease.over_partial_copy {
                // A relay's lease: the copy is unsealed and kept by its fetch until revoked.
                assert!(
                    self.store.summary(&lease.id).is_some_and(|s| !s.sealed),
                    "relayed copy {} under a lease is gone or sealed",
                    lease.id
                );
                continue;
            }
            assert!(
                self.store.is_pinned(&lease.id),
                "leased {} is not pinned",
                lease.id
            );
        }
        self.check_replica_invariants();
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
            self.directory_sent.insert(op, self.now);
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
        if self.directory_sent.remove(&op).is_some() {
            self.stats.directory_timeouts += 1;
        }
        match self.directory_ops.remove(&op) {
            Some(DirectoryPurpose::Lookup(id)) => self.lookup_answered(id, op, reason),
            Some(DirectoryPurpose::Publication(id)) => self.publication_answered(id, op, reason),
            Some(DirectoryPurpose::Locate(client, request)) => {
                self.locate_answered(client, request, op, reason)
            }
            Some(DirectoryPurpose::LocateCopies(id, client, request)) => {
                let response = self.copies_answer(&id, reason);
                self.reply(client, request, response);
            }
            None => {}
        }
    }

    /// Moves the store's outputs to the node's, reacting to seals and deletes on the way.
    fn absorb_store(&mut self) {
        self.store.retry_restores();
        while let Some(output) = self.store.poll_output() {
            let Some(output) = self.absorb_spill_output(output) else {
                continue;
            };
            match output {
                StoreOutput::Local(ObjectEvent::Sealed {
                    id,
                    data_size,
                    metadata_size,
                }) => {
                    let sizes = ObjectSizes {
                        data_size,
                        metadata_size,
                    };
                    let copy = self.sealed_copies.remove(&id);
                    if self.published_at_seal.remove(&id) {
                        // Published before the seal (see `sealing`).
                    } else if let Some(digest) = self.store.digest(&id) {
                        if copy {
                            self.want_replica_publication(id, sizes, digest);
                        } else {
                            self.want_publication(id, Want::Publish(sizes, digest));
                        }
                    } else {
                        // Every seal records its digest; none here means the object already
                        // left the store in the same step (its removal follows): nothing to
                        // publish.
                    }
                    self.sealed_locally(id);
                    self.replica_sealed(id, sizes);
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
                other => unreachable!("spill outputs are taken above: {other:?}"),
            });
        }
        self.absorb_durable_changes();
    }
}

/// A stable mix of an object and a node, to spread objects over holders without randomness.
pub(crate) fn spread_key(id: &ObjectId, node: NodeId) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.as_bytes().iter().chain(node.0.to_le_bytes().iter()) {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}
