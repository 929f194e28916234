//! Every parameter of a run, drawn from its seed and printed first.

use std::fmt;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use std::time::Duration;

use skyriver_core::node::ThresholdPolicy;
use skyriver_core::registry::session::SessionConfig;
use skyriver_core::NodeId;

/// All arenas of a cluster together hold at most this many bytes (see [`arena_cap`]).
pub const CLUSTER_ARENA_BUDGET: u64 = 768 << 20;

/// The largest arena a node of a cluster of `nodes` is given: [`CLUSTER_ARENA_BUDGET`] shared
/// among the nodes (rounded down to whole KiB), never less than the smallest arena drawn
/// (256 KiB). An arena drawn larger (they are drawn from 256 KiB to 2 MiB) is this size. Only
/// clusters of more than 384 nodes are capped, so every smaller run keeps its parameters.
///
/// Why: the workload writes over a whole arena in a run (its objects are sized against the
/// arena and keep it full), so an arena costs its size in resident memory; 1,000 nodes of
/// 1.6 MiB arenas took 2.2 GB, and the rest of a 1,000-node run takes up to about 1.1 GB
/// (per-peer state, disks, queued events, contents). Capped, a node is as full and as pressed
/// for memory as drawn: every size the workload and the spill tier draw scales with the arena.
pub fn arena_cap(nodes: usize) -> u64 {
    let per_node = CLUSTER_ARENA_BUDGET / nodes.max(1) as u64;
    (per_node / 1024 * 1024).max(256 * 1024)
}

