//! The connection handshake: a fixed-layout little-endian message each side writes on the
//! TCP control stream, then a one-word "ready" once its QPs are in RTS with receives posted.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Most queue pairs ("lanes") one connection may use.
pub const MAX_LANES: usize = 16;

const MAGIC: [u8; 4] = *b"SKRV";
const VERSION: u16 = 1;
const READY: [u8; 4] = *b"RDY1";
/// Encoded size of a [`Hello`].
pub(crate) const HELLO_BYTES: usize = 4 + 2 + 2 + 4 + 4 + 4 + 4 + 2 + 2 + 16 + MAX_LANES * 8;

/// Why the handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Reading or writing the control stream failed.
    #[error("control stream {op} failed")]
    Io {
        /// "read" or "write".
        op: &'static str,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// The deadline passed.
    #[error("handshake timed out after {0:?}")]
    Timeout(Duration),
    /// The peer's message is not a Skyriver verbs handshake.
    #[error("bad handshake from peer: {0}")]
    Malformed(String),
}

/// What each side announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Path MTU in bytes (256..4096, a power of two).
    pub mtu_bytes: u32,
    /// Outstanding READs it supports per QP, in both directions.
    pub max_rd_atomic: u32,
    /// Receive slot size it offers.
    pub recv_slot_bytes: u32,
    /// Receive slots per lane it offers.
    pub recv_slots: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// GID.
    pub gid: [u8; 16],
    /// (QPN, initial PSN) of each of its lanes.
    pub lanes: Vec<(u32, u32)>,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        assert!(!self.lanes.is_empty() && self.lanes.len() <= MAX_LANES);
        let mut b = [0u8; HELLO_BYTES];
        let mut w = Writer { buf: &mut b, at: 0 };
        w.put(&MAGIC);
        w.put(&VERSION.to_le_bytes());
        // Cannot truncate: at most MAX_LANES (asserted above).
        w.put(&(self.lanes.len() as u16).to_le_bytes());
        w.put(&self.mtu_bytes.to_le_bytes());
        w.put(&self.max_rd_atomic.to_le_bytes());
        w.put(&self.recv_slot_bytes.to_le_bytes());
        w.put(&self.recv_slots.to_le_bytes());
        w.put(&self.lid.to_le_bytes());
        w.put(&0u16.to_le_bytes());
        w.put(&self.gid);
        for &(qpn, psn) in &self.lanes {
            w.put(&qpn.to_le_bytes());
            w.put(&psn.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello, HandshakeError> {
        let bad = |s: String| HandshakeError::Malformed(s);
        let mut r = Reader { buf: b, at: 0 };
        if r.take::<4>() != MAGIC {
            return Err(bad("wrong magic (not a Skyriver verbs peer)".into()));
        }
        let version = u16::from_le_bytes(r.take());
        if version != VERSION {
            return Err(bad(format!("version {version}, expected {VERSION}")));
        }
        let lanes = usize::from(u16::from_le_bytes(r.take()));
        let mtu_bytes = u32::from_le_bytes(r.take());
        let max_rd_atomic = u32::from_le_bytes(r.take());
        let recv_slot_bytes = u32::from_le_bytes(r.take());
        let recv_slots = u32::from_le_bytes(r.take());
        let lid = u16::from_le_bytes(r.take());
        let _reserved: [u8; 2] = r.take();
        let gid: [u8; 16] = r.take();
        if lanes == 0 || lanes > MAX_LANES {
            return Err(bad(format!("{lanes} lanes, expected 1..={MAX_LANES}")));
        }
        if !(256..=4096).contains(&mtu_bytes) || !mtu_bytes.is_power_of_two() {
            return Err(bad(format!("MTU {mtu_bytes}")));
        }
        if max_rd_atomic == 0 || max_rd_atomic > 255 {
            return Err(bad(format!("max_rd_atomic {max_rd_atomic}")));
        }
        if recv_slot_bytes == 0 || recv_slots == 0 {
            return Err(bad("zero receive slots or slot size".into()));
        }
        let mut lane_ids = Vec::with_capacity(lanes);
        for _ in 0..MAX_LANES {
            let qpn = u32::from_le_bytes(r.take());
            let psn = u32::from_le_bytes(r.take());
            if lane_ids.len() < lanes {
                if qpn == 0 || qpn > 0xff_ffff || psn > 0xff_ffff {
                    return Err(bad(format!("QPN {qpn:#x} / PSN {psn:#x} out of range")));
                }
                lane_ids.push((qpn, psn));
            }
        }
        Ok(Hello {
            mtu_bytes,
            max_rd_atomic,
            recv_slot_bytes,
            recv_slots,
            lid,
            gid,
            lanes: lane_ids,
        })
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.at..self.at + N]);
        self.at += N;
        out
    }
}

