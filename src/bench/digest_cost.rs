//! What verifying a fetched copy costs: the requester hashes every copy (XXH3-64 of its bytes)
//! before sealing it, on its loop, after the last byte is in. `bench fetch` prints that time per
//! size, measured here on the same CPU, next to the fetch it is part of.

use std::time::{Duration, Instant};

use serde::Serialize;
use skyriver_core::ContentDigest;

use super::CaseResult;
use skyriver_daemon::size::format_bytes;

/// The hashing time of one size, against a fetch of that size.
#[derive(Debug, Clone, Serialize)]
pub(super) struct DigestCost {
    pub(super) size_bytes: u64,
    /// Median time to hash an object of this size, microseconds (the buffer is warm: as the
    /// copy is right after its last READ or eager chunk landed).
    pub(super) hash_p50_us: f64,
    /// Hashing speed, GB/s (10^9).
    pub(super) gb_per_sec: f64,
    /// The auto-mode fetch p50 of this size in the same run, microseconds.
    pub(super) fetch_p50_us: Option<f64>,
    /// hash / fetch: the part of the fetch spent verifying.
    pub(super) share_of_fetch: Option<f64>,
}

/// Hashes a buffer of each size for about `budget` and sets it next to the auto-mode fetch
/// of that size in `measured`.
pub(super) fn measure(
    sizes: &[u64],
    measured: &[(String, CaseResult)],
    budget: Duration,
) -> Vec<DigestCost> {
    sizes
        .iter()
        .map(|&size| {
            let buffer: Vec<u8> = (0..size).map(|i| (i * 31 + i / 7) as u8).collect();
            let mut samples = Vec::new();
            let started = Instant::now();
            while samples.len() < 5 || (started.elapsed() < budget && samples.len() < 100_000) {
                let t = Instant::now();
                std::hint::black_box(ContentDigest::of_contiguous(std::hint::black_box(&buffer)));
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
            samples.sort_by(f64::total_cmp);
            let hash_p50_us = samples[samples.len() / 2];
            let fetch_p50_us = measured
                .iter()
                .find(|(name, r)| name == "skyriver-auto" && r.size_bytes == size)
                .map(|(_, r)| r.p50_us);
            DigestCost {
                size_bytes: size,
                hash_p50_us,
                gb_per_sec: size as f64 / hash_p50_us / 1e3,
                fetch_p50_us,
                share_of_fetch: fetch_p50_us.map(|f| hash_p50_us / f),
            }
        })
        .collect()
}

/// The table of [`measure`]'s results.
pub(super) fn print(costs: &[DigestCost]) {
    println!(
        "verifying a fetched copy (XXH3-64 of its bytes before its seal, on the requester's loop; measured here, same CPU):"
    );
    println!(
        "{:>10} {:>12} {:>10} {:>14} {:>14}",
        "size", "hash µs", "GB/s", "fetch p50 µs", "share"
    );
    for cost in costs {
        println!(
            "{:>10} {:>12.2} {:>10.1} {:>14} {:>14}",
            format_bytes(cost.size_bytes),
            cost.hash_p50_us,
            cost.gb_per_sec,
            cost.fetch_p50_us
                .map_or_else(|| "-".into(), |f| format!("{f:.1}")),
            cost.share_of_fetch
                .map_or_else(|| "-".into(), |s| format!("{:.1}%", s * 100.0)),
        );
    }
    println!();
}
