//! The Rust client of a node's store.
//!
//! A [`Client`] holds one Unix-socket connection to the daemon and a mapping of each of the
//! daemon's arenas, received once at connect time. Objects are never copied through the
//! socket: [`Client::create`] hands out a writable view of the object's bytes in shared
//! memory, and [`Client::get`] read-only views that release their reference when dropped.
//!
//! The client is synchronous and cheap to clone (clones share the connection); it is `Send`
//! and `Sync`. Calls from many threads share the one connection: each request carries an id,
//! and whichever caller is reading the socket routes every reply to the caller waiting for it
//! (the others sleep until their reply is in). So a `get` that waits for ever never blocks
//! another thread's call, and buffers may be dropped on any thread at any time: a release is
//! written and not waited for.
//!
//! A large batch of ids is sent in as many requests as the daemon's limits need
//! ([`MAX_IDS_PER_REQUEST`] ids each), all in flight at once: one call, one timeout.
//!
//! A blocked wait looks up every [`WAIT_SLICE`]: at the caller's interrupt check (the
//! `*_interruptible` calls; Python's Ctrl-C) and at [`Client::close`] from another thread.
//! The daemon's later reply to a call given up that way is read and its references released.
//!
//! After `fork()` the child shares the parent's socket; it must not speak on it. Every call
//! in a child fails with [`ClientError::Forked`], and buffers dropped there send nothing: the
//! child connects anew.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use skyriver_core::client_protocol::{
    decode_frame_len, decode_server_frame, encode_frame, ClusterView, CopyView, ReplicaPolicy,
    Request, RequestFrame, Response, ServerFrame, TraceStamp, FRAME_HEADER_BYTES,
    MAX_IDS_PER_REQUEST, MAX_INLINE_PUT_BYTES, MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES,
    PROTOCOL_VERSION,
};
use skyriver_core::client_session::{ClientSession, ConnectionLost, ProtocolViolation};
use skyriver_core::digest::{ContentDigest, ContentHasher};
use skyriver_core::node::{FetchError, TransferMode};
use skyriver_core::store::{EvictOutcome, ObjectSummary};
use skyriver_core::{ArenaId, NodeId, ObjectEvent, ObjectId, ObjectInfo, StoreError, StoreStats};
use skyriver_transport::{ReadableRegion, SharedArena, WritableRegion};

use crate::reply_routing::{io_lost, never, FrameRead, FrameWrite, ReplyRouter};

/// A connection that said `Hello`: its stream and session, the daemon's node and arenas.
type OpenedConnection = (UnixStream, ClientSession<()>, NodeId, MappedArenas);

/// How long a blocked wait sleeps before it looks at its interrupt check and at
/// [`Client::close`] again.
pub const WAIT_SLICE: Duration = Duration::from_millis(50);

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon's socket could not be reached.
    #[error(
        "cannot connect to the skyriver daemon at {path}: {source} (is `skyriver daemon` running?)"
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The daemon's socket is there, but this user may not open it.
    #[error("permission denied on the skyriver daemon's socket {path}: {explanation}")]
    PermissionDenied {
        /// The socket path.
        path: PathBuf,
        /// Whose socket (or directory) it is, and how its owner gives access.
        explanation: String,
    },
    /// [`Client::close`] was called (on this client or a clone): the call was refused, or its
    /// wait ended.
    #[error("the client was closed")]
    ClientClosed,
    /// The caller's interrupt check ended the wait (Ctrl-C in Python).
    #[error("the wait was interrupted")]
    Interrupted,
    /// Reading or writing the socket failed.
    #[error("connection to the daemon failed: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon closed the connection.
    #[error("the daemon closed the connection")]
    Closed,
    /// The daemon answered something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An arena could not be mapped.
    #[error("cannot map the daemon's memory: {0}")]
    Map(#[from] skyriver_transport::ArenaError),
    /// The store refused the operation.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fetch from the cluster failed.
    #[error(transparent)]
    Fetch(FetchError),
    /// This process is a fork of the one that connected: the connection belongs to the parent.
    #[error(
        "this client was connected by process {parent_pid}, and this is process {pid} (a fork): \
         connect again in this process"
    )]
    Forked {
        /// The process that connected.
        parent_pid: u32,
        /// This process.
        pid: u32,
    },
}

/// Where clients look for the daemon when not told: `$SKYRIVER_SOCKET` (when set and not
/// empty), else `/tmp/skyriver-<uid>/skyriver.sock`, in a directory only that user can write
/// (the daemon makes it mode 0700).
pub fn default_socket_path() -> PathBuf {
    std::env::var_os("SKYRIVER_SOCKET")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/tmp/skyriver-{}/skyriver.sock",
                nix::unistd::getuid()
            ))
        })
}

/// The daemon's arenas as this client maps them.
type MappedArenas = BTreeMap<ArenaId, Arc<SharedArena>>;

/// Every copy of an object, according to the directory (see [`Client::locate_copies`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectCopies {
    /// Live nodes holding a sealed copy, with their failure domains, each marked a copy of
    /// record or a cache copy ([`CopyView::of_record`]).
    pub copies: Vec<CopyView>,
    /// Copies of record the object wants: the registry's count; without records, what the
    /// answering node knows.
    pub wanted: Option<u8>,
    /// Data and metadata bytes, when known.
    pub sizes: Option<(u64, u64)>,
    /// Whether the answer knows which copies are copies of record (the built-in directory
    /// keeps their records, a standalone node has none); false with Redis, which keeps none:
    /// then no copy is marked a copy of record.
    pub records_known: bool,
}

/// Where an object lives (see [`Client::locate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectLocation {
    /// Live nodes holding a sealed copy.
    pub holders: Vec<NodeId>,
    /// Data and metadata bytes, when known.
    pub sizes: Option<(u64, u64)>,
    /// The digest of the object's bytes (the content its id names), when known.
    pub digest: Option<ContentDigest>,
}

