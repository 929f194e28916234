//! Crash tests of persistent mode with real processes: a `skyriver daemon --backing-file` runs
//! a workload of creates, seals, deletes, aborts and evictions (explicit, and implicit when a
//! create needs room) and is killed with SIGKILL at a random point, over and over. After each
//! restart the test checks that exactly the objects whose seal returned are present (unless a
//! delete or eviction of them was in flight), with the right bytes; that no deleted, evicted,
//! aborted or unsealed object reappears; and that space accounting is exact.
//!
//! `SKYRIVER_CRASH_SEED` replays a run (the kill points are timing-driven, so a replay repeats
//! the workload and the kill delays, not the exact instants); `SKYRIVER_CRASH_KILLS` sets the
//! number of kills (default 300); `SKYRIVER_CRASH_DURABILITY=async` runs the async mode, where
//! seals that returned within the commit interval before a kill may be lost but never corrupt.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use skyriver_client::{Client, ObjectId};

const ARENA: &str = "4MiB";
const ALIGNMENT: u64 = 64;

/// What the test knows about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Its seal returned and nothing removed it: must be present.
    Sealed,
    /// Its seal, or a delete or eviction of it, was in flight at the kill: present or not, but
    /// never with other bytes.
    Maybe,
    /// Deleted, evicted, aborted or never sealed: must not be present.
    Gone,
}

#[derive(Debug, Clone, Copy)]
struct Object {
    data_size: u64,
    metadata_size: u64,
    known: Known,
}

fn byte_at(id: ObjectId, i: u64) -> u8 {
    let seed = u64::from_le_bytes(id.0[12..20].try_into().unwrap());
    (seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(i * 31)
        >> 24) as u8
}

fn fill(id: ObjectId, bytes: &mut [u8], salt: u64) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = byte_at(id, i as u64 + salt);
    }
}

fn expected(id: ObjectId, len: u64, salt: u64) -> Vec<u8> {
    let mut bytes = vec![0; len as usize];
    fill(id, &mut bytes, salt);
    bytes
}

fn block_len(object: &Object) -> u64 {
    (object.data_size + object.metadata_size)
        .max(1)
        .div_ceil(ALIGNMENT)
        * ALIGNMENT
}

struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
}

fn start_daemon(dir: &Path, durability: &str) -> Daemon {
    let socket = dir.join("daemon.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args([
            "daemon",
            "--log",
            "warn",
            "--no-prefault",
            "--memory",
            ARENA,
        ])
        .arg("--backing-file")
        .arg(dir.join("store"))
        .args(["--durability", durability, "--socket"])
        .arg(&socket)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn skyriver daemon");
    let started = Instant::now();
    while !socket.exists() || Client::connect(&socket).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    Daemon {
        child: Some(child),
        socket,
    }
}

