//! The verbs fabric on real devices: two `VerbsFabric`s in one process, on the devices named in
//! `SKYRIVER_RDMA_DEVICES` (`"rxe0 rxe1"` inside `ci/softroce/run-in-vm.sh`), each with a memfd
//! arena. Without that variable every device test prints a skip line and passes:
//!
//! ```text
//! CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/ci/softroce/run-in-vm.sh \
//!     cargo test -p skyriver-transport --test verbs_fabric
//! ```
//!
//! Every wait has a deadline; assertions are on bytes, statuses and events, never speed.
//!
//! One file over 800 lines on purpose: every test here needs the SoftRoCE VM, and
//! `ci/softroce/test.sh` runs the file as one suite (one binary, one boot of the VM) with the
//! harness above serving all of them.

#[path = "support/skip.rs"]
mod skip;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use skyriver_core::node::{ReadError, ReadOpId};
use skyriver_core::wire::{self, EagerHeader, PeerMessage};
use skyriver_core::{ArenaId, LocalRegion, NodeId, ObjectSizes, RemoteRegion, TransferId};
use skyriver_transport::arena::{ArenaOptions, ReadableRegion, SharedArena, WritableRegion};
use skyriver_transport::fabric::verbs::{VerbsFabric, VerbsFabricConfig, VerbsStartError};
use skyriver_transport::fabric::{event_channel, EventReceiver};
use skyriver_transport::fabric::{Fabric, FabricError, FabricEvent, FabricIdentity};

const WAIT: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;
const ARENA: ArenaId = ArenaId(0);
const TOKEN: &str = "skyriver-test-cluster";
/// The message a test sends after the events it expects, to show nothing else came.
const MARKER: &[u8] = b"skyriver-test-marker";

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

struct Node {
    id: NodeId,
    fabric: VerbsFabric,
    events: EventReceiver,
    arena: Arc<SharedArena>,
}

fn config(device: &str) -> VerbsFabricConfig {
    let mut c = VerbsFabricConfig::new(device, "127.0.0.1:0".parse().unwrap());
    c.gid_index = gid_index();
    c.recv_slot_bytes = 16 * 1024;
    c.recv_slots = 32;
    c.send_slots = 32;
    // These tests READ with the arenas' own keys (the fabric's READ mechanics); the memory
    // window test turns windows on.
    c.memory_windows = false;
    c
}

fn node_with(id: u32, cfg: VerbsFabricConfig, token: &str, arena_bytes: u64) -> Node {
    let arena = Arc::new(
        SharedArena::create(
            &format!("verbs-fabric-{id}"),
            arena_bytes,
            &ArenaOptions::default(),
        )
        .unwrap(),
    );
    let (tx, events) = event_channel();
    let identity = FabricIdentity {
        node: NodeId(id),
        cluster_token: token.into(),
    };
    let arenas = BTreeMap::from([(ARENA, arena.clone())]);
    let fabric = VerbsFabric::start(cfg, identity, arenas, tx).expect("start the verbs fabric");
    Node {
        id: NodeId(id),
        fabric,
        events,
        arena,
    }
}

fn node(id: u32, device: &str) -> Node {
    node_with(id, config(device), TOKEN, 24 * MIB)
}

impl Node {
    /// The next event, within the deadline.
    fn next(&mut self) -> FabricEvent {
        self.next_waiting(|| std::thread::sleep(Duration::from_millis(1)))
    }

    /// The next event, polling without sleeping (for timings: `next` sleeps 1 ms between
    /// looks, which would be all a fast operation measures).
    fn next_spinning(&mut self) -> FabricEvent {
        self.next_waiting(std::thread::yield_now)
    }

    fn next_waiting(&mut self, pause: impl Fn()) -> FabricEvent {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.events.try_recv() {
                Ok(e) => return e,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    assert!(
                        Instant::now() < deadline,
                        "{}: no event within {WAIT:?}",
                        self.id
                    );
                    pause();
                }
                Err(e) => panic!("{}: event channel: {e}", self.id),
            }
        }
    }

    /// The events that arrive before a marker message `from` (connected to this node) sends
    /// now: what the test did before had the time to report, on the same event channel.
    fn events_before_marker(&mut self, from: &Node) -> Vec<FabricEvent> {
        from.fabric
            .send(self.id, MARKER.to_vec())
            .expect("send the marker");
        let mut before = Vec::new();
        loop {
            match self.next() {
                FabricEvent::Message { peer, bytes } if peer == from.id && *bytes == *MARKER => {
                    return before;
                }
                e => before.push(e),
            }
        }
    }

    /// No event arrives before a marker message `from` sends now.
    fn assert_quiet(&mut self, from: &Node) {
        let before = self.events_before_marker(from);
        assert!(
            before.is_empty(),
            "{}: unexpected events before the marker: {before:?}",
            self.id
        );
    }

    fn expect_connected(&mut self, peer: NodeId) -> skyriver_core::PeerParams {
        match self.next() {
            FabricEvent::PeerConnected {
                peer: p,
                params,
                summary,
            } => {
                assert_eq!(p, peer);
                println!("{} connected: {summary}", self.id);
                params
            }
            e => panic!("{}: expected PeerConnected({peer}), got {e:?}", self.id),
        }
    }

    fn expect_message(&mut self, peer: NodeId) -> Vec<u8> {
        match self.next() {
            FabricEvent::Message { peer: p, bytes } => {
                assert_eq!(p, peer);
                bytes.to_vec()
            }
            e => panic!("{}: expected a Message, got {e:?}", self.id),
        }
    }

    /// The next READ completions, until `ops` of them arrived.
    fn expect_reads(&mut self, ops: usize) -> BTreeMap<ReadOpId, Result<(), ReadError>> {
        let mut out = BTreeMap::new();
        while out.len() < ops {
            match self.next() {
                FabricEvent::ReadCompleted { op, result } => {
                    assert!(out.insert(op, result).is_none(), "{op} completed twice");
                }
                e => panic!("{}: expected ReadCompleted, got {e:?}", self.id),
            }
        }
        out
    }

    /// Where `[offset, offset + len)` of this node's arena is, as a peer's core names it.
    fn remote(&self, offset: u64, len: u64) -> RemoteRegion {
        let key = self.fabric.region_keys()[&ARENA];
        RemoteRegion {
            addr: key.base_addr + offset,
            len,
            rkey: key.rkey,
        }
    }
}

