//! One id names one content: a cluster node's seal waits for the directory's verdict on the
//! object's publication, and a fetched copy is sealed only when its bytes hash to the id's
//! digest.

use super::*;

fn is_publish(request: &DirectoryRequest) -> bool {
    matches!(request, DirectoryRequest::Publish { .. })
}

fn is_withdraw(request: &DirectoryRequest) -> bool {
    matches!(request, DirectoryRequest::Withdraw { .. })
}

fn directory_requests(w: &World, node: u32, pred: fn(&DirectoryRequest) -> bool) -> usize {
    w.count(
        node,
        |o| matches!(o, NodeOutput::Directory { request, .. } if pred(request)),
    )
}

/// A world whose directory waits for the test to answer, with a seal of object 1 on node 0
/// waiting for its verdict; the seal's request id.
fn seal_waiting_for_the_directory(bytes: &[u8]) -> (World, RequestId) {
    let mut w = World::new(2, |_| {});
    w.hold_directory = true;
    assert_eq!(
        w.put_bytes(0, 1, bytes),
        None,
        "no reply before the verdict"
    );
    let seal = w.last_request();
    assert!(
        w.nodes[0].store().sealed_info(&id(1)).is_none(),
        "not sealed yet"
    );
    assert_eq!(directory_requests(&w, 0, is_publish), 1);
    let held = &w.held_directory[0].2;
    assert_eq!(
        *held,
        DirectoryRequest::Publish {
            id: id(1),
            sizes: ObjectSizes {
                data_size: bytes.len() as u64,
                metadata_size: 0,
            },
            digest: ContentDigest::of(bytes, &[]),
        },
        "the publication names the digest the client sent"
    );
    (w, seal)
}

#[test]
fn a_cluster_seal_is_answered_once_the_directory_accepted_the_publication() {
    let bytes = World::bytes_of(1, 500);
    let (mut w, seal) = seal_waiting_for_the_directory(&bytes);
    // Other requests are served meanwhile; the object is not sealed for them.
    assert_eq!(
        w.request(0, Request::Contains { id: id(1) }),
        Some(Response::Contains(false))
    );
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    assert_eq!(w.reply_to(0, CLIENT, seal), Some(Response::Done(Ok(()))));
    assert!(w.nodes[0].store().sealed_info(&id(1)).is_some());
    assert_eq!(
        w.nodes[0].store().digest(&id(1)),
        Some(ContentDigest::of(&bytes, &[]))
    );
    assert_eq!(
        directory_requests(&w, 0, is_publish),
        1,
        "published before the seal, not again after it"
    );
    assert!(w.held_directory.is_empty());
    w.assert_settled();
}

#[test]
fn a_seal_refused_for_another_content_fails_with_object_exists_and_drops_the_object() {
    let (mut w, seal) = seal_waiting_for_the_directory(&[1; 100]);
    let theirs = ContentDigest::of(&[2; 100], &[]);
    w.answer_directory(
        0,
        is_publish,
        DirectoryReply::Conflict {
            sizes: ObjectSizes {
                data_size: 100,
                metadata_size: 0,
            },
            digest: theirs,
        },
    );
    assert_eq!(
        w.reply_to(0, CLIENT, seal),
        Some(Response::Done(Err(StoreError::ObjectExists(id(1)))))
    );
    assert!(!w.nodes[0].store().contains(&id(1)), "the object is gone");
    assert_eq!(w.nodes[0].store().stats().object_count, 0);
    assert_eq!(w.nodes[0].stats().id_conflicts, 1);
    assert!(
        w.held_directory.is_empty(),
        "nothing to withdraw: the directory never listed it"
    );
    // The id is free here: the client may create it again.
    assert!(matches!(
        w.request(
            0,
            Request::Create {
                id: id(1),
                data_size: 10,
                metadata_size: 0,
            },
        ),
        Some(Response::Created(Ok(_)))
    ));
}

