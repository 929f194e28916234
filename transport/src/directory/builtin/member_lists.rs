//! What the head sends each node when the member list changes: the changes from the list the
//! node has, or the whole list (see [`skyriver_core::registry::member_changes`]).
//!
//! The registry numbers its lists. [`MemberLists`] keeps the latest, and the changes from the
//! one before when the registry went one step; each message form is encoded once and shared by
//! every connection it goes to. A connection's queue ([`super::out_queue`]) remembers which list
//! it was last given and asks for the form that fits: a node that has list `e - 1` gets the
//! changes to `e` (one entry per join or departure), any other (a new connection, one whose
//! lists were merged away) the whole list. So a join costs the head about N small frames, not
//! N lists of N members.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use skyriver_core::directory::MemberList;
use skyriver_core::registry::member_changes::{
    member_changes, merge_member_changes, MemberChanges,
};
use skyriver_core::registry::FromRegistry;

use super::super::frame;
use super::out_queue::Frame;

/// How many member-list messages the head queued, and their bytes (before lists waiting in a
/// slow node's queue merge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberListStats {
    /// Whole lists.
    pub whole: u64,
    /// Changes from one list to the next.
    pub changes: u64,
    /// Bytes of both, frame headers included.
    pub bytes: u64,
}

/// [`MemberListStats`] shared with whoever shows them.
#[derive(Debug, Default)]
pub(super) struct MemberListCounters {
    whole: AtomicU64,
    changes: AtomicU64,
    bytes: AtomicU64,
}

