//! All unsafe code of the project lives in this crate, each block with a `// SAFETY:` comment;
//! outside it, only the glue PyO3's buffer protocol demands in `python/`: the exporter's
//! `__getbuffer__`/`__releasebuffer__` (`buffers.rs`) and the consumer's hold on an export it
//! copies from (`source` in `client.rs`).
//!
//! Skyriver's IO: shared-memory arenas, fd passing and fabrics. Arena memory is viewed only
//! through claim-checked views ([`ReadableRegion`], [`WritableRegion`]), by clients, the
//! daemon and the fabrics alike, so safe code cannot alias it.

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
pub mod shared_copy;
mod sync;
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
