//! `bench cluster`'s relay report: how bytes flowed through relays during a case's Skyriver
//! rounds, from every daemon's relay counters ([`RelayPace`]) taken before and after them.

use serde::Serialize;
use skyriver_client::Client;
use skyriver_core::node::RelayPace;

use super::BenchError;

/// The cluster's relay counters summed over every daemon, and the holder's direct serves.
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot {
    pace: RelayPace,
    /// Leases granted by rendezvous by the source (node 0), partial copies' excluded.
    source_leases: u64,
    /// Redirects the source sent instead of serving.
    redirects: u64,
    relayed_transfers: u64,
}

/// Reads every daemon's counters (node 0 is the source of a broadcast).
pub(super) fn snapshot(clients: &[Client]) -> Result<Snapshot, BenchError> {
    let mut total = Snapshot::default();
    for (node, client) in clients.iter().enumerate() {
        let c = client.metrics()?.counters;
        let p = &c.relay_pace;
        let t = &mut total.pace;
        t.announcements += p.announcements;
        t.stalls += p.stalls;
        t.stall_micros += p.stall_micros;
        t.reads += p.reads;
        t.reads_in_flight += p.reads_in_flight;
        t.read_bytes += p.read_bytes;
        t.failed_transfers += p.failed_transfers;
        t.refused_requests += p.refused_requests;
        total.relayed_transfers += c.relayed_transfers;
        if node == 0 {
            total.source_leases += c.served_rendezvous;
            total.redirects += c.relay_redirects;
        }
    }
    Ok(total)
}

/// One case's relay pace, per round.
#[derive(Debug, Clone, Serialize)]
pub(super) struct PaceRow {
    pub(super) pattern: String,
    pub(super) size_bytes: u64,
    pub(super) rounds: usize,
    /// Leases the source granted (a copy sent by it each) per round.
    pub(super) source_serves: f64,
    /// Requests the source sent to a relay, per round.
    pub(super) redirects: f64,
    /// Transfers that pulled from a relay, per round, and those that failed.
    pub(super) relayed_transfers: f64,
    pub(super) failed_relayed_transfers: f64,
    /// Requests a relay refused per round, because its link was serving objects it holds
    /// (all-to-all): their readers went back to the holder.
    pub(super) refused_by_relays: f64,
    /// `RelayProgress` messages per relayed transfer, and bytes READ per announcement.
    pub(super) announcements_per_transfer: f64,
    pub(super) bytes_per_announcement: f64,
    /// Times a reader ran dry (all announced bytes read, none in flight) per relayed
    /// transfer, and the mean wait, µs.
    pub(super) stalls_per_transfer: f64,
    pub(super) mean_stall_us: f64,
    /// Mean READs a reader had in flight when one of them completed.
    pub(super) mean_reads_in_flight: f64,
}

/// The pace between `before` and `after`, over `rounds` Skyriver rounds.
pub(super) fn row(
    (pattern, size_bytes): (&str, u64),
    rounds: usize,
    before: &Snapshot,
    after: &Snapshot,
) -> PaceRow {
    let (b, a) = (&before.pace, &after.pace);
    let per = |x: u64, y: u64| x as f64 / y.max(1) as f64;
    let relayed = after.relayed_transfers - before.relayed_transfers;
    let stalls = a.stalls - b.stalls;
    let announcements = a.announcements - b.announcements;
    PaceRow {
        pattern: pattern.into(),
        size_bytes,
        rounds,
        source_serves: per(after.source_leases - before.source_leases, rounds as u64),
        redirects: per(after.redirects - before.redirects, rounds as u64),
        relayed_transfers: per(relayed, rounds as u64),
        failed_relayed_transfers: per(a.failed_transfers - b.failed_transfers, rounds as u64),
        refused_by_relays: per(a.refused_requests - b.refused_requests, rounds as u64),
        announcements_per_transfer: per(announcements, relayed),
        bytes_per_announcement: per(a.read_bytes - b.read_bytes, announcements),
        stalls_per_transfer: per(stalls, relayed),
        mean_stall_us: per(a.stall_micros - b.stall_micros, stalls),
        mean_reads_in_flight: per(a.reads_in_flight - b.reads_in_flight, a.reads - b.reads),
    }
}

/// Prints the cases that relayed anything.
pub(super) fn print(rows: &[PaceRow]) {
    if rows
        .iter()
        .all(|r| r.relayed_transfers == 0.0 && r.redirects == 0.0 && r.refused_by_relays == 0.0)
    {
        return;
    }
    println!("relay pace (Skyriver rounds; per round, or per relayed transfer):");
    println!(
        "{:<11} {:>9} {:>8} {:>9} {:>8} {:>7} {:>7} {:>9} {:>10} {:>8} {:>9} {:>8}",
        "pattern",
        "size",
        "src serv",
        "redirects",
        "relayed",
        "failed",
        "refused",
        "announce",
        "B/announce",
        "stalls",
        "stall µs",
        "in flight"
    );
    for r in rows {
        println!(
            "{:<11} {:>9} {:>8.1} {:>9.1} {:>8.1} {:>7.1} {:>7.1} {:>9.1} {:>10.0} {:>8.1} {:>9.0} {:>8.1}",
            r.pattern,
            skyriver_daemon::size::format_bytes(r.size_bytes),
            r.source_serves,
            r.redirects,
            r.relayed_transfers,
            r.failed_relayed_transfers,
            r.refused_by_relays,
            r.announcements_per_transfer,
            r.bytes_per_announcement,
            r.stalls_per_transfer,
            r.mean_stall_us,
            r.mean_reads_in_flight
        );
    }
    println!();
}
