//! Replicas of record, placement and repair: the registry's rules for objects put with
//! `replicas = k`.
//!
//! - **Record**: the first [`DirectoryRequest::PublishReplicated`] of an object opens its
//!   record: `k` wanted, the publisher its origin and first copy of record. Only nodes that
//!   publish with `PublishReplicated` hold copies of record (they keep them until a delete);
//!   other holders are caches and do not count.
//! - **Placement**: at once, the registry picks `k − 1` targets (see [`super::placement`]) and
//!   sends each a [`DirectoryEvent::Replicate`]; the target fetches the object over the usual
//!   fetch path and publishes its copy with `PublishReplicated`. So replication adds no peer
//!   message at all, and placement and repair live in the one place that sees every member.
//!   A target that has not published within [`ReplicationLimits::target_timeout`] is given up.
//!   A target that cannot take its copy (no room, its fetch failed) says so at once
//!   ([`DirectoryRequest::DeclineReplica`]): it is given up then, the copy placed elsewhere at
//!   once, and the node is not asked for that object again within a target timeout.
//!   When too few nodes fit by the free memory they last reported, the others are asked too:
//!   those never given up on first, then those given up on longest ago (see
//!   [`super::placement::choose_retry_targets`]), so retries go round the nodes.
//! - **Progress**: the origin gets [`DirectoryEvent::Copies`] at every change of the live
//!   copies of record until they reach `k` (what a put with `wait_replicas` waits for).
//! - **Repair**: a copy of record lost (its node died: closed connection or silent past the
//!   heartbeat timeout; a target given up; a withdrawal) puts the object in the repair queue.
//!   Repairs are placed from it at a bounded rate of object bytes per second (a token bucket,
//!   [`ReplicationLimits::repair_bytes_per_second`]), so repair cannot starve user traffic.
//!   An object whose last holder died is lost, and counted.
//! - **Returning nodes**: a node that comes back (a new incarnation, or the same daemon after
//!   a partition or outage beyond the heartbeat bound) replays plain publications of what it
//!   holds, listed as holders (caches), then publishes its copies of record again with
//!   `PublishReplicated`. A copy of record is counted again (the record is opened anew if the
//!   registry dropped it) while its object has fewer than `k`; otherwise the node is told
//!   [`DirectoryEvent::Surplus`] and keeps a plain, evictable copy. The same rule answers a
//!   target given up on that publishes late: no object keeps more than `k` copies of record.
//! - **Delete**: [`DirectoryRequest::DeleteEverywhere`] withdraws every holder, tells each
//!   ([`DirectoryEvent::Delete`]) and ends the record.
//! - **A delete stays deleted**: a node may hold a copy of the deleted content and not have
//!   heard the delete: cut off past the heartbeat bound, its connection dropped with the event
//!   unsent, or a fetch of the object (a placement, or a node that still wants its copy of
//!   record) sealed before the delete and published after it. So the delete of an object with
//!   a record leaves a tombstone: the id, the deleted content's digest, and the nodes known
//!   to hold no stale copy (the one that deleted, then every node that withdraws the id).
//!   While it lasts ([`ReplicationLimits::tombstone_lifetime`], never under a target timeout
//!   plus the heartbeat bound), a publication of that content from any other node (a replayed
//!   plain one, or `PublishReplicated`) is answered with [`DirectoryEvent::Delete`], not
//!   listed, and opens no record: no copy is placed. A `PublishReplicated` of the content
//!   from a node known to hold no stale copy is a new put, and ends the tombstone. So putting
//!   the very same bytes under the id again within the lifetime works on the node that
//!   deleted it (or one that withdrew it since), and is deleted again elsewhere. At most
//!   [`ReplicationLimits::max_tombstones`] are kept; beyond, the oldest go (counted).
//!
//! The records live in the registry's memory: a restarted head starts without them (nodes'
//! replays publish plain copies) and learns them again as each node, once the directory
//! answers it again, publishes its copies of record anew (`publish_copies_of_record_again` in
//! the node): the first such publication opens the record (its `k` the largest published),
//! and an object found short of copies is repaired. Until every holder has come back the
//! registry may count fewer copies than exist (and place extra ones, answered later with
//! [`DirectoryEvent::Surplus`]); an object none of whose holders of record comes back is not
//! known to it at all.
//!
//! [`DirectoryRequest::PublishReplicated`]: crate::directory::DirectoryRequest::PublishReplicated
//! [`DirectoryRequest::DeleteEverywhere`]: crate::directory::DirectoryRequest::DeleteEverywhere
//! [`DirectoryRequest::DeclineReplica`]: crate::directory::DirectoryRequest::DeclineReplica

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::expiring::Expiring;
use super::placement::{choose_retry_targets, choose_targets, domain_key, Candidate};
use super::{ConnId, FromRegistry, Registry, RegistryOutput, WireOpId};
use crate::digest::ContentDigest;
use crate::directory::{DirectoryEvent, DirectoryReply};
use crate::ids::{NodeId, ObjectId};
use crate::time::Instant;

