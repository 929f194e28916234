//! `bench cluster`: N daemons, each in its own network namespace on (optionally) shaped veth
//! links, moving objects in three patterns, side by side with raw TCP streams between the
//! same namespaces and Redis GETs from a server in node 0's namespace, all in one run:
//!
//! - `broadcast`: node 0 holds N−1 objects and every other node fetches all of them, each
//!   starting at a different one, so later fetches can be served by nodes that already have a
//!   copy (Skyriver spreads them; the raw TCP and Redis baselines can only ask node 0);
//! - `all-to-all`: every node holds one object and fetches every other node's, in one
//!   batched fetch (the TCP baseline pulls from each peer on its own thread; Redis serves
//!   every GET from node 0);
//! - `incast`: node 0 holds N−1 distinct objects and every other node fetches its own, at the
//!   same time: node 0's link carries everything, nothing can be spread.
//!
//! One round moves one pattern's objects once, every node starting together; the systems
//! take turns round by round, so every ratio compares numbers taken under the same load.
//! Per round: aggregate throughput = bytes moved / (last node done − first node started),
//! per-node throughput = a node's bytes / its own time, and the latency samples are each
//! node's time to have all its objects (p50/p99 over nodes and rounds). Skyriver objects are
//! new every round (a first fetch: directory lookup included) and deleted after it, untimed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{BenchError, MachineInfo};
use crate::netns::{LinkShape, NetnsCluster};
use crate::up::{LocalCluster, UpArgs};
use skyriver_client::Client;
use skyriver_core::{NodeId, ObjectId};
use skyriver_daemon::size::{format_bytes, ByteSize};
use skyriver_transport::trace::monotonic_ns;

use super::cluster_trace;

mod memory_plan;
mod relay_pace;

/// The system name of Skyriver with hinted fetches.
const HINTED: &str = "sky+hint";

/// Options of `bench cluster`.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Nodes (namespaces), at least 3.
    #[arg(long, short = 'n', default_value_t = 3)]
    pub nodes: u32,
    /// Patterns to run.
    #[arg(long, value_delimiter = ',', default_value = "broadcast,all-to-all,incast",
          value_parser = ["broadcast", "all-to-all", "incast"])]
    pub patterns: Vec<String>,
    /// Object sizes [default: 1KiB,16KiB,256KiB,4MiB,64MiB,256MiB, less the largest ones that
    /// would not fit in this machine's free memory with the baselines' buffers]. Sizes given
    /// here that do not fit are refused.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<ByteSize>,
    /// Shape every node's link: RATE,LATENCY (e.g. 10gbit,50us); unshaped without.
    #[arg(long)]
    pub link: Option<LinkShape>,
    /// Baselines measured in the same run (none: `--baselines ''`).
    #[arg(long, value_delimiter = ',', default_value = "tcp,redis",
          value_parser = ["tcp", "redis", ""])]
    pub baselines: Vec<String>,
    /// Time spent on each pattern and size by each system.
    #[arg(long, default_value_t = 600)]
    pub millis_per_case: u64,
    /// Fewest rounds of one case, whatever the time.
    #[arg(long, default_value_t = 3)]
    pub min_rounds: usize,
    /// Most rounds of one case.
    #[arg(long, default_value_t = 200)]
    pub max_rounds: usize,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-cluster.json")]
    pub json: PathBuf,
    /// Draw aggregate bandwidth against size (SVG), one line per pattern and system, here.
    #[arg(long, default_value = "bench-cluster.svg")]
    pub plot: PathBuf,
    /// Also measure Skyriver with every fetch hinted at the object's holder (`fetch_from`:
    /// no directory lookup), as system `sky+hint`, taking turns with the others. All-to-all
    /// fetches many holders' objects in one batch and runs unhinted there.
    #[arg(long)]
    pub hinted: bool,
    /// After each case, trace one more round of each Skyriver system and print where a
    /// fetch's time goes, hop by hop.
    #[arg(long)]
    pub breakdown: bool,
    /// Start the daemons with `--relay-min-bytes` this (a size, or off), to compare broadcast
    /// through relays with every requester pulling from the holder [default: the daemons']
    #[arg(long, value_name = "SIZE|off")]
    pub relay_min_bytes: Option<String>,
    /// Broadcast: each node asks for all its objects in one batched fetch (as all-to-all
    /// does), so its daemon fetches them at once, instead of one after another. The baselines
    /// are unchanged (they can only pull from node 0, whose link bounds them either way).
    #[arg(long)]
    pub broadcast_batched: bool,
    /// Start the daemons with --learn-locations: every node is told where each object is as
    /// it is published, so an unhinted first fetch skips the lookup too.
    #[arg(long)]
    pub learn_locations: bool,
}

/// The three patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Broadcast,
    AllToAll,
    Incast,
}

impl Pattern {
    fn parse(text: &str) -> Self {
        match text {
            "broadcast" => Self::Broadcast,
            "all-to-all" => Self::AllToAll,
            _ => Self::Incast,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Broadcast => "broadcast",
            Self::AllToAll => "all-to-all",
            Self::Incast => "incast",
        }
    }

