//! Hostile or broken clients: every bad frame gets a clear error or a closed connection, and
//! the daemon and its other clients carry on.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use skyriver_client::{Client, ClientError, ObjectId, StoreError};
use skyriver_core::client_protocol::{
    decode_server_frame, encode_frame, Request, RequestFrame, Response, ServerFrame,
    MAX_INLINE_PUT_BYTES, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
use skyriver_core::RequestId;

struct RawConnection {
    stream: UnixStream,
}

impl RawConnection {
    fn open(socket: &std::path::Path) -> Self {
        let stream = UnixStream::connect(socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Self { stream }
    }

    /// Opens and completes the Hello handshake (the fds that come with it are dropped).
    fn greeted(socket: &std::path::Path) -> Self {
        let mut connection = Self::open(socket);
        connection.send(&RequestFrame {
            request: RequestId(1),
            body: Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name: "raw".into(),
            },
        });
        let reply = connection.reply().expect("welcome");
        assert!(matches!(
            reply,
            ServerFrame::Reply {
                response: Response::Welcome { .. },
                ..
            }
        ));
        connection
    }

    fn send(&mut self, frame: &RequestFrame) {
        let mut bytes = Vec::new();
        encode_frame(frame, &mut bytes);
        self.stream.write_all(&bytes).unwrap();
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next frame, or `None` when the daemon closed the connection.
    fn reply(&mut self) -> Option<ServerFrame> {
        let mut header = [0u8; 4];
        if self.stream.read_exact(&mut header).is_err() {
            return None;
        }
        let mut body = vec![0u8; u32::from_le_bytes(header) as usize];
        self.stream.read_exact(&mut body).ok()?;
        Some(decode_server_frame(&body).expect("the daemon sends valid frames"))
    }

    fn expect_error(&mut self) -> StoreError {
        match self.reply() {
            Some(ServerFrame::Reply {
                response: Response::Error(error),
                ..
            }) => error,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

fn assert_daemon_healthy(socket: &std::path::Path) {
    let client = Client::connect(socket).expect("the daemon still accepts clients");
    let id = ObjectId(rand_id());
    client.create_and_seal(id, b"still fine", b"").unwrap();
    assert_eq!(client.get_one(id, None).unwrap().data(), b"still fine");
}

fn rand_id() -> [u8; 20] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut id = [0u8; 20];
    id[..16].copy_from_slice(&nanos.to_le_bytes());
    id
}

#[test]
fn garbage_before_hello_is_refused_and_closed() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let bystander = Client::connect(daemon.socket_path()).unwrap();
    let mut raw = RawConnection::open(daemon.socket_path());
    raw.send_raw(&framed(&[0xff; 32]));
    assert!(matches!(raw.expect_error(), StoreError::BadRequest(_)));
    assert!(raw.is_closed());
    assert!(bystander.stats().is_ok(), "another client is unharmed");
    assert_daemon_healthy(daemon.socket_path());
}

#[test]
fn a_request_before_hello_and_a_wrong_version_are_refused() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let mut raw = RawConnection::open(daemon.socket_path());
    raw.send(&RequestFrame {
        request: RequestId(3),
        body: Request::List,
    });
    let error = raw.expect_error();
    assert!(error.to_string().contains("Hello"), "{error}");
    assert!(raw.is_closed());

    let mut raw = RawConnection::open(daemon.socket_path());
    raw.send(&RequestFrame {
        request: RequestId(1),
        body: Request::Hello {
            protocol_version: PROTOCOL_VERSION + 1,
            client_name: "future".into(),
        },
    });
    let error = raw.expect_error();
    assert!(error.to_string().contains("not supported"), "{error}");
    assert!(raw.is_closed());

    // A client of the release before (no one-round-trip put) is told what to do.
    let mut raw = RawConnection::open(daemon.socket_path());
    raw.send(&RequestFrame {
        request: RequestId(1),
        body: Request::Hello {
            protocol_version: PROTOCOL_VERSION - 1,
            client_name: "older".into(),
        },
    });
    let error = raw.expect_error().to_string();
    assert!(
        error.contains("not supported") && error.contains("same release"),
        "{error}"
    );
    assert!(raw.is_closed());
    assert_daemon_healthy(daemon.socket_path());
}

#[test]
fn malformed_and_unknown_frames_get_errors_and_the_connection_goes_on() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let mut raw = RawConnection::greeted(daemon.socket_path());
    // An unknown request variant (postcard enum tag 200) and plain garbage.
    raw.send_raw(&framed(&[5, 200, 1, 2, 3]));
    assert!(matches!(raw.expect_error(), StoreError::BadRequest(_)));
    raw.send_raw(&framed(&[]));
    assert!(matches!(raw.expect_error(), StoreError::BadRequest(_)));
    // A Create whose id is cut short: 5 of 20 bytes.
    raw.send_raw(&framed(&[9, 1, 1, 2, 3, 4, 5]));
    assert!(matches!(raw.expect_error(), StoreError::BadRequest(_)));
    // Still usable.
    raw.send(&RequestFrame {
        request: RequestId(9),
        body: Request::Stats,
    });
    assert!(matches!(
        raw.reply(),
        Some(ServerFrame::Reply {
            request: RequestId(9),
            response: Response::Stats(_)
        })
    ));
    assert_daemon_healthy(daemon.socket_path());
}

#[test]
fn an_oversized_frame_closes_the_connection_with_a_reason() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let mut raw = RawConnection::greeted(daemon.socket_path());
    raw.send_raw(&((MAX_REQUEST_BYTES as u32 + 1).to_le_bytes()));
    let error = raw.expect_error();
    assert!(error.to_string().contains("limit"), "{error}");
    assert!(raw.is_closed());
    assert_daemon_healthy(daemon.socket_path());
}

