//! The spill tier on local disk (`--spill-dir DIR [--spill-limit SIZE]`): the IO side of the
//! core's `Spill`/`Restore`/`DiscardSpilled` outputs.
//!
//! The loop never touches the disk. It hands each job, with a view of the object's memory
//! (a [`ReadableRegion`] for a write, a [`WritableRegion`] for a restore, claimed on the loop
//! so the arena's claims table sees them), to a pool of IO threads through a bounded queue;
//! a full queue keeps the job in a backlog on the loop, sent as completions come back. The
//! threads report on a channel the loop selects on, and the loop feeds the core
//! `SpillDone`/`RestoreDone`.
//!
//! On disk:
//! * objects below [`LARGE_OBJECT_BYTES`] are packed into append-only segment files
//!   (`segment-N.spill`, rolled at [`SEGMENT_BYTES`]), each record a 64-byte header and the
//!   bytes; a discarded record gives back the whole span between its live neighbours with
//!   `fallocate(PUNCH_HOLE)` (records share blocks, so punching a record's own bytes alone
//!   would free nothing of small ones), and a segment with nothing live left (and not the one
//!   being appended to) is removed;
//! * larger objects get a file each (`large-N.spill`), a 4 KiB header then the bytes, written
//!   and read in [`CHUNK_BYTES`] chunks with `O_DIRECT` through an aligned buffer where the
//!   file system allows it (buffered IO otherwise), removed when discarded.
//!
//! Every record carries the object's content digest (the one it was published with; computed
//! from the bytes when unknown) and its header a checksum of its own: a restore whose header or
//! bytes do not match reports the object lost (`RestoreError::Damaged`), a missing file or
//! record `Missing`; the daemon goes on.
//!
//! Four IO threads take spill writes, large restores and discards; a large object of several
//! chunks is moved by up to [`LARGE_IO_PARALLELISM`] threads at once (see [`large_file`]).
//! Restores of small records have [`SMALL_READ_THREADS`] threads and a queue of their own, so
//! many random reads are in flight at once (see [`SpillIo`]). A small record's header and
//! bytes move in one `pwritev`/`preadv` on the segment's open file.
//!
//! Without `--backing-file`, spill files are a cache: at start every `*.spill` file in DIR is
//! removed. In persistent mode they are kept: each write is flushed (`fdatasync`, and the
//! directory when it made a file) before its completion, the store's index then records the
//! object's [`SpillPlace`] (file number, the top bit set for a large file, and the offset of
//! its record), and at restart [`check_recorded`] verifies each recorded record's header and
//! [`SpillIo::adopt`] takes the ones the store took back; files no record names are removed.

use std::collections::{BTreeMap, VecDeque};
mod group_sync;
mod large_file;

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skyriver_core::store::{RecoveredSpilled, RestoreError, SpillError, SpillOpId, SpillPlace};
use skyriver_core::{ContentDigest, NodeId, ObjectId};
use skyriver_transport::{ReadableRegion, WritableRegion};
use tokio::sync::mpsc;
use tracing::{info, warn};

use group_sync::GroupSync;
use large_file::{read_large_file, write_large_file, Bounce};
pub use large_file::{CHUNK_BYTES, LARGE_IO_PARALLELISM};

/// Objects from this size get a file of their own, written in aligned chunks.
pub const LARGE_OBJECT_BYTES: u64 = 1 << 20;
/// A segment file of small objects is closed for appends past this size.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Header of a record in a segment.
const SMALL_HEADER_BYTES: u64 = 64;
/// Jobs queued to the IO threads at most (more wait in the loop's backlog).
pub const JOB_QUEUE: usize = 256;
/// IO threads: several restores and spill writes in flight, so the device sees a queue.
pub const IO_THREADS: usize = 4;
/// Threads that only restore small records (below [`LARGE_OBJECT_BYTES`]), from a queue of
/// their own. A random read of a few KiB spends its time waiting for the device (about 65 µs
/// on a virtio disk), not the CPU: four threads keep four reads in flight and cap random 4 KiB
/// restores near 40k/s; sixteen keep the device's queue deep enough for more, and a burst of
/// small restores never waits behind a large object's chunks or a spill write.
pub const SMALL_READ_THREADS: usize = 16;
/// Completions waiting for the loop at most: an IO thread with a completion and no place
/// waits, and meanwhile takes no job, so the job queues fill and further jobs wait in the
/// loop's backlogs (bounded by the core's spill limits).
pub const COMPLETION_QUEUE: usize = 2 * JOB_QUEUE + IO_THREADS + SMALL_READ_THREADS;
const MAGIC: &[u8; 8] = b"SKYSPIL1";

/// How to run the spill tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillConfig {
    /// The directory the spill files go to.
    pub dir: PathBuf,
    /// Bytes the tier may hold; `None`: 90% of the space free on DIR's file system at start.
    pub limit_bytes: Option<u64>,
}

/// Why the spill directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpillStartError {
    /// DIR does not exist.
    #[error("spill directory {0} does not exist (create it first)")]
    Missing(PathBuf),
    /// DIR is something else.
    #[error("spill directory {0} is not a directory")]
    NotADirectory(PathBuf),
    /// DIR cannot be written.
    #[error("spill directory {dir} is not writable: {source}")]
    NotWritable {
        /// The directory.
        dir: PathBuf,
        /// The failed probe.
        #[source]
        source: std::io::Error,
    },
    /// Old spill files could not be removed.
    #[error("cannot clear old spill files in {dir}: {source}")]
    Clear {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The persistent store's index names spilled objects, and no spill directory was given.
    #[error(
        "the store's index names {objects} spilled objects: start with the --spill-dir they \
         were spilled to"
    )]
    SpilledWithoutDir {
        /// Spilled objects the index names.
        objects: u64,
    },
    /// `statvfs` of DIR failed.
    #[error("cannot read the free space of {dir}: {source}")]
    Statvfs {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: nix::Error,
    },
}

