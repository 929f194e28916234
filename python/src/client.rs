//! `skyriver.Client`: the Rust client, with every blocking call made without the GIL.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use skyriver_client::{Client, ClientError, ObjectEvent, ObjectId, StoreError};
use skyriver_core::client_protocol::MAX_INLINE_PUT_BYTES;
use skyriver_core::digest::ContentHasher;
use skyriver_transport::shared_copy::SharedBytes;

use crate::buffers::{Part, PendingWriters, PyMutableBuffer, PyReadBuffer, WriterSlot};
use crate::errors::{self, ClientClosed};
use crate::ids::{object_id, object_ids, PyObjectId};

/// The socket clients use when not told: `$SKYRIVER_SOCKET`, else `/tmp/skyriver-<uid>/skyriver.sock`.
#[pyfunction]
pub fn default_socket() -> PathBuf {
    skyriver_client::default_socket_path()
}

/// A timeout in seconds (`None`: wait for ever, `0`: poll).
fn timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "timeout must be None (wait for ever) or seconds >= 0, got {s}"
        ))),
    }
}

fn size(name: &str, value: i64) -> PyResult<u64> {
    u64::try_from(value)
        .map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {value}")))
}

/// A contiguous bytes-like object's memory, held exported while it is copied. Its owner (any
/// Python thread) may write it meanwhile, so it is only ever copied out, never viewed.
type Source = SharedBytes<PyUntypedBuffer>;

/// Exports `value`'s bytes for copying (without the GIL).
fn source(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Source> {
    let export = PyUntypedBuffer::get(value).map_err(|e| {
        PyBufferError::new_err(format!(
            "{what} must support the buffer protocol (bytes, bytearray, memoryview, numpy \
             array, pyarrow buffer): {e}"
        ))
    })?;
    if !export.is_c_contiguous() {
        return Err(PyBufferError::new_err(format!(
            "{what} must be C-contiguous (numpy.ascontiguousarray makes a copy that is)"
        )));
    }
    let (start, len) = (
        export.buf_ptr().cast::<u8>().cast_const(),
        export.len_bytes(),
    );
    // The buffer protocol's consumer glue, the one unsafe block of the binding outside
    // `__getbuffer__`/`__releasebuffer__`. It stays here: the copy runs without the GIL, and
    // PyO3's safe readers of an export (`PyBuffer::as_slice`, `copy_to_slice`) need it held;
    // and `skyriver-transport` cannot take the export itself without depending on PyO3, which
    // would link libpython into every program that uses the transport.
    // SAFETY: the consumer's half of the buffer protocol: an export's `len` contiguous bytes
    // at `buf` stay valid until the export is released, and the `SharedBytes` holds the
    // export until it is dropped. It copies them out by raw pointers only, since the
    // exporter's other users may write them.
    Ok(unsafe { SharedBytes::new(export, start, len) })
}

/// Copies `source` into `destination` (of the same length), a chunk at a time, feeding each
/// copied chunk to `hasher` while it is in cache: the digest is of what the object holds.
fn copy_hashing(destination: &mut [u8], source: &Source, hasher: &mut ContentHasher) {
    const CHUNK_BYTES: usize = 256 << 10;
    for (index, chunk) in destination.chunks_mut(CHUNK_BYTES).enumerate() {
        source.copy_to(index * CHUNK_BYTES, chunk);
        hasher.update(chunk);
    }
}

/// Runs `work` without the GIL, giving it an interrupt check that runs Python's signal
/// handlers: the exception one raises (`KeyboardInterrupt` for Ctrl-C) ends the wait and is
/// raised here.
fn interruptible<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&mut dyn FnMut() -> bool) -> Result<T, ClientError> + Send,
) -> PyResult<T> {
    detach_interruptible(py, work).unwrap_or_else(|error| Err(errors::client_error(py, error)))
}

