//! Persistent mode: the arena is a file, and so is a crash-consistent index of its sealed
//! objects, so a daemon restarted after a crash finds every sealed object where it was.
//!
//! # Files
//!
//! `PATH` (the data file) *is* the arena: `--memory` bytes, object blocks at the offsets the
//! core allocated, mapped shared by the daemon and by every client exactly as a memfd arena is
//! (clients receive its fd and map it from offset 0; nothing in the client protocol changes).
//! On a DAX file system over persistent memory the mapping is the media itself; on tmpfs or an
//! SSD it is the page cache over the file.
//!
//! `PATH.index` (the index file) holds a 4 KiB header (magic, format version, record size,
//! data-file size, allocation alignment, CRC32C) followed by an array of 64-byte slots. A slot
//! is all zero (empty) or one record: magic, CRC32C, sequence number, object id, arena,
//! offset, data size and metadata size of one sealed object (layout in
//! [`skyriver_core::persist::record`]). The index grows by doubling when every slot is used. It is kept apart from the data file so the data
//! file stays a plain arena, mappable from offset 0, and so the index can grow.
//!
//! # Why this is crash-consistent
//!
//! The index is a set of independent slots, each written with one 64-byte `pwrite` (aligned,
//! so it never straddles a sector or page). A slot is the only thing an operation changes, and
//! after a crash it holds either the old contents, the new contents, or a mix; the checksum
//! tells a mix (a torn write) or any other corruption apart, and such a slot is discarded and
//! zeroed, never trusted. Both the old and the new state are correct outcomes for an operation
//! that had not returned, so a slot table needs no log. Two ordering rules make every valid
//! record true:
//!
//! 1. **Data before record.** A seal's bytes are flushed (`msync` of exactly the object's
//!    pages, which on DAX flushes the CPU caches) before its record is written, and the record
//!    is flushed (`fdatasync` of the index) before the seal's reply is sent
//!    (`--durability seal`). A valid record therefore never points at bytes that are not
//!    durable.
//! 2. **Removal before reuse.** When a recorded object is deleted or evicted, its slot is
//!    zeroed and flushed before the reply to the request that freed it, so before anyone can
//!    be handed its space. A valid record therefore never points at space another object may
//!    have overwritten. This holds in both durability modes.
//!
//! Sequence numbers only grow (across restarts too); if two valid records ever disagree (same
//! id, or overlapping blocks), the newest is taken and the store refuses the others, whose
//! slots are zeroed. Objects that were never sealed have no record: their space is simply free
//! after a restart. A file of another format version, or a header that fails its checksum, is
//! refused with an error and left untouched.
//!
//! With `--durability async` seal records are staged in memory and written by a periodic
//! commit (data flushed first, as always): a seal returns at memory speed and becomes durable
//! within the commit interval; a crash may lose seals of that last interval, never corrupt
//! one. Rule 2 is unchanged.
//!
//! The store core stays sans-IO: it emits [`DurableChange`]s and takes [`RecoveredObject`]s.
//! The slot table, the record format and the recovery scan are the core's [`SlotIndex`] (the
//! simulator runs the same code over a disk with torn and lost writes); everything that
//! touches the files is here: [`IndexFile`] is the index's [`Storage`].

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{Flock, FlockArg};
use skyriver_core::persist::{OpenError, SlotIndex, Storage};
use skyriver_core::{DurableChange, RecoveredObject};

pub use skyriver_core::persist::{
    FoundRecord, Header, HeaderError, Record, ScanReport, Slot, FORMAT_VERSION, HEADER_BYTES,
    INDEX_MAGIC, INITIAL_SLOTS, RECORD_BYTES,
};

use crate::arena::{ArenaError, SharedArena};

