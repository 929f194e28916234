//! Measuring a new connection's path costs for the core's eager/rendezvous threshold model
//! ([`PathCosts`]), right after the QP handshake and before the connection carries traffic.
//!
//! The connector measures; the acceptor only echoes pings:
//! 1. `ROUND_TRIPS` sequential SEND ping-pongs: the fastest is the round trip;
//! 2. a burst of `BURST` pings posted at once: `(burst time - rtt) / (BURST - 1)` is the
//!    per-message cost of the two-sided path (post, wire, receive, handle);
//! 3. `SMALL_READS` 64-byte READs of the acceptor's probe buffer: beyond the round trip, the
//!    fastest is the READ setup cost;
//! 4. READ lists of the probe buffer (64 KiB pieces) until the probe budget is spent (at least
//!    one): bytes over time less latency is the READ bandwidth.
//!
//! Latencies are the minimum of their samples, not the median: what delays a sample (the
//! scheduler, a cold first READ on a fresh QP, an emulated CPU) only ever adds to the path's
//! own cost. (With medians of a few samples, SoftRoCE under an emulated CPU measured a READ
//! setup of over a millisecond and put the threshold above sizes where forced rendezvous was
//! measured faster.)
//!
//! Copy bandwidth is local: measured once per fabric ([`measure_copy_bandwidth`]). The whole
//! probe is bounded by a hard deadline; a failure there fails the connection (its QP is broken),
//! while implausible numbers fall back to the defaults field by field.

use std::time::{Duration, Instant};

use skyriver_core::node::PathCosts;

use super::hello::{CostsFrame, WireChunk};
use crate::verbs::{
    Completion, MrChunk, Opcode, PollError, PostError, ReadRequest, VerbsConnection, WcStatus,
};

/// Sequential ping-pongs.
const ROUND_TRIPS: u32 = 16;
/// Pings posted at once.
const BURST: u32 = 16;
/// Pings the connector sends in all.
pub(super) const PINGS: u32 = ROUND_TRIPS + BURST;
/// Small READs for the setup cost.
const SMALL_READS: u32 = 16;
/// Bytes of a small READ.
const SMALL_READ_BYTES: u32 = 64;
/// Bytes of one READ of the bandwidth probe.
const PIECE_BYTES: u64 = 64 * 1024;
/// Most READ lists of the bandwidth probe.
const MAX_BW_LISTS: u32 = 16;
/// Probe work request ids live above this, apart from the fabric's own.
const PROBE_WR_ID: u64 = 1 << 60;

const PING_MAGIC: [u8; 8] = *b"SKRVPING";

/// Why probing failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The hard deadline passed.
    #[error("cost probe timed out after {0:?}")]
    Timeout(Duration),
    /// A post was refused.
    #[error("cost probe: {0}")]
    Post(#[from] PostError),
    /// Polling failed.
    #[error("cost probe: {}", super::errors::render(.0))]
    Poll(#[source] PollError),
    /// A work request completed with an error.
    #[error("cost probe: {what} completed with {status}")]
    Completion {
        /// What failed.
        what: &'static str,
        /// The completion status.
        status: WcStatus,
    },
}

/// The costs to use when nothing could be measured: figures typical of the device kind.
pub(super) fn default_costs(device: &str, copy_bytes_per_sec: f64) -> PathCosts {
    if device.starts_with("rxe") || device.starts_with("siw") {
        // Software RDMA over a kernel network stack: tens of µs per message, ~1 GB/s.
        PathCosts {
            round_trip_ns: 60_000.0,
            message_overhead_ns: 10_000.0,
            copy_bytes_per_sec,
            wire_bytes_per_sec: 1e9,
            read_setup_ns: 20_000.0,
        }
    } else {
        PathCosts {
            copy_bytes_per_sec,
            ..PathCosts::RDMA_DEFAULT
        }
    }
}

/// Local memory copy bandwidth in bytes per second (best of a few 4 MiB copies, ~1 ms).
pub(super) fn measure_copy_bandwidth() -> f64 {
    const LEN: usize = 4 << 20;
    let src = vec![0x5au8; LEN];
    let mut dst = vec![0u8; LEN];
    dst.copy_from_slice(&src); // fault the pages in
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let bw = LEN as f64 / best.max(1e-9);
    if bw.is_finite() && bw > 0.0 {
        bw
    } else {
        PathCosts::RDMA_DEFAULT.copy_bytes_per_sec
    }
}

fn ping(seq: u32) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&PING_MAGIC);
    b[8..].copy_from_slice(&seq.to_le_bytes());
    b
}