/// Checks DIR (exists, a directory, writable; a warning when it is on tmpfs: spilling memory
/// into memory), makes this node's own directory in it (`DIR/node-N`, so daemons of one
/// cluster may share DIR) and, unless `persistent` (then [`SpillIo::adopt`] removes only the
/// files no record names), removes old spill files there; returns the limit to give the store
/// and the directory the files go to.
pub fn prepare(
    config: &SpillConfig,
    node: NodeId,
    persistent: bool,
) -> Result<(u64, PathBuf), SpillStartError> {
    let dir = &config.dir;
    let meta = std::fs::metadata(dir).map_err(|_| SpillStartError::Missing(dir.clone()))?;
    if !meta.is_dir() {
        return Err(SpillStartError::NotADirectory(dir.clone()));
    }
    let probe = dir.join(".skyriver-spill-probe");
    File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|source| SpillStartError::NotWritable {
            dir: dir.clone(),
            source,
        })?;
    if let Ok(fs) = nix::sys::statfs::statfs(dir) {
        if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
            warn!(
                dir = %dir.display(),
                "the spill directory is on tmpfs: spilled objects still take memory"
            );
        }
    }
    let dir = &dir.join(format!("node-{}", node.0));
    std::fs::create_dir_all(dir).map_err(|source| SpillStartError::NotWritable {
        dir: dir.clone(),
        source,
    })?;
    let mut removed = 0u64;
    let entries = std::fs::read_dir(dir).map_err(|source| SpillStartError::Clear {
        dir: dir.clone(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if !persistent && path.extension().is_some_and(|e| e == "spill") {
            std::fs::remove_file(&path).map_err(|source| SpillStartError::Clear {
                dir: dir.clone(),
                source,
            })?;
            removed += 1;
        }
    }
    let limit = match config.limit_bytes {
        Some(limit) => limit,
        None => {
            let vfs =
                nix::sys::statvfs::statvfs(dir).map_err(|source| SpillStartError::Statvfs {
                    dir: dir.clone(),
                    source,
                })?;
            let free = vfs.blocks_available() as u64 * vfs.fragment_size() as u64;
            // Persistent mode: the files kept hold objects the limit must still take.
            let kept: u64 = if persistent {
                existing_files(dir)
                    .iter()
                    .filter_map(|(_, _, path)| std::fs::metadata(path).ok())
                    .map(|meta| meta.len())
                    .sum()
            } else {
                0
            };
            (free + kept) / 10 * 9
        }
    };
    info!(
        dir = %dir.display(),
        limit = %crate::size::format_bytes(limit),
        old_files_removed = removed,
        "spill tier ready"
    );
    Ok((limit, dir.clone()))
}

/// A finished job, for the loop to feed the node.
#[derive(Debug)]
pub enum SpillCompletion {
    /// A spill write finished.
    Spilled {
        /// The write.
        op: SpillOpId,
        /// How it went: where the record is.
        result: Result<SpillPlace, SpillError>,
        /// How long it took.
        elapsed: Duration,
        /// Bytes written.
        bytes: u64,
    },
    /// A restore finished.
    Restored {
        /// The record.
        op: SpillOpId,
        /// How it went.
        result: Result<(), RestoreError>,
        /// How long it took.
        elapsed: Duration,
        /// Bytes read.
        bytes: u64,
    },
    /// A record was removed. Nothing for the node to hear; the loop moves queued jobs on, as
    /// after every completion (without it, a backlog of discards would never drain, and jobs
    /// queued behind it would wait forever).
    Discarded {
        /// The record.
        op: SpillOpId,
    },
}

enum Job {
    Spill {
        op: SpillOpId,
        object: ObjectId,
        view: ReadableRegion,
        digest: Option<ContentDigest>,
    },
    Restore {
        op: SpillOpId,
        view: WritableRegion,
        digest: Option<ContentDigest>,
    },
    Discard {
        op: SpillOpId,
    },
    /// A failure known at once: an IO thread hands it back like any completion, so every
    /// completion comes from a thread that may wait, never from the loop.
    Failed(SpillCompletion),
}

/// Where a record is.
#[derive(Debug, Clone, Copy)]
struct Location {
    file: u64,
    /// Offset of the header.
    offset: u64,
    len: u64,
    large: bool,
    /// The object its header names.
    object: ObjectId,
}

/// The bit of [`SpillPlace::file`] that marks a large object's file.
const LARGE_FILE_BIT: u32 = 1 << 31;

impl Location {
    /// The place the store records; `None` past the file numbers a place can name.
    fn place(&self) -> Option<SpillPlace> {
        let file = u32::try_from(self.file)
            .ok()
            .filter(|f| f & LARGE_FILE_BIT == 0)?;
        Some(SpillPlace {
            file: if self.large {
                file | LARGE_FILE_BIT
            } else {
                file
            },
            offset: self.offset,
        })
    }

    fn of_place(place: SpillPlace, object: ObjectId, len: u64) -> Self {
        Location {
            file: u64::from(place.file & !LARGE_FILE_BIT),
            offset: place.offset,
            len,
            large: place.file & LARGE_FILE_BIT != 0,
            object,
        }
    }
}

#[derive(Debug)]
struct Segment {
    file: Arc<File>,
    /// Persistent mode: the flushes of its appends, shared by writes finishing together.
    sync: Arc<GroupSync>,
    /// End of the last record reserved.
    end: u64,
    /// The records reserved or written and not discarded: offset → length with the header.
    /// A discard gives back the whole span between its live neighbours, so the file system
    /// frees every block no live record touches, even where records share blocks.
    live: BTreeMap<u64, u64>,
}

impl Segment {
    /// Removes the record at `offset` and returns the span it leaves free: from the end of the
    /// live record before it (or the start of the file) to the start of the one after it (or
    /// the end reserved so far).
    fn remove(&mut self, offset: u64) -> Option<std::ops::Range<u64>> {
        self.live.remove(&offset)?;
        let start = self
            .live
            .range(..offset)
            .next_back()
            .map_or(0, |(&at, &len)| at + len);
        let end = self
            .live
            .range(offset..)
            .next()
            .map_or(self.end, |(&at, _)| at);
        Some(start..end)
    }
}

/// The records and files of the tier, shared by the IO threads.
#[derive(Debug, Default)]
struct Index {
    records: BTreeMap<SpillOpId, Location>,
    segments: BTreeMap<u64, Segment>,
    /// The segment appended to now.
    current: Option<u64>,
    next_file: u64,
}

/// A record's place at the end of a segment, reserved by [`Disk::reserve`].
struct Reserved {
    file_id: u64,
    file: Arc<File>,
    sync: Arc<GroupSync>,
    offset: u64,
    /// The segment was made for it (its name must be made durable).
    new_file: bool,
}

struct Disk {
    dir: PathBuf,
    index: Mutex<Index>,
    /// Persistent mode: every write is flushed before its completion.
    durable: bool,
    /// Persistent mode: flushes of the directory (new files' names), shared likewise.
    dir_sync: GroupSync,
    /// Tests: holds reads back to see how many run at once.
    #[cfg(test)]
    read_gate: tests::ReadGate,
}

/// A pool of IO threads as the loop sees it: their bounded job queue, and the jobs waiting
/// on the loop for room in it.
struct Lane {
    jobs: Option<SyncSender<Job>>,
    backlog: VecDeque<Job>,
}

impl Lane {
    /// Starts `threads` IO threads named `name-N` on a queue of their own.
    fn start(
        name: &str,
        threads: usize,
        disk: &Arc<Disk>,
        done: &mpsc::Sender<SpillCompletion>,
        handles: &mut Vec<std::thread::JoinHandle<()>>,
    ) -> Self {
        let (jobs_tx, jobs_rx) = sync_channel::<Job>(JOB_QUEUE);
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for n in 0..threads {
            let (disk, jobs, done) = (disk.clone(), jobs_rx.clone(), done.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{n}"))
                    .spawn(move || io_thread(&disk, &jobs, &done))
                    .expect("spawning a spill IO thread"),
            );
        }
        Self {
            jobs: Some(jobs_tx),
            backlog: VecDeque::new(),
        }
    }

    fn submit(&mut self, job: Job) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(job);
            return;
        }
        if let Err(job) = self.try_send(job) {
            self.backlog.push_back(job);
        }
    }

    fn pump(&mut self) {
        while let Some(job) = self.backlog.pop_front() {
            if let Err(job) = self.try_send(job) {
                self.backlog.push_front(job);
                return;
            }
        }
    }

    fn try_send(&mut self, job: Job) -> Result<(), Job> {
        let Some(jobs) = &self.jobs else {
            return Ok(()); // shutting down
        };
        match jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job)) => Err(job),
            // The threads are gone only when the daemon stops.
            Err(TrySendError::Disconnected(_)) => Ok(()),
        }
    }

    /// Drops the backlog and closes the queue: its threads end once they have emptied it.
    fn close(&mut self) {
        self.backlog.clear();
        self.jobs = None;
    }
}

