//! The simulated disk of a persistent node. Each `Persist` output joins the disk's queue; the
//! disk commits in order, one commit at a time, after a latency drawn from the seed, and tells
//! the node how far it got (`handle_persisted`), as the daemon's committer thread does. A
//! crash loses what was not committed; the restart recovers what was.
//!
//! Checked here: a seal whose reply a client received (with replies held until durable) is
//! recovered after a crash unless the object had left the store; and every recovered object
//! still holds its own bytes, so a block was never reused before its removal was durable.

use std::collections::{BTreeSet, VecDeque};

use rand::Rng;
use skyriver_core::store::recovery::replay;
use skyriver_core::store::RecoveredObject;
use skyriver_core::{DurableChange, Instant, NodeId, NodeInput, ObjectId};

use super::{Cluster, Event};

/// One node's disk.
#[derive(Debug, Default)]
pub(super) struct Disk {
    /// Handed to the disk, not committed yet: lost in a crash.
    pending: VecDeque<(u64, DurableChange)>,
    /// What a restart finds.
    committed: Vec<DurableChange>,
    /// When the commit in progress ends.
    busy_until: Instant,
}

impl Cluster {
    /// A node's `Persist` output.
    pub(super) fn persist(&mut self, n: NodeId, seq: u64, change: DurableChange) {
        let (low, high) = self.params.commit_latency_us;
        let latency_ns = self.rng.gen_range(low..=high) * 1000;
        let inc = self.nodes[n.0 as usize].inc;
        let disk = &mut self.nodes[n.0 as usize].disk;
        disk.pending.push_back((seq, change));
        let at = Instant(disk.busy_until.0.max(self.now.0) + latency_ns);
        disk.busy_until = at;
        self.schedule(
            at,
            Event::Persisted {
                node: n,
                inc,
                upto: seq,
            },
        );
    }

    /// The disk committed everything up to change `upto`.
    pub(super) fn persisted(&mut self, n: NodeId, inc: u32, upto: u64) {
        if !self.alive(n, inc) {
            return;
        }
        let disk = &mut self.nodes[n.0 as usize].disk;
        while disk.pending.front().is_some_and(|(seq, _)| *seq <= upto) {
            let (_, change) = disk.pending.pop_front().expect("looked at the front");
            disk.committed.push(change);
        }
        self.stats.durable_commits += 1;
        self.record(|| format!("{n} durable up to change {upto}"));
        self.feed(n, NodeInput::Persisted { upto });
    }

    /// At a crash: what the disk holds (what was not committed is lost), checked against the
    /// seals the node acknowledged.
    pub(super) fn durable_at_crash(&mut self, n: NodeId) -> Vec<RecoveredObject> {
        let disk = &mut self.nodes[n.0 as usize].disk;
        disk.pending.clear();
        disk.busy_until = Instant::ZERO;
        let records = replay(&disk.committed);
        // Keep the log short: what survives is all a later restart needs.
        disk.committed = records
            .iter()
            .map(|r| DurableChange::Sealed {
                id: r.id,
                block: r.block,
                data_size: r.data_size,
                metadata_size: r.metadata_size,
            })
            .collect();
        let durable: BTreeSet<ObjectId> = records.iter().map(|r| r.id).collect();
        let acked = std::mem::take(&mut self.nodes[n.0 as usize].acked_seals);
        for id in &acked {
            if !durable.contains(id) {
                let what = format!("{n}: the seal of {id} was acknowledged but is lost in a crash");
                self.checker.violation(self.now, what);
            }
        }
        self.nodes[n.0 as usize].acked_seals = acked.intersection(&durable).copied().collect();
        records
    }

    /// After a restart recovered `records`: each holds the bytes it was sealed with.
    pub(super) fn check_recovered(&mut self, n: NodeId, records: &[RecoveredObject]) {
        let now = self.now;
        let sim_node = &self.nodes[n.0 as usize];
        let Some(node) = sim_node.node.as_ref() else {
            return;
        };
        for record in records {
            self.checker.check_sealed_object(
                now,
                n,
                node.store(),
                &sim_node.memory,
                record.id,
                "after recovery",
            );
        }
    }
}
