//! Timestamps on the path of a request, for `skyriver bench breakdown`: the daemon and its
//! fabric stamp named moments (a request read, a message read off the fabric, an eager reply
//! sent…) with the machine's monotonic clock, which every process of the machine shares, so
//! stamps of a client and two daemons on one machine line up. Off unless turned on; then each
//! stamp costs a clock read and an uncontended lock, and at most [`MAX_STAMPS`] are kept.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Stamps kept until collected; later ones are dropped.
pub const MAX_STAMPS: usize = 4096;

static RECORDING: AtomicBool = AtomicBool::new(false);
static STAMPS: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

/// Nanoseconds of `CLOCK_MONOTONIC`, the clock every process of this machine shares.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) cannot fail");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Whether stamps are being taken.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Stamps `event` now, when recording.
pub fn stamp(event: &'static str) {
    if recording() {
        let at = monotonic_ns();
        let mut stamps = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
        if stamps.len() < MAX_STAMPS {
            stamps.push((event, at));
        }
    }
}

/// The stamps taken since the last call, oldest first; then records from now on or not.
pub fn collect(record: bool) -> Vec<(&'static str, u64)> {
    let mut stamps = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
    RECORDING.store(record, Ordering::Relaxed);
    std::mem::take(&mut *stamps)
}
