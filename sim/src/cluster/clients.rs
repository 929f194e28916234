//! Simulated local clients. They speak the client protocol to the node exactly as the daemon's
//! clients do (`Hello` first, then requests, every answer a reply output), so request
//! validation, the store calls, `locate` through the directory and replies held for
//! durability all run under the simulator. Each client pairs requests and replies with the
//! [`ClientSession`] the Rust client uses, and releases what it holds as a dropped buffer
//! does (`ReleaseUnanswered`, no reply), with a `Flush` now and then to hear of failures. Besides the workload's puts, gets, fetches,
//! deletes and evictions, clients misuse the protocol now and then (seal what they did not
//! create, release what they do not hold, create what can never fit, skip `Hello`…) and the
//! node must answer each with an error and stay consistent.

use std::fmt;
use std::time::Duration;

use rand::Rng;
use skyriver_core::client_protocol::{
    Request, RequestFrame, Response, ServerFrame, MAX_IDS_PER_REQUEST, MAX_INLINE_PUT_BYTES,
    PROTOCOL_VERSION,
};
use skyriver_core::client_session::{ClientSession, ConnectionLost};
use skyriver_core::digest::ContentDigest;
use skyriver_core::{
    ClientId, NodeId, NodeInput, ObjectId, ObjectInfo, ObjectSizes, RequestId, StoreError,
    TransferMode,
};

use super::{short_fetch_error, short_store_error, Cluster, Event, IdList};
use crate::checker::{Content, PendingOp};
use crate::workload::{self, ClientOp, Misuse};

/// Ids of clients that only misuse the protocol (connect without `Hello`, …): they start here.
const ROGUE_CLIENT_BASE: u64 = 1 << 32;

/// A client flushes once it sent this many releases without a reply since its last flush.
const RELEASES_PER_FLUSH: u64 = 4;

/// A `nodes` answer lists every member: in a cluster of more than this many nodes, a client
/// that draws a request for it asks for it once in every `nodes / MEMBER_LIST_MEMBERS` draws
/// (rounded up, counted over the whole cluster) and for `stats` the other times. The lists
/// answered then cost an operation what they cost at this size, not N times a 1-node list: at
/// 1,000 nodes a fifth of the inspections (0.8% of operations) asked for 1,000 members, about
/// 6% of a run, far more often than anyone asks `skyriver nodes`. Clusters of up to this size
/// ask as drawn (their traces are unchanged).
const MEMBER_LIST_MEMBERS: usize = 64;

/// Which client session: node, incarnation, client.
pub(super) type SessionKey = (NodeId, u32, ClientId);

