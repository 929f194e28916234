//! `bench spill`: one daemon with S bytes of memory and a spill directory takes a working set
//! of 4×S at each object size (put with known contents), then gives it back in a sequential
//! and a random `get` phase (each get checks a few bytes), next to the disk's own sequential
//! write and read bandwidth measured on a raw file of the same bytes in the same directory and
//! run (a fresh daemon per size). Gets go in batches of up to [`MAX_GET_BATCH`] ids (as many
//! as fit a quarter of S), as a job that reads its working set asks for it, so restores run in
//! parallel on the daemon's IO threads. Targets (≥ 1 MiB: restores ≥ 0.8× raw read, writes ≥ 0.7× raw write; 4 KiB: ≥ 50k
//! random restores/s) are printed as met or MISSED.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use super::{verdict, BenchError, ChildDaemon, MachineInfo};
use skyriver_client::Client;
use skyriver_core::ObjectId;
use skyriver_daemon::size::{format_bytes, ByteSize};

/// Options of `bench spill`.
#[derive(Args, Debug, Clone)]
pub struct SpillArgs {
    /// The daemon's memory S; the working set at each size is 4×S.
    #[arg(long, default_value = "128MiB")]
    pub memory: ByteSize,
    /// Object sizes (each at most S/2).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,1MiB,64MiB")]
    pub sizes: Vec<ByteSize>,
    /// Where to make the temporary spill directory (removed at the end) [default: $TMPDIR].
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-spill.json")]
    pub json: PathBuf,
    /// The Python that runs Ray's side (skipped when it cannot `import ray`).
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// Draw bandwidth against object size (SVG) here: each phase, the raw disk, and Ray's
    /// phases when measured.
    #[arg(long, default_value = "bench-spill.svg")]
    pub plot: PathBuf,
}

/// IO unit of the raw disk measurement (as the spill tier's chunks).
const RAW_CHUNK: usize = 8 << 20;
/// Alignment of `O_DIRECT` buffers.
const DIRECT_ALIGN: usize = 4096;
/// Longest wait for one get: a stalled restore fails the run instead of hanging it.
const GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Most ids in one `get` of the get phases.
const MAX_GET_BATCH: u64 = 256;
/// Restores per second targeted for 4 KiB objects, random order.
const SMALL_RESTORES_TARGET: f64 = 50_000.0;

/// The disk's own bandwidth, on a raw file of the working set's bytes.
#[derive(Debug, Clone, Serialize)]
pub struct RawDisk {
    /// Bytes written then read.
    pub bytes: u64,
    /// Whether the file was opened with `O_DIRECT` (else buffered with fsync).
    pub o_direct: bool,
    /// Whether the page cache was dropped before the read.
    pub caches_dropped: bool,
    /// Sequential write, fsync included, MiB/s.
    pub write_mib_per_sec: f64,
    /// Sequential read, MiB/s.
    pub read_mib_per_sec: f64,
}

/// One phase at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Objects handled.
    pub objects: u64,
    /// Seconds taken.
    pub seconds: f64,
    /// Objects per second.
    pub objects_per_sec: f64,
    /// Object bytes per second, MiB/s.
    pub mib_per_sec: f64,
}

impl Phase {
    fn of(objects: u64, size: u64, seconds: f64) -> Self {
        let seconds = seconds.max(1e-9);
        Self {
            objects,
            seconds,
            objects_per_sec: objects as f64 / seconds,
            mib_per_sec: (objects * size) as f64 / seconds / (1u64 << 20) as f64,
        }
    }
}

/// Everything measured at one size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Object size in bytes.
    pub size_bytes: u64,
    /// Working set in bytes (4×S rounded down to whole objects).
    pub working_set_bytes: u64,
    /// Objects the daemon had on disk after the writes.
    pub spilled_objects: u64,
    /// Ids in one `get` of the get phases.
    pub get_batch: u64,
    /// Restores the daemon counted during both get phases.
    pub restores: u64,
    /// Of those, the restores of the random phase (its gets of objects still in memory are not
    /// restores).
    pub random_restores: u64,
    /// Restores per second of the random phase: what the 4 KiB target judges.
    pub random_restores_per_sec: f64,
    /// Put (create, write, seal) of the whole working set.
    pub write: Phase,
    /// Gets in write order.
    pub get_sequential: Phase,
    /// Gets in a random order.
    pub get_random: Phase,
    /// Write MiB/s ÷ the raw disk's write MiB/s.
    pub write_over_raw: f64,
    /// Sequential get MiB/s ÷ the raw disk's read MiB/s.
    pub restore_over_raw: f64,
    /// Random get MiB/s ÷ the raw disk's read MiB/s.
    pub random_restore_over_raw: f64,
}

