//! The store core driven by arbitrary request sequences from several clients, as a daemon
//! drives it: create, write, seal, abort, get (at once or waiting, with deadlines), release,
//! delete, evict, pin, subscribe, disconnect, time passing, and persistence making changes
//! durable. After every step the store's own `check_invariants` runs, and this target checks
//! what clients rely on:
//! - an object a client is creating stays there, unsealed, where it was, until the client
//!   seals or aborts it or goes away (it may be writing it);
//! - an object a client holds a reference on, or a transfer has pinned, is never evicted,
//!   freed or moved;
//! - every region handed out lies inside its arena, and live objects never overlap;
//! - notifications go only to subscribed, connected clients;
//! - at the end, the log of durable changes replays to exactly the sealed objects, a fresh
//!   store recovers them all, and once every client is gone and everything is evicted and
//!   durable, no byte is left allocated.

#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use skyriver_core::store::recovery::replay;
use skyriver_core::store::{ObjectInfo, Store, StoreConfig, StoreOutput};
use skyriver_core::{ArenaId, ClientId, DurableChange, Instant, LocalRegion, ObjectId, RequestId};

const CLIENTS: u8 = 4;
const IDS: u8 = 16;
const ARENA_BYTES: u64 = 8192;
const MAX_OPS: usize = 256;

#[derive(Arbitrary, Debug)]
enum Op {
    Create {
        client: u8,
        id: u8,
        data_size: u16,
        metadata_size: u8,
    },
    Write {
        client: u8,
        id: u8,
    },
    Seal {
        client: u8,
        id: u8,
        release: bool,
    },
    Abort {
        client: u8,
        id: u8,
    },
    GetNow {
        client: u8,
        id: u8,
    },
    Get {
        client: u8,
        ids: Vec<u8>,
        timeout_ms: Option<u16>,
    },
    Release {
        client: u8,
        id: u8,
    },
    Delete {
        ids: Vec<u8>,
    },
    Evict {
        bytes: u16,
    },
    Pin {
        id: u8,
    },
    Unpin {
        id: u8,
    },
    Subscribe {
        client: u8,
    },
    Disconnect {
        client: u8,
    },
    Advance {
        ms: u16,
    },
    MakeDurable {
        changes: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    two_arenas: bool,
    persistent: bool,
    ops: Vec<Op>,
}

fn client(c: u8) -> ClientId {
    ClientId(u64::from(c % CLIENTS))
}

fn object(i: u8) -> ObjectId {
    ObjectId::from_u64(u64::from(i % IDS))
}

/// What the clients and transfers were handed, as the harness remembers it.
struct Harness {
    store: Store,
    arenas: BTreeMap<ArenaId, u64>,
    persistent: bool,
    now: Instant,
    next_request: u64,
    /// Unsealed objects, by creator, where they were created.
    creating: BTreeMap<ObjectId, (ClientId, LocalRegion)>,
    /// References held: count and where the object was.
    held: BTreeMap<(ClientId, ObjectId), (u32, LocalRegion)>,
    /// Pins taken: count and where the object was.
    pinned: BTreeMap<ObjectId, (u32, LocalRegion)>,
    subscribed: BTreeSet<ClientId>,
    /// Durable changes drained from the store, in order.
    log: Vec<DurableChange>,
    /// Changes drained but not yet made durable.
    unconfirmed: usize,
}

impl Harness {
    fn new(input: &Input) -> Self {
        let mut arenas = vec![(ArenaId(0), ARENA_BYTES)];
        if input.two_arenas {
            arenas.push((ArenaId(3), ARENA_BYTES / 2));
        }
        let store = Store::new(StoreConfig {
            arenas: arenas.clone(),
            max_batch_len: 8,
            record_durable_changes: input.persistent,
            hash_seed: 7,
            spill_limit_bytes: None,
        });
        Self {
            store,
            arenas: arenas.into_iter().collect(),
            persistent: input.persistent,
            now: Instant::ZERO,
            next_request: 0,
            creating: BTreeMap::new(),
            held: BTreeMap::new(),
            pinned: BTreeMap::new(),
            subscribed: BTreeSet::new(),
            log: Vec::new(),
            unconfirmed: 0,
        }
    }

    fn check_region(&self, info: &ObjectInfo) {
        let region = info.region;
        let arena_bytes = self.arenas.get(&region.arena).copied();
        assert!(
            arena_bytes.is_some_and(|len| region.offset + region.len <= len),
            "{} handed out outside its arena: {region:?}",
            info.id
        );
        assert_eq!(region.len, info.data_size + info.metadata_size);
    }

    fn take_reference(&mut self, c: ClientId, info: &ObjectInfo) {
        self.check_region(info);
        let entry = self.held.entry((c, info.id)).or_insert((0, info.region));
        assert_eq!(entry.1, info.region, "{} moved while held", info.id);
        entry.0 += 1;
    }

