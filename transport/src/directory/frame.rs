//! Length-prefixed postcard frames over a byte stream: a little-endian `u32` length, then the
//! body. Used by the built-in directory between nodes and the head daemon.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt};

use postcard::ser_flavors::Flavor;

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
    let mut bytes = Vec::new();
    encode_into(message, &mut bytes);
    bytes
}

/// Encodes `message` as one frame (length prefix included) at the end of `bytes`.
pub fn encode_into<T: Serialize>(message: &T, bytes: &mut Vec<u8>) {
    let start = bytes.len();
    bytes.extend_from_slice(&[0; 4]);
    // Serialising our own message types into a Vec cannot fail: postcard supports every type
    // they contain.
    postcard::serialize_with_flavor(message, AppendTo(bytes))
        .expect("directory messages always serialise");
    let len = (bytes.len() - start - 4) as u32;
    debug_assert!(len as usize <= MAX_FRAME_BYTES, "frame above the limit");
    bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// A postcard output that appends to a borrowed `Vec` (whole slices at a time).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl Flavor for AppendTo<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// A connection's incoming bytes, split into frames: each [`fill`](Self::fill) takes whatever
/// has arrived, up to the buffer's room, in one read, and [`decode_next`](Self::decode_next)
/// decodes the complete frames it holds, in order; a partial frame waits for the next read. So
/// a burst of pipelined frames costs one read, not two or three per frame.
#[derive(Debug)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
    /// Where the first frame not yet decoded starts.
    start: usize,
    /// The room it keeps between frames (it grows for a larger frame, then shrinks back).
    room: usize,
}

impl FrameBuffer {
    /// A buffer that reads up to `room` bytes at once (more while a larger frame arrives).
    pub fn new(room: usize) -> Self {
        Self {
            bytes: Vec::new(),
            start: 0,
            room: room.max(64),
        }
    }

    /// Reads once, whatever has arrived. `Ok(false)` when the stream ended cleanly between
    /// frames; [`FrameError::Truncated`] when it ended inside one.
    pub async fn fill<R: AsyncRead + Unpin>(&mut self, reader: &mut R) -> Result<bool, FrameError> {
        self.bytes.drain(..self.start);
        self.start = 0;
        if self.bytes.is_empty() && self.bytes.capacity() > 4 * self.room {
            self.bytes = Vec::new();
        }
        // Room for the frame being received whole (a header above the limit was already
        // refused by `decode_next`), and for at least `room` more.
        let frame_bytes = match self.bytes.get(..4) {
            Some(header) => {
                let len = u32::from_le_bytes(header.try_into().expect("four bytes")) as usize;
                4 + len.min(MAX_FRAME_BYTES)
            }
            None => 0,
        };
        let wanted = frame_bytes.max(self.bytes.len() + self.room);
        self.bytes.reserve(wanted - self.bytes.len());
        let n = reader.read_buf(&mut self.bytes).await?;
        if n == 0 {
            return if self.bytes.is_empty() {
                Ok(false)
            } else {
                Err(FrameError::Truncated)
            };
        }
        Ok(true)
    }

    /// Decodes the next complete frame, if one is buffered.
    pub fn decode_next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        let rest = &self.bytes[self.start..];
        let Some(header) = rest.get(..4) else {
            return Ok(None);
        };
        let len_bytes = u32::from_le_bytes(header.try_into().expect("four bytes")) as usize;
        if len_bytes > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge { len_bytes });
        }
        let Some(body) = rest.get(4..4 + len_bytes) else {
            return Ok(None);
        };
        let message = postcard::from_bytes(body).map_err(FrameError::Malformed)?;
        self.start += 4 + len_bytes;
        Ok(Some(message))
    }
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::ReadBuf;

    use super::*;

    /// A stream that hands out `pieces` one read each, then ends.
    struct Pieces(VecDeque<Vec<u8>>);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut piece) = self.0.pop_front() {
                let n = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..n]);
                if n < piece.len() {
                    self.0.push_front(piece.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Everything `bytes`, cut into `pieces` of the given sizes in turn, decodes to.
    async fn decoded(
        bytes: &[u8],
        sizes: &[usize],
        room: usize,
    ) -> Result<Vec<String>, FrameError> {
        let mut pieces = VecDeque::new();
        let mut rest = bytes;
        for size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (piece, tail) = rest.split_at((*size).min(rest.len()));
            pieces.push_back(piece.to_vec());
            rest = tail;
        }
        let mut reader = Pieces(pieces);
        let mut frames = FrameBuffer::new(room);
        let mut out = Vec::new();
        while frames.fill(&mut reader).await? {
            while let Some(message) = frames.decode_next::<String>()? {
                out.push(message);
            }
        }
        Ok(out)
    }

    fn messages() -> Vec<String> {
        vec!["a".into(), String::new(), "x".repeat(300), "last".into()]
    }

    #[tokio::test]
    async fn frames_cut_anywhere_decode_complete_and_in_order() {
        let bytes: Vec<u8> = messages().iter().flat_map(encode).collect();
        for sizes in [&[1][..], &[2, 3], &[7], &[4], &[5, 1000], &[10_000]] {
            assert_eq!(
                decoded(&bytes, sizes, 64).await.unwrap(),
                messages(),
                "{sizes:?}"
            );
        }
        // A frame above the room still arrives (the buffer grows for it).
        assert_eq!(decoded(&bytes, &[10_000], 64).await.unwrap(), messages());
    }

    #[tokio::test]
    async fn an_oversized_frame_and_a_cut_stream_are_errors() {
        let mut bytes = encode(&"fine".to_string());
        bytes.extend_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes());
        assert!(matches!(
            decoded(&bytes, &[3], 64).await,
            Err(FrameError::TooLarge { len_bytes }) if len_bytes == MAX_FRAME_BYTES + 1
        ));
        let bytes = encode(&"cut short".to_string());
        assert!(matches!(
            decoded(&bytes[..bytes.len() - 1], &[2], 64).await,
            Err(FrameError::Truncated)
        ));
        assert!(matches!(
            decoded(&bytes[..2], &[1], 64).await,
            Err(FrameError::Truncated)
        ));
    }

    #[test]
    fn encode_into_appends_frames_back_to_back() {
        let mut bytes = vec![9];
        encode_into(&"one".to_string(), &mut bytes);
        encode_into(&7u64, &mut bytes);
        let mut expected = vec![9];
        expected.extend(encode(&"one".to_string()));
        expected.extend([1, 0, 0, 0, 7]);
        assert_eq!(bytes, expected);
    }
}
