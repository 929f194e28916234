//! `skyriver watch`: seal and delete notifications as they happen.

#[allow(unused_imports)]
use super::*;

pub(super) fn watch(socket: &SocketArg, count: Option<u64>) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let subscription = client.subscribe().map_err(|e| e.to_string())?;
    eprintln!(
        "watching {} (Ctrl-C to stop)",
        client.socket_path().display()
    );
    let mut seen = 0u64;
    for event in subscription {
        seen += 1;
        let event = event.map_err(|e| {
            format!(
                "lost the daemon at {} after {} event(s): {e}",
                socket_name(&client),
                seen - 1
            )
        })?;
        match event {
            ObjectEvent::Sealed {
                id,
                data_size,
                metadata_size,
            } => println!(
                "sealed  {id}  {} + {} metadata",
                format_bytes(data_size),
                format_bytes(metadata_size)
            ),
            ObjectEvent::Deleted { id } => println!("deleted {id}"),
        }
        let _ = std::io::stdout().flush();
        if count.is_some_and(|count| seen >= count) {
            return Ok(());
        }
    }
    // The stream only ends when the daemon closes it: it stopped or died.
    Err(format!(
        "the daemon at {} closed the connection (stopped or died) after {seen} event(s)",
        socket_name(&client)
    ))
}

pub(super) fn socket_name(client: &Client) -> String {
    client.socket_path().display().to_string()
}