/// Runs `bench spill`.
pub(super) fn run(args: &SpillArgs) -> Result<(), BenchError> {
    let memory = args.memory.0;
    if let Some(size) = args.sizes.iter().find(|s| s.0 == 0 || s.0 > memory / 2) {
        return Err(BenchError::Usage(format!(
            "--sizes: {} is not between 1 byte and half of --memory ({})",
            format_bytes(size.0),
            format_bytes(memory)
        )));
    }
    let parent = args.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
    // Declared first: dropped last, after the daemon has stopped.
    let dir = tempfile::Builder::new()
        .prefix("skyriver-bench-spill-")
        .tempdir_in(&parent)
        .map_err(|e| BenchError::Io {
            what: format!("cannot create a directory in {}", parent.display()),
            source: e,
        })?;
    let working_set = 4 * memory;
    let needed = working_set * (args.sizes.len() as u64 + 1) + working_set / 4 + (256 << 20);
    let free = free_bytes(dir.path())?;
    if free < needed {
        return Err(BenchError::Usage(format!(
            "{} has {} free; bench spill needs {} (4×{} per size and for the raw disk file, \
             plus a margin): give a smaller --memory, fewer --sizes or another --spill-dir",
            parent.display(),
            format_bytes(free),
            format_bytes(needed),
            format_bytes(memory)
        )));
    }
    let root = nix::unistd::geteuid().is_root();
    let drop_note = if root {
        "page cache dropped (sync; 3 > /proc/sys/vm/drop_caches) before the raw read and each get phase"
    } else {
        "not root: page cache NOT dropped; reads may come from memory"
    };
    eprintln!("measuring the raw disk ({})...", format_bytes(working_set));
    let raw = raw_disk(&dir.path().join("raw-disk"), working_set, root)?;

    let mut results = Vec::new();
    for (index, size) in args.sizes.iter().enumerate() {
        eprintln!("measuring {}...", format_bytes(size.0));
        // A fresh daemon (and spill directory) per size: each size starts from an empty tier.
        let spill_dir = dir.path().join(format!("spill-{index}"));
        std::fs::create_dir(&spill_dir).map_err(|e| BenchError::Io {
            what: format!("cannot create {}", spill_dir.display()),
            source: e,
        })?;
        let daemon =
            ChildDaemon::start_with(memory, &["--spill-dir".into(), spill_dir.clone().into()])?;
        let client = Client::connect(daemon.socket())?;
        results.push(measure_size(
            &client,
            index as u64,
            size.0,
            working_set,
            root,
            &raw,
        )?);
        drop(client);
        drop(daemon);
        let _ = std::fs::remove_dir_all(&spill_dir);
    }
    let ray = if ray_available(&args.python) {
        eprintln!("measuring Ray's spilling...");
        let ray_dir = dir.path().join("ray");
        std::fs::create_dir(&ray_dir).map_err(|source| BenchError::Io {
            what: format!("cannot create {}", ray_dir.display()),
            source,
        })?;
        let measured = measure_ray(&args.python, memory, &args.sizes, &ray_dir);
        let _ = std::fs::remove_dir_all(&ray_dir);
        Some(measured)
    } else {
        None
    };

    print_table(memory, &raw, &results, drop_note, ray.as_ref());
    let document = serde_json::json!({
        "memory_bytes": memory,
        "page_cache_dropped": root,
        "raw_disk": raw,
        "results": results,
        "ray": match &ray {
            None => serde_json::json!("ray not importable"),
            Some(Ok(ray)) => ray.clone(),
            Some(Err(error)) => serde_json::json!({ "error": error }),
        },
        "load_average": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "machine": MachineInfo::probe(),
    });
    let text = serde_json::to_string_pretty(&document).expect("results serialize");
    std::fs::write(&args.json, text).map_err(|e| BenchError::Io {
        what: format!("cannot write {}", args.json.display()),
        source: e,
    })?;
    eprintln!("wrote {}", args.json.display());
    let title = format!(
        "bench spill: {} of memory, a working set of {} per size",
        format_bytes(memory),
        format_bytes(4 * memory)
    );
    let ray = match &ray {
        Some(Ok(ray)) => Some(ray),
        _ => None,
    };
    let plot = super::plot::svg(&title, &plot_series(&raw, &results, ray));
    std::fs::write(&args.plot, plot).map_err(|e| BenchError::Io {
        what: format!("cannot write {}", args.plot.display()),
        source: e,
    })?;
    eprintln!("wrote {}", args.plot.display());
    Ok(())
}

