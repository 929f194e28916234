//! Object ids drawn from the operating system.
//!
//! A user-space generator (`rand`'s thread-local one) is copied into a `fork()`ed child with
//! its state, so parent and children would draw the same ids; drawing each id from the OS
//! (`getrandom(2)`) cannot repeat across processes.

use skyriver_core::ObjectId;

/// A new random object id, its 20 bytes drawn from the operating system: unique across
/// threads, processes and forks (with the odds of 160 random bits).
///
/// # Panics
///
/// When the OS has no randomness to give (`getrandom` fails), which on Linux only happens
/// before the kernel's generator is seeded at boot.
pub fn random_object_id() -> ObjectId {
    let mut bytes = [0u8; skyriver_core::ids::OBJECT_ID_LEN];
    getrandom::getrandom(&mut bytes)
        .unwrap_or_else(|error| panic!("the OS gave no random bytes for an object id: {error}"));
    ObjectId(bytes)
}
