//! The metrics exporter (`--metrics ADDR`): `GET /metrics` in the OpenMetrics text format
//! (which Prometheus scrapes natively) and `GET /healthz` as JSON.
//!
//! It runs on a thread of its own, so parsing HTTP and encoding never run on the event loop's
//! thread. For each request it asks the loop for a [`Snapshot`] through a bounded channel; the
//! loop answers between two inputs with a copy of the node's counters (plain integers the loop
//! bumps as it goes, no atomics). A loop that does not answer in time makes `/healthz` fail.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde::Serialize;
use skyriver_core::node::{LatencyHistogram, NodeMetrics};
use skyriver_core::WaitQueue;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::{debug, info, warn};

/// Snapshot requests waiting for the loop; more scrapers than this wait for a free slot.
pub(super) const SNAPSHOT_QUEUE: usize = 4;
/// How long a request waits for the loop before the answer says it is stuck.
const LOOP_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP connections served at once.
const MAX_CONNECTIONS: usize = 32;
/// Time a client gets to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the loop hands the exporter.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The node's counters and gauges.
    pub node: NodeMetrics,
    /// The fabric in use (`none` alone).
    pub fabric: String,
    /// Live members the directory lists, this node included.
    pub members: usize,
    /// Members (other than this node) the fabric is connected to.
    pub connected_peers: usize,
    /// Items waiting in each channel into the loop, by name (see [`ChannelDepths`]).
    pub channels: ChannelDepths,
    /// Spill write and restore latencies (`--spill-dir`).
    pub spill_latency: SpillLatencies,
    /// The replication counters of the directory this daemon serves (the head only).
    pub head_replication: Option<skyriver_core::registry::ReplicationStats>,
}

/// How long the spill tier's writes and restores took, measured on its IO threads.
#[derive(Debug, Clone, Default)]
pub struct SpillLatencies {
    /// Spill writes.
    pub spill: LatencyHistogram,
    /// Restores (read and checksum).
    pub restore: LatencyHistogram,
}

/// How many items wait in each channel into the event loop, taken with the snapshot. What
/// happens when each is full, or why it needs no bound of its own type:
/// * `fabric_events` (a bounded channel, `skyriver_transport::fabric::EVENT_CHANNEL_CAPACITY`,
///   that nothing goes over): a TCP connection's tasks wait for a place, and meanwhile read
///   nothing from their socket, so the peer is slowed by TCP flow control; a READ the loop
///   posts takes the place of its completion at once, and is refused when none is free (the
///   loop fails it, `ReadError::Busy`, and the fetch moves on); the verbs poller, which can
///   neither wait nor refuse, holds what does not fit in a backlog bounded by the receive
///   slots its messages hold (`skyriver_transport::fabric::event_channel`).
/// * `directory_notices` (bounded, `skyriver_transport::directory::NOTICE_QUEUE`): the
///   directory client waits for a place and meanwhile reads nothing from its link (TCP
///   back-pressure to the head; Redis answers wait) and takes no request, so the request queue
///   fills and further directory requests are refused at once (`Unavailable`, which the core
///   retries or reports), never waited for.
/// * `commit_queue` (bounded, `max_unpersisted_changes`): never full; the core holds further
///   changes, and the client requests that would make them, until the disk catches up.
/// * `metrics_requests` (bounded, [`SNAPSHOT_QUEUE`]): a scraper waits for a free slot.
/// * `spill_completions` (bounded, [`crate::spill::COMPLETION_QUEUE`]): an IO thread waits for
///   a place and takes no job meanwhile; jobs then wait in the loop's backlog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelDepths {
    /// Fabric events not yet handled.
    pub fabric_events: u64,
    /// Directory notices not yet handled.
    pub directory_notices: u64,
    /// Durable changes handed to the committer and not reported durable.
    pub commit_queue: u64,
    /// Spill and restore completions not yet handled.
    pub spill_completions: u64,
}

/// A request for a snapshot, answered by the loop.
pub(super) type SnapshotRequest = oneshot::Sender<Snapshot>;

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The exporter's thread or runtime could not start.
    #[error("cannot start the metrics exporter: {0}")]
    Start(#[source] std::io::Error),
}

