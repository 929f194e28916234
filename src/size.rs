//! Human-readable byte sizes for flags and output: `4GiB`, `512 MiB`, `64k`, `1000000`.

use std::fmt;
use std::str::FromStr;

/// A byte count parsed from text such as `4GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.trim()
            .parse::<bytesize::ByteSize>()
            .map(|size| ByteSize(size.as_u64()))
            .map_err(|_| {
                format!("{text:?} is not a size: use a number of bytes with an optional unit, like 4GiB, 512MiB, 64KiB or 1000000")
            })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

/// `1536` → `1.5 KiB`.
pub fn format_bytes(bytes: u64) -> String {
    bytesize::ByteSize(bytes).display().iec().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_spellings() {
        assert_eq!("4GiB".parse::<ByteSize>().unwrap().0, 4 << 30);
        assert_eq!("512 MiB".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("1000000".parse::<ByteSize>().unwrap().0, 1_000_000);
        assert_eq!("1KiB".parse::<ByteSize>().unwrap().0, 1024);
        assert!("lots".parse::<ByteSize>().is_err());
        assert!("-1".parse::<ByteSize>().is_err());
    }

    #[test]
    fn formats_with_binary_units() {
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(4 << 30), "4.0 GiB");
    }
}
