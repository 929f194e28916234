//! Both ends of one transfer.
//!
//! Requester R, for one object it created locally (unsealed, owned by [`FETCH_CLIENT`]):
//!
//! ```text
//! AwaitingReply ──EagerData──► ReceivingEager ──last chunk written──► Sealing ──► Verifying
//!       │──Rendezvous──► Reading (sliced READs, bounded window, lanes round-robin)
//!       │                   │─ READs progress, half the lease gone ──ExtendLease──► Reading
//!       │                   │     └─ LeaseExtended ──► read on, within the new lease
//!       │                   └─ all READs done ──► Finish, Verifying
//!       │     Verifying ──bytes hash to the id's digest──► sealed
//!       │               └─ another digest ──► aborted, next source
//!       │                   └─ READ error / lost connection / lease about to end
//!       │                          ──► Draining (wait for posted READs) ──► Finish, aborted
//!       │──Restoring──► AwaitingReply (reply deadline moved on, up to a bound from the request)
//!       └─ NotFound / Busy / Error / timeout / lost connection ──► aborted, next source
//! ```
//!
//! A posted READ writes into the local object until its completion, so the object is aborted
//! only once none is outstanding. READs must all complete before the holder's lease ends: R
//! counts the lease from the moment it sent the request (earlier than the holder's start), less
//! a margin, and gives up on the transfer if the READs are not done by then. So every byte R
//! seals was read while the holder had the object pinned.
//!
//! An object too large to READ within one lease is not lost to that: once half the read
//! window is gone, a requester whose READs progressed since the window began asks the holder to
//! extend the lease (`ExtendLease`, at most `NodeConfig::max_lease_extensions` times per
//! transfer). The holder, if it still holds the lease, pins the object for another lease from
//! when it got the request and says so (`LeaseExtended`); the requester then reads on until
//! three quarters of that lease from when it asked. A holder whose lease is gone, or which
//! extended it its own bound of times, says nothing, and the transfer ends as it would have
//! (`ReadsTooSlow`) when the window it has closes.
//!
//! A holder that must first restore the object from its disk says `Restoring` at once and
//! again every half reply timeout (see `spill`): each notice moves the reply deadline on, to a
//! reply timeout from then, but never past `NodeConfig::restore_wait_limit` from the request,
//! after which the holder is given up on (`RestoreTooSlow`). The lease is then counted from the
//! last notice: the holder pins the object only once the restore is done, after it sent the
//! notice (the notice's way over the network falls in the lease's quarter margin).
//!
//! Every copy is verified before its seal: the driver hashes the bytes that landed
//! ([`NodeOutput::VerifyContent`]) and the copy is sealed only when they hash to the digest the
//! directory named for the id (which the holder's reply must name too). A transfer damaged on
//! the way, or a holder with another content under the id, fails that source, never yields
//! other bytes.
//!
//! Holder H: a small object goes out as `EagerData` chunks gathered by the driver at once. A
//! large one is pinned under a lease:
//!
//! ```text
//! FetchRequest ──pin, GrantRead──► Granting ──granted──► Rendezvous, Granted
//!                                     │                     └─ Finish / lease end ──RevokeRead──► Revoking
//!                                     ├─ refused ──► Error, unpinned                                 └─ revoked ──► unpinned
//!                                     └─ Finish / lease end ──► (granted ──RevokeRead──► Revoking)
//! ```
//!
//! The fabric scopes the READ keys to the lease where it can, and the object stays pinned until
//! the fabric confirms the keys are dead: no READ through them reaches memory reused since.

use std::collections::BTreeMap;

use super::{
    GrantError, Node, NodeOutput, ReadError, ReadGrant, ReadOpId, Timer, TransferFailure,
    TransferMode, TransferPath, FETCH_CLIENT,
};
use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId, TransferId};
use crate::region::{LocalRegion, RemoteRegion};
use crate::store::ObjectInfo;
use crate::time::Instant;
use crate::wire::{self, EagerHeader, InputBytes, ObjectSizes, PeerMessage};

/// Most chunks a holder sends for one eager object, whatever the requester allows.
pub(super) const MAX_EAGER_CHUNKS_SENT: u64 = 64;

#[derive(Debug)]
enum IncomingState {
    AwaitingReply,
    ReceivingEager {
        received: u64,
    },
    /// Every byte is written out; verified on the next step, after the driver carried out the
    /// writes.
    Sealing,
    /// Every byte is in; the driver is hashing them (`VerifyContent`).
    Verifying {
        path: TransferPath,
    },
    Reading {
        regions: Vec<RemoteRegion>,
        /// The lease's per-lane keys (see `PeerMessage::Rendezvous`); empty: each region's.
        lane_keys: Vec<u32>,
        next_offset: u64,
        done_bytes: u64,
        /// Completed READs past `in_prefix`, by offset (lanes complete out of order).
        done_after_prefix: BTreeMap<u64, u64>,
        /// Every byte before this offset is in: offered to the driver to hash ahead.
        in_prefix: u64,
        outstanding: u32,
        lane_cursor: u16,
    },
    /// Failed with READs outstanding; aborted (after a `Finish`) once they complete.
    Draining {
        outstanding: u32,
        reason: TransferFailure,
    },
}

/// A transfer into this node.
#[derive(Debug)]
pub(super) struct Incoming {
    pub(super) id: ObjectId,
    pub(super) source: NodeId,
    local: ObjectInfo,
    sizes: ObjectSizes,
    /// The digest the id names: the copy is sealed only if its bytes hash to it.
    digest: ContentDigest,
    pub(super) block_len: u64,
    requested_at: Instant,
    /// When the current source's lease can have started at the earliest (the request to it
    /// left): READs must be done within its lease from here.
    lease_from: Instant,
    /// Pulling from a relay's partial copy: READ only below this prefix, the relay's last
    /// `RelayProgress` (see `relay`). `None`: the source holds all of it.
    relay_limit: Option<u64>,
    /// Pulling from a relay: it answered with its prefix (a partial copy). A relay whose copy
    /// is sealed by the time it is asked answers with a plain `Rendezvous`: all of it is in.
    relay_answered: bool,
    /// The current source said it is restoring the object from disk (`Restoring`): when this
    /// transfer's request to it left, from which the wait for the restore is bounded.
    restoring_from: Option<Instant>,
    /// Pulling from a relay: since when every announced byte is read and no READ is in flight
    /// (waiting for the relay's next `RelayProgress`).
    stalled_since: Option<Instant>,
    /// Reading: the lease the source last named (`Rendezvous` or `LeaseExtended`), in ms.
    lease_ms: u32,
    /// Reading: READs must be done by then (three quarters of the lease from `lease_from`).
    read_until: Instant,
    /// Lease extensions the source granted to this transfer.
    lease_extensions: u32,
    /// An `ExtendLease` is out, sent then: the extended lease counts from there.
    extension_asked_at: Option<Instant>,
    /// Bytes read when the current read window began (or the last extension was asked): the
    /// READs progress when more are in by the time an extension would be asked.
    progress_mark: u64,
    /// Waiting in its source's READ turns (see [`Node::pump_reads`]).
    in_read_turns: bool,
    state: IncomingState,
}

