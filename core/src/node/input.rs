//! Everything a node can be told: one [`NodeInput`] value per event, handed to
//! [`Node::handle`] with the time it happened. A driver that records these values (with their
//! times) has all it takes to replay a node's run: the core holds no other source of change.

use serde::{Deserialize, Serialize};

use crate::shared_list::SharedList;

use super::{ClusterMember, GrantError, Node, PeerParams, ReadError, ReadGrant, ReadOpId};
use crate::client_protocol::RequestFrame;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryEvent, DirectoryOpId, DirectoryReply};
use crate::ids::{ClientId, NodeId, TransferId};
use crate::store::{RecoveredObject, RecoveryReport};
use crate::time::Instant;
use crate::wire::{PeerMessage, WireError};

/// One input of a node. Serializable, so a driver can record what its node was told; a
/// message's bytes are borrowed from the driver's receive buffer (`'a`), never copied to make
/// the input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeInput<'a> {
    /// A local client connected. Its first request must be `Hello`.
    ClientConnected {
        /// The client.
        client: ClientId,
    },
    /// A local client disconnected: its fetches are dropped, its references released and its
    /// unsealed objects aborted.
    ClientDisconnected {
        /// The client.
        client: ClientId,
    },
    /// One request of a local client. Every request gets exactly one
    /// [`NodeOutput::Reply`](super::NodeOutput::Reply) (`get` and `fetch` when they complete),
    /// except `ReleaseUnanswered`, which gets none; a request before `Hello`, or a `Hello` of
    /// another protocol version, also closes the connection.
    ClientRequest {
        /// The client.
        client: ClientId,
        /// Its request.
        frame: RequestFrame,
    },
    /// Every [`NodeOutput::Persist`](super::NodeOutput::Persist) up to sequence number `upto`
    /// is durable: replies that waited for them go out, and space of removed objects up to
    /// there is free again.
    Persisted {
        /// The last durable change.
        upto: u64,
    },
    /// The directory's list of live members changed.
    DirectoryMembers {
        /// The live members, sorted by node id (shared: a driver that converts one directory
        /// list once hands every node the same one).
        members: SharedList<ClusterMember>,
    },
    /// The directory became reachable (`Ok`) or not (`Err` with why).
    DirectoryHealth {
        /// Reachable, or why not.
        health: Result<(), String>,
    },
    /// The directory answered operation `op`.
    DirectoryReply {
        /// The operation of a [`NodeOutput::Directory`](super::NodeOutput::Directory).
        op: DirectoryOpId,
        /// The answer.
        reply: DirectoryReply,
    },
    /// The directory told this node something it subscribed to.
    DirectoryEvent {
        /// What happened.
        event: DirectoryEvent,
    },
    /// How the connection to `peer` is set up (fabric, lanes, MTU…), for `nodes` replies.
    PeerLink {
        /// The peer.
        peer: NodeId,
        /// The link as the fabric negotiated it.
        link: super::PeerLink,
    },
    /// The connection to `peer` is up (again), with its lanes and measured costs.
    PeerConnected {
        /// The peer.
        peer: NodeId,
        /// Its lanes and costs.
        params: PeerParams,
    },
    /// The connection to `peer` is gone. Transfers from it fail over (after their posted READs
    /// complete); leases granted to it run out on their own, since a READ may still be in
    /// flight.
    PeerLost {
        /// The peer.
        peer: NodeId,
    },
    /// A message arrived from `peer` as bytes. A malformed message is counted and reported
    /// ([`Handled::Malformed`]); the node's state is unchanged. Keep the bytes until the
    /// outputs are carried out: an eager chunk's
    /// [`NodeOutput::WriteLocal`](super::NodeOutput::WriteLocal) names its payload in them.
    PeerBytes {
        /// The sender.
        peer: NodeId,
        /// The message as it arrived.
        #[serde(borrow)]
        bytes: &'a [u8],
    },
    /// A decoded message other than `EagerData` (whose payload must come as bytes, through
    /// [`NodeInput::PeerBytes`]).
    PeerMessage {
        /// The sender.
        peer: NodeId,
        /// The message (recorded in its wire encoding).
        #[serde(with = "wire_encoded")]
        message: PeerMessage,
    },
    /// The fabric's answer to [`NodeOutput::GrantRead`](super::NodeOutput::GrantRead): the keys
    /// `peer` reads the lease's object with, or why it cannot (the fetch is refused with that
    /// reason).
    ReadGranted {
        /// The reader.
        peer: NodeId,
        /// Its transfer.
        req: TransferId,
        /// The keys, or why there are none.
        result: Result<ReadGrant, GrantError>,
    },
    /// The fabric's answer to [`NodeOutput::RevokeRead`](super::NodeOutput::RevokeRead): the
    /// lease's keys reach nothing any more, so its object is unpinned.
    ReadRevoked {
        /// The reader.
        peer: NodeId,
        /// Its transfer.
        req: TransferId,
    },
    /// A READ posted with [`NodeOutput::PostRead`](super::NodeOutput::PostRead) completed. On
    /// success its bytes are in the local region.
    ReadCompletion {
        /// The READ.
        op: ReadOpId,
        /// How it ended.
        result: Result<(), ReadError>,
    },
    /// The driver's answer to [`NodeOutput::VerifyContent`](super::NodeOutput::VerifyContent):
    /// what the copy's bytes hash to.
    ContentHashed {
        /// The transfer.
        transfer: TransferId,
        /// The digest of the copy's bytes.
        actual: ContentDigest,
    },
    /// Objects a persistent store found on restart (see
    /// [`Store::recover`](crate::store::Store::recover)), each with the digest of its bytes as
    /// the driver found them; the node publishes them. Answered with [`Handled::Recovered`].
    Recovered {
        /// The objects and their digests.
        objects: Vec<(RecoveredObject, ContentDigest)>,
    },
    /// Time passed: every timer due at or before `now` fires. Early calls are harmless.
    Timeout,
    /// The driver's answer to [`NodeOutput::Spill`](super::NodeOutput::Spill): the write is
    /// complete (the object's memory may be freed) or failed (it stays in memory).
    SpillDone {
        /// The write.
        op: crate::store::SpillOpId,
        /// How it went: where the record is, or why there is none.
        result: Result<crate::store::SpillPlace, crate::store::SpillError>,
    },
    /// The driver's answer to [`NodeOutput::Restore`](super::NodeOutput::Restore): the bytes
    /// are in the region and match the record's checksum, or the object is lost.
    RestoreDone {
        /// The record.
        op: crate::store::SpillOpId,
        /// How it went.
        result: Result<(), crate::store::RestoreError>,
    },
    /// Spilled objects a persistent store's index named on restart (see
    /// [`Store::recover_spilled`](crate::store::Store::recover_spilled)), each with the digest
    /// its spill record carries; the node publishes them. Answered with
    /// [`Handled::RecoveredSpilled`].
    RecoveredSpilled {
        /// The objects and their digests.
        objects: Vec<(crate::store::RecoveredSpilled, Option<ContentDigest>)>,
    },
    /// Spilled objects a persistent store's index named on restart that the driver found lost
    /// (their spill records missing or damaged, or refused by the spill tier): counted in the
    /// spill tier's `lost_at_start_total`.
    SpilledLostAtStart {
        /// How many.
        objects: u64,
    },
}

