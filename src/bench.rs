//! `skyriver bench`: benchmark programs that print a table and write JSON.
//!
//! `bench local` ([`local`]) measures the local store through the real daemon and client next
//! to raw Unix-socket and TCP round trips; `bench fetch` ([`fetch`]) measures fetches between
//! daemons against raw TCP streams and round trips, Plasma-style, chunked and Redis baselines
//! ([`baselines`]) in the same run; `bench scale` fills one daemon with many small objects and
//! runs many clients against it; `bench cluster` runs N daemons in network namespaces and
//! moves objects in broadcast, all-to-all and incast patterns; `bench all` runs local, fetch
//! and scale in turn.
//!
//! This file holds what they share: results with percentiles and the spread of repeated
//! medians, the daemon started for a run, the timer, CPU placement (`--cpus`) and the facts
//! about the machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::Serialize;

use skyriver_client::Client;

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The local store: create, put, get, contains and delete by object size, next to raw
    /// Unix-socket and TCP round trips.
    Local(local::LocalArgs),
    /// Persistent mode: fill a store, kill the daemon, time the recovery.
    Recovery(crate::bench::recovery::RecoveryArgs),
    /// Fetches between daemons on this machine, by size and mode, next to raw TCP streams
    /// (default and tuned like the fabric), raw Unix-socket and TCP round trips, Plasma-style
    /// 4 KiB chunks, 5 MiB chunked pulls and Redis GET measured in the same run.
    Fetch(fetch::FetchArgs),
    /// Many small objects in one daemon (metadata bytes per object), then many clients doing a
    /// mixed get/put workload.
    Scale(scale::ScaleArgs),
    /// N daemons in network namespaces (root): broadcast, all-to-all and incast fetches next
    /// to raw TCP between the same namespaces and Redis GET, in the same run.
    Cluster(cluster::ClusterArgs),
    /// The whole comparison: local, fetch and scale, with JSON and the plot in one directory.
    All(AllArgs),
    /// Where a 1 KiB fetch's time goes, hop by hop from timestamps on the path, next to raw
    /// UDS and TCP ping-pongs, a small put and a local get, by polling time.
    Breakdown(breakdown::BreakdownArgs),
    /// The directory services under many node sessions over real TCP: the built-in head, one
    /// Redis and a Redis Cluster of three masters, with targets marked met or MISSED.
    Directory(directory::DirectoryArgs),
    /// A store of S bytes with a spill directory and a working set of 4×S: writes, then
    /// sequential and random gets, next to the disk's raw bandwidth in the same run.
    Spill(spill::SpillArgs),
    /// N daemons in network namespaces (root): put latency and throughput with k copies
    /// next to one fetch of the same size, then the repair time after a node is killed.
    Replicas(replicas::ReplicasArgs),
}

mod baselines;
mod breakdown;
mod cluster;
mod cluster_trace;
mod digest_cost;
mod directory;
mod fetch;
mod local;
mod plot;
mod recovery;
mod replicas;
mod replicas_breakdown;
mod scale;
mod spill;