impl Incoming {
    /// The block, sizes and digest of this copy, if it can be relayed: not failing, and
    /// received by READs (or about to be).
    pub(super) fn relayable_copy(&self) -> Option<super::relay::RelayableCopy> {
        let relayable = match self.state {
            IncomingState::AwaitingReply | IncomingState::Reading { .. } => true,
            IncomingState::Verifying { path } => path == TransferPath::Rendezvous,
            _ => false,
        };
        // An empty object has nothing to relay (and a lease names no empty region).
        (relayable && self.local.region.len > 0).then_some((
            self.local.region,
            self.sizes,
            self.digest,
        ))
    }

    /// Bytes in from the start of the object (a relay serves up to there).
    pub(super) fn received_prefix(&self) -> u64 {
        match self.state {
            IncomingState::Reading {
                in_prefix,
                done_bytes,
                ..
            } if done_bytes < self.local.region.len => in_prefix,
            IncomingState::Reading { .. } | IncomingState::Verifying { .. } => {
                self.local.region.len
            }
            _ => 0,
        }
    }

    /// The sizes and digest the copy must have.
    pub(super) fn content(&self) -> (ObjectSizes, ContentDigest) {
        (self.sizes, self.digest)
    }

    pub(super) fn is_relayed(&self) -> bool {
        self.relay_limit.is_some()
    }

    /// Where READs may go: the whole object, or a relay's announced prefix of it.
    fn read_limit(&self) -> u64 {
        let total = self.local.region.len;
        self.relay_limit.map_or(total, |prefix| prefix.min(total))
    }

    /// Whether the transfer has a READ to post under a window of `window` READs in flight.
    fn wants_read(&self, window: u32) -> bool {
        match self.state {
            IncomingState::Reading {
                outstanding,
                next_offset,
                ..
            } => outstanding < window && next_offset < self.read_limit(),
            _ => false,
        }
    }

    /// The next READ to post (at most `slice_bytes`, on the next of `lanes`), counted as
    /// outstanding; `None` when [`Incoming::wants_read`] says none.
    fn next_read(
        &mut self,
        window: u32,
        slice_bytes: u64,
        lanes: u16,
    ) -> Option<(u16, LocalRegion, RemoteRegion)> {
        if !self.wants_read(window) {
            return None;
        }
        let limit = self.read_limit();
        let local_region = self.local.region;
        let IncomingState::Reading {
            regions,
            lane_keys,
            next_offset,
            outstanding,
            lane_cursor,
            ..
        } = &mut self.state
        else {
            return None;
        };
        // Find the remote region holding `next_offset`.
        let mut region_start = 0;
        let mut found = None;
        for (index, region) in regions.iter().enumerate() {
            if *next_offset < region_start + region.len {
                found = Some((index, *region, *next_offset - region_start));
                break;
            }
            region_start += region.len;
        }
        // Decoding checked that the regions cover the object exactly.
        let (index, region, within) = found.expect("remote regions cover the object");
        let len = slice_bytes
            .min(region.len - within)
            .min(limit - *next_offset);
        let lane = *lane_cursor % lanes;
        // Decoding checked that the keys come in whole sets per region.
        let per_region = lane_keys.len() / regions.len();
        let rkey = match per_region {
            0 => region.rkey,
            k => lane_keys[index * k + lane as usize % k],
        };
        let remote = RemoteRegion {
            addr: region.addr + within,
            len,
            rkey,
        };
        let local = local_region.slice(*next_offset, len);
        *lane_cursor = lane_cursor.wrapping_add(1);
        *next_offset += len;
        *outstanding += 1;
        Some((lane, local, remote))
    }

    /// The transfer's source sent it to `relay`, asked `now`, which has nothing yet.
    pub(super) fn pull_from_relay(&mut self, relay: NodeId, now: Instant) {
        self.source = relay;
        self.lease_from = now;
        self.relay_limit = Some(0);
        self.relay_answered = false;
        self.restoring_from = None;
    }

    /// The source's `Rendezvous` came: a relay that said no prefix before it serves a sealed
    /// copy, all of which may be READ (its fabric refuses READs of bytes it has not, and the
    /// digest is checked at the end either way).
    fn rendezvous_came(&mut self) {
        if self.relay_limit.is_some() && !self.relay_answered {
            self.relay_limit = Some(self.local.region.len);
        }
    }

    /// The relay holds the first `prefix` bytes. `answer`: the relay's first word, before its
    /// `Rendezvous` (a source that was not known to be a relay becomes one here).
    pub(super) fn relay_prefix_is(
        &mut self,
        prefix: u64,
        answer: bool,
    ) -> Result<(), TransferFailure> {
        let total = self.local.region.len;
        if prefix > total {
            return Err(TransferFailure::RelayPrefixBeyondObject { prefix, total });
        }
        self.relay_answered |= answer;
        match self.relay_limit {
            Some(limit) => self.relay_limit = Some(limit.max(prefix)),
            None if answer => self.relay_limit = Some(prefix),
            None => return Err(TransferFailure::RelayProgressUnasked),
        }
        Ok(())
    }

    /// Its source said `Restoring` (last at `noticed`) to the request that left at `asked`:
    /// the lease counts from the notice, the wait for the restore from the request.
    pub(super) fn restoring_noticed(&mut self, asked: Instant, noticed: Instant) {
        self.restoring_from = Some(asked);
        self.lease_from = noticed;
    }

