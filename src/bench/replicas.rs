//! `bench replicas`: what copies cost and how fast lost ones come back, on N daemons in
//! network namespaces (node 0 serves the directory).
//!
//! - **Put with k copies**: node 1 puts objects with `replicas = k` (k = 1, 2, 3 by default),
//!   each put waiting until its k copies are sealed, next to one fetch of the same size from
//!   node 1 by node 2, in the same run. The cost of waiting is `p50(put, k) − p50(put, 1)`;
//!   since the other nodes pull their copies at once and in parallel, it should be about one
//!   fetch: the table prints the ratio of the two. Objects are deleted (everywhere) after
//!   each sample, untimed.
//! - **Repair**: node 1 puts `--repair-mib` MiB with two copies (waiting), then is killed with
//!   SIGKILL; the repair time runs from the kill until every object has two copies again on
//!   live nodes (asked of the directory every few milliseconds), and until the head's
//!   metrics report no under-replicated object (refreshed once a second: a coarser clock).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{BenchError, CaseResult, MachineInfo};
use crate::netns::LinkShape;
use crate::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, NodeId, ObjectId, ReplicaPolicy};
use skyriver_daemon::size::{format_bytes, ByteSize};

/// How long a put may wait for its copies, and a fetch for its object.
pub(super) const WAIT: Duration = Duration::from_secs(120);
/// How long repair may take before the run fails.
const REPAIR_LIMIT: Duration = Duration::from_secs(300);

/// Options of `bench replicas`.
#[derive(Args, Debug, Clone)]
pub struct ReplicasArgs {
    /// Nodes (namespaces), at least 4: the directory, the putting node and two others.
    #[arg(long, short = 'n', default_value_t = 4)]
    pub nodes: u32,
    /// Object sizes.
    #[arg(long, value_delimiter = ',', default_value = "1KiB,1MiB,64MiB")]
    pub sizes: Vec<ByteSize>,
    /// Copies per put.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub copies: Vec<u8>,
    /// Timed puts (and fetches) per size and copy count.
    #[arg(long, default_value_t = 5)]
    pub iterations: usize,
    /// MiB the killed node holds (as copies of record, two each) before the repair is timed
    /// (0: no repair phase).
    #[arg(long, default_value_t = 64)]
    pub repair_mib: u64,
    /// Size of each object of the repair phase.
    #[arg(long, default_value = "1MiB")]
    pub repair_object_size: ByteSize,
    /// Shape every node's link: RATE,LATENCY (e.g. 10gbit,50us); unshaped without.
    #[arg(long)]
    pub link: Option<LinkShape>,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-replicas.json")]
    pub json: PathBuf,
    /// Where the wait for copies goes, at the first size: ten times this many puts per copy
    /// count and fetches with the daemons' CPU time around each, then this many traced puts
    /// per copy count above 1, whose stamps give the medians of a put's milestones (0: none;
    /// `SKYRIVER_BENCH_STAMPS=1` prints every stamp too).
    #[arg(long, default_value_t = 0)]
    pub breakdown: usize,
}

/// One size: puts by copy count next to one fetch.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaRow {
    /// Object size in bytes.
    pub size_bytes: u64,
    /// Puts that waited for their copies, one per copy count (`put k=K`).
    pub puts: Vec<CaseResult>,
    /// Fetches of the same size by another node.
    pub fetch: CaseResult,
    /// Per copy count above 1: (p50 of the put − p50 of the put with one copy) / p50 of the
    /// fetch. About 1 when the copies are pulled in parallel at fetch speed.
    pub wait_over_fetch: Vec<(u8, f64)>,
}

/// The repair phase.
#[derive(Debug, Clone, Serialize)]
pub struct RepairResult {
    /// Objects the killed node held (each with two copies).
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// From the kill until every object has two live copies again, as the directory lists
    /// them, milliseconds.
    pub restored_ms: f64,
    /// Repair bandwidth: bytes / restored time, MB/s.
    pub restored_mb_per_sec: f64,
    /// From the kill until the head's metrics report no under-replicated object (they are
    /// refreshed once a second), milliseconds.
    pub head_reports_ms: f64,
    /// Every object fetched with its bytes from every live node afterwards.
    pub all_fetchable: bool,
}

