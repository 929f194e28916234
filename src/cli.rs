//! The `skyriver` command line: its definitions and every command's body. The `skyriver`
//! binary and the Python package's `skyriver` entry point both run [`main_with_args`].

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::net::SocketAddr;

use skyriver_client::{Client, ClientError, ObjectEvent, ObjectId, StoreError};
use skyriver_core::client_protocol::MAX_INLINE_PUT_BYTES;
use skyriver_core::node::{ThresholdPolicy, TransferMode};
use skyriver_core::NodeId;
use skyriver_daemon::size::{format_bytes, ByteSize};
use skyriver_daemon::{ClusterConfig, DaemonConfig, DirectoryChoice, FabricChoice};
use skyriver_transport::directory::DirectorySpec;

/// Skyriver: a distributed in-memory object store for RDMA clusters.
///
/// Start a daemon on each node (`skyriver daemon`), then put, get and list objects through
/// its Unix socket. Objects are immutable once sealed and read in place, without copies.
#[derive(Parser)]
#[command(name = "skyriver", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct SocketArg {
    /// The daemon's Unix socket [default: $SKYRIVER_SOCKET or /tmp/skyriver-<uid>/skyriver.sock]
    #[arg(long, short = 's', global = true)]
    socket: Option<PathBuf>,
}

