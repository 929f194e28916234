//! Spin, then block: how long the daemon's loop and a client awaiting a reply keep polling
//! after activity before they sleep in the kernel.
//!
//! A blocking wait that sleeps costs a wake-up when the answer comes: tens of microseconds on
//! an idle virtual CPU, more than the round trip itself. MPI and UCX progress engines poll
//! for a while instead, and so does Skyriver, but only right after activity: the daemon polls
//! for `--poll-us` after its last input (then sleeps in `epoll_wait` as before), and a client
//! polls its socket for up to `SKYRIVER_POLL_US` while it awaits a reply (a fetch's too). Each
//! poll yields the CPU (`sched_yield`), so a spinner sharing a CPU with the process it waits
//! for lets it run. An idle daemon burns nothing; 0 turns polling off.
//!
//! The daemon's window adapts, as KVM's halt polling does: when the loop slept and its next
//! input came soon after the window ended (within `--poll-max-us` of the last input), the
//! window doubles, up to that cap, so a steady stream of requests slightly sparser than the
//! window stops paying a wake-up each; when an input comes only after a longer sleep, the
//! window goes back to `--poll-us`. An idle daemon still spins at most one window after its
//! last input.

use std::time::Duration;

/// Microseconds of polling after activity unless told otherwise (chosen from
/// `skyriver bench breakdown` runs; see the README).
pub const DEFAULT_POLL_US: u64 = 50;

/// The environment variable clients (and the daemon, under its `--poll-us` flag) read.
pub const POLL_US_ENV: &str = "SKYRIVER_POLL_US";

/// The daemon's cap on its adapted polling window unless told otherwise (`--poll-max-us`;
/// chosen from `skyriver bench breakdown` runs, see the README).
pub const DEFAULT_POLL_MAX_US: u64 = 200;

/// The daemon's polling window: `base` after a long quiet spell, grown towards `max` while
/// inputs keep coming shortly after the window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptivePoll {
    base: Duration,
    max: Duration,
    window: Duration,
}

impl AdaptivePoll {
    /// Starts at `base`; never grows past `max` (a `max` below `base` means no growth).
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            window: base,
        }
    }

    /// How long to poll after an input now.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The loop polled for the whole window, slept `slept` in the kernel and was woken by an
    /// input: grow the window if a longer one (up to the cap) would have caught that input;
    /// shrink it back to the base after a sleep longer than the cap (a quiet spell).
    pub fn woke_after_sleeping(&mut self, slept: Duration) {
        if self.base.is_zero() {
            return;
        }
        let gap = self.window + slept;
        if slept > self.max {
            self.window = self.base;
        } else if gap <= self.max {
            // Double, but at least enough to have caught this input with a quarter to spare.
            self.window = (self.window * 2).max(gap + gap / 4).min(self.max);
        }
        // Else the window is at (or near) the cap and the input came just past it: keep it.
    }
}

/// The polling time `SKYRIVER_POLL_US` asks for, else [`DEFAULT_POLL_US`] (also when it is not a
/// number).
pub fn poll_from_env() -> Duration {
    let micros = std::env::var(POLL_US_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_POLL_US);
    Duration::from_micros(micros)
}

/// Polls `fd` until it has bytes to read (or reports an end or error) or `poll` is over,
/// yielding the CPU between looks, so the blocking read that follows finds them without a
/// wake-up. Used by the client awaiting a reply, and by the benchmarks' raw round trips so
/// they get the same tuning.
pub fn wait_readable(fd: std::os::fd::RawFd, poll: Duration) {
    if poll.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    let mut probe = [0u8; 1];
    let flags = nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    loop {
        match nix::sys::socket::recv(fd, &mut probe, flags) {
            Err(nix::errno::Errno::EAGAIN) => {}
            // Bytes, the end of the stream or an error: the read reports it.
            _ => return,
        }
        if start.elapsed() >= poll {
            return;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn the_window_grows_while_inputs_come_just_after_it_and_resets_after_a_quiet_spell() {
        let mut poll = AdaptivePoll::new(us(50), us(400));
        assert_eq!(poll.window(), us(50));
        // An input 20 µs after the window ended: 70 µs after the last one.
        poll.woke_after_sleeping(us(20));
        assert_eq!(poll.window(), us(100));
        poll.woke_after_sleeping(us(150)); // 250 µs gap: 312 µs catches it
        assert_eq!(poll.window(), us(312) + Duration::from_nanos(500));
        poll.woke_after_sleeping(us(50)); // capped
        assert_eq!(poll.window(), us(400));
        // Just past the cap: a longer window is not allowed, a shorter one would not help.
        poll.woke_after_sleeping(us(1));
        assert_eq!(poll.window(), us(400));
        poll.woke_after_sleeping(us(401)); // a quiet spell: back to the base
        assert_eq!(poll.window(), us(50));
        poll.woke_after_sleeping(Duration::from_secs(3));
        assert_eq!(poll.window(), us(50));
    }

    #[test]
    fn no_polling_and_no_cap_above_the_base_never_grow() {
        let mut off = AdaptivePoll::new(Duration::ZERO, us(400));
        off.woke_after_sleeping(us(10));
        assert_eq!(off.window(), Duration::ZERO);
        let mut fixed = AdaptivePoll::new(us(50), us(10));
        fixed.woke_after_sleeping(us(1));
        assert_eq!(fixed.window(), us(50));
    }
}
