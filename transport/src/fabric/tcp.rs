//! The TCP fabric: the fallback wherever no RDMA device exists (Ethernet, IPoIB).
//!
//! One TCP connection per peer carries both two-sided messages and emulated one-sided READs.
//! A READ is a request that the holder's *fabric* serves straight from its arena memory, without
//! the holder's core, and only under a key granted for one lease (`grants`: random, for one
//! peer and one object's region, dead once revoked), so the protocol behaves exactly as over verbs: the requester's
//! core learns nothing until the bytes are in place. Data moves without intermediate copies:
//! the holder writes from its shared arena mapping into the socket, and the requester reads from
//! the socket straight into the destination object.
//!
//! Frames (little endian): `kind: u8` then
//! - `MESSAGE`: `len: u32`, the encoded peer message;
//! - `READ_REQUEST`: `op: u64, addr: u64, len: u64, rkey: u32` (addr = offset in the arena;
//!   rkey = the lease's key);
//! - `READ_RESPONSE`: `op: u64, status: u8, len: u64`, then `len` bytes when status is OK;
//! - `PING`/`PONG`: `nonce: u64` (cost measurement at connect time: batches of ping-pongs, back
//!   to back and after a pause, whose best estimates per peer and link set the round trip the
//!   eager threshold is chosen with).
//!
//! Connections start with an authenticated handshake (postcard, versioned): a mutual
//! challenge-response in which each side proves the cluster token with an HMAC over both
//! sides' fresh nonces and node ids, so the token never crosses the wire and a recorded
//! handshake cannot be replayed; a peer with another token or version is refused with a
//! reason both sides log (see `handshake`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use skyriver_core::node::{ArenaKey, PathCosts, ReadError, ReadGrant, ReadOpId, RoundTripEstimate};
use skyriver_core::wire::{self, EagerHeader};
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion, TransferId};
use tokio::net::TcpListener;
use tracing::info;

use super::{
    Arenas, EventPlace, EventSender, EventsFull, Fabric, FabricError, FabricEvent, FabricIdentity,
};
use crate::arena::{ReadableRegion, ViewError, WritableRegion};
use crate::sync;
use connection::{Link, Outgoing, SubmitError};
use grant_view::{GrantView, PartialCopy};
use grants::Grants;
use handshake::{accept_loop, dial};

mod connection;
mod errors;
mod grant_view;
mod grants;
mod handshake;

pub use errors::{Refusal, TcpHandshakeError, TcpLinkError, TcpStartError};
#[doc(hidden)]
pub use handshake::fuzzing;

const HANDSHAKE_MAGIC: [u8; 8] = *b"SKYRTCP1";
/// 2: a challenge-response instead of the token in clear; 3: five batches of connect-time
/// ping-pongs instead of one; 4: peer messages of wire version 2 (`Rendezvous` with per-lane
/// keys) and READs only under per-lease keys.
const HANDSHAKE_VERSION: u32 = 4;
const MAX_HANDSHAKE_BYTES: usize = 4096;

const KIND_MESSAGE: u8 = 1;
const KIND_READ_REQUEST: u8 = 2;
const KIND_READ_RESPONSE: u8 = 3;
const KIND_PING: u8 = 4;
const KIND_PONG: u8 = 5;

const STATUS_OK: u8 = 0;
const STATUS_REMOTE_ACCESS: u8 = 1;

