//! Replicas under the simulator: puts that ask for `k ∈ {2, 3}` copies (half of them waiting
//! for the copies before their reply), placed and repaired by the real registry while nodes
//! crash, links and the head are partitioned and the head restarts.
//!
//! Checked here, from outside the nodes:
//! * **an acknowledged put has its copies**: when a put that waited for `k` copies returns
//!   `Ok`, at least `k` distinct nodes have published a copy of record of it;
//! * **k − 1 losses are survived**: every live node (same incarnation) that had published a
//!   copy of record of an acknowledged object when it was acknowledged still holds it sealed
//!   (copies of record are pinned until a delete), so while at most `k − 1` of those nodes
//!   died, some live node holds the object's bytes; checked whenever a copy leaves a store and
//!   at the end of the run;
//! * **repair converges**: once faults stopped and the directory settled, every object whose
//!   record the registry keeps reaches `min(k, members)` live copies of record within a bound
//!   (unless no member lacking a copy has room for it, the object is larger than a lease and
//!   its extensions surely carry, or the directory named the id with two contents), each held sealed by
//!   its node; and an object a live node holds as a copy of
//!   record has a record unless the head restarted since its first publication;
//! * **surplus copies**: a node told its copy of record is surplus may drop it only while the
//!   registry counts the `k` copies without it; those become the holders the checks follow.
//! * **copies span failure domains**: the nodes are spread over 2 or 3 failure domains (node
//!   `n` in `rack-(n mod domains)`), and a run may crash a whole domain at once. When a put
//!   that waited for `k` copies is acknowledged, its copies of record (the nodes that
//!   published one) span at least `min(k, D)` domains, where `D` counts the domains with a
//!   member that holds a copy or could have been chosen for one: a member whose free-memory
//!   reports (the registry places by them), from its last one before the put to the ack, all
//!   fit the object. Checked only for a put placed in one go: from its start to its ack the
//!   membership did not change (no member lost, joined or restarted, no head restart) and no
//!   target was given up on or declined anywhere, so the registry's first choice is what the
//!   acknowledgement shows;
//! * **a delete stays deleted**: once faults stopped and repair converged, no live node holds
//!   a copy of record of content the registry deleted everywhere (it answered a
//!   `DeleteEverywhere` of the id while that content was the id's), unless the id was put
//!   again since or the head restarted after the content was first published (the registry
//!   then forgot its records and tombstones), or, with a sharded directory, the id's shard
//!   failed over within its replica's lag after taking the delete (the promoted replica never
//!   had it: Redis Cluster's asynchronous replication loses acknowledged writes so).
//!
//! With a sharded directory (`directory::shard`) every directory operation of an object (its
//! copies of record, `LocateCopies`, deletes, placements and repairs) goes to the shard owning
//! its slot, as its records do, and the checks ask that shard's registry: its members, its
//! head restarts and failovers.
//!
//! [`Flaws::copies_overcounted`](super::Flaws) plants a bug the first check exists for (the
//! origin hears of `k` copies at its own publication);
//! [`Flaws::copies_of_record_unpinned`](super::Flaws) one the second (the origin unpins its
//! copy of record, so eviction drops it);
//! [`Flaws::replica_placement_ignored`](super::Flaws) one the convergence check exists for
//! (nodes ignore the registry's placements, so nothing is ever copied or repaired);
//! [`Flaws::placement_ignores_domains`](super::Flaws) one the domain check exists for (the
//! registry never hears the nodes' domains); [`Flaws::no_tombstones`](super::Flaws) one the
//! delete check exists for (the registry keeps no tombstone, so a copy of record that missed
//! the delete is published again and copied anew).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::Rng;
use skyriver_core::client_protocol::{ReplicaPolicy, Request, MAX_INLINE_PUT_BYTES};
use skyriver_core::digest::ContentDigest;
use skyriver_core::directory::{DirectoryEvent, DirectoryNotice, DirectoryOpId, DirectoryReply};
use skyriver_core::{ClientId, Instant, NodeId, ObjectId, ObjectSizes};

use super::clients::Call;
use super::Cluster;
use crate::checker::Content;
use crate::workload;

