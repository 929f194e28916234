//! The daemon's one loop, sole owner of the [`Node`] (in the style of str0m): inputs are the
//! clients' sockets (read by the loop itself, a bounded turn at a time), fabric events,
//! directory notices and the committer's progress; one input at a time, each a [`NodeInput`]
//! given to [`Node::handle`], then the core's drive loop ([`drive_host`]) carries out every
//! output before the next input; then sleep until the next input or the node's next deadline.
//! No lock is held around the node and nothing here waits for a disk or a peer. With
//! `--record`, every input and a digest of every output also go to the [`Recorder`].

use std::sync::Arc;
use std::time::Duration;

use skyriver_core::client_protocol::Response;
use skyriver_core::node::{
    drive_host, ClusterMember, DriveHost, GrantError, Handled, Node, NodeInput, PeerLink,
};
use skyriver_core::{ClientId, Instant, NodeOutput, RecoveredObject, RecoveryReport, RequestId};
use skyriver_core::{ContentDigest, StoreError};
use skyriver_transport::directory::{DirectoryNotice, MemberInfo, NoticeReceiver};
use skyriver_transport::fabric::{EventReceiver, FabricEvent};
use skyriver_transport::trace;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::connection::{ClientInput, ClientReader, ClientWriter, ConnectionEnd, Readable};
use super::effects::{AccessAnswer, ClientLink, Effects};
use super::metrics::{Snapshot, SnapshotRequest};
use super::reachability;
use super::record::Recorder;

/// Turns in a row the polling loop may take straight from the client it serves before it
/// looks at every other input (a client that never stops sending cannot starve the rest).
const MAX_DIRECT_TURNS: u32 = 16;

/// Bytes one direct read of a client's socket takes at most.
const DIRECT_READ_BYTES: usize = 64 * 1024;

/// Peer messages the loop takes in one turn when they are ready at once: messages that leave
/// no output queued are given to the node one after the other and driven together, so the
/// fetch requests among them are answered in one pass (see the core's `coalesce`).
const MAX_PEER_MESSAGES_PER_TURN: usize = 64;
/// Spill tier completions taken in one turn of the loop (see `more_spill_completions`).
const MAX_SPILL_COMPLETIONS_PER_TURN: usize = 64;

/// The cluster side of the loop's inputs.
pub(super) struct ClusterInputs {
    pub(super) fabric_events: EventReceiver,
    pub(super) notices: NoticeReceiver,
}

/// The loop and everything it owns.
pub(super) struct EventLoop {
    pub(super) node: Node,
    pub(super) effects: Effects,
    epoch: std::time::Instant,
    listener: UnixListener,
    /// One readiness wait per connected client.
    readable: FuturesUnordered<Readable>,
    /// Reused for the inputs of one client's turn.
    turn: Vec<ClientInput>,
    fabric_events: Option<EventReceiver>,
    notices: Option<NoticeReceiver>,
    durable: Option<watch::Receiver<u64>>,
    members: Vec<MemberInfo>,
    next_client: u64,
    /// Snapshot requests of the metrics exporter (`--metrics`).
    metrics_requests: Option<mpsc::Receiver<SnapshotRequest>>,
    /// How long the loop polls for input after its last one before it sleeps.
    poll: skyriver_transport::poll::AdaptivePoll,
    /// Whether the host is too crowded to poll (the loop blocks instead while it is).
    host_load: skyriver_transport::poll::HostLoad,
    /// The client whose request the loop read last: while polling, the loop reads its socket
    /// directly first (one `recv`, no readiness wait and runtime round in between).
    hot: Option<ClientId>,
    /// Turns taken that way in a row.
    direct_turns: u32,
    /// Where a direct read lands (allocated once the loop polls).
    scratch: Vec<u8>,
    /// Where inputs and outputs are recorded (`--record`).
    recorder: Option<Recorder>,
    /// The time of the input given last, not yet driven: the drive after it runs at that
    /// time, so a replay of the recorded inputs drives at the same instants.
    drive_at: Option<Instant>,
    /// Completions of the spill tier's IO threads (`--spill-dir`).
    spill_completions: Option<mpsc::Receiver<crate::spill::SpillCompletion>>,
    /// Spill and restore latencies, for the metrics.
    pub(super) spill_latency: super::metrics::SpillLatencies,
    /// The replication counters of the directory this daemon serves (the head only).
    pub(super) head_replication:
        Option<tokio::sync::watch::Receiver<skyriver_core::registry::ReplicationStats>>,
}