/// Most copies one object may ask for.
pub const MAX_REPLICAS: u8 = 16;

/// Limits of replication and repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationLimits {
    /// Object bytes per second repairs may start (the bucket holds one second's worth, or one
    /// object when larger).
    pub repair_bytes_per_second: u64,
    /// A target that has not published its copy within this time is given up (and replaced).
    pub target_timeout: Duration,
    /// Most objects with a replica record.
    pub max_records: usize,
    /// How long a delete's tombstone lasts (see the module doc); at least a target timeout
    /// plus the heartbeat bound, whatever is set.
    pub tombstone_lifetime: Duration,
    /// Most tombstones kept (0: none, so a copy of record that missed a delete comes back).
    pub max_tombstones: usize,
}

impl Default for ReplicationLimits {
    fn default() -> Self {
        Self {
            repair_bytes_per_second: 1 << 30,
            target_timeout: Duration::from_secs(60),
            max_records: 1 << 24,
            tombstone_lifetime: Duration::from_secs(600),
            max_tombstones: 1 << 20,
        }
    }
}

/// Counters and gauges of replication (what the head's metrics show).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicationStats {
    /// Objects with a replica record.
    pub replicated_objects: u64,
    /// Of those, objects with fewer live copies of record than wanted.
    pub under_replicated_objects: u64,
    /// Objects waiting in the repair queue.
    pub repairs_queued: u64,
    /// Copies placed at a put.
    pub copies_placed: u64,
    /// Copies placed by repair.
    pub repairs_started: u64,
    /// Object bytes repairs moved (started).
    pub repair_bytes: u64,
    /// Targets given up after `target_timeout`.
    pub targets_timed_out: u64,
    /// Objects whose every holder died.
    pub objects_lost: u64,
    /// Copies of record published when their object had enough already (told
    /// [`DirectoryEvent::Surplus`]: kept as plain copies).
    #[serde(default)]
    pub surplus_copies: u64,
    /// Targets that declined their copy (no room, a failed fetch) and were replaced at once.
    #[serde(default)]
    pub targets_declined: u64,
    /// Deleted objects whose tombstone is kept (see the module doc).
    #[serde(default)]
    pub tombstones: u64,
    /// Tombstones dropped before their time because [`ReplicationLimits::max_tombstones`]
    /// were kept.
    #[serde(default)]
    pub tombstones_dropped: u64,
    /// Publications of deleted content answered with [`DirectoryEvent::Delete`].
    #[serde(default)]
    pub deletes_repeated: u64,
}