/// Counters of a run with replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationRunStats {
    /// Puts that asked for more than one copy.
    pub replicated_puts: u64,
    /// Of those, puts whose reply waited for the copies.
    pub waiting_puts: u64,
    /// Waiting puts acknowledged with every copy.
    pub acked: u64,
    /// Waiting puts that failed with too few copies at their deadline.
    pub too_few: u64,
    /// Copies of record published (origins, placements, repairs, replays).
    pub copies_published: u64,
    /// Acknowledged objects some of whose acknowledged holders later died.
    pub acked_with_losses: u64,
    /// Acknowledged objects checked to still have a live holder after losses.
    pub survived_losses: u64,
    /// Records checked converged once faults stopped.
    pub records_converged: u64,
    /// Repairs the registry started (at the end of the run).
    pub repairs_started: u64,
    /// Acknowledged puts whose copies' failure domains were checked (placed in one go).
    pub domain_checks: u64,
    /// Deletes everywhere the registry answered, checked to stay deleted at the end.
    pub deletes_checked: u64,
}

/// What a put asked for.
#[derive(Debug, Clone, Copy)]
struct Intent {
    copies: u8,
    wait_ms: Option<u64>,
}

/// An acknowledged put.
#[derive(Debug, Clone)]
struct Acked {
    copies: u8,
    /// The (node, incarnation) pairs that had published a copy of record at the ack.
    holders: BTreeSet<(NodeId, u32)>,
}

/// A waiting put on its way: what its placement's check compares at the ack.
#[derive(Debug, Clone)]
struct Placing {
    /// The registry's members at the put's start.
    members: Vec<(NodeId, u32)>,
    /// Targets given up on or declined, membership changes and head restarts at the start.
    disruptions: u64,
    /// Each node's lowest free-memory report, from its last one before the put on.
    lowest_free: BTreeMap<NodeId, u64>,
}

/// The replication side of a run.
#[derive(Debug, Default)]
pub(super) struct ReplicationSide {
    /// Puts ask for copies (off unless a test asks for it).
    pub(super) on: bool,
    intents: BTreeMap<ObjectId, Intent>,
    /// Every (node, incarnation) that published a copy of record of each object.
    published: BTreeMap<ObjectId, BTreeSet<(NodeId, u32)>>,
    /// Head crashes counted when each object was first published as a copy of record.
    first_published_head_crashes: BTreeMap<ObjectId, u64>,
    acked: BTreeMap<ObjectId, Acked>,
    /// Objects a client asked to delete (their copies may go).
    deleted: BTreeSet<ObjectId>,
    /// Waiting puts not answered yet.
    placing: BTreeMap<ObjectId, Placing>,
    /// The free memory each node last reported with a publication of record, by the shard of
    /// the directory it went to (each shard's registry places by the reports it received; one
    /// shard unsharded).
    free_reports: BTreeMap<(usize, NodeId), u64>,
    /// `DeleteEverywhere` requests on their way, with the content the id had when sent.
    delete_ops: BTreeMap<(NodeId, u32, DirectoryOpId), (ObjectId, Option<ContentDigest>)>,
    /// Contents the registry deleted everywhere, with when its answer arrived.
    deleted_everywhere: BTreeMap<ObjectId, (ContentDigest, Instant)>,
    /// When each id was last put.
    put_started: BTreeMap<ObjectId, Instant>,
    /// Ids put with two contents: a client put other bytes under the id, or the registry
    /// refused some node's replayed publication of it (another content holds the id).
    two_contents: BTreeSet<ObjectId>,
    /// Violations already reported, by object.
    reported: BTreeSet<ObjectId>,
    pub(super) stats: ReplicationRunStats,
}

impl ReplicationSide {
    /// Puts ask for copies when `on`.
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }
}

impl Cluster {
    /// Counters of the replication side.
    pub fn replication_stats(&self) -> ReplicationRunStats {
        let mut stats = self.replication.stats.clone();
        stats.repairs_started = self
            .all_shards()
            .filter_map(|shard| shard.registry())
            .map(|registry| registry.replication_stats().repairs_started)
            .sum();
        stats
    }

    /// Scripted: client 1 of `node` creates, writes and seals object `n` of `data_size` bytes
    /// asking for `copies` copies (waiting up to `wait_ms` for them when given), and drives
    /// until the seal's reply. Returns the virtual time from the put's start to its reply.
    pub fn put_replicated(
        &mut self,
        node: u32,
        n: u64,
        data_size: u64,
        copies: u8,
        wait_ms: Option<u64>,
    ) -> Duration {
        let id = ObjectId::from_u64(n);
        let sizes = ObjectSizes {
            data_size,
            metadata_size: 0,
        };
        self.replication
            .intents
            .insert(id, Intent { copies, wait_ms });
        self.replication.stats.replicated_puts += 1;
        if wait_ms.is_some() {
            self.replication.stats.waiting_puts += 1;
            self.placing_started(id);
        }
        let started = self.now;
        self.client_put(
            NodeId(node),
            ClientId(super::WORKLOAD_CLIENT_BASE),
            id,
            sizes,
            None,
        );
        self.drive_until(|c| !c.creating(id));
        self.now.saturating_since(started)
    }