/// How a fetch runs: the daemon's defaults, unless set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchOptions {
    /// How the bytes move: `Auto` (the daemon's threshold) unless forced.
    pub mode: TransferMode,
    /// Wait (up to the timeout) for a node to publish objects nobody holds yet.
    pub wait_for_publication: bool,
    /// The node believed to hold the objects: asked first, without a directory lookup.
    pub hint: Option<NodeId>,
}

/// A connection to the local daemon.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    connection: Connection,
    arenas: BTreeMap<ArenaId, Arc<SharedArena>>,
    node: NodeId,
    socket_path: PathBuf,
    /// The process that connected; a fork must not use the connection.
    pid: u32,
}

/// One socket shared by every thread of the client ([`ReplyRouter`]).
type Connection = ReplyRouter<FrameWriter, FrameReader>;

struct FrameWriter {
    stream: UnixStream,
    write_buf: Vec<u8>,
}

impl FrameWrite for FrameWriter {
    /// Encodes a request into the write buffer, refusing one over the daemon's limit (the
    /// daemon would close the connection on it) without touching the connection.
    fn encode(&mut self, frame: &RequestFrame) -> Result<(), ClientError> {
        self.write_buf.clear();
        encode_frame(frame, &mut self.write_buf);
        let bytes = self.write_buf.len() - FRAME_HEADER_BYTES;
        if bytes > MAX_REQUEST_BYTES {
            return Err(ClientError::Store(StoreError::BadRequest(format!(
                "a request of {bytes} bytes; the daemon takes at most {MAX_REQUEST_BYTES} \
                 (send fewer ids at once)"
            ))));
        }
        Ok(())
    }

    /// Writes the encoded request.
    fn write(&mut self) -> std::io::Result<()> {
        self.stream.write_all(&self.write_buf)
    }
}

/// The read side of a connection.
struct FrameReader {
    /// Buffered reads of the socket: a reply usually arrives in one `read`.
    reader: std::io::BufReader<UnixStream>,
    read_buf: Vec<u8>,
    /// How long to poll the socket for a reply before blocking on it ([`skyriver_transport::poll`]).
    poll: Duration,
    /// The socket's read timeout: how long one blocking read waits for bytes.
    read_timeout: Duration,
}

/// Whether a read error only says that no bytes came in time (or a signal came first).
fn no_bytes_yet(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

impl FrameReader {
    fn new(stream: &UnixStream, poll: Duration) -> Result<Self, ClientError> {
        let stream = stream.try_clone()?;
        // Reads wait a slice at a time (the stream's clones share the timeout; it only
        // bounds reads).
        stream.set_read_timeout(Some(WAIT_SLICE))?;
        Ok(Self {
            reader: std::io::BufReader::with_capacity(64 * 1024, stream),
            read_buf: Vec::new(),
            poll,
            read_timeout: WAIT_SLICE,
        })
    }

    /// Waits up to `within` (at least a microsecond) for bytes, the socket's end or an error
    /// to read; false when none came. Reads no frame, so nothing is lost when it gives up.
    fn wait_for_bytes(&mut self, within: Duration) -> Result<bool, ConnectionLost> {
        if !self.reader.buffer().is_empty() {
            return Ok(true);
        }
        let within = within.max(Duration::from_micros(1));
        if within != self.read_timeout {
            self.reader
                .get_ref()
                .set_read_timeout(Some(within))
                .map_err(|error| io_lost(&error))?;
            self.read_timeout = within;
        }
        match std::io::BufRead::fill_buf(&mut self.reader) {
            // Bytes, or the end of the stream (which `read_frame` reports).
            Ok(_) => Ok(true),
            Err(error) if no_bytes_yet(&error) => Ok(false),
            Err(error) => Err(io_lost(&error)),
        }
    }

    /// Fills `buf` whole, waiting past read timeouts: a frame once started is read to its end.
    /// An end of the stream before the first byte is [`ConnectionLost::Closed`].
    fn read_fully(&mut self, buf: &mut [u8]) -> Result<(), ConnectionLost> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.reader.read(&mut buf[filled..]) {
                Ok(0) if filled == 0 => return Err(ConnectionLost::Closed),
                Ok(0) => return Err(io_lost(&std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => filled += n,
                Err(error) if no_bytes_yet(&error) => {}
                Err(error) => return Err(io_lost(&error)),
            }
        }
        Ok(())
    }

    /// Polls the socket until it has bytes (or reports an end or error) or the polling time
    /// is over, yielding the CPU between polls; the blocking read that follows then finds
    /// the reply without a wake-up.
    fn poll_readable(&self) {
        if self.reader.buffer().is_empty() {
            skyriver_transport::poll::wait_readable(self.reader.get_ref().as_raw_fd(), self.poll);
        }
    }

    /// The next frame, however long it takes to come.
    fn read_frame(&mut self) -> Result<ServerFrame, ConnectionLost> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.read_fully(&mut header)?;
        let len = decode_frame_len(header, MAX_RESPONSE_BYTES).map_err(ProtocolViolation::from)?;
        let mut body = std::mem::take(&mut self.read_buf);
        body.resize(len, 0);
        let read = self.read_fully(&mut body).map_err(|error| match error {
            ConnectionLost::Closed => io_lost(&std::io::ErrorKind::UnexpectedEof.into()),
            other => other,
        });
        let frame = read.and_then(|()| {
            decode_server_frame(&body).map_err(|e| ProtocolViolation::from(e).into())
        });
        self.read_buf = body;
        frame
    }
}

