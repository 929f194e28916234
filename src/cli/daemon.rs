//! `skyriver daemon`: its flags and how they become the daemon's configuration.

#[allow(unused_imports)]
use super::*;
use skyriver_core::auth::ClusterToken;

/// The daemon's flags. plasma_store's `-m BYTES` and `-s SOCKET` work here too; its `-d DIR -h`
/// (huge pages) belong to `skyriver plasma_store`, so `-h` prints help here as everywhere.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("membership").args(["head", "join", "directory"])))]
pub(super) struct DaemonArgs {
    /// Unix socket to serve clients on [default: $SKYRIVER_SOCKET or /tmp/skyriver-<uid>/skyriver.sock]
    #[arg(long, short = 's')]
    pub(super) socket: Option<PathBuf>,
    /// Shared memory for objects, e.g. 4GiB or 1000000000 (bytes, as plasma_store's -m).
    #[arg(long, short = 'm', default_value = "1GiB", env = "SKYRIVER_MEMORY")]
    pub(super) memory: ByteSize,
    /// Back the store with a file on this hugetlbfs mount (e.g. /dev/hugepages).
    #[arg(long)]
    pub(super) hugepages: Option<PathBuf>,
    /// Persistent mode: keep objects in this file (and its index in PATH.index), e.g. on a
    /// DAX file system over persistent memory, /dev/shm or a local SSD. Sealed objects survive
    /// a crash and are recovered in place on restart; created with --memory bytes if absent.
    #[arg(long, value_name = "PATH", conflicts_with = "hugepages")]
    pub(super) backing_file: Option<PathBuf>,
    /// With --backing-file: when a seal is durable. `seal`: before the seal returns. `async`:
    /// within 10 ms (a crash may lose the last seals, never corrupt one).
    #[arg(long, value_enum, default_value_t = skyriver_daemon::persistence::Durability::Seal,
          requires = "backing_file")]
    pub(super) durability: skyriver_daemon::persistence::Durability,
    /// Do not touch every page at start (faster start, first writes fault pages in).
    #[arg(long)]
    pub(super) no_prefault: bool,
    /// Start even when --memory is more than the machine can give now (MemAvailable, the
    /// cgroup limit, free huge pages). The kernel may then kill processes when the store fills.
    #[arg(long)]
    pub(super) allow_overcommit: bool,
    /// Permission bits of the socket, in octal [default: 600, or 660 with --socket-group]
    #[arg(long, value_parser = parse_octal)]
    pub(super) socket_mode: Option<u32>,
    /// Give this group's members access to the socket (its group, mode 660), for shared nodes.
    #[arg(long, value_name = "GROUP")]
    pub(super) socket_group: Option<String>,
    /// Accept a socket directory that other users can write or own (by default the daemon
    /// refuses one, e.g. a bare /tmp: another user could take the socket's path)
    #[arg(long)]
    pub(super) allow_shared_socket_dir: bool,
    /// Log filter, e.g. info, debug, skyriver=trace (or RUST_LOG).
    #[arg(long, default_value = "info", value_parser = skyriver_daemon::logging::parse_filter)]
    pub(super) log: String,
    /// Log lines as text, or as one JSON object per line (for log shippers).
    #[arg(long, value_enum, default_value = "text")]
    pub(super) log_format: skyriver_daemon::logging::LogFormat,
    /// Serve Prometheus metrics (GET /metrics) and health (GET /healthz) over HTTP on this
    /// address, e.g. 127.0.0.1:9464; a bare port listens on loopback [default: off]
    #[arg(long, value_name = "ADDR", value_parser = skyriver_daemon::logging::parse_metrics_addr)]
    pub(super) metrics: Option<SocketAddr>,
    /// Record every input of the node (client requests, peer messages, completions, timers)
    /// and a digest of every output to FILE, for `skyriver sim --replay FILE`. Written by a
    /// background thread; entries it cannot keep up with are dropped and counted. Holds the
    /// bytes of small objects sent eagerly and of inline puts.
    #[arg(long, value_name = "FILE")]
    pub(super) record: Option<PathBuf>,
    /// With --record: bytes FILE may reach before it moves to FILE.N (N its segment number)
    /// and a new FILE starts. Every segment is kept, since a replay runs the chain from
    /// segment 0; after 64 files recording stops.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "256MiB",
        requires = "record"
    )]
    pub(super) record_max_bytes: ByteSize,
    /// Microseconds the daemon keeps polling for input after activity before it sleeps (a
    /// sleeping daemon pays a wake-up per request; an idle one spends no CPU); 0: never poll
    #[arg(long, value_name = "N", env = "SKYRIVER_POLL_US", default_value_t = skyriver_transport::poll::DEFAULT_POLL_US,
          value_parser = parse_poll_us)]
    pub(super) poll_us: u64,
    /// Microseconds the polling time may grow to while requests keep arriving just after it
    /// ends (it doubles each time, and falls back to --poll-us after a longer quiet spell); at
    /// or below --poll-us: it never grows
    #[arg(long, value_name = "N", env = "SKYRIVER_POLL_MAX_US", default_value_t = skyriver_transport::poll::DEFAULT_POLL_MAX_US,
          value_parser = parse_poll_us)]
    pub(super) poll_max_us: u64,
    /// This node's id in the cluster [default: $SLURM_NODEID, else 0 with --head]
    #[arg(long, requires = "membership")]
    pub(super) node_id: Option<u32>,
    /// Serve the built-in directory on this address (this daemon is the cluster's head).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "0.0.0.0:7390",
          conflicts_with_all = ["join", "directory"])]
    pub(super) head: Option<SocketAddr>,
    /// Join the cluster whose head daemon serves the built-in directory at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "directory")]
    pub(super) join: Option<String>,
    /// Use this directory: redis://[USER:PASSWORD@]HOST:PORT, rediss://… for TLS (or HOST:PORT
    /// of a head daemon). From the environment it stays out of `ps`.
    #[arg(
        long,
        value_name = "URL",
        env = "SKYRIVER_DIRECTORY_URL",
        hide_env_values = true
    )]
    pub(super) directory: Option<String>,
    /// Read the Redis password of --directory redis://HOST:PORT from this file, which only its
    /// owner may read (mode 0600), instead of putting it in the URL.
    #[arg(long, value_name = "PATH", requires = "directory")]
    pub(super) directory_password_file: Option<PathBuf>,
    /// Where the fabric accepts other daemons (port 0: any free port).
    #[arg(long, default_value = "0.0.0.0:0", requires = "membership")]
    pub(super) listen: SocketAddr,
    /// Fabric between nodes: verbs (RDMA), tcp, or auto (verbs when a device is present).
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcp", "verbs"],
          requires = "membership")]
    pub(super) fabric: String,
    /// RDMA device for the verbs fabric, e.g. mlx5_0 or rxe0 [default: the first one]
    #[arg(long, requires = "membership")]
    pub(super) device: Option<String>,
    /// Port of the RDMA device (1 to 255).
    #[arg(long, default_value_t = 1, value_parser = parse_ib_port)]
    pub(super) ib_port: u8,
    /// GID index for RoCE, 0 to 255 [default: the first RoCE v2 IPv4 GID]
    #[arg(long, value_parser = parse_gid_index)]
    pub(super) gid_index: Option<u32>,
    /// Verbs: let peers READ through the arenas' registrations instead of a memory window per
    /// lease (any connected peer can then READ any arena byte; for devices whose windows
    /// misbehave, and to measure what windows cost).
    #[arg(long)]
    pub(super) no_memory_windows: bool,
    /// Eager/rendezvous switch: auto (from measured costs) or a size such as 64KiB.
    #[arg(long, default_value = "auto", value_parser = parse_threshold)]
    pub(super) eager_threshold: ThresholdPolicy,
    /// How long an object stays pinned for a requester that stopped answering mid-transfer
    /// (1000 to 3600000: a rendezvous must finish within it).
    #[arg(long, default_value_t = 10_000, value_parser = parse_lease_ms)]
    pub(super) lease_ms: u64,
    /// Objects whose holders this node remembers, so fetching one again skips the directory
    /// lookup (0: ask the directory every time; at most 16777216). A stale entry costs one
    /// round trip.
    #[arg(long, default_value_t = 65_536, value_parser = parse_location_cache)]
    pub(super) location_cache: usize,
    /// Be told by the head where each new object is as another node publishes it, so the first
    /// fetch of an object put elsewhere skips the directory lookup, as a hint would. The head
    /// sends each new object to every node that asks: for clusters of tens of nodes, not
    /// thousands. Built-in directory only.
    #[arg(long)]
    pub(super) learn_locations: bool,
    /// Name of the cluster (the key prefix in Redis).
    #[arg(long, default_value = "default", env = "SKYRIVER_CLUSTER")]
    pub(super) cluster: String,
    /// Shared secret of the cluster (the same on every node); without one (or --token-file,
    /// or --insecure) the fabric and the directory listen on loopback only.
    #[arg(
        long,
        env = "SKYRIVER_CLUSTER_TOKEN",
        hide_env_values = true,
        value_parser = skyriver_daemon::security::parse_token
    )]
    pub(super) token: Option<ClusterToken>,
    /// Read the cluster token from this file, which only its owner may read (mode 0600).
    #[arg(long, value_name = "PATH")]
    pub(super) token_file: Option<PathBuf>,
    /// Without a token, listen on other addresses than loopback anyway: any host that reaches
    /// this node can join the cluster and read every object.
    #[arg(long)]
    pub(super) insecure: bool,
    /// The IP peers dial this node's fabric at, when --listen is unspecified (0.0.0.0)
    /// [default: the source address of the route towards the directory]
    #[arg(long, value_name = "IP", requires = "membership")]
    pub(super) advertise: Option<std::net::IpAddr>,
    /// At start, how long to keep trying to join a directory (the head, or Redis) that does
    /// not answer yet, or a head busy with other daemons' hellos, e.g. when every daemon of a
    /// job starts at once; 0: give up at the first failure (a busy head is still tried for
    /// 8 s)
    #[arg(long, value_name = "SECONDS", default_value_t = 30, requires = "membership",
          value_parser = parse_join_timeout)]
    pub(super) join_timeout: u64,
    /// Spill sealed objects nobody holds to this directory (local disk) when memory is
    /// needed, instead of forgetting them; they stay present and come back on get or fetch.
    /// Must exist and be writable; old spill files in it are removed at start, unless
    /// --backing-file is given: then spilled objects survive a restart as the others do.
    #[arg(long, value_name = "DIR")]
    pub(super) spill_dir: Option<PathBuf>,
    /// With --spill-dir: most bytes spilled, e.g. 100GiB [default: 90% of the free space of
    /// DIR's file system at start]
    #[arg(long, value_name = "SIZE", requires = "spill_dir")]
    pub(super) spill_limit: Option<ByteSize>,
    /// Copies a put gets unless it asks for its own count (1 to 16; 1: this node's only): every
    /// put and seal on this daemon, Plasma-compatible clients' included, without a wait. The
    /// other copies go to other nodes, on distinct failure domains where there are enough;
    /// only the built-in directory (--head/--join) makes them, not Redis.
    #[arg(long, default_value_t = 1, value_parser = parse_replicas)]
    pub(super) replicas: u8,
    /// The failure domain of this node (a rack, a switch: what fails together), so copies of
    /// one object go to distinct ones [default: under Slurm, this node's leaf switch from
    /// SLURM_TOPOLOGY_ADDR; else a domain of its own]
    #[arg(long, value_name = "NAME")]
    pub(super) failure_domain: Option<String>,
    /// With --head: object bytes per second the head's repairs of lost copies may start,
    /// e.g. 200MiB/s, so repair cannot starve user traffic [default: 1GiB/s]
    #[arg(long, value_name = "SIZE/s", requires = "head", value_parser = parse_repair_rate)]
    pub(super) repair_rate: Option<u64>,
    /// Objects of at least this size that many nodes fetch at once flow through the
    /// requesters' partial copies, a pipeline of relays, so the holder's link carries each
    /// byte about once (TCP and verbs fabrics); off: every requester pulls
    /// from a holder [default: 4MiB]
    #[arg(long, value_name = "SIZE|off", value_parser = parse_relay_min_bytes)]
    pub(super) relay_min_bytes: Option<u64>,
}

