//! The directory's checks: what must hold at every moment, and what must hold once faults
//! stopped (see the parent module's documentation).

use std::collections::{BTreeMap, BTreeSet};

use skyriver_core::ids::OBJECT_ID_LEN;
use skyriver_core::registry::session::DirectorySession;
use skyriver_core::registry::{ConnId, Registry};
use skyriver_core::{Instant, NodeId, ObjectId};

use super::{DirEvent, NodeEnd, SimDirectory, ViolationKey};

/// Up to this many nodes, debug builds compare each incremental check with a full scan.
#[cfg(debug_assertions)]
const CROSS_CHECK_MAX_NODES: usize = 16;

/// What the per-event checks must look at again, so that an event costs the same whatever
/// the cluster's size and however many objects a node waits for.
#[derive(Debug)]
pub(super) struct CheckWatch {
    /// Connections by when the head last heard from them, oldest first, until their silence
    /// outgrows the heartbeat bound.
    by_silence: BTreeSet<(Instant, ConnId)>,
    /// Nodes whose end, session, connection or registration changed since the last check.
    touched: BTreeSet<NodeId>,
    /// Everything changed (the head crashed or came back; the first check).
    everything: bool,
    /// Nodes whose subscriptions the per-event checks examined, all together.
    nodes_examined: u64,
    /// Objects the per-event checks examined the subscriptions of, all nodes together.
    objects_examined: u64,
    /// Per touched node, the objects whose state changed since the node was last examined:
    /// whether its fetches wait for them, whether their events are on the way, whether its
    /// session or the registry subscribes to them.
    changed: BTreeMap<NodeId, Vec<ObjectId>>,
    /// Nodes whose subscriptions changed in a way no object names (a session that dropped a
    /// subscription by itself, a new end): every object they wait for is examined again.
    whole: BTreeSet<NodeId>,
    /// What each node was last examined with: its incarnation and, when the registry side
    /// applied, the connection. Another, and every object it waits for is examined again.
    examined_as: BTreeMap<NodeId, (u32, Option<ConnId>)>,
}

/// What a node's end last accounted for of its session's and the registry's subscriptions:
/// a change beyond it that no object was named for makes the next check examine every object
/// the node waits for.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SubscriptionsKnown {
    /// The session's [`DirectorySession::subscription_changes`] and how many objects it waited
    /// for then.
    session: (u64, usize),
    /// The registry's [`Registry::subscriptions_stamp`] of the node.
    registry: Option<u64>,
    /// The object the session's next change is about, when the driver knows it (an
    /// unsubscribe, a published event).
    pub(super) session_hint: Option<ObjectId>,
}

impl SubscriptionsKnown {
    pub(super) fn of(session: &DirectorySession) -> Self {
        SubscriptionsKnown {
            session: (session.subscription_changes(), session.waited_for().len()),
            registry: None,
            session_hint: None,
        }
    }
}

impl Default for CheckWatch {
    fn default() -> Self {
        CheckWatch {
            by_silence: BTreeSet::new(),
            touched: BTreeSet::new(),
            everything: true,
            nodes_examined: 0,
            objects_examined: 0,
            changed: BTreeMap::new(),
            whole: BTreeSet::new(),
            examined_as: BTreeMap::new(),
        }
    }
}

impl CheckWatch {
    pub(super) fn touch(&mut self, node: NodeId) {
        if !self.everything {
            self.touched.insert(node);
        }
    }

    /// Something of `node` about `id` changed: the next check examines that object.
    pub(super) fn changed(&mut self, node: NodeId, id: ObjectId) {
        if !self.everything {
            self.touched.insert(node);
            self.changed.entry(node).or_default().push(id);
        }
    }

    /// Something of `node`'s subscriptions changed that no object was named for: the next
    /// check examines every object it waits for.
    pub(super) fn whole(&mut self, node: NodeId) {
        if !self.everything {
            self.touched.insert(node);
            self.whole.insert(node);
        }
    }

    /// `node` has a new end (a restart): whatever it was examined with is void.
    pub(super) fn new_end(&mut self, node: NodeId) {
        self.whole(node);
        self.examined_as.remove(&node);
    }
}

/// Registries whose consistency scan covers up to this many entries assert it after every
/// change.
const REGISTRY_CHECK_EVERY_CHANGE_UP_TO: usize = 64;

