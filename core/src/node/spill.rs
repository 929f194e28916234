//! The spill tier at the node: the store decides what to spill and restore (see
//! [`crate::store::spill`]); the node hands those decisions to the driver as
//! [`NodeOutput::Spill`], [`NodeOutput::Restore`] and [`NodeOutput::DiscardSpilled`], takes the
//! completions back as [`NodeInput::SpillDone`](super::NodeInput::SpillDone) and
//! [`NodeInput::RestoreDone`](super::NodeInput::RestoreDone), and serves a peer's fetch of a
//! spilled object by restoring it here first: the requester sees a slower answer, nothing
//! else. (Streaming from the file would save the memory, but the rendezvous path lends the
//! peer a region of memory to READ, and the eager path gathers from memory; a restore keeps one
//! path for both, and the copy is then in memory for the next reader.)
//!
//! A restore is a disk read, maybe queued behind others, and can outlast the requester's reply
//! timeout. So the holder answers a parked fetch at once with `Restoring` and repeats it every
//! half reply timeout while the restore lasts; each notice moves the requester's reply deadline
//! on, up to a bound of its own (`NodeConfig::restore_wait_limit`, see `transfer`).

use std::collections::BTreeMap;

use super::{Node, NodeOutput, Timer};
use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId, TransferId};
use crate::store::{
    RecoveredSpilled, RestoreError, SpillError, SpillOpId, SpillPlace, SpilledRecoveryReport,
    StoreOutput,
};
use crate::time::Instant;
use crate::wire::PeerMessage;

/// Most peer fetches waiting for restores at once; more are refused `Busy`-like (`NotFound`
/// would make the requester give up on this holder; it retries after a while either way).
pub const MAX_FETCHES_AWAITING_RESTORE: usize = 1024;

/// A peer's fetch request waiting for its object to be restored.
#[derive(Debug, Clone, Copy)]
struct AwaitingRestore {
    peer: NodeId,
    req: TransferId,
    eager_limit: u64,
    max_chunk_bytes: u32,
}

/// Peer fetches waiting for restores.
#[derive(Debug, Default)]
pub(super) struct SpillWaits {
    fetches: BTreeMap<ObjectId, Vec<AwaitingRestore>>,
    count: usize,
}

impl Node {
    /// The driver finished spill write `op` (see [`crate::store::Store::handle_spill_done`]);
    /// creates waiting for memory try again.
    pub(super) fn handle_spill_done(
        &mut self,
        now: Instant,
        op: SpillOpId,
        result: Result<SpillPlace, SpillError>,
    ) {
        self.advance(now);
        self.store.handle_spill_done(op, result);
        self.memory_may_be_free();
    }

    /// The driver finished the restore of record `op` (see
    /// [`crate::store::Store::handle_restore_done`]).
    pub(super) fn handle_restore_done(
        &mut self,
        now: Instant,
        op: SpillOpId,
        result: Result<(), RestoreError>,
    ) {
        self.advance(now);
        self.store.handle_restore_done(op, result);
        self.memory_may_be_free();
    }

    /// Spilled objects a persistent store found on restart go back into the spill tier (see
    /// [`crate::store::Store::recover_spilled`]) and are published like recovered objects.
    pub(super) fn handle_recovered_spilled(
        &mut self,
        now: Instant,
        objects: Vec<(RecoveredSpilled, Option<ContentDigest>)>,
    ) -> SpilledRecoveryReport {
        self.advance(now);
        let report = self.store.recover_spilled(now, objects);
        if !self.config.standalone {
            // As for recovered objects: served once the directory accepts them again.
            for (_, record) in &report.adopted {
                self.unvouched.insert(record.id);
            }
        }
        self.absorb_store();
        report
    }

    /// Spilled objects the driver found lost at restart are counted (see
    /// [`crate::store::Store::count_spilled_lost_at_start`]).
    pub(super) fn handle_spilled_lost_at_start(&mut self, now: Instant, objects: u64) {
        self.advance(now);
        self.store.count_spilled_lost_at_start(objects);
    }

