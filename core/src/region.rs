//! Regions: the core names memory by (arena, offset, length) and never touches it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::ArenaId;

/// A byte range inside one of this node's arenas.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LocalRegion {
    /// The arena.
    pub arena: ArenaId,
    /// Offset from the arena's start, in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl LocalRegion {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// The sub-range `[start, start + len)` relative to this region's start.
    ///
    /// The caller keeps `start + len <= self.len`; it is asserted because a violation is a bug.
    pub fn slice(&self, start: u64, len: u64) -> LocalRegion {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.len),
            "slice {start}+{len} outside {self}"
        );
        LocalRegion {
            arena: self.arena,
            offset: self.offset + start,
            len,
        }
    }
}

impl fmt::Display for LocalRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}..{}]", self.arena, self.offset, self.end())
    }
}

impl fmt::Debug for LocalRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A byte range another node exposed for one-sided READs: a virtual address (or offset, for
/// fabrics that use offsets), a length and the key that grants access.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// Address in the exposing node's registration (verbs: virtual address).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key of the registration.
    pub rkey: u32,
}

impl fmt::Display for RemoteRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}+{}/rkey={:#x}", self.addr, self.len, self.rkey)
    }
}

impl fmt::Debug for RemoteRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
