//! A large object's spill file: a [`DIRECT_ALIGN`]-byte header block, then the object's bytes
//! padded to the alignment, written and read with `O_DIRECT` where the file system takes it.
//!
//! The file is cut into [`CHUNK_BYTES`] chunks (the first one carries the header block), each
//! moved through an aligned bounce buffer (the object's memory is only 64-byte aligned, which
//! `O_DIRECT` does not take). An object of several chunks is moved by up to
//! [`LARGE_IO_PARALLELISM`] scoped threads at once, so the device sees several requests in
//! flight and the copies to and from the bounce buffers overlap the IO.

use std::fs::{File, OpenOptions};
use std::io::IoSliceMut;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use skyriver_core::{ContentDigest, ObjectId};

use super::parse_header;

/// Chunk of a large object's IO.
pub const CHUNK_BYTES: usize = 8 << 20;
/// Alignment of `O_DIRECT` IO.
pub(super) const DIRECT_ALIGN: usize = 4096;
/// Chunks of one large object in flight at once.
pub const LARGE_IO_PARALLELISM: usize = 4;

/// A heap buffer whose usable part starts at a [`DIRECT_ALIGN`] boundary.
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuffer {
    fn new(len: usize) -> Self {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        Self {
            storage,
            start,
            len,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// An IO thread's bounce buffers, one per chunk in flight, made when first needed.
#[derive(Default)]
pub(super) struct Bounce {
    buffers: Vec<AlignedBuffer>,
}

impl Bounce {
    /// `count` buffers (at most [`LARGE_IO_PARALLELISM`]).
    fn take(&mut self, count: usize) -> &mut [AlignedBuffer] {
        let count = count.clamp(1, LARGE_IO_PARALLELISM);
        while self.buffers.len() < count {
            self.buffers.push(AlignedBuffer::new(CHUNK_BYTES));
        }
        &mut self.buffers[..count]
    }
}

/// One chunk: a range of the file and the part of the object in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    /// Offset in the file (aligned).
    file_offset: usize,
    /// Offset of its first object byte in the object.
    object_offset: usize,
    /// Object bytes in it.
    object_len: usize,
}

impl Chunk {
    /// Where its object bytes start in the chunk (after the header block in the first).
    fn skip(&self) -> usize {
        if self.file_offset == 0 {
            DIRECT_ALIGN
        } else {
            0
        }
    }

    /// File bytes the chunk covers, padded to the alignment.
    fn padded_len(&self) -> usize {
        (self.skip() + self.object_len).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
    }
}

/// The chunks of a file holding an object of `len` bytes.
fn chunks(len: usize) -> Vec<Chunk> {
    let mut chunks = Vec::with_capacity((DIRECT_ALIGN + len).div_ceil(CHUNK_BYTES));
    let mut file_offset = 0;
    let mut object_offset = 0;
    loop {
        let room = CHUNK_BYTES - if file_offset == 0 { DIRECT_ALIGN } else { 0 };
        let object_len = room.min(len - object_offset);
        chunks.push(Chunk {
            file_offset,
            object_offset,
            object_len,
        });
        object_offset += object_len;
        file_offset += CHUNK_BYTES;
        if object_offset == len {
            return chunks;
        }
    }
}

/// Runs `work` on every chunk, with the chunk's part of `object`, on up to
/// [`LARGE_IO_PARALLELISM`] threads (this one alone for a single chunk); the first error wins.
fn for_each_chunk<T: Send, R: Send>(
    chunks: Vec<(Chunk, T)>,
    bounce: &mut Bounce,
    work: impl Fn(Chunk, T, &mut [u8]) -> std::io::Result<R> + Sync,
) -> std::io::Result<Vec<R>> {
    let buffers = bounce.take(chunks.len());
    if buffers.len() == 1 {
        let buffer = buffers[0].as_mut_slice();
        return chunks
            .into_iter()
            .map(|(chunk, part)| work(chunk, part, buffer))
            .collect();
    }
    let workers = buffers.len();
    let mut shares: Vec<Vec<(Chunk, T)>> = (0..workers).map(|_| Vec::new()).collect();
    for (n, item) in chunks.into_iter().enumerate() {
        shares[n % workers].push(item);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .into_iter()
            .zip(buffers.iter_mut())
            .map(|(share, buffer)| {
                scope.spawn(move || {
                    let buffer = buffer.as_mut_slice();
                    share
                        .into_iter()
                        .map(|(chunk, part)| work(chunk, part, buffer))
                        .collect::<std::io::Result<Vec<R>>>()
                })
            })
            .collect();
        let mut results = Vec::new();
        for handle in handles {
            // A worker panics only on a bug; pass it on.
            let share = handle.join().expect("a spill chunk worker panicked")?;
            results.extend(share);
        }
        Ok(results)
    })
}

/// Cuts `object` into the parts of `chunks` (in order, disjoint).
fn split<B>(chunks: &[Chunk], mut object: B, split_at: impl Fn(B, usize) -> (B, B)) -> Vec<B> {
    let mut parts = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let (part, rest) = split_at(object, chunk.object_len);
        parts.push(part);
        object = rest;
    }
    parts
}