fn is_ping(bytes: &[u8]) -> bool {
    bytes.len() == 12 && bytes[..8] == PING_MAGIC
}

struct Poller<'a> {
    conn: &'a mut VerbsConnection,
    deadline: Instant,
    budget: Duration,
    out: Vec<Completion>,
}

impl Poller<'_> {
    /// The next completions, waiting (spinning) until some arrive or the deadline passes.
    fn next(&mut self) -> Result<Vec<Completion>, ProbeError> {
        loop {
            self.out.clear();
            let n = self.conn.poll(&mut self.out).map_err(ProbeError::Poll)?;
            if n > 0 {
                return Ok(std::mem::take(&mut self.out));
            }
            if Instant::now() >= self.deadline {
                return Err(ProbeError::Timeout(self.budget));
            }
            std::thread::yield_now();
        }
    }
}

fn check(c: &Completion, what: &'static str) -> Result<(), ProbeError> {
    if c.status.is_success() {
        Ok(())
    } else {
        Err(ProbeError::Completion {
            what,
            status: c.status,
        })
    }
}

/// Acceptor side: echo `pings` pings back on lane 0, then wait for the own SENDs to complete.
/// Messages that are not pings (the peer's first real messages may overtake the end of the
/// probe) stay in their receive slots and are returned for the fabric to deliver in order.
pub(super) fn echo_pings(
    conn: &mut VerbsConnection,
    pings: u32,
    budget: Duration,
) -> Result<Vec<Completion>, ProbeError> {
    let mut backlog = Vec::new();
    let mut poller = Poller {
        conn,
        deadline: Instant::now() + budget,
        budget,
        out: Vec::new(),
    };
    // Pongs wait here while the send queue is full.
    let mut owed: std::collections::VecDeque<[u8; 12]> = std::collections::VecDeque::new();
    let (mut echoed, mut posted, mut sent) = (0u32, 0u32, 0u32);
    while echoed < pings || sent < echoed {
        while let Some(pong) = owed.front() {
            match poller.conn.post_send(0, 0, pong) {
                Ok(()) => {
                    owed.pop_front();
                    posted += 1;
                }
                Err(PostError::QueueFull { .. }) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if echoed >= pings && sent >= posted && owed.is_empty() {
            break;
        }
        for c in poller.next()? {
            match c.opcode {
                Opcode::Recv => {
                    check(&c, "probe RECV")?;
                    let Some(slot) = c.recv_slot() else { continue };
                    let bytes = poller.conn.recv_bytes(slot);
                    if !is_ping(bytes) || echoed >= pings {
                        backlog.push(c);
                        continue;
                    }
                    let mut pong = [0u8; 12];
                    pong.copy_from_slice(bytes);
                    poller.conn.release_recv(slot)?;
                    owed.push_back(pong);
                    echoed += 1;
                }
                Opcode::Send => {
                    check(&c, "probe SEND")?;
                    sent += 1;
                }
                Opcode::Read => check(&c, "probe READ")?,
                // The probe binds no windows.
                Opcode::BindWindow | Opcode::InvalidateWindow => check(&c, "probe window")?,
            }
        }
    }
    Ok(backlog)
}

/// What the connector measured.
pub(super) struct Measured {
    pub frame: CostsFrame,
}

/// Connector side: run the whole probe (module doc). `local` is this side's registered probe
/// buffer, `remote` the peer's.
pub(super) fn measure(
    conn: &mut VerbsConnection,
    local: MrChunk,
    remote: WireChunk,
    soft_budget: Duration,
    hard_budget: Duration,
) -> Result<Measured, ProbeError> {
    let mut p = Poller {
        conn,
        deadline: Instant::now() + hard_budget,
        budget: hard_budget,
        out: Vec::new(),
    };
    let mut pongs = 0u32;
    let mut sends = 0u32;
    // Polls until `want_pongs` pongs arrived and `want_sends` SENDs completed.
    let wait = |p: &mut Poller<'_>,
                pongs: &mut u32,
                sends: &mut u32,
                want_pongs: u32,
                want_sends: u32|
     -> Result<(), ProbeError> {
        while *pongs < want_pongs || *sends < want_sends {
            for c in p.next()? {
                match c.opcode {
                    Opcode::Recv => {
                        check(&c, "probe RECV")?;
                        let Some(slot) = c.recv_slot() else { continue };
                        // Only pongs can arrive: the peer starts sending once the costs are in.
                        p.conn.release_recv(slot)?;
                        *pongs += 1;
                    }
                    Opcode::Send => {
                        check(&c, "probe SEND")?;
                        *sends += 1;
                    }
                    Opcode::Read => check(&c, "probe READ")?,
                    // The probe binds no windows.
                    Opcode::BindWindow | Opcode::InvalidateWindow => check(&c, "probe window")?,
                }
            }
        }
        Ok(())
    };

    // 1. Sequential ping-pongs.
    let mut rtts = Vec::new();
    for seq in 0..ROUND_TRIPS {
        let t = Instant::now();
        p.conn.post_send(0, 0, &ping(seq))?;
        wait(&mut p, &mut pongs, &mut sends, seq + 1, 0)?;
        rtts.push(t.elapsed().as_nanos() as f64);
    }
    let rtt = fastest(&rtts);

    // 2. A burst, as much of it at once as the send queue takes.
    let t = Instant::now();
    let mut seq = 0;
    while seq < BURST {
        match p.conn.post_send(0, 0, &ping(ROUND_TRIPS + seq)) {
            Ok(()) => seq += 1,
            Err(PostError::QueueFull { .. }) => {
                let done = sends;
                wait(&mut p, &mut pongs, &mut sends, 0, done + 1)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    wait(&mut p, &mut pongs, &mut sends, PINGS, 0)?;
    let burst_ns = t.elapsed().as_nanos() as f64;
    // No two-sided message costs less than a microsecond end to end (post, wire, completion,
    // handling); a smaller figure is scheduling noise (software RDMA, emulated CPUs).
    const MIN_MESSAGE_NS: f64 = 1_000.0;
    let overhead =
        ((burst_ns - rtt) / f64::from(BURST - 1)).clamp(MIN_MESSAGE_NS, rtt.max(MIN_MESSAGE_NS));
    // Leave the connection with nothing of the probe in flight.
    wait(&mut p, &mut pongs, &mut sends, PINGS, PINGS)?;

    // 3. Small READs.
    let mut wr = PROBE_WR_ID;
    let read_list = |p: &mut Poller<'_>, reqs: &[ReadRequest]| -> Result<(), ProbeError> {
        // SAFETY: every probe READ writes into the fabric's probe buffer (registered under its
        // lkey, mapped while the fabric lives), scratch memory of which this process makes no
        // reference (`ProbeBuffer` keeps its map only to own it): the device's writes alias
        // nothing.
        unsafe { p.conn.post_reads(0, reqs) }?;
        loop {
            for c in p.next()? {
                check(&c, "probe READ")?;
                if c.opcode == Opcode::Read {
                    return Ok(());
                }
            }
        }
    };
    let mut small = Vec::new();
    for _ in 0..SMALL_READS {
        wr += 1;
        let req = ReadRequest {
            wr_id: wr,
            local_addr: local.addr,
            lkey: local.lkey,
            remote_addr: remote.addr,
            rkey: remote.rkey,
            // Cannot truncate: at most SMALL_READ_BYTES.
            len: u64::from(SMALL_READ_BYTES).min(remote.len).min(local.len) as u32,
        };
        let t = Instant::now();
        read_list(&mut p, &[req])?;
        small.push(t.elapsed().as_nanos() as f64);
    }
    let small_read = fastest(&small);

    // 4. Bandwidth: lists of 64 KiB READs over the whole probe buffer.
    let span = remote.len.min(local.len);
    let pieces: Vec<ReadRequest> = (0..span.div_ceil(PIECE_BYTES))
        .map(|i| {
            let off = i * PIECE_BYTES;
            ReadRequest {
                wr_id: 0,
                local_addr: local.addr + off,
                lkey: local.lkey,
                remote_addr: remote.addr + off,
                rkey: remote.rkey,
                // Cannot truncate: at most PIECE_BYTES.
                len: PIECE_BYTES.min(span - off) as u32,
            }
        })
        .take(p.conn.params().send_queue_depth.max(1) as usize)
        .collect();
    let span: u64 = pieces.iter().map(|r| u64::from(r.len)).sum();
    let bw_start = Instant::now();
    let (mut bytes, mut busy_ns, mut lists) = (0u64, 0f64, 0u32);
    while lists == 0 || (bw_start.elapsed() < soft_budget && lists < MAX_BW_LISTS) {
        let reqs: Vec<ReadRequest> = pieces
            .iter()
            .map(|r| {
                wr += 1;
                ReadRequest { wr_id: wr, ..*r }
            })
            .collect();
        let t = Instant::now();
        read_list(&mut p, &reqs)?;
        let ns = t.elapsed().as_nanos() as f64;
        // Latency is paid once per list; never credit more than half the time to it.
        busy_ns += (ns - small_read).max(ns / 2.0);
        bytes += span;
        lists += 1;
    }
    let bw = bytes as f64 / busy_ns.max(1.0) * 1e9;
    let read_setup = (small_read - rtt).max(0.0) + overhead;

    Ok(Measured {
        frame: CostsFrame {
            measured: true,
            round_trip_ns: rtt,
            message_overhead_ns: overhead,
            wire_bytes_per_sec: bw,
            read_setup_ns: read_setup,
            note: format!(
                "{ROUND_TRIPS} ping-pongs, {BURST}-ping burst, {SMALL_READS} small READs, \
                 {lists} x {span} B READ lists"
            ),
        },
    })
}

/// The costs a frame describes, with implausible fields replaced by `defaults`.
pub(super) fn costs_from(
    frame: &CostsFrame,
    copy_bytes_per_sec: f64,
    defaults: PathCosts,
) -> PathCosts {
    let pick = |v: f64, d: f64, positive: bool| {
        if frame.measured && v.is_finite() && v >= 0.0 && (!positive || v > 0.0) {
            v
        } else {
            d
        }
    };
    PathCosts {
        round_trip_ns: pick(frame.round_trip_ns, defaults.round_trip_ns, true),
        message_overhead_ns: pick(
            frame.message_overhead_ns,
            defaults.message_overhead_ns,
            false,
        ),
        copy_bytes_per_sec,
        wire_bytes_per_sec: pick(frame.wire_bytes_per_sec, defaults.wire_bytes_per_sec, true),
        read_setup_ns: pick(frame.read_setup_ns, defaults.read_setup_ns, false),
    }
}

/// The smallest sample (0 when there is none).
fn fastest(samples: &[f64]) -> f64 {
    samples.iter().copied().reduce(f64::min).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implausible_measurements_fall_back_to_defaults() {
        let d = default_costs("rxe0", 5e9);
        assert_eq!(d.round_trip_ns, 60_000.0);
        assert_eq!(default_costs("mlx5_0", 5e9).wire_bytes_per_sec, 12.5e9);
        let frame = CostsFrame {
            measured: true,
            round_trip_ns: f64::NAN,
            message_overhead_ns: 500.0,
            wire_bytes_per_sec: 0.0,
            read_setup_ns: -1.0,
            note: String::new(),
        };
        let c = costs_from(&frame, 7e9, d);
        assert_eq!(c.round_trip_ns, d.round_trip_ns);
        assert_eq!(c.message_overhead_ns, 500.0);
        assert_eq!(c.wire_bytes_per_sec, d.wire_bytes_per_sec);
        assert_eq!(c.read_setup_ns, d.read_setup_ns);
        assert_eq!(c.copy_bytes_per_sec, 7e9);
        let unmeasured = CostsFrame {
            measured: false,
            ..frame
        };
        assert_eq!(costs_from(&unmeasured, 5e9, d), d);
    }

    #[test]
    fn the_fastest_sample_is_the_cost() {
        assert_eq!(fastest(&[30.0, 12.0, 1e6, 15.0]), 12.0);
        assert_eq!(fastest(&[]), 0.0);
    }

    #[test]
    fn copy_bandwidth_is_positive() {
        assert!(measure_copy_bandwidth() > 0.0);
    }

    #[test]
    fn pings_are_recognised() {
        assert!(is_ping(&ping(3)));
        assert!(!is_ping(b"SRxxxxxxxxxx"));
        assert!(!is_ping(&ping(3)[..11]));
    }
}