impl SocketArg {
    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(skyriver_client::default_socket_path)
    }

    /// Connects, waiting (and saying so) while the daemon is still starting.
    fn connect(&self) -> Result<Client, ClientError> {
        let path = self.path();
        let started = std::time::Instant::now();
        let mut told = None::<std::time::Instant>;
        loop {
            match Client::connect(&path) {
                Err(ClientError::Store(StoreError::Starting(status)))
                    if started.elapsed() < STARTING_WAIT =>
                {
                    if told.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                        eprintln!(
                            "skyriver: the daemon at {} is starting ({status}); waiting",
                            path.display()
                        );
                        told = Some(std::time::Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }
}

/// How long a command waits for a daemon that is still starting.
const STARTING_WAIT: Duration = Duration::from_secs(600);

#[derive(Subcommand)]
enum Command {
    /// Run the node daemon: holds objects in shared memory and serves local clients.
    Daemon(Box<DaemonArgs>),
    /// Run the daemon with plasma_store's flags, `-m BYTES -s SOCKET [-d DIR -h]`, for scripts
    /// written for Plasma. Also runs as `plasma_store` (a symbolic link to skyriver by that
    /// name).
    #[command(name = "plasma_store", alias = "plasma-store")]
    PlasmaStore(PlasmaStoreArgs),
    /// Store a file (or standard input) as a new object and print its id.
    Put {
        /// The file to store; `-` reads standard input.
        input: PathBuf,
        /// Use this id (40 hex characters) instead of a random one.
        #[arg(long)]
        id: Option<ObjectId>,
        /// Metadata to store with the object (a short string).
        #[arg(long, default_value = "")]
        metadata: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Write an object's data to a file or standard output.
    Get {
        /// The object's id (40 hex characters).
        id: ObjectId,
        /// Write here instead of standard output.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Wait this many milliseconds for the object to be sealed (default: do not wait).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List the objects in the store.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Delete objects (deferred while a client holds them).
    Rm {
        /// The objects' ids.
        #[arg(required = true)]
        ids: Vec<ObjectId>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Show memory use and object counts.
    Stat {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Print seal and delete events as they happen. Exits 0 after --count events, 1 when the
    /// daemon stops or dies.
    Watch {
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Evict unused objects until at least SIZE bytes are freed. Exits 1 when less could be
    /// freed because the objects left are in use; a store left empty succeeds, however little
    /// it held.
    Evict {
        /// How much to free, e.g. 1GiB.
        size: ByteSize,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Fetch objects from other nodes of the cluster into this node's store.
    Fetch {
        /// The objects' ids.
        #[arg(required = true)]
        ids: Vec<ObjectId>,
        /// Write the (single) object's data here; `-` for standard output.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Give up after this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// Transfer path: auto (the daemon's threshold), or eager or rendezvous forced.
        #[arg(long, default_value = "auto")]
        mode: TransferMode,
        /// Wait (up to --timeout-ms) for a node to publish objects nobody holds yet; without
        /// it such an object fails at once.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List the cluster's nodes as this daemon sees them.
    Nodes {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// A live view of one daemon or several (--socket repeated): memory, ops/s, fetch MB/s in
    /// and out, work in flight, and every node of the cluster with its traffic and errors.
    /// `q` quits; --once prints one frame, --once --json one JSON document.
    Top(crate::top::TopArgs),
    /// Show which nodes hold an object.
    Locate {
        /// The object's id.
        id: ObjectId,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Start a local cluster of N daemons on this machine and supervise them.
    ///
    /// Each daemon's output goes to node-N.log in the cluster's directory. If a daemon exits,
    /// during start-up or later, up reports it at once (exit status and the last lines of its
    /// log), stops the others and exits with status 1; it does not restart it. Ctrl-C, SIGTERM
    /// or SIGHUP stop the cluster cleanly (exit status 0). Built-in directory on node 0 by
    /// default, or --directory redis://HOST:PORT; TCP or verbs fabric.
    Up(crate::up::UpArgs),
    /// Operations on a cluster's records in its directory (e.g. `cluster reset`).
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
    /// Start a throw-away daemon, store and read back a few objects, and show the store.
    Demo,
    /// Run the deterministic cluster simulator: one seed (--seed N) or a sweep (--seeds COUNT).
    Sim(skyriver_sim::cli::SimArgs),
    /// Benchmarks that print a table and write JSON.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
}

/// The daemon's flags. plasma_store's `-m BYTES` and `-s SOCKET` work here too; its `-d DIR -h`
/// (huge pages) belong to `skyriver plasma_store`, so `-h` prints help here as everywhere.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("membership").args(["head", "join", "directory"])))]
struct DaemonArgs {
    /// Unix socket to serve clients on [default: $SKYRIVER_SOCKET or /tmp/skyriver-<uid>/skyriver.sock]
    #[arg(long, short = 's')]
    socket: Option<PathBuf>,
    /// Shared memory for objects, e.g. 4GiB or 1000000000 (bytes, as plasma_store's -m).
    #[arg(long, short = 'm', default_value = "1GiB", env = "SKYRIVER_MEMORY")]
    memory: ByteSize,
    /// Back the store with a file on this hugetlbfs mount (e.g. /dev/hugepages).
    #[arg(long)]
    hugepages: Option<PathBuf>,
    /// Persistent mode: keep objects in this file (and its index in PATH.index), e.g. on a
    /// DAX file system over persistent memory, /dev/shm or a local SSD. Sealed objects survive
    /// a crash and are recovered in place on restart; created with --memory bytes if absent.
    #[arg(long, value_name = "PATH", conflicts_with = "hugepages")]
    backing_file: Option<PathBuf>,
    /// With --backing-file: when a seal is durable. `seal`: before the seal returns. `async`:
    /// within 10 ms (a crash may lose the last seals, never corrupt one).
    #[arg(long, value_enum, default_value_t = skyriver_daemon::persistence::Durability::Seal,
          requires = "backing_file")]
    durability: skyriver_daemon::persistence::Durability,
    /// Do not touch every page at start (faster start, first writes fault pages in).
    #[arg(long)]
    no_prefault: bool,
    /// Start even when --memory is more than the machine can give now (MemAvailable, the
    /// cgroup limit, free huge pages). The kernel may then kill processes when the store fills.
    #[arg(long)]
    allow_overcommit: bool,
    /// Permission bits of the socket, in octal [default: 600, or 660 with --socket-group]
    #[arg(long, value_parser = parse_octal)]
    socket_mode: Option<u32>,
    /// Give this group's members access to the socket (its group, mode 660), for shared nodes.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Accept a socket directory that other users can write or own (by default the daemon
    /// refuses one, e.g. a bare /tmp: another user could take the socket's path)
    #[arg(long)]
    allow_shared_socket_dir: bool,
    /// Log filter, e.g. info, debug, skyriver=trace (or RUST_LOG).
    #[arg(long, default_value = "info", value_parser = skyriver_daemon::logging::parse_filter)]
    log: String,
    /// Log lines as text, or as one JSON object per line (for log shippers).
    #[arg(long, value_enum, default_value = "text")]
    log_format: skyriver_daemon::logging::LogFormat,
    /// Serve Prometheus metrics (GET /metrics) and health (GET /healthz) over HTTP on this
    /// address, e.g. 127.0.0.1:9464; a bare port listens on loopback [default: off]
    #[arg(long, value_name = "ADDR", value_parser = skyriver_daemon::logging::parse_metrics_addr)]
    metrics: Option<SocketAddr>,
    /// Record every input of the node (client requests, peer messages, completions, timers)
    /// and a digest of every output to FILE, for `skyriver sim --replay FILE`. Written by a
    /// background thread; entries it cannot keep up with are dropped and counted. Holds the
    /// bytes of small objects sent eagerly and of inline puts.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// With --record: bytes FILE may reach before it moves to FILE.1 (replacing the previous
    /// one) and a new FILE starts.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "256MiB",
        requires = "record"
    )]
    record_max_bytes: ByteSize,
    /// Microseconds the daemon keeps polling for input after activity before it sleeps (a
    /// sleeping daemon pays a wake-up per request; an idle one spends no CPU); 0: never poll
    #[arg(long, value_name = "N", env = "SKYRIVER_POLL_US", default_value_t = skyriver_transport::poll::DEFAULT_POLL_US,
          value_parser = parse_poll_us)]
    poll_us: u64,
    /// Microseconds the polling time may grow to while requests keep arriving just after it
    /// ends (it doubles each time, and falls back to --poll-us after a longer quiet spell); at
    /// or below --poll-us: it never grows
    #[arg(long, value_name = "N", env = "SKYRIVER_POLL_MAX_US", default_value_t = skyriver_transport::poll::DEFAULT_POLL_MAX_US,
          value_parser = parse_poll_us)]
    poll_max_us: u64,
    /// This node's id in the cluster [default: $SLURM_NODEID, else 0 with --head]
    #[arg(long, requires = "membership")]
    node_id: Option<u32>,
    /// Serve the built-in directory on this address (this daemon is the cluster's head).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "0.0.0.0:7390",
          conflicts_with_all = ["join", "directory"])]
    head: Option<SocketAddr>,
    /// Join the cluster whose head daemon serves the built-in directory at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "directory")]
    join: Option<String>,
    /// Use this directory: redis://[USER:PASSWORD@]HOST:PORT, rediss://… for TLS (or HOST:PORT
    /// of a head daemon). From the environment it stays out of `ps`.
    #[arg(
        long,
        value_name = "URL",
        env = "SKYRIVER_DIRECTORY_URL",
        hide_env_values = true
    )]
    directory: Option<String>,
    /// Read the Redis password of --directory redis://HOST:PORT from this file, which only its
    /// owner may read (mode 0600), instead of putting it in the URL.
    #[arg(long, value_name = "PATH", requires = "directory")]
    directory_password_file: Option<PathBuf>,
    /// Where the fabric accepts other daemons (port 0: any free port).
    #[arg(long, default_value = "0.0.0.0:0", requires = "membership")]
    listen: SocketAddr,
    /// Fabric between nodes: verbs (RDMA), tcp, or auto (verbs when a device is present).
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcp", "verbs"],
          requires = "membership")]
    fabric: String,
    /// RDMA device for the verbs fabric, e.g. mlx5_0 or rxe0 [default: the first one]
    #[arg(long, requires = "membership")]
    device: Option<String>,
    /// Port of the RDMA device (1 to 255).
    #[arg(long, default_value_t = 1, value_parser = parse_ib_port)]
    ib_port: u8,
    /// GID index for RoCE, 0 to 255 [default: the first RoCE v2 IPv4 GID]
    #[arg(long, value_parser = parse_gid_index)]
    gid_index: Option<u32>,
    /// Verbs: let peers READ through the arenas' registrations instead of a memory window per
    /// lease (any connected peer can then READ any arena byte; for devices whose windows
    /// misbehave, and to measure what windows cost).
    #[arg(long)]
    no_memory_windows: bool,
    /// Eager/rendezvous switch: auto (from measured costs) or a size such as 64KiB.
    #[arg(long, default_value = "auto")]
    eager_threshold: String,
    /// How long an object stays pinned for a requester that stopped answering mid-transfer
    /// (1000 to 3600000: a rendezvous must finish within it).
    #[arg(long, default_value_t = 10_000, value_parser = parse_lease_ms)]
    lease_ms: u64,
    /// Objects whose holders this node remembers, so fetching one again skips the directory
    /// lookup (0: ask the directory every time; at most 16777216). A stale entry costs one
    /// round trip.
    #[arg(long, default_value_t = 65_536, value_parser = parse_location_cache)]
    location_cache: usize,
    /// Name of the cluster (the key prefix in Redis).
    #[arg(long, default_value = "default", env = "SKYRIVER_CLUSTER")]
    cluster: String,
    /// Shared secret of the cluster (the same on every node); without one (or --token-file,
    /// or --insecure) the fabric and the directory listen on loopback only.
    #[arg(long, env = "SKYRIVER_CLUSTER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Read the cluster token from this file, which only its owner may read (mode 0600).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Without a token, listen on other addresses than loopback anyway: any host that reaches
    /// this node can join the cluster and read every object.
    #[arg(long)]
    insecure: bool,
    /// The IP peers dial this node's fabric at, when --listen is unspecified (0.0.0.0)
    /// [default: the source address of the route towards the directory]
    #[arg(long, value_name = "IP", requires = "membership")]
    advertise: Option<std::net::IpAddr>,
}

