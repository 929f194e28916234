//! Connection set-up of the TCP fabric: the accept loop, the authenticated handshake both ways
//! (postcard, versioned) and the ping-pong that measures the round trip.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skyriver_core::node::RoundTripBatch;
use skyriver_core::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use super::connection::start_connection;
use super::errors::{Refusal, TcpHandshakeError};
use super::{
    Inner, HANDSHAKE_MAGIC, HANDSHAKE_VERSION, KIND_PING, KIND_PONG, MAX_HANDSHAKE_BYTES,
    PING_ROUNDS,
};
use crate::fabric::FabricEvent;

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

pub(super) async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
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

impl Handshake {
    fn name(&self) -> &'static str {
        match self {
            Handshake::Hello { .. } => "Hello",
            Handshake::Welcome { .. } => "Welcome",
            Handshake::Refused { .. } => "Refused",
        }
    }
}

fn io_error(stage: &'static str) -> impl Fn(std::io::Error) -> TcpHandshakeError {
    move |source| TcpHandshakeError::Io { stage, source }
}

async fn write_handshake(
    stream: &mut TcpStream,
    message: &Handshake,
) -> Result<(), TcpHandshakeError> {
    let body =
        postcard::to_stdvec(message).map_err(|source| TcpHandshakeError::Malformed { source })?;
    stream
        .write_all(&(body.len() as u32).to_le_bytes())
        .await
        .map_err(io_error("write"))?;
    stream.write_all(&body).await.map_err(io_error("write"))
}

async fn read_handshake(stream: &mut TcpStream) -> Result<Handshake, TcpHandshakeError> {
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .await
        .map_err(io_error("read"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HANDSHAKE_BYTES {
        return Err(TcpHandshakeError::TooLarge {
            len,
            limit: MAX_HANDSHAKE_BYTES,
        });
    }
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .await
        .map_err(io_error("read"))?;
    postcard::from_bytes(&body).map_err(|source| TcpHandshakeError::Malformed { source })
}

async fn accept_handshake(
    inner: &Arc<Inner>,
    mut stream: TcpStream,
) -> Result<(), TcpHandshakeError> {
    let (peer, refusal) = match read_handshake(&mut stream).await? {
        Handshake::Hello {
            magic,
            version,
            node,
            token,
        } => {
            let refusal = if magic != HANDSHAKE_MAGIC {
                Some(Refusal::NotSkyriver)
            } else if version != HANDSHAKE_VERSION {
                Some(Refusal::Version {
                    theirs: version,
                    ours: HANDSHAKE_VERSION,
                })
            } else if !crate::token::tokens_match(&token, &inner.identity.cluster_token) {
                Some(Refusal::WrongToken { node })
            } else if node == inner.identity.node {
                Some(Refusal::OwnId { node })
            } else {
                None
            };
            (node, refusal)
        }
        other => {
            return Err(TcpHandshakeError::Unexpected {
                expected: "Hello",
                got: other.name(),
            })
        }
    };
    if let Some(refusal) = refusal {
        let _ = write_handshake(
            &mut stream,
            &Handshake::Refused {
                reason: refusal.to_string(),
            },
        )
        .await;
        return Err(refusal.into());
    }
    write_handshake(
        &mut stream,
        &Handshake::Welcome {
            node: inner.identity.node,
        },
    )
    .await?;
    let round_trips = measure_round_trips(&mut stream, false)
        .await
        .map_err(io_error("round trip"))?;
    start_connection(inner.clone(), peer, stream, round_trips);
    Ok(())
}

pub(super) async fn dial(inner: Arc<Inner>, peer: NodeId, addr: SocketAddr) {
    let attempt = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|source| TcpHandshakeError::Connect { addr, source })?;
        write_handshake(
            &mut stream,
            &Handshake::Hello {
                magic: HANDSHAKE_MAGIC,
                version: HANDSHAKE_VERSION,
                node: inner.identity.node,
                token: inner.identity.cluster_token.clone(),
            },
        )
        .await?;
        match read_handshake(&mut stream).await? {
            Handshake::Welcome { node } if node == peer => {}
            Handshake::Welcome { node } => {
                return Err(TcpHandshakeError::WrongNode {
                    addr,
                    found: node,
                    expected: peer,
                });
            }
            Handshake::Refused { reason } => {
                return Err(TcpHandshakeError::RefusedByPeer { peer, reason })
            }
            other => {
                return Err(TcpHandshakeError::Unexpected {
                    expected: "Welcome",
                    got: other.name(),
                })
            }
        }
        let round_trips = measure_round_trips(&mut stream, true)
            .await
            .map_err(io_error("round trip"))?;
        Ok((stream, round_trips))
    };
    let timeout = inner.config.connect_timeout;
    let outcome = match tokio::time::timeout(timeout, attempt).await {
        Ok(outcome) => outcome,
        Err(_) => Err(TcpHandshakeError::TimedOut {
            addr,
            timeout_ms: timeout.as_millis(),
        }),
    };
    // Drop the Connecting placeholder; `start_connection` installs the real one.
    inner.forget_connecting(peer);
    match outcome {
        Ok((stream, round_trips)) => start_connection(inner, peer, stream, round_trips),
        Err(error) => {
            warn!(%peer, %error, "cannot connect to peer");
            inner.emit(FabricEvent::PeerLost {
                peer,
                reason: error.to_string(),
            });
        }
    }
}

