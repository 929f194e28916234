//! One id, one content: the digests the simulated directory names, the verification of fetched
//! copies (the driver hashes their bytes), damaged transfers, and the checks that no id is
//! accepted with two contents and that no fetched copy is other than the id's content.
//!
//! [`Flaws`] plant the bugs these checks exist for, so a test can show the checker catches
//! them: a driver that does not verify fetched copies, a directory that ignores content.

use skyriver_core::digest::ContentDigest;
use skyriver_core::directory::{DirectoryEvent, DirectoryReply};
use skyriver_core::store::StorageTier;

use super::*;

/// Deliberately broken behaviours, off in every real run: each removes one protection so a
/// test can show that the checker reports what the protection prevents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flaws {
    /// The driver does not hash a fetched copy: it answers with the digest the node expects,
    /// so damaged or foreign bytes are sealed.
    pub skip_verification: bool,
    /// Every publication reaches the directory with one and the same digest, so the directory
    /// cannot tell two contents of an id apart.
    pub directory_ignores_content: bool,
    /// The holder's fabric reports a revocation complete while READs under the key are still
    /// being served, so the core unpins memory they copy from.
    pub revoke_ignores_serving_reads: bool,
    /// The disk reports changes durable once their index slots are written, before the sync,
    /// so a crash can lose or tear a record whose seal was acknowledged.
    pub persisted_before_sync: bool,
    /// The spill disk reports a write complete before it ran, so the core frees (and may
    /// reuse) the object's memory while the write still reads it.
    pub spill_acked_before_write: bool,
    /// The network tells a relay's readers it holds several READ slices more than it said, so they
    /// READ bytes of its partial copy it has not received.
    pub relay_progress_runs_ahead: bool,
    /// The origin of a put with replicas hears of every copy it wants at its own
    /// publication, so a put that waits for its copies returns before they exist.
    pub copies_overcounted: bool,
    /// Nodes ignore the registry's placements: no copy is ever made or repaired.
    pub replica_placement_ignored: bool,
    /// Nodes' hellos lose their failure domain, so the registry places copies as if every
    /// node were a domain of its own (see `replication`).
    pub placement_ignores_domains: bool,
    /// The origin of a put with replicas unpins its copy of record as soon as it hears of the
    /// copies (as if told it is surplus), so eviction may drop it (see `replication`).
    pub copies_of_record_unpinned: bool,
    /// The registry keeps no tombstone of a delete, so a copy of record that missed the delete
    /// (cut off, or its event lost) is published again as one and copied anew (see
    /// `replication`).
    pub no_tombstones: bool,
    /// A holder's coalesced pass sends an object once to its first requester and skips the
    /// others (see `crowd`).
    pub coalesced_pass_skips_requester: bool,
    /// A holder's coalesced pass sends every requester the first object sent in the pass,
    /// whatever it asked for (see `crowd`).
    pub coalesced_pass_mixes_payloads: bool,
    /// Holders answer `NotFound` to every fetch request for a fifth of the ids (those whose
    /// last byte is a multiple of 5), though they hold them (see `liveness`).
    pub holders_deny_some_ids: bool,
    /// A persistent node's disk records a move to the spill tier as a removal, so a crash
    /// forgets spilled objects (see `durability`).
    pub spilled_record_dropped: bool,
    /// A restarted head keeps no grace period and a node never hears that its replayed
    /// publication was refused, so an id can name two contents after a head restart, each
    /// served by its holder (see `registry::grace` in the core).
    pub unguarded_head_restarts: bool,
    /// The head forgets a subscription to an id whose last byte is a multiple of 4 as soon as
    /// it took it (as if the node had unsubscribed), so a fetch waits for an event that never
    /// comes (see `directory::checks`).
    pub registry_forgets_subscriptions: bool,
    /// The spill driver reads the record after the one a restore asks for (a wrong offset)
    /// and checks no digest, so a restored object gets another object's bytes (see `spill`).
    pub restore_unverified: bool,
    /// The daemon hands its store a quarter of the configured spill limit (as a unit slip
    /// would), so the store evicts objects the tier has room for (see `spill`).
    pub spill_evicts_with_room: bool,
    /// A sharded directory's failovers are transparent to the nodes: their connections follow
    /// the promoted replica and nobody re-registers or replays, so what the replica had not
    /// received stays lost (see `directory::shard`).
    pub transparent_shard_failovers: bool,
}

