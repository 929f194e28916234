//! Objects held for waiting gets, under random gets, spill and restore completions (in any
//! order, some failing), timeouts, releases, deletes and disconnects: after every step the
//! store's invariants hold, among them that the index of held objects finds exactly what a
//! walk of all of them would (see `held_for_gets`).

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::ids::{ClientId, RequestId};
use crate::store::StoreConfig;

/// The writer; `READERS` clients get.
const WRITER: ClientId = ClientId(1);
const READERS: u64 = 3;
/// Object size: the memory holds four of them.
const LEN: u64 = 1000;
const MEMORY: u64 = 4096;
const OBJECTS: u64 = 12;

#[derive(Debug, Clone)]
enum Step {
    Put(u64),
    /// A get by a reader of some ids (may repeat), with a timeout in ms (`None`: for ever).
    Get {
        reader: u64,
        ids: Vec<u64>,
        timeout_ms: Option<u64>,
    },
    /// Completes the n-th spill or restore output not answered yet, failing it or not.
    Complete {
        nth: usize,
        ok: bool,
    },
    Advance(u64),
    /// A reader releases everything its gets gave it.
    ReleaseAll(u64),
    Delete(u64),
    Disconnect(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..OBJECTS).prop_map(Step::Put),
        (
            0..READERS,
            prop::collection::vec(0..OBJECTS, 1..6),
            prop::option::of(0..50u64)
        )
            .prop_map(|(reader, ids, timeout_ms)| Step::Get {
                reader,
                ids,
                timeout_ms,
            }),
        (0..8usize, prop::bool::weighted(0.9)).prop_map(|(nth, ok)| Step::Complete { nth, ok }),
        (0..30u64).prop_map(Step::Advance),
        (0..READERS).prop_map(Step::ReleaseAll),
        (0..OBJECTS).prop_map(Step::Delete),
        (0..READERS).prop_map(Step::Disconnect),
    ]
}

/// A spill or restore the test has not answered yet.
#[derive(Debug, Clone, Copy)]
enum Io {
    Spill(SpillOpId),
    Restore(SpillOpId),
}

struct Run {
    store: Store,
    now: Instant,
    io: Vec<Io>,
    /// References each reader's gets gave it.
    taken: Vec<Vec<ObjectId>>,
    next_request: u64,
    next_place: u64,
}

impl Run {
    fn new() -> Self {
        let mut config = StoreConfig::single_arena(MEMORY);
        config.spill_limit_bytes = Some(1 << 20);
        let mut store = Store::new(config);
        store.connect(WRITER);
        Self {
            store,
            now: Instant(0),
            io: Vec::new(),
            taken: vec![Vec::new(); READERS as usize],
            next_request: 0,
            next_place: 0,
        }
    }

    fn reader(n: u64) -> ClientId {
        ClientId(10 + n)
    }

    fn apply(&mut self, step: Step) {
        match step {
            Step::Put(n) => {
                if self
                    .store
                    .create(self.now, WRITER, ObjectId::from_u64(n), LEN, 0)
                    .is_ok()
                {
                    self.store
                        .seal(WRITER, ObjectId::from_u64(n), true)
                        .expect("the creator seals");
                }
            }
            Step::Get {
                reader,
                ids,
                timeout_ms,
            } => {
                self.next_request += 1;
                self.store.get(
                    self.now,
                    Self::reader(reader),
                    RequestId(self.next_request),
                    ids.into_iter().map(ObjectId::from_u64).collect(),
                    timeout_ms.map(Duration::from_millis),
                );
            }
            Step::Complete { nth, ok } => {
                if !self.io.is_empty() {
                    match self.io.remove(nth % self.io.len()) {
                        Io::Spill(op) => {
                            self.next_place += 1;
                            let result = if ok {
                                Ok(SpillPlace {
                                    file: 0,
                                    offset: self.next_place,
                                })
                            } else {
                                Err(SpillError::NoSpace)
                            };
                            self.store.handle_spill_done(op, result);
                        }
                        Io::Restore(op) => {
                            let result = if ok {
                                Ok(())
                            } else {
                                Err(RestoreError::Damaged)
                            };
                            self.store.handle_restore_done(op, result);
                        }
                    }
                }
            }
            Step::Advance(ms) => {
                self.now = self.now.saturating_add(Duration::from_millis(ms));
                self.store.handle_timeout(self.now);
            }
            Step::ReleaseAll(reader) => {
                for id in std::mem::take(&mut self.taken[reader as usize]) {
                    self.store
                        .release(Self::reader(reader), id)
                        .expect("a reference a get gave");
                }
            }
            Step::Delete(n) => {
                let _ = self.store.delete(&[ObjectId::from_u64(n)]);
            }
            Step::Disconnect(reader) => {
                self.store.disconnect(Self::reader(reader));
                self.taken[reader as usize].clear();
            }
        }
        // As the node does after every input.
        self.store.retry_restores();
        self.drain();
        self.store.check_invariants();
    }

