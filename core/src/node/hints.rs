//! Location hints: a fetch that names the node holding the object skips the directory.
//!
//! A caller that knows who produced an object (an MPI rank, the node a task ran on) passes it
//! as a hint. The requester then sends its `FetchRequest` straight to that node, before it
//! knows the object's sizes or digest, and without a local object to receive into: the
//! holder's first reply (`EagerData` at offset 0, or `Rendezvous`) names both, so the local
//! object is created then and the reply handled as any transfer's. A fresh object's fetch costs
//! one round trip to its holder instead of a lookup at the head plus that round trip.
//!
//! ```text
//! Hinted ──first EagerData / Rendezvous──► create locally ──► Transferring (same transfer id)
//!    │                                └─ no memory / over the bytes-in-flight cap ──► Queued
//!    │                                   behind the admission queue (sizes now known; a
//!    │                                   Rendezvous is released with Finish)
//!    └─ NotFound / Busy / Error / timeout / lost connection ──► LookingUp (the directory)
//! ```
//!
//! An id made by `ObjectId::owned_by` (what clients draw for a put without an id) names the
//! node it was made on, and a fetch of it with no hint of the caller's and no remembered
//! location takes that node as its hint: an object is usually fetched from where it was put.
//!
//! A wrong hint therefore costs one round trip, then the fetch goes on as if it had no hint.
//! The copy is verified against the digest the holder names in its reply. That digest is the
//! holder's, not the directory's, so a holder serves peers only copies whose publication the
//! directory accepted: one sealed while the directory could not judge it (an outage, a timeout)
//! or recovered from disk is refused (`NotFound`, so the fetch asks the directory) until the
//! directory accepts it (see `sealing`). The simulator hints every other fetch of its
//! forced-mode seeds, and its content checker fails any copy whose digest the directory never
//! named.

use super::locations::Location;
use super::{Node, Timer, TransferFailure, TransferMode};
use crate::digest::ContentDigest;
use crate::error::StoreError;
use crate::ids::{NodeId, ObjectId, TransferId};
use crate::time::Instant;
use crate::wire::{EagerHeader, ObjectSizes, PeerMessage};

/// A `FetchRequest` sent to a hinted node, not answered yet.
#[derive(Debug)]
pub(super) struct HintedRequest {
    pub(super) id: ObjectId,
    pub(super) source: NodeId,
    requested_at: Instant,
    /// When the hinted node last said it is restoring the object from disk (see `spill`).
    restoring_noticed_at: Option<Instant>,
}

/// What became of a hinted request's first reply.
enum Adoption {
    /// The local object exists and the transfer is tracked: handle the reply as any transfer's.
    Adopted,
    /// The reply is not used (the fetch went on another way, or nobody wants it any more).
    Declined,
}

impl Node {
    /// Whether `hint` can be asked directly for an object: another node, connected.
    pub(super) fn usable_hint(&self, hint: Option<NodeId>) -> Option<NodeId> {
        hint.filter(|&h| h != self.config.node)
            .filter(|h| self.peers.get(h).is_some_and(|p| p.connected))
    }

    /// Sends the fetch of `id` straight to `hint`; returns the transfer id it goes under.
    pub(super) fn ask_hinted(
        &mut self,
        id: ObjectId,
        hint: NodeId,
        mode: TransferMode,
    ) -> TransferId {
        let tid = self.new_transfer_id();
        self.stats.hinted_fetches += 1;
        self.hinted.insert(
            tid,
            HintedRequest {
                id,
                source: hint,
                requested_at: self.now,
                restoring_noticed_at: None,
            },
        );
        self.send_fetch_request(tid, id, hint, mode);
        tid
    }

    pub(super) fn is_hinted_request(&self, peer: NodeId, tid: TransferId) -> bool {
        self.hinted.get(&tid).is_some_and(|h| h.source == peer)
    }

    /// A reply other than `EagerData` to hinted request `tid`: `true` when the transfer now
    /// exists and the reply is to be handled as its.
    pub(super) fn hinted_reply(&mut self, peer: NodeId, message: &PeerMessage) -> bool {
        let tid = message.req();
        match message {
            PeerMessage::Rendezvous { sizes, digest, .. } => {
                match self.adopt(peer, tid, *sizes, *digest) {
                    Adoption::Adopted => true,
                    Adoption::Declined => {
                        self.send(peer, PeerMessage::Finish { req: tid });
                        false
                    }
                }
            }
            // Sent on to a relay (see `relay`): the holder named the content.
            PeerMessage::Redirect { sizes, digest, .. } => {
                matches!(self.adopt(peer, tid, *sizes, *digest), Adoption::Adopted)
            }
            PeerMessage::Restoring { .. } => {
                self.hinted_holder_restoring(tid);
                false
            }
            PeerMessage::NotFound { .. } => {
                self.hint_failed(tid, TransferFailure::NotFound);
                false
            }
            PeerMessage::Busy { .. } => {
                self.hint_failed(tid, TransferFailure::Busy);
                false
            }
            PeerMessage::Error { reason, .. } => {
                self.hint_failed(
                    tid,
                    TransferFailure::Refused {
                        reason: reason.clone(),
                    },
                );
                false
            }
            other => {
                self.hint_failed(
                    tid,
                    TransferFailure::UnexpectedMessage {
                        message: other.to_string(),
                        state: "awaiting the hinted node's answer".into(),
                    },
                );
                false
            }
        }
    }

