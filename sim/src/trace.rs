//! The trace of a run: readable lines with relative virtual time, and a hash of all of them.
//!
//! The hash covers every line whether or not lines are kept, so two runs of one seed can be
//! compared cheaply (the determinism check) and a sweep need not keep megabytes of text.
//! Every event writes a line or more, so recording one is on the simulator's hot path: a line
//! is hashed whole ([`LinesHash`]) and its object ids are found by searching for their zeros.

use std::fmt::{self, Write as _};

use skyriver_core::Instant;

/// FNV-1a, 64-bit: tiny, stable across platforms and releases (unlike `DefaultHasher`). It
/// makes objects' contents and CI's extra seeds; the trace is hashed with [`LinesHash`].
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Mixes bytes in.
    pub fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= *byte as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash of a sequence of lines: each line is hashed whole by XXH3-64 (a specified
/// algorithm, the same on every platform) seeded with the hash of the lines before it.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinesHash(u64);

impl LinesHash {
    /// Mixes one line in.
    pub fn line(&mut self, line: &str) {
        self.0 = twox_hash::XxHash3_64::oneshot_with_seed(self.0, line.as_bytes());
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// Lines of one run.
#[derive(Debug, Default)]
pub struct Trace {
    keep: bool,
    echo: bool,
    lines: Vec<String>,
    hash: LinesHash,
    count: u64,
    /// The line being built, reused while lines are not kept.
    scratch: String,
    /// The text of a line given as format arguments, before its ids are shortened.
    text_scratch: String,
}

impl Trace {
    /// A trace that keeps its lines (`keep`) and prints them as they come (`echo`).
    pub fn new(keep: bool, echo: bool) -> Self {
        Trace {
            keep,
            echo,
            ..Trace::default()
        }
    }

    /// Whether lines are wanted at all (kept or echoed); the hash is computed regardless.
    pub fn wants_text(&self) -> bool {
        self.keep || self.echo
    }

    /// Records one line at `now`.
    pub fn record(&mut self, now: Instant, text: &str) {
        let mut line = std::mem::take(&mut self.scratch);
        line.clear();
        let nanos = now.as_nanos();
        let _ = write!(line, "{:>6}.{:03}us ", nanos / 1000, nanos % 1000);
        shorten_ids_into(text, &mut line);
        self.hash.line(&line);
        self.count += 1;
        if self.echo {
            println!("{line}");
        }
        if self.keep {
            self.lines.push(line);
        } else {
            self.scratch = line;
        }
    }

    /// Records one line at `now`, formatted from `text` into a buffer kept from line to line.
    pub fn record_args(&mut self, now: Instant, text: fmt::Arguments<'_>) {
        let mut buffer = std::mem::take(&mut self.text_scratch);
        buffer.clear();
        let _ = buffer.write_fmt(text);
        self.record(now, &buffer);
        self.text_scratch = buffer;
    }

    /// The kept lines, joined.
    pub fn text(&self) -> String {
        let mut text = self.lines.join("\n");
        text.push('\n');
        text
    }

    /// Hash of every line recorded.
    pub fn hash(&self) -> u64 {
        self.hash.finish()
    }

    /// Lines recorded.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Replaces each 40-hex-digit object id made by `ObjectId::from_u64` (24 leading zeros) with
/// `obj#N`, so traces stay readable.
pub fn shorten_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    shorten_ids_into(text, &mut out);
    out
}

/// The zeros an id made by `ObjectId::from_u64` starts with.
const ID_ZEROS: &str = "000000000000000000000000";

/// [`shorten_ids`] appending to `out`. An id is a run of exactly 40 hex digits whose first 24
/// are zeros: it searches for those zeros ([`find_zeros`]) and looks at the run of
/// digits around them only there, copying everything else as whole slices. Every trace line
/// passes through here, hashed even when no line is kept, so this is on the simulator's hot path.
pub fn shorten_ids_into(text: &str, out: &mut String) {
    let bytes = text.as_bytes();
    let mut copied = 0;
    let mut from = 0;
    while let Some(zeros) = find_zeros(bytes, from) {
        // The run of hex digits the zeros are in. The search starts at the end of a run (or the
        // text's start), so the first zeros of a run starting with 24 zeros are its first digits.
        let mut start = zeros;
        while start > from && bytes[start - 1].is_ascii_hexdigit() {
            start -= 1;
        }
        let mut end = zeros + ID_ZEROS.len();
        while end < bytes.len() && bytes[end].is_ascii_hexdigit() {
            end += 1;
        }
        if start == zeros && end - start == 40 {
            // Hex digits are ASCII, so both slices are on char boundaries.
            out.push_str(&text[copied..start]);
            let n = u64::from_str_radix(&text[start + 24..end], 16).unwrap_or(0);
            let _ = write!(out, "obj#{n}");
            copied = end;
        }
        from = end;
    }
    out.push_str(&text[copied..]);
}

/// Where the first run of [`ID_ZEROS`] at or after `from` in `bytes` starts (what
/// `str::find` says, without building a searcher for every line). It looks at the last byte a
/// run starting at `start` would cover and back: a byte that is not `'0'` rules out every start
/// up to it, so text without long runs of zeros is skipped a run's length at a time.
fn find_zeros(bytes: &[u8], from: usize) -> Option<usize> {
    let run = ID_ZEROS.len();
    let mut start = from;
    'starts: while start + run <= bytes.len() {
        for k in (0..run).rev() {
            if bytes[start + k] != b'0' {
                start += k + 1;
                continue 'starts;
            }
        }
        return Some(start);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::ObjectId;

    #[test]
    fn runs_of_zeros_are_found_where_str_find_finds_them() {
        let texts = [
            String::new(),
            "0".repeat(23),
            "0".repeat(24),
            format!("a{}b", "0".repeat(30)),
            format!("{}x{}", "0".repeat(23), "0".repeat(25)),
            format!("1{}0{}", "0".repeat(22), "0".repeat(40)),
            "12".repeat(50),
        ];
        for text in &texts {
            for from in 0..=text.len() {
                assert_eq!(
                    find_zeros(text.as_bytes(), from),
                    text[from..].find(ID_ZEROS).map(|at| from + at),
                    "{text:?} from {from}"
                );
            }
        }
    }

    #[test]
    fn object_ids_are_shortened() {
        let text = format!(
            "get {} and {}",
            ObjectId::from_u64(42),
            ObjectId::from_u64(u64::MAX)
        );
        assert_eq!(
            shorten_ids(&text),
            format!("get obj#42 and obj#{}", u64::MAX)
        );
        let foreign = "ff".repeat(20);
        assert_eq!(shorten_ids(&foreign), foreign);
        // Runs of 39 or 41 digits are not ids; an id may end the text or sit in punctuation.
        let short = format!("x{}y", "0".repeat(39));
        assert_eq!(shorten_ids(&short), short);
        let long = "0".repeat(41);
        assert_eq!(shorten_ids(&long), long);
        let id = ObjectId::from_u64(7);
        assert_eq!(shorten_ids(&format!("[{id}],{id}")), "[obj#7],obj#7");
        assert_eq!(shorten_ids("héllo — ∑"), "héllo — ∑");
    }

    /// Shortening as first written: run by run of hex digits, byte by byte.
    fn shorten_ids_run_by_run(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = String::new();
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            if !bytes[i].is_ascii_hexdigit() {
                i += 1;
                continue;
            }
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_hexdigit() {
                i += 1;
            }
            if i - start == 40 && bytes[start..start + 24].iter().all(|&b| b == b'0') {
                out.push_str(&text[copied..start]);
                let n = u64::from_str_radix(&text[start + 24..i], 16).unwrap_or(0);
                let _ = write!(out, "obj#{n}");
                copied = i;
            }
        }
        out.push_str(&text[copied..]);
        out
    }

    #[test]
    fn shortening_finds_what_a_walk_over_every_run_finds() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(29);
        let id = ObjectId::from_u64(0xabc).to_string();
        // Ids, zeros and digits next to them, other text: runs of every length around 40.
        let pieces = [
            id.as_str(),
            "0",
            "00000000",
            "f",
            "1a",
            " ",
            "x",
            "é",
            "#",
            "\n",
        ];
        for _ in 0..5_000 {
            let mut text = String::new();
            for _ in 0..rng.gen_range(0..12) {
                text.push_str(pieces[rng.gen_range(0..pieces.len())]);
            }
            assert_eq!(
                shorten_ids(&text),
                shorten_ids_run_by_run(&text),
                "{text:?}"
            );
        }
        let zeros = "0".repeat(24);
        for text in [
            format!("{zeros}{}", "1".repeat(16)),
            format!("a{zeros}{}", "1".repeat(15)),
            format!("{zeros}{zeros} {id}"),
            format!("{}{id}", "0".repeat(24)),
        ] {
            assert_eq!(
                shorten_ids(&text),
                shorten_ids_run_by_run(&text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_lines_hash_depends_on_every_line_and_their_order() {
        let hash = |lines: &[&str]| {
            let mut hash = LinesHash::default();
            for line in lines {
                hash.line(line);
            }
            hash.finish()
        };
        let ab = hash(&["a", "b"]);
        assert_eq!(ab, hash(&["a", "b"]));
        assert_ne!(ab, hash(&["b", "a"]));
        assert_ne!(ab, hash(&["ab"]));
        assert_ne!(ab, hash(&["a", "b", ""]));
        assert_ne!(ab, hash(&["a", "c"]));
    }
}