impl NodeInput<'_> {
    /// The variant's name, for summaries and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeInput::ClientConnected { .. } => "client_connected",
            NodeInput::ClientDisconnected { .. } => "client_disconnected",
            NodeInput::ClientRequest { .. } => "client_request",
            NodeInput::Persisted { .. } => "persisted",
            NodeInput::DirectoryMembers { .. } => "directory_members",
            NodeInput::DirectoryHealth { .. } => "directory_health",
            NodeInput::DirectoryReply { .. } => "directory_reply",
            NodeInput::DirectoryEvent { .. } => "directory_event",
            NodeInput::PeerLink { .. } => "peer_link",
            NodeInput::PeerConnected { .. } => "peer_connected",
            NodeInput::PeerLost { .. } => "peer_lost",
            NodeInput::PeerBytes { .. } => "peer_bytes",
            NodeInput::PeerMessage { .. } => "peer_message",
            NodeInput::ReadGranted { .. } => "read_granted",
            NodeInput::ReadRevoked { .. } => "read_revoked",
            NodeInput::ReadCompletion { .. } => "read_completion",
            NodeInput::ContentHashed { .. } => "content_hashed",
            NodeInput::Recovered { .. } => "recovered",
            NodeInput::Timeout => "timeout",
            NodeInput::SpillDone { .. } => "spill_done",
            NodeInput::RestoreDone { .. } => "restore_done",
            NodeInput::RecoveredSpilled { .. } => "recovered_spilled",
            NodeInput::SpilledLostAtStart { .. } => "spilled_lost_at_start",
        }
    }
}

