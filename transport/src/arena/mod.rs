//! Shared-memory arenas: the memory objects live in, mapped once by the daemon and once by
//! each client.
//!
//! An arena is a file descriptor (a memfd by default, or an unlinked file on a hugetlbfs mount)
//! and a shared mapping of it. The daemon creates it; a client receives the fd over the Unix
//! socket and maps the same pages, so object bytes are never copied between processes.
//!
//! # Views of an arena
//!
//! Whether a range may be read or written is decided by the store: an unsealed object belongs
//! to its one creator until sealed, a sealed object never changes while referenced or pinned.
//! That grant lives in the daemon's core, often in another process, and reaches the code
//! holding the mapping as a reply on a socket; no value here can witness it. What this module
//! can and does enforce is the half Rust's aliasing rules are about, within this process:
//! every view is registered in the arena's claims ([`claims`]), a [`WritableRegion`] only over
//! a range no other view overlaps, a [`ReadableRegion`] only where no writable one does, and
//! the one-off copies [`SharedArena::write`] and [`SharedArena::read`] only where no view
//! that would conflict is alive. So two `&mut` to the same bytes, or a `&mut` beside a `&`,
//! cannot be made in safe code; a range the store did not grant is a protocol bug that shows as
//! wrong bytes or a refused view, never as aliasing in this process.
//!
//! There is no other way to the bytes: the fabrics, too, take these views (the source of an
//! eager send and a served READ a [`ReadableRegion`], a READ's destination a
//! [`WritableRegion`] held until the READ completes), so a fabric's use of arena memory is in
//! the same table as the daemon's and its clients', and a conflict is refused with
//! [`ViewError::InUse`]. A readable view cannot be written through, and a view's bytes do not
//! outlive it:
//!
//! ```compile_fail
//! # use std::sync::Arc;
//! # use skyriver_transport::{ArenaOptions, ReadableRegion, SharedArena};
//! let arena = Arc::new(SharedArena::create("doc", 4096, &ArenaOptions::default()).unwrap());
//! let view = ReadableRegion::new(arena, 0, 16).unwrap();
//! view.as_mut_slice()[0] = 1; // no such method: a readable view only reads
//! ```
//!
//! ```compile_fail
//! # use std::sync::Arc;
//! # use skyriver_transport::{ArenaOptions, WritableRegion, SharedArena};
//! let arena = Arc::new(SharedArena::create("doc", 4096, &ArenaOptions::default()).unwrap());
//! let mut view = WritableRegion::new(arena, 0, 16).unwrap();
//! let bytes = view.as_mut_slice();
//! drop(view); // the claim ends here...
//! bytes[0] = 1; // ...so its bytes cannot be used after it
//! ```
//!
//! ```compile_fail
//! # use skyriver_transport::{ArenaOptions, SharedArena};
//! let arena = SharedArena::create("doc", 4096, &ArenaOptions::default()).unwrap();
//! // No unclaimed view of the mapping exists, unsafe or not.
//! let bytes = unsafe { arena.bytes(0, 16) };
//! ```

mod claims;

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
    /// The views of this mapping alive in this process.
    claims: claims::ClaimTable,
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
            claims: claims::ClaimTable::default(),
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
            claims: claims::ClaimTable::default(),
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

    /// Copies `data` into the arena at `offset` (an eager chunk into the unsealed object the
    /// store made for its transfer). Refused while any view of the range is alive here.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ViewError> {
        let len = data.len() as u64;
        self.check(offset, len)?;
        self.claims
            .while_unviewed(offset, len, true, || {
                // SAFETY: the range is inside the mapping (checked above), and no view of it is
                // alive in this process (checked, and kept so while the claims are locked): no
                // reference to these bytes exists while they are copied.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        self.map.as_mut_ptr().add(offset as usize),
                        data.len(),
                    );
                }
            })
            .ok_or(ViewError::InUse { offset, len })
    }

    /// Copies `[offset, offset + out.len())` of the arena into `out` (a sealed object this
    /// process holds, read once). Refused while a writable view of the range is alive here.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), ViewError> {
        let len = out.len() as u64;
        self.check(offset, len)?;
        self.claims
            .while_unviewed(offset, len, false, || {
                // SAFETY: the range is inside the mapping (checked above), and no writable view
                // of it is alive in this process (checked, and kept so while the claims are
                // locked); `out` is a `&mut` of the caller's, so not arena memory viewed here.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.map.as_ptr().add(offset as usize),
                        out.as_mut_ptr(),
                        out.len(),
                    );
                }
            })
            .ok_or(ViewError::InUse { offset, len })
    }
}

/// Why a view of an arena could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The range is not inside the arena.
    #[error(transparent)]
    OutOfArena(#[from] OutOfArena),
    /// Another view of the range is alive in this process (a writable view of anything
    /// viewed, or any view of something being written).
    #[error("range {offset}+{len} of the arena is in use by another view in this process")]
    InUse {
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
    },
}

/// An exclusive, writable range of an arena: an unsealed object a client is filling.
#[derive(Debug)]
pub struct WritableRegion {
    arena: Arc<SharedArena>,
    offset: u64,
    len: u64,
}

impl WritableRegion {
    /// Takes `[offset, offset + len)` of `arena` for writing: an unsealed object the store
    /// granted to this process's caller. Refused while any other view of the range is alive
    /// here.
    pub fn new(arena: Arc<SharedArena>, offset: u64, len: u64) -> Result<Self, ViewError> {
        arena.check(offset, len)?;
        if !arena.claims.claim_write(offset, len) {
            return Err(ViewError::InUse { offset, len });
        }
        Ok(Self { arena, offset, len })
    }