pub(super) fn parse_replicas(text: &str) -> Result<u8, ValueError> {
    in_range(
        text,
        1..=skyriver_core::registry::MAX_REPLICAS,
        "each copy is a whole object in another node's memory",
    )
}

/// The failure domain Slurm's topology gives this node: its address in the topology
/// (`SLURM_TOPOLOGY_ADDR`, switches then the node, dot-separated) without the node, so nodes
/// under one leaf switch share a domain. `None` when the address names no switch.
pub(super) fn slurm_failure_domain(topology_addr: &str) -> Option<String> {
    let addr = topology_addr.trim();
    let (switches, _node) = addr.rsplit_once('.')?;
    (!switches.is_empty()).then(|| switches.to_string())
}

/// A repair rate: a size per second (`200MiB/s`; the `/s` may be left out), above zero.
pub(super) fn parse_repair_rate(text: &str) -> Result<u64, ValueError> {
    let size = text.trim();
    let size = size.strip_suffix("/s").unwrap_or(size);
    let size: ByteSize = size.parse().map_err(ValueError::RepairRate)?;
    if size.0 == 0 {
        return Err(ValueError::RepairRate(
            "0 would never repair a lost copy".to_string(),
        ));
    }
    Ok(size.0)
}

pub(super) fn parse_octal(text: &str) -> Result<u32, ValueError> {
    let mode = u32::from_str_radix(text, 8).map_err(|_| ValueError::NotOctal(text.to_string()))?;
    if mode > 0o777 {
        return Err(ValueError::BeyondPermissionBits(text.to_string()));
    }
    if mode & 0o600 != 0o600 {
        return Err(ValueError::OwnerLosesAccess(text.to_string()));
    }
    Ok(mode)
}

