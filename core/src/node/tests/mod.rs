//! Unit tests of each protocol path, with a minimal in-test driver: messages go through the
//! wire encoding, READs are served from the holder's arena bytes, the directory is a map.
//! Time moves only when a test says so, so every step is visible.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::*;
use crate::client_protocol::{Request, RequestFrame, Response, PROTOCOL_VERSION};
use crate::directory::DirectoryReply;
use crate::store::ObjectInfo;

const CLIENT: ClientId = ClientId(1);
const ARENA_BYTES: u64 = 1 << 20;

fn id(n: u64) -> ObjectId {
    ObjectId::from_u64(n)
}

fn key(node: u32) -> ArenaKey {
    ArenaKey {
        base_addr: 0x1000_0000 * (node as u64 + 1),
        rkey: 0x40 + node,
    }
}

struct World {
    nodes: Vec<Node>,
    arenas: Vec<Vec<u8>>,
    now: Instant,
    locations: BTreeMap<ObjectId, (ObjectSizes, Vec<NodeId>)>,
    /// Directory requests not answered yet (when `directory_up` is false they wait).
    directory_up: bool,
    messages: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    reads: VecDeque<(NodeId, ReadOpId, LocalRegion, RemoteRegion, NodeId)>,
    fail_reads: u32,
    /// Every output, for assertions: (node, output).
    log: Vec<(NodeId, NodeOutput)>,
    exposed: Vec<BTreeMap<ObjectId, LocalRegion>>,
    next_request: u64,
    /// Durable changes are reported only when a test says so (else at once).
    manual_disk: bool,
    /// Durable changes handed out: (node, sequence number).
    persisted: Vec<(NodeId, u64)>,
    /// Clients the nodes closed, with why.
    closed: Vec<(NodeId, ClientId, String)>,
}

