//! Why the verbs fabric did not start, why a handshake failed, why a connection ended. Each
//! variant names the verb, syscall or protocol step, and says what to do where something can be
//! done. A handshake failure or a lost connection reaches the driver as the reason of
//! [`FabricEvent::PeerLost`](crate::fabric::FabricEvent::PeerLost).

use std::io;
use std::net::SocketAddr;

use skyriver_core::{ArenaId, NodeId};

use super::hello::ControlError;
use super::probe::ProbeError;
use crate::verbs::{ConnectionError, DeviceError, PollError, PostError, RegisterError, WcStatus};

/// An error with its chain of sources, for errors of the verbs layer whose own message names
/// only the failing verb.
pub(crate) fn render(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    s
}

/// A [`VerbsFabricConfig`](super::VerbsFabricConfig) that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The receive slot cannot hold the smallest eager message, or is over the message limit.
    #[error("recv_slot_bytes {value} not in {min}..={max}")]
    RecvSlotBytes {
        /// The configured size.
        value: u32,
        /// Smallest useful size.
        min: usize,
        /// The wire's message limit.
        max: usize,
    },
    /// `max_read_bytes` or `max_reads_per_list` is zero.
    #[error("max_read_bytes and max_reads_per_list must be positive")]
    ZeroReadLimit,
    /// A READ list would not fit the send queue.
    #[error("max_reads_per_list {per_list} exceeds send_queue_depth {depth}")]
    ReadsPerList {
        /// READs per list.
        per_list: u32,
        /// Send queue depth.
        depth: u32,
    },
    /// The probe buffer is empty or larger than 64 MiB.
    #[error("probe_bytes {0} not in 1..=64 MiB")]
    ProbeBytes(u64),
}

