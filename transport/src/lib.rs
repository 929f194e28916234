//! Skyriver's IO: shared-memory arenas, fd passing and fabrics. All unsafe code of the
//! project lives in this crate, each block with a `// SAFETY:` comment.

pub mod arena;
pub mod directory;
pub mod fabric;
pub mod fd_passing;
pub mod persist;
pub mod process;
pub mod shared_copy;
pub mod token;
pub mod trace;
pub mod verbs;

pub use arena::{
    ArenaError, ArenaOptions, ArenaStage, ReadableRegion, SharedArena, ViewError, WritableRegion,
    ARENA_STEP_BYTES,
};
