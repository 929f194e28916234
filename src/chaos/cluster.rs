//! The daemons of a chaos run, each in its own network namespace: started, killed, paused and
//! restarted one by one (unlike `skyriver up`, which never restarts a daemon), with their
//! logs kept across restarts and their resources sampled.
//!
//! Everything made here goes when the [`ChaosCluster`] is dropped: the daemons (SIGCONT then
//! SIGKILL), the tmpfs mounts of persistent stores, the namespaces and the run's directory.
//! The daemons also get SIGKILL from the kernel if this process dies (`PR_SET_PDEATHSIG`), so
//! they must be spawned from the thread that lives for the whole run (the main thread).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::netns::NetnsCluster;

use super::history::{Resources, UnexpectedExit};

/// Port of the built-in directory on node 0.
const HEAD_PORT: u16 = 7390;
/// How long a (re)started daemon may take to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Room on a persistent node's tmpfs beyond its store file and index.
const TMPFS_SLACK_BYTES: u64 = 16 << 20;

/// Why the cluster could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum ChaosClusterError {
    /// The namespaces could not be made.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// A file, directory, mount or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The run's Redis Cluster could not be started, or a master killed or restarted.
    #[error(transparent)]
    Redis(#[from] super::redis_cluster::RedisClusterError),
    /// A daemon did not come up.
    #[error("node-{node} did not start: {reason}")]
    Start {
        /// The node.
        node: u32,
        /// Why (with the end of its log).
        reason: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ChaosClusterError {
    let what = what.into();
    move |source| ChaosClusterError::Io { what, source }
}

/// How the daemons run.
#[derive(Debug, Clone)]
pub struct DaemonSettings {
    /// Nodes.
    pub nodes: u32,
    /// Shared memory of each daemon, bytes.
    pub memory_bytes: u64,
    /// Persistent daemons (`--backing-file` on a tmpfs of their own).
    pub persistent: bool,
    /// `redis://…` instead of the built-in directory on node 0.
    pub directory: Option<String>,
    /// The `skyriver` program.
    pub exe: PathBuf,
    /// A Redis Cluster of the run's own as the directory (`directory` is then its URL).
    pub redis_cluster: bool,
    /// TCP, or verbs on which device.
    pub fabric: super::fabric::ChaosFabric,
}

struct Daemon {
    child: Option<Child>,
    /// Killed or stopped by the nemesis: its exit is expected.
    killed: bool,
    paused: bool,
    resources: Resources,
}

/// The run's daemons in their namespaces.
pub struct ChaosCluster {
    settings: DaemonSettings,
    daemons: Vec<Daemon>,
    token: String,
    /// The run's directory (sockets, logs, stores).
    pub dir: PathBuf,
    /// The namespaces (dropped after the daemons and mounts).
    pub netns: Option<NetnsCluster>,
    mounts: Vec<PathBuf>,
    /// The run's Redis Cluster, with `--directory redis-cluster`.
    redis: Option<super::redis_cluster::ChaosRedisCluster>,
    started: Instant,
    exits: Vec<UnexpectedExit>,
    /// The run's hold on its directory (see `super::stale`).
    _owner: super::stale::RunLock,
    _temp: tempfile::TempDir,
}

impl ChaosCluster {
    /// Makes the namespaces and starts every daemon, node 0 first, and waits until each
    /// answers on its socket.
    pub fn start(settings: DaemonSettings) -> Result<Self, ChaosClusterError> {
        for dir in super::stale::remove_stale_runs(&std::env::temp_dir()) {
            println!("chaos: removed {} left by a killed run", dir.display());
        }
        let temp = tempfile::Builder::new()
            .prefix(super::stale::RUN_DIR_PREFIX)
            .tempdir()
            .map_err(io("cannot create a directory under $TMPDIR"))?;
        let owner = super::stale::own(temp.path())
            .map_err(io(format!("cannot lock {}", temp.path().display())))?;
        crate::netns::remove_dir_on_signal(temp.path().to_path_buf());
        let netns = NetnsCluster::create(settings.nodes, None)?;
        let mut cluster = Self {
            daemons: Vec::new(),
            token: skyriver_daemon::security::random_token(),
            dir: temp.path().to_path_buf(),
            netns: Some(netns),
            mounts: Vec::new(),
            redis: None,
            started: Instant::now(),
            exits: Vec::new(),
            settings,
            _owner: owner,
            _temp: temp,
        };
        if cluster.settings.redis_cluster {
            let redis = super::redis_cluster::ChaosRedisCluster::start(
                cluster.netns().host_addr(),
                &cluster.dir,
            )?;
            cluster.settings.directory = Some(redis.url());
            cluster.redis = Some(redis);
        }
        for node in 0..cluster.settings.nodes {
            if cluster.settings.persistent {
                let store_dir = cluster.store_dir(node);
                std::fs::create_dir_all(&store_dir)
                    .map_err(io(format!("cannot create {}", store_dir.display())))?;
                // A file system of its own, small, so the nemesis can fill it.
                let size = cluster.settings.memory_bytes * 2 + TMPFS_SLACK_BYTES;
                let status = Command::new("mount")
                    .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                    .arg(&store_dir)
                    .status()
                    .map_err(io("cannot run mount"))?;
                if !status.success() {
                    return Err(ChaosClusterError::Io {
                        what: format!("mount -t tmpfs on {}", store_dir.display()),
                        source: std::io::Error::other(status.to_string()),
                    });
                }
                cluster.mounts.push(store_dir);
            }
            cluster.daemons.push(Daemon {
                child: None,
                killed: false,
                paused: false,
                resources: Resources {
                    node,
                    ..Resources::default()
                },
            });
            cluster.spawn(node)?;
            if node == 0 {
                cluster.wait_answering(0)?;
            }
        }
        for node in 0..cluster.settings.nodes {
            cluster.wait_answering(node)?;
        }
        Ok(cluster)
    }

    /// Node `node`'s socket.
    pub fn socket(&self, node: u32) -> PathBuf {
        self.dir.join(format!("node-{node}.sock"))
    }

    /// Node `node`'s log (every incarnation, appended).
    pub fn log(&self, node: u32) -> PathBuf {
        self.dir.join(format!("node-{node}.log"))
    }

    /// Where a persistent node keeps its store (its own tmpfs).
    pub fn store_dir(&self, node: u32) -> PathBuf {
        self.dir.join(format!("node-{node}-store"))
    }

    /// The namespaces.
    pub fn netns(&self) -> &NetnsCluster {
        // Present from start until drop.
        self.netns
            .as_ref()
            .expect("the namespaces live as long as the cluster")
    }

    /// Times of exits count from `epoch` (the workload's start).
    pub fn set_epoch(&mut self, epoch: Instant) {
        self.started = epoch;
    }

    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn spawn(&mut self, node: u32) -> Result<(), ChaosClusterError> {
        let log_path = self.log(node);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(format!("cannot open {}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io(format!("cannot open {}", log_path.display())))?;
        let netns = self.netns();
        let addr = netns.hosts[node as usize].addr;
        let head = format!("{}:{HEAD_PORT}", netns.hosts[0].addr);
        let mut command = netns.command(node as usize, &self.settings.exe);
        command
            .arg("daemon")
            .args(self.settings.fabric.daemon_args(node))
            .args(["--no-prefault", "--log", "info"])
            .args(["--listen", &format!("{addr}:0")])
            .args(["--node-id", &node.to_string()])
            .args(["--memory", &self.settings.memory_bytes.to_string()])
            // Leases shorter than the nemesis's pauses.
            .args(["--lease-ms", "2000"])
            .arg("--socket")
            .arg(self.socket(node));
        if self.settings.persistent {
            command
                .arg("--backing-file")
                .arg(self.store_dir(node).join("store"));
        }
        match (&self.settings.directory, node) {
            (Some(directory), _) => command.args(["--directory", directory]),
            (None, 0) => command.args(["--head", &head]),
            (None, _) => command.args(["--join", &head]),
        };
        command
            .env("SKYRIVER_CLUSTER_TOKEN", &self.token)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // A group of its own: a terminal's Ctrl-C reaches only `chaos`, which stops them.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        skyriver_transport::process::die_with_parent(&mut command, Signal::SIGKILL);
        let child = command
            .spawn()
            .map_err(io(format!("cannot start node-{node}")))?;
        let daemon = &mut self.daemons[node as usize];
        daemon.child = Some(child);
        daemon.killed = false;
        daemon.paused = false;
        Ok(())
    }

    /// Waits until node `node` answers on its socket (a persistent one may be recovering).
    pub fn wait_answering(&mut self, node: u32) -> Result<(), ChaosClusterError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if skyriver_client::Client::connect(self.socket(node)).is_ok() {
                return Ok(());
            }
            let exited = self.daemons[node as usize]
                .child
                .as_mut()
                .map(|c| c.try_wait())
                .transpose()
                .ok()
                .flatten()
                .flatten();
            if let Some(status) = exited {
                let log = std::fs::read_to_string(self.log(node)).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(8)..].join("\n  | ");
                return Err(ChaosClusterError::Start {
                    node,
                    reason: format!("it exited ({status}); the end of its log:\n  | {tail}"),
                });
            }
            if Instant::now() > deadline {
                return Err(ChaosClusterError::Start {
                    node,
                    reason: format!(
                        "no answer within {START_TIMEOUT:?}; see {}",
                        self.log(node).display()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, node: u32, signal: Signal) {
        if let Some(child) = &self.daemons[node as usize].child {
            let _ = kill(Pid::from_raw(child.id() as i32), signal);
        }
    }

    /// SIGKILL: the daemon dies as in a crash. With `wipe`, its store files are deleted too.
    pub fn kill(&mut self, node: u32, wipe: bool) -> Result<(), ChaosClusterError> {
        self.sample(node);
        let daemon = &mut self.daemons[node as usize];
        daemon.killed = true;
        if let Some(mut child) = daemon.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket(node));
        if wipe {
            let store = self.store_dir(node);
            for name in ["store", "store.index"] {
                match std::fs::remove_file(store.join(name)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(io(format!("cannot remove {name}"))(e))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Starts a killed daemon again, with the flags it had, and waits until it answers.
    pub fn restart(&mut self, node: u32) -> Result<(), ChaosClusterError> {
        self.spawn(node)?;
        self.wait_answering(node)
    }

    /// Kills a master of the run's Redis Cluster (the `pick % 3`th) and waits for its
    /// replica's takeover; the killed server's port.
    pub fn kill_redis_master(&mut self, pick: u32) -> Result<u16, ChaosClusterError> {
        match &mut self.redis {
            Some(redis) => Ok(redis.kill_master(pick)?),
            None => Err(ChaosClusterError::Redis(
                super::redis_cluster::RedisClusterError::State(
                    "this run has no Redis Cluster of its own".into(),
                ),
            )),
        }
    }

    /// Restarts the Redis server on `port` (it rejoins as a replica).
    pub fn restart_redis(&mut self, port: u16) -> Result<(), ChaosClusterError> {
        if let Some(redis) = &mut self.redis {
            redis.restart(port)?;
        }
        Ok(())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub fn pause(&mut self, node: u32, paused: bool) {
        self.daemons[node as usize].paused = paused;
        self.signal(
            node,
            if paused {
                Signal::SIGSTOP
            } else {
                Signal::SIGCONT
            },
        );
    }

    /// Notes each daemon's resident memory and open files, and any that exited on its own.
    pub fn sample_all(&mut self) {
        for node in 0..self.daemons.len() as u32 {
            self.sample(node);
        }
        let now = self.ms();
        for (node, daemon) in self.daemons.iter_mut().enumerate() {
            if daemon.killed {
                continue;
            }
            if let Some(child) = &mut daemon.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.exits.push(UnexpectedExit {
                        node: node as u32,
                        at_ms: now,
                        status: status.to_string(),
                    });
                    daemon.child = None;
                }
            }
        }
    }

    fn sample(&mut self, node: u32) {
        let daemon = &mut self.daemons[node as usize];
        let Some(child) = &daemon.child else {
            return;
        };
        let pid = child.id();
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            {
                daemon.resources.max_rss_bytes = daemon.resources.max_rss_bytes.max(kib * 1024);
            }
        }
        if let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            let fds = entries.count() as u64;
            daemon.resources.max_open_fds = daemon.resources.max_open_fds.max(fds);
        }
    }

    /// Adds objects evicted by each live daemon to its resources.
    pub fn sample_evictions(&mut self) {
        for node in 0..self.daemons.len() as u32 {
            let evicted = skyriver_client::Client::connect(self.socket(node))
                .and_then(|c| c.stats())
                .map(|s| s.evicted_objects_total)
                .unwrap_or(0);
            self.daemons[node as usize].resources.evicted_objects += evicted;
        }
    }

    /// Daemons that exited without being killed.
    pub fn unexpected_exits(&self) -> Vec<UnexpectedExit> {
        self.exits.clone()
    }

    /// Each daemon's peak resources.
    pub fn resources(&self) -> Vec<Resources> {
        self.daemons.iter().map(|d| d.resources.clone()).collect()
    }

    /// Log lines that report a panic, by node.
    pub fn panics(&self) -> Vec<(u32, String)> {
        let mut found = Vec::new();
        for node in 0..self.settings.nodes {
            let text = std::fs::read_to_string(self.log(node)).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains("panicked at")) {
                found.push((node, line.to_string()));
            }
        }
        found
    }

    /// Stops every daemon (paused ones are woken first so they can die).
    pub fn stop_all(&mut self) {
        for node in 0..self.daemons.len() as u32 {
            self.signal(node, Signal::SIGCONT);
            if let Some(mut child) = self.daemons[node as usize].child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            self.daemons[node as usize].killed = true;
        }
    }

    /// Copies the daemons' logs to `dir` (kept after the run).
    pub fn keep_logs(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for node in 0..self.settings.nodes {
            std::fs::copy(self.log(node), dir.join(format!("node-{node}.log")))?;
        }
        Ok(())
    }
}

impl Drop for ChaosCluster {
    fn drop(&mut self) {
        self.stop_all();
        for mount in &self.mounts {
            // Lazy: nothing of this run uses it any more, whatever still has it open.
            let _ = Command::new("umount").arg("-l").arg(mount).status();
        }
        // The Redis servers (on the bridge's address), the namespaces next; the directory
        // with the TempDir.
        self.redis = None;
        self.netns = None;
    }
}