#[test]
fn a_truncated_frame_then_hangup_leaves_the_daemon_unharmed() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let mut raw = RawConnection::greeted(daemon.socket_path());
    raw.send_raw(&[100, 0, 0, 0, 1, 2, 3]);
    drop(raw);
    assert_daemon_healthy(daemon.socket_path());
}

#[test]
fn requests_that_break_the_rules_get_clear_errors() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let alice = Client::connect(daemon.socket_path()).unwrap();
    let bob = Client::connect(daemon.socket_path()).unwrap();
    let id = ObjectId::from_u64(1);
    let _writer = alice.create(id, 10, 0).unwrap();

    // Bob may not seal or abort Alice's object.
    let mut raw = RawConnection::greeted(daemon.socket_path());
    raw.send(&RequestFrame {
        request: RequestId(2),
        body: Request::Seal {
            id,
            release: true,
            digest: skyriver_client::ContentDigest(0),
        },
    });
    match raw.reply() {
        Some(ServerFrame::Reply {
            response: Response::Done(Err(StoreError::NotCreator(got))),
            ..
        }) => {
            assert_eq!(got, id)
        }
        other => panic!("{other:?}"),
    }
    // Release of an object not held.
    raw.send(&RequestFrame {
        request: RequestId(3),
        body: Request::Release {
            id: ObjectId::from_u64(2),
        },
    });
    assert!(matches!(
        raw.reply(),
        Some(ServerFrame::Reply {
            response: Response::Done(Err(StoreError::NotHeld(_))),
            ..
        })
    ));
    // A size that can never fit, and one whose sum overflows.
    let error = bob.create(ObjectId::from_u64(3), 1 << 40, 0).err().unwrap();
    assert!(
        matches!(error, ClientError::Store(StoreError::ObjectTooLarge { .. })),
        "{error}"
    );
    let error = bob
        .create(ObjectId::from_u64(3), u64::MAX, u64::MAX)
        .err()
        .unwrap();
    assert!(
        matches!(error, ClientError::Store(StoreError::ObjectTooLarge { .. })),
        "{error}"
    );
    // A put larger than a request carries inline.
    raw.send(&RequestFrame {
        request: RequestId(5),
        body: Request::Put {
            id: ObjectId::from_u64(5),
            data: vec![0; MAX_INLINE_PUT_BYTES + 1],
            metadata: Vec::new(),
        },
    });
    assert!(matches!(raw.expect_error(), StoreError::BadRequest(_)));
    // Too many ids in one request.
    let ids = vec![ObjectId::from_u64(4); 70_000];
    raw.send(&RequestFrame {
        request: RequestId(4),
        body: Request::Delete { ids },
    });
    assert!(matches!(raw.expect_error(), StoreError::BadRequest(_)));
    assert_daemon_healthy(daemon.socket_path());
}

#[test]
fn the_cli_refuses_a_malformed_id() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 4 << 20);
    let (ok, _, stderr) = common::cli(daemon.socket_path(), &["get", "abc123"], None);
    assert!(!ok);
    assert!(stderr.contains("40 hex characters"), "{stderr}");
    let (ok, _, stderr) = common::cli(daemon.socket_path(), &["get", &"g".repeat(40)], None);
    assert!(!ok);
    assert!(stderr.contains("hex"), "{stderr}");
}

#[test]
fn a_client_that_never_reads_its_replies_is_disconnected_and_others_carry_on() {
    let dir = common::test_dir();
    let daemon = common::start_daemon(dir.path(), 64 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    // A thousand objects make every `list` reply about 80 KiB.
    for n in 0..1000 {
        client
            .create_and_seal(ObjectId::from_u64(n), b"x", b"")
            .unwrap();
    }
    let mut hog = RawConnection::greeted(daemon.socket_path());
    hog.stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Ask for far more than the daemon buffers for one client (16 MiB) and never read.
    let mut list = Vec::new();
    encode_frame(
        &RequestFrame {
            request: RequestId(2),
            body: Request::List,
        },
        &mut list,
    );
    let mut sent = 0;
    for _ in 0..2000 {
        if hog.stream.write_all(&list).is_err() {
            break; // the daemon already closed it
        }
        sent += 1;
    }
    // The daemon never blocked on the hog: another client is served. (Bounded generously: a
    // daemon stuck on the hog would never answer; a loaded machine answers late.)
    let (tx, rx) = std::sync::mpsc::channel();
    let socket = daemon.socket_path().to_path_buf();
    std::thread::spawn(move || {
        let other = Client::connect(&socket).unwrap();
        let _ = tx.send(other.list().map(|l| l.len()));
    });
    let listed = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("another client is served while the hog does not read");
    assert_eq!(listed.unwrap(), 1000);
    // The hog is cut off: reading drains what the socket held, then reaches the end, well
    // before all `sent` replies (about 160 MB) could have come.
    let mut replies = 0;
    while hog.reply().is_some() {
        replies += 1;
    }
    assert!(
        replies < sent,
        "{replies} of {sent} replies arrived: the daemon buffered without limit"
    );
    // Its memory came back: the daemon is still there, and the objects too.
    assert_eq!(client.stats().unwrap().object_count, 1000);
}