/// The loop's handle on the IO threads: the general lane (spill writes, large restores,
/// discards, failures) and the small reads' lane (restores of records below
/// [`LARGE_OBJECT_BYTES`], see [`SMALL_READ_THREADS`]). A job of one lane never waits behind
/// the other's; nothing orders jobs across lanes, and nothing needs to: the core asks for a
/// record's restore only after its write completed, and discards a record only when no
/// restore of it is out.
pub struct SpillIo {
    general: Lane,
    small_reads: Lane,
    /// The loop's own way into the completion channel: a spill of a record already on disk
    /// completes from here, without a trip through an IO thread.
    done: mpsc::Sender<SpillCompletion>,
    threads: Vec<std::thread::JoinHandle<()>>,
    disk: Arc<Disk>,
}

/// What [`SpillIo::adopt`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdoptReport {
    /// Records taken.
    pub records: u64,
    /// Spill files no record named, removed.
    pub files_removed: u64,
}

/// Why a recorded spill record cannot be restored (the object is lost).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordCheckError {
    /// Its file is gone.
    #[error("spill file {0} is missing")]
    Missing(PathBuf),
    /// Its header is torn, damaged, or names another object or length.
    #[error("spill record in {0} is damaged")]
    Damaged(PathBuf),
    /// It could not be read.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// Reads the header of the spill record a persistent store's index names for `record`, in
/// `dir`: the digest it carries when it is intact and names the object and its length.
pub fn check_recorded(
    dir: &Path,
    record: &RecoveredSpilled,
) -> Result<ContentDigest, RecordCheckError> {
    let len = record.data_size + record.metadata_size;
    let location = Location::of_place(record.place, record.id, len);
    let path = if location.large {
        large_path(dir, location.file)
    } else {
        segment_path(dir, location.file)
    };
    let io = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::NotFound => RecordCheckError::Missing(path.clone()),
        std::io::ErrorKind::UnexpectedEof => RecordCheckError::Damaged(path.clone()),
        _ => RecordCheckError::Io {
            path: path.clone(),
            reason: error.to_string(),
        },
    };
    let file = File::open(&path).map_err(io)?;
    let mut head = [0u8; SMALL_HEADER_BYTES as usize];
    file.read_exact_at(&mut head, location.offset).map_err(io)?;
    match parse_header(&head, record.id) {
        Some((recorded_len, digest)) if recorded_len == len => Ok(digest),
        _ => Err(RecordCheckError::Damaged(path)),
    }
}

/// The spill files in `dir`: (number, large, path).
fn existing_files(dir: &Path) -> Vec<(u64, bool, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let name = name.to_str()?.strip_suffix(".spill")?;
            let (large, number) = match name.split_once('-')? {
                ("large", number) => (true, number),
                ("segment", number) => (false, number),
                _ => return None,
            };
            Some((number.parse().ok()?, large, entry.path()))
        })
        .collect()
}

fn segment_path(dir: &Path, file: u64) -> PathBuf {
    dir.join(format!("segment-{file}.spill"))
}

fn large_path(dir: &Path, file: u64) -> PathBuf {
    dir.join(format!("large-{file}.spill"))
}

impl SpillIo {
    /// Starts the IO threads over `dir` (prepared by [`prepare`]); completions arrive on the
    /// returned channel.
    pub fn start(dir: &Path) -> (Self, mpsc::Receiver<SpillCompletion>) {
        Self::start_with(dir, COMPLETION_QUEUE)
    }

    /// [`SpillIo::start`] for a persistent store: writes are flushed before they complete,
    /// and the files in `dir` are kept (new ones are numbered after them) for
    /// [`SpillIo::adopt`].
    pub fn start_durable(dir: &Path) -> (Self, mpsc::Receiver<SpillCompletion>) {
        let next_file = existing_files(dir)
            .iter()
            .map(|(number, _, _)| number + 1)
            .max()
            .unwrap_or(0);
        Self::start_inner(dir, COMPLETION_QUEUE, true, next_file)
    }