    fn drop_reference(&mut self, c: ClientId, id: ObjectId) {
        let entry = self
            .held
            .get_mut(&(c, id))
            .expect("a release the store took was held");
        entry.0 -= 1;
        if entry.0 == 0 {
            self.held.remove(&(c, id));
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Create {
                client: c,
                id,
                data_size,
                metadata_size,
            } => {
                let (c, id) = (client(c), object(id));
                let data_size = u64::from(data_size) % (ARENA_BYTES + 512);
                if let Ok(info) =
                    self.store
                        .create(self.now, c, id, data_size, u64::from(metadata_size))
                {
                    assert!(!self.creating.contains_key(&id));
                    self.creating.insert(id, (c, info.region));
                    self.take_reference(c, &info);
                }
            }
            Op::Write { client: c, id } => {
                // The creator writes its object's bytes: the region it was given is still its.
                let (c, id) = (client(c), object(id));
                if let Some(&(creator, region)) = self.creating.get(&id) {
                    if creator == c {
                        let summary = self.store.summary(&id).expect("an object being written");
                        assert!(!summary.sealed);
                        assert_eq!(summary.info.region, region, "{id} moved while written");
                    }
                }
            }
            Op::Seal {
                client: c,
                id,
                release,
            } => {
                let (c, id) = (client(c), object(id));
                let creator = self.creating.get(&id).map(|&(creator, _)| creator);
                match self.store.seal(c, id, release) {
                    Ok(info) => {
                        assert_eq!(creator, Some(c), "{c:?} sealed {id} it was not creating");
                        self.creating.remove(&id);
                        self.check_region(&info);
                        if release {
                            self.drop_reference(c, id);
                        }
                    }
                    Err(_) => assert_ne!(creator, Some(c), "its creator could not seal {id}"),
                }
            }
            Op::Abort { client: c, id } => {
                let (c, id) = (client(c), object(id));
                let creator = self.creating.get(&id).map(|&(creator, _)| creator);
                match self.store.abort(c, id) {
                    Ok(()) => {
                        assert_eq!(creator, Some(c), "{c:?} aborted {id} it was not creating");
                        self.creating.remove(&id);
                        self.held.remove(&(c, id));
                    }
                    Err(_) => assert_ne!(creator, Some(c), "its creator could not abort {id}"),
                }
            }
            Op::GetNow { client: c, id } => {
                let (c, id) = (client(c), object(id));
                if let Ok(info) = self.store.get_now(c, id) {
                    self.take_reference(c, &info);
                }
            }
            Op::Get {
                client: c,
                ids,
                timeout_ms,
            } => {
                let ids = ids.into_iter().take(10).map(object).collect();
                let request = RequestId(self.next_request);
                self.next_request += 1;
                let timeout = timeout_ms.map(|ms| Duration::from_millis(u64::from(ms % 2000)));
                self.store.get(self.now, client(c), request, ids, timeout);
            }
            Op::Release { client: c, id } => {
                let (c, id) = (client(c), object(id));
                let held = self.held.contains_key(&(c, id)) && !self.creating.contains_key(&id);
                match self.store.release(c, id) {
                    Ok(()) => {
                        assert!(held, "{c:?} released {id} it did not hold");
                        self.drop_reference(c, id);
                    }
                    Err(_) => assert!(!held, "{c:?} could not release {id} it held"),
                }
            }
            Op::Delete { ids } => {
                let ids: Vec<ObjectId> = ids.into_iter().take(10).map(object).collect();
                let results = self.store.delete(&ids);
                assert_eq!(results.len(), ids.len());
            }
            Op::Evict { bytes } => {
                let outcome = self.store.evict(u64::from(bytes));
                assert!(
                    outcome.bytes >= u64::from(bytes) || self.store.stats().evictable_bytes == 0
                );
            }
            Op::Pin { id } => {
                let id = object(id);
                if let Ok(info) = self.store.pin(id) {
                    self.check_region(&info);
                    let entry = self.pinned.entry(id).or_insert((0, info.region));
                    assert_eq!(entry.1, info.region, "{id} moved while pinned");
                    entry.0 += 1;
                }
            }
            Op::Unpin { id } => {
                let id = object(id);
                if let Some(entry) = self.pinned.get_mut(&id) {
                    entry.0 -= 1;
                    if entry.0 == 0 {
                        self.pinned.remove(&id);
                    }
                    self.store.unpin(id);
                }
            }
            Op::Subscribe { client: c } => {
                self.store.subscribe(client(c));
                self.subscribed.insert(client(c));
            }
            Op::Disconnect { client: c } => {
                let c = client(c);
                self.store.disconnect(c);
                self.subscribed.remove(&c);
                self.creating.retain(|_, &mut (creator, _)| creator != c);
                self.held.retain(|&(holder, _), _| holder != c);
            }
            Op::Advance { ms } => {
                self.now = self
                    .now
                    .saturating_add(Duration::from_millis(u64::from(ms)));
                self.store.handle_timeout(self.now);
            }
            Op::MakeDurable { changes } => {
                let upto =
                    (self.log.len() - self.unconfirmed + usize::from(changes)).min(self.log.len());
                self.unconfirmed = self.log.len() - upto;
                self.store.handle_durable(upto as u64);
            }
        }
    }

