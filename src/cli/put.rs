//! `skyriver put`: store a file or standard input as one object.

#[allow(unused_imports)]
use super::*;

pub(super) const PROGRESS_MIN_BYTES: u64 = 64 << 20;

pub(super) fn progress_bar(total: u64) -> ProgressBar {
    if total < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bytes}/{total_bytes} [{bar:40}] {bytes_per_sec} eta {eta}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar
}

pub(super) fn put(
    socket: &SocketArg,
    input: &PathBuf,
    id: Option<ObjectId>,
    metadata: &[u8],
    replicas: skyriver_client::ReplicaPolicy,
) -> Result<(), CliError> {
    // The daemon's default and no wait: a plain put, which any daemon understands (and gives
    // its --replicas).
    let replicated = replicas != skyriver_client::ReplicaPolicy::default();
    let client = socket.connect()?;
    let id = id.unwrap_or_else(|| client.new_object_id());
    let (mut reader, size): (Box<dyn Read>, u64) = if input.as_os_str() == "-" {
        stage_whole(std::io::stdin(), "standard input")?
    } else {
        let file = std::fs::File::open(input).map_err(file_error("open", input))?;
        let meta = file.metadata().map_err(file_error("stat", input))?;
        if meta.is_dir() {
            return Err(CliError::IsDirectory(input.clone()));
        }
        if meta.is_file() {
            (Box::new(file), meta.len())
        } else {
            // A pipe, FIFO, character device or socket (`<(cmd)`, /dev/stdin): its size is
            // not known in advance, so read it whole first.
            stage_whole(file, &input.display().to_string())?
        }
    };
    if size + metadata.len() as u64 <= MAX_INLINE_PUT_BYTES as u64 {
        // Small: the bytes travel in the request, one round trip.
        let mut data = vec![0u8; size as usize];
        read_input_into(&mut reader, &mut data, input)?;
        if replicated {
            client.put_replicated(id, &data, metadata, replicas)?;
        } else {
            client.put(id, &data, metadata)?;
        }
    } else {
        let mut writer = client.create(id, size, metadata.len() as u64)?;
        writer.metadata_mut().copy_from_slice(metadata);
        read_input_into(&mut reader, writer.data_mut(), input)?;
        if replicated {
            writer.seal_replicated(replicas)?;
        } else {
            writer.seal()?;
        }
    }
    println!("{id}");
    Ok(())
}

/// Fills `data` from `reader` (the whole of `input`, with a progress bar), refusing an input
/// that shrank or grew while being read.
pub(super) fn read_input_into(
    reader: &mut dyn Read,
    data: &mut [u8],
    input: &Path,
) -> Result<(), CliError> {
    let size = data.len();
    let bar = progress_bar(size as u64);
    let mut filled = 0;
    while filled < data.len() {
        let chunk_end = (filled + (8 << 20)).min(data.len());
        let n = reader
            .read(&mut data[filled..chunk_end])
            .map_err(|source| CliError::Read {
                what: input.display().to_string(),
                source,
            })?;
        if n == 0 {
            return Err(CliError::InputShrank {
                path: input.to_path_buf(),
                filled,
                size,
            });
        }
        filled += n;
        bar.set_position(filled as u64);
    }
    bar.finish_and_clear();
    // A regular file that grew while being read would be stored cut short: refuse instead.
    let mut probe = [0u8; 1];
    if matches!(reader.read(&mut probe), Ok(n) if n > 0) {
        return Err(CliError::InputGrew {
            path: input.to_path_buf(),
            size,
        });
    }
    Ok(())
}

/// Reads an input of unknown length whole, to create an object of the right size.
pub(super) fn stage_whole(
    mut input: impl Read,
    what: &str,
) -> Result<(Box<dyn Read>, u64), CliError> {
    let mut data = Vec::new();
    input
        .read_to_end(&mut data)
        .map_err(|source| CliError::Read {
            what: what.to_string(),
            source,
        })?;
    let size = data.len() as u64;
    Ok((Box::new(std::io::Cursor::new(data)), size))
}
