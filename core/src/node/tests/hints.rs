//! Fetches with a location hint: the right node is asked without a lookup; a wrong one costs
//! one round trip, then the directory answers.

use super::*;

impl World {
    /// Hands `node` a fetch of `ns` hinted at `hint`, and carries everything out.
    pub(super) fn fetch_from(&mut self, node: u32, ns: &[u64], hint: u32, mode: TransferMode) {
        let body = Request::FetchFrom {
            ids: ns.iter().map(|&n| id(n)).collect(),
            timeout_ms: Some(50),
            mode,
            wait_for_publication: false,
            hint: NodeId(hint),
        };
        self.hand_request(node, CLIENT, body);
        self.pump();
    }

    /// Fetches `n` into `node` hinted at `hint`, checks its bytes, then drops the copy again.
    fn fetch_from_and_drop(&mut self, node: u32, n: u64, len: u64, hint: u32, mode: TransferMode) {
        let before = self.replies(node).len();
        self.fetch_from(node, &[n], hint, mode);
        let replies = self.replies(node);
        assert_eq!(replies.len(), before + 1, "one reply");
        let info = ok_info(&replies[before][0]);
        assert_eq!(self.local_bytes(node, &info), World::bytes_of(n, len));
        self.release(node, n);
        self.delete(node, n);
        self.pump();
    }
}

#[test]
fn the_right_hint_skips_the_lookup_eager_and_rendezvous() {
    let mut w = World::new(3, |c| c.location_cache_entries = 0);
    w.put(0, 1, 1000); // eager
    w.put(0, 2, 10_000); // rendezvous
    w.fetch_from_and_drop(1, 1, 1000, 0, TransferMode::Auto);
    w.fetch_from_and_drop(1, 2, 10_000, 0, TransferMode::Auto);
    assert_eq!(w.lookups(1), 0, "no directory lookup on the way");
    let stats = w.nodes[1].stats();
    assert_eq!((stats.hinted_fetches, stats.wrong_hints), (2, 0));
    assert_eq!(stats.transfer_outcomes.eager_ok, 1);
    assert_eq!(stats.transfer_outcomes.rendezvous_ok, 1);
    w.assert_settled();
}

#[test]
fn a_wrong_hint_costs_one_round_trip_then_asks_the_directory() {
    let mut w = World::new(3, |c| c.location_cache_entries = 0);
    w.put(0, 1, 1000);
    w.put(0, 2, 10_000);
    w.fetch_from_and_drop(1, 1, 1000, 2, TransferMode::Auto);
    assert_eq!(w.lookups(1), 1, "the directory was asked after the miss");
    assert_eq!(w.nodes[2].stats().served_refused, 1, "node 2 said NotFound");
    w.fetch_from_and_drop(1, 2, 10_000, 2, TransferMode::Auto);
    assert_eq!(w.lookups(1), 2);
    let stats = w.nodes[1].stats();
    assert_eq!((stats.hinted_fetches, stats.wrong_hints), (2, 2));
    w.assert_settled();
}

#[test]
fn an_id_that_names_its_node_is_fetched_from_it_without_a_lookup() {
    let mut w = World::new(3, |c| c.location_cache_entries = 0);
    let (small, large) = (owned(0, 1), owned(0, 2));
    w.put(0, small, 1000);
    w.put(0, large, 10_000);
    w.fetch_and_drop(1, small, 1000, TransferMode::Auto);
    w.fetch_and_drop(1, large, 10_000, TransferMode::Auto);
    w.pump();
    assert_eq!(w.lookups(1), 0, "the id named the holder");
    let stats = w.nodes[1].stats();
    assert_eq!((stats.hinted_fetches, stats.wrong_hints), (2, 0));
    w.assert_settled();
}

#[test]
fn an_id_naming_a_node_without_the_object_costs_one_round_trip() {
    let mut w = World::new(3, |c| c.location_cache_entries = 0);
    // Made on node 0 (the id says so) but put on node 2.
    let moved = owned(0, 3);
    w.put(2, moved, 1000);
    w.fetch_and_drop(1, moved, 1000, TransferMode::Auto);
    w.pump();
    assert_eq!(w.nodes[0].stats().served_refused, 1, "node 0 said NotFound");
    assert_eq!(w.lookups(1), 1, "then the directory was asked");
    let stats = w.nodes[1].stats();
    assert_eq!((stats.hinted_fetches, stats.wrong_hints), (1, 1));
    // An id naming the fetching node itself, or no node of the cluster, goes to the directory.
    for n in [owned(1, 4), owned(9, 5)] {
        w.put(0, n, 1000);
        w.fetch_and_drop(1, n, 1000, TransferMode::Auto);
    }
    w.pump();
    assert_eq!(w.lookups(1), 3);
    assert_eq!(w.nodes[1].stats().hinted_fetches, 1);
    w.assert_settled();
}

#[test]
fn a_hint_at_itself_or_an_unknown_node_is_ignored() {
    let mut w = World::new(2, |c| c.location_cache_entries = 0);
    w.put(0, 1, 1000);
    w.fetch_from_and_drop(1, 1, 1000, 1, TransferMode::Auto);
    w.fetch_from_and_drop(1, 1, 1000, 7, TransferMode::Auto);
    assert_eq!(w.lookups(1), 2);
    assert_eq!(w.nodes[1].stats().hinted_fetches, 0);
    w.assert_settled();
}

