//! The registry's rules and the session's reconnect logic, driven by hand.

use std::net::SocketAddr;
use std::time::Duration;

use super::session::{DirectorySession, SessionConfig, SessionError, SessionOutput};
use super::*;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryNotice, DirectoryOpId};

pub(super) const TOKEN: &str = "token";

pub(super) fn member(node: u32, incarnation: u32) -> MemberInfo {
    MemberInfo {
        node: NodeId(node),
        fabric_addr: SocketAddr::from(([127, 0, 0, 1], 7000 + node as u16)),
        fabric: "tcp".into(),
        incarnation,
        failure_domain: String::new(),
    }
}

pub(super) const NONCE_KEY: [u8; 32] = [5; 32];

pub(super) fn hello(member: MemberInfo) -> Hello {
    Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        legacy_token: String::new(),
        member,
        nonce: [9; 32],
        returning: false,
        learns_locations: false,
    }
}

/// The registry's challenge, the one thing a well-formed hello gets.
pub(super) fn challenge_of(registry: &mut Registry, conn: u64) -> crate::auth::Nonce {
    match registry.poll_output() {
        Some(RegistryOutput::Send {
            conn: c,
            message: FromRegistry::Challenge { nonce },
        }) if c == ConnId(conn) => nonce,
        other => panic!("expected a challenge to conn-{conn}, got {other:?}"),
    }
}

/// The node's proof of `token` for `hello` and the registry's `challenge`.
pub(super) fn proof_for(
    token: &str,
    hello: &Hello,
    challenge: &crate::auth::Nonce,
) -> crate::auth::Proof {
    let identity = wire::member_identity(&hello.member);
    let transcript = wire::transcript(&hello.nonce, challenge, &identity);
    crate::auth::prove(token, crate::auth::Role::Dialer, &transcript)
}

/// A whole handshake on `conn` proving `token`: the hello, the challenge, the proof.
fn admit_with(
    registry: &mut Registry,
    now: Instant,
    conn: u64,
    member: MemberInfo,
    token: &str,
) -> Result<(), HelloRefused> {
    let hello = hello(member);
    registry.handle_hello(now, ConnId(conn), hello.clone())?;
    let challenge = challenge_of(registry, conn);
    registry.handle_proof(now, ConnId(conn), proof_for(token, &hello, &challenge))
}

pub(super) fn admit(
    registry: &mut Registry,
    now: Instant,
    conn: u64,
    member: MemberInfo,
) -> Result<(), HelloRefused> {
    admit_with(registry, now, conn, member, TOKEN)
}

pub(super) fn sizes(n: u64) -> ObjectSizes {
    ObjectSizes {
        data_size: n,
        metadata_size: 0,
    }
}

/// The digest of the `n`-byte object these tests publish as `sizes(n)`.
pub(super) fn digest(n: u64) -> ContentDigest {
    ContentDigest::of(&vec![n as u8; n as usize], &[])
}

pub(super) fn at_ms(ms: u64) -> Instant {
    Instant(ms * 1_000_000)
}

pub(super) fn registry() -> Registry {
    let mut config = RegistryConfig::new(TOKEN, NONCE_KEY);
    config.heartbeat_timeout = Duration::from_millis(100);
    Registry::new(config)
}

/// Everything the registry queued, with member lists flattened per connection.
pub(super) fn drain(registry: &mut Registry) -> Vec<(ConnId, FromRegistry)> {
    let mut out = Vec::new();
    while let Some(output) = registry.poll_output() {
        match output {
            RegistryOutput::Send { conn, message } => out.push((conn, message)),
            RegistryOutput::SendMembers {
                conns,
                members,
                epoch,
            } => {
                for conn in conns {
                    out.push((
                        conn,
                        FromRegistry::Members {
                            epoch,
                            members: members.clone(),
                        },
                    ));
                }
            }
            RegistryOutput::Close { conn, reason } => out.push((
                conn,
                FromRegistry::Refused {
                    reason: format!("closed: {reason}"),
                    retryable: false,
                },
            )),
        }
    }
    registry.check_invariants();
    out
}

pub(super) fn request(
    registry: &mut Registry,
    now: Instant,
    conn: u64,
    op: u64,
    request: DirectoryRequest,
) -> Vec<(ConnId, FromRegistry)> {
    registry
        .handle_request(now, ConnId(conn), WireOpId(op), request)
        .expect("a member's connection");
    drain(registry)
}

pub(super) fn events_for(out: &[(ConnId, FromRegistry)], conn: u64) -> Vec<DirectoryEvent> {
    out.iter()
        .filter_map(|(c, m)| match m {
            FromRegistry::Event(e) if *c == ConnId(conn) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

pub(super) fn join(registry: &mut Registry, now: Instant, conn: u64, node: u32) {
    admit(registry, now, conn, member(node, 1)).expect("joins");
    drain(registry);
}

#[test]
fn publish_then_lookup_lists_the_holder_and_withdraw_removes_it() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(1);
    let out = request(
        &mut r,
        at_ms(1),
        1,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(5),
            digest: digest(5),
        },
    );
    assert_eq!(
        out,
        vec![(
            ConnId(1),
            FromRegistry::Reply {
                op: WireOpId(0),
                reply: DirectoryReply::Done
            }
        )]
    );
    let out = request(
        &mut r,
        at_ms(1),
        2,
        0,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: false,
        },
    );
    assert_eq!(
        out[0].1,
        FromRegistry::Reply {
            op: WireOpId(0),
            reply: DirectoryReply::Located {
                holders: vec![NodeId(1)],
                sizes: Some(sizes(5)),
                digest: Some(digest(5)),
            }
        }
    );
    request(&mut r, at_ms(2), 1, 1, DirectoryRequest::Withdraw { id: x });
    assert!(r.holders_of(&x).is_empty());
}

