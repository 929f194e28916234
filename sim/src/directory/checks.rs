//! The directory's checks: what must hold at every moment, and what must hold once faults
//! stopped (see the parent module's documentation).

use skyriver_core::registry::Registry;
use skyriver_core::{Instant, NodeId};

use super::{SimDirectory, ViolationKey};

impl SimDirectory {
    // ---- Checks ----

    /// The registry, when the head is up.
    pub fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// Whether `node`'s session is registered with the head.
    pub fn is_registered(&self, node: NodeId) -> bool {
        self.ends.get(&node).is_some_and(|e| e.session.is_up())
    }

    /// The safety checks that hold at every moment; one line per violation, each reported
    /// once.
    pub fn check(&mut self, now: Instant) -> Vec<String> {
        let mut violations = Vec::new();
        for (key, violation) in self.find_violations(now) {
            if self.reported.insert(key) {
                violations.push(violation);
            }
        }
        violations
    }

    pub(super) fn find_violations(&self, now: Instant) -> Vec<(ViolationKey, String)> {
        let mut violations = Vec::new();
        // Dead nodes vanish within the heartbeat bound.
        if let Some(registry) = &self.registry {
            let bound = self.params.registry_heartbeat_timeout;
            for (node, incarnation, conn) in registry.registrations() {
                let heard = self.last_heard.get(&conn).copied().unwrap_or(Instant::ZERO);
                if now > heard + bound {
                    violations.push((
                        ViolationKey::Outlived(node, conn),
                        format!(
                        "directory: {node} (incarnation {incarnation}) still listed {} us after \
                         it was last heard at {heard}, beyond the heartbeat bound of {} us",
                        now.saturating_since(heard).as_micros(),
                        bound.as_micros()
                    ),
                    ));
                }
            }
        }
        // No fetch waits on a subscription the directory forgot.
        for (node, end) in &self.ends {
            for id in &end.relied {
                if self.events_in_flight.contains_key(&(*node, *id)) {
                    continue;
                }
                if !end.session.waits_for(id) {
                    violations.push((
                        ViolationKey::SessionForgot(*node, *id),
                        format!(
                        "{node} waits for {id} to be published, but its directory session forgot \
                         the subscription"
                    ),
                    ));
                    continue;
                }
                let steady = end.session.is_up() && !end.session.replaying();
                let Some(conn) = end.conn else { continue };
                if !steady || self.broken.contains(&conn) {
                    continue;
                }
                let Some(registry) = &self.registry else {
                    continue;
                };
                if registry.connection_of(*node) != Some(conn) {
                    continue;
                }
                if !registry.is_subscribed(*node, id) {
                    violations.push((
                        ViolationKey::RegistryForgot(*node, *id, conn),
                        format!(
                            "{node} waits for {id} to be published, but the directory forgot the \
                         subscription ({conn}, registered and replayed)"
                        ),
                    ));
                }
            }
        }
        violations
    }

    /// Whether the directory settled for `live` nodes (node, incarnation): `Err` says what
    /// has not.
    pub fn converged(&self, live: &[(NodeId, u32)]) -> Result<(), String> {
        let Some(registry) = &self.registry else {
            return Err("the head is down".into());
        };
        let members = registry.members();
        let want: Vec<(NodeId, u32)> = members.iter().map(|m| (m.node, m.incarnation)).collect();
        if want != live {
            return Err(format!(
                "the registry lists {want:?}, the live nodes are {live:?}"
            ));
        }
        for (node, _) in live {
            let Some(end) = self.ends.get(node) else {
                return Err(format!("{node} has no directory session"));
            };
            if !end.session.is_up() || end.session.replaying() {
                return Err(format!(
                    "{node}'s directory session is not registered and replayed"
                ));
            }
            if registry.connection_of(*node) != end.conn {
                return Err(format!(
                    "{node} and the registry disagree on its connection"
                ));
            }
            if end.members != members {
                return Err(format!(
                    "{node} sees members {:?}, the registry {:?}",
                    end.members
                        .iter()
                        .map(|m| (m.node, m.incarnation))
                        .collect::<Vec<_>>(),
                    want
                ));
            }
            for id in end.session.replay_state().publications.keys() {
                if !registry.holders_of(id).contains(node) {
                    return Err(format!(
                        "{node} publishes {id}, the registry does not list it"
                    ));
                }
            }
        }
        Ok(())
    }
}
