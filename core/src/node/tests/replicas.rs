//! Copies of record on a node: a put with copies is pinned and published for placement, its
//! reply can wait for the copies, a copy placed here is fetched, pinned and published at once,
//! and deletes reach every copy.

use super::*;
use crate::client_protocol::ReplicaPolicy;

const LEN: u64 = 300;

fn put_replicated(w: &mut World, node: u32, n: u64, copies: u8, wait_ms: Option<u64>) -> RequestId {
    let body = Request::PutReplicated {
        id: id(n),
        data: World::bytes_of(n, LEN),
        metadata: Vec::new(),
        replicas: ReplicaPolicy { copies, wait_ms },
    };
    let request = w.hand_request(node, CLIENT, body);
    w.pump();
    request
}

fn published_replicated(w: &World, node: u32) -> Vec<u8> {
    w.log
        .iter()
        .filter_map(|(n, o)| match o {
            NodeOutput::Directory {
                request: DirectoryRequest::PublishReplicated { replicas, .. },
                ..
            } if n.0 == node => Some(*replicas),
            _ => None,
        })
        .collect()
}

fn copies_event(w: &mut World, node: u32, n: u64, copies: u32) {
    let event = DirectoryEvent::Copies { id: id(n), copies };
    w.feed(node, NodeInput::DirectoryEvent { event });
    w.pump();
}

#[test]
fn a_put_with_copies_is_published_for_placement_and_never_evicted_but_deleted_everywhere() {
    let mut w = World::new(2, |_| {});
    let put = put_replicated(&mut w, 0, 1, 2, None);
    assert_eq!(w.reply_to(0, CLIENT, put), Some(Response::Done(Ok(()))));
    assert_eq!(published_replicated(&w, 0), vec![2]);
    assert!(w.nodes[0].store().is_record(&id(1)));
    let evicted = w.request(0, Request::Evict { bytes: 1 << 30 });
    assert!(matches!(evicted, Some(Response::Evicted(o)) if o.objects == 0));
    assert!(
        w.nodes[0].store().contains(&id(1)),
        "a copy of record stays"
    );
    assert_eq!(w.nodes[0].metrics().copies_of_record, 1);
    w.delete(0, 1);
    assert!(!w.nodes[0].store().contains(&id(1)), "deleted at once");
    let everywhere = w.count(0, |o| {
        matches!(
            o,
            NodeOutput::Directory {
                request: DirectoryRequest::DeleteEverywhere { .. },
                ..
            }
        )
    });
    assert_eq!(everywhere, 1);
    w.nodes[0].check_invariants();
}

#[test]
fn the_daemon_default_applies_to_a_put_that_names_no_count() {
    let mut w = World::new(2, |config| config.default_replicas = 3);
    put_replicated(&mut w, 0, 1, 0, None);
    assert_eq!(published_replicated(&w, 0), vec![3]);
    // A plain create-and-seal and a plain inline put get the default too, without a wait.
    w.put(0, 2, LEN);
    let put = w.hand_request(
        0,
        CLIENT,
        Request::Put {
            id: id(3),
            data: World::bytes_of(3, LEN),
            metadata: Vec::new(),
        },
    );
    w.pump();
    assert_eq!(w.reply_to(0, CLIENT, put), Some(Response::Done(Ok(()))));
    assert_eq!(published_replicated(&w, 0), vec![3, 3, 3]);
    for n in 1..=3 {
        assert!(w.nodes[0].is_copy_of_record(&id(n)), "object {n}");
        assert!(w.nodes[0].store().is_record(&id(n)), "object {n}");
    }
    // A put that fails (the id is taken) is answered and leaves nothing pending.
    let again = w.hand_request(
        0,
        CLIENT,
        Request::Put {
            id: id(3),
            data: World::bytes_of(3, LEN),
            metadata: Vec::new(),
        },
    );
    w.pump();
    assert_eq!(
        w.reply_to(0, CLIENT, again),
        Some(Response::Done(Err(StoreError::ObjectExists(id(3)))))
    );
    assert!(w.nodes[0].is_quiescent(), "{:?}", w.nodes[0].pending_work());
    w.nodes[0].check_invariants();
}

