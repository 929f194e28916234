//! The head's grace period after a restart, and the replay's conflict told to the node.

use std::time::Duration;

use super::session::{DirectorySession, SessionConfig};
use super::tests::{
    admit, at_ms, digest, drain, exchange, member, registry, request, sizes, NONCE_KEY, TOKEN,
};
use super::*;
use crate::digest::ContentDigest;
use crate::directory::{DirectoryNotice, DirectoryOpId};

/// A hello of `member` that says whether it was registered before, admitted on `conn`.
fn admit_returning(r: &mut Registry, now: Instant, conn: u64, member: MemberInfo) {
    let hello = Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        legacy_token: String::new(),
        member,
        nonce: [3; 32],
        returning: true,
        learns_locations: false,
    };
    r.handle_hello(now, ConnId(conn), hello.clone()).unwrap();
    let challenge = match r.poll_output() {
        Some(RegistryOutput::Send {
            message: FromRegistry::Challenge { nonce },
            ..
        }) => nonce,
        other => panic!("expected a challenge, got {other:?}"),
    };
    let identity = wire::member_identity(&hello.member);
    let transcript = wire::transcript(&hello.nonce, &challenge, &identity);
    let proof = crate::auth::prove(TOKEN, crate::auth::Role::Dialer, &transcript);
    r.handle_proof(now, ConnId(conn), proof).unwrap();
    drain(r);
}

/// Pings from the members on `conns` at each of `times_ms`.
fn keep_alive(r: &mut Registry, conns: &[u64], times_ms: &[u64]) {
    for &ms in times_ms {
        for &conn in conns {
            r.handle_ping(at_ms(ms), ConnId(conn), ms).unwrap();
        }
    }
    drain(r);
}

fn publish(id: ObjectId, digest: ContentDigest) -> DirectoryRequest {
    DirectoryRequest::Publish {
        id,
        sizes: sizes(1),
        digest,
    }
}

/// The replies to `conn` in `out`, by op.
fn replies(out: &[(ConnId, FromRegistry)], conn: u64) -> Vec<(WireOpId, DirectoryReply)> {
    out.iter()
        .filter_map(|(c, m)| match m {
            FromRegistry::Reply { op, reply } if *c == ConnId(conn) => Some((*op, reply.clone())),
            _ => None,
        })
        .collect()
}

/// A restarted head hears first from a node restarted meanwhile, which puts an id that a
/// returning node still holds with other bytes; the returning node's replay comes later, yet
/// within the grace period. The id stays the returning holder's, the put is refused.
#[test]
fn a_restarted_head_holds_a_new_id_back_until_the_holders_replay_it() {
    let mut r = registry();
    r.begin_grace(at_ms(0));
    let x = ObjectId::from_u64(1);
    let (old, new) = (digest(1), ContentDigest::of(b"new bytes", b""));
    admit(&mut r, at_ms(1), 1, member(1, 2)).unwrap();
    drain(&mut r);
    let out = request(&mut r, at_ms(2), 1, 7, publish(x, new));
    assert_eq!(
        replies(&out, 1),
        vec![],
        "held back during the grace period"
    );
    assert_eq!(r.deferred_requests(), 1);
    assert!(r.holders_of(&x).is_empty());

    admit_returning(&mut r, at_ms(50), 2, member(2, 1));
    r.handle_reclaim(at_ms(50), ConnId(2), WireOpId(0), x, sizes(1), old)
        .unwrap();
    assert_eq!(
        replies(&drain(&mut r), 2),
        vec![(WireOpId(0), DirectoryReply::Done)]
    );

    // The members keep their registrations meanwhile.
    keep_alive(&mut r, &[1, 2], &[90, 180]);
    assert!(
        r.in_grace(at_ms(199)),
        "twice the heartbeat timeout after the start"
    );
    r.handle_timeout(at_ms(199));
    assert!(replies(&drain(&mut r), 1).is_empty(), "not before its end");
    let end = at_ms(200);
    assert!(!r.in_grace(end));
    r.handle_timeout(end);
    assert_eq!(
        replies(&drain(&mut r), 1),
        vec![(
            WireOpId(7),
            DirectoryReply::Conflict {
                sizes: sizes(1),
                digest: old
            }
        )]
    );
    assert_eq!(r.holders_of(&x), vec![NodeId(2)]);
    assert!(!r.in_grace(end));
}

