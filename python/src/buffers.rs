//! Zero-copy buffers over objects in shared memory, exported through the buffer protocol.
//!
//! A `Buffer` holds a reference to a sealed object (the Rust `ObjectBuffer`); every
//! `memoryview`, numpy array or pyarrow buffer made from it holds the `Buffer` through its
//! export, so the object stays referenced while any view lives and is released when the last
//! one goes. `release()` releases it at once, and refuses while views still use it, so no
//! view can ever point at memory the store has handed to another object.
//!
//! A `MutableBuffer` is an object being written (from `create`): writable until sealed, then
//! read-only, keeping the creator's reference until it goes (as Plasma's create buffers did).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use skyriver_client::{ObjectBuffer, ObjectId, ObjectWriter};

use crate::errors;
use crate::ids::PyObjectId;

/// Fills a buffer-protocol view of `len` bytes at `buf`, owned by `owner`.
///
/// # Safety
///
/// `view` must point to a `Py_buffer` the interpreter asked this object to fill, and the
/// `len` bytes at `buf` must stay valid (and, when `readonly` is false, writable) until the
/// matching `__releasebuffer__`; `owner` is kept alive by the view until then.
unsafe fn fill_view(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    buf: *mut u8,
    len: usize,
    readonly: bool,
    owner: Bound<'_, PyAny>,
) {
    // SAFETY: the caller passes a valid view to fill (see above); every field is written
    // before the interpreter reads any. `shape` and `strides` point into the view itself, as
    // CPython's own `PyBuffer_FillInfo` does; "B" is a static string nobody writes to.
    unsafe {
        (*view).obj = owner.into_ptr();
        (*view).buf = buf.cast::<c_void>();
        (*view).len = len as ffi::Py_ssize_t;
        (*view).readonly = c_int::from(readonly);
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
            c"B".as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            &mut (*view).len
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            &mut (*view).itemsize
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded state is updated in single steps that do not panic halfway.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn released(id: ObjectId) -> PyErr {
    PyValueError::new_err(format!(
        "the buffer of object {id} was released; get the object again"
    ))
}

fn views_alive(id: ObjectId, views: usize) -> PyErr {
    PyBufferError::new_err(format!(
        "{views} view(s) of object {id} (memoryview, numpy array, pyarrow buffer, ...) still use \
         this buffer: drop them first, or let the buffer go with them"
    ))
}

/// Which bytes of an object a buffer shows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Data,
    Metadata,
}

fn part_of(object: &ObjectBuffer, part: Part) -> &[u8] {
    match part {
        Part::Data => object.data(),
        Part::Metadata => object.metadata(),
    }
}

struct ReadState {
    /// The reference to the object; `None` once released.
    object: Option<Arc<ObjectBuffer>>,
    /// Buffer-protocol views exported and not yet released.
    exports: usize,
}

/// A read-only, zero-copy view of a sealed object's bytes in shared memory.
///
/// Supports the buffer protocol: `memoryview(buf)`, `numpy.frombuffer(buf, dtype)` and
/// `pyarrow.py_buffer(buf)` share the object's memory. The object stays referenced while
/// this buffer or any view made from it lives; `release()` (or leaving a `with` block)
/// releases it at once, and fails while views are still alive.
#[pyclass(frozen, name = "Buffer", module = "skyriver")]
pub struct PyReadBuffer {
    id: ObjectId,
    part: Part,
    state: Mutex<ReadState>,
}

impl PyReadBuffer {
    pub fn new(object: Arc<ObjectBuffer>, part: Part) -> Self {
        Self {
            id: object.id(),
            part,
            state: Mutex::new(ReadState {
                object: Some(object),
                exports: 0,
            }),
        }
    }

    fn object(&self) -> PyResult<Arc<ObjectBuffer>> {
        lock(&self.state)
            .object
            .clone()
            .ok_or_else(|| released(self.id))
    }
}

#[pymethods]
impl PyReadBuffer {
    /// # Safety
    ///
    /// Called by the interpreter with a view to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(format!(
                "object {} is sealed: its buffer is read-only",
                this.id
            )));
        }
        let mut state = lock(&this.state);
        let Some(object) = state.object.as_ref() else {
            return Err(released(this.id));
        };
        let bytes = part_of(object, this.part);
        let (buf, len) = (bytes.as_ptr().cast_mut(), bytes.len());
        state.exports += 1;
        drop(state);
        // SAFETY: the bytes lie in the client's mapping of the arena, which the
        // `ObjectBuffer` keeps mapped; the view holds this object, and `release()` refuses
        // while exports are counted, so the reference (and the bytes) outlive the view. A
        // sealed object never changes, hence read-only.
        unsafe { fill_view(view, flags, buf, len, true, slf.into_any()) };
        Ok(())
    }

    /// # Safety
    ///
    /// Called by the interpreter once per view this object filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut state = lock(&self.state);
        state.exports = state.exports.saturating_sub(1);
    }

    /// The object's id.
    #[getter]
    fn id(&self) -> PyObjectId {
        PyObjectId(self.id)
    }

    /// Bytes in this buffer.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(part_of(&*self.object()?, self.part).len())
    }

    fn __len__(&self) -> PyResult<usize> {
        self.size()
    }

    /// The object's metadata, copied into `bytes`.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, self.object()?.metadata()))
    }

    /// A zero-copy buffer over the object's metadata, sharing this buffer's reference.
    fn metadata_buffer(&self) -> PyResult<Self> {
        Ok(Self::new(self.object()?, Part::Metadata))
    }

    /// Address of the first byte in this process (to check views share the mapping).
    #[getter]
    fn address(&self) -> PyResult<usize> {
        Ok(part_of(&*self.object()?, self.part).as_ptr() as usize)
    }

    /// Whether the buffer was released.
    #[getter]
    fn released(&self) -> bool {
        lock(&self.state).object.is_none()
    }

    /// Views exported through the buffer protocol and still alive.
    #[getter]
    fn exports(&self) -> usize {
        lock(&self.state).exports
    }

    /// Always true: a sealed object never changes.
    #[getter]
    fn readonly(&self) -> bool {
        true
    }

    /// Releases the object's reference now. Raises `BufferError` while views made from
    /// this buffer are alive; releasing twice is harmless.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let object = {
            let mut state = lock(&self.state);
            if state.exports > 0 {
                return Err(views_alive(self.id, state.exports));
            }
            state.object.take()
        };
        py.detach(|| drop(object));
        Ok(())
    }

    /// A copy of the bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, part_of(&*self.object()?, self.part)))
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.to_bytes(py)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    fn __repr__(&self) -> String {
        let state = lock(&self.state);
        let what = if self.part == Part::Metadata {
            "metadata of "
        } else {
            ""
        };
        match &state.object {
            Some(object) => format!(
                "<skyriver.Buffer {what}{} ({} bytes)>",
                self.id,
                part_of(object, self.part).len()
            ),
            None => format!("<skyriver.Buffer {what}{} (released)>", self.id),
        }
    }
}

