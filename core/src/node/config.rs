//! How a node is configured, and what the driver tells it about arenas and peers.

use std::collections::BTreeMap;
use std::time::Duration;

use super::links::DialPolicy;
use super::threshold::{PathCosts, ThresholdPolicy};
use crate::ids::{ArenaId, NodeId};
use crate::store::StoreConfig;
use crate::wire;

/// How the fabric names one arena for one-sided READs: the base address its registration starts
/// at and the key that grants access. The driver registers each arena once, at start, and gives
/// the node this table, so the core computes a [`RemoteRegion`] for any [`LocalRegion`] itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArenaKey {
    /// Address of the arena's first byte in the registration (verbs: virtual address).
    pub base_addr: u64,
    /// Remote key of the registration.
    pub rkey: u32,
}

/// The keys a fabric gave for one lease ([`NodeOutput::GrantRead`](super::NodeOutput)):
/// opaque to the core, which hands them to the reader in the `Rendezvous`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ReadGrant {
    /// No key: the arena's registration key ([`ArenaKey::rkey`]) serves the reader, for as long
    /// as it is connected (a fabric that cannot scope access to a lease). One key: it serves
    /// every lane. More: one per lane, in lane order (verbs memory windows: a type 2 window
    /// serves the one queue pair it was bound on).
    pub keys: Vec<u32>,
}

/// What the driver knows about a peer when the connection is up.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PeerParams {
    /// Queue pairs (lanes) to this peer; READs are spread over them. At least one.
    pub lanes: u16,
    /// Measured costs of the eager and READ paths to this peer.
    pub costs: PathCosts,
}