/// The registry's one reply to a `Publish` of `id` by the member on `conn`.
fn publish_reply(
    r: &mut Registry,
    conn: u64,
    op: u64,
    id: ObjectId,
    sizes: ObjectSizes,
    digest: ContentDigest,
) -> DirectoryReply {
    let out = request(
        r,
        at_ms(1),
        conn,
        op,
        DirectoryRequest::Publish { id, sizes, digest },
    );
    match out.as_slice() {
        [(c, FromRegistry::Reply { op: o, reply })] if *c == ConnId(conn) && *o == WireOpId(op) => {
            reply.clone()
        }
        other => panic!("expected one reply, got {other:?}"),
    }
}

/// A holder whose withdrawal was lost (cut off from the head) and that put the id again with
/// other bytes publishes them: refused, since another node holds the listed content, and no
/// longer listed as a holder of that content, which it does not have any more.
#[test]
fn a_listed_holder_that_publishes_another_content_is_refused_and_no_longer_listed() {
    let mut r = registry();
    for node in 1..=2 {
        join(&mut r, at_ms(0), node as u64, node);
    }
    let x = ObjectId::from_u64(1);
    let (first, second) = (
        ContentDigest::of(b"the first bytes", &[]),
        ContentDigest::of(b"other bytes now", &[]),
    );
    for (conn, op) in [(1, 0), (2, 0)] {
        assert_eq!(
            publish_reply(&mut r, conn, op, x, sizes(15), first),
            DirectoryReply::Done
        );
    }
    assert_eq!(r.holders_of(&x), vec![NodeId(1), NodeId(2)]);
    assert_eq!(
        publish_reply(&mut r, 1, 1, x, sizes(15), second),
        DirectoryReply::Conflict {
            sizes: sizes(15),
            digest: first,
        }
    );
    assert_eq!(
        r.holders_of(&x),
        vec![NodeId(2)],
        "node 1 no longer holds the listed content"
    );
}

#[test]
fn a_publish_of_an_id_held_with_another_content_is_refused_and_lists_nobody() {
    let mut r = registry();
    for node in 1..=3 {
        join(&mut r, at_ms(0), node as u64, node);
    }
    let x = ObjectId::from_u64(1);
    let (ours, theirs) = (
        ContentDigest::of(b"node 1 wrote this", &[]),
        ContentDigest::of(b"node 2 wrote that", &[]),
    );
    assert_eq!(
        publish_reply(&mut r, 1, 0, x, sizes(17), ours),
        DirectoryReply::Done
    );
    let conflict = DirectoryReply::Conflict {
        sizes: sizes(17),
        digest: ours,
    };
    assert_eq!(
        publish_reply(&mut r, 2, 0, x, sizes(17), theirs),
        conflict,
        "same sizes, other bytes"
    );
    assert_eq!(
        publish_reply(&mut r, 3, 0, x, sizes(18), ours),
        conflict,
        "other sizes are another content even with the digest"
    );
    assert_eq!(
        r.holders_of(&x),
        vec![NodeId(1)],
        "the refused are not listed"
    );
    // A lookup names the accepted content only.
    let out = request(
        &mut r,
        at_ms(1),
        3,
        1,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: false,
        },
    );
    assert_eq!(
        out[0].1,
        FromRegistry::Reply {
            op: WireOpId(1),
            reply: DirectoryReply::Located {
                holders: vec![NodeId(1)],
                sizes: Some(sizes(17)),
                digest: Some(ours),
            }
        }
    );
    // Once its last holder leaves, the id may name another content.
    r.handle_disconnect(at_ms(2), ConnId(1));
    drain(&mut r);
    assert_eq!(
        publish_reply(&mut r, 2, 1, x, sizes(17), theirs),
        DirectoryReply::Done
    );
    assert_eq!(r.holders_of(&x), vec![NodeId(2)]);
}

#[test]
fn the_same_content_from_a_second_node_is_accepted_and_fires_no_conflict() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(1);
    let d = ContentDigest::of(&[7; 40], &[1, 2, 3]);
    let s = ObjectSizes {
        data_size: 40,
        metadata_size: 3,
    };
    assert_eq!(publish_reply(&mut r, 1, 0, x, s, d), DirectoryReply::Done);
    assert_eq!(publish_reply(&mut r, 2, 0, x, s, d), DirectoryReply::Done);
    // Publishing it again changes nothing.
    assert_eq!(publish_reply(&mut r, 2, 1, x, s, d), DirectoryReply::Done);
    assert_eq!(r.holders_of(&x), vec![NodeId(1), NodeId(2)]);
}

#[test]
fn a_refused_publication_is_not_replayed_to_a_registry_that_lost_its_state() {
    let mut r = registry();
    join(&mut r, at_ms(0), 9, 2);
    let x = ObjectId::from_u64(1);
    let (theirs, ours) = (digest(1), ContentDigest::of(&[2], &[]));
    assert_eq!(
        publish_reply(&mut r, 9, 0, x, sizes(1), theirs),
        DirectoryReply::Done
    );
    let now = at_ms(0);
    let (mut s, _) = joined_session(session_config(), &mut r, now);
    s.handle_submit(
        now,
        DirectoryOpId(1),
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: ours,
        },
    );
    let notices = exchange(&mut s, &mut r, 1, now);
    assert!(
        notices.contains(&DirectoryNotice::Reply {
            op: DirectoryOpId(1),
            reply: DirectoryReply::Conflict {
                sizes: sizes(1),
                digest: theirs,
            },
        }),
        "{notices:?}"
    );
    assert!(
        s.replay_state().publications.is_empty(),
        "nothing to replay"
    );
}