#[test]
fn a_plain_put_stays_plain_on_a_node_whose_default_is_one_copy() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, LEN);
    assert_eq!(published_replicated(&w, 0), Vec::<u8>::new());
    assert!(!w.nodes[0].store().is_record(&id(1)));
}

#[test]
fn a_count_above_the_most_is_refused_naming_the_most() {
    let mut w = World::new(2, |_| {});
    let most = crate::registry::MAX_REPLICAS;
    let put = put_replicated(&mut w, 0, 1, most + 1, None);
    assert_eq!(
        w.reply_to(0, CLIENT, put),
        Some(Response::Error(StoreError::BadRequest(format!(
            "a put asks for {} copies; the most is {most}",
            most + 1
        ))))
    );
    assert!(!w.nodes[0].store().contains(&id(1)), "nothing stored");
}

#[test]
fn without_a_directory_that_places_copies_a_put_is_plain_and_a_waiting_one_fails_at_once() {
    let mut w = World::new(2, |config| {
        config.directory_places_replicas = false;
        config.default_replicas = 2;
        config.directory_name = "redis://127.0.0.1:6379".into();
    });
    // The daemon's default and a put's own count: stored and published as plain objects,
    // never pinned as copies of record (nothing would ever make the other copies).
    w.put(0, 1, LEN);
    let put = put_replicated(&mut w, 0, 2, 3, None);
    assert_eq!(w.reply_to(0, CLIENT, put), Some(Response::Done(Ok(()))));
    // A put that waits fails at its seal, not after its wait, saying why.
    let waiting = put_replicated(&mut w, 0, 3, 2, Some(60_000));
    assert_eq!(
        w.reply_to(0, CLIENT, waiting),
        Some(Response::Done(Err(StoreError::ReplicasUnsupported {
            id: id(3),
            wanted: 2,
            directory: "redis://127.0.0.1:6379".into(),
        })))
    );
    assert_eq!(published_replicated(&w, 0), Vec::<u8>::new());
    for n in 1..=3 {
        assert!(w.nodes[0].store().contains(&id(n)), "object {n} is stored");
        assert!(!w.nodes[0].store().is_record(&id(n)), "object {n}");
        assert!(!w.nodes[0].is_copy_of_record(&id(n)), "object {n}");
    }
    assert!(w.nodes[0].is_quiescent(), "{:?}", w.nodes[0].pending_work());
    w.nodes[0].check_invariants();
}

#[test]
fn a_waiting_put_is_answered_once_the_registry_counts_every_copy() {
    let mut w = World::new(2, |_| {});
    let put = put_replicated(&mut w, 0, 1, 3, Some(1000));
    assert_eq!(w.reply_to(0, CLIENT, put), None, "held for the copies");
    assert!(w.nodes[0].store().contains(&id(1)), "sealed here meanwhile");
    copies_event(&mut w, 0, 1, 2);
    assert_eq!(w.reply_to(0, CLIENT, put), None);
    copies_event(&mut w, 0, 1, 3);
    assert_eq!(w.reply_to(0, CLIENT, put), Some(Response::Done(Ok(()))));
    assert!(w.nodes[0].is_quiescent(), "{:?}", w.nodes[0].pending_work());
    w.nodes[0].check_invariants();
}

#[test]
fn a_waiting_put_fails_at_its_deadline_naming_how_many_copies_exist() {
    let mut w = World::new(2, |_| {});
    let put = put_replicated(&mut w, 0, 1, 3, Some(100));
    copies_event(&mut w, 0, 1, 2);
    w.advance(Duration::from_millis(99));
    assert_eq!(w.reply_to(0, CLIENT, put), None);
    w.advance(Duration::from_millis(1));
    assert_eq!(
        w.reply_to(0, CLIENT, put),
        Some(Response::Done(Err(StoreError::TooFewReplicas {
            id: id(1),
            copies: 2,
            wanted: 3,
            in_cluster: true,
        })))
    );
    assert!(w.nodes[0].store().contains(&id(1)), "the object stays");
    assert_eq!(w.nodes[0].stats().replica_waits_timed_out, 1);
    assert!(w.nodes[0].is_quiescent(), "{:?}", w.nodes[0].pending_work());
    w.nodes[0].check_invariants();
}