    /// The path the bytes took, as far as the transfer got.
    fn path(&self) -> TransferPath {
        match self.state {
            IncomingState::AwaitingReply => TransferPath::Unanswered,
            IncomingState::ReceivingEager { .. } | IncomingState::Sealing => TransferPath::Eager,
            IncomingState::Reading { .. } | IncomingState::Draining { .. } => {
                TransferPath::Rendezvous
            }
            IncomingState::Verifying { path } => path,
        }
    }

    pub(super) fn outstanding_reads(&self) -> u32 {
        match self.state {
            IncomingState::Reading { outstanding, .. }
            | IncomingState::Draining { outstanding, .. } => outstanding,
            _ => 0,
        }
    }

    pub(super) fn describe(&self) -> String {
        match &self.state {
            IncomingState::AwaitingReply => "awaiting the holder's reply".into(),
            IncomingState::ReceivingEager { received } => {
                format!(
                    "received {received} of {} eager bytes",
                    self.local.region.len
                )
            }
            IncomingState::Sealing => "sealing".into(),
            IncomingState::Verifying { .. } => "verifying the bytes against the digest".into(),
            IncomingState::Reading {
                done_bytes,
                outstanding,
                ..
            } => format!(
                "read {done_bytes} of {} bytes, {outstanding} READs outstanding",
                self.local.region.len
            ),
            IncomingState::Draining {
                outstanding,
                reason,
            } => {
                format!("failed ({reason}); waiting for {outstanding} READs to complete")
            }
        }
    }
}

/// An object pinned for a requester.
#[derive(Debug)]
pub(super) struct Lease {
    pub(super) id: ObjectId,
    pub(super) region: LocalRegion,
    pub(super) expires: Instant,
    pub(super) state: LeaseState,
    /// Over a copy this node is still receiving (see `relay`): not pinned in the store; the
    /// copy is kept until the lease is revoked.
    pub(super) over_partial_copy: bool,
    /// Granted over a partial copy, this node relaying it (stays set once the copy is sealed).
    pub(super) relaying: bool,
    /// Times the reader had the lease extended (`ExtendLease`).
    pub(super) extensions: u32,
}

/// Where a holder's lease stands: the object is pinned in every state.
#[derive(Debug)]
pub(super) enum LeaseState {
    /// `GrantRead` went out; the `Rendezvous` waits for the fabric's keys. `ended`: `Finish`
    /// or the lease's end came first, so the grant is revoked as soon as it is answered.
    Granting {
        sizes: ObjectSizes,
        digest: ContentDigest,
        ended: bool,
    },
    /// The reader has the keys.
    Granted,
    /// `RevokeRead` went out; unpinned when the fabric confirms no READ can reach the object.
    Revoking,
}

impl Node {
    /// Starts fetching `id` from `source` into the freshly created `local` object.
    pub(super) fn start_transfer(
        &mut self,
        id: ObjectId,
        source: NodeId,
        content: (ObjectSizes, ContentDigest),
        local: ObjectInfo,
        mode: TransferMode,
    ) -> TransferId {
        let tid = self.new_transfer_id();
        self.track_incoming(tid, id, source, content, local, self.now);
        self.send_fetch_request(tid, id, source, mode);
        tid
    }

    /// Counts transfer `tid` of `id` from `source` into `local` as in flight, its request sent
    /// at `requested_at` (now, or earlier for a hinted request answered now).
    pub(super) fn track_incoming(
        &mut self,
        tid: TransferId,
        id: ObjectId,
        source: NodeId,
        (sizes, digest): (ObjectSizes, ContentDigest),
        local: ObjectInfo,
        requested_at: Instant,
    ) {
        let block_len =
            crate::alloc::block_len_for(local.region.len).expect("created objects have a block");
        if let Some(peer) = self.peers.get_mut(&source) {
            peer.active += 1;
        }
        self.bytes_in_flight += block_len;
        self.stats.transfers_started += 1;
        self.transfers.insert(
            tid,
            Incoming {
                id,
                source,
                local,
                sizes,
                digest,
                block_len,
                requested_at,
                lease_from: requested_at,
                relay_limit: None,
                relay_answered: false,
                restoring_from: None,
                stalled_since: None,
                lease_ms: 0,
                read_until: requested_at,
                lease_extensions: 0,
                extension_asked_at: None,
                progress_mark: 0,
                in_read_turns: false,
                state: IncomingState::AwaitingReply,
            },
        );
    }

    /// Asks `source` for `id` under transfer `tid`, with a deadline for its reply.
    pub(super) fn send_fetch_request(
        &mut self,
        tid: TransferId,
        id: ObjectId,
        source: NodeId,
        mode: TransferMode,
    ) {
        let eager_limit = match mode {
            TransferMode::Auto => self.peers.get(&source).map_or(0, |p| p.threshold.bytes),
            TransferMode::Eager => self.config.eager_capacity_bytes(),
            TransferMode::Rendezvous => 0,
        };
        let max_chunk_bytes = u32::try_from(self.config.eager_chunk_bytes()).unwrap_or(u32::MAX);
        self.send(
            source,
            PeerMessage::FetchRequest {
                req: tid,
                id,
                eager_limit,
                max_chunk_bytes,
            },
        );
        self.set_timer(
            self.now + self.config.reply_timeout,
            Timer::TransferDeadline(tid),
        );
    }

