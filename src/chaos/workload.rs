//! The workload: client threads on every node putting objects of every size class, reading
//! their own back, fetching other nodes', deleting, and waiting for objects about to be put.
//!
//! An object's contents derive from its id alone ([`content`]), and its id encodes its size,
//! the run's seed, the node, the worker and a counter ([`object_id`]): any reader anywhere can
//! tell the right bytes from wrong ones, and ids never repeat within a run.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use skyriver_client::{Client, ClientError, FetchError, ObjectId, StoreError};

use super::history::{ClientExit, Op, OpKind, OpResult, Phase};
use super::python_clients::{PythonClient, PythonSetup};
use super::schedule::SplitMix64;

/// Data sizes of the objects put, from inline to rendezvous, with their weights.
pub const SIZE_CLASSES: [(u32, u64); 6] = [
    (1, 3),
    (100, 3),
    (3_000, 3),
    (40_000, 2),
    (300_000, 2),
    (2_000_000, 1),
];
/// Objects each worker keeps; beyond it, it deletes its oldest.
const LIVE_OBJECTS_PER_WORKER: usize = 24;
/// How long a fetch may wait.
pub const FETCH_TIMEOUT_MS: u64 = 5_000;
/// How long a blocking get waits for its object.
const BLOCKING_GET_TIMEOUT_MS: u64 = 3_000;
/// Worker threads on each node.
pub const WORKERS_PER_NODE: u32 = 2;

/// The id of the `counter`th object of `worker` on `node` in the run of `seed`, of `size`
/// bytes: the size in bytes 0..4, the seed in 4..12, node 12, worker 13, counter 14..20.
pub fn object_id(seed: u64, node: u32, worker: u32, counter: u64, size: u32) -> ObjectId {
    let mut id = [0u8; 20];
    id[0..4].copy_from_slice(&size.to_le_bytes());
    id[4..12].copy_from_slice(&seed.to_le_bytes());
    id[12] = node as u8;
    id[13] = worker as u8;
    id[14..20].copy_from_slice(&counter.to_le_bytes()[0..6]);
    ObjectId(id)
}

/// The data size `id` encodes.
pub fn size_of(id: &ObjectId) -> u32 {
    let mut size = [0u8; 4];
    size.copy_from_slice(&id.0[0..4]);
    u32::from_le_bytes(size)
}

