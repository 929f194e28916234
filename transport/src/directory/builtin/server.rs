//! The head's server: a thin tokio driver of the core's [`Registry`].
//!
//! One task owns the registry (no lock): connection tasks hand it what they read, through one
//! bounded channel (a fast node waits for room; it cannot starve the others of memory), and it
//! hands each connection's writer the frames the registry decided, through a bounded queue per
//! connection: a node that stops reading fills its queue and is disconnected, never buffered
//! without limit. Connections that have not said hello yet are capped too.
//!
//! Batched at every step, so a node that pipelines costs about one read and one write per
//! burst, not per request: a connection decodes every frame one read brought and hands them
//! over together; the head handles what has arrived (up to [`INPUTS_PER_PASS`]) before it
//! sends the replies; a writer sends what piled up in its queue with one write.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use skyriver_core::directory::{DirectoryEvent, MemberInfo, MemberList};
use skyriver_core::registry::{
    ConnId, FromRegistry, HelloRefused, Registry, RegistryConfig, RegistryMessageError,
    RegistryOutput, ReplicationStats, ToRegistry, PROTOCOL_VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant as TokioInstant};

use super::super::frame;
pub use super::member_lists::MemberListStats;
use super::member_lists::{MemberListCounters, MemberLists};
use super::out_queue::{out_queue, Chunk, QueueReceiver, QueueSender};

/// How often the head refreshes the replication counters it shows (computing the gauges walks
/// every record, so not at every message).
const REPLICATION_STATS_INTERVAL: Duration = Duration::from_secs(1);
/// Frames queued for one node; a node that lets this fill up is disconnected.
const NODE_QUEUE_FRAMES: usize = 4096;
/// Connections still in their hello, on top of the registry's node limit.
const MAX_PENDING_HELLOS: usize = 64;
/// Batches of messages read from all connections and not yet handled by the registry.
const INBOX_BATCHES: usize = 1024;
/// Most messages in one batch: every frame one read brought, up to this many (so the inbox
/// holds at most `INBOX_BATCHES * READ_BATCH_MESSAGES` messages).
const READ_BATCH_MESSAGES: usize = 64;
/// Bytes a connection reads at once: what a node pipelined arrives in one read.
const READ_BUFFER_BYTES: usize = 1024;
/// Inputs the head handles before it sends what the registry decided and looks at its timers
/// again (the replies of one pass go to their writers together).
const INPUTS_PER_PASS: usize = 64;

/// How long the head gathers membership changes before it sends them to nodes with nothing
/// else to hear: 10 µs per member, at most 100 ms. A list sent to every node costs the head a
/// write per node, so while thousands of nodes join (or leave) one by one, sending each change
/// at once would cost N writes per change, N² in all; gathered, the head makes at most about
/// one write per node every 100 ms at 10,000 nodes. Nothing reads stale lists for it: a node
/// is sent the latest list before any reply or event queued for it after a change.
fn member_list_delay(members: usize) -> Duration {
    Duration::from_micros((members as u64).saturating_mul(10)).min(MEMBER_LIST_DELAY_MAX)
}

/// The longest a membership change waits at the head (see [`member_list_delay`]).
const MEMBER_LIST_DELAY_MAX: Duration = Duration::from_millis(100);

/// How the head serves the directory.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Nodes must prove this token in their hello (`Debug` shows `ClusterToken(***)`).
    pub cluster_token: crate::token::ClusterToken,
    /// A node not heard from for this long is dropped.
    pub heartbeat_timeout: Duration,
    /// A connection must say hello within this long.
    pub hello_timeout: Duration,
    /// How long membership changes are gathered before they go to nodes that hear nothing
    /// else meanwhile (`None`: 10 µs per member, at most 100 ms; see [`member_list_delay`]).
    pub member_list_delay: Option<Duration>,
    /// Object bytes per second repairs may start (`None`: the registry's default, see
    /// [`ReplicationLimits`](skyriver_core::registry::ReplicationLimits)).
    pub repair_bytes_per_second: Option<u64>,
}

