//! Hot paths of the store core, without IO: what one request costs the daemon's CPU.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use skyriver_core::alloc::Allocator;
use skyriver_core::{ArenaId, ClientId, Instant, ObjectId, RequestId, Store, StoreConfig};

fn allocator(c: &mut Criterion) {
    c.bench_function(
        "allocator/allocate+free 4 KiB in a fragmented 1 GiB arena",
        |b| {
            let mut allocator = Allocator::new([(ArenaId(0), 1 << 30)]);
            // Fragment: keep every other block of 10k allocations.
            let blocks: Vec<_> = (0..10_000)
                .map(|_| allocator.allocate(4096).unwrap())
                .collect();
            for block in blocks.iter().step_by(2) {
                allocator.free(*block);
            }
            b.iter(|| {
                let region = allocator.allocate(black_box(4096)).unwrap();
                allocator.free(region);
            });
        },
    );
}

fn store(c: &mut Criterion) {
    let client = ClientId(1);
    c.bench_function(
        "store/create+seal+get+release+delete (100k objects resident)",
        |b| {
            let mut store = Store::new(StoreConfig::single_arena(1 << 30));
            store.connect(client);
            for n in 0..100_000u64 {
                store
                    .create(Instant::ZERO, client, ObjectId::from_u64(n), 1024, 0)
                    .unwrap();
                store.seal(client, ObjectId::from_u64(n), true).unwrap();
            }
            while store.poll_output().is_some() {}
            let mut n = 1_000_000u64;
            b.iter(|| {
                n += 1;
                let id = ObjectId::from_u64(n);
                store.create(Instant::ZERO, client, id, 1024, 0).unwrap();
                store.seal(client, id, true).unwrap();
                store.get(
                    Instant::ZERO,
                    client,
                    RequestId(n),
                    vec![id],
                    Some(std::time::Duration::ZERO),
                );
                store.release(client, id).unwrap();
                store.delete(&[id]).pop().unwrap().unwrap();
                while let Some(output) = store.poll_output() {
                    let _ = black_box(output);
                }
            });
        },
    );
    c.bench_function("store/create evicting the LRU object (full store)", |b| {
        b.iter_batched_ref(
            || {
                let mut store = Store::new(StoreConfig::single_arena(64 << 20));
                store.connect(client);
                for n in 0..1024u64 {
                    store
                        .create(Instant::ZERO, client, ObjectId::from_u64(n), 64 << 10, 0)
                        .unwrap();
                    store.seal(client, ObjectId::from_u64(n), true).unwrap();
                }
                store
            },
            |store| {
                store
                    .create(Instant::ZERO, client, ObjectId::from_u64(5000), 64 << 10, 0)
                    .unwrap();
            },
            BatchSize::LargeInput,
        );
    });
}

criterion_group!(benches, allocator, store);
criterion_main!(benches);
