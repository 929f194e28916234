//! The verbs fabric's own handshake on the TCP control stream, before the QP handshake of
//! [`crate::verbs::VerbsConnection`]: who is calling, with which cluster token, and how to READ
//! its memory (the chunk table of every arena registration, so READs may cross the boundaries
//! of a split registration).
//!
//! ```text
//! connector                                   acceptor
//!   PREAMBLE, frame(Hello)          ─────►      checks token, node, slot size, duplicates
//!                                   ◄─────      frame(Reply::Accept(Hello) | Reply::Refuse)
//!   checks token, node, slot size
//!   frame(Verdict)                  ─────►
//!   ... QP handshake (verbs layer), cost probe (SEND ping-pong, READs) ...
//!   frame(Costs)                    ─────►
//! ```
//!
//! The acceptor reveals nothing (not its token, not its memory layout) to a caller that did not
//! present the cluster token. Frames are a little-endian `u32` length and a postcard body, at
//! most [`MAX_FRAME_BYTES`]; every field is checked before use.

use std::net::TcpStream;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why the control-stream handshake failed.
pub(super) use crate::verbs::HandshakeError as ControlError;

use super::errors::HelloShapeError;

/// First bytes a connector writes: "Skyriver verbs fabric, handshake 1".
pub(super) const PREAMBLE: [u8; 8] = *b"SKRVVF01";
/// Largest handshake frame.
pub(super) const MAX_FRAME_BYTES: usize = 1 << 20;
/// Most arenas a peer may announce.
pub(super) const MAX_ARENAS: usize = 1024;
/// Most memory regions a peer may announce, over all its arenas.
pub(super) const MAX_CHUNKS: usize = 16 * 1024;
/// Longest cluster token.
pub(super) const MAX_TOKEN_BYTES: usize = 4096;
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

/// What each side announces. No `Debug`: it holds the token.
#[derive(Serialize, Deserialize, Clone, PartialEq)]
pub(super) struct Hello {
    /// The sender's node id.
    pub node: u32,
    /// The sender's cluster token.
    pub token: String,
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
        if self.token.len() > MAX_TOKEN_BYTES {
            return Err(HelloShapeError::TokenTooLong {
                limit: MAX_TOKEN_BYTES,
            });
        }
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

/// The acceptor's answer to a connector's [`Hello`].
#[derive(Serialize, Deserialize)]
pub(super) enum Reply {
    /// Accepted; here is the acceptor's hello.
    Accept(Hello),
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

    pub(super) fn read_preamble(&mut self) -> Result<(), ControlError> {
        let mut p = [0u8; 8];
        self.0.read_exact(&mut p)?;
        if p != PREAMBLE {
            return Err(ControlError::Malformed(
                "wrong preamble (not a Skyriver verbs fabric peer, or another version)".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            node: 7,
            token: "secret".into(),
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
        let mut h = hello();
        h.token = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(h.validate().is_err());
    }
}
