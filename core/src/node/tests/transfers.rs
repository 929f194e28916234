//! Each protocol path between nodes: eager, rendezvous, READ failures, leases, admission,
//! coalescing, directory trouble.

use super::*;

#[test]
fn eager_fetch_copies_small_objects_in_chunks() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1500); // two 1 KiB receive slots
    w.fetch(1, &[1], Duration::from_millis(50));
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 1500));
    assert_eq!(w.count(0, |o| matches!(o, NodeOutput::SendEager { .. })), 2);
    assert_eq!(
        w.count(1, |o| matches!(o, NodeOutput::WriteLocal { .. })),
        2
    );
    assert_eq!(w.count(0, |o| matches!(o, NodeOutput::GrantRead { .. })), 0);
    // The new copy is published.
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0), NodeId(1)]);
    // The client holds a reference until it releases it.
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn rendezvous_fetch_reads_in_slices_then_finishes() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 10_000));
    let reads: Vec<(u16, RemoteRegion)> = w
        .log
        .iter()
        .filter_map(|(_, o)| match o {
            NodeOutput::PostRead { lane, remote, .. } => Some((*lane, *remote)),
            _ => None,
        })
        .collect();
    assert_eq!(reads.len(), 3, "10000 bytes in 4096-byte slices");
    assert_eq!(
        reads.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![0, 1, 0],
        "lanes round-robin"
    );
    let holder_info = w.nodes[0].store().sealed_info(&id(1)).unwrap();
    assert_eq!(
        reads[0].1.addr,
        key(0).base_addr + holder_info.region.offset
    );
    // Each lane reads with the key granted for it, not the arena's.
    assert_ne!(reads[0].1.rkey, key(0).rkey);
    assert_ne!(reads[0].1.rkey, reads[1].1.rkey, "a key per lane");
    assert_eq!(reads[0].1.rkey, reads[2].1.rkey, "lane 0 both times");
    assert!(w
        .sent(1)
        .iter()
        .any(|m| matches!(m, PeerMessage::Finish { .. })));
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::RevokeRead { .. })),
        1
    );
    assert!(w.granted[0].is_empty(), "Finish revokes the lease's keys");
    assert!(!w.nodes[0].store().is_pinned(&id(1)), "Finish unpins");
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn transfers_from_one_holder_take_turns_in_one_window_of_reads() {
    // A window of 2 READs of 4 KiB; two objects of 5 slices each, fetched at once.
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 20_000);
    w.put(0, 2, 20_000);
    w.fetch(1, &[1, 2], Duration::from_millis(50));
    assert!(w.replies(1)[0].iter().all(|r| r.is_ok()));
    let order: Vec<ObjectId> = w
        .log
        .iter()
        .filter(|(n, _)| *n == NodeId(1))
        .filter_map(|(_, o)| match o {
            NodeOutput::PostRead { object, .. } => Some(*object),
            _ => None,
        })
        .collect();
    assert_eq!(order.len(), 10, "{order:?}");
    // Every step checked that at most 2 READs were outstanding to node 0 in all (the node's
    // invariants); and object 2 did not wait for object 1's last READ to be posted.
    let first_of_2 = order.iter().position(|o| *o == id(2)).unwrap();
    let last_of_1 = order.iter().rposition(|o| *o == id(1)).unwrap();
    assert!(first_of_2 < last_of_1, "{order:?}");
    for n in [1, 2] {
        w.release(1, n);
    }
    w.assert_settled();
}

#[test]
fn concurrent_fetches_of_one_object_share_one_transfer() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    w.directory_up = false; // hold the lookup so both fetches overlap
    w.hand_fetch(1, &[1], Duration::from_millis(50), TransferMode::Auto);
    w.hand_fetch(1, &[1, 1], Duration::from_millis(50), TransferMode::Auto);
    let lookups: Vec<DirectoryOpId> = std::iter::from_fn(|| w.nodes[1].poll_output())
        .filter_map(|o| match o {
            NodeOutput::Directory {
                op,
                request: DirectoryRequest::Lookup { .. },
            } => Some(op),
            _ => None,
        })
        .collect();
    assert_eq!(lookups.len(), 1, "one lookup for two fetches");
    let (sizes, holders, digest) = w.locations[&id(1)].clone();
    let reply = DirectoryReply::Located {
        holders,
        sizes: Some(sizes),
        digest: Some(digest),
    };
    w.feed(
        1,
        NodeInput::DirectoryReply {
            op: lookups[0],
            reply,
        },
    );
    w.directory_up = true;
    w.pump();
    let replies = w.replies(1);
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[1].len(), 2);
    assert!(replies.iter().flatten().all(|r| r.is_ok()));
    assert_eq!(
        w.sent(1)
            .iter()
            .filter(|m| matches!(m, PeerMessage::FetchRequest { .. }))
            .count(),
        1
    );
    for _ in 0..3 {
        w.release(1, 1);
    }
    w.assert_settled();
}

