//! `skyriver bench recovery`: how long a restart takes to recover a persistent store.
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use skyriver_core::{Store, StoreConfig};

use skyriver_client::Client;
use skyriver_core::ObjectId;
use skyriver_daemon::persistence::{Durability, Persistence, PersistenceConfig, RecoverySummary};
use skyriver_daemon::size::{format_bytes, ByteSize};

/// Options of `bench recovery`.
#[derive(Args, Debug, Clone)]
pub struct RecoveryArgs {
    /// Objects to store before the crash.
    #[arg(long, default_value_t = 100_000)]
    pub objects: u64,
    /// Data bytes of each object.
    #[arg(long, default_value = "1KiB")]
    pub object_size: ByteSize,
    /// Where to put the backing file (must not exist; removed afterwards).
    #[arg(long)]
    pub backing_file: Option<PathBuf>,
    /// Durability of the daemon that fills the store.
    #[arg(long, value_enum, default_value_t = Durability::Seal)]
    pub durability: Durability,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-recovery.json")]
    pub json: PathBuf,
}

/// What `bench recovery` measured.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryResult {
    /// Objects stored before the kill.
    pub objects: u64,
    /// Data bytes of each.
    pub object_size_bytes: u64,
    /// Arena size.
    pub arena_bytes: u64,
    /// Durability while filling.
    pub durability: String,
    /// Seals per second while filling (one client, create + write + seal).
    pub fill_seals_per_sec: f64,
    /// In-process recovery: open, scan the index, rebuild the store.
    pub recovery: RecoverySummary,
    /// A real daemon process: spawn to accepting clients, recovery included.
    pub restart_to_ready_ms: f64,
}

