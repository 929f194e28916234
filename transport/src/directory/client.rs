//! The one reconnecting directory client, shared by both backends: a tokio driver of the core's
//! sans-IO [`DirectorySession`] (hello, heartbeats, backoff, replay of publications and
//! subscriptions, `Unavailable` for whatever cannot be served, health notices).
//!
//! A backend only opens [`Link`]s: a pair of channels carrying [`ToRegistry`] out and
//! [`FromRegistry`] in. The built-in backend's link is a TCP connection to the head, framed;
//! the Redis backend's link is an adapter task that answers the same messages from Redis.

use std::future::Future;
use std::time::Duration;

use skyriver_core::directory::{DirectoryNotice, DirectoryOpId, DirectoryReply, DirectoryRequest};
use skyriver_core::registry::session::{DirectorySession, SessionError, SessionOutput};
use skyriver_core::registry::{FromRegistry, ToRegistry};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant as TokioInstant};

use super::{Directory, DirectoryError, LeaveFuture};

/// Bound on a clean leave (the goodbye reaching the service).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Messages from the registry waiting for the client task, at most, per link.
pub(crate) const LINK_INCOMING_QUEUE: usize = 256;

/// One open connection to a registry (or to something that answers like one).
///
/// What comes in is bounded ([`LINK_INCOMING_QUEUE`]): the link's task waits for a place, and
/// meanwhile reads nothing more from the registry (TCP back-pressure to the head; Redis
/// answers wait). What goes out is unbounded in type and bounded by the session (requests in
/// flight are capped; a replay is at most the node's publications and subscriptions, both
/// capped): the client task must not wait for the link, whose task may itself be waiting for
/// the client task to take what came in.
pub(crate) struct Link {
    /// Messages for the registry; dropping it asks the link to close cleanly.
    pub(crate) outgoing: Option<mpsc::UnboundedSender<ToRegistry>>,
    /// Messages from the registry; `Err` (or the end) means the link is lost, with why.
    pub(crate) incoming: mpsc::Receiver<Result<FromRegistry, String>>,
    /// The task that carries `outgoing` (and, for an adapter, everything else).
    pub(crate) task: Option<JoinHandle<()>>,
    /// A helper task (the TCP reader), aborted with the link.
    pub(crate) helper: Option<JoinHandle<()>>,
}

impl Link {
    fn send(&self, message: ToRegistry) -> Result<(), ()> {
        match &self.outgoing {
            Some(outgoing) => outgoing.send(message).map_err(|_| ()),
            None => Err(()),
        }
    }