#[test]
fn missing_object_fails_at_the_deadline_not_later() {
    let mut w = World::new(2, |_| {});
    w.fetch(1, &[7], Duration::from_millis(3));
    assert!(w.replies(1).is_empty());
    assert_eq!(
        w.nodes[1].poll_timeout(),
        Some(Instant::ZERO + Duration::from_millis(3))
    );
    w.advance(Duration::from_millis(3));
    let replies = w.replies(1);
    assert_eq!(replies[0][0], Err(FetchError::NotFound { id: id(7) }));
    w.assert_settled();
}

#[test]
fn published_object_wakes_a_waiting_fetch() {
    let mut w = World::new(2, |_| {});
    w.fetch(1, &[7], Duration::from_millis(30));
    w.put(0, 7, 100);
    let sizes = ObjectSizes {
        data_size: 100,
        metadata_size: 0,
    };
    let event = DirectoryEvent::Published {
        id: id(7),
        holder: NodeId(0),
        sizes,
        digest: ContentDigest::of(&World::bytes_of(7, 100), &[]),
    };
    w.feed(1, NodeInput::DirectoryEvent { event });
    w.pump();
    assert!(w.replies(1)[0][0].is_ok());
    w.release(1, 7);
    w.assert_settled();
}

#[test]
fn stale_location_falls_over_to_the_next_holder() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 10_000);
    w.put(2, 1, 10_000);
    // Node 0 drops its copy but the directory still lists it first.
    w.delete(0, 1);
    w.pump();
    w.locations.get_mut(&id(1)).unwrap().1 = vec![NodeId(0), NodeId(2)];
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 10_000));
    let requests = w
        .sent(1)
        .into_iter()
        .filter(|m| matches!(m, PeerMessage::FetchRequest { .. }))
        .count();
    assert!((1..=2).contains(&requests));
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn read_failure_drains_outstanding_reads_then_retries_elsewhere() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 20_000);
    w.put(2, 1, 20_000);
    w.fail_reads = 1;
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 20_000));
    assert_eq!(w.nodes[1].stats().transfers_failed, 1);
    assert_eq!(w.nodes[1].stats().transfers_succeeded, 1);
    // Both holders got a Finish: the failed transfer released its lease too.
    let finishes: Vec<NodeId> = w
        .log
        .iter()
        .filter_map(|(n, o)| match o {
            NodeOutput::Send {
                peer,
                message: PeerMessage::Finish { .. },
            } if n.0 == 1 => Some(*peer),
            _ => None,
        })
        .collect();
    assert_eq!(finishes.len(), 2);
    assert_ne!(finishes[0], finishes[1]);
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn lease_expires_without_finish() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    let sent = PeerMessage::FetchRequest {
        req: TransferId(99),
        id: id(1),
        eager_limit: 0,
        max_chunk_bytes: 1000,
    };
    w.feed(
        0,
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message: sent,
        },
    );
    let outputs: Vec<NodeOutput> = std::iter::from_fn(|| w.nodes[0].poll_output()).collect();
    assert!(outputs
        .iter()
        .any(|o| matches!(o, NodeOutput::GrantRead { .. })));
    // Nothing names the region until the fabric granted access.
    assert!(!outputs.iter().any(|o| matches!(o, NodeOutput::Send { .. })));
    w.feed(
        0,
        NodeInput::ReadGranted {
            peer: NodeId(1),
            req: TransferId(99),
            result: Ok(ReadGrant::default()),
        },
    );
    let outputs: Vec<NodeOutput> = std::iter::from_fn(|| w.nodes[0].poll_output()).collect();
    assert!(outputs.iter().any(|o| matches!(
        o,
        NodeOutput::Send {
            message: PeerMessage::Rendezvous { .. },
            ..
        }
    )));
    assert!(w.nodes[0].store().is_pinned(&id(1)));
    // Pinned: neither evicted nor deleted under the reader.
    assert_eq!(
        w.request(0, Request::Evict { bytes: u64::MAX }),
        Some(Response::Evicted(Default::default()))
    );
    w.advance(Duration::from_millis(9));
    assert!(w.nodes[0].store().is_pinned(&id(1)));
    w.advance(Duration::from_millis(1));
    assert!(!w.nodes[0].store().is_pinned(&id(1)));
    assert_eq!(w.nodes[0].stats().leases_expired, 1);
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::RevokeRead { .. })),
        1
    );
    w.assert_settled();
}

