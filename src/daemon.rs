//! The node daemon: owns the arenas and the sans-IO store, serves local clients on a Unix
//! socket.
//!
//! One tokio runtime; each connection has a reader task (decodes a frame, runs it through the
//! core under a mutex, routes the outputs) and a writer task (drains the connection's outbox,
//! coalescing queued frames into one write). A timer task wakes the core at its next deadline.
//! Object bytes never pass through here: clients map the arenas' fds, sent once per connection.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use skyriver_core::client_protocol::{
    decode_frame_len, decode_request, encode_frame, ArenaInfo, FrameError, Request, RequestFrame,
    Response, ServerFrame, FRAME_HEADER_BYTES, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
use skyriver_core::{
    ArenaId, ClientId, Instant, NodeId, RequestId, Store, StoreConfig, StoreError, StoreOutput,
};
use skyriver_transport::{ArenaError, ArenaOptions, SharedArena};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info, warn};

/// How to run a daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where clients connect.
    pub socket_path: PathBuf,
    /// Bytes of shared memory for objects.
    pub memory_bytes: u64,
    /// Back the arena with a file on this hugetlbfs mount.
    pub hugepages_dir: Option<PathBuf>,
    /// Touch every page at start.
    pub prefault: bool,
    /// Permission bits of the socket file (owner-only by default).
    pub socket_mode: u32,
    /// This node's id.
    pub node: NodeId,
}

impl DaemonConfig {
    /// Defaults for a socket path and memory size.
    pub fn new(socket_path: impl Into<PathBuf>, memory_bytes: u64) -> Self {
        Self {
            socket_path: socket_path.into(),
            memory_bytes,
            hugepages_dir: None,
            prefault: true,
            socket_mode: 0o600,
            node: NodeId(0),
        }
    }
}

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The arena could not be created.
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// Another daemon already serves this socket.
    #[error("a daemon is already listening on {0}")]
    AlreadyRunning(PathBuf),
    /// Binding or configuring the socket failed.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// State shared by the daemon's tasks.
struct Shared {
    core: Mutex<CoreState>,
    arenas: Vec<Arc<SharedArena>>,
    arena_infos: Vec<ArenaInfo>,
    node: NodeId,
    epoch: std::time::Instant,
    timer_changed: Notify,
}

/// The core and the outboxes its outputs go to, under one lock.
struct CoreState {
    store: Store,
    outboxes: BTreeMap<ClientId, mpsc::UnboundedSender<Vec<u8>>>,
    next_client: u64,
}

impl Shared {
    fn now(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, CoreState> {
        // A panic while holding the lock is a bug already reported; keep serving.
        self.core
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl CoreState {
    fn send(&self, client: ClientId, frame: &ServerFrame) {
        if let Some(outbox) = self.outboxes.get(&client) {
            let mut bytes = Vec::new();
            encode_frame(frame, &mut bytes);
            // A closed outbox means the connection is going away; its cleanup follows.
            let _ = outbox.send(bytes);
        }
    }

    fn reply(&self, client: ClientId, request: RequestId, response: Response) {
        self.send(client, &ServerFrame::Reply { request, response });
    }

    /// Carries out every output the store queued.
    fn drain(&mut self) {
        while let Some(output) = self.store.poll_output() {
            match output {
                StoreOutput::GetReply {
                    client,
                    request,
                    results,
                } => self.reply(client, request, Response::Got(results)),
                StoreOutput::Notify { client, event } => {
                    self.send(client, &ServerFrame::Event(event))
                }
                StoreOutput::Local(event) => debug!(?event, "store event"),
            }
        }
    }
}

/// A daemon running on its own thread, for tests and tools that embed one.
pub struct DaemonHandle {
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), DaemonError>>>,
    socket_path: PathBuf,
}

impl DaemonHandle {
    /// Starts a daemon and returns once its socket accepts connections.
    pub fn start(config: DaemonConfig) -> Result<Self, DaemonError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let socket_path = config.socket_path.clone();
        let thread = std::thread::Builder::new()
            .name("skyriver-daemon".into())
            .spawn(move || {
                let runtime = build_runtime()?;
                runtime.block_on(async move {
                    let server = match Server::bind(config).await {
                        Ok(server) => server,
                        Err(error) => {
                            let _ = ready_tx.send(Err(error.to_string()));
                            return Err(error);
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    server
                        .serve(async {
                            let _ = shutdown_rx.await;
                        })
                        .await;
                    Ok(())
                })
            })
            .map_err(DaemonError::Runtime)?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                shutdown: Some(shutdown_tx),
                thread: Some(thread),
                socket_path,
            }),
            _ => Err(thread
                .join()
                .unwrap_or_else(|_| {
                    Err(DaemonError::Runtime(std::io::Error::other(
                        "daemon thread panicked",
                    )))
                })
                .err()
                .unwrap_or_else(|| {
                    DaemonError::Runtime(std::io::Error::other("daemon stopped during start"))
                })),
        }
    }