    /// The objects of one round: (object index, holder node).
    fn objects(self, nodes: usize) -> Vec<(usize, usize)> {
        match self {
            Self::Broadcast | Self::Incast => (0..nodes - 1).map(|o| (o, 0)).collect(),
            Self::AllToAll => (0..nodes).map(|o| (o, o)).collect(),
        }
    }

    /// What node `node` fetches in one round, in order (object indices).
    fn wants(self, nodes: usize, node: usize) -> Vec<usize> {
        match self {
            Self::Broadcast if node == 0 => Vec::new(),
            // Each requester starts at a different object and walks through all of them.
            Self::Broadcast => (0..nodes - 1)
                .map(|k| (node - 1 + k) % (nodes - 1))
                .collect(),
            Self::AllToAll => (0..nodes).filter(|&o| o != node).collect(),
            Self::Incast if node == 0 => Vec::new(),
            Self::Incast => vec![node - 1],
        }
    }
}

/// One pattern, size and system.
#[derive(Debug, Clone, Serialize)]
struct ClusterRow {
    pattern: String,
    system: String,
    size_bytes: u64,
    rounds: usize,
    /// Bytes moved per round / the round's wall time, MB/s (10^6), mean over rounds.
    aggregate_mb_per_sec: f64,
    /// A node's bytes / its own time, MB/s, mean over nodes and rounds.
    per_node_mb_per_sec: f64,
    /// A node's time to have all its objects, microseconds.
    p50_us: f64,
    p99_us: f64,
    /// Median over rounds of the last node's completion − the first node's, microseconds.
    completion_spread_us: f64,
    /// Broadcast: bytes the source's link sent per object byte delivered to one node (N−1 for
    /// a star from the source, about 1 when copies serve each other), mean over rounds.
    source_sends_per_object: Option<f64>,
    /// Broadcast on a shaped link: the source link's bytes / (round time × its rate).
    source_link_utilisation: Option<f64>,
    /// Aggregate bandwidth / each baseline's, same pattern and size.
    ratios: std::collections::BTreeMap<String, f64>,
}

/// A node's destination buffers for the baselines (one per concurrent transfer).
type Buffers = Vec<Vec<u8>>;

/// One round of one system: per requesting node, (bytes, start, end).
type Round = Vec<(u64, Instant, Instant)>;

#[derive(Default)]
struct Samples {
    rounds: Vec<Round>,
    /// Per round, the bytes node 0's link sent during it (broadcast only).
    source_bytes: Vec<u64>,
}

impl Samples {
    /// `objects`: distinct objects of a round; `rate_bits_per_sec`: the links' shaped rate.
    fn row(
        &self,
        (pattern, system, size): (Pattern, &str, u64),
        objects: usize,
        rate_bits_per_sec: Option<u64>,
    ) -> ClusterRow {
        let mut aggregate = Vec::new();
        let mut per_node = Vec::new();
        let mut latencies = Vec::new();
        let mut spreads = Vec::new();
        let mut walls = Vec::new();
        for round in &self.rounds {
            let (Some(first), Some(last)) = (
                round.iter().map(|r| r.1).min(),
                round.iter().map(|r| r.2).max(),
            ) else {
                continue;
            };
            let first_done = round.iter().map(|r| r.2).min().unwrap_or(last);
            spreads.push((last - first_done).as_secs_f64() * 1e6);
            let bytes: u64 = round.iter().map(|r| r.0).sum();
            let wall = (last - first).as_secs_f64().max(1e-9);
            walls.push(wall);
            aggregate.push(bytes as f64 / wall / 1e6);
            for &(bytes, start, end) in round {
                let took = (end - start).as_secs_f64().max(1e-9);
                per_node.push(bytes as f64 / took / 1e6);
                latencies.push(end - start);
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        latencies.sort_unstable();
        let percentile = |p: f64| {
            let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
            latencies.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        spreads.sort_by(f64::total_cmp);
        let object_bytes = (size * objects as u64).max(1) as f64;
        let source_sends_per_object = (!self.source_bytes.is_empty()).then(|| {
            let sent: Vec<f64> = self.source_bytes.iter().map(|&b| b as f64).collect();
            mean(&sent) / object_bytes
        });
        let source_link_utilisation = rate_bits_per_sec
            .filter(|_| !self.source_bytes.is_empty())
            .map(|rate| {
                let used: Vec<f64> = self
                    .source_bytes
                    .iter()
                    .zip(&walls)
                    .map(|(&bytes, wall)| bytes as f64 * 8.0 / (wall * rate as f64))
                    .collect();
                mean(&used)
            });
        ClusterRow {
            pattern: pattern.name().into(),
            system: system.into(),
            size_bytes: size,
            rounds: self.rounds.len(),
            aggregate_mb_per_sec: mean(&aggregate),
            per_node_mb_per_sec: mean(&per_node),
            p50_us: percentile(0.5),
            p99_us: percentile(0.99),
            completion_spread_us: spreads.get(spreads.len() / 2).copied().unwrap_or(0.0),
            source_sends_per_object,
            source_link_utilisation,
            ratios: Default::default(),
        }
    }
}

/// Runs each requesting node's part of a round on its own thread, all released together.
fn run_round<S: Send>(
    states: &mut [S],
    part: impl Fn(usize, &mut S) -> Result<u64, BenchError> + Sync,
) -> Result<Round, BenchError> {
    let barrier = Barrier::new(states.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = states
            .iter_mut()
            .enumerate()
            .map(|(node, state)| {
                let barrier = &barrier;
                let part = &part;
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let bytes = part(node, state)?;
                    Ok::<_, BenchError>((bytes, start, Instant::now()))
                })
            })
            .collect();
        let mut round = Vec::new();
        for handle in handles {
            let (bytes, start, end) = handle
                .join()
                .map_err(|_| BenchError::ThreadPanicked("benchmark"))??;
            if bytes > 0 {
                round.push((bytes, start, end));
            }
        }
        Ok(round)
    })
}

