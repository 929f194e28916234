//! What the daemon says about its peers' reachability. Which peers are dialed and when is a
//! rule of the core (`skyriver_core::node` `links`: the higher id dials, with back-off); the
//! daemon carries out its `Connect`s and logs the state the core keeps, once per change of
//! state: WARN when a peer becomes unreachable, DEBUG for each further failure, INFO when it is
//! back.

use skyriver_core::node::Node;
use skyriver_core::NodeId;
use tracing::{debug, info, warn};

/// Whether `peer` had been unreachable before its connection came up (how many failures):
/// ask before the node hears of the connection.
pub(super) fn failures_before_connect(node: &Node, peer: NodeId) -> Option<u32> {
    node.unreachable(peer).map(|state| state.failures)
}

/// Logs a connection that came up; `failures` from [`failures_before_connect`].
pub(super) fn log_connected(node: &Node, peer: NodeId, failures: Option<u32>) {
    let link = node
        .peer_link(peer)
        .map_or_else(|| "-".to_string(), ToString::to_string);
    let threshold = node
        .eager_threshold(peer)
        .map_or_else(|| "-".to_string(), |t| crate::size::format_bytes(t.bytes));
    match failures {
        None => info!(%peer, %link, eager_threshold = %threshold, "peer connected"),
        Some(failures) => info!(
            %peer, %link, eager_threshold = %threshold, failures,
            "peer connected: reachable again"
        ),
    }
}

/// Logs a connection that failed or was lost, after the node heard of it.
pub(super) fn log_lost(node: &Node, peer: NodeId, reason: &str) {
    let Some(state) = node.unreachable(peer) else {
        return;
    };
    let retry_in = state.retry_in;
    if state.failures == 1 {
        warn!(
            %peer, %reason, retry_in = ?retry_in,
            "peer lost: dialing it again with back-off (up to every 30 s; further failures are \
             logged at debug level)"
        );
    } else {
        debug!(
            %peer, %reason, failures = state.failures, retry_in = ?retry_in,
            "peer still unreachable"
        );
    }
}
