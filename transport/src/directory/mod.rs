//! Directory backends: where objects live and which nodes are alive.
//!
//! The core speaks to the directory in values ([`DirectoryRequest`] out, [`DirectoryReply`] and
//! [`DirectoryEvent`] in); a backend carries them to a real service: the built-in directory
//! served by a head daemon over TCP (zero setup), or Redis (for real clusters). A backend runs
//! its own tasks and reports through [`DirectoryNotice`]s on a channel; every call returns at
//! once, and a slow or dead service shows up as `Unavailable` replies and a `Health` notice,
//! never as a blocked caller.

pub mod builtin;
mod frame;
pub mod redis;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use skyriver_core::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::wire::ObjectSizes;
use skyriver_core::{NodeId, ObjectId};
use tokio::sync::mpsc;

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
    /// The cluster name cannot name Redis keys.
    #[error("bad cluster name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ -")]
    BadClusterName(String),
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

    /// Leaves the cluster cleanly (the daemon is stopping): the service forgets this node and
    /// the objects it held at once, instead of when its registration expires. Best effort and
    /// bounded; the future resolves when done or when the service did not answer in time.
    fn leave(&self) -> LeaveFuture {
        Box::pin(std::future::ready(()))
    }
}

/// What [`Directory::leave`] returns.
pub type LeaveFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

impl fmt::Debug for dyn Directory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Which directory service to use, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectorySpec {
    /// The built-in directory served by a head daemon at `HOST:PORT`.
    Builtin {
        /// `HOST:PORT` of the head.
        addr: String,
    },
    /// A Redis server: `redis://[USER:PASSWORD@]HOST:PORT[/DB]`.
    Redis {
        /// The URL as given (may hold a password: never log it, use [`DirectorySpec`]'s
        /// `Display`).
        url: String,
    },
}

impl FromStr for DirectorySpec {
    type Err = DirectoryError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let bad = || DirectoryError::BadAddress(text.to_string());
        if let Some(rest) = text.strip_prefix("redis://") {
            let authority = rest.split('/').next().unwrap_or_default();
            let host_port = authority.rsplit('@').next().unwrap_or_default();
            if !valid_host_port(host_port) {
                return Err(bad());
            }
            let db = rest.split_once('/').map(|(_, db)| db).unwrap_or_default();
            if !(db.is_empty() || db.parse::<u16>().is_ok()) {
                return Err(bad());
            }
            return Ok(DirectorySpec::Redis {
                url: text.to_string(),
            });
        }
        if text.contains("://") || !valid_host_port(text) {
            return Err(bad());
        }
        Ok(DirectorySpec::Builtin {
            addr: text.to_string(),
        })
    }
}

/// `HOST:PORT` or `[V6]:PORT` with a non-empty host and a non-zero port.
fn valid_host_port(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else {
        return false;
    };
    !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
}

impl fmt::Display for DirectorySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectorySpec::Builtin { addr } => write!(f, "{addr}"),
            DirectorySpec::Redis { url } => {
                let rest = url.strip_prefix("redis://").unwrap_or(url);
                match rest.rsplit_once('@') {
                    Some((_, after)) => write!(f, "redis://***@{after}"),
                    None => write!(f, "redis://{rest}"),
                }
            }
        }
    }
}

/// Connects this node (`me`) to the directory `spec` names, for cluster `cluster`, presenting
/// `token`. Returns once the node is registered (or with why it could not be); from then on
/// replies, events, member lists and health changes arrive on `notices`, and the backend
/// reconnects by itself when the service goes away and comes back.
///
/// Must be called from within a tokio runtime (the backend spawns its tasks on it).
pub async fn connect(
    spec: &DirectorySpec,
    me: MemberInfo,
    cluster: &str,
    token: &str,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
) -> Result<Arc<dyn Directory>, DirectoryError> {
    match spec {
        DirectorySpec::Builtin { addr } => {
            let client =
                builtin::connect(addr, me, token, notices, builtin::ClientConfig::default())
                    .await?;
            Ok(Arc::new(client))
        }
        DirectorySpec::Redis { url } => {
            let config = self::redis::RedisConfig::new(url.clone(), cluster);
            let client = self::redis::connect(config, me, token, notices).await?;
            Ok(Arc::new(client))
        }
    }
}

/// The hand-off from [`Directory::submit`] to a backend's task: bounded, never blocking. A
/// request that cannot be queued is answered `Unavailable` at once, so the core never waits on
/// a reply that will not come.
#[derive(Debug)]
pub(crate) struct RequestQueue {
    pub(crate) commands: mpsc::Sender<(DirectoryOpId, DirectoryRequest)>,
    pub(crate) notices: mpsc::UnboundedSender<DirectoryNotice>,
}

impl RequestQueue {
    pub(crate) fn submit(&self, op: DirectoryOpId, request: DirectoryRequest) {
        let expects_reply = !matches!(request, DirectoryRequest::Unsubscribe { .. });
        if let Err(error) = self.commands.try_send((op, request)) {
            let reason = match error {
                mpsc::error::TrySendError::Full(_) => "too many directory requests queued",
                mpsc::error::TrySendError::Closed(_) => "the directory client stopped",
            };
            if expects_reply {
                let _ = self.notices.send(DirectoryNotice::Reply {
                    op,
                    reply: DirectoryReply::Unavailable {
                        reason: reason.into(),
                    },
                });
            }
        }
    }
}

/// Keeps what a request made while the service is down means for the node's own state, which
/// is replayed when the connection comes back: publications (at most `max_publications`, a
/// re-publish always fits) and subscriptions. Returns whether the request still needs a reply
/// (everything but `Unsubscribe`), which is `Unavailable`.
pub(crate) fn remember_while_down(
    publications: &mut std::collections::HashMap<ObjectId, ObjectSizes>,
    subscriptions: &mut std::collections::HashSet<ObjectId>,
    request: DirectoryRequest,
    max_publications: usize,
) -> bool {
    match request {
        DirectoryRequest::Unsubscribe { id } => {
            subscriptions.remove(&id);
            return false;
        }
        DirectoryRequest::Publish { id, sizes } => {
            if publications.len() < max_publications || publications.contains_key(&id) {
                publications.insert(id, sizes);
            }
        }
        DirectoryRequest::Withdraw { id } => {
            publications.remove(&id);
        }
        DirectoryRequest::Lookup { .. } => {}
    }
    true
}
