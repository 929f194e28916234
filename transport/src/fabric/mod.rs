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
//! - a READ is served from the holder's exposed memory by the fabric, never by the holder's
//!   core, and a READ of a region that is not exposed fails with [`ReadError::RemoteAccess`];
//! - when a connection is lost, every READ posted on it completes (with an error) before or
//!   with the [`FabricEvent::PeerLost`] event, and nothing arrives from that peer after it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use skyriver_core::node::{ArenaKey, PeerParams, ReadError, ReadOpId};
use skyriver_core::wire::EagerHeader;
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion};

use crate::arena::SharedArena;

pub mod tcp;
pub mod verbs;

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
    /// A whole message arrived from `peer`; decode with `skyriver_core::wire::decode`.
    Message {
        /// The sender.
        peer: NodeId,
        /// The encoded message.
        bytes: Vec<u8>,
    },
    /// A READ posted with [`Fabric::post_read`] finished; on success its bytes are in place.
    ReadCompleted {
        /// The READ.
        op: ReadOpId,
        /// How it went.
        result: Result<(), ReadError>,
    },
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
    /// An empty message (every message has at least a header).
    #[error("cannot send an empty message")]
    EmptyMessage,
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

/// Identity and secrets every connection handshake checks.
#[derive(Clone)]
pub struct FabricIdentity {
    /// This node.
    pub node: NodeId,
    /// Shared by every node of one cluster; a peer presenting another token is refused.
    pub cluster_token: String,
}

impl fmt::Debug for FabricIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token.
        f.debug_struct("FabricIdentity")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
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

    /// Sends an encoded message.
    fn send(&self, peer: NodeId, bytes: Vec<u8>) -> Result<(), FabricError>;

    /// Sends an `EagerData` message whose payload is `source` in a local arena: the fabric
    /// gathers the bytes (verbs: from the registered arena; TCP: one `writev`).
    fn send_eager(
        &self,
        peer: NodeId,
        header: &EagerHeader,
        source: LocalRegion,
    ) -> Result<(), FabricError>;

    /// Posts a one-sided READ of `remote` on `peer` into `local`, on queue pair `lane`.
    /// Completes with [`FabricEvent::ReadCompleted`] (also when this call fails).
    fn post_read(
        &self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
    );

    /// Peers may READ `region` until it is unexposed.
    fn expose(&self, region: LocalRegion);

    /// Peers may no longer READ `region`. READs already being served may finish.
    fn unexpose(&self, region: LocalRegion);
}