    fn drain(&mut self) {
        while let Some(output) = self.store.poll_output() {
            match output {
                StoreOutput::Spill { op, .. } => self.io.push(Io::Spill(op)),
                StoreOutput::Restore { op, .. } => self.io.push(Io::Restore(op)),
                StoreOutput::GetReply {
                    client, results, ..
                } => {
                    let taken = &mut self.taken[(client.0 - 10) as usize];
                    taken.extend(results.into_iter().flatten().map(|info| info.id));
                }
                _ => {}
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn objects_held_for_gets_stay_indexed(steps in prop::collection::vec(step(), 1..80)) {
        let mut run = Run::new();
        for step in steps {
            run.apply(step);
        }
    }
}

/// A batch get holds what it found in memory while it waits for the rest, and the objects
/// go back to being evictable once it completes, whichever way: answered, timed out, or its
/// client gone.
#[test]
fn a_get_holds_what_it_found_until_it_completes() {
    for ending in ["restored", "timeout", "disconnect"] {
        let mut run = Run::new();
        for n in 0..6 {
            run.apply(Step::Put(n));
            while !run.io.is_empty() {
                run.apply(Step::Complete { nth: 0, ok: true });
            }
        }
        assert!(run.store.is_spilled(&ObjectId::from_u64(0)), "{ending}");
        let in_memory = ObjectId::from_u64(5);
        assert_eq!(run.store.tier(&in_memory), Some(StorageTier::Memory));
        run.apply(Step::Get {
            reader: 0,
            ids: vec![5, 0],
            timeout_ms: Some(10),
        });
        assert!(
            run.store.is_pinned(&in_memory),
            "{ending}: held for the get"
        );
        match ending {
            "restored" => {
                while !run.io.is_empty() {
                    run.apply(Step::Complete { nth: 0, ok: true });
                }
                assert_eq!(run.taken[0].len(), 2, "the get was answered");
                run.apply(Step::ReleaseAll(0));
            }
            "timeout" => run.apply(Step::Advance(10)),
            _ => run.apply(Step::Disconnect(0)),
        }
        assert!(!run.store.is_pinned(&in_memory), "{ending}: released");
    }
}

/// Restores waiting for memory start in the order they were asked for; a delete of one that
/// waits takes it out of line (without searching the line), and the others still start.
#[test]
fn a_deleted_object_leaves_the_restore_queue_and_the_others_keep_their_order() {
    let mut run = Run::new();
    for n in 0..OBJECTS {
        run.apply(Step::Put(n));
        while !run.io.is_empty() {
            run.apply(Step::Complete { nth: 0, ok: true });
        }
    }
    // As many as the memory can hold with room to spare (a get holds all it asked for).
    let spilled: Vec<u64> = (0..OBJECTS)
        .filter(|&n| run.store.is_spilled(&ObjectId::from_u64(n)))
        .take(3)
        .collect();
    assert_eq!(spilled.len(), 3, "most objects are on disk");
    run.apply(Step::Get {
        reader: 0,
        ids: spilled.clone(),
        timeout_ms: None,
    });
    let queued = run.store.spill_stats().restores_queued as usize;
    assert!(queued >= 2, "restores wait for memory: {queued} queued");
    let deleted = spilled[spilled.len() - queued];
    assert_eq!(
        run.store.delete(&[ObjectId::from_u64(deleted)]),
        vec![Ok(())]
    );
    run.store.check_invariants();
    assert_eq!(
        run.store.spill_stats().restores_queued as usize,
        queued - 1,
        "out of line"
    );
    // Complete the IO in order, noting the order restores start in.
    let mut restored = Vec::new();
    while !run.io.is_empty() {
        if let Io::Restore(op) = run.io[0] {
            restored.push(op);
        }
        run.apply(Step::Complete { nth: 0, ok: true });
    }
    assert_eq!(
        run.taken[0].len(),
        spilled.len() - 1,
        "all but the deleted one"
    );
    assert_eq!(restored.len(), spilled.len() - 1);
    let mut order: Vec<ObjectId> = run.taken[0].clone();
    order.sort();
    let expected: Vec<ObjectId> = spilled
        .iter()
        .filter(|&&n| n != deleted)
        .map(|&n| ObjectId::from_u64(n))
        .collect();
    assert_eq!(order, expected);
    assert_eq!(run.store.spill_stats().restores_queued, 0);
}