/// MB/s (the plot's unit) of `mib_per_sec`.
fn mb_per_sec(mib_per_sec: f64) -> f64 {
    mib_per_sec * (1u64 << 20) as f64 / 1e6
}

/// The plot's lines: Skyriver's three phases, the raw disk's read and write (flat: measured
/// once), and Ray's phases when it ran.
fn plot_series(
    raw: &RawDisk,
    results: &[SizeResult],
    ray: Option<&serde_json::Value>,
) -> Vec<super::plot::Series> {
    type PhaseOf = fn(&SizeResult) -> &Phase;
    let phases: [(&str, &str, PhaseOf); 3] = [
        ("write", "write", |r| &r.write),
        ("sequential get", "get_sequential", |r| &r.get_sequential),
        ("random get", "get_random", |r| &r.get_random),
    ];
    let sizes = || results.iter().map(|r| r.size_bytes as f64);
    let mut series: Vec<super::plot::Series> = phases
        .iter()
        .map(|(name, _, phase)| super::plot::Series {
            name: format!("skyriver {name}"),
            points: results
                .iter()
                .map(|r| (r.size_bytes as f64, mb_per_sec(phase(r).mib_per_sec)))
                .collect(),
        })
        .collect();
    for (name, mib) in [
        ("raw disk read", raw.read_mib_per_sec),
        ("raw disk write", raw.write_mib_per_sec),
    ] {
        series.push(super::plot::Series {
            name: name.into(),
            points: sizes().map(|size| (size, mb_per_sec(mib))).collect(),
        });
    }
    if let Some(ray) = ray {
        for (name, key, _) in phases {
            series.push(super::plot::Series {
                name: format!("ray {name}"),
                points: results
                    .iter()
                    .filter_map(|r| {
                        let mib = ray_mib_per_sec(ray, r.size_bytes, key)?;
                        Some((r.size_bytes as f64, mb_per_sec(mib)))
                    })
                    .collect(),
            });
        }
    }
    series
}

fn free_bytes(dir: &Path) -> Result<u64, BenchError> {
    let vfs = nix::sys::statvfs::statvfs(dir).map_err(|e| BenchError::Io {
        what: format!("cannot stat {}", dir.display()),
        source: e.into(),
    })?;
    Ok(vfs.blocks_available() as u64 * vfs.fragment_size() as u64)
}

/// Writes back dirty pages and drops the page cache (root only; errors ignored: the output
/// says whether it was asked for).
fn drop_caches(root: bool) {
    if root {
        nix::unistd::sync();
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    }
}

/// A `len`-byte window of a buffer that starts on a [`DIRECT_ALIGN`] boundary.
fn aligned(buffer: &mut [u8], len: usize) -> &mut [u8] {
    let offset = buffer.as_ptr().align_offset(DIRECT_ALIGN);
    &mut buffer[offset..offset + len]
}

fn open_raw(path: &Path, write: bool, direct: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    if write {
        options.write(true).create(true).truncate(true);
    } else {
        options.read(true);
    }
    if direct {
        options.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
    }
    options.open(path)
}

/// Writes then reads `bytes` to a file at `path` in [`RAW_CHUNK`] IOs, with `O_DIRECT` where
/// the file system takes it; removes the file.
fn raw_disk(path: &Path, bytes: u64, root: bool) -> Result<RawDisk, BenchError> {
    let io = |action: &str, e: std::io::Error| BenchError::Io {
        what: format!("raw disk: cannot {action} {}", path.display()),
        source: e,
    };
    let o_direct = open_raw(path, true, true).is_ok();
    let mut storage = vec![0u8; RAW_CHUNK + DIRECT_ALIGN];
    let chunk = aligned(&mut storage, RAW_CHUNK);
    for (i, byte) in chunk.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let chunks = bytes.div_ceil(RAW_CHUNK as u64);
    let mut file = open_raw(path, true, o_direct).map_err(|e| io("create", e))?;
    let started = Instant::now();
    for _ in 0..chunks {
        file.write_all(chunk).map_err(|e| io("write", e))?;
    }
    file.sync_all().map_err(|e| io("fsync", e))?;
    let write_secs = started.elapsed().as_secs_f64();
    drop(file);
    drop_caches(root);
    let mut file = open_raw(path, false, o_direct).map_err(|e| io("open", e))?;
    let started = Instant::now();
    let mut read = 0u64;
    for _ in 0..chunks {
        file.read_exact(chunk).map_err(|e| io("read", e))?;
        read += RAW_CHUNK as u64;
    }
    let read_secs = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(path);
    if chunk[RAW_CHUNK - 1] != ((RAW_CHUNK - 1) % 251) as u8 {
        return Err(BenchError::Check("raw disk: read back other bytes".into()));
    }
    let mib = (chunks * RAW_CHUNK as u64) as f64 / (1u64 << 20) as f64;
    Ok(RawDisk {
        bytes: read,
        o_direct,
        caches_dropped: root,
        write_mib_per_sec: mib / write_secs.max(1e-9),
        read_mib_per_sec: mib / read_secs.max(1e-9),
    })
}