    /// A holder's answer to one of this node's transfers.
    pub(super) fn handle_transfer_reply(&mut self, peer: NodeId, message: PeerMessage) {
        let tid = message.req();
        if self.is_hinted_request(peer, tid) && !self.hinted_reply(peer, &message) {
            return;
        }
        let Some(transfer) = self.transfers.get_mut(&tid).filter(|t| t.source == peer) else {
            // A late reply to a transfer that already ended: release a lease granted for it.
            if matches!(message, PeerMessage::Rendezvous { .. }) {
                self.send(peer, PeerMessage::Finish { req: tid });
            }
            return;
        };
        match (message, &mut transfer.state) {
            (
                PeerMessage::Rendezvous {
                    sizes,
                    digest,
                    regions,
                    lane_keys,
                    lease_ms,
                    ..
                },
                IncomingState::AwaitingReply,
            ) => {
                if sizes != transfer.sizes || digest != transfer.digest {
                    let why = TransferFailure::OtherContent {
                        sizes,
                        digest,
                        expected_sizes: transfer.sizes,
                        expected_digest: transfer.digest,
                    };
                    self.send(peer, PeerMessage::Finish { req: tid });
                    self.fail_transfer(tid, why);
                    return;
                }
                // Read only while the lease surely holds: it started after our request left,
                // and a quarter is kept as margin for the Finish and clock rates.
                let lease = std::time::Duration::from_millis(lease_ms as u64);
                let read_deadline = transfer.lease_from + (lease - lease / 4);
                if read_deadline <= self.now {
                    self.send(peer, PeerMessage::Finish { req: tid });
                    self.fail_transfer(tid, TransferFailure::LeaseTooShort { lease_ms });
                    return;
                }
                transfer.rendezvous_came();
                transfer.lease_ms = lease_ms;
                transfer.read_until = read_deadline;
                transfer.progress_mark = 0;
                transfer.state = IncomingState::Reading {
                    regions,
                    lane_keys,
                    next_offset: 0,
                    done_bytes: 0,
                    done_after_prefix: BTreeMap::new(),
                    in_prefix: 0,
                    outstanding: 0,
                    lane_cursor: 0,
                };
                self.arm_read_window(tid);
                self.post_reads(tid);
            }
            (PeerMessage::LeaseExtended { lease_ms, .. }, IncomingState::Reading { .. }) => {
                self.lease_extended(tid, lease_ms)
            }
            // Late: the transfer failed or has every byte already.
            (PeerMessage::LeaseExtended { .. }, _) => {}
            (
                PeerMessage::Redirect {
                    relay,
                    sizes,
                    digest,
                    ..
                },
                IncomingState::AwaitingReply,
            ) => self.follow_redirect(tid, peer, relay, (sizes, digest)),
            (PeerMessage::RelayProgress { prefix, .. }, IncomingState::Reading { .. }) => {
                self.relay_progressed(tid, prefix, false)
            }
            // A relay answers with its prefix before its `Rendezvous`: READ only below it.
            (PeerMessage::RelayProgress { prefix, .. }, IncomingState::AwaitingReply) => {
                self.relay_progressed(tid, prefix, true)
            }
            (PeerMessage::Restoring { .. }, IncomingState::AwaitingReply) => {
                self.holder_restoring(tid)
            }
            (PeerMessage::NotFound { .. }, IncomingState::AwaitingReply) => {
                self.fail_transfer(tid, TransferFailure::NotFound)
            }
            (PeerMessage::Busy { .. }, IncomingState::AwaitingReply) => {
                self.fail_transfer(tid, TransferFailure::Busy)
            }
            (PeerMessage::Error { reason, .. }, IncomingState::AwaitingReply) => {
                self.fail_transfer(tid, TransferFailure::Refused { reason })
            }
            (message, _) => {
                let why = TransferFailure::UnexpectedMessage {
                    message: message.to_string(),
                    state: transfer.describe(),
                };
                if matches!(message, PeerMessage::Rendezvous { .. }) {
                    self.send(peer, PeerMessage::Finish { req: tid });
                }
                self.fail_transfer(tid, why);
            }
        }
    }

    /// Arms the deadlines of transfer `tid`'s read window: the point half way through the lease
    /// where an extension is asked for (when the transfer may still get one), and its end.
    fn arm_read_window(&mut self, tid: TransferId) {
        let max_extensions = self.config.max_lease_extensions;
        let transfer = self.transfers.get(&tid).expect("a live transfer");
        let (read_until, lease_from) = (transfer.read_until, transfer.lease_from);
        let half_lease = std::time::Duration::from_millis(u64::from(transfer.lease_ms)) / 2;
        let may_extend = transfer.lease_extensions < max_extensions;
        self.cancel_timer(Timer::TransferDeadline(tid));
        self.set_timer(read_until, Timer::TransferDeadline(tid));
        if may_extend {
            let ask_at = (lease_from + half_lease).max(self.now).min(read_until);
            self.set_timer(ask_at, Timer::TransferDeadline(tid));
        }
    }

    /// Half of transfer `tid`'s read window is gone: if its READs progressed since the window
    /// began but are not done, ask the source to extend the lease.
    fn maybe_ask_lease_extension(&mut self, tid: TransferId) {
        let (now, max_extensions) = (self.now, self.config.max_lease_extensions);
        let transfer = self.transfers.get_mut(&tid).expect("a live transfer");
        let IncomingState::Reading { done_bytes, .. } = transfer.state else {
            return;
        };
        let progressed = done_bytes > transfer.progress_mark;
        if transfer.extension_asked_at.is_some()
            || transfer.lease_extensions >= max_extensions
            || !progressed
        {
            return;
        }
        transfer.extension_asked_at = Some(now);
        transfer.progress_mark = done_bytes;
        let source = transfer.source;
        self.stats.lease_extensions_asked += 1;
        self.send(source, PeerMessage::ExtendLease { req: tid });
    }

    /// The source of transfer `tid` extended its lease by `lease_ms` from when it got the
    /// `ExtendLease`, which left here at `extension_asked_at`: read on until three quarters of
    /// it from then.
    fn lease_extended(&mut self, tid: TransferId, lease_ms: u32) {
        let transfer = self.transfers.get_mut(&tid).expect("a live transfer");
        let Some(asked) = transfer.extension_asked_at.take() else {
            let why = TransferFailure::UnexpectedMessage {
                message: PeerMessage::LeaseExtended { req: tid, lease_ms }.to_string(),
                state: "reading, no extension asked".into(),
            };
            self.fail_transfer(tid, why);
            return;
        };
        let lease = std::time::Duration::from_millis(u64::from(lease_ms));
        transfer.lease_extensions += 1;
        transfer.lease_from = asked;
        transfer.lease_ms = lease_ms;
        transfer.read_until = transfer.read_until.max(asked + (lease - lease / 4));
        self.arm_read_window(tid);
    }

    /// The source of transfer `tid` is restoring the object from its disk: wait a reply timeout
    /// more, within the bound from the request.
    fn holder_restoring(&mut self, tid: TransferId) {
        let (now, limit) = (self.now, self.config.restore_wait_limit);
        let transfer = self
            .transfers
            .get_mut(&tid)
            .expect("a notice answers a live transfer");
        let asked = *transfer.restoring_from.get_or_insert(transfer.lease_from);
        let bound = asked.saturating_add(limit);
        if bound <= now {
            let waited_ms = duration_ms(now.saturating_since(asked));
            self.fail_transfer(tid, TransferFailure::RestoreTooSlow { waited_ms });
            return;
        }
        // The holder pins the object once restored, after it sent this notice.
        transfer.lease_from = now;
        self.cancel_timer(Timer::TransferDeadline(tid));
        let deadline = now.saturating_add(self.config.reply_timeout).min(bound);
        self.set_timer(deadline, Timer::TransferDeadline(tid));
    }

