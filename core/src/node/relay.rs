//! Broadcast through copies: a pipeline of relays.
//!
//! When many nodes fetch one large object at once, a holder serving each of them itself
//! sends every byte once per requester over its own link (a star). Instead, a requester that
//! is receiving the object serves what it has received so far to the next one, so the holder's
//! link carries each byte about once and every link of the chain is busy at once:
//!
//! ```text
//!  holder ──READs──► r1 ──READs of r1's prefix──► r2 ──► r3 ──► …
//! ```
//!
//! **Who relays.** A holder asked by `peer` for an object of at least
//! [`NodeConfig::relay_min_bytes`](super::NodeConfig) by rendezvous, while its link is busy
//! serving a lease (of this object: a broadcast is under way; or of another one) and it
//! remembers requesters of this one, answers `Redirect{relay}` naming the requester it heard
//! from last (the chain's tail), and `peer` becomes the new tail. The tail may hold a sealed
//! copy by now (its fetch ended): it serves it as any holder does, and the holder's busy link
//! is spared a copy; one that no longer has it answers `NotFound` and its reader comes back
//! to the holder, which serves it itself (one round trip lost). An idle holder serves the
//! requester itself and starts a new chain with it. A chain,
//! not a tree: every node's uplink then carries the object once, which is what the slowest
//! link allows; a tree of fan-out k would need k times that from each relay. A requester the
//! holder redirected once and that comes back (its relay failed) is served by the holder
//! itself, so a failure never loops.
//!
//! **Not through a busy link.** A node whose link serves objects it holds is a source itself
//! (every node fetching every other's object, all-to-all): a chain through it carries the
//! same bytes over the same links as serving its reader directly, only slower (each reader
//! waits on its relay's announcements). So a holder does not chain a requester it is fetching
//! from itself, and a relay serving a lease over an object of its own refuses to relay (its
//! reader comes back to the holder, which serves it, one round trip lost).
//!
//! **Serving a partial copy.** The relay's copy is an unsealed object its fetch owns. A
//! `FetchRequest` for it is answered with a lease over the whole block
//! ([`NodeOutput::GrantPartialRead`]: the fabric views each READ's range when serving it, never
//! the whole block, which is still being written): `RelayProgress{prefix}` first, then the
//! `Rendezvous`, then more `RelayProgress` as the relay's received prefix grows. The reader
//! READs only below the last prefix it was told; the prefix only grows. Saying the prefix
//! before the keys makes any requester a careful reader, also one that did not know it asked a
//! relay (a hint, a stale location): a hinted one takes it as a refusal and asks the directory. When the relay's copy is sealed
//! its leases pin it like any holder's; READs of it go on unchanged.
//!
//! **Failures.** The reader verifies the whole copy against the digest the holder named, as
//! for any transfer, so a relay that serves bytes it does not have yields a failed transfer,
//! never wrong bytes. A relay whose own transfer fails tells its readers (`Error`), revokes
//! their grants and aborts its copy only once every grant is revoked (no READ reaches freed
//! memory); its readers fail over to the holder (which serves them itself). A relay that dies
//! fails its readers' READs, with the same outcome. A requester whose copy was never created
//! (no memory) has nothing to relay: it answers `NotFound` and its would-be reader goes to
//! the holder.

use std::collections::{BTreeMap, BTreeSet};

use super::transfer::LeaseState;
use super::{Lease, Node, NodeOutput, Timer, TransferFailure, TransferMode, FETCH_CLIENT};
use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId, TransferId};
use crate::region::LocalRegion;
use crate::wire::{ObjectSizes, PeerMessage};

/// Most objects a holder remembers a relay chain for; beyond, chains of objects it no longer
/// serves are forgotten.
const MAX_CHAINS: usize = 1024;

/// A holder's and a relay's relay bookkeeping.
#[derive(Debug, Default)]
pub(super) struct Relays {
    /// Holder: per object served to many, who was sent where.
    chains: BTreeMap<ObjectId, Chain>,
    /// Relay: copies whose transfer failed while readers held grants over them; aborted (and
    /// their fetch retried) once the last grant is revoked.
    doomed: BTreeMap<ObjectId, DoomedCopy>,
}

