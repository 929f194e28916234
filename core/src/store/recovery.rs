//! Persistence seen from the store: what must be made durable ([`DurableChange`], an output)
//! and what was found on restart ([`RecoveredObject`], an input to [`Store::recover`]).
//!
//! The store never touches the backing file. With [`StoreConfig::record_durable_changes`]
//! set, it queues one change per seal and per removal of a sealed object (delete, deferred
//! delete, eviction) for the driver to drain with [`Store::poll_durable_change`]. On restart
//! the driver reads back the records that survived and hands them to [`Store::recover`],
//! which re-creates each object as sealed, in place (no byte is copied), and refuses records
//! that cannot be true: a block outside every arena or overlapping another recovered object,
//! sizes that do not match the block, or an id seen twice.
//!
//! [`StoreConfig::record_durable_changes`]: super::StoreConfig::record_durable_changes

use serde::{Deserialize, Serialize};

use super::spill::{SpillOpId, SpillPlace};
use super::table::{Entry, MAX_OBJECTS};
use super::{ObjectEvent, Store};
use crate::alloc::block_len_for;
use crate::ids::ObjectId;
use crate::region::LocalRegion;
use crate::time::Instant;

/// A change to the set of sealed objects that a persistent driver records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[must_use]
pub enum DurableChange {
    /// An object was sealed: its bytes in `block` are final.
    Sealed {
        /// The object.
        id: ObjectId,
        /// The whole allocated block (aligned), as [`Store::recover`] expects it back.
        block: LocalRegion,
        /// Data bytes.
        data_size: u64,
        /// Metadata bytes.
        metadata_size: u64,
    },
    /// A sealed object left the store; its block is free again.
    Removed {
        /// The object.
        id: ObjectId,
    },
    /// A sealed object left memory for the spill tier: its bytes are in the driver's spill
    /// record at `place` (written and flushed before the store heard of it), and its block is
    /// free once this is durable. Replaces the object's record, whatever it was.
    Spilled {
        /// The object.
        id: ObjectId,
        /// Where its spill record is.
        place: SpillPlace,
        /// Data bytes.
        data_size: u64,
        /// Metadata bytes.
        metadata_size: u64,
    },
}

impl DurableChange {
    /// The object a seal makes durable, as recovery finds it again; `None` for a removal.
    pub fn sealed_object(&self) -> Option<RecoveredObject> {
        match *self {
            DurableChange::Sealed {
                id,
                block,
                data_size,
                metadata_size,
            } => Some(RecoveredObject {
                id,
                block,
                data_size,
                metadata_size,
            }),
            DurableChange::Removed { .. } | DurableChange::Spilled { .. } => None,
        }
    }

    /// The spilled object a move to the spill tier makes durable; `None` for other changes.
    pub fn spilled_object(&self) -> Option<RecoveredSpilled> {
        match *self {
            DurableChange::Spilled {
                id,
                place,
                data_size,
                metadata_size,
            } => Some(RecoveredSpilled {
                id,
                place,
                data_size,
                metadata_size,
            }),
            DurableChange::Sealed { .. } | DurableChange::Removed { .. } => None,
        }
    }

    /// The object the change is about.
    pub fn id(&self) -> ObjectId {
        match *self {
            DurableChange::Sealed { id, .. }
            | DurableChange::Removed { id }
            | DurableChange::Spilled { id, .. } => id,
        }
    }
}

/// A spilled object found in persistent storage on restart: its bytes are in the driver's
/// spill record at `place` (see [`Store::recover_spilled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveredSpilled {
    /// The object.
    pub id: ObjectId,
    /// Where its spill record is.
    pub place: SpillPlace,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes.
    pub metadata_size: u64,
}

/// A spilled record [`Store::recover_spilled`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedSpilled {
    /// Position of the record in the input.
    pub index: usize,
    /// The record.
    pub record: RecoveredSpilled,
    /// Why.
    pub reason: RecoveryRefusal,
}

