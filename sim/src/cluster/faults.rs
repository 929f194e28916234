//! Faults: the random plan drawn from the seed (crashes, partitions, slow windows, QP errors
//! and directory faults are scheduled up front), and what a crash, a restart or a broken link
//! does to the nodes and the network. [`MediaFaults`] draw what the holder's fabric and the
//! disks do wrong: READs whose serving stalls, index writes lost or torn at a crash.

use skyriver_core::digest::ContentDigest;
use skyriver_core::persist::WriteFate;
use skyriver_core::store::recovery::RecoveryRefusal;

use super::*;

/// Faults of the media under the core: the fabric that serves READs and the disk that holds
/// the index. Drawn from their own stream of the seed, so every other draw of a seed stays
/// what it was before they existed.
#[derive(Debug)]
pub(super) struct MediaFaults {
    rng: ChaCha8Rng,
    /// Probability (per million) that the holder's fabric stalls while serving a READ (a TCP
    /// writer blocked on a full socket, a NIC retrying), while faults are on.
    serve_stall_ppm: u32,
    /// Longest such stall, µs.
    serve_stall_max_us: u64,
    /// Of the index writes not synced at a crash: probability (per million) that one is lost,
    /// and that one lands torn (a prefix of it); the rest land whole.
    lost_write_ppm: u32,
    torn_write_ppm: u32,
}

/// Mixed into the seed for the media's stream.
const MEDIA_STREAM: u64 = 0x6d65_6469_615f_6661;

impl MediaFaults {
    /// The faults of a random run of `seed`.
    pub(super) fn draw(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ MEDIA_STREAM);
        let serve_stall_ppm = if rng.gen_bool(0.5) {
            rng.gen_range(5_000..=100_000)
        } else {
            0
        };
        let serve_stall_max_us = rng.gen_range(500..=10_000);
        let lost_write_ppm = rng.gen_range(0..=600_000);
        let torn_write_ppm = rng.gen_range(0..=1_000_000 - lost_write_ppm);
        MediaFaults {
            rng,
            serve_stall_ppm,
            serve_stall_max_us,
            lost_write_ppm,
            torn_write_ppm,
        }
    }

    /// No stalls; at a crash, every unsynced write is lost.
    pub(super) fn none() -> Self {
        MediaFaults {
            rng: ChaCha8Rng::seed_from_u64(MEDIA_STREAM),
            serve_stall_ppm: 0,
            serve_stall_max_us: 0,
            lost_write_ppm: 1_000_000,
            torn_write_ppm: 0,
        }
    }

    /// How long the holder's fabric stalls serving the READ just admitted, if it does.
    pub(super) fn serve_stall_ns(&mut self, faults_on: bool) -> Option<u64> {
        if !faults_on || self.serve_stall_ppm == 0 {
            return None;
        }
        if self.rng.gen_range(0..1_000_000) >= self.serve_stall_ppm {
            return None;
        }
        Some(self.rng.gen_range(1..=self.serve_stall_max_us) * 1000)
    }

    /// What became of an index write of `len` bytes not synced at a crash.
    pub(super) fn write_fate(&mut self, len: usize) -> WriteFate {
        let draw = self.rng.gen_range(0..1_000_000);
        if draw < self.lost_write_ppm {
            WriteFate::Lost
        } else if draw < self.lost_write_ppm + self.torn_write_ppm && len > 1 {
            WriteFate::Torn {
                landed_bytes: self.rng.gen_range(1..len),
            }
        } else {
            WriteFate::Landed
        }
    }
}

/// The requester's own fabric refusing to post a READ: its event channel full (the daemon
/// then feeds the node `ReadError::Busy` at once, and the fetch moves on by the core's rules).
/// Drawn from their own stream of the seed, so every other draw stays what it was.
#[derive(Debug)]
pub(super) struct RefusedReads {
    rng: ChaCha8Rng,
    /// Probability (per million) that a READ is refused at its post, while faults are on.
    busy_ppm: u32,
}

/// Mixed into the seed for the refusals' stream.
const REFUSAL_STREAM: u64 = 0x7265_6675_7365_645f;

/// The event channel's capacity a refusal names (the daemon's is 1,024 events).
pub(super) const EVENT_CHANNEL_CAPACITY: u64 = 1024;

impl RefusedReads {
    /// The refusals of a random run of `seed`: in about a third of the seeds.
    pub(super) fn draw(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ REFUSAL_STREAM);
        let busy_ppm = if rng.gen_bool(0.35) {
            rng.gen_range(5_000..=80_000)
        } else {
            0
        };
        RefusedReads { rng, busy_ppm }
    }

    /// No refusals.
    pub(super) fn none() -> Self {
        RefusedReads {
            rng: ChaCha8Rng::seed_from_u64(REFUSAL_STREAM),
            busy_ppm: 0,
        }
    }

    /// Whether the fabric refuses the READ being posted.
    pub(super) fn refuses(&mut self, faults_on: bool) -> bool {
        faults_on && self.busy_ppm > 0 && self.rng.gen_range(0..1_000_000) < self.busy_ppm
    }
}