/// Options of `bench all`.
#[derive(Args, Debug, Clone)]
pub struct AllArgs {
    /// Directory for the JSON files and the plot.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Time per case in `bench local` and per system and size in `bench fetch`.
    #[arg(long, default_value_t = 500)]
    pub millis_per_case: u64,
    /// Objects in `bench scale`.
    #[arg(long, default_value_t = 1_000_000)]
    pub scale_objects: u64,
    /// Where `bench local` and `bench fetch` run their ends (see `bench fetch --help`).
    #[arg(long, value_enum, default_value_t = CpuPlacement::Spread)]
    pub cpus: CpuPlacement,
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The client failed.
    #[error(transparent)]
    Client(#[from] skyriver_client::ClientError),
    /// A system call of the benchmark's setup, or writing its results, failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The arguments ask for what cannot run (their combination, or what this machine has).
    #[error("{0}")]
    Usage(String),
    /// A `bench all` step's arguments do not parse.
    #[error(transparent)]
    Args(#[from] clap::Error),
    /// Entering a node's network namespace failed.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// Network namespaces cannot be made here (`bench cluster` runs its nodes in them).
    #[error("bench cluster runs its nodes in network namespaces, which cannot be made here: {0}")]
    NoNamespaces(#[source] crate::netns::NetnsUnavailable),
    /// A fetch of the benchmark's objects failed.
    #[error(transparent)]
    Fetch(#[from] skyriver_core::node::FetchError),
    /// The results do not encode as JSON.
    #[error("cannot encode the results as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A thread of the benchmark panicked (its panic was printed).
    #[error("a {0} thread panicked")]
    ThreadPanicked(&'static str),
    /// A server the benchmark measures answered what its protocol does not allow.
    #[error("{server} answered {answer:?}")]
    BadAnswer {
        /// Which server, and to what.
        server: &'static str,
        /// Its answer.
        answer: String,
    },
    /// A check of the benchmark's own results or setup failed.
    #[error("{0}")]
    Check(String),
    /// No temporary directory for a daemon's socket.
    #[error("cannot create a directory under $TMPDIR: {0}")]
    TempDir(#[source] std::io::Error),
    /// This program's own path (to start daemons with) is unknown.
    #[error("cannot find this program's own path to start daemons with: {0}")]
    OwnPath(#[source] std::io::Error),
    /// A process the benchmark needs could not be started.
    #[error("cannot start {program} ({source}){hint}")]
    Spawn {
        /// Which (`the daemon`, `redis-server`).
        program: &'static str,
        /// What to do about it, with its leading separator (or empty).
        hint: &'static str,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// A process started but did not answer in time.
    #[error("{what} did not answer within {within:?}")]
    NotReady {
        /// Which, and where.
        what: String,
        /// How long it was given.
        within: Duration,
    },
    /// A local cluster did not start.
    #[error(transparent)]
    Up(Box<crate::up::UpError>),
    /// `bench recovery` failed.
    #[error(transparent)]
    Recovery(#[from] recovery::RecoveryError),
}

impl From<crate::up::UpError> for BenchError {
    fn from(error: crate::up::UpError) -> Self {
        BenchError::Up(Box::new(error))
    }
}

/// Runs a benchmark command.
pub fn run(command: BenchCommand) -> Result<(), BenchError> {
    match command {
        BenchCommand::Local(args) => local::run(&args),
        BenchCommand::Recovery(args) => Ok(recovery::run(&args)?),
        BenchCommand::Fetch(args) => fetch::run(&args),
        BenchCommand::Scale(args) => scale::run(&args),
        BenchCommand::Cluster(args) => cluster::run(&args),
        BenchCommand::All(args) => run_all(&args),
        BenchCommand::Breakdown(args) => breakdown::run(&args),
        BenchCommand::Directory(args) => directory::run(&args),
        BenchCommand::Spill(args) => spill::run(&args),
        BenchCommand::Replicas(args) => replicas::run(&args),
    }
}

fn run_all(args: &AllArgs) -> Result<(), BenchError> {
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(subcommand)]
        command: BenchCommand,
    }
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError::Io {
        what: format!("cannot create {}", args.out.display()),
        source: e,
    })?;
    let out = |name: &str| args.out.join(name).display().to_string();
    let millis = args.millis_per_case.to_string();
    let objects = args.scale_objects.to_string();
    let cpus = args.cpus.to_string();
    let steps: [(&str, Vec<String>); 3] = [
        (
            "local",
            vec![
                "local".into(),
                "--cpus".into(),
                cpus.clone(),
                "--millis-per-case".into(),
                millis.clone(),
                "--json".into(),
                out("bench-local.json"),
            ],
        ),
        (
            "fetch",
            vec![
                "fetch".into(),
                "--cpus".into(),
                cpus,
                "--millis-per-case".into(),
                millis,
                "--json".into(),
                out("bench-fetch.json"),
                "--plot".into(),
                out("bench-fetch.svg"),
            ],
        ),
        (
            "scale",
            vec![
                "scale".into(),
                "--objects".into(),
                objects,
                "--json".into(),
                out("bench-scale.json"),
            ],
        ),
    ];
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("bench all: load average at start {}", load.trim());
    for (index, (name, argv)) in steps.into_iter().enumerate() {
        eprintln!("== [{}/3] bench {name} ==", index + 1);
        println!("== bench {name} ==");
        let parsed = Wrapper::try_parse_from(std::iter::once("bench".to_string()).chain(argv))
            .map_err(BenchError::Args)?;
        run(parsed.command)?;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("bench all: load average at end {}", load.trim());
    eprintln!("results in {}", args.out.display());
    Ok(())
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// The operation.
    pub operation: String,
    /// Object size in bytes.
    pub size_bytes: u64,
    /// Iterations timed.
    pub iterations: usize,
    /// Operations per second (from the mean).
    pub ops_per_sec: f64,
    /// Object bytes per second, in MB/s (10^6).
    pub mb_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// The medians of consecutive parts of the run, when it was split: how much the p50
    /// moves between repeats of the same measurement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_repeats_us: Option<Repeats>,
}

/// The p50s of a measurement's repeats (consecutive parts of its samples).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Repeats {
    /// How many parts.
    pub count: usize,
    /// Lowest p50 of a part, microseconds.
    pub min: f64,
    /// Median of the parts' p50s.
    pub median: f64,
    /// Highest p50 of a part.
    pub max: f64,
}

impl Repeats {
    /// Splits `samples` (in the order they were taken) into `count` consecutive parts and
    /// summarises their p50s; `None` with fewer than two samples per part.
    pub(crate) fn of(samples: &[Duration], count: usize) -> Option<Self> {
        let per_part = samples.len() / count.max(1);
        if count < 2 || per_part < 2 {
            return None;
        }
        let mut medians: Vec<f64> = samples
            .chunks_exact(per_part)
            .take(count)
            .map(|part| {
                let mut part = part.to_vec();
                part.sort_unstable();
                part[(part.len() - 1) / 2].as_secs_f64() * 1e6
            })
            .collect();
        medians.sort_by(f64::total_cmp);
        Some(Self {
            count,
            min: medians[0],
            median: medians[(medians.len() - 1) / 2],
            max: medians[medians.len() - 1],
        })
    }
}

impl CaseResult {
    /// [`CaseResult::from_samples`] with the p50s of `repeats` consecutive parts of the run
    /// (`samples` in the order they were taken).
    pub(crate) fn with_repeats(
        operation: &str,
        size_bytes: u64,
        samples: &mut [Duration],
        repeats: usize,
    ) -> Self {
        let spread = Repeats::of(samples, repeats);
        Self {
            p50_repeats_us: spread,
            ..Self::from_samples(operation, size_bytes, samples)
        }
    }

    pub(crate) fn from_samples(operation: &str, size_bytes: u64, samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let total: Duration = samples.iter().sum();
        let mean_secs = total.as_secs_f64() / samples.len().max(1) as f64;
        let percentile = |p: f64| {
            let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
            samples.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        Self {
            operation: operation.to_string(),
            size_bytes,
            iterations: samples.len(),
            ops_per_sec: if mean_secs > 0.0 {
                1.0 / mean_secs
            } else {
                0.0
            },
            mb_per_sec: if mean_secs > 0.0 {
                size_bytes as f64 / mean_secs / 1e6
            } else {
                0.0
            },
            p50_us: percentile(0.50),
            p99_us: percentile(0.99),
            p50_repeats_us: None,
        }
    }

    /// `min–max` of the repeats' p50s, or blank.
    pub(crate) fn repeats_range(&self) -> String {
        self.p50_repeats_us
            .map(|r| format!("{:.1}–{:.1}", r.min, r.max))
            .unwrap_or_default()
    }
}

/// Where the two ends of every measured round trip run (`--cpus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CpuPlacement {
    /// Every process of the run (this one, the daemons, baseline servers) on one vCPU: each
    /// hand-off is a context switch on a CPU that is awake, no cross-CPU wake-up.
    Pinned,
    /// The two ends of each hop on different vCPUs (this process and the holder on the first,
    /// the requester daemon or baseline server on the second): each hand-off wakes an idle
    /// CPU, as between cores of a quiet machine.
    Spread,
}

impl std::fmt::Display for CpuPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CpuPlacement::Pinned => "pinned",
            CpuPlacement::Spread => "spread",
        })
    }
}

impl CpuPlacement {
    /// The CPUs this process may use, lowest first, as at the first call: before the run
    /// binds its threads (after that, this thread's own set is the one CPU it was bound to).
    fn allowed() -> &'static [usize] {
        static ALLOWED: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
        ALLOWED.get_or_init(|| {
            nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
                .map(|set| {
                    (0..nix::sched::CpuSet::count())
                        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// The CPU of the near end (this process's clients, the holder daemon) and of the far end
    /// (the requester daemon, baseline servers).
    pub fn cpus(self) -> (usize, usize) {
        let allowed = Self::allowed();
        let near = allowed.first().copied().unwrap_or(0);
        let far = match self {
            CpuPlacement::Pinned => near,
            CpuPlacement::Spread => allowed.get(1).copied().unwrap_or(near),
        };
        (near, far)
    }

    /// One line for a table's header.
    pub fn describe(self) -> String {
        let (near, far) = self.cpus();
        match self {
            CpuPlacement::Pinned => {
                format!("cpus: pinned (every end on vCPU {near}: hand-offs on an awake CPU)")
            }
            CpuPlacement::Spread if near == far => {
                format!("cpus: spread requested, but only vCPU {near} is allowed: every end on it")
            }
            CpuPlacement::Spread => {
                format!("cpus: spread (ends on vCPUs {near} and {far}: hand-offs wake an idle CPU)")
            }
        }
    }
}

/// Binds the calling thread to `cpu`.
pub(crate) fn pin_this_thread(cpu: usize) -> Result<(), BenchError> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|e| BenchError::Io {
        what: format!("cpu {cpu}"),
        source: e.into(),
    })?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| BenchError::Io {
        what: format!("cannot bind this thread to cpu {cpu}"),
        source: e.into(),
    })
}

/// Binds every thread of process `pid` to `cpu` (threads it starts later inherit it).
pub(crate) fn pin_process(pid: u32, cpu: usize) -> Result<(), BenchError> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|e| BenchError::Io {
        what: format!("cpu {cpu}"),
        source: e.into(),
    })?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| BenchError::Io {
        what: format!("cannot list the threads of {pid}"),
        source: e,
    })?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread may have ended since the listing.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set);
    }
    Ok(())
}

