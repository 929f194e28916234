//! Who may open the daemon's Unix socket: its owner by default, a named group on request.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyriver_client::Client;

/// A daemon process, killed and reaped when dropped (also when the test fails).
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(socket: &std::path::Path, extra: &[&str]) -> Daemon {
    let mut daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args([
                "daemon",
                "--log",
                "warn",
                "--memory",
                "16MiB",
                "--no-prefault",
            ])
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while Client::connect(socket).is_err() {
        assert!(daemon.0.try_wait().unwrap().is_none(), "the daemon exited");
        assert!(started.elapsed() < Duration::from_secs(30), "no daemon");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon
}

#[test]
fn the_socket_is_owner_only_by_default() {
    let dir = common::test_dir();
    let socket = dir.path().join("d.sock");
    let _daemon = daemon(&socket, &[]);
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_socket_group_gets_the_socket_and_read_write_access() {
    let dir = common::test_dir();
    let socket = dir.path().join("d.sock");
    // Root may give the socket to any group; others to one of their own.
    let gid = match nix::unistd::geteuid().is_root() {
        true => 1,
        false => nix::unistd::getegid().as_raw(),
    };
    let _daemon = daemon(&socket, &["--socket-group", &gid.to_string()]);
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.gid(), gid);
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
}

#[test]
fn an_unknown_socket_group_is_refused_by_name() {
    let dir = common::test_dir();
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args([
            "daemon",
            "--memory",
            "16MiB",
            "--socket-group",
            "no-such-group-xyz",
        ])
        .arg("--socket")
        .arg(dir.path().join("d.sock"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("no-such-group-xyz"), "{stderr}");
}

/// A directory every user can write and another user owns: a fresh one given to `nobody`
/// when running as root, else the machine's shared /tmp (root's, mode 1777).
fn shared_dir() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
    if nix::unistd::geteuid().is_root() {
        let dir = common::test_dir();
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let path = dir.path().to_path_buf();
        (Some(dir), path)
    } else {
        let tmp = std::path::PathBuf::from("/tmp");
        let meta = std::fs::metadata(&tmp).unwrap();
        assert!(
            meta.uid() == 0 && meta.mode() & 0o002 != 0,
            "/tmp is not shared here"
        );
        (None, tmp)
    }
}

#[test]
fn a_socket_in_a_directory_other_users_control_is_refused_unless_allowed() {
    let (_guard, dir) = shared_dir();
    let socket = dir.join(format!("skyriver-test-{}.sock", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["daemon", "--memory", "16MiB", "--no-prefault"])
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("writable by every user"), "{stderr}");
    assert!(stderr.contains("--allow-shared-socket-dir"), "{stderr}");
    assert!(!socket.exists(), "nothing was bound");
    // Told otherwise, it starts.
    let daemon = daemon(&socket, &["--allow-shared-socket-dir"]);
    drop(daemon);
    let _ = std::fs::remove_file(&socket);
}

#[test]
fn a_missing_socket_directory_is_made_private() {
    let dir = common::test_dir();
    let socket = dir.path().join("run/skyriver/d.sock");
    let _daemon = daemon(&socket, &[]);
    let meta = std::fs::metadata(socket.parent().unwrap()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
}

#[test]
fn a_socket_mode_for_others_opens_the_directory_it_creates_and_warns_about_one_that_exists() {
    let dir = common::test_dir();
    // A directory the daemon creates lets in whom the socket's mode does (search only).
    let socket = dir.path().join("run/d.sock");
    let daemon = daemon(&socket, &["--socket-mode", "666"]);
    let meta = std::fs::metadata(socket.parent().unwrap()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o711);
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    drop(daemon);
    // One that exists, private, is kept as it is, and the daemon says what to do.
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = private.join("d.sock");
    let log = dir.path().join("daemon.log");
    let mut child = Daemon(
        Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args([
                "daemon",
                "--log",
                "warn",
                "--memory",
                "16MiB",
                "--no-prefault",
            ])
            .args(["--socket-mode", "666", "--socket"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    common::eventually("the daemon answers", || {
        assert!(child.0.try_wait().unwrap().is_none(), "the daemon exited");
        Client::connect(&socket).is_ok()
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("keeps them from reaching it"), "{text}");
    assert!(text.contains("chmod o+x"), "{text}");
    let meta = std::fs::metadata(&private).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
}

/// What `skyriver stat` says when run as `nobody` against `socket`.
fn stats_as_nobody(socket: &std::path::Path) -> String {
    use std::os::unix::process::CommandExt;
    let output = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(["stat", "--socket"])
        .arg(socket)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn permission_denied_names_the_owner_and_how_to_give_access() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED permission_denied_names_the_owner_and_how_to_give_access: needs root to run a client as another user");
        return;
    }
    let dir = common::test_dir();
    let socket = dir.path().join("d.sock");
    let _daemon = daemon(&socket, &[]);
    // The test directory is root's and private: `nobody` may not enter it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let stderr = stats_as_nobody(&socket);
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "user nobody may not enter its directory {} (user root, group root, mode 700)",
            dir.path().display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("--socket-group"), "{stderr}");
    assert!(!stderr.contains("is `skyriver daemon` running"), "{stderr}");
    // The directory open to all, the socket itself (mode 600) is what refuses.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let stderr = stats_as_nobody(&socket);
    assert!(
        stderr.contains(&format!("socket {}", socket.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("the socket belongs to user root (group root, mode 600)"),
        "{stderr}"
    );
    assert!(stderr.contains("runs as user nobody"), "{stderr}");
    assert!(stderr.contains("--socket-group GROUP"), "{stderr}");
    assert!(stderr.contains("--socket-mode 666"), "{stderr}");
}
