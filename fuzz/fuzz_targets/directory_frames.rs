//! The built-in directory's frames, as the head reads them from a node's connection.
//!
//! The first byte chooses how the rest is read: as one frame body (even) or as a stream of
//! length-prefixed frames read by the transport's frame reader (odd), and which connections
//! the messages come from (see the end). Checks:
//! - `ToRegistry` and `FromRegistry` bodies that decode encode back to an equal value, and
//!   `announced_version` reads the version of every hello with the magic;
//! - the frame reader agrees with decoding each body on its own and consumes exactly one frame;
//! - the decoded messages, sent to a registry on three connections, never admit a connection
//!   that did not prove the token (connections 1 and 2 cannot: they do not know it), while
//!   connection 0 answers every challenge with a correct proof, so the requests of a member
//!   are exercised too; the registry's proof in a `Welcome` must hold, and its invariants hold
//!   after every message.

#![no_main]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use postcard::{from_bytes, to_stdvec};
use serde::de::DeserializeOwned;
use serde::Serialize;
use skyriver_core::auth::{self, Nonce, Role};
use skyriver_core::digest::ContentDigest;
use skyriver_core::directory::{DirectoryReply, DirectoryRequest, MemberInfo};
use skyriver_core::registry::wire::{announced_version, member_identity, transcript, WireOpId};
use skyriver_core::registry::{
    ConnId, FromRegistry, Hello, Registry, RegistryConfig, RegistryMessageError, RegistryOutput,
    ToRegistry, HELLO_MAGIC, PROTOCOL_VERSION,
};
use skyriver_core::wire::ObjectSizes;
use skyriver_core::{Instant, NodeId, ObjectId};
use skyriver_transport::directory::frame;

const TOKEN: &str = "cluster token";
/// Connections the input's messages are spread over; the first is the honest node's.
const CONNECTIONS: u64 = 3;

fn seeds() -> Vec<Vec<u8>> {
    let member = MemberInfo {
        node: NodeId(3),
        fabric_addr: "10.0.0.3:7000".parse().expect("an address"),
        fabric: "tcp".into(),
        incarnation: 1,
        failure_domain: String::new(),
    };
    let hello = ToRegistry::Hello(Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        legacy_token: String::new(),
        member,
        nonce: [5; 32],
        returning: true,
        learns_locations: true,
    });
    let id = ObjectId::from_u64(42);
    let sizes = ObjectSizes {
        data_size: 1000,
        metadata_size: 8,
    };
    let to_registry = [
        hello.clone(),
        ToRegistry::Proof([6; 32]),
        ToRegistry::Request {
            op: WireOpId(1),
            request: DirectoryRequest::Publish {
                id,
                sizes,
                digest: ContentDigest(0x0123_4567_89ab_cdef),
            },
        },
        ToRegistry::Request {
            op: WireOpId(2),
            request: DirectoryRequest::Lookup {
                id,
                subscribe: true,
            },
        },
        ToRegistry::Ping { seq: 9 },
        ToRegistry::Goodbye,
        ToRegistry::Reclaim {
            op: WireOpId(3),
            id,
            sizes,
            digest: ContentDigest(0x0123_4567_89ab_cdef),
        },
    ];
    let from_registry = [
        FromRegistry::Challenge { nonce: [7; 32] },
        FromRegistry::Welcome {
            version: PROTOCOL_VERSION,
            proof: [8; 32],
        },
        FromRegistry::Reply {
            op: WireOpId(2),
            reply: DirectoryReply::Located {
                holders: vec![NodeId(3)],
                sizes: Some(sizes),
                digest: Some(ContentDigest(0x0123_4567_89ab_cdef)),
            },
        },
        FromRegistry::Reply {
            op: WireOpId(1),
            reply: DirectoryReply::Conflict {
                sizes,
                digest: ContentDigest(7),
            },
        },
        FromRegistry::Refused {
            reason: "busy".into(),
            retryable: true,
        },
    ];
    let mut seeds = Vec::new();
    // One body each (even first byte).
    for message in &to_registry {
        seeds.push([&[0u8][..], &to_stdvec(message).expect("encodes")].concat());
    }
    for message in &from_registry {
        seeds.push([&[0u8][..], &to_stdvec(message).expect("encodes")].concat());
    }
    // A whole conversation as frames (odd first byte): hello, proof, requests, ping, goodbye.
    let mut stream = vec![1u8];
    for message in &to_registry {
        stream.extend(skyriver_fuzz::frame(&to_stdvec(message).expect("encodes")));
    }
    seeds.push(stream.clone());
    // The same from connection 1, which does not know the token.
    stream[0] = 0b011;
    seeds.push(stream);
    seeds
}

/// Decodes a `T`; if it decodes, it must encode to bytes that decode to an equal value.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(body: &[u8]) -> Option<T> {
    let value: T = from_bytes(body).ok()?;
    let encoded = to_stdvec(&value).expect("a decoded message encodes");
    let again: T = from_bytes(&encoded).expect("an encoded message decodes");
    assert_eq!(again, value, "round trip");
    Some(value)
}

