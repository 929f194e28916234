//! Invariant checks from outside the nodes. The cluster calls these at the moments that matter
//! (a write lands, a READ is served, a client reads or releases an object, a run ends); each
//! failure is recorded as a violation with the virtual time and what was wrong.

use std::collections::BTreeMap;

use skyriver_core::{
    ClientId, Instant, LocalRegion, NodeId, ObjectId, ObjectSizes, RequestId, Store,
};

use crate::rdma::Memory;
use crate::workload::check_bytes;

/// A client request the checker waits to see answered.
#[derive(Debug, Clone)]
pub struct PendingOp {
    /// "fetch" or "get".
    pub kind: &'static str,
    /// Ids asked for.
    pub ids: Vec<ObjectId>,
    /// When it was issued.
    pub issued: Instant,
    /// Latest acceptable reply.
    pub deadline: Instant,
}

/// Key of a pending client request: node, incarnation, client, request.
pub type PendingKey = (NodeId, u32, ClientId, RequestId);

/// What the checker has seen and found.
#[derive(Debug, Default)]
pub struct Checker {
    violations: Vec<String>,
    /// Requests awaiting replies.
    pub pending: BTreeMap<PendingKey, PendingOp>,
    /// Sizes of every object ever created (ids are never reused with other sizes).
    pub sizes: BTreeMap<ObjectId, ObjectSizes>,
}

impl Checker {
    /// Records a violation.
    pub fn violation(&mut self, now: Instant, what: String) {
        // Keep the first few in full; a broken run can produce thousands.
        if self.violations.len() < 50 {
            self.violations.push(format!("{now}: {what}"));
        }
    }

    /// Violations so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// A write into `node`'s arena for `object` must land inside that object while unsealed:
    /// a sealed object never changes and nothing else is overwritten.
    pub fn check_write_target(
        &mut self,
        now: Instant,
        node: NodeId,
        store: &Store,
        object: ObjectId,
        region: LocalRegion,
        what: &str,
    ) {
        match store.summary(&object) {
            None => self.violation(
                now,
                format!("{node}: {what} into {region} for {object}, which is not in the store"),
            ),
            Some(summary) if summary.sealed => self.violation(
                now,
                format!("{node}: {what} into {region} changes sealed object {object}"),
            ),
            Some(summary) => {
                let r = summary.info.region;
                if region.arena != r.arena || region.offset < r.offset || region.end() > r.end() {
                    self.violation(
                        now,
                        format!("{node}: {what} into {region} outside {object} at {r}"),
                    );
                }
            }
        }
    }

    /// `object` is sealed in `store`, and its bytes in `memory` are the ones it was sealed with.
    pub fn check_sealed_object(
        &mut self,
        now: Instant,
        node: NodeId,
        store: &Store,
        memory: &Memory,
        object: ObjectId,
        why: &str,
    ) {
        let Some(info) = store.sealed_info(&object) else {
            match store.summary(&object) {
                // Sealed and evicted or deleted within the same step, before anyone could read it.
                None if why == "at seal" => {}
                _ => self.violation(now, format!("{node}: {why}: {object} is not sealed here")),
            }
            return;
        };
        if let Some(sizes) = self.sizes.get(&object) {
            if (sizes.data_size, sizes.metadata_size) != (info.data_size, info.metadata_size) {
                self.violation(
                    now,
                    format!(
                        "{node}: {why}: {object} has size {}+{}, created as {}+{}",
                        info.data_size, info.metadata_size, sizes.data_size, sizes.metadata_size
                    ),
                );
            }
        }
        if let Err(diff) = check_bytes(&object, memory.read(info.region)) {
            self.violation(
                now,
                format!(
                    "{node}: {why}: {object} at {} has wrong bytes: {diff}",
                    info.region
                ),
            );
        }
    }

    /// At the end of a run, after faults stopped and everything settled: every object of a live
    /// node is sealed, unheld, unpinned and intact; nothing is granted.
    pub fn check_quiescent_store(
        &mut self,
        now: Instant,
        node: NodeId,
        store: &Store,
        memory: &Memory,
    ) {
        for summary in store.list() {
            let id = summary.info.id;
            if !summary.sealed {
                self.violation(now, format!("{node}: {id} is still unsealed at the end"));
                continue;
            }
            if summary.ref_count != 0 {
                self.violation(
                    now,
                    format!(
                        "{node}: {id} still has {} references at the end",
                        summary.ref_count
                    ),
                );
            }
            if summary.pin_count != 0 {
                self.violation(
                    now,
                    format!(
                        "{node}: {id} is still pinned ({}) at the end",
                        summary.pin_count
                    ),
                );
            }
            self.check_sealed_object(now, node, store, memory, id, "at the end");
        }
        for grant in memory.grants() {
            self.violation(
                now,
                format!(
                    "{node}: READs of {} at {} are still granted to {} at the end",
                    grant.object, grant.region, grant.reader
                ),
            );
        }
    }
}
