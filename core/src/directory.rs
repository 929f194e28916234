//! The directory as the core sees it: requests are outputs, replies and events are inputs.
//!
//! The directory knows which nodes hold a sealed copy of each object (with its sizes) and which
//! nodes are alive. Backends (built-in, Redis) live in the driver; the core only names what it
//! wants and reacts to what comes back, so a slow or absent directory is an ordinary input
//! (`Unavailable`, or no reply before the op's timeout), never a blocked thread.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId};
use crate::shared_list::SharedList;
use crate::wire::ObjectSizes;

/// One directory operation of one node, echoed in its reply.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct DirectoryOpId(pub u64);

impl fmt::Display for DirectoryOpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dir-{}", self.0)
    }
}

/// What a node asks of the directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectoryRequest {
    /// Which live nodes hold `id`? With `subscribe`, and when none does, the directory also
    /// registers a one-shot subscription: the next publication of `id` is sent to this node as
    /// a [`DirectoryEvent::Published`]. Lookup and subscription are one atomic step, so a
    /// publication between them cannot be missed.
    Lookup {
        /// The object.
        id: ObjectId,
        /// Register a subscription when nobody holds it.
        subscribe: bool,
    },
    /// This node holds a sealed copy of `id`. Refused with [`DirectoryReply::Conflict`] when
    /// live holders published `id` with other sizes or another digest: one id names one
    /// content.
    Publish {
        /// The object.
        id: ObjectId,
        /// Its sizes.
        sizes: ObjectSizes,
        /// The digest of its bytes.
        digest: ContentDigest,
    },
    /// This node no longer holds `id`.
    Withdraw {
        /// The object.
        id: ObjectId,
    },
    /// Drop this node's subscription to `id`, if any. Needs no reply.
    Unsubscribe {
        /// The object.
        id: ObjectId,
    },
    /// `Publish` of a copy of record of an object that wants `replicas` copies on distinct
    /// failure domains: the registry places the missing copies (see
    /// [`DirectoryEvent::Replicate`]) and repairs them after losses. Answered as `Publish`.
    PublishReplicated {
        /// The object.
        id: ObjectId,
        /// Its sizes.
        sizes: ObjectSizes,
        /// The digest of its bytes.
        digest: ContentDigest,
        /// Copies wanted, this one included.
        replicas: u8,
        /// Free bytes of this node's store, for placement.
        free_bytes: u64,
    },
    /// Delete `id` everywhere: every holder is told to drop its copy
    /// ([`DirectoryEvent::Delete`]) and the object's replica record ends. Answered `Done`.
    DeleteEverywhere {
        /// The object.
        id: ObjectId,
    },
    /// This node was asked to hold a copy of record of `id` ([`DirectoryEvent::Replicate`]) and
    /// cannot (no room, its fetch failed, it holds other bytes under the id): the registry
    /// places the copy elsewhere at once rather than after the target timeout. Answered `Done`.
    DeclineReplica {
        /// The object.
        id: ObjectId,
    },
    /// `Lookup` (without a subscription) for `skyriver locate`: the registry answers
    /// [`DirectoryReply::CopiesLocated`], which also says which holders keep copies of record
    /// and how many the object wants. A directory that keeps no records (Redis) answers
    /// `Located`, as to a `Lookup`.
    LocateCopies {
        /// The object.
        id: ObjectId,
    },
}

impl fmt::Display for DirectoryRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectoryRequest::Lookup { id, subscribe } => {
                write!(
                    f,
                    "Lookup{{{id}{}}}",
                    if *subscribe { ", subscribe" } else { "" }
                )
            }
            DirectoryRequest::Publish { id, sizes, digest } => {
                write!(
                    f,
                    "Publish{{{id}, size={}+{}, digest={digest}}}",
                    sizes.data_size, sizes.metadata_size
                )
            }
            DirectoryRequest::Withdraw { id } => write!(f, "Withdraw{{{id}}}"),
            DirectoryRequest::Unsubscribe { id } => write!(f, "Unsubscribe{{{id}}}"),
            DirectoryRequest::PublishReplicated {
                id,
                sizes,
                digest,
                replicas,
                free_bytes,
            } => write!(
                f,
                "PublishReplicated{{{id}, size={}+{}, digest={digest}, replicas={replicas}, \
                 free={free_bytes}}}",
                sizes.data_size, sizes.metadata_size
            ),
            DirectoryRequest::DeleteEverywhere { id } => write!(f, "DeleteEverywhere{{{id}}}"),
            DirectoryRequest::DeclineReplica { id } => write!(f, "DeclineReplica{{{id}}}"),
            DirectoryRequest::LocateCopies { id } => write!(f, "LocateCopies{{{id}}}"),
        }
    }
}

