//! libibverbs, opened at run time: `dlopen("libibverbs.so.1")` once, every function the verbs
//! layer calls resolved into one table (versioned symbols with `dlvsym`, as NCCL's `ibvwrap`
//! does, so an old default version can never be picked up), and the data-path calls that
//! `verbs.h` defines `static inline` made through the context's ops table.
//!
//! A machine without rdma-core gets a [`LoadError`] that names the library and the package to
//! install; nothing else of Skyriver needs libibverbs.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use super::types::*;

/// The soname opened when `SKYRIVER_IBVERBS_LIB` is not set.
pub const IBVERBS_SONAME: &str = "libibverbs.so.1";

/// Environment variable naming another libibverbs to open (a path or a soname).
pub const IBVERBS_LIB_ENV: &str = "SKYRIVER_IBVERBS_LIB";

/// Why libibverbs could not be used.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LoadError {
    /// `dlopen` failed: rdma-core's user space is not installed (or not where it was said to be).
    #[error(
        "RDMA verbs unavailable: cannot load {library}: {reason}. They need rdma-core's user \
         space: install \
         `libibverbs1` and `ibverbs-providers` (Debian/Ubuntu) or `rdma-core` (RHEL, SUSE), or \
         use `--fabric tcp`"
    )]
    Open {
        /// What was opened.
        library: String,
        /// `dlerror()`'s text.
        reason: String,
    },
    /// The library lacks a function every libibverbs since rdma-core 1.1 exports.
    #[error("{library} has no {symbol}@{version}: too old or not libibverbs (use `--fabric tcp`)")]
    MissingSymbol {
        /// What was opened.
        library: String,
        /// The function.
        symbol: &'static str,
        /// Its symbol version.
        version: &'static str,
    },
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
type QueryGidEx =
    unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
type DestroyCompChannel = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
type CreateCq = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type GetCqEvent =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, c_uint);
type CreateSrq = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
type DestroySrq = unsafe extern "C" fn(*mut ibv_srq) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type QueryQp =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;

/// The libibverbs functions the verbs layer calls, resolved once.
///
/// Calling any of them is `unsafe`: each has the contract of its libibverbs function (valid,
/// live handles; writable out-parameters).
pub struct Ibverbs {
    /// `ibv_get_device_list@IBVERBS_1.1`.
    pub get_device_list: GetDeviceList,
    /// `ibv_free_device_list@IBVERBS_1.1`.
    pub free_device_list: FreeDeviceList,
    /// `ibv_get_device_name@IBVERBS_1.1`.
    pub get_device_name: GetDeviceName,
    /// `ibv_open_device@IBVERBS_1.1`.
    pub open_device: OpenDevice,
    /// `ibv_close_device@IBVERBS_1.1`.
    pub close_device: CloseDevice,
    /// `ibv_query_device@IBVERBS_1.1`.
    pub query_device: QueryDevice,
    /// `ibv_query_port@IBVERBS_1.1` (the exported one, which fills the compat prefix of
    /// `ibv_port_attr`; callers zero the struct first, as `verbs.h`'s inline wrapper does).
    pub query_port: QueryPort,
    /// `ibv_query_gid@IBVERBS_1.1`.
    pub query_gid: QueryGid,
    /// `_ibv_query_gid_ex@IBVERBS_1.11` (rdma-core 31+): the GID's type. Optional.
    pub query_gid_ex: Option<QueryGidEx>,
    /// `ibv_alloc_pd@IBVERBS_1.1`.
    pub alloc_pd: AllocPd,
    /// `ibv_dealloc_pd@IBVERBS_1.1`.
    pub dealloc_pd: DeallocPd,
    /// `ibv_reg_mr@IBVERBS_1.1`.
    pub reg_mr: RegMr,
    /// `ibv_dereg_mr@IBVERBS_1.1`.
    pub dereg_mr: DeregMr,
    /// `ibv_create_comp_channel@IBVERBS_1.0` (never re-versioned).
    pub create_comp_channel: CreateCompChannel,
    /// `ibv_destroy_comp_channel@IBVERBS_1.0`.
    pub destroy_comp_channel: DestroyCompChannel,
    /// `ibv_create_cq@IBVERBS_1.1`.
    pub create_cq: CreateCq,
    /// `ibv_destroy_cq@IBVERBS_1.1`.
    pub destroy_cq: DestroyCq,
    /// `ibv_get_cq_event@IBVERBS_1.1`.
    pub get_cq_event: GetCqEvent,
    /// `ibv_ack_cq_events@IBVERBS_1.1`.
    pub ack_cq_events: AckCqEvents,
    /// `ibv_create_srq@IBVERBS_1.1`.
    pub create_srq: CreateSrq,
    /// `ibv_destroy_srq@IBVERBS_1.1`.
    pub destroy_srq: DestroySrq,
    /// `ibv_create_qp@IBVERBS_1.1`.
    pub create_qp: CreateQp,
    /// `ibv_modify_qp@IBVERBS_1.1`.
    pub modify_qp: ModifyQp,
    /// `ibv_query_qp@IBVERBS_1.1`.
    pub query_qp: QueryQp,
    /// `ibv_destroy_qp@IBVERBS_1.1`.
    pub destroy_qp: DestroyQp,
    /// What was opened (for messages).
    pub library: String,
    // Keeps the library mapped for as long as the table lives (for the process: the table is
    // a static).
    _library: libloading::os::unix::Library,
}