/// The requesters of one object a holder served or redirected while serving it.
#[derive(Debug)]
struct Chain {
    /// The requester heard from last: the next one pulls from it.
    tail: NodeId,
    /// Every requester in the chain (one that comes back is served directly).
    members: BTreeSet<NodeId>,
}

#[derive(Debug)]
struct DoomedCopy {
    source: NodeId,
    reason: TransferFailure,
}

impl Relays {
    pub(super) fn describe(&self, lines: &mut Vec<String>) {
        for (id, doomed) in &self.doomed {
            lines.push(format!(
                "relayed copy of {id} failed ({}); aborted once its readers' grants are revoked",
                doomed.reason
            ));
        }
    }
}

impl Node {
    // ---- Holder ----

    /// `peer` asks for `id` (`total` bytes) by rendezvous: answers `Redirect` to a relay and
    /// returns `true` when the object is being served to another requester right now.
    pub(super) fn redirect_to_relay(
        &mut self,
        peer: NodeId,
        req: TransferId,
        id: ObjectId,
        (sizes, digest): (ObjectSizes, ContentDigest),
    ) -> bool {
        let total = sizes.total().unwrap_or(u64::MAX);
        if total < self.config.relay_min_bytes {
            return false;
        }
        // A peer this node is fetching from serves this node already: its link is as busy as
        // this one (every node fetching every other's object, all-to-all), and relaying
        // through it would move the same bytes over the same links, only stalled by the
        // chain. Served here, and not made a chain's tail.
        if self.transfers.values().any(|t| t.source == peer) {
            return false;
        }
        // The link is busy while a lease is served: of this object (a broadcast under way), or
        // of another, and then a copy a requester of this one made is worth a redirect too.
        let busy = self
            .leases
            .values()
            .any(|l| !l.over_partial_copy && !matches!(l.state, LeaseState::Revoking));
        let chains = &mut self.relays.chains;
        let chain = match chains.get_mut(&id) {
            Some(chain) if busy => chain,
            _ => {
                if chains.len() >= MAX_CHAINS {
                    let leases = &self.leases;
                    chains.retain(|id, _| leases.values().any(|l| l.id == *id));
                }
                if chains.len() < MAX_CHAINS {
                    let members = BTreeSet::from([peer]);
                    chains.insert(
                        id,
                        Chain {
                            tail: peer,
                            members,
                        },
                    );
                }
                return false;
            }
        };
        let tail = chain.tail;
        // Came back (its relay failed): served here. Never redirected to an unreachable relay.
        let usable = tail != peer && self.peers.get(&tail).is_some_and(|p| p.connected);
        let returning = !chain.members.insert(peer);
        chain.tail = peer;
        if returning || !usable {
            return false;
        }
        self.stats.relay_redirects += 1;
        self.send(
            peer,
            PeerMessage::Redirect {
                req,
                relay: tail,
                sizes,
                digest,
            },
        );
        true
    }

    /// Whether this node's link is busy serving a lease over an object it holds (not over a
    /// copy it relays, even once that copy is sealed).
    fn serving_held_objects(&self) -> bool {
        self.leases
            .values()
            .any(|l| !l.relaying && !matches!(l.state, LeaseState::Revoking))
    }

    // ---- Relay ----

    /// `peer` asks for `id`, which this node is receiving: serves the received prefix under a
    /// lease over the partial copy. `false`: no transfer of `id` here to relay from.
    pub(super) fn serve_from_partial_copy(
        &mut self,
        peer: NodeId,
        req: TransferId,
        id: ObjectId,
    ) -> bool {
        // A node whose link serves objects it holds (a source itself, all-to-all) would only
        // stall a chain through it: its reader goes back to the holder, which serves it.
        if self.relays.doomed.contains_key(&id) {
            return false;
        }
        let Some(copy) = self
            .transfers
            .values()
            .find(|t| t.id == id)
            .map(|t| t.relayable_copy())
        else {
            return false;
        };
        if self.serving_held_objects() {
            self.stats.relay_pace.refused_requests += 1;
            return false;
        }
        let Some((region, sizes, digest)) = copy else {
            return false;
        };
        if self.leases.len() >= self.config.max_leases {
            self.refuse(peer, PeerMessage::Busy { req });
            return true;
        }
        if !self.config.region_keys.contains_key(&region.arena) {
            return false;
        }
        let expires = self.now + self.config.lease;
        self.leases.insert(
            (peer, req),
            Lease {
                id,
                region,
                expires,
                state: LeaseState::Granting {
                    sizes,
                    digest,
                    ended: false,
                },
                over_partial_copy: true,
                relaying: true,
                extensions: 0,
            },
        );
        self.set_timer(expires, Timer::Lease(peer, req));
        self.push(NodeOutput::GrantPartialRead {
            peer,
            req,
            object: id,
            region,
        });
        true
    }

