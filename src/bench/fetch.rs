//! `bench fetch`: fetch bandwidth, latency and objects/s between daemons on this machine, by
//! object size and transfer mode, side by side with baselines measured in the same run (see
//! [`super::baselines`]): raw TCP streams, default and tuned like the fabric; the raw Unix-socket
//! and TCP round trips a small fetch cannot beat; Plasma-style 4 KiB chunks, 5 MiB chunked
//! pulls and Redis GET.
//!
//! The Skyriver modes share one two-daemon cluster (`skyriver up`, threshold from the cost
//! model): each fetch names its mode, eager or rendezvous forced, or auto. One iteration
//! fetches an object held by node 0 into node 1 and then deletes the copy, so every iteration
//! moves the bytes again (the requester remembers where the object lives, as it would for any
//! object fetched before; the 1 KiB breakdown also times a first fetch, with its lookup). With
//! `--concurrency 1` the systems take turns, one iteration each per round, so every ratio
//! compares numbers taken under the same load and in the same daemons; the round trips are
//! measured after the smallest size, apart, once the daemons stopped polling (both ends poll
//! as the daemons and client do, so the floor gets the same tuning).
//!
//! `--cpus` places the processes (see [`super::CpuPlacement`]); each system's samples are split
//! into `--repeats` consecutive parts whose p50s show how much a median moves between repeats.
//! The targets are printed as met or missed, every size counted.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::baselines::{self, Prepared, RedisServer, StreamTuning, Worker};
use super::{
    pin_process, pin_this_thread, verdict, BenchError, CaseResult, CpuPlacement, MachineInfo,
};
use crate::up::{LocalCluster, UpArgs};
use skyriver_client::Client;
use skyriver_core::{ObjectId, TransferMode};
use skyriver_daemon::size::{format_bytes, ByteSize};

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
    /// Baselines measured in the same run (none: `--baselines ''`): `tcp` (a raw TCP stream,
    /// kernel defaults), `tcp-tuned` (the fabric's socket buffers and write size), `uds-rtt`,
    /// `tcp-rtt` (1 byte each way), `tcp-rr-1k` (1 KiB each way), `plasma-4k`, `chunked-5m`,
    /// `redis`.
    #[arg(long, value_delimiter = ',',
          default_value = "tcp,tcp-tuned,uds-rtt,tcp-rtt,tcp-rr-1k,plasma-4k,chunked-5m,redis",
          value_parser = ["tcp", "tcp-tuned", "uds-rtt", "tcp-rtt", "tcp-rr-1k", "plasma-4k",
                          "chunked-5m", "redis", ""])]
    pub baselines: Vec<String>,
    /// Where the processes run. `pinned`: this process, both daemons and every baseline
    /// server on one vCPU, so a hand-off is a switch on an awake CPU (the floor of a busy
    /// machine). `spread`: this process and the holder (node 0) on one vCPU, the requester
    /// (node 1) and the baseline servers on another, so every hop wakes an idle CPU (a quiet
    /// machine). Recorded in the JSON and printed over every table.
    #[arg(long, value_enum, default_value_t = CpuPlacement::Spread)]
    pub cpus: CpuPlacement,
    /// Parts each system's samples are split into (consecutive in time): the tables show the
    /// lowest and highest p50 of the parts next to the p50 of all samples.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
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
    /// Verbs: also run every mode with daemons started with --no-memory-windows (rows
    /// `MODE@arena-keys`), interleaved with the others: what scoping each lease's READs with
    /// memory windows costs.
    #[arg(long)]
    pub arena_keys: bool,
    /// Start the daemons with --learn-locations: the head pushes each publication to the other
    /// node, so the 1 KiB breakdown's first fetch goes straight to the holder.
    #[arg(long)]
    pub learn_locations: bool,
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
    /// The path the fetches took: `eager` forced above the eager capacity runs as a
    /// rendezvous.
    ran_as: String,
    #[serde(flatten)]
    result: CaseResult,
    /// Bandwidth relative to the raw TCP stream at this size.
    ratio_to_tcp: f64,
    /// Bandwidth relative to each baseline measured at this size.
    ratios: std::collections::BTreeMap<String, f64>,
}

/// Auto against the better forced mode at one size where both paths exist (at most what
/// the receive slots take eagerly).
#[derive(Debug, Clone, Serialize)]
struct AutoRow {
    size_bytes: u64,
    eager: CaseResult,
    rendezvous: CaseResult,
    auto: CaseResult,
    /// auto p50 / the better forced p50 (the target is ≤ 1.10).
    auto_over_best: f64,
    within_10_percent: bool,
}

