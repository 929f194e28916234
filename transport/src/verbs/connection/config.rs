//! What a connection is asked for and what its handshake agreed on.

use std::sync::Arc;
use std::time::Duration;

use crate::verbs::objects::CompletionChannel;

/// Local choices for a connection; the handshake agrees on the minimum of both sides
/// where both must agree.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// Queue pairs to open (agreed: minimum of both sides,
    /// 1..=[`MAX_LANES`](crate::verbs::MAX_LANES)).
    pub lanes: usize,
    /// Size of each receive slot (agreed: minimum). Bounds the largest SEND.
    pub recv_slot_bytes: u32,
    /// Receive slots posted in the connection's shared receive queue, for all its lanes
    /// (agreed: minimum). A driver's credit count.
    pub recv_slots: u32,
    /// Send slots per lane: SENDs in flight per lane.
    pub send_slots: u32,
    /// Send queue depth per lane: SENDs plus READs in flight per lane.
    pub send_queue_depth: u32,
    /// Outstanding READs per QP wanted (agreed: minimum of both sides and both devices).
    pub max_rd_atomic: u32,
    /// Largest SEND posted inline (the device may grant less; 0 disables inline).
    pub max_inline_bytes: u32,
    /// Largest path MTU wanted, in bytes (agreed: minimum of both ports and both sides).
    pub mtu_bytes: u32,
    /// Released receive slots are reposted in batches of this many.
    pub repost_batch: u32,
    /// Completions fetched per `ibv_poll_cq` call.
    pub poll_batch: u32,
    /// Deadline for the whole handshake.
    pub handshake_timeout: Duration,
    /// QP local ACK timeout exponent (4.096 µs * 2^n); 14 is ~67 ms.
    pub ack_timeout: u8,
    /// Transport retries before a QP fails with a retry-exceeded completion.
    pub retry_count: u8,
    /// Receiver-not-ready retries (7 = retry forever).
    pub rnr_retry: u8,
    /// Completion channel the connection's completion queue reports to when armed (see
    /// [`VerbsConnection::arm`](super::VerbsConnection::arm)); `None`: the owner only polls.
    pub completion_channel: Option<Arc<CompletionChannel>>,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            lanes: 2,
            recv_slot_bytes: 8192,
            recv_slots: 64,
            send_slots: 64,
            send_queue_depth: 512,
            max_rd_atomic: 16,
            max_inline_bytes: 128,
            mtu_bytes: 4096,
            repost_batch: 16,
            poll_batch: 32,
            handshake_timeout: Duration::from_secs(10),
            ack_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            completion_channel: None,
        }
    }
}

/// What both sides agreed on, plus what this side's device granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NegotiatedParams {
    /// Lanes (QPs) in use.
    pub lanes: usize,
    /// Path MTU in bytes.
    pub mtu_bytes: u32,
    /// Outstanding READs per QP.
    pub max_rd_atomic: u32,
    /// Receive slot size on both sides: the largest SEND.
    pub recv_slot_bytes: u32,
    /// Receive slots of the shared receive queue on both sides.
    pub recv_slots: u32,
    /// Largest SEND this side posts inline (0: never).
    pub max_inline_bytes: u32,
    /// Send queue depth per lane on this side.
    pub send_queue_depth: u32,
}
