//! The rules of one-sided READ access, shared by every fabric that serves READs in software
//! (the TCP fabric's thread, the simulator's RDMA model): a key per lease, valid only for the
//! peer it was granted to and only inside the granted region, dead once revoked.
//!
//! A READ is *admitted* when its request arrives and *done* when its data has been copied out
//! of the arena (or dropped); in between it is *serving*. A revocation with nothing serving
//! takes effect at once; otherwise the key stops admitting READs at once and the revocation
//! completes when the last serving READ is done ([`GrantTable::done`] says which lease), so
//! the core, which unpins only when told the revocation is complete, never unpins memory a
//! READ still copies from.
//!
//! The table draws no keys itself (no randomness here): the caller passes a source of
//! candidates, random in production (a peer cannot guess another lease's key), seeded in the
//! simulator.

use std::collections::BTreeMap;

use crate::{ArenaId, LocalRegion, NodeId, ObjectId, TransferId};

/// One lease's READ access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Who may READ.
    pub peer: NodeId,
    /// The peer's transfer (its lease).
    pub req: TransferId,
    /// The object granted, when the fabric was told (for diagnostics and checks).
    pub object: Option<ObjectId>,
    /// The region the key reaches.
    pub region: LocalRegion,
    /// READs admitted and not yet done.
    pub serving: u32,
    /// Revoked while READs were serving: admits nothing more, removed when they are done.
    pub revoked: bool,
}

/// Why a READ was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// No grant has this key (never granted, revoked, or from an older registration).
    #[error("no live grant has this key")]
    UnknownKey,
    /// The key's lease was revoked while other READs were still serving.
    #[error("the key's lease is being revoked")]
    Revoked,
    /// The key was granted to another peer.
    #[error("the key was granted to another peer")]
    OtherPeer,
    /// The range is not inside the granted region (or overflows).
    #[error("the range is outside the granted region")]
    OutsideGrant,
}

/// An admitted READ: where to copy from. Hand the key back to [`GrantTable::done`] when the
/// copy is finished or abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// The arena holding the region.
    pub arena: ArenaId,
    /// The object granted, if the fabric was told.
    pub object: Option<ObjectId>,
}

/// What a revocation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Revocation {
    /// No READ can touch the region any more: tell the core now.
    Complete,
    /// READs under the key are still serving: the revocation completes when the last is
    /// done (reported by [`GrantTable::done`]).
    AfterServing,
    /// No grant was live for this lease: nothing reaches its region.
    NotGranted,
}

impl Revocation {
    /// Whether the core may be told at once that no READ reaches the region.
    pub fn is_complete(self) -> bool {
        !matches!(self, Revocation::AfterServing)
    }
}

/// Every live grant of one fabric.
#[derive(Debug, Default, Clone)]
pub struct GrantTable {
    by_key: BTreeMap<u32, Grant>,
    by_lease: BTreeMap<(NodeId, TransferId), u32>,
}

