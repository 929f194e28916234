//! The `Cluster` harness: N nodes of the real core, one event queue keyed by (virtual time,
//! sequence), one seeded RNG, the network, RDMA and directory models, faults, the workload and
//! the checker. `step()` runs the next event, `drive()` runs until nothing is left,
//! `drive_bounded()` says what is still pending when a budget runs out.

mod clients;
mod content;
mod crowd;
mod driver;
mod durability;
mod events;
mod faults;
mod liveness;
mod member_views;
mod node_checks;
mod queue;
mod relay;
mod replication;
mod script;
mod sim_read;
pub mod spill;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use skyriver_core::client_protocol::Request;
use skyriver_core::client_session::ClientSession;
use skyriver_core::directory::{DirectoryNotice, DirectoryOpId, DirectoryRequest};
use skyriver_core::node::{
    drive_host, ArenaKey, DialPolicy, GrantError, Handled, PathCosts, ReadGrant, FETCH_CLIENT,
};
use skyriver_core::{
    wire, ClientId, FetchError, Instant, LocalRegion, Node, NodeConfig, NodeId, NodeInput,
    ObjectId, ObjectSizes, PeerParams, ReadError, RemoteRegion, StoreError, TransferId,
};

pub use self::content::Flaws;
pub use self::crowd::run_crowd_seed;
pub use self::replication::{replication_limits, ReplicationRunStats};

use self::clients::{Call, SessionKey};
use self::driver::SimDriver;
use self::durability::Disk;
use self::faults::{MediaFaults, RefusedReads};
use self::sim_read::SimRead;
use crate::checker::Checker;
use crate::directory::{DirEvent, Effect, SimDirectory};
use crate::network::Network;
use crate::params::SimParams;
use crate::rdma::{AdmittedRead, Memory};
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
    /// A READ reaches its holder's fabric.
    ReadServe {
        read: SimRead,
        remote: RemoteRegion,
    },
    /// A READ's data or error reaches its requester.
    ReadComplete {
        read: SimRead,
        result: Result<Vec<u8>, ReadError>,
    },
    /// Something of the directory (the head, a session, the link between them) is due.
    Directory(DirEvent),
    /// Something of a shard of a sharded directory is due (shard 0's are `Directory`).
    DirectoryShard {
        shard: usize,
        event: DirEvent,
    },
    /// A directory reply or event reaches a node's core.
    DirectoryNotice {
        /// The shard it comes from.
        shard: usize,
        to: NodeId,
        inc: u32,
        notice: DirectoryNotice,
    },
    /// The holder's fabric finished copying an admitted READ's data out of its arena (after a
    /// stall; an unstalled READ is copied when admitted).
    ReadServed {
        holder_inc: u32,
        admitted: AdmittedRead,
        read: SimRead,
    },
    /// The fabric answers a node's `GrantRead`.
    ReadGranted {
        node: NodeId,
        inc: u32,
        reader: NodeId,
        req: TransferId,
        result: Result<ReadGrant, GrantError>,
    },
    /// A node's `RevokeRead` took effect.
    ReadRevoked {
        node: NodeId,
        inc: u32,
        reader: NodeId,
        req: TransferId,
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
    /// A spill write runs (see `spill`); `report`: the node hears of it now.
    SpillWritten {
        node: NodeId,
        inc: u32,
        job: spill::SpillJob,
        report: bool,
    },
    /// A spill write is reported complete (before it ran: a planted flaw).
    SpillReported {
        node: NodeId,
        inc: u32,
        op: skyriver_core::store::SpillOpId,
    },
    /// A restore read completes.
    SpillRestored {
        node: NodeId,
        inc: u32,
        job: spill::SpillJob,
    },
}