/// Where an object being written is in its life.
enum Stage {
    /// Unsealed: writable.
    Writing(ObjectWriter),
    /// A seal is in progress on another thread.
    Sealing,
    /// Sealed: read-only, holding the creator's reference.
    Sealed { _reference: Arc<ObjectBuffer> },
    /// Aborted or released: unusable.
    Done,
}

struct WriteState {
    stage: Stage,
    exports: usize,
}

/// An object this client created and has not sealed or aborted yet, shared between its
/// `MutableBuffer` and the client (which seals it by id).
pub struct WriterSlot {
    id: ObjectId,
    data: (usize, usize),
    state: Mutex<WriteState>,
}

/// A client's unsealed objects, by id.
pub type PendingWriters = Arc<Mutex<HashMap<ObjectId, Arc<WriterSlot>>>>;

impl WriterSlot {
    pub fn new(mut writer: ObjectWriter) -> Arc<Self> {
        let id = writer.id();
        let data = writer.data_mut();
        let data = (data.as_mut_ptr() as usize, data.len());
        Arc::new(Self {
            id,
            data,
            state: Mutex::new(WriteState {
                stage: Stage::Writing(writer),
                exports: 0,
            }),
        })
    }

    /// Takes the writer out of a buffer still being written, leaving it `Sealing`; a buffer
    /// sealed, being sealed or released is left as it is and refused.
    fn start_sealing(&self, state: &mut WriteState) -> PyResult<ObjectWriter> {
        match std::mem::replace(&mut state.stage, Stage::Sealing) {
            Stage::Writing(writer) => Ok(writer),
            other => {
                let error = match &other {
                    Stage::Sealing | Stage::Sealed { .. } => errors::AlreadySealed::new_err(
                        format!("object {} is already sealed", self.id),
                    ),
                    _ => released(self.id),
                };
                state.stage = other;
                Err(error)
            }
        }
    }

