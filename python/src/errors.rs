//! The exceptions of the `skyriver` package, and how client errors map onto them.
//!
//! One base class, `SkyriverError`; one class per error a caller may want to catch. Two of
//! them also derive from a builtin so generic handlers work: `Timeout` is a `TimeoutError`
//! and `DaemonUnavailable` (no daemon, or the connection to it broke) a `ConnectionError`.

use pyo3::create_exception;
use pyo3::exceptions::{PyConnectionError, PyException, PyKeyboardInterrupt, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use skyriver_client::{ClientError, FetchError, StoreError};

create_exception!(
    skyriver,
    SkyriverError,
    PyException,
    "Base class of every error Skyriver raises."
);
create_exception!(
    skyriver,
    TooFewReplicas,
    SkyriverError,
    "A put that waited for its copies returned before all were sealed; the message names how many exist. The object is stored, and its copies keep being made."
);
create_exception!(
    skyriver,
    DaemonBusy,
    SkyriverError,
    "The daemon is at a cap of requests waiting and refused this one (nothing was done); retry later."
);
create_exception!(
    skyriver,
    ObjectExists,
    SkyriverError,
    "`create` or `put` of an id that is already in the store."
);
create_exception!(
    skyriver,
    ObjectNotFound,
    SkyriverError,
    "The object is not in the store (or, for `fetch`, on any live node)."
);
create_exception!(
    skyriver,
    ObjectNotSealed,
    SkyriverError,
    "The object exists but is still being written."
);
create_exception!(
    skyriver,
    ObjectInUse,
    SkyriverError,
    "The object is held by a client; a delete takes effect when the last reference goes."
);
create_exception!(
    skyriver,
    OutOfMemory,
    SkyriverError,
    "The store is full even after evicting every object nobody holds."
);
create_exception!(
    skyriver,
    ObjectTooLarge,
    SkyriverError,
    "The object can never fit in the store."
);
create_exception!(
    skyriver,
    NotCreator,
    SkyriverError,
    "Seal or abort of an object another client created."
);
create_exception!(
    skyriver,
    AlreadySealed,
    SkyriverError,
    "Seal or abort of an object that is already sealed."
);
create_exception!(
    skyriver,
    NotHeld,
    SkyriverError,
    "Release of an object this client holds no reference to."
);
create_exception!(
    skyriver,
    ObjectAborted,
    SkyriverError,
    "A get waited for an object whose creator aborted it (or went away) before sealing it."
);
create_exception!(
    skyriver,
    BadRequest,
    SkyriverError,
    "The daemon refused a malformed or over-limit request."
);
create_exception!(
    skyriver,
    ReplicasUnsupported,
    TooFewReplicas,
    "A put waited for copies on a daemon whose directory (Redis) makes none; the object is stored."
);
create_exception!(
    skyriver,
    FetchFailed,
    SkyriverError,
    "A fetch from another node failed: every source failed, or the directory is unavailable."
);
create_exception!(
    skyriver,
    ProtocolError,
    SkyriverError,
    "The daemon answered something this client does not understand."
);
create_exception!(
    skyriver,
    ForkedError,
    SkyriverError,
    "The client was connected by the parent of this forked process: call `reconnect()` (or `skyriver.connect()`) in the child."
);
create_exception!(
    skyriver,
    ClientClosed,
    SkyriverError,
    "The client was closed."
);

static TIMEOUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DAEMON_UNAVAILABLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// A class deriving from `SkyriverError` and a builtin exception.
fn subclass_of_both(
    py: Python<'_>,
    name: &str,
    builtin: Bound<'_, PyType>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__doc__", doc)?;
    namespace.set_item("__module__", "skyriver")?;
    let bases = PyTuple::new(py, [py.get_type::<SkyriverError>(), builtin])?;
    let class = py
        .get_type::<PyType>()
        .call1((name, bases, namespace))?
        .cast_into::<PyType>()?;
    Ok(class.unbind())
}

fn timeout_class(py: Python<'_>) -> &Py<PyType> {
    TIMEOUT
        .get_or_try_init(py, || {
            subclass_of_both(
                py,
                "Timeout",
                py.get_type::<PyTimeoutError>(),
                "The object was not sealed (or fetched) before the timeout.",
            )
        })
        // Building a class from two builtin bases cannot fail short of interpreter failure.
        .expect("the Timeout exception class is created")
}

fn daemon_unavailable_class(py: Python<'_>) -> &Py<PyType> {
    DAEMON_UNAVAILABLE
        .get_or_try_init(py, || {
            subclass_of_both(
                py,
                "DaemonUnavailable",
                py.get_type::<PyConnectionError>(),
                "No daemon listens on the socket, or the connection to it failed.",
            )
        })
        .expect("the DaemonUnavailable exception class is created")
}

fn new_error(py: Python<'_>, class: &Py<PyType>, message: String) -> PyErr {
    PyErr::from_type(class.bind(py).clone(), message)
}

/// Adds every exception class to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    macro_rules! add {
        ($($class:ident),*) => { $( module.add(stringify!($class), py.get_type::<$class>())?; )* };
    }
    add!(
        SkyriverError,
        DaemonBusy,
        ObjectExists,
        ObjectNotFound,
        ObjectNotSealed,
        ObjectInUse,
        OutOfMemory,
        ObjectTooLarge,
        NotCreator,
        AlreadySealed,
        NotHeld,
        ObjectAborted,
        BadRequest,
        FetchFailed,
        ProtocolError,
        ForkedError,
        ClientClosed,
        TooFewReplicas,
        ReplicasUnsupported
    );
    module.add("Timeout", timeout_class(py).bind(py))?;
    module.add("DaemonUnavailable", daemon_unavailable_class(py).bind(py))?;
    Ok(())
}

