//! `bench cluster --breakdown`: where the time of each fetch of one pattern round goes.
//!
//! One round of a pattern runs with every daemon stamping named moments (as `bench breakdown`
//! does for a lone fetch, on the `CLOCK_MONOTONIC` every process of the machine shares), and
//! every requesting thread stamps each fetch's send and reply. A requester's daemon runs one
//! fetch of its client at a time, so the stamps it took between a fetch's send and its reply
//! are that fetch's: its request read, its `FetchRequest` sent (after the lookup at the head,
//! if any), its copy sealed and its reply written. The holder's stamps mix every requester's
//! and are not split per fetch: its queueing and service show in the requester's wait for the
//! reply. The median of every hop over the round's fetches is printed.

use serde::Serialize;
use skyriver_client::Client;
use skyriver_core::client_protocol::TraceStamp;

use super::BenchError;

/// One fetch of a traced round, by the requesting node's thread.
#[derive(Debug, Clone, Copy)]
pub(super) struct FetchSpan {
    /// The requesting node (index into the cluster's clients).
    pub(super) node: usize,
    /// `CLOCK_MONOTONIC` nanoseconds when the client sent the fetch.
    pub(super) sent_ns: u64,
    /// When its reply was in.
    pub(super) received_ns: u64,
}

/// The hops of one fetch: (name, from stamp, to stamp); `client_*` are the requesting
/// thread's, the others its daemon's (the first of each name after the previous hop's end).
const HOPS: [(&str, &str, &str); 4] = [
    ("client -> daemon", "client_send", "request_read"),
    (
        "directory lookup (head round trip)",
        "request_read",
        "fetch_request_send",
    ),
    // The requester's daemon also serves others (its copies), so a message it reads in this
    // time is not surely the reply: the holder's part and the copy are one hop.
    (
        "holder (queue, service), reply, copy, seal",
        "fetch_request_send",
        "sealed",
    ),
    ("reply -> client", "sealed", "client_received"),
];

/// Median microseconds of each hop over a traced round, and of the whole fetch.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Breakdown {
    /// The system traced (`skyriver`, `sky+hint`).
    pub(super) system: String,
    pub(super) pattern: String,
    pub(super) size_bytes: u64,
    /// Fetches with every stamp of every hop.
    pub(super) fetches: usize,
    /// (hop, median µs), in order.
    pub(super) hops_us: Vec<(String, f64)>,
    /// Median of the fetches' whole time (client send to reply).
    pub(super) total_us: f64,
}

/// Turns stamping on at every daemon (dropping what they kept).
pub(super) fn start(clients: &[Client]) -> Result<(), BenchError> {
    for client in clients {
        client.trace_stamps(true)?;
    }
    Ok(())
}

/// Collects every daemon's stamps (turning stamping off) and splits them into `spans`' hops.
pub(super) fn finish(
    clients: &[Client],
    spans: &[FetchSpan],
    (system, pattern, size_bytes): (&str, &str, u64),
) -> Result<Breakdown, BenchError> {
    let stamps: Vec<Vec<TraceStamp>> = clients
        .iter()
        .map(|c| c.trace_stamps(false))
        .collect::<Result<_, _>>()?;
    let mut per_hop: Vec<Vec<f64>> = vec![Vec::new(); HOPS.len()];
    let mut totals = Vec::new();
    let mut fetches = 0;
    for span in spans {
        let mut own: Vec<(&str, u64)> = stamps[span.node]
            .iter()
            .filter(|s| (span.sent_ns..=span.received_ns).contains(&s.at_ns))
            .map(|s| (s.event.as_str(), s.at_ns))
            .collect();
        own.sort_by_key(|&(_, at)| at);
        own.insert(0, ("client_send", span.sent_ns));
        own.push(("client_received", span.received_ns));
        let mut hops = Vec::with_capacity(HOPS.len());
        let mut cursor = 0;
        for (_, from, to) in HOPS {
            let Some(start) = own[cursor..].iter().position(|(n, _)| *n == from) else {
                break;
            };
            let start = cursor + start;
            let Some(end) = own[start..].iter().position(|(n, _)| *n == to) else {
                break;
            };
            let end = start + end;
            hops.push((own[end].1 as f64 - own[start].1 as f64) / 1e3);
            cursor = end;
        }
        if hops.len() != HOPS.len() {
            continue;
        }
        fetches += 1;
        for (values, hop) in per_hop.iter_mut().zip(hops) {
            values.push(hop);
        }
        totals.push((span.received_ns - span.sent_ns) as f64 / 1e3);
    }
    Ok(Breakdown {
        system: system.into(),
        pattern: pattern.into(),
        size_bytes,
        fetches,
        hops_us: HOPS
            .iter()
            .zip(per_hop)
            .map(|((name, _, _), values)| (name.to_string(), median(values)))
            .collect(),
        total_us: median(totals),
    })
}

/// Prints the breakdowns, one block per pattern and size, systems side by side.
pub(super) fn print(breakdowns: &[Breakdown]) {
    if breakdowns.is_empty() {
        return;
    }
    println!("where a fetch's time goes (median µs over one traced round's fetches):");
    let mut index = 0;
    while index < breakdowns.len() {
        let first = &breakdowns[index];
        let group: Vec<&Breakdown> = breakdowns[index..]
            .iter()
            .take_while(|b| b.pattern == first.pattern && b.size_bytes == first.size_bytes)
            .collect();
        index += group.len();
        print!(
            "  {} {:<30}",
            first.pattern,
            skyriver_daemon::size::format_bytes(first.size_bytes)
        );
        for b in &group {
            print!(" {:>12}", b.system);
        }
        println!();
        for (hop, (name, _, _)) in HOPS.iter().enumerate() {
            print!("    {name:<40}");
            for b in &group {
                print!(" {:>12.1}", b.hops_us[hop].1);
            }
            println!();
        }
        print!("    {:<40}", "whole fetch");
        for b in &group {
            print!(" {:>12.1}", b.total_us);
        }
        println!();
        print!("    {:<40}", "fetches traced");
        for b in &group {
            print!(" {:>12}", b.fetches);
        }
        println!();
    }
    println!();
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