impl GrantTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Grants `peer`'s lease `req` READs of `region`: the first key from `candidates` that no
    /// live grant uses. A second grant for one lease replaces the first (a driver bug; the
    /// older key dies with it). `candidates` must eventually yield an unused key.
    pub fn grant(
        &mut self,
        peer: NodeId,
        req: TransferId,
        object: Option<ObjectId>,
        region: LocalRegion,
        mut candidates: impl FnMut() -> u32,
    ) -> u32 {
        let key = loop {
            let key = candidates();
            if !self.by_key.contains_key(&key) {
                break key;
            }
        };
        if let Some(old) = self.by_lease.insert((peer, req), key) {
            self.by_key.remove(&old);
        }
        self.by_key.insert(
            key,
            Grant {
                peer,
                req,
                object,
                region,
                serving: 0,
                revoked: false,
            },
        );
        key
    }

    /// Ends the lease's access (see [`Revocation`]).
    pub fn revoke(&mut self, peer: NodeId, req: TransferId) -> Revocation {
        let Some(key) = self.by_lease.remove(&(peer, req)) else {
            return Revocation::NotGranted;
        };
        match self.by_key.get_mut(&key) {
            Some(grant) if grant.serving > 0 => {
                grant.revoked = true;
                Revocation::AfterServing
            }
            _ => {
                self.by_key.remove(&key);
                Revocation::Complete
            }
        }
    }

    /// Admits `peer`'s READ of `[offset, offset + len)` of the arena under `key`; it serves
    /// until [`GrantTable::done`].
    pub fn admit(
        &mut self,
        peer: NodeId,
        key: u32,
        offset: u64,
        len: u64,
    ) -> Result<Admitted, AdmitError> {
        let grant = self.by_key.get_mut(&key).ok_or(AdmitError::UnknownKey)?;
        if grant.revoked {
            return Err(AdmitError::Revoked);
        }
        if grant.peer != peer {
            return Err(AdmitError::OtherPeer);
        }
        let end = offset.checked_add(len).ok_or(AdmitError::OutsideGrant)?;
        if offset < grant.region.offset || end > grant.region.end() {
            return Err(AdmitError::OutsideGrant);
        }
        grant.serving += 1;
        Ok(Admitted {
            arena: grant.region.arena,
            object: grant.object,
        })
    }

    /// A READ admitted under `key` is done (copied or dropped): the lease whose revocation
    /// this completes, if any.
    pub fn done(&mut self, key: u32) -> Option<(NodeId, TransferId)> {
        let grant = self.by_key.get_mut(&key)?;
        debug_assert!(grant.serving > 0, "a READ under {key:#x} done twice");
        grant.serving = grant.serving.saturating_sub(1);
        if grant.revoked && grant.serving == 0 {
            let grant = self.by_key.remove(&key)?;
            return Some((grant.peer, grant.req));
        }
        None
    }

    /// Whether any live grant uses `key`.
    pub fn contains_key(&self, key: u32) -> bool {
        self.by_key.contains_key(&key)
    }

    /// Every grant still reaching memory (live, or revoked with READs serving), by key.
    pub fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.by_key.values()
    }

    /// Grants still reaching memory.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no grant reaches memory.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Forgets every grant: the memory was registered anew (its old keys reach nothing), or
    /// is gone. Only for when no READ can be serving any more.
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_lease.clear();
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

    fn counter() -> impl FnMut() -> u32 {
        let mut next = 0u32;
        move || {
            next += 1;
            next
        }
    }

    #[test]
    fn a_key_serves_its_peer_inside_its_region_until_revoked() {
        let mut grants = GrantTable::new();
        let (a, b) = (NodeId(1), NodeId(2));
        let key = grants.grant(a, TransferId(7), None, region(), counter());
        let admitted = grants.admit(a, key, 4096, 8192).unwrap();
        assert_eq!(admitted.arena, ArenaId(3));
        assert_eq!(grants.done(key), None);
        assert_eq!(grants.admit(b, key, 4096, 10), Err(AdmitError::OtherPeer));
        assert_eq!(
            grants.admit(a, key, 4095, 10),
            Err(AdmitError::OutsideGrant),
            "before the region"
        );
        assert_eq!(
            grants.admit(a, key, 12_000, 4096),
            Err(AdmitError::OutsideGrant),
            "past its end"
        );
        assert_eq!(
            grants.admit(a, key, u64::MAX, 2),
            Err(AdmitError::OutsideGrant),
            "overflow"
        );
        assert_eq!(
            grants.admit(a, key ^ 1, 4096, 10),
            Err(AdmitError::UnknownKey)
        );
        assert_eq!(grants.revoke(a, TransferId(7)), Revocation::Complete);
        assert_eq!(grants.admit(a, key, 4096, 10), Err(AdmitError::UnknownKey));
        assert!(grants.is_empty());
        assert_eq!(grants.revoke(a, TransferId(7)), Revocation::NotGranted);
    }

    #[test]
    fn a_revocation_waits_for_the_reads_being_served() {
        let mut grants = GrantTable::new();
        let a = NodeId(1);
        let key = grants.grant(a, TransferId(7), None, region(), counter());
        grants.admit(a, key, 4096, 10).unwrap();
        grants.admit(a, key, 5000, 10).unwrap();
        assert_eq!(grants.revoke(a, TransferId(7)), Revocation::AfterServing);
        assert_eq!(grants.len(), 1, "the region is still reached");
        assert_eq!(grants.admit(a, key, 4096, 10), Err(AdmitError::Revoked));
        assert_eq!(grants.done(key), None);
        assert_eq!(grants.done(key), Some((a, TransferId(7))));
        assert!(grants.is_empty());
    }

    #[test]
    fn keys_in_use_are_skipped_and_a_second_grant_replaces_the_first() {
        let mut grants = GrantTable::new();
        let a = NodeId(1);
        let first = grants.grant(a, TransferId(1), None, region(), || 5);
        assert_eq!(first, 5);
        let mut candidates = [5, 5, 9].into_iter();
        let second = grants.grant(a, TransferId(2), None, region(), || {
            candidates.next().unwrap()
        });
        assert_eq!(second, 9, "a key in use is never handed out twice");
        let again = grants.grant(a, TransferId(2), None, region(), || 11);
        assert_eq!(again, 11);
        assert!(!grants.contains_key(9), "the lease's older key died");
        assert_eq!(grants.len(), 2);
    }
}
