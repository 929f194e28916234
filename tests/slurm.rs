//! `deploy/slurm/skyriver.sbatch` under a real Slurm (`ci/slurm/setup.sh` makes a one-node
//! one on this machine): two jobs at once on one node, one with a Redis directory and one with
//! the built-in head, each runs its command against its own daemon and stops everything; a
//! job cancelled with `scancel` leaves no daemon and no run directory behind. Skips with a
//! line without Slurm, unless `SKYRIVER_REQUIRE_SLURM` is set (CI), where it fails instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn slurm_or_skip(test: &str) -> bool {
    let idle = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .map(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or(false);
    if idle {
        return true;
    }
    common::skip::skip(test, &common::skip::SLURM, "no Slurm cluster answers sinfo");
    false
}

fn sbatch_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/skyriver.sbatch")
}

/// `sbatch` with the test's binary; the daemons bind loopback (one node: no other address is
/// needed or used).
fn sbatch(dir: &Path, options: &[&str], env: &[(&str, &str)], command: &[&str]) -> Command {
    let mut sbatch = Command::new("sbatch");
    sbatch
        .current_dir(dir)
        .env("SKYRIVER_BIN", env!("CARGO_BIN_EXE_skyriver"))
        .env("SKYRIVER_BIND", "127.0.0.1")
        .env("SKYRIVER_MEMORY", "64MiB")
        .envs(env.iter().copied())
        .arg(format!("--output={}/job-%j.out", dir.display()))
        .args(options)
        .arg(sbatch_script())
        .args(command);
    sbatch
}

fn job_id(stdout: &[u8]) -> String {
    String::from_utf8_lossy(stdout)
        .split_whitespace()
        .last()
        .expect("sbatch prints the job id")
        .to_string()
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) && !cmdline.contains("cargo") {
                found.push(cmdline);
            }
        }
    }
    found
}