struct Scheduled {
    at: Instant,
    seq: u64,
    /// Heartbeats: they do not keep a run going (`drive` stops when only these are left).
    background: bool,
    /// Boxed: the queue moves its entries at every push and pop, and events are large.
    event: Box<Event>,
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
    /// How often each object left the store (a reply names its object by id only).
    removals: BTreeMap<ObjectId, u64>,
    /// Between a crash and the restart: what the disk's index held.
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
    /// Fetched copies whose bytes did not hash to the id's digest, summed over nodes.
    pub digest_mismatches: u64,
    /// Publications refused for another content under the id, summed over nodes.
    pub id_conflicts: u64,
    /// Puts of another content under a known id that were accepted (nobody held the id).
    pub reused_ids_accepted: u64,
    /// Puts of another content under a known id refused because live nodes held it.
    pub reused_ids_refused: u64,
    /// Misuses of the client protocol the nodes refused.
    pub misuses_refused: u64,
    /// `Flush`es of clients' unanswered releases that reported no failure.
    pub flushes: u64,
    /// Commits of the simulated disks.
    pub durable_commits: u64,
    /// Index records found torn or corrupt after a crash, and discarded.
    pub torn_records_discarded: u64,
    /// Index writes not synced at a crash that were lost.
    pub unsynced_writes_lost: u64,
    /// Index writes not synced at a crash that landed torn.
    pub unsynced_writes_torn: u64,
    /// READs whose serving the holder's fabric stalled.
    pub serves_stalled: u64,
    /// Revocations that waited for READs being served.
    pub revocations_after_serving: u64,
    /// Directory faults and reconnections.
    pub directory: crate::directory::DirectoryStats,
    /// Spill writes completed (runs with a spill tier).
    pub spill_writes: u64,
    /// Spill writes refused for lack of space or failed with an IO error.
    pub spill_write_failures: u64,
    /// Objects restored from the spill disks with their bytes.
    pub spill_restores: u64,
    /// Restores that found their record damaged or missing, or whose read failed (objects
    /// reported lost).
    pub spill_lost: u64,
    /// Requests holders sent on to a relay, summed over nodes.
    pub relay_redirects: u64,
    /// READs served from a relay's partial copy.
    pub relayed_reads: u64,
    /// Puts with replicas, acknowledgements and repairs (runs with replicas).
    pub replication: ReplicationRunStats,
    /// Fetches of sealed copies made once faults stopped (see `liveness`).
    pub liveness_fetches: u64,
    /// Of those, fetches whose holder dropped the object meanwhile (they prove nothing).
    pub liveness_inconclusive: u64,
    /// READs the requester's fabric refused to post (`ReadError::Busy`, a full event channel).
    pub reads_refused_busy: u64,
    /// Of the lost restores, reads that failed with an IO error.
    pub spill_read_errors: u64,
    /// Evictions on nodes with a spill tier (each checked against what the tier held).
    pub spill_evictions: u64,
    /// Locations the directory pushed to nodes that learn them, summed over nodes.
    pub locations_learned: u64,
    /// Fetches that went straight to remembered holders, summed over nodes.
    pub location_cache_hits: u64,
    /// Remembered locations that proved wrong, summed over nodes.
    pub stale_locations: u64,
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
        self.digest_mismatches += s.digest_mismatches;
        self.id_conflicts += s.id_conflicts;
        self.relay_redirects += s.relay_redirects;
        self.locations_learned += s.locations_learned;
        self.location_cache_hits += s.location_cache_hits;
        self.stale_locations += s.stale_locations;
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
    queue: queue::QuadHeap<Reverse<Scheduled>>,
    seq: u64,
    nodes: Vec<SimNode>,
    network: Network,
    directory: SimDirectory,
    /// A sharded directory's shards after the first (`directory`); none unless sharded.
    shards: Vec<SimDirectory>,
    /// A sharded directory: the shards each node's sessions last reported down, by node (the
    /// core hears one health: down while any shard is).
    shards_down: BTreeMap<NodeId, BTreeSet<usize>>,
    /// Queued events that are not background.
    foreground: u64,
    trace: Trace,
    checker: Checker,
    /// Scripted: the next READs a requester posts fail with a QP error.
    failing_reads: BTreeMap<NodeId, u32>,
    reads_in_flight: u64,
    next_object: u64,
    known_objects: Vec<ObjectId>,
    /// Requests clients sent, all together.
    requests_sent: u64,
    /// Each client's session (node, incarnation, client): its requests awaiting replies, and
    /// what the client does with each reply.
    sessions: BTreeMap<SessionKey, ClientSession<Call>>,
    next_rogue: u64,
    /// The message being delivered: a `WriteLocal` copies its payload from here.
    input: Vec<u8>,
    stats: SimStats,
    /// End-of-run checks done.
    finished: bool,
    /// Planted bugs (none in a real run).
    flaws: Flaws,
    /// Copies (node, incarnation, object) that received damaged bytes (a corruption fault, or
    /// a READ of such a copy while it relayed): what they relay is not checked byte by byte.
    damaged_copies: BTreeSet<(NodeId, u32, ObjectId)>,
    /// Faults of READ serving and of the disks, from their own stream of the seed.
    media: MediaFaults,
    /// READs the requester's fabric refuses to post, from their own stream of the seed.
    refused_reads: RefusedReads,
    /// Directory requests of each node (incarnation) awaiting their answer: the object, and
    /// the digest a publication names.
    dir_ops: BTreeMap<
        (NodeId, u32, DirectoryOpId),
        (ObjectId, Option<skyriver_core::digest::ContentDigest>),
    >,
    /// Publications the directory accepted, of copies still held.
    accepted: BTreeSet<(NodeId, u32, ObjectId)>,
    /// The digest the directory last named to each node for each id.
    last_named: BTreeMap<(NodeId, ObjectId), skyriver_core::digest::ContentDigest>,
    /// The last content variant a client put under a known id.
    next_variant: u32,
    /// The spill disks (`spill`).
    spill: spill::SpillSide,
    /// Puts with replicas and their checks (`replication`).
    replication: replication::ReplicationSide,
    /// The requests of the current drive pass of a holder (see `crowd`).
    pass: crowd::PassChecks,
    /// The cores' view of the directory's member lists, converted once per list.
    member_views: member_views::MemberViews,
    /// Times a client drew a request for the member list (see `clients::MEMBER_LIST_MEMBERS`).
    member_list_draws: u64,
    /// When each node's own consistency is checked next (`node_checks`).
    node_checks: node_checks::NodeChecks,
}

