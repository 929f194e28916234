//! The `Cluster` harness: N nodes of the real core, one event queue keyed by (virtual time,
//! sequence), one seeded RNG, the network, RDMA and directory models, faults, the workload and
//! the checker. `step()` runs the next event, `drive()` runs until nothing is left,
//! `drive_bounded()` says what is still pending when a budget runs out.

mod clients;
mod driver;
mod durability;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use skyriver_core::client_protocol::Request;
use skyriver_core::directory::{DirectoryNotice, DirectoryOpId, DirectoryRequest};
use skyriver_core::node::{ArenaKey, PathCosts, FETCH_CLIENT};
use skyriver_core::{
    wire, ClientId, FetchError, Instant, LocalRegion, Node, NodeConfig, NodeId, ObjectId,
    ObjectSizes, PeerParams, ReadError, ReadOpId, RemoteRegion, StoreError,
};

use self::clients::Call;
use self::driver::SimDriver;
use self::durability::Disk;
use crate::checker::{Checker, PendingKey};
use crate::directory::{DirEvent, Effect, SimDirectory};
use crate::network::Network;
use crate::params::SimParams;
use crate::rdma::Memory;
use crate::trace::Trace;

#[derive(Debug)]
enum Event {
    Deliver {
        from: NodeId,
        to: NodeId,
        to_inc: u32,
        epoch: u64,
        bytes: Vec<u8>,
    },
    ReadServe {
        requester: NodeId,
        requester_inc: u32,
        holder: NodeId,
        epoch: u64,
        op: ReadOpId,
        remote: RemoteRegion,
        local: LocalRegion,
        object: ObjectId,
    },
    ReadComplete {
        node: NodeId,
        inc: u32,
        peer: NodeId,
        epoch: u64,
        op: ReadOpId,
        local: LocalRegion,
        object: ObjectId,
        result: Result<Vec<u8>, ReadError>,
    },
    /// Something of the directory (the head, a session, the link between them) is due.
    Directory(DirEvent),
    /// A directory reply or event reaches a node's core.
    DirectoryNotice {
        to: NodeId,
        inc: u32,
        notice: DirectoryNotice,
    },
    Timer {
        node: NodeId,
        inc: u32,
    },
    PeerLost {
        node: NodeId,
        inc: u32,
        peer: NodeId,
    },
    PeerConnected {
        node: NodeId,
        inc: u32,
        peer: NodeId,
        epoch: u64,
    },
    ClientOp {
        node: NodeId,
        inc: u32,
        client: ClientId,
    },
    ClientRelease {
        node: NodeId,
        inc: u32,
        client: ClientId,
        id: ObjectId,
    },
    /// A client sends a request it decided on earlier (a seal after writing).
    ClientSend {
        node: NodeId,
        inc: u32,
        client: ClientId,
        body: Request,
        call: Call,
    },
    /// The node's disk committed its changes up to `upto`.
    Persisted {
        node: NodeId,
        inc: u32,
        upto: u64,
    },
    Crash {
        node: NodeId,
    },
    Restart {
        node: NodeId,
    },
    Partition {
        a: NodeId,
        b: NodeId,
        on: bool,
    },
    DirectoryOutage {
        on: bool,
    },
    Slow {
        node: NodeId,
        factor: u64,
    },
}

struct Scheduled {
    at: Instant,
    seq: u64,
    /// Heartbeats: they do not keep a run going (`drive` stops when only these are left).
    background: bool,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct SimNode {
    node: Option<Node>,
    inc: u32,
    memory: Memory,
    timer_at: Option<Instant>,
    /// In persistent mode: what survives a crash.
    disk: Disk,
    /// Seals acknowledged to clients while replies wait for durability, of objects still in
    /// the store: each must survive a crash.
    acked_seals: BTreeSet<ObjectId>,
    /// Between a crash and the restart: what the disk held.
    recovering: Vec<skyriver_core::RecoveredObject>,
}

/// Counters of a run, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events processed.
    pub events: u64,
    /// Objects created and sealed by clients.
    pub puts: u64,
    /// Fetch replies, and how many of their ids came back `Ok`.
    pub fetch_replies: u64,
    /// Ids fetched successfully.
    pub fetched_ok: u64,
    /// Ids whose fetch failed (not found, timeout, sources failed, ...).
    pub fetched_err: u64,
    /// Transfers that sealed an object, summed over nodes.
    pub transfers_ok: u64,
    /// Transfers that failed, summed over nodes.
    pub transfers_failed: u64,
    /// Objects served eagerly, summed over nodes.
    pub served_eager: u64,
    /// Objects served by rendezvous, summed over nodes.
    pub served_rendezvous: u64,
    /// Leases that expired.
    pub leases_expired: u64,
    /// READs posted.
    pub reads: u64,
    /// Node crashes.
    pub crashes: u64,
    /// Misuses of the client protocol the nodes refused.
    pub misuses_refused: u64,
    /// Commits of the simulated disks.
    pub durable_commits: u64,
    /// Directory faults and reconnections.
    pub directory: crate::directory::DirectoryStats,
}

impl SimStats {
    fn absorb(&mut self, node: &Node) {
        let s = node.stats();
        self.transfers_ok += s.transfers_succeeded;
        self.transfers_failed += s.transfers_failed;
        self.served_eager += s.served_eager;
        self.served_rendezvous += s.served_rendezvous;
        self.leases_expired += s.leases_expired;
        self.reads += s.reads_posted;
    }
}

