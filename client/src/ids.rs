//! Object ids drawn from the operating system.
//!
//! A user-space generator (`rand`'s thread-local one) is copied into a `fork()`ed child with
//! its state, so parent and children would draw the same ids; drawing each id from the OS
//! (`getrandom(2)`) cannot repeat across processes.

use skyriver_core::{NodeId, ObjectId};

/// A new random object id, its 20 bytes drawn from the operating system: unique across
/// threads, processes and forks (with the odds of 160 random bits).
///
/// # Panics
///
/// When the OS has no randomness to give (`getrandom` fails), which on Linux only happens
/// before the kernel's generator is seeded at boot.
pub fn random_object_id() -> ObjectId {
    ObjectId(os_random())
}

/// A new object id that names `node`, the node it is made for ([`ObjectId::owned_by`]), with
/// 96 bits drawn from the operating system: a fetch of it elsewhere asks `node` first, with no
/// directory lookup. What clients use for a put that names no id
/// ([`crate::Client::new_object_id`]).
///
/// # Panics
///
/// As [`random_object_id`], when the OS has no randomness to give.
pub fn owned_object_id(node: NodeId) -> ObjectId {
    ObjectId::owned_by(node, os_random())
}

/// `N` bytes from the operating system (`getrandom(2)`); panics as the id functions say.
fn os_random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes)
        .unwrap_or_else(|error| panic!("the OS gave no random bytes for an object id: {error}"));
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_ids_name_their_node_and_do_not_repeat() {
        let ids: std::collections::BTreeSet<ObjectId> =
            (0..1000).map(|_| owned_object_id(NodeId(7))).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.owner() == Some(NodeId(7))));
    }
}
