//! `skyriver sim --replay FILE`: runs a daemon's recorded inputs (`skyriver daemon --record`)
//! through the real core again and checks that it gives the outputs the daemon's node gave.
//!
//! The node is rebuilt from the record's header (its whole configuration, the hash seed
//! included), then every recorded input is handed to [`Node::handle`] at its recorded time,
//! followed by the core's drive loop, as in the daemon. Inputs the daemon's drive loop fed (a
//! fabric's immediate answer, a hash, a closed client, a due timer) are fed by the replay's
//! drive loop at the same point. Every output is compared, in order, with the recorded digest;
//! the checker looks at what it can without the bytes (every write lands inside an unsealed
//! object of the store; the node's own invariants hold after every input).

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use skyriver_core::client_protocol::Response;
use skyriver_core::directory::{DirectoryOpId, DirectoryRequest};
use skyriver_core::node::recording::{
    decode_record, output_digest, segment_path, RecordEntry, RecordError, RecordHeader,
};
use skyriver_core::node::{drive_host, DriveHost, Handled, Node, NodeDriver, NodeInput, ReadOpId};
use skyriver_core::wire::{EagerHeader, InputBytes, PeerMessage};
use skyriver_core::{
    ClientId, DurableChange, Instant, LocalRegion, NodeId, NodeOutput, ObjectEvent, ObjectId,
    RemoteRegion, RequestId, TransferId,
};

use crate::checker::Checker;

/// Why a record cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a record this build reads.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The record is a later segment of a rotated record: it starts mid-run, without the
    /// state its node had built, and was given without the segments before it.
    #[error(
        "the record is segment {segment} of a rotated record: it starts mid-run and cannot \
         rebuild the node (replay it from its file, next to segments 0 to {} as FILE.0 …)",
        segment - 1
    )]
    MidRun {
        /// Its segment number.
        segment: u64,
    },
    /// A segment the replay of a later one needs is not there.
    #[error(
        "{} is segment {segment} of a rotated record and needs segment {missing}, expected \
         at {}: it is missing (a replay runs the whole chain from segment 0)",
        path.display(),
        expected.display()
    )]
    MissingSegment {
        /// The record given.
        path: PathBuf,
        /// Its segment number.
        segment: u64,
        /// The segment not found.
        missing: u64,
        /// Where it should be.
        expected: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A file of the chain is not the segment its name says, or of another node.
    #[error(
        "{} should be segment {expected_segment} of node {expected_node}'s record, and is \
         segment {segment} of node {node}'s",
        path.display()
    )]
    BrokenChain {
        /// The file.
        path: PathBuf,
        /// The segment its place in the chain calls for.
        expected_segment: u64,
        /// The segment it holds.
        segment: u64,
        /// The node of the chain's last segment.
        expected_node: NodeId,
        /// Its node.
        node: NodeId,
    },
}

/// What a replay found.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// The recorded node.
    pub node: NodeId,
    /// Inputs fed, by kind.
    pub inputs: BTreeMap<&'static str, u64>,
    /// Outputs the replay gave, by kind.
    pub outputs: BTreeMap<&'static str, u64>,
    /// Outputs in the record.
    pub recorded_outputs: u64,
    /// Peer messages that did not decode (as in the recorded run).
    pub malformed_messages: u64,
    /// The recorder fell behind and dropped entries: the replay stopped there.
    pub dropped_entries: u64,
    /// The file ended inside an entry (the daemon was killed mid-write).
    pub truncated: bool,
    /// The first output that differs from the record's, if any.
    pub divergence: Option<String>,
    /// What the checker found.
    pub violations: Vec<String>,
    /// Virtual time of the last input, ns after the node's start.
    pub end_ns: u64,
}

impl ReplayReport {
    /// Whether the replay gave the recorded outputs and the checker found nothing.
    pub fn passed(&self) -> bool {
        self.divergence.is_none() && self.violations.is_empty()
    }

    /// Inputs fed in all.
    pub fn input_count(&self) -> u64 {
        self.inputs.values().sum()
    }

    /// Outputs given in all.
    pub fn output_count(&self) -> u64 {
        self.outputs.values().sum()
    }
}

