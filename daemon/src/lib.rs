//! The node daemon: owns the arenas and the sans-IO node (store, fetch manager, transfers),
//! serves local clients on a Unix socket and, in a cluster, talks to other daemons through a
//! fabric and to the directory.
//!
//! One tokio runtime on one thread runs the event loop that owns the node
//! ([`event_loop`]); the fabric runs its own threads for bulk data, a committer thread makes
//! changes durable in persistent mode. Object bytes never pass through the client protocol:
//! clients map the arenas' fds, sent once per connection. With `--metrics`, an exporter thread
//! serves `/metrics` and `/healthz` from snapshots the loop hands it ([`metrics`]).

#![forbid(unsafe_code)]

pub mod logging;
pub mod persistence;
pub mod security;
pub mod size;
pub mod spill;

mod cluster;
mod connection;
mod effects;
mod event_loop;
pub mod host_memory;
pub mod metrics;
mod reachability;
mod record;
pub mod socket_dir;
mod starting;
mod verification;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use skyriver_core::node::{Node, NodeConfig, ThresholdPolicy};
use skyriver_core::{ArenaId, Instant, NodeId};
use skyriver_transport::directory::builtin::BuiltinDirectoryServer;
use skyriver_transport::directory::{Directory, MemberInfo, NoticeReceiver};
use skyriver_transport::fabric::tcp::{TcpFabric, TcpFabricConfig};
use skyriver_transport::fabric::verbs::{VerbsFabric, VerbsFabricConfig};
use skyriver_transport::fabric::{Fabric, FabricIdentity};
use skyriver_transport::{ArenaError, ArenaOptions, SharedArena};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use self::cluster::DirectoryStartError;
use self::effects::Effects;
use self::event_loop::{ClusterInputs, EventLoop};
use self::record::Recorder;
pub use self::record::{RecordConfig, RecordStartError};
use self::starting::{StartStatus, StartingResponder};

/// How to run a daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where clients connect.
    pub socket_path: PathBuf,
    /// Bytes of shared memory for objects.
    pub memory_bytes: u64,
    /// Back the arena with a file on this hugetlbfs mount.
    pub hugepages_dir: Option<PathBuf>,
    /// Touch every page at start.
    pub prefault: bool,
    /// Permission bits of the socket file (owner-only by default).
    pub socket_mode: u32,
    /// Group the socket file belongs to (`None`: the daemon's own group).
    pub socket_group: Option<u32>,
    /// Accept a socket directory other users control (see [`socket_dir`]).
    pub allow_shared_socket_dir: bool,
    /// This node's id.
    pub node: NodeId,
    /// Eager/rendezvous threshold policy for fetches.
    pub threshold: ThresholdPolicy,
    /// How long this node keeps an object pinned for a requester that stopped answering.
    pub lease: std::time::Duration,
    /// Objects whose holders the node remembers from the directory (0: none).
    pub location_cache_entries: usize,
    /// Join a cluster; `None` runs the daemon alone.
    pub cluster: Option<ClusterConfig>,
    /// Keep the arena and the object index in files (persistent mode); `None`: a memfd.
    pub persistence: Option<crate::persistence::PersistenceConfig>,
    /// Start even when `memory_bytes` exceeds what the machine can give (see [`host_memory`]).
    pub allow_overcommit: bool,
    /// Serve `/metrics` and `/healthz` over HTTP on this address; `None`: no exporter.
    pub metrics_addr: Option<SocketAddr>,
    /// How long the loop keeps polling for input after its last one before it sleeps
    /// ([`skyriver_transport::poll`]); zero: it sleeps at once.
    pub poll: std::time::Duration,
    /// How far that window may grow while inputs keep coming just after it
    /// ([`skyriver_transport::poll::AdaptivePoll`]); at or below `poll`: it never grows.
    pub poll_max: std::time::Duration,
    /// Record every input of the node and a digest of every output (`--record`).
    pub record: Option<RecordConfig>,
    /// Spill sealed objects to local disk instead of evicting them (`--spill-dir`).
    pub spill: Option<crate::spill::SpillConfig>,
    /// Copies a put without its own replica count gets (`--replicas`; 1: this node's only).
    pub default_replicas: u8,
    /// The failure domain this node is in (`--failure-domain`; empty: its own).
    pub failure_domain: String,
    /// Objects of at least this many bytes that many nodes fetch at once flow through the
    /// requesters' partial copies (`--relay-min-bytes`; `u64::MAX`: never). `None`: the core's
    /// default. Only on fabrics that serve partial copies (TCP and verbs).
    pub relay_min_bytes: Option<u64>,
    /// When this daemon serves the head: object bytes per second repairs may start
    /// (`--repair-rate`; `None`: the registry's default, 1 GiB/s).
    pub repair_bytes_per_second: Option<u64>,
}

