//! Identifiers. Every id is a newtype with `Display`, so logs and traces say what they hold.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Length of an object id in bytes (as in Plasma and Ray).
pub const OBJECT_ID_LEN: usize = 20;

/// The first four bytes of an id that names the node it was made on ("SKY" and a version):
/// see [`ObjectId::owned_by`].
pub const OWNED_ID_MARKER: [u8; 4] = [b'S', b'K', b'Y', 1];

/// A 20-byte object id, shown as 40 lowercase hex characters. Ordered by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectId(pub [u8; OBJECT_ID_LEN]);

impl ObjectId {
    /// The bytes as three big-endian words (8, 8 and 4 bytes): ordered as the bytes are.
    fn words(&self) -> (u64, u64, u32) {
        let b = &self.0;
        (
            u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
            u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
        )
    }
}

/// The order of the bytes, compared a word at a time: ids key most of the core's maps, and the
/// byte-by-byte order (a `memcmp` call per comparison) took 6% of a 1,000-node simulation.
impl Ord for ObjectId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.words().cmp(&other.words())
    }
}

impl PartialOrd for ObjectId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Why a string or byte slice is not an object id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectIdError {
    /// The input has the wrong length.
    #[error("an object id is {OBJECT_ID_LEN} bytes (40 hex characters), got {got} {unit}")]
    WrongLength {
        /// The length found.
        got: usize,
        /// "bytes" or "hex characters".
        unit: &'static str,
    },
    /// The input has a character that is not a hex digit.
    #[error("an object id is hex (0-9, a-f): {0:?} is not")]
    NotHex(String),
}

impl ObjectId {
    /// Builds an id from a byte slice, checking its length.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ObjectIdError> {
        let array: [u8; OBJECT_ID_LEN] =
            bytes.try_into().map_err(|_| ObjectIdError::WrongLength {
                got: bytes.len(),
                unit: "bytes",
            })?;
        Ok(Self(array))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; OBJECT_ID_LEN] {
        &self.0
    }

    /// An id that names the node it was made on: [`OWNED_ID_MARKER`], the node's number
    /// (big-endian), then 12 bytes the caller draws at random (96 bits: ids of one node
    /// repeat with the odds of a birthday among 2^96). A fetch of such an id with no hint and
    /// no remembered location asks that node first, as if the caller had named it: an object
    /// is usually fetched from where it was put, so its first fetch skips the directory. A
    /// wrong guess (the object moved, or its node is gone) costs one round trip, then the
    /// directory is asked as for any id.
    pub fn owned_by(node: NodeId, random: [u8; 12]) -> Self {
        let mut bytes = [0u8; OBJECT_ID_LEN];
        bytes[..4].copy_from_slice(&OWNED_ID_MARKER);
        bytes[4..8].copy_from_slice(&node.0.to_be_bytes());
        bytes[8..].copy_from_slice(&random);
        Self(bytes)
    }

    /// The node an id made by [`ObjectId::owned_by`] names; `None` for other ids. Any id whose
    /// first four bytes happen to be the marker (1 in 2^32 of random ids) is taken as naming
    /// a node: the cost of that is the one round trip of a wrong guess.
    pub fn owner(&self) -> Option<NodeId> {
        (self.0[..4] == OWNED_ID_MARKER).then(|| {
            NodeId(u32::from_be_bytes([
                self.0[4], self.0[5], self.0[6], self.0[7],
            ]))
        })
    }

    /// An id derived from a 64-bit number, for tests and tools that want readable ids.
    pub fn from_u64(n: u64) -> Self {
        let mut bytes = [0u8; OBJECT_ID_LEN];
        bytes[OBJECT_ID_LEN - 8..].copy_from_slice(&n.to_be_bytes());
        Self(bytes)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 2 * OBJECT_ID_LEN];
        hex::encode_to_slice(self.0, &mut text).expect("two hex digits a byte");
        f.write_str(std::str::from_utf8(&text).expect("hex digits"))
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({self})")
    }
}

impl FromStr for ObjectId {
    type Err = ObjectIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.len() != OBJECT_ID_LEN * 2 {
            return Err(ObjectIdError::WrongLength {
                got: text.chars().count(),
                unit: "hex characters",
            });
        }
        let mut bytes = [0u8; OBJECT_ID_LEN];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| ObjectIdError::NotHex(text.into()))?;
        Ok(Self(bytes))
    }
}

macro_rules! numeric_id {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

numeric_id!(
    /// A local client connection of a node's store.
    ClientId(u64),
    "client-"
);
numeric_id!(
    /// A node (one daemon) of the cluster.
    NodeId(u32),
    "node-"
);
numeric_id!(
    /// A shared-memory arena of one node's store.
    ArenaId(u32),
    "arena-"
);
numeric_id!(
    /// A client's request, echoed in the reply so the client can match them.
    RequestId(u64),
    "req-"
);
numeric_id!(
    /// One transfer between two nodes, chosen by the requester.
    TransferId(u64),
    "xfer-"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_id_round_trips_through_hex() {
        let id = ObjectId::from_u64(0xdead_beef);
        let text = id.to_string();
        assert_eq!(text.len(), 40);
        assert_eq!(text, "00000000000000000000000000000000deadbeef");
        assert_eq!(text.parse::<ObjectId>().unwrap(), id);
    }

    #[test]
    fn an_owned_id_names_its_node_and_other_ids_name_none() {
        let id = ObjectId::owned_by(NodeId(0x0102_0304), [9; 12]);
        assert_eq!(id.owner(), Some(NodeId(0x0102_0304)));
        assert_eq!(&id.to_string()[..16], "534b590101020304");
        assert_eq!(ObjectId::from_u64(7).owner(), None);
        let mut almost = id;
        almost.0[3] = 2; // another marker version
        assert_eq!(almost.owner(), None);
    }

    #[test]
    fn object_ids_are_ordered_by_their_bytes() {
        let mut ids: Vec<ObjectId> = Vec::new();
        for at in [0, 7, 8, 15, 16, 19] {
            for value in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bytes = [0x55u8; OBJECT_ID_LEN];
                bytes[at] = value;
                ids.push(ObjectId(bytes));
            }
        }
        ids.extend([0, 1, 255, 256, u64::MAX].map(ObjectId::from_u64));
        for a in &ids {
            for b in &ids {
                assert_eq!(a.cmp(b), a.0.cmp(&b.0), "{a} against {b}");
                assert_eq!(a.partial_cmp(b), Some(a.0.cmp(&b.0)));
            }
        }
    }

    #[test]
    fn object_id_rejects_bad_text() {
        assert!(matches!(
            "abc".parse::<ObjectId>(),
            Err(ObjectIdError::WrongLength { got: 3, .. })
        ));
        let not_hex = "z".repeat(40);
        assert!(matches!(
            not_hex.parse::<ObjectId>(),
            Err(ObjectIdError::NotHex(_))
        ));
        assert!(ObjectId::from_slice(&[0u8; 19]).is_err());
        assert!(ObjectId::from_slice(&[0u8; 21]).is_err());
    }
}