#[test]
fn a_publish_after_a_subscribing_lookup_that_found_nothing_reaches_the_subscriber_once() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(2);
    let out = request(
        &mut r,
        at_ms(1),
        2,
        7,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: true,
        },
    );
    assert_eq!(
        out[0].1,
        FromRegistry::Reply {
            op: WireOpId(7),
            reply: DirectoryReply::Located {
                holders: vec![],
                sizes: None,
                digest: None,
            }
        }
    );
    assert!(r.is_subscribed(NodeId(2), &x));
    let out = request(
        &mut r,
        at_ms(2),
        1,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(3),
            digest: digest(3),
        },
    );
    let fired = DirectoryEvent::Published {
        id: x,
        holder: NodeId(1),
        sizes: sizes(3),
        digest: digest(3),
    };
    assert_eq!(events_for(&out, 2), vec![fired]);
    // One-shot: a second publication (by another node) does not fire again.
    join(&mut r, at_ms(2), 3, 3);
    let out = request(
        &mut r,
        at_ms(3),
        3,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(3),
            digest: digest(3),
        },
    );
    assert!(events_for(&out, 2).is_empty());
}

#[test]
fn unsubscribe_drops_the_subscription() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(3);
    request(
        &mut r,
        at_ms(1),
        2,
        0,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: true,
        },
    );
    let out = request(
        &mut r,
        at_ms(1),
        2,
        1,
        DirectoryRequest::Unsubscribe { id: x },
    );
    assert!(out.is_empty(), "unsubscribe has no reply: {out:?}");
    let out = request(
        &mut r,
        at_ms(2),
        1,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    assert!(events_for(&out, 2).is_empty());
}

#[test]
fn a_silent_node_dies_at_the_heartbeat_bound_and_its_locations_vanish() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(4);
    request(
        &mut r,
        at_ms(10),
        1,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    // Node 2 keeps pinging; node 1 goes silent after 10 ms.
    r.handle_ping(at_ms(90), ConnId(2), 1).unwrap();
    drain(&mut r);
    assert_eq!(r.poll_timeout(), Some(at_ms(110)));
    r.handle_timeout(at_ms(109));
    assert_eq!(
        r.holders_of(&x),
        vec![NodeId(1)],
        "early timeout is a no-op"
    );
    r.handle_timeout(at_ms(110));
    let out = drain(&mut r);
    assert!(r.holders_of(&x).is_empty());
    assert_eq!(r.members(), vec![member(2, 1)]);
    assert!(out.iter().any(|(c, m)| *c == ConnId(2)
        && matches!(m, FromRegistry::Members { members, .. } if members[..] == [member(2, 1)])));
    assert!(r.handle_ping(at_ms(111), ConnId(1), 2).is_err());
}

#[test]
fn a_node_heard_from_just_after_its_deadline_was_filed_lives_until_a_timeout_after_that() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    // 3 ms on: less than a sixteenth of the 100 ms timeout, so the filed deadline stays at
    // 100 ms while the real one moves to 103 ms.
    r.handle_ping(at_ms(3), ConnId(1), 1).unwrap();
    drain(&mut r);
    assert_eq!(r.poll_timeout(), Some(at_ms(100)), "the filed deadline");
    r.handle_timeout(at_ms(100));
    drain(&mut r);
    assert_eq!(
        r.members(),
        vec![member(1, 1)],
        "alive past the filed deadline"
    );
    assert_eq!(
        r.poll_timeout(),
        Some(at_ms(103)),
        "filed again under the real one"
    );
    r.handle_timeout(Instant(at_ms(103).0 - 1));
    assert_eq!(r.members(), vec![member(1, 1)]);
    r.handle_timeout(at_ms(103));
    drain(&mut r);
    assert!(
        r.members().is_empty(),
        "dead a timeout after it was last heard from"
    );
}

#[test]
fn a_disconnect_drops_the_member_with_its_locations_and_subscriptions() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    let x = ObjectId::from_u64(5);
    let y = ObjectId::from_u64(6);
    request(
        &mut r,
        at_ms(1),
        1,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    request(
        &mut r,
        at_ms(1),
        1,
        1,
        DirectoryRequest::Lookup {
            id: y,
            subscribe: true,
        },
    );
    r.handle_disconnect(at_ms(2), ConnId(1));
    drain(&mut r);
    assert!(r.members().is_empty());
    assert!(r.holders_of(&x).is_empty());
    assert!(!r.is_subscribed(NodeId(1), &y));
}

