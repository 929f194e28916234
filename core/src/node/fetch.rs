//! The fetch manager: client fetches, one coalesced fetch per object, source choice, retries,
//! and admission by free memory and bytes in flight.
//!
//! A client's fetch is a [`FetchWaiter`] over its ids; each id not already here has one
//! [`ObjectFetch`], shared by every waiter that wants it (coalescing). An object fetch goes:
//! `LookingUp` (directory) → `AwaitingPublication` if nobody holds it yet (a one-shot directory
//! subscription, never polling) → `Queued` for admission with a chosen source → `Transferring`
//! → resolved. An object located recently skips `LookingUp`: its holders come from the
//! location cache, and if every one of them fails, the fetch falls back to a lookup without
//! counting a round. A failed source is remembered for the round; when a round has no untried source
//! left, the next round looks the object up again after a backoff, up to
//! `max_source_rounds`. The waiter's deadline always answers the client, whatever the object
//! fetch is doing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::locations::Location;
use super::{
    spread_key, DirectoryPurpose, FetchError, Node, PeerState, SourceFailure, Timer,
    TransferFailure, TransferMode, FETCH_CLIENT,
};
use crate::client_protocol::Response;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryOpId, DirectoryReply, DirectoryRequest};
use crate::error::StoreError;
use crate::ids::{ClientId, NodeId, ObjectId, RequestId, TransferId};
use crate::store::ObjectInfo;
use crate::time::Instant;
use crate::wire::ObjectSizes;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct FetchWaiterId(pub(super) u64);

/// How a client's fetch runs (what its request said besides the ids and the timeout).
#[derive(Debug, Clone, Copy)]
pub(super) struct FetchOptions {
    pub(super) mode: TransferMode,
    /// Wait for a node to publish an object nobody holds yet, instead of failing at once.
    pub(super) wait_for_publication: bool,
    /// The node the caller believes holds the objects: asked first (see `hints`).
    pub(super) hint: Option<NodeId>,
}

/// One client fetch request.
#[derive(Debug)]
pub(super) struct FetchWaiter {
    pub(super) client: ClientId,
    pub(super) request: RequestId,
    pub(super) ids: Vec<ObjectId>,
    results: Vec<Option<Result<ObjectInfo, FetchError>>>,
    /// Positions without a result yet.
    pub(super) remaining: usize,
    pub(super) deadline: Instant,
    /// Wait for a node to publish an object nobody holds yet, instead of failing at once.
    wait_for_publication: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ObjectFetchState {
    LookingUp(DirectoryOpId),
    /// Asking the node the caller named, before any lookup (see `hints`).
    Hinted(TransferId),
    /// Nobody holds it; the directory tells us when someone publishes it.
    AwaitingPublication,
    /// Waiting for admission, with the source chosen.
    Queued(NodeId),
    Transferring(TransferId),
    /// A local client is creating it; its seal resolves the fetch.
    AwaitingLocalSeal,
    /// Pausing before the next round.
    Backoff,
}

/// The fetch of one object, shared by every waiter that wants it.
#[derive(Debug)]
pub(super) struct ObjectFetch {
    waiters: BTreeSet<FetchWaiterId>,
    /// The sizes and digest the id names, once known.
    content: Option<(ObjectSizes, ContentDigest)>,
    holders: Vec<NodeId>,
    /// `holders` and `content` came from the location cache, not from the directory this time.
    from_cache: bool,
    /// How the bytes move (the mode of the client fetch that started this one).
    pub(super) mode: TransferMode,
    /// Sources that failed this round, with why.
    failed: BTreeMap<NodeId, TransferFailure>,
    rounds: u32,
    attempts: u32,
    directory_attempts: u32,
    last_error: Option<SourceFailure>,
    /// Since when the fetch waits for a holder's link to come back (see
    /// `NodeConfig::holder_link_wait`).
    waiting_for_link_since: Option<Instant>,
    state: ObjectFetchState,
}

impl ObjectFetch {
    /// Whether any client fetch wanting this object asked to wait for a publication.
    fn waits_for_publication(&self, waiters: &BTreeMap<FetchWaiterId, FetchWaiter>) -> bool {
        self.waiters.iter().any(|w| {
            waiters
                .get(w)
                .is_some_and(|waiter| waiter.wait_for_publication)
        })
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "{:?} for {} waiters, round {}, {} attempts{}",
            self.state,
            self.waiters.len(),
            self.rounds,
            self.attempts,
            self.last_error
                .as_ref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default()
        )
    }

