//! The verbs fabric's own handshake on the TCP control stream, before the QP handshake of
//! [`crate::verbs::VerbsConnection`]: who is calling, proof that it knows the cluster token,
//! and how to READ its memory (the chunk table of every arena registration, so READs may cross
//! the boundaries of a split registration).
//!
//! ```text
//! connector                                   acceptor
//!   PREAMBLE, frame(Open{node, nonce_c}) ──►
//!                                   ◄─────      frame(Challenge{node, nonce_a})
//!   frame(Proven{proof_c, Hello})   ─────►      checks proof_c, node, slot size, duplicates
//!                                   ◄─────      frame(Reply::Accept{Hello, proof_a} | Refuse)
//!   checks proof_a, node, slot size
//!   frame(Verdict)                  ─────►
//!   ... QP handshake (verbs layer), cost probe (SEND ping-pong, READs) ...
//!   frame(Costs)                    ─────►
//! ```
//!
//! The token never travels: each side proves it with an HMAC over both nonces, both node ids
//! and the hellos sent so far ([`Transcript`]), so a recorded handshake fails against a fresh
//! nonce and a hello altered in flight (its memory keys) fails the proof. The acceptor reveals
//! nothing (not its proof, not its memory layout) to a caller that did not prove the token
//! first. Frames are a little-endian `u32` length and a postcard body, at most
//! [`MAX_FRAME_BYTES`]; every field is checked before use.

use std::net::TcpStream;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::token::{prove, verify, Nonce, Proof, Role};

/// Why the control-stream handshake failed.
pub(super) use crate::verbs::HandshakeError as ControlError;

use super::errors::HelloShapeError;

/// First bytes a connector writes: "Skyriver verbs fabric, handshake 3" (3: peer messages of
/// wire version 2, whose `Rendezvous` carries per-lane memory window keys).
pub(super) const PREAMBLE: [u8; 8] = *b"SKRVVF03";
/// The preamble of handshake version 2 (same handshake, older peer messages).
pub(super) const PREAMBLE_V2: [u8; 8] = *b"SKRVVF02";
/// The preamble of handshake version 1 (the token in clear), answered with a refusal that
/// version reads.
pub(super) const PREAMBLE_V1: [u8; 8] = *b"SKRVVF01";
/// Names this handshake in every proof.
const PROOF_CONTEXT: &[u8] = b"skyriver-verbs-fabric-v3";
/// Largest handshake frame.
pub(super) const MAX_FRAME_BYTES: usize = 1 << 20;
/// Most arenas a peer may announce.
pub(super) const MAX_ARENAS: usize = 1024;
/// Most memory regions a peer may announce, over all its arenas.
pub(super) const MAX_CHUNKS: usize = 16 * 1024;
/// Most probe pings a connector may ask the acceptor to echo.
pub(super) const MAX_PROBE_PINGS: u32 = 64;

/// A memory region as the wire carries it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WireChunk {
    /// Start address in the announcing node.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

/// One arena's registration: its memory regions, contiguous, in address order.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct WireArena {
    /// The arena's id.
    pub arena: u32,
    /// Its memory regions.
    pub chunks: Vec<WireChunk>,
}

/// What each side announces, once the connector proved the token.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
pub(super) struct Hello {
    /// The sender's node id.
    pub node: u32,
    /// The sender's device, for the summary line.
    pub device: String,
    /// The receive slot size the sender's core was configured with.
    pub recv_slot_bytes: u32,
    /// The sender's memory copy bandwidth, bytes/s (both sides use the lower one: an eager
    /// transfer copies on both).
    pub copy_bytes_per_sec: f64,
    /// Connector: pings it will send for the cost probe (the acceptor echoes them).
    /// Acceptor: 0.
    pub probe_pings: u32,
    /// A registered scratch buffer the peer may READ for the bandwidth probe.
    pub probe_region: WireChunk,
    /// Every arena's registration.
    pub arenas: Vec<WireArena>,
}

