//! One live TCP fabric connection: the sending side ([`Link`]: direct writes, then a writer
//! task), the writer task that serves READ data from the arena, and the reader task that
//! delivers messages and READ data.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skyriver_core::node::{PeerParams, ReadError, ReadOpId};
use skyriver_core::wire;
use skyriver_core::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, warn};

use super::errors::TcpLinkError;
use super::grants::Serving;
use super::handshake::MeasuredRoundTrips;
use super::TcpFabricConfig;
use super::{
    lock, GrantView, Inner, KIND_MESSAGE, KIND_PING, KIND_PONG, KIND_READ_REQUEST,
    KIND_READ_RESPONSE, MAX_READ_BYTES, READ_BUFFER_BYTES, SOCKET_BUFFER_BYTES,
    SOCKET_BUFFER_SIZE_BYTES, STATUS_OK, STATUS_REMOTE_ACCESS, UNSENT_BYTES_LIMIT,
};
use crate::fabric::{EventPlace, FabricEvent, MessageBytes};

/// What the connection's writer task sends.
pub(super) enum Outgoing {
    /// A ready frame.
    Frame(Vec<u8>),
    /// A READ response whose data is written straight from the arena, admitted under a
    /// lease's grant (held until written or dropped, so a revocation waits for it, and with
    /// it the grant's readable view of the region).
    ReadData {
        op: u64,
        offset: u64,
        len: u64,
        serving: Serving<GrantView>,
    },
}

impl Outgoing {
    /// Bytes the item holds in memory while queued (READ data stays in the arena).
    fn queued_bytes(&self) -> usize {
        match self {
            Outgoing::Frame(frame) => frame.len(),
            Outgoing::ReadData { .. } => READ_RESPONSE_HEADER_BYTES,
        }
    }
}

const READ_RESPONSE_HEADER_BYTES: usize = 18;

/// What waits for the writer task, under one lock.
#[derive(Default)]
struct Queued {
    /// Whether the writer task may have frames queued or buffered; set by every enqueue and
    /// cleared by the writer task once its queue is empty and flushed.
    busy: bool,
    /// Bytes of the items queued and not yet written.
    bytes: usize,
    /// Items queued and not yet written.
    frames: usize,
}

/// Why [`Link::submit`] refused an item.
#[derive(Debug)]
pub(super) enum SubmitError {
    /// The writer task has stopped (the connection is going down).
    WriterStopped,
    /// The queue is full: the peer does not read what is sent to it.
    Full {
        /// Bytes queued.
        bytes: usize,
        /// Items queued.
        frames: usize,
    },
}

/// The sending side of one connection.
///
/// While the writer task has nothing queued, a frame is written straight from the caller's
/// thread with one non-blocking `send` on a second handle of the socket: no hand-off to the
/// writer task and no cross-thread wake-up on the latency path. Whatever does not fit at once
/// (and every frame while the writer task is busy) queues behind, up to `max_queued_bytes` and
/// `max_queued_frames`; beyond that the peer is not reading, and the caller drops the
/// connection. Queued frames keep their order among themselves, and so does READ data, but a
/// frame overtakes READ data queued before it (see [`write_loop`]).
pub(super) struct Link {
    /// A second handle (dup) of the connection's socket, non-blocking like the first.
    socket: std::net::TcpStream,
    queued: Mutex<Queued>,
    /// Bounded by `max_queued_frames`.
    outgoing: mpsc::Sender<Outgoing>,
    max_queued_bytes: usize,
    /// Counted in `queued.frames`: the writer task takes items off `outgoing` before it
    /// writes them, so the channel's own bound alone would not hold.
    max_queued_frames: usize,
    /// Why the connection is being dropped, when something other than its reader decided it
    /// (its writer, or the driver's call that found the peer not reading): the reader task
    /// reports it as it ends.
    failure: Mutex<Option<TcpLinkError>>,
}