/// plasma_store's flags: `-h` means huge pages here, as in plasma_store; `--help` prints help.
#[derive(Args)]
#[command(disable_help_flag = true)]
struct PlasmaStoreArgs {
    /// Shared memory for objects, in bytes (or a size such as 4GiB).
    #[arg(short = 'm', value_name = "BYTES")]
    memory: ByteSize,
    /// The Unix socket to serve clients on.
    #[arg(short = 's', value_name = "SOCKET")]
    socket: PathBuf,
    /// With -h, the hugetlbfs mount to back the store with (as `skyriver daemon --hugepages
    /// DIR`); without -h, the store is a memfd (the same shared memory as a file in /dev/shm)
    /// and DIR is not used.
    #[arg(short = 'd', value_name = "DIR")]
    directory: Option<PathBuf>,
    /// Back the store with huge pages from the -d mount.
    #[arg(short = 'h', requires = "directory")]
    huge_pages: bool,
    /// Plasma's external store for evicted objects (`file://DIR`): refused until Skyriver
    /// spills evicted objects to disk (`--spill-dir DIR`).
    #[arg(short = 'e', value_name = "URL")]
    external_store: Option<String>,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// More `skyriver daemon` flags after `--`, e.g. `-- --log debug --no-prefault`.
    #[arg(last = true, value_name = "DAEMON FLAGS")]
    daemon_flags: Vec<std::ffi::OsString>,
}

/// `skyriver` started through a link named `plasma_store`.
#[derive(Parser)]
#[command(name = "plasma_store", version)]
struct PlasmaStoreCli {
    #[command(flatten)]
    args: PlasmaStoreArgs,
}

/// Runs the daemon from plasma_store's flags: they are turned into `skyriver daemon`'s.
fn run_plasma_store(args: PlasmaStoreArgs) -> Result<(), String> {
    if let Some(url) = &args.external_store {
        return Err(external_store_refusal(url));
    }
    let mut argv: Vec<std::ffi::OsString> = vec![
        "skyriver".into(),
        "daemon".into(),
        "--memory".into(),
        args.memory.0.to_string().into(),
        "--socket".into(),
        args.socket.into(),
    ];
    if let (true, Some(dir)) = (args.huge_pages, args.directory) {
        argv.push("--hugepages".into());
        argv.push(dir.into());
    }
    argv.extend(args.daemon_flags);
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Daemon(daemon),
        }) => run_daemon(*daemon),
        Ok(_) => unreachable!("the arguments start with the daemon subcommand"),
        Err(error) => error.exit(),
    }
}

/// Why `-e URL` is refused: Plasma's external store is Skyriver's future spill tier.
fn external_store_refusal(url: &str) -> String {
    let spill = match url.strip_prefix("file://") {
        Some(dir) => format!("`--spill-dir {dir}`"),
        None => "`--spill-dir DIR` (as `-e file://DIR`)".to_string(),
    };
    format!(
        "-e {url}: Skyriver has no external store yet. Evicted objects are dropped, not \
         spilled; spilling them to a directory is planned as the daemon's {spill}, which \
         `-e file://DIR` will then mean. Start without -e."
    )
}

/// Whether this process was started as `plasma_store` (through a link of that name).
fn invoked_as_plasma_store(argv0: Option<&std::ffi::OsString>) -> bool {
    argv0
        .map(PathBuf::from)
        .is_some_and(|argv0| argv0.file_name() == Some("plasma_store".as_ref()))
}

fn parse_octal(text: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(text, 8)
        .map_err(|_| format!("{text:?} is not an octal mode like 600"))?;
    if mode > 0o777 {
        return Err(format!(
            "{text} has bits beyond 777: only the permission bits of the socket can be set"
        ));
    }
    if mode & 0o600 != 0o600 {
        return Err(format!(
            "{text} takes read and write away from the socket's owner: the daemon's own user \
             could not reach it (and a second daemon could not tell it is running); use 600, \
             660 or 666"
        ));
    }
    Ok(mode)
}

/// A number in `range`, or an error that names the range and why it is the limit.
fn in_range<T>(text: &str, range: std::ops::RangeInclusive<T>, why: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let bounds = format!("{} to {}", range.start(), range.end());
    let value: T = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number from {bounds}"))?;
    if !range.contains(&value) {
        return Err(format!("{value} is outside {bounds}: {why}"));
    }
    Ok(value)
}

fn parse_lease_ms(text: &str) -> Result<u64, String> {
    in_range(
        text,
        1_000..=3_600_000,
        "a fetch's transfer must finish within its lease (under a second a large one cannot, \
         and every rendezvous fails), and a requester that stopped answering keeps its object \
         pinned, so unevictable, that long (over an hour, memory stays stuck)",
    )
}