/// What `bench replicas` measured.
#[derive(Debug, Serialize)]
pub struct ReplicasReport {
    /// Nodes of the cluster.
    pub nodes: u32,
    /// The links' shape, if any.
    pub link: Option<String>,
    /// Puts and fetches by size.
    pub results: Vec<ReplicaRow>,
    /// The repair phase, if run.
    pub repair: Option<RepairResult>,
    /// Where the wait for copies goes (`--breakdown`), if asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<super::replicas_breakdown::Breakdown>,
    /// The load average at the end (other work on the machine skews the numbers).
    pub load_average: String,
    /// The machine.
    pub machine: MachineInfo,
}

/// Runs `bench replicas`.
pub(super) fn run(args: &ReplicasArgs) -> Result<(), BenchError> {
    if args.nodes < 4 {
        return Err(BenchError::Usage(
            "bench replicas needs --nodes 4 or more".into(),
        ));
    }
    let most_copies = args.copies.iter().copied().max().unwrap_or(1);
    if most_copies as u32 >= args.nodes || args.copies.contains(&0) {
        return Err(BenchError::Usage(format!(
            "--copies must be 1 to {} with {} nodes (node 0 serves the directory and holds copies too)",
            args.nodes - 1,
            args.nodes
        )));
    }
    crate::netns::available().map_err(BenchError::NoNamespaces)?;
    crate::netns::remove_on_signal();
    let largest = args.sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let repair_bytes = args.repair_mib << 20;
    // A node holds one object of each copy count at most at once, or its share of the
    // repair objects (their copies land on the others, two each).
    let memory = ByteSize((2 * largest + 2 * repair_bytes + (64 << 20)).max(256 << 20));
    let exe = crate::self_exe().map_err(BenchError::OwnPath)?;
    eprintln!(
        "starting {} daemons in network namespaces with {} each...",
        args.nodes,
        format_bytes(memory.0)
    );
    let socket_dir =
        std::env::temp_dir().join(format!("skyriver-bench-replicas-{}", std::process::id()));
    crate::netns::remove_dir_on_signal(socket_dir.clone());
    let mut up = UpArgs::new(args.nodes, memory, Some(socket_dir.clone()));
    up.netns = true;
    up.link = args.link.clone();
    up.metrics = true;
    let started = LocalCluster::start_tied_to_this_thread(&up, &exe).map_err(BenchError::from);
    let result = started.and_then(|mut cluster| {
        let result = measure(args, &mut cluster);
        cluster.stop();
        result
    });
    // The daemons' sockets and logs: this run's, removed whether it measured or failed.
    let _ = std::fs::remove_dir_all(&socket_dir);
    let report = result?;
    print_table(&report);
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?).map_err(|source| {
        BenchError::Io {
            what: format!("write {}", args.json.display()),
            source,
        }
    })?;
    eprintln!("results in {}", args.json.display());
    Ok(())
}

