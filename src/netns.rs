//! Hosts in network namespaces: a cluster on one machine whose nodes talk through real network
//! stacks (root only).
//!
//! A [`NetnsCluster`] holds N namespaces `skyriver-S-I`, each with one veth pair whose outer end
//! joins a bridge `skyrbrS` and whose inner end is `eth0` with the address `10.213.S.(I+1)/24`.
//! `S` is a slot (0–255) owned through an exclusive lock on `/run/skyriver-netns/slot-S.lock`:
//! the lock is the only record of ownership, so a run killed with SIGKILL leaves a slot whose
//! lock nobody holds, and [`NetnsCluster::create`] clears every such slot before it makes its
//! own (processes left in the namespaces are killed, the namespaces and the bridge deleted).
//! The bridge itself has `10.213.S.254`, the host's address on that network, so the host
//! reaches every node (e.g. its metrics endpoint) directly; the nodes talk to each other only
//! through the bridge, not through the host's routing.
//!
//! Links can be shaped ([`LinkShape`], `10gbit,50us`): a token bucket (`tc tbf`) on both ends
//! of every veth limits each node's bandwidth in each direction, and, where the kernel has the
//! `netem` qdisc, the inner end also delays every packet by the latency (one way per link, so a
//! round trip between two nodes pays it twice). Without `netem` the latency is reported as not
//! applied, never silently dropped.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Where slot locks live (a tmpfs, emptied at boot like the namespaces themselves).
const LOCK_DIR: &str = "/run/skyriver-netns";
/// Slots, so clusters of concurrent runs get distinct names and subnets.
const SLOTS: u16 = 256;
/// Most nodes in one cluster (addresses .1 to .200 of the slot's /24).
pub const MAX_NODES: u32 = 200;
/// The host's address on a slot's /24 (on the bridge).
const HOST_OCTET: u8 = 254;

/// Why a namespace cluster could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// This process cannot create namespaces at all.
    #[error("network namespaces are not available here: {0}")]
    Unsupported(#[from] NetnsUnavailable),
    /// A tool is missing, or every slot is taken.
    #[error("network namespaces are not available here: {0}")]
    Unavailable(String),
    /// An `ip` or `tc` command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed.
        stderr: String,
    },
    /// A bad `--link` value.
    #[error("--link {0}")]
    BadLink(String),
    /// A file or lock operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Shaping of every node's link: a rate, and a one-way latency where the kernel can add one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkShape {
    /// Bandwidth of each direction, bits per second.
    pub rate_bits_per_sec: Option<u64>,
    /// One-way latency added on each node's link.
    pub latency: Option<Duration>,
    /// As given, e.g. `10gbit,50us`.
    pub text: String,
}

impl std::str::FromStr for LinkShape {
    type Err = String;

    /// `RATE`, `LATENCY` or `RATE,LATENCY`: rates in `bit`, `kbit`, `mbit`, `gbit` (decimal, as
    /// tc), latencies in `us`, `ms` or `s`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut shape = Self {
            rate_bits_per_sec: None,
            latency: None,
            text: text.to_string(),
        };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let lower = part.to_ascii_lowercase();
            let split = lower
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(lower.len());
            let (number, unit) = lower.split_at(split);
            let value: f64 = number.parse().map_err(|_| {
                format!("{part:?}: expected a number and a unit, like 10gbit or 50us")
            })?;
            let rate_unit = match unit {
                "bit" => Some(1.0),
                "kbit" => Some(1e3),
                "mbit" => Some(1e6),
                "gbit" => Some(1e9),
                _ => None,
            };
            let latency_unit = match unit {
                "us" => Some(1e-6),
                "ms" => Some(1e-3),
                "s" => Some(1.0),
                _ => None,
            };
            match (rate_unit, latency_unit) {
                (Some(scale), _) if shape.rate_bits_per_sec.is_none() && value > 0.0 => {
                    shape.rate_bits_per_sec = Some((value * scale) as u64)
                }
                (_, Some(scale)) if shape.latency.is_none() => {
                    shape.latency = Some(Duration::from_secs_f64(value * scale))
                }
                _ => {
                    return Err(format!(
                        "{part:?}: expected one rate (10gbit, 100mbit) and one latency (50us, 1ms)"
                    ))
                }
            }
        }
        if shape.rate_bits_per_sec.is_none() && shape.latency.is_none() {
            return Err(format!(
                "{text:?}: expected RATE,LATENCY such as 10gbit,50us"
            ));
        }
        Ok(shape)
    }
}

