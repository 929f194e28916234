//! Device discovery, opening by name, port and GID selection, device limits.

use std::ffi::c_int;
use std::io;
use std::net::Ipv6Addr;
use std::sync::Arc;

use super::objects::{CompletionChannel, Context, ProtectionDomain};
use super::registration::{RegisterError, Registration};
use super::sys::types::*;
use super::sys::{ibverbs, Ibverbs, LoadError};
use super::window::MemoryWindow;

/// Why a device could not be listed or opened.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// libibverbs could not be loaded (rdma-core is not installed): the message names the
    /// library and the package to install.
    #[error(transparent)]
    Library(#[from] LoadError),
    /// `ibv_get_device_list` failed: the kernel has no RDMA support (no `ib_uverbs`).
    #[error("RDMA verbs unavailable (ibv_get_device_list failed; is an RDMA device present and the ib_uverbs module loaded?)")]
    VerbsUnavailable(#[source] io::Error),
    /// No device of that name; `available` lists the ones found.
    #[error("RDMA device {name:?} not found (available: {available:?})")]
    NotFound {
        /// Requested name.
        name: String,
        /// Names of the devices that exist.
        available: Vec<String>,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({name}) failed")]
    Open {
        /// Device name.
        name: String,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_device` failed.
    #[error("ibv_query_device({name}) failed")]
    QueryDevice {
        /// Device name.
        name: String,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_port` failed (for instance: no such port).
    #[error("ibv_query_port({name}, port {port}) failed: {reason}")]
    QueryPort {
        /// Device name.
        name: String,
        /// Port number.
        port: u8,
        /// Why.
        reason: String,
    },
    /// The port exists but its logical state is not ACTIVE.
    #[error("{name} port {port} is not active (state {state})")]
    PortNotActive {
        /// Device name.
        name: String,
        /// Port number.
        port: u8,
        /// Observed state.
        state: String,
    },
    /// `ibv_query_gid` failed or the GID at that index is empty.
    #[error("{name} port {port}: no usable GID at index {index}: {reason}")]
    Gid {
        /// Device name.
        name: String,
        /// Port number.
        port: u8,
        /// GID index.
        index: u32,
        /// Why it is unusable.
        reason: String,
    },
    /// No GID index was given and the port has no RoCE v2 (or IB) GID to pick.
    #[error("{name} port {port}: no RoCE v2 GID found; pass a GID index")]
    NoDefaultGid {
        /// Device name.
        name: String,
        /// Port number.
        port: u8,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd({name}) failed")]
    AllocPd {
        /// Device name.
        name: String,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// `ibv_create_comp_channel` failed.
    #[error("ibv_create_comp_channel({name}) failed")]
    CompletionChannel {
        /// Device name.
        name: String,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
}

/// Kind of the GID in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand GID (LID-routed fabric, GRH optional).
    InfiniBand,
    /// RoCE v1 (Ethernet L2).
    RoceV1,
    /// RoCE v2 (UDP/IP): the default on Ethernet.
    RoceV2,
    /// Chosen by index without a known type.
    Unknown,
}

/// The limits of a device that matter to a fabric driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest single memory registration, in bytes.
    pub max_mr_size_bytes: u64,
    /// Number of memory regions the device supports.
    pub max_mr: u32,
    /// Number of queue pairs.
    pub max_qp: u32,
    /// Work requests per queue (send or receive).
    pub max_qp_wr: u32,
    /// Scatter/gather entries per send or receive work request.
    pub max_sge: u32,
    /// Scatter/gather entries per RDMA READ.
    pub max_sge_rd: u32,
    /// Completion queue entries per CQ.
    pub max_cqe: u32,
    /// Outstanding RDMA READs a QP can serve as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA READs a QP can issue as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Supported page sizes (bit mask).
    pub page_size_cap: u64,
    /// Shared receive queues the device supports (0: none).
    pub max_srq: u32,
    /// Receive work requests per shared receive queue.
    pub max_srq_wr: u32,
}

/// The state of the port in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// Active path MTU, in bytes.
    pub active_mtu_bytes: u32,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu_bytes: u32,
    /// LID (0 on Ethernet).
    pub lid: u16,
    /// True on Ethernet (RoCE), false on InfiniBand.
    pub is_ethernet: bool,
    /// GID table length.
    pub gid_table_len: u32,
}

/// An opened RDMA device: context, one protection domain, the chosen port and GID.
///
/// Cheap to share between connections (its handles are reference counted).
pub struct VerbsDevice {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: Arc<ProtectionDomain>,
    name: String,
    port: PortInfo,
    gid_index: u32,
    gid: [u8; 16],
    gid_kind: GidKind,
    limits: DeviceLimits,
}

impl std::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("gid", &Ipv6Addr::from(self.gid))
            .field("gid_kind", &self.gid_kind)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The device list of `ibv_get_device_list`, freed on drop.
struct DeviceList {
    lib: &'static Ibverbs,
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn new() -> Result<DeviceList, DeviceError> {
        let lib = ibverbs()?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a writable int; the returned array (or null) is owned by this value.
        let list = unsafe { (lib.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(DeviceError::VerbsUnavailable(io::Error::last_os_error()));
        }
        Ok(DeviceList {
            lib,
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.len).map(|i| {
            // SAFETY: the list holds `len` valid device pointers while it lives.
            let device = unsafe { *self.list.add(i) };
            // SAFETY: a listed device.
            (device, unsafe {
                super::sys::library::device_name(self.lib, device)
            })
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once. Contexts opened
        // from it stay valid (libibverbs reference-counts the devices).
        unsafe { (self.lib.free_device_list)(self.list) };
    }
}

/// Names of the RDMA devices present (`rxe0`, `mlx5_0`, ...).
pub fn list_devices() -> Result<Vec<String>, DeviceError> {
    Ok(DeviceList::new()?.devices().map(|(_, name)| name).collect())
}

pub(crate) fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

pub(crate) fn mtu_from_bytes(bytes: u32) -> Option<u32> {
    Some(match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        _ => return None,
    })
}

fn to_u32(v: c_int) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn port_state_name(state: u32) -> String {
    match state {
        0 => "NOP".into(),
        1 => "DOWN".into(),
        2 => "INIT".into(),
        3 => "ARMED".into(),
        4 => "ACTIVE".into(),
        5 => "ACTIVE_DEFER".into(),
        n => format!("{n}"),
    }
}

impl VerbsDevice {
    /// Open device `name` (e.g. `rxe0`, `mlx5_0`) on `port` (from 1) with GID `gid_index`, or,
    /// when `None`, the port's first RoCE v2 GID (preferring an IPv4-mapped one) on Ethernet
    /// and GID 0 on InfiniBand.
    pub fn open(name: &str, port: u8, gid_index: Option<u32>) -> Result<VerbsDevice, DeviceError> {
        let list = DeviceList::new()?;
        let Some((device, _)) = list.devices().find(|(_, n)| n == name) else {
            return Err(DeviceError::NotFound {
                name: name.to_string(),
                available: list.devices().map(|(_, n)| n).collect(),
            });
        };
        let lib = list.lib;
        // SAFETY: a listed device; the context is owned by the returned Context.
        let ctx = unsafe { Context::from_raw(lib, (lib.open_device)(device)) }.map_err(|e| {
            DeviceError::Open {
                name: name.to_string(),
                source: e,
            }
        })?;
        drop(list);

        // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, writable attribute struct.
        super::objects::check_rc(unsafe { (lib.query_device)(ctx.as_ptr(), &mut attr) }).map_err(
            |e| DeviceError::QueryDevice {
                name: name.to_string(),
                source: e,
            },
        )?;
        let limits = DeviceLimits {
            max_mr_size_bytes: attr.max_mr_size,
            max_mr: to_u32(attr.max_mr),
            max_qp: to_u32(attr.max_qp),
            max_qp_wr: to_u32(attr.max_qp_wr),
            max_sge: to_u32(attr.max_sge),
            max_sge_rd: to_u32(attr.max_sge_rd),
            max_cqe: to_u32(attr.max_cqe),
            max_qp_rd_atom: to_u32(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: to_u32(attr.max_qp_init_rd_atom),
            page_size_cap: attr.page_size_cap,
            max_srq: to_u32(attr.max_srq),
            max_srq_wr: to_u32(attr.max_srq_wr),
        };
        if port == 0 || port > attr.phys_port_cnt {
            return Err(DeviceError::QueryPort {
                name: name.to_string(),
                port,
                reason: format!("device has {} port(s), numbered from 1", attr.phys_port_cnt),
            });
        }

        // Zeroed first, as verbs.h's inline ibv_query_port does: the exported function fills
        // the compat prefix of the struct.
        let mut port_attr = ibv_port_attr::default();
        // SAFETY: live context, writable attribute struct.
        super::objects::check_rc(unsafe { (lib.query_port)(ctx.as_ptr(), port, &mut port_attr) })
            .map_err(|e| DeviceError::QueryPort {
            name: name.to_string(),
            port,
            reason: e.to_string(),
        })?;
        if port_attr.state != IBV_PORT_ACTIVE {
            return Err(DeviceError::PortNotActive {
                name: name.to_string(),
                port,
                state: port_state_name(port_attr.state),
            });
        }
        let is_ethernet = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
        let port_info = PortInfo {
            port,
            active_mtu_bytes: mtu_bytes(port_attr.active_mtu),
            max_mtu_bytes: mtu_bytes(port_attr.max_mtu),
            lid: port_attr.lid,
            is_ethernet,
            gid_table_len: to_u32(port_attr.gid_tbl_len),
        };
        let gids = GidTable {
            lib,
            ctx: &ctx,
            name,
            port,
        };

        let (gid_index, gid, gid_kind) = match gid_index {
            Some(index) if index > u32::from(u8::MAX) => {
                return Err(DeviceError::Gid {
                    name: name.to_string(),
                    port,
                    index,
                    reason: "GID index above 255 (the address vector holds a u8)".to_string(),
                });
            }
            Some(index) => {
                let gid = gids.gid(index).map_err(|e| DeviceError::Gid {
                    name: name.to_string(),
                    port,
                    index,
                    reason: e.to_string(),
                })?;
                if gid == [0; 16] {
                    return Err(DeviceError::Gid {
                        name: name.to_string(),
                        port,
                        index,
                        reason: "the GID is empty".to_string(),
                    });
                }
                (index, gid, gids.kind(index, is_ethernet))
            }
            None if !is_ethernet => {
                let gid = gids.gid(0).map_err(|e| DeviceError::Gid {
                    name: name.to_string(),
                    port,
                    index: 0,
                    reason: e.to_string(),
                })?;
                (0, gid, GidKind::InfiniBand)
            }
            None => gids
                .default_roce_v2(port_info.gid_table_len)
                .ok_or_else(|| DeviceError::NoDefaultGid {
                    name: name.to_string(),
                    port,
                })?,
        };

        let pd = ctx.alloc_pd().map_err(|e| DeviceError::AllocPd {
            name: name.to_string(),
            source: e,
        })?;
        Ok(VerbsDevice {
            ctx,
            pd,
            name: name.to_string(),
            port: port_info,
            gid_index,
            gid,
            gid_kind,
            limits,
        })
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port in use.
    pub fn port(&self) -> PortInfo {
        self.port
    }

    /// GID index in use.
    pub fn gid_index(&self) -> u32 {
        self.gid_index
    }

    /// GID in use, as an IPv6 address (IPv4-mapped for RoCE v2 over IPv4).
    pub fn gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.gid)
    }

    pub(crate) fn gid_raw(&self) -> [u8; 16] {
        self.gid
    }

    /// Kind of the GID in use.
    pub fn gid_kind(&self) -> GidKind {
        self.gid_kind
    }

    /// The device's limits.
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// A completion channel on this device: connections created with it in their
    /// [`super::ConnectionConfig::completion_channel`] raise an event on it when armed
    /// ([`super::VerbsConnection::arm`]) and a completion arrives, so one idle poller can sleep
    /// on its file descriptor for any number of connections.
    pub fn completion_channel(&self) -> Result<Arc<CompletionChannel>, DeviceError> {
        self.ctx
            .create_completion_channel()
            .map_err(|e| DeviceError::CompletionChannel {
                name: self.name.clone(),
                source: e,
            })
    }

    /// Register `[ptr, ptr + len)` for local writes and remote reads, split into memory
    /// regions of at most `max_mr_bytes` (further capped by the device's `max_mr_size`,
    /// rounded down to 4 KiB, at least 4 KiB).
    ///
    /// # Safety
    ///
    /// The range must be mapped memory that stays mapped, and is not unmapped or remapped,
    /// until the returned [`Registration`] is dropped. Registering makes no reference to it:
    /// peers may READ it at any time (a DMA read, which aliases nothing in this process),
    /// and the device writes it only where this process asks it to, through work requests
    /// whose own contracts keep those bytes unviewed while written
    /// ([`VerbsConnection::post_reads`](super::VerbsConnection::post_reads) for READ
    /// destinations; the receive slab and send slots of a connection, owned by it). For an
    /// arena, that is the same model as every other view of it: the device's writes go to a
    /// range a [`WritableRegion`](crate::WritableRegion) claims.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        max_mr_bytes: u64,
    ) -> Result<Registration, RegisterError> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.register_with(
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
                ptr,
                len,
                max_mr_bytes,
            )
        }
    }

    /// As [`VerbsDevice::register`], and memory windows may be bound to the regions
    /// ([`VerbsConnection::bind_window`](super::VerbsConnection::bind_window)).
    ///
    /// # Safety
    ///
    /// As [`VerbsDevice::register`].
    pub unsafe fn register_for_windows(
        &self,
        ptr: *mut u8,
        len: usize,
        max_mr_bytes: u64,
    ) -> Result<Registration, RegisterError> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.register_with(
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND,
                ptr,
                len,
                max_mr_bytes,
            )
        }
    }

    /// As [`VerbsDevice::register`], but peers may READ the regions only through memory
    /// windows bound to them: the regions' own rkeys grant no remote access.
    ///
    /// # Safety
    ///
    /// As [`VerbsDevice::register`].
    pub unsafe fn register_windows_only(
        &self,
        ptr: *mut u8,
        len: usize,
        max_mr_bytes: u64,
    ) -> Result<Registration, RegisterError> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.register_with(
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND,
                ptr,
                len,
                max_mr_bytes,
            )
        }
    }

    /// Registers with `access`, capped as [`VerbsDevice::register`] says.
    ///
    /// # Safety
    ///
    /// As [`VerbsDevice::register`].
    unsafe fn register_with(
        &self,
        access: c_int,
        ptr: *mut u8,
        len: usize,
        max_mr_bytes: u64,
    ) -> Result<Registration, RegisterError> {
        let cap = max_mr_bytes.min(self.limits.max_mr_size_bytes);
        // SAFETY: forwarded from this function's contract.
        unsafe { Registration::new(&self.pd, ptr, len, cap, access) }
    }

    /// A type 2 memory window of this device's protection domain, unbound.
    /// `ErrorKind::Unsupported` when the provider has none.
    pub fn alloc_window(&self) -> std::io::Result<MemoryWindow> {
        MemoryWindow::alloc(&self.pd)
    }
}

