//! `skyriver top`: a live view of one daemon or several (`--socket` repeated, e.g. every node
//! of a `skyriver up` cluster), refreshed each interval, like `htop` or `redis-cli --stat`.
//! For each daemon: a memory bar, operations per second, fetch throughput in and out, work in
//! flight, and a table of every node the directory lists with the traffic and errors this
//! daemon counts for it. `q` (or Ctrl-C) quits; `--once` prints one frame, `--json` one JSON
//! document. It reads the daemon's `Metrics` and `Nodes` requests, never scraped text.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use skyriver_core::client_protocol::ClusterView;
use skyriver_core::node::NodeMetrics;
use skyriver_core::store::SpillStats;

use skyriver_client::Client;
use skyriver_daemon::size::format_bytes;

/// Options of `skyriver top`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// A daemon's Unix socket; repeat it to watch several daemons [default: $SKYRIVER_SOCKET
    /// or /tmp/skyriver-<uid>/skyriver.sock]
    #[arg(long = "socket", short = 's')]
    pub sockets: Vec<PathBuf>,
    /// Print one frame (rates over one interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: print one JSON document instead of the text frame.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Time between frames, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
}

/// Why `top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// The terminal could not be set up or written.
    #[error("terminal: {0}")]
    Terminal(#[source] std::io::Error),
    /// No daemon answered.
    #[error("no daemon answered: {0}")]
    Unreachable(String),
    /// The JSON document could not be written.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// One daemon at one instant.
struct Sample {
    at: Instant,
    metrics: NodeMetrics,
    view: Option<ClusterView>,
}

/// What a frame shows of one daemon: its sample and rates since the previous one.
#[derive(Debug, Serialize)]
pub struct NodeFrame {
    /// The socket asked.
    pub socket: PathBuf,
    /// Why the daemon did not answer, when it did not.
    pub error: Option<String>,
    /// Its counters.
    pub metrics: Option<NodeMetrics>,
    /// Its view of the cluster.
    pub cluster: Option<ClusterView>,
    /// Rates over the last interval.
    pub rates: Rates,
    /// One row per node the directory lists (and per peer counted), this node excluded.
    pub peers: Vec<PeerRow>,
}

/// Per-second rates of one daemon.
#[derive(Debug, Default, Serialize)]
pub struct Rates {
    /// Seconds the rates are over (0 on the first frame).
    pub interval_seconds: f64,
    /// Objects created per second.
    pub creates_per_second: f64,
    /// Objects asked for by gets per second.
    pub gets_per_second: f64,
    /// Objects asked for by fetches per second.
    pub fetches_per_second: f64,
    /// Objects evicted per second.
    pub evictions_per_second: f64,
    /// Bytes fetched from other nodes per second.
    pub fetched_bytes_per_second: f64,
    /// Bytes served to other nodes per second.
    pub served_bytes_per_second: f64,
    /// Objects written to the spill tier per second.
    pub spills_per_second: f64,
    /// Bytes written to the spill tier per second.
    pub spilled_bytes_per_second: f64,
    /// Objects restored from the spill tier per second.
    pub restores_per_second: f64,
    /// Bytes restored from the spill tier per second.
    pub restored_bytes_per_second: f64,
}

/// One peer of a daemon.
#[derive(Debug, Serialize)]
pub struct PeerRow {
    /// The peer.
    pub node: u32,
    /// Its fabric address, when the directory lists it.
    pub address: Option<String>,
    /// Whether this daemon's fabric is connected to it.
    pub connected: bool,
    /// Eager threshold for fetches from it.
    pub eager_threshold_bytes: Option<u64>,
    /// Bytes per second fetched from it.
    pub in_bytes_per_second: f64,
    /// Bytes per second served to it.
    pub out_bytes_per_second: f64,
    /// Bytes fetched from it in total.
    pub fetched_bytes: u64,
    /// Bytes served to it in total.
    pub served_bytes: u64,
    /// Errors with it (READs, transfers, malformed messages, connections lost).
    pub errors: u64,
}

/// Runs `skyriver top`.
pub fn run(args: &TopArgs) -> Result<(), TopError> {
    let sockets = if args.sockets.is_empty() {
        vec![skyriver_client::default_socket_path()]
    } else {
        args.sockets.clone()
    };
    let interval = Duration::from_millis(args.interval_ms);
    let mut watcher = Watcher::new(sockets);
    if args.once {
        watcher.sample();
        std::thread::sleep(interval);
        let frames = watcher.sample();
        if frames.iter().all(|f| f.error.is_some()) {
            let errors: Vec<String> = frames.iter().filter_map(|f| f.error.clone()).collect();
            return Err(TopError::Unreachable(errors.join("; ")));
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "nodes": frames }))?;
            writeln!(out).map_err(TopError::Terminal)?;
        } else {
            out.write_all(render(&frames, None).as_bytes())
                .map_err(TopError::Terminal)?;
        }
        return Ok(());
    }
    live(&mut watcher, interval)
}

