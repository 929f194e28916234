//! `skyriver._native.run_cli`: the `skyriver` command line, run inside the Python process (the
//! package's `skyriver` and `plasma_store` entry points).

use std::ffi::OsString;
use std::process::ExitCode;

use pyo3::prelude::*;

/// Runs the `skyriver` command line `argv` (the program's name first: a name ending in
/// `plasma_store` takes plasma_store's flags) without the GIL, and returns its exit status.
/// Subcommands that exit the process themselves (`--help`, a usage error) exit the
/// interpreter with it, as the binary would.
#[pyfunction]
pub fn run_cli(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    let code = py.detach(|| skyriver::cli::main_with_args(argv));
    exit_status(code)
}

/// The status an [`ExitCode`] exits with (it offers no getter, only comparison).
fn exit_status(code: ExitCode) -> u8 {
    (0..=u8::MAX)
        .find(|&status| ExitCode::from(status) == code)
        .unwrap_or(1)
}
