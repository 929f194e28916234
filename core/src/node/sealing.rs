//! Seals that wait for the directory's verdict, so one object id names one content across the
//! cluster.
//!
//! On a standalone node a client's seal (or small put) seals at once. On a node of a cluster it
//! first publishes the object's sizes and digest, and seals once the directory answered:
//!
//! - accepted: sealed; the reply is `Ok`, and the publication is already made;
//! - `Conflict`: live nodes hold the id with another content, which keeps it; the object is
//!   aborted and the reply is `ObjectExists`;
//! - unavailable, no answer within the directory timeout, or a directory known to be down:
//!   sealed here, the reply is `Ok`,
//!   and the publication is retried in the background. Should the directory refuse it once it
//!   answers (another node took the id meanwhile), this copy stays local and unpublished, so
//!   no other node fetches it, and `id_conflicts` counts it.
//!
//! A copy sealed without the directory's acceptance is not served to peers (`NotFound`) until
//! the directory accepts its publication: a peer sent by the directory was told the accepted
//! digest and would refuse other bytes, but a hinted fetch (see `hints`) trusts the holder.
//!
//! A peer that asks for the object between the directory's acceptance and the seal here (it
//! heard of the publication first) is served right after the seal.
//!
//! The cost is one directory round trip per seal on a cluster node. Until the verdict the
//! object is unsealed (a `get` waits for it, nothing else can be written to it by protocol);
//! an abort or a disconnect of its creator meanwhile drops the seal and withdraws the
//! publication, in case the directory accepted it.

use super::publications::Want;
use super::Node;
use crate::client_protocol::Response;
use crate::digest::ContentDigest;
use crate::error::StoreError;
use crate::ids::{ClientId, NodeId, ObjectId, RequestId, TransferId};
use crate::wire::PeerMessage;

/// Most fetch requests of peers one pending seal keeps for after the seal.
const MAX_PARKED_FETCHES: usize = 64;

/// A seal waiting for the directory's verdict on the object's publication.
#[derive(Debug)]
pub(super) struct PendingSeal {
    client: ClientId,
    request: RequestId,
    release: bool,
    digest: ContentDigest,
    /// Peers' fetch requests that came before the seal: (peer, transfer, eager limit, most
    /// bytes per chunk), served once it is made.
    parked_fetches: Vec<(NodeId, TransferId, u64, u32)>,
}

impl PendingSeal {
    /// The client whose seal waits.
    pub(super) fn client(&self) -> ClientId {
        self.client
    }

    /// Keeps a peer's fetch request for after the seal; `false` when too many wait already.
    pub(super) fn park_fetch(
        &mut self,
        peer: NodeId,
        req: TransferId,
        eager_limit: u64,
        max_chunk_bytes: u32,
    ) -> bool {
        if self.parked_fetches.len() >= MAX_PARKED_FETCHES {
            return false;
        }
        self.parked_fetches
            .push((peer, req, eager_limit, max_chunk_bytes));
        true
    }
}

/// What the directory said of a pending seal's publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Published.
    Accepted,
    /// Another content holds the id.
    Refused,
    /// No answer: seal here, keep trying to publish.
    Unknown,
}