/// [`interruptible`] that hands back the client's errors other than the interruption.
fn detach_interruptible<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&mut dyn FnMut() -> bool) -> Result<T, ClientError> + Send,
) -> Result<PyResult<T>, ClientError> {
    let mut raised: Option<PyErr> = None;
    let result = py.detach(|| {
        // While the interpreter shuts down (a daemon thread still waiting) there is nothing to
        // check: the wait goes on.
        let mut check = || {
            Python::try_attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(error) => {
                    raised = Some(error);
                    true
                }
            })
            .unwrap_or(false)
        };
        work(&mut check)
    });
    match (result, raised) {
        (Ok(value), _) => Ok(Ok(value)),
        (Err(ClientError::Interrupted), Some(raised)) => Ok(Err(raised)),
        (Err(error), _) => Err(error),
    }
}

/// A connection to the local Skyriver daemon.
///
/// `Client(socket=None)` connects (the default socket is the CLI's: `$SKYRIVER_SOCKET`, else
/// `/tmp/skyriver-<uid>/skyriver.sock`). Safe to share between threads; every blocking call releases
/// the GIL. Use as a context manager, or call `close()`. Buffers outlive the client.
#[pyclass(subclass, frozen, name = "Client", module = "skyriver")]
pub struct PyClient {
    client: RwLock<Option<Client>>,
    socket: PathBuf,
    pending: PendingWriters,
}

impl PyClient {
    fn client(&self) -> PyResult<Client> {
        self.client
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .ok_or_else(|| ClientClosed::new_err("the client is closed; connect again"))
    }

