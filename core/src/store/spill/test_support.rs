//! What the spill tier's tests share: a 4096-byte store with a connected writer, and puts of
//! 1000-byte objects (1024-byte blocks: four fit).

use super::*;
use crate::ids::ClientId;
use crate::store::StoreConfig;

/// The client that puts.
pub(super) const A: ClientId = ClientId(1);
/// Object size: four fit the arena.
pub(super) const LEN: u64 = 1000;

/// A store of 4096 bytes with a spill tier of `spill` bytes (none: `None`), `A` connected;
/// `persistent` records durable changes.
pub(super) fn spilling_store(spill: Option<u64>, persistent: bool) -> Store {
    let mut config = StoreConfig::single_arena(4096);
    config.record_durable_changes = persistent;
    config.spill_limit_bytes = spill;
    let mut store = Store::new(config);
    store.connect(A);
    store
}

pub(super) fn id(n: u64) -> ObjectId {
    ObjectId::from_u64(n)
}

/// `A` puts object `n` (`LEN` bytes) and releases it.
pub(super) fn put(store: &mut Store, n: u64) {
    store.create(Instant(0), A, id(n), LEN, 0).unwrap();
    store.seal(A, id(n), true).unwrap();
}
