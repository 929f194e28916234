//! Where the node's outputs go in the daemon: the [`NodeDriver`] of the event loop. Replies
//! and events are written to the clients' sockets, messages and READs handed to the fabric,
//! directory requests to the directory, durable changes to the committer thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use skyriver_core::client_protocol::{encode_frame, Response, ServerFrame, TraceStamp};
use skyriver_core::directory::{DirectoryOpId, DirectoryRequest};
use skyriver_core::node::{GrantError, NodeDriver, ReadGrant, ReadOpId};
use skyriver_core::wire::{self, EagerHeader, InputBytes, PeerMessage};
use skyriver_core::{
    ArenaId, ClientId, ContentDigest, DurableChange, LocalRegion, NodeId, ObjectEvent, ObjectId,
    RemoteRegion, RequestId, TransferId,
};
use skyriver_transport::directory::{Directory, SubmitRefused};
use skyriver_transport::fabric::{EventsFull, Fabric, MessageBytes};
use skyriver_transport::{trace, ReadableRegion, SharedArena};
use tracing::{debug, debug_span, warn, Level};

use super::connection::{ClientReader, ClientWriter, WriteError};
use super::verification::CopyHashers;
use crate::persistence::CommitQueue;

/// One connected client, as the loop holds it.
pub(super) struct ClientLink {
    pub(super) writer: ClientWriter,
    pub(super) reader: ClientReader,
    /// Frames for this client not written yet: the loop writes them in one go once it has
    /// handled every input that is ready (a pipelined burst of requests costs one write).
    pub(super) unsent: Vec<u8>,
}

impl ClientLink {
    pub(super) fn new(writer: ClientWriter, reader: ClientReader) -> Self {
        Self {
            writer,
            reader,
            unsent: Vec::new(),
        }
    }
}

/// Everything the node's outputs act on.
pub(super) struct Effects {
    pub(super) clients: BTreeMap<ClientId, ClientLink>,
    /// Clients closed while carrying out outputs, with why: the loop tells the node next.
    pub(super) closed: Vec<(ClientId, String)>,
    /// The fabric's answers to grants and revocations it gave at once: the loop tells the node
    /// next (the others come later as fabric events).
    pub(super) access_answers: Vec<AccessAnswer>,
    /// What fetched copies hash to (`verify_content`): the loop tells the node next.
    pub(super) content_hashes: Vec<(TransferId, ContentDigest)>,
    /// Directory requests the client did not queue (its queue is full): the loop answers
    /// them `Unavailable` next, so a slow directory is a refusal, never a wait.
    pub(super) directory_refusals: Vec<(DirectoryOpId, SubmitRefused)>,
    /// READs the fabric did not post (its event channel had no place for their completion):
    /// the loop tells the node they failed next, so a busy fabric is a refusal, never a wait.
    pub(super) read_refusals: Vec<(ReadOpId, EventsFull)>,
    /// Copies hashed ahead while their last bytes are read.
    copy_hashers: CopyHashers,
    pub(super) arenas: BTreeMap<ArenaId, Arc<SharedArena>>,
    pub(super) fabric: Option<Arc<dyn Fabric>>,
    pub(super) directory: Option<Arc<dyn Directory>>,
    pub(super) commits: Option<CommitQueue>,
    /// The spill tier's IO threads (`--spill-dir`).
    pub(super) spill_io: Option<crate::spill::SpillIo>,
    /// The peer message being handled: an eager chunk is copied from it into the object,
    /// straight from the receive slot it arrived in.
    pub(super) input: Option<MessageBytes>,
    /// Reused for encoding the Welcome frames and replies written at once.
    frame: Vec<u8>,
    /// Replies wait in `unsent` for [`Effects::flush`] (the loop is handling a pipelined burst
    /// of one client's requests); otherwise a reply to a connection with nothing queued is
    /// written to its socket at once.
    pub(super) batch_replies: bool,
    /// A fetch's reply waits in `unsent` (its write is stamped for `bench breakdown`).
    fetch_reply_unsent: bool,
    /// Clients with unsent frames, in the order they got their first.
    unsent: Vec<ClientId>,
    /// This node, for fetch ids in log lines.
    node: NodeId,
    /// Objects being fetched, with their transfer (only while debug logging is on): the line
    /// saying the object was sealed carries the fetch's id.
    fetching: BTreeMap<ObjectId, TransferId>,
}