    /// Seals the object; the slot keeps the creator's reference as a read-only view.
    pub fn seal(&self, py: Python<'_>) -> PyResult<()> {
        let writer = self.start_sealing(&mut lock(&self.state))?;
        let sealed = py.detach(|| writer.seal_into_buffer());
        let mut state = lock(&self.state);
        match sealed {
            Ok(object) => {
                state.stage = Stage::Sealed {
                    _reference: Arc::new(object),
                };
                Ok(())
            }
            Err(error) => {
                state.stage = Stage::Done;
                Err(errors::client_error(py, error))
            }
        }
    }

    /// Seals the object asking for copies on other nodes (see `Client.put`): the creator's
    /// reference goes with the seal (a copy of record stays pinned in the store), so the buffer
    /// is released whatever the outcome; `TooFewReplicas` means sealed, with copies missing.
    pub fn seal_replicated(
        &self,
        py: Python<'_>,
        policy: skyriver_client::ReplicaPolicy,
    ) -> PyResult<()> {
        let writer = {
            let mut state = lock(&self.state);
            if state.exports > 0 {
                return Err(views_alive(self.id, state.exports));
            }
            self.start_sealing(&mut state)?
        };
        let sealed = py.detach(|| writer.seal_replicated(policy));
        lock(&self.state).stage = Stage::Done;
        sealed.map_err(|error| errors::client_error(py, error))
    }

    /// Aborts the unsealed object. Refused while views of it are alive.
    pub fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let writer = {
            let mut state = lock(&self.state);
            if state.exports > 0 {
                return Err(views_alive(self.id, state.exports));
            }
            match std::mem::replace(&mut state.stage, Stage::Done) {
                Stage::Writing(writer) => writer,
                other => {
                    let sealed = matches!(other, Stage::Sealing | Stage::Sealed { .. });
                    state.stage = other;
                    return Err(if sealed {
                        errors::AlreadySealed::new_err(format!(
                            "object {} is sealed and cannot be aborted",
                            self.id
                        ))
                    } else {
                        released(self.id)
                    });
                }
            }
        };
        py.detach(|| writer.abort())
            .map_err(|e| errors::client_error(py, e))
    }

    fn is_writing(&self) -> bool {
        matches!(lock(&self.state).stage, Stage::Writing(_))
    }
}

/// A new object's bytes in shared memory, from `Client.create`.
///
/// Writable through the buffer protocol (`memoryview(buf)[:] = ...`,
/// `numpy.frombuffer(buf, dtype)`, `pyarrow.FixedSizeBufferWriter(pyarrow.py_buffer(buf))`)
/// until `Client.seal(id)` (or `buf.seal()`); new views are read-only after that. The
/// creator's reference is kept until this buffer and its views are gone, or `release()`.
#[pyclass(frozen, name = "MutableBuffer", module = "skyriver")]
pub struct PyMutableBuffer {
    slot: Arc<WriterSlot>,
    pending: PendingWriters,
}

