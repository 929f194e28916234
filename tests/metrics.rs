//! `--metrics`: a real Prometheus server scrapes two daemons and its numbers equal what the
//! workload did; `/metrics` parses as OpenMetrics text; `/healthz` flips when the directory
//! goes down.
//!
//! Prometheus (Debian's `prometheus` package) and a text-format parser (Python's
//! `prometheus_client`, else `promtool`) are optional locally: without them the tests print a
//! SKIPPED line, unless `SKYRIVER_REQUIRE_PROMETHEUS` is set (CI), when they fail.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ObjectId, TransferMode};

fn skip(test: &str, why: &str) {
    common::skip::skip(test, &common::skip::PROMETHEUS, why);
}

use common::http_get;

/// The value of one sample (`name` or `name{labels}`, exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    common::metric_sample(text, series)
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server of the test's own: free loopback port, temporary config and storage,
/// killed (and its directory removed) on drop, also when the test fails.
struct Prometheus {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(test: &str, targets: &[SocketAddr]) -> Option<Self> {
        if Command::new("prometheus")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            skip(test, "prometheus is not installed");
            return None;
        }
        let dir = common::test_dir();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: skyriver\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write the config");
        let port = skyriver::up::free_loopback_port().expect("a free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("prometheus starts");
        let prometheus = Self {
            child: Some(child),
            addr,
            dir,
        };
        let started = Instant::now();
        while !matches!(http_get(addr, "/-/ready"), Ok((200, _))) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "prometheus did not become ready; its log:\n{}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(prometheus)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The value of an instant query that yields one series; `None` while it yields none.
    fn query(&self, promql: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let (status, body) = http_get(self.addr, &path).ok()?;
        if status != 200 {
            return None;
        }
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = json["data"]["result"].as_array()?;
        if result.len() != 1 {
            return None;
        }
        result[0]["value"][1].as_str()?.parse().ok()
    }

    /// Waits (up to 30 s: a few scrapes) until `promql` equals `expected`.
    fn expect(&self, promql: &str, expected: f64) {
        let started = Instant::now();
        let mut last = None;
        while started.elapsed() < Duration::from_secs(30) {
            last = self.query(promql);
            if last == Some(expected) {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "prometheus: {promql} is {last:?}, expected {expected}; its log:\n{}",
            self.log()
        );
    }
}

impl Prometheus {
    /// Waits (up to 30 s) until `promql` yields one series, and returns its value.
    fn wait_for(&self, promql: &str) -> f64 {
        let started = Instant::now();
        loop {
            if let Some(value) = self.query(promql) {
                return value;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "prometheus: {promql} yields nothing; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn cluster(
    nodes: u32,
    memory: &str,
    directory: Option<String>,
) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let mut args = UpArgs::new(
        nodes,
        memory.parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    args.metrics = true;
    args.directory = directory;
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

const EAGER_OBJECTS: u64 = 5;
const EAGER_BYTES: usize = 1000;
const RENDEZVOUS_OBJECTS: u64 = 3;
const RENDEZVOUS_BYTES: usize = 1 << 20;
const METADATA: &[u8] = b"meta";

/// What the workload did, to compare with what Prometheus says.
struct Workload {
    fetched_bytes: u64,
    gets: u64,
    deletes: u64,
    evictions: u64,
}

/// Puts on node 0, fetches (eager and rendezvous) and a missing fetch on node 1, gets and
/// deletes on node 0, then fills node 1 until it evicts.
fn workload(cluster: &LocalCluster) -> Workload {
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    let mut fetched_bytes = 0;
    let timeout = Some(Duration::from_secs(30));
    for n in 0..EAGER_OBJECTS + RENDEZVOUS_OBJECTS {
        let id = ObjectId::from_u64(100 + n);
        let (size, mode) = if n < EAGER_OBJECTS {
            (EAGER_BYTES, TransferMode::Eager)
        } else {
            (RENDEZVOUS_BYTES, TransferMode::Rendezvous)
        };
        holder
            .create_and_seal(id, &vec![n as u8; size], METADATA)
            .unwrap();
        let object = requester.fetch_one_in_mode(id, timeout, mode).unwrap();
        assert_eq!(object.data().len(), size);
        fetched_bytes += (size + METADATA.len()) as u64;
    }
    // Nobody holds this one: one fetch ends not_found.
    let missing = requester
        .fetch(&[ObjectId::from_u64(999)], timeout)
        .unwrap();
    assert!(missing[0].is_err());
    // Gets and deletes on the holder.
    let ids: Vec<ObjectId> = (100..103).map(ObjectId::from_u64).collect();
    let got = holder.get(&ids, Some(Duration::ZERO)).unwrap();
    assert!(got.iter().all(|r| r.is_ok()));
    drop(got);
    let deleted = holder.delete(&ids[..2]).unwrap();
    assert!(deleted.iter().all(|r| r.is_ok()), "{deleted:?}");
    // Fill the requester (64 MiB) with 8 MiB objects nobody holds: older ones are evicted.
    for n in 0..12 {
        requester
            .create_and_seal(ObjectId::from_u64(500 + n), &vec![7; 8 << 20], b"")
            .unwrap();
    }
    let evictions = requester.stats().unwrap().evicted_objects_total;
    assert!(evictions > 0, "the workload must evict");
    Workload {
        fetched_bytes,
        gets: ids.len() as u64,
        deletes: 2,
        evictions,
    }
}

#[test]
fn prometheus_scrapes_two_daemons_and_counts_the_workload() {
    let test = "prometheus_scrapes_two_daemons_and_counts_the_workload";
    let (_dir, cluster) = cluster(2, "64MiB", None);
    let Some(prometheus) = Prometheus::start(test, &cluster.metrics) else {
        return;
    };
    let done = workload(&cluster);
    let node = |n: usize| format!("instance=\"{}\"", cluster.metrics[n]);
    let (holder, requester) = (node(0), node(1));
    prometheus.expect("count(up{job=\"skyriver\"} == 1)", 2.0);
    prometheus.expect(
        &format!("skyriver_fetch_transfers_total{{{requester},mode=\"eager\",result=\"ok\"}}"),
        EAGER_OBJECTS as f64,
    );
    prometheus.expect(
        &format!("skyriver_fetch_transfers_total{{{requester},mode=\"rendezvous\",result=\"ok\"}}"),
        RENDEZVOUS_OBJECTS as f64,
    );
    prometheus.expect(
        &format!("skyriver_fetches_total{{{requester},result=\"ok\"}}"),
        (EAGER_OBJECTS + RENDEZVOUS_OBJECTS) as f64,
    );
    prometheus.expect(
        &format!("skyriver_fetches_total{{{requester},result=\"not_found\"}}"),
        1.0,
    );
    prometheus.expect(
        &format!("skyriver_fetched_bytes_total{{{requester}}}"),
        done.fetched_bytes as f64,
    );
    prometheus.expect(
        &format!("skyriver_peer_fetched_bytes_total{{{requester},peer=\"0\"}}"),
        done.fetched_bytes as f64,
    );
    prometheus.expect(
        &format!("skyriver_served_bytes_total{{{holder}}}"),
        done.fetched_bytes as f64,
    );
    prometheus.expect(
        &format!("skyriver_peer_served_bytes_total{{{holder},peer=\"1\"}}"),
        done.fetched_bytes as f64,
    );
    prometheus.expect(
        &format!("skyriver_leases_granted_total{{{holder}}}"),
        RENDEZVOUS_OBJECTS as f64,
    );
    prometheus.expect(
        &format!("skyriver_fetch_duration_seconds_count{{{requester},size=\"lt_64KiB\"}}"),
        EAGER_OBJECTS as f64,
    );
    prometheus.expect(
        &format!("skyriver_fetch_duration_seconds_count{{{requester},size=\"64KiB_to_4MiB\"}}"),
        RENDEZVOUS_OBJECTS as f64,
    );
    prometheus.expect(
        &format!("skyriver_store_gets_total{{{holder}}}"),
        done.gets as f64,
    );
    prometheus.expect(
        &format!("skyriver_store_deletes_total{{{holder}}}"),
        done.deletes as f64,
    );
    prometheus.expect(
        &format!("skyriver_store_evictions_total{{{requester}}}"),
        done.evictions as f64,
    );
    prometheus.expect(
        &format!("skyriver_store_creates_total{{{holder}}}"),
        (EAGER_OBJECTS + RENDEZVOUS_OBJECTS) as f64,
    );
    prometheus.expect(
        &format!("sum(skyriver_fabric_errors_total{{{requester}}})"),
        0.0,
    );
    prometheus.expect(&format!("skyriver_directory_up{{{holder}}}"), 1.0);
    prometheus.expect(&format!("skyriver_leases_held{{{holder}}}"), 0.0);
    let fds = prometheus.wait_for(&format!("process_open_fds{{{holder}}}"));
    assert!(fds > 0.0, "process_open_fds is {fds}");
    dashboard_queries_run_and_name_exported_metrics(&prometheus, &cluster);
}

/// Every query of `deploy/monitoring/grafana-dashboard.json` (its variables set as "All" sets
/// them) is one this Prometheus evaluates, and every `skyriver_` metric it names is one the
/// daemons export (node 0 serves the directory, so the head's own metrics are there too): a
/// panel cannot stay empty for a misspelt or renamed metric.
fn dashboard_queries_run_and_name_exported_metrics(
    prometheus: &Prometheus,
    cluster: &LocalCluster,
) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard")).unwrap();
    let exported: String = cluster
        .metrics
        .iter()
        .map(|&addr| http_get(addr, "/metrics").expect("a scrape").1)
        .collect();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a PromQL expression");
            let promql = expr.replace("$job", ".*").replace("$instance", ".*");
            let (status, body) = http_get(
                prometheus.addr,
                &format!("/api/v1/query?query={}", percent_encode(&promql)),
            )
            .expect("prometheus answers");
            assert_eq!(
                status, 200,
                "panel {:?}: prometheus refuses {promql}: {body}",
                panel["title"]
            );
            for name in metric_names(expr) {
                let family = |line: &str| {
                    line.strip_prefix("# TYPE ")
                        .and_then(|rest| rest.split_whitespace().next())
                        .is_some_and(|exported| {
                            name == exported
                                || ["_total", "_bucket", "_sum", "_count"]
                                    .iter()
                                    .any(|suffix| name.strip_suffix(suffix) == Some(exported))
                        })
                };
                assert!(
                    exported.lines().any(family),
                    "panel {:?} names {name}, which no daemon exports",
                    panel["title"]
                );
            }
            queries += 1;
        }
    }
    assert!(queries >= 40, "only {queries} queries in the dashboard");
}

/// The `skyriver_…` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("skyriver_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(&tail[..end]);
        rest = &tail[end..];
    }
    names
}

/// Checks `text` with a Prometheus text-format parser: Python's `prometheus_client`
/// OpenMetrics parser, else promtool. `Err` names the parser's complaint; `Ok(None)` when no
/// parser is installed.
fn parse_with_a_real_parser(text: &str) -> Result<Option<&'static str>, String> {
    let python = std::env::var("SKYRIVER_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_python_parser = Command::new(&python)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let run = |mut command: Command| -> Result<std::process::Output, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
        child.wait_with_output().map_err(|e| e.to_string())
    };
    if has_python_parser {
        let mut command = Command::new(&python);
        command.args([
            "-c",
            "import sys\n\
             from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
             families = list(text_string_to_metric_families(sys.stdin.read()))\n\
             assert any(f.name == 'skyriver_store_creates' and f.type == 'counter' for f in families)\n\
             assert any(f.type == 'histogram' for f in families)\n\
             print(len(families))\n",
        ]);
        let output = run(command)?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        return Ok(Some("prometheus_client"));
    }
    if Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
    {
        let mut command = Command::new("promtool");
        command.args(["check", "metrics"]);
        let output = run(command)?;
        let complaints = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        // Exit 3 is lint advice only: promtool reads the Prometheus 0.0.4 format, where an
        // OpenMetrics counter's family name (without `_total`) looks like it has no HELP.
        // Anything it cannot parse exits 1.
        return match output.status.code() {
            Some(0) | Some(3) if !complaints.contains("parsing error") => Ok(Some("promtool")),
            _ => Err(complaints),
        };
    }
    Ok(None)
}

