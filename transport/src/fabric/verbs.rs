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
//! outside the peer's arenas fails with [`ReadError::RemoteAccess`] before anything is posted
//! (a NIC-level remote access error would break the whole QP). A key that is not the arena's
//! is a memory window the peer bound for a lease (see below) and is posted as is: a wrong one
//! fails at the NIC, and the connection with it.
//!
//! **READ access per lease** ([`Fabric::grant_read`], `windows`). With memory windows (the
//! default, where the device has them: rxe and mlx5 do) the arenas are registered without
//! remote access of their own, and each lease gets a type 2 window per lane, bound to exactly
//! the object's bytes on that lane's queue pair; the grant is answered with the windows' rkeys
//! once every bind completed, and a revocation once every invalidation did, so the holder's
//! core unpins the object only when no key reaches it. A READ with a key of an ended lease, of
//! another lease, through another peer's QP, or with the arena's own key fails with a remote
//! access error (which breaks the reader's QP, as RDMA does). Where the device has no memory
//! windows (or `memory_windows` is off) the fabric says so at start, registers the arenas for
//! remote READs, and grants the arena's key: any connected peer can then READ any arena byte
//! while connected. The requester accepts either: a key that is not the arena's is a window,
//! READ as one piece. See [`VerbsFabric::granted_regions`].
//!
//! **A relay's partial copy** ([`Fabric::grant_partial_read`]) is leased the same way, over
//! the whole block of the copy still being received, without claiming it (its own READs land
//! in it): the window bounds what a reader can take to this one object, and the reader's core
//! READs only the prefix its relay announced. Why that is safe is in `claim`.
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
//!
//! [`VerbsConnection`]: crate::verbs::VerbsConnection

mod claim;
mod config;
mod errors;
#[doc(hidden)]
pub mod fuzzing;
mod hello;
mod idle;
mod peer;
mod poller;
mod probe;
mod setup;
mod windows;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use skyriver_core::node::{ArenaKey, PathCosts, ReadError, ReadGrant, ReadOpId};
use skyriver_core::wire::{self, EagerHeader};
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion, TransferId};

use super::{
    Arenas, EventBacklog, EventPlace, EventSender, EventsFull, Fabric, FabricError, FabricEvent,
    FabricIdentity,
};
use crate::arena::{ReadableRegion, SharedArena, ViewError, WritableRegion};
use crate::verbs::{plan_reads, ConnectionConfig, MrChunk, Registration, RemoteChunk, VerbsDevice};
use claim::LeaseClaim;
pub use config::VerbsFabricConfig;
use errors::render;
pub use errors::{
    ConfigError, ConnectionLost, HandshakeFailure, HelloRejection, HelloShapeError,
    RemoteRegionError, VerbsStartError,
};
use hello::{CostsFrame, Hello, WireArena, WireChunk};
use idle::IdleWait;
use peer::PeerConn;
use poller::poll_loop;
pub use probe::ProbeError;
use setup::{accept_loop, connect_to};

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

