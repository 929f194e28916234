//! Length-prefixed postcard frames over a byte stream: a little-endian `u32` length, then the
//! body. Used by the built-in directory between nodes and the head daemon.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest frame body either side accepts.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer announced a frame above [`MAX_FRAME_BYTES`].
    #[error("frame of {len_bytes} bytes is above the limit of {MAX_FRAME_BYTES}")]
    TooLarge {
        /// The announced length.
        len_bytes: usize,
    },
    /// The body is not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(#[source] postcard::Error),
    /// The stream ended inside a frame.
    #[error("connection closed inside a frame")]
    Truncated,
}

/// Encodes `message` as one frame (length prefix included).
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Serialising our own message types into a Vec cannot fail: postcard supports every type
    // they contain.
    let mut bytes =
        postcard::to_extend(message, vec![0u8; 4]).expect("directory messages always serialise");
    let len = (bytes.len() - 4) as u32;
    debug_assert!(len as usize <= MAX_FRAME_BYTES, "frame above the limit");
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    bytes
}

/// Reads one frame into `buf` and decodes it. `Ok(None)` when the stream ends cleanly between
/// frames.
pub async fn read<T, R>(reader: &mut R, buf: &mut Vec<u8>) -> Result<Option<T>, FrameError>
where
    T: DeserializeOwned,
    R: AsyncRead + Unpin,
{
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = reader.read(&mut len[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(FrameError::Truncated)
            };
        }
        got += n;
    }
    let len_bytes = u32::from_le_bytes(len) as usize;
    if len_bytes > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len_bytes });
    }
    buf.clear();
    buf.resize(len_bytes, 0);
    reader.read_exact(buf).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        }
    })?;
    postcard::from_bytes(buf)
        .map(Some)
        .map_err(FrameError::Malformed)
}