impl Hello {
    /// Checks the limits and the shape of the chunk tables.
    pub(super) fn validate(&self) -> Result<(), HelloShapeError> {
        if self.probe_pings > MAX_PROBE_PINGS {
            return Err(HelloShapeError::TooManyPings {
                pings: self.probe_pings,
                limit: MAX_PROBE_PINGS,
            });
        }
        if self.recv_slot_bytes == 0 {
            return Err(HelloShapeError::ZeroSlot);
        }
        if self.arenas.len() > MAX_ARENAS {
            return Err(HelloShapeError::TooManyArenas {
                arenas: self.arenas.len(),
                limit: MAX_ARENAS,
            });
        }
        let chunks: usize = self.arenas.iter().map(|a| a.chunks.len()).sum();
        if chunks > MAX_CHUNKS {
            return Err(HelloShapeError::TooManyChunks {
                chunks,
                limit: MAX_CHUNKS,
            });
        }
        for a in &self.arenas {
            if a.chunks.is_empty() {
                return Err(HelloShapeError::NoRegion { arena: a.arena });
            }
            for c in &a.chunks {
                if c.len == 0 || c.addr.checked_add(c.len).is_none() {
                    return Err(HelloShapeError::BadRegion {
                        arena: a.arena,
                        addr: c.addr,
                        len: c.len,
                    });
                }
            }
            for w in a.chunks.windows(2) {
                if w[0].addr + w[0].len != w[1].addr {
                    return Err(HelloShapeError::NotContiguous { arena: a.arena });
                }
            }
        }
        Ok(())
    }
}

/// The connector's first frame.
#[derive(Serialize, Deserialize, Debug)]
pub(super) struct Open {
    /// The connector's node id.
    pub node: u32,
    /// The connector's fresh nonce.
    pub nonce: Nonce,
}

/// The acceptor's answer to [`Open`].
#[derive(Serialize, Deserialize, Debug)]
pub(super) struct Challenge {
    /// The acceptor's node id.
    pub node: u32,
    /// The acceptor's fresh nonce.
    pub nonce: Nonce,
}

/// The connector's proof of the token and its hello.
#[derive(Serialize, Deserialize, Debug)]
pub(super) struct Proven {
    /// [`Transcript::connector_proof`].
    pub proof: Proof,
    /// The connector's hello.
    pub hello: Hello,
}

/// The acceptor's hello and its proof of the token.
#[derive(Serialize, Deserialize, Debug)]
pub(super) struct Accepted {
    /// The acceptor's hello.
    pub hello: Hello,
    /// [`Transcript::acceptor_proof`].
    pub proof: Proof,
}

/// The acceptor's answer to a connector's [`Proven`]. `Refuse` keeps the place it had in
/// version 1, which reads it after its hello.
#[derive(Serialize, Deserialize)]
pub(super) enum Reply {
    /// Accepted; here is the acceptor's hello and proof.
    Accept(Accepted),
    /// Refused, with the reason (for both sides' logs).
    Refuse(String),
    /// Both nodes are connecting to each other at once; the acceptor's own outgoing connection
    /// (opened by the lower node id) wins, and the connector should wait for it to arrive.
    Yield(String),
}

/// The connector's answer to the acceptor's [`Hello`].
#[derive(Serialize, Deserialize, Debug)]
pub(super) enum Verdict {
    /// Both sides agree: go on with the QP handshake.
    Accept,
    /// Refused, with the reason.
    Refuse(String),
}

/// What the proofs of one handshake cover: both nonces and node ids, and the hellos.
pub(super) struct Transcript {
    /// The connector's nonce.
    pub connector_nonce: Nonce,
    /// The acceptor's nonce.
    pub acceptor_nonce: Nonce,
    /// The connector's node id.
    pub connector: u32,
    /// The acceptor's node id.
    pub acceptor: u32,
}

/// A node id and, if given, a digest of its hello.
fn identity(node: u32, hello: Option<&Hello>) -> Vec<u8> {
    let mut id = node.to_le_bytes().to_vec();
    if let Some(hello) = hello {
        // Encoding our own hello type cannot fail (postcard supports every field type).
        let bytes = postcard::to_stdvec(hello).expect("a hello always serialises");
        id.extend_from_slice(&Sha256::digest(&bytes));
    }
    id
}