/// One object's replica record.
#[derive(Debug, Clone)]
struct Record {
    wanted: u8,
    /// The node whose put opened the record; told of progress until complete.
    origin: NodeId,
    /// Whether the origin heard that every copy exists.
    complete: bool,
    /// Object bytes (data and metadata).
    bytes: u64,
    /// The content's digest: a delete's tombstone names it even when no holder is listed
    /// then (every holder of record cut off past the heartbeat bound).
    digest: ContentDigest,
    /// Live nodes holding a copy of record.
    of_record: BTreeSet<NodeId>,
    /// Targets asked to replicate, with their deadlines.
    pending: BTreeMap<NodeId, Instant>,
    /// Targets given up on, with when: not asked again while another node can take the copy,
    /// then again the one given up on longest ago first.
    given_up: BTreeMap<NodeId, Instant>,
    /// Targets that declined, until when they are not asked again (see `Replication::declines`).
    declined: BTreeMap<NodeId, Instant>,
}

/// Most nodes a tombstone lists as holding no stale copy (beyond, a node's new put of the same
/// bytes is deleted again, as elsewhere).
const MAX_CLEARED: usize = 1024;

/// What a delete leaves behind (see the module doc).
#[derive(Debug, Clone)]
struct Tombstone {
    /// The deleted content.
    digest: ContentDigest,
    /// Nodes known to hold no stale copy: the one that deleted, and those that withdrew the
    /// id since.
    cleared: BTreeSet<NodeId>,
}

/// The registry's replication state.
#[derive(Debug)]
pub(super) struct Replication {
    limits: ReplicationLimits,
    records: BTreeMap<ObjectId, Record>,
    /// Free bytes each member last reported.
    free_bytes: BTreeMap<NodeId, u64>,
    /// Under-replicated objects waiting for repair, in order.
    repair_queue: BTreeSet<ObjectId>,
    /// Queued objects no node could take at the last pass (every member holds a copy or is
    /// asked for one): not due again until something changes (a member joins or leaves, a copy is published or given up), so an object that
    /// cannot be placed neither spins the timer nor blocks the ones queued behind it.
    unplaceable: BTreeSet<ObjectId>,
    /// Targets' deadlines, earliest first.
    deadlines: BTreeSet<(Instant, ObjectId, NodeId)>,
    /// When declined targets may be asked again, earliest first: an object no other node can
    /// take is offered to a node that declined it once per target timeout, as one that timed
    /// out would be, never in a loop of instant refusals.
    declines: BTreeSet<(Instant, ObjectId, NodeId)>,
    /// Deletes' tombstones (the oldest go first when full).
    tombstones: Expiring<Tombstone>,
    /// Records whose every holder of record went (`objects_lost`), by the content's digest,
    /// until a tombstone's lifetime ends: a holder that was only cut off publishes the content
    /// again when it returns, so a delete meanwhile still leaves a tombstone. At most
    /// [`ReplicationLimits::max_tombstones`], the oldest forgotten first.
    lost: Expiring<ContentDigest>,
    /// Repair budget in bytes (negative: debt after an object larger than a second's worth).
    tokens: i128,
    tokens_at: Option<Instant>,
    stats: ReplicationStats,
}

impl Replication {
    pub(super) fn new(limits: ReplicationLimits) -> Self {
        Self {
            limits,
            records: BTreeMap::new(),
            free_bytes: BTreeMap::new(),
            repair_queue: BTreeSet::new(),
            unplaceable: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            declines: BTreeSet::new(),
            tombstones: Expiring::default(),
            lost: Expiring::default(),
            tokens: i128::from(limits.repair_bytes_per_second),
            tokens_at: None,
            stats: ReplicationStats::default(),
        }
    }

    /// When repair or a target's deadline next needs [`Registry::handle_timeout`].
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let deadline = [self.deadlines.first(), self.declines.first()]
            .into_iter()
            .flatten()
            .map(|&(at, _, _)| at)
            .min();
        let repair = self.next_placeable().map(|id| self.refill_at(id));
        match (deadline, repair) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first queued object not known to be unplaceable.
    fn next_placeable(&self) -> Option<&ObjectId> {
        self.repair_queue
            .iter()
            .find(|id| !self.unplaceable.contains(id))
    }

