//! Memory windows (type 2): remote access to exactly one range of a registered region, through
//! one queue pair, until invalidated. The holder of an object binds a window over the object's
//! bytes for a rendezvous and invalidates it when the transfer ends, so a peer's READ outside
//! the object, or after the end, fails with a remote access error instead of reading memory.
//!
//! A window is allocated once ([`VerbsDevice::alloc_window`](super::VerbsDevice::alloc_window))
//! and re-bound for each use: [`VerbsConnection::bind_window`](super::VerbsConnection::bind_window)
//! posts the bind on a lane (the window is then usable only through that lane's queue pair) and
//! returns the window's new rkey; [`VerbsConnection::invalidate_window`](super::VerbsConnection::invalidate_window)
//! ends it. Both complete on the connection's completion queue like any send-queue request.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use super::objects::{last_os_error, ProtectionDomain};
use super::sys::types::*;

/// A type 2 memory window of a protection domain (`ibv_alloc_mw` / `ibv_dealloc_mw`).
pub struct MemoryWindow {
    ptr: NonNull<ibv_mw>,
    /// The rkey of the current (or last) binding; its low byte changes with every bind.
    rkey: u32,
    // Dropped after the window (the Drop impl runs first).
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs handles may be used from any thread; the pointer is only passed to
// libibverbs (and its rkey read once, at allocation).
unsafe impl Send for MemoryWindow {}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryWindow({:p}, rkey {:#x})", self.ptr, self.rkey)
    }
}

impl MemoryWindow {
    /// Allocates an unbound type 2 window in `pd`. `Unsupported` when the provider has no
    /// memory windows.
    pub(crate) fn alloc(pd: &Arc<ProtectionDomain>) -> io::Result<MemoryWindow> {
        let raw = pd.as_ptr();
        // SAFETY: the PD (and its context) is live for the call; `ops` is the provider's
        // function table, whose `alloc_mw` entry (if any) takes a PD and a window type.
        let mw = unsafe {
            match (*(*raw).context).ops.alloc_mw {
                Some(alloc) => alloc(raw, IBV_MW_TYPE_2),
                None => return Err(io::Error::from(io::ErrorKind::Unsupported)),
            }
        };
        let ptr = NonNull::new(mw).ok_or_else(last_os_error)?;
        // SAFETY: the provider returned a live window; its rkey is set at allocation.
        let rkey = unsafe { (*ptr.as_ptr()).rkey };
        Ok(MemoryWindow {
            ptr,
            rkey,
            _pd: pd.clone(),
        })
    }

    /// The raw handle, for work requests. Valid while `self` lives.
    pub(crate) fn as_ptr(&self) -> *mut ibv_mw {
        self.ptr.as_ptr()
    }

    /// The rkey of the current binding (or of the last one, once invalidated).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The rkey the next bind gives the window: the same key index with the next key byte
    /// (`ibv_inc_rkey`), so a peer holding the previous binding's rkey is refused.
    pub(crate) fn next_rkey(&self) -> u32 {
        next_rkey(self.rkey)
    }

    /// Records the rkey a posted bind gives the window, here and in the window's `rkey`
    /// field: a provider names the window by that field in the next bind or invalidation
    /// (rxe looks the window up by it), and for type 2 windows bound by a work request it is
    /// the application that keeps it current.
    pub(crate) fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
        // SAFETY: the window is live and owned by `self` (`&mut`); no other thread uses the
        // handle while a bind is posted.
        unsafe { (*self.as_ptr()).rkey = rkey };
    }
}

/// `ibv_inc_rkey`: the key index (upper 24 bits) stays, the key byte advances.
fn next_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let raw = self.as_ptr();
        // SAFETY: the window is live and owned; its context outlives it (the PD's Arc).
        unsafe {
            if let Some(dealloc) = (*(*raw).context).ops.dealloc_mw {
                dealloc(raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_next_rkey_changes_only_the_key_byte() {
        assert_eq!(super::next_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(super::next_rkey(0x1234_56ff), 0x1234_5600);
    }
}
