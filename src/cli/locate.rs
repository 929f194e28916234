//! `skyriver locate`: where an object lives: every copy, with its node's failure domain.

#[allow(unused_imports)]
use super::*;

pub(super) fn locate(socket: &SocketArg, id: ObjectId) -> Result<(), CliError> {
    let client = socket.connect()?;
    let skyriver_client::ObjectLocation { digest, .. } = client.locate(id)?;
    let skyriver_client::ObjectCopies {
        copies,
        wanted,
        sizes,
    } = client.locate_copies(id)?;
    if copies.is_empty() {
        return Err(CliError::NotHeld(id));
    }
    let digest = digest.map_or_else(String::new, |d| format!("  digest {d}"));
    let wanted = wanted.map_or_else(String::new, |k| {
        format!("  {} of {k} copies", copies.len().min(usize::from(k)))
    });
    match sizes {
        Some((data, metadata)) => println!(
            "{id}  {} + {} metadata{digest}{wanted}",
            format_bytes(data),
            format_bytes(metadata),
        ),
        None => println!("{id}{digest}{wanted}"),
    }
    for copy in copies {
        let domain = if copy.failure_domain.is_empty() {
            "-".to_string()
        } else {
            copy.failure_domain
        };
        println!("  {}  domain {domain}", copy.node);
    }
    Ok(())
}
