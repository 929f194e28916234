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

/// Links between nodes.
#[derive(Debug)]
pub struct Network {
    /// One-way latency per node pair, in ns.
    latency_ns: BTreeMap<(NodeId, NodeId), u64>,
    /// Bytes per second, all links.
    bandwidth_bytes_per_sec: u64,
    connections: BTreeMap<(NodeId, NodeId), Connection>,
    partitions: BTreeSet<(NodeId, NodeId)>,
    slow: BTreeMap<NodeId, u64>,
    /// Per ordered pair: when the link is free again and the last arrival (for ordering).
    busy_until: BTreeMap<(NodeId, NodeId), Instant>,
    last_arrival: BTreeMap<(NodeId, NodeId), Instant>,
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl Network {
    /// A network with the given latencies (ns, per unordered pair) and bandwidth.
    pub fn new(latency_ns: BTreeMap<(NodeId, NodeId), u64>, bandwidth_bytes_per_sec: u64) -> Self {
        let connections = latency_ns
            .keys()
            .map(|&k| {
                (
                    k,
                    Connection {
                        up: true,
                        epoch: 0,
                        broke_at: Instant::ZERO,
                    },
                )
            })
            .collect();
        Network {
            latency_ns,
            bandwidth_bytes_per_sec: bandwidth_bytes_per_sec.max(1),
            connections,
            partitions: BTreeSet::new(),
            slow: BTreeMap::new(),
            busy_until: BTreeMap::new(),
            last_arrival: BTreeMap::new(),
        }
    }

    /// One-way latency between two nodes, slow nodes included.
    pub fn latency_ns(&self, a: NodeId, b: NodeId) -> u64 {
        let base = self.latency_ns.get(&pair(a, b)).copied().unwrap_or(10_000);
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
        self.connections[&pair(a, b)]
    }

    /// Whether the pair is partitioned.
    pub fn partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.partitions.contains(&pair(a, b))
    }

    /// Breaks the connection; returns false if it was already down.
    pub fn break_connection(&mut self, now: Instant, a: NodeId, b: NodeId) -> bool {
        let connection = self.connections.get_mut(&pair(a, b)).expect("known pair");
        if !connection.up {
            return false;
        }
        connection.up = false;
        connection.epoch += 1;
        connection.broke_at = now;
        self.busy_until.remove(&(a, b));
        self.busy_until.remove(&(b, a));
        true
    }

    /// Brings the connection up; returns false if it already was.
    pub fn restore_connection(&mut self, a: NodeId, b: NodeId) -> bool {
        let connection = self.connections.get_mut(&pair(a, b)).expect("known pair");
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
        let start = self
            .busy_until
            .get(&(from, to))
            .copied()
            .unwrap_or(now)
            .max(now);
        let done = Instant(start.0 + self.wire_ns(from, to, bytes));
        self.busy_until.insert((from, to), done);
        let arrival = Instant(done.0 + self.latency_ns(from, to));
        let last = self
            .last_arrival
            .get(&(from, to))
            .copied()
            .unwrap_or(Instant::ZERO);
        let arrival = arrival.max(last);
        self.last_arrival.insert((from, to), arrival);
        arrival
    }
}
