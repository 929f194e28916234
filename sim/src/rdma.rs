//! Simulated memory and one-sided READs. Each node has one arena of real bytes, registered under
//! a base address and rkey that change when the node restarts. A READ is served here, from the
//! holder's arena, without the holder's core — as a NIC (or the TCP fabric's thread) serves it —
//! and only through a key the holder's fabric granted for one lease: to that reader, within
//! that object's region, until the revocation took effect (as a verbs memory window). The
//! grants are the core's [`GrantTable`], the TCP fabric's own rules: a READ is admitted, serves
//! while its data is copied out, and a revocation that arrives meanwhile completes only when
//! the last READ under the key is done.

use std::collections::BTreeMap;

use skyriver_core::grants::{AdmitError, Grant, GrantTable, Revocation};
use skyriver_core::node::ArenaKey;
use skyriver_core::{ArenaId, LocalRegion, NodeId, ObjectId, RemoteRegion, TransferId};

/// Byte written over fresh and lost memory, so reads of it are easy to spot.
pub const POISON: u8 = 0xA5;

/// One node incarnation's memory.
#[derive(Debug)]
pub struct Memory {
    arena: Vec<u8>,
    key: ArenaKey,
    /// READ keys granted and still reaching memory.
    grants: GrantTable,
    next_grant: u32,
}

/// A READ the holder's fabric admitted: copy `range` for `object`, then call [`Memory::done`]
/// with `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmittedRead {
    /// The key it was admitted under.
    pub key: u32,
    /// The object whose grant covers it.
    pub object: ObjectId,
    /// The bytes it reads.
    pub range: LocalRegion,
}

impl Memory {
    /// Fresh memory of `bytes`, poisoned, under `key`.
    pub fn new(bytes: u64, key: ArenaKey) -> Self {
        Memory {
            arena: vec![POISON; bytes as usize],
            key,
            grants: GrantTable::new(),
            next_grant: 0,
        }
    }

    /// The same bytes under a new registration, nothing granted: a restart in persistent mode
    /// (READs the old registration was serving died with the process).
    pub fn reregister(&mut self, key: ArenaKey) {
        self.key = key;
        self.grants.clear();
    }
    /// The registration of arena 0.
    pub fn key(&self) -> ArenaKey {
        self.key
    }

    /// Region keys for the node's configuration.
    pub fn region_keys(&self) -> BTreeMap<ArenaId, ArenaKey> {
        BTreeMap::from([(ArenaId(0), self.key)])
    }

    /// The bytes of a local region.
    pub fn read(&self, region: LocalRegion) -> &[u8] {
        assert_eq!(
            region.arena,
            ArenaId(0),
            "the simulator has one arena per node"
        );
        &self.arena[region.offset as usize..region.end() as usize]
    }

    /// Writes bytes into a local region.
    pub fn write(&mut self, region: LocalRegion, bytes: &[u8]) {
        assert_eq!(
            region.len as usize,
            bytes.len(),
            "write of {} bytes into {region}",
            bytes.len()
        );
        assert_eq!(
            region.arena,
            ArenaId(0),
            "the simulator has one arena per node"
        );
        self.arena[region.offset as usize..region.end() as usize].copy_from_slice(bytes);
    }

    /// The fabric grants `reader`'s lease `req` READs of `object`'s `region`: a key no live
    /// grant and no registration uses.
    pub fn grant(
        &mut self,
        reader: NodeId,
        req: TransferId,
        object: ObjectId,
        region: LocalRegion,
    ) -> u32 {
        let (rkey, next) = (self.key.rkey, &mut self.next_grant);
        self.grants
            .grant(reader, req, Some(object), region, || loop {
                *next = next.wrapping_add(1);
                let key = rkey.rotate_left(16) ^ next.wrapping_mul(0x9e37_79b9);
                if key != rkey {
                    break key;
                }
            })
    }

    /// The lease `(reader, req)` ended (see [`Revocation`]).
    pub fn revoke(&mut self, reader: NodeId, req: TransferId) -> Revocation {
        self.grants.revoke(reader, req)
    }

    /// Grants reaching memory now (live, or revoked with READs still serving).
    pub fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.grants.grants()
    }

    /// Admits `reader`'s READ of `remote`: it serves until [`Memory::done`].
    pub fn admit(
        &mut self,
        reader: NodeId,
        remote: RemoteRegion,
    ) -> Result<AdmittedRead, AdmitError> {
        let offset = remote
            .addr
            .checked_sub(self.key.base_addr)
            .ok_or(AdmitError::OutsideGrant)?;
        let admitted = self.grants.admit(reader, remote.rkey, offset, remote.len)?;
        Ok(AdmittedRead {
            key: remote.rkey,
            // The simulator names the object of every grant.
            object: admitted.object.expect("simulated grants name their object"),
            range: LocalRegion {
                arena: admitted.arena,
                offset,
                len: remote.len,
            },
        })
    }

    /// An admitted READ's data was copied out (or dropped): the lease whose revocation this
    /// completes, if any.
    pub fn done(&mut self, key: u32) -> Option<(NodeId, TransferId)> {
        self.grants.done(key)
    }
}
