//! Invariant checks from outside the nodes. The cluster calls these at the moments that matter
//! (a write lands, a READ is served, a client reads or releases an object, a run ends); each
//! failure is recorded as a violation with the virtual time and what was wrong.

use std::collections::{BTreeMap, BTreeSet};

use skyriver_core::digest::ContentDigest;
use skyriver_core::{
    ClientId, Instant, LocalRegion, NodeId, ObjectId, ObjectInfo, ObjectSizes, RequestId, Store,
};

use crate::expected_content::ExpectedContents;
use crate::rdma::Memory;

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

/// One content put under an id: which bytes (see [`crate::workload::content_bytes`]) and
/// its sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Content {
    /// The variant of the id's bytes.
    pub variant: u32,
    /// Data and metadata sizes.
    pub sizes: ObjectSizes,
}

/// Key of a pending client request: node, incarnation, client, request.
pub type PendingKey = (NodeId, u32, ClientId, RequestId);

/// What the checker has seen and found.
#[derive(Debug, Default)]
pub struct Checker {
    violations: Vec<String>,
    /// Requests awaiting replies.
    pub pending: BTreeMap<PendingKey, PendingOp>,
    /// Every content ever put under each id (one, unless the workload reused the id).
    pub contents: BTreeMap<ObjectId, Vec<Content>>,
    /// Every digest the directory named for each id, to any node (in a lookup's answer, a
    /// publication event, or the acceptance of a publication).
    pub named: BTreeMap<ObjectId, BTreeSet<ContentDigest>>,
    /// The bytes copies are compared with, for the contents checked last.
    expected: ExpectedContents,
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

    /// A client puts `content` under `id`.
    pub fn put(&mut self, id: ObjectId, content: Content) {
        let contents = self.contents.entry(id).or_default();
        if !contents.contains(&content) {
            contents.push(content);
        }
    }

    /// The bytes of content `variant` of `id`, `len` of them (see
    /// [`crate::workload::content_bytes`]), kept for the check of the copy they make.
    pub fn content_bytes(&mut self, id: &ObjectId, variant: u32, len: usize) -> &[u8] {
        self.expected.bytes(id, variant, len)
    }

    /// Which content put under `info.id` the bytes in `memory` are; why none, if none.
    pub fn content_of(&mut self, info: &ObjectInfo, memory: &Memory) -> Result<Content, String> {
        let sizes = ObjectSizes {
            data_size: info.data_size,
            metadata_size: info.metadata_size,
        };
        let bytes = memory.read(info.region);
        let bytes = &*bytes;
        let Some(contents) = self.contents.get(&info.id) else {
            // Not put by a client the checker saw (a scripted scenario's object): its usual
            // content, whatever its sizes.
            return self
                .expected
                .check(&info.id, 0, bytes)
                .map(|()| Content { variant: 0, sizes });
        };
        let mut why = Vec::new();
        for content in contents {
            if content.sizes != sizes {
                continue;
            }
            match self.expected.check(&info.id, content.variant, bytes) {
                Ok(()) => return Ok(*content),
                Err(diff) => why.push(format!("not content {}: {diff}", content.variant)),
            }
        }
        if why.is_empty() {
            why.push(format!(
                "no content of size {}+{} was put under it",
                sizes.data_size, sizes.metadata_size
            ));
        }
        Err(why.join("; "))
    }

    /// `bytes` are those at `offset` of a content put under `info`'s id with its sizes (a
    /// relay's partial copy: any byte it serves must be one it received).
    pub fn check_range(
        &mut self,
        info: &ObjectInfo,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), String> {
        let sizes = ObjectSizes {
            data_size: info.data_size,
            metadata_size: info.metadata_size,
        };
        let variants: Vec<u32> = match self.contents.get(&info.id) {
            None => vec![0],
            Some(contents) => contents
                .iter()
                .filter(|c| c.sizes == sizes)
                .map(|c| c.variant)
                .collect(),
        };
        let end = offset as usize + bytes.len();
        let mut why = Vec::new();
        for variant in variants {
            // The whole content, generated once for all the slices a relay serves.
            let whole = (info.data_size + info.metadata_size) as usize;
            let expected =
                &self.expected.bytes(&info.id, variant, whole.max(end))[offset as usize..end];
            match expected.iter().zip(bytes).position(|(a, b)| a != b) {
                None => return Ok(()),
                Some(at) => why.push(format!(
                    "byte {} is {:#04x}, content {variant} has {:#04x}",
                    offset as usize + at,
                    bytes[at],
                    expected[at]
                )),
            }
        }
        if why.is_empty() {
            why.push("no content of its sizes was put under it".into());
        }
        Err(why.join("; "))
    }

    /// A copy sealed by a transfer on `node`: its bytes hash to a digest the directory named
    /// for the id (the one content the id was accepted with, never damaged bytes nor another
    /// content under the id).
    pub fn check_transferred_copy(
        &mut self,
        now: Instant,
        node: NodeId,
        info: &ObjectInfo,
        memory: &Memory,
    ) {
        let actual = ContentDigest::of_contiguous(&memory.read(info.region));
        let named = self.named.get(&info.id);
        if !named.is_some_and(|named| named.contains(&actual)) {
            self.violation(
                now,
                format!(
                    "{node}: a fetched copy of {} hashes to {actual}, which the directory never \
                     named for it (named: {named:?})",
                    info.id
                ),
            );
        }
    }

    /// `object` is sealed in `store`, and its bytes in `memory` are those of a content put
    /// under its id.
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
                // On disk only (recovered spilled): its bytes are checked when restored.
                Some(summary) if summary.tier == skyriver_core::store::StorageTier::Spilled => {}
                _ => self.violation(now, format!("{node}: {why}: {object} is not sealed here")),
            }
            return;
        };
        if let Err(diff) = self.content_of(&info, memory) {
            self.violation(
                now,
                format!(
                    "{node}: {why}: {object} of size {}+{} at {} has wrong bytes: {diff}",
                    info.data_size, info.metadata_size, info.region
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
        of_record: impl Fn(&ObjectId) -> bool,
    ) {
        for summary in store.list() {
            let id = summary.info.id;
            // A copy of record is held as one in the store until a delete (not pinned: it may
            // be spilled; see `core::node::replicas`).
            if store.is_record(&id) != of_record(&id) {
                self.violation(
                    now,
                    format!(
                        "{node}: {id} is {}held as a copy of record in the store, but the node \
                         {} it one at the end",
                        if store.is_record(&id) { "" } else { "not " },
                        if of_record(&id) {
                            "counts"
                        } else {
                            "does not count"
                        },
                    ),
                );
            }
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
            if summary.tier != skyriver_core::store::StorageTier::Memory {
                // On the spill disk only: its bytes are checked when it is restored.
                continue;
            }
            self.check_sealed_object(now, node, store, memory, id, "at the end");
        }
        for grant in memory.grants() {
            self.violation(
                now,
                format!(
                    "{node}: READs of {} at {} are still granted to {} at the end",
                    grant
                        .object
                        .map_or_else(|| "an unnamed object".to_string(), |o| o.to_string()),
                    grant.region,
                    grant.peer
                ),
            );
        }
    }
}