/// Replays the record in `path`. A later segment of a rotated record is replayed with the
/// segments before it, found next to it (`FILE.0` … for `FILE` or `FILE.N`), from segment 0.
pub fn replay_file(path: &Path) -> Result<ReplayReport, ReplayError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ReplayError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let last = read(path)?;
    let header = decode_record(&last)?.header;
    if header.segment == 0 {
        return replay_chain(&[&last]);
    }
    // `FILE.N` names its earlier segments as `FILE.k` too; `FILE` is the segment being written.
    let suffix = format!(".{}", header.segment);
    let base = match path.to_str().and_then(|p| p.strip_suffix(&suffix)) {
        Some(base) => PathBuf::from(base),
        None => path.to_owned(),
    };
    let mut chain = Vec::new();
    for segment in 0..header.segment {
        let expected = segment_path(&base, segment);
        let bytes = std::fs::read(&expected).map_err(|source| ReplayError::MissingSegment {
            path: path.to_owned(),
            segment: header.segment,
            missing: segment,
            expected: expected.clone(),
            source,
        })?;
        let found = decode_record(&bytes)?.header;
        if found.segment != segment || found.node != header.node {
            return Err(ReplayError::BrokenChain {
                path: expected,
                expected_segment: segment,
                segment: found.segment,
                expected_node: header.node,
                node: found.node,
            });
        }
        chain.push(bytes);
    }
    chain.push(last);
    let chain: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
    replay_chain(&chain)
}

/// Replays a record held in memory (segment 0 of a record, or a record never rotated).
pub fn replay_bytes(bytes: &[u8]) -> Result<ReplayReport, ReplayError> {
    replay_chain(&[bytes])
}

/// Replays the segments of one record, in order from segment 0: the first's header rebuilds
/// the node, the entries of all run one after the other.
fn replay_chain(segments: &[&[u8]]) -> Result<ReplayReport, ReplayError> {
    let mut records = Vec::with_capacity(segments.len());
    for bytes in segments {
        records.push(decode_record(bytes)?);
    }
    let Some(first) = records.first() else {
        return Err(RecordError::Truncated { offset: 0 }.into());
    };
    let RecordHeader {
        node: node_id,
        segment,
        config,
        started_at,
        ..
    } = first.header.clone();
    if segment != 0 {
        return Err(ReplayError::MidRun { segment });
    }
    let truncated = records.last().is_some_and(|r| r.truncated);
    let mut inputs = VecDeque::new();
    let mut expected = Vec::new();
    let mut dropped_entries = 0;
    for entry in records.into_iter().flat_map(|record| record.entries) {
        match entry {
            RecordEntry::Input {
                at,
                from_drive,
                input,
            } => inputs.push_back((at, from_drive, input)),
            RecordEntry::Output { kind, digest } => expected.push((kind.to_owned(), digest)),
            RecordEntry::Dropped { entries } => {
                // What follows misses inputs: replaying it would only report that.
                dropped_entries = entries;
                break;
            }
        }
    }
    let mut replay = Replay {
        node: Node::new(config, started_at),
        node_id,
        inputs,
        now: started_at,
        counts: BTreeMap::new(),
        outputs: Vec::new(),
        checker: Checker::default(),
    };
    let mut malformed_messages = 0;
    while let Some((at, _, input)) = replay.inputs.pop_front() {
        replay.now = at;
        *replay.counts.entry(input.kind()).or_default() += 1;
        if let Handled::Malformed(_) = replay.node.handle(at, input) {
            malformed_messages += 1;
        }
        drive_host(&mut replay, at);
        let node = &replay.node;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| node.check_invariants())) {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a node invariant failed".into());
            replay.checker.violation(at, format!("{node_id}: {what}"));
            break;
        }
    }
    let mut outputs = BTreeMap::new();
    for (kind, _) in &replay.outputs {
        *outputs.entry(*kind).or_default() += 1;
    }
    Ok(ReplayReport {
        node: node_id,
        inputs: replay.counts,
        outputs,
        recorded_outputs: expected.len() as u64,
        malformed_messages,
        dropped_entries,
        truncated,
        divergence: first_divergence(&expected, &replay.outputs),
        violations: replay.checker.violations().to_vec(),
        end_ns: replay.now.0,
    })
}

