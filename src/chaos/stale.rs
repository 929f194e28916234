//! What a chaos run killed with SIGKILL leaves behind, removed by the next run: its directory
//! under `$TMPDIR` and the tmpfs mounts of its persistent stores in it. (Its daemons and
//! Python clients die with it; its namespaces go as `crate::netns` clears stale slots.)
//!
//! A run owns its directory through an exclusive lock on `owner.lock` in it, held for the
//! whole run: the kernel drops the lock when the run dies however it dies, so a directory
//! whose lock can be taken belongs to nobody. Directories without the file (or whose lock is
//! held) are never touched, so two runs on one machine never remove each other's things.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{Flock, FlockArg};

/// The prefix of a run's directory under `$TMPDIR`.
pub const RUN_DIR_PREFIX: &str = "skyriver-chaos-";
const OWNER_LOCK: &str = "owner.lock";

/// A run's hold on its directory.
#[derive(Debug)]
pub struct RunLock {
    _lock: Flock<File>,
}

/// Takes `dir`'s owner lock, or `None` when another live process holds it.
fn try_lock(dir: &Path) -> std::io::Result<Option<RunLock>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(OWNER_LOCK))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(RunLock { _lock: lock })),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(errno.into()),
    }
}

/// Marks `dir` as the live run's, for as long as the returned lock lives.
pub fn own(dir: &Path) -> std::io::Result<RunLock> {
    try_lock(dir)?.ok_or_else(|| std::io::Error::other(format!("{} is locked", dir.display())))
}

/// Mount points under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        // /proc/mounts escapes spaces and the like as octal; a run's paths have none.
        .map(PathBuf::from)
        .filter(|mount| mount.starts_with(dir) && mount != dir)
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found
}

/// Removes every run directory in `tmp` whose owner is gone, with the mounts in it; the
/// directories removed.
pub fn remove_stale_runs(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(RUN_DIR_PREFIX) || !dir.join(OWNER_LOCK).is_file() {
            continue;
        }
        // Held while the directory goes, so no run could take it meanwhile (none would).
        let Ok(Some(_lock)) = try_lock(&dir) else {
            continue;
        };
        for mount in mounts_under(&dir) {
            let _ = Command::new("umount").arg("-l").arg(&mount).status();
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_is_removed_only_once_its_owner_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join(format!("{RUN_DIR_PREFIX}live"));
        let dead = tmp.path().join(format!("{RUN_DIR_PREFIX}dead"));
        let foreign = tmp.path().join(format!("{RUN_DIR_PREFIX}without-lock"));
        for dir in [&live, &dead, &foreign] {
            std::fs::create_dir_all(dir.join("node-0-store")).unwrap();
        }
        let _held = own(&live).unwrap();
        drop(own(&dead).unwrap());
        // A second owner of a held directory is refused.
        assert!(own(&live).is_err());
        assert_eq!(remove_stale_runs(tmp.path()), vec![dead.clone()]);
        assert!(live.is_dir() && foreign.is_dir() && !dead.exists());
    }
}