/// The running exporter; stops when dropped.
pub(super) struct MetricsServer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves on `listener` (from [`bind`]) on a thread of its own.
    pub(super) fn start(
        listener: std::net::TcpListener,
        requests: mpsc::Sender<SnapshotRequest>,
    ) -> Result<Self, MetricsError> {
        let bound = listener.local_addr().map_err(MetricsError::Start)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MetricsError::Start)?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let started = std::time::SystemTime::now();
        let thread = std::thread::Builder::new()
            .name("skyriver-metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            warn!(%error, "metrics exporter cannot use its socket");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = stop_rx => {}
                        _ = serve(listener, requests, started) => {}
                    }
                })
            })
            .map_err(MetricsError::Start)?;
        info!(addr = %bound, "metrics at http://{bound}/metrics, health at http://{bound}/healthz");
        Ok(Self {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

/// Binds the exporter's address: done first at start-up, so a taken or bad address fails
/// before the arena is made or the cluster joined.
pub(super) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, MetricsError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| MetricsError::Bind { addr, source })?;
    Ok(listener)
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    requests: mpsc::Sender<SnapshotRequest>,
    started: std::time::SystemTime,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let requests = requests.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let requests = requests.clone();
                async move { Ok::<_, Infallible>(answer(request, &requests, started).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                debug!(%peer, %error, "metrics connection ended");
            }
            drop(permit);
        });
    }
}

async fn answer(
    request: Request<Incoming>,
    requests: &mpsc::Sender<SnapshotRequest>,
    started: std::time::SystemTime,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match request.uri().path() {
        "/metrics" => match snapshot(requests).await {
            Some(snapshot) => match encode(snapshot, ProcessStats::read(started)) {
                Ok(text) => Response::builder()
                    .header(
                        hyper::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                    .body(Full::new(Bytes::from(text)))
                    .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding\n")),
                Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n"),
            },
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the daemon's event loop did not answer\n",
            ),
        },
        "/healthz" => {
            let health = Health::of(snapshot(requests).await.as_ref());
            let status = if health.status == "ready" {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let body = serde_json::to_string(&health).unwrap_or_else(|_| "{}".into()) + "\n";
            Response::builder()
                .status(status)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding\n"))
        }
        "/" => plain(StatusCode::OK, "skyriver daemon: /metrics /healthz\n"),
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /healthz\n",
        ),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

/// Asks the loop for a snapshot; `None` when it does not answer in time.
async fn snapshot(requests: &mpsc::Sender<SnapshotRequest>) -> Option<Snapshot> {
    let (tx, rx) = oneshot::channel();
    tokio::time::timeout(LOOP_ANSWER_TIMEOUT, async {
        requests.send(tx).await.ok()?;
        rx.await.ok()
    })
    .await
    .ok()
    .flatten()
}

/// The answer of `/healthz`.
#[derive(Debug, Serialize)]
pub struct Health {
    /// `ready`, `directory down`, `fabric down` or `event loop not responding`.
    pub status: &'static str,
    /// The node, when the loop answered.
    pub node: Option<u64>,
    /// Whether the directory answers.
    pub directory_healthy: Option<bool>,
    /// The fabric.
    pub fabric: Option<String>,
    /// Live members the directory lists.
    pub members: Option<usize>,
    /// Members the fabric is connected to.
    pub connected_peers: Option<usize>,
}

impl Health {
    fn of(snapshot: Option<&Snapshot>) -> Self {
        let Some(s) = snapshot else {
            return Self {
                status: "event loop not responding",
                node: None,
                directory_healthy: None,
                fabric: None,
                members: None,
                connected_peers: None,
            };
        };
        let status = if !s.node.directory_healthy {
            "directory down"
        } else if !s.node.standalone && s.members > 1 && s.connected_peers == 0 {
            // Other nodes are listed and none can be reached: fetches cannot work.
            "fabric down"
        } else {
            "ready"
        };
        Self {
            status,
            node: Some(s.node.node.0 as u64),
            directory_healthy: Some(s.node.directory_healthy),
            fabric: Some(s.fabric.clone()),
            members: Some(s.members),
            connected_peers: Some(s.connected_peers),
        }
    }
}

/// The standard process metrics, from `/proc/self` (zero where unreadable).
#[derive(Debug, Clone, Default)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    start_time_seconds: f64,
}

impl ProcessStats {
    fn read(started: std::time::SystemTime) -> Self {
        let mut stats = ProcessStats {
            start_time_seconds: started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            ..Default::default()
        };
        use nix::unistd::{sysconf, SysconfVar};
        let ticks = sysconf(SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100)
            .max(1) as f64;
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096)
            .max(1) as u64;
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name, which is in parentheses and may hold spaces.
            if let Some((_, rest)) = stat.rsplit_once(')') {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let field = |n: usize| fields.get(n).and_then(|f| f.parse::<u64>().ok());
                // utime and stime are fields 14 and 15 of the line (11 and 12 after the name).
                stats.cpu_seconds =
                    (field(11).unwrap_or(0) + field(12).unwrap_or(0)) as f64 / ticks;
                stats.virtual_bytes = field(20).unwrap_or(0);
                stats.resident_bytes = field(21).unwrap_or(0) * page;
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            stats.open_fds = entries.count() as u64;
        }
        if let Ok(limits) = std::fs::read_to_string("/proc/self/limits") {
            stats.max_fds = limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|soft| soft.parse().ok())
                .unwrap_or(0);
        }
        stats
    }
}