/// GID look-ups of one port.
struct GidTable<'a> {
    lib: &'static Ibverbs,
    ctx: &'a Arc<Context>,
    name: &'a str,
    port: u8,
}

impl GidTable<'_> {
    fn gid(&self, index: u32) -> io::Result<[u8; 16]> {
        let index =
            c_int::try_from(index).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut gid = ibv_gid::default();
        // SAFETY: live context, writable GID.
        super::objects::check_rc(unsafe {
            (self.lib.query_gid)(self.ctx.as_ptr(), self.port, index, &mut gid)
        })?;
        Ok(gid.raw)
    }

    /// The GID's type: `_ibv_query_gid_ex` where libibverbs has it (rdma-core 31+), else the
    /// kernel's sysfs attribute (what older perftest and NCCL read).
    fn kind(&self, index: u32, is_ethernet: bool) -> GidKind {
        if let Some(query_gid_ex) = self.lib.query_gid_ex {
            let mut entry = ibv_gid_entry::default();
            // SAFETY: live context, writable entry of the size passed.
            let rc = unsafe {
                query_gid_ex(
                    self.ctx.as_ptr(),
                    u32::from(self.port),
                    index,
                    &mut entry,
                    0,
                    std::mem::size_of::<ibv_gid_entry>(),
                )
            };
            if rc == 0 {
                return match entry.gid_type {
                    IBV_GID_TYPE_ROCE_V2 => GidKind::RoceV2,
                    IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
                    IBV_GID_TYPE_IB if is_ethernet => GidKind::RoceV1,
                    IBV_GID_TYPE_IB => GidKind::InfiniBand,
                    _ => GidKind::Unknown,
                };
            }
        }
        let path = format!(
            "/sys/class/infiniband/{}/ports/{}/gid_attrs/types/{index}",
            self.name, self.port
        );
        match std::fs::read_to_string(path) {
            Ok(t) if t.trim().eq_ignore_ascii_case("RoCE v2") => GidKind::RoceV2,
            Ok(_) if is_ethernet => GidKind::RoceV1,
            Ok(_) => GidKind::InfiniBand,
            Err(_) => GidKind::Unknown,
        }
    }

    /// The first non-empty RoCE v2 GID, preferring an IPv4-mapped one (::ffff:a.b.c.d):
    /// routable, and what rdma_cm would pick.
    fn default_roce_v2(&self, table_len: u32) -> Option<(u32, [u8; 16], GidKind)> {
        let mut candidates: Vec<(u32, [u8; 16])> = (0..table_len.min(256))
            .filter_map(|index| Some((index, self.gid(index).ok()?)))
            .filter(|(_, gid)| *gid != [0; 16])
            .filter(|&(index, _)| self.kind(index, true) == GidKind::RoceV2)
            .collect();
        candidates.sort_by_key(|&(index, gid)| {
            let v4 = Ipv6Addr::from(gid).to_ipv4_mapped().is_some();
            (!v4, index)
        });
        candidates
            .first()
            .map(|&(index, gid)| (index, gid, GidKind::RoceV2))
    }
}