    /// An `EagerData` chunk of one of this node's transfers; its payload lies at `payload` in
    /// the message the driver just gave the node, which copies it into the object from there.
    pub(super) fn handle_eager_chunk(
        &mut self,
        peer: NodeId,
        header: EagerHeader,
        payload: InputBytes,
    ) {
        let tid = header.req;
        if self.is_hinted_request(peer, tid) && !self.hinted_eager_chunk(peer, &header) {
            return;
        }
        let Some(transfer) = self.transfers.get_mut(&tid).filter(|t| t.source == peer) else {
            return; // a late chunk of a transfer that already ended
        };
        let total = transfer.local.region.len;
        if !matches!(
            transfer.state,
            IncomingState::AwaitingReply | IncomingState::ReceivingEager { .. }
        ) {
            let why = TransferFailure::UnexpectedMessage {
                message: "eager chunk".into(),
                state: transfer.describe(),
            };
            self.fail_transfer(tid, why);
            return;
        }
        let received = match transfer.state {
            IncomingState::ReceivingEager { received } => received,
            _ => 0,
        };
        if header.sizes != transfer.sizes
            || header.digest != transfer.digest
            || header.offset != received
        {
            let why = TransferFailure::EagerChunkMismatch {
                offset: header.offset,
                sizes: header.sizes,
                digest: header.digest,
                expected_offset: received,
                expected_sizes: transfer.sizes,
                expected_digest: transfer.digest,
            };
            self.fail_transfer(tid, why);
            return;
        }
        let len = payload.len as u64;
        let region = transfer.local.region.slice(received, len);
        let object = transfer.id;
        let received = received + len;
        if received == total {
            transfer.state = IncomingState::Sealing;
            self.set_timer(self.now, Timer::Seal(tid));
        } else {
            transfer.state = IncomingState::ReceivingEager { received };
            // The stream is alive: the next chunk is due within a reply timeout of this one,
            // however long the whole object takes on a slow link.
            self.cancel_timer(Timer::TransferDeadline(tid));
            self.set_timer(
                self.now + self.config.reply_timeout,
                Timer::TransferDeadline(tid),
            );
        }
        if len > 0 {
            self.push(NodeOutput::WriteLocal {
                region,
                payload,
                object,
            });
        }
    }

    /// Lets transfer `tid` post READs up to its window (and a relay's prefix), in turn with
    /// the other transfers from its source (see [`Node::pump_reads`]).
    pub(super) fn post_reads(&mut self, tid: TransferId) {
        let window = self.config.max_outstanding_reads.max(1);
        let Some(transfer) = self.transfers.get_mut(&tid) else {
            return;
        };
        let source = transfer.source;
        if !transfer.in_read_turns && transfer.wants_read(window) {
            if let Some(peer) = self.peers.get_mut(&source) {
                transfer.in_read_turns = true;
                peer.read_turns.push_back(tid);
            }
        }
        self.pump_reads(source);
        self.note_relay_stall(tid);
    }

    /// Posts READs to `peer` while fewer than `max_outstanding_reads` are outstanding, one per
    /// transfer in turn.
    ///
    /// A holder serves one requester's READs in the order they come (one connection, one queue
    /// pair), so READs posted for many objects at once queue behind each other: on a link slow
    /// next to a batch, the last objects' READs would wait for seconds, their leases ending and
    /// their relays' readers starving, although both nodes are alive and busy. In turn, every
    /// transfer from a peer progresses at its share of the link, and the holder's queue for
    /// this node is one window long. One transfer alone still keeps the whole window.
    pub(super) fn pump_reads(&mut self, peer: NodeId) {
        let window = self.config.max_outstanding_reads.max(1);
        let slice_bytes = self.config.read_slice_bytes.max(1);
        loop {
            let Some(state) = self.peers.get_mut(&peer) else {
                return;
            };
            if state.reads_outstanding >= window {
                return;
            }
            let Some(tid) = state.read_turns.pop_front() else {
                return;
            };
            let lanes = state.params.lanes.max(1);
            let Some(transfer) = self.transfers.get_mut(&tid) else {
                continue;
            };
            transfer.in_read_turns = false;
            if transfer.source != peer {
                continue;
            }
            let Some((lane, local, remote)) = transfer.next_read(window, slice_bytes, lanes) else {
                continue;
            };
            let again = transfer.wants_read(window);
            transfer.in_read_turns = again;
            let (object, start) = (transfer.id, transfer.local.region.offset);
            let state = self.peers.get_mut(&peer).expect("looked up above");
            state.reads_outstanding += 1;
            if again {
                state.read_turns.push_back(tid);
            }
            self.next_read += 1;
            let op = ReadOpId(self.next_read);
            self.reads
                .insert(op, (tid, local.offset - start, local.len));
            self.stats.reads_posted += 1;
            self.push(NodeOutput::PostRead {
                peer,
                op,
                lane,
                local,
                remote,
                object,
            });
        }
    }

    /// Pulling from a relay: counts the time transfer `tid` waits for the relay's prefix to
    /// grow, every announced byte read and no READ in flight.
    fn note_relay_stall(&mut self, tid: TransferId) {
        let Some(transfer) = self.transfers.get_mut(&tid) else {
            return;
        };
        if !transfer.is_relayed() {
            return;
        }
        let (total, limit) = (transfer.local.region.len, transfer.read_limit());
        let dry = match transfer.state {
            IncomingState::Reading {
                outstanding,
                next_offset,
                ..
            } => outstanding == 0 && next_offset >= limit && next_offset < total,
            _ => false,
        };
        let pace = &mut self.stats.relay_pace;
        match transfer.stalled_since {
            None if dry => {
                pace.stalls += 1;
                transfer.stalled_since = Some(self.now);
            }
            Some(since) if !dry => {
                let waited = self.now.saturating_since(since).as_micros();
                pace.stall_micros += u64::try_from(waited).unwrap_or(u64::MAX);
                transfer.stalled_since = None;
            }
            _ => {}
        }
    }