pub(super) fn run(args: &FetchArgs) -> Result<(), BenchError> {
    let concurrency = args.concurrency.max(1);
    let largest = args.sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let memory = ByteSize((largest * (2 * concurrency as u64 + 1)).max(128 << 20));
    let exe = crate::self_exe().map_err(BenchError::OwnPath)?;
    let baselines = super::chosen_baselines(&args.baselines);
    let (near, far) = args.cpus.cpus();
    if args.cpus == CpuPlacement::Pinned {
        // Before anything starts, so the daemons are born on this CPU (their connect-time
        // cost measurement included).
        pin_this_thread(near)?;
    }
    eprintln!("{}", args.cpus.describe());

    let redis = if baselines.iter().any(|b| b == "redis") {
        match RedisServer::start(largest, far) {
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
        .map(|m| m.parse().map_err(BenchError::Usage))
        .collect::<Result<_, _>>()?;
    let mut clusters = Vec::new();
    let mut builds = vec![(String::new(), exe.clone(), false, Vec::new())];
    if let Some(other) = &args.compare_exe {
        builds.push(("@other".to_string(), other.clone(), false, Vec::new()));
    }
    if args.metrics {
        builds.push(("@metrics".to_string(), exe.clone(), true, Vec::new()));
    }
    if args.arena_keys {
        let flag = vec!["--no-memory-windows".to_string()];
        builds.push(("@arena-keys".to_string(), exe.clone(), false, flag));
    }
    if modes.is_empty() {
        builds.clear();
    }
    for (suffix, exe, metrics, daemon_args) in &builds {
        eprintln!(
            "starting two daemons{suffix} with {} each...",
            format_bytes(memory.0)
        );
        // No --dir: the cluster makes its own directory and removes it when dropped.
        let mut up = UpArgs::new(2, memory, None);
        up.fabric = args.fabric.clone();
        up.devices = args.devices.clone();
        up.metrics = *metrics;
        up.daemon_args.extend(daemon_args.iter().cloned());
        if args.learn_locations {
            up.daemon_args.push("--learn-locations".into());
        }
        let cluster = LocalCluster::start_tied_to_this_thread(&up, exe)?;
        for (pid, cpu) in cluster.pids().into_iter().zip([near, far]) {
            if let Some(pid) = pid {
                pin_process(pid, cpu)?;
            }
        }
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

    pin_this_thread(near)?;
    let budget = Duration::from_millis(args.millis_per_case);
    let mut measured: Vec<(String, CaseResult)> = Vec::new();
    let mut round_trips: Vec<CaseResult> = Vec::new();
    // The round trips do not depend on the size: they run in the rounds of the smallest.
    let round_trip_size = args.sizes.iter().map(|s| s.0).min();
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
        let mut rtt_systems = Vec::new();
        let with_round_trips = concurrency == 1 && Some(size) == round_trip_size;
        for baseline in &baselines {
            let prepared = match baseline.as_str() {
                "tcp" => Some(baselines::tcp_stream(
                    size,
                    concurrency,
                    far,
                    StreamTuning::Default,
                )?),
                "tcp-tuned" => Some(baselines::tcp_stream(
                    size,
                    concurrency,
                    far,
                    StreamTuning::Fabric,
                )?),
                // The round trips run apart, below: not among spinning daemons.
                "uds-rtt" if with_round_trips => {
                    rtt_systems.push(baselines::uds_round_trip(Some(far))?);
                    None
                }
                "tcp-rtt" if with_round_trips => {
                    rtt_systems.push(baselines::tcp_round_trip(1, Some(far))?);
                    None
                }
                "tcp-rr-1k" if with_round_trips => {
                    rtt_systems.push(baselines::tcp_round_trip(1024, Some(far))?);
                    None
                }
                "plasma-4k" => Some(baselines::plasma_chunks(size, concurrency, far)?),
                "chunked-5m" => Some(baselines::pulled_chunks(size, concurrency, far)?),
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
        let mut results = if concurrency == 1 {
            measure_interleaved(
                &mut systems,
                size,
                budget,
                args.max_iterations,
                args.repeats,
            )?
        } else {
            measure_concurrent(&mut systems, size, budget, args.max_iterations)?
        };
        if !rtt_systems.is_empty() {
            // The floor as a small program measures it: both ends poll like the daemons and
            // the client do, on a machine the daemons leave alone (they stopped polling after
            // their last fetch; spinning daemons on the same vCPUs would inflate it).
            std::thread::sleep(IDLE_DAEMONS);
            results.extend(measure_interleaved(
                &mut rtt_systems,
                size,
                budget,
                args.max_iterations,
                args.repeats,
            )?);
        }
        for system in systems {
            if let Some(cleanup) = system.cleanup {
                cleanup();
            }
        }
        for (name, mut result) in results {
            match ROUND_TRIPS.iter().find(|(n, _)| *n == name) {
                Some(&(_, bytes)) => {
                    result.size_bytes = bytes;
                    round_trips.push(result);
                }
                None => measured.push((name, result)),
            }
        }
    }
    let auto_threshold = clusters.first().and_then(|c| c.threshold);
    let eager_capacity = clusters.first().map_or(u64::MAX, |c| c.eager_capacity);
    let breakdown = match clusters.first() {
        Some(cluster) => Some(cluster.small_fetch_breakdown(budget)?),
        None => None,
    };
    drop(clusters);
    for (suffix, ..) in &builds {
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
            ran_as: match (mode, result.size_bytes > eager_capacity) {
                ("eager", true) => "rendezvous".to_string(),
                _ => mode.to_string(),
            },
            result: result.clone(),
            ratio_to_tcp: ratios.get("tcp").copied().unwrap_or(0.0),
            ratios,
        });
    }
    let auto_rows = auto_against_forced(&measured, &args.sizes, eager_capacity);
    let columns: Vec<String> = baselines
        .iter()
        .filter(|b| !ROUND_TRIPS.iter().any(|(n, _)| n == b))
        .cloned()
        .collect();

    println!("{}", args.cpus.describe());
    print_table(&measured, &columns, eager_capacity);
    print_round_trips(&round_trips);
    if modes.len() == 3 {
        print_auto_table(
            &auto_rows,
            &auto_threshold,
            eager_capacity,
            &args.sizes,
            args.repeats,
        );
    }
    if let Some(b) = &breakdown {
        println!(
            "a 1 KiB fetch (auto mode) next to the requests around it, p50 of interleaved calls from the requester's client:"
        );
        println!(
            "  local request (contains)                   {:>8.1} µs",
            b.local_rpc_p50_us
        );
        println!(
            "  directory lookup (locate)                  {:>8.1} µs",
            b.locate_p50_us
        );
        if args.learn_locations {
            println!(
                "  first fetch of an object (pushed location) {:>8.1} µs",
                b.first_fetch_p50_us
            );
        } else {
            println!(
                "  first fetch of an object (lookup, transfer) {:>7.1} µs",
                b.first_fetch_p50_us
            );
        }
        println!(
            "  first fetch naming the holder (hint)       {:>8.1} µs",
            b.hinted_first_fetch_p50_us
        );
        println!(
            "  fetch again (location remembered)          {:>8.1} µs",
            b.fetch_p50_us
        );
        println!(
            "  put, its seal checked by the directory     {:>8.1} µs",
            b.put_p50_us
        );
        println!(
            "  (each line is measured on its own; `skyriver bench breakdown` times every hop)"
        );
        let first = if args.learn_locations {
            "a first fetch, locations learned"
        } else {
            "a first fetch"
        };
        for (what, p50) in [
            (first, b.first_fetch_p50_us),
            (
                "a first fetch naming the holder",
                b.hinted_first_fetch_p50_us,
            ),
        ] {
            let r = p50 / b.fetch_p50_us.max(f64::MIN_POSITIVE);
            println!(
                "  target: {what} ≤ 1.3× a fetch again: {r:.2}×  {}",
                verdict((r * 100.0).round() / 100.0 <= 1.3)
            );
        }
        println!();
    }
    let sizes_bytes: Vec<u64> = args.sizes.iter().map(|s| s.0).collect();
    let digest_costs =
        super::digest_cost::measure(&sizes_bytes, &measured, Duration::from_millis(200));
    super::digest_cost::print(&digest_costs);
    if args.fabric == "tcp" {
        print_targets(
            &measured,
            &round_trips,
            &auto_rows,
            &args.sizes,
            eager_capacity,
        );
    }

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
        "cpus": args.cpus,
        "cpu_ids": args.cpus.cpus(),
        "repeats": args.repeats,
        "learn_locations": args.learn_locations,
        "machine": MachineInfo::probe(),
        "raw_tcp": tcp,
        "tcp_tuned": {
            "socket_buffer_bytes": baselines::fabric_stream_settings().0,
            "write_bytes": baselines::fabric_stream_settings().1,
        },
        "round_trips": round_trips,
        "results": rows,
        "systems": by_system,
        "auto_vs_forced": auto_rows,
        "auto_threshold_bytes": auto_threshold,
        "eager_capacity_bytes": eager_capacity,
        "breakdown_1kib": breakdown,
        "verification": digest_costs,
    });
    std::fs::write(
        &args.json,
        serde_json::to_string_pretty(&document).expect("results serialize"),
    )
    .map_err(|e| BenchError::Io {
        what: format!("cannot write {}", args.json.display()),
        source: e,
    })?;
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
    std::fs::write(&args.plot, super::plot::svg(&title, &series)).map_err(|e| BenchError::Io {
        what: format!("cannot write {}", args.plot.display()),
        source: e,
    })?;
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
    /// A first fetch that names the holder (`fetch_from`): no lookup.
    hinted_first_fetch_p50_us: f64,
    /// A 1 KiB put on the requester, whose directory is the other node: its seal waits for
    /// the directory to accept the publication (one id, one content).
    put_p50_us: f64,
}

