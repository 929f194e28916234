//! The nemesis's schedule: which fault, on which node, when and for how long, drawn from the
//! run's seed alone (a SplitMix64 stream, fixed forever), so a seed names one schedule and a
//! failing run can be replayed fault for fault.

use serde::Serialize;

/// Faults the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL of a daemon, restarted at the end with the same flags (a persistent daemon
    /// keeps its `--backing-file`, so its files survive).
    KillRestart,
    /// SIGKILL of a persistent daemon, restarted without its files (they are deleted): the
    /// node comes back empty, as after a lost disk.
    KillRestartWiped,
    /// SIGSTOP for longer than leases and heartbeats, then SIGCONT.
    Pause,
    /// SIGKILL of node 0, the built-in directory's head, then restart.
    HeadKillRestart,
    /// The node's link down (`ip link set … down`), then up.
    LinkDown,
    /// The node can no longer send to one peer (a blackhole route in its namespace); the peer
    /// still reaches it.
    OneWayCut,
    /// The node's link throttled to 1 Mbit/s each way (`tc tbf`).
    Throttle,
    /// The persistent daemon's file system (a small tmpfs) filled up, then emptied.
    DiskFull,
    /// A client process killed mid-put or mid-fetch.
    ClientKill,
    /// SIGKILL of a master of the run's Redis Cluster (`--directory redis-cluster`): its
    /// replica takes over; at the end it is restarted and rejoins as a replica. The fault's
    /// `node` says which master (in port order), not a daemon.
    RedisMasterKill,
}

impl FaultKind {
    /// Every kind, in summary order.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillRestart,
        FaultKind::KillRestartWiped,
        FaultKind::Pause,
        FaultKind::HeadKillRestart,
        FaultKind::LinkDown,
        FaultKind::OneWayCut,
        FaultKind::Throttle,
        FaultKind::DiskFull,
        FaultKind::ClientKill,
        FaultKind::RedisMasterKill,
    ];

    /// The name used in summaries and JSON.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillRestart => "kill_restart",
            FaultKind::KillRestartWiped => "kill_restart_wiped",
            FaultKind::Pause => "pause",
            FaultKind::HeadKillRestart => "head_kill_restart",
            FaultKind::LinkDown => "link_down",
            FaultKind::OneWayCut => "one_way_cut",
            FaultKind::Throttle => "throttle",
            FaultKind::DiskFull => "disk_full",
            FaultKind::ClientKill => "client_kill",
            FaultKind::RedisMasterKill => "redis_master_kill",
        }
    }

    /// Whether the kind applies to a run with these settings.
    fn applies(self, params: &ScheduleParams) -> bool {
        let ScheduleParams {
            persistent,
            builtin_head,
            nodes,
            redis_cluster,
            verbs,
            ..
        } = *params;
        if verbs && super::fabric::left_out_on_verbs(self).is_some() {
            return false;
        }
        match self {
            FaultKind::KillRestartWiped | FaultKind::DiskFull => persistent,
            FaultKind::HeadKillRestart => builtin_head,
            FaultKind::RedisMasterKill => redis_cluster,
            FaultKind::OneWayCut => nodes >= 2,
            _ => true,
        }
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fault {
    /// When it starts, milliseconds after the workload started.
    pub at_ms: u64,
    /// How long it lasts before it is healed (the restart, SIGCONT, link up…).
    pub duration_ms: u64,
    /// What it is.
    pub kind: FaultKind,
    /// The node it hits.
    pub node: u32,
    /// The peer a one-way cut stops the node sending to.
    pub peer: Option<u32>,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = if self.kind == FaultKind::RedisMasterKill {
            "master"
        } else {
            "node"
        };
        write!(
            f,
            "{:>7.1}s  {:<18} {target}-{}",
            self.at_ms as f64 / 1000.0,
            self.kind.name(),
            self.node
        )?;
        if let Some(peer) = self.peer {
            write!(f, " -/-> node-{peer}")?;
        }
        write!(f, " for {:.1}s", self.duration_ms as f64 / 1000.0)
    }
}