/// Configuration of a node. Every queue and retry is bounded by one of these.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Most `get`s waiting for objects at once; more that would wait are refused with
    /// [`StoreError::Busy`](crate::StoreError::Busy).
    pub max_waiting_gets: usize,
    /// Most objects waiting for memory or bytes in flight before their transfer starts; more
    /// fail with [`StoreError::Busy`](crate::StoreError::Busy).
    pub max_queued_transfers: usize,
    /// Most durable changes not yet reported durable before requests that change what is
    /// durable are held back; also the most [`NodeOutput::Persist`](super::NodeOutput) out at
    /// once (a driver's queue to its disk takes at least this many). See `backpressure`.
    pub max_unpersisted_changes: u64,
    /// Most requests held back for the disk; more are refused with
    /// [`StoreError::Busy`](crate::StoreError::Busy).
    pub max_deferred_requests: usize,
    /// Most objects this node keeps pinned for requesters at once (more get `Busy`).
    pub max_leases: usize,
    /// How long a holder keeps an object pinned without a `Finish`.
    pub lease: Duration,
    /// How long a requester waits for a holder's reply, and then for each next eager chunk.
    pub reply_timeout: Duration,
    /// How long a directory operation may take before it is retried.
    pub directory_timeout: Duration,
    /// Most tries of one directory operation (lookup, publish, withdraw).
    pub max_directory_attempts: u32,
    /// Rounds over an object's holders (each a lookup and a try of every holder) before a fetch
    /// gives up.
    pub max_source_rounds: u32,
    /// Pause before retrying after a failure; grows linearly with the attempt. With the
    /// default rounds it is also how long a fetch waits for a holder whose connection is still
    /// being set up (100 ms + 200 ms: a connection's handshake and round-trip measurement take
    /// a few to tens of milliseconds, more on a loaded machine).
    pub retry_backoff: Duration,
    /// Objects whose holders the node remembers from the directory, so fetching one again
    /// skips the lookup (0: always ask the directory).
    pub location_cache_entries: usize,
    /// The node is in no cluster (no directory, no peers): fetches of objects not here fail at
    /// once with [`FetchError::NoCluster`].
    pub standalone: bool,
    /// How long a fetch that does not wait for a publication still waits when the directory
    /// lists no holder. Zero by default: a seal on a node of a cluster returns only once the
    /// directory accepted its publication (see `sealing`), so an object whose put returned is
    /// listed already; only a seal during a directory outage is published later.
    pub publication_grace: Duration,
    /// How long the publication of a copy fetched here waits before it goes to the directory:
    /// the holder it came from serves it meanwhile, and a copy removed within that time is
    /// never published nor withdrawn (zero: published at once, like an object put here).
    pub replica_publication_delay: Duration,
    /// Replies to requests that changed what is durable (seal, delete, eviction) wait until
    /// [`NodeInput::Persisted`](super::NodeInput::Persisted) says the change is (`--durability seal`).
    pub hold_replies_until_durable: bool,
    /// The fabric's name, for `nodes` replies (`none` without one).
    pub fabric_name: String,
    /// Where this node's fabric listens, for `nodes` replies (`-` without one).
    pub fabric_address: String,
    /// The directory, described without secrets, for `nodes` replies.
    pub directory_name: String,
    /// When the node dials its peers (see `links`).
    pub dial: DialPolicy,
    /// Copies a put without its own replica count gets (`--replicas`; 1: only this node's).
    pub default_replicas: u8,
    /// The directory places copies of record (the built-in one's registry does; Redis and
    /// Redis Cluster do not). Without it a put with k > 1 is a plain put, and one that waits
    /// for its copies fails at once with
    /// [`StoreError::ReplicasUnsupported`](crate::StoreError::ReplicasUnsupported).
    pub directory_places_replicas: bool,
    /// Objects of at least this many bytes that many nodes fetch at once flow through the
    /// requesters' partial copies (a pipeline of relays, see `relay`); `u64::MAX`: never.
    pub relay_min_bytes: u64,
    /// How long the fetch of a copy of record placed here may take before the node gives up
    /// on it (the registry then places the copy elsewhere, after its own target timeout,
    /// which should be longer).
    pub replication_fetch_timeout: Duration,
    /// How long a requester waits, from its request, for a holder that says it is restoring the
    /// object from disk (`Restoring`): each notice moves the reply deadline to `reply_timeout`
    /// from then, never past this bound; then the holder is given up on
    /// ([`TransferFailure::RestoreTooSlow`](super::TransferFailure::RestoreTooSlow)). A holder
    /// repeats the notice every half `reply_timeout` while its restore lasts.
    pub restore_wait_limit: Duration,
    /// Most lease extensions for one transfer: a requester whose READs progress asks for at most
    /// this many (`ExtendLease`), a holder grants at most this many per lease. So one transfer
    /// reads for at most this many leases and one more.
    pub max_lease_extensions: u32,
    /// A fetch whose round found no source while some holder is a member whose link is down
    /// (lost and being re-dialled) waits up to this long, from the first such round, for a link
    /// to come back instead of counting rounds: a queue pair that failed under load is re-dialled
    /// within about a second, and the fetch goes on from the holder once it is. Within the
    /// waiter's deadline, as always.
    pub holder_link_wait: Duration,
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
            max_waiting_gets: 65_536,
            max_queued_transfers: 65_536,
            max_unpersisted_changes: 16_384,
            max_deferred_requests: 4096,
            max_leases: 1024,
            lease: Duration::from_secs(10),
            reply_timeout: Duration::from_secs(5),
            directory_timeout: Duration::from_secs(2),
            max_directory_attempts: 8,
            max_source_rounds: 3,
            retry_backoff: Duration::from_millis(100),
            location_cache_entries: 65_536,
            standalone: false,
            publication_grace: Duration::ZERO,
            replica_publication_delay: Duration::from_millis(1),
            hold_replies_until_durable: false,
            fabric_name: "none".into(),
            fabric_address: "-".into(),
            directory_name: "none (standalone)".into(),
            dial: DialPolicy::default(),
            default_replicas: 1,
            directory_places_replicas: true,
            relay_min_bytes: 4 << 20,
            replication_fetch_timeout: Duration::from_secs(60),
            restore_wait_limit: Duration::from_secs(60),
            max_lease_extensions: 10,
            holder_link_wait: Duration::from_secs(5),
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