fn object_id(size_index: u64, n: u64) -> ObjectId {
    let mut bytes = [0u8; 20];
    bytes[..8].copy_from_slice(b"spillbch");
    bytes[8..12].copy_from_slice(&(size_index as u32).to_be_bytes());
    bytes[12..].copy_from_slice(&n.to_be_bytes());
    ObjectId(bytes)
}

/// The byte at `i` of every object, but for the stamps at both ends.
fn filler(i: usize) -> u8 {
    (i % 253) as u8
}

/// Object `n`'s contents: [`filler`] with `n` stamped at the start and the end.
fn stamp(buffer: &mut [u8], n: u64) {
    let stamp = n.to_le_bytes();
    let len = buffer.len();
    let width = stamp.len().min(len);
    buffer[..width].copy_from_slice(&stamp[..width]);
    buffer[len - width..].copy_from_slice(&stamp[..width]);
}

/// Checks both stamps and a byte in the middle.
fn check(data: &[u8], n: u64, size: u64) -> Result<(), BenchError> {
    let stamp = n.to_le_bytes();
    let len = data.len();
    let width = stamp.len().min(len);
    let middle = len / 2;
    let middle_ok = middle < width || middle >= len - width || data[middle] == filler(middle);
    if len as u64 != size
        || data[..width] != stamp[..width]
        || data[len - width..] != stamp[..width]
        || !middle_ok
    {
        return Err(BenchError::Check(format!(
            "object {n} of {} came back with other bytes",
            format_bytes(size)
        )));
    }
    Ok(())
}

fn measure_size(
    client: &Client,
    size_index: u64,
    size: u64,
    working_set: u64,
    root: bool,
    raw: &RawDisk,
) -> Result<SizeResult, BenchError> {
    let count = (working_set / size).max(1);
    let mut buffer: Vec<u8> = (0..size as usize).map(filler).collect();
    let started = Instant::now();
    for n in 0..count {
        stamp(&mut buffer, n);
        client.put(object_id(size_index, n), &buffer, b"")?;
    }
    let write = Phase::of(count, size, started.elapsed().as_secs_f64());
    drop(buffer);
    let before = client.stats()?;
    let spilled_objects = before.spill.spilled_objects;

    // A batch holds its objects until checked: at most a quarter of the memory.
    let get_batch = (working_set / 16 / size).clamp(1, MAX_GET_BATCH) as usize;
    let get_all = |order: &[u64]| -> Result<(), BenchError> {
        let mut ids = Vec::with_capacity(get_batch);
        for batch in order.chunks(get_batch) {
            ids.clear();
            ids.extend(batch.iter().map(|&n| object_id(size_index, n)));
            let objects = client.get(&ids, Some(GET_TIMEOUT))?;
            for (object, &n) in objects.into_iter().zip(batch) {
                let object = object.map_err(skyriver_client::ClientError::from)?;
                check(object.data(), n, size)?;
            }
        }
        Ok(())
    };
    let mut order: Vec<u64> = (0..count).collect();
    drop_caches(root);
    let started = Instant::now();
    get_all(&order)?;
    let get_sequential = Phase::of(count, size, started.elapsed().as_secs_f64());

    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(size));
    drop_caches(root);
    let before_random = client.stats()?;
    let started = Instant::now();
    get_all(&order)?;
    let get_random = Phase::of(count, size, started.elapsed().as_secs_f64());
    let after = client.stats()?;
    let random_restores = after.spill.restores_total - before_random.spill.restores_total;

    Ok(SizeResult {
        size_bytes: size,
        working_set_bytes: count * size,
        spilled_objects,
        get_batch: get_batch as u64,
        restores: after.spill.restores_total - before.spill.restores_total,
        random_restores,
        random_restores_per_sec: random_restores as f64 / get_random.seconds.max(f64::MIN_POSITIVE),
        write_over_raw: write.mib_per_sec / raw.write_mib_per_sec,
        restore_over_raw: get_sequential.mib_per_sec / raw.read_mib_per_sec,
        random_restore_over_raw: get_random.mib_per_sec / raw.read_mib_per_sec,
        write,
        get_sequential,
        get_random,
    })
}

