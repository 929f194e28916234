//! Why `skyriver up` (or [`super::LocalCluster::start`]) could not start or keep a cluster.
//! Each message says what to do about it.

use std::path::PathBuf;
use std::time::Duration;

use skyriver_daemon::size::format_bytes;

/// Why a local cluster did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// `--nodes 0`.
    #[error("--nodes must be at least 1")]
    NoNodes,
    /// The verbs fabric was asked for without devices.
    #[error("--fabric verbs needs --devices (e.g. rxe0,rxe1)")]
    VerbsWithoutDevices,
    /// `--cluster` is not a valid cluster name.
    #[error("bad --cluster {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ -")]
    BadClusterName(String),
    /// All the nodes' memory together is more than the machine can give.
    #[error(
        "{nodes} nodes × --memory {} = {} in total is more than this machine can give the \
         stores: {} available ({source_of_figure}). Stores that large would drive the kernel \
         into killing processes when they fill. Use --memory {} or less, fewer --nodes, or \
         --allow-overcommit to start anyway.",
        format_bytes(*each_bytes),
        format_bytes(*total_bytes),
        format_bytes(*available_bytes),
        format_bytes(*suggested_bytes)
    )]
    TooMuchMemory {
        /// `--nodes`.
        nodes: u64,
        /// `--memory`.
        each_bytes: u64,
        /// Their product.
        total_bytes: u64,
        /// What the machine has.
        available_bytes: u64,
        /// Where that figure comes from.
        source_of_figure: String,
        /// A `--memory` that fits.
        suggested_bytes: u64,
    },
    /// A file or directory of the cluster could not be used.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// What was tried (`create`, `open`, `write`, ...).
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// No temporary directory for the cluster.
    #[error("cannot create a directory under $TMPDIR: {0}")]
    TempDir(#[source] std::io::Error),
    /// The directory's lock could not be taken (not because another `up` holds it).
    #[error("cannot lock {}: {source}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why not.
        #[source]
        source: nix::errno::Errno,
    },
    /// Another `up` runs a cluster in the directory.
    #[error(
        "a cluster is already running in {}, pid {pid}: stop it (Ctrl-C where it runs, or kill \
         {pid}) or use another --dir",
        dir.display()
    )]
    Running {
        /// The directory.
        dir: PathBuf,
        /// The other `up`.
        pid: u32,
    },
    /// Another `up` is starting a cluster in the directory.
    #[error("a cluster is already starting in {}: stop it or use another --dir", dir.display())]
    Starting {
        /// The directory.
        dir: PathBuf,
    },
    /// A daemon that is not this cluster's answers on one of its sockets.
    #[error(
        "a daemon that is not this cluster's listens on {}: stop it or use another --dir",
        socket.display()
    )]
    ForeignDaemon {
        /// The socket.
        socket: PathBuf,
    },
    /// The network namespaces could not be made.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// A daemon could not be started.
    #[error("cannot start daemon {node}: {source}")]
    Spawn {
        /// Its node.
        node: u32,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Ctrl-C (or SIGTERM, SIGHUP) while starting.
    #[error("interrupted during start-up")]
    Interrupted,
    /// A daemon exited while the cluster started: its exit status and the last lines of its
    /// log.
    #[error("{report} during start-up")]
    ExitedDuringStart {
        /// What [`super::NodeExit::report`] says.
        report: String,
    },
    /// A daemon answered and refused this client (another release's client protocol).
    #[error(
        "node-{node} answered on {} but refused this client: {source} (a daemon of another \
         release speaks another client protocol: start it with the same build, or compare \
         builds with each one's own `skyriver bench`)",
        socket.display()
    )]
    Refused {
        /// The node.
        node: usize,
        /// Its socket.
        socket: PathBuf,
        /// Its answer.
        #[source]
        source: skyriver_client::ClientError,
    },
    /// A daemon did not answer on its socket in time.
    #[error(
        "node-{node} did not answer on {} within {within:?}; its log: {}",
        socket.display(),
        log.display()
    )]
    NoAnswer {
        /// The node.
        node: usize,
        /// Its socket.
        socket: PathBuf,
        /// How long it was given.
        within: Duration,
        /// Its log.
        log: PathBuf,
    },
    /// The daemons did not all connect to each other in time.
    #[error(
        "the {nodes} daemons did not all connect within {within:?}; their logs are in {}",
        dir.display()
    )]
    NotConnected {
        /// How many.
        nodes: usize,
        /// How long they were given.
        within: Duration,
        /// Where their logs are.
        dir: PathBuf,
    },
    /// No loopback port was free.
    #[error("no free loopback port: {0}")]
    NoFreePort(#[source] std::io::Error),
    /// This program's own path (to start daemons with) is unknown.
    #[error("cannot find this program's own path to start daemons with: {0}")]
    OwnPath(#[source] std::io::Error),
    /// A daemon exited after the start; the others were stopped.
    #[error("node-{node} exited, so the cluster was stopped")]
    Exited {
        /// The node.
        node: usize,
    },
    /// The signals that stop `up` cannot be watched.
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
}

impl UpError {
    /// A daemon found a port chosen for it taken (chosen free, taken by another process before
    /// the daemon bound it): starting again with other ports may succeed.
    pub fn port_taken(&self) -> bool {
        matches!(self, UpError::ExitedDuringStart { report } if report.contains("Address already in use"))
    }
}

/// Why `--nodes` was refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeCountError {
    /// `0`.
    #[error("a cluster needs at least 1 node")]
    Zero,
    /// Not a number.
    #[error("{0:?} is not a number of nodes")]
    NotANumber(String),
}