#[test]
fn a_seal_the_directory_cannot_judge_is_made_here_and_published_later() {
    let (mut w, seal) = seal_waiting_for_the_directory(&[3; 100]);
    w.answer_directory(
        0,
        is_publish,
        DirectoryReply::Unavailable {
            reason: "head restarting".into(),
        },
    );
    assert_eq!(w.reply_to(0, CLIENT, seal), Some(Response::Done(Ok(()))));
    assert!(w.nodes[0].store().sealed_info(&id(1)).is_some());
    // The publication is retried in the background, and its answer changes nothing here.
    w.advance(w.nodes[0].config().retry_backoff);
    assert_eq!(directory_requests(&w, 0, is_publish), 2);
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    assert!(w.nodes[0].store().sealed_info(&id(1)).is_some());
    assert_eq!(w.nodes[0].stats().id_conflicts, 0);
    w.assert_settled();
}

#[test]
fn a_seal_the_directory_never_answers_is_made_here_after_its_timeout() {
    let (mut w, seal) = seal_waiting_for_the_directory(&[4; 100]);
    w.advance(w.nodes[0].config().directory_timeout);
    assert_eq!(w.reply_to(0, CLIENT, seal), Some(Response::Done(Ok(()))));
    assert!(w.nodes[0].store().sealed_info(&id(1)).is_some());
}

#[test]
fn a_seal_on_a_node_whose_directory_is_down_is_made_at_once_and_published_later() {
    let mut w = World::new(2, |_| {});
    w.hold_directory = true;
    let health = Err("head unreachable".into());
    w.feed(0, NodeInput::DirectoryHealth { health });
    let reply = w.put_bytes(0, 1, &[6; 100]);
    assert_eq!(reply, Some(Response::Done(Ok(()))), "no wait for a verdict");
    assert!(w.nodes[0].store().sealed_info(&id(1)).is_some());
    // The publication still goes out (the directory's client replays it once it is back).
    assert_eq!(directory_requests(&w, 0, is_publish), 1);
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    assert_eq!(directory_requests(&w, 0, is_publish), 1, "published once");
}

#[test]
fn a_fetch_that_arrives_before_the_holders_seal_is_served_right_after_it() {
    let bytes = World::bytes_of(1, 300);
    let (mut w, seal) = seal_waiting_for_the_directory(&bytes);
    // The directory accepted the publication and a fetcher heard of it before node 0 did.
    w.fetch(1, &[1], Duration::from_secs(5));
    let sizes = ObjectSizes {
        data_size: 300,
        metadata_size: 0,
    };
    let digest = ContentDigest::of(&bytes, &[]);
    w.answer_directory(
        1,
        |r| matches!(r, DirectoryRequest::Lookup { .. }),
        DirectoryReply::Located {
            holders: vec![NodeId(0)],
            sizes: Some(sizes),
            digest: Some(digest),
        },
    );
    assert!(w.replies(1).is_empty(), "the request waits at the holder");
    assert!(
        !w.sent(0)
            .iter()
            .any(|m| matches!(m, PeerMessage::NotFound { .. })),
        "not refused while the seal is pending"
    );
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    assert_eq!(w.reply_to(0, CLIENT, seal), Some(Response::Done(Ok(()))));
    let replies = w.replies(1);
    assert_eq!(replies.len(), 1, "served right after the seal");
    let info = ok_info(&replies[0][0]);
    assert_eq!(w.local_bytes(1, &info), bytes);
}

#[test]
fn an_abort_during_a_pending_seal_withdraws_and_ignores_the_late_verdict() {
    let (mut w, seal) = seal_waiting_for_the_directory(&[5; 100]);
    assert_eq!(
        w.request(0, Request::Abort { id: id(1) }),
        Some(Response::Done(Ok(())))
    );
    assert_eq!(
        w.reply_to(0, CLIENT, seal),
        Some(Response::Done(Err(StoreError::ObjectNotFound(id(1))))),
        "the seal is answered: its object is gone"
    );
    assert_eq!(
        directory_requests(&w, 0, is_withdraw),
        1,
        "withdrawn, in case the directory accepted the publication"
    );
    // The publication's late acceptance seals nothing.
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    w.answer_directory(0, is_withdraw, DirectoryReply::Done);
    assert!(!w.nodes[0].store().contains(&id(1)));
    let seal_replies = w.count(
        0,
        |o| matches!(o, NodeOutput::Reply { request, .. } if *request == seal),
    );
    assert_eq!(seal_replies, 1);
    w.assert_settled();
}

