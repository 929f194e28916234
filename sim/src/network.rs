//! The network model: per-pair links with latency and bandwidth, in order per connection (as RC
//! queue pairs are), partitions, slow nodes, and connection epochs so a message sent on a
//! connection that broke is never delivered on the next one.

use std::collections::{BTreeMap, BTreeSet};

use skyriver_core::{Instant, NodeId};

/// State of the connection between two nodes (unordered pair).
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    /// Whether messages flow.
    pub up: bool,
    /// Bumped each time the connection breaks.
    pub epoch: u64,
    /// Last time it broke (peer-lost notices are scheduled after it).
    pub broke_at: Instant,
}

/// One unordered pair of nodes: its latency and its connection. Pairs live in one dense table
/// indexed by [`pair_index`], so finding a pair costs the same whatever the cluster's size.
#[derive(Debug, Clone, Copy)]
struct Link {
    latency_ns: u64,
    connection: Connection,
}

/// One direction of a link: when it is free again, and its last arrival (for ordering).
#[derive(Debug, Clone, Copy, Default)]
struct Lane {
    busy_until: Option<Instant>,
    last_arrival: Instant,
}

/// Links between nodes.
#[derive(Debug)]
pub struct Network {
    nodes: usize,
    /// Per unordered pair of distinct nodes (see [`pair_index`]).
    links: Vec<Link>,
    /// Bytes per second, all links.
    bandwidth_bytes_per_sec: u64,
    partitions: BTreeSet<(NodeId, NodeId)>,
    slow: BTreeMap<NodeId, u64>,
    /// Per ordered pair (`from * nodes + to`), filled as links carry messages.
    lanes: Vec<Lane>,
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// Where the unordered pair `{a, b}` (distinct) lives in a triangular table of `n(n-1)/2`.
pub fn pair_index(a: NodeId, b: NodeId) -> usize {
    let (low, high) = pair(a, b);
    let high = high.0 as usize;
    high * (high - 1) / 2 + low.0 as usize
}

/// Latency of a node's link to itself (never used by the cluster; kept for completeness).
const SELF_LATENCY_NS: u64 = 10_000;

impl Network {
    /// A network of `nodes` whose unordered pairs have the given one-way latencies (ns, at
    /// [`pair_index`]), every connection up, and one bandwidth for all links.
    pub fn new(nodes: usize, latency_ns: Vec<u64>, bandwidth_bytes_per_sec: u64) -> Self {
        assert_eq!(
            latency_ns.len(),
            nodes * nodes.saturating_sub(1) / 2,
            "one latency per unordered pair"
        );
        let links = latency_ns
            .into_iter()
            .map(|latency_ns| Link {
                latency_ns,
                connection: Connection {
                    up: true,
                    epoch: 0,
                    broke_at: Instant::ZERO,
                },
            })
            .collect();
        Network {
            nodes,
            links,
            bandwidth_bytes_per_sec: bandwidth_bytes_per_sec.max(1),
            partitions: BTreeSet::new(),
            slow: BTreeMap::new(),
            lanes: Vec::new(),
        }
    }

    fn link(&self, a: NodeId, b: NodeId) -> &Link {
        &self.links[pair_index(a, b)]
    }

    fn link_mut(&mut self, a: NodeId, b: NodeId) -> &mut Link {
        &mut self.links[pair_index(a, b)]
    }

    fn lane_mut(&mut self, from: NodeId, to: NodeId) -> &mut Lane {
        if self.lanes.is_empty() {
            // Allocated on first use: scripted runs that send nothing cost nothing.
            self.lanes = vec![Lane::default(); self.nodes * self.nodes];
        }
        &mut self.lanes[from.0 as usize * self.nodes + to.0 as usize]
    }

    /// One-way latency between two nodes, slow nodes included.
    pub fn latency_ns(&self, a: NodeId, b: NodeId) -> u64 {
        let base = if a == b {
            SELF_LATENCY_NS
        } else {
            self.link(a, b).latency_ns
        };
        base * self.slowdown(a) * self.slowdown(b)
    }

    fn slowdown(&self, node: NodeId) -> u64 {
        self.slow.get(&node).copied().unwrap_or(1)
    }

    /// Nanoseconds to put `bytes` on the wire from `from` to `to`.
    pub fn wire_ns(&self, from: NodeId, to: NodeId, bytes: u64) -> u64 {
        let per_sec = self.bandwidth_bytes_per_sec / (self.slowdown(from) * self.slowdown(to));
        (bytes as u128 * 1_000_000_000 / per_sec.max(1) as u128) as u64
    }

    /// Base bandwidth.
    pub fn bandwidth_bytes_per_sec(&self) -> u64 {
        self.bandwidth_bytes_per_sec
    }

    /// The connection between two nodes.
    pub fn connection(&self, a: NodeId, b: NodeId) -> Connection {
        self.link(a, b).connection
    }

    /// Whether the pair is partitioned.
    pub fn partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.partitions.contains(&pair(a, b))
    }

    /// Breaks the connection; returns false if it was already down.
    pub fn break_connection(&mut self, now: Instant, a: NodeId, b: NodeId) -> bool {
        let connection = &mut self.link_mut(a, b).connection;
        if !connection.up {
            return false;
        }
        connection.up = false;
        connection.epoch += 1;
        connection.broke_at = now;
        if !self.lanes.is_empty() {
            self.lane_mut(a, b).busy_until = None;
            self.lane_mut(b, a).busy_until = None;
        }
        true
    }

    /// Brings the connection up; returns false if it already was.
    pub fn restore_connection(&mut self, a: NodeId, b: NodeId) -> bool {
        let connection = &mut self.link_mut(a, b).connection;
        if connection.up {
            return false;
        }
        connection.up = true;
        true
    }

    /// Starts or ends a partition between two nodes.
    pub fn set_partition(&mut self, a: NodeId, b: NodeId, on: bool) {
        if on {
            self.partitions.insert(pair(a, b));
        } else {
            self.partitions.remove(&pair(a, b));
        }
    }

    /// Makes a node `factor` times slower (1 = normal).
    pub fn set_slow(&mut self, node: NodeId, factor: u64) {
        if factor <= 1 {
            self.slow.remove(&node);
        } else {
            self.slow.insert(node, factor);
        }
    }

    /// When a message of `bytes` sent now from `from` arrives at `to`: serialized behind earlier
    /// messages on the link, never before an earlier message of the same connection.
    pub fn arrival(&mut self, now: Instant, from: NodeId, to: NodeId, bytes: u64) -> Instant {
        let wire_ns = self.wire_ns(from, to, bytes);
        let latency_ns = self.latency_ns(from, to);
        let lane = self.lane_mut(from, to);
        let start = lane.busy_until.unwrap_or(now).max(now);
        let done = Instant(start.0 + wire_ns);
        lane.busy_until = Some(done);
        let arrival = Instant(done.0 + latency_ns).max(lane.last_arrival);
        lane.last_arrival = arrival;
        arrival
    }
}