/// Parameters of one simulated run.
#[derive(Debug, Clone)]
pub struct SimParams {
    /// The seed everything comes from.
    pub seed: u64,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Clients per node.
    pub clients_per_node: usize,
    /// Bytes of each node's arena.
    pub arena_bytes: u64,
    /// One-way latency range between nodes, ns.
    pub latency_ns: (u64, u64),
    /// Link bandwidth, bytes/s.
    pub bandwidth_bytes_per_sec: u64,
    /// Queue pairs per peer.
    pub lanes: u16,
    /// Receive slot size.
    pub receive_slot_bytes: u32,
    /// Eager chunks allowed per object.
    pub max_eager_chunks: u32,
    /// Threshold policy.
    pub threshold: ThresholdPolicy,
    /// READ slice.
    pub read_slice_bytes: u64,
    /// READ window per transfer.
    pub max_outstanding_reads: u32,
    /// Admission cap.
    pub max_bytes_in_flight: u64,
    /// Holder lease, µs.
    pub lease_us: u64,
    /// Requester reply timeout, µs.
    pub reply_timeout_us: u64,
    /// Directory latency, ns.
    pub directory_latency_ns: u64,
    /// Directory op timeout, µs.
    pub directory_timeout_us: u64,
    /// Time for a broken connection to be noticed, µs.
    pub detect_us: u64,
    /// Time to re-establish a connection once possible, µs.
    pub reconnect_us: u64,
    /// Time for a READ on a broken queue pair to complete in error, µs.
    pub qp_timeout_us: u64,
    /// Workload length, µs.
    pub workload_us: u64,
    /// Mean pause between one client's operations, µs.
    pub op_interval_us: u64,
    /// Longest fetch timeout, µs.
    pub fetch_timeout_us: u64,
    /// Faults happen before this time, µs.
    pub faults_until_us: u64,
    /// Node crashes (each followed by a restart).
    pub crashes: u32,
    /// Nodes keep their arena across a crash (persistent mode): a restarted node recovers
    /// every object it had sealed, with the same bytes, instead of starting empty.
    pub persistent: bool,
    /// Partitions between two nodes.
    pub partitions: u32,
    /// Directory head crashes (each followed by a restart with an empty registry).
    pub directory_outages: u32,
    /// Windows in which a node is slow.
    pub slow_windows: u32,
    /// Probability (per million) that a READ fails with a QP error while faults are on.
    pub qp_error_ppm: u32,
    /// Probability (per million) that a READ carries a bad rkey while faults are on.
    pub bad_rkey_ppm: u32,
    /// Objects each node remembers the holders of (0: every fetch asks the directory).
    pub location_cache_entries: usize,
    /// Client fetches cycle through forced eager, forced rendezvous and auto instead of all
    /// being auto.
    pub forced_modes: bool,
    /// How long a fetch that does not wait for a publication waits when nobody holds its object.
    pub publication_grace_us: u64,
    /// Persistent mode: replies to seals and deletes wait until the change is durable
    /// (`--durability seal`); otherwise they go at once (`async`).
    pub hold_replies_until_durable: bool,
    /// Persistent mode: how long one commit of the disk takes, µs (least, most).
    pub commit_latency_us: (u64, u64),
    /// A node's directory session pings the head this often, µs.
    pub heartbeat_interval_us: u64,
    /// A node gives up on a head not heard from for this long, µs.
    pub session_heartbeat_timeout_us: u64,
    /// The head drops a node not heard from for this long, µs.
    pub registry_heartbeat_timeout_us: u64,
    /// First delay between a session's reconnection attempts, µs.
    pub reconnect_backoff_min_us: u64,
    /// Longest delay between a session's reconnection attempts, µs.
    pub reconnect_backoff_max_us: u64,
    /// Partitions between one node and the directory head.
    pub head_partitions: u32,
    /// Probability (per million) that a pushed directory event is lost with its connection
    /// while faults are on.
    pub lost_push_ppm: u32,
    /// READ data shares the holder's link to the reader with its messages, in order (each
    /// link carries one thing at a time), instead of every READ taking the link's whole
    /// bandwidth at once: what a batch of large transfers from one holder meets on a real link
    /// (scenarios that ask; every other run: no).
    pub reads_share_links: bool,
    /// Probability (per million) that a transfer's bytes arrive damaged (one byte flipped in an
    /// eager chunk or in a READ's data) while faults are on.
    pub corrupt_ppm: u32,
    /// The spill tier of every node; `None` (every run but those that ask): none.
    pub spill: Option<crate::cluster::spill::SpillParams>,
    /// Puts ask for replicas (every run but those that ask: no).
    pub replicas: bool,
    /// Every node asks the directory for the first holder of every new object (every run but
    /// those that ask: no).
    pub learn_locations: bool,
    /// Failure domains the nodes are spread over (node `n` in domain `n mod domains`); 0 (every
    /// run but those with replicas): none, each node a domain of its own.
    pub failure_domains: u32,
    /// A whole failure domain crashes: which, when (µs) and for how long (µs), each of its
    /// nodes then restarting.
    pub domain_crash: Option<(u32, u64, u64)>,
    /// The directory's shards (`--directory-shards`); `None` (every run but those that ask):
    /// one head, as with 1 shard.
    pub sharding: Option<ShardingParams>,
}

/// A sharded directory (see `directory::shard`): its shards, their latencies and failovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardingParams {
    /// Shards, at least 1.
    pub shards: usize,
    /// One-way latency between a node and each shard after the first, ns (shard 0 has the
    /// run's directory latency).
    pub latency_ns: Vec<u64>,
    /// How far each shard's replica trails its master, µs.
    pub replica_lag_us: u64,
    /// Failovers: which shard, when (µs) and how long it answers nothing (µs).
    pub failovers: Vec<(usize, u64, u64)>,
}

/// Mixed into the seed for the sharding's stream, so every other parameter of a seed stays
/// what it was.
const SHARDING_STREAM: u64 = 0x7368_6172_6465_645f;

impl ShardingParams {
    /// `shards` shards for a random run of `seed` whose faults end at `faults_until_us`; one
    /// shard is the unsharded directory (no replica, no failover), so its runs are the
    /// default's.
    pub fn draw(seed: u64, shards: usize, faults_until_us: u64, detect_us: u64) -> Self {
        let mut rng = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed ^ SHARDING_STREAM);
        if shards <= 1 {
            return ShardingParams {
                shards: 1,
                latency_ns: Vec::new(),
                replica_lag_us: 0,
                failovers: Vec::new(),
            };
        }
        let latency_ns = (1..shards).map(|_| rng.gen_range(1_000..=30_000)).collect();
        let replica_lag_us = rng.gen_range(100..=800);
        let failovers = (0..rng.gen_range(1..=3))
            .map(|_| {
                let shard = rng.gen_range(0..shards);
                let at = rng.gen_range(0..faults_until_us.max(1));
                let down = detect_us + rng.gen_range(100..=2_000);
                (shard, at, down)
            })
            .collect();
        ShardingParams {
            shards,
            latency_ns,
            replica_lag_us,
            failovers,
        }
    }
}

