//! How a TCP grant views the bytes it serves READs from: a pinned object whole, or a copy
//! still being received (a relay's) one READ's range at a time.
//!
//! A pinned object does not change while granted, so its grant claims the whole region for
//! reading up front and every READ is served from that claim. A partial copy is different:
//! READs into the same block are still landing, each holding a [`WritableRegion`] claim of its
//! slice (`post_read` on this fabric), so a read claim of the whole block would be refused,
//! and one held while slices are written would alias them. Its grant therefore holds the
//! arena only (no claim) and each READ it admits claims just its own range for reading, when
//! that range lies below the prefix the relay's core said is in, and only if no writable view
//! overlaps it; the claims table refuses the rest. The received prefix's slices are written
//! and their write claims released before the core hears of them, so a READ the core allowed
//! always finds its range free; a READ past the prefix is refused before it can claim bytes
//! a later slice will be written into (which would fail the relay's own READ).
//!
//! [`WritableRegion`]: crate::arena::WritableRegion

use std::sync::Arc;

use skyriver_core::LocalRegion;

use super::grants::GrantedBytes;
use crate::arena::{ReadableRegion, SharedArena};

/// A grant's view of its region.
#[derive(Debug)]
pub(super) enum GrantView {
    /// A pinned, sealed object: claimed for reading from the grant until the revocation is
    /// complete, and by every READ served from it until that READ's data is written.
    Whole(Arc<ReadableRegion>),
    /// A copy still being received: nothing claimed by the grant; each READ claims its range.
    Partial(PartialCopy),
}

/// The part of a partial copy a grant may serve.
#[derive(Debug)]
pub(super) struct PartialCopy {
    arena: Arc<SharedArena>,
    region: LocalRegion,
    /// Bytes from the region's start that are in (only grows).
    received_bytes: u64,
}

impl PartialCopy {
    /// `region` of `arena`, with nothing received yet as far as READs are concerned.
    pub(super) fn new(arena: Arc<SharedArena>, region: LocalRegion) -> Self {
        Self {
            arena,
            region,
            received_bytes: 0,
        }
    }
}

impl GrantedBytes for GrantView {
    type Served = Arc<ReadableRegion>;

    fn serve(&self, offset: u64, len: u64) -> Option<Arc<ReadableRegion>> {
        match self {
            GrantView::Whole(view) => Some(view.clone()),
            GrantView::Partial(copy) => {
                let end = offset.checked_add(len)?;
                let received_end = copy.region.offset.checked_add(copy.received_bytes)?;
                if offset < copy.region.offset || end > received_end {
                    return None;
                }
                // Refused while a READ into the range is still landing (its write claim).
                ReadableRegion::new(copy.arena.clone(), offset, len)
                    .ok()
                    .map(Arc::new)
            }
        }
    }

    fn received(&mut self, prefix: u64) {
        if let GrantView::Partial(copy) = self {
            copy.received_bytes = copy.received_bytes.max(prefix.min(copy.region.len));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::{ArenaOptions, WritableRegion};
    use skyriver_core::ArenaId;

    fn partial(arena: &Arc<SharedArena>) -> GrantView {
        let region = LocalRegion {
            arena: ArenaId(0),
            offset: 4096,
            len: 8192,
        };
        GrantView::Partial(PartialCopy::new(arena.clone(), region))
    }

    #[test]
    fn a_partial_copy_serves_only_its_received_prefix() {
        let arena =
            Arc::new(SharedArena::create("test", 1 << 16, &ArenaOptions::default()).unwrap());
        let mut view = partial(&arena);
        assert!(view.serve(4096, 1).is_none(), "nothing received yet");
        view.received(1024);
        let served = view.serve(4096 + 512, 512).expect("below the prefix");
        assert_eq!((served.offset(), served.len()), (4096 + 512, 512));
        assert!(view.serve(4096 + 512, 513).is_none(), "one byte past it");
        assert!(view.serve(4095, 2).is_none(), "before the region");
        view.received(512);
        assert!(view.serve(4096, 1024).is_some(), "the prefix never shrinks");
        view.received(u64::MAX);
        assert!(view.serve(4096, 8192).is_some(), "all of it, once in");
        assert!(
            view.serve(4096 + 8192, 1).is_none(),
            "never past the region"
        );
        assert!(view.serve(u64::MAX, 2).is_none(), "overflow");
    }

    #[test]
    fn a_partial_copy_refuses_a_range_being_written_and_holds_its_reads() {
        let arena =
            Arc::new(SharedArena::create("test", 1 << 16, &ArenaOptions::default()).unwrap());
        let mut view = partial(&arena);
        view.received(8192);
        // A READ into the copy still landing in its second half.
        let landing = WritableRegion::new(arena.clone(), 4096 + 4096, 4096).unwrap();
        assert!(
            view.serve(4096 + 4000, 200).is_none(),
            "overlaps the landing READ"
        );
        let served = view.serve(4096, 4096).expect("the first half is free");
        // The grant itself claims nothing: only the READ being served holds its range.
        assert!(WritableRegion::new(arena.clone(), 4096, 1).is_err());
        drop(served);
        drop(landing);
        assert!(WritableRegion::new(arena.clone(), 4096, 8192).is_ok());
    }
}
