//! What a node asks its driver to do ([`NodeOutput`]), and its counters.

use std::net::SocketAddr;

use super::ReadOpId;
use crate::client_protocol::Response;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryOpId, DirectoryRequest};
use crate::ids::{ClientId, NodeId, ObjectId, RequestId, TransferId};
use crate::region::{LocalRegion, RemoteRegion};
use crate::store::{DurableChange, ObjectEvent, SpillOpId};
use crate::wire::{EagerHeader, InputBytes, PeerMessage};

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
    /// Copy bytes `payload` of the peer message just given to the node (an eager chunk) into
    /// this node's arena at `region`: straight from where the message arrived, the one copy
    /// of an eager transfer.
    WriteLocal {
        /// Destination; `region.len == payload.len`.
        region: LocalRegion,
        /// Where the bytes are in the input message.
        payload: InputBytes,
        /// The object being written (for logs and traces).
        object: ObjectId,
    },
    /// Copy `bytes` (a small put's data or metadata, carried by the client's request) into this
    /// node's arena at `region`, now, before any later output: the object is sealed by the
    /// time the driver sees this, and no reply or event about it precedes this write.
    WriteInline {
        /// Destination; `region.len == bytes.len()`.
        region: LocalRegion,
        /// The bytes.
        bytes: Vec<u8>,
        /// The object being written (for logs and traces).
        object: ObjectId,
    },
    /// Hash the bytes of `region` (a fetched copy, every byte in) with
    /// [`ContentDigest::of_contiguous`](crate::digest::ContentDigest::of_contiguous) and answer
    /// with [`NodeInput::ContentHashed`](super::NodeInput::ContentHashed); the copy is
    /// sealed only if they match the id's digest.
    VerifyContent {
        /// The transfer.
        transfer: TransferId,
        /// The copy's bytes (data then metadata).
        region: LocalRegion,
        /// The object (for logs and traces).
        object: ObjectId,
    },
    /// The bytes of `region`, the start of a fetched copy or the part right after the last
    /// `HashAhead` of the same transfer, are in and final: a driver may hash them now, while
    /// the rest is read, and continue from there at the transfer's `VerifyContent` (whose
    /// answer is still the digest of the whole copy). A driver may ignore this.
    HashAhead {
        /// The transfer.
        transfer: TransferId,
        /// The next bytes of the copy.
        region: LocalRegion,
        /// The object (for logs and traces).
        object: ObjectId,
    },
    /// Answer a client's [`Request::Trace`](crate::client_protocol::Request::Trace) with the
    /// driver's timestamps (the core has no clock), and take them from now on when `record`.
    Trace {
        /// The client.
        client: ClientId,
        /// Its request.
        request: RequestId,
        /// Take timestamps from now on.
        record: bool,
    },
    /// Let `peer` READ `region` (a pinned object) for the lease of its transfer `req`, and
    /// answer with [`NodeInput::ReadGranted`](super::NodeInput::ReadGranted): the keys
    /// the peer must use (a fabric scopes them to this lease where it can: verbs memory
    /// windows, TCP per-lease keys). Until the answer nothing names the region to the peer.
    GrantRead {
        /// The reader.
        peer: NodeId,
        /// Its transfer (with `peer`, names the lease).
        req: TransferId,
        /// The object.
        object: ObjectId,
        /// Its region.
        region: LocalRegion,
    },
    /// The lease of `peer`'s transfer `req` ended: no READ may reach `region` through its keys
    /// any more. Answer with [`NodeInput::ReadRevoked`](super::NodeInput::ReadRevoked)
    /// once that holds; the object stays pinned until then.
    RevokeRead {
        /// The reader.
        peer: NodeId,
        /// Its transfer.
        req: TransferId,
        /// The object.
        object: ObjectId,
        /// Its region.
        region: LocalRegion,
    },
    /// Send a request to the directory; answer with [`NodeInput::DirectoryReply`](super::NodeInput::DirectoryReply)
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
    /// [`NodeInput::Persisted`](super::NodeInput::Persisted). Only with [`StoreConfig::record_durable_changes`](crate::store::StoreConfig::record_durable_changes).
    Persist {
        /// Its number: 1 for the first change, then one more each.
        seq: u64,
        /// The change.
        change: DurableChange,
    },
    /// An object was sealed here or left the store (for logs and traces).
    Local(ObjectEvent),
    /// Open a connection to `peer`, whose fabric listens at `address`, and report how it went
    /// as a peer connected or lost. A driver already connecting to `peer` may ignore this.
    Connect {
        /// The peer (always a lower id than this node's: the higher id dials).
        peer: NodeId,
        /// Where its fabric accepts connections.
        address: SocketAddr,
    },
    /// Write the bytes of `region` (a sealed object, pinned until the answer) to the spill tier
    /// as record `op`, with `digest` (computed from the bytes when `None`) as its checksum, off
    /// the loop; answer with [`NodeInput::SpillDone`](super::NodeInput::SpillDone).
    Spill {
        /// The write and the record's name.
        op: SpillOpId,
        /// The object.
        object: ObjectId,
        /// Its bytes (data then metadata).
        region: LocalRegion,
        /// The digest of those bytes, when known.
        digest: Option<ContentDigest>,
    },
    /// Read record `op` into `region` (allocated for it, untouched by the core until the
    /// answer), check its checksum (and `digest` when given), off the loop; answer with
    /// [`NodeInput::RestoreDone`](super::NodeInput::RestoreDone).
    Restore {
        /// The record.
        op: SpillOpId,
        /// The object.
        object: ObjectId,
        /// Where its bytes go.
        region: LocalRegion,
        /// The digest the bytes must have, when known.
        digest: Option<ContentDigest>,
    },
    /// Record `op` is not needed any more: give its space back. Nothing to answer.
    DiscardSpilled {
        /// The record.
        op: SpillOpId,
        /// Its object.
        object: ObjectId,
    },
    /// As [`NodeOutput::GrantRead`], for a copy still being received here (this node relays
    /// it, see `relay`): `region` is the object's whole block, not pinned and partly written;
    /// the core tells the reader which prefix is in. The fabric must not hold a view of the
    /// whole region for the grant's life (READs into the block are still landing): it views
    /// each READ's range when it serves it, and refuses a READ whose range is being written.
    GrantPartialRead {
        /// The reader.
        peer: NodeId,
        /// Its transfer (with `peer`, names the lease).
        req: TransferId,
        /// The object.
        object: ObjectId,
        /// Its block.
        region: LocalRegion,
    },
}

