//! The content digest that makes one object id name one content across the cluster.
//!
//! Every sealed object carries the 64-bit XXH3 hash of its data followed by its metadata. A node
//! publishes it with the object's sizes, the directory refuses a publication of an id whose
//! holders published another digest, and a fetched copy is sealed only once its bytes hash to
//! the digest the directory (and the holder) named. XXH3 is not a cryptographic hash: it
//! catches damaged transfers and accidental reuse of an id, not a forger who controls a node
//! (nodes prove the cluster token before they are trusted at all).

use std::fmt;

use serde::{Deserialize, Serialize};
use std::hash::Hasher;

use twox_hash::XxHash3_64;

/// XXH3-64 of an object's data followed by its metadata.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ContentDigest(pub u64);

impl ContentDigest {
    /// The digest of an object with these data and metadata bytes.
    pub fn of(data: &[u8], metadata: &[u8]) -> Self {
        let mut hasher = ContentHasher::new();
        hasher.update(data);
        hasher.update(metadata);
        hasher.finish()
    }

    /// The digest of an object stored contiguously (data then metadata), as in an arena.
    pub fn of_contiguous(bytes: &[u8]) -> Self {
        Self(XxHash3_64::oneshot(bytes))
    }
}

impl fmt::Display for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentDigest({self})")
    }
}

/// A [`ContentDigest`] computed piece by piece (a copy that hashes as it goes, an object read
/// in slices): the same value as hashing all pieces at once.
#[derive(Clone)]
pub struct ContentHasher(XxHash3_64);

impl ContentHasher {
    /// An empty hasher.
    pub fn new() -> Self {
        Self(XxHash3_64::new())
    }

    /// Adds the next bytes of the object.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    /// The digest of everything added.
    pub fn finish(&self) -> ContentDigest {
        ContentDigest(self.0.finish())
    }
}

impl Default for ContentHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ContentHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ContentHasher")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_hash_like_the_whole() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = ContentDigest::of_contiguous(&bytes);
        for split in [0, 1, 63, 64, 4096, 9_999, 10_000] {
            assert_eq!(ContentDigest::of(&bytes[..split], &bytes[split..]), whole);
        }
        let mut hasher = ContentHasher::new();
        for piece in bytes.chunks(333) {
            hasher.update(piece);
        }
        assert_eq!(hasher.finish(), whole);
    }

    /// Digests are published, compared across nodes and written to disk with spilled and
    /// persistent objects: they must stay XXH3-64 (seed 0), whatever implementation computes
    /// them. Reference values from another implementation (xxhash-rust 0.8), one per input
    /// size class of XXH3 and the streaming path.
    #[test]
    fn the_digest_is_xxh3_64_of_the_bytes() {
        let reference: [(u32, u64); 12] = [
            (0, 0x2d06800538d394c2),
            (1, 0xc44bdff4074eecdb),
            (3, 0xc3489259e968ad9e),
            (16, 0x907976bb290db9e8),
            (17, 0xac1710d495aa0dbd),
            (128, 0xe872377f5593aa83),
            (129, 0x9b55151daa76e2cf),
            (240, 0x28067121726fa14e),
            (241, 0x26e9e1d1ee797db1),
            (1024, 0x26898b5f48a4fda8),
            (100_000, 0x8213a83b26c3fc20),
            (1 << 20, 0xdb5c8c82512e2f36),
        ];
        for (len, expected) in reference {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 13) as u8).collect();
            assert_eq!(
                ContentDigest::of_contiguous(&bytes).0,
                expected,
                "{len} bytes"
            );
            let mut hasher = ContentHasher::new();
            for piece in bytes.chunks(333) {
                hasher.update(piece);
            }
            assert_eq!(hasher.finish().0, expected, "{len} bytes in pieces");
        }
    }

    #[test]
    fn other_bytes_give_another_digest() {
        let a = ContentDigest::of(b"AAAA", b"");
        assert_ne!(a, ContentDigest::of(b"BBBB", b""));
        // The split between data and metadata is in the sizes, published beside the digest.
        assert_eq!(a, ContentDigest::of(b"AAA", b"A"));
        assert_eq!(a.to_string().len(), 16);
    }
}