/// Why [`VerbsFabric::start`](super::VerbsFabric::start) failed; nothing was started.
#[derive(Debug, thiserror::Error)]
pub enum VerbsStartError {
    /// The configuration cannot work.
    #[error("verbs fabric ({device}): bad config: {source}")]
    Config {
        /// The device asked for.
        device: String,
        /// What is wrong.
        #[source]
        source: ConfigError,
    },
    /// Opening the device failed (no libibverbs, no such device, no usable port or GID).
    #[error("verbs fabric ({device}): opening the RDMA device: {}", render(source))]
    OpenDevice {
        /// The device asked for.
        device: String,
        /// Why.
        #[source]
        source: DeviceError,
    },
    /// `ibv_reg_mr` of an arena failed.
    #[error(
        "verbs fabric ({device}): registering {arena} (ibv_reg_mr): {} (check `ulimit -l`: \
         registered memory is locked)",
        render(source)
    )]
    RegisterArena {
        /// The device.
        device: String,
        /// The arena.
        arena: ArenaId,
        /// Why.
        #[source]
        source: RegisterError,
    },
    /// `mmap` of the probe buffer failed.
    #[error("verbs fabric ({device}): mmap of the {bytes}-byte probe buffer: {source}")]
    ProbeBuffer {
        /// The device.
        device: String,
        /// Its size.
        bytes: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_reg_mr` of the probe buffer failed.
    #[error(
        "verbs fabric ({device}): registering the probe buffer (ibv_reg_mr): {}",
        render(source)
    )]
    RegisterProbe {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: RegisterError,
    },
    /// Binding or setting up the control listener failed.
    #[error(
        "verbs fabric ({device}): cannot listen on {addr}: {source} (is the port taken? pick \
         another listen address)"
    )]
    Listen {
        /// The device.
        device: String,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A thread of the fabric could not be started.
    #[error("verbs fabric ({device}): starting the {thread} thread: {source}")]
    Thread {
        /// The device.
        device: String,
        /// Which thread.
        thread: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// What is wrong with a hello's limits or chunk tables.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloShapeError {
    /// More probe pings than allowed.
    #[error("{pings} probe pings (at most {limit})")]
    TooManyPings {
        /// Asked.
        pings: u32,
        /// The limit.
        limit: u32,
    },
    /// A zero receive slot size.
    #[error("zero receive slot size")]
    ZeroSlot,
    /// More arenas than allowed.
    #[error("{arenas} arenas (at most {limit})")]
    TooManyArenas {
        /// Announced.
        arenas: usize,
        /// The limit.
        limit: usize,
    },
    /// More memory regions than allowed.
    #[error("{chunks} memory regions (at most {limit})")]
    TooManyChunks {
        /// Announced.
        chunks: usize,
        /// The limit.
        limit: usize,
    },
    /// An arena without memory regions.
    #[error("arena-{arena} has no memory region")]
    NoRegion {
        /// The arena.
        arena: u32,
    },
    /// An empty or overflowing memory region.
    #[error("arena-{arena}: bad region {addr:#x}+{len}")]
    BadRegion {
        /// The arena.
        arena: u32,
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// An arena's regions leave gaps.
    #[error("arena-{arena}: regions not contiguous")]
    NotContiguous {
        /// The arena.
        arena: u32,
    },
    /// Two arenas overlap.
    #[error("peer announced overlapping arenas")]
    OverlappingArenas,
}

/// Why this side refuses a peer's hello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloRejection {
    /// Another cluster token.
    #[error(
        "node-{node} presented a wrong cluster token; refused (every node of a cluster needs \
         the same token)"
    )]
    WrongToken {
        /// The node it claimed to be.
        node: u32,
    },
    /// The acceptor's proof of the token does not hold.
    #[error(
        "node-{node} could not prove the cluster token; refused (something other than this \
         cluster's node answers at its address, or it has another token)"
    )]
    Unproven {
        /// The node it claimed to be.
        node: u32,
    },
    /// The proven hello names another node than the handshake opened with.
    #[error("the hello names node-{hello} but the handshake opened as node-{opened}")]
    SwitchedNode {
        /// The node of the opening frame.
        opened: u32,
        /// The node of the hello.
        hello: u32,
    },
    /// Limits or chunk tables out of shape.
    #[error("node-{node}: {source}")]
    Shape {
        /// The node it claimed to be.
        node: u32,
        /// What is wrong.
        #[source]
        source: HelloShapeError,
    },
    /// The peer uses this node's id.
    #[error("peer claims this node's own id node-{node} (give every node its own id)")]
    OwnId {
        /// The id.
        node: u32,
    },
    /// Another node answered at the address.
    #[error("expected {expected} at this address, found node-{found}")]
    WrongNode {
        /// The node the driver asked for.
        expected: NodeId,
        /// The node that answered.
        found: u32,
    },
    /// Receive slot sizes differ.
    #[error(
        "receive slot size mismatch: node-{peer} uses {theirs} bytes, {me} uses {ours} \
         (configure every node alike)"
    )]
    SlotSize {
        /// The peer.
        peer: u32,
        /// Its slot size.
        theirs: u32,
        /// This node.
        me: NodeId,
        /// This node's slot size.
        ours: u32,
    },
}

/// Why a connection handshake failed (either side). The reason of `PeerLost` when the driver
/// waits for the peer.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeFailure {
    /// TCP `connect` to the peer's control address failed.
    #[error("TCP connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The control stream failed at a stage of the handshake.
    #[error("{stage}: {}", render(source))]
    Control {
        /// The stage (`hello`, `sending costs`...).
        stage: &'static str,
        /// Why.
        #[source]
        source: ControlError,
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
    Rejected(#[from] HelloRejection),
    /// The peer said its own connection wins, and it never came.
    #[error("{reason}, but {peer}'s connection did not arrive in time")]
    YieldTimedOut {
        /// The peer.
        peer: NodeId,
        /// The peer's words.
        reason: String,
    },
    /// Creating or connecting the queue pairs failed.
    #[error("QP handshake with {peer}: {}", render(source))]
    QpHandshake {
        /// The peer.
        peer: NodeId,
        /// Why.
        #[source]
        source: ConnectionError,
    },
    /// The cost probe failed.
    #[error("cost probe with {peer}: {source}")]
    Probe {
        /// The peer.
        peer: NodeId,
        /// Why.
        #[source]
        source: ProbeError,
    },
    /// Making the control stream non-blocking (`fcntl`) failed.
    #[error("control stream (fcntl O_NONBLOCK): {source}")]
    ControlStream {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No thread for the handshake.
    #[error("cannot start a handshake thread: {source}")]
    Thread {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The driver asked to connect to this node itself.
    #[error("refusing to connect to this node itself")]
    SelfConnect,
}

/// Why a live connection ended: the reason of its `PeerLost`.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionLost {
    /// A receive completed with an error.
    #[error("receive on lane {lane} failed: {status}")]
    Recv {
        /// The lane.
        lane: usize,
        /// The completion status.
        status: WcStatus,
    },
    /// A SEND completed with an error.
    #[error("SEND on lane {lane} failed: {status}")]
    Send {
        /// The lane.
        lane: usize,
        /// The completion status.
        status: WcStatus,
    },
    /// A READ completed with an error (the QP is in the error state).
    #[error("READ on lane {lane} failed: {status}")]
    Read {
        /// The lane.
        lane: usize,
        /// The completion status.
        status: WcStatus,
    },
    /// `ibv_post_send` of a SEND failed.
    #[error("posting a SEND (ibv_post_send): {}", render(source))]
    PostSend {
        /// Why.
        #[source]
        source: PostError,
    },
    /// `ibv_post_send` of a READ list failed.
    #[error("posting READs on lane {lane} (ibv_post_send): {}", render(source))]
    PostReads {
        /// The lane.
        lane: usize,
        /// Why.
        #[source]
        source: PostError,
    },
    /// A receive completion named a slot that holds no message (a bug of the slot
    /// bookkeeping, reported rather than trusted).
    #[error("taking a message out of its receive slot: {}", render(source))]
    RecvSlot {
        /// Why.
        #[source]
        source: PostError,
    },
    /// Reposting receive slots (`ibv_post_srq_recv`) failed.
    #[error("reposting receive slots (ibv_post_srq_recv): {}", render(source))]
    Repost {
        /// Why.
        #[source]
        source: PostError,
    },
    /// `ibv_poll_cq` failed.
    #[error("polling the completion queue: {}", render(source))]
    Poll {
        /// Why.
        #[source]
        source: PollError,
    },
    /// `ibv_req_notify_cq` failed.
    #[error("arming the completion queue: {}", render(source))]
    Arm {
        /// Why.
        #[source]
        source: PollError,
    },
    /// Too many messages wait for send-queue room: the peer stopped taking them (its receive
    /// slots stay full, so every SEND waits on receiver-not-ready retries).
    #[error(
        "{queued} messages of {queued_bytes} bytes waiting for send-queue room (limits \
         {max_messages} messages, {max_bytes} bytes): the peer stopped taking messages"
    )]
    PeerNotReading {
        /// Messages queued.
        queued: usize,
        /// Their bytes.
        queued_bytes: usize,
        /// `max_queued_sends`.
        max_messages: usize,
        /// `max_queued_send_bytes`.
        max_bytes: usize,
    },
    /// The peer closed the control stream.
    #[error("the peer closed the control connection")]
    ControlClosed,
    /// Reading the control stream failed.
    #[error("control connection: {source}")]
    Control {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// This fabric shut down.
    #[error("the local fabric shut down")]
    Shutdown,
}

/// Why a READ names memory the peer did not register.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteRegionError {
    /// `addr + len` overflows.
    #[error("address overflow")]
    Overflow,
    /// Not inside any arena of the peer.
    #[error("not inside any of the peer's registered arenas")]
    OutsideArenas,
    /// Runs past the end of an arena.
    #[error("runs past the end of the peer's arena at {base:#x}+{len}")]
    PastEnd {
        /// The arena's base.
        base: u64,
        /// Its length.
        len: u64,
    },
    /// The rkey is not the arena's key.
    #[error("rkey {rkey:#x} is not the key of the peer's arena at {base:#x} ({key:#x})")]
    WrongKey {
        /// The rkey of the READ.
        rkey: u32,
        /// The arena's base.
        base: u64,
        /// The arena's key.
        key: u32,
    },
}
