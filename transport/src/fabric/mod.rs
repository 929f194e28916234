//! Fabrics: how a node's messages and one-sided READs reach other nodes.
//!
//! One small trait, so a verbs (InfiniBand, RoCE, SoftRoCE), TCP, UCX or libfabric backend can
//! serve the same core. A fabric owns its connections, threads and registrations; the driver
//! calls it with the core's outputs and hears back through [`FabricEvent`]s on a channel it
//! passed in at construction. Every call is non-blocking: work that cannot finish at once
//! completes later as an event (a READ completion, a connection up or lost).
//!
//! Semantics every fabric keeps, because the protocol core relies on them:
//! - messages to one peer arrive in order, whole, at most once (RC QP semantics);
//! - a READ is served from the holder's memory by the fabric, never by the holder's core, and
//!   only through keys granted for a lease ([`Fabric::grant_read`]): a READ with a revoked or
//!   unknown key, or outside the granted region, fails with [`ReadError::RemoteAccess`] (on
//!   verbs without memory windows, the arena's key serves every connected peer instead);
//! - when a connection is lost, every READ posted on it completes (with an error) before or
//!   with the [`FabricEvent::PeerLost`] event, and nothing arrives from that peer after it.
//!
//! **Arena memory.** A fabric touches arena bytes only through the arena's claim-checked views
//! ([`crate::arena`]): an eager send's source is a [`ReadableRegion`] while it is copied; a
//! READ's destination a [`WritableRegion`] from `post_read` until just before its
//! `ReadCompleted` (so the driver may view the bytes once told); a region granted for READs a
//! [`ReadableRegion`] from `grant_read` until the revocation is complete (TCP serves READs
//! from it; verbs lets the device read it). So the methods are safe: a call that would alias
//! a view alive in this process (a READ into an object being read, a send of one being
//! written) is refused with [`FabricError::InUse`] or a failed `ReadCompleted`, not undefined
//! behaviour.
//!
//! **Bounds and back-pressure.** A received message is handed over as [`MessageBytes`], which
//! holds the memory it arrived in (a verbs receive slot, or a TCP connection's share of its
//! undelivered-bytes budget) until the driver drops it. So the messages waiting in the event
//! channel are bounded per peer by that peer's receive slots or budget, and a peer that sends
//! faster than the driver consumes is slowed where it sends: receiver-not-ready retries on
//! verbs, a full TCP window on TCP. What a fabric queues to send is bounded too; a peer that
//! stops reading is disconnected with [`FabricError::PeerNotReading`] and a `PeerLost`
//! saying why. The other events are bounded by what the driver asked for (one
//! `ReadCompleted` per posted READ) and by connections (a `PeerConnected` and a `PeerLost`
//! per handshake). The event channel itself is a bounded channel ([`EVENT_CHANNEL_CAPACITY`])
//! that nothing goes over: a TCP connection's tasks wait for room (and so stop reading their
//! socket); the driver's own calls cannot wait, so a call answered by a later event
//! ([`Fabric::post_read`]) takes the place of its answer at once, and is refused with
//! [`EventsFull`] when none is free; the verbs poller, which can neither wait nor
//! refuse, holds what does not fit in an [`EventBacklog`] bounded by the receive slots and
//! READs its events stand for. See [`event_channel`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;

use skyriver_core::node::{ArenaKey, GrantError, PeerParams, ReadError, ReadGrant, ReadOpId};
use skyriver_core::wire::EagerHeader;
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion, TransferId};

#[cfg(doc)]
use crate::arena::{ReadableRegion, WritableRegion};
use crate::arena::{SharedArena, ViewError};

mod events;
pub mod tcp;
pub mod verbs;

pub use events::{
    event_channel, event_channel_with_capacity, DriverGone, EventBacklog, EventPlace,
    EventReceiver, EventSender, EventsFull, TrySendError, EVENT_CHANNEL_CAPACITY,
};

/// What a fabric tells the driver.
#[derive(Debug)]
pub enum FabricEvent {
    /// A connection to `peer` is up (either side opened it), with what was negotiated.
    PeerConnected {
        /// The peer.
        peer: NodeId,
        /// Lanes and measured costs, for the core.
        params: PeerParams,
        /// What the handshake agreed on, for the start-up log.
        summary: String,
    },
    /// The connection to `peer` is gone (closed, failed, or refused at handshake).
    PeerLost {
        /// The peer.
        peer: NodeId,
        /// Why, for the log.
        reason: String,
    },
    /// A whole message arrived from `peer`; decode with `skyriver_core::wire::decode`, from
    /// the borrowed bytes (`NodeInput::PeerBytes { peer, bytes: &bytes }`), then drop them: until
    /// dropped they hold the receive slot or budget they arrived in.
    Message {
        /// The sender.
        peer: NodeId,
        /// The encoded message, where it arrived.
        bytes: MessageBytes,
    },
    /// A [`Fabric::grant_read`] that was under way is answered.
    ReadGranted {
        /// The reader.
        peer: NodeId,
        /// Its transfer.
        req: TransferId,
        /// The keys, or why not.
        result: Result<ReadGrant, FabricError>,
    },
    /// A [`Fabric::revoke_read`] that was under way took effect: no READ reaches the region
    /// through the lease's keys any more.
    ReadRevoked {
        /// The reader.
        peer: NodeId,
        /// Its transfer.
        req: TransferId,
    },
    /// A READ posted with [`Fabric::post_read`] finished; on success its bytes are in place.
    ReadCompleted {
        /// The READ.
        op: ReadOpId,
        /// How it went.
        result: Result<(), ReadError>,
    },
}

