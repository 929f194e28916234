use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::ids::RequestId;

const A: ClientId = ClientId(1);
const B: ClientId = ClientId(2);

fn id(n: u64) -> ObjectId {
    ObjectId::from_u64(n)
}

fn store(capacity: u64) -> Store {
    let mut store = Store::new(StoreConfig::single_arena(capacity));
    store.connect(A);
    store.connect(B);
    store
}

fn outputs(store: &mut Store) -> Vec<StoreOutput> {
    std::iter::from_fn(|| store.poll_output()).collect()
}

type GetReply = (ClientId, RequestId, Vec<Result<ObjectInfo, StoreError>>);

fn get_replies(store: &mut Store) -> Vec<GetReply> {
    outputs(store)
        .into_iter()
        .filter_map(|o| match o {
            StoreOutput::GetReply {
                client,
                request,
                results,
            } => Some((client, request, results)),
            _ => None,
        })
        .collect()
}

fn put(store: &mut Store, client: ClientId, object: ObjectId, size: u64) -> ObjectInfo {
    store
        .create(Instant::ZERO, client, object, size, 0)
        .unwrap();
    store.seal(client, object, true).unwrap()
}

#[test]
fn create_seal_get_release_lifecycle() {
    let mut store = store(1 << 20);
    let info = store.create(Instant::ZERO, A, id(1), 100, 10).unwrap();
    assert_eq!(info.region.len, 110);
    assert_eq!(info.metadata_region().offset, info.region.offset + 100);
    assert!(!store.contains(&id(1)), "unsealed objects are not visible");
    assert_eq!(
        store.get_now(B, id(1)),
        Err(StoreError::ObjectNotSealed(id(1)))
    );
    store.seal(A, id(1), true).unwrap();
    assert!(store.contains(&id(1)));
    let got = store.get_now(B, id(1)).unwrap();
    assert_eq!(got, info);
    assert_eq!(
        store.delete(&[id(1)]),
        vec![Err(StoreError::ObjectInUse(id(1)))]
    );
    assert!(
        store.contains(&id(1)),
        "delete is deferred while B holds it"
    );
    store.release(B, id(1)).unwrap();
    assert!(
        !store.contains(&id(1)),
        "deferred delete ran at the last release"
    );
    assert_eq!(store.release(B, id(1)), Err(StoreError::NotHeld(id(1))));
    store.check_invariants();
}

#[test]
fn errors_clients_can_match() {
    let mut store = store(1 << 20);
    store.create(Instant::ZERO, A, id(1), 10, 0).unwrap();
    assert_eq!(
        store.create(Instant::ZERO, B, id(1), 10, 0),
        Err(StoreError::ObjectExists(id(1)))
    );
    assert_eq!(
        store.seal(B, id(1), true),
        Err(StoreError::NotCreator(id(1)))
    );
    assert_eq!(store.abort(B, id(1)), Err(StoreError::NotCreator(id(1))));
    assert_eq!(
        store.delete(&[id(1)]),
        vec![Err(StoreError::ObjectNotSealed(id(1)))]
    );
    store.seal(A, id(1), true).unwrap();
    assert_eq!(
        store.seal(A, id(1), true),
        Err(StoreError::AlreadySealed(id(1)))
    );
    assert_eq!(store.abort(A, id(1)), Err(StoreError::AlreadySealed(id(1))));
    assert_eq!(
        store.delete(&[id(9)]),
        vec![Err(StoreError::ObjectNotFound(id(9)))]
    );
    assert!(matches!(
        store.create(Instant::ZERO, A, id(2), 2 << 20, 0),
        Err(StoreError::ObjectTooLarge { .. })
    ));
    assert!(matches!(
        store.create(Instant::ZERO, A, id(2), u64::MAX, 1),
        Err(StoreError::ObjectTooLarge {
            requested_bytes: u64::MAX,
            ..
        })
    ));
    store.check_invariants();
}

#[test]
fn abort_frees_the_space() {
    let mut store = store(4096);
    store.create(Instant::ZERO, A, id(1), 4096, 0).unwrap();
    assert!(matches!(
        store.create(Instant::ZERO, A, id(2), 64, 0),
        Err(StoreError::OutOfMemory { .. })
    ));
    store.abort(A, id(1)).unwrap();
    store.create(Instant::ZERO, A, id(2), 4096, 0).unwrap();
    store.check_invariants();
}

