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
//!
//! **Bounds.** Every queue between the node's loop and the service is bounded in its type:
//! - requests, loop → client task: [`builtin::MAX_IN_FLIGHT_PER_NODE`] or
//!   [`redis::MAX_QUEUED_REQUESTS`] places; when full, [`Directory::submit`] refuses at once with [`SubmitRefused::Busy`] and
//!   the loop answers the request itself (`Unavailable`), so the loop never waits;
//! - messages, client task → link (`LINK_OUTGOING_QUEUE`): when full, the client task
//!   holds the one message it could not send and takes no further request until the link
//!   makes room (so the request queue above fills and refuses), while it keeps taking what the
//!   link brings in (so the link's task, which may wait to hand over an answer, never
//!   deadlocks with it); what the session still has to send waits in the session, bounded by
//!   its caps;
//! - messages, link → client task (`LINK_INCOMING_QUEUE`): the link's reader waits (TCP
//!   back-pressure to the head; Redis answers wait);
//! - notices, client task → loop ([`NOTICE_QUEUE`], [`notice_channel`]): the client task waits
//!   for a place, and meanwhile takes nothing from its link or its requests, so the pressure
//!   goes back along the same path.

pub mod builtin;
mod client;
#[doc(hidden)] // public for the fuzz targets (fuzz/) only
pub mod frame;
mod link_error;
pub mod redis;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use skyriver_core::directory::{DirectoryOpId, DirectoryRequest};
use tokio::sync::mpsc;

pub use client::DirectoryClient;
pub use link_error::{CaFileError, LinkError, SubmitRefused, TokenRecordError};
pub use skyriver_core::directory::{DirectoryNotice, MemberInfo};

/// Notices waiting for the node's loop, at most ([`notice_channel`]): replies, events, member
/// lists and health changes. When full, the directory client waits for a place.
pub const NOTICE_QUEUE: usize = 1024;

/// Where a directory backend sends its [`DirectoryNotice`]s: bounded ([`NOTICE_QUEUE`]).
pub type NoticeSender = mpsc::Sender<DirectoryNotice>;
/// Where the node's loop takes its [`DirectoryNotice`]s; `len()` is the depth metric.
pub type NoticeReceiver = mpsc::Receiver<DirectoryNotice>;

/// The channel from a directory backend to the node's loop, with [`NOTICE_QUEUE`] places.
pub fn notice_channel() -> (NoticeSender, NoticeReceiver) {
    mpsc::channel(NOTICE_QUEUE)
}

/// Why a backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The directory address could not be parsed.
    #[error("bad directory address {0:?}: use redis://HOST:PORT, rediss://HOST:PORT (TLS), redis-cluster://HOST:PORT[,HOST:PORT…] (Redis Cluster) or HOST:PORT of a head daemon")]
    BadAddress(String),
    /// The first connection failed.
    #[error("cannot reach the directory at {addr}: {source}{}", if source.is_redis_auth() { REDIS_AUTH_HINT } else { "" })]
    Unreachable {
        /// The address (any password masked).
        addr: String,
        /// Why.
        #[source]
        source: LinkError,
    },
    /// The cluster name cannot name Redis keys.
    #[error("bad cluster name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ -")]
    BadClusterName(String),
    /// The directory refused this node (wrong cluster token, duplicate node id). The reason
    /// is the service's own text: it crosses the wire (and the core's session) as a string.
    #[error("the directory refused this node: {0}")]
    Refused(String),
}

/// Where Redis credentials go, said when Redis asks for them.
const REDIS_AUTH_HINT: &str = " (Redis wants credentials: redis://:PASSWORD@HOST:PORT, or \
     redis://USER:PASSWORD@HOST:PORT for an ACL user; rediss:// for TLS)";

/// A connection of one node to the directory service.
pub trait Directory: Send + Sync {
    /// Queues `request` for the service without waiting; the reply comes as
    /// [`DirectoryNotice::Reply`] (except for `Unsubscribe`, which has none). `Err` when the
    /// request was not queued (the queue is full, or the client stopped): no reply will come,
    /// and the caller answers the request itself.
    fn submit(&self, op: DirectoryOpId, request: DirectoryRequest) -> Result<(), SubmitRefused>;

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

/// How [`connect`] joins.
#[derive(Debug, Clone, Copy, Default)]
pub struct JoinOptions {
    /// How long a refusal that may pass is tried again (built-in head).
    pub join_timeout: std::time::Duration,
    /// Ask the built-in head for the first holder of every object other nodes publish
    /// ([`DirectoryEvent::Located`](skyriver_core::directory::DirectoryEvent::Located)); a
    /// Redis directory pushes none, and callers refuse the option with it.
    pub learn_locations: bool,
}

/// Connects this node (`me`) to the directory `spec` names, for cluster `cluster`, presenting
/// `token`. Returns once the node is registered (or with why it could not be); from then on
/// replies, events, member lists and health changes arrive on `notices`, and the backend
/// reconnects by itself when the service goes away and comes back. With the built-in head, a
/// refusal that may pass (the head is busy with other nodes' hellos, as when thousands of
/// daemons start at once; or this node id is still registered from a daemon that just
/// stopped) is tried again for `join_timeout`, at least the default
/// [`builtin::ClientConfig::join_timeout`].
///
/// Must be called from within a tokio runtime (the backend spawns its tasks on it).
pub async fn connect(
    spec: &DirectorySpec,
    me: MemberInfo,
    cluster: &str,
    token: &crate::token::ClusterToken,
    notices: NoticeSender,
    options: JoinOptions,
) -> Result<Arc<dyn Directory>, DirectoryError> {
    match spec {
        DirectorySpec::Builtin { addr } => {
            let defaults = builtin::ClientConfig::default();
            let config = builtin::ClientConfig {
                join_timeout: options.join_timeout.max(defaults.join_timeout),
                learn_locations: options.learn_locations,
                ..defaults
            };
            let client = builtin::connect(addr, me, token, notices, config).await?;
            Ok(Arc::new(client))
        }
        DirectorySpec::Redis { url } => {
            let config = self::redis::RedisConfig::new(url.clone(), cluster);
            let client = self::redis::connect(config, me, token, notices).await?;
            Ok(Arc::new(client))
        }
    }
}
