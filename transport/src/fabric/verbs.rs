//! The verbs fabric: [`Fabric`] over RDMA RC queue pairs (InfiniBand, RoCE, SoftRoCE), built on
//! the [`crate::verbs`] layer.
//!
//! **Shape.** [`VerbsFabric::start`] opens the device, registers every arena once (split into
//! several memory regions when larger than the device or `max_mr_bytes` allows), binds a TCP
//! listener for control connections and starts two threads: an acceptor and one completion
//! poller for all connections. Each connection handshake (outgoing or accepted) runs in a short
//! thread of its own, bounded by `handshake_timeout`:
//! 1. an authenticated hello on the TCP stream ([`hello`]): node id and cluster token, the
//!    receive slot size (must be equal on both sides: the core sizes eager chunks by it), and the
//!    chunk table of every arena registration; a wrong token is refused on both sides;
//! 2. the QP handshake of [`VerbsConnection`] on the same stream (lanes, MTU, READ depth, slots);
//! 3. a cost probe ([`probe`]): SEND ping-pongs and READs, a few ms on real hardware;
//! 4. [`FabricEvent::PeerConnected`]; the TCP stream stays open as the liveness channel (its
//!    EOF or error tears the connection down at once, so a dropped peer never waits out RC
//!    retry timeouts).
//!
//! **Split registrations and rkeys.** The core names a peer's arena by one [`ArenaKey`]
//! (`base_addr` + the rkey of the registration's first region) and computes
//! `RemoteRegion{addr, len, rkey}` itself. The requester's fabric holds each peer's chunk table
//! (from the hello) and, on [`Fabric::post_read`], checks that the region lies inside one of the
//! peer's arenas and carries that arena's key, then plans work requests with
//! [`plan_reads`], which cuts at every region boundary of either side and picks each piece's own
//! rkey. So READs may cross split boundaries and the core never learns about splits. A region
//! outside the peer's arenas, or with a stale rkey, fails with [`ReadError::RemoteAccess`]
//! before anything is posted (a NIC-level remote access error would break the whole QP).
//!
//! **Expose / unexpose.** One registration per arena means the NIC can serve any byte of a
//! registered arena to a connected peer. The fabric keeps a table of exposed regions (counted,
//! so two transfers of one object nest) for logs and checks, but cannot revoke access at the NIC:
//! that would need a memory region or a type-2 memory window per exposed object, i.e. control
//! verbs (`ibv_reg_mr` / `ibv_bind_mw`, tens of µs, and rxe's MW support is young) on the data
//! path of every rendezvous. Protection therefore rests on: only peers holding the cluster token
//! get a QP; READs are confined to registered arenas (rkey + chunk table check); and the core only
//! hands out regions of objects it pinned. See [`VerbsFabric::exposed_regions`].
//!
//! **Threads.** Callers and the poller share, per connection, one `Mutex<ConnState>` (the
//! [`VerbsConnection`], the outstanding READs and the queues of posts waiting for send-queue
//! room), and one `Mutex` over the peer table. Lock order: a connection's state, then the table;
//! never the reverse. No custom synchronisation (so nothing to model-check beyond the standard
//! library, plus one flag for the idle hand-off in [`idle`]): the poller keeps polling for
//! `busy_poll` after its last completion, then takes short sleeps (10 µs up to `idle_poll_max`,
//! cut short by posts) for `event_sleep_after`, then arms every connection's CQ, looks once
//! more, and sleeps on the device's completion channel, the control streams and an eventfd that posts
//! write to ([`idle`]), so an idle daemon costs no CPU and a busy one polls in batches. Where the
//! device gives no completion channel it backs off to short sleeps (`idle_poll_max`) instead.
//!
//! **Ordering guarantees** (see [`crate::fabric`]): every SEND goes on lane 0, in call order
//! (queued behind earlier ones when the send queue is full); `PeerConnected` is emitted under the
//! table lock before the connection becomes visible to the poller, so no `Message` precedes it;
//! a torn-down connection first destroys its QPs (no DMA after this), then completes every
//! outstanding READ with [`ReadError::ConnectionLost`] and emits `PeerLost`, all under the table
//! lock, so a reconnection's `PeerConnected` cannot overtake it.

mod hello;
mod idle;
mod peer;
mod probe;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use skyriver_core::node::{ArenaKey, PathCosts, PeerParams, ReadError, ReadOpId};
use skyriver_core::wire::{self, EagerHeader};
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion};
use tokio::sync::mpsc::UnboundedSender;

use super::{Arenas, Fabric, FabricError, FabricEvent, FabricIdentity};
use crate::arena::SharedArena;
use crate::verbs::{
    plan_reads, ConnectionConfig, MrChunk, NegotiatedParams, Registration, VerbsConnection,
    VerbsDevice,
};
use hello::{Control, ControlError, CostsFrame, Hello, Reply, Verdict, WireArena, WireChunk};
use idle::IdleWait;
use peer::{ConnState, PeerConn, RemoteTable};