    /// The socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Stops the daemon and waits for it.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn build_runtime() -> Result<tokio::runtime::Runtime, DaemonError> {
    // One thread: the core is serialized under its lock anyway, and staying on one thread saves
    // the cross-thread wake-ups that would dominate a local round trip.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DaemonError::Runtime)
}

/// Runs a daemon in the foreground until SIGINT or SIGTERM.
pub fn run_until_signalled(config: DaemonConfig) -> Result<(), DaemonError> {
    let runtime = build_runtime()?;
    runtime.block_on(async move {
        let server = Server::bind(config).await?;
        server.serve(shutdown_signal()).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(error) => {
            warn!(%error, "cannot watch SIGTERM; stop with SIGINT");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("SIGINT: shutting down"),
        _ = terminate.recv() => info!("SIGTERM: shutting down"),
    }
}

/// A bound daemon, ready to serve.
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
    socket_path: PathBuf,
}

impl Server {
    /// Creates the arena, binds the socket and prints what it serves.
    pub async fn bind(config: DaemonConfig) -> Result<Self, DaemonError> {
        let started = std::time::Instant::now();
        let options = ArenaOptions {
            hugepages_dir: config.hugepages_dir.clone(),
            prefault: config.prefault,
        };
        let arena = SharedArena::create("skyriver-arena-0", config.memory_bytes, &options)?;
        let arena_infos = vec![ArenaInfo {
            id: ArenaId(0),
            size_bytes: arena.size_bytes(),
        }];
        let store = Store::new(StoreConfig::single_arena(arena.size_bytes()));
        let listener = bind_socket(&config.socket_path, config.socket_mode).await?;
        info!(
            node = %config.node,
            memory = %crate::size::format_bytes(arena.size_bytes()),
            backing = if config.hugepages_dir.is_some() { "hugetlbfs" } else { "memfd" },
            prefaulted = config.prefault,
            startup_ms = started.elapsed().as_millis() as u64,
            socket = %config.socket_path.display(),
            "skyriver daemon ready"
        );
        let shared = Arc::new(Shared {
            core: Mutex::new(CoreState {
                store,
                outboxes: BTreeMap::new(),
                next_client: 1,
            }),
            arenas: vec![Arc::new(arena)],
            arena_infos,
            node: config.node,
            epoch: std::time::Instant::now(),
            timer_changed: Notify::new(),
        });
        Ok(Self {
            listener,
            shared,
            socket_path: config.socket_path,
        })
    }

    /// Serves clients until `shutdown` completes, then removes the socket file.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let timer = tokio::spawn(run_timer(self.shared.clone()));
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_connection(self.shared.clone(), stream));
                    }
                    Err(error) => warn!(%error, "accept failed"),
                },
            }
        }
        timer.abort();
        let _ = std::fs::remove_file(&self.socket_path);
        info!("daemon stopped");
    }
}

async fn bind_socket(path: &Path, mode: u32) -> Result<UnixListener, DaemonError> {
    let listen_error = |source| DaemonError::Listen {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(DaemonError::AlreadyRunning(path.to_path_buf()));
        }
        // Left behind by a daemon that died: nobody listens on it.
        std::fs::remove_file(path).map_err(listen_error)?;
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(listen_error)?;
    }
    let listener = UnixListener::bind(path).map_err(listen_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(listen_error)?;
    Ok(listener)
}