/// A number in `range`, or an error that names the range and why it is the limit.
pub(super) fn in_range<T>(
    text: &str,
    range: std::ops::RangeInclusive<T>,
    why: &'static str,
) -> Result<T, ValueError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let bounds = format!("{} to {}", range.start(), range.end());
    let value: T = text
        .trim()
        .parse()
        .map_err(|_| ValueError::NotAWholeNumber {
            text: text.to_string(),
            bounds: bounds.clone(),
        })?;
    if !range.contains(&value) {
        return Err(ValueError::OutOfRange {
            value: value.to_string(),
            bounds,
            why,
        });
    }
    Ok(value)
}

pub(super) fn parse_lease_ms(text: &str) -> Result<u64, ValueError> {
    in_range(
        text,
        1_000..=3_600_000,
        "a fetch's transfer must finish within its lease (under a second a large one cannot, \
         and every rendezvous fails), and a requester that stopped answering keeps its object \
         pinned, so unevictable, that long (over an hour, memory stays stuck)",
    )
}

pub(super) fn parse_poll_us(text: &str) -> Result<u64, ValueError> {
    in_range(
        text,
        0..=10_000,
        "the daemon keeps a CPU busy while it polls, and beyond 10 ms polling saves nothing a \
         wake-up (tens of microseconds) would cost",
    )
}

