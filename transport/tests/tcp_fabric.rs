//! The TCP fabric between two nodes in one process: handshake, messages, emulated READs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use skyriver_core::node::{ReadError, ReadOpId};
use skyriver_core::wire::{self, EagerHeader, PeerMessage};
use skyriver_core::{
    ArenaId, ContentDigest, LocalRegion, NodeId, ObjectSizes, RemoteRegion, TransferId,
};
use skyriver_transport::fabric::tcp::{TcpFabric, TcpFabricConfig};
use skyriver_transport::fabric::{
    event_channel_with_capacity, EventReceiver, Fabric, FabricError, FabricEvent, FabricIdentity,
    EVENT_CHANNEL_CAPACITY,
};
use skyriver_transport::{ArenaOptions, ReadableRegion, SharedArena, WritableRegion};

const ARENA_BYTES: u64 = 32 << 20;

struct Node {
    fabric: TcpFabric,
    events: EventReceiver,
    arena: Arc<SharedArena>,
}

fn node(id: u32, token: &str) -> Node {
    node_with(
        id,
        token,
        TcpFabricConfig::new("127.0.0.1:0".parse().unwrap()),
    )
}

fn node_with(id: u32, token: &str, config: TcpFabricConfig) -> Node {
    node_with_events(id, token, config, EVENT_CHANNEL_CAPACITY)
}

/// A node whose driver's event channel has `capacity` places.
fn node_with_events(id: u32, token: &str, config: TcpFabricConfig, capacity: usize) -> Node {
    node_sized(id, token, config, capacity, ARENA_BYTES)
}

/// A node with an arena of `arena_len` bytes and an event channel of `capacity` places.
fn node_sized(
    id: u32,
    token: &str,
    config: TcpFabricConfig,
    capacity: usize,
    arena_len: u64,
) -> Node {
    let arena = Arc::new(SharedArena::create("test", arena_len, &ArenaOptions::default()).unwrap());
    let (tx, events) = event_channel_with_capacity(capacity);
    let identity = FabricIdentity {
        node: NodeId(id),
        cluster_token: token.into(),
    };
    let arenas = BTreeMap::from([(ArenaId(0), arena.clone())]);
    let fabric = TcpFabric::start(config, identity, arenas, tx).unwrap();
    Node {
        fabric,
        events,
        arena,
    }
}

/// Waits (bounded) until `capacity` events wait in `node`'s channel.
fn wait_until_full(node: &Node, capacity: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while node.events.len() < capacity {
        assert!(
            std::time::Instant::now() < deadline,
            "the channel never filled"
        );
        std::thread::yield_now();
    }
}

