//! Real-verbs tests. They need RDMA devices named in `SKYRIVER_RDMA_DEVICES` (e.g.
//! `"rxe0 rxe1"`, which `ci/softroce/run-in-vm.sh` sets inside its SoftRoCE guest) and
//! skip cleanly (print a line, pass) without them:
//!
//! ```text
//! CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/ci/softroce/run-in-vm.sh \
//!     cargo test -p skyriver-transport --test verbs_rxe
//! ```
//!
//! With two devices the two ends of every connection use different devices, so traffic
//! crosses the guest's veth pair. Assertions are on data and completion status, never speed.

#[path = "support/skip.rs"]
mod skip;

use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use skyriver_transport::verbs::{
    list_devices, plan_reads, Completion, ConnectionConfig, DeviceError, Opcode, PostError,
    ReadRequest, RecvSlot, Registration, VerbsConnection, VerbsDevice, WcStatus,
};

const WAIT: Duration = Duration::from_secs(60);

/// Posts `reads` on `lane` of `conn`.
fn post_reads(
    conn: &mut VerbsConnection,
    lane: usize,
    reads: &[ReadRequest],
) -> Result<(), PostError> {
    // SAFETY: every READ of this suite lands in a buffer the test registered and keeps mapped
    // for the test's length, and of which it makes no reference until the READ is over (its
    // completion polled, or the queue pair in the error state).
    unsafe { conn.post_reads(lane, reads) }
}

/// The two device names to use, or `None` (after reporting a skip).
fn devices(test: &str) -> Option<(String, String)> {
    let list = std::env::var("SKYRIVER_RDMA_DEVICES").unwrap_or_default();
    let names: Vec<&str> = list.split_whitespace().collect();
    match names.as_slice() {
        [] => {
            skip::skip(
                test,
                &skip::RDMA_DEVICES,
                "SKYRIVER_RDMA_DEVICES is not set",
            );
            None
        }
        [one] => Some((one.to_string(), one.to_string())),
        [a, b, ..] => Some((a.to_string(), b.to_string())),
    }
}

fn gid_index() -> Option<u32> {
    std::env::var("SKYRIVER_RDMA_GID_INDEX")
        .ok()
        .and_then(|s| s.parse().ok())
}

struct End {
    device: VerbsDevice,
    conn: VerbsConnection,
}

/// Open both devices and connect them over a loopback TCP control stream, the accepting
/// side in its own thread.
fn pair(a: &str, b: &str, cfg_a: ConnectionConfig, cfg_b: ConnectionConfig) -> (End, End) {
    let device = VerbsDevice::open(a, 1, gid_index()).expect("open device A");
    pair_with(device, b, cfg_a, cfg_b)
}

/// As [`pair`], with side A's device already open (to make a completion channel on it first).
fn pair_with(
    device: VerbsDevice,
    b: &str,
    cfg_a: ConnectionConfig,
    cfg_b: ConnectionConfig,
) -> (End, End) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let b_name = b.to_string();
    let acceptor = thread::spawn(move || {
        let device = VerbsDevice::open(&b_name, 1, gid_index()).expect("open device B");
        let (mut stream, _) = listener.accept().unwrap();
        let conn = VerbsConnection::accept(&device, &mut stream, &cfg_b).expect("accept");
        End { device, conn }
    });
    let mut stream = TcpStream::connect(addr).unwrap();
    let conn = VerbsConnection::connect(&device, &mut stream, &cfg_a).expect("connect");
    let end_b = acceptor.join().expect("acceptor thread");
    (End { device, conn }, end_b)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A page-aligned anonymous buffer registered on `device` (split at `max_mr_bytes`).
struct Buffer {
    reg: Registration,
    mem: MmapMut,
}

fn buffer(device: &VerbsDevice, len: usize, max_mr_bytes: u64, seed: Option<u64>) -> Buffer {
    let mut mem = MmapMut::map_anon(len).unwrap();
    if let Some(seed) = seed {
        mem.copy_from_slice(&pattern(seed, len));
    }
    // SAFETY: the map is owned by the Buffer and dropped after the registration (field
    // order); the test reads it only after the READs into it completed.
    let reg = unsafe { device.register(mem.as_mut_ptr(), len, max_mr_bytes) }.expect("register");
    Buffer { reg, mem }
}