    /// Takes the records a restart recovered (each with the op the store named it by now)
    /// and removes every older spill file none of them is in. Call before the store's first
    /// `Restore`, with what `Store::recover_spilled` adopted.
    pub fn adopt(&self, adopted: &[(SpillOpId, RecoveredSpilled)]) -> AdoptReport {
        let mut index = self.disk.index.lock().expect("spill index lock");
        let mut report = AdoptReport::default();
        let mut live_segments: BTreeMap<u64, BTreeMap<u64, u64>> = BTreeMap::new();
        let mut named_large = std::collections::BTreeSet::new();
        for &(op, record) in adopted {
            let len = record.data_size + record.metadata_size;
            let location = Location::of_place(record.place, record.id, len);
            if location.large {
                named_large.insert(location.file);
            } else {
                live_segments
                    .entry(location.file)
                    .or_default()
                    .insert(location.offset, SMALL_HEADER_BYTES + location.len);
            }
            index.records.insert(op, location);
        }
        for (number, large, path) in existing_files(&self.disk.dir) {
            if number >= index.next_file {
                continue; // made by this run
            }
            let named = if large {
                named_large.contains(&number)
            } else {
                live_segments.contains_key(&number)
            };
            if !named {
                if std::fs::remove_file(&path).is_ok() {
                    report.files_removed += 1;
                }
                continue;
            }
            if large {
                continue;
            }
            match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(file) => {
                    let end = file.metadata().map_or(SEGMENT_BYTES, |m| m.len());
                    index.segments.insert(
                        number,
                        Segment {
                            file: Arc::new(file),
                            sync: Arc::default(),
                            // Closed for appends: new records go to a new segment.
                            end: end.max(SEGMENT_BYTES),
                            live: live_segments.remove(&number).unwrap_or_default(),
                        },
                    );
                }
                Err(error) => warn!(path = %path.display(), %error, "cannot open a spill segment"),
            }
        }
        report.records = adopted.len() as u64;
        report
    }

    /// [`SpillIo::start`] with `completion_queue` places for completions (small ones are for
    /// tests).
    pub fn start_with(
        dir: &Path,
        completion_queue: usize,
    ) -> (Self, mpsc::Receiver<SpillCompletion>) {
        Self::start_inner(dir, completion_queue, false, 0)
    }

    fn start_inner(
        dir: &Path,
        completion_queue: usize,
        durable: bool,
        next_file: u64,
    ) -> (Self, mpsc::Receiver<SpillCompletion>) {
        // Bounded: only the IO threads send here, and wait for a place (`blocking_send`). They
        // hold nothing the loop takes while they wait, and the loop never waits on them (it
        // only `try_send`s jobs), so a slow loop holds the threads back without a deadlock.
        let (done_tx, done_rx) = mpsc::channel(completion_queue.max(1));
        let disk = Arc::new(Disk {
            dir: dir.to_path_buf(),
            index: Mutex::new(Index {
                next_file,
                ..Index::default()
            }),
            durable,
            dir_sync: GroupSync::default(),
            #[cfg(test)]
            read_gate: tests::ReadGate::default(),
        });
        let mut threads = Vec::with_capacity(IO_THREADS + SMALL_READ_THREADS);
        let general = Lane::start("skyriver-spill", IO_THREADS, &disk, &done_tx, &mut threads);
        let small_reads = Lane::start(
            "skyriver-spill-read",
            SMALL_READ_THREADS,
            &disk,
            &done_tx,
            &mut threads,
        );
        let io = Self {
            general,
            small_reads,
            done: done_tx,
            threads,
            disk,
        };
        (io, done_rx)
    }

    /// Queues a spill write of `view` (claimed by the caller from the object's region).
    pub fn spill(
        &mut self,
        op: SpillOpId,
        object: ObjectId,
        view: Option<ReadableRegion>,
        digest: Option<ContentDigest>,
    ) {
        if let Some(place) = self.disk.written_place(op) {
            // A clean record: nothing to write. Completed through the channel like any job
            // (the loop hears of it after the outputs of this pass, which may still read the
            // object), or by an IO thread when the channel is full.
            let completion = SpillCompletion::Spilled {
                op,
                result: place,
                elapsed: Duration::ZERO,
                bytes: 0,
            };
            match self.done.try_send(completion) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(completion))
                | Err(mpsc::error::TrySendError::Closed(completion)) => {
                    drop(view);
                    self.complete(completion);
                    return;
                }
            }
        }
        match view {
            Some(view) => self.submit(Job::Spill {
                op,
                object,
                view,
                digest,
            }),
            None => self.complete(SpillCompletion::Spilled {
                op,
                result: Err(SpillError::Io {
                    reason: "the object's memory could not be viewed".into(),
                }),
                elapsed: Duration::ZERO,
                bytes: 0,
            }),
        }
    }

    /// Queues a restore into `view` (claimed by the caller from the new block).
    pub fn restore(
        &mut self,
        op: SpillOpId,
        view: Option<WritableRegion>,
        digest: Option<ContentDigest>,
    ) {
        match view {
            Some(view) if (view.as_slice().len() as u64) < LARGE_OBJECT_BYTES => {
                self.small_reads.submit(Job::Restore { op, view, digest })
            }
            Some(view) => self.submit(Job::Restore { op, view, digest }),
            None => self.complete(SpillCompletion::Restored {
                op,
                result: Err(RestoreError::Io {
                    reason: "the restore's memory could not be claimed".into(),
                }),
                elapsed: Duration::ZERO,
                bytes: 0,
            }),
        }
    }

    /// Queues the removal of record `op`.
    pub fn discard(&mut self, op: SpillOpId) {
        self.submit(Job::Discard { op });
    }

    /// Moves jobs from the backlogs to the IO threads while their queues have room. Call
    /// after each completion.
    pub fn pump(&mut self) {
        self.general.pump();
        self.small_reads.pump();
    }

    /// Jobs waiting on the loop for room in the IO queues.
    pub fn backlog(&self) -> usize {
        self.general.backlog.len() + self.small_reads.backlog.len()
    }

    /// A job for the general lane.
    fn submit(&mut self, job: Job) {
        self.general.submit(job);
    }

    fn complete(&mut self, completion: SpillCompletion) {
        self.submit(Job::Failed(completion));
    }
}