/// How a cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunMode {
    /// Random clients issue operations until the workload's end.
    pub workload: bool,
    /// Random faults (crashes, partitions, ...) before the faults' end.
    pub faults: bool,
    /// Keep trace lines (for golden traces and `--trace`).
    pub keep_trace: bool,
    /// Print trace lines as they happen.
    pub echo_trace: bool,
}

/// A simulated cluster.
pub struct Cluster {
    params: SimParams,
    mode: RunMode,
    now: Instant,
    rng: ChaCha8Rng,
    queue: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    nodes: Vec<SimNode>,
    network: Network,
    directory: SimDirectory,
    /// Queued events that are not background.
    foreground: u64,
    trace: Trace,
    checker: Checker,
    /// Scripted: the next READs a requester posts fail with a QP error.
    failing_reads: BTreeMap<NodeId, u32>,
    reads_in_flight: u64,
    next_object: u64,
    known_objects: Vec<ObjectId>,
    next_request: u64,
    /// Client requests awaiting replies, and what the client does with each.
    calls: BTreeMap<PendingKey, Call>,
    next_rogue: u64,
    /// The message being delivered: a `WriteLocal` copies its payload from here.
    input: Vec<u8>,
    stats: SimStats,
    /// End-of-run checks done.
    finished: bool,
}

const WORKLOAD_CLIENT_BASE: u64 = 1;

