//! The history of a run: every client operation with its start, end, node, kind and result,
//! every fault as injected, and the facts about the daemons (deaths, exits, resources) the
//! checker needs. Written as JSON lines, one record a line.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::schedule::FaultKind;

/// What a client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Create, write and seal an object on the client's node.
    Put,
    /// Read one of this node's objects, without waiting.
    Get,
    /// Read an object put on another node (fetched here if need be).
    Fetch,
    /// Delete one of this node's objects.
    Delete,
    /// A get that waits for an object a moment before it is put.
    BlockingGet,
    /// A read of an object a killed client process may have put, or fetched.
    ReadAfterClientKill,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum OpResult {
    /// It succeeded (a read with the expected bytes).
    Ok,
    /// A read returned other bytes than the object's.
    WrongBytes {
        /// What differed.
        detail: String,
    },
    /// The object is not there, or no live node holds it.
    NotFound,
    /// It failed otherwise (connection lost, timeout, store full…).
    Failed {
        /// The error.
        error: String,
    },
}

/// When the run was in its fault phase or its final, fault-free check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// While the nemesis runs.
    Chaos,
    /// After every fault was healed: the convergence reads.
    Final,
}

/// One client operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Op {
    /// The node whose daemon the client spoke to.
    pub node: u32,
    /// The worker thread (or final checker) that ran it.
    pub worker: u32,
    /// What it was.
    pub kind: OpKind,
    /// The object (hex).
    pub id: String,
    /// The object's data size.
    pub size: u64,
    /// Start, milliseconds after the workload started.
    pub start_ms: u64,
    /// End, milliseconds after the workload started.
    pub end_ms: u64,
    /// The timeout the operation was given (0: none; it must end promptly anyway).
    pub timeout_ms: u64,
    /// How it ended.
    pub result: OpResult,
    /// Which phase it ran in.
    pub phase: Phase,
}

/// A fault as it was carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultRecord {
    /// What it was.
    pub kind: FaultKind,
    /// The node it hit.
    pub node: u32,
    /// The peer of a one-way cut.
    pub peer: Option<u32>,
    /// When it was injected.
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: u64,
    /// Why it could not be injected or healed cleanly, if so.
    pub error: Option<String>,
}

/// A daemon the nemesis killed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Death {
    /// The node.
    pub node: u32,
    /// When it was killed.
    pub at_ms: u64,
    /// Whether its files were kept for the restart (persistent mode, not wiped).
    pub files_kept: bool,
}

/// A daemon that exited without the nemesis killing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnexpectedExit {
    /// The node.
    pub node: u32,
    /// When it was found gone.
    pub at_ms: u64,
    /// Its exit status.
    pub status: String,
}

/// A client process (a Python client) that exited without being told to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientExit {
    /// The node it was a client of.
    pub node: u32,
    /// Its worker number.
    pub worker: u32,
    /// When its exit was seen.
    pub at_ms: u64,
    /// Its exit status.
    pub status: String,
    /// The end of its error output (a traceback), or what it wrote that made no sense.
    pub detail: String,
}

/// A daemon's resources, at their highest over the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    /// The node.
    pub node: u32,
    /// Largest resident set seen, bytes.
    pub max_rss_bytes: u64,
    /// Most open file descriptors seen.
    pub max_open_fds: u64,
    /// Objects the store evicted (sampled at the end of its life): evicted objects are gone
    /// by design.
    pub evicted_objects: u64,
}

/// A line of the history file.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case", tag = "record")]
pub enum Record<'a> {
    /// An operation.
    Op(&'a Op),
    /// A fault.
    Fault(&'a FaultRecord),
    /// A killed daemon.
    Death(&'a Death),
    /// A node's store when a final read there failed with `OutOfMemory`.
    OutOfMemory(&'a super::final_reads::OutOfMemoryStats),
}

/// Everything a run recorded, for the checker.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    /// Nodes in the cluster.
    pub nodes: u32,
    /// Whether the daemons were persistent.
    pub persistent: bool,
    /// Every operation, in no particular order.
    pub ops: Vec<Op>,
    /// Every fault, in time order.
    pub faults: Vec<FaultRecord>,
    /// Every daemon the nemesis killed.
    pub deaths: Vec<Death>,
    /// Every daemon that exited on its own.
    pub unexpected_exits: Vec<UnexpectedExit>,
    /// Lines of the daemons' logs that report a panic (node, line).
    pub panics: Vec<(u32, String)>,
    /// Each node's peak resources.
    pub resources: Vec<Resources>,
    /// Operations still running when the run ended (they never returned).
    pub unfinished: Vec<Op>,
    /// How long after the faults stopped every node saw every other connected (None: never
    /// within the bound).
    pub converged_after_ms: Option<u64>,
    /// The shared memory each daemon was given, bytes.
    pub memory_bytes: u64,
    /// Python client processes in the workload.
    pub python_clients: u32,
    /// The node serving the built-in directory (`None`: an outside one, such as Redis).
    pub directory_node: Option<u32>,
    /// Client processes that exited without being told to stop (crashes).
    pub client_exits: Vec<ClientExit>,
    /// Each node's store when a final read there first failed with `OutOfMemory`.
    pub out_of_memory: Vec<super::final_reads::OutOfMemoryStats>,
    /// The factor the checker's real-time bounds are stretched by (`None`: 1; more under an
    /// emulated CPU, `--slowdown`).
    pub slowdown: Option<u32>,
}

impl History {
    /// Writes the history as JSON lines to `path`.
    pub fn write_jsonl(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut records: Vec<(u64, Record<'_>)> = Vec::new();
        records.extend(self.ops.iter().map(|op| (op.start_ms, Record::Op(op))));
        records.extend(
            self.unfinished
                .iter()
                .map(|op| (op.start_ms, Record::Op(op))),
        );
        records.extend(self.faults.iter().map(|f| (f.start_ms, Record::Fault(f))));
        records.extend(self.deaths.iter().map(|d| (d.at_ms, Record::Death(d))));
        records.extend(
            self.out_of_memory
                .iter()
                .map(|o| (o.at_ms, Record::OutOfMemory(o))),
        );
        records.sort_by_key(|(at, _)| *at);
        for (_, record) in records {
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}