/// Encodes a snapshot in the OpenMetrics text format.
pub fn encode_snapshot(snapshot: Snapshot) -> Result<String, std::fmt::Error> {
    encode(snapshot, ProcessStats::default())
}

fn encode(snapshot: Snapshot, process: ProcessStats) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector { snapshot, process }));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

#[derive(Debug)]
struct SnapshotCollector {
    snapshot: Snapshot,
    process: ProcessStats,
}

type Labels = Vec<(Cow<'static, str>, Cow<'static, str>)>;

fn labels(pairs: &[(&'static str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (Cow::Borrowed(*k), Cow::Owned(v.clone())))
        .collect()
}

/// One value (or one labelled family of values) of a metric.
enum Value {
    Counter(u64),
    CounterF(f64),
    Gauge(i64),
    GaugeF(f64),
    Histogram(LatencyHistogram),
}

impl Value {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        match self {
            Value::Counter(v) => encoder.encode_counter::<NoLabelSet, _, u64>(v, None),
            Value::CounterF(v) => encoder.encode_counter::<NoLabelSet, _, f64>(v, None),
            Value::Gauge(v) => encoder.encode_gauge(v),
            Value::GaugeF(v) => encoder.encode_gauge(v),
            Value::Histogram(h) => encoder.encode_histogram::<NoLabelSet>(
                h.sum_nanos as f64 / 1e9,
                h.count,
                // Per bucket: the encoder sums them into the cumulative lines.
                &h.bucket_seconds(),
                None,
            ),
        }
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Value::Counter(_) | Value::CounterF(_) => MetricType::Counter,
            Value::Gauge(_) | Value::GaugeF(_) => MetricType::Gauge,
            Value::Histogram(_) => MetricType::Histogram,
        }
    }
}

/// A metric whose values all share a type: one unlabelled value, or one per label set.
struct Family {
    metric_type: MetricType,
    values: Vec<(Labels, Value)>,
}

impl EncodeMetric for Family {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        if let [(labels, value)] = &self.values[..] {
            if labels.is_empty() {
                return value.encode(encoder);
            }
        }
        for (labels, value) in &self.values {
            value.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.metric_type
    }
}

struct Out<'a, 'b> {
    encoder: &'a mut DescriptorEncoder<'b>,
}

impl Out<'_, '_> {
    /// Writes one metric. Counter names are given without `_total`: the encoder adds it.
    fn metric(&mut self, name: &str, help: &str, values: Vec<(Labels, Value)>) -> std::fmt::Result {
        let Some(first) = values.first() else {
            return Ok(());
        };
        let family = Family {
            metric_type: first.1.metric_type(),
            values,
        };
        let metric = self
            .encoder
            .encode_descriptor(name, help, None, family.metric_type())?;
        family.encode(metric)
    }

    fn one(&mut self, name: &str, help: &str, value: Value) -> std::fmt::Result {
        self.metric(name, help, vec![(Vec::new(), value)])
    }
}

fn gauge(v: u64) -> Value {
    Value::Gauge(i64::try_from(v).unwrap_or(i64::MAX))
}

