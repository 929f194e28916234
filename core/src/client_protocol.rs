//! The protocol between a node's daemon and its local clients, over a Unix socket.
//!
//! Framing: every frame is a 4-byte little-endian body length, then the body, a postcard
//! encoding of [`RequestFrame`] (client → daemon) or [`ServerFrame`] (daemon → client). The
//! first request on a connection is [`Request::Hello`] with the protocol version; the daemon
//! answers [`Response::Welcome`] and passes the arenas' memory fds alongside that one frame
//! (SCM_RIGHTS), once per connection. Limits are explicit: a request body over
//! [`MAX_REQUEST_BYTES`] closes the connection, since the stream cannot be trusted after it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::digest::ContentDigest;
use crate::error::StoreError;
use crate::ids::{ArenaId, NodeId, ObjectId, RequestId};
use crate::node::{FetchError, NodeMetrics, TransferMode};
use crate::store::{EvictOutcome, ObjectEvent, ObjectInfo, ObjectSummary, StoreStats};

/// Version of this protocol; a client of another version is refused at `Hello`. Version 13:
/// `LocateCopies` tells copies of record from cache copies ([`CopyView::of_record`],
/// `Response::Copies::records_known`). Version 15: the node's counters say how many locations
/// the directory pushed to it (`locations_learned`). Version 16: they say how relays paced
/// their readers and what they refused (`relay_pace`, `refused_requests`).
pub const PROTOCOL_VERSION: u32 = 16;
/// Bytes of the length prefix of every frame.
pub const FRAME_HEADER_BYTES: usize = 4;
/// Largest request body the daemon accepts.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Largest response body a client accepts (a `list` of a million objects fits).
pub const MAX_RESPONSE_BYTES: usize = 1 << 30;
/// Most ids in one request.
pub const MAX_IDS_PER_REQUEST: usize = 65_536;
/// Largest object (data + metadata) a [`Request::Put`] carries inline: above it a put is
/// `Create`, a write into shared memory and `Seal`, whose copy costs less than the socket's.
pub const MAX_INLINE_PUT_BYTES: usize = 64 * 1024;

/// A request with the id its reply will carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFrame {
    /// Chosen by the client, echoed in the reply.
    pub request: RequestId,
    /// What is asked.
    pub body: Request,
}