pub(super) fn parse_location_cache(text: &str) -> Result<usize, ValueError> {
    in_range(
        text,
        0..=16_777_216,
        "every entry takes the daemon's own memory (outside the store), and 16 Mi entries take \
         about a GiB",
    )
}

pub(super) fn parse_ib_port(text: &str) -> Result<u8, ValueError> {
    in_range(
        text,
        1..=255,
        "RDMA device ports are numbered from 1 (`ibv_devinfo` lists them)",
    )
}

pub(super) fn parse_gid_index(text: &str) -> Result<u32, ValueError> {
    in_range(
        text,
        0..=255,
        "an RDMA address carries the GID index in one byte (`show_gids` lists them)",
    )
}

pub(super) fn init_logging_as(
    filter: &str,
    format: skyriver_daemon::logging::LogFormat,
) -> Result<(), CliError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) => skyriver_daemon::logging::parse_filter(&env).map_err(CliError::RustLog)?,
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

/// Flags clap cannot refuse on its own: `requires = "head"` is waived when --join or
/// --directory (which conflict with --head) is given.
pub(super) fn check_head_only_flags(args: &DaemonArgs) -> Result<(), CliError> {
    if args.repair_rate.is_some() && args.head.is_none() {
        return Err(CliError::RepairRateWithoutHead);
    }
    Ok(())
}

