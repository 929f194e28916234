//! One object id names one content across a cluster: a put of an id that another node holds
//! with other bytes is refused (`ObjectExists`), the same bytes are a second copy, and every
//! copy carries the digest the directory lists.

mod common;

use std::time::Duration;

use skyriver::up::{LocalCluster, UpArgs};
use skyriver_client::{Client, ClientError, ContentDigest, ObjectId, StoreError};

fn cluster(nodes: u32) -> (tempfile::TempDir, LocalCluster) {
    let dir = common::test_dir();
    let args = UpArgs::new(
        nodes,
        "64MiB".parse().unwrap(),
        Some(dir.path().to_path_buf()),
    );
    let cluster =
        LocalCluster::start(&args, std::path::Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    (dir, cluster)
}

fn is_object_exists(result: Result<(), ClientError>, id: ObjectId) -> bool {
    matches!(result, Err(ClientError::Store(StoreError::ObjectExists(found))) if found == id)
}

#[test]
fn an_id_put_with_other_bytes_on_another_node_is_refused() {
    let (_dir, cluster) = cluster(3);
    let clients: Vec<Client> = cluster
        .sockets
        .iter()
        .map(|s| Client::connect(s).unwrap())
        .collect();
    let id = ObjectId::from_u64(0xA11CE);
    clients[0].put(id, b"AAAA", b"").unwrap();
    // Other bytes, other sizes, or the same bytes split otherwise between data and metadata:
    // another content, refused, and nothing is left behind on the refusing node.
    assert!(is_object_exists(clients[1].put(id, b"BBBB", b""), id));
    assert!(is_object_exists(clients[2].put(id, b"CCCCCC", b""), id));
    assert!(is_object_exists(clients[2].put(id, b"AAA", b"A"), id));
    assert!(!clients[1].contains(id).unwrap());
    assert!(!clients[2].contains(id).unwrap());
    // A large object goes through create, write and seal: refused at the seal.
    let big = ObjectId::from_u64(0xB16);
    clients[0].put(big, &vec![1u8; 1 << 20], b"").unwrap();
    assert!(is_object_exists(
        clients[1].put(big, &vec![2u8; 1 << 20], b""),
        big
    ));
    assert!(!clients[1].contains(big).unwrap());

    // The same bytes are the same content: a second copy, listed with the one digest.
    clients[2].put(id, b"AAAA", b"").unwrap();
    common::eventually("both copies are listed", || {
        clients[1].locate(id).unwrap().holders.len() == 2
    });
    let location = clients[1].locate(id).unwrap();
    assert_eq!(location.sizes, Some((4, 0)));
    assert_eq!(location.digest, Some(ContentDigest::of(b"AAAA", b"")));

    // What node-1 fetches is that content, after node-2 dropped its copy too.
    clients[2].delete(&[id]).unwrap();
    let fetched = clients[1]
        .fetch_one(id, Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(fetched.data(), b"AAAA");
}

#[test]
fn once_nobody_holds_an_id_it_may_name_new_bytes() {
    let (_dir, cluster) = cluster(2);
    let a = Client::connect(&cluster.sockets[0]).unwrap();
    let b = Client::connect(&cluster.sockets[1]).unwrap();
    let id = ObjectId::from_u64(0xF00D);
    a.put(id, b"first", b"").unwrap();
    assert!(is_object_exists(b.put(id, b"second", b""), id));
    a.delete(&[id]).unwrap();
    // The withdrawal reaches the directory shortly after the delete's reply.
    common::eventually("the id is free again", || {
        b.locate(id).unwrap().holders.is_empty()
    });
    b.put(id, b"second", b"").unwrap();
    let fetched = a.fetch_one(id, Some(Duration::from_secs(10))).unwrap();
    assert_eq!(fetched.data(), b"second");
}
