//! An RC connection to one peer: several QPs ("lanes") sharing one completion queue and one
//! shared receive queue, registered receive and send slabs of fixed-size slots, SEND (inline
//! when small), RDMA READ lists with selective signaling, batched completion polling, and an
//! optional completion channel so an idle owner can sleep until a completion arrives.
//!
//! The receive slots live in a shared receive queue (SRQ) that every lane draws from: their
//! memory grows with the number of peers, not with peers x lanes, and a message arriving on
//! any lane finds a posted slot.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::device::{mtu_from_bytes, VerbsDevice};
use super::handshake::{Control, HandshakeError, Hello, MAX_LANES};
use super::objects::{CompletionChannel, CompletionQueue, QueuePair, SharedReceiveQueue};
use super::registration::Registration;
use super::sys::library::{ibv_poll_cq, ibv_post_send, ibv_post_srq_recv};
use super::sys::types::*;
use super::MAX_MESSAGE_BYTES;

// Work request ids carry their kind in the top two bits; the rest is the caller's id
// (READ) or a slot index (SEND, RECV). A flushed completion's opcode is undefined, so the
// kind must come from the id.
const KIND_SHIFT: u32 = 62;
const KIND_READ: u64 = 0;
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Local choices for a connection; the handshake agrees on the minimum of both sides
/// where both must agree.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// Queue pairs to open (agreed: minimum of both sides, 1..=[`MAX_LANES`]).
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
    /// [`VerbsConnection::arm`]); `None`: the owner only polls.
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
    /// Mapping or registering the slot slabs failed.
    #[error("slot memory: {0}")]
    Memory(String),
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

/// One RDMA READ: `len` bytes from the peer's `remote_addr` (under `rkey`) into the local
/// `local_addr` (under `lkey`). Both ranges must lie inside one memory region each; see
/// [`super::plan_reads`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Caller's id, reported in the completion (top two bits must be zero).
    pub wr_id: u64,
    /// Local destination address.
    pub local_addr: u64,
    /// Local key of the destination's region.
    pub lkey: u32,
    /// Remote source address.
    pub remote_addr: u64,
    /// Remote key of the source's region.
    pub rkey: u32,
    /// Bytes to read.
    pub len: u32,
}

/// Work completion status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: WcStatus = WcStatus(0);
    /// `IBV_WC_LOC_PROT_ERR`: a local key does not cover the local range.
    pub const LOCAL_PROTECTION: WcStatus = WcStatus(4);
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP is in the error state.
    pub const FLUSHED: WcStatus = WcStatus(5);
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused the remote key or range.
    pub const REMOTE_ACCESS: WcStatus = WcStatus(10);
    /// `IBV_WC_RETRY_EXC_ERR`: the peer stopped answering.
    pub const RETRY_EXCEEDED: WcStatus = WcStatus(12);

    /// True for `IBV_WC_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// The libibverbs name of the status.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 24] = [
            "SUCCESS",
            "LOC_LEN_ERR",
            "LOC_QP_OP_ERR",
            "LOC_EEC_OP_ERR",
            "LOC_PROT_ERR",
            "WR_FLUSH_ERR",
            "MW_BIND_ERR",
            "BAD_RESP_ERR",
            "LOC_ACCESS_ERR",
            "REM_INV_REQ_ERR",
            "REM_ACCESS_ERR",
            "REM_OP_ERR",
            "RETRY_EXC_ERR",
            "RNR_RETRY_EXC_ERR",
            "LOC_RDD_VIOL_ERR",
            "REM_INV_RD_REQ_ERR",
            "REM_ABORT_ERR",
            "INV_EECN_ERR",
            "INV_EEC_STATE_ERR",
            "FATAL_ERR",
            "RESP_TIMEOUT_ERR",
            "GENERAL_ERR",
            "TM_ERR",
            "TM_RNDV_INCOMPLETE",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("UNKNOWN")
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// What a completed work request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// A SEND this side posted.
    Send,
    /// An RDMA READ this side posted (the signaled last one of a list, or a failed one).
    Read,
    /// A message arrived in a receive slot (or a posted receive was flushed).
    Recv,
}

