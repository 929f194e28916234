//! `skyriver up`: a local cluster of N daemons on this machine, for trying Skyriver out (and
//! for the benchmarks and tests that need several daemons).
//!
//! `up` supervises its daemons: each one's output goes to `node-N.log` next to its socket, and
//! a daemon that exits — during start-up or later — is reported at once with its exit status
//! and the last lines of its log, after which `up` stops the others and exits non-zero. A
//! half-working cluster is never left running unnoticed, and nothing is restarted behind the
//! user's back (a restarted node would come back empty, which is a different cluster).
//!
//! One cluster per directory: `up.lock` in it is locked (`flock`) for the cluster's life and
//! names the `up` and the daemons. A second `up` in the same directory is refused before it
//! touches anything; a directory whose lock is free but names an `up` was left by one that
//! did not stop (SIGKILL): the next `up` there kills what still runs of its daemons and removes
//! their sockets, and `up` without `--dir` removes such directories under `$TMPDIR`. The
//! daemons of `up` itself get SIGTERM from the kernel when `up` dies however it dies
//! (`PR_SET_PDEATHSIG`), so they do not outlive it.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

mod error;
pub use error::{NodeCountError, UpError};
use skyriver_transport::directory::DirectorySpec;

use skyriver_client::Client;
use skyriver_daemon::host_memory;
use skyriver_daemon::size::{format_bytes, ByteSize};

/// How long each start-up step may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping daemons may take before they are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often `up` looks at its daemons.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Lines of a daemon's log shown when it exits.
const LOG_TAIL_LINES: usize = 15;
/// Most bytes read from the end of a log for its last lines.
const LOG_TAIL_BYTES: u64 = 16 * 1024;
/// The lock of a cluster's directory, held for the cluster's life.
const LOCK_FILE: &str = "up.lock";
/// What the directories `up` makes under $TMPDIR are called.
const TEMP_PREFIX: &str = "skyriver-up-";

/// Options of `skyriver up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Number of daemons (at least 1).
    #[arg(long, short = 'n', default_value_t = 3, value_parser = parse_node_count)]
    pub nodes: u32,
    /// Shared memory of each daemon. All of them together must fit in what the machine can
    /// give now (as a single daemon checks its own), unless --allow-overcommit.
    #[arg(long, short = 'm', default_value = "256MiB")]
    pub memory: ByteSize,
    /// Start even when --nodes × --memory is more than the machine can give now (MemAvailable,
    /// the cgroup limit); given to every daemon. The kernel may kill processes when they fill.
    #[arg(long)]
    pub allow_overcommit: bool,
    /// Where the daemons' sockets and logs (node-N.log) go; the logs are kept after `up`
    /// stops. One cluster at a time per directory (up.lock in it)
    /// [default: a new directory under $TMPDIR, removed with everything in it]
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Eager/rendezvous switch for every daemon: auto or a size.
    #[arg(long, default_value = "auto")]
    pub eager_threshold: String,
    /// Log filter of the daemons.
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Fabric between the daemons: tcp, or verbs (RDMA; needs --devices).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "verbs"])]
    pub fabric: String,
    /// RDMA devices for the verbs fabric, given to the nodes in turn (e.g. rxe0,rxe1).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Use this directory (redis://HOST:PORT) instead of the built-in one on node 0.
    #[arg(long)]
    pub directory: Option<String>,
    /// Name of the cluster, given to every daemon as --cluster (the key prefix in Redis)
    /// [default: $SKYRIVER_CLUSTER, else "default"]
    #[arg(long)]
    pub cluster: Option<String>,
    /// One more flag for every daemon, as `skyriver daemon` takes it; repeat for more, e.g.
    /// --daemon-arg=--lease-ms=2000 --daemon-arg=--location-cache=0.
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,
    /// Put each daemon in its own network namespace (root), on a bridge, with its own address.
    #[arg(long)]
    pub netns: bool,
    /// With --netns: shape every node's link, RATE,LATENCY (e.g. 10gbit,50us; tc tbf, and netem
    /// for the latency where the kernel has it).
    #[arg(long, requires = "netns")]
    pub link: Option<crate::netns::LinkShape>,
    /// Give every daemon `--metrics` on a free port (loopback, or with --netns its namespace's
    /// address, which the host reaches through the bridge), printed at start-up: /metrics for
    /// Prometheus, /healthz.
    #[arg(long)]
    pub metrics: bool,
    /// Give every daemon `--spill-dir DIR`: a full store writes sealed objects to DIR (each
    /// daemon in its own DIR/node-N) instead of forgetting them. DIR must exist.
    #[arg(long)]
    pub spill_dir: Option<PathBuf>,
    /// With --spill-dir: bytes each daemon may spill (`--spill-limit`) [default: 90% of the
    /// space free on DIR's file system at start].
    #[arg(long, requires = "spill_dir")]
    pub spill_limit: Option<ByteSize>,
    /// More flags for one daemon each, after --daemon-arg's: node N gets entry N (say a
    /// `--failure-domain` of its own). Not a command-line flag: for programs that start a
    /// cluster.
    #[arg(skip)]
    pub node_daemon_args: Vec<Vec<String>>,
    /// Prefault every daemon's store at start, as a lone `skyriver daemon` does: each daemon
    /// zeroes its whole --memory before it answers (a slower start), and no write to the
    /// store faults a page in later. Off by default, so a local cluster starts at once.
    #[arg(long)]
    pub prefault: bool,
}