#[test]
fn wrong_token_and_bad_hellos_are_refused_and_closed() {
    let mut r = registry();
    assert_eq!(
        admit_with(&mut r, at_ms(0), 1, member(1, 1), "nope"),
        Err(HelloRefused::WrongToken)
    );
    let out = drain(&mut r);
    assert!(
        matches!(&out[0].1, FromRegistry::Refused { reason, retryable: false } if reason.contains("wrong cluster token"))
    );
    assert_eq!(out.len(), 2, "refused, then closed: {out:?}");
    let mut old = hello(member(1, 1));
    old.version = 0;
    assert!(matches!(
        r.handle_hello(at_ms(0), ConnId(2), old),
        Err(HelloRefused::Version { .. })
    ));
    let mut stray = hello(member(1, 1));
    stray.magic = *b"GET / HT";
    assert_eq!(
        r.handle_hello(at_ms(0), ConnId(3), stray),
        Err(HelloRefused::NotAHello)
    );
    assert!(r.members().is_empty());
    assert!(r
        .handle_request(
            at_ms(0),
            ConnId(1),
            WireOpId(0),
            DirectoryRequest::Withdraw {
                id: ObjectId::from_u64(1)
            }
        )
        .is_err());
}

#[test]
fn a_live_node_id_from_another_daemon_is_refused_retryably() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    let mut other = member(1, 2);
    other.fabric_addr = SocketAddr::from(([127, 0, 0, 2], 7001));
    let refusal = admit(&mut r, at_ms(1), 2, other).unwrap_err();
    assert!(refusal.retryable());
    assert!(
        refusal.to_string().contains("already a member"),
        "{refusal}"
    );
    assert_eq!(r.members(), vec![member(1, 1)]);
    drain(&mut r);
    // An older incarnation at the same address is stale, not retryable.
    join(&mut r, at_ms(1), 3, 2);
    admit(&mut r, at_ms(1), 4, member(2, 1)).unwrap();
    drain(&mut r);
    let mut restarted = member(2, 5);
    restarted.node = NodeId(2);
    admit(&mut r, at_ms(2), 5, restarted).unwrap();
    drain(&mut r);
    let stale = admit(&mut r, at_ms(3), 6, member(2, 3)).unwrap_err();
    assert!(!stale.retryable());
}