/// Poll `conn` until `done(all completions so far)` or the deadline.
fn poll_until(
    conn: &mut VerbsConnection,
    out: &mut Vec<Completion>,
    done: impl Fn(&[Completion]) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !done(out) {
        assert!(
            Instant::now() < deadline,
            "no progress within {WAIT:?}; have {} completions",
            out.len()
        );
        if conn.poll(out).expect("poll") == 0 {
            thread::yield_now();
        }
    }
}

fn assert_ok(c: &Completion) {
    assert!(
        c.status.is_success(),
        "completion failed: {c:?} ({})",
        c.status
    );
}

#[test]
fn open_of_a_missing_device_is_a_clear_error() {
    // Runs everywhere: without rdma-core, without devices, or with them.
    match VerbsDevice::open("skyriver_no_such_device", 1, None) {
        Err(DeviceError::Library(e)) => println!("libibverbs cannot be loaded here: {e}"),
        Err(DeviceError::VerbsUnavailable(e)) => println!("verbs unavailable here: {e}"),
        Err(DeviceError::NotFound { available, .. }) => println!("devices here: {available:?}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a device that does not exist opened"),
    }
    let _ = list_devices();
}

#[test]
fn handshake_agrees_on_the_minimum() {
    let Some((a, b)) = devices("handshake_agrees_on_the_minimum") else {
        return;
    };
    let cfg_a = ConnectionConfig {
        lanes: 4,
        recv_slot_bytes: 8192,
        recv_slots: 32,
        max_rd_atomic: 16,
        ..ConnectionConfig::default()
    };
    let cfg_b = ConnectionConfig {
        lanes: 2,
        recv_slot_bytes: 4096,
        recv_slots: 64,
        max_rd_atomic: 4,
        mtu_bytes: 1024,
        ..ConnectionConfig::default()
    };
    let (ea, eb) = pair(&a, &b, cfg_a, cfg_b);
    println!("{a}: {:?}", ea.device);
    println!("{b}: {:?}", eb.device);
    let (pa, pb) = (ea.conn.params(), eb.conn.params());
    println!("agreed: {pa:?}");
    assert_eq!(pa.lanes, 2);
    assert_eq!(pb.lanes, 2);
    assert_eq!(ea.conn.lanes(), 2);
    assert_eq!(pa.recv_slot_bytes, 4096);
    assert_eq!(pa.recv_slots, 32);
    assert_eq!(pa.mtu_bytes, 1024);
    assert!(pa.max_rd_atomic >= 1 && pa.max_rd_atomic <= 4);
    for p in [pa, pb] {
        assert_eq!(
            (
                p.lanes,
                p.recv_slot_bytes,
                p.recv_slots,
                p.mtu_bytes,
                p.max_rd_atomic
            ),
            (
                pa.lanes,
                pa.recv_slot_bytes,
                pa.recv_slots,
                pa.mtu_bytes,
                pa.max_rd_atomic
            )
        );
    }
    let limits = ea.device.limits();
    assert!(limits.max_mr_size_bytes > 0 && limits.max_qp_rd_atom > 0 && limits.max_sge > 0);
    assert_eq!(
        ea.device.gid_kind(),
        skyriver_transport::verbs::GidKind::RoceV2
    );
    assert!(
        ea.device.gid().to_ipv4_mapped().is_some(),
        "default GID should be IPv4-mapped RoCE v2"
    );
}

