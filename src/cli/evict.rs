//! `skyriver evict`: free memory by evicting unheld objects.

#[allow(unused_imports)]
use super::*;

pub(super) fn evict(socket: &SocketArg, size: ByteSize) -> Result<(), CliError> {
    let client = socket.connect()?;
    let outcome = client.evict(size.0)?;
    println!(
        "evicted {} objects, {}",
        outcome.objects,
        format_bytes(outcome.bytes)
    );
    if outcome.bytes < size.0 {
        let left = client.stats()?;
        if left.object_count == 0 {
            // Nothing more to free: all the memory is free.
            println!(
                "the store is empty: all {} is free",
                format_bytes(left.capacity_bytes)
            );
            return Ok(());
        }
        // Scripts asking for room must not take "freed less" for success.
        return Err(CliError::FreedLess {
            freed: format_bytes(outcome.bytes),
            asked: format_bytes(size.0),
        });
    }
    Ok(())
}
