//! Copies of record on this node: puts with `replicas = k`, copies the registry places here,
//! the wait of a put for its copies, and deletes that reach every copy.
//!
//! - **A put with k > 1** publishes its object with `PublishReplicated`; the registry places
//!   the other `k − 1` copies (see [`crate::registry::replication`]). The object is a copy of
//!   record here: held so in the store ([`Store::hold_as_record`]), never evicted, only deleted;
//!   on a node with a spill tier it may be spilled, and it stays a copy of record there.
//! - **A copy placed here** ([`DirectoryEvent::Replicate`]) is fetched over the ordinary fetch
//!   path (by the node's own fetch client, as a client fetch would be), held at its seal and
//!   published at once with `PublishReplicated`. An object already here is promoted in place.
//!   A copy this node cannot take (its store refused it, say for want of room; a hold refused;
//!   other bytes held under the id) is declined at once ([`DirectoryRequest::DeclineReplica`]),
//!   so the registry places it elsewhere without waiting for its target timeout. A fetch that
//!   failed otherwise (its sources failed, its deadline passed) is dropped: the next node would
//!   fare no better, and the registry gives the target up after its timeout.
//! - **Waiting**: a put with `wait_ms` gets its reply once the registry reports `k` live copies
//!   of record ([`DirectoryEvent::Copies`]), or fails at its deadline with
//!   [`StoreError::TooFewReplicas`] naming how many exist; the object stays stored either
//!   way. A put on a node without a cluster fails so at once (after storing the object).
//! - **Returning**: after the directory answers again (a partition or outage longer than the
//!   heartbeat bound ends), copies of record are published again as such; the registry
//!   counts each again while its object is short of copies, else answers
//!   [`DirectoryEvent::Surplus`] and the copy here becomes a plain (evictable) one.
//! - **Delete**: a client's delete of an object that wants copies here asks the registry to
//!   delete it everywhere ([`DirectoryRequest::DeleteEverywhere`]); a node told so
//!   ([`DirectoryEvent::Delete`]) drops its copy (once unused, as any delete).
//!
//! [`Store::hold_as_record`]: crate::store::Store::hold_as_record
//! [`DirectoryEvent::Replicate`]: crate::directory::DirectoryEvent::Replicate
//! [`DirectoryEvent::Copies`]: crate::directory::DirectoryEvent::Copies
//! [`DirectoryEvent::Delete`]: crate::directory::DirectoryEvent::Delete
//! [`DirectoryEvent::Surplus`]: crate::directory::DirectoryEvent::Surplus
//! [`DirectoryRequest::DeleteEverywhere`]: crate::directory::DirectoryRequest::DeleteEverywhere
//! [`DirectoryRequest::DeclineReplica`]: crate::directory::DirectoryRequest::DeclineReplica

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::errors::FetchError;
use super::publications::Want;
use super::{Node, Timer, TransferMode, FETCH_CLIENT};
use crate::client_protocol::{CopyView, ReplicaPolicy, Response};
use crate::digest::ContentDigest;
use crate::directory::{DirectoryReply, DirectoryRequest};
use crate::error::StoreError;
use crate::ids::{ClientId, NodeId, ObjectId, RequestId};
use crate::wire::ObjectSizes;

/// A put waiting for its copies.
#[derive(Debug)]
struct ReplicaWait {
    client: ClientId,
    request: RequestId,
    wanted: u8,
    wait: Duration,
    /// Live copies of record the registry last reported.
    copies: u32,
    /// Whether the object is sealed here (the put's own reply was due).
    sealed: bool,
    /// Durable changes queued before the seal: its reply, when it comes, also waits for the
    /// seal's own change to be durable (as every reply does, see `reply_once_durable`).
    durable_before: u64,
}

/// This node's replica bookkeeping.
#[derive(Debug, Default)]
pub(super) struct Replicas {
    /// Copies wanted of each object put or placed here with more than one.
    wanted: BTreeMap<ObjectId, u8>,
    /// Copies of record held here; each is held as one in the store (in memory or spilled).
    of_record: BTreeSet<ObjectId>,
    /// Puts waiting for their copies.
    waits: BTreeMap<ObjectId, ReplicaWait>,
    by_request: BTreeMap<(ClientId, RequestId), ObjectId>,
    /// Puts with copies that do not wait for them, until their reply: a put that fails leaves
    /// no copies wanted of an object that is not here.
    unanswered: BTreeMap<(ClientId, RequestId), ObjectId>,
    /// Fetches of copies placed here, by the fetch client's request id.
    fetching: BTreeMap<RequestId, ObjectId>,
    /// Copies placed here whose seal is still to come.
    placed: BTreeSet<ObjectId>,
    next_fetch: u64,
}

