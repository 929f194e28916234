//! A private Redis Cluster for tests: six `redis-server --cluster-enabled yes` on free loopback
//! ports (three masters, three replicas, created with `redis-cli --cluster create`), no
//! persistence, in one temporary directory; every server is killed (and the directory removed)
//! on drop, also when a test fails.
//!
//! Without `redis-server` (7 or later: sharded pub/sub) and `redis-cli` on the PATH,
//! [`RedisCluster::start`] reports a skip and returns `None`, unless `SKYRIVER_REQUIRE_REDIS`
//! is set (CI sets it): then it fails the test.

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on the cluster's start and on a failover.
const CLUSTER_WAIT: Duration = Duration::from_secs(30);
/// How long a master may be silent before its replica takes over (ms).
const NODE_TIMEOUT_MS: u32 = 1000;

/// One server of the cluster.
struct ClusterServer {
    port: u16,
    child: Option<Child>,
}

/// Three masters and three replicas on loopback ports.
pub struct RedisCluster {
    servers: Vec<ClusterServer>,
    dir: tempfile::TempDir,
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether `redis-server` is 7 or later and `redis-cli` runs.
fn installed() -> Result<(), String> {
    let version = Command::new("redis-server")
        .arg("--version")
        .output()
        .map_err(|_| "redis-server is not installed".to_string())?;
    let text = String::from_utf8_lossy(&version.stdout).into_owned();
    let major = text
        .split("v=")
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if major < 7 {
        return Err(format!(
            "redis-server {text:?} is older than 7 (no sharded pub/sub)"
        ));
    }
    Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_err(|_| "redis-cli is not installed".to_string())?;
    Ok(())
}

impl RedisCluster {
    /// Starts a cluster and waits until every node reports `cluster_state:ok`, or returns
    /// `None` (after printing why) when Redis is missing and not required.
    pub fn start(test: &str) -> Option<RedisCluster> {
        if let Err(reason) = installed() {
            crate::skip::skip(test, &crate::skip::REDIS, &reason);
            return None;
        }
        let mut cluster = RedisCluster {
            servers: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
        };
        for _ in 0..6 {
            let server = cluster.start_server();
            cluster.servers.push(server);
        }
        let nodes: Vec<String> = cluster
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok();
        Some(cluster)
    }

    /// Starts one server on free ports and waits until it answers. A port found free can be
    /// taken before the server binds it (by another test's server or an outgoing connection):
    /// a server that exits at start is started again on other ports.
    fn start_server(&self) -> ClusterServer {
        let deadline = Instant::now() + CLUSTER_WAIT;
        loop {
            let port = free_port();
            let bus = free_port();
            let dir = self.dir.path().join(port.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            let mut child = Command::new("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--cluster-port", &bus.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                // A replica's first sync at once (the default waits 5 s for more replicas);
                // until it is done the replica cannot take over.
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            // Readiness of an external process: a bounded poll is the only signal there is.
            loop {
                if cli(port, &["PING"]).is_some_and(|out| out.trim() == "PONG") {
                    return ClusterServer {
                        port,
                        child: Some(child),
                    };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break; // Exited (its port was taken): again on other ports.
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("Redis Cluster: no redis-server on port {port} within {CLUSTER_WAIT:?}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                Instant::now() < deadline,
                "Redis Cluster: no redis-server could start within {CLUSTER_WAIT:?}"
            );
        }
    }

    /// `redis-cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .filter(|s| s.child.is_some())
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }

    /// Ports of the running masters.
    pub fn master_ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|s| s.child.is_some())
            .filter(|s| cli(s.port, &["ROLE"]).is_some_and(|r| r.starts_with("master")))
            .map(|s| s.port)
            .collect()
    }

    /// The port of the master serving `key`'s slot.
    #[allow(dead_code)] // Not every test binary that shares this file kills a master.
    pub fn master_of(&self, key: &str) -> u16 {
        let running = self.servers.iter().find(|s| s.child.is_some()).unwrap();
        let slot: u16 = cli(running.port, &["CLUSTER", "KEYSLOT", key])
            .and_then(|s| s.trim().parse().ok())
            .expect("CLUSTER KEYSLOT answers");
        let serves = |port: u16| {
            cli(port, &["CLUSTER", "NODES"]).is_some_and(|nodes| {
                nodes
                    .lines()
                    .filter(|line| line.contains("myself") && line.contains("master"))
                    .flat_map(|line| line.split_whitespace().skip(8))
                    .any(|range| {
                        let (a, b) = range.split_once('-').unwrap_or((range, range));
                        matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
                    })
            })
        };
        self.master_ports()
            .into_iter()
            .find(|&port| serves(port))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Kills the server on `port` (a master: its replica takes over within the node timeout).
    #[allow(dead_code)]
    pub fn kill(&mut self, port: u16) {
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.port == port)
            .expect("a server of this cluster");
        if let Some(mut child) = server.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until every running node reports `cluster_state:ok`, there are three masters and
    /// every replica is in sync with its master (so it can take over).
    pub fn wait_ok(&self) {
        self.wait_for("cluster_state:ok on every node, replicas in sync", || {
            self.servers.iter().filter(|s| s.child.is_some()).all(|s| {
                cli(s.port, &["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
                    && cli(s.port, &["INFO", "replication"]).is_some_and(|info| {
                        info.contains("role:master") || info.contains("master_link_status:up")
                    })
            }) && self.master_ports().len() == 3
        });
    }

    fn wait_for(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + CLUSTER_WAIT;
        // Readiness of external processes: a bounded poll is the only signal there is.
        while !done() {
            assert!(
                Instant::now() < deadline,
                "Redis Cluster: no {what} within {CLUSTER_WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The port of the replica of the master on `port`.
    #[allow(dead_code)]
    pub fn replica_of(&self, master: u16) -> u16 {
        let info = cli(master, &["INFO", "replication"]).expect("INFO answers");
        info.lines()
            .find(|line| line.starts_with("slave0:"))
            .and_then(|line| line.split(',').find_map(|kv| kv.strip_prefix("port=")))
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("the master on port {master} has no replica: {info}"))
    }

    /// Stops (`SIGSTOP`) or resumes (`SIGCONT`) the server on `port`: a stopped replica
    /// receives nothing of what its master acknowledges meanwhile.
    #[allow(dead_code)]
    pub fn pause(&self, port: u16, paused: bool) {
        let server = self.servers.iter().find(|s| s.port == port).unwrap();
        let pid = server.child.as_ref().expect("running").id().to_string();
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// The keys matching `pattern` on the server at `port`.
    #[allow(dead_code)]
    pub fn keys(&self, port: u16, pattern: &str) -> Vec<String> {
        cli(port, &["--scan", "--pattern", pattern])
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The temporary directory (for logs).
    #[allow(dead_code)]
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// `redis-cli -p PORT ARGS…`'s output, `None` if it failed.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(mut child) = server.child.take() {
                // A stopped server dies of SIGKILL too; resuming first is not needed.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