/// What a client can ask of its node's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First request of every connection.
    Hello {
        /// Must equal [`PROTOCOL_VERSION`].
        protocol_version: u32,
        /// Free text for the daemon's logs (program name, pid).
        client_name: String,
    },
    /// Create an unsealed object; the reply names the region to write.
    Create {
        /// The new object's id.
        id: ObjectId,
        /// Data bytes.
        data_size: u64,
        /// Metadata bytes (stored after the data).
        metadata_size: u64,
    },
    /// Create an object with these bytes and seal it, in one round trip (a small put). The
    /// reply is `Done`; the client holds no reference afterwards. At most
    /// [`MAX_INLINE_PUT_BYTES`] of data and metadata together.
    Put {
        /// The new object's id.
        id: ObjectId,
        /// Its data.
        #[serde(with = "byte_vec")]
        data: Vec<u8>,
        /// Its metadata (stored after the data).
        #[serde(with = "byte_vec")]
        metadata: Vec<u8>,
    },
    /// Seal an object this client created; with `release`, drop its reference too. On a
    /// node of a cluster the reply waits for the directory to accept the object's publication:
    /// an id that live nodes hold with another content is refused (`ObjectExists`) and the
    /// object aborted.
    Seal {
        /// The object.
        id: ObjectId,
        /// Drop the creator's reference in the same step.
        release: bool,
        /// The digest of the bytes the client wrote (data, then metadata).
        digest: ContentDigest,
    },
    /// Drop an unsealed object this client created.
    Abort {
        /// The object.
        id: ObjectId,
    },
    /// Get sealed objects, waiting up to `timeout_ms` (0 = poll, `None` = for ever).
    Get {
        /// The objects.
        ids: Vec<ObjectId>,
        /// Milliseconds to wait for unsealed or missing objects.
        timeout_ms: Option<u64>,
    },
    /// Drop a reference taken by `Get` (or `Create` without release on seal).
    Release {
        /// The object.
        id: ObjectId,
    },
    /// Whether a sealed object is present.
    Contains {
        /// The object.
        id: ObjectId,
    },
    /// Delete objects (deferred while in use).
    Delete {
        /// The objects.
        ids: Vec<ObjectId>,
    },
    /// All objects of the store.
    List,
    /// Evict at least this many bytes of unused objects.
    Evict {
        /// Bytes wanted.
        bytes: u64,
    },
    /// Turn this connection into a stream of [`ServerFrame::Event`]s.
    Subscribe,
    /// Store counters.
    Stats,
    /// Every counter and gauge of the node (store, fetches, transfers, peers): what
    /// `skyriver top` shows and the daemon's `/metrics` exports.
    Metrics,
    /// Get objects from anywhere in the cluster: fetched from other nodes unless already here.
    /// Waits up to `timeout_ms` (`None`: for ever); the reply holds a reference to each.
    Fetch {
        /// The objects.
        ids: Vec<ObjectId>,
        /// Milliseconds to wait.
        timeout_ms: Option<u64>,
        /// How the bytes move; `Auto` unless the client forces a path (to compare them).
        mode: TransferMode,
        /// Wait (up to the timeout) for a node to publish an object nobody holds yet, instead of
        /// failing at once with `NotFound`.
        wait_for_publication: bool,
    },
    /// The cluster's nodes as this daemon sees them.
    Nodes,
    /// Which nodes hold a sealed copy of an object, according to the directory.
    Locate {
        /// The object.
        id: ObjectId,
    },
    /// Timestamps the daemon took on the path of requests and peer messages since the last
    /// `Trace` (for `skyriver bench breakdown`); `record` turns taking them on or off from now.
    Trace {
        /// Take timestamps from now on.
        record: bool,
    },
    /// `Release` without a reply (what a client sends when a buffer is dropped): a failure is
    /// kept for the connection's next `Flush`.
    ReleaseUnanswered {
        /// The object.
        id: ObjectId,
    },
    /// Answered once every earlier request of this connection was handled: `Done(Err)` with
    /// the first failure of a `ReleaseUnanswered` since the last `Flush`, else `Done(Ok)`.
    Flush,
    /// `Put` with copies on other nodes (see [`ReplicaPolicy`]).
    PutReplicated {
        /// The new object's id.
        id: ObjectId,
        /// Its data.
        #[serde(with = "byte_vec")]
        data: Vec<u8>,
        /// Its metadata (stored after the data).
        #[serde(with = "byte_vec")]
        metadata: Vec<u8>,
        /// How many copies, and whether the reply waits for them.
        replicas: ReplicaPolicy,
    },
    /// `Seal` with copies on other nodes (see [`ReplicaPolicy`]).
    SealReplicated {
        /// The object.
        id: ObjectId,
        /// Drop the creator's reference in the same step.
        release: bool,
        /// The digest of the bytes the client wrote (data, then metadata).
        digest: ContentDigest,
        /// How many copies, and whether the reply waits for them.
        replicas: ReplicaPolicy,
    },
    /// Every live copy of an object with the failure domain of its node, and the copies of
    /// record it wants.
    LocateCopies {
        /// The object.
        id: ObjectId,
    },
    /// `Fetch` with a location hint: an object not here is asked of `hint` first, without a
    /// directory lookup; if `hint` does not have it, the fetch goes on through the directory
    /// (a wrong hint costs one round trip).
    FetchFrom {
        /// The objects.
        ids: Vec<ObjectId>,
        /// Milliseconds to wait.
        timeout_ms: Option<u64>,
        /// How the bytes move.
        mode: TransferMode,
        /// Wait (up to the timeout) for a node to publish an object nobody holds yet.
        wait_for_publication: bool,
        /// The node believed to hold the objects (their producer).
        hint: NodeId,
    },
}

/// How many copies of an object a put asks for, and when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReplicaPolicy {
    /// Copies wanted, this node's included, on distinct failure domains where there are
    /// enough; 0 takes the daemon's default (`--replicas`), 1 is a plain put.
    pub copies: u8,
    /// `None`: the reply comes at the local seal and the copies are made in the background.
    /// `Some(ms)`: the reply waits until every copy is sealed, at most `ms` milliseconds, then
    /// fails with [`StoreError::TooFewReplicas`] naming how many exist.
    pub wait_ms: Option<u64>,
}

impl ReplicaPolicy {
    /// Refuses a count above [`MAX_REPLICAS`](crate::registry::MAX_REPLICAS), naming it (a
    /// count is never clamped silently).
    pub fn validate(&self) -> Result<(), StoreError> {
        let most = crate::registry::MAX_REPLICAS;
        if self.copies > most {
            return Err(StoreError::BadRequest(format!(
                "a put asks for {} copies; the most is {most}",
                self.copies
            )));
        }
        Ok(())
    }
}

/// One copy of an object, for `LocateCopies`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyView {
    /// The node holding it.
    pub node: NodeId,
    /// The node's failure domain (empty: none given).
    pub failure_domain: String,
    /// A copy of record (the registry counts it toward the copies the object wants; never
    /// evicted), not a cache copy (evictable). Always false when the directory keeps no
    /// records.
    pub of_record: bool,
}

