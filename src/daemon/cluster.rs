//! The daemon's network side: fabric events and directory notices fed to the node, and the
//! connections to the other live nodes kept up.

use std::sync::Arc;
use std::time::Duration;

use skyriver_transport::directory::DirectoryNotice;
use skyriver_transport::fabric::FabricEvent;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{info, warn};

use super::core::CoreState;
use super::Shared;

/// How often the daemon checks that it is connected to every live node.
const MAINTAIN_EVERY: Duration = Duration::from_secs(1);
/// Most events handled under one lock acquisition.
const EVENT_BATCH: usize = 256;

/// Feeds fabric events to the node, a batch per lock.
pub(super) async fn run_fabric_events(
    shared: Arc<Shared>,
    mut events: UnboundedReceiver<FabricEvent>,
) {
    let mut batch = Vec::with_capacity(EVENT_BATCH);
    while events.recv_many(&mut batch, EVENT_BATCH).await > 0 {
        let now = shared.now();
        let mut core = shared.lock();
        for event in batch.drain(..) {
            handle_fabric_event(&mut core, now, event);
        }
        core.drain(now);
        drop(core);
        shared.timer_changed.notify_one();
    }
}

fn handle_fabric_event(core: &mut CoreState, now: skyriver_core::Instant, event: FabricEvent) {
    match event {
        FabricEvent::PeerConnected {
            peer,
            params,
            summary,
        } => {
            core.node.handle_peer_connected(now, peer, params);
            let threshold = core
                .node
                .eager_threshold(peer)
                .map_or_else(|| "-".to_string(), |t| crate::size::format_bytes(t.bytes));
            info!(%peer, link = %summary, eager_threshold = %threshold, "peer connected");
            core.links
                .insert(peer, format!("{summary}, eager threshold {threshold}"));
        }
        FabricEvent::PeerLost { peer, reason } => {
            if core.links.remove(&peer).is_some() {
                warn!(%peer, %reason, "peer lost");
            }
            core.node.handle_peer_lost(now, peer);
        }
        FabricEvent::Message { peer, bytes } => {
            if let Err(error) = core.node.handle_peer_bytes(now, peer, &bytes) {
                warn!(%peer, %error, "malformed message from peer: ignored");
            }
        }
        FabricEvent::ReadCompleted { op, result } => {
            core.node.handle_read_completion(now, op, result)
        }
    }
}

/// Feeds directory notices to the node, and connects to members as they appear.
pub(super) async fn run_directory_notices(
    shared: Arc<Shared>,
    mut notices: UnboundedReceiver<DirectoryNotice>,
) {
    while let Some(notice) = notices.recv().await {
        let now = shared.now();
        let mut core = shared.lock();
        match notice {
            DirectoryNotice::Reply { op, reply } => {
                if CoreState::is_driver_op(op) {
                    core.driver_op_answered(op, reply);
                } else {
                    core.node.handle_directory_reply(now, op, reply);
                }
            }
            DirectoryNotice::Event(event) => core.node.handle_directory_event(now, event),
            DirectoryNotice::Members(members) => {
                let names: Vec<String> = members.iter().map(|m| m.node.to_string()).collect();
                info!(members = %names.join(" "), "cluster membership");
                core.members = members;
                maintain_connections(&core);
            }
            DirectoryNotice::Health(Ok(())) => {
                if !core.directory_healthy {
                    info!("directory reachable again");
                }
                core.directory_healthy = true;
            }
            DirectoryNotice::Health(Err(reason)) => {
                if core.directory_healthy {
                    warn!(%reason, "directory unreachable: local objects are still served");
                }
                core.directory_healthy = false;
            }
        }
        core.drain(now);
        drop(core);
        shared.timer_changed.notify_one();
    }
}

/// Dials every live member with a lower id that is not connected (the higher id dials, so each
/// pair has exactly one connection).
fn maintain_connections(core: &CoreState) {
    let Some(fabric) = &core.fabric else { return };
    let me = core.node.id();
    for member in &core.members {
        if member.node < me && !fabric.is_connected_or_connecting(member.node) {
            fabric.connect(member.node, member.fabric_addr);
        }
    }
}

/// Re-dials lost members now and then.
pub(super) async fn run_connection_maintenance(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(MAINTAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        maintain_connections(&shared.lock());
    }
}

/// Serves the built-in directory when this daemon is the head, then joins the directory.
pub(super) async fn connect_directory(
    cluster: &super::ClusterConfig,
    me: skyriver_transport::directory::MemberInfo,
    notices: tokio::sync::mpsc::UnboundedSender<DirectoryNotice>,
) -> Result<
    (
        Arc<dyn skyriver_transport::directory::Directory>,
        Option<skyriver_transport::directory::builtin::BuiltinDirectoryServer>,
    ),
    super::DaemonError,
> {
    use skyriver_transport::directory::builtin::{BuiltinDirectoryServer, ServerConfig};
    use skyriver_transport::directory::DirectorySpec;

    use super::{DaemonError, DirectoryChoice};

    let mut server = None;
    let spec = match &cluster.directory {
        DirectoryChoice::Head { listen } => {
            let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
                DaemonError::Directory(format!("cannot serve the directory on {listen}: {e}"))
            })?;
            let head = BuiltinDirectoryServer::spawn(
                listener,
                ServerConfig::new(cluster.cluster_token.clone()),
            )
            .map_err(|e| DaemonError::Directory(e.to_string()))?;
            let addr = head.local_addr().to_string();
            info!(directory = %addr, "serving the built-in directory: other daemons join with --join {addr}");
            server = Some(head);
            DirectorySpec::Builtin { addr }
        }
        DirectoryChoice::Join { head } => DirectorySpec::Builtin { addr: head.clone() },
        DirectoryChoice::Redis { url } => DirectorySpec::Redis { url: url.clone() },
    };
    let directory = skyriver_transport::directory::connect(
        &spec,
        me,
        &cluster.cluster_name,
        &cluster.cluster_token,
        notices,
    )
    .await
    .map_err(|e| DaemonError::Directory(e.to_string()))?;
    Ok((directory, server))
}
