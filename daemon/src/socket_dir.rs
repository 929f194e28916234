//! The directory the daemon's socket lives in. A client trusts whatever answers at the socket's
//! path, so nobody but the daemon's user (and root) may be able to put a socket there: a
//! directory every user can write to and that someone else owns (a shared `/tmp`) would let
//! another user bind the path first, or swap it, and receive every client's objects. The
//! default path is therefore in a private directory, `/tmp/skyriver-<uid>/`, made mode 0700
//! (as tmux does), with search permission added for whom the socket's mode lets in: 0710 with
//! `--socket-group` or `--socket-mode 660`, 0711 with `--socket-mode 666`. Nobody but the owner
//! may list or write it. An existing directory is never changed; when it keeps out whom the
//! socket's mode lets in, the daemon says so.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the socket's directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum SocketDirError {
    /// Every user may write the directory, and another user owns it.
    #[error(
        "the socket's directory {dir} is writable by every user and owned by uid {owner}, not by \
         this daemon's user (uid {me}): another user could put their own socket at the path \
         before clients connect. Use a directory of your own (the default \
         /tmp/skyriver-<uid>/ is one), or pass --allow-shared-socket-dir if you trust every user \
         of this machine"
    )]
    WorldWritable {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// The daemon's user.
        me: u32,
    },
    /// Another (non-root) user owns the directory.
    #[error(
        "the socket's directory {dir} belongs to uid {owner}, not to this daemon's user (uid \
         {me}), who could replace the socket; remove it if it is stale, use a directory of your \
         own, or pass --allow-shared-socket-dir"
    )]
    OtherOwner {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// The daemon's user.
        me: u32,
    },
    /// Creating or inspecting the directory failed.
    #[error("socket directory {dir}: {source}")]
    Io {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// Makes sure the socket's directory `dir` exists and is safe: created private when missing
/// (see [`dir_mode_for`]; owned by `group` when the socket is shared with a group); refused
/// when it exists and another user controls it, unless `allow_shared`. An existing directory
/// that keeps out whom `socket_mode` lets in is kept, with a warning.
pub fn prepare(
    dir: &Path,
    socket_mode: u32,
    group: Option<u32>,
    allow_shared: bool,
) -> Result<(), SocketDirError> {
    let io = |source| SocketDirError::Io {
        dir: dir.to_path_buf(),
        source,
    };
    let me = nix::unistd::geteuid().as_raw();
    match std::fs::metadata(dir) {
        Ok(meta) => {
            if !allow_shared {
                check(dir, meta.uid(), meta.mode(), me)?;
            }
            let socket_gid = group.unwrap_or_else(|| nix::unistd::getegid().as_raw());
            if let Some(missing) =
                unreachable_for(socket_mode, meta.mode(), meta.gid() == socket_gid)
            {
                tracing::warn!(
                    "--socket-mode {socket_mode:o} lets {missing} open the socket, but its \
                     directory {} (mode {:o}) keeps them from reaching it; give them search \
                     permission with `chmod {} {}`, or put the socket elsewhere",
                    dir.display(),
                    meta.mode() & 0o7777,
                    if missing == "every user" {
                        "o+x"
                    } else {
                        "g+x"
                    },
                    dir.display(),
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            let mode = dir_mode_for(socket_mode);
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(dir)
                .map_err(io)?;
            if let Some(gid) = group {
                std::os::unix::fs::chown(dir, None, Some(gid)).map_err(io)?;
            }
            // The umask may have taken bits away; set exactly these.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(io)?;
            Ok(())
        }
        Err(e) => Err(io(e)),
    }
}

/// The mode of a socket directory the daemon creates: private (0700), plus search permission
/// (only: no listing, no writing) for the group and for others when the socket's mode lets
/// them open it, so that `--socket-mode` has its effect.
pub fn dir_mode_for(socket_mode: u32) -> u32 {
    let mut mode = 0o700;
    if socket_mode & 0o060 != 0 {
        mode |= 0o010;
    }
    if socket_mode & 0o006 != 0 {
        mode |= 0o001;
    }
    mode
}

/// Who the socket's mode lets in but an existing directory of mode `dir_mode` keeps out
/// (`same_group`: the directory's group is the socket's); `None` when nobody.
fn unreachable_for(socket_mode: u32, dir_mode: u32, same_group: bool) -> Option<&'static str> {
    if socket_mode & 0o006 != 0 && dir_mode & 0o001 == 0 {
        return Some("every user");
    }
    let group_searches = (same_group && dir_mode & 0o010 != 0) || dir_mode & 0o001 != 0;
    if socket_mode & 0o060 != 0 && !group_searches {
        return Some("the socket's group");
    }
    None
}

/// The rule, on a directory's owner and mode.
fn check(dir: &Path, owner: u32, mode: u32, me: u32) -> Result<(), SocketDirError> {
    if owner == me {
        return Ok(());
    }
    if mode & 0o002 != 0 {
        return Err(SocketDirError::WorldWritable {
            dir: dir.to_path_buf(),
            owner,
            me,
        });
    }
    if owner != 0 {
        return Err(SocketDirError::OtherOwner {
            dir: dir.to_path_buf(),
            owner,
            me,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_other_users_cannot_write_are_accepted() {
        let dir = Path::new("/some/dir");
        // The daemon's own directory, whatever its mode.
        assert!(check(dir, 1000, 0o40777, 1000).is_ok());
        // Root's, not writable by all: fine (e.g. /run/skyriver made by an admin).
        assert!(check(dir, 0, 0o40755, 1000).is_ok());
        // A shared /tmp owned by root, for a non-root daemon.
        let e = check(dir, 0, 0o41777, 1000).unwrap_err();
        assert!(matches!(e, SocketDirError::WorldWritable { owner: 0, .. }));
        assert!(e.to_string().contains("--allow-shared-socket-dir"), "{e}");
        // Another user's directory.
        assert!(matches!(
            check(dir, 1001, 0o40755, 1000),
            Err(SocketDirError::OtherOwner { owner: 1001, .. })
        ));
        // A world-writable directory someone else made, for a root daemon.
        assert!(check(dir, 1001, 0o41777, 0).is_err());
    }

    #[test]
    fn a_missing_directory_is_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        prepare(&dir, 0o600, None, false).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Now it exists and is ours: accepted again.
        prepare(&dir, 0o600, None, false).unwrap();
        let shared = tmp.path().join("shared");
        let gid = nix::unistd::getegid().as_raw();
        prepare(&shared, 0o660, Some(gid), false).unwrap();
        let meta = std::fs::metadata(&shared).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.gid()), (0o710, gid));
    }

    #[test]
    fn the_directory_lets_in_whom_the_socket_mode_does() {
        assert_eq!(dir_mode_for(0o600), 0o700);
        assert_eq!(dir_mode_for(0o660), 0o710);
        assert_eq!(dir_mode_for(0o666), 0o711);
        assert_eq!(dir_mode_for(0o606), 0o701);
        // An existing directory: who is kept out.
        assert_eq!(unreachable_for(0o600, 0o700, true), None);
        assert_eq!(unreachable_for(0o666, 0o700, true), Some("every user"));
        assert_eq!(unreachable_for(0o666, 0o711, true), None);
        assert_eq!(
            unreachable_for(0o660, 0o700, true),
            Some("the socket's group")
        );
        assert_eq!(unreachable_for(0o660, 0o710, true), None);
        assert_eq!(
            unreachable_for(0o660, 0o710, false),
            Some("the socket's group")
        );
        assert_eq!(unreachable_for(0o660, 0o701, false), None);
    }
}
