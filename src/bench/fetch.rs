//! `bench fetch`: fetch bandwidth, latency and objects/s between daemons on this machine, by
//! object size and transfer mode, side by side with baselines measured in the same run:
//!
//! - `tcp`: a raw TCP stream between two endpoints, one request byte then the object written
//!   with one `write_all` and read with one `read_exact` into a destination buffer (the ceiling
//!   of the TCP fabric);
//! - `plasma-4k`: what Plasma's manager did: a header, then the object written and read in
//!   4 KiB chunks, one syscall per chunk on each side;
//! - `chunked-5m`: a tuned chunked pull like Ray's object manager: one request per 5 MiB chunk,
//!   each chunk read straight into the destination;
//! - `redis`: `GET` from a `redis-server` started on a free loopback port (RESP spoken directly,
//!   the value read straight into the destination buffer), when the server is installed.
//!
//! The Skyriver modes share one two-daemon cluster (`skyriver up`, threshold from the cost
//! model): each fetch names its mode, eager or rendezvous forced, or auto. One iteration
//! fetches an object held by node 0 into node 1 and then deletes the copy, so every iteration
//! moves the bytes again (the requester remembers where the object lives, as it would for any
//! object fetched before; the 1 KiB breakdown also times a first fetch, with its lookup). With
//! `--concurrency 1` the systems take turns, one iteration each per round, so every ratio
//! compares numbers taken under the same load and in the same daemons.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{BenchError, CaseResult, MachineInfo};
use crate::client::Client;
use crate::size::{format_bytes, ByteSize};
use crate::up::{free_loopback_port, LocalCluster, UpArgs};
use skyriver_core::{ObjectId, TransferMode};

/// Options of `bench fetch`.
#[derive(Args, Debug, Clone)]
pub struct FetchArgs {
    /// Object sizes to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1KiB,4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB"
    )]
    pub sizes: Vec<ByteSize>,
    /// Transfer modes to compare.
    #[arg(long, value_delimiter = ',', default_value = "eager,rendezvous,auto",
          value_parser = ["eager", "rendezvous", "auto"])]
    pub modes: Vec<String>,
    /// Baselines measured in the same run (none: `--baselines ''`).
    #[arg(long, value_delimiter = ',', default_value = "tcp,plasma-4k,chunked-5m,redis",
          value_parser = ["tcp", "plasma-4k", "chunked-5m", "redis", ""])]
    pub baselines: Vec<String>,
    /// Fetches (and baseline transfers) in flight at once, each from its own client thread.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Time spent on each size by each system.
    #[arg(long, default_value_t = 500)]
    pub millis_per_case: u64,
    /// Most iterations of one case.
    #[arg(long, default_value_t = 2000)]
    pub max_iterations: usize,
    /// Fabric between the two daemons: tcp, or verbs (needs --devices).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "verbs"])]
    pub fabric: String,
    /// RDMA devices for the verbs fabric: node 0 (holder) and node 1 (requester), e.g. rxe0,rxe1.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Also run every mode with daemons of this other build (rows `MODE@other`), interleaved
    /// with this one's: before/after numbers of a change, taken under the same load.
    #[arg(long)]
    pub compare_exe: Option<PathBuf>,
    /// Also run every mode with daemons serving --metrics, each scraped every second (rows
    /// `MODE@metrics`), interleaved with the plain ones: what exporting metrics costs.
    #[arg(long)]
    pub metrics: bool,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-fetch.json")]
    pub json: PathBuf,
    /// Draw bandwidth against size (SVG), one line per system and mode, here.
    #[arg(long, default_value = "bench-fetch.svg")]
    pub plot: PathBuf,
}

/// One row of the table: a size in one Skyriver mode.
#[derive(Debug, Clone, Serialize)]
struct FetchRow {
    mode: String,
    #[serde(flatten)]
    result: CaseResult,
    /// Bandwidth relative to the raw TCP stream at this size.
    ratio_to_tcp: f64,
    /// Bandwidth relative to each baseline measured at this size.
    ratios: std::collections::BTreeMap<String, f64>,
}

/// Auto against the better forced mode at one size.
#[derive(Debug, Clone, Serialize)]
struct AutoRow {
    size_bytes: u64,
    eager_p50_us: f64,
    rendezvous_p50_us: f64,
    auto_p50_us: f64,
    /// auto p50 / the better forced p50 (≤ 1.1 is the target).
    auto_over_best: f64,
    within_10_percent: bool,
    /// The size is above what the receive slots take eagerly, so all three modes ran the same
    /// rendezvous path and their spread is measurement noise, not a choice of auto.
    one_path: bool,
}