impl std::fmt::Display for LinkShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// What shaping the links actually got.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AppliedShape {
    /// Rate of each direction of each node's link, bits per second (None: unshaped).
    pub rate_bits_per_sec: Option<u64>,
    /// One-way latency added per link, microseconds (None: none asked for, or not possible).
    pub latency_us: Option<f64>,
    /// Why a requested latency was not applied.
    pub latency_not_applied: Option<String>,
}

/// One host: a namespace with one address.
#[derive(Debug, Clone)]
pub struct NetnsHost {
    /// Namespace name (`ip netns exec NAME …`).
    pub namespace: String,
    /// Its address on the cluster's bridge.
    pub addr: Ipv4Addr,
    /// The outer end of its veth pair, in the host's namespace (on the bridge).
    pub outer_veth: String,
}

/// N namespaces on one bridge; everything is removed when dropped.
#[derive(Debug)]
pub struct NetnsCluster {
    slot: u16,
    bridge: String,
    /// The hosts, node 0 first.
    pub hosts: Vec<NetnsHost>,
    /// The shaping in effect.
    pub shape: AppliedShape,
    _lock: nix::fcntl::Flock<File>,
}

/// Slots of this process's live clusters, torn down by [`remove_on_signal`].
static LIVE_SLOTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());
/// Directories [`remove_on_signal`] removes too (sockets of the cluster's daemons).
static SIGNAL_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Has [`remove_on_signal`] also remove `dir` if the process is interrupted.
pub fn remove_dir_on_signal(dir: PathBuf) {
    SIGNAL_DIRS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(dir);
}

fn namespace_name(slot: u16, node: u32) -> String {
    format!("skyriver-{slot}-{node}")
}

fn bridge_name(slot: u16) -> String {
    format!("skyrbr{slot}")
}

fn outer_veth_name(slot: u16, node: u32) -> String {
    format!("skyr{slot}-{node}")
}

/// Runs `program args…`; an error carries its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, NetnsError> {
    let output = Command::new(program).args(args).output().map_err(|e| {
        NetnsError::Unavailable(format!("cannot run {program} ({e}); install iproute2"))
    })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

fn ip(args: &[&str]) -> Result<String, NetnsError> {
    run("ip", args)
}

/// Why this process cannot create network namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NetnsUnavailable {
    /// Only root may create namespaces and veth links.
    #[error("not running as root")]
    NotRoot,
    /// `ip` does the work.
    #[error("the `ip` command (iproute2) is not installed")]
    NoIpCommand,
    /// The kernel was built without them.
    #[error("the kernel has no network namespaces")]
    NoKernelSupport,
}

/// Whether this process may create namespaces (root with iproute2), with the reason if not.
pub fn available() -> Result<(), NetnsUnavailable> {
    if !nix::unistd::geteuid().is_root() {
        return Err(NetnsUnavailable::NotRoot);
    }
    match Command::new("ip").arg("-V").output() {
        Ok(output) if output.status.success() => {}
        _ => return Err(NetnsUnavailable::NoIpCommand),
    }
    if !Path::new("/proc/self/ns/net").exists() {
        return Err(NetnsUnavailable::NoKernelSupport);
    }
    Ok(())
}

fn lock_path(slot: u16) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("slot-{slot}.lock"))
}

