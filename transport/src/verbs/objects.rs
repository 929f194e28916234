//! Owned verbs objects. Each wraps one libibverbs handle, releases it on drop, and holds an
//! `Arc` of what it was created from, so an object can never outlive its parent (a QP its CQ,
//! SRQ and PD; every object its context).
//!
//! libibverbs objects may be used from any thread (rdma-core documents its verbs as thread
//! safe); that is why these types are `Send` and `Sync`. What is not thread safe — posting to
//! one queue from two threads at once — the callers serialise (a connection is owned by one
//! thread, or behind a mutex).

use std::ffi::c_int;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::sys::types::*;
use super::sys::Ibverbs;

/// The errno of the last failed call, as an `io::Error`.
pub(crate) fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

/// A verb's return code (0, or an errno; some providers return -1 and set errno) as a result.
pub(crate) fn check_rc(rc: c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        rc if rc < 0 => Err(last_os_error()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

macro_rules! verbs_object {
    ($(#[$doc:meta])* $name:ident, $raw:ty) => {
        $(#[$doc])*
        pub struct $name {
            ptr: NonNull<$raw>,
            lib: &'static Ibverbs,
            // Dropped after the handle is released (the Drop impl runs before fields drop).
            _parents: Parents,
        }

        // SAFETY: libibverbs handles may be used from any thread; the raw pointer is only ever
        // passed to libibverbs (or read for immutable fields such as keys and numbers).
        unsafe impl Send for $name {}
        // SAFETY: as above; `&self` methods only read immutable fields or call thread-safe verbs.
        unsafe impl Sync for $name {}

        impl $name {
            /// The raw handle, for libibverbs calls. Valid while `self` lives.
            pub(crate) fn as_ptr(&self) -> *mut $raw {
                self.ptr.as_ptr()
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:p})", stringify!($name), self.ptr)
            }
        }
    };
}

/// What an object keeps alive: dropped after the object itself (field order). Held, not read
/// (except to tell whether a CQ has a channel).
#[derive(Default)]
#[allow(dead_code)]
struct Parents {
    context: Option<Arc<Context>>,
    pd: Option<Arc<ProtectionDomain>>,
    channel: Option<Arc<CompletionChannel>>,
    cq: Option<Arc<CompletionQueue>>,
    srq: Option<Arc<SharedReceiveQueue>>,
}

verbs_object!(
    /// An opened device (`ibv_open_device` / `ibv_close_device`).
    Context,
    ibv_context
);
verbs_object!(
    /// A protection domain (`ibv_alloc_pd` / `ibv_dealloc_pd`).
    ProtectionDomain,
    ibv_pd
);
verbs_object!(
    /// A memory region (`ibv_reg_mr` / `ibv_dereg_mr`).
    MemoryRegion,
    ibv_mr
);
verbs_object!(
    /// A completion channel (`ibv_create_comp_channel`): a file descriptor that becomes readable
    /// when an armed completion queue gets a completion, so an idle poller can sleep on it.
    CompletionChannel,
    ibv_comp_channel
);
verbs_object!(
    /// A completion queue (`ibv_create_cq` / `ibv_destroy_cq`).
    CompletionQueue,
    ibv_cq
);
verbs_object!(
    /// A shared receive queue (`ibv_create_srq` / `ibv_destroy_srq`).
    SharedReceiveQueue,
    ibv_srq
);
verbs_object!(
    /// A queue pair (`ibv_create_qp` / `ibv_destroy_qp`).
    QueuePair,
    ibv_qp
);

impl Context {
    /// Wraps a context `ibv_open_device` returned (null: the call failed, errno set).
    ///
    /// # Safety
    ///
    /// `ptr` is null or a context opened with `lib` and owned by nobody else.
    pub(crate) unsafe fn from_raw(
        lib: &'static Ibverbs,
        ptr: *mut ibv_context,
    ) -> io::Result<Arc<Context>> {
        let ptr = NonNull::new(ptr).ok_or_else(last_os_error)?;
        Ok(Arc::new(Context {
            ptr,
            lib,
            _parents: Parents::default(),
        }))
    }

    /// `ibv_alloc_pd`.
    pub(crate) fn alloc_pd(self: &Arc<Self>) -> io::Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is live (owned by self).
        let pd = unsafe { (self.lib.alloc_pd)(self.as_ptr()) };
        let ptr = NonNull::new(pd).ok_or_else(last_os_error)?;
        Ok(Arc::new(ProtectionDomain {
            ptr,
            lib: self.lib,
            _parents: Parents {
                context: Some(self.clone()),
                ..Parents::default()
            },
        }))
    }

    /// `ibv_create_comp_channel`, its fd made non-blocking (events are read by
    /// [`CompletionChannel::take_events`] after `poll(2)` says the fd is readable).
    pub(crate) fn create_completion_channel(
        self: &Arc<Self>,
    ) -> io::Result<Arc<CompletionChannel>> {
        // SAFETY: the context is live.
        let ch = unsafe { (self.lib.create_comp_channel)(self.as_ptr()) };
        let ptr = NonNull::new(ch).ok_or_else(last_os_error)?;
        let channel = Arc::new(CompletionChannel {
            ptr,
            lib: self.lib,
            _parents: Parents {
                context: Some(self.clone()),
                ..Parents::default()
            },
        });
        let fd = channel.fd();
        // SAFETY: fcntl on the channel's own open fd.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(last_os_error());
        }
        Ok(channel)
    }

    /// `ibv_create_cq` with `cqe` entries, reporting to `channel` when armed.
    pub(crate) fn create_cq(
        self: &Arc<Self>,
        cqe: u32,
        channel: Option<&Arc<CompletionChannel>>,
    ) -> io::Result<Arc<CompletionQueue>> {
        let cqe = c_int::try_from(cqe).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: the context and (if any) the channel are live; cq_context is unused (null).
        let cq = unsafe { (self.lib.create_cq)(self.as_ptr(), cqe, std::ptr::null_mut(), ch, 0) };
        let ptr = NonNull::new(cq).ok_or_else(last_os_error)?;
        Ok(Arc::new(CompletionQueue {
            ptr,
            lib: self.lib,
            _parents: Parents {
                context: Some(self.clone()),
                channel: channel.cloned(),
                ..Parents::default()
            },
        }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of this context, so none is alive any more.
        unsafe { (self.lib.close_device)(self.as_ptr()) };
    }
}

impl ProtectionDomain {
    /// `ibv_reg_mr` of `[addr, addr + len)` with `access` flags.
    ///
    /// # Safety
    ///
    /// The range stays mapped until the region is dropped, and the caller accepts that the
    /// device reads and writes it (as `access` allows) meanwhile.
    pub(crate) unsafe fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: c_int,
    ) -> io::Result<MemoryRegion> {
        // SAFETY: the PD is live; the range's validity is the caller's contract.
        let mr = unsafe { (self.lib.reg_mr)(self.as_ptr(), addr.cast(), len, access) };
        let ptr = NonNull::new(mr).ok_or_else(last_os_error)?;
        Ok(MemoryRegion {
            ptr,
            lib: self.lib,
            _parents: Parents {
                pd: Some(self.clone()),
                ..Parents::default()
            },
        })
    }

    /// `ibv_create_srq` holding up to `max_wr` receives of one scatter/gather entry each.
    pub(crate) fn create_srq(self: &Arc<Self>, max_wr: u32) -> io::Result<SharedReceiveQueue> {
        let mut attr = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is live; attr is a valid, writable init struct.
        let srq = unsafe { (self.lib.create_srq)(self.as_ptr(), &mut attr) };
        let ptr = NonNull::new(srq).ok_or_else(last_os_error)?;
        Ok(SharedReceiveQueue {
            ptr,
            lib: self.lib,
            _parents: Parents {
                pd: Some(self.clone()),
                ..Parents::default()
            },
        })
    }

    /// `ibv_create_qp` of an RC QP whose sends and receives complete on `cq` and whose receives
    /// come from `srq`. Returns the QP and the capabilities the device granted.
    pub(crate) fn create_rc_qp(
        self: &Arc<Self>,
        cq: &Arc<CompletionQueue>,
        srq: &Arc<SharedReceiveQueue>,
        max_send_wr: u32,
        max_inline_data: u32,
    ) -> io::Result<(QueuePair, ibv_qp_cap)> {
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            srq: srq.as_ptr(),
            cap: ibv_qp_cap {
                max_send_wr,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD, CQ and SRQ are live; attr is valid and writable (the provider writes
        // the granted capabilities back into attr.cap).
        let qp = unsafe { (self.lib.create_qp)(self.as_ptr(), &mut attr) };
        let ptr = NonNull::new(qp).ok_or_else(last_os_error)?;
        let qp = QueuePair {
            ptr,
            lib: self.lib,
            _parents: Parents {
                pd: Some(self.clone()),
                cq: Some(cq.clone()),
                srq: Some(srq.clone()),
                ..Parents::default()
            },
        };
        Ok((qp, attr.cap))
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every region, SRQ and QP of this PD holds an Arc of it: none is alive.
        unsafe { (self.lib.dealloc_pd)(self.as_ptr()) };
    }
}

impl MemoryRegion {
    /// Local key.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live; lkey is set at registration and never changes.
        unsafe { (*self.as_ptr()).lkey }
    }

    /// Remote key.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as lkey.
        unsafe { (*self.as_ptr()).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: the MR is live and owned; after this the device no longer touches its range.
        unsafe { (self.lib.dereg_mr)(self.as_ptr()) };
    }
}

impl CompletionChannel {
    /// The channel's file descriptor (non-blocking): readable when an armed CQ got a completion.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; fd is set at creation and never changes.
        unsafe { (*self.as_ptr()).fd }
    }

    /// Waits until the channel has an event or `timeout` passes; true if it has one. Interrupted
    /// waits count as "no event" (the caller polls its queues and comes back).
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(n > 0)
    }

    /// Reads every pending event and acknowledges each at once; returns how many there were.
    /// Never blocks. Acknowledging at once matters: destroying a CQ waits until every event
    /// read for it is acknowledged.
    pub fn take_events(&self) -> io::Result<usize> {
        let mut n = 0;
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live; the out-pointers are writable. The fd is
            // non-blocking, so this returns -1/EAGAIN when no event is pending.
            let rc = unsafe { (self.lib.get_cq_event)(self.as_ptr(), &mut cq, &mut ctx) };
            if rc != 0 {
                let e = last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(n),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            // SAFETY: `cq` is the CQ the event is for; it cannot be destroyed before this
            // acknowledgement (ibv_destroy_cq waits for it).
            unsafe { (self.lib.ack_cq_events)(cq, 1) };
            n += 1;
        }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ reporting to this channel holds an Arc of it: none is alive.
        unsafe { (self.lib.destroy_comp_channel)(self.as_ptr()) };
    }
}

