//! `bench replicas --breakdown N`: where the wait of a put for its copies goes.
//!
//! - **CPU per operation**: `10 × N` puts of each copy count and as many fetches, each with
//!   every daemon's CPU time (and time spent runnable but waiting for a CPU) read from
//!   `/proc/PID/task/*/schedstat` before and after, which is exact (the ticks of
//!   `/proc/PID/stat` are 10 ms). On a machine with fewer CPUs than busy daemons, a wait
//!   costs about the daemons' CPU time summed over the nodes rather than the slowest node's:
//!   set beside the wall time, it tells a machine short of CPUs from a step that waits.
//! - **Timeline**: `N` traced puts per copy count above 1. Every daemon stamps named moments
//!   (a directory request submitted, the head's reads and writes, a directory event received,
//!   a fetch request sent, a seal…) on the machine's monotonic clock, which all of them share;
//!   the medians of the milestones of a put (the origin's publication, the head placing the
//!   copies, the first and last target told, fetching and sealed, the head hearing of the last
//!   copy, the origin hearing of it) are printed relative to the put's start.

use std::time::{Duration, Instant};

use serde::Serialize;
use skyriver_client::{Client, ObjectId, ReplicaPolicy};
use skyriver_transport::trace::monotonic_ns;

use super::replicas::{delete_everywhere, pattern, ReplicasArgs, WAIT};
use super::BenchError;
use crate::up::LocalCluster;

/// The node that puts (node 0 serves the directory; node 2 fetches).
const ORIGIN: usize = 1;
/// The node that fetches.
const FETCHER: usize = 2;

/// What the breakdown measured.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    /// Object size in bytes.
    pub size_bytes: u64,
    /// Puts by copy count, then the fetch.
    pub cpu: Vec<CpuCost>,
    /// Milestones of traced puts, by copy count above 1.
    pub timelines: Vec<Timeline>,
}

/// Wall and CPU time of one kind of operation.
#[derive(Debug, Clone, Serialize)]
pub struct CpuCost {
    /// `put k=K` or `fetch`.
    pub operation: String,
    /// Operations measured.
    pub iterations: usize,
    /// Median wall time, microseconds.
    pub p50_us: f64,
    /// Mean CPU time of all daemons per operation, microseconds.
    pub cpu_us: f64,
    /// The same by node (node 0 first; it serves the directory).
    pub cpu_us_by_node: Vec<f64>,
    /// Mean time the daemons' threads were runnable but waited for a CPU, microseconds (a
    /// sum over threads: it exceeds the wall time when several waited at once).
    pub waiting_for_cpu_us: f64,
}

/// The median moments of traced puts with `copies` copies.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// Copies per put.
    pub copies: u8,
    /// Traced puts.
    pub puts: usize,
    /// Each milestone with the median of its time after the put was sent (µs), over the puts
    /// where it was seen.
    pub milestones: Vec<(String, Option<f64>)>,
}

/// One stamp of a traced put: which node, what, microseconds after the client sent the put.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stamp {
    pub(super) node: usize,
    pub(super) event: String,
    pub(super) at_us: f64,
}

/// Runs the breakdown at the first size of `args` on `cluster`, putting from `putter`.
pub(super) fn run(
    args: &ReplicasArgs,
    cluster: &LocalCluster,
    putter: &Client,
    fresh_id: &mut impl FnMut() -> ObjectId,
) -> Result<Breakdown, BenchError> {
    let daemons = cluster
        .sockets
        .iter()
        .map(Client::connect)
        .collect::<Result<Vec<_>, _>>()?;
    let size = args.sizes.first().map_or(1024, |s| s.0);
    let data = pattern(size as usize, 7);
    let pids: Vec<u32> = cluster.pids().into_iter().flatten().collect();
    let iterations = args.breakdown * 10;
    let mut cpu = Vec::new();
    for &copies in &args.copies {
        let policy = ReplicaPolicy {
            copies,
            wait_ms: (copies > 1).then_some(WAIT.as_millis() as u64),
        };
        let mut operation = CpuMeasurement::new(format!("put k={copies}"), &pids);
        for _ in 0..iterations {
            let id = fresh_id();
            operation.measure(|| putter.put_replicated(id, &data, b"", policy))?;
            delete_everywhere(putter, id)?;
        }
        cpu.push(operation.cost());
    }
    let fetcher = &daemons[FETCHER];
    let mut operation = CpuMeasurement::new("fetch".into(), &pids);
    for _ in 0..iterations {
        let id = fresh_id();
        putter.put_replicated(id, &data, b"", ReplicaPolicy::default())?;
        operation.measure(|| fetcher.fetch_one(id, Some(WAIT)).map(drop))?;
        fetcher.delete(&[id])?;
        delete_everywhere(putter, id)?;
    }
    cpu.push(operation.cost());
    let mut timelines = Vec::new();
    for &copies in args.copies.iter().filter(|&&c| c > 1) {
        let mut puts = Vec::new();
        for _ in 0..args.breakdown {
            let id = fresh_id();
            let policy = ReplicaPolicy {
                copies,
                wait_ms: Some(WAIT.as_millis() as u64),
            };
            let (stamps, total_us) = traced_put(&daemons, putter, id, &data, policy)?;
            if std::env::var_os(STAMPS_ENV).is_some() {
                eprintln!("traced put k={copies}: {total_us:.0} µs");
                for stamp in &stamps {
                    eprintln!(
                        "  {:>9.1} µs  node {}  {}",
                        stamp.at_us, stamp.node, stamp.event
                    );
                }
            }
            puts.push(milestones(&stamps, ORIGIN, total_us));
            delete_everywhere(putter, id)?;
        }
        timelines.push(Timeline {
            copies,
            puts: puts.len(),
            milestones: median_milestones(&puts),
        });
    }
    Ok(Breakdown {
        size_bytes: size,
        cpu,
        timelines,
    })
}

