//! `skyriver watch`: seal and delete notifications as they happen.

#[allow(unused_imports)]
use super::*;

pub(super) fn watch(socket: &SocketArg, count: Option<u64>) -> Result<(), CliError> {
    let client = socket.connect()?;
    let subscription = client.subscribe()?;
    eprintln!(
        "watching {} (Ctrl-C to stop)",
        client.socket_path().display()
    );
    let mut seen = 0u64;
    for event in subscription {
        seen += 1;
        let event = event.map_err(|source| CliError::DaemonLost {
            socket: client.socket_path().to_path_buf(),
            seen: seen - 1,
            source,
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
    Err(CliError::DaemonClosed {
        socket: client.socket_path().to_path_buf(),
        seen,
    })
}
