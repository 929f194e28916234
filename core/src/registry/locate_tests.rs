//! `LocateCopies`: the registry answers the holders of an object and which of them keep its
//! copies of record, with the copies it wants.

use super::tests::{admit, at_ms, digest, drain, member, request, sizes, NONCE_KEY, TOKEN};
use super::*;
use crate::directory::CopiesOfRecord;
use crate::registry::wire::WireOpId;

fn registry_of(nodes: u32) -> Registry {
    let mut config = RegistryConfig::new(TOKEN, NONCE_KEY);
    config.heartbeat_timeout = Duration::from_secs(3600);
    let mut registry = Registry::new(config);
    for node in 0..nodes {
        admit(&mut registry, at_ms(0), u64::from(node), member(node, 1)).expect("joins");
        drain(&mut registry);
    }
    registry
}

fn publish(
    registry: &mut Registry,
    node: u32,
    replicas: Option<u8>,
) -> Vec<(ConnId, FromRegistry)> {
    let (id, sizes, digest) = (ObjectId::from_u64(7), sizes(100), digest(100));
    let body = match replicas {
        Some(replicas) => DirectoryRequest::PublishReplicated {
            id,
            sizes,
            digest,
            replicas,
            free_bytes: 1 << 30,
        },
        None => DirectoryRequest::Publish { id, sizes, digest },
    };
    request(registry, at_ms(0), u64::from(node), 1, body)
}

/// `LocateCopies` of object 7 asked by node `node`: (sorted holders, copies of record).
fn locate(registry: &mut Registry, node: u32) -> (Vec<NodeId>, Option<CopiesOfRecord>) {
    let body = DirectoryRequest::LocateCopies {
        id: ObjectId::from_u64(7),
    };
    let out = request(registry, at_ms(0), u64::from(node), 99, body);
    let reply = out.into_iter().find_map(|(conn, m)| match m {
        FromRegistry::Reply {
            op: WireOpId(99),
            reply,
        } if conn == ConnId(u64::from(node)) => Some(reply),
        _ => None,
    });
    match reply {
        Some(DirectoryReply::CopiesLocated {
            mut holders,
            of_record,
            sizes: Some(_),
            digest: Some(_),
        }) => {
            holders.sort();
            (holders, of_record)
        }
        other => panic!("expected CopiesLocated, got {other:?}"),
    }
}

fn replicate_target(out: &[(ConnId, FromRegistry)]) -> u32 {
    out.iter()
        .find_map(|(conn, m)| match m {
            FromRegistry::Event(DirectoryEvent::Replicate { .. }) => Some(conn.0 as u32),
            _ => None,
        })
        .expect("a copy is placed")
}

#[test]
fn locate_tells_copies_of_record_from_cache_copies_and_gives_the_count_wanted() {
    let mut r = registry_of(3);
    let target = replicate_target(&publish(&mut r, 0, Some(2)));
    let cache = 3 - target;
    // Another node fetched the object: a plain publication, a cache copy.
    publish(&mut r, cache, None);
    let (holders, of_record) = locate(&mut r, cache);
    assert_eq!(holders, vec![NodeId(0), NodeId(cache)]);
    assert_eq!(
        of_record,
        Some(CopiesOfRecord {
            wanted: 2,
            holders: vec![NodeId(0)]
        }),
        "1 of 2 copies of record, although two nodes hold it"
    );
    publish(&mut r, target, Some(2));
    let (holders, of_record) = locate(&mut r, cache);
    assert_eq!(holders.len(), 3);
    let mut of_record_holders = vec![NodeId(0), NodeId(target)];
    of_record_holders.sort();
    assert_eq!(
        of_record,
        Some(CopiesOfRecord {
            wanted: 2,
            holders: of_record_holders
        })
    );
}

#[test]
fn an_object_put_with_one_copy_has_no_copies_of_record() {
    let mut r = registry_of(2);
    publish(&mut r, 0, None);
    publish(&mut r, 1, None);
    let (holders, of_record) = locate(&mut r, 1);
    assert_eq!(holders, vec![NodeId(0), NodeId(1)]);
    assert_eq!(of_record, None);
}
