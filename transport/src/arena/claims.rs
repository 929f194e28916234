//! The views of one arena alive in this process: writable ones exclusive, readable ones shared
//! with other readable ones. Making a view checks this table, so two views that would alias a
//! `&mut` cannot be made in safe code; what other processes do with the same memory is the
//! store's protocol (an unsealed object has one creator; a sealed one never changes while
//! referenced), which no value here can witness.

use std::collections::BTreeMap;

use crate::sync::{lock, Mutex, MutexGuard};

/// The claims of one arena, behind their lock: every check and the claim it leads to happen in
/// one critical section, so two threads cannot both see a range free and both take it.
#[derive(Debug, Default)]
pub(super) struct ClaimTable {
    claims: Mutex<Claims>,
    /// A planted race for the loom model: check and claim in two critical sections.
    #[cfg(skyriver_loom)]
    split_check_and_claim: bool,
}

impl ClaimTable {
    /// Claims `[offset, offset + len)` for writing, unless any view overlaps it.
    pub(super) fn claim_write(&self, offset: u64, len: u64) -> bool {
        #[cfg(skyriver_loom)]
        if self.split_check_and_claim {
            let free = self.lock().is_free(offset, len);
            return free && {
                let mut claims = self.lock();
                claims.writes.insert(offset, len);
                true
            };
        }
        self.lock().claim_write(offset, len)
    }

    /// Claims `[offset, offset + len)` for reading, unless a writable view overlaps it.
    pub(super) fn claim_read(&self, offset: u64, len: u64) -> bool {
        self.lock().claim_read(offset, len)
    }

    /// Turns a write claim into a read claim in one step, so no writable view of the range
    /// can be made between the two.
    pub(super) fn write_to_read(&self, offset: u64, len: u64) {
        let mut claims = self.lock();
        claims.release_write(offset, len);
        let readable = claims.claim_read(offset, len);
        debug_assert!(readable, "nothing can claim the range while it was written");
    }

    pub(super) fn release_write(&self, offset: u64, len: u64) {
        self.lock().release_write(offset, len);
    }

    pub(super) fn release_read(&self, offset: u64, len: u64) {
        self.lock().release_read(offset, len);
    }

    /// Runs `f` while no view overlaps `[offset, offset + len)` and none can be made (a
    /// one-off copy into or out of the range); `None` if a view overlaps it. `exclusive`:
    /// also refused beside readable views (a copy into the range).
    pub(super) fn while_unviewed<R>(
        &self,
        offset: u64,
        len: u64,
        exclusive: bool,
        f: impl FnOnce() -> R,
    ) -> Option<R> {
        let claims = self.lock();
        let free = if exclusive {
            claims.is_free(offset, len)
        } else {
            len == 0 || !claims.overlaps_write(offset, len)
        };
        free.then(f)
    }

    fn lock(&self) -> MutexGuard<'_, Claims> {
        lock(&self.claims)
    }

    /// A table with the planted race, for the loom model to show it catches one.
    #[cfg(skyriver_loom)]
    pub(super) fn with_planted_race() -> ClaimTable {
        ClaimTable {
            split_check_and_claim: true,
            ..ClaimTable::default()
        }
    }
}

/// Live views, by range.
#[derive(Debug, Default)]
struct Claims {
    /// Writable views: start → length. Never overlap each other.
    writes: BTreeMap<u64, u64>,
    /// Readable views: (start, length) → how many.
    reads: BTreeMap<(u64, u64), u32>,
    /// Longest readable view ever claimed, to bound the overlap search.
    longest_read: u64,
}

impl Claims {
    /// Claims `[offset, offset + len)` for writing, unless any view overlaps it.
    fn claim_write(&mut self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        if self.overlaps_write(offset, len) || self.overlaps_read(offset, len) {
            return false;
        }
        self.writes.insert(offset, len);
        true
    }

    /// Claims `[offset, offset + len)` for reading, unless a writable view overlaps it.
    fn claim_read(&mut self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        if self.overlaps_write(offset, len) {
            return false;
        }
        *self.reads.entry((offset, len)).or_default() += 1;
        self.longest_read = self.longest_read.max(len);
        true
    }

