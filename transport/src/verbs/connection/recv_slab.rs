//! The receive slab of a connection and the messages lent out of it.
//!
//! A message that arrived in a receive slot can be taken out of the connection as a
//! [`RecvMessage`]: an owned handle that derefs to the bytes, still in the slot they arrived in.
//! The slot is not re-posted while the handle lives; dropping the handle (on any thread) hands
//! the slot back, and the connection's owner re-posts it at its next
//! [`VerbsConnection::reclaim_returned`](super::VerbsConnection::reclaim_returned). So the
//! number of messages received and not yet consumed is bounded by the receive slots, and a
//! sender faster than the consumer finds no posted slot: its SENDs wait on receiver-not-ready
//! retries (RNR back-pressure) instead of piling up in memory here.
//!
//! The hand-off is one `Mutex<Vec<u32>>` of returned slot indexes plus an optional wake-up
//! callback, so the owner (a poller that may sleep on completion events) hears about returns.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use memmap2::MmapRaw;

/// A callback run after a lent slot came back, to wake whoever re-posts slots.
pub type ReturnWaker = Box<dyn Fn() + Send + Sync>;

/// The registered memory of the receive slots, shared with the messages lent out of it, so
/// it stays mapped until the last of them is dropped (even after the connection is gone).
pub(super) struct RecvSlab {
    mem: MmapRaw,
    slot_bytes: usize,
    slots: u32,
    /// Slots whose [`RecvMessage`] was dropped, waiting to be re-posted by the owner.
    returned: Mutex<Vec<u32>>,
    waker: OnceLock<ReturnWaker>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The Vec stays consistent between statements; a panic elsewhere is already a bug.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RecvSlab {
    pub(super) fn new(mem: MmapRaw, slot_bytes: usize, slots: u32) -> RecvSlab {
        assert!(
            mem.len() >= slot_bytes * slots as usize,
            "receive slab smaller than its slots"
        );
        RecvSlab {
            mem,
            slot_bytes,
            slots,
            returned: Mutex::new(Vec::with_capacity(slots as usize)),
            waker: OnceLock::new(),
        }
    }

    /// Start of the slab, for registration and work requests.
    pub(super) fn as_mut_ptr(&self) -> *mut u8 {
        self.mem.as_mut_ptr()
    }

    pub(super) fn len(&self) -> usize {
        self.mem.len()
    }

    /// The first `len` bytes of `slot`.
    ///
    /// # Safety
    /// The device does not write the slot while the slice lives: the slot is not posted (it
    /// holds an arrived message that is neither released nor returned).
    pub(super) unsafe fn slot_bytes(&self, slot: u32, len: u32) -> &[u8] {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        let len = (len as usize).min(self.slot_bytes);
        // SAFETY: the slot lies inside the mapping (asserted above, and `new` checked the
        // slab holds every slot), which lives as long as `self`; nothing writes it meanwhile
        // (the caller's contract).
        unsafe {
            std::slice::from_raw_parts(self.mem.as_ptr().add(slot as usize * self.slot_bytes), len)
        }
    }

    /// Takes every returned slot.
    pub(super) fn take_returned(&self, into: &mut Vec<u32>) -> usize {
        let mut returned = lock(&self.returned);
        let n = returned.len();
        into.append(&mut returned);
        n
    }

    pub(super) fn set_waker(&self, waker: ReturnWaker) -> bool {
        self.waker.set(waker).is_ok()
    }

    fn give_back(&self, slot: u32) {
        lock(&self.returned).push(slot);
        if let Some(wake) = self.waker.get() {
            wake();
        }
    }
}

/// A message still in the receive slot it arrived in; see the module documentation. Dropping
/// it returns the slot for re-posting.
pub struct RecvMessage {
    slab: Arc<RecvSlab>,
    slot: u32,
    len: u32,
}

impl RecvMessage {
    /// Takes `slot` (holding `len` bytes) out of circulation until this handle is dropped.
    ///
    /// # Safety
    /// The slot holds an arrived message and is not posted, and the caller will not post it
    /// again (nor make another handle of it) until this handle is dropped.
    pub(super) unsafe fn lend(slab: Arc<RecvSlab>, slot: u32, len: u32) -> RecvMessage {
        RecvMessage { slab, slot, len }
    }

    /// The slot index, for logs and tests.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

impl Deref for RecvMessage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the slot is out of circulation while this handle lives (the contract of
        // `lend`), so the device does not write it.
        unsafe { self.slab.slot_bytes(self.slot, self.len) }
    }
}

impl Drop for RecvMessage {
    fn drop(&mut self) {
        self.slab.give_back(self.slot);
    }
}

impl fmt::Debug for RecvMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvMessage")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish()
    }
}
