//! The eager/rendezvous switch: per peer, the object size below which eager sends win.
//!
//! A latency–bandwidth model of both paths, as UCX uses for its protocol selection. For an
//! object of `s` bytes, with `c` the eager chunk payload (what one receive slot carries):
//!
//! ```text
//! eager(s)      = rtt + ceil(s / c) · message_overhead + 2 · s / copy_bw + s / wire_bw
//! rendezvous(s) = 2 · rtt + read_setup + message_overhead + s / wire_bw
//! ```
//!
//! Eager pays for copies into and out of receive slots and a message per chunk; rendezvous pays
//! one more round trip and the READ setup (pin, post, completion) but moves bytes zero-copy. The
//! wire term is common to both. The threshold is the largest size where eager is cheaper,
//! multiplied by a bias below one (rendezvous keeps the receiver's slots free and scales with
//! size, so a tie goes to it), and capped by what the receive slots can carry.
//!
//! The round trip is measured by the driver, in batches of ping-pongs, and one batch on a
//! shared machine can be hit by a descheduled or preempted end. [`RoundTripEstimate`] keeps the
//! best batch of a link (the least spread) over every batch measured on it, and starts over
//! when the link changes.

use std::fmt;

/// Costs of one peer's paths, measured by the driver (or drawn by the simulator).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PathCosts {
    /// One network round trip, in nanoseconds.
    pub round_trip_ns: f64,
    /// Fixed cost of one two-sided message (post, completion, handling), in nanoseconds.
    pub message_overhead_ns: f64,
    /// Memory copy bandwidth into and out of receive slots, in bytes per second.
    pub copy_bytes_per_sec: f64,
    /// Wire bandwidth, in bytes per second.
    pub wire_bytes_per_sec: f64,
    /// Fixed cost of a READ transfer beyond the round trip (pin, expose, post, poll), in
    /// nanoseconds.
    pub read_setup_ns: f64,
}

impl PathCosts {
    /// Typical figures for a 100 Gb/s RDMA NIC, used until the driver measures its own.
    pub const RDMA_DEFAULT: PathCosts = PathCosts {
        round_trip_ns: 3_000.0,
        message_overhead_ns: 1_000.0,
        copy_bytes_per_sec: 10e9,
        wire_bytes_per_sec: 12.5e9,
        read_setup_ns: 2_000.0,
    };

    /// Predicted time of an eager transfer of `size_bytes` in chunks of `chunk_bytes`, in ns.
    pub fn eager_ns(&self, size_bytes: u64, chunk_bytes: u64) -> f64 {
        let chunks = size_bytes.div_ceil(chunk_bytes.max(1)).max(1) as f64;
        let s = size_bytes as f64;
        self.round_trip_ns
            + chunks * self.message_overhead_ns
            + 2.0 * s / self.copy_bytes_per_sec * 1e9
            + s / self.wire_bytes_per_sec * 1e9
    }

    /// Predicted time of a rendezvous transfer of `size_bytes`, in ns.
    pub fn rendezvous_ns(&self, size_bytes: u64) -> f64 {
        let s = size_bytes as f64;
        2.0 * self.round_trip_ns
            + self.read_setup_ns
            + self.message_overhead_ns
            + s / self.wire_bytes_per_sec * 1e9
    }

    fn is_sane(&self) -> bool {
        [
            self.round_trip_ns,
            self.message_overhead_ns,
            self.copy_bytes_per_sec,
            self.wire_bytes_per_sec,
            self.read_setup_ns,
        ]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0)
            && self.copy_bytes_per_sec > 0.0
            && self.wire_bytes_per_sec > 0.0
    }
}

/// One batch of round-trip samples, summarised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundTripBatch {
    /// Median round trip, in nanoseconds.
    pub median_ns: f64,
    /// Interquartile range (p75 − p25), in nanoseconds: how noisy the batch was.
    pub spread_ns: f64,
    /// Samples in the batch.
    pub samples: u32,
}

impl RoundTripBatch {
    /// Summarises round trips measured in nanoseconds (sorted in place); `None` when empty.
    pub fn from_samples(samples_ns: &mut [u64]) -> Option<Self> {
        if samples_ns.is_empty() {
            return None;
        }
        samples_ns.sort_unstable();
        let at = |q: usize| samples_ns[(samples_ns.len() - 1) * q / 4] as f64;
        Some(Self {
            median_ns: at(2),
            spread_ns: at(3) - at(1),
            samples: u32::try_from(samples_ns.len()).unwrap_or(u32::MAX),
        })
    }