    /// Whether nothing overlaps `[offset, offset + len)` (for a one-off copy into it).
    fn is_free(&self, offset: u64, len: u64) -> bool {
        len == 0 || !(self.overlaps_write(offset, len) || self.overlaps_read(offset, len))
    }

    fn release_write(&mut self, offset: u64, len: u64) {
        if len > 0 {
            let removed = self.writes.remove(&offset);
            debug_assert_eq!(removed, Some(len), "released a write claim never made");
        }
    }

    fn release_read(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        if let Some(count) = self.reads.get_mut(&(offset, len)) {
            *count -= 1;
            if *count == 0 {
                self.reads.remove(&(offset, len));
            }
        } else {
            debug_assert!(false, "released a read claim never made");
        }
    }

    fn overlaps_write(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        // Writes never overlap each other: only the last one starting before `end` can reach
        // into the range.
        self.writes
            .range(..end)
            .next_back()
            .is_some_and(|(&start, &l)| start.saturating_add(l) > offset)
    }

    fn overlaps_read(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        for (&(start, l), _) in self.reads.range(..(end, 0)).rev() {
            if start.saturating_add(l) > offset {
                return true;
            }
            if start.saturating_add(self.longest_read) <= offset {
                break; // every earlier view ends before the range
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_exclusive_and_reads_shared() {
        let mut claims = Claims::default();
        assert!(claims.claim_write(100, 50));
        assert!(!claims.claim_write(120, 10), "inside a write");
        assert!(!claims.claim_write(60, 41), "reaching into a write");
        assert!(!claims.claim_read(149, 1), "last byte of a write");
        assert!(claims.claim_read(150, 10), "right after a write");
        assert!(claims.claim_read(150, 10), "reads share");
        assert!(!claims.claim_write(155, 1), "inside a read");
        assert!(claims.claim_write(0, 100), "right before a write");
        claims.release_write(100, 50);
        assert!(claims.claim_read(100, 50));
        claims.release_read(150, 10);
        assert!(!claims.claim_write(150, 10), "one read left");
        claims.release_read(150, 10);
        assert!(claims.claim_write(150, 10));
        assert!(claims.claim_write(7, 0), "empty ranges alias nothing");
        assert!(!claims.is_free(99, 2));
    }

    #[test]
    fn a_long_read_far_before_is_found() {
        let mut claims = Claims::default();
        assert!(claims.claim_read(0, 1000));
        assert!(claims.claim_read(10, 5));
        assert!(!claims.claim_write(900, 10), "inside the long read");
        assert!(claims.claim_write(1000, 10));
    }
}

/// The claims table under every interleaving of two writers of overlapping ranges and a reader
/// of a range both overlap: whoever is granted a claim uses the bytes, which are a loom cell,
/// so two claims that should not coexist show as a reported data race.
#[cfg(all(test, skyriver_loom))]
mod loom_models {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    use super::*;

    fn overlapping_views(table: ClaimTable) {
        let table = Arc::new(table);
        let bytes = Arc::new(UnsafeCell::new(0u8));
        let writers: Vec<_> = [(0, 10), (5, 10)]
            .into_iter()
            .map(|(offset, len)| {
                let (table, bytes) = (table.clone(), bytes.clone());
                loom::thread::spawn(move || {
                    if table.claim_write(offset, len) {
                        // SAFETY: (the model) the write claim's use of the bytes.
                        bytes.with_mut(|p| unsafe { *p += 1 });
                        table.release_write(offset, len);
                    }
                })
            })
            .collect();
        if table.claim_read(8, 4) {
            // SAFETY: (the model) the read claim's use of the bytes.
            bytes.with(|p| unsafe { *p });
            table.release_read(8, 4);
        }
        for writer in writers {
            writer.join().unwrap();
        }
    }

    #[test]
    fn loom_claims_never_let_overlapping_views_coexist() {
        loom::model(|| overlapping_views(ClaimTable::default()));
    }

    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_finds_a_claim_checked_and_taken_in_two_steps() {
        loom::model(|| overlapping_views(ClaimTable::with_planted_race()));
    }
}