/// A young head that admits a node registered before is a restarted one: the grace period
/// runs from its start without its driver saying so. A fresh cluster's head never holds back.
#[test]
fn a_returning_hello_starts_the_grace_period_and_a_fresh_cluster_has_none() {
    let x = ObjectId::from_u64(1);
    let mut fresh = registry();
    admit(&mut fresh, at_ms(0), 1, member(1, 1)).unwrap();
    drain(&mut fresh);
    let out = request(&mut fresh, at_ms(1), 1, 0, publish(x, digest(1)));
    assert_eq!(replies(&out, 1), vec![(WireOpId(0), DirectoryReply::Done)]);
    assert!(!fresh.in_grace(at_ms(1)));

    let mut restarted = registry();
    admit(&mut restarted, at_ms(0), 1, member(1, 1)).unwrap();
    drain(&mut restarted);
    admit_returning(&mut restarted, at_ms(10), 2, member(2, 1));
    assert!(restarted.in_grace(at_ms(10)));
    let out = request(&mut restarted, at_ms(11), 1, 0, publish(x, digest(1)));
    assert!(replies(&out, 1).is_empty());
    keep_alive(&mut restarted, &[1, 2], &[90, 180]);
    restarted.handle_timeout(at_ms(200));
    assert_eq!(
        replies(&drain(&mut restarted), 1),
        vec![(WireOpId(0), DirectoryReply::Done)]
    );

    // An old head that admits a returning node (its registration expired) holds nothing back.
    let mut old = registry();
    admit(&mut old, at_ms(0), 1, member(1, 1)).unwrap();
    drain(&mut old);
    admit_returning(&mut old, at_ms(500), 2, member(2, 1));
    assert!(!old.in_grace(at_ms(500)));
}

/// A node's withdrawal of an id whose publication is held back waits behind it, so the
/// head does not list a copy the node dropped.
#[test]
fn requests_behind_a_held_back_publication_keep_their_order() {
    let mut r = registry();
    r.begin_grace(at_ms(0));
    admit(&mut r, at_ms(0), 1, member(1, 1)).unwrap();
    drain(&mut r);
    let x = ObjectId::from_u64(1);
    request(&mut r, at_ms(1), 1, 0, publish(x, digest(1)));
    let out = request(&mut r, at_ms(2), 1, 1, DirectoryRequest::Withdraw { id: x });
    assert!(replies(&out, 1).is_empty());
    keep_alive(&mut r, &[1], &[90, 180]);
    r.handle_timeout(at_ms(200));
    assert_eq!(
        replies(&drain(&mut r), 1),
        vec![
            (WireOpId(0), DirectoryReply::Done),
            (WireOpId(1), DirectoryReply::Done)
        ]
    );
    assert!(r.holders_of(&x).is_empty());
}

fn session_config() -> SessionConfig {
    SessionConfig {
        heartbeat_interval: Duration::from_millis(10),
        heartbeat_timeout: Duration::from_millis(50),
        reconnect_backoff_min: Duration::from_millis(5),
        reconnect_backoff_max: Duration::from_millis(40),
        ..SessionConfig::default()
    }
}

/// The head restarted and another node took the id before this node's replay came: the
/// session tells its node that the replay was refused, with the content the id names.
#[test]
fn a_refused_replay_is_told_to_the_node() {
    let now = at_ms(0);
    let mut r = registry();
    let mut s = DirectorySession::new(session_config(), member(1, 1), TOKEN.into(), NONCE_KEY, now);
    s.handle_timeout(now);
    exchange(&mut s, &mut r, 1, now);
    let x = ObjectId::from_u64(1);
    s.handle_submit(now, DirectoryOpId(1), publish(x, digest(1)));
    exchange(&mut s, &mut r, 1, now);

    // A head restarted without its grace period (its driver did not say, and the other node
    // joined first): the other content is accepted before the replay.
    let mut r = registry();
    admit(&mut r, at_ms(55), 9, member(2, 1)).unwrap();
    drain(&mut r);
    let theirs = ContentDigest::of(b"theirs", b"");
    request(&mut r, at_ms(55), 9, 0, publish(x, theirs));
    let later = at_ms(60);
    s.handle_timeout(later);
    exchange(&mut s, &mut r, 2, later);
    let retry = s.poll_timeout().expect("a retry is scheduled");
    s.handle_timeout(retry);
    let notices = exchange(&mut s, &mut r, 2, retry);
    assert!(
        notices.contains(&DirectoryNotice::Event(DirectoryEvent::ReplayRefused {
            id: x,
            sizes: sizes(1),
            digest: theirs,
        })),
        "{notices:?}"
    );
    assert!(!s.replay_state().publications.contains_key(&x));
}