/// Why the backing files could not be opened, created or written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// An OS call on one of the files failed.
    #[error("{op} on {path} failed: {source}")]
    Io {
        /// The failing call (`open`, `pread`, `pwrite`, `fdatasync`, `msync`, ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The backing file path names a directory.
    #[error(
        "{path} is a directory: give the path of a file to keep the objects in, e.g. \
         {path}/skyriver.data (created if absent, with its index beside it)"
    )]
    IsADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The data file exists without its index: refusing to guess.
    #[error(
        "{data} exists but its index {index} does not: it is not a Skyriver backing file, or \
         its creation was interrupted; refusing to overwrite it (remove it to start empty)"
    )]
    MissingIndex {
        /// The data file.
        data: PathBuf,
        /// The expected index file.
        index: PathBuf,
    },
    /// The index exists without its data file.
    #[error("{index} exists but its data file {data} does not; refusing to start")]
    MissingData {
        /// The expected data file.
        data: PathBuf,
        /// The index file.
        index: PathBuf,
    },
    /// The index file is not one of ours.
    #[error("{path} is not a Skyriver index file (bad magic); refusing to use it")]
    NotAnIndex {
        /// The index file.
        path: PathBuf,
    },
    /// The files were written by an incompatible version.
    #[error(
        "{path} uses backing-file format version {found}; this build reads only version \
         {supported}. Refusing to open it (it was not modified): use a matching skyriver build, \
         or remove the files to start empty"
    )]
    IncompatibleVersion {
        /// The index file.
        path: PathBuf,
        /// Its format version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The header fails its checksum or holds values this build cannot use.
    #[error(
        "the header of {path} is corrupt ({reason}); refusing to open it (it was not modified)"
    )]
    CorruptHeader {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// The data file's size is not the one the index was made for.
    #[error("{path} holds {actual_bytes} bytes but its index says {expected_bytes}; refusing to open it")]
    DataSizeMismatch {
        /// The data file.
        path: PathBuf,
        /// Size recorded in the index header.
        expected_bytes: u64,
        /// Size of the file.
        actual_bytes: u64,
    },
    /// Another process has the files open.
    #[error("{path} is in use by another skyriver daemon")]
    Locked {
        /// The index file.
        path: PathBuf,
    },
    /// The size asked for a new backing file is too small.
    #[error("a backing file needs at least 4096 bytes; {0} were asked for")]
    TooSmall(u64),
    /// Mapping the data file as an arena failed.
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// The index must grow to record the staged seals and its file system is full. Nothing
    /// was written and nothing staged was dropped: the same commit succeeds once there is room.
    #[error(
        "the index {path} cannot grow to record new objects: {source}; nothing was written, \
         and the commit is retried once space is freed on its file system"
    )]
    IndexFull {
        /// The index file.
        path: PathBuf,
        /// The OS error (no space, or over quota).
        #[source]
        source: std::io::Error,
    },
}

impl PersistError {
    /// Whether the failed commit changed nothing and may be tried again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::IndexFull { .. })
    }
}

/// Whether `error` says the file system has no room (no space left, or over quota).
fn is_out_of_space(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(code) if code == nix::libc::ENOSPC || code == nix::libc::EDQUOT
    )
}

fn io_error<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> PersistError + 'a {
    move |source| PersistError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What a commit made durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Seal records written.
    pub seals: u64,
    /// Records removed.
    pub removals: u64,
    /// `msync` calls on the data file.
    pub data_flushes: u64,
    /// Object bytes covered by them.
    pub data_bytes: u64,
}

/// The index file as the slot index's medium: `pread`, `pwrite`, `ftruncate`, `fdatasync`.
#[derive(Debug)]
pub struct IndexFile<F = Flock<File>> {
    file: F,
    path: PathBuf,
}

impl<F: std::ops::Deref<Target = File>> Storage for IndexFile<F> {
    type Error = PersistError;