    /// When the bucket holds enough for the repair of `id`.
    fn refill_at(&self, id: &ObjectId) -> Instant {
        let at = self.tokens_at.unwrap_or(Instant::ZERO);
        let needed = self.records.get(id).map_or(0, |r| self.cost(r.bytes));
        if self.tokens >= needed {
            return at;
        }
        let rate = u128::from(self.limits.repair_bytes_per_second.max(1));
        let missing = u128::try_from(needed - self.tokens).unwrap_or(u128::MAX);
        let nanos = missing.saturating_mul(1_000_000_000).div_ceil(rate);
        at + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// What a repair of `bytes` takes from the bucket: at most a full bucket, so one object
    /// larger than a second's worth still goes (and leaves a debt).
    fn cost(&self, bytes: u64) -> i128 {
        i128::from(bytes.min(self.limits.repair_bytes_per_second).max(1))
    }

    fn refill(&mut self, now: Instant) {
        let capacity = i128::from(self.limits.repair_bytes_per_second);
        let at = *self.tokens_at.get_or_insert(now);
        let elapsed = now.saturating_since(at);
        let gained =
            elapsed.as_nanos() * u128::from(self.limits.repair_bytes_per_second) / 1_000_000_000;
        self.tokens = (self.tokens + i128::try_from(gained).unwrap_or(i128::MAX)).min(capacity);
        self.tokens_at = Some(now);
    }

    /// The counters, with the gauges computed now.
    pub(super) fn stats(&self) -> ReplicationStats {
        let mut stats = self.stats.clone();
        stats.replicated_objects = self.records.len() as u64;
        stats.under_replicated_objects = self
            .records
            .values()
            .filter(|r| r.of_record.len() < usize::from(r.wanted))
            .count() as u64;
        stats.repairs_queued = self.repair_queue.len() as u64;
        stats.tombstones = self.tombstones.len() as u64;
        stats
    }

    /// The copies of record `id` wants and the live nodes holding one.
    pub(super) fn copies_of_record(&self, id: &ObjectId) -> Option<(u8, Vec<NodeId>)> {
        self.records
            .get(id)
            .map(|r| (r.wanted, r.of_record.iter().copied().collect()))
    }
}

impl Registry {
    /// `node` published a copy of record of `id`, of `bytes` with `digest` (the publication
    /// itself was accepted).
    pub(super) fn copy_of_record_published(
        &mut self,
        now: Instant,
        node: NodeId,
        id: ObjectId,
        (bytes, digest): (u64, ContentDigest),
        replicas: u8,
        free_bytes: u64,
    ) {
        let replicas = replicas.clamp(1, MAX_REPLICAS);
        let replication = &mut self.replication;
        replication.free_bytes.insert(node, free_bytes);
        // Published by a node known to hold no stale copy (`answered_as_deleted` answered
        // the others): a new put of the content.
        replication.tombstones.remove(&id);
        if !replication.records.contains_key(&id)
            && replication.records.len() >= replication.limits.max_records
        {
            // Kept as a plain publication: the record table is full.
            return;
        }
        if let Some(record) = replication.records.get_mut(&id) {
            let wanted = usize::from(record.wanted.max(replicas));
            if !record.of_record.contains(&node) && record.of_record.len() >= wanted {
                // Enough copies of record already (this node came back after repair replaced
                // it, or a target given up published late): its copy is a plain one.
                if let Some(deadline) = record.pending.remove(&node) {
                    replication.deadlines.remove(&(deadline, id, node));
                }
                replication.stats.surplus_copies += 1;
                if let Some(member) = self.members.get(&node) {
                    self.outputs.push_back(RegistryOutput::Send {
                        conn: member.conn,
                        message: FromRegistry::Event(DirectoryEvent::Surplus { id }),
                    });
                }
                return;
            }
        }
        let fresh = !replication.records.contains_key(&id);
        if fresh {
            // A holder of a lost record returned (or the id was put again): a record again.
            replication.lost.remove(&id);
        }
        let record = replication.records.entry(id).or_insert_with(|| Record {
            wanted: replicas,
            origin: node,
            complete: false,
            bytes,
            digest,
            of_record: BTreeSet::new(),
            pending: BTreeMap::new(),
            given_up: BTreeMap::new(),
            declined: BTreeMap::new(),
        });
        record.wanted = record.wanted.max(replicas);
        record.of_record.insert(node);
        if let Some(deadline) = record.pending.remove(&node) {
            replication.deadlines.remove(&(deadline, id, node));
        }
        // A put places its copies at once; only repair is rate-limited.
        self.replicas_changed(now, id, fresh);
        self.run_repairs(now);
    }