/// The full-screen loop: redraw each interval, quit on `q`, `Esc` or Ctrl-C.
fn live(watcher: &mut Watcher, interval: Duration) -> Result<(), TopError> {
    use crossterm::event::{self, Event, KeyCode, KeyModifiers};
    use crossterm::{cursor, execute, terminal};
    let mut stdout = std::io::stdout();
    terminal::enable_raw_mode().map_err(TopError::Terminal)?;
    // Restores the terminal however the loop ends.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = crossterm::terminal::disable_raw_mode();
            let _ = crossterm::execute!(
                std::io::stdout(),
                crossterm::terminal::LeaveAlternateScreen,
                crossterm::cursor::Show
            );
        }
    }
    let _restore = Restore;
    execute!(stdout, terminal::EnterAlternateScreen, cursor::Hide).map_err(TopError::Terminal)?;
    loop {
        let frames = watcher.sample();
        let (width, _) = terminal::size().unwrap_or((100, 40));
        let text = render(&frames, Some(width as usize));
        execute!(
            stdout,
            cursor::MoveTo(0, 0),
            terminal::Clear(terminal::ClearType::All)
        )
        .map_err(TopError::Terminal)?;
        // Raw mode: lines need a carriage return.
        stdout
            .write_all(text.replace('\n', "\r\n").as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(TopError::Terminal)?;
        let deadline = Instant::now() + interval;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if !event::poll(left).map_err(TopError::Terminal)? {
                break;
            }
            if let Event::Key(key) = event::read().map_err(TopError::Terminal)? {
                let ctrl_c =
                    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
                if matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                    return Ok(());
                }
            }
        }
    }
}

/// Clients to the watched daemons and their previous samples.
struct Watcher {
    nodes: Vec<(PathBuf, Option<Client>, Option<Sample>)>,
}

impl Watcher {
    fn new(sockets: Vec<PathBuf>) -> Self {
        Self {
            nodes: sockets.into_iter().map(|s| (s, None, None)).collect(),
        }
    }

    /// Asks every daemon once; reconnects to those that went away.
    fn sample(&mut self) -> Vec<NodeFrame> {
        let mut frames = Vec::new();
        for (socket, client, previous) in &mut self.nodes {
            let mut connect_error = None;
            if client.is_none() {
                // The reason is shown: a missing socket, a refused one, a daemon starting.
                *client = Client::connect(&*socket)
                    .map_err(|e| connect_error = Some(e.to_string()))
                    .ok();
            }
            let answer = match client {
                Some(c) => c
                    .metrics()
                    .map(|metrics| (metrics, c.nodes().ok()))
                    .map_err(|e| e.to_string()),
                None => Err(connect_error.unwrap_or_else(|| "cannot connect".to_string())),
            };
            match answer {
                Ok((metrics, view)) => {
                    let sample = Sample {
                        at: Instant::now(),
                        metrics,
                        view,
                    };
                    frames.push(frame(socket, &sample, previous.as_ref()));
                    *previous = Some(sample);
                }
                Err(error) => {
                    *client = None;
                    *previous = None;
                    frames.push(NodeFrame {
                        socket: socket.clone(),
                        error: Some(error),
                        metrics: None,
                        cluster: None,
                        rates: Rates::default(),
                        peers: Vec::new(),
                    });
                }
            }
        }
        frames
    }
}

