//! Why READs and fetches fail, and how a fetch moves bytes.

use std::fmt;

use crate::digest::ContentDigest;
use crate::error::StoreError;
use crate::ids::{NodeId, ObjectId};
use crate::region::LocalRegion;
use crate::wire::ObjectSizes;

/// Why a READ failed, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ReadError {
    /// The queue pair went to the error state (retry exceeded, flushed, ...).
    #[error("queue pair error: {0}")]
    QueuePair(String),
    /// The remote side refused access (bad rkey or range): the region is no longer exposed.
    #[error("remote access error (region not exposed or bad rkey)")]
    RemoteAccess,
    /// The connection to the peer is gone; the READ was flushed.
    #[error("connection lost")]
    ConnectionLost,
    /// Never posted: the local fabric had no room for its completion (the driver's event
    /// channel was full). The transfer fails at once and the fetch moves on, rather than
    /// the READ waiting in a queue.
    #[error("not posted: the local fabric is busy ({capacity} events wait for the driver)")]
    Busy {
        /// The event channel's capacity, all of it taken.
        capacity: u64,
    },
}

/// Why the fabric could not grant a reader READ access to a lease's region, as the driver
/// reports it (the fetch is refused with it). Recorded and replayed, so it carries values,
/// not sources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum GrantError {
    /// No connection to the reader (it was lost while the grant was under way).
    #[error("no connection to {0}")]
    NotConnected(NodeId),
    /// The region lies outside this node's arenas.
    #[error("region {0} is outside this node's arenas")]
    BadRegion(LocalRegion),
    /// A view of the region that conflicts with serving READs is alive (it is being written).
    #[error("region {0} is in use in this process")]
    InUse(LocalRegion),
    /// Every memory window is bound to a lease; more are granted as leases end.
    #[error("all {limit} memory windows are bound to leases; fewer READs at once would fit")]
    WindowsExhausted {
        /// How many windows the device allows this node.
        limit: usize,
    },
    /// The device refused to allocate or bind a memory window; its message (the text of an
    /// OS or device error, which the core only reports).
    #[error("{0}")]
    Device(String),
    /// This fabric cannot serve READs of a copy still being received (a relay's).
    #[error("this fabric cannot serve a copy still being received")]
    PartialCopyUnsupported,
    /// The region spans two memory registrations of its arena, and a memory window lies in one.
    #[error(
        "{0} spans two memory regions of its arena, and a window lies in one (raise max_mr_bytes)"
    )]
    SpansRegistrations(LocalRegion),
}

/// How a fetch moves an object's bytes, chosen per fetch by the client.
///
/// Coalesced fetches of one object share one transfer: the mode of the fetch that started it
/// applies.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum TransferMode {
    /// Eager up to the peer's threshold (cost model or `--eager-threshold`), rendezvous above.
    #[default]
    Auto,
    /// Eager whenever the receive slots can carry the object; rendezvous above that.
    Eager,
    /// Rendezvous (one-sided READ) for every object that has bytes.
    Rendezvous,
}

impl TransferMode {
    /// Every mode, in the order tools list them.
    pub const ALL: [TransferMode; 3] = [
        TransferMode::Eager,
        TransferMode::Rendezvous,
        TransferMode::Auto,
    ];

    /// The lowercase name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            TransferMode::Auto => "auto",
            TransferMode::Eager => "eager",
            TransferMode::Rendezvous => "rendezvous",
        }
    }
}

impl fmt::Display for TransferMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransferMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TransferMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown transfer mode {s:?}: expected auto, eager or rendezvous")
            })
    }
}