#[test]
fn a_standalone_put_that_waits_for_copies_fails_at_once_but_keeps_the_object() {
    let mut w = World::new(1, |config| config.standalone = true);
    let put = put_replicated(&mut w, 0, 1, 2, Some(1000));
    assert_eq!(
        w.reply_to(0, CLIENT, put),
        Some(Response::Done(Err(StoreError::TooFewReplicas {
            id: id(1),
            copies: 1,
            wanted: 2,
            in_cluster: false,
        })))
    );
    assert!(w.nodes[0].store().contains(&id(1)));
}

#[test]
fn a_copy_placed_here_is_fetched_pinned_published_at_once_and_deleted_when_told() {
    let mut w = World::new(2, |config| {
        // Fetched copies would wait before their publication; a placed copy does not.
        config.replica_publication_delay = Duration::from_secs(10);
    });
    w.put(0, 1, LEN);
    let bytes = World::bytes_of(1, LEN);
    let event = DirectoryEvent::Replicate {
        id: id(1),
        sizes: ObjectSizes {
            data_size: LEN,
            metadata_size: 0,
        },
        digest: ContentDigest::of(&bytes, &[]),
        sources: vec![NodeId(0)],
        replicas: 2,
    };
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.pump();
    let info = w.nodes[1].store().sealed_info(&id(1)).expect("fetched");
    assert_eq!(w.local_bytes(1, &info), bytes);
    assert!(w.nodes[1].store().is_record(&id(1)));
    assert_eq!(
        published_replicated(&w, 1),
        vec![2],
        "published without delay"
    );
    assert_eq!(w.nodes[1].stats().copies_of_record_placed, 1);
    // The node's fetch client keeps no reference: only the pin holds it.
    let evicted = w.request(1, Request::Evict { bytes: 1 << 30 });
    assert!(matches!(evicted, Some(Response::Evicted(o)) if o.objects == 0));
    w.nodes[1].check_invariants();
    let event = DirectoryEvent::Delete { id: id(1) };
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.pump();
    assert!(!w.nodes[1].store().contains(&id(1)));
    w.nodes[1].check_invariants();
}

/// A put that waited for its copies is answered only once its own seal is durable, as every
/// put on a persistent node is: copies counted before the commit do not let the reply
/// overtake it (the simulator saw an acknowledged replicated seal lost in a crash).
#[test]
fn a_waiting_put_on_a_persistent_node_is_answered_only_once_its_seal_is_durable() {
    let mut w = World::new(2, |config| {
        config.store.record_durable_changes = true;
        config.hold_replies_until_durable = true;
    });
    w.manual_disk = true;
    let put = put_replicated(&mut w, 0, 1, 2, Some(1000));
    copies_event(&mut w, 0, 1, 2);
    assert_eq!(
        w.reply_to(0, CLIENT, put),
        None,
        "every copy counted, but the seal is not durable yet"
    );
    let (_, seq) = *w.persisted.last().expect("the seal was handed to the disk");
    w.feed(0, NodeInput::Persisted { upto: seq });
    w.pump();
    assert_eq!(w.reply_to(0, CLIENT, put), Some(Response::Done(Ok(()))));
    w.nodes[0].check_invariants();
}

/// A waiting put refused at its seal (another content holds the id) is answered by the
/// refusal, and its wait for copies ends with it: nothing is left waiting for copies of an
/// object that was never stored (the simulator saw such waits pending forever).
#[test]
fn a_waiting_put_refused_at_its_seal_leaves_no_wait_behind() {
    let mut w = World::new(2, |_| {});
    assert_eq!(
        w.put_bytes(0, 1, &World::bytes_of(1, LEN)),
        Some(Response::Done(Ok(())))
    );
    let body = Request::PutReplicated {
        id: id(1),
        data: World::bytes_of(2, LEN),
        metadata: Vec::new(),
        replicas: ReplicaPolicy {
            copies: 2,
            wait_ms: Some(1000),
        },
    };
    let put = w.hand_request(1, CLIENT, body);
    w.pump();
    assert_eq!(
        w.reply_to(1, CLIENT, put),
        Some(Response::Done(Err(StoreError::ObjectExists(id(1)))))
    );
    assert!(w.nodes[1].is_quiescent(), "{:?}", w.nodes[1].pending_work());
    w.nodes[1].check_invariants();
}