impl Link {
    /// Writes `item` now if the writer task is idle and it fits, otherwise queues it (or what
    /// is left of it).
    pub(super) fn submit(&self, item: Outgoing) -> Result<(), SubmitError> {
        let mut queued = lock(&self.queued);
        let item = match item {
            Outgoing::Frame(frame) if !queued.busy => match write_now(&self.socket, &frame) {
                n if n == frame.len() => return Ok(()),
                0 => Outgoing::Frame(frame),
                n => Outgoing::Frame(frame[n..].to_vec()),
            },
            item => item,
        };
        let bytes = item.queued_bytes();
        // One item always fits an empty queue, whatever its size (a message is at most
        // `wire::MAX_MESSAGE_BYTES`).
        if queued.frames > 0
            && (queued.bytes + bytes > self.max_queued_bytes
                || queued.frames >= self.max_queued_frames)
        {
            return Err(SubmitError::Full {
                bytes: queued.bytes,
                frames: queued.frames,
            });
        }
        match self.outgoing.try_send(item) {
            Ok(()) => {
                queued.busy = true;
                queued.bytes += bytes;
                queued.frames += 1;
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(SubmitError::Full {
                bytes: queued.bytes,
                frames: queued.frames,
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SubmitError::WriterStopped),
        }
    }

    /// Shuts the socket down both ways: the reader and writer tasks end at once, even when
    /// the writer waits on a peer that does not read.
    pub(super) fn close(&self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Drops the connection for `reason` (the first one given stands): closes it, and its
    /// reader task, ending, fails its READs and reports the peer lost with `reason`. So a
    /// caller that must not wait (the driver's own call) never emits an event itself, and
    /// nothing the peer sent follows the `PeerLost`.
    pub(super) fn fail(&self, reason: TcpLinkError) {
        lock(&self.failure).get_or_insert(reason);
        self.close();
    }

    /// Why [`Link::fail`] dropped the connection, if it did.
    fn take_failure(&self) -> Option<TcpLinkError> {
        lock(&self.failure).take()
    }
}

impl SubmitError {
    /// The reason to drop the connection.
    pub(super) fn into_link_error(self, peer: NodeId, config: &TcpFabricConfig) -> TcpLinkError {
        match self {
            SubmitError::WriterStopped => TcpLinkError::WriterStopped,
            SubmitError::Full { bytes, frames } => TcpLinkError::PeerNotReading {
                peer,
                queued_bytes: bytes,
                queued_frames: frames,
                max_bytes: config.max_queued_bytes,
                max_frames: config.max_queued_frames,
            },
        }
    }
}

/// What a received message costs of its connection's undelivered budget beyond its bytes, so
/// a flood of empty messages is bounded too.
const MESSAGE_OVERHEAD_BYTES: usize = 64;

/// Permits of a connection's undelivered-bytes budget: room for one message of any size.
fn undelivered_permits(config: &TcpFabricConfig) -> u32 {
    let bytes = config
        .max_undelivered_bytes
        .max(wire::MAX_MESSAGE_BYTES + MESSAGE_OVERHEAD_BYTES);
    u32::try_from(bytes).unwrap_or(u32::MAX)
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

/// A peer connection's socket options, best effort: no delay for small frames, buffers for
/// a few READ slices in flight, little unsent data (so a message overtakes READ data in the
/// writer task's queue, not behind it in the socket), and a dead peer noticed within
/// `dead_peer_timeout` (without these, only by the transfer deadlines).
fn tune_socket(stream: &TcpStream, dead_peer_timeout: Duration) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_SIZE_BYTES);
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_SIZE_BYTES);
    let _ = socket.set_tcp_notsent_lowat(UNSENT_BYTES_LIMIT);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time((dead_peer_timeout / 2).max(Duration::from_secs(1)))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    let _ = socket.set_tcp_keepalive(&keepalive);
    let _ = socket.set_tcp_user_timeout(Some(dead_peer_timeout));
}

/// Sets up and installs a connection whose handshake is done, and tells the driver through
/// `connected`, the place taken for its `PeerConnected` (so the driver hears of it before
/// anything the peer sends, and before its `PeerLost`).
pub(super) fn start_connection(
    inner: Arc<Inner>,
    peer: NodeId,
    stream: TcpStream,
    round_trips: MeasuredRoundTrips,
    connected: EventPlace,
) {
    let (costs, summary) = inner.path_costs(peer, &stream, round_trips);
    tune_socket(&stream, inner.config.dead_peer_timeout);
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
    let (outgoing_tx, outgoing_rx) = mpsc::channel(inner.config.max_queued_frames.max(1));
    let link = Arc::new(Link {
        socket: direct,
        queued: Mutex::new(Queued::default()),
        outgoing: outgoing_tx,
        max_queued_bytes: inner.config.max_queued_bytes,
        max_queued_frames: inner.config.max_queued_frames.max(1),
        failure: Mutex::new(None),
    });
    // Every message handed to the driver holds its share of this until dropped.
    let undelivered_budget = Arc::new(Semaphore::new(undelivered_permits(&inner.config) as usize));
    let Some(generation) = inner.install(peer, link.clone()) else {
        debug!(%peer, "dropping a duplicate connection");
        return;
    };
    let (reader, writer) = stream.into_split();
    connected.send(FabricEvent::PeerConnected {
        peer,
        params: PeerParams { lanes: 1, costs },
        summary,
    });
    let writer_link = link.clone();
    tokio::spawn(async move {
        if let Err(source) = write_loop(&writer_link, writer, outgoing_rx).await {
            writer_link.fail(TcpLinkError::Write { peer, source });
        }
    });
    tokio::spawn(async move {
        let reason = match read_loop(&inner, peer, reader, &link, &undelivered_budget).await {
            Ok(()) => TcpLinkError::Closed { peer },
            Err(error) => error,
        };
        let reason = link.take_failure().unwrap_or(reason);
        inner.lose(peer, Some(generation), reason).await;
    });
}

/// Writes what is queued for the peer: every frame (messages, READ requests, refusals)
/// before the next READ response's data.
///
/// READ data is bulk: a requester can ask for hundreds of MiB at once, and on a link shared by
/// many peers that takes seconds to write. A message behind it (a `Rendezvous` answering
/// another fetch, a lease extension) would wait that long, past the requester's reply
/// deadline, although this node is alive and answering. So frames overtake queued READ data,
/// and wait at most for the READ response being written: over verbs, too, a node's own sends
/// do not queue behind the READs its NIC serves. Nothing depends on a message following READ
/// data: READ completions and messages are separate events, matched by the requester's core.
async fn write_loop(
    link: &Link,
    writer: OwnedWriteHalf,
    mut outgoing: mpsc::Receiver<Outgoing>,
) -> std::io::Result<()> {
    let mut writer = BufWriter::with_capacity(SOCKET_BUFFER_BYTES, writer);
    let mut waiting = WriteOrder::default();
    loop {
        while let Ok(item) = outgoing.try_recv() {
            waiting.push(item);
        }
        if let Some(item) = waiting.pop() {
            write_item(link, &mut writer, item).await?;
            continue;
        }
        writer.flush().await?;
        // Idle once the queue is empty under the lock that enqueuers take: from then on
        // callers write directly, and nothing of ours is left to overtake.
        {
            let mut queued = lock(&link.queued);
            match outgoing.try_recv() {
                Ok(item) => {
                    waiting.push(item);
                    continue;
                }
                Err(_) => queued.busy = false,
            }
        }
        match outgoing.recv().await {
            Some(item) => waiting.push(item),
            None => return Ok(()),
        }
    }
}

/// The items the writer task took off its channel, in the order it writes them: frames
/// first, in their order, then READ data, in its order.
#[derive(Default)]
struct WriteOrder {
    frames: VecDeque<Outgoing>,
    reads: VecDeque<Outgoing>,
}

impl WriteOrder {
    fn push(&mut self, item: Outgoing) {
        match item {
            Outgoing::Frame(_) => self.frames.push_back(item),
            Outgoing::ReadData { .. } => self.reads.push_back(item),
        }
    }

