//! The built-in directory: a head daemon serves it over TCP, every daemon (the head included)
//! connects to it as a client. Zero setup: `skyriver daemon --head` serves, others `--join`.
//!
//! Protocol: length-prefixed postcard frames (`directory::frame`) of the core's registry messages
//! ([`ToRegistry`] from nodes, [`FromRegistry`] from the head). The node opens with a versioned
//! `Hello` carrying the cluster token and its [`MemberInfo`]; the head answers `Welcome` (then
//! the member list) or `Refused` with a reason. After that the node sends requests tagged with
//! connection-local op numbers and pings; the head sends replies, pushed events (one-shot
//! `Published` subscriptions) and `Members` at every membership change.
//!
//! The rules (join and refusal, liveness, ordering of lookups and publications) are the core's
//! [`Registry`](skyriver_core::registry::Registry): the server here only moves frames in and out
//! of it ([`server`]). The node side is the shared reconnecting client
//! (`directory::client`) over a TCP link (`builtin::link`).

mod link;
mod member_lists;
mod out_queue;
pub mod server;

use std::time::Duration;

use skyriver_core::directory::MemberInfo;
use skyriver_core::registry::session::{DirectorySession, SessionConfig};
use skyriver_core::registry::RegistryLimits;

pub use server::{BuiltinDirectoryServer, ServerConfig};
pub use skyriver_core::registry::{FromRegistry, ToRegistry, PROTOCOL_VERSION};

use super::client::{self, ClientTiming, DirectoryClient};
use super::{DirectoryError, NoticeSender};

/// Most nodes one head serves.
pub const MAX_NODES: usize = 16_384;
/// Most pending one-shot subscriptions of one node.
pub const MAX_SUBSCRIPTIONS_PER_NODE: usize = 65_536;
/// Most objects one node may publish.
pub const MAX_PUBLICATIONS_PER_NODE: usize = 1 << 24;
/// Most requests one node keeps in flight; more are answered `Unavailable` at once.
pub const MAX_IN_FLIGHT_PER_NODE: usize = 65_536;
/// Most hellos waiting for their proofs at once.
pub const MAX_HANDSHAKES: usize = 1024;

/// The head's limits.
pub fn registry_limits() -> RegistryLimits {
    RegistryLimits {
        max_nodes: MAX_NODES,
        max_subscriptions_per_node: MAX_SUBSCRIPTIONS_PER_NODE,
        max_publications_per_node: MAX_PUBLICATIONS_PER_NODE,
        max_handshakes: MAX_HANDSHAKES,
    }
}

/// How a node talks to the head.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// A ping goes to the head this often.
    pub heartbeat_interval: Duration,
    /// The head is considered gone when not heard from for this long.
    pub heartbeat_timeout: Duration,
    /// Bound on one connection attempt (TCP connect plus hello).
    pub connect_timeout: Duration,
    /// How long the first connection keeps retrying a retryable refusal (the same node id is
    /// still registered from a daemon that just restarted; the head is at its limit of hellos
    /// in progress) or an attempt that timed out (a head busy forming thousands of sessions).
    pub join_timeout: Duration,
    /// First delay between reconnection attempts; doubles up to `reconnect_backoff_max`.
    pub reconnect_backoff_min: Duration,
    /// Longest delay between reconnection attempts.
    pub reconnect_backoff_max: Duration,
    /// Whether `notices` carries the member list (a node needs it; a load generator standing
    /// in for many nodes keeps none, see [`SessionConfig::member_lists`]).
    pub member_lists: bool,
    /// Ask the head for the first holder of every object other nodes publish, to fill the
    /// node's location cache (see [`SessionConfig::learn_locations`]).
    pub learn_locations: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            join_timeout: Duration::from_secs(8),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            member_lists: true,
            learn_locations: false,
        }
    }
}

/// A node's connection to the built-in directory. Dropping it leaves the cluster.
pub type BuiltinDirectory = DirectoryClient;

/// Joins the built-in directory served at `addr` (`HOST:PORT` of the head daemon). Fails if
/// the head cannot be reached or refuses this node; afterwards the connection is kept up in
/// the background (reconnecting with backoff) and reported through `notices`.
pub async fn connect(
    addr: &str,
    me: MemberInfo,
    token: &crate::token::ClusterToken,
    notices: NoticeSender,
    config: ClientConfig,
) -> Result<BuiltinDirectory, DirectoryError> {
    let session_config = SessionConfig {
        heartbeat_interval: config.heartbeat_interval,
        heartbeat_timeout: config.heartbeat_timeout,
        reconnect_backoff_min: config.reconnect_backoff_min,
        reconnect_backoff_max: config.reconnect_backoff_max,
        max_publications: MAX_PUBLICATIONS_PER_NODE,
        max_subscriptions: MAX_SUBSCRIPTIONS_PER_NODE,
        max_in_flight: MAX_IN_FLIGHT_PER_NODE,
        member_lists: config.member_lists,
        learn_locations: config.learn_locations,
    };
    let description = format!("built-in directory at {addr}");
    let session = DirectorySession::new(
        session_config,
        me,
        token.clone(),
        crate::token::fresh_nonce(),
        skyriver_core::Instant::ZERO,
    );
    let timing = ClientTiming {
        connect_timeout: config.connect_timeout,
        join_timeout: config.join_timeout,
        max_queued_requests: MAX_IN_FLIGHT_PER_NODE,
    };
    let connector = link::TcpConnector {
        addr: addr.to_string(),
    };
    client::start(
        session,
        connector,
        timing,
        notices,
        addr.to_string(),
        description,
    )
    .await
}