/// A receive slot holding an arrived message until [`VerbsConnection::release_recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecvSlot(pub u32);

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Lane (QP) it happened on.
    pub lane: usize,
    /// The caller's id (SEND, READ) or the receive slot index (RECV).
    pub wr_id: u64,
    /// Success or why not.
    pub status: WcStatus,
    /// What completed.
    pub opcode: Opcode,
    /// Bytes received (RECV) or read (READ); not meaningful for errors.
    pub byte_len: u32,
}

impl Completion {
    /// The slot holding the message, for a successful receive.
    pub fn recv_slot(&self) -> Option<RecvSlot> {
        (self.opcode == Opcode::Recv && self.status.is_success())
            .then_some(RecvSlot(self.wr_id as u32))
    }
}

struct Lane {
    qp: QueuePair,
    qpn: u32,
    failed: bool,
    /// Send queue entries in flight.
    sq_in_flight: u32,
    /// Sizes of the posted blocks, oldest first; each block ends with its one signaled WR.
    blocks: VecDeque<u32>,
    free_send_slots: Vec<u32>,
}

/// A connected RC connection of one or more lanes. Owned by one thread (it is `Send`).
pub struct VerbsConnection {
    // Field order is drop order: QPs go before the SRQ, the CQ and the memory they reference.
    lanes: Vec<Lane>,
    srq: Arc<SharedReceiveQueue>,
    cq: Arc<CompletionQueue>,
    recv_reg: Registration,
    send_reg: Registration,
    recv_mem: MmapMut,
    send_mem: MmapMut,
    params: NegotiatedParams,
    repost_batch: u32,
    /// Released receive slots waiting to be reposted.
    to_repost: Vec<u32>,
    /// Receives posted to the SRQ and not yet completed.
    recv_posted: u32,
    /// `Some(len)`: the slot holds an arrived message the caller has not released.
    recv_held: Vec<Option<u32>>,
    send_wr_ids: Vec<u64>,
    wc_buf: Vec<ibv_wc>,
}

fn verb_err(verb: &'static str) -> impl FnOnce(io::Error) -> ConnectionError {
    move |source| ConnectionError::Verb { verb, source }
}

fn post_err(verb: &'static str) -> impl FnOnce(io::Error) -> PostError {
    move |source| PostError::Verb { verb, source }
}

fn random_psn() -> u32 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() as u32) & 0xff_ffff
}

impl VerbsConnection {
    /// Connect over `control` (this side opened the TCP connection). Symmetric with
    /// [`VerbsConnection::accept`]; both run the same handshake.
    pub fn connect(
        device: &VerbsDevice,
        control: &mut TcpStream,
        config: &ConnectionConfig,
    ) -> Result<VerbsConnection, ConnectionError> {
        Self::establish(device, control, config)
    }

    /// Accept over `control` (this side accepted the TCP connection).
    pub fn accept(
        device: &VerbsDevice,
        control: &mut TcpStream,
        config: &ConnectionConfig,
    ) -> Result<VerbsConnection, ConnectionError> {
        Self::establish(device, control, config)
    }

