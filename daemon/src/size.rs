//! Human-readable byte sizes for flags and output: `4GiB`, `512 MiB`, `64KiB`, `1000000`.

use std::fmt;
use std::str::FromStr;

/// A byte count parsed from text such as `4GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    /// A number of bytes with an optional binary unit: `4GiB`, `512 MiB`, `1.5GiB`, `64KiB`,
    /// `1000000` (units are case-insensitive; `Gi` = `GiB`). Decimal units (`GB`, `MB`, `k`) are
    /// refused as ambiguous — `--memory 1gb` would otherwise give 953.7 MiB — with the two
    /// spellings that say what is meant.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let usage = "use a number of bytes with an optional binary unit, like 4GiB, 512MiB, \
                     64KiB or 1000000";
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = (&t[..split], t[split..].trim());
        if number.is_empty() {
            return Err(format!("{text:?} is not a size: {usage}"));
        }
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "kib" | "ki" => 10,
            "mib" | "mi" => 20,
            "gib" | "gi" => 30,
            "tib" | "ti" => 40,
            "pib" | "pi" => 50,
            decimal @ ("k" | "kb" | "m" | "mb" | "g" | "gb" | "t" | "tb" | "p" | "pb") => {
                let power = match decimal.as_bytes()[0] {
                    b'k' => 1,
                    b'm' => 2,
                    b'g' => 3,
                    b't' => 4,
                    _ => 5,
                };
                let binary = ["KiB", "MiB", "GiB", "TiB", "PiB"][power - 1];
                let decimal_bytes = number
                    .parse::<f64>()
                    .map(|n| format!("{:.0}", n * 1000f64.powi(power as i32)))
                    .unwrap_or_else(|_| "the number of bytes".into());
                return Err(format!(
                    "{text:?}: the unit {unit:?} is ambiguous; write {number}{binary} (binary, \
                     {} bytes) or {decimal_bytes} (bytes)",
                    number
                        .parse::<f64>()
                        .map(|n| format!("{:.0}", n * (1u64 << (10 * power)) as f64))
                        .unwrap_or_default()
                ));
            }
            _ => return Err(format!("{text:?}: unknown unit {unit:?}; {usage}")),
        };
        let bytes = if number.contains('.') {
            let n: f64 = number
                .parse()
                .map_err(|_| format!("{text:?} is not a size: {usage}"))?;
            let bytes = n * (1u64 << shift) as f64;
            if !bytes.is_finite() || bytes >= u64::MAX as f64 {
                return Err(format!("{text:?} is too large"));
            }
            bytes as u64
        } else {
            let n: u64 = number
                .parse()
                .map_err(|_| format!("{text:?} is not a size: {usage}"))?;
            n.checked_mul(1u64 << shift)
                .ok_or_else(|| format!("{text:?} is too large"))?
        };
        Ok(ByteSize(bytes))
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
        assert_eq!("1.5GiB".parse::<ByteSize>().unwrap().0, 3 << 29);
        assert_eq!("2gi".parse::<ByteSize>().unwrap().0, 2 << 30);
        assert!("lots".parse::<ByteSize>().is_err());
        assert!("-1".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn decimal_units_are_refused_with_both_meanings() {
        let e = "1gb".parse::<ByteSize>().unwrap_err();
        assert!(
            e.contains("1GiB") && e.contains("1073741824") && e.contains("1000000000"),
            "{e}"
        );
        assert!("10TB".parse::<ByteSize>().is_err());
        assert!("64k".parse::<ByteSize>().is_err());
    }

    #[test]
    fn formats_with_binary_units() {
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(4 << 30), "4.0 GiB");
    }
}
