//! The one reconnecting directory client, shared by both backends: a tokio driver of the core's
//! sans-IO [`DirectorySession`] (hello, heartbeats, backoff, replay of publications and
//! subscriptions, `Unavailable` for whatever cannot be served, health notices).
//!
//! A backend only opens [`Link`]s: a pair of channels carrying [`ToRegistry`] out and
//! [`FromRegistry`] in. The built-in backend's link is a TCP connection to the head, framed;
//! the Redis backend's link is an adapter task that answers the same messages from Redis.

use std::future::Future;
use std::time::Duration;

use skyriver_core::directory::{DirectoryOpId, DirectoryRequest};
use skyriver_core::registry::session::{DirectorySession, SessionError, SessionOutput};
use skyriver_core::registry::{FromRegistry, ToRegistry};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant as TokioInstant};

use super::{Directory, DirectoryError, LeaveFuture, LinkError, NoticeSender, SubmitRefused};

/// Bound on a clean leave (the goodbye reaching the service).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Messages from the registry waiting for the client task, at most, per link.
pub(crate) const LINK_INCOMING_QUEUE: usize = 256;

/// Messages for the registry waiting for the link's task, at most, per link.
pub(crate) const LINK_OUTGOING_QUEUE: usize = 256;

/// One open connection to a registry (or to something that answers like one).
///
/// Both ways are bounded. What comes in ([`LINK_INCOMING_QUEUE`]): the link's task waits for a
/// place, and meanwhile reads nothing more from the registry (TCP back-pressure to the head;
/// Redis answers wait). What goes out ([`LINK_OUTGOING_QUEUE`]): the client task never waits
/// for the link alone, because the link's task may itself be waiting for the client task to
/// take what came in; it holds the message that found no place and, until the link makes
/// room, keeps taking what comes in but takes no new request (see [`Driver::run`]).
pub(crate) struct Link {
    /// Messages for the registry; dropping it asks the link to close cleanly.
    pub(crate) outgoing: Option<mpsc::Sender<ToRegistry>>,
    /// Messages from the registry; `Err` (or the end) means the link is lost, with why.
    pub(crate) incoming: mpsc::Receiver<Result<FromRegistry, LinkError>>,
    /// The task that carries `outgoing` (and, for an adapter, everything else).
    pub(crate) task: Option<JoinHandle<()>>,
    /// A helper task (the TCP reader), aborted with the link.
    pub(crate) helper: Option<JoinHandle<()>>,
}

/// What became of a message handed to a link without waiting.
enum Handed {
    /// The link has it.
    Sent,
    /// No place now; the message is given back.
    Full(ToRegistry),
    /// The link is closed.
    Closed,
}

impl Link {
    /// Hands `message` to the link if it has a place, without waiting.
    fn try_send(&self, message: ToRegistry) -> Handed {
        match &self.outgoing {
            Some(outgoing) => match outgoing.try_send(message) {
                Ok(()) => Handed::Sent,
                Err(mpsc::error::TrySendError::Full(message)) => Handed::Full(message),
                Err(mpsc::error::TrySendError::Closed(_)) => Handed::Closed,
            },
            None => Handed::Closed,
        }
    }

    /// Hands `message` to the link, waiting for a place while dropping what comes in (the
    /// node is leaving: answers no longer matter, but the link's task may wait to hand one
    /// over). `false` if the link closed.
    async fn send_discarding_incoming(&mut self, message: ToRegistry) -> bool {
        let Some(outgoing) = self.outgoing.clone() else {
            return false;
        };
        let send = outgoing.send(message);
        tokio::pin!(send);
        loop {
            tokio::select! {
                sent = &mut send => return sent.is_ok(),
                got = self.incoming.recv() => if got.is_none() {
                    return false;
                },
            }
        }
    }