#[test]
fn holder_refuses_unknown_objects_and_duplicate_transfers() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    let request = |n| PeerMessage::FetchRequest {
        req: TransferId(5),
        id: id(n),
        eager_limit: 0,
        max_chunk_bytes: 1000,
    };
    w.feed(
        0,
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message: request(2),
        },
    );
    w.feed(
        0,
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message: request(1),
        },
    );
    w.feed(
        0,
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message: request(1),
        },
    );
    let kinds: Vec<String> = std::iter::from_fn(|| w.nodes[0].poll_output())
        .filter_map(|o| match o {
            NodeOutput::Send { message, .. } => Some(format!("{message}")),
            _ => None,
        })
        .collect();
    // The Rendezvous waits for the grant; the duplicate is refused at once.
    assert!(kinds[0].starts_with("NotFound"));
    assert!(kinds[1].starts_with("Error"), "{kinds:?}");
    assert_eq!(kinds.len(), 2, "{kinds:?}");
}

#[test]
fn admission_caps_bytes_in_flight_and_keeps_order() {
    let mut w = World::new(2, |c| c.max_bytes_in_flight = 16 * 1024);
    w.put(0, 1, 10_000);
    w.put(0, 2, 10_000);
    w.hand_fetch(1, &[1, 2], Duration::from_millis(50), TransferMode::Auto);
    // Drive node 1 alone (no message is delivered): the second object must wait for the first.
    w.drive_alone(1);
    let requests = w
        .sent(1)
        .iter()
        .filter(|m| matches!(m, PeerMessage::FetchRequest { .. }))
        .count();
    assert_eq!(
        requests, 1,
        "the second 10 KB object waits under a 16 KiB cap"
    );
    assert!(w.nodes[1].bytes_in_flight() <= 16 * 1024);
    w.pump();
    let replies = w.replies(1);
    assert!(replies[0].iter().all(|r| r.is_ok()));
    for n in [1, 2] {
        w.release(1, n);
    }
    w.assert_settled();
}

#[test]
fn full_store_fails_the_fetch_with_out_of_memory() {
    let mut w = World::new(2, |c| c.store = StoreConfig::single_arena(64 * 1024));
    w.put(0, 1, 40_000);
    w.connect(1, ClientId(9));
    let created = w.request_as(
        1,
        ClientId(9),
        Request::Create {
            id: id(2),
            data_size: 40_000,
            metadata_size: 0,
        },
    );
    assert!(matches!(created, Some(Response::Created(Ok(_)))));
    w.fetch(1, &[1], Duration::from_millis(50));
    assert!(matches!(
        w.replies(1)[0][0],
        Err(FetchError::Store(StoreError::OutOfMemory { .. }))
    ));
}

#[test]
fn a_fetch_into_a_full_persistent_store_waits_for_evicted_space_to_be_durable() {
    // Node 1's store is full of an object nobody holds; evicting it for the fetched copy
    // frees its space only once the removal is durable. The fetch waits for that, as a
    // client's create does, rather than failing with OutOfMemory.
    let mut w = World::new(2, |c| {
        c.store = StoreConfig {
            record_durable_changes: true,
            ..StoreConfig::single_arena(64 * 1024)
        };
        c.hold_replies_until_durable = true;
    });
    w.put(0, 1, 40_000);
    w.put(1, 2, 40_000);
    w.manual_disk = true;
    w.fetch(1, &[1], Duration::from_millis(50));
    assert_eq!(
        w.replies(1),
        Vec::<Vec<_>>::new(),
        "no reply before the space is free"
    );
    assert!(
        !w.nodes[1].store().contains(&id(2)),
        "the unheld object was evicted"
    );
    // The disk catches up (the eviction, then the fetched copy's seal).
    for _ in 0..3 {
        if !w.replies(1).is_empty() {
            break;
        }
        let upto = w
            .persisted
            .iter()
            .filter(|(n, _)| n.0 == 1)
            .map(|&(_, s)| s)
            .max();
        w.feed(
            1,
            NodeInput::Persisted {
                upto: upto.unwrap(),
            },
        );
        w.pump();
    }
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1, "{replies:?}");
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 40_000));
    w.release(1, 1);
    w.nodes[1].check_invariants();
}