#[test]
fn a_restart_with_a_new_incarnation_drops_the_old_incarnations_state() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(7);
    let y = ObjectId::from_u64(8);
    request(
        &mut r,
        at_ms(1),
        1,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    request(
        &mut r,
        at_ms(1),
        1,
        1,
        DirectoryRequest::Lookup {
            id: y,
            subscribe: true,
        },
    );
    admit(&mut r, at_ms(2), 3, member(1, 2)).expect("a restart is accepted");
    let out = drain(&mut r);
    assert!(
        out.iter().any(|(c, m)| *c == ConnId(1)
            && matches!(m, FromRegistry::Refused { reason, .. } if reason.starts_with("closed"))),
        "{out:?}"
    );
    assert!(r.holders_of(&x).is_empty());
    assert!(!r.is_subscribed(NodeId(1), &y));
    assert_eq!(r.member(NodeId(1)).map(|m| m.incarnation), Some(2));
    // The old connection is no member's any more.
    assert!(r.handle_ping(at_ms(3), ConnId(1), 1).is_err());
    // A publication of y now reaches nobody on the old incarnation.
    let out = request(
        &mut r,
        at_ms(3),
        2,
        0,
        DirectoryRequest::Publish {
            id: y,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    assert!(events_for(&out, 1).is_empty() && events_for(&out, 3).is_empty());
}

#[test]
fn the_same_daemon_reconnecting_keeps_its_registration() {
    let mut r = registry();
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(9);
    request(
        &mut r,
        at_ms(1),
        1,
        0,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: true,
        },
    );
    admit(&mut r, at_ms(2), 3, member(1, 1)).unwrap();
    drain(&mut r);
    assert_eq!(r.connection_of(NodeId(1)), Some(ConnId(3)));
    assert!(r.is_subscribed(NodeId(1), &x));
    let out = request(
        &mut r,
        at_ms(3),
        2,
        0,
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    assert_eq!(
        events_for(&out, 3).len(),
        1,
        "the event goes to the new connection"
    );
}

#[test]
fn limits_answer_unavailable() {
    let mut config = RegistryConfig::new(TOKEN, NONCE_KEY);
    config.limits.max_subscriptions_per_node = 1;
    config.limits.max_publications_per_node = 1;
    config.limits.max_nodes = 1;
    let mut r = Registry::new(config);
    join(&mut r, at_ms(0), 1, 1);
    assert!(matches!(
        admit(&mut r, at_ms(0), 2, member(2, 1)),
        Err(HelloRefused::Full { max_nodes: 1 })
    ));
    drain(&mut r);
    let (a, b) = (ObjectId::from_u64(1), ObjectId::from_u64(2));
    request(
        &mut r,
        at_ms(1),
        1,
        0,
        DirectoryRequest::Lookup {
            id: a,
            subscribe: true,
        },
    );
    let out = request(
        &mut r,
        at_ms(1),
        1,
        1,
        DirectoryRequest::Lookup {
            id: b,
            subscribe: true,
        },
    );
    assert!(matches!(
        &out[0].1,
        FromRegistry::Reply {
            reply: DirectoryReply::Unavailable { .. },
            ..
        }
    ));
    request(
        &mut r,
        at_ms(1),
        1,
        2,
        DirectoryRequest::Publish {
            id: a,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    let out = request(
        &mut r,
        at_ms(1),
        1,
        3,
        DirectoryRequest::Publish {
            id: b,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    assert!(matches!(
        &out[0].1,
        FromRegistry::Reply {
            reply: DirectoryReply::Unavailable { .. },
            ..
        }
    ));
}

// ---- Session ----

pub(super) fn session_config() -> SessionConfig {
    SessionConfig {
        heartbeat_interval: Duration::from_millis(10),
        heartbeat_timeout: Duration::from_millis(50),
        reconnect_backoff_min: Duration::from_millis(5),
        reconnect_backoff_max: Duration::from_millis(40),
        ..SessionConfig::default()
    }
}

pub(super) fn drain_session(session: &mut DirectorySession) -> Vec<SessionOutput> {
    std::iter::from_fn(|| session.poll_output()).collect()
}

/// Carries a session's messages to the registry and back until both are quiet; returns the
/// session's notices.
pub(super) fn exchange(
    session: &mut DirectorySession,
    r: &mut Registry,
    conn: u64,
    now: Instant,
) -> Vec<DirectoryNotice> {
    exchange_logged(session, r, conn, now, &mut Vec::new())
}

/// As [`exchange`], also logging every message the registry took, with when and on which
/// connection (what a replica of the registry receives).
fn exchange_logged(
    session: &mut DirectorySession,
    r: &mut Registry,
    conn: u64,
    now: Instant,
    log: &mut Vec<(Instant, ConnId, ToRegistry)>,
) -> Vec<DirectoryNotice> {
    let mut notices = Vec::new();
    loop {
        let mut progressed = false;
        for output in drain_session(session) {
            progressed = true;
            match output {
                SessionOutput::Send(message) => {
                    log.push((now, ConnId(conn), message.clone()));
                    let _ = r.handle_message(now, ConnId(conn), message);
                }
                SessionOutput::Notice(n) => notices.push(n),
                SessionOutput::Connect => session.handle_connected(now),
                SessionOutput::Disconnect { .. } => r.handle_disconnect(now, ConnId(conn)),
            }
        }
        for (c, message) in drain(r) {
            progressed = true;
            if c == ConnId(conn) {
                let _ = session.handle_message(now, message);
            }
        }
        if !progressed {
            return notices;
        }
    }
}

/// Node 1's session, joined to `r` on connection 1, and what it noticed joining.
pub(super) fn joined_session(
    config: SessionConfig,
    r: &mut Registry,
    now: Instant,
) -> (DirectorySession, Vec<DirectoryNotice>) {
    let mut s = DirectorySession::new(config, member(1, 1), TOKEN.into(), NONCE_KEY, now);
    s.handle_timeout(now);
    let notices = exchange(&mut s, r, 1, now);
    (s, notices)
}

#[test]
fn a_session_replays_its_state_to_a_registry_that_lost_it() {
    let mut r = registry();
    let now = at_ms(0);
    let (mut s, notices) = joined_session(session_config(), &mut r, now);
    assert!(notices.contains(&DirectoryNotice::Health(Ok(()))));
    let (x, y) = (ObjectId::from_u64(1), ObjectId::from_u64(2));
    s.handle_submit(
        now,
        DirectoryOpId(1),
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    s.handle_submit(
        now,
        DirectoryOpId(2),
        DirectoryRequest::Lookup {
            id: y,
            subscribe: true,
        },
    );
    exchange(&mut s, &mut r, 1, now);
    assert!(r.is_subscribed(NodeId(1), &y));

    // The head restarts with nothing; the session notices the silence, backs off, reconnects.
    let mut r = registry();
    let later = at_ms(60);
    s.handle_timeout(later);
    let notices = exchange(&mut s, &mut r, 2, later);
    assert!(
        matches!(notices.as_slice(), [DirectoryNotice::Health(Err(_))]),
        "{notices:?}"
    );
    s.handle_submit(
        later,
        DirectoryOpId(3),
        DirectoryRequest::Lookup {
            id: x,
            subscribe: false,
        },
    );
    assert!(matches!(
        drain_session(&mut s).as_slice(),
        [SessionOutput::Notice(DirectoryNotice::Reply {
            reply: DirectoryReply::Unavailable { .. },
            ..
        })]
    ));
    let retry = s.poll_timeout().expect("a retry is scheduled");
    s.handle_timeout(retry);
    exchange(&mut s, &mut r, 2, retry);
    assert_eq!(r.holders_of(&x), vec![NodeId(1)]);
    assert!(r.is_subscribed(NodeId(1), &y));
}

#[test]
fn a_replayed_lookup_fires_a_subscription_published_while_away_exactly_once() {
    let mut r = registry();
    join(&mut r, at_ms(0), 9, 2);
    let now = at_ms(0);
    let (mut s, _) = joined_session(session_config(), &mut r, now);
    let y = ObjectId::from_u64(2);
    s.handle_submit(
        now,
        DirectoryOpId(1),
        DirectoryRequest::Lookup {
            id: y,
            subscribe: true,
        },
    );
    exchange(&mut s, &mut r, 1, now);
    // The connection breaks; y is published meanwhile (the push is lost with the connection).
    r.handle_disconnect(at_ms(1), ConnId(1));
    s.handle_disconnected(at_ms(1), "reset");
    drain_session(&mut s);
    request(
        &mut r,
        at_ms(2),
        9,
        0,
        DirectoryRequest::Publish {
            id: y,
            sizes: sizes(4),
            digest: digest(4),
        },
    );
    let retry = s.poll_timeout().unwrap();
    s.handle_timeout(retry);
    let notices = exchange(&mut s, &mut r, 3, retry);
    let fired: Vec<_> = notices
        .iter()
        .filter(|n| matches!(n, DirectoryNotice::Event(_)))
        .collect();
    assert_eq!(fired.len(), 1, "{notices:?}");
    assert!(!s.waits_for(&y));
}

#[test]
fn a_withdrawal_is_made_again_after_a_reconnect_until_the_registry_answers_it() {
    let mut r = registry();
    let now = at_ms(0);
    let (mut s, _) = joined_session(session_config(), &mut r, now);
    let (x, y) = (ObjectId::from_u64(1), ObjectId::from_u64(2));
    for (op, id) in [(1, x), (2, y)] {
        s.handle_submit(
            now,
            DirectoryOpId(op),
            DirectoryRequest::Publish {
                id,
                sizes: sizes(1),
                digest: digest(1),
            },
        );
    }
    exchange(&mut s, &mut r, 1, now);
    // x's withdrawal is in flight when the link breaks (the registry keeps the registration);
    // y is withdrawn while the link is down, then published again.
    s.handle_submit(now, DirectoryOpId(3), DirectoryRequest::Withdraw { id: x });
    drain_session(&mut s);
    s.handle_disconnected(at_ms(1), "reset");
    s.handle_submit(
        at_ms(1),
        DirectoryOpId(4),
        DirectoryRequest::Withdraw { id: y },
    );
    s.handle_submit(
        at_ms(1),
        DirectoryOpId(5),
        DirectoryRequest::Publish {
            id: y,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    drain_session(&mut s);
    assert_eq!(
        s.replay_state().withdrawals.keys().collect::<Vec<_>>(),
        [&x]
    );
    assert_eq!(r.holders_of(&x), vec![NodeId(1)], "the withdrawal was lost");

    let retry = s.poll_timeout().expect("a retry is scheduled");
    s.handle_timeout(retry);
    exchange(&mut s, &mut r, 2, retry);
    assert!(r.holders_of(&x).is_empty(), "withdrawn again");
    assert_eq!(r.holders_of(&y), vec![NodeId(1)], "published again last");
    assert!(s.replay_state().withdrawals.is_empty(), "answered");
}

#[test]
fn a_withdrawal_a_failed_over_registry_lost_is_made_again_after_the_reconnect() {
    let mut master = registry();
    let mut log = Vec::new();
    let now = at_ms(0);
    let mut s = DirectorySession::new(session_config(), member(1, 1), TOKEN.into(), NONCE_KEY, now);
    s.handle_timeout(now);
    exchange_logged(&mut s, &mut master, 1, now, &mut log);
    let x = ObjectId::from_u64(1);
    s.handle_submit(
        now,
        DirectoryOpId(1),
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    exchange_logged(&mut s, &mut master, 1, now, &mut log);
    // What the replica received before its master died: not the withdrawal, which the master
    // answered.
    let replicated = log.len();
    s.handle_submit(
        at_ms(1),
        DirectoryOpId(2),
        DirectoryRequest::Withdraw { id: x },
    );
    exchange_logged(&mut s, &mut master, 1, at_ms(1), &mut log);
    assert!(master.holders_of(&x).is_empty());

    // The master dies; its replica, promoted, knows node 1 and lists it as holding x.
    let mut replica = registry();
    for (at, conn, message) in log.drain(..replicated) {
        let _ = replica.handle_message(at, conn, message);
        drain(&mut replica);
    }
    assert_eq!(replica.holders_of(&x), vec![NodeId(1)]);
    s.handle_disconnected(at_ms(2), "connection reset");
    drain_session(&mut s);
    let retry = s.poll_timeout().expect("a retry is scheduled");
    s.handle_timeout(retry);
    exchange(&mut s, &mut replica, 2, retry);
    assert_eq!(replica.connection_of(NodeId(1)), Some(ConnId(2)));
    assert!(replica.holders_of(&x).is_empty(), "withdrawn again");
}

#[test]
fn session_backoff_doubles_to_its_cap_and_resets_after_a_welcome() {
    let mut s = DirectorySession::new(
        session_config(),
        member(1, 1),
        TOKEN.into(),
        NONCE_KEY,
        at_ms(0),
    );
    let mut now = at_ms(0);
    let mut delays = Vec::new();
    for _ in 0..5 {
        s.handle_timeout(now);
        assert_eq!(drain_session(&mut s), vec![SessionOutput::Connect]);
        s.handle_connect_failed(now, "refused");
        let next = s.poll_timeout().unwrap();
        delays.push((next - now).as_millis());
        now = next;
    }
    assert_eq!(delays, vec![5, 10, 20, 40, 40]);
}

#[test]
fn after_a_reconnect_health_comes_once_the_replay_is_answered_then_the_members() {
    let mut r = registry();
    let now = at_ms(0);
    let (mut s, _) = joined_session(session_config(), &mut r, now);
    let x = ObjectId::from_u64(1);
    s.handle_submit(
        now,
        DirectoryOpId(1),
        DirectoryRequest::Publish {
            id: x,
            sizes: sizes(1),
            digest: digest(1),
        },
    );
    exchange(&mut s, &mut r, 1, now);
    r.handle_disconnect(at_ms(1), ConnId(1));
    drain(&mut r);
    s.handle_disconnected(at_ms(1), "reset");
    assert!(matches!(
        drain_session(&mut s).as_slice(),
        [SessionOutput::Notice(DirectoryNotice::Health(Err(_)))]
    ));
    let retry = s.poll_timeout().unwrap();
    s.handle_timeout(retry);
    assert_eq!(drain_session(&mut s), vec![SessionOutput::Connect]);
    s.handle_connected(retry);
    for output in drain_session(&mut s) {
        if let SessionOutput::Send(message) = output {
            r.handle_message(retry, ConnId(2), message).unwrap();
        }
    }
    // The challenge arrives and the proof goes back.
    for (_, message) in drain(&mut r) {
        s.handle_message(retry, message).unwrap();
    }
    for output in drain_session(&mut s) {
        assert!(
            matches!(output, SessionOutput::Send(ToRegistry::Proof(_))),
            "{output:?}"
        );
        if let SessionOutput::Send(message) = output {
            r.handle_message(retry, ConnId(2), message).unwrap();
        }
    }
    // Welcome and member list arrive; the replayed publish goes out, no Health yet.
    for (_, message) in drain(&mut r) {
        s.handle_message(retry, message).unwrap();
    }
    let replay = drain_session(&mut s);
    assert!(
        replay
            .iter()
            .all(|o| matches!(o, SessionOutput::Send(ToRegistry::Reclaim { .. }))),
        "{replay:?}"
    );
    assert!(s.replaying());
    for output in replay {
        if let SessionOutput::Send(message) = output {
            r.handle_message(retry, ConnId(2), message).unwrap();
        }
    }
    for (_, message) in drain(&mut r) {
        s.handle_message(retry, message).unwrap();
    }
    // The replay is answered: Health(Ok), then the list.
    assert_eq!(
        drain_session(&mut s),
        vec![
            SessionOutput::Notice(DirectoryNotice::Health(Ok(()))),
            SessionOutput::Notice(DirectoryNotice::Members(vec![member(1, 1)].into())),
        ]
    );
    assert_eq!(r.holders_of(&x), vec![NodeId(1)]);
}

#[test]
fn a_replayed_proof_gets_no_session_and_no_proof_is_given_to_a_caller_without_the_token() {
    let mut r = registry();
    // An honest node joins; an eavesdropper records its hello and proof.
    let honest = hello(member(1, 1));
    r.handle_hello(at_ms(0), ConnId(1), honest.clone()).unwrap();
    let first_challenge = challenge_of(&mut r, 1);
    let recorded = proof_for(TOKEN, &honest, &first_challenge);
    r.handle_proof(at_ms(0), ConnId(1), recorded).unwrap();
    drain(&mut r);
    r.handle_disconnect(at_ms(1), ConnId(1));
    drain(&mut r);
    // Replayed on a new connection, the proof fails against the new challenge.
    r.handle_hello(at_ms(2), ConnId(2), honest.clone()).unwrap();
    let second_challenge = challenge_of(&mut r, 2);
    assert_ne!(first_challenge, second_challenge);
    assert_eq!(
        r.handle_proof(at_ms(2), ConnId(2), recorded),
        Err(HelloRefused::WrongToken)
    );
    let out = drain(&mut r);
    assert!(
        out.iter()
            .all(|(_, m)| !matches!(m, FromRegistry::Welcome { .. })),
        "no welcome, so no proof of the registry's, for a wrong proof: {out:?}"
    );
    assert!(r.members().is_empty());
    // A proof with no hello before it, and a request before the proof, are refused.
    assert_eq!(
        r.handle_proof(at_ms(3), ConnId(3), recorded),
        Err(HelloRefused::UnexpectedProof)
    );
    drain(&mut r);
    r.handle_hello(at_ms(3), ConnId(4), hello(member(2, 1)))
        .unwrap();
    challenge_of(&mut r, 4);
    assert!(r.handle_ping(at_ms(3), ConnId(4), 1).is_err());
    // A disconnect forgets the pending handshake.
    r.handle_disconnect(at_ms(3), ConnId(4));
    r.check_invariants();
}

#[test]
fn handshakes_waiting_for_proofs_are_bounded() {
    let mut config = RegistryConfig::new(TOKEN, NONCE_KEY);
    config.limits.max_handshakes = 2;
    let mut r = Registry::new(config);
    for conn in 1..=2 {
        r.handle_hello(at_ms(0), ConnId(conn), hello(member(conn as u32, 1)))
            .unwrap();
    }
    let refusal = r
        .handle_hello(at_ms(0), ConnId(3), hello(member(3, 1)))
        .unwrap_err();
    assert!(refusal.retryable(), "{refusal}");
    drain(&mut r);
}

#[test]
fn a_session_drops_a_registry_that_cannot_prove_the_token() {
    let mut impostor = Registry::new(RegistryConfig::new("another token", NONCE_KEY));
    let now = at_ms(0);
    let mut s = DirectorySession::new(session_config(), member(1, 1), TOKEN.into(), NONCE_KEY, now);
    s.handle_timeout(now);
    assert_eq!(drain_session(&mut s), vec![SessionOutput::Connect]);
    s.handle_connected(now);
    let Some(SessionOutput::Send(ToRegistry::Hello(h))) = drain_session(&mut s).pop() else {
        panic!("a hello");
    };
    assert!(h.legacy_token.is_empty(), "the token never travels");
    impostor.handle_hello(now, ConnId(1), h.clone()).unwrap();
    let challenge = challenge_of(&mut impostor, 1);
    s.handle_message(now, FromRegistry::Challenge { nonce: challenge })
        .unwrap();
    drain_session(&mut s);
    // The impostor cannot make the registry's proof: a welcome with any other proof (here
    // one made with its own token) ends the attempt.
    let identity = wire::member_identity(&h.member);
    let transcript = wire::transcript(&h.nonce, &challenge, &identity);
    let forged = crate::auth::prove("another token", crate::auth::Role::Acceptor, &transcript);
    assert_eq!(
        s.handle_message(
            now,
            FromRegistry::Welcome {
                version: PROTOCOL_VERSION,
                proof: forged
            }
        ),
        Err(SessionError::Unproven)
    );
    assert!(!s.is_up());
    assert!(drain_session(&mut s)
        .iter()
        .any(|o| matches!(o, SessionOutput::Disconnect { .. })));
}

#[test]
fn shared_objects_keep_every_holder_and_a_leaving_member_takes_only_its_own() {
    let mut config = RegistryConfig::new(TOKEN, NONCE_KEY);
    config.limits.max_publications_per_node = 2;
    let mut r = Registry::new(config);
    join(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    let (x, y, z) = (
        ObjectId::from_u64(1),
        ObjectId::from_u64(2),
        ObjectId::from_u64(3),
    );
    let publish = |r: &mut Registry, conn: u64, op: u64, id: ObjectId, n: u64| {
        let out = request(
            r,
            at_ms(1),
            conn,
            op,
            DirectoryRequest::Publish {
                id,
                sizes: sizes(n),
                digest: digest(n),
            },
        );
        match &out[0].1 {
            FromRegistry::Reply { reply, .. } => reply.clone(),
            other => panic!("expected a reply, got {other:?}"),
        }
    };
    assert_eq!(publish(&mut r, 2, 0, x, 7), DirectoryReply::Done);
    assert_eq!(publish(&mut r, 1, 0, x, 7), DirectoryReply::Done);
    assert_eq!(publish(&mut r, 1, 1, y, 8), DirectoryReply::Done);
    // Publishing again counts once: node 1 still has room for nothing new, but x again is fine.
    assert_eq!(publish(&mut r, 1, 2, x, 7), DirectoryReply::Done);
    assert!(matches!(
        publish(&mut r, 1, 3, z, 9),
        DirectoryReply::Unavailable { .. }
    ));
    assert_eq!(r.holders_of(&x), vec![NodeId(1), NodeId(2)]);
    // The id's one content answers a lookup.
    let out = request(
        &mut r,
        at_ms(1),
        2,
        1,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: false,
        },
    );
    assert!(matches!(
        &out[0].1,
        FromRegistry::Reply {
            reply: DirectoryReply::Located { holders, sizes: Some(s), digest: Some(d) },
            ..
        } if *holders == vec![NodeId(1), NodeId(2)] && s.data_size == 7 && *d == digest(7)
    ));
    // A withdrawal frees room; withdrawing what is not listed changes nothing.
    request(&mut r, at_ms(1), 1, 4, DirectoryRequest::Withdraw { id: y });
    request(&mut r, at_ms(1), 1, 5, DirectoryRequest::Withdraw { id: y });
    assert_eq!(publish(&mut r, 1, 6, z, 9), DirectoryReply::Done);
    // Node 1 leaves: x keeps node 2, z is gone.
    r.handle_disconnect(at_ms(2), ConnId(1));
    drain(&mut r);
    assert_eq!(r.holders_of(&x), vec![NodeId(2)]);
    assert!(r.holders_of(&z).is_empty());
    assert_eq!(r.locations().count(), 1);
}

#[test]
fn a_session_follows_member_changes_from_its_list_and_drops_a_change_from_another() {
    use super::member_changes::MemberChange;
    let mut r = registry();
    let now = at_ms(0);
    let (mut s, notices) = joined_session(session_config(), &mut r, now);
    assert!(notices.contains(&DirectoryNotice::Members(vec![member(1, 1)].into())));
    // Node 1's own join made list 1; node 2 joins (list 2), then leaves (list 3).
    let joined = FromRegistry::MembersChanged {
        from: 1,
        to: 2,
        changes: vec![MemberChange::Listed(member(2, 1))].into(),
    };
    s.handle_message(now, joined).unwrap();
    let left = FromRegistry::MembersChanged {
        from: 2,
        to: 3,
        changes: vec![MemberChange::Left(NodeId(2))].into(),
    };
    s.handle_message(now, left).unwrap();
    assert_eq!(
        drain_session(&mut s),
        vec![
            SessionOutput::Notice(DirectoryNotice::Members(
                vec![member(1, 1), member(2, 1)].into()
            )),
            SessionOutput::Notice(DirectoryNotice::Members(vec![member(1, 1)].into())),
        ]
    );
    // A change from a list this node does not have (one was lost): the connection goes, and
    // the next one starts with a whole list.
    let gap = FromRegistry::MembersChanged {
        from: 4,
        to: 5,
        changes: vec![MemberChange::Left(NodeId(3))].into(),
    };
    assert!(matches!(
        s.handle_message(now, gap),
        Err(SessionError::Protocol(why)) if why.contains("from list 4") && why.contains("list 3")
    ));
}

#[test]
fn a_session_told_no_member_lists_still_checks_the_changes() {
    use super::member_changes::MemberChange;
    let mut r = registry();
    let now = at_ms(0);
    let config = SessionConfig {
        member_lists: false,
        ..session_config()
    };
    let (mut s, notices) = joined_session(config, &mut r, now);
    assert!(notices.contains(&DirectoryNotice::Health(Ok(()))));
    assert!(!notices
        .iter()
        .any(|n| matches!(n, DirectoryNotice::Members(_))));
    let joined = FromRegistry::MembersChanged {
        from: 1,
        to: 2,
        changes: vec![MemberChange::Listed(member(2, 1))].into(),
    };
    s.handle_message(now, joined).unwrap();
    assert_eq!(drain_session(&mut s), vec![]);
    let stale = FromRegistry::MembersChanged {
        from: 1,
        to: 2,
        changes: vec![MemberChange::Left(NodeId(2))].into(),
    };
    assert!(s.handle_message(now, stale).is_err());
}
