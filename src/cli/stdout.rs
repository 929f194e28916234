//! A closed standard output (`skyriver ls | head -1`) stops a command quietly.

#[allow(unused_imports)]
use super::*;

/// The exit status of a command whose standard output was closed early, as a process killed by
/// SIGPIPE shows in a shell (128 + 13).
pub(super) const STDOUT_CLOSED_STATUS: u8 = 141;

/// Raised (as an unwinding payload) when standard output is closed early, e.g. `skyriver ls |
/// head -1`: the command stops quietly, its destructors run (child daemons, temporary
/// directories), and it exits with [`STDOUT_CLOSED_STATUS`].
pub(super) struct StdoutClosed;

/// Stops the command quietly: nobody reads its output any more.
pub(super) fn stdout_closed() -> ! {
    // `resume_unwind` does not call the panic hook: nothing is printed.
    std::panic::resume_unwind(Box::new(StdoutClosed))
}

/// Whether a panic means that standard output (or error, as in `skyriver sim 2>&1 | head`) was
/// closed: `println!` panics with "failed printing to stdout: Broken pipe" (SIGPIPE is ignored
/// in Rust programs, so a write to a closed pipe fails instead of killing the process).
pub(super) fn is_stdout_closed(payload: &(dyn std::any::Any + Send)) -> bool {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied());
    payload.is::<StdoutClosed>()
        || message.is_some_and(|m| {
            (m.starts_with("failed printing to stdout")
                || m.starts_with("failed printing to stderr"))
                && m.contains("Broken pipe")
        })
}
