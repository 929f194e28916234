//! The fabric a chaos run's daemons use between each other: TCP (the default), or verbs on
//! RDMA devices, node `i` on device `i mod n`.
//!
//! On verbs the daemons still live in their network namespaces (the directory, the verbs
//! connections' set-up and the clients' sockets go through them), but their RDMA traffic
//! does not: SoftRoCE (`rdma_rxe`) on the kernels this runs on (Debian 12's 6.1) carries
//! RoCE only in the initial network namespace, so the devices sit on links there (in the
//! SoftRoCE guest, rxe0 and rxe1 on one veth pair; `ci/softroce/chaos.sh`) and every daemon
//! opens its device through the RDMA subsystem's shared namespace mode. The link faults act
//! on a namespace's own link, which would then cut the set-up but not the RDMA traffic: on
//! verbs they are left out of the schedule ([`VERBS_LEFT_OUT`]).

use std::path::Path;

use super::schedule::FaultKind;

/// Fault kinds a verbs run leaves out, and why (also in `skyriver chaos --help` and the
/// README).
pub const VERBS_LEFT_OUT: [FaultKind; 3] = [
    FaultKind::LinkDown,
    FaultKind::OneWayCut,
    FaultKind::Throttle,
];

/// Where RDMA devices appear.
const RDMA_CLASS_DIR: &str = "/sys/class/infiniband";

/// The daemons' fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChaosFabric {
    /// `--fabric tcp`.
    Tcp,
    /// `--fabric verbs`: node `i` on `devices[i % devices.len()]` (never empty).
    Verbs {
        /// The RDMA devices, e.g. `rxe0`, `rxe1`.
        devices: Vec<String>,
        /// `--gid-index` for every daemon, where the devices need one.
        gid_index: Option<u32>,
    },
}

/// Why `--fabric verbs` cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// No device was named and the machine has none.
    #[error(
        "--fabric verbs: no RDMA device here ({RDMA_CLASS_DIR} is empty or absent, and neither \
         --devices nor SKYRIVER_RDMA_DEVICES names one); run it in the SoftRoCE guest: \
         ci/softroce/chaos.sh"
    )]
    NoDevice,
    /// A named device does not exist.
    #[error(
        "--fabric verbs: no RDMA device {name} ({RDMA_CLASS_DIR}/{name} is absent; this \
         machine has: {present}); run it in the SoftRoCE guest: ci/softroce/chaos.sh"
    )]
    Missing {
        /// The device named.
        name: String,
        /// The devices that exist, or "none".
        present: String,
    },
    /// `SKYRIVER_RDMA_GID_INDEX` is not a number.
    #[error("SKYRIVER_RDMA_GID_INDEX={0}: not a GID index")]
    GidIndex(String),
}

impl ChaosFabric {
    /// The verbs fabric on `named` devices, else those in `SKYRIVER_RDMA_DEVICES` (the
    /// SoftRoCE guest sets it), else every device under `/sys/class/infiniband`; each must
    /// exist there. `SKYRIVER_RDMA_GID_INDEX` gives the daemons a GID index.
    pub fn verbs(named: &[String]) -> Result<Self, FabricError> {
        let from_env = std::env::var("SKYRIVER_RDMA_DEVICES").unwrap_or_default();
        let gid_index = match std::env::var("SKYRIVER_RDMA_GID_INDEX") {
            Ok(text) => Some(
                text.trim()
                    .parse()
                    .map_err(|_| FabricError::GidIndex(text))?,
            ),
            Err(_) => None,
        };
        let devices = Self::resolve(named, &from_env, Path::new(RDMA_CLASS_DIR))?;
        Ok(Self::Verbs { devices, gid_index })
    }

