//! What the head sends each node when the member list changes: the changes from the list the
//! node has, or the whole list (see [`skyriver_core::registry::member_changes`]).
//!
//! The registry numbers its lists. [`MemberLists`] keeps the latest, and the changes from the
//! one before when the registry went one step; each message form is encoded once and shared by
//! every connection it goes to. A connection's queue ([`super::out_queue`]) remembers which list
//! it was last given: a node that has list `e - 1` gets the changes to `e` (one entry per join
//! or departure), any other (a new connection, or one that fell behind while lists piled up in
//! its queue) the whole list. So a join costs the head about N small frames, not N lists of N
//! members, and a node that cannot keep up costs it nothing per change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use skyriver_core::directory::MemberList;
use skyriver_core::registry::member_changes::{
    member_changes, merge_member_changes, MemberChanges,
};
use skyriver_core::registry::FromRegistry;

use super::super::frame;
use super::out_queue::Frame;

/// How many member-list messages the head's writers wrote to nodes, and their bytes.
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

/// Steps of the latest lists a node a few steps behind is sent, merged, instead of the whole
/// list.
const RECENT_STEPS: usize = 64;

/// One list the head published (see [`MemberLists::update`]) and its encodings: the changes
/// from the list published before, made with the list (small), the whole list, made the first
/// time a writer needs it (once per list), and the merged changes from older lists, made once
/// per older list a node needs them from.
#[derive(Debug)]
struct ListSnapshot {
    epoch: u64,
    members: MemberList,
    /// The changes from the list published before this one (the last of `recent`), encoded.
    step: Option<Frame>,
    /// The last steps up to this list, oldest first: each the list it starts from and its
    /// changes (at most [`RECENT_STEPS`]).
    recent: Arc<[(u64, MemberChanges)]>,
    whole: OnceLock<Frame>,
    /// Merged changes made for nodes that have an older list, by that list (`None`: the
    /// whole list is smaller, or the list is too old).
    merged: Mutex<Vec<(u64, Option<Frame>)>>,
}

impl ListSnapshot {
    /// The list the last step starts from: the list published before this one.
    fn previous(&self) -> Option<u64> {
        self.recent.last().map(|(from, _)| *from)
    }

    fn whole(&self) -> &Frame {
        self.whole.get_or_init(|| {
            let members = self.members.clone();
            let epoch = self.epoch;
            frame::encode(&FromRegistry::Members { epoch, members }).into()
        })
    }

    /// The changes from list `has` to this one, merged and encoded, if `has` starts one of
    /// the last [`RECENT_STEPS`] steps and the changes are smaller than the whole list.
    fn merged_from(&self, has: u64) -> Option<Frame> {
        // Nothing panics while the lock is held; a poisoned cache is still consistent.
        let mut cache = self.merged.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, frame)) = cache.iter().find(|(from, _)| *from == has) {
            return frame.clone();
        }
        let frame = self
            .recent
            .iter()
            .position(|(from, _)| *from == has)
            .and_then(|first| {
                let mut merged = MemberChanges::default();
                for (_, changes) in &self.recent[first..] {
                    merged = merge_member_changes(&merged, changes);
                }
                (merged.len() < self.members.len()).then(|| {
                    let message = FromRegistry::MembersChanged {
                        from: has,
                        to: self.epoch,
                        changes: merged,
                    };
                    Frame::from(frame::encode(&message))
                })
            });
        cache.push((has, frame.clone()));
        frame
    }
}

/// The member list the head last published to its writers.
#[derive(Debug)]
pub(super) struct MemberLists {
    /// What writers wrote so far.
    pub(super) counters: Arc<MemberListCounters>,
    latest: Arc<ListSnapshot>,
}

impl Default for MemberLists {
    fn default() -> Self {
        Self {
            counters: Arc::default(),
            latest: Arc::new(ListSnapshot {
                epoch: 0,
                members: MemberList::default(),
                step: None,
                recent: Arc::from(Vec::new()),
                whole: OnceLock::new(),
                merged: Mutex::default(),
            }),
        }
    }
}