    /// Whether this batch is a better estimate than `other`: less spread, or as little and a
    /// lower median. Noise on a shared machine only adds time and scatters the samples, so the
    /// quietest batch is the closest to the link's own round trip.
    fn better_than(&self, other: &RoundTripBatch) -> bool {
        (self.spread_ns, self.median_ns) < (other.spread_ns, other.median_ns)
    }

    fn is_sane(&self) -> bool {
        self.median_ns.is_finite()
            && self.median_ns >= 0.0
            && self.spread_ns.is_finite()
            && self.spread_ns >= 0.0
            && self.samples > 0
    }
}

/// The best round-trip estimate of one peer over repeated batches, per link: `L` names the
/// link (e.g. the addresses at both ends), and a batch on another link starts over, since its
/// round trip may differ.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundTripEstimate<L> {
    link: Option<L>,
    best: Option<RoundTripBatch>,
    batches: u32,
}

impl<L> Default for RoundTripEstimate<L> {
    fn default() -> Self {
        Self {
            link: None,
            best: None,
            batches: 0,
        }
    }
}

impl<L: PartialEq> RoundTripEstimate<L> {
    /// Takes a batch measured on `link`. Batches with nonsense figures are ignored.
    pub fn observe(&mut self, link: L, batch: RoundTripBatch) {
        if self.link.as_ref() != Some(&link) {
            *self = Self {
                link: Some(link),
                best: None,
                batches: 0,
            };
        }
        if !batch.is_sane() {
            return;
        }
        self.batches += 1;
        if self.best.is_none_or(|best| batch.better_than(&best)) {
            self.best = Some(batch);
        }
    }

    /// The best batch so far on the current link.
    pub fn best(&self) -> Option<RoundTripBatch> {
        self.best
    }

    /// Batches taken on the current link.
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// `base` with the best round trip, or `base` unchanged before any batch.
    pub fn costs(&self, base: PathCosts) -> PathCosts {
        match self.best {
            Some(best) => PathCosts {
                round_trip_ns: best.median_ns,
                ..base
            },
            None => base,
        }
    }
}

/// How a node chooses its eager threshold.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ThresholdPolicy {
    /// From the cost model, times `bias` (in `(0, 1]`; lower favours rendezvous).
    Model {
        /// Multiplier applied to the model's crossover size.
        bias: f64,
    },
    /// A configured size in bytes (still capped by what the receive slots carry).
    Fixed(u64),
}

impl Default for ThresholdPolicy {
    fn default() -> Self {
        ThresholdPolicy::Model { bias: 0.5 }
    }
}

/// Where a threshold came from, for the daemon's start-up line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThresholdSource {
    /// The cost model, uncapped.
    Model,
    /// The cost model, cut down to what the receive slots carry.
    ModelCappedBySlots,
    /// Configuration.
    Fixed,
    /// Configuration, cut down to what the receive slots carry.
    FixedCappedBySlots,
}

/// The eager threshold chosen for one peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EagerThreshold {
    /// Objects of at most this many bytes (data + metadata) are sent eagerly.
    pub bytes: u64,
    /// The model's unbiased crossover, when the model was used.
    pub crossover_bytes: Option<u64>,
    /// Where `bytes` came from.
    pub source: ThresholdSource,
}

impl fmt::Display for EagerThreshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.bytes)?;
        match (self.source, self.crossover_bytes) {
            (ThresholdSource::Model, Some(c)) => {
                write!(f, " (cost model, crossover {c} bytes, biased)")
            }
            (ThresholdSource::ModelCappedBySlots, Some(c)) => {
                write!(
                    f,
                    " (cost model crossover {c} bytes, capped by receive slots)"
                )
            }
            (ThresholdSource::Fixed, _) => write!(f, " (configured)"),
            (ThresholdSource::FixedCappedBySlots, _) => {
                write!(f, " (configured, capped by receive slots)")
            }
            _ => Ok(()),
        }
    }
}

