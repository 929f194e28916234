//! The peer wire format: messages between two nodes' cores over a fabric connection.
//!
//! Every message is an 8-byte header — magic `b"SR"`, version, kind, body length (u32 LE) —
//! then a body of fixed little-endian fields. The format is hand-written rather than derived so
//! every length is explicit and every field is checked: [`decode`] of arbitrary bytes returns
//! an error and never panics or allocates more than the input's length.

use std::fmt;

use crate::digest::ContentDigest;
use crate::ids::{NodeId, ObjectId, TransferId, OBJECT_ID_LEN};
use crate::region::RemoteRegion;

/// First two bytes of every message.
pub const MAGIC: [u8; 2] = *b"SR";
/// Version of this format; a message of another version is refused. 4: `Restoring`,
/// `ExtendLease` and `LeaseExtended`.
pub const WIRE_VERSION: u8 = 4;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 8;
/// Largest message (header and body) either side sends or accepts.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Largest object the protocol moves (data plus metadata): 256 TiB.
pub const MAX_OBJECT_BYTES: u64 = 1 << 48;
/// Most remote regions in one `Rendezvous`.
pub const MAX_REGIONS: usize = 16;
/// Most per-lane access keys for one region of a `Rendezvous` (a fabric's lanes to a peer).
pub const MAX_LANE_KEYS: usize = 64;
/// Longest `Error` reason, in bytes.
pub const MAX_REASON_BYTES: usize = 256;
/// Longest lease a holder may grant, in milliseconds.
pub const MAX_LEASE_MS: u32 = 600_000;
/// Bytes of an `EagerData` body before its payload; a receive slot of `n` bytes carries at most
/// `n - HEADER_BYTES - EAGER_FIXED_BYTES` payload bytes.
pub const EAGER_FIXED_BYTES: usize = 8 * 5 + 4;

const KIND_FETCH_REQUEST: u8 = 1;
const KIND_EAGER_DATA: u8 = 2;
const KIND_RENDEZVOUS: u8 = 3;
const KIND_FINISH: u8 = 4;
const KIND_NOT_FOUND: u8 = 5;
const KIND_BUSY: u8 = 6;
const KIND_ERROR: u8 = 7;
const KIND_REDIRECT: u8 = 8;
const KIND_RELAY_PROGRESS: u8 = 9;
const KIND_RESTORING: u8 = 10;
const KIND_EXTEND_LEASE: u8 = 11;
const KIND_LEASE_EXTENDED: u8 = 12;

/// Sizes of an object: data then metadata, contiguous.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ObjectSizes {
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes.
    pub metadata_size: u64,
}

impl ObjectSizes {
    /// Data plus metadata; `None` on overflow.
    pub fn total(&self) -> Option<u64> {
        self.data_size.checked_add(self.metadata_size)
    }
}

/// The part of an `EagerData` message before its payload. A holder's core emits it with the
/// region to send from; the driver gathers the payload from its arena and encodes both with
/// [`encode_eager`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EagerHeader {
    /// The requester's transfer.
    pub req: TransferId,
    /// Sizes of the whole object.
    pub sizes: ObjectSizes,
    /// The digest of the whole object's bytes, as the holder sealed it.
    pub digest: ContentDigest,
    /// Offset of this chunk's payload within the object.
    pub offset: u64,
}

