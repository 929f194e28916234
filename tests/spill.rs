//! The spill tier end to end: a daemon with 64 MiB of memory and a spill directory takes
//! 1 GiB of objects and gives every one back with its bytes; a peer's fetch of a spilled
//! object restores it on the holder; a damaged spill file loses its objects, never serves
//! other bytes; a restart without `--backing-file` removes the old spill files; a spill
//! directory that is missing, a file or read-only stops the start, one on tmpfs is warned
//! about; `up --spill-dir --spill-limit` reaches the daemons and `/metrics` counts the spills.

mod common;
use common::pattern;

use std::path::Path;
use std::time::Duration;

use skyriver_client::{Client, ObjectId};
use skyriver_daemon::spill::SpillConfig;
use skyriver_daemon::{DaemonConfig, DaemonHandle};

const DISK: common::skip::Requirement = common::skip::Requirement {
    required_by: Some("SKYRIVER_REQUIRE_DISK"),
    to_run: "run where the temporary directory's file system has 3 GiB free",
};

/// A tmpfs at /dev/shm.
const TMPFS: common::skip::Requirement = common::skip::Requirement {
    required_by: None,
    to_run: "run where /dev/shm is a tmpfs mount",
};

/// Root, to make a directory root cannot write (a read-only bind in a mount namespace).
const ROOT_MOUNTS: common::skip::Requirement = common::skip::Requirement {
    required_by: None,
    to_run: "run as root with unshare(1) and mount(8) allowed, or as another user",
};

/// The number an id was made from (`ObjectId::from_u64`).
fn key(id: &ObjectId) -> u64 {
    u64::from_be_bytes(id.as_bytes()[12..20].try_into().expect("8 bytes"))
}

fn free_bytes(dir: &Path) -> u64 {
    let vfs = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    vfs.blocks_available() as u64 * vfs.fragment_size() as u64
}

fn spilling_daemon(dir: &Path, memory_bytes: u64) -> DaemonHandle {
    std::fs::create_dir(dir.join("spill")).unwrap();
    start_spilling(dir, memory_bytes)
}

/// A daemon spilling to `dir/spill`, which exists.
fn start_spilling(dir: &Path, memory_bytes: u64) -> DaemonHandle {
    let spill_dir = dir.join("spill");
    let mut config = DaemonConfig::new(dir.join("daemon.sock"), memory_bytes);
    config.prefault = false;
    config.spill = Some(SpillConfig {
        dir: spill_dir,
        limit_bytes: None,
    });
    DaemonHandle::start(config).expect("daemon starts")
}