    /// Closes the link after what was sent reached the other side, bounded by `limit`.
    async fn close_gracefully(mut self, limit: Duration) {
        self.outgoing = None;
        let Some(mut task) = self.task.take() else {
            return;
        };
        let drained = async {
            loop {
                tokio::select! {
                    _ = &mut task => return,
                    // The task may wait to hand over an answer before it sees the close.
                    got = self.incoming.recv() => if got.is_none() {
                        let _ = (&mut task).await;
                        return;
                    },
                }
            }
        };
        if timeout(limit, drained).await.is_err() {
            task.abort();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(helper) = self.helper.take() {
            helper.abort();
        }
    }
}

/// Opens links to one directory service.
pub(crate) trait Connector: Clone + Send + Sync + 'static {
    /// Opens a new link (bounded in time by the connector itself).
    fn connect(&mut self) -> impl Future<Output = Result<Link, LinkError>> + Send;
}

/// What the client task takes from its handle.
enum Command {
    Submit(DirectoryOpId, DirectoryRequest),
    Leave(oneshot::Sender<()>),
    Abandon,
}

/// A node's connection to a directory service, of either backend. Dropping it leaves the
/// cluster.
#[derive(Debug)]
pub struct DirectoryClient {
    commands: mpsc::Sender<Command>,
    /// The bound of `commands`, for the refusal.
    max_queued_requests: usize,
    description: String,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Submit(op, request) => write!(f, "Submit({op}, {request})"),
            Command::Leave(_) => write!(f, "Leave"),
            Command::Abandon => write!(f, "Abandon"),
        }
    }
}

impl DirectoryClient {
    /// Stops without leaving, as a crash would: no goodbye; the connection just drops (Redis
    /// keeps the node's keys until their TTL). For fault drills and tests.
    pub async fn abandon(self) {
        let _ = self.commands.send(Command::Abandon).await;
        // The task drops the link on receipt; wait until it did.
        self.commands.closed().await;
    }
}

impl Directory for DirectoryClient {
    fn submit(&self, op: DirectoryOpId, request: DirectoryRequest) -> Result<(), SubmitRefused> {
        self.commands
            .try_send(Command::Submit(op, request))
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => SubmitRefused::Busy {
                    queued: self.max_queued_requests,
                },
                mpsc::error::TrySendError::Closed(_) => SubmitRefused::Stopped,
            })
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn leave(&self) -> LeaveFuture {
        let (done, left) = oneshot::channel();
        let asked = self.commands.try_send(Command::Leave(done)).is_ok();
        Box::pin(async move {
            if asked {
                let _ = timeout(LEAVE_TIMEOUT + Duration::from_millis(500), left).await;
            }
        })
    }
}

/// How the client connects, beyond the session's own settings.
#[derive(Debug, Clone)]
pub(crate) struct ClientTiming {
    /// Bound on one connection attempt (opening the link plus the hello).
    pub(crate) connect_timeout: Duration,
    /// How long the first connection keeps retrying a retryable refusal, or an attempt that
    /// timed out (the directory is there but slow).
    pub(crate) join_timeout: Duration,
    /// Most requests queued between the handle and the task.
    pub(crate) max_queued_requests: usize,
}

/// The session's clock: nanoseconds since the client started.
struct Clock(TokioInstant);

impl Clock {
    fn now(&self) -> skyriver_core::Instant {
        skyriver_core::Instant(self.0.elapsed().as_nanos() as u64)
    }

    fn at(&self, instant: skyriver_core::Instant) -> TokioInstant {
        self.0 + Duration::from_nanos(instant.0)
    }
}

