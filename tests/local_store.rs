//! The local store end to end: a real daemon, real clients, shared memory.

mod common;

use std::time::{Duration, Instant};

use skyriver_client::{Client, ClientError, ObjectEvent, ObjectId, StoreError};

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
fn small_and_large_puts_store_their_bytes_and_refuse_a_taken_id() {
    use skyriver_core::client_protocol::MAX_INLINE_PUT_BYTES;
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    // Inline (one round trip), at the limit, and above it (create, copy, seal).
    let sizes = [0, 1024, MAX_INLINE_PUT_BYTES - 4, MAX_INLINE_PUT_BYTES + 1];
    for (n, &size) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        client.put(id(100 + n as u64), &data, b"meta").unwrap();
        let got = client
            .get_one(id(100 + n as u64), Some(Duration::ZERO))
            .unwrap();
        assert_eq!(got.data(), &data[..], "size {size}");
        assert_eq!(got.metadata(), b"meta");
    }
    let error = client.put(id(101), b"again", b"").unwrap_err();
    assert!(
        matches!(error, ClientError::Store(StoreError::ObjectExists(_))),
        "{error}"
    );
    client.flush().unwrap();
    // Sealed, and the putter holds no reference.
    for summary in client.list().unwrap() {
        assert_eq!((summary.sealed, summary.ref_count), (true, 0));
    }
}

#[test]
fn get_waits_for_a_seal_from_another_client() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let socket = daemon.socket_path().to_path_buf();
    let getter = std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let object = client
            .get_one(id(7), Some(Duration::from_secs(20)))
            .unwrap();
        object.data().to_vec()
    });
    // The daemon holds the get before the object exists: the seal is what answers it.
    let client = Client::connect(daemon.socket_path()).unwrap();
    common::eventually("the get waits in the daemon", || {
        client.stats().unwrap().waiting_gets == 1
    });
    client.create_and_seal(id(7), b"late", b"").unwrap();
    assert_eq!(getter.join().unwrap(), b"late");
    assert_eq!(client.stats().unwrap().waiting_gets, 0);
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

/// Runs `work` on a thread and fails the test if it does not finish within `limit`.
fn finishes_within<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    finished
        .recv_timeout(limit)
        .expect("blocked behind another thread's call")
}

#[test]
fn a_buffer_dropped_on_another_thread_does_not_wait_for_a_blocked_get() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    client.create_and_seal(id(1), b"held", b"").unwrap();
    let held = client.get_one(id(1), None).unwrap();

    // A get with no timeout, for an object nobody has created yet, on the same client.
    let waiting = {
        let client = client.clone();
        std::thread::spawn(move || client.get_one(id(2), None).map(|b| b.data().to_vec()))
    };
    let other = Client::connect(daemon.socket_path()).unwrap();
    while other.stats().unwrap().waiting_gets == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }

    // Dropping the buffer elsewhere, and every other call, go through while the get waits.
    finishes_within(Duration::from_secs(5), move || drop(held));
    let flushed = client.clone();
    finishes_within(Duration::from_secs(5), move || flushed.flush().unwrap());
    let summary = &client.list().unwrap()[0];
    assert_eq!((summary.info.id, summary.ref_count), (id(1), 0));
    assert!(client.contains(id(1)).unwrap());

    // The waiting get still gets its object when it is sealed.
    other.create_and_seal(id(2), b"late", b"").unwrap();
    assert_eq!(waiting.join().unwrap().unwrap(), b"late");
}

#[test]
fn threads_sharing_one_client_each_get_their_own_replies() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    // One thread waits for ever the whole time, so the socket is usually read by another.
    let waiting = {
        let client = client.clone();
        std::thread::spawn(move || client.get_one(id(999_999), None).map(|b| b.data().len()))
    };
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                for n in 0..200u64 {
                    let object = id(t * 1000 + n);
                    let payload = vec![(t + n) as u8; 10 + n as usize];
                    client.create_and_seal(object, &payload, b"").unwrap();
                    let got = client.get_one(object, Some(Duration::ZERO)).unwrap();
                    assert_eq!(got.data(), &payload[..]);
                    assert!(client.contains(object).unwrap());
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    client.create_and_seal(id(999_999), b"end", b"").unwrap();
    assert_eq!(waiting.join().unwrap().unwrap(), 3);
    client.flush().unwrap();
    let objects = client.list().unwrap();
    assert_eq!(objects.len(), 1601);
    assert!(objects.iter().all(|o| o.ref_count == 0));
}

#[test]
fn a_sealed_writer_kept_as_a_buffer_holds_its_reference() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let mut writer = client.create(id(1), 3, 1).unwrap();
    writer.data_mut().copy_from_slice(b"abc");
    writer.metadata_mut().copy_from_slice(b"m");
    let kept = writer.seal_into_buffer().unwrap();
    assert_eq!((kept.data(), kept.metadata()), (&b"abc"[..], &b"m"[..]));
    assert!(matches!(
        client.delete(&[id(1)]).unwrap()[0],
        Err(StoreError::ObjectInUse(_))
    ));
    drop(kept);
    client.flush().unwrap();
    // The deferred delete happened at the release.
    assert!(!client.contains(id(1)).unwrap());
}

#[test]
fn thousands_of_dropped_buffers_are_released_without_replies_and_flush_waits_for_them() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    client.put(id(1), b"shared", b"").unwrap();
    // Each get takes a reference; each drop sends a release the daemon does not answer, so
    // thousands of them go out back to back, cut anywhere by the socket.
    let buffers: Vec<_> = (0..5000)
        .map(|_| client.get_one(id(1), Some(Duration::ZERO)).unwrap())
        .collect();
    let held = |client: &Client| {
        client
            .list()
            .unwrap()
            .into_iter()
            .find(|s| s.info.id == id(1))
            .unwrap()
            .ref_count
    };
    assert_eq!(held(&client), 5000);
    drop(buffers);
    client.flush().unwrap();
    assert_eq!(held(&client), 0);
    // Requests with replies still pair with theirs after the unanswered ones.
    assert!(client.contains(id(1)).unwrap());
    let metrics = client.metrics().unwrap();
    assert_eq!(metrics.counters.unanswered_release_failures, 0);
}
