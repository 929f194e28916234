//! Object contents and the random workload's choices.
//!
//! Every object's bytes are a function of its id and a variant (0 for every object but those
//! the workload puts again under a known id with other bytes), so any copy anywhere can be
//! checked against the few contents put under its id without remembering what was written.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use skyriver_core::{ObjectId, ObjectSizes};

use crate::trace::Fnv;

/// The bytes object `id` holds (data then metadata), `len` of them, as first put.
pub fn expected_bytes(id: &ObjectId, len: usize) -> Vec<u8> {
    content_bytes(id, 0, len)
}

/// The bytes of content `variant` of object `id` (data then metadata), `len` of them: variant
/// 0 is the id's usual content, any other is another content put under the same id.
pub fn content_bytes(id: &ObjectId, variant: u32, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    content_bytes_into(id, variant, len, &mut out);
    out
}

/// [`content_bytes`] into `out` (whose earlier bytes it replaces), reusing its allocation.
pub fn content_bytes_into(id: &ObjectId, variant: u32, len: usize, out: &mut Vec<u8>) {
    let mut hash = Fnv::default();
    hash.write(id.as_bytes());
    if variant != 0 {
        hash.write(&variant.to_le_bytes());
    }
    let mut state = hash.finish() | 1;
    out.clear();
    out.reserve(len);
    // Whole words at a time (every content check regenerates what it compares against, so
    // this is on the simulator's hot path); the last word is cut to what is left. Appended,
    // not written over zeros first: a debug build fills a resized vector byte by byte.
    for _ in 0..len / 8 {
        out.extend_from_slice(&next_content_word(&mut state));
    }
    let rest = len % 8;
    if rest != 0 {
        out.extend_from_slice(&next_content_word(&mut state)[..rest]);
    }
}

/// The next eight bytes of a content stream (xorshift64*).
fn next_content_word(state: &mut u64) -> [u8; 8] {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes()
}

/// Whether `bytes` are content `variant` of object `id`; the first differing offset if not.
pub fn check_bytes(id: &ObjectId, variant: u32, bytes: &[u8]) -> Result<(), String> {
    crate::expected_content::first_difference(&content_bytes(id, variant, bytes.len()), bytes)
}

/// One thing a client does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    /// Create, write and seal a new object.
    Put {
        /// Its sizes.
        sizes: ObjectSizes,
    },
    /// Put a known id again with other bytes (same sizes): one id named for two contents,
    /// which the cluster must refuse while the first is held.
    Reuse,
    /// Local get of known objects.
    Get {
        /// How many ids.
        count: usize,
        /// Timeout in µs.
        timeout_us: u64,
    },
    /// Fetch from the cluster.
    Fetch {
        /// How many ids.
        count: usize,
        /// Timeout in µs.
        timeout_us: u64,
    },
    /// Delete a known object here.
    Delete,
    /// Evict some bytes.
    Evict {
        /// Bytes.
        bytes: u64,
    },
    /// Ask the node something: stats, list, contains, locate or nodes (`which` mod 5).
    Inspect {
        /// Which question.
        which: u32,
    },
    /// Break the protocol; the node must refuse it and stay consistent.
    Misuse(Misuse),
    /// Create and hold a large object for a while (memory pressure).
    Hog {
        /// Sizes.
        sizes: ObjectSizes,
        /// How long it is held, µs.
        hold_us: u64,
    },
}

/// Ways a client breaks the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misuse {
    /// Seal an id nobody created.
    SealUnknown,
    /// Seal an object another client created and sealed.
    SealOthers,
    /// Abort an object that is already sealed.
    AbortOthers,
    /// Release a reference it does not hold.
    ReleaseUnheld,
    /// Create an object larger than any arena.
    CreateHuge,
    /// Create an id that is already in the store.
    CreateExisting,
    /// Put (inline) an id that is already in the store.
    PutExisting,
    /// Put more bytes inline than a request may carry.
    PutOversized,
    /// Say `Hello` twice.
    SecondHello,
    /// More ids in one request than the protocol allows.
    TooManyIds,
    /// A new connection whose first request is not `Hello`.
    NoHello,
    /// A new connection that says `Hello` with another protocol version.
    WrongVersion,
}