/// Why `bench recovery` failed.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// A file could not be used.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// What was tried.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The backing file (or its index) is there already.
    #[error("{} exists; give a new path", .0.display())]
    Exists(PathBuf),
    /// This program's own path (to start daemons with) is unknown.
    #[error("cannot find this program's own path to start daemons with: {0}")]
    OwnPath(#[source] std::io::Error),
    /// The daemon could not be started.
    #[error("cannot start the daemon: {0}")]
    Spawn(#[source] std::io::Error),
    /// The daemon did not accept clients in time.
    #[error("the daemon did not come up within {0:?}")]
    NotReady(Duration),
    /// The daemon could not be killed.
    #[error("cannot kill the daemon: {0}")]
    Kill(#[source] std::io::Error),
    /// The daemon failed a request.
    #[error(transparent)]
    Client(#[from] skyriver_client::ClientError),
    /// Opening or recovering the store in this process failed.
    #[error(transparent)]
    Persist(#[from] skyriver_transport::persist::PersistError),
    /// Fewer objects came back than were stored.
    #[error("{what} {got} of {stored} objects")]
    Lost {
        /// Where (`recovered`, `the restarted daemon has`).
        what: &'static str,
        /// How many came back.
        got: u64,
        /// How many were stored.
        stored: u64,
    },
    /// The results could not be written as JSON.
    #[error("cannot encode the results: {0}")]
    Json(#[from] serde_json::Error),
}

/// Fills a persistent daemon, kills it with SIGKILL, and times the recovery.
pub fn run(args: &RecoveryArgs) -> Result<(), RecoveryError> {
    let dir = std::env::temp_dir().join(format!("skyriver-bench-recovery-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| RecoveryError::File {
        action: "create",
        path: dir.clone(),
        source,
    })?;
    let backing = args.backing_file.clone().unwrap_or_else(|| {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            shm.join(format!("skyriver-bench-recovery-{}", std::process::id()))
        } else {
            dir.join("store")
        }
    });
    let index = skyriver_transport::persist::index_path_for(&backing);
    if backing.exists() || index.exists() {
        return Err(RecoveryError::Exists(backing));
    }
    let cleanup = || {
        let _ = std::fs::remove_file(&backing);
        let _ = std::fs::remove_file(&index);
        let _ = std::fs::remove_dir_all(&dir);
    };
    let result = measure(args, &dir, &backing);
    cleanup();
    let result = result?;
    println!(
        "{:>9} {:>9} {:>11} {:>12} {:>14} {:>16}",
        "objects", "size", "durability", "fill seal/s", "recovery ms", "restart->ready ms"
    );
    println!(
        "{:>9} {:>9} {:>11} {:>12.0} {:>14.1} {:>16.1}",
        result.recovery.recovered_objects,
        format_bytes(result.object_size_bytes),
        result.durability,
        result.fill_seals_per_sec,
        result.recovery.elapsed_ms,
        result.restart_to_ready_ms,
    );
    let json = serde_json::to_string_pretty(&result)?;
    std::fs::write(&args.json, json).map_err(|source| RecoveryError::File {
        action: "write",
        path: args.json.clone(),
        source,
    })?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// How long a daemon may take to recover and accept clients.
const READY_WITHIN: Duration = Duration::from_secs(300);

fn spawn_daemon(
    socket: &std::path::Path,
    backing: &std::path::Path,
    memory: u64,
    durability: Durability,
) -> Result<(std::process::Child, Duration), RecoveryError> {
    let exe = crate::self_exe().map_err(RecoveryError::OwnPath)?;
    let started = Instant::now();
    let child = Command::new(exe)
        .args(["daemon", "--log", "warn", "--no-prefault", "--memory"])
        .arg(memory.to_string())
        .arg("--backing-file")
        .arg(backing)
        .arg("--durability")
        .arg(durability.to_string())
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .spawn()
        .map_err(RecoveryError::Spawn)?;
    while Client::connect(socket).is_err() {
        if started.elapsed() > READY_WITHIN {
            return Err(RecoveryError::NotReady(READY_WITHIN));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok((child, started.elapsed()))
}

fn measure(
    args: &RecoveryArgs,
    dir: &std::path::Path,
    backing: &std::path::Path,
) -> Result<RecoveryResult, RecoveryError> {
    let size = args.object_size.0;
    let block = size.max(1).div_ceil(64) * 64;
    let memory = (block * args.objects * 2).max(64 << 20).div_ceil(4096) * 4096;
    let socket = dir.join("daemon.sock");
    eprintln!(
        "filling {} objects of {} ({} arena, --durability {})...",
        args.objects,
        format_bytes(size),
        format_bytes(memory),
        args.durability
    );
    let (mut child, _) = spawn_daemon(&socket, backing, memory, args.durability)?;
    let client = Client::connect(&socket)?;
    let data = vec![0x5au8; size as usize];
    let fill_started = Instant::now();
    for n in 0..args.objects {
        client.create_and_seal(ObjectId::from_u64(n + 1), &data, b"")?;
    }
    let fill_seals_per_sec = args.objects as f64 / fill_started.elapsed().as_secs_f64();
    if args.durability == Durability::Async {
        // Let the background commit catch up before the crash.
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(client);
    child.kill().map_err(RecoveryError::Kill)?; // SIGKILL
    let _ = child.wait();

    eprintln!("recovering in this process...");
    let config = PersistenceConfig::new(backing);
    let recovery = {
        let (mut persistence, arena) = Persistence::open(&config, memory)?;
        let mut store_config = StoreConfig::single_arena(arena.size_bytes());
        Persistence::configure_store(&mut store_config);
        let mut store = Store::new(store_config);
        persistence.recover(skyriver_core::Instant::ZERO, &mut store)?
    };
    if recovery.recovered_objects != args.objects {
        return Err(RecoveryError::Lost {
            what: "recovered",
            got: recovery.recovered_objects,
            stored: args.objects,
        });
    }
    eprintln!("restarting a daemon...");
    let (mut child, ready) = spawn_daemon(&socket, backing, memory, args.durability)?;
    let client = Client::connect(&socket)?;
    let stats = client.stats()?;
    drop(client);
    let _ = child.kill();
    let _ = child.wait();
    if stats.sealed_count != args.objects {
        return Err(RecoveryError::Lost {
            what: "the restarted daemon has",
            got: stats.sealed_count,
            stored: args.objects,
        });
    }
    Ok(RecoveryResult {
        objects: args.objects,
        object_size_bytes: size,
        arena_bytes: memory,
        durability: args.durability.to_string(),
        fill_seals_per_sec,
        recovery,
        restart_to_ready_ms: ready.as_secs_f64() * 1000.0,
    })
}
