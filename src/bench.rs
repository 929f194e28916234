//! `skyriver bench`: benchmark programs that print a table and write JSON.
//!
//! `bench local` measures the local store through the real daemon and client: create+seal,
//! put (create, fill, seal) against a plain memcpy into pre-faulted memory measured in the
//! same run, zero-copy get+release, batched gets, get with a full read, contains and delete.
//!
//! `bench fetch` measures fetches between daemons against TCP, Plasma-style, chunked and Redis
//! baselines in the same run; `bench scale` fills one daemon with many small objects and runs
//! many clients against it; `bench cluster` runs N daemons in network namespaces and moves
//! objects in broadcast, all-to-all and incast patterns; `bench all` runs local, fetch and
//! scale in turn.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::client::Client;
use crate::size::{format_bytes, ByteSize};
use skyriver_core::ObjectId;

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The local store: create, put, get, contains and delete by object size.
    Local(LocalArgs),
    /// Persistent mode: fill a store, kill the daemon, time the recovery.
    Recovery(crate::persistence::bench::RecoveryArgs),
    /// Fetches between daemons on this machine, by size and mode, next to raw TCP, Plasma-style
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
}

mod breakdown;
mod cluster;
mod fetch;
mod plot;
mod scale;

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
}

/// Options of `bench local`.
#[derive(Args, Debug, Clone)]
pub struct LocalArgs {
    /// Object sizes to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1KiB,64KiB,1MiB,16MiB,128MiB"
    )]
    pub sizes: Vec<ByteSize>,
    /// Time spent on each operation at each size (more gives steadier percentiles).
    #[arg(long, default_value_t = 400)]
    pub millis_per_case: u64,
    /// Most iterations of one case.
    #[arg(long, default_value_t = 20_000)]
    pub max_iterations: usize,
    /// Measure an already running daemon instead of starting one.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Start the daemon in persistent mode on this file (reused if it exists), to measure
    /// the cost of durability.
    #[arg(long)]
    pub backing_file: Option<PathBuf>,
    /// With --backing-file: when seals are durable.
    #[arg(long, value_enum, default_value_t = crate::persistence::Durability::Seal)]
    pub durability: crate::persistence::Durability,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-local.json")]
    pub json: PathBuf,
    /// Also run every case against a second daemon with --metrics, scraped each second, and
    /// print the ratio on / off (rows marked [metrics]).
    #[arg(long)]
    pub metrics: bool,
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The client failed.
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    /// Starting the daemon or writing the results failed.
    #[error("{0}")]
    Setup(String),
}

/// Runs a benchmark command.
pub fn run(command: BenchCommand) -> Result<(), BenchError> {
    match command {
        BenchCommand::Local(args) => run_local(&args),
        BenchCommand::Recovery(args) => {
            crate::persistence::bench::run(&args).map_err(BenchError::Setup)
        }
        BenchCommand::Fetch(args) => fetch::run(&args),
        BenchCommand::Scale(args) => scale::run(&args),
        BenchCommand::Cluster(args) => cluster::run(&args),
        BenchCommand::All(args) => run_all(&args),
        BenchCommand::Breakdown(args) => breakdown::run(&args),
    }
}

fn run_all(args: &AllArgs) -> Result<(), BenchError> {
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(subcommand)]
        command: BenchCommand,
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| BenchError::Setup(format!("cannot create {}: {e}", args.out.display())))?;
    let out = |name: &str| args.out.join(name).display().to_string();
    let millis = args.millis_per_case.to_string();
    let objects = args.scale_objects.to_string();
    let steps: [(&str, Vec<String>); 3] = [
        (
            "local",
            vec![
                "local".into(),
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
            .map_err(|e| BenchError::Setup(e.to_string()))?;
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
}

impl CaseResult {
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
        }
    }
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
            .map_err(|e| {
                BenchError::Setup(format!("cannot create a directory under $TMPDIR: {e}"))
            })?;
        let socket = dir.path().join("daemon.sock");
        let exe = std::env::current_exe().map_err(|e| BenchError::Setup(e.to_string()))?;
        let child = Command::new(exe)
            .args(["daemon", "--log", "warn", "--memory"])
            .arg(memory_bytes.to_string())
            .arg("--socket")
            .arg(&socket)
            .args(extra_args)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| BenchError::Setup(format!("cannot start the daemon: {e}")))?;
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
        Err(BenchError::Setup(format!(
            "the daemon did not come up on {} within {limit:?}",
            self.socket.display()
        )))
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