impl World {
    fn new(n: u32, tweak: impl Fn(&mut NodeConfig)) -> World {
        let mut nodes = Vec::new();
        for i in 0..n {
            let mut config = NodeConfig::new(NodeId(i), ARENA_BYTES);
            config.region_keys = BTreeMap::from([(ArenaId(0), key(i))]);
            config.receive_slot_bytes = 1024;
            config.threshold = ThresholdPolicy::Fixed(2048);
            config.read_slice_bytes = 4096;
            config.max_outstanding_reads = 2;
            config.lease = Duration::from_millis(10);
            tweak(&mut config);
            nodes.push(Node::new(config, Instant::ZERO));
        }
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    let params = PeerParams {
                        lanes: 2,
                        costs: PathCosts::RDMA_DEFAULT,
                    };
                    nodes[a as usize].handle_peer_connected(Instant::ZERO, NodeId(b), params);
                }
            }
        }
        let mut world = World {
            nodes,
            arenas: vec![vec![0; ARENA_BYTES as usize]; n as usize],
            now: Instant::ZERO,
            locations: BTreeMap::new(),
            directory_up: true,
            messages: VecDeque::new(),
            reads: VecDeque::new(),
            fail_reads: 0,
            log: Vec::new(),
            exposed: vec![BTreeMap::new(); n as usize],
            next_request: 1,
            manual_disk: false,
            persisted: Vec::new(),
            closed: Vec::new(),
        };
        for i in 0..n {
            world.connect(i, CLIENT);
        }
        world
    }

    /// Connects `client` to `node` and says Hello.
    fn connect(&mut self, node: u32, client: ClientId) {
        self.nodes[node as usize].handle_client_connected(self.now, client);
        let welcome = self.request_as(
            node,
            client,
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name: "test".into(),
            },
        );
        assert!(
            matches!(welcome, Some(Response::Welcome { .. })),
            "{welcome:?}"
        );
    }

    /// Sends a request of [`CLIENT`]; its reply, if it came while the world settled.
    fn request(&mut self, node: u32, body: Request) -> Option<Response> {
        self.request_as(node, CLIENT, body)
    }

    fn request_as(&mut self, node: u32, client: ClientId, body: Request) -> Option<Response> {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        self.nodes[node as usize].handle_client_request(
            self.now,
            client,
            RequestFrame { request, body },
        );
        self.pump();
        self.log.iter().find_map(|(n, o)| match o {
            NodeOutput::Reply {
                client: c,
                request: r,
                response,
            } if n.0 == node && *c == client && *r == request => Some(response.clone()),
            _ => None,
        })
    }

    fn release(&mut self, node: u32, n: u64) {
        let reply = self.request(node, Request::Release { id: id(n) });
        assert_eq!(reply, Some(Response::Done(Ok(()))));
    }

    fn delete(&mut self, node: u32, n: u64) {
        self.request(node, Request::Delete { ids: vec![id(n)] });
    }

    fn bytes_of(n: u64, len: u64) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(n as u8))
            .collect()
    }

    fn put(&mut self, node: u32, n: u64, len: u64) {
        let created = self.request(
            node,
            Request::Create {
                id: id(n),
                data_size: len,
                metadata_size: 0,
            },
        );
        let Some(Response::Created(Ok(info))) = created else {
            panic!("create of {n} on node {node}: {created:?}");
        };
        let region = info.region;
        self.arenas[node as usize][region.offset as usize..region.end() as usize]
            .copy_from_slice(&Self::bytes_of(n, len));
        let sealed = self.request(
            node,
            Request::Seal {
                id: id(n),
                release: true,
            },
        );
        assert_eq!(sealed, Some(Response::Done(Ok(()))));
    }

    fn fetch(&mut self, node: u32, ns: &[u64], timeout: Duration) {
        self.fetch_in_mode(node, ns, timeout, TransferMode::Auto);
    }

    fn fetch_in_mode(&mut self, node: u32, ns: &[u64], timeout: Duration, mode: TransferMode) {
        let ids = ns.iter().map(|&n| id(n)).collect();
        self.nodes[node as usize].handle_fetch(
            self.now,
            CLIENT,
            RequestId(1),
            ids,
            Some(timeout),
            mode,
            true,
        );
        self.pump();
    }

    fn lookups(&self, node: u32) -> usize {
        self.count(node, |o| {
            matches!(
                o,
                NodeOutput::Directory {
                    request: DirectoryRequest::Lookup { .. },
                    ..
                }
            )
        })
    }

    /// Fetches `n` into `node`, checks its bytes, then drops the copy there again.
    fn fetch_and_drop(&mut self, node: u32, n: u64, len: u64, mode: TransferMode) {
        let before = self.replies(node).len();
        self.fetch_in_mode(node, &[n], Duration::from_millis(50), mode);
        let replies = self.replies(node);
        assert_eq!(replies.len(), before + 1, "one reply");
        let info = ok_info(&replies[before][0]);
        assert_eq!(self.local_bytes(node, &info), World::bytes_of(n, len));
        self.release(node, n);
        self.delete(node, n);
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now + by;
        for node in &mut self.nodes {
            node.handle_timeout(self.now);
        }
        self.pump();
    }

    /// Carries out outputs and deliveries until nothing moves (time stands still).
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(output) = self.nodes[i].poll_output() {
                    moved = true;
                    self.carry_out(NodeId(i as u32), output);
                }
                if self.nodes[i].poll_timeout().is_some_and(|t| t <= self.now) {
                    self.nodes[i].handle_timeout(self.now);
                    moved = true;
                }
            }
            if let Some((from, to, bytes)) = self.messages.pop_front() {
                self.nodes[to.0 as usize]
                    .handle_peer_bytes(self.now, from, &bytes)
                    .unwrap();
                moved = true;
            } else if let Some((node, op, local, remote, peer)) = self.reads.pop_front() {
                let result = if self.fail_reads > 0 {
                    self.fail_reads -= 1;
                    Err(ReadError::QueuePair("test".into()))
                } else {
                    let k = key(peer.0);
                    let offset = remote.addr - k.base_addr;
                    let allowed = remote.rkey == k.rkey
                        && self.exposed[peer.0 as usize]
                            .values()
                            .any(|r| r.offset <= offset && offset + remote.len <= r.end());
                    if allowed {
                        let src = self.arenas[peer.0 as usize]
                            [offset as usize..(offset + remote.len) as usize]
                            .to_vec();
                        self.arenas[node.0 as usize][local.offset as usize..local.end() as usize]
                            .copy_from_slice(&src);
                        Ok(())
                    } else {
                        Err(ReadError::RemoteAccess)
                    }
                };
                self.nodes[node.0 as usize].handle_read_completion(self.now, op, result);
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    fn carry_out(&mut self, node: NodeId, output: NodeOutput) {
        self.log.push((node, output.clone()));
        output.dispatch(&mut Carrier { world: self, node });
        self.nodes[node.0 as usize].check_invariants();
    }

    fn replies(&self, node: u32) -> Vec<Vec<Result<ObjectInfo, FetchError>>> {
        self.log
            .iter()
            .filter(|(n, _)| n.0 == node)
            .filter_map(|(_, o)| match o {
                NodeOutput::Reply {
                    response: Response::Fetched(results),
                    ..
                } => Some(results.clone()),
                _ => None,
            })
            .collect()
    }

    fn sent(&self, node: u32) -> Vec<PeerMessage> {
        self.log
            .iter()
            .filter(|(n, _)| n.0 == node)
            .filter_map(|(_, o)| match o {
                NodeOutput::Send { message, .. } => Some(message.clone()),
                _ => None,
            })
            .collect()
    }

    fn count(&self, node: u32, pred: impl Fn(&NodeOutput) -> bool) -> usize {
        self.log
            .iter()
            .filter(|(n, o)| n.0 == node && pred(o))
            .count()
    }

    fn local_bytes(&self, node: u32, info: &ObjectInfo) -> Vec<u8> {
        self.arenas[node as usize][info.region.offset as usize..info.region.end() as usize].to_vec()
    }

    fn assert_settled(&self) {
        for node in &self.nodes {
            node.check_invariants();
            assert!(node.is_quiescent(), "{:?}", node.pending_work());
            assert!(node
                .store()
                .list()
                .iter()
                .all(|s| s.pin_count == 0 && s.sealed));
        }
    }
}