/// Ping-pongs each way in one batch of the connect-time round-trip measurement.
const PING_ROUNDS: usize = 8;
/// Largest READ one request may ask for (the core slices larger ones).
const MAX_READ_BYTES: u64 = 1 << 30;
const SOCKET_BUFFER_BYTES: usize = 256 * 1024;
/// Send and receive buffer size set on every peer connection's socket (`SO_SNDBUF`,
/// `SO_RCVBUF`): room for a few READ slices in flight.
pub const SOCKET_BUFFER_SIZE_BYTES: usize = SOCKET_BUFFER_BYTES * 16;
/// Most bytes a peer connection's socket holds not yet sent (`TCP_NOTSENT_LOWAT`); the
/// writer task keeps the rest queued, where a message overtakes READ data. Without it the
/// socket takes up to its whole send buffer, and a message written behind READ data for a
/// busy peer waits for all of it: 4 MiB at a seventh of 1 Gbit is 240 ms, on every READ
/// request and reply of a node that serves the peer it fetches from (all-to-all).
const UNSENT_BYTES_LIMIT: u32 = SOCKET_BUFFER_BYTES as u32;
/// Read buffer of a connection: small, because READ data is read straight into the destination
/// and whatever the buffer already holds of it costs one more copy.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Settings of the TCP fabric.
#[derive(Debug, Clone)]
pub struct TcpFabricConfig {
    /// Where to accept peer connections (port 0: any free port).
    pub listen: SocketAddr,
    /// Limit on one connection attempt, handshake included.
    pub connect_timeout: Duration,
    /// Worker threads of the fabric's own runtime; 0: run on the caller's runtime instead
    /// (`start` must then be called inside it, and the fabric's tasks stop with it). On the
    /// caller's runtime a message reaches the caller's tasks without a cross-thread wake-up.
    pub worker_threads: usize,
    /// Costs to report instead of the defaults (the round trip is always measured).
    pub costs: PathCosts,
    /// A peer that stops answering (its machine or link died, so no FIN or RST ever comes) is
    /// declared lost after about this long: TCP keepalive probes on a quiet connection, a
    /// user timeout on unacknowledged data. Its pending READs then fail, so a fetch moves on
    /// to another holder instead of waiting for a connection the kernel would keep for
    /// minutes.
    pub dead_peer_timeout: Duration,
    /// Most bytes of frames queued for one peer behind its socket (READ data is written from
    /// the arena and counts only its header). A peer that does not read what is sent to it is
    /// disconnected when this or `max_queued_frames` is reached, with a reason, instead of
    /// buffered without limit.
    pub max_queued_bytes: usize,
    /// Most frames queued for one peer behind its socket; see `max_queued_bytes`.
    pub max_queued_frames: usize,
    /// Most bytes of one peer's messages handed to the driver and not yet dropped (each
    /// message counts 64 bytes more than its length). When reached, the connection's reader
    /// stops reading until the driver catches up, so a peer sending faster than this node
    /// handles is slowed by TCP flow control. Never less than one message of the largest size.
    pub max_undelivered_bytes: usize,
}

impl TcpFabricConfig {
    /// Defaults for a listen address.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            connect_timeout: Duration::from_secs(5),
            worker_threads: 2,
            costs: TCP_DEFAULT_COSTS,
            dead_peer_timeout: Duration::from_secs(5),
            max_queued_bytes: 64 << 20,
            max_queued_frames: 16 * 1024,
            max_undelivered_bytes: 4 << 20,
        }
    }
}

/// Costs of the TCP paths used until measured: kernel copies on both ends dominate.
///
/// Fitted to `skyriver bench fetch` on loopback (forced eager against forced rendezvous, same
/// run): rendezvous costs about 40 µs more than eager for small objects — its extra round
/// trip plus `read_setup_ns` for the Rendezvous reply, the READ request and the Finish — and
/// eager's lead shrinks with size (`message_overhead_ns` per receive slot and two copies of
/// cache-warm data) until rendezvous wins from 128–192 KiB on. The model's crossover lands
/// near 200 KiB, so the threshold after the bias toward rendezvous is about 100 KiB.
pub const TCP_DEFAULT_COSTS: PathCosts = PathCosts {
    round_trip_ns: 40_000.0,
    message_overhead_ns: 4_000.0,
    copy_bytes_per_sec: 20e9,
    wire_bytes_per_sec: 2.5e9,
    read_setup_ns: 15_000.0,
};

enum PeerSlot {
    Connecting,
    Connected { link: Arc<Link>, generation: u64 },
}

struct PendingRead {
    peer: NodeId,
    /// The READ's destination, claimed until its data is in (or the READ failed).
    destination: WritableRegion,
    /// The place of its `ReadCompleted` in the driver's channel, taken when it was posted.
    completion: EventPlace,
}

