//! Reply routing of a client connection: the threads of one [`crate::Client`] share its
//! socket, and each waits for its own replies.
//!
//! The pairing itself (request ids, which reply answers whom, references of replies nobody
//! waits for, unanswered releases) is [`ClientSession`]'s, in the core. Here is what makes it
//! safe to share: the session behind a mutex, a condvar signalled whenever it changes, and the
//! rule that one waiting thread at a time reads the socket, without a lock, while the others
//! sleep on the condvar and the reader routes every reply it reads to its caller. The socket is
//! abstracted ([`FrameWrite`], [`FrameRead`]) so that the loom model at the end of this file
//! drives exactly this code against a model daemon, without a socket
//! (`RUSTFLAGS='--cfg skyriver_loom' cargo test -p skyriver --lib loom`).
//!
//! Lock order: the writer's lock, then the replies' lock; nothing blocks on the socket while
//! holding the replies' lock.

#[cfg(skyriver_loom)]
use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(skyriver_loom))]
use std::sync::{Condvar, Mutex, MutexGuard};

use skyriver_core::client_protocol::{Request, RequestFrame, Response, ServerFrame};
use skyriver_core::client_session::{ClientSession, ConnectionLost, SendRefused};
use skyriver_core::{ObjectId, RequestId};

use crate::client::{ClientError, WAIT_SLICE};

/// The write side of a connection.
pub(crate) trait FrameWrite {
    /// Encodes a request, refusing one over the daemon's limit without touching the
    /// connection.
    fn encode(&mut self, frame: &RequestFrame) -> Result<(), ClientError>;
    /// Writes the request encoded last.
    fn write(&mut self) -> std::io::Result<()>;
}

/// The read side of a connection.
pub(crate) trait FrameRead {
    /// The next frame if one starts within [`WAIT_SLICE`]; a frame once started is read to
    /// its end.
    fn next_frame_within_slice(&mut self) -> Result<Option<ServerFrame>, ConnectionLost>;
}

/// One connection shared by every thread of a client: writes under one lock, replies routed
/// by request id under another. No lock is held while a thread blocks on the socket.
pub(crate) struct ReplyRouter<W, R> {
    writer: Mutex<W>,
    replies: Mutex<Replies<R>>,
    /// Signalled whenever `replies` changes: a reply came in, the reader is free again, or the
    /// connection failed or was closed.
    replies_changed: Condvar,
    /// The loom model's planted race: signal before the change instead of after it.
    #[cfg(skyriver_loom)]
    notify_before_routing: bool,
}

/// What the threads of a client share about replies.
struct Replies<R> {
    /// The socket's read side, here when no thread is reading (taken by the one that reads).
    reader: Option<R>,
    /// Requests and replies of the connection.
    session: ClientSession<()>,
    /// Callers asleep on `replies_changed` (waking nobody is skipped: it costs a syscall).
    sleepers: usize,
}

impl From<ConnectionLost> for ClientError {
    fn from(lost: ConnectionLost) -> Self {
        match lost {
            ConnectionLost::Closed => ClientError::Closed,
            ConnectionLost::Io { kind, message } => {
                ClientError::Io(std::io::Error::new(kind, message))
            }
            ConnectionLost::Protocol(violation) => ClientError::Protocol(violation.to_string()),
        }
    }
}

impl From<SendRefused> for ClientError {
    fn from(refused: SendRefused) -> Self {
        match refused {
            SendRefused::Closed => ClientError::ClientClosed,
            SendRefused::Lost(lost) => lost.into(),
            SendRefused::Subscribed => ClientError::Protocol(refused.to_string()),
        }
    }
}

/// A failed read or write, kept to be reported to every caller.
pub(crate) fn io_lost(error: &std::io::Error) -> ConnectionLost {
    ConnectionLost::Io {
        kind: error.kind(),
        message: error.to_string(),
    }
}

/// When a waiting caller next asks its interrupt check. The loom model has no clock (its
/// schedules must replay exactly) and no interrupts: never.
struct InterruptCheck {
    #[cfg(not(skyriver_loom))]
    at: std::time::Instant,
}

impl InterruptCheck {
    fn after_a_slice() -> Self {
        Self {
            #[cfg(not(skyriver_loom))]
            at: std::time::Instant::now() + WAIT_SLICE,
        }
    }

    fn due(&self) -> bool {
        #[cfg(not(skyriver_loom))]
        return std::time::Instant::now() >= self.at;
        #[cfg(skyriver_loom)]
        return false;
    }
}

/// An interrupt check that never interrupts.
pub(crate) fn never() -> bool {
    false
}

impl<W: FrameWrite, R: FrameRead> ReplyRouter<W, R> {
    /// A router over a connection whose session said `Hello` already.
    pub(crate) fn new(writer: W, reader: R, session: ClientSession<()>) -> Self {
        Self {
            writer: Mutex::new(writer),
            replies: Mutex::new(Replies {
                reader: Some(reader),
                session,
                sleepers: 0,
            }),
            replies_changed: Condvar::new(),
            #[cfg(skyriver_loom)]
            notify_before_routing: false,
        }
    }

    fn replies(&self) -> MutexGuard<'_, Replies<R>> {
        // Every update of `Replies` is a single step that cannot panic halfway.
        self.replies
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends a request; its reply is awaited unless it is a `ReleaseUnanswered`.
    fn send(&self, body: Request) -> Result<RequestId, ClientError> {
        // A panic mid-write leaves the stream in an unknown state; the daemon then closes it
        // and the next call reports that.
        let mut writer = self
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Numbered and awaited before the write, so the reader knows the reply when it comes.
        let frame = self.replies().session.send(body, ())?;
        if let Err(error) = writer.encode(&frame) {
            self.replies().session.withdraw(frame.request);
            return Err(error);
        }
        if let Err(error) = writer.write() {
            self.fail(io_lost(&error));
            return Err(ClientError::Io(error));
        }
        Ok(frame.request)
    }