    /// Bytes of `id` held here from its start: all of a sealed copy, the received prefix of
    /// one being received.
    fn held_prefix(&self, id: &ObjectId) -> u64 {
        if let Some(info) = self.store.sealed_info(id) {
            return info.region.len;
        }
        self.transfers
            .values()
            .find(|t| t.id == *id)
            .map_or(0, |t| t.received_prefix())
    }

    /// A lease over a partial copy is granted: before its `Rendezvous`, tell the reader what
    /// it may READ so far. Said first, so a requester that did not know this node relays (a
    /// hint, a stale location) READs no further either; one asking by hint takes it as a
    /// refusal and asks the directory.
    pub(super) fn partial_lease_granted(&mut self, peer: NodeId, req: TransferId, id: ObjectId) {
        // Counted once the fabric granted it: a fabric that cannot relay counts none.
        self.stats.relay_leases += 1;
        let prefix = self.held_prefix(&id);
        self.stats.relay_pace.announcements += 1;
        self.send(peer, PeerMessage::RelayProgress { req, prefix });
    }

    /// The received prefix of `id` grew to `prefix`: its readers may READ up to there.
    pub(super) fn relay_prefix_grew(&mut self, id: ObjectId, prefix: u64) {
        let readers: Vec<(NodeId, TransferId)> = self
            .leases
            .iter()
            .filter(|(_, l)| {
                l.id == id && l.over_partial_copy && matches!(l.state, LeaseState::Granted)
            })
            .map(|(&key, _)| key)
            .collect();
        for (peer, req) in readers {
            self.stats.relay_pace.announcements += 1;
            self.send(peer, PeerMessage::RelayProgress { req, prefix });
        }
    }

    /// This node's copy of `id` was just sealed: the leases over it while partial pin it now,
    /// as any holder's. Their readers were told the whole object is in when the last READ
    /// completed (or when granted, if later).
    pub(super) fn partial_copy_sealed(&mut self, id: ObjectId) {
        for lease in self.leases.values_mut() {
            if lease.id != id || !lease.over_partial_copy {
                continue;
            }
            // Just sealed by this node's fetch, which nothing deletes in between.
            self.store
                .pin(id)
                .expect("a copy sealed this instant can be pinned");
            lease.over_partial_copy = false;
        }
    }