/// Registers the node (retrying a retryable refusal, or an attempt that timed out, until
/// `join_timeout`), then keeps the session up in a background task. Fails if the service
/// cannot be reached or refuses.
pub(crate) async fn start<C: Connector>(
    mut session: DirectorySession,
    mut connector: C,
    timing: ClientTiming,
    notices: NoticeSender,
    addr: String,
    description: String,
) -> Result<DirectoryClient, DirectoryError> {
    let clock = Clock(TokioInstant::now());
    let deadline = TokioInstant::now() + timing.join_timeout;
    let mut waiting_logged = false;
    let link = loop {
        let (error, reason, what) =
            match first_connection(&mut session, &mut connector, &clock, &timing, &notices).await {
                Ok(link) => break link,
                // The directory is there but slow (a head forming thousands of sessions at once):
                // the same hello may pass on the next try, as after a retryable refusal.
                Err(FirstConnection::Unreachable(source @ LinkError::Timeout { .. })) => {
                    let reason = source.to_string();
                    let error = DirectoryError::Unreachable {
                        addr: addr.clone(),
                        source,
                    };
                    (error, reason, "the directory did not answer in time")
                }
                Err(FirstConnection::Unreachable(source)) => {
                    return Err(DirectoryError::Unreachable { addr, source })
                }
                Err(FirstConnection::Refused { reason, retryable }) => {
                    if !retryable {
                        return Err(DirectoryError::Refused(reason));
                    }
                    let error = DirectoryError::Refused(reason.clone());
                    (error, reason, "the directory refused this node for now")
                }
            };
        if TokioInstant::now() >= deadline {
            return Err(error);
        }
        // Once, not at every retry: the outcome comes when the wait ends.
        if !waiting_logged {
            waiting_logged = true;
            tracing::info!(
                %reason,
                "{what}; retrying for up to {} ms",
                timing.join_timeout.as_millis()
            );
        }
        let retry_at = session
            .poll_timeout()
            .map(|at| clock.at(at))
            .unwrap_or(deadline);
        if retry_at > deadline {
            tokio::time::sleep_until(deadline).await;
            return Err(error);
        }
        tokio::time::sleep_until(retry_at).await;
    };
    let (commands, command_rx) = mpsc::channel(timing.max_queued_requests.max(1));
    let mut driver = Driver {
        session,
        connector,
        clock,
        connect_timeout: timing.connect_timeout,
        notices,
        link: Some(link),
        unsent: None,
        connecting: None,
    };
    // Health(Ok) (and the replay, nothing on a first connection) before the caller goes on.
    driver.carry_out().await;
    tokio::spawn(driver.run(command_rx));
    Ok(DirectoryClient {
        commands,
        max_queued_requests: timing.max_queued_requests.max(1),
        description,
    })
}

enum FirstConnection {
    Unreachable(LinkError),
    Refused { reason: String, retryable: bool },
}

/// One attempt at the first connection: open, hello, challenge, proof, welcome. On success,
/// what the session has to do next (health, replay) is left to the driver.
async fn first_connection<C: Connector>(
    session: &mut DirectorySession,
    connector: &mut C,
    clock: &Clock,
    timing: &ClientTiming,
    notices: &NoticeSender,
) -> Result<Link, FirstConnection> {
    session.handle_timeout(clock.now());
    let mut outputs = Vec::new();
    while let Some(output) = session.poll_output() {
        outputs.push(output);
    }
    if !outputs.contains(&SessionOutput::Connect) {
        // Not due yet (a retry after a refusal): the caller slept until the session's timer.
        return Err(FirstConnection::Unreachable(LinkError::NotDue));
    }
    // Open, then carry the handshake (hello, challenge, proof, welcome) until the session is
    // registered or turned away, all under the connect timeout. The handshake is a message
    // or two each way: the link's places (empty at first) always hold them.
    let attempt = async {
        let mut link = connector.connect().await?;
        session.handle_connected(clock.now());
        loop {
            while let Some(output) = session.poll_output() {
                if let SessionOutput::Send(message) = output {
                    if !matches!(link.try_send(message), Handed::Sent) {
                        return Err(LinkError::Closed);
                    }
                }
            }
            let message = match link.incoming.recv().await {
                Some(Ok(message)) => message,
                Some(Err(error)) => return Err(error),
                None => return Err(LinkError::Closed),
            };
            let result = session.handle_message(clock.now(), message);
            if result.is_err() || session.is_up() {
                return Ok((link, result));
            }
        }
    };
    let (link, result) = match timeout(timing.connect_timeout, attempt).await {
        Ok(Ok(got)) => got,
        Ok(Err(error)) => {
            session.handle_connect_failed(clock.now(), &error.to_string());
            return Err(FirstConnection::Unreachable(error));
        }
        Err(_) => {
            let error = LinkError::timeout("the hello", timing.connect_timeout);
            session.handle_connect_failed(clock.now(), &error.to_string());
            return Err(FirstConnection::Unreachable(error));
        }
    };
    let refusal = match result {
        Ok(()) => return Ok(link),
        Err(SessionError::Refused { reason, retryable }) => {
            FirstConnection::Refused { reason, retryable }
        }
        Err(other) => FirstConnection::Unreachable(LinkError::Session(other)),
    };
    // Turned away: the link goes. The notices of a failed attempt (health) need no place: a
    // full queue before the node even joined drops them, and the next attempt says more.
    while let Some(output) = session.poll_output() {
        if let SessionOutput::Notice(notice) = output {
            let _ = notices.try_send(notice);
        }
    }
    Err(refusal)
}

