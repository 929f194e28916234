//! Skyriver's sans-IO core: the object store of one node, the messages its clients send, the
//! fetch manager and the transfer protocol between nodes ([`node`], [`wire`], [`directory`]).
//!
//! Nothing here touches sockets, files, threads, clocks or randomness: every input carries
//! `now`, and every effect is a value the driver drains and carries out. The daemon drives this
//! code with a real clock and real memory; the simulator drives the very same code with virtual
//! time and simulated arenas.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod alloc;
pub mod auth;
pub mod client_protocol;
pub mod client_session;
pub mod dense_index;
pub mod digest;
pub mod directory;
pub mod error;
pub mod grants;
pub mod ids;
pub mod node;
pub mod persist;
pub mod region;
pub mod registry;
pub mod shared_list;
pub mod sorted_chunks;
pub mod store;
pub mod time;
pub mod wire;

pub use digest::ContentDigest;
pub use error::{StoreError, WaitQueue};
pub use ids::{ArenaId, ClientId, NodeId, ObjectId, RequestId, TransferId};
pub use node::{
    FetchError, Node, NodeConfig, NodeInput, NodeOutput, PeerParams, ReadError, ReadOpId,
    TransferMode,
};
pub use region::{LocalRegion, RemoteRegion};
pub use store::{
    DurableChange, ObjectEvent, ObjectInfo, RecoveredObject, RecoveryReport, Store, StoreConfig,
    StoreOutput, StoreStats,
};
pub use time::Instant;
pub use wire::{ObjectSizes, PeerMessage};
