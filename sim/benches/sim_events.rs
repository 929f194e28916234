//! Speed of the simulator itself: simulated events per second of wall time, for a few fixed
//! seeds (criterion reports the throughput in elements = events).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use skyriver_sim::{run_seed, RunMode};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim");
    for seed in [1u64, 2, 3] {
        let events = run_seed(seed, None, MODE).stats.events;
        group.throughput(Throughput::Elements(events));
        group.bench_function(format!("seed-{seed}-{events}-events"), |b| {
            b.iter(|| run_seed(seed, None, MODE))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