#[test]
fn a_disconnect_during_a_pending_seal_withdraws_and_seals_nothing() {
    let (mut w, _) = seal_waiting_for_the_directory(&[6; 100]);
    w.feed(0, NodeInput::ClientDisconnected { client: CLIENT });
    w.pump();
    assert!(
        !w.nodes[0].store().contains(&id(1)),
        "aborted with its creator"
    );
    assert_eq!(directory_requests(&w, 0, is_withdraw), 1);
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    w.answer_directory(0, is_withdraw, DirectoryReply::Done);
    assert!(!w.nodes[0].store().contains(&id(1)));
    w.assert_settled();
}

#[test]
fn a_put_waits_for_the_verdict_like_a_seal() {
    let mut w = World::new(2, |_| {});
    w.hold_directory = true;
    let put = w.request(
        0,
        Request::Put {
            id: id(1),
            data: vec![9; 50],
            metadata: vec![1, 2],
        },
    );
    assert_eq!(put, None);
    let put_id = w.last_request();
    let Some((_, _, DirectoryRequest::Publish { digest, .. })) = w.held_directory.first() else {
        panic!("{:?}", w.held_directory);
    };
    assert_eq!(*digest, ContentDigest::of(&[9; 50], &[1, 2]));
    w.answer_directory(
        0,
        is_publish,
        DirectoryReply::Conflict {
            sizes: ObjectSizes {
                data_size: 50,
                metadata_size: 2,
            },
            digest: ContentDigest(1),
        },
    );
    assert_eq!(
        w.reply_to(0, CLIENT, put_id),
        Some(Response::Done(Err(StoreError::ObjectExists(id(1)))))
    );
    assert!(!w.nodes[0].store().contains(&id(1)));
    w.assert_settled();
}

#[test]
fn two_nodes_putting_one_id_with_other_bytes_leave_the_first_content_everywhere() {
    let mut w = World::new(3, |_| {});
    let first = World::bytes_of(1, 1000);
    let other = World::bytes_of(2, 1000);
    assert_eq!(w.put_bytes(0, 1, &first), Some(Response::Done(Ok(()))));
    assert_eq!(
        w.put_bytes(1, 1, &other),
        Some(Response::Done(Err(StoreError::ObjectExists(id(1)))))
    );
    assert!(!w.nodes[1].store().contains(&id(1)));
    // The same bytes from another node are welcome.
    assert_eq!(w.put_bytes(2, 1, &first), Some(Response::Done(Ok(()))));
    assert_eq!(w.locations[&id(1)].1, vec![NodeId(0), NodeId(2)]);
    // Whoever fetches the id gets the first content.
    w.fetch(1, &[1], Duration::from_millis(50));
    let info = ok_info(&w.replies(1)[0][0]);
    assert_eq!(w.local_bytes(1, &info), first);
    w.release(1, 1);
    w.assert_settled();
}

/// Which holder node 1 asks first for object 1 held by nodes 0 and 2.
fn first_choice(len: u64, mode: TransferMode) -> NodeId {
    let mut w = World::new(3, |_| {});
    w.put(0, 1, len);
    w.put(2, 1, len);
    w.fetch_in_mode(1, &[1], Duration::from_millis(50), mode);
    w.log
        .iter()
        .find_map(|(n, o)| match o {
            NodeOutput::Send {
                peer,
                message: PeerMessage::FetchRequest { .. },
            } if n.0 == 1 => Some(*peer),
            _ => None,
        })
        .expect("a fetch request")
}