/// The modes of a random run (`skyriver sim --directory-shards K --spill --replicas`). A
/// sharded directory combines with either of the others; spill with replicas builds, but the
/// replica checks do not follow a copy of record onto the spill disk (they take it for lost),
/// so `skyriver sim` refuses that pair. The default is the default run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimModes {
    /// A directory of this many shards, a model of Redis Cluster (see `directory::shard`);
    /// `None` or `Some(1)`: the single head, the same run.
    pub directory_shards: Option<usize>,
    /// A spill tier on every node (see [`spill`]).
    pub spill: bool,
    /// Puts ask for replicas, in failure domains, with at least one crash (see
    /// `replication`).
    pub replicas: bool,
    /// Every node learns where the others' objects are as they are published
    /// (`--learn-locations`): first fetches go to the pushed holder without a lookup.
    pub learn_locations: bool,
}

impl SimModes {
    /// A directory of `shards` shards alone.
    pub fn sharded(shards: usize) -> Self {
        Self {
            directory_shards: Some(shards),
            ..Self::default()
        }
    }

    /// A spill tier on every node alone.
    pub fn spilling() -> Self {
        Self {
            spill: true,
            ..Self::default()
        }
    }

    /// Replicated puts alone.
    pub fn replicating() -> Self {
        Self {
            replicas: true,
            ..Self::default()
        }
    }

    /// Sets the parameters the modes draw, each from a stream of its own (so their order does
    /// not matter, and no mode changes another's draws).
    pub fn apply(&self, seed: u64, params: &mut SimParams) {
        if let Some(shards) = self.directory_shards {
            params.sharding = Some(crate::params::ShardingParams::draw(
                seed,
                shards,
                params.faults_until_us,
                params.detect_us,
            ));
        }
        if self.spill {
            params.spill = Some(spill::SpillParams::draw(seed, params.arena_bytes));
        }
        if self.replicas {
            params.replicas = true;
            params.crashes = params.crashes.max(1);
            let mut domains = ChaCha8Rng::seed_from_u64(seed ^ FAILURE_DOMAIN_STREAM);
            params.failure_domains = domains.gen_range(2..=3);
            if domains.gen_bool(0.5) {
                let domain = domains.gen_range(0..params.failure_domains);
                let at = domains.gen_range(0..params.faults_until_us);
                let down = params.detect_us + domains.gen_range(100..=3_000);
                params.domain_crash = Some((domain, at, down));
            }
        }
        params.learn_locations = self.learn_locations;
    }

