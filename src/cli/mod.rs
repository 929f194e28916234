//! The `skyriver` command line: its definitions and every command's body. The `skyriver`
//! binary and the Python package's `skyriver` entry point both run [`main_with_args`].

mod chaos;
mod daemon;
mod demo;
mod evict;
mod fetch;
mod get;
mod list;
mod locate;
mod nodes;
mod plasma_store;
mod put;
mod remove;
mod stat;
mod stdout;
mod watch;

use chaos::*;
mod error;
use error::file_error;
pub use error::{CliError, ValueError};

use daemon::*;
use demo::*;
use evict::*;
use fetch::*;
use get::*;
use list::*;
use locate::*;
use nodes::*;
use plasma_store::*;
use put::*;
use remove::*;
use stat::*;
use stdout::*;
use watch::*;

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::net::SocketAddr;

use skyriver_client::{Client, ClientError, FetchOptions, ObjectEvent, ObjectId, StoreError};
use skyriver_core::client_protocol::MAX_INLINE_PUT_BYTES;
use skyriver_core::node::{ThresholdPolicy, TransferMode};
use skyriver_core::NodeId;
use skyriver_daemon::size::{format_bytes, ByteSize};
use skyriver_daemon::{ClusterConfig, DaemonConfig, DirectoryChoice, FabricChoice};
use skyriver_transport::directory::DirectorySpec;

/// Skyriver: a distributed in-memory object store for RDMA clusters.
///
/// Start a daemon on each node (`skyriver daemon`), then put, get and list objects through
/// its Unix socket. Objects are immutable once sealed and read in place, without copies.
#[derive(Parser)]
#[command(name = "skyriver", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct SocketArg {
    /// The daemon's Unix socket [default: $SKYRIVER_SOCKET or /tmp/skyriver-<uid>/skyriver.sock]
    #[arg(long, short = 's', global = true)]
    socket: Option<PathBuf>,
}

