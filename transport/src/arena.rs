//! Shared-memory arenas: the memory objects live in, mapped once by the daemon and once by
//! each client.
//!
//! An arena is a file descriptor (a memfd by default, or an unlinked file on a hugetlbfs mount)
//! and a shared mapping of it. The daemon creates it; a client receives the fd over the Unix
//! socket and maps the same pages, so object bytes are never copied between processes.
//!
//! # Why views of an arena are `unsafe fn`
//!
//! Whether a range may be read ([`SharedArena::bytes`], [`ReadableRegion::new`]) or written
//! ([`SharedArena::write`], [`WritableRegion::new`]) is decided by the store: an unsealed object
//! belongs to its one creator until sealed, a sealed object never changes while referenced or
//! pinned. That grant lives in the core of the daemon, often in another process, and reaches the
//! code holding the mapping as a reply on a socket or a core output. No value in this process
//! can witness it: a "grant" type minted from a socket reply would only move the `unsafe` to
//! whoever mints it, and hide it. So these functions are `unsafe fn` with a `# Safety` section,
//! every call site says in its `// SAFETY:` comment which grant it relies on, and the regions
//! they return are then safe to use. Two `WritableRegion`s over one range are a bug of the
//! caller that made the second, visible at its `unsafe` block.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Advice, MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

/// How to back an arena.
#[derive(Debug, Clone, Default)]
pub struct ArenaOptions {
    /// Create the arena as a file under this hugetlbfs mount instead of a memfd.
    pub hugepages_dir: Option<PathBuf>,
    /// Touch every page at creation so later writes never stall on a page fault.
    pub prefault: bool,
}

/// Why an arena could not be made or mapped.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// `memfd_create` failed.
    #[error("memfd_create for a {size_bytes}-byte arena failed: {source}")]
    MemfdCreate {
        /// Requested size.
        size_bytes: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Creating the backing file failed.
    #[error("cannot create arena file in {dir}: {source}")]
    CreateFile {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Setting the size (ftruncate) or reserving pages (fallocate) failed.
    #[error("cannot size the arena to {size_bytes} bytes: {source}")]
    Resize {
        /// Requested size.
        size_bytes: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `mmap` failed.
    #[error("mmap of a {size_bytes}-byte arena failed: {source}")]
    Map {
        /// Requested size.
        size_bytes: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A received fd is smaller than the size announced for it.
    #[error("arena fd holds {actual_bytes} bytes, {expected_bytes} were announced")]
    SizeMismatch {
        /// Announced size.
        expected_bytes: u64,
        /// `fstat` size.
        actual_bytes: u64,
    },
}

/// A range outside an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range {offset}+{len} is outside the {arena_bytes}-byte arena")]
pub struct OutOfArena {
    /// Start of the range.
    pub offset: u64,
    /// Length of the range.
    pub len: u64,
    /// Size of the arena.
    pub arena_bytes: u64,
}

/// The slow steps of creating a large arena, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaStage {
    /// Reserving (and zeroing) the pages with `fallocate`.
    Reserving,
    /// Mapping every page (`MADV_POPULATE_WRITE`).
    Prefaulting,
}

impl std::fmt::Display for ArenaStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ArenaStage::Reserving => "reserving",
            ArenaStage::Prefaulting => "pre-faulting",
        })
    }
}

/// The size of one step of arena creation between progress reports.
pub const ARENA_STEP_BYTES: u64 = 1 << 30;

/// `(offset, len)` of each step over `size_bytes`.
fn steps(size_bytes: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..size_bytes.div_ceil(ARENA_STEP_BYTES)).map(move |i| {
        let offset = i * ARENA_STEP_BYTES;
        (offset, ARENA_STEP_BYTES.min(size_bytes - offset))
    })
}

/// A shared mapping of an arena's fd.
#[derive(Debug)]
pub struct SharedArena {
    fd: OwnedFd,
    map: MmapRaw,
    size_bytes: u64,
}