fn local(offset: u64, len: u64) -> LocalRegion {
    LocalRegion {
        arena: ARENA,
        offset,
        len,
    }
}

/// Connects `a` to `b` and checks both sides report it.
fn connect(a: &mut Node, b: &mut Node) -> skyriver_core::PeerParams {
    let t = Instant::now();
    a.fabric.connect(b.id, b.fabric.listen_addr());
    assert!(a.fabric.is_connected_or_connecting(b.id));
    let pa = a.expect_connected(b.id);
    let pb = b.expect_connected(a.id);
    println!("connected in {:?}", t.elapsed());
    assert_eq!(pa, pb, "both sides use the connector's measured costs");
    assert!(a.fabric.is_connected_or_connecting(b.id));
    assert!(b.fabric.is_connected_or_connecting(a.id));
    pa
}

fn pair(test: &str) -> Option<(Node, Node)> {
    let (da, db) = devices(test)?;
    let mut a = node(1, &da);
    let mut b = node(2, &db);
    connect(&mut a, &mut b);
    Some((a, b))
}

#[test]
fn start_without_the_device_is_a_clear_error() {
    // Runs everywhere: without rdma-core, without devices, or with them.
    let (tx, _rx) = event_channel();
    let identity = FabricIdentity {
        node: NodeId(1),
        cluster_token: TOKEN.into(),
    };
    let cfg = VerbsFabricConfig::new("skyriver_no_such_device", "127.0.0.1:0".parse().unwrap());
    match VerbsFabric::start(cfg, identity, BTreeMap::new(), tx) {
        Err(error @ VerbsStartError::OpenDevice { .. }) => {
            let msg = error.to_string();
            println!("{msg}");
            assert!(
                msg.contains("skyriver_no_such_device")
                    && (msg.contains("not found") || msg.contains("unavailable")),
                "unclear error: {msg}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a device that does not exist opened"),
    }
}

#[test]
fn connects_with_the_cluster_token_and_refuses_a_wrong_one() {
    let Some((da, db)) = devices("connects_with_the_cluster_token_and_refuses_a_wrong_one") else {
        return;
    };
    let mut a = node(1, &da);
    let mut b = node(2, &db);
    let params = connect(&mut a, &mut b);
    assert_eq!(params.lanes, 2);
    let c = params.costs;
    assert!(c.round_trip_ns > 0.0 && c.wire_bytes_per_sec > 0.0 && c.copy_bytes_per_sec > 0.0);
    // Connecting again while connected is a no-op.
    a.fabric.connect(b.id, b.fabric.listen_addr());
    b.fabric.connect(a.id, a.fabric.listen_addr());
    a.assert_quiet(&b);
    b.assert_quiet(&a);

    // A node with another token is refused on both sides; the acceptor reports nothing about
    // the unauthenticated caller.
    let mut intruder = node_with(3, config(&da), "another-cluster", 4 * MIB);
    intruder.fabric.connect(b.id, b.fabric.listen_addr());
    match intruder.next() {
        FabricEvent::PeerLost { peer, reason } => {
            println!("intruder: {reason}");
            assert_eq!(peer, b.id);
            assert!(reason.contains("token"), "{reason}");
        }
        e => panic!("expected PeerLost, got {e:?}"),
    }
    assert!(!intruder.fabric.is_connected_or_connecting(b.id));
    b.assert_quiet(&a);
    assert!(!b.fabric.is_connected_or_connecting(intruder.id));

    // The connector refuses a listener with another token too.
    let mut c3 = node_with(4, config(&db), "another-cluster", 4 * MIB);
    a.fabric.connect(c3.id, c3.fabric.listen_addr());
    match a.next() {
        FabricEvent::PeerLost { peer, reason } => {
            println!("a: {reason}");
            assert_eq!(peer, c3.id);
            assert!(reason.contains("token"), "{reason}");
        }
        e => panic!("expected PeerLost, got {e:?}"),
    }
    // c3 reported nothing of the refused connector: its next event is a connection from its
    // own cluster (the intruder shares its token).
    connect(&mut intruder, &mut c3);
    c3.assert_quiet(&intruder);

    // Asking for one node id at another node's address is refused.
    let mut d = node(5, &da);
    d.fabric.connect(NodeId(77), b.fabric.listen_addr());
    match d.next() {
        FabricEvent::PeerLost { peer, reason } => {
            println!("d: {reason}");
            assert_eq!(peer, NodeId(77));
            assert!(reason.contains("expected node-77"), "{reason}");
        }
        e => panic!("expected PeerLost, got {e:?}"),
    }

    // A version-1 connector (it sent the token in clear) is told which version to speak.
    {
        use std::io::{Read, Write};
        let mut old = std::net::TcpStream::connect(b.fabric.listen_addr()).unwrap();
        old.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        old.write_all(b"SKRVVF01").unwrap();
        let mut len = [0u8; 4];
        old.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        old.read_exact(&mut body).unwrap();
        assert_eq!(body[0], 1, "version 1's Reply::Refuse");
        let text = String::from_utf8_lossy(&body);
        println!("version 1 connector: {text}");
        assert!(text.contains("version 3"), "{text}");
    }
    b.assert_quiet(&a);

    // The first connection is unharmed.
    a.fabric.send(b.id, b"still here".to_vec()).unwrap();
    assert_eq!(b.expect_message(a.id), b"still here");
}

#[test]
fn messages_round_trip_in_order() {
    let Some((mut a, mut b)) = pair("messages_round_trip_in_order") else {
        return;
    };
    let slot = a.fabric.receive_slot_bytes() as usize;
    let sizes = [1usize, 7, 100, 128, 129, 1000, 4096, slot - 1, slot];
    // More messages than receive slots (32 per lane) and send slots: slots are reposted and
    // SENDs queue for room, in order.
    for round in 0..20u64 {
        for (i, &size) in sizes.iter().enumerate() {
            a.fabric
                .send(b.id, pattern(round * 100 + i as u64, size))
                .unwrap();
            b.fabric
                .send(a.id, pattern(round * 100 + i as u64 + 50, size))
                .unwrap();
        }
    }
    for round in 0..20u64 {
        for (i, &size) in sizes.iter().enumerate() {
            assert_eq!(
                b.expect_message(a.id),
                pattern(round * 100 + i as u64, size),
                "a -> b, round {round}, size {size}"
            );
            assert_eq!(
                a.expect_message(b.id),
                pattern(round * 100 + i as u64 + 50, size),
                "b -> a, round {round}, size {size}"
            );
        }
    }
    assert!(matches!(
        a.fabric.send(b.id, vec![0; slot + 1]),
        Err(FabricError::MessageTooLarge { len, limit }) if len == slot + 1 && limit == slot
    ));
    assert!(matches!(
        a.fabric.send(NodeId(99), vec![1]),
        Err(FabricError::NotConnected(NodeId(99)))
    ));
}

#[test]
fn send_eager_gathers_header_and_arena_bytes() {
    let Some((a, mut b)) = pair("send_eager_gathers_header_and_arena_bytes") else {
        return;
    };
    let slot = a.fabric.receive_slot_bytes() as u64;
    let max_payload = slot - (wire::HEADER_BYTES + wire::EAGER_FIXED_BYTES) as u64;
    for (i, (offset, len)) in [(0u64, 1u64), (4096, 100), (12345, max_payload)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(i as u64 + 7, len as usize);
        write_arena(&a.arena, offset, &data);
        let header = EagerHeader {
            req: TransferId(40 + i as u64),
            sizes: ObjectSizes {
                data_size: 1 << 20,
                metadata_size: 3,
            },
            digest: skyriver_core::ContentDigest(0xd1 + i as u64),
            offset: 1000 * i as u64,
        };
        a.fabric
            .send_eager(b.id, &header, local(offset, len))
            .unwrap();
        let bytes = b.expect_message(a.id);
        match wire::decode(&bytes).expect("decodes") {
            PeerMessage::EagerData { header: h, payload } => {
                assert_eq!(h, header);
                assert!(payload == data, "payload of {len} bytes differs");
            }
            m => panic!("expected EagerData, got {m}"),
        }
    }
    let header = EagerHeader {
        req: TransferId(1),
        sizes: ObjectSizes {
            data_size: 1,
            metadata_size: 0,
        },
        digest: skyriver_core::ContentDigest(1),
        offset: 0,
    };
    assert!(matches!(
        a.fabric
            .send_eager(b.id, &header, local(0, max_payload + 1)),
        Err(FabricError::MessageTooLarge { .. })
    ));
    assert!(matches!(
        a.fabric.send_eager(b.id, &header, local(24 * MIB - 10, 11)),
        Err(FabricError::BadRegion(_))
    ));
}

#[test]
fn reads_of_4kib_1mib_and_8mib_are_exact() {
    let Some((mut a, b)) = pair("reads_of_4kib_1mib_and_8mib_are_exact") else {
        return;
    };
    let src = pattern(42, (20 * MIB) as usize);
    write_arena(&b.arena, 0, &src);
    let cases = [
        (4096u64, 100u64, 3u64),
        (MIB, 777, 8192 + 1),
        (8 * MIB, 8192, 2 * MIB),
        // Several outstanding at once over both lanes.
        (4096, 5, 11 * MIB),
        (MIB, 3 * MIB, 12 * MIB),
        (8 * MIB, 11 * MIB, 14 * MIB),
    ];
    for (i, &(len, src_off, dst_off)) in cases.iter().enumerate() {
        a.fabric
            .post_read(
                b.id,
                ReadOpId(i as u64),
                (i % 2) as u16,
                local(dst_off, len),
                b.remote(src_off, len),
            )
            .expect("a place for its completion");
        if i < 3 {
            let t = Instant::now();
            let done = a.expect_reads(1);
            println!("READ of {len} bytes took {:?}", t.elapsed());
            assert_eq!(done[&ReadOpId(i as u64)], Ok(()));
        }
    }
    let done = a.expect_reads(3);
    assert!(done.values().all(Result::is_ok), "{done:?}");
    for &(len, src_off, dst_off) in &cases {
        let got = arena_bytes(&a.arena, dst_off, len);
        assert!(
            got == src[src_off as usize..(src_off + len) as usize],
            "READ of {len} bytes from {src_off} into {dst_off} differs"
        );
        println!("READ of {len} bytes ok");
    }
}

#[test]
fn reads_outside_the_peer_arena_fail_cleanly() {
    let Some((mut a, mut b)) = pair("reads_outside_the_peer_arena_fail_cleanly") else {
        return;
    };
    let end = 24 * MIB;
    let bad = [
        b.remote(end - 100, 200), // runs past the end
        b.remote(end, 1),         // just past it
        RemoteRegion {
            addr: 4096, // not the peer's memory at all
            len: 4096,
            rkey: b.remote(0, 1).rkey,
        },
    ];
    for (i, remote) in bad.iter().enumerate() {
        a.fabric
            .post_read(b.id, ReadOpId(i as u64), 0, local(0, remote.len), *remote)
            .expect("a place for its completion");
        let done = a.expect_reads(1);
        assert_eq!(
            done[&ReadOpId(i as u64)],
            Err(ReadError::RemoteAccess),
            "{remote}"
        );
    }
    // Local mistakes fail too, without harming the connection.
    a.fabric
        .post_read(b.id, ReadOpId(10), 0, local(end - 1, 2), b.remote(0, 2))
        .expect("a place for its completion");
    assert!(matches!(
        a.expect_reads(1)[&ReadOpId(10)],
        Err(ReadError::QueuePair(_))
    ));
    a.fabric
        .post_read(b.id, ReadOpId(11), 9, local(0, 2), b.remote(0, 2))
        .expect("a place for its completion");
    assert!(matches!(
        a.expect_reads(1)[&ReadOpId(11)],
        Err(ReadError::QueuePair(_))
    ));
    a.fabric
        .post_read(NodeId(99), ReadOpId(12), 0, local(0, 2), b.remote(0, 2))
        .expect("a place for its completion");
    assert_eq!(
        a.expect_reads(1)[&ReadOpId(12)],
        Err(ReadError::ConnectionLost)
    );

    // The connection still works.
    write_arena(&b.arena, 0, b"intact");
    a.fabric
        .post_read(b.id, ReadOpId(20), 1, local(100, 6), b.remote(0, 6))
        .expect("a place for its completion");
    assert_eq!(a.expect_reads(1)[&ReadOpId(20)], Ok(()));
    assert_eq!(arena_bytes(&a.arena, 100, 6), b"intact");
    a.fabric.send(b.id, b"ok".to_vec()).unwrap();
    assert_eq!(b.expect_message(a.id), b"ok");

    // Grant bookkeeping, per lease.
    b.fabric
        .grant_read(a.id, TransferId(1), local(0, 4096))
        .unwrap();
    b.fabric
        .grant_read(a.id, TransferId(2), local(0, 4096))
        .unwrap();
    assert!(b.fabric.revoke_read(a.id, TransferId(1)));
    assert_eq!(
        b.fabric.granted_regions(),
        vec![(a.id, TransferId(2), local(0, 4096))]
    );
    assert!(b.fabric.revoke_read(a.id, TransferId(2)));
    assert!(b.fabric.revoke_read(a.id, TransferId(2))); // logged, harmless
    assert!(b.fabric.granted_regions().is_empty());

    // A key that is not the arena's may be a memory window the peer bound for a lease, so it is
    // posted: a wrong one fails at the NIC with a remote access error, which breaks the QP (as
    // RDMA does); the connection is reported lost, and the holder is unharmed.
    let wrong = RemoteRegion {
        rkey: b.remote(0, 1).rkey ^ 0x55,
        ..b.remote(0, 4096)
    };
    a.fabric
        .post_read(b.id, ReadOpId(30), 0, local(0, 4096), wrong)
        .expect("a place for its completion");
    assert_eq!(
        a.expect_reads(1)[&ReadOpId(30)],
        Err(ReadError::RemoteAccess)
    );
    assert!(matches!(a.next(), FabricEvent::PeerLost { .. }));
    assert!(matches!(b.next(), FabricEvent::PeerLost { .. }));
    connect(&mut a, &mut b);
    a.fabric
        .post_read(b.id, ReadOpId(31), 0, local(100, 6), b.remote(0, 6))
        .expect("a place for its completion");
    assert_eq!(a.expect_reads(1)[&ReadOpId(31)], Ok(()));
}

/// The fabric's uses of arena memory are claims like any other view in the process: a READ
/// into bytes being read, an eager send or a grant of bytes being written are refused with an
/// error; a granted region cannot be written until revoked.
#[test]
fn fabric_views_that_would_alias_a_live_view_are_refused() {
    let Some((mut a, b)) = pair("fabric_views_that_would_alias_a_live_view_are_refused") else {
        return;
    };
    write_arena(&b.arena, 0, &[7; 4096]);
    write_arena(&a.arena, 0, b"intact");
    let reading = ReadableRegion::new(a.arena.clone(), 0, 4096).unwrap();
    a.fabric
        .post_read(b.id, ReadOpId(1), 0, local(0, 4096), b.remote(0, 4096))
        .expect("a place for its completion");
    assert!(matches!(
        a.expect_reads(1)[&ReadOpId(1)],
        Err(ReadError::QueuePair(_))
    ));
    assert_eq!(&reading.as_slice()[..6], b"intact");
    drop(reading);
    a.fabric
        .post_read(b.id, ReadOpId(2), 0, local(0, 4096), b.remote(0, 4096))
        .expect("a place for its completion");
    assert_eq!(a.expect_reads(1)[&ReadOpId(2)], Ok(()));
    assert_eq!(arena_bytes(&a.arena, 0, 4096), [7; 4096]);

    b.fabric
        .grant_read(a.id, TransferId(1), local(0, 4096))
        .unwrap();
    assert!(b.arena.write(100, b"x").is_err(), "granted: read only");
    assert!(b.fabric.revoke_read(a.id, TransferId(1)));
    b.arena.write(100, b"x").unwrap();

    let writing = WritableRegion::new(b.arena.clone(), 8192, 100).unwrap();
    assert!(matches!(
        b.fabric.grant_read(a.id, TransferId(2), local(8000, 1000)),
        Err(FabricError::InUse { .. })
    ));
    let header = EagerHeader {
        req: TransferId(3),
        sizes: ObjectSizes {
            data_size: 100,
            metadata_size: 0,
        },
        digest: skyriver_core::ContentDigest(1),
        offset: 0,
    };
    assert!(matches!(
        b.fabric.send_eager(a.id, &header, local(8192, 100)),
        Err(FabricError::InUse { .. })
    ));
    drop(writing);
    b.fabric
        .send_eager(a.id, &header, local(8192, 100))
        .unwrap();
    match wire::decode(&a.expect_message(b.id)).expect("decodes") {
        PeerMessage::EagerData { header: got, .. } => assert_eq!(got, header),
        m => panic!("expected EagerData, got {m}"),
    }
}

#[test]
fn peer_dropped_mid_reads_completes_every_read_then_peer_lost() {
    let Some((mut a, b)) = pair("peer_dropped_mid_reads_completes_every_read_then_peer_lost")
    else {
        return;
    };
    const OPS: u64 = 40;
    for i in 0..OPS {
        a.fabric
            .post_read(
                b.id,
                ReadOpId(i),
                (i % 2) as u16,
                local(i * MIB / 2, MIB / 2),
                b.remote(i * MIB / 2, MIB / 2),
            )
            .expect("a place for its completion");
    }
    let t = Instant::now();
    drop(b);
    let mut completed = BTreeSet::new();
    let (mut ok, mut failed) = (0, 0);
    loop {
        match a.next() {
            FabricEvent::ReadCompleted { op, result } => {
                assert!(completed.insert(op), "{op} completed twice");
                match result {
                    Ok(()) => ok += 1,
                    Err(e) => {
                        failed += 1;
                        println!("{op}: {e}");
                    }
                }
            }
            FabricEvent::PeerLost { peer, reason } => {
                println!("PeerLost({peer}) after {:?}: {reason}", t.elapsed());
                assert_eq!(peer, NodeId(2));
                break;
            }
            e => panic!("unexpected {e:?}"),
        }
    }
    println!("{ok} READs completed, {failed} failed before PeerLost");
    assert_eq!(
        completed.len() as u64,
        OPS,
        "every READ completes before PeerLost"
    );
    assert!(!a.fabric.is_connected_or_connecting(NodeId(2)));
    // New READs to the lost peer fail at once; that failure is the next event (nothing came
    // after PeerLost).
    a.fabric
        .post_read(
            NodeId(2),
            ReadOpId(100),
            0,
            local(0, 8),
            RemoteRegion {
                addr: 0,
                len: 8,
                rkey: 0,
            },
        )
        .expect("a place for its completion");
    assert_eq!(
        a.expect_reads(1)[&ReadOpId(100)],
        Err(ReadError::ConnectionLost)
    );
}

#[test]
fn reads_across_a_split_registration() {
    let Some((da, db)) = devices("reads_across_a_split_registration") else {
        return;
    };
    // Forced small maxima, different on each side so boundaries interleave.
    let mut ca = config(&da);
    ca.max_mr_bytes = 48 * 1024;
    let mut cb = config(&db);
    cb.max_mr_bytes = 64 * 1024;
    let mut a = node_with(1, ca, TOKEN, 2 * MIB);
    let b = node_with(2, cb, TOKEN, 2 * MIB);
    let mut b = b;
    connect(&mut a, &mut b);
    let regs = b.fabric.registrations();
    assert_eq!(regs[&ARENA].len(), 32, "2 MiB in 64 KiB regions");
    let keys: BTreeSet<u32> = regs[&ARENA].iter().map(|c| c.rkey).collect();
    assert_eq!(keys.len(), 32, "each region has its own rkey");
    assert_eq!(
        a.fabric.registrations()[&ARENA].len(),
        (2 * MIB).div_ceil(48 * 1024) as usize
    );
    let src = pattern(99, (2 * MIB) as usize);
    write_arena(&b.arena, 0, &src);
    // One READ across every boundary of both sides, named by the arena's one key.
    let cases = [
        (5000u64, 7000u64, 2 * MIB - 12000),
        (65535, 49151, 2),
        (0, 0, 2 * MIB),
    ];
    for (i, &(src_off, dst_off, len)) in cases.iter().enumerate() {
        a.fabric
            .post_read(
                b.id,
                ReadOpId(i as u64),
                (i % 2) as u16,
                local(dst_off, len),
                b.remote(src_off, len),
            )
            .expect("a place for its completion");
        assert_eq!(a.expect_reads(1)[&ReadOpId(i as u64)], Ok(()));
        assert!(
            arena_bytes(&a.arena, dst_off, len) == src[src_off as usize..(src_off + len) as usize],
            "split READ of {len} bytes differs"
        );
    }
}

#[test]
fn simultaneous_connects_make_one_connection() {
    let Some((da, db)) = devices("simultaneous_connects_make_one_connection") else {
        return;
    };
    for round in 0..2 {
        let mut a = node(1, &da);
        let mut b = node(2, &db);
        a.fabric.connect(b.id, b.fabric.listen_addr());
        b.fabric.connect(a.id, a.fabric.listen_addr());
        a.expect_connected(b.id);
        b.expect_connected(a.id);
        a.assert_quiet(&b);
        b.assert_quiet(&a);
        a.fabric.send(b.id, vec![round; 10]).unwrap();
        b.fabric.send(a.id, vec![round + 1; 10]).unwrap();
        assert_eq!(b.expect_message(a.id), vec![round; 10]);
        assert_eq!(a.expect_message(b.id), vec![round + 1; 10]);
    }
}

#[test]
fn reads_beyond_the_send_queue_wait_for_room() {
    let Some((da, db)) = devices("reads_beyond_the_send_queue_wait_for_room") else {
        return;
    };
    // 2 MiB READs of 64 KiB work requests (32 each) in lists of 4, through send queues of 16.
    let small = |device: &str| {
        let mut c = config(device);
        c.send_queue_depth = 16;
        c.send_slots = 8;
        c.max_read_bytes = 64 * 1024;
        c.max_reads_per_list = 4;
        c
    };
    let mut a = node_with(1, small(&da), TOKEN, 16 * MIB);
    let mut b = node_with(2, small(&db), TOKEN, 16 * MIB);
    connect(&mut a, &mut b);
    let src = pattern(5, (8 * MIB) as usize);
    write_arena(&b.arena, 0, &src);
    for i in 0..4u64 {
        a.fabric
            .post_read(
                b.id,
                ReadOpId(i),
                (i % 2) as u16,
                local(8 * MIB + i * 2 * MIB, 2 * MIB),
                b.remote(i * 2 * MIB, 2 * MIB),
            )
            .expect("a place for its completion");
    }
    // Messages share lane 0's send queue with the READs. They are more than b's receive
    // slots, so b's driver takes them first: a SEND waiting on receiver-not-ready retries
    // holds up what follows it on its queue pair, READs included, until b takes messages.
    for i in 0..40u8 {
        a.fabric.send(b.id, vec![i; 100]).unwrap();
    }
    for i in 0..40u8 {
        assert_eq!(b.expect_message(a.id), vec![i; 100]);
    }
    let done = a.expect_reads(4);
    assert!(done.values().all(Result::is_ok), "{done:?}");
    assert!(
        arena_bytes(&a.arena, 8 * MIB, 8 * MIB) == src[..],
        "queued READs differ"
    );
}

/// CPU time (user + system, in clock ticks) of this process's threads named `name`.
fn thread_cpu_ticks(name: &str) -> (usize, u64) {
    let mut threads = 0;
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.len() > 12 {
            threads += 1;
            ticks +=
                fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        }
    }
    (threads, ticks)
}

