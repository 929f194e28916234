//! Carrying the session's and the registry's output over the simulated link: connection
//! attempts, messages with latency, connections that break (a lost push, a partition, a close)
//! and the timers of both ends.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use skyriver_core::directory::{DirectoryEvent, DirectoryNotice};
use skyriver_core::registry::session::SessionOutput;
use skyriver_core::registry::{ConnId, FromRegistry, RegistryOutput, ToRegistry};
use skyriver_core::{Instant, NodeId, ObjectId};

use super::{DirEvent, Effect, SimDirectory};

impl SimDirectory {
    pub(super) fn event_landed(&mut self, node: NodeId, id: ObjectId) {
        self.watch.changed(node, id);
        if let Some(count) = self.events_in_flight.get_mut(&(node, id)) {
            *count -= 1;
            if *count == 0 {
                self.events_in_flight.remove(&(node, id));
            }
        }
    }

    pub(super) fn event_sent(&mut self, node: NodeId, id: ObjectId) {
        self.watch.changed(node, id);
        *self.events_in_flight.entry((node, id)).or_default() += 1;
    }

    /// Carries out what `node`'s session asks for, and accounts for what it changed of its
    /// subscriptions.
    pub(super) fn pump_session(&mut self, now: Instant, node: NodeId, effects: &mut Vec<Effect>) {
        self.carry_session_output(now, node, effects);
        self.account_session_changes(node);
    }

    fn carry_session_output(&mut self, now: Instant, node: NodeId, effects: &mut Vec<Effect>) {
        self.watch.touch(node);
        let latency = self.params.latency_ns;
        loop {
            let Some(end) = self.ends.get_mut(&node) else {
                return;
            };
            let inc = end.inc;
            let Some(output) = end.session.poll_output() else {
                break;
            };
            match output {
                SessionOutput::Connect => {
                    end.conn = None;
                    self.next_conn += 1;
                    let conn = ConnId(self.next_conn);
                    self.owners.insert(conn, (node, inc));
                    let reachable = self.registry.is_some() && !self.partitioned.contains(&node);
                    // A refused connection fails within a round trip; a black hole at the
                    // session's hello deadline (it sends, nothing comes back).
                    effects.push(Effect::Schedule {
                        at: Instant(now.0 + latency),
                        event: DirEvent::Connected {
                            node,
                            inc,
                            conn: reachable.then_some(conn),
                            head_epoch: self.head_epoch,
                        },
                        background: false,
                    });
                }
                SessionOutput::Send(message) => {
                    let Some(conn) = end.conn else { continue };
                    if self.partitioned.contains(&node) {
                        // TCP cannot deliver it: the connection dies, silently for both ends.
                        self.broken.insert(conn);
                    }
                    if self.broken.contains(&conn) {
                        continue;
                    }
                    let mut message = message;
                    if let (ToRegistry::Hello(hello), true) =
                        (&mut message, self.unguarded_restarts)
                    {
                        hello.returning = false;
                    }
                    let background = matches!(message, ToRegistry::Ping { .. });
                    effects.push(Effect::Schedule {
                        at: Instant(now.0 + latency),
                        event: DirEvent::ToHead {
                            conn,
                            head_epoch: self.head_epoch,
                            message,
                        },
                        background,
                    });
                }
                SessionOutput::Notice(notice) => match notice {
                    DirectoryNotice::Members(members) => {
                        // The node's core dials by it (and shows it in `nodes` replies).
                        end.members = members.clone();
                        effects.push(Effect::Notice {
                            node,
                            inc,
                            notice: DirectoryNotice::Members(members),
                        });
                    }
                    DirectoryNotice::Health(health) => {
                        effects.push(Effect::Notice {
                            node,
                            inc,
                            notice: DirectoryNotice::Health(health.clone()),
                        });
                        if health.is_ok() {
                            let first = !end.welcomed_once;
                            end.welcomed_once = true;
                            if first {
                                let held = std::mem::take(&mut end.held);
                                for (op, request) in held {
                                    end.session.handle_submit(now, op, request);
                                }
                            } else {
                                self.stats.reconnects += 1;
                            }
                        }
                        effects.push(Effect::Trace(match health {
                            Ok(()) => format!("{node}: directory up"),
                            Err(reason) => format!("{node}: directory down: {reason}"),
                        }));
                    }
                    DirectoryNotice::Event(DirectoryEvent::ReplayRefused { .. })
                        if self.unguarded_restarts => {}
                    DirectoryNotice::Event(event) => {
                        // Only publications are counted in flight (the checker's
                        // subscriptions); replica events are not.
                        let published = match &event {
                            DirectoryEvent::Published { id, .. } => Some(*id),
                            _ => None,
                        };
                        effects.push(Effect::Notice {
                            node,
                            inc,
                            notice: DirectoryNotice::Event(event),
                        });
                        if let Some(id) = published {
                            self.event_sent(node, id);
                        }
                    }
                    reply @ DirectoryNotice::Reply { .. } => effects.push(Effect::Notice {
                        node,
                        inc,
                        notice: reply,
                    }),
                },
                SessionOutput::Disconnect { reason } => {
                    let Some(conn) = end.conn.take() else {
                        continue;
                    };
                    effects.push(Effect::Trace(format!(
                        "{node}: directory connection dropped: {reason}"
                    )));
                    if self.broken.insert(conn) && !self.partitioned.contains(&node) {
                        effects.push(Effect::Schedule {
                            at: Instant(now.0 + self.params.detect_ns),
                            event: DirEvent::HeadSeesClosed {
                                conn,
                                head_epoch: self.head_epoch,
                            },
                            background: false,
                        });
                    }
                }
            }
        }
        self.reschedule_session(now, node, effects);
    }

