//! Nodes that learn locations: the registry pushes the first holder of an object to the
//! members whose hello asked for it (`learns_locations`), and their sessions pass it on.

use super::session::{SessionConfig, SessionOutput};
use super::tests::{
    at_ms, challenge_of, digest, drain, drain_session, events_for, hello, join, joined_session,
    member, proof_for, registry, request, session_config, sizes, TOKEN,
};
use super::*;
use crate::directory::DirectoryNotice;

/// Node `node` joins on connection `conn`, asking to learn locations.
fn join_learning(r: &mut Registry, now: Instant, conn: u64, node: u32) {
    let mut hello = hello(member(node, 1));
    hello.learns_locations = true;
    r.handle_hello(now, ConnId(conn), hello.clone()).unwrap();
    let challenge = challenge_of(r, conn);
    r.handle_proof(now, ConnId(conn), proof_for(TOKEN, &hello, &challenge))
        .unwrap();
    drain(r);
}

/// Nodes 1 and 3 learn locations, node 2 does not (each on the connection of its number).
fn two_learners_around_one_other() -> Registry {
    let mut r = registry();
    join_learning(&mut r, at_ms(0), 1, 1);
    join(&mut r, at_ms(0), 2, 2);
    join_learning(&mut r, at_ms(0), 3, 3);
    r
}

fn publish(r: &mut Registry, now: Instant, conn: u64, id: ObjectId) -> Vec<(ConnId, FromRegistry)> {
    request(
        r,
        now,
        conn,
        0,
        DirectoryRequest::Publish {
            id,
            sizes: sizes(3),
            digest: digest(3),
        },
    )
}

fn located(id: ObjectId, holder: u32) -> DirectoryEvent {
    DirectoryEvent::Located {
        id,
        holder: NodeId(holder),
        sizes: sizes(3),
        digest: digest(3),
    }
}

#[test]
fn learners_hear_of_the_first_holder_but_not_of_themselves_nor_of_copies() {
    let mut r = two_learners_around_one_other();
    let x = ObjectId::from_u64(5);
    let out = publish(&mut r, at_ms(1), 2, x);
    assert_eq!(events_for(&out, 1), vec![located(x, 2)]);
    assert_eq!(events_for(&out, 3), vec![located(x, 2)]);
    assert!(events_for(&out, 2).is_empty());
    // The same holder again, or a copy on another node: nothing pushed.
    for conn in [2, 1] {
        let out = publish(&mut r, at_ms(2), conn, x);
        assert!(out
            .iter()
            .all(|(_, m)| !matches!(m, FromRegistry::Event(_))));
    }
    // Once every holder is gone, the next one is a first holder again; a learner that
    // publishes it is not told of itself.
    for conn in [1, 2] {
        request(
            &mut r,
            at_ms(3),
            conn,
            0,
            DirectoryRequest::Withdraw { id: x },
        );
    }
    let out = publish(&mut r, at_ms(4), 1, x);
    assert!(events_for(&out, 1).is_empty());
    assert_eq!(events_for(&out, 3), vec![located(x, 1)]);
    assert!(events_for(&out, 2).is_empty());
}

#[test]
fn a_subscribed_learner_hears_the_publication_once_and_a_departed_one_not_at_all() {
    let mut r = two_learners_around_one_other();
    let x = ObjectId::from_u64(6);
    request(
        &mut r,
        at_ms(1),
        1,
        7,
        DirectoryRequest::Lookup {
            id: x,
            subscribe: true,
        },
    );
    r.handle_disconnect(at_ms(1), ConnId(3));
    drain(&mut r);
    let out = publish(&mut r, at_ms(2), 2, x);
    assert_eq!(
        events_for(&out, 1),
        vec![DirectoryEvent::Published {
            id: x,
            holder: NodeId(2),
            sizes: sizes(3),
            digest: digest(3),
        }]
    );
    assert!(events_for(&out, 3).is_empty());
}

#[test]
fn a_session_that_learns_locations_says_so_and_passes_them_on() {
    let mut r = registry();
    let config = SessionConfig {
        learn_locations: true,
        ..session_config()
    };
    let (mut s, _) = joined_session(config, &mut r, at_ms(0));
    join(&mut r, at_ms(0), 2, 2);
    let x = ObjectId::from_u64(7);
    for (conn, message) in publish(&mut r, at_ms(1), 2, x) {
        if conn == ConnId(1) {
            s.handle_message(at_ms(1), message).unwrap();
        }
    }
    let notices: Vec<DirectoryNotice> = drain_session(&mut s)
        .into_iter()
        .filter_map(|output| match output {
            SessionOutput::Notice(notice) => Some(notice),
            _ => None,
        })
        .collect();
    assert!(
        notices.contains(&DirectoryNotice::Event(located(x, 2))),
        "{notices:?}"
    );
    // A session that does not ask hears nothing of it.
    let mut r = registry();
    let (mut s, _) = joined_session(session_config(), &mut r, at_ms(0));
    join(&mut r, at_ms(0), 2, 2);
    let out = publish(&mut r, at_ms(1), 2, x);
    assert!(events_for(&out, 1).is_empty());
    assert!(drain_session(&mut s).is_empty());
}