impl DaemonConfig {
    /// Defaults for a socket path and memory size: a daemon on its own.
    pub fn new(socket_path: impl Into<PathBuf>, memory_bytes: u64) -> Self {
        Self {
            socket_path: socket_path.into(),
            memory_bytes,
            hugepages_dir: None,
            prefault: true,
            socket_mode: 0o600,
            socket_group: None,
            allow_shared_socket_dir: false,
            node: NodeId(0),
            threshold: ThresholdPolicy::default(),
            lease: std::time::Duration::from_secs(10),
            location_cache_entries: 65_536,
            cluster: None,
            persistence: None,
            allow_overcommit: false,
            metrics_addr: None,
            poll: skyriver_transport::poll::poll_from_env(),
            poll_max: std::time::Duration::from_micros(
                skyriver_transport::poll::DEFAULT_POLL_MAX_US,
            ),
            record: None,
            spill: None,
            default_replicas: 1,
            failure_domain: String::new(),
            relay_min_bytes: None,
            repair_bytes_per_second: None,
        }
    }
}

/// Which fabric moves objects between nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricChoice {
    /// TCP, everywhere.
    Tcp,
    /// RDMA verbs on this device.
    Verbs {
        /// Device name, e.g. `mlx5_0` or `rxe0`.
        device: String,
        /// Port number (from 1).
        port: u8,
        /// GID index; `None` picks RoCE v2 (IPv4) or the InfiniBand GID.
        gid_index: Option<u32>,
        /// Scope each lease's READs with memory windows where the device has them.
        memory_windows: bool,
    },
}

/// Where the directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryChoice {
    /// This daemon serves the built-in directory on this address.
    Head {
        /// Listen address of the directory service.
        listen: SocketAddr,
    },
    /// The built-in directory of a head daemon at this address.
    Join {
        /// `HOST:PORT` of the head.
        head: String,
    },
    /// A Redis server: `redis://HOST:PORT`.
    Redis {
        /// The URL.
        url: String,
    },
}