#[test]
fn malformed_peer_bytes_are_an_error_not_a_panic() {
    let mut w = World::new(2, |_| {});
    let bytes = b"garbage!";
    let handled = w.feed(
        0,
        NodeInput::PeerBytes {
            peer: NodeId(1),
            bytes,
        },
    );
    assert!(matches!(handled, Handled::Malformed(_)), "{handled:?}");
    assert_eq!(w.nodes[0].stats().malformed_messages, 1);
    w.assert_settled();
}

#[test]
fn unavailable_directory_is_retried_then_reported() {
    let mut w = World::new(2, |c| c.max_directory_attempts = 2);
    w.directory_up = false;
    w.fetch(1, &[1], Duration::from_secs(60));
    // Each attempt times out; after the last the fetch fails with a reason.
    for _ in 0..4 {
        w.advance(Duration::from_secs(2));
    }
    assert!(matches!(
        w.replies(1)[0][0],
        Err(FetchError::DirectoryUnavailable { .. })
    ));
}

#[test]
fn thresholds_are_exposed_per_peer() {
    let w = World::new(2, |c| c.threshold = ThresholdPolicy::Fixed(1 << 30));
    let threshold = w.nodes[0].eager_threshold(NodeId(1)).unwrap();
    assert_eq!(threshold.source, ThresholdSource::FixedCappedBySlots);
    assert_eq!(threshold.bytes, w.nodes[0].config().eager_capacity_bytes());
}

#[test]
fn a_forced_mode_overrides_the_threshold() {
    // The threshold is 2048 bytes; four 1 KiB receive slots carry about 4000.
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1000);
    w.put(0, 2, 3000);
    let served = |w: &World| {
        let stats = w.nodes[0].stats();
        (stats.served_eager, stats.served_rendezvous)
    };
    w.fetch_and_drop(1, 1, 1000, TransferMode::Rendezvous);
    assert_eq!(served(&w), (0, 1), "a small object read by rendezvous");
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(served(&w), (1, 1), "auto sends it eagerly");
    w.fetch_and_drop(1, 2, 3000, TransferMode::Eager);
    assert_eq!(served(&w), (2, 1), "above the threshold, still eager");
    w.fetch_and_drop(1, 2, 3000, TransferMode::Auto);
    assert_eq!(served(&w), (2, 2), "auto reads it");
    w.put(0, 3, 10_000);
    w.fetch_and_drop(1, 3, 10_000, TransferMode::Eager);
    assert_eq!(served(&w), (2, 3), "too large for the receive slots: read");
    w.assert_settled();
}

#[test]
fn fetching_again_skips_the_lookup() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(w.lookups(1), 1);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Rendezvous);
    assert_eq!(w.lookups(1), 1, "the location was remembered");
    assert_eq!(w.nodes[1].stats().location_cache_hits, 2);
    assert_eq!(w.nodes[1].stats().stale_locations, 0);
    w.assert_settled();
}

#[test]
fn a_stale_location_falls_back_to_the_directory() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    // The only remembered holder loses its copy; another node has one.
    w.delete(0, 1);
    w.pump();
    w.put(2, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    let stats = w.nodes[1].stats().clone();
    assert_eq!((stats.location_cache_hits, stats.stale_locations), (1, 1));
    assert_eq!(w.lookups(1), 2, "asked the directory after the stale guess");
    assert_eq!(w.nodes[0].stats().served_refused, 1, "node 0 said NotFound");
    // The fresh answer is remembered in turn.
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(w.lookups(1), 2);
    assert_eq!(w.nodes[1].stats().stale_locations, 1);
    w.assert_settled();
}

#[test]
fn a_stale_location_of_a_vanished_object_ends_as_not_found() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.delete(0, 1);
    w.pump();
    w.fetch(1, &[1], Duration::from_millis(20));
    assert_eq!(w.nodes[1].stats().stale_locations, 1);
    assert_eq!(w.replies(1).len(), 1, "waits for a publication");
    w.advance(Duration::from_millis(25));
    let replies = w.replies(1);
    assert_eq!(
        replies.last().unwrap()[0],
        Err(FetchError::NotFound { id: id(1) })
    );
    w.assert_settled();
}

#[test]
fn no_location_cache_means_a_lookup_every_time() {
    let mut w = World::new(2, |c| c.location_cache_entries = 0);
    w.put(0, 1, 1000);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    w.fetch_and_drop(1, 1, 1000, TransferMode::Auto);
    assert_eq!(w.lookups(1), 2);
    assert_eq!(w.nodes[1].stats().location_cache_hits, 0);
    w.assert_settled();
}

