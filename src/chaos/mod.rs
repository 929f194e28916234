//! `skyriver chaos`: real daemons in network namespaces under a client workload, faults
//! injected from outside on a schedule drawn from a seed, and a checker over the recorded
//! history (root only).
//!
//! - [`schedule`]: which fault, where, when; deterministic per seed, printable.
//! - [`cluster`]: the daemons, killed, paused and restarted one at a time.
//! - [`nemesis`]: carries out and heals each fault.
//! - [`workload`]: the clients on every node, with contents every reader can verify.
//! - [`history`]: what happened, as JSON lines.
//! - [`checker`]: what must hold, and the verdict.
//! - [`final_reads`]: the reads after the faults, with a full store's counters when one fails.
//! - [`redis_cluster`]: a Redis Cluster of the run's own, whose masters the nemesis kills.
//! - [`fabric`]: TCP or verbs between the daemons, and what verbs leaves out.

pub mod checker;
pub mod cluster;
pub mod fabric;
pub mod final_reads;
pub mod history;
pub mod nemesis;
pub mod python_clients;
pub mod redis_cluster;
pub mod schedule;
pub mod stale;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use checker::Verdict;
use cluster::{ChaosCluster, DaemonSettings};
use history::{Death, FaultRecord, History};
use schedule::{FaultKind, Schedule, ScheduleParams};

/// How long the cluster may take to connect fully, at start and after the faults.
const CONVERGENCE_BOUND: Duration = Duration::from_secs(60);
/// `skyriver chaos --memory`'s default (the replay command names any other).
pub const DEFAULT_MEMORY_BYTES: u64 = 256 << 20;
/// How often resources and exits are sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// One chaos run's settings.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Daemons.
    pub nodes: u32,
    /// Length of the workload (faults stop a few seconds before its end).
    pub seconds: u64,
    /// The seed of the schedule and the workload.
    pub seed: u64,
    /// Persistent daemons.
    pub persistent: bool,
    /// Shared memory of each daemon, bytes.
    pub memory_bytes: u64,
    /// `redis://…`, or the built-in directory on node 0 (`None`).
    pub directory: Option<String>,
    /// Where the history goes (JSON lines), if anywhere.
    pub history: Option<PathBuf>,
    /// Where the daemons' logs are copied at the end, if anywhere.
    pub keep_logs: Option<PathBuf>,
    /// Python clients in the workload.
    pub python_clients: PythonClients,
    /// Two faults at once now and then (see [`schedule::Schedule::draw`]).
    pub overlap: bool,
    /// The directory is a Redis Cluster the run starts itself (`directory` is `None` then),
    /// whose masters the nemesis kills.
    pub redis_cluster: bool,
    /// The daemons' fabric.
    pub fabric: fabric::ChaosFabric,
    /// The factor the checker's real-time bounds are multiplied by (`None`: 1); for an
    /// emulated CPU.
    pub slowdown: Option<u32>,
}

/// Whether the workload has Python clients (one per node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonClients {
    /// When `python3` imports the `skyriver` package (or the source tree's build stages it).
    Auto,
    /// Always: a run without them fails.
    On,
    /// Never.
    Off,
}

/// What a run found.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The schedule it ran.
    pub schedule: Schedule,
    /// The checker's verdict.
    pub verdict: Verdict,
    /// How long after the workload every node saw every other (ms), if it did.
    pub converged_after_ms: Option<u64>,
    /// The command that replays the schedule.
    pub replay: String,
    /// The Python clients: how many ran and with which package, or why none did.
    pub python_clients: String,
}

