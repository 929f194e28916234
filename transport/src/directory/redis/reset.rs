//! Removing a cluster's records from Redis by hand (`skyriver cluster reset`).

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::AsyncConnectionConfig;
use skyriver_core::NodeId;
use tokio::time::timeout;

use super::{valid_cluster_name, Keys, RESYNC_CHUNK};

/// Why [`reset`] did not reset a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// The URL could not be parsed.
    #[error("bad Redis address {0}: use redis://HOST:PORT")]
    BadAddress(String),
    /// The cluster name cannot name Redis keys.
    #[error("bad cluster name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ -")]
    BadClusterName(String),
    /// Redis did not answer.
    #[error("cannot reach Redis at {addr}: {reason}")]
    Unreachable {
        /// The address, password masked.
        addr: String,
        /// Why.
        #[source]
        reason: ResetFailure,
    },
    /// Nodes of the cluster are alive and `force` was not given.
    #[error(
        "cluster {cluster:?} has live nodes registered ({}): stop them first, or pass --force \
         to remove the records anyway (live nodes register again at their next heartbeat)",
        nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
    )]
    LiveNodes {
        /// The cluster.
        cluster: String,
        /// Its live nodes.
        nodes: Vec<NodeId>,
    },
}

/// Why Redis could not be reached or did not carry out a command of [`reset`].
#[derive(Debug, thiserror::Error)]
pub enum ResetFailure {
    /// The CA file for `rediss://` cannot be read or used.
    #[error("the Redis CA file {}: {source}", path.display())]
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: super::super::CaFileError,
    },
    /// No connection could be made.
    #[error("{source}")]
    Connect {
        /// Why.
        #[source]
        source: ::redis::RedisError,
    },
    /// A command (or the connection) took longer than its bound.
    #[error("{command} timed out after {} s", RESET_COMMAND_TIMEOUT.as_secs())]
    TimedOut {
        /// `connect`, `SCAN`, `DEL`.
        command: &'static str,
    },
    /// Redis answered a command with an error.
    #[error("{command}: {source}")]
    Command {
        /// `SCAN`, `DEL`.
        command: &'static str,
        /// Redis's answer.
        #[source]
        source: ::redis::RedisError,
    },
}

/// What [`reset`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetOutcome {
    /// Nodes that were alive (only with `force`).
    pub live_nodes: Vec<NodeId>,
    /// Keys deleted (token, node records, index, holder entries).
    pub keys_removed: u64,
}

/// Bound on each command of [`reset`].
const RESET_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Removes every key of cluster `cluster` from the Redis at `url` (its token, node records and
/// object locations), so the name can be started afresh with any token. Refuses while nodes of
/// the cluster are alive unless `force`.
pub async fn reset(url: &str, cluster: &str, force: bool) -> Result<ResetOutcome, ResetError> {
    let shown = super::super::DirectorySpec::Redis {
        url: url.to_string(),
    }
    .to_string();
    if !valid_cluster_name(cluster) {
        return Err(ResetError::BadClusterName(cluster.to_string()));
    }
    let ca_file = std::env::var_os(super::REDIS_CA_ENV)
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let client = super::open_client(url, ca_file.as_deref()).map_err(|error| match error {
        super::OpenClientError::BadUrl => ResetError::BadAddress(shown.clone()),
        super::OpenClientError::CaFile { path, source } => ResetError::Unreachable {
            addr: shown.clone(),
            reason: ResetFailure::CaFile { path, source },
        },
    })?;
    let unreachable = |reason: ResetFailure| ResetError::Unreachable {
        addr: shown.clone(),
        reason,
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(RESET_COMMAND_TIMEOUT))
        .set_response_timeout(Some(RESET_COMMAND_TIMEOUT));
    let mut conn = match timeout(
        RESET_COMMAND_TIMEOUT,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(source)) => return Err(unreachable(ResetFailure::Connect { source })),
        Err(_) => return Err(unreachable(ResetFailure::TimedOut { command: "connect" })),
    };
    let keys = Keys::new(cluster);
    let node_keys = scan(&mut conn, &format!("{}*", keys.node_prefix()))
        .await
        .map_err(unreachable)?;
    let mut live_nodes: Vec<NodeId> = node_keys
        .iter()
        .filter_map(|key| key.strip_prefix(&keys.node_prefix())?.parse().ok())
        .map(NodeId)
        .collect();
    live_nodes.sort();
    if !live_nodes.is_empty() && !force {
        return Err(ResetError::LiveNodes {
            cluster: cluster.to_string(),
            nodes: live_nodes,
        });
    }
    let all = scan(&mut conn, &keys.all_pattern())
        .await
        .map_err(unreachable)?;
    let mut keys_removed = 0;
    for chunk in all.chunks(RESYNC_CHUNK) {
        let removed: u64 = timeout(
            RESET_COMMAND_TIMEOUT,
            ::redis::cmd("DEL").arg(chunk).query_async(&mut conn),
        )
        .await
        .map_err(|_| unreachable(ResetFailure::TimedOut { command: "DEL" }))?
        .map_err(|source| {
            unreachable(ResetFailure::Command {
                command: "DEL",
                source,
            })
        })?;
        keys_removed += removed;
    }
    if !live_nodes.is_empty() {
        // The live nodes re-read the members and register again at their next heartbeat.
        let _ = timeout(
            RESET_COMMAND_TIMEOUT,
            ::redis::cmd("PUBLISH")
                .arg(keys.members())
                .arg("reset")
                .query_async::<()>(&mut conn),
        )
        .await;
    }
    Ok(ResetOutcome {
        live_nodes,
        keys_removed,
    })
}

/// Every key matching `pattern` (`SCAN`, so Redis is never blocked on a large keyspace).
async fn scan(
    conn: &mut MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, ResetFailure> {
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = timeout(
            RESET_COMMAND_TIMEOUT,
            ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn),
        )
        .await
        .map_err(|_| ResetFailure::TimedOut { command: "SCAN" })?
        .map_err(|source| ResetFailure::Command {
            command: "SCAN",
            source,
        })?;
        found.extend(batch);
        if next == 0 {
            found.sort();
            found.dedup();
            return Ok(found);
        }
        cursor = next;
    }
}
