//! loom model of the client's reply routing: [`ReplyRouter`] (the session behind a mutex and a
//! condvar, one reader at a time) driven by threads against a model daemon, in every
//! interleaving loom explores. A `get` of a missing object blocks (asleep on the condvar, or
//! reading) beside another thread's dropped buffer (an unanswered release), its request and the
//! put that answers the `get`; every reply must reach its caller and every reference taken be
//! released. A lost wake-up is a deadlock here: loom's condvar never times out, where the real
//! one would only hide it behind a [`WAIT_SLICE`] of latency.
//!
//! Run: `RUSTFLAGS='--cfg skyriver_loom' CARGO_TARGET_DIR=target/loom cargo test -p skyriver
//! --lib loom --release`.

use std::collections::{BTreeMap, VecDeque};

use loom::sync::{Arc, Mutex};
use loom::thread;
use skyriver_core::client_protocol::{Request, RequestFrame, Response, ServerFrame};
use skyriver_core::client_session::{ClientSession, ConnectionLost};
use skyriver_core::{ArenaId, LocalRegion, ObjectId, ObjectInfo, RequestId, StoreError};

use super::{FrameRead, FrameWrite, ReplyRouter};
use crate::client::ClientError;

/// The daemon at the socket's other end: answers each request as it is written, except a `Get`
/// of a missing object, answered when a `Put` of it comes.
#[derive(Default)]
struct ModelDaemon {
    /// Frames written to the client, not read yet.
    to_client: VecDeque<ServerFrame>,
    /// Sealed objects.
    present: Vec<ObjectId>,
    /// `Get`s waiting for their object.
    held_gets: Vec<(RequestId, ObjectId)>,
    /// References the client holds, by object.
    references: BTreeMap<ObjectId, u32>,
    /// Releases of references the client did not hold.
    bad_releases: u32,
}

fn info(id: ObjectId) -> ObjectInfo {
    ObjectInfo {
        id,
        region: LocalRegion {
            arena: ArenaId(0),
            offset: 0,
            len: 1,
        },
        data_size: 1,
        metadata_size: 0,
    }
}

impl ModelDaemon {
    fn handle(&mut self, RequestFrame { request, body }: RequestFrame) {
        let response = match body {
            Request::Get { ids, .. } => {
                let id = ids[0];
                if !self.present.contains(&id) {
                    self.held_gets.push((request, id));
                    return;
                }
                *self.references.entry(id).or_default() += 1;
                Response::Got(vec![Ok(info(id))])
            }
            Request::ReleaseUnanswered { id } => {
                match self.references.get_mut(&id) {
                    Some(count) if *count > 0 => *count -= 1,
                    _ => self.bad_releases += 1,
                }
                return;
            }
            Request::Contains { id } => Response::Contains(self.present.contains(&id)),
            Request::Put { id, .. } => {
                self.present.push(id);
                self.reply(request, Response::Done(Ok(())));
                let (answered, held) = std::mem::take(&mut self.held_gets)
                    .into_iter()
                    .partition(|(_, wanted)| *wanted == id);
                self.held_gets = held;
                for (get, _) in answered {
                    *self.references.entry(id).or_default() += 1;
                    self.reply(get, Response::Got(vec![Ok(info(id))]));
                }
                return;
            }
            other => Response::Error(StoreError::BadRequest(format!("{other:?}"))),
        };
        self.reply(request, response);
    }

    fn reply(&mut self, request: RequestId, response: Response) {
        self.to_client
            .push_back(ServerFrame::Reply { request, response });
    }
}

struct ModelWriter {
    daemon: Arc<Mutex<ModelDaemon>>,
    encoded: Option<RequestFrame>,
}

impl FrameWrite for ModelWriter {
    fn encode(&mut self, frame: &RequestFrame) -> Result<(), ClientError> {
        self.encoded = Some(frame.clone());
        Ok(())
    }

    fn write(&mut self) -> std::io::Result<()> {
        let frame = self.encoded.take().expect("encoded before written");
        self.daemon.lock().unwrap().handle(frame);
        Ok(())
    }
}

struct ModelReader {
    daemon: Arc<Mutex<ModelDaemon>>,
}

impl FrameRead for ModelReader {
    fn next_frame_within_slice(&mut self) -> Result<Option<ServerFrame>, ConnectionLost> {
        let frame = self.daemon.lock().unwrap().to_client.pop_front();
        if frame.is_none() {
            // A read that times out: let the threads that can make progress run.
            thread::yield_now();
        }
        Ok(frame)
    }
}

const HELD: u64 = 1;
const AWAITED: u64 = 2;

/// Runs the model, with the race planted or not.
fn check_routing(notify_before_routing: bool) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        // Bugs of this code need few preemptions; the bound keeps the run to seconds.
        builder.preemption_bound = Some(3);
    }
    builder.check(move || {
        let held = ObjectId::from_u64(HELD);
        let awaited = ObjectId::from_u64(AWAITED);
        let daemon = Arc::new(Mutex::new(ModelDaemon {
            present: vec![held],
            // A buffer of `held` that the second thread drops.
            references: BTreeMap::from([(held, 1)]),
            ..ModelDaemon::default()
        }));
        let mut router = ReplyRouter::new(
            ModelWriter {
                daemon: daemon.clone(),
                encoded: None,
            },
            ModelReader {
                daemon: daemon.clone(),
            },
            ClientSession::new(),
        );
        router.notify_before_routing = notify_before_routing;
        let router = Arc::new(router);

        let getter = thread::spawn({
            let router = router.clone();
            move || {
                let got = router.call(Request::Get {
                    ids: vec![awaited],
                    timeout_ms: None,
                });
                assert_eq!(got.unwrap(), Response::Got(vec![Ok(info(awaited))]));
                // The buffer is dropped.
                router.release_without_waiting(awaited).unwrap();
            }
        });
        let putter = thread::spawn({
            let router = router.clone();
            move || {
                router.release_without_waiting(held).unwrap();
                let contains = router.call(Request::Contains { id: held }).unwrap();
                assert_eq!(contains, Response::Contains(true));
                let put = router.call(Request::Put {
                    id: awaited,
                    data: vec![0],
                    metadata: Vec::new(),
                });
                assert_eq!(put.unwrap(), Response::Done(Ok(())));
            }
        });
        getter.join().unwrap();
        putter.join().unwrap();

        let daemon = daemon.lock().unwrap();
        assert!(daemon.to_client.is_empty(), "a reply was never read");
        assert_eq!(daemon.bad_releases, 0);
        assert!(
            daemon.references.values().all(|count| *count == 0),
            "references left: {:?}",
            daemon.references
        );
        let replies = router.replies();
        assert_eq!(replies.session.awaited().count(), 0);
        assert!(replies.reader.is_some());
    });
}

#[test]
fn loom_every_reply_reaches_its_caller_beside_drops_and_other_requests() {
    check_routing(false);
}

/// The planted race: the reader signals the condvar before it routes the frame and gives the
/// reader back, and not after. A caller woken early goes back to sleep, and nobody wakes it
/// when its reply is in: loom finds the interleaving.
#[test]
#[should_panic(expected = "deadlock")]
fn loom_catches_a_wake_up_before_the_reply_is_routed() {
    check_routing(true);
}