#[test]
fn a_hinted_node_that_never_answers_falls_back_at_the_reply_deadline() {
    let mut w = World::new(3, |c| {
        c.location_cache_entries = 0;
        c.reply_timeout = Duration::from_millis(5);
    });
    w.put(0, 1, 1000);
    let body = Request::FetchFrom {
        ids: vec![id(1)],
        timeout_ms: Some(100),
        mode: TransferMode::Auto,
        wait_for_publication: false,
        hint: NodeId(2),
    };
    w.hand_request(1, CLIENT, body);
    // Node 1 runs alone: its request to node 2 is lost.
    w.drive_alone(1);
    w.messages.clear();
    assert_eq!(w.lookups(1), 0);
    w.advance(Duration::from_millis(6));
    assert_eq!(
        w.lookups(1),
        1,
        "the deadline sent the fetch to the directory"
    );
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 1000));
    assert_eq!(w.nodes[1].stats().wrong_hints, 1);
    w.release(1, 1);
    w.pump();
    w.assert_settled();
}

#[test]
fn a_hinted_fetch_nobody_waits_for_any_more_ends_cleanly() {
    let mut w = World::new(2, |c| c.location_cache_entries = 0);
    w.put(0, 1, 10_000);
    let body = Request::FetchFrom {
        ids: vec![id(1)],
        timeout_ms: Some(5),
        mode: TransferMode::Auto,
        wait_for_publication: false,
        hint: NodeId(0),
    };
    w.hand_request(1, CLIENT, body);
    w.drive_alone(1);
    // The client's deadline passes before the holder's reply arrives.
    w.now = w.now + Duration::from_millis(6);
    let now = w.now;
    let _ = w.nodes[1].handle(now, NodeInput::Timeout);
    w.pump();
    let replies = w.replies(1);
    assert!(matches!(replies[0][0], Err(FetchError::Timeout { .. })));
    assert!(
        !w.nodes[0].store().is_pinned(&id(1)),
        "the late lease was released"
    );
    w.assert_settled();
}

#[test]
fn a_local_put_that_seals_before_the_hinted_node_answers_ends_the_hinted_request() {
    let mut w = World::new(2, |c| c.location_cache_entries = 0);
    w.put(0, 1, 10_000);
    let body = Request::FetchFrom {
        ids: vec![id(1)],
        timeout_ms: Some(50),
        mode: TransferMode::Auto,
        wait_for_publication: false,
        hint: NodeId(0),
    };
    w.hand_request(1, CLIENT, body);
    w.drive_alone(1);
    // The request to node 0 is held back while a client of node 1 puts the same object.
    let held = std::mem::take(&mut w.messages);
    assert!(!held.is_empty(), "node 1 asked the hinted node");
    w.put(1, 1, 10_000);
    let replies = w.replies(1);
    let fetched = replies
        .iter()
        .find(|r| r.len() == 1 && r[0].is_ok())
        .expect("the local seal answered the fetch");
    let info = ok_info(&fetched[0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 10_000));
    let pending = w.nodes[1].pending_work();
    assert!(
        pending.iter().all(|work| !work.contains("hinted")),
        "the hinted request ended with its fetch: {pending:?}"
    );
    w.nodes[1].check_invariants();
    // The hinted node's late answer finds no transfer: its lease is released.
    w.messages.extend(held);
    w.pump();
    assert!(
        !w.nodes[0].store().is_pinned(&id(1)),
        "the late lease was released"
    );
    w.release(1, 1);
    w.pump();
    w.assert_settled();
}

/// What the directory pushes to a node that learns locations when `holder` publishes `n`.
fn located(n: u64, len: u64, holder: u32) -> NodeInput<'static> {
    NodeInput::DirectoryEvent {
        event: DirectoryEvent::Located {
            id: id(n),
            holder: NodeId(holder),
            sizes: ObjectSizes {
                data_size: len,
                metadata_size: 0,
            },
            digest: ContentDigest::of(&World::bytes_of(n, len), &[]),
        },
    }
}

#[test]
fn a_pushed_location_sends_the_first_fetch_to_the_holder_without_a_lookup() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 1000);
    w.put(0, 2, 10_000);
    w.feed(1, located(1, 1000, 0));
    w.feed(1, located(2, 10_000, 0));
    // Pushed about itself, or about an object it holds: nothing to learn.
    w.feed(0, located(1, 1000, 0));
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.fetch_and_drop(1, 2, 10_000, TransferMode::Auto);
    w.pump();
    assert_eq!(w.lookups(1), 0, "the pushed locations served");
    let stats = w.nodes[1].stats();
    assert_eq!((stats.locations_learned, stats.location_cache_hits), (2, 2));
    assert_eq!(w.nodes[0].stats().locations_learned, 0);
    w.assert_settled();
}

#[test]
fn a_pushed_location_gone_stale_costs_one_round_trip_then_the_directory() {
    let mut w = World::new(3, |_| {});
    // Node 2 is said to hold it, but node 0 does.
    w.put(0, 1, 1000);
    w.feed(1, located(1, 1000, 2));
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.pump();
    assert_eq!(w.lookups(1), 1, "the directory was asked after the miss");
    let stats = w.nodes[1].stats();
    assert_eq!((stats.location_cache_hits, stats.stale_locations), (1, 1));
    w.assert_settled();
}