/// A message between two nodes.
#[derive(Clone, PartialEq, Eq)]
pub enum PeerMessage {
    /// Requester → holder: send me object `id`.
    FetchRequest {
        /// Chosen by the requester, echoed in every reply.
        req: TransferId,
        /// The object.
        id: ObjectId,
        /// Objects up to this many bytes (data + metadata) come eagerly.
        eager_limit: u64,
        /// Most payload bytes in one `EagerData` (what the requester's receive slot holds).
        max_chunk_bytes: u32,
    },
    /// Holder → requester: a chunk of a small object.
    EagerData {
        /// Which transfer, object sizes and offset.
        header: EagerHeader,
        /// The chunk's bytes.
        payload: Vec<u8>,
    },
    /// Holder → requester: the object is pinned; READ it from these regions, then `Finish`.
    Rendezvous {
        /// The transfer.
        req: TransferId,
        /// Sizes of the object.
        sizes: ObjectSizes,
        /// The digest of the object's bytes, as the holder sealed it.
        digest: ContentDigest,
        /// Where the object lies, in order; lengths sum to the object's size.
        regions: Vec<RemoteRegion>,
        /// Keys scoped to this lease, per lane: empty when each region's `rkey` serves every
        /// lane, else `k` keys per region (region-major) and a READ on lane `l` of region `i`
        /// uses `lane_keys[i * k + l % k]`. Opaque to the core: the holder's fabric made them
        /// (verbs: one memory window per lane, since a type 2 window serves one queue pair).
        lane_keys: Vec<u32>,
        /// How long the holder keeps the object pinned without a `Finish`.
        lease_ms: u32,
    },
    /// Requester → holder: done reading (or giving up); unpin.
    Finish {
        /// The transfer.
        req: TransferId,
    },
    /// Holder → requester: the object is not (or no longer) here.
    NotFound {
        /// The transfer.
        req: TransferId,
    },
    /// Holder → requester: too many transfers right now; try elsewhere or later.
    Busy {
        /// The transfer.
        req: TransferId,
    },
    /// Holder → requester: the request cannot be served.
    Error {
        /// The transfer.
        req: TransferId,
        /// Why, for logs and the fetching client.
        reason: String,
    },
    /// Holder → requester: this object is being sent to many nodes at once; pull it from
    /// `relay`, which is receiving it now and serves what it has received (a pipeline of
    /// relays, so the holder's link carries each byte about once). The sizes and digest are
    /// the holder's: the copy is verified against them as from the holder itself.
    Redirect {
        /// The transfer.
        req: TransferId,
        /// The node to ask instead.
        relay: NodeId,
        /// Sizes of the object.
        sizes: ObjectSizes,
        /// The digest of the object's bytes.
        digest: ContentDigest,
    },
    /// Relay → requester, after a `Rendezvous` over a copy the relay is still receiving: the
    /// first `prefix` bytes are in, and READs below it see the object's bytes. Only grows.
    RelayProgress {
        /// The transfer.
        req: TransferId,
        /// Bytes from the start that the relay holds.
        prefix: u64,
    },
    /// Holder → requester: the object is on this node's disk and being read back into memory;
    /// the answer follows once it is. Sent at once and repeated while the restore lasts, so the
    /// requester waits longer than its reply timeout (up to a bound of its own).
    Restoring {
        /// The transfer.
        req: TransferId,
    },
    /// Requester → holder: my READs progress but will not be done within the lease; keep the
    /// object pinned for another lease from now.
    ExtendLease {
        /// The transfer.
        req: TransferId,
    },
    /// Holder → requester: the lease was extended, by `lease_ms` from when the holder got the
    /// `ExtendLease`. A holder whose lease is gone (or that extended it enough) says nothing.
    LeaseExtended {
        /// The transfer.
        req: TransferId,
        /// How long the holder keeps the object pinned from now without a `Finish`.
        lease_ms: u32,
    },
}

impl PeerMessage {
    /// The transfer this message belongs to.
    pub fn req(&self) -> TransferId {
        match self {
            PeerMessage::FetchRequest { req, .. }
            | PeerMessage::Rendezvous { req, .. }
            | PeerMessage::Finish { req }
            | PeerMessage::NotFound { req }
            | PeerMessage::Busy { req }
            | PeerMessage::Error { req, .. }
            | PeerMessage::Redirect { req, .. }
            | PeerMessage::RelayProgress { req, .. }
            | PeerMessage::Restoring { req }
            | PeerMessage::ExtendLease { req }
            | PeerMessage::LeaseExtended { req, .. } => *req,
            PeerMessage::EagerData { header, .. } => header.req,
        }
    }
}

