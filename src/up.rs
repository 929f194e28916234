//! `skyriver up`: a local cluster of N daemons on this machine, for trying Skyriver out (and
//! for the benchmarks and tests that need several daemons).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use crate::client::Client;
use crate::size::{format_bytes, ByteSize};

/// Options of `skyriver up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Number of daemons.
    #[arg(long, short = 'n', default_value_t = 3)]
    pub nodes: u32,
    /// Shared memory of each daemon.
    #[arg(long, short = 'm', default_value = "256MiB")]
    pub memory: ByteSize,
    /// Where the daemons' sockets go [default: a new directory under /tmp]
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Eager/rendezvous switch for every daemon: auto or a size.
    #[arg(long, default_value = "auto")]
    pub eager_threshold: String,
    /// Log filter of the daemons.
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Fabric between the daemons: tcp, or verbs (RDMA; needs --devices).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "verbs"])]
    pub fabric: String,
    /// RDMA devices for the verbs fabric, given to the nodes in turn (e.g. rxe0,rxe1).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Use this directory (redis://HOST:PORT) instead of the built-in one on node 0.
    #[arg(long)]
    pub directory: Option<String>,
    /// More flags for every daemon, e.g. --daemon-arg=--lease-ms=2000.
    #[arg(long = "daemon-arg", allow_hyphen_values = true)]
    pub daemon_args: Vec<String>,
    /// Put each daemon in its own network namespace (root), on a bridge, with its own address.
    #[arg(long)]
    pub netns: bool,
    /// With --netns: shape every node's link, RATE,LATENCY (e.g. 10gbit,50us; tc tbf, and netem
    /// for the latency where the kernel has it).
    #[arg(long, requires = "netns")]
    pub link: Option<crate::netns::LinkShape>,
}

impl UpArgs {
    /// `nodes` daemons of `memory` each, sockets under `dir`, otherwise the defaults.
    pub fn new(nodes: u32, memory: ByteSize, dir: Option<PathBuf>) -> Self {
        Self {
            nodes,
            memory,
            dir,
            eager_threshold: "auto".into(),
            log: "warn".into(),
            directory: None,
            daemon_args: Vec::new(),
            fabric: "tcp".into(),
            devices: Vec::new(),
            netns: false,
            link: None,
        }
    }
}

/// A local cluster; stops its daemons when dropped.
pub struct LocalCluster {
    children: Vec<Option<Child>>,
    /// One Unix socket per node, node 0 first.
    pub sockets: Vec<PathBuf>,
    /// The head's directory address.
    pub head: String,
    /// The namespaces the daemons run in (with --netns).
    pub netns: Option<crate::netns::NetnsCluster>,
}