/// Largest size (≤ `limit`) at which eager is predicted no slower than rendezvous.
///
/// `rendezvous − eager` decreases as the size grows (eager's slope is steeper), so a binary
/// search over sizes finds the crossover.
pub fn crossover_bytes(costs: &PathCosts, chunk_bytes: u64, limit: u64) -> u64 {
    if !costs.is_sane() {
        return 0;
    }
    let eager_wins = |s: u64| costs.eager_ns(s, chunk_bytes) <= costs.rendezvous_ns(s);
    if !eager_wins(0) {
        return 0;
    }
    let (mut lo, mut hi) = (0u64, limit);
    if eager_wins(hi) {
        return hi;
    }
    // Invariant: eager wins at lo, loses at hi.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if eager_wins(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Chooses the threshold for a peer: `slot_capacity_bytes` is the most payload the receive
/// slots carry for one object (chunk payload × chunks allowed).
pub fn choose(
    policy: ThresholdPolicy,
    costs: &PathCosts,
    chunk_bytes: u64,
    slot_capacity_bytes: u64,
) -> EagerThreshold {
    match policy {
        ThresholdPolicy::Fixed(bytes) if bytes > slot_capacity_bytes => EagerThreshold {
            bytes: slot_capacity_bytes,
            crossover_bytes: None,
            source: ThresholdSource::FixedCappedBySlots,
        },
        ThresholdPolicy::Fixed(bytes) => EagerThreshold {
            bytes,
            crossover_bytes: None,
            source: ThresholdSource::Fixed,
        },
        ThresholdPolicy::Model { bias } => {
            // Search well past the cap so the printed crossover is the model's own.
            let crossover = crossover_bytes(
                costs,
                chunk_bytes,
                slot_capacity_bytes.saturating_mul(64).max(1 << 20),
            );
            let bias = if bias.is_finite() {
                bias.clamp(0.0, 1.0)
            } else {
                1.0
            };
            let biased = (crossover as f64 * bias) as u64;
            if biased > slot_capacity_bytes {
                EagerThreshold {
                    bytes: slot_capacity_bytes,
                    crossover_bytes: Some(crossover),
                    source: ThresholdSource::ModelCappedBySlots,
                }
            } else {
                EagerThreshold {
                    bytes: biased,
                    crossover_bytes: Some(crossover),
                    source: ThresholdSource::Model,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u64 = 8 * 1024;

    #[test]
    fn crossover_is_where_the_paths_meet() {
        let costs = PathCosts::RDMA_DEFAULT;
        let c = crossover_bytes(&costs, CHUNK, 1 << 30);
        assert!(c > 0 && c < 1 << 30);
        assert!(costs.eager_ns(c, CHUNK) <= costs.rendezvous_ns(c));
        assert!(costs.eager_ns(c + 1, CHUNK) > costs.rendezvous_ns(c + 1));
    }

    #[test]
    fn slower_round_trips_raise_the_threshold() {
        let fast = PathCosts::RDMA_DEFAULT;
        let slow = PathCosts {
            round_trip_ns: 50_000.0,
            ..fast
        };
        let large = 1 << 30;
        assert!(crossover_bytes(&slow, CHUNK, large) > crossover_bytes(&fast, CHUNK, large));
        // Slower copies lower it.
        let slow_copy = PathCosts {
            copy_bytes_per_sec: 1e9,
            ..fast
        };
        assert!(crossover_bytes(&slow_copy, CHUNK, large) < crossover_bytes(&fast, CHUNK, large));
    }

    #[test]
    fn bias_favours_rendezvous_and_slots_cap_it() {
        let costs = PathCosts::RDMA_DEFAULT;
        let unbiased = choose(ThresholdPolicy::Model { bias: 1.0 }, &costs, CHUNK, 1 << 30);
        let biased = choose(ThresholdPolicy::Model { bias: 0.5 }, &costs, CHUNK, 1 << 30);
        assert_eq!(biased.source, ThresholdSource::Model);
        assert_eq!(biased.bytes, unbiased.bytes / 2);
        let capped = choose(ThresholdPolicy::Model { bias: 0.5 }, &costs, CHUNK, 1000);
        assert_eq!(capped.bytes, 1000);
        assert_eq!(capped.source, ThresholdSource::ModelCappedBySlots);
        assert_eq!(capped.crossover_bytes, unbiased.crossover_bytes);
        assert!(capped.to_string().contains("capped"));
    }

    #[test]
    fn configuration_overrides_the_model_within_the_slots() {
        let costs = PathCosts::RDMA_DEFAULT;
        let fixed = choose(ThresholdPolicy::Fixed(512), &costs, CHUNK, 4096);
        assert_eq!((fixed.bytes, fixed.source), (512, ThresholdSource::Fixed));
        let too_big = choose(ThresholdPolicy::Fixed(1 << 20), &costs, CHUNK, 4096);
        assert_eq!(
            (too_big.bytes, too_big.source),
            (4096, ThresholdSource::FixedCappedBySlots)
        );
    }

    fn batch(median_ns: f64, spread_ns: f64) -> RoundTripBatch {
        RoundTripBatch {
            median_ns,
            spread_ns,
            samples: 8,
        }
    }

    #[test]
    fn a_batch_is_summarised_by_its_median_and_interquartile_range() {
        let mut samples = vec![90, 10, 30, 20, 1000, 40, 50, 60, 70];
        let b = RoundTripBatch::from_samples(&mut samples).unwrap();
        // Sorted: 10 20 30 40 50 60 70 90 1000; p25 = 30, p50 = 50, p75 = 70.
        assert_eq!((b.median_ns, b.spread_ns, b.samples), (50.0, 40.0, 9));
        assert_eq!(RoundTripBatch::from_samples(&mut []), None);
    }

    #[test]
    fn the_quietest_batch_of_a_link_is_kept() {
        let mut estimate = RoundTripEstimate::default();
        assert_eq!(
            estimate.costs(PathCosts::RDMA_DEFAULT),
            PathCosts::RDMA_DEFAULT
        );
        estimate.observe("a", batch(40_000.0, 30_000.0));
        estimate.observe("a", batch(12_000.0, 1_000.0));
        // Noisier, even with a lower median: a preempted end scatters a batch.
        estimate.observe("a", batch(9_000.0, 20_000.0));
        // As quiet, higher: not better.
        estimate.observe("a", batch(13_000.0, 1_000.0));
        assert_eq!(estimate.best(), Some(batch(12_000.0, 1_000.0)));
        assert_eq!(estimate.batches(), 4);
        assert_eq!(
            estimate.costs(PathCosts::RDMA_DEFAULT).round_trip_ns,
            12_000.0
        );
        // Nonsense is ignored.
        estimate.observe("a", batch(f64::NAN, 0.0));
        estimate.observe("a", batch(-1.0, 0.0));
        assert_eq!(estimate.best(), Some(batch(12_000.0, 1_000.0)));
        assert_eq!(estimate.batches(), 4);
    }

    #[test]
    fn a_new_link_starts_over() {
        let mut estimate = RoundTripEstimate::default();
        estimate.observe(1, batch(3_000.0, 100.0));
        estimate.observe(1, batch(4_000.0, 900.0));
        // The peer came back over another link: its slower round trip replaces the old one,
        // however quiet that was.
        estimate.observe(2, batch(70_000.0, 5_000.0));
        assert_eq!(estimate.best(), Some(batch(70_000.0, 5_000.0)));
        assert_eq!(estimate.batches(), 1);
        // And the same link again keeps what it had.
        estimate.observe(2, batch(80_000.0, 9_000.0));
        assert_eq!(estimate.best(), Some(batch(70_000.0, 5_000.0)));
    }

    #[test]
    fn a_slower_idle_round_trip_moves_the_threshold_up() {
        // Rendezvous pays one round trip more than eager: the slower the round trip the link
        // really has, the larger the objects worth sending eagerly.
        let mut awake = RoundTripEstimate::default();
        awake.observe((), batch(5_000.0, 500.0));
        let mut idle = RoundTripEstimate::default();
        idle.observe((), batch(70_000.0, 4_000.0));
        let base = PathCosts::RDMA_DEFAULT;
        let large = 1 << 30;
        assert!(
            crossover_bytes(&idle.costs(base), CHUNK, large)
                > crossover_bytes(&awake.costs(base), CHUNK, large)
        );
    }

    #[test]
    fn nonsense_costs_choose_rendezvous() {
        let broken = PathCosts {
            wire_bytes_per_sec: 0.0,
            ..PathCosts::RDMA_DEFAULT
        };
        assert_eq!(crossover_bytes(&broken, CHUNK, 1 << 20), 0);
        let nan = PathCosts {
            round_trip_ns: f64::NAN,
            ..PathCosts::RDMA_DEFAULT
        };
        assert_eq!(
            choose(ThresholdPolicy::default(), &nan, CHUNK, 1 << 20).bytes,
            0
        );
    }
}
