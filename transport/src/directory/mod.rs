//! Directory backends: where objects live and which nodes are alive.
//!
//! The core speaks to the directory in values ([`DirectoryRequest`] out, [`DirectoryReply`] and
//! [`DirectoryEvent`] in); a backend carries them to a real service: the built-in directory
//! served by a head daemon over TCP (zero setup), or Redis (for real clusters). A backend runs
//! its own tasks and reports through [`DirectoryNotice`]s on a channel; every call returns at
//! once, and a slow or dead service shows up as `Unavailable` replies and a `Health` notice,
//! never as a blocked caller.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use skyriver_core::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::NodeId;

/// A live node of the cluster, as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// The node.
    pub node: NodeId,
    /// Where its fabric accepts connections.
    pub fabric_addr: SocketAddr,
    /// Which fabric it runs (`tcp`, `verbs`).
    pub fabric: String,
    /// Changes each time the node's daemon starts.
    pub incarnation: u32,
}

/// What a directory backend tells the driver.
#[derive(Debug)]
pub enum DirectoryNotice {
    /// The answer to a request submitted with [`Directory::submit`].
    Reply {
        /// The request's op id.
        op: DirectoryOpId,
        /// The answer.
        reply: DirectoryReply,
    },
    /// A subscription fired.
    Event(DirectoryEvent),
    /// The live members changed (sent at join and at every change).
    Members(Vec<MemberInfo>),
    /// The service became reachable (`Ok`) or unreachable (`Err` with the reason).
    Health(Result<(), String>),
}

/// Why a backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The directory address could not be parsed.
    #[error("bad directory address {0:?}: use redis://HOST:PORT or HOST:PORT of a head daemon")]
    BadAddress(String),
    /// The first connection failed.
    #[error("cannot reach the directory at {addr}: {reason}")]
    Unreachable {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The directory refused this node (wrong cluster token, duplicate node id).
    #[error("the directory refused this node: {0}")]
    Refused(String),
}

/// A connection of one node to the directory service.
pub trait Directory: Send + Sync {
    /// Carries `request` to the service; the reply comes as [`DirectoryNotice::Reply`] (except
    /// for `Unsubscribe`, which has none).
    fn submit(&self, op: DirectoryOpId, request: DirectoryRequest);

    /// Describes the backend for logs, without secrets.
    fn describe(&self) -> String;
}

impl fmt::Debug for dyn Directory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}
