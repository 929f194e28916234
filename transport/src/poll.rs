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
//!
//! Polling only pays while the process it waits for has a CPU of its own. On a crowded host
//! (more runnable threads than CPUs: many daemons and clients on one machine, as in `bench
//! cluster` on network namespaces, or an oversubscribed node) a spinner takes CPU time from
//! the very process that would answer it, and every `sched_yield` of N spinners hands the CPU
//! to another spinner. So both the daemon and the client look at the host's load
//! ([`HostLoad`]: the kernel's count of runnable threads in `/proc/loadavg`, at most every
//! 100 ms) and block instead while it exceeds twice the host's CPUs, and for a second after
//! ([`CROWDED_HOLD`]: blocking waiters do not count as runnable, so the count falls as soon as
//! everyone blocks; the hold keeps that from flapping back into spinning). Twice, not once:
//! a client and its daemon polling beside a busy thread or two (3–4 runnable on 2 CPUs) still
//! hand over faster by polling with `sched_yield` than by sleeping (`bench local` and `bench
//! fetch`, both placements, measured against the build that always polled: as fast polling,
//! 1.2–5× slower blocking), as do a client and daemon pinned to one CPU together; with many
//! daemons per CPU (`bench cluster`'s namespaces) blocking wins. The host's CPUs, not this
//! process's: the count is the host's too.
//! `SKYRIVER_POLL_CROWDED=spin` keeps polling whatever the load (to measure both ways).

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// The environment variable that says whether to poll on a crowded host: `spin` polls
/// whatever the load; anything else (or nothing): block while the host is crowded.
pub const POLL_CROWDED_ENV: &str = "SKYRIVER_POLL_CROWDED";

/// Least time between two looks at the host's load.
pub const LOAD_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// How long polling stays off after the host was last seen crowded.
pub const CROWDED_HOLD: Duration = Duration::from_secs(1);

/// What a poller does while the host is crowded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrowdedPolicy {
    /// Block instead of polling (the default).
    Block,
    /// Poll anyway (`SKYRIVER_POLL_CROWDED=spin`).
    Spin,
}

impl CrowdedPolicy {
    /// The policy `SKYRIVER_POLL_CROWDED` asks for.
    pub fn from_env() -> Self {
        match std::env::var(POLL_CROWDED_ENV) {
            Ok(value) if value.trim().eq_ignore_ascii_case("spin") => Self::Spin,
            _ => Self::Block,
        }
    }
}

/// Runnable threads on the host now, from `/proc/loadavg`'s fourth field (`running/total`).
pub fn parse_runnable(loadavg: &str) -> Option<u32> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

/// Whether `runnable` threads crowd a host of `cpus` CPUs so much that polling costs more
/// than it saves: more than twice as many (the looker, runnable itself, counts; see the module
/// doc for why twice).
pub fn oversubscribed(runnable: u32, cpus: u32) -> bool {
    runnable > cpus.saturating_mul(2)
}

/// The host's online CPUs (the scope of `/proc/loadavg`'s count), else this process's.
fn host_cpus() -> u32 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        })
}

/// Whether the host is too crowded to poll, from samples of its load taken at most every
/// [`LOAD_SAMPLE_INTERVAL`] and held for [`CROWDED_HOLD`].
#[derive(Debug, Clone)]
pub struct HostLoad {
    policy: CrowdedPolicy,
    cpus: u32,
    last_sample: Option<Instant>,
    crowded_until: Option<Instant>,
}

impl HostLoad {
    /// For this process: the host's online CPUs and the policy of `SKYRIVER_POLL_CROWDED`.
    pub fn from_env() -> Self {
        Self::new(CrowdedPolicy::from_env(), host_cpus())
    }

    /// With an explicit policy and CPU count.
    pub fn new(policy: CrowdedPolicy, cpus: u32) -> Self {
        Self {
            policy,
            cpus,
            last_sample: None,
            crowded_until: None,
        }
    }