    /// The same bytes as a read-only view (the object was sealed), without a moment in which
    /// another writable view could be made.
    pub fn into_readable(self) -> ReadableRegion {
        self.arena.claims.write_to_read(self.offset, self.len);
        let region = ReadableRegion {
            arena: self.arena.clone(),
            offset: self.offset,
            len: self.len,
        };
        // The write claim is released above; skip this region's own release.
        std::mem::forget(self);
        region
    }

    /// Where the range starts in its arena.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The arena it is a range of.
    pub fn arena(&self) -> &Arc<SharedArena> {
        &self.arena
    }

    /// The bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the range was checked in `new`, the Arc keeps the mapping alive, and this
        // region holds the only claim on these bytes in this process (made in `new`); `&mut
        // self` makes the borrow unique.
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

impl Drop for WritableRegion {
    fn drop(&mut self) {
        self.arena.claims.release_write(self.offset, self.len);
    }
}

/// A read-only range of an arena: a sealed object a client holds a reference to.
#[derive(Debug)]
pub struct ReadableRegion {
    arena: Arc<SharedArena>,
    offset: u64,
    len: u64,
}

impl ReadableRegion {
    /// Views `[offset, offset + len)` of `arena`: a sealed object this process holds a
    /// reference to (which the store neither changes nor frees until it is released). Refused
    /// while a writable view of the range is alive here.
    pub fn new(arena: Arc<SharedArena>, offset: u64, len: u64) -> Result<Self, ViewError> {
        arena.check(offset, len)?;
        if !arena.claims.claim_read(offset, len) {
            return Err(ViewError::InUse { offset, len });
        }
        Ok(Self { arena, offset, len })
    }

    /// Where the range starts in its arena.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: range checked in `new`, mapping kept alive by the Arc, and no writable view of
        // the range exists in this process while this one holds its read claim.
        unsafe {
            std::slice::from_raw_parts(
                self.arena.map.as_ptr().add(self.offset as usize),
                self.len as usize,
            )
        }
    }
}

impl Clone for ReadableRegion {
    fn clone(&self) -> Self {
        let claimed = self.arena.claims.claim_read(self.offset, self.len);
        debug_assert!(claimed, "a read claim is held by the original");
        Self {
            arena: self.arena.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Drop for ReadableRegion {
    fn drop(&mut self) {
        self.arena.claims.release_read(self.offset, self.len);
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
        let mut region = WritableRegion::new(other.clone(), 4096, 5).unwrap();
        region.as_mut_slice().copy_from_slice(b"hello");
        drop(region);
        let mut copy = [0; 5];
        arena.read(4096, &mut copy).unwrap();
        assert_eq!(&copy, b"hello");
        arena.write(8192, b"world").unwrap();
        let readable = ReadableRegion::new(other, 8192, 5).unwrap();
        assert_eq!(readable.as_slice(), b"world");
    }

    #[test]
    fn ranges_outside_the_arena_are_refused() {
        let arena = Arc::new(SharedArena::create("test", 4096, &ArenaOptions::default()).unwrap());
        assert!(arena.read(4090, &mut [0; 7]).is_err());
        assert!(arena.write(u64::MAX, &[0; 2]).is_err());
        assert!(WritableRegion::new(arena.clone(), 0, 4097).is_err());
        assert!(ReadableRegion::new(arena, 4096, 0).is_ok());
    }

    #[test]
    fn views_that_would_alias_are_refused() {
        let arena =
            Arc::new(SharedArena::create("test", 1 << 16, &ArenaOptions::default()).unwrap());
        let mut writer = WritableRegion::new(arena.clone(), 1024, 512).unwrap();
        let in_use = Err(ViewError::InUse {
            offset: 1500,
            len: 100,
        });
        assert_eq!(
            WritableRegion::new(arena.clone(), 1500, 100).map(|_| ()),
            in_use
        );
        assert_eq!(
            ReadableRegion::new(arena.clone(), 1500, 100).map(|_| ()),
            in_use
        );
        assert!(
            arena.write(1500, &[0; 100]).is_err(),
            "a copy under a live writer"
        );
        assert_eq!(
            arena.read(1500, &mut [0; 100]),
            in_use,
            "a copy out of a live writer's range"
        );
        writer.as_mut_slice()[0] = 7;
        // Sealed: the writer becomes a reader, and readers share.
        let reader = writer.into_readable();
        let again = ReadableRegion::new(arena.clone(), 1024, 512).unwrap();
        let clone = again.clone();
        assert_eq!(reader.as_slice()[0], 7);
        assert!(WritableRegion::new(arena.clone(), 1024, 1).is_err());
        assert!(
            arena.write(1024, &[0; 1]).is_err(),
            "a copy into a read range"
        );
        let mut copy = [0; 1];
        arena.read(1024, &mut copy).unwrap();
        assert_eq!(copy, [7], "readers share with a copy out");
        drop((reader, again));
        assert!(
            WritableRegion::new(arena.clone(), 1024, 1).is_err(),
            "the clone still reads"
        );
        drop(clone);
        assert!(WritableRegion::new(arena.clone(), 1024, 512).is_ok());
        assert!(arena.write(1024, b"free again").is_ok());
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
