//! The TCP fabric: the fallback wherever no RDMA device exists (Ethernet, IPoIB).
//!
//! One TCP connection per peer carries both two-sided messages and emulated one-sided READs.
//! A READ is a request that the holder's *fabric* serves straight from its exposed arena memory,
//! without the holder's core, so the protocol behaves exactly as over verbs: the requester's
//! core learns nothing until the bytes are in place. Data moves without intermediate copies:
//! the holder writes from its shared arena mapping into the socket, and the requester reads from
//! the socket straight into the destination object.
//!
//! Frames (little endian): `kind: u8` then
//! - `MESSAGE`: `len: u32`, the encoded peer message;
//! - `READ_REQUEST`: `op: u64, addr: u64, len: u64, rkey: u32` (addr = offset in the arena the
//!   rkey names);
//! - `READ_RESPONSE`: `op: u64, status: u8, len: u64`, then `len` bytes when status is OK;
//! - `PING`/`PONG`: `nonce: u64` (cost measurement at connect time).
//!
//! Connections start with an authenticated handshake (postcard, versioned): the dialing node
//! names itself and presents the cluster token; a peer with another token or version is refused
//! with a reason both sides log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skyriver_core::node::{ArenaKey, PathCosts, PeerParams, ReadError, ReadOpId};
use skyriver_core::wire::{self, EagerHeader};
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Arenas, Fabric, FabricError, FabricEvent, FabricIdentity};

const HANDSHAKE_MAGIC: [u8; 8] = *b"SKYRTCP1";
const HANDSHAKE_VERSION: u32 = 1;
const MAX_HANDSHAKE_BYTES: usize = 4096;

const KIND_MESSAGE: u8 = 1;
const KIND_READ_REQUEST: u8 = 2;
const KIND_READ_RESPONSE: u8 = 3;
const KIND_PING: u8 = 4;
const KIND_PONG: u8 = 5;

const STATUS_OK: u8 = 0;
const STATUS_REMOTE_ACCESS: u8 = 1;

/// Ping-pongs at connect time to measure the round trip.
const PING_ROUNDS: usize = 8;
/// Largest READ one request may ask for (the core slices larger ones).
const MAX_READ_BYTES: u64 = 1 << 30;
const SOCKET_BUFFER_BYTES: usize = 256 * 1024;
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

#[derive(Debug, Serialize, Deserialize)]
enum Handshake {
    Hello {
        magic: [u8; 8],
        version: u32,
        node: NodeId,
        token: String,
    },
    Welcome {
        node: NodeId,
    },
    Refused {
        reason: String,
    },
}

/// What the connection's writer task sends.
enum Outgoing {
    /// A ready frame.
    Frame(Vec<u8>),
    /// A READ response whose data is written straight from the arena.
    ReadData {
        op: u64,
        arena: ArenaId,
        offset: u64,
        len: u64,
    },
}

enum PeerSlot {
    Connecting,
    Connected { link: Arc<Link>, generation: u64 },
}

/// The sending side of one connection.
///
/// While the writer task has nothing queued, a frame is written straight from the caller's
/// thread with one non-blocking `send` on a second handle of the socket: no hand-off to the
/// writer task and no cross-thread wake-up on the latency path. Whatever does not fit at once
/// (and every frame while the writer task is busy) queues behind, in order.
struct Link {
    /// A second handle (dup) of the connection's socket, non-blocking like the first.
    socket: std::net::TcpStream,
    /// Whether the writer task may have frames queued or buffered; set by every enqueue and
    /// cleared by the writer task, under this lock, once its queue is empty and flushed.
    writer_busy: Mutex<bool>,
    outgoing: mpsc::UnboundedSender<Outgoing>,
}

impl Link {
    /// Writes `item` now if the writer task is idle and it fits, otherwise queues it (or what
    /// is left of it). Errs when the writer task has stopped.
    fn submit(&self, item: Outgoing) -> Result<(), ()> {
        let mut busy = lock(&self.writer_busy);
        let item = match item {
            Outgoing::Frame(frame) if !*busy => match write_now(&self.socket, &frame) {
                n if n == frame.len() => return Ok(()),
                0 => Outgoing::Frame(frame),
                n => Outgoing::Frame(frame[n..].to_vec()),
            },
            item => item,
        };
        *busy = true;
        self.outgoing.send(item).map_err(|_| ())
    }
}