/// What a schedule is drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ScheduleParams {
    /// The run's seed.
    pub seed: u64,
    /// Nodes in the cluster.
    pub nodes: u32,
    /// Length of the workload, seconds.
    pub seconds: u64,
    /// Whether the daemons are persistent.
    pub persistent: bool,
    /// Whether node 0 serves the built-in directory (head kills apply).
    pub builtin_head: bool,
    /// Whether a third of the faults get a second, overlapping one (see [`Schedule::draw`]).
    pub overlap: bool,
    /// Whether the directory is a Redis Cluster of the run's own (master kills apply).
    pub redis_cluster: bool,
    /// Whether the daemons use the verbs fabric (the link faults are left out: see
    /// `super::fabric::VERBS_LEFT_OUT`).
    pub verbs: bool,
}

/// The faults of one run, all healed before the quiet end of the run: one at a time, or with
/// `overlap` at most two at once on different nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Schedule {
    /// What it was drawn for.
    pub params: ScheduleParams,
    /// The faults, in time order of their starts.
    pub faults: Vec<Fault>,
}

/// Faults start no earlier than this, so the workload has objects to lose.
const FIRST_FAULT_MS: u64 = 2_000;
/// The last fault is healed this long before the workload ends.
const QUIET_END_MS: u64 = 4_000;
/// Shortest and longest fault.
const FAULT_MS: (u64, u64) = (1_500, 6_000);
/// A pause outlasts the directory's heartbeat timeout (5 s) and the chaos lease (2 s).
const PAUSE_MS: (u64, u64) = (6_000, 8_000);
/// Gap between one fault's heal and the next fault.
const GAP_MS: (u64, u64) = (500, 3_000);
/// Kinds a second, overlapping fault may be: never a head kill, wipe, full disk or client
/// kill, so what the checker guarantees under one fault still holds of the nodes spared.
const OVERLAP_KINDS: [FaultKind; 5] = [
    FaultKind::KillRestart,
    FaultKind::Pause,
    FaultKind::LinkDown,
    FaultKind::OneWayCut,
    FaultKind::Throttle,
];

impl Schedule {
    /// The schedule `params.seed` names. With `params.overlap` (and 3 nodes or more), a third
    /// of the faults get a second one starting within the first half of the first: of an
    /// [`OVERLAP_KINDS`] kind, on another node than the first's (and its peer's), never on
    /// node 0 (the built-in directory's). Without it the stream draws nothing more, so a seed
    /// names the same schedule as before overlaps existed.
    pub fn draw(params: ScheduleParams) -> Self {
        let mut rng = SplitMix64::new(params.seed ^ 0x6368_616f_735f_7363);
        let kinds: Vec<FaultKind> = FaultKind::ALL
            .into_iter()
            .filter(|k| k.applies(&params))
            .collect();
        let end_ms = (params.seconds * 1000).saturating_sub(QUIET_END_MS);
        let mut faults = Vec::new();
        let mut at_ms = FIRST_FAULT_MS;
        loop {
            let kind = kinds[rng.below(kinds.len() as u64) as usize];
            let (low, high) = match kind {
                FaultKind::Pause => PAUSE_MS,
                FaultKind::ClientKill => (200, 600),
                _ => FAULT_MS,
            };
            let duration_ms = rng.between(low, high);
            if at_ms + duration_ms > end_ms {
                break;
            }
            let node = match kind {
                FaultKind::HeadKillRestart => 0,
                FaultKind::RedisMasterKill => {
                    rng.below(u64::from(super::redis_cluster::MASTERS)) as u32
                }
                // Node 0 is only killed as the head, where the kind says so.
                FaultKind::KillRestart | FaultKind::KillRestartWiped if params.nodes > 1 => {
                    1 + rng.below(u64::from(params.nodes) - 1) as u32
                }
                _ => rng.below(u64::from(params.nodes)) as u32,
            };
            let peer = (kind == FaultKind::OneWayCut).then(|| {
                let other = rng.below(u64::from(params.nodes) - 1) as u32;
                if other >= node {
                    other + 1
                } else {
                    other
                }
            });
            let first = Fault {
                at_ms,
                duration_ms,
                kind,
                node,
                peer,
            };
            let mut free_from = at_ms + duration_ms;
            if params.overlap && params.nodes >= 3 && rng.below(3) == 0 {
                if let Some(second) = Self::overlapping(&mut rng, &params, &first, end_ms) {
                    free_from = free_from.max(second.at_ms + second.duration_ms);
                    faults.push(first);
                    faults.push(second);
                } else {
                    faults.push(first);
                }
            } else {
                faults.push(first);
            }
            at_ms = free_from + rng.between(GAP_MS.0, GAP_MS.1);
        }
        Self { params, faults }
    }