fn object_id(round: u64, pattern: Pattern, object: usize, size: u64) -> ObjectId {
    let mut bytes = [0u8; 20];
    bytes[..4].copy_from_slice(b"clst");
    bytes[4] = pattern as u8;
    bytes[5..8].copy_from_slice(&(object as u32).to_be_bytes()[1..]);
    bytes[8..12].copy_from_slice(&(size as u32).to_be_bytes());
    bytes[12..].copy_from_slice(&round.to_be_bytes());
    ObjectId(bytes)
}

fn setup_error(what: &str) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |e| BenchError::Io {
        what: what.to_string(),
        source: e,
    }
}

/// Socket buffers of the TCP fabric's connections (its `SOCKET_BUFFER_BYTES * 16`), given to
/// the raw TCP baseline too so neither side gets a better-tuned stream.
const FABRIC_SOCKET_BUFFER_BYTES: usize = 4 << 20;

fn tune(stream: &TcpStream) -> Result<(), BenchError> {
    use nix::sys::socket::{setsockopt, sockopt};
    stream.set_nodelay(true).map_err(setup_error("nodelay"))?;
    let _ = setsockopt(stream, sockopt::SndBuf, &FABRIC_SOCKET_BUFFER_BYTES);
    let _ = setsockopt(stream, sockopt::RcvBuf, &FABRIC_SOCKET_BUFFER_BYTES);
    Ok(())
}

/// A destination buffer with its pages faulted in, like a store's arena.
fn destination(size: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; size as usize];
    buffer.iter_mut().step_by(4096).for_each(|b| *b = 1);
    buffer
}

/// Raw TCP between the namespaces: a server on every node, a tuned stream from every node to
/// every other; a request (length) is answered with that many bytes in one `write_all`.
struct RawTcp {
    /// streams[i][j]: node i's stream to node j's server (None for i == j).
    streams: Vec<Vec<Option<TcpStream>>>,
}

impl RawTcp {
    fn start(netns: &NetnsCluster, largest: u64) -> Result<Self, BenchError> {
        let nodes = netns.hosts.len();
        let payload = Arc::new(vec![0x5au8; largest as usize]);
        let mut addrs = Vec::new();
        for node in 0..nodes {
            let addr = SocketAddr::from((netns.hosts[node].addr, 0));
            let listener = netns
                .in_namespace(node, || TcpListener::bind(addr))
                .map_err(BenchError::Netns)?
                .map_err(setup_error("raw TCP listener"))?;
            addrs.push(listener.local_addr().map_err(setup_error("raw TCP"))?);
            let payload = payload.clone();
            std::thread::spawn(move || {
                for _ in 0..nodes - 1 {
                    let Ok((stream, _)) = listener.accept() else {
                        return;
                    };
                    let payload = payload.clone();
                    std::thread::spawn(move || {
                        let _ = tune(&stream);
                        let mut stream = stream;
                        let mut request = [0u8; 8];
                        while stream.read_exact(&mut request).is_ok() {
                            let len = u64::from_le_bytes(request) as usize;
                            if stream
                                .write_all(&payload[..len.min(payload.len())])
                                .is_err()
                            {
                                return;
                            }
                        }
                    });
                }
            });
        }
        let mut streams = Vec::new();
        for node in 0..nodes {
            let mut row = Vec::new();
            for (peer, &addr) in addrs.iter().enumerate() {
                if peer == node {
                    row.push(None);
                    continue;
                }
                let stream = netns
                    .in_namespace(node, || TcpStream::connect(addr))
                    .map_err(BenchError::Netns)?
                    .map_err(setup_error("raw TCP connect"))?;
                tune(&stream)?;
                row.push(Some(stream));
            }
            streams.push(row);
        }
        Ok(Self { streams })
    }
}

fn pull(stream: &mut TcpStream, buffer: &mut [u8]) -> Result<(), BenchError> {
    let io = setup_error("raw TCP");
    stream
        .write_all(&(buffer.len() as u64).to_le_bytes())
        .map_err(&io)?;
    stream.read_exact(buffer).map_err(&io)
}