impl Replicas {
    /// Copies of record held here.
    pub(super) fn of_record_count(&self) -> usize {
        self.of_record.len()
    }
}

impl Node {
    /// Whether this node holds `id` as a copy of record (held so in the store until a delete).
    pub fn is_copy_of_record(&self, id: &ObjectId) -> bool {
        self.replicas.of_record.contains(id)
    }

    /// The copies a put asks for: its own, or the daemon's default. (A count above
    /// [`MAX_REPLICAS`](crate::registry::MAX_REPLICAS) is refused by `Request::validate`.)
    fn copies_wanted(&self, policy: ReplicaPolicy) -> u8 {
        let copies = if policy.copies == 0 {
            self.config.default_replicas
        } else {
            policy.copies
        };
        copies.clamp(1, crate::registry::MAX_REPLICAS)
    }

    /// A plain put or seal of `id` (one that names no replica count) is about to be served:
    /// it gets the daemon's default (`--replicas`), without a wait, when that is more than
    /// one copy and the request can store the object (a put of an id not here, a seal by the
    /// object's creator): a request that must fail marks nothing.
    pub(super) fn plain_put(
        &mut self,
        client: ClientId,
        request: RequestId,
        id: ObjectId,
        seal: bool,
    ) {
        if self.config.default_replicas > 1 && self.would_store(client, id, seal) {
            self.replicated_put(client, request, id, ReplicaPolicy::default());
        }
    }

    /// Whether `client`'s put (`seal`: seal) of `id` can store the object: an id not here, or
    /// an unsealed object it created. A request that must fail wants no copies.
    pub(super) fn would_store(&self, client: ClientId, id: ObjectId, seal: bool) -> bool {
        if seal {
            self.store.check_creator(client, id).is_ok()
        } else {
            !self.store.contains(&id) && self.store.unsealed_sizes(&id).is_none()
        }
    }

    /// A put or seal with `policy` for `id` is about to be served: note what it wants.
    pub(super) fn replicated_put(
        &mut self,
        client: ClientId,
        request: RequestId,
        id: ObjectId,
        policy: ReplicaPolicy,
    ) {
        let wanted = self.copies_wanted(policy);
        // Only the built-in directory's registry places copies: elsewhere (Redis) the object
        // is a plain one, never pinned as a copy of record no other copy could relieve.
        let placed = !self.config.standalone && self.config.directory_places_replicas;
        if wanted > 1 && placed {
            self.replicas.wanted.insert(id, wanted);
            if policy.wait_ms.is_none() {
                self.replicas.unanswered.insert((client, request), id);
            }
        }
        if let (Some(wait_ms), true) = (policy.wait_ms, wanted > 1) {
            // A wait for an earlier put of this id whose object went meanwhile (deleted here,
            // or released by a refusal and evicted): it ends now, with the copies it saw.
            self.end_wait_with_too_few(id);
            self.replicas.waits.insert(
                id,
                ReplicaWait {
                    client,
                    request,
                    wanted,
                    wait: Duration::from_millis(wait_ms),
                    copies: 0,
                    sealed: false,
                    durable_before: 0,
                },
            );
            self.replicas.by_request.insert((client, request), id);
        }
    }

