//! The messages between a node's directory session and the registry, as values. The built-in
//! directory carries them as length-prefixed postcard frames over TCP; the simulator carries
//! them over a simulated link; the Redis backend's adapter answers them from Redis.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::auth::{Nonce, Proof};
use crate::digest::ContentDigest;
use crate::directory::{DirectoryEvent, DirectoryReply, DirectoryRequest, MemberInfo, MemberList};
use crate::ids::ObjectId;
use crate::wire::ObjectSizes;

use super::member_changes::{MemberChange, MemberChanges};

/// Version of the directory protocol, checked in the hello. Version 2 replaced the token in
/// the hello with a challenge-response (see [`crate::registry`]); version 3 added the failure
/// domain to [`MemberInfo`] and the replica requests and events; version 4 the `Surplus` event
/// (a returning copy of record the object no longer needs); version 5 added the hello's
/// `returning` and [`ToRegistry::Reclaim`], for the head's grace period after a restart (see
/// [`crate::registry`]); version 6 the `DeclineReplica` request (a target that cannot take
/// its copy says so); version 7 numbers member lists and sends a node that has one only what
/// changed ([`FromRegistry::MembersChanged`], see [`super::member_changes`]); version 8 the
/// `LocateCopies` request and its `CopiesLocated` reply (which holders keep copies of record,
/// and how many the object wants); version 9 the hello's `learns_locations` and the `Located`
/// event (publications pushed to the nodes that asked for them).
pub const PROTOCOL_VERSION: u16 = 9;
/// Opens every hello, so a stray client (or an old daemon) is told apart from a bad token.
pub const HELLO_MAGIC: [u8; 8] = *b"skyrdir\0";

/// One request of one connection, chosen by the node, unique on that connection.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct WireOpId(pub u64);

impl fmt::Display for WireOpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wire-{}", self.0)
    }
}

/// The first message of every connection. Its first fields are those of version 1, so a
/// registry of either version reads the version and answers an old peer with a clear refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`HELLO_MAGIC`].
    pub magic: [u8; 8],
    /// [`PROTOCOL_VERSION`] of the node.
    pub version: u16,
    /// Always empty: where version 1 sent the token in clear.
    pub legacy_token: String,
    /// Who the node is.
    pub member: MemberInfo,
    /// The node's fresh nonce for this connection.
    pub nonce: Nonce,
    /// This daemon was registered before (with this head or an earlier one): a young head that
    /// hears it is a restarted one, and holds new ids back for its grace period.
    pub returning: bool,
    /// Send this node a [`DirectoryEvent::Located`](crate::directory::DirectoryEvent::Located)
    /// for every object another node publishes first.
    pub learns_locations: bool,
}

/// Node → registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToRegistry {
    /// First message of a connection.
    Hello(Hello),
    /// A directory request.
    Request {
        /// Echoed in the reply.
        op: WireOpId,
        /// What the node asks.
        request: DirectoryRequest,
    },
    /// Liveness; answered with `Pong`.
    Ping {
        /// Echoed.
        seq: u64,
    },
    /// The node leaves the cluster cleanly: forget it and what it held at once.
    Goodbye,
    /// The answer to [`FromRegistry::Challenge`]: the node's proof of the cluster token.
    Proof(Proof),
    /// A publication the node's session replays after connecting (NFS's reclaim): what an
    /// earlier registration of the node, maybe with a head that restarted since, had listed. It
    /// is judged like a `Publish` and answered with a `Reply`, and during the head's grace
    /// period it is the only publication of an id the head does not list that is judged at
    /// once.
    Reclaim {
        /// Echoed in the reply.
        op: WireOpId,
        /// The object.
        id: ObjectId,
        /// Its sizes.
        sizes: ObjectSizes,
        /// The digest of its bytes.
        digest: ContentDigest,
    },
}

impl fmt::Display for ToRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToRegistry::Hello(hello) => write!(
                f,
                "Hello{{{} inc {}}}",
                hello.member.node, hello.member.incarnation
            ),
            ToRegistry::Request { op, request } => write!(f, "{op} {request}"),
            ToRegistry::Ping { seq } => write!(f, "Ping{{{seq}}}"),
            ToRegistry::Goodbye => write!(f, "Goodbye"),
            ToRegistry::Proof(_) => write!(f, "Proof"),
            ToRegistry::Reclaim {
                op,
                id,
                sizes,
                digest,
            } => write!(
                f,
                "{op} Reclaim{{{id}, size={}+{}, digest={digest}}}",
                sizes.data_size, sizes.metadata_size
            ),
        }
    }
}

