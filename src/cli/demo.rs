//! `skyriver demo`: a guided tour on a throwaway daemon (and a two-node cluster).

#[allow(unused_imports)]
use super::*;

pub(super) fn demo() -> Result<(), CliError> {
    println!("starting a daemon with 256 MiB of shared memory on a private socket...");
    let daemon = crate::bench::ChildDaemon::start(256 << 20)?;
    println!("  socket: {}", daemon.socket().display());
    let writer = Client::connect(daemon.socket())?;
    let reader = Client::connect(daemon.socket())?;

    let greeting = ObjectId::from_u64(1);
    writer.create_and_seal(greeting, b"hello from skyriver", b"text/plain")?;
    let object = reader.get_one(greeting, Some(Duration::ZERO))?;
    println!(
        "put then get {greeting}: {:?} (metadata {:?})",
        String::from_utf8_lossy(object.data()),
        String::from_utf8_lossy(object.metadata())
    );
    drop(object);

    let big = ObjectId::from_u64(2);
    let size = 64usize << 20;
    let started = std::time::Instant::now();
    let mut builder = writer.create(big, size as u64, 0)?;
    for (i, chunk) in builder.data_mut().chunks_mut(4096).enumerate() {
        chunk.fill(i as u8);
    }
    builder.seal()?;
    let wrote = started.elapsed();
    let started = std::time::Instant::now();
    let object = reader.get_one(big, Some(Duration::ZERO))?;
    let got = started.elapsed();
    let intact = object
        .data()
        .chunks(4096)
        .enumerate()
        .all(|(i, c)| c.iter().all(|&b| b == i as u8));
    println!(
        "wrote {} in shared memory in {wrote:.1?}; another client mapped it in {got:.1?} (zero-copy), bytes intact: {intact}",
        format_bytes(size as u64)
    );
    drop(object);

    let waiter = {
        let socket = daemon.socket().to_path_buf();
        std::thread::spawn(move || {
            let client = Client::connect(&socket)?;
            let object = client.get_one(ObjectId::from_u64(3), Some(Duration::from_secs(10)))?;
            Ok::<_, ClientError>(object.data().to_vec())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    writer.create_and_seal(ObjectId::from_u64(3), b"worth the wait", b"")?;
    let waited = waiter.join().map_err(|_| CliError::WaiterPanicked)??;
    println!(
        "a blocked get woke up at seal and read {:?}",
        String::from_utf8_lossy(&waited)
    );

    let stats = reader.stats()?;
    println!(
        "store: {} objects, {} of {} used",
        stats.object_count,
        format_bytes(stats.allocated_bytes),
        format_bytes(stats.capacity_bytes)
    );
    println!("stopping the daemon.");
    drop(daemon);
    println!();
    demo_cluster()?;
    println!(
        "Next: `skyriver daemon` in one terminal and `skyriver put FILE` in another, or \
         `skyriver up` for a local cluster."
    );
    Ok(())
}

/// The second half of the demo: what Skyriver exists for, objects moving between two nodes.
pub(super) fn demo_cluster() -> Result<(), CliError> {
    let exe = crate::self_exe().map_err(CliError::OwnPath)?;
    let dir = tempfile_dir("skyriver-demo")?;
    let mut up = crate::up::UpArgs::new(2, ByteSize(192 << 20), Some(dir.path.clone()));
    // The nodes see each other leave when the demo stops them: not worth a warning here.
    up.log = "error".into();
    // Verbs when this machine has RDMA devices, TCP otherwise.
    let devices = skyriver_transport::verbs::list_devices().unwrap_or_default();
    if !devices.is_empty() {
        up.fabric = "verbs".into();
        up.devices = devices.iter().take(2).cloned().collect();
    }
    println!(
        "starting a two-node cluster on this machine (built-in directory, {} fabric)...",
        up.fabric
    );
    let cluster = match crate::up::LocalCluster::start(&up, &exe) {
        Ok(cluster) => cluster,
        Err(e) if up.fabric == "verbs" => {
            println!("  the verbs fabric did not start ({e}); using TCP instead");
            up.fabric = "tcp".into();
            up.devices.clear();
            crate::up::LocalCluster::start(&up, &exe)?
        }
        Err(e) => return Err(e.into()),
    };
    let holder = Client::connect(&cluster.sockets[0])?;
    let requester = Client::connect(&cluster.sockets[1])?;
    let view = requester.nodes()?;
    let threshold = view
        .members
        .iter()
        .find(|m| m.node != view.node)
        .and_then(|m| {
            println!("  link: {}", m.link);
            m.eager_threshold_bytes
        });
    for (id, size) in [
        (ObjectId::from_u64(10), 4usize << 10),
        (ObjectId::from_u64(11), 32 << 20),
    ] {
        let mut writer = holder.create(id, size as u64, 0)?;
        for (i, b) in writer.data_mut().iter_mut().enumerate() {
            *b = (i as u64).wrapping_mul(0x9e37_79b9) as u8 ^ (i >> 12) as u8;
        }
        writer.seal()?;
        let before = requester.metrics()?.counters.transfer_outcomes;
        let started = std::time::Instant::now();
        let object = requester.fetch_one(id, Some(Duration::from_secs(30)))?;
        let took = started.elapsed();
        let intact = object
            .data()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i as u64).wrapping_mul(0x9e37_79b9) as u8 ^ (i >> 12) as u8);
        // The path the requester's core took, from its own counters.
        let after = requester.metrics()?.counters.transfer_outcomes;
        let path = if after.eager_ok > before.eager_ok {
            "eager: the bytes came in two-sided messages"
        } else if after.rendezvous_ok > before.rendezvous_ok {
            "rendezvous: node-1 pulled the bytes with one-sided READs into its store"
        } else {
            "no transfer counted"
        };
        println!(
            "put {} on node-0, fetched on node-1 in {took:.1?} ({:.0} MB/s), {path}; bytes match: {intact}",
            format_bytes(size as u64),
            size as f64 / took.as_secs_f64() / 1e6,
        );
        if !intact {
            return Err(CliError::CopyDiffers(id));
        }
    }
    if let Some(threshold) = threshold {
        println!(
            "  (this link's eager threshold, chosen from measured costs: {})",
            format_bytes(threshold)
        );
    }
    println!("stopping the cluster.");
    drop(cluster);
    Ok(())
}

/// A directory under the system temp dir, removed on drop.
pub(super) struct TempDir {
    pub(super) path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub(super) fn tempfile_dir(prefix: &str) -> Result<TempDir, CliError> {
    let path = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&path).map_err(file_error("create", &path))?;
    Ok(TempDir { path })
}