    /// A reply to `client`'s `request` is due: `None` holds it while the put waits for its
    /// copies.
    pub(super) fn hold_for_replicas(
        &mut self,
        client: ClientId,
        request: RequestId,
        response: Response,
        durable_before: u64,
    ) -> Option<Response> {
        if self.replicas.by_request.is_empty() && self.replicas.unanswered.is_empty() {
            return Some(response);
        }
        if let Some(id) = self.replicas.unanswered.remove(&(client, request)) {
            if !matches!(response, Response::Done(Ok(()))) && !self.replicas.of_record.contains(&id)
            {
                // The put failed: the object is not here to want copies.
                self.replicas.wanted.remove(&id);
            }
            return Some(response);
        }
        let Some(&id) = self.replicas.by_request.get(&(client, request)) else {
            return Some(response);
        };
        if !matches!(response, Response::Done(Ok(()))) {
            // The put failed: nothing to wait for.
            self.replicas.by_request.remove(&(client, request));
            self.replicas.waits.remove(&id);
            if !self.replicas.of_record.contains(&id) {
                self.replicas.wanted.remove(&id);
            }
            return Some(response);
        }
        let standalone = self.config.standalone;
        let placed = self.config.directory_places_replicas;
        let wait = self
            .replicas
            .waits
            .get_mut(&id)
            .expect("indexed by request");
        wait.sealed = true;
        wait.durable_before = durable_before;
        wait.copies = wait.copies.max(1);
        if standalone {
            let (copies, wanted) = (wait.copies, wait.wanted);
            self.end_wait(id);
            return Some(Response::Done(Err(StoreError::TooFewReplicas {
                id,
                copies,
                wanted,
                in_cluster: false,
            })));
        }
        if !placed {
            let wanted = wait.wanted;
            self.end_wait(id);
            return Some(Response::Done(Err(StoreError::ReplicasUnsupported {
                id,
                wanted,
                directory: self.config.directory_name.clone(),
            })));
        }
        if wait.copies >= u32::from(wait.wanted) {
            self.end_wait(id);
            return Some(response);
        }
        let deadline = self.now + wait.wait;
        self.set_timer(deadline, Timer::ReplicaWait(id));
        None
    }

    fn end_wait(&mut self, id: ObjectId) -> Option<ReplicaWait> {
        let wait = self.replicas.waits.remove(&id)?;
        self.replicas
            .by_request
            .remove(&(wait.client, wait.request));
        self.cancel_timer(Timer::ReplicaWait(id));
        Some(wait)
    }

    /// The registry counts `copies` live copies of record of `id`.
    pub(super) fn copies_reported(&mut self, id: ObjectId, copies: u32) {
        let Some(wait) = self.replicas.waits.get_mut(&id) else {
            return;
        };
        wait.copies = copies;
        if wait.sealed && copies >= u32::from(wait.wanted) {
            let wait = self.end_wait(id).expect("found above");
            self.reply_when_durable(
                wait.client,
                wait.request,
                Response::Done(Ok(())),
                wait.durable_before,
            );
        }
    }

    /// A put's wait ran out.
    pub(super) fn replica_wait_expired(&mut self, id: ObjectId) {
        if self.end_wait_with_too_few(id) {
            self.stats.replica_waits_timed_out += 1;
        }
    }

    /// Ends the wait for `id`'s copies, if any, answering its put with the copies it saw.
    fn end_wait_with_too_few(&mut self, id: ObjectId) -> bool {
        let Some(wait) = self.end_wait(id) else {
            return false;
        };
        if wait.sealed {
            // The object is sealed here: the error (copies are missing) waits for the seal's
            // durability like a success would.
            self.reply_when_durable(
                wait.client,
                wait.request,
                Response::Done(Err(StoreError::TooFewReplicas {
                    id,
                    copies: wait.copies,
                    wanted: wait.wanted,
                    in_cluster: true,
                })),
                wait.durable_before,
            );
        }
        true
    }

    /// A client left: its waits end without a reply, and its puts still unanswered want no
    /// copies of an object that is not here (its unsealed objects were aborted).
    pub(super) fn replica_waits_gone(&mut self, client: ClientId) {
        let range = (client, RequestId(0))..=(client, RequestId(u64::MAX));
        let ids: Vec<ObjectId> = self
            .replicas
            .by_request
            .range(range.clone())
            .map(|(_, id)| *id)
            .collect();
        for id in ids {
            self.end_wait(id);
        }
        let unanswered: Vec<(ClientId, RequestId)> = self
            .replicas
            .unanswered
            .range(range)
            .map(|(key, _)| *key)
            .collect();
        for key in unanswered {
            let id = self.replicas.unanswered.remove(&key).expect("listed above");
            if !self.store.contains(&id) && !self.replicas.of_record.contains(&id) {
                self.replicas.wanted.remove(&id);
            }
        }
    }

    /// The copies wanted of `id`, when more than one.
    pub(super) fn replicas_wanted(&self, id: &ObjectId) -> Option<u8> {
        self.replicas.wanted.get(id).copied()
    }