/// Configuration of a [`VerbsFabric`]. [`VerbsFabricConfig::new`] gives working defaults.
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
        }
    }

    fn connection_config(&self) -> ConnectionConfig {
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

    fn validate(&self) -> Result<(), String> {
        if self.recv_slot_bytes as usize > wire::MAX_MESSAGE_BYTES
            || (self.recv_slot_bytes as usize) < wire::HEADER_BYTES + wire::EAGER_FIXED_BYTES + 1
        {
            return Err(format!(
                "recv_slot_bytes {} not in {}..={}",
                self.recv_slot_bytes,
                wire::HEADER_BYTES + wire::EAGER_FIXED_BYTES + 1,
                wire::MAX_MESSAGE_BYTES
            ));
        }
        if self.max_read_bytes == 0 || self.max_reads_per_list == 0 {
            return Err("max_read_bytes and max_reads_per_list must be positive".into());
        }
        if self.max_reads_per_list > self.send_queue_depth {
            return Err(format!(
                "max_reads_per_list {} exceeds send_queue_depth {}",
                self.max_reads_per_list, self.send_queue_depth
            ));
        }
        if self.probe_bytes == 0 || self.probe_bytes > 64 << 20 {
            return Err("probe_bytes must be in 1..=64 MiB".into());
        }
        Ok(())
    }
}

/// One registered local arena. Field order is drop order: the registration goes before the
/// mapping it covers.
struct LocalArena {
    reg: Registration,
    arena: Arc<SharedArena>,
}

/// The probe buffer: registered scratch memory peers READ and this side READs into.
struct ProbeBuffer {
    reg: Registration,
    _mem: MmapMut,
}

/// A peer in the table: a handshake in progress or a live connection.
enum Slot {
    Connecting {
        attempt: u64,
        /// This side opened it.
        outgoing: bool,
        /// The driver asked for this peer ([`Fabric::connect`]) and waits for an event.
        driver_waits: bool,
    },
    Up(Arc<PeerConn>),
}

#[derive(Default)]
struct Table {
    peers: BTreeMap<NodeId, Slot>,
    next_attempt: u64,
}

/// Exposed regions, counted (nested exposures of one region are allowed).
#[derive(Default)]
struct Exposures {
    regions: BTreeMap<LocalRegion, u32>,
}

impl Exposures {
    fn expose(&mut self, region: LocalRegion) {
        *self.regions.entry(region).or_insert(0) += 1;
    }

    /// False when `region` was not exposed.
    fn unexpose(&mut self, region: LocalRegion) -> bool {
        match self.regions.get_mut(&region) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.regions.remove(&region);
                true
            }
            None => false,
        }
    }
}