#[test]
fn metrics_count_each_path_per_peer() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 1500); // eager
    w.put(0, 2, 10_000); // rendezvous
    w.put(2, 3, 20_000);
    w.put(0, 3, 20_000);
    w.fetch(1, &[1, 2], Duration::from_millis(50));
    w.fail_reads = 1;
    w.fetch(1, &[3], Duration::from_millis(50));
    w.fetch(1, &[99], Duration::from_millis(50));
    w.advance(Duration::from_millis(60));
    let m = w.nodes[1].metrics();
    let t = &m.counters.transfer_outcomes;
    assert_eq!(
        (t.eager_ok, t.rendezvous_ok, t.rendezvous_failed),
        (1, 2, 1)
    );
    let r = &m.counters.fetch_results;
    assert_eq!((r.ok, r.not_found, r.timeout, r.error), (3, 1, 0, 0));
    assert_eq!(
        m.counters.retries, 1,
        "the failed READ moved to the other holder"
    );
    let fetched: u64 = m.peers.iter().map(|p| p.counters.bytes_fetched).sum();
    assert_eq!(fetched, 1500 + 10_000 + 20_000);
    assert_eq!(fetched, m.counters.bytes_fetched);
    let read_errors: u64 = m.peers.iter().map(|p| p.counters.read_errors).sum();
    assert_eq!(read_errors, 1);
    // Time stands still in this harness: the histograms count, their sums stay 0.
    let small = &m.fetch_latency[0].1;
    assert_eq!(small.count, 3, "all three objects are below 64 KiB");
    assert!(m.directory_latency.count > 0);
    // The holders count what they served, per requester.
    let served: u64 = [0, 2]
        .iter()
        .map(|&n| w.nodes[n].metrics().counters.bytes_served)
        .sum();
    assert!(served >= fetched, "a failed rendezvous was served too");
    let holder = w.nodes[0].metrics();
    let to_requester = holder.peers.iter().find(|p| p.node == NodeId(1)).unwrap();
    assert!(to_requester.counters.objects_served >= 2);
    assert_eq!(holder.leases_held, 0);
    for n in [1, 2, 3] {
        w.release(1, n);
    }
    w.assert_settled();
}

#[test]
fn a_refused_grant_refuses_the_fetch_and_unpins() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    w.refuse_grants = Some(GrantError::WindowsExhausted { limit: 64 });
    w.fetch(1, &[1], Duration::from_millis(50));
    w.advance(Duration::from_millis(60));
    let replies = w.replies(1);
    assert!(replies[0][0].is_err(), "fetched without READ access");
    assert!(w.sent(0).iter().any(|m| matches!(
        m,
        PeerMessage::Error { reason, .. } if reason.contains("all 64 memory windows are bound")
    )));
    assert!(!w.nodes[0].store().is_pinned(&id(1)));
    assert_eq!(w.nodes[0].metrics().leases_held, 0);
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::RevokeRead { .. })),
        0,
        "nothing granted, nothing to revoke"
    );
    w.assert_settled();
}

#[test]
fn the_object_stays_pinned_until_the_fabric_confirms_the_revocation() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 10_000);
    w.hold_revocations = true;
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 10_000));
    // Finish arrived and the keys are being revoked: still pinned, still leased.
    assert!(w.nodes[0].store().is_pinned(&id(1)));
    assert_eq!(w.nodes[0].metrics().leases_held, 1);
    // The lease's end changes nothing while the revocation is under way.
    w.advance(Duration::from_millis(20));
    assert!(w.nodes[0].store().is_pinned(&id(1)));
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::RevokeRead { .. })),
        1
    );
    w.hold_revocations = false;
    let held = std::mem::take(&mut w.held_revocations);
    w.fabric_answers.extend(held);
    w.pump();
    assert!(!w.nodes[0].store().is_pinned(&id(1)));
    assert_eq!(w.nodes[0].metrics().leases_held, 0);
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn a_fetch_waiting_for_a_connection_goes_on_when_it_comes_up() {
    let mut w = World::new(2, |c| c.retry_backoff = Duration::from_millis(100));
    w.put(0, 1, 1500);
    // The holder's connection is not up yet (it restarted, or was never made).
    w.feed(1, NodeInput::PeerLost { peer: NodeId(0) });
    w.fetch(1, &[1], Duration::from_secs(1));
    assert!(
        w.replies(1).is_empty(),
        "no connected holder: the fetch pauses"
    );
    // The connection comes up well before the pause ends: the fetch goes on at once.
    w.link_up(1, 0);
    w.pump();
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1, "answered without waiting out the pause");
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 1500));
    w.release(1, 1);
    w.assert_settled();
}