/// A fabric's answer about one lease's READ access, for the node.
#[derive(Debug)]
pub(super) enum AccessAnswer {
    /// `Node::handle_read_granted`.
    Granted {
        peer: NodeId,
        req: TransferId,
        result: Result<ReadGrant, GrantError>,
    },
    /// `Node::handle_read_revoked`.
    Revoked { peer: NodeId, req: TransferId },
}

/// Fetches remembered for their log lines at most (a failed fetch leaves its entry behind).
const FETCHING_KEPT: usize = 4096;

/// A reply that cannot be written closes the connection: worth a warning when the client is
/// too slow, not when it has simply left (a client may release an object and exit without
/// waiting for the answer).
fn log_write_failure(client: ClientId, error: &WriteError) {
    let gone = matches!(
        error,
        WriteError::Io(e) if matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        )
    );
    if gone {
        debug!(%client, %error, "client left before its reply");
    } else {
        warn!(%client, %error, "closing client connection");
    }
}

/// A fetch's id in log lines: the requester and its transfer id, the same on both nodes, so
/// `RUST_LOG=skyriver=debug` on two nodes follows one object across the cluster.
fn fetch_id(requester: NodeId, transfer: TransferId) -> String {
    format!("{requester}/{transfer}")
}

/// A read-only view of `region`, when it lies in one of `arenas` and nothing here writes it.
fn view(
    arenas: &BTreeMap<ArenaId, Arc<SharedArena>>,
    region: LocalRegion,
) -> Option<ReadableRegion> {
    let arena = arenas.get(&region.arena)?;
    ReadableRegion::new(arena.clone(), region.offset, region.len).ok()
}

/// Whether `frame` answers a fetch (the write `bench breakdown` follows).
fn is_fetch_reply(frame: &ServerFrame) -> bool {
    matches!(
        frame,
        ServerFrame::Reply {
            response: Response::Fetched(_),
            ..
        }
    )
}

/// A client's buffer of unsent frames is freed past this size once written.
const UNSENT_KEEP_BYTES: usize = 1 << 20;

impl Effects {
    pub(super) fn new(node: NodeId, arenas: BTreeMap<ArenaId, Arc<SharedArena>>) -> Self {
        Self {
            node,
            fetching: BTreeMap::new(),
            clients: BTreeMap::new(),
            closed: Vec::new(),
            access_answers: Vec::new(),
            directory_refusals: Vec::new(),
            read_refusals: Vec::new(),
            content_hashes: Vec::new(),
            copy_hashers: CopyHashers::default(),
            arenas,
            fabric: None,
            directory: None,
            commits: None,
            spill_io: None,
            input: None,
            frame: Vec::new(),
            batch_replies: false,
            fetch_reply_unsent: false,
            unsent: Vec::new(),
        }
    }

    /// Stops serving `client`: its reader ends, its socket closes once the replies already
    /// written have drained.
    pub(super) fn close(&mut self, client: ClientId, reason: String) {
        if let Some(link) = self.clients.remove(&client) {
            link.reader.close();
            // What was already answered (the error that explains the close, say) still goes.
            if !link.unsent.is_empty() {
                let _ = link.writer.write(&link.unsent);
            }
            link.writer.close();
            self.closed.push((client, reason));
        }
    }