impl prometheus_client::collector::Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.snapshot;
        let n = &s.node;
        let st = &n.store;
        let c = &n.counters;
        let mut out = Out {
            encoder: &mut encoder,
        };
        out.metric(
            "skyriver_node_info",
            "This daemon: its node id, fabric and version (always 1).",
            vec![(
                labels(&[
                    ("node", n.node.0.to_string()),
                    ("fabric", s.fabric.clone()),
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                ]),
                Value::Gauge(1),
            )],
        )?;
        // ---- store ----
        out.one(
            "skyriver_store_capacity_bytes",
            "Usable bytes of shared memory over all arenas.",
            gauge(st.capacity_bytes),
        )?;
        out.one(
            "skyriver_store_used_bytes",
            "Bytes allocated to objects (aligned blocks).",
            gauge(st.allocated_bytes),
        )?;
        out.one(
            "skyriver_store_pinned_bytes",
            "Bytes of objects pinned by transfers (rendezvous leases).",
            gauge(st.pinned_bytes),
        )?;
        out.one(
            "skyriver_store_evictable_bytes",
            "Bytes of sealed objects nobody holds: what eviction could free.",
            gauge(st.evictable_bytes),
        )?;
        out.metric(
            "skyriver_store_objects",
            "Objects in the store, by state.",
            vec![
                (
                    labels(&[("state", "sealed".into())]),
                    gauge(st.sealed_count),
                ),
                (
                    labels(&[("state", "unsealed".into())]),
                    gauge(st.object_count.saturating_sub(st.sealed_count)),
                ),
            ],
        )?;
        out.one(
            "skyriver_store_creates",
            "Objects created (by clients and by fetches).",
            Value::Counter(st.created_objects_total),
        )?;
        out.one(
            "skyriver_store_seals",
            "Objects sealed (by clients and by fetches).",
            Value::Counter(st.sealed_objects_total),
        )?;
        out.one(
            "skyriver_store_gets",
            "Objects asked for by client gets (one per id).",
            Value::Counter(st.get_requests_total),
        )?;
        out.one(
            "skyriver_store_deletes",
            "Objects named by client deletes (one per id).",
            Value::Counter(st.delete_requests_total),
        )?;
        out.one(
            "skyriver_store_evictions",
            "Objects evicted to make room.",
            Value::Counter(st.evicted_objects_total),
        )?;
        out.one(
            "skyriver_store_evicted_bytes",
            "Bytes freed by eviction.",
            Value::Counter(st.evicted_bytes_total),
        )?;
        out.one(
            "skyriver_store_out_of_memory",
            "Creates that found the store full with nothing left to evict.",
            Value::Counter(st.out_of_memory_total),
        )?;
        out.one(
            "skyriver_store_waiting_gets",
            "Client gets waiting for objects to be sealed.",
            gauge(st.waiting_gets),
        )?;
        out.one(
            "skyriver_client_connections",
            "Connected local clients.",
            gauge(st.client_count),
        )?;
        // ---- fetches and transfers ----
        let r = &c.fetch_results;
        out.metric(
            "skyriver_fetches",
            "Objects asked for by client fetches, by result (one per id).",
            vec![
                (labels(&[("result", "ok".into())]), Value::Counter(r.ok)),
                (
                    labels(&[("result", "not_found".into())]),
                    Value::Counter(r.not_found),
                ),
                (
                    labels(&[("result", "timeout".into())]),
                    Value::Counter(r.timeout),
                ),
                (
                    labels(&[("result", "error".into())]),
                    Value::Counter(r.error),
                ),
            ],
        )?;
        let t = &c.transfer_outcomes;
        let transfer = |mode: &str, result: &str, v: u64| {
            (
                labels(&[("mode", mode.to_string()), ("result", result.to_string())]),
                Value::Counter(v),
            )
        };
        out.metric(
            "skyriver_fetch_transfers",
            "Transfers from other nodes, by mode (eager, rendezvous; none: failed before the \
             holder answered) and result.",
            vec![
                transfer("eager", "ok", t.eager_ok),
                transfer("eager", "error", t.eager_failed),
                transfer("rendezvous", "ok", t.rendezvous_ok),
                transfer("rendezvous", "error", t.rendezvous_failed),
                transfer("none", "error", t.unanswered_failed),
            ],
        )?;
        out.metric(
            "skyriver_fetch_duration_seconds",
            "Time from a transfer's request to its object sealed here, by object size.",
            n.fetch_latency
                .iter()
                .map(|(class, h)| {
                    (
                        labels(&[("size", class.name().to_string())]),
                        Value::Histogram(h.clone()),
                    )
                })
                .collect(),
        )?;
        out.one(
            "skyriver_fetched_bytes",
            "Bytes brought in by completed transfers.",
            Value::Counter(c.bytes_fetched),
        )?;
        out.one(
            "skyriver_served_bytes",
            "Bytes served to other nodes (sent eagerly or exposed under a lease).",
            Value::Counter(c.bytes_served),
        )?;
        out.one(
            "skyriver_served_objects",
            "Objects served to other nodes, eagerly or by rendezvous.",
            Value::Counter(c.served_eager + c.served_rendezvous),
        )?;
        out.one(
            "skyriver_served_refusals",
            "Fetch requests from other nodes answered NotFound, Busy or Error.",
            Value::Counter(c.served_refused),
        )?;
        out.one(
            "skyriver_fetch_retries",
            "Failed transfers followed by another attempt (another holder or round).",
            Value::Counter(c.retries),
        )?;
        out.one(
            "skyriver_transfers_in_flight",
            "Transfers into this node in progress.",
            gauge(n.transfers_in_flight),
        )?;
        out.one(
            "skyriver_reads_in_flight",
            "RDMA READs (or their TCP equivalent) posted and not completed.",
            gauge(n.reads_in_flight),
        )?;
        out.one(
            "skyriver_bytes_in_flight",
            "Bytes of objects being fetched.",
            gauge(n.bytes_in_flight),
        )?;
        out.one(
            "skyriver_fetches_waiting",
            "Client fetch requests waiting.",
            gauge(n.fetches_waiting),
        )?;
        out.one(
            "skyriver_transfers_queued",
            "Objects waiting for memory or bytes in flight before their transfer starts.",
            gauge(n.transfers_queued),
        )?;
        out.one(
            "skyriver_requests_deferred",
            "Client requests held back until the disk catches up with the changes made.",
            gauge(n.requests_deferred),
        )?;
        out.one(
            "skyriver_changes_unpersisted",
            "Durable changes made and not yet reported durable by the disk.",
            gauge(n.changes_unpersisted),
        )?;
        out.metric(
            "skyriver_busy_refusals",
            "Requests refused because a waiting queue was at its cap, by queue.",
            WaitQueue::ALL
                .iter()
                .map(|&queue| {
                    (
                        labels(&[("queue", queue.name().to_string())]),
                        Value::Counter(c.busy_refusals.get(queue)),
                    )
                })
                .collect(),
        )?;
        let depth = |channel: &str, v: u64| (labels(&[("channel", channel.to_string())]), gauge(v));
        out.metric(
            "skyriver_channel_depth",
            "Items waiting in each channel into the event loop.",
            vec![
                depth("fabric_events", s.channels.fabric_events),
                depth("directory_notices", s.channels.directory_notices),
                depth("commit_queue", s.channels.commit_queue),
                depth("spill_completions", s.channels.spill_completions),
            ],
        )?;
        out.one(
            "skyriver_dials",
            "Connections this node dialed (the higher id of each pair dials).",
            Value::Counter(c.dials),
        )?;
        out.one(
            "skyriver_reads_posted",
            "READs posted.",
            Value::Counter(c.reads_posted),
        )?;
        out.one(
            "skyriver_leases_held",
            "Objects pinned for requesters (rendezvous leases held).",
            gauge(n.leases_held),
        )?;
        out.one(
            "skyriver_leases_granted",
            "Rendezvous leases granted.",
            Value::Counter(c.served_rendezvous),
        )?;
        out.one(
            "skyriver_lease_expiries",
            "Leases that ran out without the requester's Finish.",
            Value::Counter(c.leases_expired),
        )?;
        out.one(
            "skyriver_lease_extensions_asked",
            "Lease extensions this node asked of holders while its READs were progressing.",
            Value::Counter(c.lease_extensions_asked),
        )?;
        out.one(
            "skyriver_leases_extended",
            "Leases this node extended for requesters whose READs were progressing.",
            Value::Counter(c.leases_extended),
        )?;
        out.one(
            "skyriver_location_cache_hits",
            "Fetches that went straight to remembered holders.",
            Value::Counter(c.location_cache_hits),
        )?;
        out.one(
            "skyriver_stale_locations",
            "Remembered locations that proved wrong.",
            Value::Counter(c.stale_locations),
        )?;
        out.one(
            "skyriver_locations_learned",
            "Locations the directory pushed to this node (--learn-locations), remembered.",
            Value::Counter(c.locations_learned),
        )?;
        // ---- per peer ----
        let per_peer = |f: &dyn Fn(&skyriver_core::node::PeerMetrics) -> Value| {
            n.peers
                .iter()
                .map(|p| (labels(&[("peer", p.node.0.to_string())]), f(p)))
                .collect::<Vec<_>>()
        };
        out.metric(
            "skyriver_peer_connected",
            "Whether the fabric is connected to the peer (1) or not (0).",
            per_peer(&|p| Value::Gauge(p.connected as i64)),
        )?;
        out.metric(
            "skyriver_peer_eager_threshold_bytes",
            "Largest object fetched eagerly from the peer; above it, by rendezvous.",
            n.peers
                .iter()
                .filter_map(|p| {
                    p.eager_threshold_bytes
                        .map(|t| (labels(&[("peer", p.node.0.to_string())]), gauge(t)))
                })
                .collect(),
        )?;
        out.metric(
            "skyriver_peer_fetched_bytes",
            "Bytes fetched from the peer (completed transfers).",
            per_peer(&|p| Value::Counter(p.counters.bytes_fetched)),
        )?;
        out.metric(
            "skyriver_peer_fetched_objects",
            "Objects fetched from the peer (completed transfers).",
            per_peer(&|p| Value::Counter(p.counters.objects_fetched)),
        )?;
        out.metric(
            "skyriver_peer_served_bytes",
            "Bytes served to the peer.",
            per_peer(&|p| Value::Counter(p.counters.bytes_served)),
        )?;
        out.metric(
            "skyriver_peer_served_objects",
            "Objects served to the peer.",
            per_peer(&|p| Value::Counter(p.counters.objects_served)),
        )?;
        out.metric(
            "skyriver_peer_transfers_in_flight",
            "Transfers from the peer in progress.",
            per_peer(&|p| Value::Gauge(p.transfers_in_flight as i64)),
        )?;
        let mut errors = Vec::new();
        for p in &n.peers {
            let peer = p.node.0.to_string();
            for (kind, v) in [
                ("read", p.counters.read_errors),
                ("transfer", p.counters.transfer_errors),
                ("malformed_message", p.counters.malformed_messages),
                ("connection_lost", p.counters.connections_lost),
            ] {
                errors.push((
                    labels(&[("peer", peer.clone()), ("kind", kind.into())]),
                    Value::Counter(v),
                ));
            }
        }
        out.metric(
            "skyriver_fabric_errors",
            "Errors with a peer, by kind: read (a READ failed), transfer (a transfer from it \
             failed), malformed_message, connection_lost.",
            errors,
        )?;
        out.one(
            "skyriver_malformed_messages",
            "Messages from peers that did not decode.",
            Value::Counter(c.malformed_messages),
        )?;
        // ---- directory ----
        out.one(
            "skyriver_directory_up",
            "Whether the directory answers (1) or not (0).",
            Value::Gauge(n.directory_healthy as i64),
        )?;
        out.one(
            "skyriver_directory_request_duration_seconds",
            "Time from a directory request to its answer.",
            Value::Histogram(n.directory_latency.clone()),
        )?;
        out.one(
            "skyriver_directory_timeouts",
            "Directory requests that got no answer in time.",
            Value::Counter(c.directory_timeouts),
        )?;
        out.one(
            "skyriver_publications_dropped",
            "Directory publications abandoned after every retry.",
            Value::Counter(c.publications_dropped),
        )?;
        out.one(
            "skyriver_publications_skipped",
            "Fetched copies removed before their deferred publication was due (never published).",
            Value::Counter(c.publications_skipped),
        )?;
        out.one(
            "skyriver_id_conflicts",
            "Publications refused because live nodes hold the id with another content.",
            Value::Counter(c.id_conflicts),
        )?;
        out.one(
            "skyriver_digest_mismatches",
            "Fetched copies whose bytes did not hash to the id's digest (never sealed).",
            Value::Counter(c.digest_mismatches),
        )?;
        out.one(
            "skyriver_unanswered_release_failures",
            "Releases of dropped buffers (sent without a reply) that failed.",
            Value::Counter(c.unanswered_release_failures),
        )?;
        out.one(
            "skyriver_cluster_members",
            "Live nodes the directory lists, this one included.",
            gauge(s.members as u64),
        )?;
        // ---- replicas ----
        out.one(
            "skyriver_copies_of_record",
            "Copies of record on this node (pinned until deleted; see README, Replicas).",
            gauge(n.copies_of_record),
        )?;
        out.one(
            "skyriver_copies_of_record_placed",
            "Copies of record the directory placed here that were fetched and pinned.",
            Value::Counter(c.copies_of_record_placed),
        )?;
        out.one(
            "skyriver_replication_fetches_failed",
            "Fetches of copies placed here that failed (placed elsewhere by the directory).",
            Value::Counter(c.replication_fetches_failed),
        )?;
        out.one(
            "skyriver_replicas_declined_without_room",
            "Copies placed here declined before any fetch: no free range could hold them.",
            Value::Counter(c.replicas_declined_without_room),
        )?;
        out.one(
            "skyriver_replica_waits_timed_out",
            "Puts whose wait for their copies ran out (TooFewReplicas).",
            Value::Counter(c.replica_waits_timed_out),
        )?;
        // ---- hints ----
        out.one(
            "skyriver_hinted_fetches",
            "Object fetches sent straight to the node the caller named, skipping the lookup.",
            Value::Counter(c.hinted_fetches),
        )?;
        out.one(
            "skyriver_wrong_hints",
            "Hinted fetches whose node did not serve the object (they then asked the directory).",
            Value::Counter(c.wrong_hints),
        )?;
        out.one(
            "skyriver_coalesced_requests",
            "Fetch requests answered in one pass with an earlier request for the same object.",
            Value::Counter(c.coalesced_requests),
        )?;
        // ---- relays (broadcast through copies) ----
        out.one(
            "skyriver_relay_redirects",
            "Requests this holder sent to a relay (a requester receiving the object) instead of \
             serving them itself.",
            Value::Counter(c.relay_redirects),
        )?;
        out.one(
            "skyriver_relayed_reads",
            "Leases this node granted over a copy it was still receiving (READs served as a relay).",
            Value::Counter(c.relay_leases),
        )?;
        out.one(
            "skyriver_relayed_transfers",
            "Transfers this node pulled from a relay instead of the holder.",
            Value::Counter(c.relayed_transfers),
        )?;
        // ---- process ----
        let p = &self.process;
        out.one(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            Value::CounterF(p.cpu_seconds),
        )?;
        out.one(
            "process_resident_memory_bytes",
            "Resident memory size in bytes (includes mapped store memory touched).",
            gauge(p.resident_bytes),
        )?;
        out.one(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            gauge(p.virtual_bytes),
        )?;
        out.one(
            "process_open_fds",
            "Number of open file descriptors.",
            gauge(p.open_fds),
        )?;
        out.one(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            gauge(p.max_fds),
        )?;
        out.one(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds.",
            Value::GaugeF(p.start_time_seconds),
        )?;
        // ---- spill tier ----
        let sp = &st.spill;
        out.one(
            "skyriver_spill_limit_bytes",
            "Bytes the spill tier may hold (0: no spill tier).",
            gauge(sp.limit_bytes),
        )?;
        out.one(
            "skyriver_spilled_objects",
            "Objects on disk only (spilled, present, published).",
            gauge(sp.spilled_objects),
        )?;
        out.one(
            "skyriver_spilled_bytes",
            "Bytes of the objects on disk only.",
            gauge(sp.spilled_bytes),
        )?;
        out.one(
            "skyriver_spilling_bytes",
            "Bytes being written to the spill tier (still in memory).",
            gauge(sp.spilling_bytes),
        )?;
        out.one(
            "skyriver_restores_in_flight",
            "Restores from the spill tier in progress.",
            gauge(sp.restores_in_flight),
        )?;
        out.one(
            "skyriver_restores_queued",
            "Restores from the spill tier waiting for memory.",
            gauge(sp.restores_queued),
        )?;
        out.one(
            "skyriver_spills",
            "Spill writes completed.",
            Value::Counter(sp.spills_total),
        )?;
        out.one(
            "skyriver_spill_written_bytes",
            "Bytes written by completed spills.",
            Value::Counter(sp.spilled_bytes_total),
        )?;
        out.one(
            "skyriver_restores",
            "Restores completed.",
            Value::Counter(sp.restores_total),
        )?;
        out.one(
            "skyriver_restored_bytes",
            "Bytes read back by completed restores.",
            Value::Counter(sp.restored_bytes_total),
        )?;
        out.metric(
            "skyriver_spill_failures",
            "Spill tier failures, by kind: no_space and io (writes; the store evicts until \
             space is given back), lost (restores whose record was missing or damaged).",
            vec![
                (
                    labels(&[("kind", "no_space".into())]),
                    Value::Counter(sp.spill_no_space_total),
                ),
                (
                    labels(&[("kind", "io".into())]),
                    Value::Counter(sp.spill_errors_total),
                ),
                (
                    labels(&[("kind", "lost".into())]),
                    Value::Counter(sp.objects_lost_total),
                ),
            ],
        )?;
        out.one(
            "skyriver_spill_full_evictions",
            "Objects evicted because the spill tier could not take them.",
            Value::Counter(sp.evicted_spill_full_total),
        )?;
        out.one(
            "skyriver_spill_reopen_tries",
            "Writes tried again by a spill tier closed by a failed write.",
            Value::Counter(sp.reopen_tries_total),
        )?;
        out.one(
            "skyriver_spill_restore_read_retries",
            "Restore reads tried again after an IO error.",
            Value::Counter(sp.restore_read_retries_total),
        )?;
        out.one(
            "skyriver_spill_write_duration_seconds",
            "Time of a spill write on the IO threads.",
            Value::Histogram(s.spill_latency.spill.clone()),
        )?;
        out.one(
            "skyriver_restore_duration_seconds",
            "Time of a restore (read and checksum) on the IO threads.",
            Value::Histogram(s.spill_latency.restore.clone()),
        )?;
        out.one(
            "skyriver_spill_lost_at_start",
            "Spilled objects of a persistent store lost at start (their spill record missing or damaged, or not taken back); each is logged and cleared from the index.",
            Value::Counter(sp.lost_at_start_total),
        )?;
        if let Some(r) = &s.head_replication {
            encode_head_replication(&mut out, r)?;
        }
        Ok(())
    }
}