/// Set, every traced put's stamps are printed (to stderr) as well.
const STAMPS_ENV: &str = "SKYRIVER_BENCH_STAMPS";

/// Wall and CPU time of operations of one kind, accumulated.
struct CpuMeasurement<'a> {
    operation: String,
    pids: &'a [u32],
    wall: Vec<Duration>,
    /// Per node: nanoseconds on a CPU, and runnable waiting for one.
    cpu_ns: Vec<(u64, u64)>,
}

impl<'a> CpuMeasurement<'a> {
    fn new(operation: String, pids: &'a [u32]) -> Self {
        Self {
            operation,
            pids,
            wall: Vec::new(),
            cpu_ns: vec![(0, 0); pids.len()],
        }
    }

    /// Runs `operation`, timed, with the daemons' CPU time around it.
    fn measure<E>(&mut self, operation: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let before: Vec<(u64, u64)> = self.pids.iter().map(|&pid| cpu_ns(pid)).collect();
        let started = Instant::now();
        operation()?;
        self.wall.push(started.elapsed());
        for ((&pid, total), before) in self.pids.iter().zip(&mut self.cpu_ns).zip(before) {
            let after = cpu_ns(pid);
            total.0 += after.0.saturating_sub(before.0);
            total.1 += after.1.saturating_sub(before.1);
        }
        Ok(())
    }

    fn cost(mut self) -> CpuCost {
        self.wall.sort();
        let n = self.wall.len().max(1) as f64;
        let us = |ns: u64| ns as f64 / n / 1e3;
        CpuCost {
            operation: self.operation,
            iterations: self.wall.len(),
            p50_us: self
                .wall
                .get(self.wall.len() / 2)
                .map_or(0.0, |d| d.as_secs_f64() * 1e6),
            cpu_us: us(self.cpu_ns.iter().map(|c| c.0).sum()),
            cpu_us_by_node: self.cpu_ns.iter().map(|c| us(c.0)).collect(),
            waiting_for_cpu_us: us(self.cpu_ns.iter().map(|c| c.1).sum()),
        }
    }
}

/// Nanoseconds every thread of process `pid` has run on a CPU, and has waited for one while
/// runnable (`/proc/PID/task/*/schedstat`); zeros for a process that is gone.
fn cpu_ns(pid: u32) -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return total;
    };
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let mut fields = stat
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0));
        total.0 += fields.next().unwrap_or(0);
        total.1 += fields.next().unwrap_or(0);
    }
    total
}

/// Puts `data` as `id` with `policy` from `putter` while every daemon in `daemons` records
/// its stamps; returns them, oldest first, with the put's own time (µs).
fn traced_put(
    daemons: &[Client],
    putter: &Client,
    id: ObjectId,
    data: &[u8],
    policy: ReplicaPolicy,
) -> Result<(Vec<Stamp>, f64), BenchError> {
    for daemon in daemons {
        daemon.trace_stamps(true)?;
    }
    let started = monotonic_ns();
    putter.put_replicated(id, data, b"", policy)?;
    let ended = monotonic_ns();
    let mut stamps = Vec::new();
    for (node, daemon) in daemons.iter().enumerate() {
        for stamp in daemon.trace_stamps(false)? {
            if stamp.at_ns < started {
                continue;
            }
            stamps.push(Stamp {
                node,
                event: stamp.event,
                at_us: (stamp.at_ns - started) as f64 / 1e3,
            });
        }
    }
    stamps.sort_by(|a, b| a.at_us.total_cmp(&b.at_us));
    Ok((stamps, (ended - started) as f64 / 1e3))
}