impl SharedArena {
    /// Creates a new arena of `size_bytes` and maps it.
    pub fn create(name: &str, size_bytes: u64, options: &ArenaOptions) -> Result<Self, ArenaError> {
        Self::create_with_progress(name, size_bytes, options, &mut |_, _, _| {})
    }

    /// [`SharedArena::create`], telling `progress(stage, done_bytes, total_bytes)` after each
    /// [`ARENA_STEP_BYTES`] of the work that takes time on a large arena: reserving the pages
    /// (`fallocate`, which zeroes them) and pre-faulting the mapping.
    pub fn create_with_progress(
        name: &str,
        size_bytes: u64,
        options: &ArenaOptions,
        progress: &mut dyn FnMut(ArenaStage, u64, u64),
    ) -> Result<Self, ArenaError> {
        let fd: OwnedFd =
            match &options.hugepages_dir {
                None => memfd_create(&memfd_name(name), MemFdCreateFlag::MFD_CLOEXEC).map_err(
                    |errno| ArenaError::MemfdCreate {
                        size_bytes,
                        source: errno.into(),
                    },
                )?,
                Some(dir) => create_unlinked_file(dir, name)?,
            };
        let size_bytes = match &options.hugepages_dir {
            // hugetlbfs sizes are whole huge pages.
            Some(dir) => round_up(size_bytes, huge_page_size(dir)),
            None => size_bytes,
        };
        let file = File::from(fd);
        file.set_len(size_bytes)
            .map_err(|source| ArenaError::Resize { size_bytes, source })?;
        if options.prefault && options.hugepages_dir.is_none() {
            // Reserve the pages up front so a full tmpfs fails here, not on a client's write.
            for (offset, len) in steps(size_bytes) {
                nix::fcntl::fallocate(
                    file.as_raw_fd(),
                    nix::fcntl::FallocateFlags::empty(),
                    offset as i64,
                    len as i64,
                )
                .map_err(|errno| ArenaError::Resize {
                    size_bytes,
                    source: errno.into(),
                })?;
                progress(ArenaStage::Reserving, offset + len, size_bytes);
            }
        }
        let mut map = MmapOptions::new()
            .len(size_bytes as usize)
            .map_raw(&file)
            .map_err(|source| ArenaError::Map { size_bytes, source })?;
        if options.prefault {
            for (offset, len) in steps(size_bytes) {
                let advised =
                    map.advise_range(Advice::PopulateWrite, offset as usize, len as usize);
                if advised.is_err() {
                    // A kernel before 5.14 has no MADV_POPULATE_WRITE: populate the whole
                    // mapping at once instead, without progress.
                    map = MmapOptions::new()
                        .len(size_bytes as usize)
                        .populate()
                        .map_raw(&file)
                        .map_err(|source| ArenaError::Map { size_bytes, source })?;
                    progress(ArenaStage::Prefaulting, size_bytes, size_bytes);
                    break;
                }
                progress(ArenaStage::Prefaulting, offset + len, size_bytes);
            }
        }
        Ok(Self {
            fd: file.into(),
            map,
            size_bytes,
        })
    }

    /// Maps an arena fd received from the daemon, checking it holds `size_bytes`.
    pub fn from_fd(fd: OwnedFd, size_bytes: u64) -> Result<Self, ArenaError> {
        let file = File::from(fd);
        let actual_bytes = file
            .metadata()
            .map_err(|source| ArenaError::Map { size_bytes, source })?
            .len();
        if actual_bytes < size_bytes {
            return Err(ArenaError::SizeMismatch {
                expected_bytes: size_bytes,
                actual_bytes,
            });
        }
        let map = MmapOptions::new()
            .len(size_bytes as usize)
            .map_raw(&file)
            .map_err(|source| ArenaError::Map { size_bytes, source })?;
        Ok(Self {
            fd: file.into(),
            map,
            size_bytes,
        })
    }

