//! What the fuzz targets share: seed corpora.
//!
//! Each target knows a few valid encodings of what it decodes. Run with
//! `SKYRIVER_FUZZ_SEEDS=DIR` (as `ci/fuzz.sh` does, DIR being the target's corpus), a target
//! writes them into DIR when it starts, before libFuzzer reads the corpus, so fuzzing starts
//! from valid messages.

use std::path::PathBuf;

/// The environment variable naming the directory to write seeds into.
pub const SEEDS_ENV: &str = "SKYRIVER_FUZZ_SEEDS";

/// Writes `seeds` as `seed-N` files into `$SKYRIVER_FUZZ_SEEDS`, if it is set.
pub fn write_seeds(seeds: impl IntoIterator<Item = Vec<u8>>) {
    let Some(dir) = std::env::var_os(SEEDS_ENV).map(PathBuf::from) else {
        return;
    };
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    for (i, seed) in seeds.into_iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i}")), seed).expect("write a seed");
    }
}

/// A length-prefixed frame (`u32` little endian, then the body), as the handshakes and the
/// built-in directory carry them.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}