fn ok_info(result: &Result<ObjectInfo, FetchError>) -> ObjectInfo {
    result.clone().expect("fetch succeeded")
}

#[test]
fn eager_fetch_copies_small_objects_in_chunks() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1500); // two 1 KiB receive slots
    w.fetch(1, &[1], Duration::from_millis(50));
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 1500));
    assert_eq!(w.count(0, |o| matches!(o, NodeOutput::SendEager { .. })), 2);
    assert_eq!(
        w.count(1, |o| matches!(o, NodeOutput::WriteLocal { .. })),
        2
    );
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::ExposeRegion { .. })),
        0
    );
    // The new copy is published.
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0), NodeId(1)]);
    // The client holds a reference until it releases it.
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn rendezvous_fetch_reads_in_slices_then_finishes() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 10_000));
    let reads: Vec<(u16, RemoteRegion)> = w
        .log
        .iter()
        .filter_map(|(_, o)| match o {
            NodeOutput::PostRead { lane, remote, .. } => Some((*lane, *remote)),
            _ => None,
        })
        .collect();
    assert_eq!(reads.len(), 3, "10000 bytes in 4096-byte slices");
    assert_eq!(
        reads.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![0, 1, 0],
        "lanes round-robin"
    );
    let holder_info = w.nodes[0].store().sealed_info(&id(1)).unwrap();
    assert_eq!(
        reads[0].1.addr,
        key(0).base_addr + holder_info.region.offset
    );
    assert_eq!(reads[0].1.rkey, key(0).rkey);
    assert!(w
        .sent(1)
        .iter()
        .any(|m| matches!(m, PeerMessage::Finish { .. })));
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::UnexposeRegion { .. })),
        1
    );
    assert!(!w.nodes[0].store().is_pinned(&id(1)), "Finish unpins");
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn concurrent_fetches_of_one_object_share_one_transfer() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    w.directory_up = false; // hold the lookup so both fetches overlap
    w.nodes[1].handle_fetch(
        w.now,
        CLIENT,
        RequestId(1),
        vec![id(1)],
        Some(Duration::from_millis(50)),
        TransferMode::Auto,
        true,
    );
    w.nodes[1].handle_fetch(
        w.now,
        CLIENT,
        RequestId(2),
        vec![id(1), id(1)],
        Some(Duration::from_millis(50)),
        TransferMode::Auto,
        true,
    );
    let lookups: Vec<DirectoryOpId> = std::iter::from_fn(|| w.nodes[1].poll_output())
        .filter_map(|o| match o {
            NodeOutput::Directory {
                op,
                request: DirectoryRequest::Lookup { .. },
            } => Some(op),
            _ => None,
        })
        .collect();
    assert_eq!(lookups.len(), 1, "one lookup for two fetches");
    let (sizes, holders) = w.locations[&id(1)].clone();
    w.nodes[1].handle_directory_reply(
        w.now,
        lookups[0],
        DirectoryReply::Located {
            holders,
            sizes: Some(sizes),
        },
    );
    w.directory_up = true;
    w.pump();
    let replies = w.replies(1);
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[1].len(), 2);
    assert!(replies.iter().flatten().all(|r| r.is_ok()));
    assert_eq!(
        w.sent(1)
            .iter()
            .filter(|m| matches!(m, PeerMessage::FetchRequest { .. }))
            .count(),
        1
    );
    for _ in 0..3 {
        w.release(1, 1);
    }
    w.assert_settled();
}