/// What [`Store::recover_spilled`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpilledRecoveryReport {
    /// Objects now in the spill tier.
    pub recovered_objects: u64,
    /// Their data plus metadata bytes.
    pub recovered_bytes: u64,
    /// The record each recovered object's new [`SpillOpId`] names, for the driver.
    pub adopted: Vec<(SpillOpId, RecoveredSpilled)>,
    /// Records not taken, in input order.
    pub refused: Vec<RefusedSpilled>,
}

/// A sealed object found in persistent storage on restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveredObject {
    /// The object.
    pub id: ObjectId,
    /// Its allocated block, as [`DurableChange::Sealed`] reported it.
    pub block: LocalRegion,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes.
    pub metadata_size: u64,
}

/// Why [`Store::recover`] refused a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RecoveryRefusal {
    /// The id is already in the store (an earlier record, or a live object).
    #[error("the id is already in the store")]
    DuplicateId,
    /// The block length is not what `data_size + metadata_size` allocates.
    #[error("the block does not match the object's sizes")]
    SizeMismatch,
    /// The block lies outside every arena, or overlaps an object already in the store.
    #[error("the block is outside the arena or overlaps another object")]
    SpaceTaken,
    /// The store holds as many objects as its table can index.
    #[error("the store holds the most objects it can index")]
    TooManyObjects,
    /// A spilled record, and the store has no spill tier (started without a spill directory).
    #[error("a spilled object, and no spill tier")]
    NoSpillTier,
    /// A spilled record past the spill tier's limit.
    #[error("the spill tier is full")]
    SpillLimit,
}

/// A record [`Store::recover`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedRecord {
    /// Position of the record in the input.
    pub index: usize,
    /// The record.
    pub record: RecoveredObject,
    /// Why.
    pub reason: RecoveryRefusal,
}

/// What [`Store::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryReport {
    /// Objects now in the store, sealed.
    pub recovered_objects: u64,
    /// Their data plus metadata bytes.
    pub recovered_bytes: u64,
    /// Their allocated blocks' bytes.
    pub recovered_block_bytes: u64,
    /// Records not trusted, in input order.
    pub refused: Vec<RefusedRecord>,
}

impl Store {
    /// Re-creates sealed objects found in persistent storage, in place: each record's block is
    /// reserved in the allocator and the object is sealed, unreferenced and evictable. Call it
    /// before serving clients. Records are taken in order; one that is inconsistent with the
    /// arenas or with the records before it is refused and changes nothing.
    ///
    /// Each recovered object is announced as [`StoreOutput::Local`] `Sealed` (so the node layer
    /// publishes it to the directory) and to subscribers, but queues no [`DurableChange`]: it is
    /// durable already.
    ///
    /// [`StoreOutput::Local`]: super::StoreOutput::Local
    pub fn recover(
        &mut self,
        now: Instant,
        records: impl IntoIterator<Item = RecoveredObject>,
    ) -> RecoveryReport {
        let mut report = RecoveryReport::default();
        for (index, record) in records.into_iter().enumerate() {
            match self.recover_one(now, record) {
                Ok(()) => {
                    report.recovered_objects += 1;
                    report.recovered_bytes += record.data_size + record.metadata_size;
                    report.recovered_block_bytes += record.block.len;
                }
                Err(reason) => report.refused.push(RefusedRecord {
                    index,
                    record,
                    reason,
                }),
            }
        }
        report
    }

    fn recover_one(
        &mut self,
        now: Instant,
        record: RecoveredObject,
    ) -> Result<(), RecoveryRefusal> {
        let RecoveredObject {
            id,
            block,
            data_size,
            metadata_size,
        } = record;
        if self.objects.contains(&id) {
            return Err(RecoveryRefusal::DuplicateId);
        }
        if self.objects.len() >= MAX_OBJECTS {
            return Err(RecoveryRefusal::TooManyObjects);
        }
        let expected_block_len = data_size.checked_add(metadata_size).and_then(block_len_for);
        if expected_block_len != Some(block.len) {
            return Err(RecoveryRefusal::SizeMismatch);
        }
        if block.offset.checked_add(block.len).is_none() || !self.allocator.reserve(block) {
            return Err(RecoveryRefusal::SpaceTaken);
        }
        self.objects
            .insert(Entry::new(id, block, data_size, metadata_size, true, now));
        self.settle(id);
        self.notify(ObjectEvent::Sealed {
            id,
            data_size,
            metadata_size,
        });
        Ok(())
    }
}