impl Request {
    /// Checks limits that postcard cannot: batch lengths.
    pub fn validate(&self) -> Result<(), StoreError> {
        let ids = match self {
            Request::Get { ids, .. }
            | Request::Delete { ids }
            | Request::Fetch { ids, .. }
            | Request::FetchFrom { ids, .. } => ids.len(),
            _ => 0,
        };
        if ids > MAX_IDS_PER_REQUEST {
            return Err(StoreError::BadRequest(format!(
                "{ids} ids in one request; the limit is {MAX_IDS_PER_REQUEST}"
            )));
        }
        if let Request::PutReplicated { replicas, .. } | Request::SealReplicated { replicas, .. } =
            self
        {
            replicas.validate()?;
        }
        if let Request::Put { data, metadata, .. } | Request::PutReplicated { data, metadata, .. } =
            self
        {
            let bytes = data.len() + metadata.len();
            if bytes > MAX_INLINE_PUT_BYTES {
                return Err(StoreError::BadRequest(format!(
                    "a put of {bytes} bytes inline; the limit is {MAX_INLINE_PUT_BYTES} \
                     (create, write and seal larger objects)"
                )));
            }
        }
        Ok(())
    }

    /// The wait of a `Get`, as a duration.
    pub fn timeout(timeout_ms: Option<u64>) -> Option<Duration> {
        timeout_ms.map(Duration::from_millis)
    }
}

/// One arena a client maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaInfo {
    /// The arena's id, as regions name it.
    pub id: ArenaId,
    /// Its size in bytes (the fd's size).
    pub size_bytes: u64,
}

/// The daemon's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to `Hello`; the arenas' fds come with this frame, in this order.
    Welcome {
        /// The daemon's protocol version.
        protocol_version: u32,
        /// The node this daemon is.
        node: NodeId,
        /// Arenas to map.
        arenas: Vec<ArenaInfo>,
    },
    /// Answer to `Create`.
    Created(Result<ObjectInfo, StoreError>),
    /// Answer to `Put`, `Seal`, `Abort`, `Release` and `Subscribe`.
    Done(Result<(), StoreError>),
    /// Answer to `Get`: one result per id, in order; each `Ok` holds a reference.
    Got(Vec<Result<ObjectInfo, StoreError>>),
    /// Answer to `Contains`.
    Contains(bool),
    /// Answer to `Delete`: one result per id.
    Deleted(Vec<Result<(), StoreError>>),
    /// Answer to `List`.
    Listed(Vec<ObjectSummary>),
    /// Answer to `Evict`.
    Evicted(EvictOutcome),
    /// Answer to `Stats`.
    Stats(StoreStats),
    /// Answer to `Metrics`.
    Metrics(Box<NodeMetrics>),
    /// Answer to `Fetch`: one result per id, in order; each `Ok` holds a reference.
    Fetched(Vec<Result<ObjectInfo, FetchError>>),
    /// Answer to `Nodes`.
    Nodes(ClusterView),
    /// Answer to `Locate`.
    Located {
        /// Live nodes holding a sealed copy.
        holders: Vec<NodeId>,
        /// The object's data and metadata sizes, when known.
        sizes: Option<(u64, u64)>,
        /// The digest of its bytes, with the sizes.
        digest: Option<ContentDigest>,
    },
    /// Answer to `Trace`: the stamps taken since the last one, oldest first.
    Traced(Vec<TraceStamp>),
    /// The request was refused as a whole.
    Error(StoreError),
    /// Answer to `LocateCopies`.
    Copies {
        /// Live nodes holding a sealed copy, with their failure domains and whether each is a
        /// copy of record.
        copies: Vec<CopyView>,
        /// Copies of record the object wants: the registry's count when it keeps a record of
        /// the object; without records, what the answering node knows (it put the object or
        /// holds a copy of record).
        wanted: Option<u8>,
        /// The object's data and metadata sizes, when known.
        sizes: Option<(u64, u64)>,
        /// Whether the answer knows which copies are copies of record: the built-in directory
        /// keeps their records, and a standalone node has none; Redis keeps none, so without
        /// this no copy is marked `of_record`.
        records_known: bool,
    },
}

/// One moment on the path of a request, as the daemon saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStamp {
    /// What happened (`request_read`, `message_read`, `eager_sent`…).
    pub event: String,
    /// When, in nanoseconds of the machine's monotonic clock (`CLOCK_MONOTONIC`), which every
    /// process of the machine shares.
    pub at_ns: u64,
}