/// Checks the restarted store against the model and folds what it found back in.
fn check_after_restart(
    client: &Client,
    model: &mut BTreeMap<ObjectId, Object>,
    lost_allowed: bool,
    context: &str,
) -> (u64, u64) {
    let listed = client.list().unwrap();
    let mut present = BTreeMap::new();
    for summary in &listed {
        let id = summary.info.id;
        assert!(summary.sealed, "{context}: unsealed {id} came back");
        assert_eq!(summary.ref_count, 0, "{context}: {id} is held");
        let object = model
            .get(&id)
            .unwrap_or_else(|| panic!("{context}: {id} was never created"));
        assert_ne!(
            object.known,
            Known::Gone,
            "{context}: {id} came back after it was deleted, evicted, aborted or never sealed"
        );
        assert_eq!(summary.info.data_size, object.data_size, "{context}: {id}");
        assert_eq!(
            summary.info.metadata_size, object.metadata_size,
            "{context}: {id}"
        );
        let buffer = client.get_one(id, Some(Duration::ZERO)).unwrap();
        assert!(
            buffer.data() == expected(id, object.data_size, 0).as_slice(),
            "{context}: the data of {id} is corrupt"
        );
        assert!(
            buffer.metadata() == expected(id, object.metadata_size, 7).as_slice(),
            "{context}: the metadata of {id} is corrupt"
        );
        drop(buffer);
        present.insert(id, ());
    }
    let mut lost = 0;
    for (id, object) in model.iter_mut() {
        let here = present.contains_key(id);
        match object.known {
            Known::Sealed if !here => {
                assert!(
                    lost_allowed,
                    "{context}: {id} was sealed (the seal returned) and is lost"
                );
                // Only an eviction by the create in flight, or an async seal, can explain it.
                lost += 1;
                object.known = Known::Gone;
            }
            Known::Maybe => {
                object.known = if here { Known::Sealed } else { Known::Gone };
            }
            _ => {}
        }
    }
    let stats = client.stats().unwrap();
    let live: Vec<Object> = model
        .values()
        .filter(|o| o.known == Known::Sealed)
        .copied()
        .collect();
    assert_eq!(stats.object_count, live.len() as u64, "{context}: objects");
    assert_eq!(stats.sealed_count, live.len() as u64, "{context}: sealed");
    let expected_bytes: u64 = live.iter().map(block_len).sum();
    assert_eq!(
        stats.allocated_bytes, expected_bytes,
        "{context}: space accounting"
    );
    // Forget what is gone for good, so the model stays small.
    model.retain(|_, o| o.known != Known::Gone);
    (live.len() as u64, lost)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    Nothing,
    /// A create (which may evict) or an explicit evict.
    Evicting,
    /// A create or evict returned, but the listing of what it evicted was cut by the kill.
    EvictedUnlisted,
    Other,
}

/// After a request that may evict returned: sealed objects no longer listed were evicted, and
/// their removal is durable. `false` if the daemon is gone.
fn forget_evicted(client: &Client, model: &mut BTreeMap<ObjectId, Object>) -> bool {
    let Ok(list) = client.list() else {
        return false;
    };
    let listed: std::collections::BTreeSet<ObjectId> = list.iter().map(|s| s.info.id).collect();
    for (id, object) in model.iter_mut() {
        if object.known == Known::Sealed && !listed.contains(id) {
            object.known = Known::Gone;
        }
    }
    true
}

