//! The head's grace period after a restart (NFS's grace period, for the same reason).
//!
//! A restarted head starts with an empty registry and learns what the nodes hold from their
//! sessions' replays. Until a returning node's replay arrives, the head does not know that the
//! node holds an id, and would accept another node's publication of other bytes under it:
//! two contents under one id, the old holder serving its bytes to hinted fetches (which carry
//! no directory digest to check). So for the grace period a restarted head judges at once only
//! the replays ([`ToRegistry::Reclaim`](super::ToRegistry::Reclaim)) and the publications of ids
//! it lists already; a publication of an id it does not list waits, unanswered, until the
//! period ends, and is judged then, after every replay that came meanwhile (a node's later
//! requests about the same id wait behind it, so they keep their order). A seal on a node
//! whose publication waits longer than its directory timeout completes as in a directory
//! outage: sealed locally, served to no peer until the publication is accepted.
//!
//! How a head knows it restarted: its driver may say so ([`Registry::begin_grace`]: the
//! simulator does, it restarts heads), and a young head infers it from the first hello of a
//! node that was registered before (`Hello::returning`). A fresh cluster's nodes are not
//! returning, so its first start never waits. What it cannot see: a head restarted without
//! being told, whose first hellos all come from nodes restarted meanwhile, and whose returning
//! nodes all arrive later (a double fault).
//!
//! The period lasts [`Registry::set_restart_grace`] from the head's start (its first input),
//! by default twice the heartbeat timeout: a returning node notices the lost head within its
//! heartbeat timeout, reconnects within its backoff (at most about as long), and replays at
//! once.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{ConnId, Registry, RegistryOutput, WireOpId};
use crate::directory::{DirectoryReply, DirectoryRequest};
use crate::ids::{NodeId, ObjectId};
use crate::time::Instant;

/// Most requests held back at once during a grace period; more are answered `Unavailable`.
pub const MAX_DEFERRED_REQUESTS: usize = 65_536;

/// A request held back until the grace period ends.
#[derive(Debug)]
struct Deferred {
    conn: ConnId,
    node: NodeId,
    op: WireOpId,
    request: DirectoryRequest,
}

/// The grace period's state.
#[derive(Debug, Default)]
pub(super) struct Grace {
    /// The registry's first input: its start.
    started: Option<Instant>,
    /// Length of a grace period; `None`: twice the heartbeat timeout.
    length: Option<Duration>,
    /// The end of the current grace period, if one runs.
    until: Option<Instant>,
    /// Requests held back, in arrival order.
    deferred: VecDeque<Deferred>,
    /// How many held-back requests each node has about each object.
    deferred_keys: BTreeMap<(NodeId, ObjectId), usize>,
}

/// The object a publication, withdrawal or delete is about (what a grace period orders).
fn ordered_object(request: &DirectoryRequest) -> Option<ObjectId> {
    match request {
        DirectoryRequest::Publish { id, .. }
        | DirectoryRequest::PublishReplicated { id, .. }
        | DirectoryRequest::Withdraw { id }
        | DirectoryRequest::DeleteEverywhere { id } => Some(*id),
        DirectoryRequest::Lookup { .. }
        | DirectoryRequest::Unsubscribe { .. }
        | DirectoryRequest::DeclineReplica { .. }
        | DirectoryRequest::LocateCopies { .. } => None,
    }
}

impl Registry {
    /// Sets how long a grace period lasts from the head's start (default: twice the heartbeat
    /// timeout). Set it before the first input.
    pub fn set_restart_grace(&mut self, length: Duration) {
        self.grace.length = Some(length);
    }

    /// This registry replaces one that had members (a restarted head): a grace period starts
    /// now, unless one runs already. See the module documentation.
    pub fn begin_grace(&mut self, now: Instant) {
        self.advance(now);
        self.grace.started.get_or_insert(now);
        if self.grace.until.is_none() {
            self.grace.until = Some(now + self.grace_length());
        }
    }

