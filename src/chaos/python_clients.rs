//! Python clients in the workload: one process per node running `python/skyriver/chaos_client.py`
//! with the `skyriver` Python package, its operations reported a JSON line each and recorded in
//! the same history as the Rust workers' (see the script for the protocol).
//!
//! The package is the one `python3` imports (an installed wheel, as in CI); in a source tree
//! where it is not installed, the package's sources with the extension cargo built beside the
//! `skyriver` program (`lib_native.so`) are staged in the run's directory instead. Neither:
//! chaos runs without Python clients and says why.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;
use serde::Deserialize;

use super::history::{ClientExit, Op, OpKind, OpResult, Phase};
use super::schedule::SplitMix64;
use super::workload::{lock, Shared};

/// The client script, written into the run's directory.
pub const SCRIPT: &str = include_str!("../../python/skyriver/chaos_client.py");
/// The worker number of a node's Python client (in its object ids and the history).
pub const PYTHON_WORKER: u32 = 200;
/// The interpreter.
const PYTHON: &str = "python3";

/// Where the Python clients' interpreter finds what it needs.
#[derive(Debug, Clone)]
pub struct PythonSetup {
    /// The client script.
    pub script: PathBuf,
    /// `PYTHONPATH` when the package is staged from the source tree.
    pub pythonpath: Option<PathBuf>,
    /// Where the package was found, for the summary.
    pub package: String,
}

/// The `skyriver` package `python3` imports, with `pythonpath`: its file, or why not.
fn probe(pythonpath: Option<&Path>) -> Result<String, String> {
    let mut command = Command::new(PYTHON);
    command.args(["-c", "import skyriver; print(skyriver.__file__)"]);
    if let Some(path) = pythonpath {
        command.env("PYTHONPATH", path);
    }
    match command.output() {
        Err(error) => Err(format!("cannot run {PYTHON}: {error}")),
        Ok(output) if output.status.success() => {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
        }
        Ok(output) => Err(format!(
            "{PYTHON} cannot import skyriver: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        )),
    }
}

/// Stages the package's sources and the extension built beside `exe` under `dir`, if this
/// is a build of a source tree; the `PYTHONPATH` that imports it.
fn stage_from_source_tree(exe: &Path, dir: &Path) -> Option<PathBuf> {
    let extension = exe.parent()?.join("lib_native.so");
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/skyriver");
    if !extension.is_file() || !sources.is_dir() {
        return None;
    }
    let root = dir.join("python");
    let package = root.join("skyriver");
    std::fs::create_dir_all(&package).ok()?;
    for entry in std::fs::read_dir(&sources).ok()?.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "py" || e == "typed") {
            std::fs::copy(&path, package.join(entry.file_name())).ok()?;
        }
    }
    std::fs::copy(&extension, package.join("_native.so")).ok()?;
    Some(root)
}

/// Finds a `skyriver` package for the clients and writes the script into `dir`; why not, if
/// none imports.
pub fn find(exe: &Path, dir: &Path) -> Result<PythonSetup, String> {
    let script = dir.join("chaos_client.py");
    std::fs::write(&script, SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let installed = match probe(None) {
        Ok(package) => {
            return Ok(PythonSetup {
                script,
                pythonpath: None,
                package,
            })
        }
        Err(reason) => reason,
    };
    let Some(root) = stage_from_source_tree(exe, dir) else {
        return Err(installed);
    };
    match probe(Some(&root)) {
        Ok(_) => Ok(PythonSetup {
            script,
            pythonpath: Some(root),
            package: "the source tree (this build's extension)".into(),
        }),
        Err(staged) => Err(format!(
            "{installed}; staged from the source tree: {staged}"
        )),
    }
}

/// One line the client writes.
#[derive(Debug, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Message {
    /// An operation begins.
    Start {
        kind: OpKind,
        id: String,
        size: u64,
        timeout_ms: u64,
    },
    /// The operation begun last ended.
    End { result: OpResult },
}

/// A running Python client and the thread that records its operations.
pub struct PythonClient {
    child: Arc<Mutex<Child>>,
    /// Records its operations; ends when the client exits.
    pub thread: std::thread::JoinHandle<()>,
}