/// Opens a large object's file with `O_DIRECT` where the file system takes it.
fn open_large(path: &Path, create: bool) -> std::io::Result<(File, bool)> {
    let mut options = OpenOptions::new();
    options.read(true);
    if create {
        options.write(true).create_new(true);
    }
    let direct = options
        .clone()
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(path);
    match direct {
        Ok(file) => Ok((file, true)),
        Err(error) if error.raw_os_error() == Some(nix::libc::EINVAL) => {
            Ok((options.open(path)?, false))
        }
        Err(error) => Err(error),
    }
}

/// Writes `header` and `bytes` to a new file at `path`, durably.
pub(super) fn write_large_file(
    path: &Path,
    header: &[u8; 64],
    bytes: &[u8],
    bounce: &mut Bounce,
) -> std::io::Result<()> {
    let (file, direct) = open_large(path, true)?;
    let layout = chunks(bytes.len());
    let parts = split(&layout, bytes, |b, at| b.split_at(at));
    let work = |chunk: Chunk, part: &[u8], buffer: &mut [u8]| {
        let skip = chunk.skip();
        if skip > 0 {
            buffer[..skip].fill(0);
            buffer[..header.len()].copy_from_slice(header);
        }
        buffer[skip..skip + part.len()].copy_from_slice(part);
        let mut len = skip + part.len();
        if direct {
            let padded = chunk.padded_len();
            buffer[len..padded].fill(0);
            len = padded;
        }
        file.write_all_at(&buffer[..len], chunk.file_offset as u64)
    };
    for_each_chunk(layout.into_iter().zip(parts).collect(), bounce, work)?;
    file.sync_data()
}

/// Reads a large object's file into `into`; the digest its header names, or `None` when the
/// header is not intact (or names another object or length).
///
/// With `O_DIRECT`, a chunk whose part of `into` starts on a [`DIRECT_ALIGN`] boundary (an
/// object of whole megabytes usually does) is read straight into it, the header block into
/// the bounce buffer in the same `preadv`; only the unaligned tail goes through the bounce
/// buffer. Otherwise the chunk is read into the bounce buffer and copied.
pub(super) fn read_large_file(
    path: &Path,
    object: ObjectId,
    into: &mut [u8],
    bounce: &mut Bounce,
) -> std::io::Result<Option<ContentDigest>> {
    let (file, direct) = open_large(path, false)?;
    let expected_len = into.len() as u64;
    let layout = chunks(into.len());
    let parts = split(&layout, into, |b, at| b.split_at_mut(at));
    let work = |chunk: Chunk, part: &mut [u8], buffer: &mut [u8]| {
        if direct && (part.as_ptr() as usize) % DIRECT_ALIGN == 0 {
            read_chunk_in_place(&file, chunk, part, buffer)?;
        } else {
            read_chunk_bounced(&file, chunk, part, buffer)?;
        }
        if chunk.file_offset == 0 {
            return Ok(match parse_header(&buffer[..64], object) {
                Some((len, digest)) if len == expected_len => Some(Some(digest)),
                _ => Some(None),
            });
        }
        Ok(None)
    };
    let results = for_each_chunk(layout.into_iter().zip(parts).collect(), bounce, work)?;
    Ok(results.into_iter().flatten().next().flatten())
}