/// The exception for a store error.
pub fn store_error(py: Python<'_>, error: StoreError) -> PyErr {
    let message = error.to_string();
    match error {
        StoreError::ObjectExists(_) => ObjectExists::new_err(message),
        StoreError::ObjectNotFound(_) => ObjectNotFound::new_err(message),
        StoreError::ObjectNotSealed(_) => ObjectNotSealed::new_err(message),
        StoreError::ObjectInUse(_) => ObjectInUse::new_err(message),
        StoreError::OutOfMemory { .. } => OutOfMemory::new_err(message),
        StoreError::Timeout(_) => new_error(py, timeout_class(py), message),
        StoreError::ObjectTooLarge { .. } => ObjectTooLarge::new_err(message),
        StoreError::NotCreator(_) => NotCreator::new_err(message),
        StoreError::AlreadySealed(_) => AlreadySealed::new_err(message),
        StoreError::NotHeld(_) => NotHeld::new_err(message),
        StoreError::BadRequest(_) => BadRequest::new_err(message),
        StoreError::Aborted(_) => ObjectAborted::new_err(message),
        // Only cluster calls (`locate`) meet it; it says the directory is down, as a failed
        // fetch's reason does.
        StoreError::DirectoryUnavailable(_) => FetchFailed::new_err(message),
        StoreError::Busy { .. } => DaemonBusy::new_err(message),
        StoreError::Starting(_) => new_error(
            py,
            daemon_unavailable_class(py),
            format!("{message}; connect again in a moment"),
        ),
        StoreError::TooFewReplicas { .. } => TooFewReplicas::new_err(message),
        StoreError::ReplicasUnsupported { .. } => ReplicasUnsupported::new_err(message),
    }
}

/// The exception for a failed fetch.
pub fn fetch_error(py: Python<'_>, error: FetchError) -> PyErr {
    let message = error.to_string();
    match error {
        FetchError::NotFound { .. } => ObjectNotFound::new_err(message),
        FetchError::Timeout { .. } => new_error(py, timeout_class(py), message),
        FetchError::Store(error) => store_error(py, error),
        _ => FetchFailed::new_err(message),
    }
}

/// The exception for a failed client call.
pub fn client_error(py: Python<'_>, error: ClientError) -> PyErr {
    match error {
        ClientError::Connect { path, source } => new_error(
            py,
            daemon_unavailable_class(py),
            format!(
                "no skyriver daemon at {path}: {source}. Start one with \
                 `skyriver daemon --socket {path}` (add `--memory 4GiB` for more than 1 GiB), \
                 or connect to another socket (socket=..., or $SKYRIVER_SOCKET)",
                path = path.display()
            ),
        ),
        ClientError::PermissionDenied { .. } => {
            new_error(py, daemon_unavailable_class(py), error.to_string())
        }
        ClientError::ClientClosed => {
            ClientClosed::new_err("the client was closed (by close() on another thread?)")
        }
        ClientError::Interrupted => PyKeyboardInterrupt::new_err(()),
        ClientError::Io(_) | ClientError::Closed => new_error(
            py,
            daemon_unavailable_class(py),
            format!("{error}; connect again once the daemon runs"),
        ),
        ClientError::Store(error) => store_error(py, error),
        ClientError::Fetch(error) => fetch_error(py, error),
        ClientError::Forked { .. } => ForkedError::new_err(format!(
            "{error}: call client.reconnect() or skyriver.connect() in the child"
        )),
        other => ProtocolError::new_err(other.to_string()),
    }
}

/// Whether a store error means "not there (yet)": what batch calls report as `None`.
pub fn is_unavailable(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Timeout(_) | StoreError::ObjectNotFound(_) | StoreError::ObjectNotSealed(_)
    )
}
