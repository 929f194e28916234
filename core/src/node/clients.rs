//! Local clients: every request a client sends over the daemon's socket is an input of the node
//! ([`NodeInput::ClientRequest`](super::NodeInput::ClientRequest)) and every answer an output ([`NodeOutput::Reply`]), so the
//! simulator runs exactly what the daemon runs: the `Hello` rules, validation, store calls,
//! `Locate` through the directory, and durability.
//!
//! **Durability.** With [`StoreConfig::record_durable_changes`](crate::StoreConfig) the node
//! emits one [`NodeOutput::Persist`] per seal and per removal of a sealed object, numbered
//! from 1. The driver makes them durable in order (on another thread, say) and reports how far
//! it got with [`NodeInput::Persisted`](super::NodeInput::Persisted). Until then:
//! * the reply to a request that removed a recorded object (delete, eviction) waits in both
//!   modes, so a deleted object never comes back after a crash; the reply to any other
//!   request that caused a change (a seal) waits when
//!   [`NodeConfig::hold_replies_until_durable`] (`--durability seal`);
//! * the block of a removed object stays out of the allocator (removal before reuse), and a
//!   `create` that needs that space waits for it rather than fail or evict more.

use std::collections::{BTreeMap, VecDeque};

use super::fetch::FetchOptions;
use super::{DirectoryPurpose, Node, NodeOutput, Timer};
use crate::client_protocol::{
    ArenaInfo, ClusterView, MemberView, Request, RequestFrame, Response, PROTOCOL_VERSION,
};
use crate::digest::ContentDigest;
use crate::directory::{DirectoryOpId, DirectoryReply, DirectoryRequest};
use crate::error::StoreError;
use crate::ids::{ClientId, NodeId, ObjectId, RequestId};
use crate::shared_list::SharedList;
use crate::store::ObjectInfo;
use crate::time::Instant;

/// Most `create`s waiting at once for space whose removal is not durable yet; more fail with
/// `OutOfMemory` at once.
pub const MAX_PARKED_CREATES: usize = 4096;

/// A live node of the cluster as the directory lists it, for `nodes` replies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterMember {
    /// The node.
    pub node: NodeId,
    /// Which start of its daemon.
    pub incarnation: u32,
    /// Where its fabric accepts connections.
    pub address: std::net::SocketAddr,
    /// Which fabric it runs.
    pub fabric: String,
    /// Its failure domain (empty: none given).
    #[serde(default)]
    pub failure_domain: String,
}

impl From<&crate::directory::MemberInfo> for ClusterMember {
    fn from(member: &crate::directory::MemberInfo) -> Self {
        ClusterMember {
            node: member.node,
            incarnation: member.incarnation,
            address: member.fabric_addr,
            fabric: member.fabric.clone(),
            failure_domain: member.failure_domain.clone(),
        }
    }
}

/// One connected local client.
#[derive(Debug, Default)]
pub(super) struct ClientSession {
    /// `Hello` was answered: other requests are served.
    welcomed: bool,
    /// The first failure of an unanswered release since the last `Flush`.
    release_failure: Option<StoreError>,
}

/// What the node knows of its cluster, for `nodes` replies.
#[derive(Debug, Default)]
pub(super) struct ClusterInfo {
    members: SharedList<ClusterMember>,
    directory_problem: Option<String>,
}

/// A `create` (or a small `put`) waiting for quarantined space.
#[derive(Debug)]
pub(super) struct ParkedCreate {
    client: ClientId,
    request: RequestId,
    id: ObjectId,
    data_size: u64,
    metadata_size: u64,
    /// A put's data and metadata, written and sealed once the object is created.
    inline: Option<(Vec<u8>, Vec<u8>)>,
}

/// Client bookkeeping of a node.
#[derive(Debug, Default)]
pub(super) struct Clients {
    pub(super) sessions: BTreeMap<ClientId, ClientSession>,
    /// Replies waiting for a durable change: (sequence number needed, reply).
    held: VecDeque<(u64, NodeOutput)>,
    parked_creates: VecDeque<ParkedCreate>,
    /// An empty queue whose allocation the next retry of the parked creates parks them in
    /// again: a retry runs after every durable change, and while creates wait for space it
    /// would otherwise grow a new queue from nothing each time.
    spare_parked: VecDeque<ParkedCreate>,
    /// Puts whose bytes are being written, sealed by [`Timer::SealPut`]: their objects and
    /// digests.
    sealing_puts: BTreeMap<(ClientId, RequestId), (ObjectId, ContentDigest)>,
    /// Durable changes emitted so far (the last one's sequence number).
    pub(super) persist_emitted: u64,
    /// Durable changes the driver reported done.
    pub(super) persisted: u64,
    /// Number of the last durable change that was a removal.
    pub(super) last_removal: u64,
    pub(super) cluster: ClusterInfo,
}

