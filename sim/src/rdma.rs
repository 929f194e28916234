//! Simulated memory and one-sided READs. Each node has one arena of real bytes, registered under
//! a base address and rkey that change when the node restarts. A READ is served here, from the
//! holder's arena, without the holder's core — as a NIC (or the TCP fabric's thread) serves it —
//! and only through a key the holder's fabric granted for one lease: to that reader, within
//! that object's region, until the revocation took effect (as a verbs memory window). The
//! grants are the core's [`GrantTable`], the TCP fabric's own rules: a READ is admitted, serves
//! while its data is copied out, and a revocation that arrives meanwhile completes only when
//! the last READ under the key is done.

use std::borrow::Cow;
use std::collections::BTreeMap;

use memmap2::MmapMut;

use skyriver_core::grants::{AdmitError, Grant, GrantTable, Revocation};
use skyriver_core::node::ArenaKey;
use skyriver_core::{ArenaId, LocalRegion, NodeId, ObjectId, RemoteRegion, TransferId};

/// Byte written over fresh and lost memory, so reads of it are easy to spot.
pub const POISON: u8 = 0xA5;

/// Pages of an arena are poisoned when first written: an arena is an anonymous mapping of its
/// own, whose pages the system backs only when touched, so a cluster of many nodes costs the
/// memory its objects use, not every node's whole arena. (A zeroed heap allocation does not
/// promise that: once the allocator's mmap threshold has risen, it serves an arena from its
/// heap and clears every byte, as glibc did for 1,000 arenas of 1.6 MiB, 1.6 GB.)
const PAGE_BYTES: usize = 4096;

/// One node incarnation's memory.
#[derive(Debug)]
pub struct Memory {
    /// The bytes; a page not yet written reads as [`POISON`] whatever it holds.
    arena: MmapMut,
    /// Which pages were written (and poisoned first where not written).
    written: Vec<bool>,
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
            arena: MmapMut::map_anon(bytes as usize)
                .unwrap_or_else(|error| panic!("cannot map an arena of {bytes} bytes: {error}")),
            written: vec![false; (bytes as usize).div_ceil(PAGE_BYTES)],
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
    /// Where the arena's bytes are in this process (to see which of its pages are resident).
    pub fn address(&self) -> usize {
        self.arena.as_ptr() as usize
    }

    /// The arena's length in bytes.
    pub fn len(&self) -> usize {
        self.arena.len()
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.arena.is_empty()
    }

    /// The registration of arena 0.
    pub fn key(&self) -> ArenaKey {
        self.key
    }

    /// Region keys for the node's configuration.
    pub fn region_keys(&self) -> BTreeMap<ArenaId, ArenaKey> {
        BTreeMap::from([(ArenaId(0), self.key)])
    }

    /// The bytes of a local region (poison where never written).
    pub fn read(&self, region: LocalRegion) -> Cow<'_, [u8]> {
        assert_eq!(
            region.arena,
            ArenaId(0),
            "the simulator has one arena per node"
        );
        let range = region.offset as usize..region.end() as usize;
        let bytes = &self.arena[range.clone()];
        if self.pages(range.clone()).all(|page| self.written[page]) {
            return Cow::Borrowed(bytes);
        }
        let mut owned = bytes.to_vec();
        for page in self.pages(range.clone()) {
            if !self.written[page] {
                let start = (page * PAGE_BYTES).max(range.start) - range.start;
                let end = ((page + 1) * PAGE_BYTES).min(range.end) - range.start;
                owned[start..end].fill(POISON);
            }
        }
        Cow::Owned(owned)
    }

    /// The pages a byte range touches.
    fn pages(&self, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
        if range.is_empty() {
            return 0..0;
        }
        range.start / PAGE_BYTES..(range.end - 1) / PAGE_BYTES + 1
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
        let range = region.offset as usize..region.end() as usize;
        for page in self.pages(range.clone()) {
            if !self.written[page] {
                let end = ((page + 1) * PAGE_BYTES).min(self.arena.len());
                self.arena[page * PAGE_BYTES..end].fill(POISON);
                self.written[page] = true;
            }
        }
        self.arena[range].copy_from_slice(bytes);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn region(offset: u64, len: u64) -> LocalRegion {
        LocalRegion {
            arena: ArenaId(0),
            offset,
            len,
        }
    }

    fn memory() -> Memory {
        let key = ArenaKey {
            base_addr: 0x1000,
            rkey: 7,
        };
        Memory::new(3 * PAGE_BYTES as u64 + 100, key)
    }

    #[test]
    fn fresh_memory_reads_as_poison_in_every_page() {
        let m = memory();
        let all = m.read(region(0, m.arena.len() as u64));
        assert!(all.iter().all(|&b| b == POISON));
    }

    #[test]
    fn a_write_keeps_the_rest_of_its_pages_poisoned() {
        let mut m = memory();
        // Across the first page boundary, into the second page only partly.
        let at = PAGE_BYTES as u64 - 10;
        m.write(region(at, 20), &[1; 20]);
        let around = m.read(region(0, 2 * PAGE_BYTES as u64 + 50));
        for (i, &b) in around.iter().enumerate() {
            let written = (at as usize..at as usize + 20).contains(&i);
            assert_eq!(b, if written { 1 } else { POISON }, "byte {i}");
        }
        // The written pages now read without a copy; the last, short page still poison.
        assert!(matches!(m.read(region(at, 20)), Cow::Borrowed(_)));
        let tail = m.read(region(3 * PAGE_BYTES as u64, 100));
        assert!(tail.iter().all(|&b| b == POISON));
        assert!(m.read(region(5, 0)).is_empty());
    }
}