impl NodeOutput {
    /// The variant's name, for summaries and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeOutput::Send { .. } => "send",
            NodeOutput::SendEager { .. } => "send_eager",
            NodeOutput::PostRead { .. } => "post_read",
            NodeOutput::WriteLocal { .. } => "write_local",
            NodeOutput::WriteInline { .. } => "write_inline",
            NodeOutput::VerifyContent { .. } => "verify_content",
            NodeOutput::HashAhead { .. } => "hash_ahead",
            NodeOutput::Trace { .. } => "trace",
            NodeOutput::GrantRead { .. } => "grant_read",
            NodeOutput::RevokeRead { .. } => "revoke_read",
            NodeOutput::Directory { .. } => "directory",
            NodeOutput::Reply { .. } => "reply",
            NodeOutput::Event { .. } => "event",
            NodeOutput::CloseClient { .. } => "close_client",
            NodeOutput::Persist { .. } => "persist",
            NodeOutput::Local(_) => "local",
            NodeOutput::Connect { .. } => "connect",
            NodeOutput::Spill { .. } => "spill",
            NodeOutput::Restore { .. } => "restore",
            NodeOutput::DiscardSpilled { .. } => "discard_spilled",
            NodeOutput::GrantPartialRead { .. } => "grant_partial_read",
        }
    }
}

