//! Configuration of the verbs fabric: every limit and tuning knob, with defaults that work.

use std::net::SocketAddr;
use std::time::Duration;

use skyriver_core::wire;

use super::errors::ConfigError;
use crate::verbs::ConnectionConfig;

/// Configuration of a [`VerbsFabric`](super::VerbsFabric). [`VerbsFabricConfig::new`] gives working defaults.
#[derive(Clone, Debug)]
pub struct VerbsFabricConfig {
    /// RDMA device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Port of the device, from 1.
    pub port: u8,
    /// GID index; `None` picks the port's RoCE v2 GID (Ethernet) or GID 0 (InfiniBand).
    pub gid_index: Option<u32>,
    /// Where to listen for control connections (port 0: any free port).
    pub listen: SocketAddr,
    /// Queue pairs per peer (agreed: minimum of both sides).
    pub lanes: usize,
    /// Largest memory region of an arena registration (further capped by the device).
    pub max_mr_bytes: u64,
    /// Size of one receive slot, header included. Every node of a cluster must use the same
    /// value, and give it to its core as `NodeConfig::receive_slot_bytes`; peers with another
    /// value are refused at handshake. At most `wire::MAX_MESSAGE_BYTES`.
    pub recv_slot_bytes: u32,
    /// Receive slots per connection, in its shared receive queue (every lane draws from it).
    pub recv_slots: u32,
    /// Send slots per lane (SENDs in flight per lane).
    pub send_slots: u32,
    /// Send queue depth per lane (SENDs plus READs in flight).
    pub send_queue_depth: u32,
    /// Outstanding READs per QP wanted.
    pub max_rd_atomic: u32,
    /// Largest SEND posted inline.
    pub max_inline_bytes: u32,
    /// Largest path MTU wanted, in bytes.
    pub mtu_bytes: u32,
    /// Largest single READ work request; a READ of a longer region is sliced.
    pub max_read_bytes: u64,
    /// Most READ work requests in one posted list (one signaled completion per list).
    pub max_reads_per_list: u32,
    /// Most SENDs waiting for send-queue room per peer; beyond it the peer is dropped (it stopped
    /// taking messages).
    pub max_queued_sends: usize,
    /// Most bytes of SENDs waiting for send-queue room per peer (one message always fits);
    /// beyond it the peer is dropped, as for `max_queued_sends`.
    pub max_queued_send_bytes: usize,
    /// Most READ lists waiting for send-queue room per peer; beyond it new READs fail.
    pub max_queued_read_lists: usize,
    /// Deadline of a whole connection handshake (TCP connect, hello, QPs, probe).
    pub handshake_timeout: Duration,
    /// Measure path costs at connect time (else use the device kind's defaults).
    pub probe: bool,
    /// Time the READ bandwidth probe may take once it has one sample.
    pub probe_budget: Duration,
    /// Bytes of the probe buffer each side registers (and the peer READs).
    pub probe_bytes: u64,
    /// How long the poller keeps polling without pause after its last completion (the
    /// latency of a reply that comes back this soon is a poll, not a wake-up).
    pub busy_poll: Duration,
    /// After this long without work the poller sleeps on completion events (no CPU while idle);
    /// until then it takes short sleeps, so a busy connection's next reply costs a poll, not an
    /// event wake-up.
    pub event_sleep_after: Duration,
    /// Longest sleep of the idle poller between CQ polls while recently busy, or always when the
    /// device has no completion channel.
    pub idle_poll_max: Duration,
    /// How often the poller checks each connection's TCP stream for EOF.
    pub liveness_interval: Duration,
    /// TCP keepalive idle time of control streams: a peer whose machine died without closing
    /// them is noticed after about this plus three 1-second probes, even with no traffic.
    pub control_keepalive: Duration,
    /// Most handshakes of accepted connections running at once; more are closed at once.
    pub max_pending_accepts: usize,
    /// Scope each lease's READ access with memory windows (one per lane, bound to the object's
    /// bytes, invalidated when the lease ends) and register the arenas without remote access
    /// of their own. Where the device has no memory windows the fabric says so at start and
    /// peers READ through the arenas' registrations instead. Nodes with and without windows
    /// work together: the holder's grant says which keys to READ with.
    pub memory_windows: bool,
    /// Most memory windows bound at once (leases × lanes); a grant beyond it is refused.
    pub max_memory_windows: usize,
}

impl VerbsFabricConfig {
    /// Defaults for `device` (port 1, default GID), listening on `listen`.
    pub fn new(device: &str, listen: SocketAddr) -> Self {
        VerbsFabricConfig {
            device: device.to_string(),
            port: 1,
            gid_index: None,
            listen,
            lanes: 2,
            max_mr_bytes: u64::MAX,
            recv_slot_bytes: 64 * 1024,
            recv_slots: 64,
            send_slots: 64,
            send_queue_depth: 512,
            max_rd_atomic: 16,
            max_inline_bytes: 128,
            mtu_bytes: 4096,
            max_read_bytes: 1 << 20,
            max_reads_per_list: 64,
            max_queued_sends: 16 * 1024,
            max_queued_send_bytes: 64 << 20,
            max_queued_read_lists: 16 * 1024,
            handshake_timeout: Duration::from_secs(10),
            probe: true,
            probe_budget: Duration::from_millis(5),
            probe_bytes: 256 * 1024,
            busy_poll: Duration::from_micros(20),
            event_sleep_after: Duration::from_millis(20),
            idle_poll_max: Duration::from_micros(200),
            liveness_interval: Duration::from_millis(5),
            control_keepalive: Duration::from_secs(2),
            max_pending_accepts: 64,
            memory_windows: true,
            max_memory_windows: 4096,
        }
    }

    pub(super) fn connection_config(&self) -> ConnectionConfig {
        ConnectionConfig {
            lanes: self.lanes,
            recv_slot_bytes: self.recv_slot_bytes,
            recv_slots: self.recv_slots,
            send_slots: self.send_slots,
            send_queue_depth: self.send_queue_depth,
            max_rd_atomic: self.max_rd_atomic,
            max_inline_bytes: self.max_inline_bytes,
            mtu_bytes: self.mtu_bytes,
            handshake_timeout: self.handshake_timeout,
            ..ConnectionConfig::default()
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let min = wire::HEADER_BYTES + wire::EAGER_FIXED_BYTES + 1;
        if self.recv_slot_bytes as usize > wire::MAX_MESSAGE_BYTES
            || (self.recv_slot_bytes as usize) < min
        {
            return Err(ConfigError::RecvSlotBytes {
                value: self.recv_slot_bytes,
                min,
                max: wire::MAX_MESSAGE_BYTES,
            });
        }
        if self.max_read_bytes == 0 || self.max_reads_per_list == 0 {
            return Err(ConfigError::ZeroReadLimit);
        }
        if self.max_reads_per_list > self.send_queue_depth {
            return Err(ConfigError::ReadsPerList {
                per_list: self.max_reads_per_list,
                depth: self.send_queue_depth,
            });
        }
        if self.probe_bytes == 0 || self.probe_bytes > 64 << 20 {
            return Err(ConfigError::ProbeBytes(self.probe_bytes));
        }
        Ok(())
    }
}
