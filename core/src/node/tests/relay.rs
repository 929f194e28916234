//! Broadcast through copies: a holder serving one object sends the next requester to the
//! previous one, which relays the prefix it has received; failures fall back to the holder.

use super::*;

const LEN: u64 = 40_000;

fn relaying_world(nodes: u32) -> World {
    World::new(nodes, |config| config.relay_min_bytes = 8 * 1024)
}

fn redirects(w: &World, node: u32) -> Vec<(TransferId, NodeId)> {
    w.sent(node)
        .iter()
        .filter_map(|m| match m {
            PeerMessage::Redirect { req, relay, .. } => Some((*req, *relay)),
            _ => None,
        })
        .collect()
}

fn progress_sent(w: &World, node: u32) -> Vec<u64> {
    w.sent(node)
        .iter()
        .filter_map(|m| match m {
            PeerMessage::RelayProgress { prefix, .. } => Some(*prefix),
            _ => None,
        })
        .collect()
}

fn assert_copy(w: &World, node: u32, n: u64) {
    let replies = w.replies(node);
    assert_eq!(replies.len(), 1, "node {node}: one reply");
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(node, &info), World::bytes_of(n, LEN));
}

#[test]
fn concurrent_fetches_of_a_large_object_flow_through_a_chain_of_relays() {
    let mut w = relaying_world(4);
    w.put(0, 1, LEN);
    for node in 1..4 {
        w.hand_fetch(node, &[1], Duration::from_millis(50), TransferMode::Auto);
    }
    w.pump();
    for node in 1..4 {
        assert_copy(&w, node, 1);
    }
    // Node 1 was served by the holder; 2 was sent to 1, and 3 to 2: a chain.
    let relays: Vec<NodeId> = redirects(&w, 0).iter().map(|(_, r)| *r).collect();
    assert_eq!(relays, vec![NodeId(1), NodeId(2)]);
    assert_eq!(
        w.nodes[0].stats().bytes_served,
        LEN,
        "the holder sent it once"
    );
    assert_eq!(w.nodes[0].stats().relay_redirects, 2);
    for relay in [1u32, 2] {
        assert_eq!(
            w.nodes[relay as usize].stats().relay_leases,
            1,
            "node {relay} relayed"
        );
        let prefixes = progress_sent(&w, relay);
        assert!(
            prefixes.windows(2).all(|p| p[0] < p[1]) && prefixes.last() == Some(&LEN),
            "node {relay} told growing prefixes up to the whole object: {prefixes:?}"
        );
        assert_eq!(
            w.count(relay, |o| matches!(o, NodeOutput::GrantPartialRead { .. })),
            1
        );
    }
    assert_eq!(w.nodes[3].stats().relayed_transfers, 1);
    for node in 1..4 {
        w.release(node, 1);
    }
    w.assert_settled();
}

