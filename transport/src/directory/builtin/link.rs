//! A node's TCP link to the head: a writer task that frames [`ToRegistry`] messages and a reader
//! task that decodes [`FromRegistry`] frames.

use skyriver_core::registry::{FromRegistry, ToRegistry};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use std::sync::Arc;

use super::super::client::{Connector, Link, LINK_INCOMING_QUEUE, LINK_OUTGOING_QUEUE};
use super::super::frame;
use super::super::LinkError;

/// Opens TCP links to the head at `addr`.
#[derive(Debug, Clone)]
pub(crate) struct TcpConnector {
    pub(crate) addr: String,
}

impl Connector for TcpConnector {
    async fn connect(&mut self) -> Result<Link, LinkError> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| LinkError::Connect(Arc::new(e)))?;
        let _ = stream.set_nodelay(true);
        Ok(open_link(stream, LINK_INCOMING_QUEUE, LINK_OUTGOING_QUEUE))
    }
}

/// A link over `stream` whose incoming side holds `incoming_places` messages at most, and its
/// outgoing side `outgoing_places`.
fn open_link(stream: TcpStream, incoming_places: usize, outgoing_places: usize) -> Link {
    let (reader, writer) = stream.into_split();
    // Bounded: the writer takes them as fast as the head reads (see `Link`).
    let (outgoing, to_write) = mpsc::channel(outgoing_places.max(1));
    // Bounded: the reader waits for the client task (see `Link`).
    let (read_tx, incoming) = mpsc::channel(incoming_places.max(1));
    Link {
        outgoing: Some(outgoing),
        incoming,
        task: Some(tokio::spawn(write_to_head(writer, to_write))),
        helper: Some(tokio::spawn(read_from_head(reader, read_tx))),
    }
}

/// Writes frames until the link is dropped, then flushes and closes the stream, so the head
/// sees a clean close (after any goodbye).
async fn write_to_head(writer: OwnedWriteHalf, mut messages: mpsc::Receiver<ToRegistry>) {
    let mut writer = BufWriter::new(writer);
    while let Some(message) = messages.recv().await {
        if writer.write_all(&frame::encode(&message)).await.is_err() {
            return;
        }
        if messages.is_empty() {
            if writer.flush().await.is_err() {
                return;
            }
            crate::trace::stamp("head_link_written");
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_from_head(
    mut reader: OwnedReadHalf,
    incoming: mpsc::Sender<Result<FromRegistry, LinkError>>,
) {
    let mut buf = Vec::new();
    loop {
        let result = match frame::read::<FromRegistry, _>(&mut reader, &mut buf).await {
            Ok(Some(message)) => {
                crate::trace::stamp("head_link_read");
                Ok(message)
            }
            Ok(None) => Err(LinkError::ClosedByHead),
            Err(error) => Err(LinkError::Read(Arc::new(error))),
        };
        let last = result.is_err();
        // While this waits for a place, nothing more is read: the head's writes to this node
        // wait in TCP.
        if incoming.send(result).await.is_err() || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A client task that does not take what the head sends holds the link's reader back: no
    /// more than the places wait, and every message arrives, in order, once taken.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_incoming_queue_holds_the_reader_back_and_loses_nothing() {
        const PLACES: usize = 2;
        const MESSAGES: u64 = 100;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let head = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            for seq in 0..MESSAGES {
                let frame = frame::encode(&FromRegistry::Pong { seq });
                stream.write_all(&frame).await.unwrap();
            }
            // Kept open until the test ends: a close would be one more message.
            stream
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut link = open_link(stream, PLACES, PLACES);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while link.incoming.len() < PLACES {
            assert!(tokio::time::Instant::now() < deadline, "never filled");
            tokio::task::yield_now().await;
        }
        let _head = head.await.unwrap();
        for seq in 0..MESSAGES {
            assert!(link.incoming.len() <= PLACES, "over the places");
            let message = tokio::time::timeout(Duration::from_secs(10), link.incoming.recv())
                .await
                .expect("the reader resumes when there is room");
            match message {
                Some(Ok(FromRegistry::Pong { seq: got })) => assert_eq!(got, seq),
                other => panic!("{other:?}"),
            }
        }
    }
}
