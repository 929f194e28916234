//! READ access per lease on the TCP fabric: a random key for each grant, valid only for the
//! peer it was granted to and only inside the granted region, dead once revoked.
//!
//! A READ is checked when its request arrives and its data written later by the connection's
//! writer; while the data of a granted READ is queued or being written the grant counts it as
//! *serving*. A revocation with nothing serving takes effect at once; otherwise the key stops
//! admitting new READs at once and the revocation is complete when the last READ in progress
//! is written or dropped ([`Serving`]'s `Drop`), so the core never unpins memory a READ still
//! copies from. The table's rules are the core's [`GrantTable`], which the simulator runs too;
//! here it lives behind the fabric's mutex and draws its keys from the OS.

use std::sync::{Arc, Mutex};

use skyriver_core::grants::GrantTable;
use skyriver_core::{ArenaId, LocalRegion, NodeId, TransferId};

use super::lock;
use crate::fabric::{EventSender, FabricEvent};

/// Every live grant of one fabric: the shared table's rules ([`GrantTable`]) with random keys.
#[derive(Debug, Default)]
pub(super) struct Grants {
    table: GrantTable,
    /// Keys drawn so far, mixed into each new one.
    attempts: u32,
}

impl Grants {
    /// A fresh key for `peer`'s lease `req` on `region`; random, so a peer cannot guess
    /// another lease's key (and a guessed one still fails: keys work for their own peer only).
    pub(super) fn grant(&mut self, peer: NodeId, req: TransferId, region: LocalRegion) -> u32 {
        let attempts = &mut self.attempts;
        self.table.grant(peer, req, None, region, || {
            let mut bytes = [0u8; 4];
            // The OS's generator does not fail on Linux once booted. Were it to, the counter
            // still makes every attempt a new key (unique, only guessable), so this ends.
            let _ = getrandom::getrandom(&mut bytes);
            *attempts = attempts.wrapping_add(1);
            u32::from_le_bytes(bytes) ^ attempts.wrapping_mul(0x9e37_79b9)
        })
    }

    /// Ends the lease's access: `true` when no READ can touch the region any more, `false`
    /// when READs under it are still being written (see the module documentation).
    pub(super) fn revoke(&mut self, peer: NodeId, req: TransferId) -> bool {
        self.table.revoke(peer, req).is_complete()
    }

    /// Admits `peer`'s READ of `[offset, offset + len)` under `key`: the arena to serve it
    /// from, or `None` (unknown or revoked key, another peer's key, outside the region).
    fn admit(&mut self, peer: NodeId, key: u32, offset: u64, len: u64) -> Option<ArenaId> {
        self.table
            .admit(peer, key, offset, len)
            .ok()
            .map(|admitted| admitted.arena)
    }

    /// A READ admitted under `key` is done; the lease whose revocation it completes, if any.
    fn done(&mut self, key: u32) -> Option<(NodeId, TransferId)> {
        self.table.done(key)
    }

    /// Live grants.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }
}

/// One admitted READ, from its request to the end of its data's write: dropping it (written,
/// or discarded with its connection) ends it and may complete a revocation.
pub(super) struct Serving {
    grants: Arc<Mutex<Grants>>,
    events: EventSender,
    key: u32,
}

impl Serving {
    /// Admits `peer`'s READ under `key` (see [`Grants::admit`]).
    pub(super) fn admit(
        grants: &Arc<Mutex<Grants>>,
        events: &EventSender,
        peer: NodeId,
        key: u32,
        offset: u64,
        len: u64,
    ) -> Option<(ArenaId, Serving)> {
        let arena = lock(grants).admit(peer, key, offset, len)?;
        let serving = Serving {
            grants: grants.clone(),
            events: events.clone(),
            key,
        };
        Some((arena, serving))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let revoked = lock(&self.grants).done(self.key);
        if let Some((peer, req)) = revoked {
            // The driver may be gone (shutting down); nothing to do then.
            let _ = self.events.send(FabricEvent::ReadRevoked { peer, req });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> LocalRegion {
        LocalRegion {
            arena: ArenaId(3),
            offset: 4096,
            len: 8192,
        }
    }

    #[test]
    fn a_key_serves_its_peer_inside_its_region_until_revoked() {
        let mut grants = Grants::default();
        let (a, b) = (NodeId(1), NodeId(2));
        let key = grants.grant(a, TransferId(7), region());
        assert_eq!(grants.admit(a, key, 4096, 8192), Some(ArenaId(3)));
        assert_eq!(grants.done(key), None);
        assert_eq!(grants.admit(b, key, 4096, 10), None, "another peer");
        assert_eq!(grants.admit(a, key, 4095, 10), None, "before the region");
        assert_eq!(grants.admit(a, key, 12_000, 4096), None, "past its end");
        assert_eq!(grants.admit(a, key, u64::MAX, 2), None, "overflow");
        assert_eq!(grants.admit(a, key ^ 1, 4096, 10), None, "another key");
        assert!(grants.revoke(a, TransferId(7)));
        assert_eq!(grants.admit(a, key, 4096, 10), None, "revoked");
        assert_eq!(grants.len(), 0);
    }

    #[test]
    fn a_revocation_waits_for_the_reads_being_served() {
        let mut grants = Grants::default();
        let a = NodeId(1);
        let key = grants.grant(a, TransferId(7), region());
        assert!(grants.admit(a, key, 4096, 10).is_some());
        assert!(grants.admit(a, key, 5000, 10).is_some());
        assert!(!grants.revoke(a, TransferId(7)), "two READs still serving");
        assert_eq!(
            grants.admit(a, key, 4096, 10),
            None,
            "no new READ after revoke"
        );
        assert_eq!(grants.done(key), None);
        assert_eq!(grants.done(key), Some((a, TransferId(7))));
        assert_eq!(grants.len(), 0);
    }

    #[test]
    fn dropping_a_serving_read_completes_the_revocation() {
        let grants = Arc::new(Mutex::new(Grants::default()));
        let (events, mut received) = crate::fabric::event_channel();
        let a = NodeId(1);
        let key = lock(&grants).grant(a, TransferId(9), region());
        let (_, serving) = Serving::admit(&grants, &events, a, key, 4096, 1).unwrap();
        assert!(!lock(&grants).revoke(a, TransferId(9)));
        assert!(received.try_recv().is_err());
        drop(serving);
        match received.try_recv() {
            Ok(FabricEvent::ReadRevoked { peer, req }) => {
                assert_eq!((peer, req), (a, TransferId(9)))
            }
            other => panic!("{other:?}"),
        }
    }
}