/// The link to the only holder fails (a queue pair in the error state) and is re-dialled a
/// second later: the fetch waits for it instead of spending its rounds in 300 ms.
#[test]
fn a_fetch_whose_only_holder_lost_its_link_waits_for_the_link_past_its_rounds() {
    let mut w = World::new(2, |c| c.retry_backoff = Duration::from_millis(100));
    w.put(0, 1, 1500);
    w.feed(1, NodeInput::PeerLost { peer: NodeId(0) });
    w.fetch(1, &[1], Duration::from_secs(10));
    // Three rounds' backoffs (100 + 200 ms) and more: without the wait the fetch failed here.
    for _ in 0..15 {
        w.advance(Duration::from_millis(100));
    }
    assert!(
        w.replies(1).is_empty(),
        "still waiting for the holder's link"
    );
    assert!(w.nodes[1].stats().fetches_waiting_for_links > 0);
    w.link_up(1, 0);
    w.pump();
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1, "answered once the link is back");
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 1500));
    w.release(1, 1);
    w.assert_settled();
}

/// The wait for a holder's link is bounded: a link that stays down fails the fetch after
/// `holder_link_wait`, well before the client's deadline.
#[test]
fn a_fetch_waits_for_a_holders_link_no_longer_than_the_bound() {
    let mut w = World::new(2, |c| {
        c.retry_backoff = Duration::from_millis(100);
        c.holder_link_wait = Duration::from_secs(1);
    });
    w.put(0, 1, 1500);
    w.feed(1, NodeInput::PeerLost { peer: NodeId(0) });
    w.fetch(1, &[1], Duration::from_secs(30));
    for _ in 0..8 {
        w.advance(Duration::from_millis(100));
    }
    assert!(w.replies(1).is_empty(), "within the bound: waiting");
    // The bound (1 s), then the rounds' own backoffs (100 + 200 ms) and the lookups.
    for _ in 0..20 {
        w.advance(Duration::from_millis(100));
    }
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1, "the bound passed: the fetch is answered");
    assert!(
        matches!(&replies[0][0], Err(FetchError::SourcesFailed { .. })),
        "{:?}",
        replies[0][0]
    );
}

#[test]
fn fetch_requests_of_one_pass_are_answered_together_object_by_object() {
    let mut w = World::new(5, |_| {});
    w.put(0, 1, 800);
    w.put(0, 2, 600);
    let request = |n, req| PeerMessage::FetchRequest {
        req: TransferId(req),
        id: id(n),
        eager_limit: 4096,
        max_chunk_bytes: 1024,
    };
    // Four requests in one pass (no output polled in between), two objects interleaved.
    for (peer, n, req) in [(1, 1, 11), (2, 2, 12), (3, 1, 13), (4, 1, 14)] {
        w.feed(
            0,
            NodeInput::PeerMessage {
                peer: NodeId(peer),
                message: request(n, req),
            },
        );
        assert!(!w.nodes[0].outputs_queued(), "held for the pass");
    }
    let holder_1 = w.nodes[0].store().sealed_info(&id(1)).unwrap().region;
    let holder_2 = w.nodes[0].store().sealed_info(&id(2)).unwrap().region;
    let sent: Vec<(u32, u64, ObjectId, LocalRegion)> =
        std::iter::from_fn(|| w.nodes[0].poll_output())
            .filter_map(|o| match o {
                NodeOutput::SendEager {
                    peer,
                    header,
                    source,
                    object,
                } => Some((peer.0, header.req.0, object, source)),
                _ => None,
            })
            .collect();
    // Object 1's requesters in arrival order, then object 2's; each its own request and the
    // right object's bytes.
    assert_eq!(
        sent,
        vec![
            (1, 11, id(1), holder_1),
            (3, 13, id(1), holder_1),
            (4, 14, id(1), holder_1),
            (2, 12, id(2), holder_2),
        ]
    );
    assert_eq!(w.nodes[0].stats().coalesced_requests, 2);
    assert_eq!(w.nodes[0].stats().served_eager, 4);
}