    /// A put of the workload, when runs ask for copies: `k ∈ {2, 3}`, half of them waiting
    /// (a few milliseconds), small ones inline half the time. `false`: a plain put.
    pub(super) fn replicated_put(
        &mut self,
        n: NodeId,
        client: ClientId,
        id: ObjectId,
        sizes: ObjectSizes,
    ) -> bool {
        if !self.replication.on || self.rng.gen_bool(0.25) {
            return false;
        }
        let copies = self.rng.gen_range(2..=3);
        let wait_ms = self.rng.gen_bool(0.5).then(|| self.rng.gen_range(2..=10));
        let intent = Intent { copies, wait_ms };
        self.replication.intents.insert(id, intent);
        self.replication.stats.replicated_puts += 1;
        if wait_ms.is_some() {
            self.replication.stats.waiting_puts += 1;
            self.placing_started(id);
        }
        let replicas = ReplicaPolicy { copies, wait_ms };
        let total = sizes.data_size + sizes.metadata_size;
        if total <= MAX_INLINE_PUT_BYTES as u64 && self.next_object % 2 == 0 {
            self.checker.put(id, Content { variant: 0, sizes });
            self.replica_put_started(id, 0);
            let mut data = workload::content_bytes(&id, 0, total as usize);
            let metadata = data.split_off(sizes.data_size as usize);
            let removals = self.nodes[n.0 as usize]
                .removals
                .get(&id)
                .copied()
                .unwrap_or(0);
            self.client_request(
                n,
                client,
                Request::PutReplicated {
                    id,
                    data,
                    metadata,
                    replicas,
                },
                Call::Put {
                    id,
                    sizes,
                    variant: 0,
                    removals,
                },
            );
        } else {
            // Create, write, then `seal_request` makes the seal ask for the copies.
            self.client_put(n, client, id, sizes, None);
        }
        true
    }

    /// The seal a client sends after writing `id`: with the copies its put asked for.
    pub(super) fn seal_request(
        &self,
        id: ObjectId,
        release: bool,
        digest: ContentDigest,
    ) -> Request {
        match self.replication.intents.get(&id) {
            Some(intent) => Request::SealReplicated {
                id,
                release,
                digest,
                replicas: ReplicaPolicy {
                    copies: intent.copies,
                    wait_ms: intent.wait_ms,
                },
            },
            None => Request::Seal {
                id,
                release,
                digest,
            },
        }
    }

    /// A client asked to delete `id`: its copies may go from now on.
    pub(super) fn replica_delete_asked(&mut self, id: ObjectId) {
        if self.replication.on {
            self.replication.deleted.insert(id);
        }
    }

    /// A put of `id` with content `variant` starts (0: the id's first content).
    pub(super) fn replica_put_started(&mut self, id: ObjectId, variant: u32) {
        if self.replication.on {
            self.replication.put_started.insert(id, self.now);
            if variant != 0 {
                self.replication.two_contents.insert(id);
            }
        }
    }

    /// Node `n` (incarnation `inc`) asks the registry (request `op`) to delete `id` everywhere.
    pub(super) fn replica_delete_sent(
        &mut self,
        n: NodeId,
        inc: u32,
        op: DirectoryOpId,
        id: ObjectId,
    ) {
        if !self.replication.on {
            return;
        }
        let content = self
            .registry_of(&id)
            .and_then(|registry| registry.content_of(&id));
        self.replication
            .delete_ops
            .insert((n, inc, op), (id, content));
    }

    /// The directory's shard holding `id`'s records (the one head when unsharded): its
    /// registry places and repairs `id`'s copies.
    fn records_shard(&self, id: &ObjectId) -> &crate::directory::SimDirectory {
        let shard = self.shard_of(id);
        self.all_shards()
            .nth(shard)
            .expect("every shard of an id exists")
    }

    /// Head restarts of the shard holding `id`'s records so far: each forgets its records.
    fn head_crashes_of(&self, id: &ObjectId) -> u64 {
        self.records_shard(id).stats.head_crashes
    }