    /// Whether this fetch, which found no source this round, should wait for a holder's link:
    /// some holder is a member whose link is down, and the fetch has not waited for links
    /// longer than `limit` in all. Starts the wait's clock.
    fn may_wait_for_link(
        &mut self,
        peers: &BTreeMap<NodeId, PeerState>,
        now: Instant,
        limit: Duration,
    ) -> bool {
        let link_down = self
            .holders
            .iter()
            .any(|h| peers.get(h).is_some_and(|p| !p.connected));
        if !link_down {
            return false;
        }
        let since = *self.waiting_for_link_since.get_or_insert(now);
        now < since.saturating_add(limit)
    }

    pub(super) fn is_hinted(&self, tid: TransferId) -> bool {
        self.state == ObjectFetchState::Hinted(tid)
    }

    /// A holder (not the directory) named `holder` and the content: a failure there sends the
    /// fetch to the directory without counting a round, as a stale cached location does.
    pub(super) fn learn_holder(&mut self, holder: NodeId, content: (ObjectSizes, ContentDigest)) {
        self.content = Some(content);
        self.holders = vec![holder];
        self.from_cache = true;
    }

    pub(super) fn transfer_started(&mut self, tid: TransferId) {
        self.attempts += 1;
        self.state = ObjectFetchState::Transferring(tid);
    }

    pub(super) fn transferring(&self) -> Option<TransferId> {
        match self.state {
            ObjectFetchState::Transferring(tid) => Some(tid),
            _ => None,
        }
    }
}

impl Node {
    pub(super) fn start_fetch(
        &mut self,
        client: ClientId,
        request: RequestId,
        ids: Vec<ObjectId>,
        timeout: Option<Duration>,
        options: FetchOptions,
    ) {
        let FetchOptions {
            mode,
            wait_for_publication,
            hint,
        } = options;
        self.stats.fetch_requests += 1;
        let refusal = if ids.len() > self.config.store.max_batch_len {
            Some(StoreError::BadRequest(format!(
                "a fetch names {} ids; the limit is {}",
                ids.len(),
                self.config.store.max_batch_len
            )))
        } else {
            self.refuse_fetch()
        };
        if let Some(error) = refusal {
            let results = vec![Err(FetchError::Store(error)); ids.len()];
            self.reply(client, request, Response::Fetched(results));
            return;
        }
        // A zero timeout polls: what live nodes hold now is fetched (bounded by the transfers'
        // own timeouts and retries, not by the zero), and an id nobody holds fails at once.
        let (timeout, wait_for_publication) = match timeout {
            Some(Duration::ZERO) => (None, false),
            other => (other, wait_for_publication),
        };
        let deadline = timeout.map_or(Instant::NEVER, |t| self.now + t);
        let waiter_id = FetchWaiterId(self.next_waiter);
        self.next_waiter += 1;
        let mut waiter = FetchWaiter {
            client,
            request,
            results: vec![None; ids.len()],
            remaining: ids.len(),
            ids,
            deadline,
            wait_for_publication,
        };
        // Objects already here are answered at once; the others join (or start) a fetch.
        let mut missing = BTreeSet::new();
        for position in 0..waiter.ids.len() {
            let id = waiter.ids[position];
            if self.store.contains(&id) {
                waiter.results[position] =
                    Some(self.store.get_now(client, id).map_err(FetchError::from));
                waiter.remaining -= 1;
            } else if self.config.standalone {
                waiter.results[position] = Some(Err(FetchError::NoCluster { id }));
                waiter.remaining -= 1;
            } else {
                missing.insert(id);
            }
        }
        if waiter.remaining == 0 {
            self.reply_to_waiter(waiter);
            return;
        }
        self.waiters.insert(waiter_id, waiter);
        if deadline != Instant::NEVER {
            self.set_timer(deadline, Timer::FetchDeadline(waiter_id));
        }
        for id in missing {
            match self.objects.get_mut(&id) {
                Some(object) => {
                    object.waiters.insert(waiter_id);
                }
                None => {
                    let me = self.config.node;
                    let cached = self
                        .locations
                        .get(&id)
                        .filter(|l| l.holders.iter().any(|&h| h != me));
                    let object = ObjectFetch {
                        waiters: BTreeSet::from([waiter_id]),
                        content: cached.as_ref().map(|l| (l.sizes, l.digest)),
                        holders: cached.as_ref().map_or_else(Vec::new, |l| {
                            l.holders.iter().copied().filter(|&h| h != me).collect()
                        }),
                        from_cache: cached.is_some(),
                        mode,
                        failed: BTreeMap::new(),
                        rounds: 0,
                        attempts: 0,
                        directory_attempts: 0,
                        waiting_for_link_since: None,
                        last_error: None,
                        state: ObjectFetchState::Backoff,
                    };
                    self.objects.insert(id, object);
                    if cached.is_some() {
                        self.stats.location_cache_hits += 1;
                        self.choose_source(id);
                    } else if let Some(hint) = self.usable_hint(hint.or_else(|| id.owner())) {
                        let tid = self.ask_hinted(id, hint, mode);
                        let object = self.objects.get_mut(&id).expect("inserted above");
                        object.state = ObjectFetchState::Hinted(tid);
                    } else {
                        self.look_up(id);
                    }
                }
            }
        }
    }