    fn write_frame(&mut self, client: ClientId, frame: &ServerFrame) {
        let Some(link) = self.clients.get_mut(&client) else {
            return; // gone; the node hears of it from the loop
        };
        if let ServerFrame::Reply {
            response: Response::Welcome { .. },
            ..
        } = frame
        {
            // The arenas' fds travel with the Welcome, once per connection, at once.
            self.frame.clear();
            encode_frame(frame, &mut self.frame);
            let fds: Vec<_> = self.arenas.values().map(|arena| arena.fd()).collect();
            if let Err(error) = link.writer.write_with_fds(&self.frame, &fds) {
                self.close(client, error.to_string());
            }
            return;
        }
        let reply = matches!(frame, ServerFrame::Reply { .. });
        if reply && link.unsent.is_empty() && !self.batch_replies {
            // Nothing queued before it: straight to the socket, no wait for the loop's flush.
            // (Events, which come in bursts, e.g. a seal per recovered object, leave together
            // at the flush.)
            self.frame.clear();
            encode_frame(frame, &mut self.frame);
            if is_fetch_reply(frame) {
                trace::stamp("reply_write");
            }
            let written = link.writer.write(&self.frame);
            if let Err(error) = written {
                log_write_failure(client, &error);
                self.close(client, error.to_string());
            }
            return;
        }
        if link.unsent.is_empty() {
            self.unsent.push(client);
        }
        self.fetch_reply_unsent |= is_fetch_reply(frame);
        encode_frame(frame, &mut link.unsent);
    }

    /// Writes every client's unsent frames (one write each); closes clients that cannot take
    /// them.
    pub(super) fn flush(&mut self) {
        for client in std::mem::take(&mut self.unsent) {
            let Some(link) = self.clients.get_mut(&client) else {
                continue;
            };
            if std::mem::take(&mut self.fetch_reply_unsent) {
                trace::stamp("reply_write");
            }
            let written = link.writer.write(&link.unsent);
            link.unsent.clear();
            if link.unsent.capacity() > UNSENT_KEEP_BYTES {
                link.unsent = Vec::new();
            }
            if let Err(error) = written {
                log_write_failure(client, &error);
                self.close(client, error.to_string());
            }
        }
    }
}

impl Effects {
    /// Debug lines of a transfer's messages, in the span of its fetch id.
    fn trace_message(&mut self, peer: NodeId, message: &PeerMessage) {
        let (requester, req) = match message {
            PeerMessage::FetchRequest { req, .. }
            | PeerMessage::Finish { req }
            | PeerMessage::ExtendLease { req } => (self.node, *req),
            other => (peer, other.req()),
        };
        let span = debug_span!("fetch", id = %fetch_id(requester, req));
        let _entered = span.enter();
        match message {
            PeerMessage::FetchRequest {
                id, eager_limit, ..
            } => {
                if self.fetching.len() >= FETCHING_KEPT {
                    self.fetching.pop_first();
                }
                self.fetching.insert(*id, req);
                debug!(object = %id, holder = %peer, eager_limit, "fetch requested");
            }
            PeerMessage::Finish { .. } => debug!(holder = %peer, "reads done: lease released"),
            PeerMessage::Rendezvous {
                sizes, lease_ms, ..
            } => debug!(
                requester = %peer,
                bytes = sizes.data_size + sizes.metadata_size,
                lease_ms,
                "serving by rendezvous: object pinned, READ access granted"
            ),
            PeerMessage::ExtendLease { .. } => {
                debug!(holder = %peer, "reads not done: lease extension asked")
            }
            PeerMessage::LeaseExtended { lease_ms, .. } => {
                debug!(requester = %peer, lease_ms, "lease extended")
            }
            PeerMessage::Restoring { .. } => {
                debug!(requester = %peer, "object spilled: answering once restored")
            }
            other => debug!(requester = %peer, reply = %other, "fetch refused"),
        }
    }
}

impl NodeDriver for Effects {
    fn send(&mut self, peer: NodeId, message: PeerMessage) {
        if tracing::enabled!(Level::DEBUG) {
            self.trace_message(peer, &message);
        }
        if matches!(message, PeerMessage::FetchRequest { .. }) {
            trace::stamp("fetch_request_send");
        }
        if let Some(fabric) = &self.fabric {
            if let PeerMessage::RelayProgress { req, prefix } = message {
                // The fabric serves READs of the relayed copy below what its reader is told.
                fabric.extend_partial_read(peer, req, prefix);
            }
            if let Err(error) = fabric.send(peer, wire::to_bytes(&message)) {
                // The fabric reports the lost connection as an event of its own.
                debug!(%peer, %error, "send failed");
            }
        }
    }

