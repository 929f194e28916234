//! The daemon's cluster side at start-up: the built-in directory when this daemon is the head,
//! and the connection to the directory.

use std::sync::Arc;

use skyriver_transport::directory::NoticeSender;
use tracing::{info, warn};

/// The directory this daemon joined.
pub(super) struct JoinedDirectory {
    pub(super) directory: Arc<dyn skyriver_transport::directory::Directory>,
    /// The built-in directory's server, when this daemon is the head.
    pub(super) server: Option<skyriver_transport::directory::builtin::BuiltinDirectoryServer>,
    /// What `skyriver nodes` and the logs call it: where it is, and whether this node serves
    /// it (a joining node does not know the head's node id, so it names none).
    pub(super) description: String,
}

/// Why the daemon could not serve or join its directory.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryStartError {
    /// The head's directory port could not be bound.
    #[error("cannot serve the directory on {addr}: {source}")]
    Bind {
        /// The address asked for (`--head`).
        addr: std::net::SocketAddr,
        /// From `bind`.
        #[source]
        source: std::io::Error,
    },
    /// The head's directory server could not start.
    #[error("cannot start the directory server: {0}")]
    Serve(#[source] std::io::Error),
    /// The directory could not be reached, or refused this node.
    #[error(transparent)]
    Join(skyriver_transport::directory::DirectoryError),
}

/// Serves the built-in directory when this daemon is the head (repairing at
/// `repair_bytes_per_second` when given), then joins the directory.
pub(super) async fn connect_directory(
    cluster: &super::ClusterConfig,
    me: skyriver_transport::directory::MemberInfo,
    repair_bytes_per_second: Option<u64>,
    notices: NoticeSender,
) -> Result<JoinedDirectory, DirectoryStartError> {
    use skyriver_transport::directory::builtin::{BuiltinDirectoryServer, ServerConfig};
    use skyriver_transport::directory::DirectorySpec;

    use super::DirectoryChoice;

    let mut server = None;
    let spec = match &cluster.directory {
        DirectoryChoice::Head { listen } => {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|source| DirectoryStartError::Bind {
                    addr: *listen,
                    source,
                })?;
            let mut server_config = ServerConfig::new(cluster.cluster_token.clone());
            server_config.repair_bytes_per_second = repair_bytes_per_second;
            let head = BuiltinDirectoryServer::spawn(listener, server_config)
                .map_err(DirectoryStartError::Serve)?;
            let addr = head.local_addr().to_string();
            // What other hosts dial: never `0.0.0.0`.
            let dial =
                crate::security::advertised_address(head.local_addr(), cluster.advertise, None)
                    .map_or_else(|_| addr.clone(), |a| a.to_string());
            info!(directory = %addr, "serving the built-in directory: other daemons join with --join {dial}");
            server = Some(head);
            DirectorySpec::Builtin { addr }
        }
        DirectoryChoice::Join { head } => DirectorySpec::Builtin { addr: head.clone() },
        DirectoryChoice::Redis { url } => DirectorySpec::Redis { url: url.clone() },
    };
    let directory = join_waiting(&spec, me, cluster, notices).await?;
    let description = match (&spec, &server) {
        (DirectorySpec::Builtin { addr }, Some(_)) => {
            format!("built-in directory at {addr} (served by this node)")
        }
        (DirectorySpec::Builtin { addr }, None) => format!("built-in directory at {addr}"),
        (DirectorySpec::Redis { .. }, _) => directory.describe(),
    };
    Ok(JoinedDirectory {
        directory,
        server,
        description,
    })
}

/// Joins the directory, trying again while it cannot be reached, for up to the cluster's
/// `join_timeout`: daemons started together (by Slurm, or after a head restart) need not wait
/// for the head in order. A refusal that may pass (the head busy with thousands of hellos) is
/// tried again for as long inside `connect`; any other (wrong token) or a bad address ends at
/// once.
async fn join_waiting(
    spec: &skyriver_transport::directory::DirectorySpec,
    me: skyriver_transport::directory::MemberInfo,
    cluster: &super::ClusterConfig,
    notices: NoticeSender,
) -> Result<Arc<dyn skyriver_transport::directory::Directory>, DirectoryStartError> {
    use skyriver_transport::directory::DirectoryError;
    let give_up_at = tokio::time::Instant::now() + cluster.join_timeout;
    let mut pause = JOIN_RETRY_FIRST;
    let mut waiting = false;
    loop {
        let attempt = skyriver_transport::directory::connect(
            spec,
            me.clone(),
            &cluster.cluster_name,
            &cluster.cluster_token,
            notices.clone(),
            skyriver_transport::directory::JoinOptions {
                join_timeout: cluster.join_timeout,
                learn_locations: cluster.learn_locations,
            },
        )
        .await;
        match attempt {
            Ok(directory) => return Ok(directory),
            Err(error @ DirectoryError::Unreachable { .. })
                if tokio::time::Instant::now() + pause < give_up_at =>
            {
                if !waiting {
                    warn!(%error, wait_s = cluster.join_timeout.as_secs_f64(),
                        "the directory does not answer yet: trying again (--join-timeout)");
                    waiting = true;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(JOIN_RETRY_MAX);
            }
            Err(error) => return Err(DirectoryStartError::Join(error)),
        }
    }
}

/// First pause before joining an unreachable directory again; it doubles up to
/// [`JOIN_RETRY_MAX`].
const JOIN_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest pause between tries to join an unreachable directory.
const JOIN_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// `HOST:PORT` of the directory, to find the route (and so the source address) peers reach
/// this node by; `None` for a head listening on an unspecified address.
pub(super) fn directory_host(directory: &super::DirectoryChoice) -> Option<String> {
    use super::DirectoryChoice;
    match directory {
        DirectoryChoice::Head { listen } => {
            (!listen.ip().is_unspecified()).then(|| listen.to_string())
        }
        DirectoryChoice::Join { head } => Some(head.clone()),
        DirectoryChoice::Redis { url } => {
            let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
            let authority = rest.split('/').next().unwrap_or_default();
            // Never the credentials: only what follows the last `@`.
            Some(authority.rsplit('@').next().unwrap_or_default().to_string())
        }
    }
}