impl Cluster {
    /// A cluster for a random run of `seed`; `nodes` overrides the drawn node count.
    pub fn random(seed: u64, nodes: Option<usize>, mode: RunMode) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let params = SimParams::draw(seed, &mut rng, nodes);
        Self::build(params, rng, mode)
    }

    /// A cluster of `nodes` with fixed parameters, no workload and no random faults, keeping its
    /// trace: for scripted scenarios and golden traces.
    pub fn scripted(nodes: usize) -> Self {
        let params = SimParams::scripted(nodes);
        let rng = ChaCha8Rng::seed_from_u64(0);
        Self::build(
            params,
            rng,
            RunMode {
                workload: false,
                faults: false,
                keep_trace: true,
                echo_trace: false,
            },
        )
    }

    fn build(params: SimParams, mut rng: ChaCha8Rng, mode: RunMode) -> Self {
        let n = params.nodes;
        let mut latency = BTreeMap::new();
        for a in 0..n {
            for b in a + 1..n {
                let ns = rng.gen_range(params.latency_ns.0..=params.latency_ns.1);
                latency.insert((NodeId(a as u32), NodeId(b as u32)), ns);
            }
        }
        let network = Network::new(latency, params.bandwidth_bytes_per_sec);
        let (directory, directory_effects) =
            SimDirectory::formed(params.directory_params(), n, Instant::ZERO);
        let mut cluster = Cluster {
            mode,
            now: Instant::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            nodes: Vec::new(),
            network,
            directory,
            foreground: 0,
            trace: Trace::new(mode.keep_trace, mode.echo_trace),
            checker: Checker::default(),
            failing_reads: BTreeMap::new(),
            reads_in_flight: 0,
            next_object: 1,
            known_objects: Vec::new(),
            next_request: 1,
            calls: BTreeMap::new(),
            next_rogue: 0,
            input: Vec::new(),
            stats: SimStats::default(),
            finished: false,
            params,
            rng,
        };
        cluster.apply_directory(directory_effects);
        for i in 0..n {
            let memory = Memory::new(
                cluster.params.arena_bytes,
                cluster.arena_key(NodeId(i as u32), 0),
            );
            cluster.nodes.push(SimNode {
                node: None,
                inc: 0,
                memory,
                timer_at: None,
                disk: Disk::default(),
                acked_seals: BTreeSet::new(),
                recovering: Vec::new(),
            });
            let node = Node::new(cluster.node_config(NodeId(i as u32), 0), Instant::ZERO);
            cluster.nodes[i].node = Some(node);
        }
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    cluster.connect(NodeId(a as u32), NodeId(b as u32));
                }
            }
        }
        for i in 0..n {
            cluster.connect_clients(NodeId(i as u32));
        }
        if mode.faults {
            cluster.plan_faults();
        }
        if mode.workload {
            for i in 0..n {
                cluster.start_clients(NodeId(i as u32));
            }
        }
        cluster
    }

    // ---- Public script interface ----

    /// The parameters of this run.
    pub fn params(&self) -> &SimParams {
        &self.params
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The trace's kept lines.
    pub fn trace_text(&self) -> String {
        self.trace.text()
    }

    /// Hash of every trace line.
    pub fn trace_hash(&self) -> u64 {
        self.trace.hash()
    }

    /// Invariant violations found so far.
    pub fn violations(&self) -> &[String] {
        self.checker.violations()
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        let mut stats = self.stats.clone();
        stats.directory = self.directory.stats.clone();
        for sim_node in &self.nodes {
            if let Some(node) = &sim_node.node {
                stats.absorb(node);
            }
        }
        stats
    }

    /// A node, if it is up.
    pub fn node(&self, node: u32) -> Option<&Node> {
        self.nodes[node as usize].node.as_ref()
    }

    /// READs posted and not yet completed.
    pub fn reads_in_flight(&self) -> u64 {
        self.reads_in_flight
    }

    /// Records a free-form line in the trace (scenario markers).
    pub fn note(&mut self, text: &str) {
        self.trace.record(self.now, &format!("-- {text}"));
    }

    /// Client 1 of `node` creates, writes and seals object `n` of `data_size` bytes.
    pub fn put(&mut self, node: u32, n: u64, data_size: u64) -> ObjectId {
        let id = ObjectId::from_u64(n);
        let sizes = ObjectSizes {
            data_size,
            metadata_size: 0,
        };
        self.client_put(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            id,
            sizes,
            None,
        );
        self.drive_until(|c| c.known_objects.contains(&id) || !c.creating(id));
        id
    }

    /// Client 1 of `node` creates object `n` of `data_size` bytes and holds it for `hold`.
    pub fn put_and_hold(&mut self, node: u32, n: u64, data_size: u64, hold: Duration) -> ObjectId {
        let id = ObjectId::from_u64(n);
        let sizes = ObjectSizes {
            data_size,
            metadata_size: 0,
        };
        let client = ClientId(WORKLOAD_CLIENT_BASE);
        let hold_us = hold.as_micros() as u64;
        self.client_put(NodeId(node), client, id, sizes, Some(hold_us));
        self.drive_until(|c| c.known_objects.contains(&id) || !c.creating(id));
        id
    }

    /// Whether a client is still creating or sealing `id`.
    fn creating(&self, id: ObjectId) -> bool {
        self.calls.values().any(|call| {
            matches!(call, Call::Create { id: i, .. } | Call::Seal { id: i, .. } if *i == id)
        }) || self.queue.iter().any(|Reverse(s)| {
            matches!(&s.event, Event::ClientSend { call: Call::Seal { id: i, .. }, .. } if *i == id)
        })
    }

    /// Client 1 of `node` fetches objects `ns` with a timeout, waiting for a publication of
    /// objects nobody holds yet.
    pub fn fetch(&mut self, node: u32, ns: &[u64], timeout: Duration) {
        let ids = ns.iter().map(|&n| ObjectId::from_u64(n)).collect();
        self.client_fetch(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            ids,
            timeout,
            true,
        );
    }

    /// [`Cluster::fetch`] that does not wait for a publication: an object nobody holds fails
    /// after the node's publication grace.
    pub fn fetch_without_waiting(&mut self, node: u32, ns: &[u64], timeout: Duration) {
        let ids = ns.iter().map(|&n| ObjectId::from_u64(n)).collect();
        self.client_fetch(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            ids,
            timeout,
            false,
        );
    }

    /// Crashes a node now (its memory is lost).
    pub fn crash(&mut self, node: u32) {
        self.crash_node(NodeId(node));
    }

    /// Restarts a crashed node now: with an empty store, or in persistent mode with every
    /// object it had sealed.
    pub fn restart(&mut self, node: u32) {
        self.restart_node(NodeId(node));
    }

    /// Turns persistent mode on or off for later crashes (scripted scenarios).
    pub fn set_persistent(&mut self, persistent: bool) {
        self.params.persistent = persistent;
    }

    /// The next `count` READs that `requester` posts fail with a QP error.
    pub fn fail_next_reads(&mut self, requester: u32, count: u32) {
        *self.failing_reads.entry(NodeId(requester)).or_default() += count;
    }

    /// The directory head crashes and loses its registry; `silent`: the nodes' connections
    /// do not reset, they find out by heartbeat.
    pub fn crash_head(&mut self, silent: bool) {
        self.handle(Event::Directory(DirEvent::Head { up: false, silent }));
    }

    /// The directory head comes back, with an empty registry.
    pub fn restart_head(&mut self) {
        self.handle(Event::Directory(DirEvent::Head {
            up: true,
            silent: false,
        }));
    }

    /// Cuts `node` off from the directory head (`on`) or heals the cut.
    pub fn partition_from_head(&mut self, node: u32, on: bool) {
        let node = NodeId(node);
        self.handle(Event::Directory(DirEvent::HeadPartition { node, on }));
    }

    /// The simulated directory (head and sessions), for assertions.
    pub fn directory(&self) -> &SimDirectory {
        &self.directory
    }

    /// Runs events until virtual time `until` (heartbeats included), whatever is pending.
    pub fn run_until(&mut self, until: Instant) {
        while self
            .queue
            .peek()
            .is_some_and(|Reverse(next)| next.at <= until)
        {
            self.step();
        }
        self.now = self.now.max(until);
    }

    /// Runs the next event; false when none is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse(scheduled)) = self.queue.pop() else {
            return false;
        };
        debug_assert!(scheduled.at >= self.now, "time went back");
        self.now = scheduled.at;
        self.stats.events += 1;
        if !scheduled.background {
            self.foreground -= 1;
        }
        self.handle(scheduled.event);
        for violation in self.directory.check(self.now) {
            self.checker.violation(self.now, violation);
        }
        true
    }

    /// Runs until no event is left but heartbeats.
    pub fn drive(&mut self) {
        while self.foreground > 0 && self.step() {}
    }

    /// Runs until `done` holds (checked after each event) or nothing is left but heartbeats;
    /// true if it held.
    pub fn drive_until(&mut self, mut done: impl FnMut(&Cluster) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.foreground == 0 || !self.step() {
                return false;
            }
        }
    }

    /// Runs until nothing is left but heartbeats or the budget (events, or virtual time
    /// `until`) runs out. `Err` lists everything still pending, with the reason each gives.
    pub fn drive_bounded(&mut self, max_events: u64, until: Instant) -> Result<(), Vec<String>> {
        let mut events = 0;
        while let Some(Reverse(next)) = self.queue.peek() {
            if self.foreground == 0 {
                break;
            }
            if events >= max_events || next.at > until {
                let mut pending = vec![format!(
                    "budget ran out at {} after {events} events with {} events queued (next at {})",
                    self.now,
                    self.queue.len(),
                    next.at
                )];
                pending.extend(self.pending_work());
                return Err(pending);
            }
            self.step();
            events += 1;
        }
        Ok(())
    }

    /// What every live node and the checker still wait for.
    pub fn pending_work(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (i, sim_node) in self.nodes.iter().enumerate() {
            if let Some(node) = &sim_node.node {
                for line in node.pending_work() {
                    lines.push(format!("node-{i}: {line}"));
                }
            }
        }
        for ((node, inc, client, request), op) in &self.checker.pending {
            if self.alive(*node, *inc) {
                lines.push(format!(
                    "{client}@{node} {} {request} of {:?} issued at {} (deadline {}) has no reply",
                    op.kind, op.ids, op.issued, op.deadline
                ));
            }
        }
        lines
    }

    /// End-of-run checks, once faults stopped and the cluster settled: liveness (nothing
    /// pending) and balance (no reference, pin, lease, exposure or unsealed object left).
    pub fn check_quiescence(&mut self) {
        self.settle_directory();
        let now = self.now;
        for line in self.pending_work() {
            self.checker.violation(
                now,
                format!("liveness: still pending after faults stopped: {line}"),
            );
        }
        for i in 0..self.nodes.len() {
            let sim_node = &self.nodes[i];
            let Some(node) = &sim_node.node else { continue };
            if node.bytes_in_flight() != 0 {
                let what = format!(
                    "node-{i}: {} bytes still in flight at the end",
                    node.bytes_in_flight()
                );
                self.checker.violation(now, what);
            }
            self.checker.check_quiescent_store(
                now,
                NodeId(i as u32),
                node.store(),
                &sim_node.memory,
            );
        }
        self.finished = true;
    }

    // ---- Setup ----

    fn arena_key(&mut self, node: NodeId, inc: u32) -> ArenaKey {
        let base_addr = 0x10_0000_0000 * (node.0 as u64 + 1) + 0x1_0000_0000 * inc as u64;
        let rkey = if self.mode.faults || self.mode.workload {
            self.rng.gen::<u32>() | 1
        } else {
            0x100 + node.0 * 16 + inc
        };
        ArenaKey { base_addr, rkey }
    }

    fn node_config(&self, node: NodeId, inc: u32) -> NodeConfig {
        let p = &self.params;
        let mut config = NodeConfig::new(node, p.arena_bytes);
        config.incarnation = inc;
        config.region_keys = self.nodes[node.0 as usize].memory.region_keys();
        config.receive_slot_bytes = p.receive_slot_bytes;
        config.max_eager_chunks = p.max_eager_chunks;
        config.threshold = p.threshold;
        config.location_cache_entries = p.location_cache_entries;
        config.publication_grace = Duration::from_micros(p.publication_grace_us);
        config.read_slice_bytes = p.read_slice_bytes;
        config.max_outstanding_reads = p.max_outstanding_reads;
        config.max_bytes_in_flight = p.max_bytes_in_flight;
        config.max_pending_fetches = 256;
        config.max_leases = 64;
        config.lease = Duration::from_micros(p.lease_us);
        config.reply_timeout = Duration::from_micros(p.reply_timeout_us);
        config.directory_timeout = Duration::from_micros(p.directory_timeout_us);
        config.max_directory_attempts = 6;
        config.max_source_rounds = 3;
        config.retry_backoff = Duration::from_micros(100);
        // Every node records durable changes for its simulated disk; in persistent mode the
        // disk also survives a crash.
        config.store.record_durable_changes = true;
        config.hold_replies_until_durable = p.hold_replies_until_durable;
        config.store.hash_seed = p.seed ^ ((node.0 as u64) << 32) ^ inc as u64;
        config
    }

    fn peer_params(&self, a: NodeId, b: NodeId) -> PeerParams {
        let latency = self.network.latency_ns(a, b) as f64;
        PeerParams {
            lanes: self.params.lanes,
            costs: PathCosts {
                round_trip_ns: 2.0 * latency,
                message_overhead_ns: 500.0,
                copy_bytes_per_sec: 8e9,
                wire_bytes_per_sec: self.network.bandwidth_bytes_per_sec() as f64,
                read_setup_ns: 1_000.0,
            },
        }
    }

    /// Initial connection (no delay).
    fn connect(&mut self, a: NodeId, b: NodeId) {
        let params = self.peer_params(a, b);
        if let Some(node) = self.nodes[a.0 as usize].node.as_mut() {
            node.handle_peer_connected(self.now, b, params);
        }
        self.after_input(a);
    }

    fn plan_faults(&mut self) {
        let p = self.params.clone();
        let n = p.nodes as u32;
        let until = p.faults_until_us;
        for _ in 0..p.crashes {
            let node = NodeId(self.rng.gen_range(0..n));
            let at = self.rng.gen_range(0..until);
            let down = p.detect_us + self.rng.gen_range(100..=3_000);
            self.schedule_us(at, Event::Crash { node });
            self.schedule_us(at + down, Event::Restart { node });
        }
        if n >= 2 {
            for _ in 0..p.partitions {
                let a = self.rng.gen_range(0..n);
                let b = (a + self.rng.gen_range(1..n)) % n;
                let at = self.rng.gen_range(0..until);
                let length = self.rng.gen_range(200..=3_000);
                let (a, b) = (NodeId(a), NodeId(b));
                self.schedule_us(at, Event::Partition { a, b, on: true });
                self.schedule_us(at + length, Event::Partition { a, b, on: false });
            }
        }
        for _ in 0..p.directory_outages {
            let at = self.rng.gen_range(0..until);
            let length = self.rng.gen_range(100..=2_000);
            self.schedule_us(at, Event::DirectoryOutage { on: true });
            self.schedule_us(at + length, Event::DirectoryOutage { on: false });
        }
        for _ in 0..p.head_partitions {
            let node = NodeId(self.rng.gen_range(0..n));
            let at = self.rng.gen_range(0..until);
            let length = self.rng.gen_range(200..=4_000);
            self.schedule_us(
                at,
                Event::Directory(DirEvent::HeadPartition { node, on: true }),
            );
            self.schedule_us(
                at + length,
                Event::Directory(DirEvent::HeadPartition { node, on: false }),
            );
        }
        for _ in 0..p.slow_windows {
            let node = NodeId(self.rng.gen_range(0..n));
            let at = self.rng.gen_range(0..until);
            let length = self.rng.gen_range(500..=5_000);
            let factor = self.rng.gen_range(5..=30);
            self.schedule_us(at, Event::Slow { node, factor });
            self.schedule_us(at + length, Event::Slow { node, factor: 1 });
        }
    }

    fn start_clients(&mut self, node: NodeId) {
        let inc = self.nodes[node.0 as usize].inc;
        for c in 0..self.params.clients_per_node as u64 {
            let at = self.now.0 / 1000 + self.rng.gen_range(0..=self.params.op_interval_us);
            if at < self.params.workload_us {
                let client = ClientId(WORKLOAD_CLIENT_BASE + c);
                self.schedule_us(at, Event::ClientOp { node, inc, client });
            }
        }
    }

    fn schedule(&mut self, at: Instant, event: Event) {
        self.schedule_as(at, event, false);
    }

    fn schedule_as(&mut self, at: Instant, event: Event, background: bool) {
        self.seq += 1;
        if !background {
            self.foreground += 1;
        }
        self.queue.push(Reverse(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            background,
            event,
        }));
    }

    fn schedule_us(&mut self, at_us: u64, event: Event) {
        self.schedule(Instant(at_us * 1000), event);
    }

    fn after(&self, ns: u64) -> Instant {
        Instant(self.now.0 + ns)
    }

    /// Gives node `n` (alive) one input at the current time, then carries out its outputs.
    fn feed(&mut self, n: NodeId, input: impl FnOnce(&mut Node, Instant)) {
        let now = self.now;
        input(self.nodes[n.0 as usize].node.as_mut().expect("alive"), now);
        self.after_input(n);
    }

    fn alive(&self, node: NodeId, inc: u32) -> bool {
        let sim_node = &self.nodes[node.0 as usize];
        sim_node.node.is_some() && sim_node.inc == inc
    }

    fn record(&mut self, text: impl FnOnce() -> String) {
        let line = text();
        self.trace.record(self.now, &line);
    }

    // ---- Events ----

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver {
                from,
                to,
                to_inc,
                epoch,
                bytes,
            } => {
                let connection = self.network.connection(from, to);
                if !self.alive(to, to_inc) || !connection.up || connection.epoch != epoch {
                    return;
                }
                let now = self.now;
                let text = match wire::decode(&bytes) {
                    Ok(message) => format!("{to} <- {from} {message}"),
                    Err(error) => format!("{to} <- {from} undecodable: {error}"),
                };
                self.record(|| text);
                let node = self.nodes[to.0 as usize].node.as_mut().expect("alive");
                if let Err(error) = node.handle_peer_bytes(now, from, &bytes) {
                    self.checker.violation(
                        now,
                        format!("{to}: message from {from} does not decode: {error}"),
                    );
                }
                // The outputs copy an eager payload straight from the delivered bytes.
                self.input = bytes;
                self.after_input(to);
                self.input = Vec::new();
            }
            Event::ReadServe {
                requester,
                requester_inc,
                holder,
                epoch,
                op,
                remote,
                local,
                object,
            } => self.serve_read(
                requester,
                requester_inc,
                holder,
                epoch,
                op,
                remote,
                local,
                object,
            ),
            Event::ReadComplete {
                node,
                inc,
                peer,
                epoch,
                op,
                local,
                object,
                result,
            } => {
                if !self.alive(node, inc) {
                    return;
                }
                self.reads_in_flight -= 1;
                let connection = self.network.connection(node, peer);
                let result = match result {
                    // The response was on the wire when the connection broke: flushed.
                    Ok(_) if connection.epoch != epoch => Err(ReadError::ConnectionLost),
                    other => other,
                };
                let now = self.now;
                let result = match result {
                    Ok(bytes) => {
                        let sim_node = &mut self.nodes[node.0 as usize];
                        let store = sim_node.node.as_ref().expect("alive").store();
                        self.checker.check_write_target(
                            now,
                            node,
                            store,
                            object,
                            local,
                            "READ data",
                        );
                        sim_node.memory.write(local, &bytes);
                        self.record(|| {
                            format!("{node} {op} done ({} bytes of {object})", bytes.len())
                        });
                        Ok(())
                    }
                    Err(error) => {
                        self.record(|| format!("{node} {op} failed: {error}"));
                        Err(error)
                    }
                };
                self.feed(node, |n, now| n.handle_read_completion(now, op, result));
            }
            Event::Directory(event) => {
                let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
                let effects = self
                    .directory
                    .handle(self.now, event, &mut self.rng, faults_on);
                self.apply_directory(effects);
            }
            Event::DirectoryNotice { to, inc, notice } => {
                if !self.alive(to, inc) {
                    return;
                }
                self.directory.delivering(to, &notice);
                match notice {
                    DirectoryNotice::Reply { op, reply } => {
                        self.record(|| format!("{to} <- directory {op} {reply}"));
                        self.feed(to, |node, now| node.handle_directory_reply(now, op, reply));
                    }
                    DirectoryNotice::Event(event) => {
                        self.record(|| format!("{to} <- directory {event}"));
                        self.feed(to, |node, now| node.handle_directory_event(now, event));
                    }
                    DirectoryNotice::Members(_) | DirectoryNotice::Health(_) => {}
                }
            }
            Event::Timer { node, inc } => {
                if !self.alive(node, inc) {
                    return;
                }
                let now = self.now;
                let sim_node = &mut self.nodes[node.0 as usize];
                if sim_node.timer_at.is_some_and(|at| at <= now) {
                    sim_node.timer_at = None;
                }
                sim_node.node.as_mut().expect("alive").handle_timeout(now);
                self.after_input(node);
            }
            Event::PeerLost { node, inc, peer } => {
                if !self.alive(node, inc) {
                    return;
                }
                self.record(|| format!("{node}: connection to {peer} lost"));
                self.feed(node, |node, now| node.handle_peer_lost(now, peer));
            }
            Event::PeerConnected {
                node,
                inc,
                peer,
                epoch,
            } => {
                let connection = self.network.connection(node, peer);
                if !self.alive(node, inc) || !connection.up || connection.epoch != epoch {
                    return;
                }
                self.record(|| format!("{node}: connected to {peer}"));
                let params = self.peer_params(node, peer);
                self.feed(node, |node, now| {
                    node.handle_peer_connected(now, peer, params)
                });
            }
            Event::ClientOp { node, inc, client } => {
                if !self.alive(node, inc) {
                    return;
                }
                self.client_op(node, client);
                if self.now.0 / 1000 < self.params.workload_us {
                    let pause = self.rng.gen_range(
                        self.params.op_interval_us / 2..=self.params.op_interval_us * 3 / 2,
                    );
                    self.schedule(
                        self.after(pause * 1000),
                        Event::ClientOp { node, inc, client },
                    );
                }
            }
            Event::ClientRelease {
                node,
                inc,
                client,
                id,
            } => {
                if !self.alive(node, inc) {
                    return;
                }
                let now = self.now;
                let sim_node = &mut self.nodes[node.0 as usize];
                let store = sim_node.node.as_ref().expect("alive").store();
                // A held object stays sealed and unchanged until released.
                self.checker.check_sealed_object(
                    now,
                    node,
                    store,
                    &sim_node.memory,
                    id,
                    "before release",
                );
                self.client_request(node, client, Request::Release { id }, Call::Release { id });
            }
            Event::ClientSend {
                node,
                inc,
                client,
                body,
                call,
            } => {
                if self.alive(node, inc) {
                    self.client_request(node, client, body, call);
                }
            }
            Event::Persisted { node, inc, upto } => self.persisted(node, inc, upto),
            Event::Crash { node } => self.crash_node(node),
            Event::Restart { node } => self.restart_node(node),
            Event::Partition { a, b, on } => {
                self.network.set_partition(a, b, on);
                if on {
                    self.record(|| format!("FAULT partition {a} / {b}"));
                    self.break_link(a, b);
                } else {
                    self.record(|| format!("FAULT healed partition {a} / {b}"));
                    self.restore_link(a, b);
                }
            }
            Event::DirectoryOutage { on } => {
                // An outage is a crash of the head: its registry is lost. Half the time the
                // nodes' connections reset at once; otherwise only heartbeats tell.
                let silent = on && self.rng.gen_bool(0.5);
                let event = DirEvent::Head { up: !on, silent };
                self.handle(Event::Directory(event));
            }
            Event::Slow { node, factor } => {
                self.network.set_slow(node, factor);
                self.record(|| format!("FAULT {node} slowdown x{factor}"));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn serve_read(
        &mut self,
        requester: NodeId,
        requester_inc: u32,
        holder: NodeId,
        epoch: u64,
        op: ReadOpId,
        remote: RemoteRegion,
        local: LocalRegion,
        object: ObjectId,
    ) {
        let connection = self.network.connection(requester, holder);
        let complete = |result| Event::ReadComplete {
            node: requester,
            inc: requester_inc,
            peer: holder,
            epoch,
            op,
            local,
            object,
            result,
        };
        let latency = self.network.latency_ns(requester, holder);
        if !connection.up
            || connection.epoch != epoch
            || self.nodes[holder.0 as usize].node.is_none()
        {
            let at = self.after(self.params.qp_timeout_us * 1000);
            self.schedule(at, complete(Err(ReadError::ConnectionLost)));
            return;
        }
        if let Some(count) = self.failing_reads.get_mut(&requester).filter(|c| **c > 0) {
            *count -= 1;
            let error = ReadError::QueuePair("injected: transport retry counter exceeded".into());
            self.schedule(self.after(latency), complete(Err(error)));
            return;
        }
        let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
        if faults_on && self.rng.gen_range(0..1_000_000) < self.params.qp_error_ppm {
            self.record(|| format!("FAULT QP error on {op} {requester} <- {holder}"));
            let error = ReadError::QueuePair("injected: QP went to the error state".into());
            self.schedule(self.after(latency), complete(Err(error)));
            return;
        }
        let holder_node = &self.nodes[holder.0 as usize];
        match holder_node.memory.serve(remote) {
            Err(why) => {
                self.record(|| format!("{holder} refuses {op} of {remote}: {why:?}"));
                self.schedule(self.after(latency), complete(Err(ReadError::RemoteAccess)));
            }
            Ok((exposed_object, bytes)) => {
                // Being read: the holder's core must keep the object sealed and pinned.
                let store = holder_node.node.as_ref().expect("checked above").store();
                match store.summary(&exposed_object) {
                    Some(s) if s.sealed && s.pin_count > 0 => {}
                    other => {
                        let state = other.map_or("gone".to_string(), |s| {
                            format!(
                                "sealed={} pins={} refs={}",
                                s.sealed, s.pin_count, s.ref_count
                            )
                        });
                        let what = format!(
                            "{holder}: READ {op} by {requester} served from {exposed_object}, which is not pinned ({state})"
                        );
                        self.checker.violation(self.now, what);
                    }
                }
                let at = self
                    .after(self.network.wire_ns(holder, requester, bytes.len() as u64) + latency);
                self.schedule(at, complete(Ok(bytes)));
            }
        }
    }

    /// Drains a node's outputs, then reschedules its timer.
    fn after_input(&mut self, n: NodeId) {
        loop {
            let Some(node) = self.nodes[n.0 as usize].node.as_mut() else {
                return;
            };
            let Some(output) = node.poll_output() else {
                break;
            };
            output.dispatch(&mut SimDriver { cluster: self, n });
        }
        let inc = self.nodes[n.0 as usize].inc;
        let sim_node = &mut self.nodes[n.0 as usize];
        let node = sim_node.node.as_ref().expect("alive");
        node.check_invariants();
        if let Some(at) = node.poll_timeout() {
            if sim_node.timer_at.is_none_or(|t| at < t) {
                sim_node.timer_at = Some(at);
                self.schedule(at, Event::Timer { node: n, inc });
            }
        }
    }

    /// A node's directory request goes to its directory session.
    fn send_to_directory(&mut self, n: NodeId, op: DirectoryOpId, request: DirectoryRequest) {
        self.record(|| format!("{n} -> directory {op} {request}"));
        let effects = self.directory.submit(self.now, n, op, request);
        self.apply_directory(effects);
    }

    fn transmit(&mut self, from: NodeId, to: NodeId, bytes: Vec<u8>) {
        let connection = self.network.connection(from, to);
        if !connection.up {
            self.record(|| {
                format!(
                    "{from} -> {to} lost (connection down): {} bytes",
                    bytes.len()
                )
            });
            return;
        }
        let text = match wire::decode(&bytes) {
            Ok(message) => format!("{from} -> {to} {message}"),
            Err(error) => format!("{from} -> {to} undecodable: {error}"),
        };
        self.record(|| text);
        let at = self.network.arrival(self.now, from, to, bytes.len() as u64);
        let to_inc = self.nodes[to.0 as usize].inc;
        self.schedule(
            at,
            Event::Deliver {
                from,
                to,
                to_inc,
                epoch: connection.epoch,
                bytes,
            },
        );
    }

    // ---- Directory ----

    /// Schedules what the directory asked for.
    fn apply_directory(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Schedule {
                    at,
                    event,
                    background,
                } => self.schedule_as(at, Event::Directory(event), background),
                Effect::Notice { node, inc, notice } => self.schedule(
                    self.now,
                    Event::DirectoryNotice {
                        to: node,
                        inc,
                        notice,
                    },
                ),
                Effect::Trace(line) => self.record(|| line),
            }
        }
    }

    /// Once faults stopped and the cluster is idle: runs on (heartbeats, reconnections,
    /// replays) until the directory converged, within a bound; a violation if it did not.
    pub fn settle_directory(&mut self) {
        let p = &self.params;
        let bound_us = 4
            * (p.registry_heartbeat_timeout_us
                + p.session_heartbeat_timeout_us
                + p.reconnect_backoff_max_us)
            + 10 * p.directory_latency_ns / 1000
            + 1_000;
        let deadline = Instant(self.now.0 + bound_us * 1000);
        loop {
            let live: Vec<(NodeId, u32)> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].node.is_some())
                .map(|i| (NodeId(i as u32), self.nodes[i].inc))
                .collect();
            let converged = self.directory.converged(&live);
            if converged.is_ok() && self.foreground == 0 {
                return;
            }
            let next_at = self.queue.peek().map(|Reverse(next)| next.at);
            if next_at.is_none_or(|at| at > deadline) {
                if let Err(what) = converged {
                    let now = self.now;
                    self.checker.violation(
                        now,
                        format!(
                            "liveness: the directory did not converge after faults stopped: {what}"
                        ),
                    );
                }
                return;
            }
            self.step();
        }
    }

    /// Directory fault and traffic counters.
    pub fn directory_stats(&self) -> crate::directory::DirectoryStats {
        self.directory.stats.clone()
    }

    // ---- Faults ----

    fn crash_node(&mut self, n: NodeId) {
        if self.nodes[n.0 as usize].node.is_none() {
            return;
        }
        self.record(|| format!("FAULT crash {n}"));
        self.stats.crashes += 1;
        if let Some(node) = self.nodes[n.0 as usize].node.take() {
            self.stats.absorb(&node);
        }
        if self.params.persistent {
            // What the disk holds survives; what was still on its way to it is lost.
            let durable = self.durable_at_crash(n);
            self.nodes[n.0 as usize].recovering = durable;
        } else {
            self.nodes[n.0 as usize].disk = Disk::default();
            self.nodes[n.0 as usize].acked_seals.clear();
        }
        let sim_node = &mut self.nodes[n.0 as usize];
        sim_node.timer_at = None;
        // Reads it posted die with it.
        let old_inc = sim_node.inc;
        sim_node.inc += 1;
        let lost_reads = self.count_reads_of(n, old_inc);
        self.reads_in_flight -= lost_reads;
        self.checker.pending.retain(|(node, ..), _| *node != n);
        self.calls.retain(|(node, ..), _| *node != n);
        for m in 0..self.nodes.len() as u32 {
            if NodeId(m) != n {
                self.break_link(n, NodeId(m));
            }
        }
        // A crashed process's connection to the head resets; a crashed host's goes silent.
        let silent = self.mode.faults && self.rng.gen_bool(0.5);
        let effects = self.directory.node_crashed(self.now, n, silent);
        self.apply_directory(effects);
    }

    fn count_reads_of(&self, n: NodeId, inc: u32) -> u64 {
        self.queue
            .iter()
            .filter(|Reverse(s)| match &s.event {
                Event::ReadServe {
                    requester,
                    requester_inc,
                    ..
                } => *requester == n && *requester_inc == inc,
                Event::ReadComplete { node, inc: i, .. } => *node == n && *i == inc,
                _ => false,
            })
            .count() as u64
    }

    fn restart_node(&mut self, n: NodeId) {
        if self.nodes[n.0 as usize].node.is_some() {
            return;
        }
        let inc = self.nodes[n.0 as usize].inc;
        let key = self.arena_key(n, inc);
        let durable = std::mem::take(&mut self.nodes[n.0 as usize].recovering);
        if self.params.persistent {
            let count = durable.len();
            self.record(|| {
                format!(
                    "FAULT restart {n} (incarnation {inc}, arena kept, recovering {count} objects)"
                )
            });
            self.nodes[n.0 as usize].memory.reregister(key);
        } else {
            self.record(|| format!("FAULT restart {n} (incarnation {inc}, empty store)"));
            self.nodes[n.0 as usize].memory = Memory::new(self.params.arena_bytes, key);
        }
        let mut node = Node::new(self.node_config(n, inc), self.now);
        if !durable.is_empty() {
            let report = node.handle_recovered(self.now, durable.clone());
            if !report.refused.is_empty() {
                let what = format!("{n} refused recovered objects: {:?}", report.refused);
                self.checker.violation(self.now, what);
            }
        }
        self.nodes[n.0 as usize].node = Some(node);
        self.check_recovered(n, &durable);
        let effects = self.directory.node_started(self.now, n, inc);
        self.apply_directory(effects);
        // Recovered objects are published like fresh seals.
        self.after_input(n);
        for m in 0..self.nodes.len() as u32 {
            if NodeId(m) != n {
                self.restore_link(n, NodeId(m));
            }
        }
        self.connect_clients(n);
        if self.mode.workload {
            self.start_clients(n);
        }
    }

    fn break_link(&mut self, a: NodeId, b: NodeId) {
        if !self.network.break_connection(self.now, a, b) {
            return;
        }
        let at = self.after(self.params.detect_us * 1000);
        for (node, peer) in [(a, b), (b, a)] {
            if self.nodes[node.0 as usize].node.is_some() {
                let inc = self.nodes[node.0 as usize].inc;
                self.schedule(at, Event::PeerLost { node, inc, peer });
            }
        }
    }

    fn restore_link(&mut self, a: NodeId, b: NodeId) {
        let both_up =
            self.nodes[a.0 as usize].node.is_some() && self.nodes[b.0 as usize].node.is_some();
        if !both_up || self.network.partitioned(a, b) || !self.network.restore_connection(a, b) {
            return;
        }
        let connection = self.network.connection(a, b);
        let earliest = Instant(connection.broke_at.0 + self.params.detect_us * 1000 + 1);
        let at = self.after(self.params.reconnect_us * 1000).max(earliest);
        for (node, peer) in [(a, b), (b, a)] {
            let inc = self.nodes[node.0 as usize].inc;
            self.schedule(
                at,
                Event::PeerConnected {
                    node,
                    inc,
                    peer,
                    epoch: connection.epoch,
                },
            );
        }
    }
}