#[test]
fn a_damaged_copy_is_not_sealed_and_the_fetch_goes_on_to_another_holder() {
    // A small object comes eagerly, a large one by READs: both paths are verified.
    for (len, mode) in [
        (900, TransferMode::Eager),
        (1500, TransferMode::Eager),
        (10_000, TransferMode::Rendezvous),
    ] {
        let bad = first_choice(len, mode);
        let mut w = World::new(3, |_| {});
        w.put(0, 1, len);
        w.put(2, 1, len);
        w.corrupt_from = vec![bad];
        w.fetch_in_mode(1, &[1], Duration::from_millis(50), mode);
        let info = ok_info(&w.replies(1)[0][0]);
        assert_eq!(w.local_bytes(1, &info), World::bytes_of(1, len), "{mode:?}");
        let stats = w.nodes[1].stats();
        assert_eq!(stats.digest_mismatches, 1, "{len} bytes, {mode:?}");
        assert_eq!((stats.transfers_failed, stats.transfers_succeeded), (1, 1));
        assert_eq!(
            w.nodes[1].store().digest(&id(1)),
            Some(ContentDigest::of(&World::bytes_of(1, len), &[]))
        );
        w.release(1, 1);
        w.assert_settled();
    }
}

#[test]
fn a_copy_damaged_from_every_holder_fails_the_fetch_saying_so() {
    for (len, mode) in [
        (900, TransferMode::Eager),
        (10_000, TransferMode::Rendezvous),
    ] {
        let mut w = World::new(2, |_| {});
        w.put(0, 1, len);
        w.corrupt_from = vec![NodeId(0)];
        w.fetch_in_mode(1, &[1], Duration::from_secs(5), mode);
        // Each round tries the holder again after a pause, until the rounds run out.
        let step = w.nodes[1].config().retry_backoff;
        for _ in 0..1000 {
            if !w.replies(1).is_empty() {
                break;
            }
            w.advance(step);
        }
        let replies = w.replies(1);
        let Err(FetchError::SourcesFailed { last_error, .. }) = &replies[0][0] else {
            panic!("{replies:?}");
        };
        assert!(
            matches!(
                **last_error,
                SourceFailure::Holder {
                    failure: TransferFailure::DigestMismatch { .. },
                    ..
                }
            ),
            "{last_error:?}"
        );
        assert!(w.nodes[1].stats().digest_mismatches >= 1);
        assert!(
            !w.nodes[1].store().contains(&id(1)),
            "no damaged copy is kept"
        );
        assert_eq!(w.nodes[1].stats().transfers_succeeded, 0);
        assert!(!w.locations[&id(1)].1.contains(&NodeId(1)), "nor published");
        w.assert_settled();
    }
}

/// A hinted fetch trusts the digest the holder names, so a holder must not serve a copy the
/// directory never accepted: one sealed while the directory could not judge it is refused to
/// peers until the directory accepts its publication.
#[test]
fn a_copy_sealed_without_the_directorys_acceptance_is_not_served_until_it_accepts() {
    let (mut w, seal) = seal_waiting_for_the_directory(&[7; 100]);
    w.answer_directory(
        0,
        is_publish,
        DirectoryReply::Unavailable {
            reason: "head restarting".into(),
        },
    );
    assert_eq!(w.reply_to(0, CLIENT, seal), Some(Response::Done(Ok(()))));
    let refusals = |w: &World| not_found_sent(w, 0);
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    assert_eq!(
        refusals(&w),
        1,
        "refused while the directory has not accepted it"
    );
    // Accepted on the retry (the first fetch has timed out meanwhile): now served.
    w.advance(w.nodes[0].config().retry_backoff);
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    let before = w.replies(1).len();
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    assert_eq!(refusals(&w), 1, "no new refusal once accepted");
    let replies = w.replies(1);
    assert_eq!(replies.len(), before + 1, "served once accepted");
    let info = ok_info(&replies[before][0]);
    assert_eq!(w.local_bytes(1, &info), vec![7; 100]);
}