/// Counters of a node, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Fetched copies removed before their deferred publication was due: neither published
    /// nor withdrawn.
    pub publications_skipped: u64,
    /// Publications the directory refused because live nodes hold the id with another content
    /// (a seal then fails with `ObjectExists`, or a copy sealed during a directory outage
    /// stays local).
    pub id_conflicts: u64,
    /// Fetched copies whose bytes did not hash to the digest the id names (each failed its
    /// source; the fetch went on elsewhere).
    pub digest_mismatches: u64,
    /// Releases sent without a reply (a dropped buffer's) that failed; each connection's
    /// first is reported by its next `Flush`.
    pub unanswered_release_failures: u64,
    /// Object fetches that went straight to remembered holders, skipping the lookup.
    pub location_cache_hits: u64,
    /// Remembered locations that proved wrong (the fetch then asked the directory).
    pub stale_locations: u64,
    /// Locations the directory pushed to this node (`--learn-locations`), remembered.
    pub locations_learned: u64,
    /// Bytes sent eagerly or exposed under a lease, as holder.
    pub bytes_served: u64,
    /// Times a failed source was followed by another attempt (another holder, or a new round).
    pub retries: u64,
    /// Directory requests that got no answer in time.
    pub directory_timeouts: u64,
    /// Requester transfers by path and outcome.
    pub transfer_outcomes: super::metrics::TransferOutcomes,
    /// Client fetches by result, per id.
    pub fetch_results: super::metrics::FetchResults,
    /// Requests refused because a waiting queue was full, per queue.
    pub busy_refusals: super::metrics::BusyRefusals,
    /// Connections this node dialed ([`NodeOutput::Connect`]).
    pub dials: u64,
    /// Times a peer became unreachable (its connection failed or was lost while it was
    /// reachable).
    pub peers_unreachable: u64,
    /// Copies of record the registry placed here that were fetched (or promoted) and pinned.
    pub copies_of_record_placed: u64,
    /// Fetches of copies placed here that failed (the registry places them elsewhere).
    pub replication_fetches_failed: u64,
    /// Copies placed here declined at once: the store could not hold them even with every
    /// evictable object gone (the registry places them elsewhere).
    #[serde(default)]
    pub replicas_declined_without_room: u64,
    /// Puts whose wait for their copies ran out.
    pub replica_waits_timed_out: u64,
    /// Object fetches sent straight to the node the caller named, skipping the lookup.
    pub hinted_fetches: u64,
    /// Hinted fetches whose node did not have the object (they then asked the directory).
    pub wrong_hints: u64,
    /// Requests this holder sent to a relay (another requester receiving the object) instead
    /// of serving them itself.
    pub relay_redirects: u64,
    /// Leases granted over a copy still being received here (as a relay).
    pub relay_leases: u64,
    /// Transfers that pulled from a relay.
    pub relayed_transfers: u64,
    /// Fetch requests answered in the same pass as an earlier request for the same object,
    /// sharing its lookup (see `coalesce`).
    #[serde(default)]
    pub coalesced_requests: u64,
    /// The pace of relays (see `relay`), for `bench cluster`'s relay report.
    #[serde(default)]
    pub relay_pace: super::relay::RelayPace,
    /// Copies of record that became plain copies here: the registry had enough copies of
    /// record without them (they came back after repair replaced them).
    #[serde(default)]
    pub copies_of_record_released: u64,
    /// Publications of copies not yet served to peers that ran out of attempts while the
    /// directory was reachable, and started another round of attempts later.
    #[serde(default)]
    pub publication_rounds_restarted: u64,
    /// `ExtendLease` requests this node sent for its transfers (READs too slow for one lease).
    #[serde(default)]
    pub lease_extensions_asked: u64,
    /// Leases this node extended for its readers.
    #[serde(default)]
    pub leases_extended: u64,
    /// Fetch rounds that found every untried holder's link down and waited for one to come
    /// back instead of counting the round (`NodeConfig::holder_link_wait`).
    #[serde(default)]
    pub fetches_waiting_for_links: u64,
}
