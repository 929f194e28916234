//! `skyriver ls`: the store's objects.

#[allow(unused_imports)]
use super::*;

pub(super) fn list(socket: &SocketArg, json: bool) -> Result<(), CliError> {
    let client = socket.connect()?;
    let objects = client.list()?;
    if json {
        let rows: Vec<serde_json::Value> = objects
            .iter()
            .map(|o| {
                serde_json::json!({
                    "id": o.info.id.to_string(),
                    "data_size": o.info.data_size,
                    "metadata_size": o.info.metadata_size,
                    "sealed": o.sealed,
                    "ref_count": o.ref_count,
                    "pin_count": o.pin_count,
                    "delete_pending": o.delete_pending,
                    "tier": o.tier.name(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("JSON values serialize")
        );
        return Ok(());
    }
    println!(
        "{:<40}  {:>10}  {:>8}  {:<8}  {:>4}",
        "ID", "SIZE", "META", "STATE", "REFS"
    );
    for o in &objects {
        use skyriver_core::store::StorageTier;
        let state = match (o.sealed, o.delete_pending, o.tier) {
            (_, _, StorageTier::Restoring) => "restoring",
            (false, _, _) => "writing",
            (true, true, _) => "deleting",
            (true, false, StorageTier::Spilled) => "spilled",
            (true, false, StorageTier::Spilling) => "spilling",
            (true, false, StorageTier::Memory) => "sealed",
        };
        println!(
            "{:<40}  {:>10}  {:>8}  {:<8}  {:>4}",
            o.info.id.to_string(),
            format_bytes(o.info.data_size),
            format_bytes(o.info.metadata_size),
            state,
            o.ref_count
        );
    }
    let total: u64 = objects.iter().map(|o| o.info.region.len).sum();
    println!("{} objects, {}", objects.len(), format_bytes(total));
    Ok(())
}
