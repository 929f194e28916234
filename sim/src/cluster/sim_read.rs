//! One READ of the simulated fabric, from its post to its completion: who posted it, to whom,
//! on which connection, for what.

use skyriver_core::{LocalRegion, NodeId, ObjectId, ReadError, ReadOpId};

use super::Event;

/// A READ posted by `requester` (in incarnation `requester_inc`) to `holder` on the connection
/// of `epoch`, to land in `local` for `object`.
#[derive(Debug, Clone, Copy)]
pub(super) struct SimRead {
    pub(super) requester: NodeId,
    pub(super) requester_inc: u32,
    pub(super) holder: NodeId,
    pub(super) epoch: u64,
    pub(super) op: ReadOpId,
    pub(super) local: LocalRegion,
    pub(super) object: ObjectId,
}

impl SimRead {
    /// The event that hands the READ's outcome to its requester.
    pub(super) fn complete(self, result: Result<Vec<u8>, ReadError>) -> Event {
        Event::ReadComplete { read: self, result }
    }

    /// Whether `node` in incarnation `inc` posted it.
    pub(super) fn posted_by(&self, node: NodeId, inc: u32) -> bool {
        self.requester == node && self.requester_inc == inc
    }
}