/// What [`Node::handle`] says about an input besides its outputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// Taken in; its effects are among the outputs.
    Done,
    /// [`NodeInput::PeerBytes`] did not decode: counted, and otherwise ignored (the driver logs
    /// it and may drop the connection).
    Malformed(WireError),
    /// [`NodeInput::Recovered`]: what the store restored.
    Recovered(RecoveryReport),
    /// [`NodeInput::RecoveredSpilled`]: what the spill tier took back.
    RecoveredSpilled(crate::store::SpilledRecoveryReport),
}

impl Node {
    /// Gives the node one input that happened at `now` (times never go back; an earlier `now`
    /// counts as the latest seen). Drain the outputs afterwards, with
    /// [`drive_host`](super::drive_host) or [`Node::poll_output`].
    pub fn handle(&mut self, now: Instant, input: NodeInput<'_>) -> Handled {
        match input {
            NodeInput::ClientConnected { client } => self.handle_client_connected(now, client),
            NodeInput::ClientDisconnected { client } => {
                self.handle_client_disconnected(now, client)
            }
            NodeInput::ClientRequest { client, frame } => {
                self.handle_client_request(now, client, frame)
            }
            NodeInput::Persisted { upto } => self.handle_persisted(now, upto),
            NodeInput::DirectoryMembers { members } => self.handle_directory_members(now, members),
            NodeInput::DirectoryHealth { health } => self.handle_directory_health(now, health),
            NodeInput::DirectoryReply { op, reply } => self.handle_directory_reply(now, op, reply),
            NodeInput::DirectoryEvent { event } => self.handle_directory_event(now, event),
            NodeInput::PeerLink { peer, link } => self.handle_peer_link(now, peer, link),
            NodeInput::PeerConnected { peer, params } => {
                self.handle_peer_connected(now, peer, params)
            }
            NodeInput::PeerLost { peer } => self.handle_peer_lost(now, peer),
            NodeInput::PeerBytes { peer, bytes } => {
                if let Err(error) = self.handle_peer_bytes(now, peer, bytes) {
                    return Handled::Malformed(error);
                }
            }
            NodeInput::PeerMessage { peer, message } => {
                self.handle_peer_message(now, peer, message)
            }
            NodeInput::ReadGranted { peer, req, result } => {
                self.handle_read_granted(now, peer, req, result)
            }
            NodeInput::ReadRevoked { peer, req } => self.handle_read_revoked(now, peer, req),
            NodeInput::ReadCompletion { op, result } => {
                self.handle_read_completion(now, op, result)
            }
            NodeInput::ContentHashed { transfer, actual } => {
                self.handle_content_hashed(now, transfer, actual)
            }
            NodeInput::Recovered { objects } => {
                return Handled::Recovered(self.handle_recovered(now, objects))
            }
            NodeInput::Timeout => self.handle_timeout(now),
            NodeInput::SpillDone { op, result } => self.handle_spill_done(now, op, result),
            NodeInput::RestoreDone { op, result } => self.handle_restore_done(now, op, result),
            NodeInput::RecoveredSpilled { objects } => {
                return Handled::RecoveredSpilled(self.handle_recovered_spilled(now, objects))
            }
            NodeInput::SpilledLostAtStart { objects } => {
                self.handle_spilled_lost_at_start(now, objects)
            }
        }
        Handled::Done
    }
}

/// A [`PeerMessage`] in its wire encoding (it has no serde form of its own: the wire is its
/// format).
mod wire_encoded {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::wire::{self, PeerMessage};

    pub(super) fn serialize<S: Serializer>(
        message: &PeerMessage,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        wire::to_bytes(message).serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<PeerMessage, D::Error> {
        let bytes = Vec::<u8>::deserialize(deserializer)?;
        wire::decode(&bytes).map_err(serde::de::Error::custom)
    }
}
