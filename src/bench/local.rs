//! `bench local`: the local store through the real daemon and client: create+seal, put (as
//! `Client::put`: one round trip with the bytes up to 64 KiB), create+write+seal (the
//! zero-copy writer) against a plain memcpy into pre-faulted memory measured in the same run, zero-copy get+release, batched gets, get with a full read, contains and delete; next to
//! the raw Unix-socket and TCP round trips that any request to the daemon costs at least, with
//! the targets for small puts and gets printed as met or missed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::baselines;
use super::{
    pin_process, pin_this_thread, BenchError, CaseResult, ChildDaemon, CpuPlacement, MachineInfo,
    Scraper, Timer,
};
use skyriver_client::Client;
use skyriver_core::ObjectId;
use skyriver_daemon::size::{format_bytes, ByteSize};

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
    #[arg(long, value_enum, default_value_t = skyriver_daemon::persistence::Durability::Seal)]
    pub durability: skyriver_daemon::persistence::Durability,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-local.json")]
    pub json: PathBuf,
    /// Also run every case against a second daemon with --metrics, scraped each second, and
    /// print the ratio on / off (rows marked [metrics]).
    #[arg(long)]
    pub metrics: bool,
    /// Where the client and the daemon run: `pinned` (both on one vCPU: a request is a switch
    /// on an awake CPU) or `spread` (different vCPUs: each request wakes an idle one). The raw
    /// round trips run the same way. Recorded in the JSON and printed over the table.
    #[arg(long, value_enum, default_value_t = CpuPlacement::Spread)]
    pub cpus: CpuPlacement,
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

/// Runs `bench local`.
pub(super) fn run(args: &LocalArgs) -> Result<(), BenchError> {
    let largest = args.sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let (near, far) = args.cpus.cpus();
    if args.cpus == CpuPlacement::Pinned {
        pin_this_thread(near)?;
    }
    eprintln!("{}", args.cpus.describe());
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
    match &daemon {
        Some(daemon) => pin_process(daemon.pid(), far)?,
        None => eprintln!("--socket: the daemon is not moved; only this process is placed"),
    }
    pin_this_thread(near)?;
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
            let port = crate::up::free_loopback_port().map_err(|e| BenchError::Io {
                what: "no free loopback port".into(),
                source: e,
            })?;
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let daemon =
                ChildDaemon::start_with(memory, &["--metrics".into(), addr.to_string().into()])?;
            pin_process(daemon.pid(), far)?;
            let client = Client::connect(daemon.socket())?;
            Some((daemon, client, Scraper::start(addr, Duration::from_secs(1))))
        }
        (true, Some(_)) => {
            return Err(BenchError::Usage(
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
    eprintln!("measuring raw round trips...");
    let round_trips = measure_round_trips(&timer, far)?;
    if let Some((_, _, scraper)) = metered {
        eprintln!("{} scrapes of /metrics during the run", scraper.stop());
        print_metrics_overhead(&results);
    }
    println!("{}", args.cpus.describe());
    print_local_table(&results, &round_trips);
    write_json(&args.json, args.cpus, &results, &round_trips)?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// The raw round trips next to which the daemon's requests are read: 1 byte each way over a
/// Unix socket (what a request to the daemon costs at least) and over TCP loopback.
fn measure_round_trips(timer: &Timer, far: usize) -> Result<Vec<CaseResult>, BenchError> {
    let mut results = Vec::new();
    for (mut prepared, bytes) in [
        (baselines::uds_round_trip(Some(far))?, 1),
        (baselines::tcp_round_trip(1, Some(far))?, 1),
    ] {
        let worker = &mut prepared.workers[0];
        // Untimed once: the server thread starts and binds itself.
        worker()?;
        let mut samples = timer.measure(|_| Ok(()), |()| worker(), |_| Ok(()))?;
        results.push(CaseResult::from_samples(
            &prepared.name,
            bytes,
            &mut samples,
        ));
    }
    Ok(results)
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

    // Each write case makes a fresh object per iteration (timed) and deletes it (untimed).
    let mut write_case = |name: &str,
                          write: &mut dyn FnMut(ObjectId) -> Result<(), BenchError>|
     -> Result<(), BenchError> {
        let mut samples = timer.measure(
            |_| Ok(fresh_id(counter)),
            |id| write(id).map(|()| id),
            |id| {
                client.delete(&[id])?;
                Ok(())
            },
        )?;
        results.push(CaseResult::from_samples(
            &format!("{name}{tag}"),
            size,
            &mut samples,
        ));
        Ok(())
    };
    // create + seal (no data written): the control-path round trips.
    write_case("create+seal", &mut |id| {
        client.create(id, size, 0)?.seal()?;
        Ok(())
    })?;
    // put, as users call it (`Client::put`): one round trip carrying the bytes up to 64 KiB,
    // create + copy into the mapping + seal above.
    write_case("put", &mut |id| Ok(client.put(id, &source, b"")?))?;
    // The zero-copy writer: create, copy the data into the mapping, seal (two round trips).
    write_case("create+write+seal", &mut |id| {
        let mut writer = client.create(id, size, 0)?;
        writer.data_mut().copy_from_slice(&source);
        writer.seal()?;
        Ok(())
    })?;

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

fn print_local_table(results: &[CaseResult], round_trips: &[CaseResult]) {
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
    for r in round_trips {
        println!(
            "{:<26} {:>10} {:>8} {:>12.0} {:>11} {:>10.1} {:>10.1}",
            format!("raw {} (each way)", r.operation),
            format_bytes(r.size_bytes),
            r.iterations,
            r.ops_per_sec,
            "",
            r.p50_us,
            r.p99_us
        );
    }
    println!();
    print_round_trip_targets(results, round_trips);
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
            super::verdict(batched.ops_per_sec >= 200_000.0)
        );
    }
}

/// Small put and local get p50 against the raw UDS round trip of the same run.
fn print_round_trip_targets(results: &[CaseResult], round_trips: &[CaseResult]) {
    let Some(uds) = round_trips.iter().find(|r| r.operation == "uds-rtt") else {
        return;
    };
    let smallest = results.iter().map(|r| r.size_bytes).min();
    for (what, operation) in [
        ("small put", "put"),
        ("local get", "get+release (zero-copy)"),
    ] {
        let Some(case) = results
            .iter()
            .find(|r| r.operation == operation && Some(r.size_bytes) == smallest)
        else {
            continue;
        };
        let ratio = case.p50_us / uds.p50_us.max(f64::MIN_POSITIVE);
        println!(
            "{what} ({}) p50 ≤ 1.5× the raw UDS round trip: {:.1} µs / {:.1} µs = {ratio:.2}×  {}",
            format_bytes(case.size_bytes),
            case.p50_us,
            uds.p50_us,
            // Judged at the two decimals printed.
            super::verdict((ratio * 100.0).round() <= 150.0)
        );
    }
}

fn write_json(
    path: &Path,
    cpus: CpuPlacement,
    results: &[CaseResult],
    round_trips: &[CaseResult],
) -> Result<(), BenchError> {
    let document = serde_json::json!({
        "benchmark": "local",
        "cpus": cpus,
        "cpu_ids": cpus.cpus(),
        "machine": MachineInfo::probe(),
        "results": results,
        "round_trips": round_trips,
    });
    let text = serde_json::to_string_pretty(&document).expect("results serialize");
    std::fs::write(path, text).map_err(|e| BenchError::Io {
        what: format!("cannot write {}", path.display()),
        source: e,
    })
}
