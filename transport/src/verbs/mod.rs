//! RDMA verbs, done right and nothing more: devices, memory registration, RC connections
//! with a TCP handshake, pre-posted receive slots, SEND (inline when small), RDMA READ
//! lists with selective signaling, and batched completion polling.
//!
//! This layer has no protocol logic: it moves bytes and reports completions; the fabric
//! driver decides what to send and read. Built on the project's own binding ([`sys`]), which
//! loads libibverbs at run time: on a machine without rdma-core (or without an RDMA device),
//! [`VerbsDevice::open`] returns an error that says what to install, and everything else of
//! Skyriver keeps working over TCP.
//!
//! Shape of use:
//! ```no_run
//! # use skyriver_transport::verbs::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = VerbsDevice::open("rxe0", 1, None)?;
//! let mut control = std::net::TcpStream::connect("10.11.1.2:7000")?;
//! let mut conn = VerbsConnection::connect(&device, &mut control, &ConnectionConfig::default())?;
//! conn.post_send(0, 7, b"hello")?;
//! let mut completions = Vec::new();
//! conn.poll(&mut completions)?;
//! # Ok(()) }
//! ```
//!
//! Memory contract: whatever is registered ([`VerbsDevice::register`]) may be read or written
//! by the device until the [`Registration`] is dropped; a READ's destination is written by the
//! device until its completion is polled.

mod connection;
mod device;
mod handshake;
mod objects;
mod registration;
#[doc(hidden)]
pub mod sys;
mod window;

pub use connection::{
    Completion, ConnectionConfig, ConnectionError, NegotiatedParams, Opcode, PollError, PostError,
    ReadRequest, RecvMessage, RecvSlot, ReturnWaker, VerbsConnection, WcStatus, WR_ID_MASK,
};
pub use device::{list_devices, DeviceError, DeviceLimits, GidKind, PortInfo, VerbsDevice};
pub(crate) use handshake::Control;
pub use handshake::{HandshakeError, MAX_LANES};
pub use objects::CompletionChannel;
pub use registration::{plan_reads, MrChunk, PlanError, RegisterError, Registration, RemoteChunk};
pub use sys::{available as library_available, LoadError, IBVERBS_LIB_ENV, IBVERBS_SONAME};
pub use window::MemoryWindow;

/// Largest message a single RDMA READ or SEND may carry (the InfiniBand limit, 2 GiB).
pub const MAX_MESSAGE_BYTES: u64 = 1 << 31;