    pub(super) fn read_completed(&mut self, op: ReadOpId, result: Result<(), ReadError>) {
        let Some(&(tid, _, _)) = self.reads.get(&op) else {
            return;
        };
        let source = self
            .transfers
            .get(&tid)
            .expect("a READ's transfer lives until it completes")
            .source;
        if let Some(peer) = self.peers.get_mut(&source) {
            peer.reads_outstanding -= 1;
        }
        self.read_done(op, result);
        // Its place in the window goes to the next transfer in turn.
        self.pump_reads(source);
    }

    fn read_done(&mut self, op: ReadOpId, result: Result<(), ReadError>) {
        let Some((tid, offset, len)) = self.reads.remove(&op) else {
            return;
        };
        if result.is_err() {
            self.stats.reads_failed += 1;
            if let Some(source) = self.transfers.get(&tid).map(|t| t.source) {
                self.peer_counters(source).read_errors += 1;
            }
        }
        let transfer = self
            .transfers
            .get_mut(&tid)
            .expect("a READ's transfer lives until it completes");
        let total = transfer.local.region.len;
        let source = transfer.source;
        let relayed = transfer.relay_limit.is_some();
        match &mut transfer.state {
            IncomingState::Reading {
                outstanding,
                done_bytes,
                done_after_prefix,
                in_prefix,
                ..
            } => {
                if relayed && result.is_ok() {
                    let pace = &mut self.stats.relay_pace;
                    pace.reads += 1;
                    pace.reads_in_flight += u64::from(*outstanding);
                    pace.read_bytes += len;
                }
                *outstanding -= 1;
                match result {
                    Ok(()) => {
                        *done_bytes += len;
                        if *done_bytes == total {
                            let object = transfer.id;
                            self.send(source, PeerMessage::Finish { req: tid });
                            self.verify(tid, TransferPath::Rendezvous);
                            self.relay_prefix_grew(object, total);
                        } else {
                            // The bytes in so far, from the start, may be hashed while the
                            // rest is read: the verification at the end then has less to do.
                            let before = *in_prefix;
                            done_after_prefix.insert(offset, len);
                            while let Some(len) = done_after_prefix.remove(in_prefix) {
                                *in_prefix += len;
                            }
                            if *in_prefix > before {
                                let prefix = *in_prefix;
                                let region = transfer.local.region.slice(before, prefix - before);
                                let object = transfer.id;
                                self.push(NodeOutput::HashAhead {
                                    transfer: tid,
                                    region,
                                    object,
                                });
                                self.relay_prefix_grew(object, prefix);
                            }
                            self.post_reads(tid);
                        }
                    }
                    Err(error) => self.fail_transfer(tid, TransferFailure::Read(error)),
                }
            }
            IncomingState::Draining {
                outstanding,
                reason,
            } => {
                *outstanding -= 1;
                if *outstanding == 0 {
                    let reason = reason.clone();
                    self.send(source, PeerMessage::Finish { req: tid });
                    self.end_transfer(tid, Err(reason));
                }
            }
            _ => unreachable!("READs are only outstanding while reading or draining"),
        }
    }

    /// The transfer cannot complete: abort now, or once its posted READs are in.
    pub(super) fn fail_transfer(&mut self, tid: TransferId, reason: TransferFailure) {
        let Some(transfer) = self.transfers.get_mut(&tid) else {
            return;
        };
        match &transfer.state {
            IncomingState::Reading { outstanding, .. } if *outstanding > 0 => {
                transfer.state = IncomingState::Draining {
                    outstanding: *outstanding,
                    reason,
                };
            }
            IncomingState::Reading { .. } => {
                let source = transfer.source;
                self.send(source, PeerMessage::Finish { req: tid });
                self.end_transfer(tid, Err(reason));
            }
            // Already failing; the first reason stands.
            IncomingState::Draining { .. } => {}
            // Every byte is written; a late failure cannot unwrite them.
            IncomingState::Sealing | IncomingState::Verifying { .. } => {}
            IncomingState::AwaitingReply | IncomingState::ReceivingEager { .. } => {
                self.end_transfer(tid, Err(reason))
            }
        }
    }

    pub(super) fn transfer_deadline(&mut self, tid: TransferId) {
        if self.hinted.contains_key(&tid) {
            self.hint_failed(tid, TransferFailure::NoReplyInTime);
            return;
        }
        let Some(transfer) = self.transfers.get(&tid) else {
            return;
        };
        let why = match transfer.state {
            IncomingState::AwaitingReply => match transfer.restoring_from {
                Some(asked) if self.now >= asked.saturating_add(self.config.restore_wait_limit) => {
                    let waited_ms = duration_ms(self.now.saturating_since(asked));
                    TransferFailure::RestoreTooSlow { waited_ms }
                }
                _ => TransferFailure::NoReplyInTime,
            },
            IncomingState::ReceivingEager { .. } => TransferFailure::NoReplyInTime,
            IncomingState::Reading { .. } if self.now < transfer.read_until => {
                // The point half way through the window.
                self.maybe_ask_lease_extension(tid);
                return;
            }
            IncomingState::Reading { .. } => TransferFailure::ReadsTooSlow,
            IncomingState::Sealing
            | IncomingState::Verifying { .. }
            | IncomingState::Draining { .. } => return,
        };
        self.fail_transfer(tid, why);
    }

    pub(super) fn seal_written(&mut self, tid: TransferId) {
        if self
            .transfers
            .get(&tid)
            .is_some_and(|t| matches!(t.state, IncomingState::Sealing))
        {
            self.verify(tid, TransferPath::Eager);
        }
    }

    /// Every byte of `tid` is in: the driver hashes them.
    fn verify(&mut self, tid: TransferId, path: TransferPath) {
        let transfer = self
            .transfers
            .get_mut(&tid)
            .expect("verifying a live transfer");
        transfer.state = IncomingState::Verifying { path };
        let (region, object) = (transfer.local.region, transfer.id);
        self.push(NodeOutput::VerifyContent {
            transfer: tid,
            region,
            object,
        });
    }

    /// The driver hashed the bytes of transfer `tid` (see [`NodeOutput::VerifyContent`]).
    pub(super) fn content_hashed(&mut self, tid: TransferId, actual: ContentDigest) {
        let Some(transfer) = self.transfers.get(&tid) else {
            return;
        };
        if !matches!(transfer.state, IncomingState::Verifying { .. }) {
            return; // a driver bug; nothing was asked
        }
        if actual == transfer.digest {
            self.end_transfer(tid, Ok(()));
        } else {
            self.stats.digest_mismatches += 1;
            let why = TransferFailure::DigestMismatch {
                holder: transfer.source,
                actual,
                expected: transfer.digest,
            };
            self.end_transfer(tid, Err(why));
        }
    }

