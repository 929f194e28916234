//! Local client connections, as the event loop sees them. The loop reads each socket itself
//! when it is readable (no task hop between a request and the node): at most
//! [`READ_TURN_BYTES`] per turn, so one busy client cannot starve the others, and nothing more
//! than the loop handles is read (a client that sends faster than it is served meets a full
//! socket). The loop writes every reply itself, straight into the socket when it takes the
//! bytes, and through a small flush task when it does not. A client whose unread replies pile
//! up past [`MAX_CLIENT_BACKLOG_BYTES`] is disconnected with that reason, never buffered
//! without limit.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use skyriver_core::client_protocol::{
    decode_frame_len, decode_request, FrameError, RequestFrame, FRAME_HEADER_BYTES,
    MAX_REQUEST_BYTES,
};
use skyriver_core::ClientId;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// Reply bytes a client may leave unread before it is disconnected (one frame of any size is
/// always accepted on top of an empty backlog).
pub(super) const MAX_CLIENT_BACKLOG_BYTES: usize = 16 << 20;

/// Bytes the loop reads from one client in one turn before serving the others.
pub(super) const READ_TURN_BYTES: usize = 256 * 1024;

/// What reading a connection gives the event loop.
#[derive(Debug)]
pub(super) enum ClientInput {
    /// A decoded request.
    Request {
        /// Whose.
        client: ClientId,
        /// The request.
        frame: RequestFrame,
    },
    /// A frame that did not decode: answered with an error, the connection stays.
    Malformed {
        /// Whose.
        client: ClientId,
        /// Why.
        error: FrameError,
    },
    /// The connection ended (closed, or a frame whose length cannot be trusted).
    Ended {
        /// Whose.
        client: ClientId,
        /// Why.
        end: ConnectionEnd,
    },
}

impl ClientInput {
    /// Whether `skyriver bench breakdown` follows this input (a fetch or a put).
    pub(super) fn is_traced(&self) -> bool {
        use skyriver_core::client_protocol::Request;
        matches!(
            self,
            ClientInput::Request { frame, .. }
                if matches!(frame.body, Request::Fetch { .. } | Request::FetchFrom { .. } | Request::Put { .. })
        )
    }
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectionEnd {
    /// The client closed it.
    #[error("client closed the connection")]
    Closed,
    /// The client closed it in the middle of a frame.
    #[error("connection closed mid-frame (truncated frame)")]
    Truncated,
    /// A frame length over the limit: the stream cannot be trusted past it.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// Reading failed.
    #[error("read failed: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for ConnectionEnd {
    fn from(error: std::io::Error) -> Self {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        // A client that exits with replies in flight is an ordinary goodbye.
        match error.kind() {
            BrokenPipe | ConnectionReset => ConnectionEnd::Closed,
            _ => ConnectionEnd::Io(error),
        }
    }
}

/// Bytes read from a connection, cut into frames.
#[derive(Default)]
struct FrameReader {
    buf: Vec<u8>,
    start: usize,
}

impl FrameReader {
    const READ_CHUNK_BYTES: usize = 64 * 1024;

