//! Device discovery, opening by name, port and GID selection, device limits.

use std::io;
use std::net::Ipv6Addr;
use std::sync::Arc;

use sideway::ibverbs::address::{Gid, GidType};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer, Mtu, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use super::registration::{RegisterError, Registration};

/// Why a device could not be listed or opened.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `ibv_get_device_list` failed: libibverbs (rdma-core) is not installed, or the
    /// kernel has no RDMA support.
    #[error("RDMA verbs unavailable (ibv_get_device_list failed; is rdma-core installed and an RDMA device present?)")]
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
    /// `ibv_query_device_ex` failed.
    #[error("ibv_query_device({name}) failed: {reason}")]
    QueryDevice {
        /// Device name.
        name: String,
        /// The verb's error, rendered.
        reason: String,
    },
    /// `ibv_query_port` failed (for instance: no such port).
    #[error("ibv_query_port({name}, port {port}) failed: {reason}")]
    QueryPort {
        /// Device name.
        name: String,
        /// Port number.
        port: u8,
        /// The verb's error, rendered.
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
    #[error("ibv_alloc_pd({name}) failed: {reason}")]
    AllocPd {
        /// Device name.
        name: String,
        /// The verb's error, rendered.
        reason: String,
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
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) pd: Arc<ProtectionDomain>,
    name: String,
    port: PortInfo,
    gid_index: u32,
    gid: Gid,
    gid_kind: GidKind,
    limits: DeviceLimits,
}

impl std::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("gid", &Ipv6Addr::from(self.gid.raw))
            .field("gid_kind", &self.gid_kind)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Names of the RDMA devices present (`rxe0`, `mlx5_0`, ...).
pub fn list_devices() -> Result<Vec<String>, DeviceError> {
    let list = DeviceList::new().map_err(|e| DeviceError::VerbsUnavailable(io_error(&e)))?;
    Ok(list.iter().map(|d| d.name()).collect())
}

