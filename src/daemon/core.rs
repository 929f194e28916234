//! The daemon's core state: the sans-IO [`Node`] and everything its outputs go to.
//!
//! Every input (a client request, a fabric event, a directory notice, a timer) takes the one
//! lock, feeds the node, and drains its outputs before the lock is released: replies go to the
//! clients' outboxes, messages and READs to the fabric, directory requests to the directory.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use skyriver_core::client_protocol::{
    encode_frame, ClusterView, MemberView, Request, RequestFrame, Response, ServerFrame,
};
use skyriver_core::directory::{DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::node::{Node, NodeOutput};
use skyriver_core::{wire, ArenaId, ClientId, Instant, NodeId, RequestId, StoreError, StoreOutput};
use skyriver_transport::directory::{Directory, MemberInfo};
use skyriver_transport::fabric::Fabric;
use skyriver_transport::SharedArena;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Directory ops the driver makes itself (for `locate`) have this bit set, so their replies are
/// never confused with the node's.
const DRIVER_OP_BIT: u64 = 1 << 63;

/// The node and the routes of its outputs, under the daemon's lock.
pub(super) struct CoreState {
    pub(super) node: Node,
    pub(super) outboxes: BTreeMap<ClientId, mpsc::UnboundedSender<Vec<u8>>>,
    pub(super) next_client: u64,
    pub(super) arenas: BTreeMap<ArenaId, Arc<SharedArena>>,
    pub(super) fabric: Option<Arc<dyn Fabric>>,
    pub(super) directory: Option<Arc<dyn Directory>>,
    /// Live members as the directory last listed them.
    pub(super) members: Vec<MemberInfo>,
    /// What each connection negotiated, for `skyriver nodes`.
    pub(super) links: BTreeMap<NodeId, String>,
    pub(super) directory_healthy: bool,
    /// `locate` requests waiting for the directory.
    locates: BTreeMap<DirectoryOpId, (ClientId, RequestId)>,
    next_driver_op: u64,
    /// Directory replies made up locally when the daemon runs without a directory.
    standalone_replies: VecDeque<(DirectoryOpId, DirectoryReply)>,
    /// Persistent mode: the backing files, committed before any output is carried out.
    pub(super) persistence: Option<crate::persistence::Persistence>,
}

impl CoreState {
    pub(super) fn new(node: Node, arenas: BTreeMap<ArenaId, Arc<SharedArena>>) -> Self {
        Self {
            node,
            outboxes: BTreeMap::new(),
            next_client: 1,
            arenas,
            fabric: None,
            directory: None,
            members: Vec::new(),
            links: BTreeMap::new(),
            directory_healthy: true,
            locates: BTreeMap::new(),
            next_driver_op: 0,
            standalone_replies: VecDeque::new(),
            persistence: None,
        }
    }

    fn send(&self, client: ClientId, frame: &ServerFrame) {
        if let Some(outbox) = self.outboxes.get(&client) {
            let mut bytes = Vec::new();
            encode_frame(frame, &mut bytes);
            // A closed outbox means the connection is going away; its cleanup follows.
            let _ = outbox.send(bytes);
        }
    }

    pub(super) fn reply(&self, client: ClientId, request: RequestId, response: Response) {
        self.send(client, &ServerFrame::Reply { request, response });
    }

    /// Whether a directory op id is one of the driver's own.
    pub(super) fn is_driver_op(op: DirectoryOpId) -> bool {
        op.0 & DRIVER_OP_BIT != 0
    }

    /// Routes the answer to a driver-made directory op.
    pub(super) fn driver_op_answered(&mut self, op: DirectoryOpId, reply: DirectoryReply) {
        let Some((client, request)) = self.locates.remove(&op) else {
            return;
        };
        let response = match reply {
            DirectoryReply::Located { holders, sizes } => Response::Located {
                holders,
                sizes: sizes.map(|s| (s.data_size, s.metadata_size)),
            },
            DirectoryReply::Done => Response::Located {
                holders: Vec::new(),
                sizes: None,
            },
            DirectoryReply::Unavailable { reason } => Response::Error(StoreError::BadRequest(
                format!("the directory is unavailable: {reason}"),
            )),
        };
        self.reply(client, request, response);
    }

    /// Carries out every output the node queued, until it has nothing more to say.
    pub(super) fn drain(&mut self, now: Instant) {
        loop {
            if let Some(persistence) = &self.persistence {
                // Seals durable before their replies; removals before their space is reused.
                persistence.commit_or_abort(self.node.store_mut(now));
            }
            while let Some(output) = self.node.poll_output() {
                self.carry_out(output);
            }
            // Timers already due (the node sets some for "right after these outputs") fire
            // here at once, not a round later through the runtime's millisecond timer wheel.
            if let Some((op, reply)) = self.standalone_replies.pop_front() {
                self.node.handle_directory_reply(now, op, reply);
            } else if self.node.poll_timeout().is_some_and(|due| due <= now) {
                self.node.handle_timeout(now);
            } else {
                break;
            }
        }
    }

    fn carry_out(&mut self, output: NodeOutput) {
        match output {
            NodeOutput::Store(StoreOutput::GetReply {
                client,
                request,
                results,
            }) => self.reply(client, request, Response::Got(results)),
            NodeOutput::Store(StoreOutput::Notify { client, event }) => {
                self.send(client, &ServerFrame::Event(event))
            }
            NodeOutput::Store(StoreOutput::Local(event)) => debug!(?event, "store event"),
            NodeOutput::FetchReply {
                client,
                request,
                results,
            } => self.reply(client, request, Response::Fetched(results)),
            NodeOutput::Send { peer, message } => {
                if let Some(fabric) = &self.fabric {
                    if let Err(error) = fabric.send(peer, wire::to_bytes(&message)) {
                        // The fabric reports the lost connection as an event of its own.
                        debug!(%peer, %error, "send failed");
                    }
                }
            }
            NodeOutput::SendEager {
                peer,
                header,
                source,
                object,
            } => {
                if let Some(fabric) = &self.fabric {
                    if let Err(error) = fabric.send_eager(peer, &header, source) {
                        debug!(%peer, %object, %error, "eager send failed");
                    }
                }
            }
            NodeOutput::PostRead {
                peer,
                op,
                lane,
                local,
                remote,
                object: _,
            } => match &self.fabric {
                Some(fabric) => fabric.post_read(peer, op, lane, local, remote),
                None => warn!(%peer, "a READ without a fabric: the node has no peers"),
            },
            NodeOutput::WriteLocal {
                region,
                bytes,
                object,
            } => {
                let written = self
                    .arenas
                    .get(&region.arena)
                    .map(|arena| arena.write(region.offset, &bytes));
                if !matches!(written, Some(Ok(()))) {
                    // The core only names regions it allocated; this is a bug, not bad input.
                    warn!(%object, %region, "eager write outside the arenas");
                }
            }
            NodeOutput::ExposeRegion { region, .. } => {
                if let Some(fabric) = &self.fabric {
                    fabric.expose(region);
                }
            }
            NodeOutput::UnexposeRegion { region, .. } => {
                if let Some(fabric) = &self.fabric {
                    fabric.unexpose(region);
                }
            }
            NodeOutput::Directory { op, request } => match &self.directory {
                Some(directory) => directory.submit(op, request),
                None => {
                    if let Some(reply) = standalone_answer(&request) {
                        self.standalone_replies.push_back((op, reply));
                    }
                }
            },
        }
    }

    /// Handles one client request.
    pub(super) fn handle_request(&mut self, now: Instant, client: ClientId, frame: RequestFrame) {
        let RequestFrame { request, body } = frame;
        if let Err(error) = body.validate() {
            self.reply(client, request, Response::Error(error));
            return;
        }
        let response = match body {
            Request::Hello { .. } => Some(Response::Error(StoreError::BadRequest(
                "Hello was already received on this connection".into(),
            ))),
            Request::Create {
                id,
                data_size,
                metadata_size,
            } => Some(Response::Created(self.node.store_mut(now).create(
                now,
                client,
                id,
                data_size,
                metadata_size,
            ))),
            Request::Seal { id, release } => Some(Response::Done(
                self.node
                    .store_mut(now)
                    .seal(client, id, release)
                    .map(|_| ()),
            )),
            Request::Abort { id } => {
                Some(Response::Done(self.node.store_mut(now).abort(client, id)))
            }
            Request::Get { ids, timeout_ms } => {
                self.node.store_mut(now).get(
                    now,
                    client,
                    request,
                    ids,
                    Request::timeout(timeout_ms),
                );
                None
            }
            Request::Release { id } => {
                Some(Response::Done(self.node.store_mut(now).release(client, id)))
            }
            Request::Contains { id } => Some(Response::Contains(self.node.store().contains(&id))),
            Request::Delete { ids } => {
                Some(Response::Deleted(self.node.store_mut(now).delete(&ids)))
            }
            Request::List => Some(Response::Listed(self.node.store().list())),
            Request::Evict { bytes } => {
                Some(Response::Evicted(self.node.store_mut(now).evict(bytes)))
            }
            Request::Subscribe => {
                self.node.store_mut(now).subscribe(client);
                Some(Response::Done(Ok(())))
            }
            Request::Stats => {
                let mut stats = self.node.store().stats();
                // The store also counts the node's own fetch client; report connections.
                stats.client_count = self.outboxes.len() as u64;
                Some(Response::Stats(stats))
            }
            Request::Fetch {
                ids,
                timeout_ms,
                mode,
                wait_for_publication,
            } => {
                let timeout = Request::timeout(timeout_ms);
                self.node.handle_fetch(
                    now,
                    client,
                    request,
                    ids,
                    timeout,
                    mode,
                    wait_for_publication,
                );
                None
            }
            Request::Nodes => Some(Response::Nodes(self.cluster_view())),
            Request::Locate { id } => self.locate(client, request, id),
        };
        if let Some(response) = response {
            self.reply(client, request, response);
        }
        self.drain(now);
    }

    fn locate(
        &mut self,
        client: ClientId,
        request: RequestId,
        id: skyriver_core::ObjectId,
    ) -> Option<Response> {
        let Some(directory) = &self.directory else {
            let info = self.node.store().sealed_info(&id);
            return Some(Response::Located {
                holders: info.iter().map(|_| self.node.id()).collect(),
                sizes: info.map(|i| (i.data_size, i.metadata_size)),
            });
        };
        self.next_driver_op += 1;
        let op = DirectoryOpId(DRIVER_OP_BIT | self.next_driver_op);
        self.locates.insert(op, (client, request));
        directory.submit(
            op,
            DirectoryRequest::Lookup {
                id,
                subscribe: false,
            },
        );
        None
    }

    pub(super) fn cluster_view(&self) -> ClusterView {
        let me = self.node.id();
        let mut members: Vec<MemberView> = self
            .members
            .iter()
            .map(|m| MemberView {
                node: m.node,
                address: m.fabric_addr.to_string(),
                fabric: m.fabric.clone(),
                connected: m.node == me || self.links.contains_key(&m.node),
                eager_threshold_bytes: self.node.eager_threshold(m.node).map(|t| t.bytes),
                link: if m.node == me {
                    "this node".into()
                } else {
                    self.links
                        .get(&m.node)
                        .cloned()
                        .unwrap_or_else(|| "not connected".into())
                },
            })
            .collect();
        if members.is_empty() {
            members.push(MemberView {
                node: me,
                address: self
                    .fabric
                    .as_ref()
                    .map_or_else(|| "-".into(), |f| f.listen_addr().to_string()),
                fabric: self.fabric.as_ref().map_or("none", |f| f.name()).into(),
                connected: true,
                eager_threshold_bytes: None,
                link: "this node".into(),
            });
        }
        members.sort_by_key(|m| m.node);
        ClusterView {
            node: me,
            fabric: self.fabric.as_ref().map_or("none", |f| f.name()).into(),
            directory: self
                .directory
                .as_ref()
                .map_or_else(|| "none (standalone)".into(), |d| d.describe()),
            directory_healthy: self.directory_healthy,
            eager_capacity_bytes: self.node.config().eager_capacity_bytes(),
            members,
        }
    }
}

/// What a directory that knows only this node would answer: the daemon runs alone.
fn standalone_answer(request: &DirectoryRequest) -> Option<DirectoryReply> {
    match request {
        DirectoryRequest::Lookup { .. } => Some(DirectoryReply::Located {
            holders: Vec::new(),
            sizes: None,
        }),
        DirectoryRequest::Publish { .. } | DirectoryRequest::Withdraw { .. } => {
            Some(DirectoryReply::Done)
        }
        DirectoryRequest::Unsubscribe { .. } => None,
    }
}