/// A node told to hold a copy of an id it holds with other bytes (the id was deleted and put
/// again with another content) neither promotes its copy nor publishes it as the new content:
/// the directory would list one id with two contents (the simulator saw it).
#[test]
fn a_copy_placed_on_a_node_holding_other_bytes_under_the_id_is_not_promoted() {
    let mut w = World::new(2, |_| {});
    w.put(1, 1, LEN);
    let other = World::bytes_of(2, LEN);
    let event = DirectoryEvent::Replicate {
        id: id(1),
        sizes: ObjectSizes {
            data_size: LEN,
            metadata_size: 0,
        },
        digest: ContentDigest::of(&other, &[]),
        sources: vec![NodeId(0)],
        replicas: 2,
    };
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.pump();
    assert_eq!(published_replicated(&w, 1), Vec::<u8>::new());
    assert!(!w.nodes[1].store().is_record(&id(1)));
    assert!(!w.nodes[1].store().contains(&id(1)), "the stale copy goes");
    w.nodes[1].check_invariants();
}

/// A copy placed here whose fetch joined a client's fetch that waits for a publication does not
/// outlive that client's wait by the replication's long timeout: once the client's deadline
/// passes, the placed copy's fetch fails after the short publication grace (the registry places
/// the copy elsewhere), and the node is idle again (the simulator saw it busy for a minute).
#[test]
fn a_placed_copy_joined_to_a_waiting_client_fetch_ends_soon_after_the_client_leaves() {
    let mut w = World::new(2, |_| {});
    w.hand_fetch(1, &[1], Duration::from_millis(5), TransferMode::Auto);
    w.pump();
    let bytes = World::bytes_of(1, LEN);
    let event = DirectoryEvent::Replicate {
        id: id(1),
        sizes: ObjectSizes {
            data_size: LEN,
            metadata_size: 0,
        },
        digest: ContentDigest::of(&bytes, &[]),
        sources: vec![NodeId(0)],
        replicas: 2,
    };
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.pump();
    w.advance(Duration::from_millis(100));
    assert!(w.nodes[1].is_quiescent(), "{:?}", w.nodes[1].pending_work());
    assert_eq!(w.nodes[1].stats().replication_fetches_failed, 1);
    w.nodes[1].check_invariants();
}

#[test]
fn a_copy_of_record_is_published_as_one_again_when_the_directory_returns_and_surplus_unpins_it() {
    let mut w = World::new(2, |_| {});
    put_replicated(&mut w, 0, 1, 2, None);
    w.put(0, 2, LEN);
    assert_eq!(published_replicated(&w, 0), vec![2]);
    // Cut off past the heartbeat bound and back: the session's replay published plain
    // copies; the node publishes its copy of record again as one (the plain object stays
    // plain).
    let down = NodeInput::DirectoryHealth {
        health: Err("cut off".into()),
    };
    w.feed(0, down);
    w.feed(0, NodeInput::DirectoryHealth { health: Ok(()) });
    w.pump();
    assert_eq!(published_replicated(&w, 0), vec![2, 2]);
    // The registry had repaired it meanwhile: the copy here is a plain one now.
    let event = DirectoryEvent::Surplus { id: id(1) };
    w.feed(0, NodeInput::DirectoryEvent { event });
    w.pump();
    assert!(!w.nodes[0].is_copy_of_record(&id(1)));
    assert!(!w.nodes[0].store().is_record(&id(1)));
    assert!(w.nodes[0].store().contains(&id(1)), "kept as a plain copy");
    assert_eq!(w.nodes[0].stats().copies_of_record_released, 1);
    let evicted = w.request(0, Request::Evict { bytes: 1 << 30 });
    assert!(matches!(evicted, Some(Response::Evicted(o)) if o.objects == 2));
    w.nodes[0].check_invariants();
}

