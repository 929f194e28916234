//! Simulated memory and one-sided READs. Each node has one arena of real bytes, registered under
//! a base address and rkey that change when the node restarts. A READ is served here, from the
//! holder's arena, without the holder's core — as a NIC (or the TCP fabric's thread) serves it —
//! and only through a key the holder's fabric granted for one lease: to that reader, within
//! that object's region, until the revocation took effect (as a verbs memory window).

use std::collections::BTreeMap;

use skyriver_core::node::ArenaKey;
use skyriver_core::{ArenaId, LocalRegion, NodeId, ObjectId, RemoteRegion, TransferId};

/// Byte written over fresh and lost memory, so reads of it are easy to spot.
pub const POISON: u8 = 0xA5;

/// One node incarnation's memory.
#[derive(Debug)]
pub struct Memory {
    arena: Vec<u8>,
    key: ArenaKey,
    /// READ keys granted and not yet revoked.
    grants: BTreeMap<u32, Grant>,
    next_grant: u32,
}

/// One lease's READ access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Who may READ.
    pub reader: NodeId,
    /// The reader's transfer.
    pub req: TransferId,
    /// The object.
    pub object: ObjectId,
    /// Its region.
    pub region: LocalRegion,
}

/// Why a READ was refused by the holder's fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeError {
    /// No live grant has this key (revoked, an older registration, or garbage).
    BadRkey,
    /// The key was granted to another node.
    OtherReader,
    /// The range is not inside the granted region.
    OutsideGrant,
}

impl Memory {
    /// Fresh memory of `bytes`, poisoned, under `key`.
    pub fn new(bytes: u64, key: ArenaKey) -> Self {
        Memory {
            arena: vec![POISON; bytes as usize],
            key,
            grants: BTreeMap::new(),
            next_grant: 0,
        }
    }

    /// The same bytes under a new registration, nothing granted: a restart in persistent mode.
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

    /// The fabric grants `grant.reader` READs of `grant.region`: a key no live grant and no
    /// registration uses.
    pub fn grant(&mut self, grant: Grant) -> u32 {
        let key = loop {
            self.next_grant = self.next_grant.wrapping_add(1);
            let key = self.key.rkey.rotate_left(16) ^ self.next_grant.wrapping_mul(0x9e37_79b9);
            if key != self.key.rkey && !self.grants.contains_key(&key) {
                break key;
            }
        };
        self.grants.insert(key, grant);
        key
    }

    /// The lease `(reader, req)` ended: its key reaches nothing any more. False when no grant
    /// matched.
    pub fn revoke(&mut self, reader: NodeId, req: TransferId) -> bool {
        let before = self.grants.len();
        self.grants
            .retain(|_, g| !(g.reader == reader && g.req == req));
        self.grants.len() < before
    }

    /// Grants alive now.
    pub fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.grants.values()
    }

    /// Serves `reader`'s READ of `remote`: the object whose grant covers it, and the bytes.
    pub fn serve(
        &self,
        reader: NodeId,
        remote: RemoteRegion,
    ) -> Result<(ObjectId, Vec<u8>), ServeError> {
        let grant = self.grants.get(&remote.rkey).ok_or(ServeError::BadRkey)?;
        if grant.reader != reader {
            return Err(ServeError::OtherReader);
        }
        let offset = remote
            .addr
            .checked_sub(self.key.base_addr)
            .ok_or(ServeError::OutsideGrant)?;
        let end = offset
            .checked_add(remote.len)
            .ok_or(ServeError::OutsideGrant)?;
        if offset < grant.region.offset || end > grant.region.end() {
            return Err(ServeError::OutsideGrant);
        }
        Ok((
            grant.object,
            self.arena[offset as usize..end as usize].to_vec(),
        ))
    }
}