    fn len_bytes(&mut self) -> Result<u64, PersistError> {
        Ok(self
            .file
            .metadata()
            .map_err(io_error("fstat", &self.path))?
            .len())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), PersistError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(io_error("pread", &self.path))
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), PersistError> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(io_error("pwrite", &self.path))
    }

    fn set_len(&mut self, len_bytes: u64) -> Result<(), PersistError> {
        let old_len = self.len_bytes()?;
        self.file
            .set_len(len_bytes)
            .map_err(io_error("ftruncate", &self.path))?;
        // Reserve the new slots' blocks now: a record written later into a hole of a sparse
        // file needs a block then, and a full file system would fail that commit (and stop
        // the daemon) although the index had room. File systems without fallocate stay
        // sparse.
        if len_bytes > old_len {
            match nix::fcntl::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&*self.file),
                nix::fcntl::FallocateFlags::empty(),
                old_len as i64,
                (len_bytes - old_len) as i64,
            ) {
                Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => {}
                Err(errno) => {
                    // Back to the old length: a later growth must reserve this range again,
                    // not find it already inside the file, unreserved.
                    let _ = self.file.set_len(old_len);
                    return Err(PersistError::Io {
                        op: "fallocate",
                        path: self.path.clone(),
                        source: errno.into(),
                    });
                }
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), PersistError> {
        self.file
            .sync_data()
            .map_err(io_error("fdatasync", &self.path))
    }
}

/// A persistent store's backing files, opened and locked: the index (with its in-memory slot
/// table) and a mapping of the data file used to flush exactly the ranges of sealed objects.
#[derive(Debug)]
pub struct BackingFile {
    data_path: PathBuf,
    index: SlotIndex<IndexFile>,
    data_map: MmapRaw,
    data_bytes: u64,
}

/// The backing files opened: the index, the arena over the data file, and what the scan saw.
#[derive(Debug)]
pub struct Opened {
    /// The index and its slot table.
    pub backing: BackingFile,
    /// The data file mapped as the store's arena.
    pub arena: SharedArena,
    /// What the scan found.
    pub scan: ScanReport,
}

/// The index file that goes with a data file: `PATH.index`.
pub fn index_path_for(data_path: &Path) -> PathBuf {
    let mut name = data_path.as_os_str().to_owned();
    name.push(".index");
    PathBuf::from(name)
}