/// The directory's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectoryReply {
    /// Answer to `Lookup`: the live holders (possibly none) and the object's sizes if known.
    Located {
        /// Nodes holding a sealed copy that the directory believes alive, in any order.
        holders: Vec<NodeId>,
        /// Sizes of the object, when any holder published it.
        sizes: Option<ObjectSizes>,
        /// The digest of its bytes, with the sizes.
        digest: Option<ContentDigest>,
    },
    /// Answer to `Publish` and `Withdraw`.
    Done,
    /// Answer to `Publish`: live holders published this id with another content, which keeps
    /// the id; the publication was refused.
    Conflict {
        /// The sizes the id names.
        sizes: ObjectSizes,
        /// The digest the id names.
        digest: ContentDigest,
    },
    /// The directory could not serve the request; try again later.
    Unavailable {
        /// Why, for logs.
        reason: String,
    },
    /// Answer to `LocateCopies`: `Located`, and the object's copies of record.
    CopiesLocated {
        /// Nodes holding a sealed copy that the directory believes alive, in any order.
        holders: Vec<NodeId>,
        /// Sizes of the object, when any holder published it.
        sizes: Option<ObjectSizes>,
        /// The digest of its bytes, with the sizes.
        digest: Option<ContentDigest>,
        /// Its copies of record, when it was put with more than one copy (and not deleted).
        of_record: Option<CopiesOfRecord>,
    },
}

/// The copies of record of an object, as the registry counts them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopiesOfRecord {
    /// Copies wanted, on distinct failure domains where there are enough.
    pub wanted: u8,
    /// The live nodes holding one, in node order.
    pub holders: Vec<NodeId>,
}

impl fmt::Display for DirectoryReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectoryReply::Located {
                holders,
                sizes,
                digest,
            } => {
                write!(f, "Located{{[")?;
                for (i, holder) in holders.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{holder}")?;
                }
                write!(f, "]")?;
                if let Some(sizes) = sizes {
                    write!(f, ", size={}+{}", sizes.data_size, sizes.metadata_size)?;
                }
                if let Some(digest) = digest {
                    write!(f, ", digest={digest}")?;
                }
                write!(f, "}}")
            }
            DirectoryReply::Done => write!(f, "Done"),
            DirectoryReply::Conflict { sizes, digest } => write!(
                f,
                "Conflict{{size={}+{}, digest={digest}}}",
                sizes.data_size, sizes.metadata_size
            ),
            DirectoryReply::Unavailable { reason } => write!(f, "Unavailable{{{reason:?}}}"),
            DirectoryReply::CopiesLocated {
                holders, of_record, ..
            } => {
                write!(f, "CopiesLocated{{{} holders", holders.len())?;
                if let Some(CopiesOfRecord { wanted, holders }) = of_record {
                    write!(f, ", {} of {wanted} of record", holders.len())?;
                }
                write!(f, "}}")
            }
        }
    }
}

