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

use std::fmt;

/// Costs of one peer's paths, measured by the driver (or drawn by the simulator).
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// How a node chooses its eager threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
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