/// The bytes of one received message, still in the memory they arrived in. Derefs to
/// `[u8]`. Dropping it gives that memory back to the fabric: a verbs receive slot is re-posted,
/// a TCP connection's reader may read on. Keep it only as long as it takes to handle.
pub struct MessageBytes(Held);

enum Held {
    /// Read off a TCP stream into a buffer of its own, counted against the connection's
    /// undelivered-bytes budget until dropped (`None`: not counted).
    Buffer {
        bytes: Vec<u8>,
        _budget: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    /// Still in the verbs receive slot it arrived in.
    Slot(crate::verbs::RecvMessage),
}

impl MessageBytes {
    /// Bytes that hold nothing back (tests, in-process drivers).
    pub fn from_vec(bytes: Vec<u8>) -> MessageBytes {
        MessageBytes(Held::Buffer {
            bytes,
            _budget: None,
        })
    }

    /// Bytes read into a buffer, holding `budget` until dropped.
    pub(crate) fn budgeted(
        bytes: Vec<u8>,
        budget: tokio::sync::OwnedSemaphorePermit,
    ) -> MessageBytes {
        MessageBytes(Held::Buffer {
            bytes,
            _budget: Some(budget),
        })
    }

    /// Bytes in a receive slot, re-posted when dropped.
    pub(crate) fn slot(message: crate::verbs::RecvMessage) -> MessageBytes {
        MessageBytes(Held::Slot(message))
    }
}

impl Deref for MessageBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Held::Buffer { bytes, .. } => bytes,
            Held::Slot(message) => message,
        }
    }
}

impl AsRef<[u8]> for MessageBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for MessageBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = match &self.0 {
            Held::Buffer { .. } => "buffer",
            Held::Slot(_) => "receive slot",
        };
        write!(f, "MessageBytes({} bytes in a {held})", self.len())
    }
}

/// Why a fabric call failed at once.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// No connection to this peer.
    #[error("no connection to {0}")]
    NotConnected(NodeId),
    /// The message is larger than the fabric can carry in one piece.
    #[error("message of {len} bytes exceeds the {limit}-byte limit")]
    MessageTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A region is outside the local arenas.
    #[error("region {0} is outside this node's arenas")]
    BadRegion(LocalRegion),
    /// A view of a local region alive in this process conflicts with the one the call needs
    /// (a send or grant of bytes being written): refused rather than aliased.
    #[error("region {region} is in use in this process")]
    InUse {
        /// The region.
        region: LocalRegion,
        /// Which conflict.
        #[source]
        source: ViewError,
    },
    /// An empty message (every message has at least a header).
    #[error("cannot send an empty message")]
    EmptyMessage,
    /// READ access to a region could not be granted (verbs: a memory window could not be
    /// allocated or bound).
    #[error("cannot grant READ access: {0}")]
    Grant(GrantError),
    /// The peer stopped taking messages: too much already waits for it. The connection was
    /// dropped (a [`FabricEvent::PeerLost`] with the reason follows), so the node can go on
    /// with other peers instead of buffering without limit.
    #[error(
        "{peer} is not taking messages: {queued} {unit} waiting (limit {limit}); the connection \
         was dropped"
    )]
    PeerNotReading {
        /// The peer.
        peer: NodeId,
        /// How much waited.
        queued: usize,
        /// The limit.
        limit: usize,
        /// Unit of `queued` and `limit` (`messages`, `bytes`).
        unit: &'static str,
    },
}

/// What the node hears when a grant fails: the fabric's error as a value the node's input
/// (recorded, replayed) can carry.
impl From<FabricError> for GrantError {
    fn from(error: FabricError) -> Self {
        match error {
            FabricError::Grant(grant) => grant,
            FabricError::NotConnected(peer) => GrantError::NotConnected(peer),
            FabricError::BadRegion(region) => GrantError::BadRegion(region),
            FabricError::InUse { region, .. } => GrantError::InUse(region),
            other @ (FabricError::MessageTooLarge { .. }
            | FabricError::EmptyMessage
            | FabricError::PeerNotReading { .. }) => GrantError::Device(other.to_string()),
        }
    }
}

/// Identity and secrets every connection handshake checks. `Debug` shows the token as
/// `ClusterToken(***)`.
#[derive(Debug, Clone)]
pub struct FabricIdentity {
    /// This node.
    pub node: NodeId,
    /// Shared by every node of one cluster; a peer that cannot prove it is refused.
    pub cluster_token: crate::token::ClusterToken,
}