    fn call<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&Client) -> Result<T, ClientError> + Send,
    ) -> PyResult<T> {
        let client = self.client()?;
        py.detach(|| work(&client))
            .map_err(|e| errors::client_error(py, e))
    }

    /// [`PyClient::call`] for a call that may wait long: the wait looks every
    /// [`skyriver_client::client::WAIT_SLICE`] at Python's signals, so Ctrl-C raises
    /// `KeyboardInterrupt` promptly (the call is abandoned, its late reply released).
    fn call_interruptible<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&Client, &mut dyn FnMut() -> bool) -> Result<T, ClientError> + Send,
    ) -> PyResult<T> {
        let client = self.client()?;
        interruptible(py, |interrupted| work(&client, interrupted))
    }

    fn buffer(py: Python<'_>, object: skyriver_client::ObjectBuffer) -> PyResult<Py<PyReadBuffer>> {
        Py::new(py, PyReadBuffer::new(Arc::new(object), Part::Data))
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (socket=None))]
    fn new(py: Python<'_>, socket: Option<PathBuf>) -> PyResult<Self> {
        let socket = socket.unwrap_or_else(skyriver_client::default_socket_path);
        let client = py
            .detach(|| Client::connect(&socket))
            .map_err(|e| errors::client_error(py, e))?;
        Ok(Self {
            client: RwLock::new(Some(client)),
            socket,
            pending: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The daemon's socket.
    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    /// The node id of this client's daemon.
    #[getter]
    fn node(&self) -> PyResult<u32> {
        Ok(self.client()?.node().0)
    }

    /// A new object id that names this client's node, so another node's first fetch of it
    /// asks this node directly, without a directory lookup (`ObjectID.from_random()` ids are
    /// found through the directory). Any id works for a put; this one is only faster to find.
    fn new_id(&self) -> PyResult<PyObjectId> {
        Ok(PyObjectId(self.client()?.new_object_id()))
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.client
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_none()
    }

    /// Connects again to the same socket: needed in a child after `fork()`.
    fn reconnect(&self, py: Python<'_>) -> PyResult<()> {
        let client = py
            .detach(|| Client::connect(&self.socket))
            .map_err(|e| errors::client_error(py, e))?;
        let old = self
            .client
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(client);
        // Unsealed objects of the old connection are the old connection's (or, after a fork,
        // the parent's): forget them here.
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        py.detach(|| drop((old, pending)));
        Ok(())
    }

    /// Closes the connection once no buffer uses it. Unsealed objects are aborted; buffers
    /// already handed out stay valid until they go. A call waiting on another thread (a
    /// `get`) raises `ClientClosed` at once.
    fn close(&self, py: Python<'_>) {
        let old = self
            .client
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        py.detach(|| {
            // The aborts of unsealed objects go out before the client closes for calls.
            drop(pending);
            if let Some(client) = &old {
                client.close();
            }
            drop(old);
        });
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " (closed)" } else { "" };
        format!("<skyriver.Client {}{state}>", self.socket.display())
    }

    /// Creates an object of `size` data bytes (and `metadata`, stored after them) and returns
    /// a writable `MutableBuffer` over its data in shared memory. Write, then `seal(id)`.
    #[pyo3(signature = (id, size, metadata=None))]
    fn create(
        &self,
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        size: i64,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyMutableBuffer> {
        let id = object_id(id)?;
        let data_size = self::size("size", size)?;
        let metadata = metadata.map(|m| source(m, "metadata")).transpose()?;
        let writer = self.call(py, |client| {
            let meta_len = metadata.as_ref().map_or(0, Source::len);
            let mut writer = client.create(id, data_size, meta_len as u64)?;
            if let Some(metadata) = &metadata {
                metadata.copy_to(0, writer.metadata_mut());
            }
            Ok(writer)
        })?;
        drop(metadata);
        let slot = WriterSlot::new(writer);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, slot.clone());
        Ok(PyMutableBuffer::new(slot, self.pending.clone()))
    }

    /// Seals an object this client created: it becomes immutable and visible to every
    /// client. Its `MutableBuffer` turns read-only and keeps a reference until it goes.
    ///
    /// `replicas` and `wait_replicas` (with `replicas_timeout`) ask for copies on other nodes
    /// as `put` does; the buffer is then released at the seal (the copy of record stays
    /// pinned in the store; `get` it to read it), and with `wait_replicas=True` the call
    /// returns once every copy is sealed or raises `TooFewReplicas` naming how many exist.
    /// Views of the buffer must be gone first (`BufferError` otherwise).
    #[pyo3(signature = (id, replicas=None, wait_replicas=false, replicas_timeout=60.0))]
    fn seal(
        &self,
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        replicas: Option<u8>,
        wait_replicas: bool,
        replicas_timeout: f64,
    ) -> PyResult<()> {
        let id = object_id(id)?;
        let policy = replica_policy(replicas, wait_replicas, replicas_timeout)?;
        let slot = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        match (slot, policy) {
            (Some(slot), Some(policy)) => slot.seal_replicated(py, policy),
            (Some(slot), None) => slot.seal(py),
            (None, _) => Err(self.not_pending(py, id)),
        }
    }

    /// Drops an unsealed object this client created. Raises `BufferError` while views of its
    /// buffer are alive.
    fn abort(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = object_id(id)?;
        let slot = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        let Some(slot) = slot else {
            return Err(self.not_pending(py, id));
        };
        slot.abort(py)?;
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        Ok(())
    }

    /// Stores a copy of `data` (bytes, bytearray, memoryview, a C-contiguous numpy array,
    /// a pyarrow buffer: anything with the buffer protocol) as a new sealed object and
    /// returns its id (unless given, a new one that names this node: `new_id()`). The copy
    /// runs without the GIL. Up to 64 KiB
    /// (data and metadata) takes one round trip to the daemon.
    ///
    /// `replicas=k` keeps `k` copies on distinct nodes (failure domains first; `None`: the
    /// daemon's `--replicas`); with `wait_replicas=True` the call returns once every copy is
    /// sealed, or raises `TooFewReplicas` after `replicas_timeout` seconds, naming how many
    /// exist (the object is stored either way).
    #[pyo3(signature = (data, id=None, metadata=None, replicas=None, wait_replicas=false, replicas_timeout=60.0))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        id: Option<&Bound<'_, PyAny>>,
        metadata: Option<&Bound<'_, PyAny>>,
        replicas: Option<u8>,
        wait_replicas: bool,
        replicas_timeout: f64,
    ) -> PyResult<PyObjectId> {
        let policy = replica_policy(replicas, wait_replicas, replicas_timeout)?;
        let replicated = policy.is_some();
        let policy = policy.unwrap_or_default();
        let id = match id {
            Some(id) => object_id(id)?,
            None => self.client()?.new_object_id(),
        };
        let data = source(data, "data")?;
        let metadata = metadata.map(|m| source(m, "metadata")).transpose()?;
        self.call(py, |client| {
            let meta_len = metadata.as_ref().map_or(0, Source::len);
            // Small objects go inline, in one round trip (copied out first); larger ones are
            // created and copied into shared memory, hashed as they are copied, and sealed.
            if data.len() + meta_len <= MAX_INLINE_PUT_BYTES {
                let meta = metadata.as_ref().map(Source::to_vec).unwrap_or_default();
                if replicated {
                    return client.put_replicated(id, &data.to_vec(), &meta, policy);
                }
                return client.put(id, &data.to_vec(), &meta);
            }
            let mut writer = client.create(id, data.len() as u64, meta_len as u64)?;
            let mut hasher = ContentHasher::new();
            copy_hashing(writer.data_mut(), &data, &mut hasher);
            if let Some(metadata) = &metadata {
                copy_hashing(writer.metadata_mut(), metadata, &mut hasher);
            }
            if replicated {
                return writer.seal_replicated_with_digest(hasher.finish(), policy);
            }
            writer.seal_with_digest(hasher.finish())
        })?;
        drop((data, metadata));
        Ok(PyObjectId(id))
    }

    /// Gets sealed objects as read-only zero-copy `Buffer`s, waiting up to `timeout` seconds
    /// for those not sealed yet (`None`: for ever; `0`: poll). One id gives one buffer (or
    /// raises `Timeout`); a list gives a list with `None` where an object was not available.
    /// Ctrl-C interrupts the wait (`KeyboardInterrupt`), and `close()` on another thread ends
    /// it (`ClientClosed`).
    #[pyo3(signature = (ids, timeout=None))]
    fn get(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let (ids, single) = object_ids(ids)?;
        let wait = self::timeout(timeout)?;
        let results = self.call_interruptible(py, |client, interrupted| {
            client.get_interruptible(&ids, wait, interrupted)
        })?;
        if single {
            let result = results.into_iter().next().ok_or_else(|| {
                errors::ProtocolError::new_err("the daemon answered no result for one id")
            })?;
            return match result {
                Ok(object) => Ok(Self::buffer(py, object)?.into_any()),
                Err(error) => Err(errors::store_error(py, error)),
            };
        }
        let list = PyList::empty(py);
        for result in results {
            match result {
                Ok(object) => list.append(Self::buffer(py, object)?)?,
                Err(error) if errors::is_unavailable(&error) => list.append(py.None())?,
                Err(error) => return Err(errors::store_error(py, error)),
            }
        }
        Ok(list.into_any().unbind())
    }

    /// Gets objects from anywhere in the cluster: each is fetched from a node that holds it
    /// (unless already here) and returned like `get`. Waits up to `timeout` seconds for the
    /// transfers; `timeout=0` polls: what live nodes hold is still fetched, however long the
    /// transfer takes. An object no live node holds fails at once unless `wait=True`: then the
    /// fetch waits, up to `timeout`, for a node to publish it. `hint`: the node (as `nodes()`
    /// numbers it) believed to hold the objects, e.g. their producer's: asked first, without a
    /// directory lookup; if it does not hold one, that one is found through the directory.
    #[pyo3(signature = (ids, timeout=None, wait=false, hint=None))]
    fn fetch(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        wait: bool,
        hint: Option<u32>,
    ) -> PyResult<Py<PyAny>> {
        let (ids, single) = object_ids(ids)?;
        let deadline = self::timeout(timeout)?;
        let options = skyriver_client::FetchOptions {
            mode: skyriver_client::TransferMode::Auto,
            wait_for_publication: wait,
            hint: hint.map(skyriver_client::NodeId),
        };
        let results = self.call_interruptible(py, |client, interrupted| {
            client.fetch_with_options(&ids, deadline, options, interrupted)
        })?;
        if single {
            let result = results.into_iter().next().ok_or_else(|| {
                errors::ProtocolError::new_err("the daemon answered no result for one id")
            })?;
            return match result {
                Ok(object) => Ok(Self::buffer(py, object)?.into_any()),
                Err(error) => Err(errors::fetch_error(py, error)),
            };
        }
        let list = PyList::empty(py);
        for result in results {
            match result {
                Ok(object) => list.append(Self::buffer(py, object)?)?,
                Err(
                    skyriver_client::FetchError::NotFound { .. }
                    | skyriver_client::FetchError::Timeout { .. },
                ) => list.append(py.None())?,
                Err(error) => return Err(errors::fetch_error(py, error)),
            }
        }
        Ok(list.into_any().unbind())
    }

    /// Whether a sealed object with this id is in the local store.
    fn contains(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = object_id(id)?;
        self.call(py, |client| client.contains(id))
    }

    /// Deletes objects. One id: raises `ObjectNotFound`, or `ObjectInUse` when a client holds
    /// it (it is then deleted at the last release). A list: a list with `None` per deleted
    /// object and the exception (not raised) for the others.
    fn delete(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let (ids, single) = object_ids(ids)?;
        let results = self.call(py, |client| client.delete(&ids))?;
        if single {
            return match results.into_iter().next() {
                Some(Err(error)) => Err(errors::store_error(py, error)),
                _ => Ok(py.None()),
            };
        }
        let list = PyList::empty(py);
        for result in results {
            match result {
                Ok(()) => list.append(py.None())?,
                Err(error) => list.append(errors::store_error(py, error).into_value(py))?,
            }
        }
        Ok(list.into_any().unbind())
    }

    /// Every object in the store: a list of dicts with `id`, `data_size`, `metadata_size`,
    /// `sealed`, `ref_count` (references held by clients), `pin_count` (transfers reading
    /// it), `delete_pending` and `created_ms` (on the daemon's clock).
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let objects = self.call(py, |client| client.list())?;
        let list = PyList::empty(py);
        for object in objects {
            let entry = PyDict::new(py);
            entry.set_item("id", PyObjectId(object.info.id))?;
            entry.set_item("data_size", object.info.data_size)?;
            entry.set_item("metadata_size", object.info.metadata_size)?;
            entry.set_item("sealed", object.sealed)?;
            entry.set_item("ref_count", object.ref_count)?;
            entry.set_item("pin_count", object.pin_count)?;
            entry.set_item("delete_pending", object.delete_pending)?;
            entry.set_item("created_ms", object.created_at.as_nanos() / 1_000_000)?;
            list.append(entry)?;
        }
        Ok(list)
    }

    /// Evicts at least `bytes` of objects nobody holds, least recently used first; returns
    /// `{"objects": n, "bytes": freed}`.
    fn evict<'py>(&self, py: Python<'py>, bytes: i64) -> PyResult<Bound<'py, PyDict>> {
        let bytes = size("bytes", bytes)?;
        let outcome = self.call(py, |client| client.evict(bytes))?;
        let result = PyDict::new(py);
        result.set_item("objects", outcome.objects)?;
        result.set_item("bytes", outcome.bytes)?;
        Ok(result)
    }

    /// The store's counters, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.call(py, |client| client.stats())?;
        let result = PyDict::new(py);
        result.set_item("capacity_bytes", stats.capacity_bytes)?;
        result.set_item("allocated_bytes", stats.allocated_bytes)?;
        result.set_item("object_count", stats.object_count)?;
        result.set_item("sealed_count", stats.sealed_count)?;
        result.set_item("evictable_bytes", stats.evictable_bytes)?;
        result.set_item("client_count", stats.client_count)?;
        result.set_item("waiting_gets", stats.waiting_gets)?;
        result.set_item("evicted_objects_total", stats.evicted_objects_total)?;
        result.set_item("evicted_bytes_total", stats.evicted_bytes_total)?;
        result.set_item("sealed_objects_total", stats.sealed_objects_total)?;
        let spill = &stats.spill;
        result.set_item("spill_limit_bytes", spill.limit_bytes)?;
        result.set_item("spilled_objects", spill.spilled_objects)?;
        result.set_item("spilled_bytes", spill.spilled_bytes)?;
        result.set_item("spills_total", spill.spills_total)?;
        result.set_item("restores_total", spill.restores_total)?;
        result.set_item("spilled_objects_lost_total", spill.objects_lost_total)?;
        Ok(result)
    }

    /// The cluster as this daemon sees it, as a dict.
    fn nodes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let view = self.call(py, |client| client.nodes())?;
        let result = PyDict::new(py);
        result.set_item("node", view.node.0)?;
        result.set_item("fabric", view.fabric)?;
        result.set_item("directory", view.directory)?;
        result.set_item("directory_healthy", view.directory_healthy)?;
        result.set_item("eager_capacity_bytes", view.eager_capacity_bytes)?;
        let members = PyList::empty(py);
        for member in view.members {
            let entry = PyDict::new(py);
            entry.set_item("node", member.node.0)?;
            entry.set_item("address", member.address)?;
            entry.set_item("fabric", member.fabric)?;
            entry.set_item("connected", member.connected)?;
            entry.set_item("eager_threshold_bytes", member.eager_threshold_bytes)?;
            entry.set_item("link", member.link)?;
            entry.set_item("failure_domain", member.failure_domain)?;
            members.append(entry)?;
        }
        result.set_item("members", members)?;
        Ok(result)
    }

    /// Where an object lives: `{"holders": [node ids], "sizes": (data, metadata) or None,
    /// "digest": the content digest (16 hex characters) or None}`.
    fn locate<'py>(&self, py: Python<'py>, id: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let id = object_id(id)?;
        let location = self.call(py, |client| client.locate(id))?;
        let result = PyDict::new(py);
        let holders: Vec<u32> = location.holders.iter().map(|node| node.0).collect();
        result.set_item("holders", holders)?;
        result.set_item("sizes", location.sizes)?;
        result.set_item("digest", location.digest.map(|d| d.to_string()))?;
        Ok(result)
    }

    /// Every live copy of an object, from the directory: `{"copies": [{"node": id,
    /// "failure_domain": str, "of_record": bool}], "wanted": the copies the object wants or
    /// None, "sizes": (data, metadata) or None, "records_known": whether the directory keeps
    /// copies of record (the built-in one does; Redis does not, and every copy is then a plain
    /// one)}`.
    fn locate_copies<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let id = object_id(id)?;
        let located = self.call(py, |client| client.locate_copies(id))?;
        let result = PyDict::new(py);
        let copies = PyList::empty(py);
        for copy in located.copies {
            let entry = PyDict::new(py);
            entry.set_item("node", copy.node.0)?;
            entry.set_item("failure_domain", copy.failure_domain)?;
            entry.set_item("of_record", copy.of_record)?;
            copies.append(entry)?;
        }
        result.set_item("copies", copies)?;
        result.set_item("wanted", located.wanted)?;
        result.set_item("sizes", located.sizes)?;
        result.set_item("records_known", located.records_known)?;
        Ok(result)
    }

    /// A `Subscription`: an iterator of seal and delete events, on a connection of its own.
    fn subscribe(&self, py: Python<'_>) -> PyResult<PySubscription> {
        let subscription = self.call(py, |client| client.subscribe())?;
        let closer = subscription
            .closer()
            .map_err(|e| errors::client_error(py, e))?;
        Ok(PySubscription {
            subscription: Mutex::new(Some(subscription)),
            closer,
        })
    }

    /// Waits until the daemon has handled every release sent by buffers that went (they get no
    /// reply) and raises the first that failed since the last flush.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, |client| client.flush())
    }
}