fn parse_poll_us(text: &str) -> Result<u64, String> {
    in_range(
        text,
        0..=10_000,
        "the daemon keeps a CPU busy while it polls, and beyond 10 ms polling saves nothing a \
         wake-up (tens of microseconds) would cost",
    )
}

fn parse_location_cache(text: &str) -> Result<usize, String> {
    in_range(
        text,
        0..=16_777_216,
        "every entry takes the daemon's own memory (outside the store), and 16 Mi entries take \
         about a GiB",
    )
}

fn parse_ib_port(text: &str) -> Result<u8, String> {
    in_range(
        text,
        1..=255,
        "RDMA device ports are numbered from 1 (`ibv_devinfo` lists them)",
    )
}

fn parse_gid_index(text: &str) -> Result<u32, String> {
    in_range(
        text,
        0..=255,
        "an RDMA address carries the GID index in one byte (`show_gids` lists them)",
    )
}

/// The exit status of a command whose standard output was closed early, as a process killed by
/// SIGPIPE shows in a shell (128 + 13).
const STDOUT_CLOSED_STATUS: u8 = 141;

/// Raised (as an unwinding payload) when standard output is closed early, e.g. `skyriver ls |
/// head -1`: the command stops quietly, its destructors run (child daemons, temporary
/// directories), and it exits with [`STDOUT_CLOSED_STATUS`].
struct StdoutClosed;

/// Stops the command quietly: nobody reads its output any more.
fn stdout_closed() -> ! {
    // `resume_unwind` does not call the panic hook: nothing is printed.
    std::panic::resume_unwind(Box::new(StdoutClosed))
}

/// Whether a panic means that standard output (or error, as in `skyriver sim 2>&1 | head`) was
/// closed: `println!` panics with "failed printing to stdout: Broken pipe" (SIGPIPE is ignored
/// in Rust programs, so a write to a closed pipe fails instead of killing the process).
fn is_stdout_closed(payload: &(dyn std::any::Any + Send)) -> bool {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied());
    payload.is::<StdoutClosed>()
        || message.is_some_and(|m| {
            (m.starts_with("failed printing to stdout")
                || m.starts_with("failed printing to stderr"))
                && m.contains("Broken pipe")
        })
}