impl Drop for SpillIo {
    fn drop(&mut self) {
        self.general.close();
        self.small_reads.close();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn io_thread(disk: &Disk, jobs: &Mutex<Receiver<Job>>, done: &mpsc::Sender<SpillCompletion>) {
    let mut bounce = Bounce::default();
    loop {
        let job = {
            let Ok(jobs) = jobs.lock() else { return };
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let started = std::time::Instant::now();
        let completion = match job {
            Job::Spill {
                op,
                object,
                view,
                digest,
            } => {
                let bytes = view.as_slice().len() as u64;
                let result = disk.write(op, object, view.as_slice(), digest, &mut bounce);
                drop(view);
                SpillCompletion::Spilled {
                    op,
                    result,
                    elapsed: started.elapsed(),
                    bytes,
                }
            }
            Job::Restore {
                op,
                mut view,
                digest,
            } => {
                let bytes = view.as_slice().len() as u64;
                let result = disk.read(op, view.as_mut_slice(), digest, &mut bounce);
                drop(view);
                SpillCompletion::Restored {
                    op,
                    result,
                    elapsed: started.elapsed(),
                    bytes,
                }
            }
            Job::Discard { op } => {
                disk.discard(op);
                SpillCompletion::Discarded { op }
            }
            Job::Failed(completion) => completion,
        };
        // Waits while the loop is behind (see `start_with`); the loop gone means shutdown.
        if done.blocking_send(completion).is_err() {
            return;
        }
    }
}

fn header(op: SpillOpId, object: ObjectId, len: u64, digest: ContentDigest) -> [u8; 64] {
    // The op is kept for diagnosis only: a restore checks the object its header names (after
    // a restart, the record is named by another op).
    let mut header = [0u8; 64];
    header[0..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&op.0.to_le_bytes());
    header[16..36].copy_from_slice(object.as_bytes());
    header[36..44].copy_from_slice(&len.to_le_bytes());
    header[44..52].copy_from_slice(&digest.0.to_le_bytes());
    let check = ContentDigest::of_contiguous(&header[..56]);
    header[56..64].copy_from_slice(&check.0.to_le_bytes());
    header
}

/// The length and digest a header names, when it is intact and for `object`.
fn parse_header(bytes: &[u8], object: ObjectId) -> Option<(u64, ContentDigest)> {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let intact = &bytes[0..8] == MAGIC
        && word(56) == ContentDigest::of_contiguous(&bytes[..56]).0
        && &bytes[16..36] == object.as_bytes();
    intact.then(|| (word(36), ContentDigest(word(44))))
}

fn place_exhausted() -> SpillError {
    SpillError::Io {
        reason: "spill file numbers exhausted".into(),
    }
}

fn no_space(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(code) if code == nix::libc::ENOSPC || code == nix::libc::EDQUOT
    )
}

fn spill_error(error: std::io::Error, what: &str) -> SpillError {
    if no_space(&error) {
        SpillError::NoSpace
    } else {
        SpillError::Io {
            reason: format!("{what}: {error}"),
        }
    }
}

impl Disk {
    fn segment_path(&self, file: u64) -> PathBuf {
        segment_path(&self.dir, file)
    }

    fn large_path(&self, file: u64) -> PathBuf {
        large_path(&self.dir, file)
    }

    /// Where record `op` is, when it is written already (a spill of it writes nothing).
    fn written_place(&self, op: SpillOpId) -> Option<Result<SpillPlace, SpillError>> {
        let index = self.index.lock().expect("spill index lock");
        let location = index.records.get(&op)?;
        Some(location.place().ok_or_else(place_exhausted))
    }

    /// Persistent mode: makes a new file's name durable (one flush of the directory for the
    /// files made together, see [`GroupSync`]).
    fn sync_dir(&self) -> std::io::Result<()> {
        if self.durable {
            self.dir_sync
                .sync_after_write(|| File::open(&self.dir)?.sync_all())?;
        }
        Ok(())
    }

    fn write(
        &self,
        op: SpillOpId,
        object: ObjectId,
        bytes: &[u8],
        digest: Option<ContentDigest>,
        bounce: &mut Bounce,
    ) -> Result<SpillPlace, SpillError> {
        // A spill of a record already written (the object was restored and kept it clean):
        // nothing to write, the store frees the memory at this completion.
        if let Some(place) = self.written_place(op) {
            return place;
        }
        let digest = digest.unwrap_or_else(|| ContentDigest::of_contiguous(bytes));
        let header = header(op, object, bytes.len() as u64, digest);
        if bytes.len() as u64 >= LARGE_OBJECT_BYTES {
            return self.write_large(op, object, &header, bytes, bounce);
        }
        let record_len = SMALL_HEADER_BYTES + bytes.len() as u64;
        let Reserved {
            file_id,
            file,
            sync,
            offset,
            new_file,
        } = self
            .reserve(record_len)
            .map_err(|e| spill_error(e, "open segment"))?;
        let location = Location {
            file: file_id,
            offset,
            len: bytes.len() as u64,
            large: false,
            object,
        };
        let written = location
            .place()
            .ok_or_else(|| std::io::Error::other("spill file numbers exhausted"))
            .and_then(|place| {
                write_record(&file, &header, bytes, offset)?;
                if self.durable {
                    // Group commit: writes to this segment finishing together share a flush.
                    sync.sync_after_write(|| file.sync_data())?;
                    if new_file {
                        self.sync_dir()?;
                    }
                }
                Ok(place)
            });
        let mut index = self.index.lock().expect("spill index lock");
        match written {
            Ok(place) => {
                index.records.insert(op, location);
                Ok(place)
            }
            Err(error) => {
                release_record(&mut index, file_id, offset, &self.segment_path(file_id));
                Err(spill_error(error, "write segment"))
            }
        }
    }

    /// Reserves `len` bytes at the end of the current segment (rolling to a new one when it is
    /// full); the segment counts the record as live from here.
    fn reserve(&self, len: u64) -> std::io::Result<Reserved> {
        let mut index = self.index.lock().expect("spill index lock");
        let current = index.current.filter(|id| {
            index
                .segments
                .get(id)
                .is_some_and(|s| s.end < SEGMENT_BYTES)
        });
        let mut new_file = false;
        let file_id = match current {
            Some(id) => id,
            None => {
                new_file = true;
                let id = index.next_file;
                index.next_file += 1;
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(self.segment_path(id))?;
                index.segments.insert(
                    id,
                    Segment {
                        file: Arc::new(file),
                        sync: Arc::default(),
                        end: 0,
                        live: BTreeMap::new(),
                    },
                );
                // The old current segment goes once nothing in it is live.
                if let Some(old) = index.current.replace(id) {
                    let path = self.segment_path(old);
                    if index.segments.get(&old).is_some_and(|s| s.live.is_empty()) {
                        index.segments.remove(&old);
                        let _ = std::fs::remove_file(path);
                    }
                }
                id
            }
        };
        let segment = index.segments.get_mut(&file_id).expect("just ensured");
        let offset = segment.end;
        segment.end += len;
        segment.live.insert(offset, len);
        Ok(Reserved {
            file_id,
            file: segment.file.clone(),
            sync: segment.sync.clone(),
            offset,
            new_file,
        })
    }

    fn write_large(
        &self,
        op: SpillOpId,
        object: ObjectId,
        header: &[u8; 64],
        bytes: &[u8],
        bounce: &mut Bounce,
    ) -> Result<SpillPlace, SpillError> {
        let file_id = {
            let mut index = self.index.lock().expect("spill index lock");
            index.next_file += 1;
            index.next_file - 1
        };
        let location = Location {
            file: file_id,
            offset: 0,
            len: bytes.len() as u64,
            large: true,
            object,
        };
        let place = location.place().ok_or_else(place_exhausted)?;
        let path = self.large_path(file_id);
        // The file's bytes are flushed by the write; its name by the directory's flush.
        let result = write_large_file(&path, header, bytes, bounce).and_then(|()| self.sync_dir());
        if let Err(error) = result {
            let _ = std::fs::remove_file(&path);
            return Err(spill_error(error, "write large object"));
        }
        self.index
            .lock()
            .expect("spill index lock")
            .records
            .insert(op, location);
        Ok(place)
    }

    fn read(
        &self,
        op: SpillOpId,
        into: &mut [u8],
        digest: Option<ContentDigest>,
        bounce: &mut Bounce,
    ) -> Result<(), RestoreError> {
        #[cfg(test)]
        let _inside = self.read_gate.enter();
        let location = self
            .index
            .lock()
            .expect("spill index lock")
            .records
            .get(&op)
            .copied()
            .ok_or(RestoreError::Missing)?;
        if location.len != into.len() as u64 {
            return Err(RestoreError::Damaged);
        }
        let path = if location.large {
            self.large_path(location.file)
        } else {
            self.segment_path(location.file)
        };
        let io = |error: std::io::Error| match error.kind() {
            std::io::ErrorKind::NotFound => RestoreError::Missing,
            std::io::ErrorKind::UnexpectedEof => RestoreError::Damaged,
            _ => RestoreError::Io {
                reason: error.to_string(),
            },
        };
        let recorded = if location.large {
            read_large_file(&path, location.object, into, bounce).map_err(io)?
        } else {
            let file = self.open_segment(location.file, &path).map_err(io)?;
            let mut head = [0u8; SMALL_HEADER_BYTES as usize];
            read_record(&file, &mut head, into, location.offset).map_err(io)?;
            let (len, recorded) =
                parse_header(&head, location.object).ok_or(RestoreError::Damaged)?;
            if len != into.len() as u64 {
                return Err(RestoreError::Damaged);
            }
            Some(recorded)
        };
        let recorded = recorded.ok_or(RestoreError::Damaged)?;
        let actual = ContentDigest::of_contiguous(into);
        if actual != recorded || digest.is_some_and(|d| d != actual) {
            return Err(RestoreError::Damaged);
        }
        Ok(())
    }

    /// The open file of segment `file` (opened again if the index does not hold it).
    fn open_segment(&self, file: u64, path: &Path) -> std::io::Result<Arc<File>> {
        let open = self
            .index
            .lock()
            .expect("spill index lock")
            .segments
            .get(&file)
            .map(|segment| segment.file.clone());
        // A segment removed behind our back still serves its records (checksummed) while open.
        match open {
            Some(file) => Ok(file),
            None => File::open(path).map(Arc::new),
        }
    }

    fn discard(&self, op: SpillOpId) {
        let mut index = self.index.lock().expect("spill index lock");
        let Some(location) = index.records.remove(&op) else {
            return;
        };
        if location.large {
            let _ = std::fs::remove_file(self.large_path(location.file));
            return;
        }
        let path = self.segment_path(location.file);
        release_record(&mut index, location.file, location.offset, &path);
    }
}

/// The record at `offset` of segment `file` is gone: the span it leaves between its live
/// neighbours is given back to the file system, and the segment goes when that was its last
/// record and it is not the one appended to.
fn release_record(index: &mut Index, file: u64, offset: u64, path: &Path) {
    let current = index.current;
    let Some(segment) = index.segments.get_mut(&file) else {
        return;
    };
    let Some(free) = segment.remove(offset) else {
        return;
    };
    if segment.live.is_empty() && current != Some(file) {
        index.segments.remove(&file);
        let _ = std::fs::remove_file(path);
    } else {
        let _ = punch_hole(&segment.file, free.start, free.end - free.start);
    }
}

/// Writes a record's header and bytes at `offset` in one call where it can.
fn write_record(file: &File, header: &[u8], bytes: &[u8], offset: u64) -> std::io::Result<()> {
    let total = header.len() + bytes.len();
    let written = nix::sys::uio::pwritev(
        file,
        &[IoSlice::new(header), IoSlice::new(bytes)],
        offset as i64,
    )
    .map_err(std::io::Error::from)?;
    if written == total {
        return Ok(());
    }
    // A short write: the rest one piece at a time.
    let mut record = Vec::with_capacity(total);
    record.extend_from_slice(header);
    record.extend_from_slice(bytes);
    file.write_all_at(&record[written..], offset + written as u64)
}

/// Reads a record's header and bytes at `offset` in one call where it can.
fn read_record(file: &File, head: &mut [u8], into: &mut [u8], offset: u64) -> std::io::Result<()> {
    let (head_len, total) = (head.len(), head.len() + into.len());
    let got = nix::sys::uio::preadv(
        file,
        &mut [IoSliceMut::new(head), IoSliceMut::new(into)],
        offset as i64,
    )
    .map_err(std::io::Error::from)?;
    if got == total {
        return Ok(());
    }
    // A short read (end of file, or a signal): the rest one piece at a time.
    if got < head_len {
        file.read_exact_at(&mut head[got..], offset + got as u64)?;
    }
    let done = got.saturating_sub(head_len);
    file.read_exact_at(&mut into[done..], offset + (head_len + done) as u64)
}

fn punch_hole(file: &File, offset: u64, len: u64) -> nix::Result<()> {
    use nix::fcntl::FallocateFlags;
    nix::fcntl::fallocate(
        file.as_raw_fd(),
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        offset as i64,
        len as i64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Condvar;

    use skyriver_transport::{ArenaOptions, SharedArena};

    /// Holds each read until `wait_for` reads are inside at once (or a while has passed), and
    /// records the most that ever were.
    #[derive(Debug, Default)]
    pub(super) struct ReadGate {
        /// Reads to wait for (0: reads pass at once).
        wait_for: AtomicUsize,
        inside: Mutex<usize>,
        most: AtomicUsize,
        arrived: Condvar,
    }

    /// A read inside the gate; leaves on drop.
    pub(super) struct Inside<'a>(&'a ReadGate);

    impl ReadGate {
        /// How long a read waits for the others.
        const PATIENCE: Duration = Duration::from_secs(2);

        pub(super) fn enter(&self) -> Inside<'_> {
            let wait_for = self.wait_for.load(Ordering::SeqCst);
            let mut inside = self.inside.lock().unwrap();
            *inside += 1;
            self.most.fetch_max(*inside, Ordering::SeqCst);
            self.arrived.notify_all();
            let _ = self
                .arrived
                .wait_timeout_while(inside, Self::PATIENCE, |inside| *inside < wait_for)
                .unwrap();
            Inside(self)
        }
    }

    impl Drop for Inside<'_> {
        fn drop(&mut self) {
            *self.0.inside.lock().unwrap() -= 1;
        }
    }