    /// The byte range of the next complete frame body in the buffer, if one is there.
    fn next_frame(&mut self) -> Result<Option<std::ops::Range<usize>>, FrameError> {
        let pending = &self.buf[self.start..];
        let Some(header) = pending.get(..FRAME_HEADER_BYTES) else {
            return Ok(None);
        };
        let header: [u8; FRAME_HEADER_BYTES] =
            header.try_into().expect("sliced to the header size");
        let len = decode_frame_len(header, MAX_REQUEST_BYTES)?;
        if pending.len() < FRAME_HEADER_BYTES + len {
            return Ok(None);
        }
        let body = self.start + FRAME_HEADER_BYTES..self.start + FRAME_HEADER_BYTES + len;
        self.start = body.end;
        Ok(Some(body))
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// One read of the socket straight from `fd`, bypassing the runtime's readiness (which may
    /// still say "not readable"): `Ok(false)` when the socket holds nothing now.
    fn fill_direct(
        &mut self,
        fd: std::os::fd::RawFd,
        scratch: &mut [u8],
    ) -> Result<bool, ConnectionEnd> {
        use nix::sys::socket::{recv, MsgFlags};
        match recv(fd, scratch, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => Err(ConnectionEnd::Closed),
            Ok(n) => {
                self.compact();
                self.buf.extend_from_slice(&scratch[..n]);
                Ok(true)
            }
            Err(nix::errno::Errno::EAGAIN) => Ok(false),
            Err(errno) => Err(std::io::Error::from(errno).into()),
        }
    }

    /// Reads what the socket holds now, up to `limit` bytes: `Ok(true)` when the limit was
    /// reached (more may wait), `Closed` at end of stream.
    fn fill_now(&mut self, stream: &OwnedReadHalf, limit: usize) -> Result<bool, ConnectionEnd> {
        self.compact();
        let mut taken = 0;
        while taken < limit {
            self.buf.reserve(Self::READ_CHUNK_BYTES);
            let room = self.buf.capacity() - self.buf.len();
            match stream.try_read_buf(&mut self.buf) {
                // Whether a frame was cut short is known once the frames read are taken
                // ([`ClientReader::read_turn`]).
                Ok(0) => return Err(ConnectionEnd::Closed),
                // Less than there was room for: the socket held no more just now. The read
                // that would say so (and clear the runtime's readiness) comes with the next
                // readiness wait, after this turn's replies are out, not before them.
                Ok(n) if n < room => return Ok(taken + n >= limit),
                Ok(n) => taken += n,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(error) => return Err(error.into()),
            }
        }
        Ok(true)
    }
}

/// The reading side of one connection, read by the event loop itself.
pub(super) struct ClientReader {
    half: Arc<OwnedReadHalf>,
    frames: FrameReader,
}

/// A future the loop polls among all clients': resolves with the client once its socket is
/// readable (or closed).
pub(super) type Readable = std::pin::Pin<Box<dyn std::future::Future<Output = ClientId> + Send>>;

impl ClientReader {
    pub(super) fn new(half: OwnedReadHalf) -> Self {
        Self {
            half: Arc::new(half),
            frames: FrameReader::default(),
        }
    }

    /// Resolves with `client` when there is something to read.
    pub(super) fn readable(&self, client: ClientId) -> Readable {
        let half = self.half.clone();
        Box::pin(async move {
            // An error means the socket is gone; reading says so.
            let _ = half.readable().await;
            client
        })
    }

    /// Resolves with `client` at once: a full turn was read, more may wait.
    pub(super) fn again(client: ClientId) -> Readable {
        Box::pin(std::future::ready(client))
    }

    /// Reads this turn's bytes and cuts them into inputs. Returns whether the connection is
    /// still open and whether a full turn was read (the loop comes back at once).
    pub(super) fn read_turn(
        &mut self,
        client: ClientId,
        out: &mut Vec<ClientInput>,
    ) -> (bool, bool) {
        let filled = self.frames.fill_now(&self.half, READ_TURN_BYTES);
        self.take_frames(client, filled, out)
    }

    /// One read straight from the socket, while the loop polls a client it just served (no
    /// readiness wait, no runtime round): `None` when nothing was there, else whether the
    /// connection is still open. The client's readiness wait stays armed; when it fires for
    /// bytes read here, the read it leads to finds nothing and re-arms it.
    pub(super) fn read_direct(
        &mut self,
        client: ClientId,
        scratch: &mut [u8],
        out: &mut Vec<ClientInput>,
    ) -> Option<bool> {
        let filled = match self.frames.fill_direct(self.raw_fd(), scratch) {
            Ok(false) => return None,
            Ok(true) => Ok(false),
            Err(end) => Err(end),
        };
        Some(self.take_frames(client, filled, out).0)
    }