/// Copies placed here queue behind each other (bytes in flight) in a store that holds one:
/// the first must be pinned before its fetch's own reference goes, or the next one's
/// admission evicts it at once and repair never converges (the simulator saw it, every
/// target timeout again).
#[test]
fn a_placed_copy_is_pinned_before_the_next_placed_fetch_can_evict_it() {
    let mut w = World::new(2, |config| {
        if config.node == NodeId(1) {
            config.store = crate::store::StoreConfig::single_arena(LEN + 20);
            config.max_bytes_in_flight = LEN;
        }
    });
    w.put(0, 1, LEN);
    w.put(0, 2, LEN);
    for n in [1, 2] {
        let event = DirectoryEvent::Replicate {
            id: id(n),
            sizes: ObjectSizes {
                data_size: LEN,
                metadata_size: 0,
            },
            digest: ContentDigest::of(&World::bytes_of(n, LEN), &[]),
            sources: vec![NodeId(0)],
            replicas: 2,
        };
        w.feed(1, NodeInput::DirectoryEvent { event });
    }
    w.pump();
    assert!(w.nodes[1].is_copy_of_record(&id(1)), "the first copy stays");
    assert!(w.nodes[1].store().is_record(&id(1)));
    assert!(
        !w.nodes[1].store().contains(&id(2)),
        "no room for the second"
    );
    w.nodes[1].check_invariants();
}

fn declined(w: &World, node: u32) -> Vec<ObjectId> {
    w.log
        .iter()
        .filter_map(|(n, o)| match o {
            NodeOutput::Directory {
                request: DirectoryRequest::DeclineReplica { id },
                ..
            } if n.0 == node => Some(*id),
            _ => None,
        })
        .collect()
}

/// The registry's placement of a second copy of object `n` (`len` bytes of `content`),
/// fetched from node 0.
fn replicate_event(n: u64, len: u64, content: u64) -> DirectoryEvent {
    DirectoryEvent::Replicate {
        id: id(n),
        sizes: ObjectSizes {
            data_size: len,
            metadata_size: 0,
        },
        digest: ContentDigest::of(&World::bytes_of(content, len), &[]),
        sources: vec![NodeId(0)],
        replicas: 2,
    }
}

fn replicate(w: &mut World, node: u32, n: u64, content: u64) {
    let event = replicate_event(n, LEN, content);
    w.feed(node, NodeInput::DirectoryEvent { event });
    w.pump();
}

/// A copy this node has no room for is declined as soon as its fetch fails, not left for the
/// registry's target timeout (a minute); a copy it takes is not.
#[test]
fn a_copy_placed_on_a_node_without_room_is_declined_at_once() {
    let mut w = World::new(2, |config| {
        if config.node == NodeId(1) {
            config.store = crate::store::StoreConfig::single_arena(LEN + 20);
        }
    });
    w.put(0, 1, LEN);
    w.put(0, 2, LEN);
    replicate(&mut w, 1, 1, 1);
    assert!(w.nodes[1].is_copy_of_record(&id(1)));
    assert_eq!(declined(&w, 1), Vec::<ObjectId>::new());
    replicate(&mut w, 1, 2, 2);
    assert!(!w.nodes[1].store().contains(&id(2)), "no room");
    assert_eq!(declined(&w, 1), vec![id(2)], "declined without waiting");
    assert!(w.nodes[1].is_quiescent(), "{:?}", w.nodes[1].pending_work());
    w.nodes[1].check_invariants();
}

/// A node holding other bytes under the id drops them and declines the copy, so the registry
/// places it elsewhere at once.
#[test]
fn a_copy_placed_on_a_node_holding_other_bytes_under_the_id_is_declined() {
    let mut w = World::new(2, |_| {});
    w.put(1, 1, LEN);
    replicate(&mut w, 1, 1, 2);
    assert_eq!(declined(&w, 1), vec![id(1)]);
}