impl fmt::Debug for PeerMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for PeerMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerMessage::FetchRequest { req, id, eager_limit, max_chunk_bytes } => write!(
                f,
                "FetchRequest{{{req}, {id}, eager_limit={eager_limit}, max_chunk={max_chunk_bytes}}}"
            ),
            PeerMessage::EagerData { header, payload } => write!(
                f,
                "EagerData{{{}, size={}+{}, at={}, {} bytes}}",
                header.req,
                header.sizes.data_size,
                header.sizes.metadata_size,
                header.offset,
                payload.len()
            ),
            PeerMessage::Rendezvous {
                req,
                sizes,
                digest: _,
                regions,
                lane_keys,
                lease_ms,
            } => {
                write!(
                    f,
                    "Rendezvous{{{req}, size={}+{}, lease={lease_ms}ms, regions=[",
                    sizes.data_size, sizes.metadata_size
                )?;
                for (i, region) in regions.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{region}")?;
                }
                write!(f, "]")?;
                if !lane_keys.is_empty() {
                    write!(f, ", lane keys={lane_keys:#x?}")?;
                }
                write!(f, "}}")
            }
            PeerMessage::Finish { req } => write!(f, "Finish{{{req}}}"),
            PeerMessage::NotFound { req } => write!(f, "NotFound{{{req}}}"),
            PeerMessage::Busy { req } => write!(f, "Busy{{{req}}}"),
            PeerMessage::Error { req, reason } => write!(f, "Error{{{req}, {reason:?}}}"),
            PeerMessage::Redirect {
                req, relay, sizes, ..
            } => write!(
                f,
                "Redirect{{{req}, to {relay}, size={}+{}}}",
                sizes.data_size, sizes.metadata_size
            ),
            PeerMessage::RelayProgress { req, prefix } => {
                write!(f, "RelayProgress{{{req}, prefix={prefix}}}")
            }
            PeerMessage::Restoring { req } => write!(f, "Restoring{{{req}}}"),
            PeerMessage::ExtendLease { req } => write!(f, "ExtendLease{{{req}}}"),
            PeerMessage::LeaseExtended { req, lease_ms } => {
                write!(f, "LeaseExtended{{{req}, lease={lease_ms}ms}}")
            }
        }
    }
}

/// Why bytes are not a valid peer message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or the announced body.
    #[error("truncated message: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The first two bytes are not [`MAGIC`].
    #[error("bad magic {0:02x?}: not a Skyriver peer message")]
    BadMagic([u8; 2]),
    /// Another version of the format.
    #[error("peer speaks wire version {got}, this node speaks {WIRE_VERSION}")]
    Version {
        /// The peer's version.
        got: u8,
    },
    /// An unknown message kind.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The message is larger than [`MAX_MESSAGE_BYTES`].
    #[error("message of {len} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLarge {
        /// Announced length.
        len: usize,
    },
    /// Bytes left over after the body.
    #[error("{0} trailing bytes after the message body")]
    Trailing(usize),
    /// A field holds a value the protocol forbids.
    #[error("invalid field {field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

fn invalid(field: &'static str, why: impl Into<String>) -> WireError {
    WireError::Invalid {
        field,
        why: why.into(),
    }
}

/// Appends the encoding of `message` to `out`.
pub fn encode(message: &PeerMessage, out: &mut Vec<u8>) {
    let start = begin(out, kind_of(message));
    match message {
        PeerMessage::FetchRequest {
            req,
            id,
            eager_limit,
            max_chunk_bytes,
        } => {
            put_u64(out, req.0);
            out.extend_from_slice(id.as_bytes());
            put_u64(out, *eager_limit);
            put_u32(out, *max_chunk_bytes);
        }
        PeerMessage::EagerData { header, payload } => {
            put_eager_fixed(out, header, payload.len());
            out.extend_from_slice(payload);
        }
        PeerMessage::Rendezvous {
            req,
            sizes,
            digest,
            regions,
            lane_keys,
            lease_ms,
        } => {
            put_u64(out, req.0);
            put_u64(out, sizes.data_size);
            put_u64(out, sizes.metadata_size);
            put_u64(out, digest.0);
            put_u32(out, *lease_ms);
            // Encoding is only ever asked of messages the core built within the limits.
            put_u16(
                out,
                u16::try_from(regions.len()).expect("region count within MAX_REGIONS"),
            );
            for region in regions {
                put_u64(out, region.addr);
                put_u64(out, region.len);
                put_u32(out, region.rkey);
            }
            put_u16(
                out,
                u16::try_from(lane_keys.len()).expect("lane keys within the limits"),
            );
            for key in lane_keys {
                put_u32(out, *key);
            }
        }
        PeerMessage::Finish { req }
        | PeerMessage::NotFound { req }
        | PeerMessage::Busy { req }
        | PeerMessage::Restoring { req }
        | PeerMessage::ExtendLease { req } => put_u64(out, req.0),
        PeerMessage::Error { req, reason } => {
            put_u64(out, req.0);
            let reason = truncate_utf8(reason, MAX_REASON_BYTES);
            put_u16(out, reason.len() as u16);
            out.extend_from_slice(reason.as_bytes());
        }
        PeerMessage::Redirect {
            req,
            relay,
            sizes,
            digest,
        } => {
            put_u64(out, req.0);
            put_u32(out, relay.0);
            put_u64(out, sizes.data_size);
            put_u64(out, sizes.metadata_size);
            put_u64(out, digest.0);
        }
        PeerMessage::RelayProgress { req, prefix } => {
            put_u64(out, req.0);
            put_u64(out, *prefix);
        }
        PeerMessage::LeaseExtended { req, lease_ms } => {
            put_u64(out, req.0);
            put_u32(out, *lease_ms);
        }
    }
    finish(out, start);
}