/// Registry → node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromRegistry {
    /// The node proved the token and was admitted.
    Welcome {
        /// The registry's protocol version.
        version: u16,
        /// The registry's own proof of the token, over the same transcript.
        proof: Proof,
    },
    /// The node is not (or no longer) served; the connection closes after this message.
    Refused {
        /// Why, for the operator.
        reason: String,
        /// Trying again shortly may succeed (the same node id is still registered).
        retryable: bool,
    },
    /// The answer to `Request { op, .. }`.
    Reply {
        /// The request's op.
        op: WireOpId,
        /// The answer.
        reply: DirectoryReply,
    },
    /// A one-shot subscription fired.
    Event(DirectoryEvent),
    /// The live members, sorted by node id: the registry's list number `epoch`.
    Members {
        /// The list's number (one more at each membership change).
        epoch: u64,
        /// The members.
        members: MemberList,
    },
    /// What turns list `from` into list `to`, for a node that has list `from`.
    MembersChanged {
        /// The list the node has.
        from: u64,
        /// The list the changes make.
        to: u64,
        /// Sorted by node, one per node.
        changes: MemberChanges,
    },
    /// The answer to `Ping { seq }`.
    Pong {
        /// Echoed.
        seq: u64,
    },
    /// The answer to a well-formed hello: the registry's fresh nonce, to prove the token over.
    Challenge {
        /// The registry's nonce for this connection.
        nonce: Nonce,
    },
}

impl fmt::Display for FromRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FromRegistry::Welcome { .. } => write!(f, "Welcome"),
            FromRegistry::Refused { reason, retryable } => {
                write!(f, "Refused{{{reason:?}, retryable={retryable}}}")
            }
            FromRegistry::Reply { op, reply } => write!(f, "{op} {reply}"),
            FromRegistry::Event(event) => write!(f, "{event}"),
            FromRegistry::Members { epoch, members } => {
                write!(f, "Members#{epoch}{{")?;
                for (i, m) in members.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{} inc {}", m.node, m.incarnation)?;
                }
                write!(f, "}}")
            }
            FromRegistry::MembersChanged { from, to, changes } => {
                write!(f, "MembersChanged#{from}->{to}{{")?;
                for (i, change) in changes.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    match change {
                        MemberChange::Listed(m) => write!(f, "+{} inc {}", m.node, m.incarnation)?,
                        MemberChange::Left(node) => write!(f, "-{node}")?,
                    }
                }
                write!(f, "}}")
            }
            FromRegistry::Pong { seq } => write!(f, "Pong{{{seq}}}"),
            FromRegistry::Challenge { .. } => write!(f, "Challenge"),
        }
    }
}

/// The version a hello of any protocol version announces, if `body` opens like one: every
/// version keeps the hello's magic and version first, so a head can tell an old or newer node
/// which version it speaks instead of calling its hello malformed.
pub fn announced_version(body: &[u8]) -> Option<u16> {
    #[derive(Deserialize)]
    enum Opening {
        Hello { magic: [u8; 8], version: u16 },
    }
    match postcard::take_from_bytes::<Opening>(body) {
        Ok((Opening::Hello { magic, version }, _)) if magic == HELLO_MAGIC => Some(version),
        _ => None,
    }
}

/// Names the directory protocol in every proof.
pub const PROOF_CONTEXT: &[u8] = b"skyriver-directory-v2";

/// How a node names itself in the proofs: its node id and incarnation, so a proof made for one
/// daemon (or one run of it) proves nothing for another.
pub fn member_identity(member: &MemberInfo) -> [u8; 8] {
    let mut id = [0u8; 8];
    id[..4].copy_from_slice(&member.node.0.to_le_bytes());
    id[4..].copy_from_slice(&member.incarnation.to_le_bytes());
    id
}

/// How the registry names itself in the proofs.
pub const REGISTRY_IDENTITY: &[u8] = b"registry";

/// The transcript both sides of one connection prove over.
pub fn transcript<'a>(
    node_nonce: &'a Nonce,
    registry_nonce: &'a Nonce,
    node_identity: &'a [u8; 8],
) -> crate::auth::Transcript<'a> {
    crate::auth::Transcript {
        context: PROOF_CONTEXT,
        dialer_nonce: node_nonce,
        acceptor_nonce: registry_nonce,
        dialer: node_identity,
        acceptor: REGISTRY_IDENTITY,
    }
}