#[test]
fn a_reader_never_reads_past_the_prefix_its_relay_announced() {
    let mut w = relaying_world(3);
    w.put(0, 1, LEN);
    w.hand_fetch(1, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.hand_fetch(2, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.pump();
    assert_copy(&w, 2, 1);
    // Every READ node 2 posted to node 1 ended at or below a prefix node 1 had announced
    // before the READ was posted.
    let mut announced = 0;
    let mut reads_from_relay = 0;
    for (node, output) in &w.log {
        match output {
            NodeOutput::Send {
                message: PeerMessage::RelayProgress { prefix, .. },
                ..
            } if node.0 == 1 => announced = announced.max(*prefix),
            NodeOutput::PostRead { peer, local, .. } if node.0 == 2 && peer.0 == 1 => {
                let copy = w.nodes[2].store().sealed_info(&id(1)).unwrap();
                let end = local.end() - copy.region.offset;
                assert!(end <= announced, "READ to {end} past prefix {announced}");
                reads_from_relay += 1;
            }
            _ => {}
        }
    }
    assert!(reads_from_relay > 0, "node 2 read from its relay");
    w.release(1, 1);
    w.release(2, 1);
    w.assert_settled();
}

#[test]
fn small_objects_and_single_requesters_are_served_directly() {
    let mut w = relaying_world(3);
    w.put(0, 1, 4_000); // below relay_min_bytes
    w.hand_fetch(1, &[1], Duration::from_millis(50), TransferMode::Rendezvous);
    w.hand_fetch(2, &[1], Duration::from_millis(50), TransferMode::Rendezvous);
    w.pump();
    assert!(redirects(&w, 0).is_empty());
    w.put(0, 2, LEN);
    w.fetch(1, &[2], Duration::from_millis(50));
    w.fetch(2, &[2], Duration::from_millis(50));
    assert!(
        redirects(&w, 0).is_empty(),
        "one after the other: nothing is being served when the second asks"
    );
    for node in 1..3 {
        w.release(node, 1);
        w.release(node, 2);
    }
    w.assert_settled();
}

#[test]
fn readers_of_a_relay_whose_transfer_fails_fall_back_to_the_holder() {
    let mut w = relaying_world(3);
    w.put(0, 1, LEN);
    w.hand_fetch(1, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.hand_fetch(2, &[1], Duration::from_millis(50), TransferMode::Auto);
    // Stop once node 2 reads from its relay, node 1, mid-transfer.
    w.pump_until(|w| !progress_sent(w, 1).is_empty() && w.nodes[1].stats().bytes_fetched == 0);
    assert_eq!(redirects(&w, 0).len(), 1);
    // Node 1 loses the holder: its own transfer fails while node 2 reads its partial copy.
    let lost = NodeInput::PeerLost { peer: NodeId(0) };
    let _ = w.nodes[1].handle(w.now, lost);
    w.pump();
    assert!(
        w.sent(1)
            .iter()
            .any(|m| matches!(m, PeerMessage::Error { reason, .. } if reason.contains("relay"))),
        "the relay told its reader"
    );
    // Node 2 got it from the holder itself; node 1 waits to reconnect.
    assert_copy(&w, 2, 1);
    assert_eq!(
        w.nodes[1].store().summary(&id(1)).map(|s| s.sealed),
        None,
        "the failed copy was aborted once its reader's grant was revoked"
    );
    let params = PeerParams {
        lanes: 2,
        costs: PathCosts::RDMA_DEFAULT,
    };
    let _ = w.nodes[1].handle(
        w.now,
        NodeInput::PeerConnected {
            peer: NodeId(0),
            params,
        },
    );
    w.pump();
    assert_copy(&w, 1, 1);
    w.release(1, 1);
    w.release(2, 1);
    w.assert_settled();
}

#[test]
fn a_relay_announcing_more_than_the_object_fails_the_transfer() {
    let mut w = relaying_world(3);
    w.put(0, 1, LEN);
    w.hand_fetch(1, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.hand_fetch(2, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.pump_until(|w| !progress_sent(w, 1).is_empty());
    let req = w
        .sent(2)
        .iter()
        .rev()
        .find_map(|m| match m {
            PeerMessage::FetchRequest { req, .. } => Some(*req),
            _ => None,
        })
        .unwrap();
    let bogus = wire::to_bytes(&PeerMessage::RelayProgress {
        req,
        prefix: LEN + 1,
    });
    let _ = w.nodes[2].handle(
        w.now,
        NodeInput::PeerBytes {
            peer: NodeId(1),
            bytes: &bogus,
        },
    );
    w.pump();
    // The transfer from the relay failed; the holder served node 2 itself.
    assert_eq!(w.nodes[2].stats().transfers_failed, 1);
    assert_copy(&w, 2, 1);
    w.release(1, 1);
    w.release(2, 1);
    w.assert_settled();
}

#[test]
fn a_busy_holder_sends_a_later_requester_to_an_earlier_copy() {
    // Fetched copies are not published yet (as when requesters finish together): only the
    // holder is listed.
    let mut w = World::new(4, |config| {
        config.relay_min_bytes = 8 * 1024;
        config.replica_publication_delay = Duration::from_secs(60);
    });
    w.put(0, 1, LEN);
    w.put(0, 2, LEN);
    // Node 1 fetched object 1 alone: the holder served it, nothing else was under way.
    w.fetch(1, &[1], Duration::from_millis(50));
    assert_copy(&w, 1, 1);
    assert!(redirects(&w, 0).is_empty());
    // The holder's link is busy with object 2 for node 3 when node 2 asks for object 1.
    w.hand_fetch(3, &[2], Duration::from_millis(50), TransferMode::Auto);
    w.pump_until(|w| w.count(0, |o| matches!(o, NodeOutput::GrantRead { .. })) == 2);
    w.hand_fetch(2, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.pump();
    assert_eq!(
        redirects(&w, 0).iter().map(|(_, r)| *r).collect::<Vec<_>>(),
        vec![NodeId(1)],
        "node 2 was sent to node 1's copy"
    );
    assert_copy(&w, 2, 1);
    assert_copy(&w, 3, 2);
    assert_eq!(
        w.nodes[0].stats().bytes_served,
        2 * LEN,
        "the holder sent each object once"
    );
    w.advance(Duration::from_secs(61)); // the copies' publications
    for (node, n) in [(1, 1), (2, 1), (3, 2)] {
        w.release(node, n);
    }
    w.assert_settled();
}

#[test]
fn an_idle_holder_serves_a_later_requester_itself() {
    let mut w = relaying_world(3);
    w.put(0, 1, LEN);
    w.fetch(1, &[1], Duration::from_millis(50));
    w.fetch(2, &[1], Duration::from_millis(50));
    assert!(redirects(&w, 0).is_empty(), "nothing under way: no detour");
    assert_copy(&w, 2, 1);
    w.release(1, 1);
    w.release(2, 1);
    w.assert_settled();
}

#[test]
fn holders_fetching_each_others_objects_serve_each_other_directly() {
    // All-to-all: every node holds one object and fetches the others'. A holder busy serving
    // its object would otherwise send each later requester to an earlier one, whose link
    // serves that node's own object already.
    let mut w = relaying_world(4);
    for node in 0..4u32 {
        w.put(node, u64::from(node) + 1, LEN);
    }
    for node in 0..4u32 {
        let wanted: Vec<u64> = (1..=4).filter(|&n| n != u64::from(node) + 1).collect();
        w.hand_fetch(node, &wanted, Duration::from_millis(50), TransferMode::Auto);
    }
    w.pump();
    for node in 0..4u32 {
        assert!(
            redirects(&w, node).is_empty(),
            "node {node} redirected {:?}",
            redirects(&w, node)
        );
        assert_eq!(w.nodes[node as usize].stats().relay_leases, 0);
        assert_eq!(
            w.nodes[node as usize].stats().bytes_served,
            3 * LEN,
            "node {node} served its object to each of the others"
        );
        let replies = w.replies(node);
        assert_eq!(replies.len(), 1, "node {node}: one reply");
        for (n, result) in (1..=4u64)
            .filter(|&n| n != u64::from(node) + 1)
            .zip(&replies[0])
        {
            let info = ok_info(result);
            assert_eq!(w.local_bytes(node, &info), World::bytes_of(n, LEN));
        }
    }
    for node in 0..4u32 {
        for n in (1..=4u64).filter(|&n| n != u64::from(node) + 1) {
            w.release(node, n);
        }
    }
    w.assert_settled();
}

#[test]
fn a_requester_serving_its_own_object_does_not_relay() {
    let mut w = relaying_world(4);
    w.put(0, 1, LEN);
    // Node 1's link serves an object of its own, large enough to still be read below.
    w.put(1, 2, 20 * LEN);
    w.hand_fetch(2, &[2], Duration::from_millis(50), TransferMode::Auto);
    w.pump_until(|w| w.count(1, |o| matches!(o, NodeOutput::GrantRead { .. })) == 1);
    // Node 1 fetches object 1, and the busy holder sends node 3 to node 1's copy.
    w.hand_fetch(1, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.pump_until(|w| w.count(0, |o| matches!(o, NodeOutput::GrantRead { .. })) == 1);
    w.hand_fetch(3, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.pump();
    assert_eq!(
        redirects(&w, 0).iter().map(|(_, r)| *r).collect::<Vec<_>>(),
        vec![NodeId(1)],
        "node 3 was sent to node 1"
    );
    assert_eq!(
        w.nodes[1].stats().relay_leases,
        0,
        "node 1, serving its own object, relayed nothing"
    );
    assert_eq!(
        w.nodes[1].stats().relay_pace.refused_requests,
        1,
        "node 1 counts the request it refused"
    );
    assert_copy(&w, 3, 1);
    assert_eq!(
        w.nodes[0].stats().bytes_served,
        2 * LEN,
        "the holder served node 3 itself"
    );
    w.release(1, 1);
    w.release(2, 2);
    w.release(3, 1);
    w.assert_settled();
}
