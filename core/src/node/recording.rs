//! The format of a node's recorded run (`skyriver daemon --record`, `skyriver sim --replay`):
//! pure encoding and decoding here, the files are the drivers' business.
//!
//! A record is [`RECORD_MAGIC`], then frames: a little-endian `u32` length and that many bytes
//! of postcard. The first frame is a [`RecordHeader`] (what rebuilds the node), every other a
//! [`RecordEntry`]: an input with its time, or a digest of an output the node gave, in the
//! order they happened. Times are offsets from the node's start, so a replay starts at zero.

use serde::{Deserialize, Serialize};

use super::{NodeConfig, NodeInput, NodeOutput};
use crate::ids::NodeId;
use crate::time::Instant;

/// The first bytes of a record file.
pub const RECORD_MAGIC: [u8; 8] = *b"SKYRREC\n";

/// The version of the format this build writes and reads.
pub const RECORD_VERSION: u32 = 1;

/// What rebuilds the recorded node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordHeader {
    /// [`RECORD_VERSION`] of the writer.
    pub version: u32,
    /// The node.
    pub node: NodeId,
    /// 0 for the file that starts with the node's start; one more for each file a rotation
    /// began since (such a file starts mid-run and cannot rebuild the node on its own).
    pub segment: u64,
    /// The node's configuration, as given to [`Node::new`](super::Node::new).
    pub config: NodeConfig,
    /// The `now` the node was created at.
    pub started_at: Instant,
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RecordEntry<'a> {
    /// An input given to the node at `at`.
    Input {
        /// Its time.
        at: Instant,
        /// Fed by the [`drive_host`](super::drive_host) loop (an answer of the driver or a due timer),
        /// not by the driver's own loop: a replay feeds it at the same point of its drive.
        from_drive: bool,
        /// The input.
        #[serde(borrow)]
        input: NodeInput<'a>,
    },
    /// An output the node gave (after the inputs before it).
    Output {
        /// [`NodeOutput::kind`].
        kind: &'a str,
        /// [`output_digest`] of the output.
        digest: u64,
    },
    /// The writer fell behind and this many entries were dropped here: what follows no longer
    /// replays exactly.
    Dropped {
        /// Entries lost.
        entries: u64,
    },
}

/// Why bytes are not a record this build can read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file does not start with [`RECORD_MAGIC`].
    #[error("not a skyriver record (bad magic)")]
    BadMagic,
    /// Written by another version of the format.
    #[error("record version {found}, this build reads version {RECORD_VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// A frame runs past the end of the file (a write cut short, as when the daemon was
    /// killed); the frames before it are sound.
    #[error("frame at byte {offset} is cut short")]
    Truncated {
        /// Where the frame starts.
        offset: usize,
    },
    /// A value does not encode (a bug).
    #[error("a record entry does not encode")]
    Encode(#[source] postcard::Error),
    /// A frame does not decode.
    #[error("frame at byte {offset} does not decode")]
    Decode {
        /// Where the frame starts.
        offset: usize,
        /// Why.
        #[source]
        source: postcard::Error,
    },
}

/// The name of a record's finished segment `segment`: `FILE.segment` next to `FILE` (the
/// segment being written). A replay of segment N needs segments 0 to N - 1 under these names.
pub fn segment_path(record: &std::path::Path, segment: u64) -> std::path::PathBuf {
    let mut path = record.as_os_str().to_owned();
    path.push(format!(".{segment}"));
    std::path::PathBuf::from(path)
}

/// A digest of an output, to compare a replay's outputs with the recorded run's without
/// storing them: a hash of its debug form (every field, in order).
pub fn output_digest(output: &NodeOutput) -> u64 {
    twox_hash::XxHash3_64::oneshot(format!("{output:?}").as_bytes())
}

/// Appends one frame holding `value` to `out`.
pub fn encode_frame<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), RecordError> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut body = postcard::to_extend(value, std::mem::take(out)).map_err(RecordError::Encode)?;
    let len = (body.len() - start - 4) as u32;
    body[start..start + 4].copy_from_slice(&len.to_le_bytes());
    *out = body;
    Ok(())
}

/// The magic and the header frame that start a record file.
pub fn encode_start(header: &RecordHeader) -> Result<Vec<u8>, RecordError> {
    let mut out = RECORD_MAGIC.to_vec();
    encode_frame(header, &mut out)?;
    Ok(out)
}

/// A whole record file: its header and its entries, borrowing from `bytes`. A last frame cut
/// short (the writer was killed mid-write) ends the entries: `truncated` says so.
#[derive(Debug)]
pub struct DecodedRecord<'a> {
    /// The header.
    pub header: RecordHeader,
    /// The entries, in order.
    pub entries: Vec<RecordEntry<'a>>,
    /// The file ended inside a frame.
    pub truncated: bool,
}

/// Decodes a record file.
pub fn decode_record(bytes: &[u8]) -> Result<DecodedRecord<'_>, RecordError> {
    let rest = bytes
        .strip_prefix(&RECORD_MAGIC[..])
        .ok_or(RecordError::BadMagic)?;
    let offset = RECORD_MAGIC.len();
    let mut frames = Frames {
        bytes: rest,
        offset,
    };
    let Some(first) = frames.next() else {
        return Err(RecordError::Truncated { offset });
    };
    let (at, body) = first?;
    // The version comes first in the header: read it alone, so another version's header is
    // reported as such rather than as garbage.
    let (version, _) = postcard::take_from_bytes::<u32>(body)
        .map_err(|source| RecordError::Decode { offset: at, source })?;
    if version != RECORD_VERSION {
        return Err(RecordError::Version { found: version });
    }
    let header: RecordHeader =
        postcard::from_bytes(body).map_err(|source| RecordError::Decode { offset: at, source })?;
    let mut entries = Vec::new();
    let mut truncated = false;
    for frame in frames.by_ref() {
        match frame {
            Ok((at, body)) => entries.push(
                postcard::from_bytes(body)
                    .map_err(|source| RecordError::Decode { offset: at, source })?,
            ),
            Err(RecordError::Truncated { .. }) => {
                truncated = true;
                break;
            }
            Err(other) => return Err(other),
        }
    }
    Ok(DecodedRecord {
        header,
        entries,
        truncated,
    })
}

/// The frames of a record, each with its offset in the file.
struct Frames<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<(usize, &'a [u8]), RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.bytes.is_empty() {
            return None;
        }
        let at = self.offset;
        let Some((len, rest)) = self.bytes.split_first_chunk::<4>() else {
            self.bytes = &[];
            return Some(Err(RecordError::Truncated { offset: at }));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            self.bytes = &[];
            return Some(Err(RecordError::Truncated { offset: at }));
        }
        let (body, rest) = rest.split_at(len);
        self.bytes = rest;
        self.offset += 4 + len;
        Some(Ok((at, body)))
    }
}
