//! Local client connections: framing, the Hello handshake with fd passing, and one task per
//! connection that both serves requests and writes everything queued for its client.

use std::sync::Arc;

use skyriver_core::client_protocol::{
    decode_frame_len, decode_request, encode_frame, FrameError, Request, RequestFrame, Response,
    ServerFrame, FRAME_HEADER_BYTES, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
use skyriver_core::{ClientId, RequestId, StoreError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::Shared;

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum ConnectionEnd {
    #[error("client closed the connection")]
    Closed,
    #[error("connection closed mid-frame (truncated frame)")]
    Truncated,
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("io error: {0}")]
    Io(std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
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

/// Bytes read from a connection, cut into frames. Reading into it is cancel-safe, so one task
/// can wait on the socket and on its outbox at once.
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
    async fn fill(&mut self, stream: &mut UnixStream) -> Result<(), ConnectionEnd> {
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

fn error_frame(request: RequestId, error: StoreError) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_frame(
        &ServerFrame::Reply {
            request,
            response: Response::Error(error),
        },
        &mut bytes,
    );
    bytes
}

pub(super) async fn serve_connection(shared: Arc<Shared>, mut stream: UnixStream) {
    let (client, mut outbox) = {
        let now = shared.now();
        let mut core = shared.lock();
        let client = ClientId(core.next_client);
        core.next_client += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        core.outboxes.insert(client, tx);
        core.node.store_mut(now).connect(client);
        (client, rx)
    };
    let mut reader = FrameReader::default();
    let end = match handshake(&shared, client, &mut stream, &mut reader).await {
        Ok(()) => serve_requests(&shared, client, &mut stream, &mut reader, &mut outbox).await,
        Err(end) => end,
    };
    match &end {
        ConnectionEnd::Closed => debug!(%client, "disconnected"),
        other => warn!(%client, reason = %other, "closing client connection"),
    }
    let now = shared.now();
    let mut core = shared.lock();
    core.outboxes.remove(&client);
    core.node.handle_client_disconnected(now, client);
    core.drain(now);
}

/// Reads `Hello`, answers `Welcome` with the arenas' fds attached.
async fn handshake(
    shared: &Shared,
    client: ClientId,
    stream: &mut UnixStream,
    reader: &mut FrameReader,
) -> Result<(), ConnectionEnd> {
    let body = loop {
        match reader.next_frame() {
            Ok(Some(body)) => break body,
            Ok(None) => reader.fill(stream).await?,
            Err(error) => {
                let _ = stream
                    .write_all(&error_frame(
                        RequestId(0),
                        StoreError::BadRequest(error.to_string()),
                    ))
                    .await;
                return Err(error.into());
            }
        }
    };
    let (request, client_name) = match decode_request(&reader.buf[body]) {
        Ok(RequestFrame {
            request,
            body:
                Request::Hello {
                    protocol_version,
                    client_name,
                },
        }) => {
            if protocol_version != PROTOCOL_VERSION {
                let reason = format!(
                    "protocol version {protocol_version} is not supported; this daemon speaks {PROTOCOL_VERSION}"
                );
                let _ = stream
                    .write_all(&error_frame(
                        request,
                        StoreError::BadRequest(reason.clone()),
                    ))
                    .await;
                return Err(ConnectionEnd::Protocol(reason));
            }
            (request, client_name)
        }
        Ok(other) => {
            let reason = "the first request must be Hello".to_string();
            let _ = stream
                .write_all(&error_frame(
                    other.request,
                    StoreError::BadRequest(reason.clone()),
                ))
                .await;
            return Err(ConnectionEnd::Protocol(reason));
        }
        Err(error) => {
            let _ = stream
                .write_all(&error_frame(
                    RequestId(0),
                    StoreError::BadRequest(error.to_string()),
                ))
                .await;
            return Err(error.into());
        }
    };
    let mut welcome = Vec::new();
    encode_frame(
        &ServerFrame::Reply {
            request,
            response: Response::Welcome {
                protocol_version: PROTOCOL_VERSION,
                node: shared.node,
                arenas: shared.arena_infos.clone(),
            },
        },
        &mut welcome,
    );
    let fds: Vec<_> = shared.arenas.iter().map(|arena| arena.fd()).collect();
    let sent = loop {
        stream.writable().await?;
        let socket = &*stream;
        match socket.try_io(tokio::io::Interest::WRITABLE, || {
            use std::os::fd::AsFd;
            skyriver_transport::fd_passing::send_with_fds(socket.as_fd(), &welcome, &fds)
        }) {
            Ok(sent) => break sent,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error.into()),
        }
    };
    stream.write_all(&welcome[sent..]).await?;
    debug!(%client, %client_name, "client connected");
    Ok(())
}

/// Serves requests and writes everything queued for this client, in one task: a reply is
/// written by the task that read its request, without a hop to another task.
async fn serve_requests(
    shared: &Shared,
    client: ClientId,
    stream: &mut UnixStream,
    reader: &mut FrameReader,
    outbox: &mut mpsc::UnboundedReceiver<Vec<u8>>,
) -> ConnectionEnd {
    let mut pending = Vec::new();
    loop {
        // Handle every complete request already buffered.
        loop {
            match reader.next_frame() {
                Ok(Some(body)) => match decode_request(&reader.buf[body]) {
                    Ok(frame) => {
                        let now = shared.now();
                        shared.lock().handle_request(now, client, frame);
                        shared.timer_changed.notify_one();
                    }
                    Err(error) => {
                        warn!(%client, %error, "malformed request");
                        pending.extend(error_frame(
                            RequestId(0),
                            StoreError::BadRequest(error.to_string()),
                        ));
                    }
                },
                Ok(None) => break,
                Err(error) => {
                    // The stream cannot be trusted past a bad length: explain, then close.
                    pending.extend(error_frame(
                        RequestId(0),
                        StoreError::BadRequest(error.to_string()),
                    ));
                    while let Ok(frame) = outbox.try_recv() {
                        pending.extend(frame);
                    }
                    let _ = stream.write_all(&pending).await;
                    return error.into();
                }
            }
        }
        while let Ok(frame) = outbox.try_recv() {
            pending.extend(frame);
        }
        if !pending.is_empty() {
            if let Err(error) = stream.write_all(&pending).await {
                return error.into();
            }
            pending.clear();
        }
        tokio::select! {
            filled = reader.fill(stream) => {
                if let Err(end) = filled {
                    return end;
                }
            }
            frame = outbox.recv() => {
                // The sender lives in the core state until this connection ends.
                if let Some(frame) = frame {
                    pending.extend(frame);
                }
            }
        }
    }
}
