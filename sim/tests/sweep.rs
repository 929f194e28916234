//! The CI seed sweep: a fixed list of seeds plus some derived from the commit, each a full random
//! run (workload, faults, then liveness and quiescence checks). Any violation fails the test
//! with the seed and the command that replays it.

use skyriver_sim::{ci_seeds, replay_command, run_seed, RunMode};

/// Seeds from the fixed list (0..FIXED).
const FIXED: u64 = 300;
/// Seeds derived from the commit, when known.
const FROM_COMMIT: u64 = 50;
/// Seeds that once found a bug (in the product or in the checker), run every time.
const REGRESSIONS: [u64; 5] = [
    // A seal's reply held for durability came after its object was evicted and the id was
    // sealed again: the checker took the late reply for the new object's.
    11525939480465121898,
    // The liveness check expected a 178 KiB object through a 1 ms lease (the wire's whole
    // milliseconds) over 35 µs READ rounds: no fetch could finish it within one lease.
    4654736161813497962,
    // A fetched copy whose publications went unanswered was still served after every holder
    // left and the id was put again with other bytes (a restarted head, a slow link to it).
    9100000000159,
    // A node still waiting for a zero-length object's reply answered a hinted request for it
    // as a relay, with a lease over an empty region, which the wire refuses.
    9600000001003,
    // A holder cut off from the head lost its withdrawal, put the id again with other bytes,
    // and its refused publication left it listed as a holder of the first content.
    9800000000249,
];

fn commit() -> Option<String> {
    if let Ok(commit) =
        std::env::var("SKYRIVER_SIM_COMMIT").or_else(|_| std::env::var("GIT_COMMIT"))
    {
        return Some(commit);
    }
    let output = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[test]
fn seed_sweep_finds_no_violation() {
    let commit = commit();
    let mut seeds = ci_seeds(FIXED, FROM_COMMIT, commit.as_deref());
    let derived: Vec<u64> = seeds[FIXED as usize..].to_vec();
    seeds.extend(REGRESSIONS);
    println!(
        "sim sweep: seeds 0..{FIXED}, {} regression seeds and {} derived from commit {}: {derived:?}",
        REGRESSIONS.len(),
        derived.len(),
        commit.as_deref().unwrap_or("(unknown)")
    );
    let mut failures = Vec::new();
    let mut events = 0;
    for &seed in &seeds {
        let report = run_seed(
            seed,
            None,
            RunMode {
                workload: true,
                faults: true,
                keep_trace: false,
                echo_trace: false,
            },
        );
        events += report.stats.events;
        if !report.passed() {
            failures.push(format!(
                "seed {seed} ({})\n  {}\n  replay: {}",
                report.params,
                report
                    .violations
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n  "),
                replay_command(seed, None)
            ));
        }
    }
    println!(
        "sim sweep: {} seeds, {events} events, {} failed",
        seeds.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
