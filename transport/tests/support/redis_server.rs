//! A private `redis-server` for tests: a free loopback port, no persistence, a temporary
//! directory; killed (and the directory removed) on drop, also when a test fails.
//!
//! Without `redis-server` on the PATH, [`RedisServer::start`] reports a skip and returns
//! `None`, unless `SKYRIVER_REQUIRE_REDIS` is set (CI sets it): then it fails the test.

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
    password: Option<String>,
    /// Serves TLS only, with a certificate for 127.0.0.1 signed by `ca.crt` in `dir`.
    tls: bool,
    /// More configuration on the command line (`--directive arg…`), at every (re)start.
    config: Vec<String>,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after printing why) when `redis-server` is missing
    /// and not required.
    #[allow(dead_code)] // Not every test binary that shares this file starts it plain.
    pub fn start(test: &str) -> Option<RedisServer> {
        Self::start_with(test, None, false)
    }

    /// As [`RedisServer::start`], requiring `password` (`requirepass`) and/or serving TLS only
    /// with a test CA made here (`ca_file`).
    #[allow(dead_code)]
    pub fn start_with(test: &str, password: Option<&str>, tls: bool) -> Option<RedisServer> {
        Self::start_configured(test, password, tls, Vec::new())
    }

    /// As [`RedisServer::start`], with `config` (`--directive`, its arguments, …) on the
    /// command line at every (re)start: what a restart must not forget, such as ACL users.
    #[allow(dead_code)] // Not every test binary that shares this file configures more.
    pub fn start_with_config(test: &str, config: Vec<String>) -> Option<RedisServer> {
        Self::start_configured(test, None, false, config)
    }

    fn start_configured(
        test: &str,
        password: Option<&str>,
        tls: bool,
        config: Vec<String>,
    ) -> Option<RedisServer> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            crate::skip::skip(test, &crate::skip::REDIS, "redis-server is not installed");
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
            password: password.map(str::to_string),
            tls,
            config,
        };
        if tls {
            server.make_test_ca();
        }
        server.restart();
        Some(server)
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.password {
            Some(password) => format!("{scheme}://:{password}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// The test CA's certificate (PEM), with `tls`.
    #[allow(dead_code)] // Not every test binary that shares this file serves TLS.
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A CA and a server certificate for 127.0.0.1 it signed, made with the openssl tool.
    fn make_test_ca(&self) {
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(self.dir.path())
                .output()
                .expect("the openssl tool runs (apt-get install openssl)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=skyriver test CA",
            ][..],
        ]
        .concat());
        run(&[
            &["req"][..],
            &ec[..],
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ][..],
        ]
        .concat());
        std::fs::write(
            self.dir.path().join("san.ext"),
            "subjectAltName=IP:127.0.0.1\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
    }

    /// (Re)starts the server on its port and waits (bounded) until it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut command = Command::new("redis-server");
        if self.tls {
            command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args([
                    "--tls-cert-file",
                    "server.crt",
                    "--tls-key-file",
                    "server.key",
                ])
                .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
                .current_dir(self.dir.path());
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.config)
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

    /// The port it listens on.
    #[allow(dead_code)]
    pub fn port(&self) -> u16 {
        self.port
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