#[test]
fn send_recv_of_several_sizes_with_reposting() {
    let Some((a, b)) = devices("send_recv_of_several_sizes_with_reposting") else {
        return;
    };
    let cfg = ConnectionConfig {
        lanes: 2,
        recv_slot_bytes: 8192,
        recv_slots: 16,
        repost_batch: 4,
        ..ConnectionConfig::default()
    };
    let (mut ea, mut eb) = pair(&a, &b, cfg.clone(), cfg);
    let inline = ea.conn.params().max_inline_bytes;
    println!("max inline: {inline}");
    let sizes = [
        1usize,
        7,
        64,
        inline.max(1) as usize,
        inline as usize + 1,
        1000,
        4095,
        4096,
        8192,
    ];
    // Three rounds over every size and both lanes and directions: 108 messages, more than
    // the 16 slots per lane, so released slots must be reposted.
    let mut wr = 0u64;
    for round in 0..3u64 {
        for from_a in [true, false] {
            let (tx, rx) = if from_a {
                (&mut ea, &mut eb)
            } else {
                (&mut eb, &mut ea)
            };
            for lane in 0..2 {
                let mut sent = Vec::new();
                for &size in &sizes {
                    wr += 1;
                    let msg = pattern(wr * 31 + round, size);
                    tx.conn.post_send(lane, wr, &msg).expect("post_send");
                    sent.push((wr, msg));
                }
                let mut tx_done = Vec::new();
                poll_until(&mut tx.conn, &mut tx_done, |c| c.len() >= sizes.len());
                for (c, (id, _)) in tx_done.iter().zip(&sent) {
                    assert_ok(c);
                    assert_eq!((c.opcode, c.wr_id, c.lane), (Opcode::Send, *id, lane));
                }
                let mut rx_done = Vec::new();
                poll_until(&mut rx.conn, &mut rx_done, |c| c.len() >= sizes.len());
                for (c, (_, msg)) in rx_done.iter().zip(&sent) {
                    assert_ok(c);
                    assert_eq!((c.opcode, c.lane), (Opcode::Recv, lane), "from_a={from_a}");
                    assert_eq!(c.byte_len as usize, msg.len());
                    let slot = c.recv_slot().unwrap();
                    assert!(
                        rx.conn.recv_bytes(slot) == &msg[..],
                        "payload mismatch, size {}",
                        msg.len()
                    );
                    rx.conn.release_recv(slot).unwrap();
                }
            }
        }
    }
    assert!(matches!(
        ea.conn.post_send(0, 1, &vec![0u8; 8193]),
        Err(PostError::BadLength { .. })
    ));
    assert!(matches!(
        ea.conn.post_send(9, 1, b"x"),
        Err(PostError::NoSuchLane(9))
    ));
    // A released slot cannot be released again (it is posted to the device).
    assert!(matches!(
        ea.conn.release_recv(RecvSlot(0)),
        Err(PostError::SlotNotHeld(0))
    ));
    assert!(ea.conn.recv_bytes(RecvSlot(0)).is_empty());
}

#[test]
fn rdma_read_1kib_to_8mib() {
    let Some((a, b)) = devices("rdma_read_1kib_to_8mib") else {
        return;
    };
    let (mut ea, eb) = pair(
        &a,
        &b,
        ConnectionConfig::default(),
        ConnectionConfig::default(),
    );
    const MIB: usize = 1 << 20;
    let src = buffer(&eb.device, 8 * MIB + 8192, u64::MAX, Some(42));
    let dst = buffer(&ea.device, 8 * MIB + 8192, u64::MAX, None);
    let remote = src.reg.remote_chunks();
    let mut id = 0;
    for (size, src_off, dst_off) in [
        (1024usize, 0usize, 0usize),
        (4096, 100, 4000),
        (65536, 4096, 12345),
        (MIB, 777, 1),
        (8 * MIB, 8192, 0),
    ] {
        id += 1;
        let reqs = plan_reads(
            dst.reg.chunks(),
            dst.reg.addr() + dst_off as u64,
            &remote,
            src.reg.addr() + src_off as u64,
            size as u64,
            u64::MAX,
            id * 1000,
        )
        .unwrap();
        assert_eq!(reqs.len(), 1);
        post_reads(&mut ea.conn, id as usize % 2, &reqs).expect("post_reads");
        let mut done = Vec::new();
        poll_until(&mut ea.conn, &mut done, |c| !c.is_empty());
        assert_eq!(done.len(), 1);
        assert_ok(&done[0]);
        assert_eq!((done[0].opcode, done[0].wr_id), (Opcode::Read, id * 1000));
        assert_eq!(done[0].byte_len as usize, size);
        assert!(
            dst.mem[dst_off..dst_off + size] == src.mem[src_off..src_off + size],
            "READ of {size} bytes corrupted"
        );
        println!("read {size} bytes ok");
    }
    drop(eb);
}

