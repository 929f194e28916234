//! Skyriver's client library: everything a program (or the Python package) needs to use a node
//! daemon's store: create, write, seal, get (zero-copy), release, delete, list, subscribe and
//! fetch from other nodes, through the daemon's Unix socket.
//!
//! ```no_run
//! use skyriver_client::{Client, ObjectId};
//! # fn main() -> Result<(), skyriver_client::ClientError> {
//! let client = Client::connect_default()?;
//! let id = ObjectId::from_u64(42);
//! client.create_and_seal(id, b"hello", b"")?;
//! let object = client.get_one(id, None)?;
//! assert_eq!(object.data(), b"hello");
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod client;
pub mod ids;
mod reply_routing;

pub use client::{
    default_socket_path, Client, ClientError, FetchOptions, ObjectBuffer, ObjectCopies,
    ObjectLocation, ObjectWriter, Subscription, SubscriptionCloser,
};
pub use ids::{owned_object_id, random_object_id};
pub use skyriver_core::client_protocol::{ClusterView, CopyView, MemberView, ReplicaPolicy};
pub use skyriver_core::node::{FetchError, TransferMode};
pub use skyriver_core::registry::MAX_REPLICAS;
pub use skyriver_core::{
    ContentDigest, NodeId, ObjectEvent, ObjectId, ObjectInfo, StoreError, StoreStats,
};
