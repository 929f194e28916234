//! After faults stop: a sealed copy on a live node is fetchable from the other live nodes.
//!
//! The directory's convergence check compares the registry with what each node's session
//! publishes; this check asks the question a user asks instead, end to end through the cores:
//! a client on another live node fetches a sample of the sealed objects, and each fetch must
//! bring the object. A copy that its node holds but refuses to serve (one the directory never
//! vouched for after a head restart), a publication lost on the way, a location forgotten by
//! the registry — each shows here as a failed fetch.
//!
//! Not probed: objects larger than a lease and all its extensions can carry at the run's READ
//! rate (a requester asks for at most `max_lease_extensions` more), objects spilled to disk (a
//! restore on the run's slow disk may outlast the probe's timeout), copies of
//! ids named with two contents that their node does not serve yet (see `named_once`). A copy
//! its node holds refused (the directory named the id with another content: its publication, or
//! its replay after a head restart, was refused) stays local by design and is not probed
//! either. Random runs only: scripted clusters (the golden traces) keep their traces.

use std::time::Duration;

use skyriver_core::ids::{ClientId, NodeId, ObjectId};
use skyriver_core::node::NodeConfig;
use skyriver_core::store::StorageTier;
use skyriver_core::wire::{self, PeerMessage};

use super::{Cluster, WORKLOAD_CLIENT_BASE};

/// Fetches the check makes at most, spread over the sealed objects of the live nodes.
const SAMPLE: usize = 48;
/// The fetches' timeout: generous, so a slow link's large object is not a failure.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