/// One iteration of one system, on one client thread; returns the time of the transfer itself
/// (a Skyriver iteration also deletes its copy afterwards, untimed).
type Worker = Box<dyn FnMut() -> Result<Duration, BenchError> + Send>;

/// Times `transfer`.
fn timed(transfer: impl FnOnce() -> Result<(), BenchError>) -> Result<Duration, BenchError> {
    let begin = Instant::now();
    transfer()?;
    Ok(begin.elapsed())
}

/// A system under measurement at one size: one worker per concurrent client, and what to
/// undo afterwards.
struct Prepared {
    name: String,
    workers: Vec<Worker>,
    cleanup: Option<Box<dyn FnOnce()>>,
}

fn setup_error(what: &str) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |e| BenchError::Setup(format!("{what}: {e}"))
}

pub(super) fn run(args: &FetchArgs) -> Result<(), BenchError> {
    let concurrency = args.concurrency.max(1);
    let largest = args.sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let memory = ByteSize((largest * (2 * concurrency as u64 + 1)).max(128 << 20));
    let exe = std::env::current_exe().map_err(|e| BenchError::Setup(e.to_string()))?;
    let baselines: Vec<String> = args
        .baselines
        .iter()
        .filter(|b| !b.is_empty())
        .cloned()
        .collect();

    let redis = if baselines.iter().any(|b| b == "redis") {
        match RedisServer::start(largest) {
            Ok(server) => Some(server),
            Err(reason) => {
                eprintln!("redis baseline skipped: {reason}");
                None
            }
        }
    } else {
        None
    };

    let modes: Vec<TransferMode> = args
        .modes
        .iter()
        .map(|m| m.parse().map_err(BenchError::Setup))
        .collect::<Result<_, _>>()?;
    let mut clusters = Vec::new();
    let mut builds = vec![(String::new(), exe.clone(), false)];
    if let Some(other) = &args.compare_exe {
        builds.push(("@other".to_string(), other.clone(), false));
    }
    if args.metrics {
        builds.push(("@metrics".to_string(), exe.clone(), true));
    }
    if modes.is_empty() {
        builds.clear();
    }
    for (suffix, exe, metrics) in &builds {
        eprintln!(
            "starting two daemons{suffix} with {} each...",
            format_bytes(memory.0)
        );
        // No --dir: the cluster makes its own directory and removes it when dropped.
        let mut up = UpArgs::new(2, memory, None);
        up.fabric = args.fabric.clone();
        up.devices = args.devices.clone();
        up.metrics = *metrics;
        let cluster = LocalCluster::start(&up, exe).map_err(BenchError::Setup)?;
        let scrapers = cluster
            .metrics
            .iter()
            .map(|&addr| crate::bench::Scraper::start(addr, Duration::from_secs(1)))
            .collect();
        let holder = Client::connect(&cluster.sockets[0])?;
        let requesters = (0..concurrency)
            .map(|_| Client::connect(&cluster.sockets[1]))
            .collect::<Result<Vec<_>, _>>()?;
        let view = requesters[0].nodes()?;
        let mut threshold = None;
        let eager_capacity = view.eager_capacity_bytes;
        if let Some(peer) = view.members.iter().find(|m| m.node != view.node) {
            eprintln!("  link: {}", peer.link);
            threshold = peer.eager_threshold_bytes;
        }
        clusters.push(BenchCluster {
            suffix: suffix.clone(),
            _scrapers: scrapers,
            _cluster: cluster,
            holder,
            requesters,
            threshold,
            eager_capacity,
        });
    }

    let budget = Duration::from_millis(args.millis_per_case);
    let mut measured: Vec<(String, CaseResult)> = Vec::new();
    let total_cases = args.sizes.len();
    for (index, &ByteSize(size)) in args.sizes.iter().enumerate() {
        eprintln!(
            "[{}/{total_cases}] {}: {} systems{}...",
            index + 1,
            format_bytes(size),
            baselines.len() + clusters.len(),
            if concurrency > 1 {
                format!(", {concurrency} clients each")
            } else {
                String::new()
            }
        );
        let mut systems = Vec::new();
        for baseline in &baselines {
            let prepared = match baseline.as_str() {
                "tcp" => Some(raw_tcp(size, concurrency)?),
                "plasma-4k" => Some(plasma_chunks(size, concurrency)?),
                "chunked-5m" => Some(pulled_chunks(size, concurrency)?),
                "redis" => match &redis {
                    Some(server) => Some(server.prepare(size, concurrency)?),
                    None => None,
                },
                _ => None,
            };
            systems.extend(prepared);
        }
        for cluster in &clusters {
            for (mode_index, &mode) in modes.iter().enumerate() {
                systems.push(cluster.prepare(index, size, mode_index, mode)?);
            }
        }
        let results = if concurrency == 1 {
            measure_interleaved(&mut systems, size, budget, args.max_iterations)?
        } else {
            measure_concurrent(&mut systems, size, budget, args.max_iterations)?
        };
        for system in systems {
            if let Some(cleanup) = system.cleanup {
                cleanup();
            }
        }
        measured.extend(results);
    }
    let auto_threshold = clusters.first().and_then(|c| c.threshold);
    let eager_capacity = clusters.first().map_or(u64::MAX, |c| c.eager_capacity);
    let breakdown = match clusters.first() {
        Some(cluster) => Some(cluster.small_fetch_breakdown(budget)?),
        None => None,
    };
    drop(clusters);
    for (suffix, _, _) in &builds {
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!(
            "skyriver-bench-fetch-{}{suffix}",
            std::process::id()
        )));
    }
    drop(redis);

    let baseline_results = |name: &str| -> Vec<CaseResult> {
        measured
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, r)| r.clone())
            .collect()
    };
    let tcp = baseline_results("tcp");
    let mut rows = Vec::new();
    for (name, result) in &measured {
        let Some(mode) = name.strip_prefix("skyriver-") else {
            continue;
        };
        let mut ratios = std::collections::BTreeMap::new();
        for baseline in &baselines {
            if let Some((_, base)) = measured
                .iter()
                .find(|(n, r)| n == baseline && r.size_bytes == result.size_bytes)
            {
                ratios.insert(baseline.clone(), ratio(result, base));
            }
        }
        rows.push(FetchRow {
            mode: mode.to_string(),
            result: result.clone(),
            ratio_to_tcp: ratios.get("tcp").copied().unwrap_or(0.0),
            ratios,
        });
    }
    let auto_rows = auto_against_forced(&rows, &args.sizes, eager_capacity);

    print_table(&measured, &baselines);
    if !auto_rows.is_empty() {
        print_auto_table(&auto_rows, &auto_threshold, eager_capacity);
    }
    if let Some(b) = &breakdown {
        println!(
            "where a 1 KiB fetch (auto mode) spends its time, p50 of interleaved calls from the requester's client:"
        );
        println!(
            "  local request (contains)                   {:>8.1} µs",
            b.local_rpc_p50_us
        );
        println!(
            "  directory lookup (locate)                  {:>8.1} µs",
            b.locate_p50_us
        );
        println!(
            "  first fetch of an object (lookup, transfer) {:>7.1} µs",
            b.first_fetch_p50_us
        );
        println!(
            "  fetch again (location remembered)          {:>8.1} µs",
            b.fetch_p50_us
        );
        println!(
            "  transfer and store (fetch again − local)   {:>8.1} µs",
            (b.fetch_p50_us - b.local_rpc_p50_us).max(0.0)
        );
        println!();
    }
    print_targets(&rows, &baselines, args.fabric == "tcp");

    let systems: Vec<String> = {
        let mut names: Vec<String> = Vec::new();
        for (name, _) in &measured {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    };
    let by_system: serde_json::Map<String, serde_json::Value> = systems
        .iter()
        .map(|name| {
            (
                name.clone(),
                serde_json::to_value(baseline_results(name)).expect("results serialize"),
            )
        })
        .collect();
    let document = serde_json::json!({
        "benchmark": "fetch",
        "fabric": args.fabric,
        "devices": args.devices,
        "concurrency": concurrency,
        "millis_per_case": args.millis_per_case,
        "machine": MachineInfo::probe(),
        "raw_tcp": tcp,
        "results": rows,
        "systems": by_system,
        "auto_vs_forced": auto_rows,
        "auto_threshold_bytes": auto_threshold,
        "eager_capacity_bytes": eager_capacity,
        "breakdown_1kib": breakdown,
    });
    std::fs::write(
        &args.json,
        serde_json::to_string_pretty(&document).expect("results serialize"),
    )
    .map_err(|e| BenchError::Setup(format!("cannot write {}: {e}", args.json.display())))?;
    eprintln!("wrote {}", args.json.display());
    let series: Vec<super::plot::Series> = systems
        .iter()
        .map(|name| super::plot::Series {
            name: name.clone(),
            points: baseline_results(name)
                .iter()
                .map(|r| (r.size_bytes as f64, r.mb_per_sec))
                .collect(),
        })
        .collect();
    let title = format!(
        "fetch bandwidth over the {} fabric (loopback, {} client{})",
        args.fabric,
        concurrency,
        if concurrency == 1 { "" } else { "s" }
    );
    std::fs::write(&args.plot, super::plot::svg(&title, &series))
        .map_err(|e| BenchError::Setup(format!("cannot write {}: {e}", args.plot.display())))?;
    eprintln!("wrote {}", args.plot.display());
    Ok(())
}