impl MemberLists {
    /// Publishes the registry's list `epoch` (the latest when the head sends lists: lists
    /// output meanwhile were never sent, so a step may span several). A list sent again under
    /// the same number (to a node that reconnected) changes nothing here.
    pub(super) fn update(&mut self, epoch: u64, members: MemberList) {
        let latest = &self.latest;
        if epoch <= latest.epoch {
            debug_assert!(epoch < latest.epoch || members == latest.members);
            return;
        }
        let changes = member_changes(&latest.members, &members);
        let message = FromRegistry::MembersChanged {
            from: latest.epoch,
            to: epoch,
            changes: changes.clone(),
        };
        let kept = latest.recent.len().min(RECENT_STEPS - 1);
        let recent = latest.recent[latest.recent.len() - kept..]
            .iter()
            .cloned()
            .chain([(latest.epoch, changes)])
            .collect();
        self.latest = Arc::new(ListSnapshot {
            epoch,
            members,
            step: Some(frame::encode(&message).into()),
            recent,
            whole: OnceLock::new(),
            merged: Mutex::default(),
        });
    }

    /// What to queue for a node that was last given list `has` (`None`: none yet).
    pub(super) fn for_node(&self, has: Option<u64>) -> QueuedList {
        QueuedList {
            has,
            latest: self.latest.clone(),
            counters: self.counters.clone(),
        }
    }
}

/// The latest member list, queued for a node that has list `has`: encoded when the writer
/// takes it, as the changes if the node has the list right before, whole otherwise.
#[derive(Debug)]
pub(super) struct QueuedList {
    has: Option<u64>,
    latest: Arc<ListSnapshot>,
    counters: Arc<MemberListCounters>,
}

impl QueuedList {
    /// Takes the place of this list, still waiting, with `newer` (queued right behind it): the
    /// node then goes from the list it had before both to `newer`'s, in one message. O(1):
    /// a node that fell behind costs the head nothing per change until its writer takes the
    /// list; then it gets the changes since its list merged, if its list starts one of the
    /// last [`RECENT_STEPS`] steps, or else the whole list (each encoded once per list).
    pub(super) fn absorb(&mut self, newer: QueuedList) {
        self.latest = newer.latest;
    }

    /// The list it brings the node to.
    pub(super) fn epoch(&self) -> u64 {
        self.latest.epoch
    }

    /// The message, for the writer.
    pub(super) fn frame(&self) -> Frame {
        let latest = &self.latest;
        let changes = match (&latest.step, self.has) {
            (Some(step), Some(has)) if latest.previous() == Some(has) => Some(step.clone()),
            (_, Some(has)) => latest.merged_from(has),
            (_, None) => None,
        };
        let (frame, kind) = match changes {
            Some(frame) => (frame, &self.counters.changes),
            None => (latest.whole().clone(), &self.counters.whole),
        };
        kind.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        frame
    }
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
        postcard::from_bytes(&queued.frame()[4..]).unwrap()
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
        let stats = lists.counters.stats();
        assert_eq!((stats.whole, stats.changes), (3, 2));
    }

    #[test]
    fn a_waiting_list_absorbs_the_next_and_brings_the_changes_since_the_nodes_list() {
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
        let mut waiting = lists.for_node(Some(3));
        lists.update(5, list(10..13));
        waiting.absorb(lists.for_node(Some(4)));
        assert!(matches!(
            decoded(&waiting),
            FromRegistry::Members { epoch: 5, members } if members == list(10..13)
        ));
        // A node further behind than the changes kept: the whole list.
        let behind = lists.for_node(Some(5));
        for epoch in 6..=6 + RECENT_STEPS as u64 {
            lists.update(epoch, list(10..13 + epoch as u32));
        }
        let mut behind = behind;
        behind.absorb(lists.for_node(None));
        assert!(matches!(decoded(&behind), FromRegistry::Members { .. }));
        // A node given nothing yet absorbs into the latest whole list, too.
        let mut new = lists.for_node(None);
        let last = 7 + RECENT_STEPS as u64;
        lists.update(last, list(1..6));
        new.absorb(lists.for_node(Some(last - 1)));
        assert!(matches!(decoded(&new), FromRegistry::Members { epoch, .. } if epoch == last));
    }
}
