//! Child processes that die with the process that started them.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::Signal;

/// Has the child that `command` starts receive `signal` when its parent goes away, however the
/// parent ends (even SIGKILL): Linux's parent-death signal (`PR_SET_PDEATHSIG`).
///
/// The kernel sends it when the *thread* that spawned the child exits, not the process: spawn
/// from a thread that lives as long as the children should (e.g. the main thread). A parent
/// that died between the fork and the `prctl` is caught too: the child then does not start.
/// The setting survives `exec` (except of set-user-ID or file-capability programs).
pub fn die_with_parent(command: &mut Command, signal: Signal) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe work is allowed. It makes two system calls (prctl(2), getppid(2)),
    // reads errno and builds an `io::Error` from a raw OS error code, none of which allocates
    // or takes a lock; it captures only a copied pid and signal number.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(signal)?;
            if nix::unistd::getppid() != parent {
                // The parent died before the signal was armed: it will never come.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_gets_the_signal_when_its_spawning_thread_ends() {
        // A thread spawns `sleep` and ends: the child is SIGKILLed then, long before it wakes.
        let mut child = std::thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("600");
            die_with_parent(&mut command, Signal::SIGKILL);
            command.spawn().expect("sleep starts")
        })
        .join()
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child outlived its spawning thread");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