static IBVERBS: OnceLock<Result<Ibverbs, LoadError>> = OnceLock::new();

/// libibverbs, loaded on first use (from `$SKYRIVER_IBVERBS_LIB`, else `libibverbs.so.1`).
pub fn ibverbs() -> Result<&'static Ibverbs, LoadError> {
    IBVERBS
        .get_or_init(|| {
            let library =
                std::env::var(IBVERBS_LIB_ENV).unwrap_or_else(|_| IBVERBS_SONAME.to_string());
            Ibverbs::open(&library)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// True when libibverbs can be loaded on this machine (whether or not it has a device).
pub fn available() -> bool {
    ibverbs().is_ok()
}

impl Ibverbs {
    fn open(library: &str) -> Result<Ibverbs, LoadError> {
        // RTLD_NOW: every symbol the library needs is bound now, so a broken install fails
        // here with dlerror's text instead of at the first verb.
        // SAFETY: loading libibverbs runs its ELF constructors, which only initialise its own
        // state (rdma-core's library has no constructors with side effects beyond that).
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(library),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| LoadError::Open {
            library: library.to_string(),
            reason: e.to_string(),
        })?;
        let handle = lib.into_raw();
        // SAFETY: `handle` is the live handle just opened; it is put back into a Library (which
        // closes it on drop) on every path below.
        let lib = unsafe { libloading::os::unix::Library::from_raw(handle) };
        let sym = Resolver { handle, library };
        // SAFETY: for every `sym.required`/`sym.optional` below, the type alias is the C
        // prototype of the named function at that symbol version, from rdma-core's verbs.h.
        let table = unsafe {
            Ibverbs {
                get_device_list: sym.required("ibv_get_device_list", "IBVERBS_1.1")?,
                free_device_list: sym.required("ibv_free_device_list", "IBVERBS_1.1")?,
                get_device_name: sym.required("ibv_get_device_name", "IBVERBS_1.1")?,
                open_device: sym.required("ibv_open_device", "IBVERBS_1.1")?,
                close_device: sym.required("ibv_close_device", "IBVERBS_1.1")?,
                query_device: sym.required("ibv_query_device", "IBVERBS_1.1")?,
                query_port: sym.required("ibv_query_port", "IBVERBS_1.1")?,
                query_gid: sym.required("ibv_query_gid", "IBVERBS_1.1")?,
                query_gid_ex: sym.optional("_ibv_query_gid_ex", "IBVERBS_1.11"),
                alloc_pd: sym.required("ibv_alloc_pd", "IBVERBS_1.1")?,
                dealloc_pd: sym.required("ibv_dealloc_pd", "IBVERBS_1.1")?,
                reg_mr: sym.required("ibv_reg_mr", "IBVERBS_1.1")?,
                dereg_mr: sym.required("ibv_dereg_mr", "IBVERBS_1.1")?,
                create_comp_channel: sym.required("ibv_create_comp_channel", "IBVERBS_1.0")?,
                destroy_comp_channel: sym.required("ibv_destroy_comp_channel", "IBVERBS_1.0")?,
                create_cq: sym.required("ibv_create_cq", "IBVERBS_1.1")?,
                destroy_cq: sym.required("ibv_destroy_cq", "IBVERBS_1.1")?,
                get_cq_event: sym.required("ibv_get_cq_event", "IBVERBS_1.1")?,
                ack_cq_events: sym.required("ibv_ack_cq_events", "IBVERBS_1.1")?,
                create_srq: sym.required("ibv_create_srq", "IBVERBS_1.1")?,
                destroy_srq: sym.required("ibv_destroy_srq", "IBVERBS_1.1")?,
                create_qp: sym.required("ibv_create_qp", "IBVERBS_1.1")?,
                modify_qp: sym.required("ibv_modify_qp", "IBVERBS_1.1")?,
                query_qp: sym.required("ibv_query_qp", "IBVERBS_1.1")?,
                destroy_qp: sym.required("ibv_destroy_qp", "IBVERBS_1.1")?,
                library: library.to_string(),
                _library: lib,
            }
        };
        Ok(table)
    }
}

struct Resolver<'a> {
    handle: *mut c_void,
    library: &'a str,
}

