//! Errors of connection set-up, posting and polling, each naming the failing verb.

use std::io;
use std::time::Duration;

use crate::verbs::handshake::HandshakeError;
use crate::verbs::registration::RegisterError;

/// Why connecting failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The configuration asks for something impossible.
    #[error("invalid connection config: {0}")]
    Config(String),
    /// The TCP handshake failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// A verb failed while setting up (named).
    #[error("{verb} failed")]
    Verb {
        /// The verb, e.g. `ibv_create_qp`.
        verb: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// `mmap` of a slot slab failed.
    #[error("mmap of a {bytes}-byte slot slab failed")]
    SlabMap {
        /// Size of the slab.
        bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Registering a slot slab (`ibv_reg_mr`) failed.
    #[error("registering a slot slab")]
    SlabRegister(#[source] RegisterError),
}

/// Why a post was refused. Nothing was posted when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// Lane index out of range.
    #[error("lane {0} does not exist")]
    NoSuchLane(usize),
    /// The lane's QP reported an error completion or was forced to error.
    #[error("lane {0} has failed")]
    LaneFailed(usize),
    /// No send slot or send queue entry free: poll completions first.
    #[error("lane {lane}: send queue full ({in_flight} of {depth} in flight, {wanted} wanted)")]
    QueueFull {
        /// Lane.
        lane: usize,
        /// Work requests in flight.
        in_flight: u32,
        /// Queue depth.
        depth: u32,
        /// Work requests in this post.
        wanted: u32,
    },
    /// Message larger than the peer's receive slot, or READ larger than 2 GiB, or empty.
    #[error("bad length {len} (limit {limit})")]
    BadLength {
        /// Offending length.
        len: u64,
        /// Limit.
        limit: u64,
    },
    /// A window's range is empty or not inside one memory region of the registration.
    #[error("window of {len} bytes at {addr:#x} is not inside one registered region")]
    OutsideRegistration {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// The receive slot holds no message: released twice, or never received.
    #[error("receive slot {0} holds no message")]
    SlotNotHeld(u32),
    /// A READ's `wr_id` uses the top two bits reserved for the work request kind.
    #[error("wr_id {0:#x} too large (top two bits are reserved)")]
    BadWrId(u64),
    /// `ibv_post_send`, `ibv_post_srq_recv` or `ibv_modify_qp` failed.
    #[error("{verb} failed")]
    Verb {
        /// The verb.
        verb: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
}

/// Why polling failed.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// `ibv_poll_cq` returned an error.
    #[error("ibv_poll_cq failed: errno {0}")]
    PollCq(i32),
    /// No completion arrived before the deadline.
    #[error("no completion within {0:?}")]
    Timeout(Duration),
    /// Reposting released receive slots failed.
    #[error(transparent)]
    Repost(#[from] PostError),
    /// `ibv_req_notify_cq` failed.
    #[error("ibv_req_notify_cq failed")]
    Arm(#[source] io::Error),
}
