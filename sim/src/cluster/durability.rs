//! The simulated disk of a persistent node: the real slot index (the core's [`SlotIndex`], the
//! daemon's own) over an in-memory medium that loses and tears writes not synced at a crash.
//!
//! Each `Persist` output joins the disk's queue; the disk commits in order, one commit at a
//! time, after a latency drawn from the seed: it stages the changes, writes their slots,
//! syncs, and tells the node how far it got (`handle_persisted`), as the daemon's committer
//! thread does. At a crash the changes still queued may have been written but not synced:
//! each such write is lost, lands whole or lands torn ([`super::faults::MediaFaults`]). The
//! restart scans the index, discards torn records, and recovers the rest. The arena itself
//! survives whole (it is the data file, flushed before any record points into it).
//!
//! Checked here: a seal whose reply a client received (with replies held until durable) is
//! recovered after a crash unless the object had left the store, in memory or, when it was
//! spilled, in the spill tier (its record names a spill record the spill disk still holds,
//! which survives the crash; see `spill`); and every recovered object still holds its own
//! bytes, so a block was never reused before its removal was durable and no torn record was
//! trusted.
//!
//! [`Flaws::spilled_record_dropped`](super::Flaws) plants the bug the spilled half exists for:
//! the disk records a move to the spill tier as a removal (as persistent stores did before
//! spilled records), so a crash forgets spilled objects whose seal was acknowledged.

use std::collections::{BTreeSet, VecDeque};

use rand::Rng;
use skyriver_core::persist::{MemoryStorage, SlotIndex};
use skyriver_core::store::{RecoveredObject, RecoveredSpilled};
use skyriver_core::{DurableChange, Instant, NodeId, NodeInput, ObjectId};

use super::{Cluster, Event};

/// One node's disk.
#[derive(Debug)]
pub(super) struct Disk {
    /// Handed to the disk, not committed yet: at a crash, written but not synced.
    pending: VecDeque<(u64, DurableChange)>,
    /// The index on the simulated medium.
    pub(super) index: SlotIndex<MemoryStorage>,
    /// When the commit in progress ends.
    busy_until: Instant,
    /// Spilled objects the index named at the last crash, for the restart.
    pub(super) recovering_spilled: Vec<RecoveredSpilled>,
}

impl Disk {
    /// A fresh, empty index for an arena of `arena_bytes`.
    pub(super) fn new(arena_bytes: u64) -> Self {
        let mut storage = MemoryStorage::new();
        let Ok(()) = SlotIndex::format(&mut storage, arena_bytes);
        let (mut index, _) = SlotIndex::open(storage).expect("a fresh index opens");
        let Ok(_) = index.finish_recovery([]);
        Disk {
            pending: VecDeque::new(),
            index,
            busy_until: Instant::ZERO,
            recovering_spilled: Vec::new(),
        }
    }
}

/// The change as the disk records it: with the planted flaw, a move to the spill tier as a
/// removal.
fn flawed(change: DurableChange, spilled_record_dropped: bool) -> DurableChange {
    match change {
        DurableChange::Spilled { id, .. } if spilled_record_dropped => {
            DurableChange::Removed { id }
        }
        other => other,
    }
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

    /// The disk committed everything up to change `upto`: written and synced.
    pub(super) fn persisted(&mut self, n: NodeId, inc: u32, upto: u64) {
        if !self.alive(n, inc) {
            return;
        }
        let disk = &mut self.nodes[n.0 as usize].disk;
        while disk.pending.front().is_some_and(|(seq, _)| *seq <= upto) {
            let (_, change) = disk.pending.pop_front().expect("looked at the front");
            disk.index
                .stage(flawed(change, self.flaws.spilled_record_dropped));
        }
        let Ok(_) = disk.index.write_staged();
        if !self.flaws.persisted_before_sync {
            let Ok(()) = disk.index.sync();
        }
        self.stats.durable_commits += 1;
        self.record(|| format!("{n} durable up to change {upto}"));
        self.feed(n, NodeInput::Persisted { upto });
    }

    /// At a crash: the committer may have written the changes still queued, unsynced; the
    /// medium loses or tears what was not synced; the index is scanned as a restart scans it.
    /// Returns what it holds, checked against the seals the node acknowledged.
    pub(super) fn durable_at_crash(&mut self, n: NodeId) -> Vec<RecoveredObject> {
        let arena_bytes = self.params.arena_bytes;
        let disk = std::mem::replace(&mut self.nodes[n.0 as usize].disk, Disk::new(arena_bytes));
        let Disk {
            pending, mut index, ..
        } = disk;
        for (_, change) in pending {
            index.stage(flawed(change, self.flaws.spilled_record_dropped));
        }
        let Ok(_) = index.write_staged();
        let mut storage = index.into_storage();
        let (mut lost, mut torn) = (0, 0);
        let media = &mut self.media;
        storage.crash(|_, len| {
            let fate = media.write_fate(len);
            match fate {
                skyriver_core::persist::WriteFate::Lost => lost += 1,
                skyriver_core::persist::WriteFate::Torn { .. } => torn += 1,
                skyriver_core::persist::WriteFate::Landed => {}
            }
            fate
        });
        self.stats.unsynced_writes_lost += lost;
        self.stats.unsynced_writes_torn += torn;
        let (index, scan) = match SlotIndex::open(storage) {
            Ok(opened) => opened,
            Err(error) => {
                // Only the header could fail, and it is synced at format.
                let what = format!("{n}: the index does not open after a crash: {error}");
                self.checker.violation(self.now, what);
                return Vec::new();
            }
        };
        self.stats.torn_records_discarded += scan.corrupt_slots;
        if lost + torn + scan.corrupt_slots > 0 {
            self.record(|| {
                format!(
                    "FAULT {n}'s disk: {lost} unsynced writes lost, {torn} torn; \
                     {} torn records discarded",
                    scan.corrupt_slots
                )
            });
        }
        let records: Vec<RecoveredObject> = index.found_records().collect();
        let spilled: Vec<RecoveredSpilled> = index.found_spilled().collect();
        self.nodes[n.0 as usize].disk.index = index;
        let durable: BTreeSet<ObjectId> = records
            .iter()
            .map(|r| r.id)
            .chain(spilled.iter().map(|r| r.id))
            .collect();
        self.nodes[n.0 as usize].disk.recovering_spilled = spilled;
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

    /// At the restart: the store's verdict on the records (positions it refused) goes back to
    /// the index, which clears those and the torn slots.
    pub(super) fn finish_disk_recovery(&mut self, n: NodeId, refused: Vec<usize>) {
        let Ok(_) = self.nodes[n.0 as usize].disk.index.finish_recovery(refused);
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