impl CompletionQueue {
    /// `ibv_req_notify_cq(cq, 0)`: the next completion (of any kind) raises one event on the
    /// channel. Arm, then poll once more before sleeping, or a completion that arrived in
    /// between is missed.
    pub(crate) fn arm(&self) -> io::Result<()> {
        // SAFETY: the CQ is live.
        check_rc(unsafe { super::sys::library::ibv_req_notify_cq(self.as_ptr(), 0) })
    }

    /// True when the CQ reports to a completion channel.
    pub(crate) fn has_channel(&self) -> bool {
        self._parents.channel.is_some()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc of it: none is alive.
        unsafe { (self.lib.destroy_cq)(self.as_ptr()) };
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this SRQ holds an Arc of it: none is alive.
        unsafe { (self.lib.destroy_srq)(self.as_ptr()) };
    }
}

impl QueuePair {
    /// The QP number.
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; qp_num is set at creation and never changes.
        unsafe { (*self.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp` with the fields of `attr` named by `mask`.
    pub(crate) fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int) -> io::Result<()> {
        // SAFETY: the QP is live; attr is a valid attribute struct.
        check_rc(unsafe { (self.lib.modify_qp)(self.as_ptr(), attr, mask) })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: the QP is live and owned; destroying it stops all DMA for its work requests.
        unsafe { (self.lib.destroy_qp)(self.as_ptr()) };
    }
}