/// Runs the command line `args` (the program's name first), as the `skyriver` binary does.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // Every command's output may be piped into `head`: a closed pipe is no bug to report.
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_stdout_closed(info.payload()) {
            report_panic(info)
        }
    }));
    match std::panic::catch_unwind(move || run(args)) {
        Ok(code) => code,
        Err(payload) if is_stdout_closed(&*payload) => ExitCode::from(STDOUT_CLOSED_STATUS),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

fn run(args: Vec<std::ffi::OsString>) -> ExitCode {
    if invoked_as_plasma_store(args.first()) {
        return exit_code(run_plasma_store(PlasmaStoreCli::parse_from(args).args));
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Sim(args) => return skyriver_sim::cli::run(&args),
        Command::Daemon(args) => run_daemon(*args),
        Command::PlasmaStore(args) => run_plasma_store(args),
        Command::Put {
            input,
            id,
            metadata,
            socket,
        } => put(&socket, &input, id, metadata.as_bytes()),
        Command::Get {
            id,
            output,
            timeout_ms,
            socket,
        } => get(&socket, id, output, timeout_ms),
        Command::Ls { json, socket } => list(&socket, json),
        Command::Rm { ids, socket } => remove(&socket, &ids),
        Command::Stat { json, socket } => stat(&socket, json),
        Command::Watch { count, socket } => watch(&socket, count),
        Command::Evict { size, socket } => evict(&socket, size),
        Command::Demo => demo(),
        Command::Fetch {
            ids,
            output,
            timeout_ms,
            mode,
            wait,
            socket,
        } => fetch(&socket, &ids, output, timeout_ms, mode, wait),
        Command::Nodes { json, socket } => nodes(&socket, json),
        Command::Locate { id, socket } => locate(&socket, id),
        Command::Top(args) => crate::top::run(&args).map_err(|e| e.to_string()),
        Command::Up(args) => crate::up::run(&args),
        Command::Cluster(command) => crate::cluster::run(command),
        Command::Bench(command) => crate::bench::run(command).map_err(|e| e.to_string()),
    };
    exit_code(result)
}

fn exit_code(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("skyriver: {message}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging_as(
    filter: &str,
    format: skyriver_daemon::logging::LogFormat,
) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) => {
            skyriver_daemon::logging::parse_filter(&env).map_err(|e| format!("RUST_LOG: {e}"))?
        }
        Err(_) => filter.to_string(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    match format {
        skyriver_daemon::logging::LogFormat::Text => {
            builder.with_ansi(std::io::stderr().is_terminal()).init()
        }
        // One object per line, the current span and its parents included (a fetch's id).
        skyriver_daemon::logging::LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    Ok(())
}

fn run_daemon(args: DaemonArgs) -> Result<(), String> {
    init_logging_as(&args.log, args.log_format)?;
    let mut config = DaemonConfig::new(
        args.socket
            .clone()
            .unwrap_or_else(skyriver_client::default_socket_path),
        args.memory.0,
    );
    config.hugepages_dir = args.hugepages.clone();
    config.prefault = !args.no_prefault;
    config.allow_overcommit = args.allow_overcommit;
    config.allow_shared_socket_dir = args.allow_shared_socket_dir;
    config.socket_group = args
        .socket_group
        .as_deref()
        .map(skyriver_daemon::security::group_id)
        .transpose()
        .map_err(|e| e.to_string())?;
    config.socket_mode = args.socket_mode.unwrap_or(match config.socket_group {
        Some(_) => 0o660,
        None => 0o600,
    });
    config.metrics_addr = args.metrics;
    config.record = args.record.clone().map(|path| skyriver_daemon::RecordConfig {
        path,
        max_bytes: args.record_max_bytes.0,
    });
    config.poll = std::time::Duration::from_micros(args.poll_us);
    config.poll_max = std::time::Duration::from_micros(args.poll_max_us);
    config.persistence = args.backing_file.clone().map(|path| {
        let mut persistence = skyriver_daemon::persistence::PersistenceConfig::new(path);
        persistence.durability = args.durability;
        persistence
    });
    config.threshold = parse_threshold(&args.eager_threshold)?;
    config.lease = Duration::from_millis(args.lease_ms);
    config.location_cache_entries = args.location_cache;
    let directory = match (&args.head, &args.join, &args.directory) {
        (Some(listen), _, _) => Some(DirectoryChoice::Head { listen: *listen }),
        (None, Some(head), _) => Some(DirectoryChoice::Join { head: head.clone() }),
        (None, None, Some(spec)) => {
            let parsed: DirectorySpec = spec
                .parse()
                .map_err(|e: skyriver_transport::directory::DirectoryError| e.to_string())?;
            Some(match parsed {
                DirectorySpec::Redis { url } => DirectoryChoice::Redis {
                    url: match &args.directory_password_file {
                        Some(path) => skyriver_transport::directory::redis::url_with_password_file(
                            &url, path,
                        )?,
                        None => url,
                    },
                },
                DirectorySpec::Builtin { .. } if args.directory_password_file.is_some() => {
                    return Err("--directory-password-file is for a Redis directory \
                                (redis://HOST:PORT)"
                        .into())
                }
                DirectorySpec::Builtin { addr } => DirectoryChoice::Join { head: addr },
            })
        }
        (None, None, None) => None,
    };
    let slurm_node = match std::env::var("SLURM_NODEID") {
        Ok(v) if args.node_id.is_none() && directory.is_some() => {
            Some(v.trim().parse::<u32>().map_err(|_| {
                format!("SLURM_NODEID={v:?} is not a node id (a number); pass --node-id N")
            })?)
        }
        _ => None,
    };
    config.node = NodeId(match (args.node_id, slurm_node, &directory) {
        (Some(id), _, _) | (None, Some(id), _) => id,
        (None, None, Some(DirectoryChoice::Head { .. }) | None) => 0,
        (None, None, Some(_)) => {
            return Err("a daemon joining a cluster needs --node-id N (unique per node; under Slurm $SLURM_NODEID is used)".into())
        }
    });
    if let Some(mut directory) = directory {
        use skyriver_daemon::security::{choose_token, listen_address, TokenChoice};
        let choice = choose_token(
            args.token.clone(),
            args.token_file.as_deref(),
            args.insecure,
        )
        .map_err(|e| e.to_string())?;
        let listen = listen_address("--listen", args.listen, &choice).map_err(|e| e.to_string())?;
        if let DirectoryChoice::Head { listen } = &mut directory {
            *listen = listen_address("--head", *listen, &choice).map_err(|e| e.to_string())?;
        }
        match &choice {
            TokenChoice::LoopbackOnly => tracing::info!(
                %listen,
                "no cluster token: the fabric and the directory listen on loopback only \
                 (other hosts cannot join); set one with --token-file PATH, --token or \
                 SKYRIVER_CLUSTER_TOKEN"
            ),
            TokenChoice::Insecure => tracing::warn!(
                "--insecure without a token: any host that reaches this node can join the \
                 cluster and read every object"
            ),
            TokenChoice::Set(_) => {}
        }
        config.cluster = Some(ClusterConfig {
            fabric: choose_fabric(&args)?,
            listen,
            directory,
            cluster_name: args.cluster.clone(),
            cluster_token: choice.token(),
            advertise: args.advertise,
        });
    }
    skyriver_daemon::run_until_signalled(config).map_err(|e| e.to_string())
}

fn parse_threshold(text: &str) -> Result<ThresholdPolicy, String> {
    if text == "auto" {
        return Ok(ThresholdPolicy::default());
    }
    let size: ByteSize = text
        .parse()
        .map_err(|e: String| format!("--eager-threshold: {e} (or auto)"))?;
    Ok(ThresholdPolicy::Fixed(size.0))
}

fn choose_fabric(args: &DaemonArgs) -> Result<FabricChoice, String> {
    let verbs = |device: String| FabricChoice::Verbs {
        device,
        port: args.ib_port,
        gid_index: args.gid_index,
        memory_windows: !args.no_memory_windows,
    };
    match args.fabric.as_str() {
        "tcp" => Ok(FabricChoice::Tcp),
        "verbs" => {
            let devices = skyriver_transport::verbs::list_devices()
                .map_err(|e| format!("--fabric verbs: {e}"))?;
            let device = match &args.device {
                Some(device) => device.clone(),
                None => devices.into_iter().next().ok_or(
                    "--fabric verbs: libibverbs found no RDMA device (load a driver, e.g. \
                     `rdma link add rxe0 type rxe netdev eth0` for SoftRoCE, name one with \
                     --device, or use --fabric tcp)",
                )?,
            };
            Ok(verbs(device))
        }
        _ => {
            if let Some(device) = args.device.clone() {
                return Ok(verbs(device));
            }
            match skyriver_transport::verbs::list_devices() {
                Ok(devices) => match devices.into_iter().next() {
                    Some(device) => Ok(verbs(device)),
                    None => {
                        tracing::info!("fabric auto: no RDMA device found; using TCP");
                        Ok(FabricChoice::Tcp)
                    }
                },
                Err(e) => {
                    // `e` says what is missing (it starts "RDMA verbs unavailable").
                    tracing::info!("fabric auto: {e}; using TCP");
                    Ok(FabricChoice::Tcp)
                }
            }
        }
    }
}

const PROGRESS_MIN_BYTES: u64 = 64 << 20;

fn progress_bar(total: u64) -> ProgressBar {
    if total < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bytes}/{total_bytes} [{bar:40}] {bytes_per_sec} eta {eta}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar
}

fn put(
    socket: &SocketArg,
    input: &PathBuf,
    id: Option<ObjectId>,
    metadata: &[u8],
) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let id = id.unwrap_or_else(skyriver_client::random_object_id);
    let (mut reader, size): (Box<dyn Read>, u64) = if input.as_os_str() == "-" {
        stage_whole(std::io::stdin(), "standard input")?
    } else {
        let file = std::fs::File::open(input)
            .map_err(|e| format!("cannot open {}: {e}", input.display()))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", input.display()))?;
        if meta.is_dir() {
            return Err(format!("{} is a directory, not a file", input.display()));
        }
        if meta.is_file() {
            (Box::new(file), meta.len())
        } else {
            // A pipe, FIFO, character device or socket (`<(cmd)`, /dev/stdin): its size is
            // not known in advance, so read it whole first.
            stage_whole(file, &input.display().to_string())?
        }
    };
    if size + metadata.len() as u64 <= MAX_INLINE_PUT_BYTES as u64 {
        // Small: the bytes travel in the request, one round trip.
        let mut data = vec![0u8; size as usize];
        read_input_into(&mut reader, &mut data, input)?;
        client.put(id, &data, metadata).map_err(|e| e.to_string())?;
    } else {
        let mut writer = client
            .create(id, size, metadata.len() as u64)
            .map_err(|e| e.to_string())?;
        writer.metadata_mut().copy_from_slice(metadata);
        read_input_into(&mut reader, writer.data_mut(), input)?;
        writer.seal().map_err(|e| e.to_string())?;
    }
    println!("{id}");
    Ok(())
}