impl Cluster {
    pub(super) fn plan_faults(&mut self) {
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
        if let Some(sharding) = &p.sharding {
            // Drawn apart from the rest (see `ShardingParams::draw`).
            for &(shard, at, down) in &sharding.failovers {
                let failover = |up| Event::DirectoryShard {
                    shard,
                    event: DirEvent::Failover { up },
                };
                self.schedule_us(at, failover(false));
                self.schedule_us(at + down, failover(true));
            }
        }
        if let Some((domain, at, down)) = p.domain_crash {
            // Every node of the domain at once (what a rack's power or switch does).
            for node in (0..n).filter(|node| node % p.failure_domains.max(1) == domain) {
                self.schedule_us(at, Event::Crash { node: NodeId(node) });
                self.schedule_us(at + down, Event::Restart { node: NodeId(node) });
            }
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

    pub(super) fn crash_node(&mut self, n: NodeId) {
        if self.nodes[n.0 as usize].node.is_none() {
            return;
        }
        self.record(|| format!("FAULT crash {n}"));
        self.stats.crashes += 1;
        self.spill_crash(n);
        if let Some(node) = self.nodes[n.0 as usize].node.take() {
            self.node_checks.settle(n, &node);
            self.stats.absorb(&node);
        }
        if self.params.persistent {
            // What the disk holds survives; what was still on its way to it is lost.
            let durable = self.durable_at_crash(n);
            self.nodes[n.0 as usize].recovering = durable;
        } else {
            self.nodes[n.0 as usize].disk = Disk::new(self.params.arena_bytes);
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
        self.forget_accepted(n, None);
        self.sessions.retain(|(node, ..), _| *node != n);
        for m in 0..self.nodes.len() as u32 {
            if NodeId(m) != n {
                self.break_link(n, NodeId(m));
            }
        }
        // A crashed process's connection to the head resets; a crashed host's goes silent.
        let silent = self.mode.faults && self.rng.gen_bool(0.5);
        let effects = self.directory.node_crashed(self.now, n, silent);
        self.apply_directory(effects);
        for shard in 1..self.directory_shards() {
            let now = self.now;
            let effects = self.shard_mut(shard).node_crashed(now, n, silent);
            self.apply_shard(shard, effects);
        }
    }

    pub(super) fn count_reads_of(&self, n: NodeId, inc: u32) -> u64 {
        self.queue
            .iter()
            .filter(|Reverse(s)| match &*s.event {
                Event::ReadServe { read, .. }
                | Event::ReadServed { read, .. }
                | Event::ReadComplete { read, .. } => read.posted_by(n, inc),
                _ => false,
            })
            .count() as u64
    }

    pub(super) fn restart_node(&mut self, n: NodeId) {
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
        let mut refused = Vec::new();
        if !durable.is_empty() {
            // The driver hashes what it finds, as the daemon does.
            let memory = &self.nodes[n.0 as usize].memory;
            let with_digests = durable
                .iter()
                .map(|record| {
                    let region = LocalRegion {
                        len: record.data_size + record.metadata_size,
                        ..record.block
                    };
                    let digest = ContentDigest::of_contiguous(&memory.read(region));
                    (*record, digest)
                })
                .collect();
            let objects = with_digests;
            let Handled::Recovered(report) =
                node.handle(self.now, NodeInput::Recovered { objects })
            else {
                unreachable!("recovered objects are answered with a report")
            };
            // Records come newest first, so an older record of an id sealed again is refused
            // as a duplicate: the removal that cleared it was not synced, the newer seal was
            // (or landed). Any other refusal means a record lied.
            let lying: Vec<_> = report
                .refused
                .iter()
                .filter(|r| r.reason != RecoveryRefusal::DuplicateId)
                .collect();
            if !lying.is_empty() {
                let what = format!("{n} refused recovered objects: {lying:?}");
                self.checker.violation(self.now, what);
            }
            refused.extend(report.refused.iter().map(|r| r.index));
        }
        if self.params.persistent {
            self.recover_spilled(n, &mut node);
            self.finish_disk_recovery(n, refused);
        }
        self.nodes[n.0 as usize].node = Some(node);
        self.check_recovered(n, &durable);
        let effects = self.directory.node_started(self.now, n, inc);
        self.apply_directory(effects);
        self.shards_down.remove(&n);
        for shard in 1..self.directory_shards() {
            let now = self.now;
            let effects = self.shard_mut(shard).node_started(now, n, inc);
            self.apply_shard(shard, effects);
        }
        // Recovered objects are published like fresh seals. Connections come back as the
        // nodes dial (the higher id of each pair, once the membership lists both).
        self.after_input(n);
        self.connect_clients(n);
        if self.mode.workload {
            self.start_clients(n);
        }
    }

    pub(super) fn break_link(&mut self, a: NodeId, b: NodeId) {
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

    /// Node `n` dials `peer` at `address` (its core's `Connect`): a connection already up or
    /// being set up stays as it is; one to a live peer across no partition comes up like a
    /// restored link; otherwise the dial fails after the fabric's detection time.
    pub(super) fn dial(&mut self, n: NodeId, peer: NodeId, address: std::net::SocketAddr) {
        if address != crate::directory::fabric_addr(peer) {
            let what = format!("{n} dials {peer} at {address}, where it does not listen");
            self.checker.violation(self.now, what);
        }
        if self.network.connection(n, peer).up {
            return;
        }
        let reachable =
            self.nodes[peer.0 as usize].node.is_some() && !self.network.partitioned(n, peer);
        if reachable {
            self.record(|| format!("{n} dials {peer}"));
            self.restore_link(n, peer);
        } else {
            self.record(|| format!("{n} dials {peer}: unreachable"));
            let inc = self.nodes[n.0 as usize].inc;
            let at = self.after(self.params.detect_us * 1000);
            self.schedule(at, Event::PeerLost { node: n, inc, peer });
        }
    }

    pub(super) fn restore_link(&mut self, a: NodeId, b: NodeId) {
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
