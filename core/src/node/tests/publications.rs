//! Telling the directory what a node holds: objects put here at once, copies fetched here after
//! a delay, and copies removed before then never.

use super::*;

const DELAY: Duration = Duration::from_millis(1);

fn deferring_world() -> World {
    World::new(2, |config| config.replica_publication_delay = DELAY)
}

fn publications_sent(w: &World, node: u32) -> (usize, usize) {
    let publishes = w.count(node, |o| {
        matches!(
            o,
            NodeOutput::Directory {
                request: DirectoryRequest::Publish { .. },
                ..
            }
        )
    });
    let withdrawals = w.count(node, |o| {
        matches!(
            o,
            NodeOutput::Directory {
                request: DirectoryRequest::Withdraw { .. },
                ..
            }
        )
    });
    (publishes, withdrawals)
}

#[test]
fn a_fetched_copy_is_published_after_the_delay_and_an_object_put_here_at_once() {
    let mut w = deferring_world();
    w.put(0, 1, 1000);
    assert_eq!(
        w.locations[&id(1)].1,
        vec![NodeId(0)],
        "a put is published at once"
    );
    w.fetch(1, &[1], Duration::from_millis(50));
    assert!(ok_info(&w.replies(1)[0][0]).data_size == 1000);
    assert_eq!(publications_sent(&w, 1), (0, 0));
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0)]);
    w.advance(DELAY / 2);
    assert_eq!(publications_sent(&w, 1), (0, 0), "not before the delay");
    w.advance(DELAY / 2);
    assert_eq!(publications_sent(&w, 1), (1, 0));
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0), NodeId(1)]);
    // Removed after it was published: withdrawn.
    w.release(1, 1);
    w.delete(1, 1);
    w.pump();
    assert_eq!(publications_sent(&w, 1), (1, 1));
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0)]);
    assert_eq!(w.nodes[1].stats().publications_skipped, 0);
    w.assert_settled();
}

#[test]
fn a_copy_removed_before_its_publication_was_due_is_never_published_nor_withdrawn() {
    let mut w = deferring_world();
    w.put(0, 1, 1000);
    for round in 1..=3 {
        w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
        w.pump();
        assert_eq!(w.nodes[1].stats().publications_skipped, round);
    }
    w.advance(DELAY * 3);
    assert_eq!(publications_sent(&w, 1), (0, 0));
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0)]);
    w.assert_settled();
}

#[test]
fn a_zero_delay_publishes_copies_at_once() {
    let mut w = World::new(2, |config| {
        config.replica_publication_delay = Duration::ZERO
    });
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Rendezvous);
    assert_eq!(publications_sent(&w, 1), (1, 1));
    assert_eq!(w.nodes[1].stats().publications_skipped, 0);
    w.assert_settled();
}
