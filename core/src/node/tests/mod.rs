//! Unit tests of each protocol path, with a minimal in-test driver: messages go through the
//! wire encoding, READs are served from the holder's arena bytes, the directory is a map.
//! Time moves only when a test says so, so every step is visible.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::*;
use crate::client_protocol::{Request, RequestFrame, Response, PROTOCOL_VERSION};
use crate::digest::ContentDigest;
use crate::directory::DirectoryReply;
use crate::error::StoreError;
use crate::ids::ArenaId;
use crate::region::{LocalRegion, RemoteRegion};
use crate::store::{DurableChange, ObjectInfo, StoreConfig};
use crate::wire::{EagerHeader, InputBytes};

const CLIENT: ClientId = ClientId(1);
const ARENA_BYTES: u64 = 1 << 20;

/// Test numbers with this bit name ids made by `ObjectId::owned_by` (see [`owned`]).
const OWNED: u64 = 1 << 62;

/// The test number of an id made on `node` (`ObjectId::owned_by`), the `k`th of its kind.
fn owned(node: u32, k: u64) -> u64 {
    OWNED | u64::from(node) << 48 | k
}

fn id(n: u64) -> ObjectId {
    if n & OWNED != 0 {
        let mut random = [0u8; 12];
        random[4..].copy_from_slice(&n.to_be_bytes());
        return ObjectId::owned_by(NodeId(((n >> 48) & 0xff) as u32), random);
    }
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
    /// The directory: per object, the content it names and its holders. Like the registry, it
    /// refuses a publication of another content while the id has holders.
    locations: BTreeMap<ObjectId, (ObjectSizes, Vec<NodeId>, ContentDigest)>,
    /// Directory requests are dropped unanswered while this is false.
    directory_up: bool,
    /// Directory requests wait in `held_directory` while this is true, for the test to answer.
    hold_directory: bool,
    held_directory: Vec<(NodeId, DirectoryOpId, DirectoryRequest)>,
    /// Holders whose transfers arrive damaged: one byte flipped in every eager chunk and in
    /// every READ's data they serve.
    corrupt_from: Vec<NodeId>,
    messages: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    reads: VecDeque<(NodeId, ReadOpId, LocalRegion, RemoteRegion, u16, NodeId)>,
    fail_reads: u32,
    /// Every output, for assertions: (node, output).
    log: Vec<(NodeId, NodeOutput)>,
    /// Per node, the READ keys it granted: key → (reader, lane, region).
    granted: Vec<BTreeMap<u32, (NodeId, u16, LocalRegion)>>,
    /// The next key each node grants.
    next_key: u32,
    /// Grants and revocations the "fabric" answers on the next turn: (holder, reader, req,
    /// granted or revoked).
    fabric_answers: VecDeque<(NodeId, NodeId, TransferId, bool)>,
    /// Grants refused with this reason instead (while `Some`).
    refuse_grants: Option<GrantError>,
    /// Revocations kept unanswered (while true) in `held_revocations`.
    hold_revocations: bool,
    held_revocations: Vec<(NodeId, NodeId, TransferId, bool)>,
    next_request: u64,
    /// Durable changes are reported only when a test says so (else at once).
    manual_disk: bool,
    /// Durable changes handed out: (node, sequence number).
    persisted: Vec<(NodeId, u64)>,
    /// Clients the nodes closed, with why.
    closed: Vec<(NodeId, ClientId, String)>,
    /// The last message delivered, whose eager payload a `WriteLocal` names.
    input: Vec<u8>,
    /// Per node, the inputs its driver owes it at once (directory replies, hashes, durable
    /// changes), fed by the drive loop.
    answers: Vec<VecDeque<NodeInput<'static>>>,
    /// Per node, its spill records: op → bytes.
    spill_disk: Vec<BTreeMap<crate::store::SpillOpId, Vec<u8>>>,
    /// Spill and restore completions wait in `held_spill_io` while this is true.
    manual_spill: bool,
    held_spill_io: VecDeque<(NodeId, NodeInput<'static>)>,
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
            // Copies are published at once unless a test looks at the deferral.
            config.replica_publication_delay = Duration::ZERO;
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
                    let _ = nodes[a as usize].handle(
                        Instant::ZERO,
                        NodeInput::PeerConnected {
                            peer: NodeId(b),
                            params,
                        },
                    );
                }
            }
        }
        let mut world = World {
            nodes,
            arenas: vec![vec![0; ARENA_BYTES as usize]; n as usize],
            now: Instant::ZERO,
            locations: BTreeMap::new(),
            directory_up: true,
            hold_directory: false,
            held_directory: Vec::new(),
            corrupt_from: Vec::new(),
            messages: VecDeque::new(),
            reads: VecDeque::new(),
            fail_reads: 0,
            log: Vec::new(),
            granted: vec![BTreeMap::new(); n as usize],
            next_key: 0x100,
            fabric_answers: VecDeque::new(),
            refuse_grants: None,
            hold_revocations: false,
            held_revocations: Vec::new(),
            next_request: 1,
            manual_disk: false,
            persisted: Vec::new(),
            closed: Vec::new(),
            input: Vec::new(),
            answers: vec![VecDeque::new(); n as usize],
            spill_disk: vec![BTreeMap::new(); n as usize],
            manual_spill: false,
            held_spill_io: VecDeque::new(),
        };
        for i in 0..n {
            world.connect(i, CLIENT);
        }
        world
    }

    /// Connects `client` to `node` and says Hello.
    /// The link from `node` to `peer` comes up (again), as the world's links start.
    fn link_up(&mut self, node: u32, peer: u32) {
        let params = PeerParams {
            lanes: 2,
            costs: PathCosts::RDMA_DEFAULT,
        };
        self.feed(
            node,
            NodeInput::PeerConnected {
                peer: NodeId(peer),
                params,
            },
        );
    }

    fn connect(&mut self, node: u32, client: ClientId) {
        self.feed(node, NodeInput::ClientConnected { client });
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
        let request = self.hand_request(node, client, body);
        self.pump();
        self.reply_to(node, client, request)
    }

    /// Gives `node` a request of `client` and nothing more (the outputs stay in the node).
    fn hand_request(&mut self, node: u32, client: ClientId, body: Request) -> RequestId {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        let frame = RequestFrame { request, body };
        self.feed(node, NodeInput::ClientRequest { client, frame });
        request
    }

    /// Gives `node` an input at the current time, and nothing more.
    fn feed(&mut self, node: u32, input: NodeInput<'_>) -> Handled {
        self.nodes[node as usize].handle(self.now, input)
    }

    /// The reply to request `request` of `client` on `node`, if it went out.
    fn reply_to(&self, node: u32, client: ClientId, request: RequestId) -> Option<Response> {
        self.log.iter().find_map(|(n, o)| match o {
            NodeOutput::Reply {
                client: c,
                request: r,
                response,
            } if n.0 == node && *c == client && *r == request => Some(response.clone()),
            _ => None,
        })
    }

    /// The id of the last request sent.
    fn last_request(&self) -> RequestId {
        RequestId(self.next_request - 1)
    }

    /// Answers the held directory request of `node` that matches `pred` with `reply`.
    fn answer_directory(
        &mut self,
        node: u32,
        pred: impl Fn(&DirectoryRequest) -> bool,
        reply: DirectoryReply,
    ) {
        let at = self
            .held_directory
            .iter()
            .position(|(n, _, r)| n.0 == node && pred(r))
            .expect("a held directory request");
        let (_, op, _) = self.held_directory.remove(at);
        self.feed(node, NodeInput::DirectoryReply { op, reply });
        self.pump();
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
        let sealed = self.put_bytes(node, n, &Self::bytes_of(n, len));
        assert_eq!(sealed, Some(Response::Done(Ok(()))));
    }

    /// Creates object `n` on `node` with these data bytes and asks to seal it (with the
    /// bytes' digest): the seal's reply, if it came.
    fn put_bytes(&mut self, node: u32, n: u64, data: &[u8]) -> Option<Response> {
        let created = self.request(
            node,
            Request::Create {
                id: id(n),
                data_size: data.len() as u64,
                metadata_size: 0,
            },
        );
        let Some(Response::Created(Ok(info))) = created else {
            panic!("create of {n} on node {node}: {created:?}");
        };
        let region = info.region;
        self.arenas[node as usize][region.offset as usize..region.end() as usize]
            .copy_from_slice(data);
        self.request(
            node,
            Request::Seal {
                id: id(n),
                release: true,
                digest: ContentDigest::of(data, &[]),
            },
        )
    }

    fn fetch(&mut self, node: u32, ns: &[u64], timeout: Duration) {
        self.fetch_in_mode(node, ns, timeout, TransferMode::Auto);
    }

    fn fetch_in_mode(&mut self, node: u32, ns: &[u64], timeout: Duration, mode: TransferMode) {
        self.hand_fetch(node, ns, timeout, mode);
        self.pump();
    }

    /// Hands `node` a fetch request of [`CLIENT`] (waiting for publications) and nothing more.
    fn hand_fetch(&mut self, node: u32, ns: &[u64], timeout: Duration, mode: TransferMode) {
        let ids = ns.iter().map(|&n| id(n)).collect();
        let body = Request::Fetch {
            ids,
            timeout_ms: Some(timeout.as_millis() as u64),
            mode,
            wait_for_publication: true,
        };
        self.hand_request(node, CLIENT, body);
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
            let _ = node.handle(self.now, NodeInput::Timeout);
        }
        self.pump();
    }

    /// Runs the drive loop of `node` alone: its outputs are carried out and its driver's
    /// answers fed, but no message, READ or fabric answer is delivered.
    fn drive_alone(&mut self, node: u32) {
        let now = self.now;
        let host = &mut Carrier {
            world: self,
            node: NodeId(node),
        };
        drive_host(host, now);
    }

    /// Carries out outputs and deliveries until nothing moves (time stands still).
    fn pump(&mut self) {
        self.pump_until(|_| false);
    }

    /// [`World::pump`], stopping early once `stop` holds after a delivery.
    fn pump_until(&mut self, stop: impl Fn(&World) -> bool) {
        loop {
            if stop(self) {
                return;
            }
            let mut moved = false;
            for i in 0..self.nodes.len() {
                let before = self.log.len();
                let now = self.now;
                drive_host(
                    &mut Carrier {
                        world: self,
                        node: NodeId(i as u32),
                    },
                    now,
                );
                moved |= self.log.len() > before;
                self.nodes[i].check_invariants();
            }
            if let Some((from, to, bytes)) = self.messages.pop_front() {
                let peer = from;
                let handled = self.nodes[to.0 as usize].handle(
                    self.now,
                    NodeInput::PeerBytes {
                        peer,
                        bytes: &bytes,
                    },
                );
                assert_eq!(handled, Handled::Done);
                // Kept until the next delivery: an eager chunk's write copies from it.
                self.input = bytes;
                moved = true;
            } else if let Some((holder, reader, req, granted)) = self.fabric_answers.pop_front() {
                let node = &mut self.nodes[holder.0 as usize];
                let peer = reader;
                let input = if !granted {
                    NodeInput::ReadRevoked { peer, req }
                } else if let Some(reason) = &self.refuse_grants {
                    let result = Err(reason.clone());
                    NodeInput::ReadGranted { peer, req, result }
                } else {
                    let keys: Vec<u32> = self.granted[holder.0 as usize]
                        .iter()
                        .filter(|(_, (r, _, _))| *r == reader)
                        .map(|(key, _)| *key)
                        .filter(|key| key >> 16 == req.0 as u32 & 0xffff)
                        .collect();
                    let result = Ok(ReadGrant { keys });
                    NodeInput::ReadGranted { peer, req, result }
                };
                let _ = node.handle(self.now, input);
                moved = true;
            } else if let Some((node, op, local, remote, lane, peer)) = self.reads.pop_front() {
                let result = if self.fail_reads > 0 {
                    self.fail_reads -= 1;
                    Err(ReadError::QueuePair("test".into()))
                } else {
                    let k = key(peer.0);
                    let offset = remote.addr - k.base_addr;
                    // Keys work only for the reader and lane they were granted to.
                    let allowed = self.granted[peer.0 as usize].get(&remote.rkey).is_some_and(
                        |(reader, granted_lane, r)| {
                            *reader == node
                                && *granted_lane == lane
                                && r.offset <= offset
                                && offset + remote.len <= r.end()
                        },
                    );
                    if allowed {
                        let mut src = self.arenas[peer.0 as usize]
                            [offset as usize..(offset + remote.len) as usize]
                            .to_vec();
                        if self.corrupt_from.contains(&peer) {
                            src[0] ^= 0x20;
                        }
                        self.arenas[node.0 as usize][local.offset as usize..local.end() as usize]
                            .copy_from_slice(&src);
                        Ok(())
                    } else {
                        Err(ReadError::RemoteAccess)
                    }
                };
                let input = NodeInput::ReadCompletion { op, result };
                let _ = self.nodes[node.0 as usize].handle(self.now, input);
                moved = true;
            }
            if !moved {
                return;
            }
        }
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

/// The test world as one node's driver.
struct Carrier<'a> {
    world: &'a mut World,
    node: NodeId,
}