impl SocketArg {
    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(skyriver_client::default_socket_path)
    }

    /// Connects, waiting (and saying so) while the daemon is still starting.
    fn connect(&self) -> Result<Client, ClientError> {
        let path = self.path();
        let started = std::time::Instant::now();
        let mut told = None::<std::time::Instant>;
        loop {
            match Client::connect(&path) {
                Err(ClientError::Store(StoreError::Starting(status)))
                    if started.elapsed() < STARTING_WAIT =>
                {
                    if told.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                        eprintln!(
                            "skyriver: the daemon at {} is starting ({status}); waiting",
                            path.display()
                        );
                        told = Some(std::time::Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }
}

/// How long a command waits for a daemon that is still starting.
const STARTING_WAIT: Duration = Duration::from_secs(600);

#[derive(Subcommand)]
enum Command {
    /// Run the node daemon: holds objects in shared memory and serves local clients.
    Daemon(Box<DaemonArgs>),
    /// Run the daemon with plasma_store's flags, `-m BYTES -s SOCKET [-d DIR -h]`, for scripts
    /// written for Plasma. Also runs as `plasma_store` (a symbolic link to skyriver by that
    /// name).
    #[command(name = "plasma_store", alias = "plasma-store")]
    PlasmaStore(PlasmaStoreArgs),
    /// Store a file (or standard input) as a new object and print its id.
    Put {
        /// The file to store; `-` reads standard input.
        input: PathBuf,
        /// Use this id (40 hex characters) instead of a random one.
        #[arg(long)]
        id: Option<ObjectId>,
        /// Metadata to store with the object (a short string).
        #[arg(long, default_value = "")]
        metadata: String,
        /// Copies to keep, this node's included, on distinct failure domains where there are
        /// enough (1 to 16) [default: the daemon's --replicas]
        #[arg(long, value_parser = daemon::parse_replicas)]
        replicas: Option<u8>,
        /// Return once every copy is sealed (else at the local seal, the copies following in
        /// the background); fails after --wait-ms naming how many copies exist.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits for the copies, in milliseconds.
        #[arg(long, default_value_t = 60_000, requires = "wait")]
        wait_ms: u64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Write an object's data to a file or standard output.
    Get {
        /// The object's id (40 hex characters).
        id: ObjectId,
        /// Write here instead of standard output.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Wait this many milliseconds for the object to be sealed (default: do not wait).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List the objects in the store.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Delete objects (deferred while a client holds them).
    Rm {
        /// The objects' ids.
        #[arg(required = true)]
        ids: Vec<ObjectId>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Show memory use and object counts.
    Stat {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Print seal and delete events as they happen. Exits 0 after --count events, 1 when the
    /// daemon stops or dies.
    Watch {
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Evict unused objects until at least SIZE bytes are freed. Exits 1 when less could be
    /// freed because the objects left are in use; a store left empty succeeds, however little
    /// it held.
    Evict {
        /// How much to free, e.g. 1GiB.
        size: ByteSize,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Fetch objects from other nodes of the cluster into this node's store.
    Fetch {
        /// The objects' ids.
        #[arg(required = true)]
        ids: Vec<ObjectId>,
        /// Write the (single) object's data here; `-` for standard output.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Give up after this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// Transfer path: auto (the daemon's threshold), or eager or rendezvous forced.
        #[arg(long, default_value = "auto")]
        mode: TransferMode,
        /// Wait (up to --timeout-ms) for a node to publish objects nobody holds yet; without
        /// it such an object fails at once.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        socket: SocketArg,
        /// Ask this node first (`node-3` or `3`, as `skyriver nodes` lists them), without a
        /// directory lookup; if it does not hold an object, the directory is asked.
        #[arg(long = "from", value_name = "NODE", value_parser = fetch::parse_node)]
        from: Option<NodeId>,
    },
    /// List the cluster's nodes as this daemon sees them.
    Nodes {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// A live view of one daemon or several (--socket repeated): memory, ops/s, fetch MB/s in
    /// and out, work in flight, and every node of the cluster with its traffic and errors.
    /// `q` quits; --once prints one frame, --once --json one JSON document.
    Top(crate::top::TopArgs),
    /// Show which nodes hold an object, each copy marked a copy of record or a cache copy.
    Locate {
        /// The object's id.
        id: ObjectId,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Start a local cluster of N daemons on this machine and supervise them.
    ///
    /// Each daemon's output goes to node-N.log in the cluster's directory. If a daemon exits,
    /// during start-up or later, up reports it at once (exit status and the last lines of its
    /// log), stops the others and exits with status 1; it does not restart it. Ctrl-C, SIGTERM
    /// or SIGHUP stop the cluster cleanly (exit status 0). Built-in directory on node 0 by
    /// default, or --directory redis://HOST:PORT; TCP or verbs fabric.
    Up(crate::up::UpArgs),
    /// Operations on a cluster's records in its directory (e.g. `cluster reset`).
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
    /// Start a throw-away daemon, store and read back a few objects, and show the store.
    Demo,
    /// Run the deterministic cluster simulator: one seed (--seed N) or a sweep (--seeds COUNT).
    Sim(skyriver_sim::cli::SimArgs),
    /// Benchmarks that print a table and write JSON.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Faults on real daemons under load (root): N daemons in network namespaces, clients on
    /// every node, a nemesis killing, pausing, cutting and starving them on a schedule drawn
    /// from --seed, and a checker over the history. Prints a summary; exits 1 on a violation,
    /// with the command that replays the run.
    Chaos(ChaosArgs),
}

/// Why `-e URL` is refused: the only external store is a local directory, `-e file://DIR`
/// (the spill tier, `--spill-dir DIR`).
fn external_store_refusal(url: &str) -> CliError {
    CliError::ExternalStore {
        url: url.to_string(),
    }
}

/// Runs the command line `args` (the program's name first), as the `skyriver` binary does.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // Every command's output may be piped into `head`: a closed pipe is no bug to report.
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_stdout_closed(info.payload()) {
            report_panic(info)
        }
    }));
    match std::panic::catch_unwind(move || run(args)) {
        Ok(code) => code,
        Err(payload) if is_stdout_closed(&*payload) => ExitCode::from(STDOUT_CLOSED_STATUS),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

fn run(args: Vec<std::ffi::OsString>) -> ExitCode {
    if invoked_as_plasma_store(args.first()) {
        return exit_code(run_plasma_store(PlasmaStoreCli::parse_from(args).args));
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Sim(args) => return skyriver_sim::cli::run(&args),
        Command::Daemon(args) => run_daemon(*args),
        Command::PlasmaStore(args) => run_plasma_store(args),
        Command::Put {
            input,
            id,
            metadata,
            replicas,
            wait,
            wait_ms,
            socket,
        } => {
            let policy = skyriver_client::ReplicaPolicy {
                copies: replicas.unwrap_or(0),
                wait_ms: wait.then_some(wait_ms),
            };
            put(&socket, &input, id, metadata.as_bytes(), policy)
        }
        Command::Get {
            id,
            output,
            timeout_ms,
            socket,
        } => get(&socket, id, output, timeout_ms),
        Command::Ls { json, socket } => list(&socket, json),
        Command::Rm { ids, socket } => remove(&socket, &ids),
        Command::Stat { json, socket } => stat(&socket, json),
        Command::Watch { count, socket } => watch(&socket, count),
        Command::Evict { size, socket } => evict(&socket, size),
        Command::Demo => demo(),
        Command::Fetch {
            ids,
            output,
            timeout_ms,
            mode,
            wait,
            socket,
            from,
        } => fetch(&socket, &ids, output, timeout_ms, mode, wait, from),
        Command::Nodes { json, socket } => nodes(&socket, json),
        Command::Locate { id, json, socket } => locate(&socket, id, json),
        Command::Top(args) => crate::top::run(&args).map_err(CliError::from),
        Command::Up(args) => crate::up::run(&args).map_err(CliError::from),
        Command::Cluster(command) => crate::cluster::run(command).map_err(CliError::from),
        Command::Bench(command) => crate::bench::run(command).map_err(CliError::from),
        Command::Chaos(args) => run_chaos(&args).map_err(CliError::from),
    };
    exit_code(result)
}

fn exit_code(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("skyriver: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests;