#[test]
fn a_held_request_is_answered_against_the_store_at_the_end_of_its_pass() {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, 800);
    w.feed(
        0,
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message: PeerMessage::FetchRequest {
                req: TransferId(7),
                id: id(1),
                eager_limit: 4096,
                max_chunk_bytes: 1024,
            },
        },
    );
    // Deleted in the same pass, before the request is answered: refused, not served from
    // freed memory.
    w.hand_request(0, CLIENT, Request::Release { id: id(1) });
    w.hand_request(0, CLIENT, Request::Delete { ids: vec![id(1)] });
    assert!(w.nodes[0].store().sealed_info(&id(1)).is_none());
    w.pump();
    assert_eq!(w.count(0, |o| matches!(o, NodeOutput::SendEager { .. })), 0);
    assert!(w.log.iter().any(|(n, o)| n.0 == 0
        && matches!(
            o,
            NodeOutput::Send {
                peer: NodeId(1),
                message: PeerMessage::NotFound { req: TransferId(7) }
            }
        )));
}

#[test]
fn an_eager_stream_longer_than_the_reply_timeout_completes_while_its_chunks_keep_coming() {
    let mut w = World::new(2, |c| {
        c.reply_timeout = Duration::from_millis(5);
        c.max_eager_chunks = 64;
    });
    w.put(0, 1, 20_000); // about 20 chunks of 1 KiB receive slots
    w.hand_fetch(1, &[1], Duration::from_secs(1), TransferMode::Eager);
    // Up to the holder's answer: every chunk is queued for node 1 at once.
    w.pump_until(|w| w.messages.len() >= 10);
    let mut chunks = 0;
    // One chunk every millisecond: the whole stream takes four times the reply timeout,
    // but no chunk comes later than one reply timeout after the one before.
    while !w.messages.is_empty() {
        w.now = w.now + Duration::from_millis(1);
        let now = w.now;
        let _ = w.nodes[1].handle(now, NodeInput::Timeout);
        let left = w.messages.len();
        w.pump_until(|w| w.messages.len() < left);
        chunks += 1;
    }
    w.pump();
    assert!(chunks >= 20, "{chunks} messages delivered");
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, 20_000));
    assert_eq!(w.nodes[1].stats().transfers_failed, 0);
    w.release(1, 1);
    w.pump();
    w.assert_settled();
}

/// READs posted by `node` so far.
fn reads_posted(w: &World, node: u32) -> usize {
    w.count(node, |o| matches!(o, NodeOutput::PostRead { .. }))
}

/// Runs node 1's fetch with every round of READs in flight for `per_round` of time (messages
/// still go at once), until node 1 answers; at most `rounds` rounds.
fn fetch_with_slow_reads(w: &mut World, per_round: Duration, rounds: usize) {
    w.pump_until(|w| !w.reads.is_empty());
    for _ in 0..rounds {
        if !w.replies(1).is_empty() {
            return;
        }
        // READs the last completions asked for are posted now, and are in flight too.
        w.drive_alone(1);
        let in_flight: Vec<_> = w.reads.drain(..).collect();
        w.advance(per_round);
        let before = reads_posted(w, 1);
        w.reads.extend(in_flight);
        // Deliver the READs that were in flight, not the ones their completions post.
        w.pump_until(|w| w.reads.len() == reads_posted(w, 1) - before);
    }
    panic!("no answer after {rounds} rounds of READs");
}

fn sent_by(w: &World, node: u32, pred: impl Fn(&PeerMessage) -> bool) -> usize {
    w.count(
        node,
        |o| matches!(o, NodeOutput::Send { message, .. } if pred(message)),
    )
}

/// 160 KiB in 4 KiB READs, two at a time, a round of READs a millisecond: 20 ms, two leases of
/// 10 ms (whose read windows are 7.5 ms).
const SLOW_LEN: u64 = 160 * 1024;

#[test]
fn an_object_whose_reads_need_several_leases_is_fetched_with_lease_extensions() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, SLOW_LEN);
    w.hand_fetch(1, &[1], Duration::from_secs(1), TransferMode::Rendezvous);
    fetch_with_slow_reads(&mut w, Duration::from_millis(1), 100);
    let replies = w.replies(1);
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, SLOW_LEN));
    let (requester, holder) = (w.nodes[1].stats(), w.nodes[0].stats());
    assert_eq!(
        requester.transfers_failed, 0,
        "one transfer, never too slow"
    );
    // Asked half way through each lease (5, 10, 15 ms, and 20 if the last round is late).
    assert!(
        (3..=4).contains(&requester.lease_extensions_asked),
        "{}",
        requester.lease_extensions_asked
    );
    assert_eq!(holder.leases_extended, requester.lease_extensions_asked);
    assert_eq!(holder.leases_expired, 0, "the lease held to the Finish");
    let extended = sent_by(&w, 0, |m| matches!(m, PeerMessage::LeaseExtended { .. }));
    assert_eq!(extended as u64, holder.leases_extended);
    w.release(1, 1);
    w.assert_settled();
}