async fn run_timer(shared: Arc<Shared>) {
    loop {
        let next = shared.lock().store.poll_timeout();
        let changed = shared.timer_changed.notified();
        match next {
            None => changed.await,
            Some(deadline) => {
                let wait = deadline.saturating_since(shared.now());
                tokio::select! {
                    _ = changed => {}
                    _ = tokio::time::sleep(wait) => {
                        let now = shared.now();
                        let mut core = shared.lock();
                        core.store.handle_timeout(now);
                        core.drain();
                    }
                }
            }
        }
    }
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum ConnectionEnd {
    #[error("client closed the connection")]
    Closed,
    #[error("connection closed mid-frame (truncated frame)")]
    Truncated,
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("io error: {0}")]
    Io(std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
}

impl From<std::io::Error> for ConnectionEnd {
    fn from(error: std::io::Error) -> Self {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        // A client that exits with replies in flight is an ordinary goodbye.
        match error.kind() {
            BrokenPipe | ConnectionReset => ConnectionEnd::Closed,
            _ => ConnectionEnd::Io(error),
        }
    }
}

/// Bytes read from a connection, cut into frames. Reading into it is cancel-safe, so one task
/// can wait on the socket and on its outbox at once.
#[derive(Default)]
struct FrameReader {
    buf: Vec<u8>,
    start: usize,
}

impl FrameReader {
    const READ_CHUNK_BYTES: usize = 64 * 1024;

    /// The byte range of the next complete frame body in the buffer, if one is there.
    fn next_frame(&mut self) -> Result<Option<std::ops::Range<usize>>, FrameError> {
        let pending = &self.buf[self.start..];
        let Some(header) = pending.get(..FRAME_HEADER_BYTES) else {
            return Ok(None);
        };
        let header: [u8; FRAME_HEADER_BYTES] =
            header.try_into().expect("sliced to the header size");
        let len = decode_frame_len(header, MAX_REQUEST_BYTES)?;
        if pending.len() < FRAME_HEADER_BYTES + len {
            return Ok(None);
        }
        let body = self.start + FRAME_HEADER_BYTES..self.start + FRAME_HEADER_BYTES + len;
        self.start = body.end;
        Ok(Some(body))
    }

    /// Reads more bytes; `Closed` or `Truncated` at end of stream.
    async fn fill(&mut self, stream: &mut UnixStream) -> Result<(), ConnectionEnd> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(Self::READ_CHUNK_BYTES);
        if stream.read_buf(&mut self.buf).await? == 0 {
            return Err(if self.buf.is_empty() {
                ConnectionEnd::Closed
            } else {
                ConnectionEnd::Truncated
            });
        }
        Ok(())
    }
}

fn error_frame(request: RequestId, error: StoreError) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_frame(
        &ServerFrame::Reply {
            request,
            response: Response::Error(error),
        },
        &mut bytes,
    );
    bytes
}

async fn serve_connection(shared: Arc<Shared>, mut stream: UnixStream) {
    let (client, mut outbox) = {
        let mut core = shared.lock();
        let client = ClientId(core.next_client);
        core.next_client += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        core.outboxes.insert(client, tx);
        core.store.connect(client);
        (client, rx)
    };
    let mut reader = FrameReader::default();
    let end = match handshake(&shared, client, &mut stream, &mut reader).await {
        Ok(()) => serve_requests(&shared, client, &mut stream, &mut reader, &mut outbox).await,
        Err(end) => end,
    };
    match &end {
        ConnectionEnd::Closed => debug!(%client, "disconnected"),
        other => warn!(%client, reason = %other, "closing client connection"),
    }
    let mut core = shared.lock();
    core.outboxes.remove(&client);
    core.store.disconnect(client);
    core.drain();
}

/// Reads `Hello`, answers `Welcome` with the arenas' fds attached.
async fn handshake(
    shared: &Shared,
    client: ClientId,
    stream: &mut UnixStream,
    reader: &mut FrameReader,
) -> Result<(), ConnectionEnd> {
    let body = loop {
        match reader.next_frame() {
            Ok(Some(body)) => break body,
            Ok(None) => reader.fill(stream).await?,
            Err(error) => {
                let _ = stream
                    .write_all(&error_frame(
                        RequestId(0),
                        StoreError::BadRequest(error.to_string()),
                    ))
                    .await;
                return Err(error.into());
            }
        }
    };
    let (request, client_name) = match decode_request(&reader.buf[body]) {
        Ok(RequestFrame {
            request,
            body:
                Request::Hello {
                    protocol_version,
                    client_name,
                },
        }) => {
            if protocol_version != PROTOCOL_VERSION {
                let reason = format!(
                    "protocol version {protocol_version} is not supported; this daemon speaks {PROTOCOL_VERSION}"
                );
                let _ = stream
                    .write_all(&error_frame(
                        request,
                        StoreError::BadRequest(reason.clone()),
                    ))
                    .await;
                return Err(ConnectionEnd::Protocol(reason));
            }
            (request, client_name)
        }
        Ok(other) => {
            let reason = "the first request must be Hello".to_string();
            let _ = stream
                .write_all(&error_frame(
                    other.request,
                    StoreError::BadRequest(reason.clone()),
                ))
                .await;
            return Err(ConnectionEnd::Protocol(reason));
        }
        Err(error) => {
            let _ = stream
                .write_all(&error_frame(
                    RequestId(0),
                    StoreError::BadRequest(error.to_string()),
                ))
                .await;
            return Err(error.into());
        }
    };
    let mut welcome = Vec::new();
    encode_frame(
        &ServerFrame::Reply {
            request,
            response: Response::Welcome {
                protocol_version: PROTOCOL_VERSION,
                node: shared.node,
                arenas: shared.arena_infos.clone(),
            },
        },
        &mut welcome,
    );
    let fds: Vec<_> = shared.arenas.iter().map(|arena| arena.fd()).collect();
    let sent = loop {
        stream.writable().await?;
        let socket = &*stream;
        match socket.try_io(tokio::io::Interest::WRITABLE, || {
            use std::os::fd::AsFd;
            skyriver_transport::fd_passing::send_with_fds(socket.as_fd(), &welcome, &fds)
        }) {
            Ok(sent) => break sent,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error.into()),
        }
    };
    stream.write_all(&welcome[sent..]).await?;
    debug!(%client, %client_name, "client connected");
    Ok(())
}