/// Objects per request in the batched-get case.
const BATCH: usize = 64;

fn fresh_id(counter: &mut u64) -> ObjectId {
    *counter += 1;
    let mut bytes = [0u8; 20];
    bytes[..8].copy_from_slice(b"benchobj");
    bytes[12..].copy_from_slice(&counter.to_be_bytes());
    ObjectId(bytes)
}

fn run_local(args: &LocalArgs) -> Result<(), BenchError> {
    let largest = args.sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let daemon = match &args.socket {
        Some(_) => None,
        None => {
            let memory = (largest * 4).max(256 << 20);
            eprintln!(
                "starting a daemon with {} of memory...",
                format_bytes(memory)
            );
            let extra: Vec<std::ffi::OsString> = match &args.backing_file {
                Some(path) => vec![
                    "--backing-file".into(),
                    path.into(),
                    "--durability".into(),
                    args.durability.to_string().into(),
                ],
                None => Vec::new(),
            };
            Some(ChildDaemon::start_with(memory, &extra)?)
        }
    };
    let socket = match (&args.socket, &daemon) {
        (Some(socket), _) => socket.clone(),
        (None, Some(daemon)) => daemon.socket().to_path_buf(),
        (None, None) => unreachable!("a daemon is started when no socket is given"),
    };
    let client = Client::connect(&socket)?;
    let timer = Timer {
        budget: Duration::from_millis(args.millis_per_case),
        max_iterations: args.max_iterations,
    };
    let mut counter = 0u64;
    let mut results = Vec::new();
    // With --metrics, a second daemon serves /metrics, scraped each second, and every case
    // runs against both, one after the other: the rows side by side show what exporting costs.
    let metered = match (args.metrics, &args.socket) {
        (true, None) => {
            let memory = (largest * 4).max(256 << 20);
            let port = crate::up::free_loopback_port().map_err(BenchError::Setup)?;
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let daemon =
                ChildDaemon::start_with(memory, &["--metrics".into(), addr.to_string().into()])?;
            let client = Client::connect(daemon.socket())?;
            Some((daemon, client, Scraper::start(addr, Duration::from_secs(1))))
        }
        (true, Some(_)) => {
            return Err(BenchError::Setup(
                "--metrics starts its own daemons; leave out --socket".into(),
            ))
        }
        (false, _) => None,
    };
    for &ByteSize(size) in &args.sizes {
        eprintln!("measuring {}...", format_bytes(size));
        measure_size(&client, &timer, &mut counter, size, "", &mut results)?;
        if let Some((_, metered_client, _)) = &metered {
            measure_size(
                metered_client,
                &timer,
                &mut counter,
                size,
                METRICS_TAG,
                &mut results,
            )?;
        }
    }
    if let Some((_, _, scraper)) = metered {
        eprintln!("{} scrapes of /metrics during the run", scraper.stop());
        print_metrics_overhead(&results);
    }
    print_local_table(&results);
    write_json(&args.json, &results)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// Every case of `bench local` at one size, against `client`; `tag` marks the rows' names.
fn measure_size(
    client: &Client,
    timer: &Timer,
    counter: &mut u64,
    size: u64,
    tag: &str,
    results: &mut Vec<CaseResult>,
) -> Result<(), BenchError> {
    let source = vec![0xa5u8; size as usize];

    // create + seal (no data written): the control-path round trips.
    let mut samples = timer.measure(
        |_| Ok(fresh_id(counter)),
        |id| {
            client.create(id, size, 0)?.seal()?;
            Ok(id)
        },
        |id| {
            client.delete(&[id])?;
            Ok(())
        },
    )?;
    results.push(CaseResult::from_samples(
        &format!("create+seal{tag}"),
        size,
        &mut samples,
    ));

    // put: create, copy the data in, seal.
    let mut samples = timer.measure(
        |_| Ok(fresh_id(counter)),
        |id| {
            let mut writer = client.create(id, size, 0)?;
            writer.data_mut().copy_from_slice(&source);
            writer.seal()?;
            Ok(id)
        },
        |id| {
            client.delete(&[id])?;
            Ok(())
        },
    )?;
    results.push(CaseResult::from_samples(
        &format!("put{tag}"),
        size,
        &mut samples,
    ));

    // memcpy into pre-faulted private memory: the ceiling for put.
    let mut destination = vec![0u8; size as usize];
    destination.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let mut samples = timer.measure(
        |_| Ok(()),
        |()| {
            destination.copy_from_slice(std::hint::black_box(&source));
            std::hint::black_box(&destination);
            Ok(())
        },
        |()| Ok(()),
    )?;
    results.push(CaseResult::from_samples(
        &format!("memcpy{tag}"),
        size,
        &mut samples,
    ));
    drop(destination);

    let id = fresh_id(counter);
    client.create_and_seal(id, &source, b"")?;
    let mut samples = timer.measure(
        |_| Ok(()),
        |()| {
            let object = client.get_one(id, Some(Duration::ZERO))?;
            std::hint::black_box(object.data().as_ptr());
            Ok(())
        },
        |()| Ok(()),
    )?;
    results.push(CaseResult::from_samples(
        &format!("get+release (zero-copy){tag}"),
        size,
        &mut samples,
    ));

    let mut samples = timer.measure(
        |_| Ok(()),
        |()| {
            let object = client.get_one(id, Some(Duration::ZERO))?;
            let sum = object.data().chunks_exact(8).fold(0u64, |acc, c| {
                acc.wrapping_add(u64::from_ne_bytes(c.try_into().expect("8 bytes")))
            });
            std::hint::black_box(sum);
            Ok(())
        },
        |()| Ok(()),
    )?;
    results.push(CaseResult::from_samples(
        &format!("get+read{tag}"),
        size,
        &mut samples,
    ));

    // Batched zero-copy gets: one request for 64 objects, then their releases. Rows count
    // objects (ops/s, MB/s); latencies are per batch.
    if size <= 1 << 20 {
        let batch: Vec<ObjectId> = (0..BATCH).map(|_| fresh_id(counter)).collect();
        for &id in &batch {
            client.create_and_seal(id, &source, b"")?;
        }
        let mut samples = timer.measure(
            |_| Ok(()),
            |()| {
                let objects = client.get(&batch, Some(Duration::ZERO))?;
                std::hint::black_box(objects.len());
                Ok(())
            },
            |()| Ok(()),
        )?;
        let mut result =
            CaseResult::from_samples(&format!("get batch ×{BATCH}{tag}"), size, &mut samples);
        result.ops_per_sec *= BATCH as f64;
        result.mb_per_sec *= BATCH as f64;
        results.push(result);
        client.flush()?;
        client.delete(&batch)?;
    }

    let mut samples = timer.measure(
        |_| Ok(()),
        |()| {
            std::hint::black_box(client.contains(id)?);
            Ok(())
        },
        |()| Ok(()),
    )?;
    results.push(CaseResult::from_samples(
        &format!("contains{tag}"),
        size,
        &mut samples,
    ));
    client.flush()?;
    client.delete(&[id])?;

    let mut samples = timer.measure(
        |_| {
            let id = fresh_id(counter);
            client.create(id, size, 0)?.seal()?;
            Ok(id)
        },
        |id| {
            client.delete(&[id])?;
            Ok(())
        },
        |()| Ok(()),
    )?;
    results.push(CaseResult::from_samples(
        &format!("delete{tag}"),
        size,
        &mut samples,
    ));
    Ok(())
}

/// Marks the rows measured against the daemon with `--metrics`.
const METRICS_TAG: &str = " [metrics]";

/// Each case with metrics on next to the same case without: ops/s on / off.
fn print_metrics_overhead(results: &[CaseResult]) {
    println!();
    println!(
        "metrics on / off (1.00 = no cost; same run, cases interleaved; p50 is the steadier):"
    );
    println!(
        "  {:<26} {:>10} {:>12} {:>10} {:>12} {:>12}",
        "operation", "size", "ops/s ratio", "p50 ratio", "p50 µs on", "p50 µs off"
    );
    for on in results
        .iter()
        .filter(|r| r.operation.ends_with(METRICS_TAG))
    {
        let name = on.operation.trim_end_matches(METRICS_TAG);
        if let Some(off) = results
            .iter()
            .find(|r| r.operation == name && r.size_bytes == on.size_bytes)
        {
            println!(
                "  {:<26} {:>10} {:>12.3} {:>10.3} {:>12.1} {:>12.1}",
                name,
                format_bytes(on.size_bytes),
                on.ops_per_sec / off.ops_per_sec.max(f64::MIN_POSITIVE),
                on.p50_us / off.p50_us.max(f64::MIN_POSITIVE),
                on.p50_us,
                off.p50_us
            );
        }
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

fn print_local_table(results: &[CaseResult]) {
    println!(
        "{:<26} {:>10} {:>8} {:>12} {:>11} {:>10} {:>10}",
        "operation", "size", "iters", "ops/s", "MB/s", "p50 µs", "p99 µs"
    );
    for r in results {
        println!(
            "{:<26} {:>10} {:>8} {:>12.0} {:>11.1} {:>10.1} {:>10.1}",
            r.operation,
            format_bytes(r.size_bytes),
            r.iterations,
            r.ops_per_sec,
            r.mb_per_sec,
            r.p50_us,
            r.p99_us
        );
    }
    println!();
    println!("put / memcpy bandwidth (target ≥ 0.8 at 128 MiB):");
    for put in results.iter().filter(|r| r.operation == "put") {
        if let Some(memcpy) = results
            .iter()
            .find(|r| r.operation == "memcpy" && r.size_bytes == put.size_bytes)
        {
            println!(
                "  {:>10}  {:.2}",
                format_bytes(put.size_bytes),
                put.mb_per_sec / memcpy.mb_per_sec.max(f64::MIN_POSITIVE)
            );
        }
    }
    let zero_copy: Vec<&CaseResult> = results
        .iter()
        .filter(|r| r.operation == "get+release (zero-copy)")
        .collect();
    if let (Some(smallest), Some(largest)) = (zero_copy.first(), zero_copy.last()) {
        println!(
            "zero-copy get p50, largest / smallest size (target: flat, ≈ 1): {:.2} ({:.1} µs at {}, {:.1} µs at {})",
            largest.p50_us / smallest.p50_us.max(f64::MIN_POSITIVE),
            smallest.p50_us,
            format_bytes(smallest.size_bytes),
            largest.p50_us,
            format_bytes(largest.size_bytes)
        );
    }
    if let Some(batched) = results
        .iter()
        .find(|r| r.operation.starts_with("get batch") && r.size_bytes == 1024)
    {
        println!(
            "batched gets at 1 KiB (target ≥ 200000 objects/s): {:.0} objects/s, {}",
            batched.ops_per_sec,
            if batched.ops_per_sec >= 200_000.0 {
                "met"
            } else {
                "MISSED"
            }
        );
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

fn write_json(path: &Path, results: &[CaseResult]) -> Result<(), BenchError> {
    let document = serde_json::json!({
        "benchmark": "local",
        "machine": MachineInfo::probe(),
        "results": results,
    });
    let text = serde_json::to_string_pretty(&document).expect("results serialize");
    std::fs::write(path, text)
        .map_err(|e| BenchError::Setup(format!("cannot write {}: {e}", path.display())))
}