pub(super) fn run_daemon(args: DaemonArgs) -> Result<(), CliError> {
    check_head_only_flags(&args)?;
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
        .transpose()?;
    config.socket_mode = args.socket_mode.unwrap_or(match config.socket_group {
        Some(_) => 0o660,
        None => 0o600,
    });
    config.metrics_addr = args.metrics;
    config.record = args
        .record
        .clone()
        .map(|path| skyriver_daemon::RecordConfig {
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
    config.spill = args
        .spill_dir
        .clone()
        .map(|dir| skyriver_daemon::spill::SpillConfig {
            dir,
            limit_bytes: args.spill_limit.map(|limit| limit.0),
        });
    config.threshold = args.eager_threshold;
    config.lease = Duration::from_millis(args.lease_ms);
    config.location_cache_entries = args.location_cache;
    config.default_replicas = args.replicas;
    config.relay_min_bytes = args.relay_min_bytes;
    config.repair_bytes_per_second = args.repair_rate;
    config.failure_domain = match &args.failure_domain {
        Some(domain) => domain.trim().to_string(),
        None => std::env::var("SLURM_TOPOLOGY_ADDR")
            .ok()
            .and_then(|addr| slurm_failure_domain(&addr))
            .unwrap_or_default(),
    };
    let directory = match (&args.head, &args.join, &args.directory) {
        (Some(listen), _, _) => Some(DirectoryChoice::Head { listen: *listen }),
        (None, Some(head), _) => Some(DirectoryChoice::Join { head: head.clone() }),
        (None, None, Some(spec)) => {
            let parsed: DirectorySpec = spec.parse()?;
            Some(match parsed {
                DirectorySpec::Redis { url } => DirectoryChoice::Redis {
                    url: match &args.directory_password_file {
                        Some(path) => {
                            skyriver_transport::directory::redis::url_with_password_file(&url, path)
                                .map_err(CliError::DirectoryPassword)?
                        }
                        None => url,
                    },
                },
                DirectorySpec::Builtin { .. } if args.directory_password_file.is_some() => {
                    return Err(CliError::PasswordFileForBuiltin)
                }
                DirectorySpec::Builtin { addr } => DirectoryChoice::Join { head: addr },
            })
        }
        (None, None, None) => None,
    };
    let slurm_node = match std::env::var("SLURM_NODEID") {
        Ok(v) if args.node_id.is_none() && directory.is_some() => Some(
            v.trim()
                .parse::<u32>()
                .map_err(|_| CliError::SlurmNodeId(v.clone()))?,
        ),
        _ => None,
    };
    config.node = NodeId(match (args.node_id, slurm_node, &directory) {
        (Some(id), _, _) | (None, Some(id), _) => id,
        (None, None, Some(DirectoryChoice::Head { .. }) | None) => 0,
        (None, None, Some(_)) => return Err(CliError::NodeIdNeeded),
    });
    if args.learn_locations && matches!(directory, Some(DirectoryChoice::Redis { .. })) {
        return Err(CliError::LearnLocationsWithoutHead);
    }
    if let Some(mut directory) = directory {
        use skyriver_daemon::security::{choose_token, listen_address, TokenChoice};
        let choice = choose_token(
            args.token.clone(),
            args.token_file.as_deref(),
            args.insecure,
        )?;
        let listen = listen_address("--listen", args.listen, &choice)?;
        if let DirectoryChoice::Head { listen } = &mut directory {
            *listen = listen_address("--head", *listen, &choice)?;
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
            join_timeout: std::time::Duration::from_secs(args.join_timeout),
            learn_locations: args.learn_locations,
        });
    } else if args.learn_locations {
        return Err(CliError::LearnLocationsWithoutHead);
    }
    Ok(skyriver_daemon::run_until_signalled(config)?)
}

fn parse_join_timeout(text: &str) -> Result<u64, ValueError> {
    in_range(
        text,
        0..=86_400,
        "a daemon that waits longer than a day for its directory is better restarted by its \
         job scheduler",
    )
}

pub(super) fn parse_threshold(text: &str) -> Result<ThresholdPolicy, ValueError> {
    if text == "auto" {
        return Ok(ThresholdPolicy::default());
    }
    let size: ByteSize = text.parse().map_err(ValueError::Threshold)?;
    Ok(ThresholdPolicy::Fixed(size.0))
}

pub(super) fn parse_relay_min_bytes(text: &str) -> Result<u64, ValueError> {
    if text == "off" {
        return Ok(u64::MAX);
    }
    let size: ByteSize = text.parse().map_err(ValueError::RelayMinBytes)?;
    Ok(size.0.max(1))
}

pub(super) fn choose_fabric(args: &DaemonArgs) -> Result<FabricChoice, CliError> {
    let verbs = |device: String| FabricChoice::Verbs {
        device,
        port: args.ib_port,
        gid_index: args.gid_index,
        memory_windows: !args.no_memory_windows,
    };
    match args.fabric.as_str() {
        "tcp" => Ok(FabricChoice::Tcp),
        "verbs" => {
            let devices = skyriver_transport::verbs::list_devices().map_err(CliError::Verbs)?;
            let device = match &args.device {
                Some(device) => device.clone(),
                None => devices.into_iter().next().ok_or(CliError::NoRdmaDevice)?,
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