/// Fills `data` from `reader` (the whole of `input`, with a progress bar), refusing an input
/// that shrank or grew while being read.
fn read_input_into(reader: &mut dyn Read, data: &mut [u8], input: &Path) -> Result<(), String> {
    let size = data.len();
    let bar = progress_bar(size as u64);
    let mut filled = 0;
    while filled < data.len() {
        let chunk_end = (filled + (8 << 20)).min(data.len());
        let n = reader
            .read(&mut data[filled..chunk_end])
            .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
        if n == 0 {
            return Err(format!(
                "{} shrank while being read ({filled} of {size} bytes); the object was not stored",
                input.display()
            ));
        }
        filled += n;
        bar.set_position(filled as u64);
    }
    bar.finish_and_clear();
    // A regular file that grew while being read would be stored cut short: refuse instead.
    let mut probe = [0u8; 1];
    if matches!(reader.read(&mut probe), Ok(n) if n > 0) {
        return Err(format!(
            "{} grew while being read (more than its {size} bytes); the object was not stored",
            input.display()
        ));
    }
    Ok(())
}

/// Reads an input of unknown length whole, to create an object of the right size.
fn stage_whole(mut input: impl Read, what: &str) -> Result<(Box<dyn Read>, u64), String> {
    let mut data = Vec::new();
    input
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    let size = data.len() as u64;
    Ok((Box::new(std::io::Cursor::new(data)), size))
}

fn get(
    socket: &SocketArg,
    id: ObjectId,
    output: Option<PathBuf>,
    timeout_ms: u64,
) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let object = client
        .get_one(id, Some(Duration::from_millis(timeout_ms)))
        .map_err(|e| e.to_string())?;
    let data = object.data();
    match output {
        Some(path) => {
            let mut file = std::fs::File::create(&path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            let bar = progress_bar(data.len() as u64);
            for chunk in data.chunks(8 << 20) {
                file.write_all(chunk)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                bar.inc(chunk.len() as u64);
            }
            bar.finish_and_clear();
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(data)
                .and_then(|()| stdout.flush())
                .map_err(stdout_error)?;
        }
    }
    Ok(())
}

/// A failed write to standard output: quiet when the reader closed it, else an error.
fn stdout_error(error: std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        stdout_closed();
    }
    format!("cannot write standard output: {error}")
}

fn list(socket: &SocketArg, json: bool) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let objects = client.list().map_err(|e| e.to_string())?;
    if json {
        let rows: Vec<serde_json::Value> = objects
            .iter()
            .map(|o| {
                serde_json::json!({
                    "id": o.info.id.to_string(),
                    "data_size": o.info.data_size,
                    "metadata_size": o.info.metadata_size,
                    "sealed": o.sealed,
                    "ref_count": o.ref_count,
                    "pin_count": o.pin_count,
                    "delete_pending": o.delete_pending,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("JSON values serialize")
        );
        return Ok(());
    }
    println!(
        "{:<40}  {:>10}  {:>8}  {:<8}  {:>4}",
        "ID", "SIZE", "META", "STATE", "REFS"
    );
    for o in &objects {
        let state = match (o.sealed, o.delete_pending) {
            (false, _) => "writing",
            (true, true) => "deleting",
            (true, false) => "sealed",
        };
        println!(
            "{:<40}  {:>10}  {:>8}  {:<8}  {:>4}",
            o.info.id.to_string(),
            format_bytes(o.info.data_size),
            format_bytes(o.info.metadata_size),
            state,
            o.ref_count
        );
    }
    let total: u64 = objects.iter().map(|o| o.info.region.len).sum();
    println!("{} objects, {}", objects.len(), format_bytes(total));
    Ok(())
}

fn remove(socket: &SocketArg, ids: &[ObjectId]) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let results = client.delete(ids).map_err(|e| e.to_string())?;
    let mut failed = 0;
    for (id, result) in ids.iter().zip(results) {
        match result {
            Ok(()) => println!("deleted {id}"),
            Err(StoreError::ObjectInUse(_)) => {
                println!("{id} is in use: it will be deleted when released")
            }
            Err(error) => {
                failed += 1;
                eprintln!("skyriver: {error}");
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} of {} deletes failed", ids.len()));
    }
    Ok(())
}

fn stat(socket: &SocketArg, json: bool) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let stats = client.stats().map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&stats).expect("stats serialize")
        );
        return Ok(());
    }
    let percent = if stats.capacity_bytes == 0 {
        0.0
    } else {
        100.0 * stats.allocated_bytes as f64 / stats.capacity_bytes as f64
    };
    println!("node:        {}", client.node());
    println!("socket:      {}", client.socket_path().display());
    println!(
        "memory:      {} of {} used ({percent:.1}%), {} evictable",
        format_bytes(stats.allocated_bytes),
        format_bytes(stats.capacity_bytes),
        format_bytes(stats.evictable_bytes)
    );
    println!(
        "objects:     {} ({} sealed, {} being written)",
        stats.object_count,
        stats.sealed_count,
        stats.object_count - stats.sealed_count
    );
    println!(
        "clients:     {} connected, {} gets waiting",
        stats.client_count, stats.waiting_gets
    );
    println!(
        "since start: {} sealed, {} evicted ({})",
        stats.sealed_objects_total,
        stats.evicted_objects_total,
        format_bytes(stats.evicted_bytes_total)
    );
    Ok(())
}