#[test]
fn many_outstanding_reads_across_lanes() {
    let Some((a, b)) = devices("many_outstanding_reads_across_lanes") else {
        return;
    };
    let cfg = ConnectionConfig {
        lanes: 4,
        send_queue_depth: 64,
        ..ConnectionConfig::default()
    };
    let (mut ea, eb) = pair(&a, &b, cfg.clone(), cfg);
    assert_eq!(ea.conn.lanes(), 4);
    const PIECE: usize = 16 * 1024;
    const PIECES: usize = 512; // 8 MiB in 512 READs, lists of 8, over 4 lanes
    let src = buffer(&eb.device, PIECE * PIECES, u64::MAX, Some(7));
    let dst = buffer(&ea.device, PIECE * PIECES, u64::MAX, None);
    let rchunk = src.reg.chunks()[0];
    let lchunk = dst.reg.chunks()[0];
    let lists: Vec<Vec<ReadRequest>> = (0..PIECES / 8)
        .map(|l| {
            (0..8)
                .map(|j| {
                    let p = l * 8 + j;
                    ReadRequest {
                        wr_id: p as u64,
                        local_addr: lchunk.addr + (p * PIECE) as u64,
                        lkey: lchunk.lkey,
                        remote_addr: rchunk.addr + (p * PIECE) as u64,
                        rkey: rchunk.rkey,
                        len: PIECE as u32,
                    }
                })
                .collect()
        })
        .collect();
    let mut next = 0;
    let mut completed = 0;
    let mut max_in_flight = 0;
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    while completed < lists.len() {
        assert!(Instant::now() < deadline, "stalled at {completed} lists");
        // Keep every lane's queue as full as it allows.
        while next < lists.len() {
            match post_reads(&mut ea.conn, next % 4, &lists[next]) {
                Ok(()) => next += 1,
                Err(PostError::QueueFull { .. }) => break,
                Err(e) => panic!("post_reads: {e}"),
            }
        }
        max_in_flight = max_in_flight.max((0..4).map(|l| ea.conn.in_flight(l)).sum::<u32>());
        out.clear();
        ea.conn.poll(&mut out).unwrap();
        for c in &out {
            assert_ok(c);
            assert_eq!(c.opcode, Opcode::Read);
            assert_eq!(c.wr_id % 8, 7, "only the last READ of a list is signaled");
            completed += 1;
        }
    }
    println!("max READs in flight: {max_in_flight}");
    assert!(
        max_in_flight > 64,
        "READs should be outstanding on several lanes at once"
    );
    assert!((0..4).all(|l| ea.conn.in_flight(l) == 0));
    assert!(dst.mem[..] == src.mem[..], "READ data corrupted");
    drop(eb);
}

#[test]
fn registration_split_into_several_regions() {
    let Some((a, b)) = devices("registration_split_into_several_regions") else {
        return;
    };
    let (mut ea, eb) = pair(
        &a,
        &b,
        ConnectionConfig::default(),
        ConnectionConfig::default(),
    );
    const LEN: usize = 1 << 20;
    // Forced small maxima, different on each side so boundaries interleave.
    let src = buffer(&eb.device, LEN, 64 * 1024, Some(99));
    let dst = buffer(&ea.device, LEN, 48 * 1024, None);
    assert_eq!(src.reg.chunks().len(), 16);
    assert_eq!(dst.reg.chunks().len(), LEN.div_ceil(48 * 1024));
    let keys: std::collections::BTreeSet<u32> = src.reg.chunks().iter().map(|c| c.rkey).collect();
    assert_eq!(keys.len(), 16, "each region has its own rkey");
    for w in src.reg.chunks().windows(2) {
        assert_eq!(w[0].addr + w[0].len, w[1].addr, "regions are contiguous");
    }
    assert_eq!(
        dst.reg.lkey_for(dst.reg.addr() + 48 * 1024 - 1, 2),
        None,
        "range crosses a region"
    );

    // A READ across many boundaries on both sides, split correctly.
    let (off, len) = (5000usize, LEN - 9000);
    let reqs = plan_reads(
        dst.reg.chunks(),
        dst.reg.addr() + off as u64,
        &src.reg.remote_chunks(),
        src.reg.addr() + off as u64,
        len as u64,
        u64::MAX,
        0,
    )
    .unwrap();
    println!("{} bytes across regions -> {} READs", len, reqs.len());
    // Cut at every boundary of either side: 15 source and 21 destination boundaries, 5 shared.
    assert_eq!(reqs.len(), 32);
    post_reads(&mut ea.conn, 0, &reqs).unwrap();
    let mut out = Vec::new();
    poll_until(&mut ea.conn, &mut out, |c| !c.is_empty());
    assert_eq!(out.len(), 1);
    assert_ok(&out[0]);
    assert_eq!(out[0].wr_id, reqs.len() as u64 - 1);
    assert!(
        dst.mem[off..off + len] == src.mem[off..off + len],
        "split READ corrupted"
    );

    // The same READ unsplit (one key for a range spanning several regions) must fail
    // with an error completion, not corrupt memory or hang.
    let l0 = dst.reg.chunks()[0];
    let r0 = src.reg.chunks()[0];
    let bad = ReadRequest {
        wr_id: 4242,
        local_addr: l0.addr,
        lkey: l0.lkey,
        remote_addr: r0.addr,
        rkey: r0.rkey,
        len: 200 * 1024,
    };
    post_reads(&mut ea.conn, 1, &[bad]).unwrap();
    let mut out = Vec::new();
    poll_until(&mut ea.conn, &mut out, |c| !c.is_empty());
    println!(
        "unsplit READ across regions completed with {}",
        out[0].status
    );
    assert_eq!(out[0].wr_id, 4242);
    assert!(!out[0].status.is_success());
    assert!(ea.conn.lane_failed(1));
    drop(eb);
}

