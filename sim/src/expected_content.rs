//! The bytes of the contents checked last, generated once.
//!
//! Every check of a copy compares it with its content's bytes, a function of the id and the
//! variant ([`content_bytes`]). Generating them costs more than comparing, and a relay's
//! partial copy is checked slice by slice as it serves READs (each slice would generate the
//! whole prefix before it again), so the few contents used last are kept, whole. A whole
//! copy of a content no longer kept is compared by its digest (XXH3-64, several times faster
//! than generating the bytes), which is kept for every content checked; the bytes are generated
//! only to say where a copy that does not match differs.

use std::collections::{HashMap, VecDeque};

use skyriver_core::ObjectId;

use xxhash_rust::xxh3::xxh3_64;

use crate::workload::content_bytes;

/// How many contents are kept (objects are at most an arena, 2 MiB; most are far smaller):
/// enough for the relays a 1,000-node cluster runs at once.
const KEPT: usize = 64;

/// The bytes of the last [`KEPT`] contents used, most recent first, and the digests of all.
#[derive(Debug, Default)]
pub struct ExpectedContents {
    kept: VecDeque<Kept>,
    /// The digest of the first `len` bytes of content (id, variant), by (id, variant, len).
    digests: HashMap<(ObjectId, u32, usize), u64>,
}

#[derive(Debug)]
struct Kept {
    id: ObjectId,
    variant: u32,
    bytes: Vec<u8>,
}

impl ExpectedContents {
    /// The first `len` bytes of content `variant` of `id`, as [`content_bytes`] makes them.
    pub fn bytes(&mut self, id: &ObjectId, variant: u32, len: usize) -> &[u8] {
        let found = self
            .kept
            .iter()
            .position(|k| k.id == *id && k.variant == variant);
        let mut kept = match found.and_then(|at| self.kept.remove(at)) {
            Some(kept) => kept,
            None => {
                if self.kept.len() == KEPT {
                    self.kept.pop_back();
                }
                Kept {
                    id: *id,
                    variant,
                    bytes: Vec::new(),
                }
            }
        };
        if kept.bytes.len() < len {
            // A content's shorter bytes are a prefix of its longer ones.
            kept.bytes = content_bytes(id, variant, len);
        }
        self.kept.push_front(kept);
        &self.kept[0].bytes[..len]
    }

    /// Whether `bytes` are content `variant` of `id`; the first differing offset if not.
    pub fn check(&mut self, id: &ObjectId, variant: u32, bytes: &[u8]) -> Result<(), String> {
        let len = bytes.len();
        let is_kept = |k: &Kept| k.id == *id && k.variant == variant && k.bytes.len() >= len;
        if !self.kept.iter().any(is_kept) {
            if let Some(&digest) = self.digests.get(&(*id, variant, len)) {
                if xxh3_64(bytes) == digest {
                    return Ok(());
                }
            }
        }
        let expected = self.bytes(id, variant, len);
        let digest = xxh3_64(expected);
        let outcome = first_difference(expected, bytes);
        self.digests.insert((*id, variant, len), digest);
        outcome
    }
}

/// `Ok` if `bytes` equal `expected` (of the same length), else where and how they differ.
pub fn first_difference(expected: &[u8], bytes: &[u8]) -> Result<(), String> {
    if expected == bytes {
        return Ok(());
    }
    let at = expected
        .iter()
        .zip(bytes)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(bytes.len()));
    Err(format!(
        "byte {at} of {} is {:#04x}, expected {:#04x}",
        bytes.len(),
        bytes.get(at).copied().unwrap_or(0),
        expected.get(at).copied().unwrap_or(0)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_bytes_are_the_contents_whatever_the_order_of_use() {
        let mut expected = ExpectedContents::default();
        // Short then longer then short again, over more contents than are kept.
        for round in 0..3 {
            for n in 0..(KEPT as u64 + 3) {
                let id = ObjectId::from_u64(n);
                for (variant, len) in [(0, 10 + round * 100), (1, 5), (0, 3)] {
                    assert_eq!(
                        expected.bytes(&id, variant, len),
                        &content_bytes(&id, variant, len)[..],
                        "object {n} variant {variant} length {len}"
                    );
                }
            }
        }
        assert!(expected.kept.len() <= KEPT);
    }

    #[test]
    fn a_check_names_the_first_differing_byte() {
        let mut expected = ExpectedContents::default();
        let id = ObjectId::from_u64(9);
        let mut bytes = content_bytes(&id, 0, 100);
        assert_eq!(expected.check(&id, 0, &bytes), Ok(()));
        assert!(expected.check(&id, 1, &bytes).is_err(), "another content");
        bytes[50] ^= 1;
        let why = expected.check(&id, 0, &bytes).unwrap_err();
        assert!(why.starts_with("byte 50 of 100 is "), "{why}");
    }

    #[test]
    fn copies_of_contents_no_longer_kept_are_checked_by_digest_alike() {
        let mut expected = ExpectedContents::default();
        let id = ObjectId::from_u64(3);
        let good = content_bytes(&id, 0, 1000);
        let mut bad = good.clone();
        bad[999] ^= 0x80;
        assert_eq!(expected.check(&id, 0, &good), Ok(()));
        // Push it out of the kept contents: its digest decides now.
        for n in 100..(100 + KEPT as u64) {
            expected.bytes(&ObjectId::from_u64(n), 0, 8);
        }
        assert!(!expected.kept.iter().any(|k| k.id == id));
        assert_eq!(expected.check(&id, 0, &good), Ok(()));
        let why = expected.check(&id, 0, &bad).unwrap_err();
        assert!(why.starts_with("byte 999 of 1000 is 0x"), "{why}");
        assert!(expected.check(&id, 1, &good).is_err(), "another content");
        assert!(
            expected.check(&id, 0, &good[..999]).is_ok(),
            "a prefix is its own content"
        );
    }
}
