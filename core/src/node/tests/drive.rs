//! The shared drive loop, the input type's serde form and the record format.

use super::*;
use crate::node::recording::{
    decode_record, encode_frame, encode_start, output_digest, RecordEntry, RecordError,
    RecordHeader, RECORD_VERSION,
};

#[test]
fn driving_before_a_deadline_changes_nothing() {
    let mut w = World::new(2, |_| {});
    w.fetch(1, &[7], Duration::from_millis(3));
    let deadline = Instant::ZERO + Duration::from_millis(3);
    assert_eq!(w.nodes[1].poll_timeout(), Some(deadline));
    let pending = w.nodes[1].pending_work();
    let logged = w.log.len();
    for early in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_millis(2),
    ] {
        w.now = Instant::ZERO + early;
        let host = &mut Carrier {
            world: &mut w,
            node: NodeId(1),
        };
        assert_eq!(drive_host(host, Instant::ZERO + early), Some(deadline));
        // An early timeout given directly is as harmless.
        assert_eq!(w.feed(1, NodeInput::Timeout), Handled::Done);
    }
    w.drive_alone(1);
    assert_eq!(w.log.len(), logged, "no output before the deadline");
    assert_eq!(w.nodes[1].pending_work(), pending);
    // At the deadline the fetch fails, once; driving again at the same time does nothing.
    w.now = deadline;
    w.drive_alone(1);
    assert_eq!(w.replies(1).len(), 1);
    let logged = w.log.len();
    w.drive_alone(1);
    assert_eq!(w.log.len(), logged);
    w.assert_settled();
}

#[test]
fn drive_feeds_answers_before_returning() {
    // A persisted change answered by the driver at once releases the held reply in the same
    // drive: the put's reply is out when the request returns.
    let mut w = World::new(1, |c| {
        c.store.record_durable_changes = true;
        c.hold_replies_until_durable = true;
    });
    w.put(0, 1, 100);
    assert_eq!(w.persisted, vec![(NodeId(0), 1)]);
    w.assert_settled();
}

fn every_input(bytes: &[u8]) -> Vec<NodeInput<'_>> {
    let message = PeerMessage::Finish { req: TransferId(5) };
    vec![
        NodeInput::ClientConnected { client: CLIENT },
        NodeInput::ClientDisconnected { client: CLIENT },
        NodeInput::ClientRequest {
            client: CLIENT,
            frame: RequestFrame {
                request: RequestId(3),
                body: Request::Put {
                    id: id(1),
                    data: bytes.to_vec(),
                    metadata: vec![],
                },
            },
        },
        NodeInput::Persisted { upto: 9 },
        NodeInput::DirectoryMembers {
            members: vec![ClusterMember {
                node: NodeId(2),
                incarnation: 1,
                address: "10.0.0.2:7000".parse().unwrap(), // a valid literal
                fabric: "tcp".into(),
                failure_domain: String::new(),
            }]
            .into(),
        },
        NodeInput::DirectoryHealth {
            health: Err("down".into()),
        },
        NodeInput::DirectoryReply {
            op: DirectoryOpId(4),
            reply: DirectoryReply::Done,
        },
        NodeInput::DirectoryEvent {
            event: DirectoryEvent::Published {
                id: id(2),
                holder: NodeId(1),
                sizes: ObjectSizes {
                    data_size: 1,
                    metadata_size: 2,
                },
                digest: ContentDigest(7),
            },
        },
        NodeInput::PeerLink {
            peer: NodeId(1),
            link: crate::node::PeerLink {
                negotiated: "tcp".into(),
            },
        },
        NodeInput::PeerConnected {
            peer: NodeId(1),
            params: PeerParams {
                lanes: 2,
                costs: PathCosts::RDMA_DEFAULT,
            },
        },
        NodeInput::PeerLost { peer: NodeId(1) },
        NodeInput::PeerBytes {
            peer: NodeId(1),
            bytes,
        },
        NodeInput::PeerMessage {
            peer: NodeId(1),
            message,
        },
        NodeInput::ReadGranted {
            peer: NodeId(1),
            req: TransferId(8),
            result: Ok(ReadGrant { keys: vec![1, 2] }),
        },
        NodeInput::ReadRevoked {
            peer: NodeId(1),
            req: TransferId(8),
        },
        NodeInput::ReadCompletion {
            op: ReadOpId(3),
            result: Err(ReadError::ConnectionLost),
        },
        NodeInput::ContentHashed {
            transfer: TransferId(8),
            actual: ContentDigest(11),
        },
        NodeInput::Recovered { objects: vec![] },
        NodeInput::Timeout,
    ]
}

#[test]
fn every_input_survives_its_serde_form() {
    let bytes = wire::to_bytes(&PeerMessage::Finish { req: TransferId(6) });
    let inputs = every_input(&bytes);
    let kinds: std::collections::BTreeSet<&str> = inputs.iter().map(|i| i.kind()).collect();
    assert_eq!(kinds.len(), inputs.len(), "one of each kind");
    for input in inputs {
        let encoded = postcard::to_stdvec(&input).unwrap();
        let decoded: NodeInput<'_> = postcard::from_bytes(&encoded).unwrap();
        assert_eq!(decoded, input);
    }
}

fn header() -> RecordHeader {
    let mut config = NodeConfig::new(NodeId(3), ARENA_BYTES);
    config.store.hash_seed = 0xfeed;
    config.threshold = ThresholdPolicy::Fixed(2048);
    RecordHeader {
        version: RECORD_VERSION,
        node: NodeId(3),
        segment: 0,
        config,
        started_at: Instant::ZERO,
    }
}

#[test]
fn a_record_decodes_to_what_was_written_up_to_a_cut_frame() {
    let bytes = b"payload";
    let output = NodeOutput::Local(ObjectEvent::Deleted { id: id(1) });
    let entries = vec![
        RecordEntry::Input {
            at: Instant(5),
            from_drive: false,
            input: NodeInput::PeerBytes {
                peer: NodeId(1),
                bytes,
            },
        },
        RecordEntry::Output {
            kind: output.kind(),
            digest: output_digest(&output),
        },
        RecordEntry::Dropped { entries: 2 },
        RecordEntry::Input {
            at: Instant(6),
            from_drive: true,
            input: NodeInput::Timeout,
        },
    ];
    let mut file = encode_start(&header()).unwrap();
    for entry in &entries {
        encode_frame(entry, &mut file).unwrap();
    }
    let record = decode_record(&file).unwrap();
    assert_eq!(record.header, header());
    assert_eq!(record.entries, entries);
    assert!(!record.truncated);
    // A write cut short: the entries before it are kept, and the cut is reported.
    let cut = &file[..file.len() - 1];
    let record = decode_record(cut).unwrap();
    assert_eq!(record.entries, entries[..3]);
    assert!(record.truncated);
}

#[test]
fn a_record_of_another_version_or_no_record_is_refused() {
    let mut other = header();
    other.version = RECORD_VERSION + 1;
    let file = encode_start(&other).unwrap();
    assert!(matches!(
        decode_record(&file),
        Err(RecordError::Version { found }) if found == RECORD_VERSION + 1
    ));
    assert!(matches!(
        decode_record(b"not a record at all"),
        Err(RecordError::BadMagic)
    ));
}

#[test]
fn output_digests_tell_outputs_apart() {
    let a = NodeOutput::Local(ObjectEvent::Deleted { id: id(1) });
    let b = NodeOutput::Local(ObjectEvent::Deleted { id: id(2) });
    assert_eq!(output_digest(&a), output_digest(&a.clone()));
    assert_ne!(output_digest(&a), output_digest(&b));
}