/// Beyond [`REGISTRY_CHECK_EVERY_CHANGE_UP_TO`] entries, what one change pays for: a check
/// scans `size` entries ([`Registry::invariant_scan_size`]) once every `size /
/// REGISTRY_SCAN_PER_CHANGE` changes.
const REGISTRY_SCAN_PER_CHANGE: usize = 4;

/// The registry's own consistency ([`Registry::check_invariants`], a scan of every member and
/// object) after its changes: after each one while the scan covers up to
/// [`REGISTRY_CHECK_EVERY_CHANGE_UP_TO`] entries; beyond, once every `size /
/// REGISTRY_SCAN_PER_CHANGE` changes, where `size` counts the entries the last check scanned
/// (members, locations, subscriptions, held-back requests, replication records) or the members,
/// if more: so a change costs the same whatever the cluster's size and however many objects and
/// waiting fetches it holds. And at the end of every run. (A registry of up to 64 members was
/// checked after every change whatever it held: 50 nodes holding a few thousand objects spent
/// three quarters of a run there.)
#[derive(Debug, Default)]
pub(super) struct RegistryChecks {
    changes_since_check: usize,
    /// Entries the last check scanned (0 before the first).
    last_size: usize,
}

impl RegistryChecks {
    pub(super) fn after_change(&mut self, registry: &Registry) {
        self.changes_since_check += 1;
        let members = registry.registrations().size_hint().0;
        let size = members.max(self.last_size);
        let due = size <= REGISTRY_CHECK_EVERY_CHANGE_UP_TO
            || self.changes_since_check * REGISTRY_SCAN_PER_CHANGE >= size;
        if due {
            registry.check_invariants();
            self.changes_since_check = 0;
            self.last_size = registry.invariant_scan_size();
        }
    }

    /// Checks `registry` if it changed since its last check: before a head crash loses it, at
    /// the end of a run. The next change is checked at once (a new head's registry starts
    /// empty), and measures the registry again.
    pub(super) fn settle(&mut self, registry: &Registry) {
        if self.changes_since_check > 0 {
            registry.check_invariants();
            self.changes_since_check = 0;
        }
        self.last_size = 0;
    }
}

impl SimDirectory {
    // ---- Checks ----

    /// Changes to the registry since its consistency was last checked.
    pub fn registry_changes_unchecked(&self) -> usize {
        self.registry_checks.changes_since_check
    }

    /// Checks the registry's consistency if it changed since its last check (see
    /// [`RegistryChecks`]): the end of a run calls it.
    pub fn settle_registry_checks(&mut self) {
        if let Some(registry) = &self.registry {
            self.registry_checks.settle(registry);
        }
    }

    /// The registry, when the head is up.
    pub fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// The copies of record of `id` the registry counted when it told `node` its copy is
    /// surplus (taken as the notice arrives), or, for a notice not seen leaving, what it counts
    /// now.
    pub fn take_surplus_counted(&mut self, node: NodeId, id: &ObjectId) -> Vec<NodeId> {
        self.surplus_counted
            .remove(&(node, *id))
            .or_else(|| {
                self.registry
                    .as_ref()
                    .and_then(|registry| registry.copies_of_record(id))
                    .map(|(_, nodes)| nodes)
            })
            .unwrap_or_default()
    }

    /// How many nodes' subscriptions the per-event checks examined so far, all together (the
    /// checks' cost: a few per event, whatever the cluster's size).
    pub fn nodes_examined(&self) -> u64 {
        self.watch.nodes_examined
    }

    /// How many waited-for objects the per-event checks examined so far, all nodes together
    /// (a few per event, however many objects the nodes wait for).
    pub fn objects_examined(&self) -> u64 {
        self.watch.objects_examined
    }

    /// Whether `node`'s session is registered with the head.
    pub fn is_registered(&self, node: NodeId) -> bool {
        self.ends.get(&node).is_some_and(|e| e.session.is_up())
    }

