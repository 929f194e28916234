//! The cluster token's nonces. The token type ([`ClusterToken`]: redacted, shared, zeroed on
//! drop) and the proofs are [`skyriver_core::auth`]'s, so the directory registry (in the core)
//! and the fabrics check them with one piece of code.

pub use skyriver_core::auth::{
    prove, tokens_match, verify, ClusterToken, Nonce, Proof, Role, Transcript,
};

/// A nonce from the operating system's generator.
pub fn fresh_nonce() -> Nonce {
    let mut nonce = [0u8; 32];
    // The kernel's generator does not fail once the system has booted; if it ever does, a
    // handshake must not go on with a predictable nonce.
    getrandom::getrandom(&mut nonce).expect("the operating system's random generator works");
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_nonces_differ() {
        assert_ne!(fresh_nonce(), fresh_nonce());
    }
}