    /// Membership changes, head restarts, failovers and targets given up on or declined so far,
    /// as seen by the shard that places `id`.
    fn placement_disruptions(&self, id: &ObjectId) -> u64 {
        let shard = self.records_shard(id);
        let d = &shard.stats;
        let replication = shard
            .registry()
            .map(|r| r.replication_stats())
            .unwrap_or_default();
        d.head_crashes
            + d.failovers
            + d.heartbeat_expiries
            + d.reconnects
            + self.stats.crashes
            + replication.targets_timed_out
            + replication.targets_declined
    }

    /// The members of the registry that places `id`.
    fn registry_members(&self, id: &ObjectId) -> Vec<(NodeId, u32)> {
        self.registry_of(id)
            .map(|r| {
                r.members()
                    .iter()
                    .map(|m| (m.node, m.incarnation))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The free-memory reports the registry placing `id` received last, by node.
    fn free_reports_of(&self, id: &ObjectId) -> BTreeMap<NodeId, u64> {
        let shard = self.shard_of(id);
        self.replication
            .free_reports
            .range((shard, NodeId(0))..=(shard, NodeId(u32::MAX)))
            .map(|(&(_, node), &free)| (node, free))
            .collect()
    }

    /// A waiting put of `id` starts: what its placement check compares at the ack.
    fn placing_started(&mut self, id: ObjectId) {
        let placing = Placing {
            members: self.registry_members(&id),
            disruptions: self.placement_disruptions(&id),
            lowest_free: self.free_reports_of(&id),
        };
        self.replication.placing.insert(id, placing);
    }

    /// The acknowledged put of `id` with `copies` copies held by `holders`: they span
    /// `min(copies, D)` failure domains (see the module doc), when it was placed in one go.
    fn check_domains(&mut self, id: ObjectId, copies: u8, holders: &BTreeSet<NodeId>) {
        let Some(placing) = self.replication.placing.remove(&id) else {
            return;
        };
        if self.params.failure_domains == 0
            || placing.disruptions != self.placement_disruptions(&id)
            || placing.members != self.registry_members(&id)
        {
            return;
        }
        let Some(bytes) = self
            .checker
            .contents
            .get(&id)
            .and_then(|c| c.first())
            .map(|c| c.sizes.data_size + c.sizes.metadata_size)
        else {
            return;
        };
        let spanned: BTreeSet<String> = holders
            .iter()
            .map(|&n| self.params.failure_domain(n))
            .collect();
        let possible: BTreeSet<String> = placing
            .members
            .iter()
            .filter(|(n, _)| {
                holders.contains(n) || placing.lowest_free.get(n).is_none_or(|&free| free >= bytes)
            })
            .map(|&(n, _)| self.params.failure_domain(n))
            .collect();
        self.replication.stats.domain_checks += 1;
        let wanted = usize::from(copies).min(possible.len());
        if spanned.len() < wanted {
            self.report_replica(
                id,
                format!(
                    "{id}, acknowledged with {copies} copies on {holders:?}, spans the failure \
                     domains {spanned:?}, though {possible:?} could take one"
                ),
            );
        }
    }

    /// Node `n` publishes a copy of record of `id`, reporting `free_bytes` free.
    pub(super) fn replica_published(&mut self, n: NodeId, inc: u32, id: ObjectId, free_bytes: u64) {
        // The report reaches the registry of `id`'s shard alone: the puts it places see it.
        let shard = self.shard_of(&id);
        self.replication.free_reports.insert((shard, n), free_bytes);
        let placed_there: Vec<ObjectId> = (self.replication.placing.keys())
            .filter(|placing| self.shard_of(placing) == shard)
            .copied()
            .collect();
        for placing in placed_there {
            let placing = self.replication.placing.get_mut(&placing).expect("listed");
            let lowest = placing.lowest_free.entry(n).or_insert(free_bytes);
            *lowest = (*lowest).min(free_bytes);
        }
        let head_crashes = self.head_crashes_of(&id);
        let side = &mut self.replication;
        if side.published.entry(id).or_default().insert((n, inc)) {
            side.stats.copies_published += 1;
        }
        side.first_published_head_crashes
            .entry(id)
            .or_insert(head_crashes);
    }

    /// A put or seal of `id` on node `n` returned `Ok`: a put that waited is acknowledged
    /// with its copies, which must exist.
    pub(super) fn replicated_put_acked(&mut self, n: NodeId, id: ObjectId) {
        let Some(intent) = self.replication.intents.get(&id).copied() else {
            return;
        };
        if intent.wait_ms.is_none() {
            return;
        }
        let holders = self
            .replication
            .published
            .get(&id)
            .cloned()
            .unwrap_or_default();
        let nodes: BTreeSet<NodeId> = holders.iter().map(|&(node, _)| node).collect();
        self.check_domains(id, intent.copies, &nodes);
        self.replication.stats.acked += 1;
        self.record(|| {
            format!(
                "{n}: put of {id} acknowledged with {} copies ({} published)",
                intent.copies,
                nodes.len()
            )
        });
        if nodes.len() < usize::from(intent.copies) {
            let now = self.now;
            self.checker.violation(
                now,
                format!(
                    "{n}: put of {id} acknowledged with {} copies, but only {} nodes published a \
                     copy of record",
                    intent.copies,
                    nodes.len()
                ),
            );
        }
        self.replication.acked.insert(
            id,
            Acked {
                copies: intent.copies,
                holders,
            },
        );
    }

    /// A put or seal of `id` failed because too few copies were made in time.
    pub(super) fn replicated_put_too_few(&mut self, n: NodeId, id: ObjectId, copies: u32) {
        self.replication.placing.remove(&id);
        self.replication.stats.too_few += 1;
        self.record(|| format!("{n}: put of {id} returned with too few copies ({copies})"));
    }

    /// A directory notice on its way into node `n`'s core, as planted flaws change it: `None`
    /// drops it. A [`DirectoryEvent::Surplus`] lets `n`'s copy go: the registry's live copies
    /// of record stand in for it among an acknowledged object's holders.
    pub(super) fn replica_notice(
        &mut self,
        n: NodeId,
        inc: u32,
        notice: DirectoryNotice,
    ) -> Option<DirectoryNotice> {
        if let DirectoryNotice::Event(DirectoryEvent::Surplus { id }) = &notice {
            self.replica_surplus(n, inc, *id);
        }
        if let DirectoryNotice::Event(DirectoryEvent::ReplayRefused { id, .. }) = &notice {
            self.replication.two_contents.insert(*id);
        }
        if let DirectoryNotice::Reply {
            op,
            reply: DirectoryReply::Done,
        } = &notice
        {
            if let Some((id, Some(digest))) = self.replication.delete_ops.remove(&(n, inc, *op)) {
                let now = self.now;
                self.replication
                    .deleted_everywhere
                    .insert(id, (digest, now));
            }
        }
        if let DirectoryNotice::Event(DirectoryEvent::Copies { id, .. }) = &notice {
            if self.flaws.copies_of_record_unpinned {
                // Planted: the origin's copy of record becomes a plain, evictable one.
                self.feed(
                    n,
                    skyriver_core::node::NodeInput::DirectoryEvent {
                        event: DirectoryEvent::Surplus { id: *id },
                    },
                );
            }
        }
        match notice {
            DirectoryNotice::Event(DirectoryEvent::Copies { id, copies })
                if self.flaws.copies_overcounted =>
            {
                let wanted = self.replication.intents.get(&id).map_or(0, |i| i.copies);
                Some(DirectoryNotice::Event(DirectoryEvent::Copies {
                    id,
                    copies: copies.max(u32::from(wanted)),
                }))
            }
            DirectoryNotice::Event(DirectoryEvent::Replicate { .. })
                if self.flaws.replica_placement_ignored =>
            {
                None
            }
            other => Some(other),
        }
    }

    /// Node `n` is told its copy of record of `id` is surplus: it may go. The registry must
    /// count the copies the object wants without it; they become the holders the survival
    /// checks follow.
    fn replica_surplus(&mut self, n: NodeId, inc: u32, id: ObjectId) {
        self.record(|| format!("{n}: its copy of record of {id} is surplus"));
        // What the registry counted when it sent the notice: a holder it counted may have
        // expired since (and the registry then asks for a new copy).
        let shard = self.shard_of(&id);
        let of_record = self.shard_mut(shard).take_surplus_counted(n, &id);
        if let Some(published) = self.replication.published.get_mut(&id) {
            published.remove(&(n, inc));
        }
        let Some(acked) = self.replication.acked.get(&id) else {
            return;
        };
        // A client asked to delete it (the registry may have taken the delete in the same
        // step as this copy's publication, and count none), or it was put with two contents:
        // its copies may go.
        if !acked.holders.contains(&(n, inc))
            || self.replication.deleted.contains(&id)
            || self.named_with_two_contents(&id)
        {
            return;
        }
        // Each counted copy is its node's latest publication of record: a node that crashed
        // since (the registry may count it until its heartbeat bound) is that incarnation,
        // not the one that restarts with a plain copy.
        let published = self.replication.published.get(&id);
        let holders: BTreeSet<(NodeId, u32)> = of_record
            .iter()
            .filter(|&&node| node != n)
            .map(|&node| {
                let inc = published
                    .and_then(|pairs| {
                        pairs
                            .iter()
                            .filter(|(p, _)| *p == node)
                            .map(|&(_, inc)| inc)
                            .max()
                    })
                    .unwrap_or(self.nodes[node.0 as usize].inc);
                (node, inc)
            })
            .collect();
        if holders.len() < usize::from(acked.copies) {
            let copies = acked.copies;
            self.report_replica(
                id,
                format!(
                    "{n}: its copy of record of {id} (acknowledged with {copies}) is called \
                     surplus, but the registry counts {of_record:?}"
                ),
            );
            return;
        }
        if let Some(acked) = self.replication.acked.get_mut(&id) {
            acked.holders = holders;
        }
    }

    /// `id` left node `n`'s store: an acknowledged copy of record may not.
    pub(super) fn replica_copy_left(&mut self, n: NodeId, id: ObjectId) {
        if !self.replication.on {
            return;
        }
        let inc = self.nodes[n.0 as usize].inc;
        let holds_acked_copy = self
            .replication
            .acked
            .get(&id)
            .is_some_and(|acked| acked.holders.contains(&(n, inc)));
        // An id the directory named with another content since (put again elsewhere during a
        // partition or head outage): the registry refused this copy, which is no copy of
        // record any more (README "One id, one content").
        if holds_acked_copy
            && !self.replication.deleted.contains(&id)
            && !self.named_with_two_contents(&id)
        {
            self.report_replica(
                id,
                format!(
                    "{n}: its copy of record of {id}, acknowledged, left the store without a delete"
                ),
            );
        }
    }

    /// Whether `id` was put with two contents (again elsewhere during a partition or head
    /// outage): named so by the directory, or one publication of it refused. Its copies of
    /// record of the other content can take no copy of this one, and the registry's refusal
    /// releases them.
    fn named_with_two_contents(&self, id: &ObjectId) -> bool {
        self.replication.two_contents.contains(id)
            || self
                .checker
                .named
                .get(id)
                .is_some_and(|digests| digests.len() > 1)
            || self.nodes.iter().any(|sim_node| {
                sim_node
                    .node
                    .as_ref()
                    .is_some_and(|node| node.holds_refused_copy(id))
            })
    }

    fn report_replica(&mut self, id: ObjectId, what: String) {
        if self.replication.reported.insert(id) {
            let now = self.now;
            self.checker.violation(now, what);
        }
    }

    fn holds_sealed(&self, n: NodeId, id: &ObjectId) -> bool {
        self.nodes[n.0 as usize]
            .node
            .as_ref()
            .is_some_and(|node| node.store().sealed_info(id).is_some())
    }

    fn alive_pair(&self, (n, inc): (NodeId, u32)) -> bool {
        self.alive(n, inc)
    }

    /// Every acknowledged object survived its losses: while at most `k − 1` of the nodes that
    /// held it at the ack died, a live one of them holds it.
    pub(super) fn check_acked_replicas(&mut self) {
        let acked: Vec<(ObjectId, Acked)> = self
            .replication
            .acked
            .iter()
            .filter(|(id, _)| {
                !self.replication.deleted.contains(id) && !self.named_with_two_contents(id)
            })
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        for (id, acked) in acked {
            let lost = acked
                .holders
                .iter()
                .filter(|&&pair| !self.alive_pair(pair))
                .count();
            if lost > 0 {
                self.replication.stats.acked_with_losses += 1;
            }
            if lost >= usize::from(acked.copies) {
                continue;
            }
            let live_holding = acked
                .holders
                .iter()
                .filter(|&&pair| self.alive_pair(pair) && self.holds_sealed(pair.0, &id))
                .count();
            if live_holding == 0 {
                self.report_replica(
                    id,
                    format!(
                        "{id}, acknowledged with {} copies, is gone after {lost} of its holders died",
                        acked.copies
                    ),
                );
            } else if lost > 0 {
                self.replication.stats.survived_losses += 1;
            }
            for &pair in &acked.holders {
                if self.alive_pair(pair) && !self.holds_sealed(pair.0, &id) {
                    self.report_replica(
                        id,
                        format!("{}: lost its acknowledged copy of record of {id}", pair.0),
                    );
                }
            }
        }
    }

    /// Whether every record converged (see the module doc), else what has not.
    fn replicas_converged(&self) -> Result<u64, String> {
        // A shard down (its head restarting, failing over) has nothing to compare with.
        if self.all_shards().any(|shard| shard.registry().is_none()) {
            return Ok(0);
        }
        let mut converged = 0;
        for (id, pairs) in &self.replication.published {
            let registry = self.registry_of(id).expect("every shard is up");
            let members = registry.members().len();
            let head_crashes = self.head_crashes_of(id);
            // An id put with two contents (again elsewhere during a partition or head outage:
            // named so by the directory, or one publication refused) has copies of record of
            // the other content that can take no copy of this one (README "One id, one
            // content"): not checked.
            if self.replication.deleted.contains(id) || self.named_with_two_contents(id) {
                continue;
            }
            // Nodes that published a copy of record and still hold it as one (a publication
            // of record the registry refused, say a put of other bytes under the id, made no
            // copy of record, though its node may hold a plain copy fetched since).
            let live_of_record: Vec<NodeId> = pairs
                .iter()
                .filter(|&&pair| {
                    self.alive_pair(pair)
                        && self.holds_sealed(pair.0, id)
                        && self.nodes[pair.0 .0 as usize]
                            .node
                            .as_ref()
                            .is_some_and(|node| node.is_copy_of_record(id))
                })
                .map(|&(n, _)| n)
                .collect();
            let Some((wanted, of_record)) = registry.copies_of_record(id) else {
                let head_restarted =
                    self.replication.first_published_head_crashes.get(id) != Some(&head_crashes);
                if !live_of_record.is_empty() && !head_restarted {
                    return Err(format!(
                        "{id}: {:?} hold copies of record, but the registry has no record",
                        live_of_record
                    ));
                }
                continue;
            };
            for node in &of_record {
                if !self.holds_sealed(*node, id) {
                    return Err(format!(
                        "{id}: the registry counts {node} as a copy of record it does not hold"
                    ));
                }
            }
            let target = usize::from(wanted).min(members);
            if of_record.len() < target
                && self.some_member_has_room(id, &of_record)
                && self.one_lease_carries(id)
            {
                return Err(format!(
                    "{id}: {} of {wanted} copies of record ({:?}) with {members} members",
                    of_record.len(),
                    of_record
                ));
            }
            converged += 1;
        }
        Ok(converged)
    }

    /// Whether one holder's lease and its extensions surely carry `id` with this run's slices,
    /// window and latency. A larger object may fail `ReadsTooSlow` on every try of every target
    /// (a transfer gets at most `max_lease_extensions` more leases: README "How a fetch
    /// works"), so no copy of it can be made in this run, as the liveness probes assume too.
    fn one_lease_carries(&self, id: &ObjectId) -> bool {
        self.checker
            .contents
            .get(id)
            .and_then(|c| c.first())
            .is_some_and(|c| {
                c.sizes.data_size + c.sizes.metadata_size <= self.largest_probed_bytes()
            })
    }

    /// Whether a live node without a copy of `id` has room for it.
    fn some_member_has_room(&self, id: &ObjectId, of_record: &[NodeId]) -> bool {
        let Some(bytes) = self
            .checker
            .contents
            .get(id)
            .and_then(|c| c.first())
            .map(|c| c.sizes.data_size + c.sizes.metadata_size)
        else {
            return false;
        };
        self.nodes.iter().enumerate().any(|(i, sim_node)| {
            let Some(node) = &sim_node.node else {
                return false;
            };
            if of_record.contains(&NodeId(i as u32)) {
                return false;
            }
            // Free bytes are not enough: the object needs one block (fragmentation counts).
            node.store().sealed_info(id).is_some() || node.store().could_hold(bytes)
        })
    }

    /// Once faults stopped and the directory settled: runs on until every record converged,
    /// within a bound; a violation if one did not. Then the acknowledged objects are checked.
    pub(super) fn settle_replicas(&mut self) {
        if !self.replication.on {
            return;
        }
        let p = &self.params;
        let bound = Duration::from_micros(
            8 * (p.registry_heartbeat_timeout_us + p.fetch_timeout_us + p.reconnect_backoff_max_us)
                + 10 * p.directory_latency_ns / 1000,
        ) + replication_limits(p).target_timeout * 3;
        let deadline = self.now + bound;
        loop {
            let converged = self.replicas_converged();
            if let Ok(count) = converged {
                self.replication.stats.records_converged = count;
                // Converged; what repair set going (transfers, publications) ends too before
                // the end-of-run checks look for work left.
                if self.foreground == 0 {
                    break;
                }
            }
            let next_at: Option<Instant> = self.queue.peek().map(|std::cmp::Reverse(next)| next.at);
            if next_at.is_none_or(|at| at > deadline) {
                if let Err(what) = converged {
                    let now = self.now;
                    self.checker.violation(
                        now,
                        format!("liveness: repair did not converge after faults stopped: {what}"),
                    );
                }
                break;
            }
            self.step();
        }
        self.check_acked_replicas();
        self.check_deletes_stayed();
    }

    /// No live node holds a copy of record of content the registry deleted everywhere (see
    /// the module doc).
    fn check_deletes_stayed(&mut self) {
        let deleted: Vec<(ObjectId, (ContentDigest, Instant))> = self
            .replication
            .deleted_everywhere
            .iter()
            .map(|(id, d)| (*id, *d))
            .collect();
        for (id, (digest, at)) in deleted {
            let put_again = self
                .replication
                .put_started
                .get(&id)
                .is_some_and(|&put| put > at);
            let head_crashes = self.head_crashes_of(&id);
            let records_forgotten =
                self.replication.first_published_head_crashes.get(&id) != Some(&head_crashes);
            // A failover of the id's shard that lost the delete (see `failover_lost_write`).
            let delete_lost = self.failover_lost_write(&id, at);
            if put_again || records_forgotten || delete_lost {
                continue;
            }
            self.replication.stats.deletes_checked += 1;
            let holding: Vec<NodeId> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, sim_node)| {
                    sim_node.node.as_ref().is_some_and(|node| {
                        node.is_copy_of_record(&id) && node.store().digest(&id) == Some(digest)
                    })
                })
                .map(|(i, _)| NodeId(i as u32))
                .collect();
            if !holding.is_empty() {
                self.report_replica(
                    id,
                    format!(
                        "{id}: deleted everywhere at {at}, yet {holding:?} hold copies of record of \
                         the deleted content after faults stopped"
                    ),
                );
            }
        }
    }
}

impl Cluster {
    /// Whether a failover of the shard holding `id`'s records lost a write its registry
    /// answered, the answer reaching its node at `answered`. A promoted replica holds its
    /// master's inputs up to the replica's lag before the master died, none after (see
    /// `directory::shard`): Redis Cluster replicates asynchronously and a master acknowledges
    /// a write before its replica has it, so a failover within the lag after a write loses
    /// it, acknowledged or not — a `DeleteEverywhere` answered `Done`, and its tombstone,
    /// among them. A copy of record that missed the delete (its node away) is then published
    /// again to a registry that never heard of the delete and copied anew: what the real
    /// cluster does too (short of `WAIT`ing for the replica on every write, which the
    /// daemon's adapter does not). Never true unsharded.
    fn failover_lost_write(&self, id: &ObjectId, answered: Instant) -> bool {
        let Some(sharding) = self.params.sharding.as_ref().filter(|s| s.shards > 1) else {
            return false;
        };
        let shard = self.shard_of(id);
        // The answer left the registry one directory latency before it arrived.
        let took = answered
            .0
            .saturating_sub(self.records_shard(id).latency_ns());
        let lag_ns = sharding.replica_lag_us * 1000;
        sharding.failovers.iter().any(|&(s, at_us, _)| {
            let dies = at_us * 1000;
            s == shard && dies.saturating_sub(lag_ns) < took && took <= dies
        })
    }
}

/// The registry's replication limits in a run: targets given up after a few heartbeat
/// timeouts and a fetch (not the daemon's minute), repairs at a rate that makes the bucket
/// matter with the simulator's small objects, tombstones that outlast the run (a partition
/// may outlast any bound on the simulator's time scale; the daemon's 10 minutes is far longer
/// than its partitions are expected to be).
pub fn replication_limits(
    p: &crate::params::SimParams,
) -> skyriver_core::registry::ReplicationLimits {
    skyriver_core::registry::ReplicationLimits {
        repair_bytes_per_second: 200_000_000,
        target_timeout: Duration::from_micros(
            4 * p.registry_heartbeat_timeout_us + 2 * p.fetch_timeout_us,
        ),
        tombstone_lifetime: Duration::from_secs(3600),
        ..Default::default()
    }
}

/// How long a node's fetch of a copy placed on it may take in a run: a few fetch timeouts,
/// within the registry's target timeout (see [`replication_limits`]), on the simulator's time
/// scale (a daemon's minute would keep a run busy long after its fetch ended).
pub fn replication_fetch_timeout(p: &crate::params::SimParams) -> Duration {
    Duration::from_micros(2 * p.fetch_timeout_us)
}