impl LocalCluster {
    /// Starts `args.nodes` daemons (node 0 is the head) and waits until every one has connected
    /// to every other.
    pub fn start(args: &UpArgs, exe: &std::path::Path) -> Result<Self, String> {
        if args.nodes == 0 {
            return Err("--nodes must be at least 1".into());
        }
        if args.fabric == "verbs" && args.devices.is_empty() {
            return Err("--fabric verbs needs --devices (e.g. rxe0,rxe1)".into());
        }
        let dir = match &args.dir {
            Some(dir) => dir.clone(),
            None => std::env::temp_dir().join(format!("skyriver-up-{}", std::process::id())),
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let netns = match args.netns {
            true => Some(
                crate::netns::NetnsCluster::create(args.nodes, args.link.as_ref())
                    .map_err(|e| e.to_string())?,
            ),
            false => None,
        };
        let head_port = free_loopback_port()?;
        let head = match (&args.directory, &netns) {
            (Some(directory), _) => directory.clone(),
            (None, Some(netns)) => format!("{}:7390", netns.hosts[0].addr),
            (None, None) => format!("127.0.0.1:{head_port}"),
        };
        let token = format!("local-{}-{}", std::process::id(), head_port);
        let mut cluster = Self {
            children: Vec::new(),
            sockets: Vec::new(),
            head: head.clone(),
            netns,
        };
        for node in 0..args.nodes {
            let socket = dir.join(format!("node-{node}.sock"));
            let (mut command, listen) = match &cluster.netns {
                Some(netns) => (
                    netns.command(node as usize, exe),
                    format!("{}:0", netns.hosts[node as usize].addr),
                ),
                None => (Command::new(exe), "127.0.0.1:0".to_string()),
            };
            command
                .args(["daemon", "--fabric", &args.fabric, "--listen", &listen])
                .arg("--no-prefault")
                .args([
                    "--node-id",
                    &node.to_string(),
                    "--memory",
                    &args.memory.0.to_string(),
                ])
                .args([
                    "--eager-threshold",
                    &args.eager_threshold,
                    "--log",
                    &args.log,
                ])
                .arg("--socket")
                .arg(&socket)
                .args(
                    args.devices
                        .get(node as usize % args.devices.len().max(1))
                        .map(|device| ["--device", device.as_str()])
                        .into_iter()
                        .flatten(),
                )
                .args(&args.daemon_args)
                .env("SKYRIVER_CLUSTER_TOKEN", &token)
                .stdin(Stdio::null());
            match (&args.directory, node) {
                (Some(directory), _) => command.args(["--directory", directory]),
                (None, 0) => command.args(["--head", &head]),
                (None, _) => command.args(["--join", &head]),
            };
            let child = command
                .spawn()
                .map_err(|e| format!("cannot start daemon {node}: {e}"))?;
            cluster.children.push(Some(child));
            cluster.sockets.push(socket.clone());
            // The head must serve the directory before the others join.
            if node == 0 {
                wait_for_socket(&socket, Duration::from_secs(30))?;
            }
        }
        for socket in &cluster.sockets {
            wait_for_socket(socket, Duration::from_secs(30))?;
        }
        cluster.wait_connected(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn wait_connected(&self, limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        let want = self.sockets.len();
        loop {
            let mut ready = true;
            for socket in &self.sockets {
                let view = Client::connect(socket)
                    .and_then(|c| c.nodes())
                    .map_err(|e| e.to_string())?;
                ready &= view.members.len() == want && view.members.iter().all(|m| m.connected);
            }
            if ready {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "the {want} daemons did not all connect within {limit:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl LocalCluster {
    /// Kills node `node` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.children.get_mut(node).and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for child in self.children.iter().flatten() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        for child in self.children.iter_mut().flatten() {
            let _ = child.wait();
        }
    }
}

fn wait_for_socket(socket: &std::path::Path, limit: Duration) -> Result<(), String> {
    let started = Instant::now();
    while Client::connect(socket).is_err() {
        if started.elapsed() > limit {
            return Err(format!(
                "no daemon answered on {} within {limit:?}",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A loopback TCP port that was free a moment ago.
pub fn free_loopback_port() -> Result<u16, String> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Runs `skyriver up` in the foreground until Ctrl-C.
pub fn run(args: &UpArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    eprintln!(
        "starting {} daemons with {} each...",
        args.nodes,
        format_bytes(args.memory.0)
    );
    let cluster = LocalCluster::start(args, &exe)?;
    println!(
        "local cluster up: {} nodes, built-in directory at {}",
        cluster.sockets.len(),
        cluster.head
    );
    for (node, socket) in cluster.sockets.iter().enumerate() {
        println!("  node-{node}: export SKYRIVER_SOCKET={}", socket.display());
    }
    if let Some(netns) = &cluster.netns {
        crate::netns::describe(netns);
    }
    println!("try:");
    println!(
        "  id=$(skyriver put --socket {} FILE)",
        cluster.sockets[0].display()
    );
    println!(
        "  skyriver fetch --socket {} $id -o copy",
        cluster.sockets[cluster.sockets.len() - 1].display()
    );
    println!("  skyriver nodes --socket {}", cluster.sockets[0].display());
    println!("Ctrl-C stops the cluster.");
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc_channel(tx)?;
    let _ = rx.recv();
    eprintln!("stopping...");
    drop(cluster);
    Ok(())
}

fn ctrlc_channel(tx: std::sync::mpsc::Sender<()>) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            // SIGTERM too (kill, timeout, a supervisor): stopping must remove what `up` made.
            match signal(SignalKind::terminate()) {
                Ok(mut terminate) => tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                },
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        });
        let _ = tx.send(());
    });
    Ok(())
}