fn ratio(result: &CaseResult, base: &CaseResult) -> f64 {
    result.mb_per_sec / base.mb_per_sec.max(f64::MIN_POSITIVE)
}

/// The two daemons of one build, shared by every mode.
struct BenchCluster {
    /// Appended to the modes' names (`@other` for `--compare-exe`).
    suffix: String,
    /// Scrape the daemons' /metrics while the cluster lives (`--metrics`).
    _scrapers: Vec<crate::bench::Scraper>,
    _cluster: LocalCluster,
    holder: Client,
    requesters: Vec<Client>,
    threshold: Option<u64>,
    /// Largest object the requester takes eagerly: above it every mode is a rendezvous.
    eager_capacity: u64,
}

/// p50 latencies of the pieces of a small fetch.
#[derive(Debug, Clone, Serialize)]
struct Breakdown {
    local_rpc_p50_us: f64,
    locate_p50_us: f64,
    /// A fetch of an object this node never saw: directory lookup, then transfer.
    first_fetch_p50_us: f64,
    /// A fetch of an object fetched before (and deleted since): the location is remembered.
    fetch_p50_us: f64,
}

/// An object id for the benchmark, unique per size, mode and client.
fn bench_object_id(size_index: usize, mode_index: usize, worker: usize) -> ObjectId {
    let mut bytes = [0u8; 20];
    bytes[..8].copy_from_slice(b"fetchbch");
    bytes[8..12].copy_from_slice(&(size_index as u32).to_be_bytes());
    bytes[12..16].copy_from_slice(&(mode_index as u32).to_be_bytes());
    bytes[16..].copy_from_slice(&(worker as u32).to_be_bytes());
    ObjectId(bytes)
}

