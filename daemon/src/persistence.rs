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
//! * serving: [`Persistence::start_committer`] moves the files to a committer thread. The node
//!   emits each `DurableChange` as a `Persist` output numbered from 1; the event loop hands it
//!   to [`CommitQueue::submit`], and the thread stages, flushes and reports the highest number
//!   durable on a watch channel, which the loop feeds back to the node
//!   (`Node::handle_persisted`). The loop never waits for a disk: replies that must follow a
//!   flush wait in the node, every other client and peer goes on being served.
//!
//! Durability modes:
//! * `seal` (default): a seal's bytes and record are flushed before its reply is sent (the
//!   node holds the reply). A seal that returned survives any crash, power loss included.
//!   Seals that arrive while a flush runs are flushed together by the next one (group commit).
//! * `async`: seals are recorded by a background commit every `async_commit_interval_ms` (or
//!   sooner when `async_max_staged_seals` / `async_max_staged_bytes` pile up). A seal returns at
//!   memory speed; a crash may lose the seals of the last interval, never corrupt one.
//!
//! In both modes the space of a deleted or evicted recorded object is reused only once its
//! removal is durable (the store keeps the block aside until then, and a `create` that needs it
//! waits), so a recovered record never points at bytes that were reused; removals are
//! committed as soon as they arrive, and the delete's reply waits for that commit.
//!
//! A failed flush is fail-stop: the daemon cannot promise durability any more, so it logs the
//! error and aborts; a restart recovers the last consistent state. One failure is waited out
//! instead: the index must grow to record new objects and its file system is full. The index
//! grows before anything is written, so nothing changed; the committer tries the same commit
//! again with back-off, changes queue up behind it, and once they reach the node's bound of
//! unpersisted changes the node holds new requests until the disk has room again.

use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use skyriver_core::store::{RecoveredSpilled, SpillOpId, SpilledRecoveryReport};
use skyriver_core::{
    ContentDigest, DurableChange, Instant, RecoveredObject, RecoveryReport, Store, StoreConfig,
};
use skyriver_transport::persist::{BackingFile, PersistError, ScanReport};
use skyriver_transport::SharedArena;
use tokio::sync::watch;
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

/// What [`Persistence::recover_spilled`] did.
#[derive(Debug, Clone, Default)]
pub struct SpilledRecovery {
    /// Spilled objects back in the spill tier.
    pub objects: u64,
    /// Their data plus metadata bytes.
    pub bytes: u64,
    /// Spilled objects lost: their spill record missing or damaged, or refused by the store.
    pub lost: u64,
    /// The records adopted, by the op the store named each.
    pub adopted: Vec<(SpillOpId, RecoveredSpilled)>,
}

