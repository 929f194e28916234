//! Connection policy, a rule of the core: which peers this node dials, when, and what it knows
//! of each link.
//!
//! Each pair of live members has exactly one connection, opened by the higher id: a node
//! dials ([`NodeOutput::Connect`]) every member with a lower id it is not connected to, when
//! the membership changes and every [`DialPolicy::interval`] while one is missing. A peer that
//! could not be reached (its connection failed or was lost) is dialed again after
//! [`DialPolicy::first_backoff`], then twice that, … up to [`DialPolicy::max_backoff`], so a
//! node that is gone costs a dial every half minute, not two a second. A change of membership
//! (a node joined, left, or came back) dials at once again: the peer may be new.
//!
//! The driver carries a `Connect` out and reports the outcome as a peer connected or lost; it
//! may ignore a `Connect` for a peer it is already connecting to (the dial is repeated each
//! interval while the connection is not up).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::{ClusterMember, Node, NodeOutput, Timer};
use crate::ids::NodeId;
use crate::shared_list::SharedList;
use crate::time::Instant;

/// How the connection to a peer is set up, as its fabric reports it when the connection comes
/// up. The core adds what it decided about the link itself (the eager threshold) when it shows
/// the link, so nothing the core computes makes a round trip through a driver's text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerLink {
    /// What the fabric's handshake agreed on (device, lanes, MTU, measured round trips), in
    /// the fabric's words.
    pub negotiated: String,
}

impl fmt::Display for PeerLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.negotiated)
    }
}

/// When a node dials its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DialPolicy {
    /// How often missing connections are dialed again (subject to the back-off).
    pub interval: Duration,
    /// The wait before dialing a peer that could not be reached, after its first failure.
    pub first_backoff: Duration,
    /// The longest wait between two dials of an unreachable peer.
    pub max_backoff: Duration,
}

impl Default for DialPolicy {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl DialPolicy {
    /// The wait after `failures` failures in a row: the first back-off, doubled per further
    /// failure, at most the longest.
    pub fn backoff_after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.first_backoff
            .saturating_mul(2u32.pow(doublings))
            .min(self.max_backoff)
    }
}

/// A peer this node failed to reach, since it last was connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreachable {
    /// Failures since it was last connected (what a log reports).
    pub failures: u32,
    /// Not dialed again before this.
    pub next_dial: Instant,
    /// The back-off that ends at `next_dial`.
    pub retry_in: Duration,
    /// Failures since the back-off last started over (what the delay grows with).
    backoff_failures: u32,
}

/// The node's connection bookkeeping.
#[derive(Debug, Default)]
pub(super) struct Links {
    /// Live members the directory lists, sorted by node id.
    members: SharedList<ClusterMember>,
    /// Peers that could not be reached, with their back-off.
    unreachable: BTreeMap<NodeId, Unreachable>,
    /// What each peer's fabric negotiated, for as long as it is connected.
    negotiated: BTreeMap<NodeId, PeerLink>,
    /// The listed members with lower ids than this node's that are not connected: the peers
    /// it dials. Kept as connections come and go and the list changes, so neither a dialing
    /// round nor a connection coming up scans the member list (in an N-node cluster that
    /// forms, each of N nodes sees N changes and N connections).
    undialed: BTreeSet<NodeId>,
}

impl Node {
    /// `peer`'s state if this node failed to reach it since it was last connected: how many
    /// times, and when it is dialed again (for the driver's log).
    pub fn unreachable(&self, peer: NodeId) -> Option<Unreachable> {
        self.links.unreachable.get(&peer).copied()
    }

    /// What the fabric negotiated with `peer`, while connected.
    pub fn peer_link(&self, peer: NodeId) -> Option<&PeerLink> {
        self.links
            .negotiated
            .get(&peer)
            .filter(|_| self.peers.get(&peer).is_some_and(|p| p.connected))
    }

    /// How a member's link reads in a `nodes` reply: what the fabric negotiated, then what the
    /// core chose for it.
    pub(super) fn describe_link(&self, peer: NodeId) -> String {
        match (self.peer_link(peer), self.eager_threshold(peer)) {
            (Some(link), Some(threshold)) => format!("{link}, eager threshold {threshold}"),
            (Some(link), None) => link.to_string(),
            (None, _) => "not connected".into(),
        }
    }