fn parse_node_count(text: &str) -> Result<u32, NodeCountError> {
    match text.parse::<u32>() {
        Ok(0) => Err(NodeCountError::Zero),
        Ok(nodes) => Ok(nodes),
        Err(_) => Err(NodeCountError::NotANumber(text.to_string())),
    }
}

impl UpArgs {
    /// `nodes` daemons of `memory` each, sockets under `dir`, otherwise the defaults.
    pub fn new(nodes: u32, memory: ByteSize, dir: Option<PathBuf>) -> Self {
        Self {
            nodes,
            memory,
            allow_overcommit: false,
            dir,
            eager_threshold: "auto".into(),
            log: "warn".into(),
            directory: None,
            cluster: None,
            daemon_args: Vec::new(),
            fabric: "tcp".into(),
            devices: Vec::new(),
            netns: false,
            link: None,
            metrics: false,
            spill_dir: None,
            spill_limit: None,
            node_daemon_args: Vec::new(),
            prefault: false,
        }
    }
}

/// One daemon of a local cluster.
struct NodeProcess {
    /// `None` once it was stopped or reaped.
    child: Option<Child>,
    log: PathBuf,
}

/// A local cluster; stops its daemons when dropped (and removes the directory it created).
pub struct LocalCluster {
    nodes: Vec<NodeProcess>,
    /// One Unix socket per node, node 0 first.
    pub sockets: Vec<PathBuf>,
    /// The directory's address: the head's HOST:PORT, or the Redis URL.
    pub head: String,
    /// Where the sockets and logs are.
    pub dir: PathBuf,
    /// The lock of `dir`; released (and its file removed) on drop, after the daemons stopped.
    lock: Option<DirLock>,
    /// The directory this cluster created for itself; removed on drop.
    _temp: Option<tempfile::TempDir>,
    /// The namespaces the daemons run in (with --netns).
    pub netns: Option<crate::netns::NetnsCluster>,
    /// Where each node serves `/metrics` and `/healthz` (with `--metrics`), node 0 first.
    pub metrics: Vec<std::net::SocketAddr>,
}

/// How [`LocalCluster::spawn`] runs the daemons.
#[derive(Clone, Copy)]
struct Supervision<'a> {
    /// Start each daemon in its own process group, so a terminal's Ctrl-C reaches only `up`,
    /// which then stops them in order (instead of racing their exits against its own).
    own_process_group: bool,
    /// Set when `up` was asked to stop: start-up gives up at once.
    stop: Option<&'a AtomicBool>,
    /// The kernel sends each daemon SIGTERM when the thread that spawns it ends (so when `up`
    /// dies, even by SIGKILL): only for a spawning thread that lives as long as the cluster.
    die_with_spawner: bool,
}