    fn send_eager(
        &mut self,
        peer: NodeId,
        header: EagerHeader,
        source: LocalRegion,
        object: ObjectId,
    ) {
        if header.offset == 0 && tracing::enabled!(Level::DEBUG) {
            let span = debug_span!("fetch", id = %fetch_id(peer, header.req));
            let _entered = span.enter();
            let bytes = header.sizes.data_size + header.sizes.metadata_size;
            debug!(requester = %peer, %object, bytes, "serving eagerly");
        }
        trace::stamp("eager_send");
        if let Some(fabric) = &self.fabric {
            if let Err(error) = fabric.send_eager(peer, &header, source) {
                debug!(%peer, %object, %error, "eager send failed");
            }
        }
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
        match &self.fabric {
            Some(fabric) => {
                if let Err(full) = fabric.post_read(peer, op, lane, local, remote) {
                    self.read_refusals.push((op, full));
                }
            }
            None => warn!(%peer, "a READ without a fabric: the node has no peers"),
        }
    }

    fn write_local(&mut self, region: LocalRegion, payload: InputBytes, object: ObjectId) {
        let Some(bytes) = self
            .input
            .as_deref()
            .and_then(|input| input.get(payload.range()))
        else {
            // The core names bytes of the message it was just given; a bug, not bad input.
            warn!(%object, %region, "eager write without its input message");
            return;
        };
        let written = self
            .arenas
            .get(&region.arena)
            // The unsealed object the core created for this transfer: nothing views it here.
            .map(|arena| arena.write(region.offset, bytes));
        if !matches!(written, Some(Ok(()))) {
            // The core only names regions it allocated; this is a bug, not bad input.
            warn!(%object, %region, "eager write outside the arenas");
        }
        trace::stamp("eager_written");
    }

    fn hash_ahead(&mut self, transfer: TransferId, region: LocalRegion, object: ObjectId) {
        // Bytes of the copy the core created for this transfer that are in and final: nothing
        // else views them. Hashed now, on the loop, while the rest is being read.
        match view(&self.arenas, region) {
            Some(view) => self
                .copy_hashers
                .hash_ahead(transfer, region, view.as_slice()),
            None => debug!(%object, %region, "cannot view a fetched copy to hash it ahead"),
        }
    }

    fn verify_content(&mut self, transfer: TransferId, region: LocalRegion, object: ObjectId) {
        // The copy the core created for this transfer, every byte in: nothing else views it.
        // What was not hashed ahead is hashed here, on the loop: XXH3 runs at memory speed
        // (see README, "One id, one content").
        let arenas = &self.arenas;
        let rest = |offset: u64, len: u64| {
            let arena = region.arena;
            view(arenas, LocalRegion { arena, offset, len })
        };
        let actual = self
            .copy_hashers
            .finish(transfer, region, rest)
            .unwrap_or_else(|| {
                // The core only names regions it allocated; a bug, not bad input. A digest
                // that cannot match fails the transfer rather than sealing unverified bytes.
                warn!(%object, %region, "cannot view a fetched copy to verify it");
                ContentDigest(!0)
            });
        self.content_hashes.push((transfer, actual));
    }

    fn write_inline(&mut self, region: LocalRegion, bytes: Vec<u8>, object: ObjectId) {
        let written = self
            .arenas
            .get(&region.arena)
            // The object a put just created: no client has heard of it yet.
            .map(|arena| arena.write(region.offset, &bytes));
        if !matches!(written, Some(Ok(()))) {
            // The core only names regions it allocated; this is a bug, not bad input.
            warn!(%object, %region, "inline write outside the arenas");
        }
    }

    fn trace(&mut self, client: ClientId, request: RequestId, record: bool) {
        let stamps = trace::collect(record)
            .into_iter()
            .map(|(event, at_ns)| TraceStamp {
                event: event.to_string(),
                at_ns,
            })
            .collect();
        self.reply(client, request, Response::Traced(stamps));
    }

    fn grant_read(&mut self, peer: NodeId, req: TransferId, object: ObjectId, region: LocalRegion) {
        let result = match &self.fabric {
            Some(fabric) => match fabric.grant_read(peer, req, region) {
                Ok(Some(grant)) => Ok(grant),
                Ok(None) => return, // answered by a fabric event
                Err(error) => {
                    warn!(%peer, %object, %region, %error, "cannot grant READ access");
                    Err(GrantError::from(error))
                }
            },
            // A standalone node serves no peers; the core never asks it to.
            None => Err(GrantError::NotConnected(peer)),
        };
        self.access_answers
            .push(AccessAnswer::Granted { peer, req, result });
    }