    /// Cuts the bytes read into inputs; `filled` is what reading said.
    fn take_frames(
        &mut self,
        client: ClientId,
        filled: Result<bool, ConnectionEnd>,
        out: &mut Vec<ClientInput>,
    ) -> (bool, bool) {
        loop {
            match self.frames.next_frame() {
                Ok(Some(body)) => out.push(match decode_request(&self.frames.buf[body]) {
                    Ok(frame) => ClientInput::Request { client, frame },
                    Err(error) => ClientInput::Malformed { client, error },
                }),
                Ok(None) => break,
                Err(error) => {
                    out.push(ClientInput::Ended {
                        client,
                        end: ConnectionEnd::Frame(error),
                    });
                    return (false, false);
                }
            }
        }
        match filled {
            Ok(full) => (true, full),
            Err(end) => {
                // A client may send its last requests and close at once (a release on its
                // way out): only bytes left over after the whole frames are a cut frame.
                let end = match end {
                    ConnectionEnd::Closed if self.frames.start < self.frames.buf.len() => {
                        ConnectionEnd::Truncated
                    }
                    end => end,
                };
                out.push(ClientInput::Ended { client, end });
                (false, false)
            }
        }
    }

    /// Stops reading: the socket's read side is shut down, so a pending readiness wait ends.
    pub(super) fn close(&self) {
        let _ = nix::sys::socket::shutdown(self.raw_fd(), nix::sys::socket::Shutdown::Read);
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        let stream: &tokio::net::UnixStream = (*self.half).as_ref();
        std::os::fd::AsRawFd::as_raw_fd(&stream.as_fd())
    }
}

/// Why a reply could not be written.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    /// The client does not read its replies.
    #[error(
        "the client left {backlog_bytes} bytes of replies unread (limit {limit}): it is not \
         reading its socket"
    )]
    Backlog {
        /// Bytes waiting.
        backlog_bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Writing failed (the client is gone).
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Default)]
struct Backlog {
    bytes: Vec<u8>,
    /// A flush task owns writing the backlog.
    flushing: bool,
    /// Why the flush task gave up.
    failed: Option<std::io::ErrorKind>,
}

/// The writing side of one connection.
pub(super) struct ClientWriter {
    half: Arc<OwnedWriteHalf>,
    backlog: Arc<Mutex<Backlog>>,
}

impl ClientWriter {
    pub(super) fn new(half: OwnedWriteHalf) -> Self {
        Self {
            half: Arc::new(half),
            backlog: Arc::default(),
        }
    }

    /// Writes `frame` now if the socket takes it, else queues the rest for a flush task.
    pub(super) fn write(&self, frame: &[u8]) -> Result<(), WriteError> {
        self.write_with_fds(frame, &[])
    }

    /// As [`ClientWriter::write`], passing `fds` along with the frame's first byte.
    pub(super) fn write_with_fds(
        &self,
        frame: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), WriteError> {
        // The loop and flush tasks share one thread; this lock is never contended.
        let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kind) = backlog.failed {
            return Err(WriteError::Io(kind.into()));
        }
        if backlog.flushing {
            if backlog.bytes.len() + frame.len() > MAX_CLIENT_BACKLOG_BYTES {
                return Err(WriteError::Backlog {
                    backlog_bytes: backlog.bytes.len() + frame.len(),
                    limit: MAX_CLIENT_BACKLOG_BYTES,
                });
            }
            // Only the first frame of a connection carries fds, and it never waits here.
            debug_assert!(fds.is_empty(), "fds queued behind a backlog");
            backlog.bytes.extend_from_slice(frame);
            return Ok(());
        }
        let written = if fds.is_empty() {
            self.half.try_write(frame)
        } else {
            let stream: &tokio::net::UnixStream = (*self.half).as_ref();
            skyriver_transport::fd_passing::send_with_fds(stream.as_fd(), frame, fds)
        };
        let written = match written {
            Ok(n) => n,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock && fds.is_empty() => 0,
            Err(error) => return Err(error.into()),
        };
        if written < frame.len() {
            backlog.bytes.extend_from_slice(&frame[written..]);
            backlog.flushing = true;
            tokio::spawn(flush(self.half.clone(), self.backlog.clone()));
        }
        Ok(())
    }
}

