//! What a node counts for operators: plain values, bumped by the one owner of the node (no
//! atomics), read as a [`NodeMetrics`] snapshot by the driver's exporter and by
//! `Request::Metrics`. Latencies are measured in the node's own time (`now` of its inputs), so
//! the simulator's virtual clock gives them too.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::WaitQueue;
use crate::ids::NodeId;
use crate::store::StoreStats;

use super::output::NodeStats;

/// Upper bounds of the latency histograms' buckets, in nanoseconds (100 µs to 10 s); one more
/// bucket above the last counts the rest.
pub const LATENCY_BUCKETS_NANOS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// A latency histogram with the buckets of [`LATENCY_BUCKETS_NANOS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative); the last entry counts those above every bound.
    pub buckets: Vec<u64>,
    /// Sum of all observations, in nanoseconds.
    pub sum_nanos: u64,
    /// Number of observations.
    pub count: u64,
}

impl LatencyHistogram {
    /// Records one observation.
    pub fn observe(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        if self.buckets.len() != LATENCY_BUCKETS_NANOS.len() + 1 {
            self.buckets = vec![0; LATENCY_BUCKETS_NANOS.len() + 1];
        }
        let index = LATENCY_BUCKETS_NANOS.partition_point(|&bound| bound < nanos);
        self.buckets[index] += 1;
        self.sum_nanos = self.sum_nanos.saturating_add(nanos);
        self.count += 1;
    }

    /// Observations per bucket (not cumulative) with each bucket's upper bound in seconds;
    /// the last pair is `+Inf`. An OpenMetrics encoder sums them into the cumulative `_bucket`
    /// lines, whose last equals [`count`](Self::count).
    pub fn bucket_seconds(&self) -> Vec<(f64, u64)> {
        LATENCY_BUCKETS_NANOS
            .iter()
            .map(|&bound| bound as f64 / 1e9)
            .chain([f64::INFINITY])
            .enumerate()
            .map(|(i, bound)| (bound, self.buckets.get(i).copied().unwrap_or(0)))
            .collect()
    }
}

/// Size classes of the fetch latency histograms (object bytes, data and metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SizeClass {
    /// Below 64 KiB.
    Small,
    /// 64 KiB to 4 MiB.
    Medium,
    /// 4 MiB and more.
    Large,
}

impl SizeClass {
    /// Every class, in order.
    pub const ALL: [SizeClass; 3] = [SizeClass::Small, SizeClass::Medium, SizeClass::Large];

    /// The class of an object of `bytes`.
    pub fn of(bytes: u64) -> Self {
        if bytes < 64 << 10 {
            SizeClass::Small
        } else if bytes < 4 << 20 {
            SizeClass::Medium
        } else {
            SizeClass::Large
        }
    }

    /// Its label value.
    pub fn name(self) -> &'static str {
        match self {
            SizeClass::Small => "lt_64KiB",
            SizeClass::Medium => "64KiB_to_4MiB",
            SizeClass::Large => "ge_4MiB",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How a transfer moved its bytes, as far as it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferPath {
    /// The holder sent the object in `EagerData` messages.
    Eager,
    /// The requester READ it after a `Rendezvous`.
    Rendezvous,
    /// It failed before the holder answered.
    Unanswered,
}

/// Outcomes of the transfers this node made as requester, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferOutcomes {
    /// Eager transfers that sealed the object.
    pub eager_ok: u64,
    /// Eager transfers that failed.
    pub eager_failed: u64,
    /// Rendezvous transfers that sealed the object.
    pub rendezvous_ok: u64,
    /// Rendezvous transfers that failed.
    pub rendezvous_failed: u64,
    /// Transfers that failed before the holder answered (refusal, timeout, lost connection).
    pub unanswered_failed: u64,
}

/// Requests refused because a waiting queue was at its cap, per queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusyRefusals {
    /// `get`s that would have waited.
    pub gets: u64,
    /// Fetches.
    pub fetches: u64,
    /// Objects of fetches that would have waited for admission.
    pub queued_transfers: u64,
    /// Requests that would have waited for the disk.
    pub durability: u64,
}

impl BusyRefusals {
    /// The count of `queue`.
    pub fn get(&self, queue: WaitQueue) -> u64 {
        match queue {
            WaitQueue::Gets => self.gets,
            WaitQueue::Fetches => self.fetches,
            WaitQueue::QueuedTransfers => self.queued_transfers,
            WaitQueue::Durability => self.durability,
        }
    }

    pub(super) fn count(&mut self, queue: WaitQueue) {
        *match queue {
            WaitQueue::Gets => &mut self.gets,
            WaitQueue::Fetches => &mut self.fetches,
            WaitQueue::QueuedTransfers => &mut self.queued_transfers,
            WaitQueue::Durability => &mut self.durability,
        } += 1;
    }
}

