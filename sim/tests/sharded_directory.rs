//! The sharded directory (`--directory-shards`, a model of Redis Cluster's slots and
//! failovers; see `directory::shard`): its runs pass the checker's invariants, one shard is the
//! default directory, and a failover the nodes do not re-register after is caught.

use skyriver_sim::directory::shard::{crc16, shard_of, slot_of, SLOTS};
use skyriver_sim::{replay_command, run_seed, run_seed_sharded, Flaws, RunMode};

const MODE: RunMode = RunMode {
    workload: true,
    faults: true,
    keep_trace: false,
    echo_trace: false,
};

/// Seeds of the sweeps (30 from here).
const START: u64 = 29_000_000_000;
const SEEDS: u64 = 30;
const SHARDS: usize = 3;
/// Seeds that once found a bug of the model, run every time.
const REGRESSIONS: [u64; 1] = [
    // A shard answered nothing for longer than the heartbeat timeout; its promoted replica
    // listed a member whose liveness had run out meanwhile until its first timer.
    17_000_000_700_110,
];

#[test]
fn slots_are_redis_cluster_slots() {
    // Redis Cluster's reference values (`CLUSTER KEYSLOT`): CRC16 of "123456789" is 0x31C3,
    // and "foo" lives in slot 12182.
    assert_eq!(crc16(b"123456789"), 0x31c3);
    assert_eq!(crc16(b"foo") as u32 % SLOTS, 12182);
    // Objects spread over every shard.
    let mut counts = [0u32; SHARDS];
    for n in 0..3_000u64 {
        let id = skyriver_core::ObjectId::from_u64(n);
        assert!(slot_of(&id) < SLOTS);
        counts[shard_of(&id, SHARDS)] += 1;
    }
    assert!(counts.iter().all(|&c| c > 700), "{counts:?}");
}

#[test]
fn one_shard_is_the_default_directory() {
    for seed in [9_100_000_000_159, 1, 42] {
        let default = run_seed(seed, None, MODE);
        let one = run_seed_sharded(seed, None, MODE, Flaws::default(), 1);
        assert_eq!(default.trace_hash, one.trace_hash, "seed {seed}");
        assert_eq!(default.params, one.params, "seed {seed}");
        assert_eq!(default.stats, one.stats, "seed {seed}");
    }
}

#[test]
fn sharded_sweep_finds_no_violation() {
    let mut failures = Vec::new();
    let mut failovers = 0;
    for seed in (START..START + SEEDS).chain(REGRESSIONS) {
        let report = run_seed_sharded(seed, None, MODE, Flaws::default(), SHARDS);
        failovers += report.stats.directory.failovers;
        if !report.passed() {
            failures.push(format!(
                "seed {seed} ({})\n  {}\n  replay: {}",
                report.params,
                report.violations[..report.violations.len().min(5)].join("\n  "),
                replay_command(seed, None).replace(" --trace", " --directory-shards 3 --trace")
            ));
        }
    }
    assert!(
        failovers >= SEEDS,
        "only {failovers} shard failovers in {SEEDS} seeds"
    );
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn sweep_catches_nodes_that_do_not_republish_after_a_failover() {
    let flaws = Flaws {
        transparent_shard_failovers: true,
        ..Flaws::default()
    };
    let mut caught = Vec::new();
    for seed in START..START + SEEDS {
        let report = run_seed_sharded(seed, None, MODE, flaws, SHARDS);
        if !report.passed() {
            caught.push((seed, report.violations[0].clone()));
        }
    }
    println!("caught in {} of {SEEDS} seeds: {caught:#?}", caught.len());
    assert!(
        !caught.is_empty(),
        "no seed of {SEEDS} caught transparent shard failovers"
    );
}