    /// Something changed for `id`'s copies: tell the origin, and place or queue what is
    /// missing (`at_once`: a put's own copies, not rate-limited).
    fn replicas_changed(&mut self, now: Instant, id: ObjectId, at_once: bool) {
        let live_holders = self.holders_of(&id);
        let Some(record) = self.replication.records.get_mut(&id) else {
            return;
        };
        if live_holders.is_empty() {
            // Every holder is gone: nothing left to copy from (targets still pending had
            // nothing to fetch either).
            for (target, deadline) in &record.pending {
                self.replication.deadlines.remove(&(*deadline, id, *target));
            }
            for (target, until) in &record.declined {
                self.replication.declines.remove(&(*until, id, *target));
            }
            let digest = record.digest;
            self.replication.records.remove(&id);
            self.replication.repair_queue.remove(&id);
            self.replication.stats.objects_lost += 1;
            let until = now + self.tombstone_lifetime();
            let max = self.replication.limits.max_tombstones;
            self.replication.lost.end(now);
            self.replication.lost.insert_bounded(id, digest, until, max);
            return;
        }
        let copies = record.of_record.len();
        if !record.complete {
            if let Some(member) = self.members.get(&record.origin) {
                self.outputs.push_back(RegistryOutput::Send {
                    conn: member.conn,
                    message: FromRegistry::Event(DirectoryEvent::Copies {
                        id,
                        copies: copies as u32,
                    }),
                });
            }
            record.complete = copies >= usize::from(record.wanted);
        }
        let missing = usize::from(record.wanted).saturating_sub(copies + record.pending.len());
        if missing == 0 {
            self.replication.repair_queue.remove(&id);
        } else if at_once {
            let placed = self.place(now, id, missing);
            self.replication.stats.copies_placed += placed as u64;
        } else {
            self.replication.repair_queue.insert(id);
        }
    }

    /// Asks up to `count` new targets to replicate `id`; what cannot be placed now waits in
    /// the repair queue (a member joining, or a deadline, retries it).
    fn place(&mut self, now: Instant, id: ObjectId, count: usize) -> usize {
        let Some(holders) = self.holders.get(&id) else {
            return 0;
        };
        let (sizes, digest) = holders.content();
        let sources: Vec<NodeId> = holders.iter().collect();
        let Some(record) = self.replication.records.get(&id) else {
            return 0;
        };
        let used: BTreeSet<String> = record
            .of_record
            .iter()
            .chain(record.pending.keys())
            .filter_map(|n| self.members.get(n))
            .map(|m| domain_key(m.info.node, &m.info.failure_domain))
            .collect();
        let candidates = |skip_given_up: bool| -> Vec<Candidate> {
            self.members
                .values()
                .filter(|m| {
                    let node = m.info.node;
                    let has_copy =
                        record.of_record.contains(&node) || record.pending.contains_key(&node);
                    let skipped = skip_given_up && record.given_up.contains_key(&node);
                    !has_copy && !skipped && !record.declined.contains_key(&node)
                })
                .map(|m| Candidate {
                    node: m.info.node,
                    failure_domain: m.info.failure_domain.clone(),
                    free_bytes: self.replication.free_bytes.get(&m.info.node).copied(),
                })
                .collect()
        };
        let mut targets = choose_targets(&id, record.bytes, &candidates(true), &used, count);
        if targets.len() < count {
            // Too few fit by their reports: ask the others anyway (a report is as old as its
            // node's last replicated publication, a target given up on may have failed for a
            // passing reason), those given up on longest ago first, so that retries go round
            // the nodes rather than back to the one that failed last.
            let used: BTreeSet<String> = used
                .iter()
                .cloned()
                .chain(
                    targets
                        .iter()
                        .filter_map(|n| self.members.get(n))
                        .map(|m| domain_key(m.info.node, &m.info.failure_domain)),
                )
                .collect();
            let others: Vec<(Candidate, Option<Instant>)> = candidates(false)
                .into_iter()
                .filter(|c| !targets.contains(&c.node))
                .map(|c| {
                    let given_up = record.given_up.get(&c.node).copied();
                    (c, given_up)
                })
                .collect();
            let extra = choose_retry_targets(&id, &others, &used, count - targets.len());
            targets.extend(extra);
        }
        let deadline = now + self.replication.limits.target_timeout;
        let replicas = record.wanted;
        for &target in &targets {
            let conn = self.members[&target].conn;
            let record = self
                .replication
                .records
                .get_mut(&id)
                .expect("looked up above");
            record.pending.insert(target, deadline);
            self.replication.deadlines.insert((deadline, id, target));
            self.outputs.push_back(RegistryOutput::Send {
                conn,
                message: FromRegistry::Event(DirectoryEvent::Replicate {
                    id,
                    sizes,
                    digest,
                    sources: sources.clone(),
                    replicas,
                }),
            });
        }
        if targets.len() < count {
            self.replication.repair_queue.insert(id);
        }
        targets.len()
    }