impl Node {
    /// A local client connected. Its first request must be `Hello`.
    pub(super) fn handle_client_connected(&mut self, now: Instant, client: ClientId) {
        self.advance(now);
        self.clients
            .sessions
            .insert(client, ClientSession::default());
        self.store.connect(client);
    }

    /// A local client disconnected: its fetches are dropped, its references released and its
    /// unsealed objects aborted.
    pub(super) fn handle_client_disconnected(&mut self, now: Instant, client: ClientId) {
        self.advance(now);
        self.clients.sessions.remove(&client);
        self.clients.parked_creates.retain(|c| c.client != client);
        self.clients.sealing_puts.retain(|&(c, _), _| c != client);
        self.clients.held.retain(
            |(_, output)| !matches!(output, NodeOutput::Reply { client: c, .. } if *c == client),
        );
        self.client_gone(client);
        self.drop_deferred_of(client);
        self.drop_pending_seals_of(client);
        self.replica_waits_gone(client);
        self.store.disconnect(client);
        self.absorb_store();
    }

    /// Local clients connected now.
    pub fn client_count(&self) -> usize {
        self.clients.sessions.len()
    }

    /// One request of a local client. Every request gets exactly one [`NodeOutput::Reply`]
    /// (`get` and `fetch` when they complete), except `ReleaseUnanswered`, which gets none; a
    /// request before `Hello`, or a `Hello` of another protocol version, also closes the
    /// connection ([`NodeOutput::CloseClient`]).
    pub(super) fn handle_client_request(
        &mut self,
        now: Instant,
        client: ClientId,
        frame: RequestFrame,
    ) {
        self.advance(now);
        let RequestFrame { request, body } = frame;
        let Some(session) = self.clients.sessions.get_mut(&client) else {
            // The driver reports a connection before its requests; a request of a client that
            // is gone has nobody to answer.
            return;
        };
        if !session.welcomed {
            self.greet(client, request, body);
            return;
        }
        let Some(body) = self.defer_until_persisted(client, request, body) else {
            return; // held back until the disk catches up (see `backpressure`), or refused
        };
        self.serve_welcomed(client, request, body);
    }

    /// A request of a welcomed client, now: validated, served, answered (at once or later).
    pub(super) fn serve_welcomed(&mut self, client: ClientId, request: RequestId, body: Request) {
        if let Err(error) = body.validate() {
            self.reply(client, request, Response::Error(error));
            return;
        }
        let durable_before = self.store.durable_changes_queued();
        let response = self.serve(client, request, body);
        self.absorb_store();
        if let Some(response) = response {
            self.reply_once_durable(client, request, response, durable_before);
        }
    }

    /// Replies now, or once the durable changes made since `durable_before` are durable when
    /// the reply must wait for them.
    pub(super) fn reply_once_durable(
        &mut self,
        client: ClientId,
        request: RequestId,
        response: Response,
        durable_before: u64,
    ) {
        let Some(response) = self.hold_for_replicas(client, request, response, durable_before)
        else {
            return;
        };
        self.reply_when_durable(client, request, response, durable_before);
    }

    /// Sends a reply now, or holds it until the durable changes queued since `durable_before`
    /// are durable (when the node's rules ask for it): the part of
    /// [`Node::reply_once_durable`] after a put's wait for its copies.
    pub(super) fn reply_when_durable(
        &mut self,
        client: ClientId,
        request: RequestId,
        response: Response,
        durable_before: u64,
    ) {
        let needed = self.store.durable_changes_queued();
        // A removal is durable before its reply in both modes (a deleted object never
        // comes back); a seal only with `hold_replies_until_durable`.
        let must_wait =
            self.config.hold_replies_until_durable || self.clients.last_removal > durable_before;
        if must_wait && needed > durable_before && needed > self.clients.persisted {
            self.clients.held.push_back((
                needed,
                NodeOutput::Reply {
                    client,
                    request,
                    response,
                },
            ));
        } else {
            self.reply(client, request, response);
        }
    }

