//! `skyriver bench breakdown`: where the time of a 1 KiB fetch goes, hop by hop, next to raw
//! Unix-socket and TCP ping-pongs, a small put and a local get measured in the same run.
//!
//! Two daemons on this machine (a local cluster, TCP fabric) for the fetches, and a daemon of
//! its own for the puts and gets (as `bench local` measures them). The requester's and the
//! holder's daemons stamp named moments of each traced fetch (request read, fetch request about
//! to be sent, message read off the fabric, message handled by the loop, eager reply about to be
//! sent, bytes written, sealed, reply queued, reply about to be written: every send is stamped
//! before its system call, so a receiver that runs first cannot make a hop negative) with
//! `CLOCK_MONOTONIC`, which the client and both daemons share,
//! and the fabric stamps each message's write once its system call returns, which splits a
//! fabric crossing into the sender's write (on loopback it also runs the receiving side of
//! the TCP stack and wakes the receiver) and the receiver's way to the bytes (on a shared
//! CPU a receiver that preempts the writer runs inside the write, and the second part can
//! come out negative; the pair's sum stays right),
//! and the client stamps its send and its receipt of the reply on the same clock. The median of
//! every hop is printed, with the median total beside the sum of the medians (they differ by
//! the spread, not by a hidden hop).
//!
//! Each polling time in `--poll-us` gets a cluster of its own (the daemons' `--poll-us` and the
//! client's `SKYRIVER_POLL_US`), measured back to back (every process stays awake) and after a
//! pause longer than any polling window (every process has gone to sleep: each hop pays a
//! wake-up, as on an idle machine), and then left idle for a while to measure the daemons' CPU
//! use when nothing happens.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use skyriver_core::client_protocol::TraceStamp;
use skyriver_core::ObjectId;
use skyriver_transport::trace::monotonic_ns;

use super::{
    baselines, pin_process, pin_this_thread, BenchError, CaseResult, ChildDaemon, CpuPlacement,
};
use crate::up::{LocalCluster, UpArgs};
use skyriver_client::Client;
use skyriver_daemon::size::ByteSize;
use skyriver_transport::poll::POLL_US_ENV;

/// Bytes of the object fetched, put and got.
const OBJECT_BYTES: usize = 1024;
/// Iterations of one case between turns of the others (so drift hits every case alike).
const ROUND_ITERATIONS: usize = 100;

/// Options of `bench breakdown`.
#[derive(Args, Debug, Clone)]
pub struct BreakdownArgs {
    /// Polling times to compare, in microseconds: the daemons' `--poll-us` and the client's
    /// `SKYRIVER_POLL_US`, one cluster each.
    #[arg(long, value_delimiter = ',', default_value = "0,50")]
    pub poll_us: Vec<u64>,
    /// `pinned`: this process and everything it starts on the first vCPU; `spread`: this
    /// process and the holder on the first, the requester, the lone daemon and the echo
    /// servers on the second (every hop crosses vCPUs).
    #[arg(long, value_enum, default_value_t = CpuPlacement::Spread)]
    pub cpus: CpuPlacement,
    /// Back-to-back iterations of each case (per polling time).
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Iterations of each case after a pause (per polling time).
    #[arg(long, default_value_t = 300)]
    pub paused_iterations: usize,
    /// The pause before each of those iterations, in microseconds (longer than any polling
    /// time, so every process sleeps when the request comes).
    #[arg(long, default_value_t = 2000)]
    pub pause_us: u64,
    /// Seconds the daemons are left idle while their CPU use is measured.
    #[arg(long, default_value_t = 2)]
    pub idle_secs: u64,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-breakdown.json")]
    pub json: PathBuf,
}

