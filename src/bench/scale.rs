//! `bench scale`: one daemon holding many small objects, then many concurrent clients doing a
//! mixed get/put workload against it.
//!
//! Metadata bytes per object are measured, not computed: the growth of the daemon's anonymous
//! resident memory (`RssAnon` in `/proc/PID/status`: heap, object table, indexes, allocator
//! overhead) while the objects are created, divided by their number. Object bytes live in the
//! shared arena (`RssShmem`, pre-faulted at start), so they do not count.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{BenchError, CaseResult, ChildDaemon, MachineInfo};
use skyriver_client::Client;
use skyriver_core::ObjectId;
use skyriver_daemon::size::{format_bytes, ByteSize};

/// Options of `bench scale`.
#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Objects created before the mixed workload.
    #[arg(long, default_value_t = 1_000_000)]
    pub objects: u64,
    /// Size of each object.
    #[arg(long, default_value = "64B")]
    pub object_size: ByteSize,
    /// Client threads filling the store.
    #[arg(long, default_value_t = 8)]
    pub fill_clients: usize,
    /// Concurrent clients of the mixed workload, one connection each.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Share of gets in the mixed workload (the rest are puts of new objects).
    #[arg(long, default_value_t = 0.9)]
    pub get_fraction: f64,
    /// Length of the mixed workload.
    #[arg(long, default_value_t = 5000)]
    pub millis: u64,
    /// Run the daemon as its own cluster head (built-in directory and TCP fabric on loopback),
    /// so the directory's state for every published object counts in the metadata too.
    #[arg(long)]
    pub head: bool,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-scale.json")]
    pub json: PathBuf,
}

#[derive(Debug, Serialize)]
struct ScaleReport {
    objects: u64,
    object_size_bytes: u64,
    head: bool,
    fill_seconds: f64,
    fill_objects_per_sec: f64,
    rss_anon_before_bytes: u64,
    rss_anon_after_bytes: u64,
    metadata_bytes_per_object: f64,
    clients: usize,
    mixed_seconds: f64,
    mixed_ops_per_sec: f64,
    errors: u64,
    get: CaseResult,
    put: CaseResult,
}

fn object_id(index: u64) -> ObjectId {
    let mut bytes = [0u8; 20];
    bytes[..8].copy_from_slice(b"scaleobj");
    bytes[12..].copy_from_slice(&index.to_be_bytes());
    ObjectId(bytes)
}

fn rss_anon_bytes(pid: u32) -> Result<u64, BenchError> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| BenchError::Io {
            what: "cannot read the daemon's memory use".into(),
            source: e,
        })?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| BenchError::Check("no RssAnon in /proc/PID/status".into()))
}