/// The arenas a fabric serves READs from and writes READ data into, by id.
pub type Arenas = BTreeMap<ArenaId, Arc<SharedArena>>;

/// A way to move messages and one-sided READs between nodes.
pub trait Fabric: Send + Sync {
    /// Short name for logs: `tcp`, `verbs`.
    fn name(&self) -> &'static str;

    /// The address peers connect to (to publish in the directory).
    fn listen_addr(&self) -> SocketAddr;

    /// How peers name each local arena in READs; given to the core at start.
    fn region_keys(&self) -> BTreeMap<ArenaId, ArenaKey>;

    /// Opens a connection to `peer` at `addr` unless one is up or being made. Completes with
    /// [`FabricEvent::PeerConnected`] or [`FabricEvent::PeerLost`].
    fn connect(&self, peer: NodeId, addr: SocketAddr);

    /// Whether a connection to `peer` is up or being made.
    fn is_connected_or_connecting(&self, peer: NodeId) -> bool;

    /// Sends an encoded message. Never waits for the driver's event channel, and takes no
    /// place in it: a connection the call drops (a peer not reading) is reported by the
    /// fabric itself (TCP: the connection's reader, as it ends; verbs: through the poller's
    /// backlog).
    fn send(&self, peer: NodeId, bytes: Vec<u8>) -> Result<(), FabricError>;

    /// Sends an `EagerData` message whose payload is `source` in a local arena: the fabric
    /// copies the bytes through a [`ReadableRegion`] of `source` before it returns (refused
    /// with [`FabricError::InUse`] while a writable view of it is alive here). As
    /// [`Fabric::send`] for the event channel.
    fn send_eager(
        &self,
        peer: NodeId,
        header: &EagerHeader,
        source: LocalRegion,
    ) -> Result<(), FabricError>;

    /// Posts a one-sided READ of `remote` on `peer` into `local`, on queue pair `lane`.
    /// Completes with [`FabricEvent::ReadCompleted`] (also when the READ fails at once). The
    /// fabric holds a [`WritableRegion`] of `local` until the READ is over and releases it
    /// before the event; a `local` another view of this process overlaps fails at once.
    ///
    /// `Err(`[`EventsFull`]`)`: the driver's event channel has no place for the completion, so
    /// nothing was posted and no event will come (the driver fails the READ itself).
    fn post_read(
        &self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
    ) -> Result<(), EventsFull>;

    /// Lets `peer` READ `region` (a pinned object) for the lease of its transfer `req`: the
    /// keys it must READ with, scoped to that lease where the fabric can (TCP: a random key
    /// that serves only `peer` and only `region`; verbs: a memory window bound to `region` on
    /// each lane to `peer`). `Ok(None)`: under way, answered by [`FabricEvent::ReadGranted`].
    /// The fabric holds a [`ReadableRegion`] of `region` until the revocation is complete, so
    /// nothing in this process can write it while a READ may read it.
    fn grant_read(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
    ) -> Result<Option<ReadGrant>, FabricError>;

    /// Ends the access [`Fabric::grant_read`] gave for `peer`'s lease `req`. `true`: no READ
    /// reaches the region through its keys from now on; `false`: once
    /// [`FabricEvent::ReadRevoked`] comes (a READ still being served, an invalidation posted).
    /// The caller keeps the region's memory unchanged until then.
    fn revoke_read(&self, peer: NodeId, req: TransferId) -> bool;

    /// As [`Fabric::grant_read`], for `region` of a copy still being received here (a relay's,
    /// see the core's `relay`): READs land in the block while it is granted, so the fabric
    /// views no more than each READ's range while serving it, admits only ranges below the
    /// prefix [`Fabric::extend_partial_read`] said is in (none at first), and refuses a range
    /// a writable view of this process still holds. Revoked with [`Fabric::revoke_read`].
    /// Fabrics that cannot serve a partial copy refuse with
    /// [`GrantError::PartialCopyUnsupported`] (the reader then fetches from the holder).
    fn grant_partial_read(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
    ) -> Result<Option<ReadGrant>, FabricError> {
        let _ = (peer, req, region);
        Err(FabricError::Grant(GrantError::PartialCopyUnsupported))
    }

    /// The first `prefix` bytes of the region granted to `peer`'s lease `req` by
    /// [`Fabric::grant_partial_read`] are in: READs below it may be served from now on. Call
    /// before the reader is told (the prefix only grows; a smaller one changes nothing).
    fn extend_partial_read(&self, peer: NodeId, req: TransferId, prefix: u64) {
        let _ = (peer, req, prefix);
    }

    /// Whether [`Fabric::grant_partial_read`] serves copies still being received, so this node
    /// may relay (send requesters to one another's partial copies).
    fn serves_partial_copies(&self) -> bool {
        false
    }
}