    /// The flags of `skyriver sim` that run these modes, each after a space (empty for the
    /// default run).
    pub fn flags(&self) -> String {
        let mut flags = String::new();
        if let Some(shards) = self.directory_shards.filter(|&k| k > 1) {
            flags.push_str(&format!(" --directory-shards {shards}"));
        }
        if self.spill {
            flags.push_str(" --spill");
        }
        if self.replicas {
            flags.push_str(" --replicas");
        }
        if self.learn_locations {
            flags.push_str(" --learn-locations");
        }
        flags
    }
}

const WORKLOAD_CLIENT_BASE: u64 = 1;
/// Mixed into a seed for the failure domains of a run with replicas (a stream of their own).
const FAILURE_DOMAIN_STREAM: u64 = 0x000D_03A1_5EED;

impl Cluster {
    /// Member lists delivered to the cores, and how many of them were converted for the cores
    /// (once per distinct list: the rest shared a conversion).
    pub fn member_lists(&self) -> (u64, u64) {
        (self.member_views.deliveries, self.member_views.conversions)
    }

    /// A cluster for a random run of `seed`; `nodes` overrides the drawn node count.
    pub fn random(seed: u64, nodes: Option<usize>, mode: RunMode) -> Self {
        Self::random_with_flaws(seed, nodes, mode, Flaws::default())
    }