    /// A second fault during `first`, if one fits (see [`Schedule::draw`]).
    fn overlapping(
        rng: &mut SplitMix64,
        params: &ScheduleParams,
        first: &Fault,
        end_ms: u64,
    ) -> Option<Fault> {
        let candidates: Vec<u32> = (1..params.nodes)
            .filter(|&n| n != first.node && Some(n) != first.peer)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let node = candidates[rng.below(candidates.len() as u64) as usize];
        // All of them on TCP (so its schedules stay what they were), fewer on verbs.
        let kinds: Vec<FaultKind> = OVERLAP_KINDS
            .into_iter()
            .filter(|k| k.applies(params))
            .collect();
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let (low, high) = match kind {
            FaultKind::Pause => PAUSE_MS,
            _ => FAULT_MS,
        };
        let duration_ms = rng.between(low, high);
        let at_ms = first.at_ms + rng.between(0, first.duration_ms / 2);
        let peer = (kind == FaultKind::OneWayCut).then(|| {
            let other = rng.below(u64::from(params.nodes) - 1) as u32;
            if other >= node {
                other + 1
            } else {
                other
            }
        });
        (at_ms + duration_ms <= end_ms).then_some(Fault {
            at_ms,
            duration_ms,
            kind,
            node,
            peer,
        })
    }

    /// The command that runs this schedule again.
    pub fn replay_command(&self, directory: Option<&str>) -> String {
        let mut command = format!(
            "skyriver chaos --nodes {} --seconds {} --seed {}",
            self.params.nodes, self.params.seconds, self.params.seed
        );
        if self.params.persistent {
            command.push_str(" --persistent");
        }
        if self.params.overlap {
            command.push_str(" --overlap");
        }
        if self.params.verbs {
            command.push_str(" --fabric verbs");
        }
        if let Some(directory) = directory {
            command.push_str(&format!(" --directory {directory}"));
        }
        command
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "schedule of seed {} ({} nodes, {} s, {}): {} faults",
            self.params.seed,
            self.params.nodes,
            self.params.seconds,
            if self.params.persistent {
                "persistent"
            } else {
                "in memory"
            },
            self.faults.len()
        )?;
        for fault in &self.faults {
            writeln!(f, "  {fault}")?;
        }
        Ok(())
    }
}