/// Writes as much of `bytes` as the socket takes without blocking. Errors other than a full
/// socket are left for the writer task to meet and report.
fn write_now(socket: &std::net::TcpStream, bytes: &[u8]) -> usize {
    use std::io::Write;
    let mut written = 0;
    let mut socket = socket;
    while written < bytes.len() {
        match socket.write(&bytes[written..]) {
            Ok(0) => break,
            Ok(n) => written += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    written
}

struct PendingRead {
    peer: NodeId,
    local: LocalRegion,
}

struct Inner {
    identity: FabricIdentity,
    config: TcpFabricConfig,
    arenas: Arenas,
    keys: BTreeMap<ArenaId, ArenaKey>,
    arena_by_rkey: BTreeMap<u32, ArenaId>,
    listen_addr: SocketAddr,
    peers: Mutex<BTreeMap<NodeId, PeerSlot>>,
    /// Exposed ranges: (arena, offset) → (len, times exposed).
    exposed: Mutex<BTreeMap<(ArenaId, u64), (u64, u32)>>,
    pending_reads: Mutex<BTreeMap<u64, PendingRead>>,
    events: mpsc::UnboundedSender<FabricEvent>,
    next_generation: Mutex<u64>,
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
        events: mpsc::UnboundedSender<FabricEvent>,
    ) -> Result<Self, FabricError> {
        let runtime = match config.worker_threads {
            0 => None,
            threads => Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .thread_name("skyriver-tcp-fabric")
                    .enable_all()
                    .build()
                    .map_err(|e| {
                        FabricError::Setup(format!("cannot start the TCP fabric runtime: {e}"))
                    })?,
            ),
        };
        let handle = match &runtime {
            Some(runtime) => runtime.handle().clone(),
            None => tokio::runtime::Handle::try_current().map_err(|e| {
                FabricError::Setup(format!(
                    "the TCP fabric without worker threads must start inside a runtime: {e}"
                ))
            })?,
        };
        // Bound with std so this works from inside another runtime (no block_on).
        let listener = std::net::TcpListener::bind(config.listen)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .and_then(|listener| {
                let _context = handle.enter();
                TcpListener::from_std(listener)
            })
            .map_err(|e| FabricError::Setup(format!("cannot listen on {}: {e}", config.listen)))?;
        let listen_addr = listener
            .local_addr()
            .map_err(|e| FabricError::Setup(format!("listener address: {e}")))?;
        // An rkey names an arena for this run of the daemon; a stale rkey from an earlier run
        // fails instead of reading whatever lives there now.
        let salt = (std::process::id() as u64 ^ now_nanos()) as u32;
        let mut keys = BTreeMap::new();
        let mut arena_by_rkey = BTreeMap::new();
        for &arena in arenas.keys() {
            let rkey = salt.wrapping_add(arena.0.wrapping_mul(0x9e37_79b9));
            keys.insert(arena, ArenaKey { base_addr: 0, rkey });
            arena_by_rkey.insert(rkey, arena);
        }
        let inner = Arc::new(Inner {
            identity,
            config,
            arenas,
            keys,
            arena_by_rkey,
            listen_addr,
            peers: Mutex::new(BTreeMap::new()),
            exposed: Mutex::new(BTreeMap::new()),
            pending_reads: Mutex::new(BTreeMap::new()),
            events,
            next_generation: Mutex::new(0),
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

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
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
        self.inner.queue(peer, Outgoing::Frame(frame))
    }

    fn send_eager(
        &self,
        peer: NodeId,
        header: &EagerHeader,
        source: LocalRegion,
    ) -> Result<(), FabricError> {
        let arena = self
            .inner
            .arenas
            .get(&source.arena)
            .ok_or(FabricError::BadRegion(source))?;
        let payload = arena
            .bytes(source.offset, source.len)
            .map_err(|_| FabricError::BadRegion(source))?;
        // Eager payloads are small by construction (below the threshold): one copy into the
        // frame is cheaper than a second write.
        let mut message = Vec::with_capacity(payload.len() + 64);
        wire::encode_eager(header, payload, &mut message);
        self.send(peer, message)
    }

    fn post_read(
        &self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
    ) {
        let _ = lane; // One connection per peer: every lane is the same stream.
        let failed = |error| {
            let _ = self.inner.events.send(FabricEvent::ReadCompleted {
                op,
                result: Err(error),
            });
        };
        if local.len != remote.len || local.len > MAX_READ_BYTES || !self.inner.local_ok(local) {
            failed(ReadError::QueuePair(format!(
                "bad READ: local {local} for remote {remote}"
            )));
            return;
        }
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
                lock(&self.inner.pending_reads).insert(op.0, PendingRead { peer, local });
                if link.submit(Outgoing::Frame(frame)).is_err() {
                    lock(&self.inner.pending_reads).remove(&op.0);
                    drop(peers);
                    failed(ReadError::ConnectionLost);
                }
            }
            _ => {
                drop(peers);
                failed(ReadError::ConnectionLost);
            }
        }
    }

    fn expose(&self, region: LocalRegion) {
        let mut exposed = lock(&self.inner.exposed);
        let entry = exposed
            .entry((region.arena, region.offset))
            .or_insert((region.len, 0));
        entry.0 = entry.0.max(region.len);
        entry.1 += 1;
    }

    fn unexpose(&self, region: LocalRegion) {
        let mut exposed = lock(&self.inner.exposed);
        if let Some(entry) = exposed.get_mut(&(region.arena, region.offset)) {
            entry.1 -= 1;
            if entry.1 == 0 {
                exposed.remove(&(region.arena, region.offset));
            }
        }
    }
}

