//! One shard of a sharded directory: a model of a Redis Cluster master and its replica.
//!
//! The real Redis Cluster mode (`transport/src/directory/redis/cluster.rs`) keeps an object's
//! records in the slot of its id's hash tag (`…:obj:{HEX}`: CRC16 of the id in hex, mod
//! 16,384), so objects spread over the masters, and membership in one slot of its own. The
//! simulator's sharded directory is K of its heads ([`SimDirectory`]s, each the core's
//! registry): an object's requests go to the shard owning its slot (slots split into K
//! contiguous ranges, as `redis-cli --cluster create` assigns them), the member list the cores
//! see comes from shard 0. Every node registers with every shard (each shard's registry holds
//! its liveness, as each master holds what a node wrote there).
//!
//! A shard **fails over**: its master dies, the shard answers nothing for a while, then its
//! replica answers as master, holding what the master had replicated to it: every input the
//! master took up to `lag` before it died, none after (Redis replicates asynchronously; the
//! writes of the last moment are lost). The nodes' connections to the dead master reset; they
//! reconnect to the promoted replica, which knows them (the same daemons on new connections),
//! and replay what they hold and wait for, as after a head restart: what the failover lost
//! comes back within the reconnect backoff. The promoted replica starts a grace period as a
//! restarted head does (its operator knows it failed over), since it may lack publications its
//! returning nodes still hold.
//!
//! The other directory faults of a run keep their meaning: a node cut off from the directory
//! is cut off from every shard; a head outage (a crash that loses everything) hits shard 0.
//! What is coarser than the daemon: its Redis Cluster adapter ends on any lost master
//! connection, so every shard's records of the node are re-published; here only the sessions
//! of the shard that failed over re-register and replay.
//!
//! The replica is modelled by the master's inputs: each shard logs every input its registry
//! takes since it started, and a failover at `t` builds the promoted registry by feeding a
//! fresh registry the log up to `t - lag` (the registry is deterministic: same inputs, same
//! state, same nonces).

use std::time::Duration;

use skyriver_core::registry::{ConnId, Registry, RegistryConfig, ToRegistry};
use skyriver_core::{Instant, ObjectId};

use super::{new_registry, restart_grace, DirEvent, Effect, SimDirectory};

/// Redis Cluster's number of slots.
pub const SLOTS: u32 = 16_384;

/// CRC16-CCITT (XMODEM), Redis Cluster's key hash.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `id`'s records: its hash tag is the id in hex.
pub fn slot_of(id: &ObjectId) -> u32 {
    crc16(id.to_string().as_bytes()) as u32 % SLOTS
}

/// The shard of `shards` owning `id`'s slot: slots split into contiguous ranges.
pub fn shard_of(id: &ObjectId, shards: usize) -> usize {
    (slot_of(id) as usize * shards) / SLOTS as usize
}

/// An input the registry took, as the log keeps it.
#[derive(Debug, Clone)]
pub(super) enum RegistryInput {
    Message(ConnId, ToRegistry),
    Disconnect(ConnId),
    Timeout,
    /// A grace period of this length begins (a restart or a failover).
    Grace(Duration),
}

impl RegistryInput {
    pub(super) fn apply(self, registry: &mut Registry, now: Instant) {
        match self {
            RegistryInput::Message(conn, message) => {
                let _ = registry.handle_message(now, conn, message);
            }
            RegistryInput::Disconnect(conn) => registry.handle_disconnect(now, conn),
            RegistryInput::Timeout => registry.handle_timeout(now),
            RegistryInput::Grace(length) => {
                registry.set_restart_grace(length);
                registry.begin_grace(now);
            }
        }
    }
}

/// A shard's master and replica, as far as its failovers need them.
#[derive(Debug)]
pub(super) struct ShardState {
    /// How far the replica trails its master.
    pub(super) lag_ns: u64,
    /// Failovers still to come in the run: after the last, nothing is logged.
    failovers_left: u32,
    /// The configuration the current registry started with.
    config: RegistryConfig,
    /// Every input of the current registry since it started, in order.
    log: Vec<(Instant, RegistryInput)>,
    /// The replica being promoted while the shard fails over.
    promoted: Option<Registry>,
    /// The planted flaw `transparent_shard_failovers`: the nodes' connections follow the
    /// failover (their messages wait and go to the promoted replica), so nobody re-registers
    /// nor replays, and what the replica had not received stays lost.
    pub(super) transparent: bool,
    /// Under the flaw: messages that reached the shard while it failed over, in order.
    waiting: Vec<(ConnId, ToRegistry)>,
}

impl ShardState {
    pub(super) fn new(lag_ns: u64, failovers: u32, config: RegistryConfig) -> Self {
        ShardState {
            lag_ns,
            failovers_left: failovers,
            config,
            log: Vec::new(),
            promoted: None,
            transparent: false,
            waiting: Vec::new(),
        }
    }