    fn grant_partial_read(
        &mut self,
        peer: NodeId,
        req: TransferId,
        object: ObjectId,
        region: LocalRegion,
    ) {
        // Both fabrics serve a copy still being received (TCP checks each READ against the
        // announced prefix, verbs bounds READs by a window over the block); a reader refused
        // here (no window left, a lost connection) fetches from the holder.
        let result = match &self.fabric {
            Some(fabric) => match fabric.grant_partial_read(peer, req, region) {
                Ok(Some(grant)) => Ok(grant),
                Ok(None) => return, // answered by a fabric event
                Err(error) => {
                    debug!(%peer, %object, %region, %error, "cannot relay a partial copy");
                    Err(GrantError::from(error))
                }
            },
            None => Err(GrantError::NotConnected(peer)),
        };
        self.access_answers
            .push(AccessAnswer::Granted { peer, req, result });
    }

    fn revoke_read(
        &mut self,
        peer: NodeId,
        req: TransferId,
        _object: ObjectId,
        _region: LocalRegion,
    ) {
        let done = self
            .fabric
            .as_ref()
            .is_none_or(|fabric| fabric.revoke_read(peer, req));
        if done {
            self.access_answers
                .push(AccessAnswer::Revoked { peer, req });
        }
    }

    fn directory(&mut self, op: DirectoryOpId, request: DirectoryRequest) {
        match &self.directory {
            Some(directory) => {
                trace::stamp("directory_submit");
                let answered = !matches!(request, DirectoryRequest::Unsubscribe { .. });
                if let Err(refused) = directory.submit(op, request) {
                    if answered {
                        self.directory_refusals.push((op, refused));
                    }
                }
            }
            // A standalone node asks the directory nothing; a cluster node always has one.
            None => debug!(%op, %request, "no directory"),
        }
    }

    fn reply(&mut self, client: ClientId, request: RequestId, response: Response) {
        if matches!(response, Response::Fetched(_)) {
            trace::stamp("reply_queued");
        }
        self.write_frame(client, &ServerFrame::Reply { request, response });
    }

    fn event(&mut self, client: ClientId, event: ObjectEvent) {
        self.write_frame(client, &ServerFrame::Event(event));
    }

    fn close_client(&mut self, client: ClientId, reason: String) {
        warn!(%client, %reason, "closing client connection");
        self.close(client, reason);
    }

    fn persist(&mut self, seq: u64, change: DurableChange) {
        match &self.commits {
            Some(commits) => commits.submit(seq, change),
            None => warn!(seq, ?change, "a durable change without a backing file"),
        }
    }

    fn connect(&mut self, peer: NodeId, address: std::net::SocketAddr) {
        // The core dials again each interval while the connection is not up; one handshake
        // at a time is enough.
        if let Some(fabric) = &self.fabric {
            if !fabric.is_connected_or_connecting(peer) {
                fabric.connect(peer, address);
            }
        }
    }

    fn spill(
        &mut self,
        op: skyriver_core::store::SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    ) {
        let readable = view(&self.arenas, region);
        match &mut self.spill_io {
            Some(io) => io.spill(op, object, readable, digest),
            None => warn!(%op, %object, "a spill without a spill directory"),
        }
    }

    fn restore(
        &mut self,
        op: skyriver_core::store::SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    ) {
        let writable = self.arenas.get(&region.arena).and_then(|arena| {
            skyriver_transport::WritableRegion::new(arena.clone(), region.offset, region.len).ok()
        });
        match &mut self.spill_io {
            Some(io) => io.restore(op, writable, digest),
            None => warn!(%op, %object, "a restore without a spill directory"),
        }
    }

    fn discard_spilled(&mut self, op: skyriver_core::store::SpillOpId, _object: ObjectId) {
        if let Some(io) = &mut self.spill_io {
            io.discard(op);
        }
    }