/// A small, fast, seeded generator for picking objects (no need for quality here).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub(super) fn run(args: &ScaleArgs) -> Result<(), BenchError> {
    let size = args.object_size.0;
    // Room for the objects, the puts of the mixed phase and allocator rounding.
    let memory = (args.objects * (size.max(64) * 4)).max(256 << 20);
    eprintln!(
        "starting a daemon with {} of memory for {} objects of {}...",
        format_bytes(memory),
        args.objects,
        format_bytes(size)
    );
    let cluster_args: Vec<std::ffi::OsString> = if args.head {
        [
            "--head",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--fabric",
            "tcp",
        ]
        .map(Into::into)
        .to_vec()
    } else {
        Vec::new()
    };
    let daemon = ChildDaemon::start_with(memory, &cluster_args)?;
    let pid = daemon.pid();
    let socket = daemon.socket().to_path_buf();
    let before = rss_anon_bytes(pid)?;

    let filled = AtomicU64::new(0);
    let started = Instant::now();
    let fill_clients = args.fill_clients.max(1) as u64;
    let data = vec![0x42u8; size as usize];
    std::thread::scope(|scope| -> Result<(), BenchError> {
        let handles: Vec<_> = (0..fill_clients)
            .map(|t| {
                let (socket, data, filled) = (&socket, &data, &filled);
                scope.spawn(move || -> Result<(), BenchError> {
                    let client = Client::connect(socket)?;
                    let mut index = t;
                    while index < args.objects {
                        client.create_and_seal(object_id(index), data, b"")?;
                        filled.fetch_add(1, Ordering::Relaxed);
                        index += fill_clients;
                    }
                    Ok(())
                })
            })
            .collect();
        let mut next_report = Instant::now() + Duration::from_secs(5);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if Instant::now() >= next_report {
                eprintln!(
                    "  filled {} of {} objects...",
                    filled.load(Ordering::Relaxed),
                    args.objects
                );
                next_report += Duration::from_secs(5);
            }
        }
        for handle in handles {
            handle
                .join()
                .map_err(|_| BenchError::ThreadPanicked("fill"))??;
        }
        Ok(())
    })?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let after = rss_anon_bytes(pid)?;
    let per_object = after.saturating_sub(before) as f64 / args.objects.max(1) as f64;
    eprintln!(
        "filled {} objects in {fill_seconds:.1} s; daemon anonymous memory {} → {}",
        args.objects,
        format_bytes(before),
        format_bytes(after)
    );

    eprintln!(
        "mixed workload: {} clients, {:.0}% gets, {} ms...",
        args.clients,
        args.get_fraction * 100.0,
        args.millis
    );
    let next_put = Arc::new(AtomicU64::new(args.objects));
    let errors = AtomicU64::new(0);
    let budget = Duration::from_millis(args.millis);
    let clients = (0..args.clients.max(1))
        .map(|_| Client::connect(&socket))
        .collect::<Result<Vec<_>, _>>()?;
    let mixed_started = Instant::now();
    let per_client: Vec<(Vec<Duration>, Vec<Duration>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(t, client)| {
                let (next_put, errors, data) = (&next_put, &errors, &data);
                scope.spawn(move || {
                    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5677));
                    let (mut gets, mut puts) = (Vec::new(), Vec::new());
                    let threshold = (args.get_fraction.clamp(0.0, 1.0) * u32::MAX as f64) as u64;
                    while mixed_started.elapsed() < budget {
                        let begin = Instant::now();
                        if rng.next() & 0xffff_ffff <= threshold {
                            let id = object_id(rng.next() % args.objects.max(1));
                            match client.get_one(id, Some(Duration::ZERO)) {
                                Ok(object) => {
                                    std::hint::black_box(object.data().first());
                                }
                                Err(_) => {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            gets.push(begin.elapsed());
                        } else {
                            let id = object_id(next_put.fetch_add(1, Ordering::Relaxed));
                            if client.create_and_seal(id, data, b"").is_err() {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            puts.push(begin.elapsed());
                        }
                    }
                    if client.flush().is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    (gets, puts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mixed_seconds = mixed_started.elapsed().as_secs_f64();
    let (mut gets, mut puts) = (Vec::new(), Vec::new());
    for (g, p) in per_client {
        gets.extend(g);
        puts.extend(p);
    }
    let total_ops = (gets.len() + puts.len()) as f64;
    let mut get = CaseResult::from_samples("get+release", size, &mut gets);
    get.ops_per_sec = gets.len() as f64 / mixed_seconds;
    get.mb_per_sec = get.ops_per_sec * size as f64 / 1e6;
    let mut put = CaseResult::from_samples("put", size, &mut puts);
    put.ops_per_sec = puts.len() as f64 / mixed_seconds;
    put.mb_per_sec = put.ops_per_sec * size as f64 / 1e6;
    let report = ScaleReport {
        objects: args.objects,
        object_size_bytes: size,
        head: args.head,
        fill_seconds,
        fill_objects_per_sec: args.objects as f64 / fill_seconds,
        rss_anon_before_bytes: before,
        rss_anon_after_bytes: after,
        metadata_bytes_per_object: per_object,
        clients: args.clients,
        mixed_seconds,
        mixed_ops_per_sec: total_ops / mixed_seconds,
        errors: errors.load(Ordering::Relaxed),
        get,
        put,
    };
    drop(clients);
    drop(daemon);
    print_report(&report);
    let document = serde_json::json!({
        "benchmark": "scale",
        "machine": MachineInfo::probe(),
        "results": report,
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
    Ok(())
}

fn print_report(r: &ScaleReport) {
    println!(
        "scale: {} objects of {} in one daemon{}",
        r.objects,
        format_bytes(r.object_size_bytes),
        if r.head {
            " (its own directory head)"
        } else {
            ""
        }
    );
    println!(
        "  fill                      {:>10.0} objects/s ({:.1} s)",
        r.fill_objects_per_sec, r.fill_seconds
    );
    println!(
        "  metadata per object       {:>10.1} bytes (daemon RssAnon {} → {}; target ≤ 200: {})",
        r.metadata_bytes_per_object,
        format_bytes(r.rss_anon_before_bytes),
        format_bytes(r.rss_anon_after_bytes),
        super::verdict(r.metadata_bytes_per_object <= 200.0)
    );
    println!(
        "  mixed, {} clients          {:>10.0} ops/s over {:.1} s, {} errors",
        r.clients, r.mixed_ops_per_sec, r.mixed_seconds, r.errors
    );
    println!(
        "{:>12} {:>10} {:>12} {:>10} {:>10}",
        "operation", "count", "ops/s", "p50 µs", "p99 µs"
    );
    for case in [&r.get, &r.put] {
        println!(
            "{:>12} {:>10} {:>12.0} {:>10.1} {:>10.1}",
            case.operation, case.iterations, case.ops_per_sec, case.p50_us, case.p99_us
        );
    }
    println!();
}
