//! `skyriver`: the command line (`skyriver daemon`, `put`, `get`, `ls`, ...) and its tools
//! (`bench`, `up`, `netns`, `top`, `cluster`). The client library is `skyriver-client`, the
//! daemon `skyriver-daemon`, the protocol logic `skyriver-core` (sans-IO) and all IO
//! primitives and unsafe code `skyriver-transport`.

#![forbid(unsafe_code)]

pub mod bench;
pub mod chaos;
pub mod cli;
pub mod cluster;
pub mod netns;
pub mod top;
pub mod up;

/// The program to run for `skyriver` subcommands this process starts (daemons of `up`, `demo`
/// and the benchmarks): `$SKYRIVER_EXE` when set (the Python package's `skyriver` entry point
/// sets it to itself, since its process is the Python interpreter), else this executable.
pub fn self_exe() -> std::io::Result<std::path::PathBuf> {
    match std::env::var_os("SKYRIVER_EXE") {
        Some(exe) if !exe.is_empty() => Ok(exe.into()),
        _ => std::env::current_exe(),
    }
}