#[test]
fn a_64_mib_daemon_with_a_spill_dir_takes_1_gib_and_returns_every_object() {
    let dir = common::test_dir();
    if free_bytes(dir.path()) < 3 << 30 {
        common::skip::skip(
            "a_64_mib_daemon_with_a_spill_dir_takes_1_gib_and_returns_every_object",
            &DISK,
            "less than 3 GiB free for the spill files",
        );
        return;
    }
    let daemon = spilling_daemon(dir.path(), 64 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    // 1 GiB: 192 objects of 4 MiB (own files) and 4096 of 64 KiB (packed segments).
    let objects: Vec<(ObjectId, usize)> = (0..192)
        .map(|n| (ObjectId::from_u64(n), 4 << 20))
        .chain((0..4096).map(|n| (ObjectId::from_u64(10_000 + n), 64 << 10)))
        .collect();
    let total: usize = objects.iter().map(|(_, len)| len).sum();
    assert_eq!(total, 1 << 30);
    for (id, len) in &objects {
        client.put(*id, &pattern(key(id), *len), b"m").unwrap();
    }
    let stats = client.stats().unwrap();
    assert_eq!(stats.evicted_objects_total, 0, "nothing was forgotten");
    assert!(stats.spill.spilled_objects > 0);
    let listed = client.list().unwrap();
    assert_eq!(listed.len(), objects.len(), "every object is present");
    // Every object comes back with its bytes (most from disk), in another order than written.
    for (id, len) in objects.iter().rev() {
        let object = client.get_one(*id, Some(Duration::from_secs(60))).unwrap();
        assert!(
            object.data() == &pattern(key(id), *len)[..],
            "bytes of {id}"
        );
        assert_eq!(object.metadata(), b"m");
    }
    let stats = client.stats().unwrap();
    assert!(stats.spill.restores_total > 0);
    assert_eq!(stats.spill.objects_lost_total, 0);
    assert_eq!(stats.evicted_objects_total, 0);
}

#[test]
fn a_damaged_spill_file_loses_its_objects_and_never_serves_other_bytes() {
    let dir = common::test_dir();
    let daemon = spilling_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let ids: Vec<ObjectId> = (0..12).map(ObjectId::from_u64).collect();
    for id in &ids {
        client.put(*id, &pattern(key(id), 2 << 20), b"").unwrap();
    }
    // Spilling runs ahead of need: wait for the writes in flight too, so every file is whole.
    common::eventually("objects are spilled and no write is in flight", || {
        let spill = client.stats().unwrap().spill;
        spill.spilled_objects > 0 && spill.spilling_bytes == 0
    });
    // Flip a byte in the middle of every spill file.
    let spill_dir = dir.path().join("spill").join("node-0");
    for entry in std::fs::read_dir(&spill_dir).unwrap() {
        let path = entry.unwrap().path();
        let mut content = std::fs::read(&path).unwrap();
        let at = content.len() / 2;
        content[at] ^= 0x10;
        std::fs::write(&path, content).unwrap();
    }
    let mut lost = 0;
    for id in &ids {
        match client.get_one(*id, Some(Duration::from_secs(30))) {
            Ok(object) => assert!(
                object.data() == &pattern(key(id), 2 << 20)[..],
                "{id} served with other bytes"
            ),
            Err(_) => {
                lost += 1;
                assert!(!client.contains(*id).unwrap(), "a lost {id} is gone");
            }
        }
    }
    assert!(lost > 0, "some object was on the damaged disk");
    assert_eq!(client.stats().unwrap().spill.objects_lost_total, lost);
    // The daemon goes on.
    client
        .put(ObjectId::from_u64(99), b"still here", b"")
        .unwrap();
}

#[test]
fn a_peer_fetching_a_spilled_object_gets_it_restored_on_the_holder() {
    use skyriver::up::{LocalCluster, UpArgs};
    let dir = common::test_dir();
    let spill_dir = dir.path().join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let mut args = UpArgs::new(2, "64MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.spill_dir = Some(spill_dir);
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    let holder = Client::connect(&cluster.sockets[0]).unwrap();
    let requester = Client::connect(&cluster.sockets[1]).unwrap();
    // 128 MiB into a 64 MiB store: the first objects are spilled.
    for n in 0..16u64 {
        holder
            .put(ObjectId::from_u64(n), &pattern(n, 8 << 20), b"")
            .unwrap();
    }
    assert!(holder.stats().unwrap().spill.spilled_objects > 0);
    let id = ObjectId::from_u64(0);
    assert!(holder.contains(id).unwrap(), "a spilled object is present");
    let object = requester
        .fetch_one(id, Some(Duration::from_secs(60)))
        .unwrap();
    assert!(object.data() == &pattern(0, 8 << 20)[..]);
    assert!(holder.stats().unwrap().spill.restores_total > 0);
}

#[test]
fn ls_and_stat_show_the_spill_tier() {
    let dir = common::test_dir();
    let daemon = spilling_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    for n in 0..12u64 {
        client
            .put(ObjectId::from_u64(n), &pattern(n, 2 << 20), b"")
            .unwrap();
    }
    let (ok, stdout, stderr) = common::cli(daemon.socket_path(), &["ls"], None);
    assert!(ok, "{stderr}");
    let listing = String::from_utf8(stdout).unwrap();
    assert!(listing.contains("spilled"), "{listing}");
    let (ok, stdout, stderr) = common::cli(daemon.socket_path(), &["stat"], None);
    assert!(ok, "{stderr}");
    let stat = String::from_utf8(stdout).unwrap();
    assert!(stat.contains("spill tier:"), "{stat}");
}

#[test]
fn a_missing_spill_dir_is_a_clear_error() {
    let dir = common::test_dir();
    let mut config = DaemonConfig::new(dir.path().join("daemon.sock"), 16 << 20);
    config.prefault = false;
    config.spill = Some(SpillConfig {
        dir: dir.path().join("absent"),
        limit_bytes: None,
    });
    let error = DaemonHandle::start(config).err().expect("refused");
    assert!(error.to_string().contains("does not exist"), "{error}");
}

#[test]
fn a_spill_dir_that_is_a_file_is_a_clear_error() {
    let dir = common::test_dir();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let mut config = DaemonConfig::new(dir.path().join("daemon.sock"), 16 << 20);
    config.prefault = false;
    config.spill = Some(SpillConfig {
        dir: file,
        limit_bytes: None,
    });
    let error = DaemonHandle::start(config).err().expect("refused");
    assert!(error.to_string().contains("is not a directory"), "{error}");
}

/// `skyriver daemon` on a socket in `dir` with `--spill-dir spill_dir`, run through `wrapper`
/// (a program and its arguments before skyriver's path; empty: none). Waits for it to exit,
/// or to answer on its socket (then it is stopped); returns whether it exited by itself,
/// its exit status' success and its stderr.
fn run_daemon(dir: &Path, spill_dir: &Path, wrapper: &[&str]) -> (bool, bool, String) {
    use std::process::{Command, Stdio};
    let socket = dir.join("daemon.sock");
    let stderr_path = dir.join("daemon.stderr");
    let skyriver = env!("CARGO_BIN_EXE_skyriver");
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(skyriver);
            command
        }
        None => Command::new(skyriver),
    };
    command
        .args([
            "daemon",
            "--log",
            "warn",
            "--memory",
            "16MiB",
            "--no-prefault",
        ])
        .arg("--socket")
        .arg(&socket)
        .arg("--spill-dir")
        .arg(spill_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    /// Kills the daemon however the test ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(command.spawn().expect("spawn skyriver daemon"));
    let started = std::time::Instant::now();
    let exited = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break Some(status);
        }
        if Client::connect(&socket).is_ok() {
            break None;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon neither exited nor answered"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(child);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    (
        exited.is_some(),
        exited.is_some_and(|s| s.success()),
        stderr,
    )
}