    fn memory_may_be_free(&mut self) {
        self.absorb_store();
        self.retry_parked_creates();
        self.pump_admission();
        self.absorb_store();
    }

    /// A peer asked for `id`, which is spilled here: restore it, and serve the request then.
    /// False when it is not spilled (or too many wait), for the caller to refuse.
    pub(super) fn park_fetch_for_restore(
        &mut self,
        peer: NodeId,
        req: TransferId,
        id: ObjectId,
        eager_limit: u64,
        max_chunk_bytes: u32,
    ) -> bool {
        if !self.store.is_spilled(&id) || self.spill_waits.count >= MAX_FETCHES_AWAITING_RESTORE {
            return false;
        }
        let waiting = self.spill_waits.fetches.entry(id).or_default();
        let first = waiting.is_empty();
        waiting.push(AwaitingRestore {
            peer,
            req,
            eager_limit,
            max_chunk_bytes,
        });
        self.spill_waits.count += 1;
        // Before the restore is asked for: the answer, whenever it comes, follows the notice.
        self.send(peer, PeerMessage::Restoring { req });
        if first {
            self.set_timer(self.restoring_notice_due(), Timer::RestoringNotice(id));
        }
        self.store.request_restore(id);
        true
    }

    /// When the peers waiting for a restore begun now hear again that it still comes: at half
    /// the reply timeout, so a notice reaches a requester (of the same configuration) before
    /// its deadline.
    fn restoring_notice_due(&self) -> Instant {
        self.now + (self.config.reply_timeout / 2).max(std::time::Duration::from_millis(1))
    }

    /// The restore of `id` still runs: every peer whose fetch waits for it hears so again.
    pub(super) fn notify_restoring(&mut self, id: ObjectId) {
        let Some(waiting) = self.spill_waits.fetches.get(&id) else {
            return;
        };
        let notices: Vec<(NodeId, TransferId)> = waiting.iter().map(|w| (w.peer, w.req)).collect();
        for (peer, req) in notices {
            self.send(peer, PeerMessage::Restoring { req });
        }
        self.set_timer(self.restoring_notice_due(), Timer::RestoringNotice(id));
    }

    /// Takes the store's spill outputs: hands the IO to the driver and serves what waited for a
    /// restore. Gives back any other output.
    pub(super) fn absorb_spill_output(&mut self, output: StoreOutput) -> Option<StoreOutput> {
        match output {
            StoreOutput::Spill {
                op,
                id,
                region,
                digest,
            } => self.push(NodeOutput::Spill {
                op,
                object: id,
                region,
                digest,
            }),
            StoreOutput::Restore {
                op,
                id,
                region,
                digest,
            } => self.push(NodeOutput::Restore {
                op,
                object: id,
                region,
                digest,
            }),
            StoreOutput::DiscardSpilled { op, id } => {
                self.push(NodeOutput::DiscardSpilled { op, object: id })
            }
            StoreOutput::Restored { id } => {
                for waiting in self.take_awaiting_restore(id) {
                    self.serve_fetch_request(
                        waiting.peer,
                        waiting.req,
                        id,
                        waiting.eager_limit,
                        waiting.max_chunk_bytes,
                    );
                }
            }
            StoreOutput::RestoreFailed { id } => {
                self.copy_of_record_lost(id);
                for waiting in self.take_awaiting_restore(id) {
                    self.refuse(waiting.peer, PeerMessage::NotFound { req: waiting.req });
                }
            }
            other => return Some(other),
        }
        None
    }

    fn take_awaiting_restore(&mut self, id: ObjectId) -> Vec<AwaitingRestore> {
        let waiting = self.spill_waits.fetches.remove(&id).unwrap_or_default();
        self.spill_waits.count -= waiting.len();
        self.cancel_timer(Timer::RestoringNotice(id));
        waiting
    }

    pub(super) fn pending_spill_work(&self, lines: &mut Vec<String>) {
        for (id, waiting) in &self.spill_waits.fetches {
            lines.push(format!(
                "{} peer fetches of {id} wait for its restore",
                waiting.len()
            ));
        }
    }
}