    fn establish(
        device: &VerbsDevice,
        control: &mut TcpStream,
        config: &ConnectionConfig,
    ) -> Result<VerbsConnection, ConnectionError> {
        let limits = device.limits();
        let bad = |s: String| Err(ConnectionError::Config(s));
        if config.lanes == 0 || config.lanes > MAX_LANES {
            return bad(format!("lanes {} not in 1..={MAX_LANES}", config.lanes));
        }
        if config.recv_slot_bytes == 0 || config.recv_slots == 0 || config.send_slots == 0 {
            return bad("zero slots or slot size".into());
        }
        if config.repost_batch == 0 || config.poll_batch == 0 {
            return bad("zero repost or poll batch".into());
        }
        if mtu_from_bytes(config.mtu_bytes).is_none() {
            return bad(format!(
                "MTU {} is not 256..4096, a power of two",
                config.mtu_bytes
            ));
        }
        if limits.max_srq == 0 || limits.max_srq_wr == 0 {
            return bad(format!(
                "device {} has no shared receive queues",
                device.name()
            ));
        }
        let sq_depth = config.send_queue_depth.min(limits.max_qp_wr);
        let recv_slots_cap = config.recv_slots.min(limits.max_srq_wr);
        let send_slots = config.send_slots.min(sq_depth);
        if sq_depth == 0 || recv_slots_cap == 0 {
            return bad("device allows no work requests".into());
        }
        let lanes_wanted = config.lanes.min(limits.max_qp as usize).max(1);
        let cqe = sq_depth as usize * lanes_wanted + recv_slots_cap as usize;
        if cqe > limits.max_cqe as usize {
            return bad(format!(
                "needs {cqe} CQ entries, device allows {}",
                limits.max_cqe
            ));
        }
        let rd_atomic = config
            .max_rd_atomic
            .min(limits.max_qp_rd_atom)
            .min(limits.max_qp_init_rd_atom)
            .clamp(1, 255);
        let mtu_bytes = config.mtu_bytes.min(device.port().active_mtu_bytes);

        // 1. CQ, SRQ and QPs (RESET -> INIT).
        let cq = device
            .ctx
            // Cannot truncate: checked against max_cqe (a u32) above.
            .create_cq(cqe as u32, config.completion_channel.as_ref())
            .map_err(verb_err("ibv_create_cq"))?;
        let srq = Arc::new(
            device
                .pd
                .create_srq(recv_slots_cap)
                .map_err(verb_err("ibv_create_srq"))?,
        );
        let mut inline = config.max_inline_bytes;
        let mut lanes = Vec::with_capacity(lanes_wanted);
        for _ in 0..lanes_wanted {
            // Fall back to no inline data when the device refuses the size.
            let (qp, cap) = match device.pd.create_rc_qp(&cq, &srq, sq_depth, inline) {
                Err(_) if inline > 0 => {
                    inline = 0;
                    device.pd.create_rc_qp(&cq, &srq, sq_depth, 0)
                }
                other => other,
            }
            .map_err(verb_err("ibv_create_qp"))?;
            inline = inline.min(cap.max_inline_data);
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_INIT,
                pkey_index: 0,
                port_num: device.port().port,
                qp_access_flags: (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) as u32,
                ..ibv_qp_attr::default()
            };
            qp.modify(
                &mut attr,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            )
            .map_err(verb_err("ibv_modify_qp(INIT)"))?;
            let qpn = qp.qp_num();
            lanes.push(Lane {
                qp,
                qpn,
                failed: false,
                sq_in_flight: 0,
                blocks: VecDeque::new(),
                free_send_slots: Vec::new(),
            });
        }
        let psns: Vec<u32> = lanes.iter().map(|_| random_psn()).collect();

        // 2. Exchange hellos; agree on the minimum.
        let mut ctl = Control::new(control, config.handshake_timeout)?;
        let mine = Hello {
            mtu_bytes,
            max_rd_atomic: rd_atomic,
            recv_slot_bytes: config.recv_slot_bytes,
            recv_slots: recv_slots_cap,
            lid: device.port().lid,
            gid: device.gid_raw(),
            lanes: lanes.iter().zip(&psns).map(|(l, &p)| (l.qpn, p)).collect(),
        };
        let peer = ctl.exchange_hello(&mine)?;
        let n_lanes = lanes.len().min(peer.lanes.len());
        lanes.truncate(n_lanes);
        let params = NegotiatedParams {
            lanes: n_lanes,
            mtu_bytes: mtu_bytes.min(peer.mtu_bytes),
            max_rd_atomic: rd_atomic.min(peer.max_rd_atomic),
            recv_slot_bytes: config.recv_slot_bytes.min(peer.recv_slot_bytes),
            recv_slots: recv_slots_cap.min(peer.recv_slots),
            max_inline_bytes: inline,
            send_queue_depth: sq_depth,
        };
        let Some(path_mtu) = mtu_from_bytes(params.mtu_bytes) else {
            return bad(format!("agreed MTU {} invalid", params.mtu_bytes));
        };