    /// What a publication of `id` sends: `PublishReplicated` for an object that wants copies.
    pub(super) fn publish_request(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) -> DirectoryRequest {
        match self.replicas_wanted(&id) {
            Some(replicas) => DirectoryRequest::PublishReplicated {
                id,
                sizes,
                digest,
                replicas,
                free_bytes: self.free_bytes(),
            },
            None => DirectoryRequest::Publish { id, sizes, digest },
        }
    }

    /// Bytes the store could give a new object (free, evictable, or copies of record the spill
    /// tier could take).
    fn free_bytes(&self) -> u64 {
        let stats = self.store.stats();
        stats
            .capacity_bytes
            .saturating_sub(stats.allocated_bytes)
            .saturating_add(stats.evictable_bytes)
            .saturating_add(self.store.spillable_record_bytes())
    }

    /// `id` was sealed here: a copy of record is held as one, and a copy placed here is published
    /// at once (not after the delay of fetched copies).
    pub(super) fn replica_sealed(&mut self, id: ObjectId, sizes: ObjectSizes) {
        if !self.replicas.wanted.contains_key(&id) || !self.hold_copy_of_record(id) {
            return;
        }
        if self.replicas.placed.remove(&id) {
            if let Some(digest) = self.store.digest(&id) {
                self.want_publication(id, Want::Publish(sizes, digest));
            }
        }
    }

    /// `id`, sealed here, is held as a copy of record (never evicted, but spillable); false if
    /// it cannot be.
    fn hold_copy_of_record(&mut self, id: ObjectId) -> bool {
        if self.replicas.of_record.contains(&id) {
            return true;
        }
        if self.store.hold_as_record(id).is_err() {
            return false;
        }
        self.replicas.of_record.insert(id);
        true
    }

    /// The registry places a copy of record of `id` here.
    pub(super) fn replicate_here(
        &mut self,
        id: ObjectId,
        sizes: ObjectSizes,
        digest: ContentDigest,
        sources: Vec<NodeId>,
        replicas: u8,
    ) {
        if self.config.standalone {
            return;
        }
        let same_content = self.store.sealed_sizes_and_digest(&id) == Some((sizes, Some(digest)));
        if self.replicas.of_record.contains(&id) {
            if same_content {
                // Already a copy of record (the registry lost track, say after a partition):
                // publish it again.
                self.want_publication(id, Want::Publish(sizes, digest));
            }
            return;
        }
        if self.store.contains(&id) {
            if same_content {
                // A cached copy (in memory or spilled): promote it.
                if self.store.hold_as_record(id).is_ok() {
                    self.replicas.wanted.insert(id, replicas.max(2));
                    self.replicas.of_record.insert(id);
                    self.stats.copies_of_record_placed += 1;
                    self.want_publication(id, Want::Publish(sizes, digest));
                } else {
                    self.decline_replica(id);
                }
            } else {
                // A cached copy of another content under this id (deleted and put again with
                // other bytes since): never promoted, nor published as the new content. It
                // goes (once unused), and the registry places the copy elsewhere.
                let _ = self.store.delete(&[id]);
                self.decline_replica(id);
            }
            return;
        }
        if self.replicas.fetching.values().any(|&f| f == id) {
            self.replicas.wanted.insert(id, replicas.max(2));
            return;
        }
        let bytes = sizes.total().unwrap_or(u64::MAX);
        if !self.store.could_hold_once_freed(bytes) {
            // Not even with every evictable object gone and every pending removal durable
            // (copies of record fill the store, or no free range is long enough): declined
            // now, rather than after evicting the whole cache for a create that must fail.
            self.stats.replicas_declined_without_room += 1;
            self.decline_replica(id);
            return;
        }
        self.replicas.wanted.insert(id, replicas.max(2));
        let me = self.config.node;
        let holders: Vec<NodeId> = sources.into_iter().filter(|&s| s != me).collect();
        if !holders.is_empty() {
            self.locations.insert(
                id,
                super::locations::Location {
                    holders,
                    sizes,
                    digest,
                },
            );
        }
        let request = RequestId(self.replicas.next_fetch);
        self.replicas.next_fetch += 1;
        self.replicas.fetching.insert(request, id);
        self.replicas.placed.insert(id);
        self.start_fetch(
            FETCH_CLIENT,
            request,
            vec![id],
            Some(self.config.replication_fetch_timeout),
            super::fetch::FetchOptions {
                mode: TransferMode::Auto,
                wait_for_publication: false,
                hint: None,
            },
        );
    }