/// The daemon's handle on its backing files.
pub struct Persistence {
    backing: BackingFile,
    durability: Durability,
    async_interval: Duration,
    max_staged_seals: usize,
    max_staged_bytes: u64,
    scan: ScanReport,
    opened_at: std::time::Instant,
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
        Ok((
            Self {
                backing: opened.backing,
                durability: config.durability,
                async_interval: Duration::from_millis(config.async_commit_interval_ms.max(1)),
                max_staged_seals: config.async_max_staged_seals,
                max_staged_bytes: config.async_max_staged_bytes,
                scan: opened.scan,
                opened_at,
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
        self.recover_in_batches(usize::MAX, |batch| store.recover(now, batch))
    }

    /// [`Persistence::recover`] in batches of `batch_len` records: `apply` hands each batch
    /// to the store's `recover` and may drain the outputs in between (so a node publishes a
    /// few hundred recovered objects at a time rather than all at once).
    pub fn recover_in_batches(
        &mut self,
        batch_len: usize,
        mut apply: impl FnMut(Vec<RecoveredObject>) -> RecoveryReport,
    ) -> Result<RecoverySummary, PersistError> {
        let backing = &mut self.backing;
        let records: Vec<RecoveredObject> = backing.found_records().collect();
        let batch_len = batch_len.max(1);
        let (mut objects, mut bytes, mut refused) = (0, 0, Vec::new());
        for (batch, chunk) in records.chunks(batch_len).enumerate() {
            let report = apply(chunk.to_vec());
            objects += report.recovered_objects;
            bytes += report.recovered_bytes;
            for record in &report.refused {
                warn!(
                    id = %record.record.id,
                    block = %record.record.block,
                    reason = %record.reason,
                    "discarding an inconsistent index record"
                );
                refused.push(batch * batch_len + record.index);
            }
        }
        backing.finish_recovery(refused.iter().copied())?;
        let summary = RecoverySummary {
            created: self.scan.created,
            arena_bytes: self.scan.data_bytes,
            recovered_objects: objects,
            recovered_bytes: bytes,
            corrupt_records: self.scan.corrupt_slots,
            refused_records: refused.len() as u64,
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

    /// Spilled objects the index names: how many (a persistent store that spilled must be
    /// started with its spill directory).
    pub fn spilled_records(&self) -> u64 {
        self.backing.found_spilled().count() as u64
    }

    /// Hands the spilled objects the index names back to the store's spill tier, before
    /// [`Persistence::recover_in_batches`]: `check` reads each one's spill record header (its
    /// digest, or why it cannot be restored: the object is then lost, logged and counted), and
    /// `apply` hands the rest to the node (`NodeInput::RecoveredSpilled`). Records lost or
    /// refused are cleared from the index. Returns the ops the store named the adopted
    /// records by, for the spill IO.
    pub fn recover_spilled<E: std::fmt::Display>(
        &mut self,
        mut check: impl FnMut(&RecoveredSpilled) -> Result<ContentDigest, E>,
        apply: impl FnOnce(Vec<(RecoveredSpilled, Option<ContentDigest>)>) -> SpilledRecoveryReport,
    ) -> SpilledRecovery {
        let records: Vec<RecoveredSpilled> = self.backing.found_spilled().collect();
        let mut refused = Vec::new();
        let mut positions = Vec::new();
        let mut checked = Vec::new();
        for (position, record) in records.iter().enumerate() {
            match check(record) {
                Ok(digest) => {
                    positions.push(position);
                    checked.push((*record, Some(digest)));
                }
                Err(error) => {
                    warn!(id = %record.id, place = %record.place, %error, "a spilled object is lost");
                    refused.push(position);
                }
            }
        }
        let lost = refused.len() as u64;
        let report = apply(checked);
        for refusal in &report.refused {
            warn!(
                id = %refusal.record.id,
                reason = %refusal.reason,
                "a spilled object is lost: the spill tier does not take it back"
            );
            refused.push(positions[refusal.index]);
        }
        self.backing.refuse_spilled(refused.iter().copied());
        let recovery = SpilledRecovery {
            objects: report.recovered_objects,
            bytes: report.recovered_bytes,
            lost: lost + report.refused.len() as u64,
            adopted: report.adopted,
        };
        if recovery.lost > 0 {
            warn!(
                lost = recovery.lost,
                "{} spilled objects are lost (spill records missing or damaged)", recovery.lost
            );
        }
        info!(
            objects = recovery.objects,
            bytes = recovery.bytes,
            lost = recovery.lost,
            "spilled objects recovered: {} objects, {}",
            recovery.objects,
            crate::size::format_bytes(recovery.bytes),
        );
        recovery
    }

    /// Starts the committer thread, which owns the files from now on: changes go in with
    /// [`CommitQueue::submit`], and the returned watch channel tells the highest change number
    /// durable so far.
    ///
    /// The queue takes `queue_changes` changes: the node's `max_unpersisted_changes`, the most
    /// it hands out before the committer reports them durable, so [`CommitQueue::submit`]
    /// never finds it full (the core holds further changes, and the requests that would make
    /// them, until the disk catches up).
    pub fn start_committer(
        self,
        queue_changes: usize,
    ) -> Result<(CommitQueue, watch::Receiver<u64>), PersistError> {
        let (changes, queue) = sync_channel(queue_changes.max(1));
        let (durable_tx, durable_rx) = watch::channel(0);
        let path = self.backing.data_path().to_path_buf();
        let thread = std::thread::Builder::new()
            .name("skyriver-commit".into())
            .spawn(move || Committer::new(self, durable_tx).run(queue))
            .map_err(|source| PersistError::Io {
                op: "spawn",
                path,
                source,
            })?;
        Ok((
            CommitQueue {
                changes: Some(changes),
                thread: Some(thread),
            },
            durable_rx,
        ))
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

/// The event loop's end of the committer thread. Dropping it commits what is staged and
/// stops the thread.
pub struct CommitQueue {
    changes: Option<SyncSender<(u64, DurableChange)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CommitQueue {
    /// Hands change number `seq` to the committer, without ever waiting: the core keeps the
    /// changes it hands out within the queue's room (see [`Persistence::start_committer`]).
    ///
    /// # Panics
    /// When the queue is full: the core handed out more changes than it may, a bug that would
    /// otherwise stall the event loop on the disk.
    pub fn submit(&self, seq: u64, change: DurableChange) {
        if let Some(changes) = &self.changes {
            match changes.try_send((seq, change)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => panic!(
                    "durable change {seq} finds the committer's queue full: the node handed out \
                     more than max_unpersisted_changes changes"
                ),
                // The committer only stops by fail-stop, which aborts the process.
                Err(TrySendError::Disconnected(_)) => error!("the committer thread is gone"),
            }
        }
    }
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        self.changes.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The committer thread's state.
struct Committer {
    persistence: Persistence,
    durable: watch::Sender<u64>,
    /// Highest change number staged.
    staged_upto: u64,
}

impl Committer {
    fn new(persistence: Persistence, durable: watch::Sender<u64>) -> Self {
        Self {
            persistence,
            durable,
            staged_upto: 0,
        }
    }

    fn stage(&mut self, (seq, change): (u64, DurableChange)) {
        self.persistence.backing.stage(change);
        self.staged_upto = seq;
    }

    /// Whether what is staged must be committed without waiting for more.
    fn due(&self) -> bool {
        let backing = &self.persistence.backing;
        self.persistence.durability == Durability::Seal
            || backing.has_staged_removals()
            || backing.staged_seal_count() >= self.persistence.max_staged_seals
            || backing.staged_seal_bytes() >= self.persistence.max_staged_bytes
    }

    fn run(mut self, queue: Receiver<(u64, DurableChange)>) {
        // Each round: wait for a change, take every change already queued (a group commit),
        // in async mode wait up to the interval for more unless something is due, commit,
        // report.
        while let Ok(first) = queue.recv() {
            self.stage(first);
            let gather_until = std::time::Instant::now() + self.persistence.async_interval;
            loop {
                while let Ok(change) = queue.try_recv() {
                    self.stage(change);
                }
                if self.due() {
                    break;
                }
                let wait = gather_until.saturating_duration_since(std::time::Instant::now());
                match queue.recv_timeout(wait) {
                    Ok(change) => self.stage(change),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
            self.commit(None);
        }
        // The queue closed: the daemon is stopping. Commit the rest (it is staged already),
        // waiting a bounded time for space on a full file system.
        self.commit(Some(std::time::Instant::now() + STOPPING_SPACE_WAIT));
    }

    /// Commits what is staged. A full file system that keeps the index from growing is waited
    /// out (nothing was written, so the same commit is tried again; meanwhile the node holds
    /// new requests once its unpersisted changes reach their bound), until `give_up_at` if
    /// given; any other failure stops the daemon.
    fn commit(&mut self, give_up_at: Option<std::time::Instant>) {
        let mut wait = SPACE_RETRY_FIRST;
        let mut warned = false;
        loop {
            match self.persistence.backing.commit() {
                Ok(_) => break,
                Err(error)
                    if error.is_retryable()
                        && give_up_at.is_none_or(|at| std::time::Instant::now() < at) =>
                {
                    if !warned {
                        warn!(%error, "the store's index cannot grow: new objects wait for free space");
                        warned = true;
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(SPACE_RETRY_MAX);
                }
                Err(error) => fail_stop(&error),
            }
        }
        if warned {
            info!("the store's index has grown: objects are recorded again");
        }
        self.durable.send_replace(self.staged_upto);
    }
}

/// First pause before a commit refused for lack of space is tried again; it doubles up to
/// [`SPACE_RETRY_MAX`].
const SPACE_RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between tries of a commit refused for lack of space.
const SPACE_RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a stopping daemon waits for space to record what is staged before it gives up.
const STOPPING_SPACE_WAIT: Duration = Duration::from_secs(5);

fn fail_stop(error: &PersistError) -> ! {
    error!(%error, "cannot make the store durable; stopping (a restart recovers the last durable state)");
    eprintln!("skyriver: cannot make the store durable: {error}; aborting");
    std::process::abort()
}
