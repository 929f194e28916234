//! The trace of a run: readable lines with relative virtual time, and a hash of all of them.
//!
//! The hash covers every line whether or not lines are kept, so two runs of one seed can be
//! compared cheaply (the determinism check) and a sweep need not keep megabytes of text.

use std::fmt::Write as _;

use skyriver_core::Instant;

/// FNV-1a, 64-bit: tiny, stable across platforms and releases (unlike `DefaultHasher`).
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

/// Lines of one run.
#[derive(Debug, Default)]
pub struct Trace {
    keep: bool,
    echo: bool,
    lines: Vec<String>,
    hash: Fnv,
    count: u64,
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
        let mut line = String::with_capacity(text.len() + 16);
        let nanos = now.as_nanos();
        let _ = write!(line, "{:>6}.{:03}us ", nanos / 1000, nanos % 1000);
        line.push_str(&shorten_ids(text));
        self.hash.write(line.as_bytes());
        self.hash.write(b"\n");
        self.count += 1;
        if self.echo {
            println!("{line}");
        }
        if self.keep {
            self.lines.push(line);
        }
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
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if i + 40 <= bytes.len()
            && bytes[i..i + 40].iter().all(|b| b.is_ascii_hexdigit())
            && (i + 40 == bytes.len() || !bytes[i + 40].is_ascii_hexdigit())
            && (i == 0 || !bytes[i - 1].is_ascii_hexdigit())
            && bytes[i..i + 24].iter().all(|&b| b == b'0')
        {
            // The hex digits are ASCII, so this slice is on char boundaries.
            let n = u64::from_str_radix(&text[i + 24..i + 40], 16).unwrap_or(0);
            let _ = write!(out, "obj#{n}");
            i += 40;
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::ObjectId;

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
    }
}