#[test]
fn qp_forced_into_error_mid_transfer_flushes() {
    let Some((a, b)) = devices("qp_forced_into_error_mid_transfer_flushes") else {
        return;
    };
    let cfg = ConnectionConfig {
        lanes: 2,
        send_queue_depth: 256,
        ..ConnectionConfig::default()
    };
    let (mut ea, mut eb) = pair(&a, &b, cfg.clone(), cfg);
    const PIECE: usize = 64 * 1024;
    const LISTS: usize = 64;
    const PER_LIST: usize = 4;
    let src = buffer(&eb.device, PIECE * LISTS * PER_LIST, u64::MAX, Some(3));
    let dst = buffer(&ea.device, PIECE * LISTS * PER_LIST, u64::MAX, None);
    let (l0, r0) = (dst.reg.chunks()[0], src.reg.chunks()[0]);
    let list = |list: usize| -> Vec<ReadRequest> {
        (0..PER_LIST)
            .map(|j| {
                let p = list * PER_LIST + j;
                ReadRequest {
                    wr_id: p as u64,
                    local_addr: l0.addr + (p * PIECE) as u64,
                    lkey: l0.lkey,
                    remote_addr: r0.addr + (p * PIECE) as u64,
                    rkey: r0.rkey,
                    len: PIECE as u32,
                }
            })
            .collect()
    };
    let last =
        |c: &Completion| c.opcode == Opcode::Read && c.wr_id as usize % PER_LIST == PER_LIST - 1;
    // The transfer is under way: its first list completes.
    let mut out = Vec::new();
    post_reads(&mut ea.conn, 0, &list(0)).unwrap();
    poll_until(&mut ea.conn, &mut out, |cs| cs.iter().any(&last));
    // Then the holder's side of lane 0 stops answering, so the READs posted next are
    // certainly outstanding when the requester's QP fails. (Failing the QP right after
    // posting was not enough: rxe may run a whole posted list inside ibv_post_send, and
    // on a fast guest every READ had completed before the error.)
    eb.conn.force_error(0).unwrap();
    for l in 1..LISTS {
        post_reads(&mut ea.conn, 0, &list(l)).unwrap();
    }
    ea.conn.force_error(0).unwrap();
    assert!(matches!(
        post_reads(
            &mut ea.conn,
            0,
            &[ReadRequest {
                wr_id: 1,
                local_addr: l0.addr,
                lkey: l0.lkey,
                remote_addr: r0.addr,
                rkey: r0.rkey,
                len: 1
            }]
        ),
        Err(PostError::LaneFailed(0))
    ));
    // Every list's signaled READ completes, successfully or flushed; nothing hangs.
    // Posted receives of the failed lane are flushed too.
    poll_until(&mut ea.conn, &mut out, |cs| {
        cs.iter().filter(|c| last(c)).count() == LISTS
    });
    let (recvs, reads): (Vec<Completion>, Vec<Completion>) =
        out.iter().partition(|c| c.opcode == Opcode::Recv);
    assert!(recvs
        .iter()
        .all(|c| c.status == WcStatus::FLUSHED && c.lane == 0));
    let ok = reads.iter().filter(|c| c.status.is_success()).count();
    let flushed = reads
        .iter()
        .filter(|c| c.status == WcStatus::FLUSHED)
        .count();
    println!(
        "{} READ completions: {ok} ok, {flushed} flushed; {} receives flushed",
        reads.len(),
        recvs.len()
    );
    assert!(
        flushed > 0,
        "forcing the QP to error must flush the outstanding READs"
    );
    for c in &reads {
        assert_eq!((c.lane, c.opcode), (0, Opcode::Read));
        // Nothing posted after the holder stopped answering can succeed; what completed
        // before carries correct data.
        assert!(
            c.wr_id < PER_LIST as u64 || !c.status.is_success(),
            "READ {} succeeded from a holder that had stopped answering",
            c.wr_id
        );
        if c.status.is_success() {
            let p = c.wr_id as usize;
            assert!(dst.mem[p * PIECE..(p + 1) * PIECE] == src.mem[p * PIECE..(p + 1) * PIECE]);
        }
    }
    // The other lane is unaffected.
    let reqs = [ReadRequest {
        wr_id: 9,
        local_addr: l0.addr,
        lkey: l0.lkey,
        remote_addr: r0.addr,
        rkey: r0.rkey,
        len: PIECE as u32,
    }];
    post_reads(&mut ea.conn, 1, &reqs).unwrap();
    let mut out = Vec::new();
    poll_until(&mut ea.conn, &mut out, |c| c.iter().any(|c| c.lane == 1));
    let c = out.iter().find(|c| c.lane == 1).unwrap();
    assert_ok(c);
    assert!(dst.mem[..PIECE] == src.mem[..PIECE]);
    drop(eb);
}