    /// The directory's list of live members changed: a change dials every missing lower peer
    /// at once and starts their back-off over; peers no longer listed are forgotten. Returns
    /// the list sorted by node id (as the directory sends it, so no copy is made then). The list
    /// is not copied and only members that changed are looked at closely: a node hears every
    /// change of an N-node cluster, and N nodes do.
    pub(super) fn links_members(
        &mut self,
        members: SharedList<ClusterMember>,
    ) -> SharedList<ClusterMember> {
        let members = sorted_by_node(members);
        if members.same_list(&self.links.members) {
            return members;
        }
        let old = std::mem::replace(&mut self.links.members, members.clone());
        if !self.track_member_changes(&old, &members) {
            return members;
        }
        let now = self.now;
        self.links
            .unreachable
            .retain(|peer, _| members.binary_search_by_key(peer, |m| m.node).is_ok());
        for state in self.links.unreachable.values_mut() {
            state.backoff_failures = 0;
            state.next_dial = now;
            state.retry_in = Duration::ZERO;
        }
        self.dial_missing();
        members
    }

    /// The listed members with lower ids than this node's: those it dials.
    fn lower_members(&self) -> &[ClusterMember] {
        let me = self.config.node;
        let members = &self.links.members;
        &members[..members.partition_point(|m| m.node < me)]
    }

    /// The connection to `peer` is up: it is reachable again, and needs no more dialing.
    pub(super) fn links_up(&mut self, peer: NodeId) {
        self.links.unreachable.remove(&peer);
        self.links.undialed.remove(&peer);
        self.arm_dial_timer();
    }

    /// What the fabric negotiated with `peer`, whose connection is up.
    pub(super) fn links_negotiated(&mut self, peer: NodeId, link: PeerLink) {
        self.links.negotiated.insert(peer, link);
    }

    /// The connection to `peer` failed or was lost: it is dialed again after its back-off.
    pub(super) fn links_lost(&mut self, peer: NodeId) {
        let now = self.now;
        let policy = self.config.dial;
        self.links.negotiated.remove(&peer);
        if self
            .lower_members()
            .binary_search_by_key(&peer, |m| m.node)
            .is_ok()
        {
            self.links.undialed.insert(peer);
        }
        let state = self.links.unreachable.entry(peer).or_insert(Unreachable {
            failures: 0,
            next_dial: now,
            retry_in: Duration::ZERO,
            backoff_failures: 0,
        });
        state.failures += 1;
        state.backoff_failures += 1;
        state.retry_in = policy.backoff_after(state.backoff_failures);
        state.next_dial = now + state.retry_in;
        self.stats.peers_unreachable += u64::from(state.failures == 1);
        self.arm_dial_timer();
    }

    /// Dials every listed lower peer that is not connected and whose back-off allows it, then
    /// arms the next round while one is missing.
    pub(super) fn dial_missing(&mut self) {
        let now = self.now;
        let members = &self.links.members;
        let due: Vec<(NodeId, SocketAddr)> = self
            .links
            .undialed
            .iter()
            .filter(|peer| {
                self.links
                    .unreachable
                    .get(peer)
                    .is_none_or(|state| now >= state.next_dial)
            })
            .filter_map(|&peer| {
                let at = members.binary_search_by_key(&peer, |m| m.node).ok()?;
                Some((peer, members[at].address))
            })
            .collect();
        for (peer, address) in due {
            self.stats.dials += 1;
            self.push(NodeOutput::Connect { peer, address });
        }
        self.arm_dial_timer();
    }

    /// Arms the next dialing round when a listed lower peer is not connected, disarms it
    /// otherwise (a node with all its connections up sets no timer for them).
    fn arm_dial_timer(&mut self) {
        self.cancel_timer(Timer::Dial);
        if !self.links.undialed.is_empty() {
            self.set_timer(self.now + self.config.dial.interval, Timer::Dial);
        }
    }

    /// Brings the undialed set up to date with a new member list, walking the old and the new
    /// list side by side (both sorted by node id): a member no longer listed is forgotten, a new
    /// or restarted one is undialed unless connected. Returns whether any member changed the
    /// way it is dialed (joined, left, restarted or moved).
    fn track_member_changes(&mut self, old: &[ClusterMember], new: &[ClusterMember]) -> bool {
        let me = self.config.node;
        let (mut i, mut j) = (0, 0);
        let mut changed = false;
        while i < old.len() || j < new.len() {
            let (gone, came) = match (old.get(i), new.get(j)) {
                (Some(o), Some(n)) if o.node == n.node => {
                    i += 1;
                    j += 1;
                    if dialed_alike(n, o) {
                        continue;
                    }
                    (None, Some(n))
                }
                (Some(o), Some(n)) if o.node < n.node => {
                    i += 1;
                    (Some(o), None)
                }
                (Some(o), None) => {
                    i += 1;
                    (Some(o), None)
                }
                (_, Some(n)) => {
                    j += 1;
                    (None, Some(n))
                }
                (None, None) => unreachable!("the loop runs while a list has members left"),
            };
            changed = true;
            if let Some(o) = gone {
                self.links.undialed.remove(&o.node);
            }
            if let Some(n) = came {
                let connected = self.peers.get(&n.node).is_some_and(|p| p.connected);
                if n.node < me && !connected {
                    self.links.undialed.insert(n.node);
                }
            }
        }
        changed
    }

