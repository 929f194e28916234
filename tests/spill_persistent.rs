//! Persistent mode with a spill tier, with real processes: a `skyriver daemon --backing-file
//! --spill-dir` holding four times its memory in objects (most of them spilled) is killed with
//! SIGKILL and restarted with the same flags; every object comes back with its bytes. When a
//! spill file is removed or damaged while the daemon is down, the objects in it are reported
//! lost at the restart (logged, counted in `lost_at_start_total`, shown by `skyriver stat`),
//! and every other object is still served.

mod common;
use common::pattern;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skyriver_client::{Client, ObjectId};

const MEMORY: &str = "16MiB";
/// 64 MiB of objects: 24 of 2 MiB (a file each) and 1024 of 16 KiB (packed in segments).
const LARGE: (u64, usize) = (24, 2 << 20);
const SMALL: (u64, usize) = (1024, 16 << 10);

fn objects() -> Vec<(ObjectId, usize)> {
    (0..LARGE.0)
        .map(|n| (ObjectId::from_u64(n), LARGE.1))
        .chain((0..SMALL.0).map(|n| (ObjectId::from_u64(100_000 + n), SMALL.1)))
        .collect()
}

fn key(id: &ObjectId) -> u64 {
    u64::from_be_bytes(id.as_bytes()[12..20].try_into().expect("8 bytes"))
}

/// A daemon process, killed (SIGKILL) and reaped on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, run: u32) -> Self {
        let socket = dir.join("daemon.sock");
        let _ = std::fs::remove_file(&socket);
        let log = dir.join(format!("daemon-{run}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
            .args([
                "daemon",
                "--log",
                "info",
                "--no-prefault",
                "--memory",
                MEMORY,
            ])
            .arg("--backing-file")
            .arg(dir.join("store"))
            .arg("--spill-dir")
            .arg(dir.join("spill"))
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"))
            .spawn()
            .expect("spawn skyriver daemon");
        let mut daemon = Daemon { child, socket, log };
        let started = Instant::now();
        while Client::connect(&daemon.socket).is_err() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("the daemon exited ({status}): {}", daemon.log_text());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the daemon did not start: {}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connect")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: nothing is flushed or closed.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Puts every object (most of the bytes end up spilled) and waits until the spill writes in
/// flight are done, so the store says which objects are on disk. Returns the spilled ones.
fn fill(daemon: &Daemon) -> Vec<ObjectId> {
    let client = daemon.client();
    for (id, len) in objects() {
        client.put(id, &pattern(key(&id), len), b"meta").unwrap();
    }
    common::eventually("no spill write is in flight", || {
        client.stats().unwrap().spill.spilling_bytes == 0
    });
    let stats = client.stats().unwrap();
    assert_eq!(stats.evicted_objects_total, 0, "nothing was forgotten");
    let spilled: Vec<ObjectId> = client
        .list()
        .unwrap()
        .iter()
        .filter(|summary| summary.tier.name() == "spilled")
        .map(|summary| summary.info.id)
        .collect();
    let total: usize = objects().iter().map(|(_, len)| len).sum();
    assert!(
        stats.spill.spilled_bytes > total as u64 / 2,
        "most bytes are spilled: {} of {total}",
        stats.spill.spilled_bytes
    );
    spilled
}

fn spill_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("spill").join("node-0"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "spill"))
        .collect();
    files.sort();
    files
}

#[test]
fn spilled_objects_survive_a_sigkill_and_come_back_with_their_bytes() {
    let dir = common::test_dir();
    std::fs::create_dir(dir.path().join("spill")).unwrap();
    let daemon = Daemon::start(dir.path(), 1);
    let spilled = fill(&daemon);
    daemon.kill();

    let daemon = Daemon::start(dir.path(), 2);
    let client = daemon.client();
    let listed = client.list().unwrap();
    assert_eq!(listed.len(), objects().len(), "every object is present");
    for id in &spilled {
        assert!(client.contains(*id).unwrap(), "spilled {id} is present");
    }
    let still_spilled = listed
        .iter()
        .filter(|summary| summary.tier.name() == "spilled")
        .count();
    assert!(still_spilled > 0, "spilled objects are back as spilled");
    for (id, len) in objects().iter().rev() {
        let object = client.get_one(*id, Some(Duration::from_secs(60))).unwrap();
        assert!(
            object.data() == &pattern(key(id), *len)[..],
            "bytes of {id}"
        );
        assert_eq!(object.metadata(), b"meta");
    }
    let stats = client.stats().unwrap();
    assert!(
        stats.spill.restores_total > 0,
        "spilled objects were restored"
    );
    assert_eq!(stats.spill.objects_lost_total, 0);
}

/// The object a large object's spill file holds (its header names it).
fn large_file_object(path: &Path) -> ObjectId {
    let header = std::fs::read(path).unwrap();
    let mut id = [0u8; 20];
    id.copy_from_slice(&header[16..36]);
    ObjectId(id)
}

#[test]
fn spill_files_removed_or_damaged_while_down_lose_their_objects_counted_and_only_those() {
    let dir = common::test_dir();
    std::fs::create_dir(dir.path().join("spill")).unwrap();
    let daemon = Daemon::start(dir.path(), 1);
    let spilled = fill(&daemon);
    daemon.kill();

    // One large object's file removed, another's header damaged: each names exactly one
    // spilled object.
    let mut large = spill_files(dir.path())
        .into_iter()
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("large-"))
        })
        .filter(|path| spilled.contains(&large_file_object(path)));
    let removed = large.next().expect("a large object's spill file");
    let damaged = large.next().expect("a second large object's spill file");
    let lost = [large_file_object(&removed), large_file_object(&damaged)];
    std::fs::remove_file(&removed).unwrap();
    let mut content = std::fs::read(&damaged).unwrap();
    content[60] ^= 0x5a; // the header's checksum
    std::fs::write(&damaged, content).unwrap();

    let daemon = Daemon::start(dir.path(), 2);
    let client = daemon.client();
    let log = daemon.log_text();
    for lost_id in lost {
        assert!(
            !client.contains(lost_id).unwrap(),
            "the object of the removed or damaged file is reported gone"
        );
        assert!(
            client.get_one(lost_id, Some(Duration::ZERO)).is_err(),
            "the object of the removed or damaged file is not served"
        );
        assert!(
            log.contains("spilled object is lost") && log.contains(&lost_id.to_string()),
            "the loss is logged with the object's id: {log}"
        );
    }
    let stats = client.stats().unwrap();
    assert_eq!(
        stats.spill.lost_at_start_total, 2,
        "both losses at start are counted"
    );
    assert_eq!(
        stats.spill.objects_lost_total, 0,
        "no restore has failed (yet)"
    );
    let stat = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .arg("stat")
        .arg("--socket")
        .arg(&daemon.socket)
        .output()
        .expect("run skyriver stat");
    let stat = String::from_utf8_lossy(&stat.stdout);
    assert!(
        stat.contains("(2 more at start)"),
        "skyriver stat shows the losses at start: {stat}"
    );
    assert_eq!(client.list().unwrap().len(), objects().len() - 2);
    for (id, len) in objects() {
        if lost.contains(&id) {
            continue;
        }
        let object = client.get_one(id, Some(Duration::from_secs(60))).unwrap();
        assert!(
            object.data() == &pattern(key(&id), len)[..],
            "bytes of {id}"
        );
    }
}