fn frame(socket: &std::path::Path, now: &Sample, before: Option<&Sample>) -> NodeFrame {
    let seconds = before.map_or(0.0, |b| now.at.duration_since(b.at).as_secs_f64());
    let rate = |f: &dyn Fn(&NodeMetrics) -> u64| match before {
        Some(b) if seconds > 0.0 => f(&now.metrics).saturating_sub(f(&b.metrics)) as f64 / seconds,
        _ => 0.0,
    };
    let m = &now.metrics;
    let rates = Rates {
        interval_seconds: seconds,
        creates_per_second: rate(&|m| m.store.created_objects_total),
        gets_per_second: rate(&|m| m.store.get_requests_total),
        fetches_per_second: rate(&|m| {
            let r = &m.counters.fetch_results;
            r.ok + r.not_found + r.timeout + r.error
        }),
        evictions_per_second: rate(&|m| m.store.evicted_objects_total),
        fetched_bytes_per_second: rate(&|m| m.counters.bytes_fetched),
        served_bytes_per_second: rate(&|m| m.counters.bytes_served),
        spills_per_second: rate(&|m| m.store.spill.spills_total),
        spilled_bytes_per_second: rate(&|m| m.store.spill.spilled_bytes_total),
        restores_per_second: rate(&|m| m.store.spill.restores_total),
        restored_bytes_per_second: rate(&|m| m.store.spill.restored_bytes_total),
    };
    // Every member the directory lists, then any peer counted that it no longer lists.
    let mut ids: Vec<u32> = now
        .view
        .iter()
        .flat_map(|v| v.members.iter().map(|member| member.node.0))
        .chain(m.peers.iter().map(|p| p.node.0))
        .filter(|&id| id != m.node.0)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let peers = ids
        .into_iter()
        .map(|id| {
            let member = now
                .view
                .as_ref()
                .and_then(|v| v.members.iter().find(|x| x.node.0 == id));
            let counters = |s: &Sample| {
                s.metrics
                    .peers
                    .iter()
                    .find(|p| p.node.0 == id)
                    .map(|p| p.counters.clone())
                    .unwrap_or_default()
            };
            let peer = m.peers.iter().find(|p| p.node.0 == id);
            let c = counters(now);
            let per_second = |f: &dyn Fn(&skyriver_core::node::PeerCounters) -> u64| match before {
                Some(b) if seconds > 0.0 => f(&c).saturating_sub(f(&counters(b))) as f64 / seconds,
                _ => 0.0,
            };
            PeerRow {
                node: id,
                address: member.map(|x| x.address.clone()),
                connected: peer.is_some_and(|p| p.connected) || member.is_some_and(|x| x.connected),
                eager_threshold_bytes: peer
                    .and_then(|p| p.eager_threshold_bytes)
                    .or(member.and_then(|x| x.eager_threshold_bytes)),
                in_bytes_per_second: per_second(&|c| c.bytes_fetched),
                out_bytes_per_second: per_second(&|c| c.bytes_served),
                fetched_bytes: c.bytes_fetched,
                served_bytes: c.bytes_served,
                errors: c.read_errors
                    + c.transfer_errors
                    + c.malformed_messages
                    + c.connections_lost,
            }
        })
        .collect();
    NodeFrame {
        socket: socket.to_path_buf(),
        error: None,
        metrics: Some(now.metrics.clone()),
        cluster: now.view.clone(),
        rates,
        peers,
    }
}

fn mb_per_second(bytes: f64) -> String {
    format!("{:.1} MB/s", bytes / 1e6)
}