fn measure(args: &ReplicasArgs, cluster: &mut LocalCluster) -> Result<ReplicasReport, BenchError> {
    let putter = Client::connect(&cluster.sockets[1])?;
    let fetcher = Client::connect(&cluster.sockets[2])?;
    let mut next_id = 1u64 << 40;
    let mut fresh_id = || {
        next_id += 1;
        ObjectId::from_u64(next_id)
    };
    let mut results = Vec::new();
    for &ByteSize(size) in &args.sizes {
        eprintln!("{}...", format_bytes(size));
        let data = pattern(size as usize, size as u8);
        let mut puts: Vec<Vec<Duration>> = vec![Vec::new(); args.copies.len()];
        let mut fetches = Vec::new();
        // Copy counts and the fetch take turns, so each sees the same load.
        for _ in 0..args.iterations {
            for (at, &copies) in args.copies.iter().enumerate() {
                let id = fresh_id();
                let policy = ReplicaPolicy {
                    copies,
                    wait_ms: (copies > 1).then_some(WAIT.as_millis() as u64),
                };
                let started = Instant::now();
                putter.put_replicated(id, &data, b"", policy)?;
                puts[at].push(started.elapsed());
                delete_everywhere(&putter, id)?;
            }
            let id = fresh_id();
            putter.put_replicated(id, &data, b"", ReplicaPolicy::default())?;
            let started = Instant::now();
            let object = fetcher.fetch_one(id, Some(WAIT))?;
            fetches.push(started.elapsed());
            if object.data().len() != data.len() {
                return Err(BenchError::Check(format!(
                    "fetched {} bytes of a {size}-byte object",
                    object.data().len()
                )));
            }
            drop(object);
            fetcher.delete(&[id])?;
            delete_everywhere(&putter, id)?;
        }
        let puts: Vec<CaseResult> = args
            .copies
            .iter()
            .zip(puts.iter_mut())
            .map(|(copies, samples)| {
                CaseResult::from_samples(&format!("put k={copies}"), size, samples)
            })
            .collect();
        let fetch = CaseResult::from_samples("fetch", size, &mut fetches);
        let one = args
            .copies
            .iter()
            .position(|&c| c == 1)
            .map(|at| puts[at].p50_us);
        let wait_over_fetch = args
            .copies
            .iter()
            .zip(&puts)
            .filter(|(&copies, _)| copies > 1)
            .filter_map(|(&copies, put)| {
                let one = one?;
                (fetch.p50_us > 0.0).then(|| (copies, (put.p50_us - one) / fetch.p50_us))
            })
            .collect();
        results.push(ReplicaRow {
            size_bytes: size,
            puts,
            fetch,
            wait_over_fetch,
        });
    }
    let breakdown = if args.breakdown > 0 {
        eprintln!("breakdown...");
        Some(super::replicas_breakdown::run(
            args,
            cluster,
            &putter,
            &mut fresh_id,
        )?)
    } else {
        None
    };
    drop(putter);
    drop(fetcher);
    let repair = if args.repair_mib > 0 {
        Some(repair(args, cluster, &mut fresh_id)?)
    } else {
        None
    };
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(ReplicasReport {
        nodes: args.nodes,
        link: args.link.as_ref().map(|l| l.to_string()),
        results,
        repair,
        breakdown,
        load_average,
        machine: MachineInfo::probe(),
    })
}

/// Node 1 holds `--repair-mib` MiB put with two copies; it is killed, and repair timed.
fn repair(
    args: &ReplicasArgs,
    cluster: &mut LocalCluster,
    fresh_id: &mut impl FnMut() -> ObjectId,
) -> Result<RepairResult, BenchError> {
    let object_size = args.repair_object_size.0.max(1);
    let count = ((args.repair_mib << 20) / object_size).max(1);
    eprintln!(
        "repair: {count} objects of {} put with two copies on node 1...",
        format_bytes(object_size)
    );
    let putter = Client::connect(&cluster.sockets[1])?;
    let mut objects = Vec::new();
    for n in 0..count {
        let id = fresh_id();
        let data = pattern(object_size as usize, n as u8);
        putter.put_replicated(
            id,
            &data,
            b"",
            ReplicaPolicy {
                copies: 2,
                wait_ms: Some(WAIT.as_millis() as u64),
            },
        )?;
        objects.push((id, data));
    }
    drop(putter);
    let observer = Client::connect(&cluster.sockets[0])?;
    // Wait for the head's metrics to show the copies complete, so the timed part starts clean.
    within(Duration::from_secs(10), || {
        head_gauge(cluster, "skyriver_head_under_replicated_objects") == Some(0.0)
    });
    eprintln!("repair: node 1 killed...");
    let killed = Instant::now();
    cluster.kill(1);
    let restored = within(REPAIR_LIMIT, || {
        objects.iter().all(|(id, _)| {
            // Copies of record only: a cache copy (a fetch's) does not count as repaired.
            let nodes: Vec<NodeId> = observer
                .locate_copies(*id)
                .map(|c| {
                    c.copies
                        .into_iter()
                        .filter(|c| c.of_record)
                        .map(|c| c.node)
                        .collect()
                })
                .unwrap_or_default();
            nodes.len() >= 2 && !nodes.contains(&NodeId(1))
        })
    })
    .ok_or_else(|| BenchError::Check(format!("repair took more than {REPAIR_LIMIT:?}")))?;
    let restored_ms = restored.duration_since(killed).as_secs_f64() * 1e3;
    let head = within(REPAIR_LIMIT, || {
        head_gauge(cluster, "skyriver_head_under_replicated_objects") == Some(0.0)
            && head_gauge(cluster, "skyriver_head_repairs_total").unwrap_or(0.0) >= count as f64
    })
    .ok_or_else(|| BenchError::Check("the head never reported every object repaired".into()))?;
    let head_reports_ms = head.duration_since(killed).as_secs_f64() * 1e3;
    let mut all_fetchable = true;
    for node in (0..cluster.sockets.len()).filter(|&n| n != 1) {
        let client = Client::connect(&cluster.sockets[node])?;
        for (id, data) in &objects {
            let object = client.fetch_one(*id, Some(WAIT))?;
            all_fetchable &= object.data() == &data[..];
        }
    }
    let bytes = count * object_size;
    Ok(RepairResult {
        objects: count,
        bytes,
        restored_ms,
        restored_mb_per_sec: bytes as f64 / (restored_ms / 1e3).max(1e-9) / 1e6,
        head_reports_ms,
        all_fetchable,
    })
}