/// What a client waits for from one of its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Call {
    /// `Hello`: a `Welcome`.
    Hello,
    /// `Create`: then write the bytes and seal; hold the object for `hold_us` when set.
    Create {
        id: ObjectId,
        sizes: ObjectSizes,
        hold_us: Option<u64>,
        variant: u32,
    },
    /// `Seal` of content `variant` of `id`; `removals`: how often `id` had left the node's
    /// store when the request went out.
    Seal {
        id: ObjectId,
        hold_us: Option<u64>,
        variant: u32,
        removals: u64,
    },
    /// `Put`: the object created with its bytes and sealed in one request.
    Put {
        id: ObjectId,
        sizes: ObjectSizes,
        variant: u32,
        removals: u64,
    },
    /// `ReleaseUnanswered` of a reference the client holds (as a dropped buffer does): no
    /// reply comes, a later `Flush` reports a failure.
    Release { id: ObjectId },
    /// `Flush`: every release before it succeeded, since the client held what it released.
    Flush { releases: u64 },
    /// `Delete`, `Evict`, `Stats`, `List`, `Contains`, `Locate`, `Nodes`: any reply of the
    /// right kind.
    Inspect { kind: &'static str },
    /// `Get` or `Fetch`: checked against the checker's pending entry.
    Objects { kind: &'static str },
    /// A misuse: the reply must be an error.
    Misuse { what: &'static str },
}

impl Cluster {
    /// Connects the node's clients (after a start or restart) and says `Hello` for each.
    pub(super) fn connect_clients(&mut self, n: NodeId) {
        let count = self.params.clients_per_node.max(1) as u64;
        let inc = self.nodes[n.0 as usize].inc;
        for c in 0..count {
            let client = ClientId(super::WORKLOAD_CLIENT_BASE + c);
            self.sessions.insert((n, inc, client), ClientSession::new());
            let now = self.now;
            if let Some(node) = self.nodes[n.0 as usize].node.as_mut() {
                let _ = node.handle(now, NodeInput::ClientConnected { client });
            }
            self.client_request(
                n,
                client,
                Request::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    client_name: format!("sim-{}", client.0),
                },
                Call::Hello,
            );
        }
    }

    /// Sends one request of `client` to node `n` now and carries out the node's outputs.
    pub(super) fn client_request(
        &mut self,
        n: NodeId,
        client: ClientId,
        body: Request,
        call: Call,
    ) {
        if let Some(frame) = self.client_frame(n, client, body, call) {
            self.deliver_request(n, client, frame);
        }
    }

    /// Numbers a request of `client` of node `n` in its session, awaiting its reply with
    /// `call`; `None` when the node is down or the session refuses (its connection was
    /// closed).
    fn client_frame(
        &mut self,
        n: NodeId,
        client: ClientId,
        body: Request,
        call: Call,
    ) -> Option<RequestFrame> {
        let inc = self.nodes[n.0 as usize].inc;
        self.nodes[n.0 as usize].node.as_ref()?;
        let session = self.sessions.entry((n, inc, client)).or_default();
        match session.send(body, call) {
            Ok(frame) => Some(frame),
            Err(refused) => {
                self.record(|| format!("{client}@{n} cannot send: {refused}"));
                None
            }
        }
    }

    /// Hands a numbered request to the node and carries out the node's outputs.
    fn deliver_request(&mut self, n: NodeId, client: ClientId, frame: RequestFrame) {
        let now = self.now;
        if self.nodes[n.0 as usize].node.is_none() {
            return;
        }
        self.requests_sent += 1;
        // Recorded before the node takes the request (which writes no line): formatted
        // straight from the request into the trace's buffer.
        let request = frame.request;
        self.trace.record_args(
            now,
            format_args!("{client}@{n} {request} {}", RequestLine(&frame.body)),
        );
        let node = self.nodes[n.0 as usize].node.as_mut().expect("alive");
        let _ = node.handle(now, NodeInput::ClientRequest { client, frame });
        self.after_input(n);
    }

    /// `client` of node `n` drops its reference to `id`, as a dropped buffer does: a release
    /// without a reply, and a `Flush` once a few of them went out.
    pub(super) fn client_release(&mut self, n: NodeId, client: ClientId, id: ObjectId) {
        self.client_request(
            n,
            client,
            Request::ReleaseUnanswered { id },
            Call::Release { id },
        );
        if self.unflushed_releases(n, client) >= RELEASES_PER_FLUSH {
            self.client_flush(n, client);
        }
    }

    /// `client` of node `n` asks whether its releases since the last flush all succeeded.
    pub(super) fn client_flush(&mut self, n: NodeId, client: ClientId) {
        let releases = self.unflushed_releases(n, client);
        self.client_request(n, client, Request::Flush, Call::Flush { releases });
    }

    fn unflushed_releases(&self, n: NodeId, client: ClientId) -> u64 {
        let inc = self.nodes[n.0 as usize].inc;
        self.sessions
            .get(&(n, inc, client))
            .map_or(0, ClientSession::unflushed_releases)
    }

    /// A reply reached `client` of node `n`.
    pub(super) fn client_replied(
        &mut self,
        n: NodeId,
        client: ClientId,
        request: RequestId,
        response: Response,
    ) {
        let now = self.now;
        let inc = self.nodes[n.0 as usize].inc;
        let Some(session) = self.sessions.get_mut(&(n, inc, client)) else {
            self.checker.violation(
                now,
                format!("{client}@{n}: reply to {request} of a client never connected"),
            );
            return;
        };
        if let Err(violation) = session.receive(ServerFrame::Reply { request, response }) {
            self.checker
                .violation(now, format!("{client}@{n}: {violation}"));
            return;
        }
        let Some((call, response)) = session.take_reply(request) else {
            unreachable!("a reply the session took in is there to take");
        };
        match (call, response) {
            (Call::Hello, Response::Welcome { .. }) => {}
            (
                Call::Create {
                    id,
                    sizes,
                    hold_us,
                    variant,
                },
                Response::Created(result),
            ) => self.created(n, client, id, (sizes, variant), hold_us, result),
            (
                Call::Seal {
                    id,
                    hold_us,
                    variant,
                    removals,
                },
                Response::Done(result),
            ) => self.sealed(n, client, id, (hold_us, variant, removals), result),
            (
                Call::Put {
                    id,
                    sizes,
                    variant,
                    removals,
                },
                Response::Done(result),
            ) => match result {
                Err(StoreError::ObjectExists(_)) if variant != 0 => {
                    self.another_content_refused(n, client, id, variant)
                }
                Err(StoreError::TooFewReplicas { copies, .. }) => {
                    self.replicated_put_too_few(n, id, copies)
                }
                // The store may be full (or the id taken by a create of another client).
                Err(error) => {
                    let error = short_store_error(&error);
                    self.record(|| {
                        format!(
                            "{client}@{n} put {id} {}+{}: {error}",
                            sizes.data_size, sizes.metadata_size
                        )
                    });
                }
                Ok(()) => self.sealed(n, client, id, (None, variant, removals), Ok(())),
            },
            (Call::Flush { releases }, Response::Done(Err(error))) => self.checker.violation(
                now,
                format!("{client}@{n}: one of {releases} releases failed: {error}"),
            ),
            (Call::Flush { releases }, Response::Done(Ok(()))) => {
                self.stats.flushes += 1;
                self.record(|| format!("{client}@{n} flushed {releases} releases"));
            }
            (Call::Objects { kind: "get" }, Response::Got(results)) => {
                let results = results
                    .into_iter()
                    .map(|r| r.map_err(|e| short_store_error(&e)))
                    .collect();
                self.client_reply(n, client, request, "get", results);
            }
            (Call::Objects { kind: "fetch" }, Response::Fetched(results)) => {
                let results = results
                    .into_iter()
                    .map(|r| r.map_err(|e| short_fetch_error(&e)))
                    .collect();
                self.client_reply(n, client, request, "fetch", results);
            }
            (Call::Inspect { kind }, response) => self.inspected(n, client, kind, response),
            (Call::Misuse { what }, response) => {
                if is_error(&response) {
                    self.stats.misuses_refused += 1;
                    self.record(|| format!("{client}@{n} {what}: refused ({response:?})"));
                } else {
                    self.checker.violation(
                        now,
                        format!("{client}@{n}: {what} was not refused: {response:?}"),
                    );
                }
            }
            (call, response) => self.checker.violation(
                now,
                format!("{client}@{n}: {call:?} answered with {response:?}"),
            ),
        }
    }

    /// The node closed a client's connection.
    pub(super) fn client_closed(&mut self, n: NodeId, client: ClientId, reason: String) {
        self.record(|| format!("{client}@{n} closed: {reason}"));
        if client.0 < ROGUE_CLIENT_BASE {
            self.checker.violation(
                self.now,
                format!("{client}@{n}: a well-behaved client was disconnected: {reason}"),
            );
        }
        let now = self.now;
        let inc = self.nodes[n.0 as usize].inc;
        if let Some(session) = self.sessions.get_mut(&(n, inc, client)) {
            // Nothing more comes: what it waited for is forgotten, later sends refused.
            session.disconnect(ConnectionLost::Closed);
        }
        if let Some(node) = self.nodes[n.0 as usize].node.as_mut() {
            let _ = node.handle(now, NodeInput::ClientDisconnected { client });
        }
    }

    fn created(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        (sizes, variant): (ObjectSizes, u32),
        hold_us: Option<u64>,
        result: Result<ObjectInfo, StoreError>,
    ) {
        let now = self.now;
        let info = match result {
            Ok(info) => info,
            Err(error) => {
                let error = short_store_error(&error);
                self.record(|| {
                    format!(
                        "{client}@{n} create {id} {}+{}: {error}",
                        sizes.data_size, sizes.metadata_size
                    )
                });
                return;
            }
        };
        // The client writes its object through its mapping, then seals it.
        let sim_node = &mut self.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        self.checker
            .check_write_target(now, n, store, id, info.region, "client write");
        let bytes = self
            .checker
            .content_bytes(&id, variant, info.region.len as usize);
        let digest = ContentDigest::of_contiguous(bytes);
        sim_node.memory.write(info.region, bytes);
        self.record(|| {
            format!(
                "{client}@{n} wrote {id} {}+{} at {}",
                sizes.data_size, sizes.metadata_size, info.region
            )
        });
        let inc = self.nodes[n.0 as usize].inc;
        let removals = self.removals(n, id);
        // Right after this step: a node's outputs are all carried out before its next input.
        self.schedule(
            self.now,
            Event::ClientSend {
                node: n,
                inc,
                client,
                body: self.seal_request(id, hold_us.is_none(), digest),
                call: Call::Seal {
                    id,
                    hold_us,
                    variant,
                    removals,
                },
            },
        );
    }

    fn sealed(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        (hold_us, variant, removals): (Option<u64>, u32, u64),
        result: Result<(), StoreError>,
    ) {
        match result {
            Err(StoreError::ObjectExists(_)) if variant != 0 => {
                return self.another_content_refused(n, client, id, variant);
            }
            Err(StoreError::TooFewReplicas { copies, .. }) => {
                return self.replicated_put_too_few(n, id, copies);
            }
            Err(error) => {
                self.checker.violation(
                    self.now,
                    format!("{client}@{n}: seal of its own {id} failed: {error}"),
                );
                return;
            }
            Ok(()) => {}
        }
        self.stats.puts += 1;
        self.replicated_put_acked(n, id);
        if variant == 0 {
            self.known_objects.push(id);
        } else {
            self.stats.reused_ids_accepted += 1;
        }
        self.check_one_content(n, id);
        // The object this request sealed, not another under the same id: a reply held for
        // durability may arrive after the object left and the id was created again.
        let still_here = self.nodes[n.0 as usize]
            .node
            .as_ref()
            .is_some_and(|node| node.store().sealed_info(&id).is_some())
            && self.removals(n, id) == removals;
        if self.params.hold_replies_until_durable && still_here {
            // The node promised: this seal survives a crash until the object leaves the store
            // (a reply held for durability may arrive after an eviction already took it).
            self.nodes[n.0 as usize].acked_seals.insert(id);
        }
        if let Some(hold_us) = hold_us {
            let inc = self.nodes[n.0 as usize].inc;
            self.schedule(
                self.after(hold_us * 1000),
                Event::ClientRelease {
                    node: n,
                    inc,
                    client,
                    id,
                },
            );
        }
    }

    /// A put of another content under a known id was refused: the id names its first content
    /// while live nodes hold it.
    fn another_content_refused(&mut self, n: NodeId, client: ClientId, id: ObjectId, variant: u32) {
        self.stats.reused_ids_refused += 1;
        self.record(|| format!("{client}@{n} put of content {variant} under {id}: exists"));
    }

    fn inspected(&mut self, n: NodeId, client: ClientId, kind: &'static str, response: Response) {
        let fits = matches!(
            (kind, &response),
            ("delete", Response::Deleted(_))
                | ("evict", Response::Evicted(_))
                | ("stats", Response::Stats(_))
                | ("list", Response::Listed(_))
                | ("contains", Response::Contains(_))
                | ("nodes", Response::Nodes(_))
                | ("locate", Response::Located { .. })
                | (
                    "locate",
                    Response::Error(StoreError::DirectoryUnavailable(_))
                )
        );
        if !fits {
            self.checker.violation(
                self.now,
                format!("{client}@{n}: {kind} answered with {response:?}"),
            );
            return;
        }
        if let Response::Nodes(view) = &response {
            if view.node != n || !view.members.iter().any(|m| m.node == n) {
                self.checker.violation(
                    self.now,
                    format!("{n}: nodes view without itself: {view:?}"),
                );
            }
        }
        self.record(|| format!("{client}@{n} {kind}: {}", short_response(&response)));
    }

    /// How often `id` left node `n`'s store.
    fn removals(&self, n: NodeId, id: ObjectId) -> u64 {
        self.nodes[n.0 as usize]
            .removals
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    /// An object left node `n`'s store: a seal acknowledged there no longer has to survive.
    pub(super) fn object_left(&mut self, n: NodeId, id: ObjectId) {
        self.nodes[n.0 as usize].acked_seals.remove(&id);
        *self.nodes[n.0 as usize].removals.entry(id).or_default() += 1;
        self.forget_accepted(n, Some(id));
        self.replica_copy_left(n, id);
    }

    fn client_reply(
        &mut self,
        n: NodeId,
        client: ClientId,
        request: RequestId,
        kind: &str,
        results: Vec<Result<ObjectInfo, String>>,
    ) {
        let now = self.now;
        let inc = self.nodes[n.0 as usize].inc;
        let Some(pending) = self.checker.pending.remove(&(n, inc, client, request)) else {
            self.checker.violation(
                now,
                format!("{client}@{n}: {kind} reply to unknown {request}"),
            );
            return;
        };
        if now > pending.deadline {
            let late = now.saturating_since(pending.deadline);
            self.checker.violation(
                now,
                format!("{client}@{n}: {kind} {request} answered {late:?} after its deadline"),
            );
        }
        if results.len() != pending.ids.len() {
            self.checker.violation(
                now,
                format!(
                    "{client}@{n}: {kind} {request} has {} results for {} ids",
                    results.len(),
                    pending.ids.len()
                ),
            );
        }
        let summary = ReplySummary {
            results: &results,
            ids: &pending.ids,
        };
        self.trace.record_args(
            now,
            format_args!("{client}@{n} {kind} {request} -> [{summary}]"),
        );
        if kind == "fetch" {
            self.stats.fetch_replies += 1;
        }
        for (result, id) in results.into_iter().zip(pending.ids) {
            let Ok(info) = result else {
                if kind == "fetch" {
                    self.stats.fetched_err += 1;
                }
                continue;
            };
            if kind == "fetch" {
                self.stats.fetched_ok += 1;
            }
            if info.id != id {
                self.checker.violation(
                    now,
                    format!("{client}@{n}: asked for {id}, got {}", info.id),
                );
            }
            let sim_node = &self.nodes[n.0 as usize];
            let store = sim_node.node.as_ref().expect("alive").store();
            self.checker.check_sealed_object(
                now,
                n,
                store,
                &sim_node.memory,
                info.id,
                "client read",
            );
            let hold_ns = if self.mode.workload {
                self.rng.gen_range(0..=500_000)
            } else {
                100_000
            };
            self.schedule(
                self.after(hold_ns),
                Event::ClientRelease {
                    node: n,
                    inc,
                    client,
                    id: info.id,
                },
            );
        }
    }

    // ---- Workload ----

    pub(super) fn client_op(&mut self, n: NodeId, client: ClientId) {
        let eager_capacity =
            self.params.receive_slot_bytes as u64 * self.params.max_eager_chunks as u64;
        let op = workload::draw_op(
            &mut self.rng,
            eager_capacity,
            self.params.arena_bytes,
            self.params.fetch_timeout_us,
        );
        match op {
            ClientOp::Put { sizes } => {
                let id = self.new_object_id();
                if self.replicated_put(n, client, id, sizes) {
                    return;
                }
                let total = sizes.data_size + sizes.metadata_size;
                // Small objects go inline half the time (by id, so no draw of the seeded RNG
                // changes): both ways of putting them stay exercised.
                if total <= MAX_INLINE_PUT_BYTES as u64 && self.next_object % 2 == 0 {
                    self.client_put_inline(n, client, id, sizes);
                } else {
                    self.client_put(n, client, id, sizes, None);
                }
            }
            ClientOp::Reuse => {
                // Another content under an id put before, with the same sizes (other bytes
                // are the case a size check alone misses).
                if self.known_objects.is_empty() {
                    return;
                }
                let id = self.known_objects[self.rng.gen_range(0..self.known_objects.len())];
                let Some(first) = self.checker.contents.get(&id).and_then(|c| c.first()) else {
                    return;
                };
                let sizes = first.sizes;
                let variant = self.next_variant();
                let total = sizes.data_size + sizes.metadata_size;
                if total <= MAX_INLINE_PUT_BYTES as u64 && variant % 2 == 0 {
                    self.client_put_inline_content(n, client, id, sizes, variant);
                } else {
                    self.client_put_content(n, client, id, sizes, None, variant);
                }
            }
            ClientOp::Hog { sizes, hold_us } => {
                let id = self.new_object_id();
                self.client_put(n, client, id, sizes, Some(hold_us));
            }
            ClientOp::Get { count, timeout_us } => {
                let ids: Vec<ObjectId> = (0..count).map(|_| self.pick_object()).collect();
                let timeout = Duration::from_micros(timeout_us);
                self.client_objects(
                    n,
                    client,
                    Request::Get {
                        ids: ids.clone(),
                        timeout_ms: None,
                    },
                    "get",
                    ids,
                    timeout,
                );
            }
            ClientOp::Fetch { count, timeout_us } => {
                let ids: Vec<ObjectId> = (0..count).map(|_| self.pick_object()).collect();
                // Half the fetches wait for a publication, half fail after the grace when
                // nobody holds an id.
                let wait = self.rng.gen_bool(0.5);
                self.client_fetch(n, client, ids, Duration::from_micros(timeout_us), wait);
            }
            ClientOp::Delete => {
                let id = self.pick_object();
                self.replica_delete_asked(id);
                self.client_request(
                    n,
                    client,
                    Request::Delete { ids: vec![id] },
                    Call::Inspect { kind: "delete" },
                );
            }
            ClientOp::Evict { bytes } => self.client_request(
                n,
                client,
                Request::Evict { bytes },
                Call::Inspect { kind: "evict" },
            ),
            ClientOp::Inspect { which } => {
                let id = self.pick_object();
                let (body, kind) = match which % 5 {
                    0 => (Request::Stats, "stats"),
                    1 => (Request::List, "list"),
                    2 => (Request::Contains { id }, "contains"),
                    3 => (Request::Locate { id }, "locate"),
                    _ if self.member_list_due() => (Request::Nodes, "nodes"),
                    _ => (Request::Stats, "stats"),
                };
                self.client_request(n, client, body, Call::Inspect { kind });
            }
            ClientOp::Misuse(misuse) => self.misuse(n, client, misuse),
        }
    }

    /// Whether a drawn request for the member list is made (see [`MEMBER_LIST_MEMBERS`]).
    fn member_list_due(&mut self) -> bool {
        let every = self.nodes.len().div_ceil(MEMBER_LIST_MEMBERS).max(1) as u64;
        let due = self.member_list_draws % every == 0;
        self.member_list_draws += 1;
        due
    }

    fn misuse(&mut self, n: NodeId, client: ClientId, misuse: Misuse) {
        let known = self.pick_object();
        let (body, what) = match misuse {
            Misuse::SealUnknown => (
                Request::Seal {
                    id: ObjectId::from_u64((1 << 41) + self.rng.gen_range(0..1000)),
                    release: true,
                    digest: ContentDigest(0),
                },
                "seal of an object nobody created",
            ),
            Misuse::SealOthers => (
                Request::Seal {
                    id: known,
                    release: false,
                    digest: ContentDigest(0),
                },
                "seal of an object it did not create",
            ),
            Misuse::AbortOthers => (Request::Abort { id: known }, "abort of a sealed object"),
            Misuse::ReleaseUnheld => (
                Request::Release {
                    id: ObjectId::from_u64((1 << 41) + self.rng.gen_range(0..1000)),
                },
                "release of an object it does not hold",
            ),
            Misuse::CreateHuge => (
                Request::Create {
                    id: self.new_object_id(),
                    data_size: u64::MAX - 10,
                    metadata_size: 20,
                },
                "create of an object that can never fit",
            ),
            Misuse::CreateExisting => (
                Request::Create {
                    id: known,
                    data_size: 1,
                    metadata_size: 0,
                },
                "create of an id that may exist",
            ),
            Misuse::PutExisting => (
                Request::Put {
                    id: known,
                    data: vec![0],
                    metadata: Vec::new(),
                },
                "put of an id that may exist",
            ),
            Misuse::PutOversized => (
                Request::Put {
                    id: self.new_object_id(),
                    data: vec![0; MAX_INLINE_PUT_BYTES + 1],
                    metadata: Vec::new(),
                },
                "put of more bytes than a request carries inline",
            ),
            Misuse::SecondHello => (
                Request::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    client_name: "again".into(),
                },
                "a second Hello",
            ),
            Misuse::TooManyIds => (
                Request::Delete {
                    ids: vec![known; MAX_IDS_PER_REQUEST + 1],
                },
                "a delete of too many ids",
            ),
            Misuse::NoHello | Misuse::WrongVersion => {
                return self.rogue_client(n, misuse);
            }
        };
        let reuses_id =
            what == "create of an id that may exist" || what == "put of an id that may exist";
        if reuses_id && !self.known_objects.contains(&known) {
            // Not a misuse when the id never existed: an ordinary tiny put.
            let id = self.new_object_id();
            return self.client_put(
                n,
                client,
                id,
                ObjectSizes {
                    data_size: 1,
                    metadata_size: 0,
                },
                None,
            );
        }
        // Re-creating an id that was deleted everywhere is legal; only a live copy here is a
        // misuse.
        if reuses_id {
            let here = self.nodes[n.0 as usize]
                .node
                .as_ref()
                .is_some_and(|node| node.store().summary(&known).is_some());
            if !here {
                return;
            }
        }
        if what == "seal of an object it did not create" || what == "abort of a sealed object" {
            // Only a sealed object here is certainly not this client's to seal or abort.
            let sealed_here = self.nodes[n.0 as usize]
                .node
                .as_ref()
                .is_some_and(|node| node.store().sealed_info(&known).is_some());
            if !sealed_here {
                return;
            }
        }
        self.client_request(n, client, body, Call::Misuse { what });
    }

    /// A client that connects and breaks the protocol at once: it must be refused and
    /// disconnected, everyone else unharmed.
    fn rogue_client(&mut self, n: NodeId, misuse: Misuse) {
        self.next_rogue += 1;
        let client = ClientId(ROGUE_CLIENT_BASE + self.next_rogue);
        let now = self.now;
        let Some(node) = self.nodes[n.0 as usize].node.as_mut() else {
            return;
        };
        let _ = node.handle(now, NodeInput::ClientConnected { client });
        let (body, what) = match misuse {
            Misuse::WrongVersion => (
                Request::Hello {
                    protocol_version: PROTOCOL_VERSION + 1000,
                    client_name: "future".into(),
                },
                "a Hello of another protocol version",
            ),
            _ => (Request::List, "a request before Hello"),
        };
        self.client_request(n, client, body, Call::Misuse { what });
        // The node closed it (checked in `client_closed` by its id); a client that is still
        // connected now was not refused.
        let still = self.nodes[n.0 as usize]
            .node
            .as_ref()
            .is_some_and(|node| node.client_count() > self.params.clients_per_node.max(1));
        if still {
            self.checker.violation(
                self.now,
                format!("{client}@{n}: {what} did not close the connection"),
            );
        }
    }

    fn new_object_id(&mut self) -> ObjectId {
        let id = ObjectId::from_u64(self.next_object);
        self.next_object += 1;
        id
    }

    /// A known object most of the time; sometimes one that never exists.
    fn pick_object(&mut self) -> ObjectId {
        if self.known_objects.is_empty() || self.rng.gen_range(0..100) < 10 {
            return ObjectId::from_u64((1 << 40) + self.rng.gen_range(0..1000));
        }
        // Prefer recent objects: they are likelier to still exist somewhere.
        let len = self.known_objects.len();
        let recent = len.min(64);
        let index = if self.rng.gen_bool(0.8) {
            len - 1 - self.rng.gen_range(0..recent)
        } else {
            self.rng.gen_range(0..len)
        };
        self.known_objects[index]
    }

    /// A `get` or `fetch` whose reply the checker waits for. The protocol carries whole
    /// milliseconds: the timeout is rounded up to them, for the node and the checker alike.
    fn client_objects(
        &mut self,
        n: NodeId,
        client: ClientId,
        body: Request,
        kind: &'static str,
        ids: Vec<ObjectId>,
        timeout: Duration,
    ) -> Option<RequestId> {
        let timeout_ms = timeout.as_micros().div_ceil(1000) as u64;
        let inc = self.nodes[n.0 as usize].inc;
        let body = match body {
            Request::Get { ids, .. } => Request::Get {
                ids,
                timeout_ms: Some(timeout_ms),
            },
            Request::Fetch {
                ids,
                mode,
                wait_for_publication,
                ..
            } => Request::Fetch {
                ids,
                timeout_ms: Some(timeout_ms),
                mode,
                wait_for_publication,
            },
            Request::FetchFrom {
                ids,
                mode,
                wait_for_publication,
                hint,
                ..
            } => Request::FetchFrom {
                ids,
                timeout_ms: Some(timeout_ms),
                mode,
                wait_for_publication,
                hint,
            },
            other => other,
        };
        let frame = self.client_frame(n, client, body, Call::Objects { kind })?;
        let op = PendingOp {
            kind,
            ids,
            issued: self.now,
            deadline: self.now + Duration::from_millis(timeout_ms),
        };
        // Before the node sees it: it may answer at once.
        self.checker
            .pending
            .insert((n, inc, client, frame.request), op);
        let request = frame.request;
        self.deliver_request(n, client, frame);
        Some(request)
    }

    pub(super) fn client_fetch(
        &mut self,
        n: NodeId,
        client: ClientId,
        ids: Vec<ObjectId>,
        timeout: Duration,
        wait_for_publication: bool,
    ) -> Option<RequestId> {
        let mode = if self.params.forced_modes {
            TransferMode::ALL[((self.requests_sent + 1) % 3) as usize]
        } else {
            TransferMode::Auto
        };
        // Seeds that force modes also hint every other fetch at a node chosen without the
        // seed's generator (so every other draw stays what it was): right or wrong, live or
        // crashed, the fetch must end as an unhinted one would.
        let body = if self.params.forced_modes && self.requests_sent % 2 == 1 {
            let hint = NodeId((self.requests_sent / 2 % self.nodes.len() as u64) as u32);
            Request::FetchFrom {
                ids: ids.clone(),
                timeout_ms: None,
                mode,
                wait_for_publication,
                hint,
            }
        } else {
            Request::Fetch {
                ids: ids.clone(),
                timeout_ms: None,
                mode,
                wait_for_publication,
            }
        };
        self.client_objects(n, client, body, "fetch", ids, timeout)
    }

    /// One `Put` carrying the object's bytes: created, written and sealed by the node.
    pub(super) fn client_put_inline(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        sizes: ObjectSizes,
    ) {
        self.client_put_inline_content(n, client, id, sizes, 0);
    }

    /// [`Cluster::client_put_inline`] of content `variant`.
    pub(super) fn client_put_inline_content(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        sizes: ObjectSizes,
        variant: u32,
    ) {
        self.checker.put(id, Content { variant, sizes });
        self.replica_put_started(id, variant);
        let mut bytes = workload::content_bytes(
            &id,
            variant,
            (sizes.data_size + sizes.metadata_size) as usize,
        );
        let metadata = bytes.split_off(sizes.data_size as usize);
        let removals = self.removals(n, id);
        self.client_request(
            n,
            client,
            Request::Put {
                id,
                data: bytes,
                metadata,
            },
            Call::Put {
                id,
                sizes,
                variant,
                removals,
            },
        );
    }

    /// Create, then (on the reply) write and seal; `hold_us`: keep the creator's reference
    /// that long after the seal.
    pub(super) fn client_put(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        sizes: ObjectSizes,
        hold_us: Option<u64>,
    ) {
        self.client_put_content(n, client, id, sizes, hold_us, 0);
    }

    /// [`Cluster::client_put`] of content `variant`.
    pub(super) fn client_put_content(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        sizes: ObjectSizes,
        hold_us: Option<u64>,
        variant: u32,
    ) {
        self.checker.put(id, Content { variant, sizes });
        self.replica_put_started(id, variant);
        self.client_request(
            n,
            client,
            Request::Create {
                id,
                data_size: sizes.data_size,
                metadata_size: sizes.metadata_size,
            },
            Call::Create {
                id,
                sizes,
                hold_us,
                variant,
            },
        );
    }
}

fn is_error(response: &Response) -> bool {
    match response {
        Response::Error(_) => true,
        Response::Created(result) => result.is_err(),
        Response::Done(result) => result.is_err(),
        Response::Deleted(results) => results.iter().all(|r| r.is_err()),
        _ => false,
    }
}

/// A request as its trace line shows it.
struct RequestLine<'a>(&'a Request);