/// How client fetches ended, one count per requested id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResults {
    /// The object was handed out (already local, or fetched).
    pub ok: u64,
    /// No node holds it.
    pub not_found: u64,
    /// The client's timeout passed first.
    pub timeout: u64,
    /// Every other failure (sources failed, directory down, store full, no cluster).
    pub error: u64,
}

/// Counters this node keeps about one peer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounters {
    /// Bytes of objects fetched from the peer (completed transfers).
    pub bytes_fetched: u64,
    /// Objects fetched from the peer (completed transfers).
    pub objects_fetched: u64,
    /// Bytes of objects served to the peer (sent eagerly, or exposed under a lease).
    pub bytes_served: u64,
    /// Objects served to the peer.
    pub objects_served: u64,
    /// READs from the peer that failed.
    pub read_errors: u64,
    /// Transfers from the peer that failed for any reason.
    pub transfer_errors: u64,
    /// Messages from the peer that did not decode.
    pub malformed_messages: u64,
    /// Times the connection to the peer was lost.
    pub connections_lost: u64,
}

/// One peer, as [`NodeMetrics`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerMetrics {
    /// The peer.
    pub node: NodeId,
    /// Whether the fabric is connected to it.
    pub connected: bool,
    /// The eager threshold used for fetches from it, in bytes (`None` before it connected).
    pub eager_threshold_bytes: Option<u64>,
    /// Transfers from it in progress.
    pub transfers_in_flight: u32,
    /// Its counters.
    pub counters: PeerCounters,
}

/// Everything a node counts, at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMetrics {
    /// This node.
    pub node: NodeId,
    /// The node's clock (nanoseconds since the driver's epoch) when taken.
    pub at_nanos: u64,
    /// The store (client connections included).
    pub store: StoreStats,
    /// The node's counters.
    pub counters: NodeStats,
    /// Transfers into this node in progress.
    pub transfers_in_flight: u64,
    /// READs posted and not completed.
    pub reads_in_flight: u64,
    /// Bytes of objects being fetched.
    pub bytes_in_flight: u64,
    /// Objects pinned for requesters (leases held as holder).
    pub leases_held: u64,
    /// Client fetches waiting.
    pub fetches_waiting: u64,
    /// Objects waiting for memory or bytes in flight before their transfer starts.
    pub transfers_queued: u64,
    /// Client requests held back until the disk catches up.
    pub requests_deferred: u64,
    /// Durable changes recorded but not reported durable yet.
    pub changes_unpersisted: u64,
    /// Whether the directory answers (always true on a daemon alone).
    pub directory_healthy: bool,
    /// Whether the node runs without a cluster.
    pub standalone: bool,
    /// Fetch latency (request sent to object sealed) of completed transfers, per size class
    /// in [`SizeClass::ALL`] order.
    pub fetch_latency: Vec<(SizeClass, LatencyHistogram)>,
    /// Directory request latency (sent to answered).
    pub directory_latency: LatencyHistogram,
    /// Every peer this node knows of, by id.
    pub peers: Vec<PeerMetrics>,
    /// Copies of record held here (pinned until deleted).
    pub copies_of_record: u64,
}

/// Histograms the node keeps beside its counters.
#[derive(Debug, Clone, Default)]
pub(super) struct Histograms {
    pub(super) fetch_latency: [LatencyHistogram; 3],
    pub(super) directory_latency: LatencyHistogram,
}

impl Histograms {
    pub(super) fn observe_fetch(&mut self, bytes: u64, latency: Duration) {
        self.fetch_latency[SizeClass::of(bytes).index()].observe(latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let mut h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        // Cumulated as an encoder does.
        let c: Vec<(f64, u64)> = h
            .bucket_seconds()
            .into_iter()
            .scan(0, |total, (bound, n)| {
                *total += n;
                Some((bound, *total))
            })
            .collect();
        assert_eq!(c[0], (0.0001, 2), "bounds are inclusive");
        assert_eq!(c[5].1, 3, "3 ms falls under 5 ms");
        assert_eq!(c[15].1, 3);
        assert_eq!(*c.last().unwrap(), (f64::INFINITY, 4));
        assert_eq!(h.count, 4);
    }

    #[test]
    fn size_classes_split_at_64_kib_and_4_mib() {
        assert_eq!(SizeClass::of(0), SizeClass::Small);
        assert_eq!(SizeClass::of((64 << 10) - 1), SizeClass::Small);
        assert_eq!(SizeClass::of(64 << 10), SizeClass::Medium);
        assert_eq!(SizeClass::of(4 << 20), SizeClass::Large);
    }
}