/// The control stream with a deadline on every read and write.
pub(crate) struct Control<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
    budget: Duration,
    saved: (Option<Duration>, Option<Duration>),
}

impl<'a> Control<'a> {
    pub(crate) fn new(stream: &'a mut TcpStream, budget: Duration) -> Result<Self, HandshakeError> {
        let io = |source| HandshakeError::Io {
            op: "setup",
            source,
        };
        let saved = (
            stream.read_timeout().map_err(io)?,
            stream.write_timeout().map_err(io)?,
        );
        stream.set_nodelay(true).map_err(io)?;
        Ok(Control {
            stream,
            deadline: Instant::now() + budget,
            budget,
            saved,
        })
    }

    fn remaining(&self) -> Result<Duration, HandshakeError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(HandshakeError::Timeout(self.budget))
        } else {
            Ok(left)
        }
    }

    fn map(&self, op: &'static str, e: io::Error) -> HandshakeError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                HandshakeError::Timeout(self.budget)
            }
            _ => HandshakeError::Io { op, source: e },
        }
    }

    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        let left = self.remaining()?;
        self.stream
            .set_write_timeout(Some(left))
            .map_err(|e| self.map("write", e))?;
        let r = self
            .stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush());
        r.map_err(|e| self.map("write", e))
    }

    pub(crate) fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), HandshakeError> {
        let mut got = 0;
        while got < buf.len() {
            let left = self.remaining()?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.map("read", e))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(HandshakeError::Io {
                        op: "read",
                        source: io::ErrorKind::UnexpectedEof.into(),
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.map("read", e)),
            }
        }
        Ok(())
    }

    pub(crate) fn exchange_hello(&mut self, mine: &Hello) -> Result<Hello, HandshakeError> {
        self.write_all(&mine.encode())?;
        let mut buf = [0u8; HELLO_BYTES];
        self.read_exact(&mut buf)?;
        Hello::decode(&buf)
    }

    pub(crate) fn exchange_ready(&mut self) -> Result<(), HandshakeError> {
        self.write_all(&READY)?;
        let mut buf = [0u8; 4];
        self.read_exact(&mut buf)?;
        if buf != READY {
            return Err(HandshakeError::Malformed("bad ready marker".into()));
        }
        Ok(())
    }
}

impl Drop for Control<'_> {
    fn drop(&mut self) {
        // Best effort: hand the stream back with the caller's timeouts.
        let _ = self.stream.set_read_timeout(self.saved.0);
        let _ = self.stream.set_write_timeout(self.saved.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            mtu_bytes: 4096,
            max_rd_atomic: 16,
            recv_slot_bytes: 8192,
            recv_slots: 64,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 11, 1, 1],
            lanes: vec![(0x11, 0x123456), (0x12, 0x654321)],
        }
    }

    #[test]
    fn hello_round_trips() {
        let h = hello();
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn bad_hellos_are_errors_not_panics() {
        let good = hello().encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            Hello::decode(&b),
            Err(HandshakeError::Malformed(_))
        ));
        let mut b = good;
        b[6] = 0; // zero lanes
        b[7] = 0;
        assert!(Hello::decode(&b).is_err());
        let mut b = good;
        b[6] = 17; // too many lanes
        assert!(Hello::decode(&b).is_err());
        let mut b = good;
        b[8..12].copy_from_slice(&3000u32.to_le_bytes()); // MTU not a power of two
        assert!(Hello::decode(&b).is_err());
        let mut b = good;
        b[44..48].copy_from_slice(&0u32.to_le_bytes()); // QPN 0
        assert!(Hello::decode(&b).is_err());
        // Every single-byte corruption decodes or errors, never panics.
        for i in 0..HELLO_BYTES {
            let mut b = good;
            b[i] ^= 0xff;
            let _ = Hello::decode(&b);
        }
    }
}