#[test]
fn idle_pollers_sleep_on_the_completion_channel_then_wake_for_traffic() {
    let Some((mut a, mut b)) =
        pair("idle_pollers_sleep_on_the_completion_channel_then_wake_for_traffic")
    else {
        return;
    };
    // Let the pollers finish their busy-poll window, then measure a quiet interval. Both sleeps
    // are the measurement's intervals (CPU time over wall time), not waits for a condition.
    std::thread::sleep(Duration::from_millis(200));
    let (threads, before) = thread_cpu_ticks("verbs-poller");
    assert_eq!(threads, 2, "one poller per fabric");
    let idle = Duration::from_secs(3);
    std::thread::sleep(idle);
    let (_, after) = thread_cpu_ticks("verbs-poller");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu = (after - before) as f64 / hz;
    let share = cpu / (2.0 * idle.as_secs_f64());
    println!(
        "idle pollers: {:.0} ms of CPU in {:?} for two pollers ({:.2}% of a core each)",
        cpu * 1e3,
        idle,
        share * 100.0
    );
    assert!(
        share < 0.05,
        "idle pollers used {:.1}% of a core each: they should sleep on events",
        share * 100.0
    );
    // Asleep, they still see traffic and peer loss at once.
    a.fabric.send(b.id, b"after a nap".to_vec()).unwrap();
    assert_eq!(b.expect_message(a.id), b"after a nap".to_vec());
    b.fabric.send(a.id, b"and back".to_vec()).unwrap();
    assert_eq!(a.expect_message(b.id), b"and back".to_vec());
}