/// How the pings of one batch are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spacing {
    /// Each ping right after the previous pong: both ends' threads are awake.
    BackToBack,
    /// A pause before each ping, long enough for the far end's thread to sleep: each ping
    /// pays the wake-up a lone message pays on a quiet machine (none when both ends share a
    /// CPU).
    Paused,
}

/// The batches of [`PING_ROUNDS`] ping-pongs each way measured on every new connection.
const PING_BATCHES: [Spacing; 5] = [
    Spacing::BackToBack,
    Spacing::BackToBack,
    Spacing::BackToBack,
    Spacing::Paused,
    Spacing::Paused,
];

/// The pause before each ping of a [`Spacing::Paused`] batch.
const PING_PAUSE: Duration = Duration::from_millis(1);

/// This side's round trips measured at connect time, one summary per batch.
#[derive(Debug, Default)]
pub(super) struct MeasuredRoundTrips {
    /// Batches of back-to-back pings.
    pub(super) awake: Vec<RoundTripBatch>,
    /// Batches of pings after a pause.
    pub(super) idle: Vec<RoundTripBatch>,
}

/// Ping-pongs in both directions, in [`PING_BATCHES`]; returns this side's batches.
async fn measure_round_trips(
    stream: &mut TcpStream,
    dialer: bool,
) -> std::io::Result<MeasuredRoundTrips> {
    stream.set_nodelay(true)?;
    let mut measured = MeasuredRoundTrips::default();
    let mut frame = [0u8; 9];
    let mut nonce = 0u64;
    for spacing in PING_BATCHES {
        let mut samples = Vec::with_capacity(PING_ROUNDS);
        for turn in [dialer, !dialer] {
            for _ in 0..PING_ROUNDS {
                if turn {
                    if spacing == Spacing::Paused {
                        tokio::time::sleep(PING_PAUSE).await;
                    }
                    nonce += 1;
                    frame[0] = KIND_PING;
                    frame[1..].copy_from_slice(&nonce.to_le_bytes());
                    let started = Instant::now();
                    stream.write_all(&frame).await?;
                    stream.read_exact(&mut frame).await?;
                    samples.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
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
        let batches = match spacing {
            Spacing::BackToBack => &mut measured.awake,
            Spacing::Paused => &mut measured.idle,
        };
        batches.extend(RoundTripBatch::from_samples(&mut samples));
    }
    Ok(measured)
}
