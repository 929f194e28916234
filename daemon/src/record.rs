//! `skyriver daemon --record FILE`: every input the loop gives its node, with its time (as
//! an offset from the node's start), and a digest of every output the node gives back, in the
//! format of [`skyriver_core::node::recording`]; `skyriver sim --replay FILE` runs them again.
//!
//! Off the loop's hot path: the loop encodes an entry and hands it to a writer thread through
//! a bounded channel, never waiting. When the writer falls behind, entries are dropped and
//! counted, and the record says where (a [`RecordEntry::Dropped`]). A file is bounded: past
//! `max_bytes` segment N moves to `FILE.N` and a new `FILE` starts, with the header again and
//! segment number N + 1.
//!
//! Every segment is kept: a later segment starts mid-run, and only the chain from segment 0
//! rebuilds the node's state (`skyriver sim --replay FILE` finds `FILE.0` … `FILE.N-1` next
//! to it, and names the one missing). Self-contained segments would need a snapshot of the
//! node's whole state (store, leases, transfers, directory sessions) at each rotation, which
//! the core cannot yet serialize. So the record stays bounded by stopping instead: after
//! [`MAX_SEGMENTS`] files recording ends (logged), and what was written replays.
//!
//! Inputs are recorded as they are, an eager chunk's payload included (bounded by the eager
//! limit): a record holds the objects' bytes that crossed the wire eagerly, and the requests
//! of local clients (small puts carry their data).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::thread::JoinHandle;

use skyriver_core::node::recording::{
    encode_frame, encode_start, output_digest, segment_path, RecordEntry, RecordError,
    RecordHeader, RECORD_VERSION,
};
use skyriver_core::node::{Node, NodeInput};
use skyriver_core::{Instant, NodeOutput};
use tracing::warn;

/// Entries the channel to the writer holds before the loop drops them.
const QUEUE_ENTRIES: usize = 64 * 1024;

/// Segment files one record may have: at most this many times `max_bytes` on disk.
pub const MAX_SEGMENTS: u64 = 64;

/// Where and how much to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordConfig {
    /// The record file (its finished segments go to `FILE.0`, `FILE.1`, …).
    pub path: PathBuf,
    /// Bytes one file may reach before it rotates.
    pub max_bytes: u64,
}

/// Why recording could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordStartError {
    /// The file could not be created.
    #[error("cannot create the record file {path}")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the record writer thread")]
    Thread(#[source] std::io::Error),
    /// The header does not encode (a bug).
    #[error("cannot encode the record header")]
    Encode(#[source] RecordError),
}

/// The loop's end of a recording.
pub(super) struct Recorder {
    entries: Option<SyncSender<Vec<u8>>>,
    /// Entries dropped since the last one that got through (said in the record next).
    dropped_since: u64,
    /// Entries dropped in all.
    dropped_total: u64,
    writer: Option<JoinHandle<()>>,
}

impl Recorder {
    /// Creates the file, writes the header (what rebuilds `node`) and starts the writer.
    pub(super) fn start(config: &RecordConfig, node: &Node) -> Result<Self, RecordStartError> {
        let header = RecordHeader {
            version: RECORD_VERSION,
            node: node.id(),
            segment: 0,
            config: node.config().clone(),
            started_at: Instant::ZERO,
        };
        let file = Segment::create(&config.path, &header)?;
        let (entries, queue) = mpsc::sync_channel(QUEUE_ENTRIES);
        let writer = Writer {
            path: config.path.clone(),
            max_bytes: config.max_bytes,
            header,
            file,
        };
        let writer = std::thread::Builder::new()
            .name("skyriver-record".into())
            .spawn(move || writer.run(queue))
            .map_err(RecordStartError::Thread)?;
        Ok(Self {
            entries: Some(entries),
            dropped_since: 0,
            dropped_total: 0,
            writer: Some(writer),
        })
    }

    /// An input given to the node at `at`; `from_drive` when the drive loop fed it.
    pub(super) fn input(&mut self, at: Instant, from_drive: bool, input: &NodeInput<'_>) {
        self.push(&RecordEntry::Input {
            at,
            from_drive,
            input: input.clone(),
        });
    }

    /// An output the node gave.
    pub(super) fn output(&mut self, output: &NodeOutput) {
        self.push(&RecordEntry::Output {
            kind: output.kind(),
            digest: output_digest(output),
        });
    }

    fn push(&mut self, entry: &RecordEntry<'_>) {
        if self.dropped_since > 0 {
            let gap = RecordEntry::Dropped {
                entries: self.dropped_since,
            };
            if !self.send(&gap) {
                self.dropped_since += 1;
                self.dropped_total += 1;
                return;
            }
            self.dropped_since = 0;
        }
        if !self.send(entry) {
            self.dropped_since += 1;
            self.dropped_total += 1;
        }
    }

    /// Whether the entry reached the writer's queue.
    fn send(&mut self, entry: &RecordEntry<'_>) -> bool {
        let Some(entries) = &self.entries else {
            return false;
        };
        let mut frame = Vec::new();
        if let Err(error) = encode_frame(entry, &mut frame) {
            warn!(%error, "an entry of the record does not encode: dropped");
            return false;
        }
        match entries.try_send(frame) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => false,
            Err(TrySendError::Disconnected(_)) => {
                // The writer stopped (it logged why): recording is over.
                self.entries = None;
                false
            }
        }
    }
}