    /// Marks the connection failed and wakes every waiting caller to report it.
    fn fail(&self, lost: ConnectionLost) {
        self.replies().session.fail(lost);
        self.replies_changed.notify_all();
    }

    /// Marks the connection closed by its user and wakes every waiting caller to say so.
    pub(crate) fn close(&self) {
        self.replies().session.close();
        self.replies_changed.notify_all();
    }

    /// Waits until `done` holds, reading the socket while no other thread does. The reading
    /// thread polls the socket for a while before it blocks ([`skyriver_transport::poll`]): every caller,
    /// a fetch's too, since a small fetch is answered within the polling time, and a caller
    /// asleep on a CPU that a polling daemon keeps busy waits for it to yield (`bench fetch
    /// --cpus spread`: a 1 KiB fetch took twice as long when its client slept).
    ///
    /// Every [`WAIT_SLICE`] of waiting, `interrupted` is asked (without any lock held) whether
    /// to give up with [`ClientError::Interrupted`]; a [`ReplyRouter::close`] ends the wait
    /// with [`ClientError::ClientClosed`].
    fn wait_until<T>(
        &self,
        mut done: impl FnMut(&mut ClientSession<()>) -> Option<T>,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<T, ClientError> {
        let mut next_check = InterruptCheck::after_a_slice();
        let mut replies = self.replies();
        loop {
            if let Some(result) = done(&mut replies.session) {
                return Ok(result);
            }
            if let Some(lost) = replies.session.lost() {
                return Err(lost.clone().into());
            }
            if replies.session.is_closed() {
                return Err(ClientError::ClientClosed);
            }
            if let Some(mut reader) = replies.reader.take() {
                drop(replies);
                let frame = reader.next_frame_within_slice();
                #[cfg(skyriver_loom)]
                if self.notify_before_routing {
                    self.replies_changed.notify_all();
                }
                replies = self.replies();
                replies.reader = Some(reader);
                match frame {
                    // A violation loses the session, which every caller then reports.
                    Ok(Some(frame)) => {
                        let _ = replies.session.receive(frame);
                    }
                    Ok(None) => {}
                    Err(lost) => replies.session.fail(lost),
                }
                // Someone else may wait for this frame, or for the reader this thread gives
                // back.
                #[cfg(skyriver_loom)]
                let notify = replies.sleepers > 0 && !self.notify_before_routing;
                #[cfg(not(skyriver_loom))]
                let notify = replies.sleepers > 0;
                if notify {
                    self.replies_changed.notify_all();
                }
            } else {
                replies.sleepers += 1;
                replies = self
                    .replies_changed
                    .wait_timeout(replies, WAIT_SLICE)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
                replies.sleepers -= 1;
            }
            let check = next_check.due();
            if !replies.session.has_orphaned() && !check {
                continue;
            }
            let orphaned = replies.session.take_orphaned();
            drop(replies);
            self.release_all(orphaned);
            if check {
                if interrupted() {
                    return Err(ClientError::Interrupted);
                }
                next_check = InterruptCheck::after_a_slice();
            }
            replies = self.replies();
        }
    }

    /// Releases references nobody holds any more; failures are reported by the next flush.
    fn release_all(&self, ids: Vec<ObjectId>) {
        for id in ids {
            if self.release_without_waiting(id).is_err() {
                // The connection failed: the daemon drops every reference of it anyway.
                break;
            }
        }
    }

    fn wait_reply(
        &self,
        request: RequestId,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Response, ClientError> {
        let result = self.wait_until(
            |session| session.take_reply(request).map(|((), response)| response),
            interrupted,
        );
        if result.is_err() {
            self.abandon(request);
        }
        result
    }

    /// Stops waiting for a request's reply: it is dropped when it comes (or now, if it came in
    /// the meantime), and the references it holds released.
    fn abandon(&self, request: RequestId) {
        let orphaned = self.replies().session.abandon(request);
        self.release_all(orphaned);
    }

    /// Sends a request and waits for its reply.
    pub(crate) fn call(&self, body: Request) -> Result<Response, ClientError> {
        let request = self.send(body)?;
        self.wait_reply(request, &mut never)
    }

    /// Sends every request at once, then waits for their replies, in order. Stops at the first
    /// failure: returns the replies before it and the failure (the requests after it are
    /// abandoned, their references released).
    pub(crate) fn call_all(
        &self,
        bodies: impl IntoIterator<Item = Request>,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> (Vec<Response>, Option<ClientError>) {
        let mut failure = None;
        let mut requests = Vec::new();
        for body in bodies {
            match self.send(body) {
                Ok(request) => requests.push(request),
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        let mut responses = Vec::with_capacity(requests.len());
        for request in requests {
            if failure.is_some() {
                self.abandon(request);
                continue;
            }
            match self.wait_reply(request, interrupted) {
                Ok(response) => responses.push(response),
                Err(error) => failure = Some(error),
            }
        }
        (responses, failure)
    }

    /// Sends a release the daemon does not answer: a dropped buffer costs one write and no
    /// reply to read. A failure is reported by the next `Flush`.
    pub(crate) fn release_without_waiting(&self, id: ObjectId) -> Result<(), ClientError> {
        self.send(Request::ReleaseUnanswered { id }).map(|_| ())
    }
}

#[cfg(all(test, skyriver_loom))]
mod loom_model;
