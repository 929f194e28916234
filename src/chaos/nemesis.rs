//! The nemesis: carries out each fault of the schedule on the real daemons and their links,
//! and heals it at its end.

use std::process::{Command, Stdio};
use std::time::Duration;

use skyriver_client::ObjectId;

use super::cluster::{ChaosCluster, ChaosClusterError};
use super::schedule::{Fault, FaultKind};
use super::workload::{content, object_id};

/// Rate of a throttled link.
const THROTTLE: &str = "1mbit";
/// Data size of the objects killed clients put.
const CLIENT_KILL_OBJECT_BYTES: u32 = 8 << 20;

/// Why a fault could not be injected or healed.
#[derive(Debug, thiserror::Error)]
pub enum NemesisError {
    /// A daemon could not be killed, restarted or its store wiped.
    #[error(transparent)]
    Cluster(#[from] ChaosClusterError),
    /// An `ip`, `tc` or client command failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its error output or exit status.
        detail: String,
    },
}

fn run(program: &str, args: &[&str]) -> Result<(), NemesisError> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| NemesisError::Command {
            command: format!("{program} {}", args.join(" ")),
            detail: e.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NemesisError::Command {
            command: format!("{program} {}", args.join(" ")),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// A fault in effect, with what its heal needs.
pub struct Injected {
    /// The fault.
    pub fault: Fault,
    /// The object a killed client may have put or fetched, for the final reads.
    pub client_object: Option<(ObjectId, u32)>,
    /// The port of the killed Redis master, restarted at the heal.
    pub redis_port: Option<u16>,
}

/// Injects `fault`. `seed` and `serial` name the object a killed client works on.
pub fn inject(
    cluster: &mut ChaosCluster,
    fault: &Fault,
    seed: u64,
    serial: u64,
) -> Result<Injected, NemesisError> {
    let node = fault.node;
    let namespace = cluster.netns().hosts[node as usize].namespace.clone();
    let mut client_object = None;
    let mut redis_port = None;
    match fault.kind {
        FaultKind::KillRestart | FaultKind::HeadKillRestart => cluster.kill(node, false)?,
        FaultKind::KillRestartWiped => cluster.kill(node, true)?,
        FaultKind::Pause => cluster.pause(node, true),
        FaultKind::LinkDown => cluster
            .netns()
            .set_link(node as usize, false)
            .map_err(|e| NemesisError::Command {
                command: "ip link set down".into(),
                detail: e.to_string(),
            })?,
        FaultKind::OneWayCut => {
            let peer = fault.peer.unwrap_or(0);
            let route = format!("{}/32", cluster.netns().hosts[peer as usize].addr);
            run(
                "ip",
                &["-n", &namespace, "route", "add", "blackhole", &route],
            )?
        }
        FaultKind::Throttle => {
            let outer = cluster.netns().hosts[node as usize].outer_veth.clone();
            let tbf = [
                "tbf", "rate", THROTTLE, "burst", "32kbit", "latency", "400ms",
            ];
            let mut inside = vec!["-n", &namespace, "qdisc", "replace", "dev", "eth0", "root"];
            inside.extend(tbf);
            run("tc", &inside)?;
            let mut outside = vec!["qdisc", "replace", "dev", &outer, "root"];
            outside.extend(tbf);
            run("tc", &outside)?;
        }
        FaultKind::DiskFull => {
            // Fill what is left of the node's tmpfs; the daemon's next file growth fails.
            let filler = cluster.store_dir(node).join("filler");
            let _ = Command::new("dd")
                .args(["if=/dev/zero", "bs=1M", "status=none"])
                .arg(format!("of={}", filler.display()))
                // It ends at "No space left on device", as meant.
                .stderr(Stdio::null())
                .status();
        }
        FaultKind::ClientKill => client_object = Some(kill_a_client(cluster, fault, seed, serial)?),
        FaultKind::RedisMasterKill => redis_port = Some(cluster.kill_redis_master(node)?),
    }
    Ok(Injected {
        fault: fault.clone(),
        client_object,
        redis_port,
    })
}

/// Ends the fault: restart, SIGCONT, link up, route or qdisc removed, disk emptied.
pub fn heal(cluster: &mut ChaosCluster, injected: &Injected) -> Result<(), NemesisError> {
    let fault = &injected.fault;
    let node = fault.node;
    let namespace = cluster.netns().hosts[node as usize].namespace.clone();
    match fault.kind {
        FaultKind::KillRestart | FaultKind::HeadKillRestart | FaultKind::KillRestartWiped => {
            cluster.restart(node)?
        }
        FaultKind::Pause => cluster.pause(node, false),
        FaultKind::LinkDown => {
            cluster
                .netns()
                .set_link(node as usize, true)
                .map_err(|e| NemesisError::Command {
                    command: "ip link set up".into(),
                    detail: e.to_string(),
                })?
        }
        FaultKind::OneWayCut => {
            let peer = fault.peer.unwrap_or(0);
            let route = format!("{}/32", cluster.netns().hosts[peer as usize].addr);
            run(
                "ip",
                &["-n", &namespace, "route", "del", "blackhole", &route],
            )?
        }
        FaultKind::Throttle => {
            let outer = cluster.netns().hosts[node as usize].outer_veth.clone();
            run(
                "tc",
                &["-n", &namespace, "qdisc", "del", "dev", "eth0", "root"],
            )?;
            run("tc", &["qdisc", "del", "dev", &outer, "root"])?;
        }
        FaultKind::DiskFull => {
            let _ = std::fs::remove_file(cluster.store_dir(node).join("filler"));
        }
        FaultKind::ClientKill => {}
        FaultKind::RedisMasterKill => {
            if let Some(port) = injected.redis_port {
                cluster.restart_redis(port)?
            }
        }
    }
    Ok(())
}

/// Starts a `skyriver put` (even serials) or `skyriver fetch` (odd) of a large object as a
/// process of its own, and kills it mid-way (after a delay drawn from `serial`).
fn kill_a_client(
    cluster: &ChaosCluster,
    fault: &Fault,
    seed: u64,
    serial: u64,
) -> Result<(ObjectId, u32), NemesisError> {
    // Worker 255 is the nemesis's: its ids never collide with a workload's.
    let id = object_id(seed, fault.node, 255, serial, CLIENT_KILL_OBJECT_BYTES);
    let exe = crate::self_exe().map_err(|e| NemesisError::Command {
        command: "skyriver".into(),
        detail: e.to_string(),
    })?;
    let socket = cluster.socket(fault.node);
    let mut command = Command::new(exe);
    let (what, holder) = if serial % 2 == 0 {
        let file = cluster.dir.join(format!("client-{serial}.data"));
        std::fs::write(&file, content(&id)).map_err(|e| NemesisError::Command {
            command: format!("write {}", file.display()),
            detail: e.to_string(),
        })?;
        command
            .args(["put", "--id", &id.to_string()])
            .arg(&file)
            .arg("--socket")
            .arg(&socket);
        ("put", fault.node)
    } else {
        // Put whole on the next node first, then a killed fetch of it on this one.
        let source = (fault.node + 1) % cluster.netns().hosts.len() as u32;
        if let Ok(client) = skyriver_client::Client::connect(cluster.socket(source)) {
            let _ = client.put(id, &content(&id), &[]);
        }
        command
            .args(["fetch", &id.to_string(), "-o", "/dev/null"])
            .arg("--socket")
            .arg(&socket);
        ("fetch", source)
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| NemesisError::Command {
            command: format!("skyriver {what}"),
            detail: e.to_string(),
        })?;
    std::thread::sleep(Duration::from_millis(fault.duration_ms % 400));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(cluster.dir.join(format!("client-{serial}.data")));
    Ok((id, holder))
}