impl EventLoop {
    pub(super) fn new(
        node: Node,
        effects: Effects,
        epoch: std::time::Instant,
        listener: UnixListener,
        cluster: Option<ClusterInputs>,
        durable: Option<watch::Receiver<u64>>,
    ) -> Self {
        // A stale durable count (0) must not look like news: only changes after now count.
        let (fabric_events, notices) = match cluster {
            Some(c) => (Some(c.fabric_events), Some(c.notices)),
            None => (None, None),
        };
        Self {
            node,
            effects,
            epoch,
            listener,
            readable: FuturesUnordered::new(),
            turn: Vec::new(),
            fabric_events,
            notices,
            durable,
            members: Vec::new(),
            next_client: 1,
            metrics_requests: None,
            poll: skyriver_transport::poll::AdaptivePoll::new(Duration::ZERO, Duration::ZERO),
            host_load: skyriver_transport::poll::HostLoad::from_env(),
            hot: None,
            direct_turns: 0,
            scratch: Vec::new(),
            recorder: None,
            drive_at: None,
            spill_completions: None,
            spill_latency: Default::default(),
            head_replication: None,
        }
    }

    /// Records every input and output from now on (before the first input).
    pub(super) fn set_recorder(&mut self, recorder: Recorder) {
        self.recorder = Some(recorder);
    }

    /// Gives the node one input (recorded first when recording).
    fn feed(&mut self, now: Instant, input: NodeInput<'_>) -> Handled {
        if let Some(recorder) = &mut self.recorder {
            recorder.input(now, false, &input);
        }
        self.drive_at = Some(now);
        self.node.handle(now, input)
    }

    /// Restores objects the persistent store found, and drives the node (which publishes
    /// them).
    pub(super) fn recover(
        &mut self,
        objects: Vec<(RecoveredObject, ContentDigest)>,
    ) -> RecoveryReport {
        let handled = self.feed(Instant::ZERO, NodeInput::Recovered { objects });
        self.drain();
        match handled {
            Handled::Recovered(report) => report,
            other => unreachable!("recovered objects are answered with a report, not {other:?}"),
        }
    }

    /// Hands spilled objects a persistent store found back to the node (see
    /// `Persistence::recover_spilled`).
    pub(super) fn recover_spilled(
        &mut self,
        objects: Vec<(
            skyriver_core::store::RecoveredSpilled,
            Option<ContentDigest>,
        )>,
    ) -> skyriver_core::store::SpilledRecoveryReport {
        let handled = self.feed(Instant::ZERO, NodeInput::RecoveredSpilled { objects });
        self.drain();
        match handled {
            Handled::RecoveredSpilled(report) => report,
            other => unreachable!("recovered spilled objects get a report, not {other:?}"),
        }
    }

    /// Counts spilled objects of a persistent store found lost at restart (see
    /// `Persistence::recover_spilled`).
    pub(super) fn spilled_lost_at_start(&mut self, objects: u64) {
        if objects > 0 {
            self.feed(Instant::ZERO, NodeInput::SpilledLostAtStart { objects });
            self.drain();
        }
    }

    /// Polls for input this long after each one before sleeping ([`skyriver_transport::poll`]).
    pub(super) fn set_poll(&mut self, poll: skyriver_transport::poll::AdaptivePoll) {
        self.poll = poll;
        if !poll.window().is_zero() {
            self.scratch = vec![0; DIRECT_READ_BYTES];
        }
    }