impl BackingFile {
    /// Opens the backing files at `data_path` (and `data_path.index`), or creates them with a
    /// `create_bytes` arena if neither exists. An existing store keeps its own size. Scans the
    /// index; hand [`BackingFile::found_records`] to the store, then call
    /// [`BackingFile::finish_recovery`] with what it refused.
    pub fn open(data_path: &Path, create_bytes: u64) -> Result<Opened, PersistError> {
        if data_path.is_dir() {
            return Err(PersistError::IsADirectory {
                path: data_path.to_path_buf(),
            });
        }
        let index_path = index_path_for(data_path);
        let exists = |path: &Path| path.try_exists().map_err(io_error("stat", path));
        let created = match (exists(data_path)?, exists(&index_path)?) {
            (false, false) => {
                create_files(data_path, &index_path, create_bytes)?;
                true
            }
            (true, true) => false,
            (true, false) => {
                return Err(PersistError::MissingIndex {
                    data: data_path.to_path_buf(),
                    index: index_path,
                })
            }
            (false, true) => {
                return Err(PersistError::MissingData {
                    data: data_path.to_path_buf(),
                    index: index_path,
                })
            }
        };
        let open_rw = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(io_error("open", path))
        };
        let index = Flock::lock(open_rw(&index_path)?, FlockArg::LockExclusiveNonblock).map_err(
            |(_, errno)| match errno {
                nix::errno::Errno::EWOULDBLOCK => PersistError::Locked {
                    path: index_path.clone(),
                },
                errno => PersistError::Io {
                    op: "flock",
                    path: index_path.clone(),
                    source: errno.into(),
                },
            },
        )?;
        let (index, mut scan) = SlotIndex::open(IndexFile {
            file: index,
            path: index_path.clone(),
        })
        .map_err(|error| header_error(error, &index_path))?;
        let data = open_rw(data_path)?;
        let actual_bytes = data.metadata().map_err(io_error("fstat", data_path))?.len();
        let data_bytes = index.header().data_bytes;
        if actual_bytes != data_bytes {
            return Err(PersistError::DataSizeMismatch {
                path: data_path.to_path_buf(),
                expected_bytes: data_bytes,
                actual_bytes,
            });
        }
        let data_map = MmapOptions::new()
            .len(data_bytes as usize)
            .map_raw_read_only(&data)
            .map_err(io_error("mmap", data_path))?;
        let arena = SharedArena::from_fd(data.into(), data_bytes)?;
        scan.created = created;
        Ok(Opened {
            backing: Self {
                data_path: data_path.to_path_buf(),
                index,
                data_map,
                data_bytes,
            },
            arena,
            scan,
        })
    }

    /// The records the scan found, newest first: the input of the store's `recover`.
    pub fn found_records(&self) -> impl Iterator<Item = RecoveredObject> + '_ {
        self.index.found_records()
    }

    /// The spilled objects' records the scan found, newest first (see
    /// `SlotIndex::found_spilled`).
    pub fn found_spilled(
        &self,
    ) -> impl Iterator<Item = skyriver_core::store::RecoveredSpilled> + '_ {
        self.index.found_spilled()
    }

    /// Spilled records at these positions of [`BackingFile::found_spilled`] are cleared at
    /// [`BackingFile::finish_recovery`] (their objects are lost).
    pub fn refuse_spilled(&mut self, refused: impl IntoIterator<Item = usize>) {
        self.index.refuse_spilled(refused);
    }

    /// Takes the store's verdict on [`BackingFile::found_records`]: `refused` are positions
    /// in that sequence. Refused and corrupt slots are zeroed (and flushed); the accepted
    /// records are the index from now on. Returns how many slots were zeroed.
    pub fn finish_recovery(
        &mut self,
        refused: impl IntoIterator<Item = usize>,
    ) -> Result<u64, PersistError> {
        self.index.finish_recovery(refused)
    }

    /// Takes one change from the store, to be written by the next commit.
    pub fn stage(&mut self, change: DurableChange) {
        self.index.stage(change);
    }

    /// Seals staged and not written yet.
    pub fn staged_seal_count(&self) -> usize {
        self.index.staged_seal_count()
    }

    /// Object bytes of the seals staged and not written yet.
    pub fn staged_seal_bytes(&self) -> u64 {
        self.index.staged_seal_bytes()
    }

    /// Whether removals are staged (they must be committed before the freed space is reused).
    pub fn has_staged_removals(&self) -> bool {
        self.index.has_staged_removals()
    }

    /// Objects with a written record.
    pub fn recorded_count(&self) -> usize {
        self.index.recorded_count()
    }

    /// Makes every staged change durable: the staged objects' bytes are flushed, then their
    /// records and the removals are written, then the index is flushed.
    pub fn commit(&mut self) -> Result<CommitStats, PersistError> {
        let mut stats = CommitStats::default();
        if !self.index.has_staged() {
            return Ok(stats);
        }
        // Room for every record first: on a full file system this fails with nothing
        // written, and the committer tries again later instead of stopping the daemon.
        self.index
            .reserve_for_staged()
            .map_err(|error| match error {
                PersistError::Io { path, source, .. } if is_out_of_space(&source) => {
                    PersistError::IndexFull { path, source }
                }
                other => other,
            })?;
        self.flush_data(&mut stats)?;
        let written = self.index.commit()?;
        stats.seals = written.seals;
        stats.removals = written.removals;
        Ok(stats)
    }

    /// Makes only the staged removals durable (async mode, before the freed space is reused).
    pub fn commit_removals(&mut self) -> Result<u64, PersistError> {
        self.index.commit_removals()
    }

    /// The data file.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// The index file.
    pub fn index_path(&self) -> &Path {
        &self.index.storage().path
    }

    /// `msync` of the staged objects' bytes, adjacent ranges merged.
    fn flush_data(&mut self, stats: &mut CommitStats) -> Result<(), PersistError> {
        let page = 4096u64;
        let mut ranges: Vec<(u64, u64)> = self
            .index
            .staged_seals()
            .filter(|o| o.data_size + o.metadata_size > 0)
            .map(|o| {
                let start = o.block.offset / page * page;
                let end = (o.block.offset + o.data_size + o.metadata_size).div_ceil(page) * page;
                (start, end.min(self.data_bytes))
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        for (start, end) in merged {
            self.data_map
                .flush_range(start as usize, (end - start) as usize)
                .map_err(io_error("msync", &self.data_path))?;
            stats.data_flushes += 1;
            stats.data_bytes += end - start;
        }
        Ok(())
    }
}

/// An index that could not be opened, as the error of its path.
fn header_error(error: OpenError<PersistError>, path: &Path) -> PersistError {
    let path = path.to_path_buf();
    match error {
        OpenError::Storage(error) => error,
        OpenError::Header(HeaderError::BadMagic) => PersistError::NotAnIndex { path },
        OpenError::Header(HeaderError::Version { found }) => PersistError::IncompatibleVersion {
            path,
            found,
            supported: FORMAT_VERSION,
        },
        OpenError::Header(HeaderError::Checksum) => PersistError::CorruptHeader {
            path,
            reason: "checksum mismatch",
        },
        OpenError::Header(HeaderError::Layout) => PersistError::CorruptHeader {
            path,
            reason: "record or header size this build does not use",
        },
        OpenError::Header(HeaderError::Alignment) => PersistError::CorruptHeader {
            path,
            reason: "allocation alignment differs from this build's",
        },
    }
}

/// Creates the data file (sized, space reserved, flushed), then the index: written under a
/// temporary name, flushed and renamed into place, so an index exists only when complete.
fn create_files(data_path: &Path, index_path: &Path, bytes: u64) -> Result<(), PersistError> {
    let bytes = bytes / 4096 * 4096;
    if bytes < 4096 {
        return Err(PersistError::TooSmall(bytes));
    }
    if let Some(parent) = data_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_error("mkdir", parent))?;
    }
    let data = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(data_path)
        .map_err(io_error("open", data_path))?;
    data.set_len(bytes)
        .map_err(io_error("ftruncate", data_path))?;
    // Reserve the blocks so a full file system fails here, not as SIGBUS in a client writing
    // an object. File systems without fallocate keep a sparse file.
    match nix::fcntl::fallocate(
        std::os::fd::AsRawFd::as_raw_fd(&data),
        nix::fcntl::FallocateFlags::empty(),
        0,
        bytes as i64,
    ) {
        Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => {}
        Err(errno) => {
            let _ = std::fs::remove_file(data_path);
            return Err(PersistError::Io {
                op: "fallocate",
                path: data_path.to_path_buf(),
                source: errno.into(),
            });
        }
    }
    data.sync_all().map_err(io_error("fsync", data_path))?;

    let mut temp_name = index_path.as_os_str().to_owned();
    temp_name.push(".tmp");
    let temp_path = PathBuf::from(temp_name);
    let index = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp_path)
        .map_err(io_error("open", &temp_path))?;
    SlotIndex::format(
        &mut IndexFile {
            file: &index,
            path: temp_path.clone(),
        },
        bytes,
    )?;
    index.sync_all().map_err(io_error("fsync", &temp_path))?;
    std::fs::rename(&temp_path, index_path).map_err(io_error("rename", index_path))?;
    let dir = index_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error("fsync", dir))?;
    Ok(())
}

#[cfg(test)]
mod tests;
