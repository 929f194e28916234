//! The simulated directory: object locations, node liveness and one-shot subscriptions. It can
//! be briefly unavailable (requests answered `Unavailable` or not at all).

use std::collections::{BTreeMap, BTreeSet};

use skyriver_core::directory::{DirectoryEvent, DirectoryReply, DirectoryRequest};
use skyriver_core::{NodeId, ObjectId, ObjectSizes};

/// What the directory does with one request.
#[derive(Debug)]
pub struct Served {
    /// The reply, if any.
    pub reply: Option<DirectoryReply>,
    /// Events for subscribers: (node, event).
    pub events: Vec<(NodeId, DirectoryEvent)>,
}

/// Locations and liveness.
#[derive(Debug, Default)]
pub struct Directory {
    locations: BTreeMap<ObjectId, (ObjectSizes, BTreeSet<NodeId>)>,
    subscriptions: BTreeMap<ObjectId, BTreeSet<NodeId>>,
    dead: BTreeSet<NodeId>,
}

impl Directory {
    /// Serves one request from a live node.
    pub fn serve(&mut self, from: NodeId, request: &DirectoryRequest) -> Served {
        let mut events = Vec::new();
        let reply = match request {
            DirectoryRequest::Lookup { id, subscribe } => {
                let (holders, sizes) = match self.locations.get(id) {
                    Some((sizes, holders)) => {
                        let live: Vec<NodeId> = holders
                            .iter()
                            .copied()
                            .filter(|h| !self.dead.contains(h))
                            .collect();
                        (live, Some(*sizes))
                    }
                    None => (Vec::new(), None),
                };
                if holders.is_empty() && *subscribe {
                    self.subscriptions.entry(*id).or_default().insert(from);
                }
                Some(DirectoryReply::Located { holders, sizes })
            }
            DirectoryRequest::Publish { id, sizes } => {
                let entry = self
                    .locations
                    .entry(*id)
                    .or_insert((*sizes, BTreeSet::new()));
                entry.0 = *sizes;
                entry.1.insert(from);
                for subscriber in self.subscriptions.remove(id).unwrap_or_default() {
                    events.push((
                        subscriber,
                        DirectoryEvent::Published {
                            id: *id,
                            holder: from,
                            sizes: *sizes,
                        },
                    ));
                }
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Withdraw { id } => {
                if let Some((_, holders)) = self.locations.get_mut(id) {
                    holders.remove(&from);
                    if holders.is_empty() {
                        self.locations.remove(id);
                    }
                }
                Some(DirectoryReply::Done)
            }
            DirectoryRequest::Unsubscribe { id } => {
                if let Some(subscribers) = self.subscriptions.get_mut(id) {
                    subscribers.remove(&from);
                    if subscribers.is_empty() {
                        self.subscriptions.remove(id);
                    }
                }
                None
            }
        };
        Served { reply, events }
    }

    /// A node's session expired: it is dead, its locations and subscriptions are gone.
    pub fn node_died(&mut self, node: NodeId) {
        self.dead.insert(node);
        self.locations.retain(|_, (_, holders)| {
            holders.remove(&node);
            !holders.is_empty()
        });
        self.subscriptions.retain(|_, subscribers| {
            subscribers.remove(&node);
            !subscribers.is_empty()
        });
    }

    /// A node (re)joined with an empty store.
    pub fn node_joined(&mut self, node: NodeId) {
        self.dead.remove(&node);
    }

    /// Whether the directory lists `node` as a holder of `id`.
    pub fn lists(&self, id: &ObjectId, node: NodeId) -> bool {
        self.locations
            .get(id)
            .is_some_and(|(_, h)| h.contains(&node))
    }
}