    /// The first `EagerData` chunk of hinted request `tid`: `true` when the transfer now exists
    /// and the chunk is to be written as its.
    pub(super) fn hinted_eager_chunk(&mut self, peer: NodeId, header: &EagerHeader) -> bool {
        if header.offset != 0 {
            self.hint_failed(
                header.req,
                TransferFailure::FirstChunkNotAtStart {
                    offset: header.offset,
                },
            );
            return false;
        }
        matches!(
            self.adopt(peer, header.req, header.sizes, header.digest),
            Adoption::Adopted
        )
    }

    /// The holder named the object's sizes and digest: create the local object and track the
    /// transfer, or queue the fetch (its sizes now known) when memory or the bytes-in-flight
    /// cap says not now.
    fn adopt(
        &mut self,
        peer: NodeId,
        tid: TransferId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) -> Adoption {
        let request = self.hinted.remove(&tid).expect("adopting a hinted request");
        self.cancel_timer(Timer::TransferDeadline(tid));
        let id = request.id;
        let Some(object) = self.objects.get_mut(&id) else {
            return Adoption::Declined;
        };
        if !object.is_hinted(tid) {
            return Adoption::Declined;
        }
        object.learn_holder(peer, (sizes, digest));
        self.locations.insert(
            id,
            Location {
                holders: vec![peer],
                sizes,
                digest,
            },
        );
        let Some(block_len) = sizes.total().and_then(crate::alloc::block_len_for) else {
            let reason = super::TransferFailure::UnusableSizes {
                holder: peer,
                sizes,
            };
            self.source_failed(id, peer, reason);
            return Adoption::Declined;
        };
        let over_cap = self.bytes_in_flight > 0
            && self.bytes_in_flight.saturating_add(block_len) > self.config.max_bytes_in_flight;
        // Transfers admitted before this one keep their turn.
        if over_cap || !self.admission.is_empty() {
            self.choose_source(id);
            return Adoption::Declined;
        }
        match self.store.create(
            self.now,
            super::FETCH_CLIENT,
            id,
            sizes.data_size,
            sizes.metadata_size,
        ) {
            Ok(info) => {
                self.track_incoming(tid, id, peer, (sizes, digest), info, request.requested_at);
                if let Some(noticed) = request.restoring_noticed_at {
                    let transfer = self.transfers.get_mut(&tid).expect("tracked just now");
                    transfer.restoring_noticed(request.requested_at, noticed);
                }
                let object = self.objects.get_mut(&id).expect("checked above");
                object.transfer_started(tid);
                Adoption::Adopted
            }
            Err(StoreError::OutOfMemory { .. }) if self.memory_will_be_freed() => {
                self.choose_source(id);
                Adoption::Declined
            }
            Err(StoreError::ObjectExists(_)) => {
                self.created_here_meanwhile(id);
                Adoption::Declined
            }
            Err(error) => {
                self.resolve(id, Err(super::FetchError::Store(error)));
                Adoption::Declined
            }
        }
    }

    /// The hinted node is restoring the object from its disk (see `spill`): wait a reply
    /// timeout more, within the bound from the request, as for any transfer.
    fn hinted_holder_restoring(&mut self, tid: TransferId) {
        let now = self.now;
        let request = self.hinted.get_mut(&tid).expect("checked by the caller");
        let bound = request
            .requested_at
            .saturating_add(self.config.restore_wait_limit);
        if bound <= now {
            let waited = now.saturating_since(request.requested_at);
            let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
            self.hint_failed(tid, TransferFailure::RestoreTooSlow { waited_ms });
            return;
        }
        request.restoring_noticed_at = Some(now);
        self.cancel_timer(Timer::TransferDeadline(tid));
        let deadline = now.saturating_add(self.config.reply_timeout).min(bound);
        self.set_timer(deadline, Timer::TransferDeadline(tid));
    }

    /// Hinted request `tid` got no usable answer: the fetch asks the directory, as if it had
    /// had no hint.
    pub(super) fn hint_failed(&mut self, tid: TransferId, reason: TransferFailure) {
        let Some(request) = self.hinted.remove(&tid) else {
            return;
        };
        self.cancel_timer(Timer::TransferDeadline(tid));
        self.stats.wrong_hints += 1;
        self.hinted_fetch_failed(request.id, tid, request.source, reason);
    }

    /// The connection to `peer` is gone: its hinted requests fall back to the directory.
    pub(super) fn hints_lost(&mut self, peer: NodeId) {
        let lost: Vec<TransferId> = self
            .hinted
            .iter()
            .filter(|(_, h)| h.source == peer)
            .map(|(&tid, _)| tid)
            .collect();
        for tid in lost {
            self.hint_failed(tid, TransferFailure::ConnectionLost { holder: peer });
        }
    }

    /// Forgets hinted request `tid` nobody waits for (a late reply is ignored, or its lease
    /// released, as any ended transfer's).
    pub(super) fn drop_hinted(&mut self, tid: TransferId) {
        if self.hinted.remove(&tid).is_some() {
            self.cancel_timer(Timer::TransferDeadline(tid));
        }
    }
}
