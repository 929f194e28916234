//! A Redis Cluster of the run's own (`--directory redis-cluster`): six `redis-server`s, three
//! masters and three replicas, bound to the host's address on the namespaces' bridge so every
//! daemon reaches them, no persistence. The nemesis kills a master with SIGKILL (its replica
//! takes over) and restarts it later, when it rejoins as a replica. Every server is killed
//! when the cluster is dropped.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyriver_transport::process::die_with_parent;

/// Bound on the cluster's start, a failover and a restarted server's rejoining.
const CLUSTER_WAIT: Duration = Duration::from_secs(30);
/// How long a master may be silent before its replica takes over (ms).
const NODE_TIMEOUT_MS: u32 = 1000;
/// Masters (each with one replica).
pub const MASTERS: u32 = 3;

/// Why the cluster could not be started or changed.
#[derive(Debug, thiserror::Error)]
pub enum RedisClusterError {
    /// `redis-server` 7 or later and `redis-cli` are needed.
    #[error("--directory redis-cluster needs redis-server 7 or later and redis-cli: {0}")]
    NotInstalled(String),
    /// A server or `redis-cli` could not be run.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The cluster did not reach the state asked for in time.
    #[error("Redis Cluster: {0}")]
    State(String),
}

struct Server {
    port: u16,
    bus: u16,
    child: Option<Child>,
}

/// The run's Redis Cluster.
pub struct ChaosRedisCluster {
    addr: Ipv4Addr,
    dir: PathBuf,
    servers: Vec<Server>,
}

/// Whether `redis-server` is 7 or later (sharded pub/sub) and `redis-cli` runs.
pub fn installed() -> Result<(), RedisClusterError> {
    let version = Command::new("redis-server")
        .arg("--version")
        .output()
        .map_err(|_| RedisClusterError::NotInstalled("redis-server is not installed".into()))?;
    let text = String::from_utf8_lossy(&version.stdout).into_owned();
    let major = text
        .split("v=")
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if major < 7 {
        return Err(RedisClusterError::NotInstalled(format!(
            "redis-server {} is older than 7",
            text.trim()
        )));
    }
    Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_err(|_| RedisClusterError::NotInstalled("redis-cli is not installed".into()))?;
    Ok(())
}

/// A port of `addr` nothing listens on now.
fn free_port(addr: Ipv4Addr) -> Result<u16, RedisClusterError> {
    TcpListener::bind((addr, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| RedisClusterError::Io {
            what: format!("cannot find a free port on {addr}"),
            source,
        })
}

impl ChaosRedisCluster {
    /// Starts six servers on `addr` with their files under `dir`, makes them a cluster and
    /// waits until it is whole. Call from the thread that lives for the whole run (the
    /// servers die with it).
    pub fn start(addr: Ipv4Addr, dir: &Path) -> Result<Self, RedisClusterError> {
        installed()?;
        let mut cluster = Self {
            addr,
            dir: dir.to_path_buf(),
            servers: Vec::new(),
        };
        for _ in 0..MASTERS * 2 {
            let server = Server {
                port: free_port(addr)?,
                bus: free_port(addr)?,
                child: None,
            };
            cluster.servers.push(server);
            let index = cluster.servers.len() - 1;
            cluster.spawn(index)?;
        }
        let nodes: Vec<String> = cluster
            .servers
            .iter()
            .map(|s| format!("{addr}:{}", s.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| RedisClusterError::Io {
                what: "cannot run redis-cli --cluster create".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(RedisClusterError::State(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        cluster.wait_whole()?;
        Ok(cluster)
    }

    fn spawn(&mut self, index: usize) -> Result<(), RedisClusterError> {
        let (port, bus) = (self.servers[index].port, self.servers[index].bus);
        let dir = self.dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).map_err(|source| RedisClusterError::Io {
            what: format!("cannot create {}", dir.display()),
            source,
        })?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("redis.log"))
            .map_err(|source| RedisClusterError::Io {
                what: "cannot open the Redis log".into(),
                source,
            })?;
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string()])
            .args(["--cluster-port", &bus.to_string()])
            .args(["--bind", &self.addr.to_string()])
            .args(["--protected-mode", "no"])
            .args(["--cluster-enabled", "yes"])
            // Kept across a restart: the server rejoins with its identity, as a replica.
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            // A replica's first sync at once: until it is done it cannot take over.
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        die_with_parent(&mut command, nix::sys::signal::Signal::SIGKILL);
        let mut child = command.spawn().map_err(|source| RedisClusterError::Io {
            what: "cannot start redis-server".into(),
            source,
        })?;
        let deadline = Instant::now() + CLUSTER_WAIT;
        // Readiness of an outside process: a bounded poll is the only signal there is.
        while self.cli(port, &["PING"]).as_deref().map(str::trim) != Some("PONG") {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(RedisClusterError::State(format!(
                    "redis-server on port {port} exited at start ({status})"
                )));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RedisClusterError::State(format!(
                    "no redis-server on port {port} within {CLUSTER_WAIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.servers[index].child = Some(child);
        Ok(())
    }

    /// `redis-cluster://` with every server as a seed.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("{}:{}", self.addr, s.port))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }

    /// Ports of the running masters, in server order.
    fn master_ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|s| s.child.is_some())
            .filter(|s| {
                self.cli(s.port, &["ROLE"])
                    .is_some_and(|r| r.starts_with("master"))
            })
            .map(|s| s.port)
            .collect()
    }

    /// Kills the `pick % 3`th running master with SIGKILL and waits until its replica has
    /// taken over (the cluster is whole again without it); its port.
    pub fn kill_master(&mut self, pick: u32) -> Result<u16, RedisClusterError> {
        let masters = self.master_ports();
        if masters.is_empty() {
            return Err(RedisClusterError::State("no running master".into()));
        }
        let port = masters[pick as usize % masters.len()];
        if let Some(server) = self.servers.iter_mut().find(|s| s.port == port) {
            if let Some(mut child) = server.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.wait_whole()?;
        Ok(port)
    }

    /// Starts the server on `port` again (it rejoins as a replica of the master that took its
    /// place) and waits until the cluster is whole with it.
    pub fn restart(&mut self, port: u16) -> Result<(), RedisClusterError> {
        let Some(index) = self.servers.iter().position(|s| s.port == port) else {
            return Err(RedisClusterError::State(format!(
                "no server on port {port}"
            )));
        };
        if self.servers[index].child.is_none() {
            self.spawn(index)?;
        }
        self.wait_whole()
    }

    /// Waits until every running server reports `cluster_state:ok`, three masters run and
    /// every running replica is in sync with its master.
    fn wait_whole(&self) -> Result<(), RedisClusterError> {
        let deadline = Instant::now() + CLUSTER_WAIT;
        // Outside processes' state: a bounded poll is the only signal there is.
        loop {
            let whole = self.servers.iter().filter(|s| s.child.is_some()).all(|s| {
                self.cli(s.port, &["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
                    && self
                        .cli(s.port, &["INFO", "replication"])
                        .is_some_and(|info| {
                            info.contains("role:master") || info.contains("master_link_status:up")
                        })
            }) && self.master_ports().len() == MASTERS as usize;
            if whole {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(RedisClusterError::State(format!(
                    "not whole (cluster_state:ok, {MASTERS} masters, replicas in sync) within \
                     {CLUSTER_WAIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-cli -h ADDR -p PORT ARGS…`'s output, `None` if it failed.
    fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", &self.addr.to_string(), "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }
}

impl Drop for ChaosRedisCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(mut child) = server.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