impl BenchCluster {
    fn small_fetch_breakdown(&self, budget: Duration) -> Result<Breakdown, BenchError> {
        let requester = &self.requesters[0];
        let data = [0x5a; 1024];
        let (mut local, mut locate, mut first, mut again) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let started = Instant::now();
        let mut round = 0;
        while again.len() < 5 || (started.elapsed() < budget && again.len() < 2000) {
            // A new object every round, so the first fetch of it asks the directory.
            let id = bench_object_id(usize::MAX >> 1, round % 4096, round / 4096);
            round += 1;
            self.holder.create_and_seal(id, &data, b"")?;
            let begin = Instant::now();
            std::hint::black_box(requester.contains(id)?);
            local.push(begin.elapsed());
            let begin = Instant::now();
            std::hint::black_box(requester.locate(id)?);
            locate.push(begin.elapsed());
            for samples in [&mut first, &mut again] {
                let begin = Instant::now();
                let object = requester.fetch_one(id, Some(Duration::from_secs(10)))?;
                samples.push(begin.elapsed());
                drop(object);
                requester.flush()?;
                requester.delete(&[id])?;
            }
            self.holder.delete(&[id])?;
        }
        let p50 = |samples: &mut Vec<Duration>| CaseResult::from_samples("", 1024, samples).p50_us;
        Ok(Breakdown {
            local_rpc_p50_us: p50(&mut local),
            locate_p50_us: p50(&mut locate),
            first_fetch_p50_us: p50(&mut first),
            fetch_p50_us: p50(&mut again),
        })
    }