impl MemberListCounters {
    pub(super) fn stats(&self) -> MemberListStats {
        MemberListStats {
            whole: self.whole.load(Ordering::Relaxed),
            changes: self.changes.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The registry's latest member list, with its two encodings made on demand.
#[derive(Debug, Default)]
pub(super) struct MemberLists {
    /// What was queued so far.
    pub(super) counters: Arc<MemberListCounters>,
    epoch: u64,
    members: MemberList,
    /// What turned list `epoch - 1` into this one, when the head saw both.
    changes: Option<MemberChanges>,
    whole_frame: Option<Frame>,
    changes_frame: Option<Frame>,
}

impl MemberLists {
    /// The registry output list `epoch`. A list sent again under the same number (to a node
    /// that reconnected) changes nothing here.
    pub(super) fn update(&mut self, epoch: u64, members: MemberList) {
        if epoch == self.epoch && (members.same_list(&self.members) || members == self.members) {
            return;
        }
        self.changes = (epoch == self.epoch + 1).then(|| member_changes(&self.members, &members));
        self.epoch = epoch;
        self.members = members;
        self.whole_frame = None;
        self.changes_frame = None;
    }

    /// What to queue for a node that was last given list `has` (`None`: none yet).
    pub(super) fn for_node(&mut self, has: Option<u64>) -> QueuedList {
        match &self.changes {
            Some(changes) if has == Some(self.epoch - 1) => {
                let (from, to) = (self.epoch - 1, self.epoch);
                let frame = self
                    .changes_frame
                    .get_or_insert_with(|| changes_frame(from, to, changes))
                    .clone();
                self.counters.changes.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes
                    .fetch_add(frame.len() as u64, Ordering::Relaxed);
                QueuedList {
                    epoch: self.epoch,
                    members: self.members.clone(),
                    changes: Some((from, changes.clone())),
                    frame,
                }
            }
            _ => {
                let frame = self
                    .whole_frame
                    .get_or_insert_with(|| whole_frame(self.epoch, &self.members))
                    .clone();
                self.counters.whole.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes
                    .fetch_add(frame.len() as u64, Ordering::Relaxed);
                QueuedList {
                    epoch: self.epoch,
                    members: self.members.clone(),
                    changes: None,
                    frame,
                }
            }
        }
    }
}

/// A member list queued for one node: list `epoch`, as changes from list `changes.0` or whole.
#[derive(Debug, Clone)]
pub(super) struct QueuedList {
    epoch: u64,
    /// The whole list `epoch` (shared), to send instead when changes pile up.
    members: MemberList,
    changes: Option<(u64, MemberChanges)>,
    /// The encoded message.
    pub(super) frame: Frame,
}

impl QueuedList {
    /// Takes the place of this list, still waiting, with `newer` (queued right behind it):
    /// afterwards it brings the node from what it had before this one to `newer`'s list.
    pub(super) fn absorb(&mut self, newer: QueuedList) {
        let Some((from, newer_changes)) = &newer.changes else {
            // Whole: it needs nothing from this one.
            *self = newer;
            return;
        };
        debug_assert_eq!(*from, self.epoch, "changes queued behind another list");
        *self = match &self.changes {
            Some((first, changes)) if *from == self.epoch => {
                let merged = merge_member_changes(changes, newer_changes);
                if merged.len() < newer.members.len() {
                    QueuedList {
                        frame: changes_frame(*first, newer.epoch, &merged),
                        changes: Some((*first, merged)),
                        ..newer
                    }
                } else {
                    QueuedList::whole(newer)
                }
            }
            _ => QueuedList::whole(newer),
        };
    }

    /// `list` sent whole.
    fn whole(list: QueuedList) -> QueuedList {
        QueuedList {
            frame: whole_frame(list.epoch, &list.members),
            changes: None,
            ..list
        }
    }

    /// The list it brings the node to.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }
}

fn whole_frame(epoch: u64, members: &MemberList) -> Frame {
    let members = members.clone();
    frame::encode(&FromRegistry::Members { epoch, members }).into()
}

fn changes_frame(from: u64, to: u64, changes: &MemberChanges) -> Frame {
    let changes = changes.clone();
    frame::encode(&FromRegistry::MembersChanged { from, to, changes }).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::directory::MemberInfo;
    use skyriver_core::NodeId;

    fn member(node: u32) -> MemberInfo {
        MemberInfo {
            node: NodeId(node),
            fabric_addr: "127.0.0.1:7000".parse().unwrap(),
            fabric: "tcp".into(),
            incarnation: 1,
            failure_domain: String::new(),
        }
    }

    fn list(nodes: std::ops::Range<u32>) -> MemberList {
        nodes.map(member).collect()
    }

    fn decoded(queued: &QueuedList) -> FromRegistry {
        postcard::from_bytes(&queued.frame[4..]).unwrap()
    }

    #[test]
    fn a_node_with_the_previous_list_gets_the_changes_any_other_the_whole_list() {
        let mut lists = MemberLists::default();
        lists.update(1, list(0..1));
        lists.update(2, list(0..2));
        let behind = lists.for_node(Some(1));
        assert!(matches!(
            decoded(&behind),
            FromRegistry::MembersChanged { from: 1, to: 2, changes } if changes.len() == 1
        ));
        let new = lists.for_node(None);
        assert!(matches!(
            decoded(&new),
            FromRegistry::Members { epoch: 2, members } if members == list(0..2)
        ));
        let lagging = lists.for_node(Some(0));
        assert!(matches!(
            decoded(&lagging),
            FromRegistry::Members { epoch: 2, .. }
        ));
        // The same list again (to a reconnected node) keeps its number and its changes.
        lists.update(2, list(0..2));
        assert!(matches!(
            decoded(&lists.for_node(Some(1))),
            FromRegistry::MembersChanged { from: 1, to: 2, .. }
        ));
        // A jump of more than one list (the head saw no list between): whole lists only.
        lists.update(5, list(0..3));
        assert!(matches!(
            decoded(&lists.for_node(Some(4))),
            FromRegistry::Members { epoch: 5, .. }
        ));
    }

    #[test]
    fn waiting_changes_absorb_the_next_and_turn_whole_when_that_is_smaller() {
        let mut lists = MemberLists::default();
        lists.update(1, list(0..4));
        lists.update(2, list(0..5));
        let mut waiting = lists.for_node(Some(1));
        lists.update(3, list(1..5));
        waiting.absorb(lists.for_node(Some(2)));
        assert_eq!(waiting.epoch(), 3);
        match decoded(&waiting) {
            FromRegistry::MembersChanged { from, to, changes } => {
                assert_eq!((from, to), (1, 3));
                let nodes: Vec<NodeId> = changes.iter().map(|c| c.node()).collect();
                assert_eq!(nodes, vec![NodeId(0), NodeId(4)]);
            }
            other => panic!("expected changes, got {other}"),
        }
        // Changes that touch as many nodes as the list has: the list instead.
        lists.update(4, list(10..12));
        waiting.absorb(lists.for_node(Some(3)));
        assert!(matches!(
            decoded(&waiting),
            FromRegistry::Members { epoch: 4, members } if members == list(10..12)
        ));
        // A whole list waiting absorbs changes into the whole newer list.
        lists.update(5, list(10..13));
        waiting.absorb(lists.for_node(Some(4)));
        assert!(matches!(
            decoded(&waiting),
            FromRegistry::Members { epoch: 5, members } if members == list(10..13)
        ));
    }
}
