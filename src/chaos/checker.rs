//! The checker: what must hold over a run's [`History`], whatever the nemesis did.
//!
//! - No read ever returns other bytes than the object's (contents derive from the id, so every
//!   reader knows them).
//! - Every operation ends within its timeout plus [`HANG_BOUND_MS`] (plus the time its own
//!   daemon was paused, when it could not answer anyone); none is left running.
//!
//! The real-time bounds ([`HANG_BOUND_MS`], [`REPUBLISH_BOUND_MS`], [`PUBLISH_SLACK_MS`],
//! [`BLOCKING_GET_SLACK_MS`]) are multiplied by the run's `--slowdown` (1 unless the CPU is
//! emulated), and the verdict says by how much.
//! - An acknowledged put is readable with its bytes after the faults stop, unless it was
//!   deleted, or every holder of a copy died without its files (a non-persistent daemon
//!   killed, a persistent one killed and wiped), or a holder evicted objects. A lost object is
//!   reported as not found, never as something else. While faults fly, a node's own object
//!   is there for a get on that node as long as the node did not die, and a fetch from
//!   another node finds it while the faults hit neither node nor the directory's (see
//!   [`reachable`]).
//! - No daemon exits except those the nemesis killed; no log reports a panic; no client process
//!   (a Python client) exits before it is told to stop.
//! - Every daemon's resident memory and open files stay bounded.
//! - After the faults stop, every node sees every other connected within a bound.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::history::{History, Op, OpKind, OpResult, Phase};
use super::schedule::FaultKind;

/// How long past its timeout an operation may take (scheduling, a restart's reconnection).
pub const HANG_BOUND_MS: u64 = 5_000;
/// Resident memory a daemon may use beyond its store's shared memory.
pub const RSS_SLACK_BYTES: u64 = 512 << 20;
/// A blocking get must see a put acknowledged at least this long before its wait ends.
pub const BLOCKING_GET_SLACK_MS: u64 = 1_000;
/// Open files a daemon may hold.
pub const MAX_OPEN_FDS: u64 = 1024;
/// How long after a fault on a node heals its objects' locations may take to be found again
/// (a restart's recovery and re-publication, a paused node's lease and heartbeat renewals).
pub const REPUBLISH_BOUND_MS: u64 = 10_000;
/// How long after a put's acknowledgement another node's fetch must find it (the location's
/// publication).
pub const PUBLISH_SLACK_MS: u64 = 1_000;

/// A property that did not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "violation")]
pub enum Violation {
    /// A read returned other bytes than the object's.
    WrongBytes {
        /// The read.
        op: Op,
        /// What differed.
        detail: String,
    },
    /// An operation took longer than its timeout plus the bound.
    Hang {
        /// The operation.
        op: Op,
        /// How long it may take.
        limit_ms: u64,
    },
    /// An operation never returned.
    Unfinished {
        /// The operation.
        op: Op,
    },
    /// An acknowledged object a surviving holder should still have was not found.
    AcknowledgedObjectLost {
        /// The read that did not find it.
        op: Op,
        /// Nodes whose copy should have survived.
        surviving_holders: Vec<u32>,
    },
    /// An acknowledged object with a surviving holder could not be read after the faults
    /// stopped.
    NotReadableAfterFaults {
        /// The read.
        op: Op,
        /// The error.
        error: String,
    },
    /// A daemon exited without being killed.
    UnexpectedExit {
        /// The node.
        node: u32,
        /// Its exit status.
        status: String,
    },
    /// A client process exited before it was told to stop (a crash, a traceback).
    ClientCrashed {
        /// The node it was a client of.
        node: u32,
        /// Its worker number.
        worker: u32,
        /// Its exit status.
        status: String,
        /// The end of its error output.
        detail: String,
    },
    /// A daemon's log reports a panic.
    Panic {
        /// The node.
        node: u32,
        /// The log line.
        line: String,
    },
    /// A daemon used more than its bound of a resource.
    Resource {
        /// The node.
        node: u32,
        /// Which resource.
        what: String,
        /// The peak seen.
        value: u64,
        /// The bound.
        limit: u64,
    },
    /// After the faults stopped, the nodes did not all see each other connected in time.
    MembershipNotConverged,
    /// A blocking get missed an object put on its node well within its wait, with no fault
    /// on that node meanwhile.
    BlockingGetMissedPut {
        /// The get.
        op: Op,
        /// When the put was acknowledged.
        put_acknowledged_ms: u64,
    },
}