/// Why a fetch of one object failed. Reaches the client with a reason it can show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum FetchError {
    /// No live node holds the object (at once, or by the deadline when the fetch waited for a
    /// publication).
    #[error("object {id}: no live node holds it")]
    NotFound {
        /// The object.
        id: ObjectId,
    },
    /// The object is not here and this daemon is in no cluster, so nothing can bring it.
    #[error(
        "object {id} is not here, and this daemon is in no cluster to fetch it from (start it \
         with --head, --join or --directory)"
    )]
    NoCluster {
        /// The object.
        id: ObjectId,
    },
    /// The deadline passed while the object was on its way.
    #[error("object {id}: timed out while {stage}")]
    Timeout {
        /// The object.
        id: ObjectId,
        /// What the fetch was doing.
        stage: String,
    },
    /// Every holder failed, in every round.
    #[error("object {id}: all sources failed after {attempts} attempts; last: {last_error}")]
    SourcesFailed {
        /// The object.
        id: ObjectId,
        /// Transfers tried.
        attempts: u32,
        /// The last failure (boxed: it is rare, and keeps every `FetchError` small).
        last_error: Box<SourceFailure>,
    },
    /// The directory did not answer, after every retry.
    #[error("object {id}: directory unavailable: {reason}")]
    DirectoryUnavailable {
        /// The object.
        id: ObjectId,
        /// Its last answer.
        reason: String,
    },
    /// The local store refused the object (out of memory, too large).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The last reason a fetch found no source, as [`FetchError::SourcesFailed`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum SourceFailure {
    /// The directory named holders, but none was connected.
    #[error("no connected holder")]
    NoConnectedHolder,
    /// A lookup failed; the directory's answer.
    #[error("directory: {reason}")]
    Directory {
        /// The directory's reason, from its wire.
        reason: String,
    },
    /// A transfer from a holder the directory named failed.
    #[error("{holder}: {failure}")]
    Holder {
        /// The holder.
        holder: NodeId,
        /// Why its transfer failed.
        #[source]
        failure: TransferFailure,
    },
    /// The node the caller named as a hint did not deliver the object.
    #[error("hinted {holder}: {failure}")]
    Hinted {
        /// The hinted node.
        holder: NodeId,
        /// Why its answer was of no use.
        #[source]
        failure: TransferFailure,
    },
}