    /// The arena's fd, to pass to clients.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Start address of the mapping, for memory registration with an RDMA device.
    pub fn base_addr(&self) -> usize {
        self.map.as_ptr() as usize
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), OutOfArena> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(OutOfArena {
                offset,
                len,
                arena_bytes: self.size_bytes,
            }),
        }
    }

    /// The bytes of `[offset, offset + len)`.
    ///
    /// # Safety
    /// Nothing may write the range, in this process or another one mapping the arena, while
    /// the slice lives: the store keeps it unchanged for the caller (a sealed object the caller
    /// holds a reference to or has pinned), or the caller has it exclusively.
    pub unsafe fn bytes(&self, offset: u64, len: u64) -> Result<&[u8], OutOfArena> {
        self.check(offset, len)?;
        // SAFETY: the range is inside the mapping (checked above), the mapping lives as long as
        // `self`, and nothing writes it while the slice lives (the caller's contract).
        Ok(unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(offset as usize), len as usize)
        })
    }

    /// A mutable view of `[offset, offset + len)`, for fabrics that receive READ data straight
    /// into the arena.
    ///
    /// # Safety
    /// The caller has exclusive use of the range for the life of the slice: the store granted
    /// it to one transfer (a created, unsealed object), and nothing else in this process reads
    /// or writes it meanwhile.
    #[allow(clippy::mut_from_ref)] // Exclusivity is the caller's contract, as for a raw pointer.
    pub(crate) unsafe fn bytes_mut(&self, offset: u64, len: u64) -> Result<&mut [u8], OutOfArena> {
        self.check(offset, len)?;
        // SAFETY: in bounds (checked above), mapping alive as long as `self`, exclusivity is the
        // caller's contract (see `# Safety`).
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset as usize), len as usize)
        })
    }

    /// Copies `data` into the arena at `offset`.
    ///
    /// # Safety
    /// The store granted `[offset, offset + data.len())` to the caller exclusively (an unsealed
    /// object it created, or a transfer's destination): no reference to the range is alive,
    /// and nothing else reads or writes it during the call.
    pub unsafe fn write(&self, offset: u64, data: &[u8]) -> Result<(), OutOfArena> {
        self.check(offset, data.len() as u64)?;
        // SAFETY: the range is inside the mapping (checked above); the caller has it
        // exclusively (see `# Safety`), so no reference to it is alive in this process.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(offset as usize),
                data.len(),
            );
        }
        Ok(())
    }
}

/// An exclusive, writable range of an arena: an unsealed object a client is filling.
#[derive(Debug)]
pub struct WritableRegion {
    arena: Arc<SharedArena>,
    offset: u64,
    len: u64,
}

impl WritableRegion {
    /// Takes `[offset, offset + len)` of `arena` for writing.
    ///
    /// # Safety
    /// The store granted the range to the caller exclusively (an unsealed object it created),
    /// and no other view of the range ([`WritableRegion`], [`ReadableRegion`],
    /// [`SharedArena::bytes`]) exists or is made while this region lives: the store gives each
    /// unsealed object to exactly one creator, and the caller makes exactly one region of it.
    pub unsafe fn new(arena: Arc<SharedArena>, offset: u64, len: u64) -> Result<Self, OutOfArena> {
        arena.check(offset, len)?;
        Ok(Self { arena, offset, len })
    }

    /// The bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the range was checked in `new`, the Arc keeps the mapping alive, and this
        // region is the only view of these bytes (the contract of `new`); `&mut self` makes the
        // borrow unique within this process.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.arena.map.as_mut_ptr().add(self.offset as usize),
                self.len as usize,
            )
        }
    }

    /// The bytes, for reading back.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`; `&self` rules out a live mutable borrow.
        unsafe {
            std::slice::from_raw_parts(
                self.arena.map.as_ptr().add(self.offset as usize),
                self.len as usize,
            )
        }
    }
}