/// Ray's side of the run (`ray_spill.py`): its JSON document.
fn measure_ray(
    python: &Path,
    memory: u64,
    sizes: &[ByteSize],
    spill_dir: &Path,
) -> Result<serde_json::Value, String> {
    let sizes: Vec<String> = sizes.iter().map(|s| s.0.to_string()).collect();
    let output = std::process::Command::new(python)
        .args(["-c", include_str!("ray_spill.py"), "--memory"])
        .arg(memory.to_string())
        .args(["--sizes", &sizes.join(",")])
        .arg("--spill-dir")
        .arg(spill_dir)
        .args(["--max-batch", &MAX_GET_BATCH.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !output.status.success() {
        return Err(format!("ray's side failed ({})", output.status));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("ray's side printed no JSON: {e}"))
}

/// MiB/s of Ray's `phase` at `size`, from its document.
fn ray_mib_per_sec(ray: &serde_json::Value, size: u64, phase: &str) -> Option<f64> {
    ray["results"]
        .as_array()?
        .iter()
        .find(|r| r["size_bytes"].as_u64() == Some(size))?[phase]["mib_per_sec"]
        .as_f64()
}

/// Whether `python` can import Ray.
fn ray_available(python: &Path) -> bool {
    std::process::Command::new(python)
        // A directory named ray in the working directory imports too (as an empty namespace
        // package; Ray leaves /tmp/ray behind): ask for the real thing.
        .args([
            "-c",
            "import ray, sys; sys.exit(0 if hasattr(ray, 'put') else 1)",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn print_table(
    memory: u64,
    raw: &RawDisk,
    results: &[SizeResult],
    drop_note: &str,
    ray: Option<&Result<serde_json::Value, String>>,
) {
    println!(
        "bench spill: memory {}, working set 4×S = {} per size; {drop_note}",
        format_bytes(memory),
        format_bytes(4 * memory)
    );
    println!(
        "raw disk ({}, {}): write {:.0} MiB/s, read {:.0} MiB/s",
        format_bytes(raw.bytes),
        if raw.o_direct {
            "O_DIRECT"
        } else {
            "buffered + fsync, O_DIRECT refused"
        },
        raw.write_mib_per_sec,
        raw.read_mib_per_sec
    );
    println!();
    println!(
        "{:>8} {:>8} {:>8} {:>6} {:>12} {:>9} {:>12} {:>9} {:>12} {:>9} {:>6} {:>6} {:>6}",
        "size",
        "objects",
        "spilled",
        "batch",
        "write obj/s",
        "MiB/s",
        "seq get/s",
        "MiB/s",
        "rand get/s",
        "MiB/s",
        "w/raw",
        "r/raw",
        "rr/raw"
    );
    for r in results {
        println!(
            "{:>8} {:>8} {:>8} {:>6} {:>12.0} {:>9.1} {:>12.0} {:>9.1} {:>12.0} {:>9.1} {:>6.2} {:>6.2} {:>6.2}",
            format_bytes(r.size_bytes),
            r.write.objects,
            r.spilled_objects,
            r.get_batch,
            r.write.objects_per_sec,
            r.write.mib_per_sec,
            r.get_sequential.objects_per_sec,
            r.get_sequential.mib_per_sec,
            r.get_random.objects_per_sec,
            r.get_random.mib_per_sec,
            r.write_over_raw,
            r.restore_over_raw,
            r.random_restore_over_raw
        );
    }
    println!();
    println!("targets:");
    for r in results {
        let size = format_bytes(r.size_bytes);
        if r.size_bytes >= 1 << 20 {
            println!(
                "  {size}: restores {:.2}× raw read (target ≥ 0.8): {}",
                r.restore_over_raw,
                verdict(r.restore_over_raw >= 0.8)
            );
            println!(
                "  {size}: writes while spilling {:.2}× raw write (target ≥ 0.7): {}",
                r.write_over_raw,
                verdict(r.write_over_raw >= 0.7)
            );
        }
        if r.size_bytes == 4 << 10 {
            println!(
                "  {size}: {:.0} random restores/s ({} restores in {:.2} s; the phase's gets of \
                 objects in memory not counted) (target ≥ 50k): {}",
                r.random_restores_per_sec,
                r.random_restores,
                r.get_random.seconds,
                verdict(r.random_restores_per_sec >= SMALL_RESTORES_TARGET)
            );
        }
    }
    match ray {
        None => println!("ray: ray not importable (skipped; --python names the interpreter)"),
        Some(Err(error)) => println!("ray: {error}"),
        Some(Ok(ray)) => {
            println!(
                "ray {} (same memory, working set and batches; spilled get throughput, target: \
                 Skyriver ≥ 2×):",
                ray["ray_version"].as_str().unwrap_or("?")
            );
            for r in results {
                let size = format_bytes(r.size_bytes);
                let phases = [
                    ("write", r.write.mib_per_sec),
                    ("get_sequential", r.get_sequential.mib_per_sec),
                    ("get_random", r.get_random.mib_per_sec),
                ];
                for (phase, ours) in phases {
                    let Some(theirs) = ray_mib_per_sec(ray, r.size_bytes, phase) else {
                        continue;
                    };
                    let ratio = ours / theirs.max(1e-9);
                    let target = if phase == "write" {
                        String::new()
                    } else {
                        format!(": {}", verdict(ratio >= 2.0))
                    };
                    println!(
                        "  {size} {phase}: ray {theirs:.1} MiB/s, skyriver {ours:.1} MiB/s, \
                         {ratio:.2}×{target}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(size: u64, write: f64, seq: f64, random: f64) -> SizeResult {
        let phase = |mib_per_sec: f64| Phase {
            objects: 1,
            seconds: 1.0,
            objects_per_sec: 1.0,
            mib_per_sec,
        };
        SizeResult {
            size_bytes: size,
            working_set_bytes: 4 * size,
            spilled_objects: 3,
            get_batch: 1,
            restores: 3,
            random_restores: 2,
            random_restores_per_sec: 2.0,
            write: phase(write),
            get_sequential: phase(seq),
            get_random: phase(random),
            write_over_raw: 0.0,
            restore_over_raw: 0.0,
            random_restore_over_raw: 0.0,
        }
    }

    /// Each phase is a line over the sizes, in MB/s; the raw disk is flat; Ray's lines appear
    /// only when it ran, with the sizes it measured.
    #[test]
    fn the_plot_has_a_line_per_phase_the_raw_disk_and_ray() {
        let raw = RawDisk {
            bytes: 1 << 30,
            o_direct: true,
            caches_dropped: false,
            write_mib_per_sec: 1000.0,
            read_mib_per_sec: 800.0,
        };
        let results = [
            result(4096, 10.0, 20.0, 30.0),
            result(1 << 20, 100.0, 200.0, 300.0),
        ];
        let series = plot_series(&raw, &results, None);
        let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "skyriver write",
                "skyriver sequential get",
                "skyriver random get",
                "raw disk read",
                "raw disk write"
            ]
        );
        let mb = |mib: f64| mib * 1.048576;
        let same = |points: &[(f64, f64)], expected: &[(f64, f64)]| {
            assert_eq!(points.len(), expected.len(), "{points:?}");
            for (&(x, y), &(ex, ey)) in points.iter().zip(expected) {
                assert!(
                    x == ex && (y - ey).abs() < 1e-9,
                    "{points:?} ≠ {expected:?}"
                );
            }
        };
        same(
            &series[1].points,
            &[(4096.0, mb(20.0)), ((1 << 20) as f64, mb(200.0))],
        );
        same(
            &series[2].points,
            &[(4096.0, mb(30.0)), ((1 << 20) as f64, mb(300.0))],
        );
        same(
            &series[3].points,
            &[(4096.0, mb(800.0)), ((1 << 20) as f64, mb(800.0))],
        );

        let ray = serde_json::json!({ "results": [
            { "size_bytes": 1 << 20, "write": { "mib_per_sec": 5.0 },
              "get_sequential": { "mib_per_sec": 6.0 }, "get_random": { "mib_per_sec": 7.0 } }
        ]});
        let series = plot_series(&raw, &results, Some(&ray));
        assert_eq!(series.len(), 8);
        assert_eq!(series[7].name, "ray random get");
        same(&series[7].points, &[((1 << 20) as f64, mb(7.0))]);
        let svg = super::super::plot::svg("t", &series);
        assert!(svg.contains("ray random get") && svg.contains("skyriver write"));
    }
}