impl FrameRead for FrameReader {
    /// The next frame if one starts within [`WAIT_SLICE`] (after polling for it, see
    /// [`skyriver_transport::poll`]); a frame once started is read to its end.
    fn next_frame_within_slice(&mut self) -> Result<Option<ServerFrame>, ConnectionLost> {
        self.poll_readable();
        if !self.wait_for_bytes(WAIT_SLICE)? {
            return Ok(None);
        }
        self.read_frame().map(Some)
    }
}

/// The error of a failed connect: a refused permission is told apart, with whose socket it
/// is and how its owner gives access.
fn connect_error(path: &Path, source: std::io::Error) -> ClientError {
    if source.kind() != std::io::ErrorKind::PermissionDenied {
        return ClientError::Connect {
            path: path.to_path_buf(),
            source,
        };
    }
    ClientError::PermissionDenied {
        path: path.to_path_buf(),
        explanation: access_explanation(path),
    }
}

/// A user's name, else their uid.
fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// A group's name, else its gid.
fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(group)) => group.name,
        _ => format!("gid {gid}"),
    }
}

/// Why this user may not open the socket at `path`: the socket's owner, group and mode, or the
/// directory on its way this user cannot enter; and what its owner can do about it.
fn access_explanation(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let me = user_name(nix::unistd::geteuid().as_raw());
    let flags = "`skyriver daemon --socket-group GROUP` (a group you are in; the socket gets mode \
                 660) or `--socket-mode 666` (every user)";
    // The first directory on the way this user may not enter, if any.
    let mut directories: Vec<&Path> = path.ancestors().skip(1).collect();
    directories.reverse();
    let closed = directories.into_iter().find(|dir| {
        !dir.as_os_str().is_empty()
            && nix::unistd::access(*dir, nix::unistd::AccessFlags::X_OK).is_err()
    });
    if let Some(dir) = closed {
        let whose = match std::fs::metadata(dir) {
            Ok(meta) => format!(
                " (user {}, group {}, mode {:03o})",
                user_name(meta.uid()),
                group_name(meta.gid()),
                meta.mode() & 0o777
            ),
            Err(_) => String::new(),
        };
        return format!(
            "user {me} may not enter its directory {}{whose}; the daemon's owner can put the \
             socket in a directory you may enter (one the daemon makes with --socket-group is \
             mode 710) and give access with {flags}",
            dir.display()
        );
    }
    match std::fs::metadata(path) {
        Ok(meta) => {
            let owner = user_name(meta.uid());
            format!(
                "the socket belongs to user {owner} (group {}, mode {:03o}) and this process \
                 runs as user {me}; the daemon's owner can give access with {flags}, or run \
                 this as user {owner}",
                group_name(meta.gid()),
                meta.mode() & 0o777
            )
        }
        Err(_) => format!(
            "this process runs as user {me}; the daemon's owner can give access with {flags}"
        ),
    }
}

fn unexpected(response: Response) -> ClientError {
    match response {
        Response::Error(error) => ClientError::Store(error),
        other => ClientError::Protocol(format!("unexpected response {other:?}")),
    }
}

impl Client {
    /// Connects to the daemon at [`default_socket_path`].
    pub fn connect_default() -> Result<Self, ClientError> {
        Self::connect(default_socket_path())
    }

    /// Connects to the daemon listening on `socket_path` and maps its memory.
    pub fn connect(socket_path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let socket_path = socket_path.as_ref().to_path_buf();
        let (stream, session, node, arenas) = Self::open(&socket_path)?;
        let reader = FrameReader::new(&stream, skyriver_transport::poll::poll_from_env())?;
        let writer = FrameWriter {
            stream,
            write_buf: Vec::new(),
        };
        Ok(Self {
            inner: Arc::new(ClientInner {
                connection: Connection::new(writer, reader, session),
                arenas,
                node,
                socket_path,
                pid: std::process::id(),
            }),
        })
    }