    /// Answers the metrics exporter's requests from now on.
    pub(super) fn set_metrics_requests(&mut self, requests: mpsc::Receiver<SnapshotRequest>) {
        self.metrics_requests = Some(requests);
    }

    /// A copy of the node's counters for the exporter: plain values, taken between inputs.
    fn snapshot(&self) -> Snapshot {
        let node = self.node.metrics();
        let connected_peers = node.peers.iter().filter(|p| p.connected).count();
        Snapshot {
            node,
            fabric: self
                .effects
                .fabric
                .as_ref()
                .map_or_else(|| "none".to_string(), |f| f.name().to_string()),
            members: self.members.len(),
            connected_peers,
            channels: super::metrics::ChannelDepths {
                fabric_events: self.fabric_events.as_ref().map_or(0, |r| r.len() as u64),
                directory_notices: self.notices.as_ref().map_or(0, |r| r.len() as u64),
                commit_queue: self.node.unpersisted_changes(),
                spill_completions: self
                    .spill_completions
                    .as_ref()
                    .map_or(0, |r| r.len() as u64),
            },
            spill_latency: self.spill_latency.clone(),
            head_replication: self.head_replication.as_ref().map(|r| r.borrow().clone()),
        }
    }

    /// Takes the spill tier's completions from now on.
    pub(super) fn set_spill_completions(
        &mut self,
        completions: mpsc::Receiver<crate::spill::SpillCompletion>,
    ) {
        self.spill_completions = Some(completions);
    }

    /// A spill or restore finished: the node hears of it, and queued jobs move on.
    fn spill_completed(&mut self, completion: crate::spill::SpillCompletion) {
        use crate::spill::SpillCompletion;
        if let Some(io) = &mut self.effects.spill_io {
            io.pump();
        }
        let now = self.now();
        let input = match completion {
            SpillCompletion::Spilled {
                op,
                result,
                elapsed,
                ..
            } => {
                if let Err(error) = &result {
                    warn!(%op, %error, "spill write failed: evicting instead until space is given back");
                }
                self.spill_latency.spill.observe(elapsed);
                NodeInput::SpillDone { op, result }
            }
            SpillCompletion::Restored {
                op,
                result,
                elapsed,
                ..
            } => {
                if let Err(error) = &result {
                    warn!(%op, %error, "restore failed: the object is lost");
                }
                self.spill_latency.restore.observe(elapsed);
                NodeInput::RestoreDone { op, result }
            }
            SpillCompletion::Discarded { .. } => return,
        };
        self.feed(now, input);
    }

    /// The committer's progress (persistent mode).
    pub(super) fn set_durable(&mut self, durable: Option<watch::Receiver<u64>>) {
        self.durable = durable;
    }