/// Reads `chunk` into `buffer` and copies its object bytes to `part` (the header block, in
/// the first chunk, stays at the start of `buffer`).
fn read_chunk_bounced(
    file: &File,
    chunk: Chunk,
    part: &mut [u8],
    buffer: &mut [u8],
) -> std::io::Result<()> {
    let padded = chunk.padded_len();
    let wanted = chunk.skip() + part.len();
    let got = read_full_at(file, &mut buffer[..padded], chunk.file_offset as u64)?;
    if got < wanted {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    part.copy_from_slice(&buffer[chunk.skip()..wanted]);
    Ok(())
}

/// Reads `chunk` with `O_DIRECT` straight into `part` (which starts on a [`DIRECT_ALIGN`]
/// boundary), but for the header block (into the start of `buffer`) and the tail past the last
/// whole alignment unit (through `buffer`, then copied). A short read (a truncated file, or a
/// signal) falls back to [`read_chunk_bounced`], which tells the two apart.
fn read_chunk_in_place(
    file: &File,
    chunk: Chunk,
    part: &mut [u8],
    buffer: &mut [u8],
) -> std::io::Result<()> {
    let skip = chunk.skip();
    let aligned_len = part.len() / DIRECT_ALIGN * DIRECT_ALIGN;
    let (aligned, tail) = part.split_at_mut(aligned_len);
    let expected = skip + aligned_len;
    let got = if expected == 0 {
        0
    } else {
        let (head, _) = buffer.split_at_mut(skip);
        let mut slices = [IoSliceMut::new(head), IoSliceMut::new(aligned)];
        let slices: &mut [IoSliceMut<'_>] = if skip == 0 {
            &mut slices[1..]
        } else {
            &mut slices[..]
        };
        match nix::sys::uio::preadv(file, slices, chunk.file_offset as i64) {
            Ok(got) => got,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(error) => return Err(error.into()),
        }
    };
    if got < expected {
        return read_chunk_bounced(file, chunk, part, buffer);
    }
    if !tail.is_empty() {
        // The header block stays in the buffer's first DIRECT_ALIGN bytes; the tail goes after.
        let tail_at = chunk.file_offset + expected;
        let room = &mut buffer[skip..skip + DIRECT_ALIGN];
        let got = read_full_at(file, room, tail_at as u64)?;
        if got < tail.len() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        tail.copy_from_slice(&room[..tail.len()]);
    }
    Ok(())
}

/// Reads up to `buffer.len()` bytes at `offset`, fewer only at the end of the file.
fn read_full_at(file: &File, buffer: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buffer.len() {
        match file.read_at(&mut buffer[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8 ^ seed)
            .collect()
    }

    /// Restores into memory on an alignment boundary (read in place with `O_DIRECT`, the tail
    /// bounced) and off it (bounced) bring back the same bytes and header.
    #[test]
    fn reads_in_place_and_bounced_bring_back_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (_, direct) = open_large(&dir.path().join("probe"), true).unwrap();
        eprintln!("O_DIRECT here: {direct} (in-place reads need it)");
        let mut bounce = Bounce::default();
        let sizes = [
            1 << 20,
            3 * DIRECT_ALIGN,
            (3 << 20) + 17,
            CHUNK_BYTES - DIRECT_ALIGN,
            CHUNK_BYTES + 5,
            2 * CHUNK_BYTES + DIRECT_ALIGN + 1,
        ];
        for (n, &len) in sizes.iter().enumerate() {
            let object = ObjectId::from_u64(n as u64);
            let data = bytes(len, n as u8);
            let digest = ContentDigest::of_contiguous(&data);
            let header = super::super::header(
                super::super::SpillOpId(n as u64),
                object,
                len as u64,
                digest,
            );
            let path = dir.path().join(format!("large-{n}.spill"));
            write_large_file(&path, &header, &data, &mut bounce).unwrap();
            for misalign in [0, 64] {
                let mut target = AlignedBuffer::new(len + misalign);
                let into = &mut target.as_mut_slice()[misalign..];
                into.fill(0xee);
                let recorded = read_large_file(&path, object, into, &mut bounce).unwrap();
                assert_eq!(recorded, Some(digest), "header of {len} bytes, +{misalign}");
                assert!(into == &data[..], "{len} bytes read at +{misalign}");
            }
            // A truncated file is damage, not other bytes.
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len((DIRECT_ALIGN + len / 2) as u64).unwrap();
            let mut target = AlignedBuffer::new(len);
            let result = read_large_file(&path, object, target.as_mut_slice(), &mut bounce);
            assert_eq!(
                result.map_err(|e| e.kind()),
                Err(std::io::ErrorKind::UnexpectedEof),
                "a truncated file of {len} bytes"
            );
        }
    }

    #[test]
    fn chunks_cover_the_object_once_with_the_header_block_first() {
        for len in [
            0,
            1,
            CHUNK_BYTES - DIRECT_ALIGN,
            CHUNK_BYTES - DIRECT_ALIGN + 1,
            3 * CHUNK_BYTES + 17,
        ] {
            let layout = chunks(len);
            assert_eq!(layout[0].file_offset, 0);
            let mut next = 0;
            for chunk in &layout {
                assert_eq!(chunk.object_offset, next, "object of {len}");
                assert_eq!(chunk.file_offset % DIRECT_ALIGN, 0);
                assert!(chunk.padded_len() <= CHUNK_BYTES);
                assert_eq!(
                    chunk.file_offset + chunk.skip(),
                    DIRECT_ALIGN + chunk.object_offset,
                    "file position of object byte {}",
                    chunk.object_offset
                );
                next += chunk.object_len;
            }
            assert_eq!(next, len);
        }
    }
}