pub(crate) fn mtu_bytes(mtu: Mtu) -> u32 {
    match mtu {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

pub(crate) fn mtu_from_bytes(bytes: u32) -> Option<Mtu> {
    Some(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

fn io_error(e: &(dyn std::error::Error + 'static)) -> io::Error {
    // sideway wraps io::Error in its own error kinds; keep the OS error when there is one.
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(ioe) = err.downcast_ref::<io::Error>() {
            return match ioe.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::other(ioe.to_string()),
            };
        }
        cur = err.source();
    }
    io::Error::other(render(e))
}

pub(crate) fn render(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    s
}

fn to_u32(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

impl VerbsDevice {
    /// Open device `name` (e.g. `rxe0`, `mlx5_0`) on `port` (from 1) with GID `gid_index`, or,
    /// when `None`, the port's first RoCE v2 GID (preferring an IPv4-mapped one) on Ethernet
    /// and GID 0 on InfiniBand.
    pub fn open(name: &str, port: u8, gid_index: Option<u32>) -> Result<VerbsDevice, DeviceError> {
        let list = DeviceList::new().map_err(|e| DeviceError::VerbsUnavailable(io_error(&e)))?;
        let device =
            list.iter()
                .find(|d| d.name() == name)
                .ok_or_else(|| DeviceError::NotFound {
                    name: name.to_string(),
                    available: list.iter().map(|d| d.name()).collect(),
                })?;
        let ctx = device.open().map_err(|e| DeviceError::Open {
            name: name.to_string(),
            source: io_error(&e),
        })?;
        drop(list);

        let attr = ctx.query_device().map_err(|e| DeviceError::QueryDevice {
            name: name.to_string(),
            reason: render(&e),
        })?;
        let limits = DeviceLimits {
            max_mr_size_bytes: attr.max_mr_size(),
            max_mr: to_u32(attr.max_mr()),
            max_qp: to_u32(attr.max_qp()),
            max_qp_wr: to_u32(attr.max_qp_wr()),
            max_sge: to_u32(attr.max_sge()),
            max_sge_rd: to_u32(attr.max_sge_rd()),
            max_cqe: to_u32(attr.max_cqe()),
            max_qp_rd_atom: to_u32(attr.max_qp_rd_atom()),
            max_qp_init_rd_atom: to_u32(attr.max_qp_init_rd_atom()),
            page_size_cap: attr.page_size_cap(),
        };
        if port == 0 || port > attr.phys_port_cnt() {
            return Err(DeviceError::QueryPort {
                name: name.to_string(),
                port,
                reason: format!(
                    "device has {} port(s), numbered from 1",
                    attr.phys_port_cnt()
                ),
            });
        }

        let port_attr = ctx.query_port(port).map_err(|e| DeviceError::QueryPort {
            name: name.to_string(),
            port,
            reason: render(&e),
        })?;
        let state = port_attr.port_state();
        if state != PortState::Active {
            return Err(DeviceError::PortNotActive {
                name: name.to_string(),
                port,
                state: format!("{state:?}"),
            });
        }
        let is_ethernet = port_attr.link_layer() == LinkLayer::Ethernet;
        let port_info = PortInfo {
            port,
            active_mtu_bytes: mtu_bytes(port_attr.active_mtu()),
            max_mtu_bytes: mtu_bytes(port_attr.max_mtu()),
            lid: port_attr.lid(),
            is_ethernet,
            gid_table_len: to_u32(port_attr.gid_tbl_len()),
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
                let gid = ctx.query_gid(port, index).map_err(|e| DeviceError::Gid {
                    name: name.to_string(),
                    port,
                    index,
                    reason: render(&e),
                })?;
                if gid.is_zero() {
                    return Err(DeviceError::Gid {
                        name: name.to_string(),
                        port,
                        index,
                        reason: "the GID is empty".to_string(),
                    });
                }
                let kind = match ctx.query_gid_type(port, index) {
                    // ibv_query_gid_type: 1 = RoCE v2; 0 = IB or RoCE v1, told apart by link layer.
                    Ok(1) => GidKind::RoceV2,
                    Ok(0) if is_ethernet => GidKind::RoceV1,
                    Ok(0) => GidKind::InfiniBand,
                    _ => GidKind::Unknown,
                };
                (index, gid, kind)
            }
            None if !is_ethernet => {
                let gid = ctx.query_gid(port, 0).map_err(|e| DeviceError::Gid {
                    name: name.to_string(),
                    port,
                    index: 0,
                    reason: render(&e),
                })?;
                (0, gid, GidKind::InfiniBand)
            }
            None => default_roce_v2_gid(&ctx, port).ok_or_else(|| DeviceError::NoDefaultGid {
                name: name.to_string(),
                port,
            })?,
        };

        let pd = ctx.alloc_pd().map_err(|e| DeviceError::AllocPd {
            name: name.to_string(),
            reason: render(&e),
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
        Ipv6Addr::from(self.gid.raw)
    }

    pub(crate) fn gid_raw(&self) -> [u8; 16] {
        self.gid.raw
    }

    /// Kind of the GID in use.
    pub fn gid_kind(&self) -> GidKind {
        self.gid_kind
    }

    /// The device's limits.
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// Register `[ptr, ptr + len)` for local writes and remote reads, split into memory
    /// regions of at most `max_mr_bytes` (further capped by the device's `max_mr_size`,
    /// rounded down to 4 KiB, at least 4 KiB).
    ///
    /// # Safety
    ///
    /// The range must be mapped memory that stays mapped, and is not unmapped or remapped,
    /// until the returned [`Registration`] is dropped. While registered, the device may read
    /// it at any time (for remote READs) and write it (as the destination of local READs and
    /// receives): the caller must treat it as memory shared with a concurrent writer, as it
    /// does for the store's shared arenas.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        max_mr_bytes: u64,
    ) -> Result<Registration, RegisterError> {
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteRead;
        let cap = max_mr_bytes.min(self.limits.max_mr_size_bytes);
        // SAFETY: forwarded from this function's contract.
        unsafe { Registration::new(&self.pd, ptr, len, cap, access) }
    }
}

fn default_roce_v2_gid(ctx: &DeviceContext, port: u8) -> Option<(u32, Gid, GidKind)> {
    let table = ctx.query_gid_table().ok()?;
    let mut candidates: Vec<_> = table
        .iter()
        .filter(|e| e.port_num() == u32::from(port) && e.gid_type() == GidType::RoceV2)
        .filter(|e| !e.gid().is_zero())
        .map(|e| (e.gid_index(), e.gid()))
        .collect();
    // Prefer an IPv4-mapped GID (::ffff:a.b.c.d): routable, and what rdma_cm would pick.
    candidates.sort_by_key(|(index, gid)| {
        let v4 = Ipv6Addr::from(gid.raw).to_ipv4_mapped().is_some();
        (!v4, *index)
    });
    candidates
        .first()
        .map(|&(index, gid)| (index, gid, GidKind::RoceV2))
}
