//! Persistent mode in the daemon (`--backing-file PATH`, `--durability seal|async`).
//!
//! The arena is a file and the index of sealed objects lives beside it
//! (see [`skyriver_transport::persist`] for the layout and why it is crash-consistent). This
//! module is the glue between the sans-IO store and those files:
//!
//! * start-up: [`Persistence::open`] opens (or creates) the files and hands back the arena to
//!   serve; [`Persistence::recover`] feeds the records found to `Store::recover` and reports
//!   objects, bytes and milliseconds. Recovered objects come out of the store as ordinary
//!   `Local(Sealed)` events, so the node layer publishes them to the directory like any seal.
//! * every input: [`Persistence::commit`] drains the store's `DurableChange`s and makes them
//!   durable before the driver writes any reply or carries out any other output.
//!
//! Durability modes:
//! * `seal` (default): a seal's bytes and record are flushed before its reply is sent. A seal
//!   that returned survives any crash, power loss included.
//! * `async`: seals are recorded by a background commit every `async_commit_interval_ms` (or
//!   sooner when `async_max_staged_seals` / `async_max_staged_bytes` pile up). A seal returns at
//!   memory speed; a crash may lose the seals of the last interval, never corrupt one.
//!
//! In both modes a delete or eviction of a recorded object is durable before the reply to the
//! request that freed its space, so a deleted object never comes back, and never over bytes
//! that were reused.
//!
//! A failed flush is fail-stop: the daemon cannot promise durability any more, so it logs the
//! error and aborts; a restart recovers the last consistent state.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use skyriver_core::{Instant, Store, StoreConfig};
use skyriver_transport::persist::{BackingFile, PersistError, ScanReport};
use skyriver_transport::SharedArena;
use tracing::{error, info, warn};

/// When a seal becomes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Durability {
    /// Before the seal's reply is sent.
    #[default]
    Seal,
    /// Within the async commit interval after the seal; seals return at memory speed.
    Async,
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Seal => "seal",
            Durability::Async => "async",
        })
    }
}

/// How to run a persistent store.
#[derive(Debug, Clone)]
pub struct PersistenceConfig {
    /// The data file (the arena); its index is `PATH.index`.
    pub backing_file: PathBuf,
    /// When seals become durable.
    pub durability: Durability,
    /// Async mode: longest time a seal stays staged.
    pub async_commit_interval_ms: u64,
    /// Async mode: commit at once when this many seals are staged.
    pub async_max_staged_seals: usize,
    /// Async mode: commit at once when this many object bytes are staged.
    pub async_max_staged_bytes: u64,
}

impl PersistenceConfig {
    /// Defaults for a backing file: `seal` durability.
    pub fn new(backing_file: impl Into<PathBuf>) -> Self {
        Self {
            backing_file: backing_file.into(),
            durability: Durability::Seal,
            async_commit_interval_ms: 10,
            async_max_staged_seals: 4096,
            async_max_staged_bytes: 256 << 20,
        }
    }
}

/// What start-up found and restored.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RecoverySummary {
    /// The files were created, not reopened.
    pub created: bool,
    /// Size of the arena.
    pub arena_bytes: u64,
    /// Objects back in the store.
    pub recovered_objects: u64,
    /// Their data plus metadata bytes.
    pub recovered_bytes: u64,
    /// Index slots that were torn or corrupt: discarded.
    pub corrupt_records: u64,
    /// Records the store refused as inconsistent: discarded.
    pub refused_records: u64,
    /// From opening the files to the store being ready, in milliseconds.
    pub elapsed_ms: f64,
}