/// Appends an `EagerData` message made of `header` and `payload` (gathered by the driver from
/// the region the core named) to `out`.
pub fn encode_eager(header: &EagerHeader, payload: &[u8], out: &mut Vec<u8>) {
    let start = begin(out, KIND_EAGER_DATA);
    put_eager_fixed(out, header, payload.len());
    out.extend_from_slice(payload);
    finish(out, start);
}

/// The encoding of `message` as a new vector.
pub fn to_bytes(message: &PeerMessage) -> Vec<u8> {
    let mut out = Vec::new();
    encode(message, &mut out);
    out
}

/// Total length of the message whose first [`HEADER_BYTES`] are `header`, for stream fabrics
/// (TCP) that must know how much to read. Checks magic, version and the length limit.
pub fn message_len(header: &[u8]) -> Result<usize, WireError> {
    let (_, body_len) = parse_header(header)?;
    Ok(HEADER_BYTES + body_len)
}

/// Bytes `start..start + len` of the message a node was given, where an eager payload lies:
/// the driver copies them straight from its receive buffer into the object, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputBytes {
    /// Offset in the message.
    pub start: usize,
    /// Length.
    pub len: usize,
}

impl InputBytes {
    /// As a range of the message's bytes.
    pub fn range(self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// A decoded message; an `EagerData` payload stays where it is in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedMessage {
    /// `EagerData`: its header, and where its payload lies in the input.
    Eager {
        /// Everything but the payload.
        header: EagerHeader,
        /// The payload's place in the input.
        payload: InputBytes,
    },
    /// Any other message.
    Message(PeerMessage),
}

/// Decodes exactly one message from `bytes`, validating every field.
pub fn decode(bytes: &[u8]) -> Result<PeerMessage, WireError> {
    Ok(match decode_in_place(bytes)? {
        DecodedMessage::Eager { header, payload } => PeerMessage::EagerData {
            header,
            payload: bytes[payload.range()].to_vec(),
        },
        DecodedMessage::Message(message) => message,
    })
}

/// [`decode`], leaving an eager payload in `bytes` (no copy).
pub fn decode_in_place(bytes: &[u8]) -> Result<DecodedMessage, WireError> {
    let (kind, body_len) = parse_header(bytes)?;
    let have = bytes.len() - HEADER_BYTES;
    if have < body_len {
        return Err(WireError::Truncated {
            need: HEADER_BYTES + body_len,
            have: bytes.len(),
        });
    }
    if have > body_len {
        return Err(WireError::Trailing(have - body_len));
    }
    let mut r = Reader {
        bytes: &bytes[HEADER_BYTES..],
        pos: 0,
    };
    let message = match kind {
        KIND_FETCH_REQUEST => {
            let req = TransferId(r.u64()?);
            let id = ObjectId::from_slice(r.take(OBJECT_ID_LEN)?)
                .map_err(|e| invalid("id", e.to_string()))?;
            let eager_limit = r.u64()?;
            let max_chunk_bytes = r.u32()?;
            if max_chunk_bytes as usize > MAX_MESSAGE_BYTES {
                return Err(invalid(
                    "max_chunk_bytes",
                    format!("{max_chunk_bytes} over the message limit"),
                ));
            }
            PeerMessage::FetchRequest {
                req,
                id,
                eager_limit,
                max_chunk_bytes,
            }
        }
        KIND_EAGER_DATA => {
            let req = TransferId(r.u64()?);
            let sizes = r.sizes()?;
            let digest = ContentDigest(r.u64()?);
            let offset = r.u64()?;
            let payload_len = r.u32()? as usize;
            let payload = InputBytes {
                start: HEADER_BYTES + r.pos,
                len: payload_len,
            };
            r.take(payload_len)?;
            let total = sizes.total().unwrap_or(u64::MAX);
            let end = offset.checked_add(payload_len as u64);
            if end.is_none_or(|end| end > total) {
                return Err(invalid(
                    "offset",
                    format!("chunk {offset}+{payload_len} runs past the object's {total} bytes"),
                ));
            }
            return finish_decoding(
                &r,
                DecodedMessage::Eager {
                    header: EagerHeader {
                        req,
                        sizes,
                        digest,
                        offset,
                    },
                    payload,
                },
            );
        }
        KIND_RENDEZVOUS => {
            let req = TransferId(r.u64()?);
            let sizes = r.sizes()?;
            let digest = ContentDigest(r.u64()?);
            let lease_ms = r.u32()?;
            if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
                return Err(invalid(
                    "lease_ms",
                    format!("{lease_ms} not in 1..={MAX_LEASE_MS}"),
                ));
            }
            let count = r.u16()? as usize;
            if count == 0 || count > MAX_REGIONS {
                return Err(invalid(
                    "regions",
                    format!("{count} regions, not in 1..={MAX_REGIONS}"),
                ));
            }
            let mut regions = Vec::with_capacity(count);
            let mut sum: u64 = 0;
            for _ in 0..count {
                let region = RemoteRegion {
                    addr: r.u64()?,
                    len: r.u64()?,
                    rkey: r.u32()?,
                };
                if region.len == 0 || region.addr.checked_add(region.len).is_none() {
                    return Err(invalid("regions", format!("bad region {region}")));
                }
                sum = sum.saturating_add(region.len);
                regions.push(region);
            }
            let total = sizes.total().unwrap_or(u64::MAX);
            if sum != total {
                return Err(invalid(
                    "regions",
                    format!("regions hold {sum} bytes, the object {total}"),
                ));
            }
            let keys = r.u16()? as usize;
            if keys % count != 0 || keys / count > MAX_LANE_KEYS {
                return Err(invalid(
                    "lane_keys",
                    format!(
                        "{keys} keys for {count} regions: not a multiple, or more than \
                         {MAX_LANE_KEYS} per region"
                    ),
                ));
            }
            let mut lane_keys = Vec::with_capacity(keys);
            for _ in 0..keys {
                lane_keys.push(r.u32()?);
            }
            PeerMessage::Rendezvous {
                req,
                sizes,
                digest,
                regions,
                lane_keys,
                lease_ms,
            }
        }
        KIND_FINISH => PeerMessage::Finish {
            req: TransferId(r.u64()?),
        },
        KIND_NOT_FOUND => PeerMessage::NotFound {
            req: TransferId(r.u64()?),
        },
        KIND_BUSY => PeerMessage::Busy {
            req: TransferId(r.u64()?),
        },
        KIND_ERROR => {
            let req = TransferId(r.u64()?);
            let len = r.u16()? as usize;
            if len > MAX_REASON_BYTES {
                return Err(invalid(
                    "reason",
                    format!("{len} bytes, limit {MAX_REASON_BYTES}"),
                ));
            }
            let reason = std::str::from_utf8(r.take(len)?)
                .map_err(|_| invalid("reason", "not UTF-8"))?
                .to_owned();
            PeerMessage::Error { req, reason }
        }
        KIND_REDIRECT => PeerMessage::Redirect {
            req: TransferId(r.u64()?),
            relay: NodeId(r.u32()?),
            sizes: r.sizes()?,
            digest: ContentDigest(r.u64()?),
        },
        KIND_RELAY_PROGRESS => {
            let req = TransferId(r.u64()?);
            let prefix = r.u64()?;
            if prefix > MAX_OBJECT_BYTES {
                return Err(invalid(
                    "prefix",
                    format!("{prefix} over the object size limit"),
                ));
            }
            PeerMessage::RelayProgress { req, prefix }
        }
        KIND_RESTORING => PeerMessage::Restoring {
            req: TransferId(r.u64()?),
        },
        KIND_EXTEND_LEASE => PeerMessage::ExtendLease {
            req: TransferId(r.u64()?),
        },
        KIND_LEASE_EXTENDED => {
            let req = TransferId(r.u64()?);
            let lease_ms = r.u32()?;
            if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
                return Err(invalid(
                    "lease_ms",
                    format!("{lease_ms} not in 1..={MAX_LEASE_MS}"),
                ));
            }
            PeerMessage::LeaseExtended { req, lease_ms }
        }
        other => return Err(WireError::UnknownKind(other)),
    };
    finish_decoding(&r, DecodedMessage::Message(message))
}