#[test]
fn one_shared_receive_queue_serves_every_lane() {
    let Some((a, b)) = devices("one_shared_receive_queue_serves_every_lane") else {
        return;
    };
    let cfg = ConnectionConfig {
        lanes: 4,
        recv_slots: 8,
        repost_batch: 8,
        ..ConnectionConfig::default()
    };
    let (mut ea, mut eb) = pair(&a, &b, cfg.clone(), cfg);
    assert_eq!(ea.conn.lanes(), 4);
    // Eight slots for the whole connection, not eight per lane.
    assert_eq!(eb.conn.recv_posted(), 8);
    // Two messages on each lane, none released yet: all eight land in the one pool of slots.
    for i in 0..8u64 {
        let lane = (i % 4) as usize;
        ea.conn
            .post_send(lane, i, &pattern(i, 100 + i as usize))
            .unwrap();
    }
    let mut sent = Vec::new();
    poll_until(&mut ea.conn, &mut sent, |c| c.len() >= 8);
    sent.iter().for_each(assert_ok);
    let mut got = Vec::new();
    poll_until(&mut eb.conn, &mut got, |c| c.len() >= 8);
    let mut slots = Vec::new();
    for c in &got {
        assert_ok(c);
        assert_eq!(c.opcode, Opcode::Recv);
        let slot = c.recv_slot().unwrap();
        assert!(slot.0 < 8, "slot {slot:?} outside the shared pool");
        let len = c.byte_len as usize;
        let seed = (len - 100) as u64;
        assert_eq!(
            c.lane,
            (seed % 4) as usize,
            "arrived on the lane it was sent on"
        );
        assert!(eb.conn.recv_bytes(slot) == &pattern(seed, len)[..]);
        slots.push(slot);
    }
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), 8, "every message in its own slot");
    assert_eq!(eb.conn.recv_posted(), 0, "the pool is used up");
    for slot in slots {
        eb.conn.release_recv(slot).unwrap();
    }
    eb.conn.flush_reposts().unwrap();
    assert_eq!(eb.conn.recv_posted(), 8, "released slots are posted again");
    // And they carry traffic again, on any lane.
    ea.conn.post_send(3, 99, b"again").unwrap();
    let mut got = Vec::new();
    poll_until(&mut eb.conn, &mut got, |c| c.len() == 1);
    let slot = got[0].recv_slot().unwrap();
    assert_eq!(eb.conn.recv_bytes(slot), b"again");
}