    /// Every [`NodeOutput::Persist`] up to sequence number `upto` is durable: replies that
    /// waited for them go out, and space of removed objects up to there is free again.
    pub(super) fn handle_persisted(&mut self, now: Instant, upto: u64) {
        self.advance(now);
        debug_assert!(
            upto <= self.clients.persist_emitted,
            "persisted ahead of emitted"
        );
        self.clients.persisted = self.clients.persisted.max(upto);
        self.store.handle_durable(upto);
        while let Some((needed, _)) = self.clients.held.front() {
            if *needed > upto {
                break;
            }
            let (_, output) = self.clients.held.pop_front().expect("looked at the front");
            self.push(output);
        }
        self.retry_parked_creates();
        self.pump_admission();
        self.absorb_store();
        self.serve_deferred();
    }

    /// The directory's list of live members changed: dials the lower ones not connected (see
    /// `links`).
    pub(super) fn handle_directory_members(
        &mut self,
        now: Instant,
        members: SharedList<ClusterMember>,
    ) {
        self.advance(now);
        let members = self.links_members(members);
        self.clients.cluster.members = members;
    }

    /// The directory became reachable (`Ok`) or not (`Err` with why).
    pub(super) fn handle_directory_health(&mut self, now: Instant, health: Result<(), String>) {
        self.advance(now);
        let healthy = health.is_ok();
        self.clients.cluster.directory_problem = health.err();
        if healthy {
            self.publish_unvouched_again();
            self.publish_copies_of_record_again();
        }
    }

    /// How the connection to `peer` is set up (fabric, lanes, MTU…), for `nodes` replies.
    pub(super) fn handle_peer_link(&mut self, now: Instant, peer: NodeId, link: super::PeerLink) {
        self.advance(now);
        self.links_negotiated(peer, link);
    }

    /// Whether the directory answers (as last reported).
    pub fn directory_healthy(&self) -> bool {
        self.clients.cluster.directory_problem.is_none()
    }

    /// Replies held until their durable changes are, and creates waiting for space.
    pub(super) fn pending_client_work(&self, lines: &mut Vec<String>) {
        self.pending_deferred_work(lines);
        for (needed, output) in &self.clients.held {
            lines.push(format!(
                "reply {output:?} waits for durable change {needed} (durable: {})",
                self.clients.persisted
            ));
        }
        for parked in &self.clients.parked_creates {
            lines.push(format!(
                "create of {} for {} {} waits for {} of removed or spilling objects to be freed",
                parked.id,
                parked.client,
                parked.request,
                crate::error::Bytes(self.store.pending_free_bytes())
            ));
        }
    }

    fn greet(&mut self, client: ClientId, request: RequestId, body: Request) {
        let refusal = match body {
            Request::Hello {
                protocol_version, ..
            } if protocol_version == PROTOCOL_VERSION => None,
            Request::Hello {
                protocol_version, ..
            } => Some(format!(
                "protocol version {protocol_version} is not supported; this daemon speaks \
                 {PROTOCOL_VERSION} (use a client of the same release)"
            )),
            _ => Some("the first request must be Hello".to_string()),
        };
        if let Some(reason) = refusal {
            self.reply(
                client,
                request,
                Response::Error(StoreError::BadRequest(reason.clone())),
            );
            self.push(NodeOutput::CloseClient { client, reason });
            return;
        }
        if let Some(session) = self.clients.sessions.get_mut(&client) {
            session.welcomed = true;
        }
        let arenas = self
            .config
            .store
            .arenas
            .iter()
            .map(|&(id, size_bytes)| ArenaInfo { id, size_bytes })
            .collect();
        self.reply(
            client,
            request,
            Response::Welcome {
                protocol_version: PROTOCOL_VERSION,
                node: self.config.node,
                arenas,
            },
        );
    }