/// The whole body must have been read.
fn finish_decoding(r: &Reader<'_>, message: DecodedMessage) -> Result<DecodedMessage, WireError> {
    if r.pos != r.bytes.len() {
        return Err(WireError::Invalid {
            field: "body",
            why: format!("{} bytes left after the fields", r.bytes.len() - r.pos),
        });
    }
    Ok(message)
}

fn parse_header(bytes: &[u8]) -> Result<(u8, usize), WireError> {
    if bytes.len() < HEADER_BYTES {
        return Err(WireError::Truncated {
            need: HEADER_BYTES,
            have: bytes.len(),
        });
    }
    let magic = [bytes[0], bytes[1]];
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if bytes[2] != WIRE_VERSION {
        return Err(WireError::Version { got: bytes[2] });
    }
    let kind = bytes[3];
    let body_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    if HEADER_BYTES + body_len > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge {
            len: HEADER_BYTES + body_len,
        });
    }
    Ok((kind, body_len))
}

fn kind_of(message: &PeerMessage) -> u8 {
    match message {
        PeerMessage::FetchRequest { .. } => KIND_FETCH_REQUEST,
        PeerMessage::EagerData { .. } => KIND_EAGER_DATA,
        PeerMessage::Rendezvous { .. } => KIND_RENDEZVOUS,
        PeerMessage::Finish { .. } => KIND_FINISH,
        PeerMessage::NotFound { .. } => KIND_NOT_FOUND,
        PeerMessage::Busy { .. } => KIND_BUSY,
        PeerMessage::Error { .. } => KIND_ERROR,
        PeerMessage::Redirect { .. } => KIND_REDIRECT,
        PeerMessage::RelayProgress { .. } => KIND_RELAY_PROGRESS,
        PeerMessage::Restoring { .. } => KIND_RESTORING,
        PeerMessage::ExtendLease { .. } => KIND_EXTEND_LEASE,
        PeerMessage::LeaseExtended { .. } => KIND_LEASE_EXTENDED,
    }
}

fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(WIRE_VERSION);
    out.push(kind);
    out.extend_from_slice(&[0; 4]);
    start
}

fn finish(out: &mut [u8], start: usize) {
    let body_len = out.len() - start - HEADER_BYTES;
    assert!(
        HEADER_BYTES + body_len <= MAX_MESSAGE_BYTES,
        "encoded a {body_len}-byte body over the message limit"
    );
    out[start + 4..start + 8].copy_from_slice(&(body_len as u32).to_le_bytes());
}

fn put_eager_fixed(out: &mut Vec<u8>, header: &EagerHeader, payload_len: usize) {
    put_u64(out, header.req.0);
    put_u64(out, header.sizes.data_size);
    put_u64(out, header.sizes.metadata_size);
    put_u64(out, header.digest.0);
    put_u64(out, header.offset);
    put_u32(
        out,
        u32::try_from(payload_len).expect("eager chunks are below the message limit"),
    );
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(WireError::Truncated {
                need: HEADER_BYTES + self.pos.saturating_add(n),
                have: HEADER_BYTES + self.bytes.len(),
            })?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn sizes(&mut self) -> Result<ObjectSizes, WireError> {
        let sizes = ObjectSizes {
            data_size: self.u64()?,
            metadata_size: self.u64()?,
        };
        match sizes.total() {
            Some(total) if total <= MAX_OBJECT_BYTES => Ok(sizes),
            _ => Err(invalid(
                "sizes",
                format!(
                    "{}+{} over the object size limit",
                    sizes.data_size, sizes.metadata_size
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
