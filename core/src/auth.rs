//! Proofs of knowing the cluster token. Handshakes never send the token: each side sends a
//! fresh random nonce (made by the driver: the core has no randomness), and each proves the
//! token with an HMAC-SHA256 over both nonces, both identities and its own role ([`prove`]),
//! so a captured handshake cannot be replayed (the other side's nonce is new every time) nor
//! reflected (the roles differ). The fabric, verbs and directory handshakes all use it.

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// A fresh random value one side contributes to a handshake.
pub type Nonce = [u8; 32];
/// An HMAC-SHA256 proof.
pub type Proof = [u8; 32];

/// The cluster token: the secret every node of a cluster proves it knows ([`prove`]).
///
/// It never shows: `Debug` prints `ClusterToken(***)` and there is no `Display`, so a
/// `{:?}` of any config that holds one cannot print it. The secret is kept once, behind an
/// `Arc`: a clone shares it (a daemon hands its one token to its fabric, its directory
/// client and the head it serves) instead of copying it, and when the last holder drops it
/// its bytes are zeroed. Equality is constant-time ([`tokens_match`]).
#[derive(Clone)]
pub struct ClusterToken(Arc<Zeroizing<String>>);

impl ClusterToken {
    /// Takes `secret` over (no copy of it is left behind).
    pub fn new(secret: impl Into<String>) -> Self {
        Self(Arc::new(Zeroizing::new(secret.into())))
    }

    /// The secret itself, to key a proof with or to derive a record from. Never log it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl From<String> for ClusterToken {
    fn from(secret: String) -> Self {
        Self::new(secret)
    }
}

impl From<&str> for ClusterToken {
    fn from(secret: &str) -> Self {
        Self::new(secret)
    }
}

impl PartialEq for ClusterToken {
    fn eq(&self, other: &Self) -> bool {
        tokens_match(self.expose_secret(), other.expose_secret())
    }
}

impl Eq for ClusterToken {}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(***)")
    }
}

/// Fresh nonces without randomness of the core's own: HMAC-SHA256, keyed by a secret the
/// driver draws once from the operating system (or the simulator from its seed), over a
/// counter. They never repeat (the counter) and cannot be predicted without the key, which
/// never leaves the process.
pub struct NonceSource {
    key: [u8; 32],
    counter: u64,
}

impl NonceSource {
    /// A source keyed by `key`, which must be secret and random.
    pub fn new(key: [u8; 32]) -> Self {
        Self { key, counter: 0 }
    }

    /// The next nonce.
    pub fn next_nonce(&mut self) -> Nonce {
        self.counter += 1;
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(b"skyriver-nonce");
        mac.update(&self.counter.to_le_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// A seed for keying a hash index, drawn from a secret key (the one the driver drew for
/// [`NonceSource`]) through HMAC-SHA256 under `label`: unpredictable without the key, which it
/// does not reveal, and the same for the same key (so a simulated run replays).
pub fn seed_from_key(key: &[u8; 32], label: &str) -> u64 {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(b"skyriver-seed");
    mac.update(label.as_bytes());
    let bytes: [u8; 32] = mac.finalize().into_bytes().into();
    u64::from_le_bytes(bytes[..8].try_into().expect("8 of 32 bytes"))
}

impl std::fmt::Debug for NonceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("NonceSource")
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

/// What a proof covers: the protocol (`context`, e.g. `skyriver-fabric-v3`), the prover's role,
/// both nonces, and the identities of both sides as the protocol encodes them.
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    /// Names the protocol and its version.
    pub context: &'a [u8],
    /// The nonce of the side that opened the connection.
    pub dialer_nonce: &'a Nonce,
    /// The nonce of the side that accepted it.
    pub acceptor_nonce: &'a Nonce,
    /// The dialer's identity (node id, incarnation...), encoded by the protocol.
    pub dialer: &'a [u8],
    /// The acceptor's identity, encoded by the protocol.
    pub acceptor: &'a [u8],
}

/// Which side proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that opened the connection.
    Dialer,
    /// The side that accepted it.
    Acceptor,
}

fn mac(token: &str, role: Role, t: &Transcript<'_>) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    let mut field = |bytes: &[u8]| {
        mac.update(&(bytes.len() as u64).to_le_bytes());
        mac.update(bytes);
    };
    field(t.context);
    field(match role {
        Role::Dialer => b"dialer",
        Role::Acceptor => b"acceptor",
    });
    field(t.dialer_nonce);
    field(t.acceptor_nonce);
    field(t.dialer);
    field(t.acceptor);
    mac
}

