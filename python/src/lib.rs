//! The native module of the `skyriver` Python package (`skyriver._native`).
//!
//! A thin layer over the Rust [`skyriver_client::Client`]: ids, zero-copy buffers that export the
//! object's shared memory through the buffer protocol, a client whose blocking calls release
//! the GIL, and the exception classes. The Python package (`python/skyriver/`) adds numpy
//! and pyarrow conveniences and the `skyriver.plasma` compatibility layer on top; `run_cli`
//! runs the `skyriver` command line for the package's entry points.

use pyo3::prelude::*;

mod buffers;
#[cfg(feature = "cli")]
mod cli;
mod client;
mod errors;
mod ids;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<ids::PyObjectId>()?;
    module.add_class::<buffers::PyReadBuffer>()?;
    module.add_class::<buffers::PyMutableBuffer>()?;
    module.add_class::<client::PyClient>()?;
    module.add_class::<client::PySubscription>()?;
    module.add_class::<client::PyEvent>()?;
    module.add_function(wrap_pyfunction!(client::default_socket, module)?)?;
    #[cfg(feature = "cli")]
    module.add_function(wrap_pyfunction!(cli::run_cli, module)?)?;
    module.add("OBJECT_ID_LEN", skyriver_core::ids::OBJECT_ID_LEN)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(module)?;
    Ok(())
}
