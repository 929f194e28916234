//! `skyriver evict`: free memory by evicting unheld objects.

#[allow(unused_imports)]
use super::*;

pub(super) fn evict(socket: &SocketArg, size: ByteSize) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let outcome = client.evict(size.0).map_err(|e| e.to_string())?;
    println!(
        "evicted {} objects, {}",
        outcome.objects,
        format_bytes(outcome.bytes)
    );
    if outcome.bytes < size.0 {
        let left = client.stats().map_err(|e| e.to_string())?;
        if left.object_count == 0 {
            // Nothing more to free: all the memory is free.
            println!(
                "the store is empty: all {} is free",
                format_bytes(left.capacity_bytes)
            );
            return Ok(());
        }
        // Scripts asking for room must not take "freed less" for success.
        return Err(format!(
            "freed {} of the {} asked: every other object is in use, unsealed or pinned by a \
             transfer",
            format_bytes(outcome.bytes),
            format_bytes(size.0)
        ));
    }
    Ok(())
}