/// A daemon started for a benchmark, stopped on drop.
pub struct ChildDaemon {
    child: Child,
    socket: PathBuf,
    /// Holds the socket; removed (with anything left in it) on drop, after the daemon stops.
    _dir: tempfile::TempDir,
}

impl ChildDaemon {
    /// Starts `skyriver daemon` (this executable) with `memory_bytes` on a private socket.
    pub fn start(memory_bytes: u64) -> Result<Self, BenchError> {
        Self::start_with(memory_bytes, &[])
    }

    /// [`ChildDaemon::start`] with more `skyriver daemon` arguments.
    pub fn start_with(
        memory_bytes: u64,
        extra_args: &[std::ffi::OsString],
    ) -> Result<Self, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("skyriver-bench-")
            .tempdir()
            .map_err(BenchError::TempDir)?;
        let socket = dir.path().join("daemon.sock");
        let exe = crate::self_exe().map_err(BenchError::OwnPath)?;
        let child = Command::new(exe)
            .args(["daemon", "--log", "warn", "--memory"])
            .arg(memory_bytes.to_string())
            .arg("--socket")
            .arg(&socket)
            .args(extra_args)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Spawn {
                program: "the daemon",
                hint: "",
                source,
            })?;
        let daemon = Self {
            child,
            socket,
            _dir: dir,
        };
        daemon.wait_ready(Duration::from_secs(60))?;
        Ok(daemon)
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), BenchError> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if Client::connect(&self.socket).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(BenchError::NotReady {
            what: format!("the daemon on {}", self.socket.display()),
            within: limit,
        })
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// A target's verdict as every bench prints it. The targets are for release builds: a debug
/// build's miss says so, so that a debug run (CI's) is not read as a release figure.
pub(crate) fn verdict(met: bool) -> &'static str {
    match (met, cfg!(debug_assertions)) {
        (true, _) => "met",
        (false, false) => "MISSED",
        (false, true) => "MISSED (debug build; targets are for release builds)",
    }
}