impl PyMutableBuffer {
    pub fn new(slot: Arc<WriterSlot>, pending: PendingWriters) -> Self {
        Self { slot, pending }
    }
}

#[pymethods]
impl PyMutableBuffer {
    /// # Safety
    ///
    /// Called by the interpreter with a view to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let slot = &slf.get().slot;
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        let mut state = lock(&slot.state);
        let readonly = match &state.stage {
            Stage::Writing(_) => false,
            Stage::Sealed { .. } | Stage::Sealing => true,
            Stage::Done => return Err(released(slot.id)),
        };
        if readonly && flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(format!(
                "object {} is sealed: its buffer is read-only",
                slot.id
            )));
        }
        state.exports += 1;
        drop(state);
        let (buf, len) = slot.data;
        // SAFETY: `data` is the object's data range in the client's mapping, kept mapped by the
        // writer (then by the sealed buffer) that the slot holds; `release()` and `abort()`
        // refuse while exports are counted, so the reference outlives the view. Only this
        // creator may write before the seal; afterwards views are read-only.
        unsafe { fill_view(view, flags, buf as *mut u8, len, readonly, slf.into_any()) };
        Ok(())
    }

    /// # Safety
    ///
    /// Called by the interpreter once per view this object filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut state = lock(&self.slot.state);
        state.exports = state.exports.saturating_sub(1);
    }

    /// The object's id.
    #[getter]
    fn id(&self) -> PyObjectId {
        PyObjectId(self.slot.id)
    }

    /// Data bytes.
    #[getter]
    fn size(&self) -> usize {
        self.slot.data.1
    }

    fn __len__(&self) -> usize {
        self.slot.data.1
    }

    /// Address of the first byte in this process.
    #[getter]
    fn address(&self) -> usize {
        self.slot.data.0
    }

    /// Whether the object is sealed.
    #[getter]
    fn sealed(&self) -> bool {
        matches!(lock(&self.slot.state).stage, Stage::Sealed { .. })
    }

    /// Whether the buffer can still be written.
    #[getter]
    fn readonly(&self) -> bool {
        !self.slot.is_writing()
    }

    /// Views exported through the buffer protocol and still alive.
    #[getter]
    fn exports(&self) -> usize {
        lock(&self.slot.state).exports
    }

    /// Seals the object (same as `Client.seal(id, ...)`, with the same replica options).
    #[pyo3(signature = (replicas=None, wait_replicas=false, replicas_timeout=60.0))]
    fn seal(
        &self,
        py: Python<'_>,
        replicas: Option<u8>,
        wait_replicas: bool,
        replicas_timeout: f64,
    ) -> PyResult<()> {
        let policy = crate::client::replica_policy(replicas, wait_replicas, replicas_timeout)?;
        lock(&self.pending).remove(&self.slot.id);
        match policy {
            Some(policy) => self.slot.seal_replicated(py, policy),
            None => self.slot.seal(py),
        }
    }

    /// Releases the buffer now: an unsealed object is aborted, a sealed one loses the
    /// creator's reference. Raises `BufferError` while views are alive.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        if self.slot.is_writing() {
            self.slot.abort(py)?;
            lock(&self.pending).remove(&self.slot.id);
            return Ok(());
        }
        let stage = {
            let mut state = lock(&self.slot.state);
            if state.exports > 0 {
                return Err(views_alive(self.slot.id, state.exports));
            }
            match state.stage {
                Stage::Sealing => return Ok(()),
                _ => std::mem::replace(&mut state.stage, Stage::Done),
            }
        };
        py.detach(|| drop(stage));
        Ok(())
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    fn __repr__(&self) -> String {
        let stage = match lock(&self.slot.state).stage {
            Stage::Writing(_) => "writable",
            Stage::Sealing | Stage::Sealed { .. } => "sealed",
            Stage::Done => "released",
        };
        format!(
            "<skyriver.MutableBuffer {} ({} bytes, {stage})>",
            self.slot.id, self.slot.data.1
        )
    }
}
