//! Nodes that learn locations (the daemon's `--learn-locations`): the directory pushes the
//! first holder of every object to every node, which fetches straight from it. Under the random
//! faults (crashes, partitions, lost pushes, a restarted head) no invariant may break, and the
//! pushed locations must actually serve fetches (and sometimes prove stale).

use skyriver_sim::{
    replay_command_with_modes, run_seed_with_modes, Flaws, RunMode, SimModes, SimReport,
};

const SEEDS: std::ops::Range<u64> = 17_000_001_000_000..17_000_001_000_060;

fn run(seeds: std::ops::Range<u64>, modes: SimModes) -> Vec<SimReport> {
    let mode = RunMode {
        workload: true,
        faults: true,
        keep_trace: false,
        echo_trace: false,
    };
    seeds
        .map(|seed| run_seed_with_modes(seed, None, mode, Flaws::default(), modes))
        .collect()
}

fn failures(reports: &[SimReport], modes: SimModes) -> Vec<String> {
    reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| {
            format!(
                "seed {}: {}\n  replay: {}",
                r.seed,
                r.violations.join("; "),
                replay_command_with_modes(r.seed, None, modes)
            )
        })
        .collect()
}

#[test]
fn pushed_locations_serve_first_fetches_and_break_no_invariant() {
    let modes = SimModes {
        learn_locations: true,
        ..SimModes::default()
    };
    let reports = run(SEEDS, modes);
    let failed = failures(&reports, modes);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    let sum = |reports: &[SimReport], f: fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    let learned = sum(&reports, |r| r.stats.locations_learned);
    let hits = sum(&reports, |r| r.stats.location_cache_hits);
    let stale = sum(&reports, |r| r.stats.stale_locations);
    // The same seeds without the mode: nothing pushed, and the cache only knows what its
    // own lookups found.
    let plain = run(SEEDS, SimModes::default());
    let plain_hits = sum(&plain, |r| r.stats.location_cache_hits);
    println!("{learned} locations learned; {hits} fetches from remembered holders ({plain_hits} without pushes), {stale} of them stale");
    assert!(learned > 1000, "pushes reached the nodes: {learned}");
    assert!(
        hits > plain_hits + 1000,
        "fetches went to pushed holders: {hits} against {plain_hits}"
    );
    assert!(stale > 0, "some pushed holders were gone by the fetch");
    assert_eq!(sum(&plain, |r| r.stats.locations_learned), 0);
}

#[test]
fn pushed_locations_combine_with_replicas_and_a_sharded_directory() {
    let modes = SimModes {
        learn_locations: true,
        replicas: true,
        directory_shards: Some(3),
        ..SimModes::default()
    };
    let reports = run(SEEDS.start..SEEDS.start + 20, modes);
    let failed = failures(&reports, modes);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(
        reports
            .iter()
            .map(|r| r.stats.locations_learned)
            .sum::<u64>()
            > 0
    );
}