fn next_event(node: &mut Node) -> FabricEvent {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(event) = node.events.try_recv() {
            return event;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no fabric event within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn connected_pair() -> (Node, Node) {
    let config = || TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    connect(
        node_with(1, "secret", config()),
        node_with(2, "secret", config()),
    )
}

fn connect(mut a: Node, mut b: Node) -> (Node, Node) {
    a.fabric.connect(NodeId(2), b.fabric.listen_addr());
    assert!(matches!(
        next_event(&mut a),
        FabricEvent::PeerConnected {
            peer: NodeId(2),
            ..
        }
    ));
    assert!(matches!(
        next_event(&mut b),
        FabricEvent::PeerConnected {
            peer: NodeId(1),
            ..
        }
    ));
    (a, b)
}

fn remote(node: &Node, offset: u64, len: u64) -> RemoteRegion {
    let key = node.fabric.region_keys()[&ArenaId(0)];
    RemoteRegion {
        addr: key.base_addr + offset,
        len,
        rkey: key.rkey,
    }
}

/// Grants `reader` READs of `[offset, offset + len)` of `holder`'s arena for its transfer `req`,
/// and names the region as the holder's core would in a `Rendezvous`.
fn granted(holder: &Node, reader: NodeId, req: u64, offset: u64, len: u64) -> RemoteRegion {
    let grant = holder
        .fabric
        .grant_read(reader, TransferId(req), region(offset, len))
        .unwrap()
        .expect("the TCP fabric grants at once");
    assert_eq!(grant.keys.len(), 1, "one key serves every lane");
    RemoteRegion {
        rkey: grant.keys[0],
        ..remote(holder, offset, len)
    }
}

fn read_result(node: &mut Node, op: u64) -> Result<(), ReadError> {
    match next_event(node) {
        FabricEvent::ReadCompleted { op: got, result } if got == ReadOpId(op) => result,
        other => panic!("{other:?}"),
    }
}

fn region(offset: u64, len: u64) -> LocalRegion {
    LocalRegion {
        arena: ArenaId(0),
        offset,
        len,
    }
}

#[test]
fn messages_flow_both_ways_in_order() {
    let (mut a, mut b) = connected_pair();
    for n in 0..100u32 {
        a.fabric.send(NodeId(2), n.to_le_bytes().to_vec()).unwrap();
    }
    for n in 0..100u32 {
        match next_event(&mut b) {
            FabricEvent::Message {
                peer: NodeId(1),
                bytes,
            } => assert_eq!(*bytes, n.to_le_bytes()),
            other => panic!("{other:?}"),
        }
    }
    b.fabric.send(NodeId(1), b"back".to_vec()).unwrap();
    assert!(matches!(next_event(&mut a), FabricEvent::Message { bytes, .. } if *bytes == *b"back"));
}

/// A driver that does not take its events makes the connection's reader wait for room in the
/// bounded event channel (and so stop reading its socket): the channel never holds more than its
/// capacity, the sender resumes as events are taken, and every message arrives, in order.
#[test]
fn a_full_event_channel_holds_the_reader_back_and_loses_nothing() {
    const CAPACITY: usize = 4;
    const MESSAGES: u32 = 300;
    let config = || TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    let (mut a, b) = connect(
        node_with_events(1, "secret", config(), CAPACITY),
        node_with(2, "secret", config()),
    );
    for n in 0..MESSAGES {
        b.fabric.send(NodeId(1), n.to_le_bytes().to_vec()).unwrap();
    }
    let mut most_waiting = 0;
    for n in 0..MESSAGES {
        if n < MESSAGES - CAPACITY as u32 {
            // The reader refills the place each taken event frees: it waited, it did not stop.
            wait_until_full(&a, CAPACITY);
        }
        most_waiting = most_waiting.max(a.events.len());
        match next_event(&mut a) {
            FabricEvent::Message {
                peer: NodeId(2),
                bytes,
            } => assert_eq!(*bytes, n.to_le_bytes(), "message {n}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(most_waiting, CAPACITY, "the channel went over its capacity");
    assert!(a.events.try_recv().is_err());
}

/// A READ's completion takes its place in the driver's bounded channel when the READ is
/// posted: while every place is taken, `post_read` is refused at once (the driver's own call
/// cannot wait for the channel it drains, and the channel never goes over), and once the
/// driver takes an event the READ is posted and completes.
#[test]
fn a_full_event_channel_refuses_a_read_until_the_driver_takes_an_event() {
    const CAPACITY: usize = 2;
    let config = || TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    let (mut a, b) = connect(
        node_with_events(1, "secret", config(), CAPACITY),
        node_with(2, "secret", config()),
    );
    write_arena(&b.arena, 0, &[9; 4096]);
    let key = granted(&b, NodeId(1), 1, 0, 4096);
    for n in 0..CAPACITY as u32 {
        b.fabric.send(NodeId(1), n.to_le_bytes().to_vec()).unwrap();
    }
    wait_until_full(&a, CAPACITY);
    let refused = a
        .fabric
        .post_read(NodeId(2), ReadOpId(1), 0, region(0, 4096), key)
        .expect_err("a READ posted with no place for its completion");
    assert_eq!(refused.capacity, CAPACITY);
    // A READ that fails at once needs a place for its failure too.
    let bad = RemoteRegion { len: 1, ..key };
    assert!(a
        .fabric
        .post_read(NodeId(2), ReadOpId(2), 0, region(0, 4096), bad)
        .is_err());
    assert_eq!(a.events.len(), CAPACITY, "a refused READ queued something");
    // The driver takes an event: the place it frees takes the READ's completion.
    assert!(matches!(next_event(&mut a), FabricEvent::Message { .. }));
    a.fabric
        .post_read(NodeId(2), ReadOpId(3), 0, region(0, 4096), key)
        .expect("a place for its completion");
    assert!(matches!(next_event(&mut a), FabricEvent::Message { .. }));
    assert_eq!(read_result(&mut a, 3), Ok(()));
    assert_eq!(arena_bytes(&a.arena, 0, 4096), vec![9; 4096]);
    assert!(a.events.try_recv().is_err());
}

/// A peer that leaves while the driver is behind: its `PeerLost` waits for a place like its
/// messages (the channel never goes over), and comes after every one of them.
#[test]
fn a_lost_peer_is_reported_behind_its_messages_without_going_over() {
    const CAPACITY: usize = 2;
    const MESSAGES: u32 = 6;
    let config = || TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    let (mut a, b) = connect(
        node_with_events(1, "secret", config(), CAPACITY),
        node_with(2, "secret", config()),
    );
    for n in 0..MESSAGES {
        b.fabric.send(NodeId(1), n.to_le_bytes().to_vec()).unwrap();
    }
    wait_until_full(&a, CAPACITY);
    drop(b);
    let mut got = Vec::new();
    loop {
        assert!(
            a.events.len() <= CAPACITY,
            "the channel went over its capacity"
        );
        match next_event(&mut a) {
            FabricEvent::Message { bytes, .. } => {
                got.push(u32::from_le_bytes(bytes[..4].try_into().unwrap()))
            }
            FabricEvent::PeerLost {
                peer: NodeId(2), ..
            } => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, (0..MESSAGES).collect::<Vec<_>>());
}

/// The fabric's uses of arena memory are claims like any other view in the process: one that
/// would alias a live view is refused with an error, and made once the view is gone.
#[test]
fn fabric_views_that_would_alias_a_live_view_are_refused() {
    let (mut a, b) = connected_pair();
    write_arena(&b.arena, 0, &[7; 4096]);
    write_arena(&a.arena, 0, b"intact");

    // A READ into bytes this process reads fails at once and leaves them alone.
    let reading = ReadableRegion::new(a.arena.clone(), 0, 4096).unwrap();
    let source = granted(&b, NodeId(1), 1, 0, 4096);
    a.fabric
        .post_read(NodeId(2), ReadOpId(1), 0, region(0, 4096), source)
        .expect("a place for its completion");
    assert!(matches!(
        read_result(&mut a, 1),
        Err(ReadError::QueuePair(_))
    ));
    assert_eq!(&reading.as_slice()[..6], b"intact");
    drop(reading);
    a.fabric
        .post_read(NodeId(2), ReadOpId(2), 0, region(0, 4096), source)
        .expect("a place for its completion");
    read_result(&mut a, 2).unwrap();
    // The destination's claim ended before the completion was told.
    assert_eq!(arena_bytes(&a.arena, 0, 4096), [7; 4096]);

    // A granted region is claimed for reading until revoked: nothing writes it meanwhile.
    assert!(WritableRegion::new(b.arena.clone(), 100, 1).is_err());
    assert!(b.arena.write(100, b"x").is_err());
    assert!(b.fabric.revoke_read(NodeId(1), TransferId(1)));
    b.arena.write(100, b"x").unwrap();

    // Nor is a region being written granted, or sent eagerly.
    let writing = WritableRegion::new(b.arena.clone(), 8192, 100).unwrap();
    assert!(matches!(
        b.fabric
            .grant_read(NodeId(1), TransferId(2), region(8000, 1000)),
        Err(FabricError::InUse { .. })
    ));
    let header = EagerHeader {
        req: TransferId(3),
        sizes: ObjectSizes {
            data_size: 100,
            metadata_size: 0,
        },
        digest: ContentDigest(1),
        offset: 0,
    };
    assert!(matches!(
        b.fabric.send_eager(NodeId(1), &header, region(8192, 100)),
        Err(FabricError::InUse { .. })
    ));
    drop(writing);
    b.fabric
        .send_eager(NodeId(1), &header, region(8192, 100))
        .unwrap();
    match next_event(&mut a) {
        FabricEvent::Message { bytes, .. } => match wire::decode(&bytes).unwrap() {
            PeerMessage::EagerData { header: got, .. } => assert_eq!(got, header),
            other => panic!("{other}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn reads_under_a_grant_land_in_place_and_every_other_read_fails() {
    let (mut a, b) = connected_pair();
    let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
    let len = payload.len() as u64;
    write_arena(&b.arena, 4096, &payload);
    let key = granted(&b, NodeId(1), 7, 4096, len);

    a.fabric
        .post_read(NodeId(2), ReadOpId(1), 0, region(1 << 20, len), key)
        .expect("a place for its completion");
    read_result(&mut a, 1).unwrap();
    assert_eq!(arena_bytes(&a.arena, 1 << 20, len), &payload[..]);

    // A slice of the granted region is fine, on any lane; one byte past it is not.
    let slice = RemoteRegion {
        addr: key.addr + 4096,
        len: 100,
        ..key
    };
    a.fabric
        .post_read(NodeId(2), ReadOpId(2), 1, region(0, 100), slice)
        .expect("a place for its completion");
    assert_eq!(read_result(&mut a, 2), Ok(()));
    let past_end = RemoteRegion {
        addr: key.addr + len - 99,
        len: 100,
        ..key
    };
    a.fabric
        .post_read(NodeId(2), ReadOpId(3), 0, region(0, 100), past_end)
        .expect("a place for its completion");
    assert_eq!(read_result(&mut a, 3), Err(ReadError::RemoteAccess));
    // The arena's own key opens nothing, nor does a wrong key.
    a.fabric
        .post_read(
            NodeId(2),
            ReadOpId(4),
            0,
            region(0, 100),
            remote(&b, 4096, 100),
        )
        .expect("a place for its completion");
    assert_eq!(read_result(&mut a, 4), Err(ReadError::RemoteAccess));
    let wrong = RemoteRegion {
        rkey: key.rkey ^ 1,
        len: 100,
        ..key
    };
    a.fabric
        .post_read(NodeId(2), ReadOpId(5), 0, region(0, 100), wrong)
        .expect("a place for its completion");
    assert_eq!(read_result(&mut a, 5), Err(ReadError::RemoteAccess));

    // Another peer of the holder cannot use the key it did not get.
    let mut c = node_with(
        3,
        "secret",
        TcpFabricConfig::new("127.0.0.1:0".parse().unwrap()),
    );
    c.fabric.connect(NodeId(2), b.fabric.listen_addr());
    assert!(matches!(
        next_event(&mut c),
        FabricEvent::PeerConnected {
            peer: NodeId(2),
            ..
        }
    ));
    c.fabric
        .post_read(
            NodeId(2),
            ReadOpId(6),
            0,
            region(0, 100),
            RemoteRegion { len: 100, ..key },
        )
        .expect("a place for its completion");
    assert_eq!(read_result(&mut c, 6), Err(ReadError::RemoteAccess));

    // After the revocation (nothing being served: at once), the key is dead.
    assert!(b.fabric.revoke_read(NodeId(1), TransferId(7)));
    a.fabric
        .post_read(
            NodeId(2),
            ReadOpId(7),
            0,
            region(0, 100),
            RemoteRegion { len: 100, ..key },
        )
        .expect("a place for its completion");
    assert_eq!(read_result(&mut a, 7), Err(ReadError::RemoteAccess));
}

#[test]
fn a_wrong_token_is_refused() {
    let mut a = node(1, "secret");
    let b = node(2, "other");
    a.fabric.connect(NodeId(2), b.fabric.listen_addr());
    match next_event(&mut a) {
        FabricEvent::PeerLost {
            peer: NodeId(2),
            reason,
        } => assert!(reason.contains("token"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(!a.fabric.is_connected_or_connecting(NodeId(2)));
}

#[test]
fn a_lost_peer_fails_outstanding_reads_before_reporting_the_loss() {
    let (mut a, b) = connected_pair();
    let key = granted(&b, NodeId(1), 1, 0, 4 << 20);
    for op in 0..8 {
        a.fabric
            .post_read(
                NodeId(2),
                ReadOpId(op),
                0,
                region(op * (4 << 20), 4 << 20),
                key,
            )
            .expect("a place for its completion");
    }
    drop(b);
    let mut completed = 0;
    loop {
        match next_event(&mut a) {
            FabricEvent::ReadCompleted { .. } => completed += 1,
            FabricEvent::PeerLost {
                peer: NodeId(2), ..
            } => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(completed, 8, "every READ completed before PeerLost");
    a.fabric
        .post_read(
            NodeId(2),
            ReadOpId(99),
            0,
            region(0, 10),
            RemoteRegion {
                addr: 0,
                len: 10,
                rkey: 0,
            },
        )
        .expect("a place for its completion");
    assert!(matches!(
        next_event(&mut a),
        FabricEvent::ReadCompleted {
            op: ReadOpId(99),
            result: Err(ReadError::ConnectionLost)
        }
    ));
}

#[test]
fn garbage_on_the_fabric_port_is_refused_and_the_fabric_carries_on() {
    use std::io::{Read, Write};
    let (mut a, mut b) = connected_pair();
    let mut raw = std::net::TcpStream::connect(b.fabric.listen_addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(&[0xff; 64]).unwrap();
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    a.fabric.send(NodeId(2), b"still here".to_vec()).unwrap();
    assert!(
        matches!(next_event(&mut b), FabricEvent::Message { bytes, .. } if *bytes == *b"still here")
    );
    let _ = &mut a;
}

/// Waits (bounded) until `count` events have arrived, and holds them (a held message keeps
/// its share of the connection's undelivered-bytes budget).
fn hold_events(node: &mut Node, count: usize) -> Vec<FabricEvent> {
    let mut held = Vec::with_capacity(count);
    while held.len() < count {
        held.push(next_event(node));
    }
    held
}

const FLOOD_MESSAGE_BYTES: usize = 16 * 1024;

/// Messages of `FLOOD_MESSAGE_BYTES` that fit one undelivered-bytes budget (64 bytes of
/// overhead each, one message of the largest size at least).
fn messages_per_budget(config: &TcpFabricConfig) -> usize {
    let budget = config
        .max_undelivered_bytes
        .max(skyriver_core::wire::MAX_MESSAGE_BYTES + 64);
    budget / (FLOOD_MESSAGE_BYTES + 64)
}

fn flood_message(n: u32) -> Vec<u8> {
    let mut bytes = vec![(n % 251) as u8; FLOOD_MESSAGE_BYTES];
    bytes[..4].copy_from_slice(&n.to_le_bytes());
    bytes
}

#[test]
fn a_fast_sender_is_slowed_to_the_pace_of_a_slow_receiver() {
    let config = || TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    let (mut a, b) = connect(
        node_with(1, "secret", config()),
        node_with(2, "secret", config()),
    );
    let held_max = messages_per_budget(&config());
    const MESSAGES: u32 = 600; // about 10 MB: several budgets, well under b's queue limit
    let sender = std::thread::spawn(move || {
        for n in 0..MESSAGES {
            b.fabric.send(NodeId(1), flood_message(n)).unwrap();
        }
        b
    });
    // The receiving driver is slow: it holds the messages that arrive until its budget is full
    // (or the last ones came), then handles them as one batch.
    let mut next = 0u32;
    while next < MESSAGES {
        let full = held_max.min((MESSAGES - next) as usize);
        let batch = hold_events(&mut a, full);
        assert!(
            a.events.try_recv().is_err(),
            "more than the {held_max} messages the budget holds waited for the driver"
        );
        for event in batch {
            match event {
                FabricEvent::Message { peer, bytes } => {
                    assert_eq!(peer, NodeId(2));
                    assert_eq!(*bytes, *flood_message(next), "message {next}");
                    next += 1;
                }
                other => panic!("{other:?}"),
            }
        }
    }
    let _b = sender.join().unwrap();
}

#[test]
fn a_peer_that_does_not_read_is_disconnected_with_a_reason() {
    let mut slow_config = TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    slow_config.max_undelivered_bytes = 0; // one message of the largest size
    let held_max = messages_per_budget(&slow_config);
    let mut flooder_config = TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    flooder_config.max_queued_bytes = 1 << 20;
    let (mut a, mut b) = connect(
        node_with(1, "secret", slow_config),
        node_with(2, "secret", flooder_config),
    );
    // a's driver never handles anything: b fills its budget, both socket buffers, then its own
    // queue, and gives up on a.
    let mut refused = None;
    for n in 0..100_000u32 {
        match b.fabric.send(NodeId(1), flood_message(n)) {
            Ok(()) => {}
            Err(error) => {
                refused = Some((n, error));
                break;
            }
        }
    }
    let (sent, error) = refused.expect("the flooder was never held back");
    println!("flooder refused after {sent} messages: {error}");
    assert!(
        matches!(
            error,
            skyriver_transport::fabric::FabricError::PeerNotReading {
                peer: NodeId(1),
                ..
            }
        ),
        "{error}"
    );
    match next_event(&mut b) {
        FabricEvent::PeerLost {
            peer: NodeId(1),
            reason,
        } => assert!(reason.contains("not reading"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // a's reader took what its budget holds and stopped there: held, these messages keep it
    // stopped, so nothing more is waiting (checked at once, not after a quiet period).
    assert!(sent as usize > held_max, "b sent only {sent} messages");
    let held = hold_events(&mut a, held_max);
    assert!(
        a.events.try_recv().is_err(),
        "more than the {held_max} messages the budget holds waited for the driver"
    );
    // Once a's driver catches up, a learns that b dropped the connection.
    drop(held);
    loop {
        match next_event(&mut a) {
            FabricEvent::Message { .. } => {}
            FabricEvent::PeerLost {
                peer: NodeId(2), ..
            } => break,
            other => panic!("{other:?}"),
        }
    }
}

/// A message sent while READ data for the same peer is queued goes out before that data (after
/// the READ response being written): a reply never waits behind bulk data, however much of it
/// a requester asked for on a slow link.
#[test]
fn a_message_overtakes_read_data_queued_before_it() {
    const SLICE: u64 = 1 << 20;
    // Several times what both sockets' buffers hold, so most of it is still queued.
    const READS: u64 = 48;
    let config = || TcpFabricConfig::new("127.0.0.1:0".parse().unwrap());
    let mut slow_config = config();
    slow_config.max_undelivered_bytes = 0; // one message of the largest size
    let held_max = messages_per_budget(&slow_config);
    let total = READS * SLICE;
    let (mut a, mut b) = connect(
        node_sized(1, "secret", slow_config, EVENT_CHANNEL_CAPACITY, total),
        node_sized(2, "secret", config(), EVENT_CHANNEL_CAPACITY, total),
    );
    let payload: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    write_arena(&b.arena, 0, &payload);
    let key = granted(&b, NodeId(1), 7, 0, total);

    // a's driver holds b's messages: its reader stops at the next one, so a reads nothing
    // more from the connection and b's READ data will pile up behind it.
    for n in 0..=held_max as u32 {
        b.fabric.send(NodeId(1), flood_message(n)).unwrap();
    }
    let held = hold_events(&mut a, held_max);
    for i in 0..READS {
        let remote = RemoteRegion {
            addr: key.addr + i * SLICE,
            len: SLICE,
            ..key
        };
        a.fabric
            .post_read(NodeId(2), ReadOpId(i), 0, region(i * SLICE, SLICE), remote)
            .expect("a place for its completion");
    }
    // b's reader hands this on only after it queued the data of every READ asked before it.
    a.fabric.send(NodeId(2), b"go".to_vec()).unwrap();
    match next_event(&mut b) {
        FabricEvent::Message { bytes, .. } => assert_eq!(&bytes[..], b"go"),
        other => panic!("{other:?}"),
    }
    b.fabric.send(NodeId(1), b"reply".to_vec()).unwrap();

    drop(held);
    let (mut completed, mut completed_before_reply, mut replied) = (0, 0, false);
    while completed < READS || !replied {
        match next_event(&mut a) {
            FabricEvent::Message { bytes, .. } if &bytes[..] == b"reply" => {
                replied = true;
                completed_before_reply = completed;
            }
            FabricEvent::Message { .. } => assert!(!replied, "a flood message after the reply"),
            FabricEvent::ReadCompleted { result, .. } => {
                result.unwrap();
                completed += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    println!("the reply came after {completed_before_reply} of {READS} READ responses");
    assert!(
        completed_before_reply <= READS / 2,
        "the reply waited behind {completed_before_reply} of the {READS} READ responses \
         queued before it"
    );
    assert_eq!(arena_bytes(&a.arena, 0, total), payload);
}

/// A relay's copy still being received: READs below the prefix its core announced are served
/// with the copy's bytes, past it or where a READ into the copy is still landing they are
/// refused, and a revocation while READs are served leaves the block free once complete.
#[test]
fn a_partial_copy_serves_its_received_prefix_only() {
    let (mut a, mut b) = connected_pair();
    const MIB: u64 = 1 << 20;
    let block = region(4096, 4 * MIB);
    let payload: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    // The first MiB is in; the second is being written by a READ still landing.
    write_arena(&b.arena, 4096, &payload[..MIB as usize]);
    let landing = WritableRegion::new(b.arena.clone(), 4096 + MIB, MIB).unwrap();
    let grant = b
        .fabric
        .grant_partial_read(NodeId(1), TransferId(7), block)
        .unwrap()
        .expect("the TCP fabric grants at once");
    let key = RemoteRegion {
        rkey: grant.keys[0],
        ..remote(&b, 4096, 4 * MIB)
    };
    let read = |a: &mut Node, op: u64, start: u64, len: u64| {
        let slice = RemoteRegion {
            addr: key.addr + start,
            len,
            ..key
        };
        a.fabric
            .post_read(NodeId(2), ReadOpId(op), 0, region(op * 4 * MIB, len), slice)
            .expect("a place for its completion");
        read_result(a, op)
    };
    assert_eq!(
        read(&mut a, 1, 0, 100),
        Err(ReadError::RemoteAccess),
        "nothing announced yet"
    );
    b.fabric.extend_partial_read(NodeId(1), TransferId(7), MIB);
    read(&mut a, 2, 0, MIB).unwrap();
    assert_eq!(
        arena_bytes(&a.arena, 2 * 4 * MIB, MIB),
        &payload[..MIB as usize]
    );
    assert_eq!(
        read(&mut a, 3, MIB - 100, 200),
        Err(ReadError::RemoteAccess),
        "past the prefix"
    );
    // Said to be in while a READ into it still lands (a core that runs ahead): refused.
    b.fabric
        .extend_partial_read(NodeId(1), TransferId(7), 2 * MIB);
    assert_eq!(
        read(&mut a, 4, MIB, 100),
        Err(ReadError::RemoteAccess),
        "still being written"
    );
    drop(landing);
    write_arena(
        &b.arena,
        4096 + MIB,
        &payload[MIB as usize..2 * MIB as usize],
    );
    read(&mut a, 5, MIB - 50, 100).unwrap();
    assert_eq!(
        arena_bytes(&a.arena, 5 * 4 * MIB, 100),
        &payload[(MIB - 50) as usize..(MIB + 50) as usize]
    );
    // Nothing of the block is claimed by the grant itself: later READs can land in it.
    drop(WritableRegion::new(b.arena.clone(), 4096 + 2 * MIB, MIB).unwrap());

    // Revoked while a READ may still be served: complete at once or once it is written.
    let whole = RemoteRegion {
        len: 2 * MIB,
        ..key
    };
    a.fabric
        .post_read(
            NodeId(2),
            ReadOpId(6),
            0,
            region(6 * 4 * MIB, 2 * MIB),
            whole,
        )
        .expect("a place for its completion");
    if !b.fabric.revoke_read(NodeId(1), TransferId(7)) {
        match next_event(&mut b) {
            FabricEvent::ReadRevoked { peer, req } => {
                assert_eq!((peer, req), (NodeId(1), TransferId(7)))
            }
            other => panic!("{other:?}"),
        }
    }
    match read_result(&mut a, 6) {
        Ok(()) => assert_eq!(
            arena_bytes(&a.arena, 6 * 4 * MIB, 2 * MIB),
            &payload[..2 * MIB as usize]
        ),
        Err(error) => assert_eq!(error, ReadError::RemoteAccess),
    }
    assert_eq!(
        read(&mut a, 7, 0, 100),
        Err(ReadError::RemoteAccess),
        "revoked"
    );
    drop(WritableRegion::new(b.arena.clone(), 4096, 4 * MIB).expect("no READ holds the block"));
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
