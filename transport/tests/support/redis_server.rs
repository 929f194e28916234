//! A private `redis-server` for tests: a free loopback port, no persistence, a temporary
//! directory; killed (and the directory removed) on drop, also when a test fails.
//!
//! Without `redis-server` on the PATH, [`RedisServer::start`] prints a skip line and returns
//! `None`, unless `SKYRIVER_REQUIRE_REDIS` is set (CI sets it): then it fails the test.

use std::io::Write;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on the server's start.
const START_WAIT: Duration = Duration::from_secs(10);

/// A `redis-server` child process on a loopback port.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after printing why) when `redis-server` is missing
    /// and not required.
    pub fn start(test: &str) -> Option<RedisServer> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            let required =
                std::env::var("SKYRIVER_REQUIRE_REDIS").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "SKYRIVER_REQUIRE_REDIS is set but redis-server is not installed \
                 (apt-get install redis-server, or ci/install-deps.sh)"
            );
            // Straight to stderr, past the test harness's capture, so the skip is visible.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: redis-server is not installed \
                 (set SKYRIVER_REQUIRE_REDIS=1 to make this a failure)"
            );
            return None;
        }
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().unwrap(),
        };
        server.restart();
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the server on its port and waits (bounded) until it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + START_WAIT;
        // Readiness of an external process: a bounded retry is the only signal there is.
        while StdStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the server and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
