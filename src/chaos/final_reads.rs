//! The final reads, after the faults stopped: every acknowledged, undeleted object fetched
//! from another node than the one that put it, and every object a killed client worked on,
//! with its bytes checked. A node whose store runs out of memory for one has its counters
//! taken right then (as `skyriver stat --json` shows them), so the history says why.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;
use skyriver_client::{Client, ClientError, FetchError, ObjectId, StoreError, StoreStats};

use super::history::{Op, OpKind, OpResult, Phase};
use super::workload;

/// How long a final read may wait.
pub const FINAL_FETCH_TIMEOUT_MS: u64 = 10_000;

/// A node's store when a final read there first failed with `OutOfMemory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutOfMemoryStats {
    /// The node.
    pub node: u32,
    /// When the read failed, milliseconds after the workload started.
    pub at_ms: u64,
    /// The object it read (hex).
    pub id: String,
    /// The error.
    pub error: String,
    /// The store's counters right after (`None`: they could not be read, with why).
    pub stats: Result<StoreStats, String>,
}

/// What the final reads did.
pub struct FinalReads {
    /// The reads, in the order they ran.
    pub ops: Vec<Op>,
    /// The first `OutOfMemory` of each node, with its store's counters.
    pub out_of_memory: Vec<OutOfMemoryStats>,
}

/// Whether `error` is the store's `OutOfMemory`, for a fetch or anything else.
fn is_out_of_memory(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Store(StoreError::OutOfMemory { .. })
            | ClientError::Fetch(FetchError::Store(StoreError::OutOfMemory { .. }))
    )
}

/// Runs the final reads of a run whose operations were `ops` (see the module's doc).
pub fn run(
    ops: &[Op],
    client_objects: &[(ObjectId, u32)],
    sockets: &[PathBuf],
    nodes: u32,
    ms: &dyn Fn() -> u64,
) -> FinalReads {
    let deleted: BTreeSet<&str> = ops
        .iter()
        .filter(|op| op.kind == OpKind::Delete)
        .map(|op| op.id.as_str())
        .collect();
    let mut reads: Vec<(ObjectId, u32, OpKind)> = ops
        .iter()
        .filter(|op| op.kind == OpKind::Put && op.result == OpResult::Ok)
        .filter(|op| !deleted.contains(op.id.as_str()))
        .filter_map(|op| Some((op.id.parse().ok()?, op.node, OpKind::Fetch)))
        .collect();
    reads.extend(
        client_objects
            .iter()
            .map(|&(id, node)| (id, node, OpKind::ReadAfterClientKill)),
    );
    let clients: Vec<Option<Client>> = sockets.iter().map(|s| Client::connect(s).ok()).collect();
    let mut done = Vec::new();
    let mut out_of_memory: Vec<OutOfMemoryStats> = Vec::new();
    for (id, origin, kind) in reads {
        let node = (origin + 1) % nodes;
        let start_ms = ms();
        let result = match &clients[node as usize] {
            None => OpResult::Failed {
                error: format!("cannot connect to node-{node}"),
            },
            Some(client) => match workload::fetch_and_verify(client, id, FINAL_FETCH_TIMEOUT_MS) {
                Ok(result) => result,
                Err(error) => {
                    if is_out_of_memory(&error) && !out_of_memory.iter().any(|o| o.node == node) {
                        out_of_memory.push(OutOfMemoryStats {
                            node,
                            at_ms: ms(),
                            id: id.to_string(),
                            error: error.to_string(),
                            stats: client.stats().map_err(|e| e.to_string()),
                        });
                    }
                    OpResult::Failed {
                        error: error.to_string(),
                    }
                }
            },
        };
        done.push(Op {
            node,
            worker: 999,
            kind,
            id: id.to_string(),
            size: u64::from(workload::size_of(&id)),
            start_ms,
            end_ms: ms(),
            timeout_ms: FINAL_FETCH_TIMEOUT_MS,
            result,
            phase: Phase::Final,
        });
    }
    FinalReads {
        ops: done,
        out_of_memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_recognised_for_fetches_and_stores_alike() {
        let oom = StoreError::OutOfMemory {
            id: ObjectId([1; 20]),
            requested_bytes: 10,
            free_bytes: 0,
            capacity_bytes: 64,
        };
        assert!(is_out_of_memory(&ClientError::Store(oom.clone())));
        assert!(is_out_of_memory(&ClientError::Fetch(FetchError::Store(
            oom
        ))));
        assert!(!is_out_of_memory(&ClientError::Store(
            StoreError::ObjectNotFound(ObjectId([1; 20]))
        )));
    }
}