impl Node {
    /// A client asks to seal `id`, whose bytes hash to `digest`: seals now (a standalone node)
    /// or once the directory accepted the publication. `Some` is the reply when it is due now.
    pub(super) fn seal_request(
        &mut self,
        client: ClientId,
        request: RequestId,
        id: ObjectId,
        release: bool,
        digest: ContentDigest,
    ) -> Option<Response> {
        if self.config.standalone {
            return Some(Response::Done(self.seal_now(client, id, release, digest)));
        }
        if let Err(error) = self.store.check_creator(client, id) {
            return Some(Response::Done(Err(error)));
        }
        if self.pending_seals.contains_key(&id) {
            return Some(Response::Done(Err(StoreError::BadRequest(format!(
                "a seal of {id} is already waiting for the directory"
            )))));
        }
        let Some(sizes) = self.store.unsealed_sizes(&id) else {
            return Some(Response::Done(Err(StoreError::ObjectNotFound(id))));
        };
        if !self.directory_healthy() {
            // The directory is known to be down: no verdict would come in time. Seal here and
            // publish (checked) once it is back, as after a timeout.
            let result = self.seal_now(client, id, release, digest);
            if result.is_ok() {
                self.published_at_seal.insert(id);
                self.unvouched.insert(id);
                self.want_publication(id, Want::Publish(sizes, digest));
            }
            return Some(Response::Done(result));
        }
        self.pending_seals.insert(
            id,
            PendingSeal {
                client,
                request,
                release,
                digest,
                parked_fetches: Vec::new(),
            },
        );
        self.want_publication(id, Want::Publish(sizes, digest));
        None
    }

    fn seal_now(
        &mut self,
        client: ClientId,
        id: ObjectId,
        release: bool,
        digest: ContentDigest,
    ) -> Result<(), StoreError> {
        self.store.seal(client, id, release)?;
        self.store.set_digest(&id, digest);
        Ok(())
    }

    /// The directory answered the publication of `id` (or will not in time).
    pub(super) fn seal_verdict(&mut self, id: ObjectId, verdict: Verdict) {
        let Some(pending) = self.pending_seals.remove(&id) else {
            return;
        };
        let parked = pending.parked_fetches;
        match verdict {
            Verdict::Accepted | Verdict::Unknown => {
                let durable_before = self.store.durable_changes_queued();
                self.published_at_seal.insert(id);
                let result = self.seal_now(pending.client, id, pending.release, pending.digest);
                let sealed = result.is_ok();
                if !sealed {
                    self.published_at_seal.remove(&id);
                }
                self.reply_once_durable(
                    pending.client,
                    pending.request,
                    Response::Done(result),
                    durable_before,
                );
                if verdict == Verdict::Unknown && sealed {
                    // Sealed without the directory's word: not served to peers until it
                    // accepts, parked requests included (a hinted one was sent here by its
                    // client, not by the directory).
                    self.unvouched.insert(id);
                }
                for (peer, req, eager_limit, max_chunk_bytes) in parked {
                    self.serve_fetch_request(peer, req, id, eager_limit, max_chunk_bytes);
                }
            }
            Verdict::Refused => {
                // The creator's unsealed object: it may abort it, and so does the node.
                let _ = self.store.abort(pending.client, id);
                self.reply(
                    pending.client,
                    pending.request,
                    Response::Done(Err(StoreError::ObjectExists(id))),
                );
                self.refuse_parked(parked);
            }
        }
    }

    /// The creator of a pending seal's object aborted it or left: nobody waits for the
    /// verdict, and the directory must not keep a publication it may have accepted.
    pub(super) fn drop_pending_seal(&mut self, id: ObjectId) {
        if let Some(pending) = self.pending_seals.remove(&id) {
            self.want_publication(id, Want::Withdraw);
            self.refuse_parked(pending.parked_fetches);
            self.reply(
                pending.client,
                pending.request,
                Response::Done(Err(StoreError::ObjectNotFound(id))),
            );
        }
    }

    /// Drops the pending seals of a client that left.
    pub(super) fn drop_pending_seals_of(&mut self, client: ClientId) {
        let ids: Vec<ObjectId> = self
            .pending_seals
            .iter()
            .filter(|(_, pending)| pending.client == client)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(pending) = self.pending_seals.remove(&id) {
                self.refuse_parked(pending.parked_fetches);
            }
            self.want_publication(id, Want::Withdraw);
        }
    }

    /// Fetch requests kept for a seal that will not be made: the object is not here.
    fn refuse_parked(&mut self, parked: Vec<(NodeId, TransferId, u64, u32)>) {
        for (peer, req, _, _) in parked {
            self.send(peer, PeerMessage::NotFound { req });
        }
    }
}