/// Chaos seed 3 (`--overlap`): a copy sealed while the head restarted, whose publication gave
/// up before the head was back, was refused to peers for good, although the directory
/// client's replay had registered it. A directory that answers again gets it published anew,
/// and once accepted it is served.
#[test]
fn a_copy_whose_publication_gave_up_while_the_directory_was_out_is_served_once_it_is_back() {
    let mut w = World::new(2, |c| c.max_directory_attempts = 2);
    w.hold_directory = true;
    w.feed(
        0,
        NodeInput::DirectoryHealth {
            health: Err("head restarting".into()),
        },
    );
    let bytes = World::bytes_of(1, 100);
    assert_eq!(w.put_bytes(0, 1, &bytes), Some(Response::Done(Ok(()))));
    // Every attempt answered Unavailable: the publication gives up.
    for _ in 0..2 {
        w.answer_directory(
            0,
            is_publish,
            DirectoryReply::Unavailable {
                reason: "head restarting".into(),
            },
        );
        w.advance(w.nodes[0].config().retry_backoff * 2);
    }
    assert!(
        !w.held_directory
            .iter()
            .any(|(n, _, r)| n.0 == 0 && is_publish(r)),
        "the publication gave up"
    );
    let refusals = |w: &World| not_found_sent(w, 0);
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    assert_eq!(refusals(&w), 1, "refused while unvouched");

    // The head is back: the copy is published again, accepted, and served.
    w.feed(0, NodeInput::DirectoryHealth { health: Ok(()) });
    w.pump();
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    // The first fetch has timed out meanwhile.
    w.advance(w.nodes[0].config().retry_backoff);
    let before = w.replies(1).len();
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    assert_eq!(refusals(&w), 1, "no new refusal once accepted");
    let replies = w.replies(1);
    assert_eq!(replies.len(), before + 1, "served once accepted");
    let info = ok_info(&replies[before][0]);
    assert_eq!(w.local_bytes(1, &info), bytes);
}

/// A restarted head holds new publications until its grace period ends, so a node's attempts
/// can run out while the directory is reachable; the head then accepts the held publication,
/// but the node no longer listens for it. It starts another round later instead of giving up,
/// or the directory would list a copy its node never serves.
#[test]
fn a_publication_a_reachable_directory_left_unanswered_starts_another_round() {
    let mut w = World::new(2, |c| c.max_directory_attempts = 2);
    w.hold_directory = true;
    let backoff = w.nodes[0].config().retry_backoff;
    let bytes = World::bytes_of(1, 100);
    let _ = w.put_bytes(0, 1, &bytes);
    for _ in 0..2 {
        w.answer_directory(
            0,
            is_publish,
            DirectoryReply::Unavailable {
                reason: "no answer in time".into(),
            },
        );
        w.advance(backoff * 2);
    }
    // The attempts are used up; the directory is reachable, so another round starts.
    w.advance(backoff * 2);
    assert!(
        w.held_directory
            .iter()
            .any(|(n, _, r)| n.0 == 0 && is_publish(r)),
        "published again"
    );
    assert_eq!(w.nodes[0].stats().publication_rounds_restarted, 1);
    assert_eq!(w.nodes[0].stats().publications_dropped, 0);
    w.answer_directory(0, is_publish, DirectoryReply::Done);
    let before = w.replies(1).len();
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    let replies = w.replies(1);
    assert_eq!(replies.len(), before + 1, "served once accepted");
    let info = ok_info(&replies[before][0]);
    assert_eq!(w.local_bytes(1, &info), bytes);
}

