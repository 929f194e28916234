//! A node's TCP link to the head: a writer task that frames [`ToRegistry`] messages and a reader
//! task that decodes [`FromRegistry`] frames.

use skyriver_core::registry::{FromRegistry, ToRegistry};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::super::client::{Connector, Link};
use super::super::frame;

/// Opens TCP links to the head at `addr`.
#[derive(Debug, Clone)]
pub(crate) struct TcpConnector {
    pub(crate) addr: String,
}

impl Connector for TcpConnector {
    async fn connect(&mut self) -> Result<Link, String> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.into_split();
        let (outgoing, to_write) = mpsc::unbounded_channel();
        let (read_tx, incoming) = mpsc::unbounded_channel();
        Ok(Link {
            outgoing: Some(outgoing),
            incoming,
            task: Some(tokio::spawn(write_to_head(writer, to_write))),
            helper: Some(tokio::spawn(read_from_head(reader, read_tx))),
        })
    }
}

/// Writes frames until the link is dropped, then flushes and closes the stream, so the head
/// sees a clean close (after any goodbye).
async fn write_to_head(writer: OwnedWriteHalf, mut messages: mpsc::UnboundedReceiver<ToRegistry>) {
    let mut writer = BufWriter::new(writer);
    while let Some(message) = messages.recv().await {
        if writer.write_all(&frame::encode(&message)).await.is_err() {
            return;
        }
        if messages.is_empty() && writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_from_head(
    mut reader: OwnedReadHalf,
    incoming: mpsc::UnboundedSender<Result<FromRegistry, String>>,
) {
    let mut buf = Vec::new();
    loop {
        let result = match frame::read::<FromRegistry, _>(&mut reader, &mut buf).await {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err("the head closed the connection".to_string()),
            Err(error) => Err(error.to_string()),
        };
        let last = result.is_err();
        if incoming.send(result).is_err() || last {
            return;
        }
    }
}
