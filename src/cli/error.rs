//! Why a command failed, and why a flag's value was refused. The binary prints them through
//! `Display` (with `skyriver: ` in front); each says what to do about it.

use std::path::PathBuf;

use skyriver_client::{ClientError, ObjectId};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The daemon could not be reached, or refused a request.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A file could not be used.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// What was tried (`open`, `create`, `write`, ...).
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// An input (a file, standard input, a pipe) could not be read.
    #[error("cannot read {what}: {source}")]
    Read {
        /// Which input.
        what: String,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// `put` was given a directory.
    #[error("{} is a directory, not a file", .0.display())]
    IsDirectory(PathBuf),
    /// The input ended before its size.
    #[error(
        "{} shrank while being read ({filled} of {size} bytes); the object was not stored",
        path.display()
    )]
    InputShrank {
        /// The input.
        path: PathBuf,
        /// Bytes read.
        filled: usize,
        /// Bytes expected.
        size: usize,
    },
    /// The input went on past its size.
    #[error(
        "{} grew while being read (more than its {size} bytes); the object was not stored",
        path.display()
    )]
    InputGrew {
        /// The input.
        path: PathBuf,
        /// Bytes expected.
        size: usize,
    },
    /// Standard output could not be written (other than closed by its reader).
    #[error("cannot write standard output: {0}")]
    Stdout(#[source] std::io::Error),
    /// Some of several operations failed (each was reported as it failed).
    #[error("{failed} of {total} {what} failed")]
    SomeFailed {
        /// How many failed.
        failed: usize,
        /// Of how many.
        total: usize,
        /// Which (`deletes`, `fetches`).
        what: &'static str,
    },
    /// `fetch -o` with several ids.
    #[error("-o takes exactly one object id")]
    OutputNeedsOneId,
    /// `locate`: no live node holds the object.
    #[error("no live node holds {0}")]
    NotHeld(ObjectId),
    /// `evict` freed less than asked.
    #[error(
        "freed {freed} of the {asked} asked: every other object is in use, unsealed or pinned \
         by a transfer"
    )]
    FreedLess {
        /// Bytes freed, formatted.
        freed: String,
        /// Bytes asked, formatted.
        asked: String,
    },
    /// `watch`: the subscription failed.
    #[error("lost the daemon at {} after {seen} event(s): {source}", socket.display())]
    DaemonLost {
        /// Its socket.
        socket: PathBuf,
        /// Events seen before.
        seen: u64,
        /// What failed.
        #[source]
        source: ClientError,
    },
    /// `watch`: the daemon ended the subscription.
    #[error(
        "the daemon at {} closed the connection (stopped or died) after {seen} event(s)",
        socket.display()
    )]
    DaemonClosed {
        /// Its socket.
        socket: PathBuf,
        /// Events seen.
        seen: u64,
    },
    /// `RUST_LOG` is not a log filter.
    #[error("RUST_LOG: {0}")]
    RustLog(String),
    /// `--socket-group`, the token or the listening addresses.
    #[error(transparent)]
    Security(#[from] skyriver_daemon::security::SecurityError),
    /// `--directory` is not a directory address.
    #[error(transparent)]
    Directory(#[from] skyriver_transport::directory::DirectoryError),
    /// `--directory-password-file` could not be used.
    #[error(transparent)]
    DirectoryPassword(skyriver_transport::directory::redis::PasswordFileError),
    /// `--directory-password-file` with a built-in directory.
    #[error("--directory-password-file is for a Redis directory (redis://HOST:PORT)")]
    PasswordFileForBuiltin,
    /// `--learn-locations` without the built-in directory.
    #[error(
        "--learn-locations needs the built-in directory (--head, or --join HOST:PORT): a Redis \
         directory pushes no locations, and a daemon outside a cluster has none to learn"
    )]
    LearnLocationsWithoutHead,
    /// `--repair-rate` on a daemon that does not serve the head.
    #[error("--repair-rate is for the daemon that serves the directory (--head): it runs repairs")]
    RepairRateWithoutHead,
    /// A daemon joining a cluster without a node id.
    #[error(
        "a daemon joining a cluster needs --node-id N (unique per node; under Slurm \
         $SLURM_NODEID is used)"
    )]
    NodeIdNeeded,
    /// `SLURM_NODEID` is not a number.
    #[error("SLURM_NODEID={0:?} is not a node id (a number); pass --node-id N")]
    SlurmNodeId(String),
    /// `--fabric verbs` and libibverbs cannot list devices.
    #[error("--fabric verbs: {0}")]
    Verbs(#[source] skyriver_transport::verbs::DeviceError),
    /// `--fabric verbs` and no device.
    #[error(
        "--fabric verbs: libibverbs found no RDMA device (load a driver, e.g. `rdma link add \
         rxe0 type rxe netdev eth0` for SoftRoCE, name one with --device, or use --fabric tcp)"
    )]
    NoRdmaDevice,
    /// The daemon did not start, or failed.
    #[error(transparent)]
    Daemon(#[from] skyriver_daemon::DaemonError),
    /// `plasma_store -e URL`.
    #[error(
        "-e {url}: the only external store Skyriver has is a local directory, \
         `-e file://DIR` (the daemon's `--spill-dir DIR`)"
    )]
    ExternalStore {
        /// The URL given.
        url: String,
    },
    /// This program's own path (to start daemons with) is unknown.
    #[error("cannot find this program's own path to start daemons with: {0}")]
    OwnPath(#[source] std::io::Error),
    /// `demo`: the waiting client's thread panicked.
    #[error("the waiting client panicked")]
    WaiterPanicked,
    /// `demo`: a fetched copy differs from its original.
    #[error("the fetched copy of {0} differs from the original")]
    CopyDiffers(ObjectId),
    /// `top`.
    #[error(transparent)]
    Top(#[from] crate::top::TopError),
    /// `up`.
    #[error(transparent)]
    Up(Box<crate::up::UpError>),
    /// `cluster`.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterCommandError),
    /// `bench`.
    #[error(transparent)]
    Bench(#[from] crate::bench::BenchError),
    /// `chaos`.
    #[error(transparent)]
    Chaos(#[from] super::chaos::ChaosCommandError),
}

impl From<crate::up::UpError> for CliError {
    fn from(error: crate::up::UpError) -> Self {
        CliError::Up(Box::new(error))
    }
}

/// Turns an IO error about `path` into [`CliError::File`].
pub(super) fn file_error(
    action: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> CliError {
    let path = path.to_path_buf();
    move |source| CliError::File {
        action,
        path,
        source,
    }
}

/// Why a flag's value was refused (clap prints it after the flag's name).
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    /// Not an octal number.
    #[error("{0:?} is not an octal mode like 600")]
    NotOctal(String),
    /// Bits beyond the permission bits.
    #[error("{0} has bits beyond 777: only the permission bits of the socket can be set")]
    BeyondPermissionBits(String),
    /// A mode the owner could not use.
    #[error(
        "{0} takes read and write away from the socket's owner: the daemon's own user could \
         not reach it (and a second daemon could not tell it is running); use 600, 660 or 666"
    )]
    OwnerLosesAccess(String),
    /// Not a whole number.
    #[error("{text:?} is not a whole number from {bounds}")]
    NotAWholeNumber {
        /// What was given.
        text: String,
        /// `LOW to HIGH`.
        bounds: String,
    },
    /// A number outside its range.
    #[error("{value} is outside {bounds}: {why}")]
    OutOfRange {
        /// What was given.
        value: String,
        /// `LOW to HIGH`.
        bounds: String,
        /// Why the limit is there.
        why: &'static str,
    },
    /// `--eager-threshold` is neither a size nor `auto`.
    #[error("--eager-threshold: {0} (or auto)")]
    Threshold(String),
    /// `--relay-min-bytes` is neither a size nor `off`.
    #[error("--relay-min-bytes: {0} (or off)")]
    RelayMinBytes(String),
    /// `--repair-rate` is not a size per second above zero.
    #[error("--repair-rate: {0} (a size per second, like 200MiB/s)")]
    RepairRate(String),
}
