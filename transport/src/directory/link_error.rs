//! Why a link to the directory could not open, or ended; and why a request was not queued.
//!
//! These stay typed inside the transport. Where they reach the core they become text: the
//! session's `handle_connect_failed`/`handle_disconnected` and the `Health(Err)` notice carry a
//! reason string across the sans-IO boundary (the core only shows it; it never matches on it).

use std::path::PathBuf;
use std::sync::Arc;

use super::frame::FrameError;

/// Why a link to the directory could not open, or ended. Cheap to clone (sources are shared),
/// because one lost Redis connection fails every request of a pipeline with the same cause.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkError {
    /// The TCP connection to the head could not be opened.
    #[error("cannot connect to the head: {0}")]
    Connect(#[source] Arc<std::io::Error>),
    /// Reading the head's frames failed (the stream broke, or a frame was malformed).
    #[error("reading from the head failed: {0}")]
    Read(#[source] Arc<FrameError>),
    /// The head closed the connection.
    #[error("the head closed the connection")]
    ClosedByHead,
    /// A Redis connection could not be opened, or a command on it failed for good.
    #[error("Redis connection failed: {0}")]
    Redis(#[source] Arc<::redis::RedisError>),
    /// A Redis command the link needs (one of the hello's) failed, or answered something this
    /// version does not read; the text is the adapter's reason (as its `Unavailable` replies
    /// give it).
    #[error("{0}")]
    Command(String),
    /// The Redis pub/sub (or sharded pub/sub) connection went away.
    #[error("{0}")]
    SubscriberLost(&'static str),
    /// `what` did not finish within `limit_ms`.
    #[error("{what} did not finish within {limit_ms} ms")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The bound.
        limit_ms: u64,
    },
    /// The node's own session broke the registry protocol on this link (a bug on this side).
    #[error("protocol violation on the directory link: {0}")]
    Protocol(&'static str),
    /// The cluster token's record could not be derived or checked (off the async threads).
    #[error("the token record could not be {stage}: {source}")]
    TokenRecord {
        /// `derived` or `checked`.
        stage: &'static str,
        /// Why.
        #[source]
        source: Arc<TokenRecordError>,
    },
    /// The link's task stopped, or the connection closed under it.
    #[error("the connection closed")]
    Closed,
    /// The task opening the connection failed (panicked or was cancelled).
    #[error("the connection attempt failed: {0}")]
    Attempt(#[source] Arc<tokio::task::JoinError>),
    /// The registry's answers broke the session's rules (the session then drops the link).
    #[error(transparent)]
    Session(#[from] skyriver_core::registry::session::SessionError),
    /// Nothing to attempt yet: the session's retry timer is not due.
    #[error("no connection attempt was due")]
    NotDue,
    /// The CA file a `rediss://` connection trusts could not be read or used.
    #[error("the Redis CA file {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<CaFileError>,
    },
}

impl LinkError {
    /// Whether Redis asked for other credentials (so the message can say where they go).
    pub fn is_redis_auth(&self) -> bool {
        match self {
            LinkError::Redis(error) => {
                let refused = |code: &str| matches!(code, "NOAUTH" | "WRONGPASS");
                error.kind() == ::redis::ErrorKind::AuthenticationFailed
                    || error.code().is_some_and(refused)
                    // A pipeline's failures are each a server error of their own.
                    || ::redis::RedisError::clone(error)
                        .into_server_errors()
                        .is_some_and(|errors| errors.iter().any(|(_, e)| refused(e.code())))
            }
            _ => false,
        }
    }

    pub(crate) fn timeout(what: &'static str, limit: std::time::Duration) -> Self {
        LinkError::Timeout {
            what,
            limit_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl From<::redis::RedisError> for LinkError {
    fn from(error: ::redis::RedisError) -> Self {
        LinkError::Redis(Arc::new(error))
    }
}

/// Why a token record could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TokenRecordError {
    /// The operating system gave no randomness for the salt.
    #[error("no random salt: {0}")]
    Salt(getrandom::Error),
    /// The salt could not be encoded.
    #[error("bad salt: {0}")]
    SaltEncoding(argon2::password_hash::Error),
    /// The KDF cost is not one Argon2 takes.
    #[error("bad token KDF cost {cost}: {objection}")]
    Cost {
        /// The cost asked for.
        cost: String,
        /// Argon2's objection (not a `std` error in this build of argon2).
        objection: argon2::Error,
    },
    /// Argon2 failed.
    #[error("cannot derive the token record: {0}")]
    Derive(argon2::password_hash::Error),
    /// The derivation's blocking task failed.
    #[error("the derivation's task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Why the CA file of a `rediss://` connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    /// It could not be read.
    #[error("cannot read it (SKYRIVER_REDIS_CA): {0}")]
    Read(#[source] std::io::Error),
    /// Redis's TLS set-up refused it.
    #[error("cannot use it: {0}")]
    Use(#[source] ::redis::RedisError),
}

/// Why [`Directory::submit`](super::Directory::submit) did not queue a request. The caller
/// answers the request itself (the daemon feeds the core `Unavailable` with this reason), so
/// a queue that is full is a typed refusal, never a blocked loop or a lost reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitRefused {
    /// The queue to the directory client holds its most requests: the client is waiting for
    /// the link (the service is slow) or for the node to take its notices.
    #[error("{queued} directory requests queued, the most: the directory is behind")]
    Busy {
        /// The queue's bound.
        queued: usize,
    },
    /// The directory client stopped (the node is leaving).
    #[error("the directory client stopped")]
    Stopped,
}
