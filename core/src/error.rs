//! Errors the store reports to its clients. They cross the wire, so they are plain data.

use serde::{Deserialize, Serialize};

use crate::ids::ObjectId;

/// An error a client can match on. Every variant says which object it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StoreError {
    /// `create` of an id that is already in the store (sealed or not), or the seal of an id
    /// that live nodes of the cluster hold with another content (one id names one content).
    #[error("object {0} already exists")]
    ObjectExists(ObjectId),
    /// The object is not in this store.
    #[error("object {0} not found")]
    ObjectNotFound(ObjectId),
    /// The object exists but is still being written.
    #[error("object {0} is not sealed yet")]
    ObjectNotSealed(ObjectId),
    /// The object is held by a client or pinned by a transfer; a delete takes effect once it is
    /// released (as in Plasma).
    #[error("object {0} is in use; it will be deleted when the last reference is released")]
    ObjectInUse(ObjectId),
    /// Not enough memory (or room in the object table) even after evicting every object that
    /// nobody holds.
    #[error(
        "out of memory: object {id} needs {}, {} of {} are free and nothing more can be evicted",
        Bytes(*requested_bytes), Bytes(*free_bytes), Bytes(*capacity_bytes)
    )]
    OutOfMemory {
        /// The object being created.
        id: ObjectId,
        /// Bytes asked for (data + metadata).
        requested_bytes: u64,
        /// Bytes free after evicting all that could be.
        free_bytes: u64,
        /// The store's capacity.
        capacity_bytes: u64,
    },
    /// The object was not sealed before the request's timeout.
    #[error("timed out waiting for object {0} to be sealed")]
    Timeout(ObjectId),
    /// The object can never fit: larger than the largest arena, or its sizes overflow.
    #[error(
        "object {id} of {} can never fit: the largest arena holds {}",
        Bytes(*requested_bytes), Bytes(*largest_arena_bytes)
    )]
    ObjectTooLarge {
        /// The object.
        id: ObjectId,
        /// Bytes asked for (data + metadata), saturated at u64::MAX on overflow.
        requested_bytes: u64,
        /// Size of the largest arena.
        largest_arena_bytes: u64,
    },
    /// Seal or abort of an object another client created.
    #[error("object {0} was created by another client; only its creator may seal or abort it")]
    NotCreator(ObjectId),
    /// Seal of an object that is already sealed, or abort of a sealed object.
    #[error("object {0} is already sealed")]
    AlreadySealed(ObjectId),
    /// Release of an object this client holds no reference to.
    #[error("this client holds no reference to object {0}")]
    NotHeld(ObjectId),
    /// A request that breaks the protocol: malformed, out of order or over a limit.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A get waited for an object whose creator aborted it (or disconnected) before sealing.
    #[error("object {0} was aborted by its creator before it was sealed")]
    Aborted(ObjectId),
    /// The cluster's directory did not answer; the request may succeed once it is back.
    #[error("the directory is unavailable: {0}")]
    DirectoryUnavailable(String),
    /// The daemon refused the request rather than let one of its waiting queues grow past its
    /// cap: it is overloaded (or, for `Durability`, its disk is behind). Nothing changed;
    /// retry after a moment, send fewer requests at once, or raise the cap.
    #[error(
        "the daemon is busy: {limit} {queue} already (its limit); nothing was done, retry later \
         or send fewer requests at once"
    )]
    Busy {
        /// The queue that is full.
        queue: WaitQueue,
        /// Its cap.
        limit: u64,
    },
    /// The daemon is still starting (creating a large arena, joining its cluster); it serves
    /// requests once ready. The text says how far it got.
    #[error("the daemon is starting: {0}")]
    Starting(String),
    /// A put that waited for its copies on other nodes returned before all of them were
    /// sealed (its wait ran out, or the node is in no cluster). The object is stored here, and
    /// replication goes on in the background.
    #[error(
        "object {id} has {copies} of its {wanted} copies sealed; the put is stored, its other \
         copies {}",
        if *in_cluster { "are still being made" } else { "cannot be made without a cluster" }
    )]
    TooFewReplicas {
        /// The object.
        id: ObjectId,
        /// Live copies sealed when the put returned, its own included.
        copies: u32,
        /// Copies the put asked for.
        wanted: u8,
        /// Whether the node is in a cluster (else no copy can ever be made).
        in_cluster: bool,
    },
    /// A put that waited for its copies on a node whose directory does not place copies
    /// (Redis or Redis Cluster): only the built-in directory makes replicas. The object is
    /// stored here, as a plain object; no other copy will be made.
    #[error(
        "object {id} is stored on this node only: the directory in use ({directory}) does not \
         make replicas, so its other {} copies will never be made; use the built-in directory \
         (--head/--join) for replicas",
        wanted.saturating_sub(1)
    )]
    ReplicasUnsupported {
        /// The object.
        id: ObjectId,
        /// Copies the put asked for.
        wanted: u8,
        /// The directory, described without secrets.
        directory: String,
    },
}

/// A queue of requests that wait inside the daemon, each with a cap
/// ([`NodeConfig`](crate::node::NodeConfig)); a request that would grow one past its cap is
/// refused with [`StoreError::Busy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WaitQueue {
    /// `get`s waiting for objects to be sealed (`max_waiting_gets`).
    Gets,
    /// Client fetches in progress (`max_pending_fetches`).
    Fetches,
    /// Objects waiting for memory or bytes in flight before their transfer starts
    /// (`max_queued_transfers`).
    QueuedTransfers,
    /// Requests held back until the disk catches up with the changes already made
    /// (`max_deferred_requests`, persistent mode).
    Durability,
}

impl WaitQueue {
    /// Every queue, for metrics.
    pub const ALL: [WaitQueue; 4] = [
        WaitQueue::Gets,
        WaitQueue::Fetches,
        WaitQueue::QueuedTransfers,
        WaitQueue::Durability,
    ];

    /// Its label value.
    pub fn name(self) -> &'static str {
        match self {
            WaitQueue::Gets => "gets",
            WaitQueue::Fetches => "fetches",
            WaitQueue::QueuedTransfers => "queued_transfers",
            WaitQueue::Durability => "durability",
        }
    }
}

impl std::fmt::Display for WaitQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WaitQueue::Gets => "gets waiting for objects",
            WaitQueue::Fetches => "fetches in progress",
            WaitQueue::QueuedTransfers => "transfers waiting for memory",
            WaitQueue::Durability => "requests waiting for the disk",
        })
    }
}

/// A byte count for messages: `1.5 GiB (1610612736 bytes)`, or `512 bytes` below 1 KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} bytes", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {} ({} bytes)", UNITS[unit], self.0)
    }
}

#[cfg(test)]
mod bytes_tests {
    use super::Bytes;

    #[test]
    fn human_sizes_keep_the_exact_count() {
        assert_eq!(Bytes(512).to_string(), "512 bytes");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB (1536 bytes)");
        assert_eq!(Bytes(3 << 30).to_string(), "3.0 GiB (3221225472 bytes)");
        assert_eq!(
            Bytes(u64::MAX).to_string(),
            "16.0 EiB (18446744073709551615 bytes)"
        );
    }
}