    /// Ends a transfer with no READ outstanding: seal or abort the local object.
    fn end_transfer(&mut self, tid: TransferId, outcome: Result<(), TransferFailure>) {
        let transfer = self.transfers.remove(&tid).expect("ending a live transfer");
        assert_eq!(
            transfer.outstanding_reads(),
            0,
            "{tid} ended with READs outstanding"
        );
        self.cancel_timer(Timer::TransferDeadline(tid));
        self.cancel_timer(Timer::Seal(tid));
        self.bytes_in_flight -= transfer.block_len;
        if let Some(peer) = self.peers.get_mut(&transfer.source) {
            peer.active -= 1;
        }
        let path = transfer.path();
        let bytes = transfer.local.region.len;
        let outcomes = &mut self.stats.transfer_outcomes;
        match (path, outcome.is_ok()) {
            (TransferPath::Eager, true) => outcomes.eager_ok += 1,
            (TransferPath::Eager, false) => outcomes.eager_failed += 1,
            (TransferPath::Rendezvous, true) => outcomes.rendezvous_ok += 1,
            (TransferPath::Rendezvous, false) => outcomes.rendezvous_failed += 1,
            // A transfer only succeeds once the holder answered.
            (TransferPath::Unanswered, _) => outcomes.unanswered_failed += 1,
        }
        let peer = self.peer_counters(transfer.source);
        if outcome.is_ok() {
            peer.bytes_fetched += bytes;
            peer.objects_fetched += 1;
        } else {
            peer.transfer_errors += 1;
        }
        match outcome {
            Ok(()) => {
                let latency = self.now.saturating_since(transfer.requested_at);
                self.histograms.observe_fetch(bytes, latency);
                self.stats.transfers_succeeded += 1;
                self.stats.bytes_fetched += transfer.local.region.len;
                // The fetch client created it and nobody else can seal or abort it.
                self.store
                    .seal(FETCH_CLIENT, transfer.id, true)
                    .expect("the fetch client seals its own object");
                self.store.set_digest(&transfer.id, transfer.digest);
                self.partial_copy_sealed(transfer.id);
                self.sealed_copies.insert(transfer.id);
                self.transfer_sealed(transfer.id);
            }
            Err(reason) => {
                self.stats.transfers_failed += 1;
                if transfer.is_relayed() {
                    self.stats.relay_pace.failed_transfers += 1;
                }
                if !self.hold_failed_partial_copy(transfer.id, transfer.source, &reason) {
                    self.store
                        .abort(FETCH_CLIENT, transfer.id)
                        .expect("the fetch client aborts its own object");
                    self.source_failed(transfer.id, transfer.source, reason);
                }
            }
        }
        self.pump_admission();
    }

    // ---- Holder side ----

    pub(super) fn serve_fetch_request(
        &mut self,
        peer: NodeId,
        req: TransferId,
        id: ObjectId,
        eager_limit: u64,
        max_chunk_bytes: u32,
    ) {
        if self.leases.contains_key(&(peer, req)) {
            self.refuse(
                peer,
                PeerMessage::Error {
                    req,
                    reason: format!("{req} is already in progress"),
                },
            );
            return;
        }
        let Some(info) = self.store.sealed_info(&id) else {
            // Published but not sealed yet (its seal waits for the directory's answer, which
            // may reach this node after the requester heard of the publication): served once
            // the seal is made.
            if let Some(pending) = self.pending_seals.get_mut(&id) {
                if pending.park_fetch(peer, req, eager_limit, max_chunk_bytes) {
                    return;
                }
            }
            // Spilled here: served once restored (see `spill`).
            if self.park_fetch_for_restore(peer, req, id, eager_limit, max_chunk_bytes) {
                return;
            }
            // Being received here: relayed from the partial copy (see `relay`).
            if self.serve_from_partial_copy(peer, req, id) {
                return;
            }
            self.refuse(peer, PeerMessage::NotFound { req });
            return;
        };
        if self.unvouched.contains(&id) {
            // Sealed here while the directory could not judge its content (see `sealing`).
            self.refuse(peer, PeerMessage::NotFound { req });
            return;
        }
        let Some(digest) = self.store.digest(&id) else {
            // Every seal records its digest; without one, nothing was published, and bytes
            // nobody can verify are not served.
            self.refuse(peer, PeerMessage::NotFound { req });
            return;
        };
        let sizes = ObjectSizes {
            data_size: info.data_size,
            metadata_size: info.metadata_size,
        };
        if let Some(chunk) =
            super::coalesce::eager_chunk(info.region.len, eager_limit, max_chunk_bytes)
        {
            self.send_eager_chunks(peer, req, id, (info, sizes, digest), chunk);
            return;
        }
        if self.redirect_to_relay(peer, req, id, (sizes, digest)) {
            return;
        }
        if self.leases.len() >= self.config.max_leases {
            self.refuse(peer, PeerMessage::Busy { req });
            return;
        }
        if !self.config.region_keys.contains_key(&info.region.arena) {
            let reason = format!("{} is not registered for READs", info.region.arena);
            self.refuse(peer, PeerMessage::Error { req, reason });
            return;
        }
        let info = match self.store.pin(id) {
            Ok(info) => info,
            Err(_) => {
                self.refuse(peer, PeerMessage::NotFound { req });
                return;
            }
        };
        let expires = self.now + self.config.lease;
        self.leases.insert(
            (peer, req),
            Lease {
                id,
                region: info.region,
                expires,
                state: LeaseState::Granting {
                    sizes,
                    digest,
                    ended: false,
                },
                over_partial_copy: false,
                relaying: false,
                extensions: 0,
            },
        );
        self.set_timer(expires, Timer::Lease(peer, req));
        self.push(NodeOutput::GrantRead {
            peer,
            req,
            object: id,
            region: info.region,
        });
    }