    /// A random 4 KiB restore waits for the device, not the CPU: many must be in flight at
    /// once for the device to serve more than a few tens of thousands a second. Small restores
    /// run on [`SMALL_READ_THREADS`] threads at once, and not behind the general lane's jobs.
    #[test]
    fn small_restores_are_read_by_many_threads_at_once() {
        const RECORD_BYTES: usize = 4096;
        let dir = tempfile::tempdir().unwrap();
        let (mut io, mut completions) = SpillIo::start(dir.path());
        let mut bounce = Bounce::default();
        let restores = SMALL_READ_THREADS as u64;
        for n in 0..restores {
            io.disk
                .write(
                    SpillOpId(n),
                    ObjectId::from_u64(n),
                    &bytes(RECORD_BYTES, n as u8),
                    None,
                    &mut bounce,
                )
                .unwrap();
        }
        io.disk
            .read_gate
            .wait_for
            .store(SMALL_READ_THREADS, Ordering::SeqCst);
        let arena_bytes = (restores as usize * RECORD_BYTES) as u64;
        let arena = Arc::new(
            SharedArena::create("spill-test", arena_bytes, &ArenaOptions::default()).unwrap(),
        );
        for n in 0..restores {
            let offset = n * RECORD_BYTES as u64;
            let view = WritableRegion::new(arena.clone(), offset, RECORD_BYTES as u64).unwrap();
            io.restore(SpillOpId(n), Some(view), None);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut restored = 0;
        while restored < restores {
            assert!(std::time::Instant::now() < deadline, "{restored} restored");
            match completions.try_recv() {
                Ok(SpillCompletion::Restored { result, .. }) => {
                    result.expect("the record comes back");
                    restored += 1;
                }
                Ok(other) => panic!("only restores were queued: {other:?}"),
                Err(_) => std::thread::yield_now(),
            }
            io.pump();
        }
        let most = io.disk.read_gate.most.load(Ordering::SeqCst);
        assert_eq!(
            most, SMALL_READ_THREADS,
            "small restores read at once (the general lane alone has {IO_THREADS} threads)"
        );
    }

    fn disk(dir: &Path) -> Disk {
        Disk {
            dir: dir.to_path_buf(),
            index: Mutex::new(Index::default()),
            durable: false,
            dir_sync: GroupSync::default(),
            read_gate: ReadGate::default(),
        }
    }

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    /// Discards report back like every job, so a backlog of them drains as the loop pumps
    /// after each completion (a mass delete once left its backlog, and every spill queued
    /// behind it, waiting forever).
    #[test]
    fn a_backlog_of_discards_drains() {
        let dir = tempfile::tempdir().unwrap();
        let (mut io, mut completions) = SpillIo::start(dir.path());
        let discards = 3 * JOB_QUEUE as u64;
        for n in 0..discards {
            io.discard(SpillOpId(1_000_000 + n));
        }
        assert!(
            io.backlog() > 0,
            "more discards than the queue holds wait on the loop"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut discarded = 0u64;
        while discarded < discards {
            assert!(
                std::time::Instant::now() < deadline,
                "stuck: {discarded} of {discards} discards reported, backlog {}",
                io.backlog()
            );
            match completions.try_recv() {
                Ok(SpillCompletion::Discarded { .. }) => discarded += 1,
                Ok(other) => panic!("only discards were queued: {other:?}"),
                Err(_) => std::thread::yield_now(),
            }
            io.pump();
        }
        assert_eq!(io.backlog(), 0);
    }

    /// A loop that does not take completions holds the IO threads back: no more than the
    /// channel's places wait, the rest stay queued, and every one arrives once taken.
    #[test]
    fn a_full_completion_channel_holds_the_threads_back_and_loses_nothing() {
        const PLACES: usize = 3;
        let dir = tempfile::tempdir().unwrap();
        let (mut io, mut completions) = SpillIo::start_with(dir.path(), PLACES);
        let jobs = 40u64;
        for n in 0..jobs {
            if n % 2 == 0 {
                io.discard(SpillOpId(n));
            } else {
                // A failure known at once comes back through the same bounded way.
                io.spill(SpillOpId(n), ObjectId::from_u64(n), None, None);
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while completions.len() < PLACES {
            assert!(
                std::time::Instant::now() < deadline,
                "the channel never filled"
            );
            std::thread::yield_now();
        }
        let mut seen = std::collections::BTreeSet::new();
        while (seen.len() as u64) < jobs {
            assert!(
                completions.len() <= PLACES,
                "{} completions waited in {PLACES} places",
                completions.len()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "stuck at {}",
                seen.len()
            );
            let op = match completions.try_recv() {
                Ok(SpillCompletion::Discarded { op }) => op,
                Ok(SpillCompletion::Spilled { op, result, .. }) => {
                    assert!(result.is_err());
                    op
                }
                Ok(other) => panic!("{other:?}"),
                Err(_) => {
                    std::thread::yield_now();
                    continue;
                }
            };
            assert!(seen.insert(op.0), "{op:?} came twice");
            io.pump();
        }
        assert_eq!(seen, (0..jobs).collect());
    }

    /// A spill of a record already on disk (a restored object going back) completes at once
    /// from the loop, naming the record's place, with nothing written and no view of the
    /// object's memory needed.
    #[test]
    fn a_spill_of_a_clean_record_completes_from_the_loop() {
        let dir = tempfile::tempdir().unwrap();
        let (mut io, mut completions) = SpillIo::start(dir.path());
        let mut bounce = Bounce::default();
        let data = bytes(4096, 9);
        let place = io
            .disk
            .write(
                SpillOpId(7),
                ObjectId::from_u64(7),
                &data,
                None,
                &mut bounce,
            )
            .unwrap();
        io.spill(SpillOpId(7), ObjectId::from_u64(7), None, None);
        // Sent before `spill` returned: no IO thread was involved.
        match completions.try_recv() {
            Ok(SpillCompletion::Spilled {
                op, result, bytes, ..
            }) => {
                assert_eq!(op, SpillOpId(7));
                assert_eq!(result, Ok(place));
                assert_eq!(bytes, 0, "nothing written");
            }
            other => panic!("a clean record's spill completes at once: {other:?}"),
        }
    }

    #[test]
    fn small_and_large_records_come_back_with_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let disk = disk(dir.path());
        let mut bounce = Bounce::default();
        let sizes = [
            0usize,
            1,
            4096,
            100_000,
            1 << 20,
            (3 << 20) + 17,
            CHUNK_BYTES + 5,
        ];
        for (n, &len) in sizes.iter().enumerate() {
            let data = bytes(len, n as u8);
            let op = SpillOpId(n as u64 + 1);
            disk.write(op, ObjectId::from_u64(n as u64), &data, None, &mut bounce)
                .unwrap();
            let mut back = vec![0u8; len];
            disk.read(
                op,
                &mut back,
                Some(ContentDigest::of_contiguous(&data)),
                &mut bounce,
            )
            .unwrap();
            assert!(back == data, "record of {len} bytes");
        }
        // Small records share one segment.
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 1 + 3, "one segment and three large files");
    }

    /// A restored object keeps its record; its next spill names that record and writes nothing.
    #[test]
    fn a_spill_of_a_record_already_written_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let disk = disk(dir.path());
        let mut bounce = Bounce::default();
        let data = bytes(5000, 3);
        disk.write(
            SpillOpId(1),
            ObjectId::from_u64(1),
            &data,
            None,
            &mut bounce,
        )
        .unwrap();
        let size = |dir: &Path| -> u64 {
            std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum()
        };
        let before = size(dir.path());
        disk.write(
            SpillOpId(1),
            ObjectId::from_u64(1),
            &data,
            None,
            &mut bounce,
        )
        .unwrap();
        assert_eq!(size(dir.path()), before, "nothing appended");
        let mut back = vec![0u8; data.len()];
        disk.read(SpillOpId(1), &mut back, None, &mut bounce)
            .unwrap();
        assert!(back == data);
    }

    #[test]
    fn a_damaged_or_removed_record_is_reported_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let disk = disk(dir.path());
        let mut bounce = Bounce::default();
        for (op, len) in [(1, 1000usize), (2, 2 << 20)] {
            disk.write(
                SpillOpId(op),
                ObjectId::from_u64(op),
                &bytes(len, 1),
                None,
                &mut bounce,
            )
            .unwrap();
        }
        // Flip a byte of every file's object bytes.
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let mut content = std::fs::read(&path).unwrap();
            let at = content.len() / 2;
            content[at] ^= 0x40;
            std::fs::write(&path, content).unwrap();
        }
        let mut back = vec![0u8; 1000];
        assert_eq!(
            disk.read(SpillOpId(1), &mut back, None, &mut bounce),
            Err(RestoreError::Damaged)
        );
        let mut back = vec![0u8; 2 << 20];
        assert_eq!(
            disk.read(SpillOpId(2), &mut back, None, &mut bounce),
            Err(RestoreError::Damaged)
        );
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        assert_eq!(
            disk.read(SpillOpId(2), &mut back, None, &mut bounce),
            Err(RestoreError::Missing)
        );
        assert_eq!(
            disk.read(SpillOpId(9), &mut back, None, &mut bounce),
            Err(RestoreError::Missing)
        );
    }

    #[test]
    fn discarded_records_give_their_space_back() {
        let dir = tempfile::tempdir().unwrap();
        let disk = disk(dir.path());
        let mut bounce = Bounce::default();
        disk.write(
            SpillOpId(1),
            ObjectId::from_u64(1),
            &bytes(2 << 20, 0),
            None,
            &mut bounce,
        )
        .unwrap();
        for op in 2..50 {
            disk.write(
                SpillOpId(op),
                ObjectId::from_u64(op),
                &bytes(64 * 1024, 0),
                None,
                &mut bounce,
            )
            .unwrap();
        }
        let before = allocated(dir.path());
        for op in 1..50 {
            disk.discard(SpillOpId(op));
        }
        let after = allocated(dir.path());
        assert!(
            after < before / 4,
            "{before} bytes allocated before, {after} after"
        );
    }

    #[test]
    fn discarded_small_records_give_their_blocks_back_though_they_share_them() {
        let dir = tempfile::tempdir().unwrap();
        let disk = disk(dir.path());
        let mut bounce = Bounce::default();
        let count = 4096u64;
        for op in 0..count {
            disk.write(
                SpillOpId(op),
                ObjectId::from_u64(op),
                &bytes(1024, op as u8),
                None,
                &mut bounce,
            )
            .unwrap();
        }
        let before = allocated(dir.path());
        // Every record but the first and one in the middle: each of their blocks holds parts
        // of discarded neighbours too.
        let kept = [0, count / 2];
        for op in (0..count).filter(|op| !kept.contains(op)) {
            disk.discard(SpillOpId(op));
        }
        let after = allocated(dir.path());
        assert!(
            after < before / 10,
            "{before} bytes allocated before, {after} after discarding all but two records"
        );
        for op in kept {
            let mut back = vec![0; 1024];
            disk.read(SpillOpId(op), &mut back, None, &mut bounce)
                .unwrap();
            assert_eq!(back, bytes(1024, op as u8), "record {op} kept its bytes");
        }
    }

    /// Bytes the files of `dir` take on disk.
    fn allocated(dir: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
            .sum()
    }
}