    /// Places queued repairs while the bucket allows.
    fn run_repairs(&mut self, now: Instant) {
        self.replication.refill(now);
        // Something changed (or time passed): every queued object gets another try.
        self.replication.unplaceable.clear();
        let queued: Vec<ObjectId> = self.replication.repair_queue.iter().copied().collect();
        for id in queued {
            let Some(record) = self.replication.records.get(&id) else {
                self.replication.repair_queue.remove(&id);
                continue;
            };
            let cost = self.replication.cost(record.bytes);
            if self.replication.tokens < cost {
                break;
            }
            let missing = usize::from(record.wanted)
                .saturating_sub(record.of_record.len() + record.pending.len());
            let bytes = record.bytes;
            self.replication.repair_queue.remove(&id);
            if missing == 0 {
                continue;
            }
            let placed = self.place(now, id, missing);
            if placed == 0 {
                // No node can take it now: it stays queued (`place` queued it again) until
                // the next change, and the objects behind it go on.
                self.replication.unplaceable.insert(id);
                continue;
            }
            self.replication.tokens -= cost * placed as i128;
            self.replication.stats.repairs_started += placed as u64;
            self.replication.stats.repair_bytes += bytes * placed as u64;
        }
    }

    /// Time passed: targets past their deadline are given up, then repairs run.
    pub(super) fn replication_timeout(&mut self, now: Instant) {
        while let Some(&(at, id, node)) = self.replication.deadlines.first() {
            if at > now {
                break;
            }
            self.replication.deadlines.remove(&(at, id, node));
            if let Some(record) = self.replication.records.get_mut(&id) {
                record.pending.remove(&node);
                record.given_up.insert(node, now);
                self.replication.stats.targets_timed_out += 1;
                self.replicas_changed(now, id, false);
            }
        }
        // Declined targets may be asked again (`run_repairs` gives every queued object
        // another try).
        while let Some(&(at, id, node)) = self.replication.declines.first() {
            if at > now {
                break;
            }
            self.replication.declines.remove(&(at, id, node));
            if let Some(record) = self.replication.records.get_mut(&id) {
                record.declined.remove(&node);
            }
        }
        self.run_repairs(now);
    }

