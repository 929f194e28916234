//! What the store's spill path costs per object as the working set grows: the pattern of
//! `skyriver bench spill` (a working set of 4× memory in small objects, written, then read
//! back in random batches of 256) with every spill and restore completed at once, so only the
//! store's own work is measured. A program to run by hand, in release, not a timed assertion:
//!
//! ```text
//! cargo test --release -p skyriver-daemon --test store_spill_cost -- --ignored --nocapture
//! ```
//!
//! Per-object costs that do not grow with the working set show as flat columns. (Here rather
//! than in `core`, which has no clock.)

use std::time::Duration;

use skyriver_core::store::{SpillPlace, Store, StoreConfig, StoreOutput};
use skyriver_core::{ClientId, Instant, ObjectId, RequestId};

const WRITER: ClientId = ClientId(1);
const READER: ClientId = ClientId(2);
const OBJECT_BYTES: u64 = 4096;
const BATCH: usize = 256;

/// Completes every spill and restore the store asked for, in order, and takes the reader's
/// replies; returns the ids the replies gave.
fn drive(store: &mut Store, replies: &mut Vec<ObjectId>) {
    let mut place = 0;
    loop {
        store.retry_restores();
        let mut io = Vec::new();
        while let Some(output) = store.poll_output() {
            match output {
                StoreOutput::Spill { op, .. } => io.push((op, true)),
                StoreOutput::Restore { op, .. } => io.push((op, false)),
                StoreOutput::GetReply { results, .. } => {
                    replies.extend(results.into_iter().map(|r| r.expect("restored").id));
                }
                _ => {}
            }
        }
        if io.is_empty() {
            return;
        }
        for (op, spill) in io {
            if spill {
                place += 1;
                store.handle_spill_done(
                    op,
                    Ok(SpillPlace {
                        file: 0,
                        offset: place,
                    }),
                );
            } else {
                store.handle_restore_done(op, Ok(()));
            }
            store.retry_restores();
        }
    }
}

/// Fisher–Yates with a xorshift generator seeded by `seed` (the order is the same every run).
fn shuffle(ids: &mut [ObjectId], seed: u64) {
    let mut state = seed | 1;
    for i in (1..ids.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ids.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

/// (write, random get) seconds per object for a store of `memory` bytes.
fn run(memory: u64) -> (f64, f64, u64) {
    let mut config = StoreConfig::single_arena(memory);
    config.spill_limit_bytes = Some(u64::MAX / 2);
    let mut store = Store::new(config);
    store.connect(WRITER);
    store.connect(READER);
    let objects = 4 * memory / OBJECT_BYTES;
    let ids: Vec<ObjectId> = (0..objects).map(ObjectId::from_u64).collect();
    let mut replies = Vec::new();
    let start = std::time::Instant::now();
    for &id in &ids {
        if store
            .create(Instant(0), WRITER, id, OBJECT_BYTES, 0)
            .is_err()
        {
            drive(&mut store, &mut replies);
            store
                .create(Instant(0), WRITER, id, OBJECT_BYTES, 0)
                .expect("room once spills completed");
        }
        store.seal(WRITER, id, true).expect("sealed by its creator");
        drive(&mut store, &mut replies);
    }
    let write = start.elapsed().as_secs_f64() / objects as f64;
    let mut order = ids.clone();
    shuffle(&mut order, 7);
    let start = std::time::Instant::now();
    for (n, batch) in order.chunks(BATCH).enumerate() {
        store.get(
            Instant(0),
            READER,
            RequestId(n as u64),
            batch.to_vec(),
            Some(Duration::from_secs(60)),
        );
        drive(&mut store, &mut replies);
        assert_eq!(replies.len(), batch.len(), "the batch was answered");
        for id in replies.drain(..) {
            store.release(READER, id).expect("a reference the get gave");
        }
        drive(&mut store, &mut replies);
    }
    let get = start.elapsed().as_secs_f64() / objects as f64;
    (write, get, store.spill_stats().restores_total)
}

#[test]
#[ignore = "a measurement to run by hand, in release"]
fn spill_cost() {
    println!("memory   objects   write µs/object   random get µs/object   restores");
    for memory_mib in [4u64, 16, 64] {
        let memory = memory_mib << 20;
        let (write, get, restores) = run(memory);
        println!(
            "{:>3} MiB {:>9} {:>17.2} {:>22.2} {:>10}",
            memory_mib,
            4 * memory / OBJECT_BYTES,
            write * 1e6,
            get * 1e6,
            restores
        );
    }
}
