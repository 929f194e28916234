//! Connection set-up of the TCP fabric: the accept loop, the authenticated handshake both ways
//! (postcard, versioned) and the ping-pong that measures the round trip.
//!
//! The handshake is a mutual challenge-response; the token never crosses the wire:
//!
//! ```text
//!   dialer                                      acceptor
//!   Hello {magic, version, node, nonce_d}  ──►  checks magic, version, node
//!                                          ◄──  Challenge {node, nonce_a}
//!   Proof {HMAC(token, dialer, transcript)} ──►  checks the proof
//!                                          ◄──  Welcome {node, HMAC(token, acceptor, transcript)}
//!   checks the proof; both measure the round trip
//! ```
//!
//! The transcript holds both nonces and both node ids, so a recorded handshake fails against a
//! fresh nonce, and the acceptor proves nothing to a caller that did not prove first.

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
use crate::token::{fresh_nonce, prove, verify, Nonce, Proof as TokenProof, Role, Transcript};

/// The handshake's frames. The order of the variants and the first fields of `Hello` are
/// those of version 1, so an old peer still reads the version (and says which one it
/// speaks) and understands `Refused`.
#[derive(Debug, Serialize, Deserialize)]
enum Handshake {
    Hello {
        magic: [u8; 8],
        version: u32,
        node: NodeId,
        /// Always empty: the place version 1 sent its token in.
        legacy_token: String,
        nonce: Nonce,
    },
    Welcome {
        node: NodeId,
        proof: TokenProof,
    },
    Refused {
        reason: String,
    },
    Challenge {
        node: NodeId,
        nonce: Nonce,
    },
    Proof {
        proof: TokenProof,
    },
}

/// Names this protocol in every proof.
const PROOF_CONTEXT: &[u8] = b"skyriver-tcp-fabric-v2";

/// The transcript both sides prove over.
fn transcript<'a>(nonces: &'a (Nonce, Nonce), ids: &'a ([u8; 4], [u8; 4])) -> Transcript<'a> {
    Transcript {
        context: PROOF_CONTEXT,
        dialer_nonce: &nonces.0,
        acceptor_nonce: &nonces.1,
        dialer: &ids.0,
        acceptor: &ids.1,
    }
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
            Handshake::Challenge { .. } => "Challenge",
            Handshake::Proof { .. } => "Proof",
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
    // One write per frame: a length and a body written apart would wait on Nagle's algorithm
    // for the peer's delayed ACK at every step of the handshake.
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    stream.write_all(&frame).await.map_err(io_error("write"))
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
    decode_handshake(&body)
}

/// Decodes a frame; a `Hello` of another version is told apart from garbage by its first
/// fields (variant, magic, version), which every version keeps.
fn decode_handshake(body: &[u8]) -> Result<Handshake, TcpHandshakeError> {
    if let Ok(((0u32, magic, version), _)) = postcard::take_from_bytes::<(u32, [u8; 8], u32)>(body)
    {
        if magic == HANDSHAKE_MAGIC && version != HANDSHAKE_VERSION {
            return Err(Refusal::Version {
                theirs: version,
                ours: HANDSHAKE_VERSION,
            }
            .into());
        }
    }
    postcard::from_bytes(body).map_err(|source| TcpHandshakeError::Malformed { source })
}

