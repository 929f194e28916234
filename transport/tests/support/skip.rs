//! Tests that cannot run here for lack of something (a program, a device, root) say so, in a
//! way the run cannot lose: they pass without running, so libtest counts them as passed, and
//! this line is what tells them apart.
//!
//! [`skip`] writes `SKIPPED: <test binary>::<test>: <reason> (to run it: …)` straight to the
//! process's stderr (past the harness's capture, so it shows with or without `--nocapture`)
//! and appends it to the file `$SKYRIVER_SKIP_LOG` names, if any: `ci/test.sh` sets that and
//! lists every skip after the run. When the requirement's `SKYRIVER_REQUIRE_*` variable is set
//! (to anything but empty or `0`), the test fails instead: CI sets those for what it installs.
//!
//! One file for both test trees: `transport/tests` includes it as `support/skip.rs`, the root
//! crate's tests through `tests/common`.
#![allow(dead_code)]

use std::io::Write;

/// Something a test needs that a machine may lack.
pub struct Requirement {
    /// The variable that turns a skip for lack of it into a failure, if there is one.
    pub required_by: Option<&'static str>,
    /// How to provide it.
    pub to_run: &'static str,
}

/// `redis-server` on PATH.
pub const REDIS: Requirement = Requirement {
    required_by: Some("SKYRIVER_REQUIRE_REDIS"),
    to_run: "install redis-server (apt-get install redis-server, or ci/install-deps.sh)",
};

/// A C compiler and rdma-core's `<infiniband/verbs.h>`.
pub const VERBS_HEADERS: Requirement = Requirement {
    required_by: Some("SKYRIVER_REQUIRE_VERBS_HEADERS"),
    to_run: "install a C compiler and libibverbs-dev (apt-get install gcc libibverbs-dev)",
};

/// Prometheus, promtool and tmux (the metrics and `top` tests).
pub const PROMETHEUS: Requirement = Requirement {
    required_by: Some("SKYRIVER_REQUIRE_PROMETHEUS"),
    to_run: "install prometheus and tmux (ci/install-deps.sh), and pip install prometheus_client",
};

/// A `python3` (or `$PYO3_PYTHON`) with pytest and numpy.
pub const PYTHON: Requirement = Requirement {
    required_by: Some("SKYRIVER_REQUIRE_PYTHON"),
    to_run: "put a python3 with pytest and numpy on PATH (pip install pytest numpy pyarrow pandas)",
};

/// Network namespaces: root and `ip`.
pub const NETNS: Requirement = Requirement {
    required_by: Some("SKYRIVER_REQUIRE_NETNS"),
    to_run: "run the tests as root, with iproute2 installed",
};

/// A Slurm cluster that answers `sinfo`.
pub const SLURM: Requirement = Requirement {
    required_by: Some("SKYRIVER_REQUIRE_SLURM"),
    to_run: "set up a one-node Slurm as root (ci/slurm/setup.sh)",
};

/// RDMA devices named in `SKYRIVER_RDMA_DEVICES`.
pub const RDMA_DEVICES: Requirement = Requirement {
    required_by: None,
    to_run: "name RDMA devices in SKYRIVER_RDMA_DEVICES; without RDMA hardware, \
             run the verbs suites in the SoftRoCE guest (ci/softroce/test.sh)",
};

/// More available memory than this machine has.
pub const MEMORY: Requirement = Requirement {
    required_by: None,
    to_run: "run on a machine with more memory available",
};

/// A machine without RDMA verbs (the test checks what happens without them).
pub const NO_VERBS: Requirement = Requirement {
    required_by: None,
    to_run: "run on a machine without libibverbs or RDMA devices",
};

/// Whether `variable` is set to something other than empty or `0`.
pub fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// Reports that `test` does not run here because `reason`; panics instead when the
/// requirement's variable is set. The caller returns (passes) after it.
pub fn skip(test: &str, requirement: &Requirement, reason: &str) {
    if let Some(variable) = requirement.required_by {
        assert!(
            !required(variable),
            "{variable} is set but {test} cannot run: {reason} (to run it: {})",
            requirement.to_run
        );
    }
    let failure = match requirement.required_by {
        Some(variable) => format!("; {variable}=1 makes this skip a failure"),
        None => String::new(),
    };
    // The harness names each test's thread after the test: its full name, for `cargo test`.
    let thread = std::thread::current();
    let shown = match thread.name() {
        Some(name) if name != "main" && !test.starts_with(name) => name,
        _ => test,
    };
    let line = format!(
        "SKIPPED: {}::{shown}: {reason} (to run it: {}{failure})\n",
        test_binary(),
        requirement.to_run
    );
    // Straight to the file descriptor: `eprintln!` would be captured by the test harness.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("SKYRIVER_SKIP_LOG") {
        // One short append per line: lines from tests running in parallel do not interleave.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(error) = appended {
            panic!("cannot record the skip in SKYRIVER_SKIP_LOG: {error}");
        }
    }
}

/// The name of the running test binary, without cargo's hash (`verbs_fabric`).
fn test_binary() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let stem = exe
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => stem,
    }
}
