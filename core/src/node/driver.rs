//! The one place a [`NodeOutput`] is taken apart: a driver (the daemon, the simulator, the
//! core's own tests) implements [`NodeDriver`], one method per kind of effect, and hands every
//! output to [`NodeOutput::dispatch`]. A new kind of output is then a compile error in every
//! driver rather than a `match` arm forgotten in one of three places.

use std::net::SocketAddr;

use super::{NodeOutput, ReadOpId};
use crate::client_protocol::Response;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryOpId, DirectoryRequest};
use crate::ids::{ClientId, NodeId, ObjectId, RequestId, TransferId};
use crate::region::{LocalRegion, RemoteRegion};
use crate::store::{DurableChange, ObjectEvent, SpillOpId};
use crate::wire::{EagerHeader, InputBytes, PeerMessage};

/// What a driver does with each kind of [`NodeOutput`]; see the variants for the contract of
/// each.
pub trait NodeDriver {
    /// [`NodeOutput::Send`].
    fn send(&mut self, peer: NodeId, message: PeerMessage);
    /// [`NodeOutput::SendEager`]: gather the payload from `source` now.
    fn send_eager(
        &mut self,
        peer: NodeId,
        header: EagerHeader,
        source: LocalRegion,
        object: ObjectId,
    );
    /// [`NodeOutput::PostRead`].
    fn post_read(
        &mut self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        remote: RemoteRegion,
        object: ObjectId,
    );
    /// [`NodeOutput::WriteLocal`]: copy `payload` of the input message being handled.
    fn write_local(&mut self, region: LocalRegion, payload: InputBytes, object: ObjectId);
    /// [`NodeOutput::WriteInline`]: copy `bytes` into the arena now.
    fn write_inline(&mut self, region: LocalRegion, bytes: Vec<u8>, object: ObjectId);
    /// [`NodeOutput::HashAhead`]: optional; nothing to answer.
    fn hash_ahead(&mut self, _transfer: TransferId, _region: LocalRegion, _object: ObjectId) {}
    /// [`NodeOutput::VerifyContent`]: answer with [`NodeInput::ContentHashed`](super::NodeInput::ContentHashed).
    fn verify_content(&mut self, transfer: TransferId, region: LocalRegion, object: ObjectId);
    /// [`NodeOutput::Trace`]: reply with the timestamps taken so far (none where there is no
    /// clock, as in the simulator).
    fn trace(&mut self, client: ClientId, request: RequestId, record: bool);
    /// [`NodeOutput::GrantRead`]: answer with [`NodeInput::ReadGranted`](super::NodeInput::ReadGranted).
    fn grant_read(&mut self, peer: NodeId, req: TransferId, object: ObjectId, region: LocalRegion);
    /// [`NodeOutput::RevokeRead`]: answer with [`NodeInput::ReadRevoked`](super::NodeInput::ReadRevoked).
    fn revoke_read(&mut self, peer: NodeId, req: TransferId, object: ObjectId, region: LocalRegion);
    /// [`NodeOutput::Directory`].
    fn directory(&mut self, op: DirectoryOpId, request: DirectoryRequest);
    /// [`NodeOutput::Reply`].
    fn reply(&mut self, client: ClientId, request: RequestId, response: Response);
    /// [`NodeOutput::Event`].
    fn event(&mut self, client: ClientId, event: ObjectEvent);
    /// [`NodeOutput::CloseClient`].
    fn close_client(&mut self, client: ClientId, reason: String);
    /// [`NodeOutput::Persist`].
    fn persist(&mut self, seq: u64, change: DurableChange);
    /// [`NodeOutput::Connect`]: dial `peer` at `address` (or do nothing when already dialing
    /// it), then report a peer connected or lost.
    fn connect(&mut self, peer: NodeId, address: SocketAddr);
    /// [`NodeOutput::Local`]: nothing to do but log or trace it.
    fn local(&mut self, _event: ObjectEvent) {}
    /// [`NodeOutput::Spill`]: write off the loop, answer with
    /// [`NodeInput::SpillDone`](super::NodeInput::SpillDone).
    fn spill(
        &mut self,
        op: SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    );
    /// [`NodeOutput::Restore`]: read off the loop, answer with
    /// [`NodeInput::RestoreDone`](super::NodeInput::RestoreDone).
    fn restore(
        &mut self,
        op: SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    );
    /// [`NodeOutput::DiscardSpilled`].
    fn discard_spilled(&mut self, op: SpillOpId, object: ObjectId);
    /// [`NodeOutput::GrantPartialRead`]: answer with [`NodeInput::ReadGranted`](super::NodeInput::ReadGranted).
    fn grant_partial_read(
        &mut self,
        peer: NodeId,
        req: TransferId,
        object: ObjectId,
        region: LocalRegion,
    );
}

impl NodeOutput {
    /// Hands this output to the matching method of `driver`.
    pub fn dispatch(self, driver: &mut impl NodeDriver) {
        match self {
            NodeOutput::Send { peer, message } => driver.send(peer, message),
            NodeOutput::SendEager {
                peer,
                header,
                source,
                object,
            } => driver.send_eager(peer, header, source, object),
            NodeOutput::PostRead {
                peer,
                op,
                lane,
                local,
                remote,
                object,
            } => driver.post_read(peer, op, lane, local, remote, object),
            NodeOutput::WriteLocal {
                region,
                payload,
                object,
            } => driver.write_local(region, payload, object),
            NodeOutput::WriteInline {
                region,
                bytes,
                object,
            } => driver.write_inline(region, bytes, object),
            NodeOutput::HashAhead {
                transfer,
                region,
                object,
            } => driver.hash_ahead(transfer, region, object),
            NodeOutput::VerifyContent {
                transfer,
                region,
                object,
            } => driver.verify_content(transfer, region, object),
            NodeOutput::Trace {
                client,
                request,
                record,
            } => driver.trace(client, request, record),
            NodeOutput::GrantRead {
                peer,
                req,
                object,
                region,
            } => driver.grant_read(peer, req, object, region),
            NodeOutput::RevokeRead {
                peer,
                req,
                object,
                region,
            } => driver.revoke_read(peer, req, object, region),
            NodeOutput::Directory { op, request } => driver.directory(op, request),
            NodeOutput::Reply {
                client,
                request,
                response,
            } => driver.reply(client, request, response),
            NodeOutput::Event { client, event } => driver.event(client, event),
            NodeOutput::CloseClient { client, reason } => driver.close_client(client, reason),
            NodeOutput::Persist { seq, change } => driver.persist(seq, change),
            NodeOutput::Local(event) => driver.local(event),
            NodeOutput::Connect { peer, address } => driver.connect(peer, address),
            NodeOutput::Spill {
                op,
                object,
                region,
                digest,
            } => driver.spill(op, object, region, digest),
            NodeOutput::Restore {
                op,
                object,
                region,
                digest,
            } => driver.restore(op, object, region, digest),
            NodeOutput::DiscardSpilled { op, object } => driver.discard_spilled(op, object),
            NodeOutput::GrantPartialRead {
                peer,
                req,
                object,
                region,
            } => driver.grant_partial_read(peer, req, object, region),
        }
    }
}