/// Runs operations until the daemon dies; returns what was in flight and how many ops ran.
fn run_workload(
    client: &Client,
    model: &mut BTreeMap<ObjectId, Object>,
    rng: &mut rand::rngs::StdRng,
    next_id: &mut u64,
) -> (InFlight, u64) {
    let mut ops = 0;
    loop {
        ops += 1;
        let roll = rng.gen_range(0..100);
        let live: Vec<ObjectId> = model
            .iter()
            .filter(|(_, o)| o.known == Known::Sealed)
            .map(|(&id, _)| id)
            .collect();
        if roll < 55 || live.is_empty() {
            // Create, fill, seal; now and then leave it unsealed or abort it.
            *next_id += 1;
            let id = ObjectId::from_u64(*next_id);
            let data_size = match rng.gen_range(0..10) {
                0..=3 => rng.gen_range(0..200),
                4..=7 => rng.gen_range(200..20_000),
                _ => rng.gen_range(20_000..600_000),
            };
            let metadata_size = rng.gen_range(0..16);
            let fate = rng.gen_range(0..20);
            model.insert(
                id,
                Object {
                    data_size,
                    metadata_size,
                    known: Known::Gone,
                },
            );
            let created = client.create(id, data_size, metadata_size);
            if matches!(created, Err(ref e) if !matches!(e, skyriver_client::ClientError::Store(_)))
            {
                return (InFlight::Evicting, ops);
            }
            // The create returned: whatever it evicted is gone for good. A create that fails
            // with OutOfMemory may have evicted too (free space too fragmented to fit).
            if !forget_evicted(client, model) {
                // What the request evicted is durable but unknown.
                return (InFlight::EvictedUnlisted, ops);
            }
            let Ok(mut writer) = created else {
                continue; // out of memory
            };
            fill(id, writer.data_mut(), 0);
            fill(id, writer.metadata_mut(), 7);
            match fate {
                0 => {
                    // Left unsealed: the writer's drop aborts it, unless the kill comes first.
                    std::mem::forget(writer);
                }
                1 => {
                    if writer.abort().is_err() {
                        return (InFlight::Other, ops);
                    }
                }
                _ => {
                    model.get_mut(&id).unwrap().known = Known::Maybe;
                    if writer.seal().is_err() {
                        return (InFlight::Other, ops);
                    }
                    model.get_mut(&id).unwrap().known = Known::Sealed;
                }
            }
        } else if roll < 72 {
            let id = live[rng.gen_range(0..live.len())];
            model.get_mut(&id).unwrap().known = Known::Maybe;
            match client.delete(&[id]) {
                Ok(results) => {
                    assert!(results[0].is_ok(), "delete of {id}: {:?}", results[0]);
                    model.get_mut(&id).unwrap().known = Known::Gone;
                }
                Err(_) => return (InFlight::Other, ops),
            }
        } else if roll < 95 {
            let id = live[rng.gen_range(0..live.len())];
            let object = model[&id];
            match client.get_one(id, Some(Duration::ZERO)) {
                Ok(buffer) => assert!(
                    buffer.data() == expected(id, object.data_size, 0).as_slice(),
                    "the data of {id} changed while the daemon ran"
                ),
                Err(skyriver_client::ClientError::Store(error)) => {
                    panic!("{id} is sealed but get says {error}")
                }
                Err(_) => return (InFlight::Other, ops),
            }
        } else {
            let bytes = rng.gen_range(1..1_000_000);
            if client.evict(bytes).is_err() {
                return (InFlight::Evicting, ops);
            }
            if !forget_evicted(client, model) {
                // What the request evicted is durable but unknown.
                return (InFlight::EvictedUnlisted, ops);
            }
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn crash_loop(durability: &str, seed: u64, kills: u64) {
    println!(
        "persistence crash loop: seed {seed}, {kills} kills, durability {durability}, arena {ARENA}\n\
         replay: SKYRIVER_CRASH_SEED={seed} SKYRIVER_CRASH_KILLS={kills} \
         SKYRIVER_CRASH_DURABILITY={durability} cargo test --test persistence_crash -- --nocapture"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // tmpfs when there is one: the crash semantics of SIGKILL are the same, and it is fast.
    let base = Path::new("/dev/shm");
    let dir = if base.is_dir() {
        tempfile::Builder::new()
            .prefix("skyriver-crash")
            .tempdir_in(base)
            .unwrap()
    } else {
        common::test_dir()
    };
    let started = Instant::now();
    let mut model = BTreeMap::new();
    let mut next_id = 0;
    let mut in_flight = InFlight::Nothing;
    let (mut total_ops, mut total_lost, mut most_live) = (0, 0, 0);
    for kill in 0..=kills {
        let mut daemon = start_daemon(dir.path(), durability);
        let client = Client::connect(&daemon.socket).unwrap();
        let context = format!("seed {seed}, after kill {kill}");
        let lost_allowed = matches!(in_flight, InFlight::Evicting | InFlight::EvictedUnlisted)
            || durability == "async";
        let (live, lost) = check_after_restart(&client, &mut model, lost_allowed, &context);
        total_lost += lost;
        if lost > 0 {
            println!("kill {kill}: {lost} sealed objects evicted by {in_flight:?} are gone");
        }
        most_live = most_live.max(live);
        if kill == kills {
            break;
        }
        let delay = Duration::from_micros(rng.gen_range(0..60_000));
        let mut child = daemon.child.take().expect("the daemon runs");
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        });
        let (flight, ops) = run_workload(&client, &mut model, &mut rng, &mut next_id);
        in_flight = flight;
        total_ops += ops;
        drop(client);
        killer.join().unwrap();
    }
    println!(
        "persistence crash loop: {kills} kills, {total_ops} operations, at most {most_live} live \
         objects, {total_lost} sealed objects missing after an in-flight eviction{}, \
         {:.1} s; seed {seed}",
        if durability == "async" {
            " or async seal"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn seed() -> u64 {
    env_or(
        "SKYRIVER_CRASH_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    )
}

/// The CI loop: `--durability seal`, a few hundred kills.
#[test]
fn sealed_objects_survive_sigkill() {
    let durability = std::env::var("SKYRIVER_CRASH_DURABILITY").unwrap_or_else(|_| "seal".into());
    crash_loop(&durability, seed(), env_or("SKYRIVER_CRASH_KILLS", 300));
}

/// A shorter loop in `--durability async`: recent seals may be lost, nothing is corrupt and
/// nothing deleted comes back.
#[test]
fn async_durability_never_corrupts() {
    if std::env::var("SKYRIVER_CRASH_DURABILITY").is_ok() {
        return; // The main loop runs the requested mode.
    }
    crash_loop(
        "async",
        seed(),
        env_or("SKYRIVER_CRASH_KILLS", 300u64).div_ceil(5),
    );
}

fn spawn(args: &[std::ffi::OsString]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_skyriver"))
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn skyriver daemon")
}

fn wait_for_socket(socket: &Path) {
    let started = Instant::now();
    while Client::connect(socket).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A persistent node of a cluster is killed and restarted: the objects it recovers are
/// published to the directory again, and another node fetches them from it.
#[test]
fn recovered_objects_are_republished_in_a_cluster() {
    let dir = common::test_dir();
    let port = skyriver::up::free_loopback_port().unwrap();
    let head = format!("127.0.0.1:{port}");
    let head_socket = dir.path().join("head.sock");
    let node_socket = dir.path().join("node.sock");
    let backing = dir.path().join("node-store");
    let common_args = [
        "daemon",
        "--log",
        "warn",
        "--no-prefault",
        "--memory",
        "64MiB",
    ];
    let os = |args: &[&str]| -> Vec<std::ffi::OsString> { args.iter().map(|a| a.into()).collect() };
    let head_args: Vec<std::ffi::OsString> = os(&common_args)
        .into_iter()
        .chain(os(&[
            "--node-id",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--head",
            &head,
        ]))
        .chain(["--socket".into(), head_socket.clone().into_os_string()])
        .collect();
    let node_args: Vec<std::ffi::OsString> = os(&common_args)
        .into_iter()
        .chain(os(&[
            "--node-id",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--join",
            &head,
        ]))
        .chain([
            "--backing-file".into(),
            backing.clone().into_os_string(),
            "--socket".into(),
            node_socket.clone().into_os_string(),
        ])
        .collect();
    let _head = Daemon {
        child: Some(spawn(&head_args)),
        socket: head_socket.clone(),
    };
    wait_for_socket(&head_socket);
    let mut node = Daemon {
        child: Some(spawn(&node_args)),
        socket: node_socket.clone(),
    };
    wait_for_socket(&node_socket);

    let ids = [ObjectId::from_u64(1), ObjectId::from_u64(2)];
    let sizes = [1 << 20, 300];
    {
        let holder = Client::connect(&node_socket).unwrap();
        for (&id, &size) in ids.iter().zip(&sizes) {
            holder
                .create_and_seal(id, &expected(id, size, 0), b"m")
                .unwrap();
        }
    }
    let requester = Client::connect(&head_socket).unwrap();
    let held_by_node_1 = |id: ObjectId| {
        requester
            .locate(id)
            .is_ok_and(|located| located.holders.contains(&skyriver_client::NodeId(1)))
    };
    common::eventually("the seals are published", || {
        ids.iter().all(|&id| held_by_node_1(id))
    });

    let mut child = node.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    common::eventually("the dead node's objects are withdrawn", || {
        ids.iter().all(|&id| !held_by_node_1(id))
    });

    node.child = Some(spawn(&node_args));
    wait_for_socket(&node_socket);
    common::eventually("the recovered objects are published again", || {
        ids.iter().all(|&id| held_by_node_1(id))
    });
    for (&id, &size) in ids.iter().zip(&sizes) {
        let object = requester
            .fetch_one(id, Some(Duration::from_secs(30)))
            .unwrap();
        assert!(
            object.data() == expected(id, size, 0).as_slice(),
            "bytes of {id}"
        );
        assert_eq!(object.metadata(), b"m");
    }
}
