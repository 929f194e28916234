//! Local client connections, as the event loop sees them: a reader task per connection cuts
//! the byte stream into requests and hands them to the loop over one bounded channel (a full
//! channel stops the readers, and the clients feel it as a slow socket); the loop writes every
//! reply itself, straight into the socket when it takes the bytes, and through a small flush
//! task when it does not. A client whose unread replies pile up past
//! [`MAX_CLIENT_BACKLOG_BYTES`] is disconnected with that reason, never buffered without limit.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use skyriver_core::client_protocol::{
    decode_frame_len, decode_request, FrameError, RequestFrame, FRAME_HEADER_BYTES,
    MAX_REQUEST_BYTES,
};
use skyriver_core::ClientId;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

/// Reply bytes a client may leave unread before it is disconnected (one frame of any size is
/// always accepted on top of an empty backlog).
pub(super) const MAX_CLIENT_BACKLOG_BYTES: usize = 16 << 20;

/// What a connection's reader hands the event loop.
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

    /// Reads more bytes; `Closed` or `Truncated` at end of stream.
    async fn fill(&mut self, stream: &mut (impl AsyncRead + Unpin)) -> Result<(), ConnectionEnd> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(Self::READ_CHUNK_BYTES);
        if stream.read_buf(&mut self.buf).await? == 0 {
            return Err(if self.buf.is_empty() {
                ConnectionEnd::Closed
            } else {
                ConnectionEnd::Truncated
            });
        }
        Ok(())
    }
}

/// Reads one connection's requests until it ends, handing each to the loop.
pub(super) async fn read_requests(
    client: ClientId,
    mut stream: OwnedReadHalf,
    inputs: mpsc::Sender<ClientInput>,
) {
    let mut reader = FrameReader::default();
    let end = loop {
        match reader.next_frame() {
            Ok(Some(body)) => {
                let input = match decode_request(&reader.buf[body]) {
                    Ok(frame) => ClientInput::Request { client, frame },
                    Err(error) => ClientInput::Malformed { client, error },
                };
                if inputs.send(input).await.is_err() {
                    return; // the loop stopped
                }
            }
            Ok(None) => {
                if let Err(end) = reader.fill(&mut stream).await {
                    break end;
                }
            }
            Err(error) => break ConnectionEnd::Frame(error),
        }
    };
    let _ = inputs.send(ClientInput::Ended { client, end }).await;
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