impl Cluster {
    /// Whether this transfer's bytes arrive damaged (a random fault): which byte of `len`, and
    /// the bits flipped in it.
    pub(super) fn corruption(&mut self, len: usize) -> Option<(usize, u8)> {
        let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
        if !faults_on || self.params.corrupt_ppm == 0 || len == 0 {
            return None;
        }
        if self.rng.gen_range(0..1_000_000) >= self.params.corrupt_ppm {
            return None;
        }
        let at = self.rng.gen_range(0..len);
        Some((at, 1 << self.rng.gen_range(0..8)))
    }

    /// A node's directory request, as the directory receives it (under a planted flaw, with
    /// its digest blurred); publications and lookups are remembered to tap their answers.
    pub(super) fn directory_request(
        &mut self,
        n: NodeId,
        op: DirectoryOpId,
        mut request: DirectoryRequest,
    ) -> DirectoryRequest {
        let inc = self.nodes[n.0 as usize].inc;
        match &mut request {
            DirectoryRequest::PublishReplicated {
                id,
                digest,
                free_bytes,
                ..
            } => {
                self.replica_published(n, inc, *id, *free_bytes);
                if self.flaws.directory_ignores_content {
                    *digest = ContentDigest(0);
                }
                self.accepted.remove(&(n, inc, *id));
                self.dir_ops.insert((n, inc, op), (*id, Some(*digest)));
            }
            DirectoryRequest::Publish { id, digest, .. } => {
                if self.flaws.directory_ignores_content {
                    *digest = ContentDigest(0);
                }
                self.accepted.remove(&(n, inc, *id));
                self.dir_ops.insert((n, inc, op), (*id, Some(*digest)));
            }
            DirectoryRequest::Lookup { id, .. } => {
                self.dir_ops.insert((n, inc, op), (*id, None));
            }
            DirectoryRequest::DeleteEverywhere { id } => self.replica_delete_sent(n, inc, op, *id),
            _ => {}
        }
        request
    }

    /// A directory notice reaches node `n`: the digests it names for an id are the id's
    /// accepted content.
    pub(super) fn directory_named(&mut self, n: NodeId, inc: u32, notice: &DirectoryNotice) {
        let named = match notice {
            DirectoryNotice::Reply { op, reply } => {
                let Some((id, published)) = self.dir_ops.remove(&(n, inc, *op)) else {
                    return;
                };
                match (reply, published) {
                    (DirectoryReply::Done, Some(digest)) => {
                        self.accepted.insert((n, inc, id));
                        Some((id, digest))
                    }
                    (
                        DirectoryReply::Located {
                            digest: Some(digest),
                            ..
                        },
                        _,
                    ) => Some((id, *digest)),
                    _ => None,
                }
            }
            DirectoryNotice::Event(DirectoryEvent::Published { id, digest, .. }) => {
                Some((*id, *digest))
            }
            _ => None,
        };
        if let Some((id, digest)) = named {
            self.checker.named.entry(id).or_default().insert(digest);
            self.last_named.insert((n, id), digest);
        }
    }

    /// Node `n` lost its copy of `id` (or its memory): nothing of it stays accepted.
    pub(super) fn forget_accepted(&mut self, n: NodeId, id: Option<ObjectId>) {
        match id {
            Some(id) => {
                let inc = self.nodes[n.0 as usize].inc;
                self.accepted.remove(&(n, inc, id));
            }
            None => {
                self.accepted.retain(|(node, ..)| *node != n);
                self.dir_ops.retain(|(node, ..), _| *node != n);
                self.last_named.retain(|(node, _), _| *node != n);
            }
        }
    }

    /// [`NodeOutput::VerifyContent`](skyriver_core::NodeOutput::VerifyContent): hash the copy
    /// and answer at once; if the node sealed it, it must be the id's accepted content.
    pub(super) fn verify_content(
        &mut self,
        n: NodeId,
        transfer: TransferId,
        region: LocalRegion,
        object: ObjectId,
    ) {
        let sim_node = &self.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        self.checker
            .check_write_target(self.now, n, store, object, region, "verified copy");
        let mut actual = ContentDigest::of_contiguous(&sim_node.memory.read(region));
        if self.flaws.skip_verification {
            if let Some(expected) = self.last_named.get(&(n, object)) {
                actual = *expected;
            }
        }
        self.record(|| format!("{n} hashed {object} of {transfer}: {actual}"));
        let now = self.now;
        self.nodes[n.0 as usize]
            .node
            .as_mut()
            .expect("alive")
            .handle(now, NodeInput::ContentHashed { transfer, actual });
        let sim_node = &self.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        if let Some(info) = store.sealed_info(&object) {
            if info.region == region {
                self.checker
                    .check_transferred_copy(now, n, &info, &sim_node.memory);
            }
        }
    }