/// A delete on the putting node removes every copy; returns once the directory lists none.
pub(super) fn delete_everywhere(client: &Client, id: ObjectId) -> Result<(), BenchError> {
    client.delete(&[id])?;
    within(WAIT, || {
        client
            .locate_copies(id)
            .is_ok_and(|copies| copies.copies.is_empty())
    })
    .map(|_| ())
    .ok_or_else(|| BenchError::Check(format!("{id} still has copies after its delete")))
}

/// Polls `condition` every 2 ms until it holds (`Some(when)`) or `limit` passes.
fn within(limit: Duration, mut condition: impl FnMut() -> bool) -> Option<Instant> {
    let started = Instant::now();
    loop {
        if condition() {
            return Some(Instant::now());
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A gauge or counter without labels from the head's (node 0's) metrics.
fn head_gauge(cluster: &LocalCluster, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let addr = *cluster.metrics.first()?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn print_table(report: &ReplicasReport) {
    println!(
        "{:>8} {:>10} {:>11} {:>11} {:>10} {:>12}",
        "size", "operation", "p50 µs", "p99 µs", "MB/s", "wait/fetch"
    );
    for row in &report.results {
        for case in row.puts.iter().chain(std::iter::once(&row.fetch)) {
            let ratio = case
                .operation
                .strip_prefix("put k=")
                .and_then(|k| k.parse::<u8>().ok())
                .and_then(|k| row.wait_over_fetch.iter().find(|(c, _)| *c == k))
                .map_or_else(String::new, |(_, r)| format!("{r:.2}"));
            println!(
                "{:>8} {:>10} {:>11.1} {:>11.1} {:>10.1} {:>12}",
                format_bytes(row.size_bytes),
                case.operation,
                case.p50_us,
                case.p99_us,
                case.mb_per_sec,
                ratio
            );
        }
    }
    if let Some(breakdown) = &report.breakdown {
        super::replicas_breakdown::print(breakdown);
    }
    if let Some(repair) = &report.repair {
        println!(
            "repair: {} objects ({}) of a killed node: two copies again after {:.1} ms \
             ({:.1} MB/s); the head reported none under-replicated after {:.0} ms; all \
             fetchable with their bytes: {}",
            repair.objects,
            format_bytes(repair.bytes),
            repair.restored_ms,
            repair.restored_mb_per_sec,
            repair.head_reports_ms,
            repair.all_fetchable
        );
    }
    println!("load average at end: {}", report.load_average);
}
