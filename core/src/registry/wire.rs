//! The messages between a node's directory session and the registry, as values. The built-in
//! directory carries them as length-prefixed postcard frames over TCP; the simulator carries
//! them over a simulated link; the Redis backend's adapter answers them from Redis.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::directory::{DirectoryEvent, DirectoryReply, DirectoryRequest, MemberInfo};

/// Version of the directory protocol, checked in the hello.
pub const PROTOCOL_VERSION: u16 = 1;
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

/// The first message of every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`HELLO_MAGIC`].
    pub magic: [u8; 8],
    /// [`PROTOCOL_VERSION`] of the node.
    pub version: u16,
    /// The cluster token; compared in constant time.
    pub token: String,
    /// Who the node is.
    pub member: MemberInfo,
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
        }
    }
}

/// Registry → node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromRegistry {
    /// The hello was accepted.
    Welcome {
        /// The registry's protocol version.
        version: u16,
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
    /// The live members, sorted by node id.
    Members(Vec<MemberInfo>),
    /// The answer to `Ping { seq }`.
    Pong {
        /// Echoed.
        seq: u64,
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
            FromRegistry::Members(members) => {
                write!(f, "Members{{")?;
                for (i, m) in members.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{} inc {}", m.node, m.incarnation)?;
                }
                write!(f, "}}")
            }
            FromRegistry::Pong { seq } => write!(f, "Pong{{{seq}}}"),
        }
    }
}

/// Whether two tokens are equal, in time independent of where they differ (so a caller cannot
/// find the token byte by byte by timing refusals).
pub fn tokens_match(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}