impl PyClient {
    /// The error for sealing or aborting an id this client has no unsealed object for.
    fn not_pending(&self, py: Python<'_>, id: ObjectId) -> PyErr {
        match self.call(py, |client| client.contains(id)) {
            Ok(true) => errors::store_error(py, StoreError::AlreadySealed(id)),
            Ok(false) => errors::ObjectNotFound::new_err(format!(
                "object {id} was not created by this client, or was sealed or aborted already"
            )),
            Err(error) => error,
        }
    }
}

/// A seal or delete event.
#[pyclass(frozen, get_all, name = "Event", module = "skyriver")]
pub struct PyEvent {
    /// `"sealed"` or `"deleted"`.
    kind: &'static str,
    /// The object.
    id: PyObjectId,
    /// Data bytes (0 for deletions).
    data_size: u64,
    /// Metadata bytes (0 for deletions).
    metadata_size: u64,
}

#[pymethods]
impl PyEvent {
    fn __repr__(&self) -> String {
        format!(
            "Event(kind={:?}, id={}, data_size={}, metadata_size={})",
            self.kind, self.id.0, self.data_size, self.metadata_size
        )
    }
}

impl From<ObjectEvent> for PyEvent {
    fn from(event: ObjectEvent) -> Self {
        match event {
            ObjectEvent::Sealed {
                id,
                data_size,
                metadata_size,
            } => Self {
                kind: "sealed",
                id: PyObjectId(id),
                data_size,
                metadata_size,
            },
            ObjectEvent::Deleted { id } => Self {
                kind: "deleted",
                id: PyObjectId(id),
                data_size: 0,
                metadata_size: 0,
            },
        }
    }
}

