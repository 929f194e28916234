//! The bytes of the contents checked last, generated once.
//!
//! Every check of a copy compares it with its content's bytes, a function of the id and the
//! variant ([`content_bytes`]). Generating them costs more than comparing, and a relay's
//! partial copy is checked slice by slice as it serves READs (each slice would generate the
//! whole prefix before it again), so the few contents used last are kept, whole.

use std::collections::VecDeque;

use skyriver_core::ObjectId;

use crate::workload::content_bytes;

/// How many contents are kept (objects are at most an arena, a few MiB).
const KEPT: usize = 16;

/// The bytes of the last [`KEPT`] contents used, most recent first.
#[derive(Debug, Default)]
pub struct ExpectedContents {
    kept: VecDeque<Kept>,
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
        first_difference(self.bytes(id, variant, bytes.len()), bytes)
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
}