/// The replication counters of the directory a head serves (refreshed every second).
fn encode_head_replication(
    out: &mut Out<'_, '_>,
    r: &skyriver_core::registry::ReplicationStats,
) -> std::fmt::Result {
    out.one(
        "skyriver_head_replicated_objects",
        "Objects with a replica record at the head.",
        gauge(r.replicated_objects),
    )?;
    out.one(
        "skyriver_head_under_replicated_objects",
        "Objects with fewer live copies of record than they want.",
        gauge(r.under_replicated_objects),
    )?;
    out.one(
        "skyriver_head_repairs_queued",
        "Under-replicated objects waiting for the repair rate to place their copies.",
        gauge(r.repairs_queued),
    )?;
    out.one(
        "skyriver_head_copies_placed",
        "Copies the head placed for puts.",
        Value::Counter(r.copies_placed),
    )?;
    out.one(
        "skyriver_head_repairs",
        "Copies the head placed to repair objects below their copies.",
        Value::Counter(r.repairs_started),
    )?;
    out.one(
        "skyriver_head_repair_bytes",
        "Object bytes of the repairs placed.",
        Value::Counter(r.repair_bytes),
    )?;
    out.one(
        "skyriver_head_replica_targets_timed_out",
        "Nodes asked for a copy that did not publish it in time (placed elsewhere).",
        Value::Counter(r.targets_timed_out),
    )?;
    out.one(
        "skyriver_head_replicated_objects_lost",
        "Objects with a replica record whose every holder died.",
        Value::Counter(r.objects_lost),
    )?;
    out.one(
        "skyriver_head_surplus_copies",
        "Copies of record told they are surplus (a returning holder of an object repaired meanwhile); they stay as plain copies.",
        Value::Counter(r.surplus_copies),
    )?;
    out.one(
        "skyriver_head_replica_targets_declined",
        "Nodes asked for a copy that declined it (no room, a failed fetch; placed elsewhere at once).",
        Value::Counter(r.targets_declined),
    )?;
    out.one(
        "skyriver_head_tombstones",
        "Deleted objects whose tombstone the head keeps (a stale copy published again is deleted).",
        gauge(r.tombstones),
    )?;
    out.one(
        "skyriver_head_tombstones_dropped",
        "Tombstones dropped early because the most the head keeps were kept.",
        Value::Counter(r.tombstones_dropped),
    )?;
    out.one(
        "skyriver_head_deletes_repeated",
        "Publications of deleted content answered with a delete.",
        Value::Counter(r.deletes_repeated),
    )
}