    /// `node` declined the copy of `id` it was asked for: it is given up at once and the copy
    /// placed elsewhere (at once while the put's own copies are being made, else through the
    /// repair queue); `node` is not asked for `id` again within a target timeout. A decline
    /// of a node no longer pending (given up already, or never asked) changes nothing.
    pub(super) fn replica_declined(&mut self, now: Instant, node: NodeId, id: ObjectId) {
        let until = now + self.replication.limits.target_timeout;
        let Some(record) = self.replication.records.get_mut(&id) else {
            return;
        };
        let Some(deadline) = record.pending.remove(&node) else {
            return;
        };
        self.replication.deadlines.remove(&(deadline, id, node));
        record.given_up.insert(node, now);
        if let Some(earlier) = record.declined.insert(node, until) {
            self.replication.declines.remove(&(earlier, id, node));
        }
        self.replication.declines.insert((until, id, node));
        self.replication.stats.targets_declined += 1;
        let at_once = !record.complete;
        self.replicas_changed(now, id, at_once);
        self.run_repairs(now);
    }

    /// `node` is gone (dead or left): its copies of record and pending targets are lost.
    pub(super) fn replicas_member_lost(&mut self, now: Instant, node: NodeId) {
        self.replication.free_bytes.remove(&node);
        let affected: Vec<ObjectId> = self
            .replication
            .records
            .iter()
            .filter(|(_, r)| {
                r.of_record.contains(&node)
                    || r.pending.contains_key(&node)
                    || r.declined.contains_key(&node)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in affected {
            let record = self.replication.records.get_mut(&id).expect("listed above");
            // A node that comes back (a new incarnation) may have room: asked again.
            if let Some(until) = record.declined.remove(&node) {
                self.replication.declines.remove(&(until, id, node));
            }
            record.of_record.remove(&node);
            if let Some(deadline) = record.pending.remove(&node) {
                self.replication.deadlines.remove(&(deadline, id, node));
            }
            self.replicas_changed(now, id, false);
        }
        self.run_repairs(now);
    }

    /// A member joined: queued repairs may find a target now.
    pub(super) fn replicas_member_joined(&mut self, now: Instant) {
        self.run_repairs(now);
    }

    /// `node` withdrew `id`: a copy of record gone is repaired.
    pub(super) fn replica_withdrawn(&mut self, now: Instant, node: NodeId, id: ObjectId) {
        let Some(record) = self.replication.records.get_mut(&id) else {
            return;
        };
        if record.of_record.remove(&node) {
            self.replicas_changed(now, id, false);
            self.run_repairs(now);
        }
    }

    /// `node` deletes `id` everywhere: every other holder is told, every listing withdrawn,
    /// and the record ends, leaving a tombstone when it had one (see the module doc).
    pub(super) fn delete_everywhere(&mut self, node: NodeId, id: ObjectId) {
        let holders = self.holders_of(&id);
        if let Some(record) = self.replication.records.remove(&id) {
            for (target, deadline) in record.pending {
                self.replication.deadlines.remove(&(deadline, id, target));
                self.tell_delete(target, node, id);
            }
            for (target, until) in record.declined {
                self.replication.declines.remove(&(until, id, target));
            }
            // The record's own digest: with every holder of record cut off past the heartbeat
            // bound, none is listed now, yet each holds the content and publishes it on return.
            self.add_tombstone(id, record.digest, node);
            self.replication.lost.remove(&id);
        } else {
            let now = self.now;
            self.replication.lost.end(now);
            if let Some(digest) = self.replication.lost.remove(&id) {
                // Every holder of record is cut off now: each returns with the content.
                self.add_tombstone(id, digest, node);
            }
        }
        self.replication.repair_queue.remove(&id);
        for holder in holders {
            self.withdraw(holder, id);
            self.tell_delete(holder, node, id);
        }
    }

    /// How long a tombstone lasts: its configured lifetime, never under a target timeout plus
    /// the heartbeat bound.
    fn tombstone_lifetime(&self) -> Duration {
        let limits = &self.replication.limits;
        limits
            .tombstone_lifetime
            .max(limits.target_timeout + self.config.heartbeat_timeout)
    }

    fn add_tombstone(&mut self, id: ObjectId, digest: ContentDigest, deleter: NodeId) {
        let now = self.now;
        let lifetime = self.tombstone_lifetime();
        let replication = &mut self.replication;
        replication.tombstones.end(now);
        let tombstone = Tombstone {
            digest,
            cleared: BTreeSet::from([deleter]),
        };
        let max = replication.limits.max_tombstones;
        replication.stats.tombstones_dropped +=
            replication
                .tombstones
                .insert_bounded(id, tombstone, now + lifetime, max);
    }

    /// Whether `node`'s publication (request `op` on `conn`) of `digest` under `id` is of
    /// deleted content `node` is not known to have dropped: then it is answered (done),
    /// `node` is told [`DirectoryEvent::Delete`], and the publication is neither listed nor
    /// counted.
    pub(super) fn answered_as_deleted(
        &mut self,
        now: Instant,
        conn: ConnId,
        op: WireOpId,
        node: NodeId,
        id: ObjectId,
        digest: ContentDigest,
    ) -> bool {
        self.replication.tombstones.end(now);
        let Some(tombstone) = self.replication.tombstones.get(&id) else {
            return false;
        };
        if tombstone.digest != digest || tombstone.cleared.contains(&node) {
            return false;
        }
        self.replication.stats.deletes_repeated += 1;
        // Listed by an earlier publication of the content (a replay)? Not any more: the node
        // drops its copy.
        if self.holders.get(&id).is_some_and(|h| h.contains(node)) {
            self.withdraw(node, id);
        }
        for message in [
            FromRegistry::Reply {
                op,
                reply: DirectoryReply::Done,
            },
            FromRegistry::Event(DirectoryEvent::Delete { id }),
        ] {
            self.outputs
                .push_back(RegistryOutput::Send { conn, message });
        }
        true
    }

    /// `node` withdrew `id`: it holds no stale copy of a deleted content any more.
    pub(super) fn tombstone_withdrawn(&mut self, node: NodeId, id: ObjectId) {
        if let Some(tombstone) = self.replication.tombstones.get_mut(&id) {
            if tombstone.cleared.len() < MAX_CLEARED {
                tombstone.cleared.insert(node);
            }
        }
    }

    fn tell_delete(&mut self, holder: NodeId, asking: NodeId, id: ObjectId) {
        if holder == asking {
            return;
        }
        if let Some(member) = self.members.get(&holder) {
            self.outputs.push_back(RegistryOutput::Send {
                conn: member.conn,
                message: FromRegistry::Event(DirectoryEvent::Delete { id }),
            });
        }
    }

    /// Replication counters and gauges.
    pub fn replication_stats(&self) -> ReplicationStats {
        self.replication.stats()
    }

    /// The copies of record `id` wants and the live nodes holding one, if it has a record.
    pub fn copies_of_record(&self, id: &ObjectId) -> Option<(u8, Vec<NodeId>)> {
        self.replication.copies_of_record(id)
    }

    /// Entries [`Registry::check_replication_invariants`] visits: the records of objects
    /// put with replicas.
    pub(super) fn replication_scan_size(&self) -> usize {
        self.replication.records.len()
    }

    /// Asserts replication's consistency with the membership (a bug if it fails).
    pub(super) fn check_replication_invariants(&self) {
        for (id, record) in &self.replication.records {
            for node in record.of_record.iter().chain(record.pending.keys()) {
                assert!(
                    self.members.contains_key(node),
                    "{node} of {id}'s record is a member"
                );
            }
            for (node, deadline) in &record.pending {
                assert!(self
                    .replication
                    .deadlines
                    .contains(&(*deadline, *id, *node)));
            }
        }
        self.replication.tombstones.check_invariants();
        self.replication.lost.check_invariants();
        assert_eq!(
            self.replication.declines.len(),
            self.replication
                .records
                .values()
                .map(|r| r.declined.len())
                .sum::<usize>(),
            "one end per declined target"
        );
        assert_eq!(
            self.replication.deadlines.len(),
            self.replication
                .records
                .values()
                .map(|r| r.pending.len())
                .sum::<usize>(),
            "one deadline per pending target"
        );
    }
}