    fn pop(&mut self) -> Option<Outgoing> {
        self.frames.pop_front().or_else(|| self.reads.pop_front())
    }
}

async fn write_item(
    link: &Link,
    writer: &mut BufWriter<OwnedWriteHalf>,
    item: Outgoing,
) -> std::io::Result<()> {
    let bytes = item.queued_bytes();
    let written = write_item_bytes(writer, item).await;
    let mut queued = lock(&link.queued);
    // Each queued item is counted once, by `submit`, and written once, here.
    debug_assert!(queued.frames > 0 && queued.bytes >= bytes);
    queued.bytes = queued.bytes.saturating_sub(bytes);
    queued.frames = queued.frames.saturating_sub(1);
    written
}

async fn write_item_bytes(
    writer: &mut BufWriter<OwnedWriteHalf>,
    item: Outgoing,
) -> std::io::Result<()> {
    match item {
        Outgoing::Frame(frame) => writer.write_all(&frame).await,
        Outgoing::ReadData {
            op,
            offset,
            len,
            serving,
        } => {
            // The range lies inside the granted region (checked when the request arrived),
            // which `serving` keeps claimed for reading until this write is done.
            let view = serving.view();
            let data = offset
                .checked_sub(view.offset())
                .and_then(|start| view.as_slice().get(start as usize..)?.get(..len as usize));
            let mut header = [0u8; READ_RESPONSE_HEADER_BYTES];
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
    undelivered_budget: &Arc<Semaphore>,
) -> Result<(), TcpLinkError> {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let io = |source: std::io::Error| TcpLinkError::Read { peer, source };
    let submit = |item| {
        link.submit(item)
            .map_err(|e| e.into_link_error(peer, &inner.config))
    };
    let budget_permits = undelivered_permits(&inner.config);
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
                    return Err(TcpLinkError::MessageTooLarge {
                        peer,
                        len,
                        limit: wire::MAX_MESSAGE_BYTES,
                    });
                }
                // Wait for the driver to drop enough earlier messages: until then this
                // connection reads nothing more, its receive window fills and the peer's
                // sends wait (TCP flow control), instead of piling up here.
                let cost = (len + MESSAGE_OVERHEAD_BYTES).min(budget_permits as usize);
                let budget = undelivered_budget
                    .clone()
                    // Cannot truncate: at most `budget_permits`, a u32.
                    .acquire_many_owned(cost as u32)
                    .await
                    // The semaphore is never closed.
                    .map_err(|_| TcpLinkError::WriterStopped)?;
                let mut bytes = vec![0u8; len];
                reader.read_exact(&mut bytes).await.map_err(io)?;
                crate::trace::stamp("message_read");
                inner
                    .emit(FabricEvent::Message {
                        peer,
                        bytes: MessageBytes::budgeted(bytes, budget),
                    })
                    .await;
            }
            KIND_READ_REQUEST => {
                let op = reader.read_u64_le().await.map_err(io)?;
                let addr = reader.read_u64_le().await.map_err(io)?;
                let len = reader.read_u64_le().await.map_err(io)?;
                let rkey = reader.read_u32_le().await.map_err(io)?;
                let admitted = (len <= MAX_READ_BYTES)
                    .then(|| Serving::admit(&inner.grants, &inner.events, peer, rkey, addr, len))
                    .flatten();
                let item = match admitted {
                    Some(serving) => Outgoing::ReadData {
                        op,
                        offset: addr,
                        len,
                        serving,
                    },
                    None => {
                        debug!(%peer, op, addr, len, rkey, "refused a READ no live grant of this peer covers");
                        let mut header = vec![0u8; 18];
                        header[0] = KIND_READ_RESPONSE;
                        header[1..9].copy_from_slice(&op.to_le_bytes());
                        header[9] = STATUS_REMOTE_ACCESS;
                        Outgoing::Frame(header)
                    }
                };
                submit(item)?;
            }
            KIND_READ_RESPONSE => {
                let op = reader.read_u64_le().await.map_err(io)?;
                let status = reader.read_u8().await.map_err(io)?;
                let len = reader.read_u64_le().await.map_err(io)?;
                let pending = lock(&inner.pending_reads).remove(&op);
                let Some(mut pending) = pending else {
                    return Err(TcpLinkError::UnaskedReadResponse { peer, op });
                };
                // The READ is ours from here: every way out completes it, so a connection lost
                // mid-data fails the transfer at once instead of leaving it to its deadline.
                let outcome = if status == STATUS_OK {
                    let asked = pending.destination.len();
                    if len != asked {
                        Err(TcpLinkError::ReadLength {
                            peer,
                            op,
                            len,
                            asked,
                        })
                    } else {
                        // Straight into the destination, claimed for this READ since it was
                        // posted.
                        let destination = pending.destination.as_mut_slice();
                        reader
                            .read_exact(destination)
                            .await
                            .map(|_| Ok(()))
                            .map_err(io)
                    }
                } else {
                    Ok(Err(ReadError::RemoteAccess))
                };
                let (result, broken) = match outcome {
                    Ok(result) => (result, None),
                    Err(reason) => (Err(ReadError::ConnectionLost), Some(reason)),
                };
                // In the place taken when it was posted: no wait. The destination's claim
                // ends first, so the driver may view the bytes once told.
                pending.complete(ReadOpId(op), result);
                if let Some(reason) = broken {
                    return Err(reason);
                }
            }
            KIND_PING => {
                let nonce = reader.read_u64_le().await.map_err(io)?;
                let mut frame = vec![KIND_PONG];
                frame.extend_from_slice(&nonce.to_le_bytes());
                submit(Outgoing::Frame(frame))?;
            }
            KIND_PONG => {
                reader.read_u64_le().await.map_err(io)?;
            }
            other => return Err(TcpLinkError::UnknownFrame { peer, kind: other }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_socket_keeps_little_unsent_and_notices_a_dead_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stream, _accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let stream = stream.unwrap();
        tune_socket(&stream, Duration::from_secs(6));
        let socket = socket2::SockRef::from(&stream);
        assert_eq!(socket.tcp_notsent_lowat().unwrap(), UNSENT_BYTES_LIMIT);
        assert!(stream.nodelay().unwrap());
        assert_eq!(
            socket.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(6))
        );
        assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(3));
        // The kernel doubles what was asked (for its bookkeeping), within its limits.
        assert!(socket.send_buffer_size().unwrap() >= SOCKET_BUFFER_BYTES);
    }
}