/// Takes every event queued for `node` now, without dropping any (so their receive slots stay
/// held).
fn drain_events(node: &mut Node) -> Vec<FabricEvent> {
    let mut events = Vec::new();
    while let Ok(event) = node.events.try_recv() {
        events.push(event);
    }
    events
}

#[test]
fn a_slow_receiver_holds_a_fast_sender_back_with_its_receive_slots() {
    let Some((mut a, b)) = pair("a_slow_receiver_holds_a_fast_sender_back_with_its_receive_slots")
    else {
        return;
    };
    let slots = config("-").recv_slots as usize;
    const MESSAGES: u64 = 1000;
    let sender = std::thread::spawn(move || {
        for n in 0..MESSAGES {
            b.fabric.send(NodeId(1), pattern(n, 1000)).unwrap();
        }
        b
    });
    // The receiving driver is slow: it lets messages pile up, then handles a batch at once.
    // Undelivered messages keep their receive slots, so no more than the slots can pile up,
    // and the sender waits on receiver-not-ready retries meanwhile.
    let deadline = Instant::now() + WAIT;
    let (mut next, mut most_held) = (0u64, 0usize);
    while next < MESSAGES {
        assert!(Instant::now() < deadline, "only {next} messages arrived");
        // The slow driver's pace (the behaviour under test), not a wait for a condition.
        std::thread::sleep(Duration::from_millis(5));
        let batch = drain_events(&mut a);
        let held = batch
            .iter()
            .filter(|e| matches!(e, FabricEvent::Message { .. }))
            .count();
        most_held = most_held.max(held);
        assert!(held <= slots, "{held} messages held, {slots} receive slots");
        for event in batch {
            match event {
                FabricEvent::Message { peer, bytes } => {
                    assert_eq!(peer, NodeId(2));
                    assert_eq!(*bytes, *pattern(next, 1000), "message {next}");
                    next += 1;
                }
                e => panic!("expected a Message, got {e:?}"),
            }
        }
    }
    println!("at most {most_held} of {slots} receive slots held at once");
    let mut b = sender.join().unwrap();
    b.assert_quiet(&a);
}

