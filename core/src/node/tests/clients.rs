//! Local clients through the node's interface: the `Hello` rules, validation, `locate`, and
//! replies and space held until changes are durable.

use super::*;

fn durable(config: &mut NodeConfig) {
    config.store.record_durable_changes = true;
    config.hold_replies_until_durable = true;
}

fn create(w: &mut World, node: u32, n: u64, len: u64) -> Option<Response> {
    w.request(
        node,
        Request::Create {
            id: id(n),
            data_size: len,
            metadata_size: 0,
        },
    )
}

#[test]
fn the_first_request_must_be_hello_of_this_version() {
    let mut w = World::new(1, |_| {});
    // No Hello: refused and closed.
    w.feed(
        0,
        NodeInput::ClientConnected {
            client: ClientId(7),
        },
    );
    let reply = w.request_as(0, ClientId(7), Request::List);
    assert!(
        matches!(reply, Some(Response::Error(StoreError::BadRequest(ref r))) if r.contains("Hello")),
        "{reply:?}"
    );
    assert_eq!(w.closed.len(), 1);
    assert_eq!(w.closed[0].1, ClientId(7));
    // Another version: refused, saying which one the node speaks, and closed.
    w.feed(
        0,
        NodeInput::ClientConnected {
            client: ClientId(8),
        },
    );
    let reply = w.request_as(
        0,
        ClientId(8),
        Request::Hello {
            protocol_version: PROTOCOL_VERSION + 1,
            client_name: "future".into(),
        },
    );
    let Some(Response::Error(StoreError::BadRequest(reason))) = reply else {
        panic!("{reply:?}");
    };
    assert!(reason.contains(&PROTOCOL_VERSION.to_string()), "{reason}");
    assert_eq!(w.closed.len(), 2);
    // A second Hello on a good connection: an error, the connection stays.
    let reply = w.request(
        0,
        Request::Hello {
            protocol_version: PROTOCOL_VERSION,
            client_name: "again".into(),
        },
    );
    assert!(matches!(
        reply,
        Some(Response::Error(StoreError::BadRequest(_)))
    ));
    assert_eq!(w.closed.len(), 2);
    // The refused connections are gone once the driver reports them.
    w.feed(
        0,
        NodeInput::ClientDisconnected {
            client: ClientId(7),
        },
    );
    w.feed(
        0,
        NodeInput::ClientDisconnected {
            client: ClientId(8),
        },
    );
    assert_eq!(w.nodes[0].client_count(), 1);
    let Some(Response::Stats(stats)) = w.request(0, Request::Stats) else {
        panic!("stats");
    };
    assert_eq!(stats.client_count, 1, "the fetch client is not counted");
}

#[test]
fn too_many_ids_is_a_bad_request() {
    let mut w = World::new(1, |_| {});
    let reply = w.request(
        0,
        Request::Get {
            ids: vec![id(1); crate::client_protocol::MAX_IDS_PER_REQUEST + 1],
            timeout_ms: Some(0),
        },
    );
    assert!(matches!(
        reply,
        Some(Response::Error(StoreError::BadRequest(_)))
    ));
    w.nodes[0].check_invariants();
}

#[test]
fn a_seal_is_answered_once_it_is_durable() {
    let mut w = World::new(1, durable);
    w.manual_disk = true;
    assert!(matches!(
        create(&mut w, 0, 1, 100),
        Some(Response::Created(Ok(_)))
    ));
    let seal = w.request(
        0,
        Request::Seal {
            id: id(1),
            release: true,
            digest: ContentDigest::of(&[0; 100], &[]),
        },
    );
    assert_eq!(seal, None, "no reply before the seal is durable");
    assert_eq!(w.persisted, vec![(NodeId(0), 1)]);
    assert!(w.nodes[0].pending_work()[0].contains("waits for durable change 1"));
    // Other requests are served meanwhile.
    assert_eq!(
        w.request(0, Request::Contains { id: id(1) }),
        Some(Response::Contains(true))
    );
    w.feed(0, NodeInput::Persisted { upto: 1 });
    w.pump();
    let sealed = w.log.iter().any(|(_, o)| {
        matches!(
            o,
            NodeOutput::Reply {
                request: RequestId(3),
                response: Response::Done(Ok(())),
                ..
            }
        )
    });
    assert!(sealed, "the seal's reply (request 3) went out once durable");
    w.assert_settled();
}