/// A fetched copy whose publication the directory refuses (every holder left and the id was
/// put again with other bytes meanwhile) names a content the id no longer does: it stays
/// local and is not served to a peer's hinted fetch, which has no directory digest to check.
#[test]
fn a_fetched_copy_whose_publication_is_refused_is_not_served_to_peers() {
    let mut w = World::new(3, |_| {});
    let bytes = World::bytes_of(1, 100);
    assert_eq!(w.put_bytes(0, 1, &bytes), Some(Response::Done(Ok(()))));
    w.hold_directory = true;
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    let other = ContentDigest::of(b"other bytes under the id", b"");
    w.answer_directory(
        1,
        is_publish,
        DirectoryReply::Conflict {
            sizes: ObjectSizes {
                data_size: 100,
                metadata_size: 0,
            },
            digest: other,
        },
    );
    assert!(w.nodes[1].holds_refused_copy(&id(1)));
    let refusals = |w: &World| not_found_sent(w, 1);
    assert_eq!(refusals(&w), 0);
    w.fetch_from(2, &[1], 1, TransferMode::Auto);
    assert_eq!(refusals(&w), 1, "the refused copy is not served");
}

/// Sweep seed 9100000000159: a fetched copy whose every publication attempt went unanswered
/// (the node could not hear the directory) was still served, although meanwhile every holder
/// had left and the id was put again with other bytes. Unanswered, it is served to no peer
/// until a publication of it is accepted.
#[test]
fn a_fetched_copy_whose_publication_is_never_answered_is_not_served_until_accepted() {
    let mut w = World::new(3, |c| c.max_directory_attempts = 2);
    let bytes = World::bytes_of(1, 100);
    assert_eq!(w.put_bytes(0, 1, &bytes), Some(Response::Done(Ok(()))));
    w.hold_directory = true;
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    assert!(w.nodes[1].store().contains(&id(1)), "fetched");
    assert!(
        w.nodes[1].serves_peers(&id(1)),
        "vouched by the directory's lookup"
    );
    let backoff = w.nodes[1].config().retry_backoff;
    for _ in 0..2 {
        w.answer_directory(
            1,
            is_publish,
            DirectoryReply::Unavailable {
                reason: "no answer in time".into(),
            },
        );
        w.advance(backoff * 2);
    }
    assert!(
        !w.nodes[1].serves_peers(&id(1)),
        "not served while no publication of it was answered"
    );
    let refusals = |w: &World| not_found_sent(w, 1);
    w.fetch_from(2, &[1], 1, TransferMode::Auto);
    assert_eq!(refusals(&w), 1, "refused to a peer");
    // The directory is reachable: another round, and once accepted the copy is served.
    w.advance(backoff * 4);
    w.answer_directory(1, is_publish, DirectoryReply::Done);
    assert!(w.nodes[1].serves_peers(&id(1)), "served once accepted");
}

/// A holder whose copy a restarted head did not hear of in time (another node put the id with
/// other bytes first) learns from its directory client that the replayed publication was
/// refused: the copy stays local and is not served to a peer's hinted fetch.
#[test]
fn a_copy_whose_replayed_publication_is_refused_is_not_served_to_peers() {
    let mut w = World::new(2, |_| {});
    let bytes = World::bytes_of(1, 100);
    assert_eq!(w.put_bytes(0, 1, &bytes), Some(Response::Done(Ok(()))));
    let event = DirectoryEvent::ReplayRefused {
        id: id(1),
        sizes: ObjectSizes {
            data_size: 100,
            metadata_size: 0,
        },
        digest: ContentDigest::of(b"other bytes under the id", b""),
    };
    w.feed(0, NodeInput::DirectoryEvent { event });
    assert!(w.nodes[0].holds_refused_copy(&id(1)));
    let refusals = |w: &World| not_found_sent(w, 0);
    assert_eq!(refusals(&w), 0);
    w.fetch_from(1, &[1], 0, TransferMode::Auto);
    assert!(refusals(&w) >= 1, "the refused copy is not served");
    assert!(!w.nodes[1].store().contains(&id(1)));
    assert_eq!(w.nodes[0].stats().id_conflicts, 1);
}

/// `NotFound` answers node `node` has sent to peers so far.
fn not_found_sent(w: &World, node: u32) -> usize {
    w.sent(node)
        .iter()
        .filter(|m| matches!(m, PeerMessage::NotFound { .. }))
        .count()
}