/// This daemon's view of its cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// This node.
    pub node: NodeId,
    /// The fabric in use (`none` when the daemon runs alone).
    pub fabric: String,
    /// The directory in use, described without secrets.
    pub directory: String,
    /// Whether the directory answers.
    pub directory_healthy: bool,
    /// Largest object (data + metadata) this node's receive slots take eagerly: above it every
    /// fetch is a rendezvous, whatever the mode.
    pub eager_capacity_bytes: u64,
    /// Every live node the directory lists, this one included.
    pub members: Vec<MemberView>,
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    /// The node.
    pub node: NodeId,
    /// Where its fabric listens.
    pub address: String,
    /// Its fabric.
    pub fabric: String,
    /// Whether this daemon has a connection to it.
    pub connected: bool,
    /// The eager threshold this daemon uses for fetches from it, in bytes.
    pub eager_threshold_bytes: Option<u64>,
    /// Link details negotiated at connect time.
    pub link: String,
    /// Its failure domain (`--failure-domain`; empty: none given).
    pub failure_domain: String,
}

/// A frame from the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerFrame {
    /// The reply to a request.
    Reply {
        /// The request answered (`RequestId(0)` when the request could not be decoded).
        request: RequestId,
        /// The answer.
        response: Response,
    },
    /// A notification on a subscribed connection.
    Event(ObjectEvent),
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is over the limit.
    #[error("frame of {len} bytes is over the {limit}-byte limit")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The body does not decode.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Reads a frame's body length from its header, checking it against `limit`.
pub fn decode_frame_len(
    header: [u8; FRAME_HEADER_BYTES],
    limit: usize,
) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(header) as usize;
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    Ok(len)
}

/// Appends a whole frame (header and body) for `message` to `out`.
pub fn encode_frame<T: Serialize>(message: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    // Serializing plain data into a Vec cannot fail.
    let encoded = postcard::to_extend(message, std::mem::take(out))
        .expect("postcard serialization into a Vec cannot fail");
    *out = encoded;
    let body_len =
        u32::try_from(out.len() - start - FRAME_HEADER_BYTES).expect("frames are far below 4 GiB");
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&body_len.to_le_bytes());
}

/// Decodes a request body.
pub fn decode_request(body: &[u8]) -> Result<RequestFrame, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Decodes a daemon frame body.
pub fn decode_server_frame(body: &[u8]) -> Result<ServerFrame, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// The bytes of an inline put as one byte string: postcard then copies them whole instead of
/// one element at a time (a 4 KiB put cost microseconds on each side). The encoding is the
/// one of a `Vec<u8>` (a length, then the bytes), so either side may use either.
mod byte_vec {
    use std::fmt;

    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(ByteVec)
    }

    struct ByteVec;

    impl<'de> Visitor<'de> for ByteVec {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
            Ok(bytes.to_vec())
        }

        fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(bytes)
        }

        /// Formats that write bytes as a sequence (JSON's array of numbers).
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(byte) = seq.next_element()? {
                bytes.push(byte);
            }
            Ok(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_round_trips() {
        let frame = RequestFrame {
            request: RequestId(7),
            body: Request::Get {
                ids: vec![ObjectId::from_u64(1), ObjectId::from_u64(2)],
                timeout_ms: Some(100),
            },
        };
        let mut bytes = Vec::new();
        encode_frame(&frame, &mut bytes);
        let len = decode_frame_len(bytes[..4].try_into().unwrap(), MAX_REQUEST_BYTES).unwrap();
        assert_eq!(len, bytes.len() - 4);
        assert_eq!(decode_request(&bytes[4..]).unwrap(), frame);
    }

    #[test]
    fn oversized_length_is_refused() {
        let header = ((MAX_REQUEST_BYTES + 1) as u32).to_le_bytes();
        assert!(matches!(
            decode_frame_len(header, MAX_REQUEST_BYTES),
            Err(FrameError::TooLarge { .. })
        ));
    }

    /// An inline put's bytes are encoded as a `Vec<u8>` always was: clients and daemons of
    /// either encoding understand each other.
    #[test]
    fn inline_put_bytes_keep_the_vec_encoding() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct AsBytes(#[serde(with = "super::byte_vec")] Vec<u8>);
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct AsVec(Vec<u8>);
        for len in [0usize, 1, 127, 128, 4096, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let bytes = postcard::to_allocvec(&AsBytes(data.clone())).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&AsVec(data.clone())).unwrap());
            assert_eq!(postcard::from_bytes::<AsVec>(&bytes).unwrap().0, data);
            assert_eq!(postcard::from_bytes::<AsBytes>(&bytes).unwrap().0, data);
        }
    }

    proptest! {
        /// Arbitrary bytes never panic the decoders.
        #[test]
        fn decoding_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_request(&bytes);
            let _ = decode_server_frame(&bytes);
        }
    }
}