/// A daemon's place in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The fabric.
    pub fabric: FabricChoice,
    /// Where the fabric accepts peers (port 0: any).
    pub listen: SocketAddr,
    /// The directory.
    pub directory: DirectoryChoice,
    /// Name of the cluster (the Redis key prefix).
    pub cluster_name: String,
    /// Shared secret every node proves (`Debug` shows `ClusterToken(***)`); the fabric, the
    /// directory client and a served head share it.
    pub cluster_token: crate::security::ClusterToken,
    /// The IP peers dial when `listen` is unspecified (`0.0.0.0`) [default: the source
    /// address of the route towards the directory].
    pub advertise: Option<std::net::IpAddr>,
    /// How long a starting daemon tries again to join a directory that cannot be reached
    /// (zero: one try).
    pub join_timeout: std::time::Duration,
    /// Be told by the built-in head where each new object another node publishes is, so a
    /// first fetch of it needs no lookup (`--learn-locations`; not with Redis).
    pub learn_locations: bool,
}

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The arena could not be created.
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// `--record` could not start.
    #[error(transparent)]
    Record(#[from] RecordStartError),
    /// The spill directory cannot be used.
    #[error(transparent)]
    Spill(#[from] crate::spill::SpillStartError),
    /// The backing files could not be opened, recovered or created.
    #[error(transparent)]
    Persist(#[from] skyriver_transport::persist::PersistError),
    /// The machine cannot give the store what was asked, or the memory flags are unusable.
    #[error(transparent)]
    Memory(#[from] host_memory::MemoryError),
    /// Another daemon already serves this socket.
    #[error(
        "a daemon is already listening on {path} (the socket belongs to {owner}); stop it, or \
         choose another --socket"
    )]
    AlreadyRunning {
        /// The path.
        path: PathBuf,
        /// Who owns the socket file: the user that daemon most likely runs as.
        owner: String,
    },
    /// The socket path names something that is not a socket: it is never replaced.
    #[error(
        "{path} is {kind}, not a socket (it belongs to {owner}): refusing to replace it \
         (choose another --socket, or move it away yourself)"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
        /// Who owns it.
        owner: String,
    },
    /// The socket's directory is not safe.
    #[error(transparent)]
    SocketDir(#[from] socket_dir::SocketDirError),
    /// Binding or configuring the socket failed.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The fabric could not start.
    #[error("fabric: {0}")]
    Fabric(#[from] FabricStartError),
    /// The directory could not be reached or started.
    #[error("directory: {0}")]
    Directory(#[from] cluster::DirectoryStartError),
    /// The metrics exporter could not start.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
}

/// Why a daemon's fabric could not start.
#[derive(Debug, thiserror::Error)]
pub enum FabricStartError {
    /// The TCP fabric could not listen.
    #[error(transparent)]
    Tcp(#[from] skyriver_transport::fabric::tcp::TcpStartError),
    /// The verbs fabric could not open its device or listen.
    #[error("{0} (use --fabric tcp where no RDMA device works)")]
    Verbs(#[source] skyriver_transport::fabric::verbs::VerbsStartError),
    /// No address to publish for peers to dial.
    #[error(transparent)]
    Advertise(#[from] crate::security::SecurityError),
}

/// A daemon running on its own thread, for tests and tools that embed one.
pub struct DaemonHandle {
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), DaemonError>>>,
    socket_path: PathBuf,
}

impl DaemonHandle {
    /// Starts a daemon and returns once its socket accepts connections.
    pub fn start(config: DaemonConfig) -> Result<Self, DaemonError> {
        // One message, once: the daemon is ready. A daemon that fails to start drops the
        // sender instead, and its thread's result says why.
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<()>(1);
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let socket_path = config.socket_path.clone();
        let thread = std::thread::Builder::new()
            .name("skyriver-daemon".into())
            .spawn(move || {
                let runtime = build_runtime()?;
                runtime.block_on(async move {
                    let server = Server::bind(config).await?;
                    let _ = ready_tx.send(());
                    server
                        .serve(async {
                            let _ = shutdown_rx.await;
                        })
                        .await;
                    Ok(())
                })
            })
            .map_err(DaemonError::Runtime)?;
        match ready_rx.recv() {
            Ok(()) => Ok(Self {
                shutdown: Some(shutdown_tx),
                thread: Some(thread),
                socket_path,
            }),
            _ => Err(thread
                .join()
                .unwrap_or_else(|_| {
                    Err(DaemonError::Runtime(std::io::Error::other(
                        "daemon thread panicked",
                    )))
                })
                .err()
                .unwrap_or_else(|| {
                    DaemonError::Runtime(std::io::Error::other("daemon stopped during start"))
                })),
        }
    }

    /// The socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Stops the daemon and waits for it.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn build_runtime() -> Result<tokio::runtime::Runtime, DaemonError> {
    // One thread: one loop owns the node, and staying on one thread saves the cross-thread
    // wake-ups that would dominate a local round trip. Fabrics bring their own threads for bulk
    // data.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DaemonError::Runtime)
}

/// Runs a daemon in the foreground until SIGINT or SIGTERM, which also stop it cleanly while it
/// starts (creating the arena, joining the cluster): the socket is removed, the status is 0.
pub fn run_until_signalled(config: DaemonConfig) -> Result<(), DaemonError> {
    let runtime = build_runtime()?;
    let outcome = runtime.block_on(async move {
        // Watched before anything is bound, so no signal finds the default action (death).
        let mut signals = ShutdownSignals::watch();
        let server = tokio::select! {
            biased;
            signal = signals.recv() => {
                // Dropping the start-up removes the socket it bound and stops what it started.
                info!("{signal} during start-up: stopping before serving");
                return Ok(());
            }
            server = Server::bind(config) => server?,
        };
        server
            .serve(async move {
                let signal = signals.recv().await;
                info!("{signal}: shutting down");
            })
            .await;
        Ok(())
    });
    // A start-up stopped mid-way may leave the arena's creation running on a blocking thread:
    // the process does not wait for it.
    runtime.shutdown_background();
    outcome
}

/// SIGINT and SIGTERM, watched from the moment this is made.
struct ShutdownSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn watch() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let watch = |kind, name| {
            signal(kind)
                .inspect_err(|error| warn!(%error, "cannot watch {name}"))
                .ok()
        };
        Self {
            interrupt: watch(SignalKind::interrupt(), "SIGINT"),
            terminate: watch(SignalKind::terminate(), "SIGTERM"),
        }
    }

    /// The name of the next signal.
    async fn recv(&mut self) -> &'static str {
        async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(self.interrupt.as_mut()) => "SIGINT",
            () = next(self.terminate.as_mut()) => "SIGTERM",
        }
    }
}

/// Removes the socket file when dropped, unless disarmed: a start-up that fails or is stopped
/// (its future dropped) leaves no socket behind.
struct RemoveSocketOnDrop(Option<PathBuf>);

impl RemoveSocketOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveSocketOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What a cluster daemon starts besides the store.
struct ClusterParts {
    fabric: Arc<dyn Fabric>,
    fabric_events: skyriver_transport::fabric::EventReceiver,
    directory: Arc<dyn Directory>,
    notices: NoticeReceiver,
    directory_server: Option<BuiltinDirectoryServer>,
    /// What the directory is called in `skyriver nodes` and the logs.
    directory_description: String,
    /// Receive-slot size the fabric fixed, when it fixes one.
    receive_slot_bytes: Option<u32>,
    /// The fabric address published for peers (never unspecified).
    fabric_addr: std::net::SocketAddr,
}

/// A bound daemon, ready to serve.
pub struct Server {
    event_loop: EventLoop,
    socket_path: PathBuf,
    /// The built-in directory, when this daemon is the head.
    directory_server: Option<BuiltinDirectoryServer>,
    /// The metrics exporter, with `--metrics`.
    metrics: Option<metrics::MetricsServer>,
}

impl Server {
    /// Creates the arena, starts the fabric and joins the directory (in a cluster), binds the
    /// socket and logs what it serves.
    pub async fn bind(config: DaemonConfig) -> Result<Self, DaemonError> {
        let started = std::time::Instant::now();
        // Refuse a bad socket path or memory size before spending seconds on the arena.
        check_socket_path(&config.socket_path)?;
        if let Some(dir) = &config.hugepages_dir {
            check_hugetlbfs(dir)?;
        }
        if config.persistence.is_none() {
            host_memory::check(
                config.memory_bytes,
                config.hugepages_dir.as_deref(),
                config.allow_overcommit,
            )?;
        } else if config.memory_bytes < host_memory::MIN_MEMORY_BYTES {
            host_memory::check(config.memory_bytes, None, true)?;
        }
        let persistent = config.persistence.is_some();
        let spill = config
            .spill
            .as_ref()
            .map(|spill| spill::prepare(spill, config.node, persistent))
            .transpose()?;
        let metrics_listener = config.metrics_addr.map(metrics::bind).transpose()?;
        // Bound before the slow part, so clients hear "starting" rather than "no daemon".
        let listener = bind_socket(&config).await?;
        let bound = RemoveSocketOnDrop(Some(config.socket_path.clone()));
        let status = StartStatus::default();
        status.set("creating the arena");
        let responder = StartingResponder::spawn(listener, status.clone());
        let server =
            Self::start(config, started, status, responder, metrics_listener, spill).await?;
        bound.disarm();
        Ok(server)
    }

    /// Everything after the socket is bound: arena, cluster, node, recovery.
    async fn start(
        config: DaemonConfig,
        started: std::time::Instant,
        status: StartStatus,
        responder: StartingResponder,
        metrics_listener: Option<std::net::TcpListener>,
        spill: Option<(u64, PathBuf)>,
    ) -> Result<Self, DaemonError> {
        let options = ArenaOptions {
            hugepages_dir: config.hugepages_dir.clone(),
            prefault: config.prefault,
        };
        let (persistence, arena) = match &config.persistence {
            Some(persist) => {
                status.set("opening the backing file");
                let (persistence, arena) =
                    crate::persistence::Persistence::open(persist, config.memory_bytes)?;
                (Some(persistence), Arc::new(arena))
            }
            None => (
                None,
                Arc::new(create_arena(config.memory_bytes, options, status.clone()).await?),
            ),
        };
        let arenas = BTreeMap::from([(ArenaId(0), arena.clone())]);
        let incarnation = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
            & 0xffff_ffff) as u32;
        let mut node_config = NodeConfig::new(config.node, arena.size_bytes());
        node_config.incarnation = incarnation;
        node_config.threshold = config.threshold;
        node_config.lease = config.lease;
        node_config.location_cache_entries = config.location_cache_entries;
        node_config.default_replicas = config.default_replicas;
        // Relays only where the fabric serves a partial copy (TCP and verbs do; a holder on a
        // fabric that cannot never redirects to one); `--relay-min-bytes` overrides the size.
        let relay_min_bytes = config
            .relay_min_bytes
            .unwrap_or(node_config.relay_min_bytes);
        node_config.relay_min_bytes = u64::MAX;
        node_config.standalone = config.cluster.is_none();
        // Only the built-in directory's registry places copies of record: with Redis (or Redis
        // Cluster) a put with k > 1 is a plain one, and one that waits fails at once.
        let redis_directory = matches!(
            config.cluster.as_ref().map(|cluster| &cluster.directory),
            Some(DirectoryChoice::Redis { .. })
        );
        node_config.directory_places_replicas = !redis_directory;
        if redis_directory && config.default_replicas > 1 {
            warn!(
                replicas = config.default_replicas,
                "--replicas has no effect with a Redis directory: only the built-in directory \
                 (--head/--join) makes replicas; puts keep one copy"
            );
        }
        node_config.store.hash_seed = random_seed();
        node_config.store.spill_limit_bytes = spill.as_ref().map(|(limit, _)| *limit);
        let cluster = match &config.cluster {
            Some(cluster) => {
                status.set("joining the cluster");
                Some(start_cluster(&config, cluster, &arenas, incarnation).await?)
            }
            None => None,
        };
        if let Some(parts) = &cluster {
            node_config.region_keys = parts.fabric.region_keys();
            if parts.fabric.serves_partial_copies() {
                node_config.relay_min_bytes = relay_min_bytes;
            }
            if let Some(slot_bytes) = parts.receive_slot_bytes {
                node_config.receive_slot_bytes = slot_bytes;
            }
            node_config.fabric_name = parts.fabric.name().into();
            node_config.fabric_address = parts.fabric_addr.to_string();
            node_config.directory_name = parts.directory_description.clone();
        }
        status.set("recovering objects");
        let listener = responder.stop().await.ok_or_else(|| {
            DaemonError::Runtime(std::io::Error::other("the start-up responder failed"))
        })?;
        let epoch = std::time::Instant::now();
        if let Some(persistence) = &persistence {
            node_config.store.record_durable_changes = true;
            node_config.hold_replies_until_durable =
                persistence.durability() == crate::persistence::Durability::Seal;
        }
        let node = Node::new(node_config, Instant::ZERO);
        let mut effects = Effects::new(config.node, arenas);
        let mut cluster_inputs = None;
        let mut directory_server = None;
        if let Some(parts) = cluster {
            directory_server = parts.directory_server;
            info!(
                fabric = parts.fabric.name(),
                listen = %parts.fabric.listen_addr(),
                advertised = %parts.fabric_addr,
                directory = %parts.directory_description,
                "joined the cluster"
            );
            effects.fabric = Some(parts.fabric);
            effects.directory = Some(parts.directory);
            cluster_inputs = Some(ClusterInputs {
                fabric_events: parts.fabric_events,
                notices: parts.notices,
            });
        }
        let mut durable = None;
        let mut event_loop = EventLoop::new(node, effects, epoch, listener, cluster_inputs, None);
        event_loop.head_replication = directory_server
            .as_ref()
            .map(BuiltinDirectoryServer::replication_stats);
        if let Some(record) = &config.record {
            event_loop.set_recorder(Recorder::start(record, &event_loop.node)?);
        }
        event_loop.set_poll(skyriver_transport::poll::AdaptivePoll::new(
            config.poll,
            config.poll_max,
        ));
        // Before recovery: recovered objects may fill memory, and the store then spills ahead.
        if let Some((_, dir)) = &spill {
            let (io, completions) = if persistence.is_some() {
                spill::SpillIo::start_durable(dir)
            } else {
                spill::SpillIo::start(dir)
            };
            event_loop.effects.spill_io = Some(io);
            event_loop.set_spill_completions(completions);
        }
        if let Some(mut persistence) = persistence {
            recover_spilled(&mut persistence, spill.as_ref(), &mut event_loop)?;
            // Recovered objects leave the store as seals: draining publishes them, a batch
            // at a time so the directory work stays small.
            let recovered_arena = arena.clone();
            persistence.recover_in_batches(256, |batch| {
                // The digests the objects were published with, from their bytes (the index
                // records do not keep them).
                let batch = batch
                    .into_iter()
                    .map(|object| {
                        let digest = recovered_digest(&recovered_arena, &object);
                        (object, digest)
                    })
                    .collect();
                event_loop.recover(batch)
            })?;
            let window = event_loop.node.config().max_unpersisted_changes;
            let window = usize::try_from(window).unwrap_or(usize::MAX);
            let (commits, durable_rx) = persistence.start_committer(window)?;
            event_loop.effects.commits = Some(commits);
            durable = Some(durable_rx);
        }
        event_loop.set_durable(durable);
        info!(
            node = %config.node,
            memory = %crate::size::format_bytes(arena.size_bytes()),
            backing = if config.persistence.is_some() {
                "file"
            } else if config.hugepages_dir.is_some() {
                "hugetlbfs"
            } else {
                "memfd"
            },
            prefaulted = config.prefault,
            startup_ms = started.elapsed().as_millis() as u64,
            socket = %config.socket_path.display(),
            "skyriver daemon ready"
        );
        let metrics = match metrics_listener {
            Some(listener) => {
                let (requests_tx, requests_rx) = mpsc::channel(metrics::SNAPSHOT_QUEUE);
                let server = metrics::MetricsServer::start(listener, requests_tx)?;
                event_loop.set_metrics_requests(requests_rx);
                Some(server)
            }
            None => None,
        };
        Ok(Self {
            event_loop,
            socket_path: config.socket_path,
            directory_server,
            metrics,
        })
    }

    /// Serves clients until `shutdown` completes, then removes the socket file.
    pub async fn serve(mut self, shutdown: impl std::future::Future<Output = ()>) {
        self.event_loop.run(shutdown).await;
        // Scrapes stop before the node goes.
        drop(self.metrics.take());
        // Leave the directory first, so other nodes stop sending fetches here at once.
        if let Some(directory) = self.event_loop.directory() {
            directory.leave().await;
        }
        if let Some(server) = self.directory_server.take() {
            server.shutdown().await;
        }
        let _ = std::fs::remove_file(&self.socket_path);
        // Dropping the loop commits what is staged (persistent mode) and closes every client.
        drop(self.event_loop);
        info!("daemon stopped");
    }
}