/// The hops of a traced fetch: (name, from stamp, to stamp). `client_send` and
/// `client_received` are the client's; `A.` stamps the requester's daemon, `B.` the holder's.
const HOPS: [(&str, &str, &str); 13] = [
    (
        "client send -> daemon has read it",
        "client_send",
        "A.request_read",
    ),
    (
        "daemon: request handled",
        "A.request_read",
        "A.fetch_request_send",
    ),
    (
        "requester: frame + write to the fabric",
        "A.fetch_request_send",
        "A.message_written",
    ),
    (
        "written -> holder's fabric has read it",
        "A.message_written",
        "B.message_read",
    ),
    (
        "holder: fabric -> loop hand-off",
        "B.message_read",
        "B.message_handled",
    ),
    (
        "holder: fetch request handled",
        "B.message_handled",
        "B.eager_send",
    ),
    (
        "holder: gather + write to the fabric",
        "B.eager_send",
        "B.message_written",
    ),
    (
        "written -> requester's fabric has read it",
        "B.message_written",
        "A.message_read",
    ),
    (
        "requester: fabric -> loop hand-off",
        "A.message_read",
        "A.message_handled",
    ),
    (
        "requester: create + copy",
        "A.message_handled",
        "A.eager_written",
    ),
    (
        "requester: seal + reply built",
        "A.eager_written",
        "A.reply_queued",
    ),
    (
        "requester: reply queued -> write",
        "A.reply_queued",
        "A.reply_write",
    ),
    (
        "write -> client has the reply",
        "A.reply_write",
        "client_received",
    ),
];

/// One measured case.
#[derive(Debug, Clone, Serialize)]
struct Row {
    case: String,
    /// `back-to-back` or `after a pause`.
    pacing: &'static str,
    iterations: usize,
    p50_us: f64,
    p99_us: f64,
}

/// One hop's median.
#[derive(Debug, Clone, Serialize)]
struct Hop {
    hop: &'static str,
    /// Median over the back-to-back traced fetches.
    p50_us: f64,
    /// Median over the traced fetches after a pause (every process asleep when one starts).
    paused_p50_us: f64,
}

/// A target of the issue, from this run.
#[derive(Debug, Clone, Serialize)]
struct Target {
    what: String,
    measured_us: f64,
    limit_us: f64,
    met: bool,
}

/// Everything measured with one polling time.
#[derive(Debug, Clone, Serialize)]
struct PollRun {
    poll_us: u64,
    rows: Vec<Row>,
    hops: Vec<Hop>,
    hops_sum_us: f64,
    traced_total_p50_us: f64,
    traced_fetches: usize,
    paused_hops_sum_us: f64,
    paused_traced_total_p50_us: f64,
    paused_traced_fetches: usize,
    /// CPU time of each daemon (holder, requester, the lone daemon) over the idle period, in
    /// percent of one CPU.
    idle_cpu_percent: Vec<f64>,
    /// CPU time of each daemon while the back-to-back cases ran, in percent of one CPU.
    busy_cpu_percent: Vec<f64>,
    targets: Vec<Target>,
}

#[derive(Debug, Serialize)]
struct Report {
    cpus: CpuPlacement,
    object_bytes: usize,
    pause_us: u64,
    load_average: String,
    runs: Vec<PollRun>,
}