impl Cluster {
    /// Fetches a sample of the sealed objects of live nodes from other live nodes, once
    /// faults stopped and the directory settled; a violation for each that is not brought.
    pub(super) fn check_copies_fetchable(&mut self) {
        if !self.mode.workload {
            return;
        }
        let live: Vec<NodeId> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].node.is_some())
            .map(|i| NodeId(i as u32))
            .collect();
        if live.len() < 2 {
            return;
        }
        let sealed = self.sealed_copies(&live);
        let step = sealed.len().div_ceil(SAMPLE).max(1);
        // One probe at a time: a fetch makes room on its node, and may evict a copy another
        // probe would read; a probe whose holder no longer holds its object proves nothing.
        for &(id, holder) in sealed.iter().step_by(step) {
            if let Some(failure) = self.probe(id, holder, &live) {
                let now = self.now;
                self.checker.violation(
                    now,
                    format!(
                        "liveness: {id} sealed on live {holder} is not fetchable by a live node \
                         after faults stopped: {failure} (its reply is in the trace)"
                    ),
                );
            }
        }
        // The probes' copies are published like any fetched copy: settled again.
        self.settle_directory();
    }

    /// One fetch of `id` (sealed on `holder`) by another live node: `Some` says how it failed.
    fn probe(&mut self, id: ObjectId, holder: NodeId, live: &[NodeId]) -> Option<String> {
        let fetcher = self.fetcher_for(id, holder, live)?;
        let client = ClientId(WORKLOAD_CLIENT_BASE);
        let inc = self.nodes[fetcher.0 as usize].inc;
        let request = self.client_fetch(fetcher, client, vec![id], FETCH_TIMEOUT, false)?;
        self.record(|| format!("liveness: {fetcher} fetches {id}, sealed on {holder}"));
        self.stats.liveness_fetches += 1;
        let key = (fetcher, inc, client, request);
        let deadline = self.now + FETCH_TIMEOUT + Duration::from_millis(100);
        self.drive_until(|c| c.now > deadline || !c.checker.pending.contains_key(&key));
        let holds = |c: &Cluster, n: NodeId| {
            c.nodes[n.0 as usize]
                .node
                .as_ref()
                .is_some_and(|node| node.store().summary(&id).is_some_and(|s| s.sealed))
        };
        if !holds(self, holder) {
            self.stats.liveness_inconclusive += 1;
            return None;
        }
        if self.checker.pending.contains_key(&key) {
            return Some(format!("{fetcher}'s fetch got no answer"));
        }
        let failed = (!holds(self, fetcher)).then(|| {
            let store = self.nodes[fetcher.0 as usize]
                .node
                .as_ref()
                .map(|node| {
                    let (stats, list) = (node.store().stats(), node.store().list());
                    let held: Vec<String> = list
                        .iter()
                        .filter(|s| s.ref_count > 0 || s.pin_count > 0 || !s.sealed)
                        .map(|s| {
                            format!(
                                "{} refs={} pins={} sealed={} len={}",
                                s.info.id, s.ref_count, s.pin_count, s.sealed, s.info.region.len
                            )
                        })
                        .collect();
                    format!(
                        "{} of {} bytes allocated, {} evictable, {} pinned; held: [{}]",
                        stats.allocated_bytes,
                        stats.capacity_bytes,
                        stats.evictable_bytes,
                        stats.pinned_bytes,
                        held.join(", ")
                    )
                })
                .unwrap_or_default();
            format!("{fetcher}'s fetch failed; its store: {store}")
        });
        // On until the client released the copy, so the next probe finds its memory free.
        let deadline = self.now + FETCH_TIMEOUT;
        self.drive_until(|c| {
            c.now > deadline
                || c.nodes[fetcher.0 as usize]
                    .node
                    .as_ref()
                    .is_none_or(|node| node.store().summary(&id).is_none_or(|s| s.ref_count == 0))
        });
        failed
    }

    /// The largest object whose READs surely complete within one holder's lease and its
    /// extensions with this run's slices, window and latency. Larger ones may fail
    /// `ReadsTooSlow` on every try: not probed.
    pub(super) fn largest_probed_bytes(&self) -> u64 {
        let p = &self.params;
        let window = u64::from(p.max_outstanding_reads.max(1));
        let round_ns = 2 * p.latency_ns.1
            + (p.read_slice_bytes * window * 1_000_000_000) / p.bandwidth_bytes_per_sec.max(1);
        // The wire carries a lease in whole milliseconds (at least one), and a requester reads
        // only for three quarters of it, counted from when its request left.
        let granted_us = (p.lease_us / 1000).clamp(1, u64::from(wire::MAX_LEASE_MS)) * 1000;
        let lease_ns = granted_us * 1000;
        // Half way through each window the requester asks for another lease from then; the
        // answer must be back before the window closes, a quarter lease later, even behind
        // the READ data on the link (two rounds' worth, to be sure).
        let answer_ns = 2 * p.latency_ns.1 + 2 * round_ns;
        let extensions = if answer_ns <= lease_ns / 4 {
            u64::from(NodeConfig::new(NodeId(0), 0).max_lease_extensions)
        } else {
            0
        };
        let reading_ns = lease_ns * 3 / 4 + extensions * lease_ns / 2;
        let rounds = reading_ns / round_ns.max(1);
        rounds * window * p.read_slice_bytes / 2
    }

    /// Every sealed object of the live nodes, once, with the first live node holding it.
    fn sealed_copies(&self, live: &[NodeId]) -> Vec<(ObjectId, NodeId)> {
        let largest = self.largest_probed_bytes();
        let mut seen = std::collections::BTreeMap::new();
        for &n in live {
            let Some(node) = &self.nodes[n.0 as usize].node else {
                continue;
            };
            for summary in node.store().list() {
                // A copy whose publication was refused for another content stays local by
                // design (README "One id, one content").
                if summary.sealed
                    && !summary.delete_pending
                    && summary.info.region.len <= largest
                    && summary.tier == StorageTier::Memory
                    && !node.holds_refused_copy(&summary.info.id)
                    && self.named_once(&summary.info.id)
                {
                    seen.entry(summary.info.id).or_insert(n);
                }
            }
        }
        seen.into_iter().collect()
    }

    /// Whether the directory named at most one content for `id` in this run. A copy of an id
    /// named with two that its node does not serve yet (sealed or recovered while the
    /// directory could not judge it, its publication not accepted) is not probed: whether it
    /// is ever accepted depends on which content the directory keeps (seed 19 of the media
    /// tests). A copy its node serves is probed, whatever the names.
    fn named_once(&self, id: &ObjectId) -> bool {
        self.checker
            .named
            .get(id)
            .is_none_or(|digests| digests.len() <= 1)
    }

    /// The first live node after `holder` (in id order, wrapping) without a copy of `id` and
    /// with room for it: a store full of what it may not evict (copies of record, pinned until
    /// a delete) fails the fetch with `OutOfMemory`, as it should.
    fn fetcher_for(&self, id: ObjectId, holder: NodeId, live: &[NodeId]) -> Option<NodeId> {
        let start = live.iter().position(|&n| n == holder)?;
        let bytes = self.nodes[holder.0 as usize]
            .node
            .as_ref()?
            .store()
            .summary(&id)?
            .info
            .region
            .len;
        (1..live.len())
            .map(|k| live[(start + k) % live.len()])
            .find(|n| {
                self.nodes[n.0 as usize].node.as_ref().is_some_and(|node| {
                    !node.store().contains(&id) && node.store().could_hold(bytes)
                })
            })
    }
}

/// The planted flaw `holders_deny_some_ids`: the `NotFound` a holder answers instead of
/// serving a fetch request for a fifth of the ids.
pub(super) fn denial(message: &PeerMessage) -> Option<Vec<u8>> {
    let PeerMessage::FetchRequest { req, id, .. } = message else {
        return None;
    };
    if id.as_bytes()[id.as_bytes().len() - 1] % 5 != 0 {
        return None;
    }
    let mut bytes = Vec::new();
    wire::encode(&PeerMessage::NotFound { req: *req }, &mut bytes);
    Some(bytes)
}
