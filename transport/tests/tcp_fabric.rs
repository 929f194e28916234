//! The TCP fabric between two nodes in one process: handshake, messages, emulated READs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use skyriver_core::node::{ReadError, ReadOpId};
use skyriver_core::{ArenaId, LocalRegion, NodeId, RemoteRegion};
use skyriver_transport::fabric::tcp::{TcpFabric, TcpFabricConfig};
use skyriver_transport::fabric::{Fabric, FabricEvent, FabricIdentity};
use skyriver_transport::{ArenaOptions, SharedArena};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

const ARENA_BYTES: u64 = 32 << 20;

struct Node {
    fabric: TcpFabric,
    events: UnboundedReceiver<FabricEvent>,
    arena: Arc<SharedArena>,
}

fn node(id: u32, token: &str) -> Node {
    let arena =
        Arc::new(SharedArena::create("test", ARENA_BYTES, &ArenaOptions::default()).unwrap());
    let (tx, events) = unbounded_channel();
    let identity = FabricIdentity {
        node: NodeId(id),
        cluster_token: token.into(),
    };
    let arenas = BTreeMap::from([(ArenaId(0), arena.clone())]);
    let fabric = TcpFabric::start(
        TcpFabricConfig::new("127.0.0.1:0".parse().unwrap()),
        identity,
        arenas,
        tx,
    )
    .unwrap();
    Node {
        fabric,
        events,
        arena,
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
    let mut a = node(1, "secret");
    let mut b = node(2, "secret");
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
            } => assert_eq!(bytes, n.to_le_bytes()),
            other => panic!("{other:?}"),
        }
    }
    b.fabric.send(NodeId(1), b"back".to_vec()).unwrap();
    assert!(matches!(next_event(&mut a), FabricEvent::Message { bytes, .. } if bytes == b"back"));
}

#[test]
fn reads_of_exposed_memory_land_in_place_and_others_fail() {
    let (mut a, b) = connected_pair();
    let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
    write_arena(&b.arena, 4096, &payload);
    b.fabric.expose(region(4096, payload.len() as u64));

    a.fabric.post_read(
        NodeId(2),
        ReadOpId(1),
        0,
        region(1 << 20, payload.len() as u64),
        remote(&b, 4096, payload.len() as u64),
    );
    match next_event(&mut a) {
        FabricEvent::ReadCompleted {
            op: ReadOpId(1),
            result,
        } => result.unwrap(),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        arena_bytes(&a.arena, 1 << 20, payload.len() as u64),
        &payload[..]
    );

    // A slice of the exposed region is fine; one byte past it is not.
    a.fabric.post_read(
        NodeId(2),
        ReadOpId(2),
        0,
        region(0, 100),
        remote(&b, 8192, 100),
    );
    assert!(matches!(
        next_event(&mut a),
        FabricEvent::ReadCompleted {
            op: ReadOpId(2),
            result: Ok(())
        }
    ));
    a.fabric.post_read(
        NodeId(2),
        ReadOpId(3),
        0,
        region(0, 100),
        remote(&b, 4096 + payload.len() as u64 - 99, 100),
    );
    assert!(matches!(
        next_event(&mut a),
        FabricEvent::ReadCompleted {
            op: ReadOpId(3),
            result: Err(ReadError::RemoteAccess)
        }
    ));
    // After unexpose, and with a wrong rkey, READs fail.
    b.fabric.unexpose(region(4096, payload.len() as u64));
    a.fabric.post_read(
        NodeId(2),
        ReadOpId(4),
        0,
        region(0, 100),
        remote(&b, 4096, 100),
    );
    assert!(matches!(
        next_event(&mut a),
        FabricEvent::ReadCompleted {
            op: ReadOpId(4),
            result: Err(ReadError::RemoteAccess)
        }
    ));
    let mut bad_key = remote(&b, 4096, 100);
    bad_key.rkey ^= 1;
    a.fabric
        .post_read(NodeId(2), ReadOpId(5), 0, region(0, 100), bad_key);
    assert!(matches!(
        next_event(&mut a),
        FabricEvent::ReadCompleted {
            op: ReadOpId(5),
            result: Err(ReadError::RemoteAccess)
        }
    ));
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
    b.fabric.expose(region(0, ARENA_BYTES));
    for op in 0..8 {
        a.fabric.post_read(
            NodeId(2),
            ReadOpId(op),
            0,
            region(op * (4 << 20), 4 << 20),
            remote(&b, 0, 4 << 20),
        );
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
    a.fabric.post_read(
        NodeId(2),
        ReadOpId(99),
        0,
        region(0, 10),
        RemoteRegion {
            addr: 0,
            len: 10,
            rkey: 0,
        },
    );
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
        matches!(next_event(&mut b), FabricEvent::Message { bytes, .. } if bytes == b"still here")
    );
    let _ = &mut a;
}

/// Copies `data` into a test arena.
fn write_arena(arena: &SharedArena, offset: u64, data: &[u8]) {
    // SAFETY: test arenas are mapped by this test only, and it holds no view of them across
    // a write; a fabric reads a range only once the test asked for it, after writing it.
    unsafe { arena.write(offset, data) }.unwrap();
}

/// A copy of `[offset, offset + len)` of a test arena.
fn arena_bytes(arena: &SharedArena, offset: u64, len: u64) -> Vec<u8> {
    // SAFETY: as in `write_arena`; the test reads a range once the READ into it completed, and
    // copies it before anything writes it again.
    unsafe { arena.bytes(offset, len) }.unwrap().to_vec()
}