#[test]
fn removed_space_is_reused_only_once_the_removal_is_durable() {
    let mut w = World::new(1, |c| {
        durable(c);
        c.store = StoreConfig {
            record_durable_changes: true,
            ..StoreConfig::single_arena(64 * 1024)
        };
    });
    w.put(0, 1, 40_000);
    w.manual_disk = true;
    let first = w.nodes[0].store().sealed_info(&id(1)).unwrap().region;
    // Deleting it: the reply waits for the removal to be durable...
    assert_eq!(w.request(0, Request::Delete { ids: vec![id(1)] }), None);
    // ...and so does a create that needs its space: parked, not failed, nothing evicted.
    assert_eq!(create(&mut w, 0, 2, 40_000), None);
    assert_eq!(
        w.nodes[0].store().quarantined_bytes(),
        first.len.next_multiple_of(64)
    );
    let (_, seq) = *w.persisted.last().unwrap();
    w.feed(0, NodeInput::Persisted { upto: seq });
    w.pump();
    let replies: Vec<&Response> = w
        .log
        .iter()
        .filter_map(|(_, o)| match o {
            NodeOutput::Reply { response, .. } => Some(response),
            _ => None,
        })
        .collect();
    assert!(matches!(replies[replies.len() - 2], Response::Deleted(r) if r == &vec![Ok(())]));
    let Response::Created(Ok(info)) = replies[replies.len() - 1] else {
        panic!("{replies:?}");
    };
    assert_eq!(
        info.region.offset, first.offset,
        "the freed block is reused"
    );
    w.nodes[0].check_invariants();
}

#[test]
fn a_parked_create_of_a_client_that_left_is_dropped() {
    let mut w = World::new(1, |c| {
        durable(c);
        c.store = StoreConfig {
            record_durable_changes: true,
            ..StoreConfig::single_arena(64 * 1024)
        };
    });
    w.put(0, 1, 40_000);
    w.manual_disk = true;
    w.request(0, Request::Delete { ids: vec![id(1)] });
    assert_eq!(create(&mut w, 0, 2, 40_000), None);
    w.feed(0, NodeInput::ClientDisconnected { client: CLIENT });
    let (_, seq) = *w.persisted.last().unwrap();
    w.feed(0, NodeInput::Persisted { upto: seq });
    w.pump();
    assert!(!w.nodes[0].store().contains(&id(2)));
    assert_eq!(w.nodes[0].store().stats().object_count, 0);
    w.nodes[0].check_invariants();
}

#[test]
fn locate_asks_the_directory_and_says_when_it_does_not_answer() {
    let mut w = World::new(2, |_| {});
    w.put(0, 1, 100);
    let reply = w.request(1, Request::Locate { id: id(1) });
    assert_eq!(
        reply,
        Some(Response::Located {
            holders: vec![NodeId(0)],
            sizes: Some((100, 0)),
            digest: Some(ContentDigest::of(&World::bytes_of(1, 100), &[])),
        })
    );
    w.directory_up = false;
    assert_eq!(w.request(1, Request::Locate { id: id(1) }), None);
    w.advance(Duration::from_secs(3));
    let unavailable = w.log.iter().any(|(n, o)| {
        n.0 == 1
            && matches!(
                o,
                NodeOutput::Reply {
                    response: Response::Error(StoreError::DirectoryUnavailable(_)),
                    ..
                }
            )
    });
    assert!(
        unavailable,
        "a locate the directory never answers fails after its timeout"
    );
}

#[test]
fn a_standalone_node_answers_locate_itself_and_asks_no_directory() {
    let mut w = World::new(1, |c| c.standalone = true);
    w.put(0, 1, 100);
    assert_eq!(
        w.request(0, Request::Locate { id: id(1) }),
        Some(Response::Located {
            holders: vec![NodeId(0)],
            sizes: Some((100, 0)),
            digest: Some(ContentDigest::of(&World::bytes_of(1, 100), &[])),
        })
    );
    assert_eq!(w.count(0, |o| matches!(o, NodeOutput::Directory { .. })), 0);
}

#[test]
fn an_unanswered_release_gets_no_reply_and_its_failure_waits_for_the_next_flush() {
    let mut w = World::new(1, |_| {});
    w.put(0, 1, 100);
    let got = w.request(
        0,
        Request::Get {
            ids: vec![id(1)],
            timeout_ms: Some(0),
        },
    );
    assert!(matches!(got, Some(Response::Got(_))), "{got:?}");
    let replies_before = w.count(0, |o| matches!(o, NodeOutput::Reply { .. }));
    // The reference the get took is dropped, silently.
    assert_eq!(w.request(0, Request::ReleaseUnanswered { id: id(1) }), None);
    assert_eq!(w.nodes[0].store().list()[0].pin_count, 0);
    // A second one fails (nothing held): still no reply, but the next flush reports it, once.
    assert_eq!(w.request(0, Request::ReleaseUnanswered { id: id(1) }), None);
    assert_eq!(
        w.count(0, |o| matches!(o, NodeOutput::Reply { .. })),
        replies_before
    );
    assert_eq!(w.nodes[0].stats().unanswered_release_failures, 1);
    assert_eq!(
        w.request(0, Request::Flush),
        Some(Response::Done(Err(StoreError::NotHeld(id(1)))))
    );
    assert_eq!(w.request(0, Request::Flush), Some(Response::Done(Ok(()))));
    w.assert_settled();
}