/// The checker's finding over a run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Operations by kind and outcome.
    pub ops: BTreeMap<String, BTreeMap<String, u64>>,
    /// Faults by kind.
    pub faults: BTreeMap<String, u64>,
    /// Acknowledged objects checked after the faults.
    pub objects_checked: u64,
    /// Of those, lost because every holder died without its files (allowed).
    pub objects_lost_with_every_holder: u64,
    /// Every property that did not hold.
    pub violations: Vec<Violation>,
    /// The factor the real-time bounds were multiplied by.
    pub slowdown: u32,
}

impl Verdict {
    /// Whether every property held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A node holding a copy of an object since a time.
#[derive(Debug, Clone, Copy)]
struct Holding {
    node: u32,
    since_ms: u64,
    /// The put's own copy (kept through a kill by a persistent daemon's files); fetched
    /// copies are not counted on to survive a kill.
    primary: bool,
}

/// Checks every property over `history`.
pub fn check(history: &History) -> Verdict {
    let mut violations = Vec::new();
    let mut ops: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for op in &history.ops {
        let outcome = match &op.result {
            OpResult::Ok => "ok",
            OpResult::WrongBytes { .. } => "wrong_bytes",
            OpResult::NotFound => "not_found",
            OpResult::Failed { .. } => "failed",
        };
        let kind = match op.phase {
            Phase::Chaos => format!("{:?}", op.kind),
            Phase::Final => format!("final {:?}", op.kind),
        };
        *ops.entry(kind)
            .or_default()
            .entry(outcome.into())
            .or_default() += 1;
    }
    let mut faults = BTreeMap::new();
    for fault in &history.faults {
        *faults.entry(fault.kind.name().to_string()).or_default() += 1;
    }

    // Never wrong bytes; no hangs.
    let slowdown = history.slowdown.unwrap_or(1).max(1);
    let scaled = |bound_ms: u64| bound_ms * u64::from(slowdown);
    let hang_bound_ms = scaled(HANG_BOUND_MS);
    for op in &history.ops {
        if let OpResult::WrongBytes { detail } = &op.result {
            violations.push(Violation::WrongBytes {
                op: op.clone(),
                detail: detail.clone(),
            });
        }
        let limit_ms = op.timeout_ms + hang_bound_ms + paused_during(history, op);
        if op.end_ms.saturating_sub(op.start_ms) > limit_ms {
            violations.push(Violation::Hang {
                op: op.clone(),
                limit_ms,
            });
        }
    }
    for op in &history.unfinished {
        violations.push(Violation::Unfinished { op: op.clone() });
    }

    // Acknowledged objects.
    let deleted: BTreeSet<&str> = history
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::Delete)
        .map(|op| op.id.as_str())
        .collect();
    let evicting: BTreeSet<u32> = history
        .resources
        .iter()
        .filter(|r| r.evicted_objects > 0)
        .map(|r| r.node)
        .collect();
    let mut holdings: BTreeMap<&str, Vec<Holding>> = BTreeMap::new();
    for op in &history.ops {
        if op.result != OpResult::Ok || deleted.contains(op.id.as_str()) {
            continue;
        }
        match op.kind {
            OpKind::Put => holdings.entry(&op.id).or_default().push(Holding {
                node: op.node,
                since_ms: op.end_ms,
                primary: true,
            }),
            OpKind::Fetch if op.phase == Phase::Chaos => {
                holdings.entry(&op.id).or_default().push(Holding {
                    node: op.node,
                    since_ms: op.end_ms,
                    primary: false,
                })
            }
            _ => {}
        }
    }
    let survivors = |id: &str, at_ms: u64| -> Vec<u32> {
        let Some(holdings) = holdings.get(id) else {
            return Vec::new();
        };
        if !holdings.iter().any(|h| h.primary) {
            return Vec::new(); // not an acknowledged put of this run
        }
        if holdings.iter().any(|h| evicting.contains(&h.node)) {
            return Vec::new();
        }
        let mut nodes: Vec<u32> = holdings
            .iter()
            .filter(|h| h.since_ms <= at_ms)
            .filter(|h| {
                !history.deaths.iter().any(|d| {
                    d.node == h.node
                        && d.at_ms >= h.since_ms
                        && d.at_ms <= at_ms
                        && !(h.primary && history.persistent && d.files_kept)
                })
            })
            .map(|h| h.node)
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    };
    // Each acknowledged put's node and acknowledgement time.
    let acknowledged: BTreeMap<&str, (u32, u64)> = history
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::Put && op.result == OpResult::Ok)
        .map(|op| (op.id.as_str(), (op.node, op.end_ms)))
        .collect();
    let mut objects_checked = 0;
    let mut objects_lost_with_every_holder = 0;
    for op in &history.ops {
        let reads_acknowledged = match (op.phase, op.kind) {
            (Phase::Final, OpKind::Fetch) => true,
            // A node's own object, read on that node while faults fly.
            (Phase::Chaos, OpKind::Get) => true,
            // Another node's object, fetched while faults fly elsewhere.
            (Phase::Chaos, OpKind::Fetch) => true,
            _ => false,
        };
        if !reads_acknowledged || deleted.contains(op.id.as_str()) {
            continue;
        }
        let mut surviving = survivors(&op.id, op.start_ms);
        match (op.phase, op.kind) {
            (Phase::Chaos, OpKind::Get) => surviving.retain(|&node| node == op.node),
            (Phase::Chaos, _) => {
                let published = acknowledged
                    .get(op.id.as_str())
                    .is_some_and(|&(_, at)| at + scaled(PUBLISH_SLACK_MS) <= op.start_ms);
                surviving.retain(|&node| {
                    published
                        && acknowledged.get(op.id.as_str()).map(|&(n, _)| n) == Some(node)
                        && reachable(history, &[node, op.node], op)
                })
            }
            _ => {}
        }
        if op.phase == Phase::Final {
            objects_checked += 1;
        }
        match &op.result {
            OpResult::NotFound if !surviving.is_empty() => {
                violations.push(Violation::AcknowledgedObjectLost {
                    op: op.clone(),
                    surviving_holders: surviving,
                })
            }
            OpResult::NotFound if op.phase == Phase::Final => objects_lost_with_every_holder += 1,
            OpResult::Failed { error } if op.phase == Phase::Final && !surviving.is_empty() => {
                violations.push(Violation::NotReadableAfterFaults {
                    op: op.clone(),
                    error: error.clone(),
                })
            }
            OpResult::Failed { .. } if op.phase == Phase::Final => {
                objects_lost_with_every_holder += 1
            }
            _ => {}
        }
    }

    // A blocking get sees a put acknowledged on its node before its wait ends.
    let puts: BTreeMap<(&str, u32), u64> = history
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::Put && op.result == OpResult::Ok)
        .map(|op| ((op.id.as_str(), op.node), op.end_ms))
        .collect();
    for op in &history.ops {
        if op.kind != OpKind::BlockingGet || op.result == OpResult::Ok {
            continue;
        }
        let Some(&put_acknowledged_ms) = puts.get(&(op.id.as_str(), op.node)) else {
            continue;
        };
        let quiet = !history.faults.iter().any(|f| {
            (directory_fault(f.kind)
                || (hits_a_daemon(f.kind) && (f.node == op.node || f.peer == Some(op.node))))
                && f.start_ms <= op.end_ms
                && f.end_ms >= op.start_ms
        });
        let well_within =
            put_acknowledged_ms + scaled(BLOCKING_GET_SLACK_MS) <= op.start_ms + op.timeout_ms;
        if quiet && well_within {
            violations.push(Violation::BlockingGetMissedPut {
                op: op.clone(),
                put_acknowledged_ms,
            });
        }
    }

    for exit in &history.unexpected_exits {
        violations.push(Violation::UnexpectedExit {
            node: exit.node,
            status: exit.status.clone(),
        });
    }
    for exit in &history.client_exits {
        violations.push(Violation::ClientCrashed {
            node: exit.node,
            worker: exit.worker,
            status: exit.status.clone(),
            detail: exit.detail.clone(),
        });
    }
    for (node, line) in &history.panics {
        violations.push(Violation::Panic {
            node: *node,
            line: line.clone(),
        });
    }
    for resources in &history.resources {
        let rss_limit = history.memory_bytes + RSS_SLACK_BYTES;
        if resources.max_rss_bytes > rss_limit {
            violations.push(Violation::Resource {
                node: resources.node,
                what: "resident memory, bytes".into(),
                value: resources.max_rss_bytes,
                limit: rss_limit,
            });
        }
        if resources.max_open_fds > MAX_OPEN_FDS {
            violations.push(Violation::Resource {
                node: resources.node,
                what: "open files".into(),
                value: resources.max_open_fds,
                limit: MAX_OPEN_FDS,
            });
        }
    }
    if history.converged_after_ms.is_none() {
        violations.push(Violation::MembershipNotConverged);
    }
    Verdict {
        ops,
        faults,
        objects_checked,
        objects_lost_with_every_holder,
        violations,
        slowdown,
    }
}

