//! Many nodes, one small object: coalesced service under the simulator.
//!
//! A crowd run ([`run_crowd_seed`]) has one holder put a few small objects, then every other
//! node fetch all of them at the same instant, on links of equal latency, so the holder's
//! requests arrive together. The cluster then delivers the messages that reach one node at
//! one instant in one drive pass (as a daemon that reads many at once does, and only while
//! the node has no output queued), so the core answers them in one coalesced pass.
//!
//! Checks, in every run (not only crowd runs), per drive pass of a holder:
//! - every `EagerData` answering a peer's `FetchRequest` carries bytes of the object that
//!   request asked for (not another object's, even one served in the same pass);
//! - every request for an object sealed at the holder when it arrived is answered in its pass
//!   (eager data, a grant for a rendezvous, or a refusal): none is skipped.
//!
//! [`Flaws::coalesced_pass_skips_requester`] and [`Flaws::coalesced_pass_mixes_payloads`]
//! plant the bugs these checks exist for.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use skyriver_core::wire::{self, PeerMessage};
use skyriver_core::{LocalRegion, NodeId, ObjectId, TransferId};

use super::{Cluster, Event, Flaws, RunMode};
use crate::params::SimParams;
use crate::SimReport;

/// The requests of one holder's drive pass, and what it sent for them.
#[derive(Debug, Default)]
pub(super) struct PassChecks {
    /// Deliver the messages that reach one node at one instant in one pass (crowd runs).
    pub(super) batch_deliveries: bool,
    /// (holder, requester, request) → the object asked for, and whether it was answered.
    asks: BTreeMap<(NodeId, NodeId, TransferId), (ObjectId, bool)>,
    /// The first eager source sent in the current pass, and the objects sent (for the flaws).
    sent_in_pass: Vec<(ObjectId, LocalRegion)>,
}

impl Cluster {
    /// A message reaches `holder` from `peer`: a `FetchRequest` for an object sealed there is
    /// remembered, to be answered in this pass.
    pub(super) fn note_delivery(&mut self, holder: NodeId, peer: NodeId, bytes: &[u8]) {
        let Ok(PeerMessage::FetchRequest { req, id, .. }) = wire::decode(bytes) else {
            return;
        };
        let sealed = self.nodes[holder.0 as usize]
            .node
            .as_ref()
            .is_some_and(|node| node.store().sealed_info(&id).is_some());
        if sealed {
            self.pass.asks.insert((holder, peer, req), (id, false));
        }
    }

    /// `holder` answered `peer`'s request `req`; with the eager bytes it sent from `source`.
    pub(super) fn note_answer(
        &mut self,
        holder: NodeId,
        peer: NodeId,
        req: TransferId,
        source: Option<LocalRegion>,
    ) {
        let Some((id, answered)) = self.pass.asks.get_mut(&(holder, peer, req)) else {
            return;
        };
        *answered = true;
        let id = *id;
        let Some(source) = source else { return };
        let inside = self.nodes[holder.0 as usize]
            .node
            .as_ref()
            .and_then(|node| node.store().summary(&id))
            .is_some_and(|s| {
                s.info.region.offset <= source.offset && source.end() <= s.info.region.end()
            });
        if !inside {
            let now = self.now;
            self.checker.violation(
                now,
                format!(
                    "{holder} answered {peer}'s request {req} for {id} with bytes from {source}, \
                     outside that object"
                ),
            );
        }
    }