    /// Serves a validated request; `None` when the reply comes later.
    fn serve(&mut self, client: ClientId, request: RequestId, body: Request) -> Option<Response> {
        let now = self.now;
        Some(match body {
            Request::Hello { .. } => Response::Error(StoreError::BadRequest(
                "Hello was already received on this connection".into(),
            )),
            Request::Create {
                id,
                data_size,
                metadata_size,
            } => match self.store.create(now, client, id, data_size, metadata_size) {
                Err(StoreError::OutOfMemory { .. })
                    if self.store.pending_free_bytes() > 0
                        && self.clients.parked_creates.len() < MAX_PARKED_CREATES =>
                {
                    self.clients.parked_creates.push_back(ParkedCreate {
                        client,
                        request,
                        id,
                        data_size,
                        metadata_size,
                        inline: None,
                    });
                    return None;
                }
                result => Response::Created(result),
            },
            Request::Put { id, data, metadata } => {
                // The daemon's `--replicas`, as for every put that names no count.
                self.plain_put(client, request, id, false);
                return self.put_inline(client, request, id, data, metadata);
            }
            Request::Seal {
                id,
                release,
                digest,
            } => {
                self.plain_put(client, request, id, true);
                return self.seal_request(client, request, id, release, digest);
            }
            Request::Abort { id } => {
                let result = self.store.abort(client, id);
                if result.is_ok() {
                    self.drop_pending_seal(id);
                }
                Response::Done(result)
            }
            Request::Get { ids, timeout_ms } => {
                if let Some(refusal) = self.refuse_waiting_get(&ids, timeout_ms) {
                    return Some(Response::Error(refusal));
                }
                self.store.count_requests(ids.len() as u64, 0);
                self.store
                    .get(now, client, request, ids, Request::timeout(timeout_ms));
                return None;
            }
            Request::Release { id } => Response::Done(self.store.release(client, id)),
            Request::ReleaseUnanswered { id } => {
                if let Err(error) = self.store.release(client, id) {
                    self.stats.unanswered_release_failures += 1;
                    if let Some(session) = self.clients.sessions.get_mut(&client) {
                        session.release_failure.get_or_insert(error);
                    }
                }
                return None;
            }
            Request::Flush => Response::Done(
                self.clients
                    .sessions
                    .get_mut(&client)
                    .and_then(|session| session.release_failure.take())
                    .map_or(Ok(()), Err),
            ),
            Request::Contains { id } => Response::Contains(self.store.contains(&id)),
            Request::Delete { ids } => {
                self.store.count_requests(0, ids.len() as u64);
                self.delete_replicas(&ids);
                Response::Deleted(self.store.delete(&ids))
            }
            Request::List => Response::Listed(self.store.list()),
            Request::Evict { bytes } => Response::Evicted(self.store.evict(bytes)),
            Request::Subscribe => {
                self.store.subscribe(client);
                Response::Done(Ok(()))
            }
            Request::Stats => {
                let mut stats = self.store.stats();
                // The store also counts the node's own fetch client; report connections.
                stats.client_count = self.clients.sessions.len() as u64;
                Response::Stats(stats)
            }
            Request::Metrics => Response::Metrics(Box::new(self.metrics())),
            Request::Fetch {
                ids,
                timeout_ms,
                mode,
                wait_for_publication,
            } => {
                let timeout = Request::timeout(timeout_ms);
                let options = FetchOptions {
                    mode,
                    wait_for_publication,
                    hint: None,
                };
                self.start_fetch(client, request, ids, timeout, options);
                return None;
            }
            Request::FetchFrom {
                ids,
                timeout_ms,
                mode,
                wait_for_publication,
                hint,
            } => {
                let timeout = Request::timeout(timeout_ms);
                let options = FetchOptions {
                    mode,
                    wait_for_publication,
                    hint: Some(hint),
                };
                self.start_fetch(client, request, ids, timeout, options);
                return None;
            }
            Request::Nodes => Response::Nodes(self.cluster_view()),
            Request::Locate { id } => return self.locate(client, request, id),
            Request::Trace { record } => {
                self.push(NodeOutput::Trace {
                    client,
                    request,
                    record,
                });
                return None;
            }
            Request::PutReplicated {
                id,
                data,
                metadata,
                replicas,
            } => {
                if self.would_store(client, id, false) {
                    self.replicated_put(client, request, id, replicas);
                }
                // Its reply, now or after the seal, goes through `hold_for_replicas`.
                return self.put_inline(client, request, id, data, metadata);
            }
            Request::SealReplicated {
                id,
                release,
                digest,
                replicas,
            } => {
                if self.would_store(client, id, true) {
                    self.replicated_put(client, request, id, replicas);
                }
                return self.seal_request(client, request, id, release, digest);
            }
            Request::LocateCopies { id } => {
                if self.config.standalone {
                    let copies =
                        self.store
                            .sealed_info(&id)
                            .map(|_| crate::client_protocol::CopyView {
                                node: self.config.node,
                                failure_domain: String::new(),
                                of_record: false,
                            });
                    let sizes = self
                        .store
                        .sealed_info(&id)
                        .map(|i| (i.data_size, i.metadata_size));
                    return Some(Response::Copies {
                        copies: copies.into_iter().collect(),
                        wanted: None,
                        sizes,
                        // No directory, so no copies of record: every copy is a cache copy.
                        records_known: true,
                    });
                }
                self.directory(
                    DirectoryRequest::LocateCopies { id },
                    Some(DirectoryPurpose::LocateCopies(id, client, request)),
                );
                return None;
            }
        })
    }

