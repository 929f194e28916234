//! Member lists as changes: what the head sends a node that already has the previous list.
//!
//! Every node keeps the list of live members. Sending the whole list at every join and
//! departure costs about 80·N bytes per node, 80·N² per change: 8 GB at 10,000 nodes, which
//! no head forms a cluster through. A node that has list `e` needs only what changed to get
//! list `e + 1`: one entry for a join, a node id for a departure. So the registry numbers its
//! lists (an *epoch*, one more at each change), the head sends a node its first list whole and
//! then [`FromRegistry::MembersChanged`](super::wire::FromRegistry::MembersChanged) from epoch to
//! epoch, and a node that finds a change not starting at the epoch it has drops the connection
//! (the next one starts with a whole list).
//!
//! The three functions here are the whole algebra, all linear merges of lists sorted by node:
//! [`member_changes`] (what turns one list into another), [`apply_member_changes`] (the other
//! list back from the first and the changes) and [`merge_member_changes`] (two successive
//! changes as one, for a node that fell a few lists behind).

use serde::{Deserialize, Serialize};

use crate::directory::{MemberInfo, MemberList};
use crate::ids::NodeId;
use crate::shared_list::SharedList;

/// One node's entry changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberChange {
    /// The node is listed with this entry: it joined, or replaces its entry (a restart).
    Listed(MemberInfo),
    /// The node is no longer listed.
    Left(NodeId),
}

impl MemberChange {
    /// The node whose entry changed.
    pub fn node(&self) -> NodeId {
        match self {
            MemberChange::Listed(member) => member.node,
            MemberChange::Left(node) => *node,
        }
    }
}

/// Changes to a member list, sorted by node, at most one per node.
pub type MemberChanges = SharedList<MemberChange>;

/// What turns `old` into `new` (both sorted by node id): a [`MemberChange::Listed`] for each
/// entry of `new` that `old` lacks or has otherwise, a [`MemberChange::Left`] for each node
/// only `old` lists.
pub fn member_changes(old: &[MemberInfo], new: &[MemberInfo]) -> MemberChanges {
    let mut changes = Vec::new();
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (Some(a), Some(b)) if a.node == b.node => {
                if a != b {
                    changes.push(MemberChange::Listed((*b).clone()));
                }
                o.next();
                n.next();
            }
            (Some(a), Some(b)) if a.node < b.node => {
                changes.push(MemberChange::Left(a.node));
                o.next();
            }
            (_, Some(b)) => {
                changes.push(MemberChange::Listed((*b).clone()));
                n.next();
            }
            (Some(a), None) => {
                changes.push(MemberChange::Left(a.node));
                o.next();
            }
            (None, None) => return changes.into(),
        }
    }
}

/// `list` (sorted by node id) with `changes` made: total, so a departure of a node the list
/// does not have changes nothing (merged changes can say so).
pub fn apply_member_changes(list: &[MemberInfo], changes: &[MemberChange]) -> MemberList {
    let mut out = Vec::with_capacity(list.len() + changes.len());
    let mut entries = list.iter().peekable();
    for change in changes {
        let node = change.node();
        while let Some(entry) = entries.next_if(|e| e.node < node) {
            out.push(entry.clone());
        }
        entries.next_if(|e| e.node == node);
        if let MemberChange::Listed(member) = change {
            out.push(member.clone());
        }
    }
    out.extend(entries.cloned());
    out.into()
}

/// `first` then `then` as one set of changes: per node, the later change wins.
pub fn merge_member_changes(first: &[MemberChange], then: &[MemberChange]) -> MemberChanges {
    let mut out = Vec::with_capacity(first.len() + then.len());
    let (mut a, mut b) = (first.iter().peekable(), then.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.node() == y.node() => {
                out.push((*y).clone());
                a.next();
                b.next();
            }
            (Some(x), Some(y)) if x.node() < y.node() => {
                out.push((*x).clone());
                a.next();
            }
            (_, Some(y)) => {
                out.push((*y).clone());
                b.next();
            }
            (Some(x), None) => {
                out.push((*x).clone());
                a.next();
            }
            (None, None) => return out.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(node: u32, incarnation: u32) -> MemberInfo {
        MemberInfo {
            node: NodeId(node),
            fabric_addr: format!("10.0.0.{}:7000", node % 250).parse().unwrap(),
            fabric: "tcp".into(),
            incarnation,
            failure_domain: String::new(),
        }
    }

    /// A list of members sorted by node: node ids below 24, incarnations below 3.
    fn list() -> impl Strategy<Value = Vec<MemberInfo>> {
        proptest::collection::btree_map(0u32..24, 0u32..3, 0..16)
            .prop_map(|m| m.into_iter().map(|(n, i)| member(n, i)).collect())
    }

    #[test]
    fn a_join_a_restart_and_a_departure_are_one_entry_each() {
        let old = [member(1, 0), member(3, 0), member(5, 0)];
        let new = [member(1, 0), member(2, 0), member(3, 1)];
        let changes = member_changes(&old, &new);
        assert_eq!(
            &changes[..],
            &[
                MemberChange::Listed(member(2, 0)),
                MemberChange::Listed(member(3, 1)),
                MemberChange::Left(NodeId(5)),
            ]
        );
        assert_eq!(&apply_member_changes(&old, &changes)[..], &new[..]);
    }

    proptest! {
        #[test]
        fn changes_turn_the_old_list_into_the_new(old in list(), new in list()) {
            let changes = member_changes(&old, &new);
            prop_assert_eq!(&apply_member_changes(&old, &changes)[..], &new[..]);
            prop_assert!(changes.windows(2).all(|w| w[0].node() < w[1].node()));
            if old == new {
                prop_assert!(changes.is_empty());
            }
        }

        #[test]
        fn merged_changes_do_what_both_do_in_turn(a in list(), b in list(), c in list()) {
            let first = member_changes(&a, &b);
            let then = member_changes(&b, &c);
            let merged = merge_member_changes(&first, &then);
            prop_assert_eq!(&apply_member_changes(&a, &merged)[..], &c[..]);
            prop_assert!(merged.windows(2).all(|w| w[0].node() < w[1].node()));
        }
    }
}