/// Where the replay's outputs part from the recorded ones.
fn first_divergence(expected: &[(String, u64)], got: &[(&'static str, u64)]) -> Option<String> {
    let at = expected
        .iter()
        .zip(got)
        .position(|((kind, digest), (got_kind, got_digest))| {
            (kind.as_str(), digest) != (*got_kind, got_digest)
        });
    match at {
        Some(i) => Some(format!(
            "output {i}: the daemon gave {} ({:016x}), the replay {} ({:016x})",
            expected[i].0, expected[i].1, got[i].0, got[i].1
        )),
        None if expected.len() != got.len() => Some(format!(
            "the daemon gave {} outputs, the replay {}",
            expected.len(),
            got.len()
        )),
        None => None,
    }
}

/// The replayed node, its remaining inputs, and what it gave.
struct Replay<'r> {
    node: Node,
    node_id: NodeId,
    inputs: VecDeque<(Instant, bool, NodeInput<'r>)>,
    now: Instant,
    counts: BTreeMap<&'static str, u64>,
    outputs: Vec<(&'static str, u64)>,
    checker: Checker,
}

impl Replay<'_> {
    /// A write into the arena must land inside an unsealed object.
    fn check_write(&mut self, object: ObjectId, region: LocalRegion, what: &str) {
        let (now, node) = (self.now, self.node_id);
        self.checker
            .check_write_target(now, node, self.node.store(), object, region, what);
    }
}

impl<'r> DriveHost<'r> for Replay<'r> {
    type Driver = Self;

    fn node(&mut self) -> &mut Node {
        &mut self.node
    }

    fn driver(&mut self) -> &mut Self {
        self
    }

    /// The daemon's drive loop fed the next recorded input itself: so does the replay's.
    fn poll_answer(&mut self) -> Option<NodeInput<'r>> {
        if !self
            .inputs
            .front()
            .is_some_and(|(_, from_drive, _)| *from_drive)
        {
            return None;
        }
        let (_, _, input) = self.inputs.pop_front()?;
        *self.counts.entry(input.kind()).or_default() += 1;
        Some(input)
    }

    fn observe_output(&mut self, output: &NodeOutput) {
        self.outputs.push((output.kind(), output_digest(output)));
    }
}

/// The replay carries nothing out: the recorded answers come back as inputs. It checks the
/// writes against the store.
impl NodeDriver for Replay<'_> {
    fn send(&mut self, _: NodeId, _: PeerMessage) {}

    fn send_eager(&mut self, _: NodeId, _: EagerHeader, _: LocalRegion, _: ObjectId) {}

    fn post_read(
        &mut self,
        _: NodeId,
        _: ReadOpId,
        _: u16,
        local: LocalRegion,
        _: RemoteRegion,
        object: ObjectId,
    ) {
        self.check_write(object, local, "READ destination");
    }

    fn write_local(&mut self, region: LocalRegion, _: InputBytes, object: ObjectId) {
        self.check_write(object, region, "eager write");
    }

    fn write_inline(&mut self, region: LocalRegion, _: Vec<u8>, object: ObjectId) {
        self.check_write(object, region, "inline write");
    }

    fn verify_content(&mut self, _: TransferId, region: LocalRegion, object: ObjectId) {
        self.check_write(object, region, "verified copy");
    }

    fn trace(&mut self, _: ClientId, _: RequestId, _: bool) {}

    fn grant_read(&mut self, _: NodeId, _: TransferId, _: ObjectId, _: LocalRegion) {}

    fn revoke_read(&mut self, _: NodeId, _: TransferId, _: ObjectId, _: LocalRegion) {}

    fn grant_partial_read(&mut self, _: NodeId, _: TransferId, _: ObjectId, _: LocalRegion) {}

    fn directory(&mut self, _: DirectoryOpId, _: DirectoryRequest) {}

    fn connect(&mut self, _: NodeId, _: std::net::SocketAddr) {}

    fn reply(&mut self, _: ClientId, _: RequestId, _: Response) {}

    fn event(&mut self, _: ClientId, _: ObjectEvent) {}

    fn close_client(&mut self, _: ClientId, _: String) {}

    fn persist(&mut self, _: u64, _: DurableChange) {}

    fn spill(
        &mut self,
        _: skyriver_core::store::SpillOpId,
        _: ObjectId,
        _: LocalRegion,
        _: Option<skyriver_core::ContentDigest>,
    ) {
    }

    fn restore(
        &mut self,
        _: skyriver_core::store::SpillOpId,
        _: ObjectId,
        _: LocalRegion,
        _: Option<skyriver_core::ContentDigest>,
    ) {
    }

    fn discard_spilled(&mut self, _: skyriver_core::store::SpillOpId, _: ObjectId) {}
}

