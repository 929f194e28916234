//! Work requests in and work completions out: READ requests, completion statuses, receive
//! slots.

/// One RDMA READ: `len` bytes from the peer's `remote_addr` (under `rkey`) into the local
/// `local_addr` (under `lkey`). Both ranges must lie inside one memory region each; see
/// [`plan_reads`](crate::verbs::plan_reads).
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
    /// A memory window bind this side posted.
    BindWindow,
    /// A memory window invalidation this side posted.
    InvalidateWindow,
}

/// A receive slot holding an arrived message until it is released
/// ([`release_recv`](super::VerbsConnection::release_recv)) or lent out
/// ([`take_recv`](super::VerbsConnection::take_recv)).
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