#[test]
fn two_jobs_on_one_node_each_get_their_own_cluster_and_stop_it() {
    if !slurm_or_skip("two_jobs_on_one_node_each_get_their_own_cluster") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("skyriver-slurm")
        .tempdir()
        .unwrap();
    // Three tasks on the node each put an object through the job's daemon, then one reads all
    // three back.
    let command = [
        "bash",
        "-c",
        "srun --overlap -n3 bash -c 'printf \"task %s\" $SLURM_PROCID | \
         $SKYRIVER_BIN put --id $(printf %040x $((SLURM_PROCID + 1))) -' && \
         for i in 1 2 3; do $SKYRIVER_BIN get $(printf %040x $i); echo; done && \
         echo socket=$SKYRIVER_SOCKET && \
         echo learning=$(pgrep -af \"daemon --socket $SKYRIVER_SOCKET\" | grep -c -- --learn-locations)",
    ];
    let mut jobs = Vec::new();
    // The head's job also has its daemon learn locations (SKYRIVER_LEARN_LOCATIONS).
    for (directory, learn) in [("redis", "0"), ("head", "1")] {
        let child = sbatch(
            dir.path(),
            &["--wait", "-N1", "-n3", "--time=5"],
            &[
                ("SKYRIVER_DIRECTORY", directory),
                ("SKYRIVER_LEARN_LOCATIONS", learn),
            ],
            &command,
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        jobs.push((directory, learn, child));
    }
    let mut sockets = Vec::new();
    for (directory, learn, child) in jobs {
        let output = child.wait_with_output().unwrap();
        let id = job_id(&output.stdout);
        let log =
            std::fs::read_to_string(dir.path().join(format!("job-{id}.out"))).unwrap_or_default();
        assert!(
            output.status.success(),
            "{directory} job {id} failed: {}\n{log}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(log.contains(&format!("directory {directory}")), "{log}");
        for task in 0..3 {
            assert!(log.contains(&format!("task {task}")), "{log}");
        }
        assert!(log.contains(&format!("learning={learn}")), "{log}");
        let socket = log
            .lines()
            .find_map(|l| l.strip_prefix("socket="))
            .unwrap_or_else(|| panic!("no socket line in\n{log}"))
            .to_string();
        assert!(socket.contains(&format!("skyriver-{id}")), "{socket}");
        let run_dir = Path::new(&socket).parent().unwrap().to_path_buf();
        assert!(!run_dir.exists(), "{} left behind", run_dir.display());
        assert!(
            processes_mentioning(&socket).is_empty(),
            "daemon of job {id} still running"
        );
        sockets.push(socket);
    }
    assert_ne!(sockets[0], sockets[1], "two jobs shared a socket path");
}

#[test]
fn scancel_stops_the_daemons_and_removes_the_run_directory() {
    if !slurm_or_skip("scancel_stops_the_daemons") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("skyriver-slurm")
        .tempdir()
        .unwrap();
    let output = sbatch(
        dir.path(),
        &["-N1", "-n1", "--time=5"],
        &[],
        &["bash", "-c", "echo socket=$SKYRIVER_SOCKET; sleep 300"],
    )
    .output()
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let id = job_id(&output.stdout);
    let log_path = dir.path().join(format!("job-{id}.out"));
    let started = Instant::now();
    let socket = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(socket) = log.lines().find_map(|l| l.strip_prefix("socket=")) {
            break socket.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "job {id} did not start its command:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(Path::new(&socket).exists(), "no daemon socket at {socket}");
    assert!(!processes_mentioning(&socket).is_empty());
    assert!(Command::new("scancel").arg(&id).status().unwrap().success());
    let cancelled = Instant::now();
    loop {
        let queue = Command::new("squeue")
            .args(["-h", "-j", &id])
            .output()
            .unwrap();
        let gone = String::from_utf8_lossy(&queue.stdout).trim().is_empty();
        if gone && processes_mentioning(&socket).is_empty() {
            break;
        }
        assert!(
            cancelled.elapsed() < Duration::from_secs(30),
            "job {id} still has processes 30 s after scancel: {:?}",
            processes_mentioning(&socket)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let run_dir = Path::new(&socket).parent().unwrap();
    assert!(!run_dir.exists(), "{} left behind", run_dir.display());
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    eprintln!(
        "job {id} stopped {:?} after scancel\n{log}",
        cancelled.elapsed()
    );
}

#[test]
fn the_jobs_redis_wants_a_password_and_no_secret_is_on_a_command_line() {
    if !slurm_or_skip("the_jobs_redis_wants_a_password") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("skyriver-slurm")
        .tempdir()
        .unwrap();
    // From inside the job: the secrets' modes, an unauthenticated FLUSHALL to the job's Redis,
    // how many command lines on the machine hold a secret (patterns from the files, so the
    // check's own command line holds none), then an object through the daemon.
    let command = [
        "bash",
        "-c",
        r#"s=$SKYRIVER_RUN_DIR/secrets
        echo "modes: $(stat -c %a "$s" "$s/token" "$s/redis-password" "$s/redis.conf" | tr '\n' ' ')"
        exec 3<>"/dev/tcp/$SKYRIVER_HEAD_ADDR/$SKYRIVER_PORT"
        printf 'FLUSHALL\r\n' >&3
        IFS= read -r -t 5 reply <&3
        exec 3>&-
        echo "unauthenticated: $reply"
        leaked=$(for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f" 2>/dev/null; echo; done |
            grep -c -F -f "$s/redis-password" -f "$s/token")
        echo "command lines with a secret: $leaked"
        printf 'still works' | $SKYRIVER_BIN put --id $(printf %040x 5) - &&
            $SKYRIVER_BIN get $(printf %040x 5) && echo
        echo socket=$SKYRIVER_SOCKET"#,
    ];
    let output = sbatch(
        dir.path(),
        &["--wait", "-N1", "-n1", "--time=5"],
        &[("SKYRIVER_DIRECTORY", "redis")],
        &command,
    )
    .output()
    .unwrap();
    let id = job_id(&output.stdout);
    let log = std::fs::read_to_string(dir.path().join(format!("job-{id}.out"))).unwrap_or_default();
    assert!(
        output.status.success(),
        "job {id} failed: {}\n{log}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(log.contains("directory redis"), "{log}");
    assert!(log.contains("modes: 700 600 600 600"), "{log}");
    assert!(log.contains("unauthenticated: -NOAUTH"), "{log}");
    assert!(log.contains("command lines with a secret: 0"), "{log}");
    assert!(log.contains("still works"), "{log}");
    let socket = log
        .lines()
        .find_map(|l| l.strip_prefix("socket="))
        .unwrap_or_else(|| panic!("no socket line in\n{log}"));
    let run_dir = Path::new(socket).parent().unwrap();
    assert!(
        !run_dir.exists(),
        "{} (and its secrets) left behind",
        run_dir.display()
    );
}

#[test]
fn learned_locations_are_refused_with_redis_and_for_a_bad_value() {
    if !slurm_or_skip("learned_locations_are_refused_with_redis") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("skyriver-slurm")
        .tempdir()
        .unwrap();
    for (env, says) in [
        (
            [
                ("SKYRIVER_DIRECTORY", "redis"),
                ("SKYRIVER_LEARN_LOCATIONS", "1"),
            ],
            "need the built-in directory",
        ),
        (
            [
                ("SKYRIVER_DIRECTORY", "head"),
                ("SKYRIVER_LEARN_LOCATIONS", "yes"),
            ],
            "is not 0 or 1",
        ),
    ] {
        let output = sbatch(
            dir.path(),
            &["--wait", "-N1", "-n1", "--time=2"],
            &env,
            &["true"],
        )
        .output()
        .unwrap();
        let id = job_id(&output.stdout);
        let log =
            std::fs::read_to_string(dir.path().join(format!("job-{id}.out"))).unwrap_or_default();
        assert!(!output.status.success(), "job {id} ran: {log}");
        assert!(log.contains(says), "{log}");
    }
}