    /// The digest of node `m`'s sealed copy of `id`, if it has one.
    fn copy_digest(&self, m: NodeId, id: &ObjectId) -> Option<ContentDigest> {
        let sim_node = &self.nodes[m.0 as usize];
        let info = sim_node.node.as_ref()?.store().sealed_info(id)?;
        Some(ContentDigest::of_contiguous(
            &sim_node.memory.read(info.region),
        ))
    }

    /// A client's seal of `id` on `n` was answered `Ok`. When the directory accepted its
    /// publication and lists `n`, no other node it lists holds another content: no id is
    /// accepted with two contents while both are live.
    pub(super) fn check_one_content(&mut self, n: NodeId, id: ObjectId) {
        let inc = self.nodes[n.0 as usize].inc;
        if !self.accepted.contains(&(n, inc, id)) {
            // Sealed while the directory could not judge (the seal goes on; the copy stays
            // unpublished if the id turns out taken).
            return;
        }
        let Some(registry) = self.registry_of(&id) else {
            return;
        };
        let holders = registry.holders_of(&id);
        if !holders.contains(&n) {
            return;
        }
        let Some(ours) = self.copy_digest(n, &id) else {
            return;
        };
        for m in holders {
            // Only a copy the directory accepted counts: a node whose withdrawal is still on
            // its way (it is cut off from the directory) may be listed while it already holds
            // another content it sealed meanwhile, unpublished, which it serves no peer.
            let m_inc = self.nodes[m.0 as usize].inc;
            if !self.accepted.contains(&(m, m_inc, id)) {
                continue;
            }
            if let Some(theirs) = self.copy_digest(m, &id).filter(|d| *d != ours) {
                let what = format!(
                    "{n}: {id} accepted with content {ours} while the directory lists {m} \
                     holding it with content {theirs}"
                );
                self.checker.violation(self.now, what);
            }
        }
    }

    /// At the end: the nodes the directory lists for each id hold one content.
    pub(super) fn check_listed_contents(&mut self) {
        if self.all_shards().any(|shard| shard.registry().is_none()) {
            return;
        }
        let mut by_id: BTreeMap<ObjectId, Vec<NodeId>> = BTreeMap::new();
        for shard in self.all_shards() {
            for (node, id) in shard.registry().expect("up").locations() {
                by_id.entry(id).or_default().push(node);
            }
        }
        let mut violations = Vec::new();
        for (id, holders) in by_id {
            let digests: BTreeSet<(ContentDigest, NodeId)> = holders
                .iter()
                .filter_map(|&m| self.copy_digest(m, &id).map(|d| (d, m)))
                .collect();
            let distinct: BTreeSet<ContentDigest> = digests.iter().map(|(d, _)| *d).collect();
            if distinct.len() > 1 {
                violations.push(format!(
                    "the directory lists holders of {id} with different contents: {digests:?}"
                ));
            }
        }
        // A copy its node serves to peers has the content the directory names for its id: a
        // hinted fetch has no directory digest to check, so a copy of another content must stay
        // local (refused publication or replay; README "One id, one content").
        for (i, sim_node) in self.nodes.iter().enumerate() {
            let Some(node) = &sim_node.node else {
                continue;
            };
            let n = NodeId(i as u32);
            for summary in node.store().list() {
                let id = summary.info.id;
                // A spilled copy's bytes are on disk, not in the memory `copy_digest` reads.
                if !summary.sealed
                    || summary.delete_pending
                    || summary.tier != StorageTier::Memory
                    || !node.serves_peers(&id)
                {
                    continue;
                }
                let named = self.registry_of(&id).and_then(|r| r.content_of(&id));
                let (Some(named), Some(held)) = (named, self.copy_digest(n, &id)) else {
                    continue;
                };
                if named != held {
                    violations.push(format!(
                        "{n} serves peers a copy of {id} ({held:?}) whose content the directory \
                         does not name ({named:?})"
                    ));
                }
            }
        }
        for what in violations {
            self.checker.violation(self.now, what);
        }
    }

    /// A content for a client to put again under a known id.
    pub(super) fn next_variant(&mut self) -> u32 {
        self.next_variant += 1;
        self.next_variant
    }
}