impl Inner {
    fn queue(&self, peer: NodeId, item: Outgoing) -> Result<(), FabricError> {
        let link = match lock(&self.peers).get(&peer) {
            Some(PeerSlot::Connected { link, .. }) => link.clone(),
            _ => return Err(FabricError::NotConnected(peer)),
        };
        link.submit(item)
            .map_err(|()| FabricError::NotConnected(peer))
    }

    fn local_ok(&self, region: LocalRegion) -> bool {
        self.arenas.get(&region.arena).is_some_and(|arena| {
            region
                .offset
                .checked_add(region.len)
                .is_some_and(|end| end <= arena.size_bytes())
        })
    }

    /// Whether `[offset, offset + len)` of `arena` lies inside one exposed region.
    fn is_exposed(&self, arena: ArenaId, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        let exposed = lock(&self.exposed);
        exposed
            .range((arena, 0)..=(arena, offset))
            .next_back()
            .is_some_and(|(&(_, start), &(exposed_len, _))| end <= start + exposed_len)
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

    /// Tears a connection down: fails its pending READs, then reports the peer lost.
    fn lose(&self, peer: NodeId, generation: Option<u64>, reason: String) {
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
            peers.remove(&peer);
        }
        let failed: Vec<u64> = {
            let mut pending = lock(&self.pending_reads);
            let ops: Vec<u64> = pending
                .iter()
                .filter(|(_, r)| r.peer == peer)
                .map(|(&op, _)| op)
                .collect();
            for op in &ops {
                pending.remove(op);
            }
            ops
        };
        for op in failed {
            let _ = self.events.send(FabricEvent::ReadCompleted {
                op: ReadOpId(op),
                result: Err(ReadError::ConnectionLost),
            });
        }
        let _ = self.events.send(FabricEvent::PeerLost { peer, reason });
    }
}

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let inner = inner.clone();
                tokio::spawn(async move {
                    let timeout = inner.config.connect_timeout;
                    match tokio::time::timeout(timeout, accept_handshake(&inner, stream)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(reason)) => warn!(%from, %reason, "refused a peer connection"),
                        Err(_) => warn!(%from, "peer handshake timed out"),
                    }
                });
            }
            Err(error) => {
                warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn write_handshake(stream: &mut TcpStream, message: &Handshake) -> std::io::Result<()> {
    let body = postcard::to_stdvec(message).map_err(std::io::Error::other)?;
    stream.write_all(&(body.len() as u32).to_le_bytes()).await?;
    stream.write_all(&body).await
}

async fn read_handshake(stream: &mut TcpStream) -> Result<Handshake, String> {
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .await
        .map_err(|e| format!("handshake read: {e}"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HANDSHAKE_BYTES {
        return Err(format!(
            "handshake of {len} bytes is over the limit (not a skyriver peer?)"
        ));
    }
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|e| format!("handshake read: {e}"))?;
    postcard::from_bytes(&body)
        .map_err(|e| format!("malformed handshake (not a skyriver peer?): {e}"))
}

async fn accept_handshake(inner: &Arc<Inner>, mut stream: TcpStream) -> Result<(), String> {
    let (peer, refusal) = match read_handshake(&mut stream).await? {
        Handshake::Hello {
            magic,
            version,
            node,
            token,
        } => {
            let refusal = if magic != HANDSHAKE_MAGIC {
                Some("not a skyriver TCP fabric peer".to_string())
            } else if version != HANDSHAKE_VERSION {
                Some(format!(
                    "fabric protocol version {version} is not supported (this node speaks {HANDSHAKE_VERSION})"
                ))
            } else if !crate::token::tokens_match(&token, &inner.identity.cluster_token) {
                Some(format!("{node} presented a wrong cluster token"))
            } else if node == inner.identity.node {
                Some(format!("{node} is this node's own id"))
            } else {
                None
            };
            (node, refusal)
        }
        other => return Err(format!("expected Hello, got {other:?}")),
    };
    if let Some(reason) = refusal {
        let _ = write_handshake(
            &mut stream,
            &Handshake::Refused {
                reason: reason.clone(),
            },
        )
        .await;
        return Err(reason);
    }
    write_handshake(
        &mut stream,
        &Handshake::Welcome {
            node: inner.identity.node,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let round_trip = measure_round_trip(&mut stream, false)
        .await
        .map_err(|e| e.to_string())?;
    start_connection(inner.clone(), peer, stream, round_trip);
    Ok(())
}

async fn dial(inner: Arc<Inner>, peer: NodeId, addr: SocketAddr) {
    let attempt = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        write_handshake(
            &mut stream,
            &Handshake::Hello {
                magic: HANDSHAKE_MAGIC,
                version: HANDSHAKE_VERSION,
                node: inner.identity.node,
                token: inner.identity.cluster_token.clone(),
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        match read_handshake(&mut stream).await? {
            Handshake::Welcome { node } if node == peer => {}
            Handshake::Welcome { node } => {
                return Err(format!("{addr} is {node}, not {peer}"));
            }
            Handshake::Refused { reason } => return Err(format!("refused by {peer}: {reason}")),
            other => return Err(format!("unexpected handshake reply {other:?}")),
        }
        let round_trip = measure_round_trip(&mut stream, true)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((stream, round_trip))
    };
    match tokio::time::timeout(inner.config.connect_timeout, attempt).await {
        Ok(Ok((stream, round_trip))) => {
            // Drop the Connecting placeholder; `start_connection` installs the real one.
            inner.forget_connecting(peer);
            start_connection(inner, peer, stream, round_trip);
        }
        Ok(Err(reason)) => {
            warn!(%peer, %reason, "cannot connect to peer");
            inner.forget_connecting(peer);
            let _ = inner.events.send(FabricEvent::PeerLost { peer, reason });
        }
        Err(_) => {
            inner.forget_connecting(peer);
            let reason = format!("connection to {addr} timed out");
            warn!(%peer, %reason, "cannot connect to peer");
            let _ = inner.events.send(FabricEvent::PeerLost { peer, reason });
        }
    }
}

/// Ping-pongs in both directions; returns this side's median round trip.
async fn measure_round_trip(stream: &mut TcpStream, dialer: bool) -> std::io::Result<Duration> {
    stream.set_nodelay(true)?;
    let mut samples = Vec::with_capacity(PING_ROUNDS);
    let mut frame = [0u8; 9];
    for turn in [dialer, !dialer] {
        for round in 0..PING_ROUNDS as u64 {
            if turn {
                frame[0] = KIND_PING;
                frame[1..].copy_from_slice(&round.to_le_bytes());
                let started = Instant::now();
                stream.write_all(&frame).await?;
                stream.read_exact(&mut frame).await?;
                samples.push(started.elapsed());
                if frame[0] != KIND_PONG {
                    return Err(std::io::Error::other("expected PONG"));
                }
            } else {
                stream.read_exact(&mut frame).await?;
                if frame[0] != KIND_PING {
                    return Err(std::io::Error::other("expected PING"));
                }
                frame[0] = KIND_PONG;
                stream.write_all(&frame).await?;
            }
        }
    }
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}

fn start_connection(inner: Arc<Inner>, peer: NodeId, stream: TcpStream, round_trip: Duration) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(&stream);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES * 16);
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES * 16);
    // Best effort: without these a dead peer is only noticed by the transfer deadlines.
    let timeout = inner.config.dead_peer_timeout;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time((timeout / 2).max(Duration::from_secs(1)))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    let _ = socket.set_tcp_keepalive(&keepalive);
    let _ = socket.set_tcp_user_timeout(Some(timeout));
    // A second handle on the socket for direct writes (see `Link`).
    let handles = stream.into_std().and_then(|std_stream| {
        let direct = std_stream.try_clone()?;
        Ok((TcpStream::from_std(std_stream)?, direct))
    });
    let (stream, direct) = match handles {
        Ok(handles) => handles,
        Err(error) => {
            warn!(%peer, %error, "cannot set up the connection's socket");
            return;
        }
    };
    let (outgoing_tx, outgoing_rx) = mpsc::unbounded_channel();
    let link = Arc::new(Link {
        socket: direct,
        writer_busy: Mutex::new(false),
        outgoing: outgoing_tx,
    });
    let Some(generation) = inner.install(peer, link.clone()) else {
        debug!(%peer, "dropping a duplicate connection");
        return;
    };
    let (reader, writer) = stream.into_split();
    let costs = PathCosts {
        round_trip_ns: round_trip.as_nanos() as f64,
        ..inner.config.costs
    };
    let summary = format!("tcp, 1 lane, round trip {round_trip:.1?}");
    let _ = inner.events.send(FabricEvent::PeerConnected {
        peer,
        params: PeerParams { lanes: 1, costs },
        summary,
    });
    let writer_inner = inner.clone();
    let writer_link = link.clone();
    tokio::spawn(async move {
        if let Err(error) = write_loop(&writer_inner, &writer_link, writer, outgoing_rx).await {
            writer_inner.lose(
                peer,
                Some(generation),
                format!("write to {peer} failed: {error}"),
            );
        }
    });
    tokio::spawn(async move {
        let reason = match read_loop(&inner, peer, reader, &link).await {
            Ok(()) => format!("{peer} closed the connection"),
            Err(error) => error,
        };
        inner.lose(peer, Some(generation), reason);
    });
}

async fn write_loop(
    inner: &Inner,
    link: &Link,
    writer: OwnedWriteHalf,
    mut outgoing: mpsc::UnboundedReceiver<Outgoing>,
) -> std::io::Result<()> {
    let mut writer = BufWriter::with_capacity(SOCKET_BUFFER_BYTES, writer);
    let mut next = None;
    loop {
        let item = match next.take() {
            Some(item) => item,
            None => match outgoing.recv().await {
                Some(item) => item,
                None => return Ok(()),
            },
        };
        write_item(inner, &mut writer, item).await?;
        while let Ok(item) = outgoing.try_recv() {
            write_item(inner, &mut writer, item).await?;
        }
        writer.flush().await?;
        // Idle once the queue is empty under the lock that enqueuers take: from then on
        // callers write directly, and nothing of ours is left to overtake.
        let mut busy = lock(&link.writer_busy);
        match outgoing.try_recv() {
            Ok(item) => next = Some(item),
            Err(_) => *busy = false,
        }
    }
}

async fn write_item(
    inner: &Inner,
    writer: &mut BufWriter<OwnedWriteHalf>,
    item: Outgoing,
) -> std::io::Result<()> {
    match item {
        Outgoing::Frame(frame) => writer.write_all(&frame).await,
        Outgoing::ReadData {
            op,
            arena,
            offset,
            len,
        } => {
            let data = inner
                .arenas
                .get(&arena)
                .and_then(|a| a.bytes(offset, len).ok());
            let mut header = [0u8; 18];
            header[0] = KIND_READ_RESPONSE;
            header[1..9].copy_from_slice(&op.to_le_bytes());
            match data {
                Some(data) => {
                    header[9] = STATUS_OK;
                    header[10..18].copy_from_slice(&len.to_le_bytes());
                    writer.write_all(&header).await?;
                    // Straight from the shared arena into the socket: large writes bypass the
                    // BufWriter's buffer.
                    writer.write_all(data).await
                }
                None => {
                    header[9] = STATUS_REMOTE_ACCESS;
                    writer.write_all(&header).await
                }
            }
        }
    }
}

async fn read_loop(
    inner: &Inner,
    peer: NodeId,
    reader: OwnedReadHalf,
    link: &Link,
) -> Result<(), String> {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let io = |e: std::io::Error| format!("read from {peer} failed: {e}");
    loop {
        let kind = match reader.read_u8().await {
            Ok(kind) => kind,
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(io(error)),
        };
        match kind {
            KIND_MESSAGE => {
                let len = reader.read_u32_le().await.map_err(io)? as usize;
                if len > wire::MAX_MESSAGE_BYTES {
                    return Err(format!(
                        "{peer} sent a {len}-byte message (limit {})",
                        wire::MAX_MESSAGE_BYTES
                    ));
                }
                let mut bytes = vec![0u8; len];
                reader.read_exact(&mut bytes).await.map_err(io)?;
                let _ = inner.events.send(FabricEvent::Message { peer, bytes });
            }
            KIND_READ_REQUEST => {
                let op = reader.read_u64_le().await.map_err(io)?;
                let addr = reader.read_u64_le().await.map_err(io)?;
                let len = reader.read_u64_le().await.map_err(io)?;
                let rkey = reader.read_u32_le().await.map_err(io)?;
                let arena = inner.arena_by_rkey.get(&rkey).copied();
                let item = match arena {
                    Some(arena) if len <= MAX_READ_BYTES && inner.is_exposed(arena, addr, len) => {
                        Outgoing::ReadData {
                            op,
                            arena,
                            offset: addr,
                            len,
                        }
                    }
                    _ => {
                        debug!(%peer, op, addr, len, rkey, "refused a READ of memory that is not exposed");
                        let mut header = vec![0u8; 18];
                        header[0] = KIND_READ_RESPONSE;
                        header[1..9].copy_from_slice(&op.to_le_bytes());
                        header[9] = STATUS_REMOTE_ACCESS;
                        Outgoing::Frame(header)
                    }
                };
                if link.submit(item).is_err() {
                    return Err("connection writer stopped".into());
                }
            }
            KIND_READ_RESPONSE => {
                let op = reader.read_u64_le().await.map_err(io)?;
                let status = reader.read_u8().await.map_err(io)?;
                let len = reader.read_u64_le().await.map_err(io)?;
                let pending = lock(&inner.pending_reads).remove(&op);
                let Some(pending) = pending else {
                    return Err(format!("{peer} answered READ {op} that was not asked for"));
                };
                // The READ is ours from here: every way out completes it, so a connection lost
                // mid-data fails the transfer at once instead of leaving it to its deadline.
                let fail = |reason: String| {
                    let _ = inner.events.send(FabricEvent::ReadCompleted {
                        op: ReadOpId(op),
                        result: Err(ReadError::ConnectionLost),
                    });
                    reason
                };
                let result = if status == STATUS_OK {
                    if len != pending.local.len {
                        return Err(fail(format!(
                            "{peer} answered READ {op} with {len} bytes, {} asked",
                            pending.local.len
                        )));
                    }
                    let arena = inner
                        .arenas
                        .get(&pending.local.arena)
                        .ok_or_else(|| fail(format!("READ {op} into an unknown arena")))?;
                    // SAFETY: `post_read` checked the region lies in this arena; the core gave it
                    // to this one READ (a slice of an object being fetched, created and not yet
                    // sealed), and nothing else touches it until the completion is delivered.
                    let destination =
                        unsafe { arena.bytes_mut(pending.local.offset, pending.local.len) }
                            .map_err(|e| fail(e.to_string()))?;
                    reader
                        .read_exact(destination)
                        .await
                        .map_err(|e| fail(io(e)))?;
                    Ok(())
                } else {
                    Err(ReadError::RemoteAccess)
                };
                let _ = inner.events.send(FabricEvent::ReadCompleted {
                    op: ReadOpId(op),
                    result,
                });
            }
            KIND_PING => {
                let nonce = reader.read_u64_le().await.map_err(io)?;
                let mut frame = vec![KIND_PONG];
                frame.extend_from_slice(&nonce.to_le_bytes());
                let _ = link.submit(Outgoing::Frame(frame));
            }
            KIND_PONG => {
                reader.read_u64_le().await.map_err(io)?;
            }
            other => {
                return Err(format!(
                    "{peer} sent an unknown frame kind {other}: dropping the connection"
                ))
            }
        }
    }
}
