//! `#[repr(C)]` copies of exactly the libibverbs structs, unions and constants the verbs layer
//! uses, written from `<infiniband/verbs.h>` (rdma-core, ABI of `IBVERBS_1.1`, stable since
//! 2016). Names and field names are the C ones, so a reader can hold them against the header.
//! `tests/verbs_layout.rs` compiles a C program against the real header and checks every size
//! and offset declared here.
//!
//! Structs that user code only ever sees behind a pointer (`ibv_device`, `ibv_ah`, `ibv_mw`)
//! are opaque. Structs whose tail we never touch keep their full layout anyway where libibverbs
//! writes them (`ibv_device_attr`, `ibv_port_attr`, `ibv_qp_attr`), since it writes every byte.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};

/// `pthread_mutex_t` on 64-bit Linux (glibc and musl): 40 bytes, 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_mutex_t {
    _opaque: [u8; 40],
}

/// `pthread_cond_t` on 64-bit Linux: 48 bytes, 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_cond_t {
    _opaque: [u8; 48],
}

/// `struct ibv_device`: opaque here (its name comes from `ibv_get_device_name`).
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_ah`: opaque (UD only; appears in `ibv_send_wr`'s union).
#[repr(C)]
pub struct ibv_ah {
    _opaque: [u8; 0],
}

/// `struct ibv_mw`: a memory window.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub type_: u32,
}

/// `union ibv_gid`: 16 raw bytes (the `global` view is the same bytes as two big-endian
/// `u64`s, which give the union 8-byte alignment).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_context_ops`: the provider's function table. Only the data-path entries are
/// typed; the `_compat_*` slots are placeholders that keep the offsets.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context_ops {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw>,
    pub bind_mw: *mut c_void,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub _compat_cq_event: *mut c_void,
    pub _compat_resize_cq: *mut c_void,
    pub _compat_destroy_cq: *mut c_void,
    pub _compat_create_srq: *mut c_void,
    pub _compat_modify_srq: *mut c_void,
    pub _compat_query_srq: *mut c_void,
    pub _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    pub _compat_create_qp: *mut c_void,
    pub _compat_query_qp: *mut c_void,
    pub _compat_modify_qp: *mut c_void,
    pub _compat_destroy_qp: *mut c_void,
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_ah: *mut c_void,
    pub _compat_destroy_ah: *mut c_void,
    pub _compat_attach_mcast: *mut c_void,
    pub _compat_detach_mcast: *mut c_void,
    pub _compat_async_event: *mut c_void,
}

/// `struct ibv_context`: an opened device.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_device_attr` (filled by `ibv_query_device`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [u8; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (filled by `ibv_query_port`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_gid_entry` (filled by `_ibv_query_gid_ex`, IBVERBS_1.11).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_wc`: one work completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_sge`: one scatter/gather entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr`'s `wr` union.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// The `atomic` member of `ibv_send_wr`'s `wr` union (the union's largest member).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `ibv_send_wr`'s `wr` union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// The `bind_mw` member of `ibv_send_wr`'s last union (its largest member).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr`: one send-queue work request.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    /// `imm_data` or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type_xrc_remote_srqn: u32,
    /// `bind_mw` or `tso`.
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// `struct ibv_recv_wr`: one receive work request.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (for `ibv_create_qp`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (for `ibv_create_srq`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (for `ibv_modify_qp` and `ibv_query_qp`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

// ---- constants (enum values of verbs.h) -------------------------------------------------

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
/// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region.
pub const IBV_ACCESS_MW_BIND: c_int = 1 << 4;

/// `enum ibv_mw_type`: `IBV_MW_TYPE_2` (bound by a work request on a QP, usable through it).
pub const IBV_MW_TYPE_2: u32 = 2;

/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: u32 = 2;

/// `enum ibv_qp_state`.
pub const IBV_QPS_INIT: u32 = 1;
/// `IBV_QPS_RTR`.
pub const IBV_QPS_RTR: u32 = 2;
/// `IBV_QPS_RTS`.
pub const IBV_QPS_RTS: u32 = 3;
/// `IBV_QPS_ERR`.
pub const IBV_QPS_ERR: u32 = 6;

/// `enum ibv_qp_attr_mask`.
pub const IBV_QP_STATE: c_int = 1 << 0;
/// `IBV_QP_ACCESS_FLAGS`.
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
/// `IBV_QP_PKEY_INDEX`.
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
/// `IBV_QP_PORT`.
pub const IBV_QP_PORT: c_int = 1 << 5;
/// `IBV_QP_AV`.
pub const IBV_QP_AV: c_int = 1 << 7;
/// `IBV_QP_PATH_MTU`.
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
/// `IBV_QP_TIMEOUT`.
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
/// `IBV_QP_RETRY_CNT`.
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
/// `IBV_QP_RNR_RETRY`.
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
/// `IBV_QP_RQ_PSN`.
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
/// `IBV_QP_MAX_QP_RD_ATOMIC`.
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
/// `IBV_QP_MIN_RNR_TIMER`.
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
/// `IBV_QP_SQ_PSN`.
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
/// `IBV_QP_MAX_DEST_RD_ATOMIC`.
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
/// `IBV_QP_CAP`.
pub const IBV_QP_CAP: c_int = 1 << 19;
/// `IBV_QP_DEST_QPN`.
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// `enum ibv_wr_opcode`: `IBV_WR_SEND`.
pub const IBV_WR_SEND: u32 = 2;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: u32 = 4;
/// `IBV_WR_LOCAL_INV`.
pub const IBV_WR_LOCAL_INV: u32 = 7;
/// `IBV_WR_BIND_MW`.
pub const IBV_WR_BIND_MW: u32 = 8;

/// `enum ibv_wc_opcode`: `IBV_WC_BIND_MW`.
pub const IBV_WC_BIND_MW: u32 = 5;
/// `IBV_WC_LOCAL_INV`.
pub const IBV_WC_LOCAL_INV: u32 = 6;

/// `enum ibv_send_flags`: `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

/// `enum ibv_port_state`: `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `enum ibv_gid_type` (of `ibv_gid_entry`): `IBV_GID_TYPE_IB`.
pub const IBV_GID_TYPE_IB: u32 = 0;
/// `IBV_GID_TYPE_ROCE_V1`.
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
/// `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