    /// [`Cluster::random`] with planted bugs, for tests that show the checker catches them.
    pub fn random_with_flaws(seed: u64, nodes: Option<usize>, mode: RunMode, flaws: Flaws) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let params = SimParams::draw(seed, &mut rng, nodes);
        Self::build(params, rng, mode, flaws)
    }

    /// [`Cluster::random_with_flaws`] in the modes `modes`, which combine: each draws its
    /// parameters from a stream of its own, so a seed's other parameters stay what they were
    /// and a seed run in one mode alone is the run of that mode's own builder.
    pub fn random_with_modes(
        seed: u64,
        nodes: Option<usize>,
        mode: RunMode,
        flaws: Flaws,
        modes: SimModes,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = SimParams::draw(seed, &mut rng, nodes);
        modes.apply(seed, &mut params);
        Self::build(params, rng, mode, flaws)
    }

    /// Counters of the spill disks.
    pub fn spill_stats(&self) -> spill::SpillRunStats {
        self.spill.stats.clone()
    }

    /// A cluster of `nodes` with fixed parameters, no workload and no random faults, keeping its
    /// trace: for scripted scenarios and golden traces.
    pub fn scripted(nodes: usize) -> Self {
        Self::scripted_with_flaws(nodes, Flaws::default())
    }

    /// [`Cluster::scripted`] with planted bugs, to show a scenario's checks catch them.
    pub fn scripted_with_flaws(nodes: usize, flaws: Flaws) -> Self {
        Self::scripted_with(SimParams::scripted(nodes), flaws)
    }

    /// A scripted cluster (see [`Cluster::scripted`]) with parameters changed from
    /// [`SimParams::scripted`]: a slower link, links that READ data shares.
    pub fn scripted_with(params: SimParams, flaws: Flaws) -> Self {
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
            flaws,
        )
    }

    fn build(params: SimParams, mut rng: ChaCha8Rng, mode: RunMode, flaws: Flaws) -> Self {
        let n = params.nodes;
        // Drawn pair by pair in this order, so a seed's latencies do not depend on the table.
        let mut latency = vec![0; n * n.saturating_sub(1) / 2];
        for a in 0..n {
            for b in a + 1..n {
                let ns = rng.gen_range(params.latency_ns.0..=params.latency_ns.1);
                latency[crate::network::pair_index(NodeId(a as u32), NodeId(b as u32))] = ns;
            }
        }
        let network = Network::new(n, latency, params.bandwidth_bytes_per_sec);
        let mut directory_params = params.directory_params();
        if flaws.placement_ignores_domains {
            directory_params.failure_domains.clear();
        }
        if flaws.no_tombstones {
            directory_params.replication.max_tombstones = 0;
        }
        let sharding = params.sharding.clone().filter(|s| s.shards > 1);
        // Only a shard that fails over keeps what its replica needs (its registry's inputs).
        let replica = |shard: usize| {
            let sharding = sharding.as_ref()?;
            let failovers = sharding.failovers.iter().filter(|f| f.0 == shard).count();
            (failovers > 0).then_some((sharding.replica_lag_us * 1000, failovers as u32))
        };
        let mut shards = Vec::new();
        let mut shard_effects = Vec::new();
        for (i, latency_ns) in sharding
            .iter()
            .flat_map(|s| s.latency_ns.iter())
            .enumerate()
        {
            let mut params = directory_params.clone();
            params.latency_ns = *latency_ns;
            params.replica = replica(i + 1);
            let (shard, effects) = SimDirectory::formed(params, n, Instant::ZERO);
            shards.push(shard);
            shard_effects.push(effects);
        }
        directory_params.replica = replica(0);
        let (mut directory, directory_effects) =
            SimDirectory::formed(directory_params, n, Instant::ZERO);
        for shard in std::iter::once(&mut directory).chain(shards.iter_mut()) {
            shard.unguarded_restarts = flaws.unguarded_head_restarts;
            shard.forgets_subscriptions = flaws.registry_forgets_subscriptions;
            shard.set_transparent_failovers(flaws.transparent_shard_failovers);
        }
        let mut cluster = Cluster {
            mode,
            now: Instant::ZERO,
            queue: queue::QuadHeap::new(),
            seq: 0,
            nodes: Vec::new(),
            network,
            directory,
            shards,
            shards_down: BTreeMap::new(),
            foreground: 0,
            trace: Trace::new(mode.keep_trace, mode.echo_trace),
            checker: Checker::default(),
            failing_reads: BTreeMap::new(),
            reads_in_flight: 0,
            next_object: 1,
            known_objects: Vec::new(),
            requests_sent: 0,
            sessions: BTreeMap::new(),
            next_rogue: 0,
            input: Vec::new(),
            stats: SimStats::default(),
            finished: false,
            flaws,
            damaged_copies: BTreeSet::new(),
            media: if mode.faults {
                MediaFaults::draw(params.seed)
            } else {
                MediaFaults::none()
            },
            refused_reads: if mode.faults {
                RefusedReads::draw(params.seed)
            } else {
                RefusedReads::none()
            },
            dir_ops: BTreeMap::new(),
            accepted: BTreeSet::new(),
            last_named: BTreeMap::new(),
            next_variant: 0,
            spill: spill::SpillSide {
                params: params.spill,
                ..Default::default()
            },
            replication: replication::ReplicationSide::new(params.replicas),
            pass: crowd::PassChecks::default(),
            member_views: Default::default(),
            member_list_draws: 0,
            node_checks: Default::default(),
            params,
            rng,
        };
        cluster.apply_directory(directory_effects);
        for (i, effects) in shard_effects.into_iter().enumerate() {
            cluster.apply_shard(i + 1, effects);
        }
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
                disk: Disk::new(cluster.params.arena_bytes),
                acked_seals: BTreeSet::new(),
                removals: BTreeMap::new(),
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
        // Objects of a few slices already flow through relays when fetched together.
        config.relay_min_bytes = 2 * p.read_slice_bytes;
        config.replication_fetch_timeout = replication::replication_fetch_timeout(p);
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
        // A lost link is re-dialled within a few reconnection times (`dial` below): a fetch
        // waits about that long for its holders' links, as the daemon's 5 s cover its ~1 s.
        config.holder_link_wait = Duration::from_micros(p.reconnect_us * 4);
        // Every node records durable changes for its simulated disk; in persistent mode the
        // disk also survives a crash.
        config.store.record_durable_changes = true;
        config.hold_replies_until_durable = p.hold_replies_until_durable;
        // Dialing on the simulator's time scale: a missing connection is dialed again about
        // as often as a broken one is noticed, backing off to a few reconnection times.
        config.dial = DialPolicy {
            interval: Duration::from_micros(p.reconnect_us),
            first_backoff: Duration::from_micros(p.detect_us),
            max_backoff: Duration::from_micros(p.reconnect_us * 4),
        };
        config.store.hash_seed = p.seed ^ ((node.0 as u64) << 32) ^ inc as u64;
        config.store.spill_limit_bytes = p.spill.map(|s| {
            if self.flaws.spill_evicts_with_room {
                s.limit_bytes / 4 // planted: a quarter of the configured limit
            } else {
                s.limit_bytes
            }
        });
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
            let _ = node.handle(self.now, NodeInput::PeerConnected { peer: b, params });
        }
        self.after_input(a);
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
            event: Box::new(event),
        }));
    }

    fn schedule_us(&mut self, at_us: u64, event: Event) {
        self.schedule(Instant(at_us * 1000), event);
    }

    fn after(&self, ns: u64) -> Instant {
        Instant(self.now.0 + ns)
    }

    /// Gives node `n` (alive) one input at the current time, then carries out its outputs.
    fn feed(&mut self, n: NodeId, input: NodeInput<'_>) {
        self.spill_input(&input);
        let now = self.now;
        let _ = self.nodes[n.0 as usize]
            .node
            .as_mut()
            .expect("alive")
            .handle(now, input);
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

    /// [`Cluster::record`] of a line formatted straight into the trace's buffer: for the lines
    /// of every message sent and delivered, the most frequent.
    fn record_args(&mut self, text: std::fmt::Arguments<'_>) {
        self.trace.record_args(self.now, text);
    }

    /// Drives a node until idle (the core's drive loop), then reschedules its timer.
    fn after_input(&mut self, n: NodeId) {
        if self.nodes[n.0 as usize].node.is_none() {
            return;
        }
        let now = self.now;
        let next = drive_host(&mut SimDriver { cluster: self, n }, now);
        self.check_spill_evictions(n);
        let inc = self.nodes[n.0 as usize].inc;
        let sim_node = &mut self.nodes[n.0 as usize];
        let node = sim_node.node.as_ref().expect("alive");
        self.node_checks
            .after_input(n, node, self.params.location_cache_entries);
        if let Some(at) = next {
            if sim_node.timer_at.is_none_or(|t| at < t) {
                sim_node.timer_at = Some(at);
                self.schedule(at, Event::Timer { node: n, inc });
            }
        }
    }

    /// A node's directory request goes to its directory session.
    fn send_to_directory(&mut self, n: NodeId, op: DirectoryOpId, request: DirectoryRequest) {
        let request = self.directory_request(n, op, request);
        self.record_args(format_args!("{n} -> directory {op} {request}"));
        let shard = self.shard_of(request_object(&request));
        let now = self.now;
        let effects = self.shard_mut(shard).submit(now, n, op, request);
        self.apply_shard(shard, effects);
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
        match wire::decode(&bytes) {
            Ok(message) => {
                if self.flaws.holders_deny_some_ids {
                    if let Some(denial) = liveness::denial(&message) {
                        self.record(|| format!("{from} -> {to} {message}, denied by the flaw"));
                        return self.transmit(to, from, denial);
                    }
                }
                self.record_args(format_args!("{from} -> {to} {message}"));
            }
            Err(error) => self.record_args(format_args!("{from} -> {to} undecodable: {error}")),
        }
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
        self.apply_shard(0, effects);
    }

    /// The number of the directory's shards (1: unsharded).
    pub fn directory_shards(&self) -> usize {
        1 + self.shards.len()
    }

    /// The shard holding `id`'s records.
    fn shard_of(&self, id: &ObjectId) -> usize {
        if self.shards.is_empty() {
            0
        } else {
            crate::directory::shard::shard_of(id, self.directory_shards())
        }
    }

    fn shard_mut(&mut self, shard: usize) -> &mut SimDirectory {
        match shard {
            0 => &mut self.directory,
            s => &mut self.shards[s - 1],
        }
    }

    /// Every shard of the directory, shard 0 first.
    fn all_shards(&self) -> impl Iterator<Item = &SimDirectory> {
        std::iter::once(&self.directory).chain(self.shards.iter())
    }

    /// The registry holding `id`'s records, when its shard is up.
    pub(super) fn registry_of(&self, id: &ObjectId) -> Option<&skyriver_core::registry::Registry> {
        self.all_shards().nth(self.shard_of(id))?.registry()
    }

    /// What a core hears of a notice of shard `shard`'s session: a sharded directory is one
    /// directory to it. The member list is shard 0's; the health is down while any shard is
    /// (down as the first goes down, up again as the last comes back; every other change is
    /// not heard).
    fn one_directory_notice(
        &mut self,
        shard: usize,
        node: NodeId,
        notice: DirectoryNotice,
    ) -> Option<DirectoryNotice> {
        if self.shards.is_empty() {
            return Some(notice);
        }
        let down = self.shards_down.entry(node).or_default();
        match &notice {
            DirectoryNotice::Members(_) if shard != 0 => None,
            DirectoryNotice::Health(Err(_)) => {
                let first = down.is_empty();
                down.insert(shard);
                first.then_some(notice)
            }
            DirectoryNotice::Health(Ok(())) => {
                let was_down = down.remove(&shard);
                (down.is_empty() && (was_down || shard == 0)).then_some(notice)
            }
            _ => Some(notice),
        }
    }

    /// Schedules what shard `shard` of the directory asked for.
    fn apply_shard(&mut self, shard: usize, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Schedule {
                    at,
                    event,
                    background,
                } => {
                    let event = if shard == 0 {
                        Event::Directory(event)
                    } else {
                        Event::DirectoryShard { shard, event }
                    };
                    self.schedule_as(at, event, background)
                }
                Effect::Notice { node, inc, notice } => self.schedule(
                    self.now,
                    Event::DirectoryNotice {
                        shard,
                        to: node,
                        inc,
                        notice,
                    },
                ),
                Effect::Trace(line) if self.shards.is_empty() => self.record(|| line),
                Effect::Trace(line) => self.record(|| format!("shard {shard}: {line}")),
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
            let next_at = self.queue.peek().map(|Reverse(next)| next.at);
            let out_of_time = next_at.is_none_or(|at| at > deadline);
            // Convergence compares every member list with the registry's (N² at N nodes): it
            // is asked only when its answer decides something.
            if self.foreground == 0 || out_of_time {
                let live: Vec<(NodeId, u32)> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].node.is_some())
                    .map(|i| (NodeId(i as u32), self.nodes[i].inc))
                    .collect();
                let converged = self
                    .all_shards()
                    .enumerate()
                    .map(|(i, shard)| {
                        shard
                            .converged(&live)
                            .map_err(|what| match self.shards.is_empty() {
                                true => what,
                                false => format!("shard {i}: {what}"),
                            })
                    })
                    .find(Result::is_err)
                    .unwrap_or(Ok(()));
                if converged.is_ok() && self.foreground == 0 {
                    return;
                }
                if let Err(what) = converged {
                    if !out_of_time {
                        self.step();
                        continue;
                    }
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
        let mut stats = crate::directory::DirectoryStats::default();
        for shard in self.all_shards() {
            stats.add(&shard.stats);
        }
        stats
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

/// Ids separated by commas, as a trace line lists them.
struct IdList<'a>(&'a [ObjectId]);

impl std::fmt::Display for IdList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, id) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{id}")?;
        }
        Ok(())
    }
}

/// The object a directory request is about.
fn request_object(request: &DirectoryRequest) -> &ObjectId {
    match request {
        DirectoryRequest::Lookup { id, .. }
        | DirectoryRequest::Publish { id, .. }
        | DirectoryRequest::Withdraw { id }
        | DirectoryRequest::Unsubscribe { id }
        | DirectoryRequest::PublishReplicated { id, .. }
        | DirectoryRequest::DeleteEverywhere { id }
        | DirectoryRequest::DeclineReplica { id }
        | DirectoryRequest::LocateCopies { id } => id,
    }
}
