//! `skyriver fetch`: bring objects from other nodes.

#[allow(unused_imports)]
use super::*;

pub(super) fn fetch(
    socket: &SocketArg,
    ids: &[ObjectId],
    output: Option<PathBuf>,
    timeout_ms: u64,
    mode: TransferMode,
    wait: bool,
    from: Option<NodeId>,
) -> Result<(), CliError> {
    if output.is_some() && ids.len() != 1 {
        return Err(CliError::OutputNeedsOneId);
    }
    let client = socket.connect()?;
    let started = std::time::Instant::now();
    let options = FetchOptions {
        mode,
        wait_for_publication: wait,
        hint: from,
    };
    let timeout = Some(Duration::from_millis(timeout_ms));
    let results = client.fetch_with_options(ids, timeout, options, &mut || false)?;
    let elapsed = started.elapsed();
    let mut failed = 0;
    for (id, result) in ids.iter().zip(&results) {
        match result {
            Ok(object) => {
                if output.is_none() {
                    println!("{id}  {}", format_bytes(object.data().len() as u64));
                }
            }
            Err(error) => {
                failed += 1;
                eprintln!("skyriver: {error}");
            }
        }
    }
    if let (Some(path), Some(Ok(object))) = (&output, results.first()) {
        if path.as_os_str() == "-" {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(object.data())
                .and_then(|()| stdout.flush())
                .map_err(stdout_error)?;
        } else {
            std::fs::write(path, object.data()).map_err(file_error("write", path))?;
        }
    }
    let bytes: u64 = results
        .iter()
        .flatten()
        .map(|o| o.data().len() as u64)
        .sum();
    eprintln!(
        "fetched {} of {} objects, {} in {elapsed:.1?}",
        results.len() - failed,
        ids.len(),
        format_bytes(bytes)
    );
    if failed > 0 {
        return Err(CliError::SomeFailed {
            failed,
            total: ids.len(),
            what: "fetches",
        });
    }
    Ok(())
}

/// A node as `skyriver nodes` shows it (`node-3`), or its bare number.
pub(super) fn parse_node(text: &str) -> Result<NodeId, String> {
    let number = text.strip_prefix("node-").unwrap_or(text);
    number
        .parse::<u32>()
        .map(NodeId)
        .map_err(|_| format!("{text:?} is not a node (node-N or N)"))
}
