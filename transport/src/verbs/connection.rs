//! An RC connection to one peer: several QPs ("lanes") sharing one completion queue and one
//! shared receive queue, registered receive and send slabs of fixed-size slots, SEND (inline
//! when small), RDMA READ lists with selective signaling, batched completion polling, and an
//! optional completion channel so an idle owner can sleep until a completion arrives.
//!
//! The receive slots live in a shared receive queue (SRQ) that every lane draws from: their
//! memory grows with the number of peers, not with peers x lanes, and a message arriving on
//! any lane finds a posted slot.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use memmap2::{MmapMut, MmapRaw};

use super::device::{mtu_from_bytes, VerbsDevice};
use super::handshake::{Control, Hello, MAX_LANES};
use super::objects::{CompletionQueue, QueuePair, SharedReceiveQueue};
use super::registration::Registration;
use super::sys::types::*;
use super::window::MemoryWindow;

mod completion;
mod config;
mod data_path;
mod errors;
mod recv_slab;

pub use completion::{Completion, Opcode, ReadRequest, RecvSlot, WcStatus};
pub use config::{ConnectionConfig, NegotiatedParams};
pub use errors::{ConnectionError, PollError, PostError};
use recv_slab::RecvSlab;
pub use recv_slab::{RecvMessage, ReturnWaker};

// Work request ids carry their kind in the top two bits; the rest is the caller's id
// (READ) or a slot index (SEND, RECV). A flushed completion's opcode is undefined, so the
// kind must come from the id.
const KIND_SHIFT: u32 = 62;
const KIND_READ: u64 = 0;
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_WINDOW: u64 = 3;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;
/// Largest work request id a caller may give (the high bits name the request's kind).
pub const WR_ID_MASK: u64 = ID_MASK;

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
    /// Shared with the messages lent out of it (see [`RecvMessage`]), which keep it mapped.
    recv_slab: Arc<RecvSlab>,
    send_mem: MmapMut,
    params: NegotiatedParams,
    repost_batch: u32,
    /// Released receive slots waiting to be reposted.
    to_repost: Vec<u32>,
    /// Receives posted to the SRQ and not yet completed.
    recv_posted: u32,
    /// `Some(len)`: the slot holds an arrived message the caller has not released.
    recv_held: Vec<Option<u32>>,
    /// Slots lent out as [`RecvMessage`]s and not yet taken back by `reclaim_returned`.
    recv_lent: u32,
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
        let recv_mem =
            MmapMut::map_anon(recv_total).map_err(|source| ConnectionError::SlabMap {
                bytes: recv_total,
                source,
            })?;
        let recv_slab = Arc::new(RecvSlab::new(
            MmapRaw::from(recv_mem),
            slot,
            params.recv_slots,
        ));
        let mut send_mem =
            MmapMut::map_anon(send_total).map_err(|source| ConnectionError::SlabMap {
                bytes: send_total,
                source,
            })?;
        // SAFETY: both maps outlive the registrations (the send map is owned by the connection,
        // whose field order drops the registrations first; the receive slab is kept by an Arc
        // the connection holds, and by lent messages after it); the device only writes
        // receive slots that are posted and reads send slots that are in flight, which the
        // slot bookkeeping keeps apart from the slices the connection hands out.
        let recv_reg =
            unsafe { device.register(recv_slab.as_mut_ptr(), recv_slab.len(), u64::MAX) }
                .map_err(ConnectionError::SlabRegister)?;
        // SAFETY: as above.
        let send_reg = unsafe { device.register(send_mem.as_mut_ptr(), send_total, u64::MAX) }
            .map_err(ConnectionError::SlabRegister)?;

        let mut conn = VerbsConnection {
            lanes,
            srq,
            cq,
            recv_reg,
            send_reg,
            recv_slab,
            send_mem,
            params,
            repost_batch: config.repost_batch.min(params.recv_slots),
            to_repost: (0..params.recv_slots).collect(),
            recv_posted: 0,
            recv_held: vec![None; params.recv_slots as usize],
            recv_lent: 0,
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
}

impl std::fmt::Debug for VerbsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsConnection")
            .field("params", &self.params)
            .field("qpns", &self.qp_numbers())
            .finish()
    }
}