    /// The safety checks that hold at every moment; one line per violation, each reported
    /// once. Incremental: a connection's silence is looked at when it outgrows the bound, a
    /// node's subscriptions when something of the node, its session or its connection moved
    /// since the last check (see [`CheckWatch`]); what it finds is what a scan of everything
    /// after every event finds (small clusters cross-check that in debug builds).
    pub fn check(&mut self, now: Instant) -> Vec<String> {
        let mut found = Vec::new();
        self.find_outlived_since_last_check(now, &mut found);
        let everything = std::mem::take(&mut self.watch.everything);
        let nodes: Vec<NodeId> = if everything {
            self.watch.touched.clear();
            self.watch.changed.clear();
            self.watch.whole.clear();
            self.watch.examined_as.clear();
            self.ends.keys().copied().collect()
        } else {
            std::mem::take(&mut self.watch.touched)
                .into_iter()
                .collect()
        };
        for node in nodes {
            let changed = self.watch.changed.remove(&node);
            let whole = self.watch.whole.remove(&node);
            let Some(end) = self.ends.get(&node) else {
                self.watch.nodes_examined += 1;
                self.watch.examined_as.remove(&node);
                continue;
            };
            if end.relied.is_empty() {
                // Nothing to forget; the next object it waits for is examined with all others
                // (none), whatever changed meanwhile.
                self.watch.examined_as.remove(&node);
                continue;
            }
            let registry_side = self.registry_side(node, end);
            let examined_as = (end.inc, registry_side.map(|(_, conn)| conn));
            let stamp = registry_side.and_then(|(registry, _)| registry.subscriptions_stamp(node));
            let known = end.known;
            let whole = everything
                || whole
                || self.watch.examined_as.get(&node) != Some(&examined_as)
                || end.session.subscription_changes() != known.session.0
                || (registry_side.is_some() && stamp != known.registry);
            if whole {
                let objects = end.relied.len() as u64;
                self.find_forgotten_subscriptions(node, end, registry_side, &mut found);
                let session = end.session.subscription_changes();
                let waited = end.session.waited_for().len();
                self.watch.examined_as.insert(node, examined_as);
                let end = self.ends.get_mut(&node).expect("present");
                end.known.session = (session, waited);
                end.known.registry = stamp;
                self.watch.objects_examined += objects;
            } else {
                let Some(mut ids) = changed else {
                    continue;
                };
                ids.sort_unstable();
                ids.dedup();
                for id in &ids {
                    self.find_forgotten_subscription(node, end, registry_side, id, &mut found);
                }
                self.watch.objects_examined += ids.len() as u64;
            }
            self.watch.nodes_examined += 1;
        }
        let mut violations = Vec::new();
        for (key, violation) in found {
            if self.reported.insert(key) {
                violations.push(violation);
            }
        }
        #[cfg(debug_assertions)]
        if self.ends.len() <= CROSS_CHECK_MAX_NODES {
            for (key, violation) in self.find_violations(now) {
                assert!(
                    self.reported.contains(&key),
                    "the incremental directory check missed: {violation}"
                );
            }
        }
        violations
    }

    /// Every violation at `now`, by a scan of every registration and every node.
    #[cfg(debug_assertions)]
    pub(super) fn find_violations(&self, now: Instant) -> Vec<(ViolationKey, String)> {
        let mut violations = Vec::new();
        // Dead nodes vanish within the heartbeat bound.
        if let Some(registry) = &self.registry {
            for (node, incarnation, conn) in registry.registrations() {
                let heard = self.last_heard.get(&conn).copied().unwrap_or(Instant::ZERO);
                if now > heard + self.params.registry_heartbeat_timeout {
                    violations.push(self.outlived(now, node, incarnation, conn, heard));
                }
            }
        }
        // No fetch waits on a subscription the directory forgot.
        for (node, end) in &self.ends {
            let registry_side = self.registry_side(*node, end);
            self.find_forgotten_subscriptions(*node, end, registry_side, &mut violations);
        }
        violations
    }

    /// Registrations whose connection has been silent beyond the heartbeat bound since the
    /// last check. A connection leaves the watch once its silence outgrew the bound: only a
    /// message on it (which puts it back) can register it again.
    fn find_outlived_since_last_check(
        &mut self,
        now: Instant,
        found: &mut Vec<(ViolationKey, String)>,
    ) {
        let bound = self.params.registry_heartbeat_timeout;
        while let Some(&(heard, conn)) = self.watch.by_silence.first() {
            if now <= heard + bound {
                break;
            }
            self.watch.by_silence.pop_first();
            let (Some(registry), Some(&(node, _))) = (&self.registry, self.owners.get(&conn))
            else {
                continue;
            };
            if registry.connection_of(node) == Some(conn) {
                let incarnation = registry.member(node).map_or(0, |m| m.incarnation);
                found.push(self.outlived(now, node, incarnation, conn, heard));
            }
        }
    }