/// Creates the arena on a blocking thread (the runtime keeps answering "starting"), logging
/// progress per GiB on a large one.
async fn create_arena(
    size_bytes: u64,
    options: ArenaOptions,
    status: StartStatus,
) -> Result<SharedArena, DaemonError> {
    let created = tokio::task::spawn_blocking(move || {
        let mut progress = |stage: skyriver_transport::ArenaStage, done: u64, total: u64| {
            let line = format!(
                "creating the arena: {stage} {} of {} ({}%)",
                crate::size::format_bytes(done),
                crate::size::format_bytes(total),
                done * 100 / total.max(1)
            );
            if total > skyriver_transport::ARENA_STEP_BYTES {
                info!("{line}");
            }
            status.set(line);
        };
        SharedArena::create_with_progress("skyriver-arena-0", size_bytes, &options, &mut progress)
    })
    .await
    .map_err(|e| DaemonError::Runtime(std::io::Error::other(e)))?;
    Ok(created?)
}

/// A seed for the object index's hash: object ids come from clients, so it must not be
/// guessable.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}

async fn start_cluster(
    config: &DaemonConfig,
    cluster: &ClusterConfig,
    arenas: &BTreeMap<ArenaId, Arc<SharedArena>>,
    incarnation: u32,
) -> Result<ClusterParts, DaemonError> {
    let identity = FabricIdentity {
        node: config.node,
        cluster_token: cluster.cluster_token.clone(),
    };
    // Bounded, with push-back: see `skyriver_transport::fabric::event_channel`.
    let (fabric_tx, fabric_events) = skyriver_transport::fabric::event_channel();
    let mut receive_slot_bytes = None;
    let fabric: Arc<dyn Fabric> = match &cluster.fabric {
        FabricChoice::Tcp => Arc::new(
            TcpFabric::start(
                TcpFabricConfig {
                    // On the daemon's own thread: a message reaches the node without a
                    // cross-thread wake-up, and sends are written from the same thread.
                    worker_threads: 0,
                    ..TcpFabricConfig::new(cluster.listen)
                },
                identity,
                arenas.clone(),
                fabric_tx,
            )
            .map_err(FabricStartError::from)?,
        ),
        FabricChoice::Verbs {
            device,
            port,
            gid_index,
            memory_windows,
        } => {
            let mut verbs_config = VerbsFabricConfig::new(device, cluster.listen);
            verbs_config.port = *port;
            verbs_config.memory_windows = *memory_windows;
            verbs_config.gid_index = *gid_index;
            let verbs = VerbsFabric::start(verbs_config, identity, arenas.clone(), fabric_tx)
                .map_err(FabricStartError::Verbs)?;
            // Eager chunks are sized from the receive slots both ends agreed on.
            receive_slot_bytes = Some(verbs.receive_slot_bytes());
            Arc::new(verbs)
        }
    };
    let fabric_addr = crate::security::advertised_address(
        fabric.listen_addr(),
        cluster.advertise,
        cluster::directory_host(&cluster.directory).as_deref(),
    )
    .map_err(FabricStartError::from)?;
    let me = MemberInfo {
        node: config.node,
        fabric_addr,
        fabric: fabric.name().to_string(),
        incarnation,
        failure_domain: config.failure_domain.clone(),
    };
    // Bounded, with push-back: see `skyriver_transport::directory::notice_channel`.
    let (notice_tx, notices) = skyriver_transport::directory::notice_channel();
    let joined =
        cluster::connect_directory(cluster, me, config.repair_bytes_per_second, notice_tx).await?;
    Ok(ClusterParts {
        fabric,
        fabric_events,
        directory: joined.directory,
        notices,
        directory_server: joined.server,
        directory_description: joined.description,
        receive_slot_bytes,
        fabric_addr,
    })
}