#[test]
fn missing_object_fails_at_the_deadline_not_later() {
    let mut w = World::new(2, |_| {});
    w.fetch(1, &[7], Duration::from_millis(3));
    assert!(w.replies(1).is_empty());
    assert_eq!(
        w.nodes[1].poll_timeout(),
        Some(Instant::ZERO + Duration::from_millis(3))
    );
    w.advance(Duration::from_millis(3));
    let replies = w.replies(1);
    assert_eq!(replies[0][0], Err(FetchError::NotFound { id: id(7) }));
    w.assert_settled();
}

#[test]
fn published_object_wakes_a_waiting_fetch() {
    let mut w = World::new(2, |_| {});
    w.fetch(1, &[7], Duration::from_millis(30));
    w.put(0, 7, 100);
    let sizes = ObjectSizes {
        data_size: 100,
        metadata_size: 0,
    };
    w.nodes[1].handle_directory_event(
        w.now,
        DirectoryEvent::Published {
            id: id(7),
            holder: NodeId(0),
            sizes,
        },
    );
    w.pump();
    assert!(w.replies(1)[0][0].is_ok());
    w.release(1, 7);
    w.assert_settled();
}

#[test]
fn stale_location_falls_over_to_the_next_holder() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 10_000);
    w.put(2, 1, 10_000);
    // Node 0 drops its copy but the directory still lists it first.
    w.delete(0, 1);
    w.pump();
    w.locations.get_mut(&id(1)).unwrap().1 = vec![NodeId(0), NodeId(2)];
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 10_000));
    let requests = w
        .sent(1)
        .into_iter()
        .filter(|m| matches!(m, PeerMessage::FetchRequest { .. }))
        .count();
    assert!((1..=2).contains(&requests));
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn read_failure_drains_outstanding_reads_then_retries_elsewhere() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 20_000);
    w.put(2, 1, 20_000);
    w.fail_reads = 1;
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 20_000));
    assert_eq!(w.nodes[1].stats().transfers_failed, 1);
    assert_eq!(w.nodes[1].stats().transfers_succeeded, 1);
    // Both holders got a Finish: the failed transfer released its lease too.
    let finishes: Vec<NodeId> = w
        .log
        .iter()
        .filter_map(|(n, o)| match o {
            NodeOutput::Send {
                peer,
                message: PeerMessage::Finish { .. },
            } if n.0 == 1 => Some(*peer),
            _ => None,
        })
        .collect();
    assert_eq!(finishes.len(), 2);
    assert_ne!(finishes[0], finishes[1]);
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn lease_expires_without_finish() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    let sent = PeerMessage::FetchRequest {
        req: TransferId(99),
        id: id(1),
        eager_limit: 0,
        max_chunk_bytes: 1000,
    };
    w.nodes[0].handle_peer_message(w.now, NodeId(1), sent);
    let outputs: Vec<NodeOutput> = std::iter::from_fn(|| w.nodes[0].poll_output()).collect();
    assert!(outputs.iter().any(|o| matches!(
        o,
        NodeOutput::Send {
            message: PeerMessage::Rendezvous { .. },
            ..
        }
    )));
    assert!(w.nodes[0].store().is_pinned(&id(1)));
    // Pinned: neither evicted nor deleted under the reader.
    assert_eq!(
        w.request(0, Request::Evict { bytes: u64::MAX }),
        Some(Response::Evicted(Default::default()))
    );
    w.advance(Duration::from_millis(9));
    assert!(w.nodes[0].store().is_pinned(&id(1)));
    w.advance(Duration::from_millis(1));
    assert!(!w.nodes[0].store().is_pinned(&id(1)));
    assert_eq!(w.nodes[0].stats().leases_expired, 1);
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::UnexposeRegion { .. })),
        1
    );
    w.assert_settled();
}

