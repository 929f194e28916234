//! While the daemon starts (creating a large arena takes seconds per GiB, joining a cluster
//! may take longer), its socket is already bound: every client that connects gets one reply,
//! `StoreError::Starting` with how far the start-up got, instead of "no daemon here".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use skyriver_core::client_protocol::{
    decode_frame_len, decode_request, encode_frame, Response, ServerFrame, FRAME_HEADER_BYTES,
    MAX_REQUEST_BYTES,
};
use skyriver_core::{RequestId, StoreError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long an early client may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the start-up is doing now, shared with the task that answers clients.
#[derive(Clone, Default)]
pub(super) struct StartStatus(Arc<Mutex<String>>);

impl StartStatus {
    pub(super) fn set(&self, status: impl Into<String>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = status.into();
    }

    fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Answers every connection with "starting" until stopped; gives the listener back.
pub(super) struct StartingResponder {
    stop: oneshot::Sender<()>,
    task: JoinHandle<UnixListener>,
}

impl StartingResponder {
    pub(super) fn spawn(listener: UnixListener, status: StartStatus) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return listener,
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            tokio::spawn(answer_starting(stream, status.get()));
                        }
                    }
                }
            }
        });
        Self { stop, task }
    }

    /// Stops answering; the listener then belongs to the event loop.
    pub(super) async fn stop(self) -> Option<UnixListener> {
        let _ = self.stop.send(());
        self.task.await.ok()
    }
}

/// Reads the client's first request and answers it with `Starting`.
async fn answer_starting(mut stream: UnixStream, status: String) {
    let request = tokio::time::timeout(HELLO_TIMEOUT, first_request_id(&mut stream))
        .await
        .ok()
        .flatten()
        .unwrap_or(RequestId(0));
    let mut frame = Vec::new();
    encode_frame(
        &ServerFrame::Reply {
            request,
            response: Response::Error(StoreError::Starting(status)),
        },
        &mut frame,
    );
    let _ = stream.write_all(&frame).await;
}

async fn first_request_id(stream: &mut UnixStream) -> Option<RequestId> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).await.ok()?;
    let len = decode_frame_len(header, MAX_REQUEST_BYTES).ok()?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await.ok()?;
    decode_request(&body).ok().map(|frame| frame.request)
}