    /// This node's transfer of `id` from `source` failed. With readers granted over the
    /// partial copy, the copy is kept until their grants are revoked (they are told and
    /// revoked now) and `true` returned; the caller then neither aborts it nor retries.
    pub(super) fn hold_failed_partial_copy(
        &mut self,
        id: ObjectId,
        source: NodeId,
        reason: &TransferFailure,
    ) -> bool {
        let readers: Vec<(NodeId, TransferId)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.id == id && l.over_partial_copy)
            .map(|(&key, _)| key)
            .collect();
        if readers.is_empty() {
            return false;
        }
        self.relays.doomed.insert(
            id,
            DoomedCopy {
                source,
                reason: reason.clone(),
            },
        );
        for (peer, req) in readers {
            let relay_reason = TransferFailure::RelayFailed(Box::new(reason.clone())).to_string();
            let granted = self
                .leases
                .get(&(peer, req))
                .is_some_and(|l| matches!(l.state, LeaseState::Granted));
            if granted {
                self.send(
                    peer,
                    PeerMessage::Error {
                        req,
                        reason: relay_reason,
                    },
                );
            }
            self.end_lease(peer, req);
        }
        true
    }

    /// A lease over the partial copy of `id` is gone: once none is left, a failed copy is
    /// aborted and its fetch goes on elsewhere.
    pub(super) fn partial_lease_gone(&mut self, id: ObjectId) {
        let readers_left = self
            .leases
            .values()
            .any(|l| l.id == id && l.over_partial_copy);
        if readers_left {
            return;
        }
        let Some(doomed) = self.relays.doomed.remove(&id) else {
            return;
        };
        // The fetch client created it and nobody else can seal or abort it.
        self.store
            .abort(FETCH_CLIENT, id)
            .expect("the fetch client aborts its own object");
        self.source_failed(id, doomed.source, doomed.reason);
        self.pump_admission();
    }

    // ---- Requester ----

    /// The holder `peer` sent transfer `tid` to `relay`: ask it instead, reading only what it
    /// says it has.
    pub(super) fn follow_redirect(
        &mut self,
        tid: TransferId,
        peer: NodeId,
        relay: NodeId,
        (sizes, digest): (ObjectSizes, ContentDigest),
    ) {
        let me = self.config.node;
        let transfer = self
            .transfers
            .get_mut(&tid)
            .expect("a redirect answers a live transfer");
        let id = transfer.id;
        let (want_sizes, want_digest) = transfer.content();
        if sizes != want_sizes || digest != want_digest {
            let why = TransferFailure::RedirectedForOtherContent {
                sizes,
                digest,
                expected_sizes: want_sizes,
                expected_digest: want_digest,
            };
            self.fail_transfer(tid, why);
            return;
        }
        let usable = relay != me
            && relay != peer
            && !transfer.is_relayed()
            && self.peers.get(&relay).is_some_and(|p| p.connected);
        if usable {
            transfer.pull_from_relay(relay, self.now);
        }
        self.cancel_timer(Timer::TransferDeadline(tid));
        if !usable {
            // The holder serves a requester it redirected once, if it asks again.
            self.send_fetch_request(tid, id, peer, TransferMode::Rendezvous);
            return;
        }
        if let Some(state) = self.peers.get_mut(&peer) {
            state.active = state.active.saturating_sub(1);
        }
        if let Some(state) = self.peers.get_mut(&relay) {
            state.active += 1;
        }
        self.stats.relayed_transfers += 1;
        self.send_fetch_request(tid, id, relay, TransferMode::Rendezvous);
    }

    /// The relay of transfer `tid` holds the object's first `prefix` bytes now (`answer`: said
    /// before its `Rendezvous`).
    pub(super) fn relay_progressed(&mut self, tid: TransferId, prefix: u64, answer: bool) {
        let transfer = self
            .transfers
            .get_mut(&tid)
            .expect("progress of a live transfer");
        if let Err(why) = transfer.relay_prefix_is(prefix, answer) {
            self.fail_transfer(tid, why);
            return;
        }
        self.post_reads(tid);
    }
}

/// How fast bytes flow through relays, as counters (`bench cluster` reports them per round):
/// how often relays announce their prefix, how long readers wait for it, how many READs they
/// keep in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayPace {
    /// `RelayProgress` messages this node sent as a relay (the first, before each
    /// `Rendezvous`, included).
    pub announcements: u64,
    /// Times a transfer pulling from a relay had read all the relay had announced and no READ
    /// in flight, with bytes still to read: it waited for the next announcement.
    pub stalls: u64,
    /// Microseconds those waits lasted in all (until the next READ was posted).
    pub stall_micros: u64,
    /// READs from relays that completed.
    pub reads: u64,
    /// Sum over those completions of the READs of the transfer then in flight (the one
    /// completing included): divided by `reads`, the mean READs in flight.
    pub reads_in_flight: u64,
    /// Bytes those READs brought in.
    pub read_bytes: u64,
    /// Transfers pulling from a relay that failed after its first announcement (each goes on
    /// at the holder).
    pub failed_transfers: u64,
    /// Requests this node refused to relay, for an object it was receiving, because its link
    /// was serving objects it holds (all-to-all): each reader went back to the holder.
    #[serde(default)]
    pub refused_requests: u64,
}

/// What a relay needs of the copy it relays: its block, sizes and digest.
pub(super) type RelayableCopy = (LocalRegion, ObjectSizes, ContentDigest);