    fn outlived(
        &self,
        now: Instant,
        node: NodeId,
        incarnation: u32,
        conn: ConnId,
        heard: Instant,
    ) -> (ViolationKey, String) {
        let bound = self.params.registry_heartbeat_timeout;
        (
            ViolationKey::Outlived(node, conn),
            format!(
                "directory: {node} (incarnation {incarnation}) still listed {} us after it was \
                 last heard at {heard}, beyond the heartbeat bound of {} us",
                now.saturating_since(heard).as_micros(),
                bound.as_micros()
            ),
        )
    }

    /// The registry and `node`'s connection when the registry must hold the subscriptions the
    /// node's session holds: the session is up on a connection the head has not seen broken,
    /// registered on it, and not replaying. The same for every object the node waits for:
    /// decided once (whether the session replays is a scan of its requests in flight).
    fn registry_side(&self, node: NodeId, end: &NodeEnd) -> Option<(&Registry, ConnId)> {
        match (&self.registry, end.conn) {
            (Some(registry), Some(conn))
                if end.session.is_up()
                    && !self.broken.contains(&conn)
                    && registry.connection_of(node) == Some(conn)
                    && !end.session.replaying() =>
            {
                Some((registry, conn))
            }
            _ => None,
        }
    }

    /// A fetch of `node` waits on a subscription its session or the registry forgot.
    /// `registry_side` is [`SimDirectory::registry_side`] of the node's `end`.
    fn find_forgotten_subscriptions(
        &self,
        node: NodeId,
        end: &NodeEnd,
        registry_side: Option<(&Registry, ConnId)>,
        found: &mut Vec<(ViolationKey, String)>,
    ) {
        // Each set is walked once beside the sorted `relied` (a lookup per id cost more than
        // every other per-event check together in 1,000-node runs).
        let mut in_flight = SortedProbe::new(
            self.events_in_flight
                .range(
                    (node, ObjectId([0; OBJECT_ID_LEN]))..=(node, ObjectId([0xff; OBJECT_ID_LEN])),
                )
                .map(|((_, id), _)| id),
        );
        let mut session_waits = SortedProbe::new(end.session.waited_for());
        let mut registry_waits = registry_side
            .map(|(registry, conn)| (SortedProbe::new(registry.subscriptions_of(node)), conn));
        for id in &end.relied {
            if in_flight.contains(id) {
                continue;
            }
            if !session_waits.contains(id) {
                found.push(session_forgot(node, id));
                continue;
            }
            let Some((registry_waits, conn)) = &mut registry_waits else {
                continue;
            };
            let conn = *conn;
            if !registry_waits.contains(id) {
                found.push(registry_forgot(node, id, conn));
            }
        }
    }

    /// [`SimDirectory::find_forgotten_subscriptions`] for one object `id`.
    fn find_forgotten_subscription(
        &self,
        node: NodeId,
        end: &NodeEnd,
        registry_side: Option<(&Registry, ConnId)>,
        id: &ObjectId,
        found: &mut Vec<(ViolationKey, String)>,
    ) {
        if !end.relied.contains(id) || self.events_in_flight.contains_key(&(node, *id)) {
            return;
        }
        if !end.session.waits_for(id) {
            found.push(session_forgot(node, id));
        } else if let Some((registry, conn)) = registry_side {
            if !registry.is_subscribed(node, id) {
                found.push(registry_forgot(node, id, conn));
            }
        }
    }

    /// Accounts for what `node`'s session changed of its subscriptions since last asked: an
    /// object added names no object to examine (a subscription more cannot be forgotten), one
    /// removed is named by the hint the driver left; anything else makes the next check
    /// examine every object the node waits for.
    pub(super) fn account_session_changes(&mut self, node: NodeId) {
        let Some(end) = self.ends.get_mut(&node) else {
            return;
        };
        let hint = end.known.session_hint.take();
        let now = (
            end.session.subscription_changes(),
            end.session.waited_for().len(),
        );
        let (changes_before, waited_before) = end.known.session;
        if now == end.known.session {
            return;
        }
        end.known.session = now;
        let changes = now.0.wrapping_sub(changes_before);
        let grown = now.1 as i64 - waited_before as i64;
        if grown == changes as i64 || (changes == 1 && grown == 0) {
            // Only additions, or one change that left the set as it was.
            return;
        }
        match hint {
            Some(id) if changes == 1 && grown == -1 && !end.session.waits_for(&id) => {
                self.watch.changed(node, id)
            }
            _ => self.watch.whole(node),
        }
    }