impl Resolver<'_> {
    /// # Safety
    ///
    /// `F` must be the function pointer type of `name` at `version`.
    unsafe fn optional<F: Copy>(&self, name: &'static str, version: &'static str) -> Option<F> {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<*mut c_void>(),
            "symbols resolve to function pointers"
        );
        let cname = CString::new(name).ok()?;
        let cversion = CString::new(version).ok()?;
        // SAFETY: `handle` is a live dlopen handle; both strings are NUL-terminated.
        let mut ptr = unsafe { libc::dlvsym(self.handle, cname.as_ptr(), cversion.as_ptr()) };
        if ptr.is_null() {
            // A library built without symbol versions (some static-PIE or vendor builds)
            // exports plain names: take the default one.
            // SAFETY: as above.
            ptr = unsafe { libc::dlsym(self.handle, cname.as_ptr()) };
        }
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `F` is a function pointer type (size checked above) of this symbol, per the
        // caller's contract; a non-null symbol address is a valid value of it.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
    }

    /// # Safety
    ///
    /// As [`Resolver::optional`].
    unsafe fn required<F: Copy>(
        &self,
        name: &'static str,
        version: &'static str,
    ) -> Result<F, LoadError> {
        // SAFETY: forwarded.
        unsafe { self.optional(name, version) }.ok_or_else(|| LoadError::MissingSymbol {
            library: self.library.to_string(),
            symbol: name,
            version,
        })
    }
}

// ---- the data-path calls verbs.h defines `static inline` --------------------------------

/// `ibv_poll_cq`: through `cq->context->ops.poll_cq`.
///
/// # Safety
///
/// `cq` is a live CQ; `wc` has room for `num_entries` entries.
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ points at its live context, whose ops table the provider filled at
    // open; poll_cq is mandatory for every provider.
    unsafe {
        let ops = &(*(*cq).context).ops;
        match ops.poll_cq {
            Some(f) => f(cq, num_entries, wc),
            None => -libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_req_notify_cq`: through `cq->context->ops.req_notify_cq`. Returns 0 or an errno.
///
/// # Safety
///
/// `cq` is a live CQ.
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: as in ibv_poll_cq.
    unsafe {
        let ops = &(*(*cq).context).ops;
        match ops.req_notify_cq {
            Some(f) => f(cq, solicited_only),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_post_send`: through `qp->context->ops.post_send`. Returns 0 or an errno.
///
/// # Safety
///
/// `qp` is a live QP; `wr` is a valid list whose scatter/gather entries name registered memory
/// that stays valid until each request's completion is polled.
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: as in ibv_poll_cq; the list's validity is the caller's contract.
    unsafe {
        let ops = &(*(*qp).context).ops;
        match ops.post_send {
            Some(f) => f(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_post_recv`: through `qp->context->ops.post_recv`. Returns 0 or an errno.
///
/// # Safety
///
/// As [`ibv_post_send`], for receive requests.
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in ibv_post_send.
    unsafe {
        let ops = &(*(*qp).context).ops;
        match ops.post_recv {
            Some(f) => f(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_post_srq_recv`: through `srq->context->ops.post_srq_recv`. Returns 0 or an errno.
///
/// # Safety
///
/// `srq` is a live SRQ; otherwise as [`ibv_post_recv`].
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in ibv_post_send.
    unsafe {
        let ops = &(*(*srq).context).ops;
        match ops.post_srq_recv {
            Some(f) => f(srq, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// The name of a device in a device list.
///
/// # Safety
///
/// `device` comes from a live `ibv_get_device_list` result.
pub unsafe fn device_name(lib: &Ibverbs, device: *mut ibv_device) -> String {
    // SAFETY: the caller passes a listed device; libibverbs returns a pointer to its
    // NUL-terminated name, valid while the list is.
    unsafe {
        let name = (lib.get_device_name)(device);
        if name.is_null() {
            return String::new();
        }
        CStr::from_ptr(name).to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_clear_error() {
        let err = Ibverbs::open("/nonexistent/libibverbs.so.1")
            .err()
            .expect("no such file");
        let text = err.to_string();
        for needle in [
            "libibverbs.so.1",
            "libibverbs1",
            "rdma-core",
            "--fabric tcp",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text:?}");
        }
    }

    #[test]
    fn a_library_that_is_not_libibverbs_is_refused_by_symbol() {
        // libc is always there and exports none of the verbs.
        let err = Ibverbs::open("libc.so.6")
            .err()
            .expect("libc is not libibverbs");
        assert!(
            matches!(
                err,
                LoadError::MissingSymbol {
                    symbol: "ibv_get_device_list",
                    ..
                }
            ),
            "{err}"
        );
    }
}