impl PythonClient {
    /// Starts the client of node `node` on `socket` (from the thread that lives for the whole
    /// run: the client dies with it) and the thread that records its operations.
    pub fn start(
        setup: &PythonSetup,
        socket: &Path,
        seed: u64,
        node: u32,
        shared: Arc<Shared>,
    ) -> std::io::Result<Self> {
        let log_path = setup
            .script
            .with_file_name(format!("python-client-{node}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut command = Command::new(PYTHON);
        command
            .arg(&setup.script)
            .arg(socket)
            .args([
                seed.to_string(),
                node.to_string(),
                PYTHON_WORKER.to_string(),
            ])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        if let Some(path) = &setup.pythonpath {
            command.env("PYTHONPATH", path);
        }
        // A group of its own: a terminal's Ctrl-C reaches only `chaos`, which stops it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        skyriver_transport::process::die_with_parent(&mut command, Signal::SIGKILL);
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take().expect("stdin is piped");
        let child = Arc::new(Mutex::new(child));
        let recorder = Recorder {
            node,
            seed,
            shared,
            log_path,
        };
        let waited = child.clone();
        let thread = std::thread::spawn(move || recorder.run(stdout, stdin, &waited));
        Ok(Self { child, thread })
    }

    /// Kills the client if it still runs (it never answered `stop`).
    pub fn kill(&self) {
        let _ = lock(&self.child).kill();
    }
}

struct Recorder {
    node: u32,
    seed: u64,
    shared: Arc<Shared>,
    log_path: PathBuf,
}

impl Recorder {
    fn run(
        self,
        stdout: std::process::ChildStdout,
        mut stdin: std::process::ChildStdin,
        child: &Mutex<Child>,
    ) {
        let key = (self.node, PYTHON_WORKER);
        let mut rng = SplitMix64::new(self.seed ^ 0x7079_7468_6f6e ^ u64::from(self.node));
        let mut running: Option<Op> = None;
        let mut stop_sent = false;
        let mut protocol_error = None;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let message = match serde_json::from_str::<Message>(&line) {
                Ok(message) => message,
                Err(error) => {
                    protocol_error = Some(format!("unreadable line {line:?}: {error}"));
                    break;
                }
            };
            match message {
                Message::Start {
                    kind,
                    id,
                    size,
                    timeout_ms,
                } => {
                    if kind == OpKind::Delete {
                        // Others stop fetching it before it goes, as for the Rust workers.
                        lock(&self.shared.acked).retain(|(acked, _)| acked.to_string() != id);
                    }
                    let op = Op {
                        node: self.node,
                        worker: PYTHON_WORKER,
                        kind,
                        id,
                        size,
                        start_ms: self.shared.ms(),
                        end_ms: 0,
                        timeout_ms,
                        result: OpResult::Ok,
                        phase: Phase::Chaos,
                    };
                    lock(&self.shared.in_flight).insert(key, op.clone());
                    running = Some(op);
                }
                Message::End { result } => {
                    lock(&self.shared.in_flight).remove(&key);
                    let Some(mut op) = running.take() else {
                        protocol_error = Some("an end without a start".into());
                        break;
                    };
                    op.end_ms = self.shared.ms();
                    op.result = result;
                    if op.kind == OpKind::Put && op.result == OpResult::Ok {
                        if let Ok(id) = op.id.parse() {
                            lock(&self.shared.acked).push((id, self.node));
                        }
                    }
                    lock(&self.shared.ops).push(op);
                    let reply = if self.shared.stopping() {
                        stop_sent = true;
                        "stop".to_string()
                    } else {
                        self.pick_remote(&mut rng)
                    };
                    if writeln!(stdin, "{reply}").is_err() {
                        break;
                    }
                }
            }
        }
        drop(stdin);
        if protocol_error.is_some() {
            let _ = lock(child).kill();
        }
        let status = lock(child).wait();
        lock(&self.shared.in_flight).remove(&key);
        let clean = stop_sent && status.as_ref().is_ok_and(|s| s.success());
        if clean || self.shared.ending() {
            return;
        }
        let mut log = String::new();
        let _ = std::fs::File::open(&self.log_path).and_then(|mut f| f.read_to_string(&mut log));
        let lines: Vec<&str> = log.lines().collect();
        let mut detail = lines[lines.len().saturating_sub(6)..].join("\n");
        if let Some(error) = protocol_error {
            detail = format!("{error}\n{detail}");
        }
        lock(&self.shared.client_exits).push(ClientExit {
            node: self.node,
            worker: PYTHON_WORKER,
            at_ms: self.shared.ms(),
            status: match status {
                Ok(status) => status.to_string(),
                Err(error) => error.to_string(),
            },
            detail,
        });
    }

    /// An object acknowledged on another node, for the client's fetches, or `-`.
    fn pick_remote(&self, rng: &mut SplitMix64) -> String {
        let acked = lock(&self.shared.acked);
        let others: Vec<_> = acked.iter().filter(|(_, n)| *n != self.node).collect();
        if others.is_empty() {
            return "-".into();
        }
        others[rng.below(others.len() as u64) as usize]
            .0
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::history::{OpKind, OpResult};
    use super::super::workload::{content, lock, object_id, Shared};
    use super::{PythonClient, PythonSetup};

    fn python_available() -> bool {
        let probe = std::process::Command::new(super::PYTHON)
            .arg("--version")
            .output();
        let found = probe.is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("skipped: no {}", super::PYTHON);
        }
        found
    }

    /// Runs `script` as node 1's client until it exits; the shared state it left.
    fn run_client(script: &str, stop_first: bool) -> Arc<Shared> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.py");
        std::fs::write(&path, script).unwrap();
        let setup = PythonSetup {
            script: path,
            pythonpath: None,
            package: "none".into(),
        };
        let shared = Arc::new(Shared::new(Instant::now()));
        if stop_first {
            shared.stop();
        }
        let client =
            PythonClient::start(&setup, &dir.path().join("none.sock"), 1, 1, shared.clone())
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !client.thread.is_finished() {
            assert!(Instant::now() < deadline, "the client did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        client.thread.join().unwrap();
        shared
    }

    const PUT: &str = r#"{"event": "start", "kind": "put", "id": "01000000010000000000000001c8010000000000", "size": 1, "timeout_ms": 0}"#;

    #[test]
    fn operations_are_recorded_and_a_put_is_offered_to_the_others() {
        if !python_available() {
            return;
        }
        let id = "01000000010000000000000001c8010000000000";
        let script = format!(
            "import sys\n\
             print({PUT:?}, flush=True)\n\
             print('{{\"event\": \"end\", \"result\": {{\"outcome\": \"ok\"}}}}', flush=True)\n\
             assert sys.stdin.readline().strip() == 'stop'\n"
        );
        let shared = run_client(&script, true);
        let ops = lock(&shared.ops).clone();
        assert_eq!(ops.len(), 1);
        assert_eq!((ops[0].kind, &ops[0].result), (OpKind::Put, &OpResult::Ok));
        assert_eq!((ops[0].node, ops[0].id.as_str()), (1, id));
        assert_eq!(lock(&shared.acked).len(), 1);
        assert!(lock(&shared.in_flight).is_empty());
        assert_eq!(lock(&shared.client_exits).clone(), Vec::new());
    }

    #[test]
    fn a_client_that_dies_before_it_is_told_to_stop_is_a_crash() {
        if !python_available() {
            return;
        }
        let script = format!(
            "print({PUT:?}, flush=True)\n\
             raise RuntimeError('the client broke')\n"
        );
        let shared = run_client(&script, false);
        let exits = lock(&shared.client_exits).clone();
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert!(exits[0].detail.contains("the client broke"), "{exits:?}");
        assert_eq!((exits[0].node, exits[0].worker), (1, super::PYTHON_WORKER));
        // Its operation never ended: not recorded as done, not left in flight.
        assert!(lock(&shared.ops).is_empty());
        assert!(lock(&shared.in_flight).is_empty());
    }

    /// The script's `object_id` and `content` agree with the workload's, so a read in either
    /// language checks an object put in the other (needs `python3`, not the package).
    #[test]
    fn the_script_makes_the_same_ids_and_contents_as_the_workload() {
        if !python_available() {
            return;
        }
        let ids = [
            object_id(11, 3, 200, 7, 1),
            object_id(u64::MAX, 0, 200, 1 << 40, 40_000),
            object_id(5, 4, 200, 123_456, 3_001),
        ];
        // The script with a stand-in for the package (only its error classes are used at import).
        let program = format!(
            "import sys, types\n\
             stub = types.ModuleType('skyriver')\n\
             stub.DaemonUnavailable = stub.ClientClosed = stub.ProtocolError = Exception\n\
             sys.modules['skyriver'] = stub\n\
             namespace = {{'__name__': 'chaos_client'}}\n\
             exec(compile(sys.stdin.read(), 'chaos_client.py', 'exec'), namespace)\n\
             for seed, node, worker, counter, size in {cases}:\n\
             \x20   oid = namespace['object_id'](seed, node, worker, counter, size)\n\
             \x20   print(oid.hex(), namespace['content'](oid).hex())\n",
            cases = "[(11, 3, 200, 7, 1), (2**64 - 1, 0, 200, 1 << 40, 40000), \
                     (5, 4, 200, 123456, 3001)]"
        );
        let mut child = std::process::Command::new(super::PYTHON)
            .args(["-c", &program])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(super::SCRIPT.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        let text = String::from_utf8(output.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), ids.len());
        for (line, id) in lines.iter().zip(&ids) {
            let (python_id, python_content) = line.split_once(' ').unwrap();
            assert_eq!(python_id, id.to_string());
            assert_eq!(python_content, hex::encode(content(id)));
        }
    }
}
