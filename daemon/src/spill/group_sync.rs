//! Group commit of spill writes (persistent mode): writers that finish at about the same time
//! share one flush of their file instead of paying one each.
//!
//! A writer calls [`GroupSync::sync_after_write`] once its bytes are written: it takes a
//! ticket, and returns once a flush that *started after its write* has completed. The first
//! writer to find no flush running leads one (covering every ticket taken so far); writers
//! arriving meanwhile wait for it and, when it does not cover them, the next one of them leads
//! another. So a completion still comes after its own bytes are durable, in the order the
//! store relies on (data flushed → index record → memory freed), and N writers finishing
//! together pay one or two flushes, not N.

use std::sync::{Condvar, Mutex};

/// Tickets and flushes of one file (or directory).
#[derive(Debug, Default)]
pub(super) struct GroupSync {
    state: Mutex<SyncState>,
    flushed: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Tickets given out: writes completed and waiting for (or covered by) a flush.
    tickets: u64,
    /// Every ticket up to this one is durable.
    durable_upto: u64,
    /// A flush is running.
    flushing: bool,
    /// Flushes run (for tests and stats).
    flushes: u64,
}

impl GroupSync {
    /// Returns once a flush (`flush`, run by this writer or another) that started after this
    /// call began has succeeded. A failed flush covers nobody: its leader returns the error,
    /// and each writer it would have covered flushes again on its own turn (and gets its own
    /// result).
    pub(super) fn sync_after_write(
        &self,
        flush: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut state = self.state.lock().expect("group sync lock");
        state.tickets += 1;
        let ticket = state.tickets;
        loop {
            if state.durable_upto >= ticket {
                return Ok(());
            }
            if !state.flushing {
                break;
            }
            state = self.flushed.wait(state).expect("group sync lock");
        }
        // Lead a flush covering every ticket taken so far (all those writes are complete).
        state.flushing = true;
        let covers = state.tickets;
        drop(state);
        let result = flush();
        let mut state = self.state.lock().expect("group sync lock");
        state.flushing = false;
        state.flushes += 1;
        if result.is_ok() {
            state.durable_upto = state.durable_upto.max(covers);
        }
        drop(state);
        self.flushed.notify_all();
        result
    }

    /// Flushes run so far.
    #[cfg(test)]
    pub(super) fn flushes(&self) -> u64 {
        self.state.lock().expect("group sync lock").flushes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    /// Every writer returns only after a flush that began once its write was done; writers
    /// finishing together share flushes.
    #[test]
    fn each_write_is_covered_by_a_later_flush_and_flushes_are_shared() {
        const WRITERS: usize = 8;
        const ROUNDS: usize = 50;
        let group = Arc::new(GroupSync::default());
        // written[i]: writer i's current write is done; durable[i]: a flush that began after
        // that covered it.
        let written: Arc<Vec<AtomicBool>> =
            Arc::new((0..WRITERS).map(|_| AtomicBool::new(false)).collect());
        let durable: Arc<Vec<AtomicBool>> =
            Arc::new((0..WRITERS).map(|_| AtomicBool::new(false)).collect());
        let calls = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..WRITERS)
            .map(|me| {
                let (group, written, durable, calls) = (
                    group.clone(),
                    written.clone(),
                    durable.clone(),
                    calls.clone(),
                );
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        durable[me].store(false, Ordering::SeqCst);
                        written[me].store(true, Ordering::SeqCst);
                        calls.fetch_add(1, Ordering::SeqCst);
                        group
                            .sync_after_write(|| {
                                let seen: Vec<usize> = (0..WRITERS)
                                    .filter(|&w| written[w].load(Ordering::SeqCst))
                                    .collect();
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                for w in seen {
                                    durable[w].store(true, Ordering::SeqCst);
                                }
                                Ok(())
                            })
                            .unwrap();
                        assert!(
                            durable[me].load(Ordering::SeqCst),
                            "writer {me} returned before a flush covered its write"
                        );
                        written[me].store(false, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let writes = calls.load(Ordering::SeqCst);
        assert_eq!(writes, (WRITERS * ROUNDS) as u64);
        assert!(
            group.flushes() < writes,
            "{} flushes for {writes} writes: none shared",
            group.flushes()
        );
    }

    /// A failed flush covers nobody: the writers it would have covered flush again.
    #[test]
    fn a_failed_flush_covers_nobody() {
        let group = GroupSync::default();
        let failed = group.sync_after_write(|| Err(std::io::Error::other("disk gone")));
        assert!(failed.is_err());
        let mut flushed = false;
        group
            .sync_after_write(|| {
                flushed = true;
                Ok(())
            })
            .unwrap();
        assert!(flushed, "the next write is flushed, not taken as covered");
    }
}