impl fmt::Display for RequestLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Request::Get { ids, timeout_ms } => {
                write!(
                    f,
                    "get [{}] timeout {}ms",
                    IdList(ids),
                    timeout_ms.unwrap_or(0)
                )
            }
            Request::Fetch {
                ids,
                timeout_ms,
                mode,
                wait_for_publication,
            } => {
                write!(
                    f,
                    "fetch [{}] timeout {}ms",
                    IdList(ids),
                    timeout_ms.unwrap_or(0)
                )?;
                if *mode != TransferMode::Auto {
                    write!(f, " {mode}")?;
                }
                if *wait_for_publication {
                    f.write_str(" wait")?;
                }
                Ok(())
            }
            Request::FetchFrom {
                ids,
                timeout_ms,
                hint,
                ..
            } => write!(
                f,
                "fetch [{}] from {hint} timeout {}ms",
                IdList(ids),
                timeout_ms.unwrap_or(0)
            ),
            Request::Hello {
                protocol_version, ..
            } => write!(f, "hello v{protocol_version}"),
            Request::Create {
                id,
                data_size,
                metadata_size,
            } => write!(f, "create {id} {data_size}+{metadata_size}"),
            Request::Seal { id, release, .. } => {
                write!(f, "seal {id}{}", if *release { " and release" } else { "" })
            }
            Request::Abort { id } => write!(f, "abort {id}"),
            Request::Put { id, data, metadata } => {
                write!(f, "put {id} {}+{} inline", data.len(), metadata.len())
            }
            Request::Release { id } => write!(f, "release {id}"),
            Request::ReleaseUnanswered { id } => write!(f, "release {id} unanswered"),
            Request::Contains { id } => write!(f, "contains {id}"),
            Request::Locate { id } => write!(f, "locate {id}"),
            Request::Delete { ids } if ids.len() > 4 => write!(f, "delete {} ids", ids.len()),
            Request::Delete { ids } => write!(f, "delete [{}]", IdList(ids)),
            Request::Evict { bytes } => write!(f, "evict {bytes}"),
            other => f.write_str(&format!("{other:?}").to_lowercase()),
        }
    }
}

/// The results of a reply as its trace line lists them, each after the id it is for.
struct ReplySummary<'a> {
    results: &'a [Result<ObjectInfo, String>],
    ids: &'a [ObjectId],
}

impl fmt::Display for ReplySummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (result, id)) in self.results.iter().zip(self.ids).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match result {
                Ok(info) => write!(f, "{id} ok at {}", info.region)?,
                Err(e) => write!(f, "{id} {e}")?,
            }
        }
        Ok(())
    }
}

fn short_response(response: &Response) -> String {
    match response {
        Response::Listed(objects) => format!("{} objects", objects.len()),
        Response::Stats(stats) => format!("{} objects", stats.object_count),
        Response::Nodes(view) => format!("{} members", view.members.len()),
        Response::Deleted(results) => format!(
            "{:?}",
            results
                .iter()
                .map(|r| r.as_ref().map_err(short_store_error))
                .collect::<Vec<_>>()
        ),
        other => format!("{other:?}"),
    }
}