impl ServerConfig {
    /// Defaults (5 s heartbeat timeout, 5 s hello timeout) with `cluster_token`.
    pub fn new(cluster_token: impl Into<crate::token::ClusterToken>) -> Self {
        Self {
            cluster_token: cluster_token.into(),
            heartbeat_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(5),
            member_list_delay: None,
            repair_bytes_per_second: None,
        }
    }
}

/// The built-in directory service, running on the current tokio runtime.
#[derive(Debug)]
pub struct BuiltinDirectoryServer {
    local_addr: SocketAddr,
    members: watch::Receiver<MemberList>,
    replication: watch::Receiver<ReplicationStats>,
    member_list_counters: Arc<MemberListCounters>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl BuiltinDirectoryServer {
    /// Serves the directory on `listener` until [`shutdown`](Self::shutdown) or drop. Must be
    /// called from within a tokio runtime.
    pub fn spawn(listener: TcpListener, config: ServerConfig) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let mut registry = Registry::new(RegistryConfig {
            cluster_token: config.cluster_token.clone(),
            nonce_key: crate::token::fresh_nonce(),
            heartbeat_timeout: config.heartbeat_timeout,
            limits: super::registry_limits(),
        });
        if let Some(repair_bytes_per_second) = config.repair_bytes_per_second {
            registry.set_replication_limits(skyriver_core::registry::ReplicationLimits {
                repair_bytes_per_second,
                ..Default::default()
            });
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (members_tx, members) = watch::channel(MemberList::default());
        let (replication_tx, replication) = watch::channel(ReplicationStats::default());
        let (inbox, inbox_rx) = mpsc::channel(INBOX_BATCHES);
        let member_lists = MemberLists::default();
        let member_list_counters = member_lists.counters.clone();
        let head = Head {
            registry,
            epoch: TokioInstant::now(),
            writers: BTreeMap::new(),
            outputs: Vec::new(),
            member_lists,
            unpublished_members: None,
            shown_members_epoch: None,
            owed_members: BTreeSet::new(),
            members_due: None,
            member_list_delay: config.member_list_delay,
            members: members_tx,
            replication: replication_tx,
        };
        let tasks = vec![
            tokio::spawn(head.run(inbox_rx, shutdown_rx.clone())),
            tokio::spawn(accept_loop(listener, config, inbox, shutdown_rx)),
        ];
        tracing::info!(%local_addr, "built-in directory serving");
        Ok(Self {
            local_addr,
            members,
            replication,
            member_list_counters,
            shutdown,
            tasks,
        })
    }

    /// Where the service listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The live members, sorted by node id.
    pub fn members(&self) -> Vec<MemberInfo> {
        self.members.borrow().to_vec()
    }

    /// The registry's replication counters and gauges, refreshed every
    /// [`REPLICATION_STATS_INTERVAL`] (for the hosting daemon's metrics).
    pub fn replication_stats(&self) -> watch::Receiver<ReplicationStats> {
        self.replication.clone()
    }

    /// The member-list messages queued to nodes so far: whole lists (to a node's new
    /// connection) and changes (to a node that has the previous list).
    pub fn member_list_stats(&self) -> MemberListStats {
        self.member_list_counters.stats()
    }

    /// Stops accepting, closes every node's connection and waits for the service's tasks.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for BuiltinDirectoryServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// What connection tasks tell the registry's task.
enum HeadInput {
    /// A connection was accepted; its frames go to `writer`.
    Opened { conn: ConnId, writer: QueueSender },
    /// Messages arrived on `conn`, in this order.
    Messages {
        conn: ConnId,
        messages: Vec<ToRegistry>,
    },
    /// `conn` closed or failed.
    Closed { conn: ConnId, reason: String },
}

/// The task that owns the registry.
struct Head {
    registry: Registry,
    epoch: TokioInstant,
    writers: BTreeMap<ConnId, QueueSender>,
    /// What the registry decided, being carried out (kept for its allocation).
    outputs: Vec<RegistryOutput>,
    /// The member list last published to the writers, and its encodings.
    member_lists: MemberLists,
    /// The registry's latest list, while not yet published to the writers.
    unpublished_members: Option<(u64, MemberList)>,
    /// The number of the list shown to [`BuiltinDirectoryServer::members`].
    shown_members_epoch: Option<u64>,
    /// Connections owed the latest member list: it is queued for them at `members_due`, or
    /// before anything else queued for one of them sooner.
    owed_members: BTreeSet<ConnId>,
    members_due: Option<TokioInstant>,
    /// [`ServerConfig::member_list_delay`].
    member_list_delay: Option<Duration>,
    members: watch::Sender<MemberList>,
    replication: watch::Sender<ReplicationStats>,
}

impl Head {
    fn now(&self) -> skyriver_core::Instant {
        skyriver_core::Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    async fn run(
        mut self,
        mut inbox: mpsc::Receiver<HeadInput>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut replication_tick = tokio::time::interval(REPLICATION_STATS_INTERVAL);
        replication_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wake = self
                .registry
                .poll_timeout()
                .map(|at| self.epoch + Duration::from_nanos(at.0))
                .unwrap_or_else(|| TokioInstant::now() + Duration::from_secs(3600));
            let members_due = self.members_due;
            tokio::select! {
                input = inbox.recv() => match input {
                    Some(input) => {
                        self.handle(input);
                        // What else has arrived, up to a pass.
                        for _ in 1..INPUTS_PER_PASS {
                            match inbox.try_recv() {
                                Ok(input) => self.handle(input),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(wake) => {
                    let now = self.now();
                    self.registry.handle_timeout(now);
                }
                _ = tokio::time::sleep_until(members_due.unwrap_or(wake)), if members_due.is_some() => {
                    self.send_owed_members();
                }
                _ = shutdown.changed() => break,
                _ = replication_tick.tick() => {
                    let stats = self.registry.replication_stats();
                    self.replication.send_if_modified(|shown| {
                        let changed = *shown != stats;
                        *shown = stats;
                        changed
                    });
                }
            }
            self.carry_out();
        }
        // Dropping the writers closes every connection.
        tracing::info!("built-in directory stopped");
    }

    fn handle(&mut self, input: HeadInput) {
        let now = self.now();
        match input {
            HeadInput::Opened { conn, writer } => {
                self.writers.insert(conn, writer);
            }
            HeadInput::Messages { conn, messages } => {
                for message in messages {
                    crate::trace::stamp("head_handled");
                    match self.registry.handle_message(now, conn, message) {
                        Ok(()) => {}
                        Err(RegistryMessageError::Refused(refusal)) => {
                            tracing::warn!(%conn, reason = %refusal, "directory hello refused");
                        }
                        Err(RegistryMessageError::NotAMember(error)) => {
                            tracing::debug!(%error, "closing a connection that is not a member's");
                            self.writers.remove(&conn);
                        }
                    }
                }
            }
            HeadInput::Closed { conn, reason } => {
                if let Some(node) = self.member_on(conn) {
                    tracing::info!(%node, %reason, "node left");
                }
                self.writers.remove(&conn);
                self.registry.handle_disconnect(now, conn);
            }
        }
    }

    fn member_on(&self, conn: ConnId) -> Option<skyriver_core::NodeId> {
        self.registry.member_on(conn)
    }

    /// Sends what the registry decided; a new member list is published (for
    /// [`BuiltinDirectoryServer::members`]) before it goes to any node.
    fn carry_out(&mut self) {
        // Until nothing is left: dropping a node that stopped reading decides more.
        loop {
            let mut outputs = std::mem::take(&mut self.outputs);
            outputs.extend(std::iter::from_fn(|| self.registry.poll_output()));
            if outputs.is_empty() {
                self.outputs = outputs;
                return;
            }
            let latest_members = outputs.iter().rev().find_map(|output| match output {
                RegistryOutput::SendMembers { members, epoch, .. } => Some((members, *epoch)),
                _ => None,
            });
            if let Some((members, epoch)) = latest_members {
                if self.shown_members_epoch != Some(epoch) {
                    self.shown_members_epoch = Some(epoch);
                    let _ = self.members.send(members.clone());
                }
            }
            for output in outputs.drain(..) {
                match output {
                    RegistryOutput::Send { conn, message } => self.send(conn, &message),
                    RegistryOutput::SendMembers {
                        conns,
                        members,
                        epoch,
                    } => {
                        self.unpublished_members = Some((epoch, members));
                        self.owed_members.extend(conns);
                        if self.members_due.is_none() {
                            let delay = self
                                .member_list_delay
                                .unwrap_or_else(|| member_list_delay(self.registry.member_count()));
                            self.members_due = Some(TokioInstant::now() + delay);
                        }
                    }
                    RegistryOutput::Close { conn, reason } => {
                        tracing::info!(%conn, %reason, "closing a directory connection");
                        // The writer flushes what is queued, then closes the stream.
                        self.writers.remove(&conn);
                    }
                }
            }
            self.outputs = outputs;
        }
    }

    /// Queues `message` for `conn`, after the member list it is owed; a connection whose queue
    /// is full is dropped.
    fn send(&mut self, conn: ConnId, message: &FromRegistry) {
        if !self.owed_members.is_empty() && self.owed_members.remove(&conn) {
            self.send_members(conn);
        }
        let Some(writer) = self.writers.get(&conn) else {
            return;
        };
        crate::trace::stamp("head_queued");
        if let FromRegistry::Event(DirectoryEvent::Located { .. }) = message {
            // A hint: dropped for a node that is behind, never the node for it.
            if !writer.send_hint(message) {
                tracing::debug!(%conn, "a pushed location dropped: the node's queue is behind");
            }
            return;
        }
        if writer.send(message).is_err() {
            self.drop_slow_reader(conn);
        }
    }

    /// Queues the latest member list for every connection owed it.
    fn send_owed_members(&mut self) {
        self.members_due = None;
        for conn in std::mem::take(&mut self.owed_members) {
            self.send_members(conn);
        }
    }

    /// Queues the latest member list for `conn`, as changes from the one it was last given
    /// when it can, merged with one still waiting right in front of it (see
    /// [`out_queue`](super::out_queue)); a connection whose queue is full is dropped.
    fn send_members(&mut self, conn: ConnId) {
        let Some(writer) = self.writers.get_mut(&conn) else {
            return;
        };
        // Published when first sent: one step from the list sent before, however many
        // changes the registry made meanwhile.
        if let Some((epoch, members)) = self.unpublished_members.take() {
            self.member_lists.update(epoch, members);
        }
        if writer.send_members(&self.member_lists).is_err() {
            self.drop_slow_reader(conn);
        }
    }

    fn drop_slow_reader(&mut self, conn: ConnId) {
        tracing::warn!(%conn, "node disconnected: it stopped reading its queue");
        self.writers.remove(&conn);
        self.owed_members.remove(&conn);
        let now = self.now();
        self.registry.handle_disconnect(now, conn);
    }
}

async fn accept_loop(
    listener: TcpListener,
    config: ServerConfig,
    inbox: mpsc::Sender<HeadInput>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connections = Arc::new(Semaphore::new(super::MAX_NODES + MAX_PENDING_HELLOS));
    let mut next_conn = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = connections.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "directory connection refused: too many connections");
                        continue;
                    };
                    next_conn += 1;
                    let conn = ConnId(next_conn);
                    let inbox = inbox.clone();
                    let shutdown = shutdown.clone();
                    let hello_timeout = config.hello_timeout;
                    tokio::spawn(async move {
                        serve_connection(conn, stream, peer, hello_timeout, inbox, shutdown).await;
                        drop(slot);
                    });
                }
                Err(error) => {
                    // Out of fds or similar: back off briefly instead of spinning.
                    tracing::warn!(%error, "directory accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Writes a refusal the registry never saw (no hello, or a first frame that was not one) and
/// closes. `retryable` tells the node whether the same hello could succeed later.
async fn refuse(writer: &mut OwnedWriteHalf, reason: String, retryable: bool) {
    let frame = frame::encode(&FromRegistry::Refused { reason, retryable });
    let _ = timeout(Duration::from_secs(1), async {
        writer.write_all(&frame).await?;
        writer.shutdown().await
    })
    .await;
}

async fn serve_connection(
    conn: ConnId,
    stream: TcpStream,
    peer: SocketAddr,
    hello_timeout: Duration,
    inbox: mpsc::Sender<HeadInput>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = Vec::new();
    let first = timeout(
        hello_timeout,
        frame::read::<ToRegistry, _>(&mut reader, &mut buf),
    )
    .await;
    let hello = match first {
        Ok(Ok(Some(hello @ ToRegistry::Hello(_)))) => hello,
        Ok(Ok(None)) => return,
        Ok(Ok(Some(_))) => {
            return refuse(&mut writer, "the first frame must be a hello".into(), false).await;
        }
        Ok(Err(error)) => {
            let reason = match skyriver_core::registry::wire::announced_version(&buf) {
                Some(version) if version != PROTOCOL_VERSION => {
                    HelloRefused::Version { version }.to_string()
                }
                _ => format!(
                    "malformed hello ({error}); is this a Skyriver daemon of the same version?"
                ),
            };
            tracing::warn!(%peer, %reason, "directory hello refused");
            return refuse(&mut writer, reason, false).await;
        }
        Err(_) => {
            // A node that forms with thousands of others, or a busy head, can miss the bound
            // and still be sound: it may try again.
            let reason = format!("no hello within {} ms", hello_timeout.as_millis());
            return refuse(&mut writer, reason, true).await;
        }
    };
    let (frames_tx, frames) = out_queue(NODE_QUEUE_FRAMES);
    let opened = HeadInput::Opened {
        conn,
        writer: frames_tx,
    };
    if inbox.send(opened).await.is_err() {
        return;
    }
    if inbox
        .send(HeadInput::Messages {
            conn,
            messages: vec![hello],
        })
        .await
        .is_err()
    {
        return;
    }
    let reason = tokio::select! {
        reason = read_messages(conn, &mut reader, &inbox) => reason,
        reason = write_frames(writer, frames) => reason,
        _ = shutdown.changed() => "the head is shutting down".to_string(),
    };
    let _ = inbox.send(HeadInput::Closed { conn, reason }).await;
}

/// Reads frames until the connection ends, and hands them to the head in order: every frame
/// one read brought goes in one batch (two, … past [`READ_BATCH_MESSAGES`]).
async fn read_messages(
    conn: ConnId,
    reader: &mut OwnedReadHalf,
    inbox: &mpsc::Sender<HeadInput>,
) -> String {
    let mut frames = frame::FrameBuffer::new(READ_BUFFER_BYTES);
    loop {
        match frames.fill(reader).await {
            Ok(true) => {}
            Ok(false) => return "connection closed".into(),
            Err(error) => return error.to_string(),
        }
        loop {
            let mut messages = Vec::new();
            let mut failed = None;
            while messages.len() < READ_BATCH_MESSAGES {
                match frames.decode_next::<ToRegistry>() {
                    Ok(Some(message)) => {
                        crate::trace::stamp("head_read");
                        messages.push(message);
                    }
                    Ok(None) => break,
                    Err(error) => {
                        failed = Some(error.to_string());
                        break;
                    }
                }
            }
            let full = messages.len() == READ_BATCH_MESSAGES;
            // Waits for room: a node that floods the head is slowed, not buffered.
            if !messages.is_empty()
                && inbox
                    .send(HeadInput::Messages { conn, messages })
                    .await
                    .is_err()
            {
                return "the head stopped".into();
            }
            if let Some(reason) = failed {
                return reason;
            }
            if !full {
                break;
            }
        }
    }
}

/// Writes what the head queues for the node, each batch with as few writes as the socket
/// takes it in (one, unless the node reads slowly).
async fn write_frames(mut writer: OwnedWriteHalf, mut frames: QueueReceiver) -> String {
    let mut batch = Vec::new();
    while frames.next_batch(&mut batch).await {
        if let Err(error) = write_chunks(&mut writer, &batch).await {
            return format!("write failed: {error}");
        }
        crate::trace::stamp("head_written");
    }
    let _ = writer.shutdown().await;
    "session ended".into()
}

/// Writes `chunks`, in order, with vectored writes (a plain one for one chunk).
async fn write_chunks<W>(writer: &mut W, chunks: &[Chunk]) -> std::io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    /// Slices one write passes at most.
    const SLICES: usize = 64;
    if let [chunk] = chunks {
        // The usual case (replies only): a plain write, cheaper than a vectored one.
        return writer.write_all(chunk.bytes()).await;
    }
    let (mut first, mut offset) = (0, 0);
    while first < chunks.len() {
        let mut slices = [std::io::IoSlice::new(&[]); SLICES];
        let mut count = 0;
        for (i, chunk) in chunks[first..].iter().take(SLICES).enumerate() {
            let bytes = chunk.bytes();
            slices[i] = std::io::IoSlice::new(if i == 0 { &bytes[offset..] } else { bytes });
            count += 1;
        }
        let mut written = writer.write_vectored(&slices[..count]).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        // Past what was written: whole chunks, then into the next.
        while first < chunks.len() {
            let left = chunks[first].bytes().len() - offset;
            if written < left {
                offset += written;
                break;
            }
            written -= left;
            first += 1;
            offset = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks written through a pipe that takes a few bytes at a time (so writes end inside
    /// chunks and between them) arrive whole and in order, also past the slices of one write.
    #[tokio::test]
    async fn chunks_arrive_whole_and_in_order_through_partial_writes() {
        use tokio::io::AsyncReadExt;
        let chunks: Vec<Chunk> = (0..200u8)
            .map(|i| {
                let bytes = vec![i; 1 + i as usize % 7];
                if i % 3 == 0 {
                    Chunk::Shared(bytes.into())
                } else {
                    Chunk::Encoded(bytes)
                }
            })
            .collect();
        let expected: Vec<u8> = chunks.iter().flat_map(|c| c.bytes().to_vec()).collect();
        let (mut writer, mut reader) = tokio::io::duplex(5);
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.unwrap();
            got
        });
        write_chunks(&mut writer, &chunks).await.unwrap();
        drop(writer);
        let got = timeout(Duration::from_secs(10), reading)
            .await
            .expect("the reader gets everything")
            .unwrap();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_members_frame_decodes_as_sent() {
        let members = vec![MemberInfo {
            node: skyriver_core::NodeId(3),
            fabric_addr: SocketAddr::from(([127, 0, 0, 1], 9)),
            fabric: "tcp".into(),
            incarnation: 2,
            failure_domain: String::new(),
        }];
        let members = MemberList::from(members);
        let message = FromRegistry::Members { epoch: 7, members };
        let bytes = frame::encode(&message);
        let decoded: FromRegistry = postcard::from_bytes(&bytes[4..]).unwrap();
        assert_eq!(decoded, message);
    }
}