/// The daemon's handle on its backing files.
pub struct Persistence {
    shared: Arc<Shared>,
    durability: Durability,
    max_staged_seals: usize,
    max_staged_bytes: u64,
    scan: ScanReport,
    opened_at: std::time::Instant,
    committer: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    backing: Mutex<BackingFile>,
    stop: AtomicBool,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, BackingFile> {
        // A panic under this lock aborted the daemon already (see `fail_stop`).
        self.backing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Persistence {
    /// Opens the backing files (creating them with a `memory_bytes` arena if neither exists)
    /// and returns the arena to serve. An existing store keeps its size; a different
    /// `memory_bytes` is reported and ignored. In async mode the background commit starts here.
    pub fn open(
        config: &PersistenceConfig,
        memory_bytes: u64,
    ) -> Result<(Self, SharedArena), PersistError> {
        let opened_at = std::time::Instant::now();
        let opened = BackingFile::open(&config.backing_file, memory_bytes)?;
        if !opened.scan.created && opened.scan.data_bytes != memory_bytes / 4096 * 4096 {
            info!(
                backing_file = %config.backing_file.display(),
                size = %crate::size::format_bytes(opened.scan.data_bytes),
                "the backing file keeps the size it was created with (--memory applies when \
                 creating it)"
            );
        }
        let shared = Arc::new(Shared {
            backing: Mutex::new(opened.backing),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
        });
        let committer = match config.durability {
            Durability::Seal => None,
            Durability::Async => {
                let shared = shared.clone();
                let interval = Duration::from_millis(config.async_commit_interval_ms.max(1));
                Some(
                    std::thread::Builder::new()
                        .name("skyriver-commit".into())
                        .spawn(move || run_committer(&shared, interval))
                        .map_err(|source| PersistError::Io {
                            op: "spawn",
                            path: config.backing_file.clone(),
                            source,
                        })?,
                )
            }
        };
        Ok((
            Self {
                shared,
                durability: config.durability,
                max_staged_seals: config.async_max_staged_seals,
                max_staged_bytes: config.async_max_staged_bytes,
                scan: opened.scan,
                opened_at,
                committer,
            },
            opened.arena,
        ))
    }

    /// Makes `config` emit the durable changes this module records.
    pub fn configure_store(config: &mut StoreConfig) {
        config.record_durable_changes = true;
    }

    /// When seals become durable.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Restores every recorded object into `store` (configured with
    /// [`Persistence::configure_store`], and empty) and logs what was recovered. Call once,
    /// before serving; then drain the store's outputs so the node publishes the objects.
    pub fn recover(
        &mut self,
        now: Instant,
        store: &mut Store,
    ) -> Result<RecoverySummary, PersistError> {
        assert!(
            store.config().record_durable_changes,
            "the store must record durable changes (Persistence::configure_store)"
        );
        let mut backing = self.shared.lock();
        let report = store.recover(now, backing.found_records());
        for refused in &report.refused {
            warn!(
                id = %refused.record.id,
                block = %refused.record.block,
                reason = %refused.reason,
                "discarding an inconsistent index record"
            );
        }
        backing.finish_recovery(report.refused.iter().map(|r| r.index))?;
        let summary = RecoverySummary {
            created: self.scan.created,
            arena_bytes: self.scan.data_bytes,
            recovered_objects: report.recovered_objects,
            recovered_bytes: report.recovered_bytes,
            corrupt_records: self.scan.corrupt_slots,
            refused_records: report.refused.len() as u64,
            elapsed_ms: self.opened_at.elapsed().as_secs_f64() * 1000.0,
        };
        if self.scan.corrupt_slots > 0 {
            warn!(
                corrupt = self.scan.corrupt_slots,
                "discarded torn or corrupt index records (checksum mismatch)"
            );
        }
        info!(
            backing_file = %backing.data_path().display(),
            created = summary.created,
            objects = summary.recovered_objects,
            bytes = summary.recovered_bytes,
            recovery_ms = format!("{:.1}", summary.elapsed_ms),
            durability = %self.durability,
            "persistent store recovered: {} objects, {} in {:.1} ms",
            summary.recovered_objects,
            crate::size::format_bytes(summary.recovered_bytes),
            summary.elapsed_ms,
        );
        Ok(summary)
    }

    /// Drains the store's durable changes and makes them durable as the mode requires. Call
    /// after every input to the store, before writing any reply or carrying out any output.
    pub fn commit(&self, store: &mut Store) -> Result<(), PersistError> {
        let mut backing = self.shared.lock();
        let mut changed = false;
        while let Some(change) = store.poll_durable_change() {
            backing.stage(change);
            changed = true;
        }
        if !changed {
            return Ok(());
        }
        match self.durability {
            Durability::Seal => {
                backing.commit()?;
            }
            Durability::Async => {
                if backing.staged_seal_count() >= self.max_staged_seals
                    || backing.staged_seal_bytes() >= self.max_staged_bytes
                {
                    backing.commit()?;
                } else if backing.has_staged_removals() {
                    // Removal before reuse: the freed space is handed out after this returns.
                    backing.commit_removals()?;
                }
                if backing.staged_seal_count() > 0 {
                    self.shared.wake.notify_one();
                }
            }
        }
        Ok(())
    }

    /// [`Persistence::commit`], stopping the process if the files cannot be written: a reply
    /// must never promise durability that was not achieved.
    pub fn commit_or_abort(&self, store: &mut Store) {
        if let Err(error) = self.commit(store) {
            fail_stop(&error);
        }
    }

    /// Writes everything staged now (clean shutdown, tests).
    pub fn flush(&self) -> Result<(), PersistError> {
        self.shared.lock().commit().map(|_| ())
    }
}

impl Drop for Persistence {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
        if let Err(error) = self.flush() {
            error!(%error, "final commit of the backing file failed");
        }
    }
}

impl std::fmt::Debug for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistence")
            .field("durability", &self.durability)
            .field("scan", &self.scan)
            .finish_non_exhaustive()
    }
}

/// Async mode: commits staged seals at most `interval` after they were staged.
fn run_committer(shared: &Shared, interval: Duration) {
    let mut backing = shared.lock();
    while !shared.stop.load(Ordering::SeqCst) {
        if backing.staged_seal_count() == 0 {
            // Sleep until something is staged (or shutdown).
            backing = shared
                .wake
                .wait(backing)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            continue;
        }
        // Let a batch gather, then commit it.
        drop(backing);
        std::thread::sleep(interval);
        backing = shared.lock();
        if let Err(error) = backing.commit() {
            fail_stop(&error);
        }
    }
}

fn fail_stop(error: &PersistError) -> ! {
    error!(%error, "cannot make the store durable; stopping (a restart recovers the last durable state)");
    eprintln!("skyriver: cannot make the store durable: {error}; aborting");
    std::process::abort()
}
