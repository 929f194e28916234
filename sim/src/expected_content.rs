//! The bytes of the contents checked last, generated once.
//!
//! Every check of a copy compares it with its content's bytes, a function of the id and the
//! variant ([`content_bytes`](crate::workload::content_bytes)). Generating them costs more than comparing, and a relay's
//! partial copy is checked slice by slice as it serves READs (each slice would generate the
//! whole prefix before it again), so the few contents used last are kept, whole. A whole
//! copy of a content no longer kept is compared by its digest (XXH3-64, several times faster
//! than generating the bytes), which is kept for every content checked; the bytes are generated
//! only to say where a copy that does not match differs.

use std::collections::{BTreeMap, HashMap};

use skyriver_core::ObjectId;

use twox_hash::XxHash3_64;

use crate::workload::content_bytes_into;

/// How many bytes of contents are kept (objects are at most an arena, 2 MiB; most are far
/// smaller): enough for the relays a 1,000-node cluster runs at once. A count of contents
/// was not: at 1,000 nodes 64 contents thrashed, and the checks generated gigabytes again.
const KEPT_BYTES: usize = 64 << 20;

/// A content: an object id and a variant.
type ContentKey = (ObjectId, u32);

/// The bytes of the contents used last, up to a budget of bytes, and the digests of all.
#[derive(Debug)]
pub struct ExpectedContents {
    budget_bytes: usize,
    /// Looked up only: which content leaves first is `by_use`'s to say.
    kept: HashMap<ContentKey, Kept>,
    /// The kept contents by their last use, least recent first.
    by_use: BTreeMap<u64, ContentKey>,
    uses: u64,
    /// Bytes the kept contents take (their buffers' capacities), all together.
    kept_bytes: usize,
    /// The digest of the first `len` bytes of content (id, variant), by (id, variant, len).
    digests: HashMap<(ObjectId, u32, usize), u64>,
}

#[derive(Debug)]
struct Kept {
    bytes: Vec<u8>,
    /// Its key in `by_use`.
    used: u64,
}

impl Default for ExpectedContents {
    fn default() -> Self {
        ExpectedContents::with_budget(KEPT_BYTES)
    }
}

impl ExpectedContents {
    /// Keeps up to `budget_bytes` of contents (and always the one used last).
    pub fn with_budget(budget_bytes: usize) -> Self {
        ExpectedContents {
            budget_bytes,
            kept: HashMap::new(),
            by_use: BTreeMap::new(),
            uses: 0,
            kept_bytes: 0,
            digests: HashMap::new(),
        }
    }

    /// The first `len` bytes of content `variant` of `id`, as [`content_bytes`](crate::workload::content_bytes) makes them.
    pub fn bytes(&mut self, id: &ObjectId, variant: u32, len: usize) -> &[u8] {
        let key = (*id, variant);
        self.uses += 1;
        let used = self.uses;
        let kept = self.kept.entry(key).or_insert_with(|| Kept {
            bytes: Vec::new(),
            used,
        });
        self.by_use.remove(&kept.used);
        kept.used = used;
        self.by_use.insert(used, key);
        if kept.bytes.len() < len {
            // A content's shorter bytes are a prefix of its longer ones.
            self.kept_bytes -= kept.bytes.capacity();
            content_bytes_into(id, variant, len, &mut kept.bytes);
            self.kept_bytes += kept.bytes.capacity();
        }
        while self.kept_bytes > self.budget_bytes && self.by_use.len() > 1 {
            let (_, oldest) = self.by_use.pop_first().expect("more than one kept");
            let gone = self.kept.remove(&oldest).expect("kept by use");
            self.kept_bytes -= gone.bytes.capacity();
        }
        &self.kept[&key].bytes[..len]
    }

    /// Whether the bytes of content `variant` of `id` are kept, `len` of them at least.
    fn keeps(&self, id: &ObjectId, variant: u32, len: usize) -> bool {
        self.kept
            .get(&(*id, variant))
            .is_some_and(|k| k.bytes.len() >= len)
    }

    /// Whether `bytes` are content `variant` of `id`; the first differing offset if not.
    pub fn check(&mut self, id: &ObjectId, variant: u32, bytes: &[u8]) -> Result<(), String> {
        let len = bytes.len();
        if !self.keeps(id, variant, len) {
            if let Some(&digest) = self.digests.get(&(*id, variant, len)) {
                if XxHash3_64::oneshot(bytes) == digest {
                    return Ok(());
                }
            }
        }
        let expected = self.bytes(id, variant, len);
        let digest = XxHash3_64::oneshot(expected);
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
    use crate::workload::content_bytes;

    #[test]
    fn kept_bytes_are_the_contents_whatever_the_order_of_use() {
        let budget = 1_500;
        let mut expected = ExpectedContents::with_budget(budget);
        // Short then longer then short again, over more contents than are kept.
        for round in 0..3 {
            for n in 0..10 {
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
        assert!(expected.kept_bytes <= budget);
        assert!(expected.kept.len() < 20, "every content kept");
    }

    #[test]
    fn contents_are_kept_by_their_bytes_not_their_count() {
        let mut expected = ExpectedContents::with_budget(100 * 64);
        // A hundred small contents (64 bytes each) fit the budget: none leaves.
        for n in 0..100 {
            expected.bytes(&ObjectId::from_u64(n), 0, 64);
        }
        assert!((0..100).all(|n| expected.keeps(&ObjectId::from_u64(n), 0, 64)));
        // A large one pushes out the least recently used.
        expected.bytes(&ObjectId::from_u64(0), 0, 64);
        expected.bytes(&ObjectId::from_u64(1_000), 0, 64 * 50);
        assert!(expected.keeps(&ObjectId::from_u64(0), 0, 64), "used last");
        assert!(
            !expected.keeps(&ObjectId::from_u64(1), 0, 64),
            "used least recently"
        );
        assert!(expected.kept_bytes <= 100 * 64);
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
        let mut expected = ExpectedContents::with_budget(1_000);
        let id = ObjectId::from_u64(3);
        let good = content_bytes(&id, 0, 1000);
        let mut bad = good.clone();
        bad[999] ^= 0x80;
        assert_eq!(expected.check(&id, 0, &good), Ok(()));
        // Push it out of the kept contents: its digest decides now.
        expected.bytes(&ObjectId::from_u64(100), 0, 1_000);
        assert!(!expected.keeps(&id, 0, 1));
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
