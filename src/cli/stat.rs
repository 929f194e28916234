//! `skyriver stat`: the store's counters.

#[allow(unused_imports)]
use super::*;

pub(super) fn stat(socket: &SocketArg, json: bool) -> Result<(), CliError> {
    let client = socket.connect()?;
    let stats = client.stats()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&stats).expect("stats serialize")
        );
        return Ok(());
    }
    let percent = if stats.capacity_bytes == 0 {
        0.0
    } else {
        100.0 * stats.allocated_bytes as f64 / stats.capacity_bytes as f64
    };
    println!("node:        {}", client.node());
    println!("socket:      {}", client.socket_path().display());
    println!(
        "memory:      {} of {} used ({percent:.1}%), {} evictable",
        format_bytes(stats.allocated_bytes),
        format_bytes(stats.capacity_bytes),
        format_bytes(stats.evictable_bytes)
    );
    println!(
        "objects:     {} ({} sealed, {} being written)",
        stats.object_count,
        stats.sealed_count,
        stats.object_count - stats.sealed_count
    );
    println!(
        "clients:     {} connected, {} gets waiting",
        stats.client_count, stats.waiting_gets
    );
    println!(
        "since start: {} sealed, {} evicted ({})",
        stats.sealed_objects_total,
        stats.evicted_objects_total,
        format_bytes(stats.evicted_bytes_total)
    );
    let spill = &stats.spill;
    if spill.limit_bytes > 0 {
        println!(
            "spill tier:  {} objects ({}) on disk of {}, {} being written{}",
            spill.spilled_objects,
            format_bytes(spill.spilled_bytes),
            format_bytes(spill.limit_bytes),
            format_bytes(spill.spilling_bytes),
            if spill.full {
                " (full after a failed write: evicting)"
            } else {
                ""
            }
        );
        println!(
            "             {} spills, {} restores, {} lost ({} more at start), {} write failures, {} evicted when full",
            spill.spills_total,
            spill.restores_total,
            spill.objects_lost_total,
            spill.lost_at_start_total,
            spill.spill_no_space_total + spill.spill_errors_total,
            spill.evicted_spill_full_total
        );
    }
    Ok(())
}