/// The background task: one owner of the session, its link and its timers.
struct Driver<C> {
    session: DirectorySession,
    connector: C,
    clock: Clock,
    connect_timeout: Duration,
    notices: NoticeSender,
    link: Option<Link>,
    /// The message the link had no place for: it goes first when the link makes room, and
    /// meanwhile the session's further outputs wait in the session and no request is taken.
    unsent: Option<ToRegistry>,
    /// A connection attempt under way, so requests are answered while it runs.
    connecting: Option<JoinHandle<Result<Link, LinkError>>>,
}

impl<C: Connector> Driver<C> {
    /// Serves the session until the handle goes or asks to leave.
    ///
    /// Waits in two places only, each with the pressure going back where it came from: for a
    /// place in the node's notices (taking nothing else meanwhile: the link's incoming queue
    /// fills, then its reader stops reading; the request queue fills, then the node is
    /// refused), and for room in the link (taking no request meanwhile, but still what comes
    /// in, so a link's task waiting to hand over an answer is never stuck on this task).
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        loop {
            self.carry_out().await;
            let wake = self
                .session
                .poll_timeout()
                .map(|at| self.clock.at(at))
                .unwrap_or_else(|| TokioInstant::now() + Duration::from_secs(3600));
            let held = self.unsent.is_some();
            let room_for = match (&self.link, held) {
                (Some(link), true) => link.outgoing.clone(),
                _ => None,
            };
            tokio::select! {
                command = commands.recv(), if !held => match command {
                    Some(Command::Submit(op, request)) => {
                        self.session.handle_submit(self.clock.now(), op, request);
                    }
                    Some(Command::Abandon) => return,
                    Some(Command::Leave(done)) => {
                        self.leave().await;
                        let _ = done.send(());
                        return;
                    }
                    None => {
                        self.leave().await;
                        return;
                    }
                },
                room = reserve(room_for), if held => match room {
                    Ok(permit) => {
                        if let Some(message) = self.unsent.take() {
                            permit.send(message);
                        }
                    }
                    Err(_) => self.lose_link(&LinkError::Closed),
                },
                message = next_message(&mut self.link) => {
                    let now = self.clock.now();
                    match message {
                        Ok(message) => {
                            if let Err(error) = self.session.handle_message(now, message) {
                                tracing::warn!(%error, "dropping the directory connection");
                                self.drop_link();
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "lost the directory");
                            self.lose_link(&error);
                        }
                    }
                },
                attempt = attempt_done(&mut self.connecting) => {
                    self.connecting = None;
                    let now = self.clock.now();
                    match attempt {
                        Ok(link) => {
                            self.link = Some(link);
                            self.session.handle_connected(now);
                        }
                        Err(error) => {
                            tracing::debug!(%error, "directory reconnection failed");
                            self.session.handle_connect_failed(now, &error.to_string());
                        }
                    }
                },
                _ = tokio::time::sleep_until(wake) => {
                    self.session.handle_timeout(self.clock.now());
                }
            }
        }
    }

    /// Drops the link (and what it could not take yet: the session replays what matters).
    fn drop_link(&mut self) {
        self.link = None;
        self.unsent = None;
    }

    /// The link is gone for `error`: the session hears it.
    fn lose_link(&mut self, error: &LinkError) {
        self.drop_link();
        self.session
            .handle_disconnected(self.clock.now(), &error.to_string());
    }

    /// Carries out what the session asked for, in order, until it has nothing more or the
    /// link has no place for a message (which is then held in `unsent`).
    async fn carry_out(&mut self) {
        while self.unsent.is_none() {
            let Some(output) = self.session.poll_output() else {
                return;
            };
            match output {
                SessionOutput::Send(message) => {
                    let handed = match &self.link {
                        Some(link) => link.try_send(message),
                        None => Handed::Closed,
                    };
                    match handed {
                        Handed::Sent => {}
                        Handed::Full(message) => self.unsent = Some(message),
                        Handed::Closed => self.lose_link(&LinkError::Closed),
                    }
                }
                SessionOutput::Notice(notice) => {
                    // Waits for a place (see `run`). The node stopped listening: nothing to do,
                    // the task ends with its commands.
                    let _ = self.notices.send(notice).await;
                }
                SessionOutput::Disconnect { reason } => {
                    tracing::warn!(%reason, "dropping the directory connection");
                    self.drop_link();
                }
                SessionOutput::Connect => {
                    self.drop_link();
                    let mut connector = self.connector.clone();
                    let limit = self.connect_timeout;
                    self.connecting = Some(tokio::spawn(async move {
                        match timeout(limit, connector.connect()).await {
                            Ok(result) => result,
                            Err(_) => Err(LinkError::timeout("the connection", limit)),
                        }
                    }));
                }
            }
        }
    }

    /// Says goodbye (if registered) and closes the link once it went out, within
    /// [`LEAVE_TIMEOUT`].
    async fn leave(&mut self) {
        if let Some(attempt) = self.connecting.take() {
            attempt.abort();
        }
        self.session.handle_leave(self.clock.now());
        let Some(mut link) = self.link.take() else {
            return;
        };
        let mut messages: Vec<ToRegistry> = self.unsent.take().into_iter().collect();
        while let Some(output) = self.session.poll_output() {
            if let SessionOutput::Send(message) = output {
                messages.push(message);
            }
        }
        let said = async {
            for message in messages {
                if !link.send_discarding_incoming(message).await {
                    return false;
                }
            }
            true
        };
        if timeout(LEAVE_TIMEOUT, said).await.unwrap_or(false) {
            link.close_gracefully(LEAVE_TIMEOUT).await;
        }
    }
}