#[test]
fn get_waits_for_seal_and_times_out() {
    let mut store = store(1 << 20);
    let now = Instant(1_000);
    store.get(
        now,
        B,
        RequestId(5),
        vec![id(1), id(2)],
        Some(Duration::from_millis(10)),
    );
    assert!(get_replies(&mut store).is_empty(), "neither is sealed yet");
    assert_eq!(store.poll_timeout(), Some(now + Duration::from_millis(10)));
    put(&mut store, A, id(1), 64);
    assert!(get_replies(&mut store).is_empty(), "id 2 still missing");
    store.handle_timeout(now + Duration::from_millis(9));
    assert!(
        get_replies(&mut store).is_empty(),
        "early timeouts are no-ops"
    );
    store.handle_timeout(now + Duration::from_millis(10));
    let replies = get_replies(&mut store);
    assert_eq!(replies.len(), 1);
    let (client, request, results) = &replies[0];
    assert_eq!((*client, *request), (B, RequestId(5)));
    assert!(results[0].is_ok());
    assert_eq!(results[1], Err(StoreError::Timeout(id(2))));
    assert_eq!(store.poll_timeout(), None);
    store.release(B, id(1)).unwrap();
    store.check_invariants();
}

#[test]
fn a_waiting_get_hears_at_once_that_its_object_was_aborted() {
    let mut store = store(1 << 20);
    let now = Instant(1_000);
    store.create(now, A, id(1), 64, 0).unwrap();
    store.create(now, A, id(2), 64, 0).unwrap();
    store.get(now, B, RequestId(7), vec![id(1), id(3)], None);
    store.get(now, B, RequestId(8), vec![id(2)], None);
    store.abort(A, id(1)).unwrap();
    assert!(get_replies(&mut store).is_empty(), "id 3 is still awaited");
    put(&mut store, A, id(3), 8);
    let replies = get_replies(&mut store);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].1, RequestId(7));
    assert_eq!(replies[0].2[0], Err(StoreError::Aborted(id(1))));
    assert!(replies[0].2[1].is_ok());
    store.release(B, id(3)).unwrap();
    // The creator going away aborts its unsealed objects, for waiters too.
    store.disconnect(A);
    let replies = get_replies(&mut store);
    assert_eq!(replies.len(), 1);
    assert_eq!(
        (replies[0].1, &replies[0].2),
        (RequestId(8), &vec![Err(StoreError::Aborted(id(2)))])
    );
    assert_eq!(store.poll_timeout(), None, "no waiter is left");
    store.check_invariants();
}

#[test]
fn get_completes_when_the_last_object_is_sealed() {
    let mut store = store(1 << 20);
    store.get(
        Instant::ZERO,
        B,
        RequestId(1),
        vec![id(1), id(1), id(2)],
        None,
    );
    put(&mut store, A, id(2), 64);
    put(&mut store, A, id(1), 64);
    let replies = get_replies(&mut store);
    assert_eq!(replies.len(), 1);
    assert!(replies[0].2.iter().all(Result::is_ok));
    // Two references to id 1 (it was named twice), one to id 2.
    store.release(B, id(1)).unwrap();
    store.release(B, id(1)).unwrap();
    assert_eq!(store.release(B, id(1)), Err(StoreError::NotHeld(id(1))));
    store.release(B, id(2)).unwrap();
    store.check_invariants();
}

#[test]
fn poll_reports_state_not_timeout() {
    let mut store = store(1 << 20);
    store.create(Instant::ZERO, A, id(1), 10, 0).unwrap();
    store.get(
        Instant::ZERO,
        B,
        RequestId(1),
        vec![id(1), id(2)],
        Some(Duration::ZERO),
    );
    let replies = get_replies(&mut store);
    assert_eq!(
        replies[0].2,
        vec![
            Err(StoreError::ObjectNotSealed(id(1))),
            Err(StoreError::ObjectNotFound(id(2)))
        ]
    );
}