#[test]
fn a_read_only_spill_dir_is_a_clear_error() {
    let test = "a_read_only_spill_dir_is_a_clear_error";
    let dir = common::test_dir();
    let spill_dir = dir.path().join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let spill = spill_dir.to_str().unwrap();
    // Root writes through permission bits: as root, the daemon runs in its own mount
    // namespace where DIR is a read-only bind of itself (gone with the namespace).
    let script = format!(
        "mount --bind '{spill}' '{spill}' && mount -o remount,bind,ro '{spill}' && exec \"$0\" \"$@\""
    );
    let root = nix::unistd::geteuid().is_root();
    let wrapper: Vec<&str> = if root {
        vec!["unshare", "--mount", "sh", "-c", &script]
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&spill_dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        Vec::new()
    };
    let (exited, success, stderr) = run_daemon(dir.path(), &spill_dir, &wrapper);
    if root && (stderr.contains("unshare:") || stderr.contains("mount:")) {
        common::skip::skip(
            test,
            &ROOT_MOUNTS,
            &format!("cannot make a read-only bind as root: {}", stderr.trim()),
        );
        return;
    }
    assert!(exited && !success, "the daemon started: {stderr}");
    assert!(stderr.contains("is not writable"), "{stderr}");
    assert!(
        stderr.contains(spill),
        "the error names the directory: {stderr}"
    );
}

#[test]
fn a_spill_dir_on_tmpfs_starts_with_a_warning() {
    let test = "a_spill_dir_on_tmpfs_starts_with_a_warning";
    let shm = Path::new("/dev/shm");
    let on_tmpfs = nix::sys::statfs::statfs(shm)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    if !on_tmpfs {
        common::skip::skip(test, &TMPFS, "/dev/shm is not a tmpfs mount here");
        return;
    }
    let dir = common::test_dir();
    let spill_dir = tempfile::Builder::new()
        .prefix("skyriver-test-spill")
        .tempdir_in(shm)
        .unwrap();
    let (exited, _, stderr) = run_daemon(dir.path(), spill_dir.path(), &[]);
    assert!(!exited, "the daemon starts: {stderr}");
    assert!(
        stderr.contains("the spill directory is on tmpfs"),
        "a warning at start: {stderr}"
    );
}

#[test]
fn a_restart_without_a_backing_file_removes_the_old_spill_files() {
    let dir = common::test_dir();
    let spill_files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.path().join("spill").join("node-0"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "spill"))
            .collect()
    };
    let daemon = spilling_daemon(dir.path(), 16 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    for n in 0..12u64 {
        client
            .put(ObjectId::from_u64(n), &pattern(n, 2 << 20), b"")
            .unwrap();
    }
    common::eventually("objects are spilled and no write is in flight", || {
        let spill = client.stats().unwrap().spill;
        spill.spilled_objects > 0 && spill.spilling_bytes == 0
    });
    drop(client);
    daemon.stop();
    assert!(
        !spill_files().is_empty(),
        "the stopped daemon left its spill files"
    );

    let daemon = start_spilling(dir.path(), 16 << 20);
    let files = spill_files();
    assert!(files.is_empty(), "old spill files kept: {files:?}");
    let client = Client::connect(daemon.socket_path()).unwrap();
    let spill = client.stats().unwrap().spill;
    assert_eq!((spill.spilled_objects, spill.spilled_bytes), (0, 0));
    assert!(!client.contains(ObjectId::from_u64(0)).unwrap());
}

