//! The local store end to end: a real daemon, real clients, shared memory.

mod common;

use std::time::{Duration, Instant};

use skyriver::{Client, ClientError, ObjectEvent, ObjectId, StoreError};

fn id(n: u64) -> ObjectId {
    ObjectId::from_u64(n)
}

#[test]
fn bytes_written_by_one_client_are_read_in_place_by_another() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let writer = Client::connect(daemon.socket_path()).unwrap();
    let reader = Client::connect(daemon.socket_path()).unwrap();

    let mut object = writer.create(id(1), 1 << 20, 3).unwrap();
    for (i, byte) in object.data_mut().iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    object.metadata_mut().copy_from_slice(b"abc");
    object.seal().unwrap();

    let first = reader.get_one(id(1), Some(Duration::ZERO)).unwrap();
    assert!(first
        .data()
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8));
    assert_eq!(first.metadata(), b"abc");
    // Zero-copy: a second get of the same object maps to the same bytes, not a copy.
    let second = reader.get_one(id(1), Some(Duration::ZERO)).unwrap();
    assert_eq!(first.data().as_ptr(), second.data().as_ptr());
    drop((first, second));
    reader.flush().unwrap();
    let summary = &writer.list().unwrap()[0];
    assert_eq!((summary.sealed, summary.ref_count), (true, 0));
}

#[test]
fn get_waits_for_a_seal_from_another_client() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let socket = daemon.socket_path().to_path_buf();
    let getter = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let started = Instant::now();
        let object = client
            .get_one(id(7), Some(Duration::from_secs(20)))
            .unwrap();
        (object.data().to_vec(), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let client = Client::connect(daemon.socket_path()).unwrap();
    client.create_and_seal(id(7), b"late", b"").unwrap();
    let (data, waited) = getter.join().unwrap();
    assert_eq!(data, b"late");
    assert!(
        waited >= Duration::from_millis(90),
        "the get waited for the seal"
    );
}

#[test]
fn get_times_out_and_polls() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let started = Instant::now();
    let result = client.get_one(id(1), Some(Duration::from_millis(150)));
    assert!(
        matches!(result, Err(ClientError::Store(StoreError::Timeout(_)))),
        "{result:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(140));
    let polled = client.get(&[id(1)], Some(Duration::ZERO)).unwrap();
    assert_eq!(
        polled[0].as_ref().unwrap_err(),
        &StoreError::ObjectNotFound(id(1))
    );
}

#[test]
fn delete_is_deferred_while_held_and_subscribers_hear_it() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let mut events = client.subscribe().unwrap();
    events.set_timeout(Some(Duration::from_secs(10))).unwrap();
    client.create_and_seal(id(1), b"x", b"").unwrap();
    let held = client.get_one(id(1), None).unwrap();
    assert_eq!(
        client.delete(&[id(1)]).unwrap(),
        vec![Err(StoreError::ObjectInUse(id(1)))]
    );
    assert!(client.contains(id(1)).unwrap());
    drop(held);
    assert!(!client.contains(id(1)).unwrap(), "deleted once released");
    assert_eq!(
        events.next_event().unwrap(),
        ObjectEvent::Sealed {
            id: id(1),
            data_size: 1,
            metadata_size: 0
        }
    );
    assert_eq!(
        events.next_event().unwrap(),
        ObjectEvent::Deleted { id: id(1) }
    );
}

#[test]
fn a_full_store_evicts_unused_objects_and_refuses_when_all_are_held() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let chunk = vec![1u8; 1 << 20];
    for n in 0..4 {
        client.create_and_seal(id(n), &chunk, b"").unwrap();
    }
    let held: Vec<_> = (1..4)
        .map(|n| client.get_one(id(n), None).unwrap())
        .collect();
    client.create_and_seal(id(10), &chunk, b"").unwrap();
    assert!(
        !client.contains(id(0)).unwrap(),
        "the one unused object was evicted"
    );
    let _also_held = client.get_one(id(10), None).unwrap();
    let error = client.create(id(11), 1 << 20, 0).err().unwrap();
    assert!(
        matches!(error, ClientError::Store(StoreError::OutOfMemory { .. })),
        "{error}"
    );
    drop(held);
    client.create_and_seal(id(11), &chunk, b"").unwrap();
    let stats = client.stats().unwrap();
    assert_eq!(stats.evicted_objects_total, 2);
}

#[test]
fn dropping_an_unsealed_writer_aborts_it() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    drop(client.create(id(1), 100, 0).unwrap());
    assert!(client.list().unwrap().is_empty());
    assert_eq!(client.stats().unwrap().allocated_bytes, 0);
}

#[test]
fn many_clients_on_many_threads() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let socket = daemon.socket_path().to_path_buf();
            std::thread::spawn(move || {
                let client = Client::connect(&socket).unwrap();
                for n in 0..50u64 {
                    let object = id(t * 1000 + n);
                    let payload = vec![(t + n) as u8; 1000 + n as usize];
                    client.create_and_seal(object, &payload, b"").unwrap();
                    let got = client.get_one(object, None).unwrap();
                    assert_eq!(got.data(), &payload[..]);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let client = Client::connect(daemon.socket_path()).unwrap();
    assert_eq!(client.list().unwrap().len(), 400);
}