fn short_store_error(error: &StoreError) -> String {
    match error {
        StoreError::ObjectNotFound(_) => "not-found".into(),
        StoreError::Timeout(_) => "timeout".into(),
        StoreError::ObjectNotSealed(_) => "not-sealed".into(),
        StoreError::OutOfMemory { .. } => "out-of-memory".into(),
        StoreError::ObjectExists(_) => "exists".into(),
        StoreError::ObjectInUse(_) => "in-use (deferred)".into(),
        StoreError::ObjectTooLarge { .. } => "too-large".into(),
        other => other.to_string(),
    }
}

fn short_fetch_error(error: &FetchError) -> String {
    match error {
        FetchError::NotFound { .. } => "not-found".into(),
        FetchError::NoCluster { .. } => "no-cluster".into(),
        FetchError::Timeout { stage, .. } => format!("timeout ({stage})"),
        FetchError::SourcesFailed {
            attempts,
            last_error,
            ..
        } => {
            format!("sources-failed after {attempts} attempts ({last_error})")
        }
        FetchError::DirectoryUnavailable { .. } => "directory-unavailable".into(),
        FetchError::Store(error) => short_store_error(error),
    }
}

/// The store client id the fetch manager uses, re-exported for scenario tests.
pub const NODE_FETCH_CLIENT: ClientId = FETCH_CLIENT;

fn id_list(ids: &[ObjectId]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