impl ClientWriter {
    /// Closes the connection. Replies already written stay readable; a backlog that was not
    /// (a client that does not read) is dropped, and the socket is shut down so its flush
    /// task ends too instead of waiting for a reader that never comes.
    pub(super) fn close(self) {
        let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        if backlog.flushing {
            backlog.bytes.clear();
            backlog.failed = Some(std::io::ErrorKind::ConnectionAborted);
            let stream: &tokio::net::UnixStream = (*self.half).as_ref();
            // Ends the flush task's wait for writability (and the reader's for bytes).
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(&stream.as_fd()),
                nix::sys::socket::Shutdown::Both,
            );
        }
    }
}

/// Writes a connection's backlog as the socket drains, then hands writing back to the loop.
async fn flush(half: Arc<OwnedWriteHalf>, backlog: Arc<Mutex<Backlog>>) {
    loop {
        let stream: &tokio::net::UnixStream = (*half).as_ref();
        if let Err(error) = stream.writable().await {
            let mut backlog = backlog.lock().unwrap_or_else(|p| p.into_inner());
            backlog.failed = Some(error.kind());
            return;
        }
        let mut backlog = backlog.lock().unwrap_or_else(|p| p.into_inner());
        if backlog.failed.is_some() {
            return; // closed by the loop
        }
        match half.try_write(&backlog.bytes) {
            Ok(n) => {
                backlog.bytes.drain(..n);
                if backlog.bytes.is_empty() {
                    backlog.flushing = false;
                    backlog.bytes.shrink_to(64 * 1024);
                    return;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => {
                backlog.failed = Some(error.kind());
                backlog.bytes.clear();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use skyriver_core::client_protocol::{encode_frame, Request, RequestFrame};
    use skyriver_core::{ObjectId, RequestId};

    use super::*;

    /// What the reader makes of `bytes` written by a client that then closes its socket.
    async fn read_then_close(bytes: Vec<u8>) -> Vec<ClientInput> {
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let (read, _write) = ours.into_split();
        let mut reader = ClientReader::new(read);
        tokio::io::AsyncWriteExt::write_all(&mut theirs, &bytes)
            .await
            .unwrap();
        drop(theirs);
        let mut out = Vec::new();
        loop {
            reader.readable(ClientId(1)).await;
            let (open, _) = reader.read_turn(ClientId(1), &mut out);
            if !open {
                return out;
            }
        }
    }

    fn release_frame() -> Vec<u8> {
        let mut bytes = Vec::new();
        let frame = RequestFrame {
            request: RequestId(7),
            body: Request::Release {
                id: ObjectId::from_u64(1),
            },
        };
        encode_frame(&frame, &mut bytes);
        bytes
    }

    #[tokio::test]
    async fn a_last_request_then_a_close_is_a_clean_end() {
        let inputs = read_then_close(release_frame()).await;
        assert!(
            matches!(inputs[0], ClientInput::Request { .. }),
            "{inputs:?}"
        );
        assert!(
            matches!(
                inputs[1],
                ClientInput::Ended {
                    end: ConnectionEnd::Closed,
                    ..
                }
            ),
            "{inputs:?}"
        );
    }

    #[tokio::test]
    async fn a_frame_cut_short_by_the_close_is_truncated() {
        let mut bytes = release_frame();
        let whole = bytes.clone();
        bytes.extend_from_slice(&whole[..whole.len() - 1]);
        let inputs = read_then_close(bytes).await;
        assert!(
            matches!(inputs[0], ClientInput::Request { .. }),
            "{inputs:?}"
        );
        assert!(
            matches!(
                inputs[1],
                ClientInput::Ended {
                    end: ConnectionEnd::Truncated,
                    ..
                }
            ),
            "{inputs:?}"
        );
    }
}