    /// A reply to the node's own fetch client: the fetch of a copy placed here ended.
    pub(super) fn replication_fetched(&mut self, request: RequestId, response: Response) {
        let Some(id) = self.replicas.fetching.remove(&request) else {
            return;
        };
        let ok =
            matches!(&response, Response::Fetched(results) if results.iter().all(Result::is_ok));
        // This node's store refused the copy (no room, too large): another node may take it.
        // Other failures (the sources failed, the deadline passed) are no more this node's than
        // the next one's, and are left to the registry's target timeout.
        let refused_here = matches!(&response, Response::Fetched(results)
            if results.iter().any(|r| matches!(r, Err(FetchError::Store(_)))));
        if ok {
            if self.replicas.wanted.contains_key(&id) {
                // Held as a copy of record (and published) before the fetch client's reference
                // goes: once unheld and not held so, the copy is evictable, and a fetch or
                // create waiting for room would take it before the seal's absorption could
                // hold it.
                self.hold_copy_of_record(id);
                let _ = self.store.release(FETCH_CLIENT, id);
                self.stats.copies_of_record_placed += 1;
            } else {
                let _ = self.store.release(FETCH_CLIENT, id);
                self.replicas.placed.remove(&id);
                // Deleted everywhere while it was on its way.
                let _ = self.store.delete(&[id]);
            }
        } else if self.is_transferring(&id) && self.replicas.wanted.contains_key(&id) {
            // Its deadline passed with the bytes on their way: the transfer goes on without a
            // waiter, and its seal holds and publishes the copy as one placed here
            // (`replica_sealed`; the registry counts it if the object still lacks a copy, else
            // answers `Surplus`). Dropped, the copy would be sealed as a plain one, the first
            // one a create waiting for room evicts: on a full node, each placement's transfers
            // would start just as their deadlines pass, and no copy would ever stay.
            self.stats.replication_fetches_failed += 1;
        } else {
            self.stats.replication_fetches_failed += 1;
            self.replicas.placed.remove(&id);
            if !self.replicas.of_record.contains(&id) {
                let still_wanted = self.replicas.wanted.remove(&id).is_some();
                if still_wanted && refused_here {
                    // Not deleted meanwhile: another node should take the copy, now.
                    self.decline_replica(id);
                }
            }
        }
    }

    /// The transfer of `id` went on without a waiter (see `replication_fetched`) and failed:
    /// a copy placed here that it was bringing is not wanted here any more.
    pub(super) fn abandoned_transfer_failed(&mut self, id: ObjectId) {
        if self.replicas.placed.remove(&id) && !self.replicas.of_record.contains(&id) {
            self.replicas.wanted.remove(&id);
        }
    }

    /// This node cannot take the copy of `id` the registry placed here: it says so, and the
    /// registry places it elsewhere at once.
    fn decline_replica(&mut self, id: ObjectId) {
        self.directory(DirectoryRequest::DeclineReplica { id }, None);
    }

    /// A client deletes `ids`: copies of record are released first, and the registry asked to
    /// delete them everywhere.
    pub(super) fn delete_replicas(&mut self, ids: &[ObjectId]) {
        for id in ids {
            if self.replicas.wanted.remove(id).is_none() {
                continue;
            }
            if self.replicas.of_record.remove(id) {
                self.store.release_record(*id);
            }
            self.directory(DirectoryRequest::DeleteEverywhere { id: *id }, None);
        }
    }

    /// The registry deleted `id` everywhere: drop the copy here.
    pub(super) fn deleted_everywhere(&mut self, id: ObjectId) {
        self.replicas.wanted.remove(&id);
        if self.replicas.of_record.remove(&id) {
            self.store.release_record(id);
        }
        // In memory or spilled.
        if self.store.contains(&id) {
            let _ = self.store.delete(&[id]);
        }
    }

    /// The directory answers again (after a welcome, whose replay listed every copy here as a
    /// plain one): each copy of record is published again as one, so the registry counts it
    /// again — or, when repair replaced it meanwhile, answers [`DirectoryEvent::Surplus`].
    /// Publications on their way are left to finish (they are `PublishReplicated` already).
    ///
    /// [`DirectoryEvent::Surplus`]: crate::directory::DirectoryEvent::Surplus
    pub(super) fn publish_copies_of_record_again(&mut self) {
        let ids: Vec<ObjectId> = self.replicas.of_record.iter().copied().collect();
        self.publish_again(ids);
    }