    /// Closes the link after what was sent reached the other side, bounded by `limit`.
    async fn close_gracefully(mut self, limit: Duration) {
        self.outgoing = None;
        if let Some(task) = self.task.take() {
            let _ = timeout(limit, task).await;
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
    fn connect(&mut self) -> impl Future<Output = Result<Link, String>> + Send;
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
    notices: mpsc::UnboundedSender<DirectoryNotice>,
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
    fn submit(&self, op: DirectoryOpId, request: DirectoryRequest) {
        let expects_reply = !matches!(request, DirectoryRequest::Unsubscribe { .. });
        if let Err(error) = self.commands.try_send(Command::Submit(op, request)) {
            let reason = match error {
                mpsc::error::TrySendError::Full(_) => "too many directory requests queued",
                mpsc::error::TrySendError::Closed(_) => "the directory client stopped",
            };
            if expects_reply {
                let _ = self.notices.send(DirectoryNotice::Reply {
                    op,
                    reply: DirectoryReply::Unavailable {
                        reason: reason.into(),
                    },
                });
            }
        }
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
    /// How long the first connection keeps retrying a retryable refusal.
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

/// Registers the node (retrying a retryable refusal until `join_timeout`), then keeps the
/// session up in a background task. Fails if the service cannot be reached or refuses.
pub(crate) async fn start<C: Connector>(
    mut session: DirectorySession,
    mut connector: C,
    timing: ClientTiming,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
    addr: String,
    description: String,
) -> Result<DirectoryClient, DirectoryError> {
    let clock = Clock(TokioInstant::now());
    let deadline = TokioInstant::now() + timing.join_timeout;
    let mut waiting_logged = false;
    let link = loop {
        match first_connection(&mut session, &mut connector, &clock, &timing, &notices).await {
            Ok(link) => break link,
            Err(FirstConnection::Unreachable(reason)) => {
                return Err(DirectoryError::Unreachable { addr, reason })
            }
            Err(FirstConnection::Refused { reason, retryable }) => {
                if !retryable || TokioInstant::now() >= deadline {
                    return Err(DirectoryError::Refused(reason));
                }
                // Once, not at every retry: the outcome comes when the wait ends.
                if !waiting_logged {
                    waiting_logged = true;
                    tracing::info!(
                        %reason,
                        "the directory refused this node for now; retrying for up to {} ms",
                        timing.join_timeout.as_millis()
                    );
                }
                let retry_at = session
                    .poll_timeout()
                    .map(|at| clock.at(at))
                    .unwrap_or(deadline);
                if retry_at > deadline {
                    tokio::time::sleep_until(deadline).await;
                    return Err(DirectoryError::Refused(reason));
                }
                tokio::time::sleep_until(retry_at).await;
            }
        }
    };
    let (commands, command_rx) = mpsc::channel(timing.max_queued_requests);
    let driver = Driver {
        session,
        connector,
        clock,
        connect_timeout: timing.connect_timeout,
        notices: notices.clone(),
        link: Some(link),
        connecting: None,
    };
    tokio::spawn(driver.run(command_rx));
    Ok(DirectoryClient {
        commands,
        notices,
        description,
    })
}

enum FirstConnection {
    Unreachable(String),
    Refused { reason: String, retryable: bool },
}

/// One attempt at the first connection: open, hello, challenge, proof, welcome.
async fn first_connection<C: Connector>(
    session: &mut DirectorySession,
    connector: &mut C,
    clock: &Clock,
    timing: &ClientTiming,
    notices: &mpsc::UnboundedSender<DirectoryNotice>,
) -> Result<Link, FirstConnection> {
    session.handle_timeout(clock.now());
    let mut outputs = Vec::new();
    while let Some(output) = session.poll_output() {
        outputs.push(output);
    }
    if !outputs.contains(&SessionOutput::Connect) {
        // Not due yet (a retry after a refusal): the caller slept until the session's timer.
        return Err(FirstConnection::Unreachable(
            "no connection attempt was due".into(),
        ));
    }
    // Open, then carry the handshake (hello, challenge, proof, welcome) until the session is
    // registered or turned away, all under the connect timeout.
    let attempt = async {
        let mut link = connector.connect().await?;
        session.handle_connected(clock.now());
        loop {
            while let Some(output) = session.poll_output() {
                if let SessionOutput::Send(message) = output {
                    link.send(message)
                        .map_err(|()| "the connection closed during the hello".to_string())?;
                }
            }
            let message = match link.incoming.recv().await {
                Some(Ok(message)) => message,
                Some(Err(reason)) => return Err(reason),
                None => return Err("the connection closed during the hello".into()),
            };
            let result = session.handle_message(clock.now(), message);
            if result.is_err() || session.is_up() {
                return Ok((link, result));
            }
        }
    };
    let (link, result) = match timeout(timing.connect_timeout, attempt).await {
        Ok(Ok(got)) => got,
        Ok(Err(reason)) => {
            session.handle_connect_failed(clock.now(), &reason);
            return Err(FirstConnection::Unreachable(reason));
        }
        Err(_) => {
            let reason = format!("no answer within {} ms", timing.connect_timeout.as_millis());
            session.handle_connect_failed(clock.now(), &reason);
            return Err(FirstConnection::Unreachable(reason));
        }
    };
    // Health(Ok) and the replay (nothing yet on a first connection) go out now.
    while let Some(output) = session.poll_output() {
        match output {
            SessionOutput::Send(message) => {
                let _ = link.send(message);
            }
            SessionOutput::Notice(notice) => {
                let _ = notices.send(notice);
            }
            SessionOutput::Connect | SessionOutput::Disconnect { .. } => {}
        }
    }
    match result {
        Ok(()) => Ok(link),
        Err(SessionError::Refused { reason, retryable }) => {
            Err(FirstConnection::Refused { reason, retryable })
        }
        Err(other) => Err(FirstConnection::Unreachable(other.to_string())),
    }
}

/// The background task: one owner of the session, its link and its timers.
struct Driver<C> {
    session: DirectorySession,
    connector: C,
    clock: Clock,
    connect_timeout: Duration,
    notices: mpsc::UnboundedSender<DirectoryNotice>,
    link: Option<Link>,
    /// A connection attempt under way, so requests are answered while it runs.
    connecting: Option<JoinHandle<Result<Link, String>>>,
}

impl<C: Connector> Driver<C> {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        loop {
            self.carry_out();
            let wake = self
                .session
                .poll_timeout()
                .map(|at| self.clock.at(at))
                .unwrap_or_else(|| TokioInstant::now() + Duration::from_secs(3600));
            tokio::select! {
                command = commands.recv() => match command {
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
                message = next_message(&mut self.link) => {
                    let now = self.clock.now();
                    match message {
                        Ok(message) => {
                            if let Err(error) = self.session.handle_message(now, message) {
                                tracing::warn!(%error, "dropping the directory connection");
                                self.link = None;
                            }
                        }
                        Err(reason) => {
                            tracing::warn!(%reason, "lost the directory");
                            self.session.handle_disconnected(now, &reason);
                            self.link = None;
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
                        Err(reason) => {
                            tracing::debug!(%reason, "directory reconnection failed");
                            self.session.handle_connect_failed(now, &reason);
                        }
                    }
                },
                _ = tokio::time::sleep_until(wake) => {
                    self.session.handle_timeout(self.clock.now());
                }
            }
        }
    }

    /// Carries out everything the session asked for.
    fn carry_out(&mut self) {
        while let Some(output) = self.session.poll_output() {
            match output {
                SessionOutput::Send(message) => {
                    let sent = self.link.as_ref().is_some_and(|l| l.send(message).is_ok());
                    if !sent {
                        self.link = None;
                        self.session
                            .handle_disconnected(self.clock.now(), "the connection closed");
                    }
                }
                SessionOutput::Notice(notice) => {
                    // The driver stopped listening: the task ends with its commands.
                    let _ = self.notices.send(notice);
                }
                SessionOutput::Disconnect { reason } => {
                    tracing::warn!(%reason, "dropping the directory connection");
                    self.link = None;
                }
                SessionOutput::Connect => {
                    self.link = None;
                    let mut connector = self.connector.clone();
                    let limit = self.connect_timeout;
                    self.connecting = Some(tokio::spawn(async move {
                        match timeout(limit, connector.connect()).await {
                            Ok(result) => result,
                            Err(_) => Err(format!("no connection within {} ms", limit.as_millis())),
                        }
                    }));
                }
            }
        }
    }

    /// Says goodbye (if registered) and closes the link once it went out.
    async fn leave(&mut self) {
        if let Some(attempt) = self.connecting.take() {
            attempt.abort();
        }
        self.session.handle_leave(self.clock.now());
        while let Some(output) = self.session.poll_output() {
            if let (SessionOutput::Send(message), Some(link)) = (output, &self.link) {
                let _ = link.send(message);
            }
        }
        if let Some(link) = self.link.take() {
            link.close_gracefully(LEAVE_TIMEOUT).await;
        }
    }
}

/// The outcome of the connection attempt under way; pending forever without one.
async fn attempt_done(
    connecting: &mut Option<JoinHandle<Result<Link, String>>>,
) -> Result<Link, String> {
    match connecting {
        Some(attempt) => match attempt.await {
            Ok(result) => result,
            Err(error) => Err(format!("the connection attempt failed: {error}")),
        },
        None => std::future::pending().await,
    }
}

/// The next message on the link; pending forever without one.
async fn next_message(link: &mut Option<Link>) -> Result<FromRegistry, String> {
    match link {
        Some(link) => match link.incoming.recv().await {
            Some(result) => result,
            None => Err("the connection closed".into()),
        },
        None => std::future::pending().await,
    }
}