/// The socket path must be absent or a socket nobody answers on (left by a daemon that died).
fn check_socket_path(path: &Path) -> Result<bool, DaemonError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(false);
    };
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_socket() {
        return Err(DaemonError::NotASocket {
            path: path.to_path_buf(),
            kind: file_kind(&meta.file_type()),
            owner: owner_name(&meta),
        });
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(DaemonError::AlreadyRunning {
            path: path.to_path_buf(),
            owner: owner_name(&meta),
        });
    }
    Ok(true)
}

async fn bind_socket(config: &DaemonConfig) -> Result<UnixListener, DaemonError> {
    let (path, mode, group) = (
        config.socket_path.as_path(),
        config.socket_mode,
        config.socket_group,
    );
    let listen_error = |source| DaemonError::Listen {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        socket_dir::prepare(parent, mode, group, config.allow_shared_socket_dir)?;
    }
    if check_socket_path(path)? {
        // Left behind by a daemon that died: nobody listens on it.
        std::fs::remove_file(path).map_err(listen_error)?;
    }
    let listener = UnixListener::bind(path).map_err(listen_error)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(listen_error)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(listen_error)?;
    Ok(listener)
}

/// `--hugepages DIR` must be a hugetlbfs mount: anything else would silently give normal pages.
fn check_hugetlbfs(dir: &Path) -> Result<(), DaemonError> {
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    let stat = nix::sys::statfs::statfs(dir).map_err(|source| {
        host_memory::MemoryError::HugepagesStat {
            dir: dir.to_path_buf(),
            source,
        }
    })?;
    if stat.filesystem_type().0 as i64 != HUGETLBFS_MAGIC {
        return Err(host_memory::MemoryError::NotHugetlbfs {
            dir: dir.to_path_buf(),
        }
        .into());
    }
    Ok(())
}