#[test]
fn a_holder_that_does_not_extend_ends_the_transfer_as_too_slow() {
    // The holder extends no lease: it says nothing to the requester's ExtendLease.
    let mut w = World::new(2, |c| c.max_source_rounds = 1);
    w.nodes[0].config.max_lease_extensions = 0;
    w.put(0, 1, SLOW_LEN);
    w.hand_fetch(1, &[1], Duration::from_secs(1), TransferMode::Rendezvous);
    fetch_with_slow_reads(&mut w, Duration::from_millis(1), 100);
    let replies = w.replies(1);
    let Err(FetchError::SourcesFailed { last_error, .. }) = &replies[0][0] else {
        panic!("{:?}", replies[0][0]);
    };
    assert!(
        matches!(
            **last_error,
            SourceFailure::Holder {
                failure: TransferFailure::ReadsTooSlow,
                ..
            }
        ),
        "{last_error:?}"
    );
    assert_eq!(w.nodes[1].stats().lease_extensions_asked, 1);
    assert_eq!(w.nodes[0].stats().leases_extended, 0);
    assert_eq!(
        sent_by(&w, 0, |m| matches!(m, PeerMessage::LeaseExtended { .. })),
        0
    );
    w.advance(Duration::from_millis(20));
    w.assert_settled();
}

#[test]
fn a_requester_asks_for_at_most_its_bound_of_extensions() {
    let mut w = World::new(2, |c| c.max_source_rounds = 1);
    w.nodes[1].config.max_lease_extensions = 1;
    w.put(0, 1, 3 * SLOW_LEN);
    w.hand_fetch(1, &[1], Duration::from_secs(1), TransferMode::Rendezvous);
    fetch_with_slow_reads(&mut w, Duration::from_millis(1), 200);
    let replies = w.replies(1);
    assert!(
        matches!(replies[0][0], Err(FetchError::SourcesFailed { .. })),
        "{:?}",
        replies[0][0]
    );
    assert_eq!(w.nodes[1].stats().lease_extensions_asked, 1);
    w.advance(Duration::from_millis(20));
    w.assert_settled();
}

#[test]
fn a_lease_that_ended_is_not_extended() {
    let mut w = World::new(2, |_| {});
    let message = PeerMessage::ExtendLease {
        req: TransferId(99),
    };
    w.feed(
        0,
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message,
        },
    );
    w.pump();
    assert_eq!(sent_by(&w, 0, |_| true), 0, "nothing to say");
    assert_eq!(w.nodes[0].stats().leases_extended, 0);
}

#[test]
fn a_transfer_whose_reads_stopped_progressing_asks_no_more_extensions() {
    let mut w = World::new(2, |c| c.max_source_rounds = 1);
    w.put(0, 1, SLOW_LEN);
    w.hand_fetch(1, &[1], Duration::from_secs(1), TransferMode::Rendezvous);
    w.pump_until(|w| !w.reads.is_empty());
    // READs progress a round a millisecond until the first extension is asked for...
    let hung = loop {
        w.drive_alone(1);
        let in_flight: Vec<_> = w.reads.drain(..).collect();
        w.advance(Duration::from_millis(1));
        if w.nodes[1].stats().lease_extensions_asked == 1 {
            break in_flight;
        }
        let before = reads_posted(&w, 1);
        w.reads.extend(in_flight);
        w.pump_until(|w| w.reads.len() == reads_posted(w, 1) - before);
    };
    assert_eq!(w.nodes[0].stats().leases_extended, 1);
    // ... then hang past the extended window: no READ done since, so no second extension.
    for _ in 0..10 {
        w.advance(Duration::from_millis(1));
    }
    assert_eq!(w.nodes[1].stats().lease_extensions_asked, 1);
    w.reads.extend(hung);
    w.pump();
    let replies = w.replies(1);
    let Err(FetchError::SourcesFailed { last_error, .. }) = &replies[0][0] else {
        panic!("{:?}", replies[0][0]);
    };
    assert!(
        matches!(
            **last_error,
            SourceFailure::Holder {
                failure: TransferFailure::ReadsTooSlow,
                ..
            }
        ),
        "{last_error:?}"
    );
    w.advance(Duration::from_millis(20));
    w.assert_settled();
}