/// Takes the slot's lock if nobody holds it.
fn try_lock(slot: u16) -> Result<Option<nix::fcntl::Flock<File>>, NetnsError> {
    let path = lock_path(slot);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| NetnsError::Io {
            what: format!("cannot open {}", path.display()),
            source,
        })?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(NetnsError::Io {
            what: format!("cannot lock {}", path.display()),
            source: errno.into(),
        }),
    }
}

/// Everything of `slot` that exists: its namespaces (with the processes in them) and bridge.
fn remove_slot(slot: u16) {
    let prefix = format!("skyriver-{slot}-");
    let namespaces = ip(&["netns", "list"]).unwrap_or_default();
    for name in namespaces
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| {
            name.strip_prefix(&prefix)
                .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit()))
        })
    {
        // Daemons left by a killed run: a namespace lives on while a process is in it.
        for pid in ip(&["netns", "pids", name]).unwrap_or_default().lines() {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = ip(&["netns", "delete", name]);
    }
    let bridge = bridge_name(slot);
    if Path::new("/sys/class/net").join(&bridge).exists() {
        let _ = ip(&["link", "delete", &bridge]);
    }
    // Outer veth ends go with their namespaces; one whose namespace never got it is left.
    if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
        let veth_prefix = format!("skyr{slot}-");
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&veth_prefix) {
                let _ = ip(&["link", "delete", &name]);
            }
        }
    }
}

/// Clears every slot whose owner is gone (its lock is free) but left something behind.
fn remove_stale() -> Result<(), NetnsError> {
    let namespaces = ip(&["netns", "list"]).unwrap_or_default();
    let mut slots: Vec<u16> = namespaces
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|name| name.strip_prefix("skyriver-"))
        .filter_map(|rest| rest.split('-').next()?.parse().ok())
        .collect();
    if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
        slots.extend(entries.flatten().filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.strip_prefix("skyrbr")?.parse::<u16>().ok()
        }));
    }
    slots.sort_unstable();
    slots.dedup();
    for slot in slots.into_iter().filter(|&s| s < SLOTS) {
        if let Some(lock) = try_lock(slot)? {
            eprintln!("netns: removing slot {slot} left by a run that did not clean up");
            remove_slot(slot);
            drop(lock);
        }
    }
    Ok(())
}

impl NetnsCluster {
    /// Makes `nodes` namespaces on a new bridge, shaped by `shape`, after clearing what killed
    /// runs left behind.
    pub fn create(nodes: u32, shape: Option<&LinkShape>) -> Result<Self, NetnsError> {
        available()?;
        if nodes == 0 || nodes > MAX_NODES {
            return Err(NetnsError::Unavailable(format!(
                "a namespace cluster has 1 to {MAX_NODES} nodes, not {nodes}"
            )));
        }
        std::fs::create_dir_all(LOCK_DIR).map_err(|source| NetnsError::Io {
            what: format!("cannot create {LOCK_DIR}"),
            source,
        })?;
        remove_stale()?;
        let (slot, lock) = (0..SLOTS)
            .find_map(|slot| match try_lock(slot) {
                Ok(Some(lock)) => Some(Ok((slot, lock))),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            })
            .ok_or_else(|| NetnsError::Unavailable(format!("all {SLOTS} slots are in use")))??;
        // Anything left in this slot is stale: its lock was free.
        remove_slot(slot);
        LIVE_SLOTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(slot);
        let mut cluster = Self {
            slot,
            bridge: bridge_name(slot),
            hosts: Vec::new(),
            shape: AppliedShape {
                rate_bits_per_sec: shape.and_then(|s| s.rate_bits_per_sec),
                latency_us: None,
                latency_not_applied: None,
            },
            _lock: lock,
        };
        // On error the partial cluster is dropped, which removes what was made.
        cluster.build(nodes, shape)?;
        Ok(cluster)
    }

