//! How the verbs poller sleeps when nothing happens: on the device's completion channel (every
//! connection's CQ reports to it once armed), on each connection's TCP control stream (EOF or an
//! error there means the peer is gone), and on an eventfd that posts and shutdown write to. So an
//! idle daemon wakes only for real events, while a busy one keeps polling in batches.
//!
//! The hand-off with posting threads is one flag: the poller sets `sleeping` before its last
//! look at the queues, and a waker that swaps it from true writes the eventfd. A write that
//! lands before the poller reaches `poll(2)` leaves the eventfd readable, so no wake-up is lost.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::verbs::CompletionChannel;

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
    sleeping: AtomicBool,
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
            sleeping: AtomicBool::new(false),
        })
    }

    pub(super) fn channel(&self) -> &Arc<CompletionChannel> {
        &self.channel
    }

    /// Called by the poller before its last look at the queues: from now on wakers write.
    pub(super) fn prepare_to_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
    }

    /// The poller found work after all.
    pub(super) fn cancel_sleep(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// Wakes the poller if it is (about to be) asleep. Cheap when it is awake: one atomic swap.
    pub(super) fn wake(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
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
        self.sleeping.store(false, Ordering::SeqCst);
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
