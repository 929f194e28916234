//! Why the TCP fabric did not start, why a handshake failed, why a connection ended. A
//! handshake failure or a lost connection reaches the driver as the reason of
//! [`FabricEvent::PeerLost`](crate::fabric::FabricEvent::PeerLost).

use std::io;
use std::net::SocketAddr;

use skyriver_core::NodeId;

/// Why [`TcpFabric::start`](super::TcpFabric::start) failed; nothing was started.
#[derive(Debug, thiserror::Error)]
pub enum TcpStartError {
    /// The fabric's own tokio runtime could not be built.
    #[error("cannot start the TCP fabric runtime: {source}")]
    Runtime {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `worker_threads: 0` outside a tokio runtime.
    #[error(
        "the TCP fabric without worker threads must start inside a tokio runtime (or give it \
         worker threads): {source}"
    )]
    NoRuntime {
        /// Tokio's error.
        #[source]
        source: tokio::runtime::TryCurrentError,
    },
    /// `bind`, `listen` or `getsockname` of the listener failed.
    #[error("cannot listen on {addr}: {source} (is the port taken? pick another listen address)")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Why this side refuses a peer's hello. Sent to the peer as its reason, and logged here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The magic is not ours.
    #[error("not a skyriver TCP fabric peer")]
    NotSkyriver,
    /// Another protocol version.
    #[error("fabric protocol version {theirs} is not supported (this node speaks {ours})")]
    Version {
        /// The peer's version.
        theirs: u32,
        /// Ours.
        ours: u32,
    },
    /// Another cluster token.
    #[error(
        "{node} presented a wrong cluster token (every node of a cluster needs the same token)"
    )]
    WrongToken {
        /// The node it claimed to be.
        node: NodeId,
    },
    /// The peer uses this node's id.
    #[error("{node} is this node's own id (give every node its own id)")]
    OwnId {
        /// The id.
        node: NodeId,
    },
}

/// Why a connection handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum TcpHandshakeError {
    /// TCP `connect` failed.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Reading or writing the stream failed at a stage of the handshake.
    #[error("handshake {stage}: {source}")]
    Io {
        /// `read`, `write`, `round trip`...
        stage: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A handshake frame over the limit.
    #[error("handshake of {len} bytes is over the {limit}-byte limit (not a skyriver peer?)")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A frame that does not decode.
    #[error("malformed handshake (not a skyriver peer?): {source}")]
    Malformed {
        /// The decoder's error.
        #[source]
        source: postcard::Error,
    },
    /// A valid frame out of turn.
    #[error("expected {expected} in the handshake, got {got}")]
    Unexpected {
        /// What was expected.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// The peer refused this side.
    #[error("refused by {peer}: {reason}")]
    RefusedByPeer {
        /// The peer.
        peer: NodeId,
        /// Its reason, as it sent it.
        reason: String,
    },
    /// This side refused the peer.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The peer's proof of the token does not hold: it does not have the cluster token (or
    /// replayed another handshake).
    #[error(
        "{peer} could not prove the cluster token (every node of a cluster needs the same \
         token); connection dropped"
    )]
    PeerLacksToken {
        /// The peer.
        peer: NodeId,
    },
    /// Another node answered at the address.
    #[error("{addr} is {found}, not {expected}")]
    WrongNode {
        /// The address.
        addr: SocketAddr,
        /// Who answered.
        found: NodeId,
        /// Who was expected.
        expected: NodeId,
    },
    /// The whole attempt took longer than `connect_timeout`.
    #[error("connection to {addr} timed out after {timeout_ms} ms")]
    TimedOut {
        /// The address.
        addr: SocketAddr,
        /// The limit.
        timeout_ms: u128,
    },
}

/// Why a live connection ended: the reason of its `PeerLost`.
#[derive(Debug, thiserror::Error)]
pub enum TcpLinkError {
    /// The peer closed the connection.
    #[error("{peer} closed the connection")]
    Closed {
        /// The peer.
        peer: NodeId,
    },
    /// `read` from the socket failed.
    #[error("read from {peer} failed: {source}")]
    Read {
        /// The peer.
        peer: NodeId,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `write` to the socket failed.
    #[error("write to {peer} failed: {source}")]
    Write {
        /// The peer.
        peer: NodeId,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A message over the wire limit.
    #[error("{peer} sent a {len}-byte message (limit {limit})")]
    MessageTooLarge {
        /// The peer.
        peer: NodeId,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A READ response nobody asked for.
    #[error("{peer} answered READ {op} that was not asked for")]
    UnaskedReadResponse {
        /// The peer.
        peer: NodeId,
        /// The READ id it named.
        op: u64,
    },
    /// A READ response of the wrong length.
    #[error("{peer} answered READ {op} with {len} bytes, {asked} asked")]
    ReadLength {
        /// The peer.
        peer: NodeId,
        /// The READ.
        op: u64,
        /// Bytes announced.
        len: u64,
        /// Bytes asked.
        asked: u64,
    },
    /// A frame kind this side does not know.
    #[error("{peer} sent an unknown frame kind {kind}: dropping the connection")]
    UnknownFrame {
        /// The peer.
        peer: NodeId,
        /// The kind byte.
        kind: u8,
    },
    /// The writer task of the connection is gone.
    #[error("the connection's writer stopped")]
    WriterStopped,
    /// The peer does not read what this side sends: the outgoing queue hit its limit.
    #[error(
        "{peer} is not reading: {queued_bytes} bytes in {queued_frames} frames waiting (limits \
         {max_bytes} bytes, {max_frames} frames); disconnected"
    )]
    PeerNotReading {
        /// The peer.
        peer: NodeId,
        /// Bytes waiting.
        queued_bytes: usize,
        /// Frames waiting.
        queued_frames: usize,
        /// The byte limit.
        max_bytes: usize,
        /// The frame limit.
        max_frames: usize,
    },
}