#[test]
fn holder_refuses_unknown_objects_and_duplicate_transfers() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    let request = |n| PeerMessage::FetchRequest {
        req: TransferId(5),
        id: id(n),
        eager_limit: 0,
        max_chunk_bytes: 1000,
    };
    w.nodes[0].handle_peer_message(w.now, NodeId(1), request(2));
    w.nodes[0].handle_peer_message(w.now, NodeId(1), request(1));
    w.nodes[0].handle_peer_message(w.now, NodeId(1), request(1));
    let kinds: Vec<String> = std::iter::from_fn(|| w.nodes[0].poll_output())
        .filter_map(|o| match o {
            NodeOutput::Send { message, .. } => Some(format!("{message}")),
            _ => None,
        })
        .collect();
    assert!(kinds[0].starts_with("NotFound"));
    assert!(kinds[1].starts_with("Rendezvous"));
    assert!(kinds[2].starts_with("Error"), "{kinds:?}");
}

#[test]
fn admission_caps_bytes_in_flight_and_keeps_order() {
    let mut w = World::new(2, |c| c.max_bytes_in_flight = 16 * 1024);
    w.put(0, 1, 10_000);
    w.put(0, 2, 10_000);
    w.nodes[1].handle_fetch(
        w.now,
        CLIENT,
        RequestId(1),
        vec![id(1), id(2)],
        Some(Duration::from_millis(50)),
        TransferMode::Auto,
        true,
    );
    // Carry out only the directory step: the second object must wait for the first.
    let mut requests = 0;
    for _ in 0..4 {
        while let Some(output) = w.nodes[1].poll_output() {
            if matches!(
                output,
                NodeOutput::Send {
                    message: PeerMessage::FetchRequest { .. },
                    ..
                }
            ) {
                requests += 1;
            }
            w.carry_out(NodeId(1), output);
        }
    }
    assert_eq!(
        requests, 1,
        "the second 10 KB object waits under a 16 KiB cap"
    );
    assert!(w.nodes[1].bytes_in_flight() <= 16 * 1024);
    w.pump();
    let replies = w.replies(1);
    assert!(replies[0].iter().all(|r| r.is_ok()));
    for n in [1, 2] {
        w.release(1, n);
    }
    w.assert_settled();
}