pub(super) fn run(args: &BreakdownArgs) -> Result<(), BenchError> {
    if args.cpus == CpuPlacement::Pinned {
        // Threads and processes started from here on inherit it.
        pin_this_thread(args.cpus.cpus().0)?;
    }
    let exe = crate::self_exe().map_err(BenchError::OwnPath)?;
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut runs = Vec::new();
    for &poll_us in &args.poll_us {
        eprintln!("poll {poll_us} µs: starting two daemons...");
        // The daemons inherit it as their --poll-us; the clients read it when they connect.
        std::env::set_var(POLL_US_ENV, poll_us.to_string());
        let up = UpArgs::new(2, ByteSize(64 << 20), None);
        let cluster = LocalCluster::start_tied_to_this_thread(&up, &exe)?;
        // Puts and gets on a daemon of its own, as `bench local` measures them (a cluster
        // node also publishes each put to the directory).
        let alone = ChildDaemon::start(64 << 20)?;
        if args.cpus == CpuPlacement::Spread {
            // As `bench fetch` places them: this process and the holder on the first vCPU,
            // the requester, the lone daemon and the echo servers on the second, so every hop
            // crosses vCPUs.
            let (near, far) = args.cpus.cpus();
            let daemons = cluster.pids().into_iter().flatten().zip([near, far]);
            for (pid, cpu) in daemons.chain([(alone.pid(), far)]) {
                pin_process(pid, cpu)?;
            }
            pin_this_thread(near)?;
        }
        let run = measure(args, poll_us, &cluster, &alone)?;
        print_run(args, &run);
        runs.push(run);
    }
    std::env::remove_var(POLL_US_ENV);
    let report = Report {
        cpus: args.cpus,
        object_bytes: OBJECT_BYTES,
        pause_us: args.pause_us,
        load_average,
        runs,
    };
    let json = serde_json::to_string_pretty(&report).expect("plain data serializes");
    std::fs::write(&args.json, json).map_err(|e| BenchError::Io {
        what: format!("cannot write {}", args.json.display()),
        source: e,
    })?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// A case measured in turns with the others.
struct Case {
    name: &'static str,
    back_to_back: Vec<Duration>,
    paused: Vec<Duration>,
}

fn measure(
    args: &BreakdownArgs,
    poll_us: u64,
    cluster: &LocalCluster,
    alone: &ChildDaemon,
) -> Result<PollRun, BenchError> {
    let holder = Client::connect(&cluster.sockets[0])?;
    let requester = Client::connect(&cluster.sockets[1])?;
    let local = Client::connect(alone.socket())?;
    let data = vec![0x5au8; OBJECT_BYTES];
    // The raw round trips' echo servers on the requester's vCPU when spread (pinned: this
    // process's, which every thread started here inherits).
    let far = (args.cpus == CpuPlacement::Spread).then(|| args.cpus.cpus().1);
    let mut uds = baselines::uds_round_trip(far)?.workers.remove(0);
    let mut tcp = baselines::tcp_round_trip(1, far)?.workers.remove(0);
    let got = object_id(u64::MAX);
    local.put(got, &data, b"")?;
    let fetched = object_id(u64::MAX - 1);
    holder.put(fetched, &data, b"")?;
    let mut counter = 0u64;

    let names = [
        "raw UDS ping-pong (1 B)",
        "raw TCP ping-pong (1 B)",
        "put 1 KiB",
        "get+release 1 KiB",
        "fetch 1 KiB",
    ];
    let mut cases: Vec<Case> = names
        .iter()
        .map(|&name| Case {
            name,
            back_to_back: Vec::new(),
            paused: Vec::new(),
        })
        .collect();
    let mut one = |index: usize| -> Result<Duration, BenchError> {
        Ok(match index {
            0 => uds()?,
            1 => tcp()?,
            2 => {
                counter += 1;
                let id = object_id(counter);
                let begin = Instant::now();
                local.put(id, &data, b"")?;
                let took = begin.elapsed();
                local.delete(&[id])?;
                took
            }
            3 => {
                let begin = Instant::now();
                drop(std::hint::black_box(
                    local.get_one(got, Some(Duration::ZERO))?,
                ));
                begin.elapsed()
            }
            _ => {
                let (sent, received) = fetch_then_delete(&requester, fetched)?;
                Duration::from_nanos(received - sent)
            }
        })
    };
    // Warm up every path (connections, caches) untimed.
    for index in 0..cases.len() {
        for _ in 0..20 {
            one(index)?;
        }
    }
    let mut pids: Vec<u32> = cluster.pids().into_iter().flatten().collect();
    pids.push(alone.pid());
    let cpu_before = cpu_ticks(&pids);
    let busy_started = Instant::now();
    eprintln!(
        "  back to back: {} iterations of each case...",
        args.iterations
    );
    let mut done = 0;
    while done < args.iterations {
        let turn = ROUND_ITERATIONS.min(args.iterations - done);
        for (index, case) in cases.iter_mut().enumerate() {
            for _ in 0..turn {
                case.back_to_back.push(one(index)?);
            }
        }
        done += turn;
    }
    let busy_cpu_percent = cpu_percent(&cpu_before, &cpu_ticks(&pids), busy_started.elapsed());
    eprintln!(
        "  after a {} µs pause: {} iterations of each case...",
        args.pause_us, args.paused_iterations
    );
    let pause = Duration::from_micros(args.pause_us);
    for _ in 0..args.paused_iterations {
        for (index, case) in cases.iter_mut().enumerate() {
            std::thread::sleep(pause);
            case.paused.push(one(index)?);
        }
    }

    eprintln!("  traced fetches: {}...", args.iterations);
    let traced = traced_fetches(&holder, &requester, fetched, args.iterations, None)?;
    eprintln!(
        "  traced fetches after a {} µs pause: {}...",
        args.pause_us, args.paused_iterations
    );
    let traced_paused = traced_fetches(
        &holder,
        &requester,
        fetched,
        args.paused_iterations,
        Some(pause),
    )?;

    eprintln!("  idle for {} s...", args.idle_secs);
    let idle_before = cpu_ticks(&pids);
    let idle_started = Instant::now();
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let idle_cpu_percent = cpu_percent(&idle_before, &cpu_ticks(&pids), idle_started.elapsed());

    let mut rows = Vec::new();
    for case in &mut cases {
        for (pacing, samples) in [
            ("back-to-back", &mut case.back_to_back),
            ("after a pause", &mut case.paused),
        ] {
            let result = CaseResult::from_samples(case.name, OBJECT_BYTES as u64, samples);
            rows.push(Row {
                case: case.name.to_string(),
                pacing,
                iterations: result.iterations,
                p50_us: result.p50_us,
                p99_us: result.p99_us,
            });
        }
    }
    let p50 = |case: &str, pacing: &str| {
        rows.iter()
            .find(|r| r.case == case && r.pacing == pacing)
            .map_or(f64::NAN, |r| r.p50_us)
    };
    let mut targets = Vec::new();
    for pacing in ["back-to-back", "after a pause"] {
        let uds = p50(names[0], pacing);
        let tcp = p50(names[1], pacing);
        for (case, limit, what) in [
            (names[2], 1.5 * uds, "put ≤ 1.5× raw UDS"),
            (names[3], 1.5 * uds, "get ≤ 1.5× raw UDS"),
            (
                names[4],
                2.0 * (uds + tcp),
                "fetch ≤ 2× (raw UDS + raw TCP)",
            ),
        ] {
            let measured = p50(case, pacing);
            targets.push(Target {
                what: format!("{what}, {pacing}"),
                measured_us: measured,
                limit_us: limit,
                met: measured <= limit,
            });
        }
    }
    let hops: Vec<Hop> = HOPS
        .iter()
        .map(|&(hop, from, to)| Hop {
            hop,
            p50_us: median(traced.iter().filter_map(|t| t.span_us(from, to))),
            paused_p50_us: median(traced_paused.iter().filter_map(|t| t.span_us(from, to))),
        })
        .collect();
    let hops_sum_us = hops.iter().map(|h| h.p50_us).sum();
    let paused_hops_sum_us = hops.iter().map(|h| h.paused_p50_us).sum();
    let total = |traced: &[TracedFetch]| {
        median(
            traced
                .iter()
                .filter_map(|t| t.span_us("client_send", "client_received")),
        )
    };
    Ok(PollRun {
        poll_us,
        rows,
        hops,
        hops_sum_us,
        traced_total_p50_us: total(&traced),
        traced_fetches: traced.len(),
        paused_hops_sum_us,
        paused_traced_total_p50_us: total(&traced_paused),
        paused_traced_fetches: traced_paused.len(),
        idle_cpu_percent,
        busy_cpu_percent,
        targets,
    })
}

/// The stamps of one traced fetch, by name (the first of each name).
struct TracedFetch {
    stamps: Vec<(String, u64)>,
}

impl TracedFetch {
    fn at(&self, name: &str) -> Option<u64> {
        self.stamps
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, at)| at)
    }

    fn span_us(&self, from: &str, to: &str) -> Option<f64> {
        let (from, to) = (self.at(from)?, self.at(to)?);
        Some((to as f64 - from as f64) / 1e3)
    }
}