    /// Connects, says hello and maps the arenas; the stream and its session are ready for
    /// requests.
    fn open(socket_path: &Path) -> Result<OpenedConnection, ClientError> {
        let mut stream = UnixStream::connect(socket_path)
            .map_err(|source| connect_error(socket_path, source))?;
        let client_name = format!(
            "{}[{}]",
            std::env::args().next().unwrap_or_default(),
            std::process::id()
        );
        let mut session = ClientSession::new();
        let hello = session.send(
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name,
            },
            (),
        )?;
        let mut bytes = Vec::new();
        encode_frame(&hello, &mut bytes);
        stream.write_all(&bytes)?;
        // The fds come with the first bytes of the Welcome frame: read its header by recvmsg,
        // on the raw socket (the buffered reader has not read anything yet).
        let mut header = [0u8; FRAME_HEADER_BYTES];
        let (mut filled, fds) =
            skyriver_transport::fd_passing::recv_with_fds(stream.as_fd(), &mut header)?;
        if filled == 0 {
            return Err(ClientError::Closed);
        }
        while filled < FRAME_HEADER_BYTES {
            let n = stream.read(&mut header[filled..])?;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            filled += n;
        }
        let len = decode_frame_len(header, MAX_RESPONSE_BYTES)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body)?;
        let frame = decode_server_frame(&body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        session
            .receive(frame)
            .map_err(|violation| ClientError::Protocol(violation.to_string()))?;
        let Some(((), response)) = session.take_reply(hello.request) else {
            return Err(ClientError::Protocol("no reply to Hello".into()));
        };
        let Response::Welcome {
            protocol_version,
            node,
            arenas,
        } = response
        else {
            return Err(unexpected(response));
        };
        if protocol_version != PROTOCOL_VERSION {
            return Err(ClientError::Protocol(format!(
                "daemon speaks protocol {protocol_version}, this client {PROTOCOL_VERSION}"
            )));
        }
        if fds.len() != arenas.len() {
            return Err(ClientError::Protocol(format!(
                "daemon announced {} arenas but passed {} fds",
                arenas.len(),
                fds.len()
            )));
        }
        let mut mapped = BTreeMap::new();
        for (info, fd) in arenas.iter().zip(fds) {
            mapped.insert(
                info.id,
                Arc::new(SharedArena::from_fd(fd, info.size_bytes)?),
            );
        }
        Ok((stream, session, node, mapped))
    }

    /// The connection, unless this process is a fork of the one that connected.
    fn connection(&self) -> Result<&Connection, ClientError> {
        let pid = std::process::id();
        if pid != self.inner.pid {
            return Err(ClientError::Forked {
                parent_pid: self.inner.pid,
                pid,
            });
        }
        Ok(&self.inner.connection)
    }

    /// Closes this client and its clones for calls: every later call fails with
    /// [`ClientError::ClientClosed`], and so does a call waiting on another thread, within
    /// [`WAIT_SLICE`]. Buffers handed out stay valid and are still released when dropped; the
    /// connection itself closes when the last clone and buffer are gone.
    pub fn close(&self) {
        self.inner.connection.close();
    }

    /// Whether this process is the one that connected (not a fork of it).
    pub fn is_owned_by_this_process(&self) -> bool {
        std::process::id() == self.inner.pid
    }

    fn arena(&self, info: &ObjectInfo) -> Result<Arc<SharedArena>, ClientError> {
        self.inner
            .arenas
            .get(&info.region.arena)
            .cloned()
            .ok_or_else(|| ClientError::Protocol(format!("unknown arena in {}", info.region)))
    }

    /// The node this client's daemon is.
    pub fn node(&self) -> NodeId {
        self.inner.node
    }

    /// A new object id for a put on this node: it names the node
    /// ([`crate::owned_object_id`]), so another node's first fetch of it asks this one
    /// directly instead of the directory. Any id works for a put; this one is only faster to
    /// find.
    pub fn new_object_id(&self) -> ObjectId {
        crate::owned_object_id(self.inner.node)
    }

    /// The socket this client is connected to.
    pub fn socket_path(&self) -> &Path {
        &self.inner.socket_path
    }

    /// Creates an object of `data_size` bytes plus `metadata_size` bytes of metadata and returns
    /// a writable view of it in shared memory. Write, then [`ObjectWriter::seal`].
    pub fn create(
        &self,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
    ) -> Result<ObjectWriter, ClientError> {
        let response = self.connection()?.call(Request::Create {
            id,
            data_size,
            metadata_size,
        })?;
        let info = match response {
            Response::Created(result) => result?,
            other => return Err(unexpected(other)),
        };
        // The daemon granted this unsealed object to this create only.
        let region = WritableRegion::new(self.arena(&info)?, info.region.offset, info.region.len)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(ObjectWriter {
            client: self.clone(),
            info,
            region,
            finished: false,
        })
    }

    /// Stores a copy of `data` and `metadata` as a new sealed object. An object of up to
    /// [`MAX_INLINE_PUT_BYTES`] travels in the request itself: created, written and sealed by
    /// the daemon in one round trip. A larger one is created, copied into shared memory and
    /// sealed (two round trips, one copy). It keeps the daemon's `--replicas` copies (one by
    /// default), returning at the local seal; see [`Client::put_replicated`] for a count and a
    /// wait of its own.
    pub fn put(&self, id: ObjectId, data: &[u8], metadata: &[u8]) -> Result<(), ClientError> {
        if data.len() + metadata.len() <= MAX_INLINE_PUT_BYTES {
            return self.call_done(Request::Put {
                id,
                data: data.to_vec(),
                metadata: metadata.to_vec(),
            });
        }
        let mut writer = self.create(id, data.len() as u64, metadata.len() as u64)?;
        // The digest is taken as the bytes are copied, a chunk at a time while it is in cache,
        // so a large put reads its source once.
        let mut hasher = ContentHasher::new();
        copy_hashing(writer.data_mut(), data, &mut hasher);
        copy_hashing(writer.metadata_mut(), metadata, &mut hasher);
        writer.seal_with_digest(hasher.finish())
    }

    /// [`Client::put`] with copies on other nodes: `replicas.copies` in all (0: the daemon's
    /// `--replicas`), on distinct failure domains where there are enough. With
    /// `replicas.wait_ms` the call returns once every copy is sealed, or fails after that long
    /// with [`StoreError::TooFewReplicas`](skyriver_core::StoreError::TooFewReplicas) naming how
    /// many exist (the object is stored either way, and its copies keep being made). A count
    /// above [`MAX_REPLICAS`](crate::MAX_REPLICAS) fails with `StoreError::BadRequest` naming
    /// it. [`Client::put`] gets the daemon's `--replicas`, without a wait.
    pub fn put_replicated(
        &self,
        id: ObjectId,
        data: &[u8],
        metadata: &[u8],
        replicas: ReplicaPolicy,
    ) -> Result<(), ClientError> {
        // A count above the most fails before anything is stored.
        replicas.validate()?;
        if data.len() + metadata.len() <= MAX_INLINE_PUT_BYTES {
            return self.call_done(Request::PutReplicated {
                id,
                data: data.to_vec(),
                metadata: metadata.to_vec(),
                replicas,
            });
        }
        let mut writer = self.create(id, data.len() as u64, metadata.len() as u64)?;
        let mut hasher = ContentHasher::new();
        copy_hashing(writer.data_mut(), data, &mut hasher);
        copy_hashing(writer.metadata_mut(), metadata, &mut hasher);
        writer.seal_replicated_with_digest(hasher.finish(), replicas)
    }

    /// Every live copy of `id` with its node's failure domain, and the copies it wants.
    pub fn locate_copies(&self, id: ObjectId) -> Result<ObjectCopies, ClientError> {
        match self.connection()?.call(Request::LocateCopies { id })? {
            Response::Copies {
                copies,
                wanted,
                sizes,
                records_known,
            } => Ok(ObjectCopies {
                copies,
                wanted,
                sizes,
                records_known,
            }),
            Response::Error(error) => Err(ClientError::Store(error)),
            other => Err(unexpected(other)),
        }
    }

    /// Creates, fills and seals an object in one call: [`Client::put`].
    pub fn create_and_seal(
        &self,
        id: ObjectId,
        data: &[u8],
        metadata: &[u8],
    ) -> Result<(), ClientError> {
        self.put(id, data, metadata)
    }

    /// The timestamps the daemon took since the last call (for `skyriver bench breakdown`),
    /// taking them from now on when `record`. Stamps are in nanoseconds of `CLOCK_MONOTONIC`.
    pub fn trace_stamps(&self, record: bool) -> Result<Vec<TraceStamp>, ClientError> {
        match self.connection()?.call(Request::Trace { record })? {
            Response::Traced(stamps) => Ok(stamps),
            other => Err(unexpected(other)),
        }
    }

    /// Gets objects, waiting up to `timeout` for those not sealed yet (`Some(ZERO)` polls,
    /// `None` waits for ever). One result per id, in order. Any number of ids: more than
    /// [`MAX_IDS_PER_REQUEST`] go in several requests at once, waiting together.
    pub fn get(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
    ) -> Result<Vec<Result<ObjectBuffer, StoreError>>, ClientError> {
        self.get_interruptible(ids, timeout, &mut never)
    }

    /// [`Client::get`] that asks `interrupted` every [`WAIT_SLICE`] of waiting whether to give
    /// up, with [`ClientError::Interrupted`] (the daemon's late reply is then released).
    pub fn get_interruptible(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Result<ObjectBuffer, StoreError>>, ClientError> {
        let timeout_ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let chunks = ids.chunks(MAX_IDS_PER_REQUEST);
        let lens: Vec<usize> = chunks.clone().map(<[ObjectId]>::len).collect();
        let (responses, failure) = self.connection()?.call_all(
            chunks.map(|chunk| Request::Get {
                ids: chunk.to_vec(),
                timeout_ms,
            }),
            interrupted,
        );
        // Build every buffer first so the references of a bad reply are still released.
        let mut buffers = Vec::with_capacity(ids.len());
        let mut failure = failure;
        for (response, len) in responses.into_iter().zip(lens) {
            let results = match response {
                Response::Got(results) if results.len() == len => results,
                other => {
                    let error = unexpected(other);
                    failure.get_or_insert(error);
                    continue;
                }
            };
            for result in results {
                buffers.push(match result {
                    Ok(info) => match self.readable(info) {
                        Ok(buffer) => Ok(buffer),
                        Err(error) => {
                            failure.get_or_insert(error);
                            continue;
                        }
                    },
                    Err(error) => Err(error),
                });
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(buffers),
        }
    }

    /// Gets one object, waiting up to `timeout`.
    pub fn get_one(
        &self,
        id: ObjectId,
        timeout: Option<Duration>,
    ) -> Result<ObjectBuffer, ClientError> {
        let mut results = self.get(&[id], timeout)?;
        Ok(results
            .pop()
            .ok_or_else(|| ClientError::Protocol("empty get reply".into()))??)
    }

    fn readable(&self, info: ObjectInfo) -> Result<ObjectBuffer, ClientError> {
        // A sealed object the daemon took a reference for on our behalf; the buffer releases it
        // only when dropped, after the region.
        let region = ReadableRegion::new(self.arena(&info)?, info.region.offset, info.region.len);
        match region {
            Ok(region) => Ok(ObjectBuffer {
                client: self.clone(),
                info,
                region,
            }),
            Err(error) => {
                // Do not leak the reference the daemon took for us.
                if let Ok(connection) = self.connection() {
                    let _ = connection.release_without_waiting(info.id);
                }
                Err(ClientError::Protocol(error.to_string()))
            }
        }
    }

    /// Gets objects from anywhere in the cluster: each is fetched from a node that holds it
    /// (unless already here), sealed here, and returned like [`Client::get`]. Waits up to
    /// `timeout` (`None`: for ever) for the transfers; an object no live node holds fails at
    /// once with [`FetchError::NotFound`] (see [`Client::fetch_waiting`] to wait for one to be
    /// published). One result per id, in order.
    pub fn fetch(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        self.fetch_with(ids, timeout, TransferMode::Auto, false)
    }

    /// [`Client::fetch`] that also waits, up to `timeout`, for objects nobody holds yet to be
    /// published by some node (through the directory's subscription, never polling).
    pub fn fetch_waiting(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        self.fetch_with(ids, timeout, TransferMode::Auto, true)
    }

    /// [`Client::fetch`] with the transfer path forced (eager or rendezvous) instead of chosen
    /// by the daemon's threshold: for comparing the paths on one cluster. An object already
    /// being fetched for another client keeps that fetch's mode.
    pub fn fetch_in_mode(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
        mode: TransferMode,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        self.fetch_with(ids, timeout, mode, false)
    }

    /// The general form of [`Client::fetch`]: a transfer mode, and whether to wait for objects
    /// nobody holds yet to be published.
    pub fn fetch_with(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
        mode: TransferMode,
        wait_for_publication: bool,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        self.fetch_interruptible(ids, timeout, mode, wait_for_publication, &mut never)
    }

    /// [`Client::fetch_with`] that asks `interrupted` every [`WAIT_SLICE`] of waiting whether
    /// to give up, with [`ClientError::Interrupted`] (the daemon's late reply is then
    /// released). Like [`Client::get`], any number of ids.
    pub fn fetch_interruptible(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
        mode: TransferMode,
        wait_for_publication: bool,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        let options = FetchOptions {
            mode,
            wait_for_publication,
            hint: None,
        };
        self.fetch_with_options(ids, timeout, options, interrupted)
    }

    /// Fetches `ids`, asking `holder` for them first, without a directory lookup: for callers
    /// that know which node produced the objects (an MPI rank, the node a task ran on). An
    /// object `holder` does not have costs one round trip more, then is found through the
    /// directory as by [`Client::fetch`]. Node ids are what [`Client::nodes`] lists.
    pub fn fetch_from(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
        holder: NodeId,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        let options = FetchOptions {
            hint: Some(holder),
            ..FetchOptions::default()
        };
        self.fetch_with_options(ids, timeout, options, &mut never)
    }

    /// The most general fetch: every option, and `interrupted` asked every [`WAIT_SLICE`] of
    /// waiting whether to give up (see [`Client::fetch_interruptible`]).
    pub fn fetch_with_options(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
        options: FetchOptions,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Result<ObjectBuffer, FetchError>>, ClientError> {
        let FetchOptions {
            mode,
            wait_for_publication,
            hint,
        } = options;
        let timeout_ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let chunks = ids.chunks(MAX_IDS_PER_REQUEST);
        let lens: Vec<usize> = chunks.clone().map(<[ObjectId]>::len).collect();
        let (responses, failure) = self.connection()?.call_all(
            chunks.map(|chunk| match hint {
                // Without a hint, the request every daemon version understands.
                None => Request::Fetch {
                    ids: chunk.to_vec(),
                    timeout_ms,
                    mode,
                    wait_for_publication,
                },
                Some(hint) => Request::FetchFrom {
                    ids: chunk.to_vec(),
                    timeout_ms,
                    mode,
                    wait_for_publication,
                    hint,
                },
            }),
            interrupted,
        );
        let mut buffers = Vec::with_capacity(ids.len());
        let mut failure = failure;
        for (response, len) in responses.into_iter().zip(lens) {
            let results = match response {
                Response::Fetched(results) if results.len() == len => results,
                other => {
                    let error = unexpected(other);
                    failure.get_or_insert(error);
                    continue;
                }
            };
            for result in results {
                match result {
                    Ok(info) => match self.readable(info) {
                        Ok(buffer) => buffers.push(Ok(buffer)),
                        Err(error) => {
                            failure.get_or_insert(error);
                        }
                    },
                    Err(error) => buffers.push(Err(error)),
                }
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(buffers),
        }
    }

    /// Fetches one object from anywhere in the cluster.
    pub fn fetch_one(
        &self,
        id: ObjectId,
        timeout: Option<Duration>,
    ) -> Result<ObjectBuffer, ClientError> {
        self.fetch_one_in_mode(id, timeout, TransferMode::Auto)
    }

    /// [`Client::fetch_one`] with the transfer path forced (see [`Client::fetch_in_mode`]).
    pub fn fetch_one_in_mode(
        &self,
        id: ObjectId,
        timeout: Option<Duration>,
        mode: TransferMode,
    ) -> Result<ObjectBuffer, ClientError> {
        let mut results = self.fetch_in_mode(&[id], timeout, mode)?;
        results
            .pop()
            .ok_or_else(|| ClientError::Protocol("empty fetch reply".into()))?
            .map_err(ClientError::Fetch)
    }

    /// The cluster as this daemon sees it.
    pub fn nodes(&self) -> Result<ClusterView, ClientError> {
        match self.connection()?.call(Request::Nodes)? {
            Response::Nodes(view) => Ok(view),
            other => Err(unexpected(other)),
        }
    }

    /// The live nodes holding a sealed copy of `id`, and its (data, metadata) sizes.
    pub fn locate(&self, id: ObjectId) -> Result<ObjectLocation, ClientError> {
        match self.connection()?.call(Request::Locate { id })? {
            Response::Located {
                holders,
                sizes,
                digest,
            } => Ok(ObjectLocation {
                holders,
                sizes,
                digest,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Whether a sealed object with this id is in the store.
    pub fn contains(&self, id: ObjectId) -> Result<bool, ClientError> {
        match self.connection()?.call(Request::Contains { id })? {
            Response::Contains(present) => Ok(present),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes objects; one result per id. An object in use is deleted when released
    /// ([`StoreError::ObjectInUse`]). Like [`Client::get`], any number of ids.
    pub fn delete(&self, ids: &[ObjectId]) -> Result<Vec<Result<(), StoreError>>, ClientError> {
        let (responses, failure) = self.connection()?.call_all(
            ids.chunks(MAX_IDS_PER_REQUEST)
                .map(|chunk| Request::Delete {
                    ids: chunk.to_vec(),
                }),
            &mut never,
        );
        if let Some(error) = failure {
            return Err(error);
        }
        let mut results = Vec::with_capacity(ids.len());
        for response in responses {
            match response {
                Response::Deleted(deleted) => results.extend(deleted),
                other => return Err(unexpected(other)),
            }
        }
        Ok(results)
    }

    /// Every object in the store.
    pub fn list(&self) -> Result<Vec<ObjectSummary>, ClientError> {
        match self.connection()?.call(Request::List)? {
            Response::Listed(objects) => Ok(objects),
            other => Err(unexpected(other)),
        }
    }

    /// Evicts at least `bytes` of objects nobody holds, least recently used first.
    pub fn evict(&self, bytes: u64) -> Result<EvictOutcome, ClientError> {
        match self.connection()?.call(Request::Evict { bytes })? {
            Response::Evicted(outcome) => Ok(outcome),
            other => Err(unexpected(other)),
        }
    }

    /// The store's counters.
    pub fn stats(&self) -> Result<StoreStats, ClientError> {
        match self.connection()?.call(Request::Stats)? {
            Response::Stats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }

    /// Every counter and gauge of the node: store, fetches, transfers, peers.
    pub fn metrics(&self) -> Result<skyriver_core::node::NodeMetrics, ClientError> {
        match self.connection()?.call(Request::Metrics)? {
            Response::Metrics(metrics) => Ok(*metrics),
            other => Err(unexpected(other)),
        }
    }

    /// A stream of seal and delete events, on a connection of its own.
    pub fn subscribe(&self) -> Result<Subscription, ClientError> {
        self.connection()?;
        let (mut stream, mut session, _, _) = Self::open(&self.inner.socket_path)?;
        let mut reader = FrameReader::new(&stream, Duration::ZERO)?;
        let subscribe = session.send(Request::Subscribe, ())?;
        let mut bytes = Vec::new();
        encode_frame(&subscribe, &mut bytes);
        stream.write_all(&bytes)?;
        let frame = reader.read_frame()?;
        session
            .receive(frame)
            .map_err(|violation| ClientError::Protocol(violation.to_string()))?;
        match session.take_reply(subscribe.request) {
            Some(((), Response::Done(result))) => result?,
            Some(((), other)) => return Err(unexpected(other)),
            None => return Err(ClientError::Protocol("no reply to Subscribe".into())),
        }
        Ok(Subscription {
            stream,
            reader,
            session,
            timeout: None,
        })
    }

    /// Waits until the daemon has handled the releases of every buffer dropped so far (they
    /// are sent without a reply) and reports the first that failed since the last flush.
    pub fn flush(&self) -> Result<(), ClientError> {
        self.call_done(Request::Flush)
    }

    fn call_done(&self, body: Request) -> Result<(), ClientError> {
        match self.connection()?.call(body)? {
            Response::Done(result) => Ok(result?),
            other => Err(unexpected(other)),
        }
    }
}

/// A new object being written. Seal it to publish it; dropping it unsealed aborts it.
pub struct ObjectWriter {
    client: Client,
    info: ObjectInfo,
    region: WritableRegion,
    finished: bool,
}

impl ObjectWriter {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.info.id
    }

    /// The data bytes, in shared memory.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let data_size = self.info.data_size as usize;
        &mut self.region.as_mut_slice()[..data_size]
    }

    /// The metadata bytes, in shared memory, after the data.
    pub fn metadata_mut(&mut self) -> &mut [u8] {
        let data_size = self.info.data_size as usize;
        &mut self.region.as_mut_slice()[data_size..]
    }

    /// Seals the object (it becomes immutable and visible) and drops this writer's reference.
    pub fn seal(self) -> Result<(), ClientError> {
        let digest = ContentDigest::of_contiguous(self.region.as_slice());
        self.seal_with_digest(digest)
    }

    /// [`ObjectWriter::seal`] with the digest of the bytes already taken (as they were
    /// written): `digest` must be [`ContentDigest::of_contiguous`] of the data and metadata.
    pub fn seal_with_digest(mut self, digest: ContentDigest) -> Result<(), ClientError> {
        self.finished = true;
        // Writing is over: give up the writable view before the seal makes the object visible,
        // so another thread's `get` of it can view it at once.
        let empty = self.empty_region()?;
        drop(std::mem::replace(&mut self.region, empty));
        self.client.call_done(Request::Seal {
            id: self.info.id,
            release: true,
            digest,
        })
    }

    /// [`ObjectWriter::seal`] with copies on other nodes (see [`Client::put_replicated`]).
    pub fn seal_replicated(self, replicas: ReplicaPolicy) -> Result<(), ClientError> {
        let digest = ContentDigest::of_contiguous(self.region.as_slice());
        self.seal_replicated_with_digest(digest, replicas)
    }

    /// [`ObjectWriter::seal_replicated`] with the digest already taken.
    pub fn seal_replicated_with_digest(
        mut self,
        digest: ContentDigest,
        replicas: ReplicaPolicy,
    ) -> Result<(), ClientError> {
        // Refused before the seal: the writer, dropped unfinished, aborts the object.
        replicas.validate()?;
        self.finished = true;
        let empty = self.empty_region()?;
        drop(std::mem::replace(&mut self.region, empty));
        self.client.call_done(Request::SealReplicated {
            id: self.info.id,
            release: true,
            digest,
            replicas,
        })
    }

    /// A view of nothing, to take the writable view's place once writing is over.
    fn empty_region(&self) -> Result<WritableRegion, ClientError> {
        WritableRegion::new(self.client.arena(&self.info)?, self.info.region.offset, 0)
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Seals the object and keeps this writer's reference as a read-only view of it, released
    /// when the view is dropped (Plasma's `create` buffers work this way).
    pub fn seal_into_buffer(mut self) -> Result<ObjectBuffer, ClientError> {
        self.finished = true;
        // Writing is over: the writable view becomes a read-only one before the seal makes the
        // object visible to other threads' `get`s (an empty view takes its place in the writer,
        // which is consumed here). The buffer keeps this writer's reference and releases it
        // when dropped.
        let empty = self.empty_region()?;
        let region = std::mem::replace(&mut self.region, empty).into_readable();
        let digest = ContentDigest::of_contiguous(region.as_slice());
        self.client.call_done(Request::Seal {
            id: self.info.id,
            release: false,
            digest,
        })?;
        Ok(ObjectBuffer {
            client: self.client.clone(),
            info: self.info,
            region,
        })
    }

    /// Drops the object without sealing it.
    pub fn abort(mut self) -> Result<(), ClientError> {
        self.finished = true;
        self.client.call_done(Request::Abort { id: self.info.id })
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        // In a fork the object belongs to the parent's connection: leave it to the parent.
        if !self.finished && self.client.is_owned_by_this_process() {
            if let Err(error) = self.client.call_done(Request::Abort { id: self.info.id }) {
                tracing::warn!(id = %self.info.id, %error, "abort of an unsealed object failed");
            }
        }
    }
}

/// A sealed object, read in place in shared memory. Dropping it releases the reference.
pub struct ObjectBuffer {
    client: Client,
    info: ObjectInfo,
    region: ReadableRegion,
}

impl ObjectBuffer {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.info.id
    }

    /// The data bytes.
    pub fn data(&self) -> &[u8] {
        &self.region.as_slice()[..self.info.data_size as usize]
    }

    /// The metadata bytes.
    pub fn metadata(&self) -> &[u8] {
        &self.region.as_slice()[self.info.data_size as usize..]
    }

    /// Where the object lives.
    pub fn info(&self) -> &ObjectInfo {
        &self.info
    }
}

impl std::fmt::Debug for ObjectBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBuffer")
            .field("info", &self.info)
            .finish()
    }
}

impl Drop for ObjectBuffer {
    fn drop(&mut self) {
        // In a fork the reference is the parent's, released by the parent's own buffer.
        let Ok(connection) = self.client.connection() else {
            return;
        };
        if let Err(error) = connection.release_without_waiting(self.info.id) {
            tracing::warn!(id = %self.info.id, %error, "release failed");
        }
    }
}

/// Seal and delete events, as they happen.
pub struct Subscription {
    stream: UnixStream,
    reader: FrameReader,
    /// Takes the events, and refuses anything else on the stream.
    session: ClientSession<()>,
    /// How long [`Subscription::next_event`] waits (`None`: for ever).
    timeout: Option<Duration>,
}

impl Subscription {
    /// Waits for the next event, up to the timeout set by [`Subscription::set_timeout`]
    /// (then fails with an [`std::io::ErrorKind::TimedOut`] error).
    pub fn next_event(&mut self) -> Result<ObjectEvent, ClientError> {
        self.next_event_interruptible(&mut never)
    }

    /// [`Subscription::next_event`] that asks `interrupted` every [`WAIT_SLICE`] of waiting
    /// whether to give up, with [`ClientError::Interrupted`] (no event is lost).
    pub fn next_event_interruptible(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<ObjectEvent, ClientError> {
        let deadline = self.timeout.map(|timeout| Instant::now() + timeout);
        loop {
            let slice = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    left.min(WAIT_SLICE)
                }
                None => WAIT_SLICE,
            };
            if self.reader.wait_for_bytes(slice)? {
                break;
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no event before the timeout",
                )
                .into());
            }
            if interrupted() {
                return Err(ClientError::Interrupted);
            }
        }
        let frame = self.reader.read_frame()?;
        self.session
            .receive(frame)
            .map_err(|violation| ClientError::Protocol(violation.to_string()))?;
        self.session
            .poll_event()
            .ok_or_else(|| ClientError::Protocol("a frame without an event".into()))
    }

    /// Sets how long [`Subscription::next_event`] waits (`None`: for ever).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.timeout = timeout;
        Ok(())
    }

    /// A handle that ends this subscription from another thread, even while
    /// [`Subscription::next_event`] waits.
    pub fn closer(&self) -> Result<SubscriptionCloser, ClientError> {
        Ok(SubscriptionCloser(self.stream.try_clone()?))
    }
}

/// Ends a [`Subscription`]: its waiting and later `next_event` calls return
/// [`ClientError::Closed`].
pub struct SubscriptionCloser(UnixStream);

impl SubscriptionCloser {
    /// Shuts the subscription's connection down.
    pub fn close(&self) {
        // Already shut down or closed by the daemon: nothing left to do either way.
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

impl Iterator for Subscription {
    type Item = Result<ObjectEvent, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_event() {
            Err(ClientError::Closed) => None,
            other => Some(other),
        }
    }
}

/// Copies `source` into `destination` (of the same length) and feeds it to `hasher`, a chunk at
/// a time so each chunk is hashed while it is still in cache.
fn copy_hashing(destination: &mut [u8], source: &[u8], hasher: &mut ContentHasher) {
    const CHUNK_BYTES: usize = 256 << 10;
    for (to, from) in destination
        .chunks_mut(CHUNK_BYTES)
        .zip(source.chunks(CHUNK_BYTES))
    {
        to.copy_from_slice(from);
        hasher.update(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::RequestId;

    #[test]
    fn a_request_over_the_daemons_limit_is_refused_before_it_is_written() {
        let (stream, mut peer) = UnixStream::pair().unwrap();
        let mut writer = FrameWriter {
            stream,
            write_buf: Vec::new(),
        };
        // 250,000 ids encode to about 5 MB, over the 4 MiB the daemon reads.
        let ids = vec![ObjectId([7; 20]); 250_000];
        match writer.encode(&RequestFrame {
            request: RequestId(2),
            body: Request::Delete { ids },
        }) {
            Err(ClientError::Store(StoreError::BadRequest(message))) => {
                assert!(message.contains("fewer ids"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // Nothing reached the socket; a request that fits goes through.
        writer
            .encode(&RequestFrame {
                request: RequestId(3),
                body: Request::Delete {
                    ids: vec![ObjectId([7; 20])],
                },
            })
            .unwrap();
        writer.write().unwrap();
        drop(writer);
        let mut written = Vec::new();
        peer.read_to_end(&mut written).unwrap();
        let len = decode_frame_len(written[..4].try_into().unwrap(), MAX_REQUEST_BYTES).unwrap();
        assert_eq!(written.len(), FRAME_HEADER_BYTES + len);
    }
}