/// The owner of a file, as `user alice (uid 1000)`, or `uid 1000` when no user has that id.
fn owner_name(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let uid = meta.uid();
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("user {} (uid {uid})", user.name),
        _ => format!("uid {uid}"),
    }
}

fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "a regular file"
    }
}

/// The digest of a recovered object's bytes in `arena`; one that cannot match any content when
/// the record names bytes outside the arena (the store refuses such a record anyway).
/// Persistent mode: the spilled objects the index names go back into the spill tier, their
/// records checked and adopted by the spill IO (which then removes the files none names).
fn recover_spilled(
    persistence: &mut crate::persistence::Persistence,
    spill: Option<&(u64, PathBuf)>,
    event_loop: &mut EventLoop,
) -> Result<(), DaemonError> {
    let Some((_, dir)) = spill else {
        let objects = persistence.spilled_records();
        if objects > 0 {
            return Err(spill::SpillStartError::SpilledWithoutDir { objects }.into());
        }
        return Ok(());
    };
    let recovery = persistence.recover_spilled(
        |record| spill::check_recorded(dir, record),
        |objects| event_loop.recover_spilled(objects),
    );
    event_loop.spilled_lost_at_start(recovery.lost);
    if let Some(io) = &event_loop.effects.spill_io {
        let adopted = io.adopt(&recovery.adopted);
        info!(
            records = adopted.records,
            files_removed = adopted.files_removed,
            "spill files kept for the recovered objects"
        );
    }
    Ok(())
}

fn recovered_digest(
    arena: &Arc<SharedArena>,
    object: &skyriver_core::RecoveredObject,
) -> skyriver_core::ContentDigest {
    let len = object.data_size.saturating_add(object.metadata_size);
    match skyriver_transport::ReadableRegion::new(arena.clone(), object.block.offset, len) {
        Ok(view) => skyriver_core::ContentDigest::of_contiguous(view.as_slice()),
        Err(_) => skyriver_core::ContentDigest(!0),
    }
}