/// Everything the fabric's threads share. Field order is drop order: connections (in the
/// table) go before the registrations, which go before the device.
struct Shared {
    table: Mutex<Table>,
    /// READ access granted per lease without memory windows: (reader, its transfer) → region,
    /// held by its claim until revoked.
    grants: Mutex<BTreeMap<(NodeId, TransferId), (LocalRegion, LeaseClaim)>>,
    /// Memory windows per lease, when the device has them (else `None`).
    windows: windows::WindowState,
    /// The driver's event channel, behind what the poller could not queue yet.
    events: EventBacklog,
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
    /// Queues `event` without waiting for room in the driver's channel, holding it in the
    /// fabric's backlog while the channel is full (the poller moves it on). The poller cannot
    /// wait there: it emits while holding a connection's state, which the driver's own calls
    /// (`post_read`, `send_eager`) lock, so waiting for the driver could deadlock it; and the
    /// driver's calls emit too. The backlog is bounded by what its events hold: a message
    /// holds its receive slot until the driver drops it (the peer then meets
    /// receiver-not-ready, the hardware's back-pressure), a grant event answers a grant the
    /// driver asked for, and connection events come one each per connection. (A READ's
    /// completion never waits here: it takes the place `post_read` reserved.)
    fn emit(&self, event: FabricEvent) {
        if self.events.send(event) {
            // Held back: the poller must not sleep on completion events while it holds some.
            self.wake_poller();
        }
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
    fn attempt_failed(&self, peer: NodeId, attempt: u64, reason: HandshakeFailure) {
        let mut t = lock(&self.table);
        if let Some(&Slot::Connecting {
            attempt: a,
            driver_waits,
            ..
        }) = t.peers.get(&peer)
        {
            if a == attempt {
                t.peers.remove(&peer);
                if driver_waits {
                    // The daemon logs the PeerLost, once per change of state.
                    tracing::debug!(%peer, %reason, "verbs fabric: connection failed");
                } else {
                    tracing::warn!(%peer, %reason, "verbs fabric: connection failed");
                }
                if driver_waits {
                    self.emit(FabricEvent::PeerLost {
                        peer,
                        reason: reason.to_string(),
                    });
                }
                return;
            }
        }
        tracing::debug!(%peer, %reason, "verbs fabric: superseded connection attempt ended");
    }

    /// The peer answered an outgoing attempt with [`Reply::Yield`](hello::Reply::Yield): its own connection to this
    /// node wins. Wait (until `deadline`) for that connection to take the slot over; the
    /// attempt then ends quietly. If it never comes, the attempt fails.
    fn yield_to_peer(
        &self,
        peer: NodeId,
        attempt: u64,
        deadline: Instant,
        reason: String,
    ) -> Result<(), HandshakeFailure> {
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
                return Err(HandshakeFailure::YieldTimedOut { peer, reason });
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

    /// A readable view of a local region (an eager send's source, a region granted for READs).
    fn view(&self, region: LocalRegion) -> Result<ReadableRegion, FabricError> {
        let a = self
            .arenas
            .get(&region.arena)
            .ok_or(FabricError::BadRegion(region))?;
        ReadableRegion::new(a.arena.clone(), region.offset, region.len).map_err(|source| {
            match source {
                ViewError::OutOfArena(_) => FabricError::BadRegion(region),
                source @ ViewError::InUse { .. } => FabricError::InUse { region, source },
            }
        })
    }

    fn my_hello(&self, probe_pings: u32) -> Hello {
        let chunk = self.probe.reg.chunks()[0];
        Hello {
            node: self.identity.node.0,
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
    fn check_hello(&self, h: &Hello, expected: Option<NodeId>) -> Result<(), HelloRejection> {
        h.validate().map_err(|source| HelloRejection::Shape {
            node: h.node,
            source,
        })?;
        if h.node == self.identity.node.0 {
            return Err(HelloRejection::OwnId { node: h.node });
        }
        if let Some(expected) = expected {
            if expected.0 != h.node {
                return Err(HelloRejection::WrongNode {
                    expected,
                    found: h.node,
                });
            }
        }
        if h.recv_slot_bytes != self.config.recv_slot_bytes {
            return Err(HelloRejection::SlotSize {
                peer: h.node,
                theirs: h.recv_slot_bytes,
                me: self.identity.node,
                ours: self.config.recv_slot_bytes,
            });
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
    /// threads. Fails with a [`VerbsStartError`] (saying why, e.g. that RDMA verbs are not
    /// available on this machine) without starting anything.
    pub fn start(
        config: VerbsFabricConfig,
        identity: FabricIdentity,
        arenas: Arenas,
        events: EventSender,
    ) -> Result<VerbsFabric, VerbsStartError> {
        let device_name = config.device.clone();
        config
            .validate()
            .map_err(|source| VerbsStartError::Config {
                device: device_name.clone(),
                source,
            })?;
        let device =
            VerbsDevice::open(&config.device, config.port, config.gid_index).map_err(|source| {
                VerbsStartError::OpenDevice {
                    device: device_name.clone(),
                    source,
                }
            })?;
        // The probe for memory windows: one allocated (kept in the pool) or a warning.
        let window_state = if config.memory_windows {
            match device.alloc_window() {
                Ok(first) => {
                    tracing::info!(
                        device = %device_name,
                        "verbs fabric: memory windows: each lease's READs reach only its object"
                    );
                    Some(windows::SharedWindows::new(
                        first,
                        config.max_memory_windows.max(1),
                    ))
                }
                Err(error) => {
                    tracing::warn!(
                        device = %device_name,
                        %error,
                        "verbs fabric: the device has no memory windows; peers READ objects \
                         through the arenas' registrations, so a connected peer can READ any \
                         arena byte while it is connected"
                    );
                    None
                }
            }
        } else {
            tracing::warn!(
                device = %device_name,
                "verbs fabric: memory windows turned off: peers READ objects through the \
                 arenas' registrations, so a connected peer can READ any arena byte while it is \
                 connected"
            );
            None
        };
        let mut local = BTreeMap::new();
        for (id, arena) in arenas {
            let (ptr, len) = (arena.base_addr() as *mut u8, arena.size_bytes() as usize);
            // SAFETY: the arena's mapping lives as long as the Arc kept next to the
            // registration in `LocalArena`, whose field order drops the registration first. The
            // device writes arena bytes only as READ destinations, each claimed by a
            // `WritableRegion` for as long as the device may write it (`post_reads`' contract),
            // and reads them for peers only inside regions granted (a sealed object claimed by a
            // `ReadableRegion`, a relay's copy being received unclaimed, see `claim`); without
            // memory windows peers may READ any byte. A DMA read forms no reference in this
            // process, so it harms nothing even where it overlaps a DMA write.
            let reg = unsafe {
                if window_state.is_some() {
                    device.register_windows_only(ptr, len, config.max_mr_bytes)
                } else {
                    device.register(ptr, len, config.max_mr_bytes)
                }
            }
            .map_err(|source| VerbsStartError::RegisterArena {
                device: device_name.clone(),
                arena: id,
                source,
            })?;
            local.insert(id, LocalArena { reg, arena });
        }
        let probe_len = config.probe_bytes as usize;
        let mut probe_mem =
            MmapMut::map_anon(probe_len).map_err(|source| VerbsStartError::ProbeBuffer {
                device: device_name.clone(),
                bytes: config.probe_bytes,
                source,
            })?;
        // SAFETY: the map is owned by `ProbeBuffer` next to the registration, which is dropped
        // first (field order); its bytes are scratch that only the device writes and reads.
        let probe_reg = unsafe { device.register(probe_mem.as_mut_ptr(), probe_len, u64::MAX) }
            .map_err(|source| VerbsStartError::RegisterProbe {
                device: device_name.clone(),
                source,
            })?;
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
        let listen_error = |source| VerbsStartError::Listen {
            device: device_name.clone(),
            addr: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).map_err(listen_error)?;
        let listen_addr = listener.local_addr().map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;

        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            grants: Mutex::new(BTreeMap::new()),
            windows: window_state,
            events: EventBacklog::new(events),
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
            .map_err(|source| VerbsStartError::Thread {
                device: device_name.clone(),
                thread: "poller",
                source,
            })?;
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
                return Err(VerbsStartError::Thread {
                    device: device_name,
                    thread: "acceptor",
                    source: e,
                });
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

    /// The leases READ access is granted to now: (reader, its transfer, region).
    pub fn granted_regions(&self) -> Vec<(NodeId, TransferId, LocalRegion)> {
        match windows::windows(&self.shared) {
            Some(windows) => windows
                .granted()
                .into_iter()
                .map(|(peer, req, region, _)| (peer, req, region))
                .collect(),
            None => lock(&self.shared.grants)
                .iter()
                .map(|(&(peer, req), &(region, _))| (peer, req, region))
                .collect(),
        }
    }

    /// Whether leases are scoped by memory windows (the device has them and they are on).
    pub fn uses_memory_windows(&self) -> bool {
        self.shared.windows.is_some()
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
            c.teardown(&mut st, &self.shared, ConnectionLost::Shutdown);
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
                reason: HandshakeFailure::SelfConnect.to_string(),
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
            s.attempt_failed(peer, attempt, HandshakeFailure::Thread { source: e });
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
            return Err(FabricError::EmptyMessage);
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
        let payload = s.view(source)?;
        let conn = s.peer_conn(peer).ok_or(FabricError::NotConnected(peer))?;
        // The core keeps the bytes unchanged until its next input, not until the SEND
        // completes; so they are copied now (into a send slot or inline), not referenced.
        let mut bytes = Vec::with_capacity(len as usize);
        wire::encode_eager(header, payload.as_slice(), &mut bytes);
        drop(payload);
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
    ) -> Result<(), EventsFull> {
        let s = &self.shared;
        // The place its completion will take, whatever happens from here: the driver calls
        // this, so it cannot wait for room in the channel it drains.
        let completion = s.events.sender().reserve_now()?;
        let fail = |completion: EventPlace, e: ReadError| {
            tracing::debug!(%peer, %op, %local, %remote, error = %e, "verbs fabric: READ refused");
            completion.send(FabricEvent::ReadCompleted { op, result: Err(e) });
            Ok(())
        };
        let Some(arena) = s.local_arena(&local) else {
            return fail(
                completion,
                ReadError::QueuePair(format!(
                    "local region {local} is outside this node's registered arenas"
                )),
            );
        };
        if local.len != remote.len || local.len == 0 {
            return fail(
                completion,
                ReadError::QueuePair(format!(
                    "READ of {} bytes into a {}-byte region",
                    remote.len, local.len
                )),
            );
        }
        // Claimed until the READ is over (its `ReadCompleted`, or the QP destroyed): nothing in
        // this process views the bytes the device writes.
        let destination = match WritableRegion::new(arena.arena.clone(), local.offset, local.len) {
            Ok(destination) => destination,
            Err(error) => {
                return fail(
                    completion,
                    ReadError::QueuePair(format!("READ into {local}: {error}")),
                )
            }
        };
        let Some(conn) = s.peer_conn(peer) else {
            drop(destination);
            return fail(completion, ReadError::ConnectionLost);
        };
        if usize::from(lane) >= conn.lanes {
            drop(destination);
            return fail(
                completion,
                ReadError::QueuePair(format!(
                    "lane {lane} does not exist ({} lanes to {peer})",
                    conn.lanes
                )),
            );
        }
        let window;
        let remote_chunks = match conn.remote.resolve(&remote) {
            Ok(c) => c,
            // Not the arena's key: a memory window the holder bound for this lease over the
            // object's bytes (which lie inside the arena, as checked), one piece under its key.
            Err(RemoteRegionError::WrongKey { .. }) => {
                window = [RemoteChunk {
                    addr: remote.addr,
                    len: remote.len,
                    rkey: remote.rkey,
                }];
                &window[..]
            }
            Err(why) => {
                tracing::warn!(%peer, %remote, %why, "verbs fabric: READ of memory the peer did not register");
                drop(destination);
                return fail(completion, ReadError::RemoteAccess);
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
                drop((st, destination));
                return fail(
                    completion,
                    ReadError::QueuePair(format!("planning the READ: {e}")),
                );
            }
        };
        conn.post_read(
            &mut st,
            s,
            op,
            usize::from(lane),
            reqs,
            peer::ReadTarget {
                destination,
                completion,
            },
        );
        drop(st);
        s.wake_poller();
        Ok(())
    }

    fn grant_read(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
    ) -> Result<Option<ReadGrant>, FabricError> {
        // Claimed for reading until the revocation is complete: nothing in this process writes
        // the bytes peers may READ.
        let view = self.shared.view(region)?;
        self.grant_lease(peer, req, region, LeaseClaim::Sealed { _view: view })
    }

    fn revoke_read(&self, peer: NodeId, req: TransferId) -> bool {
        let s = &self.shared;
        if s.windows.is_none() {
            if lock(&s.grants).remove(&(peer, req)).is_none() {
                tracing::warn!(%peer, %req, "verbs fabric: revoking READ access that was not granted");
            }
            return true;
        }
        let done = match s.peer_conn(peer) {
            Some(conn) => {
                let mut st = lock(&conn.state);
                let done = windows::windows(s)
                    .expect("checked above")
                    .revoke(Some((&conn, &mut st)), (peer, req));
                drop(st);
                done
            }
            None => windows::windows(s)
                .expect("checked above")
                .revoke(None, (peer, req)),
        };
        s.wake_poller();
        done
    }

    /// A window over the whole block of a copy still being received (or, without windows, the
    /// arena's key), held without a claim: the copy's own READs land in it meanwhile. The
    /// announced prefix ([`Fabric::extend_partial_read`]) cannot be checked READ by READ on
    /// the NIC; see `claim` for why the grant is safe without that.
    fn grant_partial_read(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
    ) -> Result<Option<ReadGrant>, FabricError> {
        self.shared
            .local_arena(&region)
            .ok_or(FabricError::BadRegion(region))?;
        self.grant_lease(peer, req, region, LeaseClaim::Receiving)
    }

    fn extend_partial_read(&self, _peer: NodeId, _req: TransferId, _prefix: u64) {
        // Nothing to do: the NIC serves READs without the fabric, which bounds them by the
        // lease's window instead (see `claim`); the reader's core keeps below the prefix.
    }

    fn serves_partial_copies(&self) -> bool {
        true
    }
}

impl VerbsFabric {
    /// READ access over `region` for `peer`'s lease `req`, held by `claim` until revoked: at
    /// once without memory windows, else answered by `ReadGranted` once the windows are bound.
    fn grant_lease(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
        claim: LeaseClaim,
    ) -> Result<Option<ReadGrant>, FabricError> {
        let s = &self.shared;
        let Some(windows) = windows::windows(s) else {
            lock(&s.grants).insert((peer, req), (region, claim));
            return Ok(Some(ReadGrant::default()));
        };
        let conn = s.peer_conn(peer).ok_or(FabricError::NotConnected(peer))?;
        let mut st = lock(&conn.state);
        let granted = windows.grant(s, &conn, &mut st, req, region, claim);
        drop(st);
        s.wake_poller();
        granted.map(|()| None)
    }
}