async fn accept_handshake(
    inner: &Arc<Inner>,
    mut stream: TcpStream,
) -> Result<(), TcpHandshakeError> {
    let hello = match read_handshake(&mut stream).await {
        Err(TcpHandshakeError::Refused(refusal)) => {
            refuse(&mut stream, &refusal).await;
            return Err(refusal.into());
        }
        other => other?,
    };
    let (peer, dialer_nonce) = match hello {
        Handshake::Hello {
            magic,
            version,
            node,
            nonce,
            ..
        } => {
            let refusal = if magic != HANDSHAKE_MAGIC {
                Some(Refusal::NotSkyriver)
            } else if version != HANDSHAKE_VERSION {
                Some(Refusal::Version {
                    theirs: version,
                    ours: HANDSHAKE_VERSION,
                })
            } else if node == inner.identity.node {
                Some(Refusal::OwnId { node })
            } else {
                None
            };
            if let Some(refusal) = refusal {
                refuse(&mut stream, &refusal).await;
                return Err(refusal.into());
            }
            (node, nonce)
        }
        other => {
            return Err(TcpHandshakeError::Unexpected {
                expected: "Hello",
                got: other.name(),
            })
        }
    };
    let nonces = (dialer_nonce, fresh_nonce());
    let ids = (peer.0.to_le_bytes(), inner.identity.node.0.to_le_bytes());
    let transcript = transcript(&nonces, &ids);
    write_handshake(
        &mut stream,
        &Handshake::Challenge {
            node: inner.identity.node,
            nonce: nonces.1,
        },
    )
    .await?;
    let token = inner.identity.cluster_token.expose_secret();
    match read_handshake(&mut stream).await? {
        Handshake::Proof { proof } if verify(token, Role::Dialer, &transcript, &proof) => {}
        Handshake::Proof { .. } => {
            let refusal = Refusal::WrongToken { node: peer };
            refuse(&mut stream, &refusal).await;
            return Err(refusal.into());
        }
        other => {
            return Err(TcpHandshakeError::Unexpected {
                expected: "Proof",
                got: other.name(),
            })
        }
    }
    write_handshake(
        &mut stream,
        &Handshake::Welcome {
            node: inner.identity.node,
            proof: prove(token, Role::Acceptor, &transcript),
        },
    )
    .await?;
    let round_trips = measure_round_trips(&mut stream, false)
        .await
        .map_err(io_error("round trip"))?;
    // The place of its `PeerConnected`, waited for before the connection is installed.
    let Ok(connected) = inner.events.reserve().await else {
        return Ok(()); // The driver is gone.
    };
    start_connection(inner.clone(), peer, stream, round_trips, connected);
    Ok(())
}

/// Tells the peer why it is refused (best effort: the connection closes anyway).
async fn refuse(stream: &mut TcpStream, refusal: &Refusal) {
    let _ = write_handshake(
        stream,
        &Handshake::Refused {
            reason: refusal.to_string(),
        },
    )
    .await;
}