#[test]
fn full_store_fails_the_fetch_with_out_of_memory() {
    let mut w = World::new(2, |c| c.store = StoreConfig::single_arena(64 * 1024));
    w.put(0, 1, 40_000);
    w.connect(1, ClientId(9));
    let created = w.request_as(
        1,
        ClientId(9),
        Request::Create {
            id: id(2),
            data_size: 40_000,
            metadata_size: 0,
        },
    );
    assert!(matches!(created, Some(Response::Created(Ok(_)))));
    w.fetch(1, &[1], Duration::from_millis(50));
    assert!(matches!(
        w.replies(1)[0][0],
        Err(FetchError::Store(StoreError::OutOfMemory { .. }))
    ));
}

#[test]
fn malformed_peer_bytes_are_an_error_not_a_panic() {
    let mut w = World::new(2, |_| {});
    assert!(w.nodes[0]
        .handle_peer_bytes(w.now, NodeId(1), b"garbage!")
        .is_err());
    assert_eq!(w.nodes[0].stats().malformed_messages, 1);
    w.assert_settled();
}

#[test]
fn unavailable_directory_is_retried_then_reported() {
    let mut w = World::new(2, |c| c.max_directory_attempts = 2);
    w.directory_up = false;
    w.fetch(1, &[1], Duration::from_secs(60));
    // Each attempt times out; after the last the fetch fails with a reason.
    for _ in 0..4 {
        w.advance(Duration::from_secs(2));
    }
    assert!(matches!(
        w.replies(1)[0][0],
        Err(FetchError::DirectoryUnavailable { .. })
    ));
}

#[test]
fn thresholds_are_exposed_per_peer() {
    let w = World::new(2, |c| c.threshold = ThresholdPolicy::Fixed(1 << 30));
    let threshold = w.nodes[0].eager_threshold(NodeId(1)).unwrap();
    assert_eq!(threshold.source, ThresholdSource::FixedCappedBySlots);
    assert_eq!(threshold.bytes, w.nodes[0].config().eager_capacity_bytes());
}

#[test]
fn a_forced_mode_overrides_the_threshold() {
    // The threshold is 2048 bytes; four 1 KiB receive slots carry about 4000.
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1000);
    w.put(0, 2, 3000);
    let served = |w: &World| {
        let stats = w.nodes[0].stats();
        (stats.served_eager, stats.served_rendezvous)
    };
    w.fetch_and_drop(1, 1, 1000, TransferMode::Rendezvous);
    assert_eq!(served(&w), (0, 1), "a small object read by rendezvous");
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(served(&w), (1, 1), "auto sends it eagerly");
    w.fetch_and_drop(1, 2, 3000, TransferMode::Eager);
    assert_eq!(served(&w), (2, 1), "above the threshold, still eager");
    w.fetch_and_drop(1, 2, 3000, TransferMode::Auto);
    assert_eq!(served(&w), (2, 2), "auto reads it");
    w.put(0, 3, 10_000);
    w.fetch_and_drop(1, 3, 10_000, TransferMode::Eager);
    assert_eq!(served(&w), (2, 3), "too large for the receive slots: read");
    w.assert_settled();
}

#[test]
fn fetching_again_skips_the_lookup() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(w.lookups(1), 1);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Rendezvous);
    assert_eq!(w.lookups(1), 1, "the location was remembered");
    assert_eq!(w.nodes[1].stats().location_cache_hits, 2);
    assert_eq!(w.nodes[1].stats().stale_locations, 0);
    w.assert_settled();
}

#[test]
fn a_stale_location_falls_back_to_the_directory() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    // The only remembered holder loses its copy; another node has one.
    w.delete(0, 1);
    w.pump();
    w.put(2, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    let stats = w.nodes[1].stats().clone();
    assert_eq!((stats.location_cache_hits, stats.stale_locations), (1, 1));
    assert_eq!(w.lookups(1), 2, "asked the directory after the stale guess");
    assert_eq!(w.nodes[0].stats().served_refused, 1, "node 0 said NotFound");
    // The fresh answer is remembered in turn.
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(w.lookups(1), 2);
    assert_eq!(w.nodes[1].stats().stale_locations, 1);
    w.assert_settled();
}