impl Misuse {
    /// Every misuse.
    pub const ALL: [Misuse; 12] = [
        Misuse::SealUnknown,
        Misuse::SealOthers,
        Misuse::AbortOthers,
        Misuse::ReleaseUnheld,
        Misuse::CreateHuge,
        Misuse::CreateExisting,
        Misuse::PutExisting,
        Misuse::PutOversized,
        Misuse::SecondHello,
        Misuse::TooManyIds,
        Misuse::NoHello,
        Misuse::WrongVersion,
    ];
}

/// Draws an object size: tiny, eager-sized, or large.
pub fn draw_sizes(rng: &mut ChaCha8Rng, eager_capacity: u64, arena_bytes: u64) -> ObjectSizes {
    let total = match rng.gen_range(0..10) {
        0..=3 => rng.gen_range(0..=256),
        4..=6 => rng.gen_range(0..=eager_capacity.max(1) * 2),
        _ => rng.gen_range(1..=(arena_bytes / 6).max(2)),
    };
    let metadata_size = rng.gen_range(0..=total.min(64));
    ObjectSizes {
        data_size: total - metadata_size,
        metadata_size,
    }
}

/// Draws a client's next operation.
pub fn draw_op(
    rng: &mut ChaCha8Rng,
    eager_capacity: u64,
    arena_bytes: u64,
    fetch_timeout_us: u64,
) -> ClientOp {
    match rng.gen_range(0..100) {
        0..=24 => ClientOp::Put {
            sizes: draw_sizes(rng, eager_capacity, arena_bytes),
        },
        25..=27 => ClientOp::Reuse,
        28..=37 => ClientOp::Get {
            count: rng.gen_range(1..=3),
            timeout_us: rng.gen_range(0..=500),
        },
        38..=74 => ClientOp::Fetch {
            count: rng.gen_range(1..=3),
            timeout_us: rng.gen_range(fetch_timeout_us / 4..=fetch_timeout_us),
        },
        75..=83 => ClientOp::Delete,
        84..=89 => ClientOp::Evict {
            bytes: rng.gen_range(1..=arena_bytes / 4),
        },
        90..=93 => ClientOp::Inspect {
            which: rng.gen_range(0..5),
        },
        94..=95 => ClientOp::Misuse(Misuse::ALL[rng.gen_range(0..Misuse::ALL.len())]),
        _ => ClientOp::Hog {
            sizes: ObjectSizes {
                data_size: rng.gen_range(arena_bytes / 8..=arena_bytes / 3),
                metadata_size: 0,
            },
            hold_us: rng.gen_range(100..=3_000),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_depend_on_the_id_and_check() {
        let a = expected_bytes(&ObjectId::from_u64(1), 100);
        let b = expected_bytes(&ObjectId::from_u64(2), 100);
        assert_ne!(a, b);
        assert_eq!(&expected_bytes(&ObjectId::from_u64(1), 37)[..], &a[..37]);
        assert!(check_bytes(&ObjectId::from_u64(1), 0, &a).is_ok());
        let mut bad = a.clone();
        bad[50] ^= 1;
        assert!(check_bytes(&ObjectId::from_u64(1), 0, &bad)
            .unwrap_err()
            .starts_with("byte 50"));
        let other = content_bytes(&ObjectId::from_u64(1), 1, 100);
        assert_ne!(other, a, "another content under the same id");
        assert!(check_bytes(&ObjectId::from_u64(1), 1, &other).is_ok());
    }

    /// The bytes as first defined (eight at a time through a growing vector): contents are
    /// part of every trace (their digests), so generating them faster must not change them.
    fn content_bytes_as_first_defined(id: &ObjectId, variant: u32, len: usize) -> Vec<u8> {
        let mut hash = Fnv::default();
        hash.write(id.as_bytes());
        if variant != 0 {
            hash.write(&variant.to_le_bytes());
        }
        let mut state = hash.finish() | 1;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let word = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            let take = (len - out.len()).min(8);
            out.extend_from_slice(&word[..take]);
        }
        out
    }

    #[test]
    fn contents_are_those_first_defined() {
        for n in [0, 1, 77, u64::MAX] {
            for variant in [0, 1, 3] {
                for len in [0, 1, 7, 8, 9, 64, 1000, 4099] {
                    let id = ObjectId::from_u64(n);
                    assert_eq!(
                        content_bytes(&id, variant, len),
                        content_bytes_as_first_defined(&id, variant, len),
                        "object {n} variant {variant} length {len}"
                    );
                }
            }
        }
    }
}