impl SimParams {
    /// Draws every parameter from `rng` (seeded with `seed`); `nodes` overrides the node count.
    pub fn draw(seed: u64, rng: &mut ChaCha8Rng, nodes: Option<usize>) -> Self {
        let drawn_nodes = rng.gen_range(2..=5);
        let lat_lo = rng.gen_range(1_000..=10_000);
        let faults_until_us = rng.gen_range(3_000..=12_000);
        let workload_us = faults_until_us + rng.gen_range(1_000..=5_000);
        let threshold = if rng.gen_bool(0.7) {
            ThresholdPolicy::Model {
                bias: rng.gen_range(0.2..=1.0),
            }
        } else {
            ThresholdPolicy::Fixed(rng.gen_range(0..=16 * 1024))
        };
        let detect_us = rng.gen_range(50..=400);
        let mut params = SimParams {
            seed,
            nodes: nodes.unwrap_or(drawn_nodes).max(1),
            clients_per_node: rng.gen_range(1..=3),
            arena_bytes: rng.gen_range(256..=2048) * 1024,
            latency_ns: (lat_lo, lat_lo + rng.gen_range(0..=20_000)),
            bandwidth_bytes_per_sec: rng.gen_range(1..=12) * 1_000_000_000,
            lanes: rng.gen_range(1..=4),
            receive_slot_bytes: rng.gen_range(512..=8192),
            max_eager_chunks: rng.gen_range(1..=4),
            threshold,
            read_slice_bytes: 1 << rng.gen_range(10..=16),
            max_outstanding_reads: rng.gen_range(1..=8),
            max_bytes_in_flight: rng.gen_range(32..=1024) * 1024,
            lease_us: rng.gen_range(1_000..=20_000),
            reply_timeout_us: rng.gen_range(1_000..=5_000),
            directory_latency_ns: rng.gen_range(1_000..=30_000),
            directory_timeout_us: rng.gen_range(300..=2_000),
            detect_us,
            reconnect_us: detect_us + rng.gen_range(100..=1_000),
            qp_timeout_us: rng.gen_range(100..=500),
            workload_us,
            op_interval_us: rng.gen_range(30..=300),
            fetch_timeout_us: rng.gen_range(500..=20_000),
            faults_until_us,
            crashes: rng.gen_range(0..=2),
            partitions: rng.gen_range(0..=3),
            directory_outages: rng.gen_range(0..=2),
            slow_windows: rng.gen_range(0..=2),
            qp_error_ppm: if rng.gen_bool(0.5) {
                rng.gen_range(0..=50_000)
            } else {
                0
            },
            bad_rkey_ppm: if rng.gen_bool(0.3) {
                rng.gen_range(0..=20_000)
            } else {
                0
            },
            // Drawn last, so every earlier parameter of a seed stays what it was.
            persistent: rng.gen_bool(0.4),
            location_cache_entries: if rng.gen_bool(0.25) {
                0
            } else {
                rng.gen_range(1..=64)
            },
            forced_modes: rng.gen_bool(0.3),
            publication_grace_us: rng.gen_range(50..=3_000),
            hold_replies_until_durable: rng.gen_bool(0.7),
            commit_latency_us: {
                let low = rng.gen_range(5..=200);
                (low, low + rng.gen_range(0..=800))
            },
            heartbeat_interval_us: 0,
            session_heartbeat_timeout_us: 0,
            registry_heartbeat_timeout_us: 0,
            reconnect_backoff_min_us: 0,
            reconnect_backoff_max_us: 0,
            head_partitions: rng.gen_range(0..=3),
            lost_push_ppm: 0,
            reads_share_links: false,
            corrupt_ppm: 0,
            spill: None,
            replicas: false,
            learn_locations: false,
            failure_domains: 0,
            domain_crash: None,
            sharding: None,
        };
        // The directory's timing and faults, drawn last, so every earlier parameter of a seed
        // stays what it was.
        params.heartbeat_interval_us = rng.gen_range(100..=1_000);
        params.session_heartbeat_timeout_us = params.heartbeat_interval_us * rng.gen_range(3..=8);
        params.registry_heartbeat_timeout_us = params.heartbeat_interval_us * rng.gen_range(3..=8);
        params.reconnect_backoff_min_us = rng.gen_range(50..=500);
        params.reconnect_backoff_max_us = params.reconnect_backoff_min_us * rng.gen_range(4..=16);
        params.head_partitions = rng.gen_range(0..=3);
        params.lost_push_ppm = if rng.gen_bool(0.5) {
            rng.gen_range(0..=300_000)
        } else {
            0
        };
        // Drawn last, so every earlier parameter of a seed stays what it was.
        params.corrupt_ppm = if rng.gen_bool(0.5) {
            rng.gen_range(0..=30_000)
        } else {
            0
        };
        params.arena_bytes = params.arena_bytes.min(arena_cap(params.nodes));
        params
    }