#[cfg(test)]
mod tests {
    use skyriver_core::client_protocol::{Request, RequestFrame, PROTOCOL_VERSION};
    use skyriver_core::node::recording::{encode_frame, encode_start, RECORD_VERSION};
    use skyriver_core::NodeConfig;

    use super::*;

    const CLIENT: ClientId = ClientId(1);

    fn header(segment: u64) -> RecordHeader {
        RecordHeader {
            version: RECORD_VERSION,
            node: NodeId(2),
            segment,
            config: NodeConfig::new(NodeId(2), 1 << 20),
            started_at: Instant::ZERO,
        }
    }

    /// A client says hello and puts an object; a timer comes due on the way.
    fn inputs() -> Vec<(Instant, NodeInput<'static>)> {
        let request = |n: u64, body: Request| NodeInput::ClientRequest {
            client: CLIENT,
            frame: RequestFrame {
                request: RequestId(n),
                body,
            },
        };
        vec![
            (Instant(10), NodeInput::ClientConnected { client: CLIENT }),
            (
                Instant(20),
                request(
                    1,
                    Request::Hello {
                        protocol_version: PROTOCOL_VERSION,
                        client_name: "replay".into(),
                    },
                ),
            ),
            (
                Instant(30),
                request(
                    2,
                    Request::Put {
                        id: ObjectId::from_u64(9),
                        data: vec![7; 100],
                        metadata: vec![],
                    },
                ),
            ),
            (Instant(5_000_000), NodeInput::Timeout),
        ]
    }

    /// The record a daemon would write for [`inputs`]: the outputs come from running them.
    fn record(segment: u64, tamper: bool) -> Vec<u8> {
        let mut replay = Replay {
            node: Node::new(header(0).config, Instant::ZERO),
            node_id: NodeId(2),
            inputs: VecDeque::new(),
            now: Instant::ZERO,
            counts: BTreeMap::new(),
            outputs: Vec::new(),
            checker: Checker::default(),
        };
        let mut file = encode_start(&header(segment)).unwrap();
        for (at, input) in inputs() {
            let entry = RecordEntry::Input {
                at,
                from_drive: false,
                input: input.clone(),
            };
            encode_frame(&entry, &mut file).unwrap();
            let _ = replay.node.handle(at, input);
            drive_host(&mut replay, at);
            for (kind, digest) in replay.outputs.drain(..) {
                let digest = if tamper { digest ^ 1 } else { digest };
                encode_frame(&RecordEntry::Output { kind, digest }, &mut file).unwrap();
            }
        }
        file
    }

    #[test]
    fn a_faithful_record_replays_to_its_outputs() {
        let report = replay_bytes(&record(0, false)).unwrap();
        assert!(report.passed(), "{report:?}");
        assert_eq!(report.input_count(), 4);
        // The welcome; the put waits for the directory's verdict on its publication.
        assert_eq!(report.outputs.get("reply"), Some(&1), "{report:?}");
        assert_eq!(report.outputs.get("directory"), Some(&1), "{report:?}");
        assert_eq!(report.output_count(), report.recorded_outputs);
    }

    #[test]
    fn an_output_other_than_recorded_is_reported() {
        let report = replay_bytes(&record(0, true)).unwrap();
        let divergence = report.divergence.expect("a divergence");
        assert!(divergence.starts_with("output 0:"), "{divergence}");
    }

    #[test]
    fn a_later_segment_is_refused() {
        assert!(matches!(
            replay_bytes(&record(3, false)),
            Err(ReplayError::MidRun { segment: 3 })
        ));
    }
}
