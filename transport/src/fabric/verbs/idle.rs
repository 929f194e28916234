//! How the verbs poller sleeps when nothing happens: on the device's completion channel (every
//! connection's CQ reports to it once armed), on each connection's TCP control stream (EOF or an
//! error there means the peer is gone), and on an eventfd that posts and shutdown write to. So an
//! idle daemon wakes only for real events, while a busy one keeps polling in batches.
//!
//! The hand-off with posting threads is one flag ([`WakeFlag`]): the poller sets `sleeping`
//! before its last look at the queues, and a waker that swaps it from true writes the
//! eventfd. A write that lands before the poller reaches `poll(2)` leaves the eventfd
//! readable, so no wake-up is lost.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::sync::{AtomicBool, Ordering};
use crate::verbs::CompletionChannel;

/// Whether the poller is (about to be) asleep, so that a thread that gave it work must wake it.
#[derive(Debug, Default)]
pub(super) struct WakeFlag {
    sleeping: AtomicBool,
    /// A planted race for the loom model: the last look comes before the flag is set.
    #[cfg(skyriver_loom)]
    look_before_announcing: bool,
}

impl WakeFlag {
    /// The poller's last look before it sleeps: announces the sleep, then runs `look` (which
    /// polls the queues and says whether it found work). `true`: nothing found, sleep (any
    /// work posted from here on wakes it); `false`: work found, the sleep is off.
    pub(super) fn last_look(&self, look: impl FnOnce() -> bool) -> bool {
        #[cfg(skyriver_loom)]
        if self.look_before_announcing {
            let found = look();
            self.sleeping.store(!found, Ordering::SeqCst);
            return !found;
        }
        self.sleeping.store(true, Ordering::SeqCst);
        let found = look();
        if found {
            self.sleeping.store(false, Ordering::SeqCst);
        }
        !found
    }

    /// Whether a thread that just posted work must wake the poller: `true` once per sleep.
    /// Cheap when it is awake: one atomic swap.
    pub(super) fn must_wake(&self) -> bool {
        self.sleeping.swap(false, Ordering::SeqCst)
    }

    /// The poller is awake again.
    pub(super) fn woke(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// A flag with the planted race, for the loom model to show it catches one.
    #[cfg(skyriver_loom)]
    fn with_planted_race() -> WakeFlag {
        WakeFlag {
            look_before_announcing: true,
            ..WakeFlag::default()
        }
    }
}

/// What ended a sleep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Woken {
    /// A completion event arrived (and was acknowledged).
    pub completions: bool,
    /// A control stream became readable or failed: check liveness now.
    pub control: bool,
}

pub(super) struct IdleWait {
    channel: Arc<CompletionChannel>,
    wake_fd: OwnedFd,
    flag: WakeFlag,
}

impl IdleWait {
    pub(super) fn new(channel: Arc<CompletionChannel>) -> io::Result<IdleWait> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(IdleWait {
            channel,
            // SAFETY: `fd` is a fresh eventfd owned by nobody else.
            wake_fd: unsafe { OwnedFd::from_raw_fd(fd) },
            flag: WakeFlag::default(),
        })
    }

    pub(super) fn channel(&self) -> &Arc<CompletionChannel> {
        &self.channel
    }

    /// The poller's last look at the queues before it sleeps (see [`WakeFlag::last_look`]):
    /// `true` when it found nothing and should [`sleep`](IdleWait::sleep).
    pub(super) fn last_look(&self, look: impl FnOnce() -> bool) -> bool {
        self.flag.last_look(look)
    }

    /// Wakes the poller if it is (about to be) asleep. Cheap when it is awake: one atomic swap.
    pub(super) fn wake(&self) {
        if self.flag.must_wake() {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter
            // (EAGAIN) still leaves it readable, which is all a wake-up needs.
            unsafe {
                libc::write(
                    self.wake_fd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }

    /// Sleeps until a completion event, a control stream event, a wake-up or `timeout`.
    /// Acknowledges the completion events and clears the eventfd before returning.
    pub(super) fn sleep(&self, control_fds: &[RawFd], timeout: Duration) -> io::Result<Woken> {
        let mut fds = Vec::with_capacity(2 + control_fds.len());
        for fd in [self.channel.fd(), self.wake_fd.as_raw_fd()] {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        fds.extend(control_fds.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        }));
        let ms = libc::c_int::try_from(timeout.as_millis())
            .unwrap_or(libc::c_int::MAX)
            .max(1);
        // SAFETY: `fds` is a valid array of that many pollfds; every fd is open for the call
        // (the channel and eventfd are owned here, control streams by connections the caller
        // holds).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        self.flag.woke();
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let mut woken = Woken::default();
        if fds[0].revents != 0 {
            woken.completions = self.channel.take_events()? > 0;
        }
        if fds[1].revents != 0 {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
            unsafe {
                libc::read(
                    self.wake_fd.as_raw_fd(),
                    (&mut count as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
        woken.control = fds[2..].iter().any(|p| p.revents != 0);
        Ok(woken)
    }
}

/// The hand-off under every interleaving of the poller's last look and a thread posting work:
/// work posted after the look always finds the flag set and wakes the poller.
#[cfg(all(test, skyriver_loom))]
mod loom_models {
    use loom::sync::atomic::AtomicBool;
    use loom::sync::{Arc, Mutex};

    use super::*;

    fn post_while_the_poller_settles(flag: WakeFlag) {
        let flag = Arc::new(flag);
        let queue = Arc::new(Mutex::new(0u32));
        // The eventfd: readable once written.
        let eventfd = Arc::new(AtomicBool::new(false));
        let poster = {
            let (flag, queue, eventfd) = (flag.clone(), queue.clone(), eventfd.clone());
            loom::thread::spawn(move || {
                *queue.lock().unwrap() += 1;
                if flag.must_wake() {
                    eventfd.store(true, Ordering::SeqCst);
                }
            })
        };
        let sleeps = flag.last_look(|| *queue.lock().unwrap() > 0);
        poster.join().unwrap();
        if sleeps {
            // The poller is in poll(2) now, with work queued: only the eventfd wakes it.
            assert!(
                eventfd.load(Ordering::SeqCst),
                "lost wake-up: work queued while the poller sleeps, and no one woke it"
            );
        }
    }

    #[test]
    fn loom_work_posted_during_the_last_look_wakes_the_poller() {
        loom::model(|| post_while_the_poller_settles(WakeFlag::default()));
    }

    #[test]
    #[should_panic(expected = "lost wake-up")]
    fn loom_finds_a_last_look_before_the_sleep_is_announced() {
        loom::model(|| post_while_the_poller_settles(WakeFlag::with_planted_race()));
    }
}