/// Reads frames with the transport's reader until the stream ends or a frame is refused.
fn read_frames(stream: &[u8]) -> Vec<ToRegistry> {
    let mut reader = stream;
    let mut buf = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    let mut messages = Vec::new();
    loop {
        let before = reader;
        let result = match pin!(frame::read::<ToRegistry, _>(&mut reader, &mut buf)).poll(&mut cx) {
            Poll::Ready(result) => result,
            Poll::Pending => panic!("a read from memory waited"),
        };
        match result {
            Ok(Some(message)) => {
                let len = u32::from_le_bytes(before[..4].try_into().expect("a prefix")) as usize;
                let body = &before[4..4 + len];
                assert_eq!(reader.len(), before.len() - 4 - len, "consumed one frame");
                assert_eq!(from_bytes::<ToRegistry>(body).ok(), Some(message.clone()));
                let again = frame::encode(&message);
                assert_eq!(
                    from_bytes::<ToRegistry>(&again[4..]).ok(),
                    Some(message.clone())
                );
                messages.push(message);
            }
            Ok(None) => {
                assert!(before.is_empty(), "a clean end only between frames");
                break;
            }
            Err(_) => break,
        }
    }
    messages
}

/// A registry and the connections the input speaks on.
struct Head {
    registry: Registry,
    now: Instant,
    /// The live connection of each slot; slot 0 is the honest node's.
    conns: Vec<ConnId>,
    next_conn: u64,
    /// The first hello of each connection (the one a challenge answers).
    hellos: BTreeMap<ConnId, Hello>,
    /// The challenge each connection got.
    challenges: BTreeMap<ConnId, Nonce>,
}

impl Head {
    fn new() -> Self {
        Self {
            registry: Registry::new(RegistryConfig::new(TOKEN, [9; 32])),
            now: Instant::ZERO,
            conns: (0..CONNECTIONS).map(ConnId).collect(),
            next_conn: CONNECTIONS,
            hellos: BTreeMap::new(),
            challenges: BTreeMap::new(),
        }
    }

    fn slot_of(&self, conn: ConnId) -> Option<usize> {
        self.conns.iter().position(|&c| c == conn)
    }

    /// The connection of `slot` closed: the registry hears so and the slot reconnects.
    fn reconnect(&mut self, slot: usize) {
        let conn = self.conns[slot];
        self.registry.handle_disconnect(self.now, conn);
        self.hellos.remove(&conn);
        self.challenges.remove(&conn);
        self.conns[slot] = ConnId(self.next_conn);
        self.next_conn += 1;
    }

    fn deliver(&mut self, slot: usize, message: ToRegistry) {
        self.now = self.now.saturating_add(Duration::from_millis(700));
        self.registry.handle_timeout(self.now);
        self.drain();
        let mut pending = vec![(slot, message)];
        while let Some((slot, message)) = pending.pop() {
            let conn = self.conns[slot];
            if let ToRegistry::Hello(hello) = &message {
                self.hellos.entry(conn).or_insert_with(|| hello.clone());
            }
            if let Err(RegistryMessageError::NotAMember(_)) =
                self.registry.handle_message(self.now, conn, message)
            {
                self.reconnect(slot);
            }
            self.registry.check_invariants();
            pending.extend(self.drain());
        }
    }

    /// Carries out the registry's outputs; returns the honest node's answers to challenges.
    fn drain(&mut self) -> Vec<(usize, ToRegistry)> {
        let mut answers = Vec::new();
        while let Some(output) = self.registry.poll_output() {
            match output {
                RegistryOutput::Send { conn, message } => {
                    let Some(slot) = self.slot_of(conn) else {
                        continue;
                    };
                    match message {
                        FromRegistry::Challenge { nonce } => {
                            self.challenges.insert(conn, nonce);
                            if slot == 0 {
                                let hello = &self.hellos[&conn];
                                let identity = member_identity(&hello.member);
                                let t = transcript(&hello.nonce, &nonce, &identity);
                                let proof = auth::prove(TOKEN, Role::Dialer, &t);
                                answers.push((0, ToRegistry::Proof(proof)));
                            }
                        }
                        FromRegistry::Welcome { proof, .. } => {
                            assert_eq!(slot, 0, "{conn} was admitted without the token");
                            let hello = &self.hellos[&conn];
                            let identity = member_identity(&hello.member);
                            let t = transcript(&hello.nonce, &self.challenges[&conn], &identity);
                            assert!(
                                auth::verify(TOKEN, Role::Acceptor, &t, &proof),
                                "the registry's proof does not hold"
                            );
                        }
                        _ => {}
                    }
                }
                RegistryOutput::Close { conn, .. } => {
                    if let Some(slot) = self.slot_of(conn) {
                        self.reconnect(slot);
                    }
                }
                _ => {}
            }
        }
        // Only the honest connection can be a member.
        for (_, _, conn) in self.registry.registrations() {
            assert_eq!(self.slot_of(conn), Some(0), "{conn} is a member");
        }
        answers
    }
}

fuzz_target!(init: skyriver_fuzz::write_seeds(seeds()), |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let messages = if mode % 2 == 0 {
        if let Some(ToRegistry::Hello(hello)) = round_trip::<ToRegistry>(rest) {
            if hello.magic == HELLO_MAGIC {
                assert_eq!(announced_version(rest), Some(hello.version));
            }
        }
        round_trip::<FromRegistry>(rest);
        let _ = announced_version(rest);
        round_trip::<ToRegistry>(rest).into_iter().collect()
    } else {
        read_frames(rest)
    };
    // The mode's bits 1-2 choose the connection of the first message; bit 3 + i set moves the
    // messages after the i-th to the next connection. So a whole stream can come from one
    // connection (as over TCP), or its first messages from several.
    let mut head = Head::new();
    let mut slot = usize::from(mode >> 1 & 3) % CONNECTIONS as usize;
    for (i, message) in messages.into_iter().enumerate() {
        head.deliver(slot, message);
        if i < 5 && mode >> (3 + i) & 1 == 1 {
            slot = (slot + 1) % CONNECTIONS as usize;
        }
    }
});