/// A read-only range of an arena: a sealed object a client holds a reference to.
#[derive(Debug, Clone)]
pub struct ReadableRegion {
    arena: Arc<SharedArena>,
    offset: u64,
    len: u64,
}

impl ReadableRegion {
    /// Views `[offset, offset + len)` of `arena`.
    ///
    /// # Safety
    /// Nothing writes the range while this region (or a clone) lives: it is a sealed object
    /// the caller holds a reference to, which the store neither changes nor frees until the
    /// reference is released, and the caller releases it only after dropping the region.
    pub unsafe fn new(arena: Arc<SharedArena>, offset: u64, len: u64) -> Result<Self, OutOfArena> {
        arena.check(offset, len)?;
        Ok(Self { arena, offset, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: range checked in `new`, mapping kept alive by the Arc, and nothing writes the
        // range while the region lives (the contract of `new`).
        unsafe {
            std::slice::from_raw_parts(
                self.arena.map.as_ptr().add(self.offset as usize),
                self.len as usize,
            )
        }
    }
}

fn memfd_name(name: &str) -> CString {
    // A name is only a label in /proc; interior NULs are dropped rather than failing.
    CString::new(name.replace('\0', "")).expect("NULs were removed")
}

fn create_unlinked_file(dir: &Path, name: &str) -> Result<OwnedFd, ArenaError> {
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|source| ArenaError::CreateFile {
            dir: dir.to_path_buf(),
            source,
        })?;
    // The fd keeps the pages; the name is not needed and must not outlive the process.
    let _ = std::fs::remove_file(&path);
    Ok(file.into())
}

fn huge_page_size(dir: &Path) -> u64 {
    nix::sys::statfs::statfs(dir)
        .map(|stat| stat.block_size() as u64)
        .unwrap_or(2 << 20)
        .max(4096)
}

fn round_up(n: u64, unit: u64) -> u64 {
    n.div_ceil(unit) * unit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_of_one_fd_share_bytes() {
        let arena = SharedArena::create(
            "test",
            1 << 20,
            &ArenaOptions {
                prefault: true,
                ..Default::default()
            },
        )
        .unwrap();
        let fd = arena.fd().try_clone_to_owned().unwrap();
        let other = Arc::new(SharedArena::from_fd(fd, 1 << 20).unwrap());
        // SAFETY: the test owns both mappings and uses each range through one view at a time.
        let mut region = unsafe { WritableRegion::new(other.clone(), 4096, 5) }.unwrap();
        region.as_mut_slice().copy_from_slice(b"hello");
        drop(region);
        // SAFETY: as above; the writer is gone.
        assert_eq!(unsafe { arena.bytes(4096, 5) }.unwrap(), b"hello");
        // SAFETY: as above; no view of this range exists.
        unsafe { arena.write(8192, b"world") }.unwrap();
        // SAFETY: as above; nothing writes the range any more.
        let readable = unsafe { ReadableRegion::new(other, 8192, 5) }.unwrap();
        assert_eq!(readable.as_slice(), b"world");
    }

    #[test]
    fn ranges_outside_the_arena_are_refused() {
        let arena = Arc::new(SharedArena::create("test", 4096, &ArenaOptions::default()).unwrap());
        // SAFETY: nothing else maps the arena, and no view of it is used.
        assert!(unsafe { arena.bytes(4090, 7) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { arena.bytes(u64::MAX, 2) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { WritableRegion::new(arena.clone(), 0, 4097) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { ReadableRegion::new(arena, 4096, 0) }.is_ok());
    }

    #[test]
    fn a_short_fd_is_refused() {
        let arena = SharedArena::create("test", 4096, &ArenaOptions::default()).unwrap();
        let fd = arena.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            SharedArena::from_fd(fd, 8192),
            Err(ArenaError::SizeMismatch { .. })
        ));
    }
}