/// A copy this node could not hold even with its whole cache evicted (here: the two free
/// ranges a copy of record leaves between cached objects are each too short) is declined at
/// once, without a fetch, and the cache stays. The registry offers such a copy again once per
/// target timeout; a node that evicted its cache and waited for the removals each time was
/// never idle (the simulator saw it, seeds 347 and 512 of the replica sweep).
#[test]
fn a_copy_no_free_range_could_hold_is_declined_at_once_and_the_cache_stays() {
    let block = crate::alloc::block_len_for(LEN).expect("small");
    let mut w = World::new(2, |config| {
        if config.node == NodeId(1) {
            config.store = crate::store::StoreConfig::single_arena(3 * block);
        }
    });
    w.put(0, 1, LEN);
    w.put(0, 9, 2 * LEN);
    // Node 1: [cached 2][copy of record 1][cached 3].
    w.put(1, 2, LEN);
    replicate(&mut w, 1, 1, 1);
    assert!(w.nodes[1].is_copy_of_record(&id(1)));
    w.put(1, 3, LEN);
    let requests_before = w.sent(1).len();
    let event = replicate_event(9, 2 * LEN, 9);
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.pump();
    assert_eq!(declined(&w, 1), vec![id(9)]);
    assert_eq!(w.sent(1).len(), requests_before, "no fetch");
    assert!(w.nodes[1].store().contains(&id(2)), "the cache stays");
    assert!(w.nodes[1].store().contains(&id(3)), "the cache stays");
    assert_eq!(w.nodes[1].stats().replicas_declined_without_room, 1);
    assert!(w.nodes[1].is_quiescent(), "{:?}", w.nodes[1].pending_work());
    w.nodes[1].check_invariants();
}

/// A placed copy whose fetch reached its deadline with the transfer under way is still taken
/// when the transfer ends: held as a copy of record and published as one. Dropped as a plain
/// copy, a full node's next admission evicted it at once, every placement again, and repair
/// never converged (the simulator saw it, seeds 160 and 263 of the replica sweep).
#[test]
fn a_placed_copy_whose_deadline_passed_mid_transfer_is_still_taken_as_a_copy_of_record() {
    let mut w = World::new(2, |config| {
        if config.node == NodeId(1) {
            config.replication_fetch_timeout = Duration::from_millis(1);
            // As a daemon's: a fetched copy's own publication is deferred, the placed copy's is not.
            config.replica_publication_delay = Duration::from_millis(1);
        }
    });
    w.put(0, 1, LEN);
    let event = replicate_event(1, LEN, 1);
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.drive_alone(1);
    assert_eq!(w.sent(1).len(), 1, "the fetch request is on its way");
    // The deadline passes before the holder answers.
    w.now = w.now + Duration::from_millis(2);
    w.feed(1, NodeInput::Timeout);
    w.drive_alone(1);
    assert_eq!(w.nodes[1].stats().replication_fetches_failed, 1);
    w.pump();
    assert!(w.nodes[1].is_copy_of_record(&id(1)));
    assert!(w.nodes[1].store().is_record(&id(1)));
    assert_eq!(published_replicated(&w, 1), vec![2]);
    assert!(w.nodes[1].is_quiescent(), "{:?}", w.nodes[1].pending_work());
    w.nodes[1].check_invariants();
}

/// When that transfer fails instead, the copy is not wanted here any more: nothing is left
/// waiting for its seal.
#[test]
fn a_placed_copy_whose_deadline_passed_mid_transfer_and_whose_transfer_failed_is_forgotten() {
    let mut w = World::new(2, |config| {
        if config.node == NodeId(1) {
            config.replication_fetch_timeout = Duration::from_millis(1);
        }
    });
    w.put(0, 2, LEN);
    let event = replicate_event(2, LEN, 2);
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.drive_alone(1);
    w.now = w.now + Duration::from_millis(2);
    w.feed(1, NodeInput::Timeout);
    w.drive_alone(1);
    // The holder no longer has it by the time the request arrives.
    w.delete(0, 2);
    w.pump();
    assert!(!w.nodes[1].store().contains(&id(2)));
    assert_eq!(w.nodes[1].replicas_wanted(&id(2)), None);
    assert!(w.nodes[1].is_quiescent(), "{:?}", w.nodes[1].pending_work());
    w.nodes[1].check_invariants();
}