/// The milestones of a traced put with copies, in µs after the client sent it, each when seen.
/// Targets are the nodes other than `origin` that sealed the object; stamps named `head_*`
/// are the head's (node 0 serves it, and may be a target too).
pub(super) fn milestones(
    stamps: &[Stamp],
    origin: usize,
    total_us: f64,
) -> Vec<(&'static str, Option<f64>)> {
    let first = |node: Option<usize>, event: &str, after: f64| {
        stamps
            .iter()
            .filter(|s| s.event == event && s.at_us >= after)
            .find(|s| node.is_none_or(|n| s.node == n))
            .map(|s| s.at_us)
    };
    let published = first(Some(origin), "directory_submit", 0.0);
    let placed = published.and_then(|at| first(None, "head_handled", at));
    let mut targets: Vec<usize> = stamps
        .iter()
        .filter(|s| s.node != origin && s.event == "sealed")
        .map(|s| s.node)
        .collect();
    targets.sort_unstable();
    targets.dedup();
    let after_placed = placed.unwrap_or(0.0);
    let span = |event: &str| -> (Option<f64>, Option<f64>) {
        let mut times: Vec<f64> = targets
            .iter()
            .filter_map(|&t| first(Some(t), event, after_placed))
            .collect();
        times.sort_by(f64::total_cmp);
        (times.first().copied(), times.last().copied())
    };
    let (told_first, told_last) = span("directory_event");
    let (asked_first, asked_last) = span("fetch_request_send");
    let (sealed_first, sealed_last) = span("sealed");
    let head_last = sealed_last.and_then(|at| first(None, "head_handled", at));
    let origin_told = stamps
        .iter()
        .rev()
        .find(|s| s.node == origin && s.event == "directory_event")
        .map(|s| s.at_us);
    vec![
        ("origin publishes", published),
        ("head places the copies", placed),
        ("first target told", told_first),
        ("last target told", told_last),
        ("first target fetches", asked_first),
        ("last target fetches", asked_last),
        ("first copy sealed", sealed_first),
        ("last copy sealed", sealed_last),
        ("head hears of last copy", head_last),
        ("origin hears of it", origin_told),
        ("client returns", Some(total_us)),
    ]
}

/// The median of each milestone over `puts` (each put's milestones in the same order).
fn median_milestones(puts: &[Vec<(&'static str, Option<f64>)>]) -> Vec<(String, Option<f64>)> {
    let Some(first) = puts.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(at, (name, _))| {
            let mut times: Vec<f64> = puts.iter().filter_map(|m| m.get(at)?.1).collect();
            times.sort_by(f64::total_cmp);
            (name.to_string(), times.get(times.len() / 2).copied())
        })
        .collect()
}

/// Prints the breakdown.
pub(super) fn print(breakdown: &Breakdown) {
    println!(
        "breakdown at {}: wall and daemons' CPU per operation (µs)",
        skyriver_daemon::size::format_bytes(breakdown.size_bytes)
    );
    println!(
        "{:>10} {:>9} {:>9} {:>24} {:>16}",
        "operation", "p50", "CPU", "CPU by node", "waiting for CPU"
    );
    for cost in &breakdown.cpu {
        let by_node: Vec<String> = cost
            .cpu_us_by_node
            .iter()
            .map(|c| format!("{c:.0}"))
            .collect();
        println!(
            "{:>10} {:>9.0} {:>9.0} {:>24} {:>16.0}",
            cost.operation,
            cost.p50_us,
            cost.cpu_us,
            by_node.join(" "),
            cost.waiting_for_cpu_us
        );
    }
    for timeline in &breakdown.timelines {
        println!(
            "k={}: median µs after the put was sent ({} traced puts)",
            timeline.copies, timeline.puts
        );
        for (name, at) in &timeline.milestones {
            println!(
                "  {name:>24}  {}",
                at.map_or_else(|| "-".to_string(), |at| format!("{at:>8.0}"))
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(node: usize, event: &str, at_us: f64) -> Stamp {
        Stamp {
            node,
            event: event.into(),
            at_us,
        }
    }

    #[test]
    fn milestones_follow_the_copies_from_the_origin_to_the_targets_and_back() {
        let stamps = vec![
            stamp(1, "directory_submit", 10.0),
            stamp(0, "head_handled", 20.0),
            stamp(2, "directory_event", 30.0),
            stamp(3, "directory_event", 35.0),
            stamp(2, "fetch_request_send", 40.0),
            stamp(3, "fetch_request_send", 45.0),
            stamp(1, "sealed", 41.0),
            stamp(1, "directory_event", 42.0),
            stamp(3, "sealed", 60.0),
            stamp(2, "sealed", 70.0),
            stamp(0, "head_handled", 65.0),
            stamp(0, "head_handled", 80.0),
            stamp(1, "directory_event", 90.0),
        ];
        let got: Vec<Option<f64>> = milestones(&stamps, 1, 100.0)
            .into_iter()
            .map(|(_, at)| at)
            .collect();
        let want = [
            10.0, 20.0, 30.0, 35.0, 40.0, 45.0, 60.0, 70.0, 80.0, 90.0, 100.0,
        ];
        assert_eq!(got, want.map(Some).to_vec());
    }

    #[test]
    fn a_milestone_not_seen_is_none_and_medians_skip_it() {
        let seen = vec![("a", Some(1.0)), ("b", Some(5.0))];
        let unseen = vec![("a", Some(3.0)), ("b", None)];
        let also = vec![("a", Some(2.0)), ("b", Some(7.0))];
        let medians = median_milestones(&[seen, unseen, also]);
        assert_eq!(
            medians,
            vec![("a".to_string(), Some(2.0)), ("b".to_string(), Some(7.0))]
        );
    }
}