    /// A put with its bytes inline: the object is created (or the create parked until memory
    /// frees), then filled and sealed.
    fn put_inline(
        &mut self,
        client: ClientId,
        request: RequestId,
        id: ObjectId,
        data: Vec<u8>,
        metadata: Vec<u8>,
    ) -> Option<Response> {
        let (data_size, metadata_size) = (data.len() as u64, metadata.len() as u64);
        match self
            .store
            .create(self.now, client, id, data_size, metadata_size)
        {
            Err(StoreError::OutOfMemory { .. })
                if self.store.pending_free_bytes() > 0
                    && self.clients.parked_creates.len() < MAX_PARKED_CREATES =>
            {
                self.clients.parked_creates.push_back(ParkedCreate {
                    client,
                    request,
                    id,
                    data_size,
                    metadata_size,
                    inline: Some((data, metadata)),
                });
                None
            }
            Err(error) => Some(Response::Done(Err(error))),
            Ok(info) => {
                self.fill_then_seal(client, request, info, data, metadata);
                None
            }
        }
    }

    /// A put's object was created: its bytes are written (outputs the driver carries out
    /// before the next input), and it is sealed right after them, the creator's reference
    /// dropped, by [`Timer::SealPut`]. Until then it is an unsealed object its creator holds:
    /// nothing evicts it or hands its space to another object while the bytes are on their way.
    fn fill_then_seal(
        &mut self,
        client: ClientId,
        request: RequestId,
        info: ObjectInfo,
        data: Vec<u8>,
        metadata: Vec<u8>,
    ) {
        let (data_size, metadata_size) = (data.len() as u64, metadata.len() as u64);
        debug_assert_eq!(info.region.len, data_size + metadata_size);
        let digest = ContentDigest::of(&data, &metadata);
        for (start, bytes) in [(0, data), (data_size, metadata)] {
            if !bytes.is_empty() {
                self.push(NodeOutput::WriteInline {
                    region: info.region.slice(start, bytes.len() as u64),
                    bytes,
                    object: info.id,
                });
            }
        }
        self.clients
            .sealing_puts
            .insert((client, request), (info.id, digest));
        self.set_timer(self.now, Timer::SealPut(client, request));
    }

    /// A put's bytes are in place: seal its object and answer the put.
    pub(super) fn seal_put(&mut self, client: ClientId, request: RequestId) {
        let Some((id, digest)) = self.clients.sealing_puts.remove(&(client, request)) else {
            return; // the client left; its unsealed object was aborted
        };
        let durable_before = self.store.durable_changes_queued();
        // The reply first, then what the seal causes (its publication, waiting gets).
        if let Some(response) = self.seal_request(client, request, id, true, digest) {
            self.reply_once_durable(client, request, response, durable_before);
        }
        self.absorb_store();
    }

    fn locate(&mut self, client: ClientId, request: RequestId, id: ObjectId) -> Option<Response> {
        if self.config.standalone {
            let sizes = self
                .store
                .sealed_info(&id)
                .map(|i| (i.data_size, i.metadata_size))
                .or_else(|| self.store.spilled_sizes(&id).map(|(d, m, _)| (d, m)));
            return Some(Response::Located {
                holders: sizes.iter().map(|_| self.config.node).collect(),
                sizes,
                digest: self.store.digest(&id),
            });
        }
        self.directory(
            DirectoryRequest::Lookup {
                id,
                subscribe: false,
            },
            Some(DirectoryPurpose::Locate(client, request)),
        );
        None
    }

