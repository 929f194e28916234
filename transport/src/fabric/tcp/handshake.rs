//! Connection set-up of the TCP fabric: the accept loop, the authenticated handshake both ways
//! (postcard, versioned) and the ping-pong that measures the round trip.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skyriver_core::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use super::connection::start_connection;
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

pub(super) async fn dial(inner: Arc<Inner>, peer: NodeId, addr: SocketAddr) {
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