    fn build(&mut self, nodes: u32, shape: Option<&LinkShape>) -> Result<(), NetnsError> {
        let bridge = self.bridge.clone();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        // A bridge forwards at once (no STP learning delay) and is the only thing on this L2.
        ip(&[
            "link",
            "set",
            &bridge,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        // The host's own address on the cluster's network, so it can reach the nodes.
        let host = format!("{}/24", self.host_addr());
        ip(&["addr", "add", &host, "dev", &bridge])?;
        for node in 0..nodes {
            let namespace = namespace_name(self.slot, node);
            let outer = outer_veth_name(self.slot, node);
            let addr = Ipv4Addr::new(10, 213, self.slot as u8, (node + 1) as u8);
            ip(&["netns", "add", &namespace])?;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", &namespace,
            ])?;
            ip(&["link", "set", &outer, "master", &bridge])?;
            ip(&["link", "set", &outer, "up"])?;
            let cidr = format!("{addr}/24");
            ip(&["-n", &namespace, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
            self.hosts.push(NetnsHost {
                namespace,
                addr,
                outer_veth: outer,
            });
        }
        if let Some(shape) = shape {
            self.apply_shape(shape)?;
        }
        Ok(())
    }

    fn apply_shape(&mut self, shape: &LinkShape) -> Result<(), NetnsError> {
        let tbf = |rate: u64| -> Vec<String> {
            // The bucket holds 1 ms at the rate, and at least a few GSO-sized packets (a veth
            // hands tbf packets of up to 64 KiB; a smaller bucket would drop them all).
            let burst = (rate / 8 / 1000).max(256 * 1024);
            vec![
                "tbf".into(),
                "rate".into(),
                format!("{rate}bit"),
                "burst".into(),
                burst.to_string(),
                "latency".into(),
                "50ms".into(),
            ]
        };
        let mut netem_missing = None;
        for host in self.hosts.clone() {
            if let Some(rate) = shape.rate_bits_per_sec {
                // Into the node: the bridge side's egress.
                let mut args: Vec<String> = ["qdisc", "replace", "dev", &host.outer_veth, "root"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                args.extend(tbf(rate));
                run("tc", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
            }
            // Out of the node: its eth0's egress, delayed first when netem exists.
            let mut parent = vec!["root".to_string()];
            if let (Some(latency), None) = (shape.latency, &netem_missing) {
                let delay = format!("{}us", latency.as_micros());
                let result = run(
                    "tc",
                    &[
                        "-n",
                        &host.namespace,
                        "qdisc",
                        "replace",
                        "dev",
                        "eth0",
                        "root",
                        "handle",
                        "1:",
                        "netem",
                        "delay",
                        &delay,
                        "limit",
                        "100000",
                    ],
                );
                match result {
                    Ok(_) => parent = vec!["parent".into(), "1:1".into()],
                    Err(NetnsError::Command { stderr, .. }) => {
                        netem_missing = Some(format!(
                            "this kernel cannot add latency: tc netem failed ({stderr}; it needs \
                             CONFIG_NET_SCH_NETEM / the sch_netem module)"
                        ));
                    }
                    Err(other) => return Err(other),
                }
            }
            if let Some(rate) = shape.rate_bits_per_sec {
                let mut args: Vec<String> =
                    ["-n", &host.namespace, "qdisc", "replace", "dev", "eth0"]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                args.extend(parent);
                args.extend(tbf(rate));
                run("tc", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
            }
        }
        if let Some(latency) = shape.latency {
            match netem_missing {
                None => self.shape.latency_us = Some(latency.as_secs_f64() * 1e6),
                Some(reason) => {
                    eprintln!(
                        "netns: link latency {latency:?} NOT applied: {reason}; links are shaped \
                         for bandwidth only"
                    );
                    self.shape.latency_not_applied = Some(reason);
                }
            }
        }
        Ok(())
    }

    /// The slot of this cluster (its subnet is 10.213.SLOT.0/24).
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The host's address on the cluster's network (the bridge's), from which the host reaches
    /// the nodes' addresses.
    pub fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot as u8, HOST_OCTET)
    }

    /// A command that runs `program` inside node `node`'s namespace.
    pub fn command(&self, node: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.hosts[node].namespace])
            .arg(program);
        command
    }

    /// Runs `f` on a thread inside node `node`'s namespace: sockets it creates belong to that
    /// namespace for their whole life, whichever thread uses them later.
    pub fn in_namespace<T: Send>(
        &self,
        node: usize,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, NetnsError> {
        let path = Path::new("/run/netns").join(&self.hosts[node].namespace);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = File::open(&path).map_err(|source| NetnsError::Io {
                        what: format!("cannot open {}", path.display()),
                        source,
                    })?;
                    // Only this thread moves; the process stays where it was.
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(
                        |errno| NetnsError::Io {
                            what: format!("cannot enter {}", path.display()),
                            source: errno.into(),
                        },
                    )?;
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Takes node `node`'s link down (`false`) or up again (`true`), as a cut cable would.
    pub fn set_link(&self, node: usize, up: bool) -> Result<(), NetnsError> {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.hosts[node].outer_veth, state]).map(|_| ())
    }

    /// Bytes node `node` has sent on its link so far.
    pub fn sent_bytes(&self, node: usize) -> u64 {
        // The outer end receives what the node sends.
        let path = Path::new("/sys/class/net")
            .join(&self.hosts[node].outer_veth)
            .join("statistics/rx_bytes");
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        remove_slot(self.slot);
        LIVE_SLOTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|&s| s != self.slot);
        // The lock file stays (empty, in /run); the lock is released when `_lock` drops.
    }
}

/// On SIGINT or SIGTERM, removes this process's namespace clusters (killing what runs in them)
/// and the directories given to [`remove_dir_on_signal`], and exits with status 130: for
/// programs that do not stop on their own at Ctrl-C.
pub fn remove_on_signal() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(_) => return,
        };
        std::thread::spawn(move || {
            runtime.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut interrupt), Ok(mut terminate)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
                eprintln!("interrupted: removing the network namespaces");
                let slots = LIVE_SLOTS
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone();
                for slot in slots {
                    remove_slot(slot);
                }
                let dirs = SIGNAL_DIRS
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone();
                for dir in dirs {
                    let _ = std::fs::remove_dir_all(dir);
                }
                std::process::exit(130);
            });
        });
    });
}