    fn now(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    fn deadline(&self, at: Instant) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.epoch + Duration::from_nanos(at.0))
    }

    /// Serves until `shutdown` completes.
    pub(super) async fn run(&mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        // One timer, moved only when the node's deadline moves (registering a fresh one on
        // every turn of the loop costs more than the request it serves).
        let sleep = tokio::time::sleep_until(far_future());
        tokio::pin!(sleep);
        let mut armed = None;
        // Until then the loop polls (a ready input is taken at once, with no wake-up);
        // afterwards it sleeps in the kernel until an input or a deadline.
        let mut poll_until = std::time::Instant::now();
        loop {
            self.drain();
            // Replies leave before the loop waits again; a client that cannot take them is
            // closed, and the node hears of it before anything else.
            self.effects.flush();
            if !self.effects.closed.is_empty() {
                continue;
            }
            let next = self.node.poll_timeout();
            if next != armed {
                let at = next.map_or_else(far_future, |at| self.deadline(at));
                sleep.as_mut().reset(at);
                armed = next;
            }
            let polls = !self.poll.window().is_zero();
            let now = std::time::Instant::now();
            let polling = polls && now < poll_until && !self.host_load.crowded(now);
            if polling {
                // A polling round: give the CPU away (to the client, when they share one), then
                // look at the socket of the client served last, straight.
                std::thread::yield_now();
                if self.direct_turns < MAX_DIRECT_TURNS && self.read_hot_client() {
                    self.direct_turns += 1;
                    poll_until = std::time::Instant::now() + self.poll.window();
                    continue;
                }
            }
            self.direct_turns = 0;
            // Whether what ends this wait is an input (not the loop's own timers).
            let mut input = true;
            let mut polled_nothing = false;
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(client) = self.readable.next(), if !self.readable.is_empty() => {
                    self.read_client(client)
                }
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => self.accept(stream),
                    Err(error) => warn!(%error, "accept failed"),
                },
                Some(event) = recv_fabric(self.fabric_events.as_mut()) => {
                    self.fabric_turn(event)
                }
                Some(notice) = recv_bounded(self.notices.as_mut()) => {
                    self.directory_notice(notice)
                }
                Some(completion) = recv_bounded(self.spill_completions.as_mut()) => {
                    self.spill_completed(completion);
                    self.more_spill_completions();
                }
                Some(upto) = durable_changed(self.durable.as_mut()) => {
                    let now = self.now();
                    self.feed(now, NodeInput::Persisted { upto });
                }
                _ = &mut sleep, if next.is_some() => {
                    let now = self.now();
                    self.feed(now, NodeInput::Timeout);
                    armed = None;
                    input = false;
                }
                Some(answer) = recv_bounded(self.metrics_requests.as_mut()) => {
                    // The scraper may have given up; nothing to do then.
                    let _ = answer.send(self.snapshot());
                }
                // Last: only when nothing above is ready. The runtime checks every socket and
                // channel without sleeping and runs what woke.
                () = runtime_round(), if polling => polled_nothing = true,
            }
            if polls && input && !polled_nothing {
                let now = std::time::Instant::now();
                if !polling {
                    // The loop slept in the kernel since its window ended, and an input woke it.
                    self.poll
                        .woke_after_sleeping(now.saturating_duration_since(poll_until));
                }
                poll_until = now + self.poll.window();
            }
        }
    }

    /// Carries out every output, telling the node of clients closed on the way and firing
    /// timers already due, until the node has nothing more to say (the core's drive loop).
    pub(super) fn drain(&mut self) {
        let now = match self.drive_at.take() {
            Some(at) => at,
            None => self.now(),
        };
        drive_host(self, now);
    }

    fn accept(&mut self, stream: tokio::net::UnixStream) {
        let client = ClientId(self.next_client);
        self.next_client += 1;
        let (read, write) = stream.into_split();
        let reader = ClientReader::new(read);
        self.readable.push(reader.readable(client));
        self.effects
            .clients
            .insert(client, ClientLink::new(ClientWriter::new(write), reader));
        let now = self.now();
        self.feed(now, NodeInput::ClientConnected { client });
        debug!(%client, "client connected");
    }

    /// A client's socket is readable: one turn of its requests, each handled and its outputs
    /// carried out (replies leave together after the turn), then the next readiness wait.
    fn read_client(&mut self, client: ClientId) {
        let Some(link) = self.effects.clients.get_mut(&client) else {
            return; // closed meanwhile; its wait ended with the close
        };
        let mut turn = std::mem::take(&mut self.turn);
        let (open, full) = link.reader.read_turn(client, &mut turn);
        if open {
            self.readable.push(if full {
                ClientReader::again(client)
            } else {
                link.reader.readable(client)
            });
        }
        self.hot = Some(client);
        self.serve_turn(turn);
    }

    /// While polling: one read straight from the socket of the client served last. Whether it
    /// gave anything (then served, like a turn).
    fn read_hot_client(&mut self) -> bool {
        let Some(client) = self.hot else {
            return false;
        };
        let Some(link) = self.effects.clients.get_mut(&client) else {
            self.hot = None;
            return false;
        };
        let mut turn = std::mem::take(&mut self.turn);
        // Its readiness wait stays armed (see `read_direct`): nothing to push.
        if link
            .reader
            .read_direct(client, &mut self.scratch, &mut turn)
            .is_none()
        {
            self.turn = turn;
            return false;
        }
        self.serve_turn(turn);
        true
    }

    /// Serves the inputs of one read of a client's socket.
    fn serve_turn(&mut self, mut turn: Vec<ClientInput>) {
        if trace::recording() && turn.iter().any(ClientInput::is_traced) {
            trace::stamp("request_read");
        }
        // Replies to a pipelined burst leave together after it (one write); the reply to the
        // last (or only) request of the turn goes out at once.
        let last = turn.len().saturating_sub(1);
        for (index, input) in turn.drain(..).enumerate() {
            self.effects.batch_replies = index < last;
            self.client_input(input);
            self.drain();
        }
        self.effects.batch_replies = false;
        self.turn = turn;
    }

    fn client_input(&mut self, input: ClientInput) {
        let now = self.now();
        match input {
            ClientInput::Request { client, frame } => {
                if self.effects.clients.contains_key(&client) {
                    self.feed(now, NodeInput::ClientRequest { client, frame });
                }
            }
            ClientInput::Malformed { client, error } => {
                warn!(%client, %error, "malformed request");
                self.error_frame(client, StoreError::BadRequest(error.to_string()));
            }
            ClientInput::Ended { client, end } => {
                if let ConnectionEnd::Frame(error) = &end {
                    // The stream cannot be trusted past a bad length: explain, then close.
                    self.error_frame(client, StoreError::BadRequest(error.to_string()));
                }
                if self.effects.clients.contains_key(&client) {
                    match &end {
                        ConnectionEnd::Closed => debug!(%client, "disconnected"),
                        other => warn!(%client, reason = %other, "closing client connection"),
                    }
                    // Writes what is still unsent (the error above), then closes; the node
                    // hears of it in the next drain.
                    self.effects.close(client, end.to_string());
                }
            }
        }
    }

    /// An error about a frame that has no request id to answer.
    fn error_frame(&mut self, client: ClientId, error: StoreError) {
        use skyriver_core::node::NodeDriver;
        self.effects
            .reply(client, RequestId(0), Response::Error(error));
    }

    fn fabric_event(&mut self, event: FabricEvent) {
        let now = self.now();
        match event {
            FabricEvent::PeerConnected {
                peer,
                params,
                summary,
            } => {
                let failures = reachability::failures_before_connect(&self.node, peer);
                self.feed(now, NodeInput::PeerConnected { peer, params });
                let link = PeerLink {
                    negotiated: summary,
                };
                self.feed(now, NodeInput::PeerLink { peer, link });
                reachability::log_connected(&self.node, peer, failures);
            }
            FabricEvent::PeerLost { peer, reason } => {
                self.feed(now, NodeInput::PeerLost { peer });
                reachability::log_lost(&self.node, peer, &reason);
            }
            FabricEvent::Message { peer, bytes } => {
                trace::stamp("message_handled");
                let input = NodeInput::PeerBytes {
                    peer,
                    bytes: &bytes,
                };
                if let Handled::Malformed(error) = self.feed(now, input) {
                    warn!(%peer, %error, "malformed message from peer: ignored");
                }
                // Its outputs may copy an eager payload from these bytes: carry them out now,
                // then give the receive slot back. With none queued (a fetch request held for
                // the pass), the next ready message may come first; a recorded run drives
                // after every input, as its replay does.
                if self.node.outputs_queued() || self.recorder.is_some() {
                    self.effects.input = Some(bytes);
                    self.drain();
                    self.effects.input = None;
                }
            }
            FabricEvent::ReadCompleted { op, result } => {
                self.feed(now, NodeInput::ReadCompletion { op, result });
            }
            FabricEvent::ReadGranted { peer, req, result } => {
                let result = result.map_err(|error| {
                    warn!(%peer, %req, %error, "cannot grant READ access");
                    GrantError::from(error)
                });
                self.feed(now, NodeInput::ReadGranted { peer, req, result });
            }
            FabricEvent::ReadRevoked { peer, req } => {
                self.feed(now, NodeInput::ReadRevoked { peer, req });
            }
        }
    }

    /// Takes the spill completions already waiting in the same turn (as `fabric_turn` does
    /// for peer messages), so a burst of small restores costs one wait and one flush, not
    /// one each.
    fn more_spill_completions(&mut self) {
        if self.recorder.is_some() {
            return;
        }
        for _ in 1..MAX_SPILL_COMPLETIONS_PER_TURN {
            let Some(completion) = self
                .spill_completions
                .as_mut()
                .and_then(|r| r.try_recv().ok())
            else {
                return;
            };
            if self.node.outputs_queued() {
                self.drain();
            }
            self.spill_completed(completion);
        }
    }

    /// A fabric event, then, after a peer message, the events already waiting, up to a turn's
    /// worth, taken without another wait. Outputs still queued are carried out before each next
    /// event (the driver contract); what may wait is only the node's held fetch requests. The
    /// run stops after the first event that is not a message: a completed READ's output is work (the
    /// slice is hashed ahead, some 50 µs per MiB), and taking the next completions in
    /// the same turn would hash them back to back without the loop's polling round between
    /// them — with the holder on the same CPU, its socket then sits full while this loop
    /// hashes, and a 16 MiB fetch took 8% longer (`bench fetch --cpus pinned`). A recorded
    /// run takes one event a turn, driven after it, as its replay drives.
    fn fabric_turn(&mut self, first: FabricEvent) {
        let mut event = first;
        for taken in 1..=MAX_PEER_MESSAGES_PER_TURN {
            let message = matches!(event, FabricEvent::Message { .. });
            self.fabric_event(event);
            if !message || taken == MAX_PEER_MESSAGES_PER_TURN || self.recorder.is_some() {
                return;
            }
            let Some(next) = self.fabric_events.as_mut().and_then(|r| r.try_recv().ok()) else {
                return;
            };
            if self.node.outputs_queued() {
                self.drain();
            }
            event = next;
        }
    }

    fn directory_notice(&mut self, notice: DirectoryNotice) {
        let now = self.now();
        match notice {
            DirectoryNotice::Reply { op, reply } => {
                trace::stamp("directory_reply");
                self.feed(now, NodeInput::DirectoryReply { op, reply });
            }
            DirectoryNotice::Event(event) => {
                trace::stamp("directory_event");
                self.feed(now, NodeInput::DirectoryEvent { event });
            }
            DirectoryNotice::Members(members) => {
                let names: Vec<String> = members.iter().map(|m| m.node.to_string()).collect();
                info!(members = %names.join(" "), "cluster membership");
                let view = members.iter().map(ClusterMember::from).collect();
                self.feed(now, NodeInput::DirectoryMembers { members: view });
                self.members = members.to_vec();
            }
            DirectoryNotice::Health(health) => {
                match (&health, self.node.directory_healthy()) {
                    (Ok(()), false) => info!("directory reachable again"),
                    (Err(reason), true) => {
                        warn!(%reason, "directory unreachable: local objects are still served")
                    }
                    _ => {}
                }
                self.feed(now, NodeInput::DirectoryHealth { health });
            }
        }
    }

    /// The directory, to leave it at shutdown. Its notices are no longer taken: a directory
    /// client waiting for a place learns so, and turns to the leave.
    pub(super) fn directory(
        &mut self,
    ) -> Option<Arc<dyn skyriver_transport::directory::Directory>> {
        self.notices = None;
        self.effects.directory.clone()
    }
}