/// SplitMix64: a small generator whose stream is fixed by its definition, so a seed means the
/// same schedule in every build.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range");
        self.next_u64() % bound
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64, persistent: bool) -> ScheduleParams {
        ScheduleParams {
            seed,
            nodes: 5,
            seconds: 120,
            persistent,
            builtin_head: true,
            overlap: false,
            redis_cluster: false,
            verbs: false,
        }
    }

    #[test]
    fn a_seed_names_one_schedule_and_other_seeds_others() {
        let one = Schedule::draw(params(7, true));
        assert_eq!(one, Schedule::draw(params(7, true)));
        assert_eq!(one.to_string(), Schedule::draw(params(7, true)).to_string());
        assert_ne!(one.faults, Schedule::draw(params(8, true)).faults);
        assert!(one.faults.len() >= 10, "{one}");
    }

    #[test]
    fn faults_do_not_overlap_end_before_the_quiet_end_and_fit_the_mode() {
        for seed in 0..50 {
            for persistent in [false, true] {
                let schedule = Schedule::draw(params(seed, persistent));
                let mut free_from = 0;
                for fault in &schedule.faults {
                    assert!(fault.at_ms >= free_from, "{schedule}");
                    free_from = fault.at_ms + fault.duration_ms;
                    assert!(fault.node < 5);
                    assert_ne!(fault.peer, Some(fault.node));
                    if !persistent {
                        assert!(!matches!(
                            fault.kind,
                            FaultKind::DiskFull | FaultKind::KillRestartWiped
                        ));
                    }
                }
                assert!(free_from <= 120_000 - QUIET_END_MS);
            }
        }
    }

    #[test]
    fn overlapping_faults_are_two_at_most_on_distinct_nodes_and_spare_node_0() {
        let mut overlaps = 0;
        for seed in 0..50 {
            for persistent in [false, true] {
                let schedule = Schedule::draw(ScheduleParams {
                    overlap: true,
                    ..params(seed, persistent)
                });
                for (i, fault) in schedule.faults.iter().enumerate() {
                    assert!(fault.at_ms + fault.duration_ms <= 120_000 - QUIET_END_MS);
                    let during: Vec<&Fault> = schedule.faults[..i]
                        .iter()
                        .filter(|f| f.at_ms + f.duration_ms > fault.at_ms)
                        .collect();
                    assert!(during.len() <= 1, "{schedule}");
                    if let Some(first) = during.first() {
                        overlaps += 1;
                        assert!(OVERLAP_KINDS.contains(&fault.kind), "{schedule}");
                        assert_ne!(fault.node, 0, "{schedule}");
                        assert_ne!(fault.node, first.node, "{schedule}");
                        assert_ne!(Some(fault.node), first.peer, "{schedule}");
                    }
                }
            }
        }
        assert!(overlaps > 50, "{overlaps} overlaps in 100 schedules");
    }

    #[test]
    fn master_kills_come_only_with_a_redis_cluster_of_the_runs_own() {
        let redis = |seed| ScheduleParams {
            nodes: 3,
            seconds: 30,
            builtin_head: false,
            redis_cluster: true,
            ..params(seed, false)
        };
        for seed in 0..50 {
            let kinds = |p| {
                Schedule::draw(p)
                    .faults
                    .iter()
                    .map(|f| f.kind)
                    .collect::<Vec<_>>()
            };
            assert!(!kinds(params(seed, true)).contains(&FaultKind::RedisMasterKill));
            let with_redis = Schedule::draw(redis(seed));
            for fault in &with_redis.faults {
                assert_ne!(fault.kind, FaultKind::HeadKillRestart);
                if fault.kind == FaultKind::RedisMasterKill {
                    assert!(fault.node < super::super::redis_cluster::MASTERS);
                }
            }
        }
        // The seed tests/chaos.rs runs for 30 s kills a master.
        let schedule = Schedule::draw(redis(REDIS_TEST_SEED));
        assert!(
            schedule
                .faults
                .iter()
                .any(|f| f.kind == FaultKind::RedisMasterKill),
            "{schedule}"
        );
        assert!(schedule
            .replay_command(Some("redis-cluster"))
            .ends_with("--directory redis-cluster"));
    }

    #[test]
    fn verbs_schedules_leave_the_link_faults_out_and_replay_on_verbs() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..50 {
            for (persistent, overlap) in [(false, false), (true, true)] {
                let schedule = Schedule::draw(ScheduleParams {
                    verbs: true,
                    overlap,
                    ..params(seed, persistent)
                });
                for fault in &schedule.faults {
                    assert!(
                        !super::super::fabric::VERBS_LEFT_OUT.contains(&fault.kind),
                        "{schedule}"
                    );
                    kinds.insert(fault.kind);
                }
                assert!(schedule.replay_command(None).ends_with(" --fabric verbs"));
            }
        }
        // Everything else still comes.
        for kind in [
            FaultKind::KillRestart,
            FaultKind::KillRestartWiped,
            FaultKind::Pause,
            FaultKind::HeadKillRestart,
            FaultKind::DiskFull,
            FaultKind::ClientKill,
        ] {
            assert!(kinds.contains(&kind), "{kind:?} never drawn: {kinds:?}");
        }
        let tcp = Schedule::draw(params(3, false));
        assert!(!tcp.replay_command(None).contains("--fabric"));
    }

    /// The seed of tests/chaos.rs's Redis Cluster run (3 nodes, 30 s, in memory).
    const REDIS_TEST_SEED: u64 = 5;

    #[test]
    fn the_stream_is_fixed_by_its_definition() {
        // SplitMix64's published first output for seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }
}