    /// Accounts for the registry's change of `node`'s subscriptions to `id` (a subscribing
    /// lookup, an unsubscribe) if everything it changed before was accounted for:
    /// `stamp_before` is the node's stamp before the change.
    pub(super) fn account_registry_change(
        &mut self,
        node: NodeId,
        id: ObjectId,
        stamp_before: Option<u64>,
    ) {
        let stamp = self
            .registry
            .as_ref()
            .and_then(|registry| registry.subscriptions_stamp(node));
        if let Some(end) = self.ends.get_mut(&node) {
            if end.known.registry == stamp_before {
                end.known.registry = stamp;
            }
        }
        self.watch.changed(node, id);
    }

    /// The registry fired `node`'s subscription to `id` (it drops it as it sends the event).
    pub(super) fn account_fired(&mut self, node: NodeId, id: ObjectId) {
        let stamp = self
            .registry
            .as_ref()
            .and_then(|registry| registry.subscriptions_stamp(node));
        if let Some(end) = self.ends.get_mut(&node) {
            end.known.registry = stamp;
        }
        self.watch.changed(node, id);
    }

    /// Puts every connection the head heard from under watch (after a formation that filled
    /// `last_heard` directly).
    pub(super) fn watch_every_connection(&mut self) {
        let heard = self.last_heard.iter().map(|(conn, at)| (*at, *conn));
        self.watch.by_silence.extend(heard);
    }

    /// The head heard from `conn`.
    pub(super) fn heard(&mut self, conn: ConnId, now: Instant) {
        if let Some(before) = self.last_heard.insert(conn, now) {
            self.watch.by_silence.remove(&(before, conn));
        }
        self.watch.by_silence.insert((now, conn));
    }

    /// Whatever `event` changes: the node it concerns, or everyone's (the head's fate).
    pub(super) fn touch_event(&mut self, event: &DirEvent) {
        match event {
            DirEvent::ToHead { conn, .. } | DirEvent::HeadSeesClosed { conn, .. } => {
                self.touch_conn(*conn)
            }
            DirEvent::ToNode { node, .. }
            | DirEvent::NodeSeesClosed { node, .. }
            | DirEvent::Connected { node, .. }
            | DirEvent::SessionTimer { node, .. }
            | DirEvent::HeadPartition { node, .. } => self.watch.touch(*node),
            // Its outputs (closes, member lists) touch the nodes they reach; a member it drops
            // loses its registration, which ends what the checks ask of the registry.
            DirEvent::RegistryTimer { .. } => {}
            DirEvent::Head { .. } | DirEvent::Failover { .. } => self.watch.everything = true,
        }
    }

    /// Something of the owner of `conn` changed.
    pub(super) fn touch_conn(&mut self, conn: ConnId) {
        if let Some(&(node, _)) = self.owners.get(&conn) {
            self.watch.touch(node);
        }
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
            if end.members[..] != members[..] {
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

fn session_forgot(node: NodeId, id: &ObjectId) -> (ViolationKey, String) {
    (
        ViolationKey::SessionForgot(node, *id),
        format!(
            "{node} waits for {id} to be published, but its directory session forgot the \
             subscription"
        ),
    )
}

fn registry_forgot(node: NodeId, id: &ObjectId, conn: ConnId) -> (ViolationKey, String) {
    (
        ViolationKey::RegistryForgot(node, *id, conn),
        format!(
            "{node} waits for {id} to be published, but the directory forgot the subscription \
             ({conn}, registered and replayed)"
        ),
    )
}

/// Membership of ascending ids in a sorted sequence, by walking it once alongside them.
struct SortedProbe<'a, I: Iterator<Item = &'a ObjectId>> {
    ids: std::iter::Peekable<I>,
}

impl<'a, I: Iterator<Item = &'a ObjectId>> SortedProbe<'a, I> {
    fn new(ids: I) -> Self {
        SortedProbe {
            ids: ids.peekable(),
        }
    }

    /// Whether the sequence holds `id`; each call's `id` must be above the previous call's.
    fn contains(&mut self, id: &ObjectId) -> bool {
        while self.ids.next_if(|next| *next < id).is_some() {}
        self.ids.peek() == Some(&id)
    }
}