/// Why a transfer from one holder ended without the object (the fetch then tries another).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum TransferFailure {
    /// The connection to the holder was lost.
    #[error("connection to {holder} lost")]
    ConnectionLost {
        /// The holder.
        holder: NodeId,
    },
    /// The holder left before the transfer could start.
    #[error("{holder} disconnected while queued")]
    DisconnectedWhileQueued {
        /// The holder.
        holder: NodeId,
    },
    /// The holder names an object of a size no block can hold.
    #[error("{holder} names an object of {}+{} bytes", sizes.data_size, sizes.metadata_size)]
    UnusableSizes {
        /// The holder.
        holder: NodeId,
        /// The sizes it named.
        sizes: ObjectSizes,
    },
    /// The holder's object is not the one the directory described.
    #[error(
        "holder has size {}+{} and digest {digest}, the directory said {}+{} and {expected_digest}",
        sizes.data_size, sizes.metadata_size, expected_sizes.data_size, expected_sizes.metadata_size
    )]
    OtherContent {
        /// The holder's sizes.
        sizes: ObjectSizes,
        /// The holder's digest.
        digest: ContentDigest,
        /// The directory's sizes.
        expected_sizes: ObjectSizes,
        /// The directory's digest.
        expected_digest: ContentDigest,
    },
    /// The holder's lease is too short for any READ to complete within it.
    #[error("the {lease_ms} ms lease ends before any READ could complete")]
    LeaseTooShort {
        /// The lease the holder granted.
        lease_ms: u32,
    },
    /// The holder does not have the object.
    #[error("holder does not have it")]
    NotFound,
    /// The holder is serving all it can.
    #[error("holder busy")]
    Busy,
    /// The holder refused, in its words.
    #[error("holder error: {reason}")]
    Refused {
        /// The holder's reason, from the wire.
        reason: String,
    },
    /// The holder sent a message the transfer's state does not expect.
    #[error("unexpected {message} in state {state}")]
    UnexpectedMessage {
        /// The message.
        message: String,
        /// Where the transfer stood.
        state: String,
    },
    /// Eager data came without its payload.
    #[error("eager data without its bytes")]
    EagerWithoutBytes,
    /// An eager chunk that does not continue the object.
    #[error(
        "eager chunk at {offset} of size {}+{} and digest {digest}, expected at {expected_offset} \
         of {}+{} and {expected_digest}",
        sizes.data_size, sizes.metadata_size, expected_sizes.data_size, expected_sizes.metadata_size
    )]
    EagerChunkMismatch {
        /// The chunk's offset.
        offset: u64,
        /// The chunk's object sizes.
        sizes: ObjectSizes,
        /// The chunk's object digest.
        digest: ContentDigest,
        /// The offset the transfer expected.
        expected_offset: u64,
        /// The transfer's sizes.
        expected_sizes: ObjectSizes,
        /// The transfer's digest.
        expected_digest: ContentDigest,
    },
    /// A READ of the object failed.
    #[error("READ failed: {0}")]
    Read(#[source] ReadError),
    /// No complete reply from the holder in time.
    #[error("no complete reply from the holder in time")]
    NoReplyInTime,
    /// The READs were not done before the holder's lease would end.
    #[error("READs not done before the holder's lease would end")]
    ReadsTooSlow,
    /// The bytes do not hash to the object id's digest.
    #[error("the bytes from {holder} hash to {actual}, not to the id's digest {expected}")]
    DigestMismatch {
        /// The holder.
        holder: NodeId,
        /// What the bytes hash to.
        actual: ContentDigest,
        /// The id's digest.
        expected: ContentDigest,
    },
    /// The relay this node read from failed its own transfer of the object.
    #[error("the relay's own transfer failed: {0}")]
    RelayFailed(#[source] Box<TransferFailure>),
    /// A holder redirected the request for other content than the directory named.
    #[error(
        "redirected for size {}+{} and digest {digest}, the directory said {}+{} and \
         {expected_digest}",
        sizes.data_size, sizes.metadata_size, expected_sizes.data_size, expected_sizes.metadata_size
    )]
    RedirectedForOtherContent {
        /// Sizes named by the redirect.
        sizes: ObjectSizes,
        /// Digest named by the redirect.
        digest: ContentDigest,
        /// Sizes the directory named.
        expected_sizes: ObjectSizes,
        /// Digest the directory named.
        expected_digest: ContentDigest,
    },
    /// A relay claimed more bytes than the object has.
    #[error("the relay claims {prefix} bytes of a {total}-byte object")]
    RelayPrefixBeyondObject {
        /// Bytes claimed.
        prefix: u64,
        /// The object's bytes.
        total: u64,
    },
    /// Relay progress came from a holder that had granted the whole object.
    #[error("relay progress from a holder that granted all of it")]
    RelayProgressUnasked,
    /// The first eager chunk of a hinted request did not start the object.
    #[error("the first chunk came at offset {offset}")]
    FirstChunkNotAtStart {
        /// Where it came.
        offset: u64,
    },
    /// The holder kept saying it was restoring the object from disk past the requester's
    /// bound ([`NodeConfig::restore_wait_limit`](super::NodeConfig::restore_wait_limit)).
    #[error("the holder was still restoring the object from disk after {waited_ms} ms")]
    RestoreTooSlow {
        /// How long the requester waited, from its request.
        waited_ms: u64,
    },
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::{ReadError, TransferFailure};

    #[test]
    fn a_failed_read_ends_its_transfer_with_the_read_error_as_cause() {
        let failure = TransferFailure::Read(ReadError::ConnectionLost);
        let cause = failure.source().expect("the READ's error");
        assert_eq!(
            cause.downcast_ref::<ReadError>(),
            Some(&ReadError::ConnectionLost)
        );
    }
}