#[test]
fn metrics_parse_and_healthz_flips_when_the_directory_goes_down() {
    let test = "metrics_parse_and_healthz_flips_when_the_directory_goes_down";
    let Some(mut redis) = common::RedisServer::start(test) else {
        return;
    };
    let (_dir, cluster) = cluster(1, "64MiB", Some(redis.url()));
    let addr = cluster.metrics[0];
    let client = Client::connect(&cluster.sockets[0]).unwrap();
    client
        .create_and_seal(ObjectId::from_u64(1), b"hello", b"")
        .unwrap();
    let (status, text) = http_get(addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert_eq!(sample(&text, "skyriver_store_creates_total"), Some(1.0));
    assert_eq!(sample(&text, "skyriver_directory_up"), Some(1.0));
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    match parse_with_a_real_parser(&text) {
        Ok(Some(parser)) => eprintln!("/metrics parsed with {parser}"),
        Ok(None) => skip(
            test,
            "neither python3 with prometheus_client nor promtool is installed; parse not checked",
        ),
        Err(complaint) => panic!("/metrics does not parse: {complaint}\n{text}"),
    }
    let (status, body) = http_get(addr, "/healthz").unwrap();
    assert_eq!(status, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "ready");
    assert_eq!(http_get(addr, "/nothing").unwrap().0, 404);

    redis.stop();
    let started = Instant::now();
    loop {
        let (status, body) = http_get(addr, "/healthz").unwrap();
        if status == 503 {
            let health: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(health["status"], "directory down", "{body}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "/healthz still says {status} {body} with the directory down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, text) = http_get(addr, "/metrics").unwrap();
    assert_eq!(sample(&text, "skyriver_directory_up"), Some(0.0));
}

#[test]
fn a_bad_metrics_address_fails_the_start() {
    let dir = common::test_dir();
    let (ok, _, stderr) = common::cli(
        &dir.path().join("s.sock"),
        &["daemon", "-m", "32MiB", "--metrics", "not-an-address"],
        None,
    );
    assert!(!ok);
    assert!(stderr.contains("not an address"), "{stderr}");
    // A taken port fails the start at once, before the arena is made, and leaves no socket.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let socket = dir.path().join("s.sock");
    let (ok, _, stderr) = common::cli(
        &socket,
        &["daemon", "-m", "32MiB", "--metrics", &addr],
        None,
    );
    assert!(!ok);
    assert!(stderr.contains("cannot listen for metrics"), "{stderr}");
    assert!(!socket.exists());
}