    /// Whether polling should give way to blocking at `now`; looks at `/proc/loadavg` when
    /// the last look is older than [`LOAD_SAMPLE_INTERVAL`] (an unreadable file: not crowded).
    pub fn crowded(&mut self, now: Instant) -> bool {
        self.crowded_with(now, || {
            std::fs::read_to_string("/proc/loadavg")
                .ok()
                .as_deref()
                .and_then(parse_runnable)
        })
    }

    /// [`HostLoad::crowded`] with the runnable count from `sample`.
    pub fn crowded_with(&mut self, now: Instant, sample: impl FnOnce() -> Option<u32>) -> bool {
        if self.policy == CrowdedPolicy::Spin {
            return false;
        }
        let due = self
            .last_sample
            .is_none_or(|last| now.saturating_duration_since(last) >= LOAD_SAMPLE_INTERVAL);
        if due {
            self.last_sample = Some(now);
            if sample().is_some_and(|runnable| oversubscribed(runnable, self.cpus)) {
                self.crowded_until = Some(now + CROWDED_HOLD);
            }
        }
        self.crowded_until.is_some_and(|until| now < until)
    }
}

/// Whether this process should block rather than poll now (one [`HostLoad`] per process).
pub fn host_crowded() -> bool {
    static LOAD: OnceLock<Mutex<HostLoad>> = OnceLock::new();
    let load = LOAD.get_or_init(|| Mutex::new(HostLoad::from_env()));
    let mut load = load.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    load.crowded(Instant::now())
}

/// Polls `fd` until it has bytes to read (or reports an end or error) or `poll` is over,
/// yielding the CPU between looks, so the blocking read that follows finds them without a
/// wake-up. Used by the client awaiting a reply, and by the benchmarks' raw round trips so
/// they get the same tuning. Does not poll on a crowded host ([`host_crowded`]).
pub fn wait_readable(fd: std::os::fd::RawFd, poll: Duration) {
    if poll.is_zero() || host_crowded() {
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
    fn the_runnable_count_is_the_fourth_fields_numerator() {
        assert_eq!(parse_runnable("20.19 12.67 6.30 20/294 22139\n"), Some(20));
        assert_eq!(parse_runnable("0.00 0.01 0.05 1/80 7"), Some(1));
        assert_eq!(parse_runnable("0.00 0.01 0.05"), None);
        assert_eq!(parse_runnable("0.00 0.01 0.05 x/80 7"), None);
    }

    #[test]
    fn a_crowded_sample_stops_polling_for_the_hold_and_samples_are_rate_limited() {
        let start = Instant::now();
        let mut load = HostLoad::new(CrowdedPolicy::Block, 2);
        assert!(
            !load.crowded_with(start, || Some(4)),
            "4 runnable on 2 CPUs still poll"
        );
        // Within the sampling interval the file is not read again.
        let later = start + LOAD_SAMPLE_INTERVAL / 2;
        assert!(!load.crowded_with(later, || panic!("sampled too soon")));
        let crowded_at = start + LOAD_SAMPLE_INTERVAL;
        assert!(load.crowded_with(crowded_at, || Some(5)));
        // Everyone blocked, so the count fell: still held off.
        let calm = crowded_at + LOAD_SAMPLE_INTERVAL;
        assert!(load.crowded_with(calm, || Some(1)));
        assert!(!load.crowded_with(crowded_at + CROWDED_HOLD, || Some(1)));
        // Unreadable: not crowded.
        let mut unknown = HostLoad::new(CrowdedPolicy::Block, 1);
        assert!(!unknown.crowded_with(start, || None));
    }

    #[test]
    fn spin_polls_whatever_the_load() {
        let mut load = HostLoad::new(CrowdedPolicy::Spin, 1);
        assert!(!load.crowded_with(Instant::now(), || panic!("spin never samples")));
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
