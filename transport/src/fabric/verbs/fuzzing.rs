//! Entry points for the fuzz targets (`fuzz/`): the verbs handshake's frames as a peer's bytes
//! reach them, with the checks the handshake applies, and the invariants they must keep.

use serde::de::DeserializeOwned;
use serde::Serialize;
use skyriver_core::RemoteRegion;

use super::hello::{
    Accepted, Challenge, CostsFrame, Hello, Open, Proven, Reply, Verdict, WireArena, WireChunk,
};
use super::peer::RemoteTable;
use crate::verbs::RemoteChunk;

/// Decodes `body` as every frame of the verbs handshake; each that decodes must encode to a
/// frame that decodes to the same encoding, and each hello it carries goes through the checks
/// a connecting peer's hello goes through ([`Hello::validate`], then the READ table). Returns
/// how many frame types `body` decoded as.
///
/// # Panics
/// If a frame does not survive the round trip, or a hello that passes the checks gives a READ
/// table that does not resolve the hello's own arenas.
pub fn hello_frames(body: &[u8]) -> usize {
    let mut decoded = 0;
    if round_trip::<Open>(body).is_some() {
        decoded += 1;
    }
    if round_trip::<Challenge>(body).is_some() {
        decoded += 1;
    }
    if let Some(proven) = round_trip::<Proven>(body) {
        decoded += 1;
        check_hello(&proven.hello);
    }
    if let Some(reply) = round_trip::<Reply>(body) {
        decoded += 1;
        if let Reply::Accept(accepted) = reply {
            check_hello(&accepted.hello);
        }
    }
    if round_trip::<Verdict>(body).is_some() {
        decoded += 1;
    }
    if round_trip::<CostsFrame>(body).is_some() {
        decoded += 1;
    }
    if let Some(hello) = round_trip::<Hello>(body) {
        decoded += 1;
        check_hello(&hello);
    }
    decoded
}

/// Decodes a `T`; if it decodes, checks the round trip on the bytes (floats may be NaN).
fn round_trip<T: Serialize + DeserializeOwned>(body: &[u8]) -> Option<T> {
    let value: T = postcard::from_bytes(body).ok()?;
    let encoded = postcard::to_stdvec(&value).expect("a decoded frame encodes");
    let again: T = postcard::from_bytes(&encoded).expect("an encoded frame decodes");
    assert_eq!(
        postcard::to_stdvec(&again).expect("a decoded frame encodes"),
        encoded,
        "{} changed in a round trip",
        std::any::type_name::<T>()
    );
    Some(value)
}

/// The setup's checks of a peer's hello; a hello that passes them must give a READ table in
/// which every announced arena resolves, with its key, to exactly its memory regions.
fn check_hello(hello: &Hello) {
    if hello.validate().is_err() {
        return;
    }
    let Ok(table) = RemoteTable::from_hello(&hello.arenas) else {
        return;
    };
    for arena in &hello.arenas {
        let first = arena.chunks[0];
        let len = arena.chunks.iter().map(|c| c.len).sum();
        let whole = RemoteRegion {
            addr: first.addr,
            len,
            rkey: first.rkey,
        };
        let expected: Vec<RemoteChunk> = arena
            .chunks
            .iter()
            .map(|c| RemoteChunk {
                addr: c.addr,
                len: c.len,
                rkey: c.rkey,
            })
            .collect();
        assert_eq!(
            table.resolve(&whole).map(<[RemoteChunk]>::to_vec),
            Ok(expected),
            "arena-{} does not resolve to its regions",
            arena.arena
        );
        let other_key = RemoteRegion {
            rkey: first.rkey ^ 1,
            ..whole
        };
        assert!(
            table.resolve(&other_key).is_err(),
            "arena-{} resolves with another key",
            arena.arena
        );
    }
}

/// A body of every frame, as an honest peer sends it: where the fuzzer starts.
pub fn seeds() -> Vec<Vec<u8>> {
    let chunk = |addr, len, rkey| WireChunk { addr, len, rkey };
    let hello = Hello {
        node: 7,
        device: "rxe0".into(),
        recv_slot_bytes: 65536,
        copy_bytes_per_sec: 5e9,
        probe_pings: 24,
        probe_region: chunk(0x1000, 4096, 9),
        arenas: vec![
            WireArena {
                arena: 0,
                chunks: vec![chunk(0x10000, 0x1000, 1), chunk(0x11000, 0x800, 2)],
            },
            WireArena {
                arena: 1,
                chunks: vec![chunk(0x20000, 0x4000, 3)],
            },
        ],
    };
    vec![
        encode(&Open {
            node: 7,
            nonce: [1; 32],
        }),
        encode(&Challenge {
            node: 8,
            nonce: [2; 32],
        }),
        encode(&Proven {
            proof: [3; 32],
            hello: hello.clone(),
        }),
        encode(&Reply::Accept(Accepted {
            hello: Hello {
                node: 8,
                probe_pings: 0,
                ..hello.clone()
            },
            proof: [4; 32],
        })),
        encode(&Reply::Refuse("wrong token".into())),
        encode(&Verdict::Accept),
        encode(&CostsFrame {
            measured: true,
            round_trip_ns: 3500.0,
            message_overhead_ns: 800.0,
            wire_bytes_per_sec: 1.2e9,
            read_setup_ns: 1500.0,
            note: "measured".into(),
        }),
        encode(&hello),
    ]
}

fn encode<T: Serialize>(frame: &T) -> Vec<u8> {
    postcard::to_stdvec(frame).expect("a frame encodes")
}
