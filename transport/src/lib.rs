//! Skyriver's IO: shared-memory arenas, fd passing and fabrics. All unsafe code of the
//! project lives in this crate, each block with a `// SAFETY:` comment.

pub mod arena;
#[cfg(feature = "node")]
pub mod directory;
#[cfg(feature = "node")]
pub mod fabric;
pub mod fd_passing;
#[cfg(feature = "node")]
pub mod persist;
pub mod poll;
pub mod process;
#[cfg(feature = "node")]
pub mod token;
#[cfg(feature = "node")]
pub mod trace;
#[cfg(feature = "node")]
pub mod verbs;

pub use arena::{
    ArenaError, ArenaOptions, ArenaStage, ReadableRegion, SharedArena, ViewError, WritableRegion,
    ARENA_STEP_BYTES,
};