/// Seal and delete events as they happen: iterate (blocks without the GIL), or call
/// `next_event(timeout)`.
#[pyclass(frozen, name = "Subscription", module = "skyriver")]
pub struct PySubscription {
    subscription: Mutex<Option<skyriver_client::Subscription>>,
    /// Ends a `next_event` that waits on another thread (which holds `subscription`).
    closer: skyriver_client::SubscriptionCloser,
}

#[pymethods]
impl PySubscription {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<PyEvent> {
        match self.next_event(py, None)? {
            Some(event) => Ok(event),
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// The next event, waiting up to `timeout` seconds (`None`: for ever); `None` when the
    /// time passed, or the subscription or daemon closed.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyEvent>> {
        let wait = self::timeout(timeout)?;
        let mut guard = self
            .subscription
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(subscription) = guard.as_mut() else {
            return Ok(None);
        };
        let result = detach_interruptible(py, |interrupted| {
            subscription.set_timeout(wait)?;
            subscription.next_event_interruptible(interrupted)
        });
        // Ctrl-C (or another signal handler's exception) is raised as it is.
        let result = match result {
            Ok(Err(raised)) => return Err(raised),
            Ok(Ok(event)) => Ok(event),
            Err(error) => Err(error),
        };
        match result {
            Ok(event) => Ok(Some(event.into())),
            Err(ClientError::Closed) => {
                *guard = None;
                Ok(None)
            }
            Err(ClientError::Io(error))
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(error) => Err(errors::client_error(py, error)),
        }
    }

    /// Closes the subscription's connection; a `next_event` waiting on another thread
    /// returns `None`.
    fn close(&self) {
        self.closer.close();
    }
}

/// The replica options of `put` and `seal`: `None` when they ask for nothing (no count and no
/// wait: a plain put or seal, which every daemon understands).
pub(crate) fn replica_policy(
    replicas: Option<u8>,
    wait_replicas: bool,
    replicas_timeout: f64,
) -> PyResult<Option<skyriver_client::ReplicaPolicy>> {
    if !(replicas_timeout.is_finite() && replicas_timeout >= 0.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "replicas_timeout must be a non-negative number of seconds",
        ));
    }
    let most = skyriver_client::MAX_REPLICAS;
    if let Some(copies) = replicas.filter(|&copies| copies > most) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "replicas={copies}: the most is {most}"
        )));
    }
    let policy = skyriver_client::ReplicaPolicy {
        copies: replicas.unwrap_or(0),
        wait_ms: wait_replicas.then_some((replicas_timeout * 1000.0) as u64),
    };
    Ok((policy != skyriver_client::ReplicaPolicy::default()).then_some(policy))
}
