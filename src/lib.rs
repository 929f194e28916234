//! Skyriver: a distributed in-memory object store for RDMA clusters.
//!
//! This crate holds the node daemon ([`daemon`]), the client library ([`Client`]) and the
//! pieces of the `skyriver` command-line tool. The protocol logic lives in `skyriver-core`
//! (sans-IO) and all IO primitives and unsafe code in `skyriver-transport`.
//!
//! ```no_run
//! use skyriver::{Client, ObjectId};
//! # fn main() -> Result<(), skyriver::ClientError> {
//! let client = Client::connect_default()?;
//! let id = ObjectId::from_u64(42);
//! client.create_and_seal(id, b"hello", b"")?;
//! let object = client.get_one(id, None)?;
//! assert_eq!(object.data(), b"hello");
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod daemon;
pub mod ids;
pub mod logging;
pub mod netns;
pub mod persistence;
pub mod poll;
mod reply_routing;
pub mod security;
pub mod size;
pub mod top;
pub mod up;

pub use client::{
    default_socket_path, Client, ClientError, ObjectBuffer, ObjectLocation, ObjectWriter,
    Subscription, SubscriptionCloser,
};
pub use ids::random_object_id;
pub use skyriver_core::client_protocol::{ClusterView, MemberView};
pub use skyriver_core::node::{FetchError, TransferMode};
pub use skyriver_core::{
    ContentDigest, NodeId, ObjectEvent, ObjectId, ObjectInfo, StoreError, StoreStats,
};

/// The program to run for `skyriver` subcommands this process starts (daemons of `up`, `demo`
/// and the benchmarks): `$SKYRIVER_EXE` when set (the Python package's `skyriver` entry point
/// sets it to itself, since its process is the Python interpreter), else this executable.
pub fn self_exe() -> std::io::Result<std::path::PathBuf> {
    match std::env::var_os("SKYRIVER_EXE") {
        Some(exe) if !exe.is_empty() => Ok(exe.into()),
        _ => std::env::current_exe(),
    }
}