/// Everything the fabric's threads share. Field order is drop order: connections (in the
/// table) go before the registrations, which go before the device.
struct Shared {
    table: Mutex<Table>,
    exposures: Mutex<Exposures>,
    events: UnboundedSender<FabricEvent>,
    identity: FabricIdentity,
    config: VerbsFabricConfig,
    listen_addr: SocketAddr,
    arenas: BTreeMap<ArenaId, LocalArena>,
    probe: ProbeBuffer,
    device: VerbsDevice,
    copy_bytes_per_sec: f64,
    shutdown: AtomicBool,
    accepts_in_flight: AtomicUsize,
    poller: OnceLock<Thread>,
    /// How the idle poller sleeps: `None` when the device gave no completion channel (then it
    /// backs off to short sleeps).
    idle: Option<IdleWait>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a bug already reported by that panic; the
    // data stays consistent enough to tear connections down.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn emit(&self, event: FabricEvent) {
        // The driver may be gone (shutting down); nothing to do then.
        let _ = self.events.send(event);
    }

    fn wake_poller(&self) {
        if let Some(idle) = &self.idle {
            idle.wake();
        }
        if let Some(t) = self.poller.get() {
            t.unpark();
        }
    }

    fn connection_config(&self) -> ConnectionConfig {
        ConnectionConfig {
            completion_channel: self.idle.as_ref().map(|w| w.channel().clone()),
            ..self.config.connection_config()
        }
    }

    fn peer_conn(&self, peer: NodeId) -> Option<Arc<PeerConn>> {
        match lock(&self.table).peers.get(&peer) {
            Some(Slot::Up(c)) => Some(c.clone()),
            _ => None,
        }
    }

    /// Ends a handshake attempt that failed: if the attempt still owns the peer's slot, frees it
    /// and, when the driver asked for this peer, reports `PeerLost`. (A failed handshake the
    /// peer opened is only logged: the driver never heard of it.)
    fn attempt_failed(&self, peer: NodeId, attempt: u64, reason: String) {
        let mut t = lock(&self.table);
        if let Some(&Slot::Connecting {
            attempt: a,
            driver_waits,
            ..
        }) = t.peers.get(&peer)
        {
            if a == attempt {
                t.peers.remove(&peer);
                tracing::warn!(%peer, %reason, "verbs fabric: connection failed");
                if driver_waits {
                    self.emit(FabricEvent::PeerLost { peer, reason });
                }
                return;
            }
        }
        tracing::debug!(%peer, %reason, "verbs fabric: superseded connection attempt ended");
    }

    /// The peer answered an outgoing attempt with [`Reply::Yield`]: its own connection to this
    /// node wins. Wait (until `deadline`) for that connection to take the slot over; the
    /// attempt then ends quietly. If it never comes, the attempt fails.
    fn yield_to_peer(
        &self,
        peer: NodeId,
        attempt: u64,
        deadline: Instant,
        reason: String,
    ) -> Result<(), String> {
        loop {
            let ours = matches!(
                lock(&self.table).peers.get(&peer),
                Some(Slot::Connecting { attempt: a, .. }) if *a == attempt
            );
            if !ours {
                tracing::debug!(%peer, %reason, "verbs fabric: yielded to the peer's connection");
                return Ok(());
            }
            if Instant::now() >= deadline || self.shutdown.load(Ordering::Acquire) {
                return Err(format!(
                    "{reason}, but {peer}'s connection did not arrive in time"
                ));
            }
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// The path costs both ends of a connection use: the connector's measurements (or, field by
    /// field, the defaults of the connector's device kind) and the lower copy bandwidth.
    fn path_costs(&self, frame: &CostsFrame, theirs: &Hello, connector_device: &str) -> PathCosts {
        let peer_copy = theirs.copy_bytes_per_sec;
        let copy = if peer_copy.is_finite() && peer_copy > 0.0 {
            self.copy_bytes_per_sec.min(peer_copy)
        } else {
            self.copy_bytes_per_sec
        };
        probe::costs_from(frame, copy, probe::default_costs(connector_device, copy))
    }

    fn local_arena(&self, region: &LocalRegion) -> Option<&LocalArena> {
        let a = self.arenas.get(&region.arena)?;
        let end = region.offset.checked_add(region.len)?;
        (end <= a.arena.size_bytes()).then_some(a)
    }

    fn my_hello(&self, probe_pings: u32) -> Hello {
        let chunk = self.probe.reg.chunks()[0];
        Hello {
            node: self.identity.node.0,
            token: self.identity.cluster_token.clone(),
            device: self.device.name().to_string(),
            recv_slot_bytes: self.config.recv_slot_bytes,
            copy_bytes_per_sec: self.copy_bytes_per_sec,
            probe_pings,
            probe_region: WireChunk {
                addr: chunk.addr,
                len: chunk.len,
                rkey: chunk.rkey,
            },
            arenas: self
                .arenas
                .iter()
                .map(|(id, a)| WireArena {
                    arena: id.0,
                    chunks: a
                        .reg
                        .remote_chunks()
                        .iter()
                        .map(|c| WireChunk {
                            addr: c.addr,
                            len: c.len,
                            rkey: c.rkey,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Checks a peer's hello; `expected` is the node an outgoing connection meant to reach.
    fn check_hello(&self, h: &Hello, expected: Option<NodeId>) -> Result<(), String> {
        if !crate::token::tokens_match(&h.token, &self.identity.cluster_token) {
            return Err(format!(
                "node-{} presented a wrong cluster token; refused",
                h.node
            ));
        }
        h.validate()?;
        if h.node == self.identity.node.0 {
            return Err(format!("peer claims this node's own id node-{}", h.node));
        }
        if let Some(p) = expected {
            if p.0 != h.node {
                return Err(format!(
                    "expected {p} at this address, found node-{}",
                    h.node
                ));
            }
        }
        if h.recv_slot_bytes != self.config.recv_slot_bytes {
            return Err(format!(
                "receive slot size mismatch: node-{} uses {} bytes, {} uses {} (configure every \
                 node alike)",
                h.node, h.recv_slot_bytes, self.identity.node, self.config.recv_slot_bytes
            ));
        }
        Ok(())
    }
}

/// RDMA verbs [`Fabric`]; see the module documentation.
pub struct VerbsFabric {
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for VerbsFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsFabric")
            .field("device", &self.shared.device)
            .field("listen", &self.shared.listen_addr)
            .finish_non_exhaustive()
    }
}

impl VerbsFabric {
    /// Opens the device, registers `arenas`, listens on `config.listen` and starts the fabric's
    /// threads. Fails with [`FabricError::Setup`] (saying why, e.g. that RDMA verbs are not
    /// available on this machine) without starting anything.
    pub fn start(
        config: VerbsFabricConfig,
        identity: FabricIdentity,
        arenas: Arenas,
        events: UnboundedSender<FabricEvent>,
    ) -> Result<VerbsFabric, FabricError> {
        let device_name = config.device.clone();
        let setup = |what: &str, e: &dyn std::fmt::Display| {
            FabricError::Setup(format!("verbs fabric ({device_name}): {what}: {e}"))
        };
        config.validate().map_err(|e| setup("bad config", &e))?;
        let device = VerbsDevice::open(&config.device, config.port, config.gid_index)
            .map_err(|e| setup("opening the RDMA device", &render(&e)))?;
        let mut local = BTreeMap::new();
        for (id, arena) in arenas {
            // SAFETY: the arena's mapping lives as long as the Arc kept next to the
            // registration in `LocalArena`, whose field order drops the registration first; the
            // store treats arena memory as shared with concurrent writers (other processes map
            // it too), which covers the device writing READ destinations into it.
            let reg = unsafe {
                device.register(
                    arena.base_addr() as *mut u8,
                    arena.size_bytes() as usize,
                    config.max_mr_bytes,
                )
            }
            .map_err(|e| setup(&format!("registering {id}"), &e))?;
            local.insert(id, LocalArena { reg, arena });
        }
        let probe_len = config.probe_bytes as usize;
        let mut probe_mem = MmapMut::map_anon(probe_len).map_err(|e| setup("probe buffer", &e))?;
        // SAFETY: the map is owned by `ProbeBuffer` next to the registration, which is dropped
        // first (field order); its bytes are scratch that only the device writes and reads.
        let probe_reg = unsafe { device.register(probe_mem.as_mut_ptr(), probe_len, u64::MAX) }
            .map_err(|e| setup("registering the probe buffer", &e))?;
        let idle = match device.completion_channel().and_then(|channel| {
            IdleWait::new(channel).map_err(|e| crate::verbs::DeviceError::CompletionChannel {
                name: config.device.clone(),
                source: e,
            })
        }) {
            Ok(idle) => Some(idle),
            Err(e) => {
                tracing::warn!(
                    "verbs fabric: no completion channel ({}); the idle poller will wake every {:?}",
                    render(&e),
                    config.idle_poll_max
                );
                None
            }
        };
        let listener = TcpListener::bind(config.listen)
            .map_err(|e| setup(&format!("binding {}", config.listen), &e))?;
        let listen_addr = listener
            .local_addr()
            .map_err(|e| setup("listener address", &e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| setup("listener", &e))?;

        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            exposures: Mutex::new(Exposures::default()),
            events,
            identity,
            listen_addr,
            arenas: local,
            probe: ProbeBuffer {
                reg: probe_reg,
                _mem: probe_mem,
            },
            device,
            copy_bytes_per_sec: probe::measure_copy_bandwidth(),
            shutdown: AtomicBool::new(false),
            accepts_in_flight: AtomicUsize::new(0),
            poller: OnceLock::new(),
            idle,
            config,
        });
        let s = shared.clone();
        let poller = thread::Builder::new()
            .name("verbs-poller".into())
            .spawn(move || poll_loop(&s))
            .map_err(|e| setup("starting the poller thread", &e))?;
        let _ = shared.poller.set(poller.thread().clone());
        let s = shared.clone();
        let acceptor = match thread::Builder::new()
            .name("verbs-accept".into())
            .spawn(move || accept_loop(&s, listener))
        {
            Ok(t) => t,
            Err(e) => {
                shared.shutdown.store(true, Ordering::Release);
                shared.wake_poller();
                let _ = poller.join();
                return Err(setup("starting the acceptor thread", &e));
            }
        };
        let regions: Vec<String> = shared
            .arenas
            .iter()
            .map(|(id, a)| format!("{id}: {} B in {} MR(s)", a.reg.len(), a.reg.chunks().len()))
            .collect();
        tracing::info!(
            device = shared.device.name(),
            gid = %shared.device.gid(),
            listen = %listen_addr,
            arenas = ?regions,
            recv_slot_bytes = shared.config.recv_slot_bytes,
            "verbs fabric started"
        );
        Ok(VerbsFabric {
            shared,
            poller: Some(poller),
            acceptor: Some(acceptor),
        })
    }

    /// The receive slot size every message must fit (header included); give it to the core as
    /// `NodeConfig::receive_slot_bytes`.
    pub fn receive_slot_bytes(&self) -> u32 {
        self.shared.config.recv_slot_bytes
    }

    /// The device in use.
    pub fn device(&self) -> &VerbsDevice {
        &self.shared.device
    }

    /// The memory regions registered for each arena (more than one when split).
    pub fn registrations(&self) -> BTreeMap<ArenaId, Vec<MrChunk>> {
        self.shared
            .arenas
            .iter()
            .map(|(id, a)| (*id, a.reg.chunks().to_vec()))
            .collect()
    }

    /// The regions currently exposed, with how many times each is. Informational: see the
    /// module documentation for what exposure does and does not enforce.
    pub fn exposed_regions(&self) -> Vec<(LocalRegion, u32)> {
        lock(&self.shared.exposures)
            .regions
            .iter()
            .map(|(r, n)| (*r, *n))
            .collect()
    }
}

impl Drop for VerbsFabric {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake_poller();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        if let Some(t) = self.poller.take() {
            let _ = t.join();
        }
        // Tear down every connection: QPs destroyed, READs completed, peers see EOF at once.
        let conns: Vec<Arc<PeerConn>> = lock(&self.shared.table)
            .peers
            .values()
            .filter_map(|s| match s {
                Slot::Up(c) => Some(c.clone()),
                Slot::Connecting { .. } => None,
            })
            .collect();
        for c in conns {
            let mut st = lock(&c.state);
            c.teardown(&mut st, &self.shared, "the local fabric shut down".into());
        }
    }
}

impl Fabric for VerbsFabric {
    fn name(&self) -> &'static str {
        "verbs"
    }

    fn listen_addr(&self) -> SocketAddr {
        self.shared.listen_addr
    }

    fn region_keys(&self) -> BTreeMap<ArenaId, ArenaKey> {
        self.shared
            .arenas
            .iter()
            .map(|(id, a)| {
                let first = a.reg.chunks()[0];
                (
                    *id,
                    ArenaKey {
                        base_addr: first.addr,
                        rkey: first.rkey,
                    },
                )
            })
            .collect()
    }

    fn connect(&self, peer: NodeId, addr: SocketAddr) {
        let s = &self.shared;
        if peer == s.identity.node {
            s.emit(FabricEvent::PeerLost {
                peer,
                reason: "refusing to connect to this node itself".into(),
            });
            return;
        }
        let attempt = {
            let mut t = lock(&s.table);
            match t.peers.get_mut(&peer) {
                Some(Slot::Connecting { driver_waits, .. }) => {
                    // A handshake the peer opened is in progress: report its outcome.
                    *driver_waits = true;
                    return;
                }
                Some(Slot::Up(_)) => return,
                None => {}
            }
            t.next_attempt += 1;
            let attempt = t.next_attempt;
            t.peers.insert(
                peer,
                Slot::Connecting {
                    attempt,
                    outgoing: true,
                    driver_waits: true,
                },
            );
            attempt
        };
        let shared = s.clone();
        let spawned = thread::Builder::new()
            .name(format!("verbs-connect-{peer}"))
            .spawn(move || {
                if let Err(reason) = connect_to(&shared, peer, addr, attempt) {
                    shared.attempt_failed(peer, attempt, reason);
                }
            });
        if let Err(e) = spawned {
            s.attempt_failed(
                peer,
                attempt,
                format!("cannot start a handshake thread: {e}"),
            );
        }
    }

    fn is_connected_or_connecting(&self, peer: NodeId) -> bool {
        lock(&self.shared.table).peers.contains_key(&peer)
    }

    fn send(&self, peer: NodeId, bytes: Vec<u8>) -> Result<(), FabricError> {
        let s = &self.shared;
        let limit = s.config.recv_slot_bytes as usize;
        if bytes.len() > limit {
            return Err(FabricError::MessageTooLarge {
                len: bytes.len(),
                limit,
            });
        }
        if bytes.is_empty() {
            return Err(FabricError::Setup("cannot send an empty message".into()));
        }
        let conn = s.peer_conn(peer).ok_or(FabricError::NotConnected(peer))?;
        let mut st = lock(&conn.state);
        let r = conn.send(&mut st, s, bytes);
        drop(st);
        s.wake_poller();
        r
    }

    fn send_eager(
        &self,
        peer: NodeId,
        header: &EagerHeader,
        source: LocalRegion,
    ) -> Result<(), FabricError> {
        let s = &self.shared;
        let limit = s.config.recv_slot_bytes as usize;
        let len =
            ((wire::HEADER_BYTES + wire::EAGER_FIXED_BYTES) as u64).saturating_add(source.len);
        if len > limit as u64 {
            return Err(FabricError::MessageTooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                limit,
            });
        }
        let arena = s
            .local_arena(&source)
            .ok_or(FabricError::BadRegion(source))?;
        let conn = s.peer_conn(peer).ok_or(FabricError::NotConnected(peer))?;
        // The core guarantees the bytes stay unchanged until its next input, not until the SEND
        // completes; so they are copied now (into a send slot or inline), not referenced.
        let payload = arena
            .arena
            .bytes(source.offset, source.len)
            .map_err(|_| FabricError::BadRegion(source))?;
        let mut bytes = Vec::with_capacity(len as usize);
        wire::encode_eager(header, payload, &mut bytes);
        let mut st = lock(&conn.state);
        let r = conn.send(&mut st, s, bytes);
        drop(st);
        s.wake_poller();
        r
    }

    fn post_read(
        &self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
    ) {
        let s = &self.shared;
        let fail = |e: ReadError| {
            tracing::debug!(%peer, %op, %local, %remote, error = %e, "verbs fabric: READ refused");
            s.emit(FabricEvent::ReadCompleted { op, result: Err(e) });
        };
        let Some(arena) = s.local_arena(&local) else {
            return fail(ReadError::QueuePair(format!(
                "local region {local} is outside this node's registered arenas"
            )));
        };
        if local.len != remote.len || local.len == 0 {
            return fail(ReadError::QueuePair(format!(
                "READ of {} bytes into a {}-byte region",
                remote.len, local.len
            )));
        }
        let Some(conn) = s.peer_conn(peer) else {
            return fail(ReadError::ConnectionLost);
        };
        if usize::from(lane) >= conn.lanes {
            return fail(ReadError::QueuePair(format!(
                "lane {lane} does not exist ({} lanes to {peer})",
                conn.lanes
            )));
        }
        let remote_chunks = match conn.remote.resolve(&remote) {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!(%peer, %remote, %why, "verbs fabric: READ of memory the peer did not register");
                return fail(ReadError::RemoteAccess);
            }
        };
        let local_addr = arena.reg.addr() + local.offset;
        let mut st = lock(&conn.state);
        let first_wr = st.next_wr_id;
        let reqs = match plan_reads(
            arena.reg.chunks(),
            local_addr,
            remote_chunks,
            remote.addr,
            remote.len,
            s.config.max_read_bytes,
            first_wr,
        ) {
            Ok(r) => r,
            Err(e) => {
                drop(st);
                return fail(ReadError::QueuePair(format!("planning the READ: {e}")));
            }
        };
        conn.post_read(&mut st, s, op, usize::from(lane), reqs);
        drop(st);
        s.wake_poller();
    }

    fn expose(&self, region: LocalRegion) {
        if self.shared.local_arena(&region).is_none() {
            tracing::warn!(%region, "verbs fabric: exposing a region outside the registered arenas");
        }
        lock(&self.shared.exposures).expose(region);
    }

    fn unexpose(&self, region: LocalRegion) {
        if !lock(&self.shared.exposures).unexpose(region) {
            tracing::warn!(%region, "verbs fabric: unexposing a region that is not exposed");
        }
    }
}

// ---- connection set-up ----------------------------------------------------------------------

/// What a finished handshake hands to [`install`].
struct Established {
    conn: VerbsConnection,
    control: TcpStream,
    peer_hello: Hello,
    costs: PathCosts,
    cost_note: String,
    backlog: Vec<crate::verbs::Completion>,
}

/// Control streams: no Nagle delay (small handshake frames), and keepalive probes so a silent
/// peer is noticed on an idle connection. Best effort: failures only weaken detection.
fn tune_control(stream: &TcpStream, cfg: &VerbsFabricConfig) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(cfg.control_keepalive)
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// An error with its chain of sources, for logs and `PeerLost` reasons.
fn render(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    s
}

fn control_err(stage: &str) -> impl Fn(ControlError) -> String + '_ {
    move |e| format!("{stage}: {}", render(&e))
}