impl Transcript {
    fn proof_input<'a>(
        &'a self,
        connector: &'a [u8],
        acceptor: &'a [u8],
    ) -> crate::token::Transcript<'a> {
        crate::token::Transcript {
            context: PROOF_CONTEXT,
            dialer_nonce: &self.connector_nonce,
            acceptor_nonce: &self.acceptor_nonce,
            dialer: connector,
            acceptor,
        }
    }

    /// The connector's proof: over the nonces, both ids and its hello.
    pub(super) fn connector_proof(&self, token: &str, hello: &Hello) -> Proof {
        let (c, a) = (
            identity(self.connector, Some(hello)),
            identity(self.acceptor, None),
        );
        prove(token, Role::Dialer, &self.proof_input(&c, &a))
    }

    /// Whether `proof` is the connector's proof for `hello`.
    pub(super) fn check_connector(&self, token: &str, hello: &Hello, proof: &Proof) -> bool {
        let (c, a) = (
            identity(self.connector, Some(hello)),
            identity(self.acceptor, None),
        );
        verify(token, Role::Dialer, &self.proof_input(&c, &a), proof)
    }

    /// The acceptor's proof: over the nonces, both ids and both hellos.
    pub(super) fn acceptor_proof(&self, token: &str, connector: &Hello, acceptor: &Hello) -> Proof {
        let c = identity(self.connector, Some(connector));
        let a = identity(self.acceptor, Some(acceptor));
        prove(token, Role::Acceptor, &self.proof_input(&c, &a))
    }

    /// Whether `proof` is the acceptor's proof for the two hellos.
    pub(super) fn check_acceptor(
        &self,
        token: &str,
        connector: &Hello,
        acceptor: &Hello,
        proof: &Proof,
    ) -> bool {
        let c = identity(self.connector, Some(connector));
        let a = identity(self.acceptor, Some(acceptor));
        verify(token, Role::Acceptor, &self.proof_input(&c, &a), proof)
    }
}

/// Which handshake a connector opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Preamble {
    /// This version.
    Current,
    /// Version 1: it sent its token in clear and waits for a [`Reply`].
    Version1,
    /// Version 2: the same handshake, but peer messages this node cannot decode.
    Version2,
}

/// What the connector measured, so both sides use the same path costs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(super) struct CostsFrame {
    /// Whether the numbers were measured (or are defaults).
    pub measured: bool,
    /// Round trip, ns.
    pub round_trip_ns: f64,
    /// Per-message cost, ns.
    pub message_overhead_ns: f64,
    /// READ bandwidth, bytes/s.
    pub wire_bytes_per_sec: f64,
    /// READ setup beyond the round trip, ns.
    pub read_setup_ns: f64,
    /// How it went, for the summary line.
    pub note: String,
}

/// The control stream of the verbs layer ([`crate::verbs::Control`]: one deadline over every
/// read and write) carrying this handshake's frames.
pub(super) struct Control<'a>(crate::verbs::Control<'a>);

impl<'a> Control<'a> {
    pub(super) fn new(stream: &'a mut TcpStream, budget: Duration) -> Result<Self, ControlError> {
        crate::verbs::Control::new(stream, budget).map(Control)
    }

    pub(super) fn write_frame<T: Serialize>(&mut self, value: &T) -> Result<(), ControlError> {
        let body = postcard::to_stdvec(value)
            .map_err(|e| ControlError::Malformed(format!("encoding a frame: {e}")))?;
        if body.len() > MAX_FRAME_BYTES {
            return Err(ControlError::Malformed(format!(
                "frame of {} bytes over the {MAX_FRAME_BYTES}-byte limit",
                body.len()
            )));
        }
        let mut out = Vec::with_capacity(4 + body.len());
        // Cannot truncate: at most MAX_FRAME_BYTES (checked above).
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        self.0.write_all(&out)
    }