/// Whether a fault of `kind` hits the directory itself, wherever it runs (a head kill, a
/// Redis master kill).
fn directory_fault(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::HeadKillRestart | FaultKind::RedisMasterKill
    )
}

/// Whether a fault of `kind` hits the daemon of its `node` (a Redis master kill's `node` is a
/// master's number).
fn hits_a_daemon(kind: FaultKind) -> bool {
    kind != FaultKind::RedisMasterKill
}

/// Whether no fault (but a killed client) touched any of `nodes`, nor the directory (its node,
/// or a Redis master), from [`REPUBLISH_BOUND_MS`] (times the run's slowdown) before `op`
/// started to its end: a fetch between them must then find what the holder holds.
fn reachable(history: &History, nodes: &[u32], op: &Op) -> bool {
    let republish_ms = REPUBLISH_BOUND_MS * u64::from(history.slowdown.unwrap_or(1).max(1));
    let during = |f: &&super::history::FaultRecord| {
        f.start_ms <= op.end_ms && f.end_ms + republish_ms >= op.start_ms
    };
    let touched = |node: u32| {
        history.faults.iter().filter(during).any(|f| {
            f.kind != FaultKind::ClientKill
                && hits_a_daemon(f.kind)
                && (f.node == node || f.peer == Some(node))
        })
    };
    let directory_hit = history
        .faults
        .iter()
        .filter(during)
        .any(|f| f.kind == FaultKind::RedisMasterKill);
    !directory_hit
        && !nodes
            .iter()
            .copied()
            .chain(history.directory_node)
            .any(touched)
}

