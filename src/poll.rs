//! Spin, then block: how long the daemon's loop and a client awaiting a reply keep polling
//! after activity before they sleep in the kernel.
//!
//! A blocking wait that sleeps costs a wake-up when the answer comes: tens of microseconds on
//! an idle virtual CPU, more than the round trip itself. MPI and UCX progress engines poll
//! for a while instead, and so does Skyriver, but only right after activity: the daemon polls
//! for `--poll-us` after its last input (then sleeps in `epoll_wait` as before), and a client
//! polls its socket for up to `SKYRIVER_POLL_US` while it awaits the reply to a local request
//! (a fetch's reply waits on other nodes: the client sleeps at once and leaves the CPUs to the
//! daemons). Each poll yields the
//! CPU (`sched_yield`), so a spinner sharing a CPU with the process it waits for lets it run.
//! An idle daemon burns nothing; 0 turns polling off.

use std::time::Duration;

/// Microseconds of polling after activity unless told otherwise (chosen from
/// `skyriver bench breakdown` runs; see the README).
pub const DEFAULT_POLL_US: u64 = 50;

/// The environment variable clients (and the daemon, under its `--poll-us` flag) read.
pub const POLL_US_ENV: &str = "SKYRIVER_POLL_US";

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