    fn prepare(
        &self,
        size_index: usize,
        size: u64,
        mode_index: usize,
        mode: TransferMode,
    ) -> Result<Prepared, BenchError> {
        let data = vec![0x5a; size as usize];
        let mut ids = Vec::new();
        let mut workers: Vec<Worker> = Vec::new();
        for (w, requester) in self.requesters.iter().enumerate() {
            let id = bench_object_id(size_index, mode_index, w);
            self.holder.create_and_seal(id, &data, b"")?;
            ids.push(id);
            let requester = requester.clone();
            workers.push(Box::new(move || {
                let begin = Instant::now();
                let timeout = Some(Duration::from_secs(120));
                let object = requester.fetch_one_in_mode(id, timeout, mode)?;
                let elapsed = begin.elapsed();
                std::hint::black_box(object.data().as_ptr());
                drop(object);
                requester.flush()?;
                requester.delete(&[id])?;
                Ok(elapsed)
            }));
        }
        let holder = self.holder.clone();
        Ok(Prepared {
            name: format!("skyriver-{mode}{}", self.suffix),
            workers,
            cleanup: Some(Box::new(move || {
                let _ = holder.delete(&ids);
            })),
        })
    }
}

/// In rounds: every system runs one iteration per round, so load changes hit all of them
/// alike. The order is shuffled every round (seeded, so runs are comparable): a fetch leaves
/// work behind in its daemons (the delete's directory update, the holder's unpin) that slows
/// whichever system runs next, and a fixed order would charge it to the same system each time.
fn measure_interleaved(
    systems: &mut [Prepared],
    size: u64,
    budget: Duration,
    max_iterations: usize,
) -> Result<Vec<(String, CaseResult)>, BenchError> {
    let count = systems.len();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); count];
    let started = Instant::now();
    let total_budget = budget * count as u32;
    // One untimed iteration each first: the first fetch of a size faults the requester's
    // arena pages in (the daemons run without pre-faulting), as the baselines' destination
    // buffers are faulted in before they are timed.
    for system in systems.iter_mut() {
        (system.workers[0])()?;
    }
    let mut order: Vec<usize> = (0..count).collect();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ size;
    loop {
        let done = samples.iter().all(|s| s.len() >= max_iterations)
            || (samples.iter().all(|s| s.len() >= 5) && started.elapsed() >= total_budget);
        if done {
            break;
        }
        for k in (1..count).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(k, (seed % (k as u64 + 1)) as usize);
        }
        for &i in &order {
            if samples[i].len() >= max_iterations {
                continue;
            }
            let worker = &mut systems[i].workers[0];
            samples[i].push(worker()?);
        }
    }
    Ok(systems
        .iter()
        .zip(samples.iter_mut())
        .map(|(system, samples)| {
            (
                system.name.clone(),
                CaseResult::from_samples(&system.name, size, samples),
            )
        })
        .collect())
}