/// How long `op`'s own daemon was paused while `op` ran: it answers nobody meanwhile.
fn paused_during(history: &History, op: &Op) -> u64 {
    history
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::Pause && f.node == op.node)
        .map(|f| {
            let start = f.start_ms.max(op.start_ms);
            let end = f.end_ms.min(op.end_ms);
            end.saturating_sub(start)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::super::history::{Death, FaultRecord};
    use super::*;

    fn op(node: u32, kind: OpKind, id: &str, start_ms: u64, end_ms: u64) -> Op {
        Op {
            node,
            worker: 0,
            kind,
            id: id.into(),
            size: 100,
            start_ms,
            end_ms,
            timeout_ms: 1_000,
            result: OpResult::Ok,
            phase: Phase::Chaos,
        }
    }

    fn final_fetch(node: u32, id: &str, at_ms: u64, result: OpResult) -> Op {
        Op {
            phase: Phase::Final,
            result,
            ..op(node, OpKind::Fetch, id, at_ms, at_ms + 10)
        }
    }

    fn history(ops: Vec<Op>) -> History {
        History {
            nodes: 3,
            directory_node: Some(0),
            ops,
            converged_after_ms: Some(100),
            memory_bytes: 64 << 20,
            ..History::default()
        }
    }

    fn death(node: u32, at_ms: u64, files_kept: bool) -> Death {
        Death {
            node,
            at_ms,
            files_kept,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let verdict = check(&history(vec![
            op(0, OpKind::Put, "a", 0, 5),
            op(1, OpKind::Fetch, "a", 10, 20),
            final_fetch(2, "a", 1_000, OpResult::Ok),
        ]));
        assert!(verdict.passed(), "{:?}", verdict.violations);
        assert_eq!(verdict.objects_checked, 1);
    }

    #[test]
    fn a_read_of_wrong_bytes_is_flagged() {
        let mut read = op(1, OpKind::Fetch, "a", 10, 20);
        read.result = OpResult::WrongBytes {
            detail: "byte 7".into(),
        };
        let verdict = check(&history(vec![op(0, OpKind::Put, "a", 0, 5), read]));
        assert!(matches!(
            verdict.violations.as_slice(),
            [Violation::WrongBytes { detail, .. }] if detail == "byte 7"
        ));
    }

    #[test]
    fn a_hang_is_flagged_and_an_unfinished_op_too() {
        // Timeout 1 s: 1 s + the bound is the most it may take.
        let slow = op(1, OpKind::Fetch, "a", 10, 10 + 1_000 + HANG_BOUND_MS + 1);
        let mut h = history(vec![op(0, OpKind::Put, "a", 0, 5), slow]);
        h.unfinished.push(op(2, OpKind::Get, "a", 50, 50));
        let verdict = check(&h);
        assert!(matches!(
            verdict.violations.as_slice(),
            [Violation::Hang { limit_ms, .. }, Violation::Unfinished { .. }]
                if *limit_ms == 1_000 + HANG_BOUND_MS
        ));
        // Just within the bound is no hang.
        let ok = op(1, OpKind::Fetch, "a", 10, 10 + 1_000 + HANG_BOUND_MS);
        assert!(check(&history(vec![ok])).passed());
    }

    #[test]
    fn a_slowdown_stretches_the_real_time_bounds_and_the_verdict_says_by_how_much() {
        let slow = || op(1, OpKind::Fetch, "a", 10, 10 + 1_000 + 6 * HANG_BOUND_MS);
        let strict = check(&history(vec![slow()]));
        assert_eq!(strict.slowdown, 1);
        assert!(matches!(
            strict.violations.as_slice(),
            [Violation::Hang { .. }]
        ));
        let mut emulated = history(vec![slow()]);
        emulated.slowdown = Some(6);
        let verdict = check(&emulated);
        assert!(verdict.passed(), "{:?}", verdict.violations);
        assert_eq!(verdict.slowdown, 6);
        emulated.ops[0].end_ms += 1;
        assert!(matches!(
            check(&emulated).violations.as_slice(),
            [Violation::Hang { limit_ms, .. }] if *limit_ms == 1_000 + 6 * HANG_BOUND_MS
        ));

        // A fetch 11 s after a head restart that misses a holder's object: a loss at 1x
        // (past the 10 s re-publication bound), allowed at 2x.
        let mut h = history(vec![
            op(2, OpKind::Put, "b", 0, 5),
            op(1, OpKind::Fetch, "b", 21_000, 21_010),
        ]);
        h.ops[1].timeout_ms = 5_000;
        h.ops[1].result = OpResult::NotFound;
        h.faults.push(FaultRecord {
            kind: FaultKind::HeadKillRestart,
            node: 0,
            peer: None,
            start_ms: 5_000,
            end_ms: 10_000,
            error: None,
        });
        h.deaths.push(death(0, 5_000, false));
        assert!(matches!(
            check(&h).violations.as_slice(),
            [Violation::AcknowledgedObjectLost { .. }]
        ));
        h.slowdown = Some(2);
        assert!(check(&h).passed(), "{:?}", check(&h).violations);
    }

    #[test]
    fn an_op_on_a_paused_daemon_may_wait_out_the_pause() {
        let long_put = op(1, OpKind::Put, "a", 1_000, 1_000 + 7_000 + HANG_BOUND_MS);
        let mut h = history(vec![long_put.clone()]);
        h.faults.push(FaultRecord {
            kind: FaultKind::Pause,
            node: 1,
            peer: None,
            start_ms: 500,
            end_ms: 9_000,
            error: None,
        });
        assert!(check(&h).passed(), "{:?}", check(&h).violations);
        // The same wait on another node's pause is a hang.
        h.faults[0].node = 2;
        assert!(!check(&h).passed());
    }

    #[test]
    fn an_object_whose_every_holder_died_may_be_lost_but_not_one_with_a_survivor() {
        let put = op(0, OpKind::Put, "a", 0, 5);
        let copy = op(1, OpKind::Fetch, "a", 10, 20);
        let lost = final_fetch(2, "a", 1_000, OpResult::NotFound);
        // In memory: the put's node and the fetcher both killed afterwards.
        let mut h = history(vec![put.clone(), copy.clone(), lost.clone()]);
        h.deaths = vec![death(0, 100, false), death(1, 200, false)];
        let verdict = check(&h);
        assert!(verdict.passed(), "{:?}", verdict.violations);
        assert_eq!(verdict.objects_lost_with_every_holder, 1);
        // The fetcher survived: its copy must still be found.
        h.deaths.pop();
        assert!(matches!(
            check(&h).violations.as_slice(),
            [Violation::AcknowledgedObjectLost { surviving_holders, .. }] if surviving_holders == &[1]
        ));
        // A persistent daemon killed with its files keeps its own objects.
        let mut h = history(vec![put.clone(), lost.clone()]);
        h.persistent = true;
        h.deaths = vec![death(0, 100, true)];
        assert!(!check(&h).passed());
        // ... but not when it came back wiped.
        h.deaths = vec![death(0, 100, false)];
        assert!(check(&h).passed());
        // A death before the put does not excuse the loss.
        let mut h = history(vec![op(0, OpKind::Put, "a", 500, 505), lost]);
        h.deaths = vec![death(0, 100, false)];
        assert!(!check(&h).passed());
    }

    #[test]
    fn deleted_and_evicted_objects_may_be_gone() {
        let put = op(0, OpKind::Put, "a", 0, 5);
        let lost = final_fetch(2, "a", 1_000, OpResult::NotFound);
        let mut delete = op(0, OpKind::Delete, "a", 50, 60);
        delete.result = OpResult::Failed {
            error: "connection lost".into(),
        };
        assert!(check(&history(vec![put.clone(), delete, lost.clone()])).passed());
        let mut h = history(vec![put, lost]);
        h.resources.push(super::super::history::Resources {
            node: 0,
            evicted_objects: 3,
            ..Default::default()
        });
        assert!(check(&h).passed());
    }

    #[test]
    fn a_get_on_the_puts_own_node_must_find_it_while_the_node_lives() {
        let put = op(0, OpKind::Put, "a", 0, 5);
        let mut get = op(0, OpKind::Get, "a", 100, 101);
        get.result = OpResult::NotFound;
        assert!(!check(&history(vec![put.clone(), get.clone()])).passed());
        let mut h = history(vec![put, get]);
        h.deaths = vec![death(0, 50, false)];
        assert!(check(&h).passed());
    }

    #[test]
    fn a_blocking_get_must_see_a_put_made_well_within_its_wait_unless_a_fault_hit() {
        let mut get = op(1, OpKind::BlockingGet, "a", 0, 1_000);
        get.timeout_ms = 3_000;
        get.result = OpResult::NotFound;
        let put = op(1, OpKind::Put, "a", 100, 200);
        assert!(matches!(
            check(&history(vec![get.clone(), put.clone()]))
                .violations
                .as_slice(),
            [Violation::BlockingGetMissedPut {
                put_acknowledged_ms: 200,
                ..
            }]
        ));
        // Acknowledged too close to the end of the wait: a miss is allowed.
        let late = op(1, OpKind::Put, "a", 100, 2_500);
        assert!(check(&history(vec![get.clone(), late])).passed());
        // A fault on the node meanwhile: allowed.
        let mut h = history(vec![get, put]);
        h.faults.push(FaultRecord {
            kind: FaultKind::Throttle,
            node: 1,
            peer: None,
            start_ms: 900,
            end_ms: 2_000,
            error: None,
        });
        assert!(check(&h).passed());
    }

    #[test]
    fn exits_panics_resources_and_convergence_are_flagged() {
        let mut h = history(vec![]);
        h.unexpected_exits
            .push(super::super::history::UnexpectedExit {
                node: 1,
                at_ms: 10,
                status: "signal 11".into(),
            });
        h.panics
            .push((2, "thread 'main' panicked at x.rs:1".into()));
        h.resources.push(super::super::history::Resources {
            node: 0,
            max_rss_bytes: (64 << 20) + RSS_SLACK_BYTES + 1,
            max_open_fds: MAX_OPEN_FDS + 1,
            evicted_objects: 0,
        });
        h.converged_after_ms = None;
        assert_eq!(check(&h).violations.len(), 5);
    }

    fn fault(kind: FaultKind, node: u32, start_ms: u64, end_ms: u64) -> FaultRecord {
        FaultRecord {
            kind,
            node,
            peer: None,
            start_ms,
            end_ms,
            error: None,
        }
    }

    #[test]
    fn a_fetch_must_find_an_object_while_faults_hit_neither_node_nor_the_directory() {
        let put = op(1, OpKind::Put, "a", 0, 5);
        let lost = |start_ms| Op {
            result: OpResult::NotFound,
            ..op(2, OpKind::Fetch, "a", start_ms, start_ms + 10)
        };
        // A fault elsewhere (node 3) does not excuse it.
        let mut h = history(vec![put.clone(), lost(20_000)]);
        h.nodes = 4;
        h.faults.push(fault(FaultKind::Pause, 3, 15_000, 21_000));
        assert!(matches!(
            check(&h).violations.as_slice(),
            [Violation::AcknowledgedObjectLost { surviving_holders, .. }] if surviving_holders == &[1]
        ));
        // Too soon after the put for its location to be published: allowed.
        assert!(check(&history(vec![put.clone(), lost(500)])).passed());
        // A fault on the holder, the fetcher or the directory's node, or ended less than the
        // re-publication bound before: allowed.
        for node in [0, 1, 2] {
            let mut h = history(vec![put.clone(), lost(20_000)]);
            h.faults
                .push(fault(FaultKind::LinkDown, node, 8_000, 12_000));
            assert!(check(&h).passed(), "a fault on node {node}");
        }
        // A fault on the holder healed longer ago than the bound: not.
        let mut h = history(vec![put.clone(), lost(30_000)]);
        h.faults.push(fault(FaultKind::LinkDown, 1, 8_000, 12_000));
        assert!(!check(&h).passed());
        // With an outside directory, a fault on node 0 is just a fault elsewhere.
        let mut h = history(vec![put, lost(20_000)]);
        h.directory_node = None;
        h.faults.push(fault(FaultKind::Pause, 0, 15_000, 21_000));
        assert!(!check(&h).passed());
    }

    #[test]
    fn a_redis_master_kill_is_a_directory_fault() {
        let put = op(1, OpKind::Put, "a", 0, 5);
        let lost = Op {
            result: OpResult::NotFound,
            ..op(2, OpKind::Fetch, "a", 20_000, 20_010)
        };
        let redis = |h: &mut History| {
            h.directory_node = None;
            h.faults
                .push(fault(FaultKind::RedisMasterKill, 0, 15_000, 18_000));
        };
        // During a master kill (or less than the re-publication bound after), a fetch may
        // miss what the directory lost track of.
        let mut h = history(vec![put.clone(), lost.clone()]);
        redis(&mut h);
        assert!(check(&h).passed(), "{:?}", check(&h).violations);
        // Long after it, not.
        let late = Op {
            start_ms: 40_000,
            end_ms: 40_010,
            ..lost
        };
        let mut h = history(vec![put.clone(), late]);
        redis(&mut h);
        assert!(!check(&h).passed());
        // A blocking get that missed its put during a master kill: allowed.
        let mut get = op(3, OpKind::BlockingGet, "b", 16_000, 17_000);
        get.timeout_ms = 3_000;
        get.result = OpResult::NotFound;
        let put_b = op(3, OpKind::Put, "b", 16_100, 16_200);
        let mut h = history(vec![get.clone(), put_b.clone()]);
        assert!(!check(&h).passed());
        redis(&mut h);
        assert!(check(&h).passed());
    }

    #[test]
    fn a_client_process_that_crashed_is_flagged() {
        let mut h = history(vec![]);
        h.client_exits.push(super::super::history::ClientExit {
            node: 2,
            worker: 200,
            at_ms: 10,
            status: "exit status: 1".into(),
            detail: "RuntimeError: boom".into(),
        });
        assert!(matches!(
            check(&h).violations.as_slice(),
            [Violation::ClientCrashed { node: 2, detail, .. }] if detail.contains("boom")
        ));
    }
}