    /// Checks that the undialed set is exactly the listed lower members not connected.
    pub(super) fn check_links_invariants(&self) {
        let expected: BTreeSet<NodeId> = self
            .lower_members()
            .iter()
            .filter(|m| !self.peers.get(&m.node).is_some_and(|p| p.connected))
            .map(|m| m.node)
            .collect();
        assert_eq!(
            self.links.undialed, expected,
            "the undialed peers are the listed lower members not connected"
        );
    }
}

/// Whether two listings of a member dial it alike: the same start of it, at the same address.
fn dialed_alike(new: &ClusterMember, old: &ClusterMember) -> bool {
    new.node == old.node && new.incarnation == old.incarnation && new.address == old.address
}

/// `members` sorted by node id, one entry each (the last listed wins). The directory sends
/// them sorted; only a list that is not costs a copy.
fn sorted_by_node(members: SharedList<ClusterMember>) -> SharedList<ClusterMember> {
    if members.windows(2).all(|pair| pair[0].node < pair[1].node) {
        return members;
    }
    let mut sorted = members.to_vec();
    sorted.sort_by_key(|m| m.node);
    sorted.dedup_by(|later, earlier| {
        let duplicate = later.node == earlier.node;
        if duplicate {
            std::mem::swap(later, earlier);
        }
        duplicate
    });
    sorted.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{ClusterMember, NodeConfig, PathCosts, PeerParams};

    const ME: NodeId = NodeId(2);

    fn node() -> Node {
        Node::new(NodeConfig::new(ME, 1 << 20), Instant::ZERO)
    }

    fn member(n: u32) -> ClusterMember {
        ClusterMember {
            node: NodeId(n),
            incarnation: 0,
            address: SocketAddr::from(([10, 0, 0, n as u8], 7000)),
            fabric: "tcp".into(),
            failure_domain: String::new(),
        }
    }

    fn params() -> PeerParams {
        PeerParams {
            lanes: 1,
            costs: PathCosts::RDMA_DEFAULT,
        }
    }

    /// The peers dialed by the outputs so far.
    fn dials(node: &mut Node) -> Vec<NodeId> {
        let mut dialed = Vec::new();
        while let Some(output) = node.poll_output() {
            if let NodeOutput::Connect { peer, address } = output {
                assert_eq!(address, member(peer.0).address, "dialed where it listens");
                dialed.push(peer);
            }
        }
        dialed
    }

    fn at_secs(s: u64) -> Instant {
        Instant(s * 1_000_000_000)
    }

    #[test]
    fn the_higher_id_dials_the_lower_on_a_membership_change_and_then_each_interval() {
        let mut n = node();
        let members: SharedList<ClusterMember> =
            vec![member(0), member(1), member(2), member(3)].into();
        n.handle_directory_members(Instant::ZERO, members.clone());
        assert_eq!(dials(&mut n), [NodeId(0), NodeId(1)], "only lower ids");
        // The same membership again is no news.
        n.handle_directory_members(Instant::ZERO, members);
        assert_eq!(dials(&mut n), []);
        n.handle_peer_connected(Instant::ZERO, NodeId(0), params());
        // A second later only the one still missing is dialed again.
        assert_eq!(n.poll_timeout(), Some(at_secs(1)));
        n.handle_timeout(at_secs(1));
        assert_eq!(dials(&mut n), [NodeId(1)]);
        n.handle_peer_connected(at_secs(1), NodeId(1), params());
        assert_eq!(n.poll_timeout(), None, "nothing missing: no timer");
        assert_eq!(n.stats().dials, 3);
    }

    #[test]
    fn an_unreachable_peer_is_dialed_with_exponential_back_off_until_the_membership_changes() {
        let mut n = node();
        n.handle_directory_members(Instant::ZERO, vec![member(1), member(2)].into());
        assert_eq!(dials(&mut n), [NodeId(1)]);
        let mut now = Instant::ZERO;
        let mut gaps = Vec::new();
        let mut last_dial = now;
        for failure in 1..=7u32 {
            n.handle_peer_lost(now, NodeId(1));
            assert_eq!(n.unreachable(NodeId(1)).map(|u| u.failures), Some(failure));
            // Run the dial timer until it dials again.
            loop {
                now = n.poll_timeout().expect("a dial is pending");
                n.handle_timeout(now);
                if !dials(&mut n).is_empty() {
                    break;
                }
            }
            gaps.push(now.saturating_since(last_dial).as_secs());
            last_dial = now;
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(
            n.stats().peers_unreachable,
            1,
            "said once while it stays away"
        );
        // A change of membership dials at once and starts the back-off over.
        n.handle_peer_lost(now, NodeId(1));
        n.handle_directory_members(now, vec![member(1), member(2), member(3)].into());
        assert_eq!(dials(&mut n), [NodeId(1)]);
        n.handle_peer_lost(now, NodeId(1));
        let unreachable = n.unreachable(NodeId(1)).expect("still unreachable");
        assert_eq!(unreachable.failures, 9, "failures count on for the log");
        assert_eq!(unreachable.next_dial, now + Duration::from_secs(1));
        // Connected: reachable, and its link shows what the fabric and the core decided.
        n.handle_peer_connected(now, NodeId(1), params());
        n.handle_peer_link(
            now,
            NodeId(1),
            PeerLink {
                negotiated: "tcp, 1 lane".into(),
            },
        );
        assert_eq!(n.unreachable(NodeId(1)), None);
        let link = n.describe_link(NodeId(1));
        let threshold = n.eager_threshold(NodeId(1)).expect("connected");
        assert_eq!(link, format!("tcp, 1 lane, eager threshold {threshold}"));
        n.handle_peer_lost(now, NodeId(1));
        assert_eq!(n.describe_link(NodeId(1)), "not connected");
    }

    #[test]
    fn connections_up_before_a_listing_or_across_a_restart_are_not_dialed() {
        let mut n = node();
        // Connected before the directory lists it: nothing to dial for it then.
        n.handle_peer_connected(Instant::ZERO, NodeId(0), params());
        n.handle_directory_members(Instant::ZERO, vec![member(0), member(1), member(2)].into());
        n.check_invariants();
        assert_eq!(dials(&mut n), [NodeId(1)]);
        // Listed again as restarted while its connection is up: still nothing to dial.
        let mut restarted = member(0);
        restarted.incarnation = 1;
        n.handle_directory_members(Instant::ZERO, vec![restarted, member(1), member(2)].into());
        n.check_invariants();
        assert_eq!(dials(&mut n), [NodeId(1)], "only the one still missing");
        // Both up: no dialing round is left.
        n.handle_peer_connected(Instant::ZERO, NodeId(1), params());
        n.check_invariants();
        assert_eq!(n.poll_timeout(), None);
        // Lost: dialed again at its back-off, and only it.
        n.handle_peer_lost(Instant::ZERO, NodeId(0));
        n.check_invariants();
        let due = n.poll_timeout().expect("a dial is pending");
        n.handle_timeout(due);
        assert_eq!(dials(&mut n), [NodeId(0)]);
        // A member that left while missing is no longer dialed.
        n.handle_directory_members(due, vec![member(1), member(2)].into());
        n.check_invariants();
        assert_eq!(dials(&mut n), []);
        assert_eq!(n.poll_timeout(), None, "nothing missing: no timer");
    }

    #[test]
    fn a_peer_that_left_the_membership_is_forgotten_and_not_dialed() {
        let mut n = node();
        n.handle_directory_members(Instant::ZERO, vec![member(0), member(1), member(2)].into());
        assert_eq!(dials(&mut n), [NodeId(0), NodeId(1)]);
        n.handle_peer_lost(Instant::ZERO, NodeId(0));
        n.handle_directory_members(Instant::ZERO, vec![member(1), member(2)].into());
        assert_eq!(n.unreachable(NodeId(0)), None, "forgotten");
        assert_eq!(dials(&mut n), [NodeId(1)]);
        n.handle_timeout(at_secs(100));
        assert_eq!(dials(&mut n), [NodeId(1)]);
    }

    #[test]
    fn an_unsorted_list_is_read_sorted_and_an_equal_one_is_no_news() {
        let mut n = node();
        let unsorted = vec![member(3), member(1), member(2), member(0), member(1)];
        n.handle_directory_members(Instant::ZERO, unsorted.into());
        assert_eq!(
            dials(&mut n),
            [NodeId(0), NodeId(1)],
            "lower ids, once each"
        );
        let listed: Vec<NodeId> = n.cluster_members().iter().map(|m| m.node).collect();
        assert_eq!(listed, [NodeId(0), NodeId(1), NodeId(2), NodeId(3)]);
        n.handle_peer_lost(Instant::ZERO, NodeId(0));
        // Another list with the same members does not start the back-off over.
        let equal = vec![member(0), member(1), member(2), member(3)];
        n.handle_directory_members(Instant::ZERO, equal.into());
        assert_eq!(dials(&mut n), []);
        // A member that restarted (another incarnation) is news: dialed at once.
        let mut restarted = member(0);
        restarted.incarnation = 1;
        let changed = vec![restarted, member(1), member(2), member(3)];
        n.handle_directory_members(Instant::ZERO, changed.into());
        assert_eq!(dials(&mut n), [NodeId(0), NodeId(1)]);
    }
}