    pub(super) fn read_frame<T: DeserializeOwned>(&mut self) -> Result<T, ControlError> {
        let mut len = [0u8; 4];
        self.0.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(ControlError::Malformed(format!(
                "frame of {len} bytes over the {MAX_FRAME_BYTES}-byte limit"
            )));
        }
        let mut body = vec![0u8; len];
        self.0.read_exact(&mut body)?;
        postcard::from_bytes(&body).map_err(|e| ControlError::Malformed(e.to_string()))
    }

    pub(super) fn write_preamble(&mut self) -> Result<(), ControlError> {
        self.0.write_all(&PREAMBLE)
    }

    pub(super) fn read_preamble(&mut self) -> Result<Preamble, ControlError> {
        let mut p = [0u8; 8];
        self.0.read_exact(&mut p)?;
        match p {
            PREAMBLE => Ok(Preamble::Current),
            PREAMBLE_V1 => Ok(Preamble::Version1),
            PREAMBLE_V2 => Ok(Preamble::Version2),
            _ => Err(ControlError::Malformed(
                "wrong preamble (not a Skyriver verbs fabric peer, or another version)".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            node: 7,
            device: "rxe0".into(),
            recv_slot_bytes: 65536,
            copy_bytes_per_sec: 5e9,
            probe_pings: 24,
            probe_region: WireChunk {
                addr: 0x1000,
                len: 4096,
                rkey: 9,
            },
            arenas: vec![WireArena {
                arena: 0,
                chunks: vec![
                    WireChunk {
                        addr: 0x10000,
                        len: 0x1000,
                        rkey: 1,
                    },
                    WireChunk {
                        addr: 0x11000,
                        len: 0x800,
                        rkey: 2,
                    },
                ],
            }],
        }
    }

    #[test]
    fn hello_round_trips_and_validates() {
        let h = hello();
        let bytes = postcard::to_stdvec(&h).unwrap();
        let back: Hello = postcard::from_bytes(&bytes).unwrap();
        assert!(back == h);
        assert_eq!(h.validate(), Ok(()));
        // Every truncation and single-byte corruption decodes or errors, never panics.
        for i in 0..bytes.len() {
            let _ = postcard::from_bytes::<Hello>(&bytes[..i]);
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            if let Ok(h) = postcard::from_bytes::<Hello>(&b) {
                let _ = h.validate();
            }
        }
    }

    #[test]
    fn bad_hellos_are_refused() {
        let mut h = hello();
        h.arenas[0].chunks[1].addr += 1;
        assert!(matches!(
            h.validate(),
            Err(HelloShapeError::NotContiguous { .. })
        ));
        let mut h = hello();
        h.arenas[0].chunks.clear();
        assert!(h.validate().is_err());
        let mut h = hello();
        h.probe_pings = MAX_PROBE_PINGS + 1;
        assert!(h.validate().is_err());
        let mut h = hello();
        h.arenas[0].chunks[0].addr = u64::MAX;
        assert!(h.validate().is_err());
    }

    #[test]
    fn proofs_bind_the_nonces_the_ids_and_the_hellos() {
        let t = Transcript {
            connector_nonce: [1; 32],
            acceptor_nonce: [2; 32],
            connector: 7,
            acceptor: 8,
        };
        let (mine, mut theirs) = (hello(), hello());
        theirs.node = 8;
        let proof = t.connector_proof("secret", &mine);
        assert!(t.check_connector("secret", &mine, &proof));
        assert!(!t.check_connector("other", &mine, &proof));
        // A hello altered in flight (another memory key) fails the proof.
        let mut altered = mine.clone();
        altered.arenas[0].chunks[0].rkey = 99;
        assert!(!t.check_connector("secret", &altered, &proof));
        // Replayed against a fresh acceptor nonce.
        let fresh = Transcript {
            acceptor_nonce: [3; 32],
            ..t
        };
        assert!(!fresh.check_connector("secret", &mine, &proof));
        // The acceptor's proof is another value, and covers its own hello too.
        let back = t.acceptor_proof("secret", &mine, &theirs);
        assert_ne!(back, proof);
        assert!(t.check_acceptor("secret", &mine, &theirs, &back));
        assert!(!t.check_acceptor("secret", &mine, &mine, &back));
        assert!(!t.check_acceptor("other", &mine, &theirs, &back));
    }

    #[test]
    fn a_version_1_connector_reads_this_versions_refusal() {
        /// Version 1's reply, as that version decodes it.
        #[derive(Deserialize)]
        #[allow(dead_code)]
        enum ReplyV1 {
            Accept(Vec<u8>),
            Refuse(String),
            Yield(String),
        }
        let bytes = postcard::to_stdvec(&Reply::Refuse("speak version 2".into())).unwrap();
        match postcard::from_bytes::<ReplyV1>(&bytes).unwrap() {
            ReplyV1::Refuse(reason) => assert_eq!(reason, "speak version 2"),
            _ => panic!("a refusal"),
        }
    }
}