#[test]
fn a_peer_that_takes_no_messages_is_dropped_with_a_reason() {
    let Some((da, db)) = devices("a_peer_that_takes_no_messages_is_dropped_with_a_reason") else {
        return;
    };
    let mut a = node(1, &da);
    let mut flooder_config = config(&db);
    flooder_config.max_queued_sends = 64;
    let mut b = node_with(2, flooder_config, TOKEN, 24 * MIB);
    connect(&mut a, &mut b);
    let slots = config("-").recv_slots as usize;
    // a's driver takes nothing: its slots fill, b's SENDs wait on receiver-not-ready retries,
    // its send slots and then its queue fill, and b gives up on a.
    let mut refused = None;
    for n in 0..10_000u64 {
        if let Err(error) = b.fabric.send(a.id, pattern(n, 1000)) {
            refused = Some((n, error));
            break;
        }
    }
    let (sent, error) = refused.expect("the flooder was never held back");
    println!("flooder refused after {sent} messages: {error}");
    assert!(
        matches!(error, FabricError::PeerNotReading { peer, .. } if peer == a.id),
        "{error}"
    );
    match b.next() {
        FabricEvent::PeerLost { peer, reason } => {
            assert_eq!(peer, a.id);
            assert!(reason.contains("stopped taking messages"), "{reason}");
        }
        e => panic!("expected PeerLost, got {e:?}"),
    }
    // a holds at most its slots' worth, and hears that b dropped the connection.
    let mut held = Vec::new();
    loop {
        match a.next() {
            FabricEvent::Message { bytes, .. } => held.push(bytes),
            FabricEvent::PeerLost { peer, .. } => {
                assert_eq!(peer, b.id);
                break;
            }
            e => panic!("expected Message or PeerLost, got {e:?}"),
        }
    }
    assert!(held.len() <= slots, "{} messages held", held.len());
    // Held messages outlive their connection and fabric: the slots' memory stays mapped.
    drop(a);
    for (n, bytes) in held.iter().enumerate() {
        assert_eq!(**bytes, *pattern(n as u64, 1000), "held message {n}");
    }
}

