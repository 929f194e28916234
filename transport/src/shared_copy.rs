//! Copies out of memory that other threads or processes may write while it is copied.
//!
//! A buffer handed over by foreign code (a Python object's buffer-protocol export, a region
//! another process maps) is only borrowed: its owner may write it at any time, from any
//! thread. A Rust slice over it would promise the compiler that nobody writes it while the
//! slice lives, which is not ours to promise. [`SharedBytes`] never forms one: it keeps the
//! owner that keeps the bytes mapped, and copies them out through raw pointers into memory
//! the caller owns. A write that races with the copy gives a torn copy (some old bytes, some
//! new), as any copy of memory its owner still writes must; the copy itself stays defined.

use std::fmt;
use std::ptr::NonNull;

/// Borrowed bytes that their owner may write at any time, readable only by copying.
///
/// Made from a raw range and the value that keeps the range mapped (`Owner`, e.g. a Python
/// buffer export); the range stays valid while this lives, since it holds the owner.
pub struct SharedBytes<Owner> {
    start: NonNull<u8>,
    len: usize,
    /// Keeps the range mapped; dropped after the last copy.
    _owner: Owner,
}

// SAFETY: `SharedBytes` only reads its range, by raw copies that tolerate concurrent writers
// (see `copy_to`), so moving it to another thread (or sharing it) is as safe as moving or
// sharing its owner, which keeps the range mapped wherever it goes.
unsafe impl<Owner: Send> Send for SharedBytes<Owner> {}
// SAFETY: as above: `&SharedBytes` allows only copies out of the range.
unsafe impl<Owner: Sync> Sync for SharedBytes<Owner> {}

impl<Owner> SharedBytes<Owner> {
    /// The `len` bytes at `start`, kept mapped by `owner`.
    ///
    /// # Safety
    ///
    /// The `len` bytes at `start` must be readable (mapped, and not freed or unmapped) for as
    /// long as `owner` lives, whoever else writes them meanwhile. `start` may be null or
    /// dangling when `len` is 0.
    pub unsafe fn new(owner: Owner, start: *const u8, len: usize) -> Self {
        let (start, len) = match NonNull::new(start.cast_mut()) {
            Some(start) if len > 0 => (start, len),
            _ => (NonNull::dangling(), 0),
        };
        Self {
            start,
            len,
            _owner: owner,
        }
    }

    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The owner that keeps the range mapped.
    pub fn owner(&self) -> &Owner {
        &self._owner
    }

    /// Copies `destination.len()` bytes from `offset` into `destination`.
    ///
    /// # Panics
    ///
    /// When `offset + destination.len()` is past the end of the range, as `copy_from_slice`
    /// panics on a length mismatch.
    pub fn copy_to(&self, offset: usize, destination: &mut [u8]) {
        let end = offset.checked_add(destination.len());
        assert!(
            end.is_some_and(|end| end <= self.len),
            "copy of {} bytes at offset {offset} out of {} shared bytes",
            destination.len(),
            self.len
        );
        if destination.is_empty() {
            return;
        }
        // SAFETY: `offset..offset + destination.len()` lies within the range (checked above),
        // which the owner we hold keeps readable (the contract of `new`). `destination` is a
        // unique borrow of memory we own, so it cannot overlap a range another owner lends.
        // No reference to the shared bytes is formed: bytes a concurrent writer changes
        // mid-copy are copied old or new, which the caller accepts by copying a shared buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.start.as_ptr().add(offset),
                destination.as_mut_ptr(),
                destination.len(),
            );
        }
    }

    /// A copy of all the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut copy = vec![0; self.len];
        self.copy_to(0, &mut copy);
        copy
    }
}

impl<Owner> fmt::Debug for SharedBytes<Owner> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBytes")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(bytes: &[u8]) -> SharedBytes<()> {
        // SAFETY: the tests' byte strings outlive every copy made from them.
        unsafe { SharedBytes::new((), bytes.as_ptr(), bytes.len()) }
    }

    #[test]
    fn copies_a_part_of_the_range() {
        let bytes = *b"hello, world";
        let source = shared(&bytes);
        let mut copy = [0u8; 5];
        source.copy_to(7, &mut copy);
        assert_eq!(&copy, b"world");
        assert_eq!(source.to_vec(), bytes);
        assert_eq!(source.len(), 12);
    }

    #[test]
    fn an_empty_range_may_start_anywhere() {
        // SAFETY: nothing is read from an empty range.
        let empty = unsafe { SharedBytes::new((), std::ptr::null(), 0) };
        assert!(empty.is_empty());
        assert_eq!(empty.to_vec(), Vec::<u8>::new());
        empty.copy_to(0, &mut []);
    }

    #[test]
    #[should_panic(expected = "out of 3 shared bytes")]
    fn a_copy_past_the_end_is_refused() {
        shared(b"abc").copy_to(2, &mut [0u8; 2]);
    }

    #[test]
    #[should_panic(expected = "out of 3 shared bytes")]
    fn an_offset_that_overflows_is_refused() {
        shared(b"abc").copy_to(usize::MAX, &mut [0u8; 2]);
    }

    #[test]
    fn the_owner_lives_as_long_as_the_copies() {
        let owner = std::sync::Arc::new(*b"kept");
        // SAFETY: the Arc's bytes live while the SharedBytes holds a clone of it.
        let source = unsafe { SharedBytes::new(owner.clone(), owner.as_ptr(), owner.len()) };
        drop(owner);
        assert_eq!(std::sync::Arc::strong_count(source.owner()), 1);
        assert_eq!(source.to_vec(), b"kept");
    }
}
