//! `skyriver locate`: where an object lives.

#[allow(unused_imports)]
use super::*;

pub(super) fn locate(socket: &SocketArg, id: ObjectId) -> Result<(), CliError> {
    let client = socket.connect()?;
    let skyriver_client::ObjectLocation {
        holders,
        sizes,
        digest,
    } = client.locate(id)?;
    if holders.is_empty() {
        return Err(CliError::NotHeld(id));
    }
    let names: Vec<String> = holders.iter().map(|n| n.to_string()).collect();
    let digest = digest.map_or_else(String::new, |d| format!("  digest {d}"));
    match sizes {
        Some((data, metadata)) => println!(
            "{id}  {} + {} metadata{digest}  on {}",
            format_bytes(data),
            format_bytes(metadata),
            names.join(", ")
        ),
        None => println!("{id}{digest}  on {}", names.join(", ")),
    }
    Ok(())
}