        // 3. Slot slabs, registered once each.
        let slot = params.recv_slot_bytes as usize;
        let recv_total = slot * params.recv_slots as usize;
        let send_total = slot * send_slots as usize * n_lanes;
        let mut recv_mem =
            MmapMut::map_anon(recv_total).map_err(|e| ConnectionError::Memory(e.to_string()))?;
        let mut send_mem =
            MmapMut::map_anon(send_total).map_err(|e| ConnectionError::Memory(e.to_string()))?;
        // SAFETY: both maps are owned by the connection and outlive the registrations (field
        // order drops the registrations first); the device only writes receive slots that are
        // posted and reads send slots that are in flight, which the slot bookkeeping keeps
        // apart from the slices the connection hands out.
        let recv_reg = unsafe { device.register(recv_mem.as_mut_ptr(), recv_total, u64::MAX) }
            .map_err(|e| ConnectionError::Memory(e.to_string()))?;
        // SAFETY: as above.
        let send_reg = unsafe { device.register(send_mem.as_mut_ptr(), send_total, u64::MAX) }
            .map_err(|e| ConnectionError::Memory(e.to_string()))?;

        let mut conn = VerbsConnection {
            lanes,
            srq,
            cq,
            recv_reg,
            send_reg,
            recv_mem,
            send_mem,
            params,
            repost_batch: config.repost_batch.min(params.recv_slots),
            to_repost: (0..params.recv_slots).collect(),
            recv_posted: 0,
            recv_held: vec![None; params.recv_slots as usize],
            send_wr_ids: vec![0; send_slots as usize * n_lanes],
            wc_buf: Vec::with_capacity(config.poll_batch as usize),
        };
        for (i, lane) in conn.lanes.iter_mut().enumerate() {
            let first = (i as u32) * send_slots;
            lane.free_send_slots = (first..first + send_slots).rev().collect();
        }