/// What a log of durable changes leaves, as a restart finds it: every object sealed and not
/// removed since, in id order. For drivers that keep the log themselves (the simulator's disk).
/// Objects moved to the spill tier count as removed here (see [`replay_spilled`]).
pub fn replay(log: &[DurableChange]) -> Vec<RecoveredObject> {
    let mut live = std::collections::BTreeMap::new();
    for change in log {
        match change.sealed_object() {
            Some(object) => {
                live.insert(object.id, object);
            }
            None => {
                live.remove(&change.id());
            }
        }
    }
    live.into_values().collect()
}

/// The spilled objects a log of durable changes leaves (each object's last change a
/// [`DurableChange::Spilled`]), in id order: [`replay`]'s counterpart for the spill tier.
pub fn replay_spilled(log: &[DurableChange]) -> Vec<RecoveredSpilled> {
    let mut live = std::collections::BTreeMap::new();
    for change in log {
        match change.spilled_object() {
            Some(object) => {
                live.insert(object.id, object);
            }
            None => {
                live.remove(&change.id());
            }
        }
    }
    live.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;
    use crate::ids::{ArenaId, ClientId};
    use crate::store::{StoreConfig, StoreOutput};

    const A: ClientId = ClientId(1);

    fn durable_store(capacity: u64) -> Store {
        let mut config = StoreConfig::single_arena(capacity);
        config.record_durable_changes = true;
        let mut store = Store::new(config);
        store.connect(A);
        store
    }

    fn changes(store: &mut Store) -> Vec<DurableChange> {
        std::iter::from_fn(|| store.poll_durable_change()).collect()
    }

    fn block(offset: u64, len: u64) -> LocalRegion {
        LocalRegion {
            arena: ArenaId(0),
            offset,
            len,
        }
    }

    fn put(store: &mut Store, n: u64, size: u64) -> crate::store::ObjectInfo {
        let id = ObjectId::from_u64(n);
        store.create(Instant(0), A, id, size, 0).unwrap();
        store.seal(A, id, true).unwrap()
    }

    #[test]
    fn a_seal_is_recovered_as_the_object_it_sealed_and_a_removal_as_nothing() {
        let mut store = durable_store(256);
        let info = put(&mut store, 1, 100);
        let change = store.poll_durable_change().expect("the seal is durable");
        let DurableChange::Sealed { block, .. } = change else {
            panic!("a seal recorded as {change:?}");
        };
        assert!(block.offset <= info.region.offset && block.len >= info.region.len);
        assert_eq!(
            change.sealed_object(),
            Some(RecoveredObject {
                id: info.id,
                block,
                data_size: 100,
                metadata_size: 0,
            })
        );
        assert_eq!(change.id(), info.id);
        let removal = DurableChange::Removed { id: info.id };
        assert_eq!((removal.sealed_object(), removal.id()), (None, info.id));
    }

    #[test]
    fn durable_changes_are_off_by_default() {
        let mut store = Store::new(StoreConfig::single_arena(4096));
        store
            .create(Instant(0), A, ObjectId::from_u64(1), 10, 0)
            .unwrap();
        store.seal(A, ObjectId::from_u64(1), true).unwrap();
        store.delete(&[ObjectId::from_u64(1)]);
        assert_eq!(store.poll_durable_change(), None);
    }

    #[test]
    fn seals_deletes_and_evictions_are_recorded_aborts_are_not() {
        let mut store = durable_store(256);
        let first = put(&mut store, 1, 100);
        assert_eq!(
            changes(&mut store),
            vec![DurableChange::Sealed {
                id: first.id,
                block: block(0, 128),
                data_size: 100,
                metadata_size: 0,
            }]
        );
        store
            .create(Instant(0), A, ObjectId::from_u64(2), 10, 0)
            .unwrap();
        store.abort(A, ObjectId::from_u64(2)).unwrap();
        assert_eq!(changes(&mut store), vec![]);
        // A 256-byte object needs the whole arena: object 1 is evicted, but its block is free
        // only once its removal is durable (a recovered record must never point at space
        // another object overwrote), so the create fails until then.
        let third = ObjectId::from_u64(3);
        assert!(matches!(
            store.create(Instant(0), A, third, 256, 0),
            Err(StoreError::OutOfMemory { .. })
        ));
        assert_eq!(
            changes(&mut store),
            vec![DurableChange::Removed { id: first.id }]
        );
        assert_eq!(store.quarantined_bytes(), 128);
        store.check_invariants();
        store.handle_durable(store.durable_changes_queued());
        assert_eq!(store.quarantined_bytes(), 0);
        let second = put(&mut store, 3, 256);
        assert_eq!(
            changes(&mut store),
            vec![DurableChange::Sealed {
                id: second.id,
                block: block(0, 256),
                data_size: 256,
                metadata_size: 0,
            }]
        );
        // A deferred delete is recorded when it happens, not when it is asked for.
        let _held = store.get_now(A, second.id).unwrap();
        let _ = store.delete(&[second.id]);
        assert_eq!(changes(&mut store), vec![]);
        store.release(A, second.id).unwrap();
        assert_eq!(
            changes(&mut store),
            vec![DurableChange::Removed { id: second.id }]
        );
    }

    #[test]
    fn recovery_restores_what_was_recorded_in_place() {
        let mut before = durable_store(1 << 20);
        let mut log = Vec::new();
        for n in 0..50 {
            put(&mut before, n, 1 + n * 37);
        }
        let _ = before.delete(&[ObjectId::from_u64(3), ObjectId::from_u64(7)]);
        before.evict(1000);
        log.extend(changes(&mut before));
        before.handle_durable(before.durable_changes_queued());
        let records = replay(&log);

        let mut after = durable_store(1 << 20);
        let report = after.recover(Instant(5), records.clone());
        assert!(report.refused.is_empty(), "{report:?}");
        assert_eq!(report.recovered_objects, records.len() as u64);
        after.check_invariants();
        assert_eq!(
            after.stats().allocated_bytes,
            before.stats().allocated_bytes
        );
        for summary in before.list() {
            let recovered = after.summary(&summary.info.id).expect("recovered");
            assert_eq!(recovered.info, summary.info);
            assert!(recovered.sealed);
            assert_eq!(recovered.ref_count, 0);
        }
        assert_eq!(after.list().len(), before.list().len());
        // Recovered objects are announced for the directory but are not re-recorded.
        let announced = std::iter::from_fn(|| after.poll_output())
            .filter(|o| matches!(o, StoreOutput::Local(ObjectEvent::Sealed { .. })))
            .count();
        assert_eq!(announced, records.len());
        assert_eq!(after.poll_durable_change(), None);
        // They are ordinary sealed objects: readable, evictable, deletable.
        let evicted = after.evict(u64::MAX);
        assert_eq!(evicted.objects, records.len() as u64);
        assert_eq!(after.stats().allocated_bytes, 0);
        after.check_invariants();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put { size: u64 },
        Delete { pick: usize },
        Evict { bytes: u64 },
        Hold { pick: usize },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            5 => (0u64..3000).prop_map(|size| Op::Put { size }),
            2 => any::<usize>().prop_map(|pick| Op::Delete { pick }),
            1 => (0u64..4000).prop_map(|bytes| Op::Evict { bytes }),
            1 => any::<usize>().prop_map(|pick| Op::Hold { pick }),
        ]
    }

    proptest::proptest! {
        /// Whatever the store did, replaying its durable changes up to any input boundary (a
        /// crash there) recovers exactly the sealed objects of that moment, in place.
        #[test]
        fn recovery_at_any_input_boundary_matches_the_store_then(
            ops in proptest::collection::vec(op(), 1..80),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let mut store = durable_store(8192);
            let mut log = Vec::new();
            let mut boundaries = vec![(0, Vec::new())];
            let mut next = 0;
            for op in ops {
                let sealed: Vec<ObjectId> = store
                    .list()
                    .iter()
                    .filter(|s| s.sealed && !s.delete_pending)
                    .map(|s| s.info.id)
                    .collect();
                match op {
                    Op::Put { size } => {
                        next += 1;
                        let id = ObjectId::from_u64(next);
                        if store.create(Instant(0), A, id, size, 0).is_ok() {
                            store.seal(A, id, true).unwrap();
                        }
                    }
                    Op::Delete { pick } if !sealed.is_empty() => {
                        let _ = store.delete(&[sealed[pick % sealed.len()]]);
                    }
                    Op::Hold { pick } if !sealed.is_empty() => {
                        let id = sealed[pick % sealed.len()];
                        if store.get_now(A, id).is_ok() {
                            let _ = store.delete(&[id]);
                            store.release(A, id).unwrap();
                        }
                    }
                    Op::Evict { bytes } => {
                        store.evict(bytes);
                    }
                    _ => {}
                }
                log.extend(changes(&mut store));
                let infos: Vec<_> = store
                    .list()
                    .into_iter()
                    .filter(|s| s.sealed)
                    .map(|s| s.info)
                    .collect();
                boundaries.push((log.len(), infos));
            }
            let (len, expected) = &boundaries[cut.index(boundaries.len())];
            let mut recovered = durable_store(8192);
            let report = recovered.recover(Instant(1), replay(&log[..*len]));
            proptest::prop_assert!(report.refused.is_empty(), "{:?}", report);
            recovered.check_invariants();
            let infos: Vec<_> = recovered.list().into_iter().map(|s| s.info).collect();
            proptest::prop_assert_eq!(&infos, expected);
        }
    }

    #[test]
    fn inconsistent_records_are_refused() {
        let mut store = durable_store(4096);
        let record = |n: u64, offset: u64, len: u64, data_size: u64| RecoveredObject {
            id: ObjectId::from_u64(n),
            block: block(offset, len),
            data_size,
            metadata_size: 0,
        };
        let report = store.recover(
            Instant(0),
            [
                record(1, 0, 128, 100),
                record(1, 1024, 128, 100),        // same id again
                record(2, 64, 128, 100),          // overlaps object 1
                record(3, 4096, 64, 10),          // past the arena's end
                record(4, 256, 64, 100),          // block too small for the sizes
                record(5, 100, 64, 10),           // unaligned
                record(6, u64::MAX - 63, 64, 10), // overflowing
                record(7, 512, 128, 65),
            ],
        );
        let refusals: Vec<(usize, RecoveryRefusal)> =
            report.refused.iter().map(|r| (r.index, r.reason)).collect();
        assert_eq!(
            refusals,
            vec![
                (1, RecoveryRefusal::DuplicateId),
                (2, RecoveryRefusal::SpaceTaken),
                (3, RecoveryRefusal::SpaceTaken),
                (4, RecoveryRefusal::SizeMismatch),
                (5, RecoveryRefusal::SpaceTaken),
                (6, RecoveryRefusal::SpaceTaken),
            ]
        );
        assert_eq!(report.recovered_objects, 2);
        assert_eq!(report.recovered_block_bytes, 256);
        assert_eq!(store.stats().allocated_bytes, 256);
        store.check_invariants();
        // The refused space is free for new objects.
        assert!(store
            .create(Instant(0), A, ObjectId::from_u64(9), 3000, 0)
            .is_ok());
    }
}