pub(crate) struct Timer {
    pub(crate) budget: Duration,
    pub(crate) max_iterations: usize,
}

impl Timer {
    /// Runs `setup` (untimed) and `op` (timed) until the budget or iteration cap is reached,
    /// at least 5 times.
    pub(crate) fn measure<S, T>(
        &self,
        mut setup: impl FnMut(usize) -> Result<S, BenchError>,
        mut op: impl FnMut(S) -> Result<T, BenchError>,
        mut teardown: impl FnMut(T) -> Result<(), BenchError>,
    ) -> Result<Vec<Duration>, BenchError> {
        let mut samples = Vec::new();
        let started = Instant::now();
        while samples.len() < self.max_iterations
            && (samples.len() < 5 || started.elapsed() < self.budget)
        {
            let state = setup(samples.len())?;
            let begin = Instant::now();
            let out = op(state)?;
            samples.push(begin.elapsed());
            teardown(out)?;
        }
        Ok(samples)
    }
}

/// Scrapes a daemon's `/metrics` every interval on a thread, as Prometheus would.
pub(crate) struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Scraper {
    pub(crate) fn start(addr: std::net::SocketAddr, every: Duration) -> Self {
        use std::io::{Read, Write};
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut scrapes = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
                    let request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
                    let mut response = Vec::new();
                    if stream.write_all(request.as_bytes()).is_ok()
                        && stream.read_to_end(&mut response).is_ok()
                        && response.starts_with(b"HTTP/1.1 200")
                    {
                        scrapes += 1;
                    }
                }
                std::thread::sleep(every);
            }
            scrapes
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops; returns how many scrapes succeeded.
    pub(crate) fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Facts about the machine a benchmark ran on.
#[derive(Debug, Serialize)]
pub struct MachineInfo {
    /// Logical CPUs.
    pub cpus: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Seconds since the Unix epoch when the run ended.
    pub unix_time: u64,
}

impl MachineInfo {
    /// Reads the facts of this machine.
    pub fn probe() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|s| s.trim().to_string())
            })
            .unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// The baselines a `--baselines` list names (`--baselines ''` names none).
fn chosen_baselines(names: &[String]) -> Vec<String> {
    names.iter().filter(|b| !b.is_empty()).cloned().collect()
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::BenchError;

    #[test]
    fn a_failed_setup_step_keeps_its_cause() {
        let error = BenchError::Io {
            what: "cannot write results.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        let cause = error.source().expect("the failing call's error");
        let io = cause
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(error.to_string().starts_with("cannot write results.json: "));
    }
}