    /// The registry has enough copies of record of `id` without this one: released, it stays
    /// as a plain copy (evictable). The object still wants copies, so a client's delete here
    /// still deletes it everywhere, and a later placement here promotes the copy again.
    pub(super) fn surplus_copy(&mut self, id: ObjectId) {
        if self.replicas.of_record.remove(&id) {
            self.store.release_record(id);
            self.stats.copies_of_record_released += 1;
        }
    }

    /// The store lost `id` (its spill record was damaged or gone when it was restored): if it
    /// was a copy of record here, it is one no more — else the node would publish it as one
    /// again when the directory comes back, and the registry would count a copy that does not
    /// exist. The store's deletion withdraws it, which puts the object in the registry's
    /// repair queue. The object still wants copies (a client's delete here still deletes it
    /// everywhere).
    pub(super) fn copy_of_record_lost(&mut self, id: ObjectId) {
        self.replicas.of_record.remove(&id);
    }

    /// The registry refused this node's copy of `id` (another content holds the id): it is no
    /// copy of record of what the id names, nor of the content deleted or replaced, so it is
    /// released (evictable) and the object wants no copies from here; a later placement of the
    /// content the id names declines this copy and fetches that content.
    pub(super) fn copy_of_record_refused(&mut self, id: ObjectId) {
        // A put still waiting for copies of the refused content gets none: it fails as a
        // refused seal does (an unsealed one is answered by its seal's verdict).
        if self.replicas.waits.get(&id).is_some_and(|wait| wait.sealed) {
            let wait = self.end_wait(id).expect("found above");
            self.reply_when_durable(
                wait.client,
                wait.request,
                Response::Done(Err(StoreError::ObjectExists(id))),
                wait.durable_before,
            );
        }
        self.replicas.wanted.remove(&id);
        if self.replicas.of_record.remove(&id) {
            self.store.release_record(id);
            self.stats.copies_of_record_released += 1;
        }
    }

    /// A `LocateCopies` answered by the directory: the holders with their domains, each marked
    /// a copy of record or a cache copy when the directory keeps records (the registry answers
    /// `CopiesLocated`; Redis answers a plain `Located`).
    pub(super) fn copies_answer(&self, id: &ObjectId, reply: DirectoryReply) -> Response {
        let (holders, sizes, of_record, records_known) = match reply {
            DirectoryReply::CopiesLocated {
                holders,
                sizes,
                of_record,
                ..
            } => (holders, sizes, of_record, true),
            DirectoryReply::Located { holders, sizes, .. } => (holders, sizes, None, false),
            DirectoryReply::Unavailable { reason } => {
                return Response::Error(StoreError::DirectoryUnavailable(reason));
            }
            DirectoryReply::Done | DirectoryReply::Conflict { .. } => {
                (Vec::new(), None, None, false)
            }
        };
        let members = self.cluster_members();
        let record_holders = of_record.as_ref().map_or(&[][..], |r| &r.holders[..]);
        let copies = holders
            .into_iter()
            .map(|node| CopyView {
                node,
                failure_domain: members
                    .iter()
                    .find(|m| m.node == node)
                    .map(|m| m.failure_domain.clone())
                    .unwrap_or_default(),
                of_record: record_holders.contains(&node),
            })
            .collect();
        let wanted = if records_known {
            of_record.map(|r| r.wanted)
        } else {
            self.replicas_wanted(id)
        };
        Response::Copies {
            copies,
            wanted,
            sizes: sizes.map(|s| (s.data_size, s.metadata_size)),
            records_known,
        }
    }

    /// What replication waits for, one line each.
    pub(super) fn pending_replica_work(&self, lines: &mut Vec<String>) {
        for (id, wait) in &self.replicas.waits {
            lines.push(format!(
                "put of {id} by {} waits for {} copies ({} so far)",
                wait.client, wait.wanted, wait.copies
            ));
        }
        for ((client, _), id) in &self.replicas.unanswered {
            lines.push(format!(
                "put of {id} by {client} with copies is not answered yet"
            ));
        }
    }

    /// Every copy of record is held as one in the store.
    pub(super) fn check_replica_invariants(&self) {
        for id in &self.replicas.of_record {
            assert!(
                self.store.is_record(id),
                "copy of record {id} is held as one in the store"
            );
            assert!(self.replicas.wanted.contains_key(id), "{id} wants copies");
        }
        assert_eq!(self.replicas.waits.len(), self.replicas.by_request.len());
    }
}