impl Drop for Recorder {
    /// Lets the writer write what is queued, then waits for it.
    fn drop(&mut self) {
        self.entries = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        if self.dropped_total > 0 {
            warn!(
                dropped = self.dropped_total,
                "the record writer fell behind: entries were dropped (the record says where)"
            );
        }
    }
}

/// One file of the record, and how many bytes it holds.
struct Segment {
    out: BufWriter<File>,
    bytes: u64,
}

impl Segment {
    fn create(path: &Path, header: &RecordHeader) -> Result<Self, RecordStartError> {
        let start = encode_start(header).map_err(RecordStartError::Encode)?;
        let create = |source| RecordStartError::Create {
            path: path.to_owned(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(create)?);
        out.write_all(&start).map_err(create)?;
        out.flush().map_err(create)?;
        Ok(Self {
            out,
            bytes: start.len() as u64,
        })
    }
}

/// The writer thread's state.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    header: RecordHeader,
    file: Segment,
}

impl Writer {
    /// Writes frames until the loop's end goes away; flushes whenever the queue is empty, so
    /// the file is current while the daemon idles.
    fn run(mut self, queue: Receiver<Vec<u8>>) {
        loop {
            let frame = match queue.try_recv() {
                Ok(frame) => frame,
                Err(TryRecvError::Empty) => {
                    if let Err(error) = self.file.out.flush() {
                        warn!(%error, path = %self.path.display(), "record write failed: recording stops");
                        return;
                    }
                    match queue.recv() {
                        Ok(frame) => frame,
                        Err(_) => return,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            if let Err(error) = self.write(&frame) {
                warn!(%error, path = %self.path.display(), "record write failed: recording stops");
                return;
            }
        }
        if let Err(error) = self.file.out.flush() {
            warn!(%error, path = %self.path.display(), "record write failed");
        }
    }

    fn write(&mut self, frame: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
        if self.file.bytes + frame.len() as u64 > self.max_bytes
            && self.file.bytes > encode_start(&self.header)?.len() as u64
        {
            if self.header.segment + 1 >= MAX_SEGMENTS {
                return Err(format!(
                    "the record reached {MAX_SEGMENTS} files of at most {} bytes (every one is \
                     kept: a replay needs the whole chain)",
                    self.max_bytes
                )
                .into());
            }
            self.rotate()?;
        }
        self.file.out.write_all(frame)?;
        self.file.bytes += frame.len() as u64;
        Ok(())
    }

    /// `FILE` (segment N) becomes `FILE.N`; a new `FILE` starts with segment N + 1's header.
    fn rotate(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.file.out.flush()?;
        std::fs::rename(&self.path, segment_path(&self.path, self.header.segment))?;
        self.header.segment += 1;
        self.file = Segment::create(&self.path, &self.header)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use skyriver_core::node::recording::decode_record;
    use skyriver_core::{NodeConfig, NodeId};

    use super::*;

    fn node() -> Node {
        Node::new(NodeConfig::new(NodeId(4), 1 << 20), Instant::ZERO)
    }

    /// A file's segment, and the times of its entries (all timeouts).
    fn decode(path: &Path) -> (u64, Vec<u64>) {
        let bytes = std::fs::read(path).unwrap();
        let record = decode_record(&bytes).unwrap();
        assert!(!record.truncated);
        let times = record
            .entries
            .iter()
            .map(|entry| match entry {
                RecordEntry::Input {
                    at,
                    input: NodeInput::Timeout,
                    ..
                } => at.0,
                other => panic!("{other:?}"),
            })
            .collect();
        (record.header.segment, times)
    }

    fn timeout_at(at: u64) -> RecordEntry<'static> {
        RecordEntry::Input {
            at: Instant(at),
            from_drive: false,
            input: NodeInput::Timeout,
        }
    }

    #[test]
    fn a_full_file_becomes_its_numbered_segment_and_every_segment_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.rec");
        let config = RecordConfig {
            path: path.clone(),
            max_bytes: 4096,
        };
        let mut recorder = Recorder::start(&config, &node()).unwrap();
        for at in 0..2000 {
            recorder.input(Instant(at), false, &NodeInput::Timeout);
        }
        drop(recorder);
        let (last, newest) = decode(&path);
        assert!(last > 1, "2000 entries fill more than two files of 4 KiB");
        // The chain from segment 0 holds every entry, in order.
        let mut all = Vec::new();
        for segment in 0..last {
            let file = segment_path(&path, segment);
            let len = std::fs::metadata(&file).unwrap().len();
            assert!(len <= 4096, "{} holds {len} bytes", file.display());
            let (found, entries) = decode(&file);
            assert_eq!(found, segment, "{}", file.display());
            all.extend(entries);
        }
        all.extend(newest);
        assert_eq!(all, (0..2000).collect::<Vec<_>>());
    }

    #[test]
    fn recording_stops_rather_than_drop_a_segment_a_replay_needs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.rec");
        let config = RecordConfig {
            path: path.clone(),
            max_bytes: 256,
        };
        let mut recorder = Recorder::start(&config, &node()).unwrap();
        for at in 0..100_000 {
            recorder.input(Instant(at), false, &NodeInput::Timeout);
        }
        drop(recorder);
        let bytes = std::fs::read(&path).unwrap();
        let last = decode_record(&bytes).unwrap().header.segment;
        assert_eq!(last, MAX_SEGMENTS - 1);
        for segment in 0..last {
            assert!(
                segment_path(&path, segment).exists(),
                "segment {segment} is gone"
            );
        }
        assert!(!segment_path(&path, last).exists());
    }

    #[test]
    fn entries_the_writer_cannot_take_are_dropped_and_the_gap_recorded() {
        // A queue of two that nobody empties yet: the loop never waits on it.
        let (entries, queue) = mpsc::sync_channel(2);
        let mut recorder = Recorder {
            entries: Some(entries),
            dropped_since: 0,
            dropped_total: 0,
            writer: None,
        };
        for at in 0..5 {
            recorder.input(Instant(at), false, &NodeInput::Timeout);
        }
        assert_eq!(recorder.dropped_total, 3);
        let frames: Vec<Vec<u8>> = queue.try_iter().collect();
        assert_eq!(frames.len(), 2);
        // Room again: the gap is said first, then the entry.
        recorder.input(Instant(5), false, &NodeInput::Timeout);
        let mut file = skyriver_core::node::recording::encode_start(&RecordHeader {
            version: RECORD_VERSION,
            node: NodeId(4),
            segment: 0,
            config: NodeConfig::new(NodeId(4), 1 << 20),
            started_at: Instant::ZERO,
        })
        .unwrap();
        for frame in frames.into_iter().chain(queue.try_iter()) {
            file.extend_from_slice(&frame);
        }
        let record = decode_record(&file).unwrap();
        assert_eq!(
            record.entries,
            vec![
                timeout_at(0),
                timeout_at(1),
                RecordEntry::Dropped { entries: 3 },
                timeout_at(5)
            ]
        );
    }
}