/// Something the directory tells a node without being asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectoryEvent {
    /// An object this node subscribed to was published by `holder`.
    Published {
        /// The object.
        id: ObjectId,
        /// The node that now holds it.
        holder: NodeId,
        /// Its sizes.
        sizes: ObjectSizes,
        /// The digest of its bytes.
        digest: ContentDigest,
    },
    /// The registry places a copy of record of `id` on this node: fetch it from `sources`,
    /// keep it (never evicted, only deleted) and publish it with `PublishReplicated`.
    Replicate {
        /// The object.
        id: ObjectId,
        /// Its sizes.
        sizes: ObjectSizes,
        /// The digest of its bytes.
        digest: ContentDigest,
        /// Live holders to fetch from.
        sources: Vec<NodeId>,
        /// Copies the object wants.
        replicas: u8,
    },
    /// How many live copies of `id` the registry lists now (sent to the node that published
    /// the object with `PublishReplicated` first, at every change until it has them all).
    Copies {
        /// The object.
        id: ObjectId,
        /// Live copies.
        copies: u32,
    },
    /// `id` was deleted everywhere: drop this node's copy.
    Delete {
        /// The object.
        id: ObjectId,
    },
    /// The registry lists enough copies of record of `id` without this node's (it came back
    /// after it was counted lost, and repair replaced it): the copy here stops being one of
    /// record and stays as a plain copy, evictable like a cache.
    Surplus {
        /// The object.
        id: ObjectId,
    },
    /// This node's publication of `id`, replayed by its session after connecting (see
    /// [`crate::registry::session`]), was refused: the directory names another content for the
    /// id. Made by the node's session from the registry's `Conflict`; the node's copy stays
    /// local, served to no peer.
    ReplayRefused {
        /// The object.
        id: ObjectId,
        /// The sizes the id names.
        sizes: ObjectSizes,
        /// The digest the id names.
        digest: ContentDigest,
    },
    /// `holder` published `id`, which no node held: sent to every other node that asked to
    /// learn locations in its hello, so its first fetch of the object needs no lookup (copies
    /// published later are not pushed). A hint only: the head drops it for a connection that is behind, and the node
    /// keeps it in its location cache, where a stale entry costs one round trip to the
    /// holder, then the directory.
    Located {
        /// The object.
        id: ObjectId,
        /// The node that now holds it.
        holder: NodeId,
        /// Its sizes.
        sizes: ObjectSizes,
        /// The digest of its bytes.
        digest: ContentDigest,
    },
}

impl DirectoryEvent {
    /// The object the event is about.
    pub fn object(&self) -> &ObjectId {
        match self {
            DirectoryEvent::Published { id, .. }
            | DirectoryEvent::Replicate { id, .. }
            | DirectoryEvent::Copies { id, .. }
            | DirectoryEvent::Delete { id }
            | DirectoryEvent::Surplus { id } => id,
            DirectoryEvent::ReplayRefused { id, .. } | DirectoryEvent::Located { id, .. } => id,
        }
    }
}

impl fmt::Display for DirectoryEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectoryEvent::Published {
                id,
                holder,
                sizes,
                digest,
            } => write!(
                f,
                "Published{{{id}, {holder}, size={}+{}, digest={digest}}}",
                sizes.data_size, sizes.metadata_size
            ),
            DirectoryEvent::Replicate {
                id,
                sources,
                replicas,
                ..
            } => write!(
                f,
                "Replicate{{{id}, from {sources:?}, replicas={replicas}}}"
            ),
            DirectoryEvent::Copies { id, copies } => write!(f, "Copies{{{id}, {copies}}}"),
            DirectoryEvent::Delete { id } => write!(f, "Delete{{{id}}}"),
            DirectoryEvent::Surplus { id } => write!(f, "Surplus{{{id}}}"),
            DirectoryEvent::Located { id, holder, .. } => write!(f, "Located{{{id}, {holder}}}"),
            DirectoryEvent::ReplayRefused { id, digest, .. } => {
                write!(f, "ReplayRefused{{{id}, the id names digest={digest}}}")
            }
        }
    }
}

/// A live node of the cluster, as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// The node.
    pub node: NodeId,
    /// Where its fabric accepts connections.
    pub fabric_addr: SocketAddr,
    /// Which fabric it runs (`tcp`, `verbs`).
    pub fabric: String,
    /// Changes each time the node's daemon starts.
    pub incarnation: u32,
    /// The failure domain the node is in (a rack, a switch; empty: its own): copies of record
    /// of one object go to distinct domains when there are enough.
    #[serde(default)]
    pub failure_domain: String,
}

/// The live members, sorted by node id: one list, built once per membership change and shared
/// by every message, session and core it reaches.
pub type MemberList = SharedList<MemberInfo>;

/// What a node's directory client tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryNotice {
    /// The answer to a submitted request.
    Reply {
        /// The request's op id.
        op: DirectoryOpId,
        /// The answer.
        reply: DirectoryReply,
    },
    /// A subscription fired.
    Event(DirectoryEvent),
    /// The live members changed (sent at join and at every change).
    Members(MemberList),
    /// The service became reachable (`Ok`) or unreachable (`Err` with the reason). The reason
    /// is text for people (the log, `skyriver nodes`, `/healthz`): the core decides nothing by
    /// it, only by `Ok` or `Err`, so it stays the backend's own words rather than a type.
    Health(Result<(), String>),
}
