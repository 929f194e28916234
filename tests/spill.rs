//! The spill tier end to end: a daemon with 64 MiB of memory and a spill directory takes
//! 1 GiB of objects and gives every one back with its bytes; a peer's fetch of a spilled
//! object restores it on the holder; a damaged spill file loses its objects, never serves
//! other bytes.

mod common;
use common::pattern;

use std::path::Path;
use std::time::Duration;

use skyriver_client::{Client, ObjectId};
use skyriver_daemon::spill::SpillConfig;
use skyriver_daemon::{DaemonConfig, DaemonHandle};

const DISK: common::skip::Requirement = common::skip::Requirement {
    required_by: None,
    to_run: "run where the temporary directory's file system has 3 GiB free",
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
    let spill_dir = dir.join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
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
    args.daemon_args = vec![format!("--spill-dir={}", spill_dir.display())];
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
