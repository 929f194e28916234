//! Simulated memory and one-sided READs. Each node has one arena of real bytes, registered under
//! a base address and rkey that change when the node restarts. A READ is served here, from the
//! holder's arena, without the holder's core — as a NIC (or the TCP fabric's thread) serves it —
//! and only from regions the holder's core exposed.

use std::collections::BTreeMap;

use skyriver_core::node::ArenaKey;
use skyriver_core::{ArenaId, LocalRegion, ObjectId, RemoteRegion};

/// Byte written over fresh and lost memory, so reads of it are easy to spot.
pub const POISON: u8 = 0xA5;

/// One node incarnation's memory.
#[derive(Debug)]
pub struct Memory {
    arena: Vec<u8>,
    key: ArenaKey,
    exposed: BTreeMap<ObjectId, LocalRegion>,
}

/// Why a READ was refused by the holder's fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeError {
    /// Wrong rkey (an older registration, or garbage).
    BadRkey,
    /// The range is not inside a region the core exposed.
    NotExposed,
}

impl Memory {
    /// Fresh memory of `bytes`, poisoned, under `key`.
    pub fn new(bytes: u64, key: ArenaKey) -> Self {
        Memory {
            arena: vec![POISON; bytes as usize],
            key,
            exposed: BTreeMap::new(),
        }
    }

    /// The same bytes under a new registration, nothing exposed: a restart in persistent mode.
    pub fn reregister(&mut self, key: ArenaKey) {
        self.key = key;
        self.exposed.clear();
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

    /// The core exposed a region.
    pub fn expose(&mut self, object: ObjectId, region: LocalRegion) {
        let previous = self.exposed.insert(object, region);
        assert!(
            previous.is_none(),
            "{object} exposed twice without unexpose"
        );
    }

    /// The core withdrew an exposure.
    pub fn unexpose(&mut self, object: ObjectId, region: LocalRegion) {
        let previous = self.exposed.remove(&object);
        assert_eq!(
            previous,
            Some(region),
            "unexpose of {object} that was not exposed at {region}"
        );
    }

    /// Regions exposed now.
    pub fn exposed(&self) -> &BTreeMap<ObjectId, LocalRegion> {
        &self.exposed
    }

    /// Serves a READ of `remote`: the object whose exposed region holds it, and the bytes.
    pub fn serve(&self, remote: RemoteRegion) -> Result<(ObjectId, Vec<u8>), ServeError> {
        if remote.rkey != self.key.rkey {
            return Err(ServeError::BadRkey);
        }
        let Some(offset) = remote.addr.checked_sub(self.key.base_addr) else {
            return Err(ServeError::NotExposed);
        };
        let end = offset
            .checked_add(remote.len)
            .ok_or(ServeError::NotExposed)?;
        let (object, _) = self
            .exposed
            .iter()
            .find(|(_, r)| r.offset <= offset && end <= r.end())
            .ok_or(ServeError::NotExposed)?;
        Ok((*object, self.arena[offset as usize..end as usize].to_vec()))
    }
}