/// The round-trip baselines and the bytes they send each way.
const ROUND_TRIPS: [(&str, u64); 3] = [("uds-rtt", 1), ("tcp-rtt", 1), ("tcp-rr-1k", 1024)];

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
        let holder_node = self.holder.node();
        let (mut local, mut locate, mut first, mut again, mut hinted, mut put) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
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
            // Another new object, fetched naming its holder, as an MPI rank that knows the
            // producer does.
            let fresh = bench_object_id((usize::MAX >> 1) - 1, round % 4096, round / 4096);
            self.holder.create_and_seal(fresh, &data, b"")?;
            let begin = Instant::now();
            let mut objects =
                requester.fetch_from(&[fresh], Some(Duration::from_secs(10)), holder_node)?;
            hinted.push(begin.elapsed());
            let object = objects.pop().expect("one reply per id").map_err(|e| {
                BenchError::Check(format!("a hinted fetch of a new object failed: {e}"))
            })?;
            drop(object);
            requester.flush()?;
            requester.delete(&[fresh])?;
            self.holder.delete(&[fresh])?;
            let begin = Instant::now();
            requester.put(id, &data, b"")?;
            put.push(begin.elapsed());
            requester.delete(&[id])?;
        }
        let p50 = |samples: &mut Vec<Duration>| CaseResult::from_samples("", 1024, samples).p50_us;
        Ok(Breakdown {
            local_rpc_p50_us: p50(&mut local),
            locate_p50_us: p50(&mut locate),
            put_p50_us: p50(&mut put),
            first_fetch_p50_us: p50(&mut first),
            fetch_p50_us: p50(&mut again),
            hinted_first_fetch_p50_us: p50(&mut hinted),
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
/// Longer than the daemons' polling window (`--poll-us`, 50 µs by default): after it they
/// sleep, and take no CPU from the raw round trips.
const IDLE_DAEMONS: Duration = Duration::from_millis(5);

fn measure_interleaved(
    systems: &mut [Prepared],
    size: u64,
    budget: Duration,
    max_iterations: usize,
    repeats: usize,
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
                CaseResult::with_repeats(&system.name, size, samples, repeats),
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
                    h.join()
                        .unwrap_or_else(|_| Err(BenchError::ThreadPanicked("benchmark client")))
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

/// Auto against the better forced mode at every size where forced eager is possible (object
/// at most the eager capacity); above it every mode runs the same rendezvous path and there
/// is nothing to choose, so nothing is compared.
fn auto_against_forced(
    measured: &[(String, CaseResult)],
    sizes: &[ByteSize],
    eager_capacity: u64,
) -> Vec<AutoRow> {
    let find = |mode: &str, size: u64| {
        measured
            .iter()
            .find(|(name, r)| name == &format!("skyriver-{mode}") && r.size_bytes == size)
            .map(|(_, r)| r.clone())
    };
    sizes
        .iter()
        .filter(|&&ByteSize(size)| size <= eager_capacity)
        .filter_map(|&ByteSize(size)| {
            let eager = find("eager", size)?;
            let rendezvous = find("rendezvous", size)?;
            let auto = find("auto", size)?;
            let best = eager.p50_us.min(rendezvous.p50_us).max(f64::MIN_POSITIVE);
            let auto_over_best = auto.p50_us / best;
            Some(AutoRow {
                size_bytes: size,
                eager,
                rendezvous,
                auto,
                auto_over_best,
                // Judged at the two decimals the table prints.
                within_10_percent: (auto_over_best * 100.0).round() <= 110.0,
            })
        })
        .collect()
}

/// The suffix of a forced-eager row above the eager capacity: such a fetch runs as a rendezvous.
const RAN_AS_RENDEZVOUS: &str = " (rdv)";

/// How the table names a system's row at `size`: forced eager above the eager capacity is
/// marked, since only a rendezvous exists there.
fn row_label(name: &str, size: u64, eager_capacity: u64) -> String {
    if name.starts_with("skyriver-eager") && size > eager_capacity {
        format!("{name}{RAN_AS_RENDEZVOUS}")
    } else {
        name.to_string()
    }
}

fn print_table(measured: &[(String, CaseResult)], baselines: &[String], eager_capacity: u64) {
    println!(
        "fetch over loopback, side by side (ratios: bandwidth / the baseline's at that size; \
         p50 range: lowest–highest p50 of the run's repeats)"
    );
    print!(
        "{:>10} {:<24} {:>10} {:>10} {:>13} {:>10} {:>10}",
        "size", "system", "MB/s", "p50 µs", "p50 range", "p99 µs", "objects/s"
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
        let label = row_label(name, result.size_bytes, eager_capacity);
        print!(
            "{size:>10} {label:<24} {:>10.1} {:>10.1} {:>13} {:>10.1} {:>10.0}",
            result.mb_per_sec,
            result.p50_us,
            result.repeats_range(),
            result.p99_us,
            result.ops_per_sec
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
    if measured
        .iter()
        .any(|(name, r)| row_label(name, r.size_bytes, eager_capacity) != *name)
    {
        println!(
            "{RAN_AS_RENDEZVOUS}: eager forced above the eager capacity ({}) runs as a rendezvous",
            format_bytes(eager_capacity)
        );
    }
    println!();
}

fn print_round_trips(round_trips: &[CaseResult]) {
    if round_trips.is_empty() {
        return;
    }
    println!("raw round trips (the floor of a small request; both ends poll like the daemons and client, measured while the daemons are idle):");
    println!(
        "  {:<12} {:>9} {:>10} {:>13} {:>10}",
        "system", "each way", "p50 µs", "p50 range", "p99 µs"
    );
    for r in round_trips {
        println!(
            "  {:<12} {:>9} {:>10.1} {:>13} {:>10.1}",
            r.operation,
            format_bytes(r.size_bytes),
            r.p50_us,
            r.repeats_range(),
            r.p99_us
        );
    }
    println!();
}

fn print_auto_table(
    rows: &[AutoRow],
    threshold: &Option<u64>,
    eager_capacity: u64,
    sizes: &[ByteSize],
    repeats: usize,
) {
    println!(
        "auto against forced modes, where both paths exist (object ≤ eager capacity {}){}:",
        format_bytes(eager_capacity),
        match threshold {
            Some(bytes) => format!("; auto threshold {}", format_bytes(*bytes)),
            None => String::new(),
        }
    );
    println!(
        "  p50 of all samples, [lowest–highest p50 of {repeats} repeats]; target: auto ≤ 1.10 × the better forced mode"
    );
    println!(
        "{:>10} {:>24} {:>24} {:>24} {:>10} {:>8}",
        "size", "eager µs", "rendezvous µs", "auto µs", "auto/best", "≤ 1.10"
    );
    let cell = |r: &CaseResult| format!("{:.1} [{}]", r.p50_us, r.repeats_range());
    for row in rows {
        println!(
            "{:>10} {:>24} {:>24} {:>24} {:>10.2} {:>8}",
            format_bytes(row.size_bytes),
            cell(&row.eager),
            cell(&row.rendezvous),
            cell(&row.auto),
            row.auto_over_best,
            super::verdict(row.within_10_percent)
        );
    }
    let above: Vec<String> = sizes
        .iter()
        .filter(|s| s.0 > eager_capacity)
        .map(|s| format_bytes(s.0))
        .collect();
    if !above.is_empty() {
        println!(
            "  not compared: {} (above the eager capacity only rendezvous exists)",
            above.join(", ")
        );
    }
    println!();
}

/// What an auto-mode result is held to, printed as met or missed; ratios from this run.
fn print_targets(
    measured: &[(String, CaseResult)],
    round_trips: &[CaseResult],
    auto_rows: &[AutoRow],
    sizes: &[ByteSize],
    eager_capacity: u64,
) {
    let find = |name: &str, size: u64| {
        measured
            .iter()
            .find(|(n, r)| n == name && r.size_bytes == size)
            .map(|(_, r)| r)
    };
    // Ratios are judged at the two decimals printed, as in the auto table.
    let shown = |r: f64| (r * 100.0).round() / 100.0;
    println!("targets (auto mode over the TCP fabric, this run):");
    let trip = |name: &str| round_trips.iter().find(|r| r.operation == name);
    match (find("skyriver-auto", 1024), trip("uds-rtt"), trip("tcp-rtt")) {
        (Some(fetch), Some(uds), Some(tcp)) => {
            let floor = uds.p50_us + tcp.p50_us;
            let r = fetch.p50_us / floor.max(f64::MIN_POSITIVE);
            println!(
                "  1 KiB fetch p50 ≤ 2× (UDS + TCP round trip): {:.1} µs / ({:.1} + {:.1} µs) = {r:.2}×  {}",
                fetch.p50_us,
                uds.p50_us,
                tcp.p50_us,
                verdict(shown(r) <= 2.0)
            );
        }
        _ => println!(
            "  1 KiB fetch p50 ≤ 2× (UDS + TCP round trip): not measured (needs 1KiB, auto, uds-rtt, tcp-rtt)"
        ),
    }
    let mut measured_any = false;
    for &ByteSize(size) in sizes.iter().filter(|s| s.0 >= 16 << 20) {
        if let (Some(auto), Some(tuned)) = (find("skyriver-auto", size), find("tcp-tuned", size)) {
            measured_any = true;
            let r = ratio(auto, tuned);
            println!(
                "  ≥ 0.9× the tuned TCP stream at {:>9}: {r:.2}×  {}",
                format_bytes(size),
                verdict(shown(r) >= 0.9)
            );
        }
    }
    if !measured_any {
        println!("  ≥ 0.9× the tuned TCP stream at ≥ 16 MiB: not measured (needs sizes ≥ 16MiB, tcp-tuned)");
    }
    if auto_rows.is_empty() {
        println!("  auto within 10% of the better forced mode: not measured (needs all three modes at sizes ≤ {})", format_bytes(eager_capacity));
    } else {
        let missed: Vec<String> = auto_rows
            .iter()
            .filter(|r| !r.within_10_percent)
            .map(|r| format!("{} ({:.2}×)", format_bytes(r.size_bytes), r.auto_over_best))
            .collect();
        println!(
            "  auto within 10% of the better forced mode at every size ≤ {}: {} of {} sizes  {}{}",
            format_bytes(eager_capacity),
            auto_rows.len() - missed.len(),
            auto_rows.len(),
            verdict(missed.is_empty()),
            if missed.is_empty() {
                String::new()
            } else {
                format!(" at {}", missed.join(", "))
            }
        );
    }
    if let (Some(auto), Some(plasma)) =
        (find("skyriver-auto", 16 << 20), find("plasma-4k", 16 << 20))
    {
        let r = ratio(auto, plasma);
        println!(
            "  ≥ 8× Plasma 4 KiB chunks at 16 MiB: {r:.2}×  {}",
            verdict(shown(r) >= 8.0)
        );
    }
    for &ByteSize(size) in sizes.iter().filter(|s| s.0 >= 1 << 20) {
        if let (Some(auto), Some(redis)) = (find("skyriver-auto", size), find("redis", size)) {
            let r = ratio(auto, redis);
            println!(
                "  ≥ 2× Redis GET at {:>9}: {r:.2}×  {}",
                format_bytes(size),
                verdict(shown(r) >= 2.0)
            );
        }
    }
    println!();
}

#[cfg(test)]
mod label_tests {
    use super::*;

    #[test]
    fn forced_eager_above_the_eager_capacity_is_labelled_as_the_rendezvous_it_is() {
        let capacity = 256 << 10;
        assert_eq!(
            row_label("skyriver-eager", 4 << 10, capacity),
            "skyriver-eager"
        );
        assert_eq!(
            row_label("skyriver-eager", capacity, capacity),
            "skyriver-eager"
        );
        assert_eq!(
            row_label("skyriver-eager", 1 << 20, capacity),
            "skyriver-eager (rdv)"
        );
        assert_eq!(
            row_label("skyriver-auto", 1 << 20, capacity),
            "skyriver-auto"
        );
        assert_eq!(row_label("tcp", 1 << 20, capacity), "tcp");
    }
}