    /// A new registry starts (a head restart): its log starts empty.
    pub(super) fn restarted(&mut self, config: RegistryConfig) {
        self.config = config;
        self.log.clear();
        self.promoted = None;
        self.waiting.clear();
    }

    pub(super) fn log(&mut self, now: Instant, input: &RegistryInput) {
        if self.failovers_left > 0 {
            self.log.push((now, input.clone()));
        }
    }

    /// Whether the shard is failing over (its replica not promoted yet).
    pub(super) fn failing_over(&self) -> bool {
        self.promoted.is_some()
    }
}

impl SimDirectory {
    /// Plants the flaw `transparent_shard_failovers` (see `Flaws`) in a shard.
    pub fn set_transparent_failovers(&mut self, on: bool) {
        if let Some(shard) = self.shard.as_mut() {
            shard.transparent = on;
        }
    }

    /// Feeds the registry (which must be up) one input, logged for a failover.
    pub(super) fn registry_input(&mut self, now: Instant, input: RegistryInput) {
        if let Some(shard) = self.shard.as_mut() {
            shard.log(now, &input);
        }
        let registry = self.registry.as_mut().expect("up");
        input.apply(registry, now);
    }

    /// Whether a message reaching the head waits for a failover's end (under the planted flaw):
    /// then it is kept.
    pub(super) fn held_by_failover(&mut self, conn: ConnId, message: &ToRegistry) -> bool {
        match self.shard.as_mut() {
            Some(shard) if shard.transparent && shard.failing_over() => {
                shard.waiting.push((conn, message.clone()));
                true
            }
            _ => false,
        }
    }

    /// The shard's master dies (`up == false`), or its replica answers as master.
    pub(super) fn failover(
        &mut self,
        now: Instant,
        up: bool,
        rng: &mut rand_chacha::ChaCha8Rng,
        faults_on: bool,
        effects: &mut Vec<Effect>,
    ) {
        let Some(shard) = self.shard.as_mut() else {
            return;
        };
        if !up {
            if shard.failing_over() {
                return;
            }
            let Some(master) = self.registry.take() else {
                return;
            };
            self.registry_checks.settle(&master);
            drop(master);
            self.stats.failovers += 1;
            self.registry_timer_at = None;
            // What the replica had received: the master's inputs up to `lag` ago.
            let cut = Instant(now.0.saturating_sub(shard.lag_ns));
            let kept = shard.log.partition_point(|(at, _)| *at <= cut);
            shard.log.truncate(kept);
            shard.failovers_left = shard.failovers_left.saturating_sub(1);
            let log = if shard.failovers_left == 0 {
                std::mem::take(&mut shard.log)
            } else {
                shard.log.clone()
            };
            let mut replica = new_registry(shard.config.clone(), self.params.replication);
            for (at, input) in log {
                input.apply(&mut replica, at);
            }
            while replica.poll_output().is_some() {}
            shard.promoted = Some(replica);
            effects.push(Effect::Trace(format!(
                "FAULT directory shard fails over: its master dies; its replica lacks the last \
                 {} us of writes",
                shard.lag_ns / 1000
            )));
            if shard.transparent {
                // The flaw: the nodes' connections stay, as if nothing happened.
                return;
            }
            self.head_epoch += 1;
            let ends: Vec<(skyriver_core::NodeId, u32, Option<ConnId>)> =
                self.ends.iter().map(|(n, e)| (*n, e.inc, e.conn)).collect();
            for (node, inc, conn) in ends {
                let Some(conn) = conn else { continue };
                self.broken.insert(conn);
                if !self.partitioned.contains(&node) {
                    effects.push(Effect::Schedule {
                        at: Instant(now.0 + self.params.detect_ns),
                        event: DirEvent::NodeSeesClosed { node, inc, conn },
                        background: false,
                    });
                }
            }
            return;
        }
        let Some(promoted) = shard.promoted.take() else {
            return;
        };
        let waiting = std::mem::take(&mut shard.waiting);
        effects.push(Effect::Trace(
            "FAULT directory shard answers again: its replica is master".into(),
        ));
        self.registry = Some(promoted);
        if !self.unguarded_restarts {
            self.registry_input(now, RegistryInput::Grace(restart_grace(&self.params)));
        }
        // As it takes over, the new master drops the members whose liveness ran out while the
        // shard answered nothing (Redis expires their keys).
        let before = self.registry.as_ref().map_or(0, |r| r.member_count());
        self.registry_input(now, RegistryInput::Timeout);
        let after = self.registry.as_ref().map_or(0, |r| r.member_count());
        self.stats.heartbeat_expiries += before.saturating_sub(after) as u64;
        self.pump_registry(now, rng, faults_on, effects);
        let head_epoch = self.head_epoch;
        for (conn, message) in waiting {
            let more = self.handle(
                now,
                DirEvent::ToHead {
                    conn,
                    head_epoch,
                    message,
                },
                rng,
                faults_on,
            );
            effects.extend(more);
        }
    }
}