    /// Whether a grace period runs at `now`: publications of ids the registry does not list
    /// wait for its end.
    pub fn in_grace(&self, now: Instant) -> bool {
        self.grace.until.is_some_and(|until| now < until)
    }

    /// How many requests wait for the grace period's end.
    pub fn deferred_requests(&self) -> usize {
        self.grace.deferred.len()
    }

    fn grace_length(&self) -> Duration {
        self.grace
            .length
            .unwrap_or(self.config.heartbeat_timeout * 2)
    }

    /// The registry's first input marks its start.
    pub(super) fn note_start(&mut self, now: Instant) {
        self.grace.started.get_or_insert(now);
    }

    /// A node that was registered before joined: if this registry is young, it is a restarted
    /// head, and a grace period runs from its start.
    pub(super) fn returning_member_admitted(&mut self, now: Instant) {
        let Some(started) = self.grace.started else {
            return;
        };
        let end = started + self.grace_length();
        if now < end && self.grace.until.is_none() {
            self.grace.until = Some(end);
        }
    }

    /// During a grace period, holds `request` back when it publishes an id the registry does
    /// not list, or when `node` has an earlier request about the same id held back; `Err` gives
    /// it back to be served now.
    pub(super) fn defer_in_grace(
        &mut self,
        now: Instant,
        conn: ConnId,
        node: NodeId,
        op: WireOpId,
        request: DirectoryRequest,
    ) -> Result<(), DirectoryRequest> {
        if !self.in_grace(now) {
            return Err(request);
        }
        let Some(id) = ordered_object(&request) else {
            return Err(request);
        };
        let behind_earlier = self.grace.deferred_keys.contains_key(&(node, id));
        let new_id = matches!(
            request,
            DirectoryRequest::Publish { .. } | DirectoryRequest::PublishReplicated { .. }
        ) && self.holders.get(&id).is_none();
        if !behind_earlier && !new_id {
            return Err(request);
        }
        if self.grace.deferred.len() >= MAX_DEFERRED_REQUESTS {
            self.outputs.push_back(RegistryOutput::Send {
                conn,
                message: super::FromRegistry::Reply {
                    op,
                    reply: DirectoryReply::Unavailable {
                        reason: format!(
                            "the head restarted: {MAX_DEFERRED_REQUESTS} publications wait for \
                             the end of its grace period"
                        ),
                    },
                },
            });
            return Ok(());
        }
        *self.grace.deferred_keys.entry((node, id)).or_default() += 1;
        self.grace.deferred.push_back(Deferred {
            conn,
            node,
            op,
            request,
        });
        Ok(())
    }

    /// The grace period ends at `now` or before: the held-back requests are served, in the
    /// order they came, those of connections still registered to their node.
    pub(super) fn grace_timeout(&mut self, now: Instant) {
        if self.grace.until.is_none_or(|until| now < until) {
            return;
        }
        self.grace.until = None;
        self.grace.deferred_keys.clear();
        for deferred in std::mem::take(&mut self.grace.deferred) {
            if self.by_conn.get(&deferred.conn) == Some(&deferred.node) {
                self.serve_request(
                    now,
                    deferred.conn,
                    deferred.node,
                    deferred.op,
                    deferred.request,
                );
            }
        }
    }

    /// When the grace period ends, if one runs.
    pub(super) fn grace_deadline(&self) -> Option<Instant> {
        self.grace.until
    }

    /// Entries [`Registry::check_grace_invariants`] visits.
    pub(super) fn grace_scan_size(&self) -> usize {
        self.grace.deferred_keys.len()
    }

    pub(super) fn check_grace_invariants(&self) {
        assert!(
            self.grace.until.is_some() || self.grace.deferred.is_empty(),
            "requests held back without a grace period"
        );
        assert_eq!(
            self.grace.deferred_keys.values().sum::<usize>(),
            self.grace.deferred.len(),
            "held-back requests by object"
        );
        assert!(self.grace.deferred.len() <= MAX_DEFERRED_REQUESTS);
    }
}
