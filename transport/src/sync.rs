//! The synchronisation primitives of the cross-thread structures that are model-checked with
//! loom (the arena's claims, the TCP grants, the verbs poller's hand-off and window pool):
//! std's, or loom's in a model build.
//!
//! A model build sets a cfg of this crate's own, `skyriver_loom`, not the customary `loom`:
//! `RUSTFLAGS='--cfg loom'` applies to every crate of the build, and tokio (a dependency) then
//! switches to its own loom internals, which do not build outside tokio's test setup. Models
//! run with
//!
//! ```text
//! RUSTFLAGS='--cfg skyriver_loom' LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
//!     cargo test -p skyriver-transport --release --lib loom
//! ```

#[cfg(skyriver_loom)]
#[cfg_attr(not(feature = "node"), allow(unused_imports))] // the verbs poller's
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(skyriver_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(skyriver_loom))]
#[cfg_attr(not(feature = "node"), allow(unused_imports))] // the verbs poller's
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(skyriver_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`. The structures guarded here stay consistent between statements, so a
/// panic elsewhere (poisoning, which loom's mutex does not model) does not corrupt them.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
