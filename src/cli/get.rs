//! `skyriver get`: write an object's bytes to a file or standard output.

#[allow(unused_imports)]
use super::*;

pub(super) fn get(
    socket: &SocketArg,
    id: ObjectId,
    output: Option<PathBuf>,
    timeout_ms: u64,
) -> Result<(), CliError> {
    let client = socket.connect()?;
    let object = client.get_one(id, Some(Duration::from_millis(timeout_ms)))?;
    let data = object.data();
    match output {
        Some(path) => {
            let mut file = std::fs::File::create(&path).map_err(file_error("create", &path))?;
            let bar = progress_bar(data.len() as u64);
            for chunk in data.chunks(8 << 20) {
                file.write_all(chunk).map_err(file_error("write", &path))?;
                bar.inc(chunk.len() as u64);
            }
            bar.finish_and_clear();
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(data)
                .and_then(|()| stdout.flush())
                .map_err(stdout_error)?;
        }
    }
    Ok(())
}

/// A failed write to standard output: quiet when the reader closed it, else an error.
pub(super) fn stdout_error(error: std::io::Error) -> CliError {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        stdout_closed();
    }
    CliError::Stdout(error)
}