/// Why a run could not be carried out (as opposed to a run that found violations).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// Not root, or no `ip`: what is needed.
    #[error(
        "skyriver chaos needs root (it makes network namespaces, veth links, tmpfs mounts and \
         signals daemons) and iproute2's `ip` and `tc`: {0}. Run it as root, e.g. `sudo \
         skyriver chaos …`"
    )]
    NotAvailable(#[from] crate::netns::NetnsUnavailable),
    /// The cluster could not be made.
    #[error(transparent)]
    Cluster(#[from] cluster::ChaosClusterError),
    /// The cluster did not connect before the faults started.
    #[error("the cluster did not connect within {0:?} of its start")]
    NoInitialConvergence(Duration),
    /// `--python-clients on`, and no `skyriver` package imports.
    #[error("--python-clients on, but {0}")]
    NoPython(String),
    /// Ctrl-C, SIGTERM or SIGHUP.
    #[error("interrupted; everything the run made was removed")]
    Interrupted,
    /// The history could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Sets the returned flag at SIGINT, SIGTERM or SIGHUP, so the run stops and cleans up.
pub fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    crate::up::watch_stop_signals(stop.clone())?;
    Ok(stop)
}

/// Runs one chaos run: cluster, workload, nemesis, final reads, checker. Must be called on
/// the thread that lives for the whole run (the daemons die with it).
pub fn run(config: &ChaosConfig, stop: &AtomicBool) -> Result<RunReport, ChaosError> {
    crate::netns::available()?;
    let schedule = Schedule::draw(ScheduleParams {
        seed: config.seed,
        nodes: config.nodes,
        seconds: config.seconds,
        persistent: config.persistent,
        builtin_head: config.directory.is_none() && !config.redis_cluster,
        overlap: config.overlap,
        redis_cluster: config.redis_cluster,
        verbs: config.fabric.is_verbs(),
    });
    let mut replay = schedule.replay_command(if config.redis_cluster {
        Some("redis-cluster")
    } else {
        config.directory.as_deref()
    });
    if config.memory_bytes != DEFAULT_MEMORY_BYTES {
        // A full store's failures replay only with the same memory.
        replay.push_str(&format!(" --memory {}", config.memory_bytes));
    }
    if let Some(slowdown) = config.slowdown {
        replay.push_str(&format!(" --slowdown {slowdown}"));
    }
    if config.fabric.is_verbs() && std::env::var_os("SKYRIVER_VM").is_some() {
        // In the SoftRoCE guest: the host command that boots one and runs the same schedule.
        replay = guest_replay(&replay);
    }
    println!("  fabric: {}", config.fabric.describe());
    print!("{schedule}");
    let exe = crate::self_exe().map_err(|source| ChaosError::Write {
        path: "the skyriver executable".into(),
        source,
    })?;
    let mut cluster = ChaosCluster::start(DaemonSettings {
        nodes: config.nodes,
        memory_bytes: config.memory_bytes,
        persistent: config.persistent,
        directory: config.directory.clone(),
        exe: exe.clone(),
        redis_cluster: config.redis_cluster,
        fabric: config.fabric.clone(),
    })?;
    let python = match config.python_clients {
        PythonClients::Off => Err("off (--python-clients off)".to_string()),
        PythonClients::Auto | PythonClients::On => python_clients::find(&exe, &cluster.dir),
    };
    let python_clients = match &python {
        Ok(setup) => format!("{} (skyriver from {})", config.nodes, setup.package),
        Err(reason) => {
            if config.python_clients == PythonClients::On {
                return Err(ChaosError::NoPython(reason.clone()));
            }
            format!("none: {reason}")
        }
    };
    println!("  python clients: {python_clients}");
    let sockets: Vec<PathBuf> = (0..config.nodes).map(|n| cluster.socket(n)).collect();
    if converge(&sockets, config.nodes, CONVERGENCE_BOUND, stop).is_none() {
        if stop.load(Ordering::SeqCst) {
            return Err(ChaosError::Interrupted);
        }
        return Err(ChaosError::NoInitialConvergence(CONVERGENCE_BOUND));
    }
    let started = Instant::now();
    cluster.set_epoch(started);
    let ms = || started.elapsed().as_millis() as u64;
    let workload =
        workload::Workload::start(config.seed, sockets.clone(), started, python.as_ref().ok());
    let mut faults = Vec::new();
    let mut deaths = Vec::new();
    let mut client_objects = Vec::new();
    let wait_until = |cluster: &mut ChaosCluster, at_ms: u64| -> Result<(), ChaosError> {
        while ms() < at_ms {
            if stop.load(Ordering::SeqCst) {
                return Err(ChaosError::Interrupted);
            }
            cluster.sample_all();
            std::thread::sleep(
                SAMPLE_INTERVAL.min(Duration::from_millis(at_ms.saturating_sub(ms()))),
            );
        }
        Ok(())
    };
    let outcome = (|| -> Result<(), ChaosError> {
        // Injections and heals in time order (a heal before an injection at the same time):
        // faults may overlap.
        let mut events: Vec<(u64, bool, usize)> = Vec::new();
        for (serial, fault) in schedule.faults.iter().enumerate() {
            events.push((fault.at_ms, true, serial));
            events.push((fault.at_ms + fault.duration_ms, false, serial));
        }
        events.sort_by_key(|&(at, inject, serial)| (at, inject, serial));
        let mut active: BTreeMap<usize, (u64, Result<nemesis::Injected, String>)> = BTreeMap::new();
        // How far the nemesis runs behind the schedule (a restart that took long, a slow
        // client kill): later events move by as much, so no fault is cut short.
        let mut lag = ScheduleLag::default();
        for (at_ms, inject, serial) in events {
            wait_until(&mut cluster, lag.due(at_ms))?;
            lag.observe(at_ms, ms());
            let fault = &schedule.faults[serial];
            if inject {
                let start_ms = ms();
                println!("  inject {fault}");
                let injected = nemesis::inject(&mut cluster, fault, config.seed, serial as u64);
                if matches!(
                    fault.kind,
                    FaultKind::KillRestart
                        | FaultKind::KillRestartWiped
                        | FaultKind::HeadKillRestart
                ) {
                    deaths.push(Death {
                        node: fault.node,
                        at_ms: start_ms,
                        files_kept: config.persistent && fault.kind != FaultKind::KillRestartWiped,
                    });
                }
                let injected = injected.map_err(|e| format!("inject: {e}"));
                if let Ok(injected) = &injected {
                    client_objects.extend(injected.client_object);
                }
                active.insert(serial, (start_ms, injected));
                continue;
            }
            let Some((start_ms, injected)) = active.remove(&serial) else {
                continue;
            };
            let error = match injected {
                Ok(injected) => nemesis::heal(&mut cluster, &injected)
                    .err()
                    .map(|e| format!("heal: {e}")),
                Err(error) => Some(error),
            };
            if let Some(error) = &error {
                println!("  {:>7.1}s  {error}", ms() as f64 / 1000.0);
            }
            faults.push(FaultRecord {
                kind: fault.kind,
                node: fault.node,
                peer: fault.peer,
                start_ms,
                end_ms: ms(),
                error,
            });
        }
        faults.sort_by_key(|f: &FaultRecord| f.start_ms);
        // The quiet end after the last heal, whatever the lag.
        wait_until(&mut cluster, lag.due(config.seconds * 1000))
    })();
    workload.stop();
    if let Err(error) = outcome {
        cluster.stop_all();
        workload.join();
        return Err(error);
    }
    // Workers finish their operation in flight: the longest may take its timeout and the bound.
    let deadline = Instant::now()
        + Duration::from_millis(
            workload::FETCH_TIMEOUT_MS
                + checker::HANG_BOUND_MS * u64::from(config.slowdown.unwrap_or(1).max(1))
                + 5_000,
        );
    while !workload.finished() && Instant::now() < deadline {
        cluster.sample_all();
        std::thread::sleep(Duration::from_millis(50));
    }
    let unfinished = workload.in_flight();
    println!(
        "  {:>7.1}s  workload stopped; final checks",
        ms() as f64 / 1000.0
    );
    // Counted from the last fault's heal (the workers' last operations ran meanwhile).
    let last_heal_ms = faults.iter().map(|f| f.end_ms).max().unwrap_or(0);
    let converged_after_ms = converge(&sockets, config.nodes, CONVERGENCE_BOUND, stop)
        .map(|_| ms().saturating_sub(last_heal_ms));
    cluster.sample_evictions();
    let mut ops = workload.ops();
    let finals = final_reads::run(&ops, &client_objects, &sockets, config.nodes, &ms);
    ops.extend(finals.ops);
    for oom in &finals.out_of_memory {
        println!(
            "  out of memory on node-{} in the final checks; its store: {}",
            oom.node,
            serde_json::to_string(&oom.stats).unwrap_or_default()
        );
    }
    cluster.sample_all();
    let history = History {
        nodes: config.nodes,
        persistent: config.persistent,
        ops,
        faults,
        deaths,
        unexpected_exits: cluster.unexpected_exits(),
        panics: cluster.panics(),
        resources: cluster.resources(),
        unfinished,
        converged_after_ms,
        memory_bytes: config.memory_bytes,
        python_clients: workload.python_clients(),
        directory_node: (config.directory.is_none() && !config.redis_cluster).then_some(0),
        client_exits: workload.client_exits(),
        out_of_memory: finals.out_of_memory,
        slowdown: config.slowdown,
    };
    if let Some(dir) = &config.keep_logs {
        if let Err(e) = cluster.keep_logs(dir) {
            eprintln!("chaos: cannot keep the logs in {}: {e}", dir.display());
        }
    }
    cluster.stop_all();
    workload.join();
    drop(cluster);
    if let Some(path) = &config.history {
        history
            .write_jsonl(path)
            .map_err(|source| ChaosError::Write {
                path: path.clone(),
                source,
            })?;
    }
    let verdict = checker::check(&history);
    Ok(RunReport {
        schedule,
        verdict,
        converged_after_ms,
        replay,
        python_clients,
    })
}

/// How far the nemesis runs behind its schedule. Each event is due at its scheduled time plus
/// the lag so far, so when an injection or heal overruns (a daemon that takes 20 s to restart
/// under an emulated CPU), what follows moves with it: faults last at least as scheduled and
/// the gaps between them stay, instead of a late pause being healed the moment it starts.
#[derive(Debug, Default, Clone, Copy)]
struct ScheduleLag {
    ms: u64,
}

impl ScheduleLag {
    /// When an event scheduled at `at_ms` is due.
    fn due(&self, at_ms: u64) -> u64 {
        at_ms + self.ms
    }

    /// An event scheduled at `at_ms` starts at `now_ms`.
    fn observe(&mut self, at_ms: u64, now_ms: u64) {
        self.ms = self.ms.max(now_ms.saturating_sub(at_ms));
    }
}

/// `skyriver chaos … --fabric verbs …` as `ci/softroce/chaos.sh …` (which adds the fabric).
fn guest_replay(replay: &str) -> String {
    let args = replay
        .strip_prefix("skyriver chaos")
        .unwrap_or(replay)
        .replace(" --fabric verbs", "");
    format!("ci/softroce/chaos.sh{args}")
}

/// Waits until every node sees every other connected; how long that took, or `None`.
fn converge(
    sockets: &[PathBuf],
    nodes: u32,
    bound: Duration,
    stop: &AtomicBool,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < bound && !stop.load(Ordering::SeqCst) {
        let all = sockets.iter().all(|socket| {
            skyriver_client::Client::connect(socket)
                .and_then(|c| c.nodes())
                .is_ok_and(|view| {
                    view.members.len() == nodes as usize && view.members.iter().all(|m| m.connected)
                })
        });
        if all {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// The summary table of a run.
pub fn summary(report: &RunReport) -> String {
    use std::fmt::Write;
    let params = &report.schedule.params;
    let verdict = &report.verdict;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "chaos seed {}: {} nodes, {} s, {}",
        params.seed,
        params.nodes,
        params.seconds,
        if params.persistent {
            "persistent"
        } else {
            "in memory"
        }
    );
    let _ = writeln!(
        out,
        "  {:<28} {:>8} {:>10} {:>8} {:>12}",
        "operation", "ok", "not_found", "failed", "wrong_bytes"
    );
    for (kind, outcomes) in &verdict.ops {
        let count = |name: &str| outcomes.get(name).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:<28} {:>8} {:>10} {:>8} {:>12}",
            kind,
            count("ok"),
            count("not_found"),
            count("failed"),
            count("wrong_bytes")
        );
    }
    let _ = writeln!(out, "  python clients: {}", report.python_clients);
    let faults: Vec<String> = verdict
        .faults
        .iter()
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect();
    let _ = writeln!(out, "  faults: {}", faults.join(", "));
    let _ = writeln!(
        out,
        "  acknowledged objects read after the faults: {} ({} lost with every holder, allowed)",
        verdict.objects_checked, verdict.objects_lost_with_every_holder
    );
    match report.converged_after_ms {
        Some(after) => {
            let _ = writeln!(out, "  converged {after} ms after the faults stopped");
        }
        None => {
            let _ = writeln!(out, "  did NOT converge after the faults stopped");
        }
    }
    if verdict.slowdown > 1 {
        let _ = writeln!(
            out,
            "  real-time bounds x{} (--slowdown): operations may take {} ms past their \
             timeouts, locations {} ms to be found again after a fault",
            verdict.slowdown,
            checker::HANG_BOUND_MS * u64::from(verdict.slowdown),
            checker::REPUBLISH_BOUND_MS * u64::from(verdict.slowdown)
        );
    }
    let _ = writeln!(out, "  violations: {}", verdict.violations.len());
    for violation in verdict.violations.iter().take(20) {
        let _ = writeln!(
            out,
            "    {}",
            serde_json::to_string(violation).unwrap_or_default()
        );
    }
    if !verdict.passed() {
        let _ = writeln!(
            out,
            "  FAILED: seed {}; replay: {}",
            params.seed, report.replay
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_late_event_moves_the_rest_of_the_schedule_so_faults_keep_their_length() {
        let mut lag = super::ScheduleLag::default();
        // A pause scheduled at 20 s for 7 s; the nemesis gets to it at 45 s.
        assert_eq!(lag.due(20_000), 20_000);
        lag.observe(20_000, 45_000);
        // Its heal is due 7 s after it began, not at once.
        assert_eq!(lag.due(27_000), 52_000);
        // An event on time adds nothing; an earlier lag is never taken back.
        lag.observe(27_000, 52_000);
        assert_eq!(lag.due(60_000), 85_000);
        lag.observe(30_000, 40_000);
        assert_eq!(lag.due(60_000), 85_000);
    }

    #[test]
    fn a_verbs_run_in_the_guest_replays_through_the_guest_script() {
        assert_eq!(
            super::guest_replay("skyriver chaos --nodes 3 --seconds 60 --seed 4 --fabric verbs"),
            "ci/softroce/chaos.sh --nodes 3 --seconds 60 --seed 4"
        );
        assert_eq!(
            super::guest_replay(
                "skyriver chaos --nodes 3 --seconds 60 --seed 4 --persistent --fabric verbs \
                 --memory 1000"
            ),
            "ci/softroce/chaos.sh --nodes 3 --seconds 60 --seed 4 --persistent --memory 1000"
        );
    }
}