/// The loop as its node's drive host: the effects carry out the outputs, and what they learnt
/// at once (a client closed, a fabric's immediate answer, a hash) goes back to the node first.
impl DriveHost<'static> for EventLoop {
    type Driver = Effects;

    fn node(&mut self) -> &mut Node {
        &mut self.node
    }

    fn driver(&mut self) -> &mut Effects {
        &mut self.effects
    }

    fn poll_answer(&mut self) -> Option<NodeInput<'static>> {
        let effects = &mut self.effects;
        if let Some((client, reason)) = effects.closed.pop() {
            debug!(%client, %reason, "client connection closed");
            return Some(NodeInput::ClientDisconnected { client });
        }
        if !effects.access_answers.is_empty() {
            return Some(match effects.access_answers.remove(0) {
                AccessAnswer::Granted { peer, req, result } => {
                    NodeInput::ReadGranted { peer, req, result }
                }
                AccessAnswer::Revoked { peer, req } => NodeInput::ReadRevoked { peer, req },
            });
        }
        if !effects.content_hashes.is_empty() {
            let (transfer, actual) = effects.content_hashes.remove(0);
            return Some(NodeInput::ContentHashed { transfer, actual });
        }
        if !effects.directory_refusals.is_empty() {
            let (op, refused) = effects.directory_refusals.remove(0);
            debug!(%op, %refused, "directory request refused at once");
            let reply = skyriver_core::directory::DirectoryReply::Unavailable {
                reason: refused.to_string(),
            };
            return Some(NodeInput::DirectoryReply { op, reply });
        }
        if !effects.read_refusals.is_empty() {
            let (op, full) = effects.read_refusals.remove(0);
            debug!(%op, %full, "READ not posted");
            let capacity = full.capacity as u64;
            return Some(NodeInput::ReadCompletion {
                op,
                result: Err(skyriver_core::ReadError::Busy { capacity }),
            });
        }
        None
    }

    fn observe_input(&mut self, now: Instant, input: &NodeInput<'_>) {
        if let Some(recorder) = &mut self.recorder {
            recorder.input(now, true, input);
        }
    }

    fn observe_output(&mut self, output: &NodeOutput) {
        if let Some(recorder) = &mut self.recorder {
            recorder.output(output);
        }
    }
}