/// Prints the namespaces, addresses and shaping of `netns` (for `skyriver up --netns`).
pub fn describe(netns: &NetnsCluster) {
    for (node, host) in netns.hosts.iter().enumerate() {
        println!(
            "  node-{node}: namespace {} address {} (ip netns exec {} …)",
            host.namespace, host.addr, host.namespace
        );
    }
    let rate = netns.shape.rate_bits_per_sec.map_or_else(
        || "unshaped".to_string(),
        |bits| format!("{} Mbit/s each way", bits / 1_000_000),
    );
    let latency = match (&netns.shape.latency_us, &netns.shape.latency_not_applied) {
        (Some(us), _) => format!(", {us:.0} µs one way per link"),
        (None, Some(_)) => ", latency NOT applied (no netem in this kernel)".to_string(),
        (None, None) => String::new(),
    };
    println!(
        "  links: bridge {} (the host's address on it: {}), {rate}{latency}",
        netns.bridge,
        netns.host_addr()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_shapes_parse_rate_and_latency_in_either_order() {
        let shape: LinkShape = "10gbit,50us".parse().unwrap();
        assert_eq!(shape.rate_bits_per_sec, Some(10_000_000_000));
        assert_eq!(shape.latency, Some(Duration::from_micros(50)));
        let shape: LinkShape = "2ms, 100mbit".parse().unwrap();
        assert_eq!(shape.rate_bits_per_sec, Some(100_000_000));
        assert_eq!(shape.latency, Some(Duration::from_millis(2)));
        let shape: LinkShape = "1.5gbit".parse().unwrap();
        assert_eq!(shape.rate_bits_per_sec, Some(1_500_000_000));
        assert_eq!(shape.latency, None);
        for bad in ["", "fast", "10gbit,20gbit", "10GB", "0gbit", "5us,6us"] {
            assert!(bad.parse::<LinkShape>().is_err(), "{bad:?} parsed");
        }
    }
}