pub(super) async fn dial(inner: Arc<Inner>, peer: NodeId, addr: SocketAddr) {
    let attempt = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|source| TcpHandshakeError::Connect { addr, source })?;
        let me = inner.identity.node;
        let dialer_nonce = fresh_nonce();
        write_handshake(
            &mut stream,
            &Handshake::Hello {
                magic: HANDSHAKE_MAGIC,
                version: HANDSHAKE_VERSION,
                node: me,
                legacy_token: String::new(),
                nonce: dialer_nonce,
            },
        )
        .await?;
        let acceptor_nonce = match read_handshake(&mut stream).await? {
            Handshake::Challenge { node, nonce } if node == peer => nonce,
            Handshake::Challenge { node, .. } => {
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
                    expected: "Challenge",
                    got: other.name(),
                })
            }
        };
        let nonces = (dialer_nonce, acceptor_nonce);
        let ids = (me.0.to_le_bytes(), peer.0.to_le_bytes());
        let transcript = transcript(&nonces, &ids);
        let token = inner.identity.cluster_token.expose_secret();
        write_handshake(
            &mut stream,
            &Handshake::Proof {
                proof: prove(token, Role::Dialer, &transcript),
            },
        )
        .await?;
        match read_handshake(&mut stream).await? {
            Handshake::Welcome { node, proof }
                if node == peer && verify(token, Role::Acceptor, &transcript, &proof) => {}
            Handshake::Welcome { .. } => return Err(TcpHandshakeError::PeerLacksToken { peer }),
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
    // The place of the outcome's event (`PeerConnected` or `PeerLost`), waited for while the
    // peer's slot still says connecting, so the driver dials nobody twice meanwhile.
    let Ok(place) = inner.events.reserve().await else {
        return; // The driver is gone.
    };
    // Drop the Connecting placeholder; `start_connection` installs the real one.
    inner.forget_connecting(peer);
    match outcome {
        Ok((stream, round_trips)) => start_connection(inner, peer, stream, round_trips, place),
        Err(error) => {
            // The daemon logs the PeerLost that follows, once per change of state.
            tracing::debug!(%peer, %error, "cannot connect to peer");
            place.send(FabricEvent::PeerLost {
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

/// The pause before each ping of a [`Spacing::Paused`] batch: longer than a daemon polls
/// before it sleeps (`--poll-us`, 50 µs by default), so the far end's thread is asleep, and
/// short enough that the whole measurement stays at a few milliseconds (a fetch waits only
/// briefly for a holder's connection).
const PING_PAUSE: Duration = Duration::from_micros(200);

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

/// Entry points for the fuzz targets (`fuzz/`).
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Decodes `body` as both sides decode a handshake frame and checks what decodes: it
    /// encodes to a frame that decodes to the same encoding, and a `Hello` of another version
    /// never decodes (it is refused with the version instead). Returns whether `body` decoded.
    ///
    /// # Panics
    /// If a decoded frame does not survive the round trip.
    pub fn handshake_frame(body: &[u8]) -> bool {
        let Ok(frame) = decode_handshake(body) else {
            return false;
        };
        let encoded = postcard::to_stdvec(&frame).expect("a decoded frame encodes");
        let again = decode_handshake(&encoded).expect("an encoded frame decodes");
        assert_eq!(
            postcard::to_stdvec(&again).expect("a decoded frame encodes"),
            encoded,
            "{} changed in a round trip",
            frame.name()
        );
        if let Handshake::Hello { magic, version, .. } = frame {
            assert!(magic != HANDSHAKE_MAGIC || version == HANDSHAKE_VERSION);
        }
        true
    }

    /// A body of every frame, as an honest peer sends it: where the fuzzer starts.
    pub fn seeds() -> Vec<Vec<u8>> {
        let frames = [
            Handshake::Hello {
                magic: HANDSHAKE_MAGIC,
                version: HANDSHAKE_VERSION,
                node: NodeId(7),
                legacy_token: String::new(),
                nonce: [1; 32],
            },
            Handshake::Challenge {
                node: NodeId(1),
                nonce: [2; 32],
            },
            Handshake::Proof { proof: [3; 32] },
            Handshake::Welcome {
                node: NodeId(1),
                proof: [4; 32],
            },
            Handshake::Refused {
                reason: "version 1 is not supported".into(),
            },
        ];
        frames
            .iter()
            .map(|frame| postcard::to_stdvec(frame).expect("a frame encodes"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    //! The handshake against callers that do not follow it: frames written by hand to a real
    //! acceptor, and a hand-written acceptor a real dialer connects to.

    use std::collections::BTreeMap;
    use std::io::{Read, Write};
    use std::net::{TcpListener as StdListener, TcpStream as StdStream};

    use crate::fabric::{event_channel, EventReceiver};

    use super::*;
    use crate::fabric::tcp::{TcpFabric, TcpFabricConfig};
    use crate::fabric::{Fabric, FabricIdentity};
    use crate::{ArenaOptions, SharedArena};

    fn fabric(id: u32, token: &str) -> (TcpFabric, EventReceiver) {
        let arena = SharedArena::create("handshake", 1 << 20, &ArenaOptions::default()).unwrap();
        let arenas = BTreeMap::from([(skyriver_core::ArenaId(0), Arc::new(arena))]);
        let (tx, events) = event_channel();
        let identity = FabricIdentity {
            node: NodeId(id),
            cluster_token: token.into(),
        };
        let config = TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
        (
            TcpFabric::start(config, identity, arenas, tx).unwrap(),
            events,
        )
    }

    fn send(stream: &mut StdStream, message: &Handshake) {
        let body = postcard::to_stdvec(message).unwrap();
        stream
            .write_all(&(body.len() as u32).to_le_bytes())
            .unwrap();
        stream.write_all(&body).unwrap();
    }

    /// The next frame, or `None` when the peer closed.
    fn receive(stream: &mut StdStream) -> Option<Handshake> {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).ok()?;
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        stream.read_exact(&mut body).ok()?;
        Some(decode_handshake(&body).unwrap())
    }

    fn dial(addr: SocketAddr) -> StdStream {
        let stream = StdStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    }

    fn hello(node: u32, nonce: Nonce) -> Handshake {
        Handshake::Hello {
            magic: HANDSHAKE_MAGIC,
            version: HANDSHAKE_VERSION,
            node: NodeId(node),
            legacy_token: String::new(),
            nonce,
        }
    }

    /// The node an honest marker session comes from, after the attempts under test.
    const MARKER_NODE: u32 = 99;

    /// Checks that the attempts made so far (each already closed by the acceptor) reported
    /// nothing: an honest session from [`MARKER_NODE`] follows them, and its `PeerConnected`
    /// must be the first event. Events come in order, so an event for an earlier attempt would
    /// come before it; no quiet period is waited for.
    fn assert_no_session(addr: SocketAddr, events: &mut EventReceiver) {
        let (_marker, _, _) = honest_dialer(addr, "secret", MARKER_NODE);
        match events.blocking_recv() {
            Some(FabricEvent::PeerConnected { peer, .. }) if peer == NodeId(MARKER_NODE) => {}
            other => panic!("the acceptor reported {other:?} before the marker session"),
        }
    }

    /// Plays node `node`, a dialer holding `token`, against `addr`; returns its frames as sent.
    fn honest_dialer(
        addr: SocketAddr,
        token: &str,
        node: u32,
    ) -> (StdStream, Handshake, Handshake) {
        let mut stream = dial(addr);
        let nonce = fresh_nonce();
        send(&mut stream, &hello(node, nonce));
        let Some(Handshake::Challenge {
            node: acceptor,
            nonce: theirs,
        }) = receive(&mut stream)
        else {
            panic!("no challenge");
        };
        let nonces = (nonce, theirs);
        let ids = (node.to_le_bytes(), acceptor.0.to_le_bytes());
        let proof = Handshake::Proof {
            proof: prove(token, Role::Dialer, &transcript(&nonces, &ids)),
        };
        send(&mut stream, &proof);
        assert!(matches!(
            receive(&mut stream),
            Some(Handshake::Welcome { .. })
        ));
        // The round trip measurement, as the dialer plays it: every batch, pings then pongs
        // (the pauses are the pinger's choice and left out here).
        let mut frame = [0u8; 9];
        for _ in PING_BATCHES {
            for _ in 0..PING_ROUNDS {
                frame[0] = KIND_PING;
                stream.write_all(&frame).unwrap();
                stream.read_exact(&mut frame).unwrap();
            }
            for _ in 0..PING_ROUNDS {
                stream.read_exact(&mut frame).unwrap();
                frame[0] = KIND_PONG;
                stream.write_all(&frame).unwrap();
            }
        }
        (stream, hello(node, nonce), proof)
    }

    #[test]
    fn a_replayed_handshake_gets_no_session() {
        let (acceptor, mut events) = fabric(1, "secret");
        let addr = acceptor.listen_addr();
        // A real session, recorded by someone on the path.
        let (_session, recorded_hello, recorded_proof) = honest_dialer(addr, "secret", 7);
        assert!(matches!(
            events.blocking_recv(),
            Some(FabricEvent::PeerConnected { .. })
        ));
        // The same frames again: the acceptor's nonce is new, so the proof does not hold.
        let mut stream = dial(addr);
        send(&mut stream, &recorded_hello);
        assert!(matches!(
            receive(&mut stream),
            Some(Handshake::Challenge { .. })
        ));
        send(&mut stream, &recorded_proof);
        match receive(&mut stream) {
            Some(Handshake::Refused { reason }) => assert!(reason.contains("token"), "{reason}"),
            other => panic!("a replayed proof got {other:?}"),
        }
        assert!(receive(&mut stream).is_none(), "the connection stays open");
        assert_no_session(addr, &mut events);
    }

    #[test]
    fn a_caller_without_the_token_is_refused_and_learns_no_proof() {
        let (acceptor, mut events) = fabric(1, "secret");
        for token in ["", "Secret", "secret "] {
            let mut stream = dial(acceptor.listen_addr());
            let nonce = fresh_nonce();
            send(&mut stream, &hello(7, nonce));
            let Some(Handshake::Challenge { nonce: theirs, .. }) = receive(&mut stream) else {
                panic!("no challenge");
            };
            let nonces = (nonce, theirs);
            let ids = (7u32.to_le_bytes(), 1u32.to_le_bytes());
            let proof = prove(token, Role::Dialer, &transcript(&nonces, &ids));
            send(&mut stream, &Handshake::Proof { proof });
            assert!(
                matches!(receive(&mut stream), Some(Handshake::Refused { .. })),
                "token {token:?}"
            );
        }
        // Skipping the proof altogether.
        let mut stream = dial(acceptor.listen_addr());
        send(&mut stream, &hello(7, fresh_nonce()));
        receive(&mut stream);
        send(&mut stream, &hello(7, fresh_nonce()));
        assert!(receive(&mut stream).is_none());
        assert_no_session(acceptor.listen_addr(), &mut events);
    }

    #[test]
    fn a_version_1_peer_is_told_which_version_is_spoken() {
        #[derive(Serialize)]
        enum OldHandshake {
            Hello {
                magic: [u8; 8],
                version: u32,
                node: NodeId,
                token: String,
            },
        }
        let (acceptor, mut events) = fabric(1, "secret");
        let mut stream = dial(acceptor.listen_addr());
        let old = OldHandshake::Hello {
            magic: HANDSHAKE_MAGIC,
            version: 1,
            node: NodeId(7),
            token: "secret".into(),
        };
        let body = postcard::to_stdvec(&old).unwrap();
        stream
            .write_all(&(body.len() as u32).to_le_bytes())
            .unwrap();
        stream.write_all(&body).unwrap();
        match receive(&mut stream) {
            Some(Handshake::Refused { reason }) => assert!(
                reason.contains("version 1 is not supported")
                    && reason.contains(&format!("speaks {HANDSHAKE_VERSION}")),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(receive(&mut stream).is_none(), "the connection stays open");
        assert_no_session(acceptor.listen_addr(), &mut events);
    }

    #[test]
    fn a_dialer_drops_an_acceptor_that_cannot_prove_the_token() {
        let (dialer, mut events) = fabric(2, "secret");
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let impostor = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let Some(Handshake::Hello { .. }) = receive(&mut stream) else {
                panic!("no hello");
            };
            let nonce = fresh_nonce();
            send(
                &mut stream,
                &Handshake::Challenge {
                    node: NodeId(1),
                    nonce,
                },
            );
            // The dialer's proof is of no use without the token: answer with a guess.
            assert!(matches!(
                receive(&mut stream),
                Some(Handshake::Proof { .. })
            ));
            send(
                &mut stream,
                &Handshake::Welcome {
                    node: NodeId(1),
                    proof: [0; 32],
                },
            );
            // The dialer closes instead of measuring the round trip.
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
        });
        dialer.connect(NodeId(1), addr);
        match events.blocking_recv() {
            Some(FabricEvent::PeerLost { reason, .. }) => {
                assert!(reason.contains("could not prove"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        drop(dialer);
        impostor.join().unwrap();
    }
}
