//! Batches of any size, and waits that end when interrupted or when the client is closed.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use skyriver_client::{random_object_id, Client, ClientError, ObjectEvent, StoreError};

/// How long a woken wait may take to return.
const PROMPTLY: Duration = Duration::from_secs(5);

#[test]
fn batches_over_the_request_limits_are_split_and_the_connection_survives() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let present = random_object_id();
    client.put(present, b"late in the batch", b"").unwrap();
    // 250,000 ids are 5 MB encoded: over the daemon's 4 MiB request limit, as well as its
    // 65,536 ids per request.
    let mut ids: Vec<_> = (0..250_000).map(|_| random_object_id()).collect();
    ids[200_000] = present;
    let got = client.get(&ids, Some(Duration::ZERO)).unwrap();
    assert_eq!(got.len(), ids.len());
    assert_eq!(got[200_000].as_ref().unwrap().data(), b"late in the batch");
    assert_eq!(got.iter().filter(|result| result.is_ok()).count(), 1);
    drop(got);
    let deleted = client.delete(&ids).unwrap();
    assert_eq!(deleted.len(), ids.len());
    assert!(deleted[200_000].is_ok());
    assert_eq!(
        deleted
            .iter()
            .filter(|result| matches!(result, Err(StoreError::ObjectNotFound(_))))
            .count(),
        ids.len() - 1
    );
    // The same connection still serves calls.
    assert!(!client.contains(present).unwrap());
    assert_eq!(client.stats().unwrap().object_count, 0);
}

#[test]
fn close_ends_a_get_waiting_on_another_thread() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let observer = Client::connect(daemon.socket_path()).unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || client.get_one(random_object_id(), None))
    };
    common::eventually("the get waits", || {
        observer.stats().unwrap().waiting_gets == 1
    });
    let closed = Instant::now();
    client.close();
    let result = waiter.join().unwrap();
    assert!(
        matches!(result, Err(ClientError::ClientClosed)),
        "{result:?}"
    );
    assert!(closed.elapsed() < PROMPTLY);
    // Later calls are refused too.
    assert!(matches!(client.stats(), Err(ClientError::ClientClosed)));
}

#[test]
fn an_interrupted_get_returns_and_its_late_reply_is_released() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let observer = Client::connect(daemon.socket_path()).unwrap();
    let id = random_object_id();
    let stop = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (client, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            client.get_interruptible(&[id], None, &mut || stop.load(Ordering::Relaxed))
        })
    };
    common::eventually("the get waits", || {
        observer.stats().unwrap().waiting_gets == 1
    });
    let interrupted = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let result = waiter.join().unwrap();
    assert!(
        matches!(result, Err(ClientError::Interrupted)),
        "{result:?}"
    );
    assert!(interrupted.elapsed() < PROMPTLY);
    // The object comes after all: the abandoned get's reference to it is released once the
    // client reads the reply, and the connection goes on.
    observer.put(id, b"late", b"").unwrap();
    assert_eq!(client.get_one(id, None).unwrap().data(), b"late");
    common::eventually("the abandoned reference goes", || {
        client.flush().unwrap();
        let listed = observer.list().unwrap();
        listed.iter().find(|o| o.info.id == id).unwrap().ref_count == 0
    });
}

#[test]
fn an_interrupted_subscription_loses_no_event() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let mut events = client.subscribe().unwrap();
    let mut checks = 0;
    let started = Instant::now();
    let result = events.next_event_interruptible(&mut || {
        checks += 1;
        checks == 3
    });
    assert!(
        matches!(result, Err(ClientError::Interrupted)),
        "{result:?}"
    );
    assert!(started.elapsed() < PROMPTLY);
    let id = random_object_id();
    client.put(id, b"x", b"").unwrap();
    events.set_timeout(Some(Duration::from_secs(10))).unwrap();
    match events.next_event().unwrap() {
        ObjectEvent::Sealed { id: sealed, .. } => assert_eq!(sealed, id),
        other => panic!("{other:?}"),
    }
    // A short timeout ends the wait as a timeout.
    events.set_timeout(Some(Duration::from_millis(10))).unwrap();
    match events.next_event() {
        Err(ClientError::Io(error)) => assert_eq!(error.kind(), std::io::ErrorKind::TimedOut),
        other => panic!("{other:?}"),
    }
}
