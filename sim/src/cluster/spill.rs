//! The simulated spill disk of each node: the core's `Spill`, `Restore` and `DiscardSpilled`
//! outputs run against a disk with latency, a capacity (`ENOSPC` when it is full, below the
//! core's limit on purpose), IO errors, damaged records and crashes. A crash empties it (spill
//! files are a cache) unless the node is persistent: then a completed write survives (the
//! daemon flushes it before completing), and the restart hands the spilled objects the index
//! names back to the node, each under the op it is named by from then on.
//!
//! A write takes its bytes from the arena when it completes, as a real write reads memory
//! while it runs; so memory freed or reused before the write completed shows as a record
//! with bytes other than the object's. Checked here:
//! * a completed spill write holds the object's own bytes (memory was not freed or changed
//!   before the write completed);
//! * a restored object holds its own bytes once sealed again; a read that failed with an IO
//!   error is read again, up to [`RESTORE_READ_TRIES`] reads, the object still restoring; a
//!   restore that fails for good (record damaged, or its last read failed) reports the object
//!   lost: it is no longer spilled, and a copy of it found in memory later holds its own bytes;
//! * a restore finds its record: nothing on the simulated disk disappears by itself, so a
//!   missing record is one the store discarded while it still named it;
//! * an eviction (a sealed object forgotten) happens only while the node's tier cannot take the
//!   object, as far as the store can know (see [`TierModel`]);
//! * at the end of a run, every spilled object of a live node has a record with its own bytes
//!   (one never restored is checked too);
//! * the store's own spill bookkeeping (`Node::check_invariants`, after every input): the
//!   tier within its limit, a spilled object never also in memory, a spilling one pinned.
//!
//! Planted flaws ([`Flaws`](super::Flaws)), each caught by one of these checks:
//! `spill_acked_before_write` (the disk reports a write complete before it ran),
//! `restore_unverified` (the driver reads the record next to the one asked for, and checks no
//! digest), `spill_evicts_with_room` (the store is given a quarter of the configured limit, as
//! a unit slip in the daemon would, so it evicts objects the tier has room for).

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use skyriver_core::digest::ContentDigest;
use skyriver_core::node::{Handled, Node};
use skyriver_core::store::spill::RESTORE_READ_TRIES;
use skyriver_core::store::{RestoreError, SpillError, SpillOpId, SpillPlace, StorageTier};
use skyriver_core::{LocalRegion, NodeId, NodeInput, ObjectId};

use super::{Cluster, Event};

/// The spill tier of a run (off unless a test asks for it; see [`SpillParams::draw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillParams {
    /// The core's limit, bytes.
    pub limit_bytes: u64,
    /// What the disk holds before it answers `ENOSPC`, bytes.
    pub disk_bytes: u64,
    /// One write or read, µs (least, most).
    pub latency_us: (u64, u64),
    /// Probability (per million) that a write fails with an IO error while faults are on.
    pub io_error_ppm: u32,
    /// Probability (per million) that a record reads back damaged while faults are on.
    pub damage_ppm: u32,
    /// Probability (per million) that a restore's read fails with an IO error while faults
    /// are on.
    pub read_error_ppm: u32,
}

impl SpillParams {
    /// Parameters for `seed`, from a generator of their own (a seed's other parameters stay
    /// what they are with spilling off).
    pub fn draw(seed: u64, arena_bytes: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5b11_1d15_c000_0000);
        let limit_bytes = arena_bytes * rng.gen_range(1..=8);
        SpillParams {
            limit_bytes,
            disk_bytes: if rng.gen_bool(0.3) {
                limit_bytes / 2
            } else {
                limit_bytes
            },
            latency_us: (rng.gen_range(5..=50), rng.gen_range(50..=500)),
            io_error_ppm: if rng.gen_bool(0.3) {
                rng.gen_range(0..=50_000)
            } else {
                0
            },
            damage_ppm: if rng.gen_bool(0.3) {
                rng.gen_range(0..=20_000)
            } else {
                0
            },
            // Drawn last, so the parameters drawn before it stay what they were.
            read_error_ppm: if rng.gen_bool(0.3) {
                rng.gen_range(0..=20_000)
            } else {
                0
            },
        }
    }
}

