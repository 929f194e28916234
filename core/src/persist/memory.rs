//! A [`Storage`] in memory that can crash: writes not yet synced are lost, land whole, or land
//! torn, as the caller decides for each (the simulator draws it from its seed; tests choose).

use std::convert::Infallible;

use super::Storage;

/// What became of one write that was not synced when the medium crashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFate {
    /// Never reached the medium.
    Lost,
    /// Reached it whole.
    Landed,
    /// Only its first `landed_bytes` reached it (fewer than its length).
    Torn {
        /// Bytes of the write's start that landed.
        landed_bytes: usize,
    },
}

/// An unsynced write.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unsynced {
    offset: u64,
    bytes: Vec<u8>,
}

/// Bytes in memory with a durable image: what a crash leaves.
#[derive(Debug, Clone, Default)]
pub struct MemoryStorage {
    /// What reads see (every write, synced or not).
    current: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    unsynced: Vec<Unsynced>,
    /// `current` differs from `durable` by more than `unsynced` says (a shrink cut a write
    /// off): the next sync copies the whole image instead of replaying the writes.
    diverged: bool,
}

impl MemoryStorage {
    /// An empty medium.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes issued and not synced yet: `(offset, len)` in order.
    pub fn unsynced_writes(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.unsynced.iter().map(|w| (w.offset, w.bytes.len()))
    }

    /// The medium crashes: each unsynced write, in order, meets the fate `fate(offset, len)`
    /// gives it; what landed is all that is left.
    pub fn crash(&mut self, mut fate: impl FnMut(u64, usize) -> WriteFate) {
        for write in std::mem::take(&mut self.unsynced) {
            let landed = match fate(write.offset, write.bytes.len()) {
                WriteFate::Lost => 0,
                WriteFate::Landed => write.bytes.len(),
                WriteFate::Torn { landed_bytes } => landed_bytes.min(write.bytes.len()),
            };
            let at = write.offset as usize;
            self.durable[at..at + landed].copy_from_slice(&write.bytes[..landed]);
        }
        self.current.clone_from(&self.durable);
        self.diverged = false;
    }
}

impl Storage for MemoryStorage {
    type Error = Infallible;

    fn len_bytes(&mut self) -> Result<u64, Infallible> {
        Ok(self.current.len() as u64)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Infallible> {
        let at = offset as usize;
        buf.copy_from_slice(&self.current[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), Infallible> {
        let at = offset as usize;
        self.current[at..at + bytes.len()].copy_from_slice(bytes);
        self.unsynced.push(Unsynced {
            offset,
            bytes: bytes.to_vec(),
        });
        Ok(())
    }

    fn set_len(&mut self, len_bytes: u64) -> Result<(), Infallible> {
        self.current.resize(len_bytes as usize, 0);
        self.durable.resize(len_bytes as usize, 0);
        // A write cut off by a shrink cannot land any more (what of it lies below the new
        // length stays in `current` until a sync or a crash).
        let before = self.unsynced.len();
        self.unsynced
            .retain(|w| w.offset + w.bytes.len() as u64 <= len_bytes);
        self.diverged |= self.unsynced.len() != before;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), Infallible> {
        // `durable` and `current` differ only where the unsynced writes went: replaying them
        // costs what was written, not the medium's size.
        if std::mem::take(&mut self.diverged) {
            self.unsynced.clear();
            self.durable.clone_from(&self.current);
        } else {
            for write in self.unsynced.drain(..) {
                let at = write.offset as usize;
                self.durable[at..at + write.bytes.len()].copy_from_slice(&write.bytes);
            }
        }
        Ok(())
    }
}
