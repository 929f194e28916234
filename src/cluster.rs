//! `skyriver cluster`: operations on a cluster's records in its directory.

use clap::{Args, Subcommand};
use skyriver_transport::directory::redis::{self, ResetError};
use skyriver_transport::directory::DirectorySpec;

/// Subcommands of `skyriver cluster`.
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Remove a Redis-backed cluster's records (its token, node records and object
    /// locations), so the name can be started again with any token. Refuses while nodes of
    /// the cluster are alive, unless --force.
    ///
    /// A cluster's records go away by themselves: a cleanly stopped node removes its own, a
    /// crashed node's record expires after 5 s, and the token 30 s after the last live node
    /// stopped refreshing it. This is for when you cannot wait.
    Reset(ResetArgs),
}

/// Options of `skyriver cluster reset`.
#[derive(Args, Debug)]
pub struct ResetArgs {
    /// The cluster's directory: redis://HOST:PORT (a built-in directory lives in its head
    /// daemon: stopping the head resets it).
    #[arg(
        long,
        value_name = "URL",
        env = "SKYRIVER_DIRECTORY_URL",
        hide_env_values = true
    )]
    pub directory: String,
    /// Name of the cluster.
    #[arg(long, default_value = "default", env = "SKYRIVER_CLUSTER")]
    pub cluster: String,
    /// Remove the records even while nodes are alive (they register again at their next
    /// heartbeat, with their own token).
    #[arg(long)]
    pub force: bool,
}

/// Why a `skyriver cluster` subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCommandError {
    /// `--directory` is not a directory address.
    #[error(transparent)]
    Directory(#[from] skyriver_transport::directory::DirectoryError),
    /// `--directory` names a built-in directory.
    #[error(
        "{0} is a built-in directory: it lives in its head daemon, and stopping the head \
         resets it; `cluster reset` is for redis://HOST:PORT"
    )]
    Builtin(DirectorySpec),
    /// No runtime to talk to Redis with.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The reset failed.
    #[error(transparent)]
    Reset(#[from] ResetError),
}

/// Runs a `skyriver cluster` subcommand.
pub fn run(command: ClusterCommand) -> Result<(), ClusterCommandError> {
    match command {
        ClusterCommand::Reset(args) => reset(&args),
    }
}

fn reset(args: &ResetArgs) -> Result<(), ClusterCommandError> {
    let spec: DirectorySpec = args.directory.parse()?;
    let url = match &spec {
        DirectorySpec::Redis { url } => url.clone(),
        DirectorySpec::Builtin { .. } => return Err(ClusterCommandError::Builtin(spec)),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterCommandError::Runtime)?;
    let outcome = runtime.block_on(redis::reset(&url, &args.cluster, args.force))?;
    if !outcome.live_nodes.is_empty() {
        let names: Vec<String> = outcome.live_nodes.iter().map(|n| n.to_string()).collect();
        eprintln!(
            "warning: removed the records of live nodes ({}); they register again at their next heartbeat",
            names.join(", ")
        );
    }
    if outcome.keys_removed == 0 {
        println!(
            "cluster {:?} in {spec} has no records: nothing to reset",
            args.cluster
        );
    } else {
        println!(
            "cluster {:?} in {spec} reset: {} keys removed; it can be started with any token",
            args.cluster, outcome.keys_removed
        );
    }
    Ok(())
}