/// Serves requests and writes everything queued for this client, in one task: a reply is
/// written by the task that read its request, without a hop to another task.
async fn serve_requests(
    shared: &Shared,
    client: ClientId,
    stream: &mut UnixStream,
    reader: &mut FrameReader,
    outbox: &mut mpsc::UnboundedReceiver<Vec<u8>>,
) -> ConnectionEnd {
    let mut pending = Vec::new();
    loop {
        // Handle every complete request already buffered.
        loop {
            match reader.next_frame() {
                Ok(Some(body)) => match decode_request(&reader.buf[body]) {
                    Ok(frame) => handle_request(shared, client, frame),
                    Err(error) => {
                        warn!(%client, %error, "malformed request");
                        pending.extend(error_frame(
                            RequestId(0),
                            StoreError::BadRequest(error.to_string()),
                        ));
                    }
                },
                Ok(None) => break,
                Err(error) => {
                    // The stream cannot be trusted past a bad length: explain, then close.
                    pending.extend(error_frame(
                        RequestId(0),
                        StoreError::BadRequest(error.to_string()),
                    ));
                    while let Ok(frame) = outbox.try_recv() {
                        pending.extend(frame);
                    }
                    let _ = stream.write_all(&pending).await;
                    return error.into();
                }
            }
        }
        while let Ok(frame) = outbox.try_recv() {
            pending.extend(frame);
        }
        if !pending.is_empty() {
            if let Err(error) = stream.write_all(&pending).await {
                return error.into();
            }
            pending.clear();
        }
        tokio::select! {
            filled = reader.fill(stream) => {
                if let Err(end) = filled {
                    return end;
                }
            }
            frame = outbox.recv() => {
                // The sender lives in the core state until this connection ends.
                if let Some(frame) = frame {
                    pending.extend(frame);
                }
            }
        }
    }
}

fn handle_request(shared: &Shared, client: ClientId, frame: RequestFrame) {
    let RequestFrame { request, body } = frame;
    let now = shared.now();
    let mut core = shared.lock();
    if let Err(error) = body.validate() {
        core.reply(client, request, Response::Error(error));
        return;
    }
    let store = &mut core.store;
    let response = match body {
        Request::Hello { .. } => Some(Response::Error(StoreError::BadRequest(
            "Hello was already received on this connection".into(),
        ))),
        Request::Create {
            id,
            data_size,
            metadata_size,
        } => Some(Response::Created(store.create(
            now,
            client,
            id,
            data_size,
            metadata_size,
        ))),
        Request::Seal { id, release } => {
            Some(Response::Done(store.seal(client, id, release).map(|_| ())))
        }
        Request::Abort { id } => Some(Response::Done(store.abort(client, id))),
        Request::Get { ids, timeout_ms } => {
            let had_deadline = store.poll_timeout();
            store.get(now, client, request, ids, Request::timeout(timeout_ms));
            if store.poll_timeout() != had_deadline {
                shared.timer_changed.notify_one();
            }
            None
        }
        Request::Release { id } => Some(Response::Done(store.release(client, id))),
        Request::Contains { id } => Some(Response::Contains(store.contains(&id))),
        Request::Delete { ids } => Some(Response::Deleted(store.delete(&ids))),
        Request::List => Some(Response::Listed(store.list())),
        Request::Evict { bytes } => Some(Response::Evicted(store.evict(bytes))),
        Request::Subscribe => {
            store.subscribe(client);
            Some(Response::Done(Ok(())))
        }
        Request::Stats => Some(Response::Stats(store.stats())),
    };
    if let Some(response) = response {
        core.reply(client, request, response);
    }
    core.drain();
}
