//! `LocateCopies` through a node: each copy marked a copy of record or a cache copy from the
//! registry's answer, and what a directory without records (Redis) lets the node say.

use super::*;
use crate::client_protocol::{CopyView, ReplicaPolicy};
use crate::directory::CopiesOfRecord;

const LEN: u64 = 300;

fn put_with_copies(w: &mut World, node: u32, n: u64) {
    let body = Request::PutReplicated {
        id: id(n),
        data: World::bytes_of(n, LEN),
        metadata: Vec::new(),
        replicas: ReplicaPolicy {
            copies: 2,
            wait_ms: None,
        },
    };
    let request = w.hand_request(node, CLIENT, body);
    w.pump();
    assert_eq!(
        w.reply_to(node, CLIENT, request),
        Some(Response::Done(Ok(())))
    );
}

fn copy(node: u32, of_record: bool) -> CopyView {
    CopyView {
        node: NodeId(node),
        failure_domain: String::new(),
        of_record,
    }
}

#[test]
fn the_registrys_answer_marks_copies_of_record_and_cache_copies() {
    let mut w = World::new(2, |_| {});
    w.hold_directory = true;
    let request = w.hand_request(1, CLIENT, Request::LocateCopies { id: id(1) });
    w.pump();
    assert_eq!(w.reply_to(1, CLIENT, request), None, "asks the directory");
    w.answer_directory(
        1,
        |r| matches!(r, DirectoryRequest::LocateCopies { id } if *id == ObjectId::from_u64(1)),
        DirectoryReply::CopiesLocated {
            holders: vec![NodeId(0), NodeId(1)],
            sizes: Some(ObjectSizes {
                data_size: LEN,
                metadata_size: 0,
            }),
            digest: None,
            of_record: Some(CopiesOfRecord {
                wanted: 2,
                holders: vec![NodeId(0)],
            }),
        },
    );
    assert_eq!(
        w.reply_to(1, CLIENT, request),
        Some(Response::Copies {
            copies: vec![copy(0, true), copy(1, false)],
            wanted: Some(2),
            sizes: Some((LEN, 0)),
            records_known: true,
        }),
        "node 1 knows nothing of the object; the registry's count is shown"
    );
}

#[test]
fn without_records_no_copy_is_marked_and_the_count_is_the_nodes_own() {
    // The test directory keeps no records, as Redis: it answers `Located`.
    let mut w = World::new(2, |_| {});
    put_with_copies(&mut w, 0, 1);
    let located = w.request(0, Request::LocateCopies { id: id(1) });
    assert_eq!(
        located,
        Some(Response::Copies {
            copies: vec![copy(0, false)],
            wanted: Some(2),
            sizes: Some((LEN, 0)),
            records_known: false,
        })
    );
}

#[test]
fn a_standalone_node_has_no_copies_of_record_and_says_so() {
    let mut w = World::new(1, |config| config.standalone = true);
    w.put(0, 1, LEN);
    let located = w.request(0, Request::LocateCopies { id: id(1) });
    assert_eq!(
        located,
        Some(Response::Copies {
            copies: vec![copy(0, false)],
            wanted: None,
            sizes: Some((LEN, 0)),
            records_known: true,
        })
    );
}