/// The outgoing side of a handshake. Errors are the reason for `PeerLost`.
fn connect_to(s: &Shared, peer: NodeId, addr: SocketAddr, attempt: u64) -> Result<(), String> {
    let cfg = &s.config;
    let deadline = Instant::now() + cfg.handshake_timeout;
    let mut stream = TcpStream::connect_timeout(&addr, cfg.handshake_timeout)
        .map_err(|e| format!("TCP connect to {addr}: {e}"))?;
    tune_control(&stream, &s.config);
    let pings = if cfg.probe { probe::PINGS } else { 0 };
    let mut ctl = Control::new(&mut stream, cfg.handshake_timeout).map_err(control_err("hello"))?;
    ctl.write_preamble().map_err(control_err("hello"))?;
    ctl.write_frame(&s.my_hello(pings))
        .map_err(control_err("hello"))?;
    let theirs = match ctl.read_frame::<Reply>().map_err(control_err("hello"))? {
        Reply::Accept(h) => h,
        Reply::Refuse(reason) => return Err(format!("refused by {peer} at {addr}: {reason}")),
        Reply::Yield(reason) => return s.yield_to_peer(peer, attempt, deadline, reason),
    };
    if let Err(reason) = s.check_hello(&theirs, Some(peer)) {
        let _ = ctl.write_frame(&Verdict::Refuse(reason.clone()));
        tracing::warn!(%peer, %addr, %reason, "verbs fabric: refusing the peer");
        return Err(reason);
    }
    let remote = RemoteTable::from_hello(&theirs.arenas)?;
    ctl.write_frame(&Verdict::Accept)
        .map_err(control_err("hello"))?;
    drop(ctl);

    let mut conn = VerbsConnection::connect(&s.device, &mut stream, &s.connection_config())
        .map_err(|e| format!("QP handshake with {peer}: {}", render(&e)))?;
    let frame = if cfg.probe {
        let left = deadline.saturating_duration_since(Instant::now());
        match probe::measure(
            &mut conn,
            s.probe.reg.chunks()[0],
            theirs.probe_region,
            cfg.probe_budget,
            left,
        ) {
            Ok(m) => m.frame,
            Err(e) => return Err(format!("measuring the path to {peer}: {e}")),
        }
    } else {
        CostsFrame {
            measured: false,
            round_trip_ns: 0.0,
            message_overhead_ns: 0.0,
            wire_bytes_per_sec: 0.0,
            read_setup_ns: 0.0,
            note: "probe disabled".into(),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let mut ctl = Control::new(&mut stream, left.max(Duration::from_millis(1)))
        .map_err(control_err("sending costs"))?;
    ctl.write_frame(&frame)
        .map_err(control_err("sending costs"))?;
    drop(ctl);
    let costs = s.path_costs(&frame, &theirs, s.device.name());
    install(
        s,
        peer,
        attempt,
        Established {
            conn,
            control: stream,
            peer_hello: theirs,
            costs,
            cost_note: frame.note,
            backlog: Vec::new(),
        },
        remote,
    );
    Ok(())
}

fn accept_loop(s: &Arc<Shared>, listener: TcpListener) {
    while !s.shutdown.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                let _ = stream.set_nonblocking(false);
                if s.accepts_in_flight.load(Ordering::Acquire) >= s.config.max_pending_accepts {
                    tracing::warn!(%from, "verbs fabric: too many handshakes in progress; closing");
                    continue;
                }
                s.accepts_in_flight.fetch_add(1, Ordering::AcqRel);
                let shared = s.clone();
                let spawned =
                    thread::Builder::new()
                        .name("verbs-accepted".into())
                        .spawn(move || {
                            accept_from(&shared, stream, from);
                            shared.accepts_in_flight.fetch_sub(1, Ordering::AcqRel);
                        });
                if let Err(e) = spawned {
                    s.accepts_in_flight.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(%from, error = %e, "verbs fabric: cannot start a handshake thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                tracing::warn!(error = %e, "verbs fabric: accept failed");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The accepting side of a handshake.
fn accept_from(s: &Arc<Shared>, mut stream: TcpStream, from: SocketAddr) {
    let cfg = &s.config;
    let deadline = Instant::now() + cfg.handshake_timeout;
    tune_control(&stream, &s.config);
    let mut ctl = match Control::new(&mut stream, cfg.handshake_timeout) {
        Ok(ctl) => ctl,
        Err(e) => {
            tracing::warn!(%from, error = %e, "verbs fabric: control stream unusable; closing");
            return;
        }
    };
    let theirs = match ctl.read_preamble().and_then(|()| ctl.read_frame::<Hello>()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(%from, error = %e, "verbs fabric: bad handshake; closing");
            return;
        }
    };
    let peer = NodeId(theirs.node);
    if let Err(reason) = s.check_hello(&theirs, None) {
        // Unauthenticated: no event (the claimed node id is unverified; a PeerLost for it would
        // let anyone without the token disturb a real peer's connection).
        tracing::warn!(%from, claimed = %peer, %reason, "verbs fabric: refusing a connection");
        let _ = ctl.write_frame(&Reply::Refuse(reason));
        return;
    }
    let remote = match RemoteTable::from_hello(&theirs.arenas) {
        Ok(r) => r,
        Err(reason) => {
            tracing::warn!(%from, %peer, %reason, "verbs fabric: refusing a connection");
            let _ = ctl.write_frame(&Reply::Refuse(reason));
            return;
        }
    };
    // Claim the peer's slot, or refuse a duplicate. Of two simultaneous connections between the
    // same nodes, the one opened by the lower node id wins on both sides.
    let attempt = {
        let mut t = lock(&s.table);
        t.next_attempt += 1;
        let attempt = t.next_attempt;
        let mut driver_waits = false;
        let refuse = match t.peers.get(&peer) {
            None => None,
            Some(Slot::Up(_)) => Some(Reply::Refuse(format!(
                "{} is already connected to {peer}",
                s.identity.node
            ))),
            Some(Slot::Connecting { outgoing: true, .. }) if s.identity.node < peer => {
                Some(Reply::Yield(format!(
                    "simultaneous connect: the connection opened by {} (the lower id) wins",
                    s.identity.node
                )))
            }
            Some(Slot::Connecting { outgoing: true, .. }) => {
                // This connection replaces the driver's own attempt, which ends quietly.
                driver_waits = true;
                None
            }
            Some(Slot::Connecting {
                outgoing: false, ..
            }) => Some(Reply::Refuse(format!(
                "another connection from {peer} is being set up"
            ))),
        };
        if let Some(reply) = refuse {
            drop(t);
            tracing::info!(%peer, "verbs fabric: refusing a duplicate connection");
            let _ = ctl.write_frame(&reply);
            return;
        }
        t.peers.insert(
            peer,
            Slot::Connecting {
                attempt,
                outgoing: false,
                driver_waits,
            },
        );
        attempt
    };
    drop(ctl);
    let result = (|| -> Result<Established, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut ctl = Control::new(&mut stream, left.max(Duration::from_millis(1)))
            .map_err(control_err("hello"))?;
        ctl.write_frame(&Reply::Accept(s.my_hello(0)))
            .map_err(control_err("hello"))?;
        match ctl.read_frame::<Verdict>().map_err(control_err("hello"))? {
            Verdict::Accept => {}
            Verdict::Refuse(reason) => return Err(format!("refused by {peer}: {reason}")),
        }
        drop(ctl);
        let mut conn = VerbsConnection::accept(&s.device, &mut stream, &s.connection_config())
            .map_err(|e| format!("QP handshake with {peer}: {}", render(&e)))?;
        let left = deadline.saturating_duration_since(Instant::now());
        let backlog = probe::echo_pings(&mut conn, theirs.probe_pings, left)
            .map_err(|e| format!("cost probe with {peer}: {e}"))?;
        let left = deadline.saturating_duration_since(Instant::now());
        let mut ctl = Control::new(&mut stream, left.max(Duration::from_millis(1)))
            .map_err(control_err("receiving costs"))?;
        let frame: CostsFrame = ctl.read_frame().map_err(control_err("receiving costs"))?;
        drop(ctl);
        let costs = s.path_costs(&frame, &theirs, &theirs.device);
        Ok(Established {
            conn,
            control: stream,
            peer_hello: theirs,
            costs,
            cost_note: frame.note,
            backlog,
        })
    })();
    match result {
        Ok(est) => install(s, peer, attempt, est, remote),
        Err(reason) => s.attempt_failed(peer, attempt, reason),
    }
}

/// Makes an established connection live: `PeerConnected`, then visible to callers and the
/// poller (both under the table lock). Drops it quietly if the attempt was superseded or the
/// fabric is shutting down.
fn install(s: &Shared, peer: NodeId, attempt: u64, est: Established, remote: RemoteTable) {
    let params = est.conn.params();
    let summary = summary(
        s,
        peer,
        &est.peer_hello,
        &params,
        &est.costs,
        &est.cost_note,
    );
    let peer_params = PeerParams {
        // Cannot truncate: at most MAX_LANES (16).
        lanes: params.lanes as u16,
        costs: est.costs,
    };
    if let Err(e) = est.control.set_nonblocking(true) {
        s.attempt_failed(peer, attempt, format!("control stream: {e}"));
        return;
    }
    let conn = Arc::new(PeerConn::new(
        peer,
        params,
        remote,
        ConnState::new(est.conn, est.control, est.backlog, params.lanes),
    ));
    let mut t = lock(&s.table);
    let ours =
        matches!(t.peers.get(&peer), Some(Slot::Connecting { attempt: a, .. }) if *a == attempt);
    if !ours || s.shutdown.load(Ordering::Acquire) {
        drop(t);
        tracing::debug!(%peer, "verbs fabric: dropping a superseded connection");
        return;
    }
    tracing::info!(%peer, %summary, "verbs fabric: peer connected");
    s.emit(FabricEvent::PeerConnected {
        peer,
        params: peer_params,
        summary,
    });
    t.peers.insert(peer, Slot::Up(conn));
    drop(t);
    s.wake_poller();
}

fn summary(
    s: &Shared,
    peer: NodeId,
    theirs: &Hello,
    p: &NegotiatedParams,
    c: &PathCosts,
    note: &str,
) -> String {
    format!(
        "verbs {}:{} <-> {peer} ({}): {} lane(s), MTU {} B, {} outstanding READs/QP, {} receive \
         slots x {} B shared by the lanes, inline <= {} B, send queue {} per lane; costs ({note}): rtt {:.1} \
         us, message {:.1} us, READ {:.0} MB/s, copy {:.0} MB/s, READ setup {:.1} us",
        s.device.name(),
        s.device.port().port,
        theirs.device,
        p.lanes,
        p.mtu_bytes,
        p.max_rd_atomic,
        p.recv_slots,
        p.recv_slot_bytes,
        p.max_inline_bytes,
        p.send_queue_depth,
        c.round_trip_ns / 1e3,
        c.message_overhead_ns / 1e3,
        c.wire_bytes_per_sec / 1e6,
        c.copy_bytes_per_sec / 1e6,
        c.read_setup_ns / 1e3,
    )
}

// ---- the poller ---------------------------------------------------------------------------

fn poll_loop(s: &Shared) {
    let mut conns: Vec<Arc<PeerConn>> = Vec::new();
    let mut control_fds = Vec::new();
    let mut idle_rounds = 0u32;
    let mut last_work = Instant::now();
    let mut last_liveness = Instant::now();
    let mut liveness_due = false;
    while !s.shutdown.load(Ordering::Acquire) {
        conns.clear();
        conns.extend(lock(&s.table).peers.values().filter_map(|slot| match slot {
            Slot::Up(c) => Some(c.clone()),
            Slot::Connecting { .. } => None,
        }));
        let check_liveness = liveness_due || last_liveness.elapsed() >= s.config.liveness_interval;
        if check_liveness {
            last_liveness = Instant::now();
            liveness_due = false;
        }
        let mut work = 0;
        for c in &conns {
            let mut st = lock(&c.state);
            work += c.service(&mut st, s, check_liveness);
        }
        if work > 0 {
            idle_rounds = 0;
            last_work = Instant::now();
            continue;
        }
        // Spin for a bounded time, not a number of rounds: on a busy machine every round
        // is a CPU slice taken from the daemon's other threads.
        if last_work.elapsed() < s.config.busy_poll {
            thread::yield_now();
            continue;
        }
        let idle = match &s.idle {
            // Recently busy (or no completion channel): short sleeps from 10 µs to
            // idle_poll_max, cut short by posts (unpark), keep the next reply's latency a poll,
            // not an event wake-up.
            Some(idle) if last_work.elapsed() >= s.config.event_sleep_after => idle,
            _ => {
                let shift = idle_rounds.min(10);
                idle_rounds = idle_rounds.saturating_add(1);
                let sleep = Duration::from_micros(10u64 << shift).min(s.config.idle_poll_max);
                thread::park_timeout(sleep);
                continue;
            }
        };
        // Sleep on events: arm every CQ, then look once more (a completion that arrived before
        // arming raises no event), and sleep only if that finds nothing.
        idle.prepare_to_sleep();
        control_fds.clear();
        for c in &conns {
            let mut st = lock(&c.state);
            if c.arm(&mut st, s) {
                work += c.service(&mut st, s, false);
                control_fds.push(st.control_fd());
            } else {
                work += 1;
            }
        }
        if work > 0 {
            idle.cancel_sleep();
            last_work = Instant::now();
            continue;
        }
        match idle.sleep(&control_fds, IDLE_SLEEP_MAX) {
            Ok(woken) => {
                // Control stream events and the periodic safety net both check liveness.
                liveness_due = woken.control || !woken.completions;
                if woken.completions {
                    last_work = Instant::now();
                }
            }
            Err(e) => {
                tracing::warn!("verbs poller: waiting for events failed: {e}; polling instead");
                thread::sleep(s.config.idle_poll_max);
            }
        }
    }
}

/// Longest sleep of the idle poller when no event comes: a safety net, not a mechanism.
const IDLE_SLEEP_MAX: Duration = Duration::from_secs(1);