#[test]
fn up_passes_spill_flags_and_metrics_count_spills_and_restores() {
    use skyriver::up::{LocalCluster, UpArgs};
    let dir = common::test_dir();
    let spill_dir = dir.path().join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let mut args = UpArgs::new(1, "16MiB".parse().unwrap(), Some(dir.path().to_path_buf()));
    args.spill_dir = Some(spill_dir);
    args.spill_limit = Some("1GiB".parse().unwrap());
    args.metrics = true;
    let cluster = LocalCluster::start(&args, Path::new(env!("CARGO_BIN_EXE_skyriver"))).unwrap();
    let scrape = || {
        let (status, text) = common::http_get(cluster.metrics[0], "/metrics").unwrap();
        assert_eq!(status, 200, "{text}");
        text
    };
    let value = |text: &str, series: &str| {
        common::metric_sample(text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let before = scrape();
    assert_eq!(
        value(&before, "skyriver_spill_limit_bytes"),
        (1u64 << 30) as f64
    );
    assert_eq!(value(&before, "skyriver_spills_total"), 0.0);
    assert_eq!(value(&before, "skyriver_restores_total"), 0.0);
    assert_eq!(value(&before, "skyriver_restores_queued"), 0.0);
    for help in before
        .lines()
        .filter(|l| l.starts_with("# HELP skyriver_spill"))
    {
        assert!(!help.contains("  "), "a run of spaces: {help}");
    }

    let client = Client::connect(&cluster.sockets[0]).unwrap();
    // 32 MiB into 16 MiB: the first objects are spilled.
    for n in 0..16u64 {
        client
            .put(ObjectId::from_u64(n), &pattern(n, 2 << 20), b"")
            .unwrap();
    }
    let spilled = scrape();
    assert!(value(&spilled, "skyriver_spills_total") > 0.0, "{spilled}");
    assert!(
        value(&spilled, "skyriver_spilled_objects") > 0.0,
        "{spilled}"
    );
    assert!(value(&spilled, "skyriver_spill_written_bytes_total") >= (2 << 20) as f64);
    assert_eq!(
        value(&spilled, "skyriver_spill_failures_total{kind=\"io\"}"),
        0.0
    );

    let object = client
        .get_one(ObjectId::from_u64(0), Some(Duration::from_secs(30)))
        .unwrap();
    assert!(object.data() == &pattern(0, 2 << 20)[..]);
    drop(object);
    let restored = scrape();
    assert!(
        value(&restored, "skyriver_restores_total") > 0.0,
        "{restored}"
    );
    assert!(value(&restored, "skyriver_restored_bytes_total") >= (2 << 20) as f64);
    assert!(
        restored.contains("skyriver_restore_duration_seconds_count"),
        "{restored}"
    );
}

/// A delete of more spilled objects than the IO queue holds leaves a backlog of discards on
/// the loop; it must drain, or every spill queued behind it waits forever (a put that needs
/// memory then hangs).
#[test]
fn spills_after_a_mass_delete_of_spilled_objects_go_on() {
    let dir = common::test_dir();
    let daemon = spilling_daemon(dir.path(), 4 << 20);
    let client = Client::connect(daemon.socket_path()).unwrap();
    let small: Vec<ObjectId> = (0..2048).map(|n| ObjectId::from_u64(50_000 + n)).collect();
    for id in &small {
        client.put(*id, &pattern(key(id), 4 << 10), b"").unwrap();
    }
    let spilled = client.stats().unwrap().spill.spilled_objects;
    assert!(
        spilled > skyriver_daemon::spill::JOB_QUEUE as u64,
        "more spilled objects ({spilled}) than the IO queue holds"
    );
    for result in client.delete(&small).unwrap() {
        result.unwrap();
    }
    // 8 MiB into 4 MiB of memory: these puts need spills, queued behind the discards.
    let socket = daemon.socket_path().to_path_buf();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let client = Client::connect(&socket).unwrap();
        let large: Vec<ObjectId> = (0..8).map(|n| ObjectId::from_u64(60_000 + n)).collect();
        for id in &large {
            client.put(*id, &pattern(key(id), 1 << 20), b"").unwrap();
        }
        let back = large.iter().all(|id| {
            let object = client.get_one(*id, Some(Duration::from_secs(30))).unwrap();
            object.data() == &pattern(key(id), 1 << 20)[..]
        });
        let _ = done.send(back);
    });
    let back = finished
        .recv_timeout(Duration::from_secs(120))
        .expect("puts needing spills finish after a mass delete (no stalled spill queue)");
    assert!(back, "every object comes back with its bytes");
}