fn replay_refused(w: &mut World, node: u32, n: u64) {
    let event = DirectoryEvent::ReplayRefused {
        id: id(n),
        sizes: ObjectSizes {
            data_size: LEN,
            metadata_size: 0,
        },
        digest: ContentDigest(0xbad),
    };
    w.feed(node, NodeInput::DirectoryEvent { event });
    w.pump();
}

/// The registry refused this node's replayed copy (the id was put again with other bytes
/// elsewhere while it was away): the copy stays, served to no peer, and is no copy of record,
/// since it counts toward no copies of what the id names (kept pinned, a deleted-then-reput
/// id's old bytes would sit here for good, the simulator saw it).
#[test]
fn a_copy_of_record_whose_replay_is_refused_is_released_and_evictable() {
    let mut w = World::new(2, |_| {});
    let put = put_replicated(&mut w, 0, 1, 2, None);
    assert_eq!(w.reply_to(0, CLIENT, put), Some(Response::Done(Ok(()))));
    assert!(w.nodes[0].is_copy_of_record(&id(1)));
    replay_refused(&mut w, 0, 1);
    assert!(!w.nodes[0].is_copy_of_record(&id(1)));
    assert!(!w.nodes[0].store().is_record(&id(1)));
    assert!(w.nodes[0].holds_refused_copy(&id(1)));
    assert!(!w.nodes[0].serves_peers(&id(1)));
    assert_eq!(w.nodes[0].replicas_wanted(&id(1)), None);
    let evicted = w.request(0, Request::Evict { bytes: 1 << 30 });
    assert!(matches!(evicted, Some(Response::Evicted(o)) if o.objects == 1));
    w.nodes[0].check_invariants();
}

/// A put still waiting for copies of content the registry then refuses gets none: it fails
/// as a refused seal does, and no wait is left behind.
#[test]
fn a_waiting_put_whose_copy_is_refused_fails_as_a_refused_seal() {
    let mut w = World::new(2, |_| {});
    let put = put_replicated(&mut w, 0, 1, 3, Some(1000));
    copies_event(&mut w, 0, 1, 2);
    assert_eq!(w.reply_to(0, CLIENT, put), None, "held for the copies");
    replay_refused(&mut w, 0, 1);
    assert_eq!(
        w.reply_to(0, CLIENT, put),
        Some(Response::Done(Err(StoreError::ObjectExists(id(1)))))
    );
    w.advance(Duration::from_millis(1000));
    assert!(w.nodes[0].is_quiescent(), "{:?}", w.nodes[0].pending_work());
    w.nodes[0].check_invariants();
}

/// A put of an id whose earlier put still waits for copies (its object deleted here
/// meanwhile) ends that wait, with the copies it saw: one wait per id, and each put answered.
#[test]
fn a_second_waiting_put_of_an_id_ends_the_first_wait() {
    let mut w = World::new(2, |_| {});
    let first = put_replicated(&mut w, 0, 1, 3, Some(1000));
    copies_event(&mut w, 0, 1, 2);
    let deleted = w.request(0, Request::Delete { ids: vec![id(1)] });
    assert!(matches!(deleted, Some(Response::Deleted(_))), "{deleted:?}");
    let second = put_replicated(&mut w, 0, 1, 2, Some(1000));
    assert_eq!(
        w.reply_to(0, CLIENT, first),
        Some(Response::Done(Err(StoreError::TooFewReplicas {
            id: id(1),
            copies: 2,
            wanted: 3,
            in_cluster: true,
        })))
    );
    w.nodes[0].check_invariants();
    copies_event(&mut w, 0, 1, 2);
    assert_eq!(w.reply_to(0, CLIENT, second), Some(Response::Done(Ok(()))));
    w.nodes[0].check_invariants();
}