/// A spill write or restore read in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct SpillJob {
    op: SpillOpId,
    object: ObjectId,
    region: LocalRegion,
    digest: Option<ContentDigest>,
}

/// One node's spill disk.
#[derive(Debug, Default)]
pub(super) struct SpillDisk {
    records: BTreeMap<SpillOpId, (ObjectId, Vec<u8>)>,
    used_bytes: u64,
    /// Where each record is, as the node's index names it: stable across restarts (a record
    /// adopted at a restart keeps its place under its new op).
    places: BTreeMap<SpillOpId, SpillPlace>,
}

/// Counters of the spill disks, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpillRunStats {
    /// Writes completed.
    pub writes: u64,
    /// Writes refused for lack of space.
    pub no_space: u64,
    /// Writes failed with an IO error.
    pub io_errors: u64,
    /// Restores completed with the object's bytes.
    pub restores: u64,
    /// Restores that found their record damaged or missing, or whose read failed.
    pub lost: u64,
    /// Of those, reads that failed with an IO error.
    pub read_errors: u64,
    /// Evictions (sealed objects forgotten) on nodes with a spill tier, each checked against
    /// the tier's state (see [`TierModel`]).
    pub evictions: u64,
}

impl Cluster {
    fn spill_faults_on(&self) -> bool {
        self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us
    }

    fn spill_latency_ns(&mut self) -> u64 {
        let (low, high) = self.spill.params.map_or((10, 10), |p| p.latency_us);
        self.rng.gen_range(low..=high.max(low)) * 1000
    }

    /// A node's `Spill` output: the write completes after the disk's latency.
    pub(super) fn spill_write(
        &mut self,
        n: NodeId,
        op: SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    ) {
        let inc = self.nodes[n.0 as usize].inc;
        // A write of a record the disk holds (a clean record's object going back to disk): the
        // store took that record's space back to count it as a write.
        let rewrite = self
            .spill
            .disks
            .get(&n)
            .is_some_and(|disk| disk.records.contains_key(&op));
        let model = self.spill.model(n, inc);
        model.writing_bytes += region.len;
        model.gave_back |= rewrite;
        let latency_ns = self.spill_latency_ns();
        let at = self.after(latency_ns);
        let acked_early = self.flaws.spill_acked_before_write;
        if acked_early {
            // Planted: reported complete at once, written later.
            self.schedule(self.now, Event::SpillReported { node: n, inc, op });
        }
        self.schedule(
            at,
            Event::SpillWritten {
                node: n,
                inc,
                job: SpillJob {
                    op,
                    object,
                    region,
                    digest,
                },
                report: !acked_early,
            },
        );
    }

    /// The write of `op` runs now: the bytes of `region` go to the disk.
    pub(super) fn spill_written(&mut self, n: NodeId, inc: u32, job: SpillJob, report: bool) {
        let SpillJob {
            op,
            object,
            region,
            digest,
        } = job;
        if !self.alive(n, inc) {
            return;
        }
        let len = region.len;
        let model = self.spill.model(n, inc);
        model.writing_bytes = model.writing_bytes.saturating_sub(len);
        let disk_bytes = self.spill.params.map_or(u64::MAX, |p| p.disk_bytes);
        let io_error_ppm = self.spill.params.map_or(0, |p| p.io_error_ppm);
        let io_error = self.spill_faults_on()
            && io_error_ppm > 0
            && self.rng.gen_range(0..1_000_000) < io_error_ppm;
        let disk = self.spill.disks.entry(n).or_default();
        // A spill of a record the disk has (a restored object's clean record) writes it again.
        let existing = disk
            .records
            .get(&op)
            .map_or(0, |(_, bytes)| bytes.len() as u64);
        let result = if disk.used_bytes - existing + len > disk_bytes {
            self.spill.stats.no_space += 1;
            Err(SpillError::NoSpace)
        } else if io_error {
            self.spill.stats.io_errors += 1;
            Err(SpillError::Io {
                reason: "simulated IO error".into(),
            })
        } else {
            let bytes = self.nodes[n.0 as usize].memory.read(region).to_vec();
            let actual = ContentDigest::of_contiguous(&bytes);
            if digest.is_some_and(|d| d != actual) {
                let now = self.now;
                self.checker.violation(
                    now,
                    format!(
                        "{n}: spill write {op} of {object} read bytes other than the object's \
                         (its memory was freed or changed before the write completed)"
                    ),
                );
            }
            let disk = self.spill.disks.entry(n).or_default();
            disk.used_bytes = disk.used_bytes - existing + len;
            disk.records.insert(op, (object, bytes));
            self.spill.stats.writes += 1;
            let place = self.spill_place(n, inc, op);
            let disk = self.spill.disks.entry(n).or_default();
            disk.places.insert(op, place);
            Ok(place)
        };
        self.record(|| format!("{n} spill write {op} of {object}: {result:?}"));
        if report {
            if result.is_err() {
                self.spill.model(n, inc).failed = true;
            }
            self.feed_spill(n, NodeInput::SpillDone { op, result });
        }
    }