/// Each system in turn, its workers on their own threads for the budget; throughput from all
/// completed iterations over the wall time.
fn measure_concurrent(
    systems: &mut [Prepared],
    size: u64,
    budget: Duration,
    max_iterations: usize,
) -> Result<Vec<(String, CaseResult)>, BenchError> {
    let mut out = Vec::new();
    for system in systems.iter_mut() {
        let started = Instant::now();
        let per_worker: Vec<Result<Vec<Duration>, BenchError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = system
                .workers
                .iter_mut()
                .map(|worker| {
                    scope.spawn(move || {
                        // Untimed warm-up, as in `measure_interleaved`.
                        worker()?;
                        let mut samples = Vec::new();
                        let begun = Instant::now();
                        while samples.len() < max_iterations
                            && (samples.len() < 5 || begun.elapsed() < budget)
                        {
                            samples.push(worker()?);
                        }
                        Ok(samples)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(BenchError::Setup(
                            "a benchmark client thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        let wall = started.elapsed().as_secs_f64();
        let mut samples = Vec::new();
        for result in per_worker {
            samples.extend(result?);
        }
        let mut result = CaseResult::from_samples(&system.name, size, &mut samples);
        result.ops_per_sec = samples.len() as f64 / wall.max(1e-9);
        result.mb_per_sec = result.ops_per_sec * size as f64 / 1e6;
        out.push((system.name.clone(), result));
    }
    Ok(out)
}

fn auto_against_forced(rows: &[FetchRow], sizes: &[ByteSize], eager_capacity: u64) -> Vec<AutoRow> {
    let find = |mode: &str, size: u64| {
        rows.iter()
            .find(|r| r.mode == mode && r.result.size_bytes == size)
            .map(|r| r.result.p50_us)
    };
    sizes
        .iter()
        .filter_map(|&ByteSize(size)| {
            let eager = find("eager", size)?;
            let rendezvous = find("rendezvous", size)?;
            let auto = find("auto", size)?;
            let best = eager.min(rendezvous).max(f64::MIN_POSITIVE);
            Some(AutoRow {
                size_bytes: size,
                eager_p50_us: eager,
                rendezvous_p50_us: rendezvous,
                auto_p50_us: auto,
                auto_over_best: auto / best,
                // Judged at the two decimals the table prints.
                within_10_percent: (auto / best * 100.0).round() <= 110.0,
                one_path: size > eager_capacity,
            })
        })
        .collect()
}

fn print_table(measured: &[(String, CaseResult)], baselines: &[String]) {
    println!("fetch over loopback, side by side (ratios: bandwidth / the baseline's at that size)");
    print!(
        "{:>10} {:<24} {:>10} {:>10} {:>10} {:>10}",
        "size", "system", "MB/s", "p50 µs", "p99 µs", "objects/s"
    );
    for baseline in baselines {
        print!(" {:>11}", format!("×{baseline}"));
    }
    println!();
    let mut last_size = None;
    for (name, result) in measured {
        let size = if last_size == Some(result.size_bytes) {
            String::new()
        } else {
            format_bytes(result.size_bytes)
        };
        last_size = Some(result.size_bytes);
        print!(
            "{size:>10} {name:<20} {:>10.1} {:>10.1} {:>10.1} {:>10.0}",
            result.mb_per_sec, result.p50_us, result.p99_us, result.ops_per_sec
        );
        for baseline in baselines {
            let base = measured
                .iter()
                .find(|(n, r)| n == baseline && r.size_bytes == result.size_bytes);
            match base {
                Some((_, base)) if name != baseline => {
                    print!(" {:>10.2}x", ratio(result, base))
                }
                _ => print!(" {:>11}", ""),
            }
        }
        println!();
    }
    println!();
}

fn print_auto_table(rows: &[AutoRow], threshold: &Option<u64>, eager_capacity: u64) {
    println!(
        "auto against forced modes (p50 latency; target: auto within 10% of the better forced mode){}",
        match threshold {
            Some(bytes) => format!("; auto threshold {}", format_bytes(*bytes)),
            None => String::new(),
        }
    );
    println!(
        "{:>10} {:>12} {:>14} {:>10} {:>10} {:>8}",
        "size", "eager µs", "rendezvous µs", "auto µs", "auto/best", "≤ 1.10"
    );
    for row in rows {
        println!(
            "{:>10} {:>12.1} {:>14.1} {:>10.1} {:>10.2} {:>8}",
            format_bytes(row.size_bytes),
            row.eager_p50_us,
            row.rendezvous_p50_us,
            row.auto_p50_us,
            row.auto_over_best,
            match (row.within_10_percent, row.one_path) {
                (true, _) => "yes",
                (false, true) => "(noise)",
                (false, false) => "NO",
            }
        );
    }
    if rows.iter().any(|r| r.one_path) {
        println!(
            "  above {} (what the receive slots take eagerly) all three modes run the same \
             rendezvous path: there the spread between them is the measurement's noise",
            format_bytes(eager_capacity)
        );
    }
    println!();
}

fn print_targets(rows: &[FetchRow], baselines: &[String], tcp_fabric: bool) {
    if !tcp_fabric {
        return;
    }
    let auto: Vec<&FetchRow> = rows.iter().filter(|r| r.mode == "auto").collect();
    if auto.is_empty() {
        return;
    }
    println!("targets (auto mode over the TCP fabric):");
    let check = |what: &str, baseline: &str, min_size: u64, max_size: u64, want: f64| {
        if !baselines.iter().any(|b| b == baseline) {
            return;
        }
        for row in &auto {
            let size = row.result.size_bytes;
            if size < min_size || size > max_size {
                continue;
            }
            if let Some(&r) = row.ratios.get(baseline) {
                println!(
                    "  {what:<34} {:>10}: {r:>6.2}x  {}",
                    format_bytes(size),
                    if r >= want {
                        "met".to_string()
                    } else {
                        format!("MISSED by {:.0}%", (1.0 - r / want) * 100.0)
                    }
                );
            }
        }
    };
    check("≥ 0.8× raw TCP at ≥ 16 MiB", "tcp", 16 << 20, u64::MAX, 0.8);
    check(
        "≥ 8× Plasma 4 KiB chunks at 16 MiB",
        "plasma-4k",
        16 << 20,
        16 << 20,
        8.0,
    );
    check("≥ 2× Redis GET at ≥ 1 MiB", "redis", 1 << 20, u64::MAX, 2.0);
    println!();
}

/// A server thread per connection, answering each request byte with `serve`.
fn spawn_server(
    concurrency: usize,
    serve: impl Fn(TcpStream) -> std::io::Result<()> + Send + Sync + 'static,
) -> Result<std::net::SocketAddr, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(setup_error("baseline listener"))?;
    let addr = listener
        .local_addr()
        .map_err(setup_error("baseline listener"))?;
    let serve = std::sync::Arc::new(serve);
    std::thread::spawn(move || {
        for _ in 0..concurrency {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let serve = serve.clone();
            std::thread::spawn(move || {
                let _ = serve(stream);
            });
        }
    });
    Ok(addr)
}

fn connect(addr: std::net::SocketAddr) -> Result<TcpStream, BenchError> {
    let stream = TcpStream::connect(addr).map_err(setup_error("baseline connect"))?;
    stream
        .set_nodelay(true)
        .map_err(setup_error("baseline connect"))?;
    Ok(stream)
}

/// A destination buffer with its pages already faulted in, like a store's arena.
fn destination(size: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; size as usize];
    buffer.iter_mut().step_by(4096).for_each(|b| *b = 1);
    buffer
}

/// The raw TCP stream: a one-byte request, then the object in one `write_all`.
fn raw_tcp(size: u64, concurrency: usize) -> Result<Prepared, BenchError> {
    let payload = std::sync::Arc::new(vec![0x5au8; size as usize]);
    let addr = spawn_server(concurrency, move |mut stream| {
        let mut request = [0u8; 1];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&payload)?;
        }
        Ok(())
    })?;
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..concurrency {
        let mut stream = connect(addr)?;
        let mut buffer = destination(size);
        workers.push(Box::new(move || {
            timed(|| {
                stream.write_all(&[1]).map_err(setup_error("raw TCP"))?;
                stream
                    .read_exact(&mut buffer)
                    .map_err(setup_error("raw TCP"))?;
                Ok(())
            })
        }));
    }
    Ok(Prepared {
        name: "tcp".into(),
        workers,
        cleanup: None,
    })
}

/// Plasma's manager: the object size first, then the object in 4 KiB chunks, one `write` per
/// chunk on the sender and one `read` of at most 4 KiB per step on the receiver.
fn plasma_chunks(size: u64, concurrency: usize) -> Result<Prepared, BenchError> {
    const CHUNK: usize = 4096;
    let payload = std::sync::Arc::new(vec![0x5au8; size as usize]);
    let addr = spawn_server(concurrency, move |mut stream| {
        let mut request = [0u8; 1];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&(payload.len() as u64).to_le_bytes())?;
            for chunk in payload.chunks(CHUNK) {
                stream.write_all(chunk)?;
            }
        }
        Ok(())
    })?;
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..concurrency {
        let mut stream = connect(addr)?;
        let mut buffer = destination(size);
        workers.push(Box::new(move || {
            timed(|| {
                let io = setup_error("plasma-4k");
                stream.write_all(&[1]).map_err(&io)?;
                let mut header = [0u8; 8];
                stream.read_exact(&mut header).map_err(&io)?;
                let len = u64::from_le_bytes(header) as usize;
                let mut cursor = 0;
                while cursor < len {
                    let end = (cursor + CHUNK).min(len);
                    let n = stream.read(&mut buffer[cursor..end]).map_err(&io)?;
                    if n == 0 {
                        return Err(BenchError::Setup("plasma-4k: server closed".into()));
                    }
                    cursor += n;
                }
                Ok(())
            })
        }));
    }
    Ok(Prepared {
        name: "plasma-4k".into(),
        workers,
        cleanup: None,
    })
}