    /// The directory answered (or did not answer in time) a `locate`.
    pub(super) fn locate_answered(
        &mut self,
        client: ClientId,
        request: RequestId,
        op: DirectoryOpId,
        reply: DirectoryReply,
    ) {
        self.cancel_timer(Timer::DirectoryOp(op));
        if !self.clients.sessions.contains_key(&client) {
            return;
        }
        let response = match reply {
            DirectoryReply::Located {
                holders,
                sizes,
                digest,
            }
            | DirectoryReply::CopiesLocated {
                holders,
                sizes,
                digest,
                ..
            } => Response::Located {
                holders,
                sizes: sizes.map(|s| (s.data_size, s.metadata_size)),
                digest,
            },
            DirectoryReply::Done | DirectoryReply::Conflict { .. } => Response::Located {
                holders: Vec::new(),
                sizes: None,
                digest: None,
            },
            DirectoryReply::Unavailable { reason } => {
                Response::Error(StoreError::DirectoryUnavailable(reason))
            }
        };
        self.reply(client, request, response);
    }

    /// The live members, as the directory last listed them.
    pub(super) fn cluster_members(&self) -> &[ClusterMember] {
        &self.clients.cluster.members
    }

    fn cluster_view(&self) -> ClusterView {
        let me = self.config.node;
        let cluster = &self.clients.cluster;
        let mut members: Vec<MemberView> = cluster
            .members
            .iter()
            .map(|m| MemberView {
                node: m.node,
                address: m.address.to_string(),
                fabric: m.fabric.clone(),
                connected: m.node == me || self.peers.get(&m.node).is_some_and(|p| p.connected),
                eager_threshold_bytes: self.eager_threshold(m.node).map(|t| t.bytes),
                link: if m.node == me {
                    "this node".into()
                } else {
                    self.describe_link(m.node)
                },
                failure_domain: m.failure_domain.clone(),
            })
            .collect();
        if !members.iter().any(|m| m.node == me) {
            members.push(MemberView {
                node: me,
                address: self.config.fabric_address.clone(),
                fabric: self.config.fabric_name.clone(),
                connected: true,
                eager_threshold_bytes: None,
                link: "this node".into(),
                failure_domain: String::new(),
            });
        }
        members.sort_by_key(|m| m.node);
        ClusterView {
            node: me,
            fabric: self.config.fabric_name.clone(),
            directory: self.config.directory_name.clone(),
            directory_healthy: self.directory_healthy(),
            eager_capacity_bytes: self.config.eager_capacity_bytes(),
            members,
        }
    }

    pub(super) fn retry_parked_creates(&mut self) {
        if self.clients.parked_creates.is_empty() {
            return;
        }
        let spare = std::mem::take(&mut self.clients.spare_parked);
        let mut parked = std::mem::replace(&mut self.clients.parked_creates, spare);
        for mut create in parked.drain(..) {
            let result = self.store.create(
                self.now,
                create.client,
                create.id,
                create.data_size,
                create.metadata_size,
            );
            match result {
                Err(StoreError::OutOfMemory { .. }) if self.store.pending_free_bytes() > 0 => {
                    self.clients.parked_creates.push_back(create)
                }
                result => match (create.inline.take(), result) {
                    (None, result) => {
                        self.reply(create.client, create.request, Response::Created(result))
                    }
                    (Some((data, metadata)), Ok(info)) => {
                        self.fill_then_seal(create.client, create.request, info, data, metadata)
                    }
                    (Some(_), Err(error)) => {
                        self.reply(create.client, create.request, Response::Done(Err(error)))
                    }
                },
            }
        }
        self.clients.spare_parked = parked;
    }

    pub(super) fn reply(&mut self, client: ClientId, request: RequestId, response: Response) {
        if client == super::FETCH_CLIENT {
            // The node's own fetch of a copy placed here.
            self.replication_fetched(request, response);
            return;
        }
        // A put's reply that did not pass `reply_once_durable` (refused at its seal, or by a
        // parked create) still ends its wait for copies.
        let durable_before = self.store.durable_changes_queued();
        let Some(response) = self.hold_for_replicas(client, request, response, durable_before)
        else {
            return;
        };
        self.push(NodeOutput::Reply {
            client,
            request,
            response,
        });
    }
}