    /// The source a holder's driver sends an eager chunk of `object` from (`source`, unless a
    /// planted flaw changes it); None: not sent (a planted flaw skips it).
    pub(super) fn eager_source(
        &mut self,
        object: ObjectId,
        source: LocalRegion,
    ) -> Option<LocalRegion> {
        let earlier = self.pass.sent_in_pass.first().copied();
        let same_object_before = self.pass.sent_in_pass.iter().any(|(o, _)| *o == object);
        self.pass.sent_in_pass.push((object, source));
        if self.flaws.coalesced_pass_skips_requester && same_object_before {
            self.record(|| format!("FLAW skip an eager send of {object} in a coalesced pass"));
            return None;
        }
        match earlier {
            Some((other, other_source))
                if self.flaws.coalesced_pass_mixes_payloads && other != object =>
            {
                let len = source.len.min(other_source.len);
                self.record(|| format!("FLAW send {other}'s bytes for {object}"));
                Some(LocalRegion {
                    len,
                    ..other_source
                })
            }
            _ => Some(source),
        }
    }

    /// `holder`'s pass is over: every request remembered for it must have been answered.
    pub(super) fn end_pass(&mut self, holder: NodeId) {
        self.pass.sent_in_pass.clear();
        let now = self.now;
        let asks = std::mem::take(&mut self.pass.asks);
        for ((at, peer, req), (id, answered)) in asks {
            if at == holder && !answered {
                self.checker.violation(
                    now,
                    format!("{holder} left {peer}'s request {req} for sealed {id} unanswered"),
                );
            }
        }
    }

    /// In a crowd run, the next message that reaches `to` (incarnation `to_inc`) at this very
    /// instant, taken off the queue to be delivered in the same pass.
    pub(super) fn next_delivery_now(&mut self, to: NodeId, to_inc: u32) -> Option<Event> {
        if !self.pass.batch_deliveries {
            return None;
        }
        let now = self.now;
        let next = self.queue.peek()?;
        let same = next.0.at == now
            && matches!(
                &*next.0.event,
                Event::Deliver { to: t, to_inc: i, .. } if *t == to && *i == to_inc
            );
        if !same {
            return None;
        }
        let scheduled = self.queue.pop().expect("peeked").0;
        self.stats.events += 1;
        if !scheduled.background {
            self.foreground -= 1;
        }
        Some(*scheduled.event)
    }

    /// A crowd cluster for `seed`: 4 to 12 nodes on links of one latency, no faults, no
    /// random workload, messages of one instant delivered in one pass.
    pub fn crowd(seed: u64, flaws: Flaws) -> Cluster {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let nodes = rng.gen_range(4..=12);
        let mut params = SimParams::scripted(nodes);
        params.seed = seed;
        let latency = rng.gen_range(2_000..=20_000);
        params.latency_ns = (latency, latency);
        params.fetch_timeout_us = 100_000;
        let mode = RunMode {
            workload: false,
            faults: false,
            keep_trace: false,
            echo_trace: false,
        };
        let mut cluster = Cluster::build(params, rng, mode, flaws);
        cluster.pass.batch_deliveries = true;
        cluster
    }
}

/// One crowd run: a holder puts 1 to 3 small objects (eager), then every other node fetches
/// them all at the same instant, each starting at another; every requester must get its own
/// object's bytes, none skipped.
pub fn run_crowd_seed(seed: u64, flaws: Flaws) -> SimReport {
    crate::run_built(seed, || {
        let mut cluster = Cluster::crowd(seed, flaws);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc0a1_e5ce);
        let nodes = cluster.params().nodes as u32;
        let holder = rng.gen_range(0..nodes);
        let objects: Vec<u64> = (1..=rng.gen_range(1..=3u64)).collect();
        for &n in &objects {
            let size = rng.gen_range(1..=4096);
            cluster.put(holder, n, size);
        }
        cluster.note(&format!(
            "{nodes} nodes fetch {objects:?} from node {holder}"
        ));
        let timeout = std::time::Duration::from_millis(50);
        // Each requester starts at another object (as `bench cluster`'s broadcast does), so
        // one instant's requests name several objects.
        for node in (0..nodes).filter(|&n| n != holder) {
            let mut order = objects.clone();
            order.rotate_left(node as usize % objects.len());
            // One fetch per object, in that order (a fetch of many ids asks in id order).
            for n in order {
                cluster.fetch(node, &[n], timeout);
            }
        }
        cluster
    })
}