    /// A node's `Restore` output: the read completes after the disk's latency.
    pub(super) fn spill_restore(
        &mut self,
        n: NodeId,
        op: SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<ContentDigest>,
    ) {
        let inc = self.nodes[n.0 as usize].inc;
        let latency_ns = self.spill_latency_ns();
        let at = self.after(latency_ns);
        self.schedule(
            at,
            Event::SpillRestored {
                node: n,
                inc,
                job: SpillJob {
                    op,
                    object,
                    region,
                    digest,
                },
            },
        );
    }

    /// The read of record `op` completes: its bytes (checked against their digest, as the
    /// daemon checks them) go into `region`.
    pub(super) fn spill_restored(&mut self, n: NodeId, inc: u32, job: SpillJob) {
        let SpillJob {
            op,
            object,
            region,
            digest,
        } = job;
        if !self.alive(n, inc) {
            return;
        }
        let damage_ppm = self.spill.params.map_or(0, |p| p.damage_ppm);
        let damaged = self.spill_faults_on()
            && damage_ppm > 0
            && self.rng.gen_range(0..1_000_000) < damage_ppm;
        let read_error_ppm = self.spill.params.map_or(0, |p| p.read_error_ppm);
        let read_error = self.spill_faults_on()
            && read_error_ppm > 0
            && self.rng.gen_range(0..1_000_000) < read_error_ppm;
        let disk = self.spill.disks.entry(n).or_default();
        let record = disk.records.get(&op).cloned();
        let neighbour = self.flaws.restore_unverified.then(|| {
            // Planted: the record after the one asked for (a wrong offset), the first if none.
            let after = disk.records.range(op..).find(|(&other, _)| other != op);
            let (_, (_, bytes)) = after
                .or_else(|| disk.records.iter().next())
                .expect("the disk holds the record asked for, or another");
            bytes.clone()
        });
        let result = match record {
            None => {
                let now = self.now;
                self.checker.violation(
                    now,
                    format!(
                        "{n}: restore {op} of {object} found no record (the store discarded a \
                         record it still names)"
                    ),
                );
                Err(RestoreError::Missing)
            }
            Some(_) if read_error => {
                self.spill.stats.read_errors += 1;
                Err(RestoreError::Io {
                    reason: "simulated read error".into(),
                })
            }
            Some(_) if neighbour.is_some() => {
                // Planted: its bytes, fitted to the object, go in unchecked.
                let mut bytes = neighbour.expect("checked");
                bytes.resize(region.len as usize, 0);
                self.nodes[n.0 as usize].memory.write(region, &bytes);
                Ok(())
            }
            Some((_, mut bytes)) => {
                if damaged && !bytes.is_empty() {
                    bytes[0] ^= 1;
                }
                let actual = ContentDigest::of_contiguous(&bytes);
                if digest.is_some_and(|d| d != actual) || bytes.len() as u64 != region.len {
                    Err(RestoreError::Damaged)
                } else {
                    self.nodes[n.0 as usize].memory.write(region, &bytes);
                    Ok(())
                }
            }
        };
        self.record(|| format!("{n} restore {op} of {object}: {result:?}"));
        // An IO error before the last read: the store reads the record again.
        let read_again = matches!(result, Err(RestoreError::Io { .. })) && {
            let failed = self.spill.failed_reads.entry((n, inc, op)).or_default();
            *failed += 1;
            *failed < RESTORE_READ_TRIES
        };
        if !read_again {
            self.spill.failed_reads.remove(&(n, inc, op));
            if result.is_ok() {
                self.spill.stats.restores += 1;
            } else {
                self.spill.stats.lost += 1;
            }
            // The store gives the record's space back (as a clean record's, or discarded).
            self.spill.model(n, inc).gave_back = true;
        }
        let failure = result.clone().err();
        self.feed_spill(n, NodeInput::RestoreDone { op, result });
        if let (Some(error), true) = (failure, self.alive(n, inc)) {
            let store = self.nodes[n.0 as usize]
                .node
                .as_ref()
                .expect("alive")
                .store();
            let tier = store.tier(&object);
            if read_again && tier != Some(StorageTier::Restoring) {
                let now = self.now;
                self.checker.violation(
                    now,
                    format!(
                        "{n}: restore {op} of {object} failed ({error}) before its last read, \
                         but the object is not being read again (tier {tier:?})"
                    ),
                );
            }
            if !read_again && matches!(tier, Some(StorageTier::Spilled | StorageTier::Restoring)) {
                let now = self.now;
                self.checker.violation(
                    now,
                    format!(
                        "{n}: restore {op} of {object} failed ({error}) but the object is still \
                         reported on disk, not lost"
                    ),
                );
            }
        }
        if self.alive(n, inc) {
            let sim_node = &self.nodes[n.0 as usize];
            let store = sim_node.node.as_ref().expect("alive").store();
            // Restored, or (after a failure) a copy that came back otherwise: its own bytes.
            if store.sealed_info(&object).is_some() {
                let now = self.now;
                self.checker.check_sealed_object(
                    now,
                    n,
                    store,
                    &sim_node.memory,
                    object,
                    "after restore",
                );
            }
        }
    }