/// Room for one message in `outgoing`; pending forever without a link.
async fn reserve(
    outgoing: Option<mpsc::Sender<ToRegistry>>,
) -> Result<mpsc::OwnedPermit<ToRegistry>, mpsc::error::SendError<()>> {
    match outgoing {
        Some(outgoing) => outgoing.reserve_owned().await,
        None => std::future::pending().await,
    }
}

/// The outcome of the connection attempt under way; pending forever without one.
async fn attempt_done(
    connecting: &mut Option<JoinHandle<Result<Link, LinkError>>>,
) -> Result<Link, LinkError> {
    match connecting {
        Some(attempt) => match attempt.await {
            Ok(result) => result,
            Err(error) => Err(LinkError::Attempt(std::sync::Arc::new(error))),
        },
        None => std::future::pending().await,
    }
}

/// The next message on the link; pending forever without one.
async fn next_message(link: &mut Option<Link>) -> Result<FromRegistry, LinkError> {
    match link {
        Some(link) => match link.incoming.recv().await {
            Some(result) => result,
            None => Err(LinkError::Closed),
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use skyriver_core::directory::{DirectoryNotice, DirectoryReply, MemberInfo};
    use skyriver_core::registry::session::SessionConfig;
    use skyriver_core::registry::{ConnId, Registry, RegistryConfig, RegistryOutput};
    use skyriver_core::{NodeId, ObjectId};
    use tokio::sync::watch;

    use super::*;

    const TOKEN: &str = "client-bounds";
    /// Bound on every wait for progress.
    const WAIT: Duration = Duration::from_secs(10);

    /// Links to the core's registry in this process. The link's task takes one message at a
    /// time, and none while `paused`, so a test can hold the link back.
    #[derive(Clone)]
    struct InProcess {
        registry: Arc<Mutex<Registry>>,
        outgoing_places: usize,
        paused: watch::Receiver<bool>,
        /// The outgoing side of the link opened last, to watch how full it is.
        opened: Arc<Mutex<Option<mpsc::Sender<ToRegistry>>>>,
    }

    impl Connector for InProcess {
        async fn connect(&mut self) -> Result<Link, LinkError> {
            let conn = ConnId(1);
            let (outgoing, mut to_registry) = mpsc::channel::<ToRegistry>(self.outgoing_places);
            let (answers, incoming) = mpsc::channel(LINK_INCOMING_QUEUE);
            *self.opened.lock().unwrap() = Some(outgoing.clone());
            let registry = self.registry.clone();
            let mut paused = self.paused.clone();
            let task = tokio::spawn(async move {
                while let Some(message) = to_registry.recv().await {
                    if paused.wait_for(|paused| !paused).await.is_err() {
                        return;
                    }
                    let outputs: Vec<RegistryOutput> = {
                        let mut registry = registry.lock().unwrap();
                        let _ = registry.handle_message(skyriver_core::Instant(1), conn, message);
                        std::iter::from_fn(|| registry.poll_output()).collect()
                    };
                    for output in outputs {
                        let message = match output {
                            RegistryOutput::Send { message, .. } => message,
                            RegistryOutput::SendMembers { members, epoch, .. } => {
                                FromRegistry::Members { epoch, members }
                            }
                            RegistryOutput::Close { .. } => return,
                        };
                        if answers.send(Ok(message)).await.is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(Link {
                outgoing: Some(outgoing),
                incoming,
                task: Some(task),
                helper: None,
            })
        }
    }

    struct Fixture {
        client: DirectoryClient,
        notices: mpsc::Receiver<DirectoryNotice>,
        pause: watch::Sender<bool>,
        link: mpsc::Sender<ToRegistry>,
    }

    /// A node joined to an in-process registry: at most `queued` requests wait for the client
    /// task, `link_places` messages for the link, `notice_places` notices for the node.
    async fn joined(queued: usize, link_places: usize, notice_places: usize) -> Fixture {
        let (pause, paused) = watch::channel(false);
        let connector = InProcess {
            registry: Arc::new(Mutex::new(Registry::new(RegistryConfig::new(
                TOKEN, [7; 32],
            )))),
            outgoing_places: link_places,
            paused,
            opened: Arc::new(Mutex::new(None)),
        };
        let opened = connector.opened.clone();
        let me = MemberInfo {
            node: NodeId(1),
            fabric_addr: "127.0.0.1:7000".parse().unwrap(),
            fabric: "tcp".into(),
            incarnation: 1,
            failure_domain: String::new(),
        };
        let session = DirectorySession::new(
            SessionConfig::default(),
            me,
            TOKEN.into(),
            [1; 32],
            skyriver_core::Instant::ZERO,
        );
        let timing = ClientTiming {
            connect_timeout: WAIT,
            join_timeout: WAIT,
            max_queued_requests: queued,
        };
        let (notice_tx, notices) = mpsc::channel(notice_places);
        let client = start(
            session,
            connector,
            timing,
            notice_tx,
            "in process".into(),
            "in process".into(),
        )
        .await
        .expect("joins");
        let link = opened.lock().unwrap().clone().expect("a link");
        Fixture {
            client,
            notices,
            pause,
            link,
        }
    }

    fn lookup(n: u64) -> DirectoryRequest {
        DirectoryRequest::Lookup {
            id: ObjectId::from_u64(n),
            subscribe: false,
        }
    }

    /// Polls `done` (letting the other tasks run between polls) until it holds.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = TokioInstant::now() + WAIT;
        while !done() {
            assert!(
                TokioInstant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Lets every other task of this (single-threaded) runtime run a few turns: enough for a
    /// task that could take a queued request to take it.
    async fn let_others_run() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// Takes notices until each op of `ops` has had its reply; no op is answered twice and no
    /// other op is answered.
    async fn expect_replies(notices: &mut mpsc::Receiver<DirectoryNotice>, ops: &[u64]) {
        let mut missing: std::collections::BTreeSet<u64> = ops.iter().copied().collect();
        while !missing.is_empty() {
            let notice = timeout(WAIT, notices.recv())
                .await
                .unwrap_or_else(|_| panic!("no reply for {missing:?}"))
                .expect("the client is running");
            if let DirectoryNotice::Reply { op, reply } = notice {
                assert!(missing.remove(&op.0), "{op} answered twice, or never asked");
                assert!(
                    matches!(reply, DirectoryReply::Located { .. }),
                    "{op}: {reply:?}"
                );
            }
        }
    }

    /// A link that takes nothing fills its places; the client task then holds one message and
    /// takes no more requests, so the request queue fills and the next request is refused,
    /// typed. Once the link moves again, every request that was taken is answered once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_link_holds_requests_back_and_refuses_them_typed() {
        const QUEUED: usize = 3;
        const LINK_PLACES: usize = 2;
        let mut f = joined(QUEUED, LINK_PLACES, 1024).await;
        until("Health(Ok)", || !f.notices.is_empty()).await;
        f.pause.send(true).unwrap();
        let mut accepted = Vec::new();
        let mut op = 0;
        // The link's task takes one message and waits; then its places fill.
        while f.link.capacity() > 0 {
            op += 1;
            f.client.submit(DirectoryOpId(op), lookup(op)).unwrap();
            accepted.push(op);
            until("the client task to take the request", || {
                f.client.commands.capacity() == QUEUED
            })
            .await;
            assert!(op <= 10, "the link never filled: is it bounded?");
        }
        // One more is taken and held; after it, requests wait in the queue.
        op += 1;
        f.client.submit(DirectoryOpId(op), lookup(op)).unwrap();
        accepted.push(op);
        until("the held request to be taken", || {
            f.client.commands.capacity() == QUEUED
        })
        .await;
        for _ in 0..QUEUED {
            op += 1;
            f.client.submit(DirectoryOpId(op), lookup(op)).unwrap();
            accepted.push(op);
        }
        let_others_run().await;
        assert_eq!(
            f.client.commands.capacity(),
            0,
            "the client task took requests while the link was full"
        );
        assert_eq!(
            f.client.submit(DirectoryOpId(op + 1), lookup(op + 1)),
            Err(SubmitRefused::Busy { queued: QUEUED })
        );
        f.pause.send(false).unwrap();
        expect_replies(&mut f.notices, &accepted).await;
    }

    /// A node that takes no notices fills their places; the client task waits for one, takes
    /// no more requests meanwhile (the next is refused, typed), and loses nothing: once the
    /// node takes its notices, every request that was taken is answered once.
    #[tokio::test(flavor = "current_thread")]
    async fn full_notices_hold_the_client_task_and_lose_nothing() {
        const QUEUED: usize = 3;
        const NOTICE_PLACES: usize = 2;
        let mut f = joined(QUEUED, LINK_OUTGOING_QUEUE, NOTICE_PLACES).await;
        // Health(Ok) (and the member list) come first; take them.
        until("Health(Ok)", || !f.notices.is_empty()).await;
        while f.notices.try_recv().is_ok() {}
        let mut accepted = Vec::new();
        let mut op = 0;
        // Each request is answered until the notices are full and one more reply waits.
        loop {
            op += 1;
            f.client.submit(DirectoryOpId(op), lookup(op)).unwrap();
            accepted.push(op);
            until("the client task to take the request", || {
                f.client.commands.capacity() == QUEUED
            })
            .await;
            let_others_run().await;
            if f.notices.len() == NOTICE_PLACES {
                break;
            }
            assert!(op <= 10, "the notices never filled: are they bounded?");
        }
        // The next reply finds no place: the client task waits, and requests queue up.
        op += 1;
        f.client.submit(DirectoryOpId(op), lookup(op)).unwrap();
        accepted.push(op);
        until("the client task to take the request", || {
            f.client.commands.capacity() == QUEUED
        })
        .await;
        let_others_run().await;
        for _ in 0..QUEUED {
            op += 1;
            f.client.submit(DirectoryOpId(op), lookup(op)).unwrap();
            accepted.push(op);
        }
        let_others_run().await;
        assert_eq!(f.notices.len(), NOTICE_PLACES);
        assert_eq!(
            f.client.commands.capacity(),
            0,
            "the client task took requests while the node took no notices"
        );
        assert_eq!(
            f.client.submit(DirectoryOpId(op + 1), lookup(op + 1)),
            Err(SubmitRefused::Busy { queued: QUEUED })
        );
        expect_replies(&mut f.notices, &accepted).await;
    }
}
