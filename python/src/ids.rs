//! `skyriver.ObjectID`: a 20-byte object id, and how call arguments become ids.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use skyriver_client::ObjectId;
use skyriver_core::ids::OBJECT_ID_LEN;

/// A 20-byte object id (as Plasma's and Ray's), shown as 40 hex characters.
///
/// `ObjectID(b"...20 bytes...")`, `ObjectID.from_random()`, `ObjectID.from_hex("00ff...")`.
/// Hashable and ordered (by bytes); pickles as its bytes. `skyriver.plasma.ObjectID` derives
/// from it.
#[pyclass(
    frozen,
    eq,
    ord,
    hash,
    subclass,
    name = "ObjectID",
    module = "skyriver"
)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PyObjectId(pub ObjectId);

#[pymethods]
impl PyObjectId {
    /// An id from its 20 bytes.
    #[new]
    fn new(binary: &Bound<'_, PyAny>) -> PyResult<Self> {
        let bytes = binary.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "ObjectID takes {OBJECT_ID_LEN} bytes (use ObjectID.from_hex for text)"
            ))
        })?;
        from_bytes(bytes.as_bytes()).map(Self)
    }

    /// A new random id, drawn from the operating system: never the same in two processes,
    /// also after `fork()`.
    #[staticmethod]
    fn from_random() -> Self {
        Self::random()
    }

    /// The id of 40 hex characters.
    #[staticmethod]
    fn from_hex(text: &str) -> PyResult<Self> {
        text.parse::<ObjectId>()
            .map(Self)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The all-zero id.
    #[staticmethod]
    fn nil() -> Self {
        Self(ObjectId([0; OBJECT_ID_LEN]))
    }

    /// The 40 hex characters.
    fn hex(&self) -> String {
        self.0.to_string()
    }

    /// The 20 bytes.
    fn binary<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.0.as_bytes())
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.binary(py)
    }

    fn __repr__(&self) -> String {
        format!("ObjectID({})", self.0)
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let args = PyTuple::new(py, [slf.get().binary(py)])?;
        Ok((slf.get_type().into_any(), args))
    }
}

impl PyObjectId {
    /// A new random id, drawn from the operating system ([`skyriver_client::random_object_id`]).
    pub fn random() -> Self {
        Self(skyriver_client::random_object_id())
    }
}

fn from_bytes(bytes: &[u8]) -> PyResult<ObjectId> {
    ObjectId::from_slice(bytes).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// An id from an `ObjectID` or its 20 bytes.
pub fn object_id(value: &Bound<'_, PyAny>) -> PyResult<ObjectId> {
    if let Ok(id) = value.cast::<PyObjectId>() {
        return Ok(id.get().0);
    }
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return from_bytes(bytes.as_bytes());
    }
    Err(PyTypeError::new_err(format!(
        "expected an ObjectID (or its {OBJECT_ID_LEN} bytes), got {}",
        value.get_type().name()?
    )))
}

/// Ids from one id (`single` is true) or an iterable of ids.
pub fn object_ids(value: &Bound<'_, PyAny>) -> PyResult<(Vec<ObjectId>, bool)> {
    if value.cast::<PyObjectId>().is_ok() || value.cast::<PyBytes>().is_ok() {
        return Ok((vec![object_id(value)?], true));
    }
    if value.cast::<PyString>().is_ok() {
        return Err(PyTypeError::new_err(
            "expected an ObjectID or a list of them, got a str (use ObjectID.from_hex)",
        ));
    }
    let ids = value
        .try_iter()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "expected an ObjectID or a list of them, got {}",
                value
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?
        .map(|item| object_id(&item?))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((ids, false))
}