    /// Sends sealed object `id` (`info`, of `sizes` and `digest`) to `peer` for its transfer
    /// `req` as `EagerData` chunks of `chunk` bytes.
    pub(super) fn send_eager_chunks(
        &mut self,
        peer: NodeId,
        req: TransferId,
        id: ObjectId,
        (info, sizes, digest): (ObjectInfo, ObjectSizes, ContentDigest),
        chunk: u64,
    ) {
        let total = info.region.len;
        self.stats.served_eager += 1;
        self.stats.bytes_served += total;
        let counters = self.peer_counters(peer);
        counters.bytes_served += total;
        counters.objects_served += 1;
        let mut offset = 0;
        loop {
            let len = chunk.min(total - offset);
            let header = EagerHeader {
                req,
                sizes,
                digest,
                offset,
            };
            self.push(NodeOutput::SendEager {
                peer,
                header,
                source: info.region.slice(offset, len),
                object: id,
            });
            offset += len;
            if offset >= total {
                break;
            }
        }
    }

    /// The fabric's answer to a `GrantRead`.
    pub(super) fn read_granted(
        &mut self,
        peer: NodeId,
        req: TransferId,
        result: Result<ReadGrant, GrantError>,
    ) {
        let Some(lease) = self.leases.get_mut(&(peer, req)) else {
            return;
        };
        let LeaseState::Granting {
            sizes,
            digest,
            ended,
        } = lease.state
        else {
            return; // answered already; a driver bug, but nothing to undo
        };
        let (id, region) = (lease.id, lease.region);
        let grant = match result {
            Ok(grant) => grant,
            Err(reason) => {
                // Nothing was granted, so nothing to revoke.
                let lease = self.leases.remove(&(peer, req)).expect("found above");
                self.cancel_timer(Timer::Lease(peer, req));
                if lease.over_partial_copy {
                    self.partial_lease_gone(id);
                } else {
                    self.store.unpin(id);
                }
                if !ended {
                    let reason = format!("cannot grant READ access: {reason}");
                    self.refuse(peer, PeerMessage::Error { req, reason });
                }
                return;
            }
        };
        if ended {
            self.revoke(peer, req);
            return;
        }
        lease.state = LeaseState::Granted;
        let over_partial_copy = lease.over_partial_copy;
        self.stats.served_rendezvous += 1;
        self.stats.bytes_served += region.len;
        let counters = self.peer_counters(peer);
        counters.bytes_served += region.len;
        counters.objects_served += 1;
        let key = self.config.region_keys[&region.arena];
        let (rkey, lane_keys) = match grant.keys.as_slice() {
            [] => (key.rkey, Vec::new()),
            [only] => (*only, Vec::new()),
            [first, ..] => (*first, grant.keys),
        };
        let remote = RemoteRegion {
            addr: key.base_addr + region.offset,
            len: region.len,
            rkey,
        };
        let lease_ms = u32::try_from(self.config.lease.as_millis())
            .unwrap_or(u32::MAX)
            .clamp(1, wire::MAX_LEASE_MS);
        if over_partial_copy {
            // First, so the reader knows before the keys that it may READ only a prefix.
            self.partial_lease_granted(peer, req, id);
        }
        self.send(
            peer,
            PeerMessage::Rendezvous {
                req,
                sizes,
                digest,
                regions: vec![remote],
                lane_keys,
                lease_ms,
            },
        );
    }

    /// The fabric's answer to a `RevokeRead`: no READ reaches the object through the lease's
    /// keys any more.
    pub(super) fn read_revoked(&mut self, peer: NodeId, req: TransferId) {
        if let Some(lease) = self.leases.get(&(peer, req)) {
            if matches!(lease.state, LeaseState::Revoking) {
                let (id, partial) = (lease.id, lease.over_partial_copy);
                self.leases.remove(&(peer, req));
                if partial {
                    self.partial_lease_gone(id);
                } else {
                    self.store.unpin(id);
                }
            }
        }
    }

    pub(super) fn refuse(&mut self, peer: NodeId, message: PeerMessage) {
        self.stats.served_refused += 1;
        self.send(peer, message);
    }

    /// The reader of lease `req` asks for more time: another lease from now, while the lease
    /// holds and has been extended fewer times than the bound. Otherwise nothing is said: the
    /// reader's window closes as it would have.
    pub(super) fn handle_extend_lease(&mut self, peer: NodeId, req: TransferId) {
        let now = self.now;
        let (lease_length, max_extensions) = (self.config.lease, self.config.max_lease_extensions);
        let Some(lease) = self.leases.get_mut(&(peer, req)) else {
            return; // ended: finished, expired or never granted
        };
        if !matches!(lease.state, LeaseState::Granted)
            || lease.expires <= now
            || lease.extensions >= max_extensions
        {
            return;
        }
        lease.extensions += 1;
        lease.expires = lease.expires.max(now + lease_length);
        let expires = lease.expires;
        self.stats.leases_extended += 1;
        self.cancel_timer(Timer::Lease(peer, req));
        self.set_timer(expires, Timer::Lease(peer, req));
        let lease_ms = u32::try_from(expires.saturating_since(now).as_millis())
            .unwrap_or(u32::MAX)
            .clamp(1, wire::MAX_LEASE_MS);
        self.send(peer, PeerMessage::LeaseExtended { req, lease_ms });
    }

    pub(super) fn handle_finish(&mut self, peer: NodeId, req: TransferId) {
        // Unknown: the lease already ran out.
        self.end_lease(peer, req);
    }

    pub(super) fn lease_expired(&mut self, peer: NodeId, req: TransferId) {
        if self
            .leases
            .get(&(peer, req))
            .is_some_and(|l| l.expires <= self.now)
        {
            self.stats.leases_expired += 1;
            self.end_lease(peer, req);
        }
    }

    /// `Finish` or the lease's end: revoke what was granted (or will be).
    pub(super) fn end_lease(&mut self, peer: NodeId, req: TransferId) {
        let Some(lease) = self.leases.get_mut(&(peer, req)) else {
            return;
        };
        match &mut lease.state {
            LeaseState::Granting { ended, .. } => *ended = true,
            LeaseState::Granted => self.revoke(peer, req),
            LeaseState::Revoking => {}
        }
    }

    fn revoke(&mut self, peer: NodeId, req: TransferId) {
        let lease = self
            .leases
            .get_mut(&(peer, req))
            .expect("revoking a held lease");
        lease.state = LeaseState::Revoking;
        let (object, region) = (lease.id, lease.region);
        self.cancel_timer(Timer::Lease(peer, req));
        self.push(NodeOutput::RevokeRead {
            peer,
            req,
            object,
            region,
        });
    }
}

/// Whole milliseconds of `duration`, saturating.
fn duration_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