    /// A node's `DiscardSpilled` output.
    pub(super) fn spill_discard(&mut self, n: NodeId, op: SpillOpId) {
        let inc = self.nodes[n.0 as usize].inc;
        let gives_back = match self.spill.discards_now {
            DiscardsNow::GiveBack => true,
            DiscardsNow::Released => false,
            DiscardsNow::OfWrite(written) => written != op,
        };
        self.spill.model(n, inc).gave_back |= gives_back;
        let disk = self.spill.disks.entry(n).or_default();
        disk.places.remove(&op);
        if let Some((_, bytes)) = disk.records.remove(&op) {
            disk.used_bytes -= bytes.len() as u64;
        }
    }

    /// Where record `op` of node `n` is: where it was put (a record adopted at a restart keeps
    /// its place), or for a new one the incarnation that writes it and its op.
    pub(super) fn spill_place(&self, n: NodeId, inc: u32, op: SpillOpId) -> SpillPlace {
        let known = self
            .spill
            .disks
            .get(&n)
            .and_then(|disk| disk.places.get(&op).copied());
        known.unwrap_or(SpillPlace {
            file: inc,
            offset: op.0,
        })
    }

    /// A node crashed: its spill files are gone (a restarted node starts without them), unless
    /// it is persistent.
    pub(super) fn spill_crash(&mut self, n: NodeId) {
        if !self.params.persistent {
            self.spill.disks.remove(&n);
        }
    }