    /// Fixed parameters for scripted scenarios: no workload, no random faults.
    pub fn scripted(nodes: usize) -> Self {
        SimParams {
            seed: 0,
            nodes,
            clients_per_node: 1,
            arena_bytes: 1 << 20,
            latency_ns: (5_000, 5_000),
            bandwidth_bytes_per_sec: 10_000_000_000,
            lanes: 2,
            receive_slot_bytes: 4096,
            max_eager_chunks: 2,
            threshold: ThresholdPolicy::Fixed(6 * 1024),
            read_slice_bytes: 16 * 1024,
            max_outstanding_reads: 2,
            max_bytes_in_flight: 512 * 1024,
            lease_us: 2_000,
            reply_timeout_us: 2_000,
            directory_latency_ns: 10_000,
            directory_timeout_us: 1_000,
            detect_us: 100,
            reconnect_us: 500,
            qp_timeout_us: 200,
            workload_us: 0,
            op_interval_us: 100,
            fetch_timeout_us: 10_000,
            faults_until_us: 0,
            crashes: 0,
            partitions: 0,
            directory_outages: 0,
            slow_windows: 0,
            qp_error_ppm: 0,
            bad_rkey_ppm: 0,
            persistent: false,
            location_cache_entries: 64,
            forced_modes: false,
            publication_grace_us: 1_000,
            hold_replies_until_durable: true,
            commit_latency_us: (100, 100),
            heartbeat_interval_us: 1_000,
            session_heartbeat_timeout_us: 5_000,
            registry_heartbeat_timeout_us: 5_000,
            reconnect_backoff_min_us: 100,
            reconnect_backoff_max_us: 2_000,
            head_partitions: 0,
            lost_push_ppm: 0,
            reads_share_links: false,
            corrupt_ppm: 0,
            spill: None,
            replicas: false,
            learn_locations: false,
            failure_domains: 0,
            domain_crash: None,
            sharding: None,
        }
    }

    /// The failure domain of `node` (empty: none, a domain of its own).
    pub fn failure_domain(&self, node: NodeId) -> String {
        if self.failure_domains == 0 {
            String::new()
        } else {
            format!("rack-{}", node.0 % self.failure_domains)
        }
    }