/// A `redis-server` in node 0's namespace, stopped on drop.
struct Redis {
    child: Child,
    addr: SocketAddr,
}

impl Redis {
    fn start(netns: &NetnsCluster, largest: u64) -> Result<Self, String> {
        let addr = SocketAddr::from((netns.hosts[0].addr, 6379));
        let max_bulk = (largest + (1 << 20)).max(512 << 20).to_string();
        let dir = std::env::temp_dir();
        let child = netns
            .command(0, "redis-server")
            .args(["--port", "6379", "--bind", &netns.hosts[0].addr.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--proto-max-bulk-len", &max_bulk])
            .args(["--client-query-buffer-limit", &max_bulk])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server ({e}); install it"))?;
        let mut redis = Self { child, addr };
        let started = Instant::now();
        loop {
            if let Ok(Ok(mut stream)) = netns.in_namespace(1, || TcpStream::connect(addr)) {
                let mut reply = [0u8; 7];
                if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
                    && stream.read_exact(&mut reply).is_ok()
                {
                    return Ok(redis);
                }
            }
            if started.elapsed() > Duration::from_secs(10)
                || redis.child.try_wait().ok().flatten().is_some()
            {
                return Err("redis-server did not answer within 10 s (is it installed?)".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn connect(
        &self,
        netns: &NetnsCluster,
        node: usize,
    ) -> Result<BufReader<TcpStream>, BenchError> {
        let addr = self.addr;
        let stream = netns
            .in_namespace(node, || TcpStream::connect(addr))
            .map_err(BenchError::Netns)?
            .map_err(setup_error("redis connect"))?;
        stream.set_nodelay(true).map_err(setup_error("redis"))?;
        Ok(BufReader::with_capacity(64 * 1024, stream))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn redis_key(pattern: Pattern, object: usize, size: u64) -> String {
    format!("skyriver-bench-{}-{object}-{size}", pattern.name())
}

fn redis_set(reader: &mut BufReader<TcpStream>, key: &str, size: u64) -> Result<(), BenchError> {
    let io = setup_error("redis SET");
    let mut command =
        format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${size}\r\n", key.len()).into_bytes();
    command.extend(std::iter::repeat_n(0x5au8, size as usize));
    command.extend_from_slice(b"\r\n");
    reader.get_mut().write_all(&command).map_err(&io)?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(&io)?;
    if line != "+OK\r\n" {
        return Err(BenchError::BadAnswer {
            server: "redis SET",
            answer: line,
        });
    }
    Ok(())
}

fn redis_del(reader: &mut BufReader<TcpStream>, key: &str) -> Result<(), BenchError> {
    let io = setup_error("redis DEL");
    let command = format!("*2\r\n$3\r\nDEL\r\n${}\r\n{key}\r\n", key.len());
    reader
        .get_mut()
        .write_all(command.as_bytes())
        .map_err(&io)?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(&io)?;
    Ok(())
}

/// GET straight into `buffer` (its length is the value's).
fn redis_get(
    reader: &mut BufReader<TcpStream>,
    key: &str,
    buffer: &mut [u8],
) -> Result<(), BenchError> {
    let io = setup_error("redis GET");
    let command = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
    reader
        .get_mut()
        .write_all(command.as_bytes())
        .map_err(&io)?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(&io)?;
    let len: usize = line
        .strip_prefix('$')
        .and_then(|l| l.trim_end().parse().ok())
        .ok_or_else(|| BenchError::BadAnswer {
            server: "redis GET",
            answer: line.clone(),
        })?;
    if len != buffer.len() {
        return Err(BenchError::Check(format!("redis GET returned {len} bytes")));
    }
    reader.read_exact(buffer).map_err(&io)?;
    let mut crlf = [0u8; 2];
    reader.read_exact(&mut crlf).map_err(&io)
}

pub(super) fn run(args: &ClusterArgs) -> Result<(), BenchError> {
    if args.nodes < 3 {
        return Err(BenchError::Usage(
            "bench cluster needs --nodes 3 or more".into(),
        ));
    }
    crate::netns::available().map_err(BenchError::NoNamespaces)?;
    // Ctrl-C or SIGTERM removes the namespaces and what runs in them.
    crate::netns::remove_on_signal();
    let nodes = args.nodes as usize;
    let baselines = super::chosen_baselines(&args.baselines);
    let patterns: Vec<Pattern> = args.patterns.iter().map(|p| Pattern::parse(p)).collect();
    let plan = memory_plan::RunShape {
        nodes: u64::from(args.nodes),
        patterns: &patterns,
        tcp: baselines.iter().any(|b| b == "tcp"),
        redis: baselines.iter().any(|b| b == "redis"),
    };
    let asked: Vec<u64> = args.sizes.iter().map(|s| s.0).collect();
    let sizes = memory_plan::sizes_that_fit(&plan, &asked)?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let memory = ByteSize(plan.store_bytes(largest));
    let exe = crate::self_exe().map_err(BenchError::OwnPath)?;
    eprintln!(
        "starting {nodes} daemons in network namespaces with {} each (prefaulted){}...",
        format_bytes(memory.0),
        args.link
            .as_ref()
            .map_or_else(String::new, |l| format!(", links {l}"))
    );
    let socket_dir =
        std::env::temp_dir().join(format!("skyriver-bench-cluster-{}", std::process::id()));
    crate::netns::remove_dir_on_signal(socket_dir.clone());
    // Dropped after the cluster (declared before it): on a failure the daemons have stopped and
    // their logs are complete when it names them.
    let mut logs = LogsKeptOnFailure {
        dir: socket_dir.clone(),
        done: false,
    };
    let mut up = UpArgs::new(args.nodes, memory, Some(socket_dir.clone()));
    up.netns = true;
    up.link = args.link.clone();
    // As a deployed daemon runs: a store's first fill would otherwise zero its pages on the
    // data path (most of the CPU of a 64 MiB broadcast to 16 nodes on 2 vCPUs), where the
    // baselines receive into buffers they touched before.
    up.prefault = true;
    if let Some(relay_min_bytes) = &args.relay_min_bytes {
        up.daemon_args = vec!["--relay-min-bytes".into(), relay_min_bytes.clone()];
    }
    if args.learn_locations {
        up.daemon_args.push("--learn-locations".into());
    }
    let cluster = LocalCluster::start_tied_to_this_thread(&up, &exe)?;
    let netns = cluster
        .netns
        .as_ref()
        .ok_or_else(|| BenchError::Check("the cluster has no namespaces".into()))?;
    let shape = netns.shape.clone();
    let view = Client::connect(&cluster.sockets[1])?.nodes()?;
    for member in view.members.iter().filter(|m| m.node != view.node) {
        eprintln!("  node-1 → {}: {}", member.node, member.link);
    }
    let addrs: Vec<Ipv4Addr> = netns.hosts.iter().map(|h| h.addr).collect();

    let mut tcp = if baselines.iter().any(|b| b == "tcp") {
        Some(RawTcp::start(netns, largest)?)
    } else {
        None
    };
    let redis = if baselines.iter().any(|b| b == "redis") {
        match Redis::start(netns, largest) {
            Ok(server) => Some(server),
            Err(reason) => {
                eprintln!("redis baseline skipped: {reason}");
                None
            }
        }
    } else {
        None
    };
    let mut redis_clients = match &redis {
        Some(server) => Some(
            (0..nodes)
                .map(|node| server.connect(netns, node))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let mut clients: Vec<Client> = cluster
        .sockets
        .iter()
        .map(Client::connect)
        .collect::<Result<_, _>>()?;
    let node_ids: Vec<NodeId> = clients
        .iter()
        .map(|c| c.nodes().map(|view| view.node))
        .collect::<Result<_, _>>()?;
    let mut breakdowns: Vec<cluster_trace::Breakdown> = Vec::new();
    let mut pace_rows: Vec<relay_pace::PaceRow> = Vec::new();

    let budget = Duration::from_millis(args.millis_per_case);
    let mut rows: Vec<ClusterRow> = Vec::new();
    let mut round_counter = 0u64;
    let total = patterns.len() * sizes.len();
    let mut case = 0;
    for &pattern in &patterns {
        for &size in &sizes {
            case += 1;
            eprintln!(
                "[{case}/{total}] {} {}...",
                pattern.name(),
                format_bytes(size)
            );
            let data = vec![0x5au8; size as usize];
            let objects = pattern.objects(nodes);
            // Baseline state for this case: destination buffers per node and source.
            let baselines_run = tcp.is_some() || redis_clients.is_some();
            let mut tcp_state: Vec<Buffers> = (0..nodes)
                .map(|node| {
                    let wants = pattern.wants(nodes, node);
                    let buffers = match pattern {
                        _ if wants.is_empty() || !baselines_run => Vec::new(),
                        Pattern::AllToAll => wants.iter().map(|_| destination(size)).collect(),
                        _ => vec![destination(size)],
                    };
                    buffers
                })
                .collect();
            if let Some(redis_clients) = &mut redis_clients {
                for &(object, _) in &objects {
                    redis_set(
                        &mut redis_clients[0],
                        &redis_key(pattern, object, size),
                        size,
                    )?;
                }
            }
            let mut samples: Vec<(String, Samples)> = Vec::new();
            samples.push(("skyriver".into(), Samples::default()));
            if args.hinted {
                samples.push((HINTED.into(), Samples::default()));
            }
            if tcp.is_some() {
                samples.push(("tcp".into(), Samples::default()));
            }
            if redis_clients.is_some() {
                samples.push(("redis".into(), Samples::default()));
            }
            let pace_before = relay_pace::snapshot(&clients)?;
            let started = Instant::now();
            let mut rounds = 0;
            while rounds < args.max_rounds
                && (rounds < args.min_rounds || started.elapsed() < budget * samples.len() as u32)
            {
                rounds += 1;
                for (system, collected) in samples.iter_mut() {
                    let source_before = netns.sent_bytes(0);
                    let round = match system.as_str() {
                        "skyriver" | HINTED => {
                            round_counter += 1;
                            let hints = (system == HINTED).then_some(node_ids.as_slice());
                            let round_of = (pattern, round_counter, size);
                            let batched = args.broadcast_batched;
                            skyriver_round(&mut clients, round_of, &data, (hints, batched), None)?
                        }
                        "tcp" => {
                            let streams = &mut tcp.as_mut().expect("tcp baseline started").streams;
                            tcp_round(streams, &mut tcp_state, pattern)?
                        }
                        _ => {
                            let readers = redis_clients.as_mut().expect("redis baseline started");
                            redis_round(readers, &mut tcp_state, pattern, size)?
                        }
                    };
                    collected.rounds.push(round);
                    if pattern == Pattern::Broadcast {
                        let sent = netns.sent_bytes(0).saturating_sub(source_before);
                        collected.source_bytes.push(sent);
                    }
                }
            }
            let pace_after = relay_pace::snapshot(&clients)?;
            let skyriver_rounds = rounds * if args.hinted { 2 } else { 1 };
            let case_of = (pattern.name(), size);
            pace_rows.push(relay_pace::row(
                case_of,
                skyriver_rounds,
                &pace_before,
                &pace_after,
            ));
            if args.breakdown {
                for system in ["skyriver", HINTED] {
                    if system == HINTED && !args.hinted {
                        continue;
                    }
                    round_counter += 1;
                    let hints = (system == HINTED).then_some(node_ids.as_slice());
                    let mut spans = Vec::new();
                    cluster_trace::start(&clients)?;
                    let round_of = (pattern, round_counter, size);
                    let how = (hints, args.broadcast_batched);
                    skyriver_round(&mut clients, round_of, &data, how, Some(&mut spans))?;
                    let case = (system, pattern.name(), size);
                    breakdowns.push(cluster_trace::finish(&clients, &spans, case)?);
                }
            }
            if let Some(redis_clients) = &mut redis_clients {
                for &(object, _) in &objects {
                    redis_del(&mut redis_clients[0], &redis_key(pattern, object, size))?;
                }
            }
            let rate = shape.rate_bits_per_sec;
            let mut case_rows: Vec<ClusterRow> = samples
                .iter()
                .map(|(system, s)| s.row((pattern, system, size), objects.len(), rate))
                .collect();
            let bases: Vec<(String, f64)> = case_rows
                .iter()
                .filter(|r| r.system != "skyriver" && r.system != HINTED)
                .map(|r| (r.system.clone(), r.aggregate_mb_per_sec))
                .collect();
            for row in &mut case_rows {
                for (base, mb) in &bases {
                    if *base != row.system {
                        row.ratios.insert(
                            base.clone(),
                            row.aggregate_mb_per_sec / mb.max(f64::MIN_POSITIVE),
                        );
                    }
                }
            }
            rows.extend(case_rows);
        }
    }
    drop(clients);
    drop(redis_clients);
    drop(redis);
    drop(tcp);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&socket_dir);
    logs.done = true;

    print_table(&rows, args, &shape);
    cluster_trace::print(&breakdowns);
    relay_pace::print(&pace_rows);
    let document = serde_json::json!({
        "benchmark": "cluster",
        "nodes": nodes,
        "fabric": "tcp",
        "link": args.link.as_ref().map(|l| l.text.clone()),
        "link_applied": shape,
        "learn_locations": args.learn_locations,
        "addresses": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "millis_per_case": args.millis_per_case,
        "machine": MachineInfo::probe(),
        "results": rows,
        "breakdowns": breakdowns,
        "relay_pace": pace_rows,
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
    let mut series: Vec<super::plot::Series> = Vec::new();
    for row in &rows {
        let name = if row.system == "skyriver" {
            format!("skyriver {}", row.pattern)
        } else {
            format!("{} {}", row.system, row.pattern)
        };
        match series.iter_mut().find(|s| s.name == name) {
            Some(line) => line
                .points
                .push((row.size_bytes as f64, row.aggregate_mb_per_sec)),
            None => series.push(super::plot::Series {
                name,
                points: vec![(row.size_bytes as f64, row.aggregate_mb_per_sec)],
            }),
        }
    }
    let title = format!(
        "aggregate bandwidth, {nodes} nodes in namespaces, {}",
        describe_link(args, &shape)
    );
    std::fs::write(&args.plot, super::plot::svg(&title, &series)).map_err(|e| BenchError::Io {
        what: format!("cannot write {}", args.plot.display()),
        source: e,
    })?;
    eprintln!("wrote {}", args.plot.display());
    Ok(())
}

/// Names the daemons' directory (their logs) when the run ends early with an error; the run
/// that completes removes it instead.
struct LogsKeptOnFailure {
    dir: PathBuf,
    done: bool,
}

impl Drop for LogsKeptOnFailure {
    fn drop(&mut self) {
        if !self.done && self.dir.exists() {
            eprintln!(
                "bench cluster: the daemons' logs are kept in {} (remove it when done)",
                self.dir.display()
            );
        }
    }
}

fn describe_link(args: &ClusterArgs, shape: &crate::netns::AppliedShape) -> String {
    match (&args.link, &shape.latency_not_applied) {
        (None, _) => "unshaped veth links".into(),
        (Some(link), None) => format!("links {link}"),
        (Some(link), Some(_)) => format!("links {link} (latency not applied: no netem)"),
    }
}

/// One Skyriver round: fresh objects on their holders (untimed, and published before the
/// round starts), every requester fetches its share, then every copy is deleted (untimed).
/// With `hints` (every node's id, by index), each fetch names its object's holder. With
/// `batched`, a broadcast's requesters ask for all their objects in one fetch (unhinted). With
/// `spans`, each fetch's send and reply times are kept there (for `--breakdown`).
fn skyriver_round(
    clients: &mut [Client],
    (pattern, round, size): (Pattern, u64, u64),
    data: &[u8],
    (hints, batched): (Option<&[NodeId]>, bool),
    spans: Option<&mut Vec<cluster_trace::FetchSpan>>,
) -> Result<Round, BenchError> {
    let nodes = clients.len();
    let objects = pattern.objects(nodes);
    let ids: Vec<ObjectId> = objects
        .iter()
        .map(|&(object, _)| object_id(round, pattern, object, size))
        .collect();
    for (&(_, holder), &id) in objects.iter().zip(&ids) {
        clients[holder].create_and_seal(id, data, b"")?;
    }
    let started = Instant::now();
    for &id in &ids {
        while clients[0].locate(id)?.holders.is_empty() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::Check(format!("{id} was never published")));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let timeout = Some(Duration::from_secs(120));
    let traced = std::sync::Mutex::new(Vec::new());
    let result = run_round(clients, |node, client| {
        let wants: Vec<ObjectId> = pattern
            .wants(nodes, node)
            .into_iter()
            .map(|object| ids[object])
            .collect();
        let mut bytes = 0;
        match pattern {
            Pattern::AllToAll if !wants.is_empty() => {
                for result in client.fetch(&wants, timeout)? {
                    bytes += result.map_err(BenchError::Fetch)?.data().len() as u64;
                }
            }
            Pattern::Broadcast if batched && !wants.is_empty() => {
                for result in client.fetch(&wants, timeout)? {
                    bytes += result.map_err(BenchError::Fetch)?.data().len() as u64;
                }
            }
            _ => {
                for object in pattern.wants(nodes, node) {
                    let id = ids[object];
                    let sent_ns = monotonic_ns();
                    let fetched = match hints {
                        Some(hints) => {
                            let holder = hints[objects[object].1];
                            let mut results = client.fetch_from(&[id], timeout, holder)?;
                            results
                                .pop()
                                .ok_or_else(|| BenchError::Check("no fetch result".into()))?
                                .map_err(BenchError::Fetch)?
                        }
                        None => client.fetch_one(id, timeout)?,
                    };
                    let received_ns = monotonic_ns();
                    bytes += fetched.data().len() as u64;
                    drop(fetched);
                    if let Ok(mut traced) = traced.lock() {
                        traced.push(cluster_trace::FetchSpan {
                            node,
                            sent_ns,
                            received_ns,
                        });
                    }
                }
            }
        }
        Ok(bytes)
    });
    if let Some(spans) = spans {
        spans.extend(traced.into_inner().unwrap_or_else(|p| p.into_inner()));
    }
    for client in clients.iter() {
        client.flush()?;
        client.delete(&ids)?;
    }
    result
}

fn tcp_round(
    streams: &mut [Vec<Option<TcpStream>>],
    state: &mut [Buffers],
    pattern: Pattern,
) -> Result<Round, BenchError> {
    let nodes = streams.len();
    let mut paired: Vec<(&mut Vec<Option<TcpStream>>, &mut Buffers)> =
        streams.iter_mut().zip(state.iter_mut()).collect();
    run_round(&mut paired, |node, (streams, buffers)| {
        let wants = pattern.wants(nodes, node);
        let mut bytes = 0;
        match pattern {
            Pattern::AllToAll => {
                // One stream per source, each on its own thread, as a batched fetch would.
                std::thread::scope(|scope| {
                    let mut handles = Vec::new();
                    let mut buffers = buffers.iter_mut();
                    for (source, stream) in streams.iter_mut().enumerate() {
                        let Some(stream) = stream else { continue };
                        if !wants.contains(&source) {
                            continue;
                        }
                        let buffer = buffers.next().expect("a buffer per source");
                        handles.push(
                            scope.spawn(move || pull(stream, buffer).map(|()| buffer.len() as u64)),
                        );
                    }
                    for handle in handles {
                        bytes += handle
                            .join()
                            .map_err(|_| BenchError::ThreadPanicked("TCP"))??;
                    }
                    Ok::<_, BenchError>(())
                })?;
            }
            _ => {
                // Only node 0 has the objects: a raw stream cannot ask anyone else.
                for _ in wants {
                    let stream = streams[0].as_mut().expect("a stream to node 0");
                    pull(stream, &mut buffers[0])?;
                    bytes += buffers[0].len() as u64;
                }
            }
        }
        Ok(bytes)
    })
}

fn redis_round(
    readers: &mut [BufReader<TcpStream>],
    state: &mut [Buffers],
    pattern: Pattern,
    size: u64,
) -> Result<Round, BenchError> {
    let nodes = readers.len();
    let mut paired: Vec<(&mut BufReader<TcpStream>, &mut Buffers)> =
        readers.iter_mut().zip(state.iter_mut()).collect();
    run_round(&mut paired, |node, (reader, buffers)| {
        let mut bytes = 0;
        for object in pattern.wants(nodes, node) {
            let buffer = &mut buffers[0];
            redis_get(reader, &redis_key(pattern, object, size), buffer)?;
            bytes += buffer.len() as u64;
        }
        Ok(bytes)
    })
}

fn print_table(rows: &[ClusterRow], args: &ClusterArgs, shape: &crate::netns::AppliedShape) {
    println!(
        "bench cluster: {} nodes in network namespaces, {}, TCP fabric; ratios: aggregate / the baseline's",
        args.nodes,
        describe_link(args, shape)
    );
    if let Some(reason) = &shape.latency_not_applied {
        println!("  (latency not applied: {reason})");
    }
    let baselines: Vec<&str> = ["tcp", "redis"]
        .into_iter()
        .filter(|b| rows.iter().any(|r| r.system == *b))
        .collect();
    print!(
        "{:<11} {:>9} {:<9} {:>7} {:>11} {:>11} {:>11} {:>11}",
        "pattern", "size", "system", "rounds", "aggr MB/s", "node MB/s", "p50 µs", "p99 µs"
    );
    print!(" {:>10} {:>6} {:>6}", "spread µs", "src×", "src%");
    for b in &baselines {
        print!(" {:>8}", format!("×{b}"));
    }
    println!();
    let mut last = (String::new(), 0);
    for row in rows {
        let key = (row.pattern.clone(), row.size_bytes);
        let (pattern, size) = if key == last {
            (String::new(), String::new())
        } else {
            (row.pattern.clone(), format_bytes(row.size_bytes))
        };
        last = key;
        print!(
            "{pattern:<11} {size:>9} {:<9} {:>7} {:>11.1} {:>11.1} {:>11.1} {:>11.1}",
            row.system,
            row.rounds,
            row.aggregate_mb_per_sec,
            row.per_node_mb_per_sec,
            row.p50_us,
            row.p99_us
        );
        let optional = |value: Option<f64>, scale: f64| {
            value.map_or_else(String::new, |v| format!("{:.1}", v * scale))
        };
        print!(
            " {:>10.1} {:>6} {:>6}",
            row.completion_spread_us,
            optional(row.source_sends_per_object, 1.0),
            optional(row.source_link_utilisation, 100.0)
        );
        for b in &baselines {
            match row.ratios.get(*b) {
                Some(r) => print!(" {:>7.2}x", r),
                None => print!(" {:>8}", ""),
            }
        }
        println!();
    }
    if rows.iter().any(|r| r.pattern == Pattern::Broadcast.name()) {
        let (ratio, why) = broadcast_bound(args.nodes, args.broadcast_batched);
        println!("  broadcast: at most {ratio:.2}x a star from the source on equal links ({why})");
    }
    println!();
}

/// The best ratio to a star from the source a broadcast round of `nodes` can reach on equal
/// links, and why. A star sends (N−1)² objects over the source's link. Fetching one object
/// after another, a node's first object exists only at the source, which must send all N−1
/// first objects before the last of them is in; that node then brings in N−2 more: (N−1) +
/// (N−2) object times. Fetching all at once, only each node's own link bounds it: N−1 object
/// times.
fn broadcast_bound(nodes: u32, batched: bool) -> (f64, &'static str) {
    let n = f64::from(nodes.max(2));
    let star = (n - 1.0) * (n - 1.0);
    if batched {
        (
            star / (n - 1.0),
            "each node's link brings in every object once",
        )
    } else {
        let why = "fetched one after another, each node's first object comes from the source \
                   alone, and the last of them is in only once the source sent them all";
        (star / (2.0 * n - 3.0), why)
    }
}

#[cfg(test)]
mod tests {
    use super::broadcast_bound;

    #[test]
    fn a_broadcast_fetched_one_after_another_is_bounded_below_a_batched_one() {
        let (sequential, _) = broadcast_bound(8, false);
        let (batched, _) = broadcast_bound(8, true);
        assert!((sequential - 49.0 / 13.0).abs() < 1e-9, "{sequential}");
        assert!((batched - 7.0).abs() < 1e-9, "{batched}");
        // Three nodes: a star sends 4 objects; one after another takes 2 + 1 object times.
        assert!((broadcast_bound(3, false).0 - 4.0 / 3.0).abs() < 1e-9);
    }
}