impl Carrier<'_> {
    fn arena(&mut self) -> &mut Vec<u8> {
        &mut self.world.arenas[self.node.0 as usize]
    }

    /// An input the node gets from the drive loop, right after this output.
    fn answer(&mut self, input: NodeInput<'static>) {
        self.world.answers[self.node.0 as usize].push_back(input);
    }
}

impl DriveHost<'static> for Carrier<'_> {
    type Driver = Self;

    fn node(&mut self) -> &mut Node {
        &mut self.world.nodes[self.node.0 as usize]
    }

    fn driver(&mut self) -> &mut Self {
        self
    }

    fn poll_answer(&mut self) -> Option<NodeInput<'static>> {
        self.world.answers[self.node.0 as usize].pop_front()
    }

    fn observe_output(&mut self, output: &NodeOutput) {
        self.world.log.push((self.node, output.clone()));
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
        if self.world.corrupt_from.contains(&self.node) {
            // The payload ends the message.
            *bytes.last_mut().expect("a chunk carries bytes") ^= 0x20;
        }
        self.world.messages.push_back((self.node, peer, bytes));
    }

    fn post_read(
        &mut self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
        _object: ObjectId,
    ) {
        self.world
            .reads
            .push_back((self.node, op, local, remote, lane, peer))
    }

    fn write_local(&mut self, region: LocalRegion, payload: InputBytes, _: ObjectId) {
        let n = self.node.0 as usize;
        let world = &mut *self.world;
        world.arenas[n][region.offset as usize..region.end() as usize]
            .copy_from_slice(&world.input[payload.range()])
    }

    fn write_inline(&mut self, region: LocalRegion, bytes: Vec<u8>, _: ObjectId) {
        self.arena()[region.offset as usize..region.end() as usize].copy_from_slice(&bytes)
    }

    fn verify_content(&mut self, transfer: TransferId, region: LocalRegion, _: ObjectId) {
        let world = &mut *self.world;
        let n = self.node.0 as usize;
        let actual = ContentDigest::of_contiguous(
            &world.arenas[n][region.offset as usize..region.end() as usize],
        );
        self.answer(NodeInput::ContentHashed { transfer, actual });
    }

    // The log keeps the output for the assertions; there is no clock to stamp with.
    fn trace(&mut self, _: ClientId, _: RequestId, _: bool) {}

    /// A key per lane (two lanes), like verbs memory windows; the key's high half names the
    /// transfer so the answer finds them.
    fn grant_read(&mut self, peer: NodeId, req: TransferId, _: ObjectId, region: LocalRegion) {
        let world = &mut *self.world;
        if world.refuse_grants.is_none() {
            for lane in 0..2 {
                world.next_key += 1;
                let key = (req.0 as u32 & 0xffff) << 16 | (world.next_key & 0xffff);
                world.granted[self.node.0 as usize].insert(key, (peer, lane, region));
            }
        }
        world.fabric_answers.push_back((self.node, peer, req, true));
    }

    fn grant_partial_read(
        &mut self,
        peer: NodeId,
        req: TransferId,
        object: ObjectId,
        region: LocalRegion,
    ) {
        // The harness's fabric copies straight from the arena: a partial block is as good.
        self.grant_read(peer, req, object, region);
    }

    fn revoke_read(&mut self, peer: NodeId, req: TransferId, _: ObjectId, _: LocalRegion) {
        let world = &mut *self.world;
        world.granted[self.node.0 as usize]
            .retain(|key, (reader, _, _)| !(*reader == peer && key >> 16 == req.0 as u32 & 0xffff));
        let answer = (self.node, peer, req, false);
        if world.hold_revocations {
            world.held_revocations.push(answer);
        } else {
            world.fabric_answers.push_back(answer);
        }
    }

    fn directory(&mut self, op: DirectoryOpId, request: DirectoryRequest) {
        let world = &mut *self.world;
        if !world.directory_up {
            return;
        }
        if world.hold_directory {
            world.held_directory.push((self.node, op, request));
            return;
        }
        let reply = match request {
            // This directory keeps no copies of record (as Redis): a `LocateCopies` is a lookup.
            DirectoryRequest::Lookup { id, .. } | DirectoryRequest::LocateCopies { id } => {
                match world.locations.get(&id) {
                    Some((sizes, holders, digest)) if !holders.is_empty() => {
                        Some(DirectoryReply::Located {
                            holders: holders.clone(),
                            sizes: Some(*sizes),
                            digest: Some(*digest),
                        })
                    }
                    _ => Some(DirectoryReply::Located {
                        holders: vec![],
                        sizes: None,
                        digest: None,
                    }),
                }
            }
            DirectoryRequest::Publish { id, sizes, digest }
            | DirectoryRequest::PublishReplicated {
                id, sizes, digest, ..
            } => {
                let entry = world.locations.entry(id).or_insert((sizes, vec![], digest));
                if entry.1.is_empty() {
                    (entry.0, entry.2) = (sizes, digest);
                }
                if (entry.0, entry.2) != (sizes, digest) {
                    Some(DirectoryReply::Conflict {
                        sizes: entry.0,
                        digest: entry.2,
                    })
                } else {
                    entry.1.push(self.node);
                    Some(DirectoryReply::Done)
                }
            }
            DirectoryRequest::Withdraw { id } | DirectoryRequest::DeleteEverywhere { id } => {
                if let Some(entry) = world.locations.get_mut(&id) {
                    entry.1.retain(|&h| h != self.node);
                }
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Unsubscribe { .. } => None,
            DirectoryRequest::DeclineReplica { .. } => Some(DirectoryReply::Done),
        };
        if let Some(reply) = reply {
            self.answer(NodeInput::DirectoryReply { op, reply });
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
            self.answer(NodeInput::Persisted { upto: seq });
        }
    }

    /// Tests connect their nodes themselves; a dial is only logged.
    fn connect(&mut self, _: NodeId, _: std::net::SocketAddr) {}

    fn spill(
        &mut self,
        op: crate::store::SpillOpId,
        _: ObjectId,
        region: LocalRegion,
        _: Option<ContentDigest>,
    ) {
        let bytes = self.arena()[region.offset as usize..region.end() as usize].to_vec();
        let n = self.node.0 as usize;
        self.world.spill_disk[n].insert(op, bytes);
        let place = crate::store::SpillPlace {
            file: 0,
            offset: op.0,
        };
        self.spill_io(NodeInput::SpillDone {
            op,
            result: Ok(place),
        });
    }

    fn restore(
        &mut self,
        op: crate::store::SpillOpId,
        _: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    ) {
        let n = self.node.0 as usize;
        let world = &mut *self.world;
        let result = match world.spill_disk[n].get(&op) {
            None => Err(crate::store::RestoreError::Missing),
            Some(bytes) if digest.is_some_and(|d| d != ContentDigest::of_contiguous(bytes)) => {
                Err(crate::store::RestoreError::Damaged)
            }
            Some(bytes) => {
                world.arenas[n][region.offset as usize..region.end() as usize]
                    .copy_from_slice(bytes);
                Ok(())
            }
        };
        self.spill_io(NodeInput::RestoreDone { op, result });
    }

    fn discard_spilled(&mut self, op: crate::store::SpillOpId, _: ObjectId) {
        let n = self.node.0 as usize;
        self.world.spill_disk[n].remove(&op);
    }
}

impl Carrier<'_> {
    /// A spill or restore completion: at once, or held for the test.
    fn spill_io(&mut self, input: NodeInput<'static>) {
        if self.world.manual_spill {
            self.world.held_spill_io.push_back((self.node, input));
        } else {
            self.answer(input);
        }
    }
}

mod clients;
mod drive;
mod hints;
mod locate;
mod publications;
mod relay;
mod replicas;
mod replicas_spill;
mod sealing;
mod spill;
mod transfers;