    /// The simulated directory's parameters.
    pub fn directory_params(&self) -> crate::directory::DirectoryParams {
        crate::directory::DirectoryParams {
            latency_ns: self.directory_latency_ns,
            detect_ns: self.detect_us * 1000,
            registry_heartbeat_timeout: Duration::from_micros(self.registry_heartbeat_timeout_us),
            session: SessionConfig {
                heartbeat_interval: Duration::from_micros(self.heartbeat_interval_us),
                heartbeat_timeout: Duration::from_micros(self.session_heartbeat_timeout_us),
                reconnect_backoff_min: Duration::from_micros(self.reconnect_backoff_min_us),
                reconnect_backoff_max: Duration::from_micros(self.reconnect_backoff_max_us),
                learn_locations: self.learn_locations,
                ..SessionConfig::default()
            },
            lost_push_ppm: self.lost_push_ppm,
            failure_domains: (0..self.nodes as u32)
                .map(|n| self.failure_domain(NodeId(n)))
                .collect(),
            replication: crate::cluster::replication_limits(self),
            replica: None,
        }
    }
}

impl fmt::Display for SimParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let threshold = match self.threshold {
            ThresholdPolicy::Model { bias } => format!("model(bias={bias:.2})"),
            ThresholdPolicy::Fixed(bytes) => format!("fixed({bytes})"),
        };
        write!(
            f,
            "seed={} nodes={} clients/node={} arena={}KiB latency={}..{}ns bw={}GB/s lanes={} slot={}B \
             eager_chunks={} threshold={} slice={}B window={} in_flight_cap={}KiB lease={}us reply_timeout={}us \
             dir_latency={}ns dir_timeout={}us detect={}us reconnect={}us qp_timeout={}us workload={}us \
             op_interval={}us fetch_timeout<={}us faults_until={}us crashes={} partitions={} dir_outages={} \
             slow_windows={} qp_error={}ppm bad_rkey={}ppm persistent={} location_cache={} \
             forced_modes={} publication_grace={}us hold_until_durable={} commit={}..{}us \
             heartbeat={}us session_timeout={}us registry_timeout={}us backoff={}..{}us \
             head_partitions={} lost_push={}ppm corrupt={}ppm",
            self.seed,
            self.nodes,
            self.clients_per_node,
            self.arena_bytes / 1024,
            self.latency_ns.0,
            self.latency_ns.1,
            self.bandwidth_bytes_per_sec / 1_000_000_000,
            self.lanes,
            self.receive_slot_bytes,
            self.max_eager_chunks,
            threshold,
            self.read_slice_bytes,
            self.max_outstanding_reads,
            self.max_bytes_in_flight / 1024,
            self.lease_us,
            self.reply_timeout_us,
            self.directory_latency_ns,
            self.directory_timeout_us,
            self.detect_us,
            self.reconnect_us,
            self.qp_timeout_us,
            self.workload_us,
            self.op_interval_us,
            self.fetch_timeout_us,
            self.faults_until_us,
            self.crashes,
            self.partitions,
            self.directory_outages,
            self.slow_windows,
            self.qp_error_ppm,
            self.bad_rkey_ppm,
            self.persistent,
            self.location_cache_entries,
            self.forced_modes,
            self.publication_grace_us,
            self.hold_replies_until_durable,
            self.commit_latency_us.0,
            self.commit_latency_us.1,
            self.heartbeat_interval_us,
            self.session_heartbeat_timeout_us,
            self.registry_heartbeat_timeout_us,
            self.reconnect_backoff_min_us,
            self.reconnect_backoff_max_us,
            self.head_partitions,
            self.lost_push_ppm,
            self.corrupt_ppm
        )?;
        if self.reads_share_links {
            write!(f, " reads_share_links")?;
        }
        if self.failure_domains > 0 {
            write!(f, " domains={}", self.failure_domains)?;
        }
        if let Some((domain, at, down)) = self.domain_crash {
            write!(f, " domain_crash=rack-{domain}@{at}us+{down}us")?;
        }
        if let Some(sharding) = self.sharding.as_ref().filter(|s| s.shards > 1) {
            write!(
                f,
                " directory_shards={} shard_latency={:?}ns replica_lag={}us failovers=",
                sharding.shards, sharding.latency_ns, sharding.replica_lag_us
            )?;
            for (i, (shard, at, down)) in sharding.failovers.iter().enumerate() {
                let comma = if i == 0 { "" } else { "," };
                write!(f, "{comma}shard{shard}@{at}us+{down}us")?;
            }
        }
        Ok(())
    }
}