    /// At a persistent node's restart: the spilled objects its index named go back into its
    /// spill tier, with the digests of their records; one whose record is gone is lost (its
    /// index record cleared). The disk keeps only the adopted records, under their new ops.
    /// Returns how many were lost. Call before the index finishes its recovery.
    pub(super) fn recover_spilled(&mut self, n: NodeId, node: &mut Node) -> u64 {
        let records = std::mem::take(&mut self.nodes[n.0 as usize].disk.recovering_spilled);
        let old = self.spill.disks.remove(&n).unwrap_or_default();
        let mut refused = Vec::new();
        let mut positions = Vec::new();
        let mut inputs = Vec::new();
        let by_place: BTreeMap<SpillPlace, SpillOpId> =
            old.places.iter().map(|(&op, &place)| (place, op)).collect();
        let old_op = |place: &SpillPlace| by_place.get(place).copied();
        for (position, record) in records.iter().enumerate() {
            match old_op(&record.place).and_then(|op| old.records.get(&op)) {
                Some((object, bytes)) if *object == record.id => {
                    positions.push(position);
                    inputs.push((*record, Some(ContentDigest::of_contiguous(bytes))));
                }
                _ => refused.push(position),
            }
        }
        let lost_missing = refused.len() as u64;
        let mut disk = SpillDisk::default();
        if !inputs.is_empty() {
            let Handled::RecoveredSpilled(report) =
                node.handle(self.now, NodeInput::RecoveredSpilled { objects: inputs })
            else {
                unreachable!("recovered spilled objects are answered with a report")
            };
            refused.extend(report.refused.iter().map(|r| positions[r.index]));
            for (op, record) in report.adopted {
                let was = old_op(&record.place).expect("checked above");
                let (object, bytes) = old.records[&was].clone();
                disk.used_bytes += bytes.len() as u64;
                disk.records.insert(op, (object, bytes));
                disk.places.insert(op, record.place);
            }
        }
        self.spill.disks.insert(n, disk);
        self.nodes[n.0 as usize]
            .disk
            .index
            .refuse_spilled(refused.iter().copied());
        if lost_missing > 0 {
            let now = self.now;
            self.checker.violation(
                now,
                format!(
                    "{n}: {lost_missing} spilled objects the index names have no spill record \
                     (discarded before the index stopped naming them)"
                ),
            );
        }
        lost_missing
    }

    fn feed_spill(&mut self, n: NodeId, input: NodeInput<'static>) {
        self.feed(n, input);
    }
}

/// The spill side of a cluster.
#[derive(Debug, Default)]
pub(super) struct SpillSide {
    pub(super) params: Option<SpillParams>,
    pub(super) disks: BTreeMap<NodeId, SpillDisk>,
    pub(super) stats: SpillRunStats,
    /// What each node's store knows of its tier, to judge its evictions.
    pub(super) models: BTreeMap<NodeId, TierModel>,
    /// What a discard means during the input being driven.
    pub(super) discards_now: DiscardsNow,
    /// Reads of a restore (node, incarnation, op) that failed with an IO error so far.
    pub(super) failed_reads: BTreeMap<(NodeId, u32, SpillOpId), u32>,
}

/// What a `DiscardSpilled` output says of the store's tier, by the input that caused it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum DiscardsNow {
    /// Space given back now (a clean record taken back, a spilled object deleted).
    #[default]
    GiveBack,
    /// Discards held until durable changes were, released now: their space was given back
    /// when they were made, perhaps before a failure the store still remembers.
    Released,
    /// The completion of write `op`: its own record's discard (its object deleted meanwhile)
    /// gives nothing back, the record was never counted as kept.
    OfWrite(SpillOpId),
}

impl SpillSide {
    /// The model of node `n`'s tier in incarnation `inc` (a fresh one for a new incarnation:
    /// a restarted store starts with no write out, no failure and no eviction).
    fn model(&mut self, n: NodeId, inc: u32) -> &mut TierModel {
        let model = self.models.entry(n).or_default();
        if model.inc != inc {
            *model = TierModel {
                inc,
                ..TierModel::default()
            };
        }
        model
    }
}

/// What a node's store knows of its spill tier, rebuilt from outside (from the outputs it sent
/// and the completions it heard), to judge its evictions.
///
/// The store may evict (forget) a sealed object only when its tier cannot take it:
/// * the records it keeps (spilled objects, and clean records of restored ones), the writes it
///   has out and the object together exceed the configured limit; or
/// * the last new write it heard of failed (`ENOSPC`, an IO error), and no space was given back
///   since (a record discarded or taken back for a write, a restore completed).
///
/// The model never sees less than the store does: it counts every record still on the
/// simulated disk (some the store already counts as given back), every write out, and an
/// evicted object by its block (a few bytes more than its record); space given back during an
/// input clears a failure only after that input's evictions are judged. So an eviction it
/// finds room for is one the store made with room.
#[derive(Debug, Default)]
pub(super) struct TierModel {
    /// The incarnation modelled.
    inc: u32,
    /// Bytes of spill writes sent and not completed.
    writing_bytes: u64,
    /// A write failed, and no space was given back since.
    failed: bool,
    /// Space was given back during the current input.
    gave_back: bool,
    /// The store's eviction counters (objects, bytes) when last read.
    evicted: (u64, u64),
}