/// One fetch of the benchmark, timed or traced alike: fetch, release, flush, delete (so the next
/// fetch moves the bytes again). Returns the `CLOCK_MONOTONIC` nanoseconds of the send and of
/// the reply's arrival (the clock the daemons stamp with).
fn fetch_then_delete(requester: &Client, id: ObjectId) -> Result<(u64, u64), BenchError> {
    let sent = monotonic_ns();
    let object = requester.fetch_one(id, Some(Duration::from_secs(10)))?;
    let received = monotonic_ns();
    drop(object);
    requester.flush()?;
    requester.delete(&[id])?;
    Ok((sent, received))
}

/// Fetches traced between two collections of the daemons' stamps: few enough that their
/// stamps fit the daemons' buffers, many enough that collecting stays off the measured path.
const TRACED_PER_COLLECTION: usize = 64;

/// Fetches exactly as the untimed back-to-back case does (fetch, release, flush, delete), with
/// the daemons stamping. The stamps are collected every [`TRACED_PER_COLLECTION`] fetches, so the
/// daemons see the same traffic between fetches as in the table (collecting after each one kept
/// the holder awake and made traced fetches faster than untraced ones); each fetch takes the
/// stamps taken between its send and its reply (one clock for every process of the machine).
fn traced_fetches(
    holder: &Client,
    requester: &Client,
    id: ObjectId,
    iterations: usize,
    pause: Option<Duration>,
) -> Result<Vec<TracedFetch>, BenchError> {
    holder.trace_stamps(true)?;
    requester.trace_stamps(true)?;
    let mut traced = Vec::with_capacity(iterations);
    let mut spans = Vec::with_capacity(TRACED_PER_COLLECTION);
    let named = |prefix: &str, list: Vec<TraceStamp>| {
        list.into_iter()
            .map(|s| (format!("{prefix}.{}", s.event), s.at_ns))
            .collect::<Vec<_>>()
    };
    while traced.len() < iterations {
        spans.clear();
        for _ in 0..TRACED_PER_COLLECTION.min(iterations - traced.len()) {
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
            spans.push(fetch_then_delete(requester, id)?);
        }
        let mut stamps = named("A", requester.trace_stamps(true)?);
        stamps.extend(named("B", holder.trace_stamps(true)?));
        for &(sent, received) in &spans {
            let mut fetch = vec![
                ("client_send".to_string(), sent),
                ("client_received".to_string(), received),
            ];
            fetch.extend(
                stamps
                    .iter()
                    .filter(|(_, at)| (sent..=received).contains(at))
                    .cloned(),
            );
            traced.push(TracedFetch { stamps: fetch });
        }
    }
    holder.trace_stamps(false)?;
    requester.trace_stamps(false)?;
    Ok(traced)
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn object_id(n: u64) -> ObjectId {
    let mut bytes = [0u8; 20];
    bytes[..8].copy_from_slice(b"breakdwn");
    bytes[12..].copy_from_slice(&n.to_be_bytes());
    ObjectId(bytes)
}

/// User + system CPU ticks of each process (from `/proc/PID/stat`).
fn cpu_ticks(pids: &[u32]) -> Vec<u64> {
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the command name (which may hold spaces) in parentheses.
            let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
            let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
            field(11).unwrap_or(0) + field(12).unwrap_or(0)
        })
        .collect()
}