fn watch(socket: &SocketArg, count: Option<u64>) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let subscription = client.subscribe().map_err(|e| e.to_string())?;
    eprintln!(
        "watching {} (Ctrl-C to stop)",
        client.socket_path().display()
    );
    let mut seen = 0u64;
    for event in subscription {
        seen += 1;
        let event = event.map_err(|e| {
            format!(
                "lost the daemon at {} after {} event(s): {e}",
                socket_name(&client),
                seen - 1
            )
        })?;
        match event {
            ObjectEvent::Sealed {
                id,
                data_size,
                metadata_size,
            } => println!(
                "sealed  {id}  {} + {} metadata",
                format_bytes(data_size),
                format_bytes(metadata_size)
            ),
            ObjectEvent::Deleted { id } => println!("deleted {id}"),
        }
        let _ = std::io::stdout().flush();
        if count.is_some_and(|count| seen >= count) {
            return Ok(());
        }
    }
    // The stream only ends when the daemon closes it: it stopped or died.
    Err(format!(
        "the daemon at {} closed the connection (stopped or died) after {seen} event(s)",
        socket_name(&client)
    ))
}

fn socket_name(client: &Client) -> String {
    client.socket_path().display().to_string()
}

fn evict(socket: &SocketArg, size: ByteSize) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let outcome = client.evict(size.0).map_err(|e| e.to_string())?;
    println!(
        "evicted {} objects, {}",
        outcome.objects,
        format_bytes(outcome.bytes)
    );
    if outcome.bytes < size.0 {
        let left = client.stats().map_err(|e| e.to_string())?;
        if left.object_count == 0 {
            // Nothing more to free: all the memory is free.
            println!(
                "the store is empty: all {} is free",
                format_bytes(left.capacity_bytes)
            );
            return Ok(());
        }
        // Scripts asking for room must not take "freed less" for success.
        return Err(format!(
            "freed {} of the {} asked: every other object is in use, unsealed or pinned by a \
             transfer",
            format_bytes(outcome.bytes),
            format_bytes(size.0)
        ));
    }
    Ok(())
}