#[test]
fn completion_channel_wakes_only_an_armed_waiter() {
    let Some((a, b)) = devices("completion_channel_wakes_only_an_armed_waiter") else {
        return;
    };
    let device = VerbsDevice::open(&a, 1, gid_index()).expect("open device A");
    let channel = device.completion_channel().expect("completion channel");
    let cfg_a = ConnectionConfig {
        completion_channel: Some(channel.clone()),
        ..ConnectionConfig::default()
    };
    let (mut ea, mut eb) = pair_with(device, &b, cfg_a, ConnectionConfig::default());
    let mut out = Vec::new();

    // Armed and idle: no event.
    ea.conn.arm().unwrap();
    assert_eq!(ea.conn.poll(&mut out).unwrap(), 0);
    assert!(!channel.wait(Duration::from_millis(50)).unwrap());
    assert_eq!(channel.take_events().unwrap(), 0);

    // A message arrives: the sleeper wakes, with exactly one event to acknowledge.
    eb.conn.post_send(0, 1, b"wake up").unwrap();
    assert!(channel.wait(WAIT).unwrap(), "no event within {WAIT:?}");
    assert_eq!(channel.take_events().unwrap(), 1);
    poll_until(&mut ea.conn, &mut out, |c| !c.is_empty());
    let slot = out[0].recv_slot().unwrap();
    assert_eq!(ea.conn.recv_bytes(slot), b"wake up");
    ea.conn.release_recv(slot).unwrap();

    // Not armed again: the next completion raises no event (it is only polled).
    eb.conn.post_send(0, 2, b"quiet").unwrap();
    let mut sent = Vec::new();
    poll_until(&mut eb.conn, &mut sent, |c| c.len() >= 2);
    out.clear();
    poll_until(&mut ea.conn, &mut out, |c| !c.is_empty());
    assert!(!channel.wait(Duration::from_millis(200)).unwrap());
    let slot = out[0].recv_slot().unwrap();
    assert_eq!(ea.conn.recv_bytes(slot), b"quiet");
    ea.conn.release_recv(slot).unwrap();

    // Armed again: the events come back, for sends this side completes too.
    ea.conn.arm().unwrap();
    ea.conn.post_send(0, 3, b"own send").unwrap();
    assert!(channel.wait(WAIT).unwrap(), "no event for our own SEND");
    assert_eq!(channel.take_events().unwrap(), 1);
    out.clear();
    poll_until(&mut ea.conn, &mut out, |c| !c.is_empty());
    assert_eq!((out[0].opcode, out[0].wr_id), (Opcode::Send, 3));
    // Dropping the connection with every event acknowledged does not block.
    drop(ea);
    drop(eb);
}

/// Polls `conn` for the next completion of `opcode` and returns it.
fn next_of(conn: &mut VerbsConnection, opcode: Opcode) -> Completion {
    let mut out = Vec::new();
    poll_until(conn, &mut out, |cs| cs.iter().any(|c| c.opcode == opcode));
    *out.iter().find(|c| c.opcode == opcode).unwrap()
}

/// A median of durations, in microseconds.
fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

