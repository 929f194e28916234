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
use xxhash_rust::xxh3::Xxh3Default;

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
        Self(xxhash_rust::xxh3::xxh3_64(bytes))
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
pub struct ContentHasher(Xxh3Default);

impl ContentHasher {
    /// An empty hasher.
    pub fn new() -> Self {
        Self(Xxh3Default::new())
    }

    /// Adds the next bytes of the object.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything added.
    pub fn finish(&self) -> ContentDigest {
        ContentDigest(self.0.digest())
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

    #[test]
    fn other_bytes_give_another_digest() {
        let a = ContentDigest::of(b"AAAA", b"");
        assert_ne!(a, ContentDigest::of(b"BBBB", b""));
        // The split between data and metadata is in the sizes, published beside the digest.
        assert_eq!(a, ContentDigest::of(b"AAA", b"A"));
        assert_eq!(a.to_string().len(), 16);
    }
}