fn demo() -> Result<(), String> {
    let fail = |e: ClientError| e.to_string();
    println!("starting a daemon with 256 MiB of shared memory on a private socket...");
    let daemon = crate::bench::ChildDaemon::start(256 << 20).map_err(|e| e.to_string())?;
    println!("  socket: {}", daemon.socket().display());
    let writer = Client::connect(daemon.socket()).map_err(fail)?;
    let reader = Client::connect(daemon.socket()).map_err(fail)?;

    let greeting = ObjectId::from_u64(1);
    writer
        .create_and_seal(greeting, b"hello from skyriver", b"text/plain")
        .map_err(fail)?;
    let object = reader
        .get_one(greeting, Some(Duration::ZERO))
        .map_err(fail)?;
    println!(
        "put then get {greeting}: {:?} (metadata {:?})",
        String::from_utf8_lossy(object.data()),
        String::from_utf8_lossy(object.metadata())
    );
    drop(object);

    let big = ObjectId::from_u64(2);
    let size = 64usize << 20;
    let started = std::time::Instant::now();
    let mut builder = writer.create(big, size as u64, 0).map_err(fail)?;
    for (i, chunk) in builder.data_mut().chunks_mut(4096).enumerate() {
        chunk.fill(i as u8);
    }
    builder.seal().map_err(fail)?;
    let wrote = started.elapsed();
    let started = std::time::Instant::now();
    let object = reader.get_one(big, Some(Duration::ZERO)).map_err(fail)?;
    let got = started.elapsed();
    let intact = object
        .data()
        .chunks(4096)
        .enumerate()
        .all(|(i, c)| c.iter().all(|&b| b == i as u8));
    println!(
        "wrote {} in shared memory in {wrote:.1?}; another client mapped it in {got:.1?} (zero-copy), bytes intact: {intact}",
        format_bytes(size as u64)
    );
    drop(object);

    let waiter = {
        let socket = daemon.socket().to_path_buf();
        std::thread::spawn(move || {
            let client = Client::connect(&socket)?;
            let object = client.get_one(ObjectId::from_u64(3), Some(Duration::from_secs(10)))?;
            Ok::<_, ClientError>(object.data().to_vec())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    writer
        .create_and_seal(ObjectId::from_u64(3), b"worth the wait", b"")
        .map_err(fail)?;
    let waited = waiter
        .join()
        .map_err(|_| "the waiting client panicked".to_string())?
        .map_err(fail)?;
    println!(
        "a blocked get woke up at seal and read {:?}",
        String::from_utf8_lossy(&waited)
    );

    let stats = reader.stats().map_err(fail)?;
    println!(
        "store: {} objects, {} of {} used",
        stats.object_count,
        format_bytes(stats.allocated_bytes),
        format_bytes(stats.capacity_bytes)
    );
    println!("stopping the daemon.");
    drop(daemon);
    println!();
    demo_cluster()?;
    println!(
        "Next: `skyriver daemon` in one terminal and `skyriver put FILE` in another, or \
         `skyriver up` for a local cluster."
    );
    Ok(())
}

/// The second half of the demo: what Skyriver exists for, objects moving between two nodes.
fn demo_cluster() -> Result<(), String> {
    let fail = |e: ClientError| e.to_string();
    let exe = crate::self_exe().map_err(|e| e.to_string())?;
    let dir = tempfile_dir("skyriver-demo")?;
    let mut up = crate::up::UpArgs::new(2, ByteSize(192 << 20), Some(dir.path.clone()));
    // The nodes see each other leave when the demo stops them: not worth a warning here.
    up.log = "error".into();
    // Verbs when this machine has RDMA devices, TCP otherwise.
    let devices = skyriver_transport::verbs::list_devices().unwrap_or_default();
    if !devices.is_empty() {
        up.fabric = "verbs".into();
        up.devices = devices.iter().take(2).cloned().collect();
    }
    println!(
        "starting a two-node cluster on this machine (built-in directory, {} fabric)...",
        up.fabric
    );
    let cluster = match crate::up::LocalCluster::start(&up, &exe) {
        Ok(cluster) => cluster,
        Err(e) if up.fabric == "verbs" => {
            println!("  the verbs fabric did not start ({e}); using TCP instead");
            up.fabric = "tcp".into();
            up.devices.clear();
            crate::up::LocalCluster::start(&up, &exe)?
        }
        Err(e) => return Err(e),
    };
    let holder = Client::connect(&cluster.sockets[0]).map_err(fail)?;
    let requester = Client::connect(&cluster.sockets[1]).map_err(fail)?;
    let view = requester.nodes().map_err(fail)?;
    let threshold = view
        .members
        .iter()
        .find(|m| m.node != view.node)
        .and_then(|m| {
            println!("  link: {}", m.link);
            m.eager_threshold_bytes
        });
    for (id, size) in [
        (ObjectId::from_u64(10), 4usize << 10),
        (ObjectId::from_u64(11), 32 << 20),
    ] {
        let mut writer = holder.create(id, size as u64, 0).map_err(fail)?;
        for (i, b) in writer.data_mut().iter_mut().enumerate() {
            *b = (i as u64).wrapping_mul(0x9e37_79b9) as u8 ^ (i >> 12) as u8;
        }
        writer.seal().map_err(fail)?;
        let before = requester
            .metrics()
            .map_err(fail)?
            .counters
            .transfer_outcomes;
        let started = std::time::Instant::now();
        let object = requester
            .fetch_one(id, Some(Duration::from_secs(30)))
            .map_err(fail)?;
        let took = started.elapsed();
        let intact = object
            .data()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i as u64).wrapping_mul(0x9e37_79b9) as u8 ^ (i >> 12) as u8);
        // The path the requester's core took, from its own counters.
        let after = requester
            .metrics()
            .map_err(fail)?
            .counters
            .transfer_outcomes;
        let path = if after.eager_ok > before.eager_ok {
            "eager: the bytes came in two-sided messages"
        } else if after.rendezvous_ok > before.rendezvous_ok {
            "rendezvous: node-1 pulled the bytes with one-sided READs into its store"
        } else {
            "no transfer counted"
        };
        println!(
            "put {} on node-0, fetched on node-1 in {took:.1?} ({:.0} MB/s), {path}; bytes match: {intact}",
            format_bytes(size as u64),
            size as f64 / took.as_secs_f64() / 1e6,
        );
        if !intact {
            return Err(format!(
                "the fetched copy of {id} differs from the original"
            ));
        }
    }
    if let Some(threshold) = threshold {
        println!(
            "  (this link's eager threshold, chosen from measured costs: {})",
            format_bytes(threshold)
        );
    }
    println!("stopping the cluster.");
    drop(cluster);
    Ok(())
}

/// A directory under the system temp dir, removed on drop.
struct TempDir {
    path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn tempfile_dir(prefix: &str) -> Result<TempDir, String> {
    let path = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    Ok(TempDir { path })
}

fn fetch(
    socket: &SocketArg,
    ids: &[ObjectId],
    output: Option<PathBuf>,
    timeout_ms: u64,
    mode: TransferMode,
    wait: bool,
) -> Result<(), String> {
    if output.is_some() && ids.len() != 1 {
        return Err("-o takes exactly one object id".into());
    }
    let client = socket.connect().map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let results = client
        .fetch_with(ids, Some(Duration::from_millis(timeout_ms)), mode, wait)
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    let mut failed = 0;
    for (id, result) in ids.iter().zip(&results) {
        match result {
            Ok(object) => {
                if output.is_none() {
                    println!("{id}  {}", format_bytes(object.data().len() as u64));
                }
            }
            Err(error) => {
                failed += 1;
                eprintln!("skyriver: {error}");
            }
        }
    }
    if let (Some(path), Some(Ok(object))) = (&output, results.first()) {
        if path.as_os_str() == "-" {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(object.data())
                .and_then(|()| stdout.flush())
                .map_err(stdout_error)?;
        } else {
            std::fs::write(path, object.data())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    let bytes: u64 = results
        .iter()
        .flatten()
        .map(|o| o.data().len() as u64)
        .sum();
    eprintln!(
        "fetched {} of {} objects, {} in {elapsed:.1?}",
        results.len() - failed,
        ids.len(),
        format_bytes(bytes)
    );
    if failed > 0 {
        return Err(format!("{failed} of {} fetches failed", ids.len()));
    }
    Ok(())
}

fn nodes(socket: &SocketArg, json: bool) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let view = client.nodes().map_err(|e| e.to_string())?;
    if json {
        let members: Vec<serde_json::Value> = view
            .members
            .iter()
            .map(|m| {
                serde_json::json!({
                    "node": m.node.0, "address": m.address, "fabric": m.fabric,
                    "connected": m.connected, "eager_threshold_bytes": m.eager_threshold_bytes, "link": m.link,
                })
            })
            .collect();
        let document = serde_json::json!({
            "node": view.node.0, "fabric": view.fabric, "directory": view.directory,
            "directory_healthy": view.directory_healthy, "members": members,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&document).expect("JSON values serialize")
        );
        return Ok(());
    }
    println!(
        "this node: {}, fabric {}, directory {}{}",
        view.node,
        view.fabric,
        view.directory,
        if view.directory_healthy {
            ""
        } else {
            " (UNREACHABLE)"
        }
    );
    println!(
        "{:<10} {:<22} {:<7} {:<10} LINK",
        "NODE", "ADDRESS", "FABRIC", "CONNECTED"
    );
    for m in &view.members {
        println!(
            "{:<10} {:<22} {:<7} {:<10} {}",
            m.node.to_string(),
            m.address,
            m.fabric,
            if m.connected { "yes" } else { "no" },
            m.link
        );
    }
    Ok(())
}

fn locate(socket: &SocketArg, id: ObjectId) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let skyriver_client::ObjectLocation {
        holders,
        sizes,
        digest,
    } = client.locate(id).map_err(|e| e.to_string())?;
    if holders.is_empty() {
        return Err(format!("no live node holds {id}"));
    }
    let names: Vec<String> = holders.iter().map(|n| n.to_string()).collect();
    let digest = digest.map_or_else(String::new, |d| format!("  digest {d}"));
    match sizes {
        Some((data, metadata)) => println!(
            "{id}  {} + {} metadata{digest}  on {}",
            format_bytes(data),
            format_bytes(metadata),
            names.join(", ")
        ),
        None => println!("{id}{digest}  on {}", names.join(", ")),
    }
    Ok(())
}