impl LocalCluster {
    /// The daemons' process ids, node 0 first (`None` for one already stopped).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.nodes
            .iter()
            .map(|node| node.child.as_ref().map(Child::id))
            .collect()
    }

    /// Starts `args.nodes` daemons (node 0 is the head) and waits until every one has connected
    /// to every other. A daemon that exits meanwhile fails the start at once, with its exit
    /// status and the last lines of its log.
    pub fn start(args: &UpArgs, exe: &Path) -> Result<Self, UpError> {
        Self::start_in_this_group(args, exe, false)
    }

    /// [`LocalCluster::start`], with each daemon also sent SIGTERM by the kernel when the calling
    /// thread ends, however it ends (even by SIGKILL or the OOM killer), so no daemon outlives a
    /// program that dies before it could stop them. Only for a thread that lives as long as the
    /// cluster, such as a program's main thread: a shorter-lived one takes the daemons with it.
    pub fn start_tied_to_this_thread(args: &UpArgs, exe: &Path) -> Result<Self, UpError> {
        Self::start_in_this_group(args, exe, true)
    }

    /// Starts the daemons in this process's group, with no stop flag to watch.
    fn start_in_this_group(
        args: &UpArgs,
        exe: &Path,
        die_with_spawner: bool,
    ) -> Result<Self, UpError> {
        Self::spawn(
            args,
            exe,
            Supervision {
                own_process_group: false,
                stop: None,
                die_with_spawner,
            },
        )
    }

    /// [`LocalCluster::spawn_once`], again with other ports when a daemon found a port this
    /// function chose (the head's, a metrics endpoint's) taken: a port is free when chosen and
    /// bound a moment later, and on a busy machine another process can take it in between.
    fn spawn(args: &UpArgs, exe: &Path, supervision: Supervision<'_>) -> Result<Self, UpError> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Self::spawn_once(args, exe, supervision) {
                Err(error) if attempt < ATTEMPTS && error.port_taken() => {
                    eprintln!(
                        "a port chosen for the cluster was taken meanwhile; starting again with \
                         other ports ({error})"
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn spawn_once(
        args: &UpArgs,
        exe: &Path,
        supervision: Supervision<'_>,
    ) -> Result<Self, UpError> {
        if args.nodes == 0 {
            return Err(UpError::NoNodes);
        }
        if args.fabric == "verbs" && args.devices.is_empty() {
            return Err(UpError::VerbsWithoutDevices);
        }
        if let Some(name) = &args.cluster {
            if !skyriver_transport::directory::redis::valid_cluster_name(name) {
                return Err(UpError::BadClusterName(name.clone()));
            }
        }
        check_memory(args)?;
        let (dir, temp) = match &args.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(file_error("create", dir))?;
                // Absolute, so the paths printed for other shells work from anywhere.
                let dir = std::fs::canonicalize(dir).map_err(file_error("resolve", dir))?;
                (dir, None)
            }
            None => {
                remove_stale_temp_dirs();
                let temp = tempfile::Builder::new()
                    .prefix(TEMP_PREFIX)
                    .tempdir()
                    .map_err(UpError::TempDir)?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        // Nothing in the directory is touched before its lock is held.
        let mut lock = match DirLock::try_take(&dir)? {
            Ok(lock) => lock,
            Err(holder) => return Err(holder.refusal(dir)),
        };
        if let Err(error) = lock.clear_leftovers(&dir, args.nodes) {
            lock.remove();
            return Err(error);
        }
        let netns = match args.netns {
            true => Some(crate::netns::NetnsCluster::create(
                args.nodes,
                args.link.as_ref(),
            )?),
            false => None,
        };
        let head_port = free_port_or_say_why()?;
        let head = match (&args.directory, &netns) {
            (Some(directory), _) => directory.clone(),
            (None, Some(netns)) => format!("{}:7390", netns.hosts[0].addr),
            (None, None) => format!("127.0.0.1:{head_port}"),
        };
        let token = std::env::var("SKYRIVER_CLUSTER_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(skyriver_daemon::security::random_token);
        let mut cluster = Self {
            nodes: Vec::new(),
            sockets: Vec::new(),
            head: head.clone(),
            dir: dir.clone(),
            lock: Some(lock),
            _temp: temp,
            netns,
            metrics: Vec::new(),
        };
        for node in 0..args.nodes {
            let socket = dir.join(format!("node-{node}.sock"));
            let log = dir.join(format!("node-{node}.log"));
            let log_file = std::fs::File::create(&log).map_err(file_error("create", &log))?;
            let log_out = log_file.try_clone().map_err(file_error("open", &log))?;
            let (mut command, listen) = match &cluster.netns {
                Some(netns) => (
                    netns.command(node as usize, exe),
                    format!("{}:0", netns.hosts[node as usize].addr),
                ),
                None => (Command::new(exe), "127.0.0.1:0".to_string()),
            };
            command
                .args(["daemon", "--fabric", &args.fabric, "--listen", &listen])
                .args((!args.prefault).then_some("--no-prefault"))
                .args([
                    "--node-id",
                    &node.to_string(),
                    "--memory",
                    &args.memory.0.to_string(),
                ])
                .args([
                    "--eager-threshold",
                    &args.eager_threshold,
                    "--log",
                    &args.log,
                ])
                .arg("--socket")
                .arg(&socket)
                .args(
                    args.devices
                        .get(node as usize % args.devices.len().max(1))
                        .map(|device| ["--device", device.as_str()])
                        .into_iter()
                        .flatten(),
                )
                .args(
                    args.cluster
                        .iter()
                        .flat_map(|name| ["--cluster", name.as_str()]),
                )
                .args(&args.daemon_args)
                .args(
                    args.node_daemon_args
                        .get(node as usize)
                        .into_iter()
                        .flatten(),
                )
                .env("SKYRIVER_CLUSTER_TOKEN", &token)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log_out))
                .stderr(Stdio::from(log_file));
            if supervision.own_process_group {
                std::os::unix::process::CommandExt::process_group(&mut command, 0);
            }
            if supervision.die_with_spawner {
                skyriver_transport::process::die_with_parent(
                    &mut command,
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            if args.allow_overcommit {
                command.arg("--allow-overcommit");
            }
            if let Some(dir) = &args.spill_dir {
                command.arg("--spill-dir").arg(dir);
            }
            if let Some(limit) = &args.spill_limit {
                command.args(["--spill-limit", &limit.0.to_string()]);
            }
            if args.metrics {
                let ip = match &cluster.netns {
                    Some(netns) => netns.hosts[node as usize].addr,
                    None => std::net::Ipv4Addr::LOCALHOST,
                };
                let addr = std::net::SocketAddr::from((ip, free_port_or_say_why()?));
                command.args(["--metrics", &addr.to_string()]);
                cluster.metrics.push(addr);
            }
            match (&args.directory, node) {
                (Some(directory), _) => command.args(["--directory", directory]),
                (None, 0) => command.args(["--head", &head]),
                (None, _) => command.args(["--join", &head]),
            };
            let child = command
                .spawn()
                .map_err(|source| UpError::Spawn { node, source })?;
            if let Some(lock) = &mut cluster.lock {
                lock.record_daemon(child.id(), &socket)?;
            }
            cluster.nodes.push(NodeProcess {
                child: Some(child),
                log,
            });
            cluster.sockets.push(socket.clone());
            // The head must serve the directory before the others join.
            if node == 0 {
                cluster.wait_for_socket(0, &supervision)?;
            }
        }
        for node in 0..cluster.sockets.len() {
            cluster.wait_for_socket(node, &supervision)?;
        }
        cluster.wait_connected(&supervision)?;
        Ok(cluster)
    }

    /// Fails at once if a daemon exited or `up` was asked to stop.
    fn check_start(&mut self, supervision: &Supervision<'_>) -> Result<(), UpError> {
        if supervision.stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            return Err(UpError::Interrupted);
        }
        match self.poll_exit() {
            Some(exit) => Err(UpError::ExitedDuringStart {
                report: exit.report(),
            }),
            None => Ok(()),
        }
    }

    fn wait_for_socket(
        &mut self,
        node: usize,
        supervision: &Supervision<'_>,
    ) -> Result<(), UpError> {
        let started = Instant::now();
        loop {
            match Client::connect(&self.sockets[node]) {
                Ok(_) => break,
                // Not listening yet, or went away mid-handshake: keep waiting.
                Err(
                    skyriver_client::ClientError::Connect { .. }
                    | skyriver_client::ClientError::Io(_)
                    | skyriver_client::ClientError::Closed
                    | skyriver_client::ClientError::Store(skyriver_core::StoreError::Starting(_)),
                ) => {}
                // It answered, and refused this client: waiting will not change that.
                Err(source) => {
                    return Err(UpError::Refused {
                        node,
                        socket: self.sockets[node].clone(),
                        source,
                    })
                }
            }
            self.check_start(supervision)?;
            if started.elapsed() > START_TIMEOUT {
                return Err(UpError::NoAnswer {
                    node,
                    socket: self.sockets[node].clone(),
                    within: START_TIMEOUT,
                    log: self.nodes[node].log.clone(),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        Ok(())
    }

    fn wait_connected(&mut self, supervision: &Supervision<'_>) -> Result<(), UpError> {
        let started = Instant::now();
        let want = self.sockets.len();
        loop {
            self.check_start(supervision)?;
            let mut ready = true;
            for socket in &self.sockets {
                ready &= match Client::connect(socket).and_then(|c| c.nodes()) {
                    Ok(view) => {
                        view.members.len() == want && view.members.iter().all(|m| m.connected)
                    }
                    // A daemon that just died: the next check reports it.
                    Err(_) => false,
                };
            }
            if ready {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(UpError::NotConnected {
                    nodes: want,
                    within: START_TIMEOUT,
                    dir: self.dir.clone(),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// The first daemon found to have exited (it is reaped, and not reported again).
    pub fn poll_exit(&mut self) -> Option<NodeExit> {
        for (node, process) in self.nodes.iter_mut().enumerate() {
            let Some(child) = &mut process.child else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                let pid = child.id();
                process.child = None;
                return Some(NodeExit {
                    node,
                    pid,
                    status,
                    log: process.log.clone(),
                    last_lines: last_lines(&process.log, LOG_TAIL_LINES),
                });
            }
        }
        None
    }

    /// Kills node `node` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes.get_mut(node).and_then(|n| n.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops node `node` cleanly (SIGTERM) and waits for it, as an operator would.
    pub fn stop_node(&mut self, node: usize) {
        if let Some(mut child) = self.nodes.get_mut(node).and_then(|n| n.child.take()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops every daemon still running: SIGTERM, then SIGKILL for those that have not exited
    /// within [`STOP_TIMEOUT`]; every one is reaped, and sockets left behind are removed.
    pub fn stop(&mut self) {
        for child in self.nodes.iter().filter_map(|n| n.child.as_ref()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for process in &mut self.nodes {
            let Some(mut child) = process.child.take() else {
                continue;
            };
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        // A daemon that was killed had no chance to remove its socket. One that answers is
        // not this cluster's (its daemon failed to bind it): it stays.
        for socket in &self.sockets {
            if !answers(socket) {
                let _ = std::fs::remove_file(socket);
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
        if let Some(lock) = self.lock.take() {
            lock.remove();
        }
    }
}

/// Whether a process listens on the Unix socket at `path`.
fn answers(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Refuses `--nodes` × `--memory` beyond what the machine can give now, as each daemon
/// refuses its own `--memory` ([`host_memory::check`]): each one alone may fit where all of
/// them together do not.
fn check_memory(args: &UpArgs) -> Result<(), UpError> {
    let flag = |name: &str| daemon_flag(&args.daemon_args, name);
    // A persistent store is a file, not memory the daemon checks.
    if args.allow_overcommit
        || flag("--allow-overcommit").is_some()
        || flag("--backing-file").is_some()
    {
        return Ok(());
    }
    let hugepages = flag("--hugepages").flatten().map(PathBuf::from);
    let Some(available) = host_memory::available(hugepages.as_deref()) else {
        return Ok(()); // Nothing to measure against: each daemon decides.
    };
    let nodes = u64::from(args.nodes.max(1));
    let total = args.memory.0.saturating_mul(nodes);
    if total <= available.bytes {
        return Ok(());
    }
    let each = ((available.bytes / nodes / 10 * 9) >> 20) << 20;
    Err(UpError::TooMuchMemory {
        nodes,
        each_bytes: args.memory.0,
        total_bytes: total,
        available_bytes: available.bytes,
        source_of_figure: available.source,
        suggested_bytes: each.max(host_memory::MIN_MEMORY_BYTES),
    })
}

/// A flag among `--daemon-arg`s: `None` if absent, `Some(value)` if present (`--flag=VALUE` or
/// `--flag VALUE`; `Some(None)` without one).
fn daemon_flag(args: &[String], name: &str) -> Option<Option<String>> {
    args.iter().enumerate().find_map(|(index, arg)| {
        if arg == name {
            Some(args.get(index + 1).filter(|v| !v.starts_with('-')).cloned())
        } else {
            let value = arg.strip_prefix(name)?.strip_prefix('=')?;
            Some(Some(value.to_string()))
        }
    })
}

/// The lock of a cluster's directory: `up.lock`, locked (`flock`) while the cluster runs. It
/// holds `up PID` and a `daemon PID SOCKET` line per daemon, so the next `up` in the directory
/// can name a running cluster, and clear what one that was killed left behind.
struct DirLock {
    path: PathBuf,
    file: nix::fcntl::Flock<std::fs::File>,
}

/// Who holds a directory's lock.
struct Holder {
    /// The `up` holding it (`None` if it has not written its pid yet).
    pid: Option<u32>,
}

impl Holder {
    fn refusal(&self, dir: PathBuf) -> UpError {
        match self.pid {
            Some(pid) => UpError::Running { dir, pid },
            None => UpError::Starting { dir },
        }
    }
}

/// What a lock file says: the `up` and its daemons (pid, socket).
#[derive(Default)]
struct LockRecord {
    up: Option<u32>,
    daemons: Vec<(u32, PathBuf)>,
}

impl LockRecord {
    fn parse(text: &str) -> Self {
        let mut record = Self::default();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            match (
                words.next(),
                words.next().and_then(|p| p.parse().ok()),
                words.next(),
            ) {
                (Some("up"), Some(pid), _) => record.up = Some(pid),
                (Some("daemon"), Some(pid), Some(socket)) => {
                    record.daemons.push((pid, PathBuf::from(socket)))
                }
                _ => {}
            }
        }
        record
    }
}

impl DirLock {
    /// Takes `dir`'s lock if nobody holds it; else says who does.
    fn try_take(dir: &Path) -> Result<Result<Self, Holder>, UpError> {
        let path = dir.join(LOCK_FILE);
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .map_err(file_error("open", &path))?;
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(file) => {
                    // A holder removes the file before it lets go: a lock taken on a removed
                    // file guards nothing, so take it again on the file now there.
                    let current = std::fs::metadata(&path).ok();
                    let locked = file.metadata().ok();
                    match (current, locked) {
                        (Some(a), Some(b)) if a.dev() == b.dev() && a.ino() == b.ino() => {
                            return Ok(Ok(Self { path, file }))
                        }
                        _ => continue,
                    }
                }
                Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    return Ok(Err(Holder {
                        pid: LockRecord::parse(&text).up,
                    }));
                }
                Err((_, source)) => return Err(UpError::Lock { path, source }),
            }
        }
    }

    /// What the previous holder wrote (empty after a clean stop: the file was removed).
    fn previous(&mut self) -> LockRecord {
        let mut text = String::new();
        let _ = (&*self.file).seek(SeekFrom::Start(0));
        let _ = (&*self.file).read_to_string(&mut text);
        LockRecord::parse(&text)
    }

    /// Clears what an `up` that did not stop left in `dir` (its daemons still running are
    /// killed, sockets nobody answers on removed), refuses a daemon that listens on one of the
    /// `nodes` sockets, and records this process as the holder.
    fn clear_leftovers(&mut self, dir: &Path, nodes: u32) -> Result<(), UpError> {
        let previous = self.previous();
        let mut done = Vec::new();
        for (pid, socket) in &previous.daemons {
            if is_daemon_of(*pid, socket) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let deadline = Instant::now() + STOP_TIMEOUT;
                while is_daemon_of(*pid, socket) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                done.push(format!("killed daemon pid {pid}"));
            }
        }
        let sockets = std::fs::read_dir(dir)
            .map_err(file_error("read", dir))?
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                name.is_some_and(|n| n.starts_with("node-") && n.ends_with(".sock"))
            });
        for socket in sockets {
            if answers(&socket) {
                let node = (0..nodes).find(|n| socket.ends_with(format!("node-{n}.sock")));
                if node.is_some() {
                    return Err(UpError::ForeignDaemon { socket });
                }
            } else if std::fs::remove_file(&socket).is_ok() {
                done.push(format!("removed stale {}", socket.display()));
            }
        }
        if let Some(pid) = previous.up {
            let what = if done.is_empty() {
                "none of its daemons was left running".to_string()
            } else {
                done.join(", ")
            };
            eprintln!(
                "the cluster of up pid {pid} in {} was not stopped cleanly: {what}",
                dir.display()
            );
        }
        let file = &*self.file;
        file.set_len(0)
            .and_then(|()| (&*file).seek(SeekFrom::Start(0)).map(drop))
            .and_then(|()| writeln!(&*file, "up {}", std::process::id()))
            .map_err(file_error("write", &self.path))
    }

    /// Records a daemon this cluster started.
    fn record_daemon(&mut self, pid: u32, socket: &Path) -> Result<(), UpError> {
        writeln!(&*self.file, "daemon {pid} {}", socket.display())
            .map_err(file_error("write", &self.path))
    }

    /// Removes the lock file, then lets go of the lock (a cluster stopped cleanly).
    fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `pid` is a running `skyriver daemon` serving `socket` (pids are reused).
fn is_daemon_of(pid: u32, socket: &Path) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let zombie = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let socket = socket.as_os_str().as_encoded_bytes();
    !zombie
        && cmdline.split(|&b| b == 0).any(|arg| arg == b"daemon")
        && cmdline.split(|&b| b == 0).any(|arg| arg == socket)
}

/// Removes the directories under $TMPDIR of `up`s that were killed: their lock is free and
/// names an `up` (a directory being made names none yet).
fn remove_stale_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = entry.path();
        let owned = entry
            .metadata()
            .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw());
        if !name.starts_with(TEMP_PREFIX) || !owned || !dir.join(LOCK_FILE).exists() {
            continue;
        }
        let Ok(Ok(mut lock)) = DirLock::try_take(&dir) else {
            continue;
        };
        // A live `up` holds its lock: this one's holder is gone, if it ever wrote its pid.
        if lock.previous().up.is_none() {
            continue;
        }
        if lock.clear_leftovers(&dir, 0).is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// A daemon of a local cluster that exited.
#[derive(Debug, Clone)]
pub struct NodeExit {
    /// Its node number.
    pub node: usize,
    /// Its process id.
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
    /// Its log file.
    pub log: PathBuf,
    /// The last lines of its log.
    pub last_lines: Vec<String>,
}

impl NodeExit {
    /// What happened, with the last lines of the log, for the user.
    pub fn report(&self) -> String {
        let mut report = format!(
            "node-{} (pid {}) exited ({})",
            self.node, self.pid, self.status
        );
        if self.last_lines.is_empty() {
            report.push_str(&format!("; its log {} is empty", self.log.display()));
        } else {
            report.push_str(&format!("; last lines of {}:", self.log.display()));
            for line in &self.last_lines {
                report.push_str("\n  | ");
                report.push_str(line);
            }
        }
        report
    }
}

/// The last `count` lines of the file at `path` (at most [`LOG_TAIL_BYTES`] read).
fn last_lines(path: &Path, count: usize) -> Vec<String> {
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = length.saturating_sub(LOG_TAIL_BYTES);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0); // probably cut mid-line
    }
    let skip = lines.len().saturating_sub(count);
    lines[skip..].iter().map(|l| l.to_string()).collect()
}

/// A loopback TCP port that was free a moment ago.
pub fn free_loopback_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// [`free_loopback_port`] for the start-up paths that report errors as text.
fn free_port_or_say_why() -> Result<u16, UpError> {
    free_loopback_port().map_err(UpError::NoFreePort)
}

/// Turns an IO error about `path` into [`UpError::File`].
fn file_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> UpError {
    let path = path.to_path_buf();
    move |source| UpError::File {
        action,
        path,
        source,
    }
}

/// Runs `skyriver up` in the foreground until Ctrl-C (SIGINT), SIGTERM or SIGHUP, or until a
/// daemon exits: then the others are stopped and the error says which one and why.
pub fn run(args: &UpArgs) -> Result<(), UpError> {
    let exe = crate::self_exe().map_err(UpError::OwnPath)?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_stop_signals(stop.clone()).map_err(UpError::Signals)?;
    eprintln!(
        "starting {} daemons with {} each...",
        args.nodes,
        format_bytes(args.memory.0)
    );
    let mut cluster = LocalCluster::spawn(
        args,
        &exe,
        Supervision {
            own_process_group: true,
            stop: Some(&stop),
            // This is the main thread: it lives as long as `up`.
            die_with_spawner: true,
        },
    )?;
    let directory = match args.directory.as_deref().map(str::parse::<DirectorySpec>) {
        Some(Ok(spec @ DirectorySpec::Redis { .. })) => format!("Redis directory at {spec}"),
        Some(Ok(spec)) => format!("directory at {spec}"),
        Some(Err(_)) => format!("directory at {}", cluster.head),
        None => format!("built-in directory on node-0 at {}", cluster.head),
    };
    let name = args
        .cluster
        .clone()
        .or_else(|| std::env::var("SKYRIVER_CLUSTER").ok())
        .unwrap_or_else(|| "default".into());
    println!(
        "local cluster {name:?} up: {} nodes, {directory}",
        cluster.sockets.len()
    );
    for (node, socket) in cluster.sockets.iter().enumerate() {
        match cluster.metrics.get(node) {
            Some(addr) => println!(
                "  node-{node}: export SKYRIVER_SOCKET={}   metrics: http://{addr}/metrics",
                socket.display()
            ),
            None => println!("  node-{node}: export SKYRIVER_SOCKET={}", socket.display()),
        }
    }
    println!(
        "logs: {}/node-N.log{}",
        cluster.dir.display(),
        if args.dir.is_some() {
            ""
        } else {
            " (removed when up stops; --dir keeps them)"
        }
    );
    if let Some(netns) = &cluster.netns {
        crate::netns::describe(netns);
    }
    println!("try:");
    println!(
        "  id=$(skyriver put --socket {} FILE)",
        cluster.sockets[0].display()
    );
    println!(
        "  skyriver fetch --socket {} $id -o copy",
        cluster.sockets[cluster.sockets.len() - 1].display()
    );
    println!("  skyriver nodes --socket {}", cluster.sockets[0].display());
    println!("Ctrl-C stops the cluster; if a node exits, up stops the others and fails.");
    loop {
        if stop.load(Ordering::SeqCst) {
            eprintln!("stopping...");
            drop(cluster);
            return Ok(());
        }
        if let Some(exit) = cluster.poll_exit() {
            eprintln!("skyriver: {}", exit.report());
            eprintln!("stopping the other nodes...");
            cluster.stop();
            return Err(UpError::Exited { node: exit.node });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Sets `stop` at SIGINT, SIGTERM or SIGHUP (`up`'s and `chaos`'s clean stop).
pub(crate) fn watch_stop_signals(stop: Arc<AtomicBool>) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut interrupt, mut terminate, mut hangup) = {
        // Registering needs the runtime's context; the handlers live on with it.
        let _guard = runtime.enter();
        let watch = signal;
        (
            watch(SignalKind::interrupt())?,
            watch(SignalKind::terminate())?,
            watch(SignalKind::hangup())?,
        )
    };
    std::thread::spawn(move || {
        runtime.block_on(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
                _ = hangup.recv() => {}
            }
        });
        stop.store(true, Ordering::SeqCst);
    });
    Ok(())
}
