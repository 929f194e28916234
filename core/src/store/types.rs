//! The store's values as clients and drivers see them.

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::ids::{ClientId, ObjectId, RequestId};
use crate::region::LocalRegion;
use crate::time::Instant;

/// Where an object lives and how large it is: what a client needs to map it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// The object.
    pub id: ObjectId,
    /// Data then metadata, contiguous: `region.len == data_size + metadata_size`.
    pub region: LocalRegion,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes, stored right after the data.
    pub metadata_size: u64,
}

impl ObjectInfo {
    /// The data part of the object's region.
    pub fn data_region(&self) -> LocalRegion {
        self.region.slice(0, self.data_size)
    }

    /// The metadata part of the object's region.
    pub fn metadata_region(&self) -> LocalRegion {
        self.region.slice(self.data_size, self.metadata_size)
    }
}

/// A line of `list()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSummary {
    /// Where and how large.
    pub info: ObjectInfo,
    /// Whether the object is sealed.
    pub sealed: bool,
    /// References held by clients (and the creator, while unsealed).
    pub ref_count: u32,
    /// Transfers reading this object right now.
    pub pin_count: u32,
    /// A delete is waiting for the references to go.
    pub delete_pending: bool,
    /// When it was created.
    pub created_at: Instant,
    /// Where its bytes are (memory unless there is a spill tier). A spilled object's `region`
    /// names no memory: only its length means anything.
    pub tier: super::StorageTier,
}

/// What happened to an object, as subscribers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectEvent {
    /// The object was sealed and can be read.
    Sealed {
        /// The object.
        id: ObjectId,
        /// Data bytes.
        data_size: u64,
        /// Metadata bytes.
        metadata_size: u64,
    },
    /// A sealed object left the store (deleted or evicted).
    Deleted {
        /// The object.
        id: ObjectId,
    },
}

/// Counters and gauges of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStats {
    /// Bytes of memory the store was given, over all arenas (the daemon's `--memory`); up to
    /// 63 bytes of each arena, past its last 64-byte block, hold no object.
    pub capacity_bytes: u64,
    /// Bytes allocated to objects (aligned blocks).
    pub allocated_bytes: u64,
    /// Objects in the table, sealed or not.
    pub object_count: u64,
    /// Sealed objects.
    pub sealed_count: u64,
    /// Bytes of sealed objects nobody holds (what eviction could free).
    pub evictable_bytes: u64,
    /// Connected clients.
    pub client_count: u64,
    /// Gets waiting for objects to be sealed.
    pub waiting_gets: u64,
    /// Objects evicted since start.
    pub evicted_objects_total: u64,
    /// Bytes evicted since start.
    pub evicted_bytes_total: u64,
    /// Objects sealed since start.
    pub sealed_objects_total: u64,
    /// Bytes of objects pinned by transfers (rendezvous leases) right now.
    pub pinned_bytes: u64,
    /// Objects created since start (by clients and by fetches).
    pub created_objects_total: u64,
    /// Creates refused with `OutOfMemory` since start.
    pub out_of_memory_total: u64,
    /// Objects asked for by client `get`s since start (one per id).
    pub get_requests_total: u64,
    /// Objects named by client `delete`s since start (one per id).
    pub delete_requests_total: u64,
    /// The spill tier (all zero without one).
    pub spill: Box<super::SpillStats>,
}

/// An effect of the store for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum StoreOutput {
    /// A `get` is complete: one result per requested id, in request order. Each `Ok` took a
    /// reference the client must release.
    GetReply {
        /// The client that asked.
        client: ClientId,
        /// Its request.
        request: RequestId,
        /// Per id: the object, or why it is not available.
        results: Vec<Result<ObjectInfo, StoreError>>,
    },
    /// A notification for a subscribed client.
    Notify {
        /// The subscriber.
        client: ClientId,
        /// What happened.
        event: ObjectEvent,
    },
    /// An object became available here or left: for the node layer (directory publication).
    Local(ObjectEvent),
    /// Write the bytes of `region` (object `id`, sealed, pinned until the answer) to the spill
    /// tier as record `op`, then report with [`Store::handle_spill_done`](super::Store::handle_spill_done).
    /// `digest` (when known) is the checksum of the bytes to store with the record.
    Spill {
        /// The write, and the record's name.
        op: super::SpillOpId,
        /// The object.
        id: ObjectId,
        /// Its bytes (data then metadata).
        region: LocalRegion,
        /// The digest of those bytes.
        digest: Option<crate::digest::ContentDigest>,
    },
    /// Read record `op` (object `id`) into `region`, check it against its checksum, then report
    /// with [`Store::handle_restore_done`](super::Store::handle_restore_done).
    Restore {
        /// The record.
        op: super::SpillOpId,
        /// The object.
        id: ObjectId,
        /// Where its bytes go.
        region: LocalRegion,
        /// The digest the bytes must have.
        digest: Option<crate::digest::ContentDigest>,
    },
    /// Record `op` is not needed any more: give its space back. Nothing to answer.
    DiscardSpilled {
        /// The record.
        op: super::SpillOpId,
        /// Its object.
        id: ObjectId,
    },
    /// A spilled object is in memory again (for the node layer: fetches waiting for it).
    Restored {
        /// The object.
        id: ObjectId,
    },
    /// A spilled object could not be restored and is lost (for the node layer).
    RestoreFailed {
        /// The object.
        id: ObjectId,
    },
}

/// How a `delete` of one id went.
pub type DeleteResult = Result<(), StoreError>;

/// What `evict` freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictOutcome {
    /// Objects evicted.
    pub objects: u64,
    /// Bytes freed (aligned blocks).
    pub bytes: u64,
}