#[test]
fn a_stale_location_of_a_vanished_object_ends_as_not_found() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.delete(0, 1);
    w.pump();
    w.fetch(1, &[1], Duration::from_millis(20));
    assert_eq!(w.nodes[1].stats().stale_locations, 1);
    assert_eq!(w.replies(1).len(), 1, "waits for a publication");
    w.advance(Duration::from_millis(25));
    let replies = w.replies(1);
    assert_eq!(
        replies.last().unwrap()[0],
        Err(FetchError::NotFound { id: id(1) })
    );
    w.assert_settled();
}

#[test]
fn no_location_cache_means_a_lookup_every_time() {
    let mut w = World::new(2, |c| c.location_cache_entries = 0);
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(w.lookups(1), 2);
    assert_eq!(w.nodes[1].stats().location_cache_hits, 0);
    w.assert_settled();
}

/// The test world as one node's driver.
struct Carrier<'a> {
    world: &'a mut World,
    node: NodeId,
}

impl Carrier<'_> {
    fn arena(&mut self) -> &mut Vec<u8> {
        &mut self.world.arenas[self.node.0 as usize]
    }
}

impl NodeDriver for Carrier<'_> {
    fn send(&mut self, peer: NodeId, message: PeerMessage) {
        let bytes = wire::to_bytes(&message);
        self.world.messages.push_back((self.node, peer, bytes))
    }

    fn send_eager(&mut self, peer: NodeId, header: EagerHeader, source: LocalRegion, _: ObjectId) {
        let mut bytes = Vec::new();
        wire::encode_eager(
            &header,
            &self.arena()[source.offset as usize..source.end() as usize],
            &mut bytes,
        );
        self.world.messages.push_back((self.node, peer, bytes));
    }

    fn post_read(
        &mut self,
        peer: NodeId,
        op: ReadOpId,
        _lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
        _object: ObjectId,
    ) {
        self.world
            .reads
            .push_back((self.node, op, local, remote, peer))
    }

    fn write_local(&mut self, region: LocalRegion, bytes: Vec<u8>, _: ObjectId) {
        self.arena()[region.offset as usize..region.end() as usize].copy_from_slice(&bytes)
    }

    fn expose_region(&mut self, object: ObjectId, region: LocalRegion) {
        self.world.exposed[self.node.0 as usize].insert(object, region);
    }

    fn unexpose_region(&mut self, object: ObjectId, _: LocalRegion) {
        self.world.exposed[self.node.0 as usize].remove(&object);
    }

    fn directory(&mut self, op: DirectoryOpId, request: DirectoryRequest) {
        let world = &mut *self.world;
        if !world.directory_up {
            return;
        }
        let reply = match request {
            DirectoryRequest::Lookup { id, .. } => match world.locations.get(&id) {
                Some((sizes, holders)) => Some(DirectoryReply::Located {
                    holders: holders.clone(),
                    sizes: Some(*sizes),
                }),
                None => Some(DirectoryReply::Located {
                    holders: vec![],
                    sizes: None,
                }),
            },
            DirectoryRequest::Publish { id, sizes } => {
                let entry = world.locations.entry(id).or_insert((sizes, vec![]));
                entry.1.push(self.node);
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Withdraw { id } => {
                if let Some(entry) = world.locations.get_mut(&id) {
                    entry.1.retain(|&h| h != self.node);
                }
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Unsubscribe { .. } => None,
        };
        if let Some(reply) = reply {
            world.nodes[self.node.0 as usize].handle_directory_reply(world.now, op, reply);
        }
    }

    // Replies and events stay in the log for the assertions.
    fn reply(&mut self, _: ClientId, _: RequestId, _: Response) {}

    fn event(&mut self, _: ClientId, _: ObjectEvent) {}

    fn close_client(&mut self, client: ClientId, reason: String) {
        self.world.closed.push((self.node, client, reason));
    }

    fn persist(&mut self, seq: u64, _: DurableChange) {
        let world = &mut *self.world;
        world.persisted.push((self.node, seq));
        if !world.manual_disk {
            world.nodes[self.node.0 as usize].handle_persisted(world.now, seq);
        }
    }
}

mod clients;