impl Cluster {
    /// An input is about to reach a node: what its discards will mean.
    pub(super) fn spill_input(&mut self, input: &NodeInput<'_>) {
        self.spill.discards_now = match input {
            NodeInput::Persisted { .. } => DiscardsNow::Released,
            NodeInput::SpillDone { op, .. } => DiscardsNow::OfWrite(*op),
            _ => DiscardsNow::GiveBack,
        };
    }

    /// After an input of node `n` and the outputs it drove: the objects it evicted meanwhile
    /// were evicted while its tier could not take them (see [`TierModel`]).
    pub(super) fn check_spill_evictions(&mut self, n: NodeId) {
        self.spill.discards_now = DiscardsNow::GiveBack;
        let Some(params) = self.spill.params else {
            return;
        };
        let sim_node = &self.nodes[n.0 as usize];
        let Some(node) = &sim_node.node else {
            return;
        };
        let inc = sim_node.inc;
        let (objects, bytes) = node.store().evicted_totals();
        let on_disk = self.spill.disks.get(&n).map_or(0, |disk| disk.used_bytes);
        let model = self.spill.model(n, inc);
        let (evicted, evicted_bytes) = (objects - model.evicted.0, bytes - model.evicted.1);
        model.evicted = (objects, bytes);
        let (failed, writing) = (model.failed, model.writing_bytes);
        if std::mem::take(&mut model.gave_back) {
            model.failed = false;
        }
        if evicted == 0 {
            return;
        }
        self.spill.stats.evictions += evicted;
        if failed || on_disk + writing + evicted_bytes > params.limit_bytes {
            return;
        }
        let now = self.now;
        self.checker.violation(
            now,
            format!(
                "{n}: evicted {evicted} objects ({evicted_bytes} bytes) while its spill tier had \
                 room: {on_disk} bytes on disk, {writing} being written, limit {}, no failed \
                 write since space was last given back",
                params.limit_bytes
            ),
        );
    }

    /// At the end of a run: every spilled object of a live node has a record on its disk, with
    /// the bytes of a content put under its id (those never restored are checked here only).
    pub(super) fn check_spilled_records(&mut self) {
        if self.spill.params.is_none() {
            return;
        }
        let now = self.now;
        let checker = &mut self.checker;
        for (i, sim_node) in self.nodes.iter().enumerate() {
            let Some(node) = &sim_node.node else {
                continue;
            };
            let n = NodeId(i as u32);
            let mut records: BTreeMap<ObjectId, Vec<&Vec<u8>>> = BTreeMap::new();
            if let Some(disk) = self.spill.disks.get(&n) {
                for (object, bytes) in disk.records.values() {
                    records.entry(*object).or_default().push(bytes);
                }
            }
            for summary in node.store().list() {
                if summary.tier != StorageTier::Spilled {
                    continue;
                }
                let info = summary.info;
                let len = info.data_size + info.metadata_size;
                let candidates = records.get(&info.id).map_or(&[][..], Vec::as_slice);
                let mut why = Vec::new();
                let intact = candidates.iter().any(|bytes| {
                    let checked = if bytes.len() as u64 != len {
                        Err(format!("{} bytes, not {len}", bytes.len()))
                    } else {
                        checker.check_range(&info, 0, bytes)
                    };
                    checked.map_err(|e| why.push(e)).is_ok()
                });
                if !intact {
                    checker.violation(
                        now,
                        format!(
                            "{n}: spilled {} has no record with its bytes on the spill disk at \
                             the end ({} records of it: {})",
                            info.id,
                            candidates.len(),
                            why.join("; ")
                        ),
                    );
                }
            }
        }
    }
}