fn cpu_percent(before: &[u64], after: &[u64], over: Duration) -> Vec<f64> {
    let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a.saturating_sub(*b) as f64 / ticks_per_sec) / over.as_secs_f64() * 100.0)
        .collect()
}

fn print_run(args: &BreakdownArgs, run: &PollRun) {
    let placement = match args.cpus {
        CpuPlacement::Pinned => "pinned (everything on CPU 0)",
        CpuPlacement::Spread => "spread (anywhere)",
    };
    println!();
    println!(
        "== poll {} µs, CPUs {placement}, 1 KiB objects ==",
        run.poll_us
    );
    println!(
        "{:<28} {:>14} {:>10} {:>10}",
        "case", "pacing", "p50 µs", "p99 µs"
    );
    for row in &run.rows {
        println!(
            "{:<28} {:>14} {:>10.1} {:>10.1}",
            row.case, row.pacing, row.p50_us, row.p99_us
        );
    }
    println!();
    println!(
        "1 KiB fetch, hop by hop (medians of {} traced fetches back to back and {} after a \
         pause, in µs; A = requester's daemon, B = holder's):",
        run.traced_fetches, run.paused_traced_fetches
    );
    println!(
        "  {:<42} {:>12} {:>14}",
        "hop", "back-to-back", "after a pause"
    );
    for hop in &run.hops {
        println!(
            "  {:<42} {:>12.1} {:>14.1}",
            hop.hop, hop.p50_us, hop.paused_p50_us
        );
    }
    println!(
        "  {:<42} {:>12.1} {:>14.1}",
        "sum of the hops' medians", run.hops_sum_us, run.paused_hops_sum_us
    );
    println!(
        "  {:<42} {:>12.1} {:>14.1}",
        "median total of the traced fetches",
        run.traced_total_p50_us,
        run.paused_traced_total_p50_us
    );
    println!();
    let percents = |values: &[f64]| {
        values
            .iter()
            .map(|p| format!("{p:.1}%"))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    println!(
        "daemon CPU (holder + requester + lone daemon): {} while busy, {} idle",
        percents(&run.busy_cpu_percent),
        percents(&run.idle_cpu_percent)
    );
    println!("targets:");
    for target in &run.targets {
        println!(
            "  {:<52} {:>8.1} µs vs {:>8.1} µs: {}",
            target.what,
            target.measured_us,
            target.limit_us,
            super::verdict(target.met)
        );
    }
}