    /// Drains the store's outputs and checks what clients were handed.
    fn drain(&mut self) {
        while let Some(output) = self.store.poll_output() {
            match output {
                StoreOutput::GetReply {
                    client, results, ..
                } => {
                    for info in results.into_iter().flatten() {
                        self.take_reference(client, &info);
                    }
                }
                StoreOutput::Notify { client, .. } => {
                    assert!(
                        self.subscribed.contains(&client),
                        "{client:?} was not subscribed"
                    );
                }
                StoreOutput::Local(_) => {}
                // The fuzzed store has no spill tier: it never spills nor restores.
                other => panic!("a store without a spill tier put out {other:?}"),
            }
        }
        while let Some(change) = self.store.poll_durable_change() {
            assert!(
                self.persistent,
                "a durable change from a store that keeps none"
            );
            self.log.push(change);
            self.unconfirmed += 1;
        }
        assert_eq!(self.store.durable_changes_queued(), self.log.len() as u64);
    }

    /// The checks after every step.
    fn check(&self) {
        self.store.check_invariants();
        for (&id, &(creator, region)) in &self.creating {
            let summary = self
                .store
                .summary(&id)
                .expect("an object being created is there");
            assert!(
                !summary.sealed,
                "{id} sealed behind its creator {creator:?}"
            );
            assert_eq!(summary.info.region, region, "{id} moved while created");
        }
        for (&(holder, id), &(_, region)) in &self.held {
            let summary = self.store.summary(&id);
            assert!(summary.is_some(), "{id} held by {holder:?} is gone");
            assert_eq!(
                summary.map(|s| s.info.region),
                Some(region),
                "{id} moved while held"
            );
        }
        for (&id, &(count, region)) in &self.pinned {
            let summary = self.store.summary(&id).expect("a pinned object is there");
            assert_eq!(summary.pin_count, count, "pins of {id}");
            assert_eq!(summary.info.region, region, "{id} moved while pinned");
        }
        let mut regions: Vec<LocalRegion> =
            self.store.list().iter().map(|s| s.info.region).collect();
        regions.sort_by_key(|r| (r.arena, r.offset));
        for pair in regions.windows(2) {
            assert!(
                pair[0].arena != pair[1].arena || pair[0].offset + pair[0].len <= pair[1].offset,
                "objects overlap: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }

    /// The end: the durable log against the store, then everyone leaves.
    fn finish(mut self) {
        if self.persistent {
            let mut recorded: Vec<_> = replay(&self.log)
                .into_iter()
                .map(|r| {
                    (
                        r.id,
                        r.block.arena,
                        r.block.offset,
                        r.data_size,
                        r.metadata_size,
                    )
                })
                .collect();
            recorded.sort();
            let sealed: Vec<_> = self
                .store
                .list()
                .into_iter()
                .filter(|s| s.sealed)
                .map(|s| {
                    let i = s.info;
                    (
                        i.id,
                        i.region.arena,
                        i.region.offset,
                        i.data_size,
                        i.metadata_size,
                    )
                })
                .collect();
            assert_eq!(
                recorded, sealed,
                "the durable log replays to the sealed objects"
            );
            let mut fresh = Store::new(self.store.config().clone());
            let report = fresh.recover(Instant::ZERO, replay(&self.log));
            assert!(
                report.refused.is_empty(),
                "a fresh store refused {:?}",
                report.refused
            );
            fresh.check_invariants();
        }
        for (id, (count, _)) in std::mem::take(&mut self.pinned) {
            for _ in 0..count {
                self.store.unpin(id);
            }
        }
        for c in 0..CLIENTS {
            self.store.disconnect(client(c));
        }
        self.store.evict(u64::MAX);
        self.store
            .handle_durable(self.store.durable_changes_queued());
        self.store.check_invariants();
        let stats = self.store.stats();
        assert_eq!(
            stats.object_count,
            0,
            "objects left: {:?}",
            self.store.list()
        );
        assert_eq!(stats.allocated_bytes, 0, "bytes left allocated");
        assert_eq!(self.store.quarantined_bytes(), 0);
    }
}

fuzz_target!(|input: Input| {
    let mut harness = Harness::new(&input);
    for op in input.ops.into_iter().take(MAX_OPS) {
        harness.apply(op);
        harness.drain();
        harness.check();
    }
    harness.finish();
});