/// Copies `data` into a test arena.
fn write_arena(arena: &SharedArena, offset: u64, data: &[u8]) {
    arena.write(offset, data).unwrap();
}

/// A copy of `[offset, offset + len)` of a test arena.
fn arena_bytes(arena: &SharedArena, offset: u64, len: u64) -> Vec<u8> {
    let mut bytes = vec![0; len as usize];
    arena.read(offset, &mut bytes).unwrap();
    bytes
}

/// The next `ReadGranted` for `req`, with its keys.
fn expect_granted(node: &mut Node, req: TransferId) -> Vec<u32> {
    match node.next() {
        FabricEvent::ReadGranted {
            req: r,
            result: Ok(grant),
            ..
        } if r == req => grant.keys,
        e => panic!("{}: expected ReadGranted({req}), got {e:?}", node.id),
    }
}

fn expect_revoked(node: &mut Node, req: TransferId) {
    match node.next() {
        FabricEvent::ReadRevoked { req: r, .. } if r == req => {}
        e => panic!("{}: expected ReadRevoked({req}), got {e:?}", node.id),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn memory_windows_scope_reads_to_one_lease_and_cost_little() {
    let Some((da, db)) = devices("memory_windows_scope_reads_to_one_lease_and_cost_little") else {
        return;
    };
    let windows = |device: &str| VerbsFabricConfig {
        memory_windows: true,
        lanes: 3,
        ..config(device)
    };
    let mut a = node_with(1, windows(&da), TOKEN, 24 * MIB);
    let mut b = node_with(2, windows(&db), TOKEN, 24 * MIB);
    assert!(
        b.fabric.uses_memory_windows(),
        "rxe has memory windows: the fabric must use them"
    );
    let params = connect(&mut a, &mut b);
    assert_eq!(params.lanes, 3);
    let object = pattern(9, 64 * 1024);
    write_arena(&b.arena, 8192, &object);

    // A grant binds one window per lane and answers once they are bound.
    let req = TransferId(1);
    let started = Instant::now();
    assert!(b
        .fabric
        .grant_read(a.id, req, local(8192, 64 * 1024))
        .unwrap()
        .is_none());
    let keys = expect_granted(&mut b, req);
    println!(
        "grant of 3 windows answered in {:?}: keys {keys:#x?}",
        started.elapsed()
    );
    assert_eq!(keys.len(), 3);
    let distinct: std::collections::BTreeSet<u32> = keys.iter().copied().collect();
    assert_eq!(distinct.len(), 3, "a key per lane");
    assert_eq!(
        b.fabric.granted_regions(),
        vec![(a.id, req, local(8192, 64 * 1024))]
    );
    let arena_key = b.remote(0, 1).rkey;
    assert!(!keys.contains(&arena_key));

    // Each lane READs its slice with its own key; the bytes are exact.
    let slice = 64 * 1024 / 3 / 4096 * 4096;
    for (lane, key) in keys.iter().enumerate() {
        let offset = lane as u64 * slice;
        let len = if lane == 2 {
            64 * 1024 - 2 * slice
        } else {
            slice
        };
        let remote = RemoteRegion {
            addr: b.remote(8192 + offset, len).addr,
            len,
            rkey: *key,
        };
        a.fabric
            .post_read(
                b.id,
                ReadOpId(10 + lane as u64),
                lane as u16,
                local(MIB + offset, len),
                remote,
            )
            .expect("a place for its completion");
    }
    let done = a.expect_reads(3);
    assert!(done.values().all(Result::is_ok), "{done:?}");
    assert_eq!(arena_bytes(&a.arena, MIB, 64 * 1024), &object[..]);

    // The revocation invalidates the windows and answers when they are dead.
    let started = Instant::now();
    assert!(!b.fabric.revoke_read(a.id, req));
    expect_revoked(&mut b, req);
    println!(
        "revocation of 3 windows answered in {:?}",
        started.elapsed()
    );
    assert!(b.fabric.granted_regions().is_empty());

    // The cost per rendezvous: grant (bind on every lane) + revoke (invalidate), against a
    // 64 KiB READ on the same connection, each waited for (polling); medians of 50.
    let held = TransferId(99);
    assert!(b
        .fabric
        .grant_read(a.id, held, local(8192, 64 * 1024))
        .unwrap()
        .is_none());
    let held_key = expect_granted(&mut b, held)[0];
    let held_region = RemoteRegion {
        addr: b.remote(8192, 64 * 1024).addr,
        len: 64 * 1024,
        rkey: held_key,
    };
    let (mut access, mut reads) = (Vec::new(), Vec::new());
    for i in 0..50u64 {
        let req = TransferId(100 + i);
        let t = Instant::now();
        assert!(b
            .fabric
            .grant_read(a.id, req, local(8192, 64 * 1024))
            .unwrap()
            .is_none());
        assert!(matches!(
            b.next_spinning(),
            FabricEvent::ReadGranted { result: Ok(_), .. }
        ));
        assert!(!b.fabric.revoke_read(a.id, req));
        assert!(matches!(b.next_spinning(), FabricEvent::ReadRevoked { .. }));
        access.push(t.elapsed());
        let t = Instant::now();
        a.fabric
            .post_read(
                b.id,
                ReadOpId(1000 + i),
                0,
                local(MIB, 64 * 1024),
                held_region,
            )
            .expect("a place for its completion");
        assert!(matches!(
            a.next_spinning(),
            FabricEvent::ReadCompleted { result: Ok(()), .. }
        ));
        reads.push(t.elapsed());
    }
    assert!(!b.fabric.revoke_read(a.id, held));
    expect_revoked(&mut b, held);
    let (access, read) = (median(access), median(reads));
    println!(
        "memory windows per rendezvous (3 lanes): grant + revoke {access:?} p50, a 64 KiB READ \
         {read:?} p50 ({:.2}x)",
        access.as_secs_f64() / read.as_secs_f64()
    );

    // A READ with a revoked key fails with a remote access error (the requester's QP breaks,
    // as RDMA does), and the holder is unharmed: it accepts the next connection and serves.
    a.fabric
        .post_read(
            b.id,
            ReadOpId(2000),
            0,
            local(MIB, 4096),
            RemoteRegion {
                addr: b.remote(8192, 4096).addr,
                len: 4096,
                rkey: keys[0],
            },
        )
        .expect("a place for its completion");
    assert_eq!(
        a.expect_reads(1)[&ReadOpId(2000)],
        Err(ReadError::RemoteAccess)
    );
    assert!(matches!(a.next(), FabricEvent::PeerLost { .. }));
    assert!(matches!(b.next(), FabricEvent::PeerLost { .. }));
    connect(&mut a, &mut b);
    let req = TransferId(3);
    assert!(b
        .fabric
        .grant_read(a.id, req, local(8192, 4096))
        .unwrap()
        .is_none());
    let fresh = expect_granted(&mut b, req);
    assert!(!fresh.contains(&keys[0]), "a new binding, a new key");
    a.fabric
        .post_read(
            b.id,
            ReadOpId(3000),
            0,
            local(2 * MIB, 4096),
            RemoteRegion {
                addr: b.remote(8192, 4096).addr,
                len: 4096,
                rkey: fresh[0],
            },
        )
        .expect("a place for its completion");
    assert_eq!(a.expect_reads(1)[&ReadOpId(3000)], Ok(()));
    assert_eq!(arena_bytes(&a.arena, 2 * MIB, 4096), &object[..4096]);

    // The arena's own key opens nothing once windows are on (a remote access error).
    a.fabric
        .post_read(
            b.id,
            ReadOpId(4000),
            0,
            local(MIB, 4096),
            b.remote(8192, 4096),
        )
        .expect("a place for its completion");
    assert_eq!(
        a.expect_reads(1)[&ReadOpId(4000)],
        Err(ReadError::RemoteAccess)
    );
}

/// A relay's copy still being received (the core's `relay`): node b READs a 4 MiB object from
/// a into its block and, while the rest of the block is still being written (a `WritableRegion`
/// held as a landing READ would hold it), grants a its copy. A whole grant of the block is
/// refused (in use); the partial grant binds a window per lane over the block without claiming
/// it, a's READs of the received prefix bring its exact bytes, and once the relay's lease ends
/// (revoked as a failed or finished relay's is) the windows are invalidated before
/// `ReadRevoked` and their keys open nothing.
#[test]
fn a_relay_serves_the_received_prefix_of_its_copy_through_windows() {
    let test = "a_relay_serves_the_received_prefix_of_its_copy_through_windows";
    let Some((da, db)) = devices(test) else {
        return;
    };
    let windows = |device: &str| VerbsFabricConfig {
        memory_windows: true,
        lanes: 2,
        ..config(device)
    };
    let mut a = node_with(1, windows(&da), TOKEN, 24 * MIB);
    let mut b = node_with(2, windows(&db), TOKEN, 24 * MIB);
    assert!(b.fabric.serves_partial_copies());
    connect(&mut a, &mut b);
    let object = pattern(26, 4 * MIB as usize);
    let (original, block, landing_at) = (0, 8 * MIB, 16 * MIB);
    write_arena(&a.arena, original, &object);

    // b, the relay, READs the object's first MiB from its holder a into its block.
    let holder_req = TransferId(1);
    assert!(a
        .fabric
        .grant_read(b.id, holder_req, local(original, 4 * MIB))
        .unwrap()
        .is_none());
    let holder_keys = expect_granted(&mut a, holder_req);
    let holder_base = a.remote(original, 1).addr;
    let from_holder = |offset: u64, len: u64| RemoteRegion {
        addr: holder_base + offset,
        len,
        rkey: holder_keys[0],
    };
    b.fabric
        .post_read(a.id, ReadOpId(1), 0, local(block, MIB), from_holder(0, MIB))
        .expect("a place for its completion");
    assert_eq!(b.expect_reads(1)[&ReadOpId(1)], Ok(()));

    // The rest is still landing: a grant of the sealed kind cannot claim the block, the
    // partial one claims nothing of it.
    let landing = WritableRegion::new(b.arena.clone(), block + MIB, 3 * MIB).unwrap();
    assert!(matches!(
        b.fabric
            .grant_read(a.id, TransferId(6), local(block, 4 * MIB)),
        Err(FabricError::InUse { .. })
    ));
    let relay_req = TransferId(7);
    assert!(b
        .fabric
        .grant_partial_read(a.id, relay_req, local(block, 4 * MIB))
        .unwrap()
        .is_none());
    let relay_keys = expect_granted(&mut b, relay_req);
    assert_eq!(relay_keys.len(), 2, "a window per lane");
    assert_eq!(
        b.fabric.granted_regions(),
        vec![(a.id, relay_req, local(block, 4 * MIB))]
    );
    b.fabric.extend_partial_read(a.id, relay_req, MIB);
    let relay_base = b.remote(block, 1).addr;
    let from_relay = |lane: usize, offset: u64, len: u64| RemoteRegion {
        addr: relay_base + offset,
        len,
        rkey: relay_keys[lane],
    };
    // a READs the announced prefix, half on each lane, while the rest is still being written.
    for lane in 0..2u64 {
        let half = MIB / 2;
        a.fabric
            .post_read(
                b.id,
                ReadOpId(10 + lane),
                lane as u16,
                local(landing_at + lane * half, half),
                from_relay(lane as usize, lane * half, half),
            )
            .expect("a place for its completion");
    }
    let done = a.expect_reads(2);
    assert!(done.values().all(Result::is_ok), "{done:?}");
    assert_eq!(
        arena_bytes(&a.arena, landing_at, MIB),
        &object[..MIB as usize]
    );

    // The rest lands (a real READ into the granted block); the relay's copy is whole and its
    // reader takes the rest through the same windows.
    drop(landing);
    b.fabric
        .post_read(
            a.id,
            ReadOpId(2),
            1,
            local(block + MIB, 3 * MIB),
            RemoteRegion {
                rkey: holder_keys[1],
                ..from_holder(MIB, 3 * MIB)
            },
        )
        .expect("a place for its completion");
    assert_eq!(b.expect_reads(1)[&ReadOpId(2)], Ok(()));
    b.fabric.extend_partial_read(a.id, relay_req, 4 * MIB);
    a.fabric
        .post_read(
            b.id,
            ReadOpId(20),
            1,
            local(landing_at + MIB, 3 * MIB),
            from_relay(1, MIB, 3 * MIB),
        )
        .expect("a place for its completion");
    assert_eq!(a.expect_reads(1)[&ReadOpId(20)], Ok(()));
    assert_eq!(arena_bytes(&a.arena, landing_at, 4 * MIB), object);
    assert!(!a.fabric.revoke_read(b.id, holder_req));
    expect_revoked(&mut a, holder_req);

    // The relay's lease ends: its windows are invalidated before the revocation is reported,
    // then nothing holds the block and its keys open nothing.
    assert!(!b.fabric.revoke_read(a.id, relay_req));
    expect_revoked(&mut b, relay_req);
    assert!(b.fabric.granted_regions().is_empty());
    drop(WritableRegion::new(b.arena.clone(), block, 4 * MIB).expect("no claim on the block"));
    a.fabric
        .post_read(
            b.id,
            ReadOpId(30),
            0,
            local(0, 4096),
            from_relay(0, 0, 4096),
        )
        .expect("a place for its completion");
    assert_eq!(
        a.expect_reads(1)[&ReadOpId(30)],
        Err(ReadError::RemoteAccess),
        "a key of the ended relay lease"
    );
}

/// Without memory windows a relay's grant is the arena's key, answered at once, and claims
/// nothing of the block its own READs still write.
#[test]
fn a_relay_without_windows_grants_its_copy_with_the_arena_key() {
    let test = "a_relay_without_windows_grants_its_copy_with_the_arena_key";
    let Some((mut a, b)) = pair(test) else {
        return;
    };
    assert!(!b.fabric.uses_memory_windows());
    let object = pattern(27, MIB as usize);
    write_arena(&b.arena, 4 * MIB, &object);
    let landing = WritableRegion::new(b.arena.clone(), 5 * MIB, MIB).unwrap();
    let grant = b
        .fabric
        .grant_partial_read(a.id, TransferId(1), local(4 * MIB, 2 * MIB))
        .unwrap()
        .expect("answered at once without windows");
    assert!(grant.keys.is_empty(), "the arena's key: {grant:?}");
    assert!(matches!(
        b.fabric
            .grant_partial_read(a.id, TransferId(2), local(23 * MIB, 2 * MIB)),
        Err(FabricError::BadRegion(_))
    ));
    a.fabric
        .post_read(b.id, ReadOpId(1), 0, local(0, MIB), b.remote(4 * MIB, MIB))
        .expect("a place for its completion");
    assert_eq!(a.expect_reads(1)[&ReadOpId(1)], Ok(()));
    assert_eq!(arena_bytes(&a.arena, 0, MIB), object);
    drop(landing);
    assert!(b.fabric.revoke_read(a.id, TransferId(1)));
    assert!(b.fabric.granted_regions().is_empty());
}
