//! Errors the store reports to its clients. They cross the wire, so they are plain data.

use serde::{Deserialize, Serialize};

use crate::ids::ObjectId;

/// An error a client can match on. Every variant says which object it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StoreError {
    /// `create` of an id that is already in the store (sealed or not).
    #[error("object {0} already exists")]
    ObjectExists(ObjectId),
    /// The object is not in this store.
    #[error("object {0} not found")]
    ObjectNotFound(ObjectId),
    /// The object exists but is still being written.
    #[error("object {0} is not sealed yet")]
    ObjectNotSealed(ObjectId),
    /// The object is held by a client or pinned by a transfer; a delete takes effect once it is
    /// released (as in Plasma).
    #[error("object {0} is in use; it will be deleted when the last reference is released")]
    ObjectInUse(ObjectId),
    /// Not enough memory (or room in the object table) even after evicting every object that
    /// nobody holds.
    #[error(
        "out of memory: object {id} needs {requested_bytes} bytes, {free_bytes} of {capacity_bytes} are free and nothing more can be evicted"
    )]
    OutOfMemory {
        /// The object being created.
        id: ObjectId,
        /// Bytes asked for (data + metadata).
        requested_bytes: u64,
        /// Bytes free after evicting all that could be.
        free_bytes: u64,
        /// The store's capacity.
        capacity_bytes: u64,
    },
    /// The object was not sealed before the request's timeout.
    #[error("timed out waiting for object {0} to be sealed")]
    Timeout(ObjectId),
    /// The object can never fit: larger than the largest arena, or its sizes overflow.
    #[error("object {id} of {requested_bytes} bytes can never fit: the largest arena holds {largest_arena_bytes} bytes")]
    ObjectTooLarge {
        /// The object.
        id: ObjectId,
        /// Bytes asked for (data + metadata), saturated at u64::MAX on overflow.
        requested_bytes: u64,
        /// Size of the largest arena.
        largest_arena_bytes: u64,
    },
    /// Seal or abort of an object another client created.
    #[error("object {0} was created by another client; only its creator may seal or abort it")]
    NotCreator(ObjectId),
    /// Seal of an object that is already sealed, or abort of a sealed object.
    #[error("object {0} is already sealed")]
    AlreadySealed(ObjectId),
    /// Release of an object this client holds no reference to.
    #[error("this client holds no reference to object {0}")]
    NotHeld(ObjectId),
    /// A request that breaks the protocol: malformed, out of order or over a limit.
    #[error("bad request: {0}")]
    BadRequest(String),
}
