//! Directory backends: where objects live and which nodes are alive.
//!
//! The core speaks to the directory in values ([`DirectoryRequest`] out,
//! [`DirectoryReply`](skyriver_core::directory::DirectoryReply) and
//! [`DirectoryEvent`](skyriver_core::directory::DirectoryEvent) in); a backend carries them to a
//! real service: the built-in directory served by a head daemon over TCP (zero setup), or Redis
//! (for real clusters). The head's rules are the core's sans-IO
//! [`Registry`](skyriver_core::registry::Registry), which the built-in server only drives; the
//! node side is one reconnecting client ([`DirectoryClient`], driving the core's
//! [`DirectorySession`](skyriver_core::registry::session::DirectorySession)) for both backends,
//! over a TCP link to the head or an adapter that answers from Redis. A backend reports through
//! [`DirectoryNotice`]s on a channel; every call returns at once, and a slow or dead service
//! shows up as `Unavailable` replies and a `Health` notice, never as a blocked caller.

pub mod builtin;
mod client;
#[doc(hidden)] // public for the fuzz targets (fuzz/) only
pub mod frame;
pub mod redis;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use skyriver_core::directory::{DirectoryOpId, DirectoryRequest};
use tokio::sync::mpsc;

pub use client::DirectoryClient;
pub use skyriver_core::directory::{DirectoryNotice, MemberInfo};

/// Why a backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The directory address could not be parsed.
    #[error("bad directory address {0:?}: use redis://HOST:PORT, rediss://HOST:PORT (TLS), redis-cluster://HOST:PORT[,HOST:PORT…] (Redis Cluster) or HOST:PORT of a head daemon")]
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
    /// A Redis server: `redis://[USER:PASSWORD@]HOST:PORT[/DB]`, or `rediss://` for TLS; or a
    /// Redis Cluster: `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]` (seed nodes),
    /// `rediss-cluster://` for TLS.
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
        if redis::cluster::is_cluster_url(text) {
            return match redis::cluster::seed_urls(text) {
                Some(_) => Ok(DirectorySpec::Redis {
                    url: text.to_string(),
                }),
                None => Err(bad()),
            };
        }
        if let Some(rest) = text
            .strip_prefix("redis://")
            .or_else(|| text.strip_prefix("rediss://"))
        {
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
pub(crate) fn valid_host_port(text: &str) -> bool {
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
                let (scheme, rest) = match url.split_once("://") {
                    Some((scheme, rest)) => (scheme, rest),
                    None => ("redis", url.as_str()),
                };
                // The credentials, if any, never show.
                match rest.rsplit_once('@') {
                    Some((_, after)) => write!(f, "{scheme}://***@{after}"),
                    None => write!(f, "{scheme}://{rest}"),
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
    token: &crate::token::ClusterToken,
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