/// The contents of the object `id`: [`size_of`] bytes of a stream seeded by the whole id.
pub fn content(id: &ObjectId) -> Vec<u8> {
    let mut seed = 0xcbf2_9ce4_8422_2325u64;
    for &byte in &id.0 {
        seed = (seed ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut stream = SplitMix64::new(seed);
    let size = size_of(id) as usize;
    let mut data = Vec::with_capacity(size + 8);
    while data.len() < size {
        data.extend_from_slice(&stream.next_u64().to_le_bytes());
    }
    data.truncate(size);
    data
}

/// Whether `data` is the object `id`'s, and if not, how it differs.
pub fn verify(id: &ObjectId, data: &[u8]) -> OpResult {
    let expected = content(id);
    if data.len() != expected.len() {
        return OpResult::WrongBytes {
            detail: format!("{} bytes, expected {}", data.len(), expected.len()),
        };
    }
    match data.iter().zip(&expected).position(|(a, b)| a != b) {
        None => OpResult::Ok,
        Some(offset) => OpResult::WrongBytes {
            detail: format!(
                "byte {offset} is {:#04x}, expected {:#04x}",
                data[offset], expected[offset]
            ),
        },
    }
}

/// State the workers share.
pub struct Shared {
    /// When the workload started (op times are relative to it).
    pub started: Instant,
    /// Objects acknowledged by some node, for the others to fetch.
    pub(super) acked: Mutex<Vec<(ObjectId, u32)>>,
    /// Each worker's running operation.
    pub(super) in_flight: Mutex<BTreeMap<(u32, u32), Op>>,
    /// Every finished operation.
    pub(super) ops: Mutex<Vec<Op>>,
    /// Client processes that exited without being told to.
    pub(super) client_exits: Mutex<Vec<ClientExit>>,
    stop: AtomicBool,
    /// Set when the run ends: client processes killed from now on are not crashes.
    ending: AtomicBool,
}

impl Shared {
    /// Nothing done yet; times count from `started`.
    pub(super) fn new(started: Instant) -> Self {
        Self {
            started,
            acked: Mutex::new(Vec::new()),
            in_flight: Mutex::new(BTreeMap::new()),
            ops: Mutex::new(Vec::new()),
            client_exits: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            ending: AtomicBool::new(false),
        }
    }

    /// Asks the workers to stop after their current operation.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub(super) fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether the workers were asked to stop.
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Whether the run is ending (client processes are being killed).
    pub(super) fn ending(&self) -> bool {
        self.ending.load(Ordering::SeqCst)
    }
}

/// The running workers.
pub struct Workload {
    /// Shared state.
    pub shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    python: Vec<PythonClient>,
}

impl Workload {
    /// Starts [`WORKERS_PER_NODE`] workers per socket, and a Python client per socket with
    /// `python` (from the thread that lives for the whole run: the clients die with it).
    pub fn start(
        seed: u64,
        sockets: Vec<PathBuf>,
        started: Instant,
        python: Option<&PythonSetup>,
    ) -> Self {
        let shared = Arc::new(Shared::new(started));
        let mut python_clients = Vec::new();
        if let Some(setup) = python {
            for (node, socket) in sockets.iter().enumerate() {
                match PythonClient::start(setup, socket, seed, node as u32, shared.clone()) {
                    Ok(client) => python_clients.push(client),
                    Err(error) => lock(&shared.client_exits).push(ClientExit {
                        node: node as u32,
                        worker: super::python_clients::PYTHON_WORKER,
                        at_ms: 0,
                        status: "not started".into(),
                        detail: error.to_string(),
                    }),
                }
            }
        }
        let mut threads = Vec::new();
        for (node, socket) in sockets.into_iter().enumerate() {
            for worker in 0..WORKERS_PER_NODE {
                let shared = shared.clone();
                let socket = socket.clone();
                threads.push(std::thread::spawn(move || {
                    Worker::new(seed, node as u32, worker, socket, shared).run()
                }));
            }
        }
        Self {
            shared,
            threads,
            python: python_clients,
        }
    }

    /// Python client processes started.
    pub fn python_clients(&self) -> u32 {
        self.python.len() as u32
    }

    /// Client processes that exited without being told to stop, so far.
    pub fn client_exits(&self) -> Vec<ClientExit> {
        lock(&self.shared.client_exits).clone()
    }

    /// Asks the workers to stop after their current operation.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// Whether every worker and client process has stopped.
    pub fn finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
            && self.python.iter().all(|p| p.thread.is_finished())
    }

    /// The operations still running (of workers that have not stopped).
    pub fn in_flight(&self) -> Vec<Op> {
        lock(&self.shared.in_flight).values().cloned().collect()
    }

    /// Every operation finished so far.
    pub fn ops(&self) -> Vec<Op> {
        lock(&self.shared.ops).clone()
    }

    /// Objects acknowledged so far, with the node that put each.
    pub fn acked(&self) -> Vec<(ObjectId, u32)> {
        lock(&self.shared.acked).clone()
    }

    /// Joins the workers (all must have stopped, or be about to); kills the client processes
    /// that have not.
    pub fn join(self) {
        self.shared.ending.store(true, Ordering::SeqCst);
        for client in &self.python {
            client.kill();
        }
        let python = self.python.into_iter().map(|p| p.thread);
        for thread in self.threads.into_iter().chain(python) {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether the error means the connection is gone (the daemon died or was restarted).
fn connection_lost(error: &ClientError) -> bool {
    !matches!(error, ClientError::Store(_) | ClientError::Fetch(_))
}

struct Worker {
    seed: u64,
    node: u32,
    worker: u32,
    socket: PathBuf,
    shared: Arc<Shared>,
    rng: SplitMix64,
    client: Option<Client>,
    mine: VecDeque<ObjectId>,
    counter: u64,
}

impl Worker {
    fn new(seed: u64, node: u32, worker: u32, socket: PathBuf, shared: Arc<Shared>) -> Self {
        Self {
            seed,
            node,
            worker,
            socket,
            shared,
            rng: SplitMix64::new(seed ^ (u64::from(node) << 32) ^ (u64::from(worker) << 48)),
            client: None,
            mine: VecDeque::new(),
            counter: 0,
        }
    }

    fn run(mut self) {
        while !self.shared.stop.load(Ordering::SeqCst) {
            if self.client.is_none() {
                match Client::connect(&self.socket) {
                    Ok(client) => self.client = Some(client),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                }
            }
            let roll = self.rng.below(100);
            let others = lock(&self.shared.acked).len();
            match roll {
                0..35 => {
                    let id = self.next_id();
                    self.put(id);
                }
                35..55 if !self.mine.is_empty() => {
                    let id = self.mine[self.rng.below(self.mine.len() as u64) as usize];
                    self.get(id);
                }
                55..80 if others > 0 => {
                    let pick = self.rng.below(others as u64) as usize;
                    let (id, _) = lock(&self.shared.acked)[pick];
                    self.fetch(id);
                }
                80..88 if !self.mine.is_empty() => {
                    let index = self.rng.below(self.mine.len() as u64) as usize;
                    if let Some(id) = self.mine.remove(index) {
                        self.delete(id);
                    }
                }
                88..100 => self.blocking_get(),
                _ => {}
            }
            while self.mine.len() > LIVE_OBJECTS_PER_WORKER {
                if let Some(id) = self.mine.pop_front() {
                    self.delete(id);
                }
            }
            std::thread::sleep(Duration::from_millis(self.rng.between(5, 30)));
        }
    }

    fn next_id(&mut self) -> ObjectId {
        let total: u64 = SIZE_CLASSES.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.below(total);
        let mut size = SIZE_CLASSES[0].0;
        for (class, weight) in SIZE_CLASSES {
            if pick < weight {
                size = class;
                break;
            }
            pick -= weight;
        }
        self.counter += 1;
        object_id(self.seed, self.node, self.worker, self.counter, size)
    }

    /// Runs `call` as an operation of `kind` on `id`, visible as in flight meanwhile.
    fn record(
        &mut self,
        kind: OpKind,
        id: ObjectId,
        timeout_ms: u64,
        call: impl FnOnce(&Client) -> Result<OpResult, ClientError>,
    ) -> OpResult {
        let Some(client) = self.client.clone() else {
            return OpResult::Failed {
                error: "not connected".into(),
            };
        };
        let mut op = Op {
            node: self.node,
            worker: self.worker,
            kind,
            id: id.to_string(),
            size: u64::from(size_of(&id)),
            start_ms: self.shared.ms(),
            end_ms: 0,
            timeout_ms,
            result: OpResult::Ok,
            phase: Phase::Chaos,
        };
        lock(&self.shared.in_flight).insert((self.node, self.worker), op.clone());
        let result = match call(&client) {
            Ok(result) => result,
            Err(error) => {
                if connection_lost(&error) {
                    self.client = None;
                }
                OpResult::Failed {
                    error: error.to_string(),
                }
            }
        };
        lock(&self.shared.in_flight).remove(&(self.node, self.worker));
        op.end_ms = self.shared.ms();
        op.result = result.clone();
        lock(&self.shared.ops).push(op);
        result
    }

    fn put(&mut self, id: ObjectId) {
        let data = content(&id);
        let result = self.record(OpKind::Put, id, 0, |client| {
            client.put(id, &data, &[]).map(|()| OpResult::Ok)
        });
        if result == OpResult::Ok {
            self.mine.push_back(id);
            lock(&self.shared.acked).push((id, self.node));
        }
    }

    fn get(&mut self, id: ObjectId) {
        self.record(OpKind::Get, id, 0, |client| {
            match client.get(&[id], Some(Duration::ZERO))?.pop() {
                Some(Ok(buffer)) => Ok(verify(&id, buffer.data())),
                Some(Err(StoreError::ObjectNotFound(_) | StoreError::Timeout(_))) => {
                    Ok(OpResult::NotFound)
                }
                Some(Err(error)) => Err(error.into()),
                None => Err(ClientError::Protocol("empty get reply".into())),
            }
        });
    }

    fn fetch(&mut self, id: ObjectId) {
        self.record(OpKind::Fetch, id, FETCH_TIMEOUT_MS, |client| {
            fetch_and_verify(client, id, FETCH_TIMEOUT_MS)
        });
    }

    fn delete(&mut self, id: ObjectId) {
        // Others stop fetching it before it goes (a fetch racing the delete may miss it).
        lock(&self.shared.acked).retain(|(acked, _)| *acked != id);
        self.record(OpKind::Delete, id, 0, |client| {
            client.delete(&[id]).map(|_| OpResult::Ok)
        });
    }

    /// A get of an id not put yet, on a connection of its own, then the put a moment later.
    fn blocking_get(&mut self) {
        let id = self.next_id();
        let delay = Duration::from_millis(self.rng.between(20, 300));
        let socket = self.socket.clone();
        let shared = self.shared.clone();
        let (node, worker) = (self.node, self.worker);
        let waiter = std::thread::spawn(move || {
            let start_ms = shared.ms();
            let result = match Client::connect(&socket) {
                Err(error) => OpResult::Failed {
                    error: error.to_string(),
                },
                Ok(client) => {
                    let timeout = Duration::from_millis(BLOCKING_GET_TIMEOUT_MS);
                    match client.get(&[id], Some(timeout)).map(|mut r| r.pop()) {
                        Ok(Some(Ok(buffer))) => verify(&id, buffer.data()),
                        Ok(Some(Err(StoreError::ObjectNotFound(_) | StoreError::Timeout(_)))) => {
                            OpResult::NotFound
                        }
                        Ok(Some(Err(error))) => OpResult::Failed {
                            error: error.to_string(),
                        },
                        Ok(None) => OpResult::Failed {
                            error: "empty get reply".into(),
                        },
                        Err(error) => OpResult::Failed {
                            error: error.to_string(),
                        },
                    }
                }
            };
            Op {
                node,
                // The waiter counts as a worker of its own.
                worker: worker + 100,
                kind: OpKind::BlockingGet,
                id: id.to_string(),
                size: u64::from(size_of(&id)),
                start_ms,
                end_ms: shared.ms(),
                timeout_ms: BLOCKING_GET_TIMEOUT_MS,
                result,
                phase: Phase::Chaos,
            }
        });
        std::thread::sleep(delay);
        self.put(id);
        match waiter.join() {
            Ok(op) => lock(&self.shared.ops).push(op),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Fetches `id` through `client` and checks its bytes.
pub fn fetch_and_verify(
    client: &Client,
    id: ObjectId,
    timeout_ms: u64,
) -> Result<OpResult, ClientError> {
    match client
        .fetch(&[id], Some(Duration::from_millis(timeout_ms)))?
        .pop()
    {
        Some(Ok(buffer)) => Ok(verify(&id, buffer.data())),
        Some(Err(FetchError::NotFound { .. })) => Ok(OpResult::NotFound),
        Some(Err(error)) => Err(ClientError::Fetch(error)),
        None => Err(ClientError::Protocol("empty fetch reply".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_size_and_contents_follow_from_the_id() {
        let id = object_id(42, 3, 1, 77, 40_000);
        assert_eq!(size_of(&id), 40_000);
        let data = content(&id);
        assert_eq!(data.len(), 40_000);
        assert_eq!(data, content(&id));
        assert_eq!(verify(&id, &data), OpResult::Ok);
        let other = object_id(42, 3, 1, 78, 40_000);
        assert_ne!(content(&other), data);
        assert!(matches!(verify(&other, &data), OpResult::WrongBytes { .. }));
        let mut torn = data.clone();
        torn[39_999] ^= 1;
        assert!(matches!(
            verify(&id, &torn),
            OpResult::WrongBytes { detail } if detail.starts_with("byte 39999")
        ));
        assert!(matches!(
            verify(&id, &data[..100]),
            OpResult::WrongBytes { .. }
        ));
    }
}