/// A chunked pull like Ray's object manager: a request per 5 MiB chunk (offset, length), the
/// chunk read straight into place.
fn pulled_chunks(size: u64, concurrency: usize) -> Result<Prepared, BenchError> {
    const CHUNK: u64 = 5 << 20;
    let payload = std::sync::Arc::new(vec![0x5au8; size as usize]);
    let addr = spawn_server(concurrency, move |mut stream| {
        let mut request = [0u8; 16];
        while stream.read_exact(&mut request).is_ok() {
            let offset = u64::from_le_bytes(request[..8].try_into().expect("8 bytes")) as usize;
            let len = u64::from_le_bytes(request[8..].try_into().expect("8 bytes")) as usize;
            let chunk = payload
                .get(offset..offset.saturating_add(len))
                .ok_or_else(|| std::io::Error::other("chunk out of range"))?;
            stream.write_all(chunk)?;
        }
        Ok(())
    })?;
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..concurrency {
        let mut stream = connect(addr)?;
        let mut buffer = destination(size);
        workers.push(Box::new(move || {
            timed(|| {
                let io = setup_error("chunked-5m");
                let mut offset = 0u64;
                while offset < size || (size == 0 && offset == 0) {
                    let len = CHUNK.min(size - offset);
                    let mut request = [0u8; 16];
                    request[..8].copy_from_slice(&offset.to_le_bytes());
                    request[8..].copy_from_slice(&len.to_le_bytes());
                    stream.write_all(&request).map_err(&io)?;
                    stream
                        .read_exact(&mut buffer[offset as usize..(offset + len) as usize])
                        .map_err(&io)?;
                    offset += len;
                    if size == 0 {
                        break;
                    }
                }
                Ok(())
            })
        }));
    }
    Ok(Prepared {
        name: "chunked-5m".into(),
        workers,
        cleanup: None,
    })
}