/// Columns of the peer table: header, width, and whether it is left-aligned. The last two
/// totals are dropped on a terminal too narrow for them.
const PEER_COLUMNS: [(&str, usize, bool); 9] = [
    ("peer", 7, true),
    ("address", 21, true),
    ("link", 4, true),
    ("eager max", 9, false),
    ("in", 11, false),
    ("out", 11, false),
    ("errors", 6, false),
    ("fetched", 10, false),
    ("served", 10, false),
];

/// The text of one frame, laid out for `width` columns (a terminal's; lines longer than it are
/// cut, so nothing wraps), or for 80 columns and never cut (`None`: `--once`).
pub fn render(frames: &[NodeFrame], width: Option<usize>) -> String {
    let columns = width.unwrap_or(80).clamp(40, 400);
    let mut out = String::new();
    let answering = frames.iter().filter(|f| f.error.is_none()).count();
    out.push_str(&format!(
        "skyriver top: {answering} of {} daemons answering   (q quits)\n",
        frames.len()
    ));
    for f in frames {
        out.push('\n');
        let (Some(m), None) = (&f.metrics, &f.error) else {
            out.push_str(&format!(
                "{}: {}\n",
                f.socket.display(),
                f.error.as_deref().unwrap_or("no answer")
            ));
            continue;
        };
        let s = &m.store;
        let directory = match (&f.cluster, m.standalone) {
            (_, true) => "alone".to_string(),
            (Some(view), false) => format!(
                "{} directory {}",
                view.fabric,
                if m.directory_healthy { "up" } else { "DOWN" }
            ),
            (None, false) => format!(
                "directory {}",
                if m.directory_healthy { "up" } else { "DOWN" }
            ),
        };
        out.push_str(&format!(
            "node {}  {}  clients {}  socket {}\n",
            m.node.0,
            directory,
            s.client_count,
            f.socket.display()
        ));
        let used = s.allocated_bytes as f64 / s.capacity_bytes.max(1) as f64;
        let amounts = format!(
            "] {:>5.1}%  {} of {}",
            used * 100.0,
            format_bytes(s.allocated_bytes),
            format_bytes(s.capacity_bytes),
        );
        let bar_width = columns
            .saturating_sub("  memory [".len() + amounts.chars().count())
            .clamp(10, 60);
        let filled = ((used * bar_width as f64).round() as usize).min(bar_width);
        let r = &f.rates;
        let fr = &m.counters.fetch_results;
        let mut parts = vec![
            format!(
                "memory [{}{}{amounts}",
                "#".repeat(filled),
                ".".repeat(bar_width - filled)
            ),
            format!(
                "pinned {}  evictable {}",
                format_bytes(s.pinned_bytes),
                format_bytes(s.evictable_bytes)
            ),
            format!(
                "objects {} sealed, {} unsealed, {} evicted, {} out of memory",
                s.sealed_count,
                s.object_count.saturating_sub(s.sealed_count),
                s.evicted_objects_total,
                s.out_of_memory_total
            ),
            format!(
                "ops/s: create {:.0}  get {:.0}  fetch {:.0}  evict {:.0}",
                r.creates_per_second,
                r.gets_per_second,
                r.fetches_per_second,
                r.evictions_per_second,
            ),
            format!(
                "fetch in {}  out {}",
                mb_per_second(r.fetched_bytes_per_second),
                mb_per_second(r.served_bytes_per_second),
            ),
            format!(
                "fetches: {} ok, {} not found, {} timed out, {} failed",
                fr.ok, fr.not_found, fr.timeout, fr.error
            ),
            format!(
                "in flight: {} transfers, {} READs, {} leases, {} waiting",
                m.transfers_in_flight, m.reads_in_flight, m.leases_held, m.fetches_waiting,
            ),
        ];
        parts.extend(spill_parts(&s.spill, r));
        push_parts(&mut out, columns, &parts);
        if f.peers.is_empty() {
            continue;
        }
        // As many columns as fit (the totals last).
        let mut shown = PEER_COLUMNS.len();
        while shown > 7 && table_width(&PEER_COLUMNS[..shown]) > columns {
            shown -= 1;
        }
        let header: Vec<String> = PEER_COLUMNS.iter().map(|c| c.0.to_string()).collect();
        push_row(&mut out, &PEER_COLUMNS[..shown], &header);
        for p in &f.peers {
            let cells = [
                format!("node {}", p.node),
                p.address.clone().unwrap_or_else(|| "-".into()),
                (if p.connected { "up" } else { "down" }).to_string(),
                p.eager_threshold_bytes.map_or("-".into(), format_bytes),
                mb_per_second(p.in_bytes_per_second),
                mb_per_second(p.out_bytes_per_second),
                p.errors.to_string(),
                format_bytes(p.fetched_bytes),
                format_bytes(p.served_bytes),
            ];
            push_row(&mut out, &PEER_COLUMNS[..shown], &cells);
        }
    }
    match width {
        Some(_) => out
            .lines()
            .map(|line| format!("{}\n", line.chars().take(columns).collect::<String>()))
            .collect(),
        None => out,
    }
}