#[test]
fn a_memory_window_scopes_reads_to_its_range_until_invalidated() {
    let Some((a, b)) = devices("a_memory_window_scopes_reads_to_its_range_until_invalidated")
    else {
        return;
    };
    let cfg = ConnectionConfig {
        lanes: 3,
        ..ConnectionConfig::default()
    };
    let (mut ea, mut eb) = pair(&a, &b, cfg.clone(), cfg);
    assert_eq!(ea.conn.lanes(), 3, "three lanes negotiated");
    const LEN: usize = 1 << 20;
    let mut mem = MmapMut::map_anon(LEN).unwrap();
    mem.copy_from_slice(&pattern(11, LEN));
    // SAFETY: the map outlives the registration (dropped first, below).
    let src = unsafe {
        eb.device
            .register_for_windows(mem.as_mut_ptr(), LEN, u64::MAX)
    }
    .expect("register for windows");
    let dst = buffer(&ea.device, LEN, u64::MAX, None);
    let mut window = match eb.device.alloc_window() {
        Ok(w) => w,
        Err(e) => panic!("{b}: no memory window: {e} (rxe supports type 2 windows)"),
    };
    let (region, local) = (src.chunks()[0], dst.reg.chunks()[0]);
    let (offset, window_len) = (64 * 1024u64, 128 * 1024u64);
    let read = |wr_id: u64, at: u64, len: u64, rkey: u32| ReadRequest {
        wr_id,
        local_addr: local.addr + at,
        lkey: local.lkey,
        remote_addr: region.addr + at,
        rkey,
        len: len as u32,
    };

    // The cost of scoping one rendezvous: bind, then invalidate, each waited for, next to a
    // 4 KiB READ round trip on today's path (the region's own rkey) on the same lane.
    let mut scoped = Vec::new();
    for i in 0..100 {
        let t = Instant::now();
        eb.conn
            .bind_window(0, i, &mut window, &src, region.addr + offset, window_len)
            .unwrap();
        assert_ok(&next_of(&mut eb.conn, Opcode::BindWindow));
        eb.conn.invalidate_window(0, i, &window).unwrap();
        assert_ok(&next_of(&mut eb.conn, Opcode::InvalidateWindow));
        scoped.push(t.elapsed());
    }
    let mut reads = Vec::new();
    for i in 0..100 {
        let t = Instant::now();
        post_reads(&mut ea.conn, 0, &[read(i, 0, 4096, region.rkey)]).unwrap();
        assert_ok(&next_of(&mut ea.conn, Opcode::Read));
        reads.push(t.elapsed());
    }
    let (scoped_us, read_us) = (median_us(scoped), median_us(reads));
    println!(
        "memory window per rendezvous: bind + invalidate {scoped_us:.1} us (p50 of 100); a 4 KiB \
         READ round trip {read_us:.1} us; ratio {:.2}",
        scoped_us / read_us
    );

    // Bound on lane 0: a READ inside the window through lane 0 is exact.
    let rkey = eb
        .conn
        .bind_window(0, 500, &mut window, &src, region.addr + offset, window_len)
        .unwrap();
    assert_ok(&next_of(&mut eb.conn, Opcode::BindWindow));
    assert_ne!(rkey, region.rkey, "the window has its own rkey");
    post_reads(&mut ea.conn, 0, &[read(1, offset, window_len, rkey)]).unwrap();
    assert_ok(&next_of(&mut ea.conn, Opcode::Read));
    let range = offset as usize..(offset + window_len) as usize;
    assert!(dst.mem[range.clone()] == mem[range]);

    // The same rkey through another queue pair (lane 2): refused, the window belongs to lane 0.
    post_reads(&mut ea.conn, 2, &[read(2, offset, 4096, rkey)]).unwrap();
    let other_qp = next_of(&mut ea.conn, Opcode::Read);
    println!("window rkey through another QP: {}", other_qp.status);
    assert!(!other_qp.status.is_success());

    // Bytes outside the window (its last 4 KiB and the next 4 KiB) through lane 1, after
    // binding the window again there: refused.
    eb.conn.invalidate_window(0, 501, &window).unwrap();
    assert_ok(&next_of(&mut eb.conn, Opcode::InvalidateWindow));
    let stale = rkey;
    let rkey = eb
        .conn
        .bind_window(1, 502, &mut window, &src, region.addr + offset, window_len)
        .unwrap();
    assert_ok(&next_of(&mut eb.conn, Opcode::BindWindow));
    assert_ne!(rkey, stale, "every binding has a new rkey");
    post_reads(
        &mut ea.conn,
        1,
        &[read(3, offset + window_len - 4096, 8192, rkey)],
    )
    .unwrap();
    let outside = next_of(&mut ea.conn, Opcode::Read);
    println!("READ across the window's end: {}", outside.status);
    if b.starts_with("rxe") {
        // SoftRoCE checks a window's READ against the range of the window's memory region,
        // not the window's own (check_rkey in the kernel's rxe_resp.c): the rkey is scoped to
        // one binding and one QP, but not to the window's bytes. Hardware checks the window.
        if outside.status.is_success() {
            println!("{b}: this SoftRoCE does not bound READs to the window's range");
        }
    } else {
        assert!(!outside.status.is_success());
    }

    // The first binding's rkey after its invalidation, through lane 0 where it was bound:
    // refused.
    post_reads(&mut ea.conn, 0, &[read(4, offset, 4096, stale)]).unwrap();
    let after = next_of(&mut ea.conn, Opcode::Read);
    println!(
        "READ with the rkey of an invalidated binding: {}",
        after.status
    );
    assert!(!after.status.is_success());

    // Nothing outside the window was written on the requester's side by the refused READs,
    // and the holder's memory is unharmed.
    assert!(mem[..] == pattern(11, LEN)[..]);
    drop(window);
    drop(src);
    drop(eb);
}