/// A `redis-server` on a free loopback port, without persistence, stopped on drop.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start(largest: u64) -> Result<Self, String> {
        let port = free_loopback_port()?;
        let max_bulk = (largest + (1 << 20)).max(512 << 20).to_string();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--proto-max-bulk-len", &max_bulk])
            .args(["--client-query-buffer-limit", &max_bulk])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start redis-server ({e}); install it (ci/install-deps.sh)")
            })?;
        let server = Self { child, port };
        let started = Instant::now();
        loop {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                let mut reply = [0u8; 7];
                if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
                    && stream.read_exact(&mut reply).is_ok()
                {
                    eprintln!("redis baseline: redis-server on 127.0.0.1:{port}");
                    return Ok(server);
                }
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not answer within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn prepare(&self, size: u64, concurrency: usize) -> Result<Prepared, BenchError> {
        let io = setup_error("redis");
        let key = format!("skyriver-bench-{size}");
        let mut stream = connect(std::net::SocketAddr::from(([127, 0, 0, 1], self.port)))?;
        let mut command =
            format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${size}\r\n", key.len()).into_bytes();
        command.extend(std::iter::repeat_n(0x5au8, size as usize));
        command.extend_from_slice(b"\r\n");
        stream.write_all(&command).map_err(&io)?;
        drop(command);
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).map_err(&io)?;
        if &reply != b"+OK\r\n" {
            return Err(BenchError::Setup(format!(
                "redis SET answered {:?}",
                String::from_utf8_lossy(&reply)
            )));
        }
        let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).into_bytes();
        let mut workers: Vec<Worker> = Vec::new();
        for _ in 0..concurrency {
            let mut reader = BufReader::with_capacity(
                64 * 1024,
                connect(std::net::SocketAddr::from(([127, 0, 0, 1], self.port)))?,
            );
            let mut buffer = destination(size);
            let get = get.clone();
            let mut line = String::new();
            workers.push(Box::new(move || {
                timed(|| {
                    let io = setup_error("redis GET");
                    reader.get_mut().write_all(&get).map_err(&io)?;
                    line.clear();
                    reader.read_line(&mut line).map_err(&io)?;
                    let len: usize = line
                        .strip_prefix('$')
                        .and_then(|l| l.trim_end().parse().ok())
                        .ok_or_else(|| BenchError::Setup(format!("redis GET answered {line:?}")))?;
                    if len != buffer.len() {
                        return Err(BenchError::Setup(format!("redis GET returned {len} bytes")));
                    }
                    reader.read_exact(&mut buffer).map_err(&io)?;
                    let mut crlf = [0u8; 2];
                    reader.read_exact(&mut crlf).map_err(&io)?;
                    Ok(())
                })
            }));
        }
        let port = self.port;
        Ok(Prepared {
            name: "redis".into(),
            workers,
            cleanup: Some(Box::new(move || {
                if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                    let del = format!("*2\r\n$3\r\nDEL\r\n${}\r\n{key}\r\n", key.len());
                    let _ = stream.write_all(del.as_bytes());
                    let mut reply = [0u8; 4];
                    let _ = stream.read_exact(&mut reply);
                }
            })),
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