/// The spill tier's parts of a node's lines: what is on disk, the rates, the failures. None
/// without a tier.
fn spill_parts(spill: &SpillStats, r: &Rates) -> Vec<String> {
    if spill.limit_bytes == 0 {
        return Vec::new();
    }
    vec![
        format!(
            "spill {} of {} on disk ({} objects){}",
            format_bytes(spill.spilled_bytes),
            format_bytes(spill.limit_bytes),
            spill.spilled_objects,
            if spill.full { "  FULL: evicting" } else { "" }
        ),
        format!(
            "writing {}  restoring {}, {} queued",
            format_bytes(spill.spilling_bytes),
            spill.restores_in_flight,
            spill.restores_queued
        ),
        format!(
            "spills/s {:.0} ({})  restores/s {:.0} ({})",
            r.spills_per_second,
            mb_per_second(r.spilled_bytes_per_second),
            r.restores_per_second,
            mb_per_second(r.restored_bytes_per_second),
        ),
        format!(
            "spill failures: {} no space, {} io, {} lost, {} evicted when full",
            spill.spill_no_space_total,
            spill.spill_errors_total,
            spill.objects_lost_total + spill.lost_at_start_total,
            spill.evicted_spill_full_total
        ),
    ]
}

/// Appends `parts` indented, as many on a line as fit in `columns`.
fn push_parts(out: &mut String, columns: usize, parts: &[String]) {
    const INDENT: &str = "  ";
    const GAP: &str = "   ";
    let mut line = String::new();
    for part in parts {
        let needed = if line.is_empty() {
            INDENT.len() + part.chars().count()
        } else {
            line.chars().count() + GAP.len() + part.chars().count()
        };
        if !line.is_empty() && needed > columns {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        line.push_str(if line.is_empty() { INDENT } else { GAP });
        line.push_str(part);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
}

/// Characters a table row of these columns takes, indent included.
fn table_width(columns: &[(&str, usize, bool)]) -> usize {
    2 + columns.iter().map(|c| c.1).sum::<usize>() + columns.len().saturating_sub(1)
}

/// Appends one row of the peer table.
fn push_row(out: &mut String, columns: &[(&str, usize, bool)], cells: &[String]) {
    out.push_str("  ");
    for (i, ((_, width, left), cell)) in columns.iter().zip(cells).enumerate() {
        if i > 0 {
            out.push(' ');
        }
        match left {
            true => out.push_str(&format!("{cell:<width$}")),
            false => out.push_str(&format!("{cell:>width$}")),
        }
    }
    // No trailing spaces.
    let kept = out.trim_end_matches(' ').len();
    out.truncate(kept);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::node::{Node, NodeConfig};
    use skyriver_core::{Instant as NodeInstant, NodeId};

    /// A busy node's frame: large counts and sizes, two peers, the longest IPv4 addresses.
    fn busy_frame() -> NodeFrame {
        let mut metrics =
            Node::new(NodeConfig::new(NodeId(12), 1 << 40), NodeInstant::ZERO).metrics();
        metrics.standalone = false;
        let s = &mut metrics.store;
        (s.allocated_bytes, s.pinned_bytes, s.evictable_bytes) = (1 << 39, 3 << 38, 5 << 37);
        (s.object_count, s.sealed_count) = (12_345_678, 12_300_000);
        (s.evicted_objects_total, s.out_of_memory_total) = (9_876_543, 123_456);
        let spill = &mut s.spill;
        (spill.limit_bytes, spill.spilled_bytes, spill.spilling_bytes) =
            (1 << 44, 999 << 40, 3 << 30);
        (
            spill.spilled_objects,
            spill.restores_in_flight,
            spill.restores_queued,
        ) = (987_654_321, 4_096, 65_432);
        (spill.spill_no_space_total, spill.spill_errors_total) = (12_345, 6_789);
        (spill.objects_lost_total, spill.evicted_spill_full_total) = (4_321, 98_765);
        spill.full = true;
        let r = &mut metrics.counters.fetch_results;
        (r.ok, r.not_found, r.timeout, r.error) = (98_765_432, 1_234_567, 765_432, 54_321);
        let peer = |node| PeerRow {
            node,
            address: Some("255.255.255.255:65535".into()),
            connected: node % 2 == 0,
            eager_threshold_bytes: Some(1 << 20),
            in_bytes_per_second: 9_876.5e6,
            out_bytes_per_second: 8_765.4e6,
            fetched_bytes: 999 << 30,
            served_bytes: 998 << 30,
            errors: 123_456,
        };
        NodeFrame {
            socket: "/tmp/skyriver-1000/skyriver.sock".into(),
            error: None,
            metrics: Some(metrics),
            cluster: None,
            rates: Rates {
                interval_seconds: 1.0,
                creates_per_second: 123_456.0,
                gets_per_second: 1_234_567.0,
                fetches_per_second: 98_765.0,
                evictions_per_second: 12_345.0,
                fetched_bytes_per_second: 9_876.5e6,
                served_bytes_per_second: 8_765.4e6,
                spills_per_second: 54_321.0,
                spilled_bytes_per_second: 2_345.6e6,
                restores_per_second: 43_210.0,
                restored_bytes_per_second: 3_456.7e6,
            },
            peers: vec![peer(10), peer(11)],
        }
    }

    #[test]
    fn frames_fit_the_terminal_without_wrapping() {
        let frames = [busy_frame()];
        for width in [80, 100, 120, 200] {
            let text = render(&frames, Some(width));
            for line in text.lines() {
                assert!(
                    line.chars().count() <= width,
                    "a line of {} columns at {width}:\n{line}\n{text}",
                    line.chars().count()
                );
            }
            // Everything is there; only the per-peer totals wait for a wider terminal.
            for needle in [
                "evictable",
                "out of memory",
                "evict 12345",
                "timed out",
                "waiting",
                "spill 999.0 TiB of 16.0 TiB",
                "FULL: evicting",
                "restoring 4096, 65432 queued",
                "spills/s 54321 (2345.6 MB/s)",
                "restores/s 43210 (3456.7 MB/s)",
                "12345 no space, 6789 io, 4321 lost, 98765 evicted when full",
            ] {
                assert!(
                    text.contains(needle),
                    "{needle:?} missing at {width}:\n{text}"
                );
            }
            assert_eq!(text.contains("fetched"), width >= 100, "{text}");
        }
        // --once lays out for 80 columns and cuts nothing.
        let text = render(&frames, None);
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    }

    #[test]
    fn the_spill_tier_shows_only_when_the_node_has_one() {
        let mut frame = busy_frame();
        assert!(render(std::slice::from_ref(&frame), None).contains("spills/s"));
        let metrics = frame.metrics.as_mut().expect("busy_frame has metrics");
        *metrics.store.spill = Default::default();
        let text = render(&[frame], None);
        assert!(!text.contains("spill"), "no tier, no spill line:\n{text}");
    }
}
