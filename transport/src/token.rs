//! The cluster token every daemon presents when it connects (fabric peers, the built-in
//! directory).

/// Whether two tokens are equal, in time independent of where they differ (so a caller cannot
/// find the token byte by byte by timing refusals).
pub fn tokens_match(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_match_and_any_difference_does_not() {
        assert!(tokens_match("abc", "abc"));
        assert!(tokens_match("", ""));
        assert!(!tokens_match("abc", "abd"));
        assert!(!tokens_match("abc", "abc\0"));
        assert!(!tokens_match("abc", ""));
        assert!(!tokens_match("", "abc"));
    }
}