    /// Which devices: `named`, else the whitespace-separated `from_env`, else every entry of
    /// `class_dir`; each must be an entry of `class_dir`.
    fn resolve(
        named: &[String],
        from_env: &str,
        class_dir: &Path,
    ) -> Result<Vec<String>, FabricError> {
        let mut present: Vec<String> = std::fs::read_dir(class_dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        present.sort();
        let wanted: Vec<String> = if !named.is_empty() {
            named.to_vec()
        } else if !from_env.trim().is_empty() {
            from_env.split_whitespace().map(str::to_string).collect()
        } else {
            present.clone()
        };
        if wanted.is_empty() {
            return Err(FabricError::NoDevice);
        }
        if let Some(name) = wanted.iter().find(|name| !present.contains(name)) {
            return Err(FabricError::Missing {
                name: name.clone(),
                present: if present.is_empty() {
                    "none".into()
                } else {
                    present.join(", ")
                },
            });
        }
        Ok(wanted)
    }

    /// Whether this is the verbs fabric.
    pub fn is_verbs(&self) -> bool {
        matches!(self, Self::Verbs { .. })
    }

    /// The `skyriver daemon` arguments that choose the fabric for node `node`.
    pub fn daemon_args(&self, node: u32) -> Vec<String> {
        match self {
            Self::Tcp => vec!["--fabric".into(), "tcp".into()],
            Self::Verbs { devices, gid_index } => {
                let mut args = vec![
                    "--fabric".into(),
                    "verbs".into(),
                    "--device".into(),
                    devices[node as usize % devices.len()].clone(),
                ];
                if let Some(index) = gid_index {
                    args.push(format!("--gid-index={index}"));
                }
                args
            }
        }
    }

    /// How the run names its fabric in its summary.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp => "tcp".into(),
            Self::Verbs { devices, .. } => format!("verbs on {}", devices.join(",")),
        }
    }
}

/// Whether `kind` is left out of the schedule on the verbs fabric, and why.
pub fn left_out_on_verbs(kind: FaultKind) -> Option<&'static str> {
    VERBS_LEFT_OUT.contains(&kind).then_some(
        "SoftRoCE carries RoCE only in the initial network namespace, so the RDMA traffic \
         does not cross the namespace's link this fault acts on",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class_dir(devices: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for device in devices {
            std::fs::create_dir(dir.path().join(device)).unwrap();
        }
        dir
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn devices_come_from_the_flag_then_the_environment_then_the_machine() {
        let dir = class_dir(&["rxe0", "rxe1", "mlx5_0"]);
        let resolve = |named: &[&str], env: &str| {
            ChaosFabric::resolve(&names(named), env, dir.path()).unwrap()
        };
        assert_eq!(resolve(&["mlx5_0"], "rxe0 rxe1"), names(&["mlx5_0"]));
        assert_eq!(resolve(&[], " rxe1  rxe0 "), names(&["rxe1", "rxe0"]));
        assert_eq!(resolve(&[], ""), names(&["mlx5_0", "rxe0", "rxe1"]));
    }

    #[test]
    fn no_device_or_a_missing_one_is_an_error_that_points_to_the_guest() {
        let empty = class_dir(&[]);
        let error = ChaosFabric::resolve(&[], "", empty.path()).unwrap_err();
        assert!(matches!(error, FabricError::NoDevice), "{error:?}");
        assert!(
            error.to_string().contains("ci/softroce/chaos.sh"),
            "{error}"
        );
        let absent = ChaosFabric::resolve(&[], "", &empty.path().join("absent")).unwrap_err();
        assert!(matches!(absent, FabricError::NoDevice), "{absent:?}");

        let dir = class_dir(&["rxe0"]);
        let error = ChaosFabric::resolve(&[], "rxe0 rxe1", dir.path()).unwrap_err();
        match &error {
            FabricError::Missing { name, present } => {
                assert_eq!(name, "rxe1");
                assert_eq!(present, "rxe0");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            error.to_string().contains("ci/softroce/chaos.sh"),
            "{error}"
        );
    }

    #[test]
    fn nodes_take_the_devices_in_turn() {
        let fabric = ChaosFabric::Verbs {
            devices: names(&["rxe0", "rxe1"]),
            gid_index: Some(1),
        };
        assert_eq!(
            fabric.daemon_args(2),
            names(&["--fabric", "verbs", "--device", "rxe0", "--gid-index=1"])
        );
        let no_gid = ChaosFabric::Verbs {
            devices: names(&["rxe0", "rxe1"]),
            gid_index: None,
        };
        assert_eq!(
            no_gid.daemon_args(1),
            names(&["--fabric", "verbs", "--device", "rxe1"])
        );
        assert_eq!(ChaosFabric::Tcp.daemon_args(1), names(&["--fabric", "tcp"]));
        assert!(left_out_on_verbs(FaultKind::Throttle).is_some());
        assert!(left_out_on_verbs(FaultKind::Pause).is_none());
    }
}