/// The next fabric event; pending forever without a fabric.
async fn recv_fabric(receiver: Option<&mut EventReceiver>) -> Option<FabricEvent> {
    match receiver {
        // A closed channel (its sender stopped) never yields again, so the loop cannot spin.
        Some(receiver) => match receiver.recv().await {
            Some(event) => Some(event),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The next item of an optional bounded channel; pending forever without one.
async fn recv_bounded<T>(receiver: Option<&mut mpsc::Receiver<T>>) -> Option<T> {
    match receiver {
        Some(receiver) => match receiver.recv().await {
            Some(item) => Some(item),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The committer's progress when it moves; pending forever without a committer.
async fn durable_changed(durable: Option<&mut watch::Receiver<u64>>) -> Option<u64> {
    match durable {
        Some(durable) => match durable.changed().await {
            Ok(()) => Some(*durable.borrow_and_update()),
            // The committer stopped (fail-stop aborts the process first).
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// One round of the runtime while the loop polls: it looks for ready I/O without blocking,
/// then runs the tasks that check woke before this loop looks at its inputs again.
///
/// The runtime polls its `block_on` future (this loop) before the tasks an I/O check woke, so
/// a message read by a fabric connection's reader task reaches this loop's channel only one
/// yield after the check that found it. With a single yield, a message that arrived while the
/// loop polled waited for another `sched_yield` and round of the loop before it was handled:
/// the second yield saves that (a quarter of a back-to-back 1 KiB fetch in `skyriver bench
/// breakdown` with the CPUs spread). The loop gives the CPU away (`sched_yield`) before each
/// round: when processes share a CPU, the process this loop just answered (or sent to) runs at
/// once.
async fn runtime_round() {
    // A deferred wake-up: the runtime polls its driver with a zero timeout, then this loop (a
    // client's request is taken here).
    tokio::task::yield_now().await;
    // The tasks that check woke (a connection's reader) run before this loop is polled again.
    tokio::task::yield_now().await;
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400)
}