#[test]
fn eviction_is_lru_and_spares_held_and_pinned_objects() {
    let mut store = store(4 * 1024);
    for n in 1..=4 {
        put(&mut store, A, id(n), 1024);
    }
    // Touch 1 (get + release): it becomes the most recently used.
    store.get_now(B, id(1)).unwrap();
    store.release(B, id(1)).unwrap();
    // Hold 2, pin 3: only 4 and 1 are evictable, 4 first.
    store.get_now(B, id(2)).unwrap();
    store.pin(id(3)).unwrap();
    let _ = outputs(&mut store);
    put(&mut store, A, id(5), 1024);
    assert!(!store.contains(&id(4)), "least recently used goes first");
    assert!(store.contains(&id(1)));
    put(&mut store, A, id(6), 1024);
    assert!(!store.contains(&id(1)));
    store.get_now(B, id(5)).unwrap();
    store.get_now(B, id(6)).unwrap();
    let err = store.create(Instant::ZERO, A, id(7), 1024, 0).unwrap_err();
    assert!(matches!(err, StoreError::OutOfMemory { .. }), "{err}");
    assert!(store.contains(&id(2)) && store.contains(&id(3)));
    let deleted: Vec<ObjectId> = outputs(&mut store)
        .into_iter()
        .filter_map(|o| match o {
            StoreOutput::Local(ObjectEvent::Deleted { id }) => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, vec![id(4), id(1)]);
    store.unpin(id(3));
    assert_eq!(
        store.evict(1),
        EvictOutcome {
            objects: 1,
            bytes: 1024
        }
    );
    assert!(!store.contains(&id(3)));
    store.check_invariants();
}

#[test]
fn deleting_a_pinned_object_waits_for_unpin() {
    let mut store = store(1 << 20);
    put(&mut store, A, id(1), 64);
    store.pin(id(1)).unwrap();
    assert_eq!(
        store.delete(&[id(1)]),
        vec![Err(StoreError::ObjectInUse(id(1)))]
    );
    assert_eq!(
        store.pin(id(1)),
        Err(StoreError::ObjectNotFound(id(1))),
        "no new pins once deleted"
    );
    assert!(store.sealed_info(&id(1)).is_some());
    store.unpin(id(1));
    assert!(store.sealed_info(&id(1)).is_none());
    store.check_invariants();
}

#[test]
fn disconnect_releases_references_and_aborts_unsealed_objects() {
    let mut store = store(1 << 20);
    put(&mut store, A, id(1), 64);
    store.get_now(B, id(1)).unwrap();
    store.get_now(B, id(1)).unwrap();
    store.create(Instant::ZERO, B, id(2), 64, 0).unwrap();
    store.get(Instant::ZERO, B, RequestId(1), vec![id(3)], None);
    store.subscribe(B);
    store.disconnect(B);
    assert!(
        store.list().iter().all(|s| s.info.id != id(2)),
        "unsealed object aborted"
    );
    assert_eq!(store.list()[0].ref_count, 0);
    assert_eq!(store.stats().waiting_gets, 0);
    let _ = outputs(&mut store);
    put(&mut store, A, id(3), 64);
    assert!(
        outputs(&mut store).iter().all(|o| !matches!(
            o,
            StoreOutput::Notify { client: B, .. } | StoreOutput::GetReply { client: B, .. }
        )),
        "nothing is sent to a gone client"
    );
    store.check_invariants();
}

#[test]
fn subscribers_hear_seals_and_deletes() {
    let mut store = store(1 << 20);
    store.subscribe(B);
    put(&mut store, A, id(1), 64);
    store.delete(&[id(1)]).into_iter().for_each(|r| r.unwrap());
    let events: Vec<ObjectEvent> = outputs(&mut store)
        .into_iter()
        .filter_map(|o| match o {
            StoreOutput::Notify { client: B, event } => Some(event),
            _ => None,
        })
        .collect();
    assert_eq!(
        events,
        vec![
            ObjectEvent::Sealed {
                id: id(1),
                data_size: 64,
                metadata_size: 0
            },
            ObjectEvent::Deleted { id: id(1) },
        ]
    );
}

// ---- Model test: random operations from several clients against a reference model. ----
//
// Every object is one 64-byte block, so capacity is a number of slots and fragmentation cannot
// make the model and the store disagree; the model keeps its own LRU order.

const SLOTS: usize = 6;
const CLIENTS: u64 = 3;
const IDS: u64 = 8;

#[derive(Debug, Clone)]
enum Op {
    Create(u64, u64),
    Seal(u64, u64),
    Abort(u64, u64),
    GetNow(u64, u64),
    Release(u64, u64),
    Delete(u64),
    Evict(u64),
    Pin(u64),
    Unpin(u64),
    HoldAsRecord(u64),
    ReleaseRecord(u64),
    Disconnect(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..CLIENTS;
    let i = 0..IDS;
    prop_oneof![
        3 => (c.clone(), i.clone()).prop_map(|(c, i)| Op::Create(c, i)),
        3 => (c.clone(), i.clone()).prop_map(|(c, i)| Op::Seal(c, i)),
        1 => (c.clone(), i.clone()).prop_map(|(c, i)| Op::Abort(c, i)),
        3 => (c.clone(), i.clone()).prop_map(|(c, i)| Op::GetNow(c, i)),
        3 => (c.clone(), i.clone()).prop_map(|(c, i)| Op::Release(c, i)),
        2 => i.clone().prop_map(Op::Delete),
        1 => (0..4u64).prop_map(Op::Evict),
        1 => i.clone().prop_map(Op::Pin),
        1 => i.clone().prop_map(Op::Unpin),
        1 => i.clone().prop_map(Op::HoldAsRecord),
        1 => i.clone().prop_map(Op::ReleaseRecord),
        1 => c.prop_map(Op::Disconnect),
    ]
}

#[derive(Debug, Clone, Default)]
struct ModelObject {
    creator: u64,
    sealed: bool,
    refs: BTreeMap<u64, u32>,
    pins: u32,
    delete_pending: bool,
    /// Held as a copy of record: never evicted (there is no spill tier here).
    record: bool,
}

impl ModelObject {
    fn ref_count(&self) -> u32 {
        self.refs.values().sum()
    }
    fn evictable(&self) -> bool {
        self.sealed
            && self.ref_count() == 0
            && self.pins == 0
            && !self.delete_pending
            && !self.record
    }
}

#[derive(Debug, Default)]
struct Model {
    objects: BTreeMap<u64, ModelObject>,
    /// Evictable ids, least recently used first.
    lru: Vec<u64>,
}

impl Model {
    fn settle(&mut self, i: u64) {
        let Some(object) = self.objects.get(&i) else {
            self.lru.retain(|&x| x != i);
            return;
        };
        if object.delete_pending && object.ref_count() == 0 && object.pins == 0 {
            self.objects.remove(&i);
            self.lru.retain(|&x| x != i);
            return;
        }
        let in_lru = self.lru.contains(&i);
        if object.evictable() && !in_lru {
            self.lru.push(i);
        } else if !object.evictable() && in_lru {
            self.lru.retain(|&x| x != i);
        }
    }

    fn remove(&mut self, i: u64) {
        self.objects.remove(&i);
        self.lru.retain(|&x| x != i);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn store_agrees_with_reference_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut store = Store::new(StoreConfig::single_arena((SLOTS * 64) as u64));
        let mut model = Model::default();
        let client = |c: u64| ClientId(c);
        for op in ops {
            match op {
                Op::Create(c, i) => {
                    let result = store.create(Instant::ZERO, client(c), id(i), 40, 8);
                    if model.objects.contains_key(&i) {
                        prop_assert_eq!(result, Err(StoreError::ObjectExists(id(i))));
                    } else if model.objects.len() < SLOTS {
                        prop_assert!(result.is_ok());
                    } else if let Some(&victim) = model.lru.first() {
                        prop_assert!(result.is_ok());
                        prop_assert!(!store.contains(&id(victim)), "LRU victim {} evicted", victim);
                        model.remove(victim);
                    } else {
                        let is_oom = matches!(result, Err(StoreError::OutOfMemory { .. }));
                        prop_assert!(is_oom, "{:?}", result);
                    }
                    if store.list().iter().any(|s| s.info.id == id(i)) && !model.objects.contains_key(&i) {
                        let mut object = ModelObject { creator: c, ..Default::default() };
                        object.refs.insert(c, 1);
                        model.objects.insert(i, object);
                    }
                }
                Op::Seal(c, i) => {
                    let result = store.seal(client(c), id(i), true);
                    match model.objects.get_mut(&i) {
                        None => prop_assert_eq!(result, Err(StoreError::ObjectNotFound(id(i)))),
                        Some(o) if o.sealed => prop_assert_eq!(result, Err(StoreError::AlreadySealed(id(i)))),
                        Some(o) if o.creator != c => prop_assert_eq!(result, Err(StoreError::NotCreator(id(i)))),
                        Some(o) => {
                            prop_assert!(result.is_ok());
                            o.sealed = true;
                            let count = o.refs.get_mut(&c).unwrap();
                            *count -= 1;
                            if *count == 0 { o.refs.remove(&c); }
                            model.settle(i);
                        }
                    }
                }
                Op::Abort(c, i) => {
                    let result = store.abort(client(c), id(i));
                    match model.objects.get(&i) {
                        None => prop_assert_eq!(result, Err(StoreError::ObjectNotFound(id(i)))),
                        Some(o) if o.sealed => prop_assert_eq!(result, Err(StoreError::AlreadySealed(id(i)))),
                        Some(o) if o.creator != c => prop_assert_eq!(result, Err(StoreError::NotCreator(id(i)))),
                        Some(_) => {
                            prop_assert!(result.is_ok());
                            model.remove(i);
                        }
                    }
                }
                Op::GetNow(c, i) => {
                    let result = store.get_now(client(c), id(i));
                    match model.objects.get_mut(&i) {
                        None => prop_assert_eq!(result, Err(StoreError::ObjectNotFound(id(i)))),
                        Some(o) if !o.sealed => prop_assert_eq!(result, Err(StoreError::ObjectNotSealed(id(i)))),
                        Some(o) => {
                            prop_assert!(result.is_ok());
                            *o.refs.entry(c).or_default() += 1;
                            model.settle(i);
                        }
                    }
                }
                Op::Release(c, i) => {
                    let result = store.release(client(c), id(i));
                    let held = model.objects.get(&i).and_then(|o| o.refs.get(&c)).copied().unwrap_or(0);
                    if held == 0 {
                        prop_assert_eq!(result, Err(StoreError::NotHeld(id(i))));
                    } else if !model.objects[&i].sealed {
                        prop_assert_eq!(result, Err(StoreError::ObjectNotSealed(id(i))));
                    } else {
                        prop_assert!(result.is_ok());
                        let o = model.objects.get_mut(&i).unwrap();
                        let count = o.refs.get_mut(&c).unwrap();
                        *count -= 1;
                        if *count == 0 { o.refs.remove(&c); }
                        model.settle(i);
                    }
                }
                Op::Delete(i) => {
                    let result = store.delete(&[id(i)]).remove(0);
                    match model.objects.get_mut(&i) {
                        None => prop_assert_eq!(result, Err(StoreError::ObjectNotFound(id(i)))),
                        Some(o) if !o.sealed => prop_assert_eq!(result, Err(StoreError::ObjectNotSealed(id(i)))),
                        Some(o) if o.ref_count() > 0 || o.pins > 0 => {
                            prop_assert_eq!(result, Err(StoreError::ObjectInUse(id(i))));
                            o.delete_pending = true;
                            model.settle(i);
                        }
                        Some(_) => {
                            prop_assert!(result.is_ok());
                            model.remove(i);
                        }
                    }
                }
                Op::Evict(n) => {
                    let outcome = store.evict(n * 64);
                    let expected = (n as usize).min(model.lru.len());
                    prop_assert_eq!(outcome.objects as usize, expected);
                    for victim in model.lru.drain(..expected).collect::<Vec<_>>() {
                        model.objects.remove(&victim);
                    }
                }
                Op::Pin(i) => {
                    let result = store.pin(id(i));
                    match model.objects.get_mut(&i) {
                        Some(o) if o.sealed && !o.delete_pending => {
                            prop_assert!(result.is_ok());
                            o.pins += 1;
                            model.settle(i);
                        }
                        _ => prop_assert!(result.is_err()),
                    }
                }
                Op::Unpin(i) => {
                    if let Some(o) = model.objects.get_mut(&i).filter(|o| o.pins > 0) {
                        store.unpin(id(i));
                        o.pins -= 1;
                        model.settle(i);
                    }
                }
                Op::HoldAsRecord(i) => {
                    let result = store.hold_as_record(id(i));
                    match model.objects.get_mut(&i) {
                        Some(o) if o.sealed && !o.delete_pending => {
                            prop_assert!(result.is_ok());
                            o.record = true;
                            model.settle(i);
                        }
                        _ => prop_assert!(result.is_err()),
                    }
                    prop_assert_eq!(store.is_record(&id(i)), model.objects.get(&i).is_some_and(|o| o.record));
                }
                Op::ReleaseRecord(i) => {
                    store.release_record(id(i));
                    if let Some(o) = model.objects.get_mut(&i) {
                        o.record = false;
                        model.settle(i);
                    }
                    prop_assert!(!store.is_record(&id(i)));
                }
                Op::Disconnect(c) => {
                    store.disconnect(client(c));
                    let ids: Vec<u64> = model.objects.keys().copied().collect();
                    for i in ids {
                        let o = model.objects.get_mut(&i).unwrap();
                        if !o.sealed && o.creator == c {
                            model.remove(i);
                        } else {
                            o.refs.remove(&c);
                            model.settle(i);
                        }
                    }
                }
            }
            store.check_invariants();
            let listed: Vec<(u64, bool, u32)> = store
                .list()
                .iter()
                .map(|s| (u64::from_be_bytes(s.info.id.0[12..].try_into().unwrap()), s.sealed, s.ref_count))
                .collect();
            let expected: Vec<(u64, bool, u32)> = model
                .objects
                .iter()
                .map(|(&i, o)| (i, o.sealed, o.ref_count()))
                .collect();
            prop_assert_eq!(listed, expected);
            let _ = std::iter::from_fn(|| store.poll_output()).count();
        }
    }
}
