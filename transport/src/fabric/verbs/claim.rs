//! What a READ lease holds on the bytes peers READ through it, for as long as they may.
//!
//! **A sealed object** ([`Fabric::grant_read`](crate::fabric::Fabric::grant_read)) is claimed
//! for reading: nothing in this process writes the bytes a peer may READ.
//!
//! **A relay's copy still being received**
//! ([`Fabric::grant_partial_read`](crate::fabric::Fabric::grant_partial_read), the core's
//! `relay`) is not claimed at all, and that is safe:
//! - Its bytes are written by this node's own READs as they land, each claimed by a
//!   `WritableRegion` over its range until its completion; a readable claim over the block
//!   would refuse them, and they must go on while peers READ the prefix already in.
//! - A peer's READ is served by the NIC as a DMA read of the block: it forms no reference in
//!   this process and writes nothing, so it may overlap a READ still landing, or the daemon
//!   hashing a landed range, without harm to either.
//! - One-sided READs cannot be checked one by one, so what a reader may take is bounded by
//!   the memory window, bound over exactly the copy's block: the worst a reader can get is
//!   bytes of this object not landed yet, never another object's. Its core READs only below
//!   the prefix the relay announced (the core's `post_reads` stops at the last
//!   `RelayProgress`, which a relay sends only for READs completed, so landed); a reader that
//!   READs further (a bug, a hostile peer) gets bytes that fail the object's digest, which
//!   every reader checks before sealing. (Without memory windows any connected peer may READ
//!   any arena byte anyway; the grant is bookkeeping.)
//! - The block is neither freed nor re-used while a window over it is bound: the relay's core
//!   keeps its unsealed copy (even a failed one) until every lease over it is answered by
//!   `ReadRevoked`, which the fabric emits only once every window is invalidated (or freed
//!   with its connection, so no READ reaches it). Once the copy is sealed, the core pins it for the
//!   lease like any holder's copy and nothing writes it any more.

use crate::arena::ReadableRegion;

/// The claim a READ lease holds on its region while a peer may READ it (see the module
/// documentation).
pub(super) enum LeaseClaim {
    /// A sealed object's bytes, claimed for reading until the lease's access is gone (the
    /// view is held for its claim, never read).
    Sealed { _view: ReadableRegion },
    /// A relay's copy still being received: no claim, its own READs land in it.
    Receiving,
}