/// The proof `role` sends: HMAC-SHA256 keyed by the token over the transcript.
pub fn prove(token: &str, role: Role, transcript: &Transcript<'_>) -> Proof {
    mac(token, role, transcript).finalize().into_bytes().into()
}

/// Whether `proof` is `role`'s proof of `token` over the transcript (constant time).
pub fn verify(token: &str, role: Role, transcript: &Transcript<'_>, proof: &Proof) -> bool {
    mac(token, role, transcript).verify_slice(proof).is_ok()
}

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
    fn a_cluster_token_never_shows_and_clones_share_one_secret() {
        let token = ClusterToken::new("hunter2-secret");
        assert_eq!(format!("{token:?}"), "ClusterToken(***)");
        assert_eq!(
            format!("{:#?}", Some(&token)),
            "Some(\n    ClusterToken(***),\n)"
        );
        let shared = token.clone();
        assert!(std::ptr::eq(token.expose_secret(), shared.expose_secret()));
        assert_eq!(token, ClusterToken::from("hunter2-secret"));
        assert_ne!(token, ClusterToken::from("hunter2-secreT"));
    }

    #[test]
    fn equal_tokens_match_and_any_difference_does_not() {
        assert!(tokens_match("abc", "abc"));
        assert!(tokens_match("", ""));
        assert!(!tokens_match("abc", "abd"));
        assert!(!tokens_match("abc", "abc\0"));
        assert!(!tokens_match("abc", ""));
        assert!(!tokens_match("", "abc"));
    }

    #[test]
    fn nonces_never_repeat_and_depend_on_the_key() {
        let mut a = NonceSource::new([7; 32]);
        let mut b = NonceSource::new([8; 32]);
        let from_a: Vec<Nonce> = (0..100).map(|_| a.next_nonce()).collect();
        let mut unique = from_a.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), from_a.len());
        assert_ne!(from_a[0], b.next_nonce());
        assert!(
            !format!("{a:?}").contains('7'),
            "the key stays out of logs: {a:?}"
        );
    }

    #[test]
    fn a_proof_holds_only_for_its_token_role_nonces_and_identities() {
        let (d, a) = ([1u8; 32], [2u8; 32]);
        let t = Transcript {
            context: b"test-v1",
            dialer_nonce: &d,
            acceptor_nonce: &a,
            dialer: b"node-1",
            acceptor: b"node-0",
        };
        let proof = prove("secret", Role::Dialer, &t);
        assert!(verify("secret", Role::Dialer, &t, &proof));
        assert!(!verify("Secret", Role::Dialer, &t, &proof));
        // Reflected: the acceptor's proof is another value.
        assert!(!verify("secret", Role::Acceptor, &t, &proof));
        // Replayed against a fresh nonce.
        let fresh = [3u8; 32];
        let replay = Transcript {
            acceptor_nonce: &fresh,
            ..t
        };
        assert!(!verify("secret", Role::Dialer, &replay, &proof));
        let other_node = Transcript {
            dialer: b"node-2",
            ..t
        };
        assert!(!verify("secret", Role::Dialer, &other_node, &proof));
        // Field boundaries count: moving bytes between fields changes the proof.
        let shifted = Transcript {
            dialer: b"node-",
            acceptor: b"1node-0",
            ..t
        };
        assert!(!verify("secret", Role::Dialer, &shifted, &proof));
    }
}