    fn look_up(&mut self, id: ObjectId) {
        let op = self.directory(
            DirectoryRequest::Lookup {
                id,
                subscribe: true,
            },
            Some(DirectoryPurpose::Lookup(id)),
        );
        let object = self
            .objects
            .get_mut(&id)
            .expect("looked up objects are being fetched");
        object.directory_attempts += 1;
        object.state = ObjectFetchState::LookingUp(op);
    }

    pub(super) fn lookup_answered(
        &mut self,
        id: ObjectId,
        op: DirectoryOpId,
        reply: DirectoryReply,
    ) {
        let me = self.config.node;
        let Some(object) = self.objects.get_mut(&id) else {
            // Nobody wants it any more; drop the subscription the lookup may have made.
            self.directory(DirectoryRequest::Unsubscribe { id }, None);
            return;
        };
        if object.state != ObjectFetchState::LookingUp(op) {
            return;
        }
        match reply {
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
            } => {
                object.directory_attempts = 0;
                let mut holders: Vec<NodeId> = holders.into_iter().filter(|&h| h != me).collect();
                holders.sort();
                holders.dedup();
                let waits = object.waits_for_publication(&self.waiters);
                match sizes.zip(digest) {
                    Some((sizes, digest)) if !holders.is_empty() => {
                        object.content = Some((sizes, digest));
                        object.holders = holders.clone();
                        object.from_cache = false;
                        self.locations.insert(
                            id,
                            Location {
                                holders,
                                sizes,
                                digest,
                            },
                        );
                        self.choose_source(id);
                    }
                    _ => {
                        object.state = ObjectFetchState::AwaitingPublication;
                        // Nobody holds it. Unless a waiter asked to wait for a publication, it
                        // fails after a short grace (a seal elsewhere may be publishing it right
                        // now), not at its deadline.
                        if !waits {
                            let at = self.now + self.config.publication_grace;
                            self.set_timer(at, Timer::PublicationGrace(id));
                        }
                    }
                }
            }
            DirectoryReply::Done
            | DirectoryReply::Conflict { .. }
            | DirectoryReply::Unavailable { .. } => {
                let reason = match reply {
                    DirectoryReply::Unavailable { reason } => reason,
                    _ => "unexpected reply to a lookup".into(),
                };
                if object.directory_attempts >= self.config.max_directory_attempts {
                    self.resolve(id, Err(FetchError::DirectoryUnavailable { id, reason }));
                } else {
                    object.last_error = Some(SourceFailure::Directory { reason });
                    object.state = ObjectFetchState::Backoff;
                    let at = self.now + self.config.retry_backoff * object.directory_attempts;
                    self.set_timer(at, Timer::ObjectRetry(id));
                }
            }
        }
    }

    pub(super) fn object_published(
        &mut self,
        id: ObjectId,
        holder: NodeId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) {
        let Some(object) = self.objects.get_mut(&id) else {
            return;
        };
        if object.state != ObjectFetchState::AwaitingPublication || holder == self.config.node {
            return;
        }
        object.content = Some((sizes, digest));
        object.holders = vec![holder];
        object.from_cache = false;
        self.cancel_timer(Timer::PublicationGrace(id));
        self.locations.insert(
            id,
            Location {
                holders: vec![holder],
                sizes,
                digest,
            },
        );
        self.choose_source(id);
    }

    /// The directory says `holder` published `id` (this node learns locations): remembered
    /// with the holders already known for that content, so a first fetch goes straight to a
    /// holder. Nothing changes for an object held here or being fetched.
    pub(super) fn location_learned(
        &mut self,
        id: ObjectId,
        holder: NodeId,
        sizes: ObjectSizes,
        digest: ContentDigest,
    ) {
        if holder == self.config.node || self.store.contains(&id) || self.objects.contains_key(&id)
        {
            return;
        }
        self.stats.locations_learned += 1;
        self.locations.add_holder(id, holder, sizes, digest);
    }

    pub(super) fn publication_grace_over(&mut self, id: ObjectId) {
        let Some(object) = self.objects.get(&id) else {
            return;
        };
        if object.state != ObjectFetchState::AwaitingPublication {
            return;
        }
        let waits = object.waits_for_publication(&self.waiters);
        if !waits {
            self.directory(DirectoryRequest::Unsubscribe { id }, None);
            self.resolve(id, Err(FetchError::NotFound { id }));
        }
    }

    /// `peer`'s connection came up: fetches pausing because none of their holders was
    /// connected try again now instead of at the end of their pause (a holder that just
    /// restarted, or a first fetch from a node not yet connected).
    pub(super) fn wake_fetches_waiting_for(&mut self, peer: NodeId) {
        let waiting: Vec<ObjectId> = self
            .objects
            .iter()
            .filter(|(_, o)| o.state == ObjectFetchState::Backoff && o.holders.contains(&peer))
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            self.cancel_timer(Timer::ObjectRetry(id));
            self.choose_source(id);
        }
    }

    pub(super) fn retry_object(&mut self, id: ObjectId) {
        if self
            .objects
            .get(&id)
            .is_some_and(|o| o.state == ObjectFetchState::Backoff)
        {
            self.look_up(id);
        }
    }

    /// Picks the least busy holder not failed this round, or starts the next round.
    pub(super) fn choose_source(&mut self, id: ObjectId) {
        let object = self
            .objects
            .get_mut(&id)
            .expect("a source is chosen for a fetched object");
        let peers = &self.peers;
        let source = object
            .holders
            .iter()
            .copied()
            .filter(|h| !object.failed.contains_key(h))
            .filter(|h| peers.get(h).is_some_and(|p| p.connected))
            .min_by_key(|h| (peers[h].active, spread_key(&id, *h)));
        let wait_for_link = source.is_none()
            && !object.from_cache
            && object.may_wait_for_link(peers, self.now, self.config.holder_link_wait);
        match source {
            Some(source) => {
                if let Some(error) = self.refuse_queued_transfer() {
                    self.resolve(id, Err(FetchError::Store(error)));
                    return;
                }
                let object = self.objects.get_mut(&id).expect("checked above");
                object.state = ObjectFetchState::Queued(source);
                self.admission.push_back(id);
                self.pump_admission();
            }
            None if object.from_cache => {
                // The remembered holders are gone or no longer have it: ask the directory,
                // as if this fetch had just started.
                object.from_cache = false;
                object.failed.clear();
                object.last_error = None;
                self.stats.stale_locations += 1;
                self.locations.remove(&id);
                self.look_up(id);
            }
            None if wait_for_link => {
                // Every untried holder is unreachable, but a member's link is only being
                // re-dialled: wait for it (`wake_fetches_waiting_for`), looking again now and then,
                // without counting the round.
                object.failed.clear();
                object.state = ObjectFetchState::Backoff;
                self.stats.fetches_waiting_for_links += 1;
                // Looking again as soon as a round would (another node may hold it by now),
                // then less often the longer the wait: at most every ten backoffs.
                let backoff = self.config.retry_backoff;
                let waited = object
                    .waiting_for_link_since
                    .map_or(Duration::ZERO, |since| self.now.saturating_since(since));
                let at = self.now + waited.clamp(backoff, backoff * 10);
                self.set_timer(at, Timer::ObjectRetry(id));
            }
            None => {
                object.rounds += 1;
                if object.rounds >= self.config.max_source_rounds {
                    let last_error = object
                        .last_error
                        .clone()
                        .unwrap_or(SourceFailure::NoConnectedHolder)
                        .into();
                    let attempts = object.attempts;
                    self.resolve(
                        id,
                        Err(FetchError::SourcesFailed {
                            id,
                            attempts,
                            last_error,
                        }),
                    );
                } else {
                    if object.last_error.is_none() {
                        object.last_error = Some(SourceFailure::NoConnectedHolder);
                    }
                    object.failed.clear();
                    object.state = ObjectFetchState::Backoff;
                    let at = self.now + self.config.retry_backoff * object.rounds;
                    self.set_timer(at, Timer::ObjectRetry(id));
                }
            }
        }
    }

    /// Starts queued transfers, in order, while memory and the bytes-in-flight cap allow.
    pub(super) fn pump_admission(&mut self) {
        while let Some(&id) = self.admission.front() {
            let Some(object) = self.objects.get(&id) else {
                self.admission.pop_front();
                continue;
            };
            let ObjectFetchState::Queued(source) = object.state else {
                self.admission.pop_front();
                continue;
            };
            let (sizes, digest) = object.content.expect("queued objects have sizes");
            if !self.peers.get(&source).is_some_and(|p| p.connected) {
                self.admission.pop_front();
                self.source_failed(
                    id,
                    source,
                    TransferFailure::DisconnectedWhileQueued { holder: source },
                );
                continue;
            }
            let block_len = sizes
                .total()
                .and_then(crate::alloc::block_len_for)
                .unwrap_or(u64::MAX);
            if self.bytes_in_flight > 0
                && self.bytes_in_flight.saturating_add(block_len) > self.config.max_bytes_in_flight
            {
                break;
            }
            match self.store.create(
                self.now,
                FETCH_CLIENT,
                id,
                sizes.data_size,
                sizes.metadata_size,
            ) {
                Ok(info) => {
                    self.admission.pop_front();
                    let object = self.objects.get_mut(&id).expect("checked above");
                    object.attempts += 1;
                    let mode = object.mode;
                    let tid = self.start_transfer(id, source, (sizes, digest), info, mode);
                    let object = self.objects.get_mut(&id).expect("checked above");
                    object.state = ObjectFetchState::Transferring(tid);
                }
                // Transfers in flight will free memory (or make objects evictable) when they
                // end; evicted blocks waiting for their removal to be durable, and objects being
                // spilled, when that completes (both pump the admission again).
                Err(StoreError::OutOfMemory { .. }) if self.memory_will_be_freed() => break,
                Err(StoreError::ObjectExists(_)) => {
                    self.admission.pop_front();
                    self.created_here_meanwhile(id);
                }
                Err(error) => {
                    self.admission.pop_front();
                    self.resolve(id, Err(FetchError::Store(error)));
                }
            }
        }
    }

    /// Whether memory is on its way to being free without evicting more: transfers in flight
    /// end, removals become durable, spill writes complete.
    pub(super) fn memory_will_be_freed(&self) -> bool {
        self.bytes_in_flight > 0 || self.store.pending_free_bytes() > 0
    }

    /// `id` could not be created for its transfer because it exists here: sealed (the fetch is
    /// done) or being created by a local client (whose seal resolves the fetch).
    pub(super) fn created_here_meanwhile(&mut self, id: ObjectId) {
        if self.store.contains(&id) {
            self.resolve(id, Ok(()));
        } else if let Some(object) = self.objects.get_mut(&id) {
            object.state = ObjectFetchState::AwaitingLocalSeal;
        }
    }

    /// The hinted request `tid` for `id` to `source` got no usable answer: ask the directory.
    pub(super) fn hinted_fetch_failed(
        &mut self,
        id: ObjectId,
        tid: TransferId,
        source: NodeId,
        reason: TransferFailure,
    ) {
        let Some(object) = self.objects.get_mut(&id) else {
            return;
        };
        if !object.is_hinted(tid) {
            return;
        }
        object.last_error = Some(SourceFailure::Hinted {
            holder: source,
            failure: reason,
        });
        if object.waiters.is_empty() {
            self.objects.remove(&id);
            return;
        }
        self.look_up(id);
    }

    /// A transfer of `id` from `source` ended without the object: try elsewhere.
    pub(super) fn source_failed(&mut self, id: ObjectId, source: NodeId, reason: TransferFailure) {
        let Some(object) = self.objects.get_mut(&id) else {
            return;
        };
        object.failed.insert(source, reason.clone());
        object.last_error = Some(SourceFailure::Holder {
            holder: source,
            failure: reason,
        });
        self.locations.forget_holder(&id, source);
        if object.waiters.is_empty() {
            self.objects.remove(&id);
            self.abandoned_transfer_failed(id);
            return;
        }
        self.stats.retries += 1;
        self.choose_source(id);
    }

    /// Whether `id` is being transferred here (with or without a waiter).
    pub(super) fn is_transferring(&self, id: &ObjectId) -> bool {
        self.objects
            .get(id)
            .is_some_and(|o| o.transferring().is_some())
    }

    /// A transfer of `id` ended with the object sealed here.
    pub(super) fn transfer_sealed(&mut self, id: ObjectId) {
        if self.objects.contains_key(&id) {
            self.resolve(id, Ok(()));
        }
    }

    /// An object was sealed here (by a client, or by a transfer): waiting fetches get it.
    pub(super) fn sealed_locally(&mut self, id: ObjectId) {
        let Some(object) = self.objects.get(&id) else {
            return;
        };
        if matches!(object.state, ObjectFetchState::Transferring(_)) {
            return;
        }
        if matches!(object.state, ObjectFetchState::AwaitingPublication) {
            self.directory(DirectoryRequest::Unsubscribe { id }, None);
        }
        self.resolve(id, Ok(()));
    }

    /// Ends the fetch of `id` for every waiter: `Ok` gives each a reference to the local copy.
    pub(super) fn resolve(&mut self, id: ObjectId, outcome: Result<(), FetchError>) {
        let Some(object) = self.objects.remove(&id) else {
            return;
        };
        match object.state {
            ObjectFetchState::AwaitingPublication => self.cancel_timer(Timer::PublicationGrace(id)),
            // Sealed here by a local put while the hinted node had not answered yet: its late
            // reply is ignored (or its lease released) as any ended transfer's.
            ObjectFetchState::Hinted(tid) => self.drop_hinted(tid),
            _ => {}
        }
        for waiter_id in object.waiters {
            let Some(waiter) = self.waiters.get_mut(&waiter_id) else {
                continue;
            };
            for position in 0..waiter.ids.len() {
                if waiter.ids[position] != id || waiter.results[position].is_some() {
                    continue;
                }
                let result = match &outcome {
                    Ok(()) => self
                        .store
                        .get_now(waiter.client, id)
                        .map_err(FetchError::from),
                    Err(error) => Err(error.clone()),
                };
                waiter.results[position] = Some(result);
                waiter.remaining -= 1;
            }
            if waiter.remaining == 0 {
                let waiter = self.waiters.remove(&waiter_id).expect("found above");
                self.cancel_timer(Timer::FetchDeadline(waiter_id));
                self.reply_to_waiter(waiter);
            }
        }
    }

    /// A client's deadline: answer it now with whatever is missing as an error.
    pub(super) fn fetch_deadline(&mut self, waiter_id: FetchWaiterId) {
        let Some(mut waiter) = self.waiters.remove(&waiter_id) else {
            return;
        };
        let now = self.now;
        for position in 0..waiter.ids.len() {
            if waiter.results[position].is_some() {
                continue;
            }
            let id = waiter.ids[position];
            let error = match self.objects.get(&id).map(|o| &o.state) {
                None | Some(ObjectFetchState::AwaitingPublication) => FetchError::NotFound { id },
                Some(state) => FetchError::Timeout {
                    id,
                    stage: stage_name(state).to_string(),
                },
            };
            waiter.results[position] = Some(Err(error));
            waiter.remaining -= 1;
        }
        let ids: BTreeSet<ObjectId> = waiter.ids.iter().copied().collect();
        for id in ids {
            self.waiter_left(id, waiter_id);
        }
        debug_assert!(waiter.deadline <= now);
        self.reply_to_waiter(waiter);
    }

    /// A client went away: its fetches end without a reply (their references are dropped with
    /// the client's others by the store).
    pub(super) fn client_gone(&mut self, client: ClientId) {
        let gone: Vec<FetchWaiterId> = self
            .waiters
            .iter()
            .filter(|(_, waiter)| waiter.client == client)
            .map(|(&waiter_id, _)| waiter_id)
            .collect();
        for waiter_id in gone {
            let waiter = self.waiters.remove(&waiter_id).expect("listed above");
            self.cancel_timer(Timer::FetchDeadline(waiter_id));
            let ids: BTreeSet<ObjectId> = waiter.ids.iter().copied().collect();
            for id in ids {
                self.waiter_left(id, waiter_id);
            }
        }
    }

    /// `waiter_id` no longer wants `id`; a fetch nobody wants stops unless its transfer is
    /// already running (it finishes, and the copy stays here).
    fn waiter_left(&mut self, id: ObjectId, waiter_id: FetchWaiterId) {
        let Some(object) = self.objects.get_mut(&id) else {
            return;
        };
        object.waiters.remove(&waiter_id);
        if !object.waiters.is_empty() {
            if object.state == ObjectFetchState::AwaitingPublication
                && !object.waits_for_publication(&self.waiters)
            {
                // The waiter that waited for a publication left: the others fail after the
                // short grace, as if they had been alone at the lookup.
                let at = self.now + self.config.publication_grace;
                self.set_timer(at, Timer::PublicationGrace(id));
            }
            return;
        }
        match object.state {
            ObjectFetchState::Transferring(_) => {}
            ObjectFetchState::AwaitingPublication => {
                self.objects.remove(&id);
                self.cancel_timer(Timer::PublicationGrace(id));
                self.directory(DirectoryRequest::Unsubscribe { id }, None);
            }
            ObjectFetchState::Hinted(tid) => {
                self.objects.remove(&id);
                self.drop_hinted(tid);
            }
            ObjectFetchState::Queued(_) => {
                self.objects.remove(&id);
                self.admission.retain(|&queued| queued != id);
                // The head of the queue may have changed.
                self.pump_admission();
            }
            ObjectFetchState::LookingUp(_)
            | ObjectFetchState::AwaitingLocalSeal
            | ObjectFetchState::Backoff => {
                self.objects.remove(&id);
                self.cancel_timer(Timer::ObjectRetry(id));
            }
        }
    }

    fn reply_to_waiter(&mut self, waiter: FetchWaiter) {
        let results = waiter
            .results
            .into_iter()
            .map(|r| r.expect("a waiter replies once every position has a result"))
            .collect::<Vec<_>>();
        let counts = &mut self.stats.fetch_results;
        for result in &results {
            match result {
                Ok(_) => counts.ok += 1,
                Err(FetchError::NotFound { .. }) => counts.not_found += 1,
                Err(FetchError::Timeout { .. }) => counts.timeout += 1,
                Err(_) => counts.error += 1,
            }
        }
        self.reply(waiter.client, waiter.request, Response::Fetched(results));
    }
}

fn stage_name(state: &ObjectFetchState) -> &'static str {
    match state {
        ObjectFetchState::LookingUp(_) => "looking it up in the directory",
        ObjectFetchState::Hinted(_) => "asking the node the caller named",
        ObjectFetchState::AwaitingPublication => "waiting for a node to publish it",
        ObjectFetchState::Queued(_) => "queued for admission (memory or bytes in flight)",
        ObjectFetchState::Transferring(_) => "transferring it",
        ObjectFetchState::AwaitingLocalSeal => "waiting for a local client to seal it",
        ObjectFetchState::Backoff => "backing off before retrying",
    }
}