    fn local(&mut self, event: ObjectEvent) {
        if matches!(event, ObjectEvent::Sealed { .. }) {
            trace::stamp("sealed");
        }
        if !tracing::enabled!(Level::DEBUG) {
            return;
        }
        let fetched = match event {
            ObjectEvent::Sealed { id, .. } => self.fetching.remove(&id),
            ObjectEvent::Deleted { .. } => None,
        };
        match fetched {
            Some(req) => {
                let span = debug_span!("fetch", id = %fetch_id(self.node, req));
                let _entered = span.enter();
                debug!(?event, "fetched object sealed");
            }
            None => debug!(?event, "store event"),
        }
    }
}

impl Drop for Effects {
    fn drop(&mut self) {
        for link in self.clients.values() {
            link.reader.close();
        }
    }
}

#[cfg(test)]
mod directory_refusal_tests {
    use skyriver_core::ObjectId;
    use skyriver_transport::directory::LeaveFuture;

    use super::*;

    /// A directory whose request queue is always full.
    struct Full;

    impl Directory for Full {
        fn submit(&self, _: DirectoryOpId, _: DirectoryRequest) -> Result<(), SubmitRefused> {
            Err(SubmitRefused::Busy { queued: 1 })
        }

        fn describe(&self) -> String {
            "full".into()
        }

        fn leave(&self) -> LeaveFuture {
            Box::pin(std::future::ready(()))
        }
    }

    /// A request the directory did not queue is kept for the loop to answer at once (it would
    /// otherwise never be answered); one that expects no reply is not.
    #[test]
    fn a_refused_directory_request_is_kept_for_an_answer() {
        let mut effects = Effects::new(NodeId(1), BTreeMap::new());
        effects.directory = Some(Arc::new(Full));
        let id = ObjectId::from_u64(1);
        NodeDriver::directory(
            &mut effects,
            DirectoryOpId(7),
            DirectoryRequest::Lookup {
                id,
                subscribe: true,
            },
        );
        NodeDriver::directory(
            &mut effects,
            DirectoryOpId(8),
            DirectoryRequest::Unsubscribe { id },
        );
        assert_eq!(
            effects.directory_refusals,
            vec![(DirectoryOpId(7), SubmitRefused::Busy { queued: 1 })]
        );
    }
}

#[cfg(test)]
mod read_refusal_tests {
    use skyriver_core::node::ReadOpId;
    use skyriver_core::ObjectId;
    use skyriver_transport::fabric::tcp::{TcpFabric, TcpFabricConfig};
    use skyriver_transport::fabric::{event_channel_with_capacity, FabricIdentity};

    use super::*;

    /// A READ the fabric refuses (no place for its completion in the full event channel) is
    /// kept for the loop to fail at once: the node would otherwise wait for it forever.
    #[test]
    fn a_read_the_fabric_has_no_room_for_is_kept_for_a_failure() {
        let (events, _driver) = event_channel_with_capacity(1);
        let fabric = TcpFabric::start(
            TcpFabricConfig {
                worker_threads: 1,
                ..TcpFabricConfig::new("127.0.0.1:0".parse().unwrap())
            },
            FabricIdentity {
                node: NodeId(1),
                cluster_token: "secret".into(),
            },
            BTreeMap::new(),
            events,
        )
        .unwrap();
        let mut effects = Effects::new(NodeId(1), BTreeMap::new());
        effects.fabric = Some(Arc::new(fabric));
        let region = LocalRegion {
            arena: ArenaId(0),
            offset: 0,
            len: 8,
        };
        let remote = RemoteRegion {
            addr: 0,
            len: 8,
            rkey: 0,
        };
        let post = |effects: &mut Effects, op| {
            let object = ObjectId::from_u64(1);
            NodeDriver::post_read(effects, NodeId(2), op, 0, region, remote, object);
        };
        // Room: the READ fails (no such peer) through the fabric, nothing is kept here.
        post(&mut effects, ReadOpId(1));
        assert!(effects.read_refusals.is_empty());
        // Its failure took the one place: the next READ is refused and kept.
        post(&mut effects, ReadOpId(2));
        assert_eq!(effects.read_refusals.len(), 1);
        assert_eq!(effects.read_refusals[0].0, ReadOpId(2));
        assert_eq!(effects.read_refusals[0].1.capacity, 1);
    }
}