    pub(super) fn reschedule_session(
        &mut self,
        _now: Instant,
        node: NodeId,
        effects: &mut Vec<Effect>,
    ) {
        let Some(end) = self.ends.get_mut(&node) else {
            return;
        };
        if let Some(at) = end.session.poll_timeout() {
            if end.timer_at.is_none_or(|t| at < t) {
                end.timer_at = Some(at);
                effects.push(Effect::Schedule {
                    at,
                    event: DirEvent::SessionTimer { node, inc: end.inc },
                    // Only a reconnection attempt is work of its own; otherwise the timer
                    // sends heartbeats or gives up on a silent head.
                    background: !end.session.is_down(),
                });
            }
        }
    }

    pub(super) fn reschedule_registry(&mut self, effects: &mut Vec<Effect>) {
        let Some(registry) = &self.registry else {
            return;
        };
        if let Some(at) = registry.poll_timeout() {
            if self.registry_timer_at.is_none_or(|t| at < t) {
                self.registry_timer_at = Some(at);
                effects.push(Effect::Schedule {
                    at,
                    event: DirEvent::RegistryTimer {
                        head_epoch: self.head_epoch,
                    },
                    background: true,
                });
            }
        }
    }

    /// Carries out what the registry decided.
    pub(super) fn pump_registry(
        &mut self,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults_on: bool,
        effects: &mut Vec<Effect>,
    ) {
        loop {
            let Some(registry) = self.registry.as_mut() else {
                return;
            };
            let Some(output) = registry.poll_output() else {
                self.registry_checks.after_change(registry);
                break;
            };
            match output {
                RegistryOutput::Send { conn, message } => {
                    self.push(now, conn, message, rng, faults_on, effects)
                }
                RegistryOutput::SendMembers {
                    conns,
                    members,
                    epoch,
                } => {
                    // Whole lists, shared by every message: the head's changes from one list
                    // to the next would make each session build a list of its own.
                    for conn in conns {
                        let message = FromRegistry::Members {
                            epoch,
                            members: members.clone(),
                        };
                        self.push(now, conn, message, rng, faults_on, effects);
                    }
                }
                RegistryOutput::Close { conn, reason } => {
                    self.touch_conn(conn);
                    effects.push(Effect::Trace(format!("directory closes {conn}: {reason}")));
                    if !self.broken.insert(conn) {
                        continue;
                    }
                    if let Some(&(node, inc)) = self.owners.get(&conn) {
                        if !self.partitioned.contains(&node) {
                            effects.push(Effect::Schedule {
                                at: Instant(now.0 + self.params.detect_ns),
                                event: DirEvent::NodeSeesClosed { node, inc, conn },
                                background: false,
                            });
                        }
                    }
                }
            }
        }
        self.reschedule_registry(effects);
    }

    pub(super) fn push(
        &mut self,
        now: Instant,
        conn: ConnId,
        message: FromRegistry,
        rng: &mut ChaCha8Rng,
        faults_on: bool,
        effects: &mut Vec<Effect>,
    ) {
        let Some(&(node, inc)) = self.owners.get(&conn) else {
            return;
        };
        self.watch.touch(node);
        if let FromRegistry::Event(DirectoryEvent::Published { id, .. }) = &message {
            // The registry dropped the subscription as it fired it.
            self.account_fired(node, *id);
        }
        if self.partitioned.contains(&node) {
            // TCP cannot deliver it: the connection dies, silently for both ends.
            self.broken.insert(conn);
        }
        if self.broken.contains(&conn) {
            return;
        }
        if let FromRegistry::Event(DirectoryEvent::Surplus { id }) = &message {
            let counted = self
                .registry
                .as_ref()
                .and_then(|registry| registry.copies_of_record(id))
                .map(|(_, nodes)| nodes)
                .unwrap_or_default();
            self.surplus_counted.insert((node, *id), counted);
        }
        if let FromRegistry::Event(DirectoryEvent::Published { id, .. }) = &message {
            if faults_on && rng.gen_range(0..1_000_000) < self.params.lost_push_ppm {
                // Lost on the wire: the connection breaks with it, both ends notice.
                self.stats.lost_pushes += 1;
                effects.push(Effect::Trace(format!(
                    "FAULT push of {id} to {node} lost; {conn} breaks"
                )));
                self.broken.insert(conn);
                let at = Instant(now.0 + self.params.detect_ns);
                effects.push(Effect::Schedule {
                    at,
                    event: DirEvent::HeadSeesClosed {
                        conn,
                        head_epoch: self.head_epoch,
                    },
                    background: false,
                });
                effects.push(Effect::Schedule {
                    at,
                    event: DirEvent::NodeSeesClosed { node, inc, conn },
                    background: false,
                });
                return;
            }
            self.event_sent(node, *id);
        }
        // Heartbeats, and member lists (which no core waits for), do not keep a run going.
        let background = matches!(
            message,
            FromRegistry::Pong { .. }
                | FromRegistry::Members { .. }
                | FromRegistry::MembersChanged { .. }
        );
        effects.push(Effect::Schedule {
            at: Instant(now.0 + self.params.latency_ns),
            event: DirEvent::ToNode {
                node,
                inc,
                conn,
                message,
            },
            background,
        });
    }
}
