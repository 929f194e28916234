//! Broadcast through copies under the simulator: a READ served from a relay's partial copy
//! must read bytes the relay has received (the object's own bytes), and the planted flaw that
//! tells readers the relay holds more than it does must be caught by that check.

use skyriver_core::store::ObjectInfo;

use super::*;

/// How many READ slices the planted flaw adds to a relay's progress.
const RUNS_AHEAD_SLICES: u64 = 8;

impl Cluster {
    /// `holder` (incarnation `holder_inc`) served `bytes` of `range` from its partial copy
    /// `info` for `read`: they must be the object's bytes there, unless the copy took damage
    /// (then so does the reader's).
    pub(super) fn check_relayed_read(
        &mut self,
        holder: NodeId,
        holder_inc: u32,
        info: &ObjectInfo,
        range: LocalRegion,
        read: &SimRead,
        bytes: &[u8],
    ) {
        self.stats.relayed_reads += 1;
        if self.damaged_copies.contains(&(holder, holder_inc, info.id)) {
            self.damaged_copies
                .insert((read.requester, read.requester_inc, read.object));
            return;
        }
        let offset = range.offset - info.region.offset;
        if let Err(why) = self.checker.check_range(info, offset, bytes) {
            self.checker.violation(
                self.now,
                format!(
                    "{holder}: relayed bytes {offset}+{} of its partial copy of {} to {} that it \
                     has not received: {why}",
                    bytes.len(),
                    info.id,
                    read.requester
                ),
            );
        }
    }

    /// The message `bytes` on its way, under the planted flaw that makes a relay's progress
    /// run one READ slice ahead of what it holds.
    pub(super) fn relay_progress_flaw(&self, bytes: Vec<u8>) -> Vec<u8> {
        if !self.flaws.relay_progress_runs_ahead {
            return bytes;
        }
        match wire::decode(&bytes) {
            Ok(wire::PeerMessage::RelayProgress { req, prefix }) => {
                wire::to_bytes(&wire::PeerMessage::RelayProgress {
                    req,
                    prefix: prefix + RUNS_AHEAD_SLICES * self.params.read_slice_bytes,
                })
            }
            _ => bytes,
        }
    }
}