        // 4. Post every receive slot, then INIT -> RTR -> RTS.
        conn.repost().map_err(verb_err("ibv_post_srq_recv"))?;
        for (i, lane) in conn.lanes.iter_mut().enumerate() {
            let (peer_qpn, peer_psn) = peer.lanes[i];
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_RTR,
                path_mtu,
                dest_qp_num: peer_qpn,
                rq_psn: peer_psn,
                max_dest_rd_atomic: params.max_rd_atomic as u8,
                min_rnr_timer: 12,
                ah_attr: ibv_ah_attr {
                    grh: ibv_global_route {
                        dgid: ibv_gid { raw: peer.gid },
                        flow_label: 0,
                        // Cannot truncate: VerbsDevice::open rejects GID indexes above 255.
                        sgid_index: device.gid_index() as u8,
                        hop_limit: 64,
                        traffic_class: 0,
                    },
                    dlid: peer.lid,
                    sl: 0,
                    src_path_bits: 0,
                    static_rate: 0,
                    is_global: 1,
                    port_num: device.port().port,
                },
                ..ibv_qp_attr::default()
            };
            lane.qp
                .modify(
                    &mut attr,
                    IBV_QP_STATE
                        | IBV_QP_AV
                        | IBV_QP_PATH_MTU
                        | IBV_QP_DEST_QPN
                        | IBV_QP_RQ_PSN
                        | IBV_QP_MAX_DEST_RD_ATOMIC
                        | IBV_QP_MIN_RNR_TIMER,
                )
                .map_err(verb_err("ibv_modify_qp(RTR)"))?;
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_RTS,
                sq_psn: psns[i],
                timeout: config.ack_timeout,
                retry_cnt: config.retry_count,
                rnr_retry: config.rnr_retry,
                max_rd_atomic: params.max_rd_atomic as u8,
                ..ibv_qp_attr::default()
            };
            lane.qp
                .modify(
                    &mut attr,
                    IBV_QP_STATE
                        | IBV_QP_SQ_PSN
                        | IBV_QP_TIMEOUT
                        | IBV_QP_RETRY_CNT
                        | IBV_QP_RNR_RETRY
                        | IBV_QP_MAX_QP_RD_ATOMIC,
                )
                .map_err(verb_err("ibv_modify_qp(RTS)"))?;
        }

        // 5. Both sides ready: receives are posted before anyone sends.
        ctl.exchange_ready()?;
        Ok(conn)
    }

    /// What the handshake agreed on.
    pub fn params(&self) -> NegotiatedParams {
        self.params
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Local QP number of each lane.
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.lanes.iter().map(|l| l.qpn).collect()
    }

    /// True once the lane reported an error completion or was forced to error.
    pub fn lane_failed(&self, lane: usize) -> bool {
        self.lanes.get(lane).is_none_or(|l| l.failed)
    }

    /// Work requests in flight on the lane's send queue.
    pub fn in_flight(&self, lane: usize) -> u32 {
        self.lanes.get(lane).map_or(0, |l| l.sq_in_flight)
    }

    /// SEND `bytes` (at most the agreed receive slot size) on `lane`; the completion
    /// reports `wr_id`. Small messages go inline; others are copied into a registered send
    /// slot, so `bytes` may be reused at once.
    pub fn post_send(&mut self, lane: usize, wr_id: u64, bytes: &[u8]) -> Result<(), PostError> {
        let limit = u64::from(self.params.recv_slot_bytes);
        if bytes.is_empty() || bytes.len() as u64 > limit {
            return Err(PostError::BadLength {
                len: bytes.len() as u64,
                limit,
            });
        }
        let inline = bytes.len() as u32 <= self.params.max_inline_bytes;
        let slot_bytes = self.params.recv_slot_bytes as usize;
        let send_base = self.send_reg.addr();
        let send_lkey = self.send_reg.chunks()[0].lkey;
        let depth = self.params.send_queue_depth;
        let l = lane_checked(&mut self.lanes, lane, 1, depth)?;
        let Some(slot) = l.free_send_slots.pop() else {
            return Err(PostError::QueueFull {
                lane,
                in_flight: l.sq_in_flight,
                depth,
                wanted: 1,
            });
        };
        let offset = slot as usize * slot_bytes;
        let id = (KIND_SEND << KIND_SHIFT) | u64::from(slot);
        let mut sge = if inline {
            // Inline data is copied out of `bytes` by the post itself; no key is needed.
            ibv_sge {
                addr: bytes.as_ptr() as u64,
                length: bytes.len() as u32,
                lkey: 0,
            }
        } else {
            // The slab has one chunk (registered without a size cap); the slot is free, so the
            // device is not reading it.
            self.send_mem[offset..offset + bytes.len()].copy_from_slice(bytes);
            ibv_sge {
                addr: send_base + offset as u64,
                length: bytes.len() as u32,
                lkey: send_lkey,
            }
        };
        let mut wr = send_wr(id, IBV_WR_SEND, &mut sge);
        // IBV_SEND_INLINE must be in the WR flags: the provider copies the bytes at post time.
        wr.send_flags = IBV_SEND_SIGNALED | if inline { IBV_SEND_INLINE } else { 0 };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the WR and its one SGE live on this stack frame for the
        // call. Inline: the provider copies `bytes` before returning. Otherwise the SGE names
        // the send slot [send_base + offset, + len) of the registered send slab (lkey
        // send_lkey), which stays registered while the QP lives, and the slot is not reused
        // until this WR's completion is polled.
        let rc = unsafe { ibv_post_send(l.qp.as_ptr(), &mut wr, &mut bad) };
        if let Err(e) = super::objects::check_rc(rc) {
            l.free_send_slots.push(slot);
            return Err(post_err("ibv_post_send(SEND)")(e));
        }
        l.sq_in_flight += 1;
        l.blocks.push_back(1);
        self.send_wr_ids[slot as usize] = wr_id;
        Ok(())
    }

    /// Post `reads` on `lane` as one work request list. Only the last one is signaled: its
    /// successful completion means the whole list is done (a QP executes its work requests
    /// in order). Any failed request completes on its own with an error status.
    pub fn post_reads(&mut self, lane: usize, reads: &[ReadRequest]) -> Result<(), PostError> {
        if reads.is_empty() {
            return Ok(());
        }
        for r in reads {
            if r.wr_id > ID_MASK {
                return Err(PostError::BadWrId(r.wr_id));
            }
            if r.len == 0 || u64::from(r.len) > MAX_MESSAGE_BYTES {
                return Err(PostError::BadLength {
                    len: u64::from(r.len),
                    limit: MAX_MESSAGE_BYTES,
                });
            }
        }
        let n = u32::try_from(reads.len()).unwrap_or(u32::MAX);
        let depth = self.params.send_queue_depth;
        let l = lane_checked(&mut self.lanes, lane, n, depth)?;
        let mut sges: Vec<ibv_sge> = reads
            .iter()
            .map(|r| ibv_sge {
                addr: r.local_addr,
                length: r.len,
                lkey: r.lkey,
            })
            .collect();
        let mut wrs: Vec<ibv_send_wr> = reads
            .iter()
            .zip(sges.iter_mut())
            .map(|(r, sge)| {
                let mut wr = send_wr((KIND_READ << KIND_SHIFT) | r.wr_id, IBV_WR_RDMA_READ, sge);
                wr.wr.rdma = ibv_send_wr_rdma {
                    remote_addr: r.remote_addr,
                    rkey: r.rkey,
                };
                wr
            })
            .collect();
        // Only the last one is signaled; link the list.
        if let Some(last) = wrs.last_mut() {
            last.send_flags = IBV_SEND_SIGNALED;
        }
        for i in 1..wrs.len() {
            let next: *mut ibv_send_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the linked WRs and their SGEs live in `wrs` and `sges` (not
        // moved or resized after linking) for the call. Each SGE names a local range the device
        // checks against `lkey`'s memory region, which the caller registered under
        // `VerbsDevice::register`'s contract (mapped until the registration is dropped, and
        // written by the device when it is a READ's destination).
        let rc = unsafe { ibv_post_send(l.qp.as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        super::objects::check_rc(rc).map_err(post_err("ibv_post_send(READ)"))?;
        l.sq_in_flight += n;
        l.blocks.push_back(n);
        Ok(())
    }

    /// The message in a receive slot reported by a RECV completion.
    pub fn recv_bytes(&self, slot: RecvSlot) -> &[u8] {
        let i = slot.0 as usize;
        let slot_bytes = self.params.recv_slot_bytes as usize;
        match self.recv_held.get(i) {
            Some(&Some(len)) => {
                let len = (len as usize).min(slot_bytes);
                &self.recv_mem[i * slot_bytes..i * slot_bytes + len]
            }
            // Not holding a message (never arrived, or released): the device may be writing it.
            _ => &[],
        }
    }

    /// Give a receive slot back; slots are reposted in batches. Releasing a slot that holds
    /// no message (twice, or never received) is refused.
    pub fn release_recv(&mut self, slot: RecvSlot) -> Result<(), PostError> {
        match self.recv_held.get_mut(slot.0 as usize) {
            Some(held @ Some(_)) => *held = None,
            _ => return Err(PostError::SlotNotHeld(slot.0)),
        }
        self.to_repost.push(slot.0);
        // Repost a full batch, or at once when the queue runs low on posted receives.
        if self.to_repost.len() as u32 >= self.repost_batch || self.recv_posted < self.repost_batch
        {
            self.repost().map_err(post_err("ibv_post_srq_recv"))?;
        }
        Ok(())
    }

    /// Repost every released receive slot now.
    pub fn flush_reposts(&mut self) -> Result<(), PostError> {
        self.repost().map_err(post_err("ibv_post_srq_recv"))
    }

    /// Receive slots posted to the shared receive queue and not yet filled.
    pub fn recv_posted(&self) -> u32 {
        self.recv_posted
    }

    fn repost(&mut self) -> io::Result<()> {
        if self.to_repost.is_empty() {
            return Ok(());
        }
        let slot_bytes = u64::from(self.params.recv_slot_bytes);
        let base = self.recv_reg.addr();
        let lkey = self.recv_reg.chunks()[0].lkey;
        let mut sges: Vec<ibv_sge> = self
            .to_repost
            .iter()
            .map(|&slot| ibv_sge {
                addr: base + u64::from(slot) * slot_bytes,
                length: slot_bytes as u32,
                lkey,
            })
            .collect();
        let mut wrs: Vec<ibv_recv_wr> = self
            .to_repost
            .iter()
            .zip(sges.iter_mut())
            .map(|(&slot, sge)| ibv_recv_wr {
                wr_id: (KIND_RECV << KIND_SHIFT) | u64::from(slot),
                next: std::ptr::null_mut(),
                sg_list: sge,
                num_sge: 1,
            })
            .collect();
        for i in 1..wrs.len() {
            let next: *mut ibv_recv_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the SRQ is live; the linked WRs and SGEs live in `wrs`/`sges` for the call.
        // Each slot lies in the registered receive slab (one region, lkey), which outlives the
        // QPs; a posted slot is not handed out again until its completion is polled.
        let rc = unsafe { ibv_post_srq_recv(self.srq.as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        super::objects::check_rc(rc)?;
        self.recv_posted += self.to_repost.len() as u32;
        self.to_repost.clear();
        Ok(())
    }

    /// Force `lane`'s QP into the error state: everything in flight on it completes with
    /// `WR_FLUSH_ERR`. For fault handling and tests.
    pub fn force_error(&mut self, lane: usize) -> Result<(), PostError> {
        let l = self
            .lanes
            .get_mut(lane)
            .ok_or(PostError::NoSuchLane(lane))?;
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..ibv_qp_attr::default()
        };
        l.qp.modify(&mut attr, IBV_QP_STATE)
            .map_err(post_err("ibv_modify_qp(ERR)"))?;
        l.failed = true;
        Ok(())
    }

    /// Append the completions available now (one `ibv_poll_cq` of up to `poll_batch`) to
    /// `out`; returns how many. Never blocks.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, PollError> {
        let want = self.wc_buf.capacity();
        self.wc_buf.clear();
        // SAFETY: wc_buf has room for `want` entries; ibv_poll_cq writes at most that many
        // and returns how many it wrote, which is all set_len exposes. The CQ is alive (owned).
        let n = unsafe {
            let n = ibv_poll_cq(
                self.cq.as_ptr(),
                c_int::try_from(want).unwrap_or(c_int::MAX),
                self.wc_buf.as_mut_ptr(),
            );
            if n < 0 {
                return Err(PollError::PollCq(-n));
            }
            self.wc_buf.set_len(n as usize);
            n as usize
        };
        for i in 0..n {
            let wc = self.wc_buf[i];
            self.complete(&wc, out);
        }
        Ok(n)
    }

    /// Ask for one event on the completion channel at the next completion (`ibv_req_notify_cq`).
    /// To sleep without missing a completion: arm, [`VerbsConnection::poll`] once more, and
    /// only if that found nothing wait on the channel. Without a channel this is a no-op.
    pub fn arm(&mut self) -> Result<(), PollError> {
        if !self.cq.has_channel() {
            return Ok(());
        }
        self.cq.arm().map_err(PollError::Arm)
    }

    /// Poll until at least one completion arrives or `timeout` passes.
    pub fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, PollError> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            if Instant::now() >= deadline {
                return Err(PollError::Timeout(timeout));
            }
            std::thread::yield_now();
        }
    }

    fn complete(&mut self, wc: &ibv_wc, out: &mut Vec<Completion>) {
        let Some(lane) = self.lanes.iter().position(|l| l.qpn == wc.qp_num) else {
            return; // a QP dropped by the lane negotiation
        };
        let status = WcStatus(wc.status);
        let kind = wc.wr_id >> KIND_SHIFT;
        let id = wc.wr_id & ID_MASK;
        let l = &mut self.lanes[lane];
        if !status.is_success() {
            l.failed = true;
        }
        let completion = match kind {
            KIND_RECV => {
                self.recv_posted = self.recv_posted.saturating_sub(1);
                if let Some(held) = self.recv_held.get_mut(id as usize) {
                    *held = status.is_success().then_some(wc.byte_len);
                }
                Completion {
                    lane,
                    wr_id: id,
                    status,
                    opcode: Opcode::Recv,
                    byte_len: if status.is_success() { wc.byte_len } else { 0 },
                }
            }
            KIND_SEND => {
                l.free_send_slots.push(id as u32);
                retire(l, status);
                Completion {
                    lane,
                    wr_id: self.send_wr_ids.get(id as usize).copied().unwrap_or(0),
                    status,
                    opcode: Opcode::Send,
                    byte_len: wc.byte_len,
                }
            }
            _ => {
                retire(l, status);
                Completion {
                    lane,
                    wr_id: id,
                    status,
                    opcode: Opcode::Read,
                    byte_len: wc.byte_len,
                }
            }
        };
        out.push(completion);
    }
}

fn lane_checked(
    lanes: &mut [Lane],
    lane: usize,
    wanted: u32,
    depth: u32,
) -> Result<&mut Lane, PostError> {
    let l = lanes.get_mut(lane).ok_or(PostError::NoSuchLane(lane))?;
    if l.failed {
        return Err(PostError::LaneFailed(lane));
    }
    if l.sq_in_flight + wanted > depth {
        return Err(PostError::QueueFull {
            lane,
            in_flight: l.sq_in_flight,
            depth,
            wanted,
        });
    }
    Ok(l)
}

/// A signaled send-queue completion retires its whole block (RC completes in order). After
/// an error the lane is dead and its accounting no longer matters.
fn retire(l: &mut Lane, status: WcStatus) {
    if status.is_success() {
        if let Some(n) = l.blocks.pop_front() {
            l.sq_in_flight -= n;
        }
    }
}

/// A send work request with one scatter/gather entry, unsignaled, not linked.
fn send_wr(wr_id: u64, opcode: u32, sge: &mut ibv_sge) -> ibv_send_wr {
    ibv_send_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: 0,
        imm_data: 0,
        wr: ibv_send_wr_wr {
            atomic: ibv_send_wr_atomic::default(),
        },
        qp_type_xrc_remote_srqn: 0,
        bind_mw: ibv_send_wr_bind_mw {
            mw: std::ptr::null_mut(),
            rkey: 0,
            bind_info: ibv_mw_bind_info {
                mr: std::ptr::null_mut(),
                addr: 0,
                length: 0,
                mw_access_flags: 0,
            },
        },
    }
}

impl std::fmt::Debug for VerbsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsConnection")
            .field("params", &self.params)
            .field("qpns", &self.qp_numbers())
            .finish()
    }
}
