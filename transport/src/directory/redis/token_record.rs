//! The record of a cluster's token kept in Redis (`skyriver:{CLUSTER}:token`): never the token,
//! but a salted, slow derivation of it, so whoever reads Redis cannot test guesses of a
//! human-chosen token quickly.
//!
//! Format: `v2:` followed by an Argon2id hash in the PHC string format,
//! `v2:$argon2id$v=19$m=KIB,t=PASSES,p=LANES$SALT$HASH` (salt and hash in unpadded base64).
//! The first node of a cluster makes it with a random 16-byte salt and its [`KdfCost`]; every
//! later node derives with the stored salt and cost and compares in constant time. The input
//! is the cluster's name and the token, so a record copied to another cluster name never
//! matches. Records of earlier versions (`fnv1a64:…`, an unsalted 64-bit hash) are refused:
//! they must be removed with `skyriver cluster reset`.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

use super::super::TokenRecordError;

/// The version prefix of the records this code writes and reads.
const PREFIX: &str = "v2:";

/// Most memory (KiB) a stored record may ask a joining node to spend: a record asking for
/// more is refused rather than derived (1 GiB).
const MAX_MEMORY_KIB: u32 = 1 << 20;
/// Most passes a stored record may ask for.
const MAX_PASSES: u32 = 64;
/// Most lanes a stored record may ask for.
const MAX_LANES: u32 = 16;

/// How costly the first node of a cluster makes the token record (Argon2id). Later nodes use
/// the cost stored in the record, whatever their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfCost {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub passes: u32,
    /// Lanes.
    pub lanes: u32,
}

impl Default for KdfCost {
    /// 19 MiB, 2 passes, 1 lane (OWASP's recommendation for Argon2id): some tens of
    /// milliseconds once per joining daemon.
    fn default() -> Self {
        Self {
            memory_kib: 19 * 1024,
            passes: 2,
            lanes: 1,
        }
    }
}

impl KdfCost {
    /// The least cost Argon2 accepts (8 KiB, 1 pass, 1 lane): for tests only, where speed
    /// matters and the token is not a secret.
    pub const TESTING: KdfCost = KdfCost {
        memory_kib: 8,
        passes: 1,
        lanes: 1,
    };
}

/// Why a stored record does not admit a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Mismatch {
    /// A well-formed record of another token.
    WrongToken,
    /// A record this version does not read (an older format, or not a record at all).
    OldFormat,
    /// A record asking for more work than a joining node spends.
    TooCostly,
}

/// The derivation's input: the cluster's name and the token.
fn input(cluster: &str, token: &str) -> Vec<u8> {
    let mut input = b"skyriver cluster token\0".to_vec();
    input.extend_from_slice(cluster.as_bytes());
    input.push(0);
    input.extend_from_slice(token.as_bytes());
    input
}

/// A new record for `token` of `cluster`, with a fresh random salt. Slow by design: run it
/// off the async threads.
pub(super) fn create(
    cluster: &str,
    token: &str,
    cost: KdfCost,
) -> Result<String, TokenRecordError> {
    let mut salt = [0u8; 16];
    getrandom::getrandom(&mut salt).map_err(TokenRecordError::Salt)?;
    let salt = SaltString::encode_b64(&salt).map_err(TokenRecordError::SaltEncoding)?;
    let params =
        Params::new(cost.memory_kib, cost.passes, cost.lanes, None).map_err(|objection| {
            TokenRecordError::Cost {
                cost: format!("{cost:?}"),
                objection,
            }
        })?;
    let hash = Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(&input(cluster, token), &salt)
        .map_err(TokenRecordError::Derive)?;
    Ok(format!("{PREFIX}{hash}"))
}

/// Whether `record` admits `token` of `cluster`. Slow by design: run it off the async threads.
pub(super) fn verify(record: &str, cluster: &str, token: &str) -> Result<(), Mismatch> {
    let phc = record.strip_prefix(PREFIX).ok_or(Mismatch::OldFormat)?;
    let hash = PasswordHash::new(phc).map_err(|_| Mismatch::OldFormat)?;
    if hash.algorithm != Algorithm::Argon2id.ident() {
        return Err(Mismatch::OldFormat);
    }
    let params = Params::try_from(&hash).map_err(|_| Mismatch::OldFormat)?;
    if params.m_cost() > MAX_MEMORY_KIB
        || params.t_cost() > MAX_PASSES
        || params.p_cost() > MAX_LANES
    {
        return Err(Mismatch::TooCostly);
    }
    // The verifier takes the algorithm, version, cost and salt from the record and compares
    // the hashes in constant time.
    Argon2::default()
        .verify_password(&input(cluster, token), &hash)
        .map_err(|_| Mismatch::WrongToken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_admits_its_token_only_and_is_salted() {
        let record = create("c", "secret", KdfCost::TESTING).unwrap();
        assert!(
            record.starts_with("v2:$argon2id$v=19$m=8,t=1,p=1$"),
            "{record}"
        );
        assert!(!record.contains("secret"));
        assert_eq!(verify(&record, "c", "secret"), Ok(()));
        assert_eq!(verify(&record, "c", "Secret"), Err(Mismatch::WrongToken));
        assert_eq!(verify(&record, "d", "secret"), Err(Mismatch::WrongToken));
        // A fresh salt every time: the same token gives another record.
        assert_ne!(record, create("c", "secret", KdfCost::TESTING).unwrap());
    }

    #[test]
    fn old_and_malformed_records_are_refused_as_old() {
        for old in [
            "fnv1a64:0123456789abcdef",
            "",
            "v2:",
            "v2:$argon2i$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA",
        ] {
            assert_eq!(
                verify(old, "c", "secret"),
                Err(Mismatch::OldFormat),
                "{old}"
            );
        }
    }

    #[test]
    fn a_record_asking_for_too_much_work_is_refused() {
        let record = create("c", "secret", KdfCost::TESTING).unwrap();
        let costly = record.replace("m=8,", &format!("m={},", MAX_MEMORY_KIB + 1));
        assert_eq!(verify(&costly, "c", "secret"), Err(Mismatch::TooCostly));
    }

    #[test]
    fn the_default_cost_is_valid() {
        let cost = KdfCost::default();
        assert!(Params::new(cost.memory_kib, cost.passes, cost.lanes, None).is_ok());
        assert!(cost.memory_kib <= MAX_MEMORY_KIB && cost.passes <= MAX_PASSES);
    }
}