impl PendingRead {
    /// Tells the driver the READ is over, through the place taken for it: the destination's
    /// claim ends first, so the driver may view the bytes once told.
    fn complete(self, op: ReadOpId, result: Result<(), ReadError>) {
        let PendingRead {
            destination,
            completion,
            ..
        } = self;
        drop(destination);
        completion.send(FabricEvent::ReadCompleted { op, result });
    }

    fn fail(self, op: ReadOpId, error: ReadError) {
        self.complete(op, Err(error));
    }
}

struct Inner {
    identity: FabricIdentity,
    config: TcpFabricConfig,
    arenas: Arenas,
    keys: BTreeMap<ArenaId, ArenaKey>,
    listen_addr: SocketAddr,
    peers: Mutex<BTreeMap<NodeId, PeerSlot>>,
    /// READ access per lease.
    grants: Arc<sync::Mutex<Grants<GrantView>>>,
    pending_reads: Mutex<BTreeMap<u64, PendingRead>>,
    events: EventSender,
    next_generation: Mutex<u64>,
    /// The best round trips measured to each peer, kept across its reconnections while the
    /// link (the addresses at both ends) stays the same.
    round_trips: Mutex<BTreeMap<NodeId, PeerRoundTrips>>,
}

/// Names a link by its ends' addresses: a peer reached from another address, or at another,
/// has its round trips measured anew.
type LinkEnds = (std::net::IpAddr, std::net::IpAddr);

/// The round-trip estimates of one peer.
#[derive(Debug, Default)]
struct PeerRoundTrips {
    /// From back-to-back pings.
    awake: RoundTripEstimate<LinkEnds>,
    /// From pings after a pause (a wake-up on a quiet machine).
    idle: RoundTripEstimate<LinkEnds>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded maps stay consistent between statements; a panic elsewhere is already a bug.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The TCP fabric. Owns a small runtime of its own so bulk transfers never delay the daemon's
/// local clients, or shares the caller's (`worker_threads: 0`) for the shortest latency.
pub struct TcpFabric {
    inner: Arc<Inner>,
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    accept_task: tokio::task::AbortHandle,
}

impl TcpFabric {
    /// Binds the listener and starts accepting peers.
    pub fn start(
        config: TcpFabricConfig,
        identity: FabricIdentity,
        arenas: Arenas,
        events: EventSender,
    ) -> Result<Self, TcpStartError> {
        let runtime = match config.worker_threads {
            0 => None,
            threads => Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .thread_name("skyriver-tcp-fabric")
                    .enable_all()
                    .build()
                    .map_err(|source| TcpStartError::Runtime { source })?,
            ),
        };
        let handle = match &runtime {
            Some(runtime) => runtime.handle().clone(),
            None => tokio::runtime::Handle::try_current()
                .map_err(|source| TcpStartError::NoRuntime { source })?,
        };
        // Bound with std so this works from inside another runtime (no block_on).
        let listener = std::net::TcpListener::bind(config.listen)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .and_then(|listener| {
                let _context = handle.enter();
                TcpListener::from_std(listener)
            })
            .map_err(|source| TcpStartError::Listen {
                addr: config.listen,
                source,
            })?;
        let listen_addr = listener
            .local_addr()
            .map_err(|source| TcpStartError::Listen {
                addr: config.listen,
                source,
            })?;
        // Peers name arena bytes by offset; the key that lets them READ is granted per lease
        // (`grant_read`), so the arenas' own keys open nothing.
        let keys = arenas
            .keys()
            .map(|&arena| {
                (
                    arena,
                    ArenaKey {
                        base_addr: 0,
                        rkey: 0,
                    },
                )
            })
            .collect();
        let inner = Arc::new(Inner {
            identity,
            config,
            arenas,
            keys,
            listen_addr,
            peers: Mutex::new(BTreeMap::new()),
            grants: Arc::new(sync::Mutex::new(Grants::default())),
            pending_reads: Mutex::new(BTreeMap::new()),
            events,
            next_generation: Mutex::new(0),
            round_trips: Mutex::new(BTreeMap::new()),
        });
        let accept_task = handle
            .spawn(accept_loop(inner.clone(), listener))
            .abort_handle();
        info!(listen = %listen_addr, "TCP fabric listening");
        Ok(Self {
            inner,
            runtime,
            handle,
            accept_task,
        })
    }

    fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, future: F) {
        self.handle.spawn(future);
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        self.accept_task.abort();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Fabric for TcpFabric {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen_addr(&self) -> SocketAddr {
        self.inner.listen_addr
    }

    fn region_keys(&self) -> BTreeMap<ArenaId, ArenaKey> {
        self.inner.keys.clone()
    }

    fn connect(&self, peer: NodeId, addr: SocketAddr) {
        {
            let mut peers = lock(&self.inner.peers);
            if peers.contains_key(&peer) {
                return;
            }
            peers.insert(peer, PeerSlot::Connecting);
        }
        self.spawn(dial(self.inner.clone(), peer, addr));
    }

    fn is_connected_or_connecting(&self, peer: NodeId) -> bool {
        lock(&self.inner.peers).contains_key(&peer)
    }

    fn send(&self, peer: NodeId, bytes: Vec<u8>) -> Result<(), FabricError> {
        if bytes.len() > wire::MAX_MESSAGE_BYTES {
            return Err(FabricError::MessageTooLarge {
                len: bytes.len(),
                limit: wire::MAX_MESSAGE_BYTES,
            });
        }
        let mut frame = Vec::with_capacity(5 + bytes.len());
        frame.push(KIND_MESSAGE);
        frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        frame.extend_from_slice(&bytes);
        let queued = self.inner.queue(peer, Outgoing::Frame(frame));
        // After the write (or the queueing): `bench breakdown` splits a crossing here.
        crate::trace::stamp("message_written");
        queued
    }

    fn send_eager(
        &self,
        peer: NodeId,
        header: &EagerHeader,
        source: LocalRegion,
    ) -> Result<(), FabricError> {
        let payload = self.inner.view(source)?;
        // Eager payloads are small by construction (below the threshold): one copy into the
        // frame is cheaper than a second write.
        let mut message = Vec::with_capacity(payload.as_slice().len() + 64);
        wire::encode_eager(header, payload.as_slice(), &mut message);
        drop(payload);
        self.send(peer, message)
    }

    fn post_read(
        &self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
    ) -> Result<(), EventsFull> {
        // One connection per peer: every lane is the same stream.
        let _ = lane;
        // The place its completion will take, whatever happens from here: the driver calls
        // this, so it cannot wait for room in the channel it drains.
        let completion = self.inner.events.reserve_now()?;
        let failed = |completion: EventPlace, error| {
            completion.send(FabricEvent::ReadCompleted {
                op,
                result: Err(error),
            });
            Ok(())
        };
        if local.len != remote.len || local.len > MAX_READ_BYTES {
            return failed(
                completion,
                ReadError::QueuePair(format!("bad READ: local {local} for remote {remote}")),
            );
        }
        let destination = match self.inner.destination(local) {
            Ok(destination) => destination,
            Err(error) => {
                return failed(
                    completion,
                    ReadError::QueuePair(format!("READ into {local}: {error}")),
                );
            }
        };
        let mut frame = Vec::with_capacity(29);
        frame.push(KIND_READ_REQUEST);
        frame.extend_from_slice(&op.0.to_le_bytes());
        frame.extend_from_slice(&remote.addr.to_le_bytes());
        frame.extend_from_slice(&remote.len.to_le_bytes());
        frame.extend_from_slice(&remote.rkey.to_le_bytes());
        // Register under the peers lock, so a connection torn down concurrently either sees
        // this read and fails it, or this call sees the peer gone.
        let peers = lock(&self.inner.peers);
        match peers.get(&peer) {
            Some(PeerSlot::Connected { link, .. }) => {
                let pending = PendingRead {
                    peer,
                    destination,
                    completion,
                };
                lock(&self.inner.pending_reads).insert(op.0, pending);
                if let Err(error) = link.submit(Outgoing::Frame(frame)) {
                    let link = link.clone();
                    drop(peers);
                    // Failed here unless the connection's reader task, ending, failed it
                    // already with the others.
                    let pending = lock(&self.inner.pending_reads).remove(&op.0);
                    if let Some(read) = pending {
                        read.fail(op, ReadError::ConnectionLost);
                    }
                    if let SubmitError::Full { .. } = error {
                        link.fail(error.into_link_error(peer, &self.inner.config));
                    }
                }
                Ok(())
            }
            _ => {
                drop((peers, destination));
                failed(completion, ReadError::ConnectionLost)
            }
        }
    }

    fn grant_read(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
    ) -> Result<Option<ReadGrant>, FabricError> {
        let view = GrantView::Whole(Arc::new(self.inner.view(region)?));
        let key = sync::lock(&self.inner.grants).grant(peer, req, region, view);
        Ok(Some(ReadGrant { keys: vec![key] }))
    }

    fn revoke_read(&self, peer: NodeId, req: TransferId) -> bool {
        sync::lock(&self.inner.grants).revoke(peer, req)
    }

    fn grant_partial_read(
        &self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
    ) -> Result<Option<ReadGrant>, FabricError> {
        let arena = self
            .inner
            .arenas
            .get(&region.arena)
            .ok_or(FabricError::BadRegion(region))?;
        let inside = region
            .offset
            .checked_add(region.len)
            .is_some_and(|end| end <= arena.size_bytes());
        if !inside {
            return Err(FabricError::BadRegion(region));
        }
        let view = GrantView::Partial(PartialCopy::new(arena.clone(), region));
        let key = sync::lock(&self.inner.grants).grant(peer, req, region, view);
        Ok(Some(ReadGrant { keys: vec![key] }))
    }

    fn extend_partial_read(&self, peer: NodeId, req: TransferId, prefix: u64) {
        sync::lock(&self.inner.grants).received(peer, req, prefix);
    }

    fn serves_partial_copies(&self) -> bool {
        true
    }
}

/// A view of `region` refused: outside the arena, or in use.
fn view_error(region: LocalRegion, source: ViewError) -> FabricError {
    match source {
        ViewError::OutOfArena(_) => FabricError::BadRegion(region),
        source @ ViewError::InUse { .. } => FabricError::InUse { region, source },
    }
}

impl Inner {
    /// Queues `event`, waiting for room in the driver's channel: for a connection's reader
    /// (which meanwhile reads nothing more, so its peer is slowed by TCP flow control). A
    /// dial or accept waits for the place of its outcome the same way, before it installs
    /// the connection. The driver's own calls never wait: what answers them later takes its
    /// place when they are made (see `post_read`), and a connection they drop is reported by
    /// its reader task (see `Link::fail`).
    async fn emit(&self, event: FabricEvent) {
        // The driver may be gone (shutting down); nothing to do then.
        let _ = self.events.send(event).await;
    }

    /// Sends or queues `item` to `peer`; a peer whose queue is full is not reading what it is
    /// sent, and is disconnected.
    fn queue(&self, peer: NodeId, item: Outgoing) -> Result<(), FabricError> {
        let link = match lock(&self.peers).get(&peer) {
            Some(PeerSlot::Connected { link, .. }) => link.clone(),
            _ => return Err(FabricError::NotConnected(peer)),
        };
        match link.submit(item) {
            Ok(()) => Ok(()),
            Err(SubmitError::WriterStopped) => Err(FabricError::NotConnected(peer)),
            Err(full @ SubmitError::Full { bytes, .. }) => {
                link.fail(full.into_link_error(peer, &self.config));
                Err(FabricError::PeerNotReading {
                    peer,
                    queued: bytes,
                    limit: self.config.max_queued_bytes,
                    unit: "bytes",
                })
            }
        }
    }

    /// A readable view of a local region (an eager send's source, a region granted for READs).
    fn view(&self, region: LocalRegion) -> Result<ReadableRegion, FabricError> {
        let arena = self
            .arenas
            .get(&region.arena)
            .ok_or(FabricError::BadRegion(region))?;
        ReadableRegion::new(arena.clone(), region.offset, region.len)
            .map_err(|source| view_error(region, source))
    }

    /// A writable view of a local region (a READ's destination).
    fn destination(&self, region: LocalRegion) -> Result<WritableRegion, FabricError> {
        let arena = self
            .arenas
            .get(&region.arena)
            .ok_or(FabricError::BadRegion(region))?;
        WritableRegion::new(arena.clone(), region.offset, region.len)
            .map_err(|source| view_error(region, source))
    }

    /// Folds a new connection's round trips into the peer's estimates and returns the costs
    /// its threshold is chosen with, and a line for the log. The round trip is the quietest
    /// batch of pings after a pause (a lone fetch's messages find the other end idle, and pay
    /// its wake-up when it runs on another CPU), the back-to-back one when no paused batch
    /// came through.
    fn path_costs(
        &self,
        peer: NodeId,
        stream: &tokio::net::TcpStream,
        measured: handshake::MeasuredRoundTrips,
    ) -> (PathCosts, String) {
        let ends = match (stream.local_addr(), stream.peer_addr()) {
            (Ok(local), Ok(remote)) => (local.ip(), remote.ip()),
            _ => (
                std::net::Ipv4Addr::UNSPECIFIED.into(),
                std::net::Ipv4Addr::UNSPECIFIED.into(),
            ),
        };
        let mut all = lock(&self.round_trips);
        let estimates = all.entry(peer).or_default();
        for batch in measured.awake {
            estimates.awake.observe(ends, batch);
        }
        for batch in measured.idle {
            estimates.idle.observe(ends, batch);
        }
        let costs = estimates
            .idle
            .costs(estimates.awake.costs(self.config.costs));
        let show = |estimate: &RoundTripEstimate<LinkEnds>| match estimate.best() {
            Some(best) => format!(
                "{:.1?} (±{:.1?}, best of {})",
                Duration::from_nanos(best.median_ns as u64),
                Duration::from_nanos((best.spread_ns / 2.0) as u64),
                estimate.batches()
            ),
            None => "not measured".to_string(),
        };
        let summary = format!(
            "tcp, 1 lane, round trip {} awake, {} after a pause",
            show(&estimates.awake),
            show(&estimates.idle)
        );
        (costs, summary)
    }

    fn forget_connecting(&self, peer: NodeId) {
        let mut peers = lock(&self.peers);
        if matches!(peers.get(&peer), Some(PeerSlot::Connecting)) {
            peers.remove(&peer);
        }
    }

    /// Installs a connected peer; `false` if one is already connected (the new one is dropped).
    fn install(&self, peer: NodeId, link: Arc<Link>) -> Option<u64> {
        let generation = {
            let mut next = lock(&self.next_generation);
            *next += 1;
            *next
        };
        let mut peers = lock(&self.peers);
        if let Some(PeerSlot::Connected { .. }) = peers.get(&peer) {
            return None;
        }
        peers.insert(peer, PeerSlot::Connected { link, generation });
        Some(generation)
    }

    /// Tears a connection down: fails its pending READs, then reports the peer lost (waiting
    /// for room, behind the connection's last message). Called by the connection's reader
    /// task as it ends, so nothing from the peer follows the `PeerLost`.
    async fn lose(&self, peer: NodeId, generation: Option<u64>, reason: TcpLinkError) {
        {
            let mut peers = lock(&self.peers);
            match (peers.get(&peer), generation) {
                (
                    Some(PeerSlot::Connected {
                        generation: current,
                        ..
                    }),
                    Some(g),
                ) if *current != g => return,
                (None, _) => return,
                _ => {}
            }
            if let Some(PeerSlot::Connected { link, .. }) = peers.remove(&peer) {
                // Ends both tasks of the connection, also a writer waiting on a peer that does
                // not read.
                link.close();
            }
        }
        let failed: Vec<(u64, PendingRead)> = {
            let mut pending = lock(&self.pending_reads);
            let ops: Vec<u64> = pending
                .iter()
                .filter(|(_, r)| r.peer == peer)
                .map(|(&op, _)| op)
                .collect();
            ops.into_iter()
                .filter_map(|op| pending.remove(&op).map(|read| (op, read)))
                .collect()
        };
        for (op, read) in failed {
            read.fail(ReadOpId(op), ReadError::ConnectionLost);
        }
        self.emit(FabricEvent::PeerLost {
            peer,
            reason: reason.to_string(),
        })
        .await;
    }
}
