//! Hashing fetched copies as their bytes come in: the core offers each completed prefix of a
//! rendezvous copy (`HashAhead`) while the rest is still being read, so the verification at
//! the end (`VerifyContent`) hashes only what came last.

use std::collections::BTreeMap;

use skyriver_core::digest::{ContentDigest, ContentHasher};
use skyriver_core::{LocalRegion, TransferId};
use skyriver_transport::ReadableRegion;

/// Most copies hashed ahead at once; a transfer that failed after hashing ahead leaves its
/// entry behind until then (the oldest goes first).
const MAX_COPIES: usize = 256;

/// A copy's bytes hashed so far: `[start, next)` of its arena.
struct Partial {
    region_start: u64,
    next: u64,
    arena: skyriver_core::ArenaId,
    hasher: ContentHasher,
}

/// The partial digests of copies being fetched, by transfer.
#[derive(Default)]
pub(super) struct CopyHashers {
    partial: BTreeMap<TransferId, Partial>,
}

impl CopyHashers {
    /// Hashes `bytes`, the part `region` of transfer's copy, if it continues what was hashed
    /// of it (or starts it); anything else starts over from this region, which the final
    /// verification then does not use unless the copy starts there.
    pub(super) fn hash_ahead(&mut self, transfer: TransferId, region: LocalRegion, bytes: &[u8]) {
        let continues = self
            .partial
            .get(&transfer)
            .is_some_and(|p| p.arena == region.arena && p.next == region.offset);
        if !continues {
            if self.partial.len() >= MAX_COPIES {
                self.partial.pop_first();
            }
            self.partial.insert(
                transfer,
                Partial {
                    region_start: region.offset,
                    next: region.offset,
                    arena: region.arena,
                    hasher: ContentHasher::new(),
                },
            );
        }
        let partial = self.partial.get_mut(&transfer).expect("inserted above");
        partial.hasher.update(bytes);
        partial.next = region.offset + region.len;
    }

    /// The digest of transfer's whole copy `region`, from what was hashed ahead and
    /// `rest(offset, len)`, the bytes of the copy not hashed yet.
    pub(super) fn finish(
        &mut self,
        transfer: TransferId,
        region: LocalRegion,
        rest: impl FnOnce(u64, u64) -> Option<ReadableRegion>,
    ) -> Option<ContentDigest> {
        let partial = self.partial.remove(&transfer).filter(|p| {
            p.arena == region.arena
                && p.region_start == region.offset
                && p.next <= region.offset + region.len
        });
        let (mut hasher, from) = match partial {
            Some(p) => (p.hasher, p.next),
            None => (ContentHasher::new(), region.offset),
        };
        let bytes = rest(from, region.offset + region.len - from)?;
        hasher.update(bytes.as_slice());
        Some(hasher.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::ArenaId;

    fn region(offset: u64, len: u64) -> LocalRegion {
        LocalRegion {
            arena: ArenaId(0),
            offset,
            len,
        }
    }

    #[test]
    fn hashing_ahead_in_order_gives_the_digest_of_the_whole_copy() {
        let arena = std::sync::Arc::new(
            skyriver_transport::SharedArena::create(
                "copy-hashers-test",
                64 << 10,
                &Default::default(),
            )
            .unwrap(),
        );
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 13 + i / 7) as u8).collect();
        // The copy lies at 1024.. in the arena.
        arena.write(1024, &bytes).unwrap();
        let view = |offset: u64, len: u64| ReadableRegion::new(arena.clone(), offset, len).ok();
        let mut hashers = CopyHashers::default();
        let t = TransferId(7);
        hashers.hash_ahead(t, region(1024, 3000), &bytes[..3000]);
        hashers.hash_ahead(t, region(4024, 2000), &bytes[3000..5000]);
        let mut asked = None;
        let digest = hashers.finish(t, region(1024, 10_000), |offset, len| {
            asked = Some((offset, len));
            view(offset, len)
        });
        assert_eq!(
            asked,
            Some((6024, 5000)),
            "only the rest is read at the end"
        );
        assert_eq!(digest, Some(ContentDigest::of_contiguous(&bytes)));
        // Without anything hashed ahead, the whole copy is read.
        let digest = hashers.finish(TransferId(8), region(1024, 10_000), view);
        assert_eq!(digest, Some(ContentDigest::of_contiguous(&bytes)));
    }

    #[test]
    fn a_gap_or_another_copy_starts_over() {
        let mut hashers = CopyHashers::default();
        let t = TransferId(1);
        hashers.hash_ahead(t, region(0, 100), &[1; 100]);
        // Not contiguous: starts over at 500, which is not where the copy starts.
        hashers.hash_ahead(t, region(500, 100), &[2; 100]);
        let mut asked = None;
        let _ = hashers.finish(t, region(0, 1000), |offset, len| {
            asked = Some((offset, len));
            None
        });
        assert_eq!(
            asked,
            Some((0, 1000)),
            "the whole copy is hashed at the end"
        );
        assert!(hashers.partial.is_empty());
    }

    #[test]
    fn entries_of_failed_transfers_are_bounded() {
        let mut hashers = CopyHashers::default();
        for t in 0..(MAX_COPIES as u64 + 10) {
            hashers.hash_ahead(TransferId(t), region(t * 10, 10), &[0; 10]);
        }
        assert_eq!(hashers.partial.len(), MAX_COPIES);
    }
}
